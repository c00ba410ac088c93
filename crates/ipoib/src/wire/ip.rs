//! The minimum of IPv4 (RFC 791) and IPv6 (RFC 8200) the link needs: the destination of a
//! packet from the kernel, its length and DF bit, and the headers of the packets the link
//! builds itself (ND, ICMP errors). Plus the Internet checksum (RFC 1071).

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{WireError, be16, need, room};

/// IP protocol number of ICMP.
pub const PROTO_ICMP: u8 = 1;
/// IP protocol number (next header) of ICMPv6.
pub const PROTO_ICMPV6: u8 = 58;

/// One's-complement sum of `data` folded into `acc` (RFC 1071), not yet complemented.
pub fn sum16(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// Folds and complements a [`sum16`] accumulator.
pub fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The Internet checksum of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    fold(sum16(0, data))
}

/// The ICMPv6 checksum of `msg` (checksum field included as it is) with the IPv6
/// pseudo-header (RFC 8200 §8.1). A received message verifies when this is 0.
pub fn icmpv6_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, msg: &[u8]) -> u16 {
    let mut acc = sum16(0, &src.octets());
    acc = sum16(acc, &dst.octets());
    acc += (msg.len() as u32 >> 16) + (msg.len() as u32 & 0xffff);
    acc += u32::from(PROTO_ICMPV6);
    fold(sum16(acc, msg))
}

/// The fields of an IPv4 header the link reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Info {
    /// Header length in octets (IHL × 4).
    pub header_len: usize,
    /// Total length.
    pub total_len: usize,
    /// Don't Fragment.
    pub df: bool,
    /// More Fragments.
    pub mf: bool,
    /// Fragment offset in 8-octet units.
    pub frag_offset: u16,
    /// Protocol.
    pub protocol: u8,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
}

impl Ipv4Info {
    /// Reads an IPv4 header: version 4, IHL ≥ 5, total length within `b` and ≥ IHL.
    pub fn parse(b: &[u8]) -> Result<Ipv4Info, WireError> {
        need("IPv4 header", b, 20)?;
        if b[0] >> 4 != 4 {
            return Err(WireError::Invalid {
                field: "IP version",
                value: (b[0] >> 4).into(),
            });
        }
        let header_len = usize::from(b[0] & 0x0f) * 4;
        let total_len = usize::from(be16(b, 2));
        if header_len < 20 || total_len < header_len {
            return Err(WireError::Invalid {
                field: "IPv4 header/total length",
                value: total_len as u64,
            });
        }
        need("IPv4 packet", b, total_len)?;
        let ff = be16(b, 6);
        Ok(Ipv4Info {
            header_len,
            total_len,
            df: ff & 0x4000 != 0,
            mf: ff & 0x2000 != 0,
            frag_offset: ff & 0x1fff,
            protocol: b[9],
            src: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
            dst: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
        })
    }
}

/// Writes a 20-octet IPv4 header (no options, TTL 64, checksum filled) into `out`.
#[allow(clippy::too_many_arguments)]
pub fn emit_ipv4_header(
    out: &mut [u8],
    total_len: u16,
    id: u16,
    flags_frag: u16,
    protocol: u8,
    src: Ipv4Addr,
    dst: Ipv4Addr,
) -> Result<usize, WireError> {
    room("IPv4 header", out, 20)?;
    out[0] = 0x45;
    out[1] = 0;
    out[2..4].copy_from_slice(&total_len.to_be_bytes());
    out[4..6].copy_from_slice(&id.to_be_bytes());
    out[6..8].copy_from_slice(&flags_frag.to_be_bytes());
    out[8] = 64;
    out[9] = protocol;
    out[10..12].copy_from_slice(&[0, 0]);
    out[12..16].copy_from_slice(&src.octets());
    out[16..20].copy_from_slice(&dst.octets());
    let c = checksum(&out[..20]);
    out[10..12].copy_from_slice(&c.to_be_bytes());
    Ok(20)
}

/// The fixed IPv6 header (RFC 8200 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Header {
    /// Payload length.
    pub payload_len: u16,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
}

impl Ipv6Header {
    /// Octets on the wire.
    pub const LEN: usize = 40;

    /// Parses the header and returns it with exactly its payload (payload length checked
    /// against the input; trailing octets are dropped).
    pub fn parse(b: &[u8]) -> Result<(Ipv6Header, &[u8]), WireError> {
        need("IPv6 header", b, Self::LEN)?;
        if b[0] >> 4 != 6 {
            return Err(WireError::Invalid {
                field: "IP version",
                value: (b[0] >> 4).into(),
            });
        }
        let payload_len = be16(b, 4);
        need("IPv6 packet", b, Self::LEN + usize::from(payload_len))?;
        let mut s = [0u8; 16];
        let mut d = [0u8; 16];
        s.copy_from_slice(&b[8..24]);
        d.copy_from_slice(&b[24..40]);
        Ok((
            Ipv6Header {
                payload_len,
                next_header: b[6],
                hop_limit: b[7],
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
            },
            &b[Self::LEN..Self::LEN + usize::from(payload_len)],
        ))
    }

    /// Writes the header (traffic class and flow label 0).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        room("IPv6 header", out, Self::LEN)?;
        out[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
        out[4..6].copy_from_slice(&self.payload_len.to_be_bytes());
        out[6] = self.next_header;
        out[7] = self.hop_limit;
        out[8..24].copy_from_slice(&self.src.octets());
        out[24..40].copy_from_slice(&self.dst.octets());
        Ok(Self::LEN)
    }
}

/// An ICMPv6 message in an IPv6 packet, checksum filled.
pub fn icmpv6_packet(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, mut msg: Vec<u8>) -> Vec<u8> {
    if msg.len() >= 4 {
        msg[2] = 0;
        msg[3] = 0;
        let c = icmpv6_checksum(&src, &dst, &msg);
        msg[2..4].copy_from_slice(&c.to_be_bytes());
    }
    let mut p = vec![0u8; Ipv6Header::LEN];
    let h = Ipv6Header {
        payload_len: msg.len() as u16,
        next_header: PROTO_ICMPV6,
        hop_limit,
        src,
        dst,
    };
    let _ = h.emit(&mut p);
    p.extend_from_slice(&msg);
    p
}
