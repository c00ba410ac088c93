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

/// `UDP_SEGMENT` (linux/udp.h): the GSO segment size of a send.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): accept GSO/GRO trains whole, with their segment size in a cmsg.
const UDP_GRO: libc::c_int = 104;
/// Segments of one GSO send at most (`UDP_MAX_SEGMENTS` is 64 in Linux 4.18–6.x).
pub(crate) const GSO_MAX_SEGS: usize = 64;
/// UDP payload octets of one GSO send at most (an IPv4 datagram's limit, with room).
pub(crate) const GSO_MAX_BYTES: usize = 65_000;

/// `UDP_GRO` on: GSO trains sent on this host (loopback does not segment them) and GRO
/// trains reach the socket whole, each with its segment size ([`RxBatch::seg`]).
pub(crate) fn set_udp_gro(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1)
}

/// IPv4 IDs below this belong to the UDP socket when a raw socket is open: the segments of
/// one GSO send on an unconnected DF socket (ours) carry IDs 0, 1, … up to
/// [`GSO_MAX_SEGS`] − 1.
pub(crate) const TRAIN_IDS: u32 = GSO_MAX_SEGS as u32;

/// The UDP socket's program when a raw socket is open: keep what arrived on loopback
/// (ifindex 1 in every namespace) and IPv4 packets with an ID below [`TRAIN_IDS`], drop the
/// rest (the raw socket's). A GSO train that crosses a virtual link (veth, loopback) stays
/// one unsegmented skb: the raw socket gets it whole, one IP header with ID 0 over
/// concatenated packets it cannot split, while the UDP socket gets it segmented (IDs
/// 0, 1, …) or, with `UDP_GRO`, whole with its segment size. The ID is read at the network
/// header (`SKF_NET_OFF`), which UDP sockets' filters can reach.
pub(crate) fn udp_filter_beside_raw() -> Vec<libc::sock_filter> {
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    const LD_W_ABS: u16 = 0x20;
    const LD_H_ABS: u16 = 0x28;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    let ifindex = (libc::SKF_AD_OFF + libc::SKF_AD_IFINDEX) as u32;
    let ip_id = (libc::SKF_NET_OFF + 4) as u32;
    vec![
        op(LD_W_ABS, 0, 0, ifindex), // 0: A = the receiving interface's index
        op(JEQ_K, 2, 0, 1),          // 1: loopback -> 4
        op(LD_H_ABS, 0, 0, ip_id),   // 2: A = IPv4 Identification
        op(JGE_K, 1, 0, TRAIN_IDS),  // 3: a foreign ID -> 5
        op(RET_K, 0, 0, u32::MAX),   // 4: accept
        op(RET_K, 0, 0, 0),          // 5: drop
    ]
}

/// The raw socket's program: [`rocev2_ipv4_filter`] for packets that did not arrive on
/// loopback and whose IPv4 ID is [`TRAIN_IDS`] or more; the others are the UDP socket's
/// ([`udp_filter_beside_raw`]): each packet reaches exactly one of the two sockets, and
/// no GSO train reaches the raw socket unsegmented. A foreign sender's packet with a small
/// ID (rxe hashes its IDs) goes to the UDP socket, whose check solves for the ID.
pub(crate) fn rocev2_ipv4_filter_not_lo(addr: std::net::Ipv4Addr, port: u16) -> Vec<libc::sock_filter> {
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let ifindex = (libc::SKF_AD_OFF + libc::SKF_AD_IFINDEX) as u32;
    let rest = rocev2_ipv4_filter(addr, port);
    let drop_at = rest.len() as u8; // from instruction 2: the final "drop" below
    let mut v = vec![
        op(0x20, 0, 0, ifindex),         // A = the receiving interface's index
        op(0x15, drop_at + 2, 0, 1),     // loopback -> drop
        op(0x28, 0, 0, 4),               // A = IPv4 Identification
        op(0x35, 0, drop_at, TRAIN_IDS), // an ID of our trains -> drop
    ];
    v.extend(rest);
    v.push(op(0x06, 0, 0, 0));
    v
}

/// One datagram of a [`sendmmsg_gso`] batch: packets `first..first + count` of the batch,
/// sent as one GSO train of `seg`-octet segments (the last may be shorter) when `count > 1`.
/// For [`sendmmsg_iov`], `first`/`count` are iovecs and `seg` 0 means no train.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxMsg {
    pub first: usize,
    pub count: usize,
    pub seg: u16,
}

/// `sendmmsg(2)` of GSO trains: each [`TxMsg`] is one `msghdr` whose iovecs are its packets
/// and, for a train, a `UDP_SEGMENT` cmsg; with `ip`, every datagram also carries the
/// address handle's TTL/TOS (`IP_TTL`/`IP_TOS` or `IPV6_HOPLIMIT`/`IPV6_TCLASS`) cmsgs.
/// Returns how many messages were sent before an error (the error if none was).
pub(crate) fn sendmmsg_gso(
    fd: BorrowedFd<'_>,
    to: &socket2::SockAddr,
    pkts: &[&[u8]],
    msgs: &[TxMsg],
    ip: Option<IpFields>,
) -> io::Result<usize> {
    let mut iov = TxIov::default();
    for p in pkts {
        iov.push(p);
    }
    // One iovec per packet; a single packet takes no UDP_SEGMENT.
    let msgs: Vec<TxMsg> = msgs
        .iter()
        .map(|m| TxMsg {
            seg: if m.count > 1 { m.seg } else { 0 },
            ..*m
        })
        .collect();
    sendmmsg_iov(fd, to, &mut iov, &msgs, ip)
}

/// The iovecs of a `sendmmsg` whose payload octets stay where they are: packet headers
/// and trailers in the engine's buffers, payloads in registered memory (Send from the
/// MR, issue 13). The lifetime ties every iovec to what it points into, which the
/// borrow keeps alive until the call is made; the kernel copies from them during the
/// call (no `MSG_ZEROCOPY`), so nothing is read after it returns.
pub(crate) struct TxIov<'a> {
    iov: Vec<libc::iovec>,
    _borrow: std::marker::PhantomData<&'a [u8]>,
}

impl Default for TxIov<'_> {
    /// Empty, on the thread's kept vector (no allocation once it has grown).
    fn default() -> Self {
        TxIov {
            iov: TX_IOV.take(),
            _borrow: std::marker::PhantomData,
        }
    }
}

impl Drop for TxIov<'_> {
    /// Gives the (cleared) vector back to the thread: no pointer outlives the borrow.
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.iov);
        v.clear();
        TX_IOV.set(v);
    }
}

impl<'a> TxIov<'a> {
    /// Appends an iovec over `b`.
    pub(crate) fn push(&mut self, b: &'a [u8]) {
        if !b.is_empty() {
            self.iov.push(libc::iovec {
                iov_base: b.as_ptr().cast_mut().cast(),
                iov_len: b.len(),
            });
        }
    }

    /// Appends an iovec over `len` octets at `off` of a memory region's buffer, checked
    /// against it. No Rust reference to the region is formed (verbs::buffer's rule: the
    /// region is shared with "the NIC"); the kernel reads it in the call.
    pub(crate) fn push_region(
        &mut self,
        buf: &'a verbs::buffer::Buffer,
        off: usize,
        len: usize,
    ) -> Result<(), verbs::buffer::OutOfBounds> {
        if len == 0 {
            return Ok(());
        }
        let (p, n) = buf.raw_range(off, len)?;
        self.iov.push(libc::iovec {
            iov_base: p.cast(),
            iov_len: n,
        });
        Ok(())
    }

    /// Iovecs so far (the next one's index).
    pub(crate) fn len(&self) -> usize {
        self.iov.len()
    }
}

/// [`sendmmsg_gso`] over prepared iovecs: each [`TxMsg`] names `count` iovecs from
/// `first` (not packets: a packet may be several iovecs) and its GSO segment size.
pub(crate) fn sendmmsg_iov(
    fd: BorrowedFd<'_>,
    to: &socket2::SockAddr,
    txiov: &mut TxIov<'_>,
    msgs: &[TxMsg],
    ip: Option<IpFields>,
) -> io::Result<usize> {
    let iov = &mut txiov.iov[..];
    // Control messages per datagram: UDP_SEGMENT (u16) for a train, IP_TTL and IP_TOS (ints)
    // for an address handle's fields; each takes CMSG_SPACE(4) = 16 octets or less.
    const WORDS: usize = 8;
    let mut items = [(0, 0, 0); 2];
    let mut n_items = 0;
    if let Some(f) = ip {
        let (level, ttl_type, tos_type) = if f.v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, libc::IPV6_TCLASS)
        } else {
            (libc::IPPROTO_IP, libc::IP_TTL, libc::IP_TOS)
        };
        if f.ttl != 0 {
            items[n_items] = (level, ttl_type, libc::c_int::from(f.ttl));
            n_items += 1;
        }
        items[n_items] = (level, tos_type, libc::c_int::from(f.tos));
        n_items += 1;
    }
    let items = &items[..n_items];
    // The headers and control blocks are the thread's, kept between calls (issue 13: no
    // allocation per `sendmmsg`); taken out for the call, so a nested call finds none.
    let (mut ctrl, mut hdrs) = TX_SCRATCH.take();
    ctrl.clear();
    ctrl.resize(WORDS * msgs.len(), 0);
    hdrs.clear();
    // SAFETY: an all-zero mmsghdr is a valid value of that plain C struct.
    hdrs.resize_with(msgs.len(), || unsafe { std::mem::zeroed() });
    let r = sendmmsg_hdrs(fd, to, iov, msgs, items, &mut ctrl, &mut hdrs);
    // No pointer into `iov` or `to` outlives the call: cleared before they are kept.
    hdrs.clear();
    TX_SCRATCH.set((ctrl, hdrs));
    r
}

thread_local! {
    /// [`sendmmsg_iov`]'s control blocks and message headers, reused (empty between calls).
    static TX_SCRATCH: std::cell::Cell<(Vec<u64>, Vec<libc::mmsghdr>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
    /// A [`TxIov`]'s vector, reused (empty between uses).
    static TX_IOV: std::cell::Cell<Vec<libc::iovec>> = const { std::cell::Cell::new(Vec::new()) };
}

/// [`sendmmsg_iov`] with its (zeroed) control blocks and headers.
fn sendmmsg_hdrs(
    fd: BorrowedFd<'_>,
    to: &socket2::SockAddr,
    iov: &mut [libc::iovec],
    msgs: &[TxMsg],
    items: &[(libc::c_int, libc::c_int, libc::c_int)],
    ctrl: &mut [u64],
    hdrs: &mut [libc::mmsghdr],
) -> io::Result<usize> {
    const WORDS: usize = 8;
    for (i, (h, m)) in hdrs.iter_mut().zip(msgs).enumerate() {
        assert!(m.count >= 1 && m.first + m.count <= iov.len());
        h.msg_hdr.msg_name = to.as_ptr().cast_mut().cast();
        h.msg_hdr.msg_namelen = to.len();
        h.msg_hdr.msg_iov = iov[m.first..].as_mut_ptr();
        h.msg_hdr.msg_iovlen = m.count;
        if m.seg == 0 && items.is_empty() {
            continue;
        }
        let c = &mut ctrl[i * WORDS..(i + 1) * WORDS];
        h.msg_hdr.msg_control = c.as_mut_ptr().cast();
        h.msg_hdr.msg_controllen = WORDS * 8;
        // SAFETY: msg_control points at WORDS * 8 zeroed, 8-aligned octets we own; at most
        // three cmsgs of CMSG_SPACE(4) = 16 octets each fit, so CMSG_FIRSTHDR/CMSG_NXTHDR
        // return headers inside it with room for their payload, and we write only there.
        unsafe {
            let mut cm = libc::CMSG_FIRSTHDR(&h.msg_hdr);
            let mut len = 0usize;
            if m.seg != 0 {
                (*cm).cmsg_level = libc::SOL_UDP;
                (*cm).cmsg_type = UDP_SEGMENT;
                (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as libc::c_uint) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), m.seg);
                len += libc::CMSG_SPACE(std::mem::size_of::<u16>() as libc::c_uint) as usize;
                cm = libc::CMSG_NXTHDR(&h.msg_hdr, cm);
            }
            for &(level, ty, v) in items {
                debug_assert!(!cm.is_null());
                (*cm).cmsg_level = level;
                (*cm).cmsg_type = ty;
                (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as libc::c_uint) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<libc::c_int>(), v);
                len += libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as libc::c_uint) as usize;
                cm = libc::CMSG_NXTHDR(&h.msg_hdr, cm);
            }
            h.msg_hdr.msg_controllen = len;
        }
    }
    let mut sent = 0;
    while sent < hdrs.len() {
        let rest = &mut hdrs[sent..];
        // Every header points at `to`, at iovecs of `iov` (into buffers the `TxIov`'s
        // lifetime keeps borrowed, checked when pushed) and at its control block in
        // `ctrl`, all alive for the call.
        let r = if rest.len() == 1 {
            // One datagram (a ping-pong's message, with its ACK as a train): `sendmsg`,
            // without `sendmmsg`'s loop over a vector of headers (issue 13, session 14).
            // SAFETY: as said above; the kernel only reads the one header.
            let r = unsafe { libc::sendmsg(fd.as_raw_fd(), &rest[0].msg_hdr, 0) };
            if r < 0 { -1 } else { 1 }
        } else {
            // SAFETY: as said above; the kernel reads the headers and writes `msg_len` into
            // them, which we own mutably.
            unsafe { libc::sendmmsg(fd.as_raw_fd(), rest.as_mut_ptr(), rest.len() as libc::c_uint, 0) }
        };
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

/// Buffers for `recvmmsg(2)`: `n` datagrams of up to 64 KiB (a GRO train), each with its
/// length, sender and GRO segment size.
pub(crate) struct RxBatch {
    buf: Vec<u8>,
    ctrl: Vec<u64>,
    names: Vec<libc::sockaddr_storage>,
    hdrs: Vec<libc::mmsghdr>,
    iov: Vec<libc::iovec>,
    /// Per datagram received: its length, or `None` if it was truncated.
    pub len: Vec<Option<usize>>,
    /// Per datagram received: the GRO segment size (0: a single datagram).
    pub seg: Vec<u16>,
    /// Per datagram received: its IPv4 TTL / IPv6 hop limit and TOS / traffic class, when
    /// the socket asked for them ([`set_recv_ip_fields`]).
    pub ip: Vec<Option<RxIp>>,
    /// Headers the kernel wrote in the last call (their name and control lengths must be
    /// given again); the others still hold what [`RxBatch::new`] set.
    dirty: usize,
    /// Per socket of a device (UDP, raw): its last receive call found it empty, so the
    /// next one takes a single datagram ([`recvmsg_one_dontwait`]). The caller keeps it.
    pub idle: [bool; 2],
}

/// The IP header fields a UDP socket reports of a datagram (`IP_TTL`/`IP_TOS` or
/// `IPV6_HOPLIMIT`/`IPV6_TCLASS` control messages): what a UD receive's GRH shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RxIp {
    /// IPv4 TTL / IPv6 hop limit.
    pub ttl: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub tos: u8,
}

/// Asks the UDP socket for each datagram's TTL/hop limit and TOS/traffic class
/// (`IP_RECVTTL` + `IP_RECVTOS`, or `IPV6_RECVHOPLIMIT` + `IPV6_RECVTCLASS`): a UD
/// receive's GRH carries them, as rxe copies them from the IP header it received.
pub(crate) fn set_recv_ip_fields(fd: BorrowedFd<'_>, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1)?;
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)?;
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)
    }
}

/// Octets of one receive slot: the largest UDP datagram (a GRO train) or IP packet.
pub(crate) const RX_SLOT: usize = 65_536;
/// Control space per datagram: UDP_GRO, TTL and TOS cmsgs, 16 octets each, with room.
const RX_CTRL_WORDS: usize = 12;

// SAFETY: the raw pointers in `hdrs`/`iov` point only into the heap buffers of the batch's
// own vectors, which are never resized after `RxBatch::new` and move with it (moving a
// `Vec` does not move its buffer).
unsafe impl Send for RxBatch {}

impl RxBatch {
    /// Room for `n` datagrams.
    pub(crate) fn new(n: usize) -> RxBatch {
        let mut b = RxBatch {
            buf: vec![0; n * RX_SLOT],
            ctrl: vec![0; n * RX_CTRL_WORDS],
            // SAFETY: all-zero sockaddr_storage / mmsghdr are valid values of those C structs.
            names: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            hdrs: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            iov: (0..n)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
            len: Vec::with_capacity(n),
            seg: Vec::with_capacity(n),
            ip: Vec::with_capacity(n),
            dirty: 0,
            idle: [false; 2],
        };
        // The headers point at their slots once and for all (issue 13: rebuilding all 16
        // before every call was ~60 % of a busy poller's user-space instructions per empty
        // poll); `recvmmsg_dontwait` only re-arms the lengths the kernel overwrote.
        let base = b.buf.as_mut_ptr();
        for i in 0..n {
            b.iov[i] = libc::iovec {
                // SAFETY: slot i lies inside `buf` (n * RX_SLOT octets).
                iov_base: unsafe { base.add(i * RX_SLOT) }.cast(),
                iov_len: RX_SLOT,
            };
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_name = (&mut b.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut b.iov[i];
            h.msg_iovlen = 1;
            h.msg_control = b.ctrl[i * RX_CTRL_WORDS..].as_mut_ptr().cast();
        }
        b.arm(n);
        b
    }

    /// Gives headers `0..n` their full name and control lengths again (the kernel writes
    /// back what it used).
    fn arm(&mut self, n: usize) {
        for m in &mut self.hdrs[..n] {
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_controllen = RX_CTRL_WORDS * 8;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
        self.dirty = 0;
    }

    /// Datagram `i` of the last [`recvmmsg_dontwait`].
    pub(crate) fn data(&self, i: usize) -> Option<&[u8]> {
        self.len[i].map(|n| &self.buf[i * RX_SLOT..i * RX_SLOT + n])
    }

    /// The sender of datagram `i` (a UDP socket's; a raw socket's carries no port).
    pub(crate) fn from(&self, i: usize) -> io::Result<std::net::SocketAddr> {
        sockaddr_to_std(&self.names[i])
    }
}

/// `recvmmsg(2)` with `MSG_DONTWAIT`: as many queued datagrams as `b` holds (their data,
/// lengths, senders and GRO segment sizes in `b`), or `WouldBlock` when none is queued.
pub(crate) fn recvmmsg_dontwait(fd: BorrowedFd<'_>, b: &mut RxBatch) -> io::Result<usize> {
    recv_dontwait(fd, b, false)
}

/// [`recvmmsg_dontwait`] for at most one datagram, by `recvmsg(2)` into slot 0: what a
/// socket that was just found empty most likely holds next (a ping-pong's message).
/// `recvmmsg` of 16 returns the same datagram but then tries the next header (copies it
/// in, imports its iovec, takes the queue lock) to find nothing, on the latency path of
/// every message (issue 13, session 14); `recvmsg` stops after the one.
pub(crate) fn recvmsg_one_dontwait(fd: BorrowedFd<'_>, b: &mut RxBatch) -> io::Result<usize> {
    recv_dontwait(fd, b, true)
}

/// Whether `e` is `EAGAIN`/`EWOULDBLOCK` (a non-blocking socket found empty): the errno
/// compared first, which costs a busy poller's empty poll less than `kind()`'s mapping of
/// every errno (three of them per empty poll were ~50 instructions, issue 13).
#[inline]
pub(crate) fn would_block(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EAGAIN) || e.kind() == io::ErrorKind::WouldBlock
}

fn recv_dontwait(fd: BorrowedFd<'_>, b: &mut RxBatch, one: bool) -> io::Result<usize> {
    let n = b.hdrs.len();
    let dirty = b.dirty;
    b.arm(dirty);
    let r = if one {
        // SAFETY: header 0 points at its own name, iovec (slot 0 of `buf`) and control
        // block, all owned by `b` and alive for the call; the kernel writes at most the
        // sizes given.
        let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut b.hdrs[0].msg_hdr, libc::MSG_DONTWAIT) };
        if r >= 0 {
            // What recvmmsg reports per header.
            b.hdrs[0].msg_len = r as libc::c_uint;
            1
        } else {
            -1
        }
    } else {
        // SAFETY: every header points at its own name, iovec (a slot of `buf`) and control
        // block, all owned by `b` and alive for the call; the kernel writes at most the
        // sizes given.
        unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                b.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        }
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        // EAGAIN (the empty poll) wrote nothing; after any other error re-arm them all.
        if !would_block(&e) {
            b.dirty = n;
        }
        return Err(e);
    }
    let got = r as usize;
    b.dirty = got;
    b.len.clear();
    b.seg.clear();
    b.ip.clear();
    for i in 0..got {
        let h = &b.hdrs[i].msg_hdr;
        let truncated = h.msg_flags & libc::MSG_TRUNC != 0;
        b.len.push((!truncated).then_some(b.hdrs[i].msg_len as usize));
        let mut seg = 0u16;
        let (mut ttl, mut tos) = (None, None);
        // SAFETY: the kernel filled `msg_controllen` octets of the control block with
        // well-formed cmsghdrs; CMSG_FIRSTHDR/NXTHDR stay inside it.
        unsafe {
            let mut cm = libc::CMSG_FIRSTHDR(h);
            while !cm.is_null() {
                let data = libc::CMSG_DATA(cm);
                match ((*cm).cmsg_level, (*cm).cmsg_type) {
                    (libc::SOL_UDP, UDP_GRO) => seg = std::ptr::read_unaligned(data.cast::<libc::c_int>()) as u16,
                    // IP_TTL comes as an int, IP_TOS as one octet.
                    (libc::IPPROTO_IP, libc::IP_TTL) => {
                        ttl = Some(std::ptr::read_unaligned(data.cast::<libc::c_int>()) as u8)
                    }
                    (libc::IPPROTO_IP, libc::IP_TOS) => tos = Some(*data),
                    (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                        ttl = Some(std::ptr::read_unaligned(data.cast::<libc::c_int>()) as u8)
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                        tos = Some(std::ptr::read_unaligned(data.cast::<libc::c_int>()) as u8)
                    }
                    _ => {}
                }
                cm = libc::CMSG_NXTHDR(h, cm);
            }
        }
        b.seg.push(seg);
        b.ip.push(ttl.map(|ttl| RxIp {
            ttl,
            tos: tos.unwrap_or(0),
        }));
    }
    Ok(got)
}

/// The MTU of the interface that has address `addr`, or else an IPv4 subnet holding it
/// (127.x.y.z: loopback) (`getifaddrs(3)`, then `SIOCGIFMTU` in the calling thread's
/// network namespace).
pub(crate) fn interface_mtu(addr: std::net::IpAddr) -> io::Result<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut name: Option<[libc::c_char; libc::IFNAMSIZ]> = None;
    let mut subnet: Option<[libc::c_char; libc::IFNAMSIZ]> = None;
    let copy_name = |ifa: &libc::ifaddrs| {
        let mut n = [0 as libc::c_char; libc::IFNAMSIZ];
        // SAFETY: ifa_name is a NUL-terminated interface name (at most IFNAMSIZ octets
        // with the NUL); strncpy leaves `n` NUL-terminated for shorter ones.
        unsafe { libc::strncpy(n.as_mut_ptr(), ifa.ifa_name, libc::IFNAMSIZ - 1) };
        n
    };
    let mut p = list;
    while !p.is_null() && name.is_none() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr of the family it names (getifaddrs).
            let a = unsafe {
                match libc::c_int::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let s = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                        Some(std::net::IpAddr::from(u32::from_be(s.sin_addr.s_addr).to_be_bytes()))
                    }
                    libc::AF_INET6 => {
                        let s = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                        Some(std::net::IpAddr::from(s.sin6_addr.s6_addr))
                    }
                    _ => None,
                }
            };
            if a == Some(addr) {
                name = Some(copy_name(ifa));
            } else if let (Some(std::net::IpAddr::V4(a)), std::net::IpAddr::V4(want)) = (a, addr)
                && !ifa.ifa_netmask.is_null()
                && subnet.is_none()
            {
                // SAFETY: the netmask of an AF_INET address is a sockaddr_in (getifaddrs).
                let m = u32::from_be(unsafe { (*ifa.ifa_netmask.cast::<libc::sockaddr_in>()).sin_addr.s_addr });
                if m != 0 && u32::from(a) & m == u32::from(want) & m {
                    subnet = Some(copy_name(ifa));
                }
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    let name = name
        .or(subnet)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface has {addr}")))?;
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    // SAFETY: an all-zero ifreq is a valid value of that plain C struct.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    req.ifr_name = name;
    // SAFETY: `req` is an ifreq with the interface name set; SIOCGIFMTU writes its MTU
    // into the union, which is inside `req`.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU filled the union's `ifru_mtu` member.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}
