//! Transmit side of a QP (Linux siw: `siw_qp_tx.c`; rxe: `rxe_req.c`): work
//! requests become RDMAP messages (Send family, Write, Read Request, atomics,
//! the RTR), Read and atomic responses leave from the inbound queue, and every
//! message is cut into DDP segments framed as MPA FPDUs onto the gather list
//! ([`TxQueue`]). No I/O: the socket side is in `io.rs`.

use super::*;

impl Proto {
    pub(super) fn next_msn(&mut self, q: u32) -> u32 {
        let m = &mut self.tx_msn[q as usize];
        *m = m.wrapping_add(1);
        *m
    }

    /// Builds the next message to transmit, if any is ready.
    pub(super) fn next_message(&mut self) -> Option<TxMsg> {
        if let Some(f) = self.follow.take() {
            return Some(f);
        }
        if let Some(RtrRole::Send(rtr)) = self.rtr {
            self.rtr = None;
            return Some(self.rtr_message(rtr));
        }
        if matches!(self.rtr, Some(RtrRole::Expect(_))) {
            // The responder sends nothing before the initiator's RTR (RFC 6581 §4).
            return None;
        }
        let take_irq = !self.irq.is_empty() && (self.prefer_irq || self.sq.is_empty());
        self.prefer_irq = !self.prefer_irq;
        if take_irq {
            let r = self.irq.pop_front()?;
            let mut m = self.response_message(r);
            m.response = true;
            self.responding += 1;
            return Some(m);
        }
        loop {
            let (id, wr, _) = self.sq.front()?;
            let (id, is_rd) = (
                *id,
                matches!(
                    wr.opcode,
                    WrOpcode::RdmaRead { .. } | WrOpcode::AtomicFetchAdd { .. } | WrOpcode::AtomicCmpSwap { .. }
                ),
            );
            if is_rd && self.orq.len() >= self.ord as usize {
                return None; // ORD reached (RDMAP-STR-03): later WRs wait too.
            }
            if wr.flags.contains(SendFlags::FENCE) && !self.orq.is_empty() {
                return None;
            }
            let (_, wr, inline) = self.sq.pop_front().expect("checked");
            match self.build(id, wr, inline) {
                Some(m) => return Some(m),
                None => {
                    self.deliver_send_completions();
                    continue;
                }
            }
        }
    }

    /// An untagged message on queue `q`, taking that queue's next MSN.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn untagged(
        &mut self,
        completes: Option<u64>,
        opcode: u8,
        q: u32,
        inv_stag: u32,
        rdmap_hdr: Vec<u8>,
        src: Source,
        total: usize,
    ) -> TxMsg {
        let msn = self.next_msn(q);
        TxMsg {
            completes,
            opcode,
            tagged: None,
            qn: q,
            msn,
            inv_stag,
            rdmap_hdr,
            src,
            total,
            off: 0,
            response: false,
        }
    }

    /// A header-only untagged message (Read Request, atomics, immediate data, RTRs).
    pub(super) fn header_only(&mut self, completes: Option<u64>, opcode: u8, q: u32, rdmap_hdr: Vec<u8>) -> TxMsg {
        self.untagged(completes, opcode, q, 0, rdmap_hdr, Source::None, 0)
    }

    /// RFC 7306 Immediate Data (with SE when `se`).
    pub(super) fn immediate(&mut self, completes: Option<u64>, se: bool, imm: u32) -> TxMsg {
        let opcode = if se { op::IMM_SE } else { op::IMM };
        self.header_only(completes, opcode, qn::SEND, (imm as u64).to_be_bytes().to_vec())
    }

    pub(super) fn rtr_message(&mut self, rtr: crate::wire::mpa::Rtr) -> TxMsg {
        use crate::wire::mpa::Rtr;
        match rtr {
            // siw uses STag 1, TO 0 for the zero-length Write RTR (peers file §1.2).
            Rtr::Write => TxMsg::tagged(None, op::WRITE, 1, 0, Source::None, 0),
            Rtr::Read => {
                let rr = ReadRequest {
                    sink_stag: 1,
                    sink_to: 0,
                    size: 0,
                    src_stag: 1,
                    src_to: 0,
                };
                self.orq.push_back(Orq {
                    slot: None,
                    kind: OrqKind::Rtr,
                    received: 0,
                });
                self.header_only(
                    None,
                    op::READ_REQUEST,
                    qn::READ_REQUEST,
                    encoded(rr.buffer_len(), |b| rr.emit(b)),
                )
            }
            Rtr::Send => self.header_only(None, op::SEND, qn::SEND, Vec::new()),
        }
    }

    pub(super) fn response_message(&mut self, r: Irq) -> TxMsg {
        match r {
            Irq::ReadResponse {
                src,
                len,
                sink_stag,
                sink_to,
            } => {
                let src = src.map_or(Source::None, |p| Source::Pieces(vec![p]));
                TxMsg::tagged(None, op::READ_RESPONSE, sink_stag, sink_to, src, len)
            }
            Irq::AtomicResponse { request_id, orig } => {
                let resp = AtomicResponse {
                    orig_request_id: request_id,
                    orig_value: orig,
                };
                let h = encoded(resp.buffer_len(), |b| resp.emit(b));
                self.header_only(None, op::ATOMIC_RESPONSE, qn::ATOMIC_RESPONSE, h)
            }
        }
    }

    /// Turns a work request into a message, or executes it locally (returns None).
    pub(super) fn build(&mut self, id: u64, wr: SendWr, inline: Option<Vec<u8>>) -> Option<TxMsg> {
        let se = wr.flags.contains(SendFlags::SOLICITED);
        let need = if matches!(
            wr.opcode,
            WrOpcode::RdmaRead { .. } | WrOpcode::AtomicFetchAdd { .. } | WrOpcode::AtomicCmpSwap { .. }
        ) {
            Access::LOCAL_WRITE
        } else {
            Access::LOCAL_READ
        };
        let (src, total) = match inline {
            Some(v) => {
                let n = v.len();
                (Source::Owned(v), n)
            }
            None if matches!(wr.opcode, WrOpcode::LocalInv { .. } | WrOpcode::RegMr { .. }) => (Source::None, 0),
            None if self.posted.as_ref().is_some_and(|(slot, _, _)| *slot == id) => {
                // Resolved when posted, in this same post's transmit pass (`queue_send`).
                let (_, p, n) = self.posted.take().expect("checked");
                (Source::Pieces(p), n)
            }
            None => match self.resolve_spare(&wr.sg_list, need) {
                Ok((p, n)) => (Source::Pieces(p), n),
                Err(e) => {
                    // The region went away between post and execution.
                    tracing::warn!(qp = self.qpn, "{e}");
                    self.finish_slot(id, WcStatus::LocProtErr);
                    return None;
                }
            },
        };
        match wr.opcode {
            WrOpcode::Send => {
                let opcode = if se { op::SEND_SE } else { op::SEND };
                Some(self.untagged(Some(id), opcode, qn::SEND, 0, vec![], src, total))
            }
            WrOpcode::SendWithInv { invalidate_rkey } => {
                let opcode = if se { op::SEND_SE_INV } else { op::SEND_INV };
                Some(self.untagged(Some(id), opcode, qn::SEND, invalidate_rkey, vec![], src, total))
            }
            WrOpcode::SendWithImm { imm_data } => Some(self.immediate(Some(id), se, imm_data)),
            WrOpcode::RdmaWrite { remote } => {
                Some(TxMsg::tagged(Some(id), op::WRITE, remote.rkey, remote.addr, src, total))
            }
            WrOpcode::RdmaWriteWithImm { remote, imm_data } => {
                // RFC 7306 §6: an RDMA Write followed by an Immediate Data message.
                self.follow = Some(self.immediate(Some(id), se, imm_data));
                Some(TxMsg::tagged(None, op::WRITE, remote.rkey, remote.addr, src, total))
            }
            WrOpcode::RdmaRead { remote } => {
                let (sink, sink_stag, sink_to) = match src {
                    Source::Pieces(mut p) if !p.is_empty() => (p.remove(0), wr.sg_list[0].lkey, wr.sg_list[0].addr),
                    // Zero-length Read: no sink bytes.
                    _ => (
                        Piece {
                            buf: Arc::new(Buffer::new(0).ok()?),
                            off: 0,
                            len: 0,
                        },
                        wr.sg_list.first().map_or(0, |s| s.lkey),
                        wr.sg_list.first().map_or(0, |s| s.addr),
                    ),
                };
                let rr = ReadRequest {
                    sink_stag,
                    sink_to,
                    size: total as u32,
                    src_stag: remote.rkey,
                    src_to: remote.addr,
                };
                self.orq.push_back(Orq {
                    slot: Some(id),
                    kind: OrqKind::Read {
                        sink,
                        sge: wr.sg_list.first().filter(|s| s.length > 0).cloned(),
                        sink_stag,
                        sink_to,
                    },
                    received: 0,
                });
                Some(self.header_only(
                    None,
                    op::READ_REQUEST,
                    qn::READ_REQUEST,
                    encoded(rr.buffer_len(), |b| rr.emit(b)),
                ))
            }
            WrOpcode::AtomicFetchAdd { remote, add } => self.atomic(id, src, AtomicOp::FetchAdd, remote, add, 0, 0, 0),
            WrOpcode::AtomicCmpSwap { remote, compare, swap } => {
                self.atomic(id, src, AtomicOp::CmpSwap, remote, swap, u64::MAX, compare, u64::MAX)
            }
            WrOpcode::LocalInv { rkey } => {
                let st = match self.mem.local_invalidate(rkey, self.pd) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::MwBindErr,
                };
                self.finish_slot(id, st);
                None
            }
            WrOpcode::RegMr {
                mr_stag,
                key,
                source_lkey,
                source_addr,
                length,
                iova,
                access,
            } => {
                let st = match self
                    .mem
                    .check(source_lkey, self.pd, self.qpn, source_addr, length, Access::LOCAL_READ)
                {
                    Ok(r) => match self
                        .mem
                        .fast_register(mr_stag, self.pd, key, r.buffer, r.offset, iova, length, access)
                    {
                        Ok(_) => WcStatus::Success,
                        Err(_) => WcStatus::MwBindErr,
                    },
                    Err(_) => WcStatus::LocProtErr,
                };
                self.finish_slot(id, st);
                None
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic(
        &mut self,
        id: u64,
        src: Source,
        aop: AtomicOp,
        remote: verbs::RemoteAddr,
        data: u64,
        mask: u64,
        cmp: u64,
        cmp_mask: u64,
    ) -> Option<TxMsg> {
        let Source::Pieces(mut p) = src else { return None };
        let sink = p.remove(0);
        let request_id = self.next_atomic_id;
        self.next_atomic_id = self.next_atomic_id.wrapping_add(1);
        let ar = AtomicRequest {
            op: aop,
            request_id,
            remote_stag: remote.rkey,
            remote_to: remote.addr,
            add_swap_data: data,
            // FetchAdd with mask 0 = plain 64-bit add (RFC 7306 §5.1.1).
            add_swap_mask: mask,
            compare_data: cmp,
            compare_mask: cmp_mask,
        };
        self.orq.push_back(Orq {
            slot: Some(id),
            kind: OrqKind::Atomic { sink, request_id },
            received: 0,
        });
        Some(self.header_only(
            None,
            op::ATOMIC_REQUEST,
            qn::READ_REQUEST,
            encoded(ar.buffer_len(), |b| ar.emit(b)),
        ))
    }

    /// Frames DDP segments onto the transmit queue until the high-water
    /// mark or no work.
    pub(crate) fn fill_tx(&mut self) -> bool {
        if self.term_sent || self.term_received || self.state == QpState::Err {
            return false;
        }
        if self.cur.is_none()
            && self.follow.is_none()
            && self.rtr.is_none()
            && self.irq.is_empty()
            && self.sq.is_empty()
        {
            // Nothing to frame: the common case of a busy poll that finds nothing (issue 18).
            return false;
        }
        if self.lean_pending() {
            // A lean message not written yet goes before anything framed now (stream order).
            self.unlean(0);
        }
        let mut any = false;
        while self.tx.pending() < TX_HIGH_WATER {
            if self.cur.is_none() {
                self.cur = self.next_message();
                if self.cur.is_none() {
                    break;
                }
            }
            let m = self.cur.as_mut().expect("checked");
            let ddp_len = if m.tagged.is_some() {
                ddp::TAGGED_HEADER_LEN
            } else {
                ddp::UNTAGGED_HEADER_LEN
            };
            let hdr_len = ddp_len + m.rdmap_hdr.len();
            // RFC 5041 §5.2 segmentation (wire::ddp, unit-tested there).
            let (seg, last) = ddp::segment_len(m.total, m.off, self.max_ulpdu - hdr_len);
            let h = m.first_header().at_offset(m.off, last);
            let ulpdu_len = hdr_len + seg;
            let mark = self.tx.position();
            let in_place = seg >= GATHER_MIN && !self.framer.markers() && matches!(m.src, Source::Pieces(_));
            let ok = if in_place {
                gather_fpdu(
                    &mut self.framer,
                    &mut self.tx,
                    &h,
                    ddp_len,
                    &m.rdmap_hdr,
                    &m.src,
                    m.off,
                    seg,
                )
            } else {
                let (off, rh, src) = (m.off, &m.rdmap_hdr, &m.src);
                frame_copy(&mut self.framer, &mut self.tx, ulpdu_len, |u| {
                    let _ = h.emit(u);
                    u[ddp_len..hdr_len].copy_from_slice(rh);
                    src.copy_out(off, &mut u[hdr_len..]);
                })
            };
            if !ok {
                self.tx.truncate_to(mark);
                break;
            }
            any = true;
            m.off += seg;
            if last {
                let m = self.cur.take().expect("checked");
                if m.response {
                    self.responding -= 1;
                }
                if let Some(id) = m.completes {
                    self.tx.mark(id);
                }
                if let Source::Pieces(mut p) = m.src {
                    // Framed: the gather list holds its own references to what it sends.
                    p.clear();
                    self.spare_pieces = p;
                }
            }
        }
        any
    }

    /// Octets still to be written to the socket.
    pub(crate) fn tx_pending(&self) -> usize {
        self.tx.pending()
    }

    /// The framed octets waiting for the socket. The socket work (`writev`)
    /// is the caller's ([`IwarpQp`]'s `pump_tx`): `Proto` does no I/O.
    pub(crate) fn tx_queue(&self) -> &TxQueue {
        &self.tx
    }

    /// `n` octets were written: complete what fully left.
    pub(crate) fn consumed_out(&mut self, n: usize) {
        // The list is kept between writes: no allocation per write (issue 18).
        let mut done = std::mem::take(&mut self.done_scratch);
        self.tx.consumed(n, &mut done);
        for &id in &done {
            // RDMAP-ORD-14: complete once handed to the LLP in full.
            self.finish_slot(id, WcStatus::Success);
        }
        done.clear();
        self.done_scratch = done;
        self.deliver_send_completions();
    }

    /// The socket failed: nothing queued will leave.
    pub(crate) fn discard_out(&mut self) {
        let mut done = Vec::new();
        self.tx.discard(&mut done);
        for id in done {
            self.finish_slot(id, WcStatus::WrFlushErr);
        }
        self.deliver_send_completions();
    }
}

/// Frames one whole FPDU into the arena, `fill` writing its ULPDU (header-only
/// messages, small payloads, the Terminate, everything when markers are on).
/// False if it could not be framed; the caller undoes what was queued.
pub(super) fn frame_copy(
    framer: &mut Framer,
    tx: &mut TxQueue,
    ulpdu_len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> bool {
    let Ok(w) = framer.wire_len(ulpdu_len) else {
        return false;
    };
    let mut ok = false;
    tx.push_bytes(w, |out| ok = framer.emit(ulpdu_len, out, fill).is_ok());
    ok
}

/// Frames one FPDU whose payload stays in registered memory: header octets
/// in the arena, the payload pieces referenced in place, then pad and CRC.
/// CRCs (when on) are computed over the pieces through a small bounce buffer.
#[allow(clippy::too_many_arguments)]
pub(super) fn gather_fpdu(
    framer: &mut Framer,
    tx: &mut TxQueue,
    h: &Header,
    ddp_len: usize,
    rdmap_hdr: &[u8],
    src: &Source,
    off: usize,
    seg: usize,
) -> bool {
    let Source::Pieces(pieces) = src else { return false };
    let hdr_len = ddp_len + rdmap_hdr.len();
    let Ok(mut f) = framer.begin(hdr_len + seg) else {
        return false;
    };
    let mut hdr = [0u8; fpdu::HEADER_LEN + ddp::UNTAGGED_HEADER_LEN + 64];
    let Some(hb) = hdr.get_mut(..fpdu::HEADER_LEN + hdr_len) else {
        return false;
    };
    hb[..fpdu::HEADER_LEN].copy_from_slice(&f.header());
    if h.emit(&mut hb[fpdu::HEADER_LEN..]).is_err() {
        return false;
    }
    hb[fpdu::HEADER_LEN + ddp_len..].copy_from_slice(rdmap_hdr);
    f.update(&hb[fpdu::HEADER_LEN..]);
    tx.push_slice(hb);
    let (mut at, mut left) = (off, seg);
    for p in pieces {
        if left == 0 {
            break;
        }
        if at >= p.len {
            at -= p.len;
            continue;
        }
        let n = (p.len - at).min(left);
        if f.needs_bytes() {
            if p.buf.scan(p.off + at, n, |b| f.update(b)).is_err() {
                return false;
            }
        } else if f.account(n).is_err() {
            return false;
        }
        tx.push_mem(&p.buf, p.off + at, n);
        left -= n;
        at = 0;
    }
    match f.trailer() {
        Ok(t) => {
            tx.push_slice(t.as_ref());
            true
        }
        Err(_) => false,
    }
}

/// A fixed-size RDMAP header encoded into its own buffer.
pub(super) fn encoded<E>(len: usize, emit: impl FnOnce(&mut [u8]) -> std::result::Result<usize, E>) -> Vec<u8> {
    let mut h = vec![0u8; len];
    // The buffer has exactly the header's length, so emit cannot fail.
    let _ = emit(&mut h);
    h
}
