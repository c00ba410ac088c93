//! The bound of issue 15's "request/response latency (64 B) ≤ 1.0× TCP" (session 14): the
//! simplest program doing per 64-octet message only what SMC-R over RoCEv2 over kernel UDP
//! sockets cannot avoid, blocking as `softrdma smc bench` blocks, next to a blocking TCP
//! ping-pong of 64 octets (TCP_NODELAY, `read_exact`/`write_all`, as the bench's baseline)
//! between the same addresses, in one run.
//!
//! Per message, the sender makes one `sendmmsg` of
//! - the ACK of the peer's last message (BTH + AETH + ICRC, 20 octets; the first request
//!   has none): the engine's deferred ACK riding with the next post,
//! - the RDMA Write of the 64 octets into the peer's RMB (BTH + RETH + 64 + ICRC, 96
//!   octets),
//! - the CDC Send announcing them (BTH + 44-octet CDC + ICRC, 60 octets),
//!
//! each with its BTH built and its ICRC computed over the masked IPv4/UDP headers. The
//! receiver sleeps in the kernel until the datagrams arrive, parses each BTH and checks its
//! ICRC, copies the Write's payload into its RMB at the RETH's address, parses the CDC (its
//! producer cursor says the octets are there), then copies the 64 octets from the RMB into
//! the application's buffer (SMC-R's receive copy) and answers the same way. One thread per
//! end, nothing else: no queues, no locks, no completions, no verbs.
//!
//! Two ways to sleep, both measured:
//! - `recvmmsg`: a blocking `recvmmsg(MSG_WAITFORONE)` (one system call per wake-up);
//! - `poll+recvmmsg`: `poll(2)` then a nonblocking `recvmmsg` (the RoCE provider's inline
//!   CQ wait).
//!
//! The ratio of each p50 to TCP's p50 in the same round is the best a user-space SMC-R over
//! RoCEv2 over kernel UDP can do against the bench's TCP on this machine.
//!
//! `cargo run -p smc --release --example smc_latency_bound [-- iters [rounds [addr]]]`
//! (defaults 10000, 3, 127.0.97.71); prints one line per round, then the ratios.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Instant;

use roce::wire::headers::CreditCode;
use roce::wire::{Aeth, Bth, Opcode, Psn, Reth, Syndrome, icrc};
use smc::wire::cdc::Cdc;
use smc::wire::cursor::Cursor;

const MSG: usize = 64;
const WRITE_LEN: usize = Bth::LEN + Reth::LEN + MSG + 4;
const CDC_PKT: usize = Bth::LEN + 44 + 4;
const ACK_LEN: usize = Bth::LEN + Aeth::LEN + 4;
const RMB: usize = 16 * 1024;
/// `UDP_SEGMENT` (linux/udp.h): the GSO segment size of a send.
const UDP_SEGMENT: libc::c_int = 103;

/// How the receiver sleeps until its datagrams arrive.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Wait {
    /// Blocking `recvmmsg` with MSG_WAITFORONE.
    Recvmmsg,
    /// `poll(2)`, then a nonblocking `recvmmsg`.
    PollRecvmmsg,
}

/// Where the ACK of the peer's last message goes.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Acks {
    /// Before the Write and the CDC (as the engine's deferred ACK rides today).
    First,
    /// After them.
    Last,
    /// Not sent (a decomposition row, not SMC-R).
    None,
}

/// The IPv4 header the ICRC covers (ID 0; masked fields are set to 1s by `icrc`).
fn ip_header(src: Ipv4Addr, dst: Ipv4Addr, udp_len: usize) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    h[6] = 0x40;
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    h
}

/// The IPv4 and UDP pseudo headers of a packet of `len` octets from `a` to `b`.
fn headers(a: SocketAddr, b: SocketAddr, len: usize) -> ([u8; 20], [u8; 8]) {
    let (SocketAddr::V4(a), SocketAddr::V4(b)) = (a, b) else {
        panic!("IPv4 only")
    };
    (
        ip_header(*a.ip(), *b.ip(), 8 + len),
        icrc::udp_header(a.port(), b.port(), len),
    )
}

struct End {
    sock: UdpSocket,
    me: SocketAddr,
    peer: SocketAddr,
    psn: Psn,
    seq: u16,
    prod: u32,
    /// This end's RMB, written by the peer's Writes.
    rmb: Box<[u8; RMB]>,
    /// The last PSN received, to ACK with the next message.
    ack_due: Option<Psn>,
    msn: u32,
    tx: [[u8; 128]; 3],
    rx: [[u8; 256]; 8],
    /// Where the due ACK goes in the next message's `sendmmsg`.
    acks: Acks,
    /// The Write and the CDC as one UDP GSO train (`UDP_SEGMENT`).
    gso: bool,
}

impl End {
    fn new(sock: UdpSocket, peer: SocketAddr) -> End {
        sock.connect(peer).unwrap();
        End {
            me: sock.local_addr().unwrap(),
            sock,
            peer,
            psn: Psn::new(0),
            seq: 0,
            prod: 0,
            rmb: Box::new([0; RMB]),
            ack_due: None,
            msn: 0,
            tx: [[0; 128]; 3],
            rx: [[0; 256]; 8],
            acks: Acks::First,
            gso: false,
        }
    }

    fn seal(&self, buf: &mut [u8], len: usize) {
        let (ip, udp) = headers(self.me, self.peer, len);
        let crc = icrc::compute(&ip, &udp, &buf[..len]).unwrap();
        buf[len - 4..len].copy_from_slice(&crc.to_le_bytes());
    }

    /// One `sendmmsg`: the due ACK (first or last, per `self.acks`), the RDMA Write of
    /// `data`, the CDC.
    fn send(&mut self, data: &[u8; MSG]) {
        let mut ack = None;
        if let Some(psn) = self.ack_due.take()
            && self.acks != Acks::None
        {
            let mut b = [0u8; ACK_LEN];
            Bth::new(Opcode::RC_ACKNOWLEDGE, 0x11, psn).emit(&mut b).unwrap();
            let aeth = Aeth {
                syndrome: Syndrome::Ack {
                    credits: CreditCode::INVALID,
                },
                msn: self.msn,
            };
            aeth.emit(&mut b[Bth::LEN..]).unwrap();
            self.seal(&mut b, ACK_LEN);
            ack = Some(b);
        }
        let at = (self.prod as usize) % RMB;
        let mut w = [0u8; WRITE_LEN];
        Bth::new(Opcode::RC_RDMA_WRITE_ONLY, 0x11, self.psn)
            .emit(&mut w)
            .unwrap();
        let reth = Reth {
            va: at as u64,
            r_key: 0x1234,
            dma_len: MSG as u32,
        };
        reth.emit(&mut w[Bth::LEN..]).unwrap();
        w[Bth::LEN + Reth::LEN..Bth::LEN + Reth::LEN + MSG].copy_from_slice(data);
        self.seal(&mut w, WRITE_LEN);
        self.psn = self.psn.add(1);
        self.prod = self.prod.wrapping_add(MSG as u32);
        self.seq = self.seq.wrapping_add(1);
        let cdc = Cdc {
            seq: self.seq,
            token: 7,
            prod: Cursor::new(0, self.prod % RMB as u32),
            ..Cdc::default()
        };
        let mut c = [0u8; CDC_PKT];
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, 0x11, self.psn);
        bth.ack_req = true;
        bth.emit(&mut c).unwrap();
        cdc.emit(&mut c[Bth::LEN..]).unwrap();
        self.seal(&mut c, CDC_PKT);
        self.psn = self.psn.add(1);
        let mut lens = [0usize; 3];
        let mut n = 0;
        let mut put = |tx: &mut [[u8; 128]; 3], pkt: &[u8]| {
            tx[n][..pkt.len()].copy_from_slice(pkt);
            lens[n] = pkt.len();
            n += 1;
        };
        if let (Some(a), Acks::First) = (&ack, self.acks) {
            put(&mut self.tx, a);
        }
        put(&mut self.tx, &w);
        put(&mut self.tx, &c);
        if let (Some(a), Acks::Last) = (&ack, self.acks) {
            put(&mut self.tx, a);
        }
        // Datagrams: (first packet, packets). With GSO the Write and the CDC (96 and 60
        // octets: only a train's last segment may be shorter) are one train, as the RoCE
        // engine sends them; an ACK is a datagram of its own.
        let w_at = usize::from(ack.is_some() && self.acks == Acks::First);
        let mut grams = [(0usize, 1usize); 3];
        let mut g = 0;
        let mut i = 0;
        while i < n {
            if self.gso && i == w_at {
                grams[g] = (i, 2);
                i += 2;
            } else {
                grams[g] = (i, 1);
                i += 1;
            }
            g += 1;
        }
        // SAFETY: the iovecs, control buffers and headers point into locals and `self.tx`,
        // alive and unmoved for the call; the socket is connected (no msg_name).
        let sent = unsafe {
            let mut iov: [libc::iovec; 3] = std::mem::zeroed();
            let mut hdr: [libc::mmsghdr; 3] = std::mem::zeroed();
            let mut ctl = [[0u64; 4]; 3];
            for k in 0..n {
                iov[k] = libc::iovec {
                    iov_base: self.tx[k].as_mut_ptr().cast(),
                    iov_len: lens[k],
                };
            }
            for (h, (&(first, count), c)) in hdr.iter_mut().zip(grams[..g].iter().zip(ctl.iter_mut())) {
                h.msg_hdr.msg_iov = &mut iov[first];
                h.msg_hdr.msg_iovlen = count as _;
                if count > 1 {
                    let space = libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize;
                    h.msg_hdr.msg_control = c.as_mut_ptr().cast();
                    h.msg_hdr.msg_controllen = space as _;
                    let cm = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                    (*cm).cmsg_level = libc::SOL_UDP;
                    (*cm).cmsg_type = UDP_SEGMENT;
                    (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), lens[first] as u16);
                }
            }
            libc::sendmmsg(self.sock.as_raw_fd(), hdr.as_mut_ptr(), g as u32, 0)
        };
        assert_eq!(sent, g as i32, "sendmmsg: {}", std::io::Error::last_os_error());
    }

    /// Sleeps until the peer's Write and CDC have arrived; copies the 64 octets out of the
    /// RMB into `out`.
    fn recv(&mut self, wait: Wait, out: &mut [u8; MSG]) {
        let fd = self.sock.as_raw_fd();
        let mut from = None;
        loop {
            let flags = match wait {
                Wait::Recvmmsg => libc::MSG_WAITFORONE,
                Wait::PollRecvmmsg => {
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    let r = unsafe { libc::poll(&mut p, 1, 5000) };
                    assert!(r > 0, "poll: {r} {}", std::io::Error::last_os_error());
                    libc::MSG_DONTWAIT
                }
            };
            // SAFETY: the iovecs and headers point into `self.rx`, alive for the call.
            let got = unsafe {
                let mut iov: [libc::iovec; 8] = std::mem::zeroed();
                let mut hdr: [libc::mmsghdr; 8] = std::mem::zeroed();
                for i in 0..8 {
                    iov[i] = libc::iovec {
                        iov_base: self.rx[i].as_mut_ptr().cast(),
                        iov_len: 256,
                    };
                    hdr[i].msg_hdr.msg_iov = &mut iov[i];
                    hdr[i].msg_hdr.msg_iovlen = 1;
                }
                let r = libc::recvmmsg(fd, hdr.as_mut_ptr(), 8, flags, std::ptr::null_mut());
                if r < 0 {
                    let e = std::io::Error::last_os_error();
                    // An ICMP port unreachable for a datagram sent to a socket of an
                    // earlier round (same ephemeral port) is reported here once: skip it.
                    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "recvmmsg: {e}");
                }
                let r = r.max(0);
                let mut lens = [0usize; 8];
                for i in 0..r as usize {
                    lens[i] = hdr[i].msg_len as usize;
                }
                (r as usize, lens)
            };
            let mut cdc_seen = false;
            for i in 0..got.0 {
                let pkt = &self.rx[i][..got.1[i]];
                let (ip, udp) = headers(self.peer, self.me, pkt.len());
                icrc::verify(&ip, &udp, pkt).unwrap();
                let (bth, rest) = Bth::parse(pkt).unwrap();
                match bth.opcode {
                    Opcode::RC_ACKNOWLEDGE => {
                        Aeth::parse(rest).unwrap();
                    }
                    Opcode::RC_RDMA_WRITE_ONLY => {
                        let (reth, data) = Reth::parse(rest).unwrap();
                        let (at, n) = (reth.va as usize, reth.dma_len as usize);
                        self.rmb[at..at + n].copy_from_slice(&data[..n]);
                        from = Some(at);
                    }
                    Opcode::RC_SEND_ONLY => {
                        let cdc = Cdc::parse(rest).unwrap();
                        assert_eq!(cdc.token, 7);
                        self.ack_due = Some(bth.psn);
                        self.msn = self.msn.wrapping_add(1);
                        cdc_seen = true;
                    }
                    o => panic!("unexpected {o:?}"),
                }
            }
            if cdc_seen {
                let at = from.expect("CDC before its Write");
                out.copy_from_slice(&self.rmb[at..at + MSG]);
                return;
            }
        }
    }
}

fn p50(mut t: Vec<std::time::Duration>) -> f64 {
    t.sort();
    t[t.len() / 2].as_secs_f64() * 1e6
}

/// `iters` SMC-R-shaped round trips of 64 octets; the p50 in µs.
fn bound(addr: Ipv4Addr, wait: Wait, acks: Acks, gso: bool, iters: usize) -> f64 {
    let a = UdpSocket::bind((addr, 0)).unwrap();
    let b = UdpSocket::bind((addr, 0)).unwrap();
    let (pa, pb) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let mut client = End::new(a, pb);
    let mut server = End::new(b, pa);
    client.acks = acks;
    server.acks = acks;
    client.gso = gso;
    server.gso = gso;
    let warm = 200;
    let echo = std::thread::spawn(move || {
        let mut m = [0u8; MSG];
        for _ in 0..iters + warm {
            server.recv(wait, &mut m);
            server.send(&m);
        }
    });
    let mut m = [9u8; MSG];
    let mut t = Vec::with_capacity(iters);
    for i in 0..iters + warm {
        let t0 = Instant::now();
        client.send(&m);
        client.recv(wait, &mut m);
        if i >= warm {
            t.push(t0.elapsed());
        }
    }
    echo.join().unwrap();
    p50(t)
}

/// `iters` blocking round trips of one plain 64-octet UDP datagram each way (no headers,
/// no ICRC): what kernel UDP alone costs; the p50 in µs.
fn udp(addr: Ipv4Addr, iters: usize) -> f64 {
    let a = UdpSocket::bind((addr, 0)).unwrap();
    let b = UdpSocket::bind((addr, 0)).unwrap();
    a.connect(b.local_addr().unwrap()).unwrap();
    b.connect(a.local_addr().unwrap()).unwrap();
    let warm = 200;
    let echo = std::thread::spawn(move || {
        let mut m = [0u8; MSG];
        for _ in 0..iters + warm {
            let n = b.recv(&mut m).unwrap();
            b.send(&m[..n]).unwrap();
        }
    });
    let mut m = [9u8; MSG];
    let mut t = Vec::with_capacity(iters);
    for i in 0..iters + warm {
        let t0 = Instant::now();
        a.send(&m).unwrap();
        a.recv(&mut m).unwrap();
        if i >= warm {
            t.push(t0.elapsed());
        }
    }
    echo.join().unwrap();
    p50(t)
}

/// `iters` blocking TCP round trips of 64 octets; the p50 in µs.
fn tcp(addr: Ipv4Addr, iters: usize) -> f64 {
    let l = TcpListener::bind((addr, 0)).unwrap();
    let at = l.local_addr().unwrap();
    let warm = 200;
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut m = [0u8; MSG];
        for _ in 0..iters + warm {
            s.read_exact(&mut m).unwrap();
            s.write_all(&m).unwrap();
        }
    });
    let mut s = TcpStream::connect(at).unwrap();
    s.set_nodelay(true).unwrap();
    let mut m = [9u8; MSG];
    let mut t = Vec::with_capacity(iters);
    for i in 0..iters + warm {
        let t0 = Instant::now();
        s.write_all(&m).unwrap();
        s.read_exact(&mut m).unwrap();
        if i >= warm {
            t.push(t0.elapsed());
        }
    }
    echo.join().unwrap();
    p50(t)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let iters: usize = args.next().map_or(10_000, |s| s.parse().expect("iters"));
    let rounds: usize = args.next().map_or(3, |s| s.parse().expect("rounds"));
    let addr: Ipv4Addr = args
        .next()
        .map_or(Ipv4Addr::new(127, 0, 97, 71), |s| s.parse().expect("addr"));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "smc_latency_bound: {iters} round trips of {MSG} B per mode, load {}",
        load.split_whitespace().next().unwrap_or("?")
    );
    let (mut r1, mut r2) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let t = tcp(addr, iters);
        let row = |name: &str, acks: Acks, gso: bool| {
            let b1 = bound(addr, Wait::Recvmmsg, acks, gso, iters);
            let b2 = bound(addr, Wait::PollRecvmmsg, acks, gso, iters);
            println!(
                "  {name:<34} blocking recvmmsg {b1:6.2} us ({:.3}x), poll+recvmmsg {b2:6.2} us ({:.3}x)",
                b1 / t,
                b2 / t
            );
            (b1 / t, b2 / t)
        };
        println!("round {r}: TCP p50 {t:.2} us");
        let f = row("ACK first, 3 datagrams", Acks::First, false);
        let l = row("ACK last, 3 datagrams", Acks::Last, false);
        let g = row("Write+CDC one GSO train, ACK last", Acks::Last, true);
        let ng = row("(no ACK) Write+CDC one GSO train", Acks::None, true);
        let u = udp(addr, iters);
        println!(
            "  (one plain 64 B UDP datagram)     blocking recv {u:6.2} us ({:.3}x)",
            u / t
        );
        let _ = ng;
        r1.push(f.0.min(l.0).min(g.0));
        r2.push(f.1.min(l.1).min(g.1));
    }
    println!(
        "bound / TCP p50 (the best SMC-R shape of each round), blocking recvmmsg: {r1:.3?}; poll+recvmmsg: {r2:.3?}"
    );
}
