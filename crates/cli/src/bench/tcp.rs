//! The plain-TCP baseline: the server the client's `--baseline tcp` runs against (bounded:
//! at most 256 connections, read/write timeouts, a size cap) and the client side that measures it.

use super::*;

pub(super) const TCP_STREAM_IN: u8 = 1; // client -> server
pub(super) const TCP_STREAM_OUT: u8 = 2; // server -> client
pub(super) const TCP_RPC: u8 = 3; // request/response, blocking reads on both ends
pub(super) const TCP_RPC_BUSY: u8 = 4; // request/response, both ends busy-poll non-blocking sockets

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
            read_and_drop(&mut s, count * req as u64, req)?;
            s.write_all(&[1])?;
        }
        TCP_STREAM_OUT => {
            let buf = vec![0x5au8; req];
            for _ in 0..count {
                s.write_all(&buf)?;
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
        });
    }
    let barrier = Arc::new(Barrier::new(conns + 1));
    let failed = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for _ in 0..conns {
        let (barrier, failed) = (barrier.clone(), failed.clone());
        let op = r.op;
        let depth = r.depth as u64;
        hs.push(std::thread::spawn(move || -> Result<()> {
            let res = (|| -> Result<()> {
                match op {
                    Op::Write | Op::Send => {
                        let mut s = tcp_open(addr, TCP_STREAM_IN, size, 0, count)?;
                        let buf = vec![0xa5u8; size as usize];
                        barrier.wait();
                        for _ in 0..count {
                            s.write_all(&buf)?;
                        }
                        let mut ack = [0u8];
                        s.read_exact(&mut ack)?;
                    }
                    Op::Read => {
                        barrier.wait();
                        let mut s = tcp_open(addr, TCP_STREAM_OUT, size, 0, count)?;
                        read_and_drop(&mut s, count * size as u64, size as usize)?;
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
                    }
                }
                Ok(())
            })();
            if res.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            res
        }));
    }
    barrier.wait();
    let start = Instant::now();
    for h in hs {
        h.join().map_err(|_| anyhow!("baseline thread panicked"))??;
    }
    let secs = start.elapsed().as_secs_f64();
    let total = count * conns as u64;
    Ok(Baseline {
        kind: "tcp",
        gbit: total as f64 * size as f64 * 8.0 / secs / 1e9,
        hist: None,
        cpu_s: None,
        polling: Polling::Blocking,
    })
}

/// Reads `total` bytes of a baseline stream in reads of up to `msg` bytes (1 MiB at most),
/// dropping them.
fn read_and_drop(s: &mut impl Read, total: u64, msg: usize) -> Result<()> {
    let mut buf = vec![0u8; msg.min(1 << 20)];
    let mut left = total;
    while left > 0 {
        let n = (buf.len() as u64).min(left) as usize;
        let got = s.read(&mut buf[..n])?;
        if got == 0 {
            bail!("baseline stream cut short");
        }
        left -= got as u64;
    }
    Ok(())
}
