//! Property tests: the decoders never panic and round-trip (the same checks as the
//! `ipoib_wire` fuzz target, run in CI); the link machine survives arbitrary UD/RC input.

use std::net::Ipv4Addr;
use std::time::Duration;

use ipoib::link::{ConnId, Link, LinkConfig, Mode};
use ipoib::wire::arp::ArpPacket;
use ipoib::wire::cm::{CmPrivateData, ServiceId};
use ipoib::wire::lla::LinkAddr;
use ipoib::wire::{icmp, nd};
use proptest::prelude::*;

proptest! {
    #[test]
    fn decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = nd::parse(&data);
        let _ = icmp::frag_needed(&data, 2044);
        let _ = icmp::packet_too_big(&data, 2044);
        let _ = icmp::fragment_v4(&data, 576);
        if let Ok(a) = ArpPacket::parse(&data) {
            prop_assert_eq!(ArpPacket::parse(&a.to_bytes()).unwrap().target_ip, a.target_ip);
        }
        if let Ok(pd) = CmPrivateData::parse(&data) {
            prop_assert_eq!(CmPrivateData::parse(&pd.to_bytes()).unwrap().recv_mtu, pd.recv_mtu);
        }
    }

    #[test]
    fn lla_and_service_id_round_trip(flags in any::<u8>(), qpn in any::<u32>(), gid in any::<[u8; 16]>(), sid in any::<u64>()) {
        let l = LinkAddr { flags, qpn: qpn & 0xff_ffff, gid };
        let back = LinkAddr::parse(&l.to_bytes()).unwrap();
        prop_assert_eq!(back.without_flags(), l.without_flags());
        prop_assert_eq!(back.flags, flags & 0xc0);
        if let Ok(s) = ServiceId::parse(sid) {
            prop_assert_eq!(s.value(), sid);
        }
    }

    #[test]
    fn link_survives_arbitrary_input(
        msgs in proptest::collection::vec((0u8..6, proptest::collection::vec(any::<u8>(), 0..120)), 0..40)
    ) {
        let mut cfg = LinkConfig::new(Mode::Connected, 0x48, [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1]);
        cfg.ipv4.push((Ipv4Addr::new(10, 20, 0, 1), 24));
        cfg.max_neigh = 4;
        let mut l = Link::new(cfg);
        let mut now = Duration::from_secs(1);
        for (k, body) in msgs {
            let mut m = match k {
                0 => vec![0x08, 0x06, 0, 0],
                1 => vec![0x86, 0xdd, 0, 0],
                2 => vec![0x08, 0x00, 0, 0],
                _ => vec![],
            };
            m.extend_from_slice(&body);
            match k {
                3 => l.on_kernel_packet(now, body),
                4 => l.on_cm_req(now, 1, 0x1000_0000_0000_0048, [1; 16], &body),
                5 => l.on_rc_recv(now, ConnId(1), &m),
                _ => l.on_ud_recv(now, &m),
            }
            now += Duration::from_millis(700);
            l.on_tick(now);
            let _ = l.take_actions();
            prop_assert!(l.neighbours(now).len() <= 4);
        }
    }
}
