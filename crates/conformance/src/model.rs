//! Model-based property test: a random mix of Sends (plain, solicited, inline,
//! multi-SGE, zero-length), Writes, Writes with immediate, Reads, immediate
//! data, and both atomics, posted back to back on one QP of a real loopback
//! connection of the provider under test, then checked against a plain in-memory model of both ends.
//!
//! What the model asserts: every work request completes successfully and the
//! requester's completions come in posting order (RDMAP-ORD-15); receives
//! complete in Send order with the right length, data, immediate and SE
//! (RDMAP-SND-02/03, ORD-10); a Read returns what the earlier Writes on the
//! same stream left (RDMAP-ORD-12); atomics return the value the model
//! predicts and leave the right one behind (RFC 7306 §5); the final remote
//! memory equals the model's.

use crate::{Caps, Fixture, T, pair_with};
use proptest::prelude::*;
use verbs::*;

const SRC: usize = 192 << 10; // A's source area (never changes)
const DATA: usize = 192 << 10; // B's data area (target of Writes, source of Reads)
const MAX_LEN: usize = 70_000; // > one FPDU: multi-segment messages
const ATOMICS: usize = 8;

/// One work request of the mix.
#[allow(missing_docs)]
#[derive(Debug, Clone)]
pub enum Op {
    Send {
        off: usize,
        len: usize,
        se: bool,
        split: bool,
    },
    SendInline {
        off: usize,
        len: usize,
    },
    Imm {
        imm: u32,
        se: bool,
    },
    Write {
        src: usize,
        dst: usize,
        len: usize,
    },
    WriteImm {
        src: usize,
        dst: usize,
        len: usize,
        imm: u32,
    },
    Read {
        src: usize,
        len: usize,
    },
    FetchAdd {
        slot: usize,
        add: u64,
    },
    CmpSwap {
        slot: usize,
        equal: bool,
        swap: u64,
    },
}

fn span(area: usize) -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just(0usize), 1usize..64, 64usize..4096, 4096usize..MAX_LEN]
        .prop_flat_map(move |len| (0..=area - len, Just(len)))
}

/// A random work request.
pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (span(SRC), any::<bool>(), any::<bool>()).prop_map(|((off, len), se, split)| Op::Send { off, len, se, split }),
        1 => (0usize..SRC - 256, 0usize..=256).prop_map(|(off, len)| Op::SendInline { off, len }),
        1 => (any::<u32>(), any::<bool>()).prop_map(|(imm, se)| Op::Imm { imm, se }),
        3 => (span(SRC), 0usize..DATA).prop_map(|((src, len), d)| Op::Write { src, dst: d.min(DATA - len), len }),
        1 => (span(SRC), 0usize..DATA, any::<u32>())
            .prop_map(|((src, len), d, imm)| Op::WriteImm { src, dst: d.min(DATA - len), len, imm }),
        3 => span(DATA).prop_map(|(src, len)| Op::Read { src, len }),
        1 => (0..ATOMICS, any::<u64>()).prop_map(|(slot, add)| Op::FetchAdd { slot, add }),
        1 => (0..ATOMICS, any::<bool>(), any::<u64>()).prop_map(|(slot, equal, swap)| Op::CmpSwap { slot, equal, swap }),
    ]
}

fn fill(mr: &MemoryRegion, seed: u8) -> Vec<u8> {
    let v: Vec<u8> = (0..mr.len())
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed ^ (i >> 9) as u8))
        .collect();
    mr.write(0, &v).unwrap();
    v
}

/// What a receive at B should show.
struct ExpectRecv {
    data: Vec<u8>,
    /// `byte_len` of the completion when it differs from `data.len()`.
    byte_len: Option<usize>,
    imm: Option<u32>,
    with_write: bool,
    se: bool,
}

/// Runs `ops` on a fresh pair opened with device variant `variant` (index
/// into [`Fixture::variants`], taken modulo their number) and checks the
/// model.
pub fn run(fx: &dyn Fixture, ops: &[Op], variant: usize) -> Result<(), TestCaseError> {
    let vs = fx.variants();
    let p = pair_with(fx, &vs[variant % vs.len()], &Caps::default());
    let iwarp = fx.transport() == Transport::Iwarp;
    let src = p.ea.pd.reg_mr(SRC, Access::LOCAL_WRITE).unwrap();
    let src_model = fill(&src, 1);
    let data = p.eb.pd.reg_mr(DATA, Access::all_remote()).unwrap();
    let mut data_model = fill(&data, 2);
    let atom = p.eb.pd.reg_mr(ATOMICS * 8, Access::all_remote()).unwrap();
    let mut atom_model: Vec<u64> = (0..ATOMICS as u64).map(|i| i * 0x1111_0000_0001).collect();
    for (i, v) in atom_model.iter().enumerate() {
        atom.write(i * 8, &v.to_ne_bytes()).unwrap();
    }
    // One sink slot per op at A (Read data, atomic results), one receive slot per op at B.
    let sink = p.ea.pd.reg_mr(ops.len().max(1) * MAX_LEN, Access::LOCAL_WRITE).unwrap();
    let rbuf = p.eb.pd.reg_mr(ops.len().max(1) * MAX_LEN, Access::LOCAL_WRITE).unwrap();
    let recvs = ops
        .iter()
        .filter(|o| {
            matches!(
                o,
                Op::Send { .. } | Op::SendInline { .. } | Op::Imm { .. } | Op::WriteImm { .. }
            )
        })
        .count();
    let rwrs: Vec<RecvWr> = (0..recvs)
        .map(|i| RecvWr {
            wr_id: i as u64,
            // Two SGEs: the scatter path is exercised too.
            sg_list: vec![
                rbuf.sge(i * MAX_LEN, 1000),
                rbuf.sge(i * MAX_LEN + 1000, (MAX_LEN - 1000) as u32),
            ],
        })
        .collect();
    p.b.post_recv(&rwrs).unwrap();

    let mut wrs = Vec::new();
    let mut expect_recv = Vec::new();
    let mut expect_sink: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut expect_atomic: Vec<(usize, u64)> = Vec::new();
    let rem = |base: &MemoryRegion, off: usize| RemoteAddr {
        addr: base.addr() + off as u64,
        rkey: base.rkey(),
    };
    // iWARP's receiver reports RecvRdmaWithImm for Immediate Data that
    // directly follows a Write among the requester's messages (README: iWARP
    // cannot tell Write+Immediate from Write then Send-with-immediate); the
    // InfiniBand transport has distinct opcodes and reports Recv.
    let mut prev_write = false;
    // A.4.5: a Write posted after a Read may be placed before the Read
    // Response is generated. Where a Write overlaps the source of a Read
    // still in flight, the model fences it (IBV_SEND_FENCE), as an
    // application must.
    let mut unfenced_reads: Vec<(usize, usize)> = Vec::new();
    let fence_if_overlap = |dst: usize, len: usize, reads: &mut Vec<(usize, usize)>| {
        let hit = reads.iter().any(|&(s, l)| dst < s + l && s < dst + len);
        if hit {
            reads.clear();
            SendFlags::SIGNALED | SendFlags::FENCE
        } else {
            SendFlags::SIGNALED
        }
    };
    for (i, o) in ops.iter().enumerate() {
        let id = i as u64;
        let after_write = std::mem::replace(&mut prev_write, matches!(o, Op::Write { .. }));
        let slot = i * MAX_LEN;
        let wr = match *o {
            Op::Send { off, len, se, split } => {
                expect_recv.push(ExpectRecv {
                    data: src_model[off..off + len].to_vec(),
                    byte_len: None,
                    imm: None,
                    with_write: false,
                    se,
                });
                let sges = if split && len > 1 {
                    vec![
                        src.sge(off, (len / 2) as u32),
                        src.sge(off + len / 2, (len - len / 2) as u32),
                    ]
                } else {
                    vec![src.sge(off, len as u32)]
                };
                let f = if se {
                    SendFlags::SIGNALED | SendFlags::SOLICITED
                } else {
                    SendFlags::SIGNALED
                };
                SendWr::new(id, WrOpcode::Send, sges).flags(f)
            }
            Op::SendInline { off, len } => {
                expect_recv.push(ExpectRecv {
                    data: src_model[off..off + len].to_vec(),
                    byte_len: None,
                    imm: None,
                    with_write: false,
                    se: false,
                });
                SendWr::new(id, WrOpcode::Send, vec![src.sge(off, len as u32)])
                    .flags(SendFlags::SIGNALED | SendFlags::INLINE)
            }
            Op::Imm { imm, se } => {
                expect_recv.push(ExpectRecv {
                    data: vec![],
                    byte_len: None,
                    imm: Some(imm),
                    with_write: after_write && iwarp,
                    se,
                });
                let f = if se {
                    SendFlags::SIGNALED | SendFlags::SOLICITED
                } else {
                    SendFlags::SIGNALED
                };
                SendWr::new(id, WrOpcode::SendWithImm { imm_data: imm }, vec![]).flags(f)
            }
            Op::Write { src: s, dst, len } => {
                data_model[dst..dst + len].copy_from_slice(&src_model[s..s + len]);
                let f = fence_if_overlap(dst, len, &mut unfenced_reads);
                SendWr::new(
                    id,
                    WrOpcode::RdmaWrite {
                        remote: rem(&data, dst),
                    },
                    vec![src.sge(s, len as u32)],
                )
                .flags(f)
            }
            Op::WriteImm { src: s, dst, len, imm } => {
                data_model[dst..dst + len].copy_from_slice(&src_model[s..s + len]);
                // rdma-core: the Write's length on the InfiniBand
                // transport; iWARP's Immediate Data message carries none.
                expect_recv.push(ExpectRecv {
                    data: vec![],
                    byte_len: (!iwarp).then_some(len),
                    imm: Some(imm),
                    with_write: true,
                    se: false,
                });
                SendWr::new(
                    id,
                    WrOpcode::RdmaWriteWithImm {
                        remote: rem(&data, dst),
                        imm_data: imm,
                    },
                    vec![src.sge(s, len as u32)],
                )
                .flags(fence_if_overlap(dst, len, &mut unfenced_reads))
            }
            Op::Read { src: s, len } => {
                unfenced_reads.push((s, len));
                expect_sink.push((slot, data_model[s..s + len].to_vec()));
                SendWr::new(
                    id,
                    WrOpcode::RdmaRead { remote: rem(&data, s) },
                    vec![sink.sge(slot, len as u32)],
                )
            }
            Op::FetchAdd { slot: k, add } => {
                expect_atomic.push((slot, atom_model[k]));
                atom_model[k] = atom_model[k].wrapping_add(add);
                SendWr::new(
                    id,
                    WrOpcode::AtomicFetchAdd {
                        remote: rem(&atom, k * 8),
                        add,
                    },
                    vec![sink.sge(slot, 8)],
                )
            }
            Op::CmpSwap { slot: k, equal, swap } => {
                let compare = if equal { atom_model[k] } else { atom_model[k] ^ 0x8000 };
                expect_atomic.push((slot, atom_model[k]));
                if equal {
                    atom_model[k] = swap;
                }
                SendWr::new(
                    id,
                    WrOpcode::AtomicCmpSwap {
                        remote: rem(&atom, k * 8),
                        compare,
                        swap,
                    },
                    vec![sink.sge(slot, 8)],
                )
            }
        };
        wrs.push(wr);
    }
    // Post in a few batches, as an application would.
    for chunk in wrs.chunks(7) {
        p.a.post_send(chunk).unwrap();
    }
    // RDMAP-ORD-15: requester completions in posting order, all successful.
    for (i, op) in ops.iter().enumerate() {
        let wc = p.cq_a().wait(Some(T)).expect("a requester completion");
        prop_assert_eq!(wc.status, WcStatus::Success, "op {} {:?}", i, op);
        prop_assert_eq!(wc.wr_id, i as u64, "completions in posting order");
    }
    // Receives in Send order, with the model's content.
    for (i, e) in expect_recv.iter().enumerate() {
        let wc = p.cq_b().wait(Some(T)).expect("a receive completion");
        prop_assert_eq!(wc.status, WcStatus::Success);
        prop_assert_eq!(wc.wr_id, i as u64, "receives in order");
        prop_assert_eq!(wc.byte_len as usize, e.byte_len.unwrap_or(e.data.len()));
        prop_assert_eq!(wc.imm_data, e.imm);
        prop_assert_eq!(wc.solicited, e.se);
        let want = if e.with_write {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        };
        prop_assert_eq!(wc.opcode, want);
        prop_assert!(
            rbuf.to_vec(i * MAX_LEN, e.data.len()).unwrap() == e.data,
            "receive {} data",
            i
        );
    }
    prop_assert!(p.cq_b().poll_one().is_none(), "no extra receive completions");
    for (slot, want) in &expect_sink {
        prop_assert!(
            &sink.to_vec(*slot, want.len()).unwrap() == want,
            "Read into slot {} (ORD-12)",
            slot / MAX_LEN
        );
    }
    for (slot, want) in &expect_atomic {
        let got = u64::from_ne_bytes(sink.to_vec(*slot, 8).unwrap().try_into().unwrap());
        prop_assert_eq!(got, *want, "atomic original value, slot {}", slot / MAX_LEN);
    }
    for (k, want) in atom_model.iter().enumerate() {
        let got = u64::from_ne_bytes(atom.to_vec(k * 8, 8).unwrap().try_into().unwrap());
        prop_assert_eq!(got, *want, "atomic word {} after all ops", k);
    }
    // A local Write completion does not mean remote placement (RFC 5040
    // §5.5 rule 9); a Read issued after the Writes returns only once they
    // are placed (RDMAP-ORD-12). Then the remote area must equal the model.
    let fence = SendWr::new(
        u64::MAX,
        WrOpcode::RdmaRead { remote: rem(&data, 0) },
        vec![sink.sge(0, 1)],
    );
    p.a.post_send_one(fence).unwrap();
    prop_assert_eq!(p.cq_a().wait(Some(T)).map(|w| w.status), Some(WcStatus::Success));
    prop_assert!(
        data.to_vec(0, DATA).unwrap() == data_model,
        "remote data area equals the model"
    );
    Ok(())
}
