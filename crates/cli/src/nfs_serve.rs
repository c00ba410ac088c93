//! `softrdma nfs serve DIR`: export a host directory over NFSv3, on RPC-over-RDMA (on the
//! `--provider` device, port 20049) and ONC RPC over TCP (port 2049), with MOUNT v3 on the TCP port (or on
//! `--mount-port`). The server itself is `rpcrdma::nfs3::server`.
//!
//! Ports: when a portmapper (rpcbind) listens on 127.0.0.1:111 the server registers NFS v3
//! and MOUNT v3 over TCP there (and unregisters them on SIGINT/SIGTERM); otherwise clients
//! are told the ports (`mount -o port=2049,mountport=N`), or `--portmap ADDR` serves a small
//! GETPORT of our own (for a host without rpcbind).
//!
//! File handles stay valid across restarts: they are keyed with the secret in `--key-file`
//! (created on first use, mode 0600). The write verifier is new for every start, so a
//! client's UNSTABLE writes that a restart may have lost are sent again.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use rpcrdma::nfs3::server::{self as nfsd, Export, ExportConfig};
use rpcrdma::pool::{IoPool, PoolConfig};
use rpcrdma::tcp::{TcpClient, TcpServer, TcpServerConfig};
use rpcrdma::transport::{RdmaConfig, RdmaServer};
use rpcrdma::{mount, nfs3, portmap};

use crate::units::parse_size;

#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    /// The directory to export.
    dir: PathBuf,
    /// RPC-over-RDMA listen address (on the --provider device), or `off`.
    #[arg(long, default_value = "0.0.0.0:20049")]
    rdma: String,
    /// ONC RPC over TCP listen address (NFS, and MOUNT unless --mount-port), or `off`.
    #[arg(long, default_value = "0.0.0.0:2049")]
    tcp: String,
    /// Serve our own portmapper GETPORT at this address (when no rpcbind runs), e.g. 0.0.0.0:111.
    #[arg(long)]
    portmap: Option<SocketAddr>,
    /// The path clients mount.
    #[arg(long, default_value = "/")]
    export_name: String,
    /// Refuse every change (NFS3ERR_ROFS).
    #[arg(long)]
    ro: bool,
    /// The file-handle secret (32 random bytes, created if missing).
    /// Default: $XDG_STATE_HOME/softrdma/nfs-handle.key (~/.local/state/...).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// rtmax and wtmax (READ/WRITE sizes the server offers).
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    max_io: u64,
    /// RDMA: credits granted (receives posted per connection).
    #[arg(long, default_value_t = 32)]
    rdma_credits: u32,
    /// RDMA: inline threshold (RFC 8797 send/receive size) offered.
    #[arg(long, value_parser = parse_size, default_value = "4K")]
    rdma_inline: u64,
    /// RDMA: worker threads (they move messages; the procedures run on the I/O pool).
    #[arg(long, default_value_t = 4)]
    rdma_workers: usize,
    /// Threads of the I/O pool that runs the procedures for both transports (a client
    /// runs at most half of them at once; see rpcrdma::pool).
    #[arg(long, default_value_t = 8)]
    io_workers: usize,
    /// Exit after this many seconds (for tests; default: run until killed).
    #[arg(long, hide = true)]
    exit_after: Option<u64>,
}

fn default_key_file() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("/var/lib"));
    base.join("softrdma/nfs-handle.key")
}

/// The handle secret in `path`, made (0600) if it does not exist.
fn load_key(path: &std::path::Path) -> Result<[u8; 32]> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read(path) {
        Ok(b) if b.len() == 32 => {
            let mut k = [0u8; 32];
            k.copy_from_slice(&b);
            return Ok(k);
        }
        Ok(b) => anyhow::bail!("{}: {} bytes, want 32", path.display(), b.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let mut k = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut k))
        .context("reading /dev/urandom")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut f, &k)?;
    eprintln!("nfs serve: new file-handle key in {}", path.display());
    Ok(k)
}

fn addr(s: &str, what: &str) -> Result<Option<SocketAddr>> {
    if s == "off" {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|e| anyhow!("--{what} {s}: {e}"))
}

/// Register with the local rpcbind, if one answers; the registrations to drop at exit.
fn rpcbind_register(table: &[(u32, u32, u32, u16)]) -> Vec<(u32, u32)> {
    let pm: SocketAddr = ([127, 0, 0, 1], portmap::PORT).into();
    if std::net::TcpStream::connect_timeout(&pm, Duration::from_millis(300)).is_err() {
        return Vec::new();
    }
    let Ok(mut c) = TcpClient::connect(pm) else {
        return Vec::new();
    };
    c.set_timeout(Duration::from_secs(3));
    let mut done = Vec::new();
    for &(prog, vers, prot, port) in table {
        // replace a stale registration of an earlier run (or of the kernel's nfsd)
        let _ = portmap::unset(&c, prog, vers);
        match portmap::set(&c, prog, vers, prot, port) {
            Ok(true) => {
                eprintln!("nfs serve: rpcbind: program {prog} version {vers} tcp port {port}");
                done.push((prog, vers));
            }
            Ok(false) => eprintln!("nfs serve: rpcbind refused program {prog} version {vers} port {port}"),
            Err(e) => eprintln!("nfs serve: rpcbind SET: {e}"),
        }
    }
    done
}

fn rpcbind_unregister(regs: &[(u32, u32)]) {
    if regs.is_empty() {
        return;
    }
    if let Ok(c) = TcpClient::connect(([127, 0, 0, 1], portmap::PORT).into()) {
        for &(prog, vers) in regs {
            let _ = portmap::unset(&c, prog, vers);
        }
    }
}

/// SIGINT and SIGTERM, blocked in every thread (call before spawning any) so that
/// [`wait_for_termination`] receives them and the server unregisters from rpcbind.
fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset write only into the local set; pthread_sigmask changes
    // this thread's mask (threads spawned later inherit it) and reads the set we built.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Wait for SIGINT/SIGTERM (or `limit`); what ended the wait.
fn wait_for_termination(set: &libc::sigset_t, limit: Option<Duration>) -> String {
    let start = std::time::Instant::now();
    loop {
        let ts = libc::timespec { tv_sec: 1, tv_nsec: 0 };
        // SAFETY: `set` and `ts` are valid for the call; a null siginfo pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
        if sig == libc::SIGINT || sig == libc::SIGTERM {
            return format!("signal {sig}");
        }
        if limit.is_some_and(|l| start.elapsed() >= l) {
            return "--exit-after".into();
        }
    }
}

/// `mount_port` (`--mount-port`: MOUNT v3 also on this TCP port, same address as --tcp),
/// `dev` (`--provider`, `--device`, `--dev-opt`) and `flags` (`--crc`: MPA CRC on RDMA
/// connections) are the `nfs` command's global options.
pub fn serve(
    a: ServeArgs,
    mount_port: Option<u16>,
    dev: &crate::providers::DeviceArgs,
    flags: &[crate::providers::Flag],
) -> Result<()> {
    let signals = termination_signals();
    let key_file = a.key_file.clone().unwrap_or_else(default_key_file);
    let key = load_key(&key_file)?;
    let max_io = u32::try_from(a.max_io.clamp(4096, 16 << 20)).unwrap_or(1 << 20);
    let export = Export::new(ExportConfig {
        root: a.dir.clone(),
        name: a.export_name.clone(),
        read_only: a.ro,
        key,
        max_io,
        write_verf: nfsd::fresh_write_verifier(),
    })?;
    let tcp_addr = addr(&a.tcp, "tcp")?;
    let rdma_addr = addr(&a.rdma, "rdma")?;
    let reg = Arc::new(nfsd::registry(&export, None));
    // one pool for every listener: a stalled disk holds at most its threads, never the
    // transports' (issue 17)
    let pool =
        IoPool::new("nfs-io", PoolConfig::with_threads(a.io_workers.clamp(1, 256))).context("starting the I/O pool")?;
    let tcp_cfg = TcpServerConfig {
        pool: Some(pool.clone()),
        ..TcpServerConfig::default()
    };
    let mut tcp_servers = Vec::new();
    let mut nfs_port = None;
    if let Some(t) = tcp_addr {
        let s =
            TcpServer::spawn_with(t, reg.clone(), tcp_cfg.clone()).with_context(|| format!("listening on tcp {t}"))?;
        println!("nfs serve: NFSv3 + MOUNT v3 over TCP on {}", s.local_addr());
        nfs_port = Some(s.local_addr().port());
        tcp_servers.push(s);
    }
    let mut mnt_port = nfs_port;
    if let Some(m) = mount_port {
        let ip = tcp_addr.map_or([0, 0, 0, 0].into(), |t| t.ip());
        let s = TcpServer::spawn_with(SocketAddr::new(ip, m), reg.clone(), tcp_cfg.clone())
            .with_context(|| format!("listening on tcp {ip}:{m} (mount)"))?;
        println!("nfs serve: MOUNT v3 over TCP on {}", s.local_addr());
        mnt_port = Some(s.local_addr().port());
        tcp_servers.push(s);
    }
    let mut table = Vec::new();
    if let Some(p) = nfs_port {
        table.push((nfs3::PROGRAM, nfs3::VERSION, portmap::IPPROTO_TCP, p));
    }
    if let Some(p) = mnt_port {
        table.push((mount::PROGRAM, mount::VERSION, portmap::IPPROTO_TCP, p));
    }
    if let Some(p) = a.portmap {
        let pm = Arc::new(nfsd::registry(&export, Some(table.clone())));
        let s =
            TcpServer::spawn_with(p, pm, tcp_cfg.clone()).with_context(|| format!("listening on tcp {p} (portmap)"))?;
        println!("nfs serve: portmapper GETPORT on {}", s.local_addr());
        tcp_servers.push(s);
    }
    let mut _dev = None;
    let mut _rdma = None;
    if let Some(r) = rdma_addr {
        let dev = crate::providers::open(dev, flags, crate::providers::Endpoint::Listen(r.ip()))?;
        let inline = a.rdma_inline.clamp(1024, 1 << 20) as u32;
        let cfg = RdmaConfig {
            inline_send: inline,
            inline_recv: inline,
            credits: a.rdma_credits.max(1),
            workers: a.rdma_workers.max(1),
            pool: Some(pool.clone()),
            // a WRITE of wtmax through a Read chunk, and a READ reply of rtmax
            max_call: (u64::from(max_io) + (64 << 10)).max(RdmaConfig::default().max_call),
            ..RdmaConfig::default()
        };
        let s =
            RdmaServer::spawn(&dev, r, reg.clone(), cfg).map_err(|e| anyhow!("RPC-over-RDMA listen on {r}: {e}"))?;
        println!(
            "nfs serve: NFSv3 over RPC-over-RDMA ({}) on {}",
            crate::providers::transport(&dev),
            s.local_addr()
        );
        _rdma = Some(s);
        _dev = Some(dev);
    }
    let regs = if a.portmap.is_none() {
        rpcbind_register(&table)
    } else {
        Vec::new()
    };
    if regs.is_empty() && a.portmap.is_none() {
        let mport = table.iter().find(|t| t.0 == mount::PROGRAM).map_or(0, |t| t.3);
        println!("nfs serve: no rpcbind: mount with -o port=N,mountport={mport} (or pass --portmap)");
    }
    println!(
        "nfs serve: exporting {} as {}{} (rtmax/wtmax {max_io})",
        a.dir.display(),
        a.export_name,
        if a.ro { " read-only" } else { "" }
    );
    let stop = wait_for_termination(&signals, a.exit_after.map(Duration::from_secs));
    rpcbind_unregister(&regs);
    eprintln!("nfs serve: stopping ({stop})");
    Ok(())
}
