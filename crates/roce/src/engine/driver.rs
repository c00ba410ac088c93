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

fn run(mut poll: Poll, dev: Weak<DevInner>) {
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
                d.drain_rx();
            }
            // Stored before `has_deferred` is read: a poller that defers after the read
            // sees the thread unmuted and wakes it (`DevInner::drain_rx_as`).
            d.muted.store(muted, Ordering::SeqCst);
            let t = d.sleep_deadline().map(|t| t.saturating_duration_since(Instant::now()));
            // Deferred transmissions (a busy poller's) are sent within MUTED_CHECK even if
            // the poller stops calling.
            if muted || d.has_deferred.load(Ordering::SeqCst) {
                Some(t.map_or(MUTED_CHECK, |t| t.min(MUTED_CHECK)))
            } else {
                t
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
            d.drain_rx();
        }
        d.fire_timers(Instant::now());
        // What a busy-polling application deferred, if it stopped calling.
        if d.has_deferred.load(Ordering::Acquire) {
            d.counters.progress_flushes.fetch_add(1, Ordering::Relaxed);
        }
        d.flush_deferred();
    }
}
