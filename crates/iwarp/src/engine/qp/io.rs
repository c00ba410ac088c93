//! The socket side of a QP: the non-blocking TCP stream, `read` into the
//! receive buffer ([`RxIo`], `rx_buf.rs`, which deframes and hands the
//! protocol core what arrived), `readv` of a directly placed payload
//! straight into its region, `writev` of the transmit queue, and the
//! progress hooks (epoll driver, CQ polling, busy polling). The protocol
//! state ([`Proto`]) does no I/O; this module moves bytes between it and the
//! socket.

use super::rx_buf::{RxIo, TAGGED_FPDU_HEAD};
use super::*;
use crate::engine::sockio::IoPart;
use verbs::provider::CqProviderExt;

struct Core {
    p: Proto,
    rx: RxIo,
}

/// A connected iWARP QP.
pub struct IwarpQp {
    sock: TcpStream,
    driver: Arc<Driver>,
    token: Mutex<Option<mio::Token>>,
    busy: BusyPoll,
    /// The progress thread saw the peer close (or a socket error): read to
    /// the end of stream rather than stopping at a short read.
    rx_closed: std::sync::atomic::AtomicBool,
    core: Mutex<Core>,
    poke: Poke,
    /// A peer's request was answered (see [`Pollable::on_event`]'s result).
    answered: std::sync::atomic::AtomicBool,
    state: Arc<AtomicU8>,
    info: ConnInfo,
}

impl IwarpQp {
    /// Wraps an MPA-negotiated socket. `leftover` are bytes read past the MPA
    /// frame during the handshake (the peer's first FPDUs).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        sock: TcpStream,
        leftover: Vec<u8>,
        driver: Arc<Driver>,
        req: &QpSetup,
        initial_recvs: Vec<RecvWr>,
        qpn: u32,
        neg: Negotiated,
        siw_term_form: bool,
        max_ulpdu: usize,
    ) -> std::io::Result<Arc<IwarpQp>> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        let p = Proto::new(
            qpn,
            req.pd_id,
            req.mem.clone(),
            req.send_cq.clone(),
            req.recv_cq.clone(),
            req.events.clone(),
            req.attr.clone(),
            &neg,
            siw_term_form,
            max_ulpdu,
        );
        let mut buf = vec![0u8; RX_BUF + 70_000];
        let n = leftover.len().min(buf.len());
        buf[..n].copy_from_slice(&leftover[..n]);
        let rx = RxIo {
            deframer: Deframer::new(DeframerConfig {
                crc: neg.crc,
                markers: neg.markers_rx,
                ..Default::default()
            }),
            buf,
            start: 0,
            end: n,
            eof: false,
            direct: None,
        };
        let mut p = p;
        // Receives the application posted before the connection went live
        // (rdma_cm order: post_recv, then accept/connect).
        if !initial_recvs.is_empty() {
            p.post_recv(&initial_recvs)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        }
        let p_state = p.shared_state.clone();
        let established_now = !matches!(neg.rtr, Some(RtrRole::Expect(_)));
        let qp = Arc::new(IwarpQp {
            sock,
            driver: driver.clone(),
            token: Mutex::new(None),
            busy: BusyPoll::new(),
            rx_closed: std::sync::atomic::AtomicBool::new(false),
            core: Mutex::new(Core { p, rx }),
            poke: Poke::new(),
            answered: std::sync::atomic::AtomicBool::new(false),
            state: p_state,
            info: neg.info.clone(),
        });
        if established_now {
            req.events.push(CmEvent::Established);
        }
        let weak: Weak<dyn Pollable> = Arc::downgrade(&qp) as Weak<dyn Pollable>;
        let prog: Weak<dyn Progress> = Arc::downgrade(&qp) as Weak<dyn Progress>;
        req.send_cq.attach(prog.clone());
        if !req.recv_cq.same(&req.send_cq) {
            req.recv_cq.attach(prog);
        }
        let t = driver.register(qp.sock.as_raw_fd(), weak)?;
        *qp.token.lock().unwrap() = Some(t);
        // Bytes that came with the handshake, and an RTR to send.
        qp.kick();
        Ok(qp)
    }

    /// Runs transmit and receive progress if no other thread is doing it.
    /// Waiters woken by the completions it delivers are woken after the QP's lock is
    /// released ([`verbs::provider::defer_cq_wakeups`]), so they do not sleep on it.
    fn kick(&self) -> bool {
        verbs::provider::defer_cq_wakeups(|| self.poke.run(&self.core, |c| self.work(c)))
    }

    /// Reads until the socket is drained, then sends what that produced and
    /// what was posted. The socket is not read again after sending: data that
    /// arrives later raises a new epoll edge (or, while the QP is muted, the
    /// busy poller's next poll reads it), so another `read` here would only
    /// return `EAGAIN` (issue 18: one fewer system call per poll that finds data).
    fn work(&self, c: &mut Core) -> bool {
        let rx = self.pump_rx(c);
        let tx = self.pump_tx(&mut c.p);
        if std::mem::take(&mut c.p.answered) {
            self.answered.store(true, Ordering::Release);
        }
        rx | tx
    }

    /// After a Terminate: reads and drops what the socket has; at end of stream the
    /// connection is closed (the Disconnected event, as for any close).
    fn discard_rx(&self, rx: &mut RxIo, p: &mut Proto) -> bool {
        let mut any = false;
        loop {
            rx.start = 0;
            rx.end = 0;
            match (&self.sock).read(&mut rx.buf[..]) {
                Ok(0) => {
                    rx.eof = true;
                    p.on_stream_error(None, "peer closed the connection");
                    return true;
                }
                Ok(_) => any = true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return any,
                Err(e) => {
                    rx.eof = true;
                    p.on_stream_error(None, &e.to_string());
                    return true;
                }
            }
        }
    }

    /// Reads and processes everything the socket has.
    fn pump_rx(&self, c: &mut Core) -> bool {
        let mut any = false;
        let Core { p, rx } = c;
        let fd = self.sock.as_raw_fd();
        loop {
            // Whole FPDUs, direct placements begun or finished (no I/O).
            any |= rx.process(p);
            if rx.eof {
                break;
            }
            if p.term_sent || p.term_received {
                // Nothing after a Terminate is processed (RDMAP-TRM-06), but the stream is
                // still read and dropped until the peer closes: a socket closed with unread
                // bytes sends an RST, and an RST can reach the peer before it has read our
                // Terminate, which it then never sees (siw: no "got TERMINATE").
                any |= self.discard_rx(rx, p);
                break;
            }
            // More of a stream that keeps coming: wake now whoever the completions so far
            // are for, rather than after the whole run of reads.
            verbs::provider::flush_cq_wakeups();
            count_socket_read();
            let res = match rx.direct.as_mut() {
                Some(d) if d.done < d.len => {
                    // The payload straight into place, the trailer and the
                    // next FPDU's header into the buffer, in one readv.
                    rx.start = 0;
                    rx.end = 0;
                    let tail = d.trailer + TAGGED_FPDU_HEAD;
                    let asked = d.len - d.done + tail;
                    crate::engine::sockio::recv_into_then(
                        &d.buf,
                        fd,
                        d.off + d.done,
                        d.len - d.done,
                        &mut rx.buf[..tail],
                    )
                    .map(|n| {
                        let placed = n.min(d.len - d.done);
                        d.done += placed;
                        rx.end = n - placed;
                        (n, asked)
                    })
                }
                _ => {
                    rx.make_room();
                    let asked = rx.buf.len() - rx.end;
                    // EAGAIN and EINTR told from errno, no `io::Error` built and decoded for
                    // the empty read of every busy poll (issue 18, session 17).
                    match crate::engine::sockio::recv(fd, &mut rx.buf[rx.end..]) {
                        crate::engine::sockio::Recv::Data(n) => {
                            rx.end += n;
                            Ok((n, asked))
                        }
                        crate::engine::sockio::Recv::WouldBlock => break,
                        crate::engine::sockio::Recv::Interrupted => continue,
                        crate::engine::sockio::Recv::Failed(e) => Err(e),
                    }
                }
            };
            match res {
                Ok((0, _)) => {
                    rx.eof = true;
                    p.on_stream_error(None, "peer closed the connection");
                    any = true;
                    break;
                }
                Ok((n, asked)) if n < asked && !self.rx_closed.load(Ordering::Acquire) => {
                    // A short read of a stream socket drained it (epoll(7)): what comes
                    // later raises a new edge, so process this and stop without the
                    // read that would only say EAGAIN. Not once the peer closed: the
                    // end of stream behind the data raises no new edge, so it is read now.
                    any = true;
                    any |= rx.process(p);
                    break;
                }
                Ok(_) => any = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    rx.eof = true;
                    p.on_llp_error(&e.to_string());
                    any = true;
                    break;
                }
            }
        }
        any
    }

    /// Frames pending work and writes it until the socket would block.
    fn pump_tx(&self, p: &mut Proto) -> bool {
        let mut any = false;
        if p.lean_pending() {
            // A lean message (`lean.rs`): one writev of its one FPDU; what the socket did
            // not take goes onto the transmit queue below, as does an error's handling.
            any = true;
            let fd = self.sock.as_raw_fd();
            loop {
                match crate::engine::sockio::writev(fd, &[IoPart::Bytes(p.lean_bytes())]) {
                    Ok(n) => p.lean_written(n),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => p.lean_written(0),
                }
                break;
            }
        }
        loop {
            any |= p.fill_tx();
            if p.tx_pending() == 0 {
                break;
            }
            match p.tx_queue().write_to(self.sock.as_raw_fd()) {
                Ok(n) => {
                    p.consumed_out(n);
                    any = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    p.discard_out();
                    p.on_llp_error(&e.to_string());
                    break;
                }
            }
        }
        if p.shutdown_when_drained && !p.shut && p.tx_pending() == 0 {
            p.shut = true;
            let _ = self.sock.shutdown(std::net::Shutdown::Write);
        }
        any
    }

    /// Runs `f` on the protocol state and sends what it queued. The socket is
    /// not read here: receiving is the poller's or the progress thread's job,
    /// and an epoll edge that came while this thread held the lock left a
    /// poke, which is run before returning.
    fn with_core<R>(&self, f: impl FnOnce(&mut Proto) -> R) -> R {
        let mut c = match self.core.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::WouldBlock) => {
                CORE_LOCK_WAITS.fetch_add(1, Ordering::Relaxed);
                self.core.lock().unwrap()
            }
            Err(std::sync::TryLockError::Poisoned(e)) => panic!("{e}"),
        };
        let r = f(&mut c.p);
        self.pump_tx(&mut c.p);
        c.p.expire_posted();
        drop(c);
        if self.poke.pending() {
            self.kick();
        }
        r
    }
}

impl Pollable for IwarpQp {
    fn on_event(&self, readable: bool, _writable: bool, closed: bool) -> bool {
        PROGRESS_EVENTS.fetch_add(1, Ordering::Relaxed);
        if closed {
            self.rx_closed.store(true, Ordering::Release);
        }
        if readable {
            self.kick();
        } else {
            // Room to write, nothing to read: no `read` that would say EAGAIN.
            // A poke left meanwhile may be a readable edge, so re-runs do everything.
            let mut first = true;
            verbs::provider::defer_cq_wakeups(|| {
                self.poke.run(&self.core, |c| {
                    if std::mem::take(&mut first) {
                        self.pump_tx(&mut c.p)
                    } else {
                        self.work(c)
                    }
                })
            });
        }
        self.answered.swap(false, Ordering::AcqRel)
    }
    fn still_muted(&self) -> Muted {
        MUTE_CHECKS.fetch_add(1, Ordering::Relaxed);
        // A declared spinner (`spin_begin`) arms the unmute timer when it ends, as an
        // inline waiter does when it leaves: no periodic check meanwhile.
        if self.busy.waiter.load(Ordering::Acquire) || self.busy.declared.load(Ordering::Acquire) > 0 {
            return Muted::Waited;
        }
        if !self.busy.idle_for(BUSY_POLL_IDLE) {
            return Muted::Polled;
        }
        self.unmute();
        Muted::No
    }
}

/// `read`/`readv` calls on QP sockets in this process (the receive path's
/// system calls), for tests that bound them per message (issue 18). Sharded by
/// thread: two threads busy-polling in one process (a ping-pong's two ends)
/// each bump the counter on every empty poll, and one shared counter moved its
/// cache line between their cores on every poll (issue 18, session 13).
static SOCKET_READS: [ReadShard; READ_SHARDS] =
    [const { ReadShard(std::sync::atomic::AtomicU64::new(0)) }; READ_SHARDS];
const READ_SHARDS: usize = 8;

/// One shard of [`SOCKET_READS`], on a cache line of its own.
#[repr(align(128))]
struct ReadShard(std::sync::atomic::AtomicU64);

fn count_socket_read() {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % READ_SHARDS;
    }
    let i = SHARD.with(|s| *s);
    SOCKET_READS[i].0.fetch_add(1, Ordering::Relaxed);
}

/// How many `read`/`readv` calls the QPs of this process have made on their
/// sockets: a diagnostic for tests and benchmarks that count system calls per
/// message (each QP reads until a short read; none is made by `post_send` or
/// `post_recv`).
pub fn socket_reads() -> u64 {
    SOCKET_READS.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
}

/// Times `post_send`/`post_recv` found the QP's lock held and had to wait for it.
static CORE_LOCK_WAITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a `post_send` or `post_recv` on a QP of this process found the QP's lock
/// held by another thread (the progress thread, usually) and waited for it: a diagnostic for
/// tests that count per message. A thread woken by a completion should not find the lock
/// still held by the thread that woke it (issue 18: completions' wake-ups are deferred until
/// the lock is released).
pub fn core_lock_waits() -> u64 {
    CORE_LOCK_WAITS.load(Ordering::Relaxed)
}

/// A poller that has polled without a gap this long is busy-polling.
const BUSY_POLL_AFTER: Duration = Duration::from_micros(20);
/// A gap between polls this long ends busy polling.
const BUSY_POLL_GAP: Duration = Duration::from_micros(10);
/// A busy poller silent this long is gone: the progress thread takes over.
const BUSY_POLL_IDLE: Duration = Duration::from_micros(100);

impl IwarpQp {
    /// Mutes the progress thread's readable wake-ups for this socket (an application
    /// thread reads it: `periodic`, by busy polling; else asleep in an inline CQ wait).
    /// The flag and the epoll set change together, under the token's lock.
    fn mute(&self, periodic: bool) {
        let token = self.token.lock().unwrap();
        if let Some(t) = *token
            && !self.busy.muted.swap(true, Ordering::AcqRel)
        {
            self.driver.mute(self.sock.as_raw_fd(), t, periodic);
        }
    }

    fn unmute(&self) {
        let token = self.token.lock().unwrap();
        if let Some(t) = *token
            && self.busy.muted.swap(false, Ordering::AcqRel)
        {
            self.driver.unmute(self.sock.as_raw_fd(), t);
            drop(token);
            self.kick();
        }
    }
}

impl Progress for IwarpQp {
    fn progress(&self) -> bool {
        let polled = self.busy.note_poll(BUSY_POLL_GAP, BUSY_POLL_AFTER);
        if !self.busy.muted.load(Ordering::Acquire) {
            // An application thread spins on this QP's CQ: it reads the
            // socket itself, so the progress thread need not wake for it.
            // A declared spinner's QP was muted when it declared; it is muted
            // again here if a parked wait handed it back meanwhile.
            if self.busy.declared.load(Ordering::Acquire) > 0 {
                self.mute(false);
            } else if polled {
                self.mute(true);
            }
        }
        self.kick()
    }
    /// Issue 18: a thread declared it busy-polls this QP's CQ (the RPC caller in
    /// busy-poll mode): the progress thread is muted for this socket at once and
    /// stays muted for the whole declaration, however the spinner is preempted
    /// (the heuristic of [`progress`](Self::progress), 20 µs of polls without a
    /// 10 µs gap, broke every few calls on 2 shared vCPUs, and each break cost
    /// the progress thread a wake-up per message). No periodic check meanwhile:
    /// the end of the declaration arms the unmute timer.
    fn spin_begin(&self) {
        self.busy.declared.fetch_add(1, Ordering::AcqRel);
        self.busy.last.store(now_ns(), Ordering::Release);
        if !self.busy.muted.load(Ordering::Acquire) {
            self.mute(false);
        }
    }
    /// The declaration ended: as when an inline waiter leaves, the QP stays muted
    /// for [`BUSY_POLL_IDLE`] (the spinner's next call is usually microseconds
    /// away), then the unmute timer hands the socket back to the progress thread.
    fn spin_end(&self) {
        self.busy.last.store(now_ns(), Ordering::Release);
        self.busy.declared.fetch_sub(1, Ordering::AcqRel);
        self.driver.arm_unmute_timer(BUSY_POLL_IDLE);
    }
    fn parked(&self) {
        self.unmute();
    }
    /// Issue 18: the CQ's waiter sleeps on the socket and receives itself (one
    /// wake-up per message, as a blocking TCP reader), the progress thread muted
    /// meanwhile. The mute outlives the wait by [`BUSY_POLL_IDLE`] (a ping-pong's
    /// waiter is back within microseconds, and an `epoll_ctl` each way per message
    /// would each also wake the progress thread with a writable event); the
    /// unmute timer then hands the socket back if nobody came.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        if self.state() != QpState::Rts || self.rx_closed.load(Ordering::Acquire) {
            return None;
        }
        self.busy.waiter.store(true, Ordering::Release);
        if !self.busy.muted.load(Ordering::Acquire) {
            self.mute(false);
        }
        Some(self.sock.as_raw_fd())
    }
    fn wait_ready(&self) -> bool {
        INLINE_WAKEUPS.fetch_add(1, Ordering::Relaxed);
        // Another thread drives this QP now (e.g. an RPC server's pool thread posting a
        // Reply with a 1 MiB Write: the whole send copy). `kick` would leave it a poke and
        // return, and the CQ waiter's next `poll` finds the socket still readable at once:
        // a busy loop for as long as the holder sends (issues 17/18, session 15: 300 µs of
        // an RPC worker's CPU per 1 MiB call). Sleep on the lock until the holder is done,
        // then receive as usual.
        if let Err(std::sync::TryLockError::WouldBlock) = self.core.try_lock().map(drop) {
            INLINE_WAITS_FOR_HOLDER.fetch_add(1, Ordering::Relaxed);
            drop(self.core.lock());
        }
        self.kick();
        self.state() == QpState::Rts
    }
    fn wait_done(&self) {
        self.busy.last.store(now_ns(), Ordering::Release);
        self.busy.waiter.store(false, Ordering::Release);
        self.driver.arm_unmute_timer(BUSY_POLL_IDLE);
    }
}

/// Events the progress thread handled for a QP (see [`progress_thread_events`]).
static PROGRESS_EVENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Mute checks the progress thread made (see [`progress_thread_mute_checks`]).
static MUTE_CHECKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many socket events (readable, writable, closed) a device's progress thread handled
/// for the QPs of this process: its runs on their behalf, a diagnostic for tests that
/// count how often the progress thread works while an application thread polls itself.
pub fn progress_thread_events() -> u64 {
    PROGRESS_EVENTS.load(Ordering::Relaxed)
}

/// How many times a progress thread asked a muted QP of this process whether it is still
/// muted (every 100 µs while one is busy-polled without a declaration, and when the unmute
/// timer fires): the progress thread's other runs for QPs, for the same tests.
pub fn progress_thread_mute_checks() -> u64 {
    MUTE_CHECKS.load(Ordering::Relaxed)
}

/// Times an inline CQ waiter woke on a QP socket while another thread drove the QP, and
/// slept until it was done (see [`inline_waits_for_holder`]).
static INLINE_WAITS_FOR_HOLDER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times an application thread in an inline CQ wait, woken by a QP's socket, found
/// another thread driving that QP and slept until it was done instead of polling the still
/// readable socket again (a busy loop before session 15), in this process: a diagnostic for
/// tests that count it.
pub fn inline_waits_for_holder() -> u64 {
    INLINE_WAITS_FOR_HOLDER.load(Ordering::Relaxed)
}

/// Times an inline CQ waiter woke on a QP socket and received (see [`inline_wakeups`]).
static INLINE_WAKEUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times an application thread asleep in a CQ wait was woken by a QP's socket
/// and received what came itself (issue 18's inline wait), in this process: a diagnostic
/// for tests that count wake-ups per message.
pub fn inline_wakeups() -> u64 {
    INLINE_WAKEUPS.load(Ordering::Relaxed)
}

/// Busy-poll bookkeeping of one QP (timestamps in ns since a process epoch).
struct BusyPoll {
    last: std::sync::atomic::AtomicU64,
    since: std::sync::atomic::AtomicU64,
    muted: std::sync::atomic::AtomicBool,
    /// An application thread sleeps on the socket in an inline CQ wait.
    waiter: std::sync::atomic::AtomicBool,
    /// Application threads that declared they busy-poll this QP's CQ
    /// ([`verbs::CompletionQueue::declare_spin`]).
    declared: std::sync::atomic::AtomicU32,
}

fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

impl BusyPoll {
    fn new() -> Self {
        BusyPoll {
            last: 0.into(),
            since: 0.into(),
            muted: false.into(),
            waiter: false.into(),
            declared: 0.into(),
        }
    }
    /// Records a poll; true when the QP is busy-polled (it should be muted).
    fn note_poll(&self, gap: Duration, after: Duration) -> bool {
        let now = now_ns();
        let last = self.last.swap(now, Ordering::AcqRel);
        if now.saturating_sub(last) > gap.as_nanos() as u64 {
            self.since.store(now, Ordering::Release);
            return false;
        }
        now.saturating_sub(self.since.load(Ordering::Acquire)) >= after.as_nanos() as u64
    }
    fn idle_for(&self, d: Duration) -> bool {
        now_ns().saturating_sub(self.last.load(Ordering::Acquire)) >= d.as_nanos() as u64
    }
}

/// The data path's side of the verbs, called by [`super::handle::QpHandle`].
impl IwarpQp {
    pub(crate) fn state(&self) -> QpState {
        code_state(self.state.load(Ordering::Acquire))
    }
    #[inline]
    pub(crate) fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        self.with_core(|p| p.post_send(wrs))
    }
    #[inline]
    pub(crate) fn post_send_owned(&self, wr: SendWr) -> Result<()> {
        self.with_core(|p| p.post_send_owned(wr))
    }
    #[inline]
    pub(crate) fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        self.with_core(|p| p.post_recv(wrs))
    }
    /// Graceful disconnect: flush, then close the stream once what is framed is sent.
    pub(crate) fn disconnect(&self) {
        self.with_core(|p| {
            p.disconnect();
            if !p.disconnected_event {
                p.disconnected_event = true;
                p.events.push(CmEvent::Disconnected);
            }
        });
    }
    pub(crate) fn set_error(&self) {
        self.with_core(|p| p.enter_error());
    }
    /// The negotiated IRD (inbound Reads/atomics at once).
    pub(crate) fn ird(&self) -> u32 {
        self.info.responder_resources
    }
    /// The negotiated ORD (outbound Reads/atomics at once).
    pub(crate) fn ord(&self) -> u32 {
        self.info.initiator_depth
    }
}

impl Drop for IwarpQp {
    fn drop(&mut self) {
        if let Some(t) = self.token.lock().unwrap().take() {
            self.driver.deregister(self.sock.as_raw_fd(), t);
        }
    }
}
