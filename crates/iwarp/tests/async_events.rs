//! Device-wide asynchronous events (`ibv_get_async_event`), apart from the CM
//! events: an established connection raises CommEstablished for each of its
//! QPs, a Terminate (sent or received) QpFatal, whoever reads the CM events.

mod pair;

use pair::{T, pair};
use std::collections::HashSet;
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
