//! Issue 13's benchmark points, guarded by counting instead of timing: the RoCEv2 data path
//! is bounded by the datagrams it pushes through the kernel (about 5 µs of CPU each for both
//! ends on loopback), so what must not regress is how many packets share one datagram (a
//! UDP GSO train, `UDP_SEGMENT`) and one system call (`sendmmsg`, `recvmmsg` with
//! `UDP_GRO`). Before the trains every packet was its own datagram. The counts do not
//! depend on timing or load: a whole message is built in `post_send`, and a window of 256
//! packets holds a 1 MiB Write at MTU 4096. Every packet's ICRC is still checked
//! (`icrc_err` stays 0, C3 "4-byte ICRC trailer" in ../shared/requirements/smcr-ipoibcm.md)
//! and the data arrives intact.
//!
//! Also the default port MTU: a device on loopback gets 4096 (the interface allows it,
//! as rxe derives its active MTU from its netdev's).

use std::time::Duration;
use verbs::*;

#[path = "common/pair.rs"]
mod pair;
use pair::{End, PairOpts, counter as c, rc_pair};

fn pair(a: &str, b: &str, icrc_rx: &str) -> (End, End) {
    rc_pair(
        a,
        b,
        &PairOpts {
            cq_depth: 4096,
            mr_len: 1 << 20,
            psn: 7,
            timeout: 14,
            dev_opts: &[("icrc_rx", icrc_rx)],
        },
    )
}

fn wait_n(cq: &CompletionQueue, n: usize) {
    for _ in 0..n {
        let wc = cq.wait(Some(Duration::from_secs(20))).expect("completion");
        assert_eq!(wc.status, WcStatus::Success);
    }
}

fn run(a: &str, b: &str, icrc_rx: &str) {
    let (x, y) = pair(a, b, icrc_rx);
    let remote = RemoteAddr {
        addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    x.mr.write(0, &data).unwrap();

    // 1 MiB Write: 256 packets of 4 KiB; FIRST (with RETH) alone, then trains of MIDDLEs.
    let (s0, d0, c0) = (
        c(&x.dev, "sent_pkts"),
        c(&x.dev, "tx_datagrams"),
        c(&x.dev, "tx_syscalls"),
    );
    let (r0, g0) = (c(&y.dev, "rcvd_pkts"), c(&y.dev, "rx_datagrams"));
    x.qp.post_send_one(SendWr::new(
        1,
        WrOpcode::RdmaWrite { remote },
        vec![x.mr.sge(0, 1 << 20)],
    ))
    .unwrap();
    wait_n(&x.cq, 1);
    let mut got = vec![0u8; 1 << 20];
    y.mr.read(0, &mut got).unwrap();
    assert!(got == data, "1 MiB arrived intact");
    let (pkts, dgrams, calls) = (
        c(&x.dev, "sent_pkts") - s0,
        c(&x.dev, "tx_datagrams") - d0,
        c(&x.dev, "tx_syscalls") - c0,
    );
    assert!(pkts >= 256, "{pkts} packets sent");
    assert!(
        dgrams * 8 <= pkts,
        "1 MiB Write: {pkts} packets in {dgrams} datagrams (GSO trains)"
    );
    assert!(
        calls * 16 <= pkts,
        "1 MiB Write: {pkts} packets in {calls} sendmmsg calls"
    );
    let (rp, rd) = (c(&y.dev, "rcvd_pkts") - r0, c(&y.dev, "rx_datagrams") - g0);
    assert!(
        rp >= 256 && rd * 8 <= rp,
        "1 MiB Write: {rp} packets received in {rd} datagrams (UDP_GRO)"
    );

    // 64 Writes of 64 B in one post_send: equal-size packets, trains of up to 32.
    let (s0, d0) = (c(&x.dev, "sent_pkts"), c(&x.dev, "tx_datagrams"));
    let wrs: Vec<SendWr> = (0..64u64)
        .map(|i| {
            let remote = RemoteAddr {
                addr: y.mr.addr() + i * 64,
                rkey: y.mr.rkey(),
            };
            SendWr::new(
                10 + i,
                WrOpcode::RdmaWrite { remote },
                vec![x.mr.sge((i * 64) as usize, 64)],
            )
        })
        .collect();
    x.qp.post_send(&wrs).unwrap();
    wait_n(&x.cq, 64);
    let (pkts, dgrams) = (c(&x.dev, "sent_pkts") - s0, c(&x.dev, "tx_datagrams") - d0);
    assert!(
        pkts >= 64 && dgrams * 8 <= pkts,
        "64 B Writes: {pkts} packets in {dgrams} datagrams"
    );

    for d in [&x.dev, &y.dev] {
        assert_eq!(
            c(d, "icrc_err"),
            0,
            "every packet's ICRC verified with the ID it carries"
        );
        assert_eq!(c(d, "malformed_pkts"), 0);
    }
}

/// Trains through the UDP socket (the IPv4 ID of packet k of a train is k).
#[test]
fn writes_go_in_gso_trains_udp_path_c3() {
    run("127.77.13.1", "127.77.13.2", "udp");
}

/// The same with the raw socket open (CAP_NET_RAW; `auto` falls back to the UDP path
/// without it): what arrives on loopback is the UDP socket's, so trains stay whole.
#[test]
fn writes_go_in_gso_trains_auto_c3() {
    run("127.77.13.3", "127.77.13.4", "auto");
}
