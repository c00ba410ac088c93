//! Connection manager in the style of `rdma_cm`, above the verbs.
//!
//! The rdma_cm flow: make the QP first ([`ProtectionDomain::create_qp`],
//! RESET; `rdma_create_qp` also moves it to INIT), post receives, then bind
//! it to a connection: actively with [`QueuePair::connect`]
//! (`rdma_connect`), passively by taking a [`ConnectRequest`] from a
//! [`Listener`] ([`Device::listen`]) and [`ConnectRequest::accept_qp`]
//! (`rdma_accept`), or [`reject`](ConnectRequest::reject) it with private data.
//! The transport's backend ([`backend::CmBackend`]: MPA for iWARP, the IB CM
//! for RoCEv2) moves the QP to RTS. Afterwards the QP reports [`CmEvent`]s:
//! established, disconnected, and a fatal error received or sent, whose
//! [`ErrorDetail`] the provider fills (iWARP: the Terminate's layer, type and
//! code, in the iwarp crate's type).
//!
//! [`ProtectionDomain::connect`] and [`ConnectRequest::accept`] do the three
//! steps in one call (create, post the initial receives, connect/accept):
//! what most programs want.
//!
//! # The UDP port space (`RDMA_PS_UDP`) and multicast
//!
//! Unreliable-datagram QPs use rdma_cm too, in its UDP port space: a listener
//! made with [`Device::listen_in`]`(addr, `[`PortSpace::Udp`]`)` gets requests
//! ([`ConnectRequest::port_space`] says `Udp`) that it answers with a UD QP
//! ([`ConnectRequest::accept_ud`]); a client resolves the listener's QP with
//! [`QueuePair::connect_ud`] and gets its QPN, Q_Key and address vector
//! ([`UdParam`], what `RDMA_CM_EVENT_ESTABLISHED` carries on a UD ID). On
//! InfiniBand and RoCE this is SIDR (IBTA §12.11). [`QueuePair::join_multicast`]
//! joins an IP multicast group (`rdma_join_multicast`) and attaches the QP to
//! its MGID. The QPs use rdma_cm's Q_Key [`RDMA_UDP_QKEY`]; like
//! `rdma_create_qp`, the calls move a UD QP in RESET to RTS. A transport
//! without datagrams (iWARP) refuses all of it with `NotSupported`
//! (`EOPNOTSUPP`).

pub mod backend;
pub mod event;

use crate::cm::backend::{CmBackend, ConnRequestOps, ListenerOps};
use crate::cq::CompletionQueue;
use crate::device::{Device, ProtectionDomain};
use crate::error::{Error, InvalidArg, Result};
use crate::notify::EventQueue;
use crate::qp::{QpInit, QueuePair};
use crate::qp_attr::{QpAttr, QpType};
use crate::types::{Access, ConnParam, QpInitAttr, QpState, RecvWr};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

pub use event::{CmEvent, ConnInfo, ErrorDetail, ProviderDetail, UdParam};

/// The Q_Key of rdma_cm's UDP port space (`RDMA_UDP_QKEY` in `rdma_cma.h`): the Q_Key
/// of every UD QP and multicast group made through rdma_cm.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// An rdma_cm port space (`enum rdma_ucm_port_space`), chosen when listening.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC QPs).
    #[default]
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagrams (UD QPs), resolved by SIDR on IB and RoCE.
    Udp,
}

fn backend(dev: &Device) -> Result<&Arc<dyn CmBackend>> {
    dev.cm_backend()
        .ok_or_else(|| Error::NotSupported(format!("device {} has no connection manager", dev.name())))
}

/// A listening endpoint (`rdma_listen`).
pub struct Listener {
    ops: Box<dyn ListenerOps>,
    requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
}

impl Listener {
    /// The address it listens on (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.ops.local_addr()
    }

    /// Waits for the next connect request (`rdma_get_request`).
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<ConnectRequest> {
        self.requests
            .pop_timeout(timeout)
            .map(|ops| ConnectRequest { ops })
            .ok_or(Error::Timeout)
    }

    /// Async [`get_request`](Self::get_request).
    pub async fn get_request_async(&self) -> Result<ConnectRequest> {
        self.requests
            .pop_async()
            .await
            .map(|ops| ConnectRequest { ops })
            .ok_or(Error::Closed)
    }
}

/// How an active connection leaves this host: what rdma_cm sets with
/// `rdma_resolve_addr`'s source address and `rdma_set_option(RDMA_OPTION_ID_TOS)`
/// (rping's `-I` and `-t`). The default lets the system choose both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteOptions {
    /// The local address to connect from (any port); `None`: the routing table's choice.
    pub src_addr: Option<IpAddr>,
    /// The IP type of service (IPv4 TOS, IPv6 traffic class) of the connection's
    /// packets; `None`: the system default (0).
    pub tos: Option<u8>,
}

impl RouteOptions {
    /// Connect from `addr` (`rdma_resolve_addr`'s `src_addr`).
    pub fn src_addr(mut self, addr: IpAddr) -> Self {
        self.src_addr = Some(addr);
        self
    }
    /// Mark the connection's packets with this type of service (`RDMA_OPTION_ID_TOS`).
    pub fn tos(mut self, tos: u8) -> Self {
        self.tos = Some(tos);
        self
    }
}

/// Options for the queue pair that [`ProtectionDomain::connect`] and
/// [`ConnectRequest::accept`] create.
#[derive(Clone)]
pub struct QpOptions {
    /// The CQ of the send queue's completions.
    pub send_cq: CompletionQueue,
    /// The CQ of the receive queue's completions (may be `send_cq`).
    pub recv_cq: CompletionQueue,
    /// Queue capacities (`ibv_qp_cap`).
    pub attr: QpInitAttr,
    /// What the connection asks for: private data, IRD and ORD (`rdma_conn_param`).
    pub param: ConnParam,
    /// Receives posted before the connection goes live, as an rdma_cm user
    /// posts them between `rdma_create_qp` and `rdma_accept`/`rdma_connect`:
    /// the peer may Send the moment it is connected, and iWARP has no
    /// receiver-not-ready retry (a Send without a receive is a Terminate).
    pub initial_recvs: Vec<RecvWr>,
    /// Source address and type of service of an active connection
    /// ([`ProtectionDomain::connect`]; a passive side answers on the listener's address).
    pub route: RouteOptions,
}

impl QpOptions {
    /// One CQ for both queues, default QP attributes and connection parameters.
    pub fn new(cq: &CompletionQueue) -> Self {
        QpOptions {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            attr: QpInitAttr::default(),
            param: ConnParam::default(),
            initial_recvs: Vec::new(),
            route: RouteOptions::default(),
        }
    }
    /// Receives to post before the connection is established (see
    /// [`QpOptions::initial_recvs`]).
    pub fn post_recv(mut self, wrs: impl IntoIterator<Item = RecvWr>) -> Self {
        self.initial_recvs.extend(wrs);
        self
    }
    /// Private data for the peer (`rdma_conn_param.private_data`).
    pub fn private_data(mut self, pd: &[u8]) -> Self {
        self.param.private_data = pd.to_vec();
        self
    }
    /// IRD (`responder_resources`) and ORD (`initiator_depth`).
    pub fn rd_atomic(mut self, responder_resources: u8, initiator_depth: u8) -> Self {
        self.param.responder_resources = responder_resources;
        self.param.initiator_depth = initiator_depth;
        self
    }
    /// Source address and type of service of the connection (see [`RouteOptions`]).
    pub fn route(mut self, route: RouteOptions) -> Self {
        self.route = route;
        self
    }
    /// Queue capacities of the QP.
    pub fn attr(mut self, attr: QpInitAttr) -> Self {
        self.attr = attr;
        self
    }
    /// The RC QP these options describe.
    pub fn qp_init(&self) -> QpInit {
        QpInit::new(QpType::Rc, &self.send_cq)
            .recv_cq(&self.recv_cq)
            .cap(self.attr.clone())
    }
}

/// An incoming connection (`RDMA_CM_EVENT_CONNECT_REQUEST`).
pub struct ConnectRequest {
    ops: Box<dyn ConnRequestOps>,
}

impl ConnectRequest {
    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.ops.peer_addr()
    }
    /// The local address the request arrived on.
    pub fn local_addr(&self) -> SocketAddr {
        self.ops.local_addr()
    }
    /// The initiator's private data (without provider bytes such as MPA's IRD/ORD words).
    pub fn private_data(&self) -> &[u8] {
        self.ops.private_data()
    }
    /// The initiator's stated IRD/ORD.
    pub fn param(&self) -> ConnParam {
        self.ops.param()
    }
    /// Binds `qp` (RC, in RESET or INIT, receives posted) to this
    /// connection and accepts it (`rdma_accept`); the QP is in RTS on return.
    pub fn accept_qp(self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        prepare(qp)?;
        let info = self.ops.accept(qp.ops(), param)?;
        qp.set_connected(info);
        Ok(())
    }
    /// Creates an RC QP in `pd`, posts `opts.initial_recvs` and accepts
    /// (`rdma_create_qp` + `rdma_accept`); returns the connected QP.
    pub fn accept(self, pd: &ProtectionDomain, opts: QpOptions) -> Result<QueuePair> {
        let qp = pd.create_qp(opts.qp_init())?;
        prepare(&qp)?;
        qp.post_recv(&opts.initial_recvs)?;
        self.accept_qp(&qp, &opts.param)?;
        Ok(qp)
    }
    /// Rejects (`rdma_reject`) with private data for the initiator.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.ops.reject(private_data)
    }
    /// The port space of the listener the request arrived at.
    pub fn port_space(&self) -> PortSpace {
        self.ops.port_space()
    }
    /// The IB service ID the request named: `Some` for requests taken from a listener of
    /// [`Device::listen_ib_service`].
    pub fn service_id(&self) -> Option<u64> {
        self.ops.service_id()
    }
    /// The requester's GID on an InfiniBand-style transport (RoCE: the REQ's source GID).
    pub fn peer_gid(&self) -> Option<crate::ah::Gid> {
        self.ops.peer_gid()
    }
    /// Rejects with an IB CM REJ `reason` (1 no QP, 8 invalid service ID, 28 consumer
    /// reject, ...) and private data; a transport without REJ reasons rejects as
    /// [`reject`](Self::reject) does.
    pub fn reject_with_reason(self, reason: u16, private_data: &[u8]) -> Result<()> {
        self.ops.reject_with_reason(reason, private_data)
    }
    /// Answers a UDP-port-space request (`rdma_accept` on a UD ID) with `qp`'s number and
    /// [`RDMA_UDP_QKEY`], and `private_data` for the requester. `qp` must be a UD QP; one
    /// in RESET is moved to RTS with that Q_Key first, as `rdma_create_qp` does.
    pub fn accept_ud(self, qp: &QueuePair, private_data: &[u8]) -> Result<()> {
        prepare_ud(qp)?;
        self.ops.accept_ud(qp.ops(), private_data)
    }
}

impl Device {
    /// Listens on `addr` (`rdma_bind_addr` + `rdma_listen`). Port 0 picks a free port.
    pub fn listen(&self, addr: SocketAddr) -> Result<Listener> {
        let requests = Arc::new(EventQueue::new());
        let ops = backend(self)?.listen(addr, requests.clone())?;
        Ok(Listener { ops, requests })
    }

    /// Listens on `addr` in port space `ps` (`rdma_create_id(ps)` + `rdma_bind_addr` +
    /// `rdma_listen`). [`PortSpace::Tcp`] is [`listen`](Self::listen); a device whose
    /// connection manager has no such port space refuses with `NotSupported`.
    pub fn listen_in(&self, addr: SocketAddr, ps: PortSpace) -> Result<Listener> {
        let requests = Arc::new(EventQueue::new());
        let ops = backend(self)?.listen_in(addr, ps, requests.clone())?;
        Ok(Listener { ops, requests })
    }

    /// Listens on a raw IB service ID (no rdma_cm port space; IPoIB connected mode's
    /// `0x10…|UD QPN`, RFC 4755 §3.5): requests carry the REQ's private data as sent, its
    /// [`service_id`](ConnectRequest::service_id) and the requester's
    /// [`peer_gid`](ConnectRequest::peer_gid). A transport without service IDs (iWARP)
    /// refuses with `NotSupported` (`EOPNOTSUPP`).
    pub fn listen_ib_service(&self, service_id: u64) -> Result<Listener> {
        let requests = Arc::new(EventQueue::new());
        let ops = backend(self)?.listen_ib_service(service_id, requests.clone())?;
        Ok(Listener { ops, requests })
    }
}

/// Checks that `qp` is a UD QP and moves it from RESET to RTS with [`RDMA_UDP_QKEY`], as
/// `rdma_create_qp` does for a UD ID (`cma_init_ud_qp`, then RTR and RTS).
fn prepare_ud(qp: &QueuePair) -> Result<()> {
    if qp.qp_type() != QpType::Ud {
        return Err(InvalidArg::CmQpType(qp.qp_type()).into());
    }
    if qp.state() == QpState::Reset {
        qp.modify_qp(&QpAttr::init_ud(1, 0, RDMA_UDP_QKEY))?;
    }
    if qp.state() == QpState::Init {
        qp.modify_qp(&QpAttr::state(QpState::Rtr))?;
    }
    if qp.state() == QpState::Rtr {
        let mut a = QpAttr::state(QpState::Rts);
        a.sq_psn = Some(0);
        qp.modify_qp(&a)?;
    }
    match qp.state() {
        QpState::Rts => Ok(()),
        s => Err(Error::InvalidState(s)),
    }
}

/// The QP's access flags once `rdma_create_qp` moved it to INIT: every
/// remote right (each access is still checked against its region's rights).
const CM_QP_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// Checks that `qp` can be bound to a connection, moving it from RESET to
/// INIT as `rdma_create_qp` does.
fn prepare(qp: &QueuePair) -> Result<()> {
    if qp.qp_type() != QpType::Rc {
        return Err(InvalidArg::CmQpType(qp.qp_type()).into());
    }
    if qp.is_connected() {
        return Err(InvalidArg::AlreadyConnected(qp.qp_num()).into());
    }
    match qp.state() {
        QpState::Reset => qp.modify_qp(&QpAttr::init(1, 0, CM_QP_ACCESS)),
        QpState::Init => Ok(()),
        s => Err(Error::InvalidState(s)),
    }
}

impl QueuePair {
    /// Connects this QP (RC, in RESET or INIT, receives posted) to a
    /// listener (`rdma_connect`): returns once the connection is
    /// established (QP in RTS), or `Error::Rejected` with the peer's private data.
    pub fn connect(&self, addr: SocketAddr, param: &ConnParam, timeout: Duration) -> Result<()> {
        self.connect_routed(addr, &RouteOptions::default(), param, timeout)
    }

    /// [`connect`](Self::connect) from a chosen source address and with a
    /// type of service (`rdma_resolve_addr` with `src_addr`,
    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`, `rdma_connect`). A provider whose
    /// transport cannot honour one refuses with `NotSupported`.
    pub fn connect_routed(
        &self,
        addr: SocketAddr,
        route: &RouteOptions,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<()> {
        prepare(self)?;
        let cm = backend(self.pd().device())?;
        let info = if *route == RouteOptions::default() {
            cm.connect(self.ops(), addr, param, timeout)?
        } else {
            cm.connect_routed(self.ops(), addr, route, param, timeout)?
        };
        self.set_connected(info);
        Ok(())
    }
}

impl QueuePair {
    /// Connects this QP (RC, in RESET or INIT, receives posted) to the raw IB service
    /// `service_id` at `gid`, with `param.private_data` as the REQ's private data (no
    /// rdma_cm header): returns once established, or `Error::Rejected` with the REJ's
    /// private data (its reason in the provider's detail), or `Timeout`. A transport
    /// without service IDs (iWARP) refuses with `NotSupported` (`EOPNOTSUPP`).
    pub fn connect_ib_service(
        &self,
        gid: crate::ah::Gid,
        service_id: u64,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<()> {
        prepare(self)?;
        let cm = backend(self.pd().device())?;
        let info = cm.connect_ib_service(self.ops(), gid, service_id, param, timeout)?;
        self.set_connected(info);
        Ok(())
    }

    /// Moves this UD QP from RESET to RTS with Q_Key [`RDMA_UDP_QKEY`], as `rdma_create_qp`
    /// does for a UD ID, so receives can be posted before [`connect_ud`](Self::connect_ud)
    /// or [`ConnectRequest::accept_ud`] (which do it themselves otherwise). Nothing to do
    /// in RTS; `InvalidArgument` for another QP type.
    pub fn prepare_ud_cm(&self) -> Result<()> {
        prepare_ud(self)
    }

    /// Resolves the UD QP listening on `addr` in the UDP port space (`rdma_connect` on a
    /// UD ID: SIDR on RoCE) with `private_data` for the listener, and returns where to
    /// send: its QPN, Q_Key and address vector (`RDMA_CM_EVENT_ESTABLISHED`'s `ud`
    /// parameters). This QP (UD) is moved to RTS first if it is in RESET. Errors:
    /// `Rejected` when the listener refuses or nobody listens (the SIDR_REP status in the
    /// detail; `RDMA_CM_EVENT_UNREACHABLE`), `Timeout` when nobody answers.
    pub fn connect_ud(&self, addr: SocketAddr, private_data: &[u8], timeout: Duration) -> Result<UdParam> {
        prepare_ud(self)?;
        backend(self.pd().device())?.resolve_ud(addr, private_data, timeout)
    }

    /// Joins the IP multicast group `group` (`rdma_join_multicast`): the group's MGID,
    /// Q_Key and address vector (`RDMA_CM_EVENT_MULTICAST_JOIN`'s `ud` parameters), with
    /// this QP (UD; moved to RTS if in RESET) attached to the MGID, as librdmacm attaches
    /// it on the join event.
    pub fn join_multicast(&self, group: IpAddr) -> Result<UdParam> {
        prepare_ud(self)?;
        let p = backend(self.pd().device())?.multicast_group(group)?;
        self.attach_mcast(&p.ah_attr.dgid, 0)?;
        Ok(p)
    }

    /// Leaves a group joined with [`join_multicast`](Self::join_multicast)
    /// (`rdma_leave_multicast`): the QP is detached from its MGID.
    pub fn leave_multicast(&self, group: IpAddr) -> Result<()> {
        let p = backend(self.pd().device())?.multicast_group(group)?;
        self.detach_mcast(&p.ah_attr.dgid, 0)
    }
}

impl ProtectionDomain {
    /// Creates an RC QP, posts `opts.initial_recvs` and connects it
    /// (`rdma_create_qp` + `rdma_connect`): returns the QP once the
    /// connection is established, or `Error::Rejected` with the peer's private data.
    pub fn connect(&self, addr: SocketAddr, opts: QpOptions, timeout: Duration) -> Result<QueuePair> {
        let qp = self.create_qp(opts.qp_init())?;
        prepare(&qp)?;
        qp.post_recv(&opts.initial_recvs)?;
        qp.connect_routed(addr, &opts.route, &opts.param, timeout)?;
        Ok(qp)
    }

    /// Async [`connect`](Self::connect): the handshake runs on a helper thread.
    pub async fn connect_async(&self, addr: SocketAddr, opts: QpOptions, timeout: Duration) -> Result<QueuePair> {
        let q: Arc<EventQueue<Result<QueuePair>>> = Arc::new(EventQueue::new());
        let (q2, pd) = (q.clone(), self.clone());
        std::thread::Builder::new()
            .name("softrdma-connect".into())
            .spawn(move || q2.push(pd.connect(addr, opts, timeout)))
            .map_err(Error::Io)?;
        q.pop_async().await.unwrap_or(Err(Error::Closed))
    }
}
