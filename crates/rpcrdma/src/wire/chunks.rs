//! Chunk position arithmetic and roundup (RFC 8166 §3.4, §3.5.3, §4.3).
//!
//! Rules implemented here, with the requirement IDs they serve:
//!
//! * A Read chunk's Position is the byte offset in the **unreduced** Payload
//!   stream (RPCR-RDC-01); every earlier reduced item counts with its data *and*
//!   its roundup pad (requirements B.5 #8). Positions are multiples of four
//!   (RPCR-RDC-02).
//! * Reducing removes the item's data and its pad from the Payload stream
//!   (RPCR-DDP-06); the count / present word stays (RPCR-DDP-02/03).
//! * The Requester sends Read chunks without pad (RPCR-RDC-04 SHOULD NOT); the
//!   Responder accepts chunks of `len` or `roundup(len)` bytes and re-inserts
//!   `roundup(chunk length)` bytes, zero-filling the pad, so later Positions line
//!   up whichever form the peer used.
//! * All read segments with the same Position form one chunk, concatenated in
//!   list order; chunks of different Positions may come in any order (B.5 #7).
//! * The Responder fills one result item per Write chunk, in segment order, never
//!   writes pad, echoes every provided chunk with the segment count unchanged and
//!   lengths set to what it wrote; unconsumed chunks come back "unused" (lengths
//!   0) and empty chunks come back empty (RPCR-WRC-02..10).
//! * Position-Zero Read chunk and Reply chunk carry a whole Payload stream, pad
//!   included (RPCR-LNG-08).

use std::ops::Range;

use crate::xdr::{DdpItem, InsertedChunk, pad_len, roundup};

use super::{ChunkLists, ReadSegment, Segment, WriteChunk};

/// Errors of chunk arithmetic. On a received Call they map to ERR_CHUNK.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// A Position that is not a multiple of four (RPCR-RDC-02).
    #[error("read chunk position {0} is not a multiple of four")]
    PositionNotAligned(u32),
    /// A Position beyond the end of the (rebuilt) Payload stream, or one that
    /// would place a chunk inside the previous one.
    #[error("read chunk position {position} is outside the payload stream")]
    PositionOutOfRange {
        /// The offending Position.
        position: u32,
    },
    /// A chunk larger than the upper-layer limit (RFC 8166 §8.1.4, RPCR-SEC-05).
    #[error("chunk of {len} bytes exceeds the limit {max}")]
    ChunkTooLarge {
        /// Chunk length.
        len: u64,
        /// Limit.
        max: u64,
    },
    /// DDP items not sorted, overlapping, misaligned or past the stream end.
    #[error("DDP-eligible item at {offset}+{len} is not a valid reducible item")]
    BadItem {
        /// Item offset.
        offset: usize,
        /// Item length.
        len: usize,
    },
    /// A Write chunk too small for its result item (the Requester under-provisioned).
    #[error("write chunk {index} holds {have} bytes, the result needs {need}")]
    WriteChunkTooSmall {
        /// Index in the Write list.
        index: usize,
        /// Needed bytes.
        need: u64,
        /// Provided bytes.
        have: u64,
    },
    /// The Reply chunk cannot hold the reply (RFC 8166 §4.5.3).
    #[error("reply chunk holds {have} bytes, the reply needs {need}")]
    ReplyChunkTooSmall {
        /// Needed bytes.
        need: u64,
        /// Provided bytes.
        have: u64,
    },
    /// A Reply's chunk lists do not match what the Call provided (B.4.5 #17/#18).
    #[error("reply chunk lists do not match the call: {0}")]
    ReturnedMismatch(&'static str),
    /// Arithmetic overflow on peer-supplied values.
    #[error("chunk length arithmetic overflow")]
    Overflow,
}

/// A Read chunk: the read segments sharing one Position, in list order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadChunk {
    /// Position in the unreduced Payload stream.
    pub position: u32,
    /// Segments to concatenate, in list order (RPCR-RDC-03).
    pub segments: Vec<Segment>,
}

impl ReadChunk {
    /// Chunk length: the sum of its segment lengths.
    pub fn total_len(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// Group a Read list into Read chunks sorted by Position (B.5 #7), checking that
/// every Position is a multiple of four (RPCR-RDC-02).
pub fn group_read_list(reads: &[ReadSegment]) -> Result<Vec<ReadChunk>, ChunkError> {
    let mut chunks: Vec<ReadChunk> = Vec::new();
    for r in reads {
        if r.position % 4 != 0 {
            return Err(ChunkError::PositionNotAligned(r.position));
        }
        match chunks.iter_mut().find(|c| c.position == r.position) {
            Some(c) => c.segments.push(r.target),
            None => chunks.push(ReadChunk {
                position: r.position,
                segments: vec![r.target],
            }),
        }
    }
    chunks.sort_by_key(|c| c.position);
    Ok(chunks)
}

/// Check, before any RDMA Read, that each chunk's Position can be reached in a
/// stream whose reduced (inline) part is `reduced_len` bytes, and that no chunk
/// exceeds `max_chunk` (RFC 8166 §8.1.4). `chunks` sorted by Position, as
/// [`group_read_list`] returns them, and without the Position-Zero chunk of a
/// Long Call (pass the Position-Zero chunk's length as `reduced_len` then).
pub fn check_read_positions(reduced_len: usize, chunks: &[ReadChunk], max_chunk: u64) -> Result<(), ChunkError> {
    let mut inserted: u64 = 0;
    let mut prev_reduced: u64 = 0;
    for c in chunks {
        let len = c.total_len();
        if len > max_chunk {
            return Err(ChunkError::ChunkTooLarge { len, max: max_chunk });
        }
        let pos = u64::from(c.position);
        let reduced_off = pos
            .checked_sub(inserted)
            .ok_or(ChunkError::PositionOutOfRange { position: c.position })?;
        if reduced_off < prev_reduced || reduced_off > reduced_len as u64 {
            return Err(ChunkError::PositionOutOfRange { position: c.position });
        }
        prev_reduced = reduced_off;
        inserted = inserted
            .checked_add(len + pad_len(len as usize) as u64)
            .ok_or(ChunkError::Overflow)?;
    }
    Ok(())
}

/// One reduced item: where it goes (Position) and which bytes of the original
/// stream it is (data only, no pad: RPCR-RDC-04).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReducedItem {
    /// Position in the unreduced stream.
    pub position: u32,
    /// The item's data in the original (unreduced) stream.
    pub range: Range<usize>,
}

/// A reduced Payload stream and the items removed from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reduced {
    /// The reduced Payload stream (what goes inline).
    pub payload: Vec<u8>,
    /// The removed items, in stream order.
    pub items: Vec<ReducedItem>,
}

fn check_items(stream_len: usize, items: &[DdpItem]) -> Result<(), ChunkError> {
    let mut prev_end = 0usize;
    for it in items {
        let bad = ChunkError::BadItem {
            offset: it.offset,
            len: it.len,
        };
        let end = it
            .offset
            .checked_add(roundup(it.len).ok_or(ChunkError::Overflow)?)
            .ok_or(ChunkError::Overflow)?;
        if it.offset % 4 != 0 || it.offset < prev_end || end > stream_len {
            return Err(bad);
        }
        if u32::try_from(it.offset).is_err() || u32::try_from(it.len).is_err() {
            return Err(bad);
        }
        prev_end = end;
    }
    Ok(())
}

/// Reduce `stream` by removing the given DDP-eligible items (data and pad) for
/// Read chunks (RFC 8166 §3.4.1, §3.4.4.4). Zero-length items are left inline:
/// they carry no bytes, and a zero-length chunk would share its Position with the
/// next item.
pub fn reduce(stream: &[u8], items: &[DdpItem]) -> Result<Reduced, ChunkError> {
    check_items(stream.len(), items)?;
    let mut payload = Vec::with_capacity(stream.len());
    let mut out_items = Vec::with_capacity(items.len());
    let mut at = 0usize;
    for it in items.iter().filter(|i| i.len > 0) {
        payload.extend_from_slice(&stream[at..it.offset]);
        out_items.push(ReducedItem {
            // checked in check_items
            position: it.offset as u32,
            range: it.offset..it.offset + it.len,
        });
        at = it.offset + it.padded_len();
    }
    payload.extend_from_slice(&stream[at..]);
    Ok(Reduced {
        payload,
        items: out_items,
    })
}

/// Rebuild the unreduced stream from a reduced one and its Read chunks' data
/// (RFC 8166 §3.4.5): each chunk goes in at its Position followed by zero pad up
/// to `roundup(chunk length)`. Chunks sorted by Position.
///
/// The decoder can do the same without copying ([`crate::xdr::ChunkSource`]);
/// this copy form is for callers that need one contiguous buffer.
pub fn reinsert(reduced: &[u8], chunks: &[InsertedChunk<'_>]) -> Result<Vec<u8>, ChunkError> {
    let total = chunks.iter().try_fold(reduced.len(), |acc, c| {
        roundup(c.data.len()).and_then(|l| acc.checked_add(l))
    });
    let mut out = Vec::with_capacity(total.ok_or(ChunkError::Overflow)?);
    let mut at = 0usize; // offset in `reduced`
    for c in chunks {
        if c.position % 4 != 0 {
            return Err(ChunkError::PositionNotAligned(c.position));
        }
        let reduced_off = (c.position as usize)
            .checked_sub(out.len() - at)
            .ok_or(ChunkError::PositionOutOfRange { position: c.position })?;
        if reduced_off < at || reduced_off > reduced.len() {
            return Err(ChunkError::PositionOutOfRange { position: c.position });
        }
        out.extend_from_slice(&reduced[at..reduced_off]);
        out.extend_from_slice(c.data);
        out.extend_from_slice(&[0u8; 3][..pad_len(c.data.len())]);
        at = reduced_off;
    }
    out.extend_from_slice(&reduced[at..]);
    Ok(out)
}

/// The Read list of a Long Call: every segment at Position zero (RPCR-LNG-02).
pub fn position_zero_read_list(segments: &[Segment]) -> Vec<ReadSegment> {
    segments
        .iter()
        .map(|s| ReadSegment {
            position: 0,
            target: *s,
        })
        .collect()
}

/// Bytes a Requester registers for a Write chunk receiving an item of at most
/// `max_item_len` bytes: no room for pad (RPCR-WRC-04, §3.4.6.2 SHOULD NOT).
pub fn write_chunk_capacity(max_item_len: u32) -> u32 {
    max_item_len
}

/// Bytes a Requester registers for a Reply chunk carrying a Payload stream of at
/// most `max_payload` bytes: a Payload stream keeps its pad (RPCR-LNG-08).
pub fn reply_chunk_capacity(max_payload: u32) -> Option<u32> {
    crate::xdr::roundup_u32(max_payload)
}

/// One RDMA Write the Responder issues: `src` bytes of its local buffer to
/// `(handle, remote_offset)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaWrite {
    /// Remote steering tag.
    pub handle: u32,
    /// Remote offset / address.
    pub remote_offset: u64,
    /// Source bytes in the buffer the plan was made for.
    pub src: Range<usize>,
}

/// Fill `chunk` with `len` bytes starting at `src_start`, in segment order
/// (RPCR-WRC-02). Returns the echoed chunk (lengths = bytes written) and the
/// writes; `None` if the chunk is too small.
fn fill_chunk(chunk: &WriteChunk, src_start: usize, len: usize) -> Option<(WriteChunk, Vec<RdmaWrite>)> {
    let mut left = len;
    let mut at = src_start;
    let mut echoed = Vec::with_capacity(chunk.segments.len());
    let mut writes = Vec::new();
    for s in &chunk.segments {
        let n = left.min(s.length as usize);
        echoed.push(Segment { length: n as u32, ..*s });
        if n > 0 {
            writes.push(RdmaWrite {
                handle: s.handle,
                remote_offset: s.offset,
                src: at..at + n,
            });
        }
        at += n;
        left -= n;
    }
    (left == 0).then_some((WriteChunk { segments: echoed }, writes))
}

/// A reply reduced into the Requester's Write chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyReduction {
    /// Reduced reply Payload stream (inline, or into the Reply chunk).
    pub payload: Vec<u8>,
    /// The Write list to echo in the Reply header (RPCR-WRC-03).
    pub write_list: Vec<WriteChunk>,
    /// RDMA Writes of the result items; `src` indexes the *unreduced* stream.
    pub writes: Vec<RdmaWrite>,
}

/// Responder side: place the reply's DDP-eligible results into the provided
/// Write chunks (RFC 8166 §3.4.6, §4.3.2). The i-th eligible result takes the
/// i-th chunk; an empty chunk keeps its result inline (§4.3.2.3); results beyond
/// the Write list stay inline; chunks left over are returned unused (§4.3.2.2).
pub fn reduce_reply(stream: &[u8], items: &[DdpItem], provided: &[WriteChunk]) -> Result<ReplyReduction, ChunkError> {
    check_items(stream.len(), items)?;
    let mut payload = Vec::with_capacity(stream.len());
    let mut write_list = Vec::with_capacity(provided.len());
    let mut writes = Vec::new();
    let mut at = 0usize;
    for (index, chunk) in provided.iter().enumerate() {
        let Some(it) = items.get(index) else {
            write_list.push(chunk.as_unused());
            continue;
        };
        if chunk.is_empty_chunk() {
            write_list.push(WriteChunk::default());
            continue;
        }
        let (echoed, w) = fill_chunk(chunk, it.offset, it.len).ok_or(ChunkError::WriteChunkTooSmall {
            index,
            need: it.len as u64,
            have: chunk.total_len(),
        })?;
        payload.extend_from_slice(&stream[at..it.offset]);
        at = it.offset + it.padded_len();
        write_list.push(echoed);
        writes.extend(w);
    }
    payload.extend_from_slice(&stream[at..]);
    Ok(ReplyReduction {
        payload,
        write_list,
        writes,
    })
}

/// Responder side: write a `payload_len`-byte Payload stream into the Reply chunk
/// (Long Reply, RFC 8166 §3.5.3). Returns the chunk to echo and the writes
/// (`src` indexes the payload).
pub fn fill_reply_chunk(payload_len: usize, reply: &WriteChunk) -> Result<(WriteChunk, Vec<RdmaWrite>), ChunkError> {
    fill_chunk(reply, 0, payload_len).ok_or(ChunkError::ReplyChunkTooSmall {
        need: payload_len as u64,
        have: reply.total_len(),
    })
}

/// Requester side: check the chunk lists of a Reply against those of its Call
/// (RFC 8166 §3.4.6, §4.3.1, §4.3.3; B.4.5 #17 and #18). A Reply must have an
/// empty Read list; each returned Write chunk must be the provided one with the
/// same segment count, handles and offsets, and lengths no larger; there may not
/// be more Write chunks than provided; a returned Reply chunk must match the
/// provided one the same way. An absent Reply chunk is accepted even when one was
/// provided (B.5 #5).
pub fn check_returned_chunks(call: &ChunkLists, reply: &ChunkLists) -> Result<(), ChunkError> {
    use ChunkError::ReturnedMismatch as M;
    if !reply.reads.is_empty() {
        return Err(M("read list in a reply"));
    }
    if reply.writes.len() > call.writes.len() {
        return Err(M("more write chunks than provided"));
    }
    for (p, r) in call.writes.iter().zip(&reply.writes) {
        same_chunk(p, r)?;
    }
    match (&call.reply, &reply.reply) {
        (_, None) => Ok(()),
        (None, Some(_)) => Err(M("reply chunk not provided")),
        (Some(p), Some(r)) => same_chunk(p, r),
    }
}

fn same_chunk(provided: &WriteChunk, returned: &WriteChunk) -> Result<(), ChunkError> {
    use ChunkError::ReturnedMismatch as M;
    if provided.segments.len() != returned.segments.len() {
        return Err(M("segment count changed"));
    }
    for (p, r) in provided.segments.iter().zip(&returned.segments) {
        if p.handle != r.handle || p.offset != r.offset {
            return Err(M("segment handle or offset changed"));
        }
        if r.length > p.length {
            return Err(M("segment length above the provided length"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
