//! Golden vectors and malformed-input tests for the IPoIB wire formats (RFC 4391, RFC 4755),
//! built from the RFC figures and Linux's `drivers/infiniband/ulp/ipoib` layouts. Each test
//! names the requirement it checks (`../shared/requirements/smcr-ipoibcm.md` B1/B2/C2).

use std::net::{Ipv4Addr, Ipv6Addr};

use ipoib::wire::arp::{ArpOp, ArpPacket};
use ipoib::wire::cm::{self, CmPrivateData, ServiceId, ServiceIdPrefix};
use ipoib::wire::encap::{EncapHeader, EtherType};
use ipoib::wire::ip::{Ipv4Info, Ipv6Header, checksum, icmpv6_checksum};
use ipoib::wire::lla::LinkAddr;
use ipoib::wire::mgid::{self, Mgid};
use ipoib::wire::{WireError, icmp, nd};

fn h(s: &str) -> Vec<u8> {
    hex::decode(s.replace([' ', ':'], "")).unwrap()
}

const GID_A: [u8; 16] = [
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xc9, 0x03, 0x00, 0x01, 0x23, 0x45,
];

/// C2 / Linux: ib0's broadcast address as `ip link` prints it.
#[test]
fn broadcast_lla_matches_linux_ib0() {
    let b = LinkAddr::multicast(Mgid::broadcast(0xffff, mgid::SCOPE_LINK_LOCAL).0);
    assert_eq!(
        b.to_string(),
        "00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff"
    );
    assert!(b.is_multicast());
    assert_eq!(LinkAddr::parse(&b.to_bytes()).unwrap(), b);
}

/// RFC 4391 §4 worked example: all-routers (group ID 2), P_Key 0x8000.
#[test]
fn rfc4391_section4_mgid_examples() {
    let v4 = Mgid::ipv4(Ipv4Addr::new(224, 0, 0, 2), 0x8000, 2);
    assert_eq!(v4.to_ipv6(), "ff12:401b:8000::2".parse::<Ipv6Addr>().unwrap());
    let v6 = Mgid::ipv6("ff02::2".parse().unwrap(), 0x8000, 2);
    assert_eq!(v6.to_ipv6(), "ff12:601b:8000::2".parse::<Ipv6Addr>().unwrap());
    // 28 low bits only; the full-membership bit is forced on a limited P_Key.
    let g = Mgid::ipv4(Ipv4Addr::new(239, 255, 1, 2), 0x7fff, 2);
    assert_eq!(g.to_ipv6(), "ff12:401b:ffff::fff:102".parse::<Ipv6Addr>().unwrap());
    assert_eq!(Mgid::ipv4(Ipv4Addr::BROADCAST, 0xffff, 2), Mgid::broadcast(0xffff, 2));
    assert_eq!(
        Mgid::all_nodes(0xffff, 2).to_ipv6(),
        "ff12:601b:ffff::1".parse::<Ipv6Addr>().unwrap()
    );
    assert_eq!(g.classify(), Some((2, mgid::SIGNATURE_IPV4, 0xffff)));
    assert_eq!(Mgid(GID_A).classify(), None);
}

/// B1.1, IPCM-4, IPCM-17: flags 0x80 RC / 0x40 UC, reserved bits ignored on receive and
/// sent as zero.
#[test]
fn ipcm_4_lla_flags_reserved_bits() {
    let wire = h("bf 000048 fe80000000000000 0002c90300012345");
    let a = LinkAddr::parse(&wire).unwrap();
    assert!(a.rc());
    assert!(!a.uc());
    assert_eq!(a.qpn, 0x48);
    assert_eq!(a.gid, GID_A);
    assert_eq!(a.to_bytes()[0], 0x80, "reserved bits go out as 0");
    let ud_only = LinkAddr::new(false, 0x48, GID_A);
    assert_eq!(ud_only.to_bytes()[0], 0x00);
    assert_eq!(
        ud_only.to_bytes().to_vec(),
        h("00 000048 fe80000000000000 0002c90300012345")
    );
    assert!(matches!(
        LinkAddr::parse(&wire[..19]),
        Err(WireError::Truncated { need: 20, have: 19, .. })
    ));
}

/// B1.1 ordering for the crossing rule: flags zeroed, byte 0 first.
#[test]
fn ipcm_9_crossing_order_ignores_flags() {
    let a = LinkAddr::new(true, 0x48, GID_A);
    let mut b = LinkAddr::new(false, 0x49, GID_A);
    assert!(a.cmp_crossing(&b).is_lt());
    b.flags = 0;
    b.qpn = 0x48;
    assert!(a.cmp_crossing(&b).is_eq(), "flags do not take part");
    let mut gid = GID_A;
    gid[15] = 0x44;
    let c = LinkAddr::new(true, 0xffff, gid);
    assert!(c.cmp_crossing(&a).is_gt(), "QPN octets come before the GID");
}

/// B1.4, IPCM-11: 4-octet header, Type 0x0800/0x86DD/0x0806, reserved ignored and sent 0.
#[test]
fn ipcm_11_encapsulation_header() {
    assert_eq!(EncapHeader::encapsulate(EtherType::Ipv4, &[0x45]), h("0800 0000 45"));
    assert_eq!(EncapHeader::encapsulate(EtherType::Ipv6, &[]), h("86dd 0000"));
    let raw = h("0806 1234 aa");
    let (hdr, rest) = EncapHeader::parse(&raw).unwrap();
    assert_eq!(hdr.ether_type, EtherType::Arp);
    assert_eq!(hdr.reserved, 0x1234);
    assert_eq!(rest, &[0xaa]);
    let mut out = [0xffu8; 4];
    hdr.emit(&mut out).unwrap();
    assert_eq!(out, [0x08, 0x06, 0, 0]);
    assert_eq!(EtherType::from_value(0x88b5), EtherType::Other(0x88b5));
    assert!(EncapHeader::parse(&[8, 0, 0]).is_err());
}

/// RFC 4391 §9.2: ARP with hardware type 32, hardware length 20 (hand-built from the
/// RFC 826 layout; tshark decodes this vector as "Hardware type: InfiniBand (32)").
#[test]
fn arp_request_golden() {
    let golden = h(concat!(
        "0020 0800 14 04 0001",
        "80000048 fe800000000000000002c90300012345",
        "0a140001",
        "00000000 00000000000000000000000000000000",
        "0a140002"
    ));
    let p = ArpPacket {
        op: ArpOp::Request,
        sender_hw: LinkAddr::new(true, 0x48, GID_A),
        sender_ip: Ipv4Addr::new(10, 20, 0, 1),
        target_hw: LinkAddr {
            flags: 0,
            qpn: 0,
            gid: [0; 16],
        },
        target_ip: Ipv4Addr::new(10, 20, 0, 2),
    };
    assert_eq!(p.to_bytes().to_vec(), golden);
    assert_eq!(ArpPacket::parse(&golden).unwrap(), p);
    // trailing padding is ignored
    let mut padded = golden.clone();
    padded.extend_from_slice(&[0; 8]);
    assert_eq!(ArpPacket::parse(&padded).unwrap(), p);
}

/// Malformed ARP: Ethernet hardware type, 6-octet hardware length, IPv6 protocol,
/// operation 3, truncated — each a typed error, never a panic.
#[test]
fn arp_malformed_is_rejected() {
    let good = ArpPacket {
        op: ArpOp::Reply,
        sender_hw: LinkAddr::new(false, 1, GID_A),
        sender_ip: Ipv4Addr::new(10, 0, 0, 1),
        target_hw: LinkAddr::new(false, 2, GID_A),
        target_ip: Ipv4Addr::new(10, 0, 0, 2),
    }
    .to_bytes();
    let field = |at: usize, v: u8| {
        let mut b = good;
        b[at] = v;
        match ArpPacket::parse(&b) {
            Err(WireError::Invalid { field, .. }) => field,
            other => panic!("byte {at} = {v}: {other:?}"),
        }
    };
    assert_eq!(field(1, 1), "ARP hardware type");
    assert_eq!(field(2, 0x86), "ARP protocol type");
    assert_eq!(field(4, 6), "ARP hardware address length");
    assert_eq!(field(5, 16), "ARP protocol address length");
    assert_eq!(field(7, 3), "ARP operation");
    assert!(matches!(
        ArpPacket::parse(&good[..55]),
        Err(WireError::Truncated { need: 56, .. })
    ));
}

/// B1.2, IPCM-10, E-16: Linux prefix 0x10 sent by default, RFC 0x01 accepted, Type and
/// Reserved must be 0.
#[test]
fn ipcm_10_service_id() {
    let s = ServiceId::new(ServiceIdPrefix::Linux, 0x48);
    assert_eq!(s.value(), 0x1000_0000_0000_0048);
    assert_eq!(ServiceId::parse(0x1000_0000_0000_0048).unwrap(), s);
    assert_eq!(
        ServiceId::parse(0x0100_0000_00ab_cdef).unwrap(),
        ServiceId::new(ServiceIdPrefix::Rfc, 0xab_cdef)
    );
    for (v, f) in [
        (0x1001_0000_0000_0048u64, "service ID type"),
        (0x1000_0100_0000_0048, "service ID reserved"),
        (0x1000_0000_0100_0048, "service ID reserved"),
        (0x0200_0000_0000_0048, "service ID prefix"),
        (0x0000_0000_0000_0048, "service ID prefix"),
    ] {
        match ServiceId::parse(v) {
            Err(WireError::Invalid { field, .. }) => assert_eq!(field, f, "{v:#x}"),
            other => panic!("{v:#x}: {other:?}"),
        }
    }
}

/// B1.3, IPCM-8, IPCM-14, IPCM-17: {reserved 0, UD QPN, Receive MTU}; Linux sends
/// `IPOIB_CM_BUF_SIZE` = 65,524; a non-zero reserved octet is accepted; CM padding after
/// the 8 octets is ignored.
#[test]
fn ipcm_14_private_data() {
    let pd = CmPrivateData::new(0x48, cm::CM_RECV_MTU);
    assert_eq!(pd.to_bytes().to_vec(), h("00 000048 0000fff4"));
    let mut rx = h("aa 000048 0000fff4");
    rx.resize(92, 0);
    let got = CmPrivateData::parse(&rx).unwrap();
    assert_eq!(got.reserved, 0xaa);
    assert_eq!(got.ud_qpn, 0x48);
    assert_eq!(got.recv_mtu, 65524);
    assert_eq!(got.to_bytes()[0], 0, "reserved sent as 0");
    assert!(matches!(
        CmPrivateData::parse(&rx[..7]),
        Err(WireError::Truncated { need: 8, .. })
    ));
}

/// B1.5, IPCM-12, IPCM-13: connection MTU = min(Receive MTUs) − 4; a peer Receive MTU
/// that cannot carry 1,280-octet IPv6 packets is refused.
#[test]
fn ipcm_12_13_mtu_rules() {
    assert_eq!(cm::CM_MTU, 65520);
    assert_eq!(cm::UD_MTU, 2044);
    assert_eq!(cm::connection_mtu(65524, 4096).unwrap(), 4092);
    assert_eq!(cm::connection_mtu(4096, 65524).unwrap(), 4092);
    assert_eq!(cm::connection_mtu(65524, 65524).unwrap(), 65520);
    assert_eq!(cm::connection_mtu(65524, 1284).unwrap(), 1280);
    assert!(cm::connection_mtu(65524, 1283).is_err());
    assert!(cm::connection_mtu(65524, 4).is_err());
    assert!(cm::connection_mtu(65524, 0).is_err());
}

/// RFC 4391 §8, §8.1: interface identifier = GUID with the u/l bit set (as Linux); the
/// link-local address Linux gives such an ib0.
#[test]
fn rfc4391_link_local_from_gid() {
    assert_eq!(
        mgid::interface_id(&GID_A),
        [0x02, 0x02, 0xc9, 0x03, 0x00, 0x01, 0x23, 0x45]
    );
    assert_eq!(
        mgid::link_local(&GID_A),
        "fe80::202:c903:1:2345".parse::<Ipv6Addr>().unwrap()
    );
    // an IPv4-mapped soft-RoCE GID (::ffff:192.168.77.2)
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[192, 168, 77, 2]);
    assert_eq!(
        mgid::link_local(&g),
        "fe80::200:ffff:c0a8:4d02".parse::<Ipv6Addr>().unwrap()
    );
}

fn ll(n: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, n)
}

/// RFC 4391 §9.3: the LLA option is type, length 3, two zero octets, the 20-octet address.
#[test]
fn nd_lla_option_and_round_trip() {
    let me = LinkAddr::new(true, 0x48, GID_A);
    let o = nd::emit_lla_option(nd::OPT_SOURCE_LLA, &me);
    assert_eq!(o.to_vec(), h("01 03 0000 80000048 fe800000000000000002c90300012345"));
    let ns = nd::build_solicit(ll(1), nd::solicited_node(ll(2)), ll(2), &me);
    assert_eq!(nd::solicited_node(ll(2)), "ff02::1:ff00:2".parse::<Ipv6Addr>().unwrap());
    let (hdr, msg) = nd::parse(&ns).unwrap().unwrap();
    assert_eq!(hdr.hop_limit, 255);
    assert_eq!(
        msg,
        nd::NdMessage::Solicit {
            target: ll(2),
            source_lla: Some(me)
        }
    );
    let na = nd::build_advert(ll(2), ll(1), ll(2), true, &me);
    let (_, msg) = nd::parse(&na).unwrap().unwrap();
    assert_eq!(
        msg,
        nd::NdMessage::Advert {
            router: false,
            solicited: true,
            override_: true,
            target: ll(2),
            target_lla: Some(me)
        }
    );
    // checksum verifies with the pseudo-header
    let (h6, payload) = Ipv6Header::parse(&na).unwrap();
    assert_eq!(icmpv6_checksum(&h6.src, &h6.dst, payload), 0);
}

/// Malformed ND (RFC 4861 §7.1.1): hop limit, checksum, zero-length option, an Ethernet-size
/// LLA option, multicast target, truncated; non-ND IPv6 is `None`.
#[test]
fn nd_malformed_is_rejected() {
    let me = LinkAddr::new(false, 7, GID_A);
    let ns = nd::build_solicit(ll(1), nd::solicited_node(ll(2)), ll(2), &me);
    let mut hop = ns.clone();
    hop[7] = 64;
    assert!(matches!(
        nd::parse(&hop),
        Err(WireError::Invalid {
            field: "ND hop limit",
            ..
        })
    ));
    let mut sum = ns.clone();
    sum[40 + 30] ^= 1;
    assert!(matches!(nd::parse(&sum), Err(WireError::Checksum { .. })));
    // option length 1 (an Ethernet address), checksum fixed up
    let fix = |mut p: Vec<u8>| {
        p[42] = 0;
        p[43] = 0;
        let (hh, _) = Ipv6Header::parse(&p).unwrap();
        let c = icmpv6_checksum(&hh.src, &hh.dst, &p[40..]);
        p[42..44].copy_from_slice(&c.to_be_bytes());
        p
    };
    let mut eth = ns.clone();
    eth[40 + 24 + 1] = 1;
    eth.truncate(40 + 24 + 8);
    eth[4..6].copy_from_slice(&32u16.to_be_bytes());
    let eth = fix(eth);
    assert!(matches!(
        nd::parse(&eth),
        Err(WireError::Invalid {
            field: "IPoIB link-layer address option length",
            ..
        })
    ));
    let mut zero = ns.clone();
    zero[40 + 24 + 1] = 0;
    let zero = fix(zero);
    assert!(matches!(
        nd::parse(&zero),
        Err(WireError::Invalid {
            field: "ND option length",
            ..
        })
    ));
    let mcast = nd::build_solicit(ll(1), ll(3), "ff02::1".parse().unwrap(), &me);
    assert!(nd::parse(&mcast).is_err());
    let dad = nd::build_solicit(Ipv6Addr::UNSPECIFIED, ll(3), ll(2), &me);
    assert!(nd::parse(&dad).is_err(), "no source LLA from ::");
    assert!(nd::parse(&ns[..50]).is_err());
    // an echo request is not ND
    let echo = ipoib::wire::ip::icmpv6_packet(ll(1), ll(2), 64, vec![128, 0, 0, 0, 0, 1, 0, 1]);
    assert_eq!(nd::parse(&echo).unwrap(), None);
}

fn ipv4_packet(len: usize, df: bool, proto: u8) -> Vec<u8> {
    let mut p = vec![0u8; len];
    ipoib::wire::ip::emit_ipv4_header(
        &mut p,
        len as u16,
        0x1234,
        if df { 0x4000 } else { 0 },
        proto,
        Ipv4Addr::new(10, 20, 0, 1),
        Ipv4Addr::new(10, 20, 0, 2),
    )
    .unwrap();
    for (i, b) in p[20..].iter_mut().enumerate() {
        *b = i as u8;
    }
    p
}

/// D3: ICMP "fragmentation needed" (3/4) with the next-hop MTU, to the original source,
/// quoting the header + 8 octets; never about an ICMP error.
#[test]
fn icmp_frag_needed_for_oversize_df_packet() {
    let p = ipv4_packet(2100, true, 17);
    let e = icmp::frag_needed(&p, 2044).unwrap().unwrap();
    let info = Ipv4Info::parse(&e).unwrap();
    assert_eq!(info.src, Ipv4Addr::new(10, 20, 0, 2));
    assert_eq!(info.dst, Ipv4Addr::new(10, 20, 0, 1));
    assert_eq!(info.protocol, 1);
    assert_eq!(checksum(&e[..20]), 0);
    let m = &e[20..];
    assert_eq!(&m[..2], &[3, 4]);
    assert_eq!(u16::from_be_bytes([m[6], m[7]]), 2044);
    assert_eq!(&m[8..], &p[..28]);
    assert_eq!(checksum(m), 0);
    let mut err = ipv4_packet(100, true, 1);
    err[20] = 3;
    assert_eq!(icmp::frag_needed(&err, 2044).unwrap(), None);
}

/// D3: ICMPv6 "packet too big" (type 2) with the MTU, at most 1,280 octets, checksum valid.
#[test]
fn icmpv6_packet_too_big() {
    let big = ipoib::wire::ip::icmpv6_packet(ll(1), ll(2), 64, {
        let mut m = vec![128, 0, 0, 0, 0, 1, 0, 1];
        m.resize(3000, 0x5a);
        m
    });
    let e = icmp::packet_too_big(&big, 2044).unwrap().unwrap();
    assert_eq!(e.len(), 1280);
    let (hh, m) = Ipv6Header::parse(&e).unwrap();
    assert_eq!((hh.src, hh.dst), (ll(2), ll(1)));
    assert_eq!(m[0], 2);
    assert_eq!(u32::from_be_bytes([m[4], m[5], m[6], m[7]]), 2044);
    assert_eq!(icmpv6_checksum(&hh.src, &hh.dst, m), 0);
    let ptb = e.clone();
    assert_eq!(icmp::packet_too_big(&ptb, 1280).unwrap(), None, "never about an error");
}

/// IPv4 without DF larger than the destination MTU is fragmented (RFC 791).
#[test]
fn ipv4_fragmentation() {
    let p = ipv4_packet(5000, false, 17);
    let frags = icmp::fragment_v4(&p, 2044).unwrap();
    assert_eq!(frags.len(), 3);
    let mut data = Vec::new();
    for (i, f) in frags.iter().enumerate() {
        assert!(f.len() <= 2044);
        let info = Ipv4Info::parse(f).unwrap();
        assert_eq!(checksum(&f[..20]), 0);
        assert_eq!(info.mf, i < 2);
        assert_eq!(usize::from(info.frag_offset) * 8, data.len());
        data.extend_from_slice(&f[20..]);
    }
    assert_eq!(data, p[20..]);
    assert!(icmp::fragment_v4(&ipv4_packet(5000, true, 17), 2044).is_err());
}
