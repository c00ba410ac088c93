//! Issue 13's Write 1 MiB point, guarded by counting copies instead of timing: each payload
//! octet of an RC Send, RDMA Write and RDMA Read response is copied once in user space at
//! most, on the receiving side (datagram buffer to registered memory). On the sending side
//! the engine builds only headers and hands the payload to `sendmmsg` as iovecs into the
//! registered memory (the kernel's copy into its skbs is the only one), as TCP's two copies
//! per byte (one per side). Session 11 counted four copies per octet: MR to a scratch
//! buffer, scratch to the packet, the kernel's, and packet to MR.
//!
//! Also checked: a retransmission reads the memory again (what the requester sends after a
//! lost packet is the region's content; the 1 GiB fault runs of tests/faults.rs hash it),
//! and the receiving side's ICRC check passes on every packet (`icrc_err` stays 0).
//!
//! C3 of ../shared/requirements/smcr-ipoibcm.md (RC Send, RDMA Write, RDMA Read, "4-byte
//! ICRC trailer").

use std::time::Duration;
use verbs::*;

#[path = "common/pair.rs"]
mod pair;
use pair::{End, PairOpts, counter as c, rc_pair};

const LEN: usize = 1 << 20;

fn pair(a: &str, b: &str) -> (End, End) {
    rc_pair(
        a,
        b,
        &PairOpts {
            cq_depth: 64,
            mr_len: LEN,
            psn: 5,
            timeout: 18,
            dev_opts: &[],
        },
    )
}

fn wait(e: &End) -> WorkCompletion {
    let wc =
        e.cq.wait_spin(Duration::from_micros(50), Some(Duration::from_secs(20)))
            .expect("a completion within 20 s");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    wc
}

/// Posts on `a` an RDMA Write or Read (`op` of the remote address) of `LEN` octets between the
/// start of `a`'s region and the start of `b`'s.
fn post_rdma(a: &End, b: &End, wr_id: u64, op: impl FnOnce(RemoteAddr) -> WrOpcode) {
    let remote = RemoteAddr {
        addr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    a.qp.post_send(&[SendWr::new(wr_id, op(remote), vec![a.mr.sge(0, LEN as u32)])])
        .unwrap();
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn each_payload_octet_is_copied_once_in_user_space() {
    let (a, b) = pair("127.0.93.1", "127.0.93.2");
    // RDMA Write of 1 MiB (256 packets at MTU 4096): a to b.
    a.mr.write(0, &pattern(1)).unwrap();
    post_rdma(&a, &b, 1, |remote| WrOpcode::RdmaWrite { remote });
    wait(&a);
    let mut got = vec![0u8; LEN];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == pattern(1), "the Write's data arrived intact");

    // Send of 64 KiB: b to a.
    a.qp.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: vec![a.mr.sge(0, 65536)],
    }])
    .unwrap();
    b.mr.write(0, &pattern(2)[..65536]).unwrap();
    b.qp.post_send(&[SendWr::new(3, WrOpcode::Send, vec![b.mr.sge(0, 65536)])])
        .unwrap();
    let wc = wait(&a);
    assert_eq!(wc.byte_len, 65536);
    wait(&b);

    // RDMA Read of 1 MiB: a reads b (Read responses from b's memory).
    b.mr.write(0, &pattern(3)).unwrap();
    post_rdma(&a, &b, 4, |remote| WrOpcode::RdmaRead { remote });
    wait(&a);
    a.mr.read(0, &mut got).unwrap();
    assert!(got == pattern(3), "the Read's data arrived intact");

    let moved = (2 * LEN + 65536) as u64;
    let by_ref = c(&a.dev, "tx_payload_by_ref") + c(&b.dev, "tx_payload_by_ref");
    let tx_copied = c(&a.dev, "tx_payload_copied") + c(&b.dev, "tx_payload_copied");
    let rx_copied = c(&a.dev, "rx_payload_copied") + c(&b.dev, "rx_payload_copied");
    eprintln!("payload {moved}: sent by reference {by_ref}, copied on send {tx_copied}, copied on receive {rx_copied}");
    assert_eq!(tx_copied, 0, "no payload octet copied in user space before sendmmsg");
    // Retransmissions (a descheduled end on a loaded machine) send octets again, by
    // reference too.
    assert!(by_ref >= moved, "every payload octet went to the kernel by reference");
    // Duplicates are re-ACKed or ignored, never placed twice.
    assert_eq!(rx_copied, moved, "every payload octet copied once into memory");
    assert_eq!(c(&a.dev, "icrc_err") + c(&b.dev, "icrc_err"), 0);
}

/// One ICRC pass per packet on each side of a bulk Write, counted by the engine
/// (`icrc_rx_octets`, `icrc_tx_octets`: octets the passes covered): the first packet of a
/// GRO train used to be checked twice (once to tell whose train it is, once as a packet of
/// it); and the ACKs of the responder stay below one per received datagram plus one per 64
/// packets (the window's ACK clock), whatever the scheduling. Session 13 (rocebw); C3 of
/// ../shared/requirements/smcr-ipoibcm.md ("4-byte ICRC trailer", RC ACK coalescing).
#[test]
fn each_packet_is_crc_checked_once_and_acks_are_coalesced() {
    const MSGS: u64 = 4;
    let (a, b) = pair("127.0.93.11", "127.0.93.12");
    a.mr.write(0, &pattern(7)).unwrap();
    for i in 0..MSGS {
        post_rdma(&a, &b, i, |remote| WrOpcode::RdmaWrite { remote });
    }
    for _ in 0..MSGS {
        wait(&a);
    }
    let mut got = vec![0u8; LEN];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == pattern(7), "the Writes' data arrived intact");

    // MTU 4096: 256 packets per MiB of 12 (BTH) + 4096 + 4 (ICRC) octets, the first of each
    // message 16 more (RETH).
    const MAX_PKT: u64 = 12 + 16 + 4096 + 4;
    let (rx_pkts, rx_crc) = (c(&b.dev, "rcvd_pkts"), c(&b.dev, "icrc_rx_octets"));
    let (tx_pkts, tx_crc) = (c(&a.dev, "sent_pkts"), c(&a.dev, "icrc_tx_octets"));
    let payload = MSGS * LEN as u64;
    eprintln!(
        "{MSGS} MiB: responder {rx_pkts} packets, {rx_crc} octets CRCed on receive ({:.4} per payload octet); requester {tx_pkts} packets, {tx_crc} octets CRCed on send ({:.4})",
        rx_crc as f64 / payload as f64,
        tx_crc as f64 / payload as f64
    );
    assert!(rx_pkts >= MSGS * 256 && tx_pkts >= MSGS * 256);
    assert!(rx_crc >= payload && tx_crc >= payload, "every packet's ICRC computed");
    assert!(
        rx_crc <= rx_pkts * MAX_PKT,
        "one ICRC pass per received packet: {rx_crc} octets for {rx_pkts} packets"
    );
    // A single datagram (the end of a window that was one packet past a whole train) may
    // spend one pass on a wrong IPv4 ID guess: at most one per datagram, never per packet.
    let retries = c(&b.dev, "icrc_rx_id_retries");
    assert!(retries <= c(&b.dev, "rx_datagrams"), "{retries} ID retries");
    assert!(
        tx_crc <= tx_pkts * MAX_PKT,
        "one ICRC pass per sent packet: {tx_crc} octets for {tx_pkts} packets"
    );
    // ACKs (the responder sends nothing else here): bounded by what the engine decides per
    // datagram drained and per 64 packets, never one per packet.
    let (acks, datagrams) = (c(&b.dev, "sent_pkts"), c(&b.dev, "rx_datagrams"));
    eprintln!("responder: {datagrams} datagrams received, {acks} ACKs sent");
    assert!(
        acks <= datagrams + rx_pkts / 64 + MSGS,
        "{acks} ACKs for {datagrams} datagrams and {rx_pkts} packets"
    );
    assert_eq!(c(&a.dev, "icrc_err") + c(&b.dev, "icrc_err"), 0);
}
