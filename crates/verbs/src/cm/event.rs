//! What the connection manager reports: connection events, what a
//! connection negotiated, and the provider-specific detail of a failure.

use std::any::Any;
use std::fmt;
use std::net::SocketAddr;

use crate::ah::AhAttr;
use std::sync::Arc;

/// Transport-specific detail of a failure, from the provider that saw it
/// (iWARP: a Terminate's layer/type/code, an MPA Reply's IRD/ORD block). It
/// prints for people; a program that knows the provider downcasts it to the
/// provider's type ([`ErrorDetail::downcast_ref`]).
pub trait ProviderDetail: Any + fmt::Display + fmt::Debug + Send + Sync {}

impl<T: Any + fmt::Display + fmt::Debug + Send + Sync> ProviderDetail for T {}

/// A provider's [`ProviderDetail`], shared and cheap to clone, with an optional numeric
/// reason a provider-independent program can act on ([`ErrorDetail::code`]).
#[derive(Clone)]
pub struct ErrorDetail(Arc<dyn ProviderDetail>, Option<u32>);

impl ErrorDetail {
    /// Wraps a provider's detail value.
    pub fn new(detail: impl ProviderDetail) -> Self {
        ErrorDetail(Arc::new(detail), None)
    }
    /// Wraps a provider's detail value with the transport's numeric reason (the IB CM: the
    /// REJ reason of IBTA table 112).
    pub fn with_code(detail: impl ProviderDetail, code: u32) -> Self {
        ErrorDetail(Arc::new(detail), Some(code))
    }
    /// The transport's numeric reason, where the provider gave one (an IB CM REJ: its
    /// reason, 8 invalid service ID, 28 consumer reject, ...).
    pub fn code(&self) -> Option<u32> {
        self.1
    }
    /// The provider's own type, if it is `T`.
    pub fn downcast_ref<T: ProviderDetail>(&self) -> Option<&T> {
        let any: &dyn Any = &*self.0;
        any.downcast_ref::<T>()
    }
}

impl fmt::Display for ErrorDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

/// Two details are equal when the provider's values print the same
/// (`Debug`), which for the providers' plain data types is field equality.
impl PartialEq for ErrorDetail {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

impl Eq for ErrorDetail {}

impl fmt::Debug for ErrorDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Connection events of one QP (`rdma_cm_event_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established,
    /// The peer reported a fatal error on the connection (iWARP: it sent a
    /// Terminate); the QP is in the error state.
    ErrorReceived(ErrorDetail),
    /// We ended the connection because the peer broke the protocol, and told
    /// it why (iWARP: we sent a Terminate); the QP is in the error state.
    ErrorSent(ErrorDetail),
    /// `RDMA_CM_EVENT_DISCONNECTED`: the connection is closed.
    Disconnected,
    /// The transport failed (e.g. TCP reset).
    ConnectionError(String),
}

impl CmEvent {
    /// The provider detail of a failure event.
    pub fn detail(&self) -> Option<&ErrorDetail> {
        match self {
            CmEvent::ErrorReceived(d) | CmEvent::ErrorSent(d) => Some(d),
            _ => None,
        }
    }
}

/// What a connection negotiated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Our end of the connection.
    pub local_addr: SocketAddr,
    /// The peer's end of the connection.
    pub peer_addr: SocketAddr,
    /// Inbound Reads/atomics we accept at once.
    pub responder_resources: u32,
    /// Outbound Reads/atomics we may have outstanding.
    pub initiator_depth: u32,
    /// The peer's private data (connect request or accept reply), without
    /// the provider's own bytes.
    pub peer_private_data: Vec<u8>,
    /// Provider detail for people, e.g. "MPA rev 2, CRC on, markers off".
    pub detail: String,
}

impl ConnInfo {
    /// What a QP that is not connected reports: unspecified addresses, nothing negotiated.
    pub fn unconnected() -> ConnInfo {
        let any = SocketAddr::from(([0, 0, 0, 0], 0));
        ConnInfo {
            local_addr: any,
            peer_addr: any,
            responder_resources: 0,
            initiator_depth: 0,
            peer_private_data: Vec::new(),
            detail: "not connected".into(),
        }
    }
}

/// What an unreliable-datagram peer or group resolved to (`rdma_ud_param`): where UD sends
/// go. [`QueuePair::connect_ud`](crate::QueuePair::connect_ud) returns the remote QP's
/// (rdma_cm's `RDMA_CM_EVENT_ESTABLISHED` on a UDP ID, from the SIDR_REP);
/// [`QueuePair::join_multicast`](crate::QueuePair::join_multicast) the group's
/// (`RDMA_CM_EVENT_MULTICAST_JOIN`: QPN 0xFFFFFF, the MGID as destination).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// The peer's address vector (its GID, or the group's MGID); make the
    /// [`AddressHandle`](crate::AddressHandle) of the sends from it.
    pub ah_attr: AhAttr,
    /// The remote QP number (0xFFFFFF for a multicast group).
    pub qp_num: u32,
    /// The Q_Key the sends carry.
    pub qkey: u32,
    /// The peer's private data (the SIDR_REP's 136 octets; empty for a group).
    pub private_data: Vec<u8>,
}
