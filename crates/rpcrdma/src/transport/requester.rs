//! The Requester (RPC client) on verbs.

use super::mailbox::{self, Empty, Mailbox, Receiver, Sender};
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use verbs::{
    Access, CmEvent, CompletionQueue, MemoryRegion, ProtectionDomain, QpOptions, QueuePair, RecvWr, SendFlags, SendWr,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

use super::{RdmaConfig, wrid};
use crate::client::{Call, Disconnect, LocalError, RpcError, XidSource, decode_reply};
use crate::credits::RequesterCredits;
use crate::inline::{CallForm, max_rpc_reply_header, plan_call, plan_reply_resources};
use crate::private_data::{Negotiated, PrivateData, Side, negotiate};
use crate::validate::{RequesterDecision, validate_reply};
use crate::wire::chunks::position_zero_read_list;
use crate::wire::{Body, ChunkLists, Header, Limits, ReadSegment, Segment, WriteChunk};
use crate::xdr::{ChunkSource, Decoder, Encoder, ReturnedWriteChunk, SliceSink, XdrError};

/// An RPC-over-RDMA client: one connection at a time, re-established on loss;
/// `call` may be used from many threads at once.
pub struct RdmaClient {
    pd: ProtectionDomain,
    addr: SocketAddr,
    cfg: RdmaConfig,
    conn: Mutex<Option<Arc<Conn>>>,
    xids: XidSource,
    connects: std::sync::atomic::AtomicU32,
    pool: Arc<Pool>,
    backchannel: Option<Arc<crate::server::Registry>>,
}

/// A deliberate fault in the chunk memory a Requester offers for one call, to see how a
/// Responder handles the RDMA operational errors of RFC 8166 §4.5.3 ("a memory region is no
/// longer registered"). Used by `softrdma nfs probe` and the interop suite; never by a normal
/// call. The fault applies to the first transmission only: when the connection is lost, the
/// retransmission after the reconnect offers valid memory, which is how RFC 8166 §4.5.3
/// expects a Requester to recover.
///
/// (A chunk that is too *small* needs no fault: give the call a [`crate::xdr::ReplySizing`]
/// smaller than the reply, and the Write or Reply chunk is sized from it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkFault {
    /// Advertise the Write list and the Reply chunk with an STag whose 8-bit key is wrong:
    /// the Responder's first RDMA Write into them meets a Terminate from our RNIC
    /// (DDP tagged buffer error, invalid STag; RFC 5041 §7.2) and the connection ends.
    StaleWriteHandles,
    /// The same for the Read list: the Responder's RDMA Read Request is answered with a
    /// Terminate (RDMAP remote protection error, invalid STag; RFC 5040 §7.4).
    StaleReadHandles,
}

/// The advertised handle of a region under a fault: the same STag index with another key,
/// so it names no valid registration (RFC 5040 §2.1: the key is the low 8 bits).
fn stale(stag: u32) -> u32 {
    stag ^ 0x80
}

enum Fail {
    /// The connection failed: reconnect and retransmit.
    Retry(RpcError),
    /// The RPC failed for good.
    Fatal(RpcError),
}

impl RdmaClient {
    /// Connect to a Responder at `addr` using `pd`'s device.
    pub fn connect(pd: &ProtectionDomain, addr: SocketAddr, cfg: RdmaConfig) -> Result<RdmaClient, RpcError> {
        Self::open(pd, addr, cfg, None)
    }

    /// Connect and also serve RFC 8167 reverse-direction Calls from the Responder with
    /// `registry` (Short messages only; [`super::BC_CREDITS`] extra receives on every
    /// connection). The upper layer tells the server that it may now call back (§6).
    pub fn connect_with_backchannel(
        pd: &ProtectionDomain,
        addr: SocketAddr,
        cfg: RdmaConfig,
        registry: Arc<crate::server::Registry>,
    ) -> Result<RdmaClient, RpcError> {
        Self::open(pd, addr, cfg, Some(registry))
    }

    fn open(
        pd: &ProtectionDomain,
        addr: SocketAddr,
        cfg: RdmaConfig,
        backchannel: Option<Arc<crate::server::Registry>>,
    ) -> Result<RdmaClient, RpcError> {
        let c = RdmaClient {
            backchannel,
            pd: pd.clone(),
            addr,
            cfg,
            conn: Mutex::new(None),
            xids: XidSource::new(),
            connects: 0.into(),
            pool: Arc::new(Pool::default()),
        };
        c.connection()?;
        Ok(c)
    }

    /// The thresholds and remote-invalidation setting of the current connection.
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.conn.lock().unwrap().as_ref().map(|c| c.neg)
    }

    /// How many connections were made (1 + reconnects).
    pub fn connects(&self) -> u32 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Memory regions this client allocated for RPC chunks and Sends so far:
    /// they are pooled and fast-registered again (with a new key) per RPC, so
    /// this stays small however many RPCs are made.
    pub fn regions_allocated(&self) -> u64 {
        self.pool.allocated.load(Ordering::Relaxed)
    }

    /// Octets of Write chunks and Reply chunks this client copied out of its registered
    /// memory to decode them. Replies whose chunks are each one segment are decoded in place
    /// (issue 18), so this stays 0 for the Write lists this client builds.
    pub fn copied_octets(&self) -> u64 {
        self.pool.copied.load(Ordering::Relaxed)
    }

    /// Replies a caller took from the connection's completion queue itself, as the poller of
    /// its connection (issue 18: no thread hand-off between the Reply's arrival and the caller).
    pub fn replies_polled_by_caller(&self) -> u64 {
        self.pool.own.load(Ordering::Relaxed)
    }

    /// Replies handed to a waiting caller by another thread (the connection's progress thread,
    /// or the caller polling for the others while this one waited): one wake-up each.
    pub fn replies_handed_over(&self) -> u64 {
        self.pool.handed.load(Ordering::Relaxed)
    }

    /// Waits a caller leading its connection made in the completion queue for Replies.
    pub fn reply_waits(&self) -> u64 {
        self.pool.waits.load(Ordering::Relaxed)
    }

    /// Of [`reply_waits`](Self::reply_waits), those that busy-polled before sleeping: none
    /// for a call moving [`BULK_NO_SPIN`] octets or more in chunks (unless `reply_spin` is
    /// `Duration::MAX`), every one for smaller calls when `reply_spin` is not zero.
    pub fn reply_waits_spun(&self) -> u64 {
        self.pool.spun.load(Ordering::Relaxed)
    }

    /// The configuration.
    pub fn config(&self) -> &RdmaConfig {
        &self.cfg
    }

    fn connection(&self) -> Result<Arc<Conn>, RpcError> {
        let mut g = self.conn.lock().unwrap();
        if let Some(c) = g.as_ref()
            && c.alive()
        {
            return Ok(c.clone());
        }
        if let Some(old) = g.take() {
            old.shutdown();
        }
        let c = Conn::open(
            &self.pd,
            self.addr,
            &self.cfg,
            self.pool.clone(),
            self.backchannel.clone(),
        )?;
        self.connects.fetch_add(1, Ordering::Relaxed);
        *g = Some(c.clone());
        Ok(c)
    }

    fn drop_connection(&self, conn: &Arc<Conn>) {
        let mut g = self.conn.lock().unwrap();
        if g.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            g.take();
        }
        conn.shutdown();
    }

    /// Make one call and decode its results with `decode`. The call is
    /// retransmitted with the same XID on a new connection if the connection
    /// is lost or no Reply comes in time (up to `max_retries` times).
    pub fn call<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, RpcError> {
        self.call_inner(call, decode, None)
    }

    /// [`RdmaClient::call`] with a deliberate chunk fault on the first transmission (see
    /// [`ChunkFault`]): for testing a Responder's RFC 8166 §4.5.3 handling.
    pub fn call_with_fault<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
        fault: ChunkFault,
    ) -> Result<T, RpcError> {
        self.call_inner(call, decode, Some(fault))
    }

    fn call_inner<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
        mut fault: Option<ChunkFault>,
    ) -> Result<T, RpcError> {
        let xid = self.xids.next();
        let mut last = RpcError::Disconnected(Disconnect::NotConnected);
        for _attempt in 0..=self.cfg.max_retries {
            let conn = match self.connection() {
                Ok(c) => c,
                Err(e) => {
                    last = e;
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            match conn.call_once(xid, call, &self.cfg, fault.take()) {
                Ok(done) => return done.decode(xid, decode),
                Err(Fail::Fatal(e)) => return Err(e),
                Err(Fail::Retry(e)) => {
                    tracing::debug!(xid, "rpcrdma: {e}; reconnecting to retransmit");
                    self.drop_connection(&conn);
                    last = e;
                }
            }
        }
        Err(last)
    }
}

impl Drop for RdmaClient {
    fn drop(&mut self) {
        if let Some(c) = self.conn.lock().unwrap().take() {
            c.shutdown();
        }
    }
}

/// Registered memory kept for reuse across RPCs and connections of one client
/// (same PD): a local region and a fast-register MR over it. A pair goes back
/// only after its STag was invalidated (the RPC completed with a Reply or an
/// RDMA_ERROR); each use fast-registers it again with a new key (RPCR-MEM-01:
/// memory is still registered per RPC, but not allocated and faulted in per RPC).
#[derive(Default)]
struct Pool {
    free: Mutex<Vec<(MemoryRegion, MemoryRegion)>>,
    /// Scratch buffers the returned chunks are copied into for decoding
    /// (reused, so they are neither zeroed nor faulted in per RPC).
    scratch: Mutex<Vec<Vec<u8>>>,
    /// Regions registered with `reg_mr` so far.
    allocated: std::sync::atomic::AtomicU64,
    /// Octets of returned chunks copied out of a region for decoding ([`Region::gather`]).
    copied: std::sync::atomic::AtomicU64,
    /// Replies delivered by the caller's own poll ([`RdmaClient::replies_polled_by_caller`]).
    own: std::sync::atomic::AtomicU64,
    /// Replies delivered by another thread ([`RdmaClient::replies_handed_over`]).
    handed: std::sync::atomic::AtomicU64,
    /// Waits of a leading caller in the CQ ([`RdmaClient::reply_waits`]).
    waits: std::sync::atomic::AtomicU64,
    /// Those of them that busy-polled first ([`RdmaClient::reply_waits_spun`]).
    spun: std::sync::atomic::AtomicU64,
}

/// A call whose Write chunks and Read chunks carry at least this many octets together does
/// not busy-poll for its Reply ([`RdmaConfig::reply_spin`]): the bulk transfer (RDMA Write of
/// the results, RDMA Reads of the arguments) takes hundreds of µs, far beyond the spin, and
/// on a machine with few cores the spin takes CPU the peer's threads (or this side's engine)
/// need meanwhile. The caller sleeps in the CQ at once, receiving the Reply itself (issue 18,
/// session 13 round 2). `reply_spin == Duration::MAX` (busy-poll mode) still spins.
pub const BULK_NO_SPIN: usize = 64 << 10;

/// Pairs kept at most (bounds the memory a client holds when idle).
const POOL_MAX: usize = 64;

impl Pool {
    fn take(&self, pd: &ProtectionDomain, len: usize) -> Result<(MemoryRegion, MemoryRegion), verbs::Error> {
        let len = len.max(1);
        {
            let mut f = self.free.lock().unwrap();
            // the smallest pair that fits
            let best = f
                .iter()
                .enumerate()
                .filter(|(_, (l, _))| l.len() >= len)
                .min_by_key(|(_, (l, _))| l.len())
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(f.swap_remove(i));
            }
        }
        // round up so that later RPCs of similar size reuse it
        let cap = len.next_power_of_two().max(4096);
        let local = pd.reg_mr(cap, Access::LOCAL_WRITE)?;
        self.allocated.fetch_add(1, Ordering::Relaxed);
        let fr = pd.alloc_mr(cap as u64)?;
        Ok((local, fr))
    }

    fn give(&self, pair: (MemoryRegion, MemoryRegion)) {
        let mut f = self.free.lock().unwrap();
        if f.len() < POOL_MAX {
            f.push(pair);
        }
    }

    fn scratch(&self) -> Vec<u8> {
        self.scratch.lock().unwrap().pop().unwrap_or_default()
    }

    fn give_scratch(&self, v: Vec<u8>) {
        let mut s = self.scratch.lock().unwrap();
        if s.len() < POOL_MAX {
            s.push(v);
        }
    }

    /// A send buffer (local only; no STag is handed out).
    fn take_send(&self, pd: &ProtectionDomain, len: usize) -> Result<(MemoryRegion, MemoryRegion), verbs::Error> {
        self.take(pd, len)
    }
}

/// Octets of a Call's RPC-over-RDMA header encoded on the caller's stack (RPCR-FRM-02): the
/// fixed 28 and room for a few chunk segments; a larger header is encoded into a vector.
const HEADER_ON_STACK: usize = 256;

/// A registration for one RPC: the local bytes and the fast-registered STag
/// the peer uses.
struct Region {
    pair: Option<(MemoryRegion, MemoryRegion)>,
    stag: u32,
    addr: u64,
    pool: Arc<Pool>,
    /// Set once the STag is known to be invalid again: the pair may be reused.
    reusable: bool,
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.reusable
            && let Some(p) = self.pair.take()
        {
            self.pool.give(p);
        }
    }
}

impl Region {
    fn new(
        pool: &Arc<Pool>,
        pd: &ProtectionDomain,
        len: usize,
        init: &[&[u8]],
        access: Access,
        key: u8,
        wrs: &mut Vec<SendWr>,
    ) -> Result<Region, verbs::Error> {
        let (local, fr) = pool.take(pd, len)?;
        // the parts one after the other, each copied once (straight from the Payload stream)
        let mut at = 0;
        for d in init {
            local.write(at, d).map_err(verbs::Error::from)?;
            at += d.len();
        }
        let stag = fr.stag_with_key(key);
        wrs.push(
            SendWr::new(
                wrid::REG,
                WrOpcode::RegMr {
                    mr_stag: fr.rkey(),
                    key,
                    source_lkey: local.lkey(),
                    source_addr: local.addr(),
                    length: len.max(1) as u64,
                    iova: local.addr(),
                    access,
                },
                vec![],
            )
            .flags(SendFlags::empty()),
        );
        let addr = local.addr();
        Ok(Region {
            pair: Some((local, fr)),
            stag,
            addr,
            pool: pool.clone(),
            reusable: false,
        })
    }

    fn local(&self) -> &MemoryRegion {
        &self.pair.as_ref().expect("present until drop").0
    }

    fn segment(&self, off: usize, len: u32) -> Segment {
        Segment {
            handle: self.stag,
            length: len,
            offset: self.addr + off as u64,
        }
    }

    /// Where the returned Write chunks (`None`: an empty chunk) and, for a Long Reply, the
    /// Reply chunk lie in this region, as byte ranges: `None` unless each is one segment
    /// inside the region (more segments are gathered by copying, [`Region::gather`]).
    fn spans(&self, lists: &ChunkLists, long: bool) -> Option<Spans> {
        let span = |c: &WriteChunk| -> Option<std::ops::Range<usize>> {
            let [s] = c.segments.as_slice() else { return None };
            let off = usize::try_from(s.offset.checked_sub(self.addr)?).ok()?;
            let end = off.checked_add(s.length as usize)?;
            (end <= self.local().len()).then_some(off..end)
        };
        let mut writes = Vec::with_capacity(lists.writes.len());
        for w in &lists.writes {
            writes.push(if w.is_empty_chunk() { None } else { Some(span(w)?) });
        }
        let reply = match (&lists.reply, long) {
            (Some(rc), true) => Some(span(rc)?),
            _ => None,
        };
        Some(Spans { writes, reply })
    }

    /// Copy the bytes of the returned segments (checked against what was
    /// provided before) to the start of `out`; returns how many. `out` only
    /// grows (and is only zeroed) when it is too short.
    fn gather(&self, segs: &[Segment], out: &mut Vec<u8>) -> Result<usize, RpcError> {
        let bad = || RpcError::Decode(XdrError::Overflow);
        let total = segs
            .iter()
            .try_fold(0usize, |a, s| a.checked_add(s.length as usize))
            .filter(|&t| t <= self.local().len())
            .ok_or_else(bad)?;
        if out.len() < total {
            out.resize(total, 0);
        }
        let mut at = 0;
        for s in segs {
            let off = s.offset.checked_sub(self.addr).ok_or_else(bad)?;
            let end = at + s.length as usize;
            self.local()
                .read(usize::try_from(off).map_err(|_| bad())?, &mut out[at..end])
                .map_err(|_| bad())?;
            at = end;
        }
        self.pool.copied.fetch_add(total as u64, Ordering::Relaxed);
        Ok(total)
    }
}

/// Byte ranges of a Reply's returned chunks in the Requester's region ([`Region::spans`]).
struct Spans {
    writes: Vec<Option<std::ops::Range<usize>>>,
    reply: Option<std::ops::Range<usize>>,
}

/// A Reply received and its chunk memory already invalidated.
struct Done {
    msg: Vec<u8>,
    write_region: Option<Region>,
}

impl Done {
    fn decode<T>(self, xid: u32, decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>) -> Result<T, RpcError> {
        let (h, len) =
            Header::decode(&self.msg, &Limits::default()).map_err(|_| RpcError::Decode(XdrError::Overflow))?;
        let lists = h.body.lists().cloned().unwrap_or_default();
        let long = !matches!(&h.body, Body::Msg(_));
        // the returned Write chunks and the Reply chunk decoded where the Responder's Writes
        // put them, once their STag is invalid (issue 18: no copy of a 1 MiB READ's data)
        if let Some(r) = self.write_region.as_ref().filter(|r| r.reusable)
            && let Some(spans) = r.spans(&lists, long)
        {
            let end = spans
                .writes
                .iter()
                .flatten()
                .chain(&spans.reply)
                .map(|s| s.end)
                .max()
                .unwrap_or(0);
            let body = &self.msg[len..];
            return super::in_place::with_quiet(r.local(), 0, end, |all| {
                let returned: Vec<ReturnedWriteChunk<'_>> = spans
                    .writes
                    .iter()
                    .map(|s| match s {
                        None => ReturnedWriteChunk::Empty,
                        Some(s) => ReturnedWriteChunk::Data(&all[s.clone()]),
                    })
                    .collect();
                let payload = match &spans.reply {
                    Some(s) => &all[s.clone()],
                    None if long => &[][..],
                    None => body,
                };
                decode_reply(
                    &mut Decoder::with_chunks(payload, ChunkSource::Write(&returned)),
                    xid,
                    decode,
                )
            })
            .unwrap_or(Err(RpcError::Decode(XdrError::Overflow)));
        }
        // a Short Reply without Write chunks (NULL, small results): decoded from the message
        // as it is, with nothing to gather (no vector allocated for it)
        if !long && lists.writes.is_empty() {
            return decode_reply(
                &mut Decoder::with_chunks(&self.msg[len..], ChunkSource::Write(&[])),
                xid,
                decode,
            );
        }
        // otherwise copied out of the registered region into reused scratch buffers
        let mut bufs: Vec<(Vec<u8>, usize)> = Vec::with_capacity(lists.writes.len() + 1);
        let r = (|| {
            for w in &lists.writes {
                let mut v = self.write_region.as_ref().map(|r| r.pool.scratch()).unwrap_or_default();
                let n = match &self.write_region {
                    Some(r) => r.gather(&w.segments, &mut v)?,
                    None => 0,
                };
                bufs.push((v, n));
            }
            if long {
                let mut v = self.write_region.as_ref().map(|r| r.pool.scratch()).unwrap_or_default();
                let n = match (&self.write_region, &lists.reply) {
                    (Some(r), Some(rc)) => r.gather(&rc.segments, &mut v)?,
                    _ => 0,
                };
                bufs.push((v, n));
            }
            let returned: Vec<ReturnedWriteChunk<'_>> = lists
                .writes
                .iter()
                .zip(&bufs)
                .map(|(w, (b, n))| {
                    if w.is_empty_chunk() {
                        ReturnedWriteChunk::Empty
                    } else {
                        ReturnedWriteChunk::Data(&b[..*n])
                    }
                })
                .collect();
            let payload: &[u8] = if long {
                let (b, n) = bufs.last().expect("pushed");
                &b[..*n]
            } else {
                &self.msg[len..]
            };
            decode_reply(
                &mut Decoder::with_chunks(payload, ChunkSource::Write(&returned)),
                xid,
                decode,
            )
        })();
        if let Some(reg) = &self.write_region {
            for (v, _) in bufs {
                reg.pool.give_scratch(v);
            }
        }
        r
    }
}

type Outcome = Result<Vec<u8>, RpcError>;

thread_local! {
    /// The mailbox of this thread's last call, reused by its next (see [`mailbox::pair`]).
    static MAILBOX: std::cell::RefCell<std::sync::Arc<Mailbox<Msg>>> =
        std::cell::RefCell::new(std::sync::Arc::new(Mailbox::new()));
}

/// What a waiting caller receives.
enum Msg {
    /// Its RPC's outcome.
    Done(Outcome),
    /// The poller left: this caller may poll the CQ now.
    Lead,
}

/// How long a poller sleeps in the CQ before it looks at its deadline and the CM events again.
const POLL_SLICE: Duration = Duration::from_millis(20);

/// Who polls the connection's completion queue (issue 18). A caller waiting for its Reply
/// polls the CQ itself (leader/follower): the Reply's completion reaches the thread that waits
/// for it without a hand-off through the progress thread, and while it busy-polls it reads
/// the Reply off the transport itself. Other callers wait on their channels (followers) and
/// the leader hands their Replies over; when it has its own it makes one of them the leader.
/// The progress thread polls only while no caller does (reverse-direction Calls, late
/// completions, CM events) and leaves at once when a caller comes ([`CompletionQueue::interrupt`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Leader {
    None,
    Caller(ThreadId),
    Progress,
}

struct Pending {
    lists: ChunkLists,
    stags: Vec<u32>,
    tx: Sender<Msg>,
    /// The Reply (or the error), waiting for local invalidation to finish.
    result: Option<Outcome>,
    /// Its caller waits on its channel for a Reply or for its turn to poll.
    following: bool,
}

struct State {
    credits: RequesterCredits,
    /// By XID (ours, one per credit at most): FxHash, as every call inserts, looks up and
    /// removes its entry.
    pending: FxHashMap<u32, Pending>,
    dead: Option<Disconnect>,
    /// Callers waiting on `Conn::cv` for a credit.
    credit_waiters: usize,
    leader: Leader,
}

impl State {
    /// Ends RPC `xid` with `outcome`, counted as a hand-off unless the thread that delivers
    /// it is the caller that polls for it.
    fn deliver(&mut self, pool: &Pool, xid: u32, outcome: Outcome) {
        let Some(p) = self.pending.remove(&xid) else { return };
        let counter = if p.following || self.leader != Leader::Caller(std::thread::current().id()) {
            &pool.handed
        } else {
            &pool.own
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let _ = p.tx.try_send(Msg::Done(outcome));
    }
}

struct Conn {
    pd: ProtectionDomain,
    pool: Arc<Pool>,
    /// RFC 8167: the registry that answers reverse-direction Calls.
    backchannel: Option<Arc<crate::server::Registry>>,
    /// Send buffers of reverse-direction Replies in flight, by work request id.
    bc_sends: Mutex<HashMap<u64, (MemoryRegion, MemoryRegion)>>,
    bc_next: std::sync::atomic::AtomicU64,
    qp: QueuePair,
    neg: Negotiated,
    recv_mr: MemoryRegion,
    recv_size: usize,
    state: Mutex<State>,
    cv: Condvar,
    /// The connection's completion queue, polled by whoever leads ([`Leader`]).
    cq: CompletionQueue,
    /// The progress thread sleeps here (with [`POLL_SLICE`] timeouts) while a caller polls.
    idle: Condvar,
    stop: AtomicBool,
    key: AtomicU8,
    progress: Mutex<Option<JoinHandle<()>>>,
    /// [`RdmaConfig::reply_spin`]: how long a leading caller busy-polls before it sleeps.
    reply_spin: Duration,
}

impl Conn {
    fn open(
        pd: &ProtectionDomain,
        addr: SocketAddr,
        cfg: &RdmaConfig,
        pool: Arc<Pool>,
        backchannel: Option<Arc<crate::server::Registry>>,
    ) -> Result<Arc<Conn>, RpcError> {
        let err = |e: verbs::Error| RpcError::Disconnected(e.into());
        let credits = cfg.credits.max(1);
        let cq = pd.device().create_cq(8 * credits as usize + 64).map_err(err)?;
        let local = PrivateData::new(cfg.inline_send, cfg.inline_recv, cfg.remote_invalidation)
            .map_err(LocalError::PrivateData)?;
        let mine = if cfg.private_data {
            local
        } else {
            PrivateData::default()
        };
        // RPCR-INL-02, RPCR-CRD-05: one receive per credit, of our receive size
        // (>= the reply threshold, which is min(server send, our receive)),
        // posted before the connection goes live
        let recv_size = mine.recv_size as usize;
        // RFC 8167 §4.3.1: BC_CREDITS more for reverse-direction Calls
        let slots = credits + if backchannel.is_some() { super::BC_CREDITS } else { 0 };
        let recv_mr = pd
            .reg_mr(recv_size * slots as usize, Access::LOCAL_WRITE)
            .map_err(err)?;
        let recvs: Vec<RecvWr> = (0..slots as usize)
            .map(|i| RecvWr {
                wr_id: wrid::RECV | i as u64,
                sg_list: vec![recv_mr.sge(i * recv_size, recv_size as u32)],
            })
            .collect();
        let mut opts = QpOptions::new(&cq)
            .rd_atomic(cfg.rd_atomic, cfg.rd_atomic)
            .post_recv(recvs);
        opts.attr.max_recv_wr = opts.attr.max_recv_wr.max(slots);
        opts.attr.max_send_wr = opts.attr.max_send_wr.max(8 * credits + 2 * super::BC_CREDITS);
        if cfg.private_data {
            opts = opts.private_data(&local.encode());
        }
        let qp = pd.connect(addr, opts, cfg.timeout).map_err(err)?;
        let peer = PrivateData::find(&qp.conn_info().peer_private_data);
        let neg = negotiate(Side::Client, &mine, peer.as_ref());
        std::thread::sleep(cfg.connect_settle);
        let conn = Arc::new(Conn {
            pd: pd.clone(),
            pool,
            backchannel,
            bc_sends: Mutex::new(HashMap::new()),
            bc_next: std::sync::atomic::AtomicU64::new(0),
            qp,
            neg,
            recv_mr,
            recv_size,
            state: Mutex::new(State {
                credits: RequesterCredits::new(credits),
                pending: FxHashMap::default(),
                dead: None,
                credit_waiters: 0,
                leader: Leader::None,
            }),
            cv: Condvar::new(),
            cq,
            idle: Condvar::new(),
            stop: AtomicBool::new(false),
            key: AtomicU8::new(1),
            progress: Mutex::new(None),
            reply_spin: cfg.reply_spin,
        });
        let c2 = conn.clone();
        let t = std::thread::Builder::new()
            .name("rpcrdma-client".into())
            .spawn(move || c2.progress_loop())
            .map_err(LocalError::from)?;
        *conn.progress.lock().unwrap() = Some(t);
        Ok(conn)
    }

    fn alive(&self) -> bool {
        self.state.lock().unwrap().dead.is_none()
    }

    fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.idle.notify_all();
        self.cq.interrupt();
        self.qp.disconnect();
        let t = self.progress.lock().unwrap().take();
        if let Some(t) = t
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
        self.fail_all(Disconnect::Closed);
    }

    fn fail_all(&self, why: Disconnect) {
        let mut st = self.state.lock().unwrap();
        if st.dead.is_none() {
            st.dead = Some(why.clone());
        }
        for (_, p) in st.pending.drain() {
            let _ = p.tx.try_send(Msg::Done(Err(RpcError::Disconnected(why.clone()))));
        }
        self.cv.notify_all();
        self.idle.notify_all();
    }

    fn next_key(&self) -> u8 {
        self.key.fetch_add(1, Ordering::Relaxed)
    }

    fn call_once(&self, xid: u32, call: &Call<'_>, cfg: &RdmaConfig, fault: Option<ChunkFault>) -> Result<Done, Fail> {
        let deadline = Instant::now() + cfg.timeout;
        let local = |e: LocalError| Fail::Fatal(RpcError::Local(e));
        let th = self.neg.thresholds;
        let (stream, items) = call.encode(xid).map_err(|e| local(LocalError::Encode(e)))?;
        // Reply resources from the binding's largest reply (RPCR-ULB-02, RPCR-LNG-04, RPCR-WRC-01)
        let res = plan_reply_resources(
            &th,
            max_rpc_reply_header(0).saturating_add(call.reply.max_results),
            &call.reply.ddp_results,
            |_| 1,
            cfg.call_options,
        );
        let mut wrs = Vec::new();
        let mut lists = ChunkLists::default();
        let mut write_region = None;
        let total: usize = res.write_chunks.iter().map(|&c| align8(c as usize)).sum::<usize>()
            + res.reply_chunk.map_or(0, |c| c as usize);
        if !res.write_chunks.is_empty() || res.reply_chunk.is_some() {
            let r = Region::new(
                &self.pool,
                &self.pd,
                total,
                &[],
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                self.next_key(),
                &mut wrs,
            )
            .map_err(|e| local(e.into()))?;
            let bad = fault == Some(ChunkFault::StaleWriteHandles);
            let seg = |off: usize, cap: u32| {
                let mut s = r.segment(off, cap);
                if bad {
                    s.handle = stale(s.handle);
                }
                s
            };
            let mut off = 0;
            for &cap in &res.write_chunks {
                lists.writes.push(WriteChunk {
                    segments: vec![seg(off, cap)],
                });
                off += align8(cap as usize);
            }
            if let Some(cap) = res.reply_chunk {
                lists.reply = Some(WriteChunk {
                    segments: vec![seg(off, cap)],
                });
            }
            write_region = Some(r);
        }
        let plan = plan_call(&th, &stream, &items, &lists, |_| 1, cfg.call_options)
            .map_err(|e| local(LocalError::Inline(e)))?;
        let mut read_region = None;
        let (body, payload): (Body, &[u8]) = match &plan.form {
            CallForm::Short => (Body::Msg(lists.clone()), &stream),
            CallForm::Chunked(red) => {
                // RPCR-RDC-04: chunks without pad, one item each (RPCR-DDP-05)
                let bytes: usize = red.items.iter().map(|i| i.range.len()).sum();
                let parts: Vec<&[u8]> = red.items.iter().map(|it| &stream[it.range.clone()]).collect();
                let r = Region::new(
                    &self.pool,
                    &self.pd,
                    bytes,
                    &parts,
                    Access::REMOTE_READ,
                    self.next_key(),
                    &mut wrs,
                )
                .map_err(|e| local(e.into()))?;
                let mut l = lists.clone();
                let mut off = 0;
                for it in &red.items {
                    let mut target = r.segment(off, it.range.len() as u32);
                    if fault == Some(ChunkFault::StaleReadHandles) {
                        target.handle = stale(target.handle);
                    }
                    l.reads.push(ReadSegment {
                        position: it.position,
                        target,
                    });
                    off += it.range.len();
                }
                read_region = Some(r);
                (Body::Msg(l), &red.payload)
            }
            CallForm::Long => {
                // RPCR-LNG-01/02/08: the whole Payload stream, pad included, at Position zero
                let r = Region::new(
                    &self.pool,
                    &self.pd,
                    stream.len(),
                    &[&stream],
                    Access::REMOTE_READ,
                    self.next_key(),
                    &mut wrs,
                )
                .map_err(|e| local(e.into()))?;
                let mut l = lists.clone();
                let mut target = r.segment(0, stream.len() as u32);
                if fault == Some(ChunkFault::StaleReadHandles) {
                    target.handle = stale(target.handle);
                }
                l.reads = position_zero_read_list(&[target]);
                read_region = Some(r);
                (Body::NoMsg(l), &[][..])
            }
        };
        let call_lists = body.lists().cloned().unwrap_or_default();
        // a bulk call sleeps in the CQ at once (BULK_NO_SPIN)
        let chunked: usize = res.write_chunks.iter().map(|&c| c as usize).sum::<usize>()
            + call_lists.reads.iter().map(|r| r.target.length as usize).sum::<usize>();
        let spin = if chunked >= BULK_NO_SPIN && self.reply_spin != Duration::MAX {
            Duration::ZERO
        } else {
            self.reply_spin
        };
        let mut stags: Vec<u32> = Vec::new();
        stags.extend(read_region.as_ref().map(|r| r.stag));
        stags.extend(write_region.as_ref().map(|r| r.stag));
        // credit: wait for one (RPCR-CRD-01/03/07)
        // room for a Lead and the Done after it; this thread's mailbox of its last call,
        // unless something of that call still holds it
        let (tx, rx) = MAILBOX.with(|m| mailbox::pair(&mut m.borrow_mut()));
        {
            let mut st = self.state.lock().unwrap();
            loop {
                if let Some(d) = &st.dead {
                    return Err(Fail::Retry(RpcError::Disconnected(d.clone())));
                }
                if st.credits.on_send().is_ok() {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(Fail::Retry(RpcError::Timeout));
                }
                st.credit_waiters += 1;
                st = self.cv.wait_timeout(st, deadline - now).unwrap().0;
                st.credit_waiters -= 1;
            }
            let header = Header::new(xid, st.credits.requested(), body);
            // The header is encoded on the stack (a Short Call's is 28 octets and its chunk
            // lists) and copied into the send buffer, the payload after it: no vector per
            // call, no second copy of the payload (issue 18, session 17). A header larger
            // than the stack buffer, or one that does not encode, takes the vector's way,
            // which reports the error.
            let mut stack = [0u8; HEADER_ON_STACK];
            let mut e = Encoder::new(SliceSink::new(&mut stack));
            let on_stack = header.encode(&mut e).is_ok();
            let vec;
            let head: &[u8] = if on_stack {
                e.sink().written()
            } else {
                vec = header.to_vec_reserving(0).map_err(|e| local(LocalError::Header(e)))?;
                &vec
            };
            let len = head.len() + payload.len();
            let send_pair = self.pool.take_send(&self.pd, len).map_err(|e| local(e.into()))?;
            let send_mr = &send_pair.0;
            let _ = send_mr.write(0, head);
            let _ = send_mr.write(head.len(), payload);
            wrs.push(SendWr::new(
                wrid::SEND | u64::from(xid),
                WrOpcode::Send,
                vec![send_mr.sge(0, len as u32)],
            ));
            st.pending.insert(
                xid,
                Pending {
                    lists: call_lists,
                    stags,
                    tx,
                    result: None,
                    following: false,
                },
            );
            // The Send is posted with the lock released: `post_send` drives the provider
            // inline, and what it sends may be a 1 MiB RDMA Read Response of another call
            // (an NFS WRITE's Read chunk that the server pulls), all that time the other
            // callers would sleep on this lock (issues 17/18, session 15). The RPC is in
            // `pending` already, so its Reply may be delivered before `post_send` returns.
            drop(st);
            if let Err(e) = self.qp.post_send(&wrs) {
                let mut st = self.state.lock().unwrap();
                if st.pending.remove(&xid).is_some() {
                    let g = st.credits.granted();
                    let _ = st.credits.on_reply(g);
                }
                // RPCR-MEM-04: the RPC fails at once
                return Err(Fail::Retry(RpcError::Disconnected(e.into())));
            }
            // keep the send buffer until the RPC ends
            let Some(r) = self.await_reply(xid, &rx, deadline, spin) else {
                self.state.lock().unwrap().pending.remove(&xid);
                return Err(Fail::Retry(RpcError::Timeout));
            };
            // a Reply or RDMA_ERROR arrived: the Send was delivered and every
            // STag of this RPC is invalid again, so the memory can be reused
            let delivered = matches!(&r, Ok(_) | Err(RpcError::RdmaError(_)));
            if delivered {
                self.pool.give(send_pair);
                for reg in [&mut read_region, &mut write_region].into_iter().flatten() {
                    reg.reusable = true;
                }
            }
            drop(read_region);
            match r {
                Ok(msg) => Ok(Done { msg, write_region }),
                Err(e @ RpcError::Disconnected(_)) | Err(e @ RpcError::Timeout) => Err(Fail::Retry(e)),
                Err(e) => Err(Fail::Fatal(e)),
            }
        }
    }

    /// Waits for the outcome of the RPC whose channel is `rx`: polls the CQ itself when no
    /// other caller does, otherwise waits for the poller to hand the Reply (or its turn) over.
    /// `None` when `deadline` passes.
    fn await_reply(&self, xid: u32, rx: &Receiver<Msg>, deadline: Instant, spin: Duration) -> Option<Outcome> {
        let me = std::thread::current().id();
        loop {
            match rx.try_recv() {
                Ok(Msg::Done(r)) => return Some(r),
                Ok(Msg::Lead) | Err(Empty::Now) => {}
                Err(Empty::Disconnected) => return Some(Err(RpcError::Disconnected(Disconnect::Closed))),
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let mut st = self.state.lock().unwrap();
            match st.leader {
                Leader::Caller(_) => {
                    // a follower: mark our RPC so the leader hands us its turn when it leaves
                    let Some(p) = st.pending.get_mut(&xid) else {
                        // delivered meanwhile (the outcome is in the channel)
                        continue;
                    };
                    p.following = true;
                    drop(st);
                    match rx.recv_timeout(deadline - now) {
                        Ok(Msg::Done(r)) => return Some(r),
                        Ok(Msg::Lead) => continue,
                        Err(Empty::Now) => return None,
                        Err(Empty::Disconnected) => {
                            return Some(Err(RpcError::Disconnected(Disconnect::Closed)));
                        }
                    }
                }
                prev => {
                    st.leader = Leader::Caller(me);
                    drop(st);
                    if prev == Leader::Progress {
                        // the progress thread leaves the CQ to us
                        self.cq.interrupt();
                    }
                    let r = self.lead(rx, deadline, spin);
                    self.resign(me);
                    return r;
                }
            }
        }
    }

    /// Polls the CQ for every caller until this caller's outcome is in `rx` (or `deadline`),
    /// busy-polling `spin` before each sleep.
    fn lead(&self, rx: &Receiver<Msg>, deadline: Instant, spin: Duration) -> Option<Outcome> {
        // Busy-poll mode (`reply_spin == Duration::MAX`): this caller polls the CQ until its
        // outcome is in, and says so to the provider, which then leaves the QP's receive to
        // it for the whole call rather than waking its own thread for the Reply whenever
        // the spin was preempted (issue 18, session 17: ~0.8 progress-thread wake-ups per
        // busy NULL call before). The declaration ends with this call's lead.
        let _declared = (spin == Duration::MAX).then(|| self.cq.declare_spin());
        loop {
            match rx.try_recv() {
                Ok(Msg::Done(r)) => return Some(r),
                Ok(Msg::Lead) | Err(Empty::Now) => {}
                Err(Empty::Disconnected) => return Some(Err(RpcError::Disconnected(Disconnect::Closed))),
            }
            if let Some(d) = &self.state.lock().unwrap().dead {
                return Some(Err(RpcError::Disconnected(d.clone())));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let slice = (deadline - now).min(POLL_SLICE);
            // busy-polls at most the slice, so the deadline and the CM events are still seen
            let spin = spin.min(slice);
            self.pool.waits.fetch_add(1, Ordering::Relaxed);
            if !spin.is_zero() {
                self.pool.spun.fetch_add(1, Ordering::Relaxed);
            }
            let r = match self.cq.wait_spin(spin, Some(slice)) {
                Some(wc) => self.on_completion(wc),
                None => self.check_event(),
            };
            if let Err(why) = r {
                tracing::debug!("rpcrdma client connection ends: {why}");
                self.qp.disconnect();
                self.fail_all(why);
            }
        }
    }

    /// The leading caller has its outcome: the next waiting caller (if any) leads.
    fn resign(&self, me: ThreadId) {
        let mut st = self.state.lock().unwrap();
        if st.leader == Leader::Caller(me) {
            st.leader = Leader::None;
        }
        if let Some(p) = st.pending.values_mut().find(|p| p.following) {
            p.following = false;
            let _ = p.tx.try_send(Msg::Lead);
        }
    }

    /// A CM event other than Established ends the connection.
    fn check_event(&self) -> Result<(), Disconnect> {
        match self.qp.get_event(Some(Duration::ZERO)) {
            None | Some(CmEvent::Established) => Ok(()),
            Some(other) => Err(Disconnect::Event(other)),
        }
    }

    /// Polls the CQ while no caller does (reverse-direction Calls, completions nobody waits
    /// for) and looks at the CM events; sleeps while a caller polls.
    fn progress_loop(self: Arc<Self>) {
        let why = loop {
            if self.stop.load(Ordering::Acquire) {
                break Disconnect::Closed;
            }
            {
                let mut st = self.state.lock().unwrap();
                if let Some(d) = &st.dead {
                    break d.clone();
                }
                if let Leader::Caller(_) = st.leader {
                    drop(self.idle.wait_timeout(st, POLL_SLICE).unwrap());
                    if let Err(e) = self.check_event() {
                        break e;
                    }
                    continue;
                }
                st.leader = Leader::Progress;
            }
            let wc = self.cq.wait(Some(POLL_SLICE));
            let taken_over = {
                let mut st = self.state.lock().unwrap();
                let taken = st.leader != Leader::Progress;
                if !taken {
                    st.leader = Leader::None;
                }
                taken
            };
            let had = wc.is_some();
            let r = match wc {
                Some(wc) => self.on_completion(wc),
                None => self.check_event(),
            };
            if let Err(e) = r {
                break e;
            }
            if taken_over && had {
                // a caller took over while we held a completion: it may sleep in the CQ with
                // its Reply handed to its channel
                self.cq.interrupt();
            }
        };
        tracing::debug!("rpcrdma client connection ends: {why}");
        self.qp.disconnect();
        self.fail_all(why);
    }

    fn on_completion(&self, wc: WorkCompletion) -> Result<(), Disconnect> {
        if wc.status != WcStatus::Success {
            // any failed operation ends the connection (RPCR-MEM-02, RPCR-MEM-05)
            return Err(Disconnect::WorkRequest {
                opcode: wc.opcode,
                status: wc.status,
                wr_id: wc.wr_id,
            });
        }
        match wc.wr_id & wrid::KIND {
            wrid::RECV => {
                let slot = (wc.wr_id & !wrid::KIND) as usize;
                let off = slot * self.recv_size;
                let msg = self
                    .recv_mr
                    .to_vec(off, (wc.byte_len as usize).min(self.recv_size))
                    .map_err(|_| Disconnect::ReceiveSlot(slot))?;
                self.qp
                    .post_recv(&[RecvWr {
                        wr_id: wc.wr_id,
                        sg_list: vec![self.recv_mr.sge(off, self.recv_size as u32)],
                    }])
                    .map_err(Disconnect::from)?;
                if let Some(reg) = &self.backchannel
                    && let kind @ super::backchannel::Kind::Call { .. } = super::backchannel::classify(&msg)
                {
                    return self.answer_reverse_call(reg, kind);
                }
                let inv = (wc.opcode == WcOpcode::Recv).then_some(wc.invalidated_rkey).flatten();
                self.on_reply(msg, inv)
            }
            wrid::BC_SEND => {
                self.bc_sends.lock().unwrap().remove(&wc.wr_id);
                Ok(())
            }
            wrid::INV => {
                let xid = (wc.wr_id & 0xffff_ffff) as u32;
                let mut st = self.state.lock().unwrap();
                if let Some(p) = st.pending.get_mut(&xid) {
                    let r = p.result.take().unwrap_or(Err(RpcError::Timeout));
                    st.deliver(&self.pool, xid, r);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// RFC 8167 §5.2: answer a reverse-direction Call with a Short Reply.
    fn answer_reverse_call(
        &self,
        reg: &crate::server::Registry,
        kind: super::backchannel::Kind<'_>,
    ) -> Result<(), Disconnect> {
        let Some(m) = super::backchannel::answer(reg, kind, self.neg.thresholds.call as usize) else {
            return Ok(());
        };
        let pair = self.pool.take_send(&self.pd, m.len())?;
        pair.0.write(0, &m).map_err(verbs::Error::from)?;
        let id = wrid::BC_SEND | (self.bc_next.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff);
        let wr = SendWr::new(id, WrOpcode::Send, vec![pair.0.sge(0, m.len() as u32)]);
        self.bc_sends.lock().unwrap().insert(id, pair);
        Ok(self.qp.post_send(&[wr])?)
    }

    /// A Reply (or RDMA_ERROR) `msg`, copied out of its receive buffer: validated, and on
    /// success handed to its caller as it is (no second copy).
    fn on_reply(&self, msg: Vec<u8>, invalidated: Option<u32>) -> Result<(), Disconnect> {
        let mut st = self.state.lock().unwrap();
        let decision = validate_reply(&msg, &Limits::default(), |x| st.pending.get(&x).map(|p| &p.lists));
        let (xid, credit, outcome) = match decision {
            RequesterDecision::Process(vr) => {
                let (xid, credit) = (vr.header.xid, vr.header.credit);
                drop(vr);
                (xid, credit, Ok(msg))
            }
            RequesterDecision::RpcFailed { xid, credit, error } => (xid, credit, Err(RpcError::RdmaError(error))),
            RequesterDecision::Drop(reason) => {
                // RPCR-ERR-03/06, B.4.5 #17/#18/#20: silently discarded
                tracing::debug!(?reason, "rpcrdma client: reply dropped");
                return Ok(());
            }
        };
        // RPCR-CRD-02/03: absolute grant, 0 counts as 1
        let _ = st.credits.on_reply(credit);
        // a condition variable's notify is a system call even with nobody waiting (issue 18)
        if st.credit_waiters > 0 {
            self.cv.notify_all();
        }
        let Some(p) = st.pending.get_mut(&xid) else {
            return Ok(());
        };
        p.stags.retain(|s| Some(*s) != invalidated);
        if p.stags.is_empty() {
            st.deliver(&self.pool, xid, outcome);
            return Ok(());
        }
        // RPCR-MEM-01/SEC-04: invalidate before the RPC completes
        let n = p.stags.len();
        let wrs: Vec<SendWr> = p
            .stags
            .iter()
            .enumerate()
            .map(|(i, &rkey)| {
                let w = SendWr::new(wrid::INV | u64::from(xid), WrOpcode::LocalInv { rkey }, vec![]);
                if i + 1 == n { w } else { w.flags(SendFlags::empty()) }
            })
            .collect();
        p.result = Some(outcome);
        // posted with the lock released, as the Call's Send (`call_once`): the INV
        // completion takes `result` under the lock
        drop(st);
        Ok(self.qp.post_send(&wrs)?)
    }
}

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

impl crate::client::RpcClient for RdmaClient {
    fn call<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, RpcError> {
        RdmaClient::call(self, call, decode)
    }
}
