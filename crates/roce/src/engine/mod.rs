//! The RoCEv2 device: one UDP socket on `addr`:4791 per device, the RC cores of its QPs
//! ([`crate::rc::RcQp`]) and the progress model of the iWARP engine.
//!
//! ```text
//!  application thread                       progress thread (one per device)
//!  post_send ─► RcQp::post_send ─► transmit   epoll_wait(socket, waker; next timer)
//!  poll_cq   ─► drain socket ─► timers         ─► drain socket ─► RcQp::handle_packet
//!                                              ─► due timers   ─► RcQp::handle_timeout
//!             every touched QP: poll_transmit ─► ICRC seal ─► sendto; poll_completion ─► CQ
//! ```
//!
//! Run-to-completion: `post_send` builds and sends the packets its window allows in the
//! caller's thread, `poll_cq` receives in the caller's thread; the progress thread does the
//! rest (ACK-clocked transmission, timers) and sleeps in `epoll_wait` when the socket is quiet
//! and no timer is armed, so an idle device costs no CPU. Whoever drains the socket holds
//! the receive lock; the others leave a "poke" so a datagram that arrives meanwhile is never
//! left unread (the same try-lock-and-poke scheme as the iWARP driver).
//!
//! Packets are demultiplexed on the BTH's destination QP: QP1 goes to the GSI handler
//! ([`crate::gsi`]), other QPs to their RC core. Every packet's ICRC is checked before
//! parsing further; a bad one is dropped silently and counted (`icrc_err`).
//!
//! IPv4 ICRC: rxe covers the IPv4 Identification, which a UDP socket does not show. The
//! socket sends with `IP_PMTUDISC_DO`, which makes Linux put ID 0 in datagrams of an
//! unconnected socket, and IDs 0, 1, 2, … in the segments of a UDP GSO train, so packet k
//! of a train is sealed with ID k. The receive side checks against the IP header (raw
//! socket), with ID k for packet k of one of our trains, or solves for the ID (peers such
//! as rxe send hashed IDs); see docs/roce.md, "The ICRC".
//!
//! Files by role: this one (configuration, the device state, timers and QPN allocation),
//! `provider.rs` ([`RoceProvider`]: socket setup, the verbs and GSI entry points), `rx.rs`
//! (socket drain, ICRC check, dispatch to QPs and the GSI handler), `tx.rs` (ICRC seal,
//! GSO trains, `sendmmsg`, the impairment's held packets), `seal.rs` (the IP and UDP
//! headers the ICRC covers), `qp.rs` and `ud.rs` (RC and UD QPs), `driver.rs` (the
//! progress thread), `sys.rs` (the system calls), `impair.rs` (fault injection).

mod driver;
pub mod impair;
mod provider;
mod qp;
mod rx;
mod seal;
#[allow(unsafe_code)]
mod sys;
mod tx;
mod ud;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use verbs::{DeviceAttr, Gid, Mtu};

use crate::gsi::GsiHandler;
pub use provider::RoceProvider;
pub use qp::{RoceQp, inline_wakeups, qp_lock_waits};
pub(crate) use rx::Rx;
pub(crate) use tx::TxParts;
pub use ud::{RoceUdQp, mcast_ip};

/// What a RoCEv2 device is opened with (the registry's text options, parsed by
/// [`crate::RoceFactory`]).
#[derive(Debug, Clone)]
pub struct RoceConfig {
    /// Device name (`rxe_soft0`).
    pub name: String,
    /// The address the device binds (UDP port 4791); GID index 0 is this address
    /// (IPv4-mapped for IPv4).
    pub addr: IpAddr,
    /// The port's active MTU (256..4096), the largest path MTU a QP is given.
    pub mtu: Mtu,
    /// Faults injected into what the device sends (testing; `None` in normal use).
    pub impair: Option<impair::ImpairConfig>,
    /// Where IPv4 packets are received, which decides how their ICRC is checked.
    pub icrc_rx: IcrcRx,
    /// Whether runs of equal-size packets go as UDP GSO trains (a capture on loopback shows
    /// a train as one frame: tests that decode captures turn it off).
    pub gso: bool,
    /// The first QPN the device hands out (`None`: a random start, so two devices of one host
    /// rarely share QPNs). Fixed for reproducible captures and for tests that need two
    /// devices whose QPs have the same numbers.
    pub qpn_base: Option<u32>,
}

/// How the device receives IPv4 packets, which decides what their ICRC is checked against
/// (rxe's IPv4 ICRC covers the IP Identification, which a UDP socket does not show).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IcrcRx {
    /// `Raw` if the process may open raw sockets (CAP_NET_RAW), else `Udp`.
    #[default]
    Auto,
    /// A raw `IPPROTO_UDP` socket with a classic BPF filter (not arrived on loopback, our
    /// address, port 4791) gives every such datagram with its IP header, so its ICRC is
    /// checked against the header it came in, rxe's hashed IDs included. The UDP socket
    /// keeps what arrives on loopback (GSO trains sent on this host reach it whole, with
    /// their segment size; the raw socket could not split them), and its being bound keeps
    /// the host from sending ICMP port-unreachable. Needs CAP_NET_RAW.
    Raw,
    /// The UDP socket receives; the IPv4 ICRC is checked with ID 0 (what our own devices
    /// send) and, failing that, the ID is solved for ([`icrc::verify_any_ipv4_id`]), so rxe's
    /// packets pass too, at a 2^-16 rather than 2^-32 chance of missing a corruption.
    ///
    /// [`icrc::verify_any_ipv4_id`]: crate::wire::icrc::verify_any_ipv4_id
    Udp,
}

impl Default for RoceConfig {
    fn default() -> Self {
        RoceConfig {
            name: "rxe_soft0".into(),
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            mtu: Mtu::Mtu1024,
            impair: None,
            icrc_rx: IcrcRx::Auto,
            gso: true,
            qpn_base: None,
        }
    }
}

/// The port MTU a device on `addr` gets by default, as rxe derives its active MTU from its
/// interface's (`eth_mtu_int_to_enum`: the interface MTU less 80 octets of headers, rounded
/// down to an IB MTU): 4096 on loopback (MTU 65536) or a 9000-octet link, 1024 on a
/// 1500-octet Ethernet link. 1024 when the interface is not found.
pub fn default_mtu(addr: IpAddr) -> Mtu {
    match sys::interface_mtu(addr) {
        Ok(m) => Mtu::at_most(m.saturating_sub(80)).unwrap_or(Mtu::Mtu256),
        Err(e) => {
            tracing::debug!(%addr, error = %e, "interface MTU unknown: port MTU 1024");
            Mtu::Mtu1024
        }
    }
}

/// Device limits, like rxe's.
pub fn device_attr() -> DeviceAttr {
    DeviceAttr {
        fw_ver: env!("CARGO_PKG_VERSION").into(),
        vendor_id: 0x736f_6674, // "soft"
        max_qp: 65_536,
        max_qp_wr: 16_384,
        max_sge: 16,
        max_sge_rd: 16,
        max_cq: 65_536,
        max_cqe: 1 << 20,
        max_mr: 1 << 20,
        max_mr_size: 1 << 40,
        max_pd: 65_536,
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
        max_msg_sz: 1 << 31,
        max_inline_data: 4096,
        max_fast_reg_page_list_len: 1 << 16,
        atomic_cap: true,
    }
}

/// Opens a RoCEv2 device: binds `addr`:4791 and starts its progress thread. No connection
/// manager: QPs are connected by hand with `modify_qp`.
pub fn open_device(cfg: RoceConfig) -> io::Result<verbs::Device> {
    open_device_with(cfg, |_| None)
}

/// Opens a RoCEv2 device whose connection manager `cm` builds from the provider (the IB CM
/// registers its [`GsiHandler`] on it and sends MADs through its [`GsiPort`](crate::gsi::GsiPort)).
pub fn open_device_with(
    cfg: RoceConfig,
    cm: impl FnOnce(&Arc<RoceProvider>) -> Option<Arc<dyn verbs::cm::backend::CmBackend>>,
) -> io::Result<verbs::Device> {
    let p = Arc::new(RoceProvider::new(cfg.clone())?);
    let backend = cm(&p);
    Ok(verbs::provider::new_device(cfg.name.clone(), p, backend))
}

/// Device-wide packet counters (the per-QP ones are in [`crate::rc::RcStats`]).
#[derive(Debug, Default)]
pub(crate) struct DevCounters {
    pub sent_pkts: AtomicU64,
    pub rcvd_pkts: AtomicU64,
    pub icrc_err: AtomicU64,
    /// Octets the receive path's ICRC passes covered (one pass per packet: the guard of
    /// tests/copies_per_octet.rs).
    pub icrc_rx_octets: AtomicU64,
    /// Octets the ICRC covered in [`DevInner::send_parts`] (packets sent from memory).
    pub icrc_tx_octets: AtomicU64,
    /// Extra ICRC passes of single datagrams whose IPv4 ID guess (the one after the last
    /// solved) was wrong.
    pub icrc_rx_id_retries: AtomicU64,
    pub malformed: AtomicU64,
    pub unknown_qp: AtomicU64,
    pub send_err: AtomicU64,
    pub retry_exceeded_err: AtomicU64,
    pub retry_rnr_exceeded_err: AtomicU64,
    /// Datagrams handed to the kernel (a GSO train counts once).
    pub tx_datagrams: AtomicU64,
    /// Of `tx_datagrams`, those the progress thread sent (ACKs and responses of what it
    /// received itself, timers, deferred transmissions it flushed). How many there are
    /// depends on the scheduler (a busy poller off its core hands the socket over); the rest
    /// are the application threads' and do not (tests/per_message_costs.rs).
    pub tx_datagrams_progress: AtomicU64,
    /// `sendmmsg`/`sendto` calls.
    pub tx_syscalls: AtomicU64,
    /// Datagrams received (a GRO train counts once).
    pub rx_datagrams: AtomicU64,
    /// `recvmmsg`/`recvmsg` calls that returned datagrams.
    pub rx_syscalls: AtomicU64,
    /// Datagrams application threads received (busy polls, inline CQ waits), not the
    /// progress thread.
    pub rx_polled: AtomicU64,
    /// Receiving calls of application threads that were one-datagram `recvmsg` calls (the
    /// socket was empty at the call before) and returned one.
    pub rx_single: AtomicU64,
    /// Times the progress thread took the sockets out of its epoll set for a busy poller.
    pub progress_mutes: AtomicU64,
    /// Datagrams application threads received while the progress thread had the sockets in
    /// its epoll set (not muted): each also wakes that thread if it sleeps, which then finds
    /// the socket drained (`epoll_wait` goes back to sleep without returning, so the
    /// progress thread cannot count these wake-ups itself).
    pub rx_polled_unmuted: AtomicU64,
    /// Times the progress thread found transmissions an application thread had deferred
    /// and sent them (a poller that stopped calling; before session 13 also every inline
    /// waiter that went back to sleep).
    pub progress_flushes: AtomicU64,
    /// Times an application thread's receive deferred transmissions while the progress
    /// thread was not muted, and woke it so that they leave within its 1 ms check.
    pub deferred_wakes: AtomicU64,
    /// Look-ups of an RC QP in the device's map by the receive path (a QP the thread
    /// received for last, or that this drain already handed packets to, is not looked up).
    pub rx_qp_lookups: AtomicU64,
    /// Times the receive path locked an RC QP to hand it packets: once per run of packets
    /// for the same QP in a GSO/GRO train, once per single datagram.
    pub rx_qp_locks: AtomicU64,
}

/// RC QPs a thread's receive path remembers ([`DevInner::qp_cached`]).
const RX_QP_CACHE: usize = 4;

thread_local! {
    /// The RC QPs this thread's receive path handed packets to last, newest first: (the
    /// device's address, the QP number, the QP).
    static LAST_RX_QPS: std::cell::RefCell<[(usize, u32, Weak<qp::QpShared>); RX_QP_CACHE]> =
        const { std::cell::RefCell::new([(0, 0, Weak::new()), (0, 0, Weak::new()), (0, 0, Weak::new()), (0, 0, Weak::new())]) };
}

impl DevCounters {
    /// Counts `n` datagrams handed to the kernel, and whose thread sent them.
    pub(crate) fn count_tx_datagrams(&self, n: u64) {
        self.tx_datagrams.fetch_add(n, Ordering::Relaxed);
        if driver::on_progress_thread() {
            self.tx_datagrams_progress.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// The state a device's QPs and its progress thread share.
pub(crate) struct DevInner {
    pub cfg: RoceConfig,
    /// The IPv4 ID the next single datagram from the UDP socket most likely carries: a GSO
    /// train the kernel segmented on receive (a veth with a raw socket beside: no
    /// `UDP_GRO`) arrives as datagrams with IDs 0, 1, 2, …, so after ID k comes k + 1.
    /// Tried after ID 0 and before solving for the ID (which costs far more).
    rx_next_id: AtomicU32,
    pub sock: UdpSocket,
    /// The raw socket IPv4 packets are received from (with their IP headers), if any.
    pub raw: Option<socket2::Socket>,
    pub local: SocketAddr,
    pub qps: RwLock<HashMap<u32, Weak<qp::QpShared>>>,
    next_qpn: AtomicU32,
    timers: Mutex<Timers>,
    waker: mio::Waker,
    pub stop: AtomicBool,
    /// The receive lock: whoever holds it drains the sockets.
    rx: Mutex<sys::RxBatch>,
    /// Whether sends group equal-size packets into UDP GSO trains (cleared for good when
    /// the kernel refuses one: no checksum offload on the route's device, say).
    gso: AtomicBool,
    /// QPs whose transmissions a busy-polling application thread's receive deferred.
    deferred: Mutex<Vec<Arc<qp::QpShared>>>,
    pub(crate) has_deferred: AtomicBool,
    /// When the deferred list last went from empty to not (nanoseconds since `epoch`): the
    /// progress thread leaves a deferral to its poller for `driver::DEFER_HOLD` from then.
    pub(crate) deferred_since: AtomicU64,
    /// Set by a thread that found the receive lock taken: the holder drains once more.
    rx_poke: AtomicBool,
    gsi: Mutex<Option<Weak<dyn GsiHandler>>>,
    gsi_psn: AtomicU32,
    pub counters: DevCounters,
    /// When an application thread last drove progress from `poll_cq` (nanoseconds since
    /// `epoch`): while it busy-polls, the progress thread stops waking on the socket.
    pub last_poll: AtomicU64,
    /// Whether the progress thread has taken the sockets out of its epoll set (or is about
    /// to): a poller that goes to sleep wakes it ([`DevInner::poller_parked`]).
    pub(crate) muted: AtomicBool,
    /// Application threads asleep in `poll(2)` on the UDP socket in an inline CQ wait
    /// (`Progress::wait_fd`): they receive themselves, so the progress thread stays muted.
    pub(crate) inline_waiters: AtomicUsize,
    /// The RC counters of QPs already destroyed.
    pub retired: Mutex<crate::rc::RcStats>,
    /// The UD QPs.
    pub(crate) ud_qps: RwLock<HashMap<u32, Weak<ud::UdShared>>>,
    /// The UD counters of QPs already destroyed.
    pub(crate) ud_retired: Mutex<crate::ud::UdStats>,
    /// The multicast groups joined, by MGID.
    pub(crate) mcast: Mutex<HashMap<Gid, ud::Group>>,
    /// The progress thread's epoll, for registering group sockets (set when it starts).
    pub(crate) registry: std::sync::OnceLock<mio::Registry>,
    next_group_token: AtomicUsize,
    /// The network namespace the device was opened in (`/proc/thread-self/ns/net`), where
    /// its multicast sockets are made whichever thread attaches.
    pub(crate) netns: Option<std::fs::File>,
    impair: Option<Mutex<impair::Impair>>,
    epoch: Instant,
}

/// The timer "QP number" of the impairment's held packets (QPNs are 24 bits).
const IMPAIR_TIMER: u32 = u32::MAX;

struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Nanoseconds since `epoch` until which the progress thread sleeps; 0 while awake.
    sleep_until: u64,
}

/// The receive socket's buffer: room for bursts of Read responses (the kernel counts skb
/// overhead, about twice the payload for 1 KiB packets).
const RCVBUF: usize = 32 << 20;

/// Datagrams one `recvmmsg` takes at most (each slot holds a 64 KiB GRO train).
const RX_BATCH: usize = 16;

impl DevInner {
    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Queues QP `qpn`'s timer at `at`, waking the progress thread if it sleeps past it.
    pub(crate) fn arm_timer(&self, at: Instant, qpn: u32) {
        let mut t = self.timers.lock().unwrap();
        t.heap.push(Reverse((at, qpn)));
        let wake = t.sleep_until != 0 && self.nanos(at) < t.sleep_until;
        drop(t);
        if wake {
            let _ = self.waker.wake();
        }
    }

    /// Runs the timers due at `now`.
    fn fire_timers(&self, now: Instant) {
        loop {
            let due = {
                let mut t = self.timers.lock().unwrap();
                match t.heap.peek() {
                    Some(Reverse((at, _))) if *at <= now => t.heap.pop().map(|Reverse((_, q))| q),
                    _ => None,
                }
            };
            let Some(qpn) = due else { return };
            if qpn == IMPAIR_TIMER {
                self.release_held(now);
            } else if let Some(qp) = self.qp(qpn) {
                qp.on_timer(now);
            }
        }
    }

    /// The progress thread is about to sleep: until the next timer, or forever.
    fn sleep_deadline(&self) -> Option<Instant> {
        let mut t = self.timers.lock().unwrap();
        let next = t.heap.peek().map(|Reverse((at, _))| *at);
        t.sleep_until = next.map_or(u64::MAX, |n| self.nanos(n).max(1));
        next
    }

    /// An application thread drives progress (`poll_cq`).
    pub(crate) fn note_poll(&self) {
        self.note_poll_at(Instant::now());
    }

    /// [`DevInner::note_poll`] with the caller's clock reading.
    pub(crate) fn note_poll_at(&self, now: Instant) {
        self.last_poll.store(self.nanos(now), Ordering::Relaxed);
    }

    /// An application thread stopped polling to sleep on a CQ (`Progress::parked`): the
    /// progress thread must read the sockets again now, not at its next muted check (up to
    /// 1 ms later, which was the p50 of `bench send --lat --events` on RoCE).
    pub(crate) fn poller_parked(&self) {
        self.last_poll.store(0, Ordering::SeqCst);
        // Pairs with the progress thread's `muted` store before it reads `last_poll`:
        // either it sees the poller gone, or this sees it muted and wakes it.
        if self.muted.load(Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
    }

    /// Whether an application thread polled within `within`.
    pub(crate) fn busy_polled(&self, within: std::time::Duration) -> bool {
        let last = self.last_poll.load(Ordering::SeqCst);
        last != 0 && self.nanos(Instant::now()).saturating_sub(last) < within.as_nanos() as u64
    }

    /// How long the deferred transmissions, if any, may still wait for the poller that
    /// deferred them (zero: they are due) out of `hold`; `None` when nothing is deferred.
    pub(crate) fn deferral_left(&self, now: Instant, hold: std::time::Duration) -> Option<std::time::Duration> {
        if !self.has_deferred.load(Ordering::SeqCst) {
            return None;
        }
        let age = self
            .nanos(now)
            .saturating_sub(self.deferred_since.load(Ordering::Relaxed));
        Some(hold.saturating_sub(std::time::Duration::from_nanos(age)))
    }

    fn awake(&self) {
        self.timers.lock().unwrap().sleep_until = 0;
    }

    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<qp::QpShared>> {
        self.qps.read().unwrap().get(&qpn).and_then(Weak::upgrade)
    }

    /// [`DevInner::qp`] for the receive path: one of the RC QPs this thread received for
    /// last (up to [`RX_QP_CACHE`], held weakly: a destroyed QP's state is not kept alive by
    /// them, and while a QP lives no other QP of its device has its number), else the map
    /// (counted in `rx_qp_lookups`). A thread that drives both ends of a connection (a
    /// test, a loopback bench) receives for two QPs in turn.
    pub(crate) fn qp_cached(&self, qpn: u32) -> Option<Arc<qp::QpShared>> {
        let dev = self as *const DevInner as usize;
        let hit = LAST_RX_QPS.with_borrow(|c| {
            c.iter()
                .find(|e| e.0 == dev && e.1 == qpn)
                .and_then(|e| e.2.upgrade())
                .filter(|q| q.qpn == qpn && std::ptr::eq(Arc::as_ptr(q.dev()), self))
        });
        if hit.is_some() {
            return hit;
        }
        self.counters.rx_qp_lookups.fetch_add(1, Ordering::Relaxed);
        let q = self.qp(qpn)?;
        LAST_RX_QPS.with_borrow_mut(|c| {
            // The oldest entry goes; a stale one (same device and number) is replaced.
            let at = c.iter().position(|e| e.0 == dev && e.1 == qpn).unwrap_or(c.len() - 1);
            c[..=at].rotate_right(1);
            c[0] = (dev, qpn, Arc::downgrade(&q));
        });
        Some(q)
    }

    fn alloc_qpn(&self) -> u32 {
        loop {
            let q = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            if q > 1
                && q != crate::ud::MCAST_QPN
                && !self.qps.read().unwrap().contains_key(&q)
                && !self.ud_qps.read().unwrap().contains_key(&q)
            {
                return q;
            }
        }
    }
}
