//! `softrdma smc bench`: request/response latency of `SmcStream` next to plain TCP of the
//! same size in the same run (issue 15's 64 B request/response benchmark).
//!
//! The client writes `--size` octets, the server reads them all and writes them back, the
//! client reads them all: one round trip, timed with a monotonic clock into a histogram
//! (p50, p99, mean, as perftest's `*_lat` tools report). The same loop then runs over a
//! plain `TcpStream` (TCP_NODELAY) between the same two addresses, so the ratio compares the
//! two transports under the same load.
//!
//! Waiting: by default both sides block in `read` (an `SmcStream` reader takes its link's
//! CQ itself and sleeps in it, with the RoCE provider in `poll(2)` on the device's socket,
//! and applies the CDC it waits for; TCP sleeps in the kernel). `--busy` makes both sides nonblocking and spin on `WouldBlock` (both
//! transports, so the comparison stays like for like). The mode is printed and is in the
//! JSON (`"wait": "blocking" | "busy"`).
//!
//! - In-process (default): two soft RoCEv2 devices on two loopback addresses
//!   (`--server-addr`, `--client-addr`), server threads and the client in this process.
//! - Across hosts: `--server IP:PORT` (SMC-R listener on PORT, plain TCP on PORT+1, serves
//!   until killed, or `--once`: one connection of each, then exits) and
//!   `--connect IP:PORT [--local IP]` on the other host.

use crate::providers;
use crate::report::Latency;
use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use serde::Serialize;
use smc::{Mode, SmcConfig, SmcListener, SmcStream};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Instant;
use verbs::{Device, DeviceOptions};

/// `softrdma smc bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Request and response size in octets.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Timed round trips per transport.
    #[arg(short = 'n', long = "iters", default_value_t = 10_000)]
    iters: u64,
    /// Untimed round trips before the timed ones.
    #[arg(long, default_value_t = 200)]
    warmup: u64,
    /// Spin on nonblocking reads (both transports) instead of blocking in `read`.
    #[arg(long)]
    busy: bool,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Show progress on stderr even when it is not a terminal.
    #[arg(long)]
    progress: bool,
    /// In-process: the server's device and listening address.
    #[arg(long, default_value = "127.118.0.1")]
    server_addr: IpAddr,
    /// In-process: the client's device address.
    #[arg(long, default_value = "127.118.0.2")]
    client_addr: IpAddr,
    /// Serve across hosts: SMC-R on IP:PORT, plain TCP on IP:PORT+1.
    #[arg(long, conflicts_with = "connect")]
    server: Option<SocketAddr>,
    /// With --server: serve one connection of each transport, then exit.
    #[arg(long, requires = "server")]
    once: bool,
    /// Client across hosts: the `--server` address.
    #[arg(long)]
    connect: Option<SocketAddr>,
    /// With --connect: the local address whose RoCE device the client uses (default: the
    /// source address of the route to the server).
    #[arg(long, requires = "connect")]
    local: Option<IpAddr>,
    /// IPv4 prefix length both ends share (CLC); in-process on loopback 8 (the client's TCP
    /// source is 127.0.0.1).
    #[arg(long)]
    prefix_len: Option<u8>,
    /// RMB element size (16K to 512K, a power of two: the CLC's sizes, A1.6).
    #[arg(long, default_value_t = 64 * 1024, value_parser = crate::units::rmbe_size)]
    rmbe: u32,
}

/// One transport's result.
#[derive(Serialize, Debug)]
struct Side {
    /// "SMC-R", "TCP", or "TCP (fallback: reason)" for an SmcStream that fell back.
    mode: String,
    round_trips: u64,
    round_trips_per_s: f64,
    latency: Latency,
}

/// The JSON report.
#[derive(Serialize, Debug)]
struct Report {
    bench: &'static str,
    size: usize,
    iters: u64,
    warmup: u64,
    /// "blocking" (both sides sleep in read) or "busy" (both spin on nonblocking reads).
    wait: &'static str,
    /// "in-process" or the server's address.
    setup: String,
    smc: Side,
    tcp: Side,
    /// SMC-R's latency over TCP's (below 1.0: SMC-R is faster).
    ratio_p50: f64,
    ratio_p99: f64,
    ratio_mean: f64,
}

fn device(ip: IpAddr) -> Result<Device> {
    providers::registry()
        .open("roce", &DeviceOptions::new().with("addr", ip))
        .with_context(|| format!("RoCEv2 device on {ip}"))
}

fn cfg(a: &BenchArgs, default_prefix: u8) -> SmcConfig {
    SmcConfig {
        prefix_len: a.prefix_len.unwrap_or(default_prefix),
        rmbe_len: a.rmbe,
        send_buf: a.rmbe,
        ..SmcConfig::default()
    }
}

/// Reads exactly `buf.len()` octets; with `busy` the stream is nonblocking and `WouldBlock`
/// is spun on. Ok(false) on EOF before the first octet.
fn read_full<S: Read>(s: &mut S, buf: &mut [u8], busy: bool) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if busy && e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn write_full<S: Write>(s: &mut S, mut buf: &[u8], busy: bool) -> io::Result<()> {
    while !buf.is_empty() {
        match s.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if busy && e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The server's loop: echo `size`-octet requests until EOF.
fn echo<S: Read + Write>(mut s: S, size: usize, busy: bool) -> io::Result<()> {
    let mut buf = vec![0u8; size];
    while read_full(&mut s, &mut buf, busy)? {
        write_full(&mut s, &buf, busy)?;
    }
    Ok(())
}

/// The client's loop: `warmup` + `iters` round trips, each checked (the response is the
/// request), the timed ones recorded in nanoseconds.
fn pingpong<S: Read + Write>(s: &mut S, a: &BenchArgs, label: &str) -> Result<(Histogram<u64>, f64)> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
    let mut req = vec![0u8; a.size];
    let mut resp = vec![0u8; a.size];
    let pb = crate::progress::count(
        crate::progress::wanted(a.progress, a.json),
        label.to_string(),
        a.warmup + a.iters,
    );
    let mut t_start = Instant::now();
    for i in 0..a.warmup + a.iters {
        if i == a.warmup {
            t_start = Instant::now();
        }
        req[0] = i as u8;
        if let Some(l) = req.last_mut() {
            *l = (i >> 8) as u8;
        }
        let t0 = Instant::now();
        write_full(s, &req, a.busy).with_context(|| format!("{label}: request {i}"))?;
        if !read_full(s, &mut resp, a.busy).with_context(|| format!("{label}: response {i}"))? {
            bail!("{label}: the server closed after {i} round trips");
        }
        let ns = t0.elapsed().as_nanos() as u64;
        if resp != req {
            bail!("{label}: response {i} differs from its request");
        }
        if i >= a.warmup {
            h.record(ns.max(1)).ok();
        }
        if let Some(pb) = &pb
            && i % 256 == 0
        {
            pb.set_position(i);
        }
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    Ok((h, t_start.elapsed().as_secs_f64()))
}

fn side(mode: String, h: &Histogram<u64>, secs: f64) -> Side {
    Side {
        mode,
        round_trips: h.len(),
        round_trips_per_s: h.len() as f64 / secs.max(1e-9),
        latency: Latency::of_ns(h),
    }
}

fn mode_name(m: Mode) -> String {
    match m {
        Mode::SmcR => "SMC-R".into(),
        Mode::Fallback(r) => format!("TCP (fallback: {r})"),
    }
}

fn serve_smc(l: SmcListener, size: usize, busy: bool, once: bool) {
    loop {
        match l.accept() {
            Ok((s, _)) => {
                if busy && let Err(e) = s.set_nonblocking(true) {
                    tracing::warn!(error = %e, "nonblocking");
                }
                let t = std::thread::spawn(move || echo(s, size, busy));
                if once {
                    let _ = t.join();
                    return;
                }
            }
            Err(e) => tracing::warn!(error = %e, "SMC-R accept"),
        }
    }
}

fn serve_tcp(l: TcpListener, size: usize, busy: bool, once: bool) {
    loop {
        match l.accept() {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                if busy {
                    let _ = s.set_nonblocking(true);
                }
                let t = std::thread::spawn(move || echo(s, size, busy));
                if once {
                    let _ = t.join();
                    return;
                }
            }
            Err(e) => tracing::warn!(error = %e, "TCP accept"),
        }
    }
}

/// Client side of both transports against `smc_addr` (SMC-R) and `tcp_addr` (plain TCP).
fn client(
    a: &BenchArgs,
    dev: &Device,
    c: &SmcConfig,
    smc_addr: SocketAddr,
    tcp_addr: SocketAddr,
) -> Result<(Side, Side)> {
    let mut s = SmcStream::connect_with(smc_addr, dev, c).with_context(|| format!("SMC-R connect {smc_addr}"))?;
    let mode = s.mode();
    if a.busy {
        s.set_nonblocking(true)?;
    }
    let (hs, ss) = pingpong(&mut s, a, "SMC-R")?;
    drop(s);
    let mut t = TcpStream::connect(tcp_addr).with_context(|| format!("TCP connect {tcp_addr}"))?;
    t.set_nodelay(true)?;
    if a.busy {
        t.set_nonblocking(true)?;
    }
    let (ht, st) = pingpong(&mut t, a, "TCP")?;
    Ok((side(mode_name(mode), &hs, ss), side("TCP".into(), &ht, st)))
}

fn source_for(peer: SocketAddr) -> Result<IpAddr> {
    let any: SocketAddr = if peer.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let u = UdpSocket::bind(any)?;
    u.connect(peer)?;
    Ok(u.local_addr()?.ip())
}

/// `softrdma smc bench`.
pub fn bench(a: BenchArgs) -> Result<()> {
    if a.size == 0 {
        bail!("--size must be at least 1");
    }
    if a.iters == 0 {
        bail!("-n must be at least 1");
    }
    let wait = if a.busy { "busy" } else { "blocking" };
    if let Some(at) = a.server {
        let dev = device(at.ip())?;
        let l = SmcListener::bind_with(at, &dev, cfg(&a, 24)).with_context(|| format!("bind {at}"))?;
        let tcp_at = SocketAddr::new(at.ip(), at.port().wrapping_add(1));
        let t = TcpListener::bind(tcp_at).with_context(|| format!("bind {tcp_at}"))?;
        eprintln!(
            "smc bench server: SMC-R on {}, TCP on {}, {} B, {wait} reads",
            l.local_addr()?,
            t.local_addr()?,
            a.size
        );
        let (size, busy, once) = (a.size, a.busy, a.once);
        let tt = std::thread::spawn(move || serve_tcp(t, size, busy, once));
        serve_smc(l, size, busy, once);
        let _ = tt.join();
        return Ok(());
    }
    let (smc, tcp, setup) = if let Some(at) = a.connect {
        let local = match a.local {
            Some(l) => l,
            None => source_for(at)?,
        };
        let dev = device(local)?;
        let tcp_at = SocketAddr::new(at.ip(), at.port().wrapping_add(1));
        let (s, t) = client(&a, &dev, &cfg(&a, 24), at, tcp_at)?;
        (s, t, at.to_string())
    } else {
        let (ds, dc) = (device(a.server_addr)?, device(a.client_addr)?);
        let c = cfg(&a, 8);
        let l = SmcListener::bind_with(SocketAddr::new(a.server_addr, 0), &ds, c.clone())?;
        let t = TcpListener::bind(SocketAddr::new(a.server_addr, 0))?;
        let (smc_at, tcp_at) = (l.local_addr()?, t.local_addr()?);
        let (size, busy) = (a.size, a.busy);
        let s1 = std::thread::spawn(move || serve_smc(l, size, busy, true));
        let s2 = std::thread::spawn(move || serve_tcp(t, size, busy, true));
        let (s, tr) = client(&a, &dc, &c, smc_at, tcp_at)?;
        let _ = s1.join();
        let _ = s2.join();
        drop((ds, dc));
        (s, tr, "in-process".to_string())
    };
    let r = Report {
        bench: "smc_rr",
        size: a.size,
        iters: a.iters,
        warmup: a.warmup,
        wait,
        setup,
        ratio_p50: smc.latency.p50_us / tcp.latency.p50_us,
        ratio_p99: smc.latency.p99_us / tcp.latency.p99_us,
        ratio_mean: smc.latency.avg_us / tcp.latency.avg_us,
        smc,
        tcp,
    };
    if a.json {
        crate::report::print_line(&r);
        return Ok(());
    }
    println!(
        "smc bench: {} B request/response, {} round trips ({} warm-up), {} reads on both sides, {}",
        r.size, r.iters, r.warmup, r.wait, r.setup
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "transport", "p50 us", "p99 us", "mean us", "max us", "round trip/s"
    );
    for s in [&r.smc, &r.tcp] {
        println!(
            "{:<28} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>12.0}",
            s.mode, s.latency.p50_us, s.latency.p99_us, s.latency.avg_us, s.latency.max_us, s.round_trips_per_s
        );
    }
    println!(
        "SMC-R / TCP latency: p50 {:.2}x  p99 {:.2}x  mean {:.2}x",
        r.ratio_p50, r.ratio_p99, r.ratio_mean
    );
    Ok(())
}
