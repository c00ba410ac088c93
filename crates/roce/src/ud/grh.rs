//! The 40-octet GRH area a UD receive buffer starts with, built from the IP header the
//! datagram came in, as Linux rxe 6.1 builds it (`rxe_resp.c`, `build_rdma_network_hdr`,
//! into `union rdma_network_hdr` of `include/rdma/ib_verbs.h`):
//!
//! - IPv4: 20 zero octets, then the 20-octet IPv4 header as received (`roce4grh`);
//! - IPv6: the 40-octet IPv6 header as received (`ibgrh`).
//!
//! rdma-core's `ibv_init_ah_from_wc` reads it back the same way (an IPv4 header with a good
//! checksum in the last 20 octets means IPv4); [`verbs::Grh::parse`] is that reader.
//!
//! When the device receives through its UDP socket (no raw socket, see
//! [`crate::IcrcRx::Udp`]) the IPv4 header itself is not available: [`synth_ipv4`] builds
//! the header Linux sends from an unconnected socket with DF (ID 0, TTL 64, TOS 0), with the
//! addresses and length of the datagram. With the raw socket the real header is copied.

/// Octets of the GRH area.
pub const GRH_LEN: usize = 40;

/// The GRH area of an IPv4 datagram: 20 zero octets, then its IPv4 header.
pub fn from_ipv4(hdr: &[u8; 20]) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    g[20..].copy_from_slice(hdr);
    g
}

/// The GRH area of an IPv6 datagram: its IPv6 header.
pub fn from_ipv6(hdr: &[u8; 40]) -> [u8; GRH_LEN] {
    *hdr
}

/// The IPv4 header checksum field value for `h` (RFC 791; `h[10..12]` taken as 0).
pub fn ipv4_checksum(h: &[u8; 20]) -> u16 {
    let mut s: u32 = 0;
    for i in (0..20).step_by(2) {
        if i != 10 {
            s += u32::from(u16::from_be_bytes([h[i], h[i + 1]]));
        }
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The IPv4 header of a UDP datagram of `udp_payload_len` payload octets from `src` to
/// `dst` as Linux sends it from an unconnected socket with DF set: ID 0, TTL `ttl`, TOS
/// `tos`, checksum filled in.
pub fn synth_ipv4(src: [u8; 4], dst: [u8; 4], udp_payload_len: usize, ttl: u8, tos: u8) -> [u8; 20] {
    let total = (20 + 8 + udp_payload_len) as u16;
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[1] = tos;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = ttl;
    h[9] = 17; // UDP
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let c = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

/// The IPv6 header of a UDP datagram of `udp_payload_len` payload octets (traffic class
/// and flow label 0, hop limit `hop_limit`).
pub fn synth_ipv6(src: [u8; 16], dst: [u8; 16], udp_payload_len: usize, hop_limit: u8) -> [u8; 40] {
    let mut h = [0u8; 40];
    h[0] = 0x60;
    h[4..6].copy_from_slice(&((8 + udp_payload_len) as u16).to_be_bytes());
    h[6] = 17;
    h[7] = hop_limit;
    h[8..24].copy_from_slice(&src);
    h[24..40].copy_from_slice(&dst);
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::{Gid, Grh};

    /// Golden vector: a 64-octet UD payload from 192.168.77.1 to 192.168.77.2 (rxe's
    /// layout: zeros, then the IPv4 header; checksum worked out by hand below).
    #[test]
    fn ipv4_grh_golden() {
        let h = synth_ipv4([192, 168, 77, 1], [192, 168, 77, 2], 12 + 8 + 64 + 4, 64, 0);
        // total length 20 + 8 + 88 = 116 = 0x74
        let want_hdr: [u8; 20] = [
            0x45, 0x00, 0x00, 0x74, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x1f, 0x25, 192, 168, 77, 1, 192, 168, 77, 2,
        ];
        // The checksum is the one's complement of the sum of the other nine words:
        // 4500+0074+0000+4000+4011+c0a8+4d01+c0a8+4d02 = 0x2e0d8 -> 0xe0da -> !0xe0da = 0x1f25.
        assert_eq!(h, want_hdr);
        let g = from_ipv4(&h);
        assert_eq!(&g[..20], &[0u8; 20]);
        assert_eq!(&g[20..], &want_hdr);
        let p = Grh::parse(&g).unwrap();
        assert!(p.ipv4);
        assert_eq!(p.sgid, Gid::from_ip("192.168.77.1".parse().unwrap()));
        assert_eq!(p.dgid, Gid::from_ip("192.168.77.2".parse().unwrap()));
        assert_eq!(p.hop_limit, 64);
    }

    #[test]
    fn ipv6_grh_roundtrip() {
        let s: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
        let d: std::net::Ipv6Addr = "ff12:401b::1".parse().unwrap();
        let mut h = synth_ipv6(s.octets(), d.octets(), 100, 7);
        h[1] = 0x5a; // traffic class 0x05, flow label 0xa....
        h[2] = 0xbc;
        h[3] = 0xde;
        let g = from_ipv6(&h);
        let p = Grh::parse(&g).unwrap();
        assert!(!p.ipv4);
        assert_eq!(p.sgid, Gid(s.octets()));
        assert_eq!(p.dgid, Gid(d.octets()));
        assert_eq!(p.traffic_class, 0x05);
        assert_eq!(p.flow_label, 0xabcde);
        assert_eq!(p.hop_limit, 7);
    }

    #[test]
    fn garbage_is_no_grh() {
        assert!(Grh::parse(&[0u8; 40]).is_none());
        assert!(Grh::parse(&[0u8; 39]).is_none());
        // An IPv4 header with a wrong checksum is not taken as IPv4.
        let mut h = synth_ipv4([10, 0, 0, 1], [10, 0, 0, 2], 0, 64, 0);
        h[11] ^= 1;
        assert!(Grh::parse(&from_ipv4(&h)).is_none());
    }
}
