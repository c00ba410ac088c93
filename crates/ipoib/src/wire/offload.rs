//! Checksum offload between the kernel (a TUN with `IFF_VNET_HDR`) and the link (issue 16):
//! the 10-octet `struct virtio_net_hdr` in front of every packet on the TUN, the
//! ones'-complement checksum the daemon fills in when a partial one must not leave, and
//! the softrdma extension that lets two of our nodes carry partial checksums over an RC
//! connection.
//!
//! ```text
//! virtio_net_hdr (Linux include/uapi/linux/virtio_net.h, little-endian on a TUN)
//! off size
//!   0    1  flags: 1 NEEDS_CSUM (checksum partial), 2 DATA_VALID (not honoured by a TUN)
//!   1    1  gso_type: 0 NONE (we do not enable TSO: no super-packets)
//!   2    2  hdr_len
//!   4    2  gso_size
//!   6    2  csum_start: offset of the L4 header from the IP header
//!   8    2  csum_offset: offset of the checksum field from csum_start (TCP 16, UDP 6)
//! ```
//!
//! # What goes on the wire
//!
//! With `TUN_F_CSUM` the kernel hands the daemon TCP and UDP packets whose checksum field
//! holds only the pseudo-header sum (`NEEDS_CSUM`). Two of our nodes agree, in the CM
//! private data after the 8 octets of RFC 4755 §6 ([`CsumExt`], octets 8..16, which
//! Linux's ipoib and RFC 4755 peers ignore as padding), that on their connection the
//! checksum field of every TCP or UDP packet [`l4_checksum_at`] locates holds the
//! pseudo-header sum only: partial packets go as the kernel handed them over, and the
//! sender rewrites a complete one to that form ([`pseudo_sum`], 12 or 40 octets summed,
//! no pass over the data). Nothing else changes on the wire: the encapsulation header's
//! reserved field stays 0 (so tshark still decodes IPoIB + IP; its TCP/UDP checksum check,
//! off by default, would call them incorrect). The RC transport's ICRC covers the message
//! from the sender's registered memory to the receiver's, which is the integrity the
//! TCP/UDP checksum would add on this hop. The receiver hands such packets to its kernel
//! as `NEEDS_CSUM` with the offsets [`l4_checksum_at`] finds (the kernel treats them as
//! checked when it delivers them locally, and fills the checksum in if it forwards them,
//! as for a packet from a veth). Every packet that leaves any other way (UD, a peer
//! without the extension) gets a partial checksum filled in by the daemon
//! ([`fill_checksum`]) first. Packets with complete checksums go to the kernel with flags
//! 0, and the kernel checks them: a TUN honours `NEEDS_CSUM` on writes but ignores
//! `DATA_VALID` (virtio_net_hdr_to_skb), so a checked complete checksum cannot be passed
//! on.

use super::{WireError, need, room};

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`.
pub const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_NONE`.
pub const GSO_NONE: u8 = 0;

/// The virtio-net header of a TUN opened with `IFF_VNET_HDR` (the kernel's default size,
/// 10 octets). Its 16-bit fields are in the host's order for a TUN without `TUNSETVNETLE`
/// or `TUNSETVNETBE`; little-endian here, which is what the daemon runs on (x86-64,
/// aarch64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VnetHdr {
    /// [`F_NEEDS_CSUM`], [`F_DATA_VALID`].
    pub flags: u8,
    /// [`GSO_NONE`] unless TSO was enabled (it is not).
    pub gso_type: u8,
    /// Header length (GSO only).
    pub hdr_len: u16,
    /// Segment size (GSO only).
    pub gso_size: u16,
    /// Where the checksummed range starts, from the IP header.
    pub csum_start: u16,
    /// Where the checksum field is, from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Octets in front of each packet.
    pub const LEN: usize = 10;

    /// A header that asks the kernel to check the checksum itself (flags 0).
    pub fn plain() -> VnetHdr {
        VnetHdr::default()
    }

    /// A header for a packet with a partial checksum (`NEEDS_CSUM`).
    pub fn partial(csum_start: u16, csum_offset: u16) -> VnetHdr {
        VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start,
            csum_offset,
            ..VnetHdr::default()
        }
    }

    /// Parses the header in front of a packet read from the TUN.
    pub fn parse(b: &[u8]) -> Result<VnetHdr, WireError> {
        need("virtio_net_hdr", b, Self::LEN)?;
        let le = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        Ok(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le(2),
            gso_size: le(4),
            csum_start: le(6),
            csum_offset: le(8),
        })
    }

    /// Writes the 10 octets.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        room("virtio_net_hdr", out, Self::LEN)?;
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        Ok(Self::LEN)
    }

    /// The 10 octets.
    pub fn to_bytes(&self) -> [u8; 10] {
        let mut b = [0u8; 10];
        let _ = self.emit(&mut b);
        b
    }

    /// Whether the packet's checksum is partial (the kernel left it to the device).
    pub fn needs_csum(&self) -> bool {
        self.flags & F_NEEDS_CSUM != 0
    }
}

/// The ones'-complement sum (RFC 1071) of `b`, folded to 16 bits, not complemented.
pub fn ones_sum(b: &[u8]) -> u16 {
    let mut acc: u64 = 0;
    let mut words = b.chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut last = [0u8; 4];
    last[..rest.len()].copy_from_slice(rest);
    acc += u64::from(u32::from_be_bytes(last));
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Completes a partial checksum as a device would (Linux `skb_checksum_help`): the sum of
/// `pkt[start..]` (the field at `start + offset` holds the pseudo-header sum) is folded,
/// complemented and stored there, 0 as 0xffff. `Err` if the offsets do not fit the packet
/// (the packet is then dropped).
pub fn fill_checksum(pkt: &mut [u8], start: u16, offset: u16) -> Result<(), WireError> {
    let (s, f) = (usize::from(start), usize::from(start) + usize::from(offset));
    if f + 2 > pkt.len() {
        return Err(WireError::Truncated {
            what: "partial checksum",
            need: f + 2,
            have: pkt.len(),
        });
    }
    let c = !ones_sum(&pkt[s..]);
    let c = if c == 0 { 0xffff } else { c };
    pkt[f..f + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Where the TCP or UDP checksum of an unfragmented IPv4 packet, or of an IPv6 packet
/// whose next header is TCP or UDP, lies: `(csum_start, csum_offset)` from the IP header
/// (as a kernel with `TUN_F_CSUM` gives them). `None` for anything else (fragments, other
/// protocols, IPv6 extension headers, lengths that disagree with the header): such a
/// packet's checksum is always complete on the wire.
pub fn l4_checksum_at(pkt: &[u8]) -> Option<(u16, u16)> {
    let (start, proto) = match pkt.first()? >> 4 {
        4 => {
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            if ihl < 20 || pkt.len() < ihl || usize::from(u16::from_be_bytes([pkt[2], pkt[3]])) != pkt.len() {
                return None;
            }
            // MF clear and fragment offset 0: a whole datagram.
            if u16::from_be_bytes([pkt[6], pkt[7]]) & 0x3fff != 0 {
                return None;
            }
            (ihl, pkt[9])
        }
        6 => {
            if pkt.len() < 40 || usize::from(u16::from_be_bytes([pkt[4], pkt[5]])) + 40 != pkt.len() {
                return None;
            }
            (40, pkt[6])
        }
        _ => return None,
    };
    let offset = match proto {
        6 => 16,
        17 => 6,
        _ => return None,
    };
    (start + offset + 2 <= pkt.len()).then_some((start as u16, offset as u16))
}

/// The pseudo-header sum (folded, not complemented: what the checksum field of a partial
/// TCP/UDP checksum holds) of a packet [`l4_checksum_at`] accepts.
pub fn pseudo_sum(pkt: &[u8]) -> Option<u16> {
    let (start, _) = l4_checksum_at(pkt)?;
    let l4_len = (pkt.len() - usize::from(start)) as u32;
    let mut ph = [0u8; 40];
    let n = if pkt[0] >> 4 == 4 {
        ph[..8].copy_from_slice(&pkt[12..20]);
        ph[9] = pkt[9];
        ph[10..12].copy_from_slice(&(l4_len as u16).to_be_bytes());
        12
    } else {
        ph[..32].copy_from_slice(&pkt[8..40]);
        ph[32..36].copy_from_slice(&l4_len.to_be_bytes());
        ph[39] = pkt[6];
        40
    };
    Some(ones_sum(&ph[..n]))
}

/// The softrdma extension of the CM private data, octets 8..16 after the RFC 4755 §6
/// fields: the magic `"sRDx"` and 32 flag bits, big-endian. A peer that does not send it
/// (Linux, any RFC 4755 node: zero padding there) has no flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CsumExt {
    /// [`CsumExt::PARTIAL_CSUM`].
    pub flags: u32,
}

impl CsumExt {
    /// Where the extension starts in the private data.
    pub const OFFSET: usize = 8;
    /// Its octets.
    pub const LEN: usize = 8;
    /// The magic.
    pub const MAGIC: [u8; 4] = *b"sRDx";
    /// The sender takes TCP/UDP packets in the pseudo-header form (see the module
    /// documentation) on the connection, and sends them so when the peer offered it too.
    pub const PARTIAL_CSUM: u32 = 1;

    /// The extension of a CM message's private data (no flags if absent or foreign).
    pub fn parse(private_data: &[u8]) -> CsumExt {
        match private_data.get(Self::OFFSET..Self::OFFSET + Self::LEN) {
            Some(b) if b[..4] == Self::MAGIC => CsumExt {
                flags: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            },
            _ => CsumExt::default(),
        }
    }

    /// The 8 octets that follow the RFC 4755 private data.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&Self::MAGIC);
        b[4..].copy_from_slice(&self.flags.to_be_bytes());
        b
    }

    /// Whether the peer accepts partial checksums.
    pub fn partial_csum(&self) -> bool {
        self.flags & Self::PARTIAL_CSUM != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vnet_hdr_golden_round_trip() {
        // A TCP/IPv4 packet from a TUN with TUN_F_CSUM: NEEDS_CSUM, start 20, offset 16.
        let b = [1u8, 0, 0, 0, 0, 0, 20, 0, 16, 0];
        let h = VnetHdr::parse(&b).unwrap();
        assert_eq!(h, VnetHdr::partial(20, 16));
        assert!(h.needs_csum());
        assert_eq!(h.to_bytes(), b);
        assert_eq!(VnetHdr::plain().to_bytes(), [0; 10]);
        assert!(VnetHdr::parse(&b[..9]).is_err());
    }

    #[test]
    fn fill_checksum_matches_rfc1071_example_and_a_full_sum() {
        // RFC 1071 §3 example: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        assert_eq!(ones_sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0xddf2);
        // Odd length: the last octet is the high half of a word.
        assert_eq!(ones_sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
        // The field holds the pseudo-header sum (0x1234 here); filled in, the range plus
        // the pseudo-header sums to 0xffff (checks as valid), as a receiver computes it.
        let mut p: Vec<u8> = (0..1001u32).map(|i| (i * 7 + 3) as u8).collect();
        p[30..32].copy_from_slice(&0x1234u16.to_be_bytes());
        fill_checksum(&mut p, 14, 16).unwrap();
        let mut with_pseudo = vec![0x12, 0x34];
        with_pseudo.extend_from_slice(&p[14..]);
        assert_eq!(ones_sum(&with_pseudo[..]), 0xffff);
        assert_ne!(p[30..32], [0x12, 0x34]);
        assert!(fill_checksum(&mut p[..31], 14, 16).is_err());
    }

    #[test]
    fn checksum_location_and_pseudo_header_sum() {
        // IPv4/TCP, 20-octet header, 40 octets in all: 10.0.0.1 -> 10.0.0.2.
        let mut v4 = vec![0u8; 40];
        v4[..20].copy_from_slice(&[0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        assert_eq!(l4_checksum_at(&v4), Some((20, 16)));
        // 0x0a00 + 0x0001 + 0x0a00 + 0x0002 + 0x0006 + 20 (TCP length) = 0x141d.
        assert_eq!(pseudo_sum(&v4), Some(0x141d));
        v4[9] = 17;
        assert_eq!(l4_checksum_at(&v4), Some((20, 6)));
        v4[6] = 0x20; // MF: a fragment
        assert_eq!(l4_checksum_at(&v4), None);
        v4[6] = 0x40;
        v4[9] = 1; // ICMP
        assert_eq!(l4_checksum_at(&v4), None);
        v4[9] = 6;
        assert_eq!(l4_checksum_at(&v4[..39]), None, "length disagrees with the header");
        // IPv6/UDP, 8-octet payload, ::1 -> ::2: 1 + 2 + 8 (length) + 17.
        let mut v6 = vec![0u8; 48];
        v6[0] = 0x60;
        v6[5] = 8;
        v6[6] = 17;
        v6[23] = 1;
        v6[39] = 2;
        assert_eq!(l4_checksum_at(&v6), Some((40, 6)));
        assert_eq!(pseudo_sum(&v6), Some(1 + 2 + 8 + 17));
        v6[6] = 0; // hop-by-hop options first
        assert_eq!(l4_checksum_at(&v6), None);
    }

    #[test]
    fn csum_ext_only_with_its_magic() {
        let mut pd = vec![0u8, 0, 0, 0x48, 0, 0, 0xff, 0xf4];
        assert!(!CsumExt::parse(&pd).partial_csum());
        pd.extend_from_slice(&[0; 84]); // RFC 4755 peer: zero padding
        assert!(!CsumExt::parse(&pd).partial_csum());
        let e = CsumExt {
            flags: CsumExt::PARTIAL_CSUM,
        };
        assert_eq!(e.to_bytes(), [b's', b'R', b'D', b'x', 0, 0, 0, 1]);
        pd[8..16].copy_from_slice(&e.to_bytes());
        assert!(CsumExt::parse(&pd).partial_csum());
    }
}
