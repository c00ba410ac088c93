//! The exported C functions that take the place of libc's for the program.

use crate::handoff::{self, ACCEPTED, CONNECTED};
use crate::real::{self, real};
use crate::table::{self, Entry};
use libc::{c_int, c_void, size_t, sockaddr, socklen_t, ssize_t};

/// The table entry of `fd` if it was handed over to SMC-R.
fn entry(fd: c_int) -> Option<(u64, Entry)> {
    if !table::any() {
        return None;
    }
    let ino = real::inode(fd)?;
    table::get(ino).map(|e| (ino, e))
}

/// Waits for a nonblocking connect: Ok(true) connected, Ok(false) still pending, Err(errno).
fn wait_connected(fd: c_int) -> Result<bool, c_int> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let deadline = std::time::Instant::now() + handoff::connect_wait();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        // SAFETY: one live pollfd.
        let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as c_int) };
        if r < 0 && real::errno() == libc::EINTR {
            continue;
        }
        if r <= 0 {
            return Ok(false);
        }
        let e = real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(libc::EIO);
        return if e == 0 { Ok(true) } else { Err(e) };
    }
}

/// `connect(2)`: a TCP connection, once established, is handed to the SMC-R daemon.
///
/// # Safety
/// As `connect(2)`: `addr` points at `len` readable octets.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { (real().connect)(fd, addr, len) };
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() || handoff::daemon_name().is_none() {
        return r;
    }
    // SAFETY: `addr` is non-null with at least a family field (checked above).
    let fam = c_int::from(unsafe { (*addr).sa_family });
    if fam != libc::AF_INET && fam != libc::AF_INET6 {
        return r;
    }
    let Some(family) = handoff::is_tcp(fd) else { return r };
    if r != 0 {
        if real::errno() != libc::EINPROGRESS {
            return r;
        }
        match wait_connected(fd) {
            Ok(true) => {}
            Ok(false) => {
                real::set_errno(libc::EINPROGRESS);
                return -1;
            }
            Err(e) => {
                real::set_errno(e);
                return -1;
            }
        }
    }
    handoff::hand_over(fd, family, CONNECTED);
    0
}

fn after_accept(r: c_int) -> c_int {
    if r >= 0
        && handoff::daemon_name().is_some()
        && let Some(family) = handoff::is_tcp(r)
    {
        handoff::hand_over(r, family, ACCEPTED);
    }
    r
}

/// `accept(2)`: an accepted TCP connection is handed to the SMC-R daemon.
///
/// # Safety
/// As `accept(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    after_accept(unsafe { (real().accept)(fd, addr, len) })
}

/// `accept4(2)`: as [`accept`]; the flags (SOCK_NONBLOCK, SOCK_CLOEXEC) are kept.
///
/// # Safety
/// As `accept4(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    after_accept(unsafe { (real().accept4)(fd, addr, len, flags) })
}

/// Copies `src` into the caller's (`dst`, `*len`) as the socket calls do (truncating).
///
/// # Safety
/// `dst` has `*len` writable octets; `len` is valid.
unsafe fn copy_out(src: &[u8], dst: *mut u8, len: *mut socklen_t) -> c_int {
    if len.is_null() {
        real::set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller guarantees `len` and `dst`'s size.
    unsafe {
        let room = *len as usize;
        if !dst.is_null() {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, room.min(src.len()));
        }
        *len = src.len() as socklen_t;
    }
    0
}

/// `getsockname(2)`: the TCP socket's address for a handed-over socket.
///
/// # Safety
/// As `getsockname(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match entry(fd) {
        // SAFETY: the caller's buffer and length.
        Some((_, e)) => unsafe { copy_out(&e.local, addr as *mut u8, len) },
        // SAFETY: the caller's arguments, passed on unchanged.
        None => unsafe { (real().getsockname)(fd, addr, len) },
    }
}

/// `getpeername(2)`: the TCP peer's address for a handed-over socket.
///
/// # Safety
/// As `getpeername(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match entry(fd) {
        // SAFETY: the caller's buffer and length.
        Some((_, e)) => unsafe { copy_out(&e.peer, addr as *mut u8, len) },
        // SAFETY: the caller's arguments, passed on unchanged.
        None => unsafe { (real().getpeername)(fd, addr, len) },
    }
}

fn ip_level(level: c_int) -> bool {
    level == libc::IPPROTO_TCP || level == libc::IPPROTO_IP || level == libc::IPPROTO_IPV6
}

/// `getsockopt(2)`: SO_DOMAIN/SO_PROTOCOL and TCP/IP-level options of a handed-over
/// socket answer as TCP would (the values the program set, else TCP_MAXSEG 1448,
/// TCP_CONGESTION "smc-r", zeros).
///
/// # Safety
/// As `getsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let passthrough = |fd, level, name, val, len| {
        // SAFETY: the caller's arguments, passed on unchanged.
        unsafe { (real().getsockopt)(fd, level, name, val, len) }
    };
    if !(level == libc::SOL_SOCKET && (name == libc::SO_DOMAIN || name == libc::SO_PROTOCOL) || ip_level(level)) {
        return passthrough(fd, level, name, val, len);
    }
    let Some((_, e)) = entry(fd) else {
        return passthrough(fd, level, name, val, len);
    };
    let v: Vec<u8> = if level == libc::SOL_SOCKET {
        let x = if name == libc::SO_DOMAIN {
            e.family
        } else {
            libc::IPPROTO_TCP
        };
        x.to_ne_bytes().to_vec()
    } else if let Some(v) = e.opts.get(&(level, name)) {
        v.clone()
    } else if level == libc::IPPROTO_TCP && name == libc::TCP_MAXSEG {
        1448i32.to_ne_bytes().to_vec()
    } else if level == libc::IPPROTO_TCP && name == libc::TCP_CONGESTION {
        b"smc-r\0".to_vec()
    } else {
        // SAFETY: `len` is the caller's valid pointer (checked non-null).
        let n = if len.is_null() { 0 } else { (unsafe { *len }) as usize };
        vec![0u8; n.min(4096)]
    };
    // SAFETY: the caller's buffer and length.
    unsafe { copy_out(&v, val as *mut u8, len) }
}

/// `setsockopt(2)`: TCP/IP-level options on a handed-over socket succeed (kept, read back
/// by `getsockopt`); AF_UNIX would refuse them.
///
/// # Safety
/// As `setsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    if ip_level(level)
        && let Some((ino, _)) = entry(fd)
    {
        let v = if val.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller gives `len` readable octets at `val`.
            unsafe { std::slice::from_raw_parts(val as *const u8, len as usize) }.to_vec()
        };
        table::set_opt(ino, level, name, &v);
        return 0;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { (real().setsockopt)(fd, level, name, val, len) }
}

/// MSG_OOB on a handed-over socket goes to the unix socket, which carries urgent data as TCP
/// does (Linux ≥ 5.15 with CONFIG_AF_UNIX_OOB: one urgent octet, SIOCATMARK, SO_OOBINLINE,
/// POLLPRI / select exceptfds); the daemon relays the urgent octet over SMC-R (CDC P/U).
/// A kernel without it answers EOPNOTSUPP: the octets are then sent in line.
fn send_oob_retry(fd: c_int, flags: c_int, r: ssize_t, again: impl FnOnce(c_int) -> ssize_t) -> ssize_t {
    if r < 0 && flags & libc::MSG_OOB != 0 && real::errno() == libc::EOPNOTSUPP && entry(fd).is_some() {
        return again(flags & !libc::MSG_OOB);
    }
    r
}

/// `recv(MSG_OOB)` on a handed-over socket whose kernel has no AF_UNIX urgent data: EINVAL,
/// TCP's answer without urgent data.
fn recv_oob_errno(fd: c_int, flags: c_int, r: ssize_t) -> ssize_t {
    if r < 0 && flags & libc::MSG_OOB != 0 && real::errno() == libc::EOPNOTSUPP && entry(fd).is_some() {
        real::set_errno(libc::EINVAL);
    }
    r
}

/// `send(2)`.
///
/// # Safety
/// As `send(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments, passed on (a retry without MSG_OOB, see above).
    let f = |fl: c_int| unsafe { (real().send)(fd, buf, n, fl) };
    send_oob_retry(fd, flags, f(flags), f)
}

/// `sendto(2)`: on a handed-over socket the address is ignored, as TCP does.
///
/// # Safety
/// As `sendto(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    let ours = (flags & libc::MSG_OOB != 0 || !addr.is_null()) && entry(fd).is_some();
    if ours {
        // SAFETY: the caller's buffer; no address (a connected stream).
        let f = |fl: c_int| unsafe { (real().sendto)(fd, buf, n, fl, std::ptr::null(), 0) };
        return send_oob_retry(fd, flags, f(flags), f);
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { (real().sendto)(fd, buf, n, flags, addr, alen) }
}

/// `sendmsg(2)`.
///
/// # Safety
/// As `sendmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments, passed on (a retry without MSG_OOB, see above).
    let f = |fl: c_int| unsafe { (real().sendmsg)(fd, msg, fl) };
    send_oob_retry(fd, flags, f(flags), f)
}

/// `recv(2)`.
///
/// # Safety
/// As `recv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { (real().recv)(fd, buf, n, flags) };
    recv_oob_errno(fd, flags, r)
}

/// `recvfrom(2)`.
///
/// # Safety
/// As `recvfrom(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { (real().recvfrom)(fd, buf, n, flags, addr, alen) };
    recv_oob_errno(fd, flags, r)
}

/// `recvmsg(2)`.
///
/// # Safety
/// As `recvmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { (real().recvmsg)(fd, msg, flags) };
    recv_oob_errno(fd, flags, r)
}
