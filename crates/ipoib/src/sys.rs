//! The daemon's zero-copy I/O between the TUN device and registered memory, and the
//! eventfd that wakes it. The only unsafe code besides the `TUNSETIFF` ioctl
//! ([`crate::tun`]): a packet is read from the TUN straight into a send buffer of the
//! node's memory region and written into the TUN straight from a receive buffer, so a
//! 64 KiB connected-mode packet is not copied through a `Vec` on either side (issue 16).
//!
//! Registered memory is shared with the provider (see `verbs::Buffer`): these functions
//! touch only buffers the node owns at that moment — a send buffer no work request holds
//! yet, or a receive buffer whose completion was taken and which is not posted again until
//! the call returns — so nothing else reads or writes the range meanwhile.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use verbs::MemoryRegion;

/// Reads one packet from `fd` (a non-blocking TUN) into `mr[off..off + max]`. `Ok(None)`
/// when no packet is waiting.
///
/// The caller owns the range: no work request refers to it (a free send buffer).
pub(crate) fn read_into(fd: &File, mr: &MemoryRegion, off: usize, max: usize) -> io::Result<Option<usize>> {
    let buf = mr
        .buffer()
        .ok_or_else(|| io::Error::other("memory region without storage"))?;
    let (p, len) = buf.raw_range(off, max).map_err(|_| io::Error::other("out of bounds"))?;
    loop {
        // SAFETY: `p..p + len` lies inside the region's mapping (checked by `raw_range`),
        // which `buf` keeps alive across the call; the kernel writes at most `len` octets
        // there; the caller owns the range, so nothing else accesses it meanwhile.
        let n = unsafe { libc::read(fd.as_raw_fd(), p.cast(), len) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// Runs `f` over `mr[off..off + len]`, a buffer the node owns (a send buffer it has just
/// filled, or a receive buffer whose completion it holds and has not posted again).
pub(crate) fn with_owned<R>(mr: &MemoryRegion, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    let buf = mr.buffer()?;
    // SAFETY: the range is in bounds (checked by `with_slice`); the caller owns it: no
    // work request refers to it, so neither the provider nor a peer writes it while `f`
    // runs, which is `with_slice`'s condition.
    unsafe { buf.with_slice(off, len, f) }.ok()
}

/// A non-blocking eventfd (`EFD_NONBLOCK | EFD_CLOEXEC`), counter 0.
pub(crate) fn eventfd() -> io::Result<File> {
    // SAFETY: `eventfd` takes no pointers; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor this function owns and hands over.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// `poll(2)` for readability of `fds` (`None` entries are skipped) up to `timeout_ms`;
/// returns which are readable.
pub(crate) fn poll_readable<const N: usize>(fds: [Option<&File>; N], timeout_ms: i32) -> io::Result<[bool; N]> {
    let mut p = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; N];
    for (q, f) in p.iter_mut().zip(fds) {
        if let Some(f) = f {
            q.fd = f.as_raw_fd();
            q.events = libc::POLLIN;
        }
    }
    // SAFETY: `p` is an array of `N` initialised pollfd structs that lives across the call;
    // negative descriptors are ignored by the kernel.
    let n = unsafe { libc::poll(p.as_mut_ptr(), N as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok([false; N])
        } else {
            Err(e)
        };
    }
    Ok(p.map(|q| q.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0))
}
