//! The few socket calls the standard library and socket2 do not offer, in one place: every
//! `unsafe` block of the crate is here.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (IPv4) / `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO`: Linux
/// sets DF and, on an unconnected socket, IP ID 0 — the ID the sender's ICRC covers (lab
/// README, "RoCEv2 from the host").
pub(crate) fn set_pmtudisc_do(fd: BorrowedFd<'_>, v6: bool) -> io::Result<()> {
    let (level, name, val) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
    };
    setsockopt_int(fd, level, name, val)
}

fn setsockopt_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> io::Result<()> {
    // SAFETY: `fd` is a live socket for the borrow's lifetime; the option value is a
    // `c_int` on our stack whose size we pass, and the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `recvfrom(2)` with `MSG_DONTWAIT` into `buf`: the datagram's length and sender, or
/// `WouldBlock` when none is queued. The socket itself stays blocking, so sends wait for
/// socket buffer space instead of dropping packets.
pub(crate) fn recv_from_dontwait(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, std::net::SocketAddr)> {
    // SAFETY: an all-zero sockaddr_storage is a valid value of that plain C struct.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut sl = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `buf` is a live, writable slice of `buf.len()` octets; `ss`/`sl` are a
    // sockaddr_storage and its size, which the kernel fills at most up to `sl`.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut sl,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((n as usize, sockaddr_to_std(&ss)?))
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage) -> io::Result<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large
            // and aligned enough for.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        f => Err(io::Error::other(format!("address family {f}"))),
    }
}
