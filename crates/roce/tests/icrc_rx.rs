//! The IPv4 ICRC on receive (issue 13, "ICRC exactly as rxe computes it"; C3 "4-byte ICRC
//! trailer" in ../shared/requirements/smcr-ipoibcm.md; IBA annex A17 §A17.3.3): rxe's ICRC covers
//! the IP Identification, and rxe sends hashed non-zero IDs. A packet built like rxe's (ID
//! 0xece3, DF) with its correct ICRC is accepted by a device that receives through its raw
//! socket (`icrc_rx=raw`, checked against the header received) and by one that receives
//! through its UDP socket (`icrc_rx=udp`, the ID solved for from the ICRC); a corrupted one is
//! dropped and counted by both.
//! Needs CAP_NET_RAW to build the packet; skipped (with a message) without it.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use roce::wire::{Bth, ExtHeaders, Opcode, Psn};
use verbs::*;

#[path = "common/gsi.rs"]
mod gsi;

fn rxe_like_send(src: Ipv4Addr, dst: Ipv4Addr, dest_qp: u32, psn: u32, payload: &[u8]) -> Vec<u8> {
    let mut bth = Bth::new(Opcode::RC_SEND_ONLY, dest_qp, Psn::new(psn));
    bth.ack_req = true;
    let mut roce = gsi::packet(bth, ExtHeaders::default(), payload);
    let (ip, udp) = gsi::seal_ipv4(&mut roce, src, dst, 0xece3, 0xc0de);
    [&ip[..], &udp[..], &roce[..]].concat()
}

fn device(addr: &str, icrc_rx: &str) -> (Device, ProtectionDomain, CompletionQueue, QueuePair) {
    let dev = roce::RoceFactory
        .open(&DeviceOptions::new().with("addr", addr).with("icrc_rx", icrc_rx))
        .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
    qp.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
    qp.modify_qp(&QpAttr::rtr(RtrAttr {
        // Nobody listens at the peer address: the ACK is lost, which does not matter here.
        ah_attr: AhAttr::to_gid(Gid::from_ip("127.78.5.9".parse().unwrap())),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: 0x42,
        rq_psn: 1000,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
    }))
    .unwrap();
    (dev, pd, cq, qp)
}

#[test]
fn rxe_ip_id_checked_through_the_raw_socket_c3_icrc() {
    let raw = match socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::UDP)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: no raw socket ({e})");
            return;
        }
    };
    raw.set_header_included_v4(true).unwrap();
    let src: Ipv4Addr = "127.78.5.9".parse().unwrap();
    for (addr, mode) in [("127.78.5.1", "raw"), ("127.78.5.2", "udp")] {
        let (dev, pd, cq, qp) = device(addr, mode);
        let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
        qp.post_recv(&[RecvWr {
            wr_id: 5,
            sg_list: vec![mr.sge(0, 64)],
        }])
        .unwrap();
        let dst: Ipv4Addr = addr.parse().unwrap();
        let d = rxe_like_send(src, dst, qp.qp_num(), 1000, b"hello from rxe");
        let mut bad = d.clone();
        let n = bad.len();
        bad[n - 8] ^= 0x01; // a payload octet
        raw.send_to(&bad, &SocketAddr::new(dst.into(), 0).into()).unwrap();
        let wc = cq.wait(Some(Duration::from_millis(300)));
        assert!(wc.is_none(), "{mode}: a corrupted packet was accepted: {wc:?}");
        assert_eq!(dev.hw_counter("icrc_err"), Some(1), "{mode}");
        raw.send_to(&d, &SocketAddr::new(dst.into(), 0).into()).unwrap();
        let wc = cq
            .wait(Some(Duration::from_millis(5000)))
            .unwrap_or_else(|| panic!("{mode}: the packet with ID 0xece3 is accepted"));
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (5, WcStatus::Success, 14));
        assert_eq!(mr.to_vec(0, 14).unwrap(), b"hello from rxe");
        assert_eq!(dev.hw_counter("icrc_err"), Some(1), "{mode}");
    }
}
