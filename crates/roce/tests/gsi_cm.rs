//! The RoCEv2 connection manager ([`roce::gsi_cm::GsiCm`]) at the verbs level: two devices
//! whose QP1s are joined by an in-memory wire (a delivery thread, MADs as octets, losses
//! chosen by the test), and whose QPs record every `modify_qp` and check it against the
//! IBA transition rules. Applications use `Device::listen`, `ProtectionDomain::connect`,
//! `ConnectRequest::accept/reject` and `QueuePair::disconnect` as on iWARP.
//!
//! Requirement IDs: `../shared/requirements/smcr-ipoibcm.md` part C1 (numbered in
//! `roce::cm`'s docs: C1.3 private data, C1.6 REJ reasons, C1.7 retransmission and
//! time-wait, C1.8 QP states driven by the CM).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use roce::cm::mad::SidrStatus;
use roce::cm::mad::{CmMsg, Mad, RejReason};
use roce::gsi::{GsiHandler, GsiPort};
use roce::gsi_cm::{GsiCm, GsiCmConfig, Rejection, SidrRefusal};
use verbs::cm::backend::CmBackend;
use verbs::notify::EventQueue;
use verbs::provider::{Provider, QpCreate, QpOps};
use verbs::qp_attr::check_modify;
use verbs::{
    CmEvent, Device, DeviceAttr, Error, Gid, PortSpace, QpAttr, QpOptions, QpState, QpType, QueuePair, RDMA_UDP_QKEY,
    RecvWr, Result, SendWr,
};

/// Decides, per MAD (parsed) and sender, to lose it.
type DropRule = Box<dyn FnMut(Gid, &Mad) -> bool + Send>;

/// The wire between the devices' QP1s: a thread delivers every MAD to the device of its
/// destination GID, unless the rule drops it.
struct Wire {
    devs: Mutex<Vec<(Gid, Weak<FakeDev>)>>,
    rule: Mutex<Option<DropRule>>,
    dropped: AtomicU64,
    tx: Mutex<Sender<(Gid, Gid, Vec<u8>)>>,
}

impl Wire {
    fn new() -> Arc<Wire> {
        let (tx, rx) = channel::<(Gid, Gid, Vec<u8>)>();
        let w = Arc::new(Wire {
            devs: Mutex::new(Vec::new()),
            rule: Mutex::new(None),
            dropped: AtomicU64::new(0),
            tx: Mutex::new(tx),
        });
        let weak = Arc::downgrade(&w);
        std::thread::spawn(move || {
            while let Ok((from, to, bytes)) = rx.recv() {
                let Some(w) = weak.upgrade() else { return };
                let mad = Mad::parse(&bytes).expect("the CM sends MADs that parse");
                if let Some(rule) = w.rule.lock().unwrap().as_mut()
                    && rule(from, &mad)
                {
                    w.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let dev = w
                    .devs
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|(g, _)| *g == to)
                    .and_then(|(_, d)| d.upgrade());
                if let Some(h) = dev.and_then(|d| d.handler.lock().unwrap().as_ref().and_then(Weak::upgrade)) {
                    h.on_mad(from, 1, 0xffff, &bytes);
                }
            }
        });
        w
    }
    fn drop_rule(&self, rule: impl FnMut(Gid, &Mad) -> bool + Send + 'static) {
        *self.rule.lock().unwrap() = Some(Box::new(rule));
    }
}

/// A device with no data path: QP1 on the wire, QPs that record their transitions.
struct FakeDev {
    gid: Gid,
    wire: Arc<Wire>,
    handler: Mutex<Option<Weak<dyn GsiHandler>>>,
    qps: Mutex<HashMap<u32, Arc<FakeQp>>>,
    next_qpn: AtomicU32,
    /// Multicast attachments: (QPN, MGID, attached?) in order.
    mcast: Mutex<Vec<(u32, Gid, bool)>>,
}

struct FakeQp {
    qpn: u32,
    qp_type: QpType,
    state: Mutex<QpState>,
    /// Every modify_qp, in order.
    log: Mutex<Vec<QpAttr>>,
    events: Arc<EventQueue<CmEvent>>,
}

impl QpOps for FakeQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }
    fn state(&self) -> QpState {
        *self.state.lock().unwrap()
    }
    fn post_send(&self, _wrs: &[SendWr]) -> Result<()> {
        Ok(())
    }
    fn post_recv(&self, _wrs: &[RecvWr]) -> Result<()> {
        Ok(())
    }
    fn modify_qp(&self, attr: &QpAttr) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        // The CM must only ask for what the IBA allows.
        check_modify(self.qp_type, *st, attr)?;
        if let Some(s) = attr.qp_state {
            *st = s;
        }
        self.log.lock().unwrap().push(attr.clone());
        Ok(())
    }
    fn query_qp(&self) -> QpAttr {
        QpAttr::default()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl GsiPort for FakeDev {
    fn local_gid(&self) -> Gid {
        self.gid
    }
    fn send_mad(&self, to: Gid, mad: &[u8]) -> std::io::Result<()> {
        assert_eq!(mad.len(), 256, "a CM MAD is 256 octets");
        let _ = self.wire.tx.lock().unwrap().send((self.gid, to, mad.to_vec()));
        Ok(())
    }
    fn set_gsi_handler(&self, handler: Weak<dyn GsiHandler>) {
        *self.handler.lock().unwrap() = Some(handler);
    }
    fn qp_events(&self, qpn: u32) -> Option<Arc<EventQueue<CmEvent>>> {
        self.qps.lock().unwrap().get(&qpn).map(|q| q.events.clone())
    }
}

impl Provider for FakeDev {
    fn query_device(&self) -> DeviceAttr {
        DeviceAttr {
            fw_ver: "0".into(),
            vendor_id: 0,
            max_qp: 64,
            max_qp_wr: 1024,
            max_sge: 16,
            max_sge_rd: 16,
            max_cq: 64,
            max_cqe: 4096,
            max_mr: 64,
            max_mr_size: 1 << 30,
            max_pd: 16,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_msg_sz: 1 << 31,
            max_inline_data: 256,
            max_fast_reg_page_list_len: 256,
            atomic_cap: true,
        }
    }
    fn attach_mcast(&self, qp: &dyn QpOps, gid: &Gid, _lid: u16) -> Result<()> {
        self.mcast.lock().unwrap().push((qp.qp_num(), *gid, true));
        Ok(())
    }
    fn detach_mcast(&self, qp: &dyn QpOps, gid: &Gid, _lid: u16) -> Result<()> {
        self.mcast.lock().unwrap().push((qp.qp_num(), *gid, false));
        Ok(())
    }
    fn create_qp(&self, req: QpCreate) -> Result<Arc<dyn QpOps>> {
        let qpn = self.next_qpn.fetch_add(1, Ordering::Relaxed);
        let qp = Arc::new(FakeQp {
            qpn,
            qp_type: req.qp_type,
            state: Mutex::new(QpState::Reset),
            log: Mutex::new(Vec::new()),
            events: req.events,
        });
        self.qps.lock().unwrap().insert(qpn, qp.clone());
        Ok(qp)
    }
}

/// Short CM timers: ≈ 67 ms response timeout + 2 × 4 ms packet life, 5 retries (a
/// handshake step may take 450 ms on a loaded machine; an application slower than that to
/// accept is covered by the MRA the repeated REQ gets).
fn fast_cfg(guid: u64) -> GsiCmConfig {
    let mut c = GsiCmConfig::new(guid, guid);
    c.cm.cm_response_timeout = 14;
    c.cm.packet_life_time = 10;
    c.cm.max_cm_retries = 5;
    // Longer than a DREQ retry, so a repeated DREQ is answered from time-wait.
    c.cm.time_wait = Duration::from_millis(250);
    c
}

struct Node {
    dev: Device,
    fake: Arc<FakeDev>,
    cm: Arc<GsiCm>,
    ip: IpAddr,
}

impl Node {
    fn qp(&self, q: &QueuePair) -> Arc<FakeQp> {
        self.fake.qps.lock().unwrap()[&q.qp_num()].clone()
    }
}

fn node(wire: &Arc<Wire>, ip: Ipv4Addr, guid: u64) -> Node {
    let gid = Gid::from_ipv4(ip);
    let fake = Arc::new(FakeDev {
        gid,
        wire: wire.clone(),
        handler: Mutex::new(None),
        qps: Mutex::new(HashMap::new()),
        next_qpn: AtomicU32::new(17),
        mcast: Mutex::new(Vec::new()),
    });
    wire.devs.lock().unwrap().push((gid, Arc::downgrade(&fake)));
    let cm = GsiCm::new(fake.clone() as Arc<dyn GsiPort>, fast_cfg(guid)).unwrap();
    let dev = verbs::provider::new_device(
        format!("rxe-test{}", ip.octets()[3]),
        fake.clone() as Arc<dyn Provider>,
        Some(cm.clone() as Arc<dyn CmBackend>),
    );
    Node {
        dev,
        fake,
        cm,
        ip: IpAddr::V4(ip),
    }
}

fn pair(net: u8) -> (Arc<Wire>, Node, Node) {
    let wire = Wire::new();
    let a = node(&wire, Ipv4Addr::new(127, 77, net, 1), 0x0200_0000_0000_0a01);
    let b = node(&wire, Ipv4Addr::new(127, 77, net, 2), 0x0200_0000_0000_0b02);
    (wire, a, b)
}

fn opts(dev: &Device) -> QpOptions {
    QpOptions::new(&dev.create_cq(64).unwrap()).rd_atomic(4, 4)
}

const T: Duration = Duration::from_secs(10);

/// A wire rule that drops the first MAD whose message `is` picks, and nothing else.
fn first_of(is: impl Fn(&CmMsg) -> bool + Send + 'static) -> impl FnMut(Gid, &Mad) -> bool + Send + 'static {
    let mut lost = false;
    move |_, m| {
        let hit = !lost && is(&m.msg);
        lost |= hit;
        hit
    }
}

/// Runs `client` on a thread against a listener on `b` at `port`, with `server` taking the
/// request; returns both results.
fn handshake<C: Send + 'static, S>(
    a: &Node,
    b: &Node,
    port: u16,
    client: impl FnOnce(Device, SocketAddr) -> C + Send + 'static,
    server: impl FnOnce(verbs::ConnectRequest) -> S,
) -> (C, S) {
    let l = b.dev.listen(SocketAddr::new(b.ip, port)).unwrap();
    let (dev, addr) = (a.dev.clone(), l.local_addr());
    let t = std::thread::spawn(move || client(dev, addr));
    let req = l.get_request(Some(T)).expect("the REQ reaches the listener");
    let s = server(req);
    (t.join().unwrap(), s)
}

fn rtr_rts(log: &[QpAttr]) -> (verbs::RtrAttr, verbs::RtsAttr) {
    let rtr = log
        .iter()
        .find(|a| a.qp_state == Some(QpState::Rtr))
        .expect("moved to RTR");
    let rts = log
        .iter()
        .find(|a| a.qp_state == Some(QpState::Rts))
        .expect("moved to RTS");
    (
        verbs::RtrAttr {
            ah_attr: rtr.ah_attr.unwrap(),
            path_mtu: rtr.path_mtu.unwrap(),
            dest_qp_num: rtr.dest_qp_num.unwrap(),
            rq_psn: rtr.rq_psn.unwrap(),
            max_dest_rd_atomic: rtr.max_dest_rd_atomic.unwrap(),
            min_rnr_timer: rtr.min_rnr_timer.unwrap(),
        },
        verbs::RtsAttr {
            sq_psn: rts.sq_psn.unwrap(),
            timeout: rts.timeout.unwrap(),
            retry_cnt: rts.retry_cnt.unwrap(),
            rnr_retry: rts.rnr_retry.unwrap(),
            max_rd_atomic: rts.max_rd_atomic.unwrap(),
        },
    )
}

fn wait_event(q: &QueuePair, want: impl Fn(&CmEvent) -> bool) -> CmEvent {
    loop {
        let ev = q.get_event(Some(T)).expect("a CM event in time");
        if want(&ev) {
            return ev;
        }
    }
}

/// C1.3, C1.8: listen/connect/accept with private data both ways; both QPs go INIT → RTR →
/// RTS with each other's QPN, the PSNs cross (each side sends from the PSN the other
/// expects), and both see Established.
#[test]
fn connect_accept_with_private_data_both_ways() {
    let (_w, a, b) = pair(1);
    let (client, server) = handshake(
        &a,
        &b,
        7471,
        |dev, addr| {
            let pd = dev.alloc_pd().unwrap();
            pd.connect(addr, opts(&dev).private_data(b"hello from a"), T)
        },
        |req| {
            assert_eq!(
                req.private_data().len(),
                56,
                "a REQ carries 56 octets after the rdma_cm header"
            );
            assert_eq!(&req.private_data()[..12], b"hello from a");
            assert_eq!(req.peer_addr().ip(), a.ip);
            assert_eq!(req.local_addr(), SocketAddr::new(b.ip, 7471));
            assert_eq!((req.param().responder_resources, req.param().initiator_depth), (4, 4));
            let pd = b.dev.alloc_pd().unwrap();
            req.accept(&pd, opts(&b.dev).private_data(b"hello from b")).unwrap()
        },
    );
    let qa = client.unwrap();
    let qb = server;
    assert_eq!(qa.state(), QpState::Rts);
    assert_eq!(qb.state(), QpState::Rts);
    let ia = qa.conn_info();
    assert_eq!(ia.peer_private_data.len(), 196);
    assert_eq!(&ia.peer_private_data[..12], b"hello from b");
    assert_eq!(ia.peer_addr, SocketAddr::new(b.ip, 7471));
    assert_eq!((ia.responder_resources, ia.initiator_depth), (4, 4));
    let (rtr_a, rts_a) = rtr_rts(&a.qp(&qa).log.lock().unwrap());
    let (rtr_b, rts_b) = rtr_rts(&b.qp(&qb).log.lock().unwrap());
    assert_eq!(rtr_a.dest_qp_num, qb.qp_num());
    assert_eq!(rtr_b.dest_qp_num, qa.qp_num());
    assert_eq!(rtr_a.rq_psn, rts_b.sq_psn, "b sends from the PSN a expects");
    assert_eq!(rtr_b.rq_psn, rts_a.sq_psn, "a sends from the PSN b expects");
    assert_eq!(rtr_a.ah_attr.dgid, Gid::from_ip(b.ip));
    assert_eq!(rtr_b.ah_attr.dgid, Gid::from_ip(a.ip));
    assert_eq!(rtr_a.path_mtu, verbs::Mtu::Mtu1024);
    assert_eq!((rtr_a.max_dest_rd_atomic, rts_a.max_rd_atomic), (4, 4));
    assert!(matches!(wait_event(&qa, |_| true), CmEvent::Established));
    assert!(matches!(wait_event(&qb, |_| true), CmEvent::Established));
}

/// C1.6: a consumer reject (REJ 28) carries the listener's private data to the connector,
/// typed.
#[test]
fn reject_with_private_data() {
    let (_w, a, b) = pair(2);
    let (client, ()) = handshake(
        &a,
        &b,
        7472,
        |dev, addr| {
            let pd = dev.alloc_pd().unwrap();
            pd.connect(addr, opts(&dev), T).map(|_| ())
        },
        |req| req.reject(b"not today").unwrap(),
    );
    match client {
        Err(Error::Rejected { private_data, detail }) => {
            assert_eq!(private_data.len(), 148);
            assert_eq!(&private_data[..9], b"not today");
            let r = detail.unwrap();
            let r = r.downcast_ref::<Rejection>().expect("an IB CM rejection");
            assert_eq!(r.reason, RejReason::ConsumerDefined);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(a.cm.connections(), 0);
    assert_eq!(b.cm.connections(), 0);
}

/// C1.6, issue 13 item 4: a REQ for a port nobody listens on gets REJ 8, and connect fails
/// with a typed "invalid service ID" rejection.
#[test]
fn unlistened_port_is_rejected_invalid_service_id() {
    let (_w, a, b) = pair(3);
    let pd = a.dev.alloc_pd().unwrap();
    let e = pd.connect(SocketAddr::new(b.ip, 7473), opts(&a.dev), T).unwrap_err();
    assert_eq!(rej_reason(&e), RejReason::InvalidServiceId);
    assert!(e.to_string().contains("invalid service ID"), "{e}");
    assert_eq!(e.errno(), libc_econnrefused());
}

fn libc_econnrefused() -> i32 {
    111
}

/// C1.7: the first REP is lost; a timer recovers it (the passive side's REP retry, or the
/// active side's REQ retry, which the passive side answers with the REP again) and the
/// connection comes up.
#[test]
fn lost_rep_is_retransmitted() {
    let (w, a, b) = pair(4);
    w.drop_rule(first_of(|m| matches!(m, CmMsg::Rep(_))));
    let (client, qb) = handshake(
        &a,
        &b,
        7474,
        |dev, addr| dev.alloc_pd().unwrap().connect(addr, opts(&dev), T),
        |req| req.accept(&b.dev.alloc_pd().unwrap(), opts(&b.dev)).unwrap(),
    );
    let qa = client.unwrap();
    assert_eq!(qa.state(), QpState::Rts);
    assert!(matches!(wait_event(&qb, |_| true), CmEvent::Established));
    assert_eq!(w.dropped.load(Ordering::Relaxed), 1);
    // Either timer recovers it: b's REP retry, or a's REQ retry answered with the REP again.
    let (sa, sb) = (a.cm.stats(), b.cm.stats());
    assert!(sa.retransmits + sb.retransmits >= 1, "{sa:?} {sb:?}");
}

/// C1.7: the RTU is lost; the passive side repeats its REP, the active side answers the
/// repeat with the RTU again, and the passive side reaches Established.
#[test]
fn lost_rtu_is_recovered_by_the_rep_retry() {
    let (w, a, b) = pair(5);
    w.drop_rule(first_of(|m| matches!(m, CmMsg::Rtu(_))));
    let (client, qb) = handshake(
        &a,
        &b,
        7475,
        |dev, addr| dev.alloc_pd().unwrap().connect(addr, opts(&dev), T),
        |req| req.accept(&b.dev.alloc_pd().unwrap(), opts(&b.dev)).unwrap(),
    );
    let _qa = client.unwrap();
    assert!(matches!(wait_event(&qb, |_| true), CmEvent::Established));
    assert_eq!(w.dropped.load(Ordering::Relaxed), 1);
    assert!(b.cm.stats().retransmits >= 1);
    assert!(a.cm.stats().duplicates >= 1, "the repeated REP was answered from state");
}

/// C1.7: a peer that never answers: the REQ is retried max CM retries times, then connect
/// fails with Timeout, and the CM keeps nothing.
#[test]
fn silent_peer_times_out_after_retries() {
    let (w, a, b) = pair(6);
    w.drop_rule(|_, _| true);
    let _l = b.dev.listen(SocketAddr::new(b.ip, 7476)).unwrap();
    let pd = a.dev.alloc_pd().unwrap();
    let e = pd.connect(SocketAddr::new(b.ip, 7476), opts(&a.dev), T).unwrap_err();
    assert!(matches!(e, Error::Timeout), "{e:?}");
    assert_eq!(a.cm.stats().retransmits, 5);
    assert_eq!(a.cm.connections(), 0);
}

fn connected(a: &Node, b: &Node, port: u16) -> (QueuePair, QueuePair) {
    let (client, qb) = handshake(
        a,
        b,
        port,
        |dev, addr| dev.alloc_pd().unwrap().connect(addr, opts(&dev), T),
        |req| req.accept(&b.dev.alloc_pd().unwrap(), opts(&b.dev)).unwrap(),
    );
    let qa = client.unwrap();
    wait_event(&qa, |e| matches!(e, CmEvent::Established));
    wait_event(&qb, |e| matches!(e, CmEvent::Established));
    (qa, qb)
}

fn disconnect_from(first: &Node, other: &Node, q1: &QueuePair, q2: &QueuePair) {
    q1.disconnect();
    assert_eq!(
        q1.state(),
        QpState::Err,
        "rdma_disconnect moves the QP to ERR at once (flush)"
    );
    assert!(matches!(wait_event(q2, |_| true), CmEvent::Disconnected));
    assert_eq!(q2.state(), QpState::Err, "the peer's QP goes to ERR with its DREQ");
    assert!(matches!(wait_event(q1, |_| true), CmEvent::Disconnected));
    let _ = (first, other);
}

/// C1.7, C1.8: disconnect from the active side: DREQ/DREP, both QPs in ERR, both see
/// Disconnected; the connections leave time-wait.
#[test]
fn disconnect_from_active_side() {
    let (_w, a, b) = pair(7);
    let (qa, qb) = connected(&a, &b, 7477);
    disconnect_from(&a, &b, &qa, &qb);
    let deadline = std::time::Instant::now() + T;
    while a.cm.connections() + b.cm.connections() != 0 {
        assert!(std::time::Instant::now() < deadline, "time-wait never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// C1.7, C1.8: disconnect from the passive side.
#[test]
fn disconnect_from_passive_side() {
    let (_w, a, b) = pair(8);
    let (qa, qb) = connected(&a, &b, 7478);
    disconnect_from(&b, &a, &qb, &qa);
}

/// C1.7: a lost DREP: the DREQ is retried and answered from time-wait.
#[test]
fn lost_drep_is_recovered() {
    let (w, a, b) = pair(9);
    let (qa, qb) = connected(&a, &b, 7479);
    w.drop_rule(first_of(|m| matches!(m, CmMsg::Drep(_))));
    disconnect_from(&a, &b, &qa, &qb);
    assert!(a.cm.stats().retransmits >= 1);
    assert!(b.cm.stats().duplicates >= 1);
}

/// Listening twice on a port is refused; port 0 picks one; a dropped listener's port
/// answers REJ 8 again.
#[test]
fn listener_ports() {
    let (_w, a, b) = pair(10);
    let l = b.dev.listen(SocketAddr::new(b.ip, 7480)).unwrap();
    assert!(b.dev.listen(SocketAddr::new(b.ip, 7480)).is_err());
    let any = b.dev.listen(SocketAddr::new(b.ip, 0)).unwrap();
    assert_ne!(any.local_addr().port(), 0);
    assert!(
        b.dev
            .listen(SocketAddr::new("127.1.2.3".parse().unwrap(), 7481))
            .is_err()
    );
    drop(l);
    let e = a
        .dev
        .alloc_pd()
        .unwrap()
        .connect(SocketAddr::new(b.ip, 7480), opts(&a.dev), T)
        .unwrap_err();
    assert!(e.to_string().contains("invalid service ID"), "{e}");
}

/// A request the application drops unanswered is rejected (consumer reject, no data).
#[test]
fn dropped_request_is_rejected() {
    let (_w, a, b) = pair(11);
    let (client, ()) = handshake(
        &a,
        &b,
        7482,
        |dev, addr| dev.alloc_pd().unwrap().connect(addr, opts(&dev), T).map(|_| ()),
        drop,
    );
    let e = client.unwrap_err();
    assert_eq!(rej_reason(&e), RejReason::ConsumerDefined);
}

/// Too much private data for a REQ after the rdma_cm header is refused before anything is
/// sent.
#[test]
fn oversized_private_data_is_refused() {
    let (_w, a, b) = pair(12);
    let e = a
        .dev
        .alloc_pd()
        .unwrap()
        .connect(SocketAddr::new(b.ip, 7483), opts(&a.dev).private_data(&[1; 57]), T)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument(verbs::InvalidArg::PrivateDataTooLong { len: 57, max: 56 })
        ),
        "{e:?}"
    );
    assert_eq!(a.cm.connections(), 0);
}

/// C1.7: the connector gives up before the listener answers (its own connect timeout): the
/// REQ is withdrawn with REJ "timeout" (Linux `cm_destroy_id`), and the listener's late
/// accept fails instead of leaving a half-open connection.
#[test]
fn connect_that_gives_up_withdraws_its_req() {
    let (_w, a, b) = pair(13);
    let l = b.dev.listen(SocketAddr::new(b.ip, 7484)).unwrap();
    let pd = a.dev.alloc_pd().unwrap();
    let e = pd
        .connect(SocketAddr::new(b.ip, 7484), opts(&a.dev), Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout), "{e:?}");
    let req = l.get_request(Some(T)).unwrap();
    // The REJ reaches b soon after the connect gave up.
    let deadline = std::time::Instant::now() + T;
    while b.cm.connections() != 0 {
        assert!(std::time::Instant::now() < deadline, "b still holds the withdrawn REQ");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(req.accept(&b.dev.alloc_pd().unwrap(), opts(&b.dev)).is_err());
    assert_eq!(a.cm.connections(), 0);
}

// ---- the UDP port space (SIDR) and multicast: issue 14 -----------------------------------

fn ud_qp(n: &Node) -> QueuePair {
    let cq = n.dev.create_cq(16).unwrap();
    n.dev
        .alloc_pd()
        .unwrap()
        .create_qp(verbs::QpInit::new(QpType::Ud, &cq))
        .unwrap()
}

/// The UD QP went RESET → INIT (Q_Key RDMA_UDP_QKEY) → RTR → RTS, as rdma_create_qp does.
fn assert_ud_rts(n: &Node, q: &QueuePair) {
    assert_eq!(q.state(), QpState::Rts);
    let log = n.qp(q).log.lock().unwrap().clone();
    let states: Vec<_> = log.iter().map(|a| a.qp_state).collect();
    assert_eq!(states, [Some(QpState::Init), Some(QpState::Rtr), Some(QpState::Rts)]);
    assert_eq!(log[0].qkey, Some(RDMA_UDP_QKEY));
}

/// The reason of the IB CM REJ that `e` reports.
fn rej_reason(e: &Error) -> RejReason {
    let Error::Rejected { detail: Some(d), .. } = e else {
        panic!("expected a REJ, got {e:?}")
    };
    d.downcast_ref::<Rejection>().expect("a Rejection detail").reason
}

fn sidr_status(e: &Error) -> SidrStatus {
    let Error::Rejected { detail: Some(d), .. } = e else {
        panic!("expected a SIDR refusal, got {e:?}")
    };
    d.downcast_ref::<SidrRefusal>().expect("a SidrRefusal detail").status
}

/// D3, issue 14: rdma_cm's UDP port space over SIDR: the listener sees the request with
/// the requester's address and private data (180 octets after the rdma_cm header) and
/// answers with its UD QP; the requester gets that QPN, RDMA_UDP_QKEY, an address vector to
/// the listener and its private data (136 octets). Both UD QPs are in RTS.
#[test]
fn udp_port_space_resolves_the_listeners_qp() {
    let (_w, a, b) = pair(40);
    let l = b.dev.listen_in(SocketAddr::new(b.ip, 7540), PortSpace::Udp).unwrap();
    assert_eq!(l.local_addr(), SocketAddr::new(b.ip, 7540));
    let dev = a.dev.clone();
    let (addr, a_ip) = (l.local_addr(), a.ip);
    let t = std::thread::spawn(move || {
        let cq = dev.create_cq(16).unwrap();
        let q = dev
            .alloc_pd()
            .unwrap()
            .create_qp(verbs::QpInit::new(QpType::Ud, &cq))
            .unwrap();
        let r = q.connect_ud(addr, b"hello ud", T);
        (q, r)
    });
    let req = l.get_request(Some(T)).expect("the SIDR_REQ reaches the listener");
    assert_eq!(req.port_space(), PortSpace::Udp);
    assert_eq!(req.peer_addr().ip(), a_ip);
    assert_eq!(req.local_addr(), addr);
    assert_eq!(req.private_data().len(), 180);
    assert_eq!(&req.private_data()[..8], b"hello ud");
    let qb = ud_qp(&b);
    req.accept_ud(&qb, b"welcome").unwrap();
    let (qa, r) = t.join().unwrap();
    let p = r.unwrap();
    assert_eq!(p.qp_num, qb.qp_num());
    assert_eq!(p.qkey, RDMA_UDP_QKEY);
    assert_eq!(p.ah_attr.dgid, Gid::from_ip(b.ip));
    assert_eq!(p.private_data.len(), 136);
    assert_eq!(&p.private_data[..7], b"welcome");
    assert_ud_rts(&a, &qa);
    assert_ud_rts(&b, &qb);
    assert!(!qa.is_connected(), "a UD QP is not bound to a connection");
}

/// SIDR_REP statuses: 1 for a port nobody listens on in the UDP space (a TCP listener on
/// the same port does not count), 2 when the listener rejects (with its private data) or
/// drops the request; `Rejected` with ECONNREFUSED as librdmacm's UNREACHABLE.
#[test]
fn udp_port_space_statuses() {
    let (_w, a, b) = pair(41);
    let _tcp = b.dev.listen(SocketAddr::new(b.ip, 7541)).unwrap();
    let qa = ud_qp(&a);
    let e = qa.connect_ud(SocketAddr::new(b.ip, 7541), &[], T).unwrap_err();
    assert_eq!(sidr_status(&e), SidrStatus::Unsupported);
    assert_eq!(e.errno(), libc_econnrefused());
    assert!(e.to_string().contains("service ID not supported"), "{e}");

    let l = b.dev.listen_in(SocketAddr::new(b.ip, 7542), PortSpace::Udp).unwrap();
    let addr = l.local_addr();
    let t = std::thread::spawn(move || qa.connect_ud(addr, &[], T));
    l.get_request(Some(T)).unwrap().reject(b"not you").unwrap();
    let e = t.join().unwrap().unwrap_err();
    assert_eq!(sidr_status(&e), SidrStatus::Rejected);
    let Error::Rejected { private_data, .. } = &e else {
        unreachable!()
    };
    assert_eq!(&private_data[..7], b"not you");

    let qa = ud_qp(&a);
    let t = std::thread::spawn(move || qa.connect_ud(addr, &[], T));
    drop(l.get_request(Some(T)).unwrap());
    assert_eq!(sidr_status(&t.join().unwrap().unwrap_err()), SidrStatus::Rejected);

    // An RC connect to the UDP listener's port: its REQ is for RDMA_PS_TCP, REJ 8.
    let pd = a.dev.alloc_pd().unwrap();
    let e = pd.connect(addr, opts(&a.dev), T).unwrap_err();
    assert_eq!(rej_reason(&e), RejReason::InvalidServiceId);
}

/// C1.7: the first SIDR_REQ is lost; its retry resolves. A listener that never answers
/// (every SIDR_REP lost) ends in Timeout after the retries, and nothing stays pending.
#[test]
fn udp_port_space_lost_request_and_timeout() {
    let (w, a, b) = pair(42);
    let lost = Arc::new(AtomicU32::new(0));
    let l2 = lost.clone();
    w.drop_rule(move |_, m| matches!(m.msg, CmMsg::SidrReq(_)) && l2.fetch_add(1, Ordering::Relaxed) == 0);
    let l = b.dev.listen_in(SocketAddr::new(b.ip, 7543), PortSpace::Udp).unwrap();
    let addr = l.local_addr();
    let qa = ud_qp(&a);
    let t = std::thread::spawn(move || qa.connect_ud(addr, &[], T));
    let qb = ud_qp(&b);
    l.get_request(Some(T)).unwrap().accept_ud(&qb, &[]).unwrap();
    assert_eq!(t.join().unwrap().unwrap().qp_num, qb.qp_num());
    assert_eq!(w.dropped.load(Ordering::Relaxed), 1);
    assert!(a.cm.stats().retransmits >= 1);

    w.drop_rule(|_, m| matches!(m.msg, CmMsg::SidrReq(_)));
    let retransmits = a.cm.stats().retransmits;
    let e = ud_qp(&a).connect_ud(addr, &[], T).unwrap_err();
    assert!(matches!(e, Error::Timeout), "{e:?}");
    assert_eq!(a.cm.stats().retransmits - retransmits, 5, "max CM retries");
    assert!(l.get_request(Some(Duration::from_millis(50))).is_err());
}

/// The wrong QP type or answer is refused with a typed error, nothing sent.
#[test]
fn udp_port_space_misuse() {
    let (_w, a, b) = pair(43);
    let l = b.dev.listen_in(SocketAddr::new(b.ip, 7544), PortSpace::Udp).unwrap();
    let addr = l.local_addr();
    // connect_ud on an RC QP.
    let pd = a.dev.alloc_pd().unwrap();
    let rc = pd.create_qp(opts(&a.dev).qp_init()).unwrap();
    assert!(matches!(rc.connect_ud(addr, &[], T), Err(Error::InvalidArgument(_))));
    // Private data beyond the 180 octets after the rdma_cm header.
    let e = ud_qp(&a).connect_ud(addr, &[0; 181], T).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument(verbs::InvalidArg::PrivateDataTooLong { len: 181, max: 180 })
        ),
        "{e:?}"
    );
    // An RC accept of a UDP request, and a UD answer too long, leave it answerable.
    let qa = ud_qp(&a);
    let t = std::thread::spawn(move || qa.connect_ud(addr, &[], T));
    let req = l.get_request(Some(T)).unwrap();
    let qb = ud_qp(&b);
    req.accept_ud(&qb, &[0; 137]).unwrap_err();
    // (accept_ud consumed the request: the refusal above was local, so the request was
    // rejected when it dropped; the requester sees status 2.)
    assert_eq!(sidr_status(&t.join().unwrap().unwrap_err()), SidrStatus::Rejected);
    let qa = ud_qp(&a);
    let t = std::thread::spawn(move || qa.connect_ud(addr, &[], T));
    let req = l.get_request(Some(T)).unwrap();
    assert!(req.accept(&b.dev.alloc_pd().unwrap(), opts(&b.dev)).is_err());
    assert_eq!(sidr_status(&t.join().unwrap().unwrap_err()), SidrStatus::Rejected);
}

/// Issue 14 multicast join in rdma_cm's style on RoCEv2 (no SA): the MGID is the group's
/// IPv4-mapped address (`cma_iboe_set_mgid`), QPN 0xFFFFFF, Q_Key RDMA_UDP_QKEY; the QP is
/// attached on join and detached on leave; a unicast address or an RC QP is refused.
#[test]
fn join_multicast_maps_the_group_and_attaches() {
    let (_w, a, _b) = pair(44);
    let q = ud_qp(&a);
    let group: IpAddr = "239.1.2.3".parse().unwrap();
    let p = q.join_multicast(group).unwrap();
    let mgid = Gid::from_ipv4(Ipv4Addr::new(239, 1, 2, 3));
    assert_eq!(p.ah_attr.dgid, mgid);
    assert!(mgid.is_multicast());
    assert_eq!((p.qp_num, p.qkey), (0x00ff_ffff, RDMA_UDP_QKEY));
    assert_ud_rts(&a, &q);
    q.leave_multicast(group).unwrap();
    assert_eq!(
        *a.fake.mcast.lock().unwrap(),
        [(q.qp_num(), mgid, true), (q.qp_num(), mgid, false)]
    );
    assert!(matches!(
        q.join_multicast("10.0.0.1".parse().unwrap()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        q.join_multicast("ff0e::1".parse().unwrap()),
        Err(Error::InvalidArgument(_))
    ));
    let pd = a.dev.alloc_pd().unwrap();
    let rc = pd.create_qp(opts(&a.dev).qp_init()).unwrap();
    assert!(rc.join_multicast(group).is_err());
    assert_eq!(a.fake.mcast.lock().unwrap().len(), 2);
}

/// C1.3, C1.6, C1.7 "listen by service ID", C1.8 (issue 16, IPoIB connected mode): a raw IB
/// service ID (`0x10…|UD QPN`, RFC 4755 §3.5) through the verbs: the listener's request
/// carries the service ID, the requester's GID and the 8 octets of private data as sent (no
/// rdma_cm header; padded to 92); the REP carries the acceptor's 8 octets; both QPs reach
/// RTS and see Established; the acceptor's disconnect reaches the connector as
/// Disconnected. A second connect is refused with REJ 28 and private data
/// (`reject_with_reason`), a third to the RFC-prefix form nobody listens on with REJ 8.
#[test]
fn raw_ib_service_listen_connect_reject() {
    let (_w, a, b) = pair(45);
    let sid = 0x1000_0000_0000_0000u64 | 0x12_3456;
    let l = b.dev.listen_ib_service(sid).unwrap();
    assert!(
        matches!(b.dev.listen_ib_service(sid), Err(Error::Io(_))),
        "one listener per service ID"
    );
    let pd_a = [0u8, 0x00, 0x00, 0x11, 0x00, 0x00, 0xff, 0xf4];
    let pd_b = [0u8, 0x12, 0x34, 0x56, 0x00, 0x00, 0xff, 0xf4];
    let gb = Gid::from_ip(b.ip);
    let dev = a.dev.clone();
    let t = std::thread::spawn(move || {
        let pd = dev.alloc_pd().unwrap();
        let qp = pd.create_qp(opts(&dev).qp_init()).unwrap();
        let param = verbs::ConnParam {
            private_data: pd_a.to_vec(),
            ..Default::default()
        };
        qp.connect_ib_service(gb, sid, &param, T).map(|()| qp)
    });
    let req = l.get_request(Some(T)).expect("the REQ reaches the service listener");
    assert_eq!(req.service_id(), Some(sid));
    assert_eq!(req.peer_gid(), Some(Gid::from_ip(a.ip)));
    assert_eq!(req.private_data().len(), 92, "a raw REQ delivers its 92 octets");
    assert_eq!(&req.private_data()[..8], &pd_a);
    let pd = b.dev.alloc_pd().unwrap();
    let qb = req.accept(&pd, opts(&b.dev).private_data(&pd_b)).unwrap();
    let qa = t.join().unwrap().unwrap();
    assert_eq!((qa.state(), qb.state()), (QpState::Rts, QpState::Rts));
    assert_eq!(&qa.conn_info().peer_private_data[..8], &pd_b);
    let (rtr_a, _) = rtr_rts(&a.qp(&qa).log.lock().unwrap());
    assert_eq!(rtr_a.dest_qp_num, qb.qp_num());
    assert!(matches!(wait_event(&qb, |_| true), CmEvent::Established));
    qb.disconnect();
    assert!(matches!(
        wait_event(&qa, |e| !matches!(e, CmEvent::Established)),
        CmEvent::Disconnected
    ));

    // REJ 28 with private data.
    let dev = a.dev.clone();
    let t = std::thread::spawn(move || {
        let pd = dev.alloc_pd().unwrap();
        let qp = pd.create_qp(opts(&dev).qp_init()).unwrap();
        let param = verbs::ConnParam {
            private_data: pd_a.to_vec(),
            ..Default::default()
        };
        qp.connect_ib_service(gb, sid, &param, T)
    });
    let req = l.get_request(Some(T)).unwrap();
    req.reject_with_reason(28, &pd_b).unwrap();
    match t.join().unwrap() {
        Err(Error::Rejected { private_data, detail }) => {
            assert_eq!(&private_data[..8], &pd_b);
            let d = detail.unwrap();
            assert_eq!(
                d.downcast_ref::<Rejection>().unwrap().reason,
                RejReason::ConsumerDefined
            );
        }
        other => panic!("expected REJ 28, got {other:?}"),
    }

    // The other prefix form: nobody listens, REJ 8.
    let pd = a.dev.alloc_pd().unwrap();
    let qp = pd.create_qp(opts(&a.dev).qp_init()).unwrap();
    let e = qp
        .connect_ib_service(gb, 0x0100_0000_0012_3456, &verbs::ConnParam::default(), T)
        .unwrap_err();
    assert_eq!(rej_reason(&e), RejReason::InvalidServiceId);
    // Dropping the listener stops the service.
    drop(l);
    let qp = pd.create_qp(opts(&a.dev).qp_init()).unwrap();
    let e = qp
        .connect_ib_service(gb, sid, &verbs::ConnParam::default(), T)
        .unwrap_err();
    assert!(matches!(e, Error::Rejected { .. }), "{e:?}");
}
