//! The responder: requests from the peer's requester (IBA vol. 1 §9.7.4 receiving and
//! validating requests, §9.7.5 generating ACKs/NAKs, §9.9 errors; rxe's `rxe_resp.c`).
//!
//! Order of the checks on a request (the order rxe and the IBA's flow chart use):
//! 1. PSN against the expected PSN (ePSN, §9.7.4.1): out of sequence (ahead) → one NAK PSN
//!    sequence error carrying ePSN, then silence until ePSN arrives; duplicate (the
//!    2^23 PSNs behind) → `RcQp::on_duplicate`; expected → on.
//! 2. Opcode sequence (a MIDDLE/LAST without FIRST, a new FIRST/ONLY inside a message) and the
//!    payload length against the path MTU → NAK invalid request (§9.7.4.1.6; class C: the QP
//!    goes to ERR).
//! 3. A message that needs a receive WQE without one posted → RNR NAK with `min_rnr_timer`
//!    (§9.7.5.2.8); ePSN does not move, the requester retries the same PSN.
//! 4. R_Key, bounds, rights and PD through [`verbs::mem::MemTable::check`] → NAK remote access
//!    error (§9.7.4.1.5); a misaligned atomic → NAK invalid request.
//! 5. Execute: place Send payload in the receive WQE (too long: LOC_LEN_ERR on the receive and
//!    NAK invalid request; a bad lkey of ours: LOC_PROT_ERR and NAK remote operational
//!    error), place Write payload, queue Read responses, run the atomic.
//! 6. ePSN advances, MSN counts completed messages (§9.7.7 (unconfirmed)), and a request with AckReq is
//!    answered with an ACK carrying the MSN and the credit count of posted receives (§9.7.7 (unconfirmed)).
//!    ACKs queued back to back are coalesced into the last one (§9.7.5.1.2).

use std::collections::VecDeque;
use std::sync::Arc;

use verbs::buffer::Buffer;
use verbs::{Access, QpState, RecvWr, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::{RcAttr, RcError, RcQp, ScatterError, scatter};
use crate::wire::headers::{Aeth, AtomicAckEth, Bth, CreditCode, NakCode, Reth, Syndrome};
use crate::wire::opcode::{MessageKind, OpInfo, Opcode, Operation, Position, sequence_ok};
use crate::wire::psn::PsnClass;
use crate::wire::segment::{check_payload_len, packet_count};
use crate::wire::{ExtHeaders, Packet, Psn};

/// A receive WQE being filled by a multi-packet Send.
pub(crate) struct CurRecv {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
    pub off: u64,
}

/// The Write in progress.
struct WriteTarget {
    buf: Arc<Buffer>,
    off: usize,
    /// Octets still to come.
    remaining: u32,
    total: u32,
}

/// A Read or atomic the responder remembers for duplicates (responder resources, IBA vol. 1
/// §9.7.4, subsection unconfirmed; `max_dest_rd_atomic` of them).
#[derive(Clone, Copy)]
enum Resource {
    Read { psn: Psn, npkts: u32, reth: Reth },
    Atomic { psn: Psn, orig: u64, msn: u32 },
}

/// Read responses being sent.
pub(crate) struct ReadJob {
    psn: Psn,
    next: u32,
    npkts: u32,
    buf: Arc<Buffer>,
    off: usize,
    len: u32,
    msn: u32,
}

/// A response waiting for `poll_transmit`.
pub(crate) enum RespOut {
    Ack { psn: Psn, syndrome: Syndrome, msn: u32 },
    AtomicAck { psn: Psn, orig: u64, msn: u32 },
    Read(ReadJob),
}

/// The responder half of an RC QP: ePSN, MSN, the posted receive WQEs and the Read/atomic responder resources (IRD).
pub struct Responder {
    pub(crate) epsn: Psn,
    pub(crate) msn: u32,
    /// A PSN sequence NAK was sent and ePSN has not arrived since.
    nak_sent: bool,
    /// The last in-sequence request opcode (for the opcode sequence check).
    prev: Option<&'static OpInfo>,
    pub(crate) recvs: VecDeque<RecvWr>,
    pub(crate) cur_recv: Option<CurRecv>,
    write: Option<WriteTarget>,
    resources: VecDeque<Resource>,
    /// The last rkey's registration looked up (issue 13: not the table's lock and hash
    /// per Write, Read or atomic request).
    pub(crate) mr_cache: verbs::mem::MrCache,
    /// The last receive buffer's lkey registration looked up (a Send's scatter), apart
    /// from the rkeys' so that Sends and Writes mixed do not evict each other.
    pub(crate) recv_mr_cache: verbs::mem::MrCache,
    pub(crate) out: VecDeque<RespOut>,
}

/// Why a request is refused with a NAK that ends the connection.
enum Refuse {
    Nak(NakCode),
}

impl Responder {
    pub(crate) fn new(attr: &RcAttr) -> Responder {
        Responder {
            epsn: attr.rq_psn,
            msn: 0,
            nak_sent: false,
            prev: None,
            recvs: VecDeque::new(),
            cur_recv: None,
            write: None,
            resources: VecDeque::new(),
            out: VecDeque::new(),
            mr_cache: verbs::mem::MrCache::default(),
            recv_mr_cache: verbs::mem::MrCache::default(),
        }
    }

    pub(crate) fn reset_psn(&mut self, psn: Psn) {
        self.epsn = psn;
    }

    fn credits(&self) -> CreditCode {
        CreditCode::for_credits(self.recvs.len() as u32)
    }

    /// Queues an ACK; an ACK right behind another replaces it (coalescing, §9.7.5.1.2).
    fn ack(&mut self, psn: Psn) {
        let syndrome = Syndrome::Ack {
            credits: self.credits(),
        };
        if let Some(RespOut::Ack {
            syndrome: Syndrome::Ack { .. },
            ..
        }) = self.out.back()
        {
            self.out.pop_back();
        }
        self.out.push_back(RespOut::Ack {
            psn,
            syndrome,
            msn: self.msn,
        });
    }

    fn nak(&mut self, psn: Psn, syndrome: Syndrome) {
        self.out.push_back(RespOut::Ack {
            psn,
            syndrome,
            msn: self.msn,
        });
    }

    fn remember(&mut self, r: Resource, max: u8) {
        while self.resources.len() >= usize::from(max.max(1)) {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }
}

impl RcQp {
    /// `ibv_post_recv` of one WR.
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), RcError> {
        match self.state {
            QpState::Reset => return Err(RcError::State(QpState::Reset, "post_recv needs INIT or later")),
            QpState::Err => {
                self.completions.push_back(WorkCompletion::new(
                    wr.wr_id,
                    WcStatus::WrFlushErr,
                    WcOpcode::Recv,
                    self.cfg.qpn,
                ));
                return Ok(());
            }
            _ => {}
        }
        if self.resp.recvs.len() >= self.cfg.max_recv_wr {
            return Err(RcError::QueueFull("receive"));
        }
        self.resp.recvs.push_back(wr.clone());
        Ok(())
    }

    /// A request packet from the peer's requester.
    pub(crate) fn on_request(&mut self, pkt: &Packet<'_>, info: &'static OpInfo) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return;
        }
        let psn = pkt.bth.psn;
        match psn.classify(self.resp.epsn) {
            PsnClass::OutOfSequence => {
                self.stats.out_of_sequence_dropped += 1;
                if !self.resp.nak_sent {
                    self.resp.nak_sent = true;
                    self.stats.seq_naks_sent += 1;
                    let e = self.resp.epsn;
                    self.resp.nak(e, Syndrome::Nak(NakCode::PsnSequenceError));
                }
            }
            PsnClass::Duplicate => {
                self.stats.duplicate_requests += 1;
                self.on_duplicate(pkt, info);
            }
            PsnClass::Expected => {
                self.resp.nak_sent = false;
                if let Err(Refuse::Nak(code)) = self.execute(pkt, info) {
                    self.resp.nak(psn, Syndrome::Nak(code));
                    self.enter_error();
                }
            }
        }
    }

    fn execute(&mut self, pkt: &Packet<'_>, info: &'static OpInfo) -> Result<(), Refuse> {
        let psn = pkt.bth.psn;
        if !sequence_ok(self.resp.prev, info) {
            return Err(Refuse::Nak(NakCode::InvalidRequest));
        }
        if check_payload_len(info, pkt.payload.len(), self.attr.path_mtu).is_err() {
            return Err(Refuse::Nak(NakCode::InvalidRequest));
        }
        let (pd, qpn) = (self.cfg.pd, self.cfg.qpn);
        match info.operation {
            Operation::Send => {
                if info.position.starts() {
                    let Some(r) = self.resp.recvs.pop_front() else {
                        return self.rnr(psn);
                    };
                    self.resp.cur_recv = Some(CurRecv {
                        wr_id: r.wr_id,
                        sges: r.sg_list,
                        off: 0,
                    });
                }
                let Some(cur) = self.resp.cur_recv.as_mut() else {
                    return Err(Refuse::Nak(NakCode::InvalidRequest));
                };
                let r = scatter(
                    &self.cfg.mem,
                    &mut self.resp.recv_mr_cache,
                    pd,
                    qpn,
                    &cur.sges,
                    cur.off,
                    pkt.payload,
                );
                cur.off += pkt.payload.len() as u64;
                if r.is_ok() {
                    self.stats.rx_payload_copied += pkt.payload.len() as u64;
                }
                if let Err(e) = r {
                    let cur = self.resp.cur_recv.take().expect("present");
                    let (status, code) = match e {
                        ScatterError::Length => (WcStatus::LocLenErr, NakCode::InvalidRequest),
                        ScatterError::Protection => (WcStatus::LocProtErr, NakCode::RemoteOperationalError),
                    };
                    self.completions
                        .push_back(WorkCompletion::new(cur.wr_id, status, WcOpcode::Recv, qpn));
                    return Err(Refuse::Nak(code));
                }
                if info.position.ends() {
                    let cur = self.resp.cur_recv.take().expect("present");
                    let mut wc = WorkCompletion::new(cur.wr_id, WcStatus::Success, WcOpcode::Recv, qpn);
                    wc.byte_len = cur.off as u32;
                    wc.solicited = pkt.bth.se;
                    if let Some(imm) = pkt.ext.imm_dt {
                        wc.imm_data = Some(imm.imm);
                        wc.wc_flags |= WcFlags::WITH_IMM;
                    }
                    if let Some(ieth) = pkt.ext.ieth {
                        if self.cfg.mem.remote_invalidate(ieth.r_key, pd, qpn).is_err() {
                            wc.status = WcStatus::LocAccessErr;
                            self.completions.push_back(wc);
                            return Err(Refuse::Nak(NakCode::InvalidRequest));
                        }
                        wc.invalidated_rkey = Some(ieth.r_key);
                        wc.wc_flags |= WcFlags::WITH_INV;
                    }
                    self.completions.push_back(wc);
                    self.resp.msn = (self.resp.msn + 1) & Psn::MASK;
                }
            }
            Operation::RdmaWrite => {
                if info.immediate() && self.resp.recvs.is_empty() {
                    return self.rnr(psn);
                }
                if info.position.starts() {
                    let Some(reth) = pkt.ext.reth else {
                        return Err(Refuse::Nak(NakCode::InvalidRequest));
                    };
                    let r = self
                        .cfg
                        .mem
                        .check_cached(
                            &mut self.resp.mr_cache,
                            reth.r_key,
                            pd,
                            qpn,
                            reth.va,
                            u64::from(reth.dma_len),
                            Access::REMOTE_WRITE,
                        )
                        .map_err(|_| Refuse::Nak(NakCode::RemoteAccessError))?;
                    self.resp.write = Some(WriteTarget {
                        buf: r.buffer,
                        off: r.offset,
                        remaining: reth.dma_len,
                        total: reth.dma_len,
                    });
                }
                let Some(w) = self.resp.write.as_mut() else {
                    return Err(Refuse::Nak(NakCode::InvalidRequest));
                };
                let n = pkt.payload.len() as u32;
                if n > w.remaining || (info.position.ends() && n != w.remaining) {
                    self.resp.write = None;
                    return Err(Refuse::Nak(NakCode::InvalidRequest));
                }
                let at = w.off + (w.total - w.remaining) as usize;
                if w.buf.write(at, pkt.payload).is_err() {
                    return Err(Refuse::Nak(NakCode::RemoteAccessError));
                }
                self.stats.rx_payload_copied += pkt.payload.len() as u64;
                w.remaining -= n;
                if info.position.ends() {
                    let total = w.total;
                    self.resp.write = None;
                    if let Some(imm) = pkt.ext.imm_dt {
                        let r = self.resp.recvs.pop_front().expect("checked above");
                        let mut wc = WorkCompletion::new(r.wr_id, WcStatus::Success, WcOpcode::RecvRdmaWithImm, qpn);
                        wc.byte_len = total;
                        wc.imm_data = Some(imm.imm);
                        wc.wc_flags |= WcFlags::WITH_IMM;
                        wc.solicited = pkt.bth.se;
                        self.completions.push_back(wc);
                    }
                    self.resp.msn = (self.resp.msn + 1) & Psn::MASK;
                }
            }
            Operation::RdmaReadRequest => {
                let Some(reth) = pkt.ext.reth else {
                    return Err(Refuse::Nak(NakCode::InvalidRequest));
                };
                let job = self.read_job(psn, reth)?;
                let npkts = job.npkts;
                self.resp.msn = (self.resp.msn + 1) & Psn::MASK;
                let job = ReadJob {
                    msn: self.resp.msn,
                    ..job
                };
                self.resp
                    .remember(Resource::Read { psn, npkts, reth }, self.attr.max_dest_rd_atomic);
                self.resp.out.push_back(RespOut::Read(job));
                self.resp.prev = Some(info);
                self.resp.epsn = psn.add(npkts);
                return Ok(());
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let Some(a) = pkt.ext.atomic_eth else {
                    return Err(Refuse::Nak(NakCode::InvalidRequest));
                };
                if !a.va.is_multiple_of(8) {
                    return Err(Refuse::Nak(NakCode::InvalidRequest));
                }
                let r = self
                    .cfg
                    .mem
                    .check_cached(
                        &mut self.resp.mr_cache,
                        a.r_key,
                        pd,
                        qpn,
                        a.va,
                        8,
                        Access::REMOTE_ATOMIC,
                    )
                    .map_err(|_| Refuse::Nak(NakCode::RemoteAccessError))?;
                let cmp = info.operation == Operation::CompareSwap;
                let orig = r
                    .buffer
                    .atomic_rmw(r.offset, |old| {
                        if cmp {
                            if old == a.compare_data { a.swap_add_data } else { old }
                        } else {
                            old.wrapping_add(a.swap_add_data)
                        }
                    })
                    .map_err(|_| Refuse::Nak(NakCode::InvalidRequest))?;
                self.resp.msn = (self.resp.msn + 1) & Psn::MASK;
                let msn = self.resp.msn;
                self.resp
                    .remember(Resource::Atomic { psn, orig, msn }, self.attr.max_dest_rd_atomic);
                self.resp.out.push_back(RespOut::AtomicAck { psn, orig, msn });
            }
            _ => return Err(Refuse::Nak(NakCode::InvalidRequest)),
        }
        self.resp.prev = Some(info);
        self.resp.epsn = psn.next();
        if pkt.bth.ack_req {
            self.resp.ack(psn);
        }
        Ok(())
    }

    /// RNR NAK (IBA vol. 1 §9.7.5.2.8): no receive WQE; ePSN stays.
    fn rnr(&mut self, psn: Psn) -> Result<(), Refuse> {
        self.stats.rnr_naks_sent += 1;
        let timer = self.attr.min_rnr_timer;
        self.resp.nak(psn, Syndrome::RnrNak { timer });
        Ok(())
    }

    /// Checks a Read request's RETH and makes its response job (at `psn`).
    fn read_job(&mut self, psn: Psn, reth: Reth) -> Result<ReadJob, Refuse> {
        let r = self
            .cfg
            .mem
            .check_cached(
                &mut self.resp.mr_cache,
                reth.r_key,
                self.cfg.pd,
                self.cfg.qpn,
                reth.va,
                u64::from(reth.dma_len),
                Access::REMOTE_READ,
            )
            .map_err(|_| Refuse::Nak(NakCode::RemoteAccessError))?;
        Ok(ReadJob {
            psn,
            next: 0,
            npkts: packet_count(reth.dma_len, self.attr.path_mtu),
            buf: r.buffer,
            off: r.offset,
            len: reth.dma_len,
            msn: self.resp.msn,
        })
    }

    /// A request with a PSN in the past (IBA vol. 1 §9.7.4; subsection and the C9-105 we
    /// cited for Sends/Writes unconfirmed): a
    /// Send/Write is ACKed again (with the latest PSN, coalescing) and not executed; a Read is
    /// executed again from the PSN requested (within the Read it belongs to); an atomic's
    /// saved result is sent again. A Read or atomic older than the responder resources is
    /// dropped.
    fn on_duplicate(&mut self, pkt: &Packet<'_>, info: &'static OpInfo) {
        let psn = pkt.bth.psn;
        match info.operation {
            Operation::Send | Operation::RdmaWrite => {
                let last = self.resp.epsn.sub(1);
                self.resp.ack(last);
            }
            Operation::RdmaReadRequest => {
                let Some(reth) = pkt.ext.reth else { return };
                let mtu = u64::from(self.attr.path_mtu.bytes());
                let found = self.resp.resources.iter().rev().find_map(|r| match *r {
                    Resource::Read {
                        psn: p,
                        npkts,
                        reth: orig,
                    } if psn.in_window(p, npkts) => Some((p, npkts, orig)),
                    _ => None,
                });
                let Some((first, npkts, orig)) = found else { return };
                let skip = u64::from(psn.distance(first) as u32) * mtu;
                // The re-request must name the rest of the original Read.
                if reth.r_key != orig.r_key
                    || reth.va != orig.va.wrapping_add(skip)
                    || u64::from(reth.dma_len) != u64::from(orig.dma_len).saturating_sub(skip)
                {
                    return;
                }
                match self.read_job(psn, reth) {
                    Ok(mut job) => {
                        job.msn = self.resp.msn;
                        // A newer request for the same Read replaces responses still queued.
                        self.resp.out.retain(|o| match o {
                            RespOut::Read(j) => !j.psn.in_window(first, npkts),
                            _ => true,
                        });
                        // It goes before the responses of later Reads still queued: the
                        // requester discards those until this one has arrived, so behind
                        // them (up to IRD whole Reads) it would come too late for the local
                        // ACK timer, and each timeout would queue it behind them again
                        // until RETRY_EXC_ERR (seen on loopback under 1 % loss with 16
                        // outstanding 1 MiB Reads; crates/conformance/tests/roce_faults.rs).
                        let at = self
                            .resp
                            .out
                            .iter()
                            .position(|o| matches!(o, RespOut::Read(j) if j.psn.is_after(psn)))
                            .unwrap_or(self.resp.out.len());
                        self.resp.out.insert(at, RespOut::Read(job));
                    }
                    Err(Refuse::Nak(code)) => {
                        self.resp.nak(psn, Syndrome::Nak(code));
                        self.enter_error();
                    }
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let found = self.resp.resources.iter().rev().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig, msn } if p == psn => Some((orig, msn)),
                    _ => None,
                });
                if let Some((orig, msn)) = found {
                    self.resp.out.push_back(RespOut::AtomicAck { psn, orig, msn });
                }
            }
            _ => {}
        }
    }

    /// The next response packet, if any.
    /// Emits its headers into `buf` and appends the pieces of its payload (a Read
    /// response's) to `pieces`. Returns (header length, payload length).
    pub(crate) fn next_response(&mut self, buf: &mut [u8], pieces: &mut Vec<super::Piece>) -> Option<(usize, usize)> {
        let dest = self.attr.dest_qpn;
        let p_key = self.cfg.p_key;
        let mtu = self.attr.path_mtu.bytes();
        let credits = self.resp.credits();
        let out = self.resp.out.front_mut()?;
        let mut payload = None;
        let mut ext = ExtHeaders::default();
        let (opcode, psn, done) = match out {
            RespOut::Ack { psn, syndrome, msn } => {
                ext.aeth = Some(Aeth {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                (Opcode::RC_ACKNOWLEDGE, *psn, true)
            }
            RespOut::AtomicAck { psn, orig, msn } => {
                ext.aeth = Some(Aeth {
                    syndrome: Syndrome::Ack { credits },
                    msn: *msn,
                });
                ext.atomic_ack_eth = Some(AtomicAckEth { orig_rem_dt: *orig });
                (Opcode::RC_ATOMIC_ACKNOWLEDGE, *psn, true)
            }
            RespOut::Read(j) => {
                let k = j.next;
                let position = match (k == 0, k + 1 == j.npkts) {
                    (true, true) => Position::Only,
                    (true, false) => Position::First,
                    (false, false) => Position::Middle,
                    (false, true) => Position::Last,
                };
                if position != Position::Middle {
                    ext.aeth = Some(Aeth {
                        syndrome: Syndrome::Ack { credits },
                        msn: j.msn,
                    });
                }
                let off = k * mtu;
                let n = (j.len - off.min(j.len)).min(mtu) as usize;
                // In bounds: checked by MemTable::check when the Read arrived.
                payload = Some(super::Piece {
                    buf: j.buf.clone(),
                    off: j.off + off as usize,
                    len: n,
                });
                j.next += 1;
                (
                    Opcode::rc_segment(MessageKind::RdmaReadResponse, position),
                    j.psn.add(k),
                    j.next == j.npkts,
                )
            }
        };
        if done {
            self.resp.out.pop_front();
        }
        let mut bth = Bth::new(opcode, dest, psn);
        bth.p_key = p_key;
        let n = payload.as_ref().map_or(0, |p| p.len);
        // `emit_header` checks the headers against the opcode (once: `Packet::new` would
        // check them a second time) and writes the pad count for the payload.
        let hdr = Packet {
            bth,
            ext,
            payload: &[],
            icrc: 0,
        };
        let r = hdr.emit_header(buf, n).ok().map(|h| (h, n));
        if r.is_some() {
            pieces.extend(payload.filter(|p| p.len > 0));
        }
        r
    }
}
