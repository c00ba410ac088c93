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

/// Posts a 64-octet receive at the start of `mr` with `id`.
pub fn recv_again(qp: &QueuePair, mr: &MemoryRegion, id: u64) {
    qp.post_recv(&[RecvWr {
        wr_id: id,
        sg_list: vec![mr.sge(0, 64)],
    }])
    .unwrap()
}

/// Sleeps on `cq` inline, as `softrdma bench --lat --events` does (no busy polling; the
/// QP is muted while it waits), and checks the completion succeeded.
pub fn wait_inline(cq: &CompletionQueue) -> WorkCompletion {
    let wc = cq.wait_spin(Duration::ZERO, Some(T)).expect("a completion within T");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    wc
}

/// Sleeps on completion events until `cq` has a completion and takes it; `poll` on a
/// non-empty CQ does not drive progress, so this thread never reads a socket.
pub fn next_event(cq: &CompletionQueue) -> WorkCompletion {
    loop {
        cq.req_notify(false);
        if !cq.is_empty() {
            let mut v = Vec::new();
            assert_eq!(cq.poll(&mut v, 1), 1);
            return v.pop().unwrap();
        }
        assert!(cq.get_event(Some(T)), "no completion event within {T:?}");
    }
}

/// The tests of one test binary one at a time, where they read process-wide counters.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
