//! Disconnection: DREQ, DREP and time-wait (IBA vol. 1 ch. 12; requirement C1.7). A DREQ is
//! sent again on the peer's CM response timeout and ends in time-wait; destroying a
//! connection that is not yet established rejects it instead.

use std::time::Instant;

use verbs::Gid;

use super::{Cm, CmError, CmEvent, CmId, State, check_len};
use crate::cm::mad::{CmMsg, DREQ_PDATA, Drep, Dreq, Mad, MadHeader, MsgType, Rej, RejReason};

impl Cm {
    /// Sends a DREQ on an established connection; [`CmEvent::Disconnected`] follows when the
    /// DREP arrives (or the DREQ times out).
    pub fn disconnect(&mut self, now: Instant, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        check_len("DREQ private data", private_data, DREQ_PDATA)?;
        let state = self.conns.get(&id.0).ok_or(CmError::UnknownId(id))?.state;
        if state != State::Established {
            return Err(CmError::State { id, state });
        }
        self.send_dreq(now, id.0, private_data.to_vec());
        Ok(())
    }

    /// The application gave up on a connection (Linux `cm_destroy_id`): a REQ or REP still
    /// waiting for an answer is withdrawn with REJ "timeout" (our CA GUID as ARI), a REQ we
    /// have not answered gets REJ "consumer defined", an established connection a DREQ (it
    /// stays until the DREP or time-wait, without a [`CmEvent::Disconnected`] of its own
    /// here: the DREQ's answer brings it). Anything else is forgotten at once. No event
    /// follows for a connection forgotten here.
    pub fn destroy(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        let ca_guid = self.cfg.ca_guid;
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId(id))?;
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        let rej = |message_rejected, reason, ari: Vec<u8>| {
            CmMsg::Rej(Rej {
                local_comm_id: id.0,
                remote_comm_id: remote,
                message_rejected,
                reason,
                ari,
                private_data: Vec::new(),
            })
        };
        match c.state {
            State::ReqSent | State::MraReqRcvd => {
                self.send(
                    peer,
                    tid,
                    rej(MsgType::Req, RejReason::Timeout, ca_guid.to_be_bytes().to_vec()),
                );
            }
            State::RepSent | State::MraRepRcvd => {
                self.send(
                    peer,
                    tid,
                    rej(MsgType::Rep, RejReason::Timeout, ca_guid.to_be_bytes().to_vec()),
                );
            }
            State::ReqRcvd | State::MraReqSent => {
                self.send(peer, tid, rej(MsgType::Req, RejReason::ConsumerDefined, Vec::new()));
            }
            State::RepRcvd | State::MraRepSent => {
                self.send(peer, tid, rej(MsgType::Rep, RejReason::ConsumerDefined, Vec::new()));
            }
            State::Established => {
                self.send_dreq(now, id.0, Vec::new());
                return Ok(());
            }
            State::DreqSent | State::TimeWait => return Ok(()),
        }
        self.remove(id.0);
        Ok(())
    }

    /// Time-wait (IBA vol. 1 §12.9.6.9 (unconfirmed)): the connection answers repeated DREQs and is forgotten
    /// after [`CmConfig::time_wait`]. It no longer blocks a new REQ from the same QP (Linux
    /// accepted the same (CA GUID, QPN) right after DREQ/DREP, lab README).
    pub(super) fn enter_time_wait(&mut self, now: Instant, id: u32) {
        let tw = self.cfg.time_wait;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.retries = 0;
            c.timer = Some(now + tw);
            let key = (c.remote_ca_guid, c.remote_qpn);
            if self.by_qpn.get(&key) == Some(&id) {
                self.by_qpn.remove(&key);
            }
        }
    }

    pub(super) fn send_dreq(&mut self, now: Instant, id: u32, private_data: Vec<u8>) {
        let tid = self.new_tid();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let mad = Mad {
            hdr: MadHeader::with_tid(tid),
            msg: CmMsg::Dreq(Dreq {
                local_comm_id: id,
                remote_comm_id: c.remote_comm_id,
                remote_qpn: c.remote_qpn,
                private_data,
            }),
        };
        c.state = State::DreqSent;
        c.retries = 0;
        c.timer = Some(now + c.peer_timeout);
        c.last = Some(mad.clone());
        self.tx.push_back((c.peer, mad));
    }

    pub(super) fn on_dreq(&mut self, now: Instant, tid: u64, dreq: Dreq, from: Gid) {
        let drep = |local: u32, remote: u32| {
            CmMsg::Drep(Drep {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: Vec::new(),
            })
        };
        let id = dreq.remote_comm_id;
        let Some(c) = self.conns.get(&id) else {
            // cm_dreq_handler: a DREQ for a connection we do not know still gets a DREP, so
            // that the peer's DREQ does not time out.
            self.stats.dropped += 1;
            self.send(from, tid, drep(dreq.remote_comm_id, dreq.local_comm_id));
            return;
        };
        if c.remote_comm_id != dreq.local_comm_id {
            self.stats.dropped += 1;
            return;
        }
        // Linux drops a DREQ whose QPN is not the QPN of the connection (measured).
        let our_qpn = if c.active {
            c.req.local_qpn
        } else {
            c.rep.as_ref().map_or(0, |r| r.local_qpn)
        };
        if dreq.remote_qpn != our_qpn {
            self.stats.dropped += 1;
            return;
        }
        match c.state {
            State::Established | State::DreqSent | State::RepSent | State::MraRepRcvd => {
                let mad = Mad {
                    hdr: MadHeader::with_tid(tid),
                    msg: drep(id, c.remote_comm_id),
                };
                let peer = c.peer;
                self.tx.push_back((peer, mad.clone()));
                self.enter_time_wait(now, id);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last = Some(mad);
                }
                self.events.push_back(CmEvent::Disconnected {
                    id: CmId(id),
                    private_data: dreq.private_data,
                });
            }
            // Our DREP was lost: send it again (with the TID of this DREQ).
            State::TimeWait => {
                self.stats.duplicates += 1;
                let mad = Mad {
                    hdr: MadHeader::with_tid(tid),
                    msg: drep(id, c.remote_comm_id),
                };
                self.tx.push_back((c.peer, mad));
            }
            _ => self.stats.dropped += 1,
        }
    }

    pub(super) fn on_drep(&mut self, now: Instant, drep: Drep) {
        let id = drep.remote_comm_id;
        match self.conns.get(&id) {
            Some(c) if c.state == State::DreqSent && c.remote_comm_id == drep.local_comm_id => {
                self.enter_time_wait(now, id);
                self.events.push_back(CmEvent::Disconnected {
                    id: CmId(id),
                    private_data: drep.private_data,
                });
            }
            Some(c) if c.state == State::TimeWait => self.stats.duplicates += 1,
            _ => self.stats.dropped += 1,
        }
    }
}
