//! A connection's send side: the Replies of its Calls, their send buffers and credits, shared
//! by the connection's worker and the I/O pool threads that run its procedures. The thread
//! that has a Reply posts it (issue 18: a procedure's Reply used to go back to the worker,
//! one more wake-up per call); the worker only takes the Sends' completions.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use verbs::{
    Access, MemoryRegion, ProtectionDomain, QueuePair, RemoteAddr, SendFlags, SendWr, WcStatus, WorkCompletion,
    WrOpcode,
};

use super::{
    Budget, Charge, Fatal, Held, InFlight, MAX_SEND_WRS, Outcome, Outgoing, RECENT_RDMA, Recovery, ServerStats,
    WriteSource, system_err, wrid,
};
use crate::credits::ResponderCredits;
use crate::inline::{ReplyForm, Thresholds, plan_reply};
use crate::validate::garbage_args_message;
use crate::wire::{ChunkLists, ErrorBody, FixedHeader, Header};

/// What of a connection's send side changes: under [`Replier::tx`].
pub(super) struct Tx {
    pub(super) credits: ResponderCredits,
    /// Send buffers not under a posted Send.
    free_slots: Vec<usize>,
    /// Replies posted whose Send has not completed, in the order posted.
    pub(super) sending: VecDeque<InFlight>,
    /// Replies waiting for a send buffer (at most one per Call in flight: the credits bound them).
    queued: VecDeque<Outgoing>,
    /// Work requests of `sending` on the send queue.
    send_wrs: usize,
    /// XIDs of the latest Calls whose chunks we read or whose Replies wrote into the
    /// Requester's memory (at most `RECENT_RDMA`): if the connection then ends with a
    /// Terminate from the Requester, one of those RDMA operations met a bad chunk, and their
    /// retransmissions get ERR_CHUNK (RPCR-MEM-05).
    pub(super) recent_rdma: VecDeque<u32>,
    /// A thread is posting queued Replies with this lock released (see
    /// [`Replier::post_queued`]): a Reply queued meanwhile is posted by that thread.
    posting: bool,
}

/// What [`Replier::on_sent`] found.
pub(super) enum Sent {
    /// No Reply of ours has this work request id.
    Unknown,
    /// The Reply's memory, for the worker to keep (a stage) or release.
    Done(Held),
    /// The Send failed.
    Failed { xid: u32, writes: bool },
}

/// A connection's send side, shared by its worker and the pool threads running its Calls.
pub(super) struct Replier {
    pub(super) qp: Arc<QueuePair>,
    pub(super) qpn: u32,
    pd: ProtectionDomain,
    pub(super) th: Thresholds,
    remote_inv: bool,
    /// Receives posted (the most a grant may be).
    posted: u32,
    /// [`super::SEND_SLOTS`] send buffers of `slot_len` octets each.
    send_mr: MemoryRegion,
    slot_len: usize,
    timeout: Duration,
    budget: Arc<Budget>,
    stats: Arc<ServerStats>,
    recovery: Arc<Recovery>,
    /// This connection's serial in [`Recovery::unsettled`].
    serial: u64,
    next_wr: AtomicU64,
    tx: Mutex<Tx>,
}

impl Replier {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        qp: Arc<QueuePair>,
        pd: ProtectionDomain,
        th: Thresholds,
        remote_inv: bool,
        credits: u32,
        send_mr: MemoryRegion,
        slot_len: usize,
        slots: usize,
        timeout: Duration,
        budget: Arc<Budget>,
        stats: Arc<ServerStats>,
        recovery: Arc<Recovery>,
        serial: u64,
    ) -> Replier {
        Replier {
            qpn: qp.qp_num(),
            qp,
            pd,
            th,
            remote_inv,
            posted: credits,
            send_mr,
            slot_len,
            timeout,
            budget,
            stats,
            recovery,
            serial,
            next_wr: AtomicU64::new(1),
            tx: Mutex::new(Tx {
                credits: ResponderCredits::new(credits),
                free_slots: (0..slots).rev().collect(),
                sending: VecDeque::new(),
                queued: VecDeque::new(),
                send_wrs: 0,
                recent_rdma: VecDeque::new(),
                posting: false,
            }),
        }
    }

    /// The send side's state (a panicked holder leaves it usable: every change under it is
    /// complete when the lock is released).
    pub(super) fn tx(&self) -> MutexGuard<'_, Tx> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A work request id of `kind`, unique on this connection.
    pub(super) fn wr(&self, kind: u64) -> u64 {
        let n = self.next_wr.fetch_add(1, Ordering::Relaxed) + 1;
        kind | (n & 0xffff_ffff_ffff)
    }

    fn grant(&self) -> Result<u32, Fatal> {
        // RPCR-CRD-02/04: never 0, never more than the receives posted
        Ok(self.tx().credits.on_reply(self.posted)?)
    }

    /// What the procedure of a Call came to: send its Reply (or the RDMA_ERROR the dispatch
    /// called for).
    pub(super) fn answer(&self, fixed: &FixedHeader, lists: &ChunkLists, outcome: Outcome) -> Result<(), Fatal> {
        let xid = fixed.xid;
        match outcome {
            Outcome::Reply { stream, items } => self.send_reply(fixed, lists, stream, &items),
            // issue 12 point 5: the reply cannot fit what the Call provides; the
            // procedure did not run (B.5 #6)
            Outcome::NoRoom { bound, carry } => {
                tracing::debug!(xid, bound, carry, "rpcrdma server: no room for the reply");
                self.send_error(fixed, ErrorBody::Chunk)
            }
            // RPCR-DDP-07, B.4.5 #14: a non-eligible item was reduced
            Outcome::ChunkError => self.send_error(fixed, ErrorBody::Chunk),
            // RPCR-ERR-09: the Payload stream is not a decodable Call
            Outcome::Garbage => {
                let grant = self.grant()?;
                let m = garbage_args_message(xid, grant, lists);
                self.send(m, WriteSource::Nothing, None, Vec::new(), xid)
            }
        }
    }

    pub(super) fn send_error(&self, failed: &FixedHeader, err: ErrorBody) -> Result<(), Fatal> {
        let grant = self.grant()?;
        let h = Header::error_reply(failed, grant, err);
        let mut e = crate::xdr::Encoder::new(Vec::new());
        h.encode(&mut e)?;
        self.stats.rdma_errors.fetch_add(1, Ordering::Relaxed);
        self.send(e.finish().0, WriteSource::Nothing, None, Vec::new(), failed.xid)
    }

    /// An RPC reply of SYSTEM_ERR (the server lacks the resources for this Call now).
    pub(super) fn send_system_err(&self, fixed: &FixedHeader, lists: &ChunkLists) -> Result<(), Fatal> {
        let stream = system_err(fixed.xid)?;
        self.send_reply(fixed, lists, stream, &[])
    }

    /// The most reply octets this Call's reply resources can carry: the inline threshold,
    /// its Write chunks and its Reply chunk (RFC 8166 §3.4.6, §3.5.3).
    pub(super) fn carry(&self, lists: &ChunkLists) -> u64 {
        let chunk = |w: &crate::wire::WriteChunk| w.segments.iter().map(|s| u64::from(s.length)).sum::<u64>();
        u64::from(self.th.reply)
            + lists.writes.iter().map(chunk).sum::<u64>()
            + lists.reply.iter().map(chunk).sum::<u64>()
    }

    fn send_reply(
        &self,
        fixed: &FixedHeader,
        lists: &ChunkLists,
        stream: Vec<u8>,
        items: &[crate::xdr::DdpItem],
    ) -> Result<(), Fatal> {
        let grant = self.grant()?;
        self.send_reply_granted(grant, fixed, lists, stream, items)
    }

    /// A registered region of at least `len` octets for one Long Reply, charged to the
    /// server's staging budget until its Send completes; `Ok(None)` when the budget has no room.
    fn fresh_stage(&self, len: usize) -> Result<Option<(MemoryRegion, Charge)>, Fatal> {
        let size = len.next_power_of_two().max(4096);
        if !self.budget.take(size as u64) {
            return Ok(None);
        }
        let charge = Charge {
            budget: self.budget.clone(),
            n: size as u64,
        };
        Ok(Some((self.pd.reg_mr(size, Access::LOCAL_WRITE)?, charge)))
    }

    fn send_reply_granted(
        &self,
        grant: u32,
        fixed: &FixedHeader,
        lists: &ChunkLists,
        stream: Vec<u8>,
        items: &[crate::xdr::DdpItem],
    ) -> Result<(), Fatal> {
        let pr = match plan_reply(&self.th, fixed.xid, grant, &stream, items, lists) {
            Ok(p) => p,
            Err(e) => {
                // write chunk or reply chunk too small, or no reply chunk for a
                // long reply: ERR_CHUNK (requirements B.5 #6)
                tracing::debug!(xid = fixed.xid, "rpcrdma server: cannot reply: {e}");
                let h = Header::error_reply(fixed, grant, ErrorBody::Chunk);
                self.stats.rdma_errors.fetch_add(1, Ordering::Relaxed);
                return self.send(h.to_vec()?, WriteSource::Nothing, None, Vec::new(), fixed.xid);
            }
        };
        let inline_payload = if pr.form == ReplyForm::Short {
            pr.payload.len()
        } else {
            0
        };
        let mut msg = pr.header.to_vec_reserving(inline_payload)?;
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
        // Write-chunk results go straight from the reply the procedure encoded: its vector is
        // registered as it is, charged to the staging budget while the Writes are in flight
        // (issue 18: copying it into the stage was one of the two user-space copies of a
        // READ's data that ONC RPC over TCP does not make). A Long Reply's reduced stream is
        // staged.
        let direct = !writes.is_empty() && pr.form != ReplyForm::Long;
        let total: usize = match (writes.is_empty(), pr.form) {
            (true, _) => 0,
            (false, ReplyForm::Long) => stream.len() + pr.payload.len(),
            (false, ReplyForm::Short) => stream.len(),
        };
        let charge = (direct && self.budget.take(total as u64)).then(|| Charge {
            budget: self.budget.clone(),
            n: total as u64,
        });
        // a Long Reply's stream is staged in a region of its own (the pool thread that runs
        // this does not own the connection's stage)
        let staged = if direct || total == 0 {
            None
        } else {
            self.fresh_stage(total)?
        };
        let room = if direct {
            charge.is_some()
        } else {
            total == 0 || staged.is_some()
        };
        if !room {
            // the server's staging budget has no room for the RDMA Writes now
            tracing::info!(
                xid = fixed.xid,
                qp = self.qpn,
                "rpcrdma server: staging budget exhausted"
            );
            self.stats.no_stage.fetch_add(1, Ordering::Relaxed);
            let stream = system_err(fixed.xid)?;
            return self.send_reply_granted(grant, fixed, lists, stream, &[]);
        }
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
        if direct {
            let mr = self.pd.reg_mr_vec(stream, Access::LOCAL_WRITE)?;
            self.send(msg, WriteSource::Registered(mr, charge), inv, writes, fixed.xid)
        } else if pr.form == ReplyForm::Long && !writes.is_empty() {
            let (mr, charge) = staged.ok_or(Fatal::StagingExhausted)?;
            self.send(
                msg,
                WriteSource::Staged(&[&stream, &pr.payload], mr, charge),
                inv,
                writes,
                fixed.xid,
            )
        } else {
            self.send(msg, WriteSource::Nothing, inv, writes, fixed.xid)
        }
    }

    /// Post the RDMA Writes (from `source`), then the Send, or queue them while the
    /// connection's send buffers are all under Sends in flight. Nothing waits here: the
    /// Send's completion comes to the worker ([`Replier::on_sent`]; or the timeout ends the
    /// connection).
    fn send(
        &self,
        msg: Vec<u8>,
        source: WriteSource<'_>,
        inv: Option<u32>,
        writes: Vec<(u32, u64, std::ops::Range<usize>)>,
        xid: u32,
    ) -> Result<(), Fatal> {
        if msg.len() > self.slot_len || msg.len() > self.th.reply as usize {
            return Err(Fatal::ReplyTooLarge(msg.len()));
        }
        let held = if writes.is_empty() {
            Held::Nothing
        } else {
            match source {
                WriteSource::Registered(mr, charge) => Held::Registered { mr, _charge: charge },
                WriteSource::Staged(staged, mr, charge) => {
                    let mut at = 0;
                    for s in staged {
                        mr.write(at, s).map_err(|_| Fatal::Stage)?;
                        at += s.len();
                    }
                    self.stats.copied_octets.fetch_add(at as u64, Ordering::Relaxed);
                    Held::Stage(mr, charge)
                }
                WriteSource::Nothing => return Err(Fatal::Stage),
            }
        };
        if inv.is_some() {
            self.stats.remote_invalidations.fetch_add(1, Ordering::Relaxed);
        }
        let mut tx = self.tx();
        if !writes.is_empty() {
            self.note_rdma(&mut tx, xid);
        }
        tx.queued.push_back(Outgoing {
            msg,
            held,
            inv,
            writes,
            xid,
        });
        self.post_queued(tx)
    }

    /// Post the queued Replies that have a send buffer and room on the send queue, in order.
    ///
    /// `post_send` drives the provider inline: for a Reply with a 1 MiB Write chunk that is
    /// the whole send copy (hundreds of µs). It runs with the lock released, so that the
    /// other pool threads' `grant` and `send` and the worker's `on_sent` do not sleep on the
    /// lock meanwhile (issues 17/18, session 15: `perf record -e sched:sched_switch` of
    /// `nfs serve` under `nfs get` found 88 futex sleeps in `grant`/`send` per 128 READs).
    /// One thread posts at a time (`Tx::posting`), so the Replies still go in queue order:
    /// a thread that finds another posting leaves its Reply queued and returns, and the
    /// posting thread takes it before it stops (it looks again under the lock after every
    /// post).
    pub(super) fn post_queued<'a>(&'a self, mut tx: MutexGuard<'a, Tx>) -> Result<(), Fatal> {
        if tx.posting {
            if !tx.queued.is_empty() {
                self.stats.replies_left_to_poster.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        }
        tx.posting = true;
        loop {
            let wrs = match self.next_post(&mut tx) {
                Ok(Some(wrs)) => wrs,
                other => {
                    tx.posting = false;
                    return other.map(|_| ());
                }
            };
            drop(tx);
            let posted = self.qp.post_send(wrs.as_slice());
            tx = self.tx();
            if let Err(e) = posted {
                tx.posting = false;
                // RPCR-MEM-03: a reply we cannot transmit ends the connection
                return Err(e.into());
            }
        }
    }

    /// The work requests of the next queued Reply, if it has a send buffer and room on the
    /// send queue: its Send is in `sending` from now on.
    fn next_post(&self, tx: &mut Tx) -> Result<Option<Posts>, Fatal> {
        let Some(o) = tx.queued.front() else {
            return Ok(None);
        };
        let n = o.writes.len() + 1;
        if tx.free_slots.is_empty() || (tx.send_wrs > 0 && tx.send_wrs + n > MAX_SEND_WRS) {
            return Ok(None);
        }
        let o = tx.queued.pop_front().expect("front");
        let slot = tx.free_slots.pop().expect("a free slot");
        // a Reply without Writes (every small call's) is one Send: no vector for it
        let mut wrs = if n > 1 { Vec::with_capacity(n) } else { Vec::new() };
        if let Some(from) = o.held.region() {
            for (handle, addr, src) in &o.writes {
                wrs.push(
                    SendWr::new(
                        wrid::WRITE,
                        WrOpcode::RdmaWrite {
                            remote: RemoteAddr {
                                addr: *addr,
                                rkey: *handle,
                            },
                        },
                        vec![from.sge(src.start, src.len() as u32)],
                    )
                    .flags(SendFlags::empty()),
                );
            }
        }
        let at = slot * self.slot_len;
        self.send_mr.write(at, &o.msg).map_err(verbs::Error::from)?;
        let id = self.wr(wrid::SEND);
        let opcode = match o.inv {
            Some(rkey) => WrOpcode::SendWithInv { invalidate_rkey: rkey },
            None => WrOpcode::Send,
        };
        let send = SendWr::new(id, opcode, vec![self.send_mr.sge(at, o.msg.len() as u32)]);
        let wrs = if wrs.is_empty() {
            Posts::One(send)
        } else {
            wrs.push(send);
            Posts::Many(wrs)
        };
        let count = wrs.as_slice().len();
        // the Send is in `sending` before it is posted: its completion may be taken by
        // the worker before `post_send` returns
        tx.send_wrs += count;
        tx.sending.push_back(InFlight {
            id,
            slot,
            wrs: count,
            held: o.held,
            xid: o.xid,
            writes: !o.writes.is_empty(),
            deadline: Instant::now() + self.timeout,
        });
        Ok(Some(wrs))
    }

    /// A Reply's Send completed (its Writes before it): its buffer comes back and the next
    /// queued Replies go.
    pub(super) fn on_sent(&self, wc: &WorkCompletion) -> Result<Sent, Fatal> {
        let mut tx = self.tx();
        let Some(i) = tx.sending.iter().position(|f| f.id == wc.wr_id) else {
            return Ok(Sent::Unknown);
        };
        let f = tx.sending.remove(i).expect("position");
        tx.send_wrs -= f.wrs;
        tx.free_slots.push(f.slot);
        if wc.status != WcStatus::Success {
            return Ok(Sent::Failed {
                xid: f.xid,
                writes: f.writes,
            });
        }
        self.post_queued(tx)?;
        Ok(Sent::Done(f.held))
    }

    /// `xid`'s RDMA Reads or Writes are about to touch the Requester's memory: until this
    /// connection ends, a retransmission of it on another connection waits for its fate.
    pub(super) fn note_rdma(&self, tx: &mut Tx, xid: u32) {
        if tx.recent_rdma.contains(&xid) {
            return;
        }
        if tx.recent_rdma.len() == RECENT_RDMA
            && let Some(old) = tx.recent_rdma.pop_front()
        {
            self.recovery.settle([&old], self.serial);
        }
        tx.recent_rdma.push_back(xid);
        self.recovery.unsettle(xid, self.serial);
    }
}

/// The work requests of one Reply, posted together: its Send alone, or its RDMA Writes
/// and then its Send.
enum Posts {
    One(SendWr),
    Many(Vec<SendWr>),
}

impl Posts {
    fn as_slice(&self) -> &[SendWr] {
        match self {
            Posts::One(w) => std::slice::from_ref(w),
            Posts::Many(v) => v,
        }
    }
}
