//! DDP segment headers (RFC 5041 §4.1-§4.4, Figs. 3-6), sans-I/O.
//!
//! Read before editing: RFC 5041 §4 (header formats) and §7 (errors), and the
//! catalogue `shared/requirements/rdmap-rpcrdma.md` A.1.2, A.1.4 and C.1.
//!
//! One DDP segment is one MPA ULPDU: the MPA deframer hands this module the
//! ULPDU (DDP header + RDMAP header + payload) without the MPA length field,
//! pad or CRC. The first octet is the DDP Control field, the second the first
//! octet of RsvdULP, which RDMAP uses as its control octet (RFC 5040 §4.1):
//!
//! ```text
//!   octet 0: T L Rsvd(4) DV(2)       octet 1: RV(2) Rsv(2) OpCode(4)
//!   tagged   (14 B): ctrl(2) STag(4) TO(8)
//!   untagged (18 B): ctrl(2) RsvdULP[8:39](4) QN(4) MSN(4) MO(4)
//! ```
//!
//! [`TaggedPacket`] and [`UntaggedPacket`] are smoltcp-style views over any
//! buffer; [`Header`] and [`Segment`] are the typed meaning. Parsing checks
//! only what DDP itself owns on a single segment (length and DV); queue,
//! sequence and buffer checks live in the engine's receive side
//! (`engine/qp/rx.rs`), RDMAP checks in [`super::rdmap`]. Every error names
//! the Terminate to send ([`Error::term_cause`], table [`super::cause`]).
//! Segmentation of outbound messages is [`segment_len`] and
//! [`Header::at_offset`] (RFC 5041 §5.2), which the engine's transmit side
//! runs.

use core::fmt;

use super::cause::{self, TermCause};

/// Private byte layout, in figure order (RFC 5041 Figs. 3-5, offsets from
/// the start of the DDP header, i.e. FPDU offset minus 2).
mod field {
    pub type Field = core::ops::Range<usize>;

    /// DDP Control field (Fig. 3).
    pub const DDP_CTRL: usize = 0;
    /// RsvdULP\[0:7\]: the RDMAP control octet (RFC 5040 §4.1).
    pub const RDMAP_CTRL: usize = 1;

    // Tagged Buffer Model header (Fig. 4).
    pub const STAG: Field = 2..6;
    pub const TO: Field = 6..14;

    // Untagged Buffer Model header (Fig. 5).
    /// RsvdULP\[8:39\]; RDMAP puts the Invalidate STag here.
    pub const RSVDULP: Field = 2..6;
    pub const QN: Field = 6..10;
    pub const MSN: Field = 10..14;
    pub const MO: Field = 14..18;

    pub const TAGGED_HEADER_LEN: usize = TO.end;
    pub const UNTAGGED_HEADER_LEN: usize = MO.end;

    // Bits of the DDP Control octet.
    pub const FLG_T: u8 = 0x80;
    pub const FLG_L: u8 = 0x40;
    pub const RSVD_MASK: u8 = 0x3C;
    pub const RSVD_SHIFT: u32 = 2;
    pub const DV_MASK: u8 = 0x03;
}

/// Length of the tagged DDP header (RFC 5041 §4.2): 14 octets.
pub const TAGGED_HEADER_LEN: usize = field::TAGGED_HEADER_LEN;
/// Length of the untagged DDP header (RFC 5041 §4.3): 18 octets.
pub const UNTAGGED_HEADER_LEN: usize = field::UNTAGGED_HEADER_LEN;
/// The DDP version of RFC 5041 (DV = 01b, §4.1).
pub const VERSION: u8 = 1;

/// Header length announced by the T flag of a DDP Control octet.
pub const fn header_len_for(ddp_ctrl: u8) -> usize {
    if ddp_ctrl & field::FLG_T != 0 {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

/// Big-endian field access shared by the wire modules of this family. The
/// caller has checked the length (smoltcp's contract: after `check_len`, no
/// accessor panics).
pub(crate) mod be {
    pub fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    pub fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    pub fn u64_at(b: &[u8], at: usize) -> u64 {
        (u64::from(u32_at(b, at)) << 32) | u64::from(u32_at(b, at + 4))
    }
    pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
}

/// A receive-side DDP header error. Each names the Terminate to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The ULPDU is empty: not even a DDP Control octet.
    Empty,
    /// The ULPDU is shorter than the header its T flag announces.
    Truncated {
        /// The T flag.
        tagged: bool,
        /// Octets there were.
        len: usize,
    },
    /// DV is not 01b (RFC 5041 §4.1; matrix A.4.6 rows 6 and 7).
    Version {
        /// The T flag.
        tagged: bool,
        /// The DV found.
        dv: u8,
    },
}

impl Error {
    /// The Terminate cause (catalogue A.4.6).
    ///
    /// * DV != 01b: untagged -> 1/2/0x06, tagged -> 1/1/0x04 (rows 6, 7).
    /// * Empty or truncated header (a ULPDU shorter than the DDP header its
    ///   T flag announces): the error is DDP's, since DDP owns the header
    ///   and the segment length (RFC 5041 §4, §5.1), so the Terminate names
    ///   the DDP layer (issue 12 point 8; before, RDMAP 0/2/0xFF). Of the
    ///   RFC 5041 §7.2 numbers only "Local Catastrophic" (1/0/0x00) is
    ///   neither a tagged- nor an untagged-buffer check: the header cannot
    ///   be read, so no buffer check applies, and the stream is lost. Like
    ///   rows 6/7 it carries no DDP header (M=D=R=0, RFC 5040 Fig. 10).
    pub const fn term_cause(&self) -> TermCause {
        match self {
            Error::Version { tagged: true, .. } => cause::DDP_ERR_T_INVALID_VERSION,
            Error::Version { tagged: false, .. } => cause::DDP_ERR_U_INVALID_VERSION,
            Error::Empty | Error::Truncated { .. } => cause::DDP_LOCAL_CATASTROPHIC_ERR,
        }
    }

    /// Whether the offending DDP header may be echoed in the Terminate. Never
    /// for these errors: the layout is unknown (siw does the same, A.4.2).
    pub const fn layout_known(&self) -> bool {
        false
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Empty => write!(f, "empty DDP segment"),
            Error::Truncated { tagged, len } => write!(
                f,
                "DDP segment of {len} octets is shorter than its {} header",
                if *tagged { "tagged" } else { "untagged" }
            ),
            Error::Version { dv, .. } => write!(f, "DDP version {dv} (expected {VERSION})"),
        }
    }
}

/// An emit buffer was too small (a local bug, never peer input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferTooSmall {
    /// Octets needed.
    pub need: usize,
    /// Octets there were.
    pub have: usize,
}

impl fmt::Display for BufferTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "emit buffer of {} octets, {} needed", self.have, self.need)
    }
}

pub(crate) const fn need(buf_len: usize, need: usize) -> Result<(), BufferTooSmall> {
    if buf_len < need {
        Err(BufferTooSmall { need, have: buf_len })
    } else {
        Ok(())
    }
}

/// Getters and setters of the two octets common to both views.
macro_rules! control_accessors {
    ($view:ident, $hlen:expr, $tagged:expr) => {
        impl<T: AsRef<[u8]>> $view<T> {
            /// Wrap a buffer without checking its length.
            pub const fn new_unchecked(buffer: T) -> Self {
                $view { buffer }
            }
            /// Wrap a buffer and check it holds the whole header.
            pub fn new_checked(buffer: T) -> Result<Self, Error> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }
            /// Once this returns `Ok`, no accessor panics.
            pub fn check_len(&self) -> Result<(), Error> {
                let len = self.buffer.as_ref().len();
                if len == 0 {
                    Err(Error::Empty)
                } else if len < $hlen {
                    Err(Error::Truncated { tagged: $tagged, len })
                } else {
                    Ok(())
                }
            }
            /// The buffer, given back.
            pub fn into_inner(self) -> T {
                self.buffer
            }
            /// The header length: 14 (tagged) or 18 (untagged) octets.
            pub const fn header_len(&self) -> usize {
                $hlen
            }
            /// T flag (RFC 5041 §4.1).
            pub fn tagged_flag(&self) -> bool {
                self.buffer.as_ref()[field::DDP_CTRL] & field::FLG_T != 0
            }
            /// L flag: last segment of the message.
            pub fn last_flag(&self) -> bool {
                self.buffer.as_ref()[field::DDP_CTRL] & field::FLG_L != 0
            }
            /// Rsvd (4 bits): 0 on transmit, not checked on receive.
            pub fn reserved(&self) -> u8 {
                (self.buffer.as_ref()[field::DDP_CTRL] & field::RSVD_MASK) >> field::RSVD_SHIFT
            }
            /// DV (2 bits), must be 01b.
            pub fn version(&self) -> u8 {
                self.buffer.as_ref()[field::DDP_CTRL] & field::DV_MASK
            }
            /// RsvdULP\[0:7\], the RDMAP control octet.
            pub fn rdmap_ctrl(&self) -> u8 {
                self.buffer.as_ref()[field::RDMAP_CTRL]
            }
        }

        impl<'a, T: AsRef<[u8]> + ?Sized> $view<&'a T> {
            /// The ULP payload after the header (RDMAP header included).
            pub fn payload(&self) -> &'a [u8] {
                &self.buffer.as_ref()[$hlen..]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            fn set_ctrl_bit(&mut self, mask: u8, on: bool) {
                let b = &mut self.buffer.as_mut()[field::DDP_CTRL];
                *b = if on { *b | mask } else { *b & !mask };
            }
            /// Sets the T flag.
            pub fn set_tagged_flag(&mut self, on: bool) {
                self.set_ctrl_bit(field::FLG_T, on)
            }
            /// Sets the L flag.
            pub fn set_last_flag(&mut self, on: bool) {
                self.set_ctrl_bit(field::FLG_L, on)
            }
            /// Sets the 4 reserved bits.
            pub fn set_reserved(&mut self, v: u8) {
                let b = &mut self.buffer.as_mut()[field::DDP_CTRL];
                *b = (*b & !field::RSVD_MASK) | ((v << field::RSVD_SHIFT) & field::RSVD_MASK);
            }
            /// Sets DV.
            pub fn set_version(&mut self, dv: u8) {
                let b = &mut self.buffer.as_mut()[field::DDP_CTRL];
                *b = (*b & !field::DV_MASK) | (dv & field::DV_MASK);
            }
            /// Sets RsvdULP\[0:7\], the RDMAP control octet.
            pub fn set_rdmap_ctrl(&mut self, v: u8) {
                self.buffer.as_mut()[field::RDMAP_CTRL] = v;
            }
            /// The ULP payload after the header, to fill.
            pub fn payload_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[$hlen..]
            }
        }
    };
}

/// View of a tagged DDP segment (RFC 5041 Fig. 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedPacket<T: AsRef<[u8]>> {
    buffer: T,
}

control_accessors!(TaggedPacket, TAGGED_HEADER_LEN, true);

impl<T: AsRef<[u8]>> TaggedPacket<T> {
    /// Data Sink STag.
    pub fn stag(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::STAG.start)
    }
    /// Tagged Offset of this segment's first payload octet.
    pub fn to(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::TO.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TaggedPacket<T> {
    /// Sets the STag.
    pub fn set_stag(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::STAG.start, v)
    }
    /// Sets the Tagged Offset.
    pub fn set_to(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), field::TO.start, v)
    }
}

/// View of an untagged DDP segment (RFC 5041 Fig. 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UntaggedPacket<T: AsRef<[u8]>> {
    buffer: T,
}

control_accessors!(UntaggedPacket, UNTAGGED_HEADER_LEN, false);

impl<T: AsRef<[u8]>> UntaggedPacket<T> {
    /// RsvdULP\[8:39\]: RDMAP's Invalidate STag (RFC 5040 §4.1).
    pub fn inv_stag(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::RSVDULP.start)
    }
    /// Queue Number.
    pub fn qn(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::QN.start)
    }
    /// Message Sequence Number.
    pub fn msn(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::MSN.start)
    }
    /// Message Offset.
    pub fn mo(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::MO.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UntaggedPacket<T> {
    /// Sets RsvdULP\[8:39\] (the Invalidate STag).
    pub fn set_inv_stag(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::RSVDULP.start, v)
    }
    /// Sets the Queue Number.
    pub fn set_qn(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::QN.start, v)
    }
    /// Sets the Message Sequence Number.
    pub fn set_msn(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::MSN.start, v)
    }
    /// Sets the Message Offset.
    pub fn set_mo(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::MO.start, v)
    }
}

/// Buffer-model addressing of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Addr {
    /// Tagged Buffer Model (RFC 5041 §4.2).
    Tagged {
        /// Steering Tag of the sink buffer.
        stag: u32,
        /// Tagged Offset of this segment's first octet.
        to: u64,
    },
    /// Untagged Buffer Model (RFC 5041 §4.3). `inv_stag` is RsvdULP\[8:39\].
    Untagged {
        /// Queue Number.
        qn: u32,
        /// Message Sequence Number.
        msn: u32,
        /// Message Offset of this segment's first octet.
        mo: u32,
        /// RsvdULP\[8:39\] (RDMAP's Invalidate STag).
        inv_stag: u32,
    },
}

/// The meaning of a DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// L flag.
    pub last: bool,
    /// RsvdULP\[0:7\], the RDMAP control octet, carried unchanged (RDMAP-LLP-03).
    pub rdmap_ctrl: u8,
    /// Tagged or untagged addressing.
    pub addr: Addr,
}

impl Header {
    /// Parse and validate the header at the start of a ULPDU. Checks run in
    /// the order of catalogue A.4.2: DV first (only octet 0 is needed), then
    /// the length announced by T. Rsvd is ignored (RFC 5041 §4.1).
    pub fn parse(ulpdu: &[u8]) -> Result<Header, Error> {
        let Some(&ctrl) = ulpdu.first() else {
            return Err(Error::Empty);
        };
        let tagged = ctrl & field::FLG_T != 0;
        let dv = ctrl & field::DV_MASK;
        if dv != VERSION {
            return Err(Error::Version { tagged, dv });
        }
        Self::parse_lenient(ulpdu).ok_or(Error::Truncated {
            tagged,
            len: ulpdu.len(),
        })
    }

    /// Decode without checking DV; `None` if too short. For headers echoed in
    /// a Terminate, which may be exactly the ones that failed `parse`.
    pub fn parse_lenient(bytes: &[u8]) -> Option<Header> {
        let &ctrl = bytes.first()?;
        if ctrl & field::FLG_T != 0 {
            let p = TaggedPacket::new_checked(bytes).ok()?;
            Some(Header {
                last: p.last_flag(),
                rdmap_ctrl: p.rdmap_ctrl(),
                addr: Addr::Tagged {
                    stag: p.stag(),
                    to: p.to(),
                },
            })
        } else {
            let p = UntaggedPacket::new_checked(bytes).ok()?;
            Some(Header {
                last: p.last_flag(),
                rdmap_ctrl: p.rdmap_ctrl(),
                addr: Addr::Untagged {
                    qn: p.qn(),
                    msn: p.msn(),
                    mo: p.mo(),
                    inv_stag: p.inv_stag(),
                },
            })
        }
    }

    /// Whether it is a tagged segment.
    pub const fn is_tagged(&self) -> bool {
        matches!(self.addr, Addr::Tagged { .. })
    }

    /// 14 (tagged) or 18 (untagged).
    pub const fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// The first 16 bits: DDP Control and RDMAP Control (catalogue A.1.2).
    pub const fn control_word(&self) -> u16 {
        let mut ddp = VERSION;
        if self.is_tagged() {
            ddp |= field::FLG_T;
        }
        if self.last {
            ddp |= field::FLG_L;
        }
        ((ddp as u16) << 8) | self.rdmap_ctrl as u16
    }

    /// Write the header (DV = 01b, Rsvd = 0) at the start of `buf`; returns
    /// its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let len = self.header_len();
        need(buf.len(), len)?;
        let buf = &mut buf[..len];
        buf[..2].copy_from_slice(&self.control_word().to_be_bytes());
        match self.addr {
            Addr::Tagged { stag, to } => {
                let mut p = TaggedPacket::new_unchecked(buf);
                p.set_stag(stag);
                p.set_to(to);
            }
            Addr::Untagged { qn, msn, mo, inv_stag } => {
                let mut p = UntaggedPacket::new_unchecked(buf);
                p.set_inv_stag(inv_stag);
                p.set_qn(qn);
                p.set_msn(msn);
                p.set_mo(mo);
            }
        }
        Ok(len)
    }
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = if self.last { "L" } else { "-" };
        match self.addr {
            Addr::Tagged { stag, to } => {
                write!(
                    f,
                    "DDP tagged {l} ulp={:#04x} stag={stag:#010x} to={to:#x}",
                    self.rdmap_ctrl
                )
            }
            Addr::Untagged { qn, msn, mo, inv_stag } => write!(
                f,
                "DDP untagged {l} ulp={:#04x} qn={qn} msn={msn} mo={mo} rsvdulp={inv_stag:#010x}",
                self.rdmap_ctrl
            ),
        }
    }
}

/// One DDP segment: header plus borrowed ULP payload (the RDMAP header, if
/// the opcode has one, is part of the payload at this layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment<'a> {
    /// The DDP header.
    pub header: Header,
    /// The ULP payload (RDMAP header included).
    pub payload: &'a [u8],
}

impl<'a> Segment<'a> {
    /// Parse one whole ULPDU as delivered by the MPA deframer.
    pub fn parse(ulpdu: &'a [u8]) -> Result<Segment<'a>, Error> {
        let header = Header::parse(ulpdu)?;
        // `parse` checked the length, so this cannot fail.
        let payload = ulpdu.get(header.header_len()..).ok_or(Error::Truncated {
            tagged: header.is_tagged(),
            len: ulpdu.len(),
        })?;
        Ok(Segment { header, payload })
    }

    /// The ULPDU length: header plus payload.
    pub const fn buffer_len(&self) -> usize {
        self.header.header_len() + self.payload.len()
    }

    /// Write header and payload; returns the ULPDU length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        self.emit_with(buf, self.payload.len(), |p| p.copy_from_slice(self.payload))
    }

    /// Write the header and let `fill` write `payload_len` payload octets in
    /// place (e.g. straight from a registered region). `self.payload` is
    /// ignored.
    pub fn emit_with(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, BufferTooSmall> {
        let hlen = self.header.header_len();
        let total = hlen.checked_add(payload_len).ok_or(BufferTooSmall {
            need: usize::MAX,
            have: buf.len(),
        })?;
        need(buf.len(), total)?;
        self.header.emit(buf)?;
        fill(&mut buf[hlen..total]);
        Ok(total)
    }
}

/// DDP segmentation (RFC 5041 §5.2, catalogue C.1.2): the payload length
/// of the segment that starts `off` octets into a message of `len` octets
/// when a segment carries at most `room` payload octets (MULPDU minus the
/// DDP and RDMAP headers), and whether it is the last one (L). A
/// zero-length message is one segment with L = 1 and no payload. The engine
/// (`engine/qp/tx.rs`) cuts every message with this and
/// [`Header::at_offset`]; `room` must be at least 1 unless `len` is 0.
#[inline]
pub const fn segment_len(len: usize, off: usize, room: usize) -> (usize, bool) {
    let left = len.saturating_sub(off);
    let n = if left < room { left } else { room };
    (n, off + n >= len)
}

impl Header {
    /// The header of the segment `off` octets into the message whose first
    /// octet `self` addresses (RFC 5041 §5.2): tagged TO = message TO + `off`,
    /// untagged MO = MO + `off` with the same QN and MSN; STag, RsvdULP and
    /// the RDMAP control octet carried unchanged; L = `last`. TO wraps modulo
    /// 2^64 like the wire field (the receiver rejects a wrapping message,
    /// RFC 5041 §7.1 tagged check 5).
    #[inline]
    pub const fn at_offset(&self, off: usize, last: bool) -> Header {
        let addr = match self.addr {
            Addr::Tagged { stag, to } => Addr::Tagged {
                stag,
                to: to.wrapping_add(off as u64),
            },
            Addr::Untagged { qn, msn, mo, inv_stag } => Addr::Untagged {
                qn,
                msn,
                mo: mo.wrapping_add(off as u32),
                inv_stag,
            },
        };
        Header {
            last,
            rdmap_ctrl: self.rdmap_ctrl,
            addr,
        }
    }
}

impl fmt::Display for Segment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} len={}", self.header, self.payload.len())
    }
}

#[cfg(test)]
#[path = "ddp_golden.rs"]
pub(crate) mod golden;

#[cfg(test)]
#[path = "ddp_tests.rs"]
mod tests;
