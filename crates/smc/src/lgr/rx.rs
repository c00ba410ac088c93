//! Received LLC messages: parse, check the version and the link, and dispatch by opcode
//! (SMC-KA-2, SMC-LG-14/16/19, SMC-INV-9/10/11).

use super::{LgrAction, LgrMachine, PeerRmb};
use crate::stats::Role;
use crate::wire::llc::{ConfirmRkey, DeleteRkey, LlcBody, LlcError, LlcMessage, LlcVersion};
use std::time::Instant;

impl LgrMachine {
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
}
