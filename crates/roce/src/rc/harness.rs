//! Two RC cores back to back in memory, the way quinn-proto tests connections: no socket, no
//! thread, no clock. Time is simulated (`Sim::now` only moves forward when nothing else can
//! happen), the link between the cores drops, duplicates, reorders and delays packets with a
//! fixed seed, and every packet goes through [`Packet::emit`] and [`Packet::parse`] on its way.
//!
//! Used by `rc/tests.rs` and the fuzz target `roce_rc` (`fuzz/README.md`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use verbs::provider::{DeviceProviderExt, Provider, QpCreate, QpOps};
use verbs::{
    Access, Device, DeviceAttr, Error, MemoryRegion, Mtu, ProtectionDomain, QpAttr, QpState, Result, WorkCompletion,
};

use super::{RcConfig, RcQp};
use crate::wire::Packet;

/// A provider with no transport: the cores are made and driven by hand.
struct NoTransport;

impl Provider for NoTransport {
    fn query_device(&self) -> DeviceAttr {
        DeviceAttr {
            fw_ver: "0".into(),
            vendor_id: 0,
            max_qp: 16,
            max_qp_wr: 1 << 15,
            max_sge: 16,
            max_sge_rd: 16,
            max_cq: 16,
            max_cqe: 1 << 20,
            max_mr: 1 << 16,
            max_mr_size: 1 << 40,
            max_pd: 16,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_msg_sz: 1 << 31,
            max_inline_data: 4096,
            max_fast_reg_page_list_len: 1 << 16,
            atomic_cap: true,
        }
    }
    fn create_qp(&self, _req: QpCreate) -> Result<Arc<dyn QpOps>> {
        Err(Error::NotSupported("in-memory test device".into()))
    }
    fn create_ah(&self, _pd_id: u32, attr: &verbs::AhAttr) -> Result<Arc<dyn verbs::ah::AhOps>> {
        Ok(Arc::new(crate::ud::UdAh(*attr)))
    }
}

/// A device whose memory table the cores share, with no transport.
pub fn device() -> Device {
    verbs::provider::new_device("rxe-mem0", Arc::new(NoTransport) as Arc<dyn Provider>, None)
}

/// What `modify_qp` gives both cores.
#[derive(Debug, Clone, Copy)]
pub struct PairConfig {
    /// The path MTU of both sides.
    pub mtu: Mtu,
    /// The local ACK timeout exponent (4.096 µs × 2^timeout, 0 = infinite).
    pub timeout: u8,
    /// Transport retries, 0..=7.
    pub retry_cnt: u8,
    /// RNR retries, 0..=7, 7 = infinite.
    pub rnr_retry: u8,
    /// The RNR NAK timer code each side sends (IBA vol. 1 release 1.3 table 45).
    pub min_rnr_timer: u8,
    /// Reads/atomics outstanding at most, each way (ORD, and IRD at the peer).
    pub max_rd_atomic: u8,
    /// Start PSNs of the two directions (near 2^24 to cross the wrap).
    pub psn_ab: u32,
    /// Start PSN of b's requests to a.
    pub psn_ba: u32,
    /// The requesters' window: packets sent and not yet acknowledged at most.
    pub window: u32,
}

impl Default for PairConfig {
    fn default() -> Self {
        PairConfig {
            mtu: Mtu::Mtu1024,
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            psn_ab: 0xff_ff00,
            psn_ba: 0x12_3456,
            window: 128,
        }
    }
}

/// One core with what its application holds.
pub struct Side {
    /// The RC core.
    pub qp: RcQp,
    /// The PD its memory regions are registered in.
    pub pd: ProtectionDomain,
    /// Completions polled so far.
    pub wcs: Vec<WorkCompletion>,
}

impl Side {
    /// Registers a region of `len` octets with `access` in this side's PD.
    pub fn reg_mr(&self, len: usize, access: Access) -> MemoryRegion {
        self.pd.reg_mr(len, access).expect("a region on the in-memory device")
    }
    /// Moves the core's completions into `wcs`.
    pub fn poll(&mut self) {
        while let Some(wc) = self.qp.poll_completion() {
            self.wcs.push(wc);
        }
    }
}

/// Faults of one direction of the link, as probabilities per packet.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Probability a packet is dropped.
    pub drop: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// A reordered packet is held back by up to `reorder_by`.
    pub reorder: f64,
    /// How long a reordered packet is held back at most.
    pub reorder_by: Duration,
    /// Extra delay of every packet in this direction (e.g. ACKs held back).
    pub delay: Duration,
    /// The direction is cut: nothing arrives.
    pub cut: bool,
}

impl Faults {
    /// A lossy direction: `drop` drops, half as many duplicates, `drop` reorders by up to 40 µs.
    pub fn lossy(drop: f64) -> Faults {
        Faults {
            drop,
            duplicate: drop / 2.0,
            reorder: drop,
            reorder_by: Duration::from_micros(40),
            delay: Duration::ZERO,
            cut: false,
        }
    }
}

/// The one-way latency of the link.
pub const LATENCY: Duration = Duration::from_micros(5);
/// The time one packet takes on the wire (serialisation delay).
pub const PER_PACKET: Duration = Duration::from_nanos(800);

struct InFlight {
    at: Instant,
    seq: u64,
    bytes: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// One direction of the link.
#[derive(Default)]
struct Wire {
    q: BinaryHeap<Reverse<InFlight>>,
    free_at: Option<Instant>,
    faults: Faults,
    sent: u64,
    dropped: u64,
}

/// Two cores, `a` and `b`, and the link between them.
pub struct Sim {
    /// The simulated time.
    pub now: Instant,
    /// Side a, QP [`QPN_A`].
    pub a: Side,
    /// Side b, QP [`QPN_B`].
    pub b: Side,
    ab: Wire,
    ba: Wire,
    rng: StdRng,
    seq: u64,
    buf: Vec<u8>,
}

/// QP number of side a.
pub const QPN_A: u32 = 0x11;
/// QP number of side b.
pub const QPN_B: u32 = 0x12;

fn side(pd: &ProtectionDomain, qpn: u32, peer: u32, sq_psn: u32, rq_psn: u32, c: &PairConfig) -> Side {
    let mut cfg = RcConfig::new(qpn, pd.id(), pd.device().mem_table());
    cfg.window = c.window;
    let mut qp = RcQp::new(cfg);
    let steps = [
        QpAttr {
            qp_state: Some(QpState::Init),
            ..QpAttr::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rtr),
            dest_qp_num: Some(peer),
            rq_psn: Some(rq_psn),
            path_mtu: Some(c.mtu),
            max_dest_rd_atomic: Some(c.max_rd_atomic),
            min_rnr_timer: Some(c.min_rnr_timer),
            ..QpAttr::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            timeout: Some(c.timeout),
            retry_cnt: Some(c.retry_cnt),
            rnr_retry: Some(c.rnr_retry),
            max_rd_atomic: Some(c.max_rd_atomic),
            ..QpAttr::default()
        },
    ];
    for s in &steps {
        qp.modify(s).expect("valid attributes");
    }
    Side {
        qp,
        pd: pd.clone(),
        wcs: Vec::new(),
    }
}

/// One core in RTS (QP [`QPN_A`], peer [`QPN_B`]) for scripted tests that feed it packets.
pub fn single(pd: &ProtectionDomain, c: &PairConfig) -> Side {
    side(pd, QPN_A, QPN_B, c.psn_ab, c.psn_ba, c)
}

impl Sim {
    /// Two connected cores on one device and PD (so either can name the other's memory).
    pub fn new(c: PairConfig, seed: u64) -> Sim {
        let dev = device();
        let pd = dev.alloc_pd().expect("a PD on the in-memory device");
        Sim {
            now: Instant::now(),
            a: side(&pd, QPN_A, QPN_B, c.psn_ab, c.psn_ba, &c),
            b: side(&pd, QPN_B, QPN_A, c.psn_ba, c.psn_ab, &c),
            ab: Wire::default(),
            ba: Wire::default(),
            rng: StdRng::seed_from_u64(seed),
            seq: 0,
            buf: vec![0; 8192],
        }
    }

    /// Sets the faults of the a→b and b→a directions.
    pub fn set_faults(&mut self, a_to_b: Faults, b_to_a: Faults) {
        self.ab.faults = a_to_b;
        self.ba.faults = b_to_a;
    }

    /// Packets dropped by the link (both directions).
    pub fn dropped(&self) -> u64 {
        self.ab.dropped + self.ba.dropped
    }

    fn put(now: Instant, rng: &mut StdRng, seq: &mut u64, w: &mut Wire, bytes: &[u8]) {
        w.sent += 1;
        let f = w.faults;
        let start = w.free_at.map_or(now, |t| t.max(now));
        w.free_at = Some(start + PER_PACKET);
        if f.cut || rng.random_bool(f.drop.clamp(0.0, 1.0)) {
            w.dropped += 1;
            return;
        }
        let copies = if rng.random_bool(f.duplicate.clamp(0.0, 1.0)) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = start + LATENCY + f.delay;
            if rng.random_bool(f.reorder.clamp(0.0, 1.0)) && !f.reorder_by.is_zero() {
                at += Duration::from_nanos(rng.random_range(0..f.reorder_by.as_nanos() as u64));
            }
            *seq += 1;
            w.q.push(Reverse(InFlight {
                at,
                seq: *seq,
                bytes: bytes.to_vec(),
            }));
        }
    }

    /// Everything both cores want to send goes onto the link; true if anything did.
    fn transmit(&mut self) -> bool {
        let mut any = false;
        while let Some(n) = self.a.qp.poll_transmit(self.now, &mut self.buf) {
            Self::put(self.now, &mut self.rng, &mut self.seq, &mut self.ab, &self.buf[..n]);
            any = true;
        }
        while let Some(n) = self.b.qp.poll_transmit(self.now, &mut self.buf) {
            Self::put(self.now, &mut self.rng, &mut self.seq, &mut self.ba, &self.buf[..n]);
            any = true;
        }
        any
    }

    /// Delivers the packets due by `now`; true if any was.
    fn deliver(&mut self) -> bool {
        let mut any = false;
        for dir in 0..2 {
            let (w, to) = if dir == 0 {
                (&mut self.ab, &mut self.b)
            } else {
                (&mut self.ba, &mut self.a)
            };
            while w.q.peek().is_some_and(|Reverse(p)| p.at <= self.now) {
                let Reverse(p) = w.q.pop().expect("peeked");
                let pkt = Packet::parse(&p.bytes).expect("the cores emit well-formed packets");
                to.qp.handle_packet(self.now, &pkt);
                any = true;
            }
        }
        any
    }

    /// One step: send, deliver, or (when neither is possible) advance the clock to the next
    /// arrival or timer. False when nothing can ever happen again.
    pub fn step(&mut self) -> bool {
        let sent = self.transmit();
        let delivered = self.deliver();
        self.a.poll();
        self.b.poll();
        if sent || delivered {
            return true;
        }
        let next = [
            self.ab.q.peek().map(|Reverse(p)| p.at),
            self.ba.q.peek().map(|Reverse(p)| p.at),
            self.a.qp.poll_timeout(),
            self.b.qp.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else { return false };
        self.now = self.now.max(next);
        for s in [&mut self.a, &mut self.b] {
            if s.qp.poll_timeout().is_some_and(|t| t <= self.now) {
                s.qp.handle_timeout(self.now);
            }
        }
        true
    }

    /// Steps until `done` holds (true) or nothing can happen any more or `max_steps` ran out
    /// (false).
    pub fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&Sim) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    /// Steps until both cores are quiet: nothing in flight, nothing to send, no timer.
    pub fn settle(&mut self, max_steps: u64) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        false
    }
}
