//! The Responder (RPC server) on verbs: a bounded pool of workers, each sleeping in one
//! completion queue that its connections' QPs share; each connection's Calls answered in
//! arrival order. The resource model is in the docs of [`crate::transport`].

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use verbs::{CmEvent, CompletionQueue, MemoryRegion, ProtectionDomain, QueuePair, WcStatus, WorkCompletion};

use super::backchannel::{self, BC_CREDITS};
use super::{RdmaConfig, wrid};
use crate::pool::IoPool;
use crate::server::Registry;
use crate::validate::{FailedXids, ResponderPolicy};
use crate::wire::{ChunkLists, FixedHeader};

mod accept;
mod call;
mod conn;
mod reply;
mod server;
mod worker;
use reply::Replier;

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
    /// Replies a thread queued while another thread of their connection was posting, and
    /// left for that thread to post (instead of sleeping on the send side's lock while the
    /// provider copied the other Reply out; issues 17/18, session 15).
    pub replies_left_to_poster: AtomicU64,
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
    pub replies_left_to_poster: u64,
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

#[cfg(test)]
mod tests;
