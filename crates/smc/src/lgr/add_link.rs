//! ADD LINK, server and client (A4.2 steps 12–16, SMC-RMB-6, SMC-FC-9): the request, the
//! reply, the RToken continuations, CONFIRM LINK on the new link, and aborting the exchange.

use super::{AddStep, Adding, Busy, LgrAction, LgrMachine, LinkAddr, TermReason};
use crate::stats::Role;
use crate::wire::llc::{
    AddLink, AddLinkCont, ConfirmLink, DeleteLink, LlcBody, LlcMessage, LlcVersion, RtokenPair, add_link_reject,
    delete_reason,
};
use std::collections::VecDeque;
use std::time::Instant;

impl LgrMachine {
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

    pub(super) fn schedule_add(&mut self, now: Instant) {
        if self.cfg.role == Role::Server
            && let Some(r) = self.cfg.add_link_retry
            && self.cfg.max_links > 1
        {
            self.add_due_at = Some(now + r);
        }
    }

    /// An ADD LINK exchange ends without a link: the new link is freed; if it never became
    /// known to the peer as active, the server deletes it over the carrier (SMC-TMO-9).
    pub(super) fn abort_add(&mut self, why: TermReason, now: Instant) {
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

    pub(super) fn abort_add_quiet(&mut self, why: TermReason, now: Instant) {
        if let Some(a) = self.adding.take() {
            self.out.push_back(LgrAction::LinkFree { link: a.link, why });
            self.schedule_add(now);
        }
    }

    pub(super) fn cli_on_add_link(&mut self, link: u8, a: AddLink, now: Instant) {
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

    pub(super) fn srv_on_add_link_reply(&mut self, link: u8, a: AddLink, now: Instant) {
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

    pub(super) fn on_add_link_cont(&mut self, link: u8, c: AddLinkCont, now: Instant) {
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

    pub(super) fn on_new_link_confirm(&mut self, link: u8, c: ConfirmLink, now: Instant) {
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
