//! Asynchronous events of a device (`ibv_get_async_event`): what happens to a
//! QP, CQ or port outside any work request, reported device-wide and apart
//! from the connection manager's events.
//!
//! A QP of the connection manager raises [`AsyncEvent::CommEstablished`] when
//! its connection is established and [`AsyncEvent::QpFatal`] when it fails (a
//! Terminate either way, a transport error), as the kernel's providers do
//! (siw raises `IB_EVENT_QP_FATAL` when a Terminate moves a QP to ERROR). The
//! CM events ([`CmEvent`]) carry the cause; this queue lets one thread watch
//! every QP of a device. At most [`MAX_PENDING_ASYNC_EVENTS`] wait for a
//! reader; beyond that the oldest are dropped.

use crate::cm::CmEvent;
use crate::device::Device;
use crate::notify::EventQueue;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One asynchronous event (`ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_COMM_EST`: the first packet arrived on a QP in RTR, or its connection was established.
    CommEstablished { qp_num: u32 },
    /// `IBV_EVENT_QP_FATAL`: the QP went to the error state on its own.
    QpFatal { qp_num: u32 },
    /// `IBV_EVENT_QP_REQ_ERR`: the peer's request broke the transport's rules.
    QpRequestError { qp_num: u32 },
    /// `IBV_EVENT_QP_ACCESS_ERR`: a peer's access to our memory was refused.
    QpAccessError { qp_num: u32 },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ in ERR consumed its last WQE.
    QpLastWqeReached { qp_num: u32 },
    /// `IBV_EVENT_SQ_DRAINED`: the send queue of a QP in SQD is empty.
    SqDrained { qp_num: u32 },
    /// `IBV_EVENT_CQ_ERR`: a CQ overflowed.
    CqError { cq_id: u32 },
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortActive { port_num: u8 },
    /// `IBV_EVENT_PORT_ERR`.
    PortError { port_num: u8 },
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
}

/// Events kept for a reader; older ones are dropped beyond this, so a device
/// whose owner never reads its events (most programs) holds a bounded amount.
pub const MAX_PENDING_ASYNC_EVENTS: usize = 1024;

fn push_bounded(q: &EventQueue<AsyncEvent>, ev: AsyncEvent) {
    while q.len() >= MAX_PENDING_ASYNC_EVENTS {
        q.try_pop();
    }
    q.push(ev);
}

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
            dev: dev.async_queue().clone(),
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

impl Device {
    pub(crate) fn async_queue(&self) -> &Arc<EventQueue<AsyncEvent>> {
        &self.inner.async_events
    }

    /// The next asynchronous event, waiting up to `timeout` (`ibv_get_async_event`).
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Option<AsyncEvent> {
        self.inner.async_events.pop_timeout(timeout)
    }

    /// Async [`get_async_event`](Self::get_async_event).
    pub async fn next_async_event(&self) -> Option<AsyncEvent> {
        self.inner.async_events.pop_async().await
    }

    /// For providers: raise an event that is not a QP's CM event (CQ overflow, port change).
    pub fn raise_async_event(&self, ev: AsyncEvent) {
        push_bounded(&self.inner.async_events, ev)
    }
}
