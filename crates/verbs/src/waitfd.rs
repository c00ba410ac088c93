//! The system calls of a completion queue's *inline* wait, where the waiting
//! thread sleeps in `poll(2)` on its QPs' sockets and on an `eventfd` rather
//! than on a condition variable that a provider's progress thread signals
//! (issue 18: one wake-up per message, as a blocking TCP reader has).
//!
//! The second module of `verbs` with `unsafe` code (after `buffer.rs`), for one
//! call: `poll(2)` on the raw descriptors that `Progress::wait_fd` hands out
//! (a safe `poll` wrapper such as rustix's wants borrowed descriptors, and making
//! those from a `RawFd` is just as unsafe). The eventfd is rustix's, an owned
//! descriptor, so its creation, reads and writes are safe code.

use rustix::event::{EventfdFlags, eventfd};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// An `eventfd(2)` that wakes a thread asleep in [`poll_in`].
pub(crate) struct WakeFd(File);

impl WakeFd {
    pub(crate) fn new() -> std::io::Result<WakeFd> {
        let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        Ok(WakeFd(File::from(fd)))
    }

    /// Makes the descriptor readable (one `write`).
    pub(crate) fn wake(&self) {
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }

    /// Makes it unreadable again (one `read`).
    pub(crate) fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = (&self.0).read(&mut b);
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A descriptor to sleep on for `POLLIN` (`revents` after [`poll_in`]).
pub(crate) fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// `poll(2)` for up to `timeout` (`None`: no limit); fills each `revents`.
pub(crate) fn poll_in(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> std::io::Result<usize> {
    let ms = match timeout {
        None => -1,
        // Rounded up, so a short remaining time does not become a busy loop of zero timeouts.
        Some(t) => t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
    };
    // SAFETY: `fds` is a live, exclusively borrowed slice of `pollfd`s and its length is
    // passed with it; the kernel writes only their `revents` fields.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
