//! The bound of issue 13's latency point (session 13): a busy-polling UDP ping-pong of 8
//! octets (what `softrdma bench send --lat --baseline udp` measures us against) next to the
//! same ping-pong doing exactly the work RoCEv2 cannot avoid on top of it, in one run:
//! each message is a 24-octet RoCEv2 packet (12-octet BTH, 8 octets, 4-octet ICRC); the
//! sender builds the BTH and computes the ICRC over the masked headers and the packet, the
//! receiver parses the BTH and checks the ICRC. Same system calls (one `send`, busy `recv`
//! on non-blocking sockets), one thread per end, nothing else: no queues, no locks, no
//! completions, no ACKs. The ratio of the two p50s is the best a user-space RoCEv2 over
//! kernel UDP sockets can do against that baseline on this machine.
//!
//! `cargo run -p roce --release --example udp_latency_bound [-- iters [rounds [addr]]]`
//! (defaults 20000, 3, 127.0.96.61); prints one line per mode and round, then the ratios.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use roce::wire::{Bth, Opcode, Psn, icrc};

const PING: usize = 8;
const PKT: usize = Bth::LEN + PING + 4;

/// What one end does to a message before it sends and after it receives.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Plain 8-octet datagrams.
    Udp,
    /// 24-octet RoCEv2 packets: BTH built and parsed, ICRC computed and checked.
    Roce,
}

/// The IPv4 header the ICRC covers (masked fields are set to 1s by `icrc`; ID 0, as the
/// engine sends on an unconnected socket).
fn ip_header(src: std::net::Ipv4Addr, dst: std::net::Ipv4Addr, udp_len: usize) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    h
}

struct End {
    sock: UdpSocket,
    peer: SocketAddr,
    ip_out: [u8; 20],
    udp_out: [u8; 8],
    ip_in: [u8; 20],
    udp_in: [u8; 8],
    psn: Psn,
}

impl End {
    fn new(sock: UdpSocket, peer: SocketAddr) -> End {
        let (me, v4) = match (sock.local_addr().unwrap(), peer) {
            (SocketAddr::V4(a), SocketAddr::V4(b)) => (a, b),
            _ => panic!("IPv4 only"),
        };
        sock.set_nonblocking(true).unwrap();
        End {
            ip_out: ip_header(*me.ip(), *v4.ip(), 8 + PKT),
            udp_out: icrc::udp_header(me.port(), v4.port(), PKT),
            ip_in: ip_header(*v4.ip(), *me.ip(), 8 + PKT),
            udp_in: icrc::udp_header(v4.port(), me.port(), PKT),
            sock,
            peer,
            psn: Psn::new(0),
        }
    }

    fn send(&mut self, mode: Mode, buf: &mut [u8; PKT]) {
        let n = match mode {
            Mode::Udp => PING,
            Mode::Roce => {
                let mut bth = Bth::new(Opcode::RC_SEND_ONLY, 0x12, self.psn);
                bth.ack_req = true;
                bth.emit(&mut buf[..Bth::LEN]).unwrap();
                let crc = icrc::compute(&self.ip_out, &self.udp_out, &buf[..]).unwrap();
                buf[PKT - 4..].copy_from_slice(&crc.to_le_bytes());
                self.psn = self.psn.add(1);
                PKT
            }
        };
        self.sock.send_to(&buf[..n], self.peer).unwrap();
    }

    /// Busy-polls for one message (a clock read per empty poll for the deadline, as the
    /// bench's UDP baseline does); `false` on timeout.
    fn recv(&self, mode: Mode, buf: &mut [u8; 64]) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.sock.recv(buf) {
                Ok(n) => {
                    if mode == Mode::Roce {
                        let (bth, _) = Bth::parse(&buf[..n]).unwrap();
                        assert_eq!(bth.opcode, Opcode::RC_SEND_ONLY);
                        icrc::verify(&self.ip_in, &self.udp_in, &buf[..n]).unwrap();
                    }
                    return true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::hint::spin_loop();
        }
    }
}

/// `iters` round trips; the p50 in µs.
fn ping_pong(addr: std::net::Ipv4Addr, mode: Mode, iters: usize) -> f64 {
    let a = UdpSocket::bind((addr, 0)).unwrap();
    let b = UdpSocket::bind((addr, 0)).unwrap();
    let (pa, pb) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let mut client = End::new(a, pb);
    let mut server = End::new(b, pa);
    let echo = std::thread::spawn(move || {
        let mut rx = [0u8; 64];
        let mut tx = [7u8; PKT];
        for _ in 0..iters {
            if !server.recv(mode, &mut rx) {
                return;
            }
            server.send(mode, &mut tx);
        }
    });
    let mut rx = [0u8; 64];
    let mut tx = [9u8; PKT];
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        client.send(mode, &mut tx);
        assert!(client.recv(mode, &mut rx), "echo lost");
        t.push(t0.elapsed());
    }
    echo.join().unwrap();
    t.sort();
    t[t.len() / 2].as_secs_f64() * 1e6
}

fn main() {
    let mut args = std::env::args().skip(1);
    let iters: usize = args.next().map_or(20_000, |s| s.parse().expect("iters"));
    let rounds: usize = args.next().map_or(3, |s| s.parse().expect("rounds"));
    let addr: std::net::Ipv4Addr = args
        .next()
        .map_or("127.0.96.61".parse().unwrap(), |s| s.parse().expect("addr"));
    let mut ratios = Vec::new();
    for r in 0..rounds {
        let udp = ping_pong(addr, Mode::Udp, iters);
        let roce = ping_pong(addr, Mode::Roce, iters);
        println!(
            "round {r}: UDP 8 B p50 {udp:.2} us, UDP + BTH + ICRC (24 B) p50 {roce:.2} us, ratio {:.3}",
            roce / udp
        );
        ratios.push(roce / udp);
    }
    println!("bound ratios (p50 UDP+BTH+ICRC / p50 UDP): {ratios:.3?}");
}
