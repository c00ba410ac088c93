//! The bound for IPoIB connected mode over kernel UDP (issue 16, session 13): the simplest
//! relay doing only the work any user-space IPoIB over a kernel UDP socket must do, and
//! nothing else — no verbs, no queue pairs, no acknowledgements, no retransmission.
//!
//! Each side: a TUN (`IFF_VNET_HDR`, `TUN_F_CSUM`, MTU 65,520, like `softrdma ipoib up
//! --mode connected`) and one UDP socket on the underlay. Two threads:
//!
//! - TUN → UDP: one `read` of the TUN (virtio-net header + IP packet) into a buffer, cut
//!   into 4,096-octet segments, each behind a 16-octet header (message number, index,
//!   count, length, and with `--crc` a CRC-32 of the segment: the ICRC pass), sent as UDP
//!   GSO trains (`UDP_SEGMENT`, at most 15 segments a train so a train stays under 64 KiB)
//!   in one `sendmmsg`. The segments are gathered with iovecs: no copy in user space.
//! - UDP → TUN: `recvmsg` with `UDP_GRO` (a train arrives whole) scattered with iovecs
//!   straight to the segments' places in a reassembly buffer (no placement copy when the
//!   trains come in order, which they do on a veth), the headers checked (and with
//!   `--crc` the CRC), then one `write` of the whole packet into the TUN.
//!
//! So per 64 KiB packet: 1 TUN read, 1 `sendmmsg` (2 trains), 2 `recvmsg`, 1 TUN write,
//! and the copies are the kernel's: TUN read, UDP send, UDP receive, TUN write. A lost
//! or out-of-order segment drops its packet (TCP above resends it).
//!
//! Usage (root, inside a network namespace; scripts/ipoib-bound.sh runs two):
//!
//! ```text
//! tun_relay DEV ADDR/PREFIX LOCAL_IP:PORT PEER_IP:PORT [--crc]
//! ```
//!
//! On exit (SIGINT/SIGTERM) it prints its counts: packets each way, system calls.

#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ipoib::tun::Tun;

/// Payload octets per segment (the connected-mode IB MTU the daemon uses).
const SEG: usize = 4096;
/// The per-segment header: message number (4), index (2), count (2), packet length (4),
/// CRC-32 of the segment's payload or 0 (4).
const HDR: usize = 16;
/// Segments per UDP GSO train: 15 × 4,112 = 61,680 octets, under the 65,535 of a UDP
/// datagram (`udp_sendmsg` refuses more).
const TRAIN: usize = 15;
/// Virtio-net header + the largest IP packet.
const BUF: usize = 10 + 65_520;
const MAX_SEGS: usize = BUF.div_ceil(SEG);
/// `UDP_SEGMENT`, `UDP_GRO` (linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

#[derive(Default)]
struct Counts {
    tun_reads: AtomicU64,
    sends: AtomicU64,
    recvs: AtomicU64,
    tun_writes: AtomicU64,
    dropped: AtomicU64,
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: tun_relay DEV ADDR/PREFIX LOCAL_IP:PORT PEER_IP:PORT [--crc]");
        std::process::exit(2);
    }
    let crc = args.iter().any(|a| a == "--crc");
    let local: SocketAddr = args[3].parse().map_err(io::Error::other)?;
    let peer: SocketAddr = args[4].parse().map_err(io::Error::other)?;
    let tun = Tun::open_offload(&args[1])?;
    tun.configure(65_520, std::slice::from_ref(&args[2]))?;
    let sock = UdpSocket::bind(local)?;
    sock.connect(peer)?;
    setsockopt(&sock, libc::SOL_UDP, UDP_GRO, 1)?;
    setsockopt(&sock, libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20)?;
    setsockopt(&sock, libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20)?;
    // Print the counts on SIGINT/SIGTERM: block them in every thread (the mask is
    // inherited, so before spawning) and wait for one here.
    // SAFETY: `set` is a local sigset_t initialised by sigemptyset before use; the calls
    // take pointers to it only for their duration.
    let set = unsafe {
        let mut set: libc::sigset_t = zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let counts = Arc::new(Counts::default());
    let (tun_rx, sock_rx, c_rx) = (tun.try_clone()?, sock.try_clone()?, counts.clone());
    std::thread::spawn(move || udp_to_tun(&sock_rx, &tun_rx, crc, &c_rx));
    let (tun_tx, c_tx) = (tun.try_clone()?, counts.clone());
    std::thread::spawn(move || tun_to_udp(&tun_tx, &sock, crc, &c_tx));
    let mut sig = 0;
    // SAFETY: `set` and `sig` live across the call.
    unsafe { libc::sigwait(&set, &mut sig) };
    let c = &counts;
    println!(
        "tun_relay {}: {} TUN reads, {} sendmmsg, {} recvmsg, {} TUN writes, {} dropped",
        args[1],
        c.tun_reads.load(Ordering::Relaxed),
        c.sends.load(Ordering::Relaxed),
        c.recvs.load(Ordering::Relaxed),
        c.tun_writes.load(Ordering::Relaxed),
        c.dropped.load(Ordering::Relaxed)
    );
    Ok(())
}

fn setsockopt(s: &UdpSocket, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: `v` is an int that lives across the call; its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn crc32(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32IsoHdlc, b) as u32
}

fn header(msg: u32, idx: usize, n: usize, len: usize, crc: u32) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0..4].copy_from_slice(&msg.to_be_bytes());
    h[4..6].copy_from_slice(&(idx as u16).to_be_bytes());
    h[6..8].copy_from_slice(&(n as u16).to_be_bytes());
    h[8..12].copy_from_slice(&(len as u32).to_be_bytes());
    h[12..16].copy_from_slice(&crc.to_be_bytes());
    h
}

fn tun_to_udp(tun: &std::fs::File, sock: &UdpSocket, crc: bool, c: &Counts) {
    let mut buf = vec![0u8; BUF];
    let mut hdrs = [[0u8; HDR]; MAX_SEGS];
    let mut msg: u32 = 0;
    // Control message: one UDP_SEGMENT (u16) per train.
    // SAFETY: CMSG_SPACE only computes a size.
    let cmsg_space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
    let mut ctrl = vec![0u64; (2 * cmsg_space).div_ceil(8)];
    loop {
        // SAFETY: `buf` is a live, writable Vec of BUF octets; the kernel writes at most that.
        let n = unsafe { libc::read(tun.as_raw_fd(), buf.as_mut_ptr().cast(), BUF) };
        if n <= 0 {
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            eprintln!("TUN read: {}", io::Error::last_os_error());
            return;
        }
        let n = n as usize;
        c.tun_reads.fetch_add(1, Ordering::Relaxed);
        msg = msg.wrapping_add(1);
        let segs = n.div_ceil(SEG);
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(2 * segs);
        for (i, h) in hdrs.iter_mut().enumerate().take(segs) {
            let p = &buf[i * SEG..n.min((i + 1) * SEG)];
            *h = header(msg, i, segs, n, if crc { crc32(p) } else { 0 });
            iov.push(libc::iovec {
                iov_base: h.as_ptr() as *mut _,
                iov_len: HDR,
            });
            iov.push(libc::iovec {
                iov_base: p.as_ptr() as *mut _,
                iov_len: p.len(),
            });
        }
        let trains = segs.div_ceil(TRAIN);
        // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
        let mut mm: Vec<libc::mmsghdr> = (0..trains).map(|_| unsafe { zeroed() }).collect();
        for (t, m) in mm.iter_mut().enumerate() {
            let first = t * TRAIN;
            let k = TRAIN.min(segs - first);
            m.msg_hdr.msg_iov = iov[2 * first..].as_mut_ptr();
            m.msg_hdr.msg_iovlen = 2 * k;
            if k > 1 {
                // SAFETY: `ctrl` has room for one cmsg per train (2 trains at most) and
                // lives until sendmmsg returns; CMSG_* compute in-bounds pointers into it.
                unsafe {
                    let base = (ctrl.as_mut_ptr() as *mut u8).add(t * cmsg_space);
                    m.msg_hdr.msg_control = base.cast();
                    m.msg_hdr.msg_controllen = cmsg_space;
                    let cm = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                    (*cm).cmsg_level = libc::SOL_UDP;
                    (*cm).cmsg_type = UDP_SEGMENT;
                    (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), (HDR + SEG) as u16);
                }
            }
        }
        let mut sent = 0;
        while sent < trains {
            // SAFETY: every mmsghdr points at iovecs into `hdrs` and `buf` and at `ctrl`,
            // all alive and unchanged until the call returns.
            let r = unsafe { libc::sendmmsg(sock.as_raw_fd(), mm[sent..].as_mut_ptr(), (trains - sent) as u32, 0) };
            c.sends.fetch_add(1, Ordering::Relaxed);
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // ECONNREFUSED before the peer is up, ENOBUFS: the packet is lost.
                c.dropped.fetch_add(1, Ordering::Relaxed);
                break;
            }
            sent += r as usize;
        }
    }
}

fn udp_to_tun(sock: &UdpSocket, tun: &std::fs::File, crc: bool, c: &Counts) {
    let mut buf = vec![0u8; BUF];
    let mut hdrs = [[0u8; HDR]; MAX_SEGS];
    // The packet being assembled: message number, segments placed so far.
    let mut cur: Option<(u32, usize)> = None;
    // SAFETY: CMSG_SPACE only computes a size.
    let cmsg_space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
    let mut ctrl = vec![0u64; cmsg_space.div_ceil(8) + 1];
    loop {
        let next = cur.map_or(0, |(_, k)| k);
        // Scatter the next train to where its segments go if it continues the packet.
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(2 * TRAIN);
        for i in next..(next + TRAIN).min(MAX_SEGS) {
            iov.push(libc::iovec {
                iov_base: hdrs[i].as_mut_ptr().cast(),
                iov_len: HDR,
            });
            iov.push(libc::iovec {
                iov_base: buf[i * SEG..].as_mut_ptr().cast(),
                iov_len: SEG.min(BUF - i * SEG),
            });
        }
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let mut mh: libc::msghdr = unsafe { zeroed() };
        mh.msg_iov = iov.as_mut_ptr();
        mh.msg_iovlen = iov.len();
        mh.msg_control = ctrl.as_mut_ptr().cast();
        mh.msg_controllen = ctrl.len() * 8;
        // SAFETY: the iovecs point into `hdrs` and `buf`, which live across the call and
        // which nothing else touches; `ctrl` is as long as msg_controllen says.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut mh, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused) {
                continue;
            }
            eprintln!("recvmsg: {e}");
            return;
        }
        c.recvs.fetch_add(1, Ordering::Relaxed);
        let r = r as usize;
        // The segment size from the UDP_GRO cmsg (absent: one datagram).
        let mut gso = r;
        // SAFETY: CMSG_* walk the control buffer the kernel filled, within msg_controllen.
        unsafe {
            let mut cm = libc::CMSG_FIRSTHDR(&mh);
            while !cm.is_null() {
                if (*cm).cmsg_level == libc::SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                    gso = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<u16>()) as usize;
                }
                cm = libc::CMSG_NXTHDR(&mh, cm);
            }
        }
        if gso != HDR + SEG && r > gso {
            c.dropped.fetch_add(1, Ordering::Relaxed);
            cur = None;
            continue;
        }
        let got = r.div_ceil(HDR + SEG);
        let h = &hdrs[next];
        let msg = u32::from_be_bytes(h[0..4].try_into().unwrap());
        let idx = u16::from_be_bytes(h[4..6].try_into().unwrap()) as usize;
        let n = u16::from_be_bytes(h[6..8].try_into().unwrap()) as usize;
        let len = u32::from_be_bytes(h[8..12].try_into().unwrap()) as usize;
        let in_order = match cur {
            Some((m, k)) => m == msg && idx == k,
            None => idx == 0,
        };
        if !in_order || len > BUF || n != len.div_ceil(SEG) || idx + got > n {
            // A new packet where a continuation was expected, or a lost train: drop.
            c.dropped.fetch_add(1, Ordering::Relaxed);
            cur = None;
            continue;
        }
        if crc {
            let bad = (next..next + got).any(|i| {
                let want = u32::from_be_bytes(hdrs[i][12..16].try_into().unwrap());
                crc32(&buf[i * SEG..len.min((i + 1) * SEG)]) != want
            });
            if bad {
                c.dropped.fetch_add(1, Ordering::Relaxed);
                cur = None;
                continue;
            }
        }
        if idx + got < n {
            cur = Some((msg, idx + got));
            continue;
        }
        cur = None;
        // SAFETY: `buf[..len]` is initialised (placed above) and lives across the call.
        let w = unsafe { libc::write(tun.as_raw_fd(), buf.as_ptr().cast(), len) };
        if w < 0 {
            c.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            c.tun_writes.fetch_add(1, Ordering::Relaxed);
        }
    }
}
