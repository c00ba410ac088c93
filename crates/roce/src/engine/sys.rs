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

/// A classic BPF program for a raw `IPPROTO_UDP` IPv4 socket (the data starts at the IP
/// header): accept datagrams to `addr`, not fragments, with UDP destination port `port`;
/// drop the rest in the kernel.
pub(crate) fn rocev2_ipv4_filter(addr: std::net::Ipv4Addr, port: u16) -> Vec<libc::sock_filter> {
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    const LD_W_ABS: u16 = 0x20;
    const LD_H_ABS: u16 = 0x28;
    const LD_H_IND: u16 = 0x48;
    const LDX_B_MSH: u16 = 0xb1;
    const JEQ_K: u16 = 0x15;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;
    vec![
        op(LD_W_ABS, 0, 0, 16),                             // 0: A = destination address
        op(JEQ_K, 0, 6, u32::from_be_bytes(addr.octets())), // 1: not ours -> 8
        op(LD_H_ABS, 0, 0, 6),                              // 2: A = flags | fragment offset
        op(JSET_K, 4, 0, 0x1fff),                           // 3: a fragment after the first -> 8
        op(LDX_B_MSH, 0, 0, 0),                             // 4: X = IHL * 4
        op(LD_H_IND, 0, 0, 2),                              // 5: A = UDP destination port
        op(JEQ_K, 0, 1, u32::from(port)),                   // 6: port -> 7, else 8
        op(RET_K, 0, 0, 0xffff),                            // 7: accept
        op(RET_K, 0, 0, 0),                                 // 8: drop
    ]
}

/// The program that drops everything (kept on the UDP socket when a raw socket receives:
/// the UDP socket still exists, so the host answers no ICMP port-unreachable).
pub(crate) fn drop_all_filter() -> Vec<libc::sock_filter> {
    vec![libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }]
}

/// `SO_ATTACH_FILTER` (classic BPF).
pub(crate) fn attach_filter(fd: BorrowedFd<'_>, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies the
    // program during setsockopt and only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The IP header fields an address handle sets on its packets, as rxe does
/// (`prepare_ipv4_hdr`/`prepare_ipv6_hdr` take TTL/hop limit and TOS/traffic class from the
/// AV's GRH). The ICRC masks both fields, so they change nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpFields {
    /// IPv4 TTL / IPv6 hop limit; 0 leaves the socket's (unicast 64, multicast its
    /// `IP_MULTICAST_TTL`).
    pub ttl: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub tos: u8,
    /// Whether the destination is IPv6 (`IPV6_HOPLIMIT`/`IPV6_TCLASS` instead of
    /// `IP_TTL`/`IP_TOS`).
    pub v6: bool,
}

/// Space for two `int` control messages.
const CMSG_SPACE_2: usize = 64;

/// Writes the control messages of `f` into `buf`; returns their length.
fn ip_fields_cmsg(f: IpFields, buf: &mut [u64; CMSG_SPACE_2 / 8]) -> usize {
    let (level, ttl_type, tos_type) = if f.v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, libc::IPV6_TCLASS)
    } else {
        (libc::IPPROTO_IP, libc::IP_TTL, libc::IP_TOS)
    };
    let mut items: Vec<(libc::c_int, libc::c_int)> = Vec::with_capacity(2);
    if f.ttl != 0 {
        items.push((ttl_type, libc::c_int::from(f.ttl)));
    }
    items.push((tos_type, libc::c_int::from(f.tos)));
    // SAFETY: a msghdr whose control buffer is `buf` (8-aligned, CMSG_SPACE_2 octets, enough
    // for two int cmsgs); CMSG_FIRSTHDR/CMSG_NXTHDR stay inside it and we write only
    // through the pointers they return, each with room for one int.
    unsafe {
        let mut mh: libc::msghdr = std::mem::zeroed();
        mh.msg_control = buf.as_mut_ptr().cast();
        mh.msg_controllen = CMSG_SPACE_2 as _;
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        let mut len = 0usize;
        for (ty, v) in items {
            debug_assert!(!c.is_null());
            (*c).cmsg_level = level;
            (*c).cmsg_type = ty;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), v);
            len += libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize;
            c = libc::CMSG_NXTHDR(&mh, c);
        }
        len
    }
}

/// `sendmmsg(2)`: sends every packet of `pkts` to `to` in as few calls as the kernel allows,
/// with the IP fields of an address handle on every datagram when `ip` is given. Returns how
/// many were sent before an error (the error is returned if none was).
pub(crate) fn sendmmsg_to_with(
    fd: BorrowedFd<'_>,
    to: &socket2::SockAddr,
    pkts: &[&[u8]],
    ip: Option<IpFields>,
) -> io::Result<usize> {
    let mut control = [0u64; CMSG_SPACE_2 / 8];
    let control_len = ip.map_or(0, |f| ip_fields_cmsg(f, &mut control));
    let mut iov: Vec<libc::iovec> = pkts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        })
        .collect();
    // SAFETY: an all-zero mmsghdr is a valid value of that plain C struct.
    let mut msgs: Vec<libc::mmsghdr> = (0..pkts.len()).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
        m.msg_hdr.msg_name = to.as_ptr().cast_mut().cast();
        m.msg_hdr.msg_namelen = to.len();
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
        if control_len > 0 {
            // Every datagram carries the same control messages; the kernel only reads them.
            m.msg_hdr.msg_control = control.as_mut_ptr().cast();
            m.msg_hdr.msg_controllen = control_len as _;
        }
    }
    let mut sent = 0;
    while sent < msgs.len() {
        let rest = &mut msgs[sent..];
        // SAFETY: every header points at `to` (alive for the call) and at one iovec of
        // `iov`, which points into a packet of `pkts`; the kernel only reads them and writes
        // `msg_len` into the headers, which we own mutably.
        let r = unsafe { libc::sendmmsg(fd.as_raw_fd(), rest.as_mut_ptr(), rest.len() as libc::c_uint, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return if sent == 0 { Err(e) } else { Ok(sent) };
        }
        sent += r as usize;
    }
    Ok(sent)
}

/// `SO_RCVBUFFORCE`: a receive buffer above `net.core.rmem_max` (needs CAP_NET_ADMIN; the
/// caller falls back to `SO_RCVBUF`). A burst of Read responses is as large as
/// `max_dest_rd_atomic` Reads, which no window limits.
pub(crate) fn set_rcvbuf_force(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    setsockopt_int(
        fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        bytes.min(i32::MAX as usize) as libc::c_int,
    )
}

/// `setns(fd, CLONE_NEWNET)`: moves the calling thread into the network namespace `fd`
/// names (a device's multicast sockets are made in the namespace the device was opened in).
pub(crate) fn setns_net(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `fd` is a live descriptor for the borrow; setns only changes the calling
    // thread's namespace, which the caller confines to a thread of its own.
    let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The index of the interface that has IPv6 address `addr` (`getifaddrs(3)`), for joining
/// and binding link-local-scope multicast groups on the device's interface.
pub(crate) fn ifindex_of_v6(addr: std::net::Ipv6Addr) -> io::Result<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = None;
    let mut p = list;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr; its family field is always there.
            let fam = unsafe { (*ifa.ifa_addr).sa_family };
            if libc::c_int::from(fam) == libc::AF_INET6 {
                // SAFETY: an AF_INET6 sockaddr of getifaddrs is a sockaddr_in6.
                let a = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                if std::net::Ipv6Addr::from(a.sin6_addr.s6_addr) == addr {
                    // SAFETY: ifa_name is the NUL-terminated interface name of this node.
                    let idx = unsafe { libc::if_nametoindex(ifa.ifa_name) };
                    if idx != 0 {
                        found = Some(idx);
                        break;
                    }
                }
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface has {addr}")))
}
