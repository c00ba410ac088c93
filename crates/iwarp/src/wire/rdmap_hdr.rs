//! Fixed RDMAP headers that follow the DDP header: Read Request (RFC 5040
//! §4.4, Fig. 6), Immediate Data (RFC 7306 §6.2, Fig. 7), Atomic Request
//! (RFC 7306 §5.2.1, Fig. 4) and Atomic Response (RFC 7306 §5.2.2, Fig. 6).
//!
//! Each comes as a smoltcp-style view (`*Packet<T>`) plus a plain `Copy`
//! repr with `parse`/`emit`. Offsets are from the start of the RDMAP header,
//! i.e. from the end of the untagged DDP header (FPDU offset 20).
//!
//! Also the opcode and queue numbers as octets ([`op`], [`qn`]) and the RDMAP
//! version. This module is a leaf: [`super::terminate`] (which echoes a Read
//! Request header) and [`super::rdmap`] (which carries a Terminate) both use
//! it, so neither needs the other's module for these (no import circle).

use core::fmt;

use super::ddp::{BufferTooSmall, be, need};

/// RDMAP opcodes as octets (RFC 5040 §4.2 Fig. 4, RFC 7306 §4.1 Fig. 2), for
/// code that builds or matches the control octet directly (see [`Opcode`](super::rdmap::Opcode)).
pub mod op {
    /// RDMA Write.
    pub const WRITE: u8 = 0x0;
    /// RDMA Read Request.
    pub const READ_REQUEST: u8 = 0x1;
    /// RDMA Read Response.
    pub const READ_RESPONSE: u8 = 0x2;
    /// Send.
    pub const SEND: u8 = 0x3;
    /// Send with Invalidate.
    pub const SEND_INV: u8 = 0x4;
    /// Send with Solicited Event.
    pub const SEND_SE: u8 = 0x5;
    /// Send with Solicited Event and Invalidate.
    pub const SEND_SE_INV: u8 = 0x6;
    /// Terminate.
    pub const TERMINATE: u8 = 0x7;
    /// Immediate Data (RFC 7306).
    pub const IMM: u8 = 0x8;
    /// Immediate Data with Solicited Event (RFC 7306).
    pub const IMM_SE: u8 = 0x9;
    /// Atomic Request (RFC 7306).
    pub const ATOMIC_REQUEST: u8 = 0xA;
    /// Atomic Response (RFC 7306).
    pub const ATOMIC_RESPONSE: u8 = 0xB;
}

/// Untagged queue numbers (RFC 5040 §5, RFC 7306 §5.2).
pub mod qn {
    /// QN 0: Send, Send with Invalidate/SE, Immediate Data, Atomic Request.
    pub const SEND: u32 = 0;
    /// QN 1: RDMA Read Request.
    pub const READ_REQUEST: u32 = 1;
    /// QN 2: Terminate.
    pub const TERMINATE: u32 = 2;
    /// QN 3: Atomic Response (RFC 7306).
    pub const ATOMIC_RESPONSE: u32 = 3;
}

/// RV = 01b (RFC 5040 §4.1). 00b (RDMA Consortium) is rejected: A.5 #9.
pub const VERSION: u8 = 1;

/// The RDMAP control octet (RV = 01b, Rsv = 0) for an opcode octet of [`op`].
pub const fn control(opcode: u8) -> u8 {
    (VERSION << 6) | (opcode & 0x0f)
}

/// The header is shorter than its fixed length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Truncated {
    /// Octets needed.
    pub need: usize,
    /// Octets there were.
    pub have: usize,
}

mod field {
    pub type Field = core::ops::Range<usize>;

    // Read Request, RFC 5040 Fig. 6.
    pub const RR_SINK_STAG: Field = 0..4;
    pub const RR_SINK_TO: Field = 4..12;
    pub const RR_RDMARDSZ: Field = 12..16;
    pub const RR_SRC_STAG: Field = 16..20;
    pub const RR_SRC_TO: Field = 20..28;
    pub const RR_LEN: usize = RR_SRC_TO.end;

    // Immediate Data, RFC 7306 Fig. 7.
    pub const IMM_DATA: Field = 0..8;
    pub const IMM_LEN: usize = IMM_DATA.end;

    // Atomic Request, RFC 7306 Fig. 4.
    /// Reserved (28 bits) | AOpCode (4 bits).
    pub const AR_OPWORD: Field = 0..4;
    pub const AR_AOPCODE_MASK: u32 = 0x0000_000f;
    pub const AR_REQ_ID: Field = 4..8;
    pub const AR_STAG: Field = 8..12;
    pub const AR_TO: Field = 12..20;
    pub const AR_ADD_SWAP_DATA: Field = 20..28;
    pub const AR_ADD_SWAP_MASK: Field = 28..36;
    pub const AR_COMPARE_DATA: Field = 36..44;
    pub const AR_COMPARE_MASK: Field = 44..52;
    pub const AR_LEN: usize = AR_COMPARE_MASK.end;

    // Atomic Response, RFC 7306 Fig. 6.
    pub const AS_REQ_ID: Field = 0..4;
    pub const AS_ORIG_VALUE: Field = 4..12;
    pub const AS_LEN: usize = AS_ORIG_VALUE.end;
}

/// Read Request header length: 28 octets (224 bits, RFC 5040 §4.4).
pub const READ_REQUEST_LEN: usize = field::RR_LEN;
/// Immediate Data header length: 8 octets (RFC 7306 §6.2).
pub const IMMEDIATE_LEN: usize = field::IMM_LEN;
/// Atomic Request header length: 52 octets (RFC 7306 §4, Fig. 4).
pub const ATOMIC_REQUEST_LEN: usize = field::AR_LEN;
/// Atomic Response header length: 12 octets. RFC 7306 §4 says "32 bytes",
/// but Fig. 6 and Appendix A.2 draw 4 + 8 octets; we follow the figures.
pub const ATOMIC_RESPONSE_LEN: usize = field::AS_LEN;

/// Common constructor / length-check / accessor boilerplate for fixed views.
macro_rules! fixed_view {
    ($(#[$m:meta])* $view:ident, $len:expr, { $($get:ident / $set:ident : $ty:ident @ $f:ident;)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $view<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $view<T> {
            /// A view of `buffer`, not checked: accessors may panic before [`Self::check_len`].
            pub const fn new_unchecked(buffer: T) -> Self {
                $view { buffer }
            }
            /// A view of `buffer` once it is long enough for the header.
            pub fn new_checked(buffer: T) -> Result<Self, Truncated> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }
            /// Once this returns `Ok`, no accessor panics.
            pub fn check_len(&self) -> Result<(), Truncated> {
                let have = self.buffer.as_ref().len();
                if have < $len { Err(Truncated { need: $len, have }) } else { Ok(()) }
            }
            /// The buffer, given back.
            pub fn into_inner(self) -> T {
                self.buffer
            }
            $(
                #[doc = concat!("The `", stringify!($f), "` field.")]
                pub fn $get(&self) -> $ty {
                    fixed_view!(@get $ty, self.buffer.as_ref(), field::$f.start)
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            $(
                #[doc = concat!("Sets the `", stringify!($f), "` field.")]
                pub fn $set(&mut self, v: $ty) {
                    fixed_view!(@put $ty, self.buffer.as_mut(), field::$f.start, v)
                }
            )*
        }
    };
    (@get u32, $b:expr, $at:expr) => { be::u32_at($b, $at) };
    (@get u64, $b:expr, $at:expr) => { be::u64_at($b, $at) };
    (@put u32, $b:expr, $at:expr, $v:expr) => { be::put_u32($b, $at, $v) };
    (@put u64, $b:expr, $at:expr, $v:expr) => { be::put_u64($b, $at, $v) };
}

fixed_view!(
    /// View of a Read Request header (RFC 5040 Fig. 6).
    ReadRequestPacket, READ_REQUEST_LEN, {
    sink_stag / set_sink_stag: u32 @ RR_SINK_STAG;
    sink_to / set_sink_to: u64 @ RR_SINK_TO;
    rdma_rd_sz / set_rdma_rd_sz: u32 @ RR_RDMARDSZ;
    src_stag / set_src_stag: u32 @ RR_SRC_STAG;
    src_to / set_src_to: u64 @ RR_SRC_TO;
});

fixed_view!(
    /// View of an Immediate Data header (RFC 7306 Fig. 7).
    ImmediatePacket, IMMEDIATE_LEN, {
    data / set_data: u64 @ IMM_DATA;
});

fixed_view!(
    /// View of an Atomic Request header (RFC 7306 Fig. 4).
    AtomicRequestPacket, ATOMIC_REQUEST_LEN, {
    op_word / set_op_word: u32 @ AR_OPWORD;
    request_id / set_request_id: u32 @ AR_REQ_ID;
    remote_stag / set_remote_stag: u32 @ AR_STAG;
    remote_to / set_remote_to: u64 @ AR_TO;
    add_swap_data / set_add_swap_data: u64 @ AR_ADD_SWAP_DATA;
    add_swap_mask / set_add_swap_mask: u64 @ AR_ADD_SWAP_MASK;
    compare_data / set_compare_data: u64 @ AR_COMPARE_DATA;
    compare_mask / set_compare_mask: u64 @ AR_COMPARE_MASK;
});

impl<T: AsRef<[u8]>> AtomicRequestPacket<T> {
    /// AOpCode, the low 4 bits of the first word; the 28 reserved bits are
    /// ignored on receive (RFC 7306 §5.2.1).
    pub fn aopcode(&self) -> u8 {
        (self.op_word() & field::AR_AOPCODE_MASK) as u8
    }
}

fixed_view!(
    /// View of an Atomic Response header (RFC 7306 Fig. 6).
    AtomicResponsePacket, ATOMIC_RESPONSE_LEN, {
    orig_request_id / set_orig_request_id: u32 @ AS_REQ_ID;
    orig_value / set_orig_value: u64 @ AS_ORIG_VALUE;
});

/// RDMA Read Request header (RFC 5040 §4.4). Also the image carried as the
/// Terminated RDMA header of a Terminate (§4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadRequest {
    /// Data Sink STag, copied uninterpreted into the Read Response (RDMAP-HDR-09).
    pub sink_stag: u32,
    /// Data Sink Tagged Offset.
    pub sink_to: u64,
    /// RDMARDSZ: octets to read, 0 ..= 2^32-1.
    pub size: u32,
    /// Data Source STag.
    pub src_stag: u32,
    /// Data Source Tagged Offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// Parses the header at the start of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, Truncated> {
        let p = ReadRequestPacket::new_checked(bytes)?;
        Ok(ReadRequest {
            sink_stag: p.sink_stag(),
            sink_to: p.sink_to(),
            size: p.rdma_rd_sz(),
            src_stag: p.src_stag(),
            src_to: p.src_to(),
        })
    }
    /// Its length on the wire.
    pub const fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }
    /// Writes it at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), READ_REQUEST_LEN)?;
        let mut p = ReadRequestPacket::new_unchecked(buf);
        p.set_sink_stag(self.sink_stag);
        p.set_sink_to(self.sink_to);
        p.set_rdma_rd_sz(self.size);
        p.set_src_stag(self.src_stag);
        p.set_src_to(self.src_to);
        Ok(READ_REQUEST_LEN)
    }

    /// The Terminated RDMA header for a Read Request that already sent
    /// `done` octets (RFC 5040 §4.8, RDMAP-HDR-13): both TOs advance, the
    /// size shrinks. `None` if `done` exceeds the size or a TO would wrap.
    pub fn advanced(&self, done: u32) -> Option<ReadRequest> {
        Some(ReadRequest {
            sink_to: self.sink_to.checked_add(u64::from(done))?,
            size: self.size.checked_sub(done)?,
            src_to: self.src_to.checked_add(u64::from(done))?,
            ..*self
        })
    }
}

impl fmt::Display for ReadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sink {:#010x}@{:#x} size {} src {:#010x}@{:#x}",
            self.sink_stag, self.sink_to, self.size, self.src_stag, self.src_to
        )
    }
}

/// Atomic Operation Code (RFC 7306 §5.2.1 Fig. 5, IANA §10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Fetch and Add (0x0).
    FetchAdd,
    /// Compare and Swap (0x2).
    CmpSwap,
    /// Reserved (0x1) or unassigned; kept for the Terminate / error report.
    Unknown(u8),
}

impl From<u8> for AtomicOp {
    fn from(v: u8) -> Self {
        match v & 0xf {
            0x0 => AtomicOp::FetchAdd,
            0x2 => AtomicOp::CmpSwap,
            n => AtomicOp::Unknown(n),
        }
    }
}

impl From<AtomicOp> for u8 {
    fn from(op: AtomicOp) -> u8 {
        match op {
            AtomicOp::FetchAdd => 0x0,
            AtomicOp::CmpSwap => 0x2,
            AtomicOp::Unknown(n) => n & 0xf,
        }
    }
}

/// Atomic Request header (RFC 7306 §5.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicRequest {
    /// The Atomic Operation Code.
    pub op: AtomicOp,
    /// Request Identifier, echoed in the response.
    pub request_id: u32,
    /// Remote STag.
    pub remote_stag: u32,
    /// Remote Tagged Offset (8-octet aligned).
    pub remote_to: u64,
    /// Add Data (FetchAdd) or Swap Data (CmpSwap).
    pub add_swap_data: u64,
    /// Add Mask or Swap Mask.
    pub add_swap_mask: u64,
    /// Compare Data (CmpSwap).
    pub compare_data: u64,
    /// Compare Mask (CmpSwap).
    pub compare_mask: u64,
}

impl AtomicRequest {
    /// Parses the header at the start of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, Truncated> {
        let p = AtomicRequestPacket::new_checked(bytes)?;
        Ok(AtomicRequest {
            op: AtomicOp::from(p.aopcode()),
            request_id: p.request_id(),
            remote_stag: p.remote_stag(),
            remote_to: p.remote_to(),
            add_swap_data: p.add_swap_data(),
            add_swap_mask: p.add_swap_mask(),
            compare_data: p.compare_data(),
            compare_mask: p.compare_mask(),
        })
    }
    /// Its length on the wire.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_REQUEST_LEN
    }
    /// Reserved bits are written as zero.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), ATOMIC_REQUEST_LEN)?;
        let mut p = AtomicRequestPacket::new_unchecked(buf);
        p.set_op_word(u32::from(u8::from(self.op)));
        p.set_request_id(self.request_id);
        p.set_remote_stag(self.remote_stag);
        p.set_remote_to(self.remote_to);
        p.set_add_swap_data(self.add_swap_data);
        p.set_add_swap_mask(self.add_swap_mask);
        p.set_compare_data(self.compare_data);
        p.set_compare_mask(self.compare_mask);
        Ok(ATOMIC_REQUEST_LEN)
    }
}

/// Atomic Response header (RFC 7306 §5.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicResponse {
    /// The Request Identifier of the request answered.
    pub orig_request_id: u32,
    /// The value before the operation.
    pub orig_value: u64,
}

impl AtomicResponse {
    /// Parses the header at the start of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, Truncated> {
        let p = AtomicResponsePacket::new_checked(bytes)?;
        Ok(AtomicResponse {
            orig_request_id: p.orig_request_id(),
            orig_value: p.orig_value(),
        })
    }
    /// Its length on the wire.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_RESPONSE_LEN
    }
    /// Writes it at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), ATOMIC_RESPONSE_LEN)?;
        let mut p = AtomicResponsePacket::new_unchecked(buf);
        p.set_orig_request_id(self.orig_request_id);
        p.set_orig_value(self.orig_value);
        Ok(ATOMIC_RESPONSE_LEN)
    }
}

/// Parse an Immediate Data header (8 opaque octets, carried as a big-endian
/// u64 so that emit/parse are lossless).
pub fn parse_immediate(bytes: &[u8]) -> Result<u64, Truncated> {
    Ok(ImmediatePacket::new_checked(bytes)?.data())
}

pub fn emit_immediate(data: u64, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
    need(buf.len(), IMMEDIATE_LEN)?;
    ImmediatePacket::new_unchecked(buf).set_data(data);
    Ok(IMMEDIATE_LEN)
}
