//! Two CM endpoints back to back in memory: every MAD goes through `Mad::emit` and
//! `Cm::handle_mad` as octets, time is virtual (the harness jumps to the next
//! `poll_timeout`), and the test may drop or duplicate MADs (fixed seeds). Each test names
//! its requirement IDs from `smcr-ipoibcm.md` part C1 (numbered in `roce::cm`'s docs).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use roce::cm::machine::iba_time;
use roce::cm::mad::{AttrId, CmMsg, Mad, MsgType};
use roce::cm::{
    AcceptParams, Cm, CmConfig, CmError, CmEvent, CmId, ConnectParams, PortSpace, QpParams, RejReason, State,
    service_id,
};
use verbs::{Gid, Mtu};

const SID: u64 = 0x0000_0000_0106_1c06;

fn gid(last: u8) -> Gid {
    Gid::from_ipv4(std::net::Ipv4Addr::new(10, 0, 0, last))
}

fn cfg(guid: u64, g: Gid, seed: u64) -> CmConfig {
    let mut c = CmConfig::new(guid, g, seed);
    // Short timers: 4.096 µs × 2^12 ≈ 16.8 ms response, 2 × 4.2 ms packet life.
    c.cm_response_timeout = 12;
    c.packet_life_time = 10;
    c.max_cm_retries = 4;
    c.mra_service_timeout = 16;
    c.time_wait = Duration::from_millis(50);
    c
}

/// One side of the wire: who sent what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// Decides, per MAD and sender, to lose it.
type DropRule = Box<dyn FnMut(Side, &Mad) -> bool>;

/// A rule that drops the first MAD of `attr` that `side` sends, and nothing else.
fn drop_first(side: Side, attr: AttrId) -> DropRule {
    let mut dropped = false;
    Box::new(move |s, m| {
        let hit = s == side && m.msg.attr_id() == attr && !dropped;
        dropped |= hit;
        hit
    })
}

struct Net {
    a: Cm,
    b: Cm,
    ga: Gid,
    gb: Gid,
    now: Instant,
    start: Instant,
    rng: StdRng,
    /// Percent of MADs dropped / duplicated.
    drop_pct: u32,
    dup_pct: u32,
    /// Drop every MAD from this side whose attribute matches (deterministic losses).
    drop_rule: Option<DropRule>,
    /// Every MAD put on the wire (before loss), with its sender and virtual time.
    log: Vec<(Side, Duration, Mad)>,
    ev_a: Vec<CmEvent>,
    ev_b: Vec<CmEvent>,
    /// Answer ConnectRequest/ConnectReply automatically.
    auto: bool,
}

fn accept_params(qpn: u32, psn: u32) -> AcceptParams {
    AcceptParams {
        qpn,
        starting_psn: psn,
        responder_resources: 4,
        initiator_depth: 2,
        rnr_retry_count: 6,
        target_ack_delay: 15,
        srq: false,
        min_rnr_timer: 12,
        private_data: b"accepted".to_vec(),
    }
}

fn connect_params(to: Gid, qpn: u32, psn: u32) -> ConnectParams {
    ConnectParams {
        remote_gid: to,
        service_id: SID,
        qpn,
        starting_psn: psn,
        responder_resources: 3,
        initiator_depth: 5,
        path_mtu: Mtu::Mtu1024,
        retry_count: 7,
        rnr_retry_count: 5,
        local_ack_timeout: 18,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
        srq: false,
        private_data: b"hello".to_vec(),
    }
}

impl Net {
    fn new(seed: u64) -> Net {
        let (ga, gb) = (gid(1), gid(2));
        let now = Instant::now();
        let mut b = Cm::new(cfg(0xb0b, gb, seed ^ 0xbbbb));
        b.listen(SID).unwrap();
        Net {
            a: Cm::new(cfg(0xa11ce, ga, seed ^ 0xaaaa)),
            b,
            ga,
            gb,
            now,
            start: now,
            rng: StdRng::seed_from_u64(seed),
            drop_pct: 0,
            dup_pct: 0,
            drop_rule: None,
            log: Vec::new(),
            ev_a: Vec::new(),
            ev_b: Vec::new(),
            auto: false,
        }
    }

    /// Delivers MADs until neither side has one to send.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            for side in [Side::A, Side::B] {
                loop {
                    let out = match side {
                        Side::A => self.a.poll_transmit(),
                        Side::B => self.b.poll_transmit(),
                    };
                    let Some((to, mad)) = out else { break };
                    moved = true;
                    let (from, expect_to) = match side {
                        Side::A => (self.ga, self.gb),
                        Side::B => (self.gb, self.ga),
                    };
                    assert_eq!(to, expect_to, "{side:?} sent to the wrong GID: {mad:?}");
                    self.log.push((side, self.now - self.start, mad.clone()));
                    let ruled = self.drop_rule.as_mut().is_some_and(|r| r(side, &mad));
                    if ruled || self.rng.random_range(0..100) < self.drop_pct {
                        continue;
                    }
                    let copies = if self.rng.random_range(0..100) < self.dup_pct {
                        2
                    } else {
                        1
                    };
                    let bytes = mad.emit().unwrap();
                    for _ in 0..copies {
                        let r = match side {
                            Side::A => self.b.handle_mad(self.now, &bytes, from),
                            Side::B => self.a.handle_mad(self.now, &bytes, from),
                        };
                        r.unwrap();
                    }
                }
            }
            self.collect();
            if !moved {
                break;
            }
        }
    }

    fn collect(&mut self) {
        while let Some(e) = self.a.poll_event() {
            if self.auto
                && let CmEvent::ConnectReply { id, .. } = &e
            {
                self.a.rtu(self.now, *id, b"").unwrap();
            }
            self.ev_a.push(e);
        }
        while let Some(e) = self.b.poll_event() {
            if self.auto
                && let CmEvent::ConnectRequest(r) = &e
            {
                self.b.accept(self.now, r.id, accept_params(0x22, 0x2222)).unwrap();
            }
            self.ev_b.push(e);
        }
    }

    /// Jumps to the next timer of either side and runs it. False if none is set.
    fn advance(&mut self) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { return false };
        assert!(t >= self.now, "a timer in the past");
        self.now = t;
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.pump();
        true
    }

    /// Pumps and runs timers until `done` holds (or no timer is left).
    fn run_until(&mut self, mut done: impl FnMut(&Net) -> bool) {
        self.pump();
        for _ in 0..10_000 {
            if done(self) || !self.advance() {
                break;
            }
        }
    }

    /// Runs every timer out.
    fn settle(&mut self) {
        self.pump();
        while self.advance() {}
    }

    fn sent(&self, side: Side, attr: AttrId) -> usize {
        self.log
            .iter()
            .filter(|(s, _, m)| *s == side && m.msg.attr_id() == attr)
            .count()
    }

    /// The active side's connect, the passive side's request.
    fn connect(&mut self) -> CmId {
        let id = self.a.connect(self.now, connect_params(self.gb, 0x11, 0x1111)).unwrap();
        self.pump();
        id
    }

    fn b_request(&self) -> CmId {
        self.ev_b
            .iter()
            .find_map(|e| match e {
                CmEvent::ConnectRequest(r) => Some(r.id),
                _ => None,
            })
            .expect("B got no ConnectRequest")
    }

    /// connect → accept → rtu; returns (A's ID, B's ID, A's QP params, B's QP params).
    fn establish(&mut self) -> (CmId, CmId, QpParams, QpParams) {
        let ida = self.connect();
        let idb = self.b_request();
        let qpb = self.b.accept(self.now, idb, accept_params(0x22, 0x2222)).unwrap();
        self.pump();
        let qpa = match self.ev_a.last() {
            Some(CmEvent::ConnectReply { id, qp, .. }) if *id == ida => *qp,
            e => panic!("A expected ConnectReply, has {e:?}"),
        };
        self.a.rtu(self.now, ida, b"").unwrap();
        self.pump();
        assert_eq!(self.a.state(ida), Some(State::Established));
        assert_eq!(self.b.state(idb), Some(State::Established));
        (ida, idb, qpa, qpb)
    }
}

fn established(ev: &[CmEvent]) -> Vec<CmId> {
    ev.iter()
        .filter_map(|e| match e {
            CmEvent::Established { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

fn disconnected(ev: &[CmEvent]) -> Vec<CmId> {
    ev.iter()
        .filter_map(|e| match e {
            CmEvent::Disconnected { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

/// C1.7, C1.8: REQ → REP → RTU; the QP attributes of the two sides fit together (each side
/// receives from the PSN the other sends from; QPNs, MTU, GIDs, Read/atomic depths, retry
/// counts); the private data arrives; DREQ → DREP, time-wait, then the IDs are forgotten.
#[test]
fn establish_qp_params_and_disconnect() {
    let mut n = Net::new(1);
    let (ida, idb, qa, qb) = n.establish();
    assert_eq!(established(&n.ev_a), vec![ida]);
    assert_eq!(established(&n.ev_b), vec![idb]);
    // Active side: it receives from its REQ PSN, sends from the REP's.
    assert_eq!(qa.rtr.dest_qp_num, 0x22);
    assert_eq!(qa.rtr.rq_psn, 0x1111);
    assert_eq!(qa.rts.sq_psn, 0x2222);
    assert_eq!(qb.rtr.dest_qp_num, 0x11);
    assert_eq!(qb.rtr.rq_psn, 0x2222);
    assert_eq!(qb.rts.sq_psn, 0x1111);
    assert_eq!(qa.rtr.path_mtu, Mtu::Mtu1024);
    assert_eq!(qb.rtr.path_mtu, Mtu::Mtu1024);
    assert_eq!(qa.rtr.ah_attr.dgid, n.gb);
    assert_eq!(qb.rtr.ah_attr.dgid, n.ga);
    assert_eq!((qa.local_gid, qb.local_gid), (n.ga, n.gb));
    // Reads: A issues at most min(5, B's responder resources 4); B accepts at most 4.
    assert_eq!(qa.rts.max_rd_atomic, 4);
    assert_eq!(qb.rtr.max_dest_rd_atomic, 4);
    // B issues 2, A accepts min(3, 2).
    assert_eq!(qb.rts.max_rd_atomic, 2);
    assert_eq!(qa.rtr.max_dest_rd_atomic, 2);
    // RNR retries: each side uses what the other asked for.
    assert_eq!(qa.rts.rnr_retry, 6);
    assert_eq!(qb.rts.rnr_retry, 5);
    assert_eq!((qa.rts.retry_cnt, qb.rts.retry_cnt), (7, 7));
    assert_eq!((qa.rts.timeout, qb.rts.timeout), (18, 18));
    assert_eq!((qa.pkey, qb.pkey), (0xffff, 0xffff));
    // The Established events carry the same attributes.
    assert!(
        n.ev_b
            .iter()
            .any(|e| matches!(e, CmEvent::Established { qp, .. } if *qp == qb))
    );
    // Private data of REQ and REP, zero-padded to their areas (C1.3).
    let req = match &n.ev_b[0] {
        CmEvent::ConnectRequest(r) => r,
        e => panic!("{e:?}"),
    };
    assert_eq!(&req.req.private_data[..5], b"hello");
    assert_eq!(req.req.private_data.len(), 92);
    match &n.ev_a[0] {
        CmEvent::ConnectReply { rep, .. } => assert_eq!(&rep.private_data[..8], b"accepted"),
        e => panic!("{e:?}"),
    }
    // TIDs: REP and RTU reuse the REQ's (as Linux does).
    let tid = |n: &Net, attr| {
        n.log
            .iter()
            .find(|(_, _, m)| m.msg.attr_id() == attr)
            .unwrap()
            .2
            .hdr
            .tid
    };
    let req_tid = tid(&n, AttrId::Req);
    assert_eq!(tid(&n, AttrId::Rep), req_tid);
    assert_eq!(tid(&n, AttrId::Rtu), req_tid);

    n.a.disconnect(n.now, ida, b"bye").unwrap();
    n.pump();
    assert_eq!(disconnected(&n.ev_a), vec![ida]);
    assert_eq!(disconnected(&n.ev_b), vec![idb]);
    match n.ev_b.last() {
        Some(CmEvent::Disconnected { private_data, .. }) => assert_eq!(&private_data[..3], b"bye"),
        e => panic!("{e:?}"),
    }
    assert_eq!(n.a.state(ida), Some(State::TimeWait));
    assert_eq!(n.b.state(idb), Some(State::TimeWait));
    // DREQ has a TID of its own, the DREP echoes it; the DREQ names B's QPN.
    let dreq = &n
        .log
        .iter()
        .find(|(_, _, m)| m.msg.attr_id() == AttrId::Dreq)
        .unwrap()
        .2;
    let drep = &n
        .log
        .iter()
        .find(|(_, _, m)| m.msg.attr_id() == AttrId::Drep)
        .unwrap()
        .2;
    assert_ne!(dreq.hdr.tid, req_tid);
    assert_eq!(drep.hdr.tid, dreq.hdr.tid);
    assert!(matches!(&dreq.msg, CmMsg::Dreq(d) if d.remote_qpn == 0x22));
    n.settle();
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
    assert!(
        n.ev_a
            .iter()
            .any(|e| matches!(e, CmEvent::TimeWaitExit { id } if *id == ida))
    );
    // No retransmission happened on a clean wire.
    assert_eq!(n.a.stats().retransmits + n.b.stats().retransmits, 0);
}

/// C1.7: the passive side disconnects; the active side answers the DREQ.
#[test]
fn passive_side_disconnects() {
    let mut n = Net::new(2);
    let (ida, idb, _, _) = n.establish();
    n.b.disconnect(n.now, idb, b"").unwrap();
    n.pump();
    assert_eq!(disconnected(&n.ev_a), vec![ida]);
    assert_eq!(disconnected(&n.ev_b), vec![idb]);
    assert!(matches!(
        n.b.disconnect(n.now, idb, b""),
        Err(CmError::State {
            state: State::TimeWait,
            ..
        })
    ));
}

/// The last event of `ev`, which must be a REJ received: the connection, the reason and the
/// private data.
fn rejected(ev: &[CmEvent]) -> (CmId, RejReason, &[u8]) {
    match ev.last() {
        Some(CmEvent::Rejected {
            id,
            reason,
            private_data,
            ..
        }) => (*id, *reason, private_data),
        e => panic!("expected Rejected, have {e:?}"),
    }
}

/// C1.6, C1.7: the application rejects the REQ with consumer reason 28 and private data; the
/// active side gets both; neither side keeps state.
#[test]
fn consumer_reject_with_private_data() {
    let mut n = Net::new(3);
    let ida = n.connect();
    let idb = n.b_request();
    n.b.reject(n.now, idb, RejReason::ConsumerDefined, &[], b"go away")
        .unwrap();
    n.pump();
    let (id, reason, private_data) = rejected(&n.ev_a);
    assert_eq!((id, reason), (ida, RejReason::ConsumerDefined));
    assert_eq!(&private_data[..7], b"go away");
    assert_eq!(private_data.len(), 148);
    let rej = &n.log.last().unwrap().2;
    assert!(matches!(&rej.msg, CmMsg::Rej(r) if r.message_rejected == MsgType::Req && r.local_comm_id == idb.0));
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
    n.settle();
    assert_eq!(n.sent(Side::A, AttrId::Req), 1, "no REQ retransmission after REJ");
}

/// C1.7 "listen by service ID", C1.3, C1.6: a raw IB service ID (IPoIB-CM's `0x10…|UD QPN`,
/// RFC 4755 §3.5) with 8 octets of raw private data: the listener sees them as sent (REQ
/// private data padded to 92) and no rdma_cm header even when octet 1 reads like one's IP
/// version (IPCM-10's QPN 0x40_0001); its REJ with reason 28 and private data reaches the
/// connector; a REQ for the RFC-prefix form nobody listens on gets REJ 8.
#[test]
fn raw_ib_service_req_and_rej_with_private_data() {
    let mut n = Net::new(31);
    let sid = 0x1000_0000_0040_0001u64;
    n.b.listen(sid).unwrap();
    // Reserved 0, UD QPN 0x40_0001, Receive MTU 65,524.
    let pd = [0x00, 0x40, 0x00, 0x01, 0x00, 0x00, 0xff, 0xf4];
    let p = ConnectParams::ib_service(n.gb, sid, 0x11, 0x1111, &pd);
    let ida = n.a.connect(n.now, p).unwrap();
    n.pump();
    let r = match n.ev_b.last() {
        Some(CmEvent::ConnectRequest(r)) => r.clone(),
        e => panic!("B expected a ConnectRequest, has {e:?}"),
    };
    assert_eq!(r.service_id, sid);
    assert_eq!(r.from, n.ga);
    assert!(r.cma.is_none(), "a raw service has no rdma_cm header: {:?}", r.cma);
    assert_eq!(&r.req.private_data[..8], &pd);
    assert!(r.req.private_data[8..].iter().all(|b| *b == 0));
    n.b.reject(n.now, r.id, RejReason::ConsumerDefined, &[], &pd).unwrap();
    n.pump();
    let (id, reason, private_data) = rejected(&n.ev_a);
    assert_eq!((id, reason), (ida, RejReason::ConsumerDefined));
    assert_eq!(&private_data[..8], &pd);
    let p = ConnectParams::ib_service(n.gb, 0x0100_0000_0040_0001, 0x12, 1, &pd);
    let idc = n.a.connect(n.now, p).unwrap();
    n.pump();
    let (id, reason, _) = rejected(&n.ev_a);
    assert_eq!((id, reason), (idc, RejReason::InvalidServiceId));
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
}

/// C1.6, C1.7: the active application rejects the REP (before RTU): the passive side learns
/// it and stops retransmitting its REP.
#[test]
fn active_rejects_rep() {
    let mut n = Net::new(4);
    let ida = n.connect();
    let idb = n.b_request();
    n.b.accept(n.now, idb, accept_params(0x22, 1)).unwrap();
    n.pump();
    n.a.reject(n.now, ida, RejReason::ConsumerDefined, &[], b"no").unwrap();
    n.pump();
    let (id, reason, private_data) = rejected(&n.ev_b);
    assert_eq!((id, reason), (idb, RejReason::ConsumerDefined));
    assert_eq!(&private_data[..2], b"no");
    let rej = &n.log.iter().rfind(|(s, _, _)| *s == Side::A).unwrap().2;
    assert!(matches!(&rej.msg, CmMsg::Rej(r) if r.message_rejected == MsgType::Rep));
    n.settle();
    assert_eq!(n.sent(Side::B, AttrId::Rep), 1);
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
}

/// C1.6: a REQ for a service nobody listens on gets REJ 8 with local comm ID 0 and the TID of
/// the REQ, as Linux answers (lab capture frame 19).
#[test]
fn unknown_service_gets_rej_8() {
    let mut n = Net::new(5);
    let mut p = connect_params(n.gb, 0x11, 1);
    p.service_id = service_id(PortSpace::Tcp, 7175);
    let ida = n.a.connect(n.now, p).unwrap();
    n.pump();
    let (id, reason, _) = rejected(&n.ev_a);
    assert_eq!((id, reason), (ida, RejReason::InvalidServiceId));
    let (req, rej) = (&n.log[0].2, &n.log[1].2);
    assert_eq!(rej.hdr.tid, req.hdr.tid);
    assert!(matches!(&rej.msg, CmMsg::Rej(r) if r.local_comm_id == 0 && r.remote_comm_id == ida.0));
    assert_eq!(n.b.connections(), 0);
    assert!(n.ev_b.is_empty());
    // After unlisten the known service is refused the same way.
    assert!(n.b.unlisten(SID));
    n.a.connect(n.now, connect_params(n.gb, 0x12, 1)).unwrap();
    n.pump();
    assert_eq!(rejected(&n.ev_a).1, RejReason::InvalidServiceId);
}

/// C1.6: a REQ whose remote GID is not the listener's gets REJ 12 with our GID as ARI (what
/// rxe answers, lab README); a REQ for UC gets REJ 9; an invalid MTU code REJ 26.
#[test]
fn req_validation_rejects() {
    let mut n = Net::new(6);
    {
        let why = RejReason::InvalidGid;
        let mut p = connect_params(n.gb, 0x11, 1);
        p.remote_gid = gid(9);
        // The MAD still goes to B: only the REQ's remote GID names another port.
        let id = n.a.connect(n.now, p).unwrap();
        let (_, mut mad) = n.a.poll_transmit().unwrap();
        let bytes = mad.emit().unwrap();
        n.b.handle_mad(n.now, &bytes, n.ga).unwrap();
        let (to, rej) = n.b.poll_transmit().unwrap();
        assert_eq!(to, n.ga);
        match &rej.msg {
            CmMsg::Rej(r) => {
                assert_eq!(r.reason, why);
                assert_eq!(r.remote_comm_id, id.0);
                assert_eq!(r.ari, n.gb.0.to_vec());
            }
            m => panic!("{m:?}"),
        }
        // Transport type UC and an MTU code of 7, on the same REQ made valid otherwise.
        if let CmMsg::Req(q) = &mut mad.msg {
            q.primary_path.remote_gid = n.gb;
            q.transport_service_type = 1;
            q.local_comm_id ^= 1;
        }
        n.b.handle_mad(n.now, &mad.emit().unwrap(), n.ga).unwrap();
        let (_, rej) = n.b.poll_transmit().unwrap();
        assert!(matches!(&rej.msg, CmMsg::Rej(r) if r.reason == RejReason::InvalidTransportType));
        if let CmMsg::Req(q) = &mut mad.msg {
            q.transport_service_type = 0;
            q.path_mtu = 7;
            q.local_comm_id ^= 2;
        }
        n.b.handle_mad(n.now, &mad.emit().unwrap(), n.ga).unwrap();
        let (_, rej) = n.b.poll_transmit().unwrap();
        assert!(matches!(&rej.msg, CmMsg::Rej(r) if r.reason == RejReason::InvalidMtu));
    }
    assert_eq!(n.b.connections(), 0);
}

/// C1.7: nobody answers the REQ: it is sent again every peer response timeout + 2 × packet
/// life time, max CM retries times, then the active side sends REJ "timeout" (code 4) with its
/// CA GUID as ARI and reports TimedOut.
#[test]
fn req_retransmission_then_timeout() {
    let mut n = Net::new(7);
    n.drop_rule = Some(Box::new(|s, _| s == Side::A));
    let ida = n.connect();
    n.settle();
    let reqs: Vec<Duration> = n
        .log
        .iter()
        .filter(|(_, _, m)| m.msg.attr_id() == AttrId::Req)
        .map(|(_, t, _)| *t)
        .collect();
    assert_eq!(reqs.len(), 1 + 4, "the REQ and max CM retries (4) repeats");
    let step = iba_time(12) + 2 * iba_time(10);
    for (i, t) in reqs.iter().enumerate() {
        assert_eq!(*t, step * i as u32, "REQ {i} at {t:?}");
    }
    // All repeats carry the same TID and comm ID.
    let first = &n.log[0].2;
    assert!(
        n.log
            .iter()
            .filter(|(_, _, m)| m.msg.attr_id() == AttrId::Req)
            .all(|(_, _, m)| m == first)
    );
    let (_, t, rej) = n.log.last().unwrap();
    assert_eq!(*t, step * 5);
    match &rej.msg {
        CmMsg::Rej(r) => {
            assert_eq!(r.reason, RejReason::Timeout);
            assert_eq!(u16::from(r.reason), 4);
            assert_eq!(r.ari, 0xa11ceu64.to_be_bytes().to_vec());
            assert_eq!(r.local_comm_id, ida.0);
        }
        m => panic!("{m:?}"),
    }
    assert_eq!(n.ev_a, vec![CmEvent::TimedOut { id: ida }]);
    assert_eq!(n.a.stats().retransmits, 4);
    assert_eq!(n.a.connections(), 0);
}

/// C1.7: the first REP is lost; the active side's repeated REQ reaches the passive side in
/// REP-sent, which answers with the REP again (not a second connection).
#[test]
fn repeated_req_while_rep_outstanding_gets_rep_again() {
    let mut n = Net::new(8);
    n.drop_rule = Some(drop_first(Side::B, AttrId::Rep));
    n.auto = true;
    let ida = n.connect();
    n.run_until(|n| established(&n.ev_b).len() == 1);
    assert_eq!(established(&n.ev_a), vec![ida]);
    assert_eq!(n.sent(Side::A, AttrId::Req), 2);
    // The repeated REQ is answered by a REP at once (B's own REP timer runs out at the same
    // instant here, so a third REP may follow).
    let i = n
        .log
        .iter()
        .rposition(|(s, _, m)| *s == Side::A && m.msg.attr_id() == AttrId::Req)
        .unwrap();
    assert!(
        n.log[i..]
            .iter()
            .any(|(s, t, m)| *s == Side::B && *t == n.log[i].1 && m.msg.attr_id() == AttrId::Rep)
    );
    assert_eq!(n.b.connections(), 1);
    assert_eq!(n.b.stats().duplicates, 1);
    assert_eq!(
        n.ev_b
            .iter()
            .filter(|e| matches!(e, CmEvent::ConnectRequest(_)))
            .count(),
        1
    );
}

/// C1.7: the RTU is lost: the passive side sends its REP again after its timeout and the
/// active side, established, answers with the RTU again.
#[test]
fn lost_rtu_rep_repeated_rtu_repeated() {
    let mut n = Net::new(9);
    n.drop_rule = Some(drop_first(Side::A, AttrId::Rtu));
    n.auto = true;
    n.connect();
    n.run_until(|n| established(&n.ev_b).len() == 1);
    assert_eq!(n.sent(Side::B, AttrId::Rep), 2);
    assert_eq!(n.sent(Side::A, AttrId::Rtu), 2);
    assert_eq!(established(&n.ev_a).len(), 1, "one Established per side");
    assert_eq!(n.a.stats().duplicates, 1);
}

/// C1.7: the passive side's REP is never answered: REP retransmitted max CM retries times
/// (the REQ's, 4), then REJ "timeout" (message rejected: REP) and TimedOut.
#[test]
fn rep_retransmission_then_timeout() {
    let mut n = Net::new(10);
    let ida = n.connect();
    let idb = n.b_request();
    // From now on the wire loses everything (so no repeated REQ prompts a REP either).
    n.drop_rule = Some(Box::new(|_, _| true));
    n.b.accept(n.now, idb, accept_params(0x22, 1)).unwrap();
    n.settle();
    assert_eq!(n.sent(Side::B, AttrId::Rep), 5);
    let rej = n.log.iter().rev().find(|(s, _, _)| *s == Side::B).unwrap();
    assert!(
        matches!(&rej.2.msg, CmMsg::Rej(r) if r.reason == RejReason::Timeout && r.message_rejected == MsgType::Rep)
    );
    assert!(n.ev_b.contains(&CmEvent::TimedOut { id: idb }));
    // The active side, hearing nothing either (the wire loses all), timed out as well.
    assert!(n.ev_a.contains(&CmEvent::TimedOut { id: ida }));
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
}

/// C1.7: the passive application is slow. The repeated REQ gets an MRA (rdma_cm's rule: an
/// MRA when the REQ is repeated); the active side stops retransmitting and waits the service
/// timeout; the late accept then completes the connection.
#[test]
fn slow_application_mra() {
    let mut n = Net::new(11);
    let ida = n.connect();
    let idb = n.b_request();
    // Nothing answers until the first REQ repeat.
    assert!(n.advance());
    assert_eq!(n.sent(Side::A, AttrId::Req), 2);
    assert_eq!(n.sent(Side::B, AttrId::Mra), 1);
    assert_eq!(n.a.state(ida), Some(State::MraReqRcvd));
    assert_eq!(n.b.state(idb), Some(State::MraReqSent));
    // The wait is now the MRA's service timeout (2^16 × 4.096 µs + 2 × packet life).
    let wait = n.a.poll_timeout().unwrap() - n.now;
    assert_eq!(wait, iba_time(16) + 2 * iba_time(10));
    // Halfway through it the application accepts.
    n.now += wait / 2;
    n.b.accept(n.now, idb, accept_params(0x22, 1)).unwrap();
    n.auto = true;
    n.run_until(|n| established(&n.ev_b).len() == 1);
    assert_eq!(established(&n.ev_a), vec![ida]);
    assert_eq!(n.sent(Side::A, AttrId::Req), 2, "no REQ repeat after the MRA");
}

/// C1.7: the MRA's service timeout passes with no REP: REJ "timeout", TimedOut.
#[test]
fn mra_wait_runs_out() {
    let mut n = Net::new(12);
    let ida = n.connect();
    assert!(n.advance());
    assert_eq!(n.a.state(ida), Some(State::MraReqRcvd));
    n.settle();
    assert!(n.ev_a.contains(&CmEvent::TimedOut { id: ida }));
    assert_eq!(n.sent(Side::A, AttrId::Req), 2);
    // The passive side learns from the REJ "timeout" and forgets the request.
    assert!(n.ev_b.iter().any(|e| matches!(
        e,
        CmEvent::Rejected {
            reason: RejReason::Timeout,
            ..
        }
    )));
    assert_eq!(n.b.connections(), 0);
}

/// C1.7: a new REQ from the (CA GUID, QPN) of a live connection is stale: REJ 10, and the old
/// connection gets a DREQ (Linux, lab README "Live duplicate"). After time-wait starts, the
/// same QP may connect again.
#[test]
fn stale_connection() {
    let mut n = Net::new(13);
    let (ida, idb, _, _) = n.establish();
    let id2 = n.a.connect(n.now, connect_params(n.gb, 0x11, 0x1111)).unwrap();
    n.pump();
    assert!(n.ev_a.iter().any(|e| matches!(e,
        CmEvent::Rejected { id, reason: RejReason::StaleConn, .. } if *id == id2)));
    assert_eq!(disconnected(&n.ev_a), vec![ida]);
    assert_eq!(disconnected(&n.ev_b), vec![idb]);
    // The old one is in time-wait now; the same QP connects again.
    let id3 = n.a.connect(n.now, connect_params(n.gb, 0x11, 0x1111)).unwrap();
    n.pump();
    assert!(
        n.ev_b
            .iter()
            .filter(|e| matches!(e, CmEvent::ConnectRequest(_)))
            .count()
            == 2
    );
    assert_eq!(n.a.state(id3), Some(State::ReqSent));
}

/// C1.7: a repeated REQ of an established connection is dropped (no second connection, no
/// event); a repeated REP is answered by the RTU again.
#[test]
fn duplicates_of_established_connection() {
    let mut n = Net::new(14);
    n.establish();
    let req = n
        .log
        .iter()
        .find(|(_, _, m)| m.msg.attr_id() == AttrId::Req)
        .unwrap()
        .2
        .clone();
    let rep = n
        .log
        .iter()
        .find(|(_, _, m)| m.msg.attr_id() == AttrId::Rep)
        .unwrap()
        .2
        .clone();
    let evs = n.ev_b.len();
    n.b.handle_mad(n.now, &req.emit().unwrap(), n.ga).unwrap();
    assert!(n.b.poll_transmit().is_none());
    assert!(n.b.poll_event().is_none());
    assert_eq!(n.ev_b.len(), evs);
    assert_eq!(n.b.connections(), 1);
    n.a.handle_mad(n.now, &rep.emit().unwrap(), n.gb).unwrap();
    let (_, again) = n.a.poll_transmit().unwrap();
    assert_eq!(again.msg.attr_id(), AttrId::Rtu);
}

/// C1.7: the DREP is lost: the DREQ is sent again, the side in time-wait answers with a DREP
/// again; each side reports one Disconnected.
#[test]
fn lost_drep() {
    let mut n = Net::new(15);
    let (ida, idb, _, _) = n.establish();
    n.drop_rule = Some(drop_first(Side::B, AttrId::Drep));
    n.a.disconnect(n.now, ida, b"").unwrap();
    n.run_until(|n| !disconnected(&n.ev_a).is_empty());
    assert_eq!(n.sent(Side::A, AttrId::Dreq), 2);
    assert_eq!(n.sent(Side::B, AttrId::Drep), 2);
    assert_eq!(disconnected(&n.ev_a), vec![ida]);
    assert_eq!(disconnected(&n.ev_b), vec![idb]);
}

/// C1.7: the peer never answers the DREQ: repeated max CM retries times, then the connection
/// is down anyway (Disconnected, time-wait, forgotten).
#[test]
fn dreq_timeout() {
    let mut n = Net::new(16);
    let (ida, _, _, _) = n.establish();
    n.drop_rule = Some(Box::new(|s, _| s == Side::A));
    n.a.disconnect(n.now, ida, b"").unwrap();
    n.run_until(|n| !disconnected(&n.ev_a).is_empty());
    assert_eq!(n.sent(Side::A, AttrId::Dreq), 5);
    assert_eq!(n.a.state(ida), Some(State::TimeWait));
    n.settle();
    assert_eq!(n.a.connections(), 0);
}

/// C1.7: both sides disconnect at once: each answers the other's DREQ, each reports one
/// Disconnected, the crossing DREPs are counted as duplicates.
#[test]
fn crossing_dreqs() {
    let mut n = Net::new(17);
    let (ida, idb, _, _) = n.establish();
    n.a.disconnect(n.now, ida, b"").unwrap();
    n.b.disconnect(n.now, idb, b"").unwrap();
    n.settle();
    assert_eq!(disconnected(&n.ev_a), vec![ida]);
    assert_eq!(disconnected(&n.ev_b), vec![idb]);
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
}

/// C1.7: a DREQ naming another QPN is dropped (Linux `cm_dreq_handler`, measured); a DREQ
/// for a comm ID nobody knows still gets a DREP.
#[test]
fn dreq_checks() {
    let mut n = Net::new(18);
    let (ida, idb, _, _) = n.establish();
    n.a.disconnect(n.now, ida, b"").unwrap();
    let (_, mut dreq) = n.a.poll_transmit().unwrap();
    if let CmMsg::Dreq(d) = &mut dreq.msg {
        d.remote_qpn = 0x999;
    }
    n.b.handle_mad(n.now, &dreq.emit().unwrap(), n.ga).unwrap();
    assert!(n.b.poll_transmit().is_none());
    assert_eq!(n.b.state(idb), Some(State::Established));
    if let CmMsg::Dreq(d) = &mut dreq.msg {
        d.remote_qpn = 0x22;
        d.remote_comm_id = 0x1234_5678;
    }
    n.b.handle_mad(n.now, &dreq.emit().unwrap(), n.ga).unwrap();
    let (_, drep) = n.b.poll_transmit().unwrap();
    assert!(matches!(&drep.msg, CmMsg::Drep(d) if d.remote_comm_id == ida.0));
    assert_eq!(n.b.state(idb), Some(State::Established));
}

/// C1.7, C1.8: the passive QP sees data before the RTU (the RTU was lost): the provider's
/// notification establishes the connection and stops the REP retransmission.
#[test]
fn first_data_establishes_passive_side() {
    let mut n = Net::new(19);
    n.drop_rule = Some(Box::new(|s, m| s == Side::A && m.msg.attr_id() == AttrId::Rtu));
    n.auto = true;
    n.connect();
    let idb = n.b_request();
    assert_eq!(n.b.state(idb), Some(State::RepSent));
    n.b.notify_established(n.now, idb).unwrap();
    n.pump();
    assert_eq!(established(&n.ev_b), vec![idb]);
    n.settle();
    assert_eq!(n.sent(Side::B, AttrId::Rep), 1);
}

/// C1.7: comm IDs are random and unique, TIDs unique per CM; another seed gives other IDs.
#[test]
fn comm_ids_and_tids_unique() {
    let mut n = Net::new(20);
    n.b.unlisten(SID);
    let mut ids = std::collections::HashSet::new();
    for q in 0..200u32 {
        let id = n.a.connect(n.now, connect_params(n.gb, 0x100 + q, 1)).unwrap();
        assert_ne!(id.0, 0);
        assert!(ids.insert(id));
    }
    let mut tids = std::collections::HashSet::new();
    while let Some((_, m)) = n.a.poll_transmit() {
        assert!(tids.insert(m.hdr.tid));
    }
    assert_eq!(tids.len(), 200);
    // Not a counter.
    let mut v: Vec<u32> = ids.iter().map(|i| i.0).collect();
    v.sort();
    assert!(v.windows(2).any(|w| w[1] - w[0] > 1));
    let mut other = Cm::new(cfg(0xa11ce, gid(1), 99));
    let o = other.connect(n.now, connect_params(n.gb, 1, 1)).unwrap();
    assert!(!ids.contains(&o));
}

/// rdma_cm interop shape: `ConnectParams::rdma_cm` builds the RDMA_PS_TCP service ID and
/// the cma header; the listener sees the header's source address and port.
#[test]
fn rdma_cm_connect_params() {
    let mut n = Net::new(21);
    let src: SocketAddr = "10.0.0.1:40000".parse().unwrap();
    let dst: SocketAddr = "10.0.0.2:7174".parse().unwrap();
    let p = ConnectParams::rdma_cm(src, dst, 0x11, 0x1111, b"ulp").unwrap();
    assert_eq!(p.service_id, SID);
    assert_eq!(p.remote_gid, n.gb);
    n.a.connect(n.now, p).unwrap();
    n.pump();
    match &n.ev_b[0] {
        CmEvent::ConnectRequest(r) => {
            let h = r.cma.unwrap();
            assert_eq!(h.src, src);
            assert_eq!(h.dst, dst.ip());
            assert_eq!(&r.req.private_data[36..39], b"ulp");
            assert_eq!(r.from, n.ga);
        }
        e => panic!("{e:?}"),
    }
    assert!(ConnectParams::rdma_cm(src, dst, 1, 1, &[0; 57]).is_err());
}

/// Commands in the wrong state or with too much private data are refused, with no MAD sent.
#[test]
fn command_errors() {
    let mut n = Net::new(22);
    let ida = n.connect();
    let idb = n.b_request();
    let mut big = connect_params(n.gb, 1, 1);
    big.private_data = vec![0; 93];
    assert!(matches!(n.a.connect(n.now, big), Err(CmError::TooLong { max: 92, .. })));
    let mut ap = accept_params(1, 1);
    ap.private_data = vec![0; 197];
    assert!(matches!(
        n.b.accept(n.now, idb, ap),
        Err(CmError::TooLong { max: 196, .. })
    ));
    assert!(matches!(
        n.a.rtu(n.now, ida, b""),
        Err(CmError::State {
            state: State::ReqSent,
            ..
        })
    ));
    assert!(matches!(n.a.disconnect(n.now, ida, b""), Err(CmError::State { .. })));
    assert!(matches!(
        n.b.accept(n.now, CmId(1), accept_params(1, 1)),
        Err(CmError::UnknownId(_))
    ));
    assert!(matches!(
        n.b.reject(n.now, idb, RejReason::ConsumerDefined, &[0; 73], b""),
        Err(CmError::TooLong { max: 72, .. })
    ));
    assert_eq!(n.b.listen(SID), Err(CmError::AlreadyListening(SID)));
    n.b.accept(n.now, idb, accept_params(1, 1)).unwrap();
    assert!(matches!(
        n.b.accept(n.now, idb, accept_params(1, 1)),
        Err(CmError::State {
            state: State::RepSent,
            ..
        })
    ));
    assert!(n.a.poll_transmit().is_none());
}

/// C1.7 under loss and duplication: with 300 fixed seeds, 10 or 20 % of MADs dropped and 20 %
/// duplicated, every connection still establishes on both sides with matching QP
/// parameters, and disconnects on both sides, exactly one event of each kind per side.
#[test]
fn lossy_wire_fixed_seeds() {
    for seed in 100..400 {
        let mut n = Net::new(seed);
        // 10 or 20 % loss; 20 % duplicates.
        n.drop_pct = 10 * (1 + (seed % 2) as u32);
        n.dup_pct = 20;
        n.auto = true;
        let ida = n.connect();
        n.run_until(|n| {
            established(&n.ev_b).len() == 1 || n.ev_a.iter().any(|e| matches!(e, CmEvent::TimedOut { .. }))
        });
        assert_eq!(established(&n.ev_a), vec![ida], "seed {seed}: {:?}", n.ev_a);
        let idb = *established(&n.ev_b).first().unwrap_or_else(|| {
            panic!(
                "seed {seed}: B not established: {:#?}\nA: {:#?}\n{:#?}",
                n.ev_b,
                n.ev_a,
                n.log
                    .iter()
                    .map(|(s, t, m)| (s, t, m.msg.attr_id()))
                    .collect::<Vec<_>>()
            )
        });
        let qa = match n.ev_a.iter().find(|e| matches!(e, CmEvent::Established { .. })) {
            Some(CmEvent::Established { qp, .. }) => *qp,
            _ => unreachable!(),
        };
        let qb = match n.ev_b.iter().find(|e| matches!(e, CmEvent::Established { .. })) {
            Some(CmEvent::Established { qp, .. }) => *qp,
            _ => unreachable!(),
        };
        assert_eq!(qa.rtr.rq_psn, qb.rts.sq_psn, "seed {seed}");
        assert_eq!(qb.rtr.rq_psn, qa.rts.sq_psn, "seed {seed}");
        assert_eq!(
            n.ev_b
                .iter()
                .filter(|e| matches!(e, CmEvent::ConnectRequest(_)))
                .count(),
            1,
            "seed {seed}: one connection for repeated REQs"
        );
        if seed % 2 == 0 {
            n.a.disconnect(n.now, ida, b"").unwrap();
        } else {
            n.b.disconnect(n.now, idb, b"").unwrap();
        }
        n.settle();
        assert_eq!(disconnected(&n.ev_a), vec![ida], "seed {seed}");
        assert_eq!(disconnected(&n.ev_b), vec![idb], "seed {seed}");
        assert_eq!((n.a.connections(), n.b.connections()), (0, 0), "seed {seed}");
    }
}

/// C1.7: the active application asks for patience before its RTU (explicit MRA for the
/// REP): the passive side stops repeating the REP, a repeated REP gets the MRA again, and the
/// late RTU establishes the connection.
#[test]
fn explicit_mra_for_rep() {
    let mut n = Net::new(23);
    let ida = n.connect();
    let idb = n.b_request();
    n.b.accept(n.now, idb, accept_params(0x22, 1)).unwrap();
    n.pump();
    n.a.mra(n.now, ida).unwrap();
    n.pump();
    assert_eq!(n.b.state(idb), Some(State::MraRepRcvd));
    let wait = n.b.poll_timeout().unwrap() - n.now;
    assert_eq!(wait, iba_time(16) + 2 * iba_time(10));
    // A repeated REP (as if B's timer had fired before the MRA arrived) gets the MRA again.
    let rep = n
        .log
        .iter()
        .find(|(_, _, m)| m.msg.attr_id() == AttrId::Rep)
        .unwrap()
        .2
        .clone();
    n.a.handle_mad(n.now, &rep.emit().unwrap(), n.gb).unwrap();
    n.pump();
    assert_eq!(n.sent(Side::A, AttrId::Mra), 2);
    n.now += wait / 2;
    n.a.rtu(n.now, ida, b"").unwrap();
    n.pump();
    assert_eq!(established(&n.ev_b), vec![idb]);
    n.settle();
    assert_eq!(n.sent(Side::B, AttrId::Rep), 1, "no REP repeat after the MRA");
    assert!(matches!(
        n.a.mra(n.now, ida),
        Err(CmError::UnknownId(_)) | Err(CmError::State { .. })
    ));
}

/// C1.6, C1.7: every RTU is lost; the passive side's REP runs out of retries and its REJ
/// "timeout" reaches the active side, which was established: it reports the REJ and goes to
/// time-wait (Linux `cm_rej_handler`), so neither side keeps a half-open connection.
#[test]
fn rej_after_rtu_ends_active_connection() {
    let mut n = Net::new(24);
    n.drop_rule = Some(Box::new(|s, m| s == Side::A && m.msg.attr_id() == AttrId::Rtu));
    n.auto = true;
    let ida = n.connect();
    n.settle();
    assert_eq!(established(&n.ev_a), vec![ida]);
    assert!(established(&n.ev_b).is_empty());
    assert!(n.ev_b.iter().any(|e| matches!(e, CmEvent::TimedOut { .. })));
    assert!(n.ev_a.iter().any(|e| matches!(e,
        CmEvent::Rejected { id, reason: RejReason::Timeout, .. } if *id == ida)));
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
}
