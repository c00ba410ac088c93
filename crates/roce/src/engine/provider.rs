//! [`RoceProvider`]: the device's sockets and progress thread, and what
//! [`verbs::Device`] calls.

use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use verbs::provider::{HwCounter, Provider, QpCreate, QpOps};
use verbs::{DeviceAttr, Error, Gid, InvalidArg, PortAttr, QpType, Result};

use super::seal::icrc_seal;
use super::{
    DevCounters, DevInner, IcrcRx, RCVBUF, RX_BATCH, RoceConfig, RoceQp, RoceUdQp, Timers, device_attr, driver, impair,
    qp, sys, ud,
};
use crate::gsi::{GsiHandler, GsiPort};
use crate::wire::{Bth, Deth, ExtHeaders, Opcode, Packet, Psn};

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
            deferred_since: AtomicU64::new(0),
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

/// One kind of QP's counters summed over every QP of that kind the device has had: the
/// retired QPs' sums, plus each live QP's (`add`); the table's lock is released before the
/// QPs are asked.
fn totals<Q, S: Clone>(retired: &Mutex<S>, live: &RwLock<HashMap<u32, Weak<Q>>>, add: impl Fn(&mut S, &Q)) -> S {
    let mut t = retired.lock().unwrap().clone();
    let qps: Vec<_> = live.read().unwrap().values().filter_map(Weak::upgrade).collect();
    for q in qps {
        add(&mut t, &q);
    }
    t
}

impl Provider for RoceProvider {
    fn query_device(&self) -> DeviceAttr {
        device_attr()
    }

    /// rxe's `hw_counters` where the meaning is the same, then softrdma's own.
    fn query_counters(&self) -> Vec<HwCounter> {
        let c = &self.inner.counters;
        let rc = totals(&self.inner.retired, &self.inner.qps, |t, q| t.add(&q.stats()));
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
            ("tx_datagrams_progress", ld(&c.tx_datagrams_progress)),
            ("tx_syscalls", ld(&c.tx_syscalls)),
            ("rx_datagrams", ld(&c.rx_datagrams)),
            ("rx_syscalls", ld(&c.rx_syscalls)),
            ("rx_polled", ld(&c.rx_polled)),
            ("rx_single", ld(&c.rx_single)),
            ("progress_mutes", ld(&c.progress_mutes)),
            ("rx_polled_unmuted", ld(&c.rx_polled_unmuted)),
            ("progress_flushes", ld(&c.progress_flushes)),
            ("deferred_wakes", ld(&c.deferred_wakes)),
            ("rx_qp_lookups", ld(&c.rx_qp_lookups)),
            ("rx_qp_locks", ld(&c.rx_qp_locks)),
            // Payload octets of RC packets: copied in user space on the way out (0: sent
            // from the registered memory), handed to the kernel by reference, and copied
            // once into memory on the way in (tests/copies_per_octet.rs).
            ("tx_payload_copied", rc.tx_payload_copied),
            ("tx_payload_by_ref", rc.tx_payload_by_ref),
            ("rx_payload_copied", rc.rx_payload_copied),
        ];
        let ud = totals(&self.inner.ud_retired, &self.inner.ud_qps, |t, q| t.add(&q.stats()));
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
        self.inner.counters.count_tx_datagrams(1);
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
