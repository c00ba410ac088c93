//! Asynchronous events of a device (`ibv_get_async_event`): what happens to a
//! QP, CQ or port outside any work request, reported device-wide and apart
//! from the connection manager's events.
//!
//! A QP of the connection manager raises [`AsyncEvent::CommEstablished`] when
//! its connection is established and [`AsyncEvent::QpFatal`] when it fails (a
//! Terminate either way, a transport error), as the kernel's providers do
//! (siw raises `IB_EVENT_QP_FATAL` when a Terminate moves a QP to ERROR). The
//! CM events ([`CmEvent`](crate::cm::CmEvent)) carry the cause; this queue lets one thread watch
//! every QP of a device. At most [`MAX_PENDING_ASYNC_EVENTS`] wait for a
//! reader; beyond that the oldest are dropped.

use crate::notify::EventQueue;

/// One asynchronous event (`ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_COMM_EST`: the first packet arrived on a QP in RTR, or its connection was established.
    CommEstablished {
        /// The QP it is about.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_FATAL`: the QP went to the error state on its own.
    QpFatal {
        /// The QP it is about.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: the peer's request broke the transport's rules.
    QpRequestError {
        /// The QP it is about.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: a peer's access to our memory was refused.
    QpAccessError {
        /// The QP it is about.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ in ERR consumed its last WQE.
    QpLastWqeReached {
        /// The QP it is about.
        qp_num: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`: the send queue of a QP in SQD is empty.
    SqDrained {
        /// The QP it is about.
        qp_num: u32,
    },
    /// `IBV_EVENT_CQ_ERR`: a CQ overflowed.
    CqError {
        /// The CQ (`CompletionQueue::id`).
        cq_id: u32,
    },
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortActive {
        /// The port (from 1).
        port_num: u8,
    },
    /// `IBV_EVENT_PORT_ERR`.
    PortError {
        /// The port (from 1).
        port_num: u8,
    },
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
}

/// Events kept for a reader; older ones are dropped beyond this, so a device
/// whose owner never reads its events (most programs) holds a bounded amount.
pub const MAX_PENDING_ASYNC_EVENTS: usize = 1024;

pub(crate) fn push_bounded(q: &EventQueue<AsyncEvent>, ev: AsyncEvent) {
    while q.len() >= MAX_PENDING_ASYNC_EVENTS {
        q.try_pop();
    }
    q.push(ev);
}
