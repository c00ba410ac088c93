//! The Responder (RPC server) on verbs: a bounded pool of workers, each sleeping in one
//! completion queue that its connections' QPs share; each connection's Calls answered in
//! arrival order. The resource model is in the docs of [`crate::transport`].

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use verbs::{
    Access, CmEvent, CompletionQueue, ConnectRequest, Device, MemoryRegion, ProtectionDomain, QpOptions, QueuePair,
    RecvWr, RemoteAddr, SendWr, WcStatus, WorkCompletion, WrOpcode,
};

use super::backchannel::{self, BC_CREDITS, Backchannel};
use super::{RdmaConfig, wrid};
use crate::pool::{IoPool, PoolConfig};
use crate::private_data::{PrivateData, Side, negotiate};
use crate::server::{Dispatch, Registry, ReplyRoom, dispatch_within};
use crate::validate::{CallPayload, FailedXids, ResponderDecision, ResponderPolicy, check_payload_xid, validate_call};
use crate::wire::chunks::ReadChunk;
use crate::wire::{ChunkLists, ErrorBody, FixedHeader, Limits};
use crate::xdr::{ChunkSource, Decoder, InsertedChunk};

mod reply;
use reply::{Replier, Sent};

/// Counters of a running server (all connections).
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Calls answered with an RPC reply.
    pub replies: AtomicU64,
    /// RDMA_ERROR messages sent.
    pub rdma_errors: AtomicU64,
    /// Messages dropped silently.
    pub dropped: AtomicU64,
    /// Connections closed because of a protocol or RDMA failure.
    pub fatal: AtomicU64,
    /// Replies sent with Send With Invalidate.
    pub remote_invalidations: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Calls received Short (RDMA_MSG, no Read chunks).
    pub calls_short: AtomicU64,
    /// Calls received Chunked (RDMA_MSG with Read chunks).
    pub calls_chunked: AtomicU64,
    /// Calls received Long (RDMA_NOMSG, Position-Zero Read chunk).
    pub calls_long: AtomicU64,
    /// Replies sent inline with no data in Write chunks.
    pub replies_inline: AtomicU64,
    /// Replies whose results went (partly) into Write chunks.
    pub replies_write_chunks: AtomicU64,
    /// Long Replies (RDMA_NOMSG through the Reply chunk).
    pub replies_long: AtomicU64,
    /// Connect requests refused at [`RdmaConfig::max_connections`].
    pub refused: AtomicU64,
    /// Connections closed by the idle timeout.
    pub idle_closed: AtomicU64,
    /// Connections closed because the peer did not answer an RDMA Read of ours or
    /// acknowledge a Reply's Send within [`RdmaConfig::timeout`] (also counted in `fatal`).
    pub timeouts: AtomicU64,
    /// Calls whose Read chunks came back short (answered ERR_CHUNK).
    pub short_reads: AtomicU64,
    /// Calls refused because the staging budget had no room (answered SYSTEM_ERR).
    pub no_stage: AtomicU64,
    /// Octets of call or reply data copied in user space between the heap and a
    /// registered region (the connection's stage): a Long Reply's stream, Read chunks
    /// pulled for a procedure. Write-chunk results are sent from the reply itself (issue 18).
    pub copied_octets: AtomicU64,
    /// Times an I/O pool thread woke a worker: a Reply it could not post (the pool posts
    /// Replies itself, so a healthy connection's calls make none; issue 18).
    pub pool_wakeups: AtomicU64,
}

/// A plain copy of [`ServerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StatsSnapshot {
    pub replies: u64,
    pub rdma_errors: u64,
    pub dropped: u64,
    pub fatal: u64,
    pub remote_invalidations: u64,
    pub connections: u64,
    pub calls_short: u64,
    pub calls_chunked: u64,
    pub calls_long: u64,
    pub replies_inline: u64,
    pub replies_write_chunks: u64,
    pub replies_long: u64,
    pub refused: u64,
    pub idle_closed: u64,
    pub timeouts: u64,
    pub short_reads: u64,
    pub no_stage: u64,
    pub copied_octets: u64,
    pub pool_wakeups: u64,
}

/// A running RPC-over-RDMA server.
pub struct RdmaServer {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<std::sync::Weak<backchannel::Shared>>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<ServerStats>,
    workers: Vec<Arc<WorkerHandle>>,
    accept: Option<JoinHandle<()>>,
    threads: Vec<JoinHandle<()>>,
}

/// A worker's completion queue (shared by its connections' QPs) and its inbox of new
/// connections.
struct WorkerHandle {
    cq: CompletionQueue,
    inbox: Mutex<Vec<Conn>>,
    /// Calls the I/O pool has answered, for their connections' replies.
    done: Mutex<Vec<Finished>>,
    /// Connections this worker serves (for picking the least loaded one).
    load: AtomicUsize,
}

impl WorkerHandle {
    /// Wake the worker out of its completion wait (new connection, or stop). The
    /// wake-up is a completion of our own making (`wrid::WAKE`), delivered with the
    /// provider-side [`CqProviderExt::push`](verbs::provider::CqProviderExt::push): the one provider call this crate makes.
    fn wake(&self) {
        use verbs::provider::CqProviderExt;
        let _ = self.cq.push(WorkCompletion::new(
            wrid::WAKE,
            WcStatus::Success,
            verbs::WcOpcode::Send,
            0,
        ));
    }
}

/// How long the accept thread waits for a connect request before it looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(250);

/// A stage larger than this is released after each message (its budget goes back).
const KEEP_STAGE: usize = 4 << 20;
/// Stages a connection keeps for reuse when they come back from the I/O pool with their
/// Calls (a client with this many WRITEs in flight pulls each into its own).
const SPARE_STAGES: usize = 4;
/// Replies of one connection whose Sends may be in flight at once (each has its own send
/// buffer); more wait in the connection's queue.
const SEND_SLOTS: usize = 8;
/// Work requests (RDMA Writes and Sends) of one connection's Replies on its send queue at
/// once (the QP's send queue holds 256); a Reply that would pass it waits.
const MAX_SEND_WRS: usize = 192;

/// Staging memory of all connections of one server ([`RdmaConfig::max_staging`]).
struct Budget {
    used: AtomicU64,
    max: u64,
}

impl Budget {
    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.max)
            })
            .is_ok()
    }

    fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

impl RdmaServer {
    /// Listen on `addr` of `dev` and serve `registry` until dropped.
    ///
    /// [`RdmaConfig::workers`] threads serve every connection (each owns one completion
    /// queue that its connections' QPs share, and sleeps in it while nothing arrives); one
    /// more thread accepts connections, up to [`RdmaConfig::max_connections`].
    pub fn spawn(
        dev: &Device,
        addr: SocketAddr,
        registry: Arc<Registry>,
        cfg: RdmaConfig,
    ) -> Result<RdmaServer, verbs::Error> {
        let listener = dev.listen(addr)?;
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ServerStats::default());
        let recovery = Arc::new(Recovery::default());
        let budget = Arc::new(Budget {
            used: AtomicU64::new(0),
            max: cfg.max_staging,
        });
        let live = Arc::new(AtomicUsize::new(0));
        let conns: Arc<Mutex<Vec<std::sync::Weak<backchannel::Shared>>>> = Arc::default();
        let nworkers = cfg.workers.max(1);
        let credits = cfg.credits.max(1);
        let per_worker = cfg.max_connections.max(1).div_ceil(nworkers);
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..nworkers {
            // room for every completion its connections can have outstanding, and the wake-ups
            let cq = dev.create_cq(per_worker * cq_per_conn(credits) + 64)?;
            let w = Arc::new(WorkerHandle {
                cq,
                inbox: Mutex::new(Vec::new()),
                done: Mutex::new(Vec::new()),
                load: AtomicUsize::new(0),
            });
            let (w2, stop2, live2, idle) = (w.clone(), stop.clone(), live.clone(), cfg.idle_timeout);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("rpcrdma-worker-{i}"))
                    .spawn(move || worker(&w2, &stop2, &live2, idle))
                    .map_err(verbs::Error::Io)?,
            );
            workers.push(w);
        }
        let pool = match &cfg.pool {
            Some(p) => p.clone(),
            None => IoPool::new("rpcrdma-io", PoolConfig::with_threads(cfg.io_workers)).map_err(verbs::Error::Io)?,
        };
        let ctx = AcceptCtx {
            registry,
            pool,
            cfg,
            recovery,
            stats: stats.clone(),
            budget,
            conns: conns.clone(),
        };
        let (stop2, dev, workers2) = (stop.clone(), dev.clone(), workers.clone());
        let accept = std::thread::Builder::new()
            .name("rpcrdma-accept".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    let Ok(req) = listener.get_request(Some(ACCEPT_POLL)) else {
                        continue;
                    };
                    let peer = req.peer_addr();
                    if live.load(Ordering::Acquire) >= ctx.cfg.max_connections {
                        // the connection cap: refuse at the CM level (no private data: RFC 8797
                        // defines none for a reject), and say so
                        tracing::warn!(%peer, cap = ctx.cfg.max_connections, "rpcrdma server: connection refused: at the connection cap");
                        ctx.stats.refused.fetch_add(1, Ordering::Relaxed);
                        let _ = req.reject(&[]);
                        continue;
                    }
                    let w = workers2
                        .iter()
                        .min_by_key(|w| w.load.load(Ordering::Relaxed))
                        .expect("at least one worker");
                    let accepted = dev
                        .alloc_pd()
                        .map_err(Fatal::from)
                        .and_then(|pd| accept_conn(req, &pd, w, &ctx));
                    match accepted {
                        Ok(c) => {
                            live.fetch_add(1, Ordering::AcqRel);
                            w.load.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, qp = c.qpn, "rpcrdma server: connection accepted");
                            w.inbox.lock().unwrap().push(c);
                            w.wake();
                        }
                        Err(e) => tracing::info!(%peer, "rpcrdma server: accept failed: {e}"),
                    }
                }
            })
            .map_err(verbs::Error::Io)?;
        Ok(RdmaServer {
            addr,
            conns,
            stop,
            stats,
            workers,
            accept: Some(accept),
            threads,
        })
    }
    /// The listening address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Handles for RFC 8167 reverse-direction calls, one per open connection (oldest first).
    pub fn backchannels(&self) -> Vec<Backchannel> {
        let mut g = self.conns.lock().unwrap();
        g.retain(|w| w.upgrade().is_some_and(|s| !s.closed.load(Ordering::Acquire)));
        g.iter().filter_map(|w| w.upgrade()).map(Backchannel).collect()
    }

    /// Counters.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        let s = &self.stats;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            replies: g(&s.replies),
            rdma_errors: g(&s.rdma_errors),
            dropped: g(&s.dropped),
            fatal: g(&s.fatal),
            remote_invalidations: g(&s.remote_invalidations),
            connections: g(&s.connections),
            calls_short: g(&s.calls_short),
            calls_chunked: g(&s.calls_chunked),
            calls_long: g(&s.calls_long),
            replies_inline: g(&s.replies_inline),
            replies_write_chunks: g(&s.replies_write_chunks),
            replies_long: g(&s.replies_long),
            refused: g(&s.refused),
            idle_closed: g(&s.idle_closed),
            timeouts: g(&s.timeouts),
            short_reads: g(&s.short_reads),
            no_stage: g(&s.no_stage),
            copied_octets: g(&s.copied_octets),
            pool_wakeups: g(&s.pool_wakeups),
        }
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for w in &self.workers {
            w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Why a server connection ends (logged, and counted in `fatal`).
#[derive(Debug, thiserror::Error)]
enum Fatal {
    /// A work request of ours failed (RPCR-MEM-03: a reply we cannot transmit ends the connection).
    #[error("{opcode:?} failed: {status} (vendor {vendor_err:#x})")]
    WorkRequest {
        opcode: verbs::WcOpcode,
        status: WcStatus,
        vendor_err: u32,
    },
    /// The peer reported a fatal error (iWARP: its Terminate).
    #[error("peer reported a fatal error: {0}")]
    ErrorReceived(verbs::ErrorDetail),
    /// We ended the connection because the peer broke the protocol.
    #[error("we ended the connection (peer violated the protocol): {0}")]
    ErrorSent(verbs::ErrorDetail),
    /// The transport failed (a TCP reset).
    #[error("transport error (peer reset?): {0}")]
    Transport(String),
    /// Another connection event ended it.
    #[error("connection event {0:?}")]
    Event(CmEvent),
    /// A receive completion named a buffer we never posted.
    #[error("receive completion for slot {0}, outside the receive buffers")]
    ReceiveSlot(usize),
    /// More Calls than granted (RPCR-CRD-01 violated by the peer).
    #[error("credit overrun by the requester")]
    CreditOverrun,
    /// An RDMA Read of ours, or a Reply's Send, did not complete within the timeout.
    #[error("RDMA operation timed out (the peer does not answer our RDMA Read or acknowledge our Send)")]
    Timeout,
    /// A reply (or error reply) larger than the inline threshold and the send buffer.
    #[error("reply of {0} bytes exceeds the inline threshold")]
    ReplyTooLarge(usize),
    /// The staging budget had no room for a reply's chunk data.
    #[error("staging budget exhausted for a reply")]
    StagingExhausted,
    /// A validated Call whose fixed header does not parse (an internal error).
    #[error("validated message shorter than its fixed header")]
    ShortHeader,
    /// The stage holds less than the pulled chunks (an internal accounting error).
    #[error("staging buffer shorter than the data pulled")]
    Stage,
    #[error(transparent)]
    Verbs(#[from] verbs::Error),
    #[error(transparent)]
    Credits(#[from] crate::credits::CreditError),
    #[error(transparent)]
    Xdr(#[from] crate::xdr::XdrError),
    #[error(transparent)]
    Header(#[from] crate::wire::HeaderError),
    #[error(transparent)]
    PrivateData(#[from] crate::private_data::PrivateDataError),
}

struct Conn {
    qp: Arc<QueuePair>,
    qpn: u32,
    peer: SocketAddr,
    bc: Arc<backchannel::Shared>,
    pd: ProtectionDomain,
    /// The send side: Replies, send buffers, credits (shared with the I/O pool's threads).
    rep: Arc<Replier>,
    recv_mr: MemoryRegion,
    recv_size: usize,
    overrun: bool,
    policy: ResponderPolicy,
    registry: Arc<Registry>,
    /// Where the procedures run.
    pool: Arc<IoPool>,
    /// The worker that owns this connection (the pool's jobs report to it).
    home: std::sync::Weak<WorkerHandle>,
    /// Calls of this connection in the pool.
    in_pool: usize,
    /// This connection's client key in the pool (unique in the process: servers may
    /// share a pool).
    pool_key: u64,
    recovery: Arc<Recovery>,
    backlog: VecDeque<WorkCompletion>,
    /// This connection's serial in [`Recovery::unsettled`].
    serial: u64,
    stage: Option<MemoryRegion>,
    /// Stages back from answered Calls, for the next ones (their budget still held).
    spare: Vec<MemoryRegion>,
    budget: Arc<Budget>,
    max_call: u64,
    max_reply: u64,
    /// The Call whose Read chunks are being pulled: the connection takes up no other
    /// Call until they are in (its Calls in arrival order), its other connections go on.
    pulling: Option<Pulling>,
    /// A Call whose XID another live connection of this server touched the chunks of
    /// (RPCR-MEM-05): it waits, until the time given, for that connection to end, and the
    /// Calls after it wait with it; the worker goes on with its other connections.
    settling: Option<(Vec<u8>, Instant)>,
    timeout: Duration,
    /// Last time a message arrived (for the idle timeout).
    last_active: Instant,
    /// We closed it for being idle.
    idle_closed: bool,
    /// We closed it because the server stops.
    stopping: bool,
    /// The status of the last RDMA Read or Send that failed.
    failed_status: Option<WcStatus>,
    /// Sending a Reply from the pool failed: the connection ends at its next step.
    failed: Option<Fatal>,
    stats: Arc<ServerStats>,
}

/// Whether an RDMA Read or Write of a Call's chunks that failed with `status`, on a connection
/// ended by `event` (if one is known), means the Requester refused the chunk's memory: then its
/// retransmission gets ERR_CHUNK (RFC 8166 §4.5.3, RPCR-MEM-05). A peer's Terminate (iWARP)
/// or a remote access/operation error names the chunk. A flush because the connection broke
/// under the operation (the peer or a middlebox reset it, the peer closed it, the transport
/// gave up) says nothing about the chunk: Linux's client then reconnects and retransmits
/// the Call, which must run again (answering ERR_CHUNK made the kernel client fail the
/// application's write with EIO after a TCP reset, issue 17).
fn chunk_refused(status: Option<WcStatus>, event: Option<&CmEvent>) -> bool {
    matches!(
        status,
        Some(WcStatus::RemAccessErr | WcStatus::RemOpErr | WcStatus::RemInvReqErr)
    ) || matches!(event, Some(CmEvent::ErrorReceived(_)))
}

/// Completions one connection can have outstanding: its receives, and the Reads, Writes
/// and Sends of one Call (the Responder answers Calls one at a time).
fn cq_per_conn(credits: u32) -> usize {
    8 * credits as usize + 64 + BC_CREDITS as usize
}

/// What the accept thread hands every new connection.
struct AcceptCtx {
    registry: Arc<Registry>,
    pool: Arc<IoPool>,
    cfg: RdmaConfig,
    recovery: Arc<Recovery>,
    stats: Arc<ServerStats>,
    budget: Arc<Budget>,
    conns: Arc<Mutex<Vec<std::sync::Weak<backchannel::Shared>>>>,
}

/// Octets of the staging budget held by a Call in the I/O pool; given back when dropped
/// (its Reply sent, or its connection gone).
struct Charge {
    budget: Arc<Budget>,
    n: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give(self.n);
    }
}

/// What the procedure of a Call came to, on an I/O pool thread.
enum Outcome {
    /// The RPC reply and its DDP-eligible items.
    Reply {
        stream: Vec<u8>,
        items: Vec<crate::xdr::DdpItem>,
    },
    /// Its declared reply bound does not fit what the Call can carry (not run).
    NoRoom { bound: u64, carry: u64 },
    /// A chunk where a non-eligible item sits.
    ChunkError,
    /// The Payload stream is not a decodable Call.
    Garbage,
}

/// A Call the I/O pool has answered (its Reply posted by the pool thread), for the worker
/// of its connection.
struct Finished {
    qpn: u32,
    /// Tells a connection from a later one with the same QP number.
    serial: u64,
    /// The Call's pulled chunks, back for their stage to be used again (`None`: this reports
    /// only the `error` of a Call returned before).
    pulled: Option<CallData>,
    /// Sending the Reply failed: the connection ends.
    error: Option<Fatal>,
}

/// A Call's Read chunks, concatenated, as the procedure reads them.
enum CallData {
    /// In ordinary memory (none, or copied out of the stage).
    Heap(Vec<u8>),
    /// Where the RDMA Reads placed them: the connection's stage, handed to the Call (with
    /// the staging budget it holds) and back to the connection when the Call is answered
    /// (issue 18: no copy of a WRITE's data out of the stage).
    Stage {
        mr: MemoryRegion,
        len: usize,
        charge: Charge,
    },
}

impl CallData {
    /// Octets held in ordinary memory.
    fn heap_len(&self) -> usize {
        match self {
            CallData::Heap(v) => v.len(),
            CallData::Stage { .. } => 0,
        }
    }

    /// Runs `f` over the bytes (`None` if a stage does not hold them, which cannot happen).
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        match self {
            CallData::Heap(v) => Some(f(v)),
            // every RDMA Read into the stage completed before it was handed over (see `pull`)
            CallData::Stage { mr, len, .. } => super::in_place::with_quiet(mr, 0, *len, f),
        }
    }
}

/// Where a Reply's RDMA Writes take their bytes from ([`Conn::send`]).
enum WriteSource<'a> {
    /// No Writes.
    Nothing,
    /// These slices, concatenated, copied into this region (charged to the budget) first.
    Staged(&'a [&'a [u8]], MemoryRegion, Charge),
    /// A region registered over the reply as the procedure encoded it, with the staging
    /// budget it holds while the Writes are in flight.
    Registered(MemoryRegion, Option<Charge>),
}

/// The memory a posted Reply's RDMA Writes read, held until its Send completes.
enum Held {
    /// No Writes.
    Nothing,
    /// The reply vector, registered (see [`WriteSource::Registered`]).
    Registered {
        mr: MemoryRegion,
        /// Given back when the Send completes (or the connection ends).
        _charge: Option<Charge>,
    },
    /// A stage the results were copied into, with its budget.
    Stage(MemoryRegion, Charge),
}

impl Held {
    fn region(&self) -> Option<&MemoryRegion> {
        match self {
            Held::Nothing => None,
            Held::Registered { mr, .. } | Held::Stage(mr, _) => Some(mr),
        }
    }
}

/// A Reply (or RDMA_ERROR) built and waiting for a send buffer.
struct Outgoing {
    msg: Vec<u8>,
    held: Held,
    inv: Option<u32>,
    writes: Vec<(u32, u64, std::ops::Range<usize>)>,
    xid: u32,
}

/// A Reply whose Writes and Send are posted; its Send's completion ends it.
struct InFlight {
    id: u64,
    slot: usize,
    wrs: usize,
    held: Held,
    xid: u32,
    writes: bool,
    deadline: Instant,
}

/// What a Call needs, besides its pulled Read chunks, to go to the I/O pool.
struct CallPlan {
    fixed: FixedHeader,
    lists: ChunkLists,
    /// The inline Payload stream (`None`: it is the Position-Zero Read chunk).
    inline: Option<Vec<u8>>,
    /// Octets of each Read chunk (Position-Zero first), as pulled one after another.
    lens: Vec<usize>,
    /// Positions of the Read chunks of reduced items.
    positions: Vec<u32>,
}

/// RDMA Reads of one Call's chunks into a stage, posted.
struct PullIo {
    /// The Reads not completed yet: work request id, octets asked for.
    reads: Vec<(u64, u32)>,
    /// A Read Response placed fewer octets than its Read asked for.
    short: bool,
    mr: MemoryRegion,
    charge: Charge,
    len: usize,
    deadline: Instant,
}

/// A Call waiting for its Read chunks ([`Conn::pulling`]).
struct Pulling {
    plan: CallPlan,
    io: PullIo,
}

/// What [`Conn::pull`] did.
enum Pulled {
    /// No chunks: nothing to read.
    Nothing,
    /// The Reads are posted; their completions continue the Call ([`Conn::on_read`]).
    Posted(PullIo),
    /// The chunks add up to more than [`RdmaConfig::max_call`].
    TooLarge(u64),
    /// The server's staging budget has no room now.
    NoStage,
}

/// An accepted RPC reply with SYSTEM_ERR.
fn system_err(xid: u32) -> Result<Vec<u8>, Fatal> {
    crate::rpc::encode_reply_header(&crate::rpc::ReplyHeader::accepted(
        xid,
        crate::rpc::AcceptStat::SystemErr,
    ))
    .map_err(Fatal::from)
}

/// How many XIDs with RDMA Reads or Writes a connection remembers for RPCR-MEM-05.
const RECENT_RDMA: usize = 64;

/// What the connections of one server share for RFC 8166 §4.5.3 (RPCR-MEM-05).
struct Recovery {
    /// XIDs whose RDMA operations failed: their retransmissions get ERR_CHUNK.
    failed: Mutex<FailedXids>,
    /// XIDs whose chunks were read or whose Replies wrote into Requester memory, by the serial
    /// of the connection that did it, while that connection lives. A retransmission of one of them on another
    /// connection waits (up to [`SETTLE`], in [`Conn::settling`]: its worker goes on with the
    /// others) until the first connection has ended and its fate is known: ended by a
    /// Terminate, the XID is in `failed`.
    unsettled: Mutex<std::collections::HashMap<u32, u64>>,
    serials: AtomicU64,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            failed: Mutex::new(FailedXids::new(1024)),
            unsettled: Mutex::default(),
            serials: AtomicU64::new(1),
        }
    }
}

/// The longest a retransmission waits for the connection that first answered it to end.
const SETTLE: Duration = Duration::from_secs(2);
/// How often a worker with a retransmission waiting looks whether its XID has settled (the
/// connection that holds it may be another worker's).
const SETTLE_POLL: Duration = Duration::from_millis(10);

impl Recovery {
    fn lock(&self) -> std::sync::MutexGuard<'_, FailedXids> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unsettle(&self, xid: u32, serial: u64) {
        self.unsettled.lock().unwrap().insert(xid, serial);
    }

    fn settle<'a>(&self, xids: impl IntoIterator<Item = &'a u32>, serial: u64) {
        let mut u = self.unsettled.lock().unwrap();
        for x in xids {
            if u.get(x) == Some(&serial) {
                u.remove(x);
            }
        }
    }

    /// Whether another live connection than `serial` holds `xid` as unsettled (a Call of
    /// that XID on `serial` then waits for it, see [`Conn::settling`]).
    fn held(&self, xid: u32, serial: u64) -> bool {
        self.unsettled.lock().unwrap().get(&xid).is_some_and(|&s| s != serial)
    }
}

/// Accept `req` with a QP on `cq` (the worker's), receives posted first.
fn accept_conn(
    req: ConnectRequest,
    pd: &ProtectionDomain,
    home: &Arc<WorkerHandle>,
    ctx: &AcceptCtx,
) -> Result<Conn, Fatal> {
    let cq = &home.cq;
    let cfg = &ctx.cfg;
    let e = Fatal::from;
    let credits = cfg.credits.max(1);
    let peer_addr = req.peer_addr();
    let peer = PrivateData::find(req.private_data());
    let local = PrivateData::new(cfg.inline_send, cfg.inline_recv, cfg.remote_invalidation)?;
    let mine = if cfg.private_data {
        local
    } else {
        PrivateData::default()
    };
    let neg = negotiate(Side::Server, &mine, peer.as_ref());
    // RPCR-CRD-04: the receives for the largest grant are posted before the
    // connection goes live (rdma_cm order: create_qp, post_recv, accept)
    let recv_size = mine.recv_size as usize;
    // RFC 8167 §4.3.2: BC_CREDITS more for reverse-direction Replies
    let slots = credits + BC_CREDITS;
    let recv_mr = pd.reg_mr(recv_size * slots as usize, Access::LOCAL_WRITE).map_err(e)?;
    let recvs: Vec<RecvWr> = (0..slots as usize)
        .map(|i| RecvWr {
            wr_id: wrid::RECV | i as u64,
            sg_list: vec![recv_mr.sge(i * recv_size, recv_size as u32)],
        })
        .collect();
    let mut opts = QpOptions::new(cq)
        .rd_atomic(cfg.rd_atomic, cfg.rd_atomic)
        .post_recv(recvs);
    opts.attr.max_recv_wr = opts.attr.max_recv_wr.max(slots);
    if cfg.private_data {
        opts = opts.private_data(&local.encode());
    }
    let qp = Arc::new(req.accept(pd, opts).map_err(e)?);
    let bc = backchannel::Shared::new(qp.clone(), pd.clone(), neg.thresholds);
    ctx.conns.lock().unwrap().push(Arc::downgrade(&bc));
    ctx.stats.connections.fetch_add(1, Ordering::Relaxed);
    let slot_len = neg.thresholds.reply.max(1024) as usize;
    let slots = SEND_SLOTS.min(credits as usize);
    let send_mr = pd.reg_mr(slot_len * slots, Access::LOCAL_WRITE).map_err(e)?;
    let serial = ctx.recovery.serials.fetch_add(1, Ordering::Relaxed);
    let rep = Arc::new(Replier::new(
        qp.clone(),
        pd.clone(),
        neg.thresholds,
        neg.remote_invalidation,
        credits,
        send_mr,
        slot_len,
        slots,
        cfg.timeout,
        ctx.budget.clone(),
        ctx.stats.clone(),
        ctx.recovery.clone(),
        serial,
    ));
    Ok(Conn {
        qpn: qp.qp_num(),
        qp,
        peer: peer_addr,
        bc,
        pd: pd.clone(),
        rep,
        recv_mr,
        recv_size,
        overrun: false,
        policy: ResponderPolicy {
            limits: Limits::default(),
            // RPCR-SEC-05: no chunk larger than the whole Call may be
            max_chunk: cfg.max_chunk.min(cfg.max_call),
        },
        registry: ctx.registry.clone(),
        pool: ctx.pool.clone(),
        home: Arc::downgrade(home),
        in_pool: 0,
        pool_key: crate::pool::fresh_client_key(),
        recovery: ctx.recovery.clone(),
        backlog: VecDeque::new(),
        serial,
        stage: None,
        spare: Vec::new(),
        budget: ctx.budget.clone(),
        max_call: cfg.max_call,
        max_reply: cfg.max_reply,
        pulling: None,
        settling: None,
        timeout: cfg.timeout,
        last_active: Instant::now(),
        idle_closed: false,
        stopping: false,
        failed_status: None,
        failed: None,
        stats: ctx.stats.clone(),
    })
}

/// One worker: sleeps in its completion queue (no timeout unless a connection's idle
/// deadline is pending), hands each completion to the connection whose QP it names, and
/// ends connections that close, fail or stay idle too long.
fn worker(w: &WorkerHandle, stop: &AtomicBool, live: &AtomicUsize, idle: Option<Duration>) {
    let mut st = WorkerState::default();
    let mut stopping = false;
    loop {
        if stop.load(Ordering::Relaxed) && !stopping {
            stopping = true;
            for c in st.conns.values_mut() {
                c.stopping = true;
                c.qp.disconnect();
            }
        }
        st.take_inbox(w, stopping);
        if stopping && st.conns.is_empty() {
            return;
        }
        let now = Instant::now();
        let deadline = idle.and_then(|t| {
            st.conns
                .values()
                .filter(|c| !c.idle_closed)
                .map(|c| c.last_active + t)
                .min()
        });
        // and the nearest timeout of an RDMA operation in flight
        let ops = st.conns.values().filter_map(Conn::op_deadline).min();
        let deadline = match (deadline, ops) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // a completion that came before its connection reached the inbox is retried soon
        let wait = match (deadline, st.orphans.is_empty()) {
            (d, true) => d.map(|d| d.saturating_duration_since(now)),
            (d, false) => Some(
                d.map_or(ORPHAN_RETRY, |d| d.saturating_duration_since(now))
                    .min(ORPHAN_RETRY),
            ),
        };
        // a retransmission waiting for its XID to settle is looked at again soon
        let wait = if st.conns.values().any(|c| c.settling.is_some()) {
            Some(wait.map_or(SETTLE_POLL, |w| w.min(SETTLE_POLL)))
        } else {
            wait
        };
        // a Reply from the pool whose wake-up a connection's wait consumed
        let wait = if w.done.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            wait
        } else {
            Some(Duration::ZERO)
        };
        let first = w.cq.wait_spin(Duration::ZERO, wait);
        st.take_inbox(w, stopping);
        for o in std::mem::take(&mut st.orphans) {
            st.route(o);
        }
        if let Some(wc) = first {
            st.route((wc, Instant::now()));
        }
        // and whatever else is there, without sleeping
        while let Some(wc) = w.cq.poll_one() {
            st.route((wc, Instant::now()));
        }
        st.collect_done(w);
        // a peer that does not answer our RDMA Read or acknowledge our Send within the
        // timeout loses its connection; nothing of it ever held the others
        let now = Instant::now();
        for (qpn, c) in &mut st.conns {
            if c.settling.is_some() && !st.pending.contains(qpn) {
                st.pending.push_back(*qpn);
            }
            if c.failed.is_none() && c.op_deadline().is_some_and(|d| d <= now) {
                c.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                c.failed = Some(Fatal::Timeout);
                if !st.pending.contains(qpn) {
                    st.pending.push_back(*qpn);
                }
            }
        }
        while let Some(qpn) = st.pending.pop_front() {
            let Some(c) = st.conns.get_mut(&qpn) else { continue };
            let r = c.step();
            if !matches!(r, Ok(true)) {
                let mut c = st.conns.remove(&qpn).expect("present");
                c.finish(r.err());
                live.fetch_sub(1, Ordering::AcqRel);
                w.load.fetch_sub(1, Ordering::Relaxed);
                if st.closed.len() == CLOSED_REMEMBERED {
                    st.closed.pop_front();
                }
                st.closed.push_back(qpn);
            }
            st.take_inbox(w, stopping);
        }
        if let Some(t) = idle {
            let now = Instant::now();
            for c in st.conns.values_mut() {
                if !c.idle_closed && now.duration_since(c.last_active) >= t {
                    // idle timeout: close cleanly; the flushed receives end it
                    tracing::info!(qp = c.qpn, peer = %c.peer, idle_s = t.as_secs(), "rpcrdma server: closing idle connection");
                    c.idle_closed = true;
                    c.stats.idle_closed.fetch_add(1, Ordering::Relaxed);
                    c.qp.disconnect();
                }
            }
        }
    }
}

/// How long a completion whose connection is not in the worker's map yet waits for it
/// (the accept thread pushes a connection right after `accept` returns).
const ORPHAN_RETRY: Duration = Duration::from_millis(20);
/// How long such a completion is kept at most.
const ORPHAN_MAX: Duration = Duration::from_secs(10);
/// Closed QPs a worker remembers, to drop their last flushed completions at once.
const CLOSED_REMEMBERED: usize = 1024;

#[derive(Default)]
struct WorkerState {
    conns: std::collections::HashMap<u32, Conn>,
    /// Connections with completions to handle, in arrival order.
    pending: VecDeque<u32>,
    /// Completions for QPs not (yet) in `conns`, with when they came.
    orphans: Vec<(WorkCompletion, Instant)>,
    closed: VecDeque<u32>,
}

impl WorkerState {
    fn take_inbox(&mut self, w: &WorkerHandle, stopping: bool) {
        for mut c in w.inbox.lock().unwrap().drain(..) {
            if stopping {
                c.stopping = true;
                c.qp.disconnect();
            }
            self.conns.insert(c.qpn, c);
        }
    }

    /// Send the Replies the I/O pool finished; a connection whose Reply failed ends at its
    /// next step.
    fn collect_done(&mut self, w: &WorkerHandle) {
        let done = std::mem::take(&mut *w.done.lock().unwrap_or_else(|e| e.into_inner()));
        for f in done {
            let qpn = f.qpn;
            let Some(c) = self.conns.get_mut(&qpn) else { continue };
            if c.serial != f.serial {
                continue;
            }
            if c.failed.is_none()
                && let Err(e) = c.complete(f)
            {
                c.failed = Some(e);
            }
            if !self.pending.contains(&qpn) {
                self.pending.push_back(qpn);
            }
        }
    }

    fn route(&mut self, (wc, since): (WorkCompletion, Instant)) {
        if wc.wr_id == wrid::WAKE {
            return;
        }
        let qpn = wc.qp_num;
        match self.conns.get_mut(&qpn) {
            Some(c) => {
                c.admit(&wc);
                c.backlog.push_back(wc);
                if !self.pending.contains(&qpn) {
                    self.pending.push_back(qpn);
                }
            }
            None if self.closed.contains(&qpn) => {}
            None if since.elapsed() < ORPHAN_MAX => self.orphans.push((wc, since)),
            None => tracing::debug!(qp = qpn, "rpcrdma server: completion for an unknown connection"),
        }
    }
}

impl Conn {
    /// Count an arrival against the grant (before it is handled, as the Requester sent it).
    fn admit(&mut self, wc: &WorkCompletion) {
        if wc.wr_id & wrid::KIND == wrid::RECV && wc.status == WcStatus::Success {
            // reverse-direction Replies have their own receives and are not Calls (RFC 8167 §4.1)
            let slot = (wc.wr_id & !wrid::KIND) as usize;
            let head = self
                .recv_mr
                .to_vec(slot * self.recv_size, (wc.byte_len as usize).min(36))
                .unwrap_or_default();
            if !backchannel::looks_like_reverse_reply(&head) && self.rep.tx().credits.on_call().is_err() {
                self.overrun = true;
            }
        }
    }

    /// The connection is over: settle its XIDs, close it, say why.
    fn finish(&mut self, err: Option<Fatal>) {
        // the fate of this connection's RDMA Reads and Writes is known now (recorded as failed by a Terminate)
        let recent: Vec<u32> = self.rep.tx().recent_rdma.iter().copied().collect();
        self.recovery.settle(&recent, self.serial);
        self.bc.close();
        self.release_stage();
        self.release_spares();
        match &err {
            Some(e) => {
                self.stats.fatal.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(qp = self.qpn, peer = %self.peer, "rpcrdma server: connection failed: {e}");
            }
            None if self.idle_closed => {
                tracing::info!(qp = self.qpn, peer = %self.peer, "rpcrdma server: idle connection closed")
            }
            None if self.stopping => {
                tracing::debug!(qp = self.qpn, peer = %self.peer, "rpcrdma server: connection closed (server stops)")
            }
            None => tracing::info!(qp = self.qpn, peer = %self.peer, "rpcrdma server: peer closed the connection"),
        }
        self.qp.disconnect();
    }

    /// Handle what arrived. `Ok(false)` when the connection ended cleanly.
    fn step(&mut self) -> Result<bool, Fatal> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if let Some((msg, until)) = self.settling.take() {
            if Instant::now() < until && xid_of(&msg).is_some_and(|x| self.recovery.held(x, self.serial)) {
                self.settling = Some((msg, until));
            } else {
                if Instant::now() >= until {
                    tracing::debug!(xid = ?xid_of(&msg), "rpcrdma server: retransmission while its first connection lives");
                }
                let r = self.on_message(&msg);
                if self.stage.as_ref().is_some_and(|m| m.len() > KEEP_STAGE) {
                    self.release_stage();
                }
                r?;
            }
        }
        loop {
            // while a Call's chunks are being pulled (or its XID settles), the arrivals after
            // it wait (each connection's Calls in arrival order); completions of our
            // operations do not
            let next = if self.pulling.is_some() || self.settling.is_some() {
                self.backlog.iter().position(|wc| wc.wr_id & wrid::KIND != wrid::RECV)
            } else if self.backlog.is_empty() {
                None
            } else {
                Some(0)
            };
            let Some(i) = next else { break };
            let wc = self.backlog.remove(i).expect("index");
            match wc.wr_id & wrid::KIND {
                wrid::RECV => {
                    if !self.on_recv(&wc)? {
                        return Ok(false);
                    }
                }
                wrid::READ => self.on_read(&wc)?,
                wrid::SEND => self.on_sent(&wc)?,
                _ => stray(&wc)?,
            }
        }
        Ok(true)
    }

    /// A receive completed: a Call (or a reverse-direction Reply) arrived, or the receive
    /// was flushed. `Ok(false)` when the connection ended cleanly.
    fn on_recv(&mut self, wc: &WorkCompletion) -> Result<bool, Fatal> {
        if wc.status != WcStatus::Success {
            if wc.status == WcStatus::WrFlushErr {
                // flushed: closed by the peer, by us, or a Terminate put the QP in error
                while let Some(ev) = self.qp.get_event(Some(Duration::ZERO)) {
                    if !matches!(ev, CmEvent::Established | CmEvent::Disconnected) {
                        return Err(self.ended_by(ev));
                    }
                }
                return Ok(false);
            }
            return Err(Fatal::WorkRequest {
                opcode: wc.opcode,
                status: wc.status,
                vendor_err: wc.vendor_err,
            });
        }
        self.last_active = Instant::now();
        let slot = (wc.wr_id & !wrid::KIND) as usize;
        let off = slot * self.recv_size;
        let msg = self
            .recv_mr
            .to_vec(off, (wc.byte_len as usize).min(self.recv_size))
            .map_err(|_| Fatal::ReceiveSlot(slot))?;
        self.qp.post_recv(&[RecvWr {
            wr_id: wc.wr_id,
            sg_list: vec![self.recv_mr.sge(off, self.recv_size as u32)],
        }])?;
        if let backchannel::Kind::Reply { xid, payload } = backchannel::classify(&msg) {
            // RFC 8167: a reverse-direction Reply, not a forward Call
            if !self.bc.deliver(xid, payload) {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(true);
        }
        if self.overrun {
            // more Calls than granted (RPCR-CRD-01 violated by the peer)
            return Err(Fatal::CreditOverrun);
        }
        if xid_of(&msg).is_some_and(|x| self.recovery.held(x, self.serial)) {
            // RPCR-MEM-05: wait (without the worker) for the fate of the connection that
            // touched this XID's chunks
            self.settling = Some((msg, Instant::now() + SETTLE));
            return Ok(true);
        }
        let r = self.on_message(&msg);
        if self.stage.as_ref().is_some_and(|m| m.len() > KEEP_STAGE) {
            self.release_stage();
        }
        r.map(|()| true)
    }

    fn release_stage(&mut self) {
        if let Some(m) = self.stage.take() {
            self.budget.give(m.len() as u64);
        }
    }

    /// Give back the stages kept for reuse.
    fn release_spares(&mut self) {
        for m in self.spare.drain(..) {
            self.budget.give(m.len() as u64);
        }
    }

    /// The connection ended with `ev`. A fatal error from the Requester (iWARP: a Terminate)
    /// means one of our RDMA operations met memory it does not accept (RFC 8166 §4.5.3): the Writes of the latest
    /// Replies are the candidates, so their XIDs get ERR_CHUNK when retransmitted (RPCR-MEM-05).
    /// A Requester that got its Reply does not retransmit, so this costs the others nothing.
    fn ended_by(&mut self, ev: CmEvent) -> Fatal {
        let recent: Vec<u32> = self.rep.tx().recent_rdma.iter().copied().collect();
        if matches!(ev, CmEvent::ErrorReceived(_)) && !recent.is_empty() {
            let mut failed = self.recovery.lock();
            for &xid in &recent {
                failed.record(xid);
            }
            tracing::debug!(xids = ?recent, "rpcrdma server: peer's fatal error after RDMA on chunks");
        }
        match ev {
            CmEvent::ErrorReceived(d) => Fatal::ErrorReceived(d),
            CmEvent::ErrorSent(d) => Fatal::ErrorSent(d),
            CmEvent::ConnectionError(e) => Fatal::Transport(e),
            other => Fatal::Event(other),
        }
    }

    /// An RDMA operation on `xid`'s chunks failed and ends the connection: records the XID for
    /// ERR_CHUNK when the Requester refused the chunk ([`chunk_refused`]). The engine queues a
    /// Terminate's event before it flushes the work requests, so it is there to be seen.
    fn record_if_refused(&mut self, xid: u32) {
        let mut event = None;
        while let Some(ev) = self.qp.get_event(Some(Duration::ZERO)) {
            if !matches!(ev, CmEvent::Established) {
                event = Some(ev);
                break;
            }
        }
        let status = self.failed_status.take();
        if chunk_refused(status, event.as_ref()) {
            self.recovery.lock().record(xid);
        } else {
            tracing::debug!(
                xid,
                ?status,
                ?event,
                "rpcrdma server: RDMA on chunks cut off by the connection's end"
            );
        }
    }

    /// A registered stage of at least `len` octets, its growth taken from the server's
    /// staging budget; `Ok(None)` when the budget has no room.
    fn stage(&mut self, len: usize) -> Result<Option<&MemoryRegion>, Fatal> {
        if self.stage.as_ref().is_none_or(|m| m.len() < len)
            && let Some(i) = self.spare.iter().position(|m| m.len() >= len)
        {
            // a stage that came back from an answered Call (its budget still held)
            self.release_stage();
            self.stage = Some(self.spare.swap_remove(i));
        }
        if self.stage.as_ref().is_none_or(|m| m.len() < len) {
            let size = len.next_power_of_two().max(4096);
            self.release_stage();
            if !self.budget.take(size as u64) {
                return Ok(None);
            }
            match self.pd.reg_mr(size, Access::LOCAL_WRITE) {
                Ok(m) => self.stage = Some(m),
                Err(e) => {
                    self.budget.give(size as u64);
                    return Err(e.into());
                }
            }
        }
        Ok(self.stage.as_ref())
    }

    fn on_message(&mut self, msg: &[u8]) -> Result<(), Fatal> {
        let decision = {
            let failed = self.recovery.lock();
            validate_call(msg, &self.policy, &failed)
        };
        match decision {
            ResponderDecision::Drop(reason) => {
                // RPCR-ERR-01/08/11: no answer, connection stays
                tracing::debug!(?reason, "rpcrdma server: message dropped");
                self.rep.tx().credits.on_call_dropped();
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            ResponderDecision::SendError { failed, err, reason } => {
                tracing::debug!(?reason, xid = failed.xid, "rpcrdma server: RDMA_ERROR");
                self.rep.send_error(&failed, err)
            }
            ResponderDecision::Process(vc) => {
                let fixed = FixedHeader::parse(msg).ok_or(Fatal::ShortHeader)?;
                let xid = fixed.xid;
                let form = match (&vc.payload, vc.read_chunks.is_empty()) {
                    (CallPayload::PositionZero(_), _) => &self.stats.calls_long,
                    (_, true) => &self.stats.calls_short,
                    (_, false) => &self.stats.calls_chunked,
                };
                form.fetch_add(1, Ordering::Relaxed);
                // pull the Read chunks (Position-Zero first) with RDMA Read
                let mut chunks: Vec<&ReadChunk> = Vec::new();
                if let CallPayload::PositionZero(p0) = &vc.payload {
                    chunks.push(p0);
                }
                chunks.extend(vc.read_chunks.iter());
                if !chunks.is_empty() {
                    let mut tx = self.rep.tx();
                    self.rep.note_rdma(&mut tx, xid);
                }
                let plan = CallPlan {
                    fixed,
                    lists: vc.lists().clone(),
                    inline: match &vc.payload {
                        CallPayload::Inline(p) => Some(p.to_vec()),
                        CallPayload::PositionZero(_) => None,
                    },
                    lens: chunks.iter().map(|c| c.total_len() as usize).collect(),
                    positions: vc.read_chunks.iter().map(|c| c.position).collect(),
                };
                match self.pull(&chunks) {
                    Ok(Pulled::Nothing) => self.run_call(plan, CallData::Heap(Vec::new())),
                    Ok(Pulled::Posted(io)) => {
                        // the Read completions continue the Call (`on_read`); the worker
                        // goes on with its other connections meanwhile
                        self.pulling = Some(Pulling { plan, io });
                        Ok(())
                    }
                    Ok(Pulled::TooLarge(total)) => {
                        tracing::debug!(xid, total, max = self.max_call, "rpcrdma server: Read chunks too large");
                        self.rep.send_error(&plan.fixed, ErrorBody::Chunk)
                    }
                    Ok(Pulled::NoStage) => {
                        tracing::info!(xid, qp = self.qpn, "rpcrdma server: staging budget exhausted");
                        self.stats.no_stage.fetch_add(1, Ordering::Relaxed);
                        self.rep.send_system_err(&plan.fixed, &plan.lists)
                    }
                    Err(e) => {
                        // RPCR-MEM-05: when the Requester refused the chunk, remember the
                        // XID; its retransmission gets ERR_CHUNK
                        self.record_if_refused(xid);
                        Err(e)
                    }
                }
            }
        }
    }

    /// The Reads of the Call in [`Conn::pulling`] came back: `wc` is one of them.
    fn on_read(&mut self, wc: &WorkCompletion) -> Result<(), Fatal> {
        let Some(p) = self.pulling.as_mut() else {
            return stray(wc);
        };
        let Some(i) = p.io.reads.iter().position(|(id, _)| *id == wc.wr_id) else {
            return stray(wc);
        };
        if wc.status != WcStatus::Success {
            let xid = p.plan.fixed.xid;
            self.failed_status = Some(wc.status);
            // RPCR-MEM-05: when the Requester refused the chunk, remember the XID
            self.record_if_refused(xid);
            return Err(Fatal::WorkRequest {
                opcode: wc.opcode,
                status: wc.status,
                vendor_err: wc.vendor_err,
            });
        }
        // only what the completion says was placed counts (issue 12 point 1)
        let (_, want) = p.io.reads.swap_remove(i);
        if wc.byte_len != want {
            p.io.short = true;
        }
        if !p.io.reads.is_empty() {
            return Ok(());
        }
        let Pulling { plan, io } = self.pulling.take().expect("pulling");
        if io.short {
            // a Read Response shorter than its Read: the chunk is not what the
            // Requester said it is (RFC 8166 §4.5.3)
            tracing::info!(xid = plan.fixed.xid, qp = self.qpn, peer = %self.peer, "rpcrdma server: short RDMA Read Response");
            self.stats.short_reads.fetch_add(1, Ordering::Relaxed);
            self.keep_spare(io.mr, io.charge);
            return self.rep.send_error(&plan.fixed, ErrorBody::Chunk);
        }
        // the stage goes with the Call (quiet: every Read into it completed, and it was never
        // advertised); the next Call's chunks go into a spare one
        self.run_call(
            plan,
            CallData::Stage {
                mr: io.mr,
                len: io.len,
                charge: io.charge,
            },
        )
    }

    /// A stage back from a Call is kept for the next Calls' chunks (at most SPARE_STAGES,
    /// each at most KEEP_STAGE), its budget still held; otherwise it goes and the budget
    /// comes back.
    fn keep_spare(&mut self, mr: MemoryRegion, mut charge: Charge) {
        if self.spare.len() < SPARE_STAGES && mr.len() <= KEEP_STAGE && charge.n == mr.len() as u64 {
            charge.n = 0;
            self.spare.push(mr);
        }
    }

    /// A Call whose Read chunks are in `pulled` goes to the I/O pool.
    fn run_call(&mut self, plan: CallPlan, pulled: CallData) -> Result<(), Fatal> {
        let CallPlan {
            fixed,
            lists,
            inline,
            lens,
            positions,
        } = plan;
        let xid = fixed.xid;
        let mut ranges = Vec::with_capacity(lens.len());
        let mut at = 0;
        for n in lens {
            ranges.push(at..at + n);
            at += n;
        }
        let (inline, base, rest) = match inline {
            Some(p) => (p, None, &ranges[..]),
            None => {
                if pulled.with_bytes(|p| check_payload_xid(xid, &p[ranges[0].clone()]).is_err()) != Some(false) {
                    return self.rep.send_error(&fixed, ErrorBody::Chunk);
                }
                (Vec::new(), Some(ranges[0].clone()), &ranges[1..])
            }
        };
        let positions: Vec<(u32, std::ops::Range<usize>)> =
            positions.into_iter().zip(rest).map(|(p, r)| (p, r.clone())).collect();
        // the Call's octets stay charged to the staging budget while it is in the pool
        // (a stage that travels with the Call carries its own charge)
        let charge = (inline.len() + pulled.heap_len()) as u64;
        if !self.budget.take(charge) {
            tracing::info!(xid, qp = self.qpn, "rpcrdma server: staging budget exhausted");
            self.stats.no_stage.fetch_add(1, Ordering::Relaxed);
            return self.rep.send_system_err(&fixed, &lists);
        }
        let charge = Charge {
            budget: self.budget.clone(),
            n: charge,
        };
        let room = ReplyRoom {
            carry: self.rep.carry(&lists),
            max_reply: self.max_reply,
        };
        let (registry, home, qpn, serial, rep) = (
            self.registry.clone(),
            self.home.clone(),
            self.qpn,
            self.serial,
            self.rep.clone(),
        );
        let stats = self.stats.clone();
        let job = move || {
            let run = |pulled: &[u8]| {
                let base: &[u8] = match &base {
                    None => &inline,
                    Some(r) => &pulled[r.clone()],
                };
                let inserted: Vec<InsertedChunk<'_>> = positions
                    .iter()
                    .map(|(position, r)| InsertedChunk {
                        position: *position,
                        data: &pulled[r.clone()],
                    })
                    .collect();
                let mut dec = Decoder::with_chunks(base, ChunkSource::Read(&inserted));
                match dispatch_within(&registry, &mut dec, "rdma", room) {
                    Ok(Dispatch::Reply { stream, items, .. }) => Outcome::Reply { stream, items },
                    Err(t) => Outcome::NoRoom {
                        bound: t.bound,
                        carry: t.carry,
                    },
                    Ok(Dispatch::ChunkError { .. }) => Outcome::ChunkError,
                    Ok(Dispatch::Drop) => Outcome::Garbage,
                }
            };
            let outcome = pulled.with_bytes(run).unwrap_or(Outcome::Garbage);
            drop(charge);
            let Some(h) = home.upgrade() else { return };
            // This thread posts the Reply itself (issue 18: handing it back to the worker was
            // one more wake-up per call). What goes back to the worker (the Call's stage, for
            // the next Calls' chunks) is queued first and needs no wake-up: the Reply's Send
            // completion wakes the worker. Only a Reply that could not be posted wakes it now,
            // so that the connection ends at once.
            let give_back = |f: Finished| h.done.lock().unwrap_or_else(|e| e.into_inner()).push(f);
            give_back(Finished {
                qpn,
                serial,
                pulled: Some(pulled),
                error: None,
            });
            if let Err(e) = rep.answer(&fixed, &lists, outcome) {
                give_back(Finished {
                    qpn,
                    serial,
                    pulled: None,
                    error: Some(e),
                });
                stats.pool_wakeups.fetch_add(1, Ordering::Relaxed);
                h.wake();
            }
        };
        self.in_pool += 1;
        self.pool
            .submit(self.pool_key, crate::pool::group_of(&self.registry), Box::new(job));
        Ok(())
    }

    /// A Call of this connection came back from the I/O pool, its Reply posted (or failed).
    fn complete(&mut self, f: Finished) -> Result<(), Fatal> {
        if let Some(pulled) = f.pulled {
            self.in_pool = self.in_pool.saturating_sub(1);
            // its stage is kept for the next Calls' chunks (at most SPARE_STAGES, each at
            // most KEEP_STAGE), its budget still held; otherwise it goes and the budget comes
            // back
            if let CallData::Stage { mr, charge, .. } = pulled {
                self.keep_spare(mr, charge);
            }
        }
        f.error.map_or(Ok(()), Err)
    }

    /// Post an RDMA Read of every chunk into a stage, in order; their completions come to
    /// [`Conn::on_read`]. Every Read is signalled, and only what its completion says was
    /// placed counts: a Read Response shorter than the segment it answers makes the chunk
    /// short (issue 12 point 1).
    fn pull(&mut self, chunks: &[&ReadChunk]) -> Result<Pulled, Fatal> {
        let total: u64 = chunks.iter().map(|c| c.total_len()).sum();
        if total == 0 {
            return Ok(Pulled::Nothing);
        }
        if total > self.max_call {
            // RPCR-SEC-05: more than this server takes in one Call, and no RDMA Read for it
            return Ok(Pulled::TooLarge(total));
        }
        let total = total as usize;
        if self.stage(total)?.is_none() {
            return Ok(Pulled::NoStage);
        }
        // the stage is the Call's from now on (a Reply sent meanwhile stages elsewhere)
        let mr = self.stage.take().ok_or(Fatal::Stage)?;
        let charge = Charge {
            budget: self.budget.clone(),
            n: mr.len() as u64,
        };
        let mut posts = Vec::new();
        let mut reads = Vec::new();
        let mut off = 0usize;
        for s in chunks.iter().flat_map(|c| c.segments.iter()) {
            let sge = mr.sge(off, s.length);
            off += s.length as usize;
            if s.length == 0 {
                continue;
            }
            let id = self.rep.wr(wrid::READ);
            reads.push((id, s.length));
            posts.push(SendWr::new(
                id,
                WrOpcode::RdmaRead {
                    remote: RemoteAddr {
                        addr: s.offset,
                        rkey: s.handle,
                    },
                },
                vec![sge],
            ));
        }
        self.qp.post_send(&posts)?;
        Ok(Pulled::Posted(PullIo {
            reads,
            short: false,
            mr,
            charge,
            len: total,
            deadline: Instant::now() + self.timeout,
        }))
    }

    /// A Reply's Send completed (its Writes before it): its buffer and memory come back.
    fn on_sent(&mut self, wc: &WorkCompletion) -> Result<(), Fatal> {
        match self.rep.on_sent(wc)? {
            Sent::Unknown => stray(wc),
            Sent::Failed { xid, writes } => {
                self.failed_status = Some(wc.status);
                if writes {
                    self.record_if_refused(xid);
                }
                Err(Fatal::WorkRequest {
                    opcode: wc.opcode,
                    status: wc.status,
                    vendor_err: wc.vendor_err,
                })
            }
            Sent::Done(Held::Stage(mr, charge)) => {
                self.keep_spare(mr, charge);
                Ok(())
            }
            Sent::Done(_) => Ok(()),
        }
    }

    /// When the oldest RDMA operation of this connection still outstanding (its Read
    /// chunks' Reads, a Reply's Send) times out.
    fn op_deadline(&self) -> Option<Instant> {
        let pull = self.pulling.as_ref().map(|p| p.io.deadline);
        let send = self.rep.tx().sending.front().map(|f| f.deadline);
        match (pull, send) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The XID of a message (its first word).
fn xid_of(msg: &[u8]) -> Option<u32> {
    msg.get(..4).map(|x| u32::from_be_bytes(x.try_into().expect("4 bytes")))
}

/// A completion of an operation this connection does not wait for (a reverse Call's Send):
/// nothing to do unless it failed.
fn stray(wc: &WorkCompletion) -> Result<(), Fatal> {
    if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
        return Err(Fatal::WorkRequest {
            opcode: wc.opcode,
            status: wc.status,
            vendor_err: wc.vendor_err,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 17: a connection reset under a WRITE's RDMA Read (or a READ's RDMA Writes) flushes
    /// them; the Call's retransmission must run, not get ERR_CHUNK (RPCR-MEM-05 is about the
    /// Requester refusing the chunk).
    #[test]
    fn a_flush_by_a_broken_connection_is_not_a_refused_chunk() {
        let reset = CmEvent::ConnectionError("Connection reset by peer".into());
        assert!(!chunk_refused(Some(WcStatus::WrFlushErr), Some(&reset)));
        assert!(!chunk_refused(Some(WcStatus::WrFlushErr), Some(&CmEvent::Disconnected)));
        assert!(!chunk_refused(Some(WcStatus::WrFlushErr), None));
        assert!(!chunk_refused(Some(WcStatus::RetryExcErr), None));
        assert!(!chunk_refused(None, None));
    }

    /// RPCR-MEM-05: the Requester's Terminate, or the completion status it gives the operation
    /// it names, marks the chunk as refused.
    #[test]
    fn a_terminate_or_remote_access_error_is_a_refused_chunk() {
        let term = CmEvent::ErrorReceived(verbs::cm::ErrorDetail::new(
            "layer 1, type 1, code 0: invalid STag".to_string(),
        ));
        assert!(chunk_refused(Some(WcStatus::WrFlushErr), Some(&term)));
        assert!(chunk_refused(Some(WcStatus::RemAccessErr), None));
        assert!(chunk_refused(Some(WcStatus::RemOpErr), Some(&CmEvent::Disconnected)));
        assert!(chunk_refused(Some(WcStatus::RemInvReqErr), None));
    }
}
