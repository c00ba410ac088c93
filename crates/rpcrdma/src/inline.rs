//! Inline thresholds and the choice of message form (RFC 8166 §3.3.2, §3.5,
//! §4.3.3; requirements B.2.3, B.2.7).
//!
//! The size compared with a threshold is always the **whole Send**: the
//! RPC-over-RDMA header (with every chunk list it carries, including the Write
//! list and Reply chunk a Call provisions, and the lists a Reply echoes) plus the
//! inline Payload stream (RPCR-FRM-09; requirements F #10). A message fits when
//! that size is `<=` the threshold.
//!
//! * A Call is sent **Short** (RDMA_MSG, everything inline) if it fits; else
//!   **Chunked** (RDMA_MSG, DDP-eligible items moved to Read chunks) if the
//!   reduced form fits; else **Long** (RDMA_NOMSG, the whole unreduced Payload
//!   stream in a Position-Zero Read chunk). Linux's client makes the same choice.
//!   With RPCSEC_GSS integrity/privacy nothing is reduced (RPCR-DDP-10).
//! * A Requester provisions Write chunks for eligible results and a Reply chunk
//!   when the largest possible Reply would not fit (RPCR-LNG-04, RPCR-WRC-01).
//! * A Responder reduces results into the Write chunks it was given (it MUST,
//!   §4.3.2), replies Short if the reduced Reply fits, else Long through the Reply
//!   chunk (RPCR-LNG-05); with no usable Reply chunk the answer is an error the
//!   caller turns into ERR_CHUNK (requirements B.5 #6).

use crate::wire::chunks::{
    ChunkError, RdmaWrite, Reduced, fill_reply_chunk, reduce, reduce_reply, reply_chunk_capacity,
};
use crate::wire::{Body, ChunkLists, FIXED_HEADER_LEN, Header, READ_SEGMENT_LEN, SEGMENT_LEN, WriteChunk};
use crate::xdr::DdpItem;

/// The RFC 8166 default and minimum inline threshold (§3.3.3).
pub const DEFAULT_INLINE_THRESHOLD: u32 = 1024;

/// The two inline thresholds of a connection (RPCR-INL-01).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Requester to Responder.
    pub call: u32,
    /// Responder to Requester.
    pub reply: u32,
}

impl Default for Thresholds {
    /// 1024 bytes both ways (RPCR-INL-03).
    fn default() -> Self {
        Thresholds {
            call: DEFAULT_INLINE_THRESHOLD,
            reply: DEFAULT_INLINE_THRESHOLD,
        }
    }
}

/// Errors choosing a form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InlineError {
    /// Even the Transport header alone does not fit the threshold.
    #[error("transport header of {len} bytes exceeds the inline threshold {threshold}")]
    HeaderTooLarge {
        /// Header size.
        len: usize,
        /// Threshold.
        threshold: u32,
    },
    /// The Reply does not fit inline and no Reply chunk was provided.
    #[error("reply of {len} bytes exceeds the inline threshold {threshold} and no reply chunk was provided")]
    ReplyTooLarge {
        /// Reply size (header + payload).
        len: usize,
        /// Threshold.
        threshold: u32,
    },
    /// Chunk arithmetic failed (bad items, Write or Reply chunk too small).
    #[error(transparent)]
    Chunk(#[from] ChunkError),
}

/// Options for a Call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallOptions {
    /// Send a Long Call even if the Call would fit (RPCR-LNG-03).
    pub force_long: bool,
    /// Never reduce (RPCSEC_GSS integrity or privacy, RPCR-DDP-10 / SEC-GSS-01).
    pub no_reduction: bool,
}

/// How a Call goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallForm {
    /// RDMA_MSG with the whole Payload stream inline.
    Short,
    /// RDMA_MSG with the reduced Payload stream; the items go in Read chunks.
    Chunked(Reduced),
    /// RDMA_NOMSG; the unreduced Payload stream goes in a Position-Zero Read chunk.
    Long,
}

/// A Call form and the size of its Send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPlan {
    /// The form.
    pub form: CallForm,
    /// Transport header size.
    pub header_len: usize,
    /// Header plus inline payload: what the Send carries.
    pub send_len: usize,
}

fn fits(len: usize, threshold: u32) -> bool {
    len <= threshold as usize
}

/// Header size of a message with `read_segments` read segments and the given
/// Write list and Reply chunk.
pub fn header_len(read_segments: usize, writes: &[WriteChunk], reply: Option<&WriteChunk>) -> usize {
    let writes: usize = writes
        .iter()
        .fold(0usize, |acc, w| acc.saturating_add(4 + w.encoded_len()));
    (FIXED_HEADER_LEN + 12)
        .saturating_add((4 + READ_SEGMENT_LEN).saturating_mul(read_segments))
        .saturating_add(writes)
        .saturating_add(reply.map_or(0, WriteChunk::encoded_len))
}

/// [`header_len`] from segment counts alone: `write_segments[i]` segments in the
/// i-th Write chunk, `reply_segments` in the Reply chunk (if any).
pub fn header_len_for_counts(read_segments: usize, write_segments: &[usize], reply_segments: Option<usize>) -> usize {
    let chunk = |n: usize| 4usize.saturating_add(SEGMENT_LEN.saturating_mul(n));
    let writes = write_segments
        .iter()
        .fold(0usize, |acc, &n| acc.saturating_add(4).saturating_add(chunk(n)));
    (FIXED_HEADER_LEN + 12)
        .saturating_add((4 + READ_SEGMENT_LEN).saturating_mul(read_segments))
        .saturating_add(writes)
        .saturating_add(reply_segments.map_or(0, chunk))
}

/// Choose the form of a Call (Requester). `stream` is the encoded RPC Call and
/// `items` its DDP-eligible items; `provisioned` holds the Write list and Reply
/// chunk this Call carries for its Reply (its Read list is ignored);
/// `segments_for(len)` says how many read segments the transport will need to
/// register `len` bytes.
pub fn plan_call(
    th: &Thresholds,
    stream: &[u8],
    items: &[DdpItem],
    provisioned: &ChunkLists,
    segments_for: impl Fn(usize) -> usize,
    opts: CallOptions,
) -> Result<CallPlan, InlineError> {
    let hdr = |reads: usize| header_len(reads, &provisioned.writes, provisioned.reply.as_ref());
    if !opts.force_long {
        let h = hdr(0);
        if fits(h + stream.len(), th.call) {
            return Ok(CallPlan {
                form: CallForm::Short,
                header_len: h,
                send_len: h + stream.len(),
            });
        }
        if !opts.no_reduction && items.iter().any(|i| i.len > 0) {
            let reduced = reduce(stream, items)?;
            let segs = reduced
                .items
                .iter()
                .fold(0usize, |acc, i| acc.saturating_add(segments_for(i.range.len()).max(1)));
            let h = hdr(segs);
            let send_len = h + reduced.payload.len();
            if fits(send_len, th.call) {
                return Ok(CallPlan {
                    form: CallForm::Chunked(reduced),
                    header_len: h,
                    send_len,
                });
            }
        }
    }
    let h = hdr(segments_for(stream.len()).max(1));
    if !fits(h, th.call) {
        return Err(InlineError::HeaderTooLarge {
            len: h,
            threshold: th.call,
        });
    }
    Ok(CallPlan {
        form: CallForm::Long,
        header_len: h,
        send_len: h,
    })
}

/// Largest RPC reply header for an accepted reply with a verifier body of at most
/// `max_verifier` bytes (xid, msg_type, reply_stat, verifier, accept_stat).
pub fn max_rpc_reply_header(max_verifier: u32) -> u32 {
    24 + crate::xdr::roundup_u32(max_verifier.min(400)).unwrap_or(400)
}

/// What a Requester provisions for a Reply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplyResources {
    /// Capacity in bytes of each Write chunk (one per DDP-eligible result,
    /// no room for pad: RPCR-WRC-04); empty when no Write list is provided.
    pub write_chunks: Vec<u32>,
    /// Capacity of the Reply chunk (pad included: RPCR-LNG-08), if one is needed.
    pub reply_chunk: Option<u32>,
}

/// Decide the Reply resources of a Call (Requester, RFC 8166 §3.4.6, §4.3.3,
/// §6.2). `max_payload` is the largest Reply Payload stream (RPC reply header and
/// results, unreduced); `ddp_results` the largest length of each DDP-eligible
/// result item. `segments_for(len)` gives the segment count the transport will
/// use to register `len` bytes (it sizes the echoed lists in the Reply header).
pub fn plan_reply_resources(
    th: &Thresholds,
    max_payload: u32,
    ddp_results: &[u32],
    segments_for: impl Fn(usize) -> usize,
    opts: CallOptions,
) -> ReplyResources {
    let max_payload = max_payload as usize;
    if fits(header_len(0, &[], None) + max_payload, th.reply) {
        return ReplyResources::default();
    }
    let mut write_segs = Vec::new();
    let mut reduced = max_payload;
    if !opts.no_reduction {
        for &r in ddp_results {
            write_segs.push(segments_for(r as usize).max(1));
            let padded = crate::xdr::roundup(r as usize).unwrap_or(usize::MAX);
            reduced = reduced.saturating_sub(padded);
        }
    }
    let write_chunks: Vec<u32> = if opts.no_reduction {
        Vec::new()
    } else {
        ddp_results.to_vec()
    };
    if !write_segs.is_empty() && fits(header_len_for_counts(0, &write_segs, None) + reduced, th.reply) {
        return ReplyResources {
            write_chunks,
            reply_chunk: None,
        };
    }
    let cap = reply_chunk_capacity(reduced as u32).unwrap_or(u32::MAX);
    ReplyResources {
        write_chunks,
        reply_chunk: Some(cap),
    }
}

/// How a Reply goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyForm {
    /// RDMA_MSG with the (reduced) Payload stream inline.
    Short,
    /// RDMA_NOMSG; the Payload stream is written into the Reply chunk.
    Long,
}

/// A Reply ready to send (Responder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedReply {
    /// The Transport header (Write list and Reply chunk echoed, RPCR-WRC-03,
    /// RPCR-LNG-07).
    pub header: Header,
    /// Short or Long.
    pub form: ReplyForm,
    /// The reduced Payload stream: inline after the header (Short) or written
    /// into the Reply chunk (Long).
    pub payload: Vec<u8>,
    /// RDMA Writes of result items into Write chunks; `src` indexes the
    /// *unreduced* reply stream.
    pub item_writes: Vec<RdmaWrite>,
    /// RDMA Writes of the Payload stream into the Reply chunk (Long only); `src`
    /// indexes `payload`.
    pub payload_writes: Vec<RdmaWrite>,
}

impl PlannedReply {
    /// Bytes of the Send: header plus inline payload.
    pub fn send_len(&self) -> usize {
        self.header.encoded_len()
            + match self.form {
                ReplyForm::Short => self.payload.len(),
                ReplyForm::Long => 0,
            }
    }
}

/// Build a Reply (Responder). `stream` is the encoded RPC Reply and `items` its
/// DDP-eligible results; `call` the chunk lists of the Call being answered.
/// All RDMA Writes must be posted before the Send (RFC 8166 §3.5.2).
pub fn plan_reply(
    th: &Thresholds,
    xid: u32,
    credit: u32,
    stream: &[u8],
    items: &[DdpItem],
    call: &ChunkLists,
) -> Result<PlannedReply, InlineError> {
    let red = reduce_reply(stream, items, &call.writes)?;
    // B.5 #5: a provided Reply chunk is echoed even when unused, lengths 0
    let unused_reply = call.reply.as_ref().map(WriteChunk::as_unused);
    let short = Header::new(
        xid,
        credit,
        Body::Msg(ChunkLists {
            reads: Vec::new(),
            writes: red.write_list.clone(),
            reply: unused_reply,
        }),
    );
    let short_len = short.encoded_len() + red.payload.len();
    if fits(short_len, th.reply) {
        return Ok(PlannedReply {
            header: short,
            form: ReplyForm::Short,
            payload: red.payload,
            item_writes: red.writes,
            payload_writes: Vec::new(),
        });
    }
    let Some(reply_chunk) = &call.reply else {
        return Err(InlineError::ReplyTooLarge {
            len: short_len,
            threshold: th.reply,
        });
    };
    let (echo, payload_writes) = fill_reply_chunk(red.payload.len(), reply_chunk)?;
    let header = Header::new(
        xid,
        credit,
        Body::NoMsg(ChunkLists {
            reads: Vec::new(),
            writes: red.write_list,
            reply: Some(echo),
        }),
    );
    if !fits(header.encoded_len(), th.reply) {
        return Err(InlineError::HeaderTooLarge {
            len: header.encoded_len(),
            threshold: th.reply,
        });
    }
    Ok(PlannedReply {
        header,
        form: ReplyForm::Long,
        payload: red.payload,
        item_writes: red.writes,
        payload_writes,
    })
}

#[cfg(test)]
mod tests;
