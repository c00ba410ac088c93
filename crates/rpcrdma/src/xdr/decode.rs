//! Bounded XDR decoder (RFC 4506) that can re-insert chunks (RFC 8166 §3.4).

use super::{PadPolicy, XdrError, pad_len};

/// A Read chunk to re-insert while decoding a Call (RFC 8166 §3.4.5): the data
/// the Responder pulled with RDMA Read, concatenated in segment list order, and
/// the chunk's Position in the unreduced Payload stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertedChunk<'a> {
    /// Position in the unreduced Payload stream (a multiple of four).
    pub position: u32,
    /// Chunk contents, with or without the item's roundup pad (§3.4.5.2).
    pub data: &'a [u8],
}

/// A Write chunk as returned in a Reply (RFC 8166 §3.4.6, §4.3.2), with the
/// bytes the Responder wrote, in Write list order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnedWriteChunk<'a> {
    /// An empty Write chunk (segment count 0): its item came back inline (§4.3.2.3).
    Empty,
    /// A Write chunk with segments: the concatenated bytes the Responder reported
    /// (the sum of the returned segment lengths). Zero bytes means "unused"
    /// unless an item of length zero claims it.
    Data(&'a [u8]),
}

/// Where the decoder finds reduced DDP-eligible items.
#[derive(Debug, Clone, Copy, Default)]
pub enum ChunkSource<'a> {
    /// No chunks: every item is inline.
    #[default]
    None,
    /// Read chunks of a Call, sorted by ascending, distinct Position.
    Read(&'a [InsertedChunk<'a>]),
    /// Write chunks of a Reply, in Write list order. Each DDP-eligible result
    /// consumes the next chunk, as the Responder filled them (§4.3.2.1).
    Write(&'a [ReturnedWriteChunk<'a>]),
}

/// rustls-style reader over an XDR stream.
///
/// Every read is bounds-checked; opaque items are returned as slices borrowed
/// from the input (or from chunk data) and never copied.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    off: usize,
    /// Offset in the unreduced stream (inline bytes + re-inserted chunk bytes).
    unreduced: usize,
    pad: PadPolicy,
    chunks: ChunkSource<'a>,
    next_chunk: usize,
}

impl<'a> Decoder<'a> {
    /// Decode `buf` with no chunks and lenient pad handling.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder {
            buf,
            off: 0,
            unreduced: 0,
            pad: PadPolicy::Lenient,
            chunks: ChunkSource::None,
            next_chunk: 0,
        }
    }

    /// Decode a reduced stream, re-inserting chunks from `chunks`.
    ///
    /// For [`ChunkSource::Read`] the chunks must be sorted by Position (the
    /// transport groups and sorts them, `wire::chunks::read_chunks`).
    pub fn with_chunks(buf: &'a [u8], chunks: ChunkSource<'a>) -> Self {
        Decoder {
            chunks,
            ..Decoder::new(buf)
        }
    }

    /// Set the pad policy.
    pub fn pad_policy(mut self, pad: PadPolicy) -> Self {
        self.pad = pad;
        self
    }

    /// Offset in the unreduced stream (RFC 8166 Position arithmetic).
    pub fn position(&self) -> usize {
        self.unreduced
    }

    /// Bytes of the inline buffer consumed so far.
    pub fn offset(&self) -> usize {
        self.off
    }

    /// Inline bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.off
    }

    /// The unconsumed inline bytes (for example an RPC message's procedure
    /// arguments after the call header).
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.off..]
    }

    /// Check that every chunk was consumed by a DDP-eligible item
    /// ([`XdrError::UnconsumedChunk`]). Trailing inline bytes are allowed.
    pub fn finish(&self) -> Result<(), XdrError> {
        let unconsumed = match self.chunks {
            ChunkSource::None => 0,
            ChunkSource::Read(c) => c.len().saturating_sub(self.next_chunk),
            ChunkSource::Write(c) => c
                .iter()
                .skip(self.next_chunk)
                .filter(|w| matches!(w, ReturnedWriteChunk::Data(d) if !d.is_empty()))
                .count(),
        };
        if unconsumed > 0 {
            return Err(XdrError::UnconsumedChunk { count: unconsumed });
        }
        Ok(())
    }

    /// [`Self::finish`], and also require that no inline bytes are left.
    pub fn finish_exact(&self) -> Result<(), XdrError> {
        self.finish()?;
        match self.remaining() {
            0 => Ok(()),
            n => Err(XdrError::TrailingBytes(n)),
        }
    }

    /// Read `n` inline bytes of a non-reduced item. A Read chunk whose Position
    /// falls inside them means a non-DDP-eligible item was reduced (§6.1).
    fn take(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        if let ChunkSource::Read(chunks) = self.chunks
            && let Some(c) = chunks.get(self.next_chunk)
            && n > 0
        {
            let end = self.unreduced.checked_add(n).ok_or(XdrError::Overflow)?;
            if (c.position as usize) < end {
                return Err(XdrError::ChunkMisplaced { position: c.position });
            }
        }
        let remaining = self.remaining();
        if n > remaining {
            return Err(XdrError::Truncated { needed: n, remaining });
        }
        let s = &self.buf[self.off..self.off + n];
        self.off += n;
        self.unreduced += n;
        Ok(s)
    }

    fn word(&mut self) -> Result<[u8; 4], XdrError> {
        let s = self.take(4)?;
        Ok([s[0], s[1], s[2], s[3]])
    }

    fn skip_pad(&mut self, len: usize) -> Result<(), XdrError> {
        let p = self.take(pad_len(len))?;
        check_pad(self.pad, p)
    }

    /// unsigned int.
    pub fn get_u32(&mut self) -> Result<u32, XdrError> {
        Ok(u32::from_be_bytes(self.word()?))
    }

    /// int.
    pub fn get_i32(&mut self) -> Result<i32, XdrError> {
        Ok(i32::from_be_bytes(self.word()?))
    }

    /// unsigned hyper.
    pub fn get_u64(&mut self) -> Result<u64, XdrError> {
        let s = self.take(8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(s);
        Ok(u64::from_be_bytes(b))
    }

    /// hyper.
    pub fn get_i64(&mut self) -> Result<i64, XdrError> {
        Ok(self.get_u64()? as i64)
    }

    /// bool: only 0 and 1 are valid (RFC 4506 §4.4).
    pub fn get_bool(&mut self) -> Result<bool, XdrError> {
        match self.get_u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::BadBool(v)),
        }
    }

    /// enum: the raw discriminant; the caller maps it (keeping unknown values
    /// where the protocol needs them).
    pub fn get_enum(&mut self) -> Result<u32, XdrError> {
        self.get_u32()
    }

    /// Fixed-length opaque `opaque[n]`, pad skipped.
    pub fn get_opaque_fixed(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        let d = self.take(n)?;
        self.skip_pad(n)?;
        Ok(d)
    }

    fn get_len(&mut self, max: usize) -> Result<usize, XdrError> {
        let len = self.get_u32()? as usize;
        if len > max {
            return Err(XdrError::TooLong { len, max });
        }
        Ok(len)
    }

    /// Variable-length opaque `opaque<max>`.
    pub fn get_opaque(&mut self, max: usize) -> Result<&'a [u8], XdrError> {
        let len = self.get_len(max)?;
        self.get_opaque_fixed(len)
    }

    /// `string<max>`, as bytes (XDR strings are ASCII by convention only).
    pub fn get_string(&mut self, max: usize) -> Result<&'a [u8], XdrError> {
        self.get_opaque(max)
    }

    /// A DDP-eligible `opaque<max>`: the length word is inline; the data is
    /// inline or comes from the chunk that sits at this Position (Read) or from
    /// the next Write chunk (Write).
    pub fn get_opaque_ddp(&mut self, max: usize) -> Result<&'a [u8], XdrError> {
        let len = self.get_len(max)?;
        match self.claim_chunk()? {
            None => self.get_opaque_fixed(len),
            Some(data) => {
                let ok = data.len() == len || Some(data.len()) == super::roundup(len);
                if !ok {
                    return Err(XdrError::ChunkLengthMismatch {
                        chunk: data.len(),
                        item: len,
                    });
                }
                check_pad(self.pad, &data[len..])?;
                self.advance_unreduced(len)?;
                Ok(&data[..len])
            }
        }
    }

    /// A DDP-eligible item of any shape (see `Encoder::ddp_item`). `f` decodes
    /// the item either inline or from the chunk's bytes; a chunk must then hold
    /// exactly the item (plus at most its roundup pad).
    pub fn ddp_item<T, F>(&mut self, f: F) -> Result<T, XdrError>
    where
        F: FnOnce(&mut Decoder<'a>) -> Result<T, XdrError>,
    {
        match self.claim_chunk()? {
            None => f(self),
            Some(data) => {
                let mut sub = Decoder::new(data).pad_policy(self.pad);
                let v = f(&mut sub)?;
                let used = sub.off;
                let left = data.len() - used;
                if left != 0 && left != pad_len(used) {
                    return Err(XdrError::ChunkLengthMismatch {
                        chunk: data.len(),
                        item: used,
                    });
                }
                check_pad(self.pad, &data[used..])?;
                self.advance_unreduced(used)?;
                Ok(v)
            }
        }
    }

    fn advance_unreduced(&mut self, len: usize) -> Result<(), XdrError> {
        let padded = super::roundup(len).ok_or(XdrError::Overflow)?;
        self.unreduced = self.unreduced.checked_add(padded).ok_or(XdrError::Overflow)?;
        Ok(())
    }

    /// The chunk for the DDP-eligible item starting at the current position, if any.
    fn claim_chunk(&mut self) -> Result<Option<&'a [u8]>, XdrError> {
        match self.chunks {
            ChunkSource::None => Ok(None),
            ChunkSource::Read(chunks) => match chunks.get(self.next_chunk) {
                Some(c) if c.position as usize == self.unreduced => {
                    self.next_chunk += 1;
                    Ok(Some(c.data))
                }
                _ => Ok(None),
            },
            ChunkSource::Write(chunks) => match chunks.get(self.next_chunk) {
                None => Ok(None),
                Some(ReturnedWriteChunk::Empty) => {
                    self.next_chunk += 1;
                    Ok(None)
                }
                Some(ReturnedWriteChunk::Data(d)) => {
                    self.next_chunk += 1;
                    Ok(Some(d))
                }
            },
        }
    }

    /// optional-data `*T`.
    pub fn get_optional<T, F>(&mut self, f: F) -> Result<Option<T>, XdrError>
    where
        F: FnOnce(&mut Self) -> Result<T, XdrError>,
    {
        if self.get_bool()? { Ok(Some(f(self)?)) } else { Ok(None) }
    }

    /// Variable-length array `T<max>`. `min_elem` is the smallest encoded size of
    /// one element (at least 1 is assumed); the count is checked against both
    /// `max` and the remaining bytes before anything is allocated.
    pub fn get_array<T, F>(&mut self, max: usize, min_elem: usize, mut f: F) -> Result<Vec<T>, XdrError>
    where
        F: FnMut(&mut Self) -> Result<T, XdrError>,
    {
        let count = self.get_len(max)?;
        let needed = count.checked_mul(min_elem.max(1)).ok_or(XdrError::Overflow)?;
        if needed > self.remaining() {
            return Err(XdrError::Truncated {
                needed,
                remaining: self.remaining(),
            });
        }
        let mut v = Vec::with_capacity(count);
        for _ in 0..count {
            v.push(f(self)?);
        }
        Ok(v)
    }
}

fn check_pad(policy: PadPolicy, pad: &[u8]) -> Result<(), XdrError> {
    if policy == PadPolicy::Strict && pad.iter().any(|&b| b != 0) {
        return Err(XdrError::NonZeroPad);
    }
    Ok(())
}
