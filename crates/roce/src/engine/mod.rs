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
//! unconnected socket, and the receive side computes the ICRC with ID 0. Peers that send a
//! non-zero ID (rxe does not on its RC path with DF set) fail the check; see docs/roce.md.

mod driver;
mod qp;
#[allow(unsafe_code)]
mod sys;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use verbs::provider::{Provider, QpCreate, QpOps};
use verbs::{DeviceAttr, Error, Gid, InvalidArg, Mtu, PortAttr, QpType, Result};

use crate::gsi::{GsiHandler, GsiPort};
use crate::wire::{Bth, Deth, ExtHeaders, Opcode, Packet, Psn, icrc};
pub use qp::RoceQp;

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
}

impl Default for RoceConfig {
    fn default() -> Self {
        RoceConfig {
            name: "rxe_soft0".into(),
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            mtu: Mtu::Mtu1024,
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

/// Opens a RoCEv2 device: binds `addr`:4791 and starts its progress thread.
pub fn open_device(cfg: RoceConfig) -> io::Result<verbs::Device> {
    let p = Arc::new(RoceProvider::new(cfg.clone())?);
    Ok(verbs::provider::new_device(cfg.name.clone(), p, None))
}

/// Device-wide packet counters (the per-QP ones are in [`crate::rc::RcStats`]).
#[derive(Debug, Default)]
pub(crate) struct DevCounters {
    pub sent_pkts: AtomicU64,
    pub rcvd_pkts: AtomicU64,
    pub icrc_err: AtomicU64,
    pub malformed: AtomicU64,
    pub unknown_qp: AtomicU64,
    pub send_err: AtomicU64,
}

/// The state a device's QPs and its progress thread share.
pub(crate) struct DevInner {
    pub cfg: RoceConfig,
    pub sock: UdpSocket,
    pub local: SocketAddr,
    pub qps: RwLock<HashMap<u32, Weak<qp::QpShared>>>,
    next_qpn: AtomicU32,
    timers: Mutex<Timers>,
    waker: mio::Waker,
    pub stop: AtomicBool,
    /// The receive lock: whoever holds it drains the socket.
    rx: Mutex<Vec<u8>>,
    /// Set by a thread that found the receive lock taken: the holder drains once more.
    rx_poke: AtomicBool,
    gsi: Mutex<Option<Weak<dyn GsiHandler>>>,
    gsi_psn: AtomicU32,
    pub counters: DevCounters,
    epoch: Instant,
}

struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Nanoseconds since `epoch` until which the progress thread sleeps; 0 while awake.
    sleep_until: u64,
}

/// Largest datagram accepted (a 4096 MTU packet with every header fits easily).
const RX_BUF: usize = 9000;

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
            if let Some(qp) = self.qp(qpn) {
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

    fn awake(&self) {
        self.timers.lock().unwrap().sleep_until = 0;
    }

    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<qp::QpShared>> {
        self.qps.read().unwrap().get(&qpn).and_then(Weak::upgrade)
    }

    /// Receives every queued datagram (or leaves a poke for the thread that is already
    /// doing so). Returns whether any packet was received.
    pub(crate) fn drain_rx(&self) -> bool {
        self.rx_poke.store(true, Ordering::SeqCst);
        let mut any = false;
        loop {
            let Ok(mut buf) = self.rx.try_lock() else {
                return any;
            };
            self.rx_poke.store(false, Ordering::SeqCst);
            let mut touched: Vec<Arc<qp::QpShared>> = Vec::new();
            let now = Instant::now();
            let mut n_batch = 0;
            loop {
                match sys::recv_from_dontwait(self.sock.as_fd(), &mut buf) {
                    Ok((n, from)) => {
                        any = true;
                        self.on_datagram(now, from, &mut buf[..n], &mut touched);
                        n_batch += 1;
                        // Let ACKs and responses out now and then during a long burst.
                        if n_batch % 64 == 0 {
                            for q in touched.drain(..) {
                                q.service_locked();
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        // ICMP errors reported on the socket (port unreachable): nothing to
                        // read, the RC timers deal with the lost peer.
                        tracing::debug!(device = %self.cfg.name, error = %e, "recvfrom");
                        continue;
                    }
                }
            }
            drop(buf);
            for q in touched {
                q.service_locked();
            }
            if !self.rx_poke.load(Ordering::SeqCst) {
                return any;
            }
        }
    }

    fn on_datagram(&self, now: Instant, from: SocketAddr, pkt: &mut [u8], touched: &mut Vec<Arc<qp::QpShared>>) {
        self.counters.rcvd_pkts.fetch_add(1, Ordering::Relaxed);
        if icrc_check(from.ip(), self.local.ip(), from.port(), self.local.port(), pkt).is_err() {
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

    /// Seals the ICRC of `pkt` (the ICRC field is its last four octets) and sends it.
    pub(crate) fn send_packet(&self, to: SocketAddr, pkt: &mut [u8]) {
        if icrc_seal(self.local.ip(), to.ip(), self.local.port(), to.port(), pkt).is_err() {
            self.counters.send_err.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.sock.send_to(pkt, to) {
            Ok(_) => {
                self.counters.sent_pkts.fetch_add(1, Ordering::Relaxed);
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
            if q > 1 && !self.qps.read().unwrap().contains_key(&q) {
                return q;
            }
        }
    }
}

/// The IP header the ICRC covers, as Linux sends a datagram of `payload_len` UDP payload
/// octets from an unconnected socket with DF (IPv4 ID 0).
fn ip_header(src: IpAddr, dst: IpAddr, payload_len: usize, out: &mut [u8; 40]) -> &[u8] {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out[..20].copy_from_slice(&icrc::ipv4_header(s.octets(), d.octets(), 0, payload_len));
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
    pkt: &mut [u8],
) -> std::result::Result<u32, icrc::IcrcError> {
    let mut ipb = [0u8; 40];
    let ip = ip_header(src, dst, pkt.len(), &mut ipb);
    let udp = icrc::udp_header(sport, dport, pkt.len());
    icrc::seal(ip, &udp, pkt)
}

fn icrc_check(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    pkt: &[u8],
) -> std::result::Result<(), icrc::IcrcError> {
    let mut ipb = [0u8; 40];
    let ip = ip_header(src, dst, pkt.len(), &mut ipb);
    let udp = icrc::udp_header(sport, dport, pkt.len());
    icrc::verify(ip, &udp, pkt)
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
        let _ = s.set_recv_buffer_size(8 << 20);
        sys::set_pmtudisc_do(s.as_fd(), cfg.addr.is_ipv6())?;
        s.bind(&local.into())?;
        let sock: UdpSocket = s.into();
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), driver::WAKER)?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x1234, |d| d.subsec_nanos());
        let inner = Arc::new(DevInner {
            cfg,
            sock,
            local,
            qps: RwLock::new(HashMap::new()),
            // A start that differs between devices and runs, as rxe's pool index does not.
            next_qpn: AtomicU32::new((seed.wrapping_mul(2_654_435_761) & 0x00ff_f000) | 0x11),
            timers: Mutex::new(Timers {
                heap: BinaryHeap::new(),
                sleep_until: 0,
            }),
            waker,
            stop: AtomicBool::new(false),
            rx: Mutex::new(vec![0; RX_BUF]),
            rx_poke: AtomicBool::new(false),
            gsi: Mutex::new(None),
            gsi_psn: AtomicU32::new(seed & 0x00ff_ffff),
            counters: DevCounters::default(),
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

impl Provider for RoceProvider {
    fn query_device(&self) -> DeviceAttr {
        device_attr()
    }

    fn query_port(&self, _port_num: u8) -> PortAttr {
        PortAttr {
            active_mtu: self.inner.cfg.mtu,
            ..PortAttr::default()
        }
    }

    fn query_gid(&self, _port_num: u8, index: u32) -> Result<Gid> {
        match index {
            0 => Ok(Gid::from_ip(self.inner.cfg.addr)),
            _ => Err(InvalidArg::GidIndex(index).into()),
        }
    }

    fn create_qp(&self, req: QpCreate) -> Result<Arc<dyn QpOps>> {
        if req.qp_type != QpType::Rc {
            return Err(Error::NotSupported(format!(
                "{:?} QPs (the RoCEv2 provider has RC; UD comes next)",
                req.qp_type
            )));
        }
        let qpn = self.inner.alloc_qpn();
        let q = qp::QpShared::new(self.inner.clone(), qpn, req);
        Ok(Arc::new(RoceQp(q)))
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
            &mut buf,
        )
        .map_err(io::Error::other)?;
        self.inner.sock.send_to(&buf, dst)?;
        self.inner.counters.sent_pkts.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn set_gsi_handler(&self, handler: Weak<dyn GsiHandler>) {
        *self.inner.gsi.lock().unwrap() = Some(handler);
    }
}
