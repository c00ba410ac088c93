//! The UDP latency baseline (`--lat --baseline udp`): a ping-pong of datagrams of the test's
//! size, both ends busy-polling non-blocking sockets (sleeping with `--events`), the fair
//! yardstick for RoCEv2, whose packets are UDP datagrams too (issue 13: "8 B Send latency p50
//! within 1.3× of a busy-polling UDP ping-pong of the same size"), as the TCP ping-pong is
//! for iWARP.
//!
//! The server side is an echo on the bench server's address, on the port number of its TCP
//! baseline listener (TCP and UDP ports are separate spaces, so the `Reply` needs no new
//! field): every datagram goes back to its sender unchanged, so a spoofed source gets
//! nothing larger than what was sent; an empty datagram ends a baseline run (the server of
//! a `--listen` session waits for it before it exits, as it waits for the TCP baseline's
//! connections to close). One thread, one 64 KiB buffer; it spins for
//! [`SPIN_BEFORE_SLEEP`] after each datagram and then sleeps in a blocking receive, so an
//! idle server costs no CPU.

use super::*;
use std::io::ErrorKind;
use std::net::UdpSocket;

/// The largest UDP payload over IPv4 (65535 - 20 - 8).
pub(super) const MAX_DATAGRAM: u64 = 65507;

/// The server's UDP echo: how many baseline runs have ended (empty datagrams received).
#[derive(Clone)]
pub(super) struct UdpEcho {
    done: Arc<(Mutex<u64>, Condvar)>,
}

impl UdpEcho {
    /// Waits (a minute at most) until `n` baseline runs have ended.
    pub(super) fn wait_done(&self, n: u64) {
        let (m, cv) = &*self.done;
        let _ = cv.wait_timeout_while(m.lock().unwrap(), Duration::from_secs(60), |d| *d < n);
    }
}

/// Binds the echo on `addr` and serves it on its own thread for the life of the process.
pub(super) fn spawn_udp_echo(addr: SocketAddr) -> Result<UdpEcho> {
    let s = UdpSocket::bind(addr).with_context(|| format!("UDP baseline echo on {addr}"))?;
    let e = UdpEcho {
        done: Arc::new((Mutex::new(0), Condvar::new())),
    };
    let done = e.done.clone();
    std::thread::Builder::new().name("bench-udp".into()).spawn(move || {
        if let Err(e) = echo(&s, &done) {
            eprintln!("bench server: UDP baseline echo stopped: {e}");
        }
    })?;
    Ok(e)
}

/// Answers one datagram: an echo, or for an empty one the end of a baseline run.
fn answer(s: &UdpSocket, msg: &[u8], from: SocketAddr, done: &(Mutex<u64>, Condvar)) {
    if msg.is_empty() {
        *done.0.lock().unwrap() += 1;
        done.1.notify_all();
        return;
    }
    // A full send buffer or an unreachable sender loses this echo; the client resends
    // after its timeout.
    let _ = s.send_to(msg, from);
}

fn echo(s: &UdpSocket, done: &(Mutex<u64>, Condvar)) -> std::io::Result<()> {
    let mut buf = vec![0u8; MAX_DATAGRAM as usize + 1];
    s.set_nonblocking(true)?;
    let mut idle_since: Option<Instant> = None;
    loop {
        match s.recv_from(&mut buf) {
            Ok((n, from)) => {
                idle_since = None;
                answer(s, &buf[..n], from, done);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() < SPIN_BEFORE_SLEEP {
                    std::hint::spin_loop();
                    continue;
                }
                s.set_nonblocking(false)?;
                let r = s.recv_from(&mut buf);
                s.set_nonblocking(true)?;
                if let Ok((n, from)) = r {
                    idle_since = None;
                    answer(s, &buf[..n], from, done);
                }
            }
            // ICMP port unreachable from an earlier sender, EINTR: keep serving.
            Err(_) => {}
        }
    }
}

/// Waits for a datagram on `s` until `deadline`: spinning on a non-blocking socket for
/// [`SPIN_BEFORE_SLEEP`] when `busy`, then (or at once when not) in blocking receives.
/// `None` when the deadline passes.
fn recv_until(s: &UdpSocket, buf: &mut [u8], deadline: Instant, busy: bool) -> std::io::Result<Option<usize>> {
    let spin_end = Instant::now() + SPIN_BEFORE_SLEEP;
    if busy {
        s.set_nonblocking(true)?;
        loop {
            match s.recv(buf) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if now >= spin_end {
                break;
            }
            std::hint::spin_loop();
        }
    }
    s.set_nonblocking(false)?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        s.set_read_timeout(Some(left))?;
        match s.recv(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

/// How long a ping waits for its echo before it is sent again (not measured).
const RESEND_AFTER: Duration = Duration::from_secs(1);
/// Lost pings the baseline tolerates before it gives up.
const MAX_LOST: u64 = 10;

/// The ping-pong of `r`'s size and iteration count against the server's UDP echo.
pub(super) fn run_udp_baseline(target: SocketAddr, r: &Outcome) -> Result<Baseline> {
    let cpu0 = cpu_secs();
    let mut b = ping_pong(target, r)?;
    b.cpu_s = cpu0.and_then(|c0| Some(cpu_secs()? - c0));
    Ok(b)
}

fn ping_pong(target: SocketAddr, r: &Outcome) -> Result<Baseline> {
    if !r.lat {
        bail!("--baseline udp measures latency only (add --lat)");
    }
    if r.tcp_port == 0 {
        bail!("the server offers no baseline port");
    }
    // An echo returns what it got: a Read's (16-byte request, SIZE reply) and an atomic's
    // (8, 8) round trips become SIZE both ways, which only makes the baseline slower.
    let size = r.size.max(1);
    if size > MAX_DATAGRAM {
        bail!("--baseline udp: {size} bytes do not fit in one UDP datagram (at most {MAX_DATAGRAM})");
    }
    let addr = SocketAddr::new(target.ip(), r.tcp_port);
    let any: SocketAddr = if addr.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any)?;
    s.connect(addr).with_context(|| format!("UDP baseline to {addr}"))?;
    let busy = !r.events;
    let polling = if busy {
        tcp::Polling::Busy
    } else {
        tcp::Polling::Blocking
    };
    let mut out = vec![0xa5u8; size as usize];
    let mut back = vec![0u8; size as usize + 1];
    // One echo first, so that a server without the echo is an error, not a hang.
    let mut answered = false;
    for _ in 0..3 {
        s.send(&out)?;
        match recv_until(&s, &mut back, Instant::now() + Duration::from_millis(700), false) {
            Ok(Some(n)) if n as u64 == size => {
                answered = true;
                break;
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => break,
            Err(e) => return Err(e.into()),
        }
    }
    if !answered {
        bail!("the server at {addr} answers no UDP baseline pings (an older softrdma, or UDP filtered?)");
    }
    // Let any late duplicate of the probe's echo arrive and go.
    while recv_until(&s, &mut back, Instant::now() + Duration::from_millis(5), false)?.is_some() {}
    let count = r.iters().max(1);
    let mut hist = new_hist();
    let mut lost = 0u64;
    for i in 0..count + 100 {
        // A sequence number in the first 8 bytes (when there are 8) tells a late echo of an
        // earlier ping from this one's.
        let seq = i.to_le_bytes();
        let tag = out.len().min(8);
        out[..tag].copy_from_slice(&seq[..tag]);
        let t0 = Instant::now();
        s.send(&out)?;
        loop {
            match recv_until(&s, &mut back, Instant::now() + RESEND_AFTER, busy)? {
                Some(n) if n == out.len() && back[..tag] == out[..tag] => break,
                Some(_) => continue,
                None => {
                    lost += 1;
                    if lost > MAX_LOST {
                        bail!("UDP baseline: {lost} pings to {addr} got no echo");
                    }
                    s.send(&out)?;
                }
            }
        }
        if i >= 100 {
            hist.record(t0.elapsed().as_nanos().max(1) as u64)?;
        }
    }
    // The end of this run, for a server that waits for it before it exits.
    let _ = s.send(&[]);
    if lost > 0 {
        tracing::warn!(
            lost,
            "UDP baseline: pings resent after {RESEND_AFTER:?} without echo (their times include the wait)"
        );
    }
    let secs = hist.mean() * hist.len() as f64 / 1e9;
    Ok(Baseline {
        kind: "udp",
        gbit: count as f64 * size as f64 * 8.0 / secs / 1e9,
        hist: Some(hist),
        cpu_s: None,
        polling,
        bytes: 2 * (count + 100) * size,
        method: "one connected UDP socket; a ping-pong of SIZE-byte datagrams, one in flight, against an echo",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_returns_each_datagram_to_its_sender() {
        // A unique loopback address (tests of other crates use others).
        let probe = UdpSocket::bind("127.0.77.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let e = spawn_udp_echo(addr).unwrap();
        let c = UdpSocket::bind("127.0.77.1:0").unwrap();
        c.connect(addr).unwrap();
        for len in [1usize, 8, 1500, 65507] {
            let msg: Vec<u8> = (0..len).map(|i| i as u8).collect();
            c.send(&msg).unwrap();
            let mut b = vec![0u8; 70000];
            let n = recv_until(&c, &mut b, Instant::now() + Duration::from_secs(5), true)
                .unwrap()
                .expect("an echo");
            assert_eq!(&b[..n], &msg[..], "len {len}");
        }
        // An empty datagram is not echoed: it counts the end of a run.
        c.send(&[]).unwrap();
        e.wait_done(1);
        assert_eq!(*e.done.0.lock().unwrap(), 1);
    }
}
