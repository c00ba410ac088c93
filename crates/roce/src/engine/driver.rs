//! The per-device progress thread: `epoll_wait` (through mio) on the device's UDP socket
//! and a waker, with the earliest QP timer as its timeout. Nothing to read and no timer
//! armed: it sleeps without a timeout, so an idle device costs no CPU.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use super::DevInner;

const SOCKET: Token = Token(0);
pub(super) const WAKER: Token = Token(1);
/// The tokens of multicast group sockets count from here.
pub(super) const FIRST_GROUP: usize = 2;

/// Registers the device's socket with `poll` and starts the thread.
pub(super) fn start(poll: Poll, dev: &Arc<DevInner>) -> std::io::Result<()> {
    for fd in dev.rx_fds() {
        poll.registry()
            .register(&mut SourceFd(&fd), SOCKET, Interest::READABLE)?;
    }
    let _ = dev.registry.set(poll.registry().try_clone()?);
    let weak = Arc::downgrade(dev);
    std::thread::Builder::new()
        .name(format!("{}-progress", dev.cfg.name))
        .spawn(move || run(poll, weak))?;
    Ok(())
}

/// An application thread that drove progress this recently counts as busy-polling: the
/// progress thread stops waking on the socket (like the iWARP driver's mute, or Linux's
/// busy polling), so the two do not take turns on the same datagrams.
const BUSY_POLL_RECENT: Duration = Duration::from_micros(500);
/// While muted, the progress thread checks this often whether the poller went away.
const MUTED_CHECK: Duration = Duration::from_millis(1);
/// How long the progress thread leaves what a busy poller's receive deferred (an ACK, most
/// often) to that poller, whose next post carries it in the reply's train: woken for a
/// deferral (`DevInner::drain_rx_as`), it sleeps out the rest of this and then sends it.
/// Sending it at once made a loaded poller's ACK leave alone whenever the progress thread
/// listened (session 16: up to 364 of 400 round trips beside two busy loops).
pub(super) const DEFER_HOLD: Duration = MUTED_CHECK;

thread_local! {
    static PROGRESS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is a device's progress thread.
pub(super) fn on_progress_thread() -> bool {
    PROGRESS.get()
}

fn run(mut poll: Poll, dev: Weak<DevInner>) {
    PROGRESS.set(true);
    let mut events = Events::with_capacity(16);
    let mut muted = false;
    loop {
        let timeout = {
            let Some(d) = dev.upgrade() else { return };
            if d.stop.load(Ordering::SeqCst) {
                return;
            }
            let fds = d.rx_fds();
            // Announced before `last_poll` is read: a poller that parks meanwhile sees it
            // and wakes this thread (`DevInner::poller_parked`).
            d.muted.store(true, Ordering::SeqCst);
            // A thread asleep on the socket in an inline CQ wait receives itself, as a
            // busy poller does.
            let busy = d.busy_polled(BUSY_POLL_RECENT) || d.inline_waiters.load(Ordering::SeqCst) > 0;
            if busy && !muted {
                muted = fds
                    .iter()
                    .all(|fd| match poll.registry().deregister(&mut SourceFd(fd)) {
                        Ok(()) => true,
                        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                    });
                d.counters.progress_mutes.fetch_add(1, Ordering::Relaxed);
            } else if !busy && muted {
                // EPOLL_CTL_ADD checks readiness: datagrams queued meanwhile raise an event.
                muted = !fds.iter().all(|fd| {
                    match poll.registry().register(&mut SourceFd(fd), SOCKET, Interest::READABLE) {
                        Ok(()) => true,
                        Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
                    }
                });
                d.drain_sockets(false);
            }
            // Stored before `has_deferred` is read: a poller that defers after the read
            // sees the thread unmuted and wakes it (`DevInner::drain_rx_as`).
            d.muted.store(muted, Ordering::SeqCst);
            let now = Instant::now();
            let t = d.sleep_deadline().map(|t| t.saturating_duration_since(now));
            let t = if muted {
                Some(t.map_or(MUTED_CHECK, |t| t.min(MUTED_CHECK)))
            } else {
                t
            };
            // Deferred transmissions (a busy poller's) are sent within DEFER_HOLD even if
            // the poller stops calling.
            match d.deferral_left(now, DEFER_HOLD) {
                Some(left) => Some(t.map_or(left, |t| t.min(left))),
                None => t,
            }
        };
        if let Err(e) = poll.poll(&mut events, timeout)
            && e.kind() != std::io::ErrorKind::Interrupted
        {
            tracing::error!(error = %e, "RoCEv2 progress thread: epoll_wait failed");
            return;
        }
        let Some(d) = dev.upgrade() else { return };
        if d.stop.load(Ordering::SeqCst) {
            return;
        }
        d.awake();
        // Edge-triggered: drain whenever woken (a waker wake-up may hide a socket edge
        // consumed in the same batch); while muted the busy poller drains.
        if !muted {
            d.drain_sockets(false);
        }
        let now = Instant::now();
        d.fire_timers(now);
        // What a busy-polling application deferred, if it stopped calling.
        if d.deferral_left(now, DEFER_HOLD).is_some_and(|left| left.is_zero()) {
            d.counters.progress_flushes.fetch_add(1, Ordering::Relaxed);
            d.flush_deferred();
        }
    }
}
