//! The provider's socket I/O straight into and out of registered memory:
//! `readv` of a tagged payload into its region (direct data placement) and
//! `writev` of a gather list that references regions in place; and the
//! progress thread's `timerfd` ([`TimerFd`]). Socket work
//! is the iWARP engine's; the verbs' [`Buffer`] only lends checked raw ranges
//! ([`Buffer::raw_range`]).

use std::os::fd::RawFd;
use verbs::buffer::{Buffer, OutOfBounds};

fn out_of_bounds(_: OutOfBounds) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, OutOfBounds)
}

/// `readv(2)` from `fd` into `off..off + len` of this buffer, then
/// into `tail` (the next protocol headers): direct data placement that
/// also fetches what follows, in one call. Returns the octets read, the
/// buffer range filled first; 0 means end of stream.
pub fn recv_into_then(buf: &Buffer, fd: RawFd, off: usize, len: usize, tail: &mut [u8]) -> std::io::Result<usize> {
    let (p, _) = buf.raw_range(off, len).map_err(out_of_bounds)?;
    let iov = [
        libc::iovec {
            iov_base: p as *mut libc::c_void,
            iov_len: len,
        },
        libc::iovec {
            iov_base: tail.as_mut_ptr() as *mut libc::c_void,
            iov_len: tail.len(),
        },
    ];
    // SAFETY: the first iovec is a checked range of the live mapping
    // (alive for the borrow of `buf`), the second a borrowed mutable slice; the kernel
    // writes at most their lengths.
    let n = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `read(2)` from `fd` straight into `off..off + len` (direct data
/// placement of a tagged segment's payload). Returns the octets read;
/// 0 means end of stream.
#[cfg(test)]
pub fn recv_into(buf: &Buffer, fd: RawFd, off: usize, len: usize) -> std::io::Result<usize> {
    let (p, _) = buf.raw_range(off, len).map_err(out_of_bounds)?;
    // SAFETY: p..p+len lies inside the live mapping (checked above and
    // kept alive by the borrow of `buf`); the kernel writes at most len octets there.
    let n = unsafe { libc::read(fd, p as *mut libc::c_void, len) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// What one `recv(2)` into a slice found ([`recv`]).
pub enum Recv {
    /// Octets read (0: end of stream).
    Data(usize),
    /// Nothing to read (`EAGAIN`): the common answer to a spinning poller.
    WouldBlock,
    /// A signal came first (`EINTR`).
    Interrupted,
    /// Any other error.
    Failed(std::io::Error),
}

/// `recv(2)` from `fd` into `buf` (the `recvfrom` system call `Read for &TcpStream` makes),
/// telling `EAGAIN` and `EINTR` apart from `errno` without building and decoding an
/// `io::Error` for them: most reads of a busy poller find nothing (issue 18, session 17).
pub fn recv(fd: RawFd, buf: &mut [u8]) -> Recv {
    // SAFETY: `buf` is a borrowed mutable slice; the kernel writes at most its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
    if n >= 0 {
        return Recv::Data(n as usize);
    }
    // SAFETY: `errno` is this thread's, set by the call that just failed; read only.
    match unsafe { *libc::__errno_location() } {
        libc::EAGAIN => Recv::WouldBlock,
        libc::EINTR => Recv::Interrupted,
        code => Recv::Failed(std::io::Error::from_raw_os_error(code)),
    }
}

/// One element of a gather list for [`writev`].
#[derive(Clone, Copy)]
pub enum IoPart<'a> {
    /// Private bytes (headers, trailers, copied data).
    Bytes(&'a [u8]),
    /// A range of a registered buffer, sent without a userspace copy.
    Mem { buf: &'a Buffer, off: usize, len: usize },
}

/// The most parts one [`writev`] call takes (Linux's `IOV_MAX`).
pub const MAX_IO_PARTS: usize = 1024;

/// Gather lists up to this long are built on the stack, without an allocation.
pub const SMALL_IO_PARTS: usize = 16;

/// `writev(2)` of up to [`MAX_IO_PARTS`] parts to the socket `fd` (as `sendmsg` with
/// `MSG_NOSIGNAL`): the kernel copies straight from registered buffers into socket
/// buffers. Returns the octets written (possibly fewer than asked, as `writev` does); a
/// reset connection is `EPIPE`, never SIGPIPE.
pub fn writev(fd: RawFd, parts: &[IoPart<'_>]) -> std::io::Result<usize> {
    let parts = &parts[..parts.len().min(MAX_IO_PARTS)];
    // A small gather list (a latency-sized message: header, payload, trailer) goes
    // through an array on the stack: no allocation per write (issue 18).
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut small = [empty; SMALL_IO_PARTS];
    let mut large: Vec<libc::iovec> = Vec::new();
    let iov: &mut [libc::iovec] = if parts.len() <= SMALL_IO_PARTS {
        &mut small[..parts.len()]
    } else {
        large.resize(parts.len(), empty);
        &mut large[..]
    };
    for (slot, part) in iov.iter_mut().zip(parts) {
        let (base, len) = match *part {
            IoPart::Bytes(b) => (b.as_ptr() as *mut u8, b.len()),
            IoPart::Mem { buf, off, len } => buf.raw_range(off, len).map_err(out_of_bounds)?,
        };
        *slot = libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: len,
        };
    }
    // `sendmsg` with MSG_NOSIGNAL rather than `writev`: a write to a connection the peer
    // has reset must fail with EPIPE (the QP goes to error), not raise SIGPIPE, whose
    // default action ends the whole process (the CLI restores it for `| head`; the bench
    // server died of it when its client was killed, cli.rs
    // bench_server_reports_a_client_that_died_and_exits_non_zero).
    // SAFETY: an all-zero msghdr is valid (no address, no control data); msg_iov points at
    // `iov`, alive for the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: every iovec points at live memory of its stated length: a
    // borrowed slice, or a bounds-checked range of a Buffer borrowed for the
    // call. The kernel only reads them.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A `timerfd(2)` (monotonic clock, non-blocking) in the progress thread's epoll set:
/// it ends the quiet time after an inline CQ waiter left a QP muted (issue 18), so
/// the progress thread needs no periodic wake-up while the waiter sleeps.
pub struct TimerFd(std::fs::File);

impl TimerFd {
    /// A disarmed timer.
    pub fn new() -> std::io::Result<TimerFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: timerfd_create takes no pointers; a non-negative result is a new
        // descriptor that nothing else owns, so the File is its only owner.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: see above.
        Ok(TimerFd(unsafe { std::fs::File::from_raw_fd(fd) }))
    }

    /// Fires once, `after` from now (replacing an earlier setting).
    pub fn arm(&self, after: std::time::Duration) {
        use std::os::fd::AsRawFd;
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos().max(1) as libc::c_long,
            },
        };
        // SAFETY: `spec` lives on the stack for the call; a null old value is allowed.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Reads the expiry count (makes the descriptor unreadable until it fires again).
    pub fn drain(&self) {
        use std::io::Read;
        let mut b = [0u8; 8];
        let _ = (&self.0).read(&mut b);
    }

    /// The descriptor.
    pub fn raw(&self) -> RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writev_recv_into() {
        // (Buffer::scan is tested with the buffer, verbs/src/buffer.rs)
        let b = Buffer::new(10_000).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        b.write(0, &data).unwrap();
        let (mut r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::os::fd::AsRawFd;
        let parts = [
            IoPart::Bytes(b"head"),
            IoPart::Mem {
                buf: &b,
                off: 10,
                len: 20,
            },
            IoPart::Bytes(b"tail"),
        ];
        assert_eq!(writev(w.as_raw_fd(), &parts).unwrap(), 28);
        let bad = [IoPart::Mem {
            buf: &b,
            off: 9_999,
            len: 2,
        }];
        assert!(writev(w.as_raw_fd(), &bad).is_err(), "out of bounds refused");
        let dst = Buffer::new(64).unwrap();
        assert_eq!(recv_into(&dst, r.as_raw_fd(), 4, 28).unwrap(), 28);
        let mut got = [0u8; 28];
        dst.read(4, &mut got).unwrap();
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..24], &data[10..30]);
        assert_eq!(&got[24..], b"tail");
        assert!(recv_into(&dst, r.as_raw_fd(), 60, 8).is_err(), "out of bounds refused");
        assert_eq!(writev(w.as_raw_fd(), &parts).unwrap(), 28);
        let mut tail = [0u8; 10];
        assert_eq!(recv_into_then(&dst, r.as_raw_fd(), 0, 20, &mut tail).unwrap(), 28);
        dst.read(0, &mut got[..20]).unwrap();
        assert_eq!(&got[..4], b"head");
        assert_eq!(&tail[..8], &[&data[26..30], &b"tail"[..]].concat()[..]);
        let _ = (&mut r, &mut w);
    }

    /// A write to a socket whose peer is gone is EPIPE and raises no SIGPIPE (whose default
    /// action, which the CLI restores, ends the process). SIGPIPE is blocked in this thread
    /// meanwhile, so one raised would stay pending (a blocked signal is queued even when
    /// ignored) instead of touching the rest of the test process.
    #[test]
    fn writev_to_a_closed_peer_is_epipe_not_sigpipe() {
        use std::os::fd::AsRawFd;
        // SAFETY: plain signal-mask calls on this thread with sigset_t values on the stack.
        let pending = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
            drop(r);
            let e = writev(w.as_raw_fd(), &[IoPart::Bytes(b"x")]).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
            let mut p: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut p);
            let pending = libc::sigismember(&p, libc::SIGPIPE) == 1;
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            pending
        };
        assert!(!pending, "writev raised SIGPIPE");
    }
}
