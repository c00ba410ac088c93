//! `softrdma perftest`: linux-rdma perftest's `ib_{send,write,read}_{bw,lat} -R` (rdma_cm
//! mode) exchange, so that either end can be perftest over Linux soft-iWARP (or any iWARP
//! RNIC) and the other softrdma.
//!
//! What perftest 6.06 (Debian's 4.5+0.17) does with `-R` (perftest_communication.c,
//! perftest_resources.c, the tests' main functions; docs/interop-perftest.md has the details
//! and a capture):
//!
//! 1. **comm connection**: a first rdma_cm RC connection to the port (`establish_connection` →
//!    `rdma_client_connect` / `rdma_server_connect`), IRD = ORD = 0, no private data. All
//!    control messages are Sends on it, each side with one 56-byte receive posted, client
//!    first in every exchange (`ctx_xchg_data_rdma`, `ctx_hand_shake`). The server's listener
//!    is destroyed once this connection is accepted.
//! 2. version (16 bytes), cycle buffer and cache line size (4 + 4), MTU (2); see [`wire`].
//! 3. `create_rdma_cm_connection`: one exchange of `pingpong_dest` (all zero), then the
//!    **data connection** on the same port (the server listens anew, the client retries
//!    `rdma_connect` up to 10 times while it is refused), IRD = ORD = out_reads for Read
//!    tests and 0 otherwise, then another exchange.
//! 4. the QP addresses (`pingpong_dest`) several times, test-specific (see [`Test::preamble`]),
//!    for `ib_send_bw` with the iWARP credit word's address in place of the buffer.
//! 5. the traffic, then test-specific closing exchanges: bandwidth reports for
//!    write/read bw (the server prints the client's figures), one last `pingpong_dest`
//!    (`ctx_close_connection`) except in `ib_write_lat`, which has none.
//!
//! Server resource model (issue 12): one client at a time — the listener is dropped once
//! the comm connection is accepted (a second client's connect is refused) and a fresh one
//! takes the data connection; `--timeout` (60 s) bounds every step, so a silent client is
//! dropped with a message naming its QP and address; a session that ends early (peer
//! closed, reset, Terminate) is reported with the cause, QP and address, and exits non-zero.

mod bw;
mod comm;
mod completion;
mod data;
mod lat;
mod report;
mod session;
mod ud;
pub mod wire;

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use lat::LatReport;
use session::session;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use verbs::*;
use wire::BwReport;

const HELP: &str = "\
perftest's own exchange (rdma_cm mode, -R) rather than `softrdma bench`'s: use this to measure
against perftest (ib_write_bw -R ... on a Linux host with siw or an iWARP RNIC), or between two
softrdma hosts exactly as perftest would. One program per test as in perftest, perftest's option
letters, server mode when no SERVER is given. -R is implied (perftest's socket exchange is not
implemented). Both ends must be given the same -s, -n (and -r for send tests), as with perftest.

Examples:
  softrdma perftest write_bw                       # server, like `ib_write_bw -R`
  softrdma perftest write_bw 192.168.77.2 -s 4096  # client of `ib_write_bw -R -d siw0` there
  softrdma perftest send_lat 10.0.0.1 -n 1000 --json

Verification: completions must all succeed with the expected counts and lengths; ib_write_lat's
ping-pong byte is checked on every iteration. When both ends are softrdma (recognised by a marker
after perftest's version string) payloads carry a pattern that the receiving side checks
(write_bw reads the target back over the same QP after the last Write).";

/// perftest's test programs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    #[value(name = "send_bw")]
    SendBw,
    #[value(name = "write_bw")]
    WriteBw,
    #[value(name = "read_bw")]
    ReadBw,
    #[value(name = "send_lat")]
    SendLat,
    #[value(name = "write_lat")]
    WriteLat,
    #[value(name = "read_lat")]
    ReadLat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    Send,
    Write,
    Read,
}

impl Test {
    fn name(self) -> &'static str {
        match self {
            Test::SendBw => "send_bw",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendLat => "send_lat",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
        }
    }
    fn verb(self) -> Verb {
        match self {
            Test::SendBw | Test::SendLat => Verb::Send,
            Test::WriteBw | Test::WriteLat => Verb::Write,
            Test::ReadBw | Test::ReadLat => Verb::Read,
        }
    }
    fn bw(self) -> bool {
        matches!(self, Test::SendBw | Test::WriteBw | Test::ReadBw)
    }
    fn title(self) -> &'static str {
        match self {
            Test::SendBw => "Send BW Test",
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
        }
    }
    /// The exchanges between the data connection's sync and the traffic, as in each test's
    /// main(): `D` sends our real `pingpong_dest` and takes the peer's.
    fn preamble(self) -> usize {
        match self {
            // write_bw.c/read_bw.c: per-QP dest, per-QP dest again ("remote address"), one more
            // "after moving qp to RTR".
            Test::WriteBw | Test::ReadBw => 3,
            // write_lat.c/read_lat.c: one more before the per-QP ones.
            Test::WriteLat | Test::ReadLat => 4,
            // send_bw.c/send_lat.c: per-QP dest, one, per-QP dest; then (after the receiver posts
            // its receives) one more right before the traffic.
            Test::SendBw | Test::SendLat => 3,
        }
    }
}

/// perftest's `-c` connection types that `softrdma perftest` speaks.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Connection {
    /// Reliable connected (perftest's default).
    #[default]
    #[value(name = "RC")]
    Rc,
    /// Unreliable datagram (send_bw and send_lat; RoCE only): the data QP is found with
    /// rdma_cm's UDP port space (SIDR), messages are at most the path MTU.
    #[value(name = "UD")]
    Ud,
}

/// `softrdma perftest`: perftest-compatible tests (rdma_cm mode).
#[derive(ClapArgs, Debug, Clone)]
#[command(after_help = HELP, disable_version_flag = true)]
pub struct Args {
    /// The test: perftest's program name without `ib_`.
    #[arg(value_enum)]
    pub test: Test,
    /// Server to connect to; without it, wait for one client (as perftest does).
    pub server: Option<String>,
    /// rdma_cm mode (always on; accepted for perftest's command line).
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Listen on / connect to this port. A server given 0 listens on a port the system
    /// chooses and prints it on stderr (`perftest server: listening on ADDR:PORT`).
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Message size in bytes; K, M, G suffixes (powers of 1024) [default: 65536 for bw, 2 for lat].
    #[arg(short = 's', long = "size", value_parser = crate::units::parse_size)]
    pub size: Option<u64>,
    /// Iterations [default: 5000 for write_bw, 1000 otherwise].
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Send queue depth [default: 128 for bw, 1 for lat; at most -n].
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Receive queue depth of send tests [default: 512; at most -n, rounded up to even]. Must
    /// match the peer's: the sender never has more Sends outstanding than this beyond the
    /// receiver's credit.
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// Outstanding Reads (IRD/ORD of Read tests) [default: 128, the device maximum].
    #[arg(short = 'o', long = "outs")]
    pub out_reads: Option<u32>,
    /// Connection type of the data QP, as perftest's -c: RC, or UD for send_bw/send_lat.
    #[arg(short = 'c', long = "connection", value_enum, default_value_t = Connection::Rc)]
    pub connection: Connection,
    /// Number of QPs (only 1 is implemented).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Device to use, by name as `softrdma devices` lists it (default: the provider's; the
    /// same as --device).
    #[arg(short = 'd', long = "ib-dev", conflicts_with = "device")]
    pub ib_dev: Option<String>,
    /// The device: --provider iwarp|roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    pub dev: crate::providers::DeviceArgs,
    /// Report with the CPU's nominal frequency (accepted and ignored: softrdma uses the monotonic clock).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Server: the address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// iWARP: ask for MPA CRC32c (used if either side asks; refused on other providers).
    #[arg(long, value_parser = ["on", "off"])]
    pub crc: Option<String>,
    /// Client: wait this long after the comm connection is established before the first
    /// Send. Linux 6.1's siw as responder misses an FPDU that arrives right after its MPA
    /// Reply (see docs/interop-siw.md); 0 sends at once.
    #[arg(long, default_value_t = 50)]
    pub first_send_delay_ms: u64,
    /// Wait this long after the address exchange before the traffic (hidden: tests use it to
    /// stand for a descheduled end, e.g. a read_bw server that is slow after the exchange).
    #[arg(long, default_value_t = 0, hide = true)]
    pub pause_after_exchange_ms: u64,
    /// Give up when a step (connection, message, completion) takes longer than this many seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Client: retry a refused connect (the server not listening yet) for this many seconds,
    /// at most --timeout.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
}

/// The parameters both ends derive from the same command line (perftest_parameters.c
/// `init_perftest_params` / `force_dependecies`).
#[derive(Debug, Clone, Copy)]
struct Params {
    test: Test,
    size: u64,
    iters: u64,
    tx_depth: u32,
    rx_depth: u32,
    out_reads: u32,
    /// `BUFF_SIZE(size, cycle_buffer)`: each half of the data region.
    half: usize,
    /// `-c UD`: a UD data QP (ud.rs).
    ud: bool,
    /// `-s` was given: with UD, a size above the MTU is then an error rather than cut to
    /// the MTU (`check_mtu`).
    size_given: bool,
    /// The MTU both ends settled on (`check_mtu`: the smaller of the two), in octets.
    mtu: u32,
    /// The device speaks iWARP: ib_send_bw then runs with `send_rcredit` (the receiver grants
    /// credits by RDMA Write, send_bw.c sets it for `IBV_TRANSPORT_IWARP` only). On the IB
    /// transport (RoCE) the sender just sends and RNR NAKs pace it.
    iwarp: bool,
}

const CYCLE_BUFFER: i32 = 4096;
const CACHE_LINE: i32 = 64;
/// On iWARP we state siw's MTU (1024, `IBV_MTU_1024`), which iWARP does not use; on RoCE
/// the port's active MTU.
const MTU: u32 = 1024;
const MAX_OUT_READS: u32 = 128;

impl Params {
    fn new(a: &Args) -> Result<Params> {
        if a.qps != 1 {
            bail!("-q {}: only one QP is implemented", a.qps);
        }
        let t = a.test;
        let ud = a.connection == Connection::Ud;
        if ud && t.verb() != Verb::Send {
            bail!(
                "-c UD: only send_bw and send_lat (perftest's {} has no UD mode)",
                t.name()
            );
        }
        let size = a.size.unwrap_or(if t.bw() { 65536 } else { 2 });
        if size == 0 || size > (1 << 30) {
            bail!("-s {size}: the size must be 1 byte to 1 GiB");
        }
        let iters = a.iters.unwrap_or(if t == Test::WriteBw { 5000 } else { 1000 });
        if iters < 5 {
            bail!("-n {iters}: at least 5 iterations (perftest's latency report drops the 2 largest of n-1 samples)");
        }
        let mut tx_depth = a.tx_depth.unwrap_or(if t.bw() { 128 } else { 1 }).max(1);
        if tx_depth as u64 > iters {
            tx_depth = iters as u32;
        }
        let mut rx_depth = 1;
        if t.verb() == Verb::Send {
            rx_depth = a.rx_depth.unwrap_or(512).max(1);
            if rx_depth as u64 > iters {
                rx_depth = iters as u32;
            }
            // "WA for a bug when rx_depth is odd in SEND".
            if rx_depth % 2 == 1 {
                rx_depth += 1;
            }
        }
        let out_reads = if t.verb() == Verb::Read {
            a.out_reads.unwrap_or(MAX_OUT_READS).clamp(1, MAX_OUT_READS)
        } else {
            1
        };
        Ok(Params {
            test: t,
            size,
            iters,
            tx_depth,
            rx_depth,
            out_reads,
            half: (size as usize).max(CYCLE_BUFFER as usize),
            ud,
            size_given: a.size.is_some(),
            mtu: MTU,
            iwarp: true,
        })
    }
}

impl Params {
    /// Octets before the payload in a receive: the GRH area on UD (`UD_ADDITION`), else 0.
    fn grh(&self) -> usize {
        if self.ud { ud::GRH_LEN } else { 0 }
    }
}

/// Runs `softrdma perftest`.
pub fn run(args: Args) -> Result<()> {
    let mut p = Params::new(&args)?;
    use crate::providers::{Endpoint, Flag};
    let mut d = args.dev.clone();
    if args.ib_dev.is_some() {
        d.device = args.ib_dev.clone();
    }
    p.iwarp = crate::providers::transport_of(&d)? == verbs::Transport::Iwarp;
    if p.ud && p.iwarp {
        bail!("-c UD: iWARP has no unreliable datagrams (use --provider roce)");
    }
    let flags: Vec<Flag> = Flag::crc(args.crc.as_deref()).into_iter().collect();
    let role = match &args.server {
        Some(host) => Role::Client(resolve(host, args.port)?),
        None => Role::Server(SocketAddr::new(args.bind, args.port)),
    };
    let at = match role {
        Role::Client(a) => Endpoint::Connect {
            dest: a.ip(),
            source: None,
        },
        Role::Server(a) => Endpoint::Listen(a.ip()),
    };
    let dev = crate::providers::open(&d, &flags, at)?;
    let out = session(&dev, &args, p, role)?;
    out.print(&args);
    Ok(())
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host:?}"))?
        .find(|a| a.is_ipv4())
        .context("no IPv4 address (perftest's rdma_cm mode is AF_INET only)")
}

#[derive(Clone, Copy)]
enum Role {
    Client(SocketAddr),
    Server(SocketAddr),
}

// ---------------------------------------------------------------------------------------
// The session

/// What one run measured, for printing.
struct Outcome {
    peer: String,
    role: &'static str,
    measured: Measured,
    /// The parameters as run (UD may have cut the size to the MTU).
    p: Params,
}

enum Measured {
    Bw {
        report: BwReport,
        /// The figures are the peer's (write/read bw server, as perftest's server prints).
        from_peer: bool,
        verified: String,
    },
    Lat {
        lat: LatReport,
        verified: String,
    },
    /// read_lat server: the client measures.
    Nothing,
}

struct Data {
    qp: QueuePair,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    mr: MemoryRegion,
    credit: Option<MemoryRegion>,
    /// `-c UD`: where this side's Sends go (the client's from the SIDR_REP; the server's, in
    /// send_lat, from the client's first datagram). `None` on RC and for the send_bw server.
    ud: Option<UdDest>,
}

impl Data {
    /// A Send of the test, addressed when the data QP is UD.
    fn wr(&self, wr: SendWr) -> SendWr {
        match &self.ud {
            Some(dest) => wr.ud(dest.clone()),
            None => wr,
        }
    }
}

/// Instants `us` microseconds after `base`: the timestamps of the report tests.
#[cfg(test)]
fn at(base: std::time::Instant, us: &[u64]) -> Vec<std::time::Instant> {
    us.iter().map(|u| base + std::time::Duration::from_micros(*u)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn params_follow_perftest_defaults() {
        let a = |test, iters: Option<u64>| Args {
            test,
            server: None,
            rdma_cm: true,
            port: 18515,
            size: None,
            iters,
            tx_depth: None,
            rx_depth: None,
            out_reads: None,
            qps: 1,
            ib_dev: None,
            dev: Default::default(),
            cpu_freq: false,
            json: false,
            bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            crc: None,
            connection: Connection::Rc,
            first_send_delay_ms: 0,
            pause_after_exchange_ms: 0,
            timeout: 1,
            connect_timeout: 1,
        };
        let w = Params::new(&a(Test::WriteBw, None)).unwrap();
        assert_eq!((w.size, w.iters, w.tx_depth, w.out_reads), (65536, 5000, 128, 1));
        let s = Params::new(&a(Test::SendBw, Some(101))).unwrap();
        assert_eq!((s.rx_depth, s.tx_depth), (102, 101)); // clipped to iters, then made even
        let l = Params::new(&a(Test::ReadLat, None)).unwrap();
        assert_eq!(
            (l.size, l.iters, l.tx_depth, l.out_reads, l.half),
            (2, 1000, 1, 128, 4096)
        );
        assert!(Params::new(&a(Test::SendLat, Some(3))).is_err());
        let mut q = a(Test::SendBw, None);
        q.qps = 2;
        assert!(Params::new(&q).is_err());
    }
}
