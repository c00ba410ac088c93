//! UD queue pairs and multicast groups of a RoCEv2 device: the sans-I/O core
//! ([`crate::ud::UdQp`]) behind a mutex, its CQs, and the glue that sends what it emits and
//! delivers what arrives.
//!
//! Sends never block on the peer: `post_send` builds the datagrams and hands them to the
//! device's socket (`sendmmsg` for runs to one destination) in the caller's thread; each
//! completes as it is handed over. Receives are placed in the thread that drains the socket
//! and their completions pushed at once.
//!
//! Multicast ([`mcast_ip`]): a group is a UDP socket bound to the group address and port
//! 4791 (`SO_REUSEADDR`, so every device of the host can have one) that joined the group on
//! the device's address (`IP_ADD_MEMBERSHIP`, an IGMP report; IPv6: `IPV6_JOIN_GROUP`). A
//! datagram for the group arrives once per device and is delivered to every QP of the
//! device attached to it. Sends go from the device's own socket to the group address with
//! destination QPN 0xFFFFFF; `IP_MULTICAST_LOOP` (Linux's default) gives a copy to every
//! device of the host that joined, the sending device included, so a sender's own attached
//! QPs receive its datagrams too (IBA's multicast loopback, what rxe does without
//! `IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK`).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use verbs::provider::{CqProviderExt, QpCreate, QpOps};
use verbs::{CompletionQueue, Error, Gid, InvalidArg, QpAttr, RecvWr, Result, SendWr};

use super::{DevInner, sys};
use crate::ud::{UdConfig, UdError, UdQp, UdStats, grh};
use crate::wire::Packet;

/// Datagrams sent with one `sendmmsg` at most.
const BATCH: usize = 32;

thread_local! {
    /// The datagrams of one batch, built by `poll_transmit` in this thread.
    static TX_BATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(crate) struct UdInner {
    pub(crate) core: UdQp,
    /// The multicast groups this QP is attached to.
    pub(crate) groups: HashSet<Gid>,
}

pub(crate) struct UdShared {
    pub(crate) dev: Arc<DevInner>,
    pub(crate) qpn: u32,
    pub(crate) inner: Mutex<UdInner>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
}

/// A RoCEv2 UD QP as the verbs layer holds it.
pub struct RoceUdQp(pub(crate) Arc<UdShared>);

/// A multicast group a device has joined.
pub(crate) struct Group {
    pub(crate) sock: Arc<UdpSocket>,
    pub(crate) addr: IpAddr,
    pub(crate) members: HashSet<u32>,
}

fn ud_err(e: UdError, index: usize) -> Error {
    match e {
        UdError::State(s, _) => Error::InvalidState(s),
        UdError::QueueFull(_) => Error::QueueFull,
        UdError::Wr(error) => Error::BadWr { index, error },
    }
}

/// The IP group a multicast GID stands for on a device bound to `local`:
/// - an IPv4-mapped GID of an IPv4 multicast address (`::ffff:224.0.0.0/100`) is that
///   address (what Linux's `rdma_gid2ip` gives, so rxe peers agree);
/// - on an IPv6 device, an `ff..` GID is that IPv6 multicast address (as for rxe);
/// - on an IPv4 device an `ff..` GID (IPoIB's `ff12:401b:...`) cannot be sent as IPv6 from
///   the device's IPv4 socket: it maps to the administratively scoped 239.0.0.0/8 group
///   whose low 24 bits are the XOR fold of the GID's 16 octets (softrdma's own mapping, as
///   ../shared/requirements D3 allows; both ends must be softrdma).
pub fn mcast_ip(local: IpAddr, gid: Gid) -> Option<IpAddr> {
    if let Some(v4) = std::net::Ipv6Addr::from(gid.0).to_ipv4_mapped() {
        return (local.is_ipv4() && v4.is_multicast()).then_some(IpAddr::V4(v4));
    }
    if !gid.is_multicast() {
        return None;
    }
    match local {
        IpAddr::V6(_) => Some(IpAddr::V6(gid.0.into())),
        IpAddr::V4(_) => {
            let mut f = [0u8; 3];
            for (i, b) in gid.0.iter().enumerate() {
                f[i % 3] ^= b;
            }
            Some(IpAddr::V4(Ipv4Addr::new(239, f[0], f[1], f[2])))
        }
    }
}

impl UdShared {
    pub(crate) fn new(dev: Arc<DevInner>, qpn: u32, req: QpCreate) -> Arc<UdShared> {
        let mut cfg = UdConfig::new(qpn, req.pd_id, req.mem.clone());
        cfg.sq_sig_all = req.attr.sq_sig_all;
        cfg.max_send_wr = req.attr.max_send_wr.max(1) as usize;
        cfg.max_recv_wr = req.attr.max_recv_wr.max(1) as usize;
        cfg.mtu = dev.cfg.mtu;
        let q = Arc::new(UdShared {
            dev: dev.clone(),
            qpn,
            inner: Mutex::new(UdInner {
                core: UdQp::new(cfg),
                groups: HashSet::new(),
            }),
            send_cq: req.send_cq.clone(),
            recv_cq: req.recv_cq.clone(),
        });
        dev.ud_qps.write().unwrap().insert(qpn, Arc::downgrade(&q));
        let w: Weak<dyn verbs::cq::Progress> = Arc::downgrade(&q) as Weak<dyn verbs::cq::Progress>;
        req.send_cq.attach(w.clone());
        if !req.send_cq.same(&req.recv_cq) {
            req.recv_cq.attach(w);
        }
        q
    }

    pub(crate) fn stats(&self) -> UdStats {
        self.inner.lock().unwrap().core.stats().clone()
    }

    /// A UD packet for this QP (ICRC checked, parsed) with its GRH area.
    pub(crate) fn on_packet(&self, p: &Packet<'_>, grh: &[u8; grh::GRH_LEN]) {
        let mut g = self.inner.lock().unwrap();
        g.core.handle_packet(p, grh);
        self.deliver(&mut g);
    }

    /// Pushes the core's completions to the CQs.
    fn deliver(&self, g: &mut UdInner) -> bool {
        let mut any = false;
        while let Some(wc) = g.core.poll_completion() {
            any = true;
            let cq = match wc.opcode {
                verbs::WcOpcode::Recv => &self.recv_cq,
                _ => &self.send_cq,
            };
            if cq.push(wc).is_err() {
                tracing::warn!(qpn = self.qpn, "CQ overflow: UD QP to error");
                g.core.set_error();
            }
        }
        any
    }

    /// Sends every datagram the core has ready and delivers its completions.
    fn service(&self, g: &mut UdInner) -> bool {
        if g.core.has_transmit() {
            TX_BATCH.with_borrow_mut(|buf| self.transmit(g, buf));
        }
        self.deliver(g)
    }

    fn transmit(&self, g: &mut UdInner, buf: &mut Vec<u8>) {
        let need = g.core.max_packet_len();
        if buf.len() < BATCH * need {
            buf.resize(BATCH * need, 0);
        }
        let local = self.dev.local.ip();
        while g.core.has_transmit() {
            let mut lens = [0usize; BATCH];
            let mut dests = [None::<SocketAddr>; BATCH];
            let mut fields = [None::<sys::IpFields>; BATCH];
            let mut n = 0;
            while n < BATCH {
                let Some(tx) = g.core.poll_transmit(&mut buf[n * need..(n + 1) * need]) else {
                    break;
                };
                let ip = if tx.ah.dgid.is_multicast() {
                    mcast_ip(local, tx.ah.dgid)
                } else {
                    Some(tx.ah.dgid.to_ip())
                };
                lens[n] = tx.len;
                dests[n] = ip.map(|ip| SocketAddr::new(ip, crate::wire::ROCEV2_UDP_PORT));
                // The AH's hop limit and traffic class become the IP TTL and TOS (IPv6 hop
                // limit and traffic class), as rxe's prepare_ipv4_hdr/prepare_ipv6_hdr do.
                fields[n] = ip.map(|ip| sys::IpFields {
                    ttl: tx.ah.hop_limit,
                    tos: tx.ah.traffic_class,
                    v6: ip.is_ipv6(),
                });
                n += 1;
            }
            let mut pkts: Vec<&mut [u8]> = buf
                .chunks_mut(need)
                .zip(&lens[..n])
                .map(|(c, &l)| &mut c[..l])
                .collect();
            // Runs of one destination and one TTL/TOS go out in one sendmmsg.
            let mut i = 0;
            while i < n {
                let mut j = i + 1;
                while j < n && dests[j] == dests[i] && fields[j] == fields[i] {
                    j += 1;
                }
                match dests[i] {
                    Some(to) => self.dev.send_batch_with(to, &mut pkts[i..j], fields[i]),
                    None => {
                        self.dev.counters.send_err.fetch_add((j - i) as u64, Ordering::Relaxed);
                    }
                }
                i = j;
            }
        }
    }
}

impl Drop for UdShared {
    fn drop(&mut self) {
        let groups = match self.inner.get_mut() {
            Ok(g) => {
                self.dev.ud_retired.lock().unwrap().add(g.core.stats());
                std::mem::take(&mut g.groups)
            }
            Err(_) => HashSet::new(),
        };
        for gid in groups {
            self.dev.mcast_leave(gid, self.qpn);
        }
        let mut m = self.dev.ud_qps.write().unwrap();
        if m.get(&self.qpn).is_some_and(|w| w.strong_count() == 0) {
            m.remove(&self.qpn);
        }
    }
}

impl verbs::cq::Progress for UdShared {
    fn progress(&self) -> bool {
        self.dev.note_poll();
        let mut any = self.dev.drain_rx();
        let mut g = self.inner.lock().unwrap();
        any |= self.service(&mut g);
        any
    }

    /// The poller goes to sleep on the CQ: the progress thread takes the sockets back.
    fn parked(&self) {
        self.dev.poller_parked();
    }
}

impl QpOps for RoceUdQp {
    fn qp_num(&self) -> u32 {
        self.0.qpn
    }

    fn state(&self) -> verbs::QpState {
        self.0.inner.lock().unwrap().core.state()
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        let mut g = self.0.inner.lock().unwrap();
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = g.core.post_send(wr) {
                res = Err(ud_err(e, i));
                break;
            }
        }
        self.0.service(&mut g);
        res
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        let mut g = self.0.inner.lock().unwrap();
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = g.core.post_recv(wr) {
                res = Err(ud_err(e, i));
                break;
            }
        }
        self.0.deliver(&mut g);
        res
    }

    fn modify_qp(&self, attr: &QpAttr) -> Result<()> {
        let mut g = self.0.inner.lock().unwrap();
        g.core.modify(attr).map_err(|e| ud_err(e, 0))?;
        self.0.service(&mut g);
        Ok(())
    }

    fn query_qp(&self) -> QpAttr {
        let g = self.0.inner.lock().unwrap();
        QpAttr {
            qp_state: Some(g.core.state()),
            qkey: Some(g.core.q_key()),
            sq_psn: Some(g.core.sq_psn().value()),
            path_mtu: Some(self.0.dev.cfg.mtu),
            ..QpAttr::default()
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl RoceUdQp {
    /// The core's counters.
    pub fn stats(&self) -> UdStats {
        self.0.stats()
    }
}

impl DevInner {
    pub(crate) fn ud_qp(&self, qpn: u32) -> Option<Arc<UdShared>> {
        self.ud_qps.read().unwrap().get(&qpn).and_then(Weak::upgrade)
    }

    /// Attaches UD QP `qpn` to `gid`, joining the group on the first attach.
    pub(crate) fn mcast_join(&self, gid: Gid, qpn: u32) -> Result<()> {
        let addr = mcast_ip(self.local.ip(), gid).ok_or(InvalidArg::NotMulticast(gid))?;
        let mut m = self.mcast.lock().unwrap();
        if let Some(g) = m.get_mut(&gid) {
            g.members.insert(qpn);
            return Ok(());
        }
        let sock = self.group_socket(addr).map_err(|e| {
            Error::OutOfResources(format!("joining multicast group {addr} on {}: {e}", self.local.ip()))
        })?;
        let token = mio::Token(super::driver::FIRST_GROUP + self.next_group_token.fetch_add(1, Ordering::Relaxed));
        let reg = self
            .registry
            .get()
            .ok_or_else(|| Error::OutOfResources("the device's progress thread is not running".into()))?;
        reg.register(
            &mut mio::unix::SourceFd(&sock.as_raw_fd()),
            token,
            mio::Interest::READABLE,
        )
        .map_err(|e| Error::OutOfResources(format!("epoll of multicast group {addr}: {e}")))?;
        tracing::debug!(device = %self.cfg.name, %gid, %addr, "joined multicast group");
        m.insert(
            gid,
            Group {
                sock: Arc::new(sock),
                addr,
                members: HashSet::from([qpn]),
            },
        );
        drop(m);
        // Datagrams that came before the socket was registered raise no edge: drain now.
        self.drain_rx();
        Ok(())
    }

    /// Detaches `qpn` from `gid`; the last member leaves the group (the socket closes,
    /// which drops the membership).
    pub(crate) fn mcast_leave(&self, gid: Gid, qpn: u32) -> bool {
        let mut m = self.mcast.lock().unwrap();
        let Some(g) = m.get_mut(&gid) else { return false };
        let was = g.members.remove(&qpn);
        if g.members.is_empty()
            && let Some(g) = m.remove(&gid)
        {
            if let Some(reg) = self.registry.get() {
                let _ = reg.deregister(&mut mio::unix::SourceFd(&g.sock.as_raw_fd()));
            }
            tracing::debug!(device = %self.cfg.name, %gid, addr = %g.addr, "left multicast group");
        }
        was
    }

    /// A socket for group `addr`, made in the device's network namespace (a thread of its
    /// own enters it when the caller's thread is in another one).
    fn group_socket(&self, addr: IpAddr) -> std::io::Result<UdpSocket> {
        use std::os::unix::fs::MetadataExt;
        let here = std::fs::metadata("/proc/thread-self/ns/net").ok();
        let theirs = self.netns.as_ref().and_then(|f| f.metadata().ok());
        match (here, theirs, &self.netns) {
            (Some(h), Some(t), Some(f)) if (h.dev(), h.ino()) != (t.dev(), t.ino()) => std::thread::scope(|sc| {
                sc.spawn(|| {
                    super::sys::setns_net(f.as_fd())?;
                    self.group_socket_here(addr)
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("group socket thread panicked")))
            }),
            _ => self.group_socket_here(addr),
        }
    }

    fn group_socket_here(&self, addr: IpAddr) -> std::io::Result<UdpSocket> {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(SocketAddr::new(addr, 0)),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        s.set_reuse_address(true)?;
        match (addr, self.local.ip()) {
            (IpAddr::V4(g), IpAddr::V4(ifa)) => {
                s.bind(&SocketAddr::new(addr, crate::wire::ROCEV2_UDP_PORT).into())?;
                s.join_multicast_v4(&g, &ifa)?;
            }
            (IpAddr::V6(g), IpAddr::V6(ifa)) => {
                // The device's interface: link-local-scope groups (IPoIB's ff12:...) need it
                // to bind and join.
                let idx = super::sys::ifindex_of_v6(ifa).unwrap_or(0);
                s.set_only_v6(true)?;
                let at = std::net::SocketAddrV6::new(g, crate::wire::ROCEV2_UDP_PORT, 0, idx);
                s.bind(&SocketAddr::V6(at).into())?;
                s.join_multicast_v6(&g, idx)?;
            }
            _ => return Err(std::io::Error::other("group and device address families differ")),
        }
        s.set_nonblocking(true)?;
        let _ = s.set_recv_buffer_size(4 << 20);
        let _ = super::sys::set_recv_ip_fields(s.as_fd(), addr.is_ipv6());
        Ok(s.into())
    }

    /// Receives what queued on the group sockets. Returns whether anything came.
    pub(crate) fn drain_groups(&self, buf: &mut super::sys::RxBatch) -> bool {
        let socks: Vec<(Arc<UdpSocket>, IpAddr)> = {
            let m = self.mcast.lock().unwrap();
            if m.is_empty() {
                return false;
            }
            m.values().map(|g| (g.sock.clone(), g.addr)).collect()
        };
        let now = std::time::Instant::now();
        let mut any = false;
        let mut touched = Vec::new();
        for (s, group) in socks {
            loop {
                match super::sys::recvmmsg_dontwait(s.as_fd(), buf) {
                    Ok(n) => {
                        any = true;
                        for i in 0..n {
                            if let (Some(d), Ok(from)) = (buf.data(i), buf.from(i)) {
                                self.on_datagram(now, from, group, super::Rx::Solve, buf.ip[i], d, &mut touched, false);
                            }
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
        for q in touched {
            q.service_locked();
        }
        any
    }

    /// A UD packet for `dqp` (a QPN, or 0xFFFFFF with `group` the multicast group it came
    /// to): builds the GRH area and delivers to the QP or to every attached QP.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_ud_packet(
        &self,
        from: SocketAddr,
        dst: IpAddr,
        ip_header: Option<&[u8]>,
        ip: Option<super::sys::RxIp>,
        pkt_len: usize,
        p: &Packet<'_>,
        targets: &[Arc<UdShared>],
    ) {
        let g = match (ip_header, from.ip(), dst) {
            (Some(h), _, _) if h.len() == 20 => {
                let mut a = [0u8; 20];
                a.copy_from_slice(h);
                grh::from_ipv4(&a)
            }
            // From a UDP socket: the TTL/TOS it reported (else rxe's defaults).
            (_, IpAddr::V4(s), IpAddr::V4(d)) => {
                let f = ip.unwrap_or(super::sys::RxIp { ttl: 64, tos: 0 });
                grh::from_ipv4(&grh::synth_ipv4(s.octets(), d.octets(), pkt_len, f.ttl, f.tos))
            }
            (_, s, d) => {
                let f = ip.unwrap_or(super::sys::RxIp { ttl: 64, tos: 0 });
                let mut h = grh::synth_ipv6(Gid::from_ip(s).0, Gid::from_ip(d).0, pkt_len, f.ttl);
                // Version 6, traffic class, flow label 0.
                h[..4].copy_from_slice(&(6u32 << 28 | u32::from(f.tos) << 20).to_be_bytes());
                grh::from_ipv6(&h)
            }
        };
        for q in targets {
            q.on_packet(p, &g);
        }
    }
}
