//! SQD ("send queue drain") on the RoCEv2 provider, at the verbs level: two devices of ours on
//! loopback, RC QPs moved by hand with `modify_qp` as SMC-R does.
//!
//! RTS -> SQD stops the send queue at a message boundary: the messages already begun finish
//! (an RNR-NAKed Send keeps being retried until the peer posts a receive), WRs posted after
//! the move wait, `IBV_EVENT_SQ_DRAINED` comes once the begun ones are done (only when
//! `en_sqd_async_notify` asked for it), SQD -> SQD may then change path and transport
//! attributes (not before: mid-message), `query_qp` reports the address vector the QP was
//! moved with, the receive side keeps working, and SQD -> RTS sends what waited.
//! IBA vol. 1 §10.3 (QP states, SQ Drain; §10.3.1 unconfirmed), ch. 11 (the SQ Drained affiliated event);
//! requirements C3 and D1 of `../shared/requirements/smcr-ipoibcm.md` (explicit QP state
//! transitions outside a CM).

use std::time::Duration;

use verbs::*;

const T: Duration = Duration::from_secs(20);
/// How long "nothing happens" is watched for.
const QUIET: Duration = Duration::from_millis(300);

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(addr: &str) -> Side {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("name", format!("rxe_{addr}"));
    let dev = roce::RoceFactory.open(&opts).expect("open a RoCEv2 device");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
    let mr = pd.reg_mr(1 << 16, Access::all_remote()).unwrap();
    Side { dev, pd, cq, qp, mr }
}

/// Two sides in RTS, connected; A's RNR retries are infinite (7).
fn pair(n: u8) -> (Side, Side) {
    let (a, b) = (side(&format!("127.142.{n}.1")), side(&format!("127.142.{n}.2")));
    for (s, peer) in [(&a, &b), (&b, &a)] {
        s.qp.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
        s.qp.modify_qp(&QpAttr::rtr(RtrAttr {
            ah_attr: AhAttr::to_gid(peer.dev.query_gid(1, 0).unwrap()),
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: peer.qp.qp_num(),
            rq_psn: 0x100 + peer.qp.qp_num() % 1000,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
        }))
        .unwrap();
        s.qp.modify_qp(&QpAttr::rts(RtsAttr {
            sq_psn: 0x100 + s.qp.qp_num() % 1000,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
        }))
        .unwrap();
    }
    (a, b)
}

fn to_sqd(s: &Side, notify: bool) {
    let mut attr = QpAttr::state(QpState::Sqd);
    attr.en_sqd_async_notify = Some(notify);
    s.qp.modify_qp(&attr).unwrap();
    assert_eq!(s.qp.state(), QpState::Sqd);
}

fn write_wr(id: u64, from: &Side, to: &Side, off: usize, len: u32) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaWrite {
            remote: RemoteAddr {
                addr: to.mr.addr() + off as u64,
                rkey: to.mr.rkey(),
            },
        },
        vec![from.mr.sge(off, len)],
    )
}

/// C3, D1, IBA vol. 1 §10.3: an RNR-NAKed Send begun before RTS -> SQD keeps the queue from
/// draining; a Write posted in SQD waits; the peer's receive lets the Send complete and
/// `SqDrained` follows (once); SQD -> SQD changes attributes only then; SQD -> RTS sends the
/// Write.
#[test]
fn rts_sqd_drains_begun_messages_raises_sq_drained_and_resumes_c3_d1() {
    let (a, b) = pair(1);
    a.mr.write(0, b"send").unwrap();
    a.qp.post_send_one(SendWr::new(1, WrOpcode::Send, vec![a.mr.sge(0, 4)]))
        .unwrap();
    // B has no receive: the Send is RNR-NAKed and retried for ever (rnr_retry 7).
    std::thread::sleep(Duration::from_millis(50));
    assert!(a.cq.poll_one().is_none());
    to_sqd(&a, true);

    // The Send has begun and is not done: not drained, no event, and no SQD -> SQD changes.
    assert!(a.dev.get_async_event(Some(QUIET)).is_none(), "drained too early");
    let mut change = QpAttr::state(QpState::Sqd);
    change.timeout = Some(16);
    assert!(
        matches!(a.qp.modify_qp(&change), Err(Error::InvalidState(QpState::Sqd))),
        "SQD -> SQD before the drain"
    );

    // A Write posted in SQD does not start.
    a.mr.write(4096, b"written in SQD, sent in RTS").unwrap();
    a.qp.post_send_one(write_wr(2, &a, &b, 4096, 27)).unwrap();

    // The receive: the Send completes, then the queue is drained and the event comes.
    b.qp.post_recv(&[RecvWr {
        wr_id: 10,
        sg_list: vec![b.mr.sge(0, 64)],
    }])
    .unwrap();
    let wc = a.cq.wait(Some(T)).expect("the begun Send completes in SQD");
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::Send));
    let wc = b.cq.wait(Some(T)).expect("B received the Send");
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (10, WcStatus::Success, 4));
    assert_eq!(
        a.dev.get_async_event(Some(T)),
        Some(AsyncEvent::SqDrained { qp_num: a.qp.qp_num() })
    );
    assert!(a.dev.get_async_event(Some(QUIET)).is_none(), "SqDrained once");
    // The Write waited.
    assert!(a.cq.poll_one().is_none(), "a WR posted in SQD completed");
    assert_eq!(
        b.mr.to_vec(4096, 27).unwrap(),
        vec![0; 27],
        "a WR posted in SQD was sent"
    );

    // query_qp: the state and the address vector of the RTR move.
    let q = a.qp.query_qp();
    assert_eq!(q.qp_state, Some(QpState::Sqd));
    let ah = q.ah_attr.expect("query_qp has the ah_attr");
    assert_eq!(ah.dgid, b.dev.query_gid(1, 0).unwrap());
    assert_eq!(ah.port_num, 1);

    // Drained: SQD -> SQD takes the attributes its rule allows ...
    let mut change = QpAttr::state(QpState::Sqd);
    change.timeout = Some(16);
    change.retry_cnt = Some(5);
    change.rnr_retry = Some(6);
    change.min_rnr_timer = Some(3);
    change.ah_attr = Some(AhAttr::to_gid(b.dev.query_gid(1, 0).unwrap()));
    a.qp.modify_qp(&change).unwrap();
    let q = a.qp.query_qp();
    assert_eq!(
        (q.timeout, q.retry_cnt, q.rnr_retry, q.min_rnr_timer),
        (Some(16), Some(5), Some(6), Some(3))
    );
    // ... and refuses one it does not (the send PSN is set on RTR -> RTS only).
    let mut bad = QpAttr::state(QpState::Sqd);
    bad.sq_psn = Some(7);
    assert!(a.qp.modify_qp(&bad).is_err(), "sq_psn in SQD -> SQD");
    assert_eq!(a.qp.state(), QpState::Sqd);

    // SQD -> RTS: the Write goes.
    a.qp.modify_qp(&QpAttr::state(QpState::Rts)).unwrap();
    let wc = a.cq.wait(Some(T)).expect("the Write completes after SQD -> RTS");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(b.mr.to_vec(4096, 27).unwrap(), b"written in SQD, sent in RTS");
}

/// C3, IBA vol. 1 §10.3: without `en_sqd_async_notify` an (immediately) drained queue raises no
/// event; the receive side of a QP in SQD keeps working (the peer's Send and Write land).
#[test]
fn sqd_without_notify_raises_nothing_and_keeps_receiving_c3() {
    let (a, b) = pair(2);
    to_sqd(&a, false);
    assert!(a.qp.query_qp().qp_state == Some(QpState::Sqd));
    a.qp.post_recv(&[RecvWr {
        wr_id: 20,
        sg_list: vec![a.mr.sge(0, 64)],
    }])
    .unwrap();
    b.mr.write(0, b"to a QP in SQD").unwrap();
    b.qp.post_send_one(SendWr::new(3, WrOpcode::Send, vec![b.mr.sge(0, 14)]))
        .unwrap();
    b.qp.post_send_one(write_wr(4, &b, &a, 0, 14)).unwrap();
    for id in [3, 4] {
        let wc = b.cq.wait(Some(T)).expect("B's WRs complete");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    let wc = a.cq.wait(Some(T)).expect("A receives in SQD");
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (20, WcStatus::Success, 14));
    assert_eq!(a.mr.to_vec(0, 14).unwrap(), b"to a QP in SQD");
    assert!(
        a.dev.get_async_event(Some(QUIET)).is_none(),
        "no SqDrained without notify"
    );
    // Drained at once: SQD -> SQD is allowed right away.
    let mut change = QpAttr::state(QpState::Sqd);
    change.retry_cnt = Some(3);
    a.qp.modify_qp(&change).unwrap();
    assert_eq!(a.qp.query_qp().retry_cnt, Some(3));
    let _ = &a.pd;
}

/// C3, IBA vol. 1 §10.3: RTS -> SQD with notify on an idle QP is drained at once: the event comes
/// without any traffic.
#[test]
fn idle_qp_to_sqd_with_notify_is_drained_at_once_c3() {
    let (a, _b) = pair(3);
    to_sqd(&a, true);
    assert_eq!(
        a.dev.get_async_event(Some(T)),
        Some(AsyncEvent::SqDrained { qp_num: a.qp.qp_num() })
    );
}
