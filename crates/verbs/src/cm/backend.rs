//! The connection manager's provider side: one backend per transport (MPA
//! over TCP for iWARP today; IB CM MADs on QP1 for RoCEv2 next), offered by
//! the provider beside its [`Provider`](crate::provider::Provider).
//!
//! The backend binds a QP that the verbs made ([`QpOps`], in INIT) to a
//! connection, as `rdma_connect` / `rdma_accept` do with the QP of
//! `rdma_create_qp`; it moves the QP to RTS itself (iWARP's MPA, the IB CM's
//! REQ/REP/RTU exchange). Addresses are socket addresses (IP and port, as
//! `rdma_resolve_addr` takes them); nothing here assumes TCP: an IB CM
//! backend maps the port to a service ID.

use crate::ah::Gid;
use crate::cm::event::{ConnInfo, UdParam};
use crate::cm::{PortSpace, RouteOptions};
use crate::error::{Error, Result};
use crate::notify::EventQueue;
use crate::provider::QpOps;
use crate::types::ConnParam;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// A provider's incoming connection, before accept or reject.
pub trait ConnRequestOps: Send {
    /// The initiator's address.
    fn peer_addr(&self) -> SocketAddr;
    /// The local address the request arrived on.
    fn local_addr(&self) -> SocketAddr;
    /// The initiator's private data, without the provider's own bytes.
    fn private_data(&self) -> &[u8];
    /// The peer's IRD/ORD as it stated them.
    fn param(&self) -> ConnParam;
    /// Binds `qp` (in INIT, made by this provider) to the connection and
    /// answers the peer (`rdma_accept`); the QP is in RTS on return.
    fn accept(self: Box<Self>, qp: &Arc<dyn QpOps>, param: &ConnParam) -> Result<ConnInfo>;
    /// Refuses the connection with `private_data` for the initiator (`rdma_reject`).
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<()>;
    /// The port space the request arrived in ([`PortSpace::Tcp`] unless the backend
    /// serves others).
    fn port_space(&self) -> PortSpace {
        PortSpace::Tcp
    }
    /// Answers a UDP-port-space request (`rdma_accept` on a UD ID): tells the requester
    /// `qp`'s number and the Q_Key [`RDMA_UDP_QKEY`](crate::cm::RDMA_UDP_QKEY), with
    /// `private_data`. `qp` is a UD QP of this provider, in RTS.
    fn accept_ud(self: Box<Self>, _qp: &Arc<dyn QpOps>, _private_data: &[u8]) -> Result<()> {
        Err(Error::NotSupported(
            "this connection manager has no UDP port space".into(),
        ))
    }
    /// The IB service ID the request named (a request taken from an IB service listener;
    /// `None` from the rdma_cm port spaces, which hide it).
    fn service_id(&self) -> Option<u64> {
        None
    }
    /// The requester's GID (the REQ's primary-path source GID) on an InfiniBand-style
    /// transport; `None` elsewhere.
    fn peer_gid(&self) -> Option<Gid> {
        None
    }
    /// Refuses with an IB CM REJ `reason` (IBTA table 112: 1 no QP, 8 invalid service ID,
    /// 28 consumer reject, ...) and `private_data`. The default refuses as
    /// [`reject`](Self::reject) does, whatever the reason.
    fn reject_with_reason(self: Box<Self>, _reason: u16, private_data: &[u8]) -> Result<()> {
        self.reject(private_data)
    }
}

/// A provider's listener; dropping it stops listening.
pub trait ListenerOps: Send + Sync {
    /// The address it listens on (the port chosen when 0 was asked for).
    fn local_addr(&self) -> SocketAddr;
}

/// A transport's connection manager.
pub trait CmBackend: Send + Sync {
    /// Starts listening on `addr` (`rdma_bind_addr` + `rdma_listen`);
    /// incoming requests are pushed to `requests`.
    fn listen(
        &self,
        addr: SocketAddr,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>>;
    /// Connects `qp` (in INIT, made by this provider) to a listener
    /// (`rdma_connect`); returns once established (QP in RTS), rejected or failed.
    fn connect(&self, qp: &Arc<dyn QpOps>, addr: SocketAddr, param: &ConnParam, timeout: Duration) -> Result<ConnInfo>;
    /// [`connect`](Self::connect) with a source address and type of service
    /// (not both `None`). The default refuses: a backend that can place a
    /// connection implements it.
    fn connect_routed(
        &self,
        _qp: &Arc<dyn QpOps>,
        _addr: SocketAddr,
        route: &RouteOptions,
        _param: &ConnParam,
        _timeout: Duration,
    ) -> Result<ConnInfo> {
        Err(Error::NotSupported(format!(
            "this connection manager cannot set the source address or type of service ({route:?})"
        )))
    }
    /// Graceful disconnect of a connected QP (`rdma_disconnect`).
    fn disconnect(&self, qp: &Arc<dyn QpOps>);
    /// Listens on `addr` in port space `ps`. The default serves [`PortSpace::Tcp`] with
    /// [`listen`](Self::listen) and refuses the others with `NotSupported` (`EOPNOTSUPP`).
    fn listen_in(
        &self,
        addr: SocketAddr,
        ps: PortSpace,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>> {
        match ps {
            PortSpace::Tcp => self.listen(addr, requests),
            PortSpace::Udp => Err(Error::NotSupported(
                "this connection manager has no UDP port space (RDMA_PS_UDP)".into(),
            )),
        }
    }
    /// Resolves the UD QP listening on `addr` in the UDP port space (rdma_cm's
    /// `rdma_connect` on a UD ID: SIDR on InfiniBand and RoCE) with `private_data` for the
    /// listener. The default refuses with `NotSupported`.
    fn resolve_ud(&self, addr: SocketAddr, _private_data: &[u8], _timeout: Duration) -> Result<UdParam> {
        Err(Error::NotSupported(format!(
            "this connection manager cannot resolve UD peers ({addr})"
        )))
    }
    /// The multicast group of IP multicast address `group` (`rdma_join_multicast`'s MGID,
    /// Q_Key and address vector); the verbs attach the QP to it. The default refuses with
    /// `NotSupported`.
    fn multicast_group(&self, group: IpAddr) -> Result<UdParam> {
        Err(Error::NotSupported(format!(
            "this connection manager has no multicast groups ({group})"
        )))
    }
    /// Listens on a raw IB service ID (IBTA §12.7.3; no rdma_cm header, no port space):
    /// REQs naming it are pushed to `requests` with their private data as sent. The
    /// default refuses with `NotSupported` (`EOPNOTSUPP`): iWARP has no service IDs.
    fn listen_ib_service(
        &self,
        service_id: u64,
        _requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>> {
        Err(Error::NotSupported(format!(
            "this connection manager has no IB service IDs ({service_id:#018x})"
        )))
    }
    /// Connects `qp` (RC, in INIT) to the IB service `service_id` at `gid` with the raw
    /// private data of `param` (no rdma_cm header); returns once established (QP in RTS,
    /// RTU sent), rejected (`Rejected`, the REJ's private data and reason in the detail)
    /// or timed out. The default refuses with `NotSupported` (`EOPNOTSUPP`).
    fn connect_ib_service(
        &self,
        _qp: &Arc<dyn QpOps>,
        _gid: Gid,
        service_id: u64,
        _param: &ConnParam,
        _timeout: Duration,
    ) -> Result<ConnInfo> {
        Err(Error::NotSupported(format!(
            "this connection manager has no IB service IDs ({service_id:#018x})"
        )))
    }
}
