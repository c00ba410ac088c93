//! The RC transport of one queue pair as a sans-I/O core (IBA vol. 1 ch. 9: §9.7 reliable
//! service, §9.9 error handling; ch. 10 for QP states and completions), driven the way
//! quinn-proto drives a connection: no sockets, no threads, no clock.
//!
//! Section numbers below the third level are left out on purpose: they were not checked
//! against the specification text, only against Linux rxe's behaviour.
//!
//! ```text
//!  post_send(wr) / post_recv(wr) / modify(attr)
//!  handle_packet(now, &Packet)      -- a parsed, ICRC-checked packet from the peer
//!  handle_timeout(now)              -- when poll_timeout() has passed
//!  poll_transmit(now, &mut buf)     -- the next packet to send (ICRC field left 0: the engine seals it)
//!  poll_completion()                -- work completions, send and receive, in order per queue
//!  poll_timeout()                   -- when to call handle_timeout next
//! ```
//!
//! Time only comes in as `now`. `poll_transmit` takes `now` too (unlike the plain
//! `poll_transmit(&mut buf)` of the task text): sending a request arms the local ACK timer,
//! which needs the send time (quinn-proto's `poll_transmit` takes `now` for the same reason).
//!
//! ## Roles (split as Linux rxe splits them: `rxe_req.c`, `rxe_comp.c`, `rxe_resp.c`)
//!
//! | file | role | state it keeps |
//! | --- | --- | --- |
//! | [`requester`] | send WQEs to packets: path-MTU segmentation (FIRST/MIDDLE/LAST/ONLY, §9.7.2 (unconfirmed)), PSNs (§9.7.1 (unconfirmed)), the AckReq bit on the last packet of a message and every [`ACK_REQ_EVERY`] packets (§9.2 AckReq), the window of unacknowledged packets, Read/atomic limit `max_rd_atomic` (§9.5 ORD), fences, local operations (LocalInv, RegMr), go-back-N retransmission (§9.7.6) | the send queue, the transmit cursor (WQE, packet), `una` (oldest unacknowledged PSN), `sent_hi` (next never-sent PSN), the ACK timer and retry counter, the RNR wait |
//! | [`completer`] | responses: coalesced ACKs (§9.7.5.1.2: an ACK acknowledges every earlier PSN), NAKs (§9.7.5.2: PSN sequence error, RNR, invalid request, remote access, remote operational), implied NAK (§9.7.6: a response for a later PSN while a Read/atomic is unanswered), ghost and duplicate ACKs dropped (§9.7.6), Read response placement with lkey checks and Atomic ACKs (§9.7.6), the local ACK timeout (§9.7.6, 4.096 µs × 2^timeout, retry_cnt) and RNR retries (§9.7.6, rnr_retry, 7 = forever), completions in order | (shares the requester's send queue) |
//! | [`responder`] | requests: the expected PSN and its three classes (§9.7.4.1: expected, duplicate, out of sequence with one NAK per sequence error), opcode sequence and length checks (§9.7.4.1, length §9.7.4.1.6; invalid request), R_Key/bounds/rights/PD checks through [`verbs::mem::MemTable::check`] (§9.7.4.1.5 remote access), RNR NAK without a posted receive (§9.7.5.2.8, `min_rnr_timer`), Send (+ Immediate, + Invalidate with IETH, + SE), RDMA Write (+ Immediate), RDMA Read, CmpSwap/FetchAdd on 8-aligned addresses, duplicate handling (re-ACK Sends/Writes, re-execute a Read from the requested PSN, replay an atomic from the responder resources, §9.7.4, subsection unconfirmed), ACKs with MSN and credit count (§9.7.7 (unconfirmed)) | the expected PSN, MSN, the message in progress (opcode, receive WQE and offset, Write target), the receive queue, the responder resources (`max_dest_rd_atomic` entries of Reads/atomics for duplicates) and the queue of responses to send |
//!
//! ## Work completion statuses (what they mean to an application)
//!
//! | status | produced when |
//! | --- | --- |
//! | `Success` | the peer acknowledged the request (Send/Write: ACK; Read: all response data placed; atomic: the ATOMIC ACK's original value written) |
//! | `RetryExcErr` | `retry_cnt` local ACK timeouts or PSN sequence NAKs in a row without progress: the peer or the path is gone |
//! | `RnrRetryExcErr` | the peer had no receive posted `rnr_retry` times in a row (never with `rnr_retry = 7`) |
//! | `RemAccessErr` | the peer NAKed with remote access error: bad R_Key, out of bounds, missing right, other PD |
//! | `RemOpErr` | the peer NAKed with remote operational error: it could not complete the request (e.g. its receive buffer's lkey was bad) |
//! | `RemInvReqErr` | the peer NAKed with invalid request: opcode sequence, length, misaligned atomic, unsupported |
//! | `BadRespErr` | a response at the expected PSN with the wrong opcode or length |
//! | `LocProtErr` | an SGE of ours names memory the lkey does not cover or allow (posting, or placing a Read response) |
//! | `LocLenErr` | (receive) the Send was longer than the posted receive buffer |
//! | `LocAccessErr` | (receive) a Send with Invalidate named a key that could not be invalidated |
//! | `WrFlushErr` | the QP went to the error state before this WR ran: every outstanding and later WR |
//!
//! Any error status moves the QP to ERR; later WRs complete with `WrFlushErr`.
//!
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` C3 ("in-order execution of WRITE and
//! SEND", "an incoming SEND consumes a posted receive WQE (RNR NAK if none)", "a successful
//! send-queue completion means the responder ACKed", "PSN is 24-bit and wraps", "transport
//! retry / RNR retry counts and local ACK timeout", "errors move the QP to ERROR and flush
//! WRs").

pub mod completer;
pub mod harness;
pub mod requester;
pub mod responder;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs::buffer::Buffer;
use verbs::mem::MemTable;
use verbs::{Access, Mtu, QpAttr, QpState, Sge, WcOpcode, WcStatus, WorkCompletion};

use crate::wire::headers::RnrTimer;
use crate::wire::{Packet, Psn};

pub use requester::ACK_REQ_EVERY;

/// What the core is created with (what `create_qp` knows).
#[derive(Clone)]
pub struct RcConfig {
    /// Our QP number (24 bits).
    pub qpn: u32,
    /// The protection domain every memory access is checked against.
    pub pd: u32,
    /// The device's memory table.
    pub mem: Arc<MemTable>,
    /// Every send WR completes, as if SIGNALED were set (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// Packets sent and not yet acknowledged at most (the requester's window).
    pub window: u32,
    /// Send WRs queued at most (`max_send_wr`).
    pub max_send_wr: usize,
    /// Receive WRs queued at most (`max_recv_wr`).
    pub max_recv_wr: usize,
    /// The P_Key this QP's packets carry and accept (0xffff).
    pub p_key: u16,
}

impl RcConfig {
    /// The config of QP `qpn` in PD `pd`: a window of 256 packets, 4096 send and receive WRs, P_Key 0xffff, `sq_sig_all` off.
    pub fn new(qpn: u32, pd: u32, mem: Arc<MemTable>) -> RcConfig {
        RcConfig {
            qpn,
            pd,
            mem,
            sq_sig_all: false,
            window: 256,
            max_send_wr: 4096,
            max_recv_wr: 4096,
            p_key: crate::wire::DEFAULT_PKEY,
        }
    }
}

/// The `modify_qp` attributes the transport uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcAttr {
    /// The peer's QP number (24 bits; `dest_qp_num`, the BTH DestQP we send).
    pub dest_qpn: u32,
    /// First PSN expected from the peer (RTR).
    pub rq_psn: Psn,
    /// First PSN we send (RTS).
    pub sq_psn: Psn,
    /// The path MTU: payload octets per packet of a multi-packet message.
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// Transport retries, 0..=7.
    pub retry_cnt: u8,
    /// RNR retries, 0..=7, 7 = infinite.
    pub rnr_retry: u8,
    /// The RNR NAK timer code we send (IBA vol. 1 release 1.3 table 45).
    pub min_rnr_timer: RnrTimer,
    /// Reads/atomics we have outstanding at most (ORD).
    pub max_rd_atomic: u8,
    /// Reads/atomics we keep responder resources for (IRD).
    pub max_dest_rd_atomic: u8,
}

impl Default for RcAttr {
    fn default() -> Self {
        RcAttr {
            dest_qpn: 0,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: RnrTimer(12),
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

impl RcAttr {
    /// The local ACK timeout (IBA vol. 1 §9.7.6: 4.096 µs × 2^timeout), `None` for 0.
    pub fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| Duration::from_nanos(4096u64 << self.timeout.min(31)))
    }
}

/// Errors of the local API (never peer input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RcError {
    /// The QP's state does not allow the call (the state, what was refused).
    #[error("the QP is in {0:?}: {1}")]
    State(QpState, &'static str),
    /// The send or receive queue (named) already holds its maximum of WRs.
    #[error("the {0} queue is full")]
    QueueFull(&'static str),
    /// A `modify_qp` attribute is out of range or not allowed in the transition (named).
    #[error("invalid attribute: {0}")]
    InvalidAttr(&'static str),
}

/// Counters, for tests and `softrdma` statistics (names after rxe's `hw_counters`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RcStats {
    /// Packets emitted by `poll_transmit` (requests and responses, first sends and retransmissions).
    pub packets_sent: u64,
    /// Request packets sent again (go-back after a NAK, timeout or implied NAK).
    pub retransmitted_packets: u64,
    /// Local ACK timeouts that fired.
    pub ack_timeouts: u64,
    /// NAK PSN sequence error received (the requester goes back to the NAK's PSN).
    pub seq_naks_received: u64,
    /// RNR NAKs received (the requester waits the RNR timer and retries).
    pub rnr_naks_received: u64,
    /// Implied NAKs: an ACK or response for a later PSN covering a Read or atomic whose response never came (the requester retries from it).
    pub implied_naks: u64,
    /// ACKs/responses for PSNs never sent (ignored).
    pub ghost_responses: u64,
    /// Responses for PSNs already acknowledged (ignored).
    pub duplicate_responses: u64,
    /// NAK PSN sequence error sent (a request ahead of ePSN).
    pub seq_naks_sent: u64,
    /// RNR NAKs sent (a message that needs a receive WQE with none posted).
    pub rnr_naks_sent: u64,
    /// Requests with a PSN in the past window.
    pub duplicate_requests: u64,
    /// Requests ahead of the expected PSN dropped.
    pub out_of_sequence_dropped: u64,
    /// Packets for another QP or P_Key, or not RC, dropped.
    pub misdirected_dropped: u64,
    /// Payload octets of sent packets (Send, Write, Read response) copied by the core into a
    /// packet buffer ([`RcQp::poll_transmit`]); the engine sends them from the registered
    /// memory instead ([`RcQp::poll_transmit_parts`]) and this stays 0 there.
    pub tx_payload_copied: u64,
    /// Payload octets of sent packets handed out by reference to the memory they are in
    /// ([`RcQp::poll_transmit_parts`]: the kernel copies them, once).
    pub tx_payload_by_ref: u64,
    /// Payload octets of received packets copied into memory (a receive's SGEs, a Write's
    /// target, a Read's sink): one copy each, from the datagram buffer.
    pub rx_payload_copied: u64,
}

impl RcStats {
    /// Adds `o` into `self` (device totals over QPs).
    pub fn add(&mut self, o: &RcStats) {
        self.packets_sent += o.packets_sent;
        self.retransmitted_packets += o.retransmitted_packets;
        self.ack_timeouts += o.ack_timeouts;
        self.seq_naks_received += o.seq_naks_received;
        self.rnr_naks_received += o.rnr_naks_received;
        self.implied_naks += o.implied_naks;
        self.ghost_responses += o.ghost_responses;
        self.duplicate_responses += o.duplicate_responses;
        self.seq_naks_sent += o.seq_naks_sent;
        self.rnr_naks_sent += o.rnr_naks_sent;
        self.duplicate_requests += o.duplicate_requests;
        self.out_of_sequence_dropped += o.out_of_sequence_dropped;
        self.misdirected_dropped += o.misdirected_dropped;
        self.tx_payload_copied += o.tx_payload_copied;
        self.tx_payload_by_ref += o.tx_payload_by_ref;
        self.rx_payload_copied += o.rx_payload_copied;
    }
}

/// Local memory resolved at post time (or inline data, in a buffer of its own): a range
/// of a registered region's buffer, which the `Arc` keeps alive.
#[derive(Clone)]
pub(crate) struct Piece {
    pub buf: Arc<Buffer>,
    pub off: usize,
    pub len: usize,
}

/// Where a send WQE's payload is: its gather list resolved at post time (inline data is
/// one piece of a buffer of its own). A one-SGE list is held inline (`One`): the common
/// post allocates no list (session 13 round 2: 1.00 allocation per 64 B Write before).
#[derive(Clone)]
pub(crate) enum Source {
    /// A gather list of exactly one piece, without a heap list.
    One(Piece),
    /// Any other gather list (empty or two or more pieces).
    Pieces(Vec<Piece>),
}

impl Source {
    /// No payload.
    pub(crate) fn empty() -> Source {
        Source::Pieces(Vec::new())
    }

    /// Inline data, owned.
    pub(crate) fn owned(v: Vec<u8>) -> Source {
        let len = v.len();
        Source::One(Piece {
            buf: Arc::new(Buffer::from_vec(v)),
            off: 0,
            len,
        })
    }

    /// The resolved pieces, in order.
    fn pieces(&self) -> &[Piece] {
        match self {
            Source::One(p) => std::slice::from_ref(p),
            Source::Pieces(ps) => ps,
        }
    }

    /// Copies `out.len()` octets from message offset `at`.
    pub(crate) fn copy_out(&self, at: usize, out: &mut [u8]) {
        let mut done = 0;
        self.each_piece(at, out.len(), |p| {
            // In bounds: each piece was checked against its region at post time.
            let _ = p.buf.read(p.off, &mut out[done..done + p.len]);
            done += p.len;
        });
    }

    /// The pieces of the `n` octets at message offset `at`, in order.
    pub(crate) fn each_piece(&self, mut at: usize, n: usize, mut f: impl FnMut(Piece)) {
        let mut left = n;
        for p in self.pieces() {
            if left == 0 {
                break;
            }
            if at >= p.len {
                at -= p.len;
                continue;
            }
            let k = (p.len - at).min(left);
            f(Piece {
                buf: p.buf.clone(),
                off: p.off + at,
                len: k,
            });
            left -= k;
            at = 0;
        }
    }
}

/// Why scattering into SGEs failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScatterError {
    /// The data does not fit the SGEs.
    Length,
    /// An SGE's lkey does not allow the write.
    Protection,
}

/// Writes `data` at message offset `at` of the scatter list `sges`, each piece checked with
/// `MemTable::check(lkey, pd, qpn, addr, len, LOCAL_WRITE)`, through `cache` (the same
/// checks against the last registration looked up while the table is unchanged: a
/// receive buffer's lkey is not looked up in the table per Send, issue 13).
pub(crate) fn scatter(
    mem: &MemTable,
    cache: &mut verbs::mem::MrCache,
    pd: u32,
    qpn: u32,
    sges: &[Sge],
    mut at: u64,
    mut data: &[u8],
) -> Result<(), ScatterError> {
    for s in sges {
        if data.is_empty() {
            return Ok(());
        }
        let len = u64::from(s.length);
        if at >= len {
            at -= len;
            continue;
        }
        let n = ((len - at) as usize).min(data.len());
        let r = mem
            .check_cached(
                cache,
                s.lkey,
                pd,
                qpn,
                s.addr.wrapping_add(at),
                n as u64,
                Access::LOCAL_WRITE,
            )
            .map_err(|_| ScatterError::Protection)?;
        r.buffer
            .write(r.offset, &data[..n])
            .map_err(|_| ScatterError::Protection)?;
        data = &data[n..];
        at = 0;
    }
    if data.is_empty() {
        Ok(())
    } else {
        Err(ScatterError::Length)
    }
}

/// The RC transport of one QP. See the module documentation.
pub struct RcQp {
    pub(crate) cfg: RcConfig,
    pub(crate) attr: RcAttr,
    pub(crate) state: QpState,
    pub(crate) req: requester::Requester,
    pub(crate) resp: responder::Responder,
    pub(crate) completions: VecDeque<WorkCompletion>,
    pub(crate) stats: RcStats,
    /// The move to SQD asked for `IBV_EVENT_SQ_DRAINED` and it has not been reported yet.
    pub(crate) sqd_notify: bool,
}

impl RcQp {
    /// A QP in RESET.
    pub fn new(cfg: RcConfig) -> RcQp {
        let attr = RcAttr::default();
        RcQp {
            req: requester::Requester::new(&attr),
            resp: responder::Responder::new(&attr),
            cfg,
            attr,
            state: QpState::Reset,
            completions: VecDeque::new(),
            stats: RcStats::default(),
            sqd_notify: false,
        }
    }

    /// Our QP number.
    pub fn qpn(&self) -> u32 {
        self.cfg.qpn
    }

    /// The QP state (RESET, INIT, RTR, RTS, SQD, SQE or ERR).
    pub fn state(&self) -> QpState {
        self.state
    }

    /// In SQD with every message begun before the drain acknowledged or completed: the send
    /// queue is drained (WQEs posted but never started wait for the move back to RTS).
    pub fn sq_drained(&self) -> bool {
        self.state == QpState::Sqd && self.req.sq.iter().all(|w| !w.started || w.status.is_some())
    }

    /// Once per move to SQD with `en_sqd_async_notify`: true when the send queue has just
    /// become drained, so that the caller raises `IBV_EVENT_SQ_DRAINED`.
    pub fn take_sq_drained_event(&mut self) -> bool {
        if self.sqd_notify && self.sq_drained() {
            self.sqd_notify = false;
            return true;
        }
        false
    }

    /// The attributes set by `modify`.
    pub fn attr(&self) -> &RcAttr {
        &self.attr
    }

    /// The counters.
    pub fn stats(&self) -> &RcStats {
        &self.stats
    }

    /// The PSN the responder expects next (ePSN).
    pub fn expected_psn(&self) -> Psn {
        self.resp.epsn
    }

    /// The oldest PSN the requester has sent and not seen acknowledged (equal to the next PSN
    /// to send when nothing is outstanding).
    pub fn oldest_unacked_psn(&self) -> Psn {
        self.req.una
    }

    /// Octets `poll_transmit` may need: the largest headers, a path-MTU payload, pad and ICRC.
    pub fn max_packet_len(&self) -> usize {
        12 + 28 + 4 + self.attr.path_mtu.bytes() as usize + 3 + crate::wire::ICRC_LEN
    }

    /// `ibv_modify_qp` as far as the transport is concerned: the attributes given are taken
    /// (RTR: dest QPN, rq_psn, path MTU, max_dest_rd_atomic, min_rnr_timer; RTS: sq_psn,
    /// timeout, retry_cnt, rnr_retry, max_rd_atomic), then the state. The legality of the
    /// transition is checked by the verbs layer (`verbs::qp_attr`); here ERR flushes and
    /// RESET clears.
    pub fn modify(&mut self, a: &QpAttr) -> Result<(), RcError> {
        // SQD -> SQD changes the path and transport attributes only once the messages begun
        // before the drain are done (IBA vol. 1 §10.3, "SQ Drain"; §10.3.1 unconfirmed): not in
        // mid-message.
        let changes = a.ah_attr.is_some()
            || a.timeout.is_some()
            || a.retry_cnt.is_some()
            || a.rnr_retry.is_some()
            || a.max_rd_atomic.is_some()
            || a.max_dest_rd_atomic.is_some()
            || a.min_rnr_timer.is_some()
            || a.path_mtu.is_some();
        if self.state == QpState::Sqd && a.qp_state == Some(QpState::Sqd) && changes && !self.sq_drained() {
            return Err(RcError::State(
                QpState::Sqd,
                "SQD -> SQD before the send queue is drained",
            ));
        }
        let mut n = self.attr;
        if let Some(v) = a.dest_qp_num {
            n.dest_qpn = v & Psn::MASK;
        }
        if let Some(v) = a.rq_psn {
            n.rq_psn = Psn::new(v);
        }
        if let Some(v) = a.sq_psn {
            n.sq_psn = Psn::new(v);
        }
        if let Some(v) = a.path_mtu {
            n.path_mtu = v;
        }
        if let Some(v) = a.timeout {
            if v > 31 {
                return Err(RcError::InvalidAttr("timeout is 0..=31"));
            }
            n.timeout = v;
        }
        if let Some(v) = a.retry_cnt {
            if v > 7 {
                return Err(RcError::InvalidAttr("retry_cnt is 0..=7"));
            }
            n.retry_cnt = v;
        }
        if let Some(v) = a.rnr_retry {
            if v > 7 {
                return Err(RcError::InvalidAttr("rnr_retry is 0..=7"));
            }
            n.rnr_retry = v;
        }
        if let Some(v) = a.min_rnr_timer {
            if v > 31 {
                return Err(RcError::InvalidAttr("min_rnr_timer is 0..=31"));
            }
            n.min_rnr_timer = RnrTimer(v);
        }
        if let Some(v) = a.max_rd_atomic {
            n.max_rd_atomic = v;
        }
        if let Some(v) = a.max_dest_rd_atomic {
            n.max_dest_rd_atomic = v;
        }
        self.attr = n;
        if a.rq_psn.is_some() {
            self.resp.reset_psn(n.rq_psn);
        }
        if a.sq_psn.is_some() {
            self.req.reset_psn(n.sq_psn);
        }
        self.req.retries_left = n.retry_cnt;
        self.req.rnr_retries_left = n.rnr_retry;
        match a.qp_state {
            Some(QpState::Err) => self.enter_error(),
            Some(QpState::Reset) => {
                let cfg = self.cfg.clone();
                *self = RcQp::new(cfg);
            }
            Some(QpState::Sqd) => {
                // RTS -> SQD starts the drain (IBA vol. 1 §10.3, "SQ Drain"): no new WQE
                // starts; the messages already begun finish (retransmissions included).
                // SQD -> SQD changes attributes and keeps a pending notification.
                if self.state != QpState::Sqd {
                    self.sqd_notify = a.en_sqd_async_notify.unwrap_or(false);
                }
                self.state = QpState::Sqd;
            }
            Some(s) => {
                self.state = s;
                self.sqd_notify = false;
            }
            None => {}
        }
        Ok(())
    }

    /// A packet from the peer, parsed by [`crate::wire::Packet::parse`] and with its ICRC
    /// checked by the engine. Packets for another QP, with a P_Key that does not match ours
    /// ([`crate::wire::pkey_match`]) or not of the RC transport are dropped and counted
    /// (IBA vol. 1 §9.6.1, header validation); requests go to the responder,
    /// responses to the completer.
    pub fn handle_packet(&mut self, now: Instant, pkt: &Packet<'_>) {
        let Some(info) = pkt.info() else {
            self.stats.misdirected_dropped += 1;
            return;
        };
        if pkt.bth.dest_qp != self.cfg.qpn
            || !crate::wire::pkey_match(pkt.bth.p_key, self.cfg.p_key)
            || info.transport != crate::wire::Transport::Rc
        {
            self.stats.misdirected_dropped += 1;
            return;
        }
        if info.request {
            self.on_request(pkt, info);
        } else {
            self.on_response(now, pkt);
        }
    }

    /// The next packet to send into `buf` (at least [`RcQp::max_packet_len`] octets): its
    /// length, ICRC field included and left 0 for the engine to seal
    /// ([`crate::wire::icrc::seal`]). Responses (ACK, NAK, Read responses, ATOMIC ACK) go
    /// before new requests.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if buf.len() < self.max_packet_len() {
            return None;
        }
        let mut pieces = Vec::new();
        let (hdr, payload) = self.poll_transmit_parts(now, buf, &mut pieces)?;
        let mut at = hdr;
        for p in &pieces {
            // In bounds: checked when the WR was posted or the Read arrived.
            let _ = p.buf.read(p.off, &mut buf[at..at + p.len]);
            at += p.len;
        }
        self.stats.tx_payload_copied += payload as u64;
        self.stats.tx_payload_by_ref -= payload as u64;
        let pad = usize::from(crate::wire::segment::pad_count(payload));
        buf[at..at + pad + crate::wire::ICRC_LEN].fill(0);
        Some(at + pad + crate::wire::ICRC_LEN)
    }

    /// [`RcQp::poll_transmit`] without copying the payload: the packet's headers go into
    /// `hdr` (at least [`RcQp::MAX_HEADER_LEN`] octets) and the pieces of memory its payload
    /// is in are appended to `pieces`, in order. Returns (header length, payload length);
    /// the packet on the wire is the headers, the payload, `pad_count(payload)` zero octets
    /// and the ICRC. A retransmission reads the memory again (as rxe does): the application
    /// must leave a posted buffer alone until its completion.
    pub(crate) fn poll_transmit_parts(
        &mut self,
        now: Instant,
        hdr: &mut [u8],
        pieces: &mut Vec<Piece>,
    ) -> Option<(usize, usize)> {
        if hdr.len() < Self::MAX_HEADER_LEN || matches!(self.state, QpState::Reset | QpState::Init) {
            return None;
        }
        let r = match self.next_response(hdr, pieces) {
            Some(r) => {
                self.stats.packets_sent += 1;
                Some(r)
            }
            None => self.next_request(now, hdr, pieces),
        };
        if let Some((_, payload)) = r {
            self.stats.tx_payload_by_ref += payload as u64;
        }
        r
    }

    /// Whether [`RcQp::poll_transmit_parts`] may have a packet to give: a queued response,
    /// or (in RTS/SQD, no RNR wait) a send queue entry at or after the one it would send
    /// next that is not finished or wholly sent (the batch loop asks before each packet:
    /// no call that walks the queues to find nothing after the last one, issue 13). `false` means it would give none, so a busy poller with nothing received
    /// skips building a batch (issue 13); `true` promises nothing.
    pub(crate) fn may_transmit(&self) -> bool {
        if matches!(self.state, QpState::Reset | QpState::Init) {
            return false;
        }
        !self.resp.out.is_empty()
            || (matches!(self.state, QpState::Rts | QpState::Sqd)
                && self.req.rnr_until.is_none()
                && self.req.has_unsent())
    }

    /// The longest header [`RcQp::poll_transmit_parts`] writes: BTH, AtomicETH (28), or
    /// RETH (16) and ImmDt, or AETH and AtomicAckETH.
    pub const MAX_HEADER_LEN: usize = 12 + 28 + 4;

    /// Move to ERR from outside (`ibv_modify_qp(ERR)`, a CM disconnect): flushes.
    pub fn set_error(&mut self) {
        self.enter_error();
    }

    /// The next completion: send completions in posting order, receive completions in the
    /// order of the messages, interleaved as they happened.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    /// When [`RcQp::handle_timeout`] must be called next (the local ACK timer or the end of
    /// an RNR wait).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == QpState::Err {
            return None;
        }
        match (self.req.ack_deadline, self.req.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The QP enters ERR: every queued WR and posted receive completes with `WrFlushErr`
    /// (IBA vol. 1 §10.3 "Error state"; C3 "errors move the QP to ERROR and flush WRs").
    /// Responses already queued (the NAK that ended the connection) still go out.
    pub(crate) fn enter_error(&mut self) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        let qpn = self.cfg.qpn;
        for w in self.req.sq.drain(..) {
            let status = w.status.unwrap_or(WcStatus::WrFlushErr);
            if w.status.is_none() || w.signaled || status != WcStatus::Success {
                let mut wc = WorkCompletion::new(w.wr_id, status, w.wc_opcode(), qpn);
                if status == WcStatus::Success {
                    wc.byte_len = w.byte_len();
                }
                self.completions.push_back(wc);
            }
        }
        self.req.on_error();
        if let Some(r) = self.resp.cur_recv.take() {
            self.completions
                .push_back(WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn));
        }
        for r in self.resp.recvs.drain(..) {
            self.completions
                .push_back(WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn));
        }
        self.resp.out.retain(|o| matches!(o, responder::RespOut::Ack { .. }));
    }
}
