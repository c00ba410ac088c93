//! The bound for issue 13's "RoCEv2 RDMA Write 1 MiB ≥ 0.9× plain TCP on loopback": the
//! simplest program that does only the work a RoCEv2 Write over kernel UDP sockets cannot
//! avoid, next to plain TCP in the same run.
//!
//! - sender: 4 KiB packets (a 12-octet header standing in for the BTH, 4096 octets of
//!   payload read straight from the source buffer by `sendmmsg` iovecs, a 4-octet CRC-32
//!   trailer), one CRC pass over each packet, GSO trains of 15 packets, 4 trains per
//!   `sendmmsg`, a window of `W` packets;
//! - receiver: `recvmmsg` with `UDP_GRO` (16 slots of 64 KiB), per packet one CRC pass and one
//!   copy of the payload into a destination buffer, and an 8-octet ACK every `A` packets (the
//!   sender's window needs them, as RC's does);
//! - TCP: 1 MiB `write_all` from a page-aligned buffer against a reader with a page-aligned
//!   1 MiB buffer (the bench's baseline).
//! - the bound again with an SMC-R consumer's copy: the receiver also copies each placed
//!   payload out of the destination into a second buffer, as `SmcStream::read` copies out of
//!   its RMB (issue 15's streaming bound; SMC-R's data moves in RoCE Writes).
//!
//! Each round runs the bound, the bound with the consumer's copy, TCP and then the engine's own RDMA Write of 1 MiB messages for
//! the same time each; the ratios are those of the round. Per-thread CPU seconds per GB show
//! which side bounds it.
//!
//! `cargo run -p roce --release --example udp_bound [-- seconds rounds window ack_every]`
//! (defaults 2 3 256 64).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crc_fast::{CrcAlgorithm, Digest};

mod common;

const MSG: usize = 1 << 20;
const PAYLOAD: usize = 4096;
const HDR: usize = 12;
const SEG: usize = HDR + PAYLOAD + 4;
const TRAIN: usize = 15;
const TRAINS_PER_CALL: usize = 4;
const SLOTS: usize = 16;
const SLOT: usize = 65_536;

/// What one side of a run did.
struct Side {
    bytes: u64,
    cpu: f64,
}

fn crc(parts: &[&[u8]]) -> u32 {
    let mut d = Digest::new(CrcAlgorithm::Crc32IsoHdlc);
    for p in parts {
        d.update(p);
    }
    d.finalize() as u32
}

/// `consume`: the receiver also copies each placed payload out of the destination into a
/// second buffer, as an SMC-R receiver's `read` copies out of its RMB (issue 15's streaming
/// bound: the RoCE Write's work plus the consumer's copy, and nothing else of SMC-R).
fn udp_run(secs: f64, window: u64, ack_every: u64, base: u8, consume: bool) -> (f64, Side, Side, u64) {
    let rx = UdpSocket::bind(format!("127.97.{base}.2:0")).unwrap();
    let tx = UdpSocket::bind(format!("127.97.{base}.1:0")).unwrap();
    sys::set_gro(&rx);
    sys::set_rcvbuf(&rx, 8 << 20);
    sys::set_rcvbuf(&tx, 1 << 20);
    let to = rx.local_addr().unwrap();
    let back = tx.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let receiver = std::thread::spawn(move || {
        let c0 = sys::thread_cpu();
        let mut dst = vec![0u8; MSG];
        let mut app = vec![0u8; if consume { MSG } else { 0 }];
        let mut slots = vec![0u8; SLOTS * SLOT];
        let (mut pkts, mut bytes, mut bad) = (0u64, 0u64, 0u64);
        rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        while !stop2.load(Ordering::Relaxed) {
            let got = sys::recvmmsg_gro(&rx, &mut slots);
            for (i, &(len, seg)) in got.iter().enumerate() {
                let d = &slots[i * SLOT..i * SLOT + len];
                let seg = if seg == 0 { len } else { seg };
                for p in d.chunks(seg) {
                    let n = p.len();
                    let stored = u32::from_le_bytes(p[n - 4..].try_into().unwrap());
                    if n < HDR + 4 || crc(&[&p[..n - 4]]) != stored {
                        bad += 1;
                        continue;
                    }
                    let off = u32::from_le_bytes(p[4..8].try_into().unwrap()) as usize;
                    let payload = &p[HDR..n - 4];
                    dst[off..off + payload.len()].copy_from_slice(payload);
                    if consume {
                        app[off..off + payload.len()].copy_from_slice(&dst[off..off + payload.len()]);
                    }
                    pkts += 1;
                    bytes += payload.len() as u64;
                    if pkts.is_multiple_of(ack_every) {
                        rx.send_to(&pkts.to_le_bytes(), back).unwrap();
                    }
                }
            }
        }
        std::hint::black_box((&dst, &app));
        (
            Side {
                bytes,
                cpu: sys::thread_cpu() - c0,
            },
            bad,
        )
    });
    let c0 = sys::thread_cpu();
    let src: Vec<u8> = (0..MSG).map(|i| (i * 7) as u8).collect();
    let (mut sent, mut acked) = (0u64, 0u64);
    let mut ack = [0u8; 8];
    tx.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let t0 = Instant::now();
    let mut hdrs = vec![[0u8; HDR]; TRAIN * TRAINS_PER_CALL];
    let mut crcs = vec![[0u8; 4]; TRAIN * TRAINS_PER_CALL];
    while t0.elapsed().as_secs_f64() < secs {
        // ACKs: wait while the window is full, else take what is there.
        tx.set_nonblocking(sent - acked < window).unwrap();
        loop {
            match tx.recv(&mut ack) {
                Ok(8) => {
                    acked = acked.max(u64::from_le_bytes(ack));
                    tx.set_nonblocking(true).unwrap();
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("ack: {e}"),
            }
        }
        let n = ((window - (sent - acked)) as usize).min(TRAIN * TRAINS_PER_CALL);
        if n == 0 {
            continue;
        }
        for k in 0..n {
            let psn = sent + k as u64;
            let off = (psn as usize % (MSG / PAYLOAD)) * PAYLOAD;
            hdrs[k][..4].copy_from_slice(&(psn as u32).to_le_bytes());
            hdrs[k][4..8].copy_from_slice(&(off as u32).to_le_bytes());
            crcs[k] = crc(&[&hdrs[k], &src[off..off + PAYLOAD]]).to_le_bytes();
        }
        let mut pkts: Vec<[&[u8]; 3]> = Vec::with_capacity(n);
        for k in 0..n {
            let off = ((sent + k as u64) as usize % (MSG / PAYLOAD)) * PAYLOAD;
            pkts.push([&hdrs[k], &src[off..off + PAYLOAD], &crcs[k]]);
        }
        sys::sendmmsg_gso(&tx, to, &pkts, SEG, TRAIN);
        sent += n as u64;
    }
    let wall = t0.elapsed().as_secs_f64();
    let tx_side = Side {
        bytes: sent * PAYLOAD as u64,
        cpu: sys::thread_cpu() - c0,
    };
    // Let the receiver finish what is queued, then stop it.
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let (rx_side, bad) = receiver.join().unwrap();
    (rx_side.bytes as f64 / wall, tx_side, rx_side, bad)
}

fn tcp_run(secs: f64, base: u8) -> (f64, Side, Side) {
    let l = TcpListener::bind(format!("127.97.{base}.3:0")).unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let c0 = sys::thread_cpu();
        let (mut s, _) = l.accept().unwrap();
        // Page-aligned, as the bench's baseline reads (a 1 MiB `Vec` starts 16 octets into
        // a page, which costs this CPU's kernel copy up to 2.5x: docs/performance.md,
        // "a fair TCP baseline for bulk bandwidth").
        let mut store = vec![0u8; MSG + 4096];
        let at = store.as_ptr().align_offset(4096);
        let buf = &mut store[at..at + MSG];
        let mut n = 0u64;
        loop {
            match s.read(buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k as u64,
            }
        }
        Side {
            bytes: n,
            cpu: sys::thread_cpu() - c0,
        }
    });
    let c0 = sys::thread_cpu();
    let mut s = TcpStream::connect(addr).unwrap();
    let mut store = vec![0x5au8; MSG + 4096];
    let at = store.as_ptr().align_offset(4096);
    let buf = &mut store[at..at + MSG];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        s.write_all(buf).unwrap();
        sent += MSG as u64;
    }
    drop(s);
    let r = rx.join().unwrap();
    let wall = t0.elapsed().as_secs_f64();
    let tx = Side {
        bytes: sent,
        cpu: sys::thread_cpu() - c0,
    };
    (r.bytes as f64 / wall, tx, r)
}

/// The engine's RDMA Write of 1 MiB messages, 8 outstanding, on two
/// loopback devices at MTU 4096: the same work as the bound plus everything that is ours.
/// Returns the rate and the CPU seconds of the whole process (every thread) meanwhile.
fn engine_run(secs: f64, base: u8) -> (f64, f64, u64) {
    use verbs::*;
    let (a, b) = common::rc_pair(
        &format!("127.97.{base}.5"),
        &format!("127.97.{base}.6"),
        &[],
        1 << 12,
        64,
    );
    // One 1 MiB region each, every Write to its start, as `softrdma bench` and perftest do
    // (and as the bound's and TCP's 1 MiB buffers).
    let ma = a.pd.reg_mr(MSG, Access::all_remote()).unwrap();
    let mb = b.pd.reg_mr(MSG, Access::all_remote()).unwrap();
    let block = || {
        let wc = a.cq.wait(Some(Duration::from_secs(30))).expect("a completion");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    };
    let c0 = sys::process_cpu();
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while t0.elapsed().as_secs_f64() < secs {
        while posted - done < 8 {
            let remote = RemoteAddr {
                addr: mb.addr(),
                rkey: mb.rkey(),
            };
            a.qp.post_send_one(SendWr::new(
                posted,
                WrOpcode::RdmaWrite { remote },
                vec![ma.sge(0, MSG as u32)],
            ))
            .unwrap();
            posted += 1;
        }
        block();
        done += 1;
    }
    while done < posted {
        block();
        done += 1;
    }
    let bytes = done * MSG as u64;
    let r = bytes as f64 / t0.elapsed().as_secs_f64();
    let cpu = sys::process_cpu() - c0;
    let retrans = common::counter(&a.dev, "retransmitted_pkts");
    if common::counters_wanted() {
        let mib = (bytes >> 20) as f64;
        for (side, d) in [("requester", &a.dev), ("responder", &b.dev)] {
            let per = |n: &str| common::counter(d, n) as f64 / mib;
            println!(
                "         {side} per MiB: sent_pkts {:.1} tx_datagrams {:.1} tx_syscalls {:.1} rx_datagrams {:.1} rx_syscalls {:.1} progress_mutes {:.2} progress_flushes {:.2}; in all: icrc_err {} ack_timeouts {} rcvd_seq_err {} send_seq_err {}",
                per("sent_pkts"),
                per("tx_datagrams"),
                per("tx_syscalls"),
                per("rx_datagrams"),
                per("rx_syscalls"),
                per("progress_mutes"),
                per("progress_flushes"),
                common::counter(d, "icrc_err"),
                common::counter(d, "ack_timeouts"),
                common::counter(d, "rcvd_seq_err"),
                common::counter(d, "send_seq_err"),
            );
        }
    }
    (r, cpu / (bytes as f64 / 1e9), retrans)
}

fn per_gb(s: &Side) -> f64 {
    s.cpu / (s.bytes.max(1) as f64 / 1e9)
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: f64| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (secs, rounds) = (arg(0, 2.0), arg(1, 3.0) as usize);
    let (window, ack_every) = (arg(2, 256.0) as u64, arg(3, 64.0) as u64);
    println!("bound: UDP GSO/GRO 4 KiB packets, window {window}, ACK every {ack_every}; {secs} s per side");
    for r in 0..rounds {
        let (u, utx, urx, bad) = udp_run(secs, window, ack_every, 10 + r as u8, false);
        let (c, ctx, crx, cbad) = udp_run(secs, window, ack_every, 40 + r as u8, true);
        let (t, ttx, trx) = tcp_run(secs, 10 + r as u8);
        let (e, ecpu, retrans) = engine_run(secs, 10 + r as u8);
        println!(
            "round {}: UDP bound {:.0} MB/s, TCP {:.0} MB/s, ratio {:.3}; CPU s per GB: bound send {:.3} recv {:.3}, TCP send {:.3} recv {:.3}{}",
            r + 1,
            u / 1e6,
            t / 1e6,
            u / t,
            per_gb(&utx),
            per_gb(&urx),
            per_gb(&ttx),
            per_gb(&trx),
            if bad > 0 {
                format!(" ({bad} bad CRC)")
            } else {
                String::new()
            }
        );
        println!(
            "         bound + SMC-R consumer copy {:.0} MB/s: {:.3}x TCP; CPU s per GB: send {:.3} recv {:.3}{}",
            c / 1e6,
            c / t,
            per_gb(&ctx),
            per_gb(&crx),
            if cbad > 0 {
                format!(" ({cbad} bad CRC)")
            } else {
                String::new()
            }
        );
        println!(
            "         engine Write 1 MiB {:.0} MB/s: {:.3}x TCP, {:.3}x the bound; CPU s per GB, all threads: engine {:.3}, bound {:.3}, TCP {:.3}; {retrans} packets retransmitted",
            e / 1e6,
            e / t,
            e / u,
            ecpu,
            per_gb(&utx) + per_gb(&urx),
            per_gb(&ttx) + per_gb(&trx),
        );
    }
}

/// The system calls the bound makes that std does not offer.
mod sys {
    use std::net::{SocketAddr, UdpSocket};
    use std::os::fd::AsRawFd;

    const UDP_SEGMENT: libc::c_int = 103;
    const UDP_GRO: libc::c_int = 104;

    fn setsockopt(s: &UdpSocket, level: libc::c_int, name: libc::c_int, v: libc::c_int) {
        // SAFETY: `v` is a live c_int and its size is passed; the fd is the socket's.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                name,
                (&raw const v).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "setsockopt {level}/{name}: {}", std::io::Error::last_os_error());
    }

    pub fn set_gro(s: &UdpSocket) {
        setsockopt(s, libc::SOL_UDP, UDP_GRO, 1);
    }

    /// SO_RCVBUFFORCE (root), else SO_RCVBUF up to rmem_max.
    pub fn set_rcvbuf(s: &UdpSocket, bytes: usize) {
        let v = bytes as libc::c_int;
        // SAFETY: as in `setsockopt`; failure is allowed here.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&raw const v).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            setsockopt(s, libc::SOL_SOCKET, libc::SO_RCVBUF, v);
        }
    }

    /// CPU seconds of the whole process.
    pub fn process_cpu() -> f64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid out-pointer for the call.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
    }

    /// CPU seconds of the calling thread.
    pub fn thread_cpu() -> f64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid out-pointer for the call.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
    }

    fn sockaddr(a: SocketAddr) -> libc::sockaddr_in {
        let SocketAddr::V4(a) = a else { panic!("IPv4 only") };
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            },
            sin_zero: [0; 8],
        }
    }

    /// Sends `pkts` (each its parts as iovecs) to `to` in GSO trains of `train` packets of
    /// `seg` octets (the last packet of a train may be shorter), one `sendmmsg` for all.
    pub fn sendmmsg_gso(s: &UdpSocket, to: SocketAddr, pkts: &[[&[u8]; 3]], seg: usize, train: usize) {
        let sa = sockaddr(to);
        let iov: Vec<libc::iovec> = pkts
            .iter()
            .flat_map(|p| p.iter())
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let trains = pkts.len().div_ceil(train);
        // SAFETY: CMSG_SPACE only computes a size.
        let cspace = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
        let mut ctrl = vec![0u64; (cspace * trains).div_ceil(8)];
        let mut msgs: Vec<libc::mmsghdr> = Vec::with_capacity(trains);
        for t in 0..trains {
            let first = t * train;
            let count = train.min(pkts.len() - first);
            // SAFETY: an all-zero msghdr is valid; the pointers set below point into `iov`,
            // `sa` and `ctrl`, which outlive the sendmmsg call.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_name = (&raw const sa) as *mut libc::c_void;
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            h.msg_iov = iov[first * 3..].as_ptr() as *mut libc::iovec;
            h.msg_iovlen = count * 3;
            if count > 1 {
                // SAFETY: `ctrl` has `cspace` octets for each train, 8-aligned; CMSG_FIRSTHDR
                // and CMSG_DATA stay inside them.
                unsafe {
                    h.msg_control = ctrl.as_mut_ptr().cast::<u8>().add(t * cspace).cast();
                    h.msg_controllen = cspace;
                    let cm = libc::CMSG_FIRSTHDR(&h);
                    (*cm).cmsg_level = libc::SOL_UDP;
                    (*cm).cmsg_type = UDP_SEGMENT;
                    (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), seg as u16);
                }
            }
            msgs.push(libc::mmsghdr { msg_hdr: h, msg_len: 0 });
        }
        let mut done = 0;
        while done < msgs.len() {
            // SAFETY: `msgs[done..]` are valid mmsghdrs whose buffers are alive (above).
            let r = unsafe { libc::sendmmsg(s.as_raw_fd(), msgs[done..].as_mut_ptr(), (msgs.len() - done) as u32, 0) };
            assert!(r > 0, "sendmmsg: {}", std::io::Error::last_os_error());
            done += r as usize;
        }
    }

    /// How many of the 16 slots a `recvmmsg` offers (`UDP_BOUND_RX_SLOTS`, default 16).
    fn rx_slots() -> usize {
        std::env::var("UDP_BOUND_RX_SLOTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(super::SLOTS, |n: usize| n.clamp(1, super::SLOTS))
    }

    /// One blocking `recvmmsg` (MSG_WAITFORONE) into `slots` (16 of 64 KiB); returns each
    /// datagram's length and GRO segment size (0: a single packet). Empty on timeout.
    pub fn recvmmsg_gro(s: &UdpSocket, slots: &mut [u8]) -> Vec<(usize, usize)> {
        const N: usize = super::SLOTS;
        // SAFETY: CMSG_SPACE only computes a size.
        let cspace = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
        let mut ctrl = vec![0u64; (cspace * N).div_ceil(8)];
        let base = slots.as_mut_ptr();
        let mut iov: Vec<libc::iovec> = (0..N)
            .map(|i| libc::iovec {
                // SAFETY: slot i lies inside `slots` (N * SLOT octets).
                iov_base: unsafe { base.add(i * super::SLOT) }.cast(),
                iov_len: super::SLOT,
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = (0..N)
            .map(|i| {
                // SAFETY: an all-zero msghdr is valid; the pointers point into `iov` and
                // `ctrl`, alive for the call.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = &raw mut iov[i];
                h.msg_iovlen = 1;
                // SAFETY: `ctrl` has `cspace` octets per slot.
                h.msg_control = unsafe { ctrl.as_mut_ptr().cast::<u8>().add(i * cspace) }.cast();
                h.msg_controllen = cspace;
                libc::mmsghdr { msg_hdr: h, msg_len: 0 }
            })
            .collect();
        // SAFETY: `msgs` are valid mmsghdrs over live buffers.
        let r = unsafe {
            libc::recvmmsg(
                s.as_raw_fd(),
                msgs.as_mut_ptr(),
                rx_slots() as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if r <= 0 {
            return Vec::new();
        }
        (0..r as usize)
            .map(|i| {
                let h = &msgs[i].msg_hdr;
                let mut seg = 0;
                // SAFETY: the kernel filled `h`'s control buffer; the CMSG_* walk stays in it.
                unsafe {
                    let mut cm = libc::CMSG_FIRSTHDR(h);
                    while !cm.is_null() {
                        if (*cm).cmsg_level == libc::SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                            seg = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<libc::c_int>()) as usize;
                        }
                        cm = libc::CMSG_NXTHDR(h, cm);
                    }
                }
                (msgs[i].msg_len as usize, seg)
            })
            .collect()
    }
}
