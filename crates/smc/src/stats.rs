//! What `softrdma smc stat` shows (like Linux's `smcss` / `smcr linkgroup`): link groups,
//! links (state, GIDs, QPNs), connections (SMC-R or fallback and why, octets each way) and
//! the counts of QPs, MRs and RMB elements in use — the model, how a process collects it, and
//! how another process reads it.
//!
//! **Model.** A [`Snapshot`] per process. It is plain data (serde), so the same JSON is what
//! `smc stat --json` prints and what travels between processes.
//!
//! **Collection.** Whatever owns SMC-R state (the [`crate::stream`] engine, or a per-host
//! daemon such as `smc run`'s) registers a [`Source`] with [`register`]; [`snapshot`] asks
//! every live source to [`Source::fill`] one snapshot and adds the process-wide
//! [`Resources`] counters (QPs, MRs, RMB elements: [`counters`]), which the engine keeps
//! exact so that a leak check is "counts before = counts after".
//!
//! **Between processes.** [`publish`] binds a unix stream socket `<dir>/<pid>.sock`
//! (`dir` = `$SOFTRDMA_SMC_RUN_DIR`, default [`DEFAULT_DIR`] = `/run/softrdma/smc`) served by
//! one thread: each connection gets one JSON snapshot, then EOF. The engine calls it when its
//! first link group is made (set `SOFTRDMA_SMC_STATS=off` to disable); a directory that
//! cannot be created only means no publishing. [`collect`] connects to every `*.sock` of the
//! directory (removing sockets whose process is gone) and returns their snapshots; that is
//! what `softrdma smc stat` does. The socket is created with mode 0600 semantics of the
//! directory: the directory is made 0700, so only the same user (or root) reads the stats.
//! Unix sockets are filesystem objects, so one `smc stat` sees the processes of every
//! network namespace; each snapshot names its namespace ([`Snapshot::netns`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// Where processes publish their stats sockets unless `$SOFTRDMA_SMC_RUN_DIR` says otherwise.
pub const DEFAULT_DIR: &str = "/run/softrdma/smc";
/// Version of the JSON model (bumped on incompatible changes).
pub const MODEL_VERSION: u32 = 1;

/// One process's SMC-R state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`MODEL_VERSION`].
    pub version: u32,
    /// Process id.
    pub pid: u32,
    /// Program name (`/proc/self/comm`).
    pub program: String,
    /// Inode of the process's network namespace (`/proc/self/ns/net`), 0 if unknown.
    pub netns: u64,
    /// Link groups.
    pub link_groups: Vec<LinkGroupStat>,
    /// Connections, SMC-R and fallback.
    pub connections: Vec<ConnStat>,
    /// Resources in use (the leak check's numbers).
    pub resources: Resources,
}

/// Which end of a link group this process is (RFC 7609 §2.2.3: one server, one client).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// We accepted the connections (we add and delete links).
    #[default]
    Server,
    /// We connected.
    Client,
}

/// One link group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkGroupStat {
    /// Process-local id.
    pub id: u32,
    /// Our role.
    pub role: Role,
    /// The peer's peer ID (instance + MAC) in hex.
    pub peer_id: String,
    /// Links of the group.
    pub links: Vec<LinkStat>,
    /// Connections using the group.
    pub conns: u32,
    /// RMBs registered (each carved into elements of `element_size`).
    pub rmbs: u32,
    /// Element size in octets.
    pub element_size: u32,
    /// Elements in use.
    pub elements_used: u32,
    /// Elements available in all RMBs.
    pub elements_total: u32,
    /// No connection left: the group is torn down when the linger time passes.
    pub lingering: bool,
    /// Links lost with a survivor, their connections moved to it (failovers).
    #[serde(default)]
    pub failovers: u64,
    /// Links added to the group after its first one (ADD LINK confirmed).
    #[serde(default)]
    pub links_added: u64,
}

/// State of a link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    /// Being set up (CONFIRM LINK / ADD LINK under way).
    #[default]
    Activating,
    /// Usable.
    Active,
    /// Failed (QP error, TEST LINK timeout, DELETE LINK) and not yet freed.
    Failed,
}

/// One link of a group (an RC QP pair between two RNICs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStat {
    /// Link number (assigned by the server).
    pub link_num: u8,
    /// State.
    pub state: LinkState,
    /// Our device.
    pub device: String,
    /// Our GID (IPv6 text form).
    pub local_gid: String,
    /// The peer's GID.
    pub peer_gid: String,
    /// Our QPN.
    pub local_qpn: u32,
    /// The peer's QPN.
    pub peer_qpn: u32,
    /// Our link user ID.
    pub link_uid: u32,
    /// LLC messages sent / received on this link.
    pub llc_sent: u64,
    /// LLC messages received.
    pub llc_received: u64,
    /// TEST LINK requests we sent (keepalive probes).
    pub test_links: u64,
}

/// How a connection carries its data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConnMode {
    /// SMC-R.
    #[default]
    #[serde(rename = "SMCR")]
    SmcR,
    /// TCP fallback.
    #[serde(rename = "TCP")]
    Fallback,
}

/// One connection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnStat {
    /// Local TCP address.
    pub local: String,
    /// Peer TCP address.
    pub peer: String,
    /// SMC-R or fallback.
    pub mode: ConnMode,
    /// Why it fell back (text), for [`ConnMode::Fallback`].
    pub fallback_reason: Option<String>,
    /// The Decline diagnosis code behind the fallback, when there is one.
    pub fallback_code: Option<u32>,
    /// Link group id (SMC-R).
    pub link_group: Option<u32>,
    /// Link number our writes use (SMC-R).
    pub link: Option<u8>,
    /// Our alert token (SMC-R).
    pub token: Option<u32>,
    /// Our RMB element index (SMC-R).
    pub rmbe_idx: Option<u8>,
    /// Close state (Figure 22) or "tcp".
    pub state: String,
    /// Application octets sent.
    pub bytes_sent: u64,
    /// Application octets received (read by the application).
    pub bytes_received: u64,
}

/// Resources in use in the process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// Link groups.
    pub link_groups: u64,
    /// Links.
    pub links: u64,
    /// RC QPs.
    pub qps: u64,
    /// Memory regions (RMBs, send buffers, control slots).
    pub mrs: u64,
    /// RMB elements given to connections.
    pub rmb_elements: u64,
    /// SMC-R connections.
    pub smc_conns: u64,
    /// Fallback connections (still open).
    pub fallback_conns: u64,
}

/// The process-wide counters behind [`Resources`]; the engine moves them as it creates and
/// frees things.
#[derive(Debug, Default)]
pub struct Counters {
    /// Link groups.
    pub link_groups: AtomicU64,
    /// Links.
    pub links: AtomicU64,
    /// RC QPs.
    pub qps: AtomicU64,
    /// Memory regions.
    pub mrs: AtomicU64,
    /// RMB elements in use.
    pub rmb_elements: AtomicU64,
    /// SMC-R connections.
    pub smc_conns: AtomicU64,
    /// Open fallback connections.
    pub fallback_conns: AtomicU64,
}

impl Counters {
    /// The values now.
    pub fn resources(&self) -> Resources {
        let l = |a: &AtomicU64| a.load(Ordering::Acquire);
        Resources {
            link_groups: l(&self.link_groups),
            links: l(&self.links),
            qps: l(&self.qps),
            mrs: l(&self.mrs),
            rmb_elements: l(&self.rmb_elements),
            smc_conns: l(&self.smc_conns),
            fallback_conns: l(&self.fallback_conns),
        }
    }
}

/// Adds one to a counter.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::AcqRel);
}

/// Takes one from a counter (never below zero).
pub fn dec(c: &AtomicU64) {
    let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(1)));
}

/// The process's counters.
pub fn counters() -> &'static Counters {
    static C: OnceLock<Counters> = OnceLock::new();
    C.get_or_init(Counters::default)
}

/// Something that holds SMC-R state and can describe it.
pub trait Source: Send + Sync {
    /// Adds this source's link groups and connections to `snap`.
    fn fill(&self, snap: &mut Snapshot);
}

/// Sources registered in this process (weak: a dropped source disappears by itself).
fn sources() -> &'static Mutex<BTreeMap<u64, Weak<dyn Source>>> {
    static S: OnceLock<Mutex<BTreeMap<u64, Weak<dyn Source>>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(BTreeMap::new()))
}

static NEXT_SOURCE: AtomicU64 = AtomicU64::new(1);

/// Keeps a [`Source`] registered until dropped.
#[derive(Debug)]
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        sources().lock().unwrap_or_else(|p| p.into_inner()).remove(&self.0);
    }
}

/// Registers `src` (held weakly) for [`snapshot`].
pub fn register<S: Source + 'static>(src: &Arc<S>) -> Registration {
    let id = NEXT_SOURCE.fetch_add(1, Ordering::Relaxed);
    let w: Weak<dyn Source> = Arc::downgrade(src) as Weak<dyn Source>;
    sources().lock().unwrap_or_else(|p| p.into_inner()).insert(id, w);
    Registration(id)
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn netns_inode() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").map(|m| m.ino()).unwrap_or(0)
}

/// This process's snapshot, now.
pub fn snapshot() -> Snapshot {
    let mut s = Snapshot {
        version: MODEL_VERSION,
        pid: std::process::id(),
        program: read_trim("/proc/self/comm"),
        netns: netns_inode(),
        ..Snapshot::default()
    };
    let live: Vec<Arc<dyn Source>> = {
        let mut g = sources().lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|_, w| w.strong_count() > 0);
        g.values().filter_map(Weak::upgrade).collect()
    };
    for src in live {
        src.fill(&mut s);
    }
    s.link_groups.sort_by_key(|g| g.id);
    s.resources = counters().resources();
    s
}

/// The directory stats sockets live in: `$SOFTRDMA_SMC_RUN_DIR` or [`DEFAULT_DIR`].
pub fn run_dir() -> PathBuf {
    std::env::var_os("SOFTRDMA_SMC_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

/// Serves [`snapshot`] on `<dir>/<pid>.sock` until dropped (the socket is removed then).
#[derive(Debug)]
pub struct Publisher {
    path: PathBuf,
}

impl Publisher {
    /// Binds the socket in `dir` (created 0700 if missing) and starts the serving thread.
    pub fn start(dir: &Path) -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let path = dir.join(format!("{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path)?;
        std::thread::Builder::new()
            .name("smc-stats".into())
            .spawn(move || serve(l))?;
        Ok(Self { path })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(l: UnixListener) {
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        let _ = c.set_write_timeout(Some(Duration::from_secs(2)));
        if let Ok(j) = serde_json::to_vec(&snapshot()) {
            let _ = c.write_all(&j);
        }
    }
}

/// Publishes this process's stats once (idempotent) in [`run_dir`], unless
/// `SOFTRDMA_SMC_STATS=off`. Failures are logged at debug level: stats are optional.
pub fn publish() {
    static P: OnceLock<Option<Publisher>> = OnceLock::new();
    P.get_or_init(|| {
        if std::env::var("SOFTRDMA_SMC_STATS").is_ok_and(|v| v == "off" || v == "0") {
            return None;
        }
        match Publisher::start(&run_dir()) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::debug!(error = %e, dir = %run_dir().display(), "SMC-R stats not published");
                None
            }
        }
    });
}

/// Reads one published snapshot.
pub fn read_socket(path: &Path) -> io::Result<Snapshot> {
    let mut c = UnixStream::connect(path)?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = Vec::new();
    c.read_to_end(&mut buf)?;
    serde_json::from_slice(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The snapshots of every process publishing in `dir`, by pid. Sockets whose process is gone
/// (connection refused) are removed; a missing directory is an empty answer.
pub fn collect(dir: &Path) -> Vec<Snapshot> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        match read_socket(&p) {
            Ok(s) => out.push(s),
            Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => {
                let _ = std::fs::remove_file(&p);
            }
            Err(err) => tracing::debug!(error = %err, path = %p.display(), "stats socket unreadable"),
        }
    }
    out.sort_by_key(|s| s.pid);
    out
}

/// GID as text (IPv6 form, `::ffff:a.b.c.d` for IPv4-mapped).
pub fn gid_text(g: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*g).to_string()
}

/// The human-readable form of `smc stat`: per process, link groups with their links, then
/// connections, then the resource counts.
pub fn render_text(snaps: &[Snapshot]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    if snaps.is_empty() {
        o.push_str("no process publishes SMC-R state\n");
        return o;
    }
    for s in snaps {
        let _ = writeln!(o, "process {} ({}) netns {}", s.pid, s.program, s.netns);
        for g in &s.link_groups {
            let _ = writeln!(
                o,
                "  link group {} {:?} peer {} conns {} rmbs {} elements {}/{} x {} failovers {} links added {}{}",
                g.id,
                g.role,
                g.peer_id,
                g.conns,
                g.rmbs,
                g.elements_used,
                g.elements_total,
                g.element_size,
                g.failovers,
                g.links_added,
                if g.lingering { " (lingering)" } else { "" }
            );
            for l in &g.links {
                let _ = writeln!(
                    o,
                    "    link {} {:?} dev {} {} qpn {} <-> {} qpn {} uid {:#x} llc {}/{} test {}",
                    l.link_num,
                    l.state,
                    l.device,
                    l.local_gid,
                    l.local_qpn,
                    l.peer_gid,
                    l.peer_qpn,
                    l.link_uid,
                    l.llc_sent,
                    l.llc_received,
                    l.test_links
                );
            }
        }
        if !s.connections.is_empty() {
            let _ = writeln!(
                o,
                "  {:<22} {:<22} {:<5} {:>4} {:>4} {:<16} {:>12} {:>12}  reason",
                "local", "peer", "mode", "lgr", "link", "state", "sent", "received"
            );
        }
        for c in &s.connections {
            let opt = |v: Option<u32>| v.map_or("-".to_string(), |x| x.to_string());
            let _ = writeln!(
                o,
                "  {:<22} {:<22} {:<5} {:>4} {:>4} {:<16} {:>12} {:>12}  {}",
                c.local,
                c.peer,
                match c.mode {
                    ConnMode::SmcR => "SMCR",
                    ConnMode::Fallback => "TCP",
                },
                opt(c.link_group),
                opt(c.link.map(u32::from)),
                c.state,
                c.bytes_sent,
                c.bytes_received,
                match (&c.fallback_reason, c.fallback_code) {
                    (Some(r), Some(code)) => format!("{r} ({code:#010x})"),
                    (Some(r), None) => r.clone(),
                    _ => String::new(),
                }
            );
        }
        let r = &s.resources;
        let _ = writeln!(
            o,
            "  resources: link groups {} links {} QPs {} MRs {} RMB elements {} SMC-R conns {} fallback conns {}",
            r.link_groups, r.links, r.qps, r.mrs, r.rmb_elements, r.smc_conns, r.fallback_conns
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(u32);
    impl Source for Fake {
        fn fill(&self, s: &mut Snapshot) {
            s.link_groups.push(LinkGroupStat {
                id: self.0,
                ..LinkGroupStat::default()
            });
            s.connections.push(ConnStat {
                mode: ConnMode::Fallback,
                fallback_reason: Some("peer did not indicate SMC".into()),
                fallback_code: Some(0x0301_0000),
                state: "tcp".into(),
                ..ConnStat::default()
            });
        }
    }

    #[test]
    fn sources_come_and_go_and_json_round_trips() {
        let a = Arc::new(Fake(7001));
        let reg = register(&a);
        let s = snapshot();
        assert!(s.link_groups.iter().any(|g| g.id == 7001));
        let j = serde_json::to_string(&s).unwrap();
        assert!(j.contains("\"mode\":\"TCP\""), "{j}");
        let back: Snapshot = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
        assert!(render_text(&[s]).contains("peer did not indicate SMC (0x03010000)"));
        drop(reg);
        assert!(!snapshot().link_groups.iter().any(|g| g.id == 7001));
        // A dropped source without unregistering also disappears.
        let b = Arc::new(Fake(7002));
        let _r = register(&b);
        drop(b);
        assert!(!snapshot().link_groups.iter().any(|g| g.id == 7002));
    }

    #[test]
    fn publisher_serves_and_collect_reads_and_prunes() {
        let dir = std::env::temp_dir().join(format!("smc-stats-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = Arc::new(Fake(7003));
        let _reg = register(&a);
        let p = Publisher::start(&dir).unwrap();
        // A stale socket of a dead process: bound then its listener dropped.
        let stale = dir.join("999999999.sock");
        drop(UnixListener::bind(&stale).unwrap());
        let snaps = collect(&dir);
        assert_eq!(snaps.len(), 1);
        assert_eq!(snaps[0].pid, std::process::id());
        assert!(snaps[0].link_groups.iter().any(|g| g.id == 7003));
        assert!(!stale.exists(), "stale socket removed");
        drop(p);
        assert!(collect(&dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
