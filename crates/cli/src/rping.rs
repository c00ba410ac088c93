//! `softrdma rping`: librdmacm's `rping` example protocol over softrdma's iWARP
//! provider, so that it talks to Linux's `rping` (over soft-iWARP) in either role.
//!
//! The exchange, per ping (as in rping.c and in a capture of two Linux rpings,
//! `lab/results/vm-lo-siw-rping.pcap`):
//!
//! ```text
//!  client                                   server
//!  Send  rping_rdma_info{start buf}  ───▶   (16 bytes: be64 addr, be32 rkey, be32 size)
//!                                    ◀───   RDMA Read Request of the whole start buffer
//!  Read Response (size bytes)        ───▶
//!                                    ◀───   Send "go ahead" (16 bytes, all zero: rping's
//!                                            server never fills its send buffer)
//!  Send  rping_rdma_info{sink buf}   ───▶
//!                                    ◀───   RDMA Write of strlen(data) + 1 bytes to the sink
//!                                    ◀───   Send "go ahead" (16 zero bytes)
//! ```
//!
//! The ping data is `"rdma-ping-%d: "` followed by ASCII rotating through
//! `'A'..='z'`, starting one character later on each ping, NUL-terminated at
//! `size - 1`. Connection parameters: IRD 1, ORD 1, no private data (the
//! server accepts with the values the client stated). The client disconnects
//! after `-C` pings; the server serves one connection and exits when it is
//! disconnected. `-v` prints `ping data: ...` (client) and `server ping data:
//! ...` (server), `-V` compares the buffer that came back with the one sent.
//!
//! Failures (issue 12 point 9): a failed session is reported as one line with
//! the QP number and the peer's address, the first completion that failed
//! other than by a flush (status as rping prints it, the Terminate cause in
//! `vendor_err`) and the CM event (Terminate received or sent, peer closed,
//! reset), whichever the program saw first; the exit status is then non-zero.
//! Posting to a QP in the Error state completes with `WR_FLUSH_ERR` (as with
//! rdma-core and siw), so no call order hides the cause. A disconnect where a
//! ping ends (the server waiting for the next advertisement) ends the session
//! normally, with "peer closed the connection" on stderr; in the middle of a
//! ping it fails the session.
//!
//! Server resource model (issue 12): one client; the listener is closed once
//! it is accepted, so a second client's connect is refused. `--timeout` (60 s)
//! bounds every wait, so a client that connects and goes silent is dropped
//! with a message naming it. While idle the server sleeps on its CQ (every
//! event that matters is followed by a completion: a receive is always
//! posted), waking twice a second. With `-P` (persistent, as rping's) the listener stays
//! open and each client gets a thread, at most 16 at once (more are rejected); a failed
//! session is reported and the server goes on until killed.
//!
//! The client's `-I ADDR` (source address, rping's `rdma_resolve_addr` source) and `-t TOS`
//! (IP type of service, rping's `RDMA_OPTION_ID_TOS`; decimal or 0x hex) go to the verbs
//! connect as [`RouteOptions`]; as in rping they apply to the connection the client makes.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};
use verbs::cm::RouteOptions;
use verbs::*;

/// `struct rping_rdma_info`: buf (be64), rkey (be32), size (be32).
pub const INFO_LEN: usize = 16;
/// rping.c: `RPING_MSG_FMT`.
const MSG_FMT_PREFIX: &str = "rdma-ping-";
/// rping.c: `sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT)` = 11 + 15.
pub const MIN_SIZE: usize = 26;
/// rping.c: `RPING_BUFSIZE - 1`.
pub const MAX_SIZE: usize = 64 * 1024 - 1;
/// rping.c: `RPING_SQ_DEPTH`.
const SQ_DEPTH: u32 = 16;

const WR_SEND: u64 = 1;
const WR_RDMA: u64 = 2;
const WR_RECV: u64 = 3;

#[derive(Args, Debug, Clone)]
#[command(disable_version_flag = true)]
pub struct RpingArgs {
    /// Server side.
    #[arg(short = 's', conflicts_with = "client", required_unless_present = "client")]
    pub server: bool,
    /// Client side.
    #[arg(short = 'c')]
    pub client: bool,
    /// Server: persistent mode, as rping's -P: serve clients until killed, each on its own
    /// thread (at most 16 at once; more are rejected with the reason), a failed session
    /// reported and the next client served.
    #[arg(short = 'P', conflicts_with = "client")]
    pub persistent: bool,
    /// Address: the server's to connect to (client) or to bind to (server; default any).
    #[arg(short = 'a')]
    pub addr: Option<String>,
    /// Client: the local address to connect from (rping's -I; default: the routing table's choice).
    #[arg(short = 'I', value_name = "ADDR", conflicts_with = "server")]
    pub source: Option<String>,
    /// Client: IP type of service of the connection's packets (rping's -t), 0 to 255, decimal
    /// or 0x hex (0x10: low delay).
    #[arg(short = 't', value_name = "TOS", conflicts_with = "server", value_parser = parse_tos)]
    pub tos: Option<u8>,
    /// Port.
    #[arg(short = 'p', default_value_t = 7174)]
    pub port: u16,
    /// Ping count (0: forever).
    #[arg(short = 'C', default_value_t = 0)]
    pub count: u64,
    /// Ping data size in bytes (26 to 65535).
    #[arg(short = 'S', default_value_t = 64)]
    pub size: usize,
    /// Display ping data on stdout.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Validate ping data (client).
    #[arg(short = 'V')]
    pub validate: bool,
    /// Debug output (rping's DEBUG_LOG lines) on stdout.
    #[arg(short = 'd')]
    pub debug: bool,
    /// The device: --provider iwarp|roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    pub dev: crate::providers::DeviceArgs,
    /// iWARP: ask for MPA CRC32c (the peer may still turn it on when we do not).
    #[arg(long, value_parser = ["on", "off"])]
    pub crc: Option<String>,
    /// iWARP: MPA revision to request (1: RFC 5044, 2: RFC 6581 with IRD/ORD; default 2).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub mpa_rev: Option<u8>,
    /// iWARP: peer-to-peer mode (RFC 6581) with these RTR types offered: none (the default),
    /// write, read, send, or a comma list such as write,read.
    #[arg(long)]
    pub p2p: Option<String>,
    /// iWARP: send Terminates in Linux siw's bit order instead of the RFC's.
    #[arg(long)]
    pub siw_terminate: bool,
    /// Client: wait this many milliseconds between connection establishment and the first
    /// Send. Linux 6.1's siw as responder misses an FPDU that arrives right after its MPA
    /// Reply and stalls (see docs/interop-siw.md); 50 ms avoids it, 0 sends at once.
    #[arg(long, default_value_t = 50)]
    pub first_send_delay_ms: u64,
    /// Interop testing: the client advertises its start buffer with a wrong STag key, the
    /// server issues its first RDMA Read with one, so that the peer answers with a Terminate.
    #[arg(long, hide = true)]
    pub test_bad_stag: bool,
    /// Interop testing (server): reject the connect request with this many bytes of private
    /// data (0x00, 0x01, ... 0xff, 0x00, ...) instead of accepting it.
    #[arg(long, hide = true)]
    pub test_reject: Option<usize>,
    /// Interop testing: connect (client) or accept (server) with this many bytes of private
    /// data (0x00, 0x01, ...) instead of none.
    #[arg(long, hide = true)]
    pub test_pd: Option<usize>,
    /// Interop testing: stop once the connection is established (after printing the peer's
    /// private data): the client disconnects after --first-send-delay-ms, the server waits
    /// for the disconnect. No pings.
    #[arg(long, hide = true)]
    pub test_connect_only: bool,
    /// Interop testing: the largest MPA private data we send, IRD/ORD octets included
    /// (IwarpConfig::max_private_data_tx; default 256 for siw, at most RFC 5044's 512).
    #[arg(long, hide = true)]
    pub test_max_pd_tx: Option<usize>,
    /// Give up when a step (connect, a completion, a connect request) takes longer than
    /// this many seconds; 0 waits forever like rping.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

impl RpingArgs {
    fn timeout(&self) -> Option<Duration> {
        (self.timeout > 0).then(|| Duration::from_secs(self.timeout))
    }

    /// The provider-specific flags given (refused by a provider that does not take them).
    fn device_flags(&self) -> Vec<crate::providers::Flag> {
        use crate::providers::Flag;
        let mut f: Vec<Flag> = Flag::crc(self.crc.as_deref()).into_iter().collect();
        if let Some(r) = self.mpa_rev {
            f.push(Flag::new("--mpa-rev", "mpa_rev", r));
        }
        if let Some(p) = &self.p2p {
            f.push(Flag::new("--p2p", "p2p", p));
        }
        if self.siw_terminate {
            f.push(Flag::new("--siw-terminate", "terminate_form", "siw"));
        }
        if let Some(n) = self.test_max_pd_tx {
            f.push(Flag::new("--test-max-pd-tx", "max_private_data_tx", n));
        }
        f
    }

    /// Where the device talks from: the server's bind address, or the route to the server.
    fn endpoint(&self) -> Result<crate::providers::Endpoint> {
        use crate::providers::Endpoint;
        Ok(if self.server {
            Endpoint::Listen(resolve(self.addr.as_deref().unwrap_or("0.0.0.0"), 0)?.ip())
        } else {
            Endpoint::Connect {
                dest: resolve(self.addr.as_deref().context("client needs -a ADDR")?, 0)?.ip(),
                source: self
                    .source
                    .as_deref()
                    .map(|s| resolve(s, 0))
                    .transpose()?
                    .map(|a| a.ip()),
            }
        })
    }
}

/// The ping data of ping number `ping` (rping_test_client): the text, then
/// ASCII from `start` rotating through 'A'..='z', NUL at the end.
pub fn ping_data(ping: u64, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    let head = format!("{MSG_FMT_PREFIX}{ping}: ");
    // snprintf truncates at size - 1 and returns the untruncated length.
    let cc = head.len();
    let n = cc.min(size.saturating_sub(1));
    buf[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = b'A' + (ping % 58) as u8;
    for b in buf.iter_mut().skip(cc) {
        *b = c;
        c += 1;
        if c > b'z' {
            c = b'A';
        }
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
    buf
}

/// Encodes `struct rping_rdma_info` in network byte order.
pub fn encode_info(addr: u64, rkey: u32, size: u32) -> [u8; INFO_LEN] {
    let mut b = [0u8; INFO_LEN];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

/// Decodes `struct rping_rdma_info`: (buf, rkey, size).
pub fn decode_info(b: &[u8; INFO_LEN]) -> (u64, u32, u32) {
    (
        u64::from_be_bytes(b[..8].try_into().unwrap()),
        u32::from_be_bytes(b[8..12].try_into().unwrap()),
        u32::from_be_bytes(b[12..].try_into().unwrap()),
    )
}

/// The `enum ibv_wc_status` number rping prints in "cq completion failed status %d".
fn ibv_status(s: WcStatus) -> u32 {
    match s {
        WcStatus::Success => 0,
        WcStatus::LocLenErr => 1,
        WcStatus::LocQpOpErr => 2,
        WcStatus::LocProtErr => 4,
        WcStatus::WrFlushErr => 5,
        WcStatus::MwBindErr => 6,
        WcStatus::BadRespErr => 7,
        WcStatus::LocAccessErr => 8,
        WcStatus::RemInvReqErr => 9,
        WcStatus::RemAccessErr => 10,
        WcStatus::RemOpErr => 11,
        WcStatus::RetryExcErr => 12,
        WcStatus::RnrRetryExcErr => 13,
        WcStatus::FatalErr => 19,
        WcStatus::RespTimeoutErr => 20,
        WcStatus::GeneralErr => 21,
    }
}

/// What the completion handler tells the main loop (rping's `cb->state` changes).
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Recv,
    ReadComplete,
    WriteComplete,
    Disconnected,
}

/// One connected rping endpoint: QP, CQ and the four buffers of `struct rping_cb`.
struct Endpoint<'a> {
    args: &'a RpingArgs,
    qp: QueuePair,
    cq: CompletionQueue,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    rdma_mr: MemoryRegion,
    role: &'static str,
    /// The peer's address and our QP number, for every report about the session.
    peer: SocketAddr,
    qpn: u32,
    disconnected: bool,
    /// The rping_rdma_info of the last receive (copied out before the re-post).
    last_info: [u8; INFO_LEN],
}

impl Endpoint<'_> {
    fn debug(&self, msg: impl AsRef<str>) {
        if self.args.debug {
            println!("{}", msg.as_ref());
        }
    }

    fn post_recv(&self) -> Result<()> {
        self.qp
            .post_recv(&[info_recv(&self.recv_mr)])
            .context("post recv error")
    }

    fn post_send_info(&self) -> Result<()> {
        self.qp
            .post_send_one(SendWr::new(
                WR_SEND,
                WrOpcode::Send,
                vec![self.send_mr.sge(0, INFO_LEN as u32)],
            ))
            .context("post send error")
    }

    fn received_info(&self) -> Result<[u8; INFO_LEN]> {
        let mut b = [0u8; INFO_LEN];
        self.recv_mr.read(0, &mut b).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        Ok(b)
    }

    /// Why the session failed, whatever was seen first: the first failed
    /// completion that is not a flush (status, Terminate cause in
    /// `vendor_err`) and the CM event (Terminate received or sent, peer
    /// closed, connection error), each if there is one (issue 12 point 9).
    ///
    /// Deterministic, whatever the order the two were seen in: the engine
    /// queues a failure's event before the completions it flushes, in one
    /// critical section under the QP's lock; an (empty) post takes that lock,
    /// so after it every completion of that section is in the CQ.
    fn failure(&mut self, wc: Option<WorkCompletion>, ev: Option<CmEvent>) -> anyhow::Error {
        let _ = self.qp.post_send(&[]);
        let mut cause = wc
            .clone()
            .filter(|w| w.status != WcStatus::Success && w.status != WcStatus::WrFlushErr);
        while cause.is_none() {
            match self.cq.poll_one() {
                Some(w) if w.status != WcStatus::Success && w.status != WcStatus::WrFlushErr => cause = Some(w),
                Some(_) => {}
                None => break,
            }
        }
        // Queued before the completion we saw (see above); the wait only covers a local
        // failure that has no event.
        let event = ev.or_else(|| self.cause_event(Duration::from_millis(200)));
        let mut parts = Vec::new();
        if let Some(w) = &cause {
            parts.push(format!(
                "cq completion failed status {} ({}, vendor_err {:#08x}) on {:?}",
                ibv_status(w.status),
                w.status,
                w.vendor_err,
                w.opcode
            ));
        }
        match &event {
            Some(CmEvent::ErrorReceived(d)) => parts.push(format!("fatal error received from the peer: {d}")),
            Some(CmEvent::ErrorSent(d)) => parts.push(format!("fatal error sent to the peer: {d}")),
            Some(CmEvent::Disconnected) => parts.push("peer closed the connection".into()),
            Some(CmEvent::ConnectionError(e)) => parts.push(format!("peer reset the connection: {e}")),
            _ => {}
        }
        if parts.is_empty() {
            let flushed = wc.map_or(String::new(), |w| format!(" (wr {} {})", w.wr_id, w.status));
            parts.push(format!("QP in state {:?}{flushed}", self.qp.state()));
        }
        anyhow::anyhow!(
            "{} session failed (QP {}, peer {}): {}",
            self.role,
            self.qpn,
            self.peer,
            parts.join("; ")
        )
    }

    /// The next event other than `Established` (which only rping's debug output shows).
    fn cause_event(&self, wait: Duration) -> Option<CmEvent> {
        loop {
            match self.qp.get_event(Some(wait))? {
                CmEvent::Established => self.debug("ESTABLISHED"),
                e => return Some(e),
            }
        }
    }

    /// The peer closed the connection: said at default log level with the QP
    /// and the peer's address (rping's "DISCONNECT EVENT" line too).
    fn on_disconnect(&mut self) {
        if !self.disconnected {
            eprintln!("{} DISCONNECT EVENT...", self.role);
            eprintln!(
                "{}: peer closed the connection (QP {}, peer {})",
                self.role, self.qpn, self.peer
            );
            self.disconnected = true;
        }
    }

    /// rping's cq_thread and CM thread folded into one wait: the next receive,
    /// Read or Write completion, or the disconnect. Send completions are
    /// consumed on the way; a receive is re-posted at once, as rping does.
    fn next(&mut self) -> Result<Step> {
        let deadline = self.args.timeout().map(|t| Instant::now() + t);
        loop {
            let wc = match self.cq.poll_one() {
                Some(wc) => Some(wc),
                None => {
                    if self.disconnected {
                        // Everything that completed before the disconnect was handled.
                        return Ok(Step::Disconnected);
                    }
                    match self.qp.get_event(Some(Duration::ZERO)) {
                        Some(CmEvent::Disconnected) => {
                            self.on_disconnect();
                            continue;
                        }
                        Some(CmEvent::Established) => {
                            self.debug("ESTABLISHED");
                            continue;
                        }
                        Some(ev) => return Err(self.failure(None, Some(ev))),
                        None => {}
                    }
                    let now = Instant::now();
                    if let Some(d) = deadline
                        && now >= d
                    {
                        bail!(
                            "{} idle: no completion or event for {} s (--timeout); dropping peer {} (QP {})",
                            self.role,
                            self.args.timeout,
                            self.peer,
                            self.qpn
                        );
                    }
                    // A receive is always posted, and the engine queues an event before
                    // the completions it flushes, so the CQ wakes us for every event that
                    // matters; the cap only bounds how late the deadline is noticed. An
                    // idle session wakes twice a second.
                    let cap = Duration::from_millis(500);
                    let wait = deadline.map_or(cap, |d| d.saturating_duration_since(now).min(cap));
                    self.cq.wait(Some(wait))
                }
            };
            let Some(wc) = wc else { continue };
            if wc.status == WcStatus::WrFlushErr && self.disconnected {
                // The peer closed first and the QP went to Err: what was still
                // outstanding (a last go-ahead Send whose ACK the DREQ overtook)
                // is flushed, as rping's cq thread accepts.
                self.debug("send/recv flushed after the disconnect");
                continue;
            }
            if wc.status == WcStatus::WrFlushErr {
                // Flushed by whatever moved the QP to Err. Its CM event may come just
                // after the flush (the IB CM moves the QP to ERR, then queues
                // Disconnected; verbs do not order the CQ against CM events), so wait
                // for it briefly.
                match self.cause_event(Duration::from_secs(2)) {
                    Some(CmEvent::Disconnected) => {
                        self.on_disconnect();
                        continue;
                    }
                    ev => return Err(self.failure(Some(wc), ev)),
                }
            }
            if wc.status != WcStatus::Success {
                return Err(self.failure(Some(wc), None));
            }
            match wc.opcode {
                WcOpcode::Send => self.debug("send completion"),
                WcOpcode::RdmaWrite => {
                    self.debug("rdma write completion");
                    return Ok(Step::WriteComplete);
                }
                WcOpcode::RdmaRead => {
                    self.debug("rdma read completion");
                    return Ok(Step::ReadComplete);
                }
                WcOpcode::Recv => {
                    self.debug("recv completion");
                    if wc.byte_len as usize != INFO_LEN {
                        bail!("Received bogus data, size {}", wc.byte_len);
                    }
                    self.last_info = self.received_info()?;
                    self.debug(format!("received rping_rdma_info {:02x?}", self.last_info));
                    if !self.disconnected {
                        self.post_recv()?;
                    }
                    return Ok(Step::Recv);
                }
                other => bail!("unknown!!!!! completion {other:?}"),
            }
        }
    }
}

/// The test private data: `n` bytes 0x00, 0x01, ... (wrapping).
fn test_pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| i as u8).collect()
}

/// Runs `softrdma rping`.
pub fn run(args: RpingArgs) -> Result<()> {
    if args.size < MIN_SIZE || args.size > MAX_SIZE {
        bail!(
            "Invalid size {} (valid range is {} to {})",
            args.size,
            MIN_SIZE,
            MAX_SIZE
        );
    }
    let dev = crate::providers::open(&args.dev, &args.device_flags(), args.endpoint()?)?;
    if args.server {
        server(&dev, &args)
    } else {
        client(&dev, &args)
    }
}

/// `-t`: rping reads it with `strtol(optarg, NULL, 0)`: decimal, or hex with 0x.
fn parse_tos(s: &str) -> Result<u8, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => s.parse::<u8>(),
    };
    v.map_err(|_| format!("{s:?} is not a type of service: 0 to 255 (or 0x00 to 0xff)"))
}

/// The client's source address and type of service (`-I`, `-t`).
fn route(args: &RpingArgs, dst: SocketAddr) -> Result<RouteOptions> {
    let mut r = RouteOptions::default();
    if let Some(src) = &args.source {
        let ip = resolve(src, 0)?.ip();
        if ip.is_ipv4() != dst.is_ipv4() {
            bail!("-I {src}: the source address must be of the server's IP version ({dst})");
        }
        r = r.src_addr(ip);
    }
    if let Some(tos) = args.tos {
        r = r.tos(tos);
    }
    Ok(r)
}

fn resolve(addr: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = addr.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (addr, port)
        .to_socket_addrs()
        .with_context(|| format!("getaddrinfo failed - invalid hostname or IP address {addr:?}"))?
        .next()
        .context("no address")
}

/// rping_create_qp / rping_setup_qp: one CQ of 2 × SQ depth, SQ depth 16,
/// 2 receives, one SGE each.
fn qp_options(cq: &CompletionQueue, ird: u8, ord: u8) -> QpOptions {
    QpOptions::new(cq).rd_atomic(ird, ord).attr(QpInitAttr {
        max_send_wr: SQ_DEPTH,
        max_recv_wr: 2,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpInitAttr::default()
    })
}

/// The receive buffer for the peer's `rping_rdma_info`, and its first receive, posted
/// before `rdma_connect`/`rdma_accept` as rping does: the peer may Send the moment the
/// connection is up, and on iWARP a Send with no receive posted is a Terminate.
fn recv_buf(pd: &ProtectionDomain, opts: QpOptions) -> Result<(MemoryRegion, QpOptions)> {
    let mr = pd
        .reg_mr(INFO_LEN, Access::LOCAL_WRITE)
        .context("recv_buf reg_mr failed")?;
    let wr = info_recv(&mr);
    Ok((mr, opts.post_recv([wr])))
}

/// The receive of one `rping_rdma_info` into `mr`.
fn info_recv(mr: &MemoryRegion) -> RecvWr {
    RecvWr {
        wr_id: WR_RECV,
        sg_list: vec![mr.sge(0, INFO_LEN as u32)],
    }
}

fn endpoint<'a>(
    args: &'a RpingArgs,
    pd: &ProtectionDomain,
    qp: QueuePair,
    cq: CompletionQueue,
    recv_mr: MemoryRegion,
    role: &'static str,
) -> Result<Endpoint<'a>> {
    let remote = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let ep = Endpoint {
        args,
        cq,
        recv_mr,
        send_mr: pd.reg_mr(INFO_LEN, Access::empty()).context("send_buf reg_mr failed")?,
        rdma_mr: pd.reg_mr(args.size, remote).context("rdma_buf reg_mr failed")?,
        role,
        peer: qp.conn_info().peer_addr,
        qpn: qp.qp_num(),
        qp,
        disconnected: false,
        last_info: [0; INFO_LEN],
    };
    ep.debug(format!(
        "allocated & registered buffers: rdma_buf {:#x} rkey {:#x} len {}",
        ep.rdma_mr.addr(),
        ep.rdma_mr.rkey(),
        args.size
    ));
    Ok(ep)
}

/// Checks the step the main loop waited for. A disconnect where a ping ends
/// (the server waiting for the next advertisement) ends the session: false.
/// A disconnect in the middle of a ping is a failed session (an error naming
/// the peer), as is any other step.
fn expect_step(ep: &Endpoint<'_>, got: Step, want: Step, state_name: &str, at_boundary: bool) -> Result<bool> {
    if got == want {
        return Ok(true);
    }
    if got == Step::Disconnected {
        // rping: "wait for ... state 10".
        eprintln!("wait for {state_name} state 10 (DISCONNECTED)");
        if at_boundary {
            return Ok(false);
        }
        bail!(
            "{} session failed (QP {}, peer {}): peer closed the connection in the middle of a ping (waiting for {state_name})",
            ep.role,
            ep.qpn,
            ep.peer
        );
    }
    bail!("wait for {state_name}: got {got:?}")
}

fn client(dev: &Device, args: &RpingArgs) -> Result<()> {
    let addr = resolve(args.addr.as_deref().context("client needs -a ADDR")?, args.port)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(SQ_DEPTH as usize * 2)?;
    let start_mr = pd
        .reg_mr(
            args.size,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .context("start_buf reg_mr failed")?;
    let timeout = args.timeout().unwrap_or(Duration::from_secs(3600));
    // rping_init_conn_param: responder_resources 1, initiator_depth 1, no private data.
    let mut opts = qp_options(&cq, 1, 1);
    if let Some(n) = args.test_pd {
        opts = opts.private_data(&test_pattern(n));
    }
    let (recv_mr, opts) = recv_buf(&pd, opts)?;
    let opts = opts.route(route(args, addr)?);
    let qp = match pd.connect(addr, opts, timeout) {
        Ok(qp) => qp,
        Err(Error::Rejected { private_data, detail }) => {
            let io = detail.map_or("no provider detail".to_string(), |d| d.to_string());
            bail!(
                "cma event RDMA_CM_EVENT_REJECTED, {io}, private data {} bytes: {}",
                private_data.len(),
                hex::encode(&private_data)
            )
        }
        Err(e) => return Err(e).context(format!("connect error to {addr}")),
    };
    let mut ep = endpoint(args, &pd, qp, cq, recv_mr, "client")?;
    ep.debug(format!("rdma_connect successful: {}", ep.qp.conn_info().detail));
    if args.test_connect_only {
        let peer = ep.qp.conn_info().peer_private_data;
        println!("peer private data {} bytes: {}", peer.len(), hex::encode(&peer));
        std::thread::sleep(Duration::from_millis(args.first_send_delay_ms));
        ep.qp.disconnect();
        return Ok(());
    }
    if args.first_send_delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(args.first_send_delay_ms));
    }
    let size = args.size as u32;
    let mut ping = 0u64;
    while args.count == 0 || ping < args.count {
        let data = ping_data(ping, args.size);
        start_mr.write(0, &data).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        // Advertise the start buffer; the server RDMA-Reads it.
        let start_rkey = if args.test_bad_stag {
            start_mr.rkey() ^ 0xff
        } else {
            start_mr.rkey()
        };
        ep.send_mr
            .write(0, &encode_info(start_mr.addr(), start_rkey, size))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        ep.debug(format!(
            "RDMA addr {:x} rkey {:x} len {}",
            start_mr.addr(),
            start_rkey,
            size
        ));
        ep.post_send_info()?;
        // Wait for the server's go-ahead (its Read completed).
        let step = ep.next()?;
        if !expect_step(&ep, step, Step::Recv, "RDMA_WRITE_ADV", false)? {
            return Ok(());
        }
        // Advertise the sink buffer; the server RDMA-Writes the data back.
        ep.send_mr
            .write(0, &encode_info(ep.rdma_mr.addr(), ep.rdma_mr.rkey(), size))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        ep.debug(format!(
            "RDMA addr {:x} rkey {:x} len {}",
            ep.rdma_mr.addr(),
            ep.rdma_mr.rkey(),
            size
        ));
        ep.post_send_info()?;
        let step = ep.next()?;
        if !expect_step(&ep, step, Step::Recv, "RDMA_WRITE_COMPLETE", false)? {
            return Ok(());
        }
        let got = ep.rdma_mr.to_vec(0, args.size).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        if args.validate && got != data {
            let at = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
            eprintln!("data mismatch!");
            bail!(
                "ping {ping}: data mismatch at byte {at}: got {:?}, sent {:?}",
                String::from_utf8_lossy(&got[at..(at + 16).min(got.len())]),
                String::from_utf8_lossy(&data[at..(at + 16).min(data.len())])
            );
        }
        if args.verbose {
            println!("ping data: {}", cstr(&got));
        }
        ping += 1;
    }
    ep.debug("rping client done, disconnecting");
    ep.qp.disconnect();
    Ok(())
}

/// The bytes up to the first NUL, as `printf("%s")` shows them.
fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// `-P`: clients served at once at most.
const MAX_PERSISTENT_CLIENTS: usize = 16;

fn server(dev: &Device, args: &RpingArgs) -> Result<()> {
    let addr = resolve(args.addr.as_deref().unwrap_or("0.0.0.0"), args.port)?;
    let listener = dev.listen(addr).with_context(|| format!("rdma_bind_addr {addr}"))?;
    if args.debug {
        println!("rdma_bind_addr successful on {}", listener.local_addr());
    }
    if args.persistent {
        return persistent_server(dev, args, &listener);
    }
    let req = listener
        .get_request(args.timeout())
        .context("wait for CONNECT_REQUEST")?;
    serve_request(dev, args, req, Some(listener))
}

/// rping -P: every connect request gets a thread of its own (rping's
/// `persistent_server_thread`), up to [`MAX_PERSISTENT_CLIENTS`] at once; a failed session
/// is reported on stderr and the server goes on. Runs until killed, or until the listener
/// fails.
fn persistent_server(dev: &Device, args: &RpingArgs, listener: &Listener) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let active = AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<()> {
        loop {
            let req = match listener.get_request(None) {
                Ok(r) => r,
                Err(Error::Timeout) => continue,
                Err(e) => return Err(e).context("wait for CONNECT_REQUEST"),
            };
            let peer = req.peer_addr();
            if active.load(Ordering::Acquire) >= MAX_PERSISTENT_CLIENTS {
                eprintln!("server: refusing {peer}: {MAX_PERSISTENT_CLIENTS} clients already being served");
                let _ = req.reject(b"rping: busy");
                continue;
            }
            active.fetch_add(1, Ordering::AcqRel);
            let active = &active;
            s.spawn(move || {
                if let Err(e) = serve_request(dev, args, req, None) {
                    eprintln!("server: session with {peer} failed: {e:#}");
                }
                active.fetch_sub(1, Ordering::AcqRel);
            });
        }
    })
}

/// Accepts `req` and runs rping's server side on it. The listener, when given, is closed
/// once the connection is accepted, so that a second client is refused.
fn serve_request(dev: &Device, args: &RpingArgs, req: ConnectRequest, listener: Option<Listener>) -> Result<()> {
    let p = req.param();
    if args.debug {
        println!(
            "child cma: connect request from {}, IRD {} ORD {}, {} bytes of private data",
            req.peer_addr(),
            p.responder_resources,
            p.initiator_depth,
            req.private_data().len()
        );
    }
    if args.test_pd.is_some() || args.test_reject.is_some() || args.test_connect_only {
        let pd = req.private_data();
        println!("connect request private data {} bytes: {}", pd.len(), hex::encode(pd));
    }
    if let Some(n) = args.test_reject {
        req.reject(&test_pattern(n)).context("rdma_reject")?;
        println!("rejected the connect request with {n} bytes of private data");
        return Ok(());
    }
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(SQ_DEPTH as usize * 2)?;
    // rdma_accept(NULL): the IRD/ORD the client stated, seen from our side.
    let ird = p.initiator_depth.max(1);
    let ord = p.responder_resources.max(1);
    let mut opts = qp_options(&cq, ird, ord);
    if let Some(n) = args.test_pd {
        opts = opts.private_data(&test_pattern(n));
    }
    let (recv_mr, opts) = recv_buf(&pd, opts)?;
    let qp = req.accept(&pd, opts).context("rdma_accept")?;
    drop(listener);
    let mut ep = endpoint(args, &pd, qp, cq, recv_mr, "server")?;
    ep.debug(format!("accepted: {}", ep.qp.conn_info().detail));
    if args.test_connect_only {
        // The peer decides when the connection ends; a Send from it is not expected.
        println!("accepted with {} bytes of private data", args.test_pd.unwrap_or(0));
        let res = match ep.next()? {
            Step::Disconnected => Ok(()),
            other => Err(anyhow::anyhow!("connect-only: got {other:?} instead of the disconnect")),
        };
        ep.qp.disconnect();
        return res;
    }
    let res = server_loop(&mut ep);
    ep.qp.disconnect();
    res
}

/// rping_test_server.
fn server_loop(ep: &mut Endpoint<'_>) -> Result<()> {
    let size = ep.args.size;
    loop {
        // Wait for the client's start STag/TO/length.
        let step = ep.next()?;
        if !expect_step(ep, step, Step::Recv, "RDMA_READ_ADV", true)? {
            return Ok(());
        }
        let (addr, rkey, len) = decode_info(&ep.last_info);
        ep.debug(format!("Received rkey {rkey:x} addr {addr:x} len {len} from peer"));
        if len as usize > size {
            bail!("the client's buffer ({len} bytes) is larger than ours (-S {size})");
        }
        let rkey = if ep.args.test_bad_stag { rkey ^ 0xff } else { rkey };
        let remote = RemoteAddr { addr, rkey };
        ep.qp
            .post_send_one(SendWr::new(
                WR_RDMA,
                WrOpcode::RdmaRead { remote },
                vec![ep.rdma_mr.sge(0, len)],
            ))
            .context("post send error")?;
        ep.debug("server posted rdma read req");
        let step = ep.next()?;
        if !expect_step(ep, step, Step::ReadComplete, "RDMA_READ_COMPLETE", false)? {
            return Ok(());
        }
        let data = ep.rdma_mr.to_vec(0, size).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        if ep.args.verbose {
            println!("server ping data: {}", cstr(&data));
        }
        // Go ahead: rping's server sends its send_buf, which it never fills (16 zero bytes).
        ep.post_send_info()?;
        ep.debug("server posted go ahead");
        // Wait for the client's sink STag/TO/length.
        let step = ep.next()?;
        if !expect_step(ep, step, Step::Recv, "RDMA_WRITE_ADV", false)? {
            return Ok(());
        }
        let (addr, rkey, len) = decode_info(&ep.last_info);
        ep.debug(format!("Received rkey {rkey:x} addr {addr:x} len {len} from peer"));
        // RDMA Write of strlen(rdma_buf) + 1 bytes back.
        let wlen = (cstr(&data).len() + 1).min(size) as u32;
        let remote = RemoteAddr { addr, rkey };
        ep.qp
            .post_send_one(SendWr::new(
                WR_RDMA,
                WrOpcode::RdmaWrite { remote },
                vec![ep.rdma_mr.sge(0, wlen)],
            ))
            .context("post send error")?;
        ep.debug(format!("rdma write from lkey {:x} len {wlen}", ep.rdma_mr.lkey()));
        let step = ep.next()?;
        if !expect_step(ep, step, Step::WriteComplete, "RDMA_WRITE_COMPLETE", false)? {
            return Ok(());
        }
        ep.post_send_info()?;
        ep.debug("server posted go ahead");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_data_matches_rping_capture() {
        // The first ping of a 64-byte rping, byte for byte from vm-lo-siw-rping.pcap frame 10.
        let d = ping_data(0, 64);
        assert_eq!(
            &d[..],
            &b"rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\0"[..]
        );
        // Each ping starts one character later; 'z' wraps to 'A'.
        assert_eq!(&ping_data(1, 20)[..], b"rdma-ping-1: BCDEFG\0");
        assert_eq!(&ping_data(57, 20)[..], b"rdma-ping-57: zABCD\0");
        assert_eq!(&ping_data(58, 20)[..], b"rdma-ping-58: ABCDE\0");
        // A long count never overruns the buffer.
        assert_eq!(ping_data(1234567890, 26).len(), 26);
        assert_eq!(&ping_data(1234567890, 26)[..], b"rdma-ping-1234567890: QRS\0");
    }

    #[test]
    fn info_is_network_byte_order() {
        // The client's first advertisement in vm-lo-siw-rping.pcap (frame 8).
        let b = encode_info(0x0000_561c_aea0_1b90, 0x7e9f_1d00, 64);
        assert_eq!(
            b,
            [
                0, 0, 0x56, 0x1c, 0xae, 0xa0, 0x1b, 0x90, 0x7e, 0x9f, 0x1d, 0, 0, 0, 0, 0x40
            ]
        );
        assert_eq!(decode_info(&b), (0x0000_561c_aea0_1b90, 0x7e9f_1d00, 64));
    }
}
