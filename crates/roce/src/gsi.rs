//! The seam between the RoCEv2 device's data path and the IB CM on QP1 (the GSI, IBA vol. 1
//! ch. 13, §13.5 unconfirmed): the engine owns UDP port 4791 and sees every packet, the CM owns the MADs.
//!
//! The engine demultiplexes on the BTH's destination QP. A packet for QP1 that passes its
//! checks (ICRC, UD SEND_ONLY with a DETH, the GSI Q_Key 0x80010000, a P_Key in the device's
//! table) goes to the [`GsiHandler`] the CM registered, without the BTH, DETH and ICRC. The
//! CM answers through [`GsiPort::send_mad`], which builds the BTH (UD SEND_ONLY, destination
//! QP 1, QP1's own PSN counter), the DETH (Q_Key 0x80010000, source QP 1) and the ICRC, and
//! sends to the GID's address on UDP port 4791.

use std::io;
use std::sync::{Arc, Weak};
use verbs::Gid;
use verbs::notify::EventQueue;

/// The GSI Q_Key (IBA vol. 1 ch. 13, the GSI's "well-known Q_Key"; §13.5.1 unconfirmed).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// What receives the MADs that arrive on QP1 (the CM).
pub trait GsiHandler: Send + Sync + 'static {
    /// A MAD arrived: `from` is the sender's GID (its IP address, IPv4-mapped for IPv4),
    /// `src_qp` the DETH's source QP, `pkey` the BTH's P_Key, `mad` the bytes between the
    /// DETH and the ICRC (256 for a CM MAD).
    fn on_mad(&self, from: Gid, src_qp: u32, pkey: u16, mad: &[u8]);
}

/// What a RoCEv2 device offers its CM: QP1's send side and the handler registration.
pub trait GsiPort: Send + Sync + 'static {
    /// The GID MADs are sent from (GID index 0 of port 1).
    fn local_gid(&self) -> Gid;
    /// Sends `mad` from QP1 to QP1 at `to` (GSI Q_Key, default P_Key).
    fn send_mad(&self, to: Gid, mad: &[u8]) -> io::Result<()>;
    /// Registers the handler of incoming MADs, replacing any earlier one. A weak reference:
    /// the device does not keep its CM alive.
    fn set_gsi_handler(&self, handler: Weak<dyn GsiHandler>);
    /// The connection-event queue of the device's QP number `qpn` (the `events` of the
    /// [`verbs::provider::QpCreate`] it was made with), for the CM to report
    /// `Established`, `Disconnected` and failures of connections the peer ends. `None`
    /// (the default) when the QP is gone or the device does not tell: the CM then still
    /// moves the QP to ERR, but the application sees no CM event.
    fn qp_events(&self, _qpn: u32) -> Option<Arc<EventQueue<verbs::CmEvent>>> {
        None
    }
}
