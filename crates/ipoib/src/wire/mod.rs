//! IPoIB wire formats, sans-I/O: parse and emit on byte slices only.
//!
//! - [`lla`]: the 20-octet link-layer address (RFC 4391 §9.1.1, flags of RFC 4755 §3.1).
//! - [`encap`]: the 4-octet encapsulation header (RFC 4391 §6, RFC 4755 §4).
//! - [`arp`]: ARP with hardware type 32 and 20-octet hardware addresses (RFC 4391 §9.2).
//! - [`nd`]: IPv6 headers, ICMPv6 checksums, Neighbor Solicitation/Advertisement with the
//!   IPoIB source/target link-layer address option (RFC 4391 §9.3, RFC 4861).
//! - [`mgid`]: broadcast and multicast GIDs with the P_Key (RFC 4391 §4), and the RFC 4391
//!   §8 interface identifier / link-local address from a GID.
//! - [`cm`]: the connected-mode service ID and 8-octet CM private data (RFC 4755 §3.5, §6)
//!   and the MTU rules (RFC 4391 §7, RFC 4755 §5).
//! - [`icmp`]: the ICMP "fragmentation needed" and ICMPv6 "packet too big" the link sends
//!   back to the kernel for an oversize packet (RFC 792/1191, RFC 4443 §3.2).
//! - [`offload`]: the TUN's virtio-net header, partial checksums filled in, and the
//!   softrdma extension that carries them over an RC connection (issue 16).
//!
//! Every length that comes from a peer is checked before use; nothing here panics on peer
//! input, performs I/O or reads a clock. Reserved fields are kept as read (so parse → emit
//! reproduces the octets); senders set them to 0 and receivers ignore them (IPCM-4, IPCM-17).
//!
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` B1 (all), C2.

pub mod arp;
pub mod cm;
pub mod encap;
pub mod icmp;
pub mod ip;
pub mod lla;
pub mod mgid;
pub mod nd;
pub mod offload;

pub use arp::{ArpOp, ArpPacket};
pub use cm::{CmPrivateData, ServiceId, ServiceIdPrefix};
pub use encap::{EncapHeader, EtherType};
pub use lla::LinkAddr;
pub use mgid::Mgid;

/// An IPoIB wire element could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    /// The input is shorter than the element's layout (peer input).
    #[error("{what} needs {need} octets, {have} present")]
    Truncated {
        /// The element being parsed ("ARP", "LLA", ...).
        what: &'static str,
        /// Octets its layout needs.
        need: usize,
        /// Octets present.
        have: usize,
    },
    /// An emit buffer was too small (a local bug, never peer input).
    #[error("emitting {what} needs {need} octets, buffer has {have}")]
    BufferTooSmall {
        /// The element being emitted.
        what: &'static str,
        /// Octets needed.
        need: usize,
        /// Octets available.
        have: usize,
    },
    /// A field holds a value the protocol does not allow here (peer input).
    #[error("{field} = {value:#x} is not allowed")]
    Invalid {
        /// The field ("ARP hardware type", "service ID type", ...).
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// An ICMPv6 checksum did not verify.
    #[error("ICMPv6 checksum {found:#06x} does not verify")]
    Checksum {
        /// The checksum field as received.
        found: u16,
    },
}

pub(crate) fn need(what: &'static str, b: &[u8], len: usize) -> Result<(), WireError> {
    if b.len() < len {
        Err(WireError::Truncated {
            what,
            need: len,
            have: b.len(),
        })
    } else {
        Ok(())
    }
}

pub(crate) fn room(what: &'static str, b: &[u8], len: usize) -> Result<(), WireError> {
    if b.len() < len {
        Err(WireError::BufferTooSmall {
            what,
            need: len,
            have: b.len(),
        })
    } else {
        Ok(())
    }
}

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The 24-bit QPN field mask.
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// The QPN of a multicast/broadcast link-layer address (RFC 4391 §4; requirements C2).
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;
