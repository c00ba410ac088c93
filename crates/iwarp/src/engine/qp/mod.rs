//! One iWARP queue pair over one TCP connection: transmit (segmentation and
//! framing), receive (deframing, checks, placement), the send/receive queues,
//! the outbound and inbound Read/atomic queues (ORD/IRD), completions in
//! posting order, and Terminate handling (RFC 5040 §5-§7, RFC 5041, RFC 7306).
//!
//! The protocol state lives in `Proto`; it does no I/O. [`IwarpQp`] owns the
//! socket and moves bytes between it and `Proto` in `pump_tx` / `pump_rx`.
//!
//! Split by role, like Linux siw (`siw_qp.c`, `siw_qp_tx.c`, `siw_qp_rx.c`):
//!
//! | file | role |
//! | --- | --- |
//! | `mod.rs` | the state (`Proto` and its queues), posting work requests, completions in order, the error state and sending the one Terminate |
//! | `tx.rs` | work requests and responses to RDMAP messages, DDP segmentation (`wire::ddp::segment_len`), MPA framing onto the gather list |
//! | `lean.rs` | the lean path of a small one-segment Send, Write or Read Request posted to an idle queue: framed straight from the work request (`Framer::emit_segment`), one `writev`, the completion straight into the CQ |
//! | `rx.rs` | ULPDUs through `wire::ddp` / `wire::rdmap` parsing, then DDP sequencing and buffer checks, Read/atomic and memory checks, placement, receive completions, the peer's Terminate |
//! | `rx_buf.rs` | the receive buffer, no I/O: the deframer, ULPDUs to `rx.rs`, direct placement of large tagged segments |
//! | `io.rs` | the socket: `read` into the buffer, `readv` of a directly placed payload, `writev`, progress hooks and busy polling |
//! | `harness.rs` | tests and fuzzing: cores back to back in memory through `rx_buf.rs` |

use super::driver::{Driver, Muted, Poke, Pollable};
use super::txq::TxQueue;
use crate::detail::TerminateInfo;
use crate::wire::cause::{self, TermCause};
use crate::wire::ddp::{self, Addr, Header};
use crate::wire::fpdu;
use crate::wire::fpdu::{Deframer, DeframerConfig, Framer};
use crate::wire::rdmap::{self, AtomicOp, AtomicRequest, AtomicResponse, Message, ReadRequest, op, qn};
use crate::wire::terminate::{self, Offending};
use handle::QpSetup;
use std::collections::VecDeque;
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use verbs::buffer::Buffer;
use verbs::cq::Progress;
use verbs::mem::AccessError;
use verbs::mem::MemTable;
use verbs::notify::EventQueue;
use verbs::provider::CqProviderExt;
use verbs::{
    Access, CompletionQueue, Error, QpInitAttr, QpState, RecvWr, Result, SendFlags, SendWr, WcOpcode, WcStatus,
    WorkCompletion, WrError, WrOpcode,
};
use verbs::{CmEvent, ConnInfo, ErrorDetail};

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
    /// The DDP header of the message's first octet (L clear): what
    /// [`Header::at_offset`] advances for each segment.
    #[inline]
    fn first_header(&self) -> Header {
        Header {
            last: false,
            rdmap_ctrl: rdmap_ctrl(self.opcode),
            addr: match self.tagged {
                Some((stag, to)) => Addr::Tagged { stag, to },
                None => Addr::Untagged {
                    qn: self.qn,
                    msn: self.msn,
                    mo: 0,
                    inv_stag: self.inv_stag,
                },
            },
        }
    }

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
    /// RDMAP opcode of its first segment: every later one must repeat it.
    opcode: u8,
    got: usize,
}

/// The tagged message being received. Its segments arrive back to back
/// over the one TCP stream; one tagged message at a time, as Linux siw.
#[derive(Debug, Clone, Copy)]
struct RxTagged {
    opcode: u8,
    stag: u32,
    /// TO where the next segment must start (RFC 5041 §5.2).
    next_to: u64,
}

/// Most spare receive WQEs kept for reuse ([`Proto::retire_recv`]).
const SPARE_RECVS: usize = 16;

/// Protocol state of one QP. No I/O.
pub(crate) struct Proto {
    qpn: u32,
    pd: u32,
    mem: Arc<MemTable>,
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
    /// A peer's Read or Atomic request was queued on `irq` since the socket side
    /// last looked (it keeps the progress thread awake for the next, issue 18).
    pub(super) answered: bool,
    /// Slots a write completed (`consumed_out`), kept to spare an allocation per write.
    done_scratch: Vec<u64>,
    /// The resolved SGE list of the last message framed, emptied, for the next one
    /// (issue 18, session 13: no allocation per message for it).
    spare_pieces: Vec<Piece>,
    /// The SGE list of send slot `.0`, resolved when it was posted because nothing was
    /// queued ahead of it (`queue_send`): the transmit pass of the same `post_send`
    /// frames it without a second lookup of each SGE (issue 18, session 15). Valid only
    /// until that pass ends ([`expire_posted`](Self::expire_posted)): a work request
    /// left queued is resolved again when framed, so a region deregistered meanwhile
    /// fails it (SEC-STAG-02), as before.
    posted: Option<(u64, Vec<Piece>, usize)>,
    /// Receive WQEs whose message completed, their lists emptied, for `post_recv` to
    /// reuse (`retire_recv`): a receive costs no allocation when posted and no free on
    /// the path from arrival to its completion (issue 18, session 14).
    spare_recvs: Vec<RecvWqe>,
    /// The lean path of small one-segment messages (`lean.rs`, issue 18, session 17).
    lean: Box<lean::Lean>,
    /// Snapshot of the receive buffers' registration (`post_recv`, a Send's arrival) and
    /// of the rkeys a peer's Writes and Read Requests name: the same checks as the
    /// table's without its lock and look-up while no registration changed (issue 18,
    /// session 17; `MemTable::check_cached`, SEC-STAG-02).
    rx_lkeys: verbs::mem::MrCache,
    rkeys: verbs::mem::MrCache,
    ird: u32,
    next_atomic_id: u32,
    rtr: Option<RtrRole>,

    // receive
    rq: VecDeque<RecvWqe>,
    rx_msn: [u32; 4],
    rx_send: Option<RxSend>,
    rx_tagged: Option<RxTagged>,
    last_was_write: bool,

    // teardown
    term_sent: bool,
    term_received: bool,
    /// Shut the socket's write side once `out` is drained.
    shutdown_when_drained: bool,
    shut: bool,
    disconnected_event: bool,
}

pub(crate) fn wc(slot_or_wr: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
    WorkCompletion::new(slot_or_wr, status, opcode, qp_num)
}

/// The cause as `vendor_err` carries it ([`TerminateInfo::vendor_err`]).
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

/// A Terminate's cause as the detail of a CM event.
fn term_detail(c: &TermCause) -> ErrorDetail {
    ErrorDetail::new(term_info(c))
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
        mem: Arc<MemTable>,
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
            mem,
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
            answered: false,
            done_scratch: Vec::new(),
            spare_pieces: Vec::new(),
            posted: None,
            spare_recvs: Vec::new(),
            lean: lean::Lean::new(),
            rx_lkeys: Default::default(),
            rkeys: Default::default(),
            ird: neg.ird,
            next_atomic_id: 1,
            rtr: neg.rtr,
            rq: VecDeque::new(),
            rx_msn: [1; 4],
            rx_send: None,
            rx_tagged: None,
            last_was_write: false,
            term_sent: false,
            term_received: false,
            shutdown_when_drained: false,
            shut: false,
            disconnected_event: false,
        }
    }

    fn resolve(&self, sges: &[verbs::Sge], need: Access) -> std::result::Result<(Vec<Piece>, usize), WrError> {
        let mut pieces = Vec::with_capacity(sges.len());
        let total = self.resolve_into(sges, need, &mut pieces)?;
        Ok((pieces, total))
    }

    /// [`resolve`](Self::resolve) into the list kept from the last message framed
    /// (`spare_pieces`): no allocation per message.
    fn resolve_spare(
        &mut self,
        sges: &[verbs::Sge],
        need: Access,
    ) -> std::result::Result<(Vec<Piece>, usize), WrError> {
        let mut p = std::mem::take(&mut self.spare_pieces);
        let n = self.resolve_into(sges, need, &mut p)?;
        Ok((p, n))
    }

    /// [`resolve`](Self::resolve) into a list the caller has (emptied first): a list
    /// kept from an earlier message costs no allocation.
    fn resolve_into(
        &self,
        sges: &[verbs::Sge],
        need: Access,
        pieces: &mut Vec<Piece>,
    ) -> std::result::Result<usize, WrError> {
        let (mem, pd, qpn) = (&self.mem, self.pd, self.qpn);
        collect_pieces(sges, pieces, |s| {
            mem.check(s.lkey, pd, qpn, s.addr, s.length as u64, need)
        })
    }

    /// [`resolve_into`](Self::resolve_into) of a receive WQE's SGEs through the receive
    /// side's snapshot (`rx_lkeys`): the same checks, no look-up while the table is
    /// unchanged.
    fn resolve_recv(&mut self, sges: &[verbs::Sge], pieces: &mut Vec<Piece>) -> std::result::Result<usize, WrError> {
        let (mem, cache, pd, qpn) = (&self.mem, &mut self.rx_lkeys, self.pd, self.qpn);
        collect_pieces(sges, pieces, |s| {
            mem.check_cached(cache, s.lkey, pd, qpn, s.addr, s.length as u64, Access::LOCAL_WRITE)
        })
    }

    /// Nothing to frame is queued: a work request posted now is the next message.
    fn tx_idle(&self) -> bool {
        self.cur.is_none() && self.follow.is_none() && self.rtr.is_none() && self.irq.is_empty() && self.sq.is_empty()
    }

    /// Ends the post-time resolution of [`posted`](Self::posted): called when the
    /// transmit pass after a post is over (`IwarpQp::with_core`). A work request the
    /// pass did not frame (send queue at its high-water mark, ORD reached, a fence)
    /// is resolved again when it is, so a region deregistered in between fails it.
    pub(crate) fn expire_posted(&mut self) {
        if let Some((_, mut p, _)) = self.posted.take() {
            p.clear();
            if self.spare_pieces.capacity() == 0 {
                self.spare_pieces = p;
            }
        }
    }

    /// The post-time check of an SGE list (`bad_wr` when an lkey does not allow
    /// `need` over its range), without resolving it: that happens when the
    /// work request is sent, so a post costs no allocation.
    fn verify_sges(&self, sges: &[verbs::Sge], need: Access) -> std::result::Result<(), WrError> {
        for s in sges.iter().filter(|s| s.length != 0) {
            self.mem
                .verify(s.lkey, self.pd, self.qpn, s.addr, s.length as u64, need)
                .map_err(|error| WrError::LocalProtection { lkey: s.lkey, error })?;
        }
        Ok(())
    }

    fn outstanding_send_wrs(&self) -> usize {
        self.slots.len() + usize::from(self.lean_pending())
    }

    /// Posts send work requests. In the Error state they are accepted and
    /// complete at once with `WrFlushErr`, in order behind anything still
    /// queued (IBTA, rdma-core and Linux siw semantics): an application that
    /// posts before it polls still learns why the QP failed from the
    /// completion and event that came first (issue 12 point 9).
    pub(crate) fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        self.unlean(0);
        if self.state == QpState::Err {
            for wr in wrs {
                let id = self.next_slot;
                self.next_slot += 1;
                self.slots.push_back(Slot {
                    id,
                    wr_id: wr.wr_id,
                    opcode: match wr.opcode {
                        WrOpcode::Send | WrOpcode::SendWithInv { .. } | WrOpcode::SendWithImm { .. } => WcOpcode::Send,
                        WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
                        WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
                        WrOpcode::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
                        WrOpcode::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
                        WrOpcode::LocalInv { .. } => WcOpcode::LocalInv,
                        WrOpcode::RegMr { .. } => WcOpcode::RegMr,
                    },
                    signaled: true,
                    status: Some(WcStatus::WrFlushErr),
                    byte_len: 0,
                    vendor_err: 0,
                });
            }
            self.deliver_send_completions();
            return Ok(());
        }
        for (index, wr) in wrs.iter().enumerate() {
            let (id, inline) = self.queue_send(index, wr)?;
            self.sq.push_back((id, wr.clone(), inline));
        }
        Ok(())
    }

    /// [`post_send`](Self::post_send) of one work request the caller gives away
    /// (`QueuePair::post_send_one`): queued without a copy of its SGE list.
    pub(crate) fn post_send_owned(&mut self, wr: SendWr) -> Result<()> {
        if self.state == QpState::Err {
            return self.post_send(std::slice::from_ref(&wr));
        }
        if self.try_lean(&wr) {
            return Ok(());
        }
        let (id, inline) = self.queue_send(0, &wr)?;
        self.sq.push_back((id, wr, inline));
        Ok(())
    }

    /// The post-time checks of send work request number `index` and its slot in the
    /// completion order; returns the slot's id and the inline copy of its payload.
    fn queue_send(&mut self, index: usize, wr: &SendWr) -> Result<(u64, Option<Vec<u8>>)> {
        {
            let bad = |error: WrError| Error::BadWr { index, error };
            if self.state != QpState::Rts {
                return Err(bad(WrError::QpState(self.state)));
            }
            if self.outstanding_send_wrs() >= self.attr.max_send_wr as usize {
                return Err(bad(WrError::SendQueueFull {
                    max: self.attr.max_send_wr,
                }));
            }
            if wr.sg_list.len() > self.attr.max_send_sge.max(1) as usize {
                return Err(bad(WrError::TooManySges {
                    sges: wr.sg_list.len(),
                    max: self.attr.max_send_sge.max(1),
                }));
            }
            let total = wr.len();
            let (need, opcode) = match &wr.opcode {
                WrOpcode::Send | WrOpcode::SendWithInv { .. } => (Access::LOCAL_READ, WcOpcode::Send),
                WrOpcode::SendWithImm { .. } => {
                    if total != 0 {
                        return Err(bad(WrError::Opcode(
                            "RFC 7306 Immediate Data carries no payload: use an empty sg list",
                        )));
                    }
                    (Access::LOCAL_READ, WcOpcode::Send)
                }
                WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => {
                    (Access::LOCAL_READ, WcOpcode::RdmaWrite)
                }
                WrOpcode::RdmaRead { .. } => {
                    if wr.sg_list.len() > 1 {
                        return Err(bad(WrError::TooManyReadSges {
                            sges: wr.sg_list.len(),
                            max: 1,
                        }));
                    }
                    (Access::LOCAL_WRITE, WcOpcode::RdmaRead)
                }
                WrOpcode::AtomicFetchAdd { .. } | WrOpcode::AtomicCmpSwap { .. } => {
                    if wr.sg_list.len() != 1 || wr.sg_list[0].length != 8 {
                        return Err(bad(WrError::AtomicSge));
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
                return Err(bad(WrError::TooLong {
                    len: total,
                    max: u32::MAX as u64,
                }));
            }
            let inline = if wr.flags.contains(SendFlags::INLINE) && need == Access::LOCAL_READ {
                if total > self.attr.max_inline_data as u64 {
                    return Err(bad(WrError::InlineTooLarge {
                        len: total,
                        max: self.attr.max_inline_data,
                    }));
                }
                let (pieces, len) = self.resolve(&wr.sg_list, need).map_err(bad)?;
                let mut v = vec![0u8; len];
                Source::Pieces(pieces).copy_out(0, &mut v);
                Some(v)
            } else if !need.is_empty() && self.posted.is_none() && self.tx_idle() {
                // Nothing queued ahead: this request is framed by the transmit pass
                // that follows the post, under the same lock. Resolve (and check) its
                // SGEs once, for both the post-time check and the framing.
                let (pieces, n) = self.resolve_spare(&wr.sg_list, need).map_err(bad)?;
                self.posted = Some((self.next_slot, pieces, n));
                None
            } else {
                if !need.is_empty() {
                    self.verify_sges(&wr.sg_list, need).map_err(bad)?;
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
            Ok((id, inline))
        }
    }

    /// Posts receive work requests; in the Error state each completes at
    /// once with `WrFlushErr` (see [`post_send`](Self::post_send)).
    pub(crate) fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        if self.state == QpState::Err {
            for wr in wrs {
                self.push_recv_completion(wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn));
            }
            return Ok(());
        }
        for (index, wr) in wrs.iter().enumerate() {
            let bad = |error: WrError| Error::BadWr { index, error };
            if self.state == QpState::Reset {
                return Err(bad(WrError::QpState(self.state)));
            }
            if self.rq.len() >= self.attr.max_recv_wr as usize {
                return Err(bad(WrError::RecvQueueFull {
                    max: self.attr.max_recv_wr,
                }));
            }
            if wr.sg_list.len() > self.attr.max_recv_sge.max(1) as usize {
                return Err(bad(WrError::TooManySges {
                    sges: wr.sg_list.len(),
                    max: self.attr.max_recv_sge.max(1),
                }));
            }
            // A WQE whose message completed lends its two lists (no allocation).
            let mut wqe = self.spare_recvs.pop().unwrap_or_else(|| RecvWqe {
                wr_id: 0,
                sges: Vec::with_capacity(wr.sg_list.len()),
                pieces: Vec::with_capacity(wr.sg_list.len()),
                cap: 0,
            });
            wqe.cap = self.resolve_recv(&wr.sg_list, &mut wqe.pieces).map_err(bad)?;
            wqe.wr_id = wr.wr_id;
            wqe.sges.clear();
            wqe.sges.extend_from_slice(&wr.sg_list);
            self.rq.push_back(wqe);
        }
        Ok(())
    }

    /// Keeps a receive WQE whose message completed for [`post_recv`](Self::post_recv) to
    /// reuse, its references to registered memory dropped now (a spare WQE keeps no region
    /// alive) but its two lists kept: their free was on the path from a message's
    /// arrival to its completion, and `post_recv` allocated them again. At most
    /// [`SPARE_RECVS`] are kept.
    fn retire_recv(&mut self, mut wqe: RecvWqe) {
        if self.spare_recvs.len() < SPARE_RECVS {
            wqe.pieces.clear();
            self.spare_recvs.push(wqe);
        }
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
    /// Makes ERR visible to the application (`QueuePair::state`) before the event that says
    /// why is queued: a consumer that sees the event must find the QP in ERR.
    fn publish_error_state(&mut self) {
        self.state = QpState::Err;
        self.shared_state.store(state_code(QpState::Err), Ordering::Release);
    }

    fn enter_error(&mut self) {
        self.unlean(0);
        self.publish_error_state();
        self.expire_posted();
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
        // A lean message framed and not yet written goes first (stream order).
        self.unlean(0);
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
        // The state, then the event (see on_terminate), then the failing work request (if
        // ours) gets the local status.
        self.publish_error_state();
        self.events.push(CmEvent::ErrorSent(term_detail(&f.cause)));
        self.enter_error();
        self.shutdown_when_drained = true;
    }
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

/// The non-empty SGEs of a work request as pieces of registered memory, each checked by
/// `check` (key, PD, rights, bounds: SEC-STAG-01), into `pieces` (emptied first); their
/// total length.
fn collect_pieces(
    sges: &[verbs::Sge],
    pieces: &mut Vec<Piece>,
    mut check: impl FnMut(&verbs::Sge) -> std::result::Result<verbs::mem::Resolved, verbs::mem::AccessError>,
) -> std::result::Result<usize, WrError> {
    pieces.clear();
    let mut total = 0usize;
    for s in sges {
        if s.length == 0 {
            continue;
        }
        let r = check(s).map_err(|error| WrError::LocalProtection { lkey: s.lkey, error })?;
        total = total.checked_add(s.length as usize).ok_or(WrError::TooLong {
            len: u64::MAX,
            max: usize::MAX as u64,
        })?;
        pieces.push(Piece {
            buf: r.buffer,
            off: r.offset,
            len: s.length as usize,
        });
    }
    Ok(total)
}

#[cfg(test)]
mod core_tests;
pub(crate) mod handle;
#[cfg(any(test, feature = "fuzz"))]
pub mod harness;
mod io;
mod lean;
mod rx;
mod rx_buf;
mod tx;

pub use io::{
    IwarpQp, core_lock_waits, inline_waits_for_holder, inline_wakeups, progress_thread_events,
    progress_thread_mute_checks, socket_reads,
};
pub use lean::lean_posts;
use tx::frame_copy;
