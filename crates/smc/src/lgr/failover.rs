//! Losing a link: local failure with failover to a survivor (SMC-FO-1, A4.7) and the
//! DELETE LINK exchange (SMC-LG-10/11/12, SMC-INV-6/7).

use super::{LgrAction, LgrMachine, TermReason};
use crate::stats::Role;
use crate::wire::llc::{DeleteLink, LlcBody, LlcMessage, delete_reason};
use std::time::Instant;

impl LgrMachine {
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
    pub(super) fn lose_link(&mut self, link: u8, why: TermReason, tell: bool, now: Instant) {
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

    pub(super) fn on_delete_link(&mut self, link: u8, d: DeleteLink, reply: bool, now: Instant) {
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
}
