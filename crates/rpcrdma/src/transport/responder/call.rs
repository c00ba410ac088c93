//! One Call: the received message validated, its Read chunks pulled, the dispatch run and
//! the Reply handed to the send side.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::conn::stray;
use super::{CallData, CallPlan, Charge, Conn, Fatal, Finished, Outcome, PullIo, Pulled, Pulling};
use crate::server::{Dispatch, ReplyRoom, dispatch_within};
use crate::transport::wrid;
use crate::validate::{CallPayload, ResponderDecision, check_payload_xid, validate_call};
use crate::wire::chunks::ReadChunk;
use crate::wire::{ErrorBody, FixedHeader};
use crate::xdr::{ChunkSource, Decoder, InsertedChunk};
use verbs::{RemoteAddr, SendWr, WcStatus, WorkCompletion, WrOpcode};

impl Conn {
    /// A received message `msg` (copied out of its receive buffer): validated, and a Call's
    /// inline Payload stream kept in it (no second copy) for the procedure.
    pub(super) fn on_message(&mut self, msg: Vec<u8>) -> Result<(), Fatal> {
        let decision = {
            let failed = self.recovery.lock();
            validate_call(&msg, &self.policy, &failed)
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
                let fixed = FixedHeader::parse(&msg).ok_or(Fatal::ShortHeader)?;
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
                // where the inline Payload stream lies in `msg` (it is a part of it)
                let inline_at = match &vc.payload {
                    CallPayload::Inline(p) => Some(within(&msg, p).ok_or_else(|| p.to_vec())),
                    CallPayload::PositionZero(_) => None,
                };
                let mut plan = CallPlan {
                    fixed,
                    lists: vc.lists().clone(),
                    inline: None,
                    lens: chunks.iter().map(|c| c.total_len() as usize).collect(),
                    positions: vc.read_chunks.iter().map(|c| c.position).collect(),
                };
                let pulled = self.pull(&chunks);
                drop(chunks);
                drop(vc);
                // the Payload stream moves to the front of the received message, which is
                // cut to it: no allocation, no copy into a second vector (issue 18, session 17)
                plan.inline = inline_at.map(|at| match at {
                    Ok(r) => {
                        let mut m = msg;
                        m.truncate(r.end);
                        m.drain(..r.start);
                        m
                    }
                    Err(copy) => copy,
                });
                match pulled {
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
    pub(super) fn on_read(&mut self, wc: &WorkCompletion) -> Result<(), Fatal> {
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
    pub(super) fn complete(&mut self, f: Finished) -> Result<(), Fatal> {
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
}

/// Where `part` lies in `whole`, if it is a part of it.
fn within(whole: &[u8], part: &[u8]) -> Option<std::ops::Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::within;

    /// The inline Payload stream of a Call is kept in its received message only when it is a
    /// part of it (RPCR-FRM-01: the Payload stream follows the header in the Send).
    #[test]
    fn within_finds_a_part_and_refuses_anything_else() {
        let msg: Vec<u8> = (0..64u8).collect();
        assert_eq!(within(&msg, &msg[28..]), Some(28..64));
        assert_eq!(within(&msg, &msg[28..28]), Some(28..28));
        assert_eq!(within(&msg, &msg[..]), Some(0..64));
        let other = msg.clone();
        assert_eq!(within(&msg, &other[28..]), None);
        assert_eq!(within(&msg[..32], &msg[28..40]), None, "runs past the end");
        assert_eq!(within(&msg[30..], &msg[28..40]), None, "starts before");
    }
}
