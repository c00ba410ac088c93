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
use crate::wire::llc::{AddLink, LLC_LEN, LlcVersion, RtokenPair};
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

mod add_link;
mod failover;
mod machine;
mod rx;
mod timers;

#[cfg(test)]
mod links_tests;

#[cfg(test)]
mod tests;
