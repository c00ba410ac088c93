//! The sans-I/O SMC-R connection machine: one connection's data path once CLC and the link
//! are up (RFC 7609 §4; requirements A2.8–A2.11, A2.15, A4.4–A4.6).
//!
//! A [`Conn`] is a plain struct: the engine feeds it application calls ([`Conn::write`],
//! [`Conn::consume`], [`Conn::shutdown_write`], [`Conn::close`], [`Conn::abort`]),
//! transport events ([`Conn::on_cdc`], [`Conn::writes_completed`], [`Conn::on_tcp_reset`],
//! [`Conn::on_timeout`]) and drains [`Action`]s ([`Conn::poll_action`]): RDMA Writes of the
//! send stream into the peer's RMB element, CDC messages to send, a TCP reset, the release
//! of the local element. It owns no memory and does no I/O; byte copies are the engine's:
//!
//! - **Send stream.** Octets the application writes get consecutive *stream offsets*
//!   (0, 1, 2, …). `write(n)` accepts up to the free send-buffer space and the engine keeps
//!   those octets (e.g. in a registered ring indexed by `offset mod size`); an
//!   [`Action::RdmaWrite`] names the stream offset to read from, the offset in the peer's
//!   element and the length. Send-buffer space comes back with [`Conn::writes_completed`]
//!   (the send-queue completions of those writes).
//! - **Receive element.** The peer writes into the local element; [`Conn::read_spans`] says
//!   where the unread octets are and [`Conn::consume`] moves the consumer cursor.
//!
//! Decisions (written down once, tested below):
//! - Window updates follow E-23: a standalone consumer-cursor CDC is sent iff the window the
//!   peer sees is below C/2 and the update grows it by at least C/10, or the peer's last
//!   CDC had B (writer blocked) or R (update requested), or urgent data was just consumed;
//!   every other CDC carries the consumer cursor anyway (SMC-CDC-6..9).
//! - A CDC is validated completely before any of it is applied (A2.15): an unknown token is
//!   discarded and counted; an old sequence number (16-bit serial compare) is discarded;
//!   a cursor outside the element, a producer or consumer cursor going backwards, more than
//!   C octets outstanding, a consumer cursor beyond what this side produced, or new data
//!   after the peer said it was done writing is a protocol error → abort (Figure 23). Linux
//!   ignores backward cursor moves instead; we abort, because a consistent peer never sends
//!   one (SMC-CDC-12).
//! - Urgent data (A2.9): `write_urgent(n)` makes the last of those octets the urgent mark
//!   (TCP-like, as Linux). CDCs carry P from the moment urgent data is queued; the CDC that
//!   follows the write of the urgent octet carries P and U with the producer cursor one past
//!   it; no further data is written until the peer's consumer cursor reaches it; the next
//!   CDC then clears P and U (SMC-URG-1..5).
//! - Close (Figure 22): C or D is sent only when the send stream is drained and every write
//!   completed (SMC-CLS-3); after C nothing more is sent (SMC-CLS-8); connection-state flags
//!   are sticky in later CDCs (as Linux sends them). `close()` with unread data, a peer's C
//!   while local data is unsent, a TCP reset and a wait-state timeout abort (Figure 23).
//! - **Failover** (RFC 7609 §2.3, §4.6; SMC-FO-2..5, A4.7): the engine reports each CDC
//!   whose send completed ([`Conn::cdc_completed`]: SS is the last of them) and, once the
//!   connection's link failed and every work request of that link has completed or
//!   flushed, calls [`Conn::failover`] with the connection on the surviving link. The
//!   machine then sends the validation CDC (F, sequence SS, not counted), replays every
//!   write the peer may not have (from the later of the last completed write and the
//!   peer's consumer cursor up to our producer cursor, at the same element offsets, so
//!   nothing is lost and no octet lands twice where the peer could read it) and one CDC
//!   with a new sequence number above all earlier ones carrying the current cursors and
//!   flags (the "merged" replay of SMC-FO-5). A peer's F CDC whose sequence is after the
//!   last CDC we processed (SR < SS) means data was lost: the connection is reset at once
//!   (SMC-FO-4); otherwise it is ignored.

use crate::wire::cdc::{Cdc, ConnStateFlags, ProducerFlags, seq_before};
use crate::wire::cursor::{Cursor, Rmbe, Span};
use std::collections::VecDeque;
use thiserror::Error;

/// What a connection needs to know from the CLC exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnParams {
    /// The alert token the peer puts in CDCs for this connection (ours).
    pub local_token: u32,
    /// The alert token we put in CDCs to the peer (the peer's).
    pub peer_token: u32,
    /// Geometry of our receive element (the peer writes into it).
    pub local_rmbe: Rmbe,
    /// Geometry of the peer's element that we write into.
    pub peer_rmbe: Rmbe,
    /// Send-buffer size: octets accepted from the application and not yet completed.
    pub send_buf: u32,
}

/// States of Figures 22 and 23 (A4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseState {
    /// Data flows both ways.
    Active,
    /// Active close: we sent D or C, nothing from the peer yet.
    PeerCloseWait1,
    /// Active close: we sent D or C, the peer sent D.
    PeerCloseWait2,
    /// Active close: we only shut down writing; the peer closed (C); waiting for our close.
    AppFinCloseWait,
    /// Passive close: the peer sent D or C; we have sent nothing.
    AppCloseWait1,
    /// Passive close: the peer sent D or C; we sent D.
    AppCloseWait2,
    /// Passive close: we sent C, waiting for the peer's C.
    PeerFinCloseWait,
    /// We aborted (sent A), waiting for the peer's A or the guard timer.
    PeerAbortWait,
    /// Done; the local element may be reused.
    Closed,
}

/// Why a connection was aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum AbortReason {
    /// The local application aborted (e.g. SO_LINGER 0).
    #[error("aborted by the local application")]
    Local,
    /// `close()` with unread data in the local element (SMC-CLS-2).
    #[error("closed with unread data")]
    UnreadDataOnClose,
    /// The peer closed while local data was still unsent (SMC-CLS-6).
    #[error("peer closed while data was unsent")]
    PeerClosedWithUnsentData,
    /// The peer sent A (SMC-ABT-3).
    #[error("connection reset by peer")]
    PeerAbort,
    /// A TCP RST arrived on the TCP path (SMC-ABT-4).
    #[error("TCP connection reset")]
    TcpReset,
    /// A close wait state or a stalled close timed out (SMC-CLS-9).
    #[error("close timed out")]
    Timeout,
    /// The peer violated the protocol (A2.15).
    #[error("protocol error: {0}")]
    Protocol(ProtocolError),
    /// A failover validation CDC showed that data was lost with the failed link (SMC-FO-4).
    #[error("data lost in link failover")]
    FailoverLoss,
}

/// A peer's CDC that cannot be correct (SMC-CDC-12, A2.15).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum ProtocolError {
    /// The producer cursor lies outside our element's data area.
    #[error("producer cursor outside the element")]
    ProducerOutOfRange,
    /// The consumer cursor lies outside the peer's element's data area.
    #[error("consumer cursor outside the element")]
    ConsumerOutOfRange,
    /// The producer cursor moved backwards.
    #[error("producer cursor went backwards")]
    ProducerRegressed,
    /// The producer cursor claims more than C unread octets.
    #[error("producer cursor beyond the window")]
    ProducerOverrun,
    /// The consumer cursor moved backwards.
    #[error("consumer cursor went backwards")]
    ConsumerRegressed,
    /// The consumer cursor is beyond what we wrote.
    #[error("consumer cursor beyond our producer cursor")]
    ConsumerAhead,
    /// New data after the peer said it was done writing.
    #[error("data after the peer's done-writing")]
    DataAfterDone,
}

/// What a CDC did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CdcOutcome {
    /// Validated and applied.
    Applied,
    /// Not for this connection (wrong alert token): dropped and counted (SMC-CDC-11).
    WrongToken,
    /// Older than the last one processed: dropped (SMC-CDC-2).
    Stale,
    /// Ignored: F message, or the connection is closed or aborting.
    Ignored,
    /// Invalid: the connection was aborted.
    Aborted(ProtocolError),
}

/// Why an application call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ConnError {
    /// The connection was aborted.
    #[error("connection aborted: {0}")]
    Aborted(AbortReason),
    /// Writing after `shutdown_write()` or `close()`.
    #[error("writing was shut down")]
    WriteShutdown,
    /// Writing after the peer closed the connection.
    #[error("the peer closed the connection")]
    PeerClosed,
    /// Consuming more than is readable.
    #[error("consume({asked}) with {readable} readable")]
    ConsumeTooMuch {
        /// Octets asked.
        asked: u64,
        /// Octets readable.
        readable: u64,
    },
    /// Urgent data is already outstanding.
    #[error("urgent data already outstanding")]
    UrgentOutstanding,
}

/// Why there is no urgent octet to read out of band (`recv(MSG_OOB)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum UrgentError {
    /// No urgent data, or it was read already (Linux: EINVAL).
    #[error("no urgent data")]
    NoUrgent,
    /// Announced (P) but not yet arrived (Linux: EAGAIN).
    #[error("urgent data announced, not yet arrived")]
    NotYet,
    /// SO_OOBINLINE is set: urgent data is in the stream (Linux: EINVAL).
    #[error("urgent data is in line")]
    Inline,
}

/// An output of the machine, in the order the engine must carry them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// RDMA Write `len` octets of the send stream from stream offset `src` to offset
    /// `remote_off` of the peer's element (one remote address per write, E-22).
    RdmaWrite {
        /// Stream offset of the first octet.
        src: u64,
        /// Offset in the peer's element.
        remote_off: u32,
        /// Length in octets.
        len: u32,
    },
    /// Send this CDC (after the writes before it, on the same QP).
    SendCdc(Cdc),
    /// Reset the TCP connection.
    TcpReset,
    /// The local element is no longer referenced and may be reused (SMC-RMB-9).
    ReleaseElement,
}

/// One SMC-R connection's data path and close machine.
#[derive(Debug)]
pub struct Conn {
    p: ConnParams,
    actions: VecDeque<Action>,
    // --- send side ---
    next_seq: u16,
    /// Stream offset of the next octet to write (everything before went to RDMA Writes).
    written: u64,
    queued: u64,
    in_flight: u64,
    prod: Cursor,
    peer_cons: Cursor,
    last_sent_blocked: bool,
    /// Stream offset one past the urgent octet, while urgent data is not yet acknowledged.
    urg_end: Option<u64>,
    /// Cursor in the peer's element one past the urgent octet, once written.
    urg_written: Option<Cursor>,
    urg_announced: bool,
    // --- receive side ---
    peer_prod: Cursor,
    cons: Cursor,
    cons_sent: Cursor,
    last_seq_in: Option<u16>,
    peer_prod_flags: ProducerFlags,
    peer_conn: ConnStateFlags,
    urg_mark: Option<Cursor>,
    urg_pending_in: bool,
    /// The urgent octet at `urg_mark` was taken out of band ([`Conn::take_urgent`]).
    urg_taken: bool,
    /// SO_OOBINLINE: the urgent octet stays in the stream and is not offered out of band.
    oob_inline: bool,
    // --- close ---
    state: CloseState,
    active_close: Option<bool>,
    app_shut_wr: bool,
    app_closed: bool,
    sent_flags: ConnStateFlags,
    abort: Option<AbortReason>,
    peer_abort_seen: bool,
    released: bool,
    wrong_tokens: u64,
    /// SS: the sequence number of the last CDC whose send completed (0 = none yet).
    ss: u16,
    /// Failovers so far ([`Conn::failovers`]).
    failovers: u32,
    /// Most octets one RDMA Write (and its CDC) carries ([`Conn::set_max_write`]).
    max_write: u32,
}

impl Conn {
    /// A connection in state Active with all cursors at the start of their elements.
    pub fn new(p: ConnParams) -> Self {
        Self {
            actions: VecDeque::new(),
            next_seq: 1,
            max_write: u32::MAX,
            written: 0,
            queued: 0,
            in_flight: 0,
            prod: p.peer_rmbe.start(),
            peer_cons: p.peer_rmbe.start(),
            last_sent_blocked: false,
            urg_end: None,
            urg_written: None,
            urg_announced: false,
            peer_prod: p.local_rmbe.start(),
            cons: p.local_rmbe.start(),
            cons_sent: p.local_rmbe.start(),
            last_seq_in: None,
            peer_prod_flags: ProducerFlags::empty(),
            peer_conn: ConnStateFlags::empty(),
            urg_mark: None,
            urg_pending_in: false,
            urg_taken: false,
            oob_inline: false,
            state: CloseState::Active,
            active_close: None,
            app_shut_wr: false,
            app_closed: false,
            sent_flags: ConnStateFlags::empty(),
            abort: None,
            peer_abort_seen: false,
            released: false,
            wrong_tokens: 0,
            ss: 0,
            failovers: 0,
            p,
        }
    }

    /// The parameters the connection was made with.
    pub fn params(&self) -> &ConnParams {
        &self.p
    }

    /// The next action to carry out, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The close state.
    pub fn state(&self) -> CloseState {
        self.state
    }

    /// Why the connection was aborted, if it was.
    pub fn abort_reason(&self) -> Option<AbortReason> {
        self.abort
    }

    /// CDCs dropped because their alert token was not this connection's.
    pub fn wrong_tokens(&self) -> u64 {
        self.wrong_tokens
    }

    /// Our producer cursor in the peer's element.
    pub fn producer(&self) -> Cursor {
        self.prod
    }

    /// Our consumer cursor in our element.
    pub fn consumer(&self) -> Cursor {
        self.cons
    }

    /// Octets the application may hand to [`Conn::write`] now.
    pub fn write_space(&self) -> u64 {
        if self.write_error().is_some() {
            return 0;
        }
        u64::from(self.p.send_buf).saturating_sub(self.queued + self.in_flight)
    }

    /// Octets accepted but not yet written plus octets written but not completed.
    pub fn unsent(&self) -> u64 {
        self.queued + self.in_flight
    }

    /// Unread octets in the local element (0 once aborted).
    pub fn readable(&self) -> u64 {
        if self.abort.is_some() {
            return 0;
        }
        self.p.local_rmbe.distance(self.peer_prod, self.cons)
    }

    /// Where up to `max` unread octets are in the local element.
    pub fn read_spans(&self, max: u64) -> (Span, Option<Span>) {
        let n = self.readable().min(max).min(u64::from(u32::MAX)) as u32;
        self.p.local_rmbe.spans(self.cons, n)
    }

    /// The peer said it is closed (C) or aborted (A): it will write nothing more, and its
    /// TCP path may close (SMC-CLS-1).
    pub fn peer_closed(&self) -> bool {
        self.peer_conn
            .intersects(ConnStateFlags::CONN_CLOSED | ConnStateFlags::ABORT)
    }

    /// True when reads return end of stream: nothing unread and the peer is done writing.
    pub fn read_eof(&self) -> bool {
        self.abort.is_none()
            && self.readable() == 0
            && self
                .peer_conn
                .intersects(ConnStateFlags::DONE_WRITING | ConnStateFlags::CONN_CLOSED)
    }

    /// True when the peer announced urgent data (P) that has not been read past yet.
    pub fn urgent_pending(&self) -> bool {
        self.urg_pending_in || self.urg_mark.is_some()
    }

    /// Octets until one past the urgent octet (`Some(1)` = the next octet is the urgent one).
    pub fn bytes_to_urgent_mark(&self) -> Option<u64> {
        self.urg_mark.map(|m| self.p.local_rmbe.distance(m, self.cons))
    }

    /// SO_OOBINLINE: with `true` the urgent octet stays in the data stream (reads still stop
    /// at the mark, as TCP's); with `false` (the default, as Linux) it is skipped by reads and
    /// offered out of band by [`Conn::urgent_octet`] / [`Conn::take_urgent`].
    pub fn set_oob_inline(&mut self, inline: bool) {
        self.oob_inline = inline;
    }

    /// Whether urgent data stays in line (SO_OOBINLINE).
    pub fn oob_inline(&self) -> bool {
        self.oob_inline
    }

    /// Octets a read may return now. As Linux's TCP (`tcp_recvmsg`) a read stops before the
    /// urgent octet; at the mark it goes on through it (in line) or, out of line, after
    /// [`Conn::skip_urgent`] has dropped it from the stream.
    pub fn readable_in_band(&self) -> u64 {
        let r = self.readable();
        match self.bytes_to_urgent_mark() {
            Some(d) if d > 1 => r.min(d - 1),
            Some(1) if !self.oob_inline => 0,
            _ => r,
        }
    }

    /// SIOCATMARK: the next octet to read is the urgent octet.
    pub fn at_urgent_mark(&self) -> bool {
        self.abort.is_none() && self.bytes_to_urgent_mark() == Some(1)
    }

    /// Out of line at the mark: consume the urgent octet so that reads go on after it (it was
    /// offered out of band; TCP drops it from the stream whether it was taken or not). Emits
    /// the consumer update SMC-URG-3 asks for. Returns whether an octet was skipped.
    pub fn skip_urgent(&mut self) -> bool {
        if self.oob_inline || !self.at_urgent_mark() {
            return false;
        }
        self.consume(1).is_ok()
    }

    /// Where the urgent octet is in the local element, for `recv(MSG_OOB)`: the offset of the
    /// octet if it arrived and was not taken yet; [`UrgentError`] otherwise (Linux's answers:
    /// EINVAL when there is none, it was taken, or SO_OOBINLINE is set; EAGAIN when announced
    /// (P) but not yet written).
    pub fn urgent_octet(&self) -> Result<u32, UrgentError> {
        if self.oob_inline {
            return Err(UrgentError::Inline);
        }
        if self.abort.is_some() {
            return Err(UrgentError::NoUrgent);
        }
        match self.bytes_to_urgent_mark() {
            Some(d) if d >= 1 && !self.urg_taken => Ok(self.p.local_rmbe.advance(self.cons, d - 1).count),
            Some(_) => Err(UrgentError::NoUrgent),
            None if self.urg_pending_in => Err(UrgentError::NotYet),
            None => Err(UrgentError::NoUrgent),
        }
    }

    /// The application read the urgent octet out of band (`recv(MSG_OOB)` without MSG_PEEK):
    /// a second read of it is EINVAL, as TCP's.
    pub fn take_urgent(&mut self) {
        if self.urgent_octet().is_ok() {
            self.urg_taken = true;
        }
    }

    /// True in states that need a guard timer (wait states and PeerAbortWait, SMC-CLS-9).
    pub fn needs_timer(&self) -> bool {
        !matches!(
            self.state,
            CloseState::Active | CloseState::AppCloseWait1 | CloseState::Closed
        ) || (self.app_shut_wr && self.unsent() > 0)
    }

    fn write_error(&self) -> Option<ConnError> {
        if let Some(r) = self.abort {
            return Some(ConnError::Aborted(r));
        }
        if self.app_shut_wr {
            return Some(ConnError::WriteShutdown);
        }
        if self.peer_conn.contains(ConnStateFlags::CONN_CLOSED) {
            return Some(ConnError::PeerClosed);
        }
        None
    }

    /// Most octets one RDMA Write (and the CDC that announces it) carries (at least 1;
    /// default: the whole free window). Smaller writes let the reader start on the first
    /// part while the rest is still on the wire.
    pub fn set_max_write(&mut self, n: u32) {
        self.max_write = n.max(1);
    }

    /// The application writes `n` octets: returns how many were accepted (the engine keeps
    /// them at the next stream offsets); may emit writes and a CDC.
    pub fn write(&mut self, n: u64) -> Result<u64, ConnError> {
        if let Some(e) = self.write_error() {
            return Err(e);
        }
        let n = n.min(self.write_space());
        self.queued += n;
        self.flush();
        Ok(n)
    }

    /// Like [`Conn::write`], the last accepted octet being urgent (MSG_OOB). Fails while
    /// earlier urgent data is not yet acknowledged.
    pub fn write_urgent(&mut self, n: u64) -> Result<u64, ConnError> {
        if let Some(e) = self.write_error() {
            return Err(e);
        }
        if self.urg_end.is_some() {
            return Err(ConnError::UrgentOutstanding);
        }
        let n = n.min(self.write_space());
        if n == 0 {
            return Ok(0);
        }
        self.queued += n;
        self.urg_end = Some(self.written + self.queued);
        self.urg_announced = false;
        self.flush();
        Ok(n)
    }

    /// The engine saw `n` more octets' RDMA Writes complete (send-buffer space returns).
    pub fn writes_completed(&mut self, n: u64) {
        self.in_flight = self.in_flight.saturating_sub(n);
        self.flush();
    }

    /// The engine saw the send of the CDC with sequence number `seq` complete (SS,
    /// SMC-FO-2).
    pub fn cdc_completed(&mut self, seq: u16) {
        if self.ss == 0 || seq_before(self.ss, seq) {
            self.ss = seq;
        }
    }

    /// Failovers this connection went through.
    pub fn failovers(&self) -> u32 {
        self.failovers
    }

    /// The connection's link failed and the engine moved it to a surviving link, after
    /// every work request of the failed link completed or flushed (completions of that
    /// link arriving later must not be reported). Emits the validation CDC (F, SS), the
    /// replay of what the peer may lack, and a CDC with the current cursors (SMC-FO-3,
    /// SMC-FO-5).
    pub fn failover(&mut self) {
        if self.state == CloseState::Closed {
            return;
        }
        self.failovers += 1;
        self.actions.push_back(Action::SendCdc(Cdc {
            seq: self.ss,
            token: self.p.peer_token,
            prod: self.prod,
            cons: self.cons,
            prod_flags: ProducerFlags::FAILOVER_VALIDATION,
            conn_flags: ConnStateFlags::empty(),
        }));
        let pe = self.p.peer_rmbe;
        // Octets the peer consumed are placed; the rest of what is not completed may not be.
        let unconsumed = pe.distance(self.prod, self.peer_cons);
        let replay = self.in_flight.min(unconsumed);
        self.in_flight = replay;
        if replay > 0 && self.abort.is_none() {
            let start = pe.advance(self.peer_cons, unconsumed - replay);
            let src = self.written - replay;
            let (a, b) = pe.spans(start, replay as u32);
            self.actions.push_back(Action::RdmaWrite {
                src,
                remote_off: a.off,
                len: a.len,
            });
            if let Some(b) = b {
                self.actions.push_back(Action::RdmaWrite {
                    src: src + u64::from(a.len),
                    remote_off: b.off,
                    len: b.len,
                });
            }
        }
        // One CDC above every earlier sequence number: cursors, sticky flags (A included).
        self.send_cdc();
        self.flush();
    }

    /// The application consumed `n` octets from [`Conn::read_spans`].
    pub fn consume(&mut self, n: u64) -> Result<(), ConnError> {
        if let Some(r) = self.abort {
            return Err(ConnError::Aborted(r));
        }
        let readable = self.readable();
        if n > readable {
            return Err(ConnError::ConsumeTooMuch { asked: n, readable });
        }
        if n == 0 {
            return Ok(());
        }
        let e = self.p.local_rmbe;
        let mut urgent_consumed = false;
        if let Some(m) = self.urg_mark
            && e.distance(m, self.cons) <= n
        {
            urgent_consumed = true;
            self.urg_mark = None;
            self.urg_pending_in = false;
        }
        self.cons = e.advance(self.cons, n);
        self.maybe_window_update(urgent_consumed);
        Ok(())
    }

    /// The application shut down writing (SHUT_WR): D once the send stream is drained.
    pub fn shutdown_write(&mut self) -> Result<(), ConnError> {
        if let Some(r) = self.abort {
            return Err(ConnError::Aborted(r));
        }
        self.app_shut_wr = true;
        self.flush();
        Ok(())
    }

    /// The application closed the socket: C once drained; abort if data is unread.
    pub fn close(&mut self) {
        if self.abort.is_some() || self.app_closed {
            return;
        }
        self.app_closed = true;
        self.app_shut_wr = true;
        if self.readable() > 0 {
            self.start_abort(AbortReason::UnreadDataOnClose, true);
            return;
        }
        self.flush();
    }

    /// The application aborts the connection (e.g. SO_LINGER 0): A and a TCP reset.
    pub fn abort(&mut self) {
        if self.abort.is_none() {
            self.start_abort(AbortReason::Local, true);
        }
    }

    /// A TCP RST arrived on the TCP path (SMC-ABT-4).
    pub fn on_tcp_reset(&mut self) {
        if self.abort.is_none() && !self.peer_abort_seen && self.state != CloseState::Closed {
            self.start_abort(AbortReason::TcpReset, false);
        }
    }

    /// The guard timer of a wait state (or of a stalled close) expired (SMC-CLS-9, SMC-ABT-2).
    pub fn on_timeout(&mut self) {
        match self.state {
            CloseState::Closed => {}
            CloseState::PeerAbortWait => self.enter_closed(),
            _ if self.needs_timer() => {
                if self.abort.is_none() {
                    self.abort = Some(AbortReason::Timeout);
                }
                self.queued = 0;
                self.actions.push_back(Action::TcpReset);
                self.enter_closed();
            }
            _ => {}
        }
    }

    /// A CDC arrived for this link; validate it completely, then apply it.
    pub fn on_cdc(&mut self, m: &Cdc) -> CdcOutcome {
        if m.token != self.p.local_token {
            self.wrong_tokens += 1;
            return CdcOutcome::WrongToken;
        }
        if m.prod_flags.contains(ProducerFlags::FAILOVER_VALIDATION) {
            // SMC-FO-4: SR ≥ SS → go on; SR < SS → data was lost: reset at once. Not counted
            // in the sequence.
            let sr = self.last_seq_in.unwrap_or(0);
            if self.state != CloseState::Closed
                && self.abort.is_none()
                && m.seq != 0
                && (sr == 0 || seq_before(sr, m.seq))
            {
                tracing::warn!(
                    token = m.token,
                    sr,
                    ss = m.seq,
                    "failover validation: data lost, resetting"
                );
                self.start_abort(AbortReason::FailoverLoss, true);
                return CdcOutcome::Applied;
            }
            return CdcOutcome::Ignored;
        }
        if self.state == CloseState::Closed {
            return CdcOutcome::Ignored;
        }
        if let Some(last) = self.last_seq_in
            && seq_before(m.seq, last)
        {
            return CdcOutcome::Stale;
        }
        self.last_seq_in = Some(m.seq);
        if m.conn_flags.contains(ConnStateFlags::ABORT) {
            self.peer_abort_seen = true;
            if self.abort.is_some() {
                // Our abort crossed theirs, or they answered it: done (SMC-ABT-2, -5).
                self.enter_closed();
            } else {
                // Passive abort (SMC-ABT-3): drop everything, answer A, done.
                self.start_abort(AbortReason::PeerAbort, false);
            }
            return CdcOutcome::Applied;
        }
        if self.abort.is_some() {
            return CdcOutcome::Ignored;
        }
        if let Err(e) = self.validate(m) {
            tracing::warn!(token = m.token, seq = m.seq, error = %e, "invalid CDC, aborting the connection");
            self.start_abort(AbortReason::Protocol(e), true);
            return CdcOutcome::Aborted(e);
        }
        // Apply.
        self.peer_prod = m.prod;
        self.peer_cons = m.cons;
        self.peer_prod_flags = m.prod_flags;
        // The writer holds further data until it sees the urgent octet consumed, so every
        // CDC with U names the same mark; one that reaches us after we read past the mark
        // (our update still on its way) names an octet already consumed and is no news.
        let stale_urgent =
            m.prod_flags.contains(ProducerFlags::URGENT_PRESENT) && self.p.local_rmbe.distance(m.prod, self.cons) == 0;
        if m.prod_flags.contains(ProducerFlags::URGENT_PRESENT) && !stale_urgent && self.urg_mark != Some(m.prod) {
            self.urg_mark = Some(m.prod);
            self.urg_taken = false;
        }
        self.urg_pending_in = m.prod_flags.contains(ProducerFlags::URGENT_PENDING) && !stale_urgent;
        if let Some(u) = self.urg_written
            && self.p.peer_rmbe.distance(u, self.peer_cons) == 0
        {
            // The urgent data was consumed (SMC-URG-4/5).
            self.urg_written = None;
            self.urg_end = None;
        }
        let new_flags = m.conn_flags & !self.peer_conn;
        self.peer_conn |= m.conn_flags & (ConnStateFlags::DONE_WRITING | ConnStateFlags::CONN_CLOSED);
        if !new_flags.is_empty() && self.active_close.is_none() {
            self.active_close = Some(false);
        }
        if new_flags.contains(ConnStateFlags::CONN_CLOSED) && self.queued > 0 {
            // SMC-CLS-6: the peer closed while our data waits → reset.
            self.start_abort(AbortReason::PeerClosedWithUnsentData, true);
            return CdcOutcome::Applied;
        }
        self.flush();
        // SMC-CDC-8/9: a blocked writer or an explicit request gets our cursor now.
        if m.prod_flags
            .intersects(ProducerFlags::WRITE_BLOCKED | ProducerFlags::CONS_UPDATE_REQUESTED)
        {
            self.maybe_window_update(false);
        }
        self.update_state();
        CdcOutcome::Applied
    }

    fn validate(&self, m: &Cdc) -> Result<(), ProtocolError> {
        let le = self.p.local_rmbe;
        let pe = self.p.peer_rmbe;
        le.check(m.prod).map_err(|_| ProtocolError::ProducerOutOfRange)?;
        pe.check(m.cons).map_err(|_| ProtocolError::ConsumerOutOfRange)?;
        let cap = u64::from(le.capacity());
        if le.distance(m.prod, self.peer_prod) > cap {
            return Err(ProtocolError::ProducerRegressed);
        }
        if le.distance(m.prod, self.cons) > cap {
            return Err(ProtocolError::ProducerOverrun);
        }
        if m.prod != self.peer_prod
            && self
                .peer_conn
                .intersects(ConnStateFlags::DONE_WRITING | ConnStateFlags::CONN_CLOSED)
        {
            return Err(ProtocolError::DataAfterDone);
        }
        let pcap = u64::from(pe.capacity());
        if pe.distance(m.cons, self.peer_cons) > pcap {
            return Err(ProtocolError::ConsumerRegressed);
        }
        if pe.distance(self.prod, m.cons) > pcap {
            return Err(ProtocolError::ConsumerAhead);
        }
        Ok(())
    }

    /// Octets the next RDMA Write may carry now: queued, within the peer's free window,
    /// not past held urgent data.
    fn sendable(&self) -> u64 {
        let pe = self.p.peer_rmbe;
        let free = u64::from(pe.free(self.prod, self.peer_cons).unwrap_or(0));
        let mut n = self.queued.min(free);
        if self.urg_written.is_some() {
            n = 0; // hold data until the urgent octet is consumed (SMC-URG-4)
        } else if let Some(end) = self.urg_end {
            n = n.min(end - self.written);
        }
        n
    }

    /// Writes what the window allows, in writes of at most [`Conn::set_max_write`] octets,
    /// each followed by its CDC; then handles a pending shutdown or close.
    fn flush(&mut self) {
        if self.abort.is_some() || self.sent_flags.contains(ConnStateFlags::CONN_CLOSED) {
            return;
        }
        let pe = self.p.peer_rmbe;
        let mut n = self.sendable();
        if n == 0 && ((self.queued > 0 && !self.last_sent_blocked) || (self.urg_end.is_some() && !self.urg_announced)) {
            // Blocked: tell the reader (B), and announce pending urgent data (P) (SMC-URG-2).
            self.send_cdc();
        }
        while n > 0 {
            // n ≤ C ≤ 2^30.
            let n1 = n.min(u64::from(self.max_write));
            let (a, b) = pe.spans(self.prod, n1 as u32);
            self.actions.push_back(Action::RdmaWrite {
                src: self.written,
                remote_off: a.off,
                len: a.len,
            });
            if let Some(b) = b {
                self.actions.push_back(Action::RdmaWrite {
                    src: self.written + u64::from(a.len),
                    remote_off: b.off,
                    len: b.len,
                });
            }
            self.written += n1;
            self.queued -= n1;
            self.in_flight += n1;
            self.prod = pe.advance(self.prod, n1);
            if self.urg_end == Some(self.written) {
                self.urg_written = Some(self.prod);
            }
            n = self.sendable();
            // A CDC with more writes right behind it is not "blocked" (B) even though
            // octets are still queued: the reader need not answer it at once (SMC-CDC-8).
            self.send_cdc_blocked_ok(n == 0);
        }
        if self.app_shut_wr && self.unsent() == 0 {
            self.send_close_flag();
        }
    }

    fn send_close_flag(&mut self) {
        let want = if self.app_closed {
            ConnStateFlags::DONE_WRITING | ConnStateFlags::CONN_CLOSED
        } else {
            ConnStateFlags::DONE_WRITING
        };
        if self.sent_flags.contains(want) {
            return;
        }
        if self.active_close.is_none() {
            self.active_close = Some(true);
        }
        self.sent_flags |= want;
        self.send_cdc();
        self.update_state();
    }

    fn maybe_window_update(&mut self, force: bool) {
        if self.abort.is_some()
            || self.sent_flags.contains(ConnStateFlags::CONN_CLOSED)
            || self.peer_conn.contains(ConnStateFlags::CONN_CLOSED)
        {
            return;
        }
        let e = self.p.local_rmbe;
        let gain = e.distance(self.cons, self.cons_sent);
        if gain == 0 {
            return;
        }
        let cap = u64::from(e.capacity());
        let window = cap.saturating_sub(e.distance(self.peer_prod, self.cons_sent));
        let rule = window * 2 < cap && gain * 10 >= cap;
        let peer_wants = self
            .peer_prod_flags
            .intersects(ProducerFlags::WRITE_BLOCKED | ProducerFlags::CONS_UPDATE_REQUESTED);
        if force || rule || peer_wants {
            self.send_cdc();
        }
    }

    fn send_cdc(&mut self) {
        self.send_cdc_blocked_ok(true);
    }

    /// A CDC with the current cursors; B only if `blocked_ok` and octets are queued.
    fn send_cdc_blocked_ok(&mut self, blocked_ok: bool) {
        let mut pf = ProducerFlags::empty();
        if blocked_ok && self.queued > 0 {
            pf |= ProducerFlags::WRITE_BLOCKED;
        }
        if self.urg_end.is_some() {
            pf |= ProducerFlags::URGENT_PENDING;
            self.urg_announced = true;
        }
        if self.urg_written.is_some() {
            pf |= ProducerFlags::URGENT_PRESENT;
        }
        let m = Cdc {
            seq: self.next_seq,
            token: self.p.peer_token,
            prod: self.prod,
            cons: self.cons,
            prod_flags: pf,
            conn_flags: self.sent_flags,
        };
        self.next_seq = self.next_seq.wrapping_add(1);
        self.cons_sent = self.cons;
        self.last_sent_blocked = pf.contains(ProducerFlags::WRITE_BLOCKED);
        self.actions.push_back(Action::SendCdc(m));
    }

    fn start_abort(&mut self, reason: AbortReason, reset_tcp: bool) {
        self.abort = Some(reason);
        self.queued = 0;
        self.urg_mark = None;
        if !self.sent_flags.contains(ConnStateFlags::ABORT) {
            self.sent_flags |= ConnStateFlags::ABORT;
            self.send_cdc();
        }
        if reset_tcp {
            self.actions.push_back(Action::TcpReset);
        }
        if self.peer_abort_seen {
            self.enter_closed();
        } else {
            self.state = CloseState::PeerAbortWait;
        }
    }

    fn enter_closed(&mut self) {
        self.state = CloseState::Closed;
        if !self.released {
            self.released = true;
            self.actions.push_back(Action::ReleaseElement);
        }
    }

    fn update_state(&mut self) {
        if self.abort.is_some() || self.state == CloseState::Closed {
            return;
        }
        let sent_c = self.sent_flags.contains(ConnStateFlags::CONN_CLOSED);
        let sent_d = self.sent_flags.contains(ConnStateFlags::DONE_WRITING);
        let peer_c = self.peer_conn.contains(ConnStateFlags::CONN_CLOSED);
        let peer_d = self.peer_conn.contains(ConnStateFlags::DONE_WRITING);
        self.state = match self.active_close {
            None => CloseState::Active,
            _ if sent_c && peer_c => {
                self.enter_closed();
                return;
            }
            Some(true) if peer_c => CloseState::AppFinCloseWait,
            Some(true) if peer_d => CloseState::PeerCloseWait2,
            Some(true) => CloseState::PeerCloseWait1,
            Some(false) if sent_c => CloseState::PeerFinCloseWait,
            Some(false) if sent_d => CloseState::AppCloseWait2,
            Some(false) => CloseState::AppCloseWait1,
        };
    }
}
