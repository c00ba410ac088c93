//! IPv6 Neighbor Discovery on IPoIB (RFC 4861 §4.3, §4.4, §4.6.1; RFC 4391 §9.3): Neighbor
//! Solicitation and Advertisement with the source/target link-layer address option holding
//! an IPoIB address.
//!
//! ```text
//! Link-layer address option (24 octets, RFC 4391 §9.3)
//! off size
//!   0    1  Type: 1 source, 2 target
//!   1    1  Length = 3 (units of 8 octets)
//!   2    2  zero (prepended to fill 24 octets; Linux: ND padding 2 for InfiniBand)
//!   4   20  IPoIB link-layer address
//! ```
//!
//! Validation follows RFC 4861 §7.1.1/§7.1.2: hop limit 255, code 0, checksum, length,
//! option lengths non-zero, target not multicast, no source LLA option from `::`.
//! A link-layer address option of another length is not an IPoIB address: an error.

use std::net::Ipv6Addr;

use super::ip::{Ipv6Header, PROTO_ICMPV6, icmpv6_checksum, icmpv6_packet};
use super::lla::LinkAddr;
use super::{WireError, be16, need};

/// ICMPv6 type of a Neighbor Solicitation.
pub const NS_TYPE: u8 = 135;
/// ICMPv6 type of a Neighbor Advertisement.
pub const NA_TYPE: u8 = 136;
/// Option type: source link-layer address.
pub const OPT_SOURCE_LLA: u8 = 1;
/// Option type: target link-layer address.
pub const OPT_TARGET_LLA: u8 = 2;
/// Octets of the IPoIB link-layer address option.
pub const LLA_OPTION_LEN: usize = 24;

/// A Neighbor Discovery message the link handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NdMessage {
    /// Neighbor Solicitation.
    Solicit {
        /// Target address.
        target: Ipv6Addr,
        /// Source link-layer address option, if present.
        source_lla: Option<LinkAddr>,
    },
    /// Neighbor Advertisement.
    Advert {
        /// R flag.
        router: bool,
        /// S flag.
        solicited: bool,
        /// O flag.
        override_: bool,
        /// Target address.
        target: Ipv6Addr,
        /// Target link-layer address option, if present.
        target_lla: Option<LinkAddr>,
    },
}

/// Writes the 24-octet option for `lla`.
pub fn emit_lla_option(kind: u8, lla: &LinkAddr) -> [u8; LLA_OPTION_LEN] {
    let mut o = [0u8; LLA_OPTION_LEN];
    o[0] = kind;
    o[1] = 3;
    o[4..24].copy_from_slice(&lla.to_bytes());
    o
}

/// Finds the option `kind` among `opts` (RFC 4861 §4.6 TLVs). A zero length is an error
/// (§4.6: "nodes MUST silently discard an ND packet that contains an option with length
/// zero"); an LLA option of a length other than 3 is an error (not IPoIB).
fn find_lla(opts: &[u8], kind: u8) -> Result<Option<LinkAddr>, WireError> {
    let mut rest = opts;
    let mut found = None;
    while !rest.is_empty() {
        need("ND option", rest, 2)?;
        let len = usize::from(rest[1]) * 8;
        if len == 0 {
            return Err(WireError::Invalid {
                field: "ND option length",
                value: 0,
            });
        }
        need("ND option", rest, len)?;
        if rest[0] == kind {
            if rest[1] != 3 {
                return Err(WireError::Invalid {
                    field: "IPoIB link-layer address option length",
                    value: rest[1].into(),
                });
            }
            found = Some(LinkAddr::parse(&rest[4..24])?);
        }
        rest = &rest[len..];
    }
    Ok(found)
}

/// Parses an IPv6 packet as NS or NA. `Ok(None)` for any other IPv6 packet (not ICMPv6,
/// or another ICMPv6 type); an error for a malformed NS/NA (the link drops it).
/// Extension headers before ICMPv6 are not followed: ND messages carry none.
pub fn parse(packet: &[u8]) -> Result<Option<(Ipv6Header, NdMessage)>, WireError> {
    let (h, msg) = Ipv6Header::parse(packet)?;
    if h.next_header != PROTO_ICMPV6 || msg.is_empty() || (msg[0] != NS_TYPE && msg[0] != NA_TYPE) {
        return Ok(None);
    }
    need("Neighbor Solicitation/Advertisement", msg, 24)?;
    if h.hop_limit != 255 {
        return Err(WireError::Invalid {
            field: "ND hop limit",
            value: h.hop_limit.into(),
        });
    }
    if msg[1] != 0 {
        return Err(WireError::Invalid {
            field: "ND code",
            value: msg[1].into(),
        });
    }
    if icmpv6_checksum(&h.src, &h.dst, msg) != 0 {
        return Err(WireError::Checksum { found: be16(msg, 2) });
    }
    let mut t = [0u8; 16];
    t.copy_from_slice(&msg[8..24]);
    let target = Ipv6Addr::from(t);
    if target.is_multicast() {
        return Err(WireError::Invalid {
            field: "ND target (multicast)",
            value: u64::from(t[0]),
        });
    }
    let opts = &msg[24..];
    let nd = if msg[0] == NS_TYPE {
        let source_lla = find_lla(opts, OPT_SOURCE_LLA)?;
        if h.src.is_unspecified() && source_lla.is_some() {
            return Err(WireError::Invalid {
                field: "NS from :: with a source link-layer address",
                value: 1,
            });
        }
        NdMessage::Solicit { target, source_lla }
    } else {
        let flags = msg[4];
        NdMessage::Advert {
            router: flags & 0x80 != 0,
            solicited: flags & 0x40 != 0,
            override_: flags & 0x20 != 0,
            target,
            target_lla: find_lla(opts, OPT_TARGET_LLA)?,
        }
    };
    Ok(Some((h, nd)))
}

/// The solicited-node multicast address of `a` (RFC 4291 §2.7.1): ff02::1:ffXX:XXXX.
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::from([0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15]])
}

/// A whole IPv6 packet: a Neighbor Solicitation for `target` from `src` to `dst`
/// (normally [`solicited_node`]`(target)`), with our source LLA option.
pub fn build_solicit(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr, our: &LinkAddr) -> Vec<u8> {
    let mut m = vec![NS_TYPE, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    m.extend_from_slice(&emit_lla_option(OPT_SOURCE_LLA, our));
    icmpv6_packet(src, dst, 255, m)
}

/// A whole IPv6 packet: a solicited Neighbor Advertisement for `target` (one of ours) from
/// `src` to `dst`, override set, with our target LLA option.
pub fn build_advert(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr, solicited: bool, our: &LinkAddr) -> Vec<u8> {
    let flags = if solicited { 0x60 } else { 0x20 };
    let mut m = vec![NA_TYPE, 0, 0, 0, flags, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    m.extend_from_slice(&emit_lla_option(OPT_TARGET_LLA, our));
    icmpv6_packet(src, dst, 255, m)
}
