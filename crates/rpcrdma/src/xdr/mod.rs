//! XDR (RFC 4506) encoder and decoder, with DDP-eligibility recording.
//!
//! Read RFC 4506 §3-§4 (units, padding, opaque, string, arrays, optional-data)
//! and RFC 8166 §3.4 (reducing an XDR stream) before editing.
//!
//! * [`Encoder`] appends big-endian XDR into a [`Sink`]: a growable `Vec<u8>` or a
//!   caller-provided `&mut [u8]` ([`SliceSink`]). Pad bytes are always zero on emit
//!   (RFC 4506 §4.10: "residual zero bytes").
//! * [`Decoder`] is a rustls-style bounded reader over `&[u8]` that hands out
//!   borrowed opaque slices. Every variable-length item takes an explicit maximum;
//!   counts are checked against the remaining bytes *before* anything is allocated.
//! * **Pad bytes on decode.** RFC 4506 says senders emit zero pad bytes but gives a
//!   receiver no instruction; RFC 8166 §8.2.2.3 says pad octets "are often zero
//!   bytes, but they don't have to be", and Linux sunrpc never looks at them. The
//!   decoder therefore *accepts* non-zero pad by default ([`PadPolicy::Lenient`]);
//!   [`PadPolicy::Strict`] rejects it for conformance tests and for callers that
//!   want canonical encodings (requirements B.5 #9).
//! * **DDP-eligibility (RFC 8166 §3.4.2, §6; RFC 8267).** An upper-layer encoder
//!   marks an eligible item by calling [`Encoder::put_opaque_ddp`] or
//!   [`Encoder::ddp_item`] instead of the plain method. The encoder then records the
//!   item's byte position and length ([`DdpItem`]) as it writes, so the transport
//!   can reduce the stream into Read/Write chunks with §3.4 position arithmetic
//!   (`wire::chunks`) without any hand-written offsets. The matching decoder
//!   methods ([`Decoder::get_opaque_ddp`], [`Decoder::ddp_item`]) re-insert chunk
//!   data on receive (see [`ChunkSource`]).

mod decode;
mod encode;

pub use decode::{ChunkSource, Decoder, InsertedChunk, ReturnedWriteChunk};
pub use encode::{Encoder, Sink, SliceSink};

/// Size of one XDR unit (RFC 4506 §3).
pub const UNIT: usize = 4;

/// Maximum number of DDP-eligible items one encoder records, and one decoder
/// re-inserts. RFC 8267 allows at most a handful per NFS procedure; this bound
/// keeps a hostile header from making us track an unbounded list.
pub const MAX_DDP_ITEMS: usize = 64;

/// Number of pad bytes (0..=3) that follow `len` bytes of opaque data.
#[inline]
pub const fn pad_len(len: usize) -> usize {
    (UNIT - (len % UNIT)) % UNIT
}

/// `len` rounded up to a multiple of four ("XDR roundup", RFC 8166 §2.2.4.2).
/// `None` on overflow.
#[inline]
pub const fn roundup(len: usize) -> Option<usize> {
    len.checked_add(pad_len(len))
}

/// `roundup` for 32-bit wire lengths. `None` if the result exceeds `u32::MAX`.
#[inline]
pub const fn roundup_u32(len: u32) -> Option<u32> {
    len.checked_add(pad_len(len as usize) as u32)
}

/// What the decoder does with non-zero roundup pad bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PadPolicy {
    /// Accept any pad value (the default; RFC 8166 §8.2.2.3, Linux behaviour).
    #[default]
    Lenient,
    /// Reject a non-zero pad byte with [`XdrError::NonZeroPad`].
    Strict,
}

/// A DDP-eligible data item recorded while encoding (RFC 8166 §3.4.2).
///
/// `offset` is the byte offset of the item's data in the *unreduced* stream,
/// counted from the encoder's start (the XID for an RPC message, RFC 8166
/// §3.4.5 "Position"). For an opaque it is the first data byte, after the length
/// word (§3.4.4.1: the count stays in the Payload stream). `len` is the encoded
/// length of the item without its roundup pad; the stream holds
/// `roundup(len)` bytes for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdpItem {
    /// Offset of the item data in the unreduced stream.
    pub offset: usize,
    /// Encoded length of the item, without roundup padding.
    pub len: usize,
}

impl DdpItem {
    /// Bytes the item occupies in the unreduced stream (data + pad).
    pub fn padded_len(&self) -> usize {
        self.len + pad_len(self.len)
    }
}

/// Errors of the XDR encoder and decoder. Each names what was wrong so the
/// transport can pick ERR_CHUNK versus GARBAGE_ARGS (RFC 8166 §4.5.2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    /// The stream ended before the item did.
    #[error("XDR stream truncated: needed {needed} bytes, {remaining} left")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes left.
        remaining: usize,
    },
    /// A variable-length item is longer than its declared or configured maximum.
    #[error("XDR length {len} exceeds the limit {max}")]
    TooLong {
        /// Length found.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// A bool or optional-data discriminator was not 0 or 1.
    #[error("XDR boolean/optional-data discriminator {0} is not 0 or 1")]
    BadBool(u32),
    /// An enum or union discriminant the caller does not know.
    #[error("XDR discriminant {value} is not valid for {what}")]
    BadDiscriminant {
        /// The enum or union.
        what: &'static str,
        /// The value found.
        value: u32,
    },
    /// A roundup pad byte was not zero ([`PadPolicy::Strict`] only).
    #[error("XDR pad byte is not zero")]
    NonZeroPad,
    /// Bytes were left over where the item should have ended.
    #[error("{0} trailing bytes after the XDR item")]
    TrailingBytes(usize),
    /// The caller's output buffer is too small.
    #[error("XDR output buffer too small")]
    BufferFull,
    /// More DDP-eligible items than [`MAX_DDP_ITEMS`].
    #[error("too many DDP-eligible items")]
    TooManyDdpItems,
    /// A chunk sits at a position where a non-DDP-eligible item is being decoded,
    /// or inside another item (RFC 8166 §6.1: a non-eligible item was reduced).
    #[error("chunk at position {position} overlaps a non-DDP-eligible item")]
    ChunkMisplaced {
        /// The chunk's Position.
        position: u32,
    },
    /// Chunk length disagrees with the XDR length word of its item
    /// (RFC 8166 §4.5.2 "mismatches between chunk sizes ... and the Payload stream").
    #[error("chunk length {chunk} does not match the item length {item}")]
    ChunkLengthMismatch {
        /// Chunk length.
        chunk: usize,
        /// Item length from the XDR stream.
        item: usize,
    },
    /// Chunk data was left unconsumed when decoding finished: a chunk beyond the
    /// end of the stream, or a chunk that no DDP-eligible item claimed.
    #[error("{count} chunk(s) not consumed by any DDP-eligible item")]
    UnconsumedChunk {
        /// Chunks left.
        count: usize,
    },
    /// Arithmetic on a peer-supplied value overflowed.
    #[error("length arithmetic overflow")]
    Overflow,
}

impl XdrError {
    /// True for errors that mean the *transport* placed chunks wrongly (an RPC-over-RDMA
    /// header problem, answered with ERR_CHUNK), as opposed to a ULP decoding problem
    /// (answered with GARBAGE_ARGS). See RFC 8166 §4.5.2, §6.1 and requirements B.5 #11.
    pub fn is_chunk_placement_error(&self) -> bool {
        matches!(self, XdrError::ChunkMisplaced { .. } | XdrError::UnconsumedChunk { .. })
    }
}

/// A type that encodes itself as XDR.
pub trait XdrEncode {
    /// Append the XDR encoding of `self`.
    fn encode<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), XdrError>;
}

/// A type that decodes itself from XDR, borrowing opaque data from the input.
pub trait XdrDecode<'a>: Sized {
    /// Read one value from `dec`.
    fn decode(dec: &mut Decoder<'a>) -> Result<Self, XdrError>;
}

impl XdrEncode for u32 {
    fn encode<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), XdrError> {
        enc.put_u32(*self)
    }
}

impl<'a> XdrDecode<'a> for u32 {
    fn decode(dec: &mut Decoder<'a>) -> Result<Self, XdrError> {
        dec.get_u32()
    }
}

impl XdrEncode for u64 {
    fn encode<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), XdrError> {
        enc.put_u64(*self)
    }
}

impl<'a> XdrDecode<'a> for u64 {
    fn decode(dec: &mut Decoder<'a>) -> Result<Self, XdrError> {
        dec.get_u64()
    }
}

/// The upper-layer binding of one RPC procedure (RFC 8166 §6, RFC 8267).
///
/// DDP-eligibility itself is expressed by the argument and result encoders
/// (they call the `*_ddp` methods of [`Encoder`] / [`Decoder`] for eligible items),
/// so no byte offsets are written by hand. What the transport additionally needs
/// before the reply exists is how big it can get (RFC 8166 §6.2, RPCR-ULB-02).
pub trait ProcedureBinding {
    /// RPC program number.
    const PROGRAM: u32;
    /// RPC program version.
    const VERSION: u32;
    /// Procedure number.
    const PROCEDURE: u32;
    /// The procedure's arguments.
    type Args: XdrEncode;
    /// Maximum reply sizes for a call with these arguments.
    fn reply_sizing(args: &Self::Args) -> ReplySizing;
}

/// What a Requester must provision for a reply (RFC 8166 §3.4.6, §4.3.3, §6.2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplySizing {
    /// Maximum size of the *results* (what follows the RPC reply header),
    /// unreduced, including the roundup of any eligible item.
    pub max_results: u32,
    /// Maximum encoded length (without pad) of each DDP-eligible result item,
    /// in the order they appear in the reply. Empty when no result is eligible.
    pub ddp_results: Vec<u32>,
}

#[cfg(test)]
mod tests;
