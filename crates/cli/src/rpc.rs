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
use rpcrdma::client::RpcClient;
use rpcrdma::demo;
use rpcrdma::tcp::{TcpClient, TcpServer, TcpServerConfig};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::units::parse_size;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Serve the demo program (0x20000099: NULL, ECHO, READ, WRITE) over ONC RPC on TCP
    /// (record marking) and over RPC-over-RDMA v1 on iWARP at the same time, until interrupted.
    Serve {
        /// Address of the ONC RPC over TCP listener.
        #[arg(long, default_value = "127.0.0.1:20048")]
        tcp: SocketAddr,
        /// Address of the RPC-over-RDMA (iWARP) listener; 20049 is NFS/RDMA's port.
        #[arg(long, default_value = "127.0.0.1:20049")]
        rdma: SocketAddr,
        #[command(flatten)]
        tcp_limits: TcpLimits,
        #[command(flatten)]
        rdma_limits: RdmaLimits,
    },
    /// Make calls to a running `softrdma rpc serve`.
    Call {
        /// Transport: ONC RPC over TCP, or RPC-over-RDMA on iWARP.
        #[arg(long, default_value = "rdma", value_parser = ["tcp", "rdma"])]
        transport: String,
        /// Server address (default: the serve defaults for the chosen transport).
        #[arg(long)]
        addr: Option<SocketAddr>,
        /// Procedure: null, echo (data both ways), read (SIZE bytes back, through a write
        /// chunk over RDMA when large), write (SIZE bytes out, through a read chunk).
        #[arg(long, default_value = "read", value_parser = ["null", "echo", "read", "write"])]
        proc_: String,
        /// Bytes of bulk data per call; K, M suffixes.
        #[arg(long, value_parser = parse_size, default_value = "4K")]
        size: u64,
        /// Number of calls.
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Time READ calls over TCP and/or RDMA (servers started in-process on loopback).
    Bench {
        /// READ reply size in bytes (over RDMA, moved by a write chunk); K, M suffixes.
        #[arg(long, value_parser = parse_size, default_value = "1M")]
        size: u64,
        /// Which transports to time; `both` prints the RDMA/TCP ratio.
        #[arg(long, default_value = "both", value_parser = ["tcp", "rdma", "both"])]
        transport: String,
        /// Calls per transport (default: enough for 512 MiB, at least 20).
        #[arg(long)]
        calls: Option<u64>,
        /// Concurrent callers (one connection each).
        #[arg(long, default_value_t = 1)]
        threads: u32,
        /// One JSON object with both transports' MiB/s and the ratio.
        #[arg(long)]
        json: bool,
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

fn device() -> Result<verbs::Device> {
    crate::providers::open(None, &verbs::DeviceOptions::new())
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
            let dev = device()?;
            let t = TcpServer::spawn_with(tcp, reg.clone(), tcp_limits.config()?)?;
            let r = RdmaServer::spawn(&dev, rdma, reg, rdma_limits.config()).map_err(|e| anyhow!("{e}"))?;
            println!(
                "serving program {:#x} version {} over TCP on {} and RPC-over-RDMA (iWARP) on {}",
                demo::PROGRAM,
                demo::VERSION,
                t.local_addr(),
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
        } => {
            let size = size as usize;
            if transport == "tcp" {
                let c = TcpClient::connect(addr.unwrap_or_else(|| "127.0.0.1:20048".parse().unwrap()))?;
                call(&c, &proc_, size, count)
            } else {
                let dev = device()?;
                let addr = addr.unwrap_or_else(|| "127.0.0.1:20049".parse().unwrap());
                let c = RdmaClient::connect(&dev.alloc_pd()?, addr, RdmaConfig::default())?;
                call(&c, &proc_, size, count)
            }
        }
        Cmd::Bench {
            size,
            transport,
            calls,
            threads,
            json,
        } => bench(size as usize, &transport, calls, threads.max(1), json),
    }
}

fn call<C: RpcClient>(c: &C, proc_: &str, size: usize, count: u32) -> Result<()> {
    for i in 0..count {
        let t = Instant::now();
        match proc_ {
            "null" => demo::null(c)?,
            "echo" => {
                let d = demo::pattern(size, i);
                if demo::echo(c, &d)? != d {
                    bail!("ECHO returned different data");
                }
            }
            "read" => {
                if demo::read(c, size, i)? != demo::pattern(size, i) {
                    bail!("READ returned wrong data");
                }
            }
            _ => {
                let d = demo::pattern(size, i);
                let (n, sum) = demo::write(c, &d)?;
                if (n as usize, sum) != (size, demo::checksum(&d)) {
                    bail!("WRITE: server saw {n} bytes, checksum {sum:#x}");
                }
            }
        }
        println!("{proc_} {size} bytes: ok in {:?}", t.elapsed());
    }
    Ok(())
}

/// Bytes per second of `calls` READs of `size` over `threads` clients.
fn time_reads<C: RpcClient + Sync>(clients: &[C], size: usize, calls: u64) -> Result<f64> {
    // warm up each connection
    for c in clients {
        demo::read(c, size, 0)?;
    }
    let per = calls.div_ceil(clients.len() as u64);
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = clients
            .iter()
            .map(|c| {
                s.spawn(move || -> Result<()> {
                    for i in 0..per {
                        // checked in place, not copied out (the same for both transports)
                        if demo::read_checked(c, size, i as u32)? != size {
                            bail!("short READ");
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
    Ok((per * clients.len() as u64 * size as u64) as f64 / t.elapsed().as_secs_f64())
}

fn bench(size: usize, transport: &str, calls: Option<u64>, threads: u32, json: bool) -> Result<()> {
    let calls = calls.unwrap_or_else(|| ((512u64 << 20) / size.max(1) as u64).clamp(20, 100_000));
    let reg = Arc::new(demo::registry());
    let dev = device()?;
    let mut tcp_bps = None;
    let mut rdma_bps = None;
    if transport != "rdma" {
        let srv = TcpServer::spawn("127.0.0.1:0".parse()?, reg.clone())?;
        let cs: Vec<TcpClient> = (0..threads)
            .map(|_| TcpClient::connect(srv.local_addr()))
            .collect::<std::io::Result<_>>()?;
        tcp_bps = Some(time_reads(&cs, size, calls)?);
    }
    if transport != "tcp" {
        let srv = RdmaServer::spawn(&dev, "127.0.0.1:0".parse()?, reg.clone(), RdmaConfig::default())
            .map_err(|e| anyhow!("{e}"))?;
        let cs: Vec<RdmaClient> = (0..threads)
            .map(|_| {
                let pd = dev.alloc_pd().map_err(|e| anyhow!("{e}"))?;
                RdmaClient::connect(&pd, srv.local_addr(), RdmaConfig::default()).map_err(|e| anyhow!("{e}"))
            })
            .collect::<Result<_, _>>()?;
        rdma_bps = Some(time_reads(&cs, size, calls)?);
    }
    let ratio = match (rdma_bps, tcp_bps) {
        (Some(r), Some(t)) if t > 0.0 => Some(r / t),
        _ => None,
    };
    let mib = |b: Option<f64>| b.map(|b| b / (1 << 20) as f64);
    if json {
        let f = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v:.3}"));
        println!(
            "{{\"proc\":\"READ\",\"size\":{size},\"calls\":{calls},\"threads\":{threads},\"tcp_mib_s\":{},\"rdma_mib_s\":{},\"rdma_tcp_ratio\":{}}}",
            f(mib(tcp_bps)),
            f(mib(rdma_bps)),
            f(ratio)
        );
    } else {
        println!("READ of {size} bytes, {calls} calls, {threads} caller(s):");
        if let Some(t) = mib(tcp_bps) {
            println!("  ONC RPC over TCP:           {t:10.1} MiB/s");
        }
        if let Some(r) = mib(rdma_bps) {
            println!("  RPC-over-RDMA (write chunk): {r:10.1} MiB/s");
        }
        if let Some(x) = ratio {
            println!("  RDMA / TCP = {x:.2}");
        }
    }
    Ok(())
}
