//! XDR encoder (RFC 4506) with DDP-eligible item recording (RFC 8166 §3.4).

use super::{DdpItem, MAX_DDP_ITEMS, XdrError, pad_len};

/// Where encoded bytes go. `Vec<u8>` grows; [`SliceSink`] fails with
/// [`XdrError::BufferFull`] when the caller's buffer is exhausted.
pub trait Sink {
    /// Append `bytes`.
    fn put(&mut self, bytes: &[u8]) -> Result<(), XdrError>;
    /// Bytes written so far (absolute length of the underlying buffer for `Vec`).
    fn len(&self) -> usize;
    /// True when nothing has been written.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), XdrError> {
        self.extend_from_slice(bytes);
        Ok(())
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

impl<S: Sink + ?Sized> Sink for &mut S {
    fn put(&mut self, bytes: &[u8]) -> Result<(), XdrError> {
        (**self).put(bytes)
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

/// Octets [`Encoder::put_opaque_ddp_with`] reserves beyond its item for what follows it.
const FOLLOWING_RESULTS: usize = 512;

impl Encoder<Vec<u8>> {
    /// A DDP-eligible `opaque<max>` of `len` bytes that `fill` appends to the
    /// stream in place (no intermediate buffer, no zero-fill first): encoded and
    /// recorded exactly as [`Encoder::put_opaque_ddp`] would encode them. `fill`
    /// must append exactly `len` bytes ([`XdrError::ChunkLengthMismatch`] otherwise).
    pub fn put_opaque_ddp_with(
        &mut self,
        len: usize,
        max: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), XdrError> {
        self.put_len(len, max)?;
        self.record(self.position(), len)?;
        let at = self.sink.len();
        // room for the pad and the results that usually follow (a status, a trailer, attributes):
        // a Vec that grows past an exact reservation moves the whole item (issue 18: a 1 MiB
        // READ reply was copied once more by `realloc` for its 4-byte trailer)
        self.sink.reserve(len + 3 + FOLLOWING_RESULTS);
        fill(&mut self.sink);
        let added = self.sink.len() - at;
        if added != len {
            self.sink.truncate(at);
            return Err(XdrError::ChunkLengthMismatch {
                chunk: added,
                item: len,
            });
        }
        self.pad(len)
    }

    /// Where the encoding stands now, for [`Encoder::rollback`].
    pub(crate) fn mark(&self) -> (usize, usize) {
        (self.sink.len(), self.ddp.len())
    }

    /// Forgets everything encoded since `mark` (bytes and DDP-eligible items).
    pub(crate) fn rollback(&mut self, (len, items): (usize, usize)) {
        self.sink.truncate(len);
        self.ddp.truncate(items);
    }
}

/// A sink over a caller-provided buffer (for example a registered send buffer).
#[derive(Debug)]
pub struct SliceSink<'b> {
    buf: &'b mut [u8],
    len: usize,
}

impl<'b> SliceSink<'b> {
    /// Write from the start of `buf`.
    pub fn new(buf: &'b mut [u8]) -> Self {
        SliceSink { buf, len: 0 }
    }
    /// The bytes written so far.
    pub fn written(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Sink for SliceSink<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), XdrError> {
        let end = self.len.checked_add(bytes.len()).ok_or(XdrError::Overflow)?;
        let dst = self.buf.get_mut(self.len..end).ok_or(XdrError::BufferFull)?;
        dst.copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }
    fn len(&self) -> usize {
        self.len
    }
}

const ZEROS: [u8; 4] = [0; 4];

/// XDR encoder. Positions reported in [`DdpItem`]s are relative to the sink
/// length when the encoder was created, so an encoder started right at an RPC
/// message's XID yields RFC 8166 Positions directly.
#[derive(Debug)]
pub struct Encoder<S: Sink> {
    sink: S,
    start: usize,
    ddp: Vec<DdpItem>,
}

impl<S: Sink> Encoder<S> {
    /// Start encoding at the current end of `sink`.
    pub fn new(sink: S) -> Self {
        let start = sink.len();
        Encoder {
            sink,
            start,
            ddp: Vec::new(),
        }
    }

    /// Bytes written by this encoder (the current unreduced stream offset).
    pub fn position(&self) -> usize {
        self.sink.len() - self.start
    }

    /// DDP-eligible items recorded so far, in stream order.
    pub fn ddp_items(&self) -> &[DdpItem] {
        &self.ddp
    }

    /// Finish and return the sink and the recorded DDP-eligible items.
    pub fn finish(self) -> (S, Vec<DdpItem>) {
        (self.sink, self.ddp)
    }

    /// Borrow the sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    fn raw(&mut self, bytes: &[u8]) -> Result<(), XdrError> {
        self.sink.put(bytes)
    }

    fn pad(&mut self, len: usize) -> Result<(), XdrError> {
        let p = pad_len(len);
        self.raw(&ZEROS[..p])
    }

    /// unsigned int (RFC 4506 §4.2).
    pub fn put_u32(&mut self, v: u32) -> Result<(), XdrError> {
        self.raw(&v.to_be_bytes())
    }

    /// int (RFC 4506 §4.1).
    pub fn put_i32(&mut self, v: i32) -> Result<(), XdrError> {
        self.raw(&v.to_be_bytes())
    }

    /// unsigned hyper (RFC 4506 §4.5).
    pub fn put_u64(&mut self, v: u64) -> Result<(), XdrError> {
        self.raw(&v.to_be_bytes())
    }

    /// hyper (RFC 4506 §4.5).
    pub fn put_i64(&mut self, v: i64) -> Result<(), XdrError> {
        self.raw(&v.to_be_bytes())
    }

    /// bool (RFC 4506 §4.4).
    pub fn put_bool(&mut self, v: bool) -> Result<(), XdrError> {
        self.put_u32(u32::from(v))
    }

    /// enum (RFC 4506 §4.3): the discriminant as a signed int on the wire; the
    /// enums of RPC and RPC-over-RDMA are all non-negative, so `u32` is used.
    pub fn put_enum(&mut self, v: u32) -> Result<(), XdrError> {
        self.put_u32(v)
    }

    /// Fixed-length opaque data `opaque[n]` (RFC 4506 §4.9): data then zero pad.
    pub fn put_opaque_fixed(&mut self, data: &[u8]) -> Result<(), XdrError> {
        self.raw(data)?;
        self.pad(data.len())
    }

    fn put_len(&mut self, len: usize, max: usize) -> Result<(), XdrError> {
        if len > max {
            return Err(XdrError::TooLong { len, max });
        }
        let len32 = u32::try_from(len).map_err(|_| XdrError::TooLong {
            len,
            max: u32::MAX as usize,
        })?;
        self.put_u32(len32)
    }

    /// Variable-length opaque data `opaque<max>` (RFC 4506 §4.10).
    pub fn put_opaque(&mut self, data: &[u8], max: usize) -> Result<(), XdrError> {
        self.put_len(data.len(), max)?;
        self.put_opaque_fixed(data)
    }

    /// `string<max>` (RFC 4506 §4.11). Bytes are written as given.
    pub fn put_string(&mut self, s: &[u8], max: usize) -> Result<(), XdrError> {
        self.put_opaque(s, max)
    }

    /// A DDP-eligible `opaque<max>`: encoded exactly as [`Self::put_opaque`], and
    /// recorded as a [`DdpItem`] whose offset is the first data byte (the length
    /// word stays in the Payload stream, RFC 8166 §3.4.4.1).
    pub fn put_opaque_ddp(&mut self, data: &[u8], max: usize) -> Result<(), XdrError> {
        self.put_len(data.len(), max)?;
        self.record(self.position(), data.len())?;
        self.put_opaque_fixed(data)
    }

    /// A DDP-eligible item of any shape (RFC 8166 §3.4.4): the elements of a
    /// counted array after its count, or the value of optional-data after its
    /// "is present" word. The caller writes the count / present word *before*
    /// calling this, and the item's encoding inside `f`.
    pub fn ddp_item<F>(&mut self, f: F) -> Result<(), XdrError>
    where
        F: FnOnce(&mut Self) -> Result<(), XdrError>,
    {
        let offset = self.position();
        let slot = self.ddp.len();
        self.record(offset, 0)?;
        f(self)?;
        let len = self.position() - offset;
        // Nested eligible items are not allowed (RFC 8166 §6.1: an eligible item
        // "does not contain DDP-eligible data items"): drop any recorded inside.
        self.ddp.truncate(slot + 1);
        self.ddp[slot].len = len;
        Ok(())
    }

    fn record(&mut self, offset: usize, len: usize) -> Result<(), XdrError> {
        if self.ddp.len() >= MAX_DDP_ITEMS {
            return Err(XdrError::TooManyDdpItems);
        }
        self.ddp.push(DdpItem { offset, len });
        Ok(())
    }

    /// optional-data `*T` (RFC 4506 §4.19): the present word, then the value.
    pub fn put_optional<T, F>(&mut self, v: Option<&T>, f: F) -> Result<(), XdrError>
    where
        F: FnOnce(&mut Self, &T) -> Result<(), XdrError>,
    {
        match v {
            None => self.put_bool(false),
            Some(t) => {
                self.put_bool(true)?;
                f(self, t)
            }
        }
    }

    /// Variable-length array `T<max>` (RFC 4506 §4.13): count, then elements.
    pub fn put_array<T, F>(&mut self, items: &[T], max: usize, mut f: F) -> Result<(), XdrError>
    where
        F: FnMut(&mut Self, &T) -> Result<(), XdrError>,
    {
        self.put_len(items.len(), max)?;
        for it in items {
            f(self, it)?;
        }
        Ok(())
    }

    /// Fixed-length array `T[n]` (RFC 4506 §4.12): elements only.
    pub fn put_array_fixed<T, F>(&mut self, items: &[T], mut f: F) -> Result<(), XdrError>
    where
        F: FnMut(&mut Self, &T) -> Result<(), XdrError>,
    {
        for it in items {
            f(self, it)?;
        }
        Ok(())
    }
}
