//! The RoCEv2 device's connection manager: the rdma_cm-style verbs CM
//! ([`verbs::cm::backend::CmBackend`]) carried by the IB CM ([`crate::cm::Cm`]) over the
//! device's QP1 ([`GsiPort`]), the way Linux's rdma_cm runs on rxe.
//!
//! # Model
//!
//! One [`GsiCm`] per device holds one [`Cm`] machine behind a mutex and one timer thread
//! (`softrdma-roce-cm`) that sleeps until the machine's next timeout (MAD retransmission,
//! MRA wait, time-wait) and is woken when a command arms an earlier one: no thread per
//! connection or listener. MADs come in through the [`GsiHandler`] the backend registers
//! on the port (the device's receive path calls it); everything the machine wants sent is
//! taken out under the mutex and sent, and every QP touched, after the mutex is released,
//! so the device may call back into the CM from `send_mad` or `modify_qp`.
//!
//! # What rdma_cm calls do here
//!
//! - `listen(addr)`: the service ID of `addr`'s port in RDMA_PS_TCP (`0x0106 << 16 |
//!   port`); port 0 picks a free one. REQs for a port nobody listens on get REJ 8 (invalid
//!   service ID), which the connector sees as [`verbs::Error::Rejected`] whose detail is a
//!   [`Rejection`] with [`RejReason::InvalidServiceId`].
//! - `connect`: a REQ with the rdma_cm header (our IP and a random source port, the
//!   destination IP) and the application's private data (≤ 56 octets), our QPN and a random
//!   starting PSN (the PSN our QP expects to receive: Linux's convention, lab README "PSN
//!   direction"). On the REP the QP goes INIT → RTR → RTS with the REP's QPN, PSN and the
//!   agreed responder resources / initiator depth, then the RTU goes out. A REJ ends the
//!   connect with `Rejected` (its private data and the [`Rejection`]); no answer after the
//!   CM's retries with `Timeout`.
//! - `accept`: RTR and RTS from the REQ (its starting PSN is the PSN we send from), then
//!   the REP (its starting PSN is the one our QP expects). `Established` reaches the QP's
//!   events when the RTU arrives. A lost REP is retransmitted; a lost RTU is recovered by
//!   the peer answering the retransmitted REP with another RTU.
//! - `reject(private_data)`: REJ 28 (consumer defined) with up to 148 octets.
//! - `disconnect`: the QP to ERR (its work requests flush, as `rdma_disconnect` does),
//!   then a DREQ; the peer's QP goes to ERR and gets `Disconnected`, and so does ours when
//!   the DREP (or the DREQ's timeout) comes.
//!
//! # The UDP port space and multicast (issue 14)
//!
//! - `listen_in(addr, Udp)`: the service ID of the port in RDMA_PS_UDP (`0x0111 << 16 |
//!   port`). A SIDR_REQ for it becomes a request whose `port_space()` is `Udp`;
//!   `accept_ud` answers with a SIDR_REP of status 0, the UD QP's number and the Q_Key
//!   [`verbs::RDMA_UDP_QKEY`]; `reject` with status 2 (rejected) and the private data
//!   (≤ 136); dropping it unanswered with status 2. A SIDR_REQ for a port nobody listens on
//!   gets status 1 (service ID not supported) from the IB CM, one whose rdma_cm header names
//!   another address status 2 (rdma_cm finds no listener and the IB CM rejects).
//! - `resolve_ud(addr)` (`QueuePair::connect_ud`): a SIDR_REQ with the rdma_cm header and
//!   the application's private data (≤ 180), sent again every CM response timeout up to the
//!   max CM retries. A SIDR_REP with status 0 and Q_Key `RDMA_UDP_QKEY` gives the listener's
//!   QPN, Q_Key and an address vector to its GID; another status ends in `Rejected` whose
//!   detail is a [`SidrRefusal`] (librdmacm: `RDMA_CM_EVENT_UNREACHABLE`, ECONNREFUSED), a
//!   different Q_Key in `Protocol` (Linux: UNREACHABLE, EINVAL), silence in `Timeout`.
//! - `multicast_group(ip)` (`QueuePair::join_multicast`): no SA on RoCEv2, so no MADs; the
//!   MGID is [`crate::cm::cma::iboe_mgid`] of the address, the Q_Key `RDMA_UDP_QKEY`, the
//!   remote QPN 0xFFFFFF, as Linux's `cma_iboe_join_multicast` reports them; the verbs
//!   then attach the QP (the engine joins the IP group on its socket).
//!
//! The IB CM carries fixed-size private data: a REQ delivers 56 octets to the listener, a
//! REP 196 and a REJ 148, the application's bytes followed by zeros, as librdmacm reports
//! them on InfiniBand and RoCE.
//!
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` C1 (numbered in [`crate::cm`]),
//! C1.8 (QP states driven by the CM) in particular.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use verbs::cm::RouteOptions;
use verbs::cm::backend::{CmBackend, ConnRequestOps, ListenerOps};
use verbs::notify::EventQueue;
use verbs::provider::QpOps;
use verbs::{
    AhAttr, ConnInfo, ConnParam, Error, ErrorDetail, Gid, InvalidArg, Mtu, QpAttr, QpState, RDMA_UDP_QKEY, Result,
    UdParam,
};

use crate::cm::cma::{CMA_HDR_LEN, CmaError, CmaHdr, PortSpace, iboe_mgid, parse_service_id, service_id};
use crate::cm::machine::{AcceptParams, Cm, CmConfig, CmEvent, CmId, ConnectParams, QpParams, SidrId};
use crate::cm::mad::{Mad, RejReason, Rep, SidrRep, SidrStatus};
use crate::gsi::{GsiHandler, GsiPort};

/// Settings of a device's connection manager.
#[derive(Debug, Clone)]
pub struct GsiCmConfig {
    /// The IB CM's settings (CA GUID, timeouts, retries, time-wait). Its `local_gid` is
    /// replaced by the port's GID.
    pub cm: CmConfig,
    /// The path MTU our REQs offer (rxe on a 1500-octet link: 1024).
    pub path_mtu: Mtu,
    /// The RNR retry count we ask the peer to use towards us (7: infinite).
    pub rnr_retry_count: u8,
    /// Our QPs' minimum RNR NAK timer code (IBA vol. 1 release 1.3 table 45; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Local ACK timeout code our REQs carry (rdma_cm on RoCE: 18 ≈ 1 s).
    pub local_ack_timeout: u8,
}

impl GsiCmConfig {
    /// rdma_cm's defaults, with CA GUID `ca_guid` and the random generator seeded by `seed`
    /// (comm IDs, TIDs, starting PSNs, source ports).
    pub fn new(ca_guid: u64, seed: u64) -> GsiCmConfig {
        GsiCmConfig {
            cm: CmConfig::new(ca_guid, Gid::default(), seed),
            path_mtu: Mtu::Mtu1024,
            rnr_retry_count: 7,
            min_rnr_timer: 12,
            local_ack_timeout: 18,
        }
    }
}

/// Why the IB CM peer refused a connection: the REJ's reason and additional reject
/// information, as the detail of [`verbs::Error::Rejected`] (downcast with
/// [`ErrorDetail::downcast_ref`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The REJ's reason (8: invalid service ID, 28: consumer reject, ...).
    pub reason: RejReason,
    /// The REJ's additional reject information.
    pub ari: Vec<u8>,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.reason {
            RejReason::NoQp => "no QP",
            RejReason::NoResources => "no resources",
            RejReason::Timeout => "the peer timed out",
            RejReason::Unsupported => "unsupported request",
            RejReason::InvalidServiceId => "invalid service ID (nobody listens on that port)",
            RejReason::InvalidTransportType => "invalid transport type",
            RejReason::StaleConn => "stale connection",
            RejReason::InvalidGid => "invalid GID",
            RejReason::InvalidMtu => "invalid MTU",
            RejReason::InsufficientRespResources => "insufficient responder resources",
            RejReason::ConsumerDefined => "consumer reject",
            RejReason::InvalidRnrRetry => "invalid RNR retry count",
            _ => "",
        };
        let code = u16::from(self.reason);
        if what.is_empty() {
            write!(f, "IB CM REJ {code} ({:?})", self.reason)
        } else {
            write!(f, "rejected: {what}, IB CM REJ {code}")
        }
    }
}

/// Why a UD listener was not resolved: the SIDR_REP's status (1: nobody listens on the port,
/// 2: the listener rejected), as the detail of [`verbs::Error::Rejected`] from
/// `QueuePair::connect_ud` (downcast with [`ErrorDetail::downcast_ref`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRefusal {
    /// The SIDR_REP's status.
    pub status: SidrStatus,
}

impl fmt::Display for SidrRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unreachable: {}", self.status)
    }
}

/// What the CM tells a waiting `connect_ud`.
enum SidrOutcome {
    Reply(Box<SidrRep>),
    TimedOut,
}

/// What the CM tells a waiting `connect`.
enum Outcome {
    Reply {
        rep: Box<Rep>,
        qp: QpParams,
    },
    Rejected {
        reason: RejReason,
        ari: Vec<u8>,
        private_data: Vec<u8>,
    },
    TimedOut,
}

/// The backend's record of one IB CM connection.
struct Conn {
    /// The QP bound to it (active: from connect; passive: from accept).
    qp: Option<Arc<dyn QpOps>>,
    /// Active, before the REP: where the connect call waits.
    waiter: Option<Sender<Outcome>>,
    /// `Disconnected` (or a failure) was reported to the QP already.
    down: bool,
}

struct Shared {
    cm: Cm,
    /// Listening port → the listener's request queue.
    listeners: HashMap<u16, Arc<EventQueue<Box<dyn ConnRequestOps>>>>,
    /// Listening port in the UDP port space → the listener's request queue.
    udp_listeners: HashMap<u16, Arc<EventQueue<Box<dyn ConnRequestOps>>>>,
    /// Raw IB service ID → the listener's request queue (`listen_ib_service`).
    ib_listeners: HashMap<u64, Arc<EventQueue<Box<dyn ConnRequestOps>>>>,
    /// Our SIDR_REQs → where `connect_ud` waits.
    sidr_waiters: HashMap<SidrId, Sender<SidrOutcome>>,
    conns: HashMap<CmId, Conn>,
    /// Local QPN → connection, for `disconnect`.
    by_qpn: HashMap<u32, CmId>,
    rng: StdRng,
    shutdown: bool,
}

/// What to do once the mutex is released.
enum Action {
    Send(Gid, Mad),
    Deliver(Arc<EventQueue<Box<dyn ConnRequestOps>>>, Box<dyn ConnRequestOps>),
    Wake(Sender<Outcome>, Outcome),
    WakeSidr(Sender<SidrOutcome>, SidrOutcome),
    /// Move the QP to ERR (if it is not there) and report the event.
    Down(Arc<dyn QpOps>, Option<verbs::CmEvent>),
    Event(u32, verbs::CmEvent),
}

struct Inner {
    port: Arc<dyn GsiPort>,
    cfg: GsiCmConfig,
    local_ip: IpAddr,
    s: Mutex<Shared>,
    wake: Condvar,
}

/// The RoCEv2 device's [`CmBackend`]: pass it to `verbs::provider::new_device`.
pub struct GsiCm {
    inner: Arc<Inner>,
    /// Registered (weakly) as the port's GSI handler.
    _handler: Arc<Handler>,
}

/// Receives QP1's MADs for the CM.
struct Handler {
    inner: Weak<Inner>,
}

impl GsiCm {
    /// The connection manager of the device behind `port`: registers itself as the port's
    /// GSI handler and starts the timer thread.
    pub fn new(port: Arc<dyn GsiPort>, mut cfg: GsiCmConfig) -> std::io::Result<Arc<GsiCm>> {
        let gid = port.local_gid();
        cfg.cm.local_gid = gid;
        let rng = StdRng::seed_from_u64(cfg.cm.seed ^ 0x5eed_c0de);
        let inner = Arc::new(Inner {
            port: port.clone(),
            local_ip: gid.to_ip(),
            s: Mutex::new(Shared {
                cm: Cm::new(cfg.cm.clone()),
                listeners: HashMap::new(),
                udp_listeners: HashMap::new(),
                ib_listeners: HashMap::new(),
                sidr_waiters: HashMap::new(),
                conns: HashMap::new(),
                by_qpn: HashMap::new(),
                rng,
                shutdown: false,
            }),
            wake: Condvar::new(),
            cfg,
        });
        let handler = Arc::new(Handler {
            inner: Arc::downgrade(&inner),
        });
        let weak: Weak<Handler> = Arc::downgrade(&handler);
        port.set_gsi_handler(weak);
        let t = inner.clone();
        std::thread::Builder::new()
            .name("softrdma-roce-cm".into())
            .spawn(move || t.timer_loop())?;
        Ok(Arc::new(GsiCm {
            inner,
            _handler: handler,
        }))
    }

    /// The IB CM's counters (MADs dropped, retransmitted, duplicates answered).
    pub fn stats(&self) -> crate::cm::CmStats {
        self.inner.lock().cm.stats()
    }

    /// Connections the IB CM holds (time-wait included).
    pub fn connections(&self) -> usize {
        self.inner.lock().cm.connections()
    }
}

impl Drop for GsiCm {
    fn drop(&mut self) {
        self.inner.lock().shutdown = true;
        self.inner.wake.notify_all();
    }
}

impl GsiHandler for Handler {
    fn on_mad(&self, from: Gid, src_qp: u32, _pkey: u16, mad: &[u8]) {
        let Some(inner) = self.inner.upgrade() else { return };
        inner.with(|s| {
            if let Err(e) = s.cm.handle_mad(Instant::now(), mad, from) {
                tracing::debug!(?from, src_qp, error = %e, "IB CM: MAD dropped");
            }
        });
    }
}

fn random_psn(rng: &mut StdRng) -> u32 {
    rng.random::<u32>() & 0x00ff_ffff
}

fn cma_err(e: CmaError) -> Error {
    match e {
        CmaError::TooLong { len, max } => InvalidArg::PrivateDataTooLong { len, max }.into(),
        other => InvalidArg::ConnParam(match other {
            CmaError::Mixed => "source and destination addresses are of different IP versions",
            _ => "rdma_cm header",
        })
        .into(),
    }
}

fn cm_err(e: crate::cm::CmError) -> Error {
    match e {
        crate::cm::CmError::TooLong { len, max, .. } => InvalidArg::PrivateDataTooLong { len, max }.into(),
        crate::cm::CmError::AlreadyListening(_) => Error::Io(std::io::ErrorKind::AddrInUse.into()),
        other => Error::Protocol(format!("IB CM: {other}")),
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.s.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn timer_loop(self: Arc<Self>) {
        let mut s = self.lock();
        loop {
            if s.shutdown {
                return;
            }
            let now = Instant::now();
            match s.cm.poll_timeout() {
                Some(t) if t <= now => {
                    s.cm.handle_timeout(now);
                    let acts = self.collect(&mut s);
                    drop(s);
                    self.run(acts);
                    s = self.lock();
                }
                Some(t) => {
                    s = self.wake.wait_timeout(s, t - now).unwrap_or_else(|p| p.into_inner()).0;
                }
                None => {
                    s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    /// Drains the machine: MADs to send and events turned into actions.
    fn collect(self: &Arc<Self>, s: &mut Shared) -> Vec<Action> {
        let mut acts = Vec::new();
        loop {
            while let Some((to, mad)) = s.cm.poll_transmit() {
                acts.push(Action::Send(to, mad));
            }
            let Some(ev) = s.cm.poll_event() else { break };
            self.on_event(s, ev, &mut acts);
        }
        acts
    }

    fn on_event(self: &Arc<Self>, s: &mut Shared, ev: CmEvent, acts: &mut Vec<Action>) {
        match ev {
            CmEvent::ConnectRequest(cr) => {
                let now = Instant::now();
                if let Some(queue) = s.ib_listeners.get(&cr.service_id).cloned() {
                    // A raw IB service: the private data as sent, no rdma_cm header.
                    s.conns.insert(
                        cr.id,
                        Conn {
                            qp: None,
                            waiter: None,
                            down: false,
                        },
                    );
                    let req = RoceConnRequest {
                        cm: Some(self.clone()),
                        id: cr.id,
                        sidr: None,
                        ib: Some((cr.service_id, cr.from)),
                        peer: SocketAddr::new(cr.from.to_ip(), 0),
                        local: SocketAddr::new(self.local_ip, 0),
                        private_data: cr.req.private_data.clone(),
                        param: ConnParam {
                            private_data: Vec::new(),
                            responder_resources: cr.req.responder_resources,
                            initiator_depth: cr.req.initiator_depth,
                        },
                    };
                    acts.push(Action::Deliver(queue, Box::new(req)));
                    return;
                }
                let port = parse_service_id(cr.service_id).map(|(_, p)| p);
                let Some(queue) = port.and_then(|p| s.listeners.get(&p)).cloned() else {
                    // The listener went away between the REQ and now.
                    let _ = s.cm.reject(now, cr.id, RejReason::InvalidServiceId, &[], &[]);
                    return;
                };
                let port = port.unwrap_or(0);
                let (peer, local, pdata) = match cr.cma {
                    Some(h) => (
                        h.src,
                        SocketAddr::new(h.dst, port),
                        cr.req.private_data.get(CMA_HDR_LEN..).unwrap_or(&[]).to_vec(),
                    ),
                    None => (
                        SocketAddr::new(cr.from.to_ip(), 0),
                        SocketAddr::new(self.local_ip, port),
                        cr.req.private_data.clone(),
                    ),
                };
                if cr.cma.is_some_and(|h| h.dst != self.local_ip) {
                    // rdma_cm answers a header naming another address with a consumer reject.
                    let _ = s.cm.reject(now, cr.id, RejReason::ConsumerDefined, &[], &[]);
                    return;
                }
                s.conns.insert(
                    cr.id,
                    Conn {
                        qp: None,
                        waiter: None,
                        down: false,
                    },
                );
                let req = RoceConnRequest {
                    cm: Some(self.clone()),
                    id: cr.id,
                    sidr: None,
                    ib: None,
                    peer,
                    local,
                    private_data: pdata,
                    param: ConnParam {
                        private_data: Vec::new(),
                        responder_resources: cr.req.responder_resources,
                        initiator_depth: cr.req.initiator_depth,
                    },
                };
                acts.push(Action::Deliver(queue, Box::new(req)));
            }
            CmEvent::ConnectReply { id, rep, qp } => {
                if let Some(w) = s.conns.get_mut(&id).and_then(|c| c.waiter.take()) {
                    acts.push(Action::Wake(w, Outcome::Reply { rep, qp }));
                }
            }
            CmEvent::Established { id, .. } => {
                if let Some(qp) = s.conns.get(&id).and_then(|c| c.qp.as_ref()) {
                    acts.push(Action::Event(qp.qp_num(), verbs::CmEvent::Established));
                }
            }
            CmEvent::Rejected {
                id,
                reason,
                ari,
                private_data,
            } => {
                let Some(c) = s.conns.get_mut(&id) else { return };
                if let Some(w) = c.waiter.take() {
                    acts.push(Action::Wake(
                        w,
                        Outcome::Rejected {
                            reason,
                            ari,
                            private_data,
                        },
                    ));
                } else if let Some(qp) = c.qp.clone()
                    && !c.down
                {
                    c.down = true;
                    let why = Rejection { reason, ari };
                    acts.push(Action::Down(
                        qp,
                        Some(verbs::CmEvent::ConnectionError(format!(
                            "the peer ended the connection ({why})"
                        ))),
                    ));
                }
                if s.cm.state(id).is_none() {
                    forget(s, id);
                }
            }
            CmEvent::TimedOut { id } => {
                if let Some(c) = s.conns.get_mut(&id) {
                    if let Some(w) = c.waiter.take() {
                        acts.push(Action::Wake(w, Outcome::TimedOut));
                    } else if let Some(qp) = c.qp.clone()
                        && !c.down
                    {
                        c.down = true;
                        acts.push(Action::Down(
                            qp,
                            Some(verbs::CmEvent::ConnectionError(
                                "IB CM: the peer did not answer our REP (no RTU)".into(),
                            )),
                        ));
                    }
                }
                forget(s, id);
            }
            CmEvent::Disconnected { id, .. } => {
                if let Some(c) = s.conns.get_mut(&id)
                    && let Some(qp) = c.qp.clone()
                    && !c.down
                {
                    c.down = true;
                    acts.push(Action::Down(qp, Some(verbs::CmEvent::Disconnected)));
                }
            }
            CmEvent::TimeWaitExit { id } => forget(s, id),
            CmEvent::SidrRequest(r) => {
                let now = Instant::now();
                let port = match parse_service_id(r.req.service_id) {
                    Some((PortSpace::Udp, p)) => Some(p),
                    _ => None,
                };
                let Some(queue) = port.and_then(|p| s.udp_listeners.get(&p)).cloned() else {
                    // Listened in the IB CM but not (or no longer) ours in the UDP space.
                    let _ = s.cm.sidr_reply(now, r.id, SidrStatus::Unsupported, 0, 0, &[]);
                    return;
                };
                let port = port.unwrap_or(0);
                let (peer, local, pdata) = match r.cma {
                    Some(h) if h.dst == self.local_ip => (
                        h.src,
                        SocketAddr::new(h.dst, port),
                        r.req.private_data.get(CMA_HDR_LEN..).unwrap_or(&[]).to_vec(),
                    ),
                    _ => {
                        // rdma_cm finds no listener for a header naming another address (or
                        // none): the IB CM rejects the SIDR_REQ.
                        let _ = s.cm.sidr_reply(now, r.id, SidrStatus::Rejected, 0, 0, &[]);
                        return;
                    }
                };
                let req = RoceConnRequest {
                    cm: Some(self.clone()),
                    id: CmId(0),
                    sidr: Some(r.id),
                    ib: None,
                    peer,
                    local,
                    private_data: pdata,
                    param: ConnParam::default(),
                };
                acts.push(Action::Deliver(queue, Box::new(req)));
            }
            CmEvent::SidrReply { id, rep } => {
                if let Some(w) = s.sidr_waiters.remove(&id) {
                    acts.push(Action::WakeSidr(w, SidrOutcome::Reply(rep)));
                }
            }
            CmEvent::SidrTimedOut { id } => {
                if let Some(w) = s.sidr_waiters.remove(&id) {
                    acts.push(Action::WakeSidr(w, SidrOutcome::TimedOut));
                }
            }
        }
    }

    /// Carries out actions outside the mutex.
    fn run(&self, acts: Vec<Action>) {
        for a in acts {
            match a {
                Action::Send(to, mad) => match mad.emit() {
                    Ok(bytes) => {
                        if let Err(e) = self.port.send_mad(to, &bytes) {
                            tracing::warn!(?to, error = %e, "IB CM: sending a MAD failed");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "IB CM: a MAD did not encode"),
                },
                Action::Deliver(q, req) => q.push(req),
                Action::Wake(w, o) => {
                    let _ = w.send(o);
                }
                Action::WakeSidr(w, o) => {
                    let _ = w.send(o);
                }
                Action::Down(qp, ev) => {
                    // The QP to ERR first, then the event: an application that sees
                    // Disconnected finds the QP in ERR. Its flush completions may come
                    // before the event (verbs order the CQ and the CM events no more
                    // than rdma-core does).
                    if !matches!(qp.state(), QpState::Err | QpState::Reset)
                        && let Err(e) = qp.modify_qp(&QpAttr::state(QpState::Err))
                    {
                        tracing::warn!(qpn = qp.qp_num(), error = %e, "IB CM: moving the QP to ERR failed");
                    }
                    if let Some(ev) = ev
                        && let Some(q) = self.port.qp_events(qp.qp_num())
                    {
                        q.push(ev);
                    }
                }
                Action::Event(qpn, ev) => {
                    if let Some(q) = self.port.qp_events(qpn) {
                        q.push(ev);
                    }
                }
            }
        }
    }

    /// Runs `f` with the mutex, then sends and applies what it produced.
    fn with<T>(self: &Arc<Self>, f: impl FnOnce(&mut Shared) -> T) -> T {
        let (t, acts) = {
            let mut s = self.lock();
            let t = f(&mut s);
            let acts = self.collect(&mut s);
            (t, acts)
        };
        self.wake.notify_all();
        self.run(acts);
        t
    }
}

fn forget(s: &mut Shared, id: CmId) {
    if let Some(c) = s.conns.remove(&id)
        && let Some(qp) = c.qp
        && s.by_qpn.get(&qp.qp_num()) == Some(&id)
    {
        s.by_qpn.remove(&qp.qp_num());
    }
}

fn conn_info(local: SocketAddr, peer: SocketAddr, qp: &QpParams, peer_pdata: Vec<u8>, qpn: u32) -> ConnInfo {
    ConnInfo {
        local_addr: local,
        peer_addr: peer,
        responder_resources: u32::from(qp.rtr.max_dest_rd_atomic),
        initiator_depth: u32::from(qp.rts.max_rd_atomic),
        peer_private_data: peer_pdata,
        detail: format!(
            "IB CM, QPN {qpn:#x} <-> {:#x}, send PSN {:#08x}, receive PSN {:#08x}, path MTU {}",
            qp.rtr.dest_qp_num,
            qp.rts.sq_psn,
            qp.rtr.rq_psn,
            qp.rtr.path_mtu.bytes()
        ),
    }
}

/// INIT → RTR → RTS with the attributes the REQ and REP agree on.
fn bring_up(qp: &Arc<dyn QpOps>, p: &QpParams) -> Result<()> {
    qp.modify_qp(&QpAttr::rtr(p.rtr))?;
    qp.modify_qp(&QpAttr::rts(p.rts))
}

impl CmBackend for GsiCm {
    fn listen(
        &self,
        addr: SocketAddr,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>> {
        self.listen_ps(addr, PortSpace::Tcp, requests)
    }

    fn listen_in(
        &self,
        addr: SocketAddr,
        ps: verbs::PortSpace,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>> {
        let ps = match ps {
            verbs::PortSpace::Tcp => PortSpace::Tcp,
            verbs::PortSpace::Udp => PortSpace::Udp,
        };
        self.listen_ps(addr, ps, requests)
    }

    fn resolve_ud(&self, addr: SocketAddr, private_data: &[u8], timeout: Duration) -> Result<UdParam> {
        self.sidr_resolve(addr, private_data, timeout)
    }

    fn multicast_group(&self, group: IpAddr) -> Result<UdParam> {
        let mgid = iboe_mgid(group).ok_or(InvalidArg::ConnParam("not an IP multicast address"))?;
        if group.is_ipv4() != self.inner.local_ip.is_ipv4() {
            return Err(InvalidArg::ConnParam("the group is not of the device's IP version").into());
        }
        Ok(UdParam {
            ah_attr: AhAttr::to_gid(mgid),
            qp_num: 0x00ff_ffff,
            qkey: RDMA_UDP_QKEY,
            private_data: Vec::new(),
        })
    }

    fn connect(&self, qp: &Arc<dyn QpOps>, addr: SocketAddr, param: &ConnParam, timeout: Duration) -> Result<ConnInfo> {
        self.connect_from(qp, addr, param, timeout)
    }

    fn connect_routed(
        &self,
        qp: &Arc<dyn QpOps>,
        addr: SocketAddr,
        route: &RouteOptions,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<ConnInfo> {
        if route.src_addr.is_some_and(|a| a != self.inner.local_ip) {
            return Err(Error::NotSupported(format!(
                "this RoCE device sends from {}, not {:?}",
                self.inner.local_ip, route.src_addr
            )));
        }
        if route.tos.is_some_and(|t| t != 0) {
            return Err(Error::NotSupported(
                "a type of service on RoCE connections (yet)".into(),
            ));
        }
        self.connect_from(qp, addr, param, timeout)
    }

    fn listen_ib_service(
        &self,
        service_id: u64,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>> {
        let inner = &self.inner;
        inner.with(|s| -> Result<()> {
            s.cm.listen(service_id).map_err(cm_err)?;
            s.ib_listeners.insert(service_id, requests);
            Ok(())
        })?;
        Ok(Box::new(RoceListener {
            inner: inner.clone(),
            addr: SocketAddr::new(inner.local_ip, 0),
            ps: PortSpace::Tcp,
            ib_service: Some(service_id),
        }))
    }

    fn connect_ib_service(
        &self,
        qp: &Arc<dyn QpOps>,
        gid: Gid,
        service_id: u64,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<ConnInfo> {
        if param.private_data.len() > crate::cm::mad::REQ_PDATA {
            return Err(InvalidArg::PrivateDataTooLong {
                len: param.private_data.len(),
                max: crate::cm::mad::REQ_PDATA,
            }
            .into());
        }
        let addr = SocketAddr::new(gid.to_ip(), 0);
        self.connect_with(qp, addr, param, timeout, |_, qpn, psn| {
            Ok(ConnectParams::ib_service(
                gid,
                service_id,
                qpn,
                psn,
                &param.private_data,
            ))
        })
    }

    fn disconnect(&self, qp: &Arc<dyn QpOps>) {
        let inner = &self.inner;
        let qpn = qp.qp_num();
        // rdma_disconnect: the QP to ERR first (its work requests flush), then the DREQ.
        if !matches!(qp.state(), QpState::Err | QpState::Reset)
            && let Err(e) = qp.modify_qp(&QpAttr::state(QpState::Err))
        {
            tracing::warn!(qpn, error = %e, "IB CM: moving the QP to ERR failed");
        }
        inner.with(|s| {
            let Some(&id) = s.by_qpn.get(&qpn) else { return };
            if let Err(e) = s.cm.destroy(Instant::now(), id) {
                tracing::debug!(qpn, error = %e, "IB CM: disconnect of a connection already gone");
                forget(s, id);
            }
        });
    }
}

impl GsiCm {
    fn listen_ps(
        &self,
        addr: SocketAddr,
        ps: PortSpace,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>> {
        let inner = &self.inner;
        if !addr.ip().is_unspecified() && addr.ip() != inner.local_ip {
            return Err(Error::Io(std::io::ErrorKind::AddrNotAvailable.into()));
        }
        let port = inner.with(|s| -> Result<u16> {
            let taken = |s: &Shared, p: &u16| match ps {
                PortSpace::Udp => s.udp_listeners.contains_key(p),
                _ => s.listeners.contains_key(p),
            };
            let port = if addr.port() != 0 {
                addr.port()
            } else {
                // rdma_cm's ephemeral range, as `cma_alloc_any_port` draws it.
                let mut found = None;
                for _ in 0..1000 {
                    let p = s.rng.random_range(32768..=60999u16);
                    if !taken(s, &p) {
                        found = Some(p);
                        break;
                    }
                }
                found.ok_or_else(|| Error::OutOfResources("free rdma_cm ports".into()))?
            };
            s.cm.listen(service_id(ps, port)).map_err(cm_err)?;
            match ps {
                PortSpace::Udp => s.udp_listeners.insert(port, requests),
                _ => s.listeners.insert(port, requests),
            };
            Ok(port)
        })?;
        Ok(Box::new(RoceListener {
            inner: inner.clone(),
            addr: SocketAddr::new(addr.ip(), port),
            ps,
            ib_service: None,
        }))
    }

    /// SIDR for `QueuePair::connect_ud` (see the module docs).
    fn sidr_resolve(&self, addr: SocketAddr, private_data: &[u8], timeout: Duration) -> Result<UdParam> {
        let inner = &self.inner;
        if addr.ip().is_unspecified() || addr.port() == 0 {
            return Err(InvalidArg::ConnParam("connect needs a destination address and port").into());
        }
        let (tx, rx) = channel::<SidrOutcome>();
        let id = inner.with(|s| -> Result<SidrId> {
            let src = SocketAddr::new(inner.local_ip, s.rng.random_range(32768..=60999u16));
            let pdata = CmaHdr { src, dst: addr.ip() }
                .sidr_private_data(private_data)
                .map_err(cma_err)?;
            let to = Gid::from_ip(addr.ip());
            let id =
                s.cm.sidr_request(Instant::now(), to, service_id(PortSpace::Udp, addr.port()), &pdata)
                    .map_err(cm_err)?;
            s.sidr_waiters.insert(id, tx);
            Ok(id)
        })?;
        let outcome = rx.recv_timeout(timeout).unwrap_or(SidrOutcome::TimedOut);
        inner.with(|s| {
            s.cm.sidr_cancel(id);
            s.sidr_waiters.remove(&id);
        });
        let rep = match outcome {
            SidrOutcome::Reply(rep) => rep,
            SidrOutcome::TimedOut => return Err(Error::Timeout),
        };
        let status = SidrStatus::from(rep.status);
        if status != SidrStatus::Valid {
            return Err(Error::Rejected {
                private_data: rep.private_data,
                detail: Some(ErrorDetail::new(SidrRefusal { status })),
            });
        }
        if rep.qkey != RDMA_UDP_QKEY {
            return Err(Error::Protocol(format!(
                "SIDR_REP Q_Key {:#010x} is not rdma_cm's UDP Q_Key {RDMA_UDP_QKEY:#010x}",
                rep.qkey
            )));
        }
        Ok(UdParam {
            ah_attr: AhAttr::to_gid(Gid::from_ip(addr.ip())),
            qp_num: rep.qpn,
            qkey: rep.qkey,
            private_data: rep.private_data,
        })
    }
}

impl GsiCm {
    fn connect_from(
        &self,
        qp: &Arc<dyn QpOps>,
        addr: SocketAddr,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<ConnInfo> {
        if addr.ip().is_unspecified() || addr.port() == 0 {
            return Err(InvalidArg::ConnParam("connect needs a destination address and port").into());
        }
        self.connect_with(qp, addr, param, timeout, |local, qpn, psn| {
            ConnectParams::rdma_cm(local, addr, qpn, psn, &param.private_data).map_err(cma_err)
        })
    }

    /// Sends the REQ that `make` builds (from our address, QPN and starting PSN) for `qp`
    /// and waits for the answer; on a REP the QP goes to RTS and the RTU goes out.
    fn connect_with(
        &self,
        qp: &Arc<dyn QpOps>,
        addr: SocketAddr,
        param: &ConnParam,
        timeout: Duration,
        make: impl FnOnce(SocketAddr, u32, u32) -> Result<ConnectParams>,
    ) -> Result<ConnInfo> {
        let inner = &self.inner;
        let cfg = &inner.cfg;
        let (tx, rx): (Sender<Outcome>, Receiver<Outcome>) = channel();
        let qpn = qp.qp_num();
        let (id, local) = inner.with(|s| -> Result<(CmId, SocketAddr)> {
            let local = SocketAddr::new(inner.local_ip, s.rng.random_range(32768..=60999u16));
            let psn = random_psn(&mut s.rng);
            let mut p = make(local, qpn, psn)?;
            p.responder_resources = param.responder_resources;
            p.initiator_depth = param.initiator_depth;
            p.path_mtu = cfg.path_mtu;
            p.rnr_retry_count = cfg.rnr_retry_count;
            p.local_ack_timeout = cfg.local_ack_timeout;
            let id = s.cm.connect(Instant::now(), p).map_err(cm_err)?;
            s.conns.insert(
                id,
                Conn {
                    qp: Some(qp.clone()),
                    waiter: Some(tx),
                    down: false,
                },
            );
            s.by_qpn.insert(qpn, id);
            Ok((id, local))
        })?;
        let give_up = |inner: &Arc<Inner>| {
            inner.with(|s| {
                let _ = s.cm.destroy(Instant::now(), id);
                if s.cm.state(id).is_none() {
                    forget(s, id);
                }
            })
        };
        let outcome = match rx.recv_timeout(timeout) {
            Ok(o) => o,
            Err(_) => {
                give_up(inner);
                return Err(Error::Timeout);
            }
        };
        match outcome {
            Outcome::Reply { rep, qp: params } => {
                if let Err(e) = bring_up(qp, &params) {
                    give_up(inner);
                    return Err(e);
                }
                inner.with(|s| s.cm.rtu(Instant::now(), id, &[])).map_err(cm_err)?;
                Ok(conn_info(local, addr, &params, rep.private_data, qpn))
            }
            Outcome::Rejected {
                reason,
                ari,
                private_data,
            } => {
                inner.with(|s| forget(s, id));
                Err(Error::Rejected {
                    private_data,
                    detail: Some(ErrorDetail::with_code(
                        Rejection { reason, ari },
                        u32::from(u16::from(reason)),
                    )),
                })
            }
            Outcome::TimedOut => {
                inner.with(|s| forget(s, id));
                Err(Error::Timeout)
            }
        }
    }
}

/// A listener: its port's service ID stays registered until it is dropped.
struct RoceListener {
    inner: Arc<Inner>,
    addr: SocketAddr,
    ps: PortSpace,
    /// A raw IB service listener (`listen_ib_service`): its service ID.
    ib_service: Option<u64>,
}

impl ListenerOps for RoceListener {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for RoceListener {
    fn drop(&mut self) {
        let (port, ps) = (self.addr.port(), self.ps);
        if let Some(sid) = self.ib_service {
            self.inner.with(|s| {
                s.cm.unlisten(sid);
                s.ib_listeners.remove(&sid);
            });
            return;
        }
        self.inner.with(|s| {
            s.cm.unlisten(service_id(ps, port));
            match ps {
                PortSpace::Udp => s.udp_listeners.remove(&port),
                _ => s.listeners.remove(&port),
            };
        });
    }
}

/// A REQ (or, in the UDP port space, a SIDR_REQ) waiting for the application; dropping it
/// unanswered rejects it.
struct RoceConnRequest {
    cm: Option<Arc<Inner>>,
    id: CmId,
    /// A SIDR_REQ's handle: this is a UDP-port-space request.
    sidr: Option<SidrId>,
    /// A raw IB service request: its service ID and the requester's GID.
    ib: Option<(u64, Gid)>,
    peer: SocketAddr,
    local: SocketAddr,
    private_data: Vec<u8>,
    param: ConnParam,
}

impl ConnRequestOps for RoceConnRequest {
    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    fn local_addr(&self) -> SocketAddr {
        self.local
    }
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    fn param(&self) -> ConnParam {
        self.param.clone()
    }

    fn service_id(&self) -> Option<u64> {
        self.ib.map(|(sid, _)| sid)
    }

    fn peer_gid(&self) -> Option<Gid> {
        Some(self.ib.map_or_else(|| Gid::from_ip(self.peer.ip()), |(_, g)| g))
    }

    fn reject_with_reason(mut self: Box<Self>, reason: u16, private_data: &[u8]) -> Result<()> {
        if self.sidr.is_some() {
            return self.reject(private_data);
        }
        let inner = self.cm.take().ok_or(Error::Closed)?;
        let id = self.id;
        inner.with(|s| {
            let r =
                s.cm.reject(Instant::now(), id, RejReason::from(reason), &[], private_data);
            if !matches!(r, Err(crate::cm::CmError::TooLong { .. })) {
                forget(s, id);
            }
            r.map_err(cm_err)
        })
    }

    fn port_space(&self) -> verbs::PortSpace {
        match self.sidr {
            Some(_) => verbs::PortSpace::Udp,
            None => verbs::PortSpace::Tcp,
        }
    }

    fn accept_ud(mut self: Box<Self>, qp: &Arc<dyn QpOps>, private_data: &[u8]) -> Result<()> {
        let Some(sidr) = self.sidr else {
            return Err(InvalidArg::ConnParam("accept_ud on a request of the TCP port space").into());
        };
        let inner = self.cm.take().ok_or(Error::Closed)?;
        let r = inner.with(|s| {
            s.cm.sidr_reply(
                Instant::now(),
                sidr,
                SidrStatus::Valid,
                qp.qp_num(),
                RDMA_UDP_QKEY,
                private_data,
            )
        });
        if matches!(r, Err(crate::cm::CmError::TooLong { .. })) {
            // Still unanswered: the request stays ours (dropping it rejects it).
            self.cm = Some(inner);
        }
        r.map_err(cm_err)
    }

    fn accept(mut self: Box<Self>, qp: &Arc<dyn QpOps>, param: &ConnParam) -> Result<ConnInfo> {
        if self.sidr.is_some() {
            return Err(InvalidArg::ConnParam("a UDP-port-space request is answered with accept_ud").into());
        }
        let inner = self.cm.take().ok_or(Error::Closed)?;
        let id = self.id;
        let qpn = qp.qp_num();
        let cfg = &inner.cfg;
        // Accept under the mutex but keep the REP back until the QP is in RTS, so the peer's
        // first packets find it ready (rdma_cm's cma_accept_ib does RTR, RTS, then the REP).
        let (params, held) = {
            let mut s = inner.lock();
            let psn = random_psn(&mut s.rng);
            let r = s.cm.accept(
                Instant::now(),
                id,
                AcceptParams {
                    qpn,
                    starting_psn: psn,
                    responder_resources: param.responder_resources,
                    initiator_depth: param.initiator_depth.min(self.param.responder_resources),
                    rnr_retry_count: cfg.rnr_retry_count,
                    target_ack_delay: 0,
                    srq: false,
                    min_rnr_timer: cfg.min_rnr_timer,
                    private_data: param.private_data.clone(),
                },
            );
            let params = match r {
                Ok(mut p) => {
                    // No larger than our port's MTU, whatever the REQ offers.
                    if p.rtr.path_mtu.bytes() > cfg.path_mtu.bytes() {
                        p.rtr.path_mtu = cfg.path_mtu;
                    }
                    p
                }
                Err(e) => {
                    let _ = s.cm.destroy(Instant::now(), id);
                    forget(&mut s, id);
                    let acts = inner.collect(&mut s);
                    drop(s);
                    inner.run(acts);
                    return Err(cm_err(e));
                }
            };
            if let Some(c) = s.conns.get_mut(&id) {
                c.qp = Some(qp.clone());
            }
            s.by_qpn.insert(qpn, id);
            let acts = inner.collect(&mut s);
            (params, acts)
        };
        inner.wake.notify_all();
        if let Err(e) = bring_up(qp, &params) {
            // The REP never leaves: withdraw it with a REJ.
            inner.with(|s| {
                let _ = s.cm.destroy(Instant::now(), id);
                forget(s, id);
            });
            return Err(e);
        }
        inner.run(held);
        Ok(conn_info(
            self.local,
            self.peer,
            &params,
            self.private_data.clone(),
            qpn,
        ))
    }

    fn reject(mut self: Box<Self>, private_data: &[u8]) -> Result<()> {
        let inner = self.cm.take().ok_or(Error::Closed)?;
        if let Some(sidr) = self.sidr {
            let r = inner.with(|s| {
                s.cm.sidr_reply(Instant::now(), sidr, SidrStatus::Rejected, 0, 0, private_data)
            });
            if matches!(r, Err(crate::cm::CmError::TooLong { .. })) {
                self.cm = Some(inner);
            }
            return r.map_err(cm_err);
        }
        let id = self.id;
        inner.with(|s| {
            let r =
                s.cm.reject(Instant::now(), id, RejReason::ConsumerDefined, &[], private_data);
            if !matches!(r, Err(crate::cm::CmError::TooLong { .. })) {
                forget(s, id);
            }
            r.map_err(cm_err)
        })
    }
}

impl Drop for RoceConnRequest {
    fn drop(&mut self) {
        if let Some(inner) = self.cm.take() {
            if let Some(sidr) = self.sidr {
                inner.with(|s| {
                    let _ = s.cm.sidr_reply(Instant::now(), sidr, SidrStatus::Rejected, 0, 0, &[]);
                });
                return;
            }
            let id = self.id;
            inner.with(|s| {
                let _ = s.cm.reject(Instant::now(), id, RejReason::ConsumerDefined, &[], &[]);
                forget(s, id);
            });
        }
    }
}

/// A CA GUID for the device bound to `ip`: `02:53:6f:66` ("\x02Sof", a locally administered
/// prefix) and the IPv4 address, or the low 32 bits of the IPv6 address.
pub fn ca_guid_for(ip: IpAddr) -> u64 {
    let low = match ip {
        IpAddr::V4(v4) => u32::from(v4),
        IpAddr::V6(v6) => (u128::from(v6) & 0xffff_ffff) as u32,
    };
    0x0253_6f66_0000_0000 | u64::from(low)
}

/// Opens a RoCEv2 device with this connection manager (what the `roce` factory opens):
/// rdma_cm defaults, the CA GUID of [`ca_guid_for`] and a random seed, so comm IDs and PSNs
/// differ from one run to the next (a peer tells a new connection from a stale one by them).
pub fn open_device(cfg: crate::engine::RoceConfig) -> std::io::Result<verbs::Device> {
    let mut c = GsiCmConfig::new(ca_guid_for(cfg.addr), rand::random());
    c.path_mtu = cfg.mtu;
    let mut failed = None;
    let dev = crate::engine::open_device_with(cfg, |p| match GsiCm::new(p.clone() as Arc<dyn GsiPort>, c) {
        Ok(cm) => Some(cm as Arc<dyn CmBackend>),
        Err(e) => {
            failed = Some(e);
            None
        }
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(dev),
    }
}
