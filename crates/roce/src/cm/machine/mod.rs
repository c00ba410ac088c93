//! The IB CM connection state machine (IBA vol. 1 ch. 12; §12.9 unconfirmed), sans-I/O in the quinn-proto style:
//! one [`Cm`] per port is fed received MADs ([`Cm::handle_mad`]), application commands
//! ([`Cm::listen`], [`Cm::connect`], [`Cm::accept`], [`Cm::reject`], [`Cm::rtu`],
//! [`Cm::disconnect`]) and the clock ([`Cm::handle_timeout`]), and is drained with
//! [`Cm::poll_transmit`], [`Cm::poll_event`] and [`Cm::poll_timeout`]. It does no I/O, reads no
//! clock and draws randomness only from the seed in [`CmConfig`].
//!
//! ```text
//!  active                                   passive
//!  connect ── REQ ────────────────────────▶ ReqRcvd ── ConnectRequest event
//!  ReqSent  (retransmitted every             │   (a repeated REQ while the application
//!   │        peer response timeout)          │    has not answered: MRA, MraReqSent)
//!   │ ◀──────────────────────────── REP ──  accept → RepSent (REP retransmitted)
//!  RepRcvd ── ConnectReply event             │
//!  rtu ── RTU ───────────────────────────▶  Established ── Established event
//!  Established ── Established event
//!  disconnect ── DREQ ───────────────────▶  DREP, TimeWait ── Disconnected event
//!  DreqSent ◀─────────────────────── DREP
//!  TimeWait ── Disconnected event; TimeWaitExit after the time-wait
//! ```
//!
//! Timers (C1.7): a message that wants an answer (REQ, REP, DREQ) is sent again after the
//! peer's CM response timeout (4.096 µs × 2^t) plus twice the packet life time, up to the max
//! CM retries of the REQ; then REQ and REP end in REJ "timeout" (IBA vol. 1 table 109, inferred, code 4;
//! [`RejReason::Timeout`]; code 1 is "no QP") with our CA GUID as ARI, as Linux's
//! `cm_destroy_id` does, and a [`CmEvent::TimedOut`]; DREQ ends in time-wait. An MRA stops
//! the retransmission and waits the service timeout it announces.
//!
//! SIDR (IBA vol. 1 §12.11 (unconfirmed), for UD; requirement D3 and issue 14): [`Cm::sidr_request`] sends a
//! SIDR_REQ that is sent again, unchanged (same TID and request ID, as Linux's MAD layer
//! does), every peer response timeout up to the max CM retries, then ends in
//! [`CmEvent::SidrTimedOut`]; the SIDR_REP matched by request ID ends it in
//! [`CmEvent::SidrReply`]. A SIDR_REQ for a service ID we listen on becomes a
//! [`CmEvent::SidrRequest`] for [`Cm::sidr_reply`]; one for any other service ID is
//! answered at once with status 1 (service ID not supported, Linux `cm_sidr_req_handler`).
//! A repeat of a SIDR_REQ still waiting for the application is dropped (counted as a
//! duplicate, as Linux does); a repeat after the answer (the SIDR_REP was lost) gets the
//! same SIDR_REP again for the time-wait. At most [`MAX_SIDR_PENDING`] requests wait for
//! the application; more are dropped (the requester retries).
//!
//! Matching (C1.7): REP/RTU/MRA/REJ/DREQ/DREP are found by their remote comm ID (our local
//! one); a repeated REQ by (remote CA GUID, remote comm ID); a new REQ whose (CA GUID, QPN)
//! belongs to a live connection gets REJ 10 and the old connection a DREQ (Linux, measured).
//!
//! # Modules
//! - `params`: what the application gives and gets ([`CmConfig`], [`ConnectParams`],
//!   [`AcceptParams`], [`QpParams`], [`ConnectRequest`], [`SidrRequest`]);
//! - `event`: [`CmEvent`], [`CmError`], [`State`], [`CmStats`];
//! - `establish`: REQ / REP / RTU, active and passive (C1.4, C1.5, C1.8);
//! - `reject`: REJ and MRA (C1.6, C1.7);
//! - `teardown`: DREQ / DREP and time-wait (C1.7);
//! - `sidr`: SIDR_REQ / SIDR_REP (D3);
//! - this module: the [`Cm`] itself, MAD dispatch, timers and retransmission.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use verbs::Gid;

use crate::cm::mad::{CmMsg, Mad, MadError, MadHeader, MsgType, Rej, RejReason, Rep, Req};

mod establish;
mod event;
mod params;
mod reject;
mod sidr;
mod teardown;

pub use event::{CmError, CmEvent, CmStats, State};
pub use params::{
    AcceptParams, CmConfig, CmId, ConnectParams, ConnectRequest, MAX_SIDR_ANSWERED, MAX_SIDR_PENDING, QpParams, SidrId,
    SidrRequest,
};

/// 4.096 µs × 2^t, the IBA time code (t is at most 31).
pub fn iba_time(t: u8) -> Duration {
    Duration::from_nanos(4096u64 << u32::from(t.min(31)))
}

#[derive(Debug)]
struct Conn {
    state: State,
    active: bool,
    peer: Gid,
    remote_comm_id: u32,
    remote_ca_guid: u64,
    remote_qpn: u32,
    /// The REQ we sent or received.
    req: Req,
    /// The REP we sent or received.
    rep: Option<Rep>,
    /// TID of the REQ (REP and RTU reuse it).
    tid: u64,
    /// The last message we sent that a repeat of the peer's message is answered with, or
    /// that the timer resends.
    last: Option<Mad>,
    timer: Option<Instant>,
    retries: u8,
    /// How long the peer may take to answer us.
    peer_timeout: Duration,
    max_retries: u8,
    min_rnr_timer: u8,
}

/// A SIDR_REQ we sent, waiting for its SIDR_REP.
#[derive(Debug)]
struct SidrOut {
    peer: Gid,
    mad: Mad,
    timer: Instant,
    retries: u8,
}

/// A SIDR_REQ we received: waiting for the application (`answer` empty), or answered and
/// remembered until `expires` to answer a repeat.
#[derive(Debug)]
struct SidrIn {
    peer: Gid,
    request_id: u32,
    tid: u64,
    service_id: u64,
    answer: Option<(Mad, Instant)>,
}

/// The CM of one port.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    rng: StdRng,
    tid_hi: u32,
    tid_lo: u32,
    listeners: HashSet<u64>,
    conns: HashMap<u32, Conn>,
    /// (remote CA GUID, remote comm ID) → local comm ID, for repeated REQs.
    by_remote: HashMap<(u64, u32), u32>,
    /// (remote CA GUID, remote QPN) → local comm ID of live connections (stale check).
    by_qpn: HashMap<(u64, u32), u32>,
    /// Our SIDR_REQs by request ID.
    sidr_out: HashMap<u32, SidrOut>,
    /// SIDR_REQs received, by our handle.
    sidr_in: HashMap<u32, SidrIn>,
    /// (sender, request ID) → our handle, for repeated SIDR_REQs.
    sidr_by_remote: HashMap<(Gid, u32), u32>,
    /// Answered handles in the order they were answered (expiry and the bound).
    sidr_answered: VecDeque<u32>,
    tx: VecDeque<(Gid, Mad)>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
}

fn check_len(what: &'static str, v: &[u8], max: usize) -> Result<(), CmError> {
    if v.len() > max {
        Err(CmError::TooLong {
            what,
            len: v.len(),
            max,
        })
    } else {
        Ok(())
    }
}

impl Cm {
    /// The CM of a port with `cfg`, no listeners and no connections.
    pub fn new(cfg: CmConfig) -> Cm {
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        let tid_hi = rng.random();
        Cm {
            cfg,
            rng,
            tid_hi,
            tid_lo: 0,
            listeners: HashSet::new(),
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            by_qpn: HashMap::new(),
            sidr_out: HashMap::new(),
            sidr_in: HashMap::new(),
            sidr_by_remote: HashMap::new(),
            sidr_answered: VecDeque::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// The settings it was created with.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// The state of a connection, if it exists.
    pub fn state(&self, id: CmId) -> Option<State> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    /// Number of connections (in any state, time-wait included).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    // ---- drains -------------------------------------------------------------------------

    /// The next MAD to send and the GID it goes to (QP1 there, Q_Key 0x80010000).
    pub fn poll_transmit(&mut self) -> Option<(Gid, Mad)> {
        self.tx.pop_front()
    }

    /// The next event for the application or the provider, in order.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest time [`Cm::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(|c| c.timer);
        let out = self.sidr_out.values().map(|o| o.timer);
        let answered = self
            .sidr_answered
            .front()
            .and_then(|h| self.sidr_in.get(h))
            .and_then(|i| i.answer.as_ref().map(|a| a.1));
        conns.chain(out).chain(answered).min()
    }

    /// Accepts REQs for `service_id` (C1.7 "listen by service ID").
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listeners.insert(service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        Ok(())
    }

    /// Stops accepting REQs for `service_id`; later ones get REJ 8.
    pub fn unlisten(&mut self, service_id: u64) -> bool {
        self.listeners.remove(&service_id)
    }

    /// A MAD that arrived on QP1 from `from` (the sender's GID). Returns an error (and counts
    /// it) when the MAD does not parse; a MAD that parses but matches nothing is dropped and
    /// counted, or answered as the IBA and Linux do (REJ 8, REJ 10, DREP).
    pub fn handle_mad(&mut self, now: Instant, mad: &[u8], from: Gid) -> Result<(), MadError> {
        let m = match Mad::parse(mad) {
            Ok(m) => m,
            Err(e) => {
                self.stats.dropped += 1;
                return Err(e);
            }
        };
        let tid = m.hdr.tid;
        match m.msg {
            CmMsg::Req(req) => self.on_req(now, tid, req, from),
            CmMsg::Rep(rep) => self.on_rep(now, rep),
            CmMsg::Rtu(rtu) => self.on_rtu(rtu),
            CmMsg::Mra(mra) => self.on_mra(now, mra),
            CmMsg::Rej(rej) => self.on_rej(now, rej),
            CmMsg::Dreq(dreq) => self.on_dreq(now, tid, dreq, from),
            CmMsg::Drep(drep) => self.on_drep(now, drep),
            CmMsg::SidrReq(req) => self.on_sidr_req(tid, req, from),
            CmMsg::SidrRep(rep) => self.on_sidr_rep(rep),
        }
        Ok(())
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.timer.is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.on_timer(now, id);
        }
        let due: Vec<u32> = self
            .sidr_out
            .iter()
            .filter(|(_, o)| o.timer <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let retry = self.timeout(self.cfg.cm_response_timeout);
            let max = self.cfg.max_cm_retries;
            let Some(o) = self.sidr_out.get_mut(&id) else { continue };
            if o.retries < max {
                o.retries += 1;
                o.timer = now + retry;
                self.stats.retransmits += 1;
                self.tx.push_back((o.peer, o.mad.clone()));
            } else {
                self.sidr_out.remove(&id);
                self.events.push_back(CmEvent::SidrTimedOut { id: SidrId(id) });
            }
        }
        while let Some(&h) = self.sidr_answered.front() {
            let expired = self
                .sidr_in
                .get(&h)
                .is_none_or(|i| i.answer.as_ref().is_none_or(|a| a.1 <= now));
            if !expired {
                break;
            }
            self.sidr_answered.pop_front();
            self.forget_sidr_in(h);
        }
    }

    fn timeout(&self, t: u8) -> Duration {
        iba_time(t) + 2 * iba_time(self.cfg.packet_life_time)
    }

    fn new_comm_id(&mut self) -> u32 {
        loop {
            let id: u32 = self.rng.random();
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn new_tid(&mut self) -> u64 {
        self.tid_lo = self.tid_lo.wrapping_add(1);
        (u64::from(self.tid_hi) << 32) | u64::from(self.tid_lo)
    }

    fn remove(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            if c.remote_comm_id != 0 {
                self.by_remote.remove(&(c.remote_ca_guid, c.remote_comm_id));
            }
            if self.by_qpn.get(&(c.remote_ca_guid, c.remote_qpn)) == Some(&id) {
                self.by_qpn.remove(&(c.remote_ca_guid, c.remote_qpn));
            }
        }
    }

    fn send(&mut self, to: Gid, tid: u64, msg: CmMsg) {
        self.tx.push_back((
            to,
            Mad {
                hdr: MadHeader::with_tid(tid),
                msg,
            },
        ));
    }

    fn resend_last(&mut self, id: u32) {
        if let Some(c) = self.conns.get(&id)
            && let Some(m) = &c.last
        {
            self.tx.push_back((c.peer, m.clone()));
        }
    }

    fn on_timer(&mut self, now: Instant, id: u32) {
        let ca_guid = self.cfg.ca_guid;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.timer = None;
        match c.state {
            State::ReqSent | State::RepSent | State::DreqSent if c.retries < c.max_retries => {
                c.retries += 1;
                c.timer = Some(now + c.peer_timeout);
                self.stats.retransmits += 1;
                self.resend_last(id);
            }
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                // Retries exhausted, or the MRA's service timeout passed: REJ "timeout" with
                // our CA GUID as ARI (IBA vol. 1 §12.6.7 (unconfirmed); Linux cm_destroy_id).
                let message_rejected = if c.active { MsgType::Req } else { MsgType::Rep };
                let rej = CmMsg::Rej(Rej {
                    local_comm_id: id,
                    remote_comm_id: c.remote_comm_id,
                    message_rejected,
                    reason: RejReason::Timeout,
                    ari: ca_guid.to_be_bytes().to_vec(),
                    private_data: Vec::new(),
                });
                let (peer, tid) = (c.peer, c.tid);
                self.send(peer, tid, rej);
                self.remove(id);
                self.events.push_back(CmEvent::TimedOut { id: CmId(id) });
            }
            State::DreqSent => {
                // The peer never answered our DREQ: the connection is down all the same.
                self.enter_time_wait(now, id);
                self.events.push_back(CmEvent::Disconnected {
                    id: CmId(id),
                    private_data: Vec::new(),
                });
            }
            State::TimeWait => {
                self.remove(id);
                self.events.push_back(CmEvent::TimeWaitExit { id: CmId(id) });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iba_time_codes() {
        assert_eq!(iba_time(0), Duration::from_nanos(4096));
        // 20 → 4.294967296 s, rdma_cm's CM response timeout.
        assert_eq!(iba_time(20), Duration::from_nanos(4_294_967_296));
        assert_eq!(iba_time(40), iba_time(31));
    }
}
