//! A RoCEv2 RC queue pair: the sans-I/O core ([`RcQp`]) behind a mutex, its destination,
//! its CQs, and the glue that sends what the core emits and delivers what it completes.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use verbs::cq::Progress;
use verbs::provider::{AsyncEventSink, CqProviderExt, QpCreate, QpOps};
use verbs::{AhAttr, AsyncEvent, CompletionQueue, Error, QpAttr, QpState, RecvWr, Result, SendWr, WcOpcode, WcStatus};

use super::DevInner;
use crate::rc::{RcConfig, RcError, RcQp};

/// Packets sent with one `sendmmsg` at most: four full GSO trains of 4 KiB packets (15
/// each fit in [`super::sys::GSO_MAX_BYTES`]), so a 1 MiB Write at MTU 4096 is 18 trains
/// instead of the 24 a batch of 32 (15 + 15 + 2) made.
pub(crate) const BATCH: usize = 60;

/// Octets of header room per packet of a batch ([`RcQp::MAX_HEADER_LEN`] rounded up).
const HDR_ROOM: usize = 48;
const _: () = assert!(HDR_ROOM >= RcQp::MAX_HEADER_LEN);

/// Batches of at most this many packets (a ping-pong's reply and ACK, one Write) are laid
/// out in arrays of this size: no `BATCH`-long array to initialise per post (issue 13).
const SMALL_BATCH: usize = 4;

/// (header length, payload length, end of its pieces) of each packet of a batch.
type Lens = Vec<(usize, usize, usize)>;

thread_local! {
    /// The headers of one batch, built by `poll_transmit_parts` in this thread (the
    /// payloads stay in registered memory), the batch's pieces and its packets' lengths
    /// (kept between batches: nothing to allocate or clear per post).
    static TX_HDRS: std::cell::RefCell<(Vec<u8>, Vec<crate::rc::Piece>, Lens)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

pub(crate) struct QpInner {
    core: RcQp,
    dest: Option<SocketAddr>,
    /// The address vector of the last move that gave one (RTR, or SQD -> SQD), for `query_qp`.
    ah: Option<AhAttr>,
    /// The earliest timer this QP has queued on the device (none: none queued).
    armed: Option<Instant>,
}

pub(crate) struct QpShared {
    dev: Arc<DevInner>,
    pub(crate) qpn: u32,
    inner: Mutex<QpInner>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    /// The QP's connection events (the IB CM reports through [`crate::gsi::GsiPort::qp_events`]).
    pub(crate) events: Arc<verbs::notify::EventQueue<verbs::CmEvent>>,
    /// The device's asynchronous events (SQ drained).
    async_events: AsyncEventSink,
}

/// The RoCEv2 provider's QP as the verbs layer holds it.
pub struct RoceQp(pub(crate) Arc<QpShared>);

fn rc_err(e: RcError) -> Error {
    match e {
        RcError::State(s, _) => Error::InvalidState(s),
        RcError::QueueFull(_) => Error::QueueFull,
        RcError::InvalidAttr(what) => Error::NotSupported(what.into()),
    }
}

impl QpShared {
    pub(crate) fn new(dev: Arc<DevInner>, qpn: u32, req: QpCreate) -> Arc<QpShared> {
        let mut cfg = RcConfig::new(qpn, req.pd_id, req.mem.clone());
        cfg.sq_sig_all = req.attr.sq_sig_all;
        cfg.max_send_wr = req.attr.max_send_wr.max(1) as usize;
        cfg.max_recv_wr = req.attr.max_recv_wr.max(1) as usize;
        let core = RcQp::new(cfg);
        let q = Arc::new(QpShared {
            dev: dev.clone(),
            qpn,
            inner: Mutex::new(QpInner {
                core,
                dest: None,
                ah: None,
                armed: None,
            }),
            send_cq: req.send_cq.clone(),
            recv_cq: req.recv_cq.clone(),
            events: req.events.clone(),
            async_events: req.async_events.clone(),
        });
        dev.qps.write().unwrap().insert(qpn, Arc::downgrade(&q));
        let w: Weak<dyn Progress> = Arc::downgrade(&q) as Weak<dyn Progress>;
        req.send_cq.attach(w.clone());
        if !req.send_cq.same(&req.recv_cq) {
            req.recv_cq.attach(w);
        }
        q
    }

    /// The core's counters.
    pub(crate) fn stats(&self) -> crate::rc::RcStats {
        self.inner.lock().unwrap().core.stats().clone()
    }

    /// The device this QP is on.
    pub(crate) fn dev(&self) -> &Arc<DevInner> {
        &self.dev
    }

    /// Hands packets for this QP (ICRC checked, parsed) to its core through `place`, under
    /// one lock (the receive path hands a train's run of packets for this QP in one call,
    /// issue 13). `deliver` (an application thread's receive, whose sends are deferred):
    /// the completions go into the CQs before the lock is released, their waiters woken
    /// after; otherwise the device services the QP once its drain is done.
    pub(crate) fn on_packets(&self, now: Instant, deliver: bool, place: impl FnOnce(&mut RcQp)) {
        self.dev.counters.rx_qp_locks.fetch_add(1, Ordering::Relaxed);
        if deliver {
            verbs::provider::defer_cq_wakeups(|| {
                let mut g = self.lock();
                place(&mut g.core);
                self.service_tx(&mut g, now, false);
            })
        } else {
            place(&mut self.lock().core);
        }
    }

    /// Locks the QP, counting the times the lock was held by another thread
    /// ([`qp_lock_waits`]).
    fn lock(&self) -> std::sync::MutexGuard<'_, QpInner> {
        match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::WouldBlock) => {
                QP_LOCK_WAITS.fetch_add(1, Ordering::Relaxed);
                self.inner.lock().unwrap()
            }
            Err(std::sync::TryLockError::Poisoned(e)) => panic!("{e}"),
        }
    }

    /// A timer this QP queued is due. The wake-ups of the completions it delivers come
    /// after the QP's lock is released (see [`QpShared::service_locked`]).
    pub(crate) fn on_timer(&self, now: Instant) {
        verbs::provider::defer_cq_wakeups(|| {
            let mut g = self.lock();
            g.armed = None;
            if g.core.poll_timeout().is_some_and(|t| t <= now) {
                g.core.handle_timeout(now);
            }
            self.service(&mut g, now);
        })
    }

    /// Sends what the core has ready and delivers its completions, waking the threads that
    /// sleep on its CQs only once the QP's lock is released: a thread woken by a completion
    /// (a receiver that re-posts its receive at once) must not run into the lock the waker
    /// still holds while it sends, and sleep on it a second time (issue 13; the iWARP
    /// engine's `defer_cq_wakeups` of session 10).
    pub(crate) fn service_locked(&self) {
        verbs::provider::defer_cq_wakeups(|| {
            let mut g = self.lock();
            self.service(&mut g, Instant::now());
        })
    }

    /// Sends every packet the core has ready, delivers its completions and queues its
    /// timer. Returns whether anything happened.
    fn service(&self, g: &mut QpInner, now: Instant) -> bool {
        self.service_tx(g, now, true)
    }

    fn service_tx(&self, g: &mut QpInner, now: Instant, tx: bool) -> bool {
        let mut any = false;
        // Nothing to send (the common empty busy poll): no batch to set up.
        if let Some(to) = g.dest.filter(|_| tx && g.core.may_transmit()) {
            let core = &mut g.core;
            TX_HDRS.with_borrow_mut(|(buf, pieces, lens)| {
                if buf.len() < BATCH * HDR_ROOM {
                    buf.resize(BATCH * HDR_ROOM, 0);
                }
                loop {
                    lens.clear();
                    pieces.clear();
                    // Asked before each packet: after a ping-pong's reply and ACK, no call
                    // that walks the queues to find nothing.
                    while lens.len() < BATCH && core.may_transmit() {
                        let n = lens.len();
                        match core.poll_transmit_parts(now, &mut buf[n * HDR_ROOM..(n + 1) * HDR_ROOM], pieces) {
                            Some((h, p)) => lens.push((h, p, pieces.len())),
                            None => break,
                        }
                    }
                    let n = lens.len();
                    if n == 0 {
                        break;
                    }
                    any = true;
                    if n <= SMALL_BATCH {
                        self.send_built::<SMALL_BATCH>(to, buf, pieces, lens);
                    } else {
                        self.send_built::<BATCH>(to, buf, pieces, lens);
                    }
                    if n < BATCH {
                        break;
                    }
                }
                // The regions' buffers are not kept alive past the batch.
                pieces.clear();
            });
        }
        while let Some(wc) = g.core.poll_completion() {
            any = true;
            match wc.status {
                WcStatus::RetryExcErr => self.dev.counters.retry_exceeded_err.fetch_add(1, Ordering::Relaxed),
                WcStatus::RnrRetryExcErr => self.dev.counters.retry_rnr_exceeded_err.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
            let cq = match wc.opcode {
                WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => &self.recv_cq,
                _ => &self.send_cq,
            };
            if cq.push(wc).is_err() {
                tracing::warn!(qpn = self.qpn, "CQ overflow: QP to error");
                g.core.set_error();
            }
        }
        if g.core.take_sq_drained_event() {
            any = true;
            self.async_events.raise(AsyncEvent::SqDrained { qp_num: self.qpn });
        }
        if let Some(t) = g.core.poll_timeout()
            && g.armed.is_none_or(|a| t < a)
        {
            g.armed = Some(t);
            self.dev.arm_timer(t, self.qpn);
        }
        any
    }

    /// Sends the batch `poll_transmit_parts` built (`lens.len()` ≤ `N` packets: headers in
    /// `buf`, every `HDR_ROOM` octets, payload pieces in `pieces`), on a stack array of `N`
    /// (no allocation per batch, issue 13).
    fn send_built<const N: usize>(
        &self,
        to: SocketAddr,
        buf: &[u8],
        pieces: &[crate::rc::Piece],
        lens: &[(usize, usize, usize)],
    ) {
        let mut pkts = [super::TxParts::EMPTY; N];
        let mut start = 0;
        for ((t, c), &(h, p, end)) in pkts.iter_mut().zip(buf.chunks(HDR_ROOM)).zip(lens) {
            *t = super::TxParts {
                hdr: &c[..h],
                pieces: &pieces[start..end],
                payload_len: p,
            };
            start = end;
        }
        let pkts = &mut pkts[..lens.len()];
        if ack_goes_last(pkts) {
            pkts.rotate_left(1);
        }
        self.dev.send_parts(to, pkts);
    }
}

/// Times a thread found a QP's lock held by another and waited for it.
static QP_LOCK_WAITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a thread of this process found a RoCEv2 RC QP's lock held by another
/// thread and waited for it (posts, the progress thread's receive and timer work): a
/// diagnostic for tests that count per message. An application woken by a completion
/// should not find the lock still held by the thread that woke it.
pub fn qp_lock_waits() -> u64 {
    QP_LOCK_WAITS.load(Ordering::Relaxed)
}

/// Whether the batch's first packet is an ACK that should go behind the requests that
/// follow it. The core emits responses first; an ACK (20 octets) in front of larger
/// requests would be a datagram of its own, since a GSO train's segments are all as large
/// as its first (only the last may be shorter). Behind them it ends their train: a Send
/// ping-pong's reply and the ACK of the Send it answers cross the kernel as one datagram
/// (one skb on loopback) instead of two. Only behind requests: they are in the other
/// direction's PSN space, so the peer's responder and requester see the same order of
/// their own packets (an ACK behind Read responses would arrive after the responses that
/// acknowledge it implicitly).
pub(crate) fn ack_goes_last(pkts: &[super::TxParts<'_>]) -> bool {
    let opcode = |p: &super::TxParts<'_>| p.hdr.first().copied().unwrap_or(0);
    let is_response = |p: &super::TxParts<'_>| (0x0d..=0x12).contains(&opcode(p));
    pkts.len() >= 2
        && opcode(&pkts[0]) == crate::wire::Opcode::RC_ACKNOWLEDGE.0
        && pkts[0].len() < pkts[1].len()
        && pkts[1..].iter().all(|p| !is_response(p))
}

impl Drop for QpShared {
    fn drop(&mut self) {
        if let Ok(g) = self.inner.get_mut() {
            self.dev.retired.lock().unwrap().add(g.core.stats());
        }
        let mut m = self.dev.qps.write().unwrap();
        if m.get(&self.qpn).is_some_and(|w| w.strong_count() == 0) {
            m.remove(&self.qpn);
        }
    }
}

impl Progress for QpShared {
    fn progress(&self) -> bool {
        // One clock read per poll (there were three): the busy-poll mark and the timers
        // use the same instant.
        let now = Instant::now();
        self.dev.note_poll_at(now);
        let mut any = self.dev.drain_rx_as(true);
        // Deferred by that drain: sent at the next call or post.
        let tx = !self.dev.is_deferred(self);
        // Another thread holds the QP (the progress thread placing a packet, a post): it
        // services the QP before it lets go, so this poll need not wait for it.
        let Ok(mut g) = self.inner.try_lock() else {
            return any;
        };
        if g.core.poll_timeout().is_some_and(|t| t <= now) {
            g.core.handle_timeout(now);
            any = true;
        }
        any |= self.service_tx(&mut g, now, tx);
        any
    }

    /// The poller goes to sleep on the CQ: the progress thread takes the sockets back at
    /// once.
    fn parked(&self) {
        self.dev.poller_parked();
    }

    /// Inline CQ wait (issue 13, as iWARP's of issue 18): the waiting thread sleeps in
    /// `poll(2)` on the device's UDP socket and receives what arrives itself, instead of
    /// the progress thread receiving it and waking the waiter through the CQ (two thread
    /// wake-ups per message). The progress thread stays muted meanwhile (it still runs
    /// timers and sends what a receive deferred within 1 ms). Not on a device with a raw
    /// socket (off loopback with `icrc_rx=auto`): packets arrive on two descriptors there.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        if self.dev.raw.is_some() {
            return None;
        }
        if !matches!(
            self.inner.lock().unwrap().core.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd
        ) {
            return None;
        }
        self.dev.inline_waiters.fetch_add(1, Ordering::SeqCst);
        self.dev.note_poll();
        // A progress thread asleep with the socket in its epoll set would wake for the
        // datagram the waiter receives: it mutes itself now instead (once per idle spell,
        // it stays muted while waits follow each other).
        if !self.dev.muted.load(Ordering::SeqCst) {
            let _ = self.dev.waker.wake();
        }
        Some(self.dev.sock.as_raw_fd())
    }

    /// The socket polled readable: receive (replies deferred into the next post, as a
    /// busy poller's) and deliver.
    fn wait_ready(&self) -> bool {
        INLINE_WAKEUPS.fetch_add(1, Ordering::Relaxed);
        self.progress();
        true
    }

    /// The waiter sleeps again without a completion: what its receive deferred (ACKs, and
    /// the requests an ACK let into the window) is sent now, not at the progress thread's
    /// next muted check (up to 1 ms later; a bulk Write stalled on it once per burst).
    fn wait_idle(&self) {
        self.dev.flush_deferred();
    }

    /// The inline waiter left: the progress thread takes the socket back once no thread
    /// has waited or polled for `BUSY_POLL_RECENT` (500 µs).
    fn wait_done(&self) {
        self.dev.note_poll();
        self.dev.inline_waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Times an inline CQ waiter woke on a RoCEv2 device's socket and received.
static INLINE_WAKEUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times an application thread asleep in a CQ wait was woken by a RoCEv2
/// device's socket and received what came itself (the inline wait), in this process: a
/// diagnostic for tests that count wake-ups per message.
pub fn inline_wakeups() -> u64 {
    INLINE_WAKEUPS.load(Ordering::Relaxed)
}

impl QpOps for RoceQp {
    fn qp_num(&self) -> u32 {
        self.0.qpn
    }

    fn state(&self) -> QpState {
        self.0.inner.lock().unwrap().core.state()
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        let mut g = self.0.lock();
        let mut res = Ok(());
        for wr in wrs {
            if let Err(e) = g.core.post_send(wr) {
                res = Err(rc_err(e));
                break;
            }
        }
        self.0.service(&mut g, Instant::now());
        res
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        let mut g = self.0.lock();
        let mut res = Ok(());
        for wr in wrs {
            if let Err(e) = g.core.post_recv(wr) {
                res = Err(rc_err(e));
                break;
            }
        }
        if g.core.state() == QpState::Err {
            self.0.service(&mut g, Instant::now());
        }
        res
    }

    fn modify_qp(&self, attr: &QpAttr) -> Result<()> {
        let mut g = self.0.inner.lock().unwrap();
        let mut a = attr.clone();
        if let Some(m) = a.path_mtu {
            // The path MTU is at most the port's active MTU (rxe takes the smaller too).
            a.path_mtu = Some(m.min(self.0.dev.cfg.mtu));
        }
        g.core.modify(&a).map_err(rc_err)?;
        if let Some(ah) = &attr.ah_attr {
            g.dest = Some(SocketAddr::new(ah.dgid.to_ip(), crate::wire::ROCEV2_UDP_PORT));
            g.ah = Some(*ah);
        }
        if attr.qp_state == Some(QpState::Reset) {
            g.dest = None;
            g.ah = None;
        }
        self.0.service(&mut g, Instant::now());
        Ok(())
    }

    fn query_qp(&self) -> QpAttr {
        let g = self.0.inner.lock().unwrap();
        let a = g.core.attr();
        QpAttr {
            qp_state: Some(g.core.state()),
            path_mtu: Some(a.path_mtu),
            timeout: Some(a.timeout),
            retry_cnt: Some(a.retry_cnt),
            rnr_retry: Some(a.rnr_retry),
            rq_psn: Some(a.rq_psn.value()),
            sq_psn: Some(a.sq_psn.value()),
            max_rd_atomic: Some(a.max_rd_atomic),
            max_dest_rd_atomic: Some(a.max_dest_rd_atomic),
            min_rnr_timer: Some(a.min_rnr_timer.0),
            dest_qp_num: Some(a.dest_qpn),
            ah_attr: g.ah,
            ..QpAttr::default()
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl RoceQp {
    /// The core's counters.
    pub fn stats(&self) -> crate::rc::RcStats {
        self.0.inner.lock().unwrap().core.stats().clone()
    }
}
