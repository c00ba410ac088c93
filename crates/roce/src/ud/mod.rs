//! The UD transport of one queue pair as a sans-I/O core (IBA vol. 1 §9.8 unreliable
//! services, Q_Keys §10.2.5 unconfirmed; RoCEv2 annex A17), driven like [`crate::rc::RcQp`]:
//!
//! ```text
//!  post_send(wr) / post_recv(wr) / modify(attr)
//!  handle_packet(&Packet, &grh)   -- a parsed, ICRC-checked UD packet and its GRH area
//!  poll_transmit(&mut buf)        -- the next datagram: where it goes, its length
//!  poll_completion()              -- work completions, send and receive
//! ```
//!
//! Send: a Send / Send with Immediate WR with a [`verbs::UdDest`] becomes one UD SEND_ONLY
//! (0x64) or SEND_ONLY_WITH_IMMEDIATE (0x65) packet: BTH (destination QPN of the WR,
//! P_Key 0xffff, this QP's next PSN — UD PSNs count per QP and nobody checks them), DETH
//! (the WR's Q_Key, or this QP's own Q_Key when the WR's has the high bit set, IBA
//! vol. 1 §10.2.5, unconfirmed; source QPN), ImmDt. A payload longer than the port MTU is refused at post time
//! (`WrError::TooLong`), as are bad lkeys (`WrError::LocalProtection`) and other opcodes
//! (`WrError::Opcode`); nothing a WR can carry moves a UD QP to ERR. The send completes when
//! the datagram is handed over ([`UdQp::poll_transmit`]): datagrams are never acknowledged.
//!
//! Receive, in rxe's order (`rxe_recv.c` `check_keys`, then `rxe_resp.c`): not RTR/RTS/SQD
//! → dropped (`state_dropped`); not a UD opcode → dropped (`opcode_dropped`); P_Key not the
//! default partition → dropped (`pkey_dropped`); DETH Q_Key ≠ the QP's → dropped
//! (`qkey_dropped`); no receive posted → dropped (`rq_empty_dropped`, rxe's
//! `rcvd_rnr_err`-free UD path). Otherwise the receive WQE takes the 40-octet GRH area
//! ([`grh`]) and the payload; its completion has `byte_len` = 40 + payload, `src_qp`, the
//! `GRH` flag, `WITH_IMM` and the immediate. A message longer than the receive buffer
//! completes that WQE with `LocLenErr` (counted as `len_errors`); the QP stays up (a
//! datagram peer cannot take a UD QP down).
//!
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` C2 (UD for IPoIB) and D3.

pub mod grh;

use std::collections::VecDeque;
use std::sync::Arc;

use verbs::mem::MemTable;
use verbs::{
    Access, AhAttr, Mtu, QpAttr, QpState, RecvWr, SendFlags, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion,
    WrError, WrOpcode,
};

use crate::rc::{Piece, ScatterError, Source, scatter};
use crate::wire::{Bth, DEFAULT_PKEY, Deth, ExtHeaders, ImmDt, Opcode, Packet, Psn};

/// The destination QPN of a multicast send (0xFFFFFF, as IPoIB's multicast LLA carries it).
pub const MCAST_QPN: u32 = 0x00ff_ffff;

/// An address handle of a RoCEv2 device: its address vector, nothing resolved (the
/// kernel's routing and neighbour tables do what an IB AH's LID and SL do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdAh(pub AhAttr);

impl verbs::ah::AhOps for UdAh {
    fn attr(&self) -> AhAttr {
        self.0
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// What the core is created with.
#[derive(Clone)]
pub struct UdConfig {
    /// Our QP number (24 bits).
    pub qpn: u32,
    /// The protection domain every memory access is checked against.
    pub pd: u32,
    /// The device's memory table.
    pub mem: Arc<MemTable>,
    /// Every send WR completes, as if SIGNALED were set.
    pub sq_sig_all: bool,
    /// Send WRs not yet transmitted at most.
    pub max_send_wr: usize,
    /// Receive WRs queued at most.
    pub max_recv_wr: usize,
    /// The port's active MTU: the largest UD payload.
    pub mtu: Mtu,
}

impl UdConfig {
    /// QP `qpn` in PD `pd`: 4096 send and receive WRs, MTU 1024, `sq_sig_all` off.
    pub fn new(qpn: u32, pd: u32, mem: Arc<MemTable>) -> UdConfig {
        UdConfig {
            qpn,
            pd,
            mem,
            sq_sig_all: false,
            max_send_wr: 4096,
            max_recv_wr: 4096,
            mtu: Mtu::Mtu1024,
        }
    }
}

/// Counters of one UD QP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdStats {
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams delivered into a receive WQE (successfully or with `LocLenErr`).
    pub received: u64,
    /// Dropped: the DETH Q_Key was not the QP's.
    pub qkey_dropped: u64,
    /// Dropped: the BTH P_Key was not the default partition.
    pub pkey_dropped: u64,
    /// Dropped: no receive WQE was posted.
    pub rq_empty_dropped: u64,
    /// Dropped: the QP was not in RTR/RTS/SQD.
    pub state_dropped: u64,
    /// Dropped: not a UD opcode (or no DETH).
    pub opcode_dropped: u64,
    /// Received messages longer than the receive buffer (WQE completed with `LocLenErr`).
    pub len_errors: u64,
}

impl UdStats {
    /// Adds `o` into `self` (device totals).
    pub fn add(&mut self, o: &UdStats) {
        self.sent += o.sent;
        self.received += o.received;
        self.qkey_dropped += o.qkey_dropped;
        self.pkey_dropped += o.pkey_dropped;
        self.rq_empty_dropped += o.rq_empty_dropped;
        self.state_dropped += o.state_dropped;
        self.opcode_dropped += o.opcode_dropped;
        self.len_errors += o.len_errors;
    }
}

/// Why a post or modify was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UdError {
    /// The QP's state does not take the call.
    #[error("QP in state {0:?}: {1}")]
    State(QpState, &'static str),
    /// The queue is full.
    #[error("{0} queue full")]
    QueueFull(&'static str),
    /// The work request was refused (typed as rdma-core's `bad_wr`).
    #[error(transparent)]
    Wr(#[from] WrError),
}

/// Where a datagram from [`UdQp::poll_transmit`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdTx {
    /// The address vector of the WR's address handle.
    pub ah: AhAttr,
    /// Octets of the packet written (BTH to ICRC; the ICRC field is left 0).
    pub len: usize,
}

/// What happened to a received packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxOutcome {
    /// Placed into a receive WQE (its completion is queued).
    Delivered,
    /// Dropped; the reason is counted in [`UdStats`].
    Dropped,
}

struct PendingSend {
    wr_id: u64,
    ah: AhAttr,
    dest_qpn: u32,
    q_key: u32,
    imm: Option<u32>,
    solicited: bool,
    signaled: bool,
    src: Source,
    len: usize,
}

/// The UD transport of one QP. See the module documentation.
pub struct UdQp {
    cfg: UdConfig,
    state: QpState,
    q_key: u32,
    pkey_index: u16,
    port_num: u8,
    sq_psn: Psn,
    sends: VecDeque<PendingSend>,
    recvs: VecDeque<RecvWr>,
    completions: VecDeque<WorkCompletion>,
    stats: UdStats,
    scratch: Vec<u8>,
}

impl UdQp {
    /// A QP in RESET.
    pub fn new(cfg: UdConfig) -> UdQp {
        UdQp {
            cfg,
            state: QpState::Reset,
            q_key: 0,
            pkey_index: 0,
            port_num: 1,
            sq_psn: Psn::new(0),
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            completions: VecDeque::new(),
            stats: UdStats::default(),
            scratch: Vec::new(),
        }
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.cfg.qpn
    }
    /// The current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// The QP's Q_Key.
    pub fn q_key(&self) -> u32 {
        self.q_key
    }
    /// The next PSN sent.
    pub fn sq_psn(&self) -> Psn {
        self.sq_psn
    }
    /// The counters.
    pub fn stats(&self) -> &UdStats {
        &self.stats
    }
    /// The largest payload a send may carry (the port MTU).
    pub fn max_payload(&self) -> usize {
        self.cfg.mtu.bytes() as usize
    }
    /// The largest packet [`UdQp::poll_transmit`] writes.
    pub fn max_packet_len(&self) -> usize {
        Bth::LEN + Deth::LEN + ImmDt::LEN + self.max_payload() + 3 + crate::wire::ICRC_LEN
    }
    /// Receive WQEs posted and not yet used.
    pub fn recv_queued(&self) -> usize {
        self.recvs.len()
    }

    /// `modify_qp` (the verbs layer checked the transition): state, Q_Key, P_Key index,
    /// port, SQ PSN. Moving to RESET empties the queues; to ERR flushes them.
    pub fn modify(&mut self, a: &QpAttr) -> Result<(), UdError> {
        if let Some(q) = a.qkey {
            self.q_key = q;
        }
        if let Some(p) = a.pkey_index {
            self.pkey_index = p;
        }
        if let Some(p) = a.port_num {
            self.port_num = p;
        }
        if let Some(p) = a.sq_psn {
            self.sq_psn = Psn::new(p);
        }
        if let Some(s) = a.qp_state {
            match s {
                QpState::Reset => {
                    self.sends.clear();
                    self.recvs.clear();
                    self.completions.clear();
                }
                QpState::Err => self.flush(),
                _ => {}
            }
            self.state = s;
        }
        Ok(())
    }

    /// The QP moves to ERR: every queued WR completes with `WrFlushErr`.
    pub fn set_error(&mut self) {
        self.state = QpState::Err;
        self.flush();
    }

    fn flush(&mut self) {
        let qpn = self.cfg.qpn;
        for s in self.sends.drain(..) {
            self.completions
                .push_back(WorkCompletion::new(s.wr_id, WcStatus::WrFlushErr, WcOpcode::Send, qpn));
        }
        for r in self.recvs.drain(..) {
            self.completions
                .push_back(WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn));
        }
    }

    /// `ibv_post_send` of one WR: checked now, sent by [`UdQp::poll_transmit`].
    pub fn post_send(&mut self, wr: &SendWr) -> Result<(), UdError> {
        match self.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                self.completions.push_back(WorkCompletion::new(
                    wr.wr_id,
                    WcStatus::WrFlushErr,
                    WcOpcode::Send,
                    self.cfg.qpn,
                ));
                return Ok(());
            }
            s => return Err(UdError::State(s, "post_send needs RTS")),
        }
        if self.sends.len() >= self.cfg.max_send_wr {
            return Err(UdError::QueueFull("send"));
        }
        let imm = match wr.opcode {
            WrOpcode::Send => None,
            WrOpcode::SendWithImm { imm_data } => Some(imm_data),
            _ => return Err(WrError::Opcode("UD QPs send Send and Send with Immediate only").into()),
        };
        let Some(dest) = &wr.ud else {
            return Err(WrError::Opcode("a UD send needs wr.ud (address handle, QPN, Q_Key)").into());
        };
        let len = wr.len();
        let max = self.max_payload() as u64;
        if len > max {
            return Err(WrError::TooLong { len, max }.into());
        }
        let mut pieces = Vec::with_capacity(wr.sg_list.len());
        for s in wr.sg_list.iter().filter(|s| s.length > 0) {
            let r = self
                .cfg
                .mem
                .check(
                    s.lkey,
                    self.cfg.pd,
                    self.cfg.qpn,
                    s.addr,
                    u64::from(s.length),
                    Access::LOCAL_READ,
                )
                .map_err(|error| WrError::LocalProtection { lkey: s.lkey, error })?;
            pieces.push(Piece {
                buf: r.buffer,
                off: r.offset,
                len: s.length as usize,
            });
        }
        let q_key = if dest.remote_qkey & 0x8000_0000 != 0 {
            self.q_key
        } else {
            dest.remote_qkey
        };
        self.sends.push_back(PendingSend {
            wr_id: wr.wr_id,
            ah: dest.ah.attr(),
            dest_qpn: dest.remote_qpn & 0x00ff_ffff,
            q_key,
            imm,
            solicited: wr.flags.contains(SendFlags::SOLICITED),
            signaled: self.cfg.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
            src: Source::Pieces(pieces),
            len: len as usize,
        });
        Ok(())
    }

    /// `ibv_post_recv` of one WR (from INIT on).
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), UdError> {
        match self.state {
            QpState::Reset => return Err(UdError::State(QpState::Reset, "post_recv needs INIT or later")),
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
        if self.recvs.len() >= self.cfg.max_recv_wr {
            return Err(UdError::QueueFull("receive"));
        }
        self.recvs.push_back(wr.clone());
        Ok(())
    }

    /// Writes the next datagram into `buf` (at least [`UdQp::max_packet_len`] octets; the
    /// ICRC field is left 0 for the engine to seal) and completes its WR: a UD send is done
    /// when it is handed over.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<UdTx> {
        let s = self.sends.pop_front()?;
        let opcode = if s.imm.is_some() {
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        } else {
            Opcode::UD_SEND_ONLY
        };
        let mut bth = Bth::new(opcode, s.dest_qpn, self.sq_psn);
        bth.se = s.solicited;
        bth.p_key = DEFAULT_PKEY;
        self.sq_psn = self.sq_psn.add(1);
        let ext = ExtHeaders {
            deth: Some(Deth {
                q_key: s.q_key,
                resv8: 0,
                src_qp: self.cfg.qpn,
            }),
            imm_dt: s.imm.map(|imm| ImmDt { imm }),
            ..ExtHeaders::default()
        };
        self.scratch.resize(s.len, 0);
        s.src.copy_out(0, &mut self.scratch);
        let len = Packet::new(bth, ext, &self.scratch)
            .and_then(|p| p.emit(buf))
            .expect("a UD packet of at most the MTU fits max_packet_len");
        self.stats.sent += 1;
        if s.signaled {
            let mut wc = WorkCompletion::new(s.wr_id, WcStatus::Success, WcOpcode::Send, self.cfg.qpn);
            wc.byte_len = s.len as u32;
            self.completions.push_back(wc);
        }
        Some(UdTx { ah: s.ah, len })
    }

    /// Whether datagrams wait to be sent.
    pub fn has_transmit(&self) -> bool {
        !self.sends.is_empty()
    }

    /// A packet whose BTH names this QP (or a multicast group it is attached to), with
    /// the GRH area built from the IP header it came in.
    pub fn handle_packet(&mut self, pkt: &Packet<'_>, grh: &[u8; grh::GRH_LEN]) -> RxOutcome {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            self.stats.state_dropped += 1;
            return RxOutcome::Dropped;
        }
        let op = pkt.bth.opcode;
        let deth = match pkt.ext.deth {
            Some(d) if op == Opcode::UD_SEND_ONLY || op == Opcode::UD_SEND_ONLY_WITH_IMMEDIATE => d,
            _ => {
                self.stats.opcode_dropped += 1;
                return RxOutcome::Dropped;
            }
        };
        // The default partition, full or limited membership (rxe's pkey_match with 0xffff).
        if pkt.bth.p_key & 0x7fff != 0x7fff {
            self.stats.pkey_dropped += 1;
            return RxOutcome::Dropped;
        }
        if deth.q_key != self.q_key {
            self.stats.qkey_dropped += 1;
            return RxOutcome::Dropped;
        }
        let Some(wr) = self.recvs.pop_front() else {
            self.stats.rq_empty_dropped += 1;
            return RxOutcome::Dropped;
        };
        self.stats.received += 1;
        let qpn = self.cfg.qpn;
        let (mem, pd) = (&self.cfg.mem, self.cfg.pd);
        // One look-up per receive buffer: the GRH and the payload usually share its SGE.
        let mut cache = verbs::mem::MrCache::default();
        let placed = scatter(mem, &mut cache, pd, qpn, &wr.sg_list, 0, grh)
            .and_then(|()| scatter(mem, &mut cache, pd, qpn, &wr.sg_list, grh::GRH_LEN as u64, pkt.payload));
        let status = match placed {
            Ok(()) => WcStatus::Success,
            Err(ScatterError::Length) => {
                self.stats.len_errors += 1;
                WcStatus::LocLenErr
            }
            Err(ScatterError::Protection) => WcStatus::LocProtErr,
        };
        let mut wc = WorkCompletion::new(wr.wr_id, status, WcOpcode::Recv, qpn);
        if status == WcStatus::Success {
            wc.byte_len = (grh::GRH_LEN + pkt.payload.len()) as u32;
            wc.src_qp = deth.src_qp;
            wc.pkey_index = self.pkey_index;
            wc.solicited = pkt.bth.se;
            wc.wc_flags = WcFlags::GRH;
            if let Some(i) = pkt.ext.imm_dt {
                wc.imm_data = Some(i.imm);
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
        }
        self.completions.push_back(wc);
        RxOutcome::Delivered
    }

    /// The next work completion, send or receive.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }
}

#[cfg(test)]
mod tests;
