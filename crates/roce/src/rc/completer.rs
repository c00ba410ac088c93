//! The completer: responses to our requests (IBA vol. 1 §9.7.5 for what responders send,
//! §9.7.6 for the requester receiving responses, §9.9.2 for the requester's errors; rxe's
//! `rxe_comp.c`).
//!
//! Rules implemented here:
//! - A response is only looked at when its PSN lies in `una..sent_max` (PSNs sent and not yet
//!   known to have arrived). Before `una`: a duplicate (dropped, counted); at or after
//!   `sent_max`: a ghost ACK for a PSN never sent (dropped, counted; §9.7.6, roce-sim's
//!   "ghost ACK").
//! - ACKs are coalesced (§9.7.5.1.2): an ACK for PSN p completes every Send/Write whose last
//!   PSN is at or before p. A Read response or ATOMIC ACK for PSN p, and any NAK for p,
//!   acknowledge every PSN before p the same way.
//! - Implied NAK (§9.7.6; subsection unconfirmed): when an ACK or response acknowledges a PSN at or after
//!   the next response PSN of an unanswered Read/atomic, that Read's/atomic's responses were
//!   lost: the requester goes back to the first missing response PSN.
//! - NAK PSN sequence error: go back to the NAK's PSN; NAK RNR: wait the peer's RNR timer, then
//!   go back (rnr_retry times, 7 = forever); NAK invalid request / remote access / remote
//!   operational: the WQE at that PSN completes with REM_INV_REQ_ERR / REM_ACCESS_ERR /
//!   REM_OP_ERR, the QP goes to ERR (§9.9.2).
//! - The local ACK timer: restarted on progress; when it fires the requester goes back to
//!   `una`, retry_cnt times; then RETRY_EXC_ERR (§9.7.6). PSN sequence NAKs without
//!   progress use up the same counter (rxe does the same).
//! - Read response data is placed at `(psn - first) × PMTU` of the WQE's scatter list, each
//!   piece checked through `MemTable::check(.., LOCAL_WRITE)` (§9.7.6); a wrong opcode
//!   position or length at the expected PSN is a bad response (BAD_RESP_ERR).

use std::time::{Duration, Instant};

use verbs::{QpState, WcStatus};

use super::requester::WqeKind;
use super::{RcQp, ScatterError, scatter};
use crate::wire::headers::{NakCode, Syndrome};
use crate::wire::opcode::Operation;
use crate::wire::{Packet, Psn};

/// What acknowledging up to a PSN found.
enum Confirm {
    Done,
    /// A Read/atomic before the PSN still waits for its response at this PSN.
    Implied(Psn),
}

impl RcQp {
    /// A response (ACK, NAK, Read response, ATOMIC ACK) from the peer's responder.
    pub(crate) fn on_response(&mut self, now: Instant, pkt: &Packet<'_>) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        let Some(info) = pkt.info() else { return };
        let psn = pkt.bth.psn;
        let una = self.req.una;
        let outstanding = self.req.sent_max.distance(una).max(0) as u32;
        if !psn.in_window(una, outstanding) {
            if psn.is_before(una) {
                self.stats.duplicate_responses += 1;
            } else {
                self.stats.ghost_responses += 1;
            }
            return;
        }
        match info.operation {
            Operation::Acknowledge => {
                let Some(aeth) = pkt.ext.aeth else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        if let Confirm::Implied(at) = self.confirm_through(now, psn) {
                            self.implied_nak(at);
                        }
                    }
                    Syndrome::RnrNak { timer } => {
                        self.confirm_before(now, psn);
                        self.stats.rnr_naks_received += 1;
                        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
                            return;
                        }
                        if self.attr.rnr_retry != 7 {
                            if self.req.rnr_retries_left == 0 {
                                self.fail_head(WcStatus::RnrRetryExcErr);
                                return;
                            }
                            self.req.rnr_retries_left -= 1;
                        }
                        self.req.rnr_until = Some(now + Duration::from_micros(u64::from(timer.micros())));
                        let at = self.req.una;
                        // The rest of the message, already on its way, meets a responder still
                        // expecting this PSN: its one sequence NAK is no new error.
                        self.req.retrying_from = Some(at);
                        self.req.go_back(at);
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.stats.seq_naks_received += 1;
                        let progressed = self.confirm_before(now, psn);
                        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
                            return;
                        }
                        let at = self.req.una;
                        if self.req.retrying_from == Some(at) {
                            return;
                        }
                        if !progressed {
                            if self.req.retries_left == 0 {
                                self.fail_head(WcStatus::RetryExcErr);
                                return;
                            }
                            self.req.retries_left -= 1;
                        }
                        self.req.retrying_from = Some(at);
                        self.req.go_back(at);
                    }
                    Syndrome::Nak(code) => {
                        self.confirm_before(now, psn);
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                            _ => WcStatus::BadRespErr,
                        };
                        if matches!(self.state, QpState::Rts | QpState::Sqd) {
                            self.fail_head(status);
                        }
                    }
                    Syndrome::Reserved(_) => {}
                }
            }
            Operation::RdmaReadResponse => self.on_read_response(now, pkt),
            Operation::AtomicAcknowledge => {
                if self.confirm_before_checked(now, psn) {
                    return;
                }
                let Some(i) = self.head_open() else { return };
                let w = &self.req.sq[i];
                if !w.kind.is_atomic() || w.expected() != psn || w.received != 0 {
                    return;
                }
                let Some(ack) = pkt.ext.atomic_ack_eth else { return };
                let sink = w.sink.clone();
                let r = scatter(
                    &self.cfg.mem,
                    &mut self.req.mr_cache,
                    self.cfg.pd,
                    self.cfg.qpn,
                    &sink,
                    0,
                    &ack.orig_rem_dt.to_ne_bytes(),
                );
                self.req.sq[i].received = 1;
                self.advance_una(now, psn.next());
                self.finish(
                    i,
                    match r {
                        Ok(()) => WcStatus::Success,
                        Err(_) => WcStatus::LocProtErr,
                    },
                );
            }
            _ => {}
        }
    }

    fn on_read_response(&mut self, now: Instant, pkt: &Packet<'_>) {
        let psn = pkt.bth.psn;
        if self.confirm_before_checked(now, psn) {
            return;
        }
        let Some(i) = self.head_open() else { return };
        let w = &self.req.sq[i];
        if !matches!(w.kind, WqeKind::Read { .. }) {
            return;
        }
        let e = w.expected();
        if psn != e {
            // Before: a duplicate response of a re-requested Read.
            if psn.is_before(e) {
                self.stats.duplicate_responses += 1;
            }
            return;
        }
        let Some(info) = pkt.info() else { return };
        let mtu = self.attr.path_mtu.bytes();
        let k = w.received;
        let off = k * mtu;
        let want = (w.len - off.min(w.len)).min(mtu) as usize;
        let last = k + 1 == w.npkts;
        // Positions are relative to the request that was (re)sent, so only "ends the message"
        // can be checked: a LAST/ONLY exactly at the last PSN.
        if info.position.ends() != last || pkt.payload.len() != want {
            self.fail_at(i, WcStatus::BadRespErr);
            return;
        }
        let sink = w.sink.clone();
        let r = scatter(
            &self.cfg.mem,
            &mut self.req.mr_cache,
            self.cfg.pd,
            self.cfg.qpn,
            &sink,
            u64::from(off),
            pkt.payload,
        );
        if r.is_ok() {
            self.stats.rx_payload_copied += pkt.payload.len() as u64;
        }
        if let Err(e) = r {
            self.fail_at(
                i,
                match e {
                    ScatterError::Length => WcStatus::LocLenErr,
                    ScatterError::Protection => WcStatus::LocProtErr,
                },
            );
            return;
        }
        self.req.sq[i].received = k + 1;
        self.advance_una(now, psn.next());
        if last {
            self.finish(i, WcStatus::Success);
        }
    }

    /// Index of the first WQE not completed.
    fn head_open(&self) -> Option<usize> {
        self.req.sq.iter().position(|w| w.status.is_none())
    }

    /// Acknowledges every PSN up to and including `p` (a coalesced ACK).
    fn confirm_through(&mut self, now: Instant, p: Psn) -> Confirm {
        let mut implied = None;
        // The open WQEs before `stop` are the ones this ACK completes (no list of them is
        // built: that was an allocation per ACK, issue 13).
        let mut stop = self.req.sq.len();
        for (i, w) in self.req.sq.iter().enumerate() {
            if w.status.is_some() {
                continue;
            }
            let ends_here = if !w.started {
                true
            } else if w.kind.is_rd_atomic() {
                if !w.expected().is_after(p) {
                    implied = Some(w.expected());
                }
                true
            } else {
                w.last().is_after(p)
            };
            if ends_here {
                stop = i;
                break;
            }
        }
        let until = implied.unwrap_or(p.next());
        self.advance_una(now, until);
        for w in self.req.sq.range_mut(..stop) {
            if w.status.is_none() {
                w.status = Some(WcStatus::Success);
            }
        }
        self.drain_done();
        match implied {
            Some(at) => Confirm::Implied(at),
            None => Confirm::Done,
        }
    }

    /// Acknowledges every PSN before `psn` (what a NAK or a response for `psn` implies);
    /// returns whether `una` moved. An implied NAK found on the way is acted on.
    fn confirm_before(&mut self, now: Instant, psn: Psn) -> bool {
        let before = self.req.una;
        if psn != before
            && let Confirm::Implied(at) = self.confirm_through(now, psn.sub(1))
        {
            self.implied_nak(at);
        }
        self.req.una != before
    }

    /// [`Self::confirm_before`] for a response at `psn`; true when an implied NAK was found
    /// (the response is then not for the head WQE).
    fn confirm_before_checked(&mut self, now: Instant, psn: Psn) -> bool {
        if psn == self.req.una {
            return false;
        }
        match self.confirm_through(now, psn.sub(1)) {
            Confirm::Implied(at) => {
                self.implied_nak(at);
                true
            }
            Confirm::Done => false,
        }
    }

    fn implied_nak(&mut self, at: Psn) {
        if self.req.retrying_from == Some(at) {
            return;
        }
        self.stats.implied_naks += 1;
        self.req.retrying_from = Some(at);
        self.req.go_back(at);
    }

    /// `una` moves to `to` if that is progress: the retry counter and the ACK timer restart
    /// (IBA vol. 1 §9.7.6).
    fn advance_una(&mut self, now: Instant, to: Psn) {
        if to.is_after(self.req.una) {
            self.req.una = to;
            self.req.retrying_from = None;
            self.req.retries_left = self.attr.retry_cnt;
            self.req.rnr_retries_left = self.attr.rnr_retry;
            self.req.ack_deadline = if self.req.sent_max.is_after(to) {
                self.attr.ack_timeout().map(|t| now + t)
            } else {
                None
            };
        }
    }

    fn fail_head(&mut self, status: WcStatus) {
        match self.head_open() {
            Some(i) => self.fail_at(i, status),
            None => self.enter_error(),
        }
    }

    fn fail_at(&mut self, i: usize, status: WcStatus) {
        self.finish(i, status);
        self.enter_error();
    }

    /// The local ACK timer or the RNR wait ran out (IBA vol. 1 §9.7.6).
    pub fn handle_timeout(&mut self, now: Instant) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        if let Some(t) = self.req.rnr_until
            && t <= now
        {
            self.req.rnr_until = None;
        }
        if let Some(t) = self.req.ack_deadline
            && t <= now
        {
            self.req.ack_deadline = None;
            if !self.req.sent_max.is_after(self.req.una) {
                return;
            }
            self.stats.ack_timeouts += 1;
            if self.req.retries_left == 0 {
                self.fail_head(WcStatus::RetryExcErr);
                return;
            }
            self.req.retries_left -= 1;
            self.req.retrying_from = None;
            let at = self.req.una;
            self.req.go_back(at);
        }
    }
}
