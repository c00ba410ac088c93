//! `softrdma rpc`: the demo RPC program (0x20000099: ECHO, READ, WRITE, WORDS)
//! served over TCP and RPC-over-RDMA at once, called, and benchmarked.
//!
//! ```text
//! softrdma rpc serve [--tcp 127.0.0.1:20048] [--rdma 127.0.0.1:20049] [--tcp-idle-timeout 300 ...]
//! softrdma rpc call --transport rdma --addr 127.0.0.1:20049 --proc read --size 1M
//! softrdma rpc bench --size 1M --transport both --json
//! ```
//!
//! `bench` starts both servers in-process on loopback and times READ calls of
//! `--size` bytes (the reply data comes back through a Write chunk over RDMA,
//! in the TCP record over TCP), with `--threads` callers on one connection each.

use anyhow::{Result, anyhow, bail};
use rpcrdma::client::{RpcClient, RpcError};
use rpcrdma::demo;
use rpcrdma::rpc::AcceptStat;
use rpcrdma::tcp::{TcpCaller, TcpClient, TcpServer, TcpServerConfig};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};
use rpcrdma::wire::ErrorBody;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::net::{Notice, host_port};
use crate::report::Bandwidth;
use crate::units::parse_size;

/// `rpc bench --threads` at most: each caller is a thread with a TCP and an RDMA connection
/// (descriptors, and one RDMA connection per caller on a server that takes 1024).
const MAX_THREADS: u32 = 256;
/// File descriptors one `rpc bench` caller holds (client and server ends, both transports'
/// at most; measured: 64 callers run in 250).
const FDS_PER_THREAD: u64 = 4;

/// A size of call or reply data: [`parse_size()`], at most the demo program's 64 MiB.
fn data_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v > demo::MAX_DATA as u64 {
        return Err(format!(
            "{s} is more than the demo program's {} MiB of data per call",
            demo::MAX_DATA >> 20
        ));
    }
    Ok(v)
}

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// The RDMA device: --provider iwarp|roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    dev: crate::providers::DeviceArgs,
}

impl Args {
    /// `rpc bench`, whose servers run in this process.
    pub fn is_bench(&self) -> bool {
        matches!(self.cmd, Cmd::Bench { .. })
    }
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Serve the demo program (0x20000099: NULL, ECHO, READ, WRITE) over ONC RPC on TCP
    /// (record marking) and over RPC-over-RDMA v1 (on the --provider device) at the same time, until interrupted.
    Serve {
        /// Address of the ONC RPC over TCP listener (HOST:PORT; HOST may be a name).
        #[arg(long, default_value = "127.0.0.1:20048", value_parser = host_port)]
        tcp: SocketAddr,
        /// Address of the RPC-over-RDMA listener; 20049 is NFS/RDMA's port.
        #[arg(long, default_value = "127.0.0.1:20049", value_parser = host_port)]
        rdma: SocketAddr,
        #[command(flatten)]
        tcp_limits: TcpLimits,
        #[command(flatten)]
        rdma_limits: RdmaLimits,
    },
    /// Make calls to a running `softrdma rpc serve`.
    Call {
        /// Transport: ONC RPC over TCP, or RPC-over-RDMA (on the --provider device).
        #[arg(long, default_value = "rdma", value_parser = ["tcp", "rdma"])]
        transport: String,
        /// Server address, HOST:PORT (default: the serve defaults for the chosen transport).
        #[arg(long, value_parser = host_port)]
        addr: Option<SocketAddr>,
        /// Procedure: null, echo (data both ways), read (SIZE bytes back, through a write
        /// chunk over RDMA when large), write (SIZE bytes out, through a read chunk).
        #[arg(long, default_value = "read", value_parser = ["null", "echo", "read", "write"])]
        proc_: String,
        /// Bytes of bulk data per call; K, M suffixes. At most 64M (the demo program's
        /// limit); `rpc serve` takes at most 8M of call data over RDMA (--rdma-max-call).
        #[arg(long, value_parser = data_size, default_value = "4K")]
        size: u64,
        /// Number of calls.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
        /// Seconds to wait for the connection and for each reply.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
        timeout: u64,
    },
    /// Time READ calls over TCP and/or RDMA (servers started in-process on loopback), or with
    /// `--proc null|echo` the round trip of small calls.
    Bench {
        /// READ reply size in bytes (over RDMA, moved by a write chunk); K, M suffixes, at most 64M.
        /// With `--proc echo` the ECHO data size [default there: 64].
        #[arg(long, value_parser = data_size)]
        size: Option<u64>,
        /// `read`: bandwidth of READ calls. `null` / `echo`: round trip (p50, p99) of one call at a
        /// time on one connection per transport, TCP and RDMA calls alternating in batches of 100.
        #[arg(long = "proc", default_value = "read", value_parser = ["read", "null", "echo"])]
        proc_: String,
        /// Which transports to time; `both` prints the RDMA/TCP ratio.
        #[arg(long, default_value = "both", value_parser = ["tcp", "rdma", "both"])]
        transport: String,
        /// Calls per transport (default: enough for 512 MiB, at least 20).
        #[arg(long, value_parser = crate::units::count)]
        calls: Option<u64>,
        /// Concurrent callers, each a thread with one connection per transport (1 to 256).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_THREADS as i64))]
        threads: u32,
        /// One JSON object with both transports' MB/s and Gbit/s and the ratio (docs/json.md).
        #[arg(long)]
        json: bool,
        /// `--proc null|echo`: both callers busy-poll for their Replies (the RDMA caller spins
        /// on its completion queue, the TCP caller on a non-blocking socket). Without it both
        /// sleep at once (the RDMA caller in its completion queue, the TCP caller in `read`).
        #[arg(long)]
        busy_poll: bool,
    },
}

/// The ONC RPC over TCP server's limits (`rpcrdma::tcp`'s resource model);
/// each defaults to `TcpServerConfig::default()`.
#[derive(clap::Args)]
struct TcpLimits {
    /// TCP: connections served at once; more are closed at once [default: 1024].
    #[arg(long, value_name = "N")]
    tcp_max_connections: Option<usize>,
    /// TCP: octets of partial records, calls and unwritten replies of all connections
    /// together; K, M, G suffixes [default: 512M].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    tcp_memory_budget: Option<u64>,
    /// TCP: unwritten reply octets per connection above which its next calls are not
    /// read [default: 8M].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    tcp_reply_backlog: Option<u64>,
    /// TCP: largest call record accepted [default: 64M].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    tcp_max_record: Option<u64>,
    /// TCP: seconds a started record may stall before its connection is dropped [default: 30].
    #[arg(long, value_name = "SECS")]
    tcp_read_timeout: Option<f64>,
    /// TCP: seconds a connection with nothing in progress stays open [default: 300].
    #[arg(long, value_name = "SECS")]
    tcp_idle_timeout: Option<f64>,
    /// TCP: seconds a peer may leave its replies unread before it is dropped [default: 30].
    #[arg(long, value_name = "SECS")]
    tcp_write_timeout: Option<f64>,
    /// TCP: threads that run the handlers [default: the CPU count, 2 to 8].
    #[arg(long, value_name = "N")]
    tcp_workers: Option<usize>,
}

impl TcpLimits {
    fn config(&self) -> Result<TcpServerConfig> {
        let mut c = TcpServerConfig::default();
        let size = |v: u64| usize::try_from(v).map_err(|_| anyhow!("{v} does not fit this machine's memory"));
        let secs =
            |what: &str, v: f64| Duration::try_from_secs_f64(v).map_err(|e| anyhow!("--tcp-{what}-timeout {v}: {e}"));
        if let Some(n) = self.tcp_max_connections {
            c.max_connections = n.max(1);
        }
        if let Some(v) = self.tcp_memory_budget {
            c.memory_budget = size(v)?;
        }
        if let Some(v) = self.tcp_reply_backlog {
            c.reply_backlog = size(v)?;
        }
        if let Some(v) = self.tcp_max_record {
            c.max_record = size(v)?;
        }
        if let Some(v) = self.tcp_read_timeout {
            c.read_timeout = secs("read", v)?;
        }
        if let Some(v) = self.tcp_idle_timeout {
            c.idle_timeout = secs("idle", v)?;
        }
        if let Some(v) = self.tcp_write_timeout {
            c.write_timeout = secs("write", v)?;
        }
        if let Some(n) = self.tcp_workers {
            c.workers = n.max(1);
        }
        Ok(c)
    }
}

/// The RPC-over-RDMA Responder's limits (the resource model in `rpcrdma::transport`).
#[derive(clap::Args)]
struct RdmaLimits {
    /// RDMA: most connections at once; more are rejected.
    #[arg(long, default_value_t = RdmaConfig::default().max_connections)]
    rdma_max_connections: usize,
    /// RDMA: seconds without a message before a connection is closed (0: never).
    #[arg(long, default_value_t = 300)]
    rdma_idle_timeout: u64,
    /// RDMA: largest total of one Call's Read chunks (K, M suffixes); more gets ERR_CHUNK.
    #[arg(long, value_parser = parse_size, default_value = "8M")]
    rdma_max_call: u64,
    /// RDMA: largest reply; a procedure whose reply could be larger gets SYSTEM_ERR.
    #[arg(long, value_parser = parse_size, default_value = "65600K")]
    rdma_max_reply: u64,
    /// RDMA: staging memory of all connections together.
    #[arg(long, value_parser = parse_size, default_value = "512M")]
    rdma_max_staging: u64,
    /// RDMA: worker threads serving all connections.
    #[arg(long, default_value_t = RdmaConfig::default().workers)]
    rdma_workers: usize,
}

impl RdmaLimits {
    fn config(&self) -> RdmaConfig {
        RdmaConfig {
            max_connections: self.rdma_max_connections,
            idle_timeout: (self.rdma_idle_timeout > 0).then(|| Duration::from_secs(self.rdma_idle_timeout)),
            max_call: self.rdma_max_call,
            max_reply: self.rdma_max_reply,
            max_staging: self.rdma_max_staging,
            workers: self.rdma_workers.max(1),
            ..RdmaConfig::default()
        }
    }
}

/// The device of `args` for a listener on (or a client of) `at`.
fn device(args: &crate::providers::DeviceArgs, at: crate::providers::Endpoint) -> Result<verbs::Device> {
    crate::providers::open(args, &[], at)
}

pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::Serve {
            tcp,
            rdma,
            tcp_limits,
            rdma_limits,
        } => {
            let reg = Arc::new(demo::registry());
            let dev = device(&args.dev, crate::providers::Endpoint::Listen(rdma.ip()))?;
            let t = TcpServer::spawn_with(tcp, reg.clone(), tcp_limits.config()?)?;
            let r = RdmaServer::spawn(&dev, rdma, reg, rdma_limits.config()).map_err(|e| anyhow!("{e}"))?;
            println!(
                "serving program {:#x} version {} over TCP on {} and RPC-over-RDMA ({}) on {}",
                demo::PROGRAM,
                demo::VERSION,
                t.local_addr(),
                crate::providers::transport(&dev),
                r.local_addr()
            );
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Cmd::Call {
            transport,
            addr,
            proc_,
            size,
            count,
            timeout,
        } => {
            let size = size as usize;
            let t = Duration::from_secs(timeout);
            let tcp = transport == "tcp";
            let default = if tcp { "127.0.0.1:20048" } else { "127.0.0.1:20049" };
            let addr = addr.unwrap_or_else(|| default.parse().expect("a socket address"));
            let how = if tcp { "ONC RPC over TCP" } else { "RPC-over-RDMA" };
            let to = Target { addr, how, timeout };
            let connecting = Notice::new(format!(
                "rpc call: connecting to {addr} ({how}); giving up after {timeout} s (--timeout)"
            ));
            if tcp {
                let mut c = TcpClient::connect_timeout(addr, t).map_err(|e| to.connect_error(e))?;
                drop(connecting);
                c.set_timeout(t);
                call(&c, &to, &proc_, size, count)
            } else {
                let at = crate::providers::Endpoint::Connect {
                    dest: addr.ip(),
                    source: None,
                };
                let dev = device(&args.dev, at)?;
                let cfg = RdmaConfig {
                    timeout: t,
                    ..RdmaConfig::default()
                };
                let c = RdmaClient::connect(&dev.alloc_pd()?, addr, cfg).map_err(|e| to.connect_error(e))?;
                drop(connecting);
                call(&c, &to, &proc_, size, count)
            }
        }
        Cmd::Bench {
            size,
            proc_,
            transport,
            calls,
            threads,
            json,
            busy_poll,
        } if proc_ != "read" => {
            if threads != 1 {
                bail!("--proc {proc_} times one call at a time; drop --threads");
            }
            let size = if proc_ == "null" {
                0
            } else {
                size.unwrap_or(64) as usize
            };
            let mode = if busy_poll { Mode::BusyPoll } else { Mode::Events };
            bench_small(&args.dev, &proc_, size, &transport, calls.unwrap_or(20_000), json, mode)
        }
        Cmd::Bench { busy_poll: true, .. } => {
            bail!("--busy-poll is for --proc null|echo (READ bandwidth keeps the transports' default waits)")
        }
        Cmd::Bench {
            size,
            transport,
            calls,
            threads,
            json,
            ..
        } => bench(
            &args.dev,
            size.unwrap_or(1 << 20) as usize,
            &transport,
            calls,
            threads.max(1),
            json,
        ),
    }
}

/// The server `rpc call` talks to, for its messages.
struct Target {
    addr: SocketAddr,
    how: &'static str,
    timeout: u64,
}

impl Target {
    fn connect_error(&self, e: impl std::fmt::Display) -> anyhow::Error {
        anyhow!(
            "cannot connect to {} ({}): {e} (is `softrdma rpc serve` running there? --timeout {} s)",
            self.addr,
            self.how,
            self.timeout
        )
    }

    /// What a failed call means to the user: the limit it ran into, or what was waited for.
    fn call_error(&self, proc_: &str, size: usize, e: RpcError) -> anyhow::Error {
        let upper = proc_.to_uppercase();
        match e {
            RpcError::Timeout => anyhow!(
                "no reply to {upper} from {} ({}) within {} s (--timeout): the server accepted the \
                 connection but did not answer",
                self.addr,
                self.how,
                self.timeout
            ),
            RpcError::RdmaError(ErrorBody::Chunk) => anyhow!(
                "the server refused {upper}'s {size} bytes of call data (RDMA_ERROR ERR_CHUNK): more \
                 than its largest call (`rpc serve --rdma-max-call`, 8M by default; docs/server-limits.md)"
            ),
            RpcError::Accepted(AcceptStat::SystemErr) => anyhow!(
                "the server could not answer {upper} of {size} bytes (SYSTEM_ERR): the reply is larger \
                 than it sends (`rpc serve --rdma-max-reply` or --tcp-max-record; docs/server-limits.md)"
            ),
            e => anyhow!("{upper} of {size} bytes to {}: {e}", self.addr),
        }
    }
}

fn call<C: RpcClient>(c: &C, to: &Target, proc_: &str, size: usize, count: u32) -> Result<()> {
    for i in 0..count {
        let t = Instant::now();
        let waiting = Notice::new(format!(
            "rpc call: waiting for the reply to {} from {} (up to {} s, --timeout)",
            proc_.to_uppercase(),
            to.addr,
            to.timeout
        ));
        let fail = |e| to.call_error(proc_, size, e);
        match proc_ {
            "null" => demo::null(c).map_err(fail)?,
            "echo" => {
                let d = demo::pattern(size, i);
                if demo::echo(c, &d).map_err(fail)? != d {
                    bail!("ECHO returned different data");
                }
            }
            "read" => {
                if demo::read(c, size, i).map_err(fail)? != demo::pattern(size, i) {
                    bail!("READ returned wrong data");
                }
            }
            _ => {
                let d = demo::pattern(size, i);
                let (n, sum) = demo::write(c, &d).map_err(fail)?;
                if (n as usize, sum) != (size, demo::checksum(&d)) {
                    bail!("WRITE: server saw {n} bytes, checksum {sum:#x}");
                }
            }
        }
        drop(waiting);
        println!("{proc_} {size} bytes: ok in {:?}", t.elapsed());
    }
    Ok(())
}

/// `rpc bench --json` (docs/json.md, "rpc bench").
#[derive(serde::Serialize)]
struct RpcBenchJson {
    tool: &'static str,
    #[serde(rename = "proc")]
    proc_: &'static str,
    size: u64,
    calls: u64,
    threads: u32,
    /// null when the transport was not timed.
    tcp: Option<RpcRate>,
    rdma: Option<RpcRate>,
    rdma_tcp_ratio: Option<f64>,
    /// With both transports: the ratio of each alternating round (null otherwise).
    rounds: Option<RoundSpread>,
}

/// The RDMA/TCP ratios of `rpc bench --size`'s alternating rounds.
#[derive(serde::Serialize)]
struct RoundSpread {
    /// Rounds (each: [`BULK_ROUND_CALLS`] calls per caller on each transport).
    rounds: u64,
    min: f64,
    median: f64,
    max: f64,
}

/// `rpc bench --proc null|echo --json`: small calls' round trips (docs/json.md).
#[derive(serde::Serialize)]
struct RpcLatJson {
    tool: &'static str,
    #[serde(rename = "proc")]
    proc_: &'static str,
    size: u64,
    calls: u64,
    /// `"busy-poll"` or `"events"`: the one wait mode both callers used.
    mode: &'static str,
    /// How the callers wait for replies, in words.
    wait: &'static str,
    tcp: Option<crate::report::Latency>,
    rdma: Option<crate::report::Latency>,
    /// RDMA p50 over TCP p50 (lower is better); null unless both ran.
    rdma_tcp_ratio: Option<f64>,
}

/// How both callers of `rpc bench --proc null|echo` wait for their Replies (issue 18: the
/// RDMA and TCP round trips are compared in the same mode).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Both sleep at once: the RDMA caller in its completion queue (no spin first), the TCP
    /// caller in `read(2)` on a blocking socket.
    Events,
    /// Both spin: the RDMA caller polls its completion queue (driving the provider inline),
    /// the TCP caller `read(2)`s a non-blocking socket until the Reply is there.
    BusyPoll,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Events => "events",
            Mode::BusyPoll => "busy-poll",
        }
    }

    fn wait(self) -> &'static str {
        match self {
            Mode::Events => {
                "both callers sleep at once (rdma: in the CQ, no spin; tcp: blocking read by the caller); \
                 the servers' threads sleep"
            }
            Mode::BusyPoll => {
                "both callers busy-poll (rdma: the CQ, driving the provider; tcp: non-blocking read by the caller); \
                 the servers' threads sleep"
            }
        }
    }

    /// The RDMA caller's busy-poll budget ([`RdmaConfig::reply_spin`]).
    fn reply_spin(self) -> std::time::Duration {
        match self {
            Mode::Events => std::time::Duration::ZERO,
            Mode::BusyPoll => std::time::Duration::MAX,
        }
    }

    fn tcp_wait(self) -> rpcrdma::tcp::TcpWait {
        match self {
            Mode::Events => rpcrdma::tcp::TcpWait::Block,
            Mode::BusyPoll => rpcrdma::tcp::TcpWait::BusyPoll,
        }
    }
}

/// One small call (NULL, or ECHO of `data`, checked).
fn small_call<C: RpcClient>(c: &C, data: Option<&[u8]>) -> Result<()> {
    match data {
        None => demo::null(c)?,
        Some(d) => {
            if demo::echo(c, d)? != d {
                bail!("ECHO returned different data");
            }
        }
    }
    Ok(())
}

/// The loopback servers `rpc bench` measures against: ONC RPC over TCP unless `transport` is
/// `rdma`, RPC-over-RDMA on `dev` unless it is `tcp`.
fn bench_servers(
    dev: &verbs::Device,
    reg: &Arc<rpcrdma::server::Registry>,
    transport: &str,
) -> Result<(Option<TcpServer>, Option<RdmaServer>)> {
    let tcp = if transport != "rdma" {
        Some(TcpServer::spawn("127.0.0.1:0".parse()?, reg.clone())?)
    } else {
        None
    };
    let rdma = if transport != "tcp" {
        Some(
            RdmaServer::spawn(dev, "127.0.0.1:0".parse()?, reg.clone(), RdmaConfig::default())
                .map_err(|e| anyhow!("{e}"))?,
        )
    } else {
        None
    };
    Ok((tcp, rdma))
}

/// Round trips of `calls` NULL or ECHO calls per transport, one at a time; with both
/// transports, batches of 100 alternate so that both see the same machine load.
fn bench_small(
    dev: &crate::providers::DeviceArgs,
    proc_: &str,
    size: usize,
    transport: &str,
    calls: u64,
    json: bool,
    mode: Mode,
) -> Result<()> {
    use hdrhistogram::Histogram;
    let data = (proc_ == "echo").then(|| demo::pattern(size, 1));
    let data = data.as_deref();
    let reg = Arc::new(demo::registry());
    let dev = device(dev, crate::providers::Endpoint::Listen([127, 0, 0, 1].into()))?;
    let new_hist = || Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
    let (tcp_srv, rdma_srv) = bench_servers(&dev, &reg, transport)?;
    let tcp = match &tcp_srv {
        // the caller reads its own Reply, as the RDMA caller does (no reader thread)
        Some(s) => Some(TcpCaller::connect(s.local_addr(), mode.tcp_wait())?),
        None => None,
    };
    let rdma = match &rdma_srv {
        Some(s) => {
            let pd = dev.alloc_pd().map_err(|e| anyhow!("{e}"))?;
            let cfg = RdmaConfig {
                reply_spin: mode.reply_spin(),
                ..RdmaConfig::default()
            };
            Some(RdmaClient::connect(&pd, s.local_addr(), cfg).map_err(|e| anyhow!("{e}"))?)
        }
        None => None,
    };
    fn batch<C: RpcClient>(c: &C, data: Option<&[u8]>, n: u64, h: &mut Histogram<u64>) -> Result<()> {
        for _ in 0..n {
            let t = Instant::now();
            small_call(c, data)?;
            h.record((t.elapsed().as_nanos() as u64).max(1))?;
        }
        Ok(())
    }
    let (mut ht, mut hr) = (new_hist(), new_hist());
    // warm-up
    if let Some(c) = &tcp {
        batch(c, data, 100, &mut new_hist())?;
    }
    if let Some(c) = &rdma {
        batch(c, data, 100, &mut new_hist())?;
    }
    let mut done = 0;
    while done < calls {
        let n = (calls - done).min(100);
        if let Some(c) = &tcp {
            batch(c, data, n, &mut ht)?;
        }
        if let Some(c) = &rdma {
            batch(c, data, n, &mut hr)?;
        }
        done += n;
    }
    let lat = |h: &Histogram<u64>| (!h.is_empty()).then(|| crate::report::Latency::of_ns(h));
    let (t, r) = (lat(&ht), lat(&hr));
    let ratio = match (&r, &t) {
        (Some(r), Some(t)) if t.p50_us > 0.0 => Some(r.p50_us / t.p50_us),
        _ => None,
    };
    let proc_ = if proc_ == "null" { "NULL" } else { "ECHO" };
    let wait = mode.wait();
    if json {
        crate::report::print_line(&RpcLatJson {
            tool: "rpc bench",
            proc_,
            size: size as u64,
            calls,
            mode: mode.name(),
            wait,
            tcp: t,
            rdma: r,
            rdma_tcp_ratio: ratio,
        });
    } else {
        println!(
            "{proc_} of {size} bytes, {calls} calls one at a time, mode {} ({wait}):",
            mode.name()
        );
        for (name, l) in [("ONC RPC over TCP:", &t), ("RPC-over-RDMA:   ", &r)] {
            if let Some(l) = l {
                println!(
                    "  {name} p50 {:8.1} us  p99 {:8.1} us  p99.9 {:8.1} us",
                    l.p50_us, l.p99_us, l.p999_us
                );
            }
        }
        if let Some(x) = ratio {
            println!("  RDMA / TCP (p50) = {x:.2}");
        }
    }
    Ok(())
}

/// One transport's result: the bandwidth of the READ data, and calls per second.
#[derive(serde::Serialize)]
struct RpcRate {
    #[serde(flatten)]
    bw: Bandwidth,
    calls_per_s: f64,
}

/// Calls of one round of `rpc bench --size` per caller when both transports run: each
/// transport runs this many calls per caller, then the other, until `--calls` are done, so
/// that both see the same minutes of machine load (issue 18: one transport's phase used to
/// run whole before the other's, and a burst of other work in either phase moved the ratio
/// 0.4-8.4 between runs of one binary at load 3-15).
const BULK_ROUND_CALLS: u64 = 25;

/// Seconds taken by READs of `size` number `first..first + per` on each of `clients` at once
/// (each caller its own thread). With `bar`, each call counts.
fn time_reads<C: RpcClient + Sync>(
    clients: &[C],
    size: usize,
    first: u64,
    per: u64,
    bar: Option<&indicatif::ProgressBar>,
) -> Result<f64> {
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = clients
            .iter()
            .map(|c| {
                s.spawn(move || -> Result<()> {
                    for i in first..first + per {
                        // checked in place, not copied out (the same for both transports)
                        if demo::read_checked(c, size, i as u32)? != size {
                            bail!("short READ");
                        }
                        if let Some(b) = bar {
                            b.inc(1);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow!("caller panicked"))??;
        }
        Ok(())
    })?;
    Ok(t.elapsed().as_secs_f64())
}

/// One transport's callers and what they have taken so far.
struct Timed<C> {
    clients: Vec<C>,
    /// Seconds of all rounds so far.
    secs: f64,
}

impl<C: RpcClient + Sync> Timed<C> {
    fn new(clients: Vec<C>, size: usize) -> Result<Self> {
        // warm up each connection
        for c in &clients {
            demo::read(c, size, 0)?;
        }
        Ok(Timed { clients, secs: 0.0 })
    }

    /// Run one round; its bandwidth in bytes per second.
    fn round(&mut self, size: usize, first: u64, per: u64, bar: Option<&indicatif::ProgressBar>) -> Result<f64> {
        let secs = time_reads(&self.clients, size, first, per, bar)?;
        self.secs += secs;
        Ok((per * self.clients.len() as u64 * size as u64) as f64 / secs)
    }
}

fn bench(
    dev: &crate::providers::DeviceArgs,
    size: usize,
    transport: &str,
    calls: Option<u64>,
    threads: u32,
    json: bool,
) -> Result<()> {
    let calls = calls.unwrap_or_else(|| ((512u64 << 20) / size.max(1) as u64).clamp(20, 100_000));
    // Each caller: a TCP connection (two descriptors) and the server's end, or an RDMA
    // connection and the server's end; measured at about 3.5 per caller, plus the process's own.
    let need = FDS_PER_THREAD * threads as u64 + 64;
    if let Some(limit) = crate::fdlimit::raise()
        && limit < need
    {
        bail!(
            "--threads {threads} needs about {need} file descriptors ({FDS_PER_THREAD} per caller), \
             more than this process may open (ulimit -n: {limit}); use at most {} callers or raise the limit",
            limit.saturating_sub(64) / FDS_PER_THREAD
        );
    }
    let reg = Arc::new(demo::registry());
    let dev = device(dev, crate::providers::Endpoint::Listen([127, 0, 0, 1].into()))?;
    let progress = crate::progress::wanted(false, json);
    let per = calls.div_ceil(threads as u64);
    let (tcp_srv, rdma_srv) = bench_servers(&dev, &reg, transport)?;
    let mut tcp = match &tcp_srv {
        Some(srv) => {
            let cs: Vec<TcpClient> = (0..threads)
                .map(|_| TcpClient::connect(srv.local_addr()))
                .collect::<std::io::Result<_>>()?;
            Some(Timed::new(cs, size)?)
        }
        None => None,
    };
    let mut rdma = match &rdma_srv {
        Some(srv) => {
            let cs: Vec<RdmaClient> = (0..threads)
                .map(|_| {
                    let pd = dev.alloc_pd().map_err(|e| anyhow!("{e}"))?;
                    RdmaClient::connect(&pd, srv.local_addr(), RdmaConfig::default()).map_err(|e| anyhow!("{e}"))
                })
                .collect::<Result<_, _>>()?;
            Some(Timed::new(cs, size)?)
        }
        None => None,
    };
    let both = tcp.is_some() && rdma.is_some();
    let bar = progress
        .then(|| {
            let n = per * threads as u64 * if both { 2 } else { 1 };
            crate::progress::count(true, format!("rpc bench {transport}"), n)
        })
        .flatten();
    // with both transports, rounds alternate (TCP first in odd rounds, RDMA first in even
    // ones); one transport alone runs its calls in one round
    let round = if both { BULK_ROUND_CALLS } else { per };
    let mut round_ratios = Vec::new();
    let mut done = 0;
    let mut k = 0;
    while done < per {
        let n = (per - done).min(round);
        let (mut t, mut r) = (None, None);
        for tcp_turn in [k % 2 == 0, k % 2 != 0] {
            if tcp_turn {
                if let Some(x) = tcp.as_mut() {
                    t = Some(x.round(size, 1 + done, n, bar.as_ref())?);
                }
            } else if let Some(x) = rdma.as_mut() {
                r = Some(x.round(size, 1 + done, n, bar.as_ref())?);
            }
        }
        if let (Some(t), Some(r)) = (t, r) {
            round_ratios.push(r / t);
        }
        done += n;
        k += 1;
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let total = (per * threads as u64 * size as u64) as f64;
    let tcp_bps = tcp.as_ref().map(|x| total / x.secs);
    let rdma_bps = rdma.as_ref().map(|x| total / x.secs);
    drop((tcp, rdma, tcp_srv, rdma_srv));
    let spread = (!round_ratios.is_empty()).then(|| {
        let mut v = round_ratios;
        v.sort_by(f64::total_cmp);
        RoundSpread {
            rounds: v.len() as u64,
            min: v[0],
            median: v[v.len() / 2],
            max: v[v.len() - 1],
        }
    });
    let ratio = match (rdma_bps, tcp_bps) {
        (Some(r), Some(t)) if t > 0.0 => Some(r / t),
        _ => None,
    };
    let rate = |b: Option<f64>| {
        b.map(|b| RpcRate {
            bw: Bandwidth::of_bytes_per_s(b),
            calls_per_s: b / size.max(1) as f64,
        })
    };
    if json {
        crate::report::print_line(&RpcBenchJson {
            tool: "rpc bench",
            proc_: "READ",
            size: size as u64,
            calls,
            threads,
            tcp: rate(tcp_bps),
            rdma: rate(rdma_bps),
            rdma_tcp_ratio: ratio,
            rounds: spread,
        });
    } else {
        println!("READ of {size} bytes, {calls} calls, {threads} caller(s):");
        if let Some(t) = rate(tcp_bps) {
            println!(
                "  ONC RPC over TCP:            {:10.1} MB/sec {:8.2} Gb/sec",
                t.bw.mb_per_s, t.bw.gbit_per_s
            );
        }
        if let Some(r) = rate(rdma_bps) {
            println!(
                "  RPC-over-RDMA (write chunk): {:10.1} MB/sec {:8.2} Gb/sec",
                r.bw.mb_per_s, r.bw.gbit_per_s
            );
        }
        if let Some(x) = ratio {
            println!("  RDMA / TCP = {x:.2}");
        }
        if let Some(s) = &spread {
            println!(
                "  {} alternating rounds of {BULK_ROUND_CALLS} calls per caller: RDMA / TCP min {:.2} median {:.2} max {:.2}",
                s.rounds, s.min, s.median, s.max
            );
        }
    }
    Ok(())
}
