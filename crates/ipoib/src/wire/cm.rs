//! Connected mode: the service ID (RFC 4755 §3.5), the 8-octet CM private data (§3.2, §6)
//! and the MTU rules (RFC 4391 §7, RFC 4755 §5, §5.1).
//!
//! ```text
//! Service ID (64 bits)            Private data (first 8 octets of the CM private data)
//! byte 0    prefix 0x10 (Linux) / 0x01 (RFC figure)   off 0 (1) Reserved, 0
//! byte 1    Type = 0                                  off 1 (3) sender's UD QPN
//! byte 2-4  Reserved = 0                              off 4 (4) Receive MTU
//! byte 5-7  the target's UD QPN
//! ```
//!
//! Prefix: RFC 4755 §3.5 draws the IETF block as 00000001, Linux uses
//! `IPOIB_CM_IETF_ID = 0x1000000000000000`; we send Linux's form by default and accept
//! both (requirements E-16). The Receive MTU counts the 4-octet encapsulation header
//! (requirements E-19): Linux sends `IPOIB_CM_BUF_SIZE` = 65,520 + 4.

use super::encap::EncapHeader;
use super::{QPN_MASK, WireError, be24, be32, need, room};

/// The interface MTU every IPoIB implementation supports: 2,048-octet link MTU − 4
/// (RFC 4391 §7; RFC 4755 §5 default).
pub const UD_MTU: u32 = 2044;
/// The connected-mode IP MTU Linux uses (`IPOIB_CM_MTU` = 0x10000 − 0x10).
pub const CM_MTU: u32 = 65520;
/// The Receive MTU we advertise in connected mode: [`CM_MTU`] + the encapsulation header.
pub const CM_RECV_MTU: u32 = CM_MTU + EncapHeader::LEN as u32;
/// The smallest IP MTU the link may carry: IPv6's minimum (RFC 8200 §5), so IPCM-12.
pub const MIN_IP_MTU: u32 = 1280;
/// The smallest Receive MTU a peer may advertise ([`MIN_IP_MTU`] + 4).
pub const MIN_RECV_MTU: u32 = MIN_IP_MTU + EncapHeader::LEN as u32;

/// The IETF prefix form of the service ID's first octet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceIdPrefix {
    /// 0x10, Linux's `IPOIB_CM_IETF_ID` (our default).
    Linux,
    /// 0x01, RFC 4755 §3.5's figure.
    Rfc,
}

impl ServiceIdPrefix {
    /// The octet.
    pub fn octet(self) -> u8 {
        match self {
            ServiceIdPrefix::Linux => 0x10,
            ServiceIdPrefix::Rfc => 0x01,
        }
    }
}

/// A connected-mode service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServiceId {
    /// The prefix form.
    pub prefix: ServiceIdPrefix,
    /// The target's UD QPN (24 bits).
    pub ud_qpn: u32,
}

impl ServiceId {
    /// The service ID for the target UD QPN `ud_qpn`.
    pub fn new(prefix: ServiceIdPrefix, ud_qpn: u32) -> ServiceId {
        ServiceId {
            prefix,
            ud_qpn: ud_qpn & QPN_MASK,
        }
    }

    /// The 64-bit value (Type and Reserved 0, IPCM-10, IPCM-17).
    pub fn value(&self) -> u64 {
        (u64::from(self.prefix.octet()) << 56) | u64::from(self.ud_qpn & QPN_MASK)
    }

    /// Decodes a service ID from a REQ: a known prefix, Type 0, Reserved 0 (IPCM-10);
    /// anything else is not an IPoIB-CM service ID (the listener answers REJ "invalid
    /// service ID").
    pub fn parse(v: u64) -> Result<ServiceId, WireError> {
        let b = v.to_be_bytes();
        let prefix = match b[0] {
            0x10 => ServiceIdPrefix::Linux,
            0x01 => ServiceIdPrefix::Rfc,
            p => {
                return Err(WireError::Invalid {
                    field: "service ID prefix",
                    value: p.into(),
                });
            }
        };
        if b[1] != 0 {
            return Err(WireError::Invalid {
                field: "service ID type",
                value: b[1].into(),
            });
        }
        if b[2..5] != [0, 0, 0] {
            return Err(WireError::Invalid {
                field: "service ID reserved",
                value: (v >> 24) & 0xff_ffff,
            });
        }
        Ok(ServiceId {
            prefix,
            ud_qpn: (v & u64::from(QPN_MASK)) as u32,
        })
    }
}

/// The 8-octet IPoIB-CM private data (RFC 4755 §6; Linux `struct ipoib_cm_data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmPrivateData {
    /// Reserved octet, as received (emitted as 0; ignored on receive, IPCM-14).
    pub reserved: u8,
    /// The sender's UD QPN.
    pub ud_qpn: u32,
    /// The largest message (IP packet + 4-octet header) the sender can receive.
    pub recv_mtu: u32,
}

impl CmPrivateData {
    /// Octets on the wire.
    pub const LEN: usize = 8;

    /// Private data for our UD QPN and Receive MTU.
    pub fn new(ud_qpn: u32, recv_mtu: u32) -> CmPrivateData {
        CmPrivateData {
            reserved: 0,
            ud_qpn: ud_qpn & QPN_MASK,
            recv_mtu,
        }
    }

    /// Parses the first 8 octets of a CM message's private data (the rest is CM padding).
    pub fn parse(b: &[u8]) -> Result<CmPrivateData, WireError> {
        need("IPoIB-CM private data", b, Self::LEN)?;
        Ok(CmPrivateData {
            reserved: b[0],
            ud_qpn: be24(b, 1),
            recv_mtu: be32(b, 4),
        })
    }

    /// Writes the 8 octets (reserved 0, IPCM-17).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        room("IPoIB-CM private data", out, Self::LEN)?;
        out[0] = 0;
        out[1..4].copy_from_slice(&(self.ud_qpn & QPN_MASK).to_be_bytes()[1..]);
        out[4..8].copy_from_slice(&self.recv_mtu.to_be_bytes());
        Ok(Self::LEN)
    }

    /// The 8 octets.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        let _ = self.emit(&mut b);
        b
    }
}

/// The IP MTU of a connection: min(Receive MTU of both sides) − 4, used by both peers
/// (RFC 4755 §5.1, IPCM-13). A peer Receive MTU too small to carry [`MIN_IP_MTU`] is an
/// error (IPCM-12): the connection is refused and the peer is reached over UD.
pub fn connection_mtu(local_recv_mtu: u32, peer_recv_mtu: u32) -> Result<u32, WireError> {
    if peer_recv_mtu < MIN_RECV_MTU {
        return Err(WireError::Invalid {
            field: "peer Receive MTU",
            value: peer_recv_mtu.into(),
        });
    }
    Ok(local_recv_mtu.min(peer_recv_mtu) - EncapHeader::LEN as u32)
}
