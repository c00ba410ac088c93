//! A connected pair of our own QPs over loopback TCP, shared by the
//! end-to-end tests.

#![allow(dead_code)]

use std::time::Duration;
use verbs::*;

pub const T: Duration = Duration::from_secs(10);

pub struct Pair {
    pub _dev: Device,
    pub pd: ProtectionDomain,
    pub cq_a: CompletionQueue,
    pub cq_b: CompletionQueue,
    pub a: QueuePair,
    pub b: QueuePair,
}

pub fn pair_with(cfg: iwarp::IwarpConfig, pd_b_separate: bool) -> Pair {
    let dev = iwarp::open_device(cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let pd_b = if pd_b_separate {
        dev.alloc_pd().unwrap()
    } else {
        pd.clone()
    };
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let cq_a = dev.create_cq(4096).unwrap();
    let cq_b = dev.create_cq(4096).unwrap();
    let (cqb2, pdb2) = (cq_b.clone(), pd_b.clone());
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(T)).unwrap();
        assert_eq!(req.private_data(), b"hello");
        req.accept(&pdb2, QpOptions::new(&cqb2).rd_atomic(16, 16).private_data(b"welcome"))
            .unwrap()
    });
    let a = pd
        .connect(addr, QpOptions::new(&cq_a).rd_atomic(16, 16).private_data(b"hello"), T)
        .unwrap();
    let b = server.join().unwrap();
    assert_eq!(a.conn_info().peer_private_data, b"welcome");
    assert_eq!(a.get_event(Some(T)), Some(CmEvent::Established));
    assert_eq!(b.get_event(Some(T)), Some(CmEvent::Established));
    Pair {
        _dev: dev,
        pd,
        cq_a,
        cq_b,
        a,
        b,
    }
}

pub fn pair() -> Pair {
    pair_with(iwarp::IwarpConfig::default(), false)
}
