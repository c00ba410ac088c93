//! Fuzzes the RoCEv2 RC transport core (`roce::rc::RcQp`) through its in-memory harness
//! (`roce::rc::harness`), the functions the engine will call for every UDP datagram:
//!
//! * mode A (byte 0 even): a core in RTS with a receive posted and a few of its own requests
//!   outstanding gets a stream of arbitrary packets. Each packet is cut from the input by a
//!   length octet, then (to get past the first checks more often than by chance) its
//!   destination QP and P_Key are set to the core's, its PSN moved near the core's expected
//!   PSN (requests) or oldest unacknowledged PSN (responses), and an R_Key/VA in a RETH or
//!   AtomicETH pointed at a real region. Whatever parses goes to `handle_packet`; time moves
//!   and `handle_timeout` runs between packets. The core never panics, everything it sends
//!   parses, and once in ERR it sends no request.
//! * mode B (byte 0 odd): two cores back to back over a link whose losses, duplicates and
//!   reordering come from the input, running a list of valid work requests from the input;
//!   every WR completes successfully and in order, or the exchange is still going when the
//!   step budget runs out (no panic, no error status without an injected fault).
#![no_main]
use libfuzzer_sys::fuzz_target;
use roce::rc::harness::{self, Faults, PairConfig, QPN_A, Sim};
use roce::wire::{HeaderSet, Opcode, Packet};
use std::time::Duration;
use verbs::{Access, Mtu, QpState, RecvWr, RemoteAddr, SendWr, WcStatus, WrOpcode};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    if sel & 1 == 0 {
        packets(sel, rest);
    } else {
        back_to_back(sel, rest);
    }
});

fn packets(sel: u8, mut input: &[u8]) {
    let dev = harness::device();
    let pd = dev.alloc_pd().unwrap();
    let c = PairConfig {
        mtu: [Mtu::Mtu256, Mtu::Mtu1024][usize::from(sel >> 1 & 1)],
        max_rd_atomic: 2,
        ..PairConfig::default()
    };
    let mut s = harness::single(&pd, &c);
    let mr = s.reg_mr(8192, Access::all_remote() | Access::LOCAL_WRITE);
    s.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![mr.sge(0, 2048)],
    })
    .unwrap();
    let remote = RemoteAddr {
        addr: mr.addr() + 4096,
        rkey: mr.rkey(),
    };
    if sel & 4 != 0 {
        s.qp.post_send(&SendWr::new(10, WrOpcode::RdmaRead { remote }, vec![mr.sge(2048, 700)]))
            .unwrap();
        s.qp.post_send(&SendWr::new(11, WrOpcode::Send, vec![mr.sge(0, 300)]))
            .unwrap();
        s.qp.post_send(&SendWr::new(
            12,
            WrOpcode::AtomicFetchAdd { remote, add: 3 },
            vec![mr.sge(4000, 8)],
        ))
        .unwrap();
    }
    let mut now = std::time::Instant::now();
    let mut buf = vec![0u8; s.qp.max_packet_len()];
    drain(&mut s, now, &mut buf);
    while let Some((&len, rest)) = input.split_first() {
        let n = usize::from(len).min(rest.len());
        let mut pkt = rest[..n].to_vec();
        input = &rest[n..];
        patch(&mut pkt, &s.qp, &mr);
        if let Ok(p) = Packet::parse(&pkt) {
            s.qp.handle_packet(now, &p);
        }
        drain(&mut s, now, &mut buf);
        if len & 0x80 != 0 {
            now += Duration::from_micros(u64::from(len) * 97);
            if s.qp.poll_timeout().is_some_and(|t| t <= now) {
                s.qp.handle_timeout(now);
            }
            drain(&mut s, now, &mut buf);
        }
    }
}

/// Destination QP, P_Key, PSN and keys made plausible (see the module doc).
fn patch(p: &mut [u8], qp: &roce::rc::RcQp, mr: &verbs::MemoryRegion) {
    if p.len() < 12 {
        return;
    }
    p[1] &= 0xf0; // TVer 0
    p[2] = 0xff;
    p[3] = 0xff;
    p[5..8].copy_from_slice(&QPN_A.to_be_bytes()[1..]);
    let Some(info) = Opcode(p[0]).info() else { return };
    let base = if info.request {
        qp.expected_psn()
    } else {
        qp.oldest_unacked_psn()
    };
    let psn = base.add(u32::from(p[11] & 0x3f)).sub(16);
    p[9..12].copy_from_slice(&psn.value().to_be_bytes()[1..]);
    if (info.headers.contains(HeaderSet::RETH) || info.headers.contains(HeaderSet::ATOMIC_ETH)) && p.len() >= 24 {
        let off = u64::from(u16::from_be_bytes([p[12], p[13]]) & 0x1fff) & !7;
        p[12..20].copy_from_slice(&(mr.addr() + off).to_be_bytes());
        if p[20] & 1 == 0 {
            p[20..24].copy_from_slice(&mr.rkey().to_be_bytes());
        }
    }
}

fn drain(s: &mut harness::Side, now: std::time::Instant, buf: &mut [u8]) {
    for _ in 0..10_000 {
        let Some(n) = s.qp.poll_transmit(now, buf) else { break };
        let p = Packet::parse(&buf[..n]).expect("the core emits well-formed packets");
        if s.qp.state() == QpState::Err {
            assert!(!p.info().unwrap().request, "a request sent in ERR: {p:?}");
        }
    }
    s.poll();
}

fn back_to_back(sel: u8, input: &[u8]) {
    let f = |b: u8| Faults {
        drop: f64::from(b & 0x07) / 64.0,
        duplicate: f64::from(b >> 4) / 64.0,
        reorder: f64::from(b & 0x0f) / 32.0,
        reorder_by: Duration::from_micros(30),
        ..Faults::default()
    };
    let Some((&fa, rest)) = input.split_first() else { return };
    let Some((&fb, ops)) = rest.split_first() else { return };
    let c = PairConfig {
        mtu: [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu4096][usize::from(sel >> 1 & 3)],
        window: u32::from(sel >> 3) + 2,
        ..PairConfig::default()
    };
    let mut sim = Sim::new(c, u64::from(sel) << 16 | u64::from(fa) << 8 | u64::from(fb));
    sim.set_faults(f(fa), f(fb));
    let la = sim.a.reg_mr(65536, Access::all_remote() | Access::LOCAL_WRITE);
    let lb = sim.b.reg_mr(65536, Access::all_remote() | Access::LOCAL_WRITE);
    let mut n = 0;
    for (i, ch) in ops.chunks_exact(3).take(32).enumerate() {
        let len = u32::from(u16::from_be_bytes([ch[1], ch[2]])) % 16384;
        let remote = RemoteAddr {
            addr: lb.addr() + 32768,
            rkey: lb.rkey(),
        };
        let op = match ch[0] % 4 {
            0 => {
                sim.b
                    .qp
                    .post_recv(&RecvWr {
                        wr_id: i as u64,
                        sg_list: vec![lb.sge(0, 16384)],
                    })
                    .unwrap();
                WrOpcode::Send
            }
            1 => WrOpcode::RdmaWrite { remote },
            2 => WrOpcode::RdmaRead { remote },
            _ => WrOpcode::AtomicFetchAdd {
                remote,
                add: u64::from(len),
            },
        };
        let sge = if matches!(op, WrOpcode::AtomicFetchAdd { .. }) {
            la.sge(40000, 8)
        } else {
            la.sge(0, len)
        };
        sim.a.qp.post_send(&SendWr::new(i as u64, op, vec![sge])).unwrap();
        n += 1;
    }
    sim.run_until(200_000, |s| s.a.wcs.len() == n);
    // With losses, retry_cnt timeouts in a row can happen (rarely): RETRY_EXC_ERR and the
    // flushes after it are then the right answer; anything else is a bug.
    let lossy = fa & 7 != 0 || fb & 7 != 0;
    let mut failed = false;
    for (i, wc) in sim.a.wcs.iter().enumerate() {
        assert_eq!(wc.wr_id, i as u64);
        match wc.status {
            WcStatus::Success => assert!(!failed, "{wc:?} after an error"),
            WcStatus::RetryExcErr if lossy && !failed => failed = true,
            WcStatus::WrFlushErr if failed => {}
            _ => panic!("{wc:?}"),
        }
    }
}
