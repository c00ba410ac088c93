//! The link-group machine's state: construction, accessors, the deadline, sending LLC
//! messages, termination, connections counted and our CONFIRM RKEY.

use super::{Busy, LgrAction, LgrConfig, LgrCounters, LgrMachine, PeerRmb, TermReason};
use crate::stats::Role;
use crate::wire::llc::{ConfirmRkey, DeleteLink, LLC_LEN, LinkRtoken, LlcBody, LlcMessage, LlcVersion, delete_reason};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

impl LgrMachine {
    /// A group whose first link was just confirmed, with no connection yet (the first one
    /// is added by the engine at once).
    ///
    /// A v2 group (SMC-Rv2) is held at one link whatever `cfg` asks: the second-link
    /// exchange is built for the v1 form (a v2 ADD LINK carries an RToken extension this
    /// machine does not fill), so a v2 peer's ADD LINK is rejected, in Linux's v2 form.
    pub fn new(mut cfg: LgrConfig, now: Instant) -> Self {
        if cfg.version == LlcVersion::V2 {
            cfg.max_links = 1;
            cfg.add_link_retry = None;
        }
        let mut m = Self {
            cfg,
            terminated: None,
            conns: 0,
            last_rx: now,
            test_out: None,
            test_seq: 0,
            rkey_out: None,
            linger_at: None,
            links: vec![cfg.link_num],
            adding: None,
            deleting: None,
            recently_deleted: None,
            next_link: cfg.link_num.wrapping_add(1).max(1),
            add_due_at: None,
            peer_rmbs: Vec::new(),
            out: VecDeque::new(),
            counters: LgrCounters::default(),
        };
        m.linger_at = Some(now + m.linger());
        if cfg.role == Role::Server && cfg.max_links > 1 && cfg.add_link_retry.is_some() {
            m.add_due_at = Some(now);
        }
        m
    }

    fn linger(&self) -> Duration {
        match self.cfg.role {
            Role::Server => self.cfg.linger,
            Role::Client => self.cfg.linger + Duration::from_secs(2),
        }
    }

    /// Settings.
    pub fn config(&self) -> &LgrConfig {
        &self.cfg
    }

    /// Why the group ended, once it has.
    pub fn terminated(&self) -> Option<&TermReason> {
        self.terminated.as_ref()
    }

    /// True while the group may take new connections.
    pub fn usable(&self) -> bool {
        self.terminated.is_none() && self.rkey_out.is_none()
    }

    /// No connection: waiting for the linger time.
    pub fn lingering(&self) -> bool {
        self.conns == 0 && self.terminated.is_none()
    }

    /// Connections counted.
    pub fn conns(&self) -> usize {
        self.conns
    }

    /// Counters.
    pub fn counters(&self) -> LgrCounters {
        self.counters
    }

    /// The active (confirmed) links, in ascending order.
    pub fn links(&self) -> &[u8] {
        &self.links
    }

    /// The link being added, while an ADD LINK exchange runs.
    pub fn adding_link(&self) -> Option<u8> {
        self.adding.as_ref().map(|a| a.link)
    }

    /// The link LLC requests and TEST LINK go on: the lowest active one.
    pub fn primary(&self) -> Option<u8> {
        self.links.first().copied()
    }

    /// The peer's RMBs announced with CONFIRM RKEY, as RKey → VA on the primary link.
    pub fn peer_rkeys(&self) -> BTreeMap<u32, u64> {
        let Some(p) = self.primary() else {
            return BTreeMap::new();
        };
        self.peer_rmbs
            .iter()
            .filter_map(|r| r.tokens.get(&p).copied())
            .collect()
    }

    /// The peer's RToken on link `to` of the RMB whose RKey on link `from` is `rkey`.
    pub fn peer_rtoken(&self, from: u8, rkey: u32, to: u8) -> Option<(u32, u64)> {
        self.peer_rmbs
            .iter()
            .find(|r| r.tokens.get(&from).is_some_and(|t| t.0 == rkey))
            .and_then(|r| r.tokens.get(&to).copied())
    }

    /// The engine learned a peer RMB outside CONFIRM RKEY (the CLC Accept/Confirm of a
    /// first contact): its RToken on `link`.
    pub fn peer_rmb_known(&mut self, link: u8, rkey: u32, vaddr: u64) {
        if self.peer_rtoken(link, rkey, link).is_none() {
            let mut r = PeerRmb::default();
            r.tokens.insert(link, (rkey, vaddr));
            self.peer_rmbs.push(r);
        }
    }

    /// Next action.
    pub fn poll_action(&mut self) -> Option<LgrAction> {
        self.out.pop_front()
    }

    /// The earliest time [`LgrMachine::on_tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.terminated.is_some() {
            return None;
        }
        let ka = match self.test_out {
            Some((_, t, _)) => t + self.cfg.llc_wait,
            None => self.last_rx + self.cfg.keepalive,
        };
        [
            Some(ka),
            self.rkey_out.map(|(_, t)| t + self.cfg.llc_wait),
            self.adding.as_ref().map(|a| a.since + self.cfg.llc_wait),
            self.deleting.as_ref().map(|d| d.1 + self.cfg.llc_wait),
            self.add_due_at,
            self.linger_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub(super) fn send_on(&mut self, link: u8, mut m: LlcMessage) {
        // The group's LLC form follows its CLC version (SMC-Rv2: Linux's v2 messages).
        m.version = self.cfg.version;
        let mut b = [0u8; LLC_LEN];
        if m.emit(&mut b).is_ok() {
            self.counters.llc_sent += 1;
            self.out.push_back(LgrAction::SendLlc { link, msg: b });
        }
    }

    fn send(&mut self, m: LlcMessage) {
        if let Some(p) = self.primary() {
            self.send_on(p, m);
        }
    }

    pub(super) fn terminate(&mut self, why: TermReason, tell_peer: bool) {
        if self.terminated.is_some() {
            return;
        }
        tracing::warn!(reason = %why, role = ?self.cfg.role, "SMC-R link group ends");
        if tell_peer {
            let reason = match why {
                TermReason::ProtocolError(_) => delete_reason::PROTOCOL_VIOLATION,
                TermReason::Idle => delete_reason::PROGRAM,
                _ => delete_reason::LOST_PATH,
            };
            self.send(LlcMessage::request(LlcBody::DeleteLink(DeleteLink {
                all: true,
                orderly: false,
                link_num: 0,
                reason,
            })));
        }
        if let Some((rkey, _)) = self.rkey_out.take() {
            self.out.push_back(LgrAction::RkeyConfirmed { rkey, ok: false });
        }
        self.adding = None;
        self.deleting = None;
        self.terminated = Some(why.clone());
        self.out.push_back(LgrAction::Terminate(why));
    }

    pub(super) fn protocol_error(&mut self, what: String) {
        self.terminate(TermReason::ProtocolError(what), true);
    }

    /// A connection now uses the group.
    pub fn conn_added(&mut self) {
        self.conns += 1;
        self.linger_at = None;
    }

    /// A connection of the group is gone (its element freed).
    pub fn conn_removed(&mut self, now: Instant) {
        self.conns = self.conns.saturating_sub(1);
        if self.conns == 0 {
            self.linger_at = Some(now + self.linger());
        }
    }

    /// Anything (CDC or LLC) arrived on the link: the link is alive (SMC-KA-1).
    pub fn on_rx(&mut self, now: Instant) {
        self.last_rx = now;
    }

    /// A completion error or a device event that ends the whole group (the single-link
    /// engine's call; [`LgrMachine::link_failed`] for one link of several).
    pub fn link_error(&mut self, why: String) {
        self.terminate(TermReason::LinkError(why), false);
    }

    /// Local decision to end the group at once (DELETE LINK with A to the peer).
    pub fn shutdown(&mut self, why: TermReason) {
        self.terminate(why, true);
    }

    pub(super) fn exchange_running(&self) -> bool {
        self.rkey_out.is_some() || self.adding.is_some() || self.deleting.is_some()
    }

    /// Announces a new RMB of ours (CONFIRM RKEY, SMC-SC-2/5, A4.8): the engine registers it
    /// and calls this before the Accept/Confirm that names it; the connection waits for
    /// [`LgrAction::RkeyConfirmed`]. One link: this link's RToken and no others (E-3).
    pub fn confirm_rkey(&mut self, rkey: u32, vaddr: u64, now: Instant) -> Result<(), Busy> {
        self.confirm_rkey_links(rkey, vaddr, Vec::new(), now)
    }

    /// [`LgrMachine::confirm_rkey`] with the RMB's RTokens on the other active links
    /// (at most 2 fit in one message; E-3: NumTkns counts them).
    pub fn confirm_rkey_links(
        &mut self,
        rkey: u32,
        vaddr: u64,
        others: Vec<LinkRtoken>,
        now: Instant,
    ) -> Result<(), Busy> {
        if self.exchange_running() || self.terminated.is_some() || others.len() > 2 {
            return Err(Busy);
        }
        self.rkey_out = Some((rkey, now));
        self.send(LlcMessage::request(LlcBody::ConfirmRkey(ConfirmRkey {
            negative: false,
            retry: false,
            num_tkns: others.len() as u8,
            rkey,
            vaddr,
            others,
        })));
        Ok(())
    }
}
