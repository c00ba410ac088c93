//! A connection's life: admitting completions, stepping its queue of Calls, receives,
//! staging buffers, the end of the connection (RPCR-MEM-05 bookkeeping), send completions.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::reply::Sent;
use super::{Charge, Conn, Fatal, Held, KEEP_STAGE, SETTLE, SPARE_STAGES, chunk_refused};
use crate::transport::backchannel::{self};
use crate::transport::wrid;
use verbs::{Access, CmEvent, MemoryRegion, RecvWr, WcStatus, WorkCompletion};

/// The XID of a message (its first word).
fn xid_of(msg: &[u8]) -> Option<u32> {
    msg.get(..4).map(|x| u32::from_be_bytes(x.try_into().expect("4 bytes")))
}

/// A completion of an operation this connection does not wait for (a reverse Call's Send):
/// nothing to do unless it failed.
pub(super) fn stray(wc: &WorkCompletion) -> Result<(), Fatal> {
    if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
        return Err(Fatal::WorkRequest {
            opcode: wc.opcode,
            status: wc.status,
            vendor_err: wc.vendor_err,
        });
    }
    Ok(())
}

impl Conn {
    /// Count an arrival against the grant (before it is handled, as the Requester sent it).
    pub(super) fn admit(&mut self, wc: &WorkCompletion) {
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
    pub(super) fn finish(&mut self, err: Option<Fatal>) {
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
    pub(super) fn step(&mut self) -> Result<bool, Fatal> {
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
                let r = self.on_message(msg);
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
        let r = self.on_message(msg);
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
    pub(super) fn record_if_refused(&mut self, xid: u32) {
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
    pub(super) fn stage(&mut self, len: usize) -> Result<Option<&MemoryRegion>, Fatal> {
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

    /// A stage back from a Call is kept for the next Calls' chunks (at most SPARE_STAGES,
    /// each at most KEEP_STAGE), its budget still held; otherwise it goes and the budget
    /// comes back.
    pub(super) fn keep_spare(&mut self, mr: MemoryRegion, mut charge: Charge) {
        if self.spare.len() < SPARE_STAGES && mr.len() <= KEEP_STAGE && charge.n == mr.len() as u64 {
            charge.n = 0;
            self.spare.push(mr);
        }
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
    pub(super) fn op_deadline(&self) -> Option<Instant> {
        let pull = self.pulling.as_ref().map(|p| p.io.deadline);
        let send = self.rep.tx().sending.front().map(|f| f.deadline);
        match (pull, send) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
