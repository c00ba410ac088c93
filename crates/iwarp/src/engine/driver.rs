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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Something the progress thread drives.
pub(crate) trait Pollable: Send + Sync {
    /// The socket may be readable and/or writable: make non-blocking progress.
    /// `closed`: the peer closed its side or the socket has an error, so a
    /// short read no longer means nothing more is to be read (the end of
    /// stream must still be read, and raises no further edge).
    fn on_event(&self, readable: bool, writable: bool, closed: bool);
    /// Called on muted connections every [`UNMUTE_CHECK`]: returns false
    /// once the connection unmuted itself (its busy poller went away).
    fn still_muted(&self) -> bool {
        false
    }
}

/// How often the progress thread checks muted connections.
pub(crate) const UNMUTE_CHECK: Duration = Duration::from_micros(100);

const WAKER: Token = Token(usize::MAX);

pub(crate) struct Driver {
    registry: Registry,
    waker: Waker,
    conns: Mutex<HashMap<usize, Weak<dyn Pollable>>>,
    /// Connections whose readable events are muted because an application
    /// thread is busy-polling them (like Linux's NAPI busy polling).
    muted: Mutex<Vec<usize>>,
    next: AtomicUsize,
    stop: AtomicBool,
}

impl Driver {
    /// Starts the progress thread of a device.
    pub(crate) fn start(name: &str) -> std::io::Result<Arc<Driver>> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let d = Arc::new(Driver {
            registry,
            waker,
            conns: Mutex::new(HashMap::new()),
            muted: Mutex::new(Vec::new()),
            next: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
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
        self.muted.lock().unwrap().retain(|t| *t != token.0);
    }

    /// Stops readable wake-ups of this thread for `fd`: an application
    /// thread busy-polls it, so waking here would only steal a core from it.
    pub(crate) fn mute(&self, fd: RawFd, token: Token) {
        if self
            .registry
            .reregister(&mut SourceFd(&fd), token, Interest::WRITABLE)
            .is_ok()
        {
            let mut m = self.muted.lock().unwrap();
            let was_empty = m.is_empty();
            m.push(token.0);
            drop(m);
            if was_empty {
                // Shorten the sleep so the mute is checked.
                let _ = self.waker.wake();
            }
        }
    }

    /// Restores readable wake-ups; an `epoll_ctl` MOD re-checks readiness,
    /// so data that arrived meanwhile raises an event at once.
    pub(crate) fn unmute(&self, fd: RawFd, token: Token) {
        let _ = self
            .registry
            .reregister(&mut SourceFd(&fd), token, Interest::READABLE | Interest::WRITABLE);
        self.muted.lock().unwrap().retain(|t| *t != token.0);
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
    let mut events = Events::with_capacity(256);
    loop {
        let timeout = match driver.upgrade() {
            Some(d) if !d.muted.lock().unwrap().is_empty() => UNMUTE_CHECK,
            Some(_) => Duration::from_secs(1),
            None => return,
        };
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
        for ev in events.iter() {
            if ev.token() == WAKER {
                continue;
            }
            let conn = d.conns.lock().unwrap().get(&ev.token().0).and_then(Weak::upgrade);
            if let Some(c) = conn {
                let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
                let writable = ev.is_writable() || ev.is_write_closed() || ev.is_error();
                c.on_event(readable, writable, ev.is_read_closed() || ev.is_error());
            }
        }
        let muted: Vec<usize> = d.muted.lock().unwrap().clone();
        for t in muted {
            let conn = d.conns.lock().unwrap().get(&t).and_then(Weak::upgrade);
            match conn {
                Some(c) => {
                    c.still_muted();
                }
                None => d.muted.lock().unwrap().retain(|x| *x != t),
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
