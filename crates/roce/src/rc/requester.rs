//! The requester: send WQEs into request packets (IBA vol. 1 §9.7.1 PSNs, §9.7.2
//! segmentation, both unconfirmed; §9.2 AckReq; §9.7.6 retransmission; rxe's `rxe_req.c`).
//!
//! The send queue holds every WQE from `post_send` until it completes. A WQE gets its PSN
//! range when it first goes out: one PSN per packet of a Send/Write, one per *response*
//! packet of a Read (§9.7.1 (unconfirmed): a Read request consumes as many PSNs as its responses), one for
//! an atomic. The transmit cursor (WQE index, packet index) walks the queue; go-back-N moves
//! it back to the oldest unacknowledged PSN (a Read is then re-requested from the first
//! response packet missing, with its RETH moved on by the octets already placed as
//! rxe's `req_retry` does).

use std::collections::VecDeque;
use std::time::Instant;

use verbs::{Access, QpState, SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode};

use super::{Piece, RcAttr, RcError, RcQp, Source};
use crate::wire::headers::{AtomicEth, Bth, Ieth, ImmDt, Reth};
use crate::wire::opcode::{MessageKind, Opcode, Position};
use crate::wire::segment::packet_count;
use crate::wire::{ExtHeaders, Packet, Psn};

/// The requester sets AckReq on the last packet of every message and on every this many
/// packets inside a long one, so that the window keeps moving (rxe: `RXE_MAX_PKT_PER_ACK`).
pub const ACK_REQ_EVERY: u32 = 32;

/// What a send WQE does on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeKind {
    Send {
        imm: Option<u32>,
        inv: Option<u32>,
    },
    Write {
        va: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    Read {
        va: u64,
        rkey: u32,
    },
    CmpSwap {
        va: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        va: u64,
        rkey: u32,
        add: u64,
    },
    /// Local operations: no packet, executed when the cursor reaches them.
    Local,
}

impl WqeKind {
    pub(crate) fn is_rd_atomic(&self) -> bool {
        matches!(
            self,
            WqeKind::Read { .. } | WqeKind::CmpSwap { .. } | WqeKind::FetchAdd { .. }
        )
    }
    pub(crate) fn is_atomic(&self) -> bool {
        matches!(self, WqeKind::CmpSwap { .. } | WqeKind::FetchAdd { .. })
    }
}

pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub wr: WrOpcode,
    pub kind: WqeKind,
    pub signaled: bool,
    pub solicited: bool,
    pub fence: bool,
    pub src: Source,
    /// Read/atomic: where the data or original value lands.
    pub sink: Vec<verbs::Sge>,
    pub len: u32,
    /// PSN of the first packet (valid once `started`).
    pub first: Psn,
    /// PSNs the WQE takes (0 for local operations).
    pub npkts: u32,
    pub started: bool,
    /// Read: response packets placed; atomic: 1 once answered.
    pub received: u32,
    /// `Some` once completed (successfully or not).
    pub status: Option<WcStatus>,
}

impl SendWqe {
    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        match &self.wr {
            WrOpcode::Send | WrOpcode::SendWithInv { .. } | WrOpcode::SendWithImm { .. } => WcOpcode::Send,
            WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
            WrOpcode::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
            WrOpcode::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
            WrOpcode::LocalInv { .. } => WcOpcode::LocalInv,
            WrOpcode::RegMr { .. } => WcOpcode::RegMr,
        }
    }
    pub(crate) fn byte_len(&self) -> u32 {
        match self.kind {
            WqeKind::Local => 0,
            WqeKind::CmpSwap { .. } | WqeKind::FetchAdd { .. } => 8,
            _ => self.len,
        }
    }
    /// The last PSN of the WQE.
    pub(crate) fn last(&self) -> Psn {
        self.first.add(self.npkts.saturating_sub(1))
    }
    /// The next PSN whose response a Read/atomic waits for.
    pub(crate) fn expected(&self) -> Psn {
        self.first.add(self.received)
    }
    /// `psn` is one of this started WQE's PSNs.
    pub(crate) fn holds(&self, psn: Psn) -> bool {
        self.started && psn.in_window(self.first, self.npkts)
    }
}

/// The requester's state (the send queue is shared with the completer).
pub struct Requester {
    pub(crate) sq: VecDeque<SendWqe>,
    /// Transmit cursor: index into `sq` and packet index inside that WQE.
    pub(crate) cur: usize,
    pub(crate) cur_pkt: u32,
    /// Oldest PSN not yet known to have arrived.
    pub(crate) una: Psn,
    /// The PSN the next never-sent WQE gets; everything before it has been sent once.
    pub(crate) sent_hi: Psn,
    /// One past the highest PSN put on the wire so far (a Read request covers its responses'
    /// PSNs): responses for PSNs from here on are ghosts.
    pub(crate) sent_max: Psn,
    /// Packets since the last AckReq.
    pub(crate) since_ack_req: u32,
    pub(crate) rd_atomic_outstanding: u32,
    pub(crate) ack_deadline: Option<Instant>,
    pub(crate) rnr_until: Option<Instant>,
    pub(crate) retries_left: u8,
    pub(crate) rnr_retries_left: u8,
    /// The PSN the last NAK-driven go-back went to: further NAKs and implied NAKs for the same
    /// PSN (the rest of the responses of the first try still arriving) do not restart it
    /// until `una` moves or the ACK timer fires (rxe's `comp.started_retry`).
    pub(crate) retrying_from: Option<Psn>,
    /// The last lkey's registration looked up (issue 13: not the table's lock and hash
    /// per posted WR).
    pub(crate) mr_cache: verbs::mem::MrCache,
}

impl Requester {
    pub(crate) fn new(attr: &RcAttr) -> Requester {
        Requester {
            sq: VecDeque::new(),
            cur: 0,
            cur_pkt: 0,
            una: attr.sq_psn,
            sent_hi: attr.sq_psn,
            sent_max: attr.sq_psn,
            since_ack_req: 0,
            rd_atomic_outstanding: 0,
            ack_deadline: None,
            rnr_until: None,
            retries_left: attr.retry_cnt,
            rnr_retries_left: attr.rnr_retry,
            retrying_from: None,
            mr_cache: verbs::mem::MrCache::default(),
        }
    }

    pub(crate) fn reset_psn(&mut self, psn: Psn) {
        if self.sq.iter().all(|w| !w.started) {
            self.una = psn;
            self.sent_hi = psn;
            self.sent_max = psn;
        }
    }

    pub(crate) fn on_error(&mut self) {
        self.cur = 0;
        self.cur_pkt = 0;
        self.rd_atomic_outstanding = 0;
        self.ack_deadline = None;
        self.rnr_until = None;
    }

    /// Whether the transmit cursor has a WQE to go on with: the one it is on, unless that
    /// one is finished or wholly sent (`next_request` then steps over it), or one after it.
    /// `false` means `next_request` would return `None` (it only steps the cursor).
    pub(crate) fn has_unsent(&self) -> bool {
        match self.sq.get(self.cur) {
            None => false,
            Some(w) => self.cur + 1 < self.sq.len() || (w.status.is_none() && !(w.started && self.cur_pkt >= w.npkts)),
        }
    }

    /// Moves the transmit cursor back to `psn` (go-back-N, IBA vol. 1 §9.7.6).
    pub(crate) fn go_back(&mut self, psn: Psn) {
        self.ack_deadline = None;
        for (i, w) in self.sq.iter().enumerate() {
            if w.status.is_none() && w.npkts > 0 && w.holds(psn) {
                self.cur = i;
                self.cur_pkt = psn.distance(w.first) as u32;
                return;
            }
        }
        // Nothing sent holds it: continue with the first WQE never started.
        self.cur = self.sq.iter().position(|w| !w.started).unwrap_or(self.sq.len());
        self.cur_pkt = 0;
    }
}

impl RcQp {
    /// `ibv_post_send` of one WR. Local checks (lkeys of the gather list, sizes) are made
    /// now; a failure completes the WR with `LocProtErr`/`LocLenErr` and moves the QP to ERR
    /// (IBA vol. 1 ch. 10; §10.8.3 unconfirmed). In ERR the WR completes with `WrFlushErr`.
    pub fn post_send(&mut self, wr: &SendWr) -> Result<(), RcError> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            s => return Err(RcError::State(s, "post_send needs RTS")),
        }
        if self.req.sq.len() >= self.cfg.max_send_wr {
            return Err(RcError::QueueFull("send"));
        }
        let signaled = self.cfg.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let kind = match wr.opcode {
            WrOpcode::Send => WqeKind::Send { imm: None, inv: None },
            WrOpcode::SendWithImm { imm_data } => WqeKind::Send {
                imm: Some(imm_data),
                inv: None,
            },
            WrOpcode::SendWithInv { invalidate_rkey } => WqeKind::Send {
                imm: None,
                inv: Some(invalidate_rkey),
            },
            WrOpcode::RdmaWrite { remote } => WqeKind::Write {
                va: remote.addr,
                rkey: remote.rkey,
                imm: None,
            },
            WrOpcode::RdmaWriteWithImm { remote, imm_data } => WqeKind::Write {
                va: remote.addr,
                rkey: remote.rkey,
                imm: Some(imm_data),
            },
            WrOpcode::RdmaRead { remote } => WqeKind::Read {
                va: remote.addr,
                rkey: remote.rkey,
            },
            WrOpcode::AtomicCmpSwap { remote, compare, swap } => WqeKind::CmpSwap {
                va: remote.addr,
                rkey: remote.rkey,
                compare,
                swap,
            },
            WrOpcode::AtomicFetchAdd { remote, add } => WqeKind::FetchAdd {
                va: remote.addr,
                rkey: remote.rkey,
                add,
            },
            WrOpcode::LocalInv { .. } | WrOpcode::RegMr { .. } => WqeKind::Local,
        };
        let mut w = SendWqe {
            wr_id: wr.wr_id,
            wr: wr.opcode.clone(),
            kind,
            signaled,
            solicited: wr.flags.contains(SendFlags::SOLICITED),
            fence: wr.flags.contains(SendFlags::FENCE),
            src: Source::empty(),
            sink: Vec::new(),
            len: 0,
            first: Psn::new(0),
            npkts: 0,
            started: false,
            received: 0,
            status: None,
        };
        if self.state == QpState::Err {
            self.completions.push_back(WorkCompletion::new(
                w.wr_id,
                WcStatus::WrFlushErr,
                w.wc_opcode(),
                self.cfg.qpn,
            ));
            return Ok(());
        }
        let total = wr.len();
        // Messages up to 2^31 octets (rxe's max_msg_sz); an atomic's result is one 8-octet SGE.
        let too_long = total > u64::from(u32::MAX >> 1);
        let bad_atomic = kind.is_atomic() && (total != 8 || wr.sg_list.len() != 1);
        let local_err = (too_long || bad_atomic).then_some(WcStatus::LocLenErr);
        w.len = total as u32;
        let mut status = local_err;
        match kind {
            WqeKind::Local => {}
            WqeKind::Read { .. } | WqeKind::CmpSwap { .. } | WqeKind::FetchAdd { .. } => {
                w.sink = wr.sg_list.clone();
                // Checked now (and again when the data lands): LOCAL_WRITE on every SGE.
                for s in &wr.sg_list {
                    if self
                        .cfg
                        .mem
                        .check_cached(
                            &mut self.req.mr_cache,
                            s.lkey,
                            self.cfg.pd,
                            self.cfg.qpn,
                            s.addr,
                            u64::from(s.length),
                            Access::LOCAL_WRITE,
                        )
                        .is_err()
                    {
                        status = status.or(Some(WcStatus::LocProtErr));
                    }
                }
            }
            _ if wr.flags.contains(SendFlags::INLINE) => {
                // Inline: the SGEs are plain addresses of this process; here (no raw
                // pointers) they name registered memory all the same, copied now.
                let mut v = vec![0; total as usize];
                match self.gather(&wr.sg_list) {
                    Ok(s) => s.copy_out(0, &mut v),
                    Err(e) => status = status.or(Some(e)),
                }
                w.src = Source::owned(v);
            }
            _ => match self.gather(&wr.sg_list) {
                Ok(s) => w.src = s,
                Err(e) => status = status.or(Some(e)),
            },
        }
        if let Some(s) = status {
            w.status = Some(s);
            self.req.sq.push_back(w);
            self.drain_done();
            self.enter_error();
            return Ok(());
        }
        self.req.sq.push_back(w);
        Ok(())
    }

    fn gather(&mut self, sges: &[verbs::Sge]) -> Result<Source, WcStatus> {
        let (mem, cache) = (&self.cfg.mem, &mut self.req.mr_cache);
        let (pd, qpn) = (self.cfg.pd, self.cfg.qpn);
        let mut piece = |s: &verbs::Sge| -> Result<Piece, WcStatus> {
            let r = mem
                .check_cached(cache, s.lkey, pd, qpn, s.addr, u64::from(s.length), Access::LOCAL_READ)
                .map_err(|_| WcStatus::LocProtErr)?;
            Ok(Piece {
                buf: r.buffer,
                off: r.offset,
                len: s.length as usize,
            })
        };
        // One SGE (the common post): held inline, no list allocated.
        if let [s] = sges {
            return Ok(Source::One(piece(s)?));
        }
        let mut pieces = Vec::with_capacity(sges.len());
        for s in sges {
            pieces.push(piece(s)?);
        }
        Ok(Source::Pieces(pieces))
    }

    /// Completes finished WQEs at the head of the send queue, in order (IBA vol. 1
    /// ch. 10, §10.8.5 unconfirmed: completions are returned in the order the WRs were posted).
    pub(crate) fn drain_done(&mut self) {
        while let Some(w) = self.req.sq.front() {
            let Some(status) = w.status else { break };
            let w = self.req.sq.pop_front().expect("front exists");
            if self.req.cur == 0 {
                // The cursor was on the WQE that left: it continues with the next one's first
                // packet, where it would have gone anyway.
                self.req.cur_pkt = 0;
            } else {
                self.req.cur -= 1;
            }
            if w.signaled || status != WcStatus::Success {
                let mut wc = WorkCompletion::new(w.wr_id, status, w.wc_opcode(), self.cfg.qpn);
                if status == WcStatus::Success {
                    wc.byte_len = w.byte_len();
                }
                self.completions.push_back(wc);
            }
        }
    }

    /// Marks WQE `i` done; an error status moves the QP to ERR.
    pub(crate) fn finish(&mut self, i: usize, status: WcStatus) {
        let w = &mut self.req.sq[i];
        if w.status.is_some() {
            return;
        }
        w.status = Some(status);
        if w.kind.is_rd_atomic() && w.started {
            self.req.rd_atomic_outstanding = self.req.rd_atomic_outstanding.saturating_sub(1);
        }
        self.drain_done();
        if status != WcStatus::Success {
            self.enter_error();
        }
    }

    /// Runs a local operation (LocalInv, RegMr) when the cursor reaches it.
    fn run_local(&mut self, i: usize) {
        let (pd, qpn) = (self.cfg.pd, self.cfg.qpn);
        let status = match self.req.sq[i].wr {
            WrOpcode::LocalInv { rkey } => match self.cfg.mem.local_invalidate(rkey, pd) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::MwBindErr,
            },
            WrOpcode::RegMr {
                mr_stag,
                key,
                source_lkey,
                source_addr,
                length,
                iova,
                access,
            } => match self
                .cfg
                .mem
                .check(source_lkey, pd, qpn, source_addr, length, Access::LOCAL_READ)
            {
                Ok(r) => {
                    match self
                        .cfg
                        .mem
                        .fast_register(mr_stag, pd, key, r.buffer, r.offset, iova, length, access)
                    {
                        Ok(_) => WcStatus::Success,
                        Err(_) => WcStatus::MwBindErr,
                    }
                }
                Err(_) => WcStatus::LocProtErr,
            },
            _ => WcStatus::LocQpOpErr,
        };
        self.req.sq[i].started = true;
        self.finish(i, status);
    }

    /// The next request packet, if the window, the Read/atomic limit, a fence or an RNR wait
    /// allow one.
    ///
    /// In SQD only the WQEs already started go on (their remaining packets and
    /// retransmissions); the next unstarted one waits for RTS (IBA vol. 1 §10.3, SQ drain).
    pub(crate) fn next_request(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        pieces: &mut Vec<super::Piece>,
    ) -> Option<(usize, usize)> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.rnr_until.is_some() {
            return None;
        }
        let draining = self.state == QpState::Sqd;
        loop {
            let i = self.req.cur;
            let w = self.req.sq.get(i)?;
            if w.status.is_some() || (w.started && self.req.cur_pkt >= w.npkts) {
                self.req.cur += 1;
                self.req.cur_pkt = 0;
                continue;
            }
            if draining && !w.started {
                return None;
            }
            if w.kind == WqeKind::Local {
                // Local operations wait for earlier WQEs to be sent (ordering); a fence
                // waits for earlier Reads/atomics to complete.
                if w.fence && self.req.rd_atomic_outstanding > 0 {
                    return None;
                }
                self.run_local(i);
                if self.state != QpState::Rts {
                    return None;
                }
                continue;
            }
            if !w.started {
                if w.fence && self.req.rd_atomic_outstanding > 0 {
                    return None;
                }
                if w.kind.is_rd_atomic() {
                    if self.req.rd_atomic_outstanding >= u32::from(self.attr.max_rd_atomic.max(1)) {
                        return None;
                    }
                    self.req.rd_atomic_outstanding += 1;
                }
                let npkts = match w.kind {
                    WqeKind::CmpSwap { .. } | WqeKind::FetchAdd { .. } => 1,
                    _ => packet_count(w.len, self.attr.path_mtu),
                };
                let first = self.req.sent_hi;
                let w = &mut self.req.sq[i];
                w.first = first;
                w.npkts = npkts;
                w.started = true;
                self.req.sent_hi = first.add(npkts);
                self.req.cur_pkt = 0;
            }
            let w = &self.req.sq[i];
            let psn = w.first.add(self.req.cur_pkt);
            // The window of unacknowledged PSNs (a Read counts its response packets).
            if psn.distance(self.req.una) as i64 >= i64::from(self.cfg.window) {
                return None;
            }
            let retransmit = psn.is_before(self.req.sent_max);
            let len = self.emit_request(i, buf, pieces)?;
            if retransmit {
                self.stats.retransmitted_packets += 1;
            }
            self.stats.packets_sent += 1;
            if self.req.ack_deadline.is_none()
                && let Some(t) = self.attr.ack_timeout()
            {
                self.req.ack_deadline = Some(now + t);
            }
            return Some(len);
        }
    }

    /// Emits the headers of the packet at the cursor into `buf`, appends the pieces of its
    /// payload to `pieces` and moves the cursor on. Returns (header length, payload length).
    fn emit_request(&mut self, i: usize, buf: &mut [u8], pieces: &mut Vec<super::Piece>) -> Option<(usize, usize)> {
        let mtu = self.attr.path_mtu.bytes();
        let dest = self.attr.dest_qpn;
        let p_key = self.cfg.p_key;
        let k = self.req.cur_pkt;
        let w = &self.req.sq[i];
        let psn = w.first.add(k);
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, dest, psn);
        bth.p_key = p_key;
        let mut ext = ExtHeaders::default();
        let mut payload = (0, 0);
        let next_pkt;
        let mut ends = true;
        match w.kind {
            WqeKind::Send { .. } | WqeKind::Write { .. } => {
                let off = k * mtu;
                let n = (w.len - off.min(w.len)).min(mtu);
                let position = match (k == 0, k + 1 == w.npkts) {
                    (true, true) => Position::Only,
                    (true, false) => Position::First,
                    (false, false) => Position::Middle,
                    (false, true) => Position::Last,
                };
                ends = position.ends();
                let mk = match w.kind {
                    WqeKind::Send { imm: Some(_), .. } => MessageKind::SendWithImm,
                    WqeKind::Send { inv: Some(_), .. } => MessageKind::SendWithInv,
                    WqeKind::Send { .. } => MessageKind::Send,
                    WqeKind::Write { imm: Some(_), .. } => MessageKind::RdmaWriteWithImm,
                    _ => MessageKind::RdmaWrite,
                };
                bth.opcode = Opcode::rc_segment(mk, position);
                if ends {
                    match w.kind {
                        WqeKind::Send { imm: Some(imm), .. } | WqeKind::Write { imm: Some(imm), .. } => {
                            ext.imm_dt = Some(ImmDt { imm })
                        }
                        WqeKind::Send { inv: Some(r_key), .. } => ext.ieth = Some(Ieth { r_key }),
                        _ => {}
                    }
                    bth.se =
                        w.solicited && matches!(w.kind, WqeKind::Send { .. } | WqeKind::Write { imm: Some(_), .. });
                }
                if let WqeKind::Write { va, rkey, .. } = w.kind
                    && position.starts()
                {
                    ext.reth = Some(Reth {
                        va,
                        r_key: rkey,
                        dma_len: w.len,
                    });
                }
                payload = (off as usize, n as usize);
                next_pkt = k + 1;
            }
            WqeKind::Read { va, rkey } => {
                bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
                let off = (k * mtu).min(w.len);
                ext.reth = Some(Reth {
                    va: va.wrapping_add(u64::from(off)),
                    r_key: rkey,
                    dma_len: w.len - off,
                });
                next_pkt = w.npkts;
            }
            WqeKind::CmpSwap {
                va,
                rkey,
                compare,
                swap,
            } => {
                bth.opcode = Opcode::RC_COMPARE_SWAP;
                ext.atomic_eth = Some(AtomicEth {
                    va,
                    r_key: rkey,
                    swap_add_data: swap,
                    compare_data: compare,
                });
                next_pkt = 1;
            }
            WqeKind::FetchAdd { va, rkey, add } => {
                bth.opcode = Opcode::RC_FETCH_ADD;
                ext.atomic_eth = Some(AtomicEth {
                    va,
                    r_key: rkey,
                    swap_add_data: add,
                    compare_data: 0,
                });
                next_pkt = 1;
            }
            WqeKind::Local => unreachable!("local operations are run, not sent"),
        }
        self.req.since_ack_req += 1;
        if ends || self.req.since_ack_req >= ACK_REQ_EVERY {
            bth.ack_req = true;
            self.req.since_ack_req = 0;
        }
        // `emit_header` checks the headers against the opcode (once: `Packet::new` would
        // check them a second time) and writes the pad count for the payload.
        let hdr = Packet {
            bth,
            ext,
            payload: &[],
            icrc: 0,
        };
        let r = hdr.emit_header(buf, payload.1).ok().map(|h| (h, payload.1));
        if r.is_some() {
            self.req.sq[i].src.each_piece(payload.0, payload.1, |p| pieces.push(p));
            self.req.cur_pkt = next_pkt;
            let hw = psn.add(next_pkt - k);
            if hw.is_after(self.req.sent_max) {
                self.req.sent_max = hw;
            }
        }
        r
    }
}
