//! `softrdma smc`: SMC-R (RFC 7609) tools (issue 15).
//!
//! - `stat [--json] [--dir DIR]`: like Linux's `smcss` / `smcr linkgroup`: every process that
//!   publishes SMC-R state (the `smc` crate's engine does so when it makes its first link
//!   group; `smc run`'s daemon too) is asked over its unix socket `DIR/<pid>.sock`
//!   (`DIR` = `$SOFTRDMA_SMC_RUN_DIR` or `/run/softrdma/smc`; see `smc::stats`) and its link
//!   groups, links (state, GIDs, QPNs), connections (SMC-R or fallback and why, octets each
//!   way) and resource counts (QPs, MRs, RMB elements) are printed.
//! - `run -- PROGRAM ARGS` (Linux's `smc_run`): an unmodified, dynamically linked program's
//!   TCP connections go over SMC-R when the peer supports it, else stay TCP.
//!
//! Pieces (docs/smc.md, "Unmodified programs: smc run"):
//! - `libsmc_preload.so` (crates/smc-preload), put in the program with LD_PRELOAD, hands each
//!   connected or accepted TCP socket to the daemon and, on SMC-R, puts the unix socket it
//!   gets back in its place.
//! - `softrdma smc daemon`, one per network namespace (abstract unix address, so namespaces
//!   do not share one), owns the RoCE devices (one per local IP address), QPs and RMBs, runs
//!   the CLC handshake with `SmcStream::connect_over` / `accept_over` and pumps octets
//!   between the unix socket and the SMC-R connection; on fallback the program keeps its own
//!   TCP socket. It attaches the `smc::sockops` program (the SMC-R TCP option on SYN and
//!   SYN-ACK) to a cgroup v2 directory of its own; `smc run` moves itself (and so the program
//!   it starts) into it. Bounded: `--max-conns`, a deadline on each request, and it exits
//!   after `--idle-exit` seconds with no connection and no `smc run` attached.
//! - `softrdma smc status [--json]`: the daemon's connections (SMC-R or fallback and why,
//!   octets each way).
//!
//! The wire between shim and daemon is in crates/smc-preload/src/handoff.rs (kept in step
//! with the constants here).

#[path = "smc_bench.rs"]
mod bench;

use crate::providers;
use crate::scm;
use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use smc::clc_machine::FallbackReason;
use smc::stream::Relayed;
use smc::{Mode, SmcConfig, SmcStream};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use verbs::{Device, DeviceOptions};

const MAGIC: &[u8; 5] = b"SMCR\x01";
const CONNECTED: u8 = 1;
const ACCEPTED: u8 = 2;
/// `smc run` attaches: the reply is the cgroup directory ("" + reason after a NUL if none);
/// the daemon stays up while the socket is open.
const SESSION: u8 = 3;
/// The reply is the daemon's status as JSON.
const STATUS: u8 = 4;
const VERDICT_SMCR: u8 = 0;
const VERDICT_TCP: u8 = 1;
const VERDICT_RELAY: u8 = 2;

/// The daemon's default socket name (abstract, so one per network namespace).
pub const DEFAULT_SOCK: &str = "softrdma-smc";

/// `softrdma smc ...`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Run PROGRAM with its TCP connections over SMC-R when the peer supports it (Linux's
    /// smc_run): LD_PRELOAD shim + the per-namespace daemon, started if none runs.
    Run(RunArgs),
    /// The per-namespace daemon that `smc run` starts: owns the RoCE devices, QPs and RMBs,
    /// runs CLC on the handed-over TCP sockets and carries their data.
    Daemon(DaemonArgs),
    /// The daemon's connections: SMC-R or fallback (and why), octets each way.
    Status(StatusArgs),
    /// Link groups, links, connections and resource counts of every SMC-R process.
    Stat(StatArgs),
    /// Request/response latency (64 B by default) of SmcStream next to plain TCP in the
    /// same run: in-process over two soft RoCEv2 devices, or --server/--connect across hosts.
    Bench(bench::BenchArgs),
}

/// `softrdma smc stat`.
#[derive(clap::Args, Debug)]
pub struct StatArgs {
    /// Print the snapshots as JSON (an array, one object per process; model `smc::stats`).
    #[arg(long)]
    json: bool,
    /// Directory of the stats sockets (default `$SOFTRDMA_SMC_RUN_DIR` or /run/softrdma/smc).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// `softrdma smc stat`.
pub fn stat(a: StatArgs) -> Result<()> {
    let dir = a.dir.unwrap_or_else(smc::stats::run_dir);
    let snaps = smc::stats::collect(&dir);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&snaps)?);
    } else {
        print!("{}", smc::stats::render_text(&snaps));
    }
    Ok(())
}

#[derive(clap::Args, Debug, Clone)]
struct Common {
    /// The daemon's abstract unix socket name (default: $SOFTRDMA_SMC_SOCK or softrdma-smc).
    #[arg(long)]
    sock: Option<String>,
}

impl Common {
    fn name(&self) -> String {
        self.sock
            .clone()
            .or_else(|| std::env::var("SOFTRDMA_SMC_SOCK").ok())
            .unwrap_or_else(|| DEFAULT_SOCK.into())
    }
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Without the TCP option (no privilege needed): clients always propose and servers look
    /// for a Proposal in the first octets (the in-process SmcStream convention). Only for
    /// peers known to run SMC-R; passed to a daemon this starts.
    #[arg(long)]
    assume_smc_peers: bool,
    /// A second local address whose RoCE device carries a second link of each SMC-R v1 link
    /// group (ADD LINK; failover when a link fails); passed to a daemon this starts.
    #[arg(long)]
    second_addr: Option<IpAddr>,
    /// The shim (default: libsmc_preload.so next to this binary, or $SOFTRDMA_SMC_PRELOAD).
    #[arg(long)]
    preload: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    program: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
struct DaemonArgs {
    #[command(flatten)]
    common: Common,
    /// See `smc run --assume-smc-peers`.
    #[arg(long)]
    assume_smc_peers: bool,
    /// See `smc run --second-addr`.
    #[arg(long)]
    second_addr: Option<IpAddr>,
    /// At most this many connections at once; more stay TCP ("daemon connection cap").
    #[arg(long, default_value_t = 1024)]
    max_conns: usize,
    /// Exit after this many seconds with no connection and no `smc run` attached (`smc run`
    /// passes $SOFTRDMA_SMC_IDLE_EXIT when it starts one).
    #[arg(long, default_value_t = 30)]
    idle_exit: u64,
    /// RMB element size (16K to 512K, a power of two: the CLC's sizes, A1.6).
    #[arg(long, default_value_t = 256 * 1024, value_parser = crate::units::rmbe_size)]
    rmbe: u32,
}

#[derive(clap::Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    common: Common,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

/// Dispatch.
pub fn run(a: Args) -> Result<()> {
    match a.cmd {
        Cmd::Run(r) => run_program(r),
        Cmd::Daemon(d) => daemon(d),
        Cmd::Status(s) => status(s),
        Cmd::Stat(s) => stat(s),
        Cmd::Bench(b) => bench::bench(b),
    }
}

// ---------------------------------------------------------------- smc run

fn find_preload(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("SOFTRDMA_SMC_PRELOAD").map(PathBuf::from)) {
        return Ok(p);
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for c in [dir.join("libsmc_preload.so"), dir.join("../libsmc_preload.so")] {
        if c.exists() {
            return Ok(c.canonicalize()?);
        }
    }
    bail!(
        "libsmc_preload.so not found next to {} (build it: cargo build -p smc-preload --release; or --preload PATH)",
        exe.display()
    )
}

/// Connects to the daemon, starting one if none answers.
fn session(name: &str, assume: bool, second: Option<IpAddr>) -> Result<OwnedFd> {
    if let Ok(s) = scm::connect(name) {
        return Ok(s);
    }
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["smc", "daemon", "--sock", name]);
    if assume {
        cmd.arg("--assume-smc-peers");
    }
    if let Some(ip) = second {
        cmd.args(["--second-addr", &ip.to_string()]);
    }
    if let Ok(v) = std::env::var("SOFTRDMA_SMC_IDLE_EXIT") {
        cmd.args(["--idle-exit", &v]);
    }
    let log = std::env::temp_dir().join(format!("softrdma-smc-daemon-{name}-{}.log", std::process::id()));
    let f = std::fs::File::create(&log).with_context(|| format!("daemon log {}", log.display()))?;
    cmd.stdin(std::process::Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .process_group(0);
    let mut child = cmd.spawn().context("starting softrdma smc daemon")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(s) = scm::connect(name) {
            // The daemon outlives us; its exit status is not ours to wait for.
            std::thread::spawn(move || child.wait());
            return Ok(s);
        }
        if let Ok(Some(st)) = child.try_wait() {
            // Another `smc run` may have won the race to start one.
            if let Ok(s) = scm::connect(name) {
                return Ok(s);
            }
            bail!("softrdma smc daemon exited ({st}); its log: {}", log.display());
        }
        if Instant::now() > deadline {
            bail!(
                "softrdma smc daemon did not answer within 10 s; its log: {}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

use std::os::unix::process::CommandExt;

fn run_program(a: RunArgs) -> Result<()> {
    let name = a.common.name();
    let preload = find_preload(a.preload)?;
    let s = session(&name, a.assume_smc_peers, a.second_addr)?;
    scm::send(&s, &[b'S', b'M', b'C', b'R', 1, SESSION], None)?;
    let mut buf = vec![0u8; 4096];
    let (n, _) = scm::recv(&s, &mut buf)?;
    let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
    let (cg, why) = reply.split_once('\0').unwrap_or((&reply, ""));
    if !cg.is_empty() {
        // Into the daemon's cgroup: the program we start is born there, so its SYNs and
        // SYN-ACKs carry the SMC-R option (smc::sockops). We make no TCP socket ourselves.
        std::fs::write(Path::new(cg).join("cgroup.procs"), std::process::id().to_string())
            .with_context(|| format!("joining cgroup {cg}"))?;
    } else if !a.assume_smc_peers {
        eprintln!(
            "softrdma smc run: the SMC-R TCP option is unavailable ({why}); peers see no SMC-R option, so connections stay TCP"
        );
    }
    let mut ld = preload.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        ld.push(" ");
        ld.push(old);
    }
    let (prog, rest) = a.program.split_first().ok_or_else(|| anyhow!("no program given"))?;
    // Like smc_run, the program takes our place (its signals, its exit status); the session
    // descriptor stays open in it (not close-on-exec), so the daemon stays while it runs.
    scm::inherit(&s)?;
    let err = std::process::Command::new(prog)
        .args(rest)
        .env("LD_PRELOAD", ld)
        .env("SOFTRDMA_SMC_SOCK", &name)
        .exec();
    Err(err).with_context(|| format!("running {}", prog.to_string_lossy()))
}

// ---------------------------------------------------------------- smc status

fn status(a: StatusArgs) -> Result<()> {
    let name = a.common.name();
    let s = scm::connect(&name).with_context(|| format!("no softrdma smc daemon answers on @{name}"))?;
    scm::send(&s, &[b'S', b'M', b'C', b'R', 1, STATUS], None)?;
    let mut buf = vec![0u8; 1 << 20];
    let (n, _) = scm::recv(&s, &mut buf)?;
    let v: serde_json::Value = serde_json::from_slice(&buf[..n]).context("daemon status")?;
    if a.json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "daemon pid {}  TCP option: {}  connections: {} live, {} SMC-R, {} fallback  links: {}",
        v["pid"],
        v["tcp_option"].as_str().unwrap_or(""),
        v["live"],
        v["smcr_total"],
        v["fallback_total"],
        v["live_links"]
    );
    println!(
        "{:<4} {:<7} {:<22} {:<22} {:<9} {:>12} {:>12}  reason",
        "id", "role", "local", "peer", "mode", "sent", "received"
    );
    for c in v["conns"].as_array().into_iter().flatten() {
        let t = |k: &str| c[k].as_str().unwrap_or("").to_string();
        let n = |k: &str| c[k].as_u64().unwrap_or(0);
        println!(
            "{:<4} {:<7} {:<22} {:<22} {:<9} {:>12} {:>12}  {}{}",
            n("id"),
            t("role"),
            t("local"),
            t("peer"),
            t("mode"),
            n("bytes_sent"),
            n("bytes_received"),
            t("reason"),
            if c["open"].as_bool() == Some(true) {
                ""
            } else {
                " (closed)"
            },
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- the daemon

#[derive(Debug, Serialize)]
struct ConnRec {
    id: u64,
    role: &'static str,
    local: String,
    peer: String,
    /// "SMC-R", "TCP" or "TCP-relay".
    mode: &'static str,
    reason: String,
    #[serde(skip)]
    sent: AtomicU64,
    #[serde(skip)]
    received: AtomicU64,
    #[serde(skip)]
    open: AtomicBool,
}

#[derive(Serialize)]
struct ConnView<'a> {
    #[serde(flatten)]
    rec: &'a ConnRec,
    bytes_sent: u64,
    bytes_received: u64,
    open: bool,
}

/// Closed connections kept for `smc status`.
const KEEP_CLOSED: usize = 256;
/// A request must arrive within this time of connecting.
const REQUEST_WAIT: Duration = Duration::from_secs(5);

struct Daemon {
    assume: bool,
    max_conns: usize,
    cfg: SmcConfig,
    /// `--second-addr`: the device of a second link.
    second: Option<IpAddr>,
    guard: Option<smc::sockops::Guard>,
    option_error: Option<String>,
    devices: Mutex<HashMap<IpAddr, Device>>,
    conns: Mutex<Vec<Arc<ConnRec>>>,
    next_id: AtomicU64,
    /// Connections being set up or carried.
    live: AtomicUsize,
    sessions: AtomicUsize,
    smcr_total: AtomicU64,
    fallback_total: AtomicU64,
    last_busy: Mutex<Instant>,
}

fn cgroup2_dir() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let mnt = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, ty) = (f.next()?, f.next()?, f.next()?);
            (ty == "cgroup2").then(|| PathBuf::from(dir))
        })
        .next()
        .ok_or_else(|| anyhow!("no cgroup2 mount"))?;
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/")
        .trim_start_matches('/')
        .to_string();
    let parent = mnt.join(rel);
    // Directories of daemons that died without removing theirs (empty ones only).
    if let Ok(rd) = std::fs::read_dir(&parent) {
        for e in rd.flatten() {
            let n = e.file_name();
            let Some(pid) = n.to_str().and_then(|n| n.strip_prefix("softrdma-smc.")) else {
                continue;
            };
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
    let dir = parent.join(format!("softrdma-smc.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn daemon(a: DaemonArgs) -> Result<()> {
    let name = a.common.name();
    let l = match scm::listen(&name) {
        Ok(l) => l,
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
            eprintln!("softrdma smc daemon: one already runs on @{name}");
            return Ok(());
        }
        Err(e) => return Err(e).context(format!("listening on @{name}")),
    };
    let (guard, option_error) = if a.assume_smc_peers {
        (None, Some("--assume-smc-peers: no TCP option".to_string()))
    } else {
        match cgroup2_dir() {
            Ok(dir) => match smc::sockops::SmcOption::attach(&dir, &[]) {
                Ok(g) => (Some(g), None),
                Err(e) => {
                    let _ = std::fs::remove_dir(&dir);
                    (None, Some(e.to_string()))
                }
            },
            Err(e) => (None, Some(format!("{e:#}"))),
        }
    };
    if let Some(e) = &option_error {
        tracing::warn!(error = %e, "SMC-R TCP option unavailable: connections fall back to TCP");
    }
    let cfg = SmcConfig {
        rmbe_len: a.rmbe,
        send_buf: a.rmbe,
        ..SmcConfig::default()
    };
    let d = Arc::new(Daemon {
        assume: a.assume_smc_peers,
        max_conns: a.max_conns,
        cfg,
        second: a.second_addr,
        guard,
        option_error,
        devices: Mutex::new(HashMap::new()),
        conns: Mutex::new(Vec::new()),
        next_id: AtomicU64::new(1),
        live: AtomicUsize::new(0),
        sessions: AtomicUsize::new(0),
        smcr_total: AtomicU64::new(0),
        fallback_total: AtomicU64::new(0),
        last_busy: Mutex::new(Instant::now()),
    });
    // `smc stat` sees the daemon: the engine's link groups and SMC-R connections, and (our
    // source) the connections that stayed TCP.
    let _registration = smc::stats::register(&d);
    smc::stats::publish();
    tracing::info!(sock = %name, option = d.guard.is_some(), "softrdma smc daemon up");
    socket2::SockRef::from(&l).set_read_timeout(Some(Duration::from_millis(500)))?;
    loop {
        match scm::accept(&l) {
            Ok(c) => {
                let d2 = Arc::clone(&d);
                std::thread::Builder::new()
                    .name("smc-request".into())
                    .spawn(move || d2.request(c))?;
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(e).context("accept"),
        }
        // Hand-overs and sessions count (`smc status` polling must not keep the daemon up).
        let busy = d.live.load(Ordering::Acquire) + d.sessions.load(Ordering::Acquire) > 0;
        let mut lb = d.last_busy.lock().unwrap_or_else(|p| p.into_inner());
        if busy {
            *lb = Instant::now();
        } else if lb.elapsed() >= Duration::from_secs(a.idle_exit) {
            break;
        }
    }
    tracing::info!("softrdma smc daemon idle, exiting");
    if let Some(g) = &d.guard {
        let dir = g.cgroup().to_path_buf();
        drop(l);
        // Detach happens when the guard drops with `d`; the directory goes after it.
        drop(d);
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

/// A stream the pump can copy between: SMC-R or TCP on one side, the unix socket on the other.
trait Duplex: Read + Write + Send + Sized + 'static {
    fn dup(&self) -> io::Result<Self>;
    fn shut(&self, how: Shutdown) -> io::Result<()>;
    /// A read that returns the urgent octet at its place in the stream.
    fn read_relay(&mut self, buf: &mut [u8]) -> io::Result<Relayed> {
        self.read(buf).map(Relayed::Data)
    }
    /// Writes `buf`, its last octet urgent (MSG_OOB).
    fn write_urgent(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write_all(buf)
    }
}

impl Duplex for SmcStream {
    fn dup(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shut(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
    fn read_relay(&mut self, buf: &mut [u8]) -> io::Result<Relayed> {
        SmcStream::read_relay(self, buf)
    }
    fn write_urgent(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            done += self.send_urgent(&buf[done..])?;
        }
        Ok(())
    }
}

impl Duplex for TcpStream {
    fn dup(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shut(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}

impl smc::stats::Source for Daemon {
    /// The fallback connections the program kept (the engine reports SMC-R ones itself).
    fn fill(&self, snap: &mut smc::stats::Snapshot) {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        for r in conns.iter().filter(|r| r.mode != "SMC-R") {
            let open = r.open.load(Ordering::Relaxed);
            if r.mode == "TCP" || open {
                snap.connections.push(smc::stats::ConnStat {
                    local: r.local.clone(),
                    peer: r.peer.clone(),
                    mode: smc::stats::ConnMode::Fallback,
                    fallback_reason: Some(r.reason.clone()),
                    state: if r.mode == "TCP" {
                        "tcp (the program's own socket)".into()
                    } else {
                        "tcp relayed".into()
                    },
                    bytes_sent: r.sent.load(Ordering::Relaxed),
                    bytes_received: r.received.load(Ordering::Relaxed),
                    ..Default::default()
                });
            }
        }
    }
}

impl Daemon {
    fn request(self: Arc<Self>, c: OwnedFd) {
        let _ = socket2::SockRef::from(&c).set_read_timeout(Some(REQUEST_WAIT));
        let mut buf = [0u8; 64];
        let (n, fd) = match scm::recv(&c, &mut buf) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "request not read");
                return;
            }
        };
        if n != 6 || &buf[..5] != MAGIC {
            tracing::warn!(len = n, "not a softrdma smc request, ignored");
            return;
        }
        match (buf[5], fd) {
            (k @ (CONNECTED | ACCEPTED), Some(fd)) => self.handoff(&c, k, fd),
            (SESSION, _) => {
                self.sessions.fetch_add(1, Ordering::AcqRel);
                let reply = match (&self.guard, &self.option_error) {
                    (Some(g), _) => g.cgroup().display().to_string(),
                    (None, e) => format!("\0{}", e.as_deref().unwrap_or("")),
                };
                let _ = scm::send(&c, reply.as_bytes(), None);
                // Held until `smc run` exits.
                let _ = socket2::SockRef::from(&c).set_read_timeout(None);
                let _ = scm::recv(&c, &mut buf);
                self.sessions.fetch_sub(1, Ordering::AcqRel);
            }
            (STATUS, _) => {
                let _ = scm::send(&c, self.status_json().to_string().as_bytes(), None);
            }
            (k, _) => tracing::warn!(kind = k, "unknown request, ignored"),
        }
    }

    fn status_json(&self) -> serde_json::Value {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let views: Vec<_> = conns
            .iter()
            .map(|r| ConnView {
                rec: r,
                bytes_sent: r.sent.load(Ordering::Relaxed),
                bytes_received: r.received.load(Ordering::Relaxed),
                open: r.open.load(Ordering::Relaxed),
            })
            .collect();
        serde_json::json!({
            "pid": std::process::id(),
            "tcp_option": if self.guard.is_some() { "on".to_string() } else { format!("off: {}", self.option_error.as_deref().unwrap_or("")) },
            "assume_smc_peers": self.assume,
            "live": self.live.load(Ordering::Relaxed),
            "sessions": self.sessions.load(Ordering::Relaxed),
            "smcr_total": self.smcr_total.load(Ordering::Relaxed),
            "fallback_total": self.fallback_total.load(Ordering::Relaxed),
            "live_links": smc::live_links(),
            "conns": views,
        })
    }

    fn record(&self, role: &'static str, tcp: &TcpStream, mode: &'static str, reason: String) -> Arc<ConnRec> {
        let addr = |a: io::Result<SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
        let r = Arc::new(ConnRec {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            role,
            local: addr(tcp.local_addr()),
            peer: addr(tcp.peer_addr()),
            mode,
            reason,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            open: AtomicBool::new(mode != "TCP"),
        });
        if mode == "SMC-R" {
            self.smcr_total.fetch_add(1, Ordering::Relaxed);
        } else {
            self.fallback_total.fetch_add(1, Ordering::Relaxed);
        }
        let mut v = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        v.push(Arc::clone(&r));
        let closed = v.iter().filter(|c| !c.open.load(Ordering::Relaxed)).count();
        if closed > KEEP_CLOSED {
            let mut drop_n = closed - KEEP_CLOSED;
            v.retain(|c| {
                if drop_n > 0 && !c.open.load(Ordering::Relaxed) {
                    drop_n -= 1;
                    false
                } else {
                    true
                }
            });
        }
        tracing::info!(id = r.id, role, local = %r.local, peer = %r.peer, mode, reason = %r.reason, "connection");
        r
    }

    fn device(&self, ip: IpAddr) -> Result<Device> {
        let mut m = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = m.get(&ip) {
            return Ok(d.clone());
        }
        let d = providers::registry()
            .open("roce", &DeviceOptions::new().with("addr", ip))
            .with_context(|| format!("RoCEv2 device on {ip}"))?;
        m.insert(ip, d.clone());
        Ok(d)
    }

    fn handoff(self: &Arc<Self>, c: &OwnedFd, kind: u8, fd: OwnedFd) {
        let role = if kind == CONNECTED { "client" } else { "server" };
        let tcp = TcpStream::from(fd);
        let reply = |verdict: u8, reason: &str, fd: Option<&UnixStream>| {
            let mut m = vec![verdict];
            m.extend_from_slice(reason.as_bytes());
            m.truncate(500);
            if let Err(e) = scm::send(c, &m, fd.map(|u| u.as_raw_fd())) {
                tracing::warn!(error = %e, "verdict not delivered");
            }
        };
        if self.live.fetch_add(1, Ordering::AcqRel) >= self.max_conns {
            self.live.fetch_sub(1, Ordering::AcqRel);
            let why = "daemon connection cap reached".to_string();
            self.record(role, &tcp, "TCP", why.clone());
            return reply(VERDICT_TCP, &why, None);
        }
        let done = || {
            self.live.fetch_sub(1, Ordering::AcqRel);
        };
        // The option the peer's SYN (we accepted) or SYN-ACK (we connected) carried.
        let indicated: Option<bool> = match &self.guard {
            Some(g) => Some(g.peer_offered_smc(&tcp).unwrap_or(false)),
            None if self.assume => None,
            None => Some(false),
        };
        let local_ip = tcp.local_addr().map(|a| a.ip());
        let dev = match local_ip {
            // SMC-R v1 runs over IPv6 TCP as well: a RoCEv2 device on the IPv6 address (its GID).
            Ok(ip) if indicated != Some(false) => self.device(ip).map_err(|e| format!("{e:#}")),
            _ => Err(String::new()),
        };
        let (dev, dev_error) = match dev {
            Ok(d) => (Some(d), None),
            // Our SYN-ACK carried the option, so the client proposes: CLC Declines (F2).
            Err(why) if kind == ACCEPTED && indicated != Some(false) => (None, Some(why)),
            Err(why) => {
                let why = if why.is_empty() {
                    FallbackReason::PeerNoSmc.to_string()
                } else {
                    why
                };
                self.record(role, &tcp, "TCP", why.clone());
                done();
                return reply(VERDICT_TCP, &why, None);
            }
        };
        // The program's socket state (shared with our descriptor) is put back on fallback.
        let nonblocking = is_nonblocking(&tcp);
        let rcv_timeout = tcp.read_timeout().ok().flatten();
        let _ = tcp.set_nonblocking(false);
        let mut cfg = self.cfg.clone();
        if let (Some(ip2), Ok(ip)) = (self.second, local_ip)
            && ip2 != ip
        {
            match self.device(ip2) {
                Ok(d) => cfg.alt_device = Some(d),
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "no second device, one link"),
            }
        }
        let res = if kind == CONNECTED {
            cfg.propose = indicated.unwrap_or(true);
            let dev = dev.as_ref().expect("a client without a device returned above");
            SmcStream::connect_over(tcp.try_clone().expect("dup"), dev, &cfg)
        } else {
            SmcStream::accept_over(tcp.try_clone().expect("dup"), dev.as_ref(), &cfg, indicated)
        };
        let restore = |t: &TcpStream| {
            let _ = t.set_nonblocking(nonblocking);
            let _ = t.set_read_timeout(rcv_timeout);
        };
        let s = match res {
            Ok(s) => s,
            Err(e) => {
                // CLC reset the connection (C.5, C.6): the program sees it on its socket.
                restore(&tcp);
                let why = format!("CLC failed: {e}");
                self.record(role, &tcp, "TCP", why.clone());
                done();
                return reply(VERDICT_TCP, &why, None);
            }
        };
        match s.mode() {
            Mode::SmcR => {
                let (app, ours) = match UnixStream::pair() {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(error = %e, "socketpair failed; the SMC-R connection is dropped");
                        done();
                        return reply(VERDICT_TCP, "socketpair failed", None);
                    }
                };
                let rec = self.record(role, &tcp, "SMC-R", String::new());
                reply(VERDICT_SMCR, "SMC-R", Some(&app));
                drop(app);
                drop(tcp); // the SmcStream keeps its own descriptor of the TCP connection
                self.spawn_pump(s, ours, rec);
            }
            Mode::Fallback(r) => {
                let (tcp2, prefix) = match s.into_tcp() {
                    Ok(x) => x,
                    Err(_) => unreachable!("fallback stream is TCP"),
                };
                restore(&tcp);
                let r = match &dev_error {
                    Some(e) => format!("{r} ({e})"),
                    None => r.to_string(),
                };
                if prefix.is_empty() {
                    self.record(role, &tcp, "TCP", r.clone());
                    done();
                    return reply(VERDICT_TCP, &r, None);
                }
                // Octets already read during CLC: relay them, then the rest of the stream.
                let (app, mut ours) = match UnixStream::pair() {
                    Ok(p) => p,
                    Err(_) => {
                        done();
                        return reply(VERDICT_TCP, "socketpair failed", None);
                    }
                };
                let _ = tcp2.set_nonblocking(false);
                // The relay reads the TCP socket plainly: urgent octets stay in line rather
                // than being skipped.
                let _ = socket2::SockRef::from(&tcp2).set_out_of_band_inline(true);
                let rec = self.record(role, &tcp, "TCP-relay", r.to_string());
                reply(VERDICT_RELAY, &r.to_string(), Some(&app));
                drop(app);
                if ours.write_all(&prefix).is_ok() {
                    rec.received.fetch_add(prefix.len() as u64, Ordering::Relaxed);
                }
                drop(tcp);
                self.spawn_pump(tcp2, ours, rec);
            }
        }
    }

    fn spawn_pump<S: Duplex>(self: &Arc<Self>, net: S, app: UnixStream, rec: Arc<ConnRec>) {
        let d = Arc::clone(self);
        let r = std::thread::Builder::new().name("smc-pump".into()).spawn(move || {
            pump(net, app, &rec);
            rec.open.store(false, Ordering::Relaxed);
            d.live.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "no pump thread");
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The urgent octet goes to the program's unix socket as MSG_OOB (AF_UNIX carries it as TCP
/// does on Linux ≥ 5.15); a kernel without AF_UNIX urgent data (EOPNOTSUPP) gets it in line.
fn send_urgent_unix(u: &UnixStream, b: u8) -> io::Result<()> {
    loop {
        // SAFETY: a descriptor we hold; one octet from the stack.
        let r = unsafe {
            libc::send(
                u.as_raw_fd(),
                (&b as *const u8).cast(),
                1,
                libc::MSG_OOB | libc::MSG_NOSIGNAL,
            )
        };
        if r == 1 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EOPNOTSUPP) => return (&*u).write_all(&[b]),
            _ => return Err(e),
        }
    }
}

/// Waits until the program's unix socket has something to read (or EOF), then says whether
/// the next octet is its urgent octet (SIOCATMARK; our end has SO_OOBINLINE, so reads stop
/// before it and then return it in line).
fn unix_at_mark(u: &UnixStream) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: u.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one pollfd on the stack.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCATMARK (0x8905, linux/sockios.h) writes one c_int.
    let r = unsafe { libc::ioctl(u.as_raw_fd(), 0x8905, &mut v as *mut libc::c_int) };
    Ok(r == 0 && v != 0)
}

fn is_nonblocking(t: &TcpStream) -> bool {
    // SAFETY: fcntl(F_GETFL) on a descriptor we hold reads its flags only.
    let fl = unsafe { libc::fcntl(t.as_raw_fd(), libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// `write_all` that counts each write as it succeeds: when the reader goes away in the
/// middle of a buffer, what it was given before is still counted (the status then shows
/// at least what the program reports: `iperf3 -s` closes in the middle of a relayed
/// 256 KiB write, and counting whole buffers missed the part it had read).
fn write_all_counted<W: Write>(w: &mut W, mut buf: &[u8], count: &AtomicU64) -> io::Result<()> {
    while !buf.is_empty() {
        match w.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                count.fetch_add(n as u64, Ordering::Relaxed);
                buf = &buf[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copies both ways until both directions ended: the program's EOF becomes a half-close
/// towards the peer (SMC-R: D), the peer's EOF a half-close of the unix socket. Urgent data
/// keeps its place: the program's `send(MSG_OOB)` octet (read in line at the mark of our
/// end) goes out with `send_urgent`; the peer's urgent octet goes to the program as MSG_OOB.
fn pump<S: Duplex>(net: S, app: UnixStream, rec: &ConnRec) {
    let _ = socket2::SockRef::from(&app).set_out_of_band_inline(true);
    let (mut net_r, app_w) = match (net.dup(), app.try_clone()) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return,
    };
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut app_w = app_w;
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                match net_r.read_relay(&mut buf) {
                    Ok(Relayed::Data(0)) => {
                        let _ = app_w.shutdown(Shutdown::Write);
                        break;
                    }
                    Ok(Relayed::Urgent(b)) => {
                        if let Err(e) = send_urgent_unix(&app_w, b) {
                            tracing::debug!(id = rec.id, error = %e, "the program stopped reading");
                            let _ = net_r.shut(Shutdown::Read);
                            break;
                        }
                        rec.received.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Relayed::Data(n)) => {
                        if let Err(e) = write_all_counted(&mut app_w, &buf[..n], &rec.received) {
                            tracing::debug!(id = rec.id, error = %e, "the program stopped reading");
                            let _ = net_r.shut(Shutdown::Read);
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::debug!(id = rec.id, error = %e, "peer side ended");
                        let _ = app_w.shutdown(Shutdown::Both);
                        break;
                    }
                }
            }
        });
        let mut app = app;
        let mut net = net;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let urgent = match unix_at_mark(&app) {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(id = rec.id, error = %e, "polling the program's socket failed");
                    let _ = net.shut(Shutdown::Write);
                    break;
                }
            };
            let want = if urgent { 1 } else { buf.len() };
            match app.read(&mut buf[..want]) {
                Ok(0) => {
                    let _ = net.shut(Shutdown::Write);
                    break;
                }
                Ok(n) => {
                    let r = if urgent {
                        net.write_urgent(&buf[..n]).map(|()| {
                            rec.sent.fetch_add(n as u64, Ordering::Relaxed);
                        })
                    } else {
                        write_all_counted(&mut net, &buf[..n], &rec.sent)
                    };
                    if let Err(e) = r {
                        tracing::debug!(id = rec.id, error = %e, "the peer side cannot take more");
                        let _ = app.shutdown(Shutdown::Both);
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(id = rec.id, error = %e, "reading the program's octets failed");
                    let _ = net.shut(Shutdown::Write);
                    break;
                }
            }
        }
    });
}
