//! The sans-I/O link-group machine: what one SMC-R link group does with LLC messages and
//! timers (RFC 7609 §2.3, §3.3, §3.5.4, §3.5.5, §4.5.3, App. C.7; requirements A2.5, A2.6,
//! A2.12, A2.13, A4.2, A4.7, A4.8, A4.9).
//!
//! The engine ([`crate::stream`]) feeds it the LLC messages received on each link of the
//! group ([`LgrMachine::on_llc_on`]; [`LgrMachine::on_llc`] = on the first active link), the
//! fact that anything arrived ([`LgrMachine::on_rx`]), connections coming and going, failed
//! links ([`LgrMachine::link_failed`]; [`LgrMachine::link_error`] ends the whole group) and
//! the clock ([`LgrMachine::on_tick`]); it answers with [`LgrAction`]s: LLC messages to post
//! on a given link, the outcome of our CONFIRM RKEY, the steps of adding a link, failover
//! and the freeing of a link, and termination of the group.
//!
//! **Links.** A group starts with one link (number [`LgrConfig::link_num`]) and may have up
//! to [`LgrConfig::max_links`] (1 = the single-link behaviour: an ADD LINK from the server
//! is answered with Z, reason 1 "no alternate path", SMC-FC-9). With 2:
//! - **ADD LINK, server** ([`LgrMachine::srv_add_link`], A4.2 steps 12–16, SMC-RMB-6): ADD
//!   LINK request on the carrying link with our new QP → the client's reply (Z = rejected:
//!   [`LgrAction::LinkFree`], retry later, SMC-LG-13; else [`LgrAction::AddLinkPeer`]: move
//!   the new QP to RTR/RTS) → ADD LINK CONTINUATION requests with two RToken pairs each
//!   (reference RKey on the carrying link, RKey and VA on the new link), the client
//!   answering each with its own, the side with fewer tokens sending empty ones → CONFIRM
//!   LINK on the **new** link → its reply: [`LgrAction::LinkUp`].
//! - **ADD LINK, client**: the request is checked (MTU enum, SMC-INV-2 → reject reason 2;
//!   a link number in use → protocol error), then [`LgrAction::AddLinkRequest`] asks the
//!   engine, which answers [`LgrMachine::cli_add_link_accept`] (its new QP in RTR and its
//!   RToken pairs) or [`LgrMachine::cli_add_link_reject`] (no alternate path); the
//!   continuations are stored and answered; CONFIRM LINK on the new link is answered and
//!   the link is up.
//! - **Bad continuations** (SMC-INV-5, A2.15): a pair count that does not match NumRTokens,
//!   a NumRTokens that does not count down, a reference RKey that names no RMB of the peer
//!   on the carrying link, or a continuation outside an exchange = protocol error (the
//!   group ends as for any protocol error: DELETE LINK A, connections reset).
//! - **Timeouts**: every step waits [`LgrConfig::llc_wait`]. An unanswered ADD LINK or
//!   continuation frees the new link and counts as a failure of the carrying link
//!   (SMC-TMO-6, -7, -10); an unanswered CONFIRM LINK on the new link: DELETE LINK for it
//!   over the carrying link, free it, retry later (SMC-TMO-9).
//! - **Link failure with a survivor** (SMC-FO-1, A4.7): [`LgrAction::LinkFailed`] names the
//!   failed link and the survivor (the engine moves every connection, [`crate::conn`]'s
//!   failover); the server sends DELETE LINK (lost path) for it on the survivor and frees it
//!   on the reply, the client sends the DELETE LINK notification and frees it at once; the
//!   server re-adds a link later ([`LgrAction::AddLinkDue`] every
//!   [`LgrConfig::add_link_retry`] while below the maximum, SMC-LG-13). The last link
//!   failing ends the group as before (SMC-ABT-6).
//! - Exchanges never overlap (SMC-LG-15): [`Busy`] while one runs; a peer's CONFIRM RKEY
//!   during ADD LINK is answered negatively with C (SMC-LG-16, SMC-RMB-4).
//!
//! Rows of A2.6 handled here: SMC-TMO-14 (DELETE LINK A → tear down), SMC-TMO-16 (CONFIRM
//! RKEY or TEST LINK unanswered within the LLC wait → link failed), SMC-INV-6/7 (DELETE LINK
//! for an unknown link → reply "no link" 0x00100000, E-10), SMC-INV-9 (DELETE RKEY for an
//! unknown RKey → negative reply with the error mask), SMC-INV-10 (TEST LINK reply with other
//! user data → link down), SMC-INV-11 (anything unambiguously wrong or out of sync: a
//! malformed message, an unknown mandatory opcode, a reply nobody asked for that cannot be
//! stale, a CONFIRM LINK on an established link → link down), SMC-LG-19 (unknown optional
//! opcode 0x80–0xBF → discarded). SMC-KA-1/2: TEST LINK as keepalive (on the first active
//! link) when nothing arrived for the keepalive time; requests answered at once with the
//! same user data, on the link they came on (SMC-LG-14).
//! A4.9: a group without connections lingers, then the server sends DELETE LINK (A, reason
//! 0x00030000) and both free it (the client waits a little longer, so the server decides).

use crate::stats::Role;
use crate::wire::llc::{
    AddLink, AddLinkCont, ConfirmLink, ConfirmRkey, DeleteLink, DeleteRkey, LLC_LEN, LinkRtoken, LlcBody, LlcError,
    LlcMessage, LlcVersion, RtokenPair, TestLink, add_link_reject, delete_reason,
};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Linux's LLC reply wait (SMC_LLC_WAIT_TIME, 2 s).
pub const LLC_WAIT: Duration = Duration::from_secs(2);
/// Linux's default TEST LINK interval (net.smc… `smc_keepalive`-like, 30 s).
pub const KEEPALIVE: Duration = Duration::from_secs(30);

/// Settings of one group's machine.
#[derive(Debug, Clone, Copy)]
pub struct LgrConfig {
    /// Our role.
    pub role: Role,
    /// The number of the group's first link.
    pub link_num: u8,
    /// Nothing received for this long → TEST LINK (SMC-KA-1).
    pub keepalive: Duration,
    /// An LLC request unanswered for this long → the link failed (SMC-TMO-16).
    pub llc_wait: Duration,
    /// A group without connections is torn down after this long (A4.9).
    pub linger: Duration,
    /// Most links in the group (1 or 2; 1 = refuse ADD LINK with "no alternate path").
    pub max_links: u8,
    /// Server: with fewer than `max_links` links and no exchange running, ask the engine to
    /// add one ([`LgrAction::AddLinkDue`]) at once and then this often (SMC-FC-8,
    /// SMC-LG-13). `None`: never asked.
    pub add_link_retry: Option<Duration>,
    /// The group's LLC form: v1, or Linux's SMC-Rv2 form in a group set up by a v2 CLC
    /// exchange. Messages of the other version are protocol errors.
    pub version: LlcVersion,
}

impl LgrConfig {
    /// Defaults for `role`: keepalive 30 s, LLC wait 2 s, linger 10 s (server; the client
    /// 2 s longer so that the server's DELETE LINK normally decides), one link.
    pub fn new(role: Role) -> Self {
        Self {
            role,
            link_num: 1,
            keepalive: KEEPALIVE,
            llc_wait: LLC_WAIT,
            linger: Duration::from_secs(10),
            max_links: 1,
            add_link_retry: None,
            version: LlcVersion::V1,
        }
    }
}

/// Why a group (or a link) ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TermReason {
    /// The peer broke the LLC protocol (SMC-INV-10/11).
    #[error("LLC protocol error: {0}")]
    ProtocolError(String),
    /// An LLC request of ours was not answered within the LLC wait (SMC-TMO-16).
    #[error("{0} not answered in time")]
    LlcTimeout(&'static str),
    /// The peer deleted the link or the group (DELETE LINK, reason code).
    #[error("peer deleted the link (reason {0:#010x})")]
    PeerDeleted(u32),
    /// The link failed locally (completion error, device down).
    #[error("link failed: {0}")]
    LinkError(String),
    /// No connection for the linger time (A4.9).
    #[error("idle link group freed")]
    Idle,
    /// The peer rejected a new link (ADD LINK reply with Z, reason).
    #[error("ADD LINK rejected (reason {0})")]
    AddRejected(u8),
}

/// Our end of a new link, as the engine made it (its QP in INIT, or RTR for the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkAddr {
    /// RoCE MAC of the new link's device.
    pub mac: [u8; 6],
    /// GID of the new link's device.
    pub gid: [u8; 16],
    /// The new QP's number.
    pub qpn: u32,
    /// Path MTU enum (1..=5).
    pub qp_mtu: u8,
    /// Initial PSN.
    pub psn: u32,
    /// Link user ID (CONFIRM LINK).
    pub link_uid: [u8; 4],
}

/// What the engine must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LgrAction {
    /// Post this LLC message (44 octets) on link `link`.
    SendLlc {
        /// Link number to post on.
        link: u8,
        /// The message.
        msg: [u8; LLC_LEN],
    },
    /// Our CONFIRM RKEY for `rkey` was answered: `ok` = positive.
    RkeyConfirmed {
        /// The RKey announced.
        rkey: u32,
        /// Positive reply.
        ok: bool,
    },
    /// Server: time to try adding a link ([`LgrMachine::srv_add_link`]) if a device for it
    /// is there (SMC-FC-8, SMC-LG-13).
    AddLinkDue,
    /// Client: the server offers link `link` (its QP values in `peer`); answer with
    /// [`LgrMachine::cli_add_link_accept`] or [`LgrMachine::cli_add_link_reject`].
    AddLinkRequest {
        /// The new link's number.
        link: u8,
        /// The server's ADD LINK.
        peer: AddLink,
    },
    /// Server: the client accepted link `link`; move its QP to RTR/RTS towards `peer`.
    AddLinkPeer {
        /// The new link's number.
        link: u8,
        /// The client's ADD LINK reply.
        peer: AddLink,
    },
    /// Link `link` is confirmed and usable for data; the peer's RTokens on it are in
    /// [`LgrMachine::peer_rtoken`].
    LinkUp {
        /// The link.
        link: u8,
    },
    /// Link `failed` is down; `to` survives: move every connection there (failover).
    LinkFailed {
        /// The failed link.
        failed: u8,
        /// The surviving link.
        to: u8,
    },
    /// The resources of link `link` (QP, its registrations) may be freed.
    LinkFree {
        /// The link.
        link: u8,
        /// Why.
        why: TermReason,
    },
    /// The group is over: reset every connection (unless [`TermReason::Idle`], when there
    /// are none) and free the links.
    Terminate(TermReason),
}

/// A request is already running (SMC-LG-15: configuration exchanges never overlap), or the
/// call does not fit the role or the group's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an LLC exchange is already running")]
pub struct Busy;

/// Counters for `smc stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LgrCounters {
    /// LLC messages sent.
    pub llc_sent: u64,
    /// LLC messages received.
    pub llc_received: u64,
    /// TEST LINK requests sent.
    pub test_links: u64,
    /// Unknown optional LLC messages discarded.
    pub discarded: u64,
    /// Links added (confirmed after ADD LINK).
    pub links_added: u64,
    /// Links lost with a survivor (failovers).
    pub failovers: u64,
}

/// Where an ADD LINK exchange is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddStep {
    /// Server: ADD LINK sent, waiting for the reply.
    SrvWaitReply,
    /// Server: a continuation sent, waiting for the client's.
    SrvWaitCont,
    /// Server: CONFIRM LINK sent on the new link.
    SrvWaitConfirm,
    /// Client: the engine is asked ([`LgrAction::AddLinkRequest`]).
    CliDeciding,
    /// Client: reply sent, waiting for (more) continuations.
    CliWaitCont,
    /// Client: all continuations done, waiting for CONFIRM LINK on the new link.
    CliWaitConfirm,
}

#[derive(Debug, Clone)]
struct Adding {
    link: u8,
    carrier: u8,
    step: AddStep,
    since: Instant,
    ours: LinkAddr,
    /// Our RToken pairs still to send.
    our_pairs: VecDeque<RtokenPair>,
    /// NumRTokens we announced in our first continuation (None = none sent yet).
    our_total_sent: bool,
    /// The peer's next NumRTokens (None before its first continuation).
    peer_left: Option<u8>,
}

/// The peer's RMBs: per RMB, its RToken on each link.
#[derive(Debug, Clone, Default)]
struct PeerRmb {
    tokens: BTreeMap<u8, (u32, u64)>,
}

/// The link-group machine.
#[derive(Debug)]
pub struct LgrMachine {
    cfg: LgrConfig,
    terminated: Option<TermReason>,
    conns: usize,
    last_rx: Instant,
    test_out: Option<([u8; 16], Instant, u8)>,
    test_seq: u64,
    rkey_out: Option<(u32, Instant)>,
    linger_at: Option<Instant>,
    /// Active (confirmed) links.
    links: Vec<u8>,
    adding: Option<Adding>,
    /// Server: DELETE LINK of this link sent, waiting for the client's reply.
    deleting: Option<(u8, Instant, TermReason)>,
    /// Client: a link we dropped and notified; the server's DELETE LINK for it is answered.
    recently_deleted: Option<u8>,
    next_link: u8,
    add_due_at: Option<Instant>,
    peer_rmbs: Vec<PeerRmb>,
    out: VecDeque<LgrAction>,
    counters: LgrCounters,
}

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

    fn send_on(&mut self, link: u8, mut m: LlcMessage) {
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

    fn terminate(&mut self, why: TermReason, tell_peer: bool) {
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

    fn protocol_error(&mut self, what: String) {
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

    fn exchange_running(&self) -> bool {
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

    /// Server: starts adding a link (A4.2 step 12): `ours` is the new QP (in INIT) on the
    /// alternate device, `pairs` every RMB of ours as (RKey on the carrying link, RKey and
    /// VA on the new link). Returns the new link's number.
    pub fn srv_add_link(&mut self, ours: LinkAddr, pairs: Vec<RtokenPair>, now: Instant) -> Result<u8, Busy> {
        if self.cfg.role != Role::Server
            || self.terminated.is_some()
            || self.exchange_running()
            || self.links.len() >= usize::from(self.cfg.max_links)
            || pairs.len() > 255
        {
            return Err(Busy);
        }
        let Some(carrier) = self.primary() else {
            return Err(Busy);
        };
        // SMC-LG-8: numbers unique in the group, not reused until the space wraps.
        let mut n = self.next_link;
        while n == 0 || self.links.contains(&n) {
            n = n.wrapping_add(1);
        }
        self.next_link = n.wrapping_add(1);
        self.add_due_at = None;
        self.adding = Some(Adding {
            link: n,
            carrier,
            step: AddStep::SrvWaitReply,
            since: now,
            ours,
            our_pairs: pairs.into(),
            our_total_sent: false,
            peer_left: None,
        });
        self.send_on(
            carrier,
            LlcMessage::request(LlcBody::AddLink(AddLink {
                mac: ours.mac,
                gid: ours.gid,
                qpn: ours.qpn,
                link_num: n,
                qp_mtu: ours.qp_mtu,
                psn: ours.psn,
                ..AddLink::default()
            })),
        );
        Ok(n)
    }

    /// Client: accept the server's new link with our QP `ours` (in RTR towards the
    /// server's) and our RMBs' RToken pairs (reference on the carrying link, new link).
    pub fn cli_add_link_accept(&mut self, ours: LinkAddr, pairs: Vec<RtokenPair>, now: Instant) -> Result<(), Busy> {
        let Some(a) = self.adding.as_mut() else {
            return Err(Busy);
        };
        if a.step != AddStep::CliDeciding || pairs.len() > 255 {
            return Err(Busy);
        }
        a.ours = ours;
        a.our_pairs = pairs.into();
        a.step = AddStep::CliWaitCont;
        a.since = now;
        let (link, carrier) = (a.link, a.carrier);
        self.send_on(
            carrier,
            LlcMessage::request(LlcBody::AddLink(AddLink {
                mac: ours.mac,
                gid: ours.gid,
                qpn: ours.qpn,
                link_num: link,
                qp_mtu: ours.qp_mtu,
                psn: ours.psn,
                ..AddLink::default()
            }))
            .into_reply(),
        );
        Ok(())
    }

    /// Client: refuse the server's new link with `reason` ([`add_link_reject`]).
    pub fn cli_add_link_reject(&mut self, reason: u8) {
        let Some(a) = self.adding.take_if(|a| a.step == AddStep::CliDeciding) else {
            return;
        };
        self.send_on(
            a.carrier,
            LlcMessage::request(LlcBody::AddLink(AddLink {
                reject: true,
                reject_reason: reason,
                link_num: a.link,
                ..AddLink::default()
            }))
            .into_reply(),
        );
    }

    /// A link of the group failed locally (completion error, TEST LINK timeout, device
    /// down). With a survivor: failover ([`LgrAction::LinkFailed`]) and DELETE LINK; the
    /// last link: the group ends.
    pub fn link_failed(&mut self, link: u8, why: String, now: Instant) {
        if self.terminated.is_some() {
            return;
        }
        let why = TermReason::LinkError(why);
        if self.adding.as_ref().is_some_and(|a| a.link == link) {
            self.abort_add(why, now);
            return;
        }
        if !self.links.contains(&link) {
            return;
        }
        if self.adding.as_ref().is_some_and(|a| a.carrier == link) {
            // SMC-LG-20: the exchange it carried is not moved; the new link is dropped.
            if let Some(a) = self.adding.take() {
                self.out.push_back(LgrAction::LinkFree {
                    link: a.link,
                    why: why.clone(),
                });
            }
        }
        if self.links.len() == 1 {
            self.terminate(why, false);
            return;
        }
        self.lose_link(link, why, true, now);
    }

    /// Removes active link `link` (a survivor exists): failover, then the DELETE LINK
    /// exchange (`tell` = we detected it and notify the peer).
    fn lose_link(&mut self, link: u8, why: TermReason, tell: bool, now: Instant) {
        self.links.retain(|l| *l != link);
        let Some(to) = self.primary() else { return };
        self.counters.failovers += 1;
        if self.test_out.is_some_and(|t| t.2 == link) {
            self.test_out = None;
        }
        self.out.push_back(LgrAction::LinkFailed { failed: link, to });
        let reason = match &why {
            TermReason::PeerDeleted(r) => *r,
            _ => delete_reason::LOST_PATH,
        };
        let d = DeleteLink {
            all: false,
            orderly: false,
            link_num: link,
            reason,
        };
        match self.cfg.role {
            Role::Server => {
                if tell || !matches!(why, TermReason::PeerDeleted(_)) {
                    self.send_on(to, LlcMessage::request(LlcBody::DeleteLink(d)));
                }
                // SMC-LG-10: resources kept until the client's reply.
                if self.deleting.is_none() {
                    self.deleting = Some((link, now, why));
                } else {
                    self.out.push_back(LgrAction::LinkFree { link, why });
                }
                self.schedule_add(now);
            }
            Role::Client => {
                if tell {
                    // SMC-LG-11: the client's notification; the server runs the deletion.
                    self.send_on(to, LlcMessage::request(LlcBody::DeleteLink(d)));
                    self.recently_deleted = Some(link);
                }
                self.out.push_back(LgrAction::LinkFree { link, why });
            }
        }
    }

    fn schedule_add(&mut self, now: Instant) {
        if self.cfg.role == Role::Server
            && let Some(r) = self.cfg.add_link_retry
            && self.cfg.max_links > 1
        {
            self.add_due_at = Some(now + r);
        }
    }

    /// An ADD LINK exchange ends without a link: the new link is freed; if it never became
    /// known to the peer as active, the server deletes it over the carrier (SMC-TMO-9).
    fn abort_add(&mut self, why: TermReason, now: Instant) {
        let Some(a) = self.adding.take() else { return };
        let past_reply = matches!(a.step, AddStep::SrvWaitCont | AddStep::SrvWaitConfirm)
            || matches!(a.step, AddStep::CliWaitCont | AddStep::CliWaitConfirm);
        if past_reply && self.links.contains(&a.carrier) {
            self.send_on(
                a.carrier,
                LlcMessage::request(LlcBody::DeleteLink(DeleteLink {
                    all: false,
                    orderly: false,
                    link_num: a.link,
                    reason: delete_reason::LOST_PATH,
                })),
            );
            if self.cfg.role == Role::Client {
                self.recently_deleted = Some(a.link);
            }
        }
        self.out.push_back(LgrAction::LinkFree { link: a.link, why });
        self.schedule_add(now);
    }

    /// Timers: TEST LINK keepalive and its timeout, the CONFIRM RKEY wait, the steps of ADD
    /// LINK and DELETE LINK, the ADD LINK retry, the linger time.
    pub fn on_tick(&mut self, now: Instant) {
        if self.terminated.is_some() {
            return;
        }
        if let Some((_, t)) = self.rkey_out
            && now >= t + self.cfg.llc_wait
        {
            self.terminate(TermReason::LlcTimeout("CONFIRM RKEY"), true);
            return;
        }
        if let Some(a) = &self.adding
            && now >= a.since + self.cfg.llc_wait
        {
            let (step, carrier) = (a.step, a.carrier);
            match step {
                AddStep::SrvWaitConfirm | AddStep::CliWaitConfirm => {
                    // SMC-TMO-8/9: the new link is deleted, the carrier goes on.
                    self.abort_add(TermReason::LlcTimeout("CONFIRM LINK"), now);
                }
                AddStep::CliDeciding => self.cli_add_link_reject(add_link_reject::NO_ALTERNATE_PATH),
                _ => {
                    // SMC-TMO-6/7/10: free the new link; the carrier counts as failed.
                    let what = if step == AddStep::SrvWaitReply {
                        "ADD LINK"
                    } else {
                        "ADD LINK CONTINUATION"
                    };
                    self.abort_add(TermReason::LlcTimeout(what), now);
                    if self.links.len() == 1 {
                        self.terminate(TermReason::LlcTimeout(what), true);
                        return;
                    }
                    self.lose_link(carrier, TermReason::LlcTimeout(what), true, now);
                }
            }
        }
        if let Some((link, t, _)) = self.deleting
            && now >= t + self.cfg.llc_wait
            && let Some((_, _, why)) = self.deleting.take()
        {
            self.out.push_back(LgrAction::LinkFree { link, why });
        }
        match self.test_out {
            Some((_, t, link)) if now >= t + self.cfg.llc_wait => {
                self.test_out = None;
                if self.links.len() > 1 {
                    self.last_rx = now;
                    self.link_failed(link, "TEST LINK not answered in time".into(), now);
                } else {
                    self.terminate(TermReason::LlcTimeout("TEST LINK"), true);
                    return;
                }
            }
            None if now >= self.last_rx + self.cfg.keepalive => {
                self.test_seq += 1;
                let mut ud = [0u8; 16];
                ud[..8].copy_from_slice(b"softrdma");
                ud[8..].copy_from_slice(&self.test_seq.to_be_bytes());
                if let Some(p) = self.primary() {
                    self.test_out = Some((ud, now, p));
                    self.counters.test_links += 1;
                    self.send_on(p, LlcMessage::request(LlcBody::TestLink(TestLink { user_data: ud })));
                }
            }
            _ => {}
        }
        if let Some(t) = self.add_due_at
            && now >= t
        {
            self.add_due_at = None;
            if self.links.len() < usize::from(self.cfg.max_links) && self.adding.is_none() {
                self.out.push_back(LgrAction::AddLinkDue);
                // Asked again later unless an exchange starts (srv_add_link clears it).
                self.schedule_add(now);
            }
        }
        if self.conns == 0
            && let Some(t) = self.linger_at
            && now >= t
        {
            self.terminate(TermReason::Idle, true);
        }
    }

    /// An LLC message (a received SEND that is not a CDC) arrived on the primary link.
    pub fn on_llc(&mut self, bytes: &[u8], now: Instant) {
        let link = self.primary().unwrap_or(self.cfg.link_num);
        self.on_llc_on(link, bytes, now);
    }

    /// An LLC message arrived on link `link`.
    pub fn on_llc_on(&mut self, link: u8, bytes: &[u8], now: Instant) {
        if self.terminated.is_some() {
            return;
        }
        self.last_rx = now;
        self.counters.llc_received += 1;
        let m = match LlcMessage::parse(bytes) {
            Ok(m) => m,
            Err(LlcError::UnknownOptional(op)) => {
                // SMC-LG-19: optional class, discard silently.
                tracing::debug!(op, "unknown optional LLC discarded");
                self.counters.discarded += 1;
                return;
            }
            Err(e) => return self.protocol_error(e.to_string()),
        };
        if m.version != self.cfg.version {
            return self.protocol_error(format!(
                "{:?} LLC {:#04x} on a {:?} link group",
                m.version,
                m.body.opcode(),
                self.cfg.version
            ));
        }
        let server = self.cfg.role == Role::Server;
        let new_link = self.adding.as_ref().map(|a| a.link);
        if Some(link) != new_link && !self.links.contains(&link) {
            // A message on a link that is gone: stale, dropped.
            return;
        }
        match (m.body, m.reply) {
            (LlcBody::ConfirmLink(_), _) if self.cfg.version == LlcVersion::V2 && Some(link) != new_link => {
                // Linux drops a CONFIRM LINK outside its flow (request or reply); so do we in
                // a v2 group: a v2 server may repeat its first-contact request (engine). (v2
                // groups have one link: the engine never adds a second, see `Group::new`.)
                tracing::debug!("out-of-flow CONFIRM LINK in a v2 group, dropped");
                self.counters.discarded += 1;
            }
            (LlcBody::TestLink(t), false) => {
                // SMC-KA-2: answer at once, same user data, on the same link.
                self.send_on(link, LlcMessage::request(LlcBody::TestLink(t)).into_reply());
            }
            (LlcBody::TestLink(t), true) => match self.test_out {
                Some((ud, _, _)) if ud == t.user_data => self.test_out = None,
                Some(_) => self.protocol_error("TEST LINK reply with other user data".into()),
                None => self.protocol_error("TEST LINK reply without a request".into()),
            },
            (LlcBody::DeleteLink(d), reply) => self.on_delete_link(link, d, reply, now),
            (LlcBody::ConfirmRkey(c), false) => {
                if self.adding.is_some() || self.deleting.is_some() {
                    // SMC-LG-16/17: negative, with C: the peer redoes it afterwards.
                    let rep = ConfirmRkey {
                        negative: true,
                        retry: true,
                        ..c
                    };
                    self.send_on(link, LlcMessage::request(LlcBody::ConfirmRkey(rep)).into_reply());
                    return;
                }
                // The peer added an RMB: its RToken on this link and the others it names.
                let mut r = PeerRmb::default();
                r.tokens.insert(link, (c.rkey, c.vaddr));
                for o in &c.others {
                    if self.links.contains(&o.link_num) {
                        r.tokens.insert(o.link_num, (o.rkey, o.vaddr));
                    }
                }
                self.peer_rmbs
                    .retain(|p| p.tokens.get(&link).is_none_or(|t| t.0 != c.rkey));
                self.peer_rmbs.push(r);
                let rep = ConfirmRkey {
                    negative: false,
                    others: Vec::new(),
                    num_tkns: 0,
                    ..c
                };
                self.send_on(link, LlcMessage::request(LlcBody::ConfirmRkey(rep)).into_reply());
            }
            (LlcBody::ConfirmRkey(c), true) => match self.rkey_out {
                Some((rkey, _)) if rkey == c.rkey => {
                    self.rkey_out = None;
                    self.out.push_back(LgrAction::RkeyConfirmed { rkey, ok: !c.negative });
                }
                _ => self.protocol_error("CONFIRM RKEY reply without a request".into()),
            },
            (LlcBody::DeleteRkey(d), false) => {
                // SMC-INV-9: unknown RKeys → negative reply with their bits in the mask (v1)
                // or their number (Linux's v2 `num_inval_rkeys`).
                let mut mask = 0u8;
                for (i, k) in d.rkeys.iter().enumerate() {
                    let before = self.peer_rmbs.len();
                    self.peer_rmbs.retain(|p| p.tokens.get(&link).is_none_or(|t| t.0 != *k));
                    if self.peer_rmbs.len() == before {
                        mask = match self.cfg.version {
                            LlcVersion::V1 => mask | 0x80u8.checked_shr(i as u32).unwrap_or(0),
                            LlcVersion::V2 => mask.saturating_add(1),
                        };
                    }
                }
                // Linux's v2 reply zeroes the RKey list and keeps its count (lab capture
                // frames 80 → 84).
                let rkeys = match self.cfg.version {
                    LlcVersion::V1 => d.rkeys,
                    LlcVersion::V2 => vec![0; d.rkeys.len()],
                };
                let rep = DeleteRkey {
                    negative: mask != 0,
                    err_mask: mask,
                    rkeys,
                };
                self.send_on(link, LlcMessage::request(LlcBody::DeleteRkey(rep)).into_reply());
            }
            (LlcBody::AddLink(a), false) if !server => self.cli_on_add_link(link, a, now),
            (LlcBody::AddLink(a), true) if server => self.srv_on_add_link_reply(link, a, now),
            (LlcBody::AddLink(_), false) => {
                // A client's ADD LINK notification: ignored at the maximum or while an
                // exchange runs (SMC-LG-9, SMC-LG-16); otherwise an ADD LINK is due.
                if self.links.len() < usize::from(self.cfg.max_links)
                    && !self.exchange_running()
                    && self.cfg.add_link_retry.is_some()
                {
                    self.add_due_at = Some(now);
                }
            }
            (LlcBody::AddLinkCont(c), reply) if reply == server => self.on_add_link_cont(link, c, now),
            (LlcBody::ConfirmLink(c), reply) if Some(link) == new_link && reply == server => {
                self.on_new_link_confirm(link, c, now)
            }
            (body, reply) => self.protocol_error(format!(
                "unexpected LLC {:#04x}{} on an established link",
                body.opcode(),
                if reply { " reply" } else { "" }
            )),
        }
    }

    fn on_delete_link(&mut self, link: u8, d: DeleteLink, reply: bool, now: Instant) {
        let server = self.cfg.role == Role::Server;
        if d.all {
            // SMC-TMO-14 / SMC-LG-12: the whole group, at once, no reply.
            self.terminate(TermReason::PeerDeleted(d.reason), false);
            return;
        }
        let n = d.link_num;
        let why = TermReason::PeerDeleted(d.reason);
        if reply {
            // Server: the client's answer to our DELETE LINK.
            if server && let Some((l, _, w)) = self.deleting.take_if(|x| x.0 == n) {
                self.out.push_back(LgrAction::LinkFree { link: l, why: w });
            }
            return;
        }
        if self.adding.as_ref().is_some_and(|a| a.link == n) {
            // The link being added is deleted by the peer (its CONFIRM LINK timed out).
            if !server {
                self.send_on(link, LlcMessage::request(LlcBody::DeleteLink(d)).into_reply());
            }
            self.abort_add_quiet(why, now);
            return;
        }
        if self.links.contains(&n) {
            if self.links.len() == 1 {
                if !server {
                    // SMC-LG-10: the client must reply positively.
                    self.send_on(link, LlcMessage::request(LlcBody::DeleteLink(d)).into_reply());
                }
                // Our only link: nothing left (A4.7 step 9).
                self.terminate(why, server);
                return;
            }
            if server {
                // SMC-LG-11: the client's notification; run our own deletion.
                self.lose_link(n, TermReason::LinkError("deleted by the client".into()), true, now);
            } else {
                let to = self.links.iter().copied().find(|l| *l != n).unwrap_or(link);
                self.send_on(to, LlcMessage::request(LlcBody::DeleteLink(d)).into_reply());
                self.lose_link(n, why, false, now);
            }
            return;
        }
        if !server && self.recently_deleted == Some(n) {
            // The server's deletion of a link we already dropped and notified.
            self.recently_deleted = None;
            self.send_on(link, LlcMessage::request(LlcBody::DeleteLink(d)).into_reply());
            return;
        }
        // SMC-INV-6/7 (E-10): "no link".
        self.send_on(
            link,
            LlcMessage::request(LlcBody::DeleteLink(DeleteLink {
                reason: delete_reason::NO_LINK,
                ..d
            }))
            .into_reply(),
        );
    }

    fn abort_add_quiet(&mut self, why: TermReason, now: Instant) {
        if let Some(a) = self.adding.take() {
            self.out.push_back(LgrAction::LinkFree { link: a.link, why });
            self.schedule_add(now);
        }
    }

    fn cli_on_add_link(&mut self, link: u8, a: AddLink, now: Instant) {
        let reject = |m: &mut Self, reason: u8| {
            let mut r = a.clone();
            r.reject = true;
            // The v2 form has no room for a reason (Linux's v2 reject, lab capture frame 17,
            // is flags 0xC0 with the reason nibble 0), and only the first 44 octets of the
            // request are echoed, as Linux does.
            r.reject_reason = match m.cfg.version {
                LlcVersion::V1 => reason,
                LlcVersion::V2 => 0,
            };
            r.v2_ext = None;
            m.send_on(link, LlcMessage::request(LlcBody::AddLink(r)).into_reply());
        };
        if self.cfg.max_links <= 1 || self.links.len() >= usize::from(self.cfg.max_links) {
            // SMC-FC-9: one RNIC here → reject, reason 1 "no alternate path".
            return reject(self, add_link_reject::NO_ALTERNATE_PATH);
        }
        if !(1..=5).contains(&(a.qp_mtu & 0x0F)) {
            // SMC-INV-2: undefined MTU → negative reply, reason 2.
            return reject(self, add_link_reject::INVALID_MTU);
        }
        if a.link_num == 0 || self.links.contains(&a.link_num) {
            return self.protocol_error(format!("ADD LINK for link {} already in use", a.link_num));
        }
        if self.exchange_running() {
            return self.protocol_error("ADD LINK while another exchange runs".into());
        }
        self.recently_deleted = None;
        self.adding = Some(Adding {
            link: a.link_num,
            carrier: link,
            step: AddStep::CliDeciding,
            since: now,
            ours: LinkAddr::default(),
            our_pairs: VecDeque::new(),
            our_total_sent: false,
            peer_left: None,
        });
        self.out.push_back(LgrAction::AddLinkRequest {
            link: a.link_num,
            peer: a,
        });
    }

    fn srv_on_add_link_reply(&mut self, link: u8, a: AddLink, now: Instant) {
        let ok = self
            .adding
            .as_ref()
            .is_some_and(|x| x.step == AddStep::SrvWaitReply && x.link == a.link_num && x.carrier == link);
        if !ok {
            return self.protocol_error("ADD LINK reply without a request".into());
        }
        if a.reject {
            // SMC-FC-9 / SMC-LG-13: no second link now; retried later.
            self.abort_add_quiet(TermReason::AddRejected(a.reject_reason), now);
            return;
        }
        if !(1..=5).contains(&(a.qp_mtu & 0x0F)) {
            return self.protocol_error(format!("ADD LINK reply with MTU enum {}", a.qp_mtu));
        }
        let n = a.link_num;
        self.out.push_back(LgrAction::AddLinkPeer { link: n, peer: a });
        if let Some(x) = self.adding.as_mut() {
            x.step = AddStep::SrvWaitCont;
            x.since = now;
        }
        self.send_our_cont(now);
    }

    /// Sends our next ADD LINK CONTINUATION (two pairs at most; NumRTokens = what is left
    /// including this message; an empty one when we owe nothing more).
    fn send_our_cont(&mut self, now: Instant) {
        let server = self.cfg.role == Role::Server;
        let Some(a) = self.adding.as_mut() else { return };
        let left = a.our_pairs.len() as u8;
        let pairs: Vec<RtokenPair> = (0..left.min(2)).filter_map(|_| a.our_pairs.pop_front()).collect();
        a.our_total_sent = true;
        a.since = now;
        let (link, carrier) = (a.link, a.carrier);
        let mut m = LlcMessage::request(LlcBody::AddLinkCont(AddLinkCont {
            link_num: link,
            num_rtokens: left,
            pairs,
        }));
        m.reply = !server;
        self.send_on(carrier, m);
    }

    fn on_add_link_cont(&mut self, link: u8, c: AddLinkCont, now: Instant) {
        let server = self.cfg.role == Role::Server;
        let Some(a) = self.adding.as_ref() else {
            return self.protocol_error("ADD LINK CONTINUATION outside an ADD LINK exchange".into());
        };
        let want = if server {
            AddStep::SrvWaitCont
        } else {
            AddStep::CliWaitCont
        };
        if a.step != want || a.link != c.link_num || a.carrier != link {
            return self.protocol_error("ADD LINK CONTINUATION out of sequence".into());
        }
        // SMC-INV-5: the count must match and count down.
        if c.pairs.len() != usize::from(c.num_rtokens.min(2)) || a.peer_left.is_some_and(|l| l != c.num_rtokens) {
            return self.protocol_error(format!(
                "ADD LINK CONTINUATION with NumRTokens {} and {} pairs (expected {:?})",
                c.num_rtokens,
                c.pairs.len(),
                a.peer_left
            ));
        }
        // A2.15: every reference RKey names an RMB the peer has on the carrying link.
        let carrier = a.carrier;
        let new = a.link;
        for p in &c.pairs {
            let Some(r) = self
                .peer_rmbs
                .iter_mut()
                .find(|r| r.tokens.get(&carrier).is_some_and(|t| t.0 == p.ref_rkey))
            else {
                return self.protocol_error(format!("ADD LINK CONTINUATION names unknown RKey {:#x}", p.ref_rkey));
            };
            r.tokens.insert(new, (p.new_rkey, p.new_vaddr));
        }
        let peer_left = c.num_rtokens - c.pairs.len() as u8;
        let Some(a) = self.adding.as_mut() else { return };
        a.peer_left = Some(peer_left);
        a.since = now;
        if server {
            if a.our_pairs.is_empty() && peer_left == 0 {
                // Both sides done (SMC-RMB-6): CONFIRM LINK on the new link.
                a.step = AddStep::SrvWaitConfirm;
                let ours = a.ours;
                let n = a.link;
                let cl = self.our_confirm_link(n, ours);
                self.send_on(n, LlcMessage::request(LlcBody::ConfirmLink(cl)));
            } else {
                self.send_our_cont(now);
            }
        } else {
            self.send_our_cont(now);
            if let Some(a) = self.adding.as_mut()
                && a.our_pairs.is_empty()
                && peer_left == 0
            {
                a.step = AddStep::CliWaitConfirm;
            }
        }
    }

    fn our_confirm_link(&self, link: u8, ours: LinkAddr) -> ConfirmLink {
        ConfirmLink {
            flags: crate::wire::llc::CONFIRM_LINK_NO_RMBE_EYECATCHER,
            mac: ours.mac,
            gid: ours.gid,
            qpn: ours.qpn,
            link_num: link,
            link_uid: ours.link_uid,
            max_links: self.cfg.max_links,
            max_conns: 255,
        }
    }

    fn on_new_link_confirm(&mut self, link: u8, c: ConfirmLink, now: Instant) {
        let server = self.cfg.role == Role::Server;
        let Some(a) = self.adding.as_ref() else { return };
        let want = if server {
            AddStep::SrvWaitConfirm
        } else {
            AddStep::CliWaitConfirm
        };
        if a.step != want || c.link_num != link {
            return self.protocol_error("CONFIRM LINK out of sequence on the new link".into());
        }
        let ours = a.ours;
        if !server {
            let cl = self.our_confirm_link(link, ours);
            self.send_on(link, LlcMessage::request(LlcBody::ConfirmLink(cl)).into_reply());
        }
        self.adding = None;
        self.links.push(link);
        self.links.sort_unstable();
        self.counters.links_added += 1;
        self.out.push_back(LgrAction::LinkUp { link });
        if self.links.len() < usize::from(self.cfg.max_links) {
            self.schedule_add(now);
        }
    }
}

#[cfg(test)]
mod links_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::llc::{AddLink, ConfirmLink};

    fn t0() -> Instant {
        Instant::now()
    }

    fn llc(body: LlcBody, reply: bool) -> [u8; LLC_LEN] {
        let mut m = LlcMessage::request(body);
        m.reply = reply;
        let mut b = [0u8; LLC_LEN];
        m.emit(&mut b).unwrap();
        b
    }

    fn sent(m: &mut LgrMachine) -> Vec<LlcMessage> {
        let mut v = Vec::new();
        while let Some(a) = m.poll_action() {
            if let LgrAction::SendLlc { msg: b, .. } = a {
                v.push(LlcMessage::parse(&b).unwrap());
            }
        }
        v
    }

    fn terminated(m: &mut LgrMachine) -> Option<TermReason> {
        let mut t = None;
        while let Some(a) = m.poll_action() {
            if let LgrAction::Terminate(r) = a {
                t = Some(r);
            }
        }
        t
    }

    fn machine(role: Role, now: Instant) -> LgrMachine {
        let mut m = LgrMachine::new(LgrConfig::new(role), now);
        m.conn_added();
        m
    }

    /// SMC-KA-2: a TEST LINK request is answered with R and the same user data.
    #[test]
    fn test_link_request_is_echoed() {
        let now = t0();
        let mut m = machine(Role::Client, now);
        let ud = [7u8; 16];
        m.on_llc(&llc(LlcBody::TestLink(TestLink { user_data: ud }), false), now);
        let out = sent(&mut m);
        assert_eq!(out.len(), 1);
        assert!(out[0].reply);
        assert_eq!(out[0].body, LlcBody::TestLink(TestLink { user_data: ud }));
        assert!(m.terminated().is_none());
    }

    /// SMC-KA-1: TEST LINK after the keepalive time of silence, not before; traffic
    /// postpones it; a matching reply keeps the link; no reply within the LLC wait = link
    /// failed (SMC-TMO-16), DELETE LINK A sent.
    #[test]
    fn keepalive_probe_and_timeout() {
        let now = t0();
        let mut m = machine(Role::Server, now);
        m.on_tick(now + KEEPALIVE - Duration::from_millis(1));
        assert!(sent(&mut m).is_empty());
        m.on_rx(now + Duration::from_secs(10)); // busy link: no probe at 30 s
        m.on_tick(now + KEEPALIVE);
        assert!(sent(&mut m).is_empty());
        let t1 = now + Duration::from_secs(40);
        m.on_tick(t1);
        let out = sent(&mut m);
        let LlcBody::TestLink(TestLink { user_data }) = out[0].body else {
            panic!("{out:?}")
        };
        assert!(!out[0].reply);
        assert_eq!(m.counters().test_links, 1);
        m.on_llc(
            &llc(LlcBody::TestLink(TestLink { user_data }), true),
            t1 + Duration::from_millis(5),
        );
        assert!(m.terminated().is_none());
        // Next probe, unanswered.
        let t2 = t1 + KEEPALIVE + Duration::from_secs(1);
        m.on_tick(t2);
        assert_eq!(sent(&mut m).len(), 1);
        m.on_tick(t2 + LLC_WAIT - Duration::from_millis(1));
        assert!(m.terminated().is_none());
        m.on_tick(t2 + LLC_WAIT);
        assert_eq!(m.terminated(), Some(&TermReason::LlcTimeout("TEST LINK")));
        let out: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
        assert!(matches!(out.last(), Some(LgrAction::Terminate(_))));
        let LgrAction::SendLlc { msg: b, .. } = &out[0] else {
            panic!()
        };
        let d = LlcMessage::parse(b).unwrap();
        assert!(matches!(d.body, LlcBody::DeleteLink(DeleteLink { all: true, .. })));
    }

    /// SMC-INV-10: a TEST LINK reply with other user data → link down.
    #[test]
    fn test_link_reply_mismatch_is_protocol_error() {
        let now = t0();
        let mut m = machine(Role::Client, now);
        m.on_tick(now + KEEPALIVE);
        sent(&mut m);
        m.on_llc(
            &llc(LlcBody::TestLink(TestLink { user_data: [9; 16] }), true),
            now + KEEPALIVE,
        );
        assert!(matches!(terminated(&mut m), Some(TermReason::ProtocolError(_))));
    }

    /// SMC-LG-19: opcodes 0x00 / 0x3F / 0x40 / 0x05 (v1) → protocol error; 0x80 / 0xBF →
    /// discarded, link stays.
    #[test]
    fn unknown_opcodes_by_class() {
        for op in [0x80u8, 0xBF] {
            let now = t0();
            let mut m = machine(Role::Server, now);
            let mut b = [0u8; LLC_LEN];
            b[0] = op;
            b[1] = 44;
            m.on_llc(&b, now);
            assert!(m.terminated().is_none(), "{op:#x}");
            assert_eq!(m.counters().discarded, 1);
        }
        for op in [0x00u8, 0x05, 0x3F, 0x40, 0x7F, 0xC0] {
            let now = t0();
            let mut m = machine(Role::Server, now);
            let mut b = [0u8; LLC_LEN];
            b[0] = op;
            b[1] = 44;
            m.on_llc(&b, now);
            assert!(matches!(m.terminated(), Some(TermReason::ProtocolError(_))), "{op:#x}");
        }
        // Wrong length field on a known opcode.
        let now = t0();
        let mut m = machine(Role::Client, now);
        let mut b = llc(LlcBody::TestLink(TestLink::default()), false);
        b[1] = 40;
        m.on_llc(&b, now);
        assert!(matches!(m.terminated(), Some(TermReason::ProtocolError(_))));
    }

    /// SMC-TMO-14 / SMC-LG-12: DELETE LINK with A tears the group down at once, no reply.
    /// DELETE LINK of our link: the client replies, then the group ends (last link).
    /// SMC-INV-6/7: DELETE LINK of an unknown link → reply "no link", group goes on.
    #[test]
    fn delete_link_variants() {
        let now = t0();
        let mut m = machine(Role::Client, now);
        let all = DeleteLink {
            all: true,
            orderly: false,
            link_num: 0,
            reason: delete_reason::PROGRAM,
        };
        m.on_llc(&llc(LlcBody::DeleteLink(all), false), now);
        let acts: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
        assert_eq!(
            acts,
            vec![LgrAction::Terminate(TermReason::PeerDeleted(delete_reason::PROGRAM))]
        );

        let mut m = machine(Role::Client, now);
        let one = DeleteLink {
            all: false,
            orderly: false,
            link_num: 1,
            reason: delete_reason::LOST_PATH,
        };
        m.on_llc(&llc(LlcBody::DeleteLink(one), false), now);
        let out = sent(&mut m);
        assert_eq!(out.len(), 1);
        assert!(out[0].reply);
        assert_eq!(out[0].body, LlcBody::DeleteLink(one));
        assert!(m.terminated().is_some());

        let mut m = machine(Role::Server, now);
        let other = DeleteLink { link_num: 9, ..one };
        m.on_llc(&llc(LlcBody::DeleteLink(other), false), now);
        let out = sent(&mut m);
        assert!(out[0].reply);
        assert_eq!(
            out[0].body,
            LlcBody::DeleteLink(DeleteLink {
                reason: delete_reason::NO_LINK,
                ..other
            })
        );
        assert!(m.terminated().is_none());
    }

    /// SMC-FC-9: one RNIC on the client → ADD LINK rejected with Z, reason 1.
    #[test]
    fn add_link_rejected_no_alternate_path() {
        let now = t0();
        let mut m = machine(Role::Client, now);
        let a = AddLink {
            qpn: 0x123,
            link_num: 2,
            qp_mtu: 3,
            ..AddLink::default()
        };
        m.on_llc(&llc(LlcBody::AddLink(a.clone()), false), now);
        let out = sent(&mut m);
        assert!(out[0].reply);
        let LlcBody::AddLink(r) = &out[0].body else { panic!() };
        assert!(r.reject);
        assert_eq!(r.reject_reason, add_link_reject::NO_ALTERNATE_PATH);
        assert_eq!(r.link_num, 2);
        assert!(m.terminated().is_none());
    }

    /// CONFIRM RKEY both ways (A4.8), its timeout (SMC-TMO-16) and DELETE RKEY of an
    /// unknown RKey (SMC-INV-9).
    #[test]
    fn rkey_exchanges() {
        let now = t0();
        let mut m = machine(Role::Server, now);
        m.confirm_rkey(0x55, 0x1000, now).unwrap();
        assert_eq!(m.confirm_rkey(0x56, 0, now), Err(Busy));
        assert!(!m.usable());
        let out = sent(&mut m);
        let LlcBody::ConfirmRkey(c) = &out[0].body else {
            panic!()
        };
        assert_eq!((c.rkey, c.vaddr, c.num_tkns), (0x55, 0x1000, 0));
        m.on_llc(&llc(LlcBody::ConfirmRkey(c.clone()), true), now);
        assert_eq!(m.poll_action(), Some(LgrAction::RkeyConfirmed { rkey: 0x55, ok: true }));
        assert!(m.usable());

        // Peer's CONFIRM RKEY → positive echo; DELETE RKEY of it plus an unknown one.
        m.on_llc(
            &llc(
                LlcBody::ConfirmRkey(ConfirmRkey {
                    rkey: 0x77,
                    vaddr: 0x2000,
                    ..ConfirmRkey::default()
                }),
                false,
            ),
            now,
        );
        let out = sent(&mut m);
        assert!(out[0].reply);
        assert_eq!(m.peer_rkeys().get(&0x77), Some(&0x2000));
        m.on_llc(
            &llc(
                LlcBody::DeleteRkey(DeleteRkey {
                    rkeys: vec![0x77, 0x99],
                    ..DeleteRkey::default()
                }),
                false,
            ),
            now,
        );
        let out = sent(&mut m);
        let LlcBody::DeleteRkey(d) = &out[0].body else { panic!() };
        assert!(out[0].reply && d.negative);
        assert_eq!(d.err_mask, 0x40);
        assert!(m.peer_rkeys().is_empty());

        // Unanswered CONFIRM RKEY.
        let mut m = machine(Role::Client, now);
        m.confirm_rkey(0x55, 0, now).unwrap();
        sent(&mut m);
        m.on_tick(now + LLC_WAIT);
        let acts: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
        assert!(acts.contains(&LgrAction::RkeyConfirmed { rkey: 0x55, ok: false }));
        assert!(matches!(
            acts.last(),
            Some(LgrAction::Terminate(TermReason::LlcTimeout(_)))
        ));
    }

    /// SMC-INV-11: out-of-sync messages on an established link → link down.
    #[test]
    fn out_of_sync_messages() {
        let bodies = [
            (LlcBody::ConfirmLink(ConfirmLink::default()), false),
            (LlcBody::ConfirmRkey(ConfirmRkey::default()), true),
            (LlcBody::AddLink(AddLink::default()), true),
        ];
        for (b, reply) in bodies {
            let now = t0();
            let mut m = machine(Role::Client, now);
            m.on_llc(&llc(b.clone(), reply), now);
            assert!(
                matches!(terminated(&mut m), Some(TermReason::ProtocolError(_))),
                "{b:?}"
            );
        }
    }

    /// A4.9: the last connection leaves → linger → DELETE LINK (A, 0x00030000) and the
    /// group ends; a new connection in time cancels it. The client waits 2 s longer.
    #[test]
    fn linger_then_idle_teardown() {
        let now = t0();
        let mut m = machine(Role::Server, now);
        m.conn_removed(now);
        assert!(m.lingering());
        m.on_rx(now + Duration::from_secs(9)); // keep keepalive quiet
        m.on_tick(now + Duration::from_secs(9));
        m.conn_added();
        m.on_tick(now + Duration::from_secs(11));
        assert!(m.terminated().is_none());
        m.conn_removed(now + Duration::from_secs(11));
        m.on_rx(now + Duration::from_secs(20));
        m.on_tick(now + Duration::from_secs(21));
        let out: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
        let LgrAction::SendLlc { msg: b, .. } = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(
            LlcMessage::parse(b).unwrap().body,
            LlcBody::DeleteLink(DeleteLink {
                all: true,
                orderly: false,
                link_num: 0,
                reason: delete_reason::PROGRAM
            })
        );
        assert_eq!(out.last(), Some(&LgrAction::Terminate(TermReason::Idle)));

        let mut c = LgrMachine::new(LgrConfig::new(Role::Client), now);
        c.on_rx(now + Duration::from_secs(10));
        c.on_tick(now + Duration::from_secs(10));
        assert!(c.terminated().is_none());
        c.on_tick(now + Duration::from_secs(12));
        assert_eq!(c.terminated(), Some(&TermReason::Idle));
    }

    /// Two machines wired in memory (server and client of one group): every LLC one sends is
    /// delivered to the other. Returns the actions other than SendLlc each side saw.
    fn pump(a: &mut LgrMachine, b: &mut LgrMachine, now: Instant) -> (Vec<LgrAction>, Vec<LgrAction>) {
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        loop {
            let mut moved = false;
            while let Some(x) = a.poll_action() {
                match x {
                    LgrAction::SendLlc { msg: m, .. } => {
                        b.on_llc(&m, now);
                        moved = true;
                    }
                    o => ea.push(o),
                }
            }
            while let Some(x) = b.poll_action() {
                match x {
                    LgrAction::SendLlc { msg: m, .. } => {
                        a.on_llc(&m, now);
                        moved = true;
                    }
                    o => eb.push(o),
                }
            }
            if !moved {
                return (ea, eb);
            }
        }
    }

    /// In memory, both ends: CONFIRM RKEY each way (A4.8), TEST LINK each way with the
    /// replies matching (SMC-KA-1/2), then the server's linger ends the group and its
    /// DELETE LINK (A) ends the client's at once (A4.9, SMC-TMO-14).
    #[test]
    fn server_and_client_machines_in_memory() {
        let now = t0();
        let mut s = machine(Role::Server, now);
        let mut c = machine(Role::Client, now);
        s.confirm_rkey(0x10, 0x1000, now).unwrap();
        c.confirm_rkey(0x20, 0x2000, now).unwrap();
        let (es, ec) = pump(&mut s, &mut c, now);
        assert_eq!(es, vec![LgrAction::RkeyConfirmed { rkey: 0x10, ok: true }]);
        assert_eq!(ec, vec![LgrAction::RkeyConfirmed { rkey: 0x20, ok: true }]);
        assert_eq!(c.peer_rkeys().get(&0x10), Some(&0x1000));
        assert_eq!(s.peer_rkeys().get(&0x20), Some(&0x2000));
        let t = now + KEEPALIVE;
        s.on_tick(t);
        c.on_tick(t);
        let (es, ec) = pump(&mut s, &mut c, t);
        assert!(es.is_empty() && ec.is_empty(), "{es:?} {ec:?}");
        assert_eq!((s.counters().test_links, c.counters().test_links), (1, 1));
        // Replies arrived: no timeout later.
        s.on_tick(t + LLC_WAIT);
        c.on_tick(t + LLC_WAIT);
        assert!(s.terminated().is_none() && c.terminated().is_none());
        // Last connections leave; the server lingers 10 s, the client 12 s.
        s.conn_removed(t);
        c.conn_removed(t);
        let t2 = t + Duration::from_secs(10);
        s.on_rx(t2);
        c.on_rx(t2);
        s.on_tick(t2);
        c.on_tick(t2);
        let (es, ec) = pump(&mut s, &mut c, t2);
        assert_eq!(es, vec![LgrAction::Terminate(TermReason::Idle)]);
        assert_eq!(
            ec,
            vec![LgrAction::Terminate(TermReason::PeerDeleted(delete_reason::PROGRAM))]
        );
    }

    /// Arbitrary input never panics and a terminated machine stays quiet.
    #[test]
    fn garbage_never_panics() {
        let now = t0();
        let mut seed = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut m = machine(Role::Server, now);
            let mut b = [0u8; LLC_LEN];
            for x in &mut b {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                *x = (seed >> 16) as u8;
            }
            b[1] = 44;
            m.on_llc(&b, now);
            let _ = std::iter::from_fn(|| m.poll_action()).count();
            if m.terminated().is_some() {
                m.on_llc(&b, now);
                m.on_tick(now + Duration::from_secs(100));
                assert_eq!(m.poll_action(), None);
            }
        }
    }

    fn v2_machine(role: Role, now: Instant) -> LgrMachine {
        let cfg = LgrConfig {
            version: LlcVersion::V2,
            ..LgrConfig::new(role)
        };
        let mut m = LgrMachine::new(cfg, now);
        m.conn_added();
        m
    }

    fn sent_raw(m: &mut LgrMachine) -> Vec<[u8; LLC_LEN]> {
        let mut v = Vec::new();
        while let Some(a) = m.poll_action() {
            if let LgrAction::SendLlc { msg, .. } = a {
                v.push(msg);
            }
        }
        v
    }

    /// C5, SMC-FC-9 in a v2 group, golden vector from Linux 6.12 (lab capture
    /// smc-r-2vm-612-br0.pcap): the server's 88-octet v2 ADD LINK (frame 15) is answered
    /// exactly as Linux's client did (frame 17): the first 44 octets echoed, length 44,
    /// flags reply|reject (0xC0), no reason nibble.
    #[test]
    fn v2_add_link_is_rejected_as_linux_does() {
        let now = t0();
        let mut m = v2_machine(Role::Client, now);
        let req = hex::decode(
            "22580000525400770002000000000000000000000000ffffc0a84d02000014020353f30e00000000000000008000\
             00000000000000000000ffffc0a84d0200000000000000000100000007ff000009d5ff25e247ff5b0000",
        )
        .unwrap();
        m.on_llc(&req, now);
        let out = sent_raw(&mut m);
        assert_eq!(out.len(), 1);
        assert_eq!(
            hex::encode(out[0]),
            "222c00c0525400770002000000000000000000000000ffffc0a84d02000014020353f30e0000000000000000"
        );
        assert!(m.terminated().is_none());
    }

    /// A v2 group stays at one link even when configured for two (SMCFAIL's second link is
    /// for v1 groups): no ADD LINK of ours is ever due, and the peer's ADD LINK gets the v2
    /// reject of `v2_add_link_is_rejected_as_linux_does`; the same config in a v1 group
    /// asks for the second link (SMC-FC-8).
    #[test]
    fn v2_group_keeps_one_link_when_configured_for_two() {
        let now = t0();
        for role in [Role::Server, Role::Client] {
            let cfg = LgrConfig {
                version: LlcVersion::V2,
                max_links: 2,
                add_link_retry: Some(Duration::from_secs(1)),
                ..LgrConfig::new(role)
            };
            let mut m = LgrMachine::new(cfg, now);
            m.conn_added();
            assert_eq!(m.config().max_links, 1);
            m.on_tick(now + Duration::from_secs(5));
            let mut acts = Vec::new();
            while let Some(a) = m.poll_action() {
                acts.push(a);
            }
            assert!(
                !acts.iter().any(|a| matches!(a, LgrAction::AddLinkDue)),
                "{role:?}: {acts:?}"
            );
        }
        let mut m = LgrMachine::new(
            LgrConfig {
                version: LlcVersion::V2,
                max_links: 2,
                ..LgrConfig::new(Role::Client)
            },
            now,
        );
        m.conn_added();
        let req = hex::decode(
            "22580000525400770002000000000000000000000000ffffc0a84d02000014020353f30e00000000000000008000\
             00000000000000000000ffffc0a84d0200000000000000000100000007ff000009d5ff25e247ff5b0000",
        )
        .unwrap();
        m.on_llc(&req, now);
        let out = sent_raw(&mut m);
        assert_eq!(out.len(), 1);
        assert_eq!(&out[0][..4], &[0x22, 0x2c, 0x00, 0xc0]);
        assert!(m.adding_link().is_none());
        let mut v1 = LgrMachine::new(
            LgrConfig {
                max_links: 2,
                add_link_retry: Some(Duration::from_secs(1)),
                ..LgrConfig::new(Role::Server)
            },
            now,
        );
        v1.conn_added();
        v1.on_tick(now);
        let mut due = false;
        while let Some(a) = v1.poll_action() {
            due |= matches!(a, LgrAction::AddLinkDue);
        }
        assert!(due, "a v1 server configured for two links asks for the second");
    }

    /// SMC-INV-9 in a v2 group, golden vectors from Linux 6.12 (lab capture frames 80 → 84):
    /// DELETE RKEY of an RMB whose RToken came by CLC is answered positively with Linux's
    /// octets (count kept, RKeys zeroed); an unknown RKey gives the negative reply with the
    /// number of invalid RKeys (v2), not a bit mask.
    #[test]
    fn v2_delete_rkey_replies_as_linux_does() {
        let now = t0();
        let mut m = v2_machine(Role::Server, now);
        m.peer_rmb_known(1, 0x0395, 0x1000);
        let req =
            hex::decode("292c000001000000000003950000000000000000000000000000000000000000000000000000000000000000")
                .unwrap();
        m.on_llc(&req, now);
        let out = sent_raw(&mut m);
        assert_eq!(
            hex::encode(out[0]),
            "292c008001000000000000000000000000000000000000000000000000000000000000000000000000000000"
        );
        m.on_llc(&req, now); // now unknown
        let out = sent_raw(&mut m);
        assert_eq!(&out[0][..6], &[0x29, 0x2c, 0x00, 0xa0, 0x01, 0x01]);
        assert!(m.terminated().is_none());
    }

    /// A v2 group answers TEST LINK in the v2 form; a v1 message in it is a protocol error
    /// (SMC-INV-11), as is a v2 one in a v1 group.
    #[test]
    fn llc_version_must_match_the_group() {
        let now = t0();
        let mut m = v2_machine(Role::Client, now);
        let mut t = LlcMessage::request(LlcBody::TestLink(TestLink { user_data: [5; 16] }));
        t.version = LlcVersion::V2;
        let mut b = [0u8; LLC_LEN];
        t.emit(&mut b).unwrap();
        m.on_llc(&b, now);
        let out = sent_raw(&mut m);
        assert_eq!(&out[0][..4], &[0x27, 0x2c, 0x00, 0x80]);
        m.on_llc(&llc(LlcBody::TestLink(TestLink { user_data: [5; 16] }), false), now);
        assert!(matches!(terminated(&mut m), Some(TermReason::ProtocolError(_))));
        let mut v1 = machine(Role::Client, now);
        v1.on_llc(&b, now);
        assert!(matches!(terminated(&mut v1), Some(TermReason::ProtocolError(_))));
    }

    /// A v2 group drops an out-of-flow CONFIRM LINK (request or reply) as Linux does; a v1
    /// group keeps treating it as a protocol error (SMC-INV-11).
    #[test]
    fn v2_out_of_flow_confirm_link_is_dropped() {
        let now = t0();
        let cl = || {
            LlcBody::ConfirmLink(ConfirmLink {
                flags: 3,
                mac: [2; 6],
                gid: [1; 16],
                qpn: 17,
                link_num: 1,
                link_uid: [0, 0, 0, 1],
                max_links: 1,
                max_conns: 255,
            })
        };
        for reply in [false, true] {
            let mut m = v2_machine(Role::Client, now);
            let mut c = LlcMessage::request(cl());
            c.version = LlcVersion::V2;
            c.reply = reply;
            let mut b = [0u8; LLC_LEN];
            c.emit(&mut b).unwrap();
            m.on_llc(&b, now);
            assert!(sent_raw(&mut m).is_empty());
            assert!(m.terminated().is_none());
            assert_eq!(m.counters().discarded, 1);
        }
        let mut v1 = machine(Role::Client, now);
        v1.on_llc(&llc(cl(), false), now);
        assert!(matches!(terminated(&mut v1), Some(TermReason::ProtocolError(_))));
    }
}
