//! Fuzzes every IPoIB wire decoder on arbitrary octets (the ones the link machine calls on
//! what peers send): encapsulation header, link-layer address, ARP, ND (IPv6 + ICMPv6 +
//! options), CM private data, service ID, IPv4 info, and the ICMP builders / IPv4
//! fragmentation on whatever parses. Whatever parses must emit and parse back the same.
#![no_main]
use ipoib::wire::arp::ArpPacket;
use ipoib::wire::cm::{CmPrivateData, ServiceId};
use ipoib::wire::encap::EncapHeader;
use ipoib::wire::ip::{Ipv4Info, Ipv6Header};
use ipoib::wire::lla::LinkAddr;
use ipoib::wire::{icmp, nd};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, _)) = EncapHeader::parse(data) {
        let mut b = [0u8; 4];
        h.emit(&mut b).expect("4 octets");
        assert_eq!(EncapHeader::parse(&b).unwrap().0.ether_type, h.ether_type);
    }
    if let Ok(l) = LinkAddr::parse(data) {
        let again = LinkAddr::parse(&l.to_bytes()).unwrap();
        assert_eq!(again.without_flags(), l.without_flags());
        assert_eq!(again.flags, l.flags & !LinkAddr::FLAG_RESERVED);
    }
    if let Ok(a) = ArpPacket::parse(data) {
        let again = ArpPacket::parse(&a.to_bytes()).unwrap();
        assert_eq!(again.sender_ip, a.sender_ip);
        assert_eq!(again.target_hw.without_flags(), a.target_hw.without_flags());
    }
    if let Ok(pd) = CmPrivateData::parse(data) {
        let again = CmPrivateData::parse(&pd.to_bytes()).unwrap();
        assert_eq!((again.ud_qpn, again.recv_mtu, again.reserved), (pd.ud_qpn, pd.recv_mtu, 0));
    }
    if data.len() >= 8 {
        let v = u64::from_be_bytes(data[..8].try_into().unwrap());
        if let Ok(s) = ServiceId::parse(v) {
            assert_eq!(s.value(), v);
        }
    }
    if let Ok(Some((h, m))) = nd::parse(data) {
        let _ = (h, m);
    }
    if let Ok((h, _)) = Ipv6Header::parse(data) {
        if let Ok(Some(e)) = icmp::packet_too_big(data, 1280) {
            assert!(e.len() <= 1280);
            assert!(Ipv6Header::parse(&e).is_ok());
        }
        let _ = h;
    }
    if let Ok(info) = Ipv4Info::parse(data) {
        if let Ok(Some(e)) = icmp::frag_needed(data, 2044) {
            assert!(Ipv4Info::parse(&e).is_ok());
        }
        let mtu = 28 + usize::from(data[0] & 0x3f) * 8;
        if let Ok(frags) = icmp::fragment_v4(data, mtu.max(info.header_len + 8)) {
            let total: usize = frags.iter().map(|f| f.len() - Ipv4Info::parse(f).unwrap().header_len).sum();
            assert_eq!(total, info.total_len - info.header_len);
        }
    }
});
