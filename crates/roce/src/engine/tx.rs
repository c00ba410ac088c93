//! The transmit side of the device: the ICRC seal, GSO trains and `sendmmsg`, the
//! impairment's held packets.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::seal::{icrc_seal, ip_header};
use super::{DevInner, IMPAIR_TIMER, qp, sys};
use crate::wire::icrc;

thread_local! {
    /// [`DevInner::send_parts`]'s trains and `sendmmsg` messages, kept between batches.
    static TX_MSGS: std::cell::Cell<(Vec<sys::TxMsg>, Vec<sys::TxMsg>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

impl DevInner {
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
            self.counters.count_tx_datagrams(n as u64);
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
        self.counters.count_tx_datagrams(sent_msgs as u64);
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
        // Pad (0-3 octets) and ICRC of each packet; a batch is at most qp::BATCH packets,
        // most are one or two (a ping-pong's): no 60 trailers to clear for those.
        let mut on_small = [[0u8; 8]; SMALL_TRAILERS];
        let mut on_stack;
        let mut on_heap = Vec::new();
        let trailers: &mut [[u8; 8]] = if pkts.len() <= SMALL_TRAILERS {
            &mut on_small[..pkts.len()]
        } else if pkts.len() <= qp::BATCH {
            on_stack = [[0u8; 8]; qp::BATCH];
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
                self.counters.icrc_tx_octets.fetch_add(len as u64, Ordering::Relaxed);
                // IPv4 and short (a ping-pong's Send, a 64 B Write, an ACK): the masked
                // headers and the payload straight into the one buffer the CRC runs over.
                let lean = match (self.local.ip(), to.ip()) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => icrc::compute_v4_short(
                        s.octets(),
                        d.octets(),
                        k as u16,
                        self.local.port(),
                        to.port(),
                        p.hdr,
                        p.payload_len,
                        |dst| {
                            let mut at = 0;
                            for pc in p.pieces {
                                // In bounds: checked when the WR was posted or the Read
                                // arrived (and the pieces add up to `payload_len`).
                                let k = pc.len.min(dst.len() - at);
                                let _ = pc.buf.read(pc.off, &mut dst[at..at + k]);
                                at += k;
                            }
                        },
                        pad,
                    ),
                    _ => None,
                };
                let crc = match lean {
                    Some(c) => Ok(c),
                    None => {
                        let mut ipb = [0u8; 40];
                        let ip = ip_header(self.local.ip(), to.ip(), len, k as u16, &mut ipb);
                        let udp = icrc::udp_header(self.local.port(), to.port(), len);
                        icrc::compute_parts(
                            ip,
                            &udp,
                            p.hdr,
                            p.payload_len,
                            |f| {
                                for pc in p.pieces {
                                    // In bounds: checked when the WR was posted or the Read arrived.
                                    if pc.len <= SMALL_PIECE {
                                        // A small payload: one read, no 4 KiB bounce
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
                        )
                    }
                };
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
    pub(super) fn release_held(&self, now: Instant) {
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
                self.counters.count_tx_datagrams(1);
            }
            Err(e) => {
                // Lost like a dropped frame: the RC retransmission recovers.
                tracing::debug!(device = %self.cfg.name, error = %e, %to, "sendto");
                self.counters.send_err.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Batches of up to this many packets keep their trailers in a small array.
const SMALL_TRAILERS: usize = 4;

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
