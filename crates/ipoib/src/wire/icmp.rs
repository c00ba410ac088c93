//! What the link hands the kernel when a packet is larger than its destination's MTU
//! (requirements D3: the kernel sees a NOARP device and learns per-destination MTUs this
//! way): ICMP "fragmentation needed and DF set" (RFC 792, next-hop MTU of RFC 1191 §4) for
//! IPv4 with DF, ICMPv6 "packet too big" (RFC 4443 §3.2) for IPv6, and plain IPv4
//! fragmentation (RFC 791) for IPv4 without DF.
//!
//! Neither error is sent about an ICMP error or a non-first fragment (RFC 1122 §3.2.2,
//! RFC 4443 §2.4 (e)). The error's source is the original destination: the kernel receives
//! it on the IPoIB device, where a local source would be a martian.

use std::net::Ipv4Addr;

use super::WireError;
use super::ip::{Ipv4Info, Ipv6Header, PROTO_ICMP, PROTO_ICMPV6, checksum, emit_ipv4_header, icmpv6_packet};

/// The largest IPv6 packet an ICMPv6 error may make (RFC 4443 §2.4 (c)).
const IPV6_MIN_MTU: usize = 1280;

fn is_icmp_error_v4(p: &[u8], info: &Ipv4Info) -> bool {
    info.protocol == PROTO_ICMP && p.len() > info.header_len && matches!(p[info.header_len], 3 | 4 | 5 | 11 | 12)
}

/// For an IPv4 packet with DF set: the ICMP "fragmentation needed" (type 3, code 4) with
/// next-hop MTU `mtu`, as a whole IPv4 packet to the original source. `Ok(None)` when no
/// error may be sent (the packet is an ICMP error or a non-first fragment).
pub fn frag_needed(packet: &[u8], mtu: u16) -> Result<Option<Vec<u8>>, WireError> {
    let info = Ipv4Info::parse(packet)?;
    if info.frag_offset != 0 || is_icmp_error_v4(packet, &info) {
        return Ok(None);
    }
    let quote = &packet[..(info.header_len + 8).min(info.total_len)];
    let mut icmp = vec![3u8, 4, 0, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(quote);
    let c = checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut out = vec![0u8; 20];
    emit_ipv4_header(&mut out, (20 + icmp.len()) as u16, 0, 0, PROTO_ICMP, info.dst, info.src)?;
    out.extend_from_slice(&icmp);
    Ok(Some(out))
}

/// For an IPv6 packet: the ICMPv6 "packet too big" (type 2) with `mtu`, quoting as much of
/// the packet as fits in 1,280 octets, to the original source. `Ok(None)` when no error
/// may be sent (the packet is an ICMPv6 error).
pub fn packet_too_big(packet: &[u8], mtu: u32) -> Result<Option<Vec<u8>>, WireError> {
    let (h, payload) = Ipv6Header::parse(packet)?;
    if h.next_header == PROTO_ICMPV6 && payload.first().is_some_and(|t| *t < 128) {
        return Ok(None);
    }
    if h.src.is_unspecified() || h.src.is_multicast() {
        return Ok(None);
    }
    let room = IPV6_MIN_MTU - Ipv6Header::LEN - 8;
    let whole = &packet[..Ipv6Header::LEN + payload.len()];
    let mut m = vec![2u8, 0, 0, 0];
    m.extend_from_slice(&mtu.to_be_bytes());
    m.extend_from_slice(&whole[..whole.len().min(room)]);
    Ok(Some(icmpv6_packet(h.dst, h.src, 64, m)))
}

/// Splits an IPv4 packet without DF into fragments of at most `mtu` octets each (RFC 791
/// §3.2; options are copied into every fragment only if they have the copy flag, so this
/// keeps it simple: options go into the first fragment only and later fragments carry a
/// 20-octet header, which RFC 791 allows for non-copied options). Errors if DF is set or
/// `mtu` cannot carry 8 octets of data.
pub fn fragment_v4(packet: &[u8], mtu: usize) -> Result<Vec<Vec<u8>>, WireError> {
    let info = Ipv4Info::parse(packet)?;
    if info.df {
        return Err(WireError::Invalid {
            field: "fragmenting a DF packet",
            value: 1,
        });
    }
    if mtu < info.header_len + 8 || mtu < 28 {
        return Err(WireError::Invalid {
            field: "fragmentation MTU",
            value: mtu as u64,
        });
    }
    let data = &packet[info.header_len..info.total_len];
    let id = u16::from_be_bytes([packet[4], packet[5]]);
    let mut out = Vec::new();
    let mut off = 0usize;
    let mut first = true;
    while off < data.len() {
        let hlen = if first { info.header_len } else { 20 };
        let max = (mtu - hlen) & !7;
        let take = max.min(data.len() - off);
        let last = off + take == data.len();
        let mf = !last || info.mf;
        let frag_units = usize::from(info.frag_offset) + off / 8;
        let ff = (if mf { 0x2000 } else { 0 }) | (frag_units as u16 & 0x1fff);
        let mut f = vec![0u8; hlen];
        if first {
            f.copy_from_slice(&packet[..hlen]);
            f[2..4].copy_from_slice(&((hlen + take) as u16).to_be_bytes());
            f[6..8].copy_from_slice(&ff.to_be_bytes());
            f[10..12].copy_from_slice(&[0, 0]);
            let c = checksum(&f);
            f[10..12].copy_from_slice(&c.to_be_bytes());
        } else {
            emit_ipv4_header(&mut f, (hlen + take) as u16, id, ff, info.protocol, info.src, info.dst)?;
            // keep the original TTL and TOS
            f[1] = packet[1];
            f[8] = packet[8];
            f[10..12].copy_from_slice(&[0, 0]);
            let c = checksum(&f);
            f[10..12].copy_from_slice(&c.to_be_bytes());
        }
        f.extend_from_slice(&data[off..off + take]);
        out.push(f);
        off += take;
        first = false;
    }
    Ok(out)
}

/// The IPv4 destination of a packet from the kernel, for tests and the link.
pub fn ipv4_dst(packet: &[u8]) -> Result<Ipv4Addr, WireError> {
    Ok(Ipv4Info::parse(packet)?.dst)
}
