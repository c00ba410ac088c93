//! Fuzzes the QP protocol core the engine runs (`engine::qp::Proto` with
//! the receive buffer of `engine/qp/rx_buf.rs`), through the in-memory
//! harness `engine::qp::harness` that `engine/qp/core_tests.rs` uses:
//!
//! * mode A (byte 0 even): arbitrary octets as the TCP stream from a peer,
//!   cut into reads of a chosen size (direct placement of large tagged
//!   segments starts when one is cut), optionally with MPA markers, then
//!   optionally the peer's FIN. The core sends at most one Terminate,
//!   nothing after it, and is in ERR once it did (RDMAP-TRM-02, -06).
//! * mode B (byte 0 odd): two cores back to back, a list of valid work
//!   requests (Send, Write, Read, FetchAdd with arbitrary sizes) posted on
//!   one with an arbitrary MULPDU; after the exchange settles no Terminate
//!   was sent, every completion succeeded and the data arrived (segmentation
//!   and reassembly agree, RDMAP-LLP-04). With selector bit 7 they are posted
//!   one by one through `post_send_one`, so small ones on an idle queue take
//!   the lean path (`engine/qp/lean.rs`).
#![no_main]
use iwarp::engine::qp::harness::{self, Scripted, Side, SideConfig, check_output};
use libfuzzer_sys::fuzz_target;
use verbs::{Access, QpState, RecvWr, RemoteAddr, SendWr, WcStatus, WrOpcode};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    if sel & 1 == 0 {
        stream(sel, rest);
    } else {
        back_to_back(sel, rest);
    }
});

fn stream(sel: u8, input: &[u8]) {
    let cfg = SideConfig {
        markers_rx: sel & 2 != 0,
        ird: 2,
        ..SideConfig::default()
    };
    let mut s = Scripted::new(cfg, 4);
    s.side
        .set_chunk([usize::MAX, 1, 7, 4096 + 17][usize::from(sel >> 2 & 3)]);
    s.side.feed(input);
    if sel & 0x10 != 0 {
        s.side.feed_eof();
    }
    let out = s.side.take_output();
    if let Err(e) = check_output(&s.side, &out) {
        panic!("{e}");
    }
    while s.side.poll_cq().is_some() {}
}

fn back_to_back(sel: u8, input: &[u8]) {
    let max_ulpdu = 128 + usize::from(sel >> 1) * 512;
    let dev = harness::device();
    let pd = dev.alloc_pd().expect("a PD");
    let cfg = SideConfig {
        max_ulpdu,
        ..SideConfig::default()
    };
    let mut a = Side::new(&pd, SideConfig { qpn: 1, ..cfg });
    let mut b = Side::new(&pd, SideConfig { qpn: 2, ..cfg });
    const LEN: usize = 1 << 18;
    let a_mem = a.reg_mr(LEN, Access::LOCAL_WRITE);
    let b_mem = b.reg_mr(LEN, Access::all_remote() | Access::LOCAL_WRITE);
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    a_mem.write(0, &pattern).unwrap();
    b_mem.write(0, &pattern).unwrap();
    let remote = |off: usize| RemoteAddr {
        addr: b_mem.addr() + off as u64,
        rkey: b_mem.rkey(),
    };
    let mut wrs = Vec::new();
    let mut sends = 0;
    for (i, op) in input.chunks_exact(4).take(16).enumerate() {
        let at = usize::from(op[3]) * 512;
        let len = (usize::from(u16::from_be_bytes([op[1], op[2]])) * 3).min(LEN - 8 - at);
        let id = i as u64;
        let wr = match op[0] % 4 {
            0 => {
                sends += 1;
                SendWr::new(id, WrOpcode::Send, vec![a_mem.sge(at, len.min(4096) as u32)])
            }
            1 => SendWr::new(
                id,
                WrOpcode::RdmaWrite { remote: remote(at) },
                vec![a_mem.sge(at, len as u32)],
            ),
            2 => SendWr::new(
                id,
                WrOpcode::RdmaRead { remote: remote(at) },
                vec![a_mem.sge(at, len as u32)],
            ),
            _ => SendWr::new(
                id,
                WrOpcode::AtomicFetchAdd {
                    remote: remote(at & !7),
                    add: 1,
                },
                vec![a_mem.sge(LEN - 8, 8)],
            ),
        };
        wrs.push(wr);
    }
    let recv = b.reg_mr(4096 * 16, Access::LOCAL_WRITE);
    let rwrs: Vec<_> = (0..sends)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: vec![recv.sge(4096 * i as usize, 4096)],
        })
        .collect();
    b.post_recv(&rwrs).unwrap();
    if sel & 0x80 != 0 {
        // One at a time through `post_send_one` (the lean path when the queue is idle,
        // issue 18), the exchange settled after those whose first octet has bit 2 set.
        for (wr, op) in wrs.iter().zip(input.chunks_exact(4)) {
            a.post_send_one(wr.clone()).unwrap();
            if op[0] & 4 != 0 {
                assert!(harness::settle(&mut a, &mut b), "the cores did not settle");
            }
        }
    } else {
        a.post_send(&wrs).unwrap();
    }
    assert!(harness::settle(&mut a, &mut b), "the cores did not settle");
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));
    let mut done = 0;
    while let Some(wc) = a.poll_cq() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        done += 1;
    }
    assert_eq!(done, wrs.len());
    let mut got = 0;
    while let Some(wc) = b.poll_cq() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        got += 1;
    }
    assert_eq!(got, sends);
}
