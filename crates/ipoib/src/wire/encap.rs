//! The 4-octet IPoIB encapsulation header (RFC 4391 §6 Figure 3, RFC 4755 §4), in front of
//! every IP and ARP datagram on UD and on connected-mode QPs.
//!
//! ```text
//! off size
//!   0    2  Type: EtherType of the payload (0x0800 IPv4, 0x0806 ARP, 0x86DD IPv6)
//!   2    2  Reserved: 0 on send, ignored on receive
//! ```

use super::{WireError, be16, need, room};

/// The EtherTypes RFC 4391 Table 1 lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// 0x0800.
    Ipv4,
    /// 0x0806 (UD only, IPCM-16).
    Arp,
    /// 0x8035.
    Rarp,
    /// 0x86DD.
    Ipv6,
    /// Any other value (the link drops it).
    Other(u16),
}

impl EtherType {
    /// The 16-bit value.
    pub fn value(self) -> u16 {
        match self {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Rarp => 0x8035,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Other(v) => v,
        }
    }

    /// The variant for a 16-bit value.
    pub fn from_value(v: u16) -> EtherType {
        match v {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x8035 => EtherType::Rarp,
            0x86dd => EtherType::Ipv6,
            v => EtherType::Other(v),
        }
    }
}

/// The encapsulation header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EncapHeader {
    /// Type.
    pub ether_type: EtherType,
    /// Reserved, as received (emitted as 0).
    pub reserved: u16,
}

impl EncapHeader {
    /// Octets on the wire (Linux `IPOIB_ENCAP_LEN`).
    pub const LEN: usize = 4;

    /// A header for `ether_type` with the reserved field 0.
    pub fn new(ether_type: EtherType) -> EncapHeader {
        EncapHeader {
            ether_type,
            reserved: 0,
        }
    }

    /// Parses the header and returns it with the payload after it.
    pub fn parse(b: &[u8]) -> Result<(EncapHeader, &[u8]), WireError> {
        need("IPoIB encapsulation header", b, Self::LEN)?;
        Ok((
            EncapHeader {
                ether_type: EtherType::from_value(be16(b, 0)),
                reserved: be16(b, 2),
            },
            &b[Self::LEN..],
        ))
    }

    /// Writes the header (reserved = 0) into the front of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        room("IPoIB encapsulation header", out, Self::LEN)?;
        out[0..2].copy_from_slice(&self.ether_type.value().to_be_bytes());
        out[2..4].copy_from_slice(&[0, 0]);
        Ok(Self::LEN)
    }

    /// `payload` with the header in front, in a new buffer.
    pub fn encapsulate(ether_type: EtherType, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN + payload.len());
        v.extend_from_slice(&ether_type.value().to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(payload);
        v
    }
}
