//! The plain-TCP baseline: the server the client's `--baseline tcp` runs against (bounded:
//! at most 256 connections, read/write timeouts, a size cap) and the client side that measures it.

use super::*;
// Page-aligned buffers, as RDMA regions and iperf3's are (the old baseline's reader
// started 16 octets into a page and paid 2.5-3x per octet for the kernel's receive copy
// on an AMD EPYC: docs/performance.md, session 16). The type's test is in rpcrdma.
use rpcrdma::tcp::PageBuf;

pub(super) const TCP_STREAM_IN: u8 = 1; // client -> server
pub(super) const TCP_STREAM_OUT: u8 = 2; // server -> client
pub(super) const TCP_RPC: u8 = 3; // request/response, blocking reads on both ends
pub(super) const TCP_RPC_BUSY: u8 = 4; // request/response, both ends busy-poll non-blocking sockets

/// A bulk baseline's sink reads whatever the stream holds, up to this much per `read`: TCP is
/// a byte stream, so message boundaries are the sender's business, and a bulk receiver reads big.
pub(super) const SINK_READ: usize = 1 << 20;

/// What `--baseline tcp` does for bandwidth (Write and Send: client -> server), in the
/// table's header and the JSON's `baseline.method`.
pub(super) const METHOD_STREAM_IN: &str = "one TCP connection per QP (TCP_NODELAY, kernel-autotuned buffers); \
the client write()s each SIZE-byte message from a page-aligned buffer, blocking; the server read()s up to 1 MiB \
at a time into a page-aligned buffer and answers with the count of bytes it got, which must be messages x SIZE; \
the clock runs from a barrier after connecting to the last count";
/// The same for Read (server -> client).
pub(super) const METHOD_STREAM_OUT: &str = "one TCP connection per QP (TCP_NODELAY, kernel-autotuned buffers); \
the server write()s each SIZE-byte message from a page-aligned buffer, blocking; the client read()s up to 1 MiB \
at a time into a page-aligned buffer until it has messages x SIZE bytes";
/// Atomics: 8-byte requests and responses, up to --depth requests ahead.
pub(super) const METHOD_ATOMIC: &str = "one TCP connection per QP; 8-byte requests written in bursts of \
--depth, 8-byte responses read by a second thread";
/// Latency: a ping-pong of one message at a time.
pub(super) const METHOD_PING_PONG: &str = "one TCP connection (TCP_NODELAY); a ping-pong of one request \
and one response of the test's sizes at a time";

/// How a baseline's ends wait for data: the latency baseline polls like the RDMA side it is
/// compared with (busy-polling unless `--events`), as `sockperf ping-pong --tcp --nonblocked`
/// does; bandwidth baselines block in `read`/`write`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Polling {
    /// Non-blocking sockets, `recv` retried until data is there.
    Busy,
    /// Blocking `read`/`write`: the thread sleeps until the kernel wakes it.
    Blocking,
}

impl Polling {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Polling::Busy => "busy-poll",
            Polling::Blocking => "blocking",
        }
    }
}

/// After this long without data a busy-polling end sleeps in a blocking read instead, so a
/// silent peer costs no CPU (the RDMA latency servers do the same).
pub(super) const SPIN_BEFORE_SLEEP: Duration = Duration::from_millis(100);

/// `read_exact` on a non-blocking socket by spinning on `recv`; after [`SPIN_BEFORE_SLEEP`]
/// without a byte it blocks (bounded by `timeout`, `None`: forever) until data comes.
fn spin_read_exact(s: &mut TcpStream, buf: &mut [u8], timeout: Option<Duration>) -> std::io::Result<()> {
    use std::io::ErrorKind;
    let mut off = 0;
    let mut idle_since: Option<Instant> = None;
    while off < buf.len() {
        match s.read(&mut buf[off..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                off += n;
                idle_since = None;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() < SPIN_BEFORE_SLEEP {
                    std::hint::spin_loop();
                    continue;
                }
                // Sleep in a blocking read for the rest of the timeout, then spin again.
                let left = timeout.map(|t| t.saturating_sub(since.elapsed()));
                if left == Some(Duration::ZERO) {
                    return Err(ErrorKind::TimedOut.into());
                }
                s.set_nonblocking(false)?;
                s.set_read_timeout(left)?;
                let r = s.read(&mut buf[off..]);
                s.set_nonblocking(true)?;
                match r {
                    Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                    Ok(n) => {
                        off += n;
                        idle_since = None;
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        return Err(ErrorKind::TimedOut.into());
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `write_all` on a non-blocking socket, spinning while the send buffer is full (a latency
/// test's single small message never fills it; bounded by `timeout` all the same).
fn spin_write_all(s: &mut TcpStream, mut buf: &[u8], timeout: Option<Duration>) -> std::io::Result<()> {
    use std::io::ErrorKind;
    let mut full_since: Option<Instant> = None;
    while !buf.is_empty() {
        match s.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                full_since = None;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let since = *full_since.get_or_insert_with(Instant::now);
                if timeout.is_some_and(|t| since.elapsed() >= t) {
                    return Err(ErrorKind::TimedOut.into());
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The server's TCP baseline listener: its port and how many baseline connections it has finished.
#[derive(Clone)]
pub(super) struct TcpServer {
    pub(super) port: u16,
    done: Arc<(Mutex<u64>, Condvar)>,
    /// The UDP echo on the same port number, if it could bind.
    pub(super) udp: Option<super::udp::UdpEcho>,
}

impl TcpServer {
    /// Waits (a minute at most) until `n` baseline connections have finished.
    pub(super) fn wait_done(&self, n: u64) {
        let (m, cv) = &*self.done;
        let _ = cv.wait_timeout_while(m.lock().unwrap(), Duration::from_secs(60), |d| *d < n);
    }
}

/// Most baseline connections served at once (one thread each; a client opens one per QP).
pub(super) const MAX_TCP_CONNS: usize = 256;

/// The baseline listener under the server's [`Limits`]: at most [`MAX_TCP_CONNS`]
/// connections (more are closed at once, with a message), read and write timeouts of
/// `--idle-timeout`, message sizes up to `--max-session-mem`, and a pause instead of a
/// spin when accept fails (EMFILE, ENFILE).
pub(super) fn spawn_tcp_server(l: TcpListener, limits: Limits) -> Result<TcpServer> {
    let srv = TcpServer {
        port: l.local_addr()?.port(),
        done: Arc::new((Mutex::new(0), Condvar::new())),
        udp: None,
    };
    let done = srv.done.clone();
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new().name("bench-tcp".into()).spawn(move || {
        for s in l.incoming() {
            let s = match s {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("bench server: baseline accept failed: {e}; pausing 100 ms");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if open.load(Ordering::Acquire) >= MAX_TCP_CONNS {
                eprintln!(
                    "bench server: refusing baseline connection from {}: {MAX_TCP_CONNS} open",
                    s.peer_addr().map_or("?".into(), |a| a.to_string())
                );
                continue;
            }
            open.fetch_add(1, Ordering::AcqRel);
            let (done, open) = (done.clone(), open.clone());
            let spawned = std::thread::Builder::new()
                .name("bench-tcp-conn".into())
                .spawn(move || {
                    let peer = s.peer_addr().ok();
                    if let Err(e) = tcp_serve_conn(s, limits) {
                        eprintln!("bench server: baseline connection {peer:?}: {e:#}");
                    }
                    open.fetch_sub(1, Ordering::AcqRel);
                    *done.0.lock().unwrap() += 1;
                    done.1.notify_all();
                });
            if spawned.is_err() {
                eprintln!("bench server: no thread for a baseline connection");
            }
        }
    })?;
    Ok(srv)
}

/// Header: mode u8, 3 pad, req u32, resp u32, 4 pad, count u64.
pub(super) fn tcp_serve_conn(mut s: TcpStream, limits: Limits) -> Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(limits.idle)?;
    s.set_write_timeout(limits.idle)?;
    let mut h = [0u8; 24];
    s.read_exact(&mut h)?;
    let req = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
    let resp = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
    if req.max(resp) as u64 > limits.max_mem {
        bail!("message of {} bytes exceeds --max-session-mem", req.max(resp));
    }
    let count = u64::from_le_bytes(h[16..24].try_into().unwrap());
    match h[0] {
        TCP_STREAM_IN => {
            let got = read_and_drop(&mut s, count.saturating_mul(req as u64))?;
            s.write_all(&got.to_le_bytes())?;
        }
        TCP_STREAM_OUT => {
            let buf = PageBuf::new(req, 0x5a);
            for _ in 0..count {
                s.write_all(buf.bytes())?;
            }
        }
        TCP_RPC => {
            let (mut a, b) = (vec![0u8; req], vec![0u8; resp]);
            for _ in 0..count {
                s.read_exact(&mut a)?;
                s.write_all(&b)?;
            }
        }
        TCP_RPC_BUSY => {
            s.set_nonblocking(true)?;
            let (mut a, b) = (vec![0u8; req], vec![0u8; resp]);
            for _ in 0..count {
                spin_read_exact(&mut s, &mut a, limits.idle)?;
                spin_write_all(&mut s, &b, limits.idle)?;
            }
        }
        m => bail!("unknown baseline mode {m}"),
    }
    Ok(())
}

pub(super) fn tcp_open(addr: SocketAddr, mode: u8, req: u32, resp: u32, count: u64) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("baseline TCP connection to {addr}"))?;
    s.set_nodelay(true)?;
    let mut h = [0u8; 24];
    h[0] = mode;
    h[4..8].copy_from_slice(&req.to_le_bytes());
    h[8..12].copy_from_slice(&resp.to_le_bytes());
    h[16..24].copy_from_slice(&count.to_le_bytes());
    s.write_all(&h)?;
    Ok(s)
}

/// The same traffic over plain TCP: same size, same message count per connection, same number of connections.
pub(super) fn run_baseline(target: SocketAddr, r: &Outcome, conns: usize) -> Result<Baseline> {
    let cpu0 = cpu_secs();
    let mut b = run_baseline_inner(target, r, conns)?;
    b.cpu_s = cpu0.and_then(|c0| Some(cpu_secs()? - c0));
    Ok(b)
}

pub(super) fn run_baseline_inner(target: SocketAddr, r: &Outcome, conns: usize) -> Result<Baseline> {
    if r.tcp_port == 0 {
        bail!("the server offers no TCP baseline");
    }
    let addr = SocketAddr::new(target.ip(), r.tcp_port);
    let count = r.iters().max(1);
    let size = r.size as u32;
    if r.lat {
        let (req, resp) = match r.op {
            Op::Write | Op::Send => (size, size),
            Op::Read => (16, size), // a Read Request carries about 16 bytes of addressing
            Op::Atomic => (8, 8),
        };
        let polling = if r.events { Polling::Blocking } else { Polling::Busy };
        let mode = match polling {
            Polling::Busy => TCP_RPC_BUSY,
            Polling::Blocking => TCP_RPC,
        };
        let mut s = tcp_open(addr, mode, req, resp, count + 100)?;
        let (a, mut b) = (vec![0u8; req as usize], vec![0u8; resp as usize]);
        let mut hist = new_hist();
        // A server that stops answering fails the baseline instead of hanging it.
        let timeout = Some(Duration::from_secs(60));
        s.set_read_timeout(timeout)?;
        s.set_write_timeout(timeout)?;
        if polling == Polling::Busy {
            s.set_nonblocking(true)?;
        }
        for i in 0..count + 100 {
            let t0 = Instant::now();
            match polling {
                Polling::Busy => {
                    spin_write_all(&mut s, &a, timeout)?;
                    spin_read_exact(&mut s, &mut b, timeout)?;
                }
                Polling::Blocking => {
                    s.write_all(&a)?;
                    s.read_exact(&mut b)?;
                }
            }
            if i >= 100 {
                hist.record(t0.elapsed().as_nanos().max(1) as u64)?;
            }
        }
        let secs = hist.mean() * hist.len() as f64 / 1e9;
        return Ok(Baseline {
            kind: "tcp",
            gbit: count as f64 * size as f64 * 8.0 / secs / 1e9,
            hist: Some(hist),
            cpu_s: None,
            polling,
            bytes: (count + 100) * (req as u64 + resp as u64),
            method: METHOD_PING_PONG,
        });
    }
    let barrier = Arc::new(Barrier::new(conns + 1));
    let failed = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    let want = count * size as u64;
    for _ in 0..conns {
        let (barrier, failed) = (barrier.clone(), failed.clone());
        let op = r.op;
        let depth = r.depth as u64;
        hs.push(std::thread::spawn(move || -> Result<u64> {
            let res = (|| -> Result<u64> {
                match op {
                    Op::Write | Op::Send => {
                        let mut s = tcp_open(addr, TCP_STREAM_IN, size, 0, count)?;
                        let buf = PageBuf::new(size as usize, 0xa5);
                        barrier.wait();
                        for _ in 0..count {
                            s.write_all(buf.bytes())?;
                        }
                        let mut got = [0u8; 8];
                        s.read_exact(&mut got)?;
                        let got = u64::from_le_bytes(got);
                        if got != want {
                            bail!("the baseline server got {got} bytes of {want}");
                        }
                        Ok(got)
                    }
                    Op::Read => {
                        barrier.wait();
                        let mut s = tcp_open(addr, TCP_STREAM_OUT, size, 0, count)?;
                        read_and_drop(&mut s, want)
                    }
                    Op::Atomic => {
                        let mut s = tcp_open(addr, TCP_RPC, 8, 8, count)?;
                        barrier.wait();
                        let mut rd = s.try_clone()?;
                        let depth = depth.min(count);
                        let reader = std::thread::spawn(move || -> std::io::Result<()> {
                            let mut b = [0u8; 8];
                            for _ in 0..count {
                                rd.read_exact(&mut b)?;
                            }
                            Ok(())
                        });
                        // The reader drains responses; keep at most `depth` requests ahead by
                        // writing in bursts (TCP's own window bounds the rest).
                        let burst = vec![0u8; 8 * depth as usize];
                        let mut left = count;
                        while left > 0 {
                            let n = left.min(depth);
                            s.write_all(&burst[..8 * n as usize])?;
                            left -= n;
                        }
                        reader.join().map_err(|_| anyhow!("reader panicked"))??;
                        Ok(16 * count)
                    }
                }
            })();
            if res.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            res
        }));
    }
    barrier.wait();
    let start = Instant::now();
    let mut bytes = 0;
    for h in hs {
        bytes += h.join().map_err(|_| anyhow!("baseline thread panicked"))??;
    }
    let secs = start.elapsed().as_secs_f64();
    let total = count * conns as u64;
    Ok(Baseline {
        kind: "tcp",
        gbit: total as f64 * size as f64 * 8.0 / secs / 1e9,
        hist: None,
        cpu_s: None,
        polling: Polling::Blocking,
        bytes,
        method: match r.op {
            Op::Write | Op::Send => METHOD_STREAM_IN,
            Op::Read => METHOD_STREAM_OUT,
            Op::Atomic => METHOD_ATOMIC,
        },
    })
}

/// Reads `total` bytes of a baseline stream into a page-aligned buffer, up to
/// [`SINK_READ`] bytes per `read`, dropping them; returns how many it read (`total`).
fn read_and_drop(s: &mut impl Read, total: u64) -> Result<u64> {
    let mut buf = PageBuf::new(SINK_READ.min(total.max(1) as usize), 0);
    let buf = buf.bytes_mut();
    let mut left = total;
    while left > 0 {
        let n = (buf.len() as u64).min(left) as usize;
        let got = s.read(&mut buf[..n])?;
        if got == 0 {
            bail!("baseline stream cut short after {} of {total} bytes", total - left);
        }
        left -= got as u64;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(op: Op, size: u64, qps: u16, messages: u64, port: u16) -> Outcome {
        Outcome {
            op,
            size,
            qps,
            depth: 16,
            lat: false,
            events: false,
            crc: false,
            detail: String::new(),
            messages,
            secs: 1.0,
            peak_gbit: 0.0,
            hist: None,
            baseline: None,
            tcp_port: port,
            cpu_s: None,
        }
    }

    fn server() -> TcpServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let limits = Limits {
            idle: Some(Duration::from_secs(60)),
            max_test: None,
            max_mem: 64 << 20,
            report: None,
        };
        spawn_tcp_server(l, limits).unwrap()
    }

    /// Issue 13's yardstick: the bandwidth baseline moves the RDMA test's bytes (messages x
    /// size, over every connection), the server confirms the count it read, and the result
    /// says what ran. Write and Send stream client -> server, Read server -> client.
    #[test]
    fn bandwidth_baseline_moves_the_same_bytes_and_says_how() {
        let srv = server();
        let target: SocketAddr = "127.0.0.1:1".parse().unwrap();
        for (op, size, qps, iters, method) in [
            (Op::Write, 1 << 20, 1, 24, METHOD_STREAM_IN),
            (Op::Send, 1000, 3, 500, METHOD_STREAM_IN),
            (Op::Read, 65536, 2, 40, METHOD_STREAM_OUT),
            (Op::Atomic, 8, 1, 100, METHOD_ATOMIC),
        ] {
            let r = outcome(op, size, qps, iters * qps as u64, srv.port);
            let b = run_baseline(target, &r, qps as usize).unwrap();
            let want = if op == Op::Atomic {
                16 * iters
            } else {
                iters * size * qps as u64
            };
            assert_eq!(b.bytes, want, "{op:?}");
            assert_eq!(b.method, method);
            assert_eq!((b.kind, b.polling), ("tcp", Polling::Blocking));
            assert!(b.hist.is_none() && b.gbit > 0.0);
        }
        assert!(METHOD_STREAM_IN.contains("page-aligned") && METHOD_STREAM_IN.contains("1 MiB"));
    }

    /// A sender that stops early fails the baseline instead of reporting a rate for bytes
    /// that never arrived: the server's count is checked.
    #[test]
    fn short_stream_is_an_error() {
        let srv = server();
        let addr: SocketAddr = ([127, 0, 0, 1], srv.port).into();
        let mut s = tcp_open(addr, TCP_STREAM_IN, 4096, 0, 10).unwrap();
        s.write_all(&[0u8; 4096 * 3]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        // The server reads 3 of 10 messages, hits the end of the stream and closes without a count.
        s.read_to_end(&mut got).unwrap();
        assert!(got.is_empty(), "no count for a short stream: {got:?}");
        let mut cut = &[0u8; 100][..];
        let e = read_and_drop(&mut cut, 200).unwrap_err();
        assert!(e.to_string().contains("100 of 200"), "{e}");
    }
}
