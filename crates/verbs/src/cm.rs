//! Connection manager in the style of `rdma_cm`, and the provider interface.
//!
//! Passive side: [`Device::listen`] gives a [`Listener`]; each incoming
//! connection is a [`ConnectRequest`] carrying the peer's private data and
//! IRD/ORD, which the application [`accept`](ConnectRequest::accept)s (getting
//! a connected [`QueuePair`]) or [`reject`](ConnectRequest::reject)s with
//! private data. Active side: [`ProtectionDomain::connect`]. Afterwards each
//! QP reports [`CmEvent`]s: established, disconnected, and a Terminate received
//! or sent, with its layer/type/code.

use crate::async_event::{AsyncEvent, push_bounded};
use crate::cq::{CompletionQueue, Progress};
use crate::device::{Device, ProtectionDomain};
use crate::error::{Error, Result};
use crate::notify::EventQueue;
use crate::port::{DEFAULT_PKEY, PortAttr};
use crate::qp_attr::{Gid, QpAttr, QpType, check_modify};
use crate::types::{ConnParam, QpInitAttr, QpState, RecvWr, SendWr};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

/// A Terminate's cause as the application sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminateInfo {
    pub layer: u8,
    pub etype: u8,
    pub code: u8,
    pub description: String,
}

impl std::fmt::Display for TerminateInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "layer {} type {} code {:#04x}: {}",
            self.layer, self.etype, self.code, self.description
        )
    }
}

/// Connection events of one QP (`rdma_cm_event_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established,
    /// The peer sent a Terminate; the QP is in the error state.
    TerminateReceived(TerminateInfo),
    /// We sent a Terminate because the peer violated the protocol.
    TerminateSent(TerminateInfo),
    /// `RDMA_CM_EVENT_DISCONNECTED`: the connection is closed.
    Disconnected,
    /// The transport failed (e.g. TCP reset).
    ConnectionError(String),
}

/// What a connection negotiated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    pub local_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    /// Inbound Reads/atomics we accept at once.
    pub responder_resources: u32,
    /// Outbound Reads/atomics we may have outstanding.
    pub initiator_depth: u32,
    /// The peer's private data (connect request or accept reply).
    pub peer_private_data: Vec<u8>,
    /// Provider detail, e.g. "MPA rev 2, CRC on, markers off".
    pub detail: String,
}

/// Everything a provider needs to create a QP.
pub struct QpRequest {
    pub pd: ProtectionDomain,
    pub send_cq: CompletionQueue,
    pub recv_cq: CompletionQueue,
    pub attr: QpInitAttr,
    pub param: ConnParam,
    pub events: Arc<EventQueue<CmEvent>>,
    /// Post these before processing any received byte.
    pub initial_recvs: Vec<RecvWr>,
}

/// A provider's QP.
pub trait QpOps: Progress {
    fn qp_num(&self) -> u32;
    fn state(&self) -> QpState;
    fn post_send(&self, wrs: &[SendWr]) -> Result<()>;
    fn post_recv(&self, wrs: &[RecvWr]) -> Result<()>;
    /// Graceful disconnect (`rdma_disconnect`).
    fn disconnect(&self);
    /// Move to the error state, flushing outstanding work (`ibv_modify_qp(ERR)`).
    fn set_error(&self);
    fn conn_info(&self) -> ConnInfo;
}

/// A provider's incoming connection, before accept or reject.
pub trait ConnRequestOps: Send {
    fn peer_addr(&self) -> SocketAddr;
    fn local_addr(&self) -> SocketAddr;
    fn private_data(&self) -> &[u8];
    /// The peer's IRD/ORD as it stated them.
    fn param(&self) -> ConnParam;
    fn accept(self: Box<Self>, req: QpRequest) -> Result<Arc<dyn QpOps>>;
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<()>;
}

/// A provider's listener; dropping it stops listening.
pub trait ListenerOps: Send + Sync {
    fn local_addr(&self) -> SocketAddr;
}

/// A transport provider (iWARP, later RoCE).
pub trait Provider: Send + Sync {
    /// Starts listening; incoming requests are pushed to `requests`.
    fn listen(
        &self,
        dev: &Device,
        addr: SocketAddr,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>>;
    /// Connects actively; returns once established, rejected or failed.
    fn connect(&self, addr: SocketAddr, req: QpRequest, timeout: Duration) -> Result<Arc<dyn QpOps>>;
    /// Number of ports (numbered from 1).
    fn phys_port_cnt(&self) -> u8 {
        1
    }
    /// Attributes of a port that exists (the caller checked the number).
    fn query_port(&self, _port_num: u8) -> PortAttr {
        PortAttr::default()
    }
    /// The port's GID table; the default is one zero GID, as an iWARP device
    /// (addressed by IP and TCP port) reports it.
    fn gid_table(&self, _port_num: u8) -> Vec<Gid> {
        vec![Gid::default()]
    }
    /// The port's P_Key table; the default is the default partition alone.
    fn pkey_table(&self, _port_num: u8) -> Vec<u16> {
        vec![DEFAULT_PKEY]
    }
}

/// A listening endpoint (`rdma_listen`).
pub struct Listener {
    ops: Box<dyn ListenerOps>,
    requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
}

impl Listener {
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

/// Options for the queue pair created by `connect` or `accept`.
#[derive(Clone)]
pub struct QpOptions {
    pub send_cq: CompletionQueue,
    pub recv_cq: CompletionQueue,
    pub attr: QpInitAttr,
    pub param: ConnParam,
    /// Receives posted before the connection goes live, as an rdma_cm user
    /// posts them between `rdma_create_qp` and `rdma_accept`/`rdma_connect`:
    /// the peer may Send the moment it is connected, and iWARP has no
    /// receiver-not-ready retry (a Send without a receive is a Terminate).
    pub initial_recvs: Vec<RecvWr>,
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
        }
    }
    /// Receives to post before the connection is established (see
    /// [`QpOptions::initial_recvs`]).
    pub fn post_recv(mut self, wrs: impl IntoIterator<Item = RecvWr>) -> Self {
        self.initial_recvs.extend(wrs);
        self
    }
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
    pub fn attr(mut self, attr: QpInitAttr) -> Self {
        self.attr = attr;
        self
    }
}

/// An incoming connection (`RDMA_CM_EVENT_CONNECT_REQUEST`).
pub struct ConnectRequest {
    ops: Box<dyn ConnRequestOps>,
}

impl ConnectRequest {
    pub fn peer_addr(&self) -> SocketAddr {
        self.ops.peer_addr()
    }
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
    /// Accepts (`rdma_accept`) and returns the connected QP.
    pub fn accept(self, pd: &ProtectionDomain, opts: QpOptions) -> Result<QueuePair> {
        QueuePair::open(pd, opts, |req| self.ops.accept(req))
    }
    /// Rejects (`rdma_reject`) with private data for the initiator.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.ops.reject(private_data)
    }
}

impl Device {
    /// Listens on `addr` (`rdma_bind_addr` + `rdma_listen`). Port 0 picks a free port.
    pub fn listen(&self, addr: SocketAddr) -> Result<Listener> {
        let requests = Arc::new(EventQueue::new());
        let ops = self.provider().listen(self, addr, requests.clone())?;
        Ok(Listener { ops, requests })
    }
}

impl ProtectionDomain {
    /// Connects to a listener (`rdma_connect`): returns the QP once the
    /// connection is established, or `Error::Rejected` with the peer's private data.
    pub fn connect(&self, addr: SocketAddr, opts: QpOptions, timeout: Duration) -> Result<QueuePair> {
        QueuePair::open(self, opts, |req| self.device().provider().connect(addr, req, timeout))
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

/// A connected reliable queue pair (`ibv_qp` + its `rdma_cm_id`).
pub struct QueuePair {
    ops: Arc<dyn QpOps>,
    events: Arc<EventQueue<CmEvent>>,
    pd: ProtectionDomain,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
}

impl QueuePair {
    /// Builds the provider request for `pd`/`opts`, lets `create` (connect or
    /// accept) make the provider QP, and wraps it.
    fn open(
        pd: &ProtectionDomain,
        opts: QpOptions,
        create: impl FnOnce(QpRequest) -> Result<Arc<dyn QpOps>>,
    ) -> Result<QueuePair> {
        let route = QpEventRoute::new(pd.device());
        let events = route.cm_queue();
        let req = QpRequest {
            pd: pd.clone(),
            send_cq: opts.send_cq.clone(),
            recv_cq: opts.recv_cq.clone(),
            attr: opts.attr,
            param: opts.param,
            events: events.clone(),
            initial_recvs: opts.initial_recvs,
        };
        let ops = create(req)?;
        route.bind(ops.qp_num());
        Ok(QueuePair {
            ops,
            events,
            pd: pd.clone(),
            send_cq: opts.send_cq,
            recv_cq: opts.recv_cq,
        })
    }

    pub fn qp_num(&self) -> u32 {
        self.ops.qp_num()
    }
    pub fn state(&self) -> QpState {
        self.ops.state()
    }
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.send_cq
    }
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.recv_cq
    }
    /// Posts work requests to the send queue (`ibv_post_send`).
    pub fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        self.ops.post_send(wrs)
    }
    /// Posts one send work request.
    pub fn post_send_one(&self, wr: SendWr) -> Result<()> {
        self.ops.post_send(std::slice::from_ref(&wr))
    }
    /// Posts receive buffers (`ibv_post_recv`).
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        self.ops.post_recv(wrs)
    }
    /// Graceful disconnect (`rdma_disconnect`).
    pub fn disconnect(&self) {
        self.ops.disconnect()
    }
    /// The QP's type: a QP of the connection manager is reliable connected.
    pub fn qp_type(&self) -> QpType {
        QpType::Rc
    }
    /// Modifies the QP (`ibv_modify_qp`). The call is checked against the
    /// IBTA transition table first ([`check_modify`]), then the provider
    /// carries it out. A QP made by the connection manager was moved to RTR
    /// and RTS by it, so the only transition left to the application is to
    /// ERR (outstanding work completes with `WrFlushErr`); others are refused
    /// with `NotSupported`, as the kernel's iw_cm QPs refuse them.
    pub fn modify_qp(&self, attr: &QpAttr) -> Result<()> {
        check_modify(self.qp_type(), self.state(), attr)?;
        match attr.qp_state {
            Some(QpState::Err) => {
                self.ops.set_error();
                Ok(())
            }
            to => Err(Error::NotSupported(format!(
                "{to:?}: the connection manager drives this QP's transitions; only ERR is left to the application"
            ))),
        }
    }
    /// The QP's current attributes (`ibv_query_qp`): state and the negotiated
    /// Read/atomic depths.
    pub fn query_qp(&self) -> QpAttr {
        let info = self.ops.conn_info();
        let clamp = |v: u32| v.min(u8::MAX as u32) as u8;
        QpAttr {
            qp_state: Some(self.state()),
            max_rd_atomic: Some(clamp(info.initiator_depth)),
            max_dest_rd_atomic: Some(clamp(info.responder_resources)),
            ..QpAttr::default()
        }
    }
    /// Forces the QP to the error state; outstanding work completes with `WrFlushErr`.
    pub fn set_error(&self) {
        self.ops.set_error()
    }
    pub fn conn_info(&self) -> ConnInfo {
        self.ops.conn_info()
    }
    /// Next connection event, waiting up to `timeout` (`rdma_get_cm_event`).
    pub fn get_event(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        self.events.pop_timeout(timeout)
    }
    /// Async [`get_event`](Self::get_event).
    pub async fn next_event_async(&self) -> Option<CmEvent> {
        self.events.pop_async().await
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.ops.disconnect();
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuePair({}, {:?})", self.qp_num(), self.state())
    }
}

// ---- device-wide asynchronous events derived from a QP's CM events ----

/// The device-wide event it raises, if any, as a function of the QP number.
fn derive(ev: &CmEvent) -> Option<fn(u32) -> AsyncEvent> {
    match ev {
        CmEvent::Established => Some(|qp_num| AsyncEvent::CommEstablished { qp_num }),
        CmEvent::TerminateReceived(_) | CmEvent::TerminateSent(_) | CmEvent::ConnectionError(_) => {
            Some(|qp_num| AsyncEvent::QpFatal { qp_num })
        }
        CmEvent::Disconnected => None,
    }
}

/// Routes a QP's CM events to its device's asynchronous events. The QP number
/// is known only once the provider made the QP, and a connect may establish
/// before that, so events seen earlier wait here until [`QpEventRoute::bind`].
/// A QP fails once: after its first QpFatal, later failures (the transport
/// error that follows a Terminate) raise nothing more.
pub(crate) struct QpEventRoute {
    dev: Arc<EventQueue<AsyncEvent>>,
    state: Mutex<RouteState>,
}

#[derive(Default)]
struct RouteState {
    qp_num: Option<u32>,
    waiting: Vec<fn(u32) -> AsyncEvent>,
    failed: bool,
}

impl QpEventRoute {
    pub(crate) fn new(dev: &Device) -> Arc<Self> {
        Arc::new(QpEventRoute {
            dev: dev.inner.async_events.clone(),
            state: Mutex::new(RouteState::default()),
        })
    }

    /// A CM event queue whose events are also routed here.
    pub(crate) fn cm_queue(self: &Arc<Self>) -> Arc<EventQueue<CmEvent>> {
        let me = self.clone();
        Arc::new(EventQueue::with_tap(move |ev| me.on_cm_event(ev)))
    }

    fn on_cm_event(&self, ev: &CmEvent) {
        let Some(make) = derive(ev) else { return };
        let mut s = self.state.lock().unwrap();
        if *ev != CmEvent::Established {
            if s.failed {
                return;
            }
            s.failed = true;
        }
        match s.qp_num {
            Some(qp_num) => push_bounded(&self.dev, make(qp_num)),
            None => s.waiting.push(make),
        }
    }

    /// The QP exists: deliver what waited.
    pub(crate) fn bind(&self, qp_num: u32) {
        let mut s = self.state.lock().unwrap();
        s.qp_num = Some(qp_num);
        for make in std::mem::take(&mut s.waiting) {
            push_bounded(&self.dev, make(qp_num));
        }
    }
}
