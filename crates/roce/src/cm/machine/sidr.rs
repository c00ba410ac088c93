//! Service ID resolution for UD: SIDR_REQ and SIDR_REP (IBA vol. 1 §12.11, unconfirmed;
//! requirement D3, issue 14). Our SIDR_REQs are resent unchanged every peer response
//! timeout; received ones wait for the application (at most [`MAX_SIDR_PENDING`]) and, once
//! answered, are remembered (at most [`MAX_SIDR_ANSWERED`]) to answer a repeat.

use std::time::Instant;

use rand::Rng;

use verbs::Gid;

use super::{
    Cm, CmError, CmEvent, MAX_SIDR_ANSWERED, MAX_SIDR_PENDING, SidrId, SidrIn, SidrOut, SidrRequest, check_len,
};
use crate::cm::cma::CmaHdr;
use crate::cm::mad::{CmMsg, Mad, MadHeader, SIDR_REP_PDATA, SIDR_REQ_PDATA, SidrRep, SidrReq, SidrStatus};

impl Cm {
    /// SIDR_REQs sent and not yet answered or timed out.
    pub fn sidr_pending(&self) -> usize {
        self.sidr_out.len()
    }

    /// SIDR_REQs received: waiting for the application, and answered ones remembered.
    pub fn sidr_received(&self) -> usize {
        self.sidr_in.len()
    }

    // ---- commands -----------------------------------------------------------------------

    /// Active SIDR: sends a SIDR_REQ for `service_id` to `to` with `private_data` (≤ 216
    /// octets; for an rdma_cm peer the `cma_hdr` first, [`CmaHdr::req_private_data`] style).
    /// The answer comes as [`CmEvent::SidrReply`] or [`CmEvent::SidrTimedOut`].
    pub fn sidr_request(
        &mut self,
        now: Instant,
        to: Gid,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<SidrId, CmError> {
        check_len("SIDR_REQ private data", private_data, SIDR_REQ_PDATA)?;
        let id = loop {
            let id: u32 = self.rng.random();
            if id != 0 && !self.sidr_out.contains_key(&id) && !self.conns.contains_key(&id) {
                break id;
            }
        };
        let mad = Mad {
            hdr: MadHeader::with_tid(self.new_tid()),
            msg: CmMsg::SidrReq(SidrReq {
                request_id: id,
                pkey: self.cfg.pkey,
                service_id,
                private_data: private_data.to_vec(),
            }),
        };
        mad.emit()?;
        let timer = now + self.timeout(self.cfg.cm_response_timeout);
        self.sidr_out.insert(
            id,
            SidrOut {
                peer: to,
                mad: mad.clone(),
                timer,
                retries: 0,
            },
        );
        self.tx.push_back((to, mad));
        Ok(SidrId(id))
    }

    /// Active SIDR: forgets a request (no event follows). Returns whether it was pending.
    pub fn sidr_cancel(&mut self, id: SidrId) -> bool {
        self.sidr_out.remove(&id.0).is_some()
    }

    /// Passive SIDR: answers a [`CmEvent::SidrRequest`] with a SIDR_REP of `status`, our UD
    /// QP's number and Q_Key (meaningful with [`SidrStatus::Valid`]; 0 otherwise, as Linux
    /// sends them) and `private_data` (≤ 136 octets).
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        id: SidrId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        check_len("SIDR_REP private data", private_data, SIDR_REP_PDATA)?;
        let expires = now + self.cfg.time_wait;
        let i = self.sidr_in.get_mut(&id.0).ok_or(CmError::UnknownSidr(id))?;
        if i.answer.is_some() {
            return Err(CmError::UnknownSidr(id));
        }
        let mad = Mad {
            hdr: MadHeader::with_tid(i.tid),
            msg: CmMsg::SidrRep(SidrRep {
                request_id: i.request_id,
                status: status.into(),
                qpn,
                service_id: i.service_id,
                qkey,
                additional_info: Vec::new(),
                private_data: private_data.to_vec(),
            }),
        };
        mad.emit()?;
        i.answer = Some((mad.clone(), expires));
        self.tx.push_back((i.peer, mad));
        self.sidr_answered.push_back(id.0);
        while self.sidr_answered.len() > MAX_SIDR_ANSWERED {
            if let Some(old) = self.sidr_answered.pop_front() {
                self.forget_sidr_in(old);
            }
        }
        Ok(())
    }

    // ---- input --------------------------------------------------------------------------

    pub(super) fn forget_sidr_in(&mut self, h: u32) {
        if let Some(i) = self.sidr_in.remove(&h)
            && self.sidr_by_remote.get(&(i.peer, i.request_id)) == Some(&h)
        {
            self.sidr_by_remote.remove(&(i.peer, i.request_id));
        }
    }

    pub(super) fn on_sidr_req(&mut self, tid: u64, req: SidrReq, from: Gid) {
        if let Some(&h) = self.sidr_by_remote.get(&(from, req.request_id)) {
            self.stats.duplicates += 1;
            // Answered: the SIDR_REP was lost, send it again; not answered yet: drop.
            if let Some((mad, _)) = self.sidr_in.get(&h).and_then(|i| i.answer.as_ref()) {
                self.tx.push_back((from, mad.clone()));
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            // cm_sidr_req_handler: no listener, IB_SIDR_UNSUPPORTED; nothing is kept.
            self.send(
                from,
                tid,
                CmMsg::SidrRep(SidrRep {
                    request_id: req.request_id,
                    status: SidrStatus::Unsupported.into(),
                    qpn: 0,
                    service_id: req.service_id,
                    qkey: 0,
                    additional_info: Vec::new(),
                    private_data: Vec::new(),
                }),
            );
            return;
        }
        if self.sidr_in.len().saturating_sub(self.sidr_answered.len()) >= MAX_SIDR_PENDING {
            self.stats.dropped += 1;
            return;
        }
        let h = loop {
            let h: u32 = self.rng.random();
            if h != 0 && !self.sidr_in.contains_key(&h) {
                break h;
            }
        };
        self.sidr_by_remote.insert((from, req.request_id), h);
        self.sidr_in.insert(
            h,
            SidrIn {
                peer: from,
                request_id: req.request_id,
                tid,
                service_id: req.service_id,
                answer: None,
            },
        );
        // Only rdma_cm's port spaces carry the rdma_cm header; a raw service's private data
        // (IPoIB-CM's 8 octets, say) is the application's, whatever its octets look like.
        let cma = crate::cm::cma::parse_service_id(req.service_id).and_then(|_| CmaHdr::parse(&req.private_data).ok());
        self.events.push_back(CmEvent::SidrRequest(Box::new(SidrRequest {
            id: SidrId(h),
            from,
            req,
            cma,
        })));
    }

    pub(super) fn on_sidr_rep(&mut self, rep: SidrRep) {
        // cm_sidr_rep_handler: matched by request ID, in the SIDR_REQ_SENT state only.
        if self.sidr_out.remove(&rep.request_id).is_none() {
            self.stats.dropped += 1;
            return;
        }
        self.events.push_back(CmEvent::SidrReply {
            id: SidrId(rep.request_id),
            rep: Box::new(rep),
        });
    }
}
