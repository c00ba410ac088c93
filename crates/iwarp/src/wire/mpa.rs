//! MPA Request / Reply frames (RFC 5044 §7.1.1, Fig. 8) and the RFC 6581
//! enhanced connection establishment data (RFC 6581 §6 and §9).
//!
//! Read RFC 5044 §7.1 and RFC 6581 §6, §9 and §10 before editing. The
//! negotiation that uses these frames lives in `crate::proto::mpa`; this
//! module only parses and emits bytes.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +---------------------------------------------------------------+
//! |   Key: "MPA ID Req Frame" or "MPA ID Rep Frame" (16 octets)   |
//! +-+-+-+-+-------+---------------+-------------------------------+
//! |M|C|R|S|  Res  |      Rev      |          PD_Length            |
//! +-+-+-+-+-------+---------------+-------------------------------+
//! |A|B|           IRD             |C|D|          ORD              |  (RFC 6581, iff S and Rev >= 2)
//! +-+-+-----------------------------+-+---------------------------+
//! ~                 ULP Private Data (PD_Length - 4)              ~
//! +---------------------------------------------------------------+
//! ```
//!
//! Facts from Linux siw worth knowing here (`peers-and-interop-facts.md` §1.2,
//! §1.3): siw sends Rev 2 with S set (flags byte `0x10`) and PD = 4 IRD/ORD
//! octets + ULP data; siw calls S `MPA_RR_FLAG_ENHANCED` and uses reserved
//! bit `0x08` privately (never by default); a siw receiver refuses PD_Length
//! above 256 (including the IRD/ORD octets), RFC 5044 allows 512. The
//! reserved bits are kept in [`Repr::reserved`] so that nothing a peer sends is
//! lost; we send them as zero.

use core::fmt;

use crate::wire::cause::{MPA_ERR_INVALID_REQ_REP, TermCause};

mod field {
    #![allow(non_snake_case)]
    use core::ops::{Range, RangeFrom};

    /// RFC 5044 Fig. 8: the 16-octet key.
    pub const KEY: Range<usize> = 0..16;
    /// M, C, R, S (RFC 6581) and 4 reserved bits.
    pub const FLAGS: usize = 16;
    /// Revision.
    pub const REV: usize = 17;
    /// Private data length, big-endian.
    pub const PD_LENGTH: Range<usize> = 18..20;
    /// Private data, `PD_Length` octets.
    pub const fn PRIVATE_DATA(pd_len: usize) -> Range<usize> {
        PD_LENGTH.end..PD_LENGTH.end + pd_len
    }
    pub const REST: RangeFrom<usize> = PD_LENGTH.end..;

    pub const FLG_M: u8 = 0x80;
    pub const FLG_C: u8 = 0x40;
    pub const FLG_R: u8 = 0x20;
    /// RFC 6581 §6 "S"; Linux `MPA_RR_FLAG_ENHANCED`.
    pub const FLG_S: u8 = 0x10;
    pub const FLG_RES: u8 = 0x0F;

    /// RFC 6581 §9, offsets inside the private data.
    pub const IRD: Range<usize> = 0..2;
    pub const ORD: Range<usize> = 2..4;
    /// First word: A (peer-to-peer) and B (zero-length Send RTR).
    pub const IRD_P2P: u16 = 0x8000;
    pub const IRD_SEND_RTR: u16 = 0x4000;
    /// Second word: C (zero-length Write RTR) and D (zero-length Read RTR).
    pub const ORD_WRITE_RTR: u16 = 0x8000;
    pub const ORD_READ_RTR: u16 = 0x4000;
    pub const VALUE_MASK: u16 = 0x3FFF;
}

/// Length of the fixed part (key, flags, revision, PD_Length).
pub const HEADER_LEN: usize = field::PD_LENGTH.end;
/// The Request key, RFC 5044 §7.1.1.
pub const KEY_REQUEST: [u8; 16] = *b"MPA ID Req Frame";
/// The Reply key, RFC 5044 §7.1.1.
pub const KEY_REPLY: [u8; 16] = *b"MPA ID Rep Frame";
/// RFC 5044 §7.1.1: "the length of the Private Data field exceeds 512
/// octets" makes the frame improperly formatted.
pub const MAX_PRIVATE_DATA: usize = 512;
/// Linux siw's receive limit (`MPA_MAX_PRIVDATA`), IRD/ORD octets included.
pub const SIW_MAX_PRIVATE_DATA: usize = 256;
/// Size of the RFC 6581 §9 IRD/ORD block at the start of the private data.
pub const ENHANCED_DATA_LEN: usize = 4;
/// Largest IRD or ORD value (14 bits), RFC 6581 §9.
pub const IRD_ORD_MAX: u16 = field::VALUE_MASK;
/// RFC 6581 §9.1: "An all ones value (0x3FFF) indicates that automatic
/// negotiation of the IRD or ORD is not desired".
pub const IRD_ORD_NO_NEGOTIATION: u16 = field::VALUE_MASK;
/// Largest frame this module will ever parse or emit.
pub const MAX_FRAME_LEN: usize = HEADER_LEN + MAX_PRIVATE_DATA;

/// A parse or emit failure. Every variant makes the frame "improperly
/// formatted" in the sense of RFC 5044 §7.1.2 rules 2, 3, 5 and 9: the
/// receiver closes the TCP connection ([`Error::cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Fewer octets than the header, or than `HEADER_LEN + PD_Length`.
    #[error("MPA frame truncated: need {need} octets, have {have}")]
    Truncated {
        /// Octets needed.
        need: usize,
        /// Octets there were.
        have: usize,
    },
    /// The 16 octets are neither "MPA ID Req Frame" nor "MPA ID Rep Frame".
    #[error("MPA frame has an unknown key")]
    BadKey,
    /// PD_Length above RFC 5044's 512 or the configured receive limit.
    #[error("MPA private data too long: {len} octets, limit {max}")]
    PrivateDataTooLong {
        /// PD_Length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// S set with Rev >= 2 but fewer than 4 octets of private data.
    #[error("MPA frame has S set but only {pd_len} octets of private data")]
    EnhancedDataTruncated {
        /// PD_Length.
        pd_len: usize,
    },
    /// More octets than the frame occupies (where the caller says the
    /// buffer must hold exactly one frame).
    #[error("{extra} octets after the MPA frame")]
    ExtraBytes {
        /// Octets after the frame.
        extra: usize,
    },
    /// The emit buffer is smaller than [`Repr::buffer_len`].
    #[error("buffer too small for the MPA frame: need {need}, have {have}")]
    BufferTooSmall {
        /// Octets needed.
        need: usize,
        /// Octets there were.
        have: usize,
    },
}

impl Error {
    /// The Terminate cause this error corresponds to (RFC 5044 §8 code 4).
    /// RFC 5044 §8 says the connection is closed rather than terminated,
    /// since no FPDU framing exists yet.
    pub const fn cause(&self) -> TermCause {
        MPA_ERR_INVALID_REQ_REP
    }
}

/// Which of the two startup frames a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// "MPA ID Req Frame", sent by the Initiator.
    Request,
    /// "MPA ID Rep Frame", sent by the Responder.
    Reply,
}

impl FrameKind {
    /// The 16-octet key of this frame kind.
    pub const fn key(self) -> &'static [u8; 16] {
        match self {
            FrameKind::Request => &KEY_REQUEST,
            FrameKind::Reply => &KEY_REPLY,
        }
    }

    /// Classifies a 16-octet key.
    pub fn from_key(key: &[u8]) -> Option<FrameKind> {
        if key == KEY_REQUEST {
            Some(FrameKind::Request)
        } else if key == KEY_REPLY {
            Some(FrameKind::Reply)
        } else {
            None
        }
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::Request => "Request",
            FrameKind::Reply => "Reply",
        })
    }
}

/// The MPA revision octet (RFC 5044 §7.1.1 "Rev", RFC 6581 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Revision {
    /// 0: pre-IETF MPA; Linux siw still accepts it.
    V0,
    /// 1: RFC 5044.
    V1,
    /// 2: RFC 6581 enhanced connection establishment.
    V2,
    /// Anything else, kept raw.
    Unknown(u8),
}

impl From<u8> for Revision {
    fn from(v: u8) -> Self {
        match v {
            0 => Revision::V0,
            1 => Revision::V1,
            2 => Revision::V2,
            n => Revision::Unknown(n),
        }
    }
}

impl From<Revision> for u8 {
    fn from(r: Revision) -> u8 {
        match r {
            Revision::V0 => 0,
            Revision::V1 => 1,
            Revision::V2 => 2,
            Revision::Unknown(n) => n,
        }
    }
}

impl Revision {
    /// RFC 6581 §6: the S flag means something only with Rev two or higher.
    pub fn allows_enhanced(self) -> bool {
        u8::from(self) >= 2
    }
}

/// One RTR (ready-to-receive) indication type, RFC 6581 §9.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rtr {
    /// Control flag B: a zero-length Send (untagged, QN 0).
    Send,
    /// Control flag C: a zero-length RDMA Write (tagged).
    Write,
    /// Control flag D: a zero-length RDMA Read Request (untagged, QN 1).
    Read,
}

impl fmt::Display for Rtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rtr::Send => "send",
            Rtr::Write => "write",
            Rtr::Read => "read",
        })
    }
}

/// A set of RTR types (control flags B, C and D of RFC 6581 §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrSet(u8);

impl RtrSet {
    /// No RTR type.
    pub const EMPTY: RtrSet = RtrSet(0);
    /// Zero-length Send (flag B).
    pub const SEND: RtrSet = RtrSet(1);
    /// Zero-length RDMA Write (flag C).
    pub const WRITE: RtrSet = RtrSet(2);
    /// Zero-length RDMA Read (flag D).
    pub const READ: RtrSet = RtrSet(4);
    /// All three.
    pub const ALL: RtrSet = RtrSet(7);

    /// The set holding one type.
    pub const fn of(rtr: Rtr) -> RtrSet {
        match rtr {
            Rtr::Send => RtrSet::SEND,
            Rtr::Write => RtrSet::WRITE,
            Rtr::Read => RtrSet::READ,
        }
    }
    /// Whether `rtr` is in the set.
    pub const fn contains(self, rtr: Rtr) -> bool {
        self.0 & RtrSet::of(rtr).0 != 0
    }
    /// Set union.
    pub const fn union(self, other: RtrSet) -> RtrSet {
        RtrSet(self.0 | other.0)
    }
    /// Set intersection.
    pub const fn intersection(self, other: RtrSet) -> RtrSet {
        RtrSet(self.0 & other.0)
    }
    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The first member in Linux siw's preference order: Write, then Read,
    /// then Send (`siw_cm.c` responder choice, `peers-and-interop-facts.md`
    /// §1.2).
    pub fn preferred(self) -> Option<Rtr> {
        [Rtr::Write, Rtr::Read, Rtr::Send]
            .into_iter()
            .find(|r| self.contains(*r))
    }
}

impl fmt::Display for RtrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for r in [Rtr::Send, Rtr::Write, Rtr::Read] {
            if self.contains(r) {
                if !first {
                    f.write_str("|")?;
                }
                write!(f, "{r}")?;
                first = false;
            }
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// The RFC 6581 §9 enhanced connection establishment data: the first four
/// octets of the private data when S is set and Rev >= 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EnhancedData {
    /// Inbound RDMA Read queue depth, 14 bits (0x3FFF = do not negotiate).
    pub ird: u16,
    /// Outbound RDMA Read queue depth, 14 bits (0x3FFF = do not negotiate).
    pub ord: u16,
    /// Control flag A: peer-to-peer connection model.
    pub p2p: bool,
    /// Control flags B, C and D: RTR types requested (Request) or
    /// supported (Reply). RFC 6581 §9.2: ignored when `p2p` is false.
    pub rtr: RtrSet,
}

impl EnhancedData {
    /// Parses the first four octets of `pd` (RFC 6581 §9, network order).
    pub fn parse(pd: &[u8]) -> Result<EnhancedData, Error> {
        let (Some(a), Some(b)) = (pd.get(field::IRD), pd.get(field::ORD)) else {
            return Err(Error::EnhancedDataTruncated { pd_len: pd.len() });
        };
        let w1 = u16::from_be_bytes([a[0], a[1]]);
        let w2 = u16::from_be_bytes([b[0], b[1]]);
        let mut rtr = RtrSet::EMPTY;
        if w1 & field::IRD_SEND_RTR != 0 {
            rtr = rtr.union(RtrSet::SEND);
        }
        if w2 & field::ORD_WRITE_RTR != 0 {
            rtr = rtr.union(RtrSet::WRITE);
        }
        if w2 & field::ORD_READ_RTR != 0 {
            rtr = rtr.union(RtrSet::READ);
        }
        Ok(EnhancedData {
            ird: w1 & field::VALUE_MASK,
            ord: w2 & field::VALUE_MASK,
            p2p: w1 & field::IRD_P2P != 0,
            rtr,
        })
    }

    /// The four wire octets. IRD and ORD are masked to 14 bits.
    pub fn to_bytes(&self) -> [u8; ENHANCED_DATA_LEN] {
        let mut w1 = self.ird & field::VALUE_MASK;
        let mut w2 = self.ord & field::VALUE_MASK;
        if self.p2p {
            w1 |= field::IRD_P2P;
        }
        if self.rtr.contains(Rtr::Send) {
            w1 |= field::IRD_SEND_RTR;
        }
        if self.rtr.contains(Rtr::Write) {
            w2 |= field::ORD_WRITE_RTR;
        }
        if self.rtr.contains(Rtr::Read) {
            w2 |= field::ORD_READ_RTR;
        }
        let a = w1.to_be_bytes();
        let b = w2.to_be_bytes();
        [a[0], a[1], b[0], b[1]]
    }
}

impl fmt::Display for EnhancedData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ird {} ord {}", self.ird, self.ord)?;
        if self.p2p {
            write!(f, " peer2peer rtr {}", self.rtr)?;
        }
        Ok(())
    }
}

/// A zero-copy view of an MPA Request or Reply frame over any buffer.
///
/// Once [`Frame::check_len`] returned `Ok`, no accessor panics.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer and checks that it holds the header and PD_Length
    /// octets of private data (it may hold more; see [`Frame::frame_len`]).
    pub fn new_checked(buffer: T) -> Result<Frame<T>, Error> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks that the header and the whole private data are present.
    pub fn check_len(&self) -> Result<(), Error> {
        let have = self.buffer.as_ref().len();
        if have < HEADER_LEN {
            return Err(Error::Truncated { need: HEADER_LEN, have });
        }
        let need = self.frame_len();
        if have < need {
            return Err(Error::Truncated { need, have });
        }
        Ok(())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 16-octet key.
    pub fn key(&self) -> &[u8] {
        &self.buffer.as_ref()[field::KEY]
    }
    /// The frame kind named by the key, if it is one of the two.
    pub fn kind(&self) -> Option<FrameKind> {
        FrameKind::from_key(self.key())
    }
    /// The raw flags octet.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// M: the sender requires markers in what it receives.
    pub fn markers(&self) -> bool {
        self.flags() & field::FLG_M != 0
    }
    /// C: the sender asks for CRCs.
    pub fn crc(&self) -> bool {
        self.flags() & field::FLG_C != 0
    }
    /// R: rejected (Reply only; not checked in a Request).
    pub fn reject(&self) -> bool {
        self.flags() & field::FLG_R != 0
    }
    /// S: enhanced connection establishment data follows (RFC 6581).
    pub fn enhanced(&self) -> bool {
        self.flags() & field::FLG_S != 0
    }
    /// The four reserved bits.
    pub fn reserved(&self) -> u8 {
        self.flags() & field::FLG_RES
    }
    /// The revision.
    pub fn revision(&self) -> Revision {
        Revision::from(self.buffer.as_ref()[field::REV])
    }
    /// PD_Length.
    pub fn pd_length(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PD_LENGTH];
        u16::from_be_bytes([b[0], b[1]])
    }
    /// Header plus PD_Length: how many octets the frame occupies.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + usize::from(self.pd_length())
    }
    /// The private data (IRD/ORD block included).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA(usize::from(self.pd_length()))]
    }
    /// Octets in the buffer after the frame.
    pub fn trailing(&self) -> &[u8] {
        &self.buffer.as_ref()[field::REST][usize::from(self.pd_length())..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Writes the key.
    pub fn set_key(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[field::KEY].copy_from_slice(kind.key());
    }
    /// Writes the flags octet.
    pub fn set_flags(&mut self, flags: u8) {
        self.buffer.as_mut()[field::FLAGS] = flags;
    }
    /// Writes the revision.
    pub fn set_revision(&mut self, rev: Revision) {
        self.buffer.as_mut()[field::REV] = rev.into();
    }
    /// Writes PD_Length.
    pub fn set_pd_length(&mut self, len: u16) {
        self.buffer.as_mut()[field::PD_LENGTH].copy_from_slice(&len.to_be_bytes());
    }
    /// The private data, mutable (PD_Length must already be set).
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.pd_length());
        &mut self.buffer.as_mut()[field::PRIVATE_DATA(len)]
    }
}

/// How many octets the frame whose first [`HEADER_LEN`] octets are in
/// `header` occupies, or `None` if fewer octets are available.
pub fn frame_len(header: &[u8]) -> Option<usize> {
    let b = header.get(field::PD_LENGTH)?;
    Some(HEADER_LEN + usize::from(u16::from_be_bytes([b[0], b[1]])))
}

/// The meaning of an MPA Request or Reply frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M: the sender requires markers in the FPDUs it receives.
    pub markers: bool,
    /// C: the sender prefers CRCs.
    pub crc: bool,
    /// R: the Reply rejects the connection (must be false in a Request).
    pub reject: bool,
    /// The S bit as on the wire. With Rev < 2 it is a reserved bit and
    /// `enhanced` is `None`.
    pub s_flag: bool,
    /// The four reserved bits (RFC 5044 "Res"); zero when we send.
    pub reserved: u8,
    /// The revision.
    pub revision: Revision,
    /// The RFC 6581 IRD/ORD block, present iff `s_flag` and Rev >= 2.
    pub enhanced: Option<EnhancedData>,
    /// The ULP private data (after the IRD/ORD block, if any).
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parses a frame view. `max_pd_len` is the receive limit on PD_Length
    /// (IRD/ORD octets included); it is capped at RFC 5044's 512
    /// (§7.1.1 "PD_Length", §7.1.2 rule 9). Octets after the frame are
    /// ignored; use [`Repr::parse_exact`] to refuse them.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&'a T>, max_pd_len: usize) -> Result<Repr<'a>, Error> {
        let buf: &'a [u8] = T::as_ref(frame.buffer);
        let have = buf.len();
        if have < HEADER_LEN {
            return Err(Error::Truncated { need: HEADER_LEN, have });
        }
        let view = Frame::new_unchecked(buf);
        // RFC 5044 §7.1.1 "Key": both startup frames' receivers MUST check it.
        let kind = view.kind().ok_or(Error::BadKey)?;
        // RFC 5044 §7.1.2 rule 9: validate PD_Length before using it.
        let pd_len = usize::from(view.pd_length());
        let max = max_pd_len.min(MAX_PRIVATE_DATA);
        if pd_len > max {
            return Err(Error::PrivateDataTooLong { len: pd_len, max });
        }
        view.check_len()?;
        let pd: &'a [u8] = &buf[field::PRIVATE_DATA(pd_len)];
        let revision = view.revision();
        let s_flag = view.enhanced();
        let (enhanced, private_data) = if s_flag && revision.allows_enhanced() {
            // RFC 6581 §6: "if the 'S' flag is set, Private Data MUST begin
            // with enhanced RDMA connection establishment data".
            let e = EnhancedData::parse(pd)?;
            (Some(e), &pd[ENHANCED_DATA_LEN..])
        } else {
            (None, pd)
        };
        Ok(Repr {
            kind,
            markers: view.markers(),
            crc: view.crc(),
            reject: view.reject(),
            s_flag,
            reserved: view.reserved(),
            revision,
            enhanced,
            private_data,
        })
    }

    /// Parses a buffer that must hold exactly one frame: octets beyond
    /// `HEADER_LEN + PD_Length` are [`Error::ExtraBytes`] (Linux siw treats
    /// extra octets after a Request or Reply as a protocol error).
    pub fn parse_exact(bytes: &'a [u8], max_pd_len: usize) -> Result<Repr<'a>, Error> {
        let repr = Repr::parse(&Frame::new_unchecked(bytes), max_pd_len)?;
        let extra = bytes.len() - repr.buffer_len();
        if extra != 0 {
            return Err(Error::ExtraBytes { extra });
        }
        Ok(repr)
    }

    /// A frame as Linux siw sends it by default: Rev 2, S set, no M/C/R,
    /// and the IRD/ORD block in front of `private_data`.
    pub fn enhanced(kind: FrameKind, data: EnhancedData, private_data: &'a [u8]) -> Repr<'a> {
        Repr {
            kind,
            markers: false,
            crc: false,
            reject: false,
            s_flag: true,
            reserved: 0,
            revision: Revision::V2,
            enhanced: Some(data),
            private_data,
        }
    }

    /// A plain frame of the given revision (no S, no IRD/ORD block).
    pub fn basic(kind: FrameKind, revision: Revision, private_data: &'a [u8]) -> Repr<'a> {
        Repr {
            kind,
            markers: false,
            crc: false,
            reject: false,
            s_flag: false,
            reserved: 0,
            revision,
            enhanced: None,
            private_data,
        }
    }

    /// PD_Length: IRD/ORD block plus ULP private data.
    pub fn pd_len(&self) -> usize {
        let e = if self.enhanced.is_some() { ENHANCED_DATA_LEN } else { 0 };
        e + self.private_data.len()
    }

    /// Octets the frame occupies on the wire.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.pd_len()
    }

    /// The flags octet this Repr emits. S is written if `s_flag` is set or
    /// an IRD/ORD block is present.
    pub fn flags(&self) -> u8 {
        let mut f = self.reserved & field::FLG_RES;
        if self.markers {
            f |= field::FLG_M;
        }
        if self.crc {
            f |= field::FLG_C;
        }
        if self.reject {
            f |= field::FLG_R;
        }
        if self.s_flag || self.enhanced.is_some() {
            f |= field::FLG_S;
        }
        f
    }

    /// Writes the frame into the first [`Repr::buffer_len`] octets of
    /// `frame`. Fails, writing nothing, if the private data exceeds 512
    /// octets or the buffer is too small.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) -> Result<(), Error> {
        let pd_len = self.pd_len();
        if pd_len > MAX_PRIVATE_DATA {
            return Err(Error::PrivateDataTooLong {
                len: pd_len,
                max: MAX_PRIVATE_DATA,
            });
        }
        let need = self.buffer_len();
        let have = frame.buffer.as_ref().len();
        if have < need {
            return Err(Error::BufferTooSmall { need, have });
        }
        frame.set_key(self.kind);
        frame.set_flags(self.flags());
        frame.set_revision(self.revision);
        // pd_len <= 512 was checked above.
        frame.set_pd_length(pd_len as u16);
        let pd = frame.private_data_mut();
        let ulp = match &self.enhanced {
            Some(e) => {
                pd[..ENHANCED_DATA_LEN].copy_from_slice(&e.to_bytes());
                &mut pd[ENHANCED_DATA_LEN..]
            }
            None => pd,
        };
        ulp.copy_from_slice(self.private_data);
        Ok(())
    }

    /// Appends the frame to `out`.
    pub fn emit_vec(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = out.len();
        out.resize(start + self.buffer_len(), 0);
        let r = self.emit(&mut Frame::new_unchecked(&mut out[start..]));
        if r.is_err() {
            out.truncate(start);
        }
        r
    }
}

impl fmt::Display for Repr<'_> {
    /// One line in the spirit of tcpdump's MPA printer, e.g.
    /// `MPA Request rev 2 [S] pdlen 4 ird 1 ord 1 ulp-pd 0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MPA {} rev {} [", self.kind, u8::from(self.revision))?;
        let mut flags = String::new();
        for (on, name) in [
            (self.markers, 'M'),
            (self.crc, 'C'),
            (self.reject, 'R'),
            (self.s_flag, 'S'),
        ] {
            if on {
                flags.push(name);
            }
        }
        if flags.is_empty() {
            flags.push('.');
        }
        write!(f, "{flags}]")?;
        if self.reserved != 0 {
            write!(f, " res {:#x}", self.reserved)?;
        }
        write!(f, " pdlen {}", self.pd_len())?;
        if let Some(e) = &self.enhanced {
            write!(f, " {e}")?;
        }
        write!(f, " ulp-pd {}", self.private_data.len())?;
        if !self.private_data.is_empty() {
            f.write_str(" ")?;
            for b in self.private_data.iter().take(32) {
                write!(f, "{b:02x}")?;
            }
            if self.private_data.len() > 32 {
                f.write_str("..")?;
            }
        }
        Ok(())
    }
}

/// Pretty-prints whatever `bytes` hold as an MPA frame (for the fuzz target
/// and `softrdma decode`): the frame, or the reason it does not parse.
pub fn pretty(bytes: &[u8]) -> String {
    match Repr::parse(&Frame::new_unchecked(bytes), MAX_PRIVATE_DATA) {
        Ok(r) => {
            let extra = bytes.len().saturating_sub(r.buffer_len());
            if extra > 0 {
                format!("{r} (+{extra} octets after the frame)")
            } else {
                r.to_string()
            }
        }
        Err(e) => format!("MPA frame error: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Linux siw (6.x) as initiator, from `lab/results/vm-lo-siw-rping.pcap`
    /// frame 4 (rping over siw on lo): Rev 2, flags 0x10 (S), PD 4 =
    /// IRD 1 / ORD 1.
    static SIW_REQUEST: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, 0x10, 0x02,
        0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
    ];
    /// Frame 6 of the same capture: siw's Reply.
    static SIW_REPLY: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, 0x10, 0x02,
        0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
    ];
    /// `lab/results/host-br0-mpa.pcap`: a probe asked for markers (flags
    /// 0x90); siw rejected with flags 0x30 (R|S) and IRD/ORD 0/0.
    static SIW_MARKER_REJECT: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, 0x30, 0x02,
        0x00, 0x04, 0x00, 0x00, 0x00, 0x00,
    ];
    /// Same capture: a Rev 1 Request with PD "hello"...
    static REV1_REQUEST_HELLO: [u8; 25] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, 0x00, 0x01,
        0x00, 0x05, b'h', b'e', b'l', b'l', b'o',
    ];
    /// ... and siw's Rev 1 Reply with no private data.
    static SIW_REV1_REPLY: [u8; 20] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, 0x00, 0x01,
        0x00, 0x00,
    ];
    /// Same capture: the CRC probe (flags 0x50 = C|S, IRD/ORD 16/16).
    static CRC_REQUEST: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, 0x50, 0x02,
        0x00, 0x04, 0x00, 0x10, 0x00, 0x10,
    ];

    #[test]
    fn keys_match_rfc5044_fig8() {
        // RFC 5044 §7.1.1: the key octets in hex.
        assert_eq!(
            KEY_REQUEST,
            [
                0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65
            ]
        );
        assert_eq!(
            KEY_REPLY,
            [
                0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65
            ]
        );
    }

    #[test]
    fn deconstruct_siw_request() {
        // C.2.2 / C.3: siw's default Request, real bytes.
        let f = Frame::new_checked(&SIW_REQUEST[..]).unwrap();
        assert_eq!(f.kind(), Some(FrameKind::Request));
        assert_eq!(f.flags(), 0x10);
        assert!(!f.markers() && !f.crc() && !f.reject() && f.enhanced());
        assert_eq!(f.reserved(), 0);
        assert_eq!(f.revision(), Revision::V2);
        assert_eq!(f.pd_length(), 4);
        assert_eq!(f.private_data(), &[0, 1, 0, 1]);
        assert_eq!(f.frame_len(), 24);
        assert!(f.trailing().is_empty());
    }

    #[test]
    fn parse_siw_request_and_reply() {
        let r = Repr::parse_exact(&SIW_REQUEST, MAX_PRIVATE_DATA).unwrap();
        let e = EnhancedData {
            ird: 1,
            ord: 1,
            p2p: false,
            rtr: RtrSet::EMPTY,
        };
        assert_eq!(r, Repr::enhanced(FrameKind::Request, e, &[]));
        let r = Repr::parse_exact(&SIW_REPLY, MAX_PRIVATE_DATA).unwrap();
        assert_eq!(r, Repr::enhanced(FrameKind::Reply, e, &[]));
    }

    #[test]
    fn emit_siw_request_and_reply() {
        let e = EnhancedData {
            ird: 1,
            ord: 1,
            p2p: false,
            rtr: RtrSet::EMPTY,
        };
        let mut buf = [0xa5u8; 24];
        Repr::enhanced(FrameKind::Request, e, &[])
            .emit(&mut Frame::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(buf, SIW_REQUEST);
        let mut v = Vec::new();
        Repr::enhanced(FrameKind::Reply, e, &[]).emit_vec(&mut v).unwrap();
        assert_eq!(v, SIW_REPLY);
    }

    #[test]
    fn siw_marker_reject_reply() {
        // C.2.3: siw refuses M=1 with an R=1 Reply (flags 0x30).
        let r = Repr::parse_exact(&SIW_MARKER_REJECT, MAX_PRIVATE_DATA).unwrap();
        assert_eq!(r.kind, FrameKind::Reply);
        assert!(r.reject && r.s_flag && !r.markers && !r.crc);
        assert_eq!(r.enhanced, Some(EnhancedData::default()));
        let mut v = Vec::new();
        r.emit_vec(&mut v).unwrap();
        assert_eq!(v, SIW_MARKER_REJECT);
    }

    #[test]
    fn rev1_request_and_reply() {
        let r = Repr::parse_exact(&REV1_REQUEST_HELLO, MAX_PRIVATE_DATA).unwrap();
        assert_eq!(r, Repr::basic(FrameKind::Request, Revision::V1, b"hello"));
        let r = Repr::parse_exact(&SIW_REV1_REPLY, MAX_PRIVATE_DATA).unwrap();
        assert_eq!(r, Repr::basic(FrameKind::Reply, Revision::V1, &[]));
        let mut v = Vec::new();
        Repr::basic(FrameKind::Request, Revision::V1, b"hello")
            .emit_vec(&mut v)
            .unwrap();
        assert_eq!(v, REV1_REQUEST_HELLO);
    }

    #[test]
    fn crc_request() {
        let r = Repr::parse_exact(&CRC_REQUEST, MAX_PRIVATE_DATA).unwrap();
        assert!(r.crc && r.s_flag);
        assert_eq!(r.enhanced.unwrap().ird, 16);
        assert_eq!(r.enhanced.unwrap().ord, 16);
    }

    #[test]
    fn construct_onto_a5_buffer() {
        // Every octet of the frame is written; nothing beyond it.
        let e = EnhancedData {
            ird: 0x3FFF,
            ord: 0x1234,
            p2p: true,
            rtr: RtrSet::ALL,
        };
        let mut repr = Repr::enhanced(FrameKind::Reply, e, b"xy");
        repr.crc = true;
        repr.markers = true;
        repr.reject = true;
        let mut buf = [0xa5u8; 30];
        repr.emit(&mut Frame::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(&buf[..16], &KEY_REPLY);
        assert_eq!(
            &buf[16..26],
            &[0xF0, 0x02, 0x00, 0x06, 0xFF, 0xFF, 0xD2, 0x34, b'x', b'y']
        );
        assert_eq!(&buf[26..], &[0xa5; 4]);
    }

    #[test]
    fn enhanced_data_bits() {
        // RFC 6581 §9 figure: A|B|IRD(14) C|D|ORD(14).
        let e = EnhancedData::parse(&[0x80, 0x05, 0x40, 0x07]).unwrap();
        assert_eq!(
            e,
            EnhancedData {
                ird: 5,
                ord: 7,
                p2p: true,
                rtr: RtrSet::READ
            }
        );
        let e = EnhancedData::parse(&[0xC0, 0x00, 0x80, 0x00]).unwrap();
        assert_eq!(
            e,
            EnhancedData {
                ird: 0,
                ord: 0,
                p2p: true,
                rtr: RtrSet::SEND.union(RtrSet::WRITE)
            }
        );
        assert_eq!(e.to_bytes(), [0xC0, 0x00, 0x80, 0x00]);
        // Values above 14 bits are masked on emit.
        let e = EnhancedData {
            ird: 0xFFFF,
            ord: 0x4001,
            p2p: false,
            rtr: RtrSet::EMPTY,
        };
        assert_eq!(e.to_bytes(), [0x3F, 0xFF, 0x00, 0x01]);
    }

    #[test]
    fn bad_key() {
        // RFC 5044 §7.1.2 rule 5.
        let mut b = SIW_REQUEST;
        b[3] = b'_';
        assert_eq!(Repr::parse_exact(&b, MAX_PRIVATE_DATA), Err(Error::BadKey));
        assert_eq!(Error::BadKey.cause(), MPA_ERR_INVALID_REQ_REP);
    }

    #[test]
    fn truncated_header_and_private_data() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                Repr::parse_exact(&SIW_REQUEST[..n], MAX_PRIVATE_DATA),
                Err(Error::Truncated {
                    need: HEADER_LEN,
                    have: n
                })
            );
        }
        for n in HEADER_LEN..SIW_REQUEST.len() {
            assert_eq!(
                Repr::parse_exact(&SIW_REQUEST[..n], MAX_PRIVATE_DATA),
                Err(Error::Truncated { need: 24, have: n })
            );
            assert!(Frame::new_checked(&SIW_REQUEST[..n]).is_err());
        }
    }

    #[test]
    fn sec_dos_05_private_data_too_long() {
        // RFC 5044 §7.1.1: more than 512 octets is improperly formatted,
        // whatever the configured limit; and the configured limit holds.
        let mut b = vec![0u8; HEADER_LEN + 513];
        b[..16].copy_from_slice(&KEY_REQUEST);
        b[17] = 1;
        b[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert_eq!(
            Repr::parse_exact(&b, usize::MAX),
            Err(Error::PrivateDataTooLong { len: 513, max: 512 })
        );
        b[18..20].copy_from_slice(&257u16.to_be_bytes());
        b.truncate(HEADER_LEN + 257);
        assert_eq!(
            Repr::parse_exact(&b, SIW_MAX_PRIVATE_DATA),
            Err(Error::PrivateDataTooLong { len: 257, max: 256 })
        );
        assert!(Repr::parse_exact(&b, MAX_PRIVATE_DATA).is_ok());
        // PD_Length 0xFFFF with a short buffer: the limit is checked first,
        // nothing is read past the buffer.
        let mut h = SIW_REQUEST;
        h[18] = 0xFF;
        h[19] = 0xFF;
        assert_eq!(
            Repr::parse_exact(&h, MAX_PRIVATE_DATA),
            Err(Error::PrivateDataTooLong { len: 0xFFFF, max: 512 })
        );
    }

    #[test]
    fn emit_refuses_too_long_private_data() {
        let pd = [0u8; 509];
        let r = Repr::enhanced(FrameKind::Request, EnhancedData::default(), &pd);
        let mut v = Vec::new();
        assert_eq!(
            r.emit_vec(&mut v),
            Err(Error::PrivateDataTooLong { len: 513, max: 512 })
        );
        assert!(v.is_empty());
        let r = Repr::enhanced(FrameKind::Request, EnhancedData::default(), &pd[..508]);
        r.emit_vec(&mut v).unwrap();
        assert_eq!(v.len(), MAX_FRAME_LEN);
    }

    #[test]
    fn emit_buffer_too_small() {
        let r = Repr::basic(FrameKind::Request, Revision::V1, b"abc");
        let mut buf = [0u8; 22];
        assert_eq!(
            r.emit(&mut Frame::new_unchecked(&mut buf[..])),
            Err(Error::BufferTooSmall { need: 23, have: 22 })
        );
        assert_eq!(buf, [0u8; 22]);
    }

    #[test]
    fn enhanced_flag_without_ird_ord() {
        // RFC 6581 §6: S set with Rev 2 but PD_Length 2.
        let mut b = SIW_REQUEST;
        b[19] = 2;
        assert_eq!(
            Repr::parse_exact(&b[..22], MAX_PRIVATE_DATA),
            Err(Error::EnhancedDataTruncated { pd_len: 2 })
        );
    }

    #[test]
    fn s_flag_is_reserved_below_rev2() {
        // RFC 6581 §6: S is meaningful only with Rev >= 2; with Rev 1 the
        // whole PD is ULP data.
        let mut b = SIW_REQUEST;
        b[17] = 1;
        let r = Repr::parse_exact(&b, MAX_PRIVATE_DATA).unwrap();
        assert!(r.s_flag);
        assert_eq!(r.enhanced, None);
        assert_eq!(r.private_data, &[0, 1, 0, 1]);
        let mut v = Vec::new();
        r.emit_vec(&mut v).unwrap();
        assert_eq!(v, b);
    }

    #[test]
    fn unknown_revision_and_reserved_bits_survive() {
        let mut b = SIW_REQUEST;
        b[16] = 0x1F;
        b[17] = 7;
        let r = Repr::parse_exact(&b, MAX_PRIVATE_DATA).unwrap();
        assert_eq!(r.revision, Revision::Unknown(7));
        assert_eq!(r.reserved, 0x0F);
        assert!(r.enhanced.is_some());
        let mut v = Vec::new();
        r.emit_vec(&mut v).unwrap();
        assert_eq!(v, b);
        assert_eq!(Revision::from(0), Revision::V0);
    }

    #[test]
    fn extra_bytes() {
        // siw: octets after the frame are a protocol error when the caller
        // expects exactly one frame.
        let mut b = SIW_REQUEST.to_vec();
        b.extend_from_slice(&[0, 0x22]);
        assert_eq!(
            Repr::parse_exact(&b, MAX_PRIVATE_DATA),
            Err(Error::ExtraBytes { extra: 2 })
        );
        let f = Frame::new_checked(&b[..]).unwrap();
        assert_eq!(f.trailing(), &[0, 0x22]);
        assert!(Repr::parse(&f, MAX_PRIVATE_DATA).is_ok());
    }

    #[test]
    fn frame_len_from_header() {
        assert_eq!(frame_len(&SIW_REQUEST[..19]), None);
        assert_eq!(frame_len(&SIW_REQUEST[..20]), Some(24));
    }

    #[test]
    fn display() {
        let r = Repr::parse_exact(&SIW_REQUEST, MAX_PRIVATE_DATA).unwrap();
        assert_eq!(r.to_string(), "MPA Request rev 2 [S] pdlen 4 ird 1 ord 1 ulp-pd 0");
        let r = Repr::parse_exact(&SIW_MARKER_REJECT, MAX_PRIVATE_DATA).unwrap();
        assert_eq!(r.to_string(), "MPA Reply rev 2 [RS] pdlen 4 ird 0 ord 0 ulp-pd 0");
        let e = EnhancedData {
            ird: 32,
            ord: 1,
            p2p: true,
            rtr: RtrSet::READ,
        };
        let mut r = Repr::enhanced(FrameKind::Request, e, b"\x01\x02");
        r.crc = true;
        assert_eq!(
            r.to_string(),
            "MPA Request rev 2 [CS] pdlen 6 ird 32 ord 1 peer2peer rtr read ulp-pd 2 0102"
        );
        assert_eq!(
            pretty(&SIW_REQUEST[..3]),
            "MPA frame error: MPA frame truncated: need 20 octets, have 3"
        );
        assert_eq!(RtrSet::EMPTY.to_string(), "none");
        assert_eq!(RtrSet::ALL.to_string(), "send|write|read");
    }

    #[test]
    fn rtr_preference_is_siws() {
        assert_eq!(RtrSet::ALL.preferred(), Some(Rtr::Write));
        assert_eq!(RtrSet::READ.union(RtrSet::SEND).preferred(), Some(Rtr::Read));
        assert_eq!(RtrSet::SEND.preferred(), Some(Rtr::Send));
        assert_eq!(RtrSet::EMPTY.preferred(), None);
    }

    fn arb_enhanced() -> impl Strategy<Value = EnhancedData> {
        (0..=0x3FFFu16, 0..=0x3FFFu16, any::<bool>(), 0u8..8).prop_map(|(ird, ord, p2p, r)| EnhancedData {
            ird,
            ord,
            p2p,
            rtr: RtrSet(r),
        })
    }

    proptest! {
        #[test]
        fn roundtrip(
            req in any::<bool>(), m in any::<bool>(), c in any::<bool>(), r in any::<bool>(),
            res in 0u8..16, rev in any::<u8>(), e in proptest::option::of(arb_enhanced()),
            pd in proptest::collection::vec(any::<u8>(), 0..=508),
        ) {
            let kind = if req { FrameKind::Request } else { FrameKind::Reply };
            let revision = Revision::from(rev);
            // The block exists only where the parser can see it.
            let e = if revision.allows_enhanced() { e } else { None };
            let repr = Repr {
                kind, markers: m, crc: c, reject: r, s_flag: e.is_some(), reserved: res, revision,
                enhanced: e, private_data: &pd,
            };
            let mut v = Vec::new();
            repr.emit_vec(&mut v).unwrap();
            prop_assert_eq!(v.len(), repr.buffer_len());
            let back = Repr::parse_exact(&v, MAX_PRIVATE_DATA).unwrap();
            prop_assert_eq!(back, repr);
        }

        /// SEC-ROB-01.
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), max in 0usize..1000) {
            let _ = Repr::parse(&Frame::new_unchecked(&bytes[..]), max);
            let _ = pretty(&bytes);
        }

        #[test]
        fn enhanced_roundtrip(e in arb_enhanced()) {
            prop_assert_eq!(EnhancedData::parse(&e.to_bytes()).unwrap(), e);
        }
    }
}
