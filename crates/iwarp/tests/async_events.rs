//! Device-wide asynchronous events (`ibv_get_async_event`), apart from the CM
//! events: an established connection raises CommEstablished for each of its
//! QPs, a Terminate (sent or received) or an LLP error (TCP reset) QpFatal,
//! whoever reads the CM events. The QPs are made by `create_qp` (RESET ->
//! INIT) and connected by the CM (`connect` / `accept_qp`), as rdma_cm users
//! and `rdma_create_qp` do.
//!
//! What iWARP cannot raise: `QpLastWqeReached` (it belongs to a QP on an SRQ,
//! and the iWARP provider has no SRQ), `SqDrained` (SQD is refused: the CM
//! drives iWARP's states), `PortActive`/`PortError` (the port is the host's
//! IP stack, always ACTIVE; no link events are watched).

mod pair;
mod rawpeer;

use pair::{T, pair};
use rawpeer::{Ask, RawPeer};
use std::collections::HashSet;
use std::time::Duration;
use verbs::provider::DeviceProviderExt;
use verbs::*;

fn drain(dev: &Device, n: usize) -> HashSet<AsyncEvent> {
    (0..n)
        .map(|i| {
            dev.get_async_event(Some(T))
                .unwrap_or_else(|| panic!("event {i} of {n}"))
        })
        .collect()
}

#[test]
fn established_then_fatal_on_terminate() {
    let p = pair();
    let dev = p.pd.device();
    let (a, b) = (p.a.qp_num(), p.b.qp_num());
    assert_eq!(
        drain(dev, 2),
        HashSet::from([
            AsyncEvent::CommEstablished { qp_num: a },
            AsyncEvent::CommEstablished { qp_num: b },
        ])
    );
    let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let bogus = RemoteAddr {
        addr: 0x1000,
        rkey: 0xdead_be00,
    };
    p.a.post_send_one(SendWr::new(1, WrOpcode::RdmaRead { remote: bogus }, vec![ma.sge(0, 8)]))
        .unwrap();
    assert_eq!(p.cq_a.wait(Some(T)).unwrap().status, WcStatus::RemAccessErr);
    // b sent the Terminate, a received it: both QPs are in ERR, each raises QpFatal once.
    assert_eq!(
        drain(dev, 2),
        HashSet::from([AsyncEvent::QpFatal { qp_num: a }, AsyncEvent::QpFatal { qp_num: b }])
    );
    assert_eq!(dev.get_async_event(Some(std::time::Duration::from_millis(200))), None);
}

#[test]
fn unread_events_are_bounded() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    for port_num in 0..(verbs::async_event::MAX_PENDING_ASYNC_EVENTS + 10) {
        dev.raise_async_event(AsyncEvent::PortActive {
            port_num: port_num as u8,
        });
    }
    // The ten oldest are gone; the newest is still there.
    let mut n = 0;
    let mut last = None;
    while let Some(e) = dev.get_async_event(Some(std::time::Duration::ZERO)) {
        n += 1;
        last = Some(e);
    }
    assert_eq!(n, verbs::async_event::MAX_PENDING_ASYNC_EVENTS);
    let newest = (verbs::async_event::MAX_PENDING_ASYNC_EVENTS + 9) as u8;
    assert_eq!(last, Some(AsyncEvent::PortActive { port_num: newest }));
}

/// Two QPs made by `create_qp`, moved to INIT, connected by the CM.
fn created_pair(dev: &Device) -> (ProtectionDomain, CompletionQueue, QueuePair, QueuePair) {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let qp_b = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
    qp_b.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(T)).unwrap();
        let p = ConnParam {
            responder_resources: 4,
            initiator_depth: 4,
            ..ConnParam::default()
        };
        req.accept_qp(&qp_b, &p).unwrap();
        qp_b
    });
    let qp_a = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
    assert_eq!(qp_a.state(), QpState::Reset);
    let p = ConnParam {
        responder_resources: 4,
        initiator_depth: 4,
        ..ConnParam::default()
    };
    qp_a.connect(addr, &p, T).unwrap();
    let qp_b = server.join().unwrap();
    (pd, cq, qp_a, qp_b)
}

/// The async events of QPs made by `create_qp`: CommEstablished for both
/// once the CM connects them, QpFatal for both on a Terminate, and the CM
/// events still reach each QP's own queue (the async queue is a copy, not
/// a consumer).
#[test]
fn create_qp_qps_raise_established_and_fatal_apart_from_cm_events() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let (pd, cq, a, b) = created_pair(&dev);
    assert_eq!(
        drain(&dev, 2),
        HashSet::from([
            AsyncEvent::CommEstablished { qp_num: a.qp_num() },
            AsyncEvent::CommEstablished { qp_num: b.qp_num() },
        ])
    );
    assert_eq!(a.get_event(Some(T)), Some(CmEvent::Established));
    assert_eq!(b.get_event(Some(T)), Some(CmEvent::Established));
    let m = pd.reg_mr(4096, Access::all_remote()).unwrap();
    let bogus = RemoteAddr {
        addr: 0x1000,
        rkey: 0xdead_be00,
    };
    a.post_send_one(SendWr::new(1, WrOpcode::RdmaRead { remote: bogus }, vec![m.sge(0, 8)]))
        .unwrap();
    assert_eq!(cq.wait(Some(T)).unwrap().status, WcStatus::RemAccessErr);
    assert_eq!(
        drain(&dev, 2),
        HashSet::from([
            AsyncEvent::QpFatal { qp_num: a.qp_num() },
            AsyncEvent::QpFatal { qp_num: b.qp_num() }
        ])
    );
    assert!(matches!(a.get_event(Some(T)), Some(CmEvent::ErrorReceived(_))));
    assert!(matches!(b.get_event(Some(T)), Some(CmEvent::ErrorSent(_))));
    assert_eq!(dev.get_async_event(Some(Duration::from_millis(200))), None);
}

/// An LLP error under a live connection (the peer resets the TCP connection)
/// is an affiliated asynchronous error: the QP goes to ERR, its CM queue gets
/// `ConnectionError`, the device `QpFatal` once. A graceful close (FIN)
/// is not: `Disconnected`, no QpFatal.
#[test]
fn tcp_reset_is_qp_fatal_and_fin_is_not() {
    for reset in [true, false] {
        let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
        qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE)).unwrap();
        let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
        qp.post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: vec![mr.sge(0, 64)],
        }])
        .unwrap();
        let ask = Ask::default();
        let raw = RawPeer::start(listener.local_addr(), &ask);
        let req = listener.get_request(Some(T)).unwrap();
        req.accept_qp(&qp, &ConnParam::default()).unwrap();
        let raw = raw.finish(&ask);
        assert_eq!(qp.get_event(Some(T)), Some(CmEvent::Established));
        assert_eq!(
            dev.get_async_event(Some(T)),
            Some(AsyncEvent::CommEstablished { qp_num: qp.qp_num() })
        );
        if reset {
            // SO_LINGER 0: close sends an RST.
            socket2::SockRef::from(&raw.sock)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        }
        drop(raw);
        let ev = qp.get_event(Some(T));
        let wc = cq.wait(Some(T)).unwrap();
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WrFlushErr));
        assert_eq!(qp.state(), QpState::Err);
        let fatal = dev.get_async_event(Some(Duration::from_millis(300)));
        if reset {
            assert!(matches!(ev, Some(CmEvent::ConnectionError(_))), "{ev:?}");
            assert_eq!(fatal, Some(AsyncEvent::QpFatal { qp_num: qp.qp_num() }));
        } else {
            assert_eq!(ev, Some(CmEvent::Disconnected));
            assert_eq!(fatal, None);
        }
        assert_eq!(dev.get_async_event(Some(Duration::from_millis(100))), None);
    }
}
