//! The RC core against itself (two cores through the in-memory lossy link of
//! [`super::harness`]) and against a scripted peer (packets built by hand).
//!
//! Each test names its requirement (C3 in `../shared/requirements/smcr-ipoibcm.md`) and the
//! IBA vol. 1 sections it exercises (docs/roce.md has which numbers a public source confirms).

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

/// 64 MiB by RDMA Write (a writes to b) or by RDMA Read (a reads from b), 1 MiB per WR,
/// through `faults`: every WR completes successfully and in order, the hashes of both ends
/// agree and both QPs are still in RTS. Returns the sim for its counters.
fn bulk(c: PairConfig, faults: (Faults, Faults), seed: u64, read: bool) -> Sim {
    let mut sim = Sim::new(c, seed);
    sim.set_faults(faults.0, faults.1);
    let (src, dst) = if read {
        (sim.b.reg_mr(64 * MIB, rw()), sim.a.reg_mr(64 * MIB, rw()))
    } else {
        (sim.a.reg_mr(64 * MIB, rw()), sim.b.reg_mr(64 * MIB, rw()))
    };
    fill(&src, seed);
    for i in 0..64u64 {
        let off = i as usize * MIB;
        let wr = if read {
            read_wr(i, &dst, off, MIB as u32, &src, off as u64)
        } else {
            write_wr(i, &src, off, MIB as u32, &dst, off as u64)
        };
        sim.a.qp.post_send(&wr).unwrap();
    }
    assert!(
        sim.run_until(STEPS, |s| s.a.wcs.len() == 64),
        "stalled: {:?}",
        sim.a.qp.stats()
    );
    let (opcode, byte_len) = if read {
        (WcOpcode::RdmaRead, MIB as u32)
    } else {
        (WcOpcode::RdmaWrite, 0)
    };
    assert!(
        sim.a
            .wcs
            .iter()
            .all(|w| w.is_ok() && w.opcode == opcode && (!read || w.byte_len == byte_len)),
        "{:?} {:?}",
        sim.a.wcs.iter().find(|w| !w.is_ok()),
        sim.a.qp.stats()
    );
    assert_eq!(
        sim.a.wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..64).collect::<Vec<_>>()
    );
    assert_eq!(hash(&src, 0, 64 * MIB), hash(&dst, 0, 64 * MIB));
    assert_eq!(sim.a.qp.state(), QpState::Rts);
    assert_eq!(sim.b.qp.state(), QpState::Rts);
    sim
}

fn bulk_write(c: PairConfig, faults: (Faults, Faults), seed: u64) -> Sim {
    bulk(c, faults, seed, false)
}

fn bulk_read(c: PairConfig, faults: (Faults, Faults), seed: u64) -> Sim {
    bulk(c, faults, seed, true)
}

#[test]
fn write_64mib_lossless_c3_in_order() {
    // C3 "in-order execution of WRITE"; IBA vol. 1 §9.7.2 segmentation, §9.7.1 PSN wrap (both unconfirmed)
    // (the PSNs start at 0xffff00).
    let sim = bulk_write(PairConfig::default(), (Faults::default(), Faults::default()), 1);
    assert_eq!(sim.a.qp.stats().retransmitted_packets, 0);
    assert_eq!(sim.a.qp.stats().ack_timeouts, 0);
}

#[test]
fn write_64mib_drop_1pct_c3_retry() {
    // C3 "transport retry ... local ACK timeout"; IBA vol. 1 §9.7.6 (go-back-N, ACK
    // timeout), §9.7.5.2 (PSN sequence NAK).
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
    // IBA vol. 1 §9.7.1 (unconfirmed) (a Read takes one PSN per response packet), §9.7.6 (placement).
    let sim = bulk_read(PairConfig::default(), (Faults::default(), Faults::default()), 4);
    assert_eq!(sim.a.qp.stats().retransmitted_packets, 0);
}

#[test]
fn read_64mib_drop_1pct_c3_implied_nak() {
    // IBA vol. 1 §9.7.6 implied NAK, §9.7.4 duplicate Read re-executed from the PSN.
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

/// A receiver posts `n` receives of `len` octets each at `mr`.
fn post_recvs(s: &mut Side, mr: &MemoryRegion, n: usize, len: u32, first_id: u64) {
    for i in 0..n {
        s.qp.post_recv(&recv_wr(first_id + i as u64, mr, i * len as usize, len))
            .unwrap();
    }
}

/// Many Sends (sizes 0..3 PMTU, some with immediate and SE) arrive intact and in order.
fn many_sends(faults: Faults, seed: u64) -> Sim {
    const N: usize = 1500;
    const MAX: u32 = 3000;
    let mut sim = Sim::new(PairConfig::default(), seed);
    sim.set_faults(faults, faults);
    let src = sim.a.reg_mr(N * MAX as usize, rw());
    let dst = sim.b.reg_mr(N * MAX as usize, rw());
    fill(&src, seed);
    post_recvs(&mut sim.b, &dst, N, MAX, 1000);
    let mut lens = Vec::new();
    for i in 0..N {
        let len = ((i as u64 * 2_654_435_761 + seed) % u64::from(MAX + 1)) as u32;
        lens.push(len);
        let mut wr = send_wr(i as u64, &src, i * MAX as usize, len);
        if i % 3 == 0 {
            wr.opcode = WrOpcode::SendWithImm { imm_data: i as u32 };
        }
        if i % 5 == 0 {
            wr.flags |= SendFlags::SOLICITED;
        }
        sim.a.qp.post_send(&wr).unwrap();
    }
    assert!(
        sim.run_until(STEPS, |s| s.a.wcs.len() == N && s.b.wcs.len() == N),
        "stalled: {:?} {:?}",
        sim.a.qp.stats(),
        sim.b.qp.stats()
    );
    for (i, wc) in sim.b.wcs.iter().enumerate() {
        assert!(wc.is_ok(), "{wc:?}");
        assert_eq!(wc.wr_id, 1000 + i as u64);
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.byte_len, lens[i]);
        assert_eq!(wc.imm_data, (i % 3 == 0).then_some(i as u32));
        assert_eq!(wc.wc_flags.contains(WcFlags::WITH_IMM), i % 3 == 0);
        assert_eq!(wc.solicited, i % 5 == 0);
        let off = i * MAX as usize;
        assert_eq!(
            hash(&src, off, lens[i] as usize),
            hash(&dst, off, lens[i] as usize),
            "send {i}"
        );
    }
    assert!(
        sim.a
            .wcs
            .iter()
            .enumerate()
            .all(|(i, w)| w.is_ok() && w.wr_id == i as u64)
    );
    sim
}

#[test]
fn many_sends_lossless_c3_consume_receives() {
    // C3 "an incoming SEND consumes a posted receive WQE"; IBA vol. 1 §9.7.5.1 (MSN; unconfirmed), §9.3.7
    // ImmDt (unconfirmed), §9.2 SE.
    let sim = many_sends(Faults::default(), 7);
    assert_eq!(sim.a.qp.stats().retransmitted_packets, 0);
}

#[test]
fn many_sends_drop_1pct_c3() {
    let sim = many_sends(Faults::lossy(0.01), 8);
    assert!(sim.a.qp.stats().retransmitted_packets > 0);
}

#[test]
fn many_sends_drop_10pct_c3() {
    let sim = many_sends(Faults::lossy(0.10), 9);
    assert!(sim.a.qp.stats().retransmitted_packets > 0);
    // Duplicated Sends were re-ACKed, not delivered twice (checked above: N receives).
    assert!(sim.b.qp.stats().duplicate_requests > 0);
}

#[test]
fn silent_peer_ends_in_retry_exc_err_c3() {
    // C3 "transport retry count and local ACK timeout", "errors move the QP to ERROR and
    // flush WRs"; IBA vol. 1 §9.7.6 (4.096 µs × 2^timeout, retry_cnt), §10.3 (error state).
    let c = PairConfig {
        timeout: 14,
        retry_cnt: 3,
        ..PairConfig::default()
    };
    let mut sim = Sim::new(c, 10);
    sim.set_faults(
        Faults {
            cut: true,
            ..Faults::default()
        },
        Faults::default(),
    );
    let src = sim.a.reg_mr(8192, rw());
    let dst = sim.b.reg_mr(8192, rw());
    let t0 = sim.now;
    sim.a.qp.post_send(&write_wr(1, &src, 0, 4000, &dst, 0)).unwrap();
    sim.a.qp.post_send(&send_wr(2, &src, 0, 10)).unwrap();
    assert!(sim.run_until(STEPS, |s| s.a.wcs.len() == 2));
    assert_eq!(sim.a.wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(sim.a.wcs[1].status, WcStatus::WrFlushErr);
    assert_eq!(sim.a.qp.state(), QpState::Err);
    let t = c_timeout(14);
    let took = sim.now - t0;
    // The first try and retry_cnt retries each wait one timeout.
    assert!(took >= t * 4 && took < t * 4 + Duration::from_millis(1), "{took:?}");
    let st = sim.a.qp.stats();
    assert_eq!(st.ack_timeouts, 4);
    // 4 packets of the Write and 1 of the Send, sent again on each of the 3 retries.
    assert_eq!(st.retransmitted_packets, 3 * 5);
    assert_eq!(sim.a.qp.poll_timeout(), None);
}

fn c_timeout(t: u8) -> Duration {
    Duration::from_nanos(4096 << t)
}

#[test]
fn ack_timeout_is_4096ns_times_2_pow_timeout_ibta_9_7_6() {
    let a = RcAttr {
        timeout: 14,
        ..RcAttr::default()
    };
    assert_eq!(a.ack_timeout(), Some(Duration::from_nanos(67_108_864)));
    let a = RcAttr { timeout: 0, ..a };
    assert_eq!(a.ack_timeout(), None, "0 = infinite");
}

#[test]
fn rnr_nak_then_retry_succeeds_c3() {
    // C3 "RNR NAK if none [receive posted]", "RNR retry counts"; IBA vol. 1 §9.7.5.2.8,
    // release 1.3 table 45 (timer 1 = 10 µs), §9.7.6.
    let mut sim = Sim::new(PairConfig::default(), 11);
    let src = sim.a.reg_mr(4096, rw());
    let dst = sim.b.reg_mr(4096, rw());
    fill(&src, 11);
    sim.a.qp.post_send(&send_wr(1, &src, 0, 3000)).unwrap();
    assert!(sim.run_until(STEPS, |s| s.a.qp.stats().rnr_naks_received >= 5));
    assert!(sim.a.wcs.is_empty());
    assert_eq!(sim.b.qp.stats().rnr_naks_sent, 5);
    post_recvs(&mut sim.b, &dst, 1, 4096, 0);
    assert!(sim.run_until(STEPS, |s| s.a.wcs.len() == 1 && s.b.wcs.len() == 1));
    assert!(sim.a.wcs[0].is_ok() && sim.b.wcs[0].is_ok());
    assert_eq!(sim.b.wcs[0].byte_len, 3000);
    assert_eq!(hash(&src, 0, 3000), hash(&dst, 0, 3000));
}

#[test]
fn rnr_retry_7_is_forever_c3() {
    // IBA vol. 1 §9.7.6: rnr_retry 7 means retry without limit.
    let mut sim = Sim::new(PairConfig::default(), 12);
    let src = sim.a.reg_mr(4096, rw());
    sim.a.qp.post_send(&send_wr(1, &src, 0, 100)).unwrap();
    assert!(sim.run_until(STEPS, |s| s.a.qp.stats().rnr_naks_received >= 200));
    assert_eq!(sim.a.qp.state(), QpState::Rts);
    assert!(sim.a.wcs.is_empty());
}

#[test]
fn rnr_naks_of_long_sends_do_not_use_up_retry_cnt_c3() {
    // IBA vol. 1 §9.7.6: each RNR NAK of a multi-packet Send is followed by one PSN sequence
    // NAK for the packets behind it; that is no transport error (retry_cnt stays).
    let c = PairConfig {
        retry_cnt: 1,
        ..PairConfig::default()
    };
    let mut sim = Sim::new(c, 21);
    let src = sim.a.reg_mr(8192, rw());
    let dst = sim.b.reg_mr(8192, rw());
    fill(&src, 21);
    sim.a.qp.post_send(&send_wr(1, &src, 0, 5000)).unwrap();
    assert!(sim.run_until(STEPS, |s| s.a.qp.stats().rnr_naks_received >= 20));
    assert_eq!(sim.a.qp.state(), QpState::Rts);
    assert!(sim.a.qp.stats().seq_naks_received >= 19);
    post_recvs(&mut sim.b, &dst, 1, 8192, 0);
    assert!(sim.run_until(STEPS, |s| s.a.wcs.len() == 1 && s.b.wcs.len() == 1));
    assert!(sim.a.wcs[0].is_ok() && sim.b.wcs[0].byte_len == 5000);
    assert_eq!(hash(&src, 0, 5000), hash(&dst, 0, 5000));
}

#[test]
fn rnr_retry_exhausted_is_rnr_retry_exc_err_c3() {
    // IBA vol. 1 §9.7.6; C3 "RNR retry counts".
    let c = PairConfig {
        rnr_retry: 2,
        min_rnr_timer: 14, // 1.28 ms
        ..PairConfig::default()
    };
    let mut sim = Sim::new(c, 13);
    let src = sim.a.reg_mr(4096, rw());
    let t0 = sim.now;
    sim.a.qp.post_send(&send_wr(1, &src, 0, 100)).unwrap();
    sim.a.qp.post_send(&send_wr(2, &src, 0, 100)).unwrap();
    assert!(sim.run_until(STEPS, |s| s.a.wcs.len() == 2));
    assert_eq!(sim.a.wcs[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(sim.a.wcs[1].status, WcStatus::WrFlushErr);
    assert_eq!(sim.a.qp.stats().rnr_naks_received, 3);
    // Two waits of the peer's RNR timer (1.28 ms) between the three tries.
    assert!(sim.now - t0 >= Duration::from_micros(2 * 1280));
}

/// Posts `wr` on a, runs to its completion, returns a's WC status and the state of both.
fn one_wr(sim: &mut Sim, wr: SendWr) -> WcStatus {
    sim.a.qp.post_send(&wr).unwrap();
    let n = sim.a.wcs.len() + 1;
    assert!(sim.run_until(STEPS, |s| s.a.wcs.len() >= n));
    sim.a.wcs[n - 1].status
}

#[test]
fn nak_rows_remote_access_c3() {
    // IBA vol. 1 §9.7.4.1.5 (remote access error: R_Key, bounds, rights), §9.9.2
    // (REM_ACCESS_ERR, QP to error), §10.3 (flush). roce-sim "rkey violation".
    type Case = fn(&MemoryRegion, &MemoryRegion, &MemoryRegion) -> SendWr;
    let cases: [(&str, Case); 6] = [
        ("write, invalid R_Key", |l, r, _| {
            let mut w = write_wr(1, l, 0, 64, r, 0);
            if let WrOpcode::RdmaWrite { remote } = &mut w.opcode {
                remote.rkey ^= 0x5a00;
            }
            w
        }),
        ("write, past the end", |l, r, _| write_wr(1, l, 0, 64, r, 4096 - 32)),
        ("write, before the start", |l, r, _| {
            let mut w = write_wr(1, l, 0, 64, r, 0);
            if let WrOpcode::RdmaWrite { remote } = &mut w.opcode {
                remote.addr -= 1;
            }
            w
        }),
        ("read, past the end", |l, r, _| read_wr(1, l, 0, 128, r, 4000)),
        ("read, no REMOTE_READ right", |l, _, ro| read_wr(1, l, 0, 16, ro, 0)),
        ("atomic, no REMOTE_ATOMIC right", |l, _, ro| {
            SendWr::new(
                1,
                WrOpcode::AtomicFetchAdd {
                    remote: RemoteAddr {
                        addr: ro.addr(),
                        rkey: ro.rkey(),
                    },
                    add: 1,
                },
                vec![l.sge(0, 8)],
            )
        }),
    ];
    for (name, make) in cases {
        let mut sim = Sim::new(PairConfig::default(), 14);
        let local = sim.a.reg_mr(4096, rw());
        let remote = sim.b.reg_mr(4096, rw());
        let write_only = sim.b.reg_mr(4096, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
        let wr = make(&local, &remote, &write_only);
        sim.a.qp.post_send(&wr).unwrap();
        sim.a.qp.post_send(&send_wr(2, &local, 0, 8)).unwrap();
        assert!(sim.run_until(STEPS, |s| s.a.wcs.len() == 2), "{name}");
        assert_eq!(sim.a.wcs[0].status, WcStatus::RemAccessErr, "{name}");
        assert_eq!(sim.a.wcs[1].status, WcStatus::WrFlushErr, "{name}");
        assert_eq!(sim.a.qp.state(), QpState::Err, "{name}");
        assert_eq!(sim.b.qp.state(), QpState::Err, "{name}: the responder's class C error");
    }
}

#[test]
fn nak_row_misaligned_atomic_is_rem_inv_req_c3() {
    // IBA vol. 1 §9.4 (atomics on 8-octet aligned addresses; §9.4.5 unconfirmed), §9.7.5.2
    // invalid request.
    let mut sim = Sim::new(PairConfig::default(), 15);
    let local = sim.a.reg_mr(4096, rw());
    let remote = sim.b.reg_mr(4096, rw());
    let wr = SendWr::new(
        1,
        WrOpcode::AtomicCmpSwap {
            remote: RemoteAddr {
                addr: remote.addr() + 4,
                rkey: remote.rkey(),
            },
            compare: 0,
            swap: 1,
        },
        vec![local.sge(0, 8)],
    );
    assert_eq!(one_wr(&mut sim, wr), WcStatus::RemInvReqErr);
    assert_eq!(sim.b.qp.state(), QpState::Err);
}

#[test]
fn nak_row_send_longer_than_receive_c3() {
    // IBA vol. 1 §9.7.4.1.6 (invalid request: length), ch. 10 (LOC_LEN_ERR on the receive;
    // §10.8.3 unconfirmed).
    let mut sim = Sim::new(PairConfig::default(), 16);
    let local = sim.a.reg_mr(4096, rw());
    let remote = sim.b.reg_mr(4096, rw());
    post_recvs(&mut sim.b, &remote, 2, 1000, 50);
    assert_eq!(one_wr(&mut sim, send_wr(1, &local, 0, 2500)), WcStatus::RemInvReqErr);
    sim.settle(STEPS);
    assert_eq!(sim.b.wcs[0].status, WcStatus::LocLenErr);
    assert_eq!(sim.b.wcs[0].wr_id, 50);
    assert_eq!(sim.b.wcs[1].status, WcStatus::WrFlushErr);
}

#[test]
fn nak_row_receive_buffer_unusable_is_rem_op_err_c3() {
    // IBA vol. 1 §9.7.5.2 remote operational error; LOC_PROT_ERR on the receive.
    let mut sim = Sim::new(PairConfig::default(), 17);
    let local = sim.a.reg_mr(4096, rw());
    let remote = sim.b.reg_mr(4096, Access::REMOTE_READ);
    post_recvs(&mut sim.b, &remote, 1, 1000, 60);
    assert_eq!(one_wr(&mut sim, send_wr(1, &local, 0, 100)), WcStatus::RemOpErr);
    sim.settle(STEPS);
    assert_eq!(sim.b.wcs[0].status, WcStatus::LocProtErr);
}

#[test]
fn local_protection_error_at_post_c3() {
    // IBA vol. 1 ch. 10 (§10.8.3 unconfirmed): a bad lkey completes with LOC_PROT_ERR and the QP goes to error.
    let mut sim = Sim::new(PairConfig::default(), 18);
    let local = sim.a.reg_mr(4096, rw());
    let remote = sim.b.reg_mr(4096, rw());
    let mut wr = write_wr(1, &local, 0, 64, &remote, 0);
    wr.sg_list[0].lkey ^= 0x100;
    sim.a.qp.post_send(&wr).unwrap();
    sim.a.qp.post_send(&write_wr(2, &local, 0, 64, &remote, 0)).unwrap();
    sim.a.poll();
    assert_eq!(sim.a.wcs[0].status, WcStatus::LocProtErr);
    assert_eq!(sim.a.wcs[1].status, WcStatus::WrFlushErr);
}

#[test]
fn atomics_cmp_swap_fetch_add_c3() {
    // IBA vol. 1 §9.4 (CmpSwap, FetchAdd), §9.3.6 AtomicAckETH (subsections unconfirmed).
    let mut sim = Sim::new(PairConfig::default(), 19);
    let local = sim.a.reg_mr(4096, rw());
    let remote = sim.b.reg_mr(4096, rw());
    remote.write(8, &40u64.to_ne_bytes()).unwrap();
    let at = RemoteAddr {
        addr: remote.addr() + 8,
        rkey: remote.rkey(),
    };
    let wrs = [
        WrOpcode::AtomicFetchAdd { remote: at, add: 2 },
        WrOpcode::AtomicCmpSwap {
            remote: at,
            compare: 42,
            swap: 7,
        },
        WrOpcode::AtomicCmpSwap {
            remote: at,
            compare: 42,
            swap: 9,
        },
    ];
    for (i, op) in wrs.into_iter().enumerate() {
        sim.a
            .qp
            .post_send(&SendWr::new(i as u64, op, vec![local.sge(8 * i, 8)]))
            .unwrap();
    }
    assert!(sim.run_until(STEPS, |s| s.a.wcs.len() == 3));
    assert!(sim.a.wcs.iter().all(|w| w.is_ok() && w.byte_len == 8));
    let got = |i: usize| u64::from_ne_bytes(local.to_vec(8 * i, 8).unwrap().try_into().unwrap());
    assert_eq!([got(0), got(1), got(2)], [40, 42, 7]);
    assert_eq!(u64::from_ne_bytes(remote.to_vec(8, 8).unwrap().try_into().unwrap()), 7);
}

#[test]
fn write_with_imm_and_send_with_invalidate_c3() {
    // IBA vol. 1 §9.3.7 ImmDt (RDMA WRITE with immediate consumes a receive), §9.3.8 IETH
    // (Send with Invalidate), §10.6 fast registration (all three unconfirmed) (RegMr, LocalInv work requests).
    let mut sim = Sim::new(PairConfig::default(), 20);
    let local = sim.a.reg_mr(8192, rw());
    let backing = sim.b.reg_mr(8192, rw());
    let recv = sim.b.reg_mr(4096, rw());
    fill(&local, 20);
    // b fast-registers 4 KiB of `backing` under a new key.
    let fr = sim.b.pd.alloc_mr(4096).unwrap();
    let rkey = fr.stag_with_key(0x33);
    sim.b
        .qp
        .post_send(&SendWr::new(
            500,
            WrOpcode::RegMr {
                mr_stag: fr.rkey(),
                key: 0x33,
                source_lkey: backing.lkey(),
                source_addr: backing.addr(),
                length: 4096,
                iova: 0x7000_0000,
                access: Access::REMOTE_WRITE | Access::LOCAL_WRITE,
            },
            vec![],
        ))
        .unwrap();
    assert!(sim.run_until(STEPS, |s| s.b.wcs.len() == 1));
    assert_eq!(
        (sim.b.wcs[0].status, sim.b.wcs[0].opcode),
        (WcStatus::Success, WcOpcode::RegMr)
    );
    post_recvs(&mut sim.b, &recv, 2, 2048, 0);
    let remote = RemoteAddr {
        addr: 0x7000_0000,
        rkey,
    };
    let w = SendWr::new(
        1,
        WrOpcode::RdmaWriteWithImm {
            remote,
            imm_data: 0xfeed,
        },
        vec![local.sge(0, 3000)],
    )
    .flags(SendFlags::SIGNALED | SendFlags::SOLICITED);
    sim.a.qp.post_send(&w).unwrap();
    let s = SendWr::new(
        2,
        WrOpcode::SendWithInv { invalidate_rkey: rkey },
        vec![local.sge(4096, 100)],
    );
    sim.a.qp.post_send(&s).unwrap();
    assert!(sim.run_until(STEPS, |s| s.a.wcs.len() == 2 && s.b.wcs.len() == 3));
    assert!(sim.a.wcs.iter().all(|w| w.is_ok()));
    let (wimm, inv) = (&sim.b.wcs[1], &sim.b.wcs[2]);
    assert_eq!(wimm.opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(
        (wimm.byte_len, wimm.imm_data, wimm.solicited),
        (3000, Some(0xfeed), true)
    );
    assert_eq!(backing.to_vec(0, 3000).unwrap(), local.to_vec(0, 3000).unwrap());
    assert_eq!(inv.opcode, WcOpcode::Recv);
    assert_eq!(inv.invalidated_rkey, Some(rkey));
    assert!(inv.wc_flags.contains(WcFlags::WITH_INV));
    // The key is dead now: a Write through it is a remote access error.
    assert_eq!(
        one_wr(&mut sim, write_wr(3, &local, 0, 8, &fr, 0)),
        WcStatus::RemAccessErr
    );
}

// ---- a scripted peer: packets built by hand into one core ----------------------------------

/// One core (QP_A, peer QP_B) with regions for the scripted tests.
struct Scripted {
    s: Side,
    now: std::time::Instant,
    /// Remote-accessible region of the core.
    mr: std::sync::Arc<MemoryRegion>,
    /// Where its receives land.
    recv: std::sync::Arc<MemoryRegion>,
    c: PairConfig,
}

impl Scripted {
    fn new(c: PairConfig) -> Scripted {
        let dev = super::harness::device();
        let pd = dev.alloc_pd().unwrap();
        let s = single(&pd, &c);
        let mr = std::sync::Arc::new(s.reg_mr(16 * 1024, rw()));
        let recv = std::sync::Arc::new(s.reg_mr(16 * 1024, rw()));
        fill(&mr, 99);
        Scripted {
            s,
            now: std::time::Instant::now(),
            mr,
            recv,
            c,
        }
    }
    /// The PSN the core's responder expects first.
    fn epsn(&self) -> Psn {
        Psn::new(self.c.psn_ba)
    }
    fn feed(&mut self, bth: Bth, ext: ExtHeaders, payload: &[u8]) {
        let p = Packet::new(bth, ext, payload).expect("a valid packet");
        // Through the wire and back, as the engine would hand it over.
        let mut b = vec![0; p.buffer_len()];
        p.emit(&mut b).unwrap();
        let q = Packet::parse(&b).unwrap();
        self.s.qp.handle_packet(self.now, &q);
    }
    fn req(&mut self, op: Opcode, psn: Psn, ext: ExtHeaders, payload: &[u8]) {
        let mut bth = Bth::new(op, QPN_A, psn);
        bth.ack_req = true;
        self.feed(bth, ext, payload);
    }
    /// Everything the core sends now, parsed (owned copies).
    fn out(&mut self) -> Vec<(Bth, ExtHeaders, Vec<u8>)> {
        let mut v = Vec::new();
        let mut buf = vec![0; 8192];
        while let Some(n) = self.s.qp.poll_transmit(self.now, &mut buf) {
            let p = Packet::parse(&buf[..n]).unwrap();
            assert_eq!(p.bth.dest_qp, QPN_B);
            v.push((p.bth, p.ext, p.payload.to_vec()));
        }
        v
    }
    fn reth(&self, off: u64, len: u32) -> ExtHeaders {
        ExtHeaders {
            reth: Some(Reth {
                va: self.mr.addr() + off,
                r_key: self.mr.rkey(),
                dma_len: len,
            }),
            ..ExtHeaders::default()
        }
    }
}

fn aeth_of(p: &(Bth, ExtHeaders, Vec<u8>)) -> (Opcode, Psn, Syndrome) {
    (p.0.opcode, p.0.psn, p.1.aeth.expect("an AETH").syndrome)
}

fn nak(code: NakCode) -> Syndrome {
    Syndrome::Nak(code)
}

#[test]
fn out_of_sequence_one_nak_then_silence_c3() {
    // IBA vol. 1 §9.7.4.1, §9.7.5.2 (PSN ahead of ePSN: one NAK per sequence error); "PSN far out of
    // window" of issue 13.
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    post_recvs(&mut t.s, &t.recv.clone(), 4, 1024, 0);
    t.req(Opcode::RC_SEND_ONLY, e.add(2), ExtHeaders::default(), b"late");
    t.req(Opcode::RC_SEND_ONLY, e.add(3), ExtHeaders::default(), b"later");
    t.req(Opcode::RC_SEND_ONLY, e.add(1 << 22), ExtHeaders::default(), b"far");
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(
        aeth_of(&out[0]),
        (Opcode::RC_ACKNOWLEDGE, e, nak(NakCode::PsnSequenceError))
    );
    t.req(Opcode::RC_SEND_ONLY, e, ExtHeaders::default(), b"now");
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert!(matches!(aeth_of(&out[0]), (Opcode::RC_ACKNOWLEDGE, p, Syndrome::Ack { .. }) if p == e));
    // A new sequence error after ePSN arrived gets its NAK again.
    t.req(Opcode::RC_SEND_ONLY, e.add(5), ExtHeaders::default(), b"x");
    assert_eq!(aeth_of(&t.out()[0]).2, nak(NakCode::PsnSequenceError));
    assert_eq!(t.s.qp.stats().seq_naks_sent, 2);
    assert_eq!(t.s.qp.state(), QpState::Rts);
}

#[test]
fn opcode_sequence_errors_are_invalid_request_c3() {
    // IBA vol. 1 §9.7.4.1 opcode sequence check, §9.7.5.2 NAK invalid request (class C:
    // the responder's QP goes to error); roce-sim "opcode sequence".
    let mtu = 1024;
    // A MIDDLE with no FIRST.
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    t.req(Opcode::RC_RDMA_WRITE_MIDDLE, e, ExtHeaders::default(), &vec![0; mtu]);
    let out = t.out();
    assert_eq!(
        aeth_of(&out[0]),
        (Opcode::RC_ACKNOWLEDGE, e, nak(NakCode::InvalidRequest))
    );
    assert_eq!(t.s.qp.state(), QpState::Err);
    // A new FIRST inside a Write.
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    let reth = t.reth(0, 3 * mtu as u32);
    t.req(Opcode::RC_RDMA_WRITE_FIRST, e, reth, &vec![1; mtu]);
    t.req(Opcode::RC_RDMA_WRITE_FIRST, e.add(1), reth, &vec![2; mtu]);
    let out = t.out();
    assert_eq!(
        aeth_of(out.last().unwrap()),
        (Opcode::RC_ACKNOWLEDGE, e.add(1), nak(NakCode::InvalidRequest))
    );
    // A Send LAST inside a Write.
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    let reth = t.reth(0, 3 * mtu as u32);
    t.req(Opcode::RC_RDMA_WRITE_FIRST, e, reth, &vec![1; mtu]);
    t.req(Opcode::RC_SEND_LAST, e.add(1), ExtHeaders::default(), b"abcd");
    assert_eq!(aeth_of(t.out().last().unwrap()).2, nak(NakCode::InvalidRequest));
    // A FIRST shorter than the path MTU (length check).
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    let reth = t.reth(0, 3 * mtu as u32);
    t.req(Opcode::RC_RDMA_WRITE_FIRST, e, reth, &[1; 100]);
    assert_eq!(aeth_of(&t.out()[0]).2, nak(NakCode::InvalidRequest));
}

#[test]
fn remote_access_nak_from_a_scripted_peer_c3() {
    // IBA vol. 1 §9.7.4.1.5; issue 13 "invalid R_Key, out-of-bounds Write/Read".
    for (op, off, len, bad_key) in [
        (Opcode::RC_RDMA_WRITE_ONLY, 0u64, 16u32, true),
        (Opcode::RC_RDMA_WRITE_ONLY, 16 * 1024 - 8, 16, false),
        (Opcode::RC_RDMA_READ_REQUEST, 0, 16, true),
        (Opcode::RC_RDMA_READ_REQUEST, 16 * 1024 - 8, 16, false),
    ] {
        let mut t = Scripted::new(PairConfig::default());
        let e = t.epsn();
        let mut ext = t.reth(off, len);
        if bad_key {
            ext.reth.as_mut().unwrap().r_key ^= 0xff;
        }
        let payload = if op == Opcode::RC_RDMA_WRITE_ONLY {
            vec![7; 16]
        } else {
            vec![]
        };
        t.req(op, e, ext, &payload);
        let out = t.out();
        assert_eq!(out.len(), 1);
        assert_eq!(
            aeth_of(&out[0]),
            (Opcode::RC_ACKNOWLEDGE, e, nak(NakCode::RemoteAccessError))
        );
        assert_eq!(t.s.qp.state(), QpState::Err);
    }
}

#[test]
fn duplicate_write_is_acked_not_executed_again_c3() {
    // IBA vol. 1 §9.7.4 (duplicate Send/Write: ACK, do not execute; the subsection and the
    // C9-105 cited before are unconfirmed).
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    let ext = t.reth(0, 8);
    t.req(Opcode::RC_RDMA_WRITE_ONLY, e, ext, b"firstwr!");
    assert!(matches!(aeth_of(&t.out()[0]), (_, p, Syndrome::Ack { .. }) if p == e));
    assert_eq!(t.mr.to_vec(0, 8).unwrap(), b"firstwr!");
    t.mr.write(0, b"changed!").unwrap();
    let ext2 = t.reth(0, 8);
    t.req(Opcode::RC_RDMA_WRITE_ONLY, e, ext2, b"firstwr!");
    let out = t.out();
    assert!(matches!(aeth_of(&out[0]), (_, p, Syndrome::Ack { .. }) if p == e));
    assert_eq!(t.mr.to_vec(0, 8).unwrap(), b"changed!");
    assert_eq!(t.s.qp.stats().duplicate_requests, 1);
}

#[test]
fn duplicate_read_is_executed_again_from_the_requested_psn_c3() {
    // IBA vol. 1 §9.7.4 (duplicate Read: respond again from the PSN asked for).
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    let ext = t.reth(100, 2500);
    t.req(Opcode::RC_RDMA_READ_REQUEST, e, ext, &[]);
    let out = t.out();
    let ops: Vec<_> = out.iter().map(|p| (p.0.opcode, p.0.psn)).collect();
    assert_eq!(
        ops,
        [
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, e),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, e.add(1)),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, e.add(2)),
        ]
    );
    assert_eq!(out[2].2, t.mr.to_vec(100 + 2048, 452).unwrap());
    assert_eq!(out[0].1.aeth.unwrap().msn, 1);
    // Re-requested from the second packet: the rest of the Read.
    let ext = t.reth(100 + 1024, 2500 - 1024);
    t.req(Opcode::RC_RDMA_READ_REQUEST, e.add(1), ext, &[]);
    let out = t.out();
    let ops: Vec<_> = out.iter().map(|p| (p.0.opcode, p.0.psn)).collect();
    assert_eq!(
        ops,
        [
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, e.add(1)),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, e.add(2)),
        ]
    );
    assert_eq!(out[0].2, t.mr.to_vec(100 + 1024, 1024).unwrap());
    // A re-request that does not name the rest of the original Read is dropped.
    let ext = t.reth(0, 100);
    t.req(Opcode::RC_RDMA_READ_REQUEST, e.add(1), ext, &[]);
    assert!(t.out().is_empty());
}

#[test]
fn duplicate_atomic_is_replayed_from_responder_resources_c3() {
    // IBA vol. 1 §9.7.4 (duplicate atomic: the saved result, not executed again),
    // max_dest_rd_atomic resources.
    let c = PairConfig {
        max_rd_atomic: 1,
        ..PairConfig::default()
    };
    let mut t = Scripted::new(c);
    let e = t.epsn();
    t.mr.write(64, &10u64.to_ne_bytes()).unwrap();
    let aeth = |t: &Scripted, add: u64| ExtHeaders {
        atomic_eth: Some(AtomicEth {
            va: t.mr.addr() + 64,
            r_key: t.mr.rkey(),
            swap_add_data: add,
            compare_data: 0,
        }),
        ..ExtHeaders::default()
    };
    let a = aeth(&t, 5);
    t.req(Opcode::RC_FETCH_ADD, e, a, &[]);
    let out = t.out();
    assert_eq!(out[0].0.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    assert_eq!(out[0].1.atomic_ack_eth.unwrap().orig_rem_dt, 10);
    t.req(Opcode::RC_FETCH_ADD, e, a, &[]);
    let out = t.out();
    assert_eq!(out[0].1.atomic_ack_eth.unwrap().orig_rem_dt, 10, "replayed");
    let value = |t: &Scripted| u64::from_ne_bytes(t.mr.to_vec(64, 8).unwrap().try_into().unwrap());
    assert_eq!(value(&t), 15, "executed once");
    // A second atomic takes the only resource: the first one's duplicate is dropped.
    let a2 = aeth(&t, 1);
    t.req(Opcode::RC_FETCH_ADD, e.add(1), a2, &[]);
    assert_eq!(t.out()[0].1.atomic_ack_eth.unwrap().orig_rem_dt, 15);
    t.req(Opcode::RC_FETCH_ADD, e, a, &[]);
    assert!(t.out().is_empty());
    assert_eq!(value(&t), 16);
}

#[test]
fn ack_carries_msn_and_credits_ibta_9_7_7() {
    // IBA vol. 1 §9.7.7 (unconfirmed) (MSN counts messages; the credit count of posted receives).
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    post_recvs(&mut t.s, &t.recv.clone(), 5, 1024, 0);
    t.req(Opcode::RC_SEND_ONLY, e, ExtHeaders::default(), b"one");
    t.req(Opcode::RC_SEND_ONLY, e.add(1), ExtHeaders::default(), b"two");
    let out = t.out();
    assert_eq!(out.len(), 1, "back-to-back ACKs are coalesced");
    let a = out[0].1.aeth.unwrap();
    assert_eq!(out[0].0.psn, e.add(1));
    assert_eq!(a.msn, 2);
    assert_eq!(
        a.syndrome,
        Syndrome::Ack {
            credits: CreditCode::for_credits(3)
        }
    );
    // No receive left: RNR NAK with the QP's min_rnr_timer, ePSN unchanged.
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    t.req(Opcode::RC_SEND_ONLY, e, ExtHeaders::default(), b"one");
    assert_eq!(
        aeth_of(&t.out()[0]),
        (
            Opcode::RC_ACKNOWLEDGE,
            e,
            Syndrome::RnrNak {
                timer: crate::wire::RnrTimer(1)
            }
        )
    );
    assert_eq!(t.s.qp.resp.epsn, e);
}

#[test]
fn misdirected_packets_are_dropped_and_counted_ibta_9_6() {
    // IBA vol. 1 §9.6.1 (header validation: destination QP, P_Key), §10.9 (P_Key
    // matching; unconfirmed); C3; issue 13 "wrong P_Key".
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    post_recvs(&mut t.s, &t.recv.clone(), 1, 1024, 0);
    let mut bth = Bth::new(Opcode::RC_SEND_ONLY, QPN_A, e);
    bth.p_key = 0x8001;
    t.feed(bth, ExtHeaders::default(), b"x");
    let bth = Bth::new(Opcode::RC_SEND_ONLY, QPN_A + 1, e);
    t.feed(bth, ExtHeaders::default(), b"x");
    let bth = Bth::new(Opcode::UD_SEND_ONLY, QPN_A, e);
    t.feed(
        bth,
        ExtHeaders {
            deth: Some(Default::default()),
            ..ExtHeaders::default()
        },
        b"x",
    );
    assert!(t.out().is_empty());
    assert_eq!(t.s.qp.stats().misdirected_dropped, 3);
}

#[test]
fn a_limited_member_p_key_of_the_same_partition_is_accepted_ibta_10_9() {
    // IBA vol. 1 §10.9 (unconfirmed): 0x7fff (limited member of the default partition) matches our 0xffff
    // (full member), as rxe's `pkey_match` has it; C3.
    let mut t = Scripted::new(PairConfig::default());
    let e = t.epsn();
    post_recvs(&mut t.s, &t.recv.clone(), 1, 1024, 0);
    let mut bth = Bth::new(Opcode::RC_SEND_ONLY, QPN_A, e);
    bth.p_key = 0x7fff;
    bth.ack_req = true;
    t.feed(bth, ExtHeaders::default(), b"x");
    assert_eq!(t.s.qp.stats().misdirected_dropped, 0);
    assert!(!t.out().is_empty(), "the Send is ACKed");
}

// ---- the completer against a scripted responder ---------------------------------------------

/// The scripted core's requester sends `wrs`; returns the PSNs of the packets it sent.
fn sent_psns(t: &mut Scripted, wrs: &[SendWr]) -> Vec<(Opcode, Psn)> {
    for w in wrs {
        t.s.qp.post_send(w).unwrap();
    }
    t.out().iter().map(|p| (p.0.opcode, p.0.psn)).collect()
}

fn ack(t: &mut Scripted, psn: Psn, syndrome: Syndrome) {
    let bth = Bth::new(Opcode::RC_ACKNOWLEDGE, QPN_A, psn);
    t.feed(
        bth,
        ExtHeaders {
            aeth: Some(Aeth { syndrome, msn: 0 }),
            ..ExtHeaders::default()
        },
        &[],
    );
    t.s.poll();
}

#[test]
fn coalesced_and_ghost_acks_c3() {
    // IBA vol. 1 §9.7.5.1.2 (one ACK acknowledges every earlier PSN), §9.7.6 (an ACK
    // for a PSN not sent, "ghost ACK", is ignored); C3 "a successful send-queue completion
    // means the responder ACKed".
    let mut t = Scripted::new(PairConfig::default());
    let mr = t.mr.clone();
    let wrs: Vec<_> = (0..3).map(|i| send_wr(i, &mr, 0, 100)).collect();
    let sent = sent_psns(&mut t, &wrs);
    assert_eq!(sent.len(), 3);
    let first = sent[0].1;
    ack(&mut t, first.add(3), Syndrome::ACK);
    ack(&mut t, first.add(1000), Syndrome::ACK);
    assert!(t.s.wcs.is_empty());
    assert_eq!(t.s.qp.stats().ghost_responses, 2);
    ack(&mut t, first.add(1), Syndrome::ACK);
    assert_eq!(t.s.wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1]);
    ack(&mut t, first, Syndrome::ACK);
    assert_eq!(t.s.qp.stats().duplicate_responses, 1);
    ack(&mut t, first.add(2), Syndrome::ACK);
    assert_eq!(t.s.wcs.len(), 3);
    assert!(t.s.wcs.iter().all(|w| w.is_ok()));
    assert_eq!(t.s.qp.poll_timeout(), None, "nothing outstanding, no timer");
}

#[test]
fn implied_nak_resends_the_read_c3() {
    // IBA vol. 1 §9.7.6 implied NAK: an ACK for a later PSN while a Read is unanswered
    // means its responses were lost.
    let mut t = Scripted::new(PairConfig::default());
    let mr = t.mr.clone();
    let wrs = [read_wr(1, &mr, 0, 2048, &mr, 8192), send_wr(2, &mr, 0, 10)];
    let sent = sent_psns(&mut t, &wrs);
    assert_eq!(
        sent.iter().map(|s| s.0).collect::<Vec<_>>(),
        [Opcode::RC_RDMA_READ_REQUEST, Opcode::RC_SEND_ONLY]
    );
    let r = sent[0].1;
    assert_eq!(sent[1].1, r.add(2), "a Read takes a PSN per response packet");
    ack(&mut t, r.add(2), Syndrome::ACK);
    let again = t.out();
    assert_eq!(again[0].0.opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(again[0].0.psn, r);
    assert_eq!(t.s.qp.stats().implied_naks, 1);
    // The first response arrives; then a later ACK implies the second was lost: the Read is
    // re-requested from its second packet, RETH moved on by one PMTU.
    let bth = Bth::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, QPN_A, r);
    let data = mr.to_vec(8192, 1024).unwrap();
    t.feed(
        bth,
        ExtHeaders {
            aeth: Some(Aeth {
                syndrome: Syndrome::ACK,
                msn: 1,
            }),
            ..ExtHeaders::default()
        },
        &data,
    );
    ack(&mut t, r.add(2), Syndrome::ACK);
    let again = t.out();
    assert_eq!(again[0].0.psn, r.add(1));
    let reth = again[0].1.reth.unwrap();
    assert_eq!((reth.va, reth.dma_len), (mr.addr() + 8192 + 1024, 1024));
    assert!(t.s.wcs.is_empty(), "nothing completes before the Read");
}

#[test]
fn nak_sequence_error_goes_back_to_its_psn_c3() {
    // IBA vol. 1 §9.7.5.1.2: a PSN sequence NAK acknowledges the PSNs before it; the
    // requester resends from its PSN.
    let mut t = Scripted::new(PairConfig::default());
    let mr = t.mr.clone();
    let wrs: Vec<_> = (0..3).map(|i| send_wr(i, &mr, 0, 100)).collect();
    let sent = sent_psns(&mut t, &wrs);
    let first = sent[0].1;
    ack(&mut t, first.add(1), nak(NakCode::PsnSequenceError));
    assert_eq!(t.s.wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0]);
    let again: Vec<_> = t.out().iter().map(|p| p.0.psn).collect();
    assert_eq!(again, [first.add(1), first.add(2)]);
    assert_eq!(t.s.qp.stats().retransmitted_packets, 2);
}

#[test]
fn fatal_naks_complete_with_their_status_and_flush_c3() {
    // IBA vol. 1 §9.7.5.2 (NAK codes), §9.9.2; C3 "errors move the QP to ERROR and flush WRs".
    for (code, status) in [
        (NakCode::InvalidRequest, WcStatus::RemInvReqErr),
        (NakCode::RemoteAccessError, WcStatus::RemAccessErr),
        (NakCode::RemoteOperationalError, WcStatus::RemOpErr),
    ] {
        let mut t = Scripted::new(PairConfig::default());
        let mr = t.mr.clone();
        let wrs: Vec<_> = (0..3).map(|i| send_wr(i, &mr, 0, 100)).collect();
        let sent = sent_psns(&mut t, &wrs);
        ack(&mut t, sent[1].1, nak(code));
        let got: Vec<_> = t.s.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(0, WcStatus::Success), (1, status), (2, WcStatus::WrFlushErr)]);
        assert_eq!(t.s.qp.state(), QpState::Err);
        t.s.qp.post_send(&send_wr(9, &mr, 0, 1)).unwrap();
        t.s.poll();
        assert_eq!(t.s.wcs.last().unwrap().status, WcStatus::WrFlushErr);
        assert!(t.out().is_empty());
    }
}

#[test]
fn ack_request_on_last_packet_and_periodically_ibta_9_7_5() {
    let mut t = Scripted::new(PairConfig {
        window: 1024,
        ..PairConfig::default()
    });
    let mr = t.mr.clone();
    t.s.qp.post_send(&send_wr(1, &mr, 0, 16 * 1024)).unwrap();
    t.s.qp.post_send(&send_wr(2, &mr, 0, 1)).unwrap();
    let out = t.out();
    assert_eq!(out.len(), 17);
    let acked: Vec<_> = out.iter().map(|p| p.0.ack_req).collect();
    assert!(acked[15] && acked[16]);
    assert_eq!(acked.iter().filter(|a| **a).count(), 2);
    let ops: Vec<_> = out.iter().map(|p| p.0.opcode).collect();
    assert_eq!(ops[0], Opcode::RC_SEND_FIRST);
    assert!(ops[1..15].iter().all(|o| *o == Opcode::RC_SEND_MIDDLE));
    assert_eq!(ops[15], Opcode::RC_SEND_LAST);
    assert_eq!(ops[16], Opcode::RC_SEND_ONLY);
    // Window: at most `window` PSNs unacknowledged.
    let mut t = Scripted::new(PairConfig {
        window: 4,
        ..PairConfig::default()
    });
    let mr = t.mr.clone();
    t.s.qp.post_send(&send_wr(1, &mr, 0, 16 * 1024)).unwrap();
    assert_eq!(t.out().len(), 4);
}

// ---- random work-request mixes against a model ----------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Send(u32),
    Write(u32),
    Read(u32),
    FetchAdd(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..5000).prop_map(Op::Send),
        (0u32..9000).prop_map(Op::Write),
        (0u32..9000).prop_map(Op::Read),
        (0u64..1000).prop_map(Op::FetchAdd),
    ]
}

const SLOT: usize = 9000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// C3 "in-order execution of WRITE and SEND", "a successful send-queue completion means
    /// the responder ACKed"; IBA vol. 1 §9.5 (ordering), §9.7 (reliability): whatever the
    /// mix, path MTU and (seeded) losses, every WR completes successfully in posting order,
    /// Sends land in the receives in order, Writes and Reads move exactly their octets, and the
    /// FetchAdds, executed in order once each, return the prefix sums.
    #[test]
    fn random_mixes_match_the_model(
        ops in proptest::collection::vec(op(), 1..40),
        seed in any::<u64>(),
        loss in prop_oneof![Just(0.0), Just(0.02), Just(0.1)],
        mtu in prop_oneof![Just(Mtu::Mtu256), Just(Mtu::Mtu1024), Just(Mtu::Mtu4096)],
        window in 4u32..200,
        psn in any::<u32>(),
    ) {
        let c = PairConfig {
            mtu,
            window,
            psn_ab: psn,
            psn_ba: psn.wrapping_mul(7),
            max_rd_atomic: 4,
            ..PairConfig::default()
        };
        let mut sim = Sim::new(c, seed);
        sim.set_faults(Faults::lossy(loss), Faults::lossy(loss));
        let n = ops.len();
        let local = sim.a.reg_mr(n * SLOT + 8, rw());
        let remote = sim.b.reg_mr(n * SLOT + 8, rw());
        let recv = sim.b.reg_mr(n * SLOT, rw());
        let source = sim.b.reg_mr(n * SLOT, rw());
        let sink = sim.a.reg_mr(n * SLOT + 8 * n, rw());
        fill(&local, seed);
        fill(&source, !seed);
        remote.write(n * SLOT, &0u64.to_ne_bytes()).unwrap();
        let sends = ops.iter().filter(|o| matches!(o, Op::Send(_))).count();
        post_recvs(&mut sim.b, &recv, sends, SLOT as u32, 0);
        for (i, o) in ops.iter().enumerate() {
            let off = i * SLOT;
            let wr = match *o {
                Op::Send(len) => send_wr(i as u64, &local, off, len),
                Op::Write(len) => write_wr(i as u64, &local, off, len, &remote, off as u64),
                Op::Read(len) => read_wr(i as u64, &sink, off, len, &source, off as u64),
                Op::FetchAdd(add) => SendWr::new(
                    i as u64,
                    WrOpcode::AtomicFetchAdd {
                        remote: RemoteAddr { addr: remote.addr() + (n * SLOT) as u64, rkey: remote.rkey() },
                        add,
                    },
                    vec![sink.sge(n * SLOT + 8 * i, 8)],
                ),
            };
            sim.a.qp.post_send(&wr).unwrap();
        }
        prop_assert!(
            sim.run_until(STEPS, |s| s.a.wcs.len() == n && s.b.wcs.len() == sends),
            "stalled: {:?}", sim.a.qp.stats()
        );
        let mut sum = 0u64;
        let mut recv_i = 0usize;
        for (i, o) in ops.iter().enumerate() {
            let wc = &sim.a.wcs[i];
            prop_assert!(wc.is_ok() && wc.wr_id == i as u64, "{:?}", wc);
            let off = i * SLOT;
            match *o {
                Op::Send(len) => {
                    let r = &sim.b.wcs[recv_i];
                    prop_assert!(r.is_ok() && r.byte_len == len && r.wr_id == recv_i as u64);
                    prop_assert_eq!(
                        recv.to_vec(recv_i * SLOT, len as usize).unwrap(),
                        local.to_vec(off, len as usize).unwrap()
                    );
                    recv_i += 1;
                }
                Op::Write(len) => prop_assert_eq!(
                    remote.to_vec(off, len as usize).unwrap(),
                    local.to_vec(off, len as usize).unwrap()
                ),
                Op::Read(len) => prop_assert_eq!(
                    sink.to_vec(off, len as usize).unwrap(),
                    source.to_vec(off, len as usize).unwrap()
                ),
                Op::FetchAdd(add) => {
                    let got = u64::from_ne_bytes(sink.to_vec(n * SLOT + 8 * i, 8).unwrap().try_into().unwrap());
                    prop_assert_eq!(got, sum);
                    sum += add;
                }
            }
        }
        let total = u64::from_ne_bytes(remote.to_vec(n * SLOT, 8).unwrap().try_into().unwrap());
        prop_assert_eq!(total, sum);
        prop_assert_eq!(sim.a.qp.state(), QpState::Rts);
        prop_assert_eq!(sim.b.qp.state(), QpState::Rts);
    }
}

#[test]
fn reads_and_atomics_limited_by_max_rd_atomic_and_fences_c3() {
    // IBA vol. 1 §9.7.6 (the requester keeps at most max_rd_atomic Reads/atomics
    // outstanding, the ORD the responder's resources were sized for); IBV_SEND_FENCE.
    let mut t = Scripted::new(PairConfig {
        max_rd_atomic: 2,
        ..PairConfig::default()
    });
    let mr = t.mr.clone();
    let mut wrs: Vec<_> = (0..3).map(|i| read_wr(i, &mr, 0, 100, &mr, 4096)).collect();
    wrs.push(send_wr(3, &mr, 0, 10).flags(SendFlags::SIGNALED | SendFlags::FENCE));
    let sent = sent_psns(&mut t, &wrs);
    assert_eq!(sent.len(), 2, "two Reads outstanding, the third waits");
    let r0 = sent[0].1;
    let resp = |t: &mut Scripted, psn: Psn| {
        let data = t.mr.to_vec(4096, 100).unwrap();
        t.feed(
            Bth::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, QPN_A, psn),
            ExtHeaders {
                aeth: Some(Aeth {
                    syndrome: Syndrome::ACK,
                    msn: 1,
                }),
                ..ExtHeaders::default()
            },
            &data,
        );
        t.s.poll();
    };
    resp(&mut t, r0);
    assert_eq!(t.s.wcs.len(), 1);
    let next: Vec<_> = t.out().iter().map(|p| (p.0.opcode, p.0.psn)).collect();
    assert_eq!(
        next,
        [(Opcode::RC_RDMA_READ_REQUEST, r0.add(2))],
        "the fenced Send waits"
    );
    resp(&mut t, r0.add(1));
    assert!(t.out().is_empty(), "one Read still outstanding");
    resp(&mut t, r0.add(2));
    let next: Vec<_> = t.out().iter().map(|p| (p.0.opcode, p.0.psn)).collect();
    assert_eq!(next, [(Opcode::RC_SEND_ONLY, r0.add(3))]);
    assert_eq!(t.s.wcs.len(), 3);
    assert!(t.s.wcs.iter().all(|w| w.is_ok() && w.byte_len == 100));
    assert_eq!(t.mr.to_vec(0, 100).unwrap(), t.mr.to_vec(4096, 100).unwrap());
}
