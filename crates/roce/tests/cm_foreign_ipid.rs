//! A REQ the way rxe sends it: IPv4 with DF and a hashed, non-zero Identification that the
//! ICRC covers (lab capture `host-br0-roce-cm.pcap`: IDs 0x3403, 0x342e, ...). A UDP socket
//! does not show the ID, so the device must solve for it (`wire::icrc::verify_any_ipv4_id`)
//! or drop every packet rxe sends. The REQ goes out of a raw socket (IP_HDRINCL, root) to a
//! `roce` device on 127.81.0.2 for a port nobody listens on; its CM must answer REJ 8 to
//! 127.81.0.1:4791. Without root the test says why it skips and passes.
//!
//! Requirement IDs: `../shared/requirements/smcr-ipoibcm.md` C3 (ICRC), C1.6 (REJ 8).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use roce::cm::mad::{CmMsg, Mad, RejReason};
use roce::wire::Packet;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use verbs::{DeviceFactory, DeviceOptions};

#[path = "common/gsi.rs"]
mod gsi;

const US: Ipv4Addr = Ipv4Addr::new(127, 81, 0, 1);
const DEV: Ipv4Addr = Ipv4Addr::new(127, 81, 0, 2);

/// The UDP payload (BTH, DETH, MAD, ICRC) of a REQ from `US` to `DEV`'s port 9, sealed for
/// IPv4 Identification `id`.
fn req_packet(id: u16) -> Vec<u8> {
    let mad = gsi::rdma_cm_req(0x0253_6f66_7f51_0001, US, DEV, 9);
    let mut bth = gsi::gsi_bth(0x0618bf3);
    bth.ack_req = true;
    let mut buf = gsi::ud_packet(bth, roce::gsi::GSI_QKEY, &mad);
    // rxe's source port is 0xC000 | hash; any port works.
    let (ip, udp) = gsi::seal_ipv4(&mut buf, US, DEV, id, 55410);
    [&ip[..], &udp[..], &buf[..]].concat()
}

/// C3, C1.6: a REQ with IPv4 ID 0x3403 (as rxe sends) passes the device's ICRC check and
/// gets REJ 8; one whose ICRC is wrong for every ID is dropped silently.
#[test]
fn req_with_rxe_style_ipv4_id_is_answered() {
    let raw = match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED req_with_rxe_style_ipv4_id_is_answered: no raw socket ({e}); needs root");
            return;
        }
    };
    raw.set_header_included_v4(true).unwrap();
    let peer = UdpSocket::bind((US, 4791)).unwrap();
    peer.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let opts = DeviceOptions::new()
        .with("addr", DEV.to_string())
        .with("name", "rxe_ipid")
        // The UDP receive path, where the ID is solved for (as root, `auto` would take the
        // raw socket, which sees the ID).
        .with("icrc_rx", "udp");
    let _dev = roce::RoceFactory.open(&opts).unwrap();
    let to = SockAddr::from(SocketAddr::new(DEV.into(), 4791));

    // Corrupted: no ID makes the ICRC match, so no answer.
    let mut bad = req_packet(0x3403);
    let n = bad.len();
    bad[n - 100] ^= 0x01;
    raw.send_to(&bad, &to).unwrap();
    let mut buf = [0u8; 512];
    assert!(peer.recv_from(&mut buf).is_err(), "a corrupted REQ was answered");

    // rxe-style: ID 0x3403, sealed for it. Sent a few times in case the first is lost.
    let good = req_packet(0x3403);
    let mut answered = None;
    for _ in 0..10 {
        raw.send_to(&good, &to).unwrap();
        if let Ok((n, from)) = peer.recv_from(&mut buf) {
            answered = Some((buf[..n].to_vec(), from));
            break;
        }
    }
    let (reply, from) = answered.expect("the device answered the REQ");
    assert_eq!(from, SocketAddr::new(DEV.into(), 4791));
    let p = Packet::parse(&reply).unwrap();
    assert_eq!(p.bth.dest_qp, 1);
    let mad = Mad::parse(p.payload).unwrap();
    match mad.msg {
        CmMsg::Rej(rej) => assert_eq!(rej.reason, RejReason::InvalidServiceId),
        other => panic!("expected REJ 8, got {other:?}"),
    }
}
