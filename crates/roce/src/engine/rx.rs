//! The receive side of the device: draining the sockets, checking each packet's ICRC and
//! handing it to its QP (or the GSI handler), and the sends deferred while an application
//! thread busy-polls.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use verbs::Gid;

use super::seal::{icrc_check, icrc_verify_id};
use super::{DevInner, RX_BATCH, qp, sys, ud};
use crate::wire::{Opcode, Packet, icrc};

thread_local! {
    /// An empty list [`DevInner::flush_deferred`] swaps for the device's deferred one.
    static DEFERRED_SPARE: std::cell::Cell<Vec<Arc<qp::QpShared>>> = const { std::cell::Cell::new(Vec::new()) };
    /// The QPs a drain of the sockets handed packets to, kept between drains so that a
    /// poll that receives allocates nothing.
    static TOUCHED: std::cell::Cell<Vec<Arc<qp::QpShared>>> = const { std::cell::Cell::new(Vec::new()) };
}

impl DevInner {
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
        self.drain_sockets(defer)
    }

    /// [`DevInner::drain_rx_as`] without sending what a poller deferred first: the progress
    /// thread's, which sends a deferral only once it is due (`driver::DEFER_HOLD`), so that
    /// a poller that is about to post its reply still sends the ACK in the reply's train.
    pub(crate) fn drain_sockets(&self, defer: bool) -> bool {
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
                    let empty = matches!(&r, Err(e) if sys::would_block(e));
                    buf.idle[sock_i] = empty;
                    let got = match r {
                        Ok(n) => n,
                        Err(_) if empty => break,
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
                        // The progress thread has the sockets in its epoll set: the kernel
                        // woke it for these datagrams too (or will), a context switch that
                        // finds the socket drained (tests/per_message_costs.rs).
                        if !self.muted.load(Ordering::Relaxed) {
                            self.counters.rx_polled_unmuted.fetch_add(got as u64, Ordering::Relaxed);
                        }
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
                            self.on_ip_datagram(now, d, &mut touched, defer);
                        } else if let Ok(from) = buf.from(i) {
                            match buf.seg[i] {
                                0 => self.on_datagram(
                                    now,
                                    from,
                                    self.local.ip(),
                                    Rx::Solve,
                                    buf.ip[i],
                                    d,
                                    &mut touched,
                                    defer,
                                ),
                                seg => self.on_train(now, from, usize::from(seg), buf.ip[i], d, &mut touched, defer),
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
                // Their completions are delivered: under the lock that placed the packets
                // (`QpShared::on_packets`).
                let mut d = self.deferred.lock().unwrap();
                if d.is_empty() {
                    let now = now.unwrap_or_else(Instant::now);
                    self.deferred_since.store(self.nanos(now), Ordering::Relaxed);
                }
                for q in touched.drain(..) {
                    if !d.iter().any(|t| Arc::ptr_eq(t, &q)) {
                        d.push(q);
                    }
                }
                self.has_deferred.store(!d.is_empty(), Ordering::SeqCst);
                drop(d);
                // A progress thread that is not muted may be asleep in epoll_wait with no
                // timeout (or until a distant timer): it computed that before this
                // deferral, and nothing else would wake it if this thread stops calling
                // (the requester's retransmission would, a local ACK timeout later). Pairs
                // with its `muted` store before it reads `has_deferred`
                // (`driver::run`): either it sees the deferral and sleeps at
                // most 1 ms, or this sees it unmuted and wakes it.
                if !self.muted.load(Ordering::SeqCst) {
                    self.counters.deferred_wakes.fetch_add(1, Ordering::Relaxed);
                    let _ = self.waker.wake();
                }
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
    fn on_ip_datagram(&self, now: Instant, d: &[u8], touched: &mut Vec<Arc<qp::QpShared>>, defer: bool) {
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
            defer,
        );
    }

    /// A GSO/GRO train from the UDP socket: RoCEv2 packets of `seg` octets back to back
    /// (the last may be shorter). Every packet's ICRC is checked. IPv4: the sender's kernel
    /// gives the segments of one GSO send consecutive IDs from the first one's, which is 0
    /// on an unconnected DF socket (ours), so a train whose first packet verifies with ID 0
    /// is ours and packet k must verify with ID k exactly; any other train (a GRO merge of a
    /// foreign sender's packets) has each packet's ID solved for, as single datagrams from
    /// the UDP socket do.
    ///
    /// The packets that follow one for an RC QP and are RC packets for the same QP (a
    /// ping-pong's reply and ACK, a burst of Writes) are checked, parsed and handed to it
    /// under the one lock that QP was taken with: one look-up and one lock per run of the
    /// train, not per packet (issue 13, session 17).
    #[allow(clippy::too_many_arguments)]
    fn on_train(
        &self,
        now: Instant,
        from: SocketAddr,
        seg: usize,
        ip: Option<sys::RxIp>,
        d: &[u8],
        touched: &mut Vec<Arc<qp::QpShared>>,
        defer: bool,
    ) {
        let dst = self.local.ip();
        let mut ours = None;
        let mut pkts = d.chunks(seg).enumerate().peekable();
        while let Some((k, pkt)) = pkts.next() {
            let how = self.train_rx(from, dst, &mut ours, k, pkt);
            let Some(p) = self.rx_packet(from, dst, how, pkt) else {
                continue;
            };
            let Some(q) = self.rx_dispatch(from, dst, ip, pkt.len(), &p, touched) else {
                continue;
            };
            q.on_packets(now, defer, |core| {
                core.handle_packet(now, &p);
                while let Some(&(k, pkt)) = pkts.peek() {
                    if rc_dest_qp(pkt) != Some(q.qpn) {
                        break;
                    }
                    pkts.next();
                    let how = self.train_rx(from, dst, &mut ours, k, pkt);
                    // An RC opcode (no DETH) to this QP's number (not the GSI's): the
                    // packet `rx_dispatch` would hand to this QP, if it checks and parses.
                    if let Some(p) = self.rx_packet(from, dst, how, pkt) {
                        core.handle_packet(now, &p);
                    }
                }
            });
        }
    }

    /// How packet `k` of a train is ICRC-checked (see [`DevInner::on_train`]); `ours` is
    /// what the first packet's check said of the train.
    fn train_rx(&self, from: SocketAddr, dst: IpAddr, ours: &mut Option<bool>, k: usize, pkt: &[u8]) -> Rx<'static> {
        match (from.ip(), dst, *ours) {
            (IpAddr::V4(_), IpAddr::V4(_), None) => {
                // The check that tells whose train it is, is the first packet's ICRC
                // check too: one pass, not two (it was checked again with ID 0).
                self.counters
                    .icrc_rx_octets
                    .fetch_add(pkt.len() as u64, Ordering::Relaxed);
                let is_ours = icrc_verify_id(from.ip(), dst, from.port(), crate::wire::ROCEV2_UDP_PORT, 0, pkt);
                *ours = Some(is_ours);
                if is_ours { Rx::Checked } else { Rx::Solve }
            }
            (IpAddr::V4(_), IpAddr::V4(_), Some(true)) => Rx::Id(k as u16),
            _ => Rx::Solve,
        }
    }

    /// One RoCEv2 packet (a UDP payload) from `from` to `dst` (our address or a multicast
    /// group), its ICRC checked as `rx` says; `ip` is its TTL and TOS when a UDP socket
    /// reported them (a UD receive's GRH shows them). `defer`: an application thread's
    /// receive (completions delivered at once, sends deferred).
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
        defer: bool,
    ) {
        let ip_hdr = match rx {
            Rx::Headers(ip, _) => Some(ip),
            _ => None,
        };
        let Some(p) = self.rx_packet(from, dst, rx, pkt) else {
            return;
        };
        if let Some(q) = self.rx_dispatch_hdr(from, dst, ip_hdr, ip, pkt.len(), &p, touched) {
            q.on_packets(now, defer, |core| core.handle_packet(now, &p));
        }
    }

    /// Counts a received packet, checks its ICRC as `rx` says and parses it: `None` (counted)
    /// if either fails.
    fn rx_packet<'p>(&self, from: SocketAddr, dst: IpAddr, rx: Rx<'_>, pkt: &'p [u8]) -> Option<Packet<'p>> {
        self.counters.rcvd_pkts.fetch_add(1, Ordering::Relaxed);
        let sport = from.port();
        let dport = crate::wire::ROCEV2_UDP_PORT;
        let crc_pass = || {
            self.counters
                .icrc_rx_octets
                .fetch_add(pkt.len() as u64, Ordering::Relaxed);
        };
        let ok = match rx {
            Rx::Headers(ip, udp) => {
                crc_pass();
                icrc::verify(ip, udp, pkt).is_ok()
            }
            Rx::Solve => self.check_single(from.ip(), dst, sport, dport, pkt),
            Rx::Id(id) => {
                crc_pass();
                icrc_verify_id(from.ip(), dst, sport, dport, id, pkt)
            }
            Rx::Checked => true,
        };
        if !ok {
            self.counters.icrc_err.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match Packet::parse(pkt) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::trace!(device = %self.cfg.name, error = %e, "malformed packet dropped");
                self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// [`DevInner::rx_dispatch_hdr`] of a packet from a UDP socket.
    fn rx_dispatch<'t>(
        &self,
        from: SocketAddr,
        dst: IpAddr,
        ip: Option<sys::RxIp>,
        pkt_len: usize,
        p: &Packet<'_>,
        touched: &'t mut Vec<Arc<qp::QpShared>>,
    ) -> Option<&'t Arc<qp::QpShared>> {
        self.rx_dispatch_hdr(from, dst, None, ip, pkt_len, p, touched)
    }

    /// Hands a checked, parsed packet to the GSI handler or its UD QPs, or returns the RC
    /// QP it is for (entered in `touched`); unknown QPs are counted.
    #[allow(clippy::too_many_arguments)]
    fn rx_dispatch_hdr<'t>(
        &self,
        from: SocketAddr,
        dst: IpAddr,
        ip_hdr: Option<&[u8]>,
        ip: Option<sys::RxIp>,
        pkt_len: usize,
        p: &Packet<'_>,
        touched: &'t mut Vec<Arc<qp::QpShared>>,
    ) -> Option<&'t Arc<qp::QpShared>> {
        let dqp = p.bth.dest_qp;
        if dqp == 1 {
            self.on_gsi(from, p);
            return None;
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
                self.on_ud_packet(from, dst, ip_hdr, ip, pkt_len, p, &targets);
            }
            return None;
        }
        // A QP this drain already handed packets to (a train's later packets, a burst of
        // Writes): no map lookup, no reference count traffic per packet (issue 13).
        if let Some(i) = touched.iter().position(|t| t.qpn == dqp) {
            return Some(&touched[i]);
        }
        match self.qp_cached(dqp) {
            Some(q) => {
                touched.push(q);
                touched.last()
            }
            None => {
                self.counters.unknown_qp.fetch_add(1, Ordering::Relaxed);
                None
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
}

/// The destination QP of an RC packet (an RC opcode, so no DETH; not the GSI's QP 1),
/// read from its BTH before it is checked or parsed; `None` for anything else.
fn rc_dest_qp(pkt: &[u8]) -> Option<u32> {
    let b = pkt.get(..crate::wire::Bth::LEN)?;
    let qpn = u32::from_be_bytes([0, b[5], b[6], b[7]]);
    (b[0] & 0xe0 == 0 && qpn != 1).then_some(qpn)
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
