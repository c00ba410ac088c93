//! MPA FPDU framing, RFC 5044 §4 (FPDU format §4.1, markers §4.2-§4.3, CRC
//! §4.4, sizing §4.5) and §6 (receiver FPDU identification).
//!
//! Read RFC 5044 §4.3 and §4.4 before touching the marker code: markers sit
//! every 512 octets of the TCP stream *counted from the first octet of the
//! Full Operation phase in that direction* (the first marker, FPDUPTR 0,
//! immediately precedes the first FPDU, RFC 5044 §7.1.2 rule 7); an interior
//! marker's FPDUPTR is the distance from the FPDU's ULPDU_Length field to the
//! marker; a marker that falls between two FPDUs has FPDUPTR 0 and belongs
//! to (and is CRC-covered by) the following FPDU; a marker right after the
//! pad belongs to the FPDU whose pad it follows. Markers are not counted in
//! ULPDU_Length.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-------------------------------+-------------------------------+
//! |          ULPDU_Length         |                               |
//! +-------------------------------+                               +
//! ~                      ULPDU (a DDP segment)                    ~
//! |                               +-------------------------------+
//! |                               |        PAD (0-3 octets)       |
//! +-------------------------------+-------------------------------+
//! |                     CRC (CRC32c, or anything)                 |
//! +---------------------------------------------------------------+
//! ```
//!
//! The CRC is CRC32c over ULPDU_Length, ULPDU, pad and any markers inside
//! the FPDU, written least-significant octet first (`crate::crc::to_wire`,
//! as Linux siw and the RFC 5044 Fig. 5/6 examples do). When CRCs are not
//! negotiated the field is sent as zero and never checked (RFC 5044 §4.1).
//!
//! This file has the sizes, the [`Fpdu`] view, the [`Marker`] format and the
//! transmit side ([`Framer`]); the receive side ([`Deframer`]) is in
//! `fpdu_deframer.rs`.

use core::fmt;

use crate::crc::{Crc32c, crc32c, to_wire};

#[path = "fpdu_deframer.rs"]
mod deframer;
pub use deframer::{Chunk, Deframer, DeframerConfig, FpduError, PlacedFpdu};

mod field {
    #![allow(non_snake_case)]
    use core::ops::Range;

    /// RFC 5044 Fig. 2.
    pub const ULPDU_LENGTH: Range<usize> = 0..2;
    pub const fn ULPDU(len: usize) -> Range<usize> {
        ULPDU_LENGTH.end..ULPDU_LENGTH.end + len
    }
    /// RFC 5044 Fig. 3.
    pub const MARKER_RESERVED: Range<usize> = 0..2;
    pub const MARKER_FPDUPTR: Range<usize> = 2..4;
    /// "The least significant two bits MUST always be set to zero at the
    /// transmitter, and the receivers MUST always treat these as zero".
    pub const FPDUPTR_MASK: u16 = 0xFFFC;
}

/// Length of the ULPDU_Length field.
pub const HEADER_LEN: usize = field::ULPDU_LENGTH.end;
/// Length of the CRC field.
pub const CRC_LEN: usize = 4;
/// Length of a marker.
pub const MARKER_LEN: usize = field::MARKER_FPDUPTR.end;
/// Markers sit every 512 octets of the stream (RFC 5044 §4.3).
pub const MARKER_INTERVAL: usize = 512;
/// Largest ULPDU_Length (16 bits).
pub const MAX_ULPDU_LEN: usize = u16::MAX as usize;
/// RFC 5044 §4.5: "MPA ... MUST NOT shrink the MULPDU below 128 octets".
pub const MIN_MULPDU: usize = 128;
/// Octets an FPDU adds to its ULPDU besides pad and markers.
pub const OVERHEAD: usize = HEADER_LEN + CRC_LEN;

/// Pad octets after a ULPDU of `ulpdu_len` octets: `2 + len + pad` is a
/// multiple of 4 (RFC 5044 §4.1 "PAD").
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (HEADER_LEN + ulpdu_len) % 4) % 4
}

/// Octets of an FPDU carrying `ulpdu_len` octets, without markers.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    HEADER_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// RFC 5044 §4.5 MULPDU, the largest ULPDU that fits an FPDU in one TCP
/// segment of `emss` octets:
/// `EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)` with markers,
/// `EMSS - (6 + EMSS mod 4)` without; never below 128 (§4.5) nor above
/// 65535 (and, with markers, small enough for every FPDUPTR to fit 16 bits).
pub fn mulpdu(emss: usize, markers: bool) -> usize {
    let m = if markers {
        let emss = emss.min(MAX_ULPDU_LEN);
        emss.saturating_sub(OVERHEAD + 4 * emss.div_ceil(MARKER_INTERVAL) + emss % 4)
    } else {
        emss.saturating_sub(OVERHEAD + emss % 4)
    };
    m.clamp(MIN_MULPDU, MAX_ULPDU_LEN)
}

/// A marker (RFC 5044 §4.2, Fig. 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Marker {
    /// Reserved; zero on transmit, ignored on receive (CRC aside).
    pub reserved: u16,
    /// Octets from the start of the FPDU's ULPDU_Length field to the
    /// marker; 0 for a marker between FPDUs.
    pub fpduptr: u16,
}

impl Marker {
    /// Reads four octets.
    pub fn parse(b: [u8; MARKER_LEN]) -> Marker {
        let r = &b[field::MARKER_RESERVED];
        let p = &b[field::MARKER_FPDUPTR];
        Marker {
            reserved: u16::from_be_bytes([r[0], r[1]]),
            fpduptr: u16::from_be_bytes([p[0], p[1]]),
        }
    }

    /// The four octets; the low two FPDUPTR bits are cleared.
    pub fn to_bytes(&self) -> [u8; MARKER_LEN] {
        let r = self.reserved.to_be_bytes();
        let p = (self.fpduptr & field::FPDUPTR_MASK).to_be_bytes();
        [r[0], r[1], p[0], p[1]]
    }

    /// FPDUPTR as a receiver must use it (low two bits treated as zero).
    pub fn pointer(&self) -> u16 {
        self.fpduptr & field::FPDUPTR_MASK
    }
}

/// A view of one marker-free FPDU at the start of a buffer.
///
/// Once [`Fpdu::check_len`] returned `Ok`, no accessor panics.
#[derive(Debug, Clone)]
pub struct Fpdu<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Fpdu<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Fpdu<T> {
        Fpdu { buffer }
    }
    /// Wraps a buffer that must hold a whole FPDU (it may hold more).
    pub fn new_checked(buffer: T) -> Result<Fpdu<T>, usize> {
        let f = Fpdu::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }
    /// `Ok` if the buffer holds the whole FPDU, else `Err(octets needed)`.
    pub fn check_len(&self) -> Result<(), usize> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(HEADER_LEN);
        }
        let need = self.total_len();
        if b.len() < need { Err(need) } else { Ok(()) }
    }
    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// ULPDU_Length.
    pub fn ulpdu_len(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::ULPDU_LENGTH];
        u16::from_be_bytes([b[0], b[1]])
    }
    /// Octets of the whole FPDU (header, ULPDU, pad, CRC).
    pub fn total_len(&self) -> usize {
        fpdu_len(usize::from(self.ulpdu_len()))
    }
    /// The ULPDU.
    pub fn ulpdu(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ULPDU(usize::from(self.ulpdu_len()))]
    }
    /// The CRC field as a CRC32c value.
    pub fn crc(&self) -> u32 {
        let end = self.total_len();
        let b = &self.buffer.as_ref()[end - CRC_LEN..end];
        crate::crc::from_wire([b[0], b[1], b[2], b[3]])
    }
    /// CRC32c of header, ULPDU and pad, as it should be in the CRC field.
    pub fn compute_crc(&self) -> u32 {
        crc32c(&self.buffer.as_ref()[..self.total_len() - CRC_LEN])
    }
    /// Whether the CRC field matches the contents.
    pub fn verify_crc(&self) -> bool {
        self.crc() == self.compute_crc()
    }
}

/// A transmit-side failure; all are local misuse, never peer input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// The ULPDU exceeds 65535 octets.
    #[error("ULPDU of {0} octets does not fit the 16-bit ULPDU_Length")]
    UlpduTooLong(usize),
    /// With markers, an FPDUPTR would not fit 16 bits (keep ULPDUs at or
    /// below [`mulpdu`]).
    #[error("FPDU too long for 16-bit marker pointers")]
    MarkerPointerOverflow,
    /// The output buffer is smaller than [`Framer::wire_len`].
    #[error("buffer too small for the FPDU: need {need}, have {have}")]
    BufferTooSmall {
        /// Octets needed.
        need: usize,
        /// Octets there were.
        have: usize,
    },
    /// [`Framer::begin`] is only for streams without markers.
    #[error("streaming FPDU emission is not available with markers")]
    MarkersActive,
    /// [`TxFpdu::trailer`] was called after a different number of ULPDU
    /// octets than announced.
    #[error("FPDU announced {announced} ULPDU octets, {written} were given")]
    LengthMismatch {
        /// ULPDU octets announced.
        announced: usize,
        /// ULPDU octets given.
        written: usize,
    },
}

/// Where the markers of one FPDU go (RFC 5044 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// A marker (FPDUPTR 0) precedes the ULPDU_Length field.
    lead: bool,
    /// ULPDU_Length + ULPDU + pad.
    content: usize,
    /// Markers inside the FPDU (after the length field, up to the CRC).
    inner: usize,
    /// Distance from the length field to the first inner marker.
    first: usize,
    /// All octets, markers and CRC included.
    total: usize,
}

/// The transmit side of one half connection: wraps ULPDUs into FPDUs,
/// computing CRCs (when negotiated) and inserting markers (when the peer
/// asked for them with M=1), RFC 5044 §4.
///
/// Every FPDU must be sent, in order, as the framer produced it: with
/// markers the framer tracks the stream position.
#[derive(Debug, Clone)]
pub struct Framer {
    crc: bool,
    markers: bool,
    /// Octets produced since the start of Full Operation.
    pos: u64,
}

impl Framer {
    /// A framer at the first octet after the MPA Request (Initiator) or
    /// Reply (Responder).
    pub fn new(crc: bool, markers: bool) -> Framer {
        Framer { crc, markers, pos: 0 }
    }
    /// Whether CRCs are generated.
    pub fn crc(&self) -> bool {
        self.crc
    }
    /// Whether markers are inserted.
    pub fn markers(&self) -> bool {
        self.markers
    }
    /// Octets framed so far.
    pub fn stream_pos(&self) -> u64 {
        self.pos
    }

    fn layout(&self, ulpdu_len: usize) -> Result<Layout, EmitError> {
        if ulpdu_len > MAX_ULPDU_LEN {
            return Err(EmitError::UlpduTooLong(ulpdu_len));
        }
        let content = HEADER_LEN + ulpdu_len + pad_len(ulpdu_len);
        if !self.markers {
            return Ok(Layout {
                lead: false,
                content,
                inner: 0,
                first: 0,
                total: content + CRC_LEN,
            });
        }
        // pos is always a multiple of 4: every FPDU and marker is.
        let r = (self.pos % MARKER_INTERVAL as u64) as usize;
        let lead = r == 0;
        let s = if lead { MARKER_LEN } else { r };
        let first = MARKER_INTERVAL - s;
        // Marker k (0-based) is at distance first + 512 k from the length
        // field, after first + 508 k content octets; it belongs to this FPDU
        // while that is <= content (a marker right after the pad is still
        // inside, RFC 5044 §4.4 rule 1).
        let inner = if content >= first {
            (content - first) / (MARKER_INTERVAL - MARKER_LEN) + 1
        } else {
            0
        };
        if inner > 0 && first + MARKER_INTERVAL * (inner - 1) > usize::from(u16::MAX) {
            return Err(EmitError::MarkerPointerOverflow);
        }
        let total = if lead { MARKER_LEN } else { 0 } + content + MARKER_LEN * inner + CRC_LEN;
        Ok(Layout {
            lead,
            content,
            inner,
            first,
            total,
        })
    }

    /// Octets the next FPDU carrying `ulpdu_len` octets will occupy.
    pub fn wire_len(&self, ulpdu_len: usize) -> Result<usize, EmitError> {
        Ok(self.layout(ulpdu_len)?.total)
    }

    /// Writes the next FPDU into the start of `out`, letting `fill` write
    /// the `ulpdu_len` ULPDU octets in place (e.g. a DDP header and a copy
    /// from a registered buffer). Returns the octets written
    /// (= [`Framer::wire_len`]). Nothing is framed on error.
    pub fn emit<F: FnOnce(&mut [u8])>(
        &mut self,
        ulpdu_len: usize,
        out: &mut [u8],
        fill: F,
    ) -> Result<usize, EmitError> {
        let l = self.layout(ulpdu_len)?;
        if out.len() < l.total {
            return Err(EmitError::BufferTooSmall {
                need: l.total,
                have: out.len(),
            });
        }
        let out = &mut out[..l.total];
        let base = if l.lead { MARKER_LEN } else { 0 };
        // RFC 5044 §4.1: length, ULPDU, zero pad.
        {
            let c = &mut out[base..base + l.content];
            c[field::ULPDU_LENGTH].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
            fill(&mut c[field::ULPDU(ulpdu_len)]);
            c[HEADER_LEN + ulpdu_len..].fill(0);
        }
        if l.lead {
            // RFC 5044 §7.1.2 rule 7 / §4.3: a marker between FPDUs is 0.
            out[..MARKER_LEN].copy_from_slice(&Marker::default().to_bytes());
        }
        // Open a gap for each inner marker, last first so nothing is
        // overwritten before it moved.
        for k in (0..l.inner).rev() {
            let from = l.first + (MARKER_INTERVAL - MARKER_LEN) * k; // content offset
            let to = if k + 1 < l.inner {
                l.first + (MARKER_INTERVAL - MARKER_LEN) * (k + 1)
            } else {
                l.content
            };
            let shift = MARKER_LEN * (k + 1);
            out.copy_within(base + from..base + to, base + from + shift);
            let at = base + from + MARKER_LEN * k;
            let ptr = (l.first + MARKER_INTERVAL * k) as u16; // checked in layout()
            out[at..at + MARKER_LEN].copy_from_slice(
                &Marker {
                    reserved: 0,
                    fpduptr: ptr,
                }
                .to_bytes(),
            );
        }
        let crc_at = l.total - CRC_LEN;
        // RFC 5044 §4.4: the CRC covers a leading marker, the header, ULPDU,
        // inner markers and pad; zero when CRCs are off (as siw sends).
        let crc = if self.crc {
            to_wire(crc32c(&out[..crc_at]))
        } else {
            [0; CRC_LEN]
        };
        out[crc_at..].copy_from_slice(&crc);
        self.pos += l.total as u64;
        Ok(l.total)
    }

    /// Like [`Framer::emit`], the ULPDU gathered from `parts` in order.
    pub fn emit_gather(&mut self, parts: &[&[u8]], out: &mut [u8]) -> Result<usize, EmitError> {
        let len = parts.iter().fold(0usize, |a, p| a.saturating_add(p.len()));
        self.emit(len, out, |buf| {
            let mut at = 0;
            for p in parts {
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        })
    }

    /// Appends the FPDU carrying `ulpdu` to `out`; returns its length.
    pub fn emit_vec(&mut self, ulpdu: &[u8], out: &mut Vec<u8>) -> Result<usize, EmitError> {
        let n = self.wire_len(ulpdu.len())?;
        let start = out.len();
        out.resize(start + n, 0);
        self.emit(ulpdu.len(), &mut out[start..], |b| b.copy_from_slice(ulpdu))
    }

    /// The lean framer of a one-segment message (issue 18, session 17): one whole FPDU
    /// straight into `out`, the ULPDU being the DDP header `h`, then `rdmap_hdr`, then
    /// `payload_len` octets `fill` writes in place; then pad and CRC (when on). The same
    /// octets as [`Framer::emit`] of that ULPDU (tested, and compared by the fuzz target
    /// `mpa_frame`) without its general layout: only without markers
    /// ([`EmitError::MarkersActive`]); nothing is framed on error.
    pub fn emit_segment<F: FnOnce(&mut [u8])>(
        &mut self,
        h: &super::ddp::Header,
        rdmap_hdr: &[u8],
        payload_len: usize,
        out: &mut [u8],
        fill: F,
    ) -> Result<usize, EmitError> {
        if self.markers {
            return Err(EmitError::MarkersActive);
        }
        let ddp_len = h.header_len();
        let hdr_end = HEADER_LEN + ddp_len + rdmap_hdr.len();
        let ulpdu_len = hdr_end - HEADER_LEN + payload_len;
        if ulpdu_len > MAX_ULPDU_LEN {
            return Err(EmitError::UlpduTooLong(ulpdu_len));
        }
        let pay_end = hdr_end + payload_len;
        let crc_at = pay_end + pad_len(ulpdu_len);
        let total = crc_at + CRC_LEN;
        let Some(out) = out.get_mut(..total) else {
            return Err(EmitError::BufferTooSmall {
                need: total,
                have: out.len(),
            });
        };
        out[..HEADER_LEN].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
        // The header length was taken from `h`: emit cannot run short.
        let _ = h.emit(&mut out[HEADER_LEN..HEADER_LEN + ddp_len]);
        out[HEADER_LEN + ddp_len..hdr_end].copy_from_slice(rdmap_hdr);
        fill(&mut out[hdr_end..pay_end]);
        out[pay_end..crc_at].fill(0);
        let crc = if self.crc {
            to_wire(crc32c(&out[..crc_at]))
        } else {
            [0; CRC_LEN]
        };
        out[crc_at..].copy_from_slice(&crc);
        self.pos += total as u64;
        Ok(total)
    }

    /// Starts an FPDU whose ULPDU the caller sends itself (e.g. `writev`
    /// straight from a registered buffer): send [`TxFpdu::header`], then the
    /// ULPDU (passing each piece to [`TxFpdu::update`] when CRCs are on),
    /// then [`TxFpdu::trailer`]. Only without markers.
    pub fn begin(&mut self, ulpdu_len: usize) -> Result<TxFpdu, EmitError> {
        if self.markers {
            return Err(EmitError::MarkersActive);
        }
        let l = self.layout(ulpdu_len)?;
        let header = (ulpdu_len as u16).to_be_bytes();
        let crc = self.crc.then(|| {
            let mut c = Crc32c::new();
            c.update(&header);
            c
        });
        self.pos += l.total as u64;
        Ok(TxFpdu {
            header,
            crc,
            ulpdu_len,
            written: 0,
        })
    }
}

/// An FPDU being sent piecewise, from [`Framer::begin`].
#[derive(Clone)]
pub struct TxFpdu {
    header: [u8; HEADER_LEN],
    crc: Option<Crc32c>,
    ulpdu_len: usize,
    written: usize,
}

impl fmt::Debug for TxFpdu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxFpdu")
            .field("ulpdu_len", &self.ulpdu_len)
            .field("written", &self.written)
            .field("crc", &self.crc.is_some())
            .finish()
    }
}

impl TxFpdu {
    /// The ULPDU_Length octets to send first.
    pub fn header(&self) -> [u8; HEADER_LEN] {
        self.header
    }
    /// Accounts for the next ULPDU octets (CRC when on).
    pub fn update(&mut self, ulpdu_part: &[u8]) {
        self.written = self.written.saturating_add(ulpdu_part.len());
        if let Some(c) = &mut self.crc {
            c.update(ulpdu_part);
        }
    }
    /// Accounts for `n` ULPDU octets the caller sends without showing them
    /// here; only allowed when CRCs are off (nothing to cover).
    pub fn account(&mut self, n: usize) -> Result<(), EmitError> {
        if self.crc.is_some() {
            return Err(EmitError::LengthMismatch {
                announced: self.ulpdu_len,
                written: self.written,
            });
        }
        self.written = self.written.saturating_add(n);
        Ok(())
    }
    /// Whether [`TxFpdu::update`] must see the octets (CRCs on).
    pub fn needs_bytes(&self) -> bool {
        self.crc.is_some()
    }
    /// Pad and CRC to send after the ULPDU.
    pub fn trailer(mut self) -> Result<Trailer, EmitError> {
        if self.written != self.ulpdu_len {
            return Err(EmitError::LengthMismatch {
                announced: self.ulpdu_len,
                written: self.written,
            });
        }
        let pad = pad_len(self.ulpdu_len);
        let mut bytes = [0u8; 7];
        let crc = match &mut self.crc {
            Some(c) => {
                c.update(&bytes[..pad]);
                to_wire(c.finish())
            }
            None => [0; CRC_LEN],
        };
        bytes[pad..pad + CRC_LEN].copy_from_slice(&crc);
        Ok(Trailer {
            bytes,
            len: (pad + CRC_LEN) as u8,
        })
    }
}

/// Pad and CRC octets ending an FPDU, from [`TxFpdu::trailer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    bytes: [u8; 7],
    len: u8,
}

impl AsRef<[u8]> for Trailer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 5044 Fig. 5 without its leading marker: a 42-octet Send ULPDU
    /// (DDP untagged, QN 0, MSN 1, MO 0, 24 zero octets).
    fn fig5_ulpdu() -> Vec<u8> {
        let mut u = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        u.resize(42, 0);
        u
    }

    #[test]
    fn sizes() {
        // RFC 5044 §4.1: pad makes 2 + len + pad a multiple of 4.
        assert_eq!(pad_len(0), 2);
        assert_eq!(pad_len(1), 1);
        assert_eq!(pad_len(2), 0);
        assert_eq!(pad_len(3), 3);
        assert_eq!(fpdu_len(34), 40); // siw rping Send (pcap frame 8)
        assert_eq!(fpdu_len(46), 52); // siw Read Request (frame 9)
        assert_eq!(fpdu_len(78), 84); // siw Read Response (frame 10)
        assert_eq!(fpdu_len(65535), 65544);
    }

    #[test]
    fn mulpdu_rfc5044_4_5() {
        // Without markers: EMSS - (6 + EMSS mod 4).
        assert_eq!(mulpdu(1460, false), 1454);
        assert_eq!(mulpdu(1461, false), 1454);
        assert_eq!(mulpdu(1448, false), 1442);
        assert_eq!(fpdu_len(mulpdu(1463, false)), 1460);
        // Linux lo: MSS 65495.
        assert_eq!(mulpdu(65495, false), 65486);
        assert_eq!(mulpdu(1 << 20, false), MAX_ULPDU_LEN);
        // With markers: EMSS - (6 + 4 ceil(EMSS/512) + EMSS mod 4).
        assert_eq!(mulpdu(1460, true), 1460 - (6 + 4 * 3));
        assert_eq!(mulpdu(512, true), 512 - 10);
        // Never below 128.
        assert_eq!(mulpdu(100, false), 128);
        assert_eq!(mulpdu(0, true), 128);
    }

    #[test]
    fn mulpdu_fits_emss_at_every_position() {
        // The worst-case marker count really is worst case.
        for emss in [200usize, 536, 1000, 1460, 4096, 9000, 65495] {
            let m = mulpdu(emss, true);
            for pos in (0..512).step_by(4) {
                let mut f = Framer::new(true, true);
                f.pos = pos;
                assert!(f.wire_len(m).unwrap() <= emss, "emss {emss} pos {pos}");
            }
            assert!(fpdu_len(mulpdu(emss, false)) <= emss);
        }
    }

    #[test]
    fn crc_check_value() {
        // C.2.5: "123456789" -> 0xE3069283, sent LSB first.
        assert_eq!(to_wire(crc32c(b"123456789")), [0x83, 0x92, 0x06, 0xE3]);
    }

    #[test]
    fn rfc5044_fig5_first_fpdu_with_marker() {
        // RFC 5044 Fig. 5: the first FPDU of the stream starts with a zero
        // marker, covered by the CRC 52 23 99 83.
        let mut f = Framer::new(true, true);
        let mut out = Vec::new();
        let n = f.emit_vec(&fig5_ulpdu(), &mut out).unwrap();
        assert_eq!(n, 0x34);
        let mut want = vec![0, 0, 0, 0, 0x00, 0x2a];
        want.extend_from_slice(&fig5_ulpdu());
        want.extend_from_slice(&[0x52, 0x23, 0x99, 0x83]);
        assert_eq!(out, want);
    }

    #[test]
    fn rfc5044_fig6_second_fpdu_with_inner_marker() {
        // RFC 5044 Fig. 6: the first FPDU took 492 octets (leading marker
        // included); the second starts at 0x1ec and has a marker at 0x200
        // with FPDUPTR 0x14, CRC 84 92 58 98.
        let mut f = Framer::new(true, true);
        let mut out = Vec::new();
        f.emit_vec(&[0u8; 482], &mut out).unwrap();
        assert_eq!(out.len(), 0x1ec);
        let mut u = fig5_ulpdu();
        u[13] = 2; // MSN 2
        f.emit_vec(&u, &mut out).unwrap();
        let second = &out[0x1ec..];
        let mut want = vec![0x00, 0x2a];
        want.extend_from_slice(&u[..18]);
        want.extend_from_slice(&[0, 0, 0, 0x14]);
        want.extend_from_slice(&u[18..]);
        want.extend_from_slice(&[0x84, 0x92, 0x58, 0x98]);
        assert_eq!(second, &want[..]);
        assert_eq!(out.len(), 0x220);
    }

    #[test]
    fn fig5_without_marker_crc_off_matches_siw_shape() {
        // CRC off: the field is present and zero (siw_qp_tx.c behaviour,
        // visible in the rping capture).
        let mut f = Framer::new(false, false);
        let mut out = [0xa5u8; 60];
        let n = f.emit(42, &mut out, |b| b.copy_from_slice(&fig5_ulpdu())).unwrap();
        assert_eq!(n, 48);
        assert_eq!(&out[..2], &[0, 42]);
        assert_eq!(&out[44..48], &[0, 0, 0, 0]);
        assert_eq!(&out[48..], &[0xa5; 12]);
        let v = Fpdu::new_checked(&out[..]).unwrap();
        assert_eq!(v.ulpdu_len(), 42);
        assert_eq!(v.ulpdu(), &fig5_ulpdu()[..]);
        assert_eq!(v.total_len(), 48);
    }

    #[test]
    fn siw_golden_fpdu_crc_off() {
        // vm-lo-siw-rping.pcap frame 8: siw's first Send FPDU (CRC off).
        let bytes: [u8; 40] = [
            0x00, 0x22, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x56, 0x1c, 0xae, 0xa0, 0x1b, 0x90, 0x7e, 0x9f, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x40,
            0x00, 0x00, 0x00, 0x00,
        ];
        let v = Fpdu::new_checked(&bytes[..]).unwrap();
        assert_eq!(v.ulpdu_len(), 34);
        assert_eq!(v.crc(), 0);
        let mut f = Framer::new(false, false);
        let mut out = Vec::new();
        f.emit_vec(v.ulpdu(), &mut out).unwrap();
        assert_eq!(out, bytes);
        // With CRC on, the same FPDU carries the CRC32c LSB first.
        let mut f = Framer::new(true, false);
        let mut out = Vec::new();
        f.emit_vec(v.ulpdu(), &mut out).unwrap();
        assert_eq!(&out[36..], &to_wire(crc32c(&bytes[..36])));
        assert!(Fpdu::new_checked(&out[..]).unwrap().verify_crc());
    }

    #[test]
    fn view_truncated() {
        assert_eq!(Fpdu::new_checked(&[0u8][..]).unwrap_err(), HEADER_LEN);
        assert_eq!(Fpdu::new_checked(&[0u8, 34, 0][..]).unwrap_err(), 40);
    }

    #[test]
    fn emit_errors() {
        let mut f = Framer::new(true, false);
        let mut small = [0u8; 7];
        assert_eq!(
            f.emit(2, &mut small, |_| {}),
            Err(EmitError::BufferTooSmall { need: 8, have: 7 })
        );
        assert_eq!(f.wire_len(65536), Err(EmitError::UlpduTooLong(65536)));
        assert_eq!(f.stream_pos(), 0);
        let mut m = Framer::new(false, true);
        assert_eq!(m.wire_len(65535), Err(EmitError::MarkerPointerOverflow));
        assert!(m.wire_len(mulpdu(65535, true)).is_ok());
        assert_eq!(m.begin(4).unwrap_err(), EmitError::MarkersActive);
    }

    #[test]
    fn marker_format() {
        let m = Marker::parse([0x12, 0x34, 0x01, 0x17]);
        assert_eq!(
            m,
            Marker {
                reserved: 0x1234,
                fpduptr: 0x0117
            }
        );
        assert_eq!(m.pointer(), 0x0114);
        assert_eq!(
            Marker {
                reserved: 0,
                fpduptr: 0x0117
            }
            .to_bytes(),
            [0, 0, 0x01, 0x14]
        );
    }

    #[test]
    fn begin_trailer_matches_emit() {
        for crc in [false, true] {
            for len in [0usize, 1, 2, 3, 4, 34, 1000] {
                let ulpdu: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let mut a = Framer::new(crc, false);
                let mut want = Vec::new();
                a.emit_vec(&ulpdu, &mut want).unwrap();
                let mut b = Framer::new(crc, false);
                let mut tx = b.begin(len).unwrap();
                let mut got = tx.header().to_vec();
                let (x, y) = ulpdu.split_at(len / 2);
                for part in [x, y] {
                    tx.update(part);
                    got.extend_from_slice(part);
                }
                got.extend_from_slice(tx.trailer().unwrap().as_ref());
                assert_eq!(got, want);
                assert_eq!(a.stream_pos(), b.stream_pos());
            }
        }
        let mut f = Framer::new(true, false);
        let tx = f.begin(3).unwrap();
        assert_eq!(
            tx.trailer(),
            Err(EmitError::LengthMismatch {
                announced: 3,
                written: 0
            })
        );
    }

    #[test]
    fn gather_equals_contiguous() {
        let a = [1u8, 2, 3];
        let b = [4u8; 600];
        for markers in [false, true] {
            let mut f1 = Framer::new(true, markers);
            let mut f2 = Framer::new(true, markers);
            let mut o1 = vec![0; 700];
            let mut o2 = Vec::new();
            let n = f1.emit_gather(&[&a, &b, &[]], &mut o1).unwrap();
            let mut joined = a.to_vec();
            joined.extend_from_slice(&b);
            f2.emit_vec(&joined, &mut o2).unwrap();
            assert_eq!(&o1[..n], &o2[..]);
        }
    }

    /// Removes markers from a framed stream the slow, obvious way and checks
    /// every FPDUPTR: an oracle for the marker layout.
    fn strip_oracle(stream: &[u8]) -> Vec<Vec<u8>> {
        let mut clean = Vec::new();
        let mut starts = Vec::new();
        let mut i = 0;
        let mut fpdu_start = 0;
        let mut need_hdr = true;
        let mut rem = 0usize; // content octets left in the current FPDU
        while i < stream.len() {
            if i % 512 == 0 {
                let ptr = u16::from_be_bytes([stream[i + 2], stream[i + 3]]) as usize;
                if need_hdr {
                    assert_eq!(ptr, 0, "marker at {i}");
                } else {
                    assert_eq!(ptr, i - fpdu_start, "marker at {i}");
                }
                i += 4;
                continue;
            }
            if need_hdr {
                fpdu_start = i;
                let len = u16::from_be_bytes([stream[i], stream[i + 1]]) as usize;
                rem = fpdu_len(len);
                starts.push(clean.len());
                need_hdr = false;
            }
            clean.push(stream[i]);
            i += 1;
            rem -= 1;
            if rem == 0 {
                need_hdr = true;
            }
        }
        assert!(need_hdr);
        let mut out = Vec::new();
        for s in starts {
            let v = Fpdu::new_checked(&clean[s..]).unwrap();
            out.push(v.ulpdu().to_vec());
        }
        out
    }

    proptest! {
        #[test]
        fn markers_land_every_512(lens in proptest::collection::vec(0usize..1500, 1..12)) {
            let mut f = Framer::new(true, true);
            let mut stream = Vec::new();
            let mut sent = Vec::new();
            for (k, len) in lens.iter().enumerate() {
                let u: Vec<u8> = (0..*len).map(|i| (i + k) as u8).collect();
                f.emit_vec(&u, &mut stream).unwrap();
                sent.push(u);
            }
            prop_assert_eq!(stream.len() as u64, f.stream_pos());
            prop_assert_eq!(strip_oracle(&stream), sent);
        }

        #[test]
        fn view_roundtrip(u in proptest::collection::vec(any::<u8>(), 0..2000), crc in any::<bool>()) {
            let mut f = Framer::new(crc, false);
            let mut out = Vec::new();
            let n = f.emit_vec(&u, &mut out).unwrap();
            prop_assert_eq!(n, fpdu_len(u.len()));
            let v = Fpdu::new_checked(&out[..]).unwrap();
            prop_assert_eq!(v.ulpdu(), &u[..]);
            prop_assert_eq!(v.verify_crc(), crc);
        }
    }

    /// The lean one-segment framer writes the octets the general one does (issue 18,
    /// session 17; RFC 5044 §4.1 length, pad, CRC, RFC 5041 §4 headers): every
    /// tagged/untagged header form, RDMAP headers of 0, 4 (Send with Invalidate's place is
    /// in the DDP header; 4 stands for an odd length) and 28 octets (Read Request), payloads
    /// 0-300 (every pad), CRC on and off, and the stream position they leave behind.
    #[test]
    fn lean_segment_equals_the_general_framer_mpa_fpdu() {
        use crate::wire::ddp::{Addr, Header};
        let headers = [
            Header {
                last: true,
                rdmap_ctrl: 0x43,
                addr: Addr::Untagged {
                    qn: 0,
                    msn: 0x0102_0304,
                    mo: 0,
                    inv_stag: 0xdead_beef,
                },
            },
            Header {
                last: true,
                rdmap_ctrl: 0x41,
                addr: Addr::Untagged {
                    qn: 1,
                    msn: 7,
                    mo: 0,
                    inv_stag: 0,
                },
            },
            Header {
                last: true,
                rdmap_ctrl: 0x40,
                addr: Addr::Tagged {
                    stag: 0x1234_5678,
                    to: 0x0011_2233_4455_6677,
                },
            },
            Header {
                last: false,
                rdmap_ctrl: 0x40,
                addr: Addr::Tagged { stag: 1, to: 0 },
            },
        ];
        let mut cases = 0;
        for crc in [false, true] {
            for h in &headers {
                for rh_len in [0usize, 4, 28] {
                    let rh: Vec<u8> = (0..rh_len).map(|i| (i * 7 + 1) as u8).collect();
                    for len in 0..=300usize {
                        let payload: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
                        let (mut g, mut l) = (Framer::new(crc, false), Framer::new(crc, false));
                        // Positions not at 0: a stream already under way.
                        for f in [&mut g, &mut l] {
                            f.emit_vec(&[1, 2, 3], &mut Vec::new()).unwrap();
                        }
                        let dl = h.header_len();
                        let ulpdu_len = dl + rh_len + len;
                        let mut general = vec![0xAAu8; g.wire_len(ulpdu_len).unwrap()];
                        g.emit(ulpdu_len, &mut general, |u| {
                            h.emit(u).unwrap();
                            u[dl..dl + rh_len].copy_from_slice(&rh);
                            u[dl + rh_len..].copy_from_slice(&payload);
                        })
                        .unwrap();
                        let mut lean = vec![0x55u8; 400];
                        let n = l
                            .emit_segment(h, &rh, len, &mut lean, |p| p.copy_from_slice(&payload))
                            .unwrap();
                        assert_eq!(&lean[..n], &general[..], "crc {crc} {h:?} rh {rh_len} len {len}");
                        assert_eq!(l.stream_pos(), g.stream_pos());
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 2 * 4 * 3 * 301);
        // Declines what it does not do, framing nothing.
        let mut m = Framer::new(false, true);
        let r = m.emit_segment(&headers[0], &[], 8, &mut [0u8; 64], |_| {});
        assert!(matches!(r, Err(EmitError::MarkersActive)));
        assert_eq!(m.stream_pos(), 0);
        let mut f = Framer::new(true, false);
        let r = f.emit_segment(&headers[0], &[], 100, &mut [0u8; 64], |_| {});
        assert!(matches!(r, Err(EmitError::BufferTooSmall { .. })));
        assert_eq!(f.stream_pos(), 0);
    }
}
