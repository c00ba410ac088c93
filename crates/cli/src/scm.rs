//! Unix `SOCK_SEQPACKET` sockets on abstract addresses (one per network namespace) and
//! descriptor passing (`SCM_RIGHTS`, shared with the shim: `scm_rights`), for
//! `softrdma smc daemon` and `smc run`. With `scm_rights` the only unsafe code of the SMC-R
//! commands besides the daemon's socket flags; each block says why it is sound.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The SCM_RIGHTS code the shim uses too (one source; the shim passes its `real()`
/// functions, we pass libc's).
#[path = "../../smc-preload/src/scm_rights.rs"]
mod scm_rights;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: socket() returns a new descriptor that we own from here on.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is new and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn abstract_addr(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    scm_rights::abstract_addr(name.as_bytes())
}

/// Listens on the abstract address `name` (EADDRINUSE if a daemon already does).
pub fn listen(name: &str) -> io::Result<OwnedFd> {
    let s = seqpacket()?;
    let (sa, len) = abstract_addr(name)?;
    // SAFETY: `sa` is a sockaddr_un of `len` valid octets; `s` is our socket.
    cvt(unsafe { libc::bind(s.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, len) })?;
    // SAFETY: plain call on our socket.
    cvt(unsafe { libc::listen(s.as_raw_fd(), 128) })?;
    Ok(s)
}

/// Connects to the abstract address `name`.
pub fn connect(name: &str) -> io::Result<OwnedFd> {
    let s = seqpacket()?;
    let (sa, len) = abstract_addr(name)?;
    // SAFETY: as in `listen`.
    cvt(unsafe { libc::connect(s.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, len) })?;
    Ok(s)
}

/// Accepts one connection (the listener's receive timeout applies: WouldBlock).
pub fn accept(l: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: accept4 without an address buffer; the new descriptor is ours.
    let fd = cvt(unsafe {
        libc::accept4(
            l.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: new descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends one message, with `fd` attached when given.
pub fn send(s: &OwnedFd, data: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    scm_rights::send(libc::sendmsg, s.as_raw_fd(), data, fd)
}

/// Receives one message and the first descriptor attached (others are closed).
pub fn recv(s: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let (n, fd) = scm_rights::recv(libc::recvmsg, s.as_raw_fd(), buf)?;
    // SAFETY: the descriptor was just received and is owned by nobody else.
    Ok((n, fd.map(|f| unsafe { OwnedFd::from_raw_fd(f) })))
}

/// Clears close-on-exec on `s`, so a program exec'd next holds it.
pub fn inherit(s: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl(F_SETFD) on a descriptor we own; no memory is passed.
    cvt(unsafe { libc::fcntl(s.as_raw_fd(), libc::F_SETFD, 0) })?;
    Ok(())
}
