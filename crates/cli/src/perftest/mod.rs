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

mod ud;
pub mod wire;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args as ClapArgs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};
use verbs::*;
use wire::{BwReport, PingpongDest};

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
// Waiting for completions with a deadline, turning events into errors

/// A failed completion with what caused it: the engine queues the event (Terminate, peer
/// closed) before the completions it flushes, so it is there to be read now.
fn with_cause(qp: &QueuePair, wc: WorkCompletion, what: &str) -> Result<WorkCompletion> {
    if wc.status == WcStatus::Success {
        return Ok(wc);
    }
    match check_events(qp, what) {
        Err(e) => Err(e.context(format!(
            "{what}: completion with status {} (vendor_err {:#x})",
            wc.status, wc.vendor_err
        ))),
        Ok(()) => Ok(wc),
    }
}

fn wait_wc(cq: &CompletionQueue, qp: &QueuePair, deadline: Instant, what: &str) -> Result<WorkCompletion> {
    loop {
        if let Some(wc) = cq.poll_one() {
            return with_cause(qp, wc, what);
        }
        check_events(qp, what)?;
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "timed out waiting for {what} (--timeout; QP {}, peer {}): the peer went silent",
                qp.qp_num(),
                qp.conn_info().peer_addr
            );
        }
        // The cap only bounds how late an event without a completion is seen (the engine
        // queues events before the completions it flushes): idle costs five wake-ups a second.
        if let Some(wc) = cq.wait(Some((deadline - now).min(Duration::from_millis(200)))) {
            return with_cause(qp, wc, what);
        }
    }
}

/// Turns the QP's events into errors that say what ended the session, with the QP number
/// and the peer's address (issue 12 Diagnostics: at default log level, exit non-zero).
fn check_events(qp: &QueuePair, what: &str) -> Result<()> {
    while let Some(ev) = qp.get_event(Some(Duration::ZERO)) {
        let who = || format!("QP {}, peer {}", qp.qp_num(), qp.conn_info().peer_addr);
        match ev {
            CmEvent::Established => {}
            CmEvent::Disconnected => bail!("peer closed the connection ({}) while we waited for {what}", who()),
            CmEvent::ErrorReceived(t) => bail!("fatal error received ({}) while waiting for {what}: {t}", who()),
            CmEvent::ErrorSent(t) => bail!("fatal error sent ({}) while waiting for {what}: {t}", who()),
            CmEvent::ConnectionError(e) => bail!("peer reset the connection ({}) while waiting for {what}: {e}", who()),
        }
    }
    Ok(())
}

fn ok(wc: &WorkCompletion, op: WcOpcode, what: &str) -> Result<()> {
    if wc.status != WcStatus::Success {
        bail!(
            "{what}: completion with status {} (vendor_err {:#x})",
            wc.status,
            wc.vendor_err
        );
    }
    if wc.opcode != op {
        bail!("{what}: completion {:?}, expected {op:?}", wc.opcode);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The comm connection

const COMM_SLOT: usize = 64;
const COMM_RECVS: usize = 2;

struct Comm {
    qp: QueuePair,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    send_mr: MemoryRegion,
    recv_mr: MemoryRegion,
    client: bool,
    step: Duration,
    /// Messages exchanged so far (for error messages).
    count: usize,
    /// The receive slot to post again before the next receive.
    repost: Option<usize>,
}

struct CommParts {
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    send_mr: MemoryRegion,
    recv_mr: MemoryRegion,
    opts: QpOptions,
}

fn comm_parts(dev: &Device, pd: &ProtectionDomain) -> Result<CommParts> {
    let send_cq = dev.create_cq(16)?;
    let recv_cq = dev.create_cq(16)?;
    let send_mr = pd.reg_mr(COMM_SLOT, Access::LOCAL_WRITE)?;
    let recv_mr = pd.reg_mr(COMM_SLOT * COMM_RECVS, Access::LOCAL_WRITE)?;
    let recvs: Vec<RecvWr> = (0..COMM_RECVS)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sg_list: vec![recv_mr.sge(i * COMM_SLOT, COMM_SLOT as u32)],
        })
        .collect();
    let mut opts = QpOptions::new(&send_cq).post_recv(recvs).attr(QpInitAttr {
        max_send_wr: 4,
        max_recv_wr: COMM_RECVS as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpInitAttr::default()
    });
    opts.recv_cq = recv_cq.clone();
    Ok(CommParts {
        send_cq,
        recv_cq,
        send_mr,
        recv_mr,
        opts,
    })
}

impl Comm {
    fn new(qp: QueuePair, parts: CommParts, client: bool, step: Duration) -> Comm {
        Comm {
            qp,
            send_cq: parts.send_cq,
            recv_cq: parts.recv_cq,
            send_mr: parts.send_mr,
            recv_mr: parts.recv_mr,
            client,
            step,
            count: 0,
            repost: None,
        }
    }

    fn send(&mut self, data: &[u8], what: &str) -> Result<()> {
        self.send_mr
            .write(0, data)
            .map_err(|_| anyhow!("comm message too long"))?;
        self.qp
            .post_send_one(SendWr::new(
                0,
                WrOpcode::Send,
                vec![self.send_mr.sge(0, data.len() as u32)],
            ))
            .with_context(|| format!("posting the {what} Send"))?;
        let wc = wait_wc(
            &self.send_cq,
            &self.qp,
            Instant::now() + self.step,
            &format!("the {what} Send's completion"),
        )?;
        ok(&wc, WcOpcode::Send, &format!("comm Send ({what})"))
    }

    fn recv(&mut self, what: &str) -> Result<Vec<u8>> {
        // The slot of the previous message goes back now, not right after it came in: the peer
        // may disconnect right after its last message, and the other slot is still posted for
        // the one message the peer can send before it hears from us.
        // After the peer's last message its disconnect may already have moved the QP to the
        // error state; the message we wait for is then in the CQ, or the wait reports the
        // disconnect.
        if let Some(slot) = self.repost.take()
            && let Err(e) = self.qp.post_recv(&[RecvWr {
                wr_id: slot as u64,
                sg_list: vec![self.recv_mr.sge(slot * COMM_SLOT, COMM_SLOT as u32)],
            }])
        {
            tracing::debug!("comm receive not reposted: {e}");
        }
        let wc = wait_wc(
            &self.recv_cq,
            &self.qp,
            Instant::now() + self.step,
            &format!("the peer's {what} message (comm message {})", self.count + 1),
        )?;
        ok(&wc, WcOpcode::Recv, &format!("comm receive ({what})"))?;
        let slot = wc.wr_id as usize;
        let data = self
            .recv_mr
            .to_vec(slot * COMM_SLOT, wc.byte_len as usize)
            .map_err(|_| anyhow!("comm receive of {} bytes", wc.byte_len))?;
        self.repost = Some(slot);
        Ok(data)
    }

    /// `ctx_xchg_data_rdma`: the client sends first, the server answers.
    fn xchg(&mut self, mine: &[u8], what: &str) -> Result<Vec<u8>> {
        let theirs = if self.client {
            self.send(mine, what)?;
            self.recv(what)?
        } else {
            let t = self.recv(what)?;
            self.send(mine, what)?;
            t
        };
        self.count += 1;
        tracing::debug!("comm {}: {what}: sent {:02x?} got {:02x?}", self.count, mine, theirs);
        Ok(theirs)
    }

    /// `ctx_hand_shake`: one `pingpong_dest` each way.
    fn hand_shake(&mut self, mine: &PingpongDest, what: &str) -> Result<PingpongDest> {
        let b = self.xchg(&mine.encode(), what)?;
        Ok(PingpongDest::decode(&b)?)
    }
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

fn session(dev: &Device, args: &Args, mut p: Params, role: Role) -> Result<Outcome> {
    let step = Duration::from_secs(args.timeout.max(1));
    let pd = dev.alloc_pd()?;
    let client = matches!(role, Role::Client(_));
    let role_name = if client { "client" } else { "server" };

    // 1. comm connection.
    let parts = comm_parts(dev, &pd)?;
    let opts = parts.opts.clone();
    let mut listen_again = None;
    let (comm_qp, peer_addr) = match role {
        Role::Client(addr) => {
            let retry = Duration::from_secs(args.connect_timeout.clamp(1, args.timeout.max(1)));
            let waiting = crate::net::Notice::new(format!(
                "perftest client: waiting for a perftest server on {addr}; retrying for up to {} s \
                 (--connect-timeout)",
                retry.as_secs()
            ));
            let qp = connect_retry(&pd, addr, &opts, retry).context("comm connection (rdma_client_connect)")?;
            drop(waiting);
            std::thread::sleep(Duration::from_millis(args.first_send_delay_ms));
            (qp, addr)
        }
        Role::Server(addr) => {
            let l = dev.listen(addr).with_context(|| format!("listening on {addr}"))?;
            if addr.port() == 0 {
                // `-p 0`: the system chose the port; say which, so a caller (a test) can use it
                // without finding a free port first and racing others for it.
                eprintln!("perftest server: listening on {}", l.local_addr());
            }
            if !args.json {
                println!("\n************************************");
                println!("* Waiting for client to connect... *");
                println!("************************************");
            }
            let req = l
                .get_request(None)
                .context("waiting for the comm connection (rdma_server_connect)")?;
            let peer = req.peer_addr();
            let qp = req.accept(&pd, opts).context("accepting the comm connection")?;
            // As perftest: the listener goes once the comm connection is accepted, so a
            // second client is refused while this one is served; the data connection
            // gets a listener of its own on the same address.
            listen_again = Some(l.local_addr());
            drop(l);
            (qp, peer)
        }
    };
    let mut comm = Comm::new(comm_qp, parts, client, step);

    // 2. versions, sys data, MTU.
    let v = comm.xchg(&wire::encode_version(), "version")?;
    let peer = wire::decode_version(&v)?;
    let peer_name = if peer.softrdma {
        format!("softrdma (perftest {})", peer.text)
    } else {
        format!("perftest {}", peer.text)
    };
    let c = comm.xchg(&wire::encode_int(CYCLE_BUFFER), "cycle buffer")?;
    wire::decode_int("cycle buffer", &c)?;
    let c = comm.xchg(&wire::encode_int(CACHE_LINE), "cache line size")?;
    wire::decode_int("cache line size", &c)?;
    // check_mtu: both state their port's MTU and use the smaller (a peer's value outside
    // 1..=5 is ignored); -c UD then fits the message size to it.
    let ours = if p.iwarp {
        MTU
    } else {
        dev.query_port(1).map(|a| a.active_mtu.bytes()).unwrap_or(MTU)
    };
    let m = comm.xchg(&wire::encode_mtu(wire::mtu_enum(ours)), "MTU")?;
    p.mtu = match wire::decode_mtu(&m)? {
        Some(e) => ours.min(wire::mtu_bytes(e)),
        None => ours,
    };
    if p.ud {
        ud::fit_size(&mut p)?;
    }

    // 3. the data connection between two syncs.
    let zero = PingpongDest::default();
    comm.hand_shake(&zero, "sync before the data connection")?;
    let data = if p.ud {
        ud::data_connection(dev, &pd, &p, role, listen_again, peer_addr, step)?
    } else {
        data_connection(dev, &pd, &p, role, listen_again, peer_addr, step, peer.softrdma)?
    };
    comm.hand_shake(&zero, "sync after the data connection")?;

    // 4. addresses.
    // A UD QP has no connection: its address is the comm connection's (the same device).
    let addr_qp = if p.ud { &comm.qp } else { &data.qp };
    let local_ip = match addr_qp.conn_info().local_addr.ip() {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    };
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&local_ip.octets());
    let (rkey, vaddr) = match &data.credit {
        Some(c) => (c.rkey(), c.addr() + 4),
        None => (data.mr.rkey(), data.mr.addr() + p.half as u64),
    };
    let my = PingpongDest {
        lid: 0,
        out_reads: p.out_reads,
        qpn: data.qp.qp_num(),
        psn: psn(),
        rkey,
        vaddr,
        gid,
        srqn: 0,
        gid_index: 0,
    };
    // The payload goes in before the exchanges that tell the peer where it is: a read_bw
    // client reads the server's target as soon as the last exchange reaches it, so a pattern
    // written after it could be read before it was there (under load the check failed with
    // "the RDMA Read target does not hold the pattern": issue 18's perftest_loopback flake).
    let verify = peer.softrdma;
    let src = pattern(p.size as usize);
    data.mr.write(0, &src).map_err(|_| anyhow!("data region"))?;
    if verify && p.test.verb() == Verb::Read && !client {
        data.mr.write(p.half, &src).map_err(|_| anyhow!("data region"))?;
    }
    let mut rem: Option<PingpongDest> = None;
    for i in 0..p.test.preamble() {
        let d = comm.hand_shake(&my, "pingpong_dest")?;
        if let Some(prev) = rem
            && !prev.same_qp(&d)
        {
            bail!(
                "the peer's pingpong_dest changed in exchange {}: {prev:?} then {d:?}",
                i + 1
            );
        }
        rem = Some(d);
    }
    let rem = rem.expect("preamble has exchanges");
    std::thread::sleep(Duration::from_millis(args.pause_after_exchange_ms));
    if !args.json {
        print_header(&p, role_name, &peer_name, &my, &rem);
    }

    // 5. traffic and the closing exchanges.
    let deadline = Instant::now() + step + Duration::from_millis(p.iters); // generous
    let measured = match (p.test, client) {
        (Test::WriteBw | Test::ReadBw, true) => {
            let (report, verified) = bw_rdma_client(&data, &p, &rem, verify, deadline)?;
            comm.hand_shake(&my, "sync after the traffic")?;
            for (f, name) in report.encode().iter().zip(REPORT_FIELDS) {
                comm.xchg(f, name)?; // the server's fields are uninitialised in perftest
            }
            Measured::Bw {
                report,
                from_peer: false,
                verified,
            }
        }
        (Test::WriteBw | Test::ReadBw, false) => {
            comm.hand_shake(&my, "sync after the traffic")?;
            let mut fields = Vec::new();
            for (f, name) in BwReport::default().encode().iter().zip(REPORT_FIELDS) {
                fields.push(comm.xchg(f, name)?);
            }
            let report = BwReport::decode(&fields)?;
            let verified = if p.test == Test::WriteBw {
                "none on the target (the client verifies by reading back)".into()
            } else {
                "none (the client reads)".into()
            };
            Measured::Bw {
                report,
                from_peer: true,
                verified,
            }
        }
        (Test::SendBw, true) => {
            comm.hand_shake(&my, "sync before the traffic (receives posted)")?;
            let report = send_bw_client(&data, &p, &rem, deadline)?;
            Measured::Bw {
                report,
                from_peer: false,
                verified: if p.iwarp {
                    format!("{} Send completions, credits from the receiver", p.iters)
                } else {
                    format!("{} Send completions", p.iters)
                },
            }
        }
        (Test::SendBw, false) => {
            let posted = post_recvs(&data, &p, p.rx_depth as u64)?;
            comm.hand_shake(&my, "sync before the traffic (receives posted)")?;
            let (report, verified) = send_bw_server(&data, &p, &rem, posted, verify, deadline)?;
            Measured::Bw {
                report,
                from_peer: false,
                verified,
            }
        }
        (Test::WriteLat, _) => {
            let (lat, verified) = write_lat(&data, &p, &rem, client, deadline)?;
            Measured::Lat { lat, verified }
        }
        (Test::ReadLat, true) => {
            let (lat, verified) = read_lat(&data, &p, &rem, verify, deadline)?;
            Measured::Lat { lat, verified }
        }
        (Test::ReadLat, false) => Measured::Nothing,
        (Test::SendLat, _) => {
            let posted = post_recvs(&data, &p, p.rx_depth as u64)?;
            comm.hand_shake(&my, "sync before the traffic (receives posted)")?;
            let (lat, verified) = send_lat(&data, &p, client, posted, verify, deadline)?;
            Measured::Lat { lat, verified }
        }
    };
    // `ctx_close_connection`: one last `pingpong_dest`, in every test but ib_write_lat.
    if p.test != Test::WriteLat {
        comm.hand_shake(&my, "ctx_close_connection")?;
    }
    let out = Outcome {
        peer: peer_name,
        role: role_name,
        measured,
        p,
    };

    // perftest does not disconnect a UD data QP (`rdma_cm_disconnect_nodes` skips UD).
    let data_qp = (!p.ud).then_some(&data.qp);
    teardown(&comm.qp, data_qp, !peer.softrdma);
    Ok(out)
}

/// Waits up to `secs` for the peer to close `qp` (or for our own close to complete).
fn await_disconnect(qp: &QueuePair, secs: f64) -> bool {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    while let Some(ev) = qp.get_event(Some(until.saturating_duration_since(Instant::now()))) {
        if matches!(ev, CmEvent::Disconnected | CmEvent::ConnectionError(_)) {
            return true;
        }
    }
    false
}

/// perftest's `destroy_ctx` order: the data connection first, then comm. Linux siw completed
/// a Send or Write with IBV_WC_LOC_QP_OP_ERR when we closed right after its message had arrived
/// here (the last comm message of either side, perftest's last Write in ib_write_lat;
/// docs/interop-perftest.md, P3), so with a perftest peer we let it close first and only close
/// ourselves after a grace period. A softrdma peer completes its work requests once they are
/// on the wire, so between two softrdma ends both close at once. The grace was 3 s; in one
/// of 16 lab runs over rxe under heavy host load (TCG guest, load average 10), ib_write_lat's
/// client died of a general protection fault in librdmacm during its teardown, which our DREQ
/// may have met half-way: a perftest peer that closes normally is not slowed by a longer one.
fn teardown(comm: &QueuePair, data: Option<&QueuePair>, linger: bool) {
    const GRACE: f64 = 10.0;
    if let Some(data) = data
        && !(linger && await_disconnect(data, GRACE))
    {
        data.disconnect();
        await_disconnect(data, 2.0);
    }
    if !(linger && await_disconnect(comm, GRACE)) {
        comm.disconnect();
    }
}

const REPORT_FIELDS: [&str; 5] = [
    "report size",
    "report iterations",
    "report BW peak",
    "report BW average",
    "report MsgRate",
];

/// A 24-bit PSN, as `lrand48() & 0xffffff` (iWARP does not use it).
fn psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(1);
    (t.wrapping_mul(2_654_435_761) ^ std::process::id()) & 0xff_ffff
}

/// The payload pattern checked between two softrdma ends.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(7) % 251) as u8)
        .collect()
}

/// Between two softrdma ends: the target half holds the pattern (`what` names it in the
/// error); notes the check in `verified`.
fn check_pattern(d: &Data, p: &Params, what: &str, verified: &mut String) -> Result<()> {
    let got =
        d.mr.to_vec(p.half + p.grh(), p.size as usize)
            .map_err(|_| anyhow!("data region"))?;
    if got != pattern(p.size as usize) {
        bail!("payload check failed: {what} does not hold the pattern");
    }
    verified.push_str(", payload pattern checked");
    Ok(())
}

/// Where the peer's `pingpong_dest` says its buffer is.
fn remote_of(rem: &PingpongDest) -> RemoteAddr {
    RemoteAddr {
        addr: rem.vaddr,
        rkey: rem.rkey,
    }
}

/// Retries a refused connect, as perftest's client does while the server is not listening
/// yet (`rdma_cm_client_connection`: 10 tries 100 ms apart; here until `step` runs out).
fn connect_retry(pd: &ProtectionDomain, addr: SocketAddr, opts: &QpOptions, step: Duration) -> Result<QueuePair> {
    retry_refused(
        step,
        |t| pd.connect(addr, opts.clone(), t),
        || {
            format!(
                "no perftest server at {addr}: still refused after {} s of retries",
                step.as_secs()
            )
        },
        || format!("connecting to {addr}"),
    )
}

/// Runs `attempt` (given the time one try may take) until it is neither refused nor rejected
/// (the server not listening yet), 100 ms apart, for at most `step`: the retry loop of
/// perftest's `rdma_cm_client_connection`, for an RC connect and a UD resolution alike.
/// `gave_up` and `failed` name the two ways it ends in an error.
fn retry_refused<T>(
    step: Duration,
    mut attempt: impl FnMut(Duration) -> verbs::Result<T>,
    gave_up: impl Fn() -> String,
    failed: impl Fn() -> String,
) -> Result<T> {
    let deadline = Instant::now() + step;
    loop {
        match attempt(step.min(Duration::from_secs(10))) {
            Ok(v) => return Ok(v),
            Err(e @ (Error::ConnectionRefused | Error::Rejected { .. })) => {
                if Instant::now() >= deadline {
                    return Err(anyhow!(e).context(gave_up()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(anyhow!(e).context(failed())),
        }
    }
}

/// The data QP's completion queues and capacities (`ctx_init` / `create_qp_main`), the same
/// for an RC and a UD data QP.
fn data_resources(dev: &Device, p: &Params) -> Result<(CompletionQueue, CompletionQueue, QpInitAttr)> {
    let send_cq = dev.create_cq((p.tx_depth as usize + 16).max(64))?;
    let recv_cq = dev.create_cq((p.rx_depth as usize + 16).max(64))?;
    let cap = QpInitAttr {
        max_send_wr: p.tx_depth + 4,
        max_recv_wr: p.rx_depth + 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpInitAttr::default()
    };
    Ok((send_cq, recv_cq, cap))
}

/// The server's side of the data connection (`rdma_cm_server_connection`): listens anew on the
/// comm connection's address in port space `ps`, takes one request within `step` and checks
/// that it comes from the comm connection's peer. `what` names the request in errors. The
/// caller accepts it and then drops the listener.
fn data_request(
    dev: &Device,
    addr: SocketAddr,
    ps: PortSpace,
    peer: SocketAddr,
    step: Duration,
    what: &str,
) -> Result<(Listener, ConnectRequest)> {
    let l = dev
        .listen_in(addr, ps)
        .with_context(|| format!("listening on {addr} ({ps:?} port space) for {what}"))?;
    let req = l
        .get_request(Some(step))
        .with_context(|| format!("waiting for {what} (rdma_cm_server_connection)"))?;
    if req.peer_addr().ip() != peer.ip() {
        bail!(
            "{what} from {}, but the comm connection came from {peer}",
            req.peer_addr()
        );
    }
    Ok((l, req))
}

#[allow(clippy::too_many_arguments)]
fn data_connection(
    dev: &Device,
    pd: &ProtectionDomain,
    p: &Params,
    role: Role,
    listen_on: Option<SocketAddr>,
    peer: SocketAddr,
    step: Duration,
    softrdma_peer: bool,
) -> Result<Data> {
    let (send_cq, recv_cq, cap) = data_resources(dev, p)?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.reg_mr(2 * p.half, access)?;
    let credit = if p.test == Test::SendBw && p.iwarp {
        Some(pd.reg_mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?)
    } else {
        None
    };
    // perftest: IRD = ORD = out_reads for Read tests, 0 otherwise. Between two softrdma ends
    // write_bw reads its target back once, which needs one Read.
    let rd = if p.test.verb() == Verb::Read {
        p.out_reads.min(255) as u8
    } else if softrdma_peer && p.test == Test::WriteBw {
        1
    } else {
        0
    };
    let mut opts = QpOptions::new(&send_cq).rd_atomic(rd, rd).attr(cap);
    opts.recv_cq = recv_cq.clone();
    let qp = match role {
        Role::Client(addr) => {
            connect_retry(pd, addr, &opts, step).context("data connection (rdma_cm_client_connection)")?
        }
        Role::Server(_) => {
            let addr = listen_on.expect("server has listened");
            let (_l, req) = data_request(dev, addr, PortSpace::Tcp, peer, step, "the data connection")?;
            req.accept(pd, opts).context("accepting the data connection")?
        }
    };
    Ok(Data {
        qp,
        send_cq,
        recv_cq,
        mr,
        credit,
        ud: None,
    })
}

/// Receives of `size` bytes (UD: 40 more for the GRH) into the target half
/// (`ctx_set_recv_wqes`); returns how many.
fn post_recvs(d: &Data, p: &Params, n: u64) -> Result<u64> {
    let wrs: Vec<RecvWr> = (0..n)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: vec![d.mr.sge(p.half, (p.size as usize + p.grh()) as u32)],
        })
        .collect();
    d.qp.post_recv(&wrs).context("posting receives")?;
    Ok(n)
}

// ---------------------------------------------------------------------------------------
// Bandwidth

/// perftest's `print_report_bw` for our own timestamps: average over the whole run, peak
/// the best window from any post to any later completion (every WR is signaled here);
/// no peak above 20000 iterations, as perftest.
fn bw_report(p: &Params, posted: &[Instant], completed: &[Instant]) -> BwReport {
    let n = posted.len().min(completed.len());
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let total = secs(posted[0], completed[n - 1]).max(1e-9);
    let mb = p.size as f64 / (1u64 << 20) as f64;
    let bw_avg = mb * n as f64 / total;
    let mut bw_peak = 0.0;
    if n <= 20_000 {
        let mut best = f64::MAX;
        for (i, p) in posted.iter().enumerate().take(n) {
            for (j, c) in completed.iter().enumerate().take(n).skip(i) {
                let t = secs(*p, *c) / (j - i + 1) as f64;
                if t > 0.0 && t < best {
                    best = t;
                }
            }
        }
        if best < f64::MAX {
            bw_peak = mb / best;
        }
    }
    BwReport {
        size: p.size,
        iters: n as u64,
        bw_peak,
        bw_avg,
        msg_rate: n as f64 / total / 1e6,
    }
}

fn bw_rdma_client(
    d: &Data,
    p: &Params,
    rem: &PingpongDest,
    verify: bool,
    deadline: Instant,
) -> Result<(BwReport, String)> {
    let n = p.iters as usize;
    let remote = remote_of(rem);
    let (op, wc_op, what) = match p.test.verb() {
        Verb::Write => (WrOpcode::RdmaWrite { remote }, WcOpcode::RdmaWrite, "RDMA Write"),
        _ => (WrOpcode::RdmaRead { remote }, WcOpcode::RdmaRead, "RDMA Read"),
    };
    // Writes go from the source half, Reads land in the target half.
    let sge = match p.test.verb() {
        Verb::Write => d.mr.sge(0, p.size as u32),
        _ => d.mr.sge(p.half, p.size as u32),
    };
    let mut posted = Vec::with_capacity(n);
    let mut completed = Vec::with_capacity(n);
    let mut wcs = Vec::with_capacity(64);
    while completed.len() < n {
        while posted.len() < n && posted.len() - completed.len() < p.tx_depth as usize {
            posted.push(Instant::now());
            d.qp.post_send_one(SendWr::new(posted.len() as u64, op.clone(), vec![sge]))
                .with_context(|| format!("posting {what} {}", posted.len()))?;
        }
        wcs.clear();
        if d.send_cq.poll(&mut wcs, 64) == 0 {
            let wc = wait_wc(&d.send_cq, &d.qp, deadline, &format!("{what} completions"))?;
            wcs.push(wc);
        }
        let now = Instant::now();
        for wc in &wcs {
            ok(wc, wc_op, what)?;
            completed.push(now);
        }
    }
    let report = bw_report(p, &posted, &completed);
    let mut verified = format!("{n} {what} completions");
    if verify {
        if p.test.verb() == Verb::Write {
            // Read the target back over the same QP: its response follows every Write's placement.
            d.qp.post_send_one(SendWr::new(
                0,
                WrOpcode::RdmaRead { remote },
                vec![d.mr.sge(p.half, p.size as u32)],
            ))?;
            let wc = wait_wc(&d.send_cq, &d.qp, deadline, "the read-back")?;
            ok(&wc, WcOpcode::RdmaRead, "read-back of the written target")?;
        }
        check_pattern(d, p, &format!("the {what} target"), &mut verified)?;
    }
    Ok((report, verified))
}

fn credit_of(d: &Data) -> u32 {
    let mut b = [0u8; 4];
    if let Some(c) = &d.credit {
        let _ = c.read(4, &mut b);
    }
    wire::decode_credit(b)
}

/// `run_iter_bw`: with `send_rcredit` (iWARP) never more than rx_depth - 1 Sends beyond the
/// credit the receiver last wrote; without it (IB transport) only tx_depth bounds the Sends
/// in flight and the responder's RNR NAKs pace them.
fn send_bw_client(d: &Data, p: &Params, _rem: &PingpongDest, deadline: Instant) -> Result<BwReport> {
    let n = p.iters as usize;
    let sge = d.mr.sge(0, p.size as u32);
    let mut posted = Vec::with_capacity(n);
    let mut completed = Vec::with_capacity(n);
    let mut wcs = Vec::with_capacity(64);
    while completed.len() < n {
        let mut blocked = false;
        while posted.len() < n && posted.len() - completed.len() < p.tx_depth as usize {
            let window = (posted.len() as u64 + 1).saturating_sub(credit_of(d) as u64);
            if d.credit.is_some() && window >= p.rx_depth as u64 {
                blocked = true;
                break;
            }
            posted.push(Instant::now());
            d.qp.post_send_one(d.wr(SendWr::new(posted.len() as u64, WrOpcode::Send, vec![sge])))
                .with_context(|| format!("posting Send {}", posted.len()))?;
        }
        wcs.clear();
        if d.send_cq.poll(&mut wcs, 64) == 0 {
            if blocked && posted.len() == completed.len() {
                // Waiting for credit only: poll (which reads the socket) until it moves.
                check_events(&d.qp, "the receiver's credit")?;
                if Instant::now() >= deadline {
                    bail!(
                        "timed out waiting for the receiver's credit ({} of {n} sent)",
                        posted.len()
                    );
                }
                std::hint::spin_loop();
                continue;
            }
            wcs.push(wait_wc(&d.send_cq, &d.qp, deadline, "Send completions")?);
        }
        let now = Instant::now();
        for wc in &wcs {
            ok(wc, WcOpcode::Send, "Send")?;
            completed.push(now);
        }
    }
    Ok(bw_report(p, &posted, &completed))
}

/// A receive of a send test completed: successfully, with `size` bytes (the `rcnt`-th);
/// reposted while fewer than iters are posted (`rposted`).
fn recv_done(d: &Data, p: &Params, wc: &WorkCompletion, rcnt: &mut u64, rposted: &mut u64) -> Result<()> {
    ok(wc, WcOpcode::Recv, "receive")?;
    // UD: the byte count includes the 40-octet GRH area (ibv_wc.byte_len).
    if wc.byte_len as u64 != p.size + p.grh() as u64 {
        bail!(
            "receive {} has {} bytes, expected {}{}",
            *rcnt + 1,
            wc.byte_len,
            p.size,
            if p.ud { " + 40 of GRH" } else { "" }
        );
    }
    *rcnt += 1;
    if *rposted < p.iters {
        post_recvs(d, p, 1)?;
        *rposted += 1;
    }
    Ok(())
}

/// Waits for one credit RDMA Write's completion.
fn credit_write_done(d: &Data, deadline: Instant) -> Result<()> {
    let wc = wait_wc(&d.send_cq, &d.qp, deadline, "a credit Write's completion")?;
    ok(&wc, WcOpcode::RdmaWrite, "credit RDMA Write")
}

/// `run_iter_bw_server` with `send_rcredit`: repost while fewer than iters are posted,
/// RDMA Write the received count every rx_depth/3 receives.
fn send_bw_server(
    d: &Data,
    p: &Params,
    rem: &PingpongDest,
    mut posted: u64,
    verify: bool,
    deadline: Instant,
) -> Result<(BwReport, String)> {
    let n = p.iters;
    let credit_mr = d.credit.as_ref();
    let credit_every = (p.rx_depth / 3).max(1) as u64;
    let mut rcnt = 0u64;
    let mut credits_out = 0u64;
    let (mut first, mut last) = (None, Instant::now());
    let mut wcs = Vec::with_capacity(64);
    while rcnt < n {
        wcs.clear();
        if d.recv_cq.poll(&mut wcs, 64) == 0 {
            wcs.push(wait_wc(
                &d.recv_cq,
                &d.qp,
                deadline,
                &format!("Send {} of {n}", rcnt + 1),
            )?);
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        for wc in &wcs {
            recv_done(d, p, wc, &mut rcnt, &mut posted)?;
            if let Some(credit_mr) = credit_mr
                && (rcnt % p.rx_depth as u64).is_multiple_of(credit_every)
            {
                while credits_out >= p.tx_depth as u64 {
                    credit_write_done(d, deadline)?;
                    credits_out -= 1;
                }
                credit_mr
                    .write(0, &wire::encode_credit(rcnt as u32))
                    .map_err(|_| anyhow!("credit region"))?;
                let remote = remote_of(rem);
                d.qp.post_send_one(SendWr::new(
                    rcnt,
                    WrOpcode::RdmaWrite { remote },
                    vec![credit_mr.sge(0, 4)],
                ))
                .context("posting a credit RDMA Write")?;
                credits_out += 1;
            }
        }
    }
    while credits_out > 0 {
        credit_write_done(d, deadline)?;
        credits_out -= 1;
    }
    let t = last
        .saturating_duration_since(first.unwrap_or(last))
        .as_secs_f64()
        .max(1e-9);
    let mb = p.size as f64 / (1u64 << 20) as f64;
    let bw = mb * n as f64 / t;
    let report = BwReport {
        size: p.size,
        iters: n,
        bw_peak: bw,
        bw_avg: bw,
        msg_rate: n as f64 / t / 1e6,
    };
    let mut verified = format!("{n} receives of {} bytes", p.size);
    if verify {
        check_pattern(d, p, "the last Send", &mut verified)?;
    }
    Ok((report, verified))
}

// ---------------------------------------------------------------------------------------
// Latency

/// `print_report_lat`'s figures, in microseconds.
#[derive(Debug, Clone)]
pub struct LatReport {
    pub size: u64,
    pub iters: u64,
    pub t_min: f64,
    pub t_max: f64,
    pub t_typical: f64,
    pub t_avg: f64,
    pub t_stdev: f64,
    pub p99: f64,
    pub p99_9: f64,
}

/// perftest's method: the differences of consecutive post times (n - 1 of them), divided by
/// 2 for ping-pongs (write, send) and 1 for Read; sorted; the 2 largest dropped
/// (`LAT_MEASURE_TAIL`); median, average, standard deviation of the rest; `t_max`, 99% and
/// 99.9% taken at the indices perftest uses.
pub fn lat_report(size: u64, posted: &[Instant], rtt_factor: f64) -> LatReport {
    let mut delta: Vec<f64> = posted
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    delta.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mc = delta.len().saturating_sub(2).max(1);
    let median = if (mc - 1) % 2 == 1 && mc >= 2 {
        (delta[mc / 2] + delta[mc / 2 - 1]) / 2.0
    } else {
        delta[mc / 2]
    };
    let avg = delta[..mc].iter().sum::<f64>() / mc as f64;
    let var = delta[..mc].iter().map(|d| (d - avg) * (d - avg)).sum::<f64>() / mc as f64;
    let at = |q: f64| delta[((mc as f64 * q).ceil() as usize).min(delta.len() - 1)];
    LatReport {
        size,
        iters: posted.len() as u64,
        t_min: delta[0],
        t_max: delta[mc.min(delta.len() - 1)],
        t_typical: median,
        t_avg: avg,
        t_stdev: var.sqrt(),
        p99: at(0.99),
        p99_9: at(0.999),
    }
}

fn read_byte(mr: &MemoryRegion, off: usize) -> u8 {
    let mut b = [0u8; 1];
    let _ = mr.read(off, &mut b);
    b[0]
}

/// `run_iter_lat_write`: each side RDMA Writes `size` bytes whose last byte is its send
/// count, and waits for the peer's last byte to reach its receive count; the server waits
/// before its first Write.
fn write_lat(d: &Data, p: &Params, rem: &PingpongDest, client: bool, deadline: Instant) -> Result<(LatReport, String)> {
    let n = p.iters;
    let size = p.size as usize;
    let poll_off = p.half + size - 1;
    let remote = remote_of(rem);
    let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
    let mut posted = Vec::with_capacity(n as usize);
    let mut spins = 0u64;
    while scnt < n || ccnt < n || rcnt < n {
        // The server waits for the client's first Write before its own.
        if rcnt < n && (client || scnt >= 1) {
            rcnt += 1;
            let want = rcnt as u8;
            while read_byte(&d.mr, poll_off) != want {
                // Polling the CQ reads the socket (run-to-completion); nothing is outstanding.
                if let Some(wc) = d.send_cq.poll_one() {
                    bail!(
                        "unexpected completion {:?} while waiting for the peer's Write",
                        wc.opcode
                    );
                }
                spins += 1;
                if spins.is_multiple_of(4096) {
                    check_events(&d.qp, "the peer's RDMA Write")?;
                    if Instant::now() >= deadline {
                        bail!("timed out waiting for the peer's Write {rcnt} of {n}");
                    }
                }
            }
        }
        if scnt < n {
            posted.push(Instant::now());
            scnt += 1;
            d.mr.write(size - 1, &[scnt as u8])
                .map_err(|_| anyhow!("data region"))?;
            d.qp.post_send_one(SendWr::new(
                scnt,
                WrOpcode::RdmaWrite { remote },
                vec![d.mr.sge(0, size as u32)],
            ))
            .with_context(|| format!("posting RDMA Write {scnt}"))?;
        }
        if ccnt < n {
            let wc = wait_wc(&d.send_cq, &d.qp, deadline, "an RDMA Write completion")?;
            ok(&wc, WcOpcode::RdmaWrite, "RDMA Write")?;
            ccnt += 1;
        }
    }
    Ok((
        lat_report(p.size, &posted, 2.0),
        format!("{n} Writes each way, the peer's sequence byte checked on each"),
    ))
}

/// `run_iter_lat`: one RDMA Read at a time (client only).
fn read_lat(d: &Data, p: &Params, rem: &PingpongDest, verify: bool, deadline: Instant) -> Result<(LatReport, String)> {
    let remote = remote_of(rem);
    let mut posted = Vec::with_capacity(p.iters as usize);
    for i in 0..p.iters {
        posted.push(Instant::now());
        d.qp.post_send_one(SendWr::new(
            i,
            WrOpcode::RdmaRead { remote },
            vec![d.mr.sge(p.half, p.size as u32)],
        ))
        .with_context(|| format!("posting RDMA Read {}", i + 1))?;
        let wc = wait_wc(&d.send_cq, &d.qp, deadline, "an RDMA Read completion")?;
        ok(&wc, WcOpcode::RdmaRead, "RDMA Read")?;
    }
    let mut verified = format!("{} Read completions", p.iters);
    if verify {
        check_pattern(d, p, "the Read data", &mut verified)?;
    }
    Ok((lat_report(p.size, &posted, 1.0), verified))
}

/// `run_iter_lat_send`: ping-pong of Sends, the client first; receives reposted while
/// fewer than iters are posted.
fn send_lat(
    d: &Data,
    p: &Params,
    client: bool,
    mut rposted: u64,
    verify: bool,
    deadline: Instant,
) -> Result<(LatReport, String)> {
    let n = p.iters;
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut posted = Vec::with_capacity(n as usize);
    while scnt < n || rcnt < n {
        if rcnt < n && !(scnt < 1 && client) {
            let wc = wait_wc(&d.recv_cq, &d.qp, deadline, &format!("Send {} of {n}", rcnt + 1))?;
            recv_done(d, p, &wc, &mut rcnt, &mut rposted)?;
        }
        if scnt < n {
            posted.push(Instant::now());
            scnt += 1;
            d.qp.post_send_one(d.wr(SendWr::new(scnt, WrOpcode::Send, vec![d.mr.sge(0, p.size as u32)])))
                .with_context(|| format!("posting Send {scnt}"))?;
            let wc = wait_wc(&d.send_cq, &d.qp, deadline, "a Send completion")?;
            ok(&wc, WcOpcode::Send, "Send")?;
        }
    }
    let mut verified = format!("{n} Sends each way of {} bytes", p.size);
    if verify {
        check_pattern(d, p, "the last Send", &mut verified)?;
    }
    Ok((lat_report(p.size, &posted, 2.0), verified))
}

// ---------------------------------------------------------------------------------------
// Output

const RESULT_LINE: &str = "---------------------------------------------------------------------------------------";

fn print_header(p: &Params, role: &str, peer: &str, my: &PingpongDest, rem: &PingpongDest) {
    println!("{RESULT_LINE}");
    println!("                    {}", p.test.title());
    println!(" softrdma perftest {} ({role}), peer: {peer}", p.test.name());
    let transport = if p.iwarp { "IW" } else { "IB" };
    println!(" Number of qps   : 1\t\tTransport type : {transport}");
    let conn = if p.ud { "UD" } else { "RC" };
    println!(" Connection type : {conn}\t\tData ex. method : rdma_cm");
    println!(" Mtu             : {}[B]", p.mtu);
    if p.test.bw() {
        println!(" TX depth        : {}", p.tx_depth);
    }
    if p.test.verb() == Verb::Send {
        println!(" RX depth        : {}", p.rx_depth);
    }
    if p.test.verb() == Verb::Read {
        println!(" Outstand reads  : {}", p.out_reads);
    }
    println!("{RESULT_LINE}");
    for (side, d) in [("local", my), ("remote", rem)] {
        println!(
            " {side} address: LID {:04x} QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
            d.lid, d.qpn, d.psn, d.rkey, d.vaddr
        );
    }
    println!("{RESULT_LINE}");
}

/// `perftest --json` (docs/json.md, "perftest"): the family's names and units.
#[derive(serde::Serialize)]
struct PerftestJson<'a> {
    tool: &'static str,
    test: &'static str,
    role: &'a str,
    peer: &'a str,
    figures_from: &'static str,
    size: Option<u64>,
    iters: Option<u64>,
    #[serde(flatten)]
    bw: Option<PerftestBw>,
    /// Latency tests (null for bandwidth): perftest's t_typical is `p50_us`.
    lat: Option<PerftestLat>,
    verified: Option<&'a str>,
}

impl<'a> PerftestJson<'a> {
    /// The object of a side that measured nothing (read_lat's server).
    fn new(p: &Params, role: &'a str, peer: &'a str) -> Self {
        PerftestJson {
            tool: "perftest",
            test: p.test.name(),
            role,
            peer,
            figures_from: "none (the client measures)",
            size: None,
            iters: None,
            bw: None,
            lat: None,
            verified: None,
        }
    }
}

#[derive(serde::Serialize)]
struct PerftestBw {
    mb_per_s: f64,
    mb_per_s_peak: f64,
    gbit_per_s: f64,
    gbit_per_s_peak: f64,
    msg_per_s: f64,
}

#[derive(serde::Serialize)]
struct PerftestLat {
    #[serde(flatten)]
    lat: crate::report::Latency,
    stdev_us: f64,
}

impl Outcome {
    fn print(&self, args: &Args) {
        let p = &self.p;
        let (peer, role) = (&self.peer, self.role);
        match &self.measured {
            Measured::Bw {
                report: r,
                from_peer,
                verified,
            } => {
                if args.json {
                    // perftest's MB/sec is 2^20 bytes per second, as the family's mb_per_s.
                    let g = |mb: f64| mb * 1048576.0 * 8.0 / 1e9;
                    crate::report::print_line(&PerftestJson {
                        figures_from: if *from_peer { "peer" } else { "local" },
                        size: Some(r.size),
                        iters: Some(r.iters),
                        bw: Some(PerftestBw {
                            mb_per_s: r.bw_avg,
                            mb_per_s_peak: r.bw_peak,
                            gbit_per_s: g(r.bw_avg),
                            gbit_per_s_peak: g(r.bw_peak),
                            msg_per_s: r.msg_rate * 1e6,
                        }),
                        verified: Some(verified),
                        ..PerftestJson::new(p, role, peer)
                    });
                    return;
                }
                println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
                println!(
                    " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
                    r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
                );
                println!("{RESULT_LINE}");
                if *from_peer {
                    println!(" (the client's figures, as perftest's server prints them)");
                }
                println!(" verified: {verified}");
            }
            Measured::Lat { lat: l, verified } => {
                if args.json {
                    crate::report::print_line(&PerftestJson {
                        figures_from: "local",
                        size: Some(l.size),
                        iters: Some(l.iters),
                        lat: Some(PerftestLat {
                            lat: crate::report::Latency {
                                min_us: l.t_min,
                                max_us: l.t_max,
                                avg_us: l.t_avg,
                                p50_us: l.t_typical,
                                p99_us: l.p99,
                                p999_us: l.p99_9,
                            },
                            stdev_us: l.t_stdev,
                        }),
                        verified: Some(verified),
                        ..PerftestJson::new(p, role, peer)
                    });
                    return;
                }
                println!(
                    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
                );
                println!(
                    " {:<7} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
                    l.size, l.iters, l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p99_9
                );
                println!("{RESULT_LINE}");
                println!(" verified: {verified}");
            }
            Measured::Nothing => {
                if args.json {
                    crate::report::print_line(&PerftestJson::new(p, role, peer));
                } else {
                    println!(" (the client measures; nothing to report here)");
                    println!("{RESULT_LINE}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, us: &[u64]) -> Vec<Instant> {
        us.iter().map(|u| base + Duration::from_micros(*u)).collect()
    }

    #[test]
    fn lat_report_follows_perftest() {
        // Post times 0,10,20,...: deltas 10 us each except two outliers that are dropped.
        let b = Instant::now();
        let mut t = vec![0u64];
        for d in [10, 10, 10, 10, 10, 10, 500, 900] {
            let last = *t.last().unwrap();
            t.push(last + d);
        }
        let r = lat_report(2, &at(b, &t), 2.0);
        assert_eq!(r.iters, 9);
        assert!((r.t_min - 5.0).abs() < 1e-6, "{r:?}");
        assert!((r.t_typical - 5.0).abs() < 1e-6, "{r:?}");
        assert!((r.t_avg - 5.0).abs() < 1e-6, "{r:?}");
        // t_max is delta[measure_cnt], the smaller of the two dropped ones (perftest's index).
        assert!((r.t_max - 250.0).abs() < 1e-6, "{r:?}");
        let read = lat_report(2, &at(b, &t), 1.0);
        assert!((read.t_min - 10.0).abs() < 1e-6);
    }

    #[test]
    fn bw_report_average_and_peak() {
        let p = Params {
            test: Test::WriteBw,
            size: 1 << 20,
            iters: 4,
            tx_depth: 4,
            rx_depth: 1,
            out_reads: 1,
            half: 1 << 20,
            ud: false,
            size_given: true,
            mtu: MTU,
            iwarp: true,
        };
        let b = Instant::now();
        let posted = at(b, &[0, 0, 0, 0]);
        let completed = at(b, &[1_000_000, 1_500_000, 1_750_000, 2_000_000]);
        let r = bw_report(&p, &posted, &completed);
        assert!((r.bw_avg - 2.0).abs() < 1e-9, "{r:?}"); // 4 MiB in 2 s
        assert!((r.bw_peak - 2.0).abs() < 1e-9, "{r:?}"); // best window is the whole run
        assert!((r.msg_rate - 2e-6).abs() < 1e-12);
    }

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
