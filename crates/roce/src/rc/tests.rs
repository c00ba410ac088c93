//! The RC core against itself (two cores through the in-memory lossy link of
//! [`super::harness`]) and against a scripted peer (packets built by hand).
//!
//! Each test names its requirement (C3 in `../shared/requirements/smcr-ipoibcm.md`) and the
//! IBTA vol. 1 sections it exercises.

use std::time::Duration;

use proptest::prelude::*;
use sha2::{Digest, Sha256};
use verbs::{
    Access, MemoryRegion, Mtu, QpState, RecvWr, RemoteAddr, SendFlags, SendWr, WcFlags, WcOpcode, WcStatus, WrOpcode,
};

use super::harness::{Faults, PairConfig, QPN_A, QPN_B, Side, Sim, single};
use super::*;
use crate::wire::headers::{Aeth, AtomicEth, Bth, CreditCode, NakCode, Reth, Syndrome};
use crate::wire::opcode::Opcode;
use crate::wire::{ExtHeaders, Packet};

const STEPS: u64 = 50_000_000;

fn rw() -> Access {
    Access::all_remote() | Access::LOCAL_WRITE
}

fn fill(mr: &MemoryRegion, seed: u64) {
    let mut v = vec![0u8; mr.len()];
    let mut x = seed | 1;
    for b in v.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    mr.write(0, &v).unwrap();
}

fn hash(mr: &MemoryRegion, off: usize, len: usize) -> [u8; 32] {
    Sha256::digest(mr.to_vec(off, len).unwrap()).into()
}

fn write_wr(id: u64, src: &MemoryRegion, off: usize, len: u32, dst: &MemoryRegion, doff: u64) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaWrite {
            remote: RemoteAddr {
                addr: dst.addr() + doff,
                rkey: dst.rkey(),
            },
        },
        vec![src.sge(off, len)],
    )
}

fn read_wr(id: u64, sink: &MemoryRegion, off: usize, len: u32, src: &MemoryRegion, soff: u64) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaRead {
            remote: RemoteAddr {
                addr: src.addr() + soff,
                rkey: src.rkey(),
            },
        },
        vec![sink.sge(off, len)],
    )
}

fn send_wr(id: u64, src: &MemoryRegion, off: usize, len: u32) -> SendWr {
    SendWr::new(id, WrOpcode::Send, vec![src.sge(off, len)])
}

fn recv_wr(id: u64, mr: &MemoryRegion, off: usize, len: u32) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: vec![mr.sge(off, len)],
    }
}

const MIB: usize = 1 << 20;

/// 64 MiB by RDMA Write, 1 MiB per WR, through `faults`; returns the sim for its counters.
fn bulk_write(c: PairConfig, faults: (Faults, Faults), seed: u64) -> Sim {
    let mut sim = Sim::new(c, seed);
    sim.set_faults(faults.0, faults.1);
    let src = sim.a.reg_mr(64 * MIB, rw());
    let dst = sim.b.reg_mr(64 * MIB, rw());
    fill(&src, seed);
    for i in 0..64u64 {
        let off = i as usize * MIB;
        sim.a
            .qp
            .post_send(&write_wr(i, &src, off, MIB as u32, &dst, off as u64))
            .unwrap();
    }
    assert!(
        sim.run_until(STEPS, |s| s.a.wcs.len() == 64),
        "stalled: {:?}",
        sim.a.qp.stats()
    );
    assert!(sim.a.wcs.iter().all(|w| w.is_ok() && w.opcode == WcOpcode::RdmaWrite));
    assert_eq!(
        sim.a.wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..64).collect::<Vec<_>>()
    );
    assert_eq!(hash(&src, 0, 64 * MIB), hash(&dst, 0, 64 * MIB));
    assert_eq!(sim.a.qp.state(), QpState::Rts);
    assert_eq!(sim.b.qp.state(), QpState::Rts);
    sim
}

/// 64 MiB by RDMA Read, 1 MiB per WR.
fn bulk_read(c: PairConfig, faults: (Faults, Faults), seed: u64) -> Sim {
    let mut sim = Sim::new(c, seed);
    sim.set_faults(faults.0, faults.1);
    let src = sim.b.reg_mr(64 * MIB, rw());
    let sink = sim.a.reg_mr(64 * MIB, rw());
    fill(&src, seed);
    for i in 0..64u64 {
        let off = i as usize * MIB;
        sim.a
            .qp
            .post_send(&read_wr(i, &sink, off, MIB as u32, &src, off as u64))
            .unwrap();
    }
    assert!(
        sim.run_until(STEPS, |s| s.a.wcs.len() == 64),
        "stalled: {:?}",
        sim.a.qp.stats()
    );
    assert!(
        sim.a
            .wcs
            .iter()
            .all(|w| w.is_ok() && w.opcode == WcOpcode::RdmaRead && w.byte_len == MIB as u32),
        "{:?} {:?}",
        sim.a.wcs.iter().find(|w| !w.is_ok()),
        sim.a.qp.stats()
    );
    assert_eq!(hash(&src, 0, 64 * MIB), hash(&sink, 0, 64 * MIB));
    sim
}

#[test]
fn write_64mib_lossless_c3_in_order() {
    // C3 "in-order execution of WRITE"; IBTA vol. 1 §9.7.2 segmentation, §9.7.1 PSN wrap
    // (the PSNs start at 0xffff00).
    let sim = bulk_write(PairConfig::default(), (Faults::default(), Faults::default()), 1);
    assert_eq!(sim.a.qp.stats().retransmitted_packets, 0);
    assert_eq!(sim.a.qp.stats().ack_timeouts, 0);
}

#[test]
fn write_64mib_drop_1pct_c3_retry() {
    // C3 "transport retry ... local ACK timeout"; IBTA vol. 1 §9.7.5.1.4 (go-back-N),
    // §9.7.5.2.1 (PSN sequence NAK), §9.7.6.1.3 (ACK timeout).
    let f = Faults::lossy(0.01);
    let back = Faults {
        delay: Duration::from_micros(20),
        ..f
    };
    let sim = bulk_write(PairConfig::default(), (f, back), 2);
    let st = sim.a.qp.stats();
    assert!(st.retransmitted_packets > 0 && st.seq_naks_received > 0, "{st:?}");
    assert!(sim.b.qp.stats().duplicate_requests > 0);
}

#[test]
fn write_64mib_drop_10pct_c3_retry() {
    let f = Faults::lossy(0.10);
    let c = PairConfig {
        mtu: Mtu::Mtu4096,
        window: 32,
        ..PairConfig::default()
    };
    let sim = bulk_write(c, (f, f), 3);
    let st = sim.a.qp.stats();
    assert!(st.retransmitted_packets > 1000, "{st:?}");
    assert!(st.ack_timeouts > 0, "{st:?}");
}

#[test]
fn read_64mib_lossless_c3() {
    // IBTA vol. 1 §9.7.1 (a Read takes one PSN per response packet), §9.7.6 (placement).
    let sim = bulk_read(PairConfig::default(), (Faults::default(), Faults::default()), 4);
    assert_eq!(sim.a.qp.stats().retransmitted_packets, 0);
}

#[test]
fn read_64mib_drop_1pct_c3_implied_nak() {
    // IBTA vol. 1 §9.7.5.1.3 implied NAK, §9.7.5.1.1 duplicate Read re-executed from the PSN.
    let f = Faults::lossy(0.01);
    let sim = bulk_read(PairConfig::default(), (f, f), 5);
    let st = sim.a.qp.stats();
    assert!(st.retransmitted_packets > 0, "{st:?}");
    assert!(st.implied_naks + st.ack_timeouts > 0, "{st:?}");
}

#[test]
fn read_64mib_drop_10pct_c3() {
    let f = Faults::lossy(0.10);
    let c = PairConfig {
        mtu: Mtu::Mtu4096,
        window: 32,
        max_rd_atomic: 4,
        ..PairConfig::default()
    };
    let sim = bulk_read(c, (f, f), 6);
    assert!(sim.a.qp.stats().retransmitted_packets > 100);
}
