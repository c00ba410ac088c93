//! Golden vectors from the lab capture `testdata/smc-r-2vm-612-br0.pcap` (a copy of
//! `shared/lab/results/smc-r-2vm-612-br0.pcap`: SMC-Rv2 between two Linux 6.12 VMs over rxe,
//! captured on br0; decode in `smc-r-2vm-612-tshark.txt`, lab README "SMC-R in the lab").
//!
//! Every CLC frame (6 Proposal, 8 Accept, 10 Confirm) and every LLC frame (11, 13 CONFIRM
//! LINK v2; 15, 17 ADD LINK v2; 80, 81, 84, 85 DELETE RKEY v2) parses to the field values
//! tshark shows (or, for the v2 LLC forms tshark 4.0.17 marks malformed, peers file §5.3.13,
//! to the values read by hand from the hex in smc-r-2vm-612-tshark.txt), and emitting the
//! parsed value gives the captured octets back. The SYN and SYN-ACK carry the TCP option.
//! Requirements: smcr-ipoibcm.md A1.2-A1.8, A2.1 (SMC-OPT-5), A2.2 (SMC-CLC-1), C5.

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use pcap_file::pcap::PcapReader;
use smc::wire::clc::{ClcMessage, Diagnosis, PeerId, SmcType};
use smc::wire::llc::{self, LlcBody, LlcMessage, LlcVersion};
use smc::wire::tcp_option;

const CAPTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/smc-r-2vm-612-br0.pcap");

/// (frame number, TCP header or None, transport payload).
pub fn frames() -> Vec<(usize, Option<Vec<u8>>, Vec<u8>)> {
    let file = std::fs::File::open(CAPTURE).expect("the capture is in testdata/");
    let mut r = PcapReader::new(file).unwrap();
    let mut out = Vec::new();
    let mut no = 0;
    while let Some(p) = r.next_packet() {
        no += 1;
        let p = p.unwrap();
        let s = SlicedPacket::from_ethernet(&p.data).unwrap();
        if !matches!(s.net, Some(NetSlice::Ipv4(_))) {
            continue;
        }
        match &s.transport {
            Some(TransportSlice::Tcp(t)) => out.push((no, Some(t.header_slice().to_vec()), t.payload().to_vec())),
            Some(TransportSlice::Udp(u)) => out.push((no, None, u.payload().to_vec())),
            _ => {}
        }
    }
    out
}

fn payload(no: usize) -> Vec<u8> {
    frames().into_iter().find(|f| f.0 == no).unwrap().2
}

fn ip(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

fn eid() -> [u8; 32] {
    let mut e = [b' '; 32];
    e[..16].copy_from_slice(b"RDMALAB-SMC-TEST");
    e
}

fn host() -> [u8; 32] {
    let mut e = [b' '; 32];
    e[..10].copy_from_slice(b"rdmalab-vm");
    e
}

fn round_trip(no: usize, wire: &[u8]) -> ClcMessage {
    let m = ClcMessage::parse(wire).unwrap_or_else(|e| panic!("frame {no}: {e}"));
    assert_eq!(m.wire_len(), wire.len(), "frame {no}");
    assert_eq!(m.to_vec().unwrap(), wire, "frame {no}: emit differs");
    m
}

#[test]
fn syn_and_syn_ack_carry_the_option_smc_opt_1_smc_opt_5() {
    let f = frames();
    let syns: Vec<_> = f.iter().filter(|x| x.0 == 3 || x.0 == 4).collect();
    assert_eq!(syns.len(), 2);
    for (no, h, _) in syns {
        assert!(tcp_option::find_in_tcp_header(h.as_ref().unwrap()), "frame {no}");
    }
    // The third-handshake ACK (frame 5) has no option.
    let ack = f.iter().find(|x| x.0 == 5).unwrap();
    assert!(!tcp_option::find_in_tcp_header(ack.1.as_ref().unwrap()));
}

#[test]
fn proposal_v2_frame_6_smc_clc_1() {
    let w = payload(6);
    assert_eq!(w.len(), 156);
    let ClcMessage::Proposal(p) = round_trip(6, &w) else {
        panic!("not a Proposal")
    };
    assert_eq!(p.version, 2);
    assert_eq!(p.typev2, SmcType::R);
    assert_eq!(p.typev1, SmcType::None);
    assert_eq!(p.peer_id, PeerId::default());
    assert!(p.ip.is_none(), "v2-only Proposal has no IP area");
    assert!(p.offers_v2_r() && !p.offers_v1_r());
    assert_eq!(p.smcd, Some(Default::default()));
    let e = p.v2_ext.unwrap();
    assert_eq!(e.eids, vec![eid()]);
    assert_eq!(e.ism_gid_cnt, 0);
    assert_eq!(e.release, 1);
    assert!(!e.seid);
    assert_eq!(e.roce_gid, ip([192, 168, 77, 3]));
    assert_eq!((e.max_conns, e.max_links, e.feature_mask), (255, 2, 1));
    assert!(e.smcd_v2_ext.is_empty());
}

#[test]
fn accept_v2_frame_8_smc_clc_1() {
    let w = payload(8);
    assert_eq!(w.len(), 160);
    let ClcMessage::Accept(a) = round_trip(8, &w) else {
        panic!("not an Accept")
    };
    assert_eq!(a.version, 2);
    assert!(a.first_contact);
    assert_eq!(a.peer_id.0, [0x41, 0x95, 0x52, 0x54, 0x00, 0x77, 0x00, 0x02]);
    assert_eq!(a.gid, ip([192, 168, 77, 2]));
    assert_eq!(a.mac, [0x52, 0x54, 0x00, 0x77, 0x00, 0x02]);
    assert_eq!(a.qpn, 0x13);
    assert_eq!(a.rmb_rkey, 0x7ff);
    assert_eq!(a.rmbe_idx, 1);
    assert_eq!(a.rmbe_alert_token, 3);
    assert_eq!((a.rmbe_size, a.qp_mtu), (2, 3));
    assert_eq!(a.rmbe_bytes(), 65536);
    assert_eq!(a.qp_mtu_bytes(), Some(1024));
    assert_eq!(a.rmb_vaddr, 0xff25_e247_ff5b_0000);
    assert_eq!(a.psn, 0x789f86);
    a.check_enums().unwrap();
    let v2 = a.v2.unwrap();
    assert_eq!(v2.eid, eid());
    let f = v2.fce.unwrap();
    assert!(f.v2_direct);
    assert_eq!((f.os_type, f.release), (2, 1));
    assert_eq!(f.hostname, host());
    let x = f.v2x.unwrap();
    assert_eq!(
        (x.max_conns, x.max_links, x.feature_mask, x.vendor_exp_options),
        (255, 2, 1, 0)
    );
    assert!(v2.gid_list.is_none());
}

#[test]
fn confirm_v2_frame_10_smc_clc_1() {
    let w = payload(10);
    assert_eq!(w.len(), 180);
    let ClcMessage::Confirm(c) = round_trip(10, &w) else {
        panic!("not a Confirm")
    };
    assert_eq!(c.version, 2);
    assert!(c.first_contact);
    assert_eq!(c.peer_id.0, [0x6b, 0x24, 0x52, 0x54, 0x00, 0x77, 0x00, 0x03]);
    assert_eq!(c.gid, ip([192, 168, 77, 3]));
    assert_eq!(c.qpn, 0x11);
    assert_eq!(c.rmb_rkey, 0x395);
    assert_eq!((c.rmbe_idx, c.rmbe_alert_token), (1, 1));
    assert_eq!(c.rmb_vaddr, 0xff1e_2107_81d1_0000);
    assert_eq!(c.psn, 0x028aa5);
    let v2 = c.v2.unwrap();
    assert_eq!(v2.gid_list, Some(vec![ip([192, 168, 77, 3])]));
    assert_eq!(v2.fce.unwrap().hostname, host());
}

#[test]
fn diagnosis_codes_are_described_a1_6() {
    assert_eq!(Diagnosis::PEER_NO_SMC.describe(), "peer did not indicate SMC");
    assert_eq!(Diagnosis::VERSION_MISMATCH.0, 0x030c_0000);
    assert_eq!(Diagnosis(0x1234).describe(), "unknown diagnosis code");
}

/// The handshake machine, given the capture's local values, sends exactly Linux 6.12's
/// Proposal, Accept and Confirm (frames 6, 8, 10) — so a Linux peer sees the same octets
/// from us as from itself.
#[test]
fn machine_emits_the_captured_v2_handshake_byte_for_byte() {
    use smc::clc_machine::{ClcMachine, LinkParams, LocalCaps, NeedLink, Outcome};
    let caps = |last: u8, peer_id: [u8; 8]| LocalCaps {
        enabled: true,
        v1: false,
        v2: true,
        peer_id: PeerId(peer_id),
        gid: ip([192, 168, 77, last]),
        mac: [0x52, 0x54, 0x00, 0x77, 0x00, last],
        ipv4: Some(([192, 168, 77, last].into(), 24)),
        ipv6: None,
        eids: vec![eid()],
        hostname: host(),
        max_conns: 255,
        max_links: 2,
    };
    let mut c = ClcMachine::client(caps(3, [0x6b, 0x24, 0x52, 0x54, 0x00, 0x77, 0x00, 0x03]), true);
    let mut s = ClcMachine::server(caps(2, [0x41, 0x95, 0x52, 0x54, 0x00, 0x77, 0x00, 0x02]), true);
    let p = c.take_output();
    assert_eq!(p, payload(6), "Proposal");
    s.on_bytes(&p);
    assert!(matches!(s.outcome(), Outcome::NeedLink(n) if matches!(**n, NeedLink::Proposal { version: 2, .. })));
    let sp = LinkParams {
        qpn: 0x13,
        rmb_rkey: 0x7ff,
        rmbe_idx: 1,
        alert_token: 3,
        rmbe_size: 2,
        qp_mtu: 3,
        rmb_vaddr: 0xff25_e247_ff5b_0000,
        psn: 0x789f86,
    };
    s.accept(&sp, true).unwrap();
    let a = s.take_output();
    assert_eq!(a, payload(8), "Accept");
    c.on_bytes(&a);
    let cp = LinkParams {
        qpn: 0x11,
        rmb_rkey: 0x395,
        rmbe_idx: 1,
        alert_token: 1,
        rmbe_size: 2,
        qp_mtu: 3,
        rmb_vaddr: 0xff1e_2107_81d1_0000,
        psn: 0x028aa5,
    };
    c.confirm(&cp).unwrap();
    let cf = c.take_output();
    assert_eq!(cf, payload(10), "Confirm");
    s.on_bytes(&cf);
    assert!(matches!(s.outcome(), Outcome::Proceed(x) if x.qpn == 0x11));
}

/// The LLC message inside a captured RoCEv2 SEND ONLY (BTH 12 octets, ICRC 4).
fn llc_of(no: usize) -> (Vec<u8>, LlcMessage) {
    let p = payload(no);
    assert_eq!(p[0], 0x04, "frame {no}: RC SEND ONLY");
    let w = p[12..p.len() - 4].to_vec();
    let m = LlcMessage::parse(&w).unwrap_or_else(|e| panic!("frame {no}: {e}"));
    assert_eq!(m.version, LlcVersion::V2, "frame {no}");
    assert_eq!(m.to_vec().unwrap(), w, "frame {no}: emit differs");
    (w, m)
}

#[test]
fn confirm_link_v2_frames_11_13_a1_8() {
    let (w, m) = llc_of(11);
    assert_eq!(&w[..4], &[0x21, 0x2c, 0x00, 0x03], "v2 type, little-endian length 44");
    assert!(!m.reply);
    let LlcBody::ConfirmLink(c) = m.body else { panic!() };
    assert_eq!(c.flags, llc::CONFIRM_LINK_NO_RMBE_EYECATCHER);
    assert_eq!(c.mac, [0x52, 0x54, 0x00, 0x77, 0x00, 0x02]);
    assert_eq!(c.gid, ip([192, 168, 77, 2]));
    assert_eq!((c.qpn, c.link_num, c.link_uid), (0x13, 1, [0, 0, 3, 1]));
    assert_eq!((c.max_links, c.max_conns), (2, 255));
    let (_, m) = llc_of(13);
    assert!(m.reply);
    let LlcBody::ConfirmLink(c) = m.body else { panic!() };
    assert_eq!((c.qpn, c.link_num, c.link_uid, c.flags), (0x11, 1, [0, 0, 1, 1], 0x03));
    assert_eq!(c.gid, ip([192, 168, 77, 3]));
}

#[test]
fn add_link_v2_frames_15_17_a1_8_e_1() {
    let (w, m) = llc_of(15);
    assert_eq!(w.len(), 88);
    assert_eq!(&w[..4], &[0x22, 0x58, 0x00, 0x00], "length 88, little-endian");
    assert!(!m.reply);
    let LlcBody::AddLink(a) = m.body else { panic!() };
    assert!(!a.reject);
    assert_eq!(a.mac, [0x52, 0x54, 0x00, 0x77, 0x00, 0x02]);
    assert_eq!(a.gid, ip([192, 168, 77, 2]), "Linux layout: GID at 12 (E-1)");
    assert_eq!((a.qpn, a.link_num, a.qp_mtu, a.psn), (0x14, 2, 3, 0x53f30e));
    let x = a.v2_ext.unwrap();
    assert!(x.v2_direct);
    assert_eq!(x.client_target_gid, ip([192, 168, 77, 2]));
    assert_eq!(x.rtokens.len(), 1, "count 01 00: little-endian");
    assert_eq!((x.rtokens[0].ref_rkey, x.rtokens[0].new_rkey), (0x7ff, 0x9d5));
    assert_eq!(x.rtokens[0].new_vaddr, 0xff25_e247_ff5b_0000);
    // The client rejects (single RNIC): reply + Z, no room for the reason in v2.
    let (w, m) = llc_of(17);
    assert_eq!(&w[..4], &[0x22, 0x2c, 0x00, 0xc0]);
    assert!(m.reply);
    let LlcBody::AddLink(a) = m.body else { panic!() };
    assert!(a.reject && a.v2_ext.is_none());
    assert_eq!(a.reject_reason, 0);
}

#[test]
fn delete_rkey_v2_frames_80_85_a1_8() {
    for (no, reply, rkey) in [(80, false, 0x395), (81, false, 0x7ff), (84, true, 0), (85, true, 0)] {
        let (_, m) = llc_of(no);
        assert_eq!(m.reply, reply, "frame {no}");
        let LlcBody::DeleteRkey(d) = m.body else {
            panic!("frame {no}")
        };
        assert_eq!((d.negative, d.err_mask, d.rkeys), (false, 0, vec![rkey]), "frame {no}");
    }
}
