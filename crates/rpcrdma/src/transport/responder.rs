//! The Responder (RPC server) on verbs: one thread per connection, Calls
//! answered in arrival order.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use verbs::{
    Access, CmEvent, CompletionQueue, ConnectRequest, Device, MemoryRegion, ProtectionDomain, QpOptions, QueuePair,
    RecvWr, RemoteAddr, SendFlags, SendWr, WcStatus, WorkCompletion, WrOpcode,
};

use super::backchannel::{self, BC_CREDITS, Backchannel};
use super::{RdmaConfig, wrid};
use crate::credits::ResponderCredits;
use crate::inline::{ReplyForm, Thresholds, plan_reply};
use crate::private_data::{PrivateData, Side, negotiate};
use crate::server::{Dispatch, Registry, dispatch};
use crate::validate::{
    CallPayload, FailedXids, ResponderDecision, ResponderPolicy, check_payload_xid, garbage_args_message, validate_call,
};
use crate::wire::chunks::ReadChunk;
use crate::wire::{ChunkLists, ErrorBody, FixedHeader, Header, Limits, Segment};
use crate::xdr::{ChunkSource, Decoder, InsertedChunk};

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
}

/// A running RPC-over-RDMA server.
pub struct RdmaServer {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<std::sync::Weak<backchannel::Shared>>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<ServerStats>,
    accept: Option<JoinHandle<()>>,
}

impl RdmaServer {
    /// Listen on `addr` of `dev` and serve `registry` until dropped.
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
        let conns: Arc<Mutex<Vec<std::sync::Weak<backchannel::Shared>>>> = Arc::default();
        let (stop2, stats2, dev, conns2) = (stop.clone(), stats.clone(), dev.clone(), conns.clone());
        let accept = std::thread::Builder::new()
            .name("rpcrdma-accept".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    let Ok(req) = listener.get_request(Some(Duration::from_millis(50))) else {
                        continue;
                    };
                    let (reg, cfg, recovery, stop, stats, conns) = (
                        registry.clone(),
                        cfg.clone(),
                        recovery.clone(),
                        stop2.clone(),
                        stats2.clone(),
                        conns2.clone(),
                    );
                    let pd = dev.alloc_pd();
                    let _ = std::thread::Builder::new()
                        .name("rpcrdma-server".into())
                        .spawn(move || {
                            if let Err(e) = serve(req, &pd, reg, cfg, recovery, stop, stats, &conns) {
                                tracing::debug!("rpcrdma server connection: {e}");
                            }
                        });
                }
            })
            .map_err(verbs::Error::Io)?;
        Ok(RdmaServer {
            addr,
            conns,
            stop,
            stats,
            accept: Some(accept),
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
        }
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Why a connection ends.
type Fatal = String;

struct Conn {
    qp: Arc<QueuePair>,
    bc: Arc<backchannel::Shared>,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    th: Thresholds,
    remote_inv: bool,
    recv_mr: MemoryRegion,
    recv_size: usize,
    posted: u32,
    credits: ResponderCredits,
    overrun: bool,
    policy: ResponderPolicy,
    registry: Arc<Registry>,
    recovery: Arc<Recovery>,
    backlog: VecDeque<WorkCompletion>,
    /// XIDs of the latest Calls whose chunks we read or whose Replies wrote into the
    /// Requester's memory (at most `RECENT_RDMA`): if the connection then ends with a
    /// Terminate from the Requester, one of those RDMA operations met a bad chunk, and their
    /// retransmissions get ERR_CHUNK (RPCR-MEM-05).
    recent_rdma: VecDeque<u32>,
    /// This connection's serial in [`Recovery::unsettled`].
    serial: u64,
    stage: Option<MemoryRegion>,
    send_mr: MemoryRegion,
    next_wr: u64,
    timeout: Duration,
    stop: Arc<AtomicBool>,
    stats: Arc<ServerStats>,
}

/// How many XIDs with RDMA Reads or Writes a connection remembers for RPCR-MEM-05.
const RECENT_RDMA: usize = 64;

/// What the connections of one server share for RFC 8166 §4.5.3 (RPCR-MEM-05).
struct Recovery {
    /// XIDs whose RDMA operations failed: their retransmissions get ERR_CHUNK.
    failed: Mutex<FailedXids>,
    /// XIDs whose chunks were read or whose Replies wrote into Requester memory, by the serial
    /// of the connection that did it, while that connection lives. A retransmission of one of them on another
    /// connection waits (up to [`SETTLE`]) until the first connection has ended and its fate
    /// is known: ended by a Terminate, the XID is in `failed`.
    unsettled: Mutex<std::collections::HashMap<u32, u64>>,
    settled: std::sync::Condvar,
    serials: AtomicU64,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            failed: Mutex::new(FailedXids::new(1024)),
            unsettled: Mutex::default(),
            settled: std::sync::Condvar::new(),
            serials: AtomicU64::new(1),
        }
    }
}

/// The longest a retransmission waits for the connection that first answered it to end.
const SETTLE: Duration = Duration::from_secs(2);

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
        self.settled.notify_all();
    }

    /// Before `xid` is validated on connection `serial`: wait while another live connection
    /// holds it as unsettled.
    fn wait_settled(&self, xid: u32, serial: u64) {
        let u = self.unsettled.lock().unwrap();
        let (_u, t) = self
            .settled
            .wait_timeout_while(u, SETTLE, |u| u.get(&xid).is_some_and(|&s| s != serial))
            .unwrap();
        if t.timed_out() {
            tracing::debug!(xid, "rpcrdma server: retransmission while its first connection lives");
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn serve(
    req: ConnectRequest,
    pd: &ProtectionDomain,
    registry: Arc<Registry>,
    cfg: RdmaConfig,
    recovery: Arc<Recovery>,
    stop: Arc<AtomicBool>,
    stats: Arc<ServerStats>,
    conns: &Mutex<Vec<std::sync::Weak<backchannel::Shared>>>,
) -> Result<(), Fatal> {
    let e = |e: verbs::Error| e.to_string();
    let credits = cfg.credits.max(1);
    let peer = PrivateData::find(req.private_data());
    let local =
        PrivateData::new(cfg.inline_send, cfg.inline_recv, cfg.remote_invalidation).map_err(|e| e.to_string())?;
    let mine = if cfg.private_data {
        local
    } else {
        PrivateData::default()
    };
    let neg = negotiate(Side::Server, &mine, peer.as_ref());
    let cq = pd.device().create_cq(8 * credits as usize + 64).map_err(e)?;
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
    let mut opts = QpOptions::new(&cq)
        .rd_atomic(cfg.rd_atomic, cfg.rd_atomic)
        .post_recv(recvs);
    opts.attr.max_recv_wr = opts.attr.max_recv_wr.max(slots);
    if cfg.private_data {
        opts = opts.private_data(&local.encode());
    }
    let qp = Arc::new(req.accept(pd, opts).map_err(e)?);
    let bc = backchannel::Shared::new(qp.clone(), pd.clone(), neg.thresholds);
    conns.lock().unwrap().push(Arc::downgrade(&bc));
    stats.connections.fetch_add(1, Ordering::Relaxed);
    let send_mr = pd
        .reg_mr(neg.thresholds.reply.max(1024) as usize, Access::LOCAL_WRITE)
        .map_err(e)?;
    let serial = recovery.serials.fetch_add(1, Ordering::Relaxed);
    let mut c = Conn {
        qp,
        bc,
        cq,
        pd: pd.clone(),
        th: neg.thresholds,
        remote_inv: neg.remote_invalidation,
        recv_mr,
        recv_size,
        posted: credits,
        credits: ResponderCredits::new(credits),
        overrun: false,
        policy: ResponderPolicy {
            limits: Limits::default(),
            max_chunk: cfg.max_chunk,
        },
        registry,
        recovery,
        backlog: VecDeque::new(),
        recent_rdma: VecDeque::new(),
        serial,
        stage: None,
        send_mr,
        next_wr: 1,
        timeout: cfg.timeout,
        stop,
        stats,
    };
    let r = c.run();
    // the fate of this connection's RDMA Reads and Writes is known now (recorded as failed by a Terminate)
    c.recovery.settle(&c.recent_rdma, c.serial);
    c.bc.close();
    if r.is_err() {
        c.stats.fatal.fetch_add(1, Ordering::Relaxed);
    }
    c.qp.disconnect();
    r
}

impl Conn {
    fn run(&mut self) -> Result<(), Fatal> {
        loop {
            let wc = match self.backlog.pop_front() {
                Some(wc) => wc,
                None => match self.poll(Duration::from_millis(50))? {
                    Some(wc) => wc,
                    None => {
                        if self.stop.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        if let Some(ev) = self.qp.get_event(Some(Duration::ZERO)) {
                            match ev {
                                CmEvent::Established => {}
                                CmEvent::Disconnected => return Ok(()),
                                other => return Err(self.ended_by(other)),
                            }
                        }
                        continue;
                    }
                },
            };
            if wc.status != WcStatus::Success {
                if wc.status == WcStatus::WrFlushErr {
                    // flushed: closed by the peer, or a Terminate put the QP in error
                    while let Some(ev) = self.qp.get_event(Some(Duration::ZERO)) {
                        if !matches!(ev, CmEvent::Established | CmEvent::Disconnected) {
                            return Err(self.ended_by(ev));
                        }
                    }
                    return Ok(());
                }
                return Err(format!("receive failed: {}", wc.status));
            }
            let slot = (wc.wr_id & !wrid::KIND) as usize;
            let off = slot * self.recv_size;
            let msg = self
                .recv_mr
                .to_vec(off, (wc.byte_len as usize).min(self.recv_size))
                .map_err(|_| "receive slot".to_string())?;
            self.qp
                .post_recv(&[RecvWr {
                    wr_id: wc.wr_id,
                    sg_list: vec![self.recv_mr.sge(off, self.recv_size as u32)],
                }])
                .map_err(|e| e.to_string())?;
            if let backchannel::Kind::Reply { xid, payload } = backchannel::classify(&msg) {
                // RFC 8167: a reverse-direction Reply, not a forward Call
                if !self.bc.deliver(xid, payload) {
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            if self.overrun {
                // more Calls than granted (RPCR-CRD-01 violated by the peer)
                return Err("credit overrun by the requester".into());
            }
            self.on_message(&msg)?;
        }
    }

    /// `xid`'s RDMA Reads or Writes are about to touch the Requester's memory: until this
    /// connection ends, a retransmission of it on another connection waits for its fate.
    fn note_rdma(&mut self, xid: u32) {
        if self.recent_rdma.contains(&xid) {
            return;
        }
        if self.recent_rdma.len() == RECENT_RDMA
            && let Some(old) = self.recent_rdma.pop_front()
        {
            self.recovery.settle([&old], self.serial);
        }
        self.recent_rdma.push_back(xid);
        self.recovery.unsettle(xid, self.serial);
    }

    /// The connection ended with `ev`. A Terminate from the Requester means one of our RDMA
    /// operations met memory it does not accept (RFC 8166 §4.5.3): the Writes of the latest
    /// Replies are the candidates, so their XIDs get ERR_CHUNK when retransmitted (RPCR-MEM-05).
    /// A Requester that got its Reply does not retransmit, so this costs the others nothing.
    fn ended_by(&mut self, ev: CmEvent) -> Fatal {
        if matches!(ev, CmEvent::TerminateReceived(_)) && !self.recent_rdma.is_empty() {
            let mut failed = self.recovery.lock();
            for &xid in &self.recent_rdma {
                failed.record(xid);
            }
            tracing::debug!(xids = ?self.recent_rdma, "rpcrdma server: Terminate after RDMA on chunks");
        }
        format!("{ev:?}")
    }

    /// One completion; Receives (arrivals) are counted against the grant and kept for later.
    fn poll(&mut self, timeout: Duration) -> Result<Option<WorkCompletion>, Fatal> {
        let Some(wc) = self.cq.wait(Some(timeout)) else {
            return Ok(None);
        };
        if wc.wr_id & wrid::KIND == wrid::RECV && wc.status == WcStatus::Success {
            // reverse-direction Replies have their own receives and are not Calls (RFC 8167 §4.1)
            let slot = (wc.wr_id & !wrid::KIND) as usize;
            let head = self
                .recv_mr
                .to_vec(slot * self.recv_size, (wc.byte_len as usize).min(36))
                .unwrap_or_default();
            if !backchannel::looks_like_reverse_reply(&head) && self.credits.on_call().is_err() {
                self.overrun = true;
            }
        }
        Ok(Some(wc))
    }

    /// Wait for the completion of work request `id`, keeping arrivals.
    fn wait_for(&mut self, id: u64) -> Result<(), Fatal> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let Some(wc) = self.poll(Duration::from_millis(20))? else {
                if Instant::now() > deadline {
                    return Err("RDMA operation timed out".into());
                }
                continue;
            };
            if wc.wr_id & wrid::KIND == wrid::RECV {
                if wc.status != WcStatus::Success {
                    return Err(format!("receive failed: {}", wc.status));
                }
                self.backlog.push_back(wc);
                continue;
            }
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "{:?} failed: {} (vendor {:#x})",
                    wc.opcode, wc.status, wc.vendor_err
                ));
            }
            if wc.wr_id == id {
                return Ok(());
            }
        }
    }

    fn wr(&mut self, kind: u64) -> u64 {
        self.next_wr += 1;
        kind | (self.next_wr & 0xffff_ffff_ffff)
    }

    fn stage(&mut self, len: usize) -> Result<&MemoryRegion, Fatal> {
        if self.stage.as_ref().is_none_or(|m| m.len() < len) {
            let m = self
                .pd
                .reg_mr(len.next_power_of_two().max(4096), Access::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            self.stage = Some(m);
        }
        Ok(self.stage.as_ref().expect("just set"))
    }

    fn on_message(&mut self, msg: &[u8]) -> Result<(), Fatal> {
        let decision = {
            if let Some(x) = msg.get(..4) {
                let xid = u32::from_be_bytes(x.try_into().expect("4 bytes"));
                self.recovery.wait_settled(xid, self.serial);
            }
            let failed = self.recovery.lock();
            validate_call(msg, &self.policy, &failed)
        };
        match decision {
            ResponderDecision::Drop(reason) => {
                // RPCR-ERR-01/08/11: no answer, connection stays
                tracing::debug!(?reason, "rpcrdma server: message dropped");
                self.credits.on_call_dropped();
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            ResponderDecision::SendError { failed, err, reason } => {
                tracing::debug!(?reason, xid = failed.xid, "rpcrdma server: RDMA_ERROR");
                self.send_error(&failed, err)
            }
            ResponderDecision::Process(vc) => {
                let fixed = FixedHeader::parse(msg).ok_or("short")?;
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
                    self.note_rdma(xid);
                }
                let pulled = match self.pull(&chunks) {
                    Ok(p) => p,
                    Err(e) => {
                        // RPCR-MEM-05: remember the XID; its retransmission gets ERR_CHUNK
                        self.recovery.lock().record(xid);
                        return Err(e);
                    }
                };
                let mut parts: Vec<&[u8]> = Vec::with_capacity(chunks.len());
                let mut at = 0;
                for c in &chunks {
                    let n = c.total_len() as usize;
                    parts.push(&pulled[at..at + n]);
                    at += n;
                }
                let (base, rest): (&[u8], &[&[u8]]) = match &vc.payload {
                    CallPayload::Inline(p) => (p, &parts),
                    CallPayload::PositionZero(_) => {
                        if check_payload_xid(xid, parts[0]).is_err() {
                            return self.send_error(&fixed, ErrorBody::Chunk);
                        }
                        (parts[0], &parts[1..])
                    }
                };
                let inserted: Vec<InsertedChunk<'_>> = vc
                    .read_chunks
                    .iter()
                    .zip(rest)
                    .map(|(c, d)| InsertedChunk {
                        position: c.position,
                        data: d,
                    })
                    .collect();
                let lists = vc.lists().clone();
                let mut dec = Decoder::with_chunks(base, ChunkSource::Read(&inserted));
                match dispatch(&self.registry, &mut dec, "rdma") {
                    Dispatch::Reply { stream, items, .. } => self.send_reply(&fixed, &lists, &stream, &items),
                    // RPCR-DDP-07, B.4.5 #14: a non-eligible item was reduced
                    Dispatch::ChunkError { .. } => self.send_error(&fixed, ErrorBody::Chunk),
                    // RPCR-ERR-09: the Payload stream is not a decodable Call
                    Dispatch::Drop => {
                        let grant = self.grant()?;
                        let m = garbage_args_message(xid, grant, &lists);
                        self.send(&m, &[], None, &[], xid)
                    }
                }
            }
        }
    }

    fn grant(&mut self) -> Result<u32, Fatal> {
        // RPCR-CRD-02/04: never 0, never more than the receives posted
        self.credits.on_reply(self.posted).map_err(|e| e.to_string())
    }

    fn send_error(&mut self, failed: &FixedHeader, err: ErrorBody) -> Result<(), Fatal> {
        let grant = self.grant()?;
        let h = Header::error_reply(failed, grant, err);
        let mut e = crate::xdr::Encoder::new(Vec::new());
        h.encode(&mut e).map_err(|e| e.to_string())?;
        self.stats.rdma_errors.fetch_add(1, Ordering::Relaxed);
        self.send(&e.finish().0, &[], None, &[], failed.xid)
    }

    /// RDMA Read every chunk into the stage, in order; returns the bytes.
    fn pull(&mut self, chunks: &[&ReadChunk]) -> Result<Vec<u8>, Fatal> {
        let total: usize = chunks.iter().map(|c| c.total_len() as usize).sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        let mut wrs = Vec::new();
        let mut off = 0usize;
        let segs: Vec<Segment> = chunks.iter().flat_map(|c| c.segments.iter().copied()).collect();
        let last = self.wr(wrid::READ);
        let stage = self.stage(total)?;
        for (i, s) in segs.iter().enumerate() {
            if s.length == 0 {
                continue;
            }
            let w = SendWr::new(
                last,
                WrOpcode::RdmaRead {
                    remote: RemoteAddr {
                        addr: s.offset,
                        rkey: s.handle,
                    },
                },
                vec![stage.sge(off, s.length)],
            );
            wrs.push(if i + 1 == segs.len() {
                w
            } else {
                w.flags(SendFlags::empty())
            });
            off += s.length as usize;
        }
        if let Some(l) = wrs.last_mut() {
            l.flags = SendFlags::SIGNALED;
        }
        self.qp.post_send(&wrs).map_err(|e| e.to_string())?;
        self.wait_for(last)?;
        self.stage(total)?.to_vec(0, total).map_err(|_| "stage".to_string())
    }

    fn send_reply(
        &mut self,
        fixed: &FixedHeader,
        lists: &ChunkLists,
        stream: &[u8],
        items: &[crate::xdr::DdpItem],
    ) -> Result<(), Fatal> {
        let grant = self.grant()?;
        let pr = match plan_reply(&self.th, fixed.xid, grant, stream, items, lists) {
            Ok(p) => p,
            Err(e) => {
                // write chunk or reply chunk too small, or no reply chunk for a
                // long reply: ERR_CHUNK (requirements B.5 #6)
                tracing::debug!(xid = fixed.xid, "rpcrdma server: cannot reply: {e}");
                let h = Header::error_reply(fixed, grant, ErrorBody::Chunk);
                self.stats.rdma_errors.fetch_add(1, Ordering::Relaxed);
                return self.send(&h.to_vec().map_err(|e| e.to_string())?, &[], None, &[], fixed.xid);
            }
        };
        let mut msg = pr.header.to_vec().map_err(|e| e.to_string())?;
        let writes: Vec<(u32, u64, std::ops::Range<usize>)> = pr
            .item_writes
            .iter()
            .map(|w| (w.handle, w.remote_offset, w.src.clone()))
            .chain(pr.payload_writes.iter().map(|w| {
                (
                    w.handle,
                    w.remote_offset,
                    stream.len() + w.src.start..stream.len() + w.src.end,
                )
            }))
            .collect();
        let staged: Vec<&[u8]> = if writes.is_empty() {
            vec![]
        } else if pr.form == ReplyForm::Long {
            vec![stream, &pr.payload]
        } else {
            vec![stream]
        };
        if pr.form == ReplyForm::Short {
            msg.extend_from_slice(&pr.payload);
        }
        // Send With Invalidate when every segment of the lists names one STag
        let mut handles = lists
            .reads
            .iter()
            .map(|r| r.target.handle)
            .chain(lists.writes.iter().flat_map(|w| w.segments.iter().map(|s| s.handle)))
            .chain(lists.reply.iter().flat_map(|w| w.segments.iter().map(|s| s.handle)));
        let inv = match handles.next() {
            Some(h) if self.remote_inv && handles.all(|x| x == h) => Some(h),
            _ => None,
        };
        self.stats.replies.fetch_add(1, Ordering::Relaxed);
        let form = match (pr.form, pr.item_writes.is_empty()) {
            (ReplyForm::Long, _) => &self.stats.replies_long,
            (_, true) => &self.stats.replies_inline,
            (_, false) => &self.stats.replies_write_chunks,
        };
        form.fetch_add(1, Ordering::Relaxed);
        self.send(&msg, &staged, inv, &writes, fixed.xid)
    }

    /// Post the RDMA Writes (from `staged` concatenated), then the Send, and wait for it.
    fn send(
        &mut self,
        msg: &[u8],
        staged: &[&[u8]],
        inv: Option<u32>,
        writes: &[(u32, u64, std::ops::Range<usize>)],
        xid: u32,
    ) -> Result<(), Fatal> {
        if msg.len() > self.send_mr.len() || msg.len() > self.th.reply as usize {
            return Err(format!("reply of {} bytes exceeds the inline threshold", msg.len()));
        }
        if !writes.is_empty() {
            self.note_rdma(xid);
        }
        let mut wrs = Vec::with_capacity(writes.len() + 1);
        if !writes.is_empty() {
            let total: usize = staged.iter().map(|s| s.len()).sum();
            let stage = self.stage(total)?;
            let mut at = 0;
            for s in staged {
                stage.write(at, s).map_err(|_| "stage".to_string())?;
                at += s.len();
            }
            let stage = self.stage.as_ref().expect("staged");
            for (handle, addr, src) in writes {
                wrs.push(
                    SendWr::new(
                        wrid::WRITE,
                        WrOpcode::RdmaWrite {
                            remote: RemoteAddr {
                                addr: *addr,
                                rkey: *handle,
                            },
                        },
                        vec![stage.sge(src.start, src.len() as u32)],
                    )
                    .flags(SendFlags::empty()),
                );
            }
        }
        self.send_mr.write(0, msg).map_err(|_| "send buffer".to_string())?;
        let id = self.wr(wrid::SEND);
        let opcode = match inv {
            Some(rkey) => {
                self.stats.remote_invalidations.fetch_add(1, Ordering::Relaxed);
                WrOpcode::SendWithInv { invalidate_rkey: rkey }
            }
            None => WrOpcode::Send,
        };
        wrs.push(SendWr::new(id, opcode, vec![self.send_mr.sge(0, msg.len() as u32)]));
        // RPCR-MEM-03: a reply we cannot transmit ends the connection
        self.qp.post_send(&wrs).map_err(|e| e.to_string())?;
        if let Err(e) = self.wait_for(id) {
            if !writes.is_empty() {
                self.recovery.lock().record(xid);
            }
            return Err(e);
        }
        Ok(())
    }
}
