//! The invariant CRC of RoCEv2 (IBA vol. 1 §7.8.1, annex A17 §A17.3.3 CA17-22; C3 "4-byte ICRC trailer"), computed
//! exactly as Linux rxe does (`rxe_icrc.c`) and as the lab measured against every packet rxe
//! sent (lab README, "RoCEv2 from the host", "ICRC rule"):
//!
//! ```text
//! ICRC = CRC-32/IEEE( ff ff ff ff ff ff ff ff          the masked LRH of native IB
//!                   ‖ IP header, variant fields = 1s   IPv4: TOS, TTL, header checksum
//!                                                      IPv6: traffic class, flow label, hop limit
//!                   ‖ UDP header, checksum = ffff
//!                   ‖ BTH, octet 4 (FECN, BECN, Resv6a) = ff
//!                   ‖ extension headers, payload, pad )
//! stored little-endian after the pad.
//! ```
//!
//! The IPv4 Identification, flags and fragment offset are *not* masked: a sender must know
//! the ID the kernel will put in the header (an unconnected UDP socket with
//! `IP_PMTUDISC_DO` sends ID 0), and a receiver needs the IP header it received.
//!
//! The IP and UDP headers are passed as the octets on the wire; their length fields must be
//! the final ones. IPv4 headers with options are refused: rxe covers exactly 20 octets.

use crc_fast::{CrcAlgorithm, Digest};

use super::ICRC_LEN;
use super::crc_short;
use super::headers::Bth;

const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;

/// Why an ICRC cannot be computed, or does not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum IcrcError {
    /// Not a 20-octet IPv4 header or a 40-octet IPv6 header.
    #[error("IP header of {len} octets, version {version}: need IPv4 (20) or IPv6 (40)")]
    IpHeader {
        /// Octets given as the IP header.
        len: usize,
        /// The IP Version field (4 or 6 expected).
        version: u8,
    },
    /// IPv4 with options (IHL > 5).
    #[error("IPv4 header with options (IHL {ihl})")]
    Ipv4Options {
        /// The IPv4 IHL field, in 4-octet words.
        ihl: u8,
    },
    /// Not an 8-octet UDP header.
    #[error("UDP header of {len} octets (8 needed)")]
    UdpHeader {
        /// Octets given as the UDP header.
        len: usize,
    },
    /// Shorter than BTH + ICRC.
    #[error("packet of {len} octets has no room for a BTH and an ICRC")]
    TooShort {
        /// Octets of the packet.
        len: usize,
    },
    /// The ICRC the packet carries is not the one its octets give.
    #[error("ICRC {stored:#010x} in the packet, {computed:#010x} computed")]
    Mismatch {
        /// The ICRC field of the packet.
        stored: u32,
        /// The ICRC computed over the packet's octets.
        computed: u32,
    },
}

/// The ICRC of `packet` (a whole UDP payload: BTH through the 4-octet ICRC field, whose
/// content is ignored) sent in these IP and UDP headers, as the `u32` that is stored
/// little-endian.
pub fn compute(ip_header: &[u8], udp_header: &[u8], packet: &[u8]) -> Result<u32, IcrcError> {
    if packet.len() < Bth::LEN + ICRC_LEN {
        return Err(IcrcError::TooShort { len: packet.len() });
    }
    let mut pre = [0u8; PREFIX_MAX];
    let n = masked_prefix(ip_header, udp_header, &packet[..Bth::LEN], &mut pre)?;
    let rest = &packet[Bth::LEN..packet.len() - ICRC_LEN];
    if n + rest.len() <= SMALL {
        // Short: the masked prefix and the rest in one stack buffer, one call of the
        // PCLMULQDQ fold (crc_short; session 14: crc_fast cost ~215 instructions per call at
        // 128 octets and the 512-octet buffer was cleared each time).
        return Ok(short(&pre[..n], rest, 0, |_| {}, 0));
    }
    PASSES.with(|p| p.set([p.get()[0], p.get()[1] + 1]));
    let mut buf = [0u8; SMALL];
    buf[..n].copy_from_slice(&pre[..n]);
    // The octets up to the next 16-octet boundary of `rest` go with the masked prefix, so
    // that the long update starts aligned: crc_fast's folding loop runs at about half speed
    // on a misaligned start, and a packet k of a GRO train starts at k × (4096 + headers)
    // into the receive slot (icrc_aligned_split; session 13, `examples/udp_bound.rs`).
    let head = aligned_head(rest, SMALL - n);
    buf[n..n + head].copy_from_slice(&rest[..head]);
    let mut d = LongCrc::new();
    d.update(&buf[..n + head]);
    d.update(&rest[head..]);
    Ok(d.finalize())
}

/// The CRC of packets longer than [`SMALL`], by the crate that is fastest on this CPU: crc-fast
/// where it has its AVX-512 VPCLMULQDQ kernel (and off x86-64), crc32fast's PCLMULQDQ folding
/// elsewhere. On an AMD EPYC with AVX2 and VPCLMULQDQ but no AVX-512, crc-fast's `Digest`
/// (its 128-bit kernel) gave 5.1-6.7 GB/s over a 40-octet prefix and a 4 KiB payload where
/// crc32fast gave 9.8-12.1 (session 16, both in one process, load 12); the ICRC was 29 % of
/// a 1 MiB RDMA Write's CPU there. Both compute CRC-32/ISO-HDLC; the tests check both.
#[allow(clippy::large_enum_variant)] // one per packet, on the stack
enum LongCrc {
    Fast(Digest),
    Fold(crc32fast::Hasher),
}

impl LongCrc {
    #[inline]
    fn new() -> Self {
        Self::with(wide_clmul())
    }

    #[inline]
    fn with(wide: bool) -> Self {
        if wide {
            LongCrc::Fast(Digest::new(CrcAlgorithm::Crc32IsoHdlc))
        } else {
            LongCrc::Fold(crc32fast::Hasher::new())
        }
    }

    #[inline]
    fn update(&mut self, data: &[u8]) {
        match self {
            LongCrc::Fast(d) => d.update(data),
            LongCrc::Fold(h) => h.update(data),
        }
    }

    #[inline]
    fn finalize(self) -> u32 {
        match self {
            LongCrc::Fast(d) => d.finalize() as u32,
            LongCrc::Fold(h) => h.finalize(),
        }
    }
}

/// Whether crc-fast has its wide (AVX-512 VPCLMULQDQ) kernel on this CPU, or is the choice
/// anyway (not x86-64). The iWARP CRC32c makes the same choice (crates/iwarp/src/crc.rs).
#[inline]
fn wide_clmul() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vl") && std::arch::is_x86_feature_detected!("vpclmulqdq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// How many leading octets of `rest` (at most `room`) end where the next 16-octet aligned
/// address starts.
fn aligned_head(rest: &[u8], room: usize) -> usize {
    let mis = rest.as_ptr() as usize % 16;
    if mis == 0 {
        0
    } else {
        (16 - mis).min(rest.len()).min(room)
    }
}

/// [`compute`] of a packet given in parts, as the engine sends it from registered memory:
/// `headers` (BTH first), then `payload_len` octets that `payload` hands over in order (it
/// calls its argument once per chunk), then `pad` zero octets (the ICRC follows).
pub fn compute_parts(
    ip_header: &[u8],
    udp_header: &[u8],
    headers: &[u8],
    payload_len: usize,
    payload: impl FnOnce(&mut dyn FnMut(&[u8])),
    pad: usize,
) -> Result<u32, IcrcError> {
    if headers.len() < Bth::LEN {
        return Err(IcrcError::TooShort {
            len: headers.len() + payload_len + pad + ICRC_LEN,
        });
    }
    let mut pre = [0u8; PREFIX_MAX];
    let n = masked_prefix(ip_header, udp_header, &headers[..Bth::LEN], &mut pre)?;
    let rest = &headers[Bth::LEN..];
    if n + rest.len() + payload_len + pad <= SMALL {
        // One call from a stack copy (see `compute`).
        return Ok(short(&pre[..n], rest, payload_len, payload, pad));
    }
    PASSES.with(|p| p.set([p.get()[0], p.get()[1] + 1]));
    let mut d = LongCrc::new();
    d.update(&pre[..n]);
    d.update(rest);
    payload(&mut |c: &[u8]| d.update(c));
    d.update(&[0u8; 3][..pad.min(3)]);
    Ok(d.finalize())
}

/// The CRC of `pre ‖ rest ‖ payload ‖ pad zeros`, which together fit [`SMALL`]: copied
/// into a stack buffer (a [`SHORT`] one when they fit it, so that less is cleared), then one
/// [`crc_short::checksum`].
fn short(pre: &[u8], rest: &[u8], payload_len: usize, payload: impl FnOnce(&mut dyn FnMut(&[u8])), pad: usize) -> u32 {
    PASSES.with(|p| p.set([p.get()[0] + 1, p.get()[1]]));
    let total = pre.len() + rest.len() + payload_len + pad;
    if total <= SHORT {
        let mut buf = [0u8; SHORT];
        fill(&mut buf, pre, rest, payload, total - pad);
        crc_short::checksum(&buf[..total])
    } else {
        let mut buf = [0u8; SMALL];
        fill(&mut buf, pre, rest, payload, total - pad);
        crc_short::checksum(&buf[..total])
    }
}

/// `pre ‖ rest ‖ payload` into the (zeroed) `buf`, whose first `end` octets they fill; the
/// pad after them stays zero.
fn fill(buf: &mut [u8], pre: &[u8], rest: &[u8], payload: impl FnOnce(&mut dyn FnMut(&[u8])), end: usize) {
    let mut at = pre.len();
    buf[..at].copy_from_slice(pre);
    buf[at..at + rest.len()].copy_from_slice(rest);
    at += rest.len();
    payload(&mut |c: &[u8]| {
        let k = c.len().min(end.saturating_sub(at));
        buf[at..at + k].copy_from_slice(&c[..k]);
        at += k;
    });
    debug_assert_eq!(at, end);
}

/// The lean ICRC of a short IPv4 packet (issue 13: the one-packet Send, Write and ACK):
/// the masked prefix (eight 0xff for the LRH, the IPv4 header as [`ipv4_header`] builds
/// it with TOS, TTL and checksum masked, the UDP header with its checksum masked, the BTH
/// with FECN, BECN and Resv6a masked) is written straight into the one stack buffer the
/// CRC runs over, after it the rest of the headers, the payload (`payload` writes its
/// `payload_len` octets into the slice it is given) and `pad` zeros: no IP or UDP header
/// built apart, no second masked copy, no bounce buffer for the payload. The same octets,
/// so the same ICRC, as [`compute_parts`] over [`ipv4_header`] and [`udp_header`]
/// (tested bit for bit). `None` (nothing computed) when the covered octets do not fit
/// [`SHORT`]: the caller takes the general path.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn compute_v4_short(
    src: [u8; 4],
    dst: [u8; 4],
    id: u16,
    sport: u16,
    dport: u16,
    headers: &[u8],
    payload_len: usize,
    payload: impl FnOnce(&mut [u8]),
    pad: usize,
) -> Option<u32> {
    if headers.len() < Bth::LEN {
        return None;
    }
    let udp_payload = headers.len() + payload_len + pad + ICRC_LEN;
    let total = V4_PREFIX + headers.len() + payload_len + pad;
    let fill = |buf: &mut [u8]| {
        v4_fill(
            buf,
            src,
            dst,
            id,
            sport,
            dport,
            udp_payload,
            headers,
            payload_len,
            payload,
        )
    };
    let crc = if total <= LEAN {
        crc_on_stack::<LEAN>(total, fill)
    } else if total <= SHORT {
        crc_on_stack::<SHORT>(total, fill)
    } else {
        return None;
    };
    PASSES.with(|p| p.set([p.get()[0] + 1, p.get()[1]]));
    Some(crc)
}

/// The CRC of the first `total` octets of an `N`-octet stack buffer that `fill` writes (the
/// smaller buffer for the smaller packets: less to clear).
#[inline]
fn crc_on_stack<const N: usize>(total: usize, fill: impl FnOnce(&mut [u8])) -> u32 {
    let mut buf = [0u8; N];
    fill(&mut buf);
    crc_short::checksum(&buf[..total])
}

/// [`compute_v4_short`] of a whole received packet (its ICRC field last, not covered).
#[inline]
pub fn compute_v4_short_packet(
    src: [u8; 4],
    dst: [u8; 4],
    id: u16,
    sport: u16,
    dport: u16,
    packet: &[u8],
) -> Option<u32> {
    let body = packet.len().checked_sub(ICRC_LEN)?;
    compute_v4_short(src, dst, id, sport, dport, &packet[..body], 0, |_| {}, 0)
}

/// Octets of the masked prefix before the BTH for IPv4: LRH 8, IPv4 20, UDP 8.
const V4_PREFIX: usize = 8 + IPV4_LEN + UDP_LEN;

/// The buffer of [`compute_v4_short`] for packets that cover at most this many octets (an
/// ACK covers 52, an 8-octet Send 60, a 64-octet Write 128).
const LEAN: usize = 128;

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn v4_fill(
    buf: &mut [u8],
    src: [u8; 4],
    dst: [u8; 4],
    id: u16,
    sport: u16,
    dport: u16,
    udp_payload: usize,
    headers: &[u8],
    payload_len: usize,
    payload: impl FnOnce(&mut [u8]),
) {
    let ip_total = (IPV4_LEN + UDP_LEN + udp_payload) as u16;
    let udp_len = (UDP_LEN + udp_payload) as u16;
    let [tl0, tl1] = ip_total.to_be_bytes();
    let [id0, id1] = id.to_be_bytes();
    let [sp0, sp1] = sport.to_be_bytes();
    let [dp0, dp1] = dport.to_be_bytes();
    let [ul0, ul1] = udp_len.to_be_bytes();
    let pre: [u8; V4_PREFIX] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // LRH
        0x45, 0xff, tl0, tl1, id0, id1, 0x40, 0x00, // version, IHL, TOS (masked), length, ID, DF
        0xff, 17, 0xff, 0xff, // TTL (masked), UDP, checksum (masked)
        src[0], src[1], src[2], src[3], dst[0], dst[1], dst[2], dst[3], //
        sp0, sp1, dp0, dp1, ul0, ul1, 0xff, 0xff, // UDP, checksum masked
    ];
    buf[..V4_PREFIX].copy_from_slice(&pre);
    let h = V4_PREFIX + headers.len();
    buf[V4_PREFIX..h].copy_from_slice(headers);
    buf[V4_PREFIX + 4] = 0xff; // BTH: FECN, BECN, Resv6a
    payload(&mut buf[h..h + payload_len]);
}

/// The masked IP and UDP headers and BTH the ICRC starts with (eight 0xff octets for the
/// LRH of IB, then the headers with their variant fields set to 1s) into `buf`; returns
/// their length.
fn masked_prefix(
    ip_header: &[u8],
    udp_header: &[u8],
    bth: &[u8],
    buf: &mut [u8; PREFIX_MAX],
) -> Result<usize, IcrcError> {
    let mut ip = [0u8; IPV6_LEN];
    let version = ip_header.first().map_or(0, |v| v >> 4);
    let ip = match (version, ip_header.len()) {
        (4, IPV4_LEN) => {
            let ihl = ip_header[0] & 0x0f;
            if ihl != 5 {
                return Err(IcrcError::Ipv4Options { ihl });
            }
            let ip = &mut ip[..IPV4_LEN];
            ip.copy_from_slice(ip_header);
            ip[1] = 0xff; // TOS (DSCP, ECN)
            ip[8] = 0xff; // TTL
            ip[10..12].fill(0xff); // header checksum
            &ip[..]
        }
        (4, len) if len > IPV4_LEN => {
            return Err(IcrcError::Ipv4Options {
                ihl: ip_header[0] & 0x0f,
            });
        }
        (6, IPV6_LEN) => {
            ip.copy_from_slice(ip_header);
            ip[0] |= 0x0f; // traffic class, high nibble
            ip[1..4].fill(0xff); // traffic class, low nibble, and flow label
            ip[7] = 0xff; // hop limit
            &ip[..]
        }
        (version, len) => return Err(IcrcError::IpHeader { len, version }),
    };
    let udp: [u8; UDP_LEN] = udp_header
        .try_into()
        .map_err(|_| IcrcError::UdpHeader { len: udp_header.len() })?;
    // The masked octets in one buffer and, for a small packet, the rest after them: crc_fast
    // costs about 150 instructions per call before the first octet, so five `update`s of a
    // 64-octet UD Send spent more than the CRC itself (callgrind, issue 14's UD benchmark).
    buf[..8].fill(0xff);
    let mut n = 8;
    buf[n..n + ip.len()].copy_from_slice(ip);
    n += ip.len();
    buf[n..n + UDP_LEN].copy_from_slice(&udp);
    buf[n + 6..n + 8].fill(0xff); // UDP checksum
    n += UDP_LEN;
    buf[n..n + Bth::LEN].copy_from_slice(bth);
    buf[n + 4] = 0xff; // FECN, BECN, Resv6a
    n += Bth::LEN;
    Ok(n)
}

/// Packets whose covered octets fit this are CRCed in one call of
/// [`crc_short::checksum`] from a stack copy; longer ones by `crc_fast` from where they are.
const SMALL: usize = 512;

/// Short packets (a 64 B Write covers 128 octets, an ACK 52) use a stack buffer this long.
const SHORT: usize = 192;

thread_local! {
    /// ICRC passes made on this thread: [short (one `crc_short` call), long (`crc_fast`)].
    static PASSES: std::cell::Cell<[u64; 2]> = const { std::cell::Cell::new([0; 2]) };
}

/// How many ICRCs this thread has computed (sent or checked), by path: tests count them per
/// packet (tests/icrc_passes.rs). Each ICRC is exactly one pass over its octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IcrcPasses {
    /// Covered octets ≤ 512: one call of the short PCLMULQDQ fold from a stack copy.
    pub short: u64,
    /// Longer: `crc_fast` over the octets where they are.
    pub long: u64,
}

/// The ICRC passes this thread has made so far.
pub fn passes_on_this_thread() -> IcrcPasses {
    let [short, long] = PASSES.with(|p| p.get());
    IcrcPasses { short, long }
}

/// The longest masked prefix: eight LRH octets, IPv6, UDP, BTH.
const PREFIX_MAX: usize = 8 + IPV6_LEN + UDP_LEN + Bth::LEN;

/// The ICRC field of a packet (its last four octets, little-endian).
pub fn stored(packet: &[u8]) -> Option<u32> {
    let at = packet.len().checked_sub(ICRC_LEN)?;
    let b: [u8; 4] = packet[at..].try_into().ok()?;
    Some(u32::from_le_bytes(b))
}

/// Check a received packet's ICRC. A mismatch means: drop it silently and count it (what
/// rxe does; the lab saw no answer to a REQ with a bad ICRC).
pub fn verify(ip_header: &[u8], udp_header: &[u8], packet: &[u8]) -> Result<(), IcrcError> {
    let computed = compute(ip_header, udp_header, packet)?;
    let stored = stored(packet).ok_or(IcrcError::TooShort { len: packet.len() })?;
    if computed == stored {
        Ok(())
    } else {
        Err(IcrcError::Mismatch { stored, computed })
    }
}

/// Check a received IPv4 packet whose IP Identification the receiver does not know (a UDP
/// socket does not show it; rxe puts a hashed random ID in every packet, DF set, lab capture
/// `host-br0-roce-cm.pcap`). `ip_header` is the header with any ID (its ID octets are
/// ignored). The ICRC is affine in the input bits, so the stored ICRC matches for some ID
/// exactly when `stored ⊕ ICRC(ID 0)` is the CRC image of a 16-bit value shifted by the
/// octets that follow the ID; that value is solved for (16 unknowns, GF(2)) and returned.
/// A corrupted packet passes only if its error happens to equal such an image: about one in
/// 2^16 corruptions, against one in 2^32 when the ID is known.
pub fn verify_any_ipv4_id(ip_header: &[u8], udp_header: &[u8], packet: &[u8]) -> Result<u16, IcrcError> {
    if ip_header.len() != IPV4_LEN || ip_header[0] >> 4 != 4 {
        return verify(ip_header, udp_header, packet).map(|()| 0);
    }
    let mut ip = [0u8; IPV4_LEN];
    ip.copy_from_slice(ip_header);
    ip[4..6].fill(0);
    let computed = compute(&ip, udp_header, packet)?;
    let stored = stored(packet).ok_or(IcrcError::TooShort { len: packet.len() })?;
    let diff = computed ^ stored;
    if diff == 0 {
        return Ok(0);
    }
    // Octets of CRC input after the two ID octets: the 8 masked-LRH octets and 6 IPv4
    // header octets come before them.
    let after = 8 + IPV4_LEN + UDP_LEN + packet.len() - ICRC_LEN - (8 + 6);
    let shift = zeros_operator(after);
    // Images of the 16 ID bits, then Gaussian elimination over GF(2).
    let mut pivots: Vec<(u32, u16)> = Vec::with_capacity(16);
    let reduce = |pivots: &[(u32, u16)], mut v: u32, mut m: u16| {
        for &(pv, pm) in pivots {
            let lead = 31 - pv.leading_zeros();
            if v >> lead & 1 == 1 {
                v ^= pv;
                m ^= pm;
            }
        }
        (v, m)
    };
    for bit in 0..16 {
        let x: u16 = 1 << bit;
        let img = gf2_times(&shift, crc_raw(&x.to_be_bytes()));
        let (v, m) = reduce(&pivots, img, x);
        if v != 0 {
            pivots.push((v, m));
            // Keep pivots sorted by leading bit, highest first, so reduction is complete.
            pivots.sort_by_key(|&(pv, _)| std::cmp::Reverse(pv.leading_zeros() ^ 31));
        }
    }
    match reduce(&pivots, diff, 0) {
        (0, id) => Ok(id),
        _ => Err(IcrcError::Mismatch { stored, computed }),
    }
}

/// CRC-32 (reflected, polynomial 0xEDB88320) of `data` with initial value 0 and no final
/// XOR: the linear part of the ICRC.
fn crc_raw(data: &[u8]) -> u32 {
    let mut c = 0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = (c >> 1) ^ (0xEDB8_8320 & (c & 1).wrapping_neg());
        }
    }
    c
}

/// `mat` applied to `vec` (column i of `mat` is the image of bit i).
fn gf2_times(mat: &[u32; 32], mut vec: u32) -> u32 {
    let mut sum = 0;
    let mut i = 0;
    while vec != 0 {
        if vec & 1 == 1 {
            sum ^= mat[i];
        }
        vec >>= 1;
        i += 1;
    }
    sum
}

fn gf2_compose(a: &[u32; 32], b: &[u32; 32]) -> [u32; 32] {
    let mut out = [0u32; 32];
    for (o, &col) in out.iter_mut().zip(b.iter()) {
        *o = gf2_times(a, col);
    }
    out
}

/// The operator that feeds `n` zero octets through the raw CRC state (zlib's
/// `crc32_combine` technique: square-and-multiply of the one-zero-bit operator).
fn zeros_operator(n: usize) -> [u32; 32] {
    let mut bit = [0u32; 32];
    bit[0] = 0xEDB8_8320;
    for (i, b) in bit.iter_mut().enumerate().skip(1) {
        *b = 1 << (i - 1);
    }
    let mut byte = bit;
    for _ in 0..3 {
        byte = gf2_compose(&byte, &byte);
    }
    let mut result = [0u32; 32];
    for (i, r) in result.iter_mut().enumerate() {
        *r = 1 << i;
    }
    let (mut base, mut n) = (byte, n);
    while n > 0 {
        if n & 1 == 1 {
            result = gf2_compose(&base, &result);
        }
        base = gf2_compose(&base, &base);
        n >>= 1;
    }
    result
}

/// Compute the ICRC of an emitted packet and write it into its last four octets.
pub fn seal(ip_header: &[u8], udp_header: &[u8], packet: &mut [u8]) -> Result<u32, IcrcError> {
    let icrc = compute(ip_header, udp_header, packet)?;
    let at = packet.len() - ICRC_LEN;
    packet[at..].copy_from_slice(&icrc.to_le_bytes());
    Ok(icrc)
}

/// The IPv4 header of a RoCEv2 datagram as a UDP socket sends it, for the ICRC: version 4,
/// IHL 5, the given Identification, DF set (an unconnected socket with `IP_PMTUDISC_DO`
/// sends ID 0 and DF), protocol UDP; TOS, TTL and checksum are masked anyway.
pub fn ipv4_header(src: [u8; 4], dst: [u8; 4], id: u16, udp_payload_len: usize) -> [u8; 20] {
    let total = (IPV4_LEN + UDP_LEN + udp_payload_len) as u16;
    let mut h = [0u8; IPV4_LEN];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = 64;
    h[9] = 17; // UDP
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    h
}

/// The UDP header of a RoCEv2 datagram for the ICRC (the checksum is masked: left 0).
pub fn udp_header(src_port: u16, dst_port: u16, udp_payload_len: usize) -> [u8; 8] {
    let len = (UDP_LEN + udp_payload_len) as u16;
    let mut h = [0u8; UDP_LEN];
    h[0..2].copy_from_slice(&src_port.to_be_bytes());
    h[2..4].copy_from_slice(&dst_port.to_be_bytes());
    h[4..6].copy_from_slice(&len.to_be_bytes());
    h
}

#[cfg(test)]
mod tests {

    /// C3 ICRC, issue 13's lean path: [`compute_v4_short`] gives the ICRC that
    /// [`compute_parts`] gives over [`ipv4_header`] and [`udp_header`] (and
    /// [`compute_v4_short_packet`] the one [`seal`] stores) at every header length the RC
    /// core emits, every payload length and pad up to past the short limit, for several
    /// addresses, IDs and ports; packets past the limit are left to the general path (`None`).
    #[test]
    fn lean_v4_icrc_equals_the_general_one_c3() {
        let cases = [
            (0u16, 0xc000u16, [127, 0, 0, 1], [127, 0, 95, 53]),
            (7, 4791, [10, 1, 2, 3], [192, 168, 1, 9]),
            (0xffff, 0xffff, [255; 4], [0; 4]),
        ];
        let mut lean = 0;
        for hlen in [12usize, 16, 28, 32, 40, 44] {
            for plen in 0..170usize {
                let pad = usize::from(crate::wire::segment::pad_count(plen));
                let hdr: Vec<u8> = (0..hlen).map(|i| (i * 13 + plen) as u8).collect();
                let payload: Vec<u8> = (0..plen).map(|i| (i * 7 + 3) as u8).collect();
                for (id, sport, src, dst) in cases {
                    let udp_len = hlen + plen + pad + ICRC_LEN;
                    let ip = ipv4_header(src, dst, id, udp_len);
                    let udp = udp_header(sport, 4791, udp_len);
                    let want = compute_parts(
                        &ip,
                        &udp,
                        &hdr,
                        plen,
                        |f| {
                            f(&payload[..plen / 2]);
                            f(&payload[plen / 2..]);
                        },
                        pad,
                    )
                    .unwrap();
                    let got = compute_v4_short(
                        src,
                        dst,
                        id,
                        sport,
                        4791,
                        &hdr,
                        plen,
                        |d| d.copy_from_slice(&payload),
                        pad,
                    );
                    let fits = 8 + 20 + 8 + hlen + plen + pad <= SHORT;
                    assert_eq!(got, fits.then_some(want), "headers {hlen}, payload {plen}, id {id}");
                    let mut pkt = [hdr.clone(), payload.clone(), vec![0; pad + ICRC_LEN]].concat();
                    seal(&ip, &udp, &mut pkt).unwrap();
                    let whole = compute_v4_short_packet(src, dst, id, sport, 4791, &pkt);
                    assert_eq!(whole, fits.then(|| stored(&pkt).unwrap()), "packet {hlen}+{plen}");
                    lean += usize::from(fits);
                }
            }
        }
        assert!(lean > 1000, "{lean} lean cases");
        // Too short for a BTH: no lean ICRC (the general path refuses it).
        assert_eq!(compute_v4_short_packet([1; 4], [2; 4], 0, 1, 2, &[0u8; 15]), None);
    }

    /// C3 ICRC: a packet sealed with an IPv4 ID the receiver does not know (rxe's hashed IDs)
    /// is accepted and its ID recovered; a corrupted one is refused.
    #[test]
    fn unknown_ipv4_id_is_solved_for() {
        for (len, id) in [(28usize, 0x3403u16), (300, 0xece3), (1100, 1), (4200, 0xffff), (64, 0)] {
            let mut pkt: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let udp = udp_header(0xc123, 4791, len);
            let ip = ipv4_header([192, 168, 77, 2], [192, 168, 77, 1], id, len);
            seal(&ip, &udp, &mut pkt).unwrap();
            let unknown = ipv4_header([192, 168, 77, 2], [192, 168, 77, 1], 0, len);
            assert_eq!(verify_any_ipv4_id(&unknown, &udp, &pkt), Ok(id), "len {len}");
            let mut bad = pkt.clone();
            bad[len / 2] ^= 0x10;
            assert!(verify_any_ipv4_id(&unknown, &udp, &bad).is_err(), "len {len}");
        }
    }

    /// C3 ICRC: a packet given in parts (headers, payload in chunks, pad), as the engine
    /// sends it from registered memory, has the ICRC of the same packet laid out in one
    /// buffer, on both sides of the one-call boundary, for every pad count.
    #[test]
    fn parts_give_the_crc_of_the_whole_packet() {
        for (hdr, payload) in [
            (12usize, 0usize),
            (12, 8),
            (28, 1),
            (28, 2),
            (16, 3),
            (12, 440),
            (12, 470),
            (28, 4096),
            (44, 4093),
        ] {
            let pad = usize::from(super::super::segment::pad_count(payload));
            let len = hdr + payload + pad + ICRC_LEN;
            let mut pkt: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
            pkt[hdr + payload..hdr + payload + pad].fill(0);
            let udp = udp_header(0xc001, 4791, len);
            let ip = ipv4_header([127, 0, 0, 1], [127, 0, 0, 2], 3, len);
            let whole = compute(&ip, &udp, &pkt).unwrap();
            for chunk in [1usize, 7, 64, 4096] {
                let body = &pkt[hdr..hdr + payload];
                let parts =
                    compute_parts(&ip, &udp, &pkt[..hdr], payload, |f| body.chunks(chunk).for_each(f), pad).unwrap();
                assert_eq!(parts, whole, "headers {hdr}, payload {payload}, chunks of {chunk}");
            }
        }
    }

    /// C3 ICRC: the one-call path for small packets and the two-call path for large ones give
    /// the CRC of the masked octets laid end to end, on both sides of the boundary.
    #[test]
    fn small_and_large_packets_give_the_same_crc_as_one_pass() {
        for len in [16usize, 28, 100, 459, 460, 461, 479, 480, 481, 600, 4200] {
            let pkt: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
            let udp = udp_header(0xc123, 4791, len);
            for ip in [
                ipv4_header([10, 0, 0, 1], [10, 0, 0, 2], 7, len).to_vec(),
                vec![0x60; 40],
            ] {
                let mut all = vec![0xffu8; 8];
                let mut m = ip.clone();
                if m.len() == 20 {
                    m[1] = 0xff;
                    m[8] = 0xff;
                    m[10..12].fill(0xff);
                } else {
                    m[0] |= 0x0f;
                    m[1..4].fill(0xff);
                    m[7] = 0xff;
                }
                all.extend_from_slice(&m);
                all.extend_from_slice(&udp[..6]);
                all.extend_from_slice(&[0xff, 0xff]);
                all.extend_from_slice(&pkt[..4]);
                all.push(0xff);
                all.extend_from_slice(&pkt[5..len - ICRC_LEN]);
                let want = crc_fast::checksum(CrcAlgorithm::Crc32IsoHdlc, &all) as u32;
                assert_eq!(compute(&ip, &udp, &pkt), Ok(want), "len {len}, IP {}", ip.len());
            }
        }
    }

    /// The long-packet CRC gives crc-fast's value whichever crate this CPU uses for it, over
    /// any split into updates (the engine feeds a prefix, the headers, payload chunks and the
    /// pad). C3 "4-byte ICRC trailer".
    #[test]
    fn long_crc_is_the_same_function_with_either_crate() {
        let data: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for len in [
            0usize, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 511, 512, 4096, 4133, 9000, 65_536,
        ] {
            for off in [0usize, 1, 5, 16] {
                let d = &data[off..off + len];
                let want = crc_fast::checksum(CrcAlgorithm::Crc32IsoHdlc, d) as u32;
                for wide in [false, true] {
                    for cut in [0, len / 3, len.saturating_sub(3), len] {
                        let mut c = LongCrc::with(wide);
                        c.update(&d[..cut]);
                        c.update(&d[cut..]);
                        assert_eq!(c.finalize(), want, "len {len} offset {off} cut {cut} wide {wide}");
                    }
                }
            }
        }
    }

    /// A packet's ICRC does not depend on where it lies in memory: [`compute`] moves the
    /// octets up to a 16-octet boundary in with the masked prefix (a GRO train's packets
    /// start anywhere in the receive slot).
    #[test]
    fn icrc_does_not_depend_on_alignment() {
        for len in [16usize, 30, 470, 480, 600, 4112, 4128] {
            let pkt: Vec<u8> = (0..len).map(|i| (i * 29 + 3) as u8).collect();
            let udp = udp_header(0xc123, 4791, len);
            let ip = ipv4_header([10, 0, 0, 1], [10, 0, 0, 2], 0, len);
            let want = compute(&ip, &udp, &pkt).unwrap();
            let mut big = vec![0u8; len + 64];
            for off in 0..64 {
                big[off..off + len].copy_from_slice(&pkt);
                assert_eq!(
                    compute(&ip, &udp, &big[off..off + len]),
                    Ok(want),
                    "len {len}, offset {off}"
                );
            }
        }
    }

    /// The real rxe ACK of the capture, with its ID octets zeroed: ID 0x3681 is recovered.
    #[test]
    fn rxe_ack_verifies_without_its_id_c3() {
        let (mut ip, udp, pkt) = (h(IP), h(UDP), h(PKT));
        ip[4..6].fill(0);
        assert!(verify(&ip, &udp, &pkt).is_err());
        assert_eq!(verify_any_ipv4_id(&ip, &udp, &pkt), Ok(0x3681));
    }
    use super::*;

    /// Lab capture frame 10 (`testdata/host-br0-roce-cm.pcap`): rxe's ACK to the probe,
    /// IPv4 ID 0x3681, DF, UDP checksum 0, ICRC `54 47 eb 53`.
    const IP: &str = "4500003036814000401 1e8e7c0a84d02c0a84d01";
    const UDP: &str = "e5b712b7001c0000";
    const PKT: &str = "1100ffff009e151100c607aa1f0000015447eb53";

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s.replace(' ', "")).unwrap()
    }

    #[test]
    fn rxe_ack_verifies_c3() {
        // C3: ICRC = CRC-32 over the masked IP/UDP/BTH and the rest, little-endian.
        let (ip, udp, pkt) = (h(IP), h(UDP), h(PKT));
        assert_eq!(compute(&ip, &udp, &pkt), Ok(0x53eb4754));
        assert_eq!(verify(&ip, &udp, &pkt), Ok(()));
    }

    #[test]
    fn masked_fields_do_not_matter_the_rest_does() {
        let (ip, udp, pkt) = (h(IP), h(UDP), h(PKT));
        let ok = |ip: &[u8], udp: &[u8], pkt: &[u8]| verify(ip, udp, pkt).is_ok();
        let flip = |v: &[u8], at: usize| {
            let mut v = v.to_vec();
            v[at] ^= 0x5a;
            v
        };
        for at in [1, 8, 10, 11] {
            assert!(ok(&flip(&ip, at), &udp, &pkt), "IPv4 octet {at} is masked");
        }
        for at in [0, 2, 3, 4, 5, 6, 7, 9, 12, 15, 16, 19] {
            assert!(!ok(&flip(&ip, at), &udp, &pkt), "IPv4 octet {at} is covered");
        }
        assert!(ok(&ip, &flip(&udp, 6), &pkt) && ok(&ip, &flip(&udp, 7), &pkt));
        for at in 0..6 {
            assert!(!ok(&ip, &flip(&udp, at), &pkt));
        }
        assert!(ok(&ip, &udp, &flip(&pkt, 4)), "BTH FECN/BECN/Resv6a are masked");
        for at in (0..16).filter(|&a| a != 4) {
            assert!(!ok(&ip, &udp, &flip(&pkt, at)), "packet octet {at} is covered");
        }
        assert!(matches!(
            verify(&ip, &udp, &flip(&pkt, 17)),
            Err(IcrcError::Mismatch {
                computed: 0x53eb4754,
                ..
            })
        ));
    }

    #[test]
    fn ipv6_masks_traffic_class_flow_label_hop_limit() {
        let mut ip6 = [0u8; 40];
        ip6[0] = 0x60;
        ip6[4..6].copy_from_slice(&28u16.to_be_bytes());
        ip6[6] = 17;
        ip6[7] = 64;
        ip6[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        ip6[24..40].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        let (udp, mut pkt) = (h(UDP), h(PKT));
        let icrc = seal(&ip6, &udp, &mut pkt).unwrap();
        let mut other = ip6;
        other[0] = 0x6a; // traffic class
        other[1] = 0xbc;
        other[3] = 0x12; // flow label
        other[7] = 1; // hop limit
        assert_eq!(compute(&other, &udp, &pkt), Ok(icrc));
        other[0] = 0x5f; // the version is covered
        assert_eq!(
            compute(&other, &udp, &pkt),
            Err(IcrcError::IpHeader { len: 40, version: 5 })
        );
        other = ip6;
        other[39] ^= 1; // the destination address is covered
        assert_ne!(compute(&other, &udp, &pkt), Ok(icrc));
    }

    #[test]
    fn bad_headers_are_errors() {
        let (ip, udp, pkt) = (h(IP), h(UDP), h(PKT));
        assert_eq!(
            compute(&ip[..19], &udp, &pkt),
            Err(IcrcError::IpHeader { len: 19, version: 4 })
        );
        assert_eq!(
            compute(&[], &udp, &pkt),
            Err(IcrcError::IpHeader { len: 0, version: 0 })
        );
        let mut opt = ip.clone();
        opt[0] = 0x46;
        opt.extend_from_slice(&[1, 1, 1, 0]);
        assert_eq!(compute(&opt, &udp, &pkt), Err(IcrcError::Ipv4Options { ihl: 6 }));
        opt.truncate(20);
        assert_eq!(compute(&opt, &udp, &pkt), Err(IcrcError::Ipv4Options { ihl: 6 }));
        assert_eq!(compute(&ip, &udp[..7], &pkt), Err(IcrcError::UdpHeader { len: 7 }));
        assert_eq!(compute(&ip, &udp, &pkt[..15]), Err(IcrcError::TooShort { len: 15 }));
        assert_eq!(stored(&[1, 2, 3]), None);
    }

    #[test]
    fn header_builders_match_the_capture() {
        // The probe's RDMA READ RESPONSE (frame 12): ID 0, DF, 192.168.77.1 -> .2, 4791 both.
        let ip = ipv4_header([192, 168, 77, 1], [192, 168, 77, 2], 0, 60);
        assert_eq!(&ip[..10], &h("450000580000400040 11")[..]);
        assert_eq!(udp_header(4791, 4791, 60)[..6], h("12b712b70044")[..]);
    }
}
