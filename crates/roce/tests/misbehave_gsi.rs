//! A scripted misbehaving peer against the GSI (QP1) of a real RoCEv2 device: a plain UDP
//! socket on 127.141.0.2:4791 sends CM MADs built with our own encoders (`cm::Cm`, BTH +
//! DETH, ICRC sealed as rxe computes it, IPv4 ID 0) to a device on 127.141.0.1.
//!
//! A UD packet to QP1 must carry the GSI's well-known Q_Key 0x80010000 (IBA vol. 1 ch. 13,
//! GSI; the Q_Key check of header validation, §9.6.1): with another Q_Key it is dropped
//! silently and counted (`malformed_pkts`), and the CM never sees the MAD. The same REQ with
//! the right Q_Key reaches the CM, which answers REJ 8 (invalid service ID: nobody listens
//! on the port), so the silence is the Q_Key check's doing and not the CM's.
//!
//! Requirement IDs: `../shared/requirements/smcr-ipoibcm.md` C3 (RoCE header checks), C1.6
//! (REJ 8); issue 13 "what must hold" 3 (wrong Q_Key).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use roce::cm::mad::{CmMsg, Mad, RejReason};
use roce::wire::Packet;
use verbs::{DeviceFactory, DeviceOptions};

#[path = "common/gsi.rs"]
mod gsi;

const DEV: Ipv4Addr = Ipv4Addr::new(127, 141, 0, 1);
const US: Ipv4Addr = Ipv4Addr::new(127, 141, 0, 2);

/// A REQ for `DEV`'s port 9 (nobody listens) from QP1 with Q_Key `q_key` and P_Key
/// `p_key`, as the UDP payload (BTH, DETH, MAD, ICRC) sealed for IPv4 ID 0.
fn req(q_key: u32, p_key: u16) -> Vec<u8> {
    let mad = gsi::rdma_cm_req(0x0253_6f66_7f51_0141, US, DEV, 9);
    let mut bth = gsi::gsi_bth(0x10);
    bth.p_key = p_key;
    let mut buf = gsi::ud_packet(bth, q_key, &mad);
    gsi::seal_ipv4(&mut buf, US, DEV, 0, 4791);
    buf
}

/// The CM message of the next packet from the device within `wait`, if any.
fn answer(sock: &UdpSocket, wait: Duration) -> Option<CmMsg> {
    let t0 = Instant::now();
    let mut buf = [0u8; 2048];
    while t0.elapsed() < wait {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        assert_eq!(from, SocketAddr::new(DEV.into(), 4791));
        let p = Packet::parse(&buf[..n]).expect("the device sends well-formed packets");
        assert_eq!(p.bth.dest_qp, 1);
        assert_eq!(p.ext.deth.map(|d| d.q_key), Some(roce::gsi::GSI_QKEY));
        return Some(Mad::parse(p.payload).expect("a CM MAD").msg);
    }
    None
}

/// C3, C1.6, IBA vol. 1 §9.6.1 / ch. 13: a REQ to QP1 with a wrong Q_Key is dropped without an
/// answer and counted; the CM never sees it. With the GSI Q_Key, the same REQ gets REJ 8.
#[test]
fn wrong_q_key_on_qp1_is_dropped_counted_and_never_reaches_the_cm_c3() {
    let sock = UdpSocket::bind((US, 4791)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let opts = DeviceOptions::new()
        .with("addr", DEV)
        .with("name", "rxe_qkey")
        // Our socket sends with IPv4 ID 0, which this receive mode assumes.
        .with("icrc_rx", "udp");
    let dev = roce::RoceFactory.open(&opts).unwrap();
    let malformed = || dev.hw_counter("malformed_pkts").unwrap();
    assert_eq!(malformed(), 0);
    let to = SocketAddr::new(DEV.into(), 4791);

    for (n, bad) in [0u32, 0x8001_0001, 0x0001_0000, roce::gsi::GSI_QKEY ^ 0x8000_0000]
        .into_iter()
        .enumerate()
    {
        sock.send_to(&req(bad, 0xffff), to).unwrap();
        // The CM answers a REQ within a millisecond on loopback; 300 ms of silence is no
        // answer (and the CM's REJ, had it seen the REQ, would come at once).
        assert_eq!(
            answer(&sock, Duration::from_millis(300)),
            None,
            "Q_Key {bad:#x} answered"
        );
        assert_eq!(malformed(), n as u64 + 1, "Q_Key {bad:#x} counted");
    }

    // The same REQ with the GSI Q_Key reaches the CM: REJ 8.
    let mut got = None;
    for _ in 0..5 {
        sock.send_to(&req(roce::gsi::GSI_QKEY, 0xffff), to).unwrap();
        got = answer(&sock, Duration::from_millis(500));
        if got.is_some() {
            break;
        }
    }
    match got {
        Some(CmMsg::Rej(rej)) => assert_eq!(rej.reason, RejReason::InvalidServiceId),
        other => panic!("expected REJ 8 for the right Q_Key, got {other:?}"),
    }
    assert_eq!(malformed(), 4, "the right Q_Key is not counted");
}
