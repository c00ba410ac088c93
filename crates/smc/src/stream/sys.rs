//! The socket calls `std::net::TcpStream` does not offer: an abortive close (TCP RST),
//! urgent data (MSG_OOB, SIOCATMARK, SO_OOBINLINE). The only unsafe code of the stream
//! engine; each call works on a descriptor borrowed from a live `TcpStream`.
#![allow(unsafe_code)]

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn set_int(tcp: &TcpStream, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: the descriptor is open for the borrow's lifetime; the option value is a
    // c_int on the stack whose size is passed.
    let rc = unsafe {
        libc::setsockopt(
            tcp.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(rc).map(|_| ())
}

fn get_int(tcp: &TcpStream, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is open; `v` and `len` are valid for writes of their sizes.
    let rc = unsafe {
        libc::getsockopt(
            tcp.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    check(rc).map(|_| v)
}

/// SO_LINGER: `Some(0)` makes the last close an abortive one (RST).
pub(crate) fn set_linger(tcp: &TcpStream, secs: Option<u32>) -> io::Result<()> {
    let l = libc::linger {
        l_onoff: libc::c_int::from(secs.is_some()),
        l_linger: secs.unwrap_or(0).min(i32::MAX as u32) as libc::c_int,
    };
    // SAFETY: the descriptor is open; `l` is a `struct linger` on the stack whose size is
    // passed.
    let rc = unsafe {
        libc::setsockopt(
            tcp.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    check(rc).map(|_| ())
}

/// Resets the TCP connection now (Figure 23, SMC-ABT-1): SO_LINGER {1, 0}, then a
/// `connect(AF_UNSPEC)`, which disconnects the socket with an RST (Linux `tcp_disconnect`)
/// whatever other descriptors (the application's, its clones) still refer to it. Later
/// calls on any of them see a socket that is not connected.
pub(crate) fn reset(tcp: &TcpStream) -> io::Result<()> {
    set_linger(tcp, Some(0))?;
    // SAFETY: all-zero is a valid `sockaddr` (family AF_UNSPEC = 0).
    let mut sa: libc::sockaddr = unsafe { std::mem::zeroed() };
    sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: the descriptor is open; `sa` is a valid sockaddr of the size passed.
    let rc = unsafe {
        libc::connect(
            tcp.as_raw_fd(),
            &sa,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    check(rc).map(|_| ())
}

/// `send(buf, MSG_OOB)` on a plain TCP connection: the last octet is urgent.
pub(crate) fn send_oob(tcp: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the descriptor is open; `buf` is valid for reads of its length.
    let rc = unsafe {
        libc::send(
            tcp.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_OOB | libc::MSG_NOSIGNAL,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// `recv(1, MSG_OOB [| MSG_PEEK])` on a plain TCP connection.
pub(crate) fn recv_oob(tcp: &TcpStream, peek: bool) -> io::Result<u8> {
    let mut b = 0u8;
    let flags = libc::MSG_OOB | if peek { libc::MSG_PEEK } else { 0 };
    // SAFETY: the descriptor is open; `b` is valid for a write of one octet.
    let rc = unsafe { libc::recv(tcp.as_raw_fd(), (&mut b as *mut u8).cast(), 1, flags) };
    match rc {
        1 => Ok(b),
        0 => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// `SIOCATMARK` (linux/sockios.h; not in the libc crate).
const SIOCATMARK: libc::c_ulong = 0x8905;

/// SIOCATMARK on a plain TCP connection.
pub(crate) fn at_mark(tcp: &TcpStream) -> io::Result<bool> {
    let mut v: libc::c_int = 0;
    // SAFETY: the descriptor is open; SIOCATMARK writes one c_int to the pointer given.
    let rc = unsafe { libc::ioctl(tcp.as_raw_fd(), SIOCATMARK, &mut v as *mut libc::c_int) };
    check(rc).map(|_| v != 0)
}

/// SO_OOBINLINE on a plain TCP connection.
pub(crate) fn set_oob_inline(tcp: &TcpStream, on: bool) -> io::Result<()> {
    set_int(tcp, libc::SOL_SOCKET, libc::SO_OOBINLINE, libc::c_int::from(on))
}

/// SO_OOBINLINE of a plain TCP connection.
pub(crate) fn oob_inline(tcp: &TcpStream) -> io::Result<bool> {
    get_int(tcp, libc::SOL_SOCKET, libc::SO_OOBINLINE).map(|v| v != 0)
}
