//! One end-to-end suite for every verbs provider.
//!
//! The test bodies here take a [`Fixture`]: how a provider opens a device and
//! how it turns two ends into connected RC QP pairs (the rdma_cm-style CM for
//! iWARP, explicit `modify_qp` for RoCEv2 as SMC-R does, or the IB CM). Each
//! provider has one test file in `tests/` that calls the same bodies, so a
//! behaviour whose semantics are the same on both transports is written once
//! (issue 13, "what must hold" 1). Provider-only behaviour (iWARP Terminates,
//! MPA; RoCE NAKs, PSNs) stays in the provider crates' own tests.
//!
//! Every pair gets its own loopback addresses from [`Fixture::next_ip`], so
//! tests of one binary, and other binaries, run in parallel without sharing a
//! UDP port 4791 or a listening port.

#![warn(missing_docs)]

pub mod access;
pub mod faults;
pub mod fixtures;
pub mod idle;
pub mod model;
pub mod ops;
pub mod volume;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use verbs::*;

/// Declares one `#[test]` per body, each calling `body(&FIXTURE, args...)`:
///
/// ```ignore
/// conformance::tests! { FX;
///     send_recv_write_read => ops::send_recv_write_read;
///     one_gib_by_writes => volume::one_gib, 0, false;
/// }
/// ```
#[macro_export]
macro_rules! tests {
    ($fx:expr; $($name:ident => $body:path $(, $arg:expr)*;)*) => {
        $(
            #[test]
            fn $name() {
                $body(&$fx $(, $arg)*);
            }
        )*
    };
}

/// The part of the suite every provider runs with the same semantics: one `#[test]` per body
/// of [`ops`], [`access`] and [`volume`] (all but the 1 GiB transfers, whose names carry the
/// provider's device variants), and the model-based property test (64 cases) against
/// [`model`]. Each provider's test file invokes it once with its fixture:
///
/// ```ignore
/// static FX: fixtures::Roce = fixtures::Roce::new(133);
/// conformance::shared_suite!(FX);
/// ```
#[macro_export]
macro_rules! shared_suite {
    ($fx:expr) => {
        $crate::tests! { $fx;
            send_recv_write_read_rdmap_snd_01_wr_02_rd_01 => $crate::ops::send_recv_write_read;
            atomics_and_immediate_rfc7306 => $crate::ops::atomics_and_immediate;
            large_write_and_read_each_variant => $crate::ops::large_write_and_read;
            a_busy_poller_that_goes_away_leaves_no_stall => $crate::ops::busy_poller_that_goes_away_leaves_no_stall;
            read_without_remote_read_rdmap_sec_05 => $crate::access::read_without_remote_read;
            write_without_remote_write_rdmap_sec_05 => $crate::access::write_without_remote_write;
            read_past_end_rdmap_sec_03 => $crate::access::read_past_end;
            write_below_base_rdmap_sec_03 => $crate::access::write_below_base;
            atomic_without_remote_atomic_rdmap_sec_05 => $crate::access::atomic_without_remote_atomic;
            qps_256_at_once => $crate::volume::qps_256_at_once;
        }

        ::proptest::proptest! {
            #![proptest_config(::proptest::prelude::ProptestConfig {
                cases: 64,
                max_shrink_iters: 200,
                ..::proptest::prelude::ProptestConfig::default()
            })]

            #[test]
            fn random_mix_matches_model(
                ops in ::proptest::collection::vec($crate::model::op(), 1..48),
                variant in 0usize..2,
            ) {
                $crate::model::run(&$fx, &ops, variant)?;
            }
        }
    };
}

/// How long a test waits for one completion or CM step.
pub const T: Duration = Duration::from_secs(30);

/// What the test bodies ask of a connection, beyond the defaults.
#[derive(Debug, Clone)]
pub struct Caps {
    /// IRD and ORD (RC: max_dest_rd_atomic / max_rd_atomic).
    pub rd_atomic: u8,
    /// Queue capacities.
    pub attr: QpInitAttr,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            rd_atomic: 16,
            attr: QpInitAttr::default(),
        }
    }
}

/// One side of a connection: a device, its address, a PD and a CQ.
#[derive(Clone)]
pub struct End {
    /// The device.
    pub dev: Device,
    /// The address the device (RoCE) or its listener (iWARP) uses.
    pub ip: Ipv4Addr,
    /// The PD the QPs of this side belong to.
    pub pd: ProtectionDomain,
    /// The CQ of both queues of this side's QPs.
    pub cq: CompletionQueue,
}

impl End {
    /// A fresh PD and a CQ of `cqe` entries on `dev`.
    pub fn new(dev: Device, ip: Ipv4Addr, cqe: usize) -> End {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(cqe).unwrap();
        End { dev, ip, pd, cq }
    }
}

/// A provider under test.
pub trait Fixture: Sync {
    /// The provider's registry name (`iwarp`, `roce`), for messages.
    fn name(&self) -> &'static str;
    /// Device settings the data-moving bodies are run under, each a
    /// different path through the provider (iWARP: CRC off and on; RoCE:
    /// path MTUs). The first is the default one.
    fn variants(&self) -> Vec<DeviceOptions>;
    /// Opens a device with `opts` that uses the local address `ip`.
    fn open(&self, opts: &DeviceOptions, ip: Ipv4Addr) -> Device;
    /// Connects `n` RC QP pairs, requester at `a`, responder at `b`.
    fn connect(&self, a: &End, b: &End, n: usize, caps: &Caps) -> Vec<(QueuePair, QueuePair)>;
    /// The transport, where the verbs semantics differ (iWARP reports
    /// Immediate Data right after a Write as `RecvRdmaWithImm` with
    /// `byte_len` 0; the InfiniBand transport has distinct opcodes and
    /// reports a Write with immediate's length, as rxe does).
    fn transport(&self) -> Transport;
    /// The second byte of this fixture's loopback addresses (127.`net`.x.y),
    /// distinct per test binary.
    fn net(&self) -> u8;
    /// A loopback address no other pair of this process uses.
    fn next_ip(&self) -> Ipv4Addr {
        static N: AtomicU32 = AtomicU32::new(1);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Ipv4Addr::new(127, self.net(), (n >> 8) as u8, n as u8)
    }
    /// Two ends on two devices opened with `opts`.
    fn ends(&self, opts: &DeviceOptions, cqe: usize) -> (End, End) {
        let (ia, ib) = (self.next_ip(), self.next_ip());
        let a = End::new(self.open(opts, ia), ia, cqe);
        let b = End::new(self.open(opts, ib), ib, cqe);
        (a, b)
    }
}

/// A connected pair of QPs on two devices: `a` requests, `b` responds.
pub struct Pair {
    /// The requester's side.
    pub ea: End,
    /// The responder's side.
    pub eb: End,
    /// The requester's QP.
    pub a: QueuePair,
    /// The responder's QP.
    pub b: QueuePair,
}

impl Pair {
    /// The requester's CQ.
    pub fn cq_a(&self) -> &CompletionQueue {
        &self.ea.cq
    }
    /// The responder's CQ.
    pub fn cq_b(&self) -> &CompletionQueue {
        &self.eb.cq
    }
    /// Waits for the requester's next completion.
    pub fn wait_a(&self) -> WorkCompletion {
        self.ea
            .cq
            .wait(Some(T))
            .expect("a requester completion within the timeout")
    }
    /// Waits for the responder's next completion.
    pub fn wait_b(&self) -> WorkCompletion {
        self.eb
            .cq
            .wait(Some(T))
            .expect("a responder completion within the timeout")
    }
}

/// One pair under device settings `opts` with `caps`.
pub fn pair_with(fx: &dyn Fixture, opts: &DeviceOptions, caps: &Caps) -> Pair {
    let (ea, eb) = fx.ends(opts, 4096);
    let (a, b) = fx.connect(&ea, &eb, 1, caps).pop().unwrap();
    Pair { ea, eb, a, b }
}

/// One pair with the default settings.
pub fn pair(fx: &dyn Fixture) -> Pair {
    pair_with(fx, &fx.variants()[0], &Caps::default())
}

/// Where `off` bytes into `mr` is, for the peer.
pub fn remote(mr: &MemoryRegion, off: usize) -> RemoteAddr {
    RemoteAddr {
        addr: mr.addr() + off as u64,
        rkey: mr.rkey(),
    }
}

/// Connects with the rdma_cm-style CM of the devices ([`ProtectionDomain::connect`]
/// and a listener on `b`), checking private data both ways. Each pair's
/// request carries its index, so pair `i` is `a`'s `i`th connect.
pub fn cm_connect(a: &End, b: &End, n: usize, caps: &Caps) -> Vec<(QueuePair, QueuePair)> {
    let listener = b.dev.listen(SocketAddr::new(IpAddr::V4(b.ip), 0)).unwrap();
    let addr = listener.local_addr();
    let opts = |cq: &CompletionQueue| {
        QpOptions::new(cq)
            .rd_atomic(caps.rd_atomic, caps.rd_atomic)
            .attr(caps.attr.clone())
    };
    let (pd_b, ob) = (b.pd.clone(), opts(&b.cq));
    let server = std::thread::spawn(move || {
        let mut v: Vec<(u32, QueuePair)> = (0..n)
            .map(|_| {
                let req = listener.get_request(Some(T)).unwrap();
                let i = u32::from_be_bytes(req.private_data().try_into().unwrap());
                (i, req.accept(&pd_b, ob.clone().private_data(b"welcome")).unwrap())
            })
            .collect();
        v.sort_by_key(|(i, _)| *i);
        v
    });
    let route = verbs::cm::RouteOptions::default().src_addr(IpAddr::V4(a.ip));
    let clients: Vec<QueuePair> = (0..n as u32)
        .map(|i| {
            let o = opts(&a.cq).private_data(&i.to_be_bytes()).route(route);
            a.pd.connect(addr, o, T).unwrap()
        })
        .collect();
    let servers = server.join().unwrap();
    clients
        .into_iter()
        .zip(servers)
        .map(|(qa, (_, qb))| {
            assert_eq!(qa.conn_info().peer_private_data, b"welcome");
            assert_eq!(qa.get_event(Some(T)), Some(CmEvent::Established));
            assert_eq!(qb.get_event(Some(T)), Some(CmEvent::Established));
            (qa, qb)
        })
        .collect()
}

/// RC path parameters of a hand-made connection ([`modify_qp_connect`]).
#[derive(Debug, Clone, Copy)]
pub struct RcPath {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry: u8,
    /// The RNR NAK timer code the responder asks for.
    pub min_rnr_timer: u8,
}

impl RcPath {
    /// MTU 1024, timeout 14 (67 ms), 7 retries, infinite RNR retries, RNR timer 0.01 ms.
    pub const DEFAULT: RcPath = RcPath {
        mtu: Mtu::Mtu1024,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
    };
}

impl Default for RcPath {
    fn default() -> Self {
        RcPath::DEFAULT
    }
}

/// Connects by moving both QPs through RESET → INIT → RTR → RTS by hand,
/// exchanging QPN, GID and PSN out of band, as SMC-R does.
pub fn modify_qp_connect(a: &End, b: &End, n: usize, caps: &Caps, path: RcPath) -> Vec<(QueuePair, QueuePair)> {
    let create = |e: &End| {
        e.pd.create_qp(QpInit::new(QpType::Rc, &e.cq).cap(caps.attr.clone()))
            .unwrap()
    };
    (0..n)
        .map(|i| {
            let (qa, qb) = (create(a), create(b));
            // Distinct, not-zero start PSNs per pair and direction.
            let psn_a = (0x10_0000 + i as u32 * 977) & 0xff_ffff;
            let psn_b = (0x80_0000 + i as u32 * 1013) & 0xff_ffff;
            rc_up(&qa, b.ip, qb.qp_num(), psn_a, psn_b, caps, path);
            rc_up(&qb, a.ip, qa.qp_num(), psn_b, psn_a, caps, path);
            (qa, qb)
        })
        .collect()
}

/// Moves one RC QP to RTS towards (`peer`, `dest_qpn`): it sends from
/// `sq_psn` and expects `rq_psn`.
pub fn rc_up(qp: &QueuePair, peer: Ipv4Addr, dest_qpn: u32, sq_psn: u32, rq_psn: u32, caps: &Caps, path: RcPath) {
    qp.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
    qp.modify_qp(&QpAttr::rtr(RtrAttr {
        ah_attr: AhAttr::to_gid(Gid::from_ipv4(peer)),
        path_mtu: path.mtu,
        dest_qp_num: dest_qpn,
        rq_psn,
        max_dest_rd_atomic: caps.rd_atomic,
        min_rnr_timer: path.min_rnr_timer,
    }))
    .unwrap();
    qp.modify_qp(&QpAttr::rts(RtsAttr {
        sq_psn,
        timeout: path.timeout,
        retry_cnt: path.retry_cnt,
        rnr_retry: path.rnr_retry,
        max_rd_atomic: caps.rd_atomic,
    }))
    .unwrap();
}
