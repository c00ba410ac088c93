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

mod driver;
pub mod impair;
mod qp;
#[allow(unsafe_code)]
mod sys;
mod ud;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use verbs::provider::{HwCounter, Provider, QpCreate, QpOps};
use verbs::{DeviceAttr, Error, Gid, InvalidArg, Mtu, PortAttr, QpType, Result};

use crate::gsi::{GsiHandler, GsiPort};
use crate::wire::{Bth, Deth, ExtHeaders, Opcode, Packet, Psn, icrc};
pub use qp::{RoceQp, inline_wakeups, qp_lock_waits};
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
/// registers its [`GsiHandler`] on it and sends MADs through its [`GsiPort`]).
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
    /// Times the progress thread found transmissions an application thread had deferred
    /// and sent them (a poller that stopped calling; before session 13 also every inline
    /// waiter that went back to sleep).
    pub progress_flushes: AtomicU64,
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

thread_local! {
    /// [`DevInner::send_parts`]'s trains and `sendmmsg` messages, kept between batches.
    static TX_MSGS: std::cell::Cell<(Vec<sys::TxMsg>, Vec<sys::TxMsg>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
    /// An empty list [`DevInner::flush_deferred`] swaps for the device's deferred one.
    static DEFERRED_SPARE: std::cell::Cell<Vec<Arc<qp::QpShared>>> = const { std::cell::Cell::new(Vec::new()) };
    /// The QPs a drain of the sockets handed packets to, kept between drains so that a
    /// poll that receives allocates nothing.
    static TOUCHED: std::cell::Cell<Vec<Arc<qp::QpShared>>> = const { std::cell::Cell::new(Vec::new()) };
}

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

    fn awake(&self) {
        self.timers.lock().unwrap().sleep_until = 0;
    }

    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<qp::QpShared>> {
        self.qps.read().unwrap().get(&qpn).and_then(Weak::upgrade)
    }

    /// The sockets the progress thread waits on: the UDP socket (everything, or with a raw
    /// socket what arrives on loopback) and the raw socket if any.
    pub(crate) fn rx_fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let mut v = vec![self.sock.as_raw_fd()];
        v.extend(self.raw.as_ref().map(|r| r.as_raw_fd()));
        v
    }

    /// Receives every queued datagram (or leaves a poke for the thread that is already
    /// doing so). Returns whether any packet was received.
    pub(crate) fn drain_rx(&self) -> bool {
        self.drain_rx_as(false)
    }

    /// [`DevInner::drain_rx`] from an application thread that busy-polls (`defer`): what
    /// the QPs have to send (ACKs above all) waits for that thread's next call or post
    /// instead of costing a system call before it sees its completion, so an ACK leaves
    /// with the reply the application posts next, in the same `sendmmsg`. The progress
    /// thread sends what is still deferred within its 1 ms muted check.
    pub(crate) fn drain_rx_as(&self, defer: bool) -> bool {
        self.flush_deferred();
        self.rx_poke.store(true, Ordering::SeqCst);
        let mut any = false;
        loop {
            let Ok(mut buf) = self.rx.try_lock() else {
                return any;
            };
            self.rx_poke.store(false, Ordering::SeqCst);
            // Reused: no allocation per receiving poll (issue 13).
            let mut touched: Vec<Arc<qp::QpShared>> = TOUCHED.take();
            // Read the clock only once something arrived: an empty poll needs no time.
            let mut now: Option<Instant> = None;
            let mut n_batch = 0;
            let sockets = [Some(self.sock.as_fd()), self.raw.as_ref().map(|r| r.as_fd())];
            for (is_raw, fd) in sockets
                .into_iter()
                .enumerate()
                .filter_map(|(i, f)| f.map(|f| (i == 1, f)))
            {
                let sock_i = usize::from(is_raw);
                loop {
                    // A socket found empty last time most likely holds one datagram next
                    // (a busy poller's ping-pong): `recvmsg` of one, which stops there,
                    // where `recvmmsg` would look for a second one in the kernel first
                    // (issue 13, session 14). Once one came, `recvmmsg` batches again.
                    // Only for an application thread (`defer`): it polls again soon, or
                    // sleeps in a level-triggered poll(2) on the socket, or parks and wakes
                    // the progress thread; the progress thread's epoll is edge-triggered,
                    // so it always drains to EAGAIN.
                    let one = defer && buf.idle[sock_i];
                    let r = if one {
                        sys::recvmsg_one_dontwait(fd, &mut buf)
                    } else {
                        sys::recvmmsg_dontwait(fd, &mut buf)
                    };
                    buf.idle[sock_i] = matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
                    let got = match r {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            // ICMP errors reported on the socket (port unreachable): nothing
                            // to read, the RC timers deal with the lost peer.
                            tracing::debug!(device = %self.cfg.name, error = %e, "recvmmsg");
                            continue;
                        }
                    };
                    any = true;
                    let now = *now.get_or_insert_with(Instant::now);
                    self.counters.rx_syscalls.fetch_add(1, Ordering::Relaxed);
                    if defer {
                        self.counters.rx_polled.fetch_add(got as u64, Ordering::Relaxed);
                    }
                    if one {
                        self.counters.rx_single.fetch_add(1, Ordering::Relaxed);
                    }
                    self.counters.rx_datagrams.fetch_add(got as u64, Ordering::Relaxed);
                    for i in 0..got {
                        let Some(d) = buf.data(i) else {
                            // Longer than a slot: no RoCEv2 packet or train is.
                            self.counters.rcvd_pkts.fetch_add(1, Ordering::Relaxed);
                            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                            continue;
                        };
                        // Packets, not datagrams: a GRO train holds up to 64.
                        n_batch += match buf.seg[i] {
                            0 => 1,
                            seg => d.len().div_ceil(usize::from(seg)),
                        };
                        if is_raw {
                            self.on_ip_datagram(now, d, &mut touched);
                        } else if let Ok(from) = buf.from(i) {
                            match buf.seg[i] {
                                0 => {
                                    self.on_datagram(now, from, self.local.ip(), Rx::Solve, buf.ip[i], d, &mut touched)
                                }
                                seg => self.on_train(now, from, usize::from(seg), buf.ip[i], d, &mut touched),
                            }
                        }
                        // Let ACKs and responses out now and then during a long burst (every
                        // 64 packets or so, not only after a whole `recvmmsg` of up to 16
                        // trains: a requester whose window is full waits for them).
                        if n_batch >= 64 {
                            n_batch = 0;
                            for q in touched.drain(..) {
                                q.service_locked();
                            }
                        }
                    }
                    // After a single datagram too: looking for another costs the
                    // ping-pong a system call before it sees its message; the next poll
                    // (or the progress thread's level-triggered wake-up) batches the rest.
                    if one || got < RX_BATCH {
                        break;
                    }
                }
            }
            any |= self.drain_groups(&mut buf);
            drop(buf);
            if touched.is_empty() {
                // Nothing to deliver or defer: an empty poll takes no further lock.
            } else if defer {
                for q in &touched {
                    q.deliver_locked();
                }
                let mut d = self.deferred.lock().unwrap();
                for q in touched.drain(..) {
                    if !d.iter().any(|t| Arc::ptr_eq(t, &q)) {
                        d.push(q);
                    }
                }
                self.has_deferred.store(!d.is_empty(), Ordering::Release);
            } else {
                for q in touched.drain(..) {
                    q.service_locked();
                }
            }
            TOUCHED.set(touched);
            if !self.rx_poke.load(Ordering::SeqCst) {
                return any;
            }
        }
    }

    /// Sends what [`DevInner::drain_rx_as`] deferred.
    pub(crate) fn flush_deferred(&self) {
        if !self.has_deferred.swap(false, Ordering::AcqRel) {
            return;
        }
        // Swapped with this thread's spare list, which it keeps once emptied: whichever
        // thread flushes (the poller or the progress thread), the next deferral finds room
        // and nothing is allocated per round trip.
        let mut qs = DEFERRED_SPARE.take();
        std::mem::swap(&mut qs, &mut *self.deferred.lock().unwrap());
        for q in qs.drain(..) {
            q.service_locked();
        }
        DEFERRED_SPARE.set(qs);
    }

    /// Whether `q`'s transmissions are deferred.
    pub(crate) fn is_deferred(&self, q: &qp::QpShared) -> bool {
        self.has_deferred.load(Ordering::Acquire)
            && self
                .deferred
                .lock()
                .unwrap()
                .iter()
                .any(|t| std::ptr::eq(Arc::as_ptr(t), q))
    }

    /// An IPv4 datagram from the raw socket (the filter passed only UDP to our address and
    /// port 4791): the ICRC is checked against the headers it came with.
    fn on_ip_datagram(&self, now: Instant, d: &[u8], touched: &mut Vec<Arc<qp::QpShared>>) {
        const IP: usize = 20;
        const UDP: usize = 8;
        if d.len() < IP + UDP || d[0] != 0x45 {
            // Not IPv4, or IPv4 with options, which rxe's ICRC does not cover.
            self.counters.rcvd_pkts.fetch_add(1, Ordering::Relaxed);
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let udp_len = usize::from(u16::from_be_bytes([d[IP + 4], d[IP + 5]]));
        if udp_len < UDP || IP + udp_len > d.len() {
            self.counters.rcvd_pkts.fetch_add(1, Ordering::Relaxed);
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let src = Ipv4Addr::new(d[12], d[13], d[14], d[15]);
        let sport = u16::from_be_bytes([d[IP], d[IP + 1]]);
        let from = SocketAddr::new(IpAddr::V4(src), sport);
        let dst = Ipv4Addr::new(d[16], d[17], d[18], d[19]);
        self.on_datagram(
            now,
            from,
            IpAddr::V4(dst),
            Rx::Headers(&d[..IP], &d[IP..IP + UDP]),
            None,
            &d[IP + UDP..IP + udp_len],
            touched,
        );
    }

    /// A GSO/GRO train from the UDP socket: RoCEv2 packets of `seg` octets back to back
    /// (the last may be shorter). Every packet's ICRC is checked. IPv4: the sender's kernel
    /// gives the segments of one GSO send consecutive IDs from the first one's, which is 0
    /// on an unconnected DF socket (ours), so a train whose first packet verifies with ID 0
    /// is ours and packet k must verify with ID k exactly; any other train (a GRO merge of a
    /// foreign sender's packets) has each packet's ID solved for, as single datagrams from
    /// the UDP socket do.
    fn on_train(
        &self,
        now: Instant,
        from: SocketAddr,
        seg: usize,
        ip: Option<sys::RxIp>,
        d: &[u8],
        touched: &mut Vec<Arc<qp::QpShared>>,
    ) {
        let dst = self.local.ip();
        let mut ours = None;
        for (k, pkt) in d.chunks(seg).enumerate() {
            let how = match (from.ip(), dst, ours) {
                (IpAddr::V4(_), IpAddr::V4(_), None) => {
                    // The check that tells whose train it is, is the first packet's ICRC
                    // check too: one pass, not two (it was checked again with ID 0).
                    self.counters
                        .icrc_rx_octets
                        .fetch_add(pkt.len() as u64, Ordering::Relaxed);
                    let is_ours = icrc_verify_id(from.ip(), dst, from.port(), crate::wire::ROCEV2_UDP_PORT, 0, pkt);
                    ours = Some(is_ours);
                    if is_ours { Rx::Checked } else { Rx::Solve }
                }
                (IpAddr::V4(_), IpAddr::V4(_), Some(true)) => Rx::Id(k as u16),
                _ => Rx::Solve,
            };
            self.on_datagram(now, from, dst, how, ip, pkt, touched);
        }
    }

    /// One RoCEv2 packet (a UDP payload) from `from` to `dst` (our address or a multicast
    /// group), its ICRC checked as `rx` says; `ip` is its TTL and TOS when a UDP socket
    /// reported them (a UD receive's GRH shows them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_datagram(
        &self,
        now: Instant,
        from: SocketAddr,
        dst: IpAddr,
        rx: Rx<'_>,
        ip: Option<sys::RxIp>,
        pkt: &[u8],
        touched: &mut Vec<Arc<qp::QpShared>>,
    ) {
        self.counters.rcvd_pkts.fetch_add(1, Ordering::Relaxed);
        let sport = from.port();
        let dport = crate::wire::ROCEV2_UDP_PORT;
        let crc_pass = || {
            self.counters
                .icrc_rx_octets
                .fetch_add(pkt.len() as u64, Ordering::Relaxed);
        };
        let (ok, ip_hdr) = match rx {
            Rx::Headers(ip, udp) => {
                crc_pass();
                (icrc::verify(ip, udp, pkt).is_ok(), Some(ip))
            }
            Rx::Solve => (self.check_single(from.ip(), dst, sport, dport, pkt), None),
            Rx::Id(id) => {
                crc_pass();
                (icrc_verify_id(from.ip(), dst, sport, dport, id, pkt), None)
            }
            Rx::Checked => (true, None),
        };
        if !ok {
            self.counters.icrc_err.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let p = match Packet::parse(pkt) {
            Ok(p) => p,
            Err(e) => {
                tracing::trace!(device = %self.cfg.name, error = %e, "malformed packet dropped");
                self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let dqp = p.bth.dest_qp;
        if dqp == 1 {
            self.on_gsi(from, &p);
            return;
        }
        if p.ext.deth.is_some() {
            // UD: one QP, or every QP attached to the group the datagram came to.
            let targets: Vec<Arc<ud::UdShared>> = if dqp == crate::ud::MCAST_QPN {
                let m = self.mcast.lock().unwrap();
                m.values()
                    .filter(|g| g.addr == dst)
                    .flat_map(|g| g.members.iter().filter_map(|&q| self.ud_qp(q)))
                    .collect()
            } else {
                self.ud_qp(dqp).into_iter().collect()
            };
            if targets.is_empty() {
                self.counters.unknown_qp.fetch_add(1, Ordering::Relaxed);
            } else {
                self.on_ud_packet(from, dst, ip_hdr, ip, pkt.len(), &p, &targets);
            }
            return;
        }
        // A QP this drain already handed packets to (a train's later packets, a burst of
        // Writes): no map lookup, no reference count traffic per packet (issue 13).
        if let Some(q) = touched.iter().find(|t| t.qpn == dqp) {
            q.on_packet(now, &p);
            return;
        }
        match self.qp(dqp) {
            Some(q) => {
                q.on_packet(now, &p);
                if !touched.iter().any(|t| Arc::ptr_eq(t, &q)) {
                    touched.push(q);
                }
            }
            None => {
                self.counters.unknown_qp.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The ICRC check of a single datagram from a UDP socket: ID 0 (our unsegmented
    /// packets), then the ID after the last one solved (the next segment of a train the
    /// kernel segmented), then solved for (rxe's hashed IDs).
    fn check_single(&self, src: IpAddr, dst: IpAddr, sport: u16, dport: u16, pkt: &[u8]) -> bool {
        let guess = self.rx_next_id.load(Ordering::Relaxed) as u16;
        let crc_pass = || {
            self.counters
                .icrc_rx_octets
                .fetch_add(pkt.len() as u64, Ordering::Relaxed);
        };
        if guess != 0 && src.is_ipv4() {
            if icrc_verify_id(src, dst, sport, dport, guess, pkt) {
                crc_pass();
                let next = if usize::from(guess) + 1 < sys::GSO_MAX_SEGS {
                    guess + 1
                } else {
                    0
                };
                self.rx_next_id.store(u32::from(next), Ordering::Relaxed);
                return true;
            }
            // A pass spent on the wrong ID (a single datagram after a train): counted apart
            // from the one pass per packet.
            self.counters.icrc_rx_id_retries.fetch_add(1, Ordering::Relaxed);
        }
        crc_pass();
        match icrc_check(src, dst, sport, dport, pkt) {
            Ok(id) => {
                let next = if usize::from(id) + 1 < sys::GSO_MAX_SEGS {
                    id + 1
                } else {
                    0
                };
                self.rx_next_id.store(u32::from(next), Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    fn on_gsi(&self, from: SocketAddr, p: &Packet<'_>) {
        let ok = p.bth.opcode == Opcode::UD_SEND_ONLY
            && p.bth.p_key & 0x7fff == 0x7fff
            && p.ext.deth.is_some_and(|d| d.q_key == crate::gsi::GSI_QKEY);
        if !ok {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let h = self.gsi.lock().unwrap().as_ref().and_then(Weak::upgrade);
        if let (Some(h), Some(d)) = (h, p.ext.deth) {
            h.on_mad(Gid::from_ip(from.ip()), d.src_qp, p.bth.p_key, p.payload);
        }
    }

    /// Seals the ICRC of `pkt` (the ICRC field is its last four octets) and sends it,
    /// through the impairment if the device has one.
    pub(crate) fn send_packet(&self, to: SocketAddr, pkt: &mut [u8]) {
        if icrc_seal(self.local.ip(), to.ip(), self.local.port(), to.port(), 0, pkt).is_err() {
            self.counters.send_err.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(im) = &self.impair else {
            self.send_raw(to, pkt);
            return;
        };
        let now = Instant::now();
        let mut g = im.lock().unwrap();
        let due = g.due(now);
        let v = g.judge(now, pkt);
        let mut now_send = 0;
        if !v.drop {
            if let Some(b) = v.corrupt_bit {
                let at = pkt.len() - crate::wire::ICRC_LEN + usize::from(b / 8);
                pkt[at] ^= 1 << (b % 8);
            }
            let copies = if v.dup { 2 } else { 1 };
            match v.hold_until {
                Some(at) => (0..copies).for_each(|_| g.hold(at, to, pkt)),
                None => now_send = copies,
            }
        }
        let next = v.hold_until.and(g.next_due());
        drop(g);
        for (t, p) in due {
            self.send_raw(t, &p);
        }
        for _ in 0..now_send {
            self.send_raw(to, pkt);
        }
        if let Some(n) = next {
            self.arm_timer(n, IMPAIR_TIMER);
        }
    }

    /// Seals and sends a batch of packets to `to`, or one by one through the impairment if
    /// the device has one. Runs of equal-size packets (the last of a run may be shorter)
    /// go as one UDP GSO train each (`UDP_SEGMENT`), all trains in one `sendmmsg`: one
    /// crossing of the kernel and, on loopback, one skb per train. IPv4: Linux gives the
    /// segments of a GSO send on an unconnected DF socket IDs 0, 1, 2, … (the datagram gets
    /// ID 0, segmentation counts up from it), so packet k of a train is sealed with ID k,
    /// the ID it carries on the wire.
    pub(crate) fn send_batch(&self, to: SocketAddr, pkts: &mut [&mut [u8]]) {
        self.send_batch_with(to, pkts, None)
    }

    /// [`Self::send_batch`] with an address handle's TTL/hop limit and TOS/traffic class on
    /// every packet (UD). The impairment path (test fault injection) sends with the
    /// socket's defaults.
    pub(crate) fn send_batch_with(&self, to: SocketAddr, pkts: &mut [&mut [u8]], ip: Option<sys::IpFields>) {
        if self.impair.is_some() {
            for p in pkts.iter_mut() {
                self.send_packet(to, p);
            }
            return;
        }
        // Not to multicast groups: their sockets take no trains.
        let gso = self.gso.load(Ordering::Relaxed) && !to.ip().is_multicast();
        let msgs = gso_trains(pkts.iter().map(|p| p.len()), gso);
        for m in &msgs {
            for (k, p) in pkts[m.first..m.first + m.count].iter_mut().enumerate() {
                if icrc_seal(self.local.ip(), to.ip(), self.local.port(), to.port(), k as u16, p).is_err() {
                    // Cannot happen for packets the core built; the peer sees a bad ICRC.
                    self.counters.send_err.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let sa = socket2::SockAddr::from(to);
        let refs: Vec<&[u8]> = pkts.iter().map(|p| &**p).collect();
        let r = sys::sendmmsg_gso(self.sock.as_fd(), &sa, &refs, &msgs, ip);
        if let Some(first) = self.after_sendmmsg(to, &msgs, pkts.len(), r) {
            // The kernel takes no GSO on this route: send the rest one packet per datagram,
            // each sealed with ID 0.
            drop(refs);
            let rest = &mut pkts[first..];
            for p in rest.iter_mut() {
                let _ = icrc_seal(self.local.ip(), to.ip(), self.local.port(), to.port(), 0, p);
            }
            let refs: Vec<&[u8]> = rest.iter().map(|p| &**p).collect();
            let singles = gso_trains(refs.iter().map(|p| p.len()), false);
            let n = match sys::sendmmsg_gso(self.sock.as_fd(), &sa, &refs, &singles, ip) {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(device = %self.cfg.name, error = %e, %to, "sendmmsg");
                    0
                }
            };
            self.counters.sent_pkts.fetch_add(n as u64, Ordering::Relaxed);
            self.counters.tx_datagrams.fetch_add(n as u64, Ordering::Relaxed);
            self.counters.tx_syscalls.fetch_add(1, Ordering::Relaxed);
            self.counters
                .send_err
                .fetch_add((refs.len() - n) as u64, Ordering::Relaxed);
        }
    }

    /// Counts what one `sendmmsg` of `msgs` (over `pkts` packets) sent. On a failure: when
    /// the first unsent datagram was a GSO train the kernel refused, turns GSO off for the
    /// device and returns that datagram's first packet, which the caller sends again as
    /// single datagrams; any other failure counts the unsent packets as send errors (lost
    /// like dropped frames: the RC retransmission recovers) and returns `None`.
    fn after_sendmmsg(&self, to: SocketAddr, msgs: &[sys::TxMsg], pkts: usize, r: io::Result<usize>) -> Option<usize> {
        let (sent_msgs, err) = match r {
            Ok(n) if n == msgs.len() => (n, None),
            Ok(n) => (n, Some(io::Error::other("short sendmmsg"))),
            Err(e) => (0, Some(e)),
        };
        let sent: usize = msgs[..sent_msgs].iter().map(|m| m.count).sum();
        self.counters.sent_pkts.fetch_add(sent as u64, Ordering::Relaxed);
        self.counters
            .tx_datagrams
            .fetch_add(sent_msgs as u64, Ordering::Relaxed);
        self.counters.tx_syscalls.fetch_add(1, Ordering::Relaxed);
        let e = err?;
        let failed = msgs[sent_msgs];
        let refused = matches!(
            e.raw_os_error(),
            Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT)
        );
        if failed.count > 1 && refused {
            tracing::info!(device = %self.cfg.name, error = %e, %to, "UDP GSO refused: single datagrams from now on");
            self.gso.store(false, Ordering::Relaxed);
            return Some(failed.first);
        }
        tracing::debug!(device = %self.cfg.name, error = %e, %to, "sendmmsg");
        self.counters
            .send_err
            .fetch_add((pkts - sent) as u64, Ordering::Relaxed);
        None
    }

    /// Seals and sends RC packets whose payloads stay in registered memory (issue 13: Send
    /// from the MR): each packet is its headers, its payload pieces and a trailer (pad and
    /// ICRC) as iovecs of one `sendmmsg`, runs of equal-size packets as GSO trains as in
    /// [`Self::send_batch`]. The ICRC is computed over the region's octets; the kernel
    /// copies them into its skbs during the call (the only copy on the send side). Through
    /// the impairment (tests' fault injection) each packet is first laid out in a buffer.
    pub(crate) fn send_parts(&self, to: SocketAddr, pkts: &[TxParts<'_>]) {
        if self.impair.is_some() || !self.gso.load(Ordering::Relaxed) {
            let mut flat: Vec<Vec<u8>> = pkts.iter().map(TxParts::flatten).collect();
            let mut refs: Vec<&mut [u8]> = flat.iter_mut().map(|v| &mut v[..]).collect();
            self.send_batch(to, &mut refs);
            return;
        }
        // The train and message lists are the thread's, kept between batches (no allocation
        // per `sendmmsg`, issue 13); taken out, so a nested send finds empty ones.
        let (mut msgs, mut imsgs) = TX_MSGS.take();
        gso_trains_into(pkts.iter().map(TxParts::len), !to.ip().is_multicast(), &mut msgs);
        imsgs.clear();
        // Pad (0-3 octets) and ICRC of each packet; a batch is at most qp::BATCH packets.
        let mut on_stack = [[0u8; 8]; qp::BATCH];
        let mut on_heap = Vec::new();
        let trailers: &mut [[u8; 8]] = if pkts.len() <= qp::BATCH {
            &mut on_stack[..pkts.len()]
        } else {
            on_heap.resize(pkts.len(), [0u8; 8]);
            &mut on_heap
        };
        for m in &msgs {
            for (k, (p, t)) in pkts[m.first..m.first + m.count]
                .iter()
                .zip(&mut trailers[m.first..m.first + m.count])
                .enumerate()
            {
                let pad = usize::from(crate::wire::segment::pad_count(p.payload_len));
                let len = p.len();
                let mut ipb = [0u8; 40];
                let ip = ip_header(self.local.ip(), to.ip(), len, k as u16, &mut ipb);
                let udp = icrc::udp_header(self.local.port(), to.port(), len);
                self.counters.icrc_tx_octets.fetch_add(len as u64, Ordering::Relaxed);
                let crc = icrc::compute_parts(
                    ip,
                    &udp,
                    p.hdr,
                    p.payload_len,
                    |f| {
                        for pc in p.pieces {
                            // In bounds: checked when the WR was posted or the Read arrived.
                            if pc.len <= SMALL_PIECE {
                                // A small payload (a ping-pong's): one read, no 4 KiB bounce
                                // buffer to clear.
                                let mut b = [0u8; SMALL_PIECE];
                                let _ = pc.buf.read(pc.off, &mut b[..pc.len]);
                                f(&b[..pc.len]);
                            } else {
                                let _ = pc.buf.scan(pc.off, pc.len, &mut *f);
                            }
                        }
                    },
                    pad,
                );
                match crc {
                    Ok(c) => t[pad..pad + 4].copy_from_slice(&c.to_le_bytes()),
                    Err(_) => {
                        self.counters.send_err.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let mut iov = sys::TxIov::default();
        for m in &msgs {
            let first = iov.len();
            for (p, t) in pkts[m.first..m.first + m.count]
                .iter()
                .zip(&trailers[m.first..m.first + m.count])
            {
                iov.push(p.hdr);
                for pc in p.pieces {
                    if iov.push_region(&pc.buf, pc.off, pc.len).is_err() {
                        // Cannot happen: checked at post time; the peer sees a bad ICRC.
                        self.counters.send_err.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let pad = usize::from(crate::wire::segment::pad_count(p.payload_len));
                iov.push(&t[..pad + 4]);
            }
            imsgs.push(sys::TxMsg {
                first,
                count: iov.len() - first,
                seg: if m.count > 1 { m.seg } else { 0 },
            });
        }
        let sa = socket2::SockAddr::from(to);
        let r = sys::sendmmsg_iov(self.sock.as_fd(), &sa, &mut iov, &imsgs, None);
        drop(iov);
        let resend = self.after_sendmmsg(to, &msgs, pkts.len(), r);
        TX_MSGS.set((msgs, imsgs));
        if let Some(first) = resend {
            // GSO is off now: single datagrams, laid out and sealed with ID 0 by `send_batch`.
            self.send_parts(to, &pkts[first..]);
        }
    }

    /// Sends the held packets that are due.
    fn release_held(&self, now: Instant) {
        let Some(im) = &self.impair else { return };
        let mut g = im.lock().unwrap();
        let due = g.due(now);
        let next = g.next_due();
        drop(g);
        for (t, p) in due {
            self.send_raw(t, &p);
        }
        if let Some(n) = next {
            self.arm_timer(n, IMPAIR_TIMER);
        }
    }

    fn send_raw(&self, to: SocketAddr, pkt: &[u8]) {
        self.counters.tx_syscalls.fetch_add(1, Ordering::Relaxed);
        match self.sock.send_to(pkt, to) {
            Ok(_) => {
                self.counters.sent_pkts.fetch_add(1, Ordering::Relaxed);
                self.counters.tx_datagrams.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                // Lost like a dropped frame: the RC retransmission recovers.
                tracing::debug!(device = %self.cfg.name, error = %e, %to, "sendto");
                self.counters.send_err.fetch_add(1, Ordering::Relaxed);
            }
        }
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

/// The raw `IPPROTO_UDP` socket that receives the device's IPv4 datagrams with their IP
/// headers (see [`IcrcRx::Raw`]).
fn raw_socket(addr: Ipv4Addr) -> io::Result<socket2::Socket> {
    let r = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::UDP))?;
    sys::attach_filter(
        r.as_fd(),
        &sys::rocev2_ipv4_filter_not_lo(addr, crate::wire::ROCEV2_UDP_PORT),
    )?;
    if sys::set_rcvbuf_force(r.as_fd(), RCVBUF).is_err() {
        let _ = r.set_recv_buffer_size(RCVBUF);
    }
    r.bind(&SocketAddr::new(IpAddr::V4(addr), 0).into())?;
    // A raw socket receives every UDP datagram of the host from its creation until the
    // filter is attached: drop what queued in that window (other devices' traffic), or a
    // fresh device counts foreign packets as its own.
    r.set_nonblocking(true)?;
    let mut junk = [std::mem::MaybeUninit::<u8>::uninit(); 64];
    while r.recv(&mut junk).is_ok() {}
    Ok(r)
}

/// Pieces of payload up to this long are read for the ICRC in one copy to the stack.
const SMALL_PIECE: usize = 256;

/// One RC packet to send with its payload where it is ([`DevInner::send_parts`]).
pub(crate) struct TxParts<'a> {
    /// BTH and extension headers.
    pub hdr: &'a [u8],
    /// The payload's pieces of registered memory, in order.
    pub pieces: &'a [crate::rc::Piece],
    /// Their total length.
    pub payload_len: usize,
}

impl TxParts<'_> {
    /// No packet (fills a batch's unused slots).
    pub(crate) const EMPTY: TxParts<'static> = TxParts {
        hdr: &[],
        pieces: &[],
        payload_len: 0,
    };

    /// The UDP payload's length: headers, payload, pad, ICRC.
    pub(crate) fn len(&self) -> usize {
        self.hdr.len()
            + self.payload_len
            + usize::from(crate::wire::segment::pad_count(self.payload_len))
            + crate::wire::ICRC_LEN
    }

    /// The packet laid out in one buffer (ICRC field 0), for the paths that send packets
    /// whole (fault injection, routes without GSO).
    pub(crate) fn flatten(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        v[..self.hdr.len()].copy_from_slice(self.hdr);
        let mut at = self.hdr.len();
        for pc in self.pieces {
            let _ = pc.buf.read(pc.off, &mut v[at..at + pc.len]);
            at += pc.len;
        }
        v
    }
}

/// How the sockets' datagrams go into trains: runs of equal-size packets (the last of a run
/// may be shorter), at most [`sys::GSO_MAX_SEGS`] packets and [`sys::GSO_MAX_BYTES`] octets
/// each; every packet alone without `gso`.
pub(crate) fn gso_trains(lens: impl IntoIterator<Item = usize>, gso: bool) -> Vec<sys::TxMsg> {
    let mut out = Vec::new();
    gso_trains_into(lens, gso, &mut out);
    out
}

/// [`gso_trains`] into `out` (cleared first), which keeps its capacity.
pub(crate) fn gso_trains_into(lens: impl IntoIterator<Item = usize>, gso: bool, out: &mut Vec<sys::TxMsg>) {
    out.clear();
    // Whether the last train is closed (its last packet was shorter than its segments).
    let mut closed = true;
    let mut bytes = 0;
    for (i, len) in lens.into_iter().enumerate() {
        if gso
            && !closed
            && let Some(m) = out.last_mut()
            && len <= usize::from(m.seg)
            && m.count < sys::GSO_MAX_SEGS
            && bytes + len <= sys::GSO_MAX_BYTES
        {
            m.count += 1;
            bytes += len;
            closed = len < usize::from(m.seg);
            continue;
        }
        out.push(sys::TxMsg {
            first: i,
            count: 1,
            seg: len.min(usize::from(u16::MAX)) as u16,
        });
        bytes = len;
        closed = false;
    }
}

/// The IP header the ICRC covers, as Linux sends a datagram of `payload_len` UDP payload
/// octets from an unconnected socket with DF (IPv4 ID `id`: 0, or k for the k-th segment of
/// a GSO train).
fn ip_header(src: IpAddr, dst: IpAddr, payload_len: usize, id: u16, out: &mut [u8; 40]) -> &[u8] {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out[..20].copy_from_slice(&icrc::ipv4_header(s.octets(), d.octets(), id, payload_len));
            &out[..20]
        }
        _ => {
            let s = to_v6(src);
            let d = to_v6(dst);
            out.fill(0);
            out[0] = 0x60;
            out[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
            out[6] = 17;
            out[7] = 64;
            out[8..24].copy_from_slice(&s.octets());
            out[24..40].copy_from_slice(&d.octets());
            &out[..40]
        }
    }
}

fn to_v6(a: IpAddr) -> std::net::Ipv6Addr {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped(),
        IpAddr::V6(v) => v,
    }
}

fn icrc_seal(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    id: u16,
    pkt: &mut [u8],
) -> std::result::Result<u32, icrc::IcrcError> {
    let mut ipb = [0u8; 40];
    let ip = ip_header(src, dst, pkt.len(), id, &mut ipb);
    let udp = icrc::udp_header(sport, dport, pkt.len());
    icrc::seal(ip, &udp, pkt)
}

fn icrc_check(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    pkt: &[u8],
) -> std::result::Result<u16, icrc::IcrcError> {
    let mut ipb = [0u8; 40];
    let ip = ip_header(src, dst, pkt.len(), 0, &mut ipb);
    let udp = icrc::udp_header(sport, dport, pkt.len());
    // rxe sends IPv4 with a hashed random ID, which a UDP socket does not show: solve for it
    // (ID 0, what our own devices send, is the first case).
    icrc::verify_any_ipv4_id(ip, &udp, pkt)
}

/// Whether `pkt`'s ICRC verifies with IPv4 ID `id` (the ID is not looked at for IPv6).
fn icrc_verify_id(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, id: u16, pkt: &[u8]) -> bool {
    let mut ipb = [0u8; 40];
    let ip = ip_header(src, dst, pkt.len(), id, &mut ipb);
    let udp = icrc::udp_header(sport, dport, pkt.len());
    icrc::verify(ip, &udp, pkt).is_ok()
}

/// How a received packet's ICRC is checked.
#[derive(Clone, Copy)]
pub(crate) enum Rx<'a> {
    /// Against the IP and UDP headers it arrived in (the raw socket).
    Headers(&'a [u8], &'a [u8]),
    /// From a UDP socket: IPv4 ID 0, else the ID solved for ([`icrc::verify_any_ipv4_id`]).
    Solve,
    /// From a UDP socket, packet of a GSO train: exactly this IPv4 ID.
    Id(u16),
    /// Already checked: the first packet of a train, whose check with ID 0 told that the
    /// train is ours ([`DevInner::on_train`]).
    Checked,
}

/// The RoCEv2 provider: what [`verbs::Device`] calls.
pub struct RoceProvider {
    inner: Arc<DevInner>,
}

impl RoceProvider {
    /// Binds `cfg.addr`:4791 and starts the progress thread.
    pub fn new(cfg: RoceConfig) -> io::Result<RoceProvider> {
        let local = SocketAddr::new(cfg.addr, crate::wire::ROCEV2_UDP_PORT);
        let s = socket2::Socket::new(
            socket2::Domain::for_address(local),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        if cfg.addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        let _ = s.set_send_buffer_size(4 << 20);
        if sys::set_rcvbuf_force(s.as_fd(), RCVBUF).is_err() {
            let _ = s.set_recv_buffer_size(RCVBUF);
        }
        sys::set_pmtudisc_do(s.as_fd(), cfg.addr.is_ipv6())?;
        if let Err(e) = sys::set_recv_ip_fields(s.as_fd(), cfg.addr.is_ipv6()) {
            tracing::info!(device = %cfg.name, error = %e, "no IP TTL/TOS on receive: UD GRHs show TTL 64, TOS 0");
        }
        // Multicast UD sends leave from the device's interface (loopback copies to the
        // host's other devices: IP_MULTICAST_LOOP, on by default).
        match cfg.addr {
            IpAddr::V4(a) => s.set_multicast_if_v4(&a)?,
            IpAddr::V6(a) => {
                if let Ok(idx) = sys::ifindex_of_v6(a) {
                    s.set_multicast_if_v6(idx)?;
                }
            }
        }
        s.bind(&local.into())?;
        let raw = match (cfg.addr, cfg.icrc_rx) {
            // A loopback address receives nothing from another interface, and the raw
            // socket's filter passes only that: with `auto` it would cost a clone of every
            // UDP packet to the address and an empty `recvmmsg` per drain, for nothing.
            (IpAddr::V4(a), IcrcRx::Auto) if a.is_loopback() => None,
            (IpAddr::V4(a), IcrcRx::Auto | IcrcRx::Raw) => match raw_socket(a) {
                Ok(r) => {
                    // The UDP socket keeps what arrives on loopback and the IDs of GSO
                    // trains: a train that crosses loopback or a veth reaches the raw socket
                    // unsegmented, and only the UDP socket segments it (or is told its
                    // segment size).
                    sys::attach_filter(s.as_fd(), &sys::udp_filter_beside_raw())?;
                    Some(r)
                }
                Err(e) if cfg.icrc_rx == IcrcRx::Raw => return Err(e),
                Err(e) => {
                    tracing::info!(
                        device = %cfg.name, error = %e,
                        "no raw socket: the IPv4 ID of each ICRC is solved for (weaker check)"
                    );
                    None
                }
            },
            _ => None,
        };
        // UDP_GRO: trains arrive whole with their segment size (one receive per train). Not
        // with a raw socket on a non-loopback address: GRO on a real interface would merge
        // the raw socket's packets too, and it cannot split them.
        if (raw.is_none() || cfg.addr.is_loopback())
            && let Err(e) = sys::set_udp_gro(s.as_fd())
        {
            tracing::info!(device = %cfg.name, error = %e, "no UDP_GRO: trains arrive segmented");
        }
        let sock: UdpSocket = s.into();
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), driver::WAKER)?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x1234, |d| d.subsec_nanos());
        // A start that differs between devices and runs (as rxe's pool index does not), over
        // all 24 bits: with 12 bits, two devices of one process shared QPNs once in 4,096.
        let first_qpn = cfg.qpn_base.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x1234, |d| d.as_nanos() as u64);
            let h = (t ^ u64::from(std::process::id()) << 32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (h >> 40) as u32
        });
        let cfg_impair = cfg.impair;
        let cfg_gso = cfg.gso;
        let inner = Arc::new(DevInner {
            cfg,
            sock,
            raw,
            local,
            qps: RwLock::new(HashMap::new()),
            next_qpn: AtomicU32::new(first_qpn & 0x00ff_ffff),
            timers: Mutex::new(Timers {
                heap: BinaryHeap::new(),
                sleep_until: 0,
            }),
            waker,
            stop: AtomicBool::new(false),
            rx: Mutex::new(sys::RxBatch::new(RX_BATCH)),
            gso: AtomicBool::new(cfg_gso),
            deferred: Mutex::new(Vec::new()),
            has_deferred: AtomicBool::new(false),
            rx_poke: AtomicBool::new(false),
            gsi: Mutex::new(None),
            gsi_psn: AtomicU32::new(seed & 0x00ff_ffff),
            counters: DevCounters::default(),
            last_poll: AtomicU64::new(0),
            muted: AtomicBool::new(false),
            inline_waiters: AtomicUsize::new(0),
            retired: Mutex::new(crate::rc::RcStats::default()),
            ud_qps: RwLock::new(HashMap::new()),
            ud_retired: Mutex::new(crate::ud::UdStats::default()),
            mcast: Mutex::new(HashMap::new()),
            registry: std::sync::OnceLock::new(),
            next_group_token: AtomicUsize::new(0),
            rx_next_id: AtomicU32::new(0),
            netns: std::fs::File::open("/proc/thread-self/ns/net").ok(),
            impair: cfg_impair.map(|c| Mutex::new(impair::Impair::new(c))),
            epoch: Instant::now(),
        });
        driver::start(poll, &inner)?;
        Ok(RoceProvider { inner })
    }

    /// The address the device is bound to (port 4791).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local
    }
}

impl Drop for RoceProvider {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        let _ = self.inner.waker.wake();
    }
}

impl RoceProvider {
    /// The RC counters summed over every QP the device has had.
    fn rc_totals(&self) -> crate::rc::RcStats {
        let mut t = self.inner.retired.lock().unwrap().clone();
        let qps: Vec<_> = self
            .inner
            .qps
            .read()
            .unwrap()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for q in qps {
            t.add(&q.stats());
        }
        t
    }
}

impl Provider for RoceProvider {
    fn query_device(&self) -> DeviceAttr {
        device_attr()
    }

    /// rxe's `hw_counters` where the meaning is the same, then softrdma's own.
    fn query_counters(&self) -> Vec<HwCounter> {
        let c = &self.inner.counters;
        let rc = self.rc_totals();
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut v = vec![
            ("sent_pkts", ld(&c.sent_pkts)),
            ("rcvd_pkts", ld(&c.rcvd_pkts)),
            ("duplicate_request", rc.duplicate_requests),
            ("out_of_seq_request", rc.out_of_sequence_dropped),
            ("rcvd_rnr_err", rc.rnr_naks_received),
            ("send_rnr_err", rc.rnr_naks_sent),
            ("rcvd_seq_err", rc.seq_naks_received),
            (
                "completer_retry_err",
                rc.ack_timeouts + rc.seq_naks_received + rc.implied_naks,
            ),
            ("retry_exceeded_err", ld(&c.retry_exceeded_err)),
            ("retry_rnr_exceeded_err", ld(&c.retry_rnr_exceeded_err)),
            ("send_err", ld(&c.send_err)),
            ("icrc_err", ld(&c.icrc_err)),
            // Octets covered by ICRC passes on receive and on the send-from-memory path: one
            // pass per packet each (tests/copies_per_octet.rs).
            ("icrc_rx_octets", ld(&c.icrc_rx_octets)),
            ("icrc_tx_octets", ld(&c.icrc_tx_octets)),
            ("icrc_rx_id_retries", ld(&c.icrc_rx_id_retries)),
            ("retransmitted_pkts", rc.retransmitted_packets),
            ("ack_timeouts", rc.ack_timeouts),
            ("implied_naks", rc.implied_naks),
            ("send_seq_err", rc.seq_naks_sent),
            ("duplicate_response", rc.duplicate_responses),
            ("ghost_response", rc.ghost_responses),
            ("malformed_pkts", ld(&c.malformed)),
            ("unknown_qp_pkts", ld(&c.unknown_qp)),
            ("misdirected_pkts", rc.misdirected_dropped),
            ("tx_datagrams", ld(&c.tx_datagrams)),
            ("tx_syscalls", ld(&c.tx_syscalls)),
            ("rx_datagrams", ld(&c.rx_datagrams)),
            ("rx_syscalls", ld(&c.rx_syscalls)),
            ("rx_polled", ld(&c.rx_polled)),
            ("rx_single", ld(&c.rx_single)),
            ("progress_mutes", ld(&c.progress_mutes)),
            ("progress_flushes", ld(&c.progress_flushes)),
            // Payload octets of RC packets: copied in user space on the way out (0: sent
            // from the registered memory), handed to the kernel by reference, and copied
            // once into memory on the way in (tests/copies_per_octet.rs).
            ("tx_payload_copied", rc.tx_payload_copied),
            ("tx_payload_by_ref", rc.tx_payload_by_ref),
            ("rx_payload_copied", rc.rx_payload_copied),
        ];
        let ud = self.ud_totals();
        v.extend([
            ("ud_sent_pkts", ud.sent),
            ("ud_rcvd_pkts", ud.received),
            ("ud_qkey_dropped", ud.qkey_dropped),
            ("ud_pkey_dropped", ud.pkey_dropped),
            ("ud_rq_empty_dropped", ud.rq_empty_dropped),
            ("ud_state_dropped", ud.state_dropped),
            ("ud_opcode_dropped", ud.opcode_dropped),
            ("ud_len_err", ud.len_errors),
            ("mcast_groups", self.inner.mcast.lock().unwrap().len() as u64),
        ]);
        if let Some(im) = &self.inner.impair {
            let s = im.lock().unwrap().stats;
            v.extend([
                ("impair_dropped", s.dropped),
                ("impair_reordered", s.reordered),
                ("impair_duplicated", s.duplicated),
                ("impair_corrupted", s.corrupted),
                ("impair_delayed_acks", s.delayed_acks),
            ]);
        }
        v.into_iter().map(|(name, value)| HwCounter { name, value }).collect()
    }

    fn query_port(&self, _port_num: u8) -> PortAttr {
        PortAttr {
            active_mtu: self.inner.cfg.mtu,
            ..PortAttr::default()
        }
    }

    fn create_ah(&self, _pd_id: u32, attr: &verbs::AhAttr) -> Result<Arc<dyn verbs::ah::AhOps>> {
        if attr.sgid_index != 0 {
            return Err(InvalidArg::GidIndex(u32::from(attr.sgid_index)).into());
        }
        Ok(Arc::new(crate::ud::UdAh(*attr)))
    }

    fn attach_mcast(&self, qp: &dyn QpOps, gid: &Gid, _lid: u16) -> Result<()> {
        let q = self.ud_of(qp)?;
        self.inner.mcast_join(*gid, q.0.qpn)?;
        q.0.inner.lock().unwrap().groups.insert(*gid);
        Ok(())
    }

    fn detach_mcast(&self, qp: &dyn QpOps, gid: &Gid, _lid: u16) -> Result<()> {
        let q = self.ud_of(qp)?;
        q.0.inner.lock().unwrap().groups.remove(gid);
        if self.inner.mcast_leave(*gid, q.0.qpn) {
            Ok(())
        } else {
            // ibv_detach_mcast of a group the QP is not attached to: EINVAL.
            Err(InvalidArg::NotMulticast(*gid).into())
        }
    }

    fn query_gid(&self, _port_num: u8, index: u32) -> Result<Gid> {
        match index {
            0 => Ok(Gid::from_ip(self.inner.cfg.addr)),
            _ => Err(InvalidArg::GidIndex(index).into()),
        }
    }

    fn create_qp(&self, req: QpCreate) -> Result<Arc<dyn QpOps>> {
        if req.qp_type == QpType::Ud {
            let qpn = self.inner.alloc_qpn();
            return Ok(Arc::new(RoceUdQp(ud::UdShared::new(self.inner.clone(), qpn, req))));
        }
        if req.qp_type != QpType::Rc {
            return Err(Error::NotSupported(format!(
                "{:?} QPs (the RoCEv2 provider has RC and UD)",
                req.qp_type
            )));
        }
        let qpn = self.inner.alloc_qpn();
        let q = qp::QpShared::new(self.inner.clone(), qpn, req);
        Ok(Arc::new(RoceQp(q)))
    }
}

impl RoceProvider {
    fn ud_of<'a>(&self, qp: &'a dyn QpOps) -> Result<&'a RoceUdQp> {
        let q = qp.as_any().downcast_ref::<RoceUdQp>().ok_or(InvalidArg::OtherDevice)?;
        if !Arc::ptr_eq(&q.0.dev, &self.inner) {
            return Err(InvalidArg::OtherDevice.into());
        }
        Ok(q)
    }

    /// The UD counters summed over every UD QP the device has had.
    fn ud_totals(&self) -> crate::ud::UdStats {
        let mut t = self.inner.ud_retired.lock().unwrap().clone();
        let qps: Vec<_> = self
            .inner
            .ud_qps
            .read()
            .unwrap()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for q in qps {
            t.add(&q.stats());
        }
        t
    }
}

impl GsiPort for RoceProvider {
    fn local_gid(&self) -> Gid {
        Gid::from_ip(self.inner.cfg.addr)
    }

    fn send_mad(&self, to: Gid, mad: &[u8]) -> io::Result<()> {
        let bth = Bth {
            opcode: Opcode::UD_SEND_ONLY,
            se: false,
            m: false,
            pad_count: 0,
            tver: 0,
            p_key: crate::wire::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            resv6a: 0,
            dest_qp: 1,
            ack_req: false,
            resv7: 0,
            psn: Psn::new(self.inner.gsi_psn.fetch_add(1, Ordering::Relaxed)),
        };
        let ext = ExtHeaders {
            deth: Some(Deth {
                q_key: crate::gsi::GSI_QKEY,
                resv8: 0,
                src_qp: 1,
            }),
            ..ExtHeaders::default()
        };
        let p = Packet::new(bth, ext, mad).map_err(io::Error::other)?;
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).map_err(io::Error::other)?;
        let dst = SocketAddr::new(to.to_ip(), crate::wire::ROCEV2_UDP_PORT);
        icrc_seal(
            self.inner.local.ip(),
            dst.ip(),
            self.inner.local.port(),
            dst.port(),
            0,
            &mut buf,
        )
        .map_err(io::Error::other)?;
        self.inner.sock.send_to(&buf, dst)?;
        self.inner.counters.sent_pkts.fetch_add(1, Ordering::Relaxed);
        self.inner.counters.tx_datagrams.fetch_add(1, Ordering::Relaxed);
        self.inner.counters.tx_syscalls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn set_gsi_handler(&self, handler: Weak<dyn GsiHandler>) {
        *self.inner.gsi.lock().unwrap() = Some(handler);
    }

    fn qp_events(&self, qpn: u32) -> Option<Arc<verbs::notify::EventQueue<verbs::CmEvent>>> {
        let q = self.inner.qps.read().unwrap().get(&qpn).and_then(Weak::upgrade)?;
        Some(q.events.clone())
    }
}
