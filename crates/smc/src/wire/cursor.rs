//! RMB element cursors with wrap (RFC 7609 §4.2–4.3, A.4; requirements A1.10, A4.4).
//!
//! A cursor is what a CDC message carries: a 16-bit wrap sequence and a 32-bit offset into
//! an RMB element (RMBE). Its meaning depends on the element's geometry ([`Rmbe`]): the
//! element length `L` and the base offset where data starts (0 in Linux's no-eyecatcher
//! mode, 4 in the RFC's eyecatcher mode, erratum E-6). The data area holds `C = L - base`
//! bytes; a cursor `(w, off)` denotes the stream position `P = w·C + (off - base)` modulo
//! `M = 2^16·C`, so every comparison ("bytes between", "free space", "did it go backwards")
//! is a subtraction modulo `M` (A1.10 "position arithmetic").
//!
//! Sans-I/O and panic-free: cursors that come from a peer are checked with
//! [`Rmbe::check`] before any arithmetic; the arithmetic itself never overflows.

use thiserror::Error;

/// A cursor as carried by a CDC message: wrap sequence and offset in the element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cursor {
    /// Wrap sequence number, incremented each time the producer cursor wraps (mod 2^16).
    pub wrap: u16,
    /// Offset (in octets) from the start of the element, including any eyecatcher.
    pub count: u32,
}

impl Cursor {
    /// A cursor from its two fields.
    pub const fn new(wrap: u16, count: u32) -> Self {
        Self { wrap, count }
    }
}

/// Whether an element starts with the RFC's 4-octet eyecatcher (erratum E-6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EyecatcherMode {
    /// Linux (and default) mode: no eyecatcher, data area `[0, L)`, cursors start and wrap at 0.
    None,
    /// RFC 7609 §4.2 mode: octets 0–3 hold an eyecatcher, data area `[4, L)`, cursors start
    /// and wrap at 4.
    Rfc,
}

impl EyecatcherMode {
    /// First data offset in the element: 0 or 4.
    pub const fn base(self) -> u32 {
        match self {
            Self::None => 0,
            Self::Rfc => 4,
        }
    }
}

/// Why a cursor or an element geometry is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum CursorError {
    /// The element is too small to hold any data (or is larger than a cursor can address).
    #[error("element length {len} is unusable in {mode:?} mode")]
    BadElement {
        /// Element length in octets.
        len: u32,
        /// The eyecatcher mode.
        mode: EyecatcherMode,
    },
    /// The offset is outside the element's data area `[base, L)`.
    #[error("cursor offset {count} outside the data area [{base}, {len})")]
    OutOfRange {
        /// The offending offset.
        count: u32,
        /// First data offset.
        base: u32,
        /// Element length.
        len: u32,
    },
}

/// One RMB element's geometry: its length and eyecatcher mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rmbe {
    len: u32,
    mode: EyecatcherMode,
}

/// A contiguous piece of an element: `[off, off + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Offset in the element.
    pub off: u32,
    /// Length in octets.
    pub len: u32,
}

impl Rmbe {
    /// Largest element a cursor can address safely: `2^16·C` must fit in a `u64` and an
    /// offset in a `u32`; Linux's largest RMB is 512 KiB (Bsize 5), v2 up to 1 MiB.
    pub const MAX_LEN: u32 = 1 << 30;

    /// A geometry for an element of `len` octets in `mode`. The element must have at least
    /// one data octet and be at most [`Rmbe::MAX_LEN`].
    pub fn new(len: u32, mode: EyecatcherMode) -> Result<Self, CursorError> {
        if len <= mode.base() || len > Self::MAX_LEN {
            return Err(CursorError::BadElement { len, mode });
        }
        Ok(Self { len, mode })
    }

    /// Element length `L` in octets (including an eyecatcher).
    pub const fn len(&self) -> u32 {
        self.len
    }

    /// Always false: an element has at least one data octet (kept for clippy's `len` rule).
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// The eyecatcher mode.
    pub const fn mode(&self) -> EyecatcherMode {
        self.mode
    }

    /// First data offset (0 or 4).
    pub const fn base(&self) -> u32 {
        self.mode.base()
    }

    /// Data capacity `C = L - base`.
    pub const fn capacity(&self) -> u32 {
        self.len - self.mode.base()
    }

    /// The modulus of stream positions, `2^16·C`.
    pub const fn modulus(&self) -> u64 {
        (self.capacity() as u64) << 16
    }

    /// The cursor every connection starts with: `(0, base)`.
    pub const fn start(&self) -> Cursor {
        Cursor::new(0, self.mode.base())
    }

    /// Checks that a cursor (typically from a peer's CDC) points into the data area.
    pub fn check(&self, c: Cursor) -> Result<(), CursorError> {
        if c.count < self.base() || c.count >= self.len {
            return Err(CursorError::OutOfRange {
                count: c.count,
                base: self.base(),
                len: self.len,
            });
        }
        Ok(())
    }

    /// The stream position of a cursor, `w·C + (off - base)`, in `[0, 2^16·C)`.
    /// The cursor must have passed [`Rmbe::check`]; out-of-range offsets are clamped into
    /// the data area so this never panics.
    pub fn position(&self, c: Cursor) -> u64 {
        let off = c.count.clamp(self.base(), self.len - 1) - self.base();
        u64::from(c.wrap) * u64::from(self.capacity()) + u64::from(off)
    }

    /// The cursor at a stream position (taken modulo `2^16·C`).
    pub fn cursor_at(&self, pos: u64) -> Cursor {
        let cap = u64::from(self.capacity());
        let pos = pos % self.modulus();
        // pos / cap < 2^16 and pos % cap < C ≤ 2^30 by construction.
        Cursor::new((pos / cap) as u16, (pos % cap) as u32 + self.base())
    }

    /// Octets from `older` to `newer` going forward, modulo `2^16·C` ("bytes between").
    /// For a producer and the consumer behind it this is the number of unread octets; a
    /// value above `C` means the pair is inconsistent (a cursor went backwards or jumped).
    pub fn distance(&self, newer: Cursor, older: Cursor) -> u64 {
        let m = self.modulus();
        (self.position(newer) + m - self.position(older)) % m
    }

    /// The cursor `n` octets after `c` (wrapping, with the wrap sequence incremented mod 2^16).
    pub fn advance(&self, c: Cursor, n: u64) -> Cursor {
        self.cursor_at(self.position(c) + n % self.modulus())
    }

    /// Free space a writer has when its producer cursor is `prod` and the consumer cursor it
    /// knows is `cons`: `C - (P_prod - P_cons)`, or `None` when the pair is inconsistent.
    pub fn free(&self, prod: Cursor, cons: Cursor) -> Option<u32> {
        let used = self.distance(prod, cons);
        u32::try_from(used).ok().and_then(|u| self.capacity().checked_sub(u))
    }

    /// The element ranges that `n` octets starting at `c` occupy: one span, or two when the
    /// range crosses the end of the element (the second then starts at `base`). `n` is
    /// clamped to `C`. Used for the RDMA Writes (one remote address each, erratum E-22) and
    /// for reading the receive element.
    pub fn spans(&self, c: Cursor, n: u32) -> (Span, Option<Span>) {
        let n = n.min(self.capacity());
        let off = c.count.clamp(self.base(), self.len - 1);
        let to_end = self.len - off;
        if n <= to_end {
            (Span { off, len: n }, None)
        } else {
            (
                Span { off, len: to_end },
                Some(Span {
                    off: self.base(),
                    len: n - to_end,
                }),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn linux16k() -> Rmbe {
        Rmbe::new(16_384, EyecatcherMode::None).unwrap()
    }

    fn rfc16k() -> Rmbe {
        Rmbe::new(16_384, EyecatcherMode::Rfc).unwrap()
    }

    /// `Span { off, len }`, short for the expected spans below.
    const fn sp(off: u32, len: u32) -> Span {
        Span { off, len }
    }

    // SMC-CDC-5 / A4.4: the worked wrap-around example with its exact numbers, Linux mode.
    #[test]
    fn a4_4_scenarios_linux_mode() {
        let e = linux16k();
        assert_eq!(e.capacity(), 16_384);
        let start = e.start();
        assert_eq!(start, Cursor::new(0, 0));
        // Step 1: 10 000 bytes into an empty element.
        assert_eq!(e.free(start, start), Some(16_384));
        assert_eq!(e.spans(start, 10_000), (sp(0, 10_000), None));
        let p1 = e.advance(start, 10_000);
        assert_eq!(p1, Cursor::new(0, 10_000));
        // Step 2: B sees 10 000 outstanding and reads all of them.
        assert_eq!(e.distance(p1, start), 10_000);
        let c1 = e.advance(start, 10_000);
        assert_eq!(c1, Cursor::new(0, 10_000));
        // Window as A sees it before the update: 6 384.
        assert_eq!(e.free(p1, start), Some(6_384));
        // Step 3: 12 000 bytes, the remote range wraps → two writes.
        assert_eq!(e.free(p1, c1), Some(16_384));
        assert_eq!(e.spans(p1, 12_000), (sp(10_000, 6_384), Some(sp(0, 5_616))));
        let p2 = e.advance(p1, 12_000);
        assert_eq!(p2, Cursor::new(1, 5_616));
        // Step 4: positions 22 000 and 10 000 → 12 000 to read; consumer mirrors the wrap.
        assert_eq!(e.position(p2), 22_000);
        assert_eq!(e.distance(p2, c1), 12_000);
        let c2 = e.advance(c1, 12_000);
        assert_eq!(c2, Cursor::new(1, 5_616));
        // Step 5: a full window of 16 384 out of 20 000.
        assert_eq!(e.free(p2, c2), Some(16_384));
        assert_eq!(e.spans(p2, 20_000), (sp(5_616, 10_768), Some(sp(0, 5_616))));
        let p3 = e.advance(p2, 16_384);
        assert_eq!(p3, Cursor::new(2, 5_616));
        assert_eq!(e.free(p3, c2), Some(0));
        // Step 6: same offset, different wrap → a full element is readable.
        assert_eq!(e.distance(p3, c2), 16_384);
        let c3 = e.advance(c2, 16_384);
        assert_eq!(c3, Cursor::new(2, 5_616));
        // Step 7: the remaining 3 616.
        assert_eq!(e.free(p3, c3), Some(16_384));
        assert_eq!(e.spans(p3, 3_616), (sp(5_616, 3_616), None));
        assert_eq!(e.advance(p3, 3_616), Cursor::new(2, 9_232));
    }

    // A4.4, RFC (eyecatcher) mode: offsets +4, C = 16 380.
    #[test]
    fn a4_4_scenarios_rfc_mode() {
        let e = rfc16k();
        assert_eq!(e.capacity(), 16_380);
        let start = e.start();
        assert_eq!(start, Cursor::new(0, 4));
        assert_eq!(e.spans(start, 10_000), (sp(4, 10_000), None));
        let p1 = e.advance(start, 10_000);
        assert_eq!(p1, Cursor::new(0, 10_004));
        assert_eq!(e.spans(p1, 12_000), (sp(10_004, 6_380), Some(sp(4, 5_620))));
        let p2 = e.advance(p1, 12_000);
        assert_eq!(p2, Cursor::new(1, 5_624));
        assert_eq!(e.distance(p2, p1), 12_000);
    }

    // A4.4 step 8: the 16-bit wrap sequence wraps 65 535 → 0 and arithmetic still works.
    #[test]
    fn wrap_sequence_wraps_at_2_16() {
        let e = linux16k();
        let last = Cursor::new(65_535, 16_000);
        let next = e.advance(last, 1_000);
        assert_eq!(next, Cursor::new(0, 616));
        assert_eq!(e.distance(next, last), 1_000);
        assert_eq!(e.free(next, last), Some(15_384));
        // Full window across the wrap: equal offsets, wraps 65 535 and 0.
        let full = e.advance(last, 16_384);
        assert_eq!(full, Cursor::new(0, 16_000));
        assert_eq!(e.distance(full, last), 16_384);
        assert_eq!(e.free(full, last), Some(0));
    }

    // SMC-CDC-12: offsets outside [base, L) are rejected; a backwards pair is inconsistent.
    #[test]
    fn range_and_consistency_checks() {
        let e = rfc16k();
        assert!(e.check(Cursor::new(0, 3)).is_err());
        assert!(e.check(Cursor::new(0, 16_384)).is_err());
        assert!(e.check(Cursor::new(7, 4)).is_ok());
        assert!(e.check(Cursor::new(7, 16_383)).is_ok());
        let l = linux16k();
        assert!(l.check(Cursor::new(0, 16_384)).is_err());
        assert!(l.check(Cursor::new(0, u32::MAX)).is_err());
        // Consumer ahead of producer: free space undefined.
        assert_eq!(l.free(Cursor::new(0, 10), Cursor::new(0, 20)), None);
        // More than C outstanding (two wraps ahead): undefined.
        assert_eq!(l.free(Cursor::new(2, 10), Cursor::new(0, 10)), None);
        assert!(Rmbe::new(4, EyecatcherMode::Rfc).is_err());
        assert!(Rmbe::new(0, EyecatcherMode::None).is_err());
        assert!(Rmbe::new(Rmbe::MAX_LEN + 1, EyecatcherMode::None).is_err());
    }

    /// The model: a plain u64 stream position per cursor, never wrapping.
    #[derive(Debug)]
    struct Model {
        prod: u64,
        cons: u64,
    }

    proptest! {
        // SMC-CDC-4/5 against a model: random writes and reads over many wraps, the cursor
        // arithmetic agrees with unbounded positions, and spans cover exactly the written
        // octets at offsets `base + pos mod C`.
        #[test]
        fn cursors_agree_with_a_model(
            len in 5u32..70_000,
            rfc in any::<bool>(),
            start_wrap in any::<u16>(),
            ops in proptest::collection::vec((any::<bool>(), 0u32..200_000), 1..64),
        ) {
            let mode = if rfc { EyecatcherMode::Rfc } else { EyecatcherMode::None };
            let e = Rmbe::new(len, mode).unwrap();
            let cap = u64::from(e.capacity());
            let base_pos = u64::from(start_wrap) * cap;
            let mut m = Model { prod: base_pos, cons: base_pos };
            let mut prod = Cursor::new(start_wrap, e.base());
            let mut cons = prod;
            for (write, n) in ops {
                let free = e.free(prod, cons).unwrap();
                prop_assert_eq!(u64::from(free), cap - (m.prod - m.cons));
                if write {
                    let n = n.min(free);
                    let (a, b) = e.spans(prod, n);
                    prop_assert_eq!(a.off, e.base() + (m.prod % cap) as u32);
                    prop_assert_eq!(a.len + b.map_or(0, |s| s.len), n);
                    prop_assert!(a.off + a.len <= e.len());
                    if let Some(b) = b { prop_assert_eq!(b.off, e.base()); prop_assert!(a.off + a.len == e.len()); }
                    prod = e.advance(prod, u64::from(n));
                    m.prod += u64::from(n);
                } else {
                    let avail = e.distance(prod, cons);
                    prop_assert_eq!(avail, m.prod - m.cons);
                    let n = u64::from(n).min(avail);
                    cons = e.advance(cons, n);
                    m.cons += n;
                }
                prop_assert!(e.check(prod).is_ok());
                prop_assert!(e.check(cons).is_ok());
                prop_assert_eq!(prod, Cursor::new(((m.prod / cap) % 65_536) as u16, e.base() + (m.prod % cap) as u32));
                prop_assert_eq!(cons, Cursor::new(((m.cons / cap) % 65_536) as u16, e.base() + (m.cons % cap) as u32));
            }
        }
    }
}
