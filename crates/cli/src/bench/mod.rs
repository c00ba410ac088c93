//! `softrdma bench`: perftest-style benchmarks over the verbs API.
//!
//! The client (the side that posts the measured work requests) connects
//! `--qps` queue pairs, one TCP connection each. The server learns what to do
//! from the MPA private data of each connect request (a 48-byte [`Hello`]:
//! operation, size, depth, latency mode, the client's buffer) and answers in
//! the accept's private data (a [`Reply`]: its buffer's address and STag,
//! receive credits for Send, and the port of its plain-TCP baseline listener).
//! One test (one size of a sweep) is one set of connections; the client ends
//! a test by RDMA-Writing its [`Report`] (what it measured) into the server's
//! buffer on each QP and then disconnecting, and the server ends its session
//! after the test flagged as the last one. The server prints the report as
//! perftest's server prints its client's figures; a disconnect without it is
//! a client that died, and fails the session (exit status 1).
//!
//! Bandwidth runs post up to `--depth` work requests per QP, with one
//! signaled WR every `cq_mod` (as perftest does) and, at the end, one signaled
//! 8-byte RDMA Read per QP: a local Write completion only means "handed to
//! the wire", the Read's response comes after every earlier Write was placed
//! (RFC 5040 §5.5 rule 12), so the clock stops when the data is really there.
//! Send bandwidth uses credits: the server grants more Sends as it reposts
//! receives, because iWARP has no receiver-not-ready retry (a Send without a
//! posted receive ends the connection with a Terminate).
//!
//! Resource model of the server (`--listen`; issue 12, the same as for the
//! other softrdma servers): one client session at a time, told apart by the
//! random [`Hello::session`] its client draws; a gate thread takes every
//! connect request at once, so a second client is rejected immediately with
//! the reason in the reject's private data ("busy: serving the session of
//! ..."), and so are bad hellos and sessions whose buffers (message size ×
//! QPs) exceed `--max-session-mem` (1 GiB). A client that goes silent — no
//! connection for its next test, or no message for `--idle-timeout` (60 s) in
//! a Send or Write-latency test — is dropped; one-sided tests, whose traffic
//! the server cannot see, end after `--max-test-secs` (3600 s) at the latest.
//! Threads: the gate plus one per QP of the running test (at most the
//! client's `--qps`, bounded by the memory cap). Idle costs no CPU: the
//! bandwidth server sleeps on its CQ or CM events, the latency servers
//! busy-poll only while messages flow and sleep after 100 ms without one.
//! A session that fails (Terminate, reset, silence) is reported at default
//! log level with QP number and peer address, and the server exits non-zero.

use crate::report::{Bandwidth, Latency};
use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::Histogram;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};
use verbs::*;

mod server;
mod tcp;
mod ud;
mod udp;

use crate::procstat::cpu_secs;
use server::*;
use tcp::*;
use udp::spawn_udp_echo;

const EXAMPLES: &str = "\
What each operation measures (the client posts, the server's CPU is only involved where noted):
  write   RDMA Write of SIZE bytes into the server's registered buffer (one-sided: the server
          application does nothing; its provider places the data). Bandwidth and message rate.
          With --lat: ping-pong of Writes, each side spinning on the last byte of its buffer.
  read    RDMA Read of SIZE bytes from the server's buffer: the data flows server -> client.
          At most 128 Reads are outstanding per QP (the negotiated ORD); --depth above that waits.
          With --lat: the round trip of one Read at a time.
  send    Send/Receive of SIZE bytes: the server application posts receives and grants the
          client credits as it reposts them. With --lat: ping-pong (the server echoes each message).
  atomic  RFC 7306 FetchAdd on 8 bytes of the server's buffer (--size is ignored). Each atomic
          is a round trip, so --depth controls how many are in flight.

Bandwidth (default) posts up to --depth work requests per QP, signaling one in every
depth/4 (at most 64) as perftest's --cq-mod does; the clock stops after an 8-byte RDMA Read per QP completes,
so every Write is placed in the server's memory, not just handed to TCP. BW peak is the best
window of at least 100 ms and 16 signaled completions.
--baseline tcp repeats the same pattern over plain TCP sockets in the same run (a stream of
the same message size and count for write/send, server -> client for read, a request/response
ping-pong for --lat and atomics) and prints RDMA/TCP: for bandwidth higher is better, for
latency (ratio of p50s) lower is better.

perftest's letters work here too (-s size, -n iterations, -D seconds, -q QPs, -t depth, -a every
size from 2 B to 8 MiB), and the table shows MB/sec (2^20 bytes) as perftest's does, Gb/sec with
--report_gbits. The server (--listen) prints each test's result as the client measured it.
`softrdma perftest` speaks perftest's own protocol, for runs against ib_*_bw/lat.

Examples:
  softrdma bench write                              # 64 KiB Writes, one QP, both ends in this process
  softrdma bench write --sizes 64,4K,64K,1M --baseline tcp
  softrdma bench write -s 64 -t 64 -D 3                       # message rate
  softrdma bench write -a --report_gbits                      # every size, in Gb/sec
  softrdma bench read --size 1M --qps 4 --crc on
  softrdma bench send --lat --size 8 --baseline tcp           # p50/p99/p99.9 against a TCP ping-pong
  softrdma bench atomic --depth 16 --json
  softrdma bench send --ud --provider roce --baseline udp      # UD Send message rate, 64 B and MTU
  softrdma bench --listen 0.0.0.0:18515                       # server on one host (serves one session)
  softrdma bench write --connect 10.0.0.1:18515 --size 1M     # client on another
";

/// The operation to measure.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Write,
    Read,
    Send,
    Atomic,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }
    fn title(self) -> &'static str {
        match self {
            Op::Write => "RDMA_Write",
            Op::Read => "RDMA_Read",
            Op::Send => "Send",
            Op::Atomic => "Atomic FetchAdd",
        }
    }
    fn code(self) -> u8 {
        self as u8
    }
    fn from_code(c: u8) -> Option<Op> {
        [Op::Write, Op::Read, Op::Send, Op::Atomic].get(c as usize).copied()
    }
}

/// Measure bandwidth, message rate and latency of RDMA Write, Read, Send and
/// atomics, perftest style.
#[derive(clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Operation to measure (not needed with --listen: the client's choice is used).
    #[arg(value_enum, required_unless_present = "listen")]
    op: Option<Op>,
    /// Message size in bytes; K, M, G suffixes are powers of 1024 [default: 64K, 8 with --lat].
    #[arg(short = 's', long, value_parser = parse_size, conflicts_with_all = ["sizes", "all"])]
    size: Option<u64>,
    /// Sweep over several sizes, e.g. 64,4K,1M (one result per size).
    #[arg(long, value_parser = parse_size, value_delimiter = ',', conflicts_with = "all")]
    sizes: Vec<u64>,
    /// Sweep over every power of two from 2 bytes to 8 MiB, as perftest's -a.
    #[arg(short = 'a', long)]
    all: bool,
    /// Iterations per QP [default: 5000, 1000 with --lat].
    #[arg(short = 'n', long, conflicts_with = "duration", value_parser = crate::units::count)]
    iters: Option<u64>,
    /// Run each size for this many seconds instead of a fixed number of iterations.
    #[arg(short = 'D', long)]
    duration: Option<f64>,
    /// Number of queue pairs (each its own TCP connection), driven round-robin by one thread
    /// (1 to 1024).
    #[arg(short = 'q', long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=MAX_QPS as i64))]
    qps: u16,
    /// Outstanding work requests per QP (perftest's -t, --tx-depth), 1 to 16384.
    #[arg(short = 't', long, visible_alias = "tx-depth", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=MAX_DEPTH as i64))]
    depth: u32,
    /// Bandwidth in Gb/sec (10^9 bits) instead of perftest's default MB/sec (2^20 bytes).
    #[arg(long = "report_gbits", visible_alias = "report-gbits")]
    report_gbits: bool,
    /// The device: --provider iwarp|roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    dev: crate::providers::DeviceArgs,
    /// iWARP: ask for MPA CRC32c (used if either side asks; refused on other providers).
    #[arg(long, value_parser = ["on", "off"])]
    crc: Option<String>,
    /// Latency mode: one message at a time (ping-pong for write and send); p50/p99/p99.9.
    #[arg(long)]
    lat: bool,
    /// Be the server on ADDR (HOST:PORT) and serve one client session, then exit.
    #[arg(long, conflicts_with = "connect", value_parser = crate::net::host_port)]
    listen: Option<SocketAddr>,
    /// Without --connect/--listen: the loopback address the in-process server end listens on
    /// (the client end's device, when the provider binds one, takes the next free one).
    #[arg(long, default_value = "127.0.0.1", value_name = "IP", conflicts_with_all = ["connect", "listen"])]
    loopback: Ipv4Addr,
    /// Be the client of a `softrdma bench --listen` server at ADDR (HOST:PORT; HOST may be a name).
    #[arg(long, value_parser = crate::net::host_port)]
    connect: Option<SocketAddr>,
    /// Also run the same traffic over plain sockets and print the ratio: tcp (any test; the
    /// baseline for iWARP, which runs over TCP) or udp (--lat only: a busy-polling UDP
    /// ping-pong of the same size, the baseline for RoCEv2, which runs over UDP).
    #[arg(long, value_parser = ["tcp", "udp"])]
    baseline: Option<String>,
    /// With `send`: UD Send message rate of one UD QP (RoCEv2), both ends in this process;
    /// `--baseline udp` adds a plain UDP socket sending the same sizes [default sizes: 64
    /// and the MTU].
    #[arg(long)]
    ud: bool,
    /// One JSON object per result on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Show a progress line on stderr even if it is not a terminal.
    #[arg(long)]
    progress: bool,
    /// Latency mode: sleep on the completion queue (perftest's --events) instead of
    /// busy-polling it; both ends do. Not for write --lat, which polls memory.
    #[arg(long)]
    events: bool,
    /// Server: drop a client that goes silent for this many seconds (no connection for its
    /// next test, no message in a Send or Write-latency test); the session then fails.
    /// 0: never.
    #[arg(long, default_value_t = 60)]
    idle_timeout: u64,
    /// Server: the longest a one-sided test (write/read/atomic bandwidth, read/atomic
    /// latency) may keep its connections: the server cannot see one-sided traffic, so a
    /// silent client there is only bounded by this. 0: no limit.
    #[arg(long, default_value_t = 3600)]
    max_test_secs: u64,
    /// Server: the most memory one client session may make the server register (message
    /// size × QPs); a client asking for more is refused.
    #[arg(long, default_value = "1G", value_parser = crate::units::parse_size)]
    max_session_mem: u64,
}

/// The bench server's resource model: one client session at a time (a second client
/// is refused at once, with a reason in the reject's private data), idle and test-time
/// limits, and a memory cap per session. `softrdma bench --help` documents the knobs.
#[derive(Debug, Clone, Copy)]
struct Limits {
    idle: Option<Duration>,
    max_test: Option<Duration>,
    max_mem: u64,
    /// `--listen`: print each test's result (the client's [`Report`]) in this unit; `None`
    /// for the in-process server of a loopback run, whose client prints them.
    report: Option<Unit>,
}

impl Limits {
    fn of(args: &Args) -> Limits {
        let secs = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        Limits {
            idle: secs(args.idle_timeout),
            max_test: secs(args.max_test_secs),
            max_mem: args.max_session_mem,
            report: args.listen.map(|_| Unit::of(args.report_gbits)),
        }
    }
}

/// A message size: [`crate::units::parse_size`], between 1 byte and 4 GiB - 1.
fn parse_size(s: &str) -> Result<u64, String> {
    let v = crate::units::parse_size(s)?;
    if v == 0 || v > u32::MAX as u64 {
        return Err(format!("size {s:?} must be between 1 and 4G-1 bytes"));
    }
    Ok(v)
}

/// Human-readable size as perftest prints it (plain bytes).
fn show_size(n: u64) -> String {
    n.to_string()
}

const T: Duration = Duration::from_secs(10);
const HELLO_MAGIC: &[u8; 4] = b"SRBN";
const REPLY_MAGIC: &[u8; 4] = b"SRBA";
/// 2: the client writes its [`Report`] into the server's buffer before it ends a test.
const VERSION: u8 = 2;
const FLAG_LAT: u8 = 1;
const FLAG_LAST: u8 = 2;
const FLAG_BASELINE: u8 = 4;
const FLAG_EVENTS: u8 = 8;
/// The client runs a UDP baseline after the test (the server waits for its end datagram).
const FLAG_BASELINE_UDP: u8 = 16;
/// The ORD/IRD we ask for (the device's maximum).
const RD_ATOMIC: u8 = 128;

/// Client -> server, in the connect request's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hello {
    op: Op,
    flags: u8,
    test_id: u32,
    qp_index: u16,
    qps: u16,
    depth: u32,
    size: u64,
    client_addr: u64,
    client_rkey: u32,
    /// Drawn at random by the client, the same for all its tests: how the server tells
    /// the client it serves from a second one.
    session: u32,
}

/// A session id for [`Hello::session`]: random, never 0.
fn new_session_id() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() as u32).max(1)
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(48);
        b.extend_from_slice(HELLO_MAGIC);
        b.extend_from_slice(&[VERSION, self.op.code(), self.flags, 0]);
        b.extend_from_slice(&self.test_id.to_le_bytes());
        b.extend_from_slice(&self.qp_index.to_le_bytes());
        b.extend_from_slice(&self.qps.to_le_bytes());
        b.extend_from_slice(&self.depth.to_le_bytes());
        b.extend_from_slice(&self.session.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.client_addr.to_le_bytes());
        b.extend_from_slice(&self.client_rkey.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Result<Hello> {
        if b.len() < 48 || &b[..4] != HELLO_MAGIC {
            bail!("not a softrdma bench client ({} bytes of private data)", b.len());
        }
        if b[4] != VERSION {
            bail!("bench protocol version {} (we speak {VERSION})", b[4]);
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Ok(Hello {
            op: Op::from_code(b[5]).ok_or_else(|| anyhow!("unknown operation {}", b[5]))?,
            flags: b[6],
            test_id: u32_at(8),
            qp_index: u16_at(12),
            qps: u16_at(14),
            depth: u32_at(16),
            session: u32_at(20),
            size: u64_at(24),
            client_addr: u64_at(32),
            client_rkey: u32_at(40),
        })
    }
    fn lat(&self) -> bool {
        self.flags & FLAG_LAT != 0
    }
}

/// Server -> client, in the accept's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reply {
    addr: u64,
    rkey: u32,
    /// Send bandwidth: receives the server keeps posted (the client's initial credits).
    credits: u32,
    /// Send bandwidth: each credit message from the server grants this many Sends.
    grant: u32,
    /// Port of the server's plain-TCP baseline listener (0: none).
    tcp_port: u16,
}

impl Reply {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(REPLY_MAGIC);
        b.extend_from_slice(&[VERSION, 0, 0, 0]);
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.rkey.to_le_bytes());
        b.extend_from_slice(&self.credits.to_le_bytes());
        b.extend_from_slice(&self.grant.to_le_bytes());
        b.extend_from_slice(&self.tcp_port.to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b
    }
    fn decode(b: &[u8]) -> Result<Reply> {
        if b.len() < 32 || &b[..4] != REPLY_MAGIC || b[4] != VERSION {
            bail!("the peer is not a softrdma bench server of our version");
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        Ok(Reply {
            addr: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            rkey: u32_at(16),
            credits: u32_at(20),
            grant: u32_at(24),
            tcp_port: u16::from_le_bytes([b[28], b[29]]),
        })
    }
}

/// Send bandwidth: receives the server keeps posted and how many it grants per credit message.
fn send_credits(depth: u32) -> (u32, u32) {
    let credits = (depth * 2).clamp(4, 8192);
    (credits, (credits / 4).max(1))
}

/// One message buffer (at least 64 bytes so the 8-byte atomics and credit messages fit).
fn buffer_len(size: u64) -> usize {
    size.max(64) as usize
}

/// The client's region: `[0, L)` messages out and in, `[L, 2L)` the Write
/// ping-pong's echo target, then one "ready" byte per QP that the server
/// sets with an RDMA Write once its receives are posted (Send tests only:
/// iWARP has no receiver-not-ready retry, so a Send that beats the server's
/// `post_recv` would end the connection).
fn client_layout(size: u64, qps: u16) -> (usize, usize, usize) {
    let l = buffer_len(size);
    (l, 2 * l, 2 * l + qps as usize)
}

/// The value of the ready byte.
const READY: u8 = 0xa5;

/// Where in the server's buffer (`buffer_len(size) + 64` bytes) the client's [`Report`]
/// goes: after the messages and the READY source byte.
fn done_offset(size: u64) -> usize {
    buffer_len(size) + 8
}

/// What the client measured in one test, RDMA-Written into the server's buffer at
/// [`done_offset`] when the test is over (one Write per QP, before the disconnect): the
/// server prints it (perftest's server shows the client's figures too), and a disconnect
/// without it is a client that died.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Report {
    messages: u64,
    secs: f64,
    peak_gbit: f64,
    /// Latency tests: the median in nanoseconds (0 for bandwidth).
    p50_ns: u64,
}

impl Report {
    const LEN: usize = 40;
    const MAGIC: u64 = u64::from_le_bytes(*b"SRBDONE\0");

    fn of(o: &Outcome) -> Report {
        Report {
            messages: o.messages,
            secs: o.secs,
            peak_gbit: o.peak_gbit,
            p50_ns: o.hist.as_ref().map_or(0, |h| h.value_at_quantile(0.5)),
        }
    }
    fn encode(&self) -> [u8; Report::LEN] {
        let mut b = [0u8; Report::LEN];
        b[..8].copy_from_slice(&self.messages.to_le_bytes());
        b[8..16].copy_from_slice(&self.secs.to_le_bytes());
        b[16..24].copy_from_slice(&self.peak_gbit.to_le_bytes());
        b[24..32].copy_from_slice(&self.p50_ns.to_le_bytes());
        b[32..].copy_from_slice(&Report::MAGIC.to_le_bytes());
        b
    }
    /// `None` unless the magic is there (the client did not finish its test).
    fn decode(b: &[u8; Report::LEN]) -> Option<Report> {
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        (u(32) == Report::MAGIC).then(|| Report {
            messages: u(0),
            secs: f64::from_bits(u(8)),
            peak_gbit: f64::from_bits(u(16)),
            p50_ns: u(24),
        })
    }
}

/// `--qps` at most.
const MAX_QPS: u16 = 1024;
/// `--depth` at most (the device allows 32768 WRs per queue).
const MAX_DEPTH: u32 = 16384;
/// Completion-queue entries the device allows per CQ.
const MAX_CQE: usize = 1 << 20;

/// The client's CQ size for `qps` QPs of send depth `depth`: every QP's sends, the credit
/// messages of a Send test, and room to spare.
fn client_cqe(qps: u16, depth: u32) -> usize {
    let (credits, grant) = send_credits(depth);
    let grant_recvs = (credits / grant + 2) as usize;
    qps as usize * (depth as usize + grant_recvs + 8) + 64
}

fn qp_attr(send: u32, recv: u32) -> QpInitAttr {
    QpInitAttr {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..Default::default()
    }
}

pub fn run(args: Args) -> Result<()> {
    use crate::providers::{Endpoint, Flag};
    let flags: Vec<Flag> = Flag::crc(args.crc.as_deref()).into_iter().collect();
    if args.ud {
        if args.op != Some(Op::Send) {
            bail!("--ud measures UD Sends: use `softrdma bench send --ud`");
        }
        return ud::run(&args, &flags);
    }
    if args.baseline.as_deref() == Some("udp") && !args.lat {
        bail!(
            "--baseline udp is a latency baseline (a busy-polling UDP ping-pong): add --lat, or use \
             --baseline tcp for bandwidth"
        );
    }
    if let Some(addr) = args.listen {
        let dev = crate::providers::open(&args.dev, &flags, Endpoint::Listen(addr.ip()))?;
        let listener = dev.listen(addr).with_context(|| format!("listening on {addr}"))?;
        let tcp = TcpListener::bind(SocketAddr::new(listener.local_addr().ip(), 0))?;
        let udp = spawn_udp_echo(SocketAddr::new(listener.local_addr().ip(), tcp.local_addr()?.port()));
        eprintln!(
            "bench server: listening on {} ({}) and {} (TCP baseline{}); waiting for a client",
            listener.local_addr(),
            crate::providers::label(&dev),
            tcp.local_addr()?,
            if udp.is_ok() {
                ", UDP baseline on the same port"
            } else {
                ""
            }
        );
        let mut tcp = spawn_tcp_server(tcp, Limits::of(&args))?;
        tcp.udp = udp.ok();
        return serve(&dev, &listener, Some(tcp), Limits::of(&args));
    }
    let op = args
        .op
        .ok_or_else(|| anyhow!("which operation? write, read, send or atomic"))?;
    if args.events && !(args.lat && matches!(op, Op::Send | Op::Read | Op::Atomic)) {
        bail!("--events applies to send, read and atomic with --lat");
    }
    if args.lat && args.qps != 1 {
        bail!("--lat measures one QP (perftest's *_lat tools do too); drop --qps");
    }
    let cqe = client_cqe(args.qps, if args.lat { 1 } else { args.depth });
    if cqe > MAX_CQE {
        bail!(
            "--qps {} with --depth {} needs {cqe} completion-queue entries, more than the device's \
             {MAX_CQE} per CQ: lower --qps or --depth (qps x (depth + {}) must stay under {MAX_CQE})",
            args.qps,
            args.depth,
            client_cqe(1, 0) - 64
        );
    }
    if let Some(d) = args.duration
        && !(d > 0.0 && d.is_finite())
    {
        bail!("--duration must be a positive number of seconds");
    }
    let sizes: Vec<u64> = if op == Op::Atomic {
        vec![8]
    } else if args.all {
        (1..=23).map(|b| 1u64 << b).collect()
    } else if !args.sizes.is_empty() {
        args.sizes.clone()
    } else {
        vec![args.size.unwrap_or(if args.lat { 8 } else { 65536 })]
    };
    let (dev, target, server) = match args.connect {
        Some(a) => (
            crate::providers::open(
                &args.dev,
                &flags,
                Endpoint::Connect {
                    dest: a.ip(),
                    source: None,
                },
            )?,
            a,
            None,
        ),
        None => {
            if !args.loopback.is_loopback() {
                bail!("--loopback {}: not a 127.0.0.0/8 address", args.loopback);
            }
            let here: IpAddr = args.loopback.into();
            let sdev = crate::providers::open(&args.dev, &flags, Endpoint::Listen(here))?;
            let listener = sdev.listen(SocketAddr::new(here, 0))?;
            let tcp_l = TcpListener::bind(SocketAddr::new(here, 0))?;
            // Best effort: a run without --baseline udp does not need it.
            // Best effort: a run without --baseline udp does not need it.
            let udp = spawn_udp_echo(tcp_l.local_addr()?).ok();
            let mut tcp = spawn_tcp_server(tcp_l, Limits::of(&args))?;
            tcp.udp = udp;
            let addr = listener.local_addr();
            let limits = Limits::of(&args);
            let h = std::thread::Builder::new()
                .name("bench-server".into())
                .spawn(move || serve(&sdev, &listener, Some(tcp), limits))?;
            let dev = crate::providers::open(&args.dev, &flags, Endpoint::LoopbackClient(here))?;
            (dev, addr, Some(h))
        }
    };
    let progress = crate::progress::wanted(args.progress, args.json);
    let session = new_session_id();
    let mut printed_header = false;
    let mut res = Ok(());
    for (i, &size) in sizes.iter().enumerate() {
        let last = i + 1 == sizes.len();
        let r = run_test(&dev, target, &args, op, i as u32, size, last, progress, session).and_then(|mut r| {
            if args.baseline.is_some() {
                r.baseline = Some(match args.baseline.as_deref() {
                    Some("udp") => udp::run_udp_baseline(target, &r)?,
                    _ => run_baseline(target, &r, args.qps as usize)?,
                });
            }
            Ok(r)
        });
        match r {
            Ok(r) => {
                if args.json {
                    crate::report::print_line(&r.json());
                } else {
                    if !printed_header {
                        print_header(&args, &dev, target, &r);
                        printed_header = true;
                    }
                    r.print_row(args.report_gbits);
                }
            }
            Err(e) => {
                res = Err(e);
                break;
            }
        }
    }
    if !args.json && printed_header {
        println!("{}", "-".repeat(87));
    }
    // On error the server thread may still wait for the next test; the process exits anyway.
    if let Some(h) = server
        && res.is_ok()
    {
        h.join().map_err(|_| anyhow!("server thread panicked"))??;
    }
    res
}

/// `bench --json`: one object per test (docs/json.md).
#[derive(serde::Serialize)]
struct BenchJson {
    tool: &'static str,
    op: &'static str,
    mode: &'static str,
    size: u64,
    iters: u64,
    messages: u64,
    qps: u16,
    depth: u32,
    crc: bool,
    seconds: f64,
    /// The average: `mb_per_s` and `gbit_per_s`.
    #[serde(flatten)]
    bw: Bandwidth,
    mb_per_s_peak: f64,
    gbit_per_s_peak: f64,
    msg_per_s: f64,
    /// Latency mode only (null for bandwidth).
    lat: Option<Latency>,
    /// CPU seconds this process used during the run.
    cpu_s: Option<f64>,
    /// With `--baseline tcp|udp` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    baseline: Option<BaselineJson>,
}

/// The plain-socket baseline of a [`BenchJson`] and how RDMA compares.
#[derive(serde::Serialize)]
struct BaselineJson {
    /// "tcp" or "udp".
    kind: &'static str,
    /// How the baseline's ends waited for data: "busy-poll" (latency tests without
    /// `--events`, like `sockperf ping-pong --nonblocked`) or "blocking".
    polling: &'static str,
    #[serde(flatten)]
    bw: Bandwidth,
    lat: Option<Latency>,
    cpu_s: Option<f64>,
    /// RDMA over the baseline of the field `ratio_of` names: for bandwidth higher is better,
    /// for latency lower.
    ratio: Option<f64>,
    ratio_of: &'static str,
    /// CPU seconds RDMA over the baseline (lower is cheaper).
    cpu_ratio: Option<f64>,
}

/// What one test measured.
struct Outcome {
    op: Op,
    size: u64,
    qps: u16,
    depth: u32,
    lat: bool,
    /// `--events`: the latency test's ends sleep on their CQs instead of busy-polling.
    events: bool,
    crc: bool,
    /// What the connection negotiated, for people (the provider's `ConnInfo::detail`).
    detail: String,
    /// Messages completed in total over all QPs.
    messages: u64,
    secs: f64,
    peak_gbit: f64,
    hist: Option<Histogram<u64>>,
    baseline: Option<Baseline>,
    tcp_port: u16,
    /// CPU seconds this process used during the measured run (both ends when they share the process).
    cpu_s: Option<f64>,
}

struct Baseline {
    /// "tcp" or "udp".
    kind: &'static str,
    gbit: f64,
    hist: Option<Histogram<u64>>,
    /// CPU seconds this process used during the baseline.
    cpu_s: Option<f64>,
    /// How the baseline's ends waited: like the RDMA side in latency tests.
    polling: tcp::Polling,
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

impl Outcome {
    fn gbit(&self) -> f64 {
        self.messages as f64 * self.size as f64 * 8.0 / self.secs / 1e9
    }
    fn msg_rate(&self) -> f64 {
        self.messages as f64 / self.secs
    }
    fn iters(&self) -> u64 {
        self.messages / self.qps as u64
    }
    fn ratio(&self) -> Option<f64> {
        let b = self.baseline.as_ref()?;
        match (&self.hist, &b.hist) {
            (Some(h), Some(bh)) => Some(us(h, 0.5) / us(bh, 0.5)),
            _ => Some(self.gbit() / b.gbit),
        }
    }
    /// CPU seconds per message, RDMA over TCP (same message count): lower is cheaper.
    fn cpu_ratio(&self) -> Option<f64> {
        let b = self.baseline.as_ref()?.cpu_s?;
        let r = self.cpu_s?;
        (b > 0.0).then(|| r / b)
    }
    /// The `--json` object (docs/json.md, "bench").
    fn json(&self) -> BenchJson {
        let bw = |gbit: f64| Bandwidth::of_bytes_per_s(gbit * 1e9 / 8.0);
        BenchJson {
            tool: "bench",
            op: self.op.name(),
            mode: if self.lat { "lat" } else { "bw" },
            size: self.size,
            iters: self.iters(),
            messages: self.messages,
            qps: self.qps,
            depth: if self.lat { 1 } else { self.depth },
            crc: self.crc,
            seconds: self.secs,
            bw: bw(self.gbit()),
            mb_per_s_peak: bw(self.peak_gbit).mb_per_s,
            gbit_per_s_peak: self.peak_gbit,
            msg_per_s: self.msg_rate(),
            lat: self.hist.as_ref().map(Latency::of_ns),
            cpu_s: self.cpu_s,
            baseline: self.baseline.as_ref().map(|b| BaselineJson {
                kind: b.kind,
                polling: b.polling.as_str(),
                bw: bw(b.gbit),
                lat: b.hist.as_ref().map(Latency::of_ns),
                cpu_s: b.cpu_s,
                ratio: self.ratio(),
                ratio_of: if self.hist.is_some() {
                    "lat.p50_us"
                } else {
                    "gbit_per_s"
                },
                cpu_ratio: self.cpu_ratio(),
            }),
        }
    }
    fn print_row(&self, gbits: bool) {
        let bw = |gbit: f64| Unit::of(gbits).convert_gbit(gbit);
        match &self.hist {
            None => {
                println!(
                    " {:<10} {:<13} {:<18.2} {:<20.2} {:.6}",
                    show_size(self.size),
                    self.iters(),
                    bw(self.peak_gbit),
                    bw(self.gbit()),
                    self.msg_rate() / 1e6
                );
                if let Some(b) = &self.baseline {
                    let k = b.kind.to_uppercase();
                    println!(
                        " {:<10} {:<13} {:<18} {:<20.2} ratio RDMA/{k} {:.3} (CPU seconds RDMA/{k} {:.2})",
                        format!("  {k}"),
                        self.iters(),
                        "",
                        bw(b.gbit),
                        self.ratio().unwrap_or(f64::NAN),
                        self.cpu_ratio().unwrap_or(f64::NAN)
                    );
                }
            }
            Some(h) => {
                println!(
                    " {:<8} {:<12} {:<11.2} {:<11.2} {:<11.2} {:<11.2} {:<11.2} {:.2}",
                    show_size(self.size),
                    self.iters(),
                    Latency::of_ns(h).min_us,
                    Latency::of_ns(h).max_us,
                    Latency::of_ns(h).p50_us,
                    Latency::of_ns(h).avg_us,
                    Latency::of_ns(h).p99_us,
                    Latency::of_ns(h).p999_us
                );
                if let Some(b) = &self.baseline
                    && let Some(bh) = &b.hist
                {
                    let k = b.kind.to_uppercase();
                    println!(
                        " {:<8} {:<12} {:<11.2} {:<11.2} {:<11.2} {:<11.2} {:<11.2} {:.2}   p50 ratio RDMA/{k} {:.3}",
                        format!("  {k}"),
                        self.iters(),
                        Latency::of_ns(bh).min_us,
                        Latency::of_ns(bh).max_us,
                        Latency::of_ns(bh).p50_us,
                        Latency::of_ns(bh).avg_us,
                        Latency::of_ns(bh).p99_us,
                        Latency::of_ns(bh).p999_us,
                        self.ratio().unwrap_or(f64::NAN)
                    );
                }
            }
        }
    }
}

fn print_header(args: &Args, dev: &Device, target: SocketAddr, r: &Outcome) {
    let line = "-".repeat(87);
    println!("{line}");
    println!(
        "                    {} {} Test",
        r.op.title(),
        if r.lat { "Latency" } else { "BW" }
    );
    println!(" Device          : {} ({})", dev.name(), crate::providers::label(dev));
    println!(
        " Connection      : {}",
        if args.connect.is_some() {
            format!("to {target}")
        } else {
            format!("loopback {target}, both ends in this process")
        }
    );
    println!(
        " Number of qps   : {:<10} Transport type : {}",
        r.qps,
        crate::providers::transport(dev)
    );
    if !r.lat {
        println!(
            " TX depth        : {:<10} CQ moderation  : {}",
            r.depth,
            cq_mod(r.depth)
        );
    }
    if !r.detail.is_empty() {
        println!(" Negotiated      : {}", r.detail);
    }
    if args.baseline.as_deref() == Some("udp") {
        println!(" Baseline        : plain UDP datagrams, same message size and count, one in flight");
        if args.events {
            println!(" Baseline wait   : blocking receives on both ends, as --events sleeps on the CQs");
        } else {
            println!(" Baseline wait   : busy-polling non-blocking sockets on both ends, as we busy-poll the CQs");
        }
    } else if args.baseline.is_some() {
        println!(" Baseline        : plain TCP sockets, same message size and count");
        if r.lat && !args.events {
            println!(" Baseline wait   : busy-polling non-blocking sockets on both ends, as we busy-poll the CQs");
        } else if r.lat {
            println!(" Baseline wait   : blocking reads on both ends, as --events sleeps on the CQs");
        }
    }
    println!("{line}");
    if r.lat {
        println!(" #bytes   #iterations  t_min[usec] t_max[usec] t_p50[usec] t_avg[usec] t_p99[usec] t_p99.9[usec]");
    } else {
        let u = Unit::of(args.report_gbits).label();
        println!(" #bytes     #iterations   BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]");
    }
}

/// The bandwidth unit of the tables: perftest's MB/sec (2^20 bytes per second) by default,
/// Gb/sec (10^9 bits per second) with --report_gbits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    MbPerSec,
    GbitPerSec,
}

impl Unit {
    fn of(report_gbits: bool) -> Unit {
        if report_gbits { Unit::GbitPerSec } else { Unit::MbPerSec }
    }
    fn label(self) -> &'static str {
        match self {
            Unit::MbPerSec => "MB/sec",
            Unit::GbitPerSec => "Gb/sec",
        }
    }
    fn convert_gbit(self, gbit: f64) -> f64 {
        match self {
            Unit::MbPerSec => gbit_to_mb(gbit),
            Unit::GbitPerSec => gbit,
        }
    }
}

/// Gbit/s (10^9 bits) to perftest's MB/sec (2^20 bytes).
fn gbit_to_mb(gbit: f64) -> f64 {
    gbit * 1e9 / 8.0 / (1u64 << 20) as f64
}

/// Signal one work request in this many (perftest's --cq-mod): often enough
/// that a deep queue never waits long for room, seldom enough to save completions.
fn cq_mod(depth: u32) -> u32 {
    (depth / 4).clamp(1, 64)
}

/// The client's side of one connection.
struct ClientQp {
    qp: QueuePair,
    reply: Reply,
    posted: u64,
    completed: u64,
    credits: u64,
    /// Send bandwidth: credit messages received from the server so far.
    grants: u64,
    /// Sleep on the CQ instead of busy-polling (latency mode).
    events: bool,
}

#[allow(clippy::too_many_arguments)]
fn run_test(
    dev: &Device,
    target: SocketAddr,
    args: &Args,
    op: Op,
    test_id: u32,
    size: u64,
    last: bool,
    progress: bool,
    session: u32,
) -> Result<Outcome> {
    let lat = args.lat;
    let depth = if lat { 1 } else { args.depth };
    let pd = dev.alloc_pd()?;
    let (echo_off, ready_off, mr_len) = client_layout(size, args.qps);
    // Room for the Report the test's end writes to the server.
    let mr = pd.reg_mr(mr_len + Report::LEN, Access::all_remote())?;
    let (credits, grant) = send_credits(depth);
    let grant_recvs = credits / grant + 2;
    let cq = dev.create_cq(client_cqe(args.qps, depth))?;
    let mut flags = if lat { FLAG_LAT } else { 0 };
    if last {
        flags |= FLAG_LAST;
    }
    match args.baseline.as_deref() {
        Some("udp") => flags |= FLAG_BASELINE_UDP,
        Some(_) => flags |= FLAG_BASELINE,
        None => {}
    }
    if args.events {
        flags |= FLAG_EVENTS;
    }
    let mut conns = Vec::with_capacity(args.qps as usize);
    for q in 0..args.qps {
        let hello = Hello {
            op,
            flags,
            test_id,
            qp_index: q,
            qps: args.qps,
            depth,
            size,
            client_addr: mr.addr(),
            client_rkey: mr.rkey(),
            session,
        };
        let opts = QpOptions::new(&cq)
            .attr(qp_attr(depth.max(64) + 8, grant_recvs + 8))
            .rd_atomic(RD_ATOMIC, RD_ATOMIC)
            .private_data(&hello.encode());
        let qp = match pd.connect(target, opts, T) {
            Ok(qp) => qp,
            Err(Error::Rejected { private_data, .. }) => bail!(
                "connecting QP {q} to {target}: the server refused: {}",
                String::from_utf8_lossy(&private_data)
            ),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("connecting QP {q} to {target} (is `softrdma bench --listen` running there?)")
                });
            }
        };
        let reply = Reply::decode(&qp.conn_info().peer_private_data)?;
        match qp.get_event(Some(T)) {
            Some(CmEvent::Established) => {}
            other => bail!("QP {q}: expected Established, got {other:?}"),
        }
        conns.push(ClientQp {
            qp,
            reply,
            posted: 0,
            completed: 0,
            credits: reply.credits as u64,
            grants: 0,
            events: args.events,
        });
    }
    if op == Op::Send {
        // Wait for each server QP's "receives are posted" Write.
        let t0 = Instant::now();
        let mut b = [0u8];
        for q in 0..conns.len() {
            loop {
                cq.poll(&mut Vec::new(), 0);
                mr.read(ready_off + q, &mut b)?;
                if b[0] == READY {
                    break;
                }
                if t0.elapsed() > T {
                    bail!("QP {q}: the server did not signal that its receives are posted");
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
    let detail = conns[0].qp.conn_info().detail;
    let crc = detail.contains("crc true");
    let tcp_port = conns[0].reply.tcp_port;
    let iters = args.iters.unwrap_or(if lat { 1000 } else { 5000 });
    let stop = match args.duration {
        Some(d) => Stop::Time(Duration::from_secs_f64(d)),
        None => Stop::Iters(iters),
    };
    let mut out = Outcome {
        op,
        size,
        qps: args.qps,
        depth,
        lat,
        events: args.events,
        crc,
        detail,
        messages: 0,
        secs: 0.0,
        peak_gbit: 0.0,
        hist: None,
        baseline: None,
        tcp_port,
        cpu_s: None,
    };
    let prog = Progress::new(progress, args.progress, op, size);
    let cpu0 = cpu_secs();
    if lat {
        let c = &mut conns[0];
        let hist = match op {
            Op::Send => lat_send(c, &cq, &mr, size, stop, &prog)?,
            Op::Write => lat_write(c, &cq, &mr, echo_off, size, stop, &prog)?,
            Op::Read | Op::Atomic => lat_one_sided(c, op, &cq, &mr, size, stop, &prog)?,
        };
        out.messages = hist.len();
        out.secs = hist.mean() * hist.len() as f64 / 1e9;
        out.peak_gbit = out.gbit();
        out.hist = Some(hist);
    } else {
        let (messages, secs, peak) = bandwidth(&mut conns, op, &cq, &mr, size, depth, grant, stop, &prog)?;
        out.messages = messages;
        out.secs = secs;
        out.peak_gbit = peak;
    }
    out.cpu_s = cpu0.and_then(|c0| Some(cpu_secs()? - c0));
    prog.clear();
    mr.write(mr_len, &Report::of(&out).encode())?;
    tell_done(&conns, &cq, &mr, mr_len, size)?;
    for c in &conns {
        c.qp.disconnect();
    }
    Ok(out)
}

/// The test's end: one signaled RDMA Write of the [`Report`] per QP into the server's buffer,
/// completed before the disconnect (which follows it on the same TCP stream), so that the
/// server tells a finished client from one that died.
fn tell_done(conns: &[ClientQp], cq: &CompletionQueue, mr: &MemoryRegion, src: usize, size: u64) -> Result<()> {
    for (q, c) in conns.iter().enumerate() {
        let remote = RemoteAddr {
            addr: c.reply.addr + done_offset(size) as u64,
            rkey: c.reply.rkey,
        };
        c.qp.post_send_one(
            SendWr::new(
                wr_id(KIND_DONE, q, 0),
                WrOpcode::RdmaWrite { remote },
                vec![mr.sge(src, Report::LEN as u32)],
            )
            .flags(SendFlags::SIGNALED),
        )?;
    }
    let mut done = 0;
    while done < conns.len() {
        let wc = cq
            .wait(Some(T))
            .ok_or_else(|| anyhow!("the end-of-test Write did not complete within {T:?}"))?;
        check(&wc, "end-of-test Write")?;
        if split_wr_id(wc.wr_id).0 == KIND_DONE {
            done += 1;
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Stop {
    Iters(u64),
    Time(Duration),
}

/// The stderr progress line (an indicatif spinner, see crate::progress).
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    last: std::cell::Cell<Instant>,
}

impl Progress {
    fn new(on: bool, forced: bool, op: Op, size: u64) -> Progress {
        Progress {
            bar: crate::progress::spinner(on, forced, format!("bench {} {} B", op.name(), size)),
            last: std::cell::Cell::new(Instant::now()),
        }
    }
    /// Call often; formats the message at most twice a second.
    fn tick(&self, start: Instant, messages: u64, size: u64) {
        let Some(bar) = &self.bar else { return };
        let now = Instant::now();
        if now.duration_since(self.last.get()) < Duration::from_millis(500) {
            return;
        }
        self.last.set(now);
        let s = now.duration_since(start).as_secs_f64();
        bar.set_message(format!(
            "{s:.1} s, {messages} messages, {:.2} Gbit/s, {:.3} M msg/s",
            messages as f64 * size as f64 * 8.0 / s / 1e9,
            messages as f64 / s / 1e6
        ));
        bar.tick();
    }
    fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn check(wc: &WorkCompletion, what: &str) -> Result<()> {
    if wc.is_ok() {
        Ok(())
    } else {
        bail!(
            "{what}: completion with status \"{}\" (vendor error {:#x})",
            wc.status,
            wc.vendor_err
        )
    }
}

const KIND_SHIFT: u32 = 56;
const QP_SHIFT: u32 = 40;
const KIND_DATA: u64 = 0;
const KIND_RECV: u64 = 1;
const KIND_FENCE: u64 = 2;
const KIND_DONE: u64 = 3;

fn wr_id(kind: u64, q: usize, n: u64) -> u64 {
    (kind << KIND_SHIFT) | ((q as u64) << QP_SHIFT) | (n & ((1 << QP_SHIFT) - 1))
}

fn split_wr_id(id: u64) -> (u64, usize, u64) {
    (
        id >> KIND_SHIFT,
        ((id >> QP_SHIFT) & 0xffff) as usize,
        id & ((1 << QP_SHIFT) - 1),
    )
}

/// Bandwidth / message-rate run over every QP. Returns (messages, seconds, peak Gbit/s).
#[allow(clippy::too_many_arguments)]
fn bandwidth(
    conns: &mut [ClientQp],
    op: Op,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    size: u64,
    depth: u32,
    grant: u32,
    stop: Stop,
    prog: &Progress,
) -> Result<(u64, f64, f64)> {
    let len = if op == Op::Atomic { 8 } else { size as u32 };
    let cq_mod = cq_mod(depth) as u64;
    let depth = depth as u64;
    if op == Op::Send {
        for (q, c) in conns.iter().enumerate() {
            let n = c.reply.credits / grant + 2;
            let wrs: Vec<RecvWr> = (0..n)
                .map(|i| RecvWr {
                    wr_id: wr_id(KIND_RECV, q, i as u64),
                    sg_list: vec![mr.sge(0, 8)],
                })
                .collect();
            c.qp.post_recv(&wrs)?;
        }
    }
    let mut wcs = Vec::with_capacity(256);
    let mut batch: Vec<SendWr> = Vec::with_capacity(depth as usize);
    let start = Instant::now();
    let mut total_done = 0u64;
    // Peak: the best window of at least 100 ms and 16 signaled completions (each
    // completion reports cq_mod messages at once, so fewer would quantize the rate).
    let (mut win_start, mut win_done, mut win_events, mut peak) = (start, 0u64, 0u32, 0.0f64);
    let mut posting = true;
    let mut spins = 0u32;
    loop {
        if posting
            && let Stop::Time(d) = stop
            && start.elapsed() >= d
        {
            posting = false;
        }
        let limit = match stop {
            Stop::Iters(n) => n,
            Stop::Time(_) => u64::MAX,
        };
        // Everything posted (or time is up): the final Read below waits for the rest.
        if !posting || conns.iter().all(|c| c.posted >= limit) {
            break;
        }
        for (q, c) in conns.iter_mut().enumerate() {
            if c.posted < limit {
                let mut room = depth - (c.posted - c.completed);
                if op == Op::Send {
                    room = room.min(c.credits);
                }
                room = room.min(limit - c.posted);
                if room > 0 {
                    // The batch's WRs are rewritten in place, as perftest reuses its WR
                    // array: no gather-list allocation per post in the harness.
                    let room_n = room as usize;
                    batch.truncate(room_n);
                    for k in 0..room_n {
                        let n = c.posted + k as u64;
                        let signaled = (n + 1).is_multiple_of(cq_mod) || n + 1 == limit;
                        let remote = RemoteAddr {
                            addr: c.reply.addr,
                            rkey: c.reply.rkey,
                        };
                        let opcode = match op {
                            Op::Write => WrOpcode::RdmaWrite { remote },
                            Op::Read => WrOpcode::RdmaRead { remote },
                            Op::Send => WrOpcode::Send,
                            Op::Atomic => WrOpcode::AtomicFetchAdd { remote, add: 1 },
                        };
                        let flags = if signaled {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::empty()
                        };
                        let id = wr_id(KIND_DATA, q, n);
                        if let Some(w) = batch.get_mut(k) {
                            w.wr_id = id;
                            w.opcode = opcode;
                            w.flags = flags;
                            w.sg_list.clear();
                            w.sg_list.push(mr.sge(0, len));
                        } else {
                            batch.push(SendWr::new(id, opcode, vec![mr.sge(0, len)]).flags(flags));
                        }
                    }
                    c.qp.post_send(&batch).context("post_send")?;
                    c.posted += room;
                    if op == Op::Send {
                        c.credits -= room;
                    }
                }
            }
        }
        wcs.clear();
        if cq.poll(&mut wcs, 256) == 0 {
            spins += 1;
            if spins > 64 {
                // Stop burning the CPU the progress threads need; the engine
                // wakes the CQ's waiters when a completion arrives.
                if let Some(wc) = cq.wait_spin(Duration::ZERO, Some(Duration::from_millis(1))) {
                    wcs.push(wc);
                }
            }
        } else {
            spins = 0;
        }
        for wc in &wcs {
            let (kind, q, n) = split_wr_id(wc.wr_id);
            check(wc, op.name())?;
            let c = conns
                .get_mut(q)
                .ok_or_else(|| anyhow!("completion for unknown QP {q}"))?;
            match kind {
                KIND_DATA => {
                    let done = n + 1 - c.completed;
                    c.completed = n + 1;
                    total_done += done;
                    win_done += done;
                    win_events += 1;
                }
                KIND_RECV => {
                    c.credits += grant as u64;
                    c.grants += 1;
                    c.qp.post_recv(&[RecvWr {
                        wr_id: wc.wr_id,
                        sg_list: vec![mr.sge(0, 8)],
                    }])?;
                }
                _ => bail!("unexpected completion {wc:?}"),
            }
        }
        if !wcs.is_empty() {
            let now = Instant::now();
            let w = now.duration_since(win_start);
            if w >= Duration::from_millis(100) && win_events >= 16 {
                peak = peak.max(win_done as f64 * len as f64 * 8.0 / w.as_secs_f64() / 1e9);
                win_start = now;
                win_done = 0;
                win_events = 0;
            }
            prog.tick(start, total_done, len as u64);
        }
    }
    // Unsignaled WRs after the last signaled one (a --duration run stops
    // anywhere) and Writes still in flight: one signaled Read per QP
    // completes only after all of them.
    for (q, c) in conns.iter().enumerate() {
        let remote = RemoteAddr {
            addr: c.reply.addr,
            rkey: c.reply.rkey,
        };
        c.qp.post_send_one(SendWr::new(
            wr_id(KIND_FENCE, q, 0),
            WrOpcode::RdmaRead { remote },
            vec![mr.sge(0, 8)],
        ))?;
    }
    let mut fenced = 0;
    while fenced < conns.len() {
        let wc = cq
            .wait(Some(T))
            .ok_or_else(|| anyhow!("no completion for the final Read"))?;
        check(&wc, "final Read")?;
        let (kind, q, _) = split_wr_id(wc.wr_id);
        match kind {
            KIND_FENCE => {
                fenced += 1;
                let c = &mut conns[q];
                total_done += c.posted - c.completed;
                c.completed = c.posted;
            }
            KIND_DATA => {
                let c = &mut conns[q];
                let (_, _, n) = split_wr_id(wc.wr_id);
                total_done += n + 1 - c.completed;
                c.completed = n + 1;
            }
            KIND_RECV => conns[q].grants += 1,
            _ => {}
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if op == Op::Send {
        // The server grants credit for every `grant` messages it received, needed or not:
        // take every grant before the disconnect, or a late one meets a closed receive
        // queue and the server gets a Terminate ("no buffer available") at the test's end.
        let owed = |c: &ClientQp| c.posted / grant as u64;
        while conns.iter().any(|c| c.grants < owed(c)) {
            let wc = cq
                .wait(Some(T))
                .ok_or_else(|| anyhow!("no credit message from the server at the end"))?;
            check(&wc, "credit message")?;
            let (kind, q, _) = split_wr_id(wc.wr_id);
            if kind == KIND_RECV
                && let Some(c) = conns.get_mut(q)
            {
                c.grants += 1;
            }
        }
    }
    let avg = total_done as f64 * len as f64 * 8.0 / secs / 1e9;
    if peak == 0.0 || peak < avg {
        peak = peak.max(avg);
    }
    Ok((total_done, secs, peak))
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

fn warmup(stop: Stop) -> u64 {
    match stop {
        Stop::Iters(n) => (n / 100).clamp(10, 1000),
        Stop::Time(_) => 100,
    }
}

fn keep_going(stop: Stop, start: Instant, done: u64) -> bool {
    match stop {
        Stop::Iters(n) => done < n,
        Stop::Time(d) => start.elapsed() < d,
    }
}

/// Busy-polls `cq` (which drives the provider inline) until a completion
/// arrives, or with `events` sleeps until the provider's thread delivers one.
fn spin(cq: &CompletionQueue, events: bool) -> Result<WorkCompletion> {
    if events {
        return cq
            .wait_spin(Duration::ZERO, Some(T))
            .ok_or_else(|| anyhow!("no completion within {T:?}"));
    }
    let start = Instant::now();
    loop {
        if let Some(wc) = cq.poll_one() {
            return Ok(wc);
        }
        if start.elapsed() > T {
            bail!("no completion within {T:?}");
        }
        std::hint::spin_loop();
    }
}

/// Send ping-pong: post a Send, spin until the echo arrives.
fn lat_send(
    c: &mut ClientQp,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    size: u64,
    stop: Stop,
    prog: &Progress,
) -> Result<Histogram<u64>> {
    let len = size as u32;
    let recv = |n: u64| RecvWr {
        wr_id: wr_id(KIND_RECV, 0, n),
        sg_list: vec![mr.sge(0, len)],
    };
    c.qp.post_recv(&[recv(0)])?;
    ping_pong(stop, prog, size, |i| {
        // The work request is built before the clock starts, as perftest prepares its
        // WRs and the TCP baseline its buffer: its allocation is not the round trip's.
        let wr = SendWr::new(wr_id(KIND_DATA, 0, i), WrOpcode::Send, vec![mr.sge(0, len)]);
        let t0 = Instant::now();
        c.qp.post_send_one(wr)?;
        loop {
            let wc = spin(cq, c.events)?;
            check(&wc, "send ping-pong")?;
            if split_wr_id(wc.wr_id).0 == KIND_RECV {
                break;
            }
        }
        let dt = t0.elapsed();
        c.qp.post_recv(&[recv(i + 1)])?;
        Ok(dt)
    })
}

/// The byte a ping-pong Write number `i` leaves at the end of the buffer (never 0).
fn stamp(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Write ping-pong: each side spins on the last byte of its buffer (perftest's write_lat).
fn lat_write(
    c: &mut ClientQp,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    echo_off: usize,
    size: u64,
    stop: Stop,
    prog: &Progress,
) -> Result<Histogram<u64>> {
    let len = size as u32;
    let last = size as usize - 1;
    let remote = RemoteAddr {
        addr: c.reply.addr,
        rkey: c.reply.rkey,
    };
    let mut wcs = Vec::new();
    let mut b = [0u8];
    ping_pong(stop, prog, size, |i| {
        let s = stamp(i);
        mr.write(last, &[s])?; // the last byte of what we send
        let seen = echo_off + last; // where the server's echo puts it
        // Signal every 64th Write so the send queue drains.
        let flags = if i % 64 == 63 {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        // Built before the clock starts (see lat_send).
        let wr = SendWr::new(
            wr_id(KIND_DATA, 0, i),
            WrOpcode::RdmaWrite { remote },
            vec![mr.sge(0, len)],
        )
        .flags(flags);
        let t0 = Instant::now();
        c.qp.post_send_one(wr)?;
        loop {
            wcs.clear();
            cq.poll(&mut wcs, 16);
            for wc in &wcs {
                check(wc, "write ping-pong")?;
            }
            mr.read(seen, &mut b)?;
            if b[0] == s {
                break;
            }
            if t0.elapsed() > T {
                bail!("write ping-pong: no answer within {T:?}");
            }
            std::hint::spin_loop();
        }
        Ok(t0.elapsed())
    })
}

/// One Read or atomic at a time.
fn lat_one_sided(
    c: &mut ClientQp,
    op: Op,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    size: u64,
    stop: Stop,
    prog: &Progress,
) -> Result<Histogram<u64>> {
    let remote = RemoteAddr {
        addr: c.reply.addr,
        rkey: c.reply.rkey,
    };
    let (opcode, len) = match op {
        Op::Read => (WrOpcode::RdmaRead { remote }, size as u32),
        _ => (WrOpcode::AtomicFetchAdd { remote, add: 1 }, 8),
    };
    ping_pong(stop, prog, len as u64, |i| {
        // Built before the clock starts (see lat_send).
        let wr = SendWr::new(wr_id(KIND_DATA, 0, i), opcode.clone(), vec![mr.sge(0, len)]);
        let t0 = Instant::now();
        c.qp.post_send_one(wr)?;
        let wc = spin(cq, c.events)?;
        check(&wc, op.name())?;
        Ok(t0.elapsed())
    })
}

/// The loop every latency test runs: `one(i)` does message `i` and returns its round trip;
/// the first [`warmup`] messages are not recorded, then messages run until `stop`, each
/// recorded in the histogram and shown on the progress line (`bytes` per message).
fn ping_pong(
    stop: Stop,
    prog: &Progress,
    bytes: u64,
    mut one: impl FnMut(u64) -> Result<Duration>,
) -> Result<Histogram<u64>> {
    let mut hist = new_hist();
    let wu = warmup(stop);
    let mut start = Instant::now();
    for i in 0u64.. {
        if i == wu {
            start = Instant::now();
        }
        let measured = i.saturating_sub(wu);
        if i >= wu && !keep_going(stop, start, measured) {
            break;
        }
        let dt = one(i)?;
        if i >= wu {
            hist.record(dt.as_nanos().max(1) as u64)?;
            prog.tick(start, measured + 1, bytes);
        }
    }
    Ok(hist)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert!(parse_size("0").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("8G").is_err());
    }

    #[test]
    fn hello_and_reply_round_trip() {
        let h = Hello {
            op: Op::Read,
            flags: FLAG_LAT | FLAG_LAST,
            test_id: 7,
            qp_index: 3,
            qps: 4,
            depth: 128,
            size: 1 << 20,
            client_addr: 0x1234_5678_9abc,
            client_rkey: 0xdead_beef,
            session: 0x1234_5678,
        };
        let b = h.encode();
        assert!(b.len() <= 252, "fits siw's private data limit");
        assert_eq!(Hello::decode(&b).unwrap(), h);
        let r = Reply {
            addr: 42,
            rkey: 0x0102_0304,
            credits: 256,
            grant: 64,
            tcp_port: 5555,
        };
        assert_eq!(Reply::decode(&r.encode()).unwrap(), r);
        assert!(Hello::decode(&r.encode()).is_err());
    }

    #[test]
    fn report_round_trips_and_needs_its_magic() {
        let r = Report {
            messages: 5000,
            secs: 0.25,
            peak_gbit: 12.5,
            p50_ns: 0,
        };
        let mut b = r.encode();
        assert!(
            done_offset(64) + Report::LEN <= buffer_len(64) + 64,
            "fits the server's spare room"
        );
        assert_eq!(Report::decode(&b), Some(r));
        b[39] ^= 1;
        assert_eq!(Report::decode(&b), None);
        assert_eq!(Report::decode(&[0; Report::LEN]), None, "a dead client's zeros");
        assert!(
            (gbit_to_mb(8.0 * 1048576.0 / 1e9) - 1.0).abs() < 1e-12,
            "MB/sec is 2^20 bytes"
        );
    }

    #[test]
    fn wr_ids_split() {
        let id = wr_id(KIND_RECV, 513, 123_456_789);
        assert_eq!(split_wr_id(id), (KIND_RECV, 513, 123_456_789));
    }
}
