//! The IB CM connection state machine (IBA vol. 1 ch. 12; §12.9 unconfirmed), sans-I/O in the quinn-proto style:
//! one [`Cm`] per port is fed received MADs ([`Cm::handle_mad`]), application commands
//! ([`Cm::listen`], [`Cm::connect`], [`Cm::accept`], [`Cm::reject`], [`Cm::rtu`],
//! [`Cm::disconnect`]) and the clock ([`Cm::handle_timeout`]), and is drained with
//! [`Cm::poll_transmit`], [`Cm::poll_event`] and [`Cm::poll_timeout`]. It does no I/O, reads no
//! clock and draws randomness only from the seed in [`CmConfig`].
//!
//! ```text
//!  active                                   passive
//!  connect ── REQ ────────────────────────▶ ReqRcvd ── ConnectRequest event
//!  ReqSent  (retransmitted every             │   (a repeated REQ while the application
//!   │        peer response timeout)          │    has not answered: MRA, MraReqSent)
//!   │ ◀──────────────────────────── REP ──  accept → RepSent (REP retransmitted)
//!  RepRcvd ── ConnectReply event             │
//!  rtu ── RTU ───────────────────────────▶  Established ── Established event
//!  Established ── Established event
//!  disconnect ── DREQ ───────────────────▶  DREP, TimeWait ── Disconnected event
//!  DreqSent ◀─────────────────────── DREP
//!  TimeWait ── Disconnected event; TimeWaitExit after the time-wait
//! ```
//!
//! Timers (C1.7): a message that wants an answer (REQ, REP, DREQ) is sent again after the
//! peer's CM response timeout (4.096 µs × 2^t) plus twice the packet life time, up to the max
//! CM retries of the REQ; then REQ and REP end in REJ "timeout" (IBA vol. 1 table 109, inferred, code 4;
//! [`RejReason::Timeout`]; code 1 is "no QP") with our CA GUID as ARI, as Linux's
//! `cm_destroy_id` does, and a [`CmEvent::TimedOut`]; DREQ ends in time-wait. An MRA stops
//! the retransmission and waits the service timeout it announces.
//!
//! SIDR (IBA vol. 1 §12.11 (unconfirmed), for UD; requirement D3 and issue 14): [`Cm::sidr_request`] sends a
//! SIDR_REQ that is sent again, unchanged (same TID and request ID, as Linux's MAD layer
//! does), every peer response timeout up to the max CM retries, then ends in
//! [`CmEvent::SidrTimedOut`]; the SIDR_REP matched by request ID ends it in
//! [`CmEvent::SidrReply`]. A SIDR_REQ for a service ID we listen on becomes a
//! [`CmEvent::SidrRequest`] for [`Cm::sidr_reply`]; one for any other service ID is
//! answered at once with status 1 (service ID not supported, Linux `cm_sidr_req_handler`).
//! A repeat of a SIDR_REQ still waiting for the application is dropped (counted as a
//! duplicate, as Linux does); a repeat after the answer (the SIDR_REP was lost) gets the
//! same SIDR_REP again for the time-wait. At most [`MAX_SIDR_PENDING`] requests wait for
//! the application; more are dropped (the requester retries).
//!
//! Matching (C1.7): REP/RTU/MRA/REJ/DREQ/DREP are found by their remote comm ID (our local
//! one); a repeated REQ by (remote CA GUID, remote comm ID); a new REQ whose (CA GUID, QPN)
//! belongs to a live connection gets REJ 10 and the old connection a DREQ (Linux, measured).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use verbs::{AhAttr, Gid, Mtu, RtrAttr, RtsAttr};

use super::cma::{CmaError, CmaHdr};
use super::mad::{
    CmMsg, DREQ_PDATA, Drep, Dreq, Mad, MadError, MadHeader, Mra, MsgType, Path, REJ_ARI, REJ_PDATA, REP_PDATA,
    REQ_PDATA, RTU_PDATA, Rej, RejReason, Rep, Req, Rtu, SIDR_REP_PDATA, SIDR_REQ_PDATA, SidrRep, SidrReq, SidrStatus,
    mtu_from_code,
};

/// 4.096 µs × 2^t, the IBA time code (t is at most 31).
pub fn iba_time(t: u8) -> Duration {
    Duration::from_nanos(4096u64 << u32::from(t.min(31)))
}

/// Per-port settings of the CM.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// Our CA (node) GUID, sent in REQ/REP and as the ARI of a REJ "timeout".
    pub ca_guid: u64,
    /// Our port GID (RoCEv2: the IPv4-mapped or IPv6 address the device is bound to).
    pub local_gid: Gid,
    /// The P_Key our REQs carry (0xffff by default).
    pub pkey: u16,
    /// The CM response timeout we announce and assume of peers (rdma_cm: 20, ≈ 4.3 s).
    pub cm_response_timeout: u8,
    /// Max CM retries we put into our REQs (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// The path's packet life time code; twice it is added to every CM timeout (Linux
    /// `cm_convert_to_ms(packet_life_time) * 2`; rdma_cm on RoCE uses 16 ≈ 268 ms).
    pub packet_life_time: u8,
    /// The service timeout we announce in an MRA (rdma_cm: 24 ≈ 69 s).
    pub mra_service_timeout: u8,
    /// How long a connection stays in time-wait after DREQ/DREP.
    pub time_wait: Duration,
    /// Seed of the comm ID and TID generator (tests use a fixed one).
    pub seed: u64,
}

impl CmConfig {
    /// rdma_cm's defaults for a port with GID `local_gid`.
    pub fn new(ca_guid: u64, local_gid: Gid, seed: u64) -> CmConfig {
        CmConfig {
            ca_guid,
            local_gid,
            pkey: 0xffff,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: 16,
            mra_service_timeout: 24,
            time_wait: Duration::from_secs(1),
            seed,
        }
    }
}

/// A connection: its local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// What [`Cm::connect`] sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The peer's port GID (REQ primary remote GID, and where the MAD goes).
    pub remote_gid: Gid,
    /// The ServiceID the REQ is for (rdma_cm: port space and port).
    pub service_id: u64,
    /// Our RC QP.
    pub qpn: u32,
    /// The PSN our QP expects to receive first (the peer's send PSN).
    pub starting_psn: u32,
    /// Inbound RDMA Reads/atomics we accept (our max_dest_rd_atomic).
    pub responder_resources: u8,
    /// RDMA Reads/atomics we issue at once (our max_rd_atomic).
    pub initiator_depth: u8,
    /// The path MTU for both QPs (the REQ's 4-bit Path MTU).
    pub path_mtu: Mtu,
    /// Transport retries (3 bits) for both QPs.
    pub retry_count: u8,
    /// RNR retries the peer should use towards us (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Local ACK timeout code for both QPs (5 bits).
    pub local_ack_timeout: u8,
    /// Hop Limit of the primary path (the IP TTL on RoCEv2).
    pub hop_limit: u8,
    /// Traffic Class of the primary path (the IP DSCP/ECN octet on RoCEv2).
    pub traffic_class: u8,
    /// Flow Label of the primary path (20 bits).
    pub flow_label: u32,
    /// Our QP takes receive WQEs from a shared receive queue (the REQ's SRQ bit).
    pub srq: bool,
    /// Up to 92 octets (for an rdma_cm peer: [`CmaHdr::req_private_data`]).
    pub private_data: Vec<u8>,
}

impl ConnectParams {
    /// An rdma_cm-style connect: service ID of `dst`'s port in RDMA_PS_TCP, the rdma_cm header
    /// from `src` and `dst`, then `ulp` (≤ 56 octets). Path MTU 1024, retries 7, RNR retries 7,
    /// local ACK timeout 18, hop limit 64, responder resources and initiator depth 1 (what the
    /// Linux REQ in the lab capture carries).
    pub fn rdma_cm(
        src: std::net::SocketAddr,
        dst: std::net::SocketAddr,
        qpn: u32,
        starting_psn: u32,
        ulp: &[u8],
    ) -> Result<ConnectParams, CmaError> {
        let hdr = CmaHdr { src, dst: dst.ip() };
        Ok(ConnectParams {
            remote_gid: Gid::from_ip(dst.ip()),
            service_id: super::cma::service_id(super::cma::PortSpace::Tcp, dst.port()),
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            path_mtu: Mtu::Mtu1024,
            retry_count: 7,
            rnr_retry_count: 7,
            local_ack_timeout: 18,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            srq: false,
            private_data: hdr.req_private_data(ulp)?,
        })
    }

    /// A REQ to a raw IB service ID (no rdma_cm header): `private_data` goes as given (at
    /// most 92 octets), the other fields as [`ConnectParams::rdma_cm`] sets them. IPoIB
    /// connected mode (RFC 4755 §3.1) connects this way.
    pub fn ib_service(
        remote_gid: Gid,
        service_id: u64,
        qpn: u32,
        starting_psn: u32,
        private_data: &[u8],
    ) -> ConnectParams {
        ConnectParams {
            remote_gid,
            service_id,
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            path_mtu: Mtu::Mtu1024,
            retry_count: 7,
            rnr_retry_count: 7,
            local_ack_timeout: 18,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            srq: false,
            private_data: private_data.to_vec(),
        }
    }
}

/// What [`Cm::accept`] answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our RC QP (24 bits; the REP's Local QPN).
    pub qpn: u32,
    /// The PSN our QP expects to receive first.
    pub starting_psn: u32,
    /// Inbound Reads/atomics we accept (≤ the REQ's initiator depth is sensible).
    pub responder_resources: u8,
    /// Reads/atomics we issue (≤ the REQ's responder resources).
    pub initiator_depth: u8,
    /// RNR retries the peer should use towards us (3 bits).
    pub rnr_retry_count: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// Our QP takes receive WQEs from a shared receive queue (the REP's SRQ bit).
    pub srq: bool,
    /// Our QP's minimum RNR NAK timer code (local, not on the wire).
    pub min_rnr_timer: u8,
    /// Up to 196 octets.
    pub private_data: Vec<u8>,
}

/// Everything the provider needs to move its QP INIT → RTR → RTS for this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpParams {
    /// The INIT → RTR attributes (path, path MTU, remote QPN, receive PSN, responder resources, RNR timer).
    pub rtr: RtrAttr,
    /// The RTR → RTS attributes (send PSN, ACK timeout, retries, RNR retries, initiator depth).
    pub rts: RtsAttr,
    /// Our port GID, the source of the QP's path.
    pub local_gid: Gid,
    /// The connection's P_Key.
    pub pkey: u16,
}

/// A REQ delivered to a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The passive side's ID for the connection.
    pub id: CmId,
    /// Where the REQ came from (the address answers go to).
    pub from: Gid,
    /// The ServiceID the REQ is for.
    pub service_id: u64,
    /// The REQ as received (remote QPN, PSN, MTU, path, private data, …).
    pub req: Req,
    /// The rdma_cm header in its private data, if it has a valid one.
    pub cma: Option<CmaHdr>,
}

/// A SIDR exchange: the request ID of the SIDR_REQ we sent (active), or our own handle of a
/// SIDR_REQ received (passive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SidrId(pub u32);

/// Requests received and not yet answered, at most (more are dropped; the requester retries).
pub const MAX_SIDR_PENDING: usize = 1024;
/// Answered requests remembered to answer a repeat, at most (the oldest go first).
pub const MAX_SIDR_ANSWERED: usize = 4096;

/// A SIDR_REQ delivered to a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRequest {
    /// Our handle for the answer ([`Cm::sidr_reply`]).
    pub id: SidrId,
    /// Where the SIDR_REQ came from (the SIDR_REP goes there).
    pub from: Gid,
    /// The SIDR_REQ as received (request ID, P_Key, service ID, 216 octets of private data).
    pub req: SidrReq,
    /// The rdma_cm header at the start of its private data, if it has a valid one.
    pub cma: Option<CmaHdr>,
}

/// Events for the application and the provider, drained with [`Cm::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive: a REQ for a service we listen on. Answer with [`Cm::accept`] or
    /// [`Cm::reject`].
    ConnectRequest(Box<ConnectRequest>),
    /// Active: the REP arrived. Move the QP to RTR and RTS with `qp`, then call [`Cm::rtu`]
    /// (or [`Cm::reject`]).
    ConnectReply {
        /// The connection.
        id: CmId,
        /// The REP as received.
        rep: Box<Rep>,
        /// The QP attributes the REQ and REP agree on.
        qp: QpParams,
    },
    /// Both sides: the connection is up (active: RTU sent; passive: RTU or first data).
    Established {
        /// The connection.
        id: CmId,
        /// The QP attributes the REQ and REP agree on.
        qp: QpParams,
    },
    /// The peer rejected our REQ or REP, or gave up on a connection (a REJ after our RTU:
    /// the connection is in time-wait then; the QP should go to ERR).
    Rejected {
        /// The connection.
        id: CmId,
        /// The REJ's reason.
        reason: RejReason,
        /// The REJ's additional reject information.
        ari: Vec<u8>,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// A REQ or REP got no answer after all retries (a REJ "timeout" was sent).
    TimedOut {
        /// The connection.
        id: CmId,
    },
    /// The connection is down: the peer's DREQ (with its private data), the DREP to ours, or
    /// our DREQ timed out (`private_data` empty). The QP should go to ERR.
    Disconnected {
        /// The connection.
        id: CmId,
        /// The DREQ's or DREP's private data (empty on a timeout).
        private_data: Vec<u8>,
    },
    /// The time-wait is over; the ID is forgotten.
    TimeWaitExit {
        /// The connection.
        id: CmId,
    },
    /// Passive: a SIDR_REQ for a service we listen on. Answer with [`Cm::sidr_reply`].
    SidrRequest(Box<SidrRequest>),
    /// Active: the SIDR_REP to our SIDR_REQ (any status; 0 is a resolved QPN and Q_Key).
    SidrReply {
        /// The request.
        id: SidrId,
        /// The SIDR_REP as received.
        rep: Box<SidrRep>,
    },
    /// Active: no SIDR_REP after all retries.
    SidrTimedOut {
        /// The request.
        id: SidrId,
    },
}

/// Application command errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No connection has this ID (never existed, or forgotten after time-wait).
    #[error("no connection {0:?}")]
    UnknownId(CmId),
    /// The connection's state does not allow the command.
    #[error("connection {id:?} is in state {state:?}, which does not allow this")]
    State {
        /// The connection.
        id: CmId,
        /// Its state.
        state: State,
    },
    /// Private data or ARI longer than the message holds.
    #[error("{what} of {len} octets, the message holds {max}")]
    TooLong {
        /// The field ("REP private data", ...).
        what: &'static str,
        /// Octets given.
        len: usize,
        /// Octets the field holds.
        max: usize,
    },
    /// No SIDR exchange has this ID (never existed, answered already, or timed out).
    #[error("no SIDR request {0:?}")]
    UnknownSidr(SidrId),
    /// Another listener has this ServiceID.
    #[error("service ID {0:#018x} already has a listener")]
    AlreadyListening(u64),
    /// A value does not fit its MAD field.
    #[error("field out of range: {0}")]
    Mad(#[from] MadError),
}

/// Connection states (IBA vol. 1 §12.9.6 (unconfirmed), Linux `enum ib_cm_state` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Active: REQ sent, waiting for the REP.
    ReqSent,
    /// Active: the peer MRAed our REQ, waiting longer for the REP.
    MraReqRcvd,
    /// Passive: REQ received, the application has not answered.
    ReqRcvd,
    /// Passive: we MRAed the REQ.
    MraReqSent,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    /// Passive: the peer MRAed our REP, waiting longer for the RTU.
    MraRepRcvd,
    /// Active: REP received, the RTU not yet sent.
    RepRcvd,
    /// Active: we MRAed the REP.
    MraRepSent,
    /// The connection is up.
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// Disconnected; the ID and QP are held until the time-wait ends.
    TimeWait,
}

/// Counters, for tests and `info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmStats {
    /// MADs that did not parse or matched nothing and were dropped.
    pub dropped: u64,
    /// Messages sent again because their timer ran out.
    pub retransmits: u64,
    /// Repeated messages from the peer answered from state (REP again, RTU again, DREP again).
    pub duplicates: u64,
}

#[derive(Debug)]
struct Conn {
    state: State,
    active: bool,
    peer: Gid,
    remote_comm_id: u32,
    remote_ca_guid: u64,
    remote_qpn: u32,
    /// The REQ we sent or received.
    req: Req,
    /// The REP we sent or received.
    rep: Option<Rep>,
    /// TID of the REQ (REP and RTU reuse it).
    tid: u64,
    /// The last message we sent that a repeat of the peer's message is answered with, or
    /// that the timer resends.
    last: Option<Mad>,
    timer: Option<Instant>,
    retries: u8,
    /// How long the peer may take to answer us.
    peer_timeout: Duration,
    max_retries: u8,
    min_rnr_timer: u8,
}

/// A SIDR_REQ we sent, waiting for its SIDR_REP.
#[derive(Debug)]
struct SidrOut {
    peer: Gid,
    mad: Mad,
    timer: Instant,
    retries: u8,
}

/// A SIDR_REQ we received: waiting for the application (`answer` empty), or answered and
/// remembered until `expires` to answer a repeat.
#[derive(Debug)]
struct SidrIn {
    peer: Gid,
    request_id: u32,
    tid: u64,
    service_id: u64,
    answer: Option<(Mad, Instant)>,
}

/// The CM of one port.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    rng: StdRng,
    tid_hi: u32,
    tid_lo: u32,
    listeners: HashSet<u64>,
    conns: HashMap<u32, Conn>,
    /// (remote CA GUID, remote comm ID) → local comm ID, for repeated REQs.
    by_remote: HashMap<(u64, u32), u32>,
    /// (remote CA GUID, remote QPN) → local comm ID of live connections (stale check).
    by_qpn: HashMap<(u64, u32), u32>,
    /// Our SIDR_REQs by request ID.
    sidr_out: HashMap<u32, SidrOut>,
    /// SIDR_REQs received, by our handle.
    sidr_in: HashMap<u32, SidrIn>,
    /// (sender, request ID) → our handle, for repeated SIDR_REQs.
    sidr_by_remote: HashMap<(Gid, u32), u32>,
    /// Answered handles in the order they were answered (expiry and the bound).
    sidr_answered: VecDeque<u32>,
    tx: VecDeque<(Gid, Mad)>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
}

fn check_len(what: &'static str, v: &[u8], max: usize) -> Result<(), CmError> {
    if v.len() > max {
        Err(CmError::TooLong {
            what,
            len: v.len(),
            max,
        })
    } else {
        Ok(())
    }
}

impl Cm {
    /// The CM of a port with `cfg`, no listeners and no connections.
    pub fn new(cfg: CmConfig) -> Cm {
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        let tid_hi = rng.random();
        Cm {
            cfg,
            rng,
            tid_hi,
            tid_lo: 0,
            listeners: HashSet::new(),
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            by_qpn: HashMap::new(),
            sidr_out: HashMap::new(),
            sidr_in: HashMap::new(),
            sidr_by_remote: HashMap::new(),
            sidr_answered: VecDeque::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// The settings it was created with.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// The state of a connection, if it exists.
    pub fn state(&self, id: CmId) -> Option<State> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    /// Number of connections (in any state, time-wait included).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    // ---- drains -------------------------------------------------------------------------

    /// The next MAD to send and the GID it goes to (QP1 there, Q_Key 0x80010000).
    pub fn poll_transmit(&mut self) -> Option<(Gid, Mad)> {
        self.tx.pop_front()
    }

    /// The next event for the application or the provider, in order.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest time [`Cm::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(|c| c.timer);
        let out = self.sidr_out.values().map(|o| o.timer);
        let answered = self
            .sidr_answered
            .front()
            .and_then(|h| self.sidr_in.get(h))
            .and_then(|i| i.answer.as_ref().map(|a| a.1));
        conns.chain(out).chain(answered).min()
    }

    /// SIDR_REQs sent and not yet answered or timed out.
    pub fn sidr_pending(&self) -> usize {
        self.sidr_out.len()
    }

    /// SIDR_REQs received: waiting for the application, and answered ones remembered.
    pub fn sidr_received(&self) -> usize {
        self.sidr_in.len()
    }

    // ---- commands -----------------------------------------------------------------------

    /// Accepts REQs for `service_id` (C1.7 "listen by service ID").
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listeners.insert(service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        Ok(())
    }

    /// Stops accepting REQs for `service_id`; later ones get REJ 8.
    pub fn unlisten(&mut self, service_id: u64) -> bool {
        self.listeners.remove(&service_id)
    }

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

    /// Asks the peer for patience (MRA, IBA vol. 1 §12.6.6 (unconfirmed)): passive before [`Cm::accept`], active
    /// before [`Cm::rtu`]. The peer stops retransmitting and waits the service timeout of
    /// [`CmConfig::mra_service_timeout`]; a repeat of its message gets the MRA again. (Without
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

    /// A MAD that arrived on QP1 from `from` (the sender's GID). Returns an error (and counts
    /// it) when the MAD does not parse; a MAD that parses but matches nothing is dropped and
    /// counted, or answered as the IBA and Linux do (REJ 8, REJ 10, DREP).
    pub fn handle_mad(&mut self, now: Instant, mad: &[u8], from: Gid) -> Result<(), MadError> {
        let m = match Mad::parse(mad) {
            Ok(m) => m,
            Err(e) => {
                self.stats.dropped += 1;
                return Err(e);
            }
        };
        let tid = m.hdr.tid;
        match m.msg {
            CmMsg::Req(req) => self.on_req(now, tid, req, from),
            CmMsg::Rep(rep) => self.on_rep(now, rep),
            CmMsg::Rtu(rtu) => self.on_rtu(rtu),
            CmMsg::Mra(mra) => self.on_mra(now, mra),
            CmMsg::Rej(rej) => self.on_rej(now, rej),
            CmMsg::Dreq(dreq) => self.on_dreq(now, tid, dreq, from),
            CmMsg::Drep(drep) => self.on_drep(now, drep),
            CmMsg::SidrReq(req) => self.on_sidr_req(tid, req, from),
            CmMsg::SidrRep(rep) => self.on_sidr_rep(rep),
        }
        Ok(())
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.timer.is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.on_timer(now, id);
        }
        let due: Vec<u32> = self
            .sidr_out
            .iter()
            .filter(|(_, o)| o.timer <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let retry = self.timeout(self.cfg.cm_response_timeout);
            let max = self.cfg.max_cm_retries;
            let Some(o) = self.sidr_out.get_mut(&id) else { continue };
            if o.retries < max {
                o.retries += 1;
                o.timer = now + retry;
                self.stats.retransmits += 1;
                self.tx.push_back((o.peer, o.mad.clone()));
            } else {
                self.sidr_out.remove(&id);
                self.events.push_back(CmEvent::SidrTimedOut { id: SidrId(id) });
            }
        }
        while let Some(&h) = self.sidr_answered.front() {
            let expired = self
                .sidr_in
                .get(&h)
                .is_none_or(|i| i.answer.as_ref().is_none_or(|a| a.1 <= now));
            if !expired {
                break;
            }
            self.sidr_answered.pop_front();
            self.forget_sidr_in(h);
        }
    }

    // ---- internals ----------------------------------------------------------------------

    fn timeout(&self, t: u8) -> Duration {
        iba_time(t) + 2 * iba_time(self.cfg.packet_life_time)
    }

    fn new_comm_id(&mut self) -> u32 {
        loop {
            let id: u32 = self.rng.random();
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn new_tid(&mut self) -> u64 {
        self.tid_lo = self.tid_lo.wrapping_add(1);
        (u64::from(self.tid_hi) << 32) | u64::from(self.tid_lo)
    }

    fn remove(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            if c.remote_comm_id != 0 {
                self.by_remote.remove(&(c.remote_ca_guid, c.remote_comm_id));
            }
            if self.by_qpn.get(&(c.remote_ca_guid, c.remote_qpn)) == Some(&id) {
                self.by_qpn.remove(&(c.remote_ca_guid, c.remote_qpn));
            }
        }
    }

    fn send(&mut self, to: Gid, tid: u64, msg: CmMsg) {
        self.tx.push_back((
            to,
            Mad {
                hdr: MadHeader::with_tid(tid),
                msg,
            },
        ));
    }

    fn resend_last(&mut self, id: u32) {
        if let Some(c) = self.conns.get(&id)
            && let Some(m) = &c.last
        {
            self.tx.push_back((c.peer, m.clone()));
        }
    }

    fn reject_req(&mut self, to: Gid, tid: u64, req: &Req, reason: RejReason, ari: Vec<u8>) {
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

    fn on_req(&mut self, now: Instant, tid: u64, req: Req, from: Gid) {
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
        let cma = super::cma::parse_service_id(req.service_id).and_then(|_| CmaHdr::parse(&req.private_data).ok());
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

    fn forget_sidr_in(&mut self, h: u32) {
        if let Some(i) = self.sidr_in.remove(&h)
            && self.sidr_by_remote.get(&(i.peer, i.request_id)) == Some(&h)
        {
            self.sidr_by_remote.remove(&(i.peer, i.request_id));
        }
    }

    fn on_sidr_req(&mut self, tid: u64, req: SidrReq, from: Gid) {
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
        let cma = super::cma::parse_service_id(req.service_id).and_then(|_| CmaHdr::parse(&req.private_data).ok());
        self.events.push_back(CmEvent::SidrRequest(Box::new(SidrRequest {
            id: SidrId(h),
            from,
            req,
            cma,
        })));
    }

    fn on_sidr_rep(&mut self, rep: SidrRep) {
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

    fn on_rep(&mut self, _now: Instant, rep: Rep) {
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

    fn establish_passive(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::Established;
        c.timer = None;
        let qp = qp_params(c);
        self.events.push_back(CmEvent::Established { id: CmId(id), qp });
    }

    fn on_rtu(&mut self, rtu: Rtu) {
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

    fn on_mra(&mut self, now: Instant, mra: Mra) {
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

    fn on_rej(&mut self, now: Instant, rej: Rej) {
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

    /// Time-wait (IBA vol. 1 §12.9.6.9 (unconfirmed)): the connection answers repeated DREQs and is forgotten
    /// after [`CmConfig::time_wait`]. It no longer blocks a new REQ from the same QP (Linux
    /// accepted the same (CA GUID, QPN) right after DREQ/DREP, lab README).
    fn enter_time_wait(&mut self, now: Instant, id: u32) {
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

    fn send_dreq(&mut self, now: Instant, id: u32, private_data: Vec<u8>) {
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

    fn on_dreq(&mut self, now: Instant, tid: u64, dreq: Dreq, from: Gid) {
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

    fn on_drep(&mut self, now: Instant, drep: Drep) {
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

    fn on_timer(&mut self, now: Instant, id: u32) {
        let ca_guid = self.cfg.ca_guid;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.timer = None;
        match c.state {
            State::ReqSent | State::RepSent | State::DreqSent if c.retries < c.max_retries => {
                c.retries += 1;
                c.timer = Some(now + c.peer_timeout);
                self.stats.retransmits += 1;
                self.resend_last(id);
            }
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                // Retries exhausted, or the MRA's service timeout passed: REJ "timeout" with
                // our CA GUID as ARI (IBA vol. 1 §12.6.7 (unconfirmed); Linux cm_destroy_id).
                let message_rejected = if c.active { MsgType::Req } else { MsgType::Rep };
                let rej = CmMsg::Rej(Rej {
                    local_comm_id: id,
                    remote_comm_id: c.remote_comm_id,
                    message_rejected,
                    reason: RejReason::Timeout,
                    ari: ca_guid.to_be_bytes().to_vec(),
                    private_data: Vec::new(),
                });
                let (peer, tid) = (c.peer, c.tid);
                self.send(peer, tid, rej);
                self.remove(id);
                self.events.push_back(CmEvent::TimedOut { id: CmId(id) });
            }
            State::DreqSent => {
                // The peer never answered our DREQ: the connection is down all the same.
                self.enter_time_wait(now, id);
                self.events.push_back(CmEvent::Disconnected {
                    id: CmId(id),
                    private_data: Vec::new(),
                });
            }
            State::TimeWait => {
                self.remove(id);
                self.events.push_back(CmEvent::TimeWaitExit { id: CmId(id) });
            }
            _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iba_time_codes() {
        assert_eq!(iba_time(0), Duration::from_nanos(4096));
        // 20 → 4.294967296 s, rdma_cm's CM response timeout.
        assert_eq!(iba_time(20), Duration::from_nanos(4_294_967_296));
        assert_eq!(iba_time(40), iba_time(31));
    }
}
