//! The RPC-over-RDMA version 1 Transport header (RFC 8166 §4).
//!
//! Read RFC 8166 §4.1.2 (the XDR), §4.2-§4.3 (fields and chunk lists), §4.5-§4.6
//! (errors, RDMA_MSGP/RDMA_DONE) and §4.7 (flattened examples) before editing.
//!
//! * [`Header::decode`] reads the four fixed words first ([`FixedHeader`],
//!   RPCR-EXT-01: they keep their place in every version), and decodes the body
//!   only for version 1. Every list is bounded by [`Limits`] *and* by the bytes
//!   left in the message, so a hostile header cannot make us allocate more than
//!   a small multiple of its own size.
//! * RDMA_MSGP and RDMA_DONE are parsed (RFC 8166 §4.6 keeps their XDR for
//!   backwards compatibility) so the receiver can react as §4.6 says; this crate
//!   never sends them ([`Header::encode`] refuses).
//! * Position arithmetic, reduction and re-insertion live in [`chunks`].

pub mod chunks;

use crate::xdr::{Decoder, Encoder, Sink, XdrError};

/// RPC-over-RDMA protocol version implemented here.
pub const RPCRDMA_VERSION: u32 = 1;
/// Size of the four fixed header words.
pub const FIXED_HEADER_LEN: usize = 16;
/// Minimal RDMA_MSG/RDMA_NOMSG header: fixed words and three empty lists (§4.5).
pub const MIN_HEADER_LEN: usize = 28;
/// RDMA_ERROR with ERR_CHUNK.
pub const ERR_CHUNK_LEN: usize = 20;
/// RDMA_ERROR with ERR_VERS.
pub const ERR_VERS_LEN: usize = 28;
/// Size of a plain segment (HLOO).
pub const SEGMENT_LEN: usize = 16;
/// Size of a read segment (PHLOO).
pub const READ_SEGMENT_LEN: usize = 20;

/// `rdma_proc` values (RFC 8166 §4.2.4).
pub mod proc_ {
    /// RDMA_MSG.
    pub const RDMA_MSG: u32 = 0;
    /// RDMA_NOMSG.
    pub const RDMA_NOMSG: u32 = 1;
    /// RDMA_MSGP (not to be used).
    pub const RDMA_MSGP: u32 = 2;
    /// RDMA_DONE (not to be used).
    pub const RDMA_DONE: u32 = 3;
    /// RDMA_ERROR.
    pub const RDMA_ERROR: u32 = 4;
}

/// `rpc_rdma_errcode`.
pub mod errcode {
    /// ERR_VERS (value fixed for all versions).
    pub const ERR_VERS: u32 = 1;
    /// ERR_CHUNK.
    pub const ERR_CHUNK: u32 = 2;
}

/// A plain segment `xdr_rdma_segment` (HLOO, RFC 8166 §3.4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Segment {
    /// Steering tag (STag / R_key), at most 32 bits (RPCR-FRM-10).
    pub handle: u32,
    /// Length of the region in bytes.
    pub length: u32,
    /// Offset or virtual address, at most 64 bits.
    pub offset: u64,
}

/// An RDMA read segment `xdr_read_chunk` (PHLOO, RFC 8166 §3.4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadSegment {
    /// Position in the unreduced Payload stream.
    pub position: u32,
    /// Where the data is.
    pub target: Segment,
}

/// A Write chunk (or the Reply chunk): a counted array of plain segments.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct WriteChunk {
    /// The segments, in array order.
    pub segments: Vec<Segment>,
}

impl WriteChunk {
    /// Sum of the segment lengths (u64: cannot overflow for any legal count).
    pub fn total_len(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.length)).sum()
    }
    /// An "empty Write chunk": segment count zero (RFC 8166 §3.4.6).
    pub fn is_empty_chunk(&self) -> bool {
        self.segments.is_empty()
    }
    /// An "unused Write chunk": non-zero count, every segment empty.
    pub fn is_unused(&self) -> bool {
        !self.segments.is_empty() && self.segments.iter().all(|s| s.length == 0)
    }
    /// The same chunk with every length set to zero (the unused form, §4.3.2.2).
    pub fn as_unused(&self) -> WriteChunk {
        WriteChunk {
            segments: self.segments.iter().map(|s| Segment { length: 0, ..*s }).collect(),
        }
    }
    /// Encoded size as a counted array.
    pub fn encoded_len(&self) -> usize {
        4 + SEGMENT_LEN * self.segments.len()
    }
}

/// The three chunk lists of RDMA_MSG / RDMA_NOMSG (RFC 8166 §4.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChunkLists {
    /// Read list, in list order (group with [`chunks::group_read_list`]).
    pub reads: Vec<ReadSegment>,
    /// Write list, in list order.
    pub writes: Vec<WriteChunk>,
    /// Reply chunk, if present.
    pub reply: Option<WriteChunk>,
}

impl ChunkLists {
    /// True when all three are "not present".
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty() && self.reply.is_none()
    }

    /// Flattened size (RFC 8166 §4.7):
    /// `(4 + 24r) + (4 + Sum(8 + 16 n_i)) + (4 | 8 + 16m)`.
    pub fn encoded_len(&self) -> usize {
        let reads = 4 + (4 + READ_SEGMENT_LEN) * self.reads.len();
        let writes = 4 + self.writes.iter().map(|w| 4 + w.encoded_len()).sum::<usize>();
        let reply = 4 + self.reply.as_ref().map_or(0, WriteChunk::encoded_len);
        reads + writes + reply
    }
}

/// `rpc_rdma_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorBody {
    /// ERR_VERS with the supported version range.
    Vers {
        /// Lowest supported version.
        low: u32,
        /// Highest supported version.
        high: u32,
    },
    /// ERR_CHUNK.
    Chunk,
}

/// `rdma_body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// RDMA_MSG: chunk lists, then the Payload stream follows the header.
    Msg(ChunkLists),
    /// RDMA_NOMSG: chunk lists; the Payload stream travels in a chunk.
    NoMsg(ChunkLists),
    /// RDMA_MSGP (RFC 5666 §3.9): parsed only, never sent.
    Msgp {
        /// rdma_align.
        align: u32,
        /// rdma_thresh.
        thresh: u32,
        /// The chunk lists.
        lists: ChunkLists,
    },
    /// RDMA_DONE: parsed only, never sent.
    Done,
    /// RDMA_ERROR.
    Error(ErrorBody),
}

impl Body {
    /// The `rdma_proc` discriminant.
    pub fn proc_(&self) -> u32 {
        match self {
            Body::Msg(_) => proc_::RDMA_MSG,
            Body::NoMsg(_) => proc_::RDMA_NOMSG,
            Body::Msgp { .. } => proc_::RDMA_MSGP,
            Body::Done => proc_::RDMA_DONE,
            Body::Error(_) => proc_::RDMA_ERROR,
        }
    }

    /// The chunk lists, for the procedures that have them.
    pub fn lists(&self) -> Option<&ChunkLists> {
        match self {
            Body::Msg(l) | Body::NoMsg(l) | Body::Msgp { lists: l, .. } => Some(l),
            Body::Done | Body::Error(_) => None,
        }
    }
}

/// The four fixed words, readable in every version (RFC 8166 §4.2, §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedHeader {
    /// rdma_xid.
    pub xid: u32,
    /// rdma_vers.
    pub vers: u32,
    /// rdma_credit.
    pub credit: u32,
    /// rdma_proc (raw; unknown values are kept).
    pub proc_: u32,
}

impl FixedHeader {
    /// Read the fixed words; `None` if fewer than 16 bytes.
    pub fn parse(buf: &[u8]) -> Option<FixedHeader> {
        let mut d = Decoder::new(buf.get(..FIXED_HEADER_LEN)?);
        Some(FixedHeader {
            xid: d.get_u32().ok()?,
            vers: d.get_u32().ok()?,
            credit: d.get_u32().ok()?,
            proc_: d.get_u32().ok()?,
        })
    }
}

/// An RPC-over-RDMA header (`rdma_msg` without the Payload stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// rdma_xid: the XID of the carried RPC message (RPCR-FRM-04).
    pub xid: u32,
    /// rdma_vers (1).
    pub vers: u32,
    /// rdma_credit: requested (Call) or granted (Reply) credits.
    pub credit: u32,
    /// The procedure and its body.
    pub body: Body,
}

/// Decoding limits for chunk lists. Counts are also bounded by the message size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum read segments in the Read list.
    pub max_read_segments: usize,
    /// Maximum Write chunks in the Write list.
    pub max_write_chunks: usize,
    /// Maximum segments in one Write chunk or in the Reply chunk.
    pub max_segments_per_chunk: usize,
}

impl Default for Limits {
    /// Generous for Linux (`RPCRDMA_MAX_DATA_SEGS` = 257 per chunk, requirements
    /// section 4.1 of the peers file), small enough to bound work per header.
    fn default() -> Self {
        Limits {
            max_read_segments: 512,
            max_write_chunks: 16,
            max_segments_per_chunk: 512,
        }
    }
}

/// Header decoding errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than 16 bytes: not even the fixed words.
    #[error("message of {0} bytes is shorter than the fixed header")]
    TooShort(usize),
    /// rdma_vers is not 1: the body layout is unknown.
    #[error("unsupported RPC-over-RDMA version {0}")]
    UnsupportedVersion(u32),
    /// rdma_proc outside 0..=4.
    #[error("unknown rdma_proc {0}")]
    UnknownProc(u32),
    /// rdma_err outside ERR_VERS/ERR_CHUNK.
    #[error("unknown rdma_err {0}")]
    UnknownErrCode(u32),
    /// A list is longer than [`Limits`] allows.
    #[error("{what} has more than {max} entries")]
    TooMany {
        /// Which list.
        what: &'static str,
        /// The limit.
        max: usize,
    },
    /// XDR error (truncation, optional-data discriminator not 0/1, ...).
    #[error("XDR error in the transport header: {0}")]
    Xdr(#[from] XdrError),
    /// Refused to encode RDMA_MSGP or RDMA_DONE (RFC 8166 §4.6).
    #[error("RDMA_MSGP and RDMA_DONE must not be sent")]
    ObsoleteProc,
}

impl Header {
    /// A version-1 header.
    pub fn new(xid: u32, credit: u32, body: Body) -> Header {
        Header {
            xid,
            vers: RPCRDMA_VERSION,
            credit,
            body,
        }
    }

    /// The RDMA_ERROR answering a failed message: xid and vers copied from it,
    /// the current credit grant (requirements B.5 #2) (RFC 8166 §4.5, RPCR-ERR-04).
    pub fn error_reply(failed: &FixedHeader, credit: u32, err: ErrorBody) -> Header {
        Header {
            xid: failed.xid,
            vers: failed.vers,
            credit,
            body: Body::Error(err),
        }
    }

    /// Flattened size of the header (RFC 8166 §4.7).
    pub fn encoded_len(&self) -> usize {
        FIXED_HEADER_LEN
            + match &self.body {
                Body::Msg(l) | Body::NoMsg(l) => l.encoded_len(),
                Body::Msgp { lists, .. } => 8 + lists.encoded_len(),
                Body::Done => 0,
                Body::Error(ErrorBody::Chunk) => 4,
                Body::Error(ErrorBody::Vers { .. }) => 12,
            }
    }

    /// Decode a header; returns it and its length (where the Payload stream of
    /// RDMA_MSG starts). Only version 1 bodies are decoded.
    pub fn decode(buf: &[u8], limits: &Limits) -> Result<(Header, usize), HeaderError> {
        let fixed = FixedHeader::parse(buf).ok_or(HeaderError::TooShort(buf.len()))?;
        if fixed.vers != RPCRDMA_VERSION {
            return Err(HeaderError::UnsupportedVersion(fixed.vers));
        }
        let mut d = Decoder::new(&buf[FIXED_HEADER_LEN..]);
        let body = match fixed.proc_ {
            proc_::RDMA_MSG => Body::Msg(decode_lists(&mut d, limits)?),
            proc_::RDMA_NOMSG => Body::NoMsg(decode_lists(&mut d, limits)?),
            proc_::RDMA_MSGP => Body::Msgp {
                align: d.get_u32()?,
                thresh: d.get_u32()?,
                lists: decode_lists(&mut d, limits)?,
            },
            proc_::RDMA_DONE => Body::Done,
            proc_::RDMA_ERROR => Body::Error(match d.get_enum()? {
                errcode::ERR_VERS => ErrorBody::Vers {
                    low: d.get_u32()?,
                    high: d.get_u32()?,
                },
                errcode::ERR_CHUNK => ErrorBody::Chunk,
                e => return Err(HeaderError::UnknownErrCode(e)),
            }),
            p => return Err(HeaderError::UnknownProc(p)),
        };
        let len = FIXED_HEADER_LEN + d.offset();
        Ok((
            Header {
                xid: fixed.xid,
                vers: fixed.vers,
                credit: fixed.credit,
                body,
            },
            len,
        ))
    }

    /// Append the header. RDMA_MSGP and RDMA_DONE are refused (RFC 8166 §4.6:
    /// senders MUST NOT send them); use [`Header::encode_any`] in tests.
    pub fn encode<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), HeaderError> {
        if matches!(self.body, Body::Msgp { .. } | Body::Done) {
            return Err(HeaderError::ObsoleteProc);
        }
        self.encode_any(enc)
    }

    /// Append the header, whatever the procedure (for tests and test peers).
    pub fn encode_any<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), HeaderError> {
        enc.put_u32(self.xid)?;
        enc.put_u32(self.vers)?;
        enc.put_u32(self.credit)?;
        enc.put_enum(self.body.proc_())?;
        match &self.body {
            Body::Msg(l) | Body::NoMsg(l) => encode_lists(enc, l)?,
            Body::Msgp { align, thresh, lists } => {
                enc.put_u32(*align)?;
                enc.put_u32(*thresh)?;
                encode_lists(enc, lists)?;
            }
            Body::Done => {}
            Body::Error(ErrorBody::Vers { low, high }) => {
                enc.put_enum(errcode::ERR_VERS)?;
                enc.put_u32(*low)?;
                enc.put_u32(*high)?;
            }
            Body::Error(ErrorBody::Chunk) => enc.put_enum(errcode::ERR_CHUNK)?,
        }
        Ok(())
    }

    /// Encode into a new `Vec`.
    pub fn to_vec(&self) -> Result<Vec<u8>, HeaderError> {
        self.to_vec_reserving(0)
    }

    /// Encode into a new `Vec` with room for `extra` more octets after the header (the
    /// message's payload, appended without growing the vector again).
    pub fn to_vec_reserving(&self, extra: usize) -> Result<Vec<u8>, HeaderError> {
        let mut e = Encoder::new(Vec::with_capacity(self.encoded_len() + extra));
        self.encode(&mut e)?;
        Ok(e.finish().0)
    }
}

fn encode_segment<S: Sink>(enc: &mut Encoder<S>, s: &Segment) -> Result<(), XdrError> {
    enc.put_u32(s.handle)?;
    enc.put_u32(s.length)?;
    enc.put_u64(s.offset)
}

fn encode_chunk<S: Sink>(enc: &mut Encoder<S>, c: &WriteChunk) -> Result<(), XdrError> {
    enc.put_array(&c.segments, u32::MAX as usize, encode_segment)
}

fn encode_lists<S: Sink>(enc: &mut Encoder<S>, l: &ChunkLists) -> Result<(), XdrError> {
    for r in &l.reads {
        enc.put_bool(true)?;
        enc.put_u32(r.position)?;
        encode_segment(enc, &r.target)?;
    }
    enc.put_bool(false)?;
    for w in &l.writes {
        enc.put_bool(true)?;
        encode_chunk(enc, w)?;
    }
    enc.put_bool(false)?;
    enc.put_optional(l.reply.as_ref(), encode_chunk)
}

fn decode_segment(d: &mut Decoder<'_>) -> Result<Segment, XdrError> {
    Ok(Segment {
        handle: d.get_u32()?,
        length: d.get_u32()?,
        offset: d.get_u64()?,
    })
}

fn decode_chunk(d: &mut Decoder<'_>, limits: &Limits) -> Result<WriteChunk, HeaderError> {
    let count = d.get_u32()? as usize;
    if count > limits.max_segments_per_chunk {
        return Err(HeaderError::TooMany {
            what: "write chunk",
            max: limits.max_segments_per_chunk,
        });
    }
    // capacity bounded by the bytes left: each segment needs 16 of them, so the
    // loop fails with Truncated before the Vec grows past the message size
    let mut segments = Vec::with_capacity(count.min(d.remaining() / SEGMENT_LEN));
    for _ in 0..count {
        segments.push(decode_segment(d)?);
    }
    Ok(WriteChunk { segments })
}

fn decode_lists(d: &mut Decoder<'_>, limits: &Limits) -> Result<ChunkLists, HeaderError> {
    let mut reads = Vec::new();
    while d.get_bool()? {
        if reads.len() == limits.max_read_segments {
            return Err(HeaderError::TooMany {
                what: "read list",
                max: limits.max_read_segments,
            });
        }
        reads.push(ReadSegment {
            position: d.get_u32()?,
            target: decode_segment(d)?,
        });
    }
    let mut writes = Vec::new();
    while d.get_bool()? {
        if writes.len() == limits.max_write_chunks {
            return Err(HeaderError::TooMany {
                what: "write list",
                max: limits.max_write_chunks,
            });
        }
        writes.push(decode_chunk(d, limits)?);
    }
    let reply = if d.get_bool()? {
        Some(decode_chunk(d, limits)?)
    } else {
        None
    };
    Ok(ChunkLists { reads, writes, reply })
}

#[cfg(test)]
mod tests;
