//! Issue 16: checksum offload between the kernel and the link, counted (not timed). A
//! [`KernelIo`] with offload stands in for a TUN opened with `IFF_VNET_HDR` and
//! `TUN_F_CSUM`: node A reads UDP packets of 65,520 octets whose checksum is partial (the
//! `virtio_net_hdr` says `NEEDS_CSUM`, the field holds the pseudo-header sum), node B
//! writes what it receives into another.
//!
//! - Both offer the extension: every packet leaves A partial (no checksum pass in A) and
//!   reaches B's kernel marked partial with the same offsets; completing it as B's kernel
//!   would gives the right UDP checksum. A packet whose checksum the kernel completed goes
//!   in the pseudo-header form and arrives partial too; an ICMP packet is left alone.
//! - B does not offer it (a Linux-like peer): A fills every checksum in before the packet
//!   leaves and B's kernel gets packets whose checksum verifies.
//! - The first packet, which waits for resolution and the connection, is filled in too.
//! - A GSO packet (TSO is not enabled) or offsets outside the packet are dropped, counted.
//!
//! Loopback devices 127.117.41.1-6 (unique to this file), P_Keys 0x8042-0x8044.
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` C2 (connected mode carries
//! 65,520-octet packets), IPCM-14 (the extension lies after the 8 octets, which keep
//! their layout), IPCM-17 (reserved octet of the private data still 0).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ipoib::link::Mode;
use ipoib::node::{KernelIo, Node, RxCsum};
use ipoib::wire::offload::{VnetHdr, fill_checksum, ones_sum};
use verbs::MemoryRegion;

mod common;
use common::{dev_mtu, established, ip4, node, v4};

/// A TUN with or without offload: reads hand out (header, packet), writes are kept with
/// their checksum state.
#[derive(Default)]
struct FakeTun {
    offload: bool,
    to_read: VecDeque<(VnetHdr, Vec<u8>)>,
    reads: u64,
    written: Vec<(Vec<u8>, RxCsum)>,
}

impl KernelIo for FakeTun {
    fn read_packet(&mut self, mr: &MemoryRegion, off: usize, max: usize) -> std::io::Result<Option<usize>> {
        let Some((h, p)) = self.to_read.pop_front() else {
            return Ok(None);
        };
        self.reads += 1;
        let mut b = Vec::new();
        if self.offload {
            b.extend_from_slice(&h.to_bytes());
        }
        b.extend_from_slice(&p);
        assert!(b.len() <= max);
        mr.write(off, &b).expect("in the region");
        Ok(Some(b.len()))
    }
    fn write_packet(&mut self, pkt: &[u8]) {
        self.written.push((pkt.to_vec(), RxCsum::Unchecked));
    }
    fn offload(&self) -> bool {
        self.offload
    }
    fn write_packet_csum(&mut self, pkt: &[u8], csum: RxCsum) {
        assert!(self.offload, "a partial checksum for a kernel side without offload");
        self.written.push((pkt.to_vec(), csum));
    }
}

/// The pseudo-header sum of a UDP/IPv4 packet (what a kernel with `TUN_F_CSUM` leaves in
/// the checksum field).
fn pseudo(p: &[u8]) -> u16 {
    let mut ph = Vec::new();
    ph.extend_from_slice(&p[12..20]);
    ph.extend_from_slice(&[0, 17]);
    ph.extend_from_slice(&((p.len() - 20) as u16).to_be_bytes());
    ones_sum(&ph)
}

/// Whether a UDP/IPv4 packet's checksum verifies.
fn udp_ok(p: &[u8]) -> bool {
    let mut ph = Vec::new();
    ph.extend_from_slice(&p[12..20]);
    ph.extend_from_slice(&[0, 17]);
    ph.extend_from_slice(&((p.len() - 20) as u16).to_be_bytes());
    ph.extend_from_slice(&p[20..]);
    ones_sum(&ph) == 0xffff && p[26..28] != [0, 0]
}

/// A UDP/IPv4 packet of `len` octets from 10.31.0.`s` to .`d` with a partial checksum, and
/// its header.
fn partial_udp(s: u8, d: u8, len: usize, id: u16) -> (VnetHdr, Vec<u8>) {
    let mut p = v4(ip4(s), ip4(d), len, id);
    p[20..22].copy_from_slice(&4000u16.to_be_bytes());
    p[22..24].copy_from_slice(&5000u16.to_be_bytes());
    p[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
    let ps = pseudo(&p);
    p[26..28].copy_from_slice(&ps.to_be_bytes());
    (VnetHdr::partial(20, 6), p)
}

/// The packet as the receiving kernel ends up with it (a partial checksum completed).
fn completed(p: &[u8], c: RxCsum) -> Vec<u8> {
    let mut p = p.to_vec();
    if let RxCsum::Partial { start, offset } = c {
        fill_checksum(&mut p, start, offset).expect("offsets inside the packet");
    }
    p
}

/// Runs A's reads and both nodes' completions until B's kernel got `n` packets (10 s at
/// most).
fn pump(nodes: &mut [Node; 2], a: &mut FakeTun, b: &mut FakeTun, n: usize) {
    let end = Instant::now() + Duration::from_secs(10);
    let mut none = FakeTun::default();
    while b.written.len() < n {
        assert!(Instant::now() < end, "B got {} of {n}", b.written.len());
        while nodes[0].read_kernel(a).expect("read_kernel") {}
        nodes[0].service(&mut none).expect("A service");
        nodes[1].service(b).expect("B service");
        if nodes[1].cq().is_empty() {
            std::thread::yield_now();
        }
    }
}

/// Opens A (offload on) and B (offload `b_offload`), sends A's first partial packet, which
/// waits for resolution and the connection and is filled in, and waits until both have the
/// connection.
fn pair(addrs: [&str; 2], pkey: u16, b_offload: bool) -> ([Node; 2], FakeTun, [verbs::Device; 2]) {
    let (da, db) = (dev_mtu(addrs[0], 4096), dev_mtu(addrs[1], 4096));
    let mut nodes = [node(&da, Mode::Connected, pkey, 1), node(&db, Mode::Connected, pkey, 2)];
    nodes[0].enable_csum_offload(true);
    nodes[1].enable_csum_offload(b_offload);
    let mut a = FakeTun {
        offload: true,
        ..FakeTun::default()
    };
    let mut b = FakeTun {
        offload: b_offload,
        ..FakeTun::default()
    };
    a.to_read.push_back(partial_udp(1, 2, 1000, 0));
    assert!(nodes[0].read_kernel(&mut a).unwrap());
    assert_eq!(
        nodes[0].path_counters().tx_csum_filled,
        1,
        "the queued packet filled in"
    );
    let end = Instant::now() + Duration::from_secs(10);
    let mut none = FakeTun::default();
    while b.written.is_empty() || established(&nodes[0]) != 1 || established(&nodes[1]) != 1 {
        assert!(Instant::now() < end, "no connection");
        nodes[0].service(&mut none).unwrap();
        nodes[1].service(&mut b).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let (p, c) = &b.written[0];
    // Over UD while the connection is set up (complete), or in the connection's form.
    assert!(b_offload || *c == RxCsum::Unchecked);
    assert!(udp_ok(&completed(p, *c)), "the first packet's checksum verifies");
    (nodes, b, [da, db])
}

#[test]
fn both_offer_the_extension_packets_travel_with_partial_checksums() {
    let (mut nodes, mut b, _devs) = pair(["127.117.41.1", "127.117.41.2"], 0x8042, true);
    b.written.clear();
    let (a0, b0) = (nodes[0].path_counters(), nodes[1].path_counters());
    let pkts: Vec<(VnetHdr, Vec<u8>)> = (1..=64u16).map(|i| partial_udp(1, 2, 65520, i)).collect();
    let mut a = FakeTun {
        offload: true,
        to_read: pkts.iter().cloned().collect(),
        ..FakeTun::default()
    };
    pump(&mut nodes, &mut a, &mut b, 64);
    let (a1, b1) = (nodes[0].path_counters(), nodes[1].path_counters());
    assert_eq!(a1.tx_csum_partial - a0.tx_csum_partial, 64, "A sent each as it was");
    assert_eq!(a1.tx_csum_filled, a0.tx_csum_filled, "A filled none in");
    assert_eq!(
        a1.tx_in_place - a0.tx_in_place,
        64,
        "A posted each from its read buffer"
    );
    assert_eq!(b1.rx_csum_partial - b0.rx_csum_partial, 64, "B marked each partial");
    assert_eq!(
        (a.reads, b.written.len()),
        (64, 64),
        "one read and one write per packet"
    );
    for ((_, sent), (got, c)) in pkts.iter().zip(&b.written) {
        assert_eq!(*c, RxCsum::Partial { start: 20, offset: 6 });
        assert_eq!(got, sent, "the packet arrives as the kernel handed it over");
        assert!(udp_ok(&completed(got, *c)), "completed, the checksum verifies");
    }

    // A complete checksum (the kernel computed it) and an ICMP packet.
    let (_, mut full) = partial_udp(1, 2, 3000, 99);
    fill_checksum(&mut full, 20, 6).unwrap();
    assert!(udp_ok(&full));
    let mut icmp = v4(ip4(1), ip4(2), 200, 100);
    icmp[9] = 1;
    b.written.clear();
    let a0 = nodes[0].path_counters();
    a.to_read = [(VnetHdr::plain(), full.clone()), (VnetHdr::plain(), icmp.clone())].into();
    pump(&mut nodes, &mut a, &mut b, 2);
    assert_eq!(nodes[0].path_counters().tx_csum_pseudo - a0.tx_csum_pseudo, 1);
    let (got, c) = &b.written[0];
    assert_eq!(*c, RxCsum::Partial { start: 20, offset: 6 });
    assert_eq!(
        got[26..28],
        pseudo(&full).to_be_bytes(),
        "the pseudo-header form on the wire"
    );
    assert_eq!(completed(got, *c), full, "completed, as the sender's kernel made it");
    assert_eq!(b.written[1], (icmp, RxCsum::Unchecked), "ICMP untouched");
}

#[test]
fn a_peer_without_the_extension_gets_checksums_filled_in() {
    let (mut nodes, mut b, _devs) = pair(["127.117.41.3", "127.117.41.4"], 0x8043, false);
    b.written.clear();
    let (a0, b0) = (nodes[0].path_counters(), nodes[1].path_counters());
    let pkts: Vec<(VnetHdr, Vec<u8>)> = (1..=32u16).map(|i| partial_udp(1, 2, 65520, i)).collect();
    let mut a = FakeTun {
        offload: true,
        to_read: pkts.iter().cloned().collect(),
        ..FakeTun::default()
    };
    pump(&mut nodes, &mut a, &mut b, 32);
    let (a1, b1) = (nodes[0].path_counters(), nodes[1].path_counters());
    assert_eq!(a1.tx_csum_partial, a0.tx_csum_partial, "nothing partial to B");
    assert_eq!(a1.tx_csum_filled - a0.tx_csum_filled, 32, "A filled each in");
    assert_eq!(a1.tx_in_place - a0.tx_in_place, 32, "in place all the same");
    assert_eq!(b1.rx_csum_partial, b0.rx_csum_partial);
    for ((_, sent), (got, c)) in pkts.iter().zip(&b.written) {
        assert_eq!(*c, RxCsum::Unchecked);
        assert!(udp_ok(got), "the checksum on the wire verifies");
        assert_eq!(got[28..], sent[28..], "payload intact");
    }
}

#[test]
fn gso_packets_and_bad_offsets_are_dropped_and_counted() {
    let (mut nodes, _b, _devs) = pair(["127.117.41.5", "127.117.41.6"], 0x8044, true);
    let (_, p) = partial_udp(1, 2, 1000, 7);
    let gso = VnetHdr {
        gso_type: 1, // VIRTIO_NET_HDR_GSO_TCPV4
        gso_size: 500,
        ..VnetHdr::partial(20, 6)
    };
    let mut a = FakeTun {
        offload: true,
        to_read: [(gso, p.clone()), (VnetHdr::partial(990, 16), p)].into(),
        ..FakeTun::default()
    };
    let (s0, bad0) = (nodes[0].rc_counters().sent, nodes[0].path_counters().tx_bad_offload);
    while nodes[0].read_kernel(&mut a).unwrap() {}
    assert_eq!(a.reads, 2);
    assert_eq!(nodes[0].path_counters().tx_bad_offload - bad0, 2);
    assert_eq!(nodes[0].rc_counters().sent, s0, "neither sent");
    assert!(nodes[0].can_read_kernel(), "buffers given back");
}
