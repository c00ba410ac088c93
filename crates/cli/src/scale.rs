//! `softrdma scale`: what many connected queue pairs cost on one device, next to as many plain
//! TCP connections in the same run (issue 18, "Scale").
//!
//! Both ends live in this process on loopback, so every connection counts two endpoints (two
//! QPs, or two sockets) in the figures. For each kind, in turn:
//! 1. **setup**: the server side accepts on one thread while this thread connects N times one
//!    after the other (`rdma_connect` / `connect(2)`), so the rate is connections completed
//!    per second of that loop, handshake included;
//! 2. **cost**: the growth of resident memory (RSS), open descriptors and threads over the N
//!    connections, per connection; for TCP also the kernel's TCP socket memory
//!    (`/proc/net/sockstat`, system-wide) — iWARP QPs sit on TCP sockets, so that memory is
//!    in both columns;
//! 3. **idle**: CPU seconds the process uses over `--idle-secs` with every connection open and
//!    nothing to do (the goal is zero: no thread per connection, nobody spinning);
//! 4. **fairness**: `--active` of the connections move data at once for `--duration` (one
//!    thread each: RDMA Writes of `--size`, 16 outstanding per QP, or `write(2)` of `--size`
//!    with a reader per connection), and Jain's index of their throughputs says how evenly the
//!    provider shared the machine: (Σx)² / (n·Σx²), 1 when all are equal, 1/n when one
//!    connection took everything.

use crate::procstat;
use anyhow::{Context, Result, anyhow, bail};
use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use verbs::*;

/// Connections at most (each is two endpoints and, on iWARP, two TCP sockets in this process).
const MAX_CONNS: u32 = 4096;
/// Outstanding RDMA Writes per active QP in the fairness test.
const DEPTH: usize = 16;
/// The longest any single connection setup or completion may take.
const T: Duration = Duration::from_secs(30);

/// Measure the cost of many connections: setup rate, memory, descriptors, idle CPU and
/// bandwidth fairness, RDMA queue pairs next to TCP connections in the same run.
#[derive(clap::Args)]
#[command(after_help = "\
Example (the issue-18 figures):
  softrdma scale --qps 1000 --active 8
Both ends run in this process on loopback; each connection is counted once with its two
endpoints. Raise `ulimit -n` for large --qps: every iWARP connection holds two TCP sockets,
and the TCP comparison two more (the command raises the soft limit to the hard one).")]
pub struct Args {
    /// Connections to open of each kind (RDMA QP pairs, then TCP socket pairs), 1 to 4096.
    #[arg(short = 'q', long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=MAX_CONNS as i64))]
    qps: u32,
    /// How many of them move data at once in the fairness test (2 to 64, at most --qps).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=64))]
    active: u32,
    /// Seconds to watch the open, idle connections' CPU use.
    #[arg(long, default_value_t = 10.0, value_parser = positive_secs)]
    idle_secs: f64,
    /// Seconds the active connections move data.
    #[arg(short = 'D', long, default_value_t = 3.0, value_parser = positive_secs)]
    duration: f64,
    /// Message size of the fairness test (RDMA Write and TCP write); K, M suffixes.
    #[arg(short = 's', long, default_value = "64K", value_parser = fair_size)]
    size: u64,
    /// The device: --provider iwarp|roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    dev: crate::providers::DeviceArgs,
    /// iWARP: ask for MPA CRC32c (refused on other providers).
    #[arg(long, value_parser = ["on", "off"])]
    crc: Option<String>,
    /// One JSON object on stdout instead of the table (docs/json.md).
    #[arg(long)]
    json: bool,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        Ok(_) => Err("must be more than 0 and at most 3600 seconds".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn fair_size(s: &str) -> Result<u64, String> {
    let v = crate::units::parse_size(s)?;
    if !(1..=(16 << 20)).contains(&v) {
        return Err("must be 1 byte to 16 MiB".into());
    }
    Ok(v)
}

/// The figures of one kind of connection.
#[derive(serde::Serialize, Debug)]
struct Kind {
    /// Connections completed per second of the sequential connect loop.
    setup_per_s: f64,
    /// Seconds the N connects took.
    setup_s: f64,
    /// Growth of this process's resident memory per connection (both endpoints), KiB.
    rss_kib_per_conn: Option<f64>,
    /// Growth of the machine's TCP socket memory per connection, KiB (system-wide figure).
    tcp_kernel_kib_per_conn: Option<f64>,
    /// Open descriptors added per connection.
    fds_per_conn: Option<f64>,
    /// Threads added for all the connections together.
    threads_added: Option<i64>,
    /// CPU seconds used while the connections sat idle for `idle_s`.
    idle_cpu_s: Option<f64>,
    idle_s: f64,
    /// The fairness test.
    fair: Fair,
}

#[derive(serde::Serialize, Debug)]
struct Fair {
    /// Gbit/s of each active connection.
    gbit_per_s: Vec<f64>,
    /// Their sum.
    gbit_per_s_total: f64,
    /// Jain's fairness index of `gbit_per_s`.
    jain: f64,
}

#[derive(serde::Serialize)]
struct ScaleJson<'a> {
    tool: &'static str,
    device: &'a str,
    conns: u32,
    active: u32,
    size: u64,
    seconds: f64,
    rdma: &'a Kind,
    tcp: &'a Kind,
}

/// Jain's fairness index: (Σx)² / (n·Σx²); 1 for equal shares, 1/n when one takes all.
fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || sq == 0.0 {
        return 0.0;
    }
    sum * sum / (x.len() as f64 * sq)
}

/// Resource use at one moment, for before/after differences.
struct Snapshot {
    rss: Option<u64>,
    tcp_mem: Option<u64>,
    fds: Option<u64>,
    threads: Option<u64>,
}

impl Snapshot {
    fn now() -> Snapshot {
        Snapshot {
            rss: procstat::rss_bytes(),
            tcp_mem: procstat::tcp_kernel_mem_bytes(),
            fds: procstat::fds(),
            threads: procstat::threads(),
        }
    }
}

fn per_conn(before: Option<u64>, after: Option<u64>, n: u32, unit: f64) -> Option<f64> {
    Some((after? as f64 - before? as f64) / n as f64 / unit)
}

impl Kind {
    /// The figures of `n` connections: their setup time, the resource snapshots before and
    /// after the connects, the idle window's CPU, and the fairness test's bytes per writer.
    fn measured(
        args: &Args,
        n: u32,
        setup_s: f64,
        s0: &Snapshot,
        s1: &Snapshot,
        idle_cpu_s: Option<f64>,
        bytes: &[u64],
    ) -> Kind {
        Kind {
            setup_per_s: n as f64 / setup_s,
            setup_s,
            rss_kib_per_conn: per_conn(s0.rss, s1.rss, n, 1024.0),
            tcp_kernel_kib_per_conn: per_conn(s0.tcp_mem, s1.tcp_mem, n, 1024.0),
            fds_per_conn: per_conn(s0.fds, s1.fds, n, 1.0),
            threads_added: s0.threads.zip(s1.threads).map(|(a, b)| b as i64 - a as i64),
            idle_cpu_s,
            idle_s: args.idle_secs,
            fair: fair(bytes, args.duration),
        }
    }
}

/// Starts the fairness test's writers (waiting at `barrier`), lets them run for `secs`, stops
/// them and returns each one's bytes.
fn run_writers(
    barrier: &Barrier,
    stop: &AtomicBool,
    secs: f64,
    writers: Vec<std::thread::ScopedJoinHandle<'_, Result<u64>>>,
) -> Result<Vec<u64>> {
    barrier.wait();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    writers
        .into_iter()
        .map(|h| h.join().map_err(|_| anyhow!("writer thread panicked"))?)
        .collect()
}

/// CPU seconds this process uses while it sleeps for `secs`.
fn idle_cpu(secs: f64) -> Option<f64> {
    let c0 = procstat::cpu_secs()?;
    std::thread::sleep(Duration::from_secs_f64(secs));
    Some(procstat::cpu_secs()? - c0)
}

fn note(json: bool, msg: &str) {
    if !json && std::io::stderr().is_terminal() {
        eprintln!("{msg}");
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.active > args.qps {
        bail!("--active {} is more than --qps {}", args.active, args.qps);
    }
    let limit = crate::fdlimit::raise();
    // iWARP: 2 sockets per connection; the TCP run another 2, while the RDMA ones are closed.
    let need = 2 * args.qps as u64 + 64;
    if let Some(l) = limit
        && l < need
    {
        bail!(
            "--qps {} needs about {need} file descriptors and the limit is {l} (ulimit -n); raise it or ask for fewer",
            args.qps
        );
    }
    let flags: Vec<_> = crate::providers::Flag::crc(args.crc.as_deref()).into_iter().collect();
    let here = std::net::IpAddr::from([127, 0, 0, 1]);
    let dev = crate::providers::open(&args.dev, &flags, crate::providers::Endpoint::Listen(here))?;
    note(
        args.json,
        &format!("scale: {} RDMA connections on {}", args.qps, dev.name()),
    );
    let rdma = run_rdma(&dev, &args).context("RDMA connections")?;
    note(args.json, &format!("scale: {} TCP connections", args.qps));
    let tcp = run_tcp(&args).context("TCP connections")?;
    if args.json {
        let j = ScaleJson {
            tool: "scale",
            device: dev.name(),
            conns: args.qps,
            active: args.active,
            size: args.size,
            seconds: args.duration,
            rdma: &rdma,
            tcp: &tcp,
        };
        println!("{}", serde_json::to_string(&j)?);
    } else {
        print_table(&args, dev.name(), &rdma, &tcp);
    }
    Ok(())
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.prec$}"))
}

fn print_table(args: &Args, dev: &str, r: &Kind, t: &Kind) {
    let line = "-".repeat(79);
    println!("{line}");
    println!(
        " {} connections on {dev}, both ends in this process (loopback); each connection",
        args.qps
    );
    println!(
        " counts its two endpoints. Fairness: {} active, {} B messages, {} s.",
        args.active, args.size, args.duration
    );
    println!("{line}");
    println!(" {:<36} {:>18} {:>18}", "", "RDMA (QP pairs)", "TCP (socket pairs)");
    let row = |name: &str, a: String, b: String| println!(" {name:<36} {a:>18} {b:>18}");
    row(
        "setup [connections/s]",
        format!("{:.0}", r.setup_per_s),
        format!("{:.0}", t.setup_per_s),
    );
    row(
        "process memory (RSS) [KiB/conn]",
        opt(r.rss_kib_per_conn, 1),
        opt(t.rss_kib_per_conn, 1),
    );
    row(
        "kernel TCP memory [KiB/conn]",
        opt(r.tcp_kernel_kib_per_conn, 1),
        opt(t.tcp_kernel_kib_per_conn, 1),
    );
    row(
        "file descriptors [per conn]",
        opt(r.fds_per_conn, 2),
        opt(t.fds_per_conn, 2),
    );
    row(
        "threads added [total]",
        r.threads_added.map_or("-".into(), |v| v.to_string()),
        t.threads_added.map_or("-".into(), |v| v.to_string()),
    );
    row(
        &format!("idle CPU over {} s [CPU s]", r.idle_s),
        opt(r.idle_cpu_s, 2),
        opt(t.idle_cpu_s, 2),
    );
    row(
        "active total [Gb/s]",
        format!("{:.2}", r.fair.gbit_per_s_total),
        format!("{:.2}", t.fair.gbit_per_s_total),
    );
    let range = |f: &Fair| {
        let min = f.gbit_per_s.iter().copied().fold(f64::INFINITY, f64::min);
        let max = f.gbit_per_s.iter().copied().fold(0.0, f64::max);
        format!("{min:.2}..{max:.2}")
    };
    row("per active connection [Gb/s]", range(&r.fair), range(&t.fair));
    row(
        "Jain's fairness index",
        format!("{:.3}", r.fair.jain),
        format!("{:.3}", t.fair.jain),
    );
    println!("{line}");
}

fn run_rdma(dev: &Device, args: &Args) -> Result<Kind> {
    let n = args.qps;
    let active = args.active as usize;
    let size = args.size as usize;
    let s0 = Snapshot::now();
    let listener = dev.listen("127.0.0.1:0".parse()?)?;
    let addr = listener.local_addr();
    // The passive side: one PD and one CQ for every accepted QP (one-sided Writes produce no
    // completions there); the target buffer holds one slot per active connection.
    let spd = dev.alloc_pd()?;
    let scq = dev.create_cq(64)?;
    let target = spd.reg_mr(active * size, Access::all_remote())?;
    let remote = RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey(),
    };
    let server = std::thread::Builder::new()
        .name("scale-accept".into())
        .spawn(move || -> Result<Vec<QueuePair>> {
            let mut qps = Vec::with_capacity(n as usize);
            for i in 0..n {
                let req = listener
                    .get_request(Some(T))
                    .with_context(|| format!("waiting for connection {i}"))?;
                qps.push(req.accept(&spd, QpOptions::new(&scq))?);
            }
            Ok(qps)
        })?;
    // The active side: each active QP has its own CQ (its thread polls it); the others share.
    let pd = dev.alloc_pd()?;
    let shared_cq = dev.create_cq(64)?;
    let src = pd.reg_mr(active * size, Access::LOCAL_WRITE)?;
    let mut cqs = Vec::with_capacity(active);
    let mut qps = Vec::with_capacity(n as usize);
    let t0 = Instant::now();
    for i in 0..n as usize {
        let opts = if i < active {
            cqs.push(dev.create_cq(2 * DEPTH)?);
            QpOptions::new(&cqs[i])
        } else {
            QpOptions::new(&shared_cq)
        };
        let qp = pd
            .connect(addr, opts, T)
            .with_context(|| format!("connection {i} of {n}"))?;
        qps.push(qp);
    }
    let setup_s = t0.elapsed().as_secs_f64();
    let accepted = server.join().map_err(|_| anyhow!("accept thread panicked"))??;
    // Both sides have taken their Established events by now or hold them queued; either way
    // nothing runs until traffic does.
    let s1 = Snapshot::now();
    let idle_cpu_s = idle_cpu(args.idle_secs);

    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(active + 1);
    let bytes: Vec<u64> = std::thread::scope(|s| -> Result<Vec<u64>> {
        let mut hs = Vec::new();
        for (i, (qp, cq)) in qps.iter().zip(&cqs).enumerate() {
            let (stop, barrier, src) = (&stop, &barrier, &src);
            let remote = RemoteAddr {
                addr: remote.addr + (i * size) as u64,
                rkey: remote.rkey,
            };
            hs.push(s.spawn(move || writer(qp, cq, src, i * size, size, remote, stop, barrier)));
        }
        run_writers(&barrier, &stop, args.duration, hs)
    })?;
    drop(qps);
    drop(accepted);
    Ok(Kind::measured(args, n, setup_s, &s0, &s1, idle_cpu_s, &bytes))
}

/// One active QP of the fairness test: keeps [`DEPTH`] signaled Writes of `size` bytes in
/// flight until `stop`, and returns the bytes whose Writes completed.
#[allow(clippy::too_many_arguments)]
fn writer(
    qp: &QueuePair,
    cq: &CompletionQueue,
    src: &MemoryRegion,
    off: usize,
    size: usize,
    remote: RemoteAddr,
    stop: &AtomicBool,
    barrier: &Barrier,
) -> Result<u64> {
    let wr = |id: u64| {
        SendWr::new(id, WrOpcode::RdmaWrite { remote }, vec![src.sge(off, size as u32)]).flags(SendFlags::SIGNALED)
    };
    barrier.wait();
    let (mut posted, mut done, mut bytes) = (0u64, 0u64, 0u64);
    let mut wcs = Vec::with_capacity(DEPTH);
    let mut last = Instant::now();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        while !stopping && posted - done < DEPTH as u64 {
            qp.post_send_one(wr(posted))?;
            posted += 1;
        }
        if stopping && posted == done {
            return Ok(bytes);
        }
        wcs.clear();
        if cq.poll(&mut wcs, DEPTH) == 0 {
            if last.elapsed() > T {
                bail!("no Write completion within {T:?}");
            }
            std::thread::yield_now();
            continue;
        }
        last = Instant::now();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                bail!("RDMA Write completed with {}", wc.status.as_str());
            }
            done += 1;
            if !stopping {
                bytes += size as u64;
            }
        }
    }
}

fn fair(bytes: &[u64], secs: f64) -> Fair {
    let g: Vec<f64> = bytes.iter().map(|&b| b as f64 * 8.0 / secs / 1e9).collect();
    Fair {
        gbit_per_s_total: g.iter().sum(),
        jain: jain(&g),
        gbit_per_s: g,
    }
}

/// A loopback listener with the iWARP provider's `listen(2)` backlog (1024; std's 128 would
/// let a burst of connects wait for SYN retransmissions, a second each, whenever the accepting
/// thread falls behind).
fn tcp_listener() -> Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())?;
    s.listen(LISTEN_BACKLOG)?;
    Ok(s.into())
}

/// The `listen(2)` backlog of the TCP comparison, the iWARP listener's default.
const LISTEN_BACKLOG: i32 = 1024;

fn run_tcp(args: &Args) -> Result<Kind> {
    let n = args.qps;
    let active = args.active as usize;
    let size = args.size as usize;
    let s0 = Snapshot::now();
    let listener = tcp_listener()?;
    let addr: SocketAddr = listener.local_addr()?;
    let server = std::thread::Builder::new()
        .name("scale-accept".into())
        .spawn(move || -> Result<Vec<TcpStream>> {
            let mut socks = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let (s, _) = listener.accept()?;
                s.set_nodelay(true)?;
                socks.push(s);
            }
            Ok(socks)
        })?;
    let mut socks = Vec::with_capacity(n as usize);
    let t0 = Instant::now();
    for i in 0..n {
        let s = TcpStream::connect_timeout(&addr, T).with_context(|| format!("connection {i} of {n}"))?;
        s.set_nodelay(true)?;
        socks.push(s);
    }
    let setup_s = t0.elapsed().as_secs_f64();
    let accepted = server.join().map_err(|_| anyhow!("accept thread panicked"))??;
    let s1 = Snapshot::now();
    let idle_cpu_s = idle_cpu(args.idle_secs);

    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(active + 1);
    let bytes: Vec<u64> = std::thread::scope(|s| -> Result<Vec<u64>> {
        // A reader per active connection drops what arrives (the RDMA target needs none).
        for r in accepted.iter().take(active) {
            let mut r = r.try_clone()?;
            r.set_read_timeout(Some(T))?;
            s.spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
        let mut hs = Vec::new();
        for w in socks.iter().take(active) {
            let (stop, barrier) = (&stop, &barrier);
            let mut w = w.try_clone()?;
            w.set_write_timeout(Some(T))?;
            hs.push(s.spawn(move || -> Result<u64> {
                let buf = vec![0x5au8; size];
                barrier.wait();
                let mut bytes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    w.write_all(&buf)?;
                    bytes += size as u64;
                }
                // The readers end on EOF.
                w.shutdown(std::net::Shutdown::Write)?;
                Ok(bytes)
            }));
        }
        run_writers(&barrier, &stop, args.duration, hs)
    })?;
    drop(socks);
    drop(accepted);
    Ok(Kind::measured(args, n, setup_s, &s0, &s1, idle_cpu_s, &bytes))
}

#[cfg(test)]
mod tests {
    use super::jain;

    #[test]
    fn jain_index_of_equal_and_skewed_shares() {
        assert!((jain(&[3.0, 3.0, 3.0, 3.0]) - 1.0).abs() < 1e-12);
        // One of n takes everything: 1/n.
        assert!((jain(&[5.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        // (1+2+3+4)^2 / (4 * 30) = 100 / 120.
        assert!((jain(&[1.0, 2.0, 3.0, 4.0]) - 100.0 / 120.0).abs() < 1e-12);
        assert_eq!(jain(&[]), 0.0);
        assert_eq!(jain(&[0.0, 0.0]), 0.0);
    }
}
