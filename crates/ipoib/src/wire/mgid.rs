//! Multicast GIDs of an IPoIB link (RFC 4391 §4, Figures 1 and 2) and the IPv6 interface
//! identifier / link-local address derived from a port GID (RFC 4391 §8, §8.1).
//!
//! ```text
//! |   8    |  4 |  4 |    16 bits      | 16 bits |      80 bits      |
//! |11111111|0001|scop|<IPoIB signature>|< P_Key >|      group ID     |
//! ```
//!
//! The signature is 0x401B for IPv4, 0x601B for IPv6; the T flag is always 1 (transient).
//! IPv4 groups fill the low 28 bits, IPv6 groups the low 80 bits; 255.255.255.255 maps to
//! the broadcast GID `FF1Z:401B:PPPP::FFFF:FFFF`. The P_Key always carries the full
//! membership bit (RFC 4391 §4.1 item 1).

use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// IPoIB signature of IPv4 MGIDs.
pub const SIGNATURE_IPV4: u16 = 0x401b;
/// IPoIB signature of IPv6 MGIDs.
pub const SIGNATURE_IPV6: u16 = 0x601b;
/// Link-local (single IB subnet) scope, the RFC 4391 §4.1 recommended default.
pub const SCOPE_LINK_LOCAL: u8 = 0x2;
/// The full-membership bit of a P_Key (RFC 4391 §4.1).
pub const PKEY_FULL_MEMBER: u16 = 0x8000;

/// A multicast GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mgid(pub [u8; 16]);

impl Mgid {
    fn head(signature: u16, pkey: u16, scope: u8) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[0] = 0xff;
        g[1] = 0x10 | (scope & 0x0f);
        g[2..4].copy_from_slice(&signature.to_be_bytes());
        g[4..6].copy_from_slice(&(pkey | PKEY_FULL_MEMBER).to_be_bytes());
        g
    }

    /// The broadcast GID (Figure 2).
    pub fn broadcast(pkey: u16, scope: u8) -> Mgid {
        let mut g = Self::head(SIGNATURE_IPV4, pkey, scope);
        g[12..16].copy_from_slice(&[0xff; 4]);
        Mgid(g)
    }

    /// The MGID of an IPv4 multicast group: its low 28 bits (Figure 1).
    /// 255.255.255.255 gives the broadcast GID.
    pub fn ipv4(group: Ipv4Addr, pkey: u16, scope: u8) -> Mgid {
        if group == Ipv4Addr::BROADCAST {
            return Self::broadcast(pkey, scope);
        }
        let mut g = Self::head(SIGNATURE_IPV4, pkey, scope);
        g[12..16].copy_from_slice(&(u32::from(group) & 0x0fff_ffff).to_be_bytes());
        Mgid(g)
    }

    /// The MGID of an IPv6 multicast group: its low 80 bits (Figure 1).
    pub fn ipv6(group: Ipv6Addr, pkey: u16, scope: u8) -> Mgid {
        let mut g = Self::head(SIGNATURE_IPV6, pkey, scope);
        g[6..16].copy_from_slice(&group.octets()[6..16]);
        Mgid(g)
    }

    /// The all-nodes group ff02::1's MGID (IPv6 ND, router advertisements).
    pub fn all_nodes(pkey: u16, scope: u8) -> Mgid {
        Self::ipv6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), pkey, scope)
    }

    /// The GID as an IPv6 address (for printing; on an IPv6 underlay it is also the
    /// multicast address the group's UD packets go to, requirements D3).
    pub fn to_ipv6(self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// `(scope, signature, P_Key)` if this is an IPoIB MGID (0xFF, T flag set, a known
    /// signature), else `None`.
    pub fn classify(&self) -> Option<(u8, u16, u16)> {
        let g = &self.0;
        let sig = u16::from_be_bytes([g[2], g[3]]);
        if g[0] != 0xff || g[1] & 0xf0 != 0x10 || (sig != SIGNATURE_IPV4 && sig != SIGNATURE_IPV6) {
            return None;
        }
        Some((g[1] & 0x0f, sig, u16::from_be_bytes([g[4], g[5]])))
    }
}

impl fmt::Display for Mgid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_ipv6())
    }
}

/// The RFC 4391 §8 interface identifier from a port GID: the GID's low 64 bits (the port
/// GUID) with the universal/local bit (0x02 of the first octet) set.
///
/// RFC 4391 §8 asks to toggle the bit only if the GUID is an unmodified EUI-64, without
/// saying how to tell; IBTA GUIDs are IEEE EUI-64 (universal, bit clear), so setting the
/// bit is the toggle for them, and it is what Linux's `addrconf_ifid_infiniband` does.
pub fn interface_id(gid: &[u8; 16]) -> [u8; 8] {
    let mut id = [0u8; 8];
    id.copy_from_slice(&gid[8..16]);
    id[0] |= 0x02;
    id
}

/// The IPv6 link-local address `fe80::/64` + [`interface_id`] (RFC 4391 §8.1).
pub fn link_local(gid: &[u8; 16]) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a[0] = 0xfe;
    a[1] = 0x80;
    a[8..16].copy_from_slice(&interface_id(gid));
    Ipv6Addr::from(a)
}
