//! Queue pairs (`ibv_qp`): [`ProtectionDomain::create_qp`] makes one in
//! RESET through the provider; [`QueuePair::modify_qp`] moves it, checked
//! against the IBTA table ([`check_modify`]) and then carried out by the
//! provider; the connection manager ([`crate::cm`]) binds an RC QP to a
//! connection. Also address handles, shared receive queues and multicast
//! attach, which need a protection domain or a QP.

use crate::ah::AddressHandle;
use crate::async_event::{AsyncEvent, push_bounded};
use crate::cm::event::{CmEvent, ConnInfo};
use crate::cq::CompletionQueue;
use crate::device::{Device, ProtectionDomain};
use crate::error::{InvalidArg, Result};
use crate::notify::EventQueue;
use crate::provider::{QpCreate, QpOps, SrqInitAttr, SrqOps};
use crate::qp_attr::{AhAttr, Gid, QpAttr, QpType, check_modify};
use crate::types::{QpInitAttr, QpState, RecvWr, SendWr, WorkCompletion};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// What `create_qp` takes (`ibv_qp_init_attr`).
#[derive(Clone)]
pub struct QpInit {
    /// The transport service type (RC, UD, ...).
    pub qp_type: QpType,
    /// The CQ of send completions.
    pub send_cq: CompletionQueue,
    /// The CQ of receive completions.
    pub recv_cq: CompletionQueue,
    /// Receives come from this shared receive queue.
    pub srq: Option<SharedReceiveQueue>,
    /// Queue capacities (`ibv_qp_cap`).
    pub cap: QpInitAttr,
}

impl QpInit {
    /// A QP of type `qp_type` with one CQ for both queues and default capacities.
    pub fn new(qp_type: QpType, cq: &CompletionQueue) -> Self {
        QpInit {
            qp_type,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpInitAttr::default(),
        }
    }
    /// A separate CQ for receive completions.
    pub fn recv_cq(mut self, cq: &CompletionQueue) -> Self {
        self.recv_cq = cq.clone();
        self
    }
    /// Take receives from a shared receive queue.
    pub fn srq(mut self, srq: &SharedReceiveQueue) -> Self {
        self.srq = Some(srq.clone());
        self
    }
    /// Queue capacities.
    pub fn cap(mut self, cap: QpInitAttr) -> Self {
        self.cap = cap;
        self
    }
}

impl ProtectionDomain {
    /// Creates a queue pair in RESET (`ibv_create_qp`). A provider refuses a
    /// type its transport lacks with `NotSupported` (iWARP: all but RC).
    pub fn create_qp(&self, init: QpInit) -> Result<QueuePair> {
        let dev = self.device();
        let a = dev.attr();
        let cap = &init.cap;
        if cap.max_send_wr > a.max_qp_wr || cap.max_recv_wr > a.max_qp_wr {
            return Err(InvalidArg::QpWr {
                send: cap.max_send_wr,
                recv: cap.max_recv_wr,
                max: a.max_qp_wr,
            }
            .into());
        }
        if cap.max_send_sge > a.max_sge || cap.max_recv_sge > a.max_sge {
            return Err(InvalidArg::QpSge {
                send: cap.max_send_sge,
                recv: cap.max_recv_sge,
                max: a.max_sge,
            }
            .into());
        }
        if let Some(srq) = &init.srq
            && srq.pd_id != self.id()
        {
            return Err(InvalidArg::OtherPd("SRQ").into());
        }
        let route = QpEventRoute::new(dev);
        let events = route.cm_queue();
        let ops = dev.provider().create_qp(QpCreate {
            qp_type: init.qp_type,
            pd_id: self.id(),
            mem: dev.mem_arc().clone(),
            send_cq: init.send_cq.clone(),
            recv_cq: init.recv_cq.clone(),
            srq: init.srq.as_ref().map(|s| s.ops.clone()),
            attr: init.cap.clone(),
            events: events.clone(),
            async_events: crate::provider::AsyncEventSink(dev.inner.async_events.clone()),
        })?;
        route.bind(ops.qp_num());
        Ok(QueuePair {
            ops,
            qp_type: init.qp_type,
            events,
            pd: self.clone(),
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            conn: OnceLock::new(),
        })
    }

    /// Creates an address handle (`ibv_create_ah`) for UD sends.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        let ops = self.device().provider().create_ah(self.id(), attr)?;
        Ok(AddressHandle::new(ops, self.id()))
    }

    /// Creates an address handle back to the sender of a UD receive
    /// (`ibv_create_ah_from_wc`): `grh` is the first 40 octets of the receive buffer of
    /// `wc`. Our GID index is the one that matches the GRH's destination (0 for a
    /// multicast destination), as rdma-core looks it up.
    pub fn create_ah_from_wc(&self, wc: &WorkCompletion, grh: &[u8], port_num: u8) -> Result<AddressHandle> {
        let g = crate::ah::Grh::parse(grh).ok_or(InvalidArg::NoGrh)?;
        let mut sgid_index = 0u8;
        if !g.dgid.is_multicast() {
            for i in 0..=u8::MAX {
                match self.device().query_gid(port_num, u32::from(i)) {
                    Ok(gid) if gid == g.dgid => {
                        sgid_index = i;
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        let attr = AhAttr::from_wc(wc, grh, sgid_index, port_num).ok_or(InvalidArg::NoGrh)?;
        self.create_ah(&attr)
    }

    /// Creates a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, attr: &SrqInitAttr) -> Result<SharedReceiveQueue> {
        let a = self.device().attr();
        if attr.max_wr == 0 || attr.max_wr > a.max_qp_wr || attr.max_sge > a.max_sge {
            return Err(InvalidArg::SrqCap {
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                dev_max_wr: a.max_qp_wr,
                dev_max_sge: a.max_sge,
            }
            .into());
        }
        let ops = self.device().provider().create_srq(self.id(), attr)?;
        Ok(SharedReceiveQueue { ops, pd_id: self.id() })
    }
}

/// A shared receive queue (`ibv_srq`). Cheap to clone; destroyed with its
/// last handle (QPs using it hold one).
#[derive(Clone)]
pub struct SharedReceiveQueue {
    ops: Arc<dyn SrqOps>,
    pd_id: u32,
}

impl SharedReceiveQueue {
    /// Posts receive buffers (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        self.ops.post_recv(wrs)
    }
    /// Its attributes (`ibv_query_srq`).
    pub fn query(&self) -> SrqInitAttr {
        self.ops.query()
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedReceiveQueue({:?})", self.ops.query())
    }
}

/// A queue pair (`ibv_qp`; with the connection manager also its `rdma_cm_id`).
/// Dropping it disconnects a connected QP and destroys it (`ibv_destroy_qp`).
pub struct QueuePair {
    ops: Arc<dyn QpOps>,
    qp_type: QpType,
    events: Arc<EventQueue<CmEvent>>,
    pd: ProtectionDomain,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
    /// Set once the connection manager bound the QP to a connection.
    conn: OnceLock<ConnInfo>,
}

impl QueuePair {
    /// The QP number (`qp_num`).
    pub fn qp_num(&self) -> u32 {
        self.ops.qp_num()
    }
    /// The current state (`ibv_query_qp`'s `qp_state`).
    pub fn state(&self) -> QpState {
        self.ops.state()
    }
    /// The QP's transport service type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
    /// The CQ of send completions.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.send_cq
    }
    /// The CQ of receive completions.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.recv_cq
    }
    /// The shared receive queue, if it takes receives from one.
    pub fn srq(&self) -> Option<&SharedReceiveQueue> {
        self.srq.as_ref()
    }
    /// For providers and the connection manager: the provider's QP.
    pub(crate) fn ops(&self) -> &Arc<dyn QpOps> {
        &self.ops
    }
    /// Posts work requests to the send queue (`ibv_post_send`).
    #[inline]
    pub fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        self.ops.post_send(wrs)
    }
    /// Posts one send work request.
    #[inline]
    pub fn post_send_one(&self, wr: SendWr) -> Result<()> {
        self.ops.post_send_owned(wr)
    }
    /// Posts receive buffers (`ibv_post_recv`); allowed from INIT on.
    #[inline]
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        self.ops.post_recv(wrs)
    }
    /// Modifies the QP (`ibv_modify_qp`). The call is checked against the
    /// IBTA transition table first ([`check_modify`]), then the provider
    /// carries it out or refuses what its transport cannot do (iWARP: RTR and
    /// RTS, which its connection manager drives, as the kernel's iw_cm does).
    pub fn modify_qp(&self, attr: &QpAttr) -> Result<()> {
        check_modify(self.qp_type, self.state(), attr)?;
        self.ops.modify_qp(attr)
    }
    /// The QP's current attributes (`ibv_query_qp`), as the provider knows them.
    pub fn query_qp(&self) -> QpAttr {
        self.ops.query_qp()
    }
    /// Forces the QP to the error state; outstanding work completes with
    /// `WrFlushErr` (`modify_qp` to ERR, which is legal from every state).
    pub fn set_error(&self) {
        if let Err(e) = self.modify_qp(&QpAttr::state(QpState::Err)) {
            tracing::debug!("QP {}: to ERR: {e}", self.qp_num());
        }
    }
    /// Joins a multicast group (`ibv_attach_mcast`; UD QPs only).
    pub fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        self.check_mcast(gid)?;
        self.pd.device().provider().attach_mcast(&*self.ops, gid, lid)
    }
    /// Leaves a multicast group (`ibv_detach_mcast`).
    pub fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        self.check_mcast(gid)?;
        self.pd.device().provider().detach_mcast(&*self.ops, gid, lid)
    }
    fn check_mcast(&self, gid: &Gid) -> Result<()> {
        if self.qp_type != QpType::Ud {
            return Err(InvalidArg::McastQpType(self.qp_type).into());
        }
        if !gid.is_multicast() {
            return Err(InvalidArg::NotMulticast(*gid).into());
        }
        Ok(())
    }

    /// What the connection negotiated; [`ConnInfo::unconnected`] before a
    /// connection manager bound the QP.
    pub fn conn_info(&self) -> ConnInfo {
        self.conn.get().cloned().unwrap_or_else(ConnInfo::unconnected)
    }
    /// Whether the connection manager bound this QP to a connection.
    pub fn is_connected(&self) -> bool {
        self.conn.get().is_some()
    }
    pub(crate) fn set_connected(&self, info: ConnInfo) {
        let _ = self.conn.set(info);
    }
    /// Graceful disconnect (`rdma_disconnect`) of a connected QP; nothing otherwise.
    pub fn disconnect(&self) {
        if self.conn.get().is_some()
            && let Some(cm) = self.pd.device().cm_backend()
        {
            cm.disconnect(&self.ops);
        }
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
        self.disconnect();
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QueuePair({}, {:?}, {:?})",
            self.qp_num(),
            self.qp_type,
            self.state()
        )
    }
}

// ---- device-wide asynchronous events derived from a QP's CM events ----

/// The device-wide event it raises, if any, as a function of the QP number.
fn derive(ev: &CmEvent) -> Option<fn(u32) -> AsyncEvent> {
    match ev {
        CmEvent::Established => Some(|qp_num| AsyncEvent::CommEstablished { qp_num }),
        CmEvent::ErrorReceived(_) | CmEvent::ErrorSent(_) | CmEvent::ConnectionError(_) => {
            Some(|qp_num| AsyncEvent::QpFatal { qp_num })
        }
        CmEvent::Disconnected => None,
    }
}

/// Routes a QP's CM events to its device's asynchronous events, so QP fatal
/// and communication established reach `ibv_get_async_event` readers apart
/// from the CM events. Events seen before [`QpEventRoute::bind`] wait here. A
/// QP fails once: after its first QpFatal, later failures (the transport
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
        if !matches!(ev, CmEvent::Established) {
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
