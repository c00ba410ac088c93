//! Receive side of a QP (Linux siw: `siw_qp_rx.c`; rxe: `rxe_resp.c` and the
//! completer, `rxe_comp.c`, for Read and atomic responses): each ULPDU is
//! parsed by the wire layer (`ddp::Segment::parse`, `rdmap::Message::parse`),
//! then checked against the queues, the outstanding Reads and the memory
//! table, placed, and completed; every failure names its Terminate (matrix
//! A.4.6). No I/O: `io.rs` feeds it whole ULPDUs or directly placed segments.

use super::*;

/// What a directly placed segment is, as [`Proto::direct_target`] parsed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirectKind {
    Write,
    /// A Read Response segment; `last`: its L flag.
    ReadResponse {
        last: bool,
    },
}

impl Proto {
    /// Handles one whole, CRC-checked ULPDU.
    pub(crate) fn on_ulpdu(&mut self, u: &[u8]) {
        if self.term_sent || self.term_received {
            return;
        }
        if let Err(f) = self.dispatch(u) {
            self.terminate(f, Some(u));
        }
    }

    /// One ULPDU through the wire layer's receive checks, then the engine's
    /// queue, sequencing and memory checks. DDP header: [`ddp::Segment::parse`]
    /// (DV, length; fuzz target `ddp`); RDMAP: [`rdmap::Message::parse`] (RV,
    /// opcode, T and QN against the opcode, header lengths; fuzz target
    /// `rdmap`), in the order of catalogue A.4.2; each error names its
    /// Terminate (A.4.6) and what it echoes.
    pub(super) fn dispatch(&mut self, u: &[u8]) -> RxResult {
        let seg = ddp::Segment::parse(u).map_err(|e| Fatal::bare(e.term_cause()))?;
        let h = seg.header;
        if let Some(RtrRole::Expect(rtr)) = self.rtr {
            // RFC 6581 §4: the first message must be the agreed RTR; anything
            // else, malformed RDMAP included, is "no matching RTR" (after RV).
            let (rv, _, opcode) = rdmap::split_control(h.rdmap_ctrl);
            if rv != rdmap::VERSION {
                return Err(Fatal::new(cause::RDMAP_ERR_INVALID_VERSION));
            }
            return self.on_rtr(rtr, &h, opcode, seg.payload);
        }
        let msg = match Message::parse(&seg, &self.rdmap_cfg) {
            Ok(m) => m,
            Err(rdmap::Error::Terminate(e)) => {
                // RDMAP-TRM-04: an invalid Terminate still ends the stream,
                // and is not answered with a Terminate (row 29).
                tracing::info!(qp = self.qpn, "invalid Terminate received: {e}");
                self.on_terminate(cause::RDMAP_ERR_UNSPECIFIED_OP);
                return Ok(());
            }
            Err(e) => return Err(Fatal::from_rdmap(&e)),
        };
        let untagged = match h.addr {
            Addr::Untagged { qn, msn, mo, .. } => Some((qn, msn, mo)),
            Addr::Tagged { .. } => None,
        };
        match (msg, untagged) {
            (Message::Write { stag, to, payload }, _) => self.on_write(stag, to, payload, h.last),
            (Message::ReadResponse { stag, to, payload }, _) => self.on_read_response(stag, to, payload, h.last),
            (Message::Send { invalidate, .. }, Some((_, msn, mo))) => {
                let opcode = h.rdmap_ctrl & 0x0F;
                self.on_send(opcode, msn, mo, invalidate.unwrap_or(0), seg.payload, h.last)
            }
            (Message::ImmediateData { .. }, Some((_, msn, mo))) => {
                // The 8 octets were checked by Message::parse (RFC 7306 §6.3).
                let opcode = h.rdmap_ctrl & 0x0F;
                self.on_send(opcode, msn, mo, 0, seg.payload, h.last)
            }
            (Message::ReadRequest(rr), Some((q, msn, mo))) => {
                self.check_single(q, msn, mo, h.last)?;
                // An Immediate Data message after this one no longer follows a Write.
                self.last_was_write = false;
                self.on_read_request(rr)
            }
            (Message::AtomicRequest(ar), Some((q, msn, mo))) => {
                self.check_single(q, msn, mo, h.last)?;
                self.last_was_write = false;
                self.on_atomic_request(ar)
            }
            (Message::AtomicResponse(r), Some((q, msn, mo))) => {
                self.check_single(q, msn, mo, h.last)?;
                self.on_atomic_response(r)
            }
            (Message::Terminate(t), Some(_)) => {
                self.on_terminate(t.cause);
                Ok(())
            }
            // Message::parse checked T against the opcode.
            _ => Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE)),
        }
    }

    /// Header-only untagged messages arrive in one segment: MSN in order, MO 0, L set.
    pub(super) fn check_single(&mut self, q: u32, msn: u32, mo: u32, last: bool) -> RxResult {
        let expect = self.rx_msn[q as usize];
        if msn != expect {
            return Err(Fatal::new(cause::DDP_ERR_U_MSN_RANGE));
        }
        if mo != 0 || !last {
            return Err(Fatal::new(cause::DDP_ERR_U_INVALID_MO));
        }
        self.rx_msn[q as usize] = expect.wrapping_add(1);
        Ok(())
    }

    pub(super) fn on_rtr(&mut self, rtr: crate::wire::mpa::Rtr, h: &Header, opcode: u8, payload: &[u8]) -> RxResult {
        use crate::wire::mpa::Rtr;
        let no_rtr = || Fatal::bare(cause::MPA_ERR_NO_MATCHING_RTR);
        // The RTR's message length: a Read RTR's is its RDMA Read size (plus
        // anything trailing its header), the others' is their payload.
        let len = if opcode == op::READ_REQUEST {
            let rr = ReadRequest::parse(payload).map_err(|_| no_rtr())?;
            rr.size as u64 + (payload.len() - rr.buffer_len()) as u64
        } else {
            payload.len() as u64
        };
        crate::proto::mpa::check_rtr(rtr, opcode, h.is_tagged(), len).map_err(Fatal::bare)?;
        // It is the first message on its queue, whole in one segment.
        let first = h.last
            && match h.addr {
                Addr::Tagged { .. } => true,
                Addr::Untagged { qn: q, msn, mo, .. } => {
                    msn == 1 && mo == 0 && q == if rtr == Rtr::Read { qn::READ_REQUEST } else { qn::SEND }
                }
            };
        if !first {
            return Err(no_rtr());
        }
        self.rtr = None;
        match rtr {
            Rtr::Send => self.rx_msn[0] = 2,
            Rtr::Read => {
                self.rx_msn[1] = 2;
                let rr = ReadRequest::parse(payload).map_err(|_| no_rtr())?;
                self.irq.push_back(Irq::ReadResponse {
                    src: None,
                    len: 0,
                    sink_stag: rr.sink_stag,
                    sink_to: rr.sink_to,
                });
            }
            Rtr::Write => {}
        }
        self.events.push(CmEvent::Established);
        Ok(())
    }

    /// A tagged segment with RDMAP `opcode` against the tagged message in
    /// progress. Another tagged message cutting into it is an unexpected
    /// opcode (0/2/0x06; Linux siw's "packet intersection"). A later Write
    /// segment repeats the first one's STag (RFC 5041 §4.2; else 1/1/0x00)
    /// and starts at the TO where the previous one ended (§5.2; else
    /// 1/1/0x01), as siw's `siw_write_check_ntoh`; a Read Response's STag
    /// and TO are checked against its Read instead
    /// ([`read_response_target`](Self::read_response_target)).
    #[inline]
    pub(super) fn tagged_continues(&self, opcode: u8, stag: u32, to: u64) -> RxResult {
        let Some(t) = self.rx_tagged else { return Ok(()) };
        if t.opcode != opcode {
            return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE));
        }
        if opcode == op::WRITE {
            if stag != t.stag {
                return Err(Fatal::new(cause::DDP_ERR_T_INVALID_STAG));
            }
            if to != t.next_to {
                return Err(Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS));
            }
        }
        Ok(())
    }

    /// A tagged segment passed its checks: the message goes on unless L.
    #[inline]
    fn tagged_accepted(&mut self, opcode: u8, stag: u32, to: u64, len: usize, last: bool) {
        self.rx_tagged = (!last).then(|| RxTagged {
            opcode,
            stag,
            next_to: to.wrapping_add(len as u64),
        });
    }

    /// Where a Write segment's payload of `len` octets goes (RFC 5041 §7.1
    /// tagged checks, through the memory table).
    pub(super) fn write_target(
        &mut self,
        stag: u32,
        to: u64,
        len: usize,
        last: bool,
    ) -> Result<Option<(Arc<Buffer>, usize)>, Fatal> {
        self.last_was_write = true;
        self.tagged_continues(op::WRITE, stag, to)?;
        let target = if len == 0 {
            // Zero-length Write: no STag validation (catalogue A.5 #6, as siw).
            None
        } else {
            let r = self
                .mem
                .check_cached(
                    &mut self.rkeys,
                    stag,
                    self.pd,
                    self.qpn,
                    to,
                    len as u64,
                    Access::REMOTE_WRITE,
                )
                .map_err(|e| Fatal::new(ddp_tagged_cause(e)))?;
            Some((r.buffer, r.offset))
        };
        self.tagged_accepted(op::WRITE, stag, to, len, last);
        Ok(target)
    }

    pub(super) fn on_write(&mut self, stag: u32, to: u64, payload: &[u8], last: bool) -> RxResult {
        if let Some((buf, off)) = self.write_target(stag, to, payload.len(), last)? {
            buf.write(off, payload)
                .map_err(|_| Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS))?;
        }
        Ok(())
    }

    /// Where a Read Response segment of `len` octets carrying `stag`/`to`
    /// goes: the sink of the oldest outstanding Read (RFC 5040 §5.2.2).
    pub(super) fn read_response_target(
        &mut self,
        stag: u32,
        to: u64,
        len: usize,
        last: bool,
    ) -> Result<Option<(Arc<Buffer>, usize)>, Fatal> {
        self.tagged_continues(op::READ_RESPONSE, stag, to)?;
        let target = self.read_response_sink(stag, to, len, last)?;
        self.tagged_accepted(op::READ_RESPONSE, stag, to, len, last);
        Ok(target)
    }

    fn read_response_sink(
        &mut self,
        stag: u32,
        to: u64,
        len: usize,
        last: bool,
    ) -> Result<Option<(Arc<Buffer>, usize)>, Fatal> {
        // Matrix row 23: a Read Response with no Read outstanding.
        let Some(head) = self.orq.front() else {
            return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE));
        };
        match &head.kind {
            OrqKind::Rtr => {
                if len != 0 || !last {
                    return Err(Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS));
                }
                Ok(None)
            }
            OrqKind::Atomic { .. } => Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE)),
            OrqKind::Read {
                sink,
                sge,
                sink_stag,
                sink_to,
            } => {
                // RFC 5040 §5.2.2 MAY: check the response against the request
                // (matrix row 25). The STag first (issue 12 point 6): one
                // that is not the sink this Read named is refused before
                // anything is placed, with the DDP tagged-buffer code
                // RFC 5041 §7.2 gives for what it is.
                if stag != *sink_stag {
                    return Err(Fatal::new(self.foreign_sink_cause(stag, to, len)));
                }
                // The TO of this segment: the sink TO advanced by what has
                // arrived (RFC 5041 §5.2: TO = message TO + offset).
                if sink_to.checked_add(head.received as u64) != Some(to) {
                    return Err(Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS));
                }
                if head.received.checked_add(len).is_none_or(|e| e > sink.len) {
                    return Err(Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS));
                }
                let target = (sink.buf.clone(), sink.off + head.received);
                // Through the requester's snapshot of its lkeys (the lean path's): the same
                // checks, no look-up while no registration changed (SEC-STAG-02).
                if head.received == 0
                    && let Some(sge) = *sge
                    && self
                        .mem
                        .check_cached(
                            &mut self.lean.lkeys,
                            sge.lkey,
                            self.pd,
                            self.qpn,
                            sge.addr,
                            sge.length as u64,
                            Access::LOCAL_WRITE,
                        )
                        .is_err()
                {
                    // The sink was deregistered while the Read was outstanding.
                    if let Some(id) = head.slot {
                        self.finish_slot(id, WcStatus::LocProtErr);
                    }
                    return Err(Fatal::bare(cause::RDMAP_LOCAL_CATASTROPHIC_ERR));
                }
                Ok(Some(target))
            }
        }
    }

    /// The Terminate for a Read Response naming `stag`, which is not the sink
    /// STag of the Read it answers (RFC 5041 §7.2 tagged-buffer codes, in the
    /// check order of catalogue A.4.2 step 6): an STag of another protection
    /// domain or stream (another connection's sink) is "not associated with
    /// this DDP stream" (1/1/0x02); an unknown STag, or a valid one of this
    /// stream that this Read did not name, is "invalid STag" (1/1/0x00).
    pub(super) fn foreign_sink_cause(&self, stag: u32, to: u64, len: usize) -> TermCause {
        match self.mem.check(stag, self.pd, self.qpn, to, len as u64, Access::empty()) {
            Err(AccessError::NotAssociated) => cause::DDP_ERR_T_STAG_NOT_ASSOCIATED,
            _ => cause::DDP_ERR_T_INVALID_STAG,
        }
    }

    /// A Read Response segment of `len` octets was placed.
    pub(super) fn read_response_placed(&mut self, len: usize, last: bool) {
        if let Some(head) = self.orq.front_mut() {
            head.received += len;
        }
        if last {
            let Some(done) = self.orq.pop_front() else { return };
            if let Some(id) = done.slot {
                if let Some(s) = self.slot_mut(id) {
                    s.byte_len = done.received as u32;
                }
                self.finish_slot(id, WcStatus::Success);
                self.deliver_send_completions();
            }
        }
    }

    pub(super) fn on_read_response(&mut self, stag: u32, to: u64, payload: &[u8], last: bool) -> RxResult {
        if let Some((buf, off)) = self.read_response_target(stag, to, payload.len(), last)? {
            buf.write(off, payload)
                .map_err(|_| Fatal::new(cause::DDP_ERR_T_BASE_BOUNDS))?;
        }
        self.read_response_placed(payload.len(), last);
        Ok(())
    }

    /// Direct data placement (RFC 5041 §1): for a tagged Write or Read
    /// Response segment whose DDP header `h` has arrived (parsed once, by
    /// the receive buffer), the region its `len` payload octets go to, so
    /// the receive path can `read` them straight into place. The segment's
    /// checks and accounting are those of the ordinary path (the same
    /// `write_target` / `read_response_target`), done here, once. `None`:
    /// nothing was accounted; take the ordinary path (which also raises any
    /// error this segment deserves).
    pub(crate) fn direct_target(&mut self, h: &Header, len: usize) -> Option<(Arc<Buffer>, usize, DirectKind)> {
        if self.term_sent || self.term_received || self.rtr.is_some() || len == 0 {
            return None;
        }
        let Addr::Tagged { stag, to } = h.addr else { return None };
        let (rv, _, opcode) = rdmap::split_control(h.rdmap_ctrl);
        if rv != rdmap::VERSION {
            return None;
        }
        let (buf, off) = match opcode {
            op::WRITE => self.write_target(stag, to, len, h.last).ok().flatten()?,
            op::READ_RESPONSE => self.read_response_target(stag, to, len, h.last).ok().flatten()?,
            _ => return None,
        };
        let kind = if opcode == op::READ_RESPONSE {
            DirectKind::ReadResponse { last: h.last }
        } else {
            DirectKind::Write
        };
        Some((buf, off, kind))
    }

    /// The payload announced by [`Proto::direct_target`] (which returned
    /// `kind`, so the header is not parsed again) is in place and its FPDU
    /// passed the CRC check.
    pub(crate) fn direct_placed(&mut self, kind: DirectKind, len: usize) {
        if let DirectKind::ReadResponse { last } = kind {
            self.read_response_placed(len, last);
        }
    }

    pub(super) fn on_send(
        &mut self,
        opcode: u8,
        msn: u32,
        mo: u32,
        inv_stag: u32,
        payload: &[u8],
        last: bool,
    ) -> RxResult {
        let was_write = std::mem::replace(&mut self.last_was_write, false);
        let is_imm = matches!(opcode, op::IMM | op::IMM_SE);
        if self.rx_send.is_none() {
            let expect = self.rx_msn[0];
            if msn != expect {
                return Err(Fatal::new(cause::DDP_ERR_U_MSN_RANGE));
            }
            if mo != 0 {
                return Err(Fatal::new(cause::DDP_ERR_U_INVALID_MO));
            }
            // Matrix row 1: no receive posted (iWARP has no RNR retry).
            let Some(mut wqe) = self.rq.pop_front() else {
                return Err(Fatal::new(cause::DDP_ERR_U_NO_BUFFER));
            };
            // Into the list resolved at post time: no allocation on arrival.
            match self.resolve_recv(&wqe.sges, &mut wqe.pieces) {
                Ok(cap) => wqe.cap = cap,
                Err(e) => {
                    // The receive's memory went away after it was posted:
                    // local protection error, and a local catastrophic
                    // Terminate (A.4.6 row 28), as siw does.
                    tracing::info!(qp = self.qpn, "receive {}: {e}", wqe.wr_id);
                    self.push_recv_completion(wc(wqe.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, self.qpn));
                    return Err(Fatal::bare(cause::RDMAP_LOCAL_CATASTROPHIC_ERR));
                }
            }
            self.rx_send = Some(RxSend {
                wqe,
                msn,
                opcode,
                got: 0,
            });
        }
        let rs = self.rx_send.as_mut().expect("set above");
        if msn != rs.msn {
            return Err(Fatal::new(cause::DDP_ERR_U_MSN_RANGE));
        }
        if opcode != rs.opcode {
            // The RDMAP opcode changed within one DDP message (RFC 5040
            // §4.1: every segment carries the message's control octet).
            return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE));
        }
        if mo as usize != rs.got {
            return Err(Fatal::new(cause::DDP_ERR_U_INVALID_MO));
        }
        if is_imm {
            // RFC 7306 §6.3: exactly 8 bytes of immediate data.
            if payload.len() != 8 || mo != 0 || !last {
                return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE));
            }
        } else {
            let end = rs.got.checked_add(payload.len());
            if end.is_none_or(|e| e > rs.wqe.cap) {
                // Matrix row 2 (RFC 5041 code 0x05).
                return Err(Fatal::new(cause::DDP_ERR_U_TOO_LONG));
            }
            scatter(&rs.wqe.pieces, rs.got, payload);
            rs.got += payload.len();
        }
        if !last {
            return Ok(());
        }
        let rs = self.rx_send.take().expect("checked");
        self.rx_msn[0] = rs.msn.wrapping_add(1);
        let mut w = wc(rs.wqe.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
        w.byte_len = rs.got as u32;
        w.solicited = matches!(opcode, op::SEND_SE | op::SEND_SE_INV | op::IMM_SE);
        if is_imm {
            let v = u64::from_be_bytes(payload.try_into().unwrap_or([0; 8]));
            w.imm_data = Some(v as u32);
            w.wc_flags |= verbs::WcFlags::WITH_IMM;
            if was_write {
                w.opcode = WcOpcode::RecvRdmaWithImm;
            }
        }
        if matches!(opcode, op::SEND_INV | op::SEND_SE_INV) {
            use verbs::mem::InvalidateError;
            match self.mem.remote_invalidate(inv_stag, self.pd, self.qpn) {
                Ok(()) => {
                    w.invalidated_rkey = Some(inv_stag);
                    w.wc_flags |= verbs::WcFlags::WITH_INV;
                }
                Err(e) => {
                    // RDMAP-SND-06; catalogue A.5 #4 on the error type.
                    let c = match e {
                        InvalidateError::InvalidStag => cause::RDMAP_ERR_CANNOT_INVALIDATE_OP,
                        _ => cause::RDMAP_ERR_CANNOT_INVALIDATE_PROT,
                    };
                    self.rq.push_front(rs.wqe);
                    return Err(Fatal::new(c));
                }
            }
        }
        // Its lists are kept for the next post_recv (before the completion is seen).
        self.retire_recv(rs.wqe);
        self.push_recv_completion(w);
        Ok(())
    }

    /// A Read Request, its header already checked (exactly 28 octets,
    /// RDMAP-HDR-07, by [`Message::parse`]).
    pub(super) fn on_read_request(&mut self, rr: ReadRequest) -> RxResult {
        if self.irq.len() + self.responding as usize >= self.ird as usize {
            // RDMAP-STR-04 / matrix row 19 (siw's choice).
            return Err(Fatal {
                cause: cause::RDMAP_ERR_CATASTROPHIC_STREAM,
                echo: true,
                rreq: Some(rr),
            });
        }
        self.answered = true;
        if rr.size == 0 {
            // RDMAP-RD-08: no validation for a zero-length Read.
            self.irq.push_back(Irq::ReadResponse {
                src: None,
                len: 0,
                sink_stag: rr.sink_stag,
                sink_to: rr.sink_to,
            });
            return Ok(());
        }
        let r = self
            .mem
            .check_cached(
                &mut self.rkeys,
                rr.src_stag,
                self.pd,
                self.qpn,
                rr.src_to,
                rr.size as u64,
                Access::REMOTE_READ,
            )
            .map_err(|e| Fatal {
                cause: rdmap_read_cause(e),
                echo: true,
                rreq: Some(rr),
            })?;
        self.irq.push_back(Irq::ReadResponse {
            src: Some(Piece {
                buf: r.buffer,
                off: r.offset,
                len: rr.size as usize,
            }),
            len: rr.size as usize,
            sink_stag: rr.sink_stag,
            sink_to: rr.sink_to,
        });
        Ok(())
    }

    pub(super) fn on_atomic_request(&mut self, ar: AtomicRequest) -> RxResult {
        if self.irq.len() + self.responding as usize >= self.ird as usize {
            return Err(Fatal::new(cause::RDMAP_ERR_CATASTROPHIC_STREAM));
        }
        if !ar.remote_to.is_multiple_of(8) {
            // RFC 7306 §8.2: misaligned -> Remote Operation, catastrophic localized.
            return Err(Fatal::new(cause::RDMAP_ERR_CATASTROPHIC_STREAM));
        }
        let r = self
            .mem
            .check(
                ar.remote_stag,
                self.pd,
                self.qpn,
                ar.remote_to,
                8,
                Access::REMOTE_ATOMIC,
            )
            .map_err(|e| Fatal::new(rdmap_read_cause(e)))?;
        let f: Box<dyn Fn(u64) -> u64> = match ar.op {
            AtomicOp::FetchAdd => {
                let (add, mask) = (ar.add_swap_data, ar.add_swap_mask);
                Box::new(move |v| masked_add(v, add, mask))
            }
            AtomicOp::CmpSwap => {
                let (cmp, cmask, swap, smask) = (ar.compare_data, ar.compare_mask, ar.add_swap_data, ar.add_swap_mask);
                Box::new(move |v| {
                    if (cmp ^ v) & cmask == 0 {
                        (v & !smask) | (swap & smask)
                    } else {
                        v
                    }
                })
            }
            AtomicOp::Unknown(_) => return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE)),
        };
        let orig = r
            .buffer
            .atomic_rmw(r.offset, f)
            .map_err(|_| Fatal::new(cause::RDMAP_ERR_CATASTROPHIC_STREAM))?;
        self.answered = true;
        self.irq.push_back(Irq::AtomicResponse {
            request_id: ar.request_id,
            orig,
        });
        Ok(())
    }

    pub(super) fn on_atomic_response(&mut self, resp: AtomicResponse) -> RxResult {
        let matches = matches!(self.orq.front(), Some(Orq { kind: OrqKind::Atomic { request_id, .. }, .. }) if *request_id == resp.orig_request_id);
        if !matches {
            return Err(Fatal::new(cause::RDMAP_ERR_UNEXPECTED_OPCODE));
        }
        let done = self.orq.pop_front().expect("checked");
        if let OrqKind::Atomic { sink, .. } = &done.kind {
            let _ = sink.buf.write(sink.off, &resp.orig_value.to_ne_bytes());
        }
        if let Some(id) = done.slot {
            self.finish_slot(id, WcStatus::Success);
            self.deliver_send_completions();
        }
        Ok(())
    }

    /// The peer's Terminate (parsed in either wire form by
    /// [`Message::parse`]), or `c` = 0/2/0xFF for an invalid one.
    pub(super) fn on_terminate(&mut self, c: TermCause) {
        tracing::info!(qp = self.qpn, "Terminate received: {c}");
        self.term_received = true;
        // The oldest outstanding work request is the one the peer refused.
        let st = status_for_peer_terminate(&c);
        if let Some(s) = self.slots.iter_mut().find(|s| s.status.is_none()) {
            s.status = Some(st);
            s.vendor_err = pack_cause(&c);
        }
        // the state, then the event, then the flushed completions: a consumer woken by the
        // completions finds the event queued, and one woken by the event finds the QP in ERR
        self.publish_error_state();
        self.events.push(CmEvent::ErrorReceived(term_detail(&c)));
        self.enter_error();
        self.shutdown_when_drained = true;
    }

    /// The LLP failed under a live connection (a TCP reset, a socket error):
    /// an affiliated asynchronous error (RDMAC verbs' "LLP connection
    /// reset/lost"), reported as [`CmEvent::ConnectionError`], which the
    /// device turns into `QpFatal`. After a close we started or the QP
    /// failed already, it is only the end of the stream.
    pub(crate) fn on_llp_error(&mut self, reason: &str) {
        if self.disconnected_event || self.state == QpState::Err || self.term_sent || self.term_received {
            self.on_stream_error(None, reason);
            return;
        }
        self.disconnected_event = true;
        tracing::info!(qp = self.qpn, "connection lost: {reason}");
        // the state, then the event (as for a Terminate), then the flushes
        self.publish_error_state();
        self.events.push(CmEvent::ConnectionError(reason.to_string()));
        self.enter_error();
        self.shutdown_when_drained = true;
    }

    /// The byte stream broke (RFC 5044 framing error, peer FIN or reset).
    pub(crate) fn on_stream_error(&mut self, fatal_cause: Option<TermCause>, reason: &str) {
        if let Some(c) = fatal_cause {
            self.terminate(Fatal::bare(c), None);
            return;
        }
        if !self.disconnected_event {
            self.disconnected_event = true;
            self.events.push(CmEvent::Disconnected);
        }
        if self.state != QpState::Err {
            tracing::info!(qp = self.qpn, "connection closed: {reason}");
            self.enter_error();
        }
        self.shutdown_when_drained = true;
    }

    pub(crate) fn disconnect(&mut self) {
        if self.state != QpState::Err {
            self.enter_error();
        }
        self.shutdown_when_drained = true;
    }
}

/// RFC 7306 §5.1.1 masked FetchAdd: a set mask bit ends a field (its carry is dropped).
pub(super) fn masked_add(orig: u64, add: u64, mask: u64) -> u64 {
    if mask == 0 {
        return orig.wrapping_add(add);
    }
    let mut out = 0u64;
    let mut carry = 0u64;
    for bit in 0..64 {
        let b = 1u64 << bit;
        let sum = carry + ((orig & b) >> bit) + ((add & b) >> bit);
        if sum & 1 != 0 {
            out |= b;
        }
        carry = if mask & b != 0 { 0 } else { sum >> 1 };
    }
    out
}

pub(super) fn scatter(pieces: &[Piece], mut at: usize, mut data: &[u8]) {
    for p in pieces {
        if data.is_empty() {
            return;
        }
        if at >= p.len {
            at -= p.len;
            continue;
        }
        let n = (p.len - at).min(data.len());
        let _ = p.buf.write(p.off + at, &data[..n]);
        data = &data[n..];
        at = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_fetch_add_rfc7306_5_1_1() {
        assert_eq!(masked_add(5, 3, 0), 8);
        assert_eq!(masked_add(u64::MAX, 1, 0), 0);
        // Two 32-bit fields: bit 31 ends the low field, so its carry is dropped.
        let mask = 1u64 << 31 | 1u64 << 63;
        assert_eq!(masked_add(0x0000_0001_FFFF_FFFF, 1, mask), 0x0000_0001_0000_0000);
    }
}
