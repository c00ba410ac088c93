//! ARP over IPoIB (RFC 4391 §9.2 on RFC 826): hardware type 32 (InfiniBand), protocol
//! 0x0800, hardware length 20, protocol length 4; the hardware addresses are IPoIB
//! link-layer addresses. 56 octets, carried in UD packets with encapsulation type 0x0806.
//!
//! ```text
//! off size
//!   0    2  hardware type = 32
//!   2    2  protocol = 0x0800
//!   4    1  hardware address length = 20
//!   5    1  protocol address length = 4
//!   6    2  operation (1 request, 2 reply)
//!   8   20  sender hardware address
//!  28    4  sender protocol address
//!  32   20  target hardware address
//!  52    4  target protocol address
//! ```

use std::net::Ipv4Addr;

use super::lla::LinkAddr;
use super::{WireError, be16, need, room};

/// ARP hardware type of InfiniBand (IANA; RFC 4391 §9.2; Linux `ARPHRD_INFINIBAND`).
pub const HTYPE_INFINIBAND: u16 = 32;
/// ARP protocol type of IPv4.
pub const PTYPE_IPV4: u16 = 0x0800;

/// The ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOp {
    /// 1.
    Request,
    /// 2.
    Reply,
}

/// An IPoIB ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpPacket {
    /// Operation.
    pub op: ArpOp,
    /// Sender hardware address.
    pub sender_hw: LinkAddr,
    /// Sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// Target hardware address (all zero in a request).
    pub target_hw: LinkAddr,
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

impl ArpPacket {
    /// Octets on the wire.
    pub const LEN: usize = 56;

    /// Parses an ARP packet (without the encapsulation header). Anything but hardware type
    /// 32 / IPv4 / lengths 20 and 4 / operation 1 or 2 is an error (the link drops it).
    /// Octets after the 56 are ignored (padding).
    pub fn parse(b: &[u8]) -> Result<ArpPacket, WireError> {
        need("ARP", b, 8)?;
        let htype = be16(b, 0);
        if htype != HTYPE_INFINIBAND {
            return Err(WireError::Invalid {
                field: "ARP hardware type",
                value: htype.into(),
            });
        }
        let ptype = be16(b, 2);
        if ptype != PTYPE_IPV4 {
            return Err(WireError::Invalid {
                field: "ARP protocol type",
                value: ptype.into(),
            });
        }
        if b[4] != LinkAddr::LEN as u8 {
            return Err(WireError::Invalid {
                field: "ARP hardware address length",
                value: b[4].into(),
            });
        }
        if b[5] != 4 {
            return Err(WireError::Invalid {
                field: "ARP protocol address length",
                value: b[5].into(),
            });
        }
        let op = match be16(b, 6) {
            1 => ArpOp::Request,
            2 => ArpOp::Reply,
            v => {
                return Err(WireError::Invalid {
                    field: "ARP operation",
                    value: v.into(),
                });
            }
        };
        need("ARP", b, Self::LEN)?;
        let ip = |at: usize| Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]);
        Ok(ArpPacket {
            op,
            sender_hw: LinkAddr::parse(&b[8..28])?,
            sender_ip: ip(28),
            target_hw: LinkAddr::parse(&b[32..52])?,
            target_ip: ip(52),
        })
    }

    /// Writes the 56 octets into the front of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        room("ARP", out, Self::LEN)?;
        out[0..2].copy_from_slice(&HTYPE_INFINIBAND.to_be_bytes());
        out[2..4].copy_from_slice(&PTYPE_IPV4.to_be_bytes());
        out[4] = LinkAddr::LEN as u8;
        out[5] = 4;
        let op: u16 = match self.op {
            ArpOp::Request => 1,
            ArpOp::Reply => 2,
        };
        out[6..8].copy_from_slice(&op.to_be_bytes());
        self.sender_hw.emit(&mut out[8..28])?;
        out[28..32].copy_from_slice(&self.sender_ip.octets());
        self.target_hw.emit(&mut out[32..52])?;
        out[52..56].copy_from_slice(&self.target_ip.octets());
        Ok(Self::LEN)
    }

    /// The 56 octets.
    pub fn to_bytes(&self) -> [u8; 56] {
        let mut b = [0u8; 56];
        let _ = self.emit(&mut b);
        b
    }
}
