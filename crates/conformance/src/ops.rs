//! Verbs operations end to end on one connected pair (moved from the iWARP
//! provider's e2e tests): Send/Receive, zero-length Send, Write, Read after
//! Write, both atomics, Write with immediate, multi-MiB transfers under each
//! device variant, and a busy poller that goes away.
//!
//! Requirement IDs: RDMAP-SND-01/03, RDMAP-WR-02, RDMAP-RD-01, RDMAP-ORD-12
//! (catalogue rdmap-rpcrdma.md), RFC 7306 atomics and immediate data; on the
//! InfiniBand transport the same semantics are IBA vol. 1 §9.4 (SEND, RDMA
//! WRITE, RDMA READ, ATOMIC) and C3 of smcr-ipoibcm.md.

use crate::{Caps, Fixture, pair, pair_with, remote};
use verbs::*;

/// Send → Receive, zero-length Send, Write, and a Read of what the Write left.
pub fn send_recv_write_read(fx: &dyn Fixture) {
    let p = pair(fx);
    let ma = p.ea.pd.reg_mr(1 << 16, Access::all_remote()).unwrap();
    let mb = p.eb.pd.reg_mr(1 << 16, Access::all_remote()).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: vec![mb.sge(0, 1024)],
    }])
    .unwrap();
    ma.write(0, b"ping").unwrap();
    p.a.post_send_one(SendWr::new(1, WrOpcode::Send, vec![ma.sge(0, 4)]))
        .unwrap();
    let wc = p.wait_a();
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::Send));
    let wc = p.wait_b();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 4)
    );
    assert_eq!(mb.to_vec(0, 4).unwrap(), b"ping");
    // Zero-length Send consumes a receive (RDMAP-SND-01).
    p.b.post_recv(&[RecvWr {
        wr_id: 8,
        sg_list: vec![mb.sge(0, 16)],
    }])
    .unwrap();
    p.a.post_send_one(SendWr::new(2, WrOpcode::Send, vec![])).unwrap();
    assert_eq!(p.wait_a().status, WcStatus::Success);
    let wc = p.wait_b();
    assert_eq!((wc.wr_id, wc.byte_len), (8, 0));
    // Write: placed, no receive consumed (RDMAP-WR-02).
    ma.write(100, b"written!").unwrap();
    let r = remote(&mb, 200);
    p.a.post_send_one(SendWr::new(3, WrOpcode::RdmaWrite { remote: r }, vec![ma.sge(100, 8)]))
        .unwrap();
    assert_eq!(p.wait_a().status, WcStatus::Success);
    // Read it back (ordered after the Write, RDMAP-ORD-12).
    p.a.post_send_one(SendWr::new(4, WrOpcode::RdmaRead { remote: r }, vec![ma.sge(1000, 8)]))
        .unwrap();
    let wc = p.wait_a();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (4, WcStatus::Success, WcOpcode::RdmaRead, 8)
    );
    assert_eq!(ma.to_vec(1000, 8).unwrap(), b"written!");
    assert!(p.cq_b().poll_one().is_none());
}

/// Fetch-and-add, compare-and-swap, and Write with immediate (RFC 7306; IBA vol. 1
/// §9.4, §9.4.5 unconfirmed).
pub fn atomics_and_immediate(fx: &dyn Fixture) {
    let p = pair(fx);
    let ma = p.ea.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = p.eb.pd.reg_mr(4096, Access::all_remote()).unwrap();
    mb.write(64, &10u64.to_ne_bytes()).unwrap();
    let r = remote(&mb, 64);
    p.a.post_send_one(SendWr::new(
        1,
        WrOpcode::AtomicFetchAdd { remote: r, add: 5 },
        vec![ma.sge(0, 8)],
    ))
    .unwrap();
    let wc = p.wait_a();
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::FetchAdd));
    assert_eq!(ma.to_vec(0, 8).unwrap(), 10u64.to_ne_bytes());
    assert_eq!(mb.to_vec(64, 8).unwrap(), 15u64.to_ne_bytes());
    p.a.post_send_one(SendWr::new(
        2,
        WrOpcode::AtomicCmpSwap {
            remote: r,
            compare: 15,
            swap: 99,
        },
        vec![ma.sge(8, 8)],
    ))
    .unwrap();
    assert_eq!(p.wait_a().status, WcStatus::Success);
    assert_eq!(ma.to_vec(8, 8).unwrap(), 15u64.to_ne_bytes());
    assert_eq!(mb.to_vec(64, 8).unwrap(), 99u64.to_ne_bytes());
    // Write with immediate: the peer sees RecvRdmaWithImm.
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: vec![],
    }])
    .unwrap();
    ma.write(100, b"abc").unwrap();
    p.a.post_send_one(SendWr::new(
        3,
        WrOpcode::RdmaWriteWithImm {
            remote: remote(&mb, 300),
            imm_data: 0xfeed,
        },
        vec![ma.sge(100, 3)],
    ))
    .unwrap();
    assert_eq!(p.wait_a().status, WcStatus::Success);
    let wc = p.wait_b();
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm_data),
        (9, WcOpcode::RecvRdmaWithImm, Some(0xfeed))
    );
    assert_eq!(mb.to_vec(300, 3).unwrap(), b"abc");
}

/// A 4 MiB Write and a 4 MiB Read of it back, under every device variant.
pub fn large_write_and_read(fx: &dyn Fixture) {
    for opts in fx.variants() {
        let p = pair_with(fx, &opts, &Caps::default());
        let len = 4 << 20;
        let ma = p.ea.pd.reg_mr(len, Access::all_remote()).unwrap();
        let mb = p.eb.pd.reg_mr(len, Access::all_remote()).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        ma.write(0, &data).unwrap();
        let r = remote(&mb, 0);
        p.a.post_send_one(SendWr::new(
            1,
            WrOpcode::RdmaWrite { remote: r },
            vec![ma.sge(0, len as u32)],
        ))
        .unwrap();
        assert_eq!(p.wait_a().status, WcStatus::Success);
        ma.fill(0, len, 0).unwrap();
        p.a.post_send_one(SendWr::new(
            2,
            WrOpcode::RdmaRead { remote: r },
            vec![ma.sge(0, len as u32)],
        ))
        .unwrap();
        let wc = p.wait_a();
        assert_eq!((wc.status, wc.byte_len as usize), (WcStatus::Success, len), "{opts:?}");
        assert!(ma.to_vec(0, len).unwrap() == data, "{opts:?}");
        assert!(mb.to_vec(0, len).unwrap() == data, "{opts:?}");
    }
}

/// The application busy-polls the responder's CQ long enough for its QP to
/// mute the progress thread (NAPI-style), then stops polling without a
/// blocking wait: a Read from the requester must still be answered.
pub fn busy_poller_that_goes_away_leaves_no_stall(fx: &dyn Fixture) {
    use std::time::{Duration, Instant};
    let p = pair(fx);
    let mb = p.eb.pd.reg_mr(4096, Access::all_remote()).unwrap();
    mb.write(0, b"answered").unwrap();
    let ma = p.ea.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(5) {
        assert!(p.cq_b().poll_one().is_none());
    }
    std::thread::sleep(Duration::from_millis(2));
    p.a.post_send_one(SendWr::new(
        1,
        WrOpcode::RdmaRead { remote: remote(&mb, 0) },
        vec![ma.sge(0, 8)],
    ))
    .unwrap();
    // Sleep-wait only: nobody polls the responder.
    let wc = p
        .cq_a()
        .wait_spin(Duration::ZERO, Some(crate::T))
        .expect("the Read completes");
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(ma.to_vec(0, 8).unwrap(), b"answered");
}
