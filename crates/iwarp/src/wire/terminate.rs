//! The RDMAP Terminate header (RFC 5040 §4.8, Figs. 7-10), in the RFC bit
//! layout and in the layout Linux soft-iWARP puts on the wire.
//!
//! Read before editing: RFC 5040 §4.8 and §7.1, catalogue
//! `shared/requirements/rdmap-rpcrdma.md` A.1.4, A.1.6, A.1.7, A.4.6 and
//! A.5 #1-#3.
//!
//! Layout of the RDMAP part of a Terminate ULPDU (after the 18-octet
//! untagged DDP header; offsets from the start of the Terminate header):
//!
//! ```text
//!   0  u32  Terminate Control: Layer(4) EType(4) Error Code(8) M D R Reserved(13)
//!   4  u16  DDP Segment Length            (present when D = 1)
//!   6  ..   Terminated DDP header         (D = 1; 14 B if its T bit is set, else 18 B)
//!   .. 28 B Terminated RDMA header        (R = 1; a Read Request header image)
//! ```
//!
//! ULPDU sizes: 22 (no headers), 38 (tagged DDP header), 42 (untagged DDP
//! header), 70 (untagged DDP header and RDMA header); 66 (tagged DDP header
//! and RDMA header) and 50 (R without D) are consistent too and accepted.
//! In the FPDU the Terminated DDP header starts at a 2-mod-4 offset: every
//! field here is read octet by octet.
//!
//! # The Linux siw form
//!
//! siw declares the control word as C bitfields; on little-endian hosts
//! (every siw deployment in practice) the compiler puts `layer` in the LOW
//! nibble and `etype` in the HIGH nibble of octet 0, and M/D/R at 0x01, 0x02,
//! 0x04 of octet 2 (the 13 reserved bits become octet 2's mask 0xF8 and
//! octet 3). DDP/untagged/invalid-QN with M and D is `0x12 0x01 0xC0 0x00`
//! in the RFC form and `0x21 0x01 0x03 0x00` from siw. We send the RFC form
//! unless [`Repr::form`] says [`TermWireForm::LinuxSiw`], and decode both.
//! siw has two more quirks that the decoder tolerates: it sets R on errors
//! of Send with Invalidate but attaches no RDMA header (a 42-octet ULPDU
//! with R), and its DDP Segment Length is the payload length, not the
//! segment length (catalogue A.5 #1; we never depend on the value).
//!
//! # Form detection ([`Repr::parse_auto`])
//!
//! Both readings of the control word are tried and scored, best first:
//! 1. the length is consistent with D/R for that reading (mandatory): the
//!    octets after the announced parts are all zero (A.5 #2 allows
//!    zero-filled longer forms), and in the siw reading "R with no RDMA
//!    header" is allowed as the siw quirk above;
//! 2. the 13 reserved bits of that reading are zero;
//! 3. (layer, etype, code) is a defined value of RFC 5040 Fig. 9, RFC 5041
//!    §7.2 or RFC 5044 §8 / RFC 6581 §4;
//! 4. the layer nibble is 0, 1 or 2;
//! 5. no siw quirk was needed.
//!
//! Whenever M, D or R is set in one reading, the other reading sees reserved
//! bits (RFC 0x80/0x40/0x20 fall into siw's 0xF8 mask and siw 0x01/0x02/0x04
//! into the RFC's 0x1F mask), so every Terminate that carries headers is
//! recognised. The residue is ambiguous: octets 2 and 3 zero, no headers,
//! and octet 0 a nibble swap of which both readings are defined causes:
//! `0x01`/`0x10` with code 0x00 (RDMAP invalid STag vs DDP local
//! catastrophic) and `0x02`/`0x20` with code 0x05, 0x06 or 0x07 (RDMAP
//! remote operation vs MPA local catastrophic / insufficient IRD / no
//! matching RTR). For those the caller's preferred form wins and the result
//! says [`FormCertainty::Ambiguous`]. Octet 0 values with equal nibbles
//! (`0x00`, `0x11`, `0x22`) read the same in both forms
//! ([`FormCertainty::SameMeaning`]).

use core::fmt;

use super::cause::{Layer, TermCause, code, etype};
use super::ddp::{self, BufferTooSmall, be, need};
use super::rdmap_hdr::{self, READ_REQUEST_LEN, ReadRequest, op, qn};

mod field {
    pub type Field = core::ops::Range<usize>;

    /// Terminate Control (19 bits) + Reserved (13 bits).
    pub const CTRL: Field = 0..4;
    /// DDP Segment Length, present when D = 1.
    pub const SEG_LEN: Field = 4..6;
    /// First octet of the Terminated DDP header.
    pub const DDP_HDR: usize = SEG_LEN.end;
    pub const MIN_LEN: usize = CTRL.end;

    // RFC layout, octet 0: Layer << 4 | EType; octet 2: M D R Rsvd(5).
    pub const RFC_M: u8 = 0x80;
    pub const RFC_D: u8 = 0x40;
    pub const RFC_R: u8 = 0x20;
    pub const RFC_RSVD_HI: u8 = 0x1f;
    // Linux siw layout, octet 0: EType << 4 | Layer; octet 2: Rsvd(5) R D M.
    pub const SIW_M: u8 = 0x01;
    pub const SIW_D: u8 = 0x02;
    pub const SIW_R: u8 = 0x04;
    pub const SIW_RSVD_HI: u8 = 0xf8;
}

/// Shortest Terminate header: the control word.
pub const MIN_LEN: usize = field::MIN_LEN;
/// Longest Terminate header: 4 + 2 + 18 + 28.
pub const MAX_LEN: usize = field::DDP_HDR + ddp::UNTAGGED_HEADER_LEN + READ_REQUEST_LEN;
/// Terminate ULPDU size classes (catalogue A.1.4, RDMAP-HDR-10).
pub const ULPDU_LEN_PLAIN: usize = ddp::UNTAGGED_HEADER_LEN + MIN_LEN;
/// Terminate ULPDU with a tagged DDP header echoed.
pub const ULPDU_LEN_TAGGED: usize = ULPDU_LEN_PLAIN + 2 + ddp::TAGGED_HEADER_LEN;
/// Terminate ULPDU with an untagged DDP header echoed.
pub const ULPDU_LEN_UNTAGGED: usize = ULPDU_LEN_PLAIN + 2 + ddp::UNTAGGED_HEADER_LEN;
/// Terminate ULPDU with an untagged DDP header and a Read Request echoed.
pub const ULPDU_LEN_READ_REQUEST: usize = ULPDU_LEN_UNTAGGED + READ_REQUEST_LEN;

/// The bit layout of the Terminate control word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TermWireForm {
    /// RFC 5040 Fig. 8: Layer in the high nibble, M/D/R = 0x80/0x40/0x20.
    #[default]
    Rfc,
    /// Linux siw on little-endian hosts: Layer in the low nibble, M/D/R =
    /// 0x01/0x02/0x04.
    LinuxSiw,
}

/// The decoded Terminate Control word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Control {
    /// Layer nibble (0 RDMAP, 1 DDP, 2 LLP).
    pub layer: u8,
    /// Error Type (4 bits).
    pub etype: u8,
    /// Error Code (8 bits).
    pub code: u8,
    /// M: DDP Segment Length valid.
    pub m: bool,
    /// D: Terminated DDP header included.
    pub d: bool,
    /// R: Terminated RDMA header included.
    pub r: bool,
    /// The 13 reserved bits (0 on transmit, ignored on receive, RDMAP-HDR-11).
    pub reserved: u16,
}

impl Control {
    /// Decodes the control word as `form` lays it out.
    pub const fn decode(w: [u8; 4], form: TermWireForm) -> Control {
        match form {
            TermWireForm::Rfc => Control {
                layer: w[0] >> 4,
                etype: w[0] & 0xf,
                code: w[1],
                m: w[2] & field::RFC_M != 0,
                d: w[2] & field::RFC_D != 0,
                r: w[2] & field::RFC_R != 0,
                reserved: (((w[2] & field::RFC_RSVD_HI) as u16) << 8) | w[3] as u16,
            },
            TermWireForm::LinuxSiw => Control {
                layer: w[0] & 0xf,
                etype: w[0] >> 4,
                code: w[1],
                m: w[2] & field::SIW_M != 0,
                d: w[2] & field::SIW_D != 0,
                r: w[2] & field::SIW_R != 0,
                reserved: ((w[3] as u16) << 5) | (w[2] >> 3) as u16,
            },
        }
    }

    /// Encodes the control word in `form`'s layout.
    pub const fn encode(&self, form: TermWireForm) -> [u8; 4] {
        let (layer, etype, rsv) = (self.layer & 0xf, self.etype & 0xf, self.reserved & 0x1fff);
        match form {
            TermWireForm::Rfc => {
                let mut o2 = (rsv >> 8) as u8 & field::RFC_RSVD_HI;
                if self.m {
                    o2 |= field::RFC_M;
                }
                if self.d {
                    o2 |= field::RFC_D;
                }
                if self.r {
                    o2 |= field::RFC_R;
                }
                [(layer << 4) | etype, self.code, o2, rsv as u8]
            }
            TermWireForm::LinuxSiw => {
                let mut o2 = ((rsv << 3) as u8) & field::SIW_RSVD_HI;
                if self.m {
                    o2 |= field::SIW_M;
                }
                if self.d {
                    o2 |= field::SIW_D;
                }
                if self.r {
                    o2 |= field::SIW_R;
                }
                [(etype << 4) | layer, self.code, o2, (rsv >> 5) as u8]
            }
        }
    }

    /// The cause it names.
    pub const fn cause(&self) -> TermCause {
        TermCause::new(Layer::from_nibble(self.layer), self.etype, self.code)
    }
}

/// Whether (layer, etype, code) is a value defined by RFC 5040 Fig. 9, RFC
/// 5041 §7.2 or RFC 5044 §8 / RFC 6581 §4 (used by form detection).
pub const fn is_defined(c: &TermCause) -> bool {
    match (c.layer, c.etype) {
        // Fig. 9: "Any value in this field is acceptable".
        (Layer::Rdmap, etype::RDMAP_LOCAL_CATASTROPHIC) => true,
        (Layer::Rdmap, etype::RDMAP_REMOTE_PROTECTION) => {
            matches!(
                c.code,
                0x00..=0x04 | code::RDMAP_STAG_CANNOT_INVALIDATE | code::RDMAP_UNSPECIFIED
            )
        }
        (Layer::Rdmap, etype::RDMAP_REMOTE_OPERATION) => matches!(c.code, 0x05..=0x09 | code::RDMAP_UNSPECIFIED),
        (Layer::Ddp, etype::DDP_LOCAL_CATASTROPHIC) => c.code == 0,
        (Layer::Ddp, etype::DDP_TAGGED) => c.code <= code::DDP_T_INVALID_VERSION,
        (Layer::Ddp, etype::DDP_UNTAGGED) => matches!(c.code, 0x01..=0x06),
        (Layer::Llp, etype::MPA) => matches!(c.code, 0x01..=0x07),
        _ => false,
    }
}

/// A Terminate whose length does not match its bits (RDMAP-HDR-12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// Shorter than the control word or than the parts D/R announce.
    Truncated {
        /// Octets needed.
        need: usize,
        /// Octets there were.
        have: usize,
    },
    /// M ("DDP Segment Length valid") without D: the length field is only
    /// present with D (RFC 5040 §4.8), so there is nothing M could refer to.
    MWithoutD,
    /// Non-zero octets after the parts the bits announce.
    TrailingBytes {
        /// Octets after the announced parts.
        extra: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated { need, have } => write!(f, "Terminate header of {have} octets, bits announce {need}"),
            Error::MWithoutD => write!(f, "Terminate with M but without D"),
            Error::TrailingBytes { extra } => write!(f, "Terminate header has {extra} unannounced octets"),
        }
    }
}

/// Smoltcp-style view of a Terminate header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

/// Where the announced parts sit, for one reading of the control word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    ddp_hdr_len: Option<usize>,
    rdma_at: Option<usize>,
    r_without_header: bool,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// A view of `buffer`, not checked: accessors may panic before [`Packet::check_len`].
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Checks the control word is there; [`Packet::check_layout`] checks the rest.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }
    /// Checks the control word is there.
    pub fn check_len(&self) -> Result<(), Error> {
        let have = self.buffer.as_ref().len();
        if have < field::MIN_LEN {
            Err(Error::Truncated {
                need: field::MIN_LEN,
                have,
            })
        } else {
            Ok(())
        }
    }
    /// The buffer, given back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// The 4 octets of the control word, undecoded.
    pub fn control_octets(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[0], b[1], b[2], b[3]]
    }
    /// The control word, decoded in `form`'s layout.
    pub fn control(&self, form: TermWireForm) -> Control {
        Control::decode(self.control_octets(), form)
    }
    /// DDP Segment Length (only meaningful when D is set).
    pub fn seg_len(&self) -> Option<u16> {
        let b = self.buffer.as_ref();
        (b.len() >= field::SEG_LEN.end).then(|| be::u16_at(b, field::SEG_LEN.start))
    }
    /// Check the length against the D/R bits of `form` (RDMAP-HDR-12).
    pub fn check_layout(&self, form: TermWireForm) -> Result<(), Error> {
        self.layout(form).map(|_| ())
    }

    fn layout(&self, form: TermWireForm) -> Result<Layout, Error> {
        self.check_len()?;
        let b = self.buffer.as_ref();
        let have = b.len();
        let c = self.control(form);
        if c.m && !c.d {
            return Err(Error::MWithoutD);
        }
        let mut end = field::MIN_LEN;
        let mut layout = Layout {
            ddp_hdr_len: None,
            rdma_at: None,
            r_without_header: false,
        };
        if c.d {
            let hlen = match b.get(field::DDP_HDR) {
                Some(&ctrl) => ddp::header_len_for(ctrl),
                None => ddp::TAGGED_HEADER_LEN,
            };
            end = field::DDP_HDR + hlen;
            if have < end {
                return Err(Error::Truncated { need: end, have });
            }
            layout.ddp_hdr_len = Some(hlen);
        }
        if c.r {
            let rdma_end = end + READ_REQUEST_LEN;
            if have >= rdma_end {
                layout.rdma_at = Some(end);
                end = rdma_end;
            } else if form == TermWireForm::LinuxSiw && c.d && have == end {
                // siw sets R for Send-with-Invalidate errors without adding
                // an RDMA header (module doc).
                layout.r_without_header = true;
            } else {
                return Err(Error::Truncated { need: rdma_end, have });
            }
        }
        // Catalogue A.5 #2: zero-filled longer forms are accepted.
        let rest = &b[end..];
        if rest.iter().any(|&x| x != 0) {
            return Err(Error::TrailingBytes { extra: rest.len() });
        }
        Ok(layout)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the control word in `form`'s layout.
    pub fn set_control(&mut self, c: &Control, form: TermWireForm) {
        self.buffer.as_mut()[field::CTRL].copy_from_slice(&c.encode(form));
    }
    /// Sets the DDP Segment Length.
    pub fn set_seg_len(&mut self, v: u16) {
        be::put_u16(self.buffer.as_mut(), field::SEG_LEN.start, v)
    }
}

/// A copy of the offending DDP header (14 or 18 octets), kept verbatim: it
/// may be exactly the header that failed to parse (bad DV, bad QN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EchoedDdpHeader {
    raw: [u8; ddp::UNTAGGED_HEADER_LEN],
}

impl EchoedDdpHeader {
    /// Copy the header at the start of `bytes`; its T bit picks the length.
    pub fn from_bytes(bytes: &[u8]) -> Option<EchoedDdpHeader> {
        let hlen = ddp::header_len_for(*bytes.first()?);
        let src = bytes.get(..hlen)?;
        let mut raw = [0u8; ddp::UNTAGGED_HEADER_LEN];
        raw[..hlen].copy_from_slice(src);
        Some(EchoedDdpHeader { raw })
    }
    /// Whether the echoed header is tagged.
    pub const fn is_tagged(&self) -> bool {
        ddp::header_len_for(self.raw[0]) == ddp::TAGGED_HEADER_LEN
    }
    /// 14 or 18 octets.
    #[allow(clippy::len_without_is_empty)]
    pub const fn len(&self) -> usize {
        ddp::header_len_for(self.raw[0])
    }
    /// Its octets.
    pub fn as_bytes(&self) -> &[u8] {
        &self.raw[..self.len()]
    }
    /// Its fields, decoded without checking DV.
    pub fn header(&self) -> Option<ddp::Header> {
        ddp::Header::parse_lenient(self.as_bytes())
    }
}

/// DDP Segment Length and Terminated DDP header (the D part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermDdp {
    /// DDP Segment Length: we send the offending ULPDU length (A.5 #1);
    /// siw sends the payload length. Informational only.
    pub seg_len: u16,
    /// The offending segment's DDP header.
    pub header: EchoedDdpHeader,
}

/// How sure [`Repr::parse_auto`] is of the wire form (see module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FormCertainty {
    /// Only one reading scored best.
    Unique,
    /// Both readings give the same meaning; [`Repr::form`] is the preference.
    SameMeaning,
    /// Both readings are plausible and differ; the preference was used.
    Ambiguous,
}

/// A parsed Terminate and how its form was determined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Detected {
    /// The Terminate.
    pub repr: Repr,
    /// How its wire form was told.
    pub certainty: FormCertainty,
}

/// The offending segment a Terminate reports on (RFC 5040 §7.1 cases 2, 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offending<'a> {
    seg_len: u16,
    header: &'a [u8],
}

impl<'a> Offending<'a> {
    /// From the offending ULPDU (DDP header first); the DDP Segment Length
    /// becomes the ULPDU length (A.5 #1). `None` if the header is incomplete.
    pub fn from_ulpdu(ulpdu: &'a [u8]) -> Option<Self> {
        let hlen = ddp::header_len_for(*ulpdu.first()?);
        let header = ulpdu.get(..hlen)?;
        let seg_len = u16::try_from(ulpdu.len()).unwrap_or(u16::MAX);
        Some(Offending { seg_len, header })
    }
    /// From the offending FPDU's first octets: MPA ULPDU_Length, then the
    /// DDP header (so "DDP Segment Length + Terminated DDP header" is an image
    /// of the FPDU's first 16 or 20 octets, catalogue A.1.4).
    pub fn from_fpdu(fpdu: &'a [u8]) -> Option<Self> {
        let seg_len = be::u16_at(fpdu.get(..2)?, 0);
        let rest = fpdu.get(2..)?;
        let hlen = ddp::header_len_for(*rest.first()?);
        Some(Offending {
            seg_len,
            header: rest.get(..hlen)?,
        })
    }
}

/// The meaning of a Terminate header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The cause it reports.
    pub cause: TermCause,
    /// M: the DDP Segment Length is valid (emitted only together with D).
    pub seg_len_valid: bool,
    /// D: DDP Segment Length and Terminated DDP header.
    pub ddp: Option<TermDdp>,
    /// R: Terminated RDMA header (a Read Request image, RDMAP-HDR-13).
    pub rdma: Option<ReadRequest>,
    /// The form parsed, or the form to emit.
    pub form: TermWireForm,
    /// Reserved bits as received; always emitted as zero (RDMAP-HDR-11).
    pub reserved: u16,
    /// Received with R but without an RDMA header (siw quirk); not emitted.
    pub r_without_header: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    reserved_zero: bool,
    defined: bool,
    layer_known: bool,
    clean: bool,
}

impl Repr {
    /// A Terminate for `cause`, with M/D/R set as RFC 5040 Fig. 10 and
    /// catalogue A.1.7 / A.5 #1-#3 say:
    /// * D and M when the cause carries the DDP header (RDMAP Remote
    ///   Protection / Remote Operation, every DDP type but Local
    ///   Catastrophic) and `offending` is given; the caller passes `None`
    ///   when the header layout is unknown (bad DV, RV or opcode, A.4.2).
    /// * R only for RDMAP-layer Remote Protection / Remote Operation errors
    ///   of a Read Request (`rreq`), and only with D: DDP-layer errors never
    ///   carry it (Fig. 10), Send with Invalidate errors do not (A.5 #3).
    /// * Local Catastrophic and LLP causes: the 22-octet form (A.5 #2).
    pub fn for_error(cause: TermCause, offending: Option<Offending<'_>>, rreq: Option<&ReadRequest>) -> Repr {
        let ddp = if cause.carries_ddp_header() {
            offending.and_then(|o| {
                Some(TermDdp {
                    seg_len: o.seg_len,
                    header: EchoedDdpHeader::from_bytes(o.header)?,
                })
            })
        } else {
            None
        };
        let rdmap_remote = matches!(cause.layer, Layer::Rdmap)
            && (cause.etype == etype::RDMAP_REMOTE_PROTECTION || cause.etype == etype::RDMAP_REMOTE_OPERATION);
        let rdma = if rdmap_remote && ddp.is_some() {
            rreq.copied()
        } else {
            None
        };
        Repr {
            cause,
            seg_len_valid: ddp.is_some(),
            ddp,
            rdma,
            form: TermWireForm::Rfc,
            reserved: 0,
            r_without_header: false,
        }
    }

    /// Parse a Terminate header known to be in `form`. Reserved bits are
    /// ignored (kept in [`Repr::reserved`]); the length must match D/R.
    pub fn parse(bytes: &[u8], form: TermWireForm) -> Result<Repr, Error> {
        let p = Packet::new_checked(bytes)?;
        let layout = p.layout(form)?;
        let c = p.control(form);
        let ddp = match layout.ddp_hdr_len {
            Some(hlen) => {
                let header = bytes
                    .get(field::DDP_HDR..field::DDP_HDR + hlen)
                    .and_then(EchoedDdpHeader::from_bytes);
                match (p.seg_len(), header) {
                    (Some(seg_len), Some(header)) => Some(TermDdp { seg_len, header }),
                    _ => {
                        return Err(Error::Truncated {
                            need: field::DDP_HDR + hlen,
                            have: bytes.len(),
                        });
                    }
                }
            }
            None => None,
        };
        let rdma = match layout.rdma_at {
            Some(at) => Some(ReadRequest::parse(&bytes[at..]).map_err(|t| Error::Truncated {
                need: at + t.need,
                have: bytes.len(),
            })?),
            None => None,
        };
        Ok(Repr {
            cause: c.cause(),
            seg_len_valid: c.m,
            ddp,
            rdma,
            form,
            reserved: c.reserved,
            r_without_header: layout.r_without_header,
        })
    }

    /// Parse a Terminate whose form is unknown (module doc, "Form detection").
    /// `prefer` breaks ties; on failure the error is that of `prefer`.
    pub fn parse_auto(bytes: &[u8], prefer: TermWireForm) -> Result<Detected, Error> {
        let other = match prefer {
            TermWireForm::Rfc => TermWireForm::LinuxSiw,
            TermWireForm::LinuxSiw => TermWireForm::Rfc,
        };
        let score = |r: &Repr| Score {
            reserved_zero: r.reserved == 0,
            defined: is_defined(&r.cause),
            layer_known: !matches!(r.cause.layer, Layer::Unknown(_)),
            clean: !r.r_without_header,
        };
        match (Self::parse(bytes, prefer), Self::parse(bytes, other)) {
            (Ok(a), Ok(b)) => {
                let (sa, sb) = (score(&a), score(&b));
                let certainty = if sa != sb {
                    FormCertainty::Unique
                } else if (Repr { form: a.form, ..b }) == a {
                    FormCertainty::SameMeaning
                } else {
                    FormCertainty::Ambiguous
                };
                let repr = if sb > sa { b } else { a };
                Ok(Detected { repr, certainty })
            }
            (Ok(repr), Err(_)) | (Err(_), Ok(repr)) => Ok(Detected {
                repr,
                certainty: FormCertainty::Unique,
            }),
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// Length of the Terminate header as emitted: 4, 20, 24, 52 (or 48).
    pub fn buffer_len(&self) -> usize {
        field::MIN_LEN + self.ddp.map_or(0, |d| 2 + d.header.len()) + self.rdma.map_or(0, |_| READ_REQUEST_LEN)
    }

    /// Length of the whole Terminate ULPDU: 22, 38, 42 or 70 (or 66).
    pub fn ulpdu_len(&self) -> usize {
        ddp::UNTAGGED_HEADER_LEN + self.buffer_len()
    }

    /// The control word this repr emits: M/D/R always match the parts that
    /// follow (RDMAP-HDR-12), reserved bits are zero.
    pub fn control(&self) -> Control {
        Control {
            layer: self.cause.layer.to_nibble(),
            etype: self.cause.etype,
            code: self.cause.code,
            m: self.seg_len_valid && self.ddp.is_some(),
            d: self.ddp.is_some(),
            r: self.rdma.is_some(),
            reserved: 0,
        }
    }

    /// Write the Terminate header in [`Repr::form`]; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let len = self.buffer_len();
        need(buf.len(), len)?;
        let mut p = Packet::new_unchecked(&mut buf[..len]);
        p.set_control(&self.control(), self.form);
        let mut at = field::MIN_LEN;
        if let Some(d) = self.ddp {
            p.set_seg_len(d.seg_len);
            let h = d.header.as_bytes();
            buf[field::DDP_HDR..field::DDP_HDR + h.len()].copy_from_slice(h);
            at = field::DDP_HDR + h.len();
        }
        if let Some(r) = self.rdma {
            r.emit(&mut buf[at..len])?;
        }
        Ok(len)
    }

    /// Write the whole Terminate ULPDU: untagged DDP header (QN 2, `msn`,
    /// MO 0, L = 1, control word 0x4147) and the Terminate header.
    pub fn emit_ulpdu(&self, buf: &mut [u8], msn: u32) -> Result<usize, BufferTooSmall> {
        need(buf.len(), self.ulpdu_len())?;
        let h = ddp::Header {
            last: true,
            rdmap_ctrl: rdmap_hdr::control(op::TERMINATE),
            addr: ddp::Addr::Untagged {
                qn: qn::TERMINATE,
                msn,
                mo: 0,
                inv_stag: 0,
            },
        };
        let n = h.emit(buf)?;
        Ok(n + self.emit(&mut buf[n..])?)
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.control();
        write!(
            f,
            "Terminate {} [{}{}{}{}]",
            self.cause,
            if c.m { "M" } else { "-" },
            if c.d { "D" } else { "-" },
            if c.r || self.r_without_header { "R" } else { "-" },
            match self.form {
                TermWireForm::Rfc => "",
                TermWireForm::LinuxSiw => " siw-form",
            }
        )?;
        if let Some(d) = self.ddp {
            write!(f, " seglen={}", d.seg_len)?;
            match d.header.header() {
                Some(h) => write!(f, " ddp=[{h}]")?,
                None => write!(f, " ddp=?")?,
            }
        }
        if let Some(r) = self.rdma {
            write!(f, " rdma=[{r}]")?;
        }
        if self.reserved != 0 {
            write!(f, " rsvd={:#06x}", self.reserved)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "terminate_tests.rs"]
mod tests;
