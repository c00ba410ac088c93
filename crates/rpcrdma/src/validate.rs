//! Header validation: what to do with a received message (RFC 8166 §4.5, §4.6,
//! §6.1; requirements B.4.3 and the acceptance matrix B.4.5).
//!
//! Sans-I/O: the functions look at the received bytes (and a little connection
//! state) and return a typed decision; the transport engine acts on it.
//!
//! Responder ([`validate_call`]), in this order:
//!
//! | check | decision | row |
//! |---|---|---|
//! | shorter than 28 bytes | drop silently (§4.5) | 1 |
//! | rdma_vers != 1 | RDMA_ERROR ERR_VERS {1, 1}, xid and vers echoed | 2 |
//! | RDMA_DONE, RDMA_ERROR | drop silently (§4.6.2, §4.2.4) | 5, 6 |
//! | RDMA_MSGP | ERR_CHUNK (§4.6.1 SHOULD) | 4 |
//! | rdma_proc > 4 | ERR_CHUNK | 3 |
//! | XDR error in the lists (truncated, count too big, discriminator not 0/1) | ERR_CHUNK | 9, 10, 13 |
//! | XID whose earlier RDMA operation failed (§4.5.3) | ERR_CHUNK | 16 |
//! | Position not a multiple of 4 | ERR_CHUNK | 11 |
//! | NOMSG without a Position-Zero Read chunk (incl. no lists at all) | ERR_CHUNK | 7 |
//! | MSG with a Position-Zero Read chunk | ERR_CHUNK (decision, see below) | - |
//! | rdma_xid != XID of the inline RPC message | ERR_CHUNK | 8 |
//! | Position beyond the (rebuilt) Payload stream | ERR_CHUNK (decision) | 12 |
//! | chunk above the ULB limit | ERR_CHUNK (§8.1.4) | - |
//!
//! After the Read chunks are pulled, the ULP decodes the arguments through the
//! chunk-aware decoder; [`classify_decode_error`] turns its error into ERR_CHUNK
//! (a non-eligible item was reduced, or a chunk was left over: rows 12 and 14,
//! B.5 #11) or a GARBAGE_ARGS reply sent with RDMA_MSG (row 15, §4.5.2 SHOULD).
//!
//! Requester ([`validate_reply`]): every header error means a silent drop
//! (§4.5); a decodable RDMA_ERROR for a pending XID fails that RPC permanently
//! (row 19), even the 20-byte ERR_CHUNK (B.5 #1); an RDMA_ERROR with an unknown
//! code is dropped (row 20); a Reply whose chunk lists disagree with the Call's is
//! dropped (rows 17, 18).
//!
//! Decisions (requirements B.5):
//! * #1: the 28-byte minimum applies to a Responder receiving Calls; a Requester
//!   checks 16 bytes, reads rdma_proc and lets each procedure's own length apply
//!   (ERR_CHUNK is 20 bytes).
//! * #3: an RDMA_MSG Call with a Position-Zero Read chunk is answered ERR_CHUNK:
//!   in an RPC Call Position zero is the XID, which is never DDP-eligible.
//! * #4: a Long Call may carry further Read chunks; their Positions are checked
//!   against the Position-Zero chunk's length.
//! * #11 / row 12: a chunk placed where no DDP-eligible item is, or past the end,
//!   is a transport (chunk) error: ERR_CHUNK.
//! * Messages whose payload travels in the other direction (RFC 8167 backward
//!   Calls and Replies, told apart by the msg_type at offset 4) are not handled
//!   here: they come back as `Drop(BackwardDirection)` for the engine to route.

use std::collections::VecDeque;

use crate::rpc::{MSG_CALL, MSG_REPLY, garbage_args_reply, peek_xid_and_type};
use crate::wire::chunks::{ReadChunk, check_read_positions, check_returned_chunks, group_read_list};
use crate::wire::{
    Body, ChunkLists, ErrorBody, FIXED_HEADER_LEN, FixedHeader, Header, HeaderError, Limits, MIN_HEADER_LEN,
    RPCRDMA_VERSION, proc_,
};
use crate::xdr::XdrError;

/// Lowest and highest RPC-over-RDMA versions supported (sent with ERR_VERS).
pub const SUPPORTED_VERSIONS: (u32, u32) = (RPCRDMA_VERSION, RPCRDMA_VERSION);

/// Why a message was dropped silently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Too short to trust the XID (RPCR-ERR-01).
    TooShort,
    /// RDMA_ERROR received by a Responder (RPCR-FRM-08).
    RdmaErrorAtResponder,
    /// RDMA_DONE (RPCR-ERR-11).
    RdmaDone,
    /// RDMA_MSGP received by a Requester (RPCR-ERR-10).
    RdmaMsgp,
    /// Unknown rdma_proc in a Reply.
    UnknownProc,
    /// rdma_vers not supported, in a Reply.
    UnsupportedVersion,
    /// RDMA_ERROR that cannot be decoded (RPCR-ERR-06).
    UndecodableError,
    /// Malformed header in a Reply (RPCR-ERR-03).
    Malformed,
    /// No pending RPC with this XID.
    UnknownXid,
    /// rdma_xid differs from the XID of the RPC message (RPCR-FRM-04).
    XidMismatch,
    /// The Reply's chunk lists disagree with what the Call provided.
    ChunkMismatch,
    /// RDMA_NOMSG Reply without a Reply chunk to carry its Payload stream.
    NoPayload,
    /// The payload is a Call at the Requester or a Reply at the Responder
    /// (RFC 8167 backward direction): for the engine's backchannel, if any.
    BackwardDirection,
}

/// Why a Responder answers RDMA_ERROR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReason {
    /// rdma_vers not supported (ERR_VERS).
    Version,
    /// rdma_proc unknown.
    UnknownProc,
    /// RDMA_MSGP received.
    Msgp,
    /// XDR error in the Transport header.
    Xdr,
    /// RDMA_NOMSG without a Position-Zero Read chunk.
    NoPayloadChunk,
    /// RDMA_MSG with a Position-Zero Read chunk.
    PositionZeroInMsg,
    /// rdma_xid differs from the RPC XID.
    XidMismatch,
    /// Position not aligned, out of range, or a chunk in the wrong place.
    BadPosition,
    /// A chunk above the ULB limit.
    ChunkTooLarge,
    /// An RDMA operation for this XID failed on an earlier connection.
    FailedXid,
}

/// Where a valid Call's Payload stream is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallPayload<'a> {
    /// RDMA_MSG: inline after the header (possibly reduced).
    Inline(&'a [u8]),
    /// RDMA_NOMSG: in this Position-Zero Read chunk (pull it with RDMA Read, then
    /// check it with [`check_payload_xid`]).
    PositionZero(ReadChunk),
}

/// A Call whose header passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidCall<'a> {
    /// The decoded header (its Write list and Reply chunk are kept for the Reply).
    pub header: Header,
    /// The Payload stream.
    pub payload: CallPayload<'a>,
    /// Read chunks of reduced items (Position-Zero chunk excluded), by Position.
    pub read_chunks: Vec<ReadChunk>,
}

impl ValidCall<'_> {
    /// The Call's chunk lists.
    pub fn lists(&self) -> &ChunkLists {
        self.header
            .body
            .lists()
            .expect("validated calls are RDMA_MSG or RDMA_NOMSG")
    }
}

/// What a Responder does with a received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponderDecision<'a> {
    /// Go on: pull Read chunks, decode, execute.
    Process(ValidCall<'a>),
    /// Answer with RDMA_ERROR (build it with [`ResponderDecision::error_header`]).
    SendError {
        /// The fixed words of the failing message (xid and vers are echoed).
        failed: FixedHeader,
        /// ERR_VERS or ERR_CHUNK.
        err: ErrorBody,
        /// Why.
        reason: ErrorReason,
    },
    /// Discard silently.
    Drop(DropReason),
}

impl ResponderDecision<'_> {
    /// The RDMA_ERROR to send for a `SendError`, with the current grant (B.5 #2).
    pub fn error_header(&self, credit: u32) -> Option<Header> {
        match self {
            ResponderDecision::SendError { failed, err, .. } => Some(Header::error_reply(failed, credit.max(1), *err)),
            _ => None,
        }
    }
}

/// Responder settings for validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponderPolicy {
    /// Header decoding limits.
    pub limits: Limits,
    /// Largest chunk (Read chunk or Position-Zero chunk) to pull, from the ULB
    /// (RFC 8166 §8.1.4, RPCR-SEC-05).
    pub max_chunk: u64,
}

impl Default for ResponderPolicy {
    fn default() -> Self {
        ResponderPolicy {
            limits: Limits::default(),
            max_chunk: 16 << 20,
        }
    }
}

/// XIDs whose RDMA operations failed, remembered across reconnections so their
/// retransmissions get ERR_CHUNK instead of another connection loss (RFC 8166
/// §4.5.3, RPCR-MEM-05). Bounded: the oldest entry is forgotten first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedXids {
    xids: VecDeque<u32>,
    cap: usize,
}

impl FailedXids {
    /// Remember at most `cap` XIDs.
    pub fn new(cap: usize) -> Self {
        FailedXids {
            xids: VecDeque::with_capacity(cap.min(1024)),
            cap: cap.max(1),
        }
    }
    /// An RDMA Read or Write for `xid` failed: the connection must be closed
    /// (the caller does that), and the XID is remembered.
    pub fn record(&mut self, xid: u32) {
        if self.xids.contains(&xid) {
            return;
        }
        if self.xids.len() == self.cap {
            self.xids.pop_front();
        }
        self.xids.push_back(xid);
    }
    /// Whether `xid` failed before.
    pub fn contains(&self, xid: u32) -> bool {
        self.xids.contains(&xid)
    }
    /// Forget `xid` (after ERR_CHUNK was sent for it).
    pub fn forget(&mut self, xid: u32) {
        self.xids.retain(|&x| x != xid);
    }
}

fn err_chunk(failed: FixedHeader, reason: ErrorReason) -> ResponderDecision<'static> {
    ResponderDecision::SendError {
        failed,
        err: ErrorBody::Chunk,
        reason,
    }
}

/// Validate a message received by a Responder (matrix B.4.5 rows 1-13, 16).
pub fn validate_call<'a>(msg: &'a [u8], policy: &ResponderPolicy, failed_xids: &FailedXids) -> ResponderDecision<'a> {
    if msg.len() < MIN_HEADER_LEN {
        return ResponderDecision::Drop(DropReason::TooShort);
    }
    let Some(fixed) = FixedHeader::parse(msg) else {
        return ResponderDecision::Drop(DropReason::TooShort);
    };
    if fixed.vers != RPCRDMA_VERSION {
        let (low, high) = SUPPORTED_VERSIONS;
        return ResponderDecision::SendError {
            failed: fixed,
            err: ErrorBody::Vers { low, high },
            reason: ErrorReason::Version,
        };
    }
    match fixed.proc_ {
        proc_::RDMA_DONE => return ResponderDecision::Drop(DropReason::RdmaDone),
        proc_::RDMA_ERROR => return ResponderDecision::Drop(DropReason::RdmaErrorAtResponder),
        proc_::RDMA_MSGP => return err_chunk(fixed, ErrorReason::Msgp),
        proc_::RDMA_MSG | proc_::RDMA_NOMSG => {}
        _ => return err_chunk(fixed, ErrorReason::UnknownProc),
    }
    let (header, len) = match Header::decode(msg, &policy.limits) {
        Ok(h) => h,
        Err(_) => return err_chunk(fixed, ErrorReason::Xdr),
    };
    if failed_xids.contains(fixed.xid) {
        return err_chunk(fixed, ErrorReason::FailedXid);
    }
    let lists = header.body.lists().expect("MSG or NOMSG");
    let Ok(mut chunks) = group_read_list(&lists.reads) else {
        return err_chunk(fixed, ErrorReason::BadPosition);
    };
    let has_p0 = chunks.first().is_some_and(|c| c.position == 0);
    let (payload, base_len) = match &header.body {
        Body::Msg(_) => {
            if has_p0 {
                return err_chunk(fixed, ErrorReason::PositionZeroInMsg);
            }
            let payload = &msg[len..];
            if check_payload_xid(fixed.xid, payload).is_err() {
                return err_chunk(fixed, ErrorReason::XidMismatch);
            }
            if let Some((_, MSG_REPLY)) = peek_xid_and_type(payload) {
                return ResponderDecision::Drop(DropReason::BackwardDirection);
            }
            (CallPayload::Inline(payload), payload.len())
        }
        Body::NoMsg(_) => {
            if !has_p0 {
                return err_chunk(fixed, ErrorReason::NoPayloadChunk);
            }
            let p0 = chunks.remove(0);
            let p0_len = p0.total_len();
            if p0_len > policy.max_chunk {
                return err_chunk(fixed, ErrorReason::ChunkTooLarge);
            }
            // p0_len <= max_chunk; a usize on every supported target
            (CallPayload::PositionZero(p0), p0_len as usize)
        }
        _ => unreachable!("checked above"),
    };
    match check_read_positions(base_len, &chunks, policy.max_chunk) {
        Ok(()) => {}
        Err(crate::wire::chunks::ChunkError::ChunkTooLarge { .. }) => {
            return err_chunk(fixed, ErrorReason::ChunkTooLarge);
        }
        Err(_) => return err_chunk(fixed, ErrorReason::BadPosition),
    }
    ResponderDecision::Process(ValidCall {
        header,
        payload,
        read_chunks: chunks,
    })
}

/// After pulling a Long Call's Position-Zero chunk: its first word must be the
/// rdma_xid (RPCR-FRM-04); otherwise answer ERR_CHUNK.
pub fn check_payload_xid(rdma_xid: u32, payload: &[u8]) -> Result<(), ErrorReason> {
    match payload.get(..4) {
        Some(x) if x == rdma_xid.to_be_bytes() => Ok(()),
        _ => Err(ErrorReason::XidMismatch),
    }
}

/// How to answer a Call whose arguments did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UlpFailure {
    /// A chunk was misplaced or left over: RDMA_ERROR ERR_CHUNK (rows 12, 14).
    ErrChunk,
    /// The arguments did not decode: RPC Reply GARBAGE_ARGS via RDMA_MSG (row 15).
    GarbageArgs,
}

/// Classify an argument decoding error (RFC 8166 §4.5.2, §6.1; B.5 #11).
pub fn classify_decode_error(err: &XdrError) -> UlpFailure {
    if err.is_chunk_placement_error() {
        UlpFailure::ErrChunk
    } else {
        UlpFailure::GarbageArgs
    }
}

/// The whole Send for a GARBAGE_ARGS answer: an RDMA_MSG header with the given
/// grant, echoing the Call's Write list (unused) and Reply chunk (unused), then
/// the 24-byte RPC reply (RFC 8166 §4.5.2, RPCR-ERR-09).
pub fn garbage_args_message(xid: u32, credit: u32, call: &ChunkLists) -> Vec<u8> {
    let h = Header::new(
        xid,
        credit.max(1),
        Body::Msg(ChunkLists {
            reads: Vec::new(),
            writes: call
                .writes
                .iter()
                .map(|w| if w.is_empty_chunk() { w.clone() } else { w.as_unused() })
                .collect(),
            reply: call.reply.as_ref().map(|r| r.as_unused()),
        }),
    );
    let mut out = h.to_vec().expect("RDMA_MSG always encodes");
    out.extend_from_slice(&garbage_args_reply(xid));
    out
}

/// A Reply whose header passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidReply<'a> {
    /// The decoded header; `credit` is the new grant.
    pub header: Header,
    /// The inline Payload stream (RDMA_MSG); `None` for RDMA_NOMSG, whose
    /// Payload stream is in the Reply chunk.
    pub payload: Option<&'a [u8]>,
}

/// What a Requester does with a received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequesterDecision<'a> {
    /// A Reply for a pending RPC: rebuild and complete it.
    Process(ValidReply<'a>),
    /// RDMA_ERROR for a pending RPC: complete it with a permanent error
    /// (RPCR-ERR-05); `credit` is still a grant (B.5 #2).
    RpcFailed {
        /// XID of the failed RPC.
        xid: u32,
        /// rdma_credit of the RDMA_ERROR.
        credit: u32,
        /// ERR_VERS or ERR_CHUNK.
        error: ErrorBody,
    },
    /// Discard silently.
    Drop(DropReason),
}

/// Validate a message received by a Requester. `pending(xid)` returns the chunk
/// lists of the Call still waiting for that XID (rows 17-20).
pub fn validate_reply<'a, 'c>(
    msg: &'a [u8],
    limits: &Limits,
    pending: impl FnOnce(u32) -> Option<&'c ChunkLists>,
) -> RequesterDecision<'a> {
    use RequesterDecision::Drop;
    let Some(fixed) = FixedHeader::parse(msg) else {
        return Drop(DropReason::TooShort);
    };
    if fixed.vers != RPCRDMA_VERSION {
        return Drop(DropReason::UnsupportedVersion);
    }
    match fixed.proc_ {
        proc_::RDMA_MSGP => return Drop(DropReason::RdmaMsgp),
        proc_::RDMA_DONE => return Drop(DropReason::RdmaDone),
        proc_::RDMA_ERROR | proc_::RDMA_MSG | proc_::RDMA_NOMSG => {}
        _ => return Drop(DropReason::UnknownProc),
    }
    if fixed.proc_ != proc_::RDMA_ERROR && msg.len() < MIN_HEADER_LEN {
        return Drop(DropReason::TooShort);
    }
    let (header, len) = match Header::decode(msg, limits) {
        Ok(h) => h,
        Err(HeaderError::UnknownErrCode(_)) => return Drop(DropReason::UndecodableError),
        Err(_) if fixed.proc_ == proc_::RDMA_ERROR => return Drop(DropReason::UndecodableError),
        Err(_) => return Drop(DropReason::Malformed),
    };
    debug_assert!(len >= FIXED_HEADER_LEN);
    if let Body::Msg(_) = header.body
        && let Some((_, t)) = peek_xid_and_type(&msg[len..])
        && t == MSG_CALL
    {
        return Drop(DropReason::BackwardDirection);
    }
    let Some(call) = pending(fixed.xid) else {
        return Drop(DropReason::UnknownXid);
    };
    match &header.body {
        Body::Error(e) => RequesterDecision::RpcFailed {
            xid: fixed.xid,
            credit: fixed.credit,
            error: *e,
        },
        Body::Msg(l) | Body::NoMsg(l) => {
            if check_returned_chunks(call, l).is_err() {
                return Drop(DropReason::ChunkMismatch);
            }
            let payload = match &header.body {
                Body::Msg(_) => {
                    let p = &msg[len..];
                    if check_payload_xid(fixed.xid, p).is_err() {
                        return Drop(DropReason::XidMismatch);
                    }
                    Some(p)
                }
                _ => {
                    if l.reply.as_ref().is_none_or(|r| r.total_len() == 0) {
                        return Drop(DropReason::NoPayload);
                    }
                    None
                }
            };
            RequesterDecision::Process(ValidReply { header, payload })
        }
        Body::Msgp { .. } | Body::Done => unreachable!("dropped above"),
    }
}

#[cfg(test)]
mod tests;
