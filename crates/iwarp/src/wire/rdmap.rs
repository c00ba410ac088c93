//! RDMAP messages over DDP (RFC 5040 §4, RFC 7306 §4-§6), sans-I/O.
//!
//! Read before editing: RFC 5040 §4.1-§4.8 and §7, RFC 7306 §4-§8, and the
//! catalogue `shared/requirements/rdmap-rpcrdma.md` A.1.2-A.1.8, A.4.2,
//! A.4.6 and A.5.
//!
//! The RDMAP control octet is RsvdULP\[0:7\] of the DDP header: RV(2) Rsv(2)
//! OpCode(4). [`Opcode::info`] is the one table of RFC 5040 Figs. 4-5 and
//! RFC 7306 Figs. 2-3 that both directions use. [`Message`] is the typed
//! meaning of one DDP segment at the RDMAP layer; [`Message::parse`] runs
//! the receive checks of catalogue A.4.2 steps 3-4 and the header-length
//! rules (RDMAP-HDR-07), and every [`Error`] names its Terminate (matrix
//! A.4.6). The engine calls it on every ULPDU (`engine/qp/rx.rs`); queue,
//! MSN, MO and buffer checks follow there.
//!
//! Golden control words (catalogue A.1.2, L set): Write 0xC140, Read
//! Request 0x4141, Read Response 0xC142, Send 0x4143, Send with Invalidate
//! 0x4144, Send with SE 0x4145, Send with SE and Invalidate 0x4146,
//! Terminate 0x4147; RFC 7306: Immediate Data 0x4148, Immediate Data with
//! SE 0x4149, Atomic Request 0x414A, Atomic Response 0x414B.

use core::fmt;

use super::cause::{self, TermCause};
use super::ddp::{self, Addr, BufferTooSmall, Segment, need};
use super::terminate::{self, Offending, TermWireForm};

use super::rdmap_hdr as hdr;
pub use hdr::{
    ATOMIC_REQUEST_LEN, ATOMIC_RESPONSE_LEN, AtomicOp, AtomicRequest, AtomicRequestPacket, AtomicResponse,
    AtomicResponsePacket, IMMEDIATE_LEN, ImmediatePacket, READ_REQUEST_LEN, ReadRequest, ReadRequestPacket, Truncated,
};
pub use hdr::{VERSION, op, qn};

mod field {
    /// RV, RDMA Version (RFC 5040 §4.1).
    pub const RV_MASK: u8 = 0xc0;
    pub const RV_SHIFT: u32 = 6;
    /// Rsv: 0 on send, ignored on receive (RDMAP-HDR-05).
    pub const RSV_MASK: u8 = 0x30;
    pub const OPCODE_MASK: u8 = 0x0f;
}

/// Split an RDMAP control octet into (RV, Rsv, OpCode nibble).
pub const fn split_control(ctrl: u8) -> (u8, u8, u8) {
    (
        (ctrl & field::RV_MASK) >> field::RV_SHIFT,
        (ctrl & field::RSV_MASK) >> 4,
        ctrl & field::OPCODE_MASK,
    )
}

/// RDMA Message OpCode (RFC 5040 Fig. 4, RFC 7306 Fig. 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// RDMA Write (0x0).
    Write,
    /// RDMA Read Request (0x1).
    ReadRequest,
    /// RDMA Read Response (0x2).
    ReadResponse,
    /// Send (0x3).
    Send,
    /// Send with Invalidate (0x4).
    SendInvalidate,
    /// Send with Solicited Event (0x5).
    SendSe,
    /// Send with Solicited Event and Invalidate (0x6).
    SendSeInvalidate,
    /// Terminate (0x7).
    Terminate,
    /// RFC 7306 §6.
    ImmediateData,
    /// RFC 7306 §6.
    ImmediateDataSe,
    /// RFC 7306 §5.2.1.
    AtomicRequest,
    /// RFC 7306 §5.2.2.
    AtomicResponse,
    /// 0xC-0xF: reserved; kept for the Terminate.
    Unknown(u8),
}

impl From<u8> for Opcode {
    fn from(v: u8) -> Opcode {
        match v & field::OPCODE_MASK {
            0x0 => Opcode::Write,
            0x1 => Opcode::ReadRequest,
            0x2 => Opcode::ReadResponse,
            0x3 => Opcode::Send,
            0x4 => Opcode::SendInvalidate,
            0x5 => Opcode::SendSe,
            0x6 => Opcode::SendSeInvalidate,
            0x7 => Opcode::Terminate,
            0x8 => Opcode::ImmediateData,
            0x9 => Opcode::ImmediateDataSe,
            0xa => Opcode::AtomicRequest,
            0xb => Opcode::AtomicResponse,
            n => Opcode::Unknown(n),
        }
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        match op {
            Opcode::Write => 0x0,
            Opcode::ReadRequest => 0x1,
            Opcode::ReadResponse => 0x2,
            Opcode::Send => 0x3,
            Opcode::SendInvalidate => 0x4,
            Opcode::SendSe => 0x5,
            Opcode::SendSeInvalidate => 0x6,
            Opcode::Terminate => 0x7,
            Opcode::ImmediateData => 0x8,
            Opcode::ImmediateDataSe => 0x9,
            Opcode::AtomicRequest => 0xa,
            Opcode::AtomicResponse => 0xb,
            Opcode::Unknown(n) => n & field::OPCODE_MASK,
        }
    }
}

/// Untagged queues (RFC 5040 §4.1 Fig. 4, RFC 7306 §4.1 Fig. 2, §10.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Queue {
    /// QN 0: Send family and Immediate Data.
    Send,
    /// QN 1: Read Requests and Atomic Requests.
    ReadRequest,
    /// QN 2: Terminate.
    Terminate,
    /// QN 3: Atomic Responses (RFC 7306 only).
    AtomicResponse,
}

impl Queue {
    /// Every queue, in QN order.
    pub const ALL: [Queue; 4] = [Queue::Send, Queue::ReadRequest, Queue::Terminate, Queue::AtomicResponse];

    /// Its Queue Number.
    pub const fn qn(self) -> u32 {
        self as u32
    }
    /// Its index in per-queue tables.
    pub const fn index(self) -> usize {
        self as usize
    }
    /// The queue for a QN, if `cfg` enables it (QN 3 needs atomics).
    pub const fn from_qn(qn: u32, cfg: &Config) -> Option<Queue> {
        match qn {
            0 => Some(Queue::Send),
            1 => Some(Queue::ReadRequest),
            2 => Some(Queue::Terminate),
            3 if cfg.atomics => Some(Queue::AtomicResponse),
            _ => None,
        }
    }
}

/// What follows the DDP header before any ULP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RdmapHeader {
    /// No RDMAP header (Write, Read Response, Send family).
    None,
    /// A fixed-length header: Read Request 28, Immediate 8, Atomic 52 / 12.
    Fixed(usize),
    /// Terminate header, 4 to 52 octets (RFC 5040 §4.8).
    Terminate,
}

/// One row of RFC 5040 Figs. 4-5 / RFC 7306 Figs. 2-3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpInfo {
    /// T flag the message must carry.
    pub tagged: bool,
    /// Untagged queue (`None` for tagged messages).
    pub queue: Option<Queue>,
    /// The RDMAP header after the DDP header.
    pub header: RdmapHeader,
    /// Whether ULP payload may follow the RDMAP header.
    pub payload: bool,
    /// The Invalidate STag field is valid (ops 0x4, 0x6).
    pub invalidate: bool,
    /// Defined by RFC 7306 (needs [`Config`] support).
    pub rfc7306: bool,
}

impl Opcode {
    /// Its row of the opcode tables; `None` for a reserved opcode.
    pub const fn info(self) -> Option<OpInfo> {
        const fn row(tagged: bool, queue: Option<Queue>, header: RdmapHeader, payload: bool) -> OpInfo {
            OpInfo {
                tagged,
                queue,
                header,
                payload,
                invalidate: false,
                rfc7306: false,
            }
        }
        const SEND: OpInfo = row(false, Some(Queue::Send), RdmapHeader::None, true);
        const SEND_INV: OpInfo = OpInfo {
            invalidate: true,
            ..SEND
        };
        const IMM: OpInfo = OpInfo {
            rfc7306: true,
            ..row(false, Some(Queue::Send), RdmapHeader::Fixed(8), false)
        };
        Some(match self {
            Opcode::Write | Opcode::ReadResponse => row(true, None, RdmapHeader::None, true),
            Opcode::ReadRequest => row(
                false,
                Some(Queue::ReadRequest),
                RdmapHeader::Fixed(READ_REQUEST_LEN),
                false,
            ),
            Opcode::Send | Opcode::SendSe => SEND,
            Opcode::SendInvalidate | Opcode::SendSeInvalidate => SEND_INV,
            Opcode::Terminate => row(false, Some(Queue::Terminate), RdmapHeader::Terminate, false),
            Opcode::ImmediateData | Opcode::ImmediateDataSe => IMM,
            Opcode::AtomicRequest => OpInfo {
                rfc7306: true,
                ..row(
                    false,
                    Some(Queue::ReadRequest),
                    RdmapHeader::Fixed(ATOMIC_REQUEST_LEN),
                    false,
                )
            },
            Opcode::AtomicResponse => OpInfo {
                rfc7306: true,
                ..row(
                    false,
                    Some(Queue::AtomicResponse),
                    RdmapHeader::Fixed(ATOMIC_RESPONSE_LEN),
                    false,
                )
            },
            Opcode::Unknown(_) => return None,
        })
    }

    /// Known, and enabled by `cfg` (RFC 7306 opcodes are optional).
    pub const fn enabled(self, cfg: &Config) -> bool {
        match self {
            Opcode::ImmediateData | Opcode::ImmediateDataSe => cfg.immediate_data,
            Opcode::AtomicRequest | Opcode::AtomicResponse => cfg.atomics,
            Opcode::Unknown(_) => false,
            _ => true,
        }
    }

    /// RDMAP control octet with RV = 01b, Rsv = 0.
    pub fn control(self) -> u8 {
        (VERSION << field::RV_SHIFT) | u8::from(self)
    }

    /// DDP Control + RDMAP Control as sent for this opcode (catalogue A.1.2):
    /// T per the table, L as given, DV = 01b, RV = 01b.
    pub fn control_word(self, last: bool) -> u16 {
        let tagged = self.info().is_some_and(|i| i.tagged);
        let mut ddp = ddp::VERSION;
        if tagged {
            ddp |= 0x80;
        }
        if last {
            ddp |= 0x40;
        }
        (u16::from(ddp) << 8) | u16::from(self.control())
    }
}

/// Receive-side options of one RDMAP stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Config {
    /// Accept RFC 7306 Immediate Data (opcodes 0x8, 0x9). Linux siw has none.
    pub immediate_data: bool,
    /// Accept RFC 7306 atomics (opcodes 0xA, 0xB and QN 3).
    pub atomics: bool,
    /// Preferred Terminate form when the bits cannot tell (terminate.rs).
    pub terminate_form: TermWireForm,
}

impl Config {
    /// RFC 5040 only, as Linux siw speaks it.
    pub const RFC5040: Config = Config {
        immediate_data: false,
        atomics: false,
        terminate_form: TermWireForm::Rfc,
    };
    /// RFC 5040 plus all of RFC 7306.
    pub const RFC7306: Config = Config {
        immediate_data: true,
        atomics: true,
        terminate_form: TermWireForm::Rfc,
    };
}

/// The RDMAP meaning of one DDP segment. Tagged fields and payload are
/// those of this segment; for a multi-segment Write, Read Response or Send
/// each segment parses to its own `Message` (DDP fields stay in the
/// [`Segment`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Message<'a> {
    /// RDMA Write segment.
    Write {
        /// Data Sink STag.
        stag: u32,
        /// Data Sink Tagged Offset of this segment.
        to: u64,
        /// The data.
        payload: &'a [u8],
    },
    /// RDMA Read Request.
    ReadRequest(ReadRequest),
    /// RDMA Read Response segment.
    ReadResponse {
        /// Data Sink STag (of the Read Request).
        stag: u32,
        /// Data Sink Tagged Offset of this segment.
        to: u64,
        /// The data.
        payload: &'a [u8],
    },
    /// Send (se: false, invalidate: None), Send with SE, and the two
    /// Invalidate variants carrying the STag to invalidate.
    Send {
        /// Solicited Event.
        se: bool,
        /// The STag to invalidate.
        invalidate: Option<u32>,
        /// The data.
        payload: &'a [u8],
    },
    /// Terminate.
    Terminate(terminate::Repr),
    /// RFC 7306 §6: 8 octets of Immediate Data.
    ImmediateData {
        /// Solicited Event.
        se: bool,
        /// The Immediate Data.
        data: u64,
    },
    /// Atomic Request (RFC 7306 §5.2.1).
    AtomicRequest(AtomicRequest),
    /// Atomic Response (RFC 7306 §5.2.2).
    AtomicResponse(AtomicResponse),
}

/// What a Terminate for an [`Error`] may copy from the offending segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Echo {
    /// Layout unknown (bad DV, RV, opcode, T): the 22-octet form.
    Nothing,
    /// DDP Segment Length and DDP header (M, D).
    DdpHeader,
    /// Also the Read Request header (M, D, R).
    DdpAndRdmaHeader,
}

/// A receive error found while parsing one segment (catalogue A.4.2 steps
/// 2-4 and RDMAP-HDR-07).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// DDP header: empty, truncated or DV != 01b.
    Ddp(ddp::Error),
    /// RV != 01b (matrix row 21).
    Version {
        /// The RV found.
        rv: u8,
    },
    /// Opcode 0xC-0xF, or an RFC 7306 opcode not enabled (row 22).
    UnknownOpcode {
        /// The opcode nibble.
        raw: u8,
    },
    /// T flag does not match the opcode (row 24, RDMAP-HDR-03).
    TaggedMismatch {
        /// The opcode.
        opcode: Opcode,
        /// The T flag it came with.
        tagged: bool,
    },
    /// QN does not match the opcode, e.g. a Send on QN 1 (row 5).
    QueueMismatch {
        /// The opcode.
        opcode: Opcode,
        /// The QN it came on.
        qn: u32,
    },
    /// A header-only message split over several segments.
    NotLast {
        /// The opcode.
        opcode: Opcode,
    },
    /// RDMAP header truncated, or payload after a header-only message
    /// (RDMAP-HDR-07), or Immediate Data not exactly 8 octets (RFC 7306 §6.3).
    /// `rreq` is the Read Request header when it was complete.
    HeaderLength {
        /// The opcode.
        opcode: Opcode,
        /// Octets after the DDP header.
        len: usize,
        /// The Read Request header, when it was complete.
        rreq: Option<ReadRequest>,
    },
    /// A Terminate whose length does not match its bits (RDMAP-TRM-04).
    Terminate(terminate::Error),
}

impl From<ddp::Error> for Error {
    fn from(e: ddp::Error) -> Self {
        Error::Ddp(e)
    }
}

impl Error {
    /// The Terminate cause of matrix A.4.6.
    ///
    /// * Row 21, RV != 01b: 0/2/0x05. Row 22, unknown opcode: 0/2/0x06.
    /// * Row 24, opcode/T mismatch: unspecified; catalogue suggests 0/2/0x06.
    /// * Row 5, opcode/QN mismatch: 1/2/0x01 (Invalid QN).
    /// * RDMAP-HDR-07, header-only message with trailing payload (and, by the
    ///   same rule, a truncated or split RDMAP header): unspecified; catalogue
    ///   suggests 0/2/0xFF, which we use (A.5 #8).
    /// * A malformed Terminate: 0/2/0xFF, but row 29 says no Terminate is
    ///   sent in reply to a Terminate ([`Error::opcode`] tells).
    pub const fn term_cause(&self) -> TermCause {
        match self {
            Error::Ddp(e) => e.term_cause(),
            Error::Version { .. } => cause::RDMAP_ERR_INVALID_VERSION,
            Error::UnknownOpcode { .. } | Error::TaggedMismatch { .. } => cause::RDMAP_ERR_UNEXPECTED_OPCODE,
            Error::QueueMismatch { .. } => cause::DDP_ERR_U_INVALID_QN,
            Error::NotLast { .. } | Error::HeaderLength { .. } | Error::Terminate(_) => cause::RDMAP_ERR_UNSPECIFIED_OP,
        }
    }

    /// What the Terminate may echo. DDP header errors (DV, length) echo
    /// nothing: the layout is unknown (rows 6, 7). Once the DDP header has
    /// parsed, its layout is known, so RV, opcode and T errors echo it (M, D
    /// set): the matrix allows it for rows 21 and 22 ("1 1 0"), and it is
    /// what the engine sent to Linux siw in the lab before this module ran
    /// there (misbehave.rs rows 21, 22, 24 pin it). Linux siw itself omits
    /// the headers for these (A.4.2); receivers accept both.
    pub const fn echo(&self) -> Echo {
        match self {
            Error::Ddp(_) => Echo::Nothing,
            Error::HeaderLength { rreq: Some(_), .. } => Echo::DdpAndRdmaHeader,
            Error::Version { .. }
            | Error::UnknownOpcode { .. }
            | Error::TaggedMismatch { .. }
            | Error::QueueMismatch { .. }
            | Error::NotLast { .. }
            | Error::HeaderLength { .. }
            | Error::Terminate(_) => Echo::DdpHeader,
        }
    }

    /// The opcode of the offending segment, when it was readable. A peer's
    /// malformed Terminate is answered by closing, not by a Terminate.
    pub const fn opcode(&self) -> Option<Opcode> {
        match self {
            Error::TaggedMismatch { opcode, .. }
            | Error::QueueMismatch { opcode, .. }
            | Error::NotLast { opcode }
            | Error::HeaderLength { opcode, .. } => Some(*opcode),
            Error::Terminate(_) => Some(Opcode::Terminate),
            _ => None,
        }
    }

    /// The Terminate to send for this error; `offending_ulpdu` is the whole
    /// ULPDU that failed (its length becomes the DDP Segment Length).
    pub fn terminate(&self, offending_ulpdu: &[u8]) -> terminate::Repr {
        let offending = match self.echo() {
            Echo::Nothing => None,
            Echo::DdpHeader | Echo::DdpAndRdmaHeader => Offending::from_ulpdu(offending_ulpdu),
        };
        let rreq = match self {
            Error::HeaderLength { rreq, .. } => rreq.as_ref(),
            _ => None,
        };
        terminate::Repr::for_error(self.term_cause(), offending, rreq)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Ddp(e) => write!(f, "{e}"),
            Error::Version { rv } => write!(f, "RDMAP version {rv} (expected {VERSION})"),
            Error::UnknownOpcode { raw } => write!(f, "unknown or disabled RDMAP opcode {raw:#x}"),
            Error::TaggedMismatch { opcode, tagged } => write!(f, "{opcode:?} with T={}", u8::from(*tagged)),
            Error::QueueMismatch { opcode, qn } => write!(f, "{opcode:?} on QN {qn}"),
            Error::NotLast { opcode } => write!(f, "{opcode:?} without L: header-only messages are one segment"),
            Error::HeaderLength { opcode, len, .. } => write!(f, "{opcode:?} with {len} octets after the DDP header"),
            Error::Terminate(e) => write!(f, "{e}"),
        }
    }
}

/// RDMAP-HDR-07: a header-only message carries exactly its header.
fn exact(opcode: Opcode, payload: &[u8], len: usize) -> Result<&[u8], Error> {
    if payload.len() == len {
        Ok(payload)
    } else {
        let rreq = match opcode {
            Opcode::ReadRequest => ReadRequest::parse(payload).ok(),
            _ => None,
        };
        Err(Error::HeaderLength {
            opcode,
            len: payload.len(),
            rreq,
        })
    }
}

impl<'a> Message<'a> {
    /// RDMAP receive checks in the order of catalogue A.4.2: RV (row 21),
    /// opcode known and enabled (row 22), opcode consistent with T (row 24)
    /// and QN (row 5), then header-only messages must be one segment with
    /// exactly their header (RDMAP-HDR-07). The DDP header was checked by
    /// [`Segment::parse`]. Rsv bits and, for Send / Send with SE / Read
    /// Request / Terminate, the Invalidate STag field are ignored
    /// (RDMAP-HDR-05, -06).
    pub fn parse(seg: &Segment<'a>, cfg: &Config) -> Result<Message<'a>, Error> {
        let h = &seg.header;
        let (rv, _rsv, raw) = split_control(h.rdmap_ctrl);
        if rv != VERSION {
            return Err(Error::Version { rv });
        }
        let opcode = Opcode::from(raw);
        let info = match opcode.info() {
            Some(info) if opcode.enabled(cfg) => info,
            _ => return Err(Error::UnknownOpcode { raw }),
        };
        if info.tagged != h.is_tagged() {
            return Err(Error::TaggedMismatch {
                opcode,
                tagged: h.is_tagged(),
            });
        }
        if let Addr::Untagged { qn, .. } = h.addr
            && info.queue.map(Queue::qn) != Some(qn)
        {
            return Err(Error::QueueMismatch { opcode, qn });
        }
        if !matches!(info.header, RdmapHeader::None) && !h.last {
            return Err(Error::NotLast { opcode });
        }
        let p = seg.payload;
        let truncated = |_| Error::HeaderLength {
            opcode,
            len: p.len(),
            rreq: None,
        };
        Ok(match (opcode, h.addr) {
            (Opcode::Write, Addr::Tagged { stag, to }) => Message::Write { stag, to, payload: p },
            (Opcode::ReadResponse, Addr::Tagged { stag, to }) => Message::ReadResponse { stag, to, payload: p },
            (Opcode::ReadRequest, _) => {
                Message::ReadRequest(ReadRequest::parse(exact(opcode, p, READ_REQUEST_LEN)?).map_err(truncated)?)
            }
            (Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate, addr) => {
                let inv_stag = match addr {
                    Addr::Untagged { inv_stag, .. } => inv_stag,
                    Addr::Tagged { .. } => 0,
                };
                Message::Send {
                    se: matches!(opcode, Opcode::SendSe | Opcode::SendSeInvalidate),
                    invalidate: info.invalidate.then_some(inv_stag),
                    payload: p,
                }
            }
            (Opcode::Terminate, _) => {
                let d = terminate::Repr::parse_auto(p, cfg.terminate_form).map_err(Error::Terminate)?;
                Message::Terminate(d.repr)
            }
            (Opcode::ImmediateData | Opcode::ImmediateDataSe, _) => Message::ImmediateData {
                se: opcode == Opcode::ImmediateDataSe,
                data: hdr::parse_immediate(exact(opcode, p, IMMEDIATE_LEN)?).map_err(truncated)?,
            },
            (Opcode::AtomicRequest, _) => {
                Message::AtomicRequest(AtomicRequest::parse(exact(opcode, p, ATOMIC_REQUEST_LEN)?).map_err(truncated)?)
            }
            (Opcode::AtomicResponse, _) => Message::AtomicResponse(
                AtomicResponse::parse(exact(opcode, p, ATOMIC_RESPONSE_LEN)?).map_err(truncated)?,
            ),
            // Tagged opcodes with an untagged header were rejected above.
            (opcode, addr) => {
                return Err(Error::TaggedMismatch {
                    opcode,
                    tagged: matches!(addr, Addr::Tagged { .. }),
                });
            }
        })
    }

    /// The message's opcode.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Message::Write { .. } => Opcode::Write,
            Message::ReadRequest(_) => Opcode::ReadRequest,
            Message::ReadResponse { .. } => Opcode::ReadResponse,
            Message::Send {
                se: false,
                invalidate: None,
                ..
            } => Opcode::Send,
            Message::Send {
                se: false,
                invalidate: Some(_),
                ..
            } => Opcode::SendInvalidate,
            Message::Send {
                se: true,
                invalidate: None,
                ..
            } => Opcode::SendSe,
            Message::Send {
                se: true,
                invalidate: Some(_),
                ..
            } => Opcode::SendSeInvalidate,
            Message::Terminate(_) => Opcode::Terminate,
            Message::ImmediateData { se: false, .. } => Opcode::ImmediateData,
            Message::ImmediateData { se: true, .. } => Opcode::ImmediateDataSe,
            Message::AtomicRequest(_) => Opcode::AtomicRequest,
            Message::AtomicResponse(_) => Opcode::AtomicResponse,
        }
    }

    /// ULP payload (Write, Read Response, Send family); empty otherwise.
    pub const fn payload(&self) -> &'a [u8] {
        match self {
            Message::Write { payload, .. } | Message::ReadResponse { payload, .. } | Message::Send { payload, .. } => {
                payload
            }
            _ => &[],
        }
    }

    /// RDMAP header length after the DDP header.
    pub fn rdmap_header_len(&self) -> usize {
        match self {
            Message::Write { .. } | Message::ReadResponse { .. } | Message::Send { .. } => 0,
            Message::ReadRequest(_) => READ_REQUEST_LEN,
            Message::Terminate(t) => t.buffer_len(),
            Message::ImmediateData { .. } => IMMEDIATE_LEN,
            Message::AtomicRequest(_) => ATOMIC_REQUEST_LEN,
            Message::AtomicResponse(_) => ATOMIC_RESPONSE_LEN,
        }
    }

    /// The DDP header when this message is sent as one segment (L = 1, MO 0)
    /// with `msn` on its queue; `msn` is unused for tagged messages. For
    /// multi-segment messages cut it with [`ddp::segment_len`] and
    /// [`ddp::Header::at_offset`].
    pub fn ddp_header(&self, msn: u32) -> ddp::Header {
        let op = self.opcode();
        let addr = match *self {
            Message::Write { stag, to, .. } | Message::ReadResponse { stag, to, .. } => Addr::Tagged { stag, to },
            _ => Addr::Untagged {
                qn: op.info().and_then(|i| i.queue).map_or(0, Queue::qn),
                msn,
                mo: 0,
                inv_stag: match *self {
                    Message::Send {
                        invalidate: Some(s), ..
                    } => s,
                    _ => 0,
                },
            },
        };
        ddp::Header {
            last: true,
            rdmap_ctrl: op.control(),
            addr,
        }
    }

    /// DDP header + RDMAP header length.
    pub fn header_len(&self) -> usize {
        self.ddp_header(0).header_len() + self.rdmap_header_len()
    }

    /// The whole ULPDU as one segment.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload().len()
    }

    /// Write the DDP and RDMAP headers as one segment (L = 1) and return
    /// their length. No payload is written: the caller copies it after the
    /// headers (e.g. straight from a registered region).
    pub fn emit_header(&self, buf: &mut [u8], msn: u32) -> Result<usize, BufferTooSmall> {
        need(buf.len(), self.header_len())?;
        let n = self.ddp_header(msn).emit(buf)?;
        let rest = &mut buf[n..];
        let m = match self {
            Message::Write { .. } | Message::ReadResponse { .. } | Message::Send { .. } => 0,
            Message::ReadRequest(r) => r.emit(rest)?,
            Message::Terminate(t) => t.emit(rest)?,
            Message::ImmediateData { data, .. } => hdr::emit_immediate(*data, rest)?,
            Message::AtomicRequest(a) => a.emit(rest)?,
            Message::AtomicResponse(a) => a.emit(rest)?,
        };
        Ok(n + m)
    }

    /// Write the whole ULPDU (headers and payload); returns its length.
    pub fn emit(&self, buf: &mut [u8], msn: u32) -> Result<usize, BufferTooSmall> {
        let total = self.buffer_len();
        need(buf.len(), total)?;
        let n = self.emit_header(buf, msn)?;
        buf[n..total].copy_from_slice(self.payload());
        Ok(total)
    }
}

impl fmt::Display for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Message::Write { stag, to, payload } => write!(f, "Write {stag:#010x}@{to:#x} len={}", payload.len()),
            Message::ReadRequest(r) => write!(f, "Read Request {r}"),
            Message::ReadResponse { stag, to, payload } => {
                write!(f, "Read Response {stag:#010x}@{to:#x} len={}", payload.len())
            }
            Message::Send {
                se,
                invalidate,
                payload,
            } => {
                write!(f, "Send{}", if *se { " SE" } else { "" })?;
                if let Some(s) = invalidate {
                    write!(f, " invalidate={s:#010x}")?;
                }
                write!(f, " len={}", payload.len())
            }
            Message::Terminate(t) => write!(f, "{t}"),
            Message::ImmediateData { se, data } => {
                write!(f, "Immediate Data{} {data:#018x}", if *se { " SE" } else { "" })
            }
            Message::AtomicRequest(a) => write!(
                f,
                "Atomic Request {:?} id={} {:#010x}@{:#x} data={:#x}/{:#x} cmp={:#x}/{:#x}",
                a.op,
                a.request_id,
                a.remote_stag,
                a.remote_to,
                a.add_swap_data,
                a.add_swap_mask,
                a.compare_data,
                a.compare_mask
            ),
            Message::AtomicResponse(a) => {
                write!(f, "Atomic Response id={} value={:#x}", a.orig_request_id, a.orig_value)
            }
        }
    }
}

/// Parse one ULPDU at both layers: DDP header, then RDMAP.
pub fn parse_ulpdu<'a>(ulpdu: &'a [u8], cfg: &Config) -> Result<(Segment<'a>, Message<'a>), Error> {
    let seg = Segment::parse(ulpdu)?;
    let msg = Message::parse(&seg, cfg)?;
    Ok((seg, msg))
}

/// Pretty-printer of one ULPDU, shared by the fuzz target and `softrdma
/// decode`: the DDP header, then the RDMAP message or the Terminate the
/// receiver would send.
pub struct Pretty<'a> {
    /// The ULPDU (DDP header first).
    pub ulpdu: &'a [u8],
    /// The RDMAP features in force (RFC 7306).
    pub cfg: Config,
}

impl fmt::Display for Pretty<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Segment::parse(self.ulpdu) {
            Err(e) => write!(f, "malformed DDP: {e} -> {}", e.term_cause()),
            Ok(seg) => match Message::parse(&seg, &self.cfg) {
                Ok(m) => write!(f, "{} | {m}", seg.header),
                Err(e) => write!(f, "{} | malformed RDMAP: {e} -> {}", seg.header, e.term_cause()),
            },
        }
    }
}

#[cfg(test)]
#[path = "rdmap_tests.rs"]
mod tests;
