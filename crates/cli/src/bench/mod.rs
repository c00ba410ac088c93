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
//!
//! Files by role: this one (options, limits, [`run`]), `proto.rs` (hello, reply, report,
//! buffer layout), `client.rs` (one test's connections and end, work-request IDs),
//! `bw.rs` and `lat.rs` (the measured loops), `output.rs` (results, tables, JSON),
//! `server.rs` (the `--listen` side), `tcp.rs`/`udp.rs` (the baselines), `ud.rs` (UD tests).

use crate::report::{Bandwidth, Latency};
use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::Histogram;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};
use verbs::*;

mod bw;
mod client;
mod lat;
mod output;
mod proto;
mod server;
mod tcp;
mod ud;
mod udp;

use crate::procstat::cpu_secs;
use bw::*;
use client::*;
use lat::*;
use output::*;
use proto::*;
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
latency (ratio of p50s) lower is better. The bandwidth baseline is the fairest plain-TCP
transfer of the same bytes: one connection per QP, blocking write() of each message from a
page-aligned buffer, and a sink that read()s up to 1 MiB at a time into a page-aligned buffer
(a receive buffer 16 bytes into a page, as a plain 1 MiB Vec is, makes the kernel's copy 2-3x
dearer on AMD CPUs) and confirms the byte count; the JSON's baseline.method says what ran.

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
