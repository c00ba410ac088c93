//! The per-device progress thread: one epoll set (via mio) over every
//! connection's TCP socket.
//!
//! mio is edge-triggered, so each connection drains its socket until
//! `EAGAIN` whenever it is poked. Progress may also run in application
//! threads (`post_send` transmits inline, `poll_cq` receives inline); a
//! connection serialises those with try-locks plus a "poke pending" flag, so
//! an edge that arrives while another thread holds the lock is never lost
//! (see [`Poke`]). When no socket has work the thread sleeps in `epoll_wait`:
//! an idle device uses no CPU.

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Something the progress thread drives.
pub(crate) trait Pollable: Send + Sync {
    /// The socket may be readable and/or writable: make non-blocking progress.
    /// `closed`: the peer closed its side or the socket has an error, so a
    /// short read no longer means nothing more is to be read (the end of
    /// stream must still be read, and raises no further edge). Returns
    /// whether a peer's request (RDMA Read, Atomic) was answered since the
    /// last call: the thread then stays awake for the next one
    /// ([`IwarpConfig::responder_spin`](super::IwarpConfig::responder_spin)).
    fn on_event(&self, readable: bool, writable: bool, closed: bool) -> bool;
    /// Called on muted connections every [`UNMUTE_CHECK`] while one of them
    /// is busy-polled, and when the unmute timer ([`Driver::arm_unmute_timer`])
    /// fires: whether the connection is still muted and why.
    fn still_muted(&self) -> Muted {
        Muted::No
    }
}

/// A muted connection's answer to [`Pollable::still_muted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Muted {
    /// It unmuted itself (its poller or waiter went away).
    No,
    /// An application thread busy-polls it: check again in [`UNMUTE_CHECK`].
    Polled,
    /// An application thread sleeps on its socket (an inline CQ wait) and
    /// arms the unmute timer when it leaves: no periodic check needed.
    Waited,
}

/// How often the progress thread checks muted connections.
pub(crate) const UNMUTE_CHECK: Duration = Duration::from_micros(100);

/// While it stays awake after answering a request, the progress thread reads the
/// answering connections' sockets itself (a `read` each, as a busy TCP server spins on
/// `recv`) and polls `epoll_wait` for everything else on one pass in this many.
const HOT_EPOLL_EVERY: u32 = 16;

/// Most connections read directly while the thread stays awake.
const HOT_MAX: usize = 4;

/// Requests answered in a pass that read a hot connection directly (see [`hot_answers`]).
static HOT_ANSWERS: AtomicU64 = AtomicU64::new(0);

/// How many times a progress thread of this process, staying awake after a peer's
/// request, read that connection's socket itself (without `epoll_wait`) and answered
/// the next request it found there (issue 18, session 13): a diagnostic for tests that
/// count which path answered the Reads of a requester in a loop.
pub fn hot_answers() -> u64 {
    HOT_ANSWERS.load(Ordering::Relaxed)
}

/// How long the unmute timer runs once set ([`Driver::arm_unmute_timer`]): a QP
/// muted for an inline CQ waiter that went away is handed back to the progress
/// thread within this.
pub(crate) const UNMUTE_TIMER: Duration = Duration::from_millis(2);

/// Progress-thread turns that began with a sleep in `epoll_wait` and answered a
/// peer's request (see [`responder_wakeups`]).
static RESPONDER_WAKEUPS: AtomicU64 = AtomicU64::new(0);

/// How many times a progress thread of this process was woken from a sleep in
/// `epoll_wait` (a wait with a timeout, not a poll while it stays awake) and
/// answered a peer's RDMA Read or Atomic request in that turn: the passive
/// side's wake-ups per Read, a diagnostic for tests that count them (issue 18).
/// A turn whose wait returned at once because the event was already there
/// counts too: what is counted is the code path (wait, or stay awake), not
/// whether the kernel had to wake the thread.
pub fn responder_wakeups() -> u64 {
    RESPONDER_WAKEUPS.load(Ordering::Relaxed)
}

/// Times the unmute timer was set, in this process (see [`unmute_timer_sets`]).
static TIMER_SETS: AtomicU64 = AtomicU64::new(0);

/// How many times a progress thread's unmute timer was set (a `timerfd_settime`
/// each): a diagnostic for tests that count system calls per message.
pub fn unmute_timer_sets() -> u64 {
    TIMER_SETS.load(Ordering::Relaxed)
}

const WAKER: Token = Token(usize::MAX);
const TIMER: Token = Token(usize::MAX - 1);

pub(crate) struct Driver {
    registry: Registry,
    waker: Waker,
    conns: Mutex<HashMap<usize, Weak<dyn Pollable>>>,
    /// Connections whose readable events are muted because an application
    /// thread is busy-polling them (like Linux's NAPI busy polling) or sleeps
    /// on their sockets in an inline CQ wait; the flag: checked periodically.
    muted: Mutex<Vec<(usize, bool)>>,
    /// Fires after an inline waiter left: the progress thread then checks the muted.
    timer: super::sockio::TimerFd,
    /// When the timer is due, in ns since `epoch` (0: not armed).
    timer_due: AtomicU64,
    epoch: std::time::Instant,
    next: AtomicUsize,
    stop: AtomicBool,
    /// See [`IwarpConfig::responder_spin`](super::IwarpConfig::responder_spin).
    responder_spin: Duration,
}

impl Driver {
    /// Starts the progress thread of a device.
    pub(crate) fn start(name: &str, responder_spin: Duration) -> std::io::Result<Arc<Driver>> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let timer = super::sockio::TimerFd::new()?;
        poll.registry()
            .register(&mut SourceFd(&timer.raw()), TIMER, Interest::READABLE)?;
        let d = Arc::new(Driver {
            registry,
            waker,
            conns: Mutex::new(HashMap::new()),
            muted: Mutex::new(Vec::new()),
            timer,
            timer_due: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            next: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
            responder_spin,
        });
        let weak = Arc::downgrade(&d);
        std::thread::Builder::new()
            .name(format!("{name}-progress"))
            .spawn(move || run(poll, weak))?;
        Ok(d)
    }

    /// Adds a connected socket; events go to `conn` until [`deregister`](Self::deregister).
    pub(crate) fn register(&self, fd: RawFd, conn: Weak<dyn Pollable>) -> std::io::Result<Token> {
        let t = Token(self.next.fetch_add(1, Ordering::Relaxed));
        self.conns.lock().unwrap().insert(t.0, conn);
        self.registry
            .register(&mut SourceFd(&fd), t, Interest::READABLE | Interest::WRITABLE)?;
        Ok(t)
    }

    pub(crate) fn deregister(&self, fd: RawFd, token: Token) {
        let _ = self.registry.deregister(&mut SourceFd(&fd));
        self.conns.lock().unwrap().remove(&token.0);
        self.muted.lock().unwrap().retain(|t| t.0 != token.0);
    }

    /// Stops readable wake-ups of this thread for `fd`: an application
    /// thread busy-polls it (`periodic`: the thread checks every
    /// [`UNMUTE_CHECK`] whether it still does) or sleeps on it in an inline
    /// CQ wait (it arms [`arm_unmute_timer`](Self::arm_unmute_timer) when it
    /// leaves), so waking here would only steal a core from it.
    pub(crate) fn mute(&self, fd: RawFd, token: Token, periodic: bool) {
        if self
            .registry
            .reregister(&mut SourceFd(&fd), token, Interest::WRITABLE)
            .is_ok()
        {
            let mut m = self.muted.lock().unwrap();
            let was_periodic = m.iter().any(|t| t.1);
            match m.iter_mut().find(|t| t.0 == token.0) {
                Some(t) => t.1 |= periodic,
                None => m.push((token.0, periodic)),
            }
            drop(m);
            if periodic && !was_periodic {
                // Shorten the sleep so the mute is checked.
                let _ = self.waker.wake();
            }
        }
    }

    /// A muted connection may have lost its last user: the progress thread checks
    /// the muted connections at least `idle` from now. The timer is set for
    /// [`UNMUTE_TIMER`] and set again only when its due time is less than `idle`
    /// away, so a waiter that comes and goes every few microseconds costs one
    /// `timerfd_settime` every ~2 ms and the progress thread no wake-up. (Setting
    /// it on every leave cost 6-7 µs per round trip on the 2-vCPU VM: each setting
    /// reprograms the CPU's timer, a VM exit.)
    pub(crate) fn arm_unmute_timer(&self, idle: Duration) {
        let now = self.epoch.elapsed().as_nanos() as u64;
        if self.timer_due.load(Ordering::Acquire) >= now + idle.as_nanos() as u64 {
            return;
        }
        let span = UNMUTE_TIMER.max(idle);
        self.timer_due.store(now + span.as_nanos() as u64, Ordering::Release);
        self.timer.arm(span);
        TIMER_SETS.fetch_add(1, Ordering::Relaxed);
    }

    /// Restores readable wake-ups; an `epoll_ctl` MOD re-checks readiness,
    /// so data that arrived meanwhile raises an event at once.
    pub(crate) fn unmute(&self, fd: RawFd, token: Token) {
        let _ = self
            .registry
            .reregister(&mut SourceFd(&fd), token, Interest::READABLE | Interest::WRITABLE);
        self.muted.lock().unwrap().retain(|t| t.0 != token.0);
    }

    #[allow(dead_code)]
    pub(crate) fn connections(&self) -> usize {
        self.conns.lock().unwrap().len()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
    }
}

fn run(mut poll: Poll, driver: Weak<Driver>) {
    use std::time::Instant;
    let mut events = Events::with_capacity(256);
    // Until when the thread stays awake (polls with a zero timeout) after it answered a
    // peer's request: the next Read of a requester in a loop finds it running.
    let mut awake_until: Option<Instant> = None;
    // The connections that answered a request while awake: read directly, as a busy
    // TCP server spins on `recv`, rather than through `epoll_wait` (one system call per
    // empty pass instead of `epoll_wait` and `sched_yield`, and the Request is read by
    // the pass that finds it rather than by the pass after its epoll event).
    let mut hot: Vec<(usize, Arc<dyn Pollable>)> = Vec::new();
    let mut passes: u32 = 0;
    loop {
        let awake = awake_until.is_some_and(|t| Instant::now() < t);
        if awake && !hot.is_empty() && !passes.is_multiple_of(HOT_EPOLL_EVERY) {
            passes = passes.wrapping_add(1);
            let mut answered = false;
            for (_, c) in &hot {
                answered |= c.on_event(true, false, false);
            }
            if answered {
                HOT_ANSWERS.fetch_add(1, Ordering::Relaxed);
                if let Some(d) = driver.upgrade() {
                    awake_until = Some(Instant::now() + d.responder_spin);
                }
            }
            continue;
        }
        passes = 1;
        let timeout = match driver.upgrade() {
            None => return,
            Some(_) if awake => Duration::ZERO,
            Some(d) if d.muted.lock().unwrap().iter().any(|t| t.1) => UNMUTE_CHECK,
            Some(_) => Duration::from_secs(1),
        };
        let slept = !timeout.is_zero();
        if slept {
            awake_until = None;
            hot.clear();
        }
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("progress thread: epoll failed: {e}");
            return;
        }
        let Some(d) = driver.upgrade() else { return };
        if d.stop.load(Ordering::Acquire) {
            return;
        }
        if !slept && events.is_empty() {
            // Staying awake and nothing came: the muted connections are checked when
            // the thread next waits (at most `responder_spin` later). The thread gives
            // its core to any other runnable thread meanwhile (on 2 vCPUs that may be
            // the requester itself): it stays awake, not in the way.
            std::thread::yield_now();
            continue;
        }
        let mut answered = false;
        for ev in events.iter() {
            if ev.token() == WAKER {
                continue;
            }
            if ev.token() == TIMER {
                d.timer.drain();
                continue;
            }
            let conn = d.conns.lock().unwrap().get(&ev.token().0).and_then(Weak::upgrade);
            if let Some(c) = conn {
                let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
                let writable = ev.is_writable() || ev.is_write_closed() || ev.is_error();
                let closed = ev.is_read_closed() || ev.is_error();
                let a = c.on_event(readable, writable, closed);
                answered |= a;
                if a && !closed
                    && !d.responder_spin.is_zero()
                    && hot.len() < HOT_MAX
                    && !hot.iter().any(|h| h.0 == ev.token().0)
                {
                    hot.push((ev.token().0, c));
                }
            }
        }
        if answered {
            if slept {
                RESPONDER_WAKEUPS.fetch_add(1, Ordering::Relaxed);
            }
            if !d.responder_spin.is_zero() {
                awake_until = Some(Instant::now() + d.responder_spin);
            }
        }
        let muted: Vec<usize> = d.muted.lock().unwrap().iter().map(|t| t.0).collect();
        for t in muted {
            let conn = d.conns.lock().unwrap().get(&t).and_then(Weak::upgrade);
            let Some(c) = conn else {
                d.muted.lock().unwrap().retain(|x| x.0 != t);
                continue;
            };
            // `No`: the connection unmuted itself (and left the list, which it may have
            // joined again since, so the list is not touched here).
            let now = c.still_muted();
            if now != Muted::No
                && let Some(x) = d.muted.lock().unwrap().iter_mut().find(|x| x.0 == t)
            {
                x.1 = now == Muted::Polled;
            }
        }
    }
}

/// A try-lock around one direction's progress that never loses a wake-up:
/// a thread that cannot get the lock leaves a poke, and the holder re-runs
/// its work before leaving if it finds one.
pub(crate) struct Poke {
    pending: AtomicBool,
}

impl Poke {
    pub(crate) const fn new() -> Self {
        Poke {
            pending: AtomicBool::new(false),
        }
    }

    /// Whether a poke is waiting for the lock's holder (checked by a thread
    /// that took the lock without [`run`](Self::run)).
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Runs `work` under `lock` if it can be had; otherwise records the poke
    /// for the current holder. `work` returns whether it did anything.
    pub(crate) fn run<T>(&self, lock: &Mutex<T>, mut work: impl FnMut(&mut T) -> bool) -> bool {
        let mut did = false;
        loop {
            self.pending.store(true, Ordering::Release);
            let Ok(mut g) = lock.try_lock() else {
                return did;
            };
            self.pending.store(false, Ordering::Release);
            did |= work(&mut g);
            drop(g);
            if !self.pending.load(Ordering::Acquire) {
                return did;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poke_is_not_lost() {
        let lock = Mutex::new(0u32);
        let poke = Poke::new();
        // Holder runs; a second caller arriving meanwhile makes it run again.
        let mut first = true;
        poke.run(&lock, |n| {
            *n += 1;
            if first {
                first = false;
                // Simulate a poke from another thread while the lock is held.
                poke.pending.store(true, Ordering::Release);
            }
            true
        });
        assert_eq!(*lock.lock().unwrap(), 2);
    }
}
