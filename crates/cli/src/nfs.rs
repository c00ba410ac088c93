//! `softrdma nfs`: a small NFSv3 client over RPC-over-RDMA (iWARP or RoCEv2, `--provider`) or TCP.
//!
//! ```text
//! softrdma nfs stat SERVER:/export/path [--json]
//! softrdma nfs ls   SERVER:/export/dir  [--json]
//! softrdma nfs get  SERVER:/export/file [LOCAL] [--rsize 1M]
//! softrdma nfs put  LOCAL SERVER:/export/file   [--wsize 1M] [--stable unstable|file-sync]
//! softrdma nfs rm   SERVER:/export/file
//! softrdma nfs probe SERVER:/export/file [--scratch /export/dir]   (RFC 8166 §4.5 chunk errors)
//! softrdma nfs serve DIR [--rdma ADDR:20049] [--tcp ADDR:2049] [--mount-port N] [--ro]   (the server)
//! ```
//!
//! As Linux mounts: rpcbind GETPORT for mountd and MOUNT v3 MNT over TCP (the
//! export is the shortest prefix of the path the server mounts, or
//! `--export`), then NFSv3 over RDMA on port 20049 (or `--transport tcp`, the
//! port rpcbind names, else 2049). READ data comes back through Write chunks,
//! WRITE data goes out through Read chunks, READDIRPLUS through a Reply chunk.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rpcrdma::client::{Auth, RpcClient};
use rpcrdma::nfs3::{self, CreateHow, Fattr, Fh, Ftype, Nfs3Client, Sattr, Stable};
use rpcrdma::tcp::TcpClient;
use rpcrdma::transport::{RdmaClient, RdmaConfig};
use rpcrdma::{mount, portmap};
use serde_json::json;

use crate::units::parse_size;

#[path = "nfs_probe.rs"]
mod probe;
#[path = "nfs_serve.rs"]
mod serve;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    opts: Opts,
}

#[derive(clap::Args, Clone)]
struct Opts {
    /// NFS transport: RPC-over-RDMA (on the --provider device) or ONC RPC over TCP.
    #[arg(long, global = true, default_value = "rdma", value_parser = ["rdma", "tcp"])]
    transport: String,
    /// NFS port (default: 20049 for rdma; rpcbind's answer or 2049 for tcp).
    #[arg(long, global = true)]
    port: Option<u16>,
    /// mountd port (default: ask rpcbind on port 111).
    #[arg(long, global = true)]
    mount_port: Option<u16>,
    /// The export to MNT (default: the shortest prefix of the path the server mounts).
    #[arg(long, global = true)]
    export: Option<String>,
    /// READ size.
    #[arg(long, global = true, value_parser = parse_size, default_value = "1M")]
    rsize: u64,
    /// WRITE size.
    #[arg(long, global = true, value_parser = parse_size, default_value = "1M")]
    wsize: u64,
    /// READ/WRITE calls in flight at once.
    #[arg(long, global = true, default_value_t = 4)]
    parallel: u32,
    /// AUTH_SYS uid.
    #[arg(long, global = true, default_value_t = 0)]
    uid: u32,
    /// AUTH_SYS gid.
    #[arg(long, global = true, default_value_t = 0)]
    gid: u32,
    /// RPC-over-RDMA inline threshold (RFC 8797 send and receive size) we offer.
    #[arg(long, global = true, value_parser = parse_size, default_value = "4K")]
    inline: u64,
    /// Credits we ask for.
    #[arg(long, global = true, default_value_t = 32)]
    credits: u32,
    /// Milliseconds to pause after the connection is up before the first Send (Linux 6.1's
    /// siw drops an FPDU that arrives right after its MPA Reply; see docs/interop-siw.md).
    #[arg(long, global = true, default_value_t = 50)]
    settle_ms: u64,
    /// Per-call timeout in seconds.
    #[arg(long, global = true, default_value_t = 30)]
    timeout: u64,
    /// iWARP: ask for MPA CRC (refused on other providers).
    #[arg(long, global = true)]
    crc: bool,
    /// The RDMA device: --provider iwarp|roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    dev: crate::providers::DeviceArgs,
    /// Show progress (default: on for files of 8 MiB or more when stderr is a terminal).
    #[arg(long, global = true)]
    progress: bool,
    /// JSON output (stat, ls, and a summary for get/put).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Attributes of a file or directory (LOOKUP + GETATTR).
    Stat {
        /// SERVER:/export/path of the file or directory (SERVER: an address or a name).
        target: String,
    },
    /// List a directory (READDIRPLUS).
    Ls {
        /// SERVER:/export/dir to list.
        target: String,
    },
    /// Copy a file from the server to LOCAL (default: its name in the current directory; `-` for stdout).
    Get {
        /// SERVER:/export/file to copy.
        target: String,
        /// Where to write it: a local path, or `-` for stdout [default: the file's name here].
        local: Option<String>,
    },
    /// Copy LOCAL to the server (CREATE, then WRITE; UNSTABLE WRITEs end with a COMMIT).
    Put {
        /// The local file to copy, or `-` for stdin.
        local: String,
        /// SERVER:/export/file to create or overwrite.
        target: String,
        /// How WRITE asks the server to store the data: `unstable` (as Linux's client writes
        /// whole files: the server may cache, one COMMIT at the end makes it stable, and if
        /// COMMIT's write verifier differs from the WRITEs' the server restarted and the file
        /// is written again FILE_SYNC) or `file-sync` (every WRITE stable before its reply).
        #[arg(long, default_value = "unstable", value_parser = ["unstable", "file-sync"])]
        stable: String,
    },
    /// Remove a file (REMOVE; not a directory).
    Rm {
        /// SERVER:/export/file to remove.
        target: String,
    },
    /// Export the directory DIR over NFSv3 (RPC-over-RDMA and TCP) and MOUNT v3, until SIGINT
    /// or SIGTERM. Registers with rpcbind when one runs.
    Serve(serve::ServeArgs),
    /// Ask how the server handles RPC-over-RDMA chunks it cannot use (RFC 8166 §4.5): READs of
    /// the file TARGET with a Write chunk or Reply chunk too small, and with a stale Write-chunk
    /// handle (the server's RDMA Write meets our Terminate; the call is retransmitted after a
    /// reconnect); with --scratch, a WRITE with a stale Read-chunk handle too. Reports what the
    /// server answered to each, and whether the client recovered. Exit status 1 when an answer
    /// is not one RFC 8166 allows or the client did not recover. RDMA only.
    Probe {
        /// A regular file of at least 16 KiB, e.g. 192.168.77.2:/export/data-16M.bin.
        target: String,
        /// Bytes per READ (clamped to the file's size).
        #[arg(long, value_parser = parse_size, default_value = "64K")]
        count: u64,
        /// A writable directory below the same export for the stale Read-chunk case (it
        /// creates softrdma-probe-PID there), e.g. /export/scratch.
        #[arg(long)]
        scratch: Option<String>,
    },
}

/// `SERVER:/path` -> (server address, path).
fn split_target(t: &str) -> Result<(IpAddr, String)> {
    let (host, path) = if let Some(rest) = t.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| anyhow!("expected [IPv6]:/path, got {t:?}"))?;
        (h, p)
    } else {
        t.split_once(':')
            .ok_or_else(|| anyhow!("expected SERVER:/export/path, got {t:?}"))?
    };
    if !path.starts_with('/') {
        bail!("the path in {t:?} must be absolute (SERVER:/export/path)");
    }
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => (host, 0)
            .to_socket_addrs()
            .with_context(|| format!("resolving {host}"))?
            .next()
            .ok_or_else(|| anyhow!("{host}: no address"))?
            .ip(),
    };
    Ok((ip, path.to_string()))
}

enum Client {
    Tcp(TcpClient),
    Rdma(RdmaClient),
}

impl RpcClient for Client {
    fn call<T>(
        &self,
        call: &rpcrdma::client::Call<'_>,
        decode: impl FnOnce(&mut rpcrdma::xdr::Decoder<'_>) -> Result<T, rpcrdma::xdr::XdrError>,
    ) -> Result<T, rpcrdma::client::RpcError> {
        match self {
            Client::Tcp(c) => c.call(call, decode),
            Client::Rdma(c) => c.call(call, decode),
        }
    }
}

struct Session {
    nfs: Nfs3Client<Client>,
    root: Fh,
    /// Path below the export.
    rest: String,
    export: String,
    info: String,
    _dev: Option<verbs::Device>,
}

impl Session {
    /// The directory holding the file the target names, and the file's name in it.
    fn parent_of(&self, target: &str) -> Result<(Fh, String)> {
        // with the export "/", the rest of "SERVER:/file" is "file": its directory is the root
        let rest = self.rest.trim_end_matches('/');
        let (dir, name) = rest.rsplit_once('/').unwrap_or(("", rest));
        if name.is_empty() {
            bail!("{target}: name a file below the export {}", self.export);
        }
        let (dfh, _) = self.nfs.lookup_path(&self.root, dir)?;
        Ok((dfh, name.to_string()))
    }
}

/// CREATE (UNCHECKED) `name` in `dir` as an empty file of mode 0644; its handle (from
/// CREATE's reply, else a LOOKUP).
fn create_empty(nfs: &Nfs3Client<Client>, dir: &Fh, name: &str) -> Result<Fh> {
    let c = nfs.create(
        dir,
        name.as_bytes(),
        CreateHow::Unchecked(Sattr {
            mode: Some(0o644),
            size: Some(0),
            ..Sattr::default()
        }),
    )?;
    Ok(match c.obj {
        Some(fh) => fh,
        None => nfs.lookup(dir, name.as_bytes())?.object,
    })
}

fn tcp_connect(addr: SocketAddr, timeout: Duration) -> Result<TcpClient> {
    // fail fast when nobody listens
    drop(
        std::net::TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(10)))
            .with_context(|| format!("connecting to {addr}"))?,
    );
    let mut c = TcpClient::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    c.set_timeout(timeout);
    Ok(c)
}

fn connect(o: &Opts, target: &str) -> Result<Session> {
    let (ip, path) = split_target(target)?;
    let timeout = Duration::from_secs(o.timeout.max(1));
    let auth = Auth::sys(&hostname(), o.uid, o.gid, &[])?;
    // MOUNT over TCP, through rpcbind (as Linux does for NFS/RDMA too)
    let pm = || tcp_connect(SocketAddr::new(ip, portmap::PORT), timeout);
    let mport = match o.mount_port {
        Some(p) => p,
        None => {
            let p = portmap::getport(&pm()?, mount::PROGRAM, mount::VERSION, portmap::IPPROTO_TCP)
                .context("rpcbind GETPORT for mountd")?;
            if p == 0 {
                bail!("rpcbind on {ip} knows no MOUNT v3 over TCP");
            }
            p
        }
    };
    let mc = tcp_connect(SocketAddr::new(ip, mport), timeout)?;
    let candidates: Vec<String> = match &o.export {
        Some(e) => vec![e.clone()],
        None => {
            let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
            let mut v: Vec<String> = (1..=comps.len())
                .map(|n| format!("/{}", comps[..n].join("/")))
                .collect();
            v.push("/".into());
            v
        }
    };
    let mut last = None;
    let mut found = None;
    for e in candidates {
        match mount::mnt(&mc, &auth, &e) {
            Ok(m) => {
                found = Some((e, m.fhandle));
                break;
            }
            Err(err) => last = Some(err),
        }
    }
    let (export, root) = match found {
        Some(f) => f,
        None => bail!(
            "MNT failed for every prefix of {path}: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        ),
    };
    let rest = path.strip_prefix(export.as_str()).unwrap_or("").to_string();
    let (client, dev, info) = if o.transport == "tcp" {
        let port = match o.port {
            Some(p) => p,
            None => pm()
                .ok()
                .and_then(|c| portmap::getport(&c, nfs3::PROGRAM, nfs3::VERSION, portmap::IPPROTO_TCP).ok())
                .filter(|&p| p != 0)
                .unwrap_or(nfs3::NFS_PORT),
        };
        let a = SocketAddr::new(ip, port);
        (Client::Tcp(tcp_connect(a, timeout)?), None, format!("tcp {a}"))
    } else {
        let a = SocketAddr::new(ip, o.port.unwrap_or(nfs3::NFS_RDMA_PORT));
        let at = crate::providers::Endpoint::Connect { dest: ip, source: None };
        let dev = crate::providers::open(&o.dev, &crc_flag(o.crc), at)?;
        let inline = o.inline.clamp(1024, 1 << 20) as u32;
        let cfg = RdmaConfig {
            inline_send: inline,
            inline_recv: inline,
            credits: o.credits.max(1),
            timeout,
            connect_settle: Duration::from_millis(o.settle_ms),
            ..RdmaConfig::default()
        };
        let c =
            RdmaClient::connect(&dev.alloc_pd()?, a, cfg).map_err(|e| anyhow!("RPC-over-RDMA connect to {a}: {e}"))?;
        let n = c.negotiated();
        let info = match n {
            Some(n) => format!(
                "rdma {a} (inline call {} reply {}, remote invalidation {})",
                n.thresholds.call, n.thresholds.reply, n.remote_invalidation
            ),
            None => format!("rdma {a}"),
        };
        (Client::Rdma(c), Some(dev), info)
    };
    let nfs = Nfs3Client::new(client, auth.clone());
    nfs.null().context("NFS NULL")?;
    // UMNT right away: the MNT is only how we learn the root handle
    let _ = mount::umnt(&mc, &auth, &export);
    Ok(Session {
        nfs,
        root,
        rest,
        export,
        info,
        _dev: dev,
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "softrdma".into())
}

fn attr_json(a: &Fattr) -> serde_json::Value {
    json!({
        "type": a.ftype.name(),
        "mode": format!("{:o}", a.mode),
        "nlink": a.nlink,
        "uid": a.uid,
        "gid": a.gid,
        "size": a.size,
        "used": a.used,
        "fsid": a.fsid,
        "fileid": a.fileid,
        "atime": a.atime.seconds,
        "mtime": a.mtime.seconds,
        "mtime_nsec": a.mtime.nseconds,
        "ctime": a.ctime.seconds,
    })
}

fn mode_string(a: &Fattr) -> String {
    let t = match a.ftype {
        Ftype::Dir => 'd',
        Ftype::Lnk => 'l',
        Ftype::Blk => 'b',
        Ftype::Chr => 'c',
        Ftype::Sock => 's',
        Ftype::Fifo => 'p',
        Ftype::Reg => '-',
    };
    let mut s = String::from(t);
    for shift in [6, 3, 0] {
        let b = (a.mode >> shift) & 7;
        s.push(if b & 4 != 0 { 'r' } else { '-' });
        s.push(if b & 2 != 0 { 'w' } else { '-' });
        s.push(if b & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// Progress of a transfer (indicatif, see crate::progress): by default for files of
/// 8 MiB or more when stderr is a terminal and the output is not JSON.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: u64,
}

impl Progress {
    fn new(force: bool, json: bool, total: u64) -> Progress {
        let on = force || (total >= 8 << 20 && crate::progress::wanted(false, json));
        Progress {
            bar: crate::progress::bytes(on, force, total),
            total,
        }
    }
    fn update(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            if done >= self.total {
                bar.finish();
            }
        }
    }
}

/// `--crc` as a provider flag (only when given, so that other providers are not asked).
fn crc_flag(on: bool) -> Vec<crate::providers::Flag> {
    crate::providers::Flag::crc(on.then_some("on")).into_iter().collect()
}

pub fn run(args: Args) -> Result<()> {
    let o = args.opts;
    // The device choice is checked before anything connects (portmap, MOUNT), so that an
    // option the provider does not take is the error, not whatever the network says.
    if o.transport != "tcp" || matches!(args.cmd, Cmd::Serve(_)) {
        crate::providers::check(&o.dev, &crc_flag(o.crc))?;
    }
    match args.cmd {
        Cmd::Serve(a) => serve::serve(a, o.mount_port, &o.dev, &crc_flag(o.crc)),
        Cmd::Stat { target } => {
            let s = connect(&o, &target)?;
            let (fh, a) = s.nfs.lookup_path(&s.root, &s.rest)?;
            if o.json {
                let mut v = attr_json(&a);
                v["fh"] = json!(fh.hex());
                v["export"] = json!(s.export);
                v["transport"] = json!(s.info);
                println!("{v}");
            } else {
                println!(
                    "{target}: {} {} size {} uid {} gid {} nlink {} fileid {} mtime {}.{:09} fh {}",
                    a.ftype.name(),
                    mode_string(&a),
                    a.size,
                    a.uid,
                    a.gid,
                    a.nlink,
                    a.fileid,
                    a.mtime.seconds,
                    a.mtime.nseconds,
                    fh.hex()
                );
                println!("  via {} (export {})", s.info, s.export);
            }
            Ok(())
        }
        Cmd::Probe { target, count, scratch } => {
            let s = connect(&o, &target)?;
            let scratch = match &scratch {
                Some(d) => Some(
                    d.strip_prefix(s.export.as_str())
                        .ok_or_else(|| anyhow!("--scratch {d} is not below the export {}", s.export))?
                        .to_string(),
                ),
                None => None,
            };
            let count = u32::try_from(count).unwrap_or(u32::MAX);
            if !probe::run(&o, &s, count, scratch.as_deref())? {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Ls { target } => {
            let s = connect(&o, &target)?;
            let (fh, a) = s.nfs.lookup_path(&s.root, &s.rest)?;
            let entries = if a.ftype == Ftype::Dir {
                s.nfs.readdirplus_all(&fh, 65536)?
            } else {
                vec![nfs3::EntryPlus {
                    fileid: a.fileid,
                    name: s.rest.rsplit('/').next().unwrap_or("").as_bytes().to_vec(),
                    cookie: 0,
                    attributes: Some(a),
                    handle: Some(fh),
                }]
            };
            if o.json {
                let v: Vec<_> = entries
                    .iter()
                    .map(|e| {
                        let mut v = e.attributes.as_ref().map_or_else(|| json!({}), attr_json);
                        v["name"] = json!(String::from_utf8_lossy(&e.name));
                        v["fileid"] = json!(e.fileid);
                        if let Some(h) = &e.handle {
                            v["fh"] = json!(h.hex());
                        }
                        v
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                for e in &entries {
                    match &e.attributes {
                        Some(a) => println!(
                            "{} {:>3} {:>5} {:>5} {:>12} {}",
                            mode_string(a),
                            a.nlink,
                            a.uid,
                            a.gid,
                            a.size,
                            String::from_utf8_lossy(&e.name)
                        ),
                        None => println!("?????????? {}", String::from_utf8_lossy(&e.name)),
                    }
                }
            }
            Ok(())
        }
        Cmd::Get { target, local } => {
            let s = connect(&o, &target)?;
            let (fh, a) = s.nfs.lookup_path(&s.root, &s.rest)?;
            if a.ftype != Ftype::Reg {
                bail!("{target} is a {}, not a regular file", a.ftype.name());
            }
            let local = local.unwrap_or_else(|| s.rest.rsplit('/').next().unwrap_or("nfs.out").to_string());
            let t = Instant::now();
            let n = if local == "-" {
                let mut out = std::io::stdout();
                let n = get(&s.nfs, &fh, a.size, &o, &mut out)?;
                out.flush()?;
                n
            } else {
                // a file (or a device such as /dev/null): each reader writes its piece where
                // it belongs, straight from the reply
                let f = std::fs::File::create(&local).with_context(|| format!("creating {local}"))?;
                get_at(&s.nfs, &fh, a.size, &o, &f).with_context(|| format!("get to {local}"))?
            };
            summary(&o, "get", n, t.elapsed(), &s.info, &local, connects(s.nfs.rpc()));
            Ok(())
        }
        Cmd::Rm { target } => {
            let s = connect(&o, &target)?;
            let (dfh, name) = s.parent_of(&target)?;
            s.nfs.remove(&dfh, name.as_bytes())?;
            if o.json {
                println!("{}", json!({"op": "rm", "path": target, "via": s.info}));
            } else {
                println!("removed {target}");
            }
            Ok(())
        }
        Cmd::Put { local, target, stable } => {
            // The local side first: a missing file is the user's first problem, not the server.
            let data = if local == "-" {
                let mut v = Vec::new();
                std::io::stdin().read_to_end(&mut v)?;
                v
            } else {
                std::fs::read(&local).with_context(|| format!("reading the local file {local}"))?
            };
            let s = connect(&o, &target)?;
            let (dfh, name) = s.parent_of(&target)?;
            let fh = create_empty(&s.nfs, &dfh, &name)?;
            let t = Instant::now();
            let stable = if stable == "file-sync" {
                Stable::FileSync
            } else {
                Stable::Unstable
            };
            put(&s.nfs, &fh, &data, &o, stable)?;
            let a = s.nfs.getattr(&fh)?;
            if a.size != data.len() as u64 {
                bail!("after WRITE the server reports {} bytes, not {}", a.size, data.len());
            }
            summary(
                &o,
                "put",
                data.len() as u64,
                t.elapsed(),
                &s.info,
                &target,
                connects(s.nfs.rpc()),
            );
            Ok(())
        }
    }
}

fn connects(c: &Client) -> u32 {
    match c {
        Client::Tcp(_) => 1,
        Client::Rdma(r) => r.connects(),
    }
}

fn summary(o: &Opts, op: &str, bytes: u64, d: Duration, via: &str, what: &str, connects: u32) {
    let mbs = bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6;
    if o.json {
        println!(
            "{}",
            json!({"op": op, "bytes": bytes, "seconds": d.as_secs_f64(), "mb_per_s": mbs, "via": via, "path": what, "rsize": o.rsize, "wsize": o.wsize, "calls_in_flight": o.parallel, "connects": connects})
        );
    } else {
        let re = if connects > 1 {
            format!(", {} reconnect(s)", connects - 1)
        } else {
            String::new()
        };
        eprintln!(
            "{op}: {bytes} bytes in {:.3} s ({mbs:.1} MB/s) via {via}{re} -> {what} \
             (rsize {}, wsize {}, {} calls in flight; the same over either transport)",
            d.as_secs_f64(),
            o.rsize,
            o.wsize,
            o.parallel
        );
    }
}

/// READ the whole file into `file` with `parallel` calls in flight all the time: each of
/// `parallel` reader threads takes the next piece as soon as it is free and writes it at its
/// offset (`pwrite`) straight from the reply, where the RDMA Write placed it (no copy into a
/// vector, none into a write buffer, and no thread that writes the pieces one after another:
/// issue 17/18, `nfs get` to a file). Returns the bytes of the file (to its eof).
fn get_at(nfs: &Nfs3Client<Client>, fh: &Fh, size: u64, o: &Opts, file: &std::fs::File) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::mpsc::channel;
    let rsize = o.rsize.clamp(512, 64 << 20);
    let par = o.parallel.clamp(1, 64) as u64;
    let mut prog = Progress::new(o.progress, o.json, size);
    let pieces = size.div_ceil(rsize).max(1);
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    // one piece: READ at its offset, written where it belongs from the reply itself
    let piece = |off: u64| -> Result<(u64, bool)> {
        let (wrote, rr) = nfs.read_then(fh, off, rsize as u32, |data| {
            file.write_all_at(data, off).map(|()| data.len() as u64)
        })?;
        Ok((wrote.context("writing the local file")?, rr.eof))
    };
    // (piece, bytes, eof) of every piece, as they complete
    let done: Vec<(u64, u64, bool)> = std::thread::scope(|s| -> Result<Vec<(u64, u64, bool)>> {
        let (tx, rx) = channel::<(u64, Result<(u64, bool)>)>();
        for _ in 0..par.min(pieces) {
            let (tx, next, stop, piece) = (tx.clone(), &next, &stop, &piece);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= pieces {
                        return;
                    }
                    if tx.send((i, piece(i * rsize))).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        let mut done = Vec::with_capacity(pieces as usize);
        let mut moved = 0;
        for (i, r) in rx {
            match r {
                Ok((n, eof)) => {
                    moved += n;
                    prog.update(moved.min(size));
                    done.push((i, n, eof));
                }
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        Ok(done)
    })?;
    // the file is what the pieces hold up to the first short one or eof
    let mut by_piece = done;
    by_piece.sort_unstable_by_key(|&(i, _, _)| i);
    let mut off = 0u64;
    let mut last_eof = false;
    let mut full = true;
    for &(_, n, eof) in &by_piece {
        off += n;
        last_eof = eof;
        if eof || n < rsize {
            if off < size && !eof {
                bail!("short READ at {off} without eof");
            }
            full = false;
            break;
        }
    }
    if !full && off < by_piece.len() as u64 * rsize && file.metadata().is_ok_and(|m| m.is_file()) {
        // the file shrank while it was read: later pieces may have written past its end
        file.set_len(off).context("truncating the local file")?;
    }
    // the file grew past the size it had: the rest one READ at a time, to its eof
    while full && !last_eof {
        let (n, eof) = piece(off)?;
        off += n;
        last_eof = eof || n < rsize;
    }
    prog.update(size);
    Ok(off)
}

/// READ the whole file with `parallel` calls in flight all the time: `parallel` reader threads
/// take the next piece as soon as they are free, and this thread writes the pieces to `out` in
/// order while the next ones are on the wire (at most `2 x parallel` pieces read ahead of it).
/// (Issue 17/18: the READs went in rounds of `parallel`, a new thread per READ, and a round
/// waited for its slowest READ before the next began, so the pipe drained every `parallel`
/// calls and a transport with a longer per-call latency lost more. Earlier still the local
/// write ran between the rounds: docs/nfs-server.md, "Loopback figures".)
fn get(nfs: &Nfs3Client<Client>, fh: &Fh, size: u64, o: &Opts, out: &mut (dyn Write + Send)) -> Result<u64> {
    use std::sync::mpsc::sync_channel;
    use std::sync::{Condvar, Mutex};
    let rsize = o.rsize.clamp(512, 64 << 20);
    let par = o.parallel.clamp(1, 64) as u64;
    let mut prog = Progress::new(o.progress, o.json, size);
    // the pieces the size known now covers (at least one, to see eof)
    let pieces = size.div_ceil(rsize).max(1);
    struct Window {
        /// The next piece a reader takes.
        next: u64,
        /// Pieces written so far.
        written: u64,
        stop: bool,
    }
    let win = Mutex::new(Window {
        next: 0,
        written: 0,
        stop: false,
    });
    let moved = Condvar::new();
    let ahead = 2 * par;
    std::thread::scope(|s| -> Result<u64> {
        let (tx, rx) = sync_channel::<(u64, Result<(Vec<u8>, nfs3::ReadReply)>)>(ahead as usize);
        for _ in 0..par.min(pieces) {
            let (tx, win, moved) = (tx.clone(), &win, &moved);
            s.spawn(move || {
                loop {
                    let i = {
                        let mut w = win.lock().unwrap();
                        while !w.stop && w.next < pieces && w.next >= w.written + ahead {
                            w = moved.wait(w).unwrap();
                        }
                        if w.stop || w.next >= pieces {
                            return;
                        }
                        w.next += 1;
                        w.next - 1
                    };
                    let r = nfs.read(fh, i * rsize, rsize as u32).map_err(anyhow::Error::from);
                    if tx.send((i, r)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        let stop = || {
            win.lock().unwrap().stop = true;
            moved.notify_all();
        };
        let mut early: std::collections::BTreeMap<u64, (Vec<u8>, nfs3::ReadReply)> = Default::default();
        let mut off = 0u64;
        let mut at = 0u64;
        let mut last_eof = false;
        let result = (|| -> Result<()> {
            while at < pieces {
                let (data, rr) = match early.remove(&at) {
                    Some(x) => x,
                    None => {
                        let (i, r) = rx.recv().map_err(|_| anyhow!("the readers ended early"))?;
                        let x = r?;
                        if i != at {
                            early.insert(i, x);
                            continue;
                        }
                        x
                    }
                };
                let n = data.len() as u64;
                out.write_all(&data).context("writing the local file")?;
                off += n;
                at += 1;
                {
                    win.lock().unwrap().written = at;
                }
                moved.notify_all();
                prog.update(off.min(size));
                last_eof = rr.eof;
                if rr.eof || n < rsize {
                    if off < size && !rr.eof {
                        bail!("short READ at {off} without eof");
                    }
                    return Ok(());
                }
            }
            Ok(())
        })();
        stop();
        result?;
        // the file grew past the size it had: the rest one READ at a time, to its eof
        while !last_eof {
            let (data, rr) = nfs.read(fh, off, rsize as u32)?;
            out.write_all(&data).context("writing the local file")?;
            off += data.len() as u64;
            last_eof = rr.eof || (data.len() as u64) < rsize;
        }
        out.flush().context("writing the local file")?;
        prog.update(size);
        Ok(off)
    })
}

/// WRITE `data` at 0 as `stable` asks; UNSTABLE writes end with a COMMIT whose verifier must
/// match every WRITE's (RFC 1813 §3.3.21), else the whole file is written again FILE_SYNC.
fn put(nfs: &Nfs3Client<Client>, fh: &Fh, data: &[u8], o: &Opts, stable: Stable) -> Result<()> {
    let verfs = write_all(nfs, fh, data, o, stable)?;
    if verfs.is_empty() {
        return Ok(()); // every WRITE came back FILE_SYNC (or DATA_SYNC)
    }
    let c = nfs.commit(fh, 0, 0)?;
    if verfs.iter().any(|v| *v != c.verf) {
        tracing::warn!("the write verifier changed before COMMIT (the server restarted): writing again FILE_SYNC");
        eprintln!("nfs put: the server's write verifier changed before COMMIT; writing the file again FILE_SYNC");
        let again = write_all(nfs, fh, data, o, Stable::FileSync)?;
        if !again.is_empty() {
            bail!("the server answered FILE_SYNC WRITEs as UNSTABLE");
        }
    }
    Ok(())
}

/// WRITE `data` at 0 in `wsize` pieces, `parallel` in flight all the time (a writer thread
/// takes the next piece as soon as its WRITE is answered; no round waits for its slowest
/// WRITE); the distinct verifiers of the replies that were not FILE_SYNC/DATA_SYNC (those
/// still need a COMMIT).
fn write_all(
    nfs: &Nfs3Client<Client>,
    fh: &Fh,
    data: &[u8],
    o: &Opts,
    stable: Stable,
) -> Result<Vec<[u8; nfs3::VERFSIZE]>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let wsize = o.wsize.clamp(512, 64 << 20) as usize;
    let par = o.parallel.clamp(1, 64) as usize;
    let mut prog = Progress::new(o.progress, o.json, data.len() as u64);
    let pieces: Vec<(usize, &[u8])> = data.chunks(wsize).enumerate().map(|(i, c)| (i * wsize, c)).collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let mut verfs: Vec<[u8; nfs3::VERFSIZE]> = Vec::new();
    std::thread::scope(|s| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel::<Result<(usize, nfs3::WriteOk)>>();
        for _ in 0..par.min(pieces.len()) {
            let (tx, next, failed, pieces) = (tx.clone(), &next, &failed, &pieces);
            s.spawn(move || {
                while !failed.load(Ordering::Relaxed) {
                    let Some(&(at, piece)) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        return;
                    };
                    let r = nfs
                        .write(fh, at as u64, piece, stable)
                        .map_err(anyhow::Error::from)
                        .and_then(|w| {
                            if w.count as usize != piece.len() {
                                bail!("WRITE at {at}: the server took {} of {} bytes", w.count, piece.len());
                            }
                            Ok((piece.len(), w))
                        });
                    let bad = r.is_err();
                    if tx.send(r).is_err() || bad {
                        failed.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
        drop(tx);
        let mut done = 0u64;
        for r in rx {
            let (n, w) = match r {
                Ok(x) => x,
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            };
            if w.committed == Stable::Unstable && !verfs.contains(&w.verf) {
                verfs.push(w.verf);
            }
            done += n as u64;
            prog.update(done);
        }
        Ok(())
    })?;
    prog.update(data.len() as u64);
    Ok(verfs)
}
