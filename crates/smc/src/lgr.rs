//! The sans-I/O link-group machine: what one SMC-R link group does with LLC messages and
//! timers (RFC 7609 §3.3, §3.5.4, §4.5.3, App. C.7; requirements A2.5, A2.6, A2.12, A4.9).
//!
//! The engine ([`crate::stream`]) feeds it the LLC messages received on the group's link
//! ([`LgrMachine::on_llc`]), the fact that anything arrived ([`LgrMachine::on_rx`]),
//! connections coming and going, a failed completion ([`LgrMachine::link_error`]) and the
//! clock ([`LgrMachine::on_tick`]); it answers with [`LgrAction`]s: LLC messages to post,
//! the outcome of our CONFIRM RKEY, and termination of the group.
//!
//! Scope (decided, and said in docs/smc.md): a group has **one link** (one RNIC per side per
//! group). So:
//! - an ADD LINK from the server is answered with Z, reason 1 "no alternate path"
//!   (SMC-FC-9, the 1+1 topology); a client's ADD LINK notification is ignored (at the
//!   maximum, SMC-LG-9);
//! - a link failure (completion error, TEST LINK timeout, protocol error) is the loss of the
//!   last link: every connection of the group is reset and the group freed (SMC-ABT-6,
//!   A4.7 step 9). Before freeing, DELETE LINK with A goes out as a courtesy (SMC-LG-12).
//!
//! Rows of A2.6 handled here: SMC-TMO-14 (DELETE LINK A → tear down), SMC-TMO-16 (CONFIRM
//! RKEY or TEST LINK unanswered within the LLC wait → link failed), SMC-INV-6/7 (DELETE LINK
//! for an unknown link → reply "no link" 0x00100000, E-10), SMC-INV-9 (DELETE RKEY for an
//! unknown RKey → negative reply with the error mask), SMC-INV-10 (TEST LINK reply with other
//! user data → link down), SMC-INV-11 (anything unambiguously wrong or out of sync: a
//! malformed message, an unknown mandatory opcode, a reply nobody asked for that cannot be
//! stale, a CONFIRM LINK on an established link → link down), SMC-LG-19 (unknown optional
//! opcode 0x80–0xBF → discarded). SMC-KA-1/2: TEST LINK as keepalive when nothing arrived for
//! the keepalive time; requests answered at once with the same user data.
//! A4.9: a group without connections lingers, then the server sends DELETE LINK (A, reason
//! 0x00030000) and both free it (the client waits a little longer, so the server decides).

use crate::stats::Role;
use crate::wire::llc::{
    ConfirmRkey, DeleteLink, DeleteRkey, LLC_LEN, LlcBody, LlcError, LlcMessage, LlcVersion, TestLink, add_link_reject,
    delete_reason,
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
    /// The number of the group's link.
    pub link_num: u8,
    /// Nothing received for this long → TEST LINK (SMC-KA-1).
    pub keepalive: Duration,
    /// An LLC request unanswered for this long → the link failed (SMC-TMO-16).
    pub llc_wait: Duration,
    /// A group without connections is torn down after this long (A4.9).
    pub linger: Duration,
    /// The group's LLC form: v1, or Linux's SMC-Rv2 form in a group set up by a v2 CLC
    /// exchange. Messages of the other version are protocol errors.
    pub version: LlcVersion,
}

impl LgrConfig {
    /// Defaults for `role`: keepalive 30 s, LLC wait 2 s, linger 10 s (server; the client
    /// 2 s longer so that the server's DELETE LINK normally decides).
    pub fn new(role: Role) -> Self {
        Self {
            role,
            link_num: 1,
            keepalive: KEEPALIVE,
            llc_wait: LLC_WAIT,
            linger: Duration::from_secs(10),
            version: LlcVersion::V1,
        }
    }
}

/// Why a group ends.
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
}

/// What the engine must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LgrAction {
    /// Post this LLC message (44 octets) on the link.
    SendLlc([u8; LLC_LEN]),
    /// Our CONFIRM RKEY for `rkey` was answered: `ok` = positive.
    RkeyConfirmed {
        /// The RKey announced.
        rkey: u32,
        /// Positive reply.
        ok: bool,
    },
    /// The group is over: reset every connection (unless [`TermReason::Idle`], when there
    /// are none) and free the link.
    Terminate(TermReason),
}

/// A request is already running (SMC-LG-15: configuration exchanges never overlap).
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
}

/// The link-group machine.
#[derive(Debug)]
pub struct LgrMachine {
    cfg: LgrConfig,
    terminated: Option<TermReason>,
    conns: usize,
    last_rx: Instant,
    test_out: Option<([u8; 16], Instant)>,
    test_seq: u64,
    rkey_out: Option<(u32, Instant)>,
    linger_at: Option<Instant>,
    /// The peer's RMBs announced by CONFIRM RKEY on our link: RKey → VA.
    peer_rkeys: BTreeMap<u32, u64>,
    out: VecDeque<LgrAction>,
    counters: LgrCounters,
}

impl LgrMachine {
    /// A group whose link was just confirmed, with no connection yet (the first one is
    /// added by the engine at once).
    pub fn new(cfg: LgrConfig, now: Instant) -> Self {
        let mut m = Self {
            cfg,
            terminated: None,
            conns: 0,
            last_rx: now,
            test_out: None,
            test_seq: 0,
            rkey_out: None,
            linger_at: None,
            peer_rkeys: BTreeMap::new(),
            out: VecDeque::new(),
            counters: LgrCounters::default(),
        };
        m.linger_at = Some(now + m.linger());
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

    /// The engine learned a peer RMB's RToken from a CLC Accept/Confirm (first contact, or a
    /// subsequent contact naming an RMB): a DELETE RKEY for it is then answered positively.
    pub fn peer_rkey_known(&mut self, rkey: u32, vaddr: u64) {
        self.peer_rkeys.insert(rkey, vaddr);
    }

    /// The peer's RMBs announced with CONFIRM RKEY or the CLC (RKey → VA).
    pub fn peer_rkeys(&self) -> &BTreeMap<u32, u64> {
        &self.peer_rkeys
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
            Some((_, t)) => t + self.cfg.llc_wait,
            None => self.last_rx + self.cfg.keepalive,
        };
        [
            Some(ka),
            self.rkey_out.map(|(_, t)| t + self.cfg.llc_wait),
            self.linger_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn send(&mut self, mut m: LlcMessage) {
        m.version = self.cfg.version;
        let mut b = [0u8; LLC_LEN];
        if m.emit(&mut b).is_ok() {
            self.counters.llc_sent += 1;
            self.out.push_back(LgrAction::SendLlc(b));
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

    /// A completion error or a device event: the link (the only one) failed.
    pub fn link_error(&mut self, why: String) {
        self.terminate(TermReason::LinkError(why), false);
    }

    /// Local decision to end the group at once (DELETE LINK with A to the peer).
    pub fn shutdown(&mut self, why: TermReason) {
        self.terminate(why, true);
    }

    /// Announces a new RMB of ours (CONFIRM RKEY, SMC-SC-2/5, A4.8): the engine registers it
    /// and calls this before the Accept/Confirm that names it; the connection waits for
    /// [`LgrAction::RkeyConfirmed`]. One link: this link's RToken and no others (E-3).
    pub fn confirm_rkey(&mut self, rkey: u32, vaddr: u64, now: Instant) -> Result<(), Busy> {
        if self.rkey_out.is_some() || self.terminated.is_some() {
            return Err(Busy);
        }
        self.rkey_out = Some((rkey, now));
        self.send(LlcMessage::request(LlcBody::ConfirmRkey(ConfirmRkey {
            negative: false,
            retry: false,
            num_tkns: 0,
            rkey,
            vaddr,
            others: Vec::new(),
        })));
        Ok(())
    }

    /// Timers: TEST LINK keepalive and its timeout, the CONFIRM RKEY wait, the linger time.
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
        match self.test_out {
            Some((_, t)) if now >= t + self.cfg.llc_wait => {
                self.terminate(TermReason::LlcTimeout("TEST LINK"), true);
                return;
            }
            None if now >= self.last_rx + self.cfg.keepalive => {
                self.test_seq += 1;
                let mut ud = [0u8; 16];
                ud[..8].copy_from_slice(b"softrdma");
                ud[8..].copy_from_slice(&self.test_seq.to_be_bytes());
                self.test_out = Some((ud, now));
                self.counters.test_links += 1;
                self.send(LlcMessage::request(LlcBody::TestLink(TestLink { user_data: ud })));
            }
            _ => {}
        }
        if self.conns == 0
            && let Some(t) = self.linger_at
            && now >= t
        {
            self.terminate(TermReason::Idle, true);
        }
    }

    /// An LLC message (a received SEND that is not a CDC) arrived on the link.
    pub fn on_llc(&mut self, bytes: &[u8], now: Instant) {
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
        match (m.body, m.reply) {
            (LlcBody::ConfirmLink(_), _) if self.cfg.version == LlcVersion::V2 => {
                // Linux drops a CONFIRM LINK outside its flow (request or reply); so do we in
                // a v2 group: a v2 server may repeat its first-contact request (engine).
                tracing::debug!("out-of-flow CONFIRM LINK in a v2 group, dropped");
                self.counters.discarded += 1;
            }
            (LlcBody::TestLink(t), false) => {
                // SMC-KA-2: answer at once, same user data.
                self.send(LlcMessage::request(LlcBody::TestLink(t)).into_reply());
            }
            (LlcBody::TestLink(t), true) => match self.test_out {
                Some((ud, _)) if ud == t.user_data => self.test_out = None,
                Some(_) => self.protocol_error("TEST LINK reply with other user data".into()),
                None => self.protocol_error("TEST LINK reply without a request".into()),
            },
            (LlcBody::DeleteLink(d), reply) => {
                if d.all {
                    // SMC-TMO-14 / SMC-LG-12: the whole group, at once, no reply.
                    self.terminate(TermReason::PeerDeleted(d.reason), false);
                } else if d.link_num == self.cfg.link_num {
                    if !reply && !server {
                        // SMC-LG-10: the client must reply positively.
                        self.send(LlcMessage::request(LlcBody::DeleteLink(d)).into_reply());
                    }
                    // Our only link: nothing left (A4.7 step 9).
                    self.terminate(TermReason::PeerDeleted(d.reason), server && !reply);
                } else if !reply {
                    // SMC-INV-6/7 (E-10): "no link".
                    self.send(
                        LlcMessage::request(LlcBody::DeleteLink(DeleteLink {
                            reason: delete_reason::NO_LINK,
                            ..d
                        }))
                        .into_reply(),
                    );
                }
            }
            (LlcBody::ConfirmRkey(c), false) => {
                // The peer added an RMB; one link: its RToken on this link, no others.
                self.peer_rkeys.insert(c.rkey, c.vaddr);
                let rep = ConfirmRkey {
                    negative: false,
                    others: Vec::new(),
                    num_tkns: 0,
                    ..c
                };
                self.send(LlcMessage::request(LlcBody::ConfirmRkey(rep)).into_reply());
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
                    if self.peer_rkeys.remove(k).is_none() {
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
                self.send(LlcMessage::request(LlcBody::DeleteRkey(rep)).into_reply());
            }
            (LlcBody::AddLink(mut a), false) if !server => {
                // SMC-FC-9: one RNIC here → reject, reason 1 "no alternate path". The v2
                // form has no room for a reason (Linux's v2 reject, lab capture frame 17,
                // is flags 0xC0 with the reason nibble 0), and only the first 44 octets
                // of the request are echoed, as Linux does.
                a.reject = true;
                a.reject_reason = if self.cfg.version == LlcVersion::V1 {
                    add_link_reject::NO_ALTERNATE_PATH
                } else {
                    0
                };
                a.v2_ext = None;
                self.send(LlcMessage::request(LlcBody::AddLink(a)).into_reply());
            }
            (LlcBody::AddLink(_), false) => {
                // A client's ADD LINK notification with the group at its maximum: ignored
                // (SMC-LG-9).
            }
            (body, reply) => self.protocol_error(format!(
                "unexpected LLC {:#04x}{} on an established link",
                body.opcode(),
                if reply { " reply" } else { "" }
            )),
        }
    }
}

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
            if let LgrAction::SendLlc(b) = a {
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
        let LgrAction::SendLlc(b) = &out[0] else { panic!() };
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
        let LgrAction::SendLlc(b) = &out[0] else {
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
                    LgrAction::SendLlc(m) => {
                        b.on_llc(&m, now);
                        moved = true;
                    }
                    o => ea.push(o),
                }
            }
            while let Some(x) = b.poll_action() {
                match x {
                    LgrAction::SendLlc(m) => {
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
            if let LgrAction::SendLlc(b) = a {
                v.push(b);
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

    /// SMC-INV-9 in a v2 group, golden vectors from Linux 6.12 (lab capture frames 80 → 84):
    /// DELETE RKEY of an RMB whose RToken came by CLC is answered positively with Linux's
    /// octets (count kept, RKeys zeroed); an unknown RKey gives the negative reply with the
    /// number of invalid RKeys (v2), not a bit mask.
    #[test]
    fn v2_delete_rkey_replies_as_linux_does() {
        let now = t0();
        let mut m = v2_machine(Role::Server, now);
        m.peer_rkey_known(0x0395, 0x1000);
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
