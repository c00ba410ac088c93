//! One iWARP queue pair over one TCP connection: transmit (segmentation and
//! framing), receive (deframing, checks, placement), the send/receive queues,
//! the outbound and inbound Read/atomic queues (ORD/IRD), completions in
//! posting order, and Terminate handling (RFC 5040 §5-§7, RFC 5041, RFC 7306).
//!
//! The protocol state lives in [`Proto`]; it does no I/O. [`IwarpQp`] owns the
//! socket and moves bytes between it and `Proto` in `pump_tx` / `pump_rx`.

use super::driver::{Driver, Poke, Pollable};
use super::txq::TxQueue;
use crate::wire::cause::{self, TermCause};
use crate::wire::ddp::{self, Addr, Header};
use crate::wire::fpdu;
use crate::wire::fpdu::{Deframer, DeframerConfig, Framer};
use crate::wire::rdmap::{self, AtomicOp, AtomicRequest, AtomicResponse, Message, ReadRequest, op, qn};
use crate::wire::terminate::{self, Offending};
use std::collections::VecDeque;
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use verbs::buffer::Buffer;
use verbs::cm::{CmEvent, ConnInfo, QpOps, TerminateInfo};
use verbs::cq::Progress;
use verbs::mem::AccessError;
use verbs::notify::EventQueue;
use verbs::{
    Access, CompletionQueue, Device, Error, QpInitAttr, QpState, RecvWr, Result, SendFlags, SendWr, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

/// RDMAP control octet: RV = 01b (RFC 5040 §4.1) and the opcode.
const fn rdmap_ctrl(opcode: u8) -> u8 {
    0x40 | (opcode & 0x0F)
}

/// Octets framed ahead of the socket (most of them referenced in place, not
/// copied): enough to keep `writev` busy, small enough that a Read Response
/// or Terminate is not stuck behind megabytes.
const TX_HIGH_WATER: usize = 512 * 1024;
/// Payloads below this are copied next to their headers (one iovec instead
/// of three); larger ones are sent from the registered buffer in place.
const GATHER_MIN: usize = 2048;
/// Receive buffer: large enough for several maximum FPDUs per `read`.
const RX_BUF: usize = 256 * 1024;

/// RTR duty of this side in peer-to-peer mode (RFC 6581 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RtrRole {
    Send(crate::wire::mpa::Rtr),
    Expect(crate::wire::mpa::Rtr),
}

/// What MPA negotiated, as the data path needs it.
#[derive(Debug, Clone)]
pub(crate) struct Negotiated {
    pub crc: bool,
    pub markers_tx: bool,
    pub markers_rx: bool,
    pub ird: u32,
    pub ord: u32,
    pub rtr: Option<RtrRole>,
    pub info: ConnInfo,
}

/// A resolved piece of local memory.
#[derive(Clone)]
struct Piece {
    buf: Arc<Buffer>,
    off: usize,
    len: usize,
}

enum Source {
    None,
    Owned(Vec<u8>),
    Pieces(Vec<Piece>),
}

impl Source {
    /// Copies `out.len()` bytes starting at message offset `at`.
    fn copy_out(&self, mut at: usize, out: &mut [u8]) {
        match self {
            Source::None => {}
            Source::Owned(v) => out.copy_from_slice(&v[at..at + out.len()]),
            Source::Pieces(ps) => {
                let mut done = 0;
                for p in ps {
                    if done == out.len() {
                        break;
                    }
                    if at >= p.len {
                        at -= p.len;
                        continue;
                    }
                    let n = (p.len - at).min(out.len() - done);
                    // In bounds: pieces were checked against their region.
                    let _ = p.buf.read(p.off + at, &mut out[done..done + n]);
                    done += n;
                    at = 0;
                }
            }
        }
    }
}

/// A message being segmented onto the wire.
struct TxMsg {
    /// Completion slot finished when the last byte is written (Send, Write, ...).
    completes: Option<u64>,
    opcode: u8,
    tagged: Option<(u32, u64)>,
    qn: u32,
    msn: u32,
    inv_stag: u32,
    /// RDMAP header after the DDP header (Read Request, atomics, immediate).
    rdmap_hdr: Vec<u8>,
    src: Source,
    total: usize,
    off: usize,
    /// A Read or Atomic Response: it holds an IRD slot until framed.
    response: bool,
}

impl TxMsg {
    /// A tagged message (Write, Read Response) to `stag` at `to`.
    fn tagged(completes: Option<u64>, opcode: u8, stag: u32, to: u64, src: Source, total: usize) -> TxMsg {
        TxMsg {
            completes,
            opcode,
            tagged: Some((stag, to)),
            qn: 0,
            msn: 0,
            inv_stag: 0,
            rdmap_hdr: Vec::new(),
            src,
            total,
            off: 0,
            response: false,
        }
    }
}

struct Slot {
    id: u64,
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    status: Option<WcStatus>,
    byte_len: u32,
    vendor_err: u32,
}

enum OrqKind {
    Read {
        sink: Piece,
        /// The local sink, checked again when the response starts to land.
        sge: Option<verbs::Sge>,
        /// Sink STag and TO named in the Read Request: every Read Response
        /// segment must carry this STag and `sink_to + received` (RFC 5040
        /// §4.4 / §5.2.2, catalogue A.4.6 row 25).
        sink_stag: u32,
        sink_to: u64,
    },
    Atomic {
        sink: Piece,
        request_id: u32,
    },
    /// A zero-length Read RTR of our own (RFC 6581): consumed silently.
    Rtr,
}

struct Orq {
    slot: Option<u64>,
    kind: OrqKind,
    received: usize,
}

enum Irq {
    ReadResponse {
        src: Option<Piece>,
        len: usize,
        sink_stag: u32,
        sink_to: u64,
    },
    AtomicResponse {
        request_id: u32,
        orig: u64,
    },
}

struct RecvWqe {
    wr_id: u64,
    /// Checked when posted and again when a message starts to land in it
    /// (the region may have been deregistered meanwhile, SEC-STAG-02).
    sges: Vec<verbs::Sge>,
    pieces: Vec<Piece>,
    cap: usize,
}

/// The untagged Send-family message being received (QN 0).
struct RxSend {
    wqe: RecvWqe,
    msn: u32,
    got: usize,
}

/// Protocol state of one QP. No I/O.
pub(crate) struct Proto {
    qpn: u32,
    pd: u32,
    dev: Device,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    events: Arc<EventQueue<CmEvent>>,
    attr: QpInitAttr,
    siw_term_form: bool,
    /// RDMAP receive configuration: RFC 7306 on, the Terminate wire form we
    /// expect first (either is accepted).
    rdmap_cfg: rdmap::Config,
    max_ulpdu: usize,
    state: QpState,
    /// `state` as the application reads it (`QueuePair::state`), updated
    /// before any event or completion that follows a change is published.
    shared_state: Arc<AtomicU8>,

    // transmit
    sq: VecDeque<(u64, SendWr, Option<Vec<u8>>)>,
    slots: VecDeque<Slot>,
    next_slot: u64,
    framer: Framer,
    tx: TxQueue,
    cur: Option<TxMsg>,
    follow: Option<TxMsg>,
    tx_msn: [u32; 4],
    prefer_irq: bool,
    orq: VecDeque<Orq>,
    ord: u32,
    irq: VecDeque<Irq>,
    /// Responses taken off `irq` and still being framed (they count to IRD).
    responding: u32,
    ird: u32,
    next_atomic_id: u32,
    rtr: Option<RtrRole>,

    // receive
    rq: VecDeque<RecvWqe>,
    rx_msn: [u32; 4],
    rx_send: Option<RxSend>,
    last_was_write: bool,

    // teardown
    term_sent: bool,
    term_received: bool,
    /// Shut the socket's write side once `out` is drained.
    shutdown_when_drained: bool,
    shut: bool,
    disconnected_event: bool,
}

fn wc(slot_or_wr: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id: slot_or_wr,
        status,
        opcode,
        byte_len: 0,
        qp_num,
        imm_data: None,
        invalidated_rkey: None,
        solicited: false,
        vendor_err: 0,
    }
}

fn pack_cause(c: &TermCause) -> u32 {
    (c.layer.to_nibble() as u32) << 16 | (c.etype as u32) << 8 | c.code as u32
}

fn term_info(c: &TermCause) -> TerminateInfo {
    TerminateInfo {
        layer: c.layer.to_nibble(),
        etype: c.etype,
        code: c.code,
        description: c.describe().to_string(),
    }
}

/// The completion status a peer's Terminate means for the work request it names.
fn status_for_peer_terminate(c: &TermCause) -> WcStatus {
    use crate::wire::cause::{Layer, etype};
    match (c.layer, c.etype) {
        (Layer::Rdmap, etype::RDMAP_REMOTE_PROTECTION) => WcStatus::RemAccessErr,
        (Layer::Rdmap, etype::RDMAP_REMOTE_OPERATION) => WcStatus::RemOpErr,
        (Layer::Ddp, etype::DDP_TAGGED) => WcStatus::RemAccessErr,
        (Layer::Ddp, etype::DDP_UNTAGGED) => WcStatus::RemInvReqErr,
        _ => WcStatus::RemOpErr,
    }
}

/// A peer access failure on a tagged (DDP) buffer: RFC 5041 §7.2 / matrix rows 8-12.
fn ddp_tagged_cause(e: AccessError) -> TermCause {
    match e {
        AccessError::InvalidStag | AccessError::AccessRights => cause::DDP_ERR_T_INVALID_STAG,
        AccessError::BaseBounds => cause::DDP_ERR_T_BASE_BOUNDS,
        AccessError::NotAssociated => cause::DDP_ERR_T_STAG_NOT_ASSOCIATED,
        AccessError::ToWrap => cause::DDP_ERR_T_TO_WRAP,
    }
}

/// A Read Request source failure: RFC 5040 §7.2 / matrix rows 13-17.
fn rdmap_read_cause(e: AccessError) -> TermCause {
    match e {
        AccessError::InvalidStag => cause::RDMAP_ERR_INVALID_STAG,
        AccessError::BaseBounds => cause::RDMAP_ERR_BASE_BOUNDS,
        AccessError::AccessRights => cause::RDMAP_ERR_ACCESS_RIGHTS,
        AccessError::NotAssociated => cause::RDMAP_ERR_STAG_NOT_ASSOCIATED,
        AccessError::ToWrap => cause::RDMAP_ERR_TO_WRAP,
    }
}

/// Outcome of handling one received ULPDU.
type RxResult = std::result::Result<(), Fatal>;

/// A peer protocol violation: the Terminate to send.
struct Fatal {
    cause: TermCause,
    echo: bool,
    rreq: Option<ReadRequest>,
}

impl Fatal {
    fn new(cause: TermCause) -> Fatal {
        Fatal {
            cause,
            echo: true,
            rreq: None,
        }
    }
    fn bare(cause: TermCause) -> Fatal {
        Fatal {
            cause,
            echo: false,
            rreq: None,
        }
    }
    /// The Terminate [`rdmap::Error`] names: its cause, whether the DDP
    /// header is echoed and the Read Request header when there is one.
    fn from_rdmap(e: &rdmap::Error) -> Fatal {
        Fatal {
            cause: e.term_cause(),
            echo: e.echo() != rdmap::Echo::Nothing,
            rreq: match e {
                rdmap::Error::HeaderLength { rreq, .. } => *rreq,
                _ => None,
            },
        }
    }
}

impl Proto {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qpn: u32,
        pd: u32,
        dev: Device,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        events: Arc<EventQueue<CmEvent>>,
        attr: QpInitAttr,
        neg: &Negotiated,
        siw_term_form: bool,
        max_ulpdu: usize,
    ) -> Proto {
        Proto {
            qpn,
            pd,
            dev,
            send_cq,
            recv_cq,
            events,
            attr,
            siw_term_form,
            rdmap_cfg: rdmap::Config {
                terminate_form: if siw_term_form {
                    terminate::TermWireForm::LinuxSiw
                } else {
                    terminate::TermWireForm::Rfc
                },
                ..rdmap::Config::RFC7306
            },
            max_ulpdu: max_ulpdu.clamp(128, 65_535),
            state: QpState::Rts,
            shared_state: Arc::new(AtomicU8::new(state_code(QpState::Rts))),
            sq: VecDeque::new(),
            slots: VecDeque::new(),
            next_slot: 0,
            framer: Framer::new(neg.crc, neg.markers_tx),
            tx: TxQueue::default(),
            cur: None,
            follow: None,
            tx_msn: [0; 4],
            prefer_irq: true,
            orq: VecDeque::new(),
            ord: neg.ord.max(1),
            irq: VecDeque::new(),
            responding: 0,
            ird: neg.ird,
            next_atomic_id: 1,
            rtr: neg.rtr,
            rq: VecDeque::new(),
            rx_msn: [1; 4],
            rx_send: None,
            last_was_write: false,
            term_sent: false,
            term_received: false,
            shutdown_when_drained: false,
            shut: false,
            disconnected_event: false,
        }
    }

    fn resolve(&self, sges: &[verbs::Sge], need: Access) -> std::result::Result<(Vec<Piece>, usize), String> {
        let mut pieces = Vec::with_capacity(sges.len());
        let mut total = 0usize;
        for s in sges {
            if s.length == 0 {
                continue;
            }
            let r = self
                .dev
                .mem()
                .check(s.lkey, self.pd, self.qpn, s.addr, s.length as u64, need)
                .map_err(|e| format!("local protection error on lkey {:#010x}: {e:?}", s.lkey))?;
            total = total.checked_add(s.length as usize).ok_or("sg list too long")?;
            pieces.push(Piece {
                buf: r.buffer,
                off: r.offset,
                len: s.length as usize,
            });
        }
        Ok((pieces, total))
    }

    fn outstanding_send_wrs(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        for (index, wr) in wrs.iter().enumerate() {
            let bad = |reason: String| Error::BadWr { index, reason };
            if self.state != QpState::Rts {
                return Err(bad(format!("QP is in state {:?}", self.state)));
            }
            if self.outstanding_send_wrs() >= self.attr.max_send_wr as usize {
                return Err(bad("send queue full".into()));
            }
            if wr.sg_list.len() > self.attr.max_send_sge.max(1) as usize {
                return Err(bad(format!(
                    "{} SGEs exceed max_send_sge {}",
                    wr.sg_list.len(),
                    self.attr.max_send_sge
                )));
            }
            let total = wr.len();
            let (need, opcode) = match &wr.opcode {
                WrOpcode::Send | WrOpcode::SendWithInv { .. } => (Access::LOCAL_READ, WcOpcode::Send),
                WrOpcode::SendWithImm { .. } => {
                    if total != 0 {
                        return Err(bad(
                            "RFC 7306 Immediate Data carries no payload: use an empty sg list".into()
                        ));
                    }
                    (Access::LOCAL_READ, WcOpcode::Send)
                }
                WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => {
                    (Access::LOCAL_READ, WcOpcode::RdmaWrite)
                }
                WrOpcode::RdmaRead { .. } => {
                    if wr.sg_list.len() > 1 {
                        return Err(bad("RDMA Read takes one sink SGE (max_sge_rd = 1)".into()));
                    }
                    (Access::LOCAL_WRITE, WcOpcode::RdmaRead)
                }
                WrOpcode::AtomicFetchAdd { .. } | WrOpcode::AtomicCmpSwap { .. } => {
                    if wr.sg_list.len() != 1 || wr.sg_list[0].length != 8 {
                        return Err(bad("atomics need exactly one 8-byte sink SGE".into()));
                    }
                    let op = if matches!(wr.opcode, WrOpcode::AtomicFetchAdd { .. }) {
                        WcOpcode::FetchAdd
                    } else {
                        WcOpcode::CompSwap
                    };
                    (Access::LOCAL_WRITE, op)
                }
                WrOpcode::LocalInv { .. } => (Access::empty(), WcOpcode::LocalInv),
                WrOpcode::RegMr { .. } => (Access::empty(), WcOpcode::RegMr),
            };
            if total > u32::MAX as u64 {
                return Err(bad("message longer than 2^32-1".into()));
            }
            let inline = if wr.flags.contains(SendFlags::INLINE) && need == Access::LOCAL_READ {
                if total > self.attr.max_inline_data as u64 {
                    return Err(bad(format!(
                        "{total} bytes exceed max_inline_data {}",
                        self.attr.max_inline_data
                    )));
                }
                let (pieces, len) = self.resolve(&wr.sg_list, need).map_err(bad)?;
                let mut v = vec![0u8; len];
                Source::Pieces(pieces).copy_out(0, &mut v);
                Some(v)
            } else {
                if !need.is_empty() {
                    self.resolve(&wr.sg_list, need).map_err(bad)?;
                }
                None
            };
            let id = self.next_slot;
            self.next_slot += 1;
            let signaled = self.attr.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
            self.slots.push_back(Slot {
                id,
                wr_id: wr.wr_id,
                opcode,
                signaled,
                status: None,
                byte_len: total as u32,
                vendor_err: 0,
            });
            self.sq.push_back((id, wr.clone(), inline));
        }
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        for (index, wr) in wrs.iter().enumerate() {
            let bad = |reason: String| Error::BadWr { index, reason };
            if matches!(self.state, QpState::Err | QpState::Reset) {
                return Err(bad(format!("QP is in state {:?}", self.state)));
            }
            if self.rq.len() >= self.attr.max_recv_wr as usize {
                return Err(bad("receive queue full".into()));
            }
            if wr.sg_list.len() > self.attr.max_recv_sge.max(1) as usize {
                return Err(bad(format!("{} SGEs exceed max_recv_sge", wr.sg_list.len())));
            }
            let (pieces, cap) = self.resolve(&wr.sg_list, Access::LOCAL_WRITE).map_err(bad)?;
            self.rq.push_back(RecvWqe {
                wr_id: wr.wr_id,
                sges: wr.sg_list.clone(),
                pieces,
                cap,
            });
        }
        Ok(())
    }

    fn slot_mut(&mut self, id: u64) -> Option<&mut Slot> {
        let first = self.slots.front()?.id;
        self.slots.get_mut(id.checked_sub(first)? as usize)
    }

    fn finish_slot(&mut self, id: u64, status: WcStatus) {
        if let Some(s) = self.slot_mut(id)
            && s.status.is_none()
        {
            s.status = Some(status);
        }
    }

    /// Reports finished send work requests in posting order (RFC 5040 §5.5 rule 15).
    fn deliver_send_completions(&mut self) {
        while self.slots.front().is_some_and(|s| s.status.is_some()) {
            let s = self.slots.pop_front().expect("checked");
            let status = s.status.expect("checked");
            if s.signaled || status != WcStatus::Success {
                let mut w = wc(s.wr_id, status, s.opcode, self.qpn);
                w.byte_len = if matches!(s.opcode, WcOpcode::RdmaRead | WcOpcode::FetchAdd | WcOpcode::CompSwap) {
                    s.byte_len
                } else {
                    0
                };
                w.vendor_err = s.vendor_err;
                if self.send_cq.push(w).is_err() {
                    self.cq_overflow();
                }
            }
        }
    }

    fn cq_overflow(&mut self) {
        tracing::warn!(qp = self.qpn, "completion queue overflow: QP to error");
        if self.state != QpState::Err {
            self.enter_error();
        }
    }

    fn push_recv_completion(&mut self, w: WorkCompletion) {
        if self.recv_cq.push(w).is_err() {
            self.cq_overflow();
        }
    }

    /// Moves to the error state: every outstanding work request completes
    /// with `WrFlushErr` (in order), nothing new is accepted.
    fn enter_error(&mut self) {
        self.state = QpState::Err;
        self.shared_state.store(state_code(QpState::Err), Ordering::Release);
        self.sq.clear();
        self.cur = None;
        self.follow = None;
        self.orq.clear();
        self.irq.clear();
        self.responding = 0;
        for s in self.slots.iter_mut() {
            if s.status.is_none() {
                s.status = Some(WcStatus::WrFlushErr);
            }
        }
        self.deliver_send_completions();
        if let Some(rs) = self.rx_send.take() {
            self.rq.push_front(rs.wqe);
        }
        while let Some(r) = self.rq.pop_front() {
            let w = wc(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            if self.recv_cq.push(w).is_err() {
                break;
            }
        }
    }

    /// Sends one Terminate for `f` (at most one per stream, RDMAP-TRM-02),
    /// then nothing else (RDMAP-TRM-06); flushes and closes gracefully.
    fn terminate(&mut self, f: Fatal, offending: Option<&[u8]>) {
        if self.term_sent || self.term_received {
            return;
        }
        self.term_sent = true;
        tracing::info!(qp = self.qpn, "sending Terminate: {}", f.cause);
        let off = if f.echo {
            offending.and_then(Offending::from_ulpdu)
        } else {
            None
        };
        let mut repr = terminate::Repr::for_error(f.cause, off, f.rreq.as_ref());
        if self.siw_term_form {
            repr.form = terminate::TermWireForm::LinuxSiw;
        }
        self.tx_msn[qn::TERMINATE as usize] = self.tx_msn[qn::TERMINATE as usize].wrapping_add(1);
        let msn = self.tx_msn[qn::TERMINATE as usize];
        let len = repr.ulpdu_len();
        let mark = self.tx.position();
        let framed = frame_copy(&mut self.framer, &mut self.tx, len, |u| {
            let _ = repr.emit_ulpdu(u, msn);
        });
        if !framed {
            self.tx.truncate_to(mark);
        }
        // The event first (see on_terminate), then the failing work request (if ours) gets
        // the local status.
        self.events.push(CmEvent::TerminateSent(term_info(&f.cause)));
        self.enter_error();
        self.shutdown_when_drained = true;
    }

    // ---------------------------------------------------------------- transmit

    fn next_msn(&mut self, q: u32) -> u32 {
        let m = &mut self.tx_msn[q as usize];
        *m = m.wrapping_add(1);
        *m
    }

    /// Builds the next message to transmit, if any is ready.
    fn next_message(&mut self) -> Option<TxMsg> {
        if let Some(f) = self.follow.take() {
            return Some(f);
        }
        if let Some(RtrRole::Send(rtr)) = self.rtr {
            self.rtr = None;
            return Some(self.rtr_message(rtr));
        }
        if matches!(self.rtr, Some(RtrRole::Expect(_))) {
            // The responder sends nothing before the initiator's RTR (RFC 6581 §4).
            return None;
        }
        let take_irq = !self.irq.is_empty() && (self.prefer_irq || self.sq.is_empty());
        self.prefer_irq = !self.prefer_irq;
        if take_irq {
            let r = self.irq.pop_front()?;
            let mut m = self.response_message(r);
            m.response = true;
            self.responding += 1;
            return Some(m);
        }
        loop {
            let (id, wr, _) = self.sq.front()?;
            let (id, is_rd) = (
                *id,
                matches!(
                    wr.opcode,
                    WrOpcode::RdmaRead { .. } | WrOpcode::AtomicFetchAdd { .. } | WrOpcode::AtomicCmpSwap { .. }
                ),
            );
            if is_rd && self.orq.len() >= self.ord as usize {
                return None; // ORD reached (RDMAP-STR-03): later WRs wait too.
            }
            if wr.flags.contains(SendFlags::FENCE) && !self.orq.is_empty() {
                return None;
            }
            let (_, wr, inline) = self.sq.pop_front().expect("checked");
            match self.build(id, wr, inline) {
                Some(m) => return Some(m),
                None => {
                    self.deliver_send_completions();
                    continue;
                }
            }
        }
    }

    /// An untagged message on queue `q`, taking that queue's next MSN.
    #[allow(clippy::too_many_arguments)]
    fn untagged(
        &mut self,
        completes: Option<u64>,
        opcode: u8,
        q: u32,
        inv_stag: u32,
        rdmap_hdr: Vec<u8>,
        src: Source,
        total: usize,
    ) -> TxMsg {
        let msn = self.next_msn(q);
        TxMsg {
            completes,
            opcode,
            tagged: None,
            qn: q,
            msn,
            inv_stag,
            rdmap_hdr,
            src,
            total,
            off: 0,
            response: false,
        }
    }

    /// A header-only untagged message (Read Request, atomics, immediate data, RTRs).
    fn header_only(&mut self, completes: Option<u64>, opcode: u8, q: u32, rdmap_hdr: Vec<u8>) -> TxMsg {
        self.untagged(completes, opcode, q, 0, rdmap_hdr, Source::None, 0)
    }

    /// RFC 7306 Immediate Data (with SE when `se`).
    fn immediate(&mut self, completes: Option<u64>, se: bool, imm: u32) -> TxMsg {
        let opcode = if se { op::IMM_SE } else { op::IMM };
        self.header_only(completes, opcode, qn::SEND, (imm as u64).to_be_bytes().to_vec())
    }

    fn rtr_message(&mut self, rtr: crate::wire::mpa::Rtr) -> TxMsg {
        use crate::wire::mpa::Rtr;
        match rtr {
            // siw uses STag 1, TO 0 for the zero-length Write RTR (peers file §1.2).
            Rtr::Write => TxMsg::tagged(None, op::WRITE, 1, 0, Source::None, 0),
            Rtr::Read => {
                let rr = ReadRequest {
                    sink_stag: 1,
                    sink_to: 0,
                    size: 0,
                    src_stag: 1,
                    src_to: 0,
                };
                self.orq.push_back(Orq {
                    slot: None,
                    kind: OrqKind::Rtr,
                    received: 0,
                });
                self.header_only(
                    None,
                    op::READ_REQUEST,
                    qn::READ_REQUEST,
                    encoded(rr.buffer_len(), |b| rr.emit(b)),
                )
            }
            Rtr::Send => self.header_only(None, op::SEND, qn::SEND, Vec::new()),
        }
    }

    fn response_message(&mut self, r: Irq) -> TxMsg {
        match r {
            Irq::ReadResponse {
                src,
                len,
                sink_stag,
                sink_to,
            } => {
                let src = src.map_or(Source::None, |p| Source::Pieces(vec![p]));
                TxMsg::tagged(None, op::READ_RESPONSE, sink_stag, sink_to, src, len)
            }
            Irq::AtomicResponse { request_id, orig } => {
                let resp = AtomicResponse {
                    orig_request_id: request_id,
                    orig_value: orig,
                };
                let h = encoded(resp.buffer_len(), |b| resp.emit(b));
                self.header_only(None, op::ATOMIC_RESPONSE, qn::ATOMIC_RESPONSE, h)
            }
        }
    }

    /// Turns a work request into a message, or executes it locally (returns None).
    fn build(&mut self, id: u64, wr: SendWr, inline: Option<Vec<u8>>) -> Option<TxMsg> {
        let se = wr.flags.contains(SendFlags::SOLICITED);
        let need = if matches!(
            wr.opcode,
            WrOpcode::RdmaRead { .. } | WrOpcode::AtomicFetchAdd { .. } | WrOpcode::AtomicCmpSwap { .. }
        ) {
            Access::LOCAL_WRITE
        } else {
            Access::LOCAL_READ
        };
        let (src, total) = match inline {
            Some(v) => {
                let n = v.len();
                (Source::Owned(v), n)
            }
            None if matches!(wr.opcode, WrOpcode::LocalInv { .. } | WrOpcode::RegMr { .. }) => (Source::None, 0),
            None => match self.resolve(&wr.sg_list, need) {
                Ok((p, n)) => (Source::Pieces(p), n),
                Err(e) => {
                    // The region went away between post and execution.
                    tracing::warn!(qp = self.qpn, "{e}");
                    self.finish_slot(id, WcStatus::LocProtErr);
                    return None;
                }
            },
        };
        match wr.opcode {
            WrOpcode::Send => {
                let opcode = if se { op::SEND_SE } else { op::SEND };
                Some(self.untagged(Some(id), opcode, qn::SEND, 0, vec![], src, total))
            }
            WrOpcode::SendWithInv { invalidate_rkey } => {
                let opcode = if se { op::SEND_SE_INV } else { op::SEND_INV };
                Some(self.untagged(Some(id), opcode, qn::SEND, invalidate_rkey, vec![], src, total))
            }
            WrOpcode::SendWithImm { imm_data } => Some(self.immediate(Some(id), se, imm_data)),
            WrOpcode::RdmaWrite { remote } => {
                Some(TxMsg::tagged(Some(id), op::WRITE, remote.rkey, remote.addr, src, total))
            }
            WrOpcode::RdmaWriteWithImm { remote, imm_data } => {
                // RFC 7306 §6: an RDMA Write followed by an Immediate Data message.
                self.follow = Some(self.immediate(Some(id), se, imm_data));
                Some(TxMsg::tagged(None, op::WRITE, remote.rkey, remote.addr, src, total))
            }
            WrOpcode::RdmaRead { remote } => {
                let (sink, sink_stag, sink_to) = match src {
                    Source::Pieces(mut p) if !p.is_empty() => (p.remove(0), wr.sg_list[0].lkey, wr.sg_list[0].addr),
                    // Zero-length Read: no sink bytes.
                    _ => (
                        Piece {
                            buf: Arc::new(Buffer::new(0).ok()?),
                            off: 0,
                            len: 0,
                        },
                        wr.sg_list.first().map_or(0, |s| s.lkey),
                        wr.sg_list.first().map_or(0, |s| s.addr),
                    ),
                };
                let rr = ReadRequest {
                    sink_stag,
                    sink_to,
                    size: total as u32,
                    src_stag: remote.rkey,
                    src_to: remote.addr,
                };
                self.orq.push_back(Orq {
                    slot: Some(id),
                    kind: OrqKind::Read {
                        sink,
                        sge: wr.sg_list.first().filter(|s| s.length > 0).cloned(),
                        sink_stag,
                        sink_to,
                    },
                    received: 0,
                });
                Some(self.header_only(
                    None,
                    op::READ_REQUEST,
                    qn::READ_REQUEST,
                    encoded(rr.buffer_len(), |b| rr.emit(b)),
                ))
            }
            WrOpcode::AtomicFetchAdd { remote, add } => self.atomic(id, src, AtomicOp::FetchAdd, remote, add, 0, 0, 0),
            WrOpcode::AtomicCmpSwap { remote, compare, swap } => {
                self.atomic(id, src, AtomicOp::CmpSwap, remote, swap, u64::MAX, compare, u64::MAX)
            }
            WrOpcode::LocalInv { rkey } => {
                let st = match self.dev.mem().local_invalidate(rkey, self.pd) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::MwBindErr,
                };
                self.finish_slot(id, st);
                None
            }
            WrOpcode::RegMr {
                mr_stag,
                key,
                source_lkey,
                source_addr,
                length,
                iova,
                access,
            } => {
                let st =
                    match self
                        .dev
                        .mem()
                        .check(source_lkey, self.pd, self.qpn, source_addr, length, Access::LOCAL_READ)
                    {
                        Ok(r) => match self
                            .dev
                            .mem()
                            .fast_register(mr_stag, self.pd, key, r.buffer, r.offset, iova, length, access)
                        {
                            Ok(_) => WcStatus::Success,
                            Err(_) => WcStatus::MwBindErr,
                        },
                        Err(_) => WcStatus::LocProtErr,
                    };
                self.finish_slot(id, st);
                None
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &mut self,
        id: u64,
        src: Source,
        aop: AtomicOp,
        remote: verbs::RemoteAddr,
        data: u64,
        mask: u64,
        cmp: u64,
        cmp_mask: u64,
    ) -> Option<TxMsg> {
        let Source::Pieces(mut p) = src else { return None };
        let sink = p.remove(0);
        let request_id = self.next_atomic_id;
        self.next_atomic_id = self.next_atomic_id.wrapping_add(1);
        let ar = AtomicRequest {
            op: aop,
            request_id,
            remote_stag: remote.rkey,
            remote_to: remote.addr,
            add_swap_data: data,
            // FetchAdd with mask 0 = plain 64-bit add (RFC 7306 §5.1.1).
            add_swap_mask: mask,
            compare_data: cmp,
            compare_mask: cmp_mask,
        };
        self.orq.push_back(Orq {
            slot: Some(id),
            kind: OrqKind::Atomic { sink, request_id },
            received: 0,
        });
        Some(self.header_only(
            None,
            op::ATOMIC_REQUEST,
            qn::READ_REQUEST,
            encoded(ar.buffer_len(), |b| ar.emit(b)),
        ))
    }

    /// Frames DDP segments onto the transmit queue until the high-water
    /// mark or no work.
    pub(crate) fn fill_tx(&mut self) -> bool {
        if self.term_sent || self.term_received || self.state == QpState::Err {
            return false;
        }
        let mut any = false;
        while self.tx.pending() < TX_HIGH_WATER {
            if self.cur.is_none() {
                self.cur = self.next_message();
                if self.cur.is_none() {
                    break;
                }
            }
            let m = self.cur.as_mut().expect("checked");
            let ddp_len = if m.tagged.is_some() {
                ddp::TAGGED_HEADER_LEN
            } else {
                ddp::UNTAGGED_HEADER_LEN
            };
            let hdr_len = ddp_len + m.rdmap_hdr.len();
            let room = self.max_ulpdu - hdr_len;
            let seg = (m.total - m.off).min(room);
            let last = m.off + seg == m.total;
            let addr = match m.tagged {
                Some((stag, to)) => Addr::Tagged {
                    stag,
                    to: to.wrapping_add(m.off as u64),
                },
                None => Addr::Untagged {
                    qn: m.qn,
                    msn: m.msn,
                    mo: m.off as u32,
                    inv_stag: m.inv_stag,
                },
            };
            let h = Header {
                last,
                rdmap_ctrl: rdmap_ctrl(m.opcode),
                addr,
            };
            let ulpdu_len = hdr_len + seg;
            let mark = self.tx.position();
            let in_place = seg >= GATHER_MIN && !self.framer.markers() && matches!(m.src, Source::Pieces(_));
            let ok = if in_place {
                gather_fpdu(
                    &mut self.framer,
                    &mut self.tx,
                    &h,
                    ddp_len,
                    &m.rdmap_hdr,
                    &m.src,
                    m.off,
                    seg,
                )
            } else {
                let (off, rh, src) = (m.off, &m.rdmap_hdr, &m.src);
                frame_copy(&mut self.framer, &mut self.tx, ulpdu_len, |u| {
                    let _ = h.emit(u);
                    u[ddp_len..hdr_len].copy_from_slice(rh);
                    src.copy_out(off, &mut u[hdr_len..]);
                })
            };
            if !ok {
                self.tx.truncate_to(mark);
                break;
            }
            any = true;
            m.off += seg;
            if last {
                let m = self.cur.take().expect("checked");
                if m.response {
                    self.responding -= 1;
                }
                if let Some(id) = m.completes {
                    self.tx.mark(id);
                }
            }
        }
        any
    }

    /// Octets still to be written to the socket.
    pub(crate) fn tx_pending(&self) -> usize {
        self.tx.pending()
    }

    /// The framed octets waiting for the socket. The socket work (`writev`)
    /// is the caller's ([`IwarpQp`]'s `pump_tx`): `Proto` does no I/O.
    pub(crate) fn tx_queue(&self) -> &TxQueue {
        &self.tx
    }

    /// `n` octets were written: complete what fully left.
    pub(crate) fn consumed_out(&mut self, n: usize) {
        let mut done = Vec::new();
        self.tx.consumed(n, &mut done);
        for id in done {
            // RDMAP-ORD-14: complete once handed to the LLP in full.
            self.finish_slot(id, WcStatus::Success);
        }
        self.deliver_send_completions();
    }

    /// The socket failed: nothing queued will leave.
    pub(crate) fn discard_out(&mut self) {
        let mut done = Vec::new();
        self.tx.discard(&mut done);
        for id in done {
            self.finish_slot(id, WcStatus::WrFlushErr);
        }
        self.deliver_send_completions();
    }

    // ---------------------------------------------------------------- receive

    /// Handles one whole, CRC-checked ULPDU.
    pub(crate) fn on_ulpdu(&mut self, u: &[u8]) {
        if self.term_sent || self.term_received {
            return;
        }
        if let Err(f) = self.dispatch(u) {
            self.terminate(f, Some(u));
        }
    }

    /// One ULPDU through the wire layer's receive checks, then the engine's
    /// queue, sequencing and memory checks. DDP header: [`ddp::Segment::parse`]
    /// (DV, length; fuzz target `ddp`); RDMAP: [`rdmap::Message::parse`] (RV,
    /// opcode, T and QN against the opcode, header lengths; fuzz target
    /// `rdmap`), in the order of catalogue A.4.2; each error names its
    /// Terminate (A.4.6) and what it echoes.
    fn dispatch(&mut self, u: &[u8]) -> RxResult {
        let seg = ddp::Segment::parse(u).map_err(|e| Fatal::bare(e.term_cause()))?;
        let h = seg.header;
        if let Some(RtrRole::Expect(rtr)) = self.rtr {
            // RFC 6581 §4: the first message must be the agreed RTR; anything
            // else, malformed RDMAP included, is "no matching RTR" (after RV).
            let (rv, _, opcode) = rdmap::split_control(h.rdmap_ctrl);
            if rv != rdmap::VERSION {
                return Err(Fatal::new(cause::RDMAP_ERR_INVALID_VERSION));
            }
            return self.on_rtr(rtr, &h, opcode, seg.payload);
        }
        let msg = match Message::parse(&seg, &self.rdmap_cfg) {
            Ok(m) => m,
            Err(rdmap::Error::Terminate(e)) => {
                // RDMAP-TRM-04: an invalid Terminate still ends the stream,
                // and is not answered with a Terminate (row 29).
                tracing::info!(qp = self.qpn, "invalid Terminate received: {e}");
                self.on_terminate(cause::RDMAP_ERR_UNSPECIFIED_OP);
                return Ok(());
            }
            Err(e) => return Err(Fatal::from_rdmap(&e)),
        };
        let untagged = match h.addr {
            Addr::Untagged { qn, msn, mo, .. } => Some((qn, msn, mo)),
            Addr::Tagged { .. } => None,
        };
        match (msg, untagged) {
            (Message::Write { stag, to, payload }, _) => self.on_write(stag, to, payload, h.last),
            (Message::ReadResponse { stag, to, payload }, _) => self.on_read_response(stag, to, payload, h.last),
            (Message::Send { invalidate, .. }, Some((_, msn, mo))) => {
                let opcode = h.rdmap_ctrl & 0x0F;
                self.on_send(opcode, msn, mo, invalidate.unwrap_or(0), seg.payload, h.last)
            }
            (Message::ImmediateData { .. }, Some((_, msn, mo))) => {
                // The 8 octets were checked by Message::parse (RFC 7306 §6.3).
                let opcode = h.rdmap_ctrl & 0x0F;
                self.on_send(opcode, msn, mo, 0, seg.payload, h.last)
            }
            (Message::ReadRequest(rr), Some((q, msn, mo))) => {
                self.check_single(q, msn, mo, h.last)?;
                // An Immediate Data message after this one no longer follows a Write.
                self.last_was_write = false;
                self.on_read_request(rr)
            }
            (Message::AtomicRequest(ar), Some((q, msn, mo))) => {
                self.check_single(q, msn, mo, h.last)?;
                self.last_was_write = false;
                self.on_atomic_request(ar)
            }
            (Message::AtomicResponse(r), Some((q, msn, mo))) => {
                self.check_single(q, msn, mo, h.last)?;
                self.on_atomic_response(r)
            }
            (Message::Terminate(t), Some(_)) => {
                self.on_terminate(t.cause);
                Ok(())
            }
            // Message::parse checked T against the opcode.
            _ => Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE)),
        }
    }

    /// Header-only untagged messages arrive in one segment: MSN in order, MO 0, L set.
    fn check_single(&mut self, q: u32, msn: u32, mo: u32, last: bool) -> RxResult {
        let expect = self.rx_msn[q as usize];
        if msn != expect {
            return Err(Fatal::new(cause::DDP_ERR_U_MSN_RANGE));
        }
        if mo != 0 || !last {
            return Err(Fatal::new(cause::DDP_ERR_U_INVALID_MO));
        }
        self.rx_msn[q as usize] = expect.wrapping_add(1);
        Ok(())
    }

    fn on_rtr(&mut self, rtr: crate::wire::mpa::Rtr, h: &Header, opcode: u8, payload: &[u8]) -> RxResult {
        use crate::wire::mpa::Rtr;
        let no_rtr = || Fatal::bare(cause::MPA_ERR_NO_MATCHING_RTR);
        // The RTR's message length: a Read RTR's is its RDMA Read size (plus
        // anything trailing its header), the others' is their payload.
        let len = if opcode == op::READ_REQUEST {
            let rr = ReadRequest::parse(payload).map_err(|_| no_rtr())?;
            rr.size as u64 + (payload.len() - rr.buffer_len()) as u64
        } else {
            payload.len() as u64
        };
        crate::proto::mpa::check_rtr(rtr, opcode, h.is_tagged(), len).map_err(Fatal::bare)?;
        // It is the first message on its queue, whole in one segment.
        let first = h.last
            && match h.addr {
                Addr::Tagged { .. } => true,
                Addr::Untagged { qn: q, msn, mo, .. } => {
                    msn == 1 && mo == 0 && q == if rtr == Rtr::Read { qn::READ_REQUEST } else { qn::SEND }
                }
            };
        if !first {
            return Err(no_rtr());
        }
        self.rtr = None;
        match rtr {
            Rtr::Send => self.rx_msn[0] = 2,
            Rtr::Read => {
                self.rx_msn[1] = 2;
                let rr = ReadRequest::parse(payload).map_err(|_| no_rtr())?;
                self.irq.push_back(Irq::ReadResponse {
                    src: None,
                    len: 0,
                    sink_stag: rr.sink_stag,
                    sink_to: rr.sink_to,
                });
            }
            Rtr::Write => {}
        }
        self.events.push(CmEvent::Established);
        Ok(())
    }

    /// Where a Write's payload of `len` octets goes (RFC 5041 §7.2 checks).
    fn write_target(&mut self, stag: u32, to: u64, len: usize) -> Result<Option<(Arc<Buffer>, usize)>, Fatal> {
        self.last_was_write = true;
        if len == 0 {
            // Zero-length Write: no STag validation (catalogue A.5 #6, as siw).
            return Ok(None);
        }
        let r = self
            .dev
            .mem()
            .check(stag, self.pd, self.qpn, to, len as u64, Access::REMOTE_WRITE)
            .map_err(|e| Fatal::new(ddp_tagged_cause(e)))?;
        Ok(Some((r.buffer, r.offset)))
    }

    fn on_write(&mut self, stag: u32, to: u64, payload: &[u8], _last: bool) -> RxResult {
        if let Some((buf, off)) = self.write_target(stag, to, payload.len())? {
            buf.write(off, payload)
                .map_err(|_| Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS))?;
        }
        Ok(())
    }

    /// Where a Read Response segment of `len` octets carrying `stag`/`to`
    /// goes: the sink of the oldest outstanding Read (RFC 5040 §5.2.2).
    fn read_response_target(
        &mut self,
        stag: u32,
        to: u64,
        len: usize,
        last: bool,
    ) -> Result<Option<(Arc<Buffer>, usize)>, Fatal> {
        // Matrix row 23: a Read Response with no Read outstanding.
        let Some(head) = self.orq.front() else {
            return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE));
        };
        match &head.kind {
            OrqKind::Rtr => {
                if len != 0 || !last {
                    return Err(Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS));
                }
                Ok(None)
            }
            OrqKind::Atomic { .. } => Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE)),
            OrqKind::Read {
                sink,
                sge,
                sink_stag,
                sink_to,
            } => {
                // RFC 5040 §5.2.2 MAY: check the response against the request
                // (matrix row 25). The STag first (issue 12 point 6): one
                // that is not the sink this Read named is refused before
                // anything is placed, with the DDP tagged-buffer code
                // RFC 5041 §7.2 gives for what it is.
                if stag != *sink_stag {
                    return Err(Fatal::new(self.foreign_sink_cause(stag, to, len)));
                }
                // The TO of this segment: the sink TO advanced by what has
                // arrived (RFC 5041 §5.2: TO = message TO + offset).
                if sink_to.checked_add(head.received as u64) != Some(to) {
                    return Err(Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS));
                }
                if head.received.checked_add(len).is_none_or(|e| e > sink.len) {
                    return Err(Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS));
                }
                let target = (sink.buf.clone(), sink.off + head.received);
                if head.received == 0
                    && let Some(sge) = *sge
                    && self.resolve(std::slice::from_ref(&sge), Access::LOCAL_WRITE).is_err()
                {
                    // The sink was deregistered while the Read was outstanding.
                    if let Some(id) = head.slot {
                        self.finish_slot(id, WcStatus::LocProtErr);
                    }
                    return Err(Fatal::bare(cause::RDMAP_LOCAL_CATASTROPHIC_ERR));
                }
                Ok(Some(target))
            }
        }
    }

    /// The Terminate for a Read Response naming `stag`, which is not the sink
    /// STag of the Read it answers (RFC 5041 §7.2 tagged-buffer codes, in the
    /// check order of catalogue A.4.2 step 6): an STag of another protection
    /// domain or stream (another connection's sink) is "not associated with
    /// this DDP stream" (1/1/0x02); an unknown STag, or a valid one of this
    /// stream that this Read did not name, is "invalid STag" (1/1/0x00).
    fn foreign_sink_cause(&self, stag: u32, to: u64, len: usize) -> TermCause {
        match self
            .dev
            .mem()
            .check(stag, self.pd, self.qpn, to, len as u64, Access::empty())
        {
            Err(AccessError::NotAssociated) => cause::DDP_ERR_T_STAG_NOT_ASSOCIATED,
            _ => cause::DDP_ERR_T_INVALID_STAG,
        }
    }

    /// A Read Response segment of `len` octets was placed.
    fn read_response_placed(&mut self, len: usize, last: bool) {
        if let Some(head) = self.orq.front_mut() {
            head.received += len;
        }
        if last {
            let Some(done) = self.orq.pop_front() else { return };
            if let Some(id) = done.slot {
                if let Some(s) = self.slot_mut(id) {
                    s.byte_len = done.received as u32;
                }
                self.finish_slot(id, WcStatus::Success);
                self.deliver_send_completions();
            }
        }
    }

    fn on_read_response(&mut self, stag: u32, to: u64, payload: &[u8], last: bool) -> RxResult {
        if let Some((buf, off)) = self.read_response_target(stag, to, payload.len(), last)? {
            buf.write(off, payload)
                .map_err(|_| Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS))?;
        }
        self.read_response_placed(payload.len(), last);
        Ok(())
    }

    /// Direct data placement (RFC 5041 §1): for a tagged Write or Read
    /// Response segment whose header (`hdr`: the 14 DDP/RDMAP octets) has
    /// arrived, the region its `len` payload octets go to, so the receive
    /// path can `read` them straight into place. `None`: take the ordinary
    /// path (which also raises any error this segment deserves).
    pub(crate) fn direct_target(&mut self, hdr: &[u8], len: usize) -> Option<(Arc<Buffer>, usize)> {
        if self.term_sent || self.term_received || self.rtr.is_some() {
            return None;
        }
        let h = Header::parse(hdr).ok()?;
        let (rv, _, opcode) = rdmap::split_control(h.rdmap_ctrl);
        if rv != rdmap::VERSION {
            return None;
        }
        let Addr::Tagged { stag, to } = h.addr else { return None };
        match opcode {
            op::WRITE => self.write_target(stag, to, len).ok().flatten(),
            op::READ_RESPONSE => self.read_response_target(stag, to, len, h.last).ok().flatten(),
            _ => None,
        }
    }

    /// The payload announced by [`Proto::direct_target`] is in place and
    /// its FPDU passed the CRC check.
    pub(crate) fn direct_placed(&mut self, hdr: &[u8], len: usize) {
        let Ok(h) = Header::parse(hdr) else { return };
        if rdmap::split_control(h.rdmap_ctrl).2 == op::READ_RESPONSE {
            self.read_response_placed(len, h.last);
        }
    }

    fn on_send(&mut self, opcode: u8, msn: u32, mo: u32, inv_stag: u32, payload: &[u8], last: bool) -> RxResult {
        let was_write = std::mem::replace(&mut self.last_was_write, false);
        let is_imm = matches!(opcode, op::IMM | op::IMM_SE);
        if self.rx_send.is_none() {
            let expect = self.rx_msn[0];
            if msn != expect {
                return Err(Fatal::new(cause::DDP_ERR_U_MSN_RANGE));
            }
            if mo != 0 {
                return Err(Fatal::new(cause::DDP_ERR_U_INVALID_MO));
            }
            // Matrix row 1: no receive posted (iWARP has no RNR retry).
            let Some(mut wqe) = self.rq.pop_front() else {
                return Err(Fatal::new(cause::DDP_ERR_U_NO_BUFFER));
            };
            match self.resolve(&wqe.sges, Access::LOCAL_WRITE) {
                Ok((pieces, cap)) => (wqe.pieces, wqe.cap) = (pieces, cap),
                Err(e) => {
                    // The receive's memory went away after it was posted:
                    // local protection error, and a local catastrophic
                    // Terminate (A.4.6 row 28), as siw does.
                    tracing::info!(qp = self.qpn, "receive {}: {e}", wqe.wr_id);
                    self.push_recv_completion(wc(wqe.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, self.qpn));
                    return Err(Fatal::bare(cause::RDMAP_LOCAL_CATASTROPHIC_ERR));
                }
            }
            self.rx_send = Some(RxSend { wqe, msn, got: 0 });
        }
        let rs = self.rx_send.as_mut().expect("set above");
        if msn != rs.msn {
            return Err(Fatal::new(cause::DDP_ERR_U_MSN_RANGE));
        }
        if mo as usize != rs.got {
            return Err(Fatal::new(cause::DDP_ERR_U_INVALID_MO));
        }
        if is_imm {
            // RFC 7306 §6.3: exactly 8 bytes of immediate data.
            if payload.len() != 8 || mo != 0 || !last {
                return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE));
            }
        } else {
            let end = rs.got.checked_add(payload.len());
            if end.is_none_or(|e| e > rs.wqe.cap) {
                // Matrix row 2 (RFC 5041 code 0x05).
                return Err(Fatal::new(cause::DDP_ERR_U_TOO_LONG));
            }
            scatter(&rs.wqe.pieces, rs.got, payload);
            rs.got += payload.len();
        }
        if !last {
            return Ok(());
        }
        let rs = self.rx_send.take().expect("checked");
        self.rx_msn[0] = rs.msn.wrapping_add(1);
        let mut w = wc(rs.wqe.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
        w.byte_len = rs.got as u32;
        w.solicited = matches!(opcode, op::SEND_SE | op::SEND_SE_INV | op::IMM_SE);
        if is_imm {
            let v = u64::from_be_bytes(payload.try_into().unwrap_or([0; 8]));
            w.imm_data = Some(v as u32);
            if was_write {
                w.opcode = WcOpcode::RecvRdmaWithImm;
            }
        }
        if matches!(opcode, op::SEND_INV | op::SEND_SE_INV) {
            use verbs::mem::InvalidateError;
            match self.dev.mem().remote_invalidate(inv_stag, self.pd, self.qpn) {
                Ok(()) => w.invalidated_rkey = Some(inv_stag),
                Err(e) => {
                    // RDMAP-SND-06; catalogue A.5 #4 on the error type.
                    let c = match e {
                        InvalidateError::InvalidStag => cause::RDMAP_ERR_CANNOT_INVALIDATE_OP,
                        _ => cause::RDMAP_ERR_CANNOT_INVALIDATE_PROT,
                    };
                    self.rq.push_front(rs.wqe);
                    return Err(Fatal::new(c));
                }
            }
        }
        self.push_recv_completion(w);
        Ok(())
    }

    /// A Read Request, its header already checked (exactly 28 octets,
    /// RDMAP-HDR-07, by [`Message::parse`]).
    fn on_read_request(&mut self, rr: ReadRequest) -> RxResult {
        if self.irq.len() + self.responding as usize >= self.ird as usize {
            // RDMAP-STR-04 / matrix row 19 (siw's choice).
            return Err(Fatal {
                cause: cause::RDMAP_ERR_CATASTROPHIC_STREAM,
                echo: true,
                rreq: Some(rr),
            });
        }
        if rr.size == 0 {
            // RDMAP-RD-08: no validation for a zero-length Read.
            self.irq.push_back(Irq::ReadResponse {
                src: None,
                len: 0,
                sink_stag: rr.sink_stag,
                sink_to: rr.sink_to,
            });
            return Ok(());
        }
        let r = self
            .dev
            .mem()
            .check(
                rr.src_stag,
                self.pd,
                self.qpn,
                rr.src_to,
                rr.size as u64,
                Access::REMOTE_READ,
            )
            .map_err(|e| Fatal {
                cause: rdmap_read_cause(e),
                echo: true,
                rreq: Some(rr),
            })?;
        self.irq.push_back(Irq::ReadResponse {
            src: Some(Piece {
                buf: r.buffer,
                off: r.offset,
                len: rr.size as usize,
            }),
            len: rr.size as usize,
            sink_stag: rr.sink_stag,
            sink_to: rr.sink_to,
        });
        Ok(())
    }

    fn on_atomic_request(&mut self, ar: AtomicRequest) -> RxResult {
        if self.irq.len() + self.responding as usize >= self.ird as usize {
            return Err(Fatal::new(cause::RDMAP_ERR_CATASTROPHIC_STREAM));
        }
        if !ar.remote_to.is_multiple_of(8) {
            // RFC 7306 §8.2: misaligned -> Remote Operation, catastrophic localized.
            return Err(Fatal::new(cause::RDMAP_ERR_CATASTROPHIC_STREAM));
        }
        let r = self
            .dev
            .mem()
            .check(
                ar.remote_stag,
                self.pd,
                self.qpn,
                ar.remote_to,
                8,
                Access::REMOTE_ATOMIC,
            )
            .map_err(|e| Fatal::new(rdmap_read_cause(e)))?;
        let f: Box<dyn Fn(u64) -> u64> = match ar.op {
            AtomicOp::FetchAdd => {
                let (add, mask) = (ar.add_swap_data, ar.add_swap_mask);
                Box::new(move |v| masked_add(v, add, mask))
            }
            AtomicOp::CmpSwap => {
                let (cmp, cmask, swap, smask) = (ar.compare_data, ar.compare_mask, ar.add_swap_data, ar.add_swap_mask);
                Box::new(move |v| {
                    if (cmp ^ v) & cmask == 0 {
                        (v & !smask) | (swap & smask)
                    } else {
                        v
                    }
                })
            }
            AtomicOp::Unknown(_) => return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE)),
        };
        let orig = r
            .buffer
            .atomic_rmw(r.offset, f)
            .map_err(|_| Fatal::new(cause::RDMAP_ERR_CATASTROPHIC_STREAM))?;
        self.irq.push_back(Irq::AtomicResponse {
            request_id: ar.request_id,
            orig,
        });
        Ok(())
    }

    fn on_atomic_response(&mut self, resp: AtomicResponse) -> RxResult {
        let matches = matches!(self.orq.front(), Some(Orq { kind: OrqKind::Atomic { request_id, .. }, .. }) if *request_id == resp.orig_request_id);
        if !matches {
            return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE));
        }
        let done = self.orq.pop_front().expect("checked");
        if let OrqKind::Atomic { sink, .. } = &done.kind {
            let _ = sink.buf.write(sink.off, &resp.orig_value.to_ne_bytes());
        }
        if let Some(id) = done.slot {
            self.finish_slot(id, WcStatus::Success);
            self.deliver_send_completions();
        }
        Ok(())
    }

    /// The peer's Terminate (parsed in either wire form by
    /// [`Message::parse`]), or `c` = 0/2/0xFF for an invalid one.
    fn on_terminate(&mut self, c: TermCause) {
        tracing::info!(qp = self.qpn, "Terminate received: {c}");
        self.term_received = true;
        // The oldest outstanding work request is the one the peer refused.
        let st = status_for_peer_terminate(&c);
        if let Some(s) = self.slots.iter_mut().find(|s| s.status.is_none()) {
            s.status = Some(st);
            s.vendor_err = pack_cause(&c);
        }
        // the event first: a consumer woken by the flushed completions finds it already queued
        self.events.push(CmEvent::TerminateReceived(term_info(&c)));
        self.enter_error();
        self.shutdown_when_drained = true;
    }

    /// The byte stream broke (RFC 5044 framing error, peer FIN or reset).
    pub(crate) fn on_stream_error(&mut self, fatal_cause: Option<TermCause>, reason: &str) {
        if let Some(c) = fatal_cause {
            self.terminate(Fatal::bare(c), None);
            return;
        }
        if !self.disconnected_event {
            self.disconnected_event = true;
            self.events.push(CmEvent::Disconnected);
        }
        if self.state != QpState::Err {
            tracing::info!(qp = self.qpn, "connection closed: {reason}");
            self.enter_error();
        }
        self.shutdown_when_drained = true;
    }

    pub(crate) fn disconnect(&mut self) {
        if self.state != QpState::Err {
            self.enter_error();
        }
        self.shutdown_when_drained = true;
    }
}

/// Frames one whole FPDU into the arena, `fill` writing its ULPDU (header-only
/// messages, small payloads, the Terminate, everything when markers are on).
/// False if it could not be framed; the caller undoes what was queued.
fn frame_copy(framer: &mut Framer, tx: &mut TxQueue, ulpdu_len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
    let Ok(w) = framer.wire_len(ulpdu_len) else {
        return false;
    };
    let mut ok = false;
    tx.push_bytes(w, |out| ok = framer.emit(ulpdu_len, out, fill).is_ok());
    ok
}

/// Frames one FPDU whose payload stays in registered memory: header octets
/// in the arena, the payload pieces referenced in place, then pad and CRC.
/// CRCs (when on) are computed over the pieces through a small bounce buffer.
#[allow(clippy::too_many_arguments)]
fn gather_fpdu(
    framer: &mut Framer,
    tx: &mut TxQueue,
    h: &Header,
    ddp_len: usize,
    rdmap_hdr: &[u8],
    src: &Source,
    off: usize,
    seg: usize,
) -> bool {
    let Source::Pieces(pieces) = src else { return false };
    let hdr_len = ddp_len + rdmap_hdr.len();
    let Ok(mut f) = framer.begin(hdr_len + seg) else {
        return false;
    };
    let mut hdr = [0u8; fpdu::HEADER_LEN + ddp::UNTAGGED_HEADER_LEN + 64];
    let Some(hb) = hdr.get_mut(..fpdu::HEADER_LEN + hdr_len) else {
        return false;
    };
    hb[..fpdu::HEADER_LEN].copy_from_slice(&f.header());
    if h.emit(&mut hb[fpdu::HEADER_LEN..]).is_err() {
        return false;
    }
    hb[fpdu::HEADER_LEN + ddp_len..].copy_from_slice(rdmap_hdr);
    f.update(&hb[fpdu::HEADER_LEN..]);
    tx.push_slice(hb);
    let (mut at, mut left) = (off, seg);
    for p in pieces {
        if left == 0 {
            break;
        }
        if at >= p.len {
            at -= p.len;
            continue;
        }
        let n = (p.len - at).min(left);
        if f.needs_bytes() {
            if p.buf.scan(p.off + at, n, |b| f.update(b)).is_err() {
                return false;
            }
        } else if f.account(n).is_err() {
            return false;
        }
        tx.push_mem(&p.buf, p.off + at, n);
        left -= n;
        at = 0;
    }
    match f.trailer() {
        Ok(t) => {
            tx.push_slice(t.as_ref());
            true
        }
        Err(_) => false,
    }
}

/// A fixed-size RDMAP header encoded into its own buffer.
fn encoded<E>(len: usize, emit: impl FnOnce(&mut [u8]) -> std::result::Result<usize, E>) -> Vec<u8> {
    let mut h = vec![0u8; len];
    // The buffer has exactly the header's length, so emit cannot fail.
    let _ = emit(&mut h);
    h
}

/// RFC 7306 §5.1.1 masked FetchAdd: a set mask bit ends a field (its carry is dropped).
fn masked_add(orig: u64, add: u64, mask: u64) -> u64 {
    if mask == 0 {
        return orig.wrapping_add(add);
    }
    let mut out = 0u64;
    let mut carry = 0u64;
    for bit in 0..64 {
        let b = 1u64 << bit;
        let sum = carry + ((orig & b) >> bit) + ((add & b) >> bit);
        if sum & 1 != 0 {
            out |= b;
        }
        carry = if mask & b != 0 { 0 } else { sum >> 1 };
    }
    out
}

fn scatter(pieces: &[Piece], mut at: usize, mut data: &[u8]) {
    for p in pieces {
        if data.is_empty() {
            return;
        }
        if at >= p.len {
            at -= p.len;
            continue;
        }
        let n = (p.len - at).min(data.len());
        let _ = p.buf.write(p.off + at, &data[..n]);
        data = &data[n..];
        at = 0;
    }
}

/// Receive-side byte handling: the MPA deframer and its input buffer.
struct RxIo {
    deframer: Deframer,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    /// A tagged segment whose payload is being read straight into place.
    direct: Option<Direct>,
}

/// Tagged payloads at least this long are placed directly.
const DIRECT_MIN: usize = 4096;
/// MPA ULPDU_Length plus the 14-octet tagged DDP/RDMAP header.
const TAGGED_FPDU_HEAD: usize = fpdu::HEADER_LEN + ddp::TAGGED_HEADER_LEN;

/// Direct data placement of one FPDU (RFC 5041 §1, "placement" without an
/// intermediate buffer): header checked, payload `read` into the region,
/// then pad and CRC from the ordinary buffer.
struct Direct {
    head: [u8; TAGGED_FPDU_HEAD],
    buf: Arc<Buffer>,
    off: usize,
    len: usize,
    done: usize,
    /// Pad and CRC octets after the payload.
    trailer: usize,
    total: usize,
}

impl RxIo {
    /// At an FPDU boundary with only the start of a large tagged segment
    /// buffered: set up direct placement (copying the part already here).
    fn start_direct(&mut self, p: &mut Proto) -> bool {
        let avail = self.end - self.start;
        if self.deframer.config().markers || !self.deframer.at_boundary() || avail < TAGGED_FPDU_HEAD {
            return false;
        }
        let b = &self.buf[self.start..self.end];
        let ulpdu = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let total = fpdu::fpdu_len(ulpdu);
        if avail >= total
            || ddp::header_len_for(b[fpdu::HEADER_LEN]) != ddp::TAGGED_HEADER_LEN
            || ulpdu < ddp::TAGGED_HEADER_LEN + DIRECT_MIN
            || ulpdu > usize::from(self.deframer.config().max_ulpdu_len)
        {
            return false;
        }
        let len = ulpdu - ddp::TAGGED_HEADER_LEN;
        let Some((buf, off)) = p.direct_target(&b[fpdu::HEADER_LEN..TAGGED_FPDU_HEAD], len) else {
            return false;
        };
        let have = (avail - TAGGED_FPDU_HEAD).min(len);
        if buf.write(off, &b[TAGGED_FPDU_HEAD..TAGGED_FPDU_HEAD + have]).is_err() {
            return false;
        }
        let mut head = [0u8; TAGGED_FPDU_HEAD];
        head.copy_from_slice(&b[..TAGGED_FPDU_HEAD]);
        self.start += TAGGED_FPDU_HEAD + have;
        self.direct = Some(Direct {
            head,
            buf,
            off,
            len,
            done: have,
            trailer: fpdu::pad_len(ulpdu) + fpdu::CRC_LEN,
            total,
        });
        true
    }

    /// The payload is in place and the trailer buffered: check the CRC and
    /// hand the segment to the protocol.
    fn finish_direct(&mut self, p: &mut Proto) {
        let Some(d) = self.direct.take() else { return };
        let t = &self.buf[self.start..self.start + d.trailer];
        let pad = d.trailer - fpdu::CRC_LEN;
        self.start += d.trailer;
        if self.deframer.config().crc {
            let mut c = crate::crc::Crc32c::new();
            c.update(&d.head);
            let _ = d.buf.scan(d.off, d.len, |b| c.update(b));
            c.update(&t[..pad]);
            let computed = c.finish();
            let received = crate::crc::from_wire([t[pad], t[pad + 1], t[pad + 2], t[pad + 3]]);
            if computed != received {
                // The payload was placed before the check: the region's
                // contents are undefined after the error, as for any failed
                // operation (RFC 5040 §5.5); the stream ends here.
                let e = self.deframer.fail_crc(computed, received);
                p.on_stream_error(Some(e.cause()), "MPA CRC error");
                self.start = self.end;
                return;
            }
        }
        let _ = self.deframer.skip_fpdu(d.total);
        p.direct_placed(&d.head[fpdu::HEADER_LEN..], d.len);
    }
}

struct Core {
    p: Proto,
    rx: RxIo,
}

/// A connected iWARP QP.
pub struct IwarpQp {
    qpn: u32,
    sock: TcpStream,
    driver: Arc<Driver>,
    token: Mutex<Option<mio::Token>>,
    busy: BusyPoll,
    core: Mutex<Core>,
    poke: Poke,
    state: Arc<AtomicU8>,
    info: ConnInfo,
}

fn state_code(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

fn code_state(c: u8) -> QpState {
    [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ][c.min(6) as usize]
}

impl IwarpQp {
    /// Wraps an MPA-negotiated socket. `leftover` are bytes read past the MPA
    /// frame during the handshake (the peer's first FPDUs).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        sock: TcpStream,
        leftover: Vec<u8>,
        driver: Arc<Driver>,
        req: verbs::cm::QpRequest,
        qpn: u32,
        neg: Negotiated,
        siw_term_form: bool,
        max_ulpdu: usize,
    ) -> std::io::Result<Arc<IwarpQp>> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        let mut attr = req.attr.clone();
        attr.max_send_wr = attr.max_send_wr.max(1);
        attr.max_recv_wr = attr.max_recv_wr.max(1);
        let p = Proto::new(
            qpn,
            req.pd.id(),
            req.pd.device().clone(),
            req.send_cq.clone(),
            req.recv_cq.clone(),
            req.events.clone(),
            attr,
            &neg,
            siw_term_form,
            max_ulpdu,
        );
        let mut buf = vec![0u8; RX_BUF + 70_000];
        let n = leftover.len().min(buf.len());
        buf[..n].copy_from_slice(&leftover[..n]);
        let rx = RxIo {
            deframer: Deframer::new(DeframerConfig {
                crc: neg.crc,
                markers: neg.markers_rx,
                ..Default::default()
            }),
            buf,
            start: 0,
            end: n,
            eof: false,
            direct: None,
        };
        let mut p = p;
        // Receives the application posted before the connection went live
        // (rdma_cm order: post_recv, then accept/connect).
        if !req.initial_recvs.is_empty() {
            p.post_recv(&req.initial_recvs)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        }
        let p_state = p.shared_state.clone();
        let established_now = !matches!(neg.rtr, Some(RtrRole::Expect(_)));
        let qp = Arc::new(IwarpQp {
            qpn,
            sock,
            driver: driver.clone(),
            token: Mutex::new(None),
            busy: BusyPoll::new(),
            core: Mutex::new(Core { p, rx }),
            poke: Poke::new(),
            state: p_state,
            info: neg.info.clone(),
        });
        if established_now {
            req.events.push(CmEvent::Established);
        }
        let weak: Weak<dyn Pollable> = Arc::downgrade(&qp) as Weak<dyn Pollable>;
        let prog: Weak<dyn Progress> = Arc::downgrade(&qp) as Weak<dyn Progress>;
        req.send_cq.attach(prog.clone());
        if !req.recv_cq.same(&req.send_cq) {
            req.recv_cq.attach(prog);
        }
        let t = driver.register(qp.sock.as_raw_fd(), weak)?;
        *qp.token.lock().unwrap() = Some(t);
        // Bytes that came with the handshake, and an RTR to send.
        qp.kick();
        Ok(qp)
    }

    /// Runs transmit and receive progress if no other thread is doing it.
    fn kick(&self) -> bool {
        self.poke.run(&self.core, |c| self.work(c))
    }

    fn work(&self, c: &mut Core) -> bool {
        let mut any = false;
        loop {
            let mut round = self.pump_rx(c);
            round |= self.pump_tx(&mut c.p);
            any |= round;
            if !round {
                break;
            }
        }
        any
    }

    /// Reads and processes everything the socket has.
    fn pump_rx(&self, c: &mut Core) -> bool {
        let mut any = false;
        let Core { p, rx } = c;
        let fd = self.sock.as_raw_fd();
        loop {
            if p.term_sent || p.term_received {
                rx.direct = None;
                break;
            }
            match &rx.direct {
                Some(d) if d.done == d.len && rx.end - rx.start >= d.trailer => {
                    rx.finish_direct(p);
                    any = true;
                    continue;
                }
                Some(_) => {}
                None => {
                    // Deliver whole FPDUs already buffered.
                    while rx.start < rx.end && !p.term_sent && !p.term_received {
                        if rx.start_direct(p) {
                            any = true;
                            break;
                        }
                        match rx.deframer.next_fpdu(&rx.buf[rx.start..rx.end]) {
                            Ok((used, ulpdu)) => {
                                if let Some(u) = ulpdu {
                                    p.on_ulpdu(u);
                                    any = true;
                                }
                                rx.start += used;
                                if used == 0 {
                                    break;
                                }
                            }
                            Err(e) => {
                                p.on_stream_error(Some(e.cause()), "MPA framing error");
                                rx.start = rx.end;
                                any = true;
                            }
                        }
                    }
                    if rx.direct.is_some() {
                        continue;
                    }
                }
            }
            if rx.eof || p.term_sent || p.term_received {
                break;
            }
            let res = match rx.direct.as_mut() {
                Some(d) if d.done < d.len => {
                    // The payload straight into place, the trailer and the
                    // next FPDU's header into the buffer, in one readv.
                    rx.start = 0;
                    rx.end = 0;
                    let tail = d.trailer + TAGGED_FPDU_HEAD;
                    d.buf
                        .recv_into_then(fd, d.off + d.done, d.len - d.done, &mut rx.buf[..tail])
                        .inspect(|&n| {
                            let placed = n.min(d.len - d.done);
                            d.done += placed;
                            rx.end = n - placed;
                        })
                }
                _ => {
                    if rx.start == rx.end {
                        rx.start = 0;
                        rx.end = 0;
                    } else if rx.end == rx.buf.len() {
                        if rx.direct.is_some() {
                            // Part of a trailer: keep it.
                            rx.buf.copy_within(rx.start..rx.end, 0);
                            rx.end -= rx.start;
                        } else {
                            // The deframer copied the partial FPDU.
                            rx.end = 0;
                        }
                        rx.start = 0;
                    }
                    (&self.sock).read(&mut rx.buf[rx.end..]).inspect(|&n| rx.end += n)
                }
            };
            match res {
                Ok(0) => {
                    rx.eof = true;
                    p.on_stream_error(None, "peer closed the connection");
                    any = true;
                    break;
                }
                Ok(_) => any = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    rx.eof = true;
                    p.on_stream_error(None, &e.to_string());
                    any = true;
                    break;
                }
            }
        }
        any
    }

    /// Frames pending work and writes it until the socket would block.
    fn pump_tx(&self, p: &mut Proto) -> bool {
        let mut any = false;
        loop {
            any |= p.fill_tx();
            if p.tx_pending() == 0 {
                break;
            }
            match p.tx_queue().write_to(self.sock.as_raw_fd()) {
                Ok(n) => {
                    p.consumed_out(n);
                    any = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    p.discard_out();
                    p.on_stream_error(None, &e.to_string());
                    break;
                }
            }
        }
        if p.shutdown_when_drained && !p.shut && p.tx_pending() == 0 {
            p.shut = true;
            let _ = self.sock.shutdown(std::net::Shutdown::Write);
        }
        any
    }

    fn with_core<R>(&self, f: impl FnOnce(&mut Proto) -> R) -> R {
        let mut c = self.core.lock().unwrap();
        let r = f(&mut c.p);
        self.work(&mut c);
        drop(c);
        // Work that arrived while we held the lock.
        self.kick();
        r
    }
}

impl Pollable for IwarpQp {
    fn on_event(&self, _readable: bool, _writable: bool) {
        self.kick();
    }
    fn still_muted(&self) -> bool {
        if !self.busy.idle_for(BUSY_POLL_IDLE) {
            return true;
        }
        self.unmute();
        false
    }
}

/// A poller that has polled without a gap this long is busy-polling.
const BUSY_POLL_AFTER: Duration = Duration::from_micros(20);
/// A gap between polls this long ends busy polling.
const BUSY_POLL_GAP: Duration = Duration::from_micros(10);
/// A busy poller silent this long is gone: the progress thread takes over.
const BUSY_POLL_IDLE: Duration = Duration::from_micros(100);

impl IwarpQp {
    fn unmute(&self) {
        if self.busy.muted.swap(false, Ordering::AcqRel)
            && let Some(t) = *self.token.lock().unwrap()
        {
            self.driver.unmute(self.sock.as_raw_fd(), t);
            self.kick();
        }
    }
}

impl Progress for IwarpQp {
    fn progress(&self) -> bool {
        if self.busy.note_poll(BUSY_POLL_GAP, BUSY_POLL_AFTER)
            && let Some(t) = *self.token.lock().unwrap()
        {
            // An application thread spins on this QP's CQ: it reads the
            // socket itself, so the progress thread need not wake for it.
            self.driver.mute(self.sock.as_raw_fd(), t);
        }
        self.kick()
    }
    fn parked(&self) {
        self.unmute();
    }
}

/// Busy-poll bookkeeping of one QP (timestamps in ns since a process epoch).
struct BusyPoll {
    last: std::sync::atomic::AtomicU64,
    since: std::sync::atomic::AtomicU64,
    muted: std::sync::atomic::AtomicBool,
}

fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

impl BusyPoll {
    fn new() -> Self {
        BusyPoll {
            last: 0.into(),
            since: 0.into(),
            muted: false.into(),
        }
    }
    /// Records a poll; true when this poll makes the QP busy-polled (mute it).
    fn note_poll(&self, gap: Duration, after: Duration) -> bool {
        let now = now_ns();
        let last = self.last.swap(now, Ordering::AcqRel);
        if now.saturating_sub(last) > gap.as_nanos() as u64 {
            self.since.store(now, Ordering::Release);
            return false;
        }
        now.saturating_sub(self.since.load(Ordering::Acquire)) >= after.as_nanos() as u64
            && !self.muted.swap(true, Ordering::AcqRel)
    }
    fn idle_for(&self, d: Duration) -> bool {
        now_ns().saturating_sub(self.last.load(Ordering::Acquire)) >= d.as_nanos() as u64
    }
}

impl QpOps for IwarpQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }
    fn state(&self) -> QpState {
        code_state(self.state.load(Ordering::Acquire))
    }
    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        self.with_core(|p| p.post_send(wrs))
    }
    fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        self.with_core(|p| p.post_recv(wrs))
    }
    fn disconnect(&self) {
        self.with_core(|p| {
            p.disconnect();
            if !p.disconnected_event {
                p.disconnected_event = true;
                p.events.push(CmEvent::Disconnected);
            }
        });
    }
    fn set_error(&self) {
        self.with_core(|p| p.enter_error());
    }
    fn conn_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl Drop for IwarpQp {
    fn drop(&mut self) {
        if let Some(t) = self.token.lock().unwrap().take() {
            self.driver.deregister(self.sock.as_raw_fd(), t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_fetch_add_rfc7306_5_1_1() {
        assert_eq!(masked_add(5, 3, 0), 8);
        assert_eq!(masked_add(u64::MAX, 1, 0), 0);
        // Two 32-bit fields: bit 31 ends the low field, so its carry is dropped.
        let mask = 1u64 << 31 | 1u64 << 63;
        assert_eq!(masked_add(0x0000_0001_FFFF_FFFF, 1, mask), 0x0000_0001_0000_0000);
    }
}
