//! The lean path of a small one-segment message (issue 18, session 17): a Send, Send
//! with Invalidate, RDMA Write or Read Request posted to an idle send queue is framed
//! straight from its work request into the QP's small buffer (`Framer::emit_segment`),
//! written by the socket side in one `writev` (`IwarpQp::pump_tx`), and a Send or Write
//! completes straight into the CQ when it is the only send work request outstanding.
//!
//! Nothing is skipped that the general path does: the same post-time checks (state,
//! queue depth, SGE count, the lkey's key, PD, rights and bounds, through the QP's
//! [`MrCache`] snapshot, which a registration change invalidates: SEC-STAG-02), the same
//! MSN per queue, QN, MO 0 and L set (RFC 5041 §5), the same ORD limit and fence rule, the
//! same octets on the wire (CRC when negotiated; with markers the general path runs), the
//! completion after the last octet was handed to TCP (RDMAP-ORD-14) and in posting order.
//! A message the socket did not take whole is moved onto the general transmit queue with
//! a completion slot (`unlean`), so the rest goes out, and completes, as any other.
//! Anything else (multi-SGE, larger payloads, queued work, fences with Reads
//! outstanding, immediate data, atomics, memory operations) takes the general path.

use super::*;
use verbs::mem::MrCache;

/// Largest payload framed by the lean path (RFC 5040 small messages: the latency sizes).
pub(crate) const LEAN_PAYLOAD: usize = 256;
/// Its buffer: MPA length, the untagged DDP header, a Read Request's RDMAP header, the
/// payload, pad and CRC.
pub(crate) const LEAN_BUF: usize =
    fpdu::HEADER_LEN + ddp::UNTAGGED_HEADER_LEN + rdmap::READ_REQUEST_LEN + LEAN_PAYLOAD + 3 + fpdu::CRC_LEN;

thread_local! {
    static LEAN_POSTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Work requests the lean path framed on the calling thread (the guards' count of
/// which path ran; a post frames on the posting thread).
pub fn lean_posts() -> u64 {
    LEAN_POSTS.with(|n| n.get())
}

/// The completion a lean Send or Write owes once written: no slot in the queue.
#[derive(Clone, Copy)]
pub(super) struct LeanDone {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
}

/// The lean path's per-QP state.
pub(super) struct Lean {
    /// Octets framed in `buf` and not yet written (0: none).
    len: usize,
    /// Completion owed when they are (None: a Read Request, whose slot is queued).
    done: Option<LeanDone>,
    /// The lkeys' snapshot (one per QP: the requester's local buffers, also the check of
    /// a Read's sink when its response arrives).
    pub(super) lkeys: MrCache,
    buf: [u8; LEAN_BUF],
}

impl Lean {
    pub(super) fn new() -> Box<Lean> {
        Box::new(Lean {
            len: 0,
            done: None,
            lkeys: MrCache::default(),
            buf: [0; LEAN_BUF],
        })
    }
}

impl Proto {
    /// Frames `wr` on the lean path if it is one (see the module's comment); false when
    /// the general path must post it (including every work request that fails a check:
    /// the general path reports the error as always).
    pub(super) fn try_lean(&mut self, wr: &SendWr) -> bool {
        if self.state != QpState::Rts
            || self.lean.len != 0
            || !self.tx_idle()
            || self.tx.pending() != 0
            || self.posted.is_some()
            || self.term_sent
            || self.term_received
            || self.framer.markers()
            || wr.sg_list.len() > 1
            || self.slots.len() >= self.attr.max_send_wr as usize
        {
            return false;
        }
        let fence = wr.flags.contains(SendFlags::FENCE) && !self.orq.is_empty();
        let se = wr.flags.contains(SendFlags::SOLICITED);
        let total = wr.sg_list.first().map_or(0, |s| s.length as usize);
        if total > LEAN_PAYLOAD
            || fence
            || (wr.flags.contains(SendFlags::INLINE) && total > self.attr.max_inline_data as usize)
        {
            return false;
        }
        let (need, wc_op) = match wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithInv { .. } => (Access::LOCAL_READ, WcOpcode::Send),
            WrOpcode::RdmaWrite { .. } => (Access::LOCAL_READ, WcOpcode::RdmaWrite),
            WrOpcode::RdmaRead { .. } if total > 0 && self.orq.len() < self.ord as usize => {
                (Access::LOCAL_WRITE, WcOpcode::RdmaRead)
            }
            _ => return false,
        };
        // One segment: the ULPDU within the connection's MULPDU (RFC 5041 §5.2; a
        // larger message is segmented by the general path).
        let ulpdu_len = match wr.opcode {
            WrOpcode::RdmaWrite { .. } => ddp::TAGGED_HEADER_LEN + total,
            WrOpcode::RdmaRead { .. } => ddp::UNTAGGED_HEADER_LEN + rdmap::READ_REQUEST_LEN,
            _ => ddp::UNTAGGED_HEADER_LEN + total,
        };
        if ulpdu_len > self.max_ulpdu {
            return false;
        }
        // Sends and Writes complete straight into the CQ only when nothing is ahead of
        // them in the completion order (RFC 5040 §5.5 rule 15).
        if need == Access::LOCAL_READ && !self.slots.is_empty() {
            return false;
        }
        let piece = match wr.sg_list.first().filter(|s| s.length != 0) {
            Some(s) => match self.mem.check_cached(
                &mut self.lean.lkeys,
                s.lkey,
                self.pd,
                self.qpn,
                s.addr,
                s.length as u64,
                need,
            ) {
                Ok(r) => Some(Piece {
                    buf: r.buffer,
                    off: r.offset,
                    len: s.length as usize,
                }),
                Err(_) => return false,
            },
            None => None,
        };
        let signaled = self.attr.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let buf = &mut self.lean.buf;
        let fill = |out: &mut [u8]| {
            if let Some(p) = &piece {
                // In bounds: the piece was checked against its region.
                let _ = p.buf.read(p.off, out);
            }
        };
        let framed = match wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithInv { .. } => {
                let (opcode, inv_stag) = match wr.opcode {
                    WrOpcode::SendWithInv { invalidate_rkey } => {
                        (if se { op::SEND_SE_INV } else { op::SEND_INV }, invalidate_rkey)
                    }
                    _ => (if se { op::SEND_SE } else { op::SEND }, 0),
                };
                let h = Header {
                    last: true,
                    rdmap_ctrl: rdmap_ctrl(opcode),
                    addr: Addr::Untagged {
                        qn: qn::SEND,
                        msn: self.tx_msn[qn::SEND as usize].wrapping_add(1),
                        mo: 0,
                        inv_stag,
                    },
                };
                self.framer.emit_segment(&h, &[], total, buf, fill)
            }
            WrOpcode::RdmaWrite { remote } => {
                let h = Header {
                    last: true,
                    rdmap_ctrl: rdmap_ctrl(op::WRITE),
                    addr: Addr::Tagged {
                        stag: remote.rkey,
                        to: remote.addr,
                    },
                };
                self.framer.emit_segment(&h, &[], total, buf, fill)
            }
            WrOpcode::RdmaRead { remote } => {
                let s = &wr.sg_list[0];
                let rr = ReadRequest {
                    sink_stag: s.lkey,
                    sink_to: s.addr,
                    size: total as u32,
                    src_stag: remote.rkey,
                    src_to: remote.addr,
                };
                let mut rh = [0u8; rdmap::READ_REQUEST_LEN];
                let _ = rr.emit(&mut rh);
                let h = Header {
                    last: true,
                    rdmap_ctrl: rdmap_ctrl(op::READ_REQUEST),
                    addr: Addr::Untagged {
                        qn: qn::READ_REQUEST,
                        msn: self.tx_msn[qn::READ_REQUEST as usize].wrapping_add(1),
                        mo: 0,
                        inv_stag: 0,
                    },
                };
                self.framer.emit_segment(&h, &rh, 0, buf, |_| {})
            }
            _ => return false,
        };
        let Ok(n) = framed else {
            // Too long for the ULPDU or the buffer: nothing was framed, the MSN not taken.
            return false;
        };
        self.lean.len = n;
        LEAN_POSTS.with(|c| c.set(c.get() + 1));
        match wr.opcode {
            WrOpcode::RdmaRead { .. } => {
                self.next_msn(qn::READ_REQUEST);
                let s = &wr.sg_list[0];
                let id = self.next_slot;
                self.next_slot += 1;
                self.slots.push_back(Slot {
                    id,
                    wr_id: wr.wr_id,
                    opcode: wc_op,
                    signaled,
                    status: None,
                    byte_len: total as u32,
                    vendor_err: 0,
                });
                self.orq.push_back(Orq {
                    slot: Some(id),
                    kind: OrqKind::Read {
                        sink: piece.expect("a Read's sink is checked: total > 0"),
                        sge: Some(*s),
                        sink_stag: s.lkey,
                        sink_to: s.addr,
                    },
                    received: 0,
                });
                self.lean.done = None;
            }
            WrOpcode::RdmaWrite { .. } => {
                self.lean.done = Some(LeanDone {
                    wr_id: wr.wr_id,
                    opcode: wc_op,
                    signaled,
                });
            }
            _ => {
                self.next_msn(qn::SEND);
                self.lean.done = Some(LeanDone {
                    wr_id: wr.wr_id,
                    opcode: wc_op,
                    signaled,
                });
            }
        }
        true
    }

    /// A lean message is framed and not yet written.
    #[inline]
    pub(crate) fn lean_pending(&self) -> bool {
        self.lean.len != 0
    }

    /// The framed octets of a lean message the socket side is to write (empty: none).
    pub(crate) fn lean_bytes(&self) -> &[u8] {
        &self.lean.buf[..self.lean.len]
    }

    /// `n` octets of the lean message were written. All of them: its completion goes
    /// straight into the CQ (when signaled; it is first in the completion order). Fewer:
    /// the rest moves onto the general transmit queue with a slot (`unlean`).
    pub(crate) fn lean_written(&mut self, n: usize) {
        if self.lean.len == 0 {
            return;
        }
        if n < self.lean.len {
            self.unlean(n);
            return;
        }
        self.lean.len = 0;
        if let Some(d) = self.lean.done.take()
            && d.signaled
        {
            // RDMAP-ORD-14: complete once handed to the LLP in full.
            if self
                .send_cq
                .push(wc(d.wr_id, WcStatus::Success, d.opcode, self.qpn))
                .is_err()
            {
                self.cq_overflow();
            }
        }
    }

    /// Moves what is left of a lean message (from octet `sent`) onto the general
    /// transmit queue, its completion as a slot marked behind it: it then leaves and
    /// completes as any other message. Called when the socket took part of it, and
    /// before anything else is framed, so the stream keeps its order.
    pub(super) fn unlean(&mut self, sent: usize) {
        let len = std::mem::take(&mut self.lean.len);
        if len == 0 {
            return;
        }
        self.tx.push_slice(&self.lean.buf[sent.min(len)..len]);
        if let Some(d) = self.lean.done.take() {
            let id = self.next_slot;
            self.next_slot += 1;
            // Nothing was ahead of it (`try_lean`), so it is first in the order.
            self.slots.push_back(Slot {
                id,
                wr_id: d.wr_id,
                opcode: d.opcode,
                signaled: d.signaled,
                status: None,
                byte_len: 0,
                vendor_err: 0,
            });
            self.tx.mark(id);
        }
    }
}
