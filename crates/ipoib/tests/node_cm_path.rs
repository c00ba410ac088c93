//! Issue 16: the per-packet path of connected mode on the device, counted (not timed). A
//! [`KernelIo`] stands in for the TUN: node A reads 65,520-octet IP packets from it into
//! its send buffers, node B writes what it receives into another. Every packet must take
//! the in-place path on both sides (no copy in the node: `tx_in_place`, `rx_in_place`),
//! with one kernel read and one kernel write per packet, and the steady state must not
//! allocate a packet-sized buffer (a counting global allocator; the old path made four
//! 64 KiB `Vec`s per packet, whose page faults were 11-23 % of the daemons' time).
//!
//! Datagram mode: a burst of packets from the kernel is posted in batches of UD sends.
//!
//! Loopback devices 127.117.40.1-4 (unique to this file), P_Keys 0x8040-0x8041.
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` C2 (connected mode carries
//! 65,520-octet packets), IPCM-7.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ipoib::link::Mode;
use ipoib::node::{KernelIo, Node};
use verbs::MemoryRegion;

mod common;
use common::{dev_mtu, established, ip4, node, run_until, v4};

// Counts allocations of at least 16 KiB (packet-sized buffers), all threads: testsupport's
// counting allocator.
testsupport::counting_allocator!(big = 16 * 1024);
use testsupport::alloc::big_allocs;

/// The kernel side of A: packets to read; of B: what was written.
#[derive(Default)]
struct FakeTun {
    to_read: VecDeque<Vec<u8>>,
    reads: u64,
    written: Vec<Vec<u8>>,
    writes: u64,
    /// Keep what is written (off in the allocation count, which only wants the node's).
    keep: bool,
    sum: u64,
}

impl FakeTun {
    /// A's kernel side with `pkts` to read, and B's keeping what is written.
    fn pair(pkts: &[Vec<u8>]) -> (FakeTun, FakeTun) {
        let a = FakeTun {
            to_read: pkts.iter().cloned().collect(),
            ..FakeTun::default()
        };
        let b = FakeTun {
            keep: true,
            ..FakeTun::default()
        };
        (a, b)
    }
}

impl KernelIo for FakeTun {
    fn read_packet(&mut self, mr: &MemoryRegion, off: usize, max: usize) -> std::io::Result<Option<usize>> {
        let Some(p) = self.to_read.pop_front() else {
            return Ok(None);
        };
        assert!(p.len() <= max);
        mr.write(off, &p).expect("in the region");
        self.reads += 1;
        Ok(Some(p.len()))
    }
    fn write_packet(&mut self, pkt: &[u8]) {
        self.writes += 1;
        self.sum += pkt.iter().map(|b| u64::from(*b)).sum::<u64>();
        if self.keep {
            self.written.push(pkt.to_vec());
        }
    }
}

/// Runs A's reads and both nodes' completions until B wrote `n` packets (10 s at most).
fn pump(nodes: &mut [Node; 2], a: &mut FakeTun, b: &mut FakeTun, n: u64) {
    let end = Instant::now() + Duration::from_secs(10);
    let mut none = Vec::new();
    while b.writes < n {
        assert!(Instant::now() < end, "B got {} of {n}", b.writes);
        while nodes[0].read_kernel(a).expect("read_kernel") {}
        nodes[0].service(&mut none).expect("A service");
        nodes[1].service(b).expect("B service");
        if nodes[1].cq().is_empty() {
            std::thread::yield_now();
        }
    }
    assert!(none.is_empty(), "nothing for A's kernel: {none:?}");
}

#[test]
fn connected_mode_packets_go_through_in_place_one_read_one_write_each() {
    let (da, db) = (dev_mtu("127.117.40.1", 4096), dev_mtu("127.117.40.2", 4096));
    let mut nodes = [
        node(&da, Mode::Connected, 0x8040, 1),
        node(&db, Mode::Connected, 0x8040, 2),
    ];
    // Resolve and connect with one packet through the copying path.
    nodes[0].from_kernel(v4(ip4(1), ip4(2), 100, 0)).unwrap();
    run_until(&mut nodes, |n, g| {
        !g[1].is_empty() && established(&n[0]) == 1 && established(&n[1]) == 1
    });
    let (a0, b0) = (nodes[0].path_counters(), nodes[1].path_counters());

    // 64 packets of 65,520 octets, kept and compared.
    let pkts: Vec<Vec<u8>> = (1..=64u16).map(|i| v4(ip4(1), ip4(2), 65520, i)).collect();
    let (mut a, mut b) = FakeTun::pair(&pkts);
    pump(&mut nodes, &mut a, &mut b, 64);
    assert_eq!(b.written, pkts, "every packet whole and in order");
    let (a1, b1) = (nodes[0].path_counters(), nodes[1].path_counters());
    assert_eq!(
        a1.tx_in_place - a0.tx_in_place,
        64,
        "A posted each from its read buffer"
    );
    assert_eq!(a1.tx_copied, a0.tx_copied, "A copied none");
    assert_eq!(
        b1.rx_in_place - b0.rx_in_place,
        64,
        "B wrote each from its receive buffer"
    );
    assert_eq!(b1.rx_copied, b0.rx_copied, "B copied none");
    assert_eq!(
        (a.reads, b.writes),
        (64, 64),
        "one kernel read and one write per packet"
    );

    // Steady state: 256 more (built before counting), no packet-sized allocation in the
    // nodes (nor in the provider's path under them).
    let built = big_allocs();
    let pkts: Vec<Vec<u8>> = (0..256u16).map(|i| v4(ip4(1), ip4(2), 65520, 1000 + i)).collect();
    assert!(
        big_allocs() - built >= 256,
        "the allocator counts (the test packets themselves)"
    );
    let want: u64 = pkts.iter().flatten().map(|b| u64::from(*b)).sum();
    let mut a = FakeTun {
        to_read: pkts.into(),
        ..FakeTun::default()
    };
    let mut b = FakeTun::default();
    let big0 = big_allocs();
    pump(&mut nodes, &mut a, &mut b, 256);
    let big = big_allocs() - big0;
    assert_eq!(b.sum, want, "the 256 packets' octets arrived");
    assert_eq!((a.reads, b.writes), (256, 256));
    assert_eq!(big, 0, "packet-sized allocations for 256 packets");

    // B's daemon stalls while A sends 120 (more than the old 32 receive buffers per
    // connection, within the 128 now): B's provider places and acknowledges them in the
    // buffers posted, so A sees no RNR NAK (each one cost a go-back-N retransmission of
    // everything in flight: 11 % of the packets in an iperf3 run) and B gets all of them.
    let rnr = |d: &verbs::Device| {
        d.hw_counters()
            .into_iter()
            .find(|c| c.name == "rcvd_rnr_err")
            .map_or(0, |c| c.value)
    };
    let rnr0 = rnr(&da);
    let sent0 = nodes[0].rc_counters().sent;
    let mut a = FakeTun {
        to_read: (0..120u16).map(|i| v4(ip4(1), ip4(2), 65520, 2000 + i)).collect(),
        ..FakeTun::default()
    };
    let end = Instant::now() + Duration::from_secs(10);
    let mut none = Vec::new();
    while nodes[0].rc_counters().sent - sent0 < 120 || !nodes[0].can_read_kernel() || nodes[1].cq().len() < 120 {
        assert!(Instant::now() < end, "A sent {}", nodes[0].rc_counters().sent - sent0);
        assert_eq!(rnr(&da) - rnr0, 0, "RNR NAKs while B's daemon stalled");
        while nodes[0].read_kernel(&mut a).expect("read_kernel") {}
        nodes[0].service(&mut none).expect("A service");
        std::thread::yield_now();
    }
    let mut b = FakeTun::default();
    pump(&mut nodes, &mut FakeTun::default(), &mut b, 120);
    assert_eq!(rnr(&da) - rnr0, 0, "RNR NAKs while B's daemon stalled");
}

/// Datagram mode: a burst read from the kernel goes out in batches of UD sends (one
/// `post_send`, one `sendmmsg` in the provider, per 16 messages), and every packet
/// arrives. 127.117.40.3/4, P_Key 0x8041.
#[test]
fn datagram_mode_burst_is_posted_in_batches() {
    let (da, db) = (dev_mtu("127.117.40.3", 2048), dev_mtu("127.117.40.4", 2048));
    let mut nodes = [
        node(&da, Mode::Datagram, 0x8041, 3),
        node(&db, Mode::Datagram, 0x8041, 4),
    ];
    nodes[0].from_kernel(v4(ip4(3), ip4(4), 100, 0)).unwrap();
    run_until(&mut nodes, |_, g| !g[1].is_empty());
    let pkts: Vec<Vec<u8>> = (1..=64u16).map(|i| v4(ip4(3), ip4(4), 2044, i)).collect();
    let (mut a, mut b) = FakeTun::pair(&pkts);
    let posts0 = nodes[0].ud_posts();
    pump(&mut nodes, &mut a, &mut b, 64);
    assert_eq!(b.written, pkts, "every packet whole and in order");
    assert_eq!(a.reads, 64);
    assert_eq!(nodes[0].ud_posts() - posts0, 4, "64 UD sends in 4 posts of 16");
}
