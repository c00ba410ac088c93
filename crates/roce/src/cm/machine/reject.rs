//! REJ and MRA (IBA vol. 1 ch. 12; requirements C1.6, C1.7): rejecting a REQ or REP, a
//! received REJ ending a connection, and the MRA that stops the peer's retransmission while
//! the application decides.

use std::time::Instant;

use verbs::Gid;

use super::{Cm, CmError, CmEvent, CmId, State, check_len};
use crate::cm::mad::{CmMsg, Mad, MadHeader, Mra, MsgType, REJ_ARI, REJ_PDATA, Rej, RejReason, Req};

impl Cm {
    /// Rejects a REQ (passive, before accept) or a REP (active, before [`Cm::rtu`]), with a
    /// reason (usually [`RejReason::ConsumerDefined`], 28) and private data (≤ 148).
    pub fn reject(
        &mut self,
        _now: Instant,
        id: CmId,
        reason: RejReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        check_len("REJ reject info", ari, REJ_ARI)?;
        check_len("REJ private data", private_data, REJ_PDATA)?;
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId(id))?;
        let message_rejected = match c.state {
            State::ReqRcvd | State::MraReqSent => MsgType::Req,
            State::RepRcvd | State::MraRepSent => MsgType::Rep,
            state => return Err(CmError::State { id, state }),
        };
        let mad = Mad {
            hdr: MadHeader::with_tid(c.tid),
            msg: CmMsg::Rej(Rej {
                local_comm_id: id.0,
                remote_comm_id: c.remote_comm_id,
                message_rejected,
                reason,
                ari: ari.to_vec(),
                private_data: private_data.to_vec(),
            }),
        };
        self.tx.push_back((c.peer, mad));
        self.remove(id.0);
        Ok(())
    }

    /// Asks the peer for patience (MRA, IBA vol. 1 §12.6.6 (unconfirmed)): passive before [`Cm::accept`], active
    /// before [`Cm::rtu`]. The peer stops retransmitting and waits the service timeout of
    /// [`CmConfig::mra_service_timeout`](super::CmConfig::mra_service_timeout); a repeat of its message gets the MRA again. (Without
    /// this call a repeated REQ gets an MRA anyway, as rdma_cm's delayed MRA does.)
    pub fn mra(&mut self, _now: Instant, id: CmId) -> Result<(), CmError> {
        let service_timeout = self.cfg.mra_service_timeout;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        let (message_mraed, next) = match c.state {
            State::ReqRcvd | State::MraReqSent => (MsgType::Req, State::MraReqSent),
            State::RepRcvd | State::MraRepSent => (MsgType::Rep, State::MraRepSent),
            state => return Err(CmError::State { id, state }),
        };
        let mad = Mad {
            hdr: MadHeader::with_tid(c.tid),
            msg: CmMsg::Mra(Mra {
                local_comm_id: id.0,
                remote_comm_id: c.remote_comm_id,
                message_mraed,
                service_timeout,
                private_data: Vec::new(),
            }),
        };
        c.state = next;
        c.last = Some(mad.clone());
        self.tx.push_back((c.peer, mad));
        Ok(())
    }

    pub(super) fn reject_req(&mut self, to: Gid, tid: u64, req: &Req, reason: RejReason, ari: Vec<u8>) {
        // Linux answers a REQ it keeps no state for with local comm ID 0 (lab README).
        self.send(
            to,
            tid,
            CmMsg::Rej(Rej {
                local_comm_id: 0,
                remote_comm_id: req.local_comm_id,
                message_rejected: MsgType::Req,
                reason,
                ari,
                private_data: Vec::new(),
            }),
        );
    }

    pub(super) fn on_mra(&mut self, now: Instant, mra: Mra) {
        let wait = self.timeout(mra.service_timeout);
        let Some(c) = self.conns.get_mut(&mra.remote_comm_id) else {
            self.stats.dropped += 1;
            return;
        };
        match (c.state, mra.message_mraed) {
            (State::ReqSent, MsgType::Req) => {
                c.state = State::MraReqRcvd;
                c.remote_comm_id = mra.local_comm_id;
                c.timer = Some(now + wait);
            }
            (State::RepSent, MsgType::Rep) if c.remote_comm_id == mra.local_comm_id => {
                c.state = State::MraRepRcvd;
                c.timer = Some(now + wait);
            }
            // A repeated MRA (the peer saw our retransmission) restarts the wait.
            (State::MraReqRcvd, MsgType::Req) | (State::MraRepRcvd, MsgType::Rep) => {
                self.stats.duplicates += 1;
                c.timer = Some(now + wait);
            }
            _ => self.stats.dropped += 1,
        }
    }

    pub(super) fn on_rej(&mut self, now: Instant, rej: Rej) {
        let id = rej.remote_comm_id;
        let Some(c) = self.conns.get(&id) else {
            self.stats.dropped += 1;
            return;
        };
        // Before the REP the peer may have no comm ID of its own (it sends 0).
        if c.remote_comm_id != 0 && rej.local_comm_id != 0 && rej.local_comm_id != c.remote_comm_id {
            self.stats.dropped += 1;
            return;
        }
        match c.state {
            // Any state before established: our REQ or REP was refused, or the peer gave up
            // on the connection it asked for or accepted (its REJ "timeout").
            State::ReqSent
            | State::MraReqRcvd
            | State::ReqRcvd
            | State::MraReqSent
            | State::RepSent
            | State::MraRepRcvd
            | State::RepRcvd
            | State::MraRepSent => {
                self.remove(id);
                self.events.push_back(CmEvent::Rejected {
                    id: CmId(id),
                    reason: rej.reason,
                    ari: rej.ari,
                    private_data: rej.private_data,
                });
            }
            // After our RTU or during our DREQ: the peer gave up on the connection (its REP
            // timed out, or it saw a newer REQ from our QP: stale). Linux's cm_rej_handler
            // enters time-wait and reports the REJ; so do we.
            State::Established | State::DreqSent => {
                self.enter_time_wait(now, id);
                self.events.push_back(CmEvent::Rejected {
                    id: CmId(id),
                    reason: rej.reason,
                    ari: rej.ari,
                    private_data: rej.private_data,
                });
            }
            _ => self.stats.dropped += 1,
        }
    }
}
