//! The engine and the API: [`SmcStream`] and [`SmcListener`], mirroring
//! `std::net::TcpStream` / `TcpListener`, over a RoCE device of the verbs API.
//!
//! **Link groups** (RFC 7609 §2.2, §3.5.1–3.5.2; requirements A2.3, A2.4, A2.7, A4.2, A4.3,
//! A4.9). Connections between the same two peers on the same device share a link group: one
//! RC QP (the link), one PD, one completion queue, RMBs carved into elements, and **one
//! progress thread** that serves every connection of the group (completions, LLC, timers,
//! the close handshakes of dropped streams). The first connection is a *first contact* (the
//! Accept's F flag; new QP, CONFIRM LINK on it); later ones are *subsequent contacts*: the
//! server finds the group by the client's peer ID, GID and MAC, gives the connection an
//! element of an RMB with room (or registers a new RMB and announces it with CONFIRM RKEY
//! before the Accept) and names the existing QP; the client checks that the Accept names a
//! link it knows (else Decline with S, SMC-FC-14), takes an element the same way and sends
//! its Confirm. A connection leaving frees its element; a group without connections lingers
//! ([`SmcConfig::linger`]) and is then freed (the server sends DELETE LINK with A). The
//! link-group protocol (LLC on the established link, TEST LINK keepalive, RKEY exchanges,
//! DELETE LINK) is the sans-I/O [`crate::lgr::LgrMachine`].
//!
//! **Two links** (A4.7, A4.8, A5): with a second device ([`SmcConfig::alt_device`]) a v1
//! group gets a second link on it (the server's ADD LINK, the client's QP on its own second
//! device, RTokens of every RMB exchanged, CONFIRM LINK on the new link); new connections
//! go on the link with the fewest. A link that fails moves its connections to the other
//! (failover: the peer's RToken there, `Conn::failover` replays what the peer may lack);
//! the server adds a link again later. Without a second device (or in a v2 group) a group
//! has one link, ADD LINK is rejected ("no alternate path") and a link failure resets every
//! connection of the group (SMC-ABT-6).
//!
//! The QP of a new group is moved by hand RESET → INIT → RTR → RTS with the CLC values (A1.11:
//! the server is in INIT at Accept, the client RTR before Confirm and RTS after it, the server
//! RTR/RTS on Confirm). Data goes by RDMA Write into the peer's RMB element followed by a CDC
//! Send ([`crate::conn`] decides what and when).
//!
//! Indication of SMC (the TCP option cannot be put on std sockets' SYN): a [`SmcStream`]
//! client always proposes (it assumes an SMC-capable peer, or is told otherwise with
//! [`SmcConfig::propose`]); an [`SmcListener`] looks at the first octets the client sends
//! (`peek`, nothing consumed): the CLC eyecatcher means the client indicated SMC, anything
//! else (or nothing within [`SmcConfig::indication_wait`]) is a plain TCP client → fallback
//! "peer did not indicate SMC", with every octet left for the application.

mod abort;
mod api;
#[cfg(feature = "tokio")]
pub mod async_io;
mod group;
mod link;
mod multilink;
mod setup;
mod slot;
mod sys;
mod urgent;
pub use urgent::Relayed;

use api::*;
pub use api::{SmcListener, SmcStream};
use group::*;
use link::*;
use multilink::*;
use setup::*;
use slot::*;

use crate::clc_machine::{ClcMachine, FallbackReason, LinkParams, LocalCaps, NeedLink, Outcome};
use crate::conn::{AbortReason, Action, CloseState, Conn, ConnError, ConnParams};
use crate::lgr::{LgrAction, LgrConfig, LgrMachine, TermReason};
use crate::stats::{self, ConnMode, ConnStat, LinkGroupStat, LinkStat, LinkState, Role, Snapshot};
use crate::wire::cdc::{CDC_LEN, CDC_TYPE, Cdc};
use crate::wire::clc::{AcceptConfirm, Diagnosis, EID_LEN, EYECATCHER_SMCR, HOSTNAME_LEN, PeerId};
use crate::wire::cursor::{EyecatcherMode, Rmbe};
use crate::wire::llc::{CONFIRM_LINK_NO_RMBE_EYECATCHER, ConfirmLink, LlcBody, LlcMessage, LlcVersion};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};
use verbs::{
    Access, AhAttr, CompletionQueue, Device, Gid, MemoryRegion, Mtu, ProtectionDomain, QpAttr, QpInit, QpInitAttr,
    QpType, QueuePair, RecvWr, RemoteAddr, RtrAttr, RtsAttr, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// Settings of one endpoint.
#[derive(Debug, Clone)]
pub struct SmcConfig {
    /// RMB element size: a power of two from 16 KiB to 512 KiB (A1.6 compressed sizes 0..5).
    pub rmbe_len: u32,
    /// Send buffer size (the registered ring RDMA Writes read from).
    pub send_buf: u32,
    /// Client: send a Proposal (the peer is taken to support SMC-R). False = plain TCP with
    /// reason "peer did not indicate SMC".
    pub propose: bool,
    /// Server: how long to wait for the client's first octets before deciding it is plain TCP.
    pub indication_wait: Duration,
    /// The CLC exchange must finish within this time (Linux: 6 s).
    pub clc_timeout: Duration,
    /// IPv4 prefix length of the connection's subnet (the Proposal's IP area, E-4).
    pub prefix_len: u8,
    /// IPv6 prefix length of an IPv6 connection's prefix (the Proposal's IPv6 prefix; the
    /// server compares it with its own address under the same length).
    pub prefix_len_v6: u8,
    /// Guard timer of the close wait states (SMC-CLS-9).
    pub close_timeout: Duration,
    /// How long a link group without connections stays for reuse (A4.9; the client adds
    /// 2 s so that the server's DELETE LINK decides). Taken from the config of the
    /// connection that creates the group.
    pub linger: Duration,
    /// TEST LINK after this long without anything received on the link (SMC-KA-1).
    pub keepalive: Duration,
    /// Elements per RMB (1..=16). 1 (the default, as Linux) gives every connection its own
    /// registered buffer, so the RNIC's RKey check confines each peer write to the one
    /// element it was given (A2.15); more carve one registration into several elements
    /// (fewer MRs and CONFIRM RKEY exchanges, but a rogue peer could then write into the
    /// neighbouring elements of its own link group's connections).
    pub elements_per_rmb: u32,
    /// SMC-Rv2 user EID (`A-Z 0-9 . -`, at most 32 characters, blank padded on the wire):
    /// when set, SMC-Rv2 is offered (client, next to v1) and accepted (server) with this
    /// UEID, as Linux needs for RoCEv2 (`smc_test ueid add`, smc-tools `smc_ueid`). The
    /// device's GID must be IPv4 (`::ffff:a.b.c.d`). None (default): v1 only.
    pub ueid: Option<String>,
    /// A second RoCE device for a second link of each v1 link group (RFC 7609 §3.5.2,
    /// A4.7): the server adds a link on it with ADD LINK once the group is up (and again
    /// [`SmcConfig::add_link_retry`] after a link failed), the client answers ADD LINK with
    /// a QP on it. When one link fails, the connections move to the other without loss
    /// (failover). None (default): one link per group, ADD LINK rejected "no alternate
    /// path". A v2 group (SMC-Rv2, Linux) keeps one link either way.
    pub alt_device: Option<Device>,
    /// Server: with a second device and one link, ADD LINK is tried this often (SMC-LG-13).
    pub add_link_retry: Duration,
    /// Most octets one RDMA Write and its CDC carry (0 = the whole free window of the
    /// peer's element). Smaller pieces let the reader copy the first while the rest is on
    /// the wire, at the price of more CDCs per MiB.
    pub write_chunk: u32,
    /// How long the group's progress thread stays off the link's CQ after an application
    /// thread last polled it itself (a blocking reader or writer that waited, a nonblocking
    /// one that found nothing): while callers keep coming back, the completions they wait
    /// for reach them without a hand-off through the progress thread.
    pub progress_linger: Duration,
}

impl Default for SmcConfig {
    fn default() -> Self {
        Self {
            rmbe_len: 64 * 1024,
            send_buf: 64 * 1024,
            propose: true,
            indication_wait: Duration::from_millis(500),
            clc_timeout: crate::clc_machine::CLC_WAIT,
            prefix_len: 24,
            prefix_len_v6: 64,
            close_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(10),
            keepalive: crate::lgr::KEEPALIVE,
            elements_per_rmb: 1,
            ueid: None,
            alt_device: None,
            add_link_retry: Duration::from_secs(5),
            write_chunk: 0,
            progress_linger: Duration::from_millis(5),
        }
    }
}

impl SmcConfig {
    /// Refuses settings that cannot go on the wire as they are, before any connection uses
    /// them: an RMB element size that is not one of A1.6's compressed sizes would otherwise
    /// be advertised as another size in the CLC Accept/Confirm, and the peer would write
    /// by a ring of a size we do not have. `InvalidInput` with the setting named.
    pub fn check(&self) -> io::Result<()> {
        if rmbe_size_code(self.rmbe_len).is_none() {
            return Err(io_err(
                io::ErrorKind::InvalidInput,
                format!(
                    "SMC-R RMB element size {} octets: must be a power of two from 16 KiB to 512 KiB (A1.6)",
                    self.rmbe_len
                ),
            ));
        }
        if self.send_buf == 0 {
            return Err(io_err(io::ErrorKind::InvalidInput, "SMC-R send buffer size 0"));
        }
        Ok(())
    }
}

/// How a connection carries its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// SMC-R: RDMA Writes into the peer's RMB element.
    SmcR,
    /// Plain TCP, and why.
    Fallback(FallbackReason),
}

/// Send-queue depth of a link's QP; control (CDC/LLC) send slots are as many.
const SQ_DEPTH: u32 = 512;
/// Send WQEs kept free for LLC messages (data stops short of them).
const SQ_LLC_RESERVE: u32 = 16;
/// Receive WQEs kept posted (E-12): 44-octet CDCs and LLCs, and Linux's longer v2 LLC
/// messages (a v2 ADD LINK with its RToken extension is 88 octets for one RMB), in
/// 128-octet slots. A longer message fails the receive (local length error) and so the link.
const RQ_DEPTH: u32 = 512;
const SLOT: usize = 128;
const WR_WRITE: u64 = 1 << 62;
const WR_CDC: u64 = 1 << 61;
const WR_SETUP: u64 = 1 << 60;
const WR_LLC: u64 = 1 << 59;
const WR_CID_MASK: u64 = 0x07FF_FFFF;
/// First-contact LLC wait (Linux: 5 s, SMC-TMR-S1).
const CONFIRM_LINK_WAIT: Duration = Duration::from_secs(5);
/// v2 server: pause between the client's Confirm and our first CONFIRM LINK.
const CONFIRM_LINK_V2_DELAY: Duration = Duration::from_millis(20);
/// v2 server: CONFIRM LINK repeated this often while unanswered.
const CONFIRM_LINK_V2_REPEAT: Duration = Duration::from_millis(1000);
/// How long a group's QP stays after the group ended (the peer's last LLC messages).
const PEER_DRAIN: Duration = Duration::from_millis(500);
/// The progress thread's longest sleep (close timers, RST checks).
const TICK: Duration = Duration::from_millis(100);
/// How often the TCP connection of each SMC-R connection is checked for an RST.
const RST_CHECK: Duration = Duration::from_millis(250);
/// Most elements in one RMB ([`SmcConfig::elements_per_rmb`]).
const MAX_ELEMS: u32 = 16;

static NEXT_LINK_UID: AtomicU32 = AtomicU32::new(1);
static NEXT_GROUP_ID: AtomicU32 = AtomicU32::new(1);
static LIVE_LINKS: AtomicU32 = AtomicU32::new(0);

/// Links (each one QP, one PD, its control slots and its group's RMBs) alive in this
/// process: what a leak check counts. [`crate::stats::snapshot`] has the details.
pub fn live_links() -> u32 {
    LIVE_LINKS.load(Ordering::Acquire)
}

/// What the engine's progress threads and data path did in this process (all groups):
/// the counts the streaming guard tests check (per MiB, per write), never timings.
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Completions processed.
    pub completions: AtomicU64,
    /// Completions that can matter to a waiting reader or writer (receives, RDMA Write
    /// completions, errors); successful CDC/LLC send completions do not.
    pub waking_completions: AtomicU64,
    /// Passes of the progress threads (one per CQ wake-up or timer).
    pub passes: AtomicU64,
    /// Passes that ended on the timer without a completion.
    pub idle_passes: AtomicU64,
    /// Passes that woke the group's waiting readers and writers (`notify_all`).
    pub wakeups: AtomicU64,
    /// RDMA Writes posted.
    pub rdma_writes: AtomicU64,
    /// Octets carried by those RDMA Writes.
    pub rdma_write_octets: AtomicU64,
    /// CDC messages posted.
    pub cdcs_sent: AtomicU64,
    /// CDC messages posted that carried new data (producer cursor moved).
    pub data_cdcs_sent: AtomicU64,
    /// Waits of blocking readers and writers in the link's CQ (as its leader).
    pub caller_waits: AtomicU64,
    /// Nonblocking reads and writes that found a completion when they polled the CQ.
    pub caller_polls: AtomicU64,
    /// Completions applied by the application thread that polled the CQ.
    pub caller_completions: AtomicU64,
    /// Completions applied by a progress thread.
    pub progress_completions: AtomicU64,
    /// Hand-offs: a thread applied completions that mattered while another reader or writer
    /// waited (asleep on the condition variable, or in the CQ as leader), and woke it.
    pub handoffs: AtomicU64,
}

/// The process's [`EngineCounters`].
pub fn engine_counters() -> &'static EngineCounters {
    static C: OnceLock<EngineCounters> = OnceLock::new();
    C.get_or_init(EngineCounters::default)
}

static NEXT_TOKEN: AtomicU32 = AtomicU32::new(1);

/// An alert token that names a connection and is not a bare index (SMC-GEN-S2): a
/// process-wide counter mixed with a per-process random-ish value.
fn new_token() -> u32 {
    let n = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let salt = (std::process::id()).wrapping_mul(0x9E37_79B9);
    (n.wrapping_mul(0x85EB_CA6B) ^ salt) | 1
}

/// An initial PSN that differs between links and runs (not a security measure: RC PSNs are
/// not secret).
fn random_psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ new_token()) & 0x00FF_FFFF
}

fn rmbe_size_code(len: u32) -> Option<u8> {
    (0..=5u8).find(|&c| 16_384u32 << c == len)
}

fn io_err(kind: io::ErrorKind, msg: impl std::fmt::Display) -> io::Error {
    io::Error::new(kind, msg.to_string())
}

fn verbs_err(e: verbs::Error) -> io::Error {
    io_err(io::ErrorKind::Other, format!("verbs: {e}"))
}

fn mtu_from_enum(v: u8) -> Mtu {
    match v {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

/// The engine's [`stats::Source`]: every registered group and the fallback connections.
struct EngineStats;

impl stats::Source for EngineStats {
    fn fill(&self, snap: &mut Snapshot) {
        let groups: Vec<Arc<Group>> = registry().lock().unwrap_or_else(|p| p.into_inner()).clone();
        for g in groups {
            g.fill(snap);
        }
        let fb: Vec<Arc<FallbackInfo>> = {
            let mut f = fallbacks().lock().unwrap_or_else(|p| p.into_inner());
            f.retain(|w| w.strong_count() > 0);
            f.iter().filter_map(Weak::upgrade).collect()
        };
        for f in fb {
            snap.connections.push(ConnStat {
                local: f.local.clone(),
                peer: f.peer.clone(),
                mode: ConnMode::Fallback,
                fallback_reason: Some(f.reason.to_string()),
                fallback_code: match f.reason {
                    FallbackReason::PeerNoSmc => Some(Diagnosis::PEER_NO_SMC.0),
                    FallbackReason::PeerDeclined { diagnosis, .. } | FallbackReason::Declined(diagnosis) => {
                        Some(diagnosis.0)
                    }
                    FallbackReason::Disabled => None,
                },
                state: "tcp".into(),
                bytes_sent: f.sent.load(Ordering::Relaxed),
                bytes_received: f.received.load(Ordering::Relaxed),
                ..ConnStat::default()
            });
        }
    }
}

/// Registers the engine's stats source and publishes the process's stats (once).
fn stats_init() {
    static SRC: OnceLock<(Arc<EngineStats>, stats::Registration)> = OnceLock::new();
    SRC.get_or_init(|| {
        let s = Arc::new(EngineStats);
        let r = stats::register(&s);
        (s, r)
    });
    stats::publish();
}

/// A fallback connection, for `smc stat`.
struct FallbackInfo {
    local: String,
    peer: String,
    reason: FallbackReason,
    sent: AtomicU64,
    received: AtomicU64,
}

impl Drop for FallbackInfo {
    fn drop(&mut self) {
        stats::dec(&stats::counters().fallback_conns);
    }
}

fn fallbacks() -> &'static Mutex<Vec<Weak<FallbackInfo>>> {
    static F: OnceLock<Mutex<Vec<Weak<FallbackInfo>>>> = OnceLock::new();
    F.get_or_init(|| Mutex::new(Vec::new()))
}
