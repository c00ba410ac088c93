//! Connection establishment: REQ, REP and RTU (IBA vol. 1 ch. 12; requirements C1.4,
//! C1.5, C1.7, C1.8). Active: [`Cm::connect`] sends the REQ, the REP becomes a
//! [`CmEvent::ConnectReply`], [`Cm::rtu`] answers it. Passive: a REQ for a listened service
//! becomes a [`CmEvent::ConnectRequest`], [`Cm::accept`] sends the REP, the RTU (or
//! [`Cm::notify_established`]) establishes. A repeated REQ is answered from state; a stale
//! one (same CA GUID and QPN as a live connection) gets REJ 10 and the old one a DREQ.

use std::time::Instant;

use verbs::{AhAttr, Gid, Mtu, RtrAttr, RtsAttr};

use super::{
    AcceptParams, Cm, CmError, CmEvent, CmId, Conn, ConnectParams, ConnectRequest, QpParams, State, check_len,
};
use crate::cm::cma::CmaHdr;
use crate::cm::mad::{
    CmMsg, Mad, MadHeader, Mra, MsgType, Path, REP_PDATA, REQ_PDATA, RTU_PDATA, RejReason, Rep, Req, Rtu, mtu_from_code,
};

impl Cm {
    /// Sends a REQ; answers come as [`CmEvent::ConnectReply`], [`CmEvent::Rejected`] or
    /// [`CmEvent::TimedOut`].
    pub fn connect(&mut self, now: Instant, p: ConnectParams) -> Result<CmId, CmError> {
        check_len("REQ private data", &p.private_data, REQ_PDATA)?;
        let id = self.new_comm_id();
        let req = Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.cfg.cm_response_timeout,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: self.cfg.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: self.cfg.pkey,
            path_mtu: p.path_mtu as u8,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: self.cfg.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: Path {
                // rdma_cm on RoCE: permissive LIDs (lab capture).
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: self.cfg.local_gid,
                remote_gid: p.remote_gid,
                flow_label: p.flow_label,
                packet_rate: 0,
                traffic_class: p.traffic_class,
                hop_limit: p.hop_limit,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: p.local_ack_timeout,
            },
            alternate_path: Path::default(),
            sap_supported: false,
            private_data: p.private_data,
        };
        let tid = self.new_tid();
        let mad = Mad {
            hdr: MadHeader::with_tid(tid),
            msg: CmMsg::Req(req.clone()),
        };
        mad.emit()?; // every field checked before anything is kept
        let peer_timeout = self.timeout(self.cfg.cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                active: true,
                peer: p.remote_gid,
                remote_comm_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                req,
                rep: None,
                tid,
                last: Some(mad.clone()),
                timer: Some(now + peer_timeout),
                retries: 0,
                peer_timeout,
                max_retries: self.cfg.max_cm_retries,
                min_rnr_timer: 12,
            },
        );
        self.tx.push_back((p.remote_gid, mad));
        Ok(CmId(id))
    }

    /// Passive: answers a [`CmEvent::ConnectRequest`] with a REP. Returns the QP attributes
    /// (move the QP to RTR now; to RTS at [`CmEvent::Established`] or now).
    pub fn accept(&mut self, now: Instant, id: CmId, p: AcceptParams) -> Result<QpParams, CmError> {
        check_len("REP private data", &p.private_data, REP_PDATA)?;
        let ca_guid = self.cfg.ca_guid;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::State { id, state: c.state });
        }
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: ca_guid,
            private_data: p.private_data,
        };
        let mad = Mad {
            hdr: MadHeader::with_tid(c.tid),
            msg: CmMsg::Rep(rep.clone()),
        };
        mad.emit()?;
        c.rep = Some(rep);
        c.min_rnr_timer = p.min_rnr_timer;
        c.state = State::RepSent;
        c.retries = 0;
        c.timer = Some(now + c.peer_timeout);
        c.last = Some(mad.clone());
        let peer = c.peer;
        let qp = qp_params(c);
        self.tx.push_back((peer, mad));
        Ok(qp)
    }

    /// Active: after [`CmEvent::ConnectReply`] (and the QP in RTS), sends the RTU; the
    /// connection is established.
    pub fn rtu(&mut self, _now: Instant, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        check_len("RTU private data", private_data, RTU_PDATA)?;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(CmError::State { id, state: c.state });
        }
        let mad = Mad {
            hdr: MadHeader::with_tid(c.tid),
            msg: CmMsg::Rtu(Rtu {
                local_comm_id: id.0,
                remote_comm_id: c.remote_comm_id,
                private_data: private_data.to_vec(),
            }),
        };
        c.state = State::Established;
        c.last = Some(mad.clone());
        c.timer = None;
        let peer = c.peer;
        let qp = qp_params(c);
        self.tx.push_back((peer, mad));
        self.events.push_back(CmEvent::Established { id, qp });
        Ok(())
    }

    /// Passive: the QP received its first packet before the RTU (IBA vol. 1 §12.9.6 (unconfirmed): that
    /// establishes the connection too; `ib_cm_notify(IB_EVENT_COMM_EST)` in Linux).
    pub fn notify_established(&mut self, _now: Instant, id: CmId) -> Result<(), CmError> {
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId(id))?;
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                self.establish_passive(id.0);
                Ok(())
            }
            State::Established => Ok(()),
            state => Err(CmError::State { id, state }),
        }
    }

    pub(super) fn on_req(&mut self, now: Instant, tid: u64, req: Req, from: Gid) {
        // A repeat of a REQ we know (C1.7 duplicates).
        if let Some(&id) = self.by_remote.get(&(req.local_ca_guid, req.local_comm_id)) {
            self.stats.duplicates += 1;
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            match c.state {
                // The application is slow: tell the peer to wait (MRA, Linux/rdma_cm's
                // behaviour: an MRA only when the REQ is repeated).
                State::ReqRcvd | State::MraReqSent => {
                    c.state = State::MraReqSent;
                    let mad = Mad {
                        hdr: MadHeader::with_tid(c.tid),
                        msg: CmMsg::Mra(Mra {
                            local_comm_id: id,
                            remote_comm_id: c.remote_comm_id,
                            message_mraed: MsgType::Req,
                            service_timeout: self.cfg.mra_service_timeout,
                            private_data: Vec::new(),
                        }),
                    };
                    c.last = Some(mad.clone());
                    self.tx.push_back((c.peer, mad));
                }
                State::RepSent | State::MraRepRcvd => self.resend_last(id),
                // cm_dup_req_handler: a REQ for a connection in time-wait is stale.
                State::TimeWait => self.reject_req(from, tid, &req, RejReason::StaleConn, Vec::new()),
                _ => {}
            }
            return;
        }
        // A new REQ from a (CA GUID, QPN) that already has a live connection: REJ 10, and
        // the old connection is torn down (Linux, lab README "Live duplicate").
        if let Some(&old) = self.by_qpn.get(&(req.local_ca_guid, req.local_qpn)) {
            self.reject_req(from, tid, &req, RejReason::StaleConn, Vec::new());
            if self.conns.get(&old).is_some_and(|c| c.state == State::Established) {
                self.send_dreq(now, old, Vec::new());
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.reject_req(from, tid, &req, RejReason::InvalidServiceId, Vec::new());
            return;
        }
        if req.primary_path.remote_gid != self.cfg.local_gid {
            // rxe answers REJ 12 with its GID in the ARI (lab README).
            let ari = self.cfg.local_gid.0.to_vec();
            self.reject_req(from, tid, &req, RejReason::InvalidGid, ari);
            return;
        }
        if req.transport_service_type != 0 {
            self.reject_req(from, tid, &req, RejReason::InvalidTransportType, Vec::new());
            return;
        }
        if mtu_from_code(req.path_mtu).is_none() {
            self.reject_req(from, tid, &req, RejReason::InvalidMtu, Vec::new());
            return;
        }
        let id = self.new_comm_id();
        let peer_timeout = self.timeout(req.local_cm_response_timeout);
        self.by_remote.insert((req.local_ca_guid, req.local_comm_id), id);
        self.by_qpn.insert((req.local_ca_guid, req.local_qpn), id);
        // Only rdma_cm's port spaces carry the rdma_cm header; a raw service's private data
        // (IPoIB-CM's 8 octets, say) is the application's, whatever its octets look like.
        let cma = crate::cm::cma::parse_service_id(req.service_id).and_then(|_| CmaHdr::parse(&req.private_data).ok());
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                active: false,
                peer: from,
                remote_comm_id: req.local_comm_id,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                req: req.clone(),
                rep: None,
                tid,
                last: None,
                timer: None,
                retries: 0,
                peer_timeout,
                max_retries: req.max_cm_retries,
                min_rnr_timer: 12,
            },
        );
        self.events.push_back(CmEvent::ConnectRequest(Box::new(ConnectRequest {
            id: CmId(id),
            from,
            service_id: req.service_id,
            req,
            cma,
        })));
    }

    pub(super) fn on_rep(&mut self, _now: Instant, rep: Rep) {
        let id = rep.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id) else {
            self.stats.dropped += 1;
            return;
        };
        if !c.active {
            self.stats.dropped += 1;
            return;
        }
        match c.state {
            State::ReqSent | State::MraReqRcvd => {
                c.state = State::RepRcvd;
                c.timer = None;
                c.last = None;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_ca_guid = rep.local_ca_guid;
                c.remote_qpn = rep.local_qpn;
                c.rep = Some(rep.clone());
                let qp = qp_params(c);
                self.by_remote.insert((rep.local_ca_guid, rep.local_comm_id), id);
                self.events.push_back(CmEvent::ConnectReply {
                    id: CmId(id),
                    rep: Box::new(rep),
                    qp,
                });
            }
            _ if c.remote_comm_id != rep.local_comm_id => self.stats.dropped += 1,
            // cm_dup_rep_handler: the RTU was lost, send it again.
            State::Established => {
                self.stats.duplicates += 1;
                self.resend_last(id);
            }
            // A repeat while the application has not sent the RTU: Linux's cm_dup_rep_handler
            // repeats an MRA only if the application sent one ([`Cm::mra`]).
            State::MraRepSent => {
                self.stats.duplicates += 1;
                self.resend_last(id);
            }
            State::RepRcvd => self.stats.duplicates += 1,
            _ => self.stats.dropped += 1,
        }
    }

    pub(super) fn establish_passive(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::Established;
        c.timer = None;
        let qp = qp_params(c);
        self.events.push_back(CmEvent::Established { id: CmId(id), qp });
    }

    pub(super) fn on_rtu(&mut self, rtu: Rtu) {
        match self.conns.get(&rtu.remote_comm_id) {
            Some(c)
                if !c.active
                    && c.remote_comm_id == rtu.local_comm_id
                    && matches!(c.state, State::RepSent | State::MraRepRcvd) =>
            {
                self.establish_passive(rtu.remote_comm_id)
            }
            Some(c) if c.state == State::Established && !c.active => self.stats.duplicates += 1,
            _ => self.stats.dropped += 1,
        }
    }
}

/// The QP attributes of a connection, from the REQ and REP (Linux `cm_init_qp_rtr_attr`,
/// `cm_init_qp_rts_attr`). Starting PSNs: each message's is the PSN its sender expects to
/// receive (lab README "PSN direction").
fn qp_params(c: &Conn) -> QpParams {
    let req = &c.req;
    let rep = c.rep.as_ref();
    let path = &req.primary_path;
    // The peer's GID as the REQ names it.
    let (dgid, sgid) = if c.active {
        (path.remote_gid, path.local_gid)
    } else {
        (path.local_gid, path.remote_gid)
    };
    let rep_qpn = rep.map_or(0, |r| r.local_qpn);
    let rep_psn = rep.map_or(0, |r| r.starting_psn);
    let rep_rr = rep.map_or(0, |r| r.responder_resources);
    let rep_id = rep.map_or(0, |r| r.initiator_depth);
    let rep_rnr = rep.map_or(0, |r| r.rnr_retry_count);
    let (dest_qp_num, rq_psn, sq_psn, max_dest_rd_atomic, max_rd_atomic, rnr_retry) = if c.active {
        (
            rep_qpn,
            req.starting_psn,
            rep_psn,
            req.responder_resources.min(rep_id),
            req.initiator_depth.min(rep_rr),
            rep_rnr,
        )
    } else {
        (
            req.local_qpn,
            rep_psn,
            req.starting_psn,
            rep_rr,
            rep_id,
            req.rnr_retry_count,
        )
    };
    let mut ah = AhAttr::to_gid(dgid);
    ah.flow_label = path.flow_label;
    ah.hop_limit = path.hop_limit;
    ah.traffic_class = path.traffic_class;
    ah.sl = path.sl;
    QpParams {
        rtr: RtrAttr {
            ah_attr: ah,
            path_mtu: req.mtu().unwrap_or(Mtu::Mtu1024),
            dest_qp_num,
            rq_psn,
            max_dest_rd_atomic,
            min_rnr_timer: c.min_rnr_timer,
        },
        rts: RtsAttr {
            sq_psn,
            timeout: path.local_ack_timeout,
            retry_cnt: req.retry_count,
            rnr_retry,
            max_rd_atomic,
        },
        local_gid: sgid,
        pkey: req.pkey,
    }
}
