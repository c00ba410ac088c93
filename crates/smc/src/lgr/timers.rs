//! The clock: TEST LINK keepalive and its timeout, the LLC waits, the ADD LINK retry and
//! the linger time (SMC-KA-1, SMC-TMO-6..16, A4.9).

use super::{AddStep, LgrAction, LgrMachine, TermReason};
use crate::wire::llc::{LlcBody, LlcMessage, TestLink, add_link_reject};
use std::time::Instant;

impl LgrMachine {
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
}
