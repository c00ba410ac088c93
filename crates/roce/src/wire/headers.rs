//! The base transport header and the extended transport headers of the InfiniBand transport
//! (IBA vol. 1 §9.2 and §9.3), as RoCEv2 carries them after the UDP header.
//!
//! Each header is a plain `Copy` struct with the field names of the IBA figures, a `LEN`,
//! `parse(&[u8]) -> Result<(Self, rest), Truncated>` (the rest of the slice after the
//! header) and `emit(&mut [u8]) -> Result<usize, BufferTooSmall>`. All fields are
//! big-endian. Reserved fields are kept as read so that parse → emit reproduces the octets;
//! senders leave them 0 and receivers ignore them (IBA vol. 1 §9.2, "reserved fields").
//!
//! ```text
//! BTH    (12) OpCode | SE M PadCnt(2) TVer(4) | P_Key(16) | FECN BECN Resv6a | DestQP(24)
//!             | A Resv7 | PSN(24)                                                  §9.2
//! DETH    (8) Q_Key(32) | Resv8 | SrcQP(24)                                        §9.3.2
//! RETH   (16) VA(64) | R_Key(32) | DMA Length(32)                                  §9.3.3
//! AtomicETH (28) VA(64) | R_Key(32) | Swap (Add) Data(64) | Compare Data(64)       §9.3.4
//! AETH    (4) Syndrome(8) | MSN(24)                                                §9.3.5
//! AtomicAckETH (8) Original Remote Data(64)                                        §9.3.6
//! ImmDt   (4) Immediate Data(32)                                                   §9.3.7
//! IETH    (4) R_Key(32)                                                            §9.3.8
//! ```
//!
//! Of the §9.3 subsection numbers only RETH's §9.3.3 (and its R_Key, §9.3.3.2) is confirmed by
//! a public source; the others follow the header order of the 1.2.1 text and are unconfirmed
//! (docs/roce.md, "IBA section numbers").

use core::fmt;

use super::opcode::Opcode;
use super::psn::Psn;
use super::{BufferTooSmall, Truncated, be, need};

const QPN_MASK: u32 = 0x00ff_ffff;

fn take<'a>(what: &'static str, b: &'a [u8], len: usize) -> Result<(&'a [u8], &'a [u8]), Truncated> {
    if b.len() < len {
        Err(Truncated {
            what,
            need: len,
            have: b.len(),
        })
    } else {
        Ok(b.split_at(len))
    }
}

/// Base Transport Header (IBA vol. 1 §9.2), 12 octets, in every packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// OpCode: transport service in the top 3 bits, operation in the low 5.
    pub opcode: Opcode,
    /// SE: Solicited Event, the responder should raise a solicited completion event.
    pub se: bool,
    /// M: MigReq, the path migration state (Linux rxe sends 0).
    pub m: bool,
    /// PadCnt: pad octets (0..=3) between payload and ICRC.
    pub pad_count: u8,
    /// TVer: transport header version; 0 is the only version (a receiver drops a
    /// packet with another TVer, as rxe's `hdr_check` does).
    pub tver: u8,
    /// P_Key: partition key (0xffff default, 0x7fff limited member).
    pub p_key: u16,
    /// FECN: forward explicit congestion notification (RoCEv2 marks ECN in IP instead).
    pub fecn: bool,
    /// BECN: backward explicit congestion notification.
    pub becn: bool,
    /// Resv6a: 6 reserved bits, 0 on send.
    pub resv6a: u8,
    /// DestQP: destination queue pair number (24 bits).
    pub dest_qp: u32,
    /// A: AckReq, the requester asks the responder for an acknowledge.
    pub ack_req: bool,
    /// Resv7: 7 reserved bits, 0 on send.
    pub resv7: u8,
    /// PSN: packet sequence number (24 bits).
    pub psn: Psn,
}

impl Bth {
    /// Octets of a BTH on the wire.
    pub const LEN: usize = 12;

    /// A BTH with the given opcode, destination QP and PSN, P_Key 0xffff and every flag 0.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> Bth {
        Bth {
            opcode,
            se: false,
            m: false,
            pad_count: 0,
            tver: 0,
            p_key: super::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            resv6a: 0,
            dest_qp: dest_qp & QPN_MASK,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Parses the 12 BTH octets at the front of `b`, returning the header and the octets after it.
    pub fn parse(b: &[u8]) -> Result<(Bth, &[u8]), Truncated> {
        let (h, rest) = take("BTH", b, Self::LEN)?;
        Ok((Self::from_octets(h), rest))
    }

    /// The BTH in the first 12 octets of `h` (at least that long: the caller checked).
    #[inline]
    pub(crate) fn from_octets(h: &[u8]) -> Bth {
        Bth {
            opcode: Opcode(h[0]),
            se: h[1] & 0x80 != 0,
            m: h[1] & 0x40 != 0,
            pad_count: (h[1] >> 4) & 0x3,
            tver: h[1] & 0x0f,
            p_key: be::u16_at(h, 2),
            fecn: h[4] & 0x80 != 0,
            becn: h[4] & 0x40 != 0,
            resv6a: h[4] & 0x3f,
            dest_qp: be::u24_at(h, 5),
            ack_req: h[8] & 0x80 != 0,
            resv7: h[8] & 0x7f,
            psn: Psn::new(be::u24_at(h, 9)),
        }
    }

    /// Out-of-range field values are masked to their width.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), Self::LEN)?;
        buf[0] = self.opcode.0;
        buf[1] =
            (u8::from(self.se) << 7) | (u8::from(self.m) << 6) | ((self.pad_count & 0x3) << 4) | (self.tver & 0x0f);
        be::put_u16(buf, 2, self.p_key);
        buf[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6) | (self.resv6a & 0x3f);
        be::put_u24(buf, 5, self.dest_qp & QPN_MASK);
        buf[8] = (u8::from(self.ack_req) << 7) | (self.resv7 & 0x7f);
        be::put_u24(buf, 9, self.psn.value());
        Ok(Self::LEN)
    }
}

/// Datagram Extended Transport Header (IBA vol. 1 §9.3.2 (unconfirmed)), 8 octets, on UD packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Q_Key: the receiving UD QP's key (QP1, the GSI: [`super::GSI_QKEY`]).
    pub q_key: u32,
    /// Resv8: reserved, 0 on send.
    pub resv8: u8,
    /// SrcQP: the sending QP (24 bits).
    pub src_qp: u32,
}

impl Deth {
    /// Octets of a DETH on the wire.
    pub const LEN: usize = 8;

    /// Parses the 8 DETH octets at the front of `b`, returning the header and the octets after it.
    pub fn parse(b: &[u8]) -> Result<(Deth, &[u8]), Truncated> {
        let (h, rest) = take("DETH", b, Self::LEN)?;
        Ok((
            Deth {
                q_key: be::u32_at(h, 0),
                resv8: h[4],
                src_qp: be::u24_at(h, 5),
            },
            rest,
        ))
    }

    /// Writes the 8 DETH octets at the front of `buf` (SrcQP masked to 24 bits), returning the octets written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), Self::LEN)?;
        be::put_u32(buf, 0, self.q_key);
        buf[4] = self.resv8;
        be::put_u24(buf, 5, self.src_qp & QPN_MASK);
        Ok(Self::LEN)
    }
}

/// RDMA Extended Transport Header (IBA vol. 1 §9.3.3), 16 octets: on RDMA WRITE FIRST/ONLY
/// (and ONLY with immediate) and on RDMA READ REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Virtual Address of the remote buffer.
    pub va: u64,
    /// R_Key of the remote region.
    pub r_key: u32,
    /// DMA Length: octets of the whole message (Write) or to read (Read request).
    pub dma_len: u32,
}

impl Reth {
    /// Octets of a RETH on the wire.
    pub const LEN: usize = 16;

    /// Parses the 16 RETH octets at the front of `b`, returning the header and the octets after it.
    pub fn parse(b: &[u8]) -> Result<(Reth, &[u8]), Truncated> {
        let (h, rest) = take("RETH", b, Self::LEN)?;
        Ok((
            Reth {
                va: be::u64_at(h, 0),
                r_key: be::u32_at(h, 8),
                dma_len: be::u32_at(h, 12),
            },
            rest,
        ))
    }

    /// Writes the 16 RETH octets at the front of `buf`, returning the octets written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), Self::LEN)?;
        be::put_u64(buf, 0, self.va);
        be::put_u32(buf, 8, self.r_key);
        be::put_u32(buf, 12, self.dma_len);
        Ok(Self::LEN)
    }
}

/// Atomic Extended Transport Header (IBA vol. 1 §9.3.4 (unconfirmed)), 28 octets: on COMPARE_SWAP and
/// FETCH_ADD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEth {
    /// Virtual Address of the 8-octet remote operand (8-octet aligned).
    pub va: u64,
    /// R_Key of the remote region.
    pub r_key: u32,
    /// Swap Data (CmpSwap) or Add Data (FetchAdd).
    pub swap_add_data: u64,
    /// Compare Data (CmpSwap; ignored by FetchAdd).
    pub compare_data: u64,
}

impl AtomicEth {
    /// Octets of an AtomicETH on the wire.
    pub const LEN: usize = 28;

    /// Parses the 28 AtomicETH octets at the front of `b`, returning the header and the octets after it.
    pub fn parse(b: &[u8]) -> Result<(AtomicEth, &[u8]), Truncated> {
        let (h, rest) = take("AtomicETH", b, Self::LEN)?;
        Ok((
            AtomicEth {
                va: be::u64_at(h, 0),
                r_key: be::u32_at(h, 8),
                swap_add_data: be::u64_at(h, 12),
                compare_data: be::u64_at(h, 20),
            },
            rest,
        ))
    }

    /// Writes the 28 AtomicETH octets at the front of `buf`, returning the octets written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), Self::LEN)?;
        be::put_u64(buf, 0, self.va);
        be::put_u32(buf, 8, self.r_key);
        be::put_u64(buf, 12, self.swap_add_data);
        be::put_u64(buf, 20, self.compare_data);
        Ok(Self::LEN)
    }
}

/// Atomic Acknowledge Extended Transport Header (IBA vol. 1 §9.3.6 (unconfirmed)), 8 octets: on
/// ATOMIC_ACKNOWLEDGE, after the AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEth {
    /// Original Remote Data: the operand's value before the operation.
    pub orig_rem_dt: u64,
}

impl AtomicAckEth {
    /// Octets of an AtomicAckETH on the wire.
    pub const LEN: usize = 8;

    /// Parses the 8 AtomicAckETH octets at the front of `b`, returning the header and the octets after it.
    pub fn parse(b: &[u8]) -> Result<(AtomicAckEth, &[u8]), Truncated> {
        let (h, rest) = take("AtomicAckETH", b, Self::LEN)?;
        Ok((
            AtomicAckEth {
                orig_rem_dt: be::u64_at(h, 0),
            },
            rest,
        ))
    }

    /// Writes the 8 AtomicAckETH octets at the front of `buf`, returning the octets written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), Self::LEN)?;
        be::put_u64(buf, 0, self.orig_rem_dt);
        Ok(Self::LEN)
    }
}

/// Immediate Extended Transport Header (IBA vol. 1 §9.3.7 (unconfirmed)), 4 octets: on the last/only
/// packet of SEND and RDMA WRITE with immediate. The value is opaque; this is the octets
/// read big-endian (rdma-core's `imm_data` is the same four octets, `__be32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ImmDt {
    /// Immediate Data: the four octets read big-endian.
    pub imm: u32,
}

impl ImmDt {
    /// Octets of an ImmDt on the wire.
    pub const LEN: usize = 4;

    /// Parses the 4 ImmDt octets at the front of `b`, returning the header and the octets after it.
    pub fn parse(b: &[u8]) -> Result<(ImmDt, &[u8]), Truncated> {
        let (h, rest) = take("ImmDt", b, Self::LEN)?;
        Ok((ImmDt { imm: be::u32_at(h, 0) }, rest))
    }

    /// Writes the 4 ImmDt octets at the front of `buf` (big-endian), returning the octets written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), Self::LEN)?;
        be::put_u32(buf, 0, self.imm);
        Ok(Self::LEN)
    }
}

/// Invalidate Extended Transport Header (IBA vol. 1 §9.3.8 (unconfirmed)), 4 octets: on SEND LAST/ONLY
/// with invalidate, the R_Key the responder invalidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ieth {
    /// R_Key: the remote key the responder invalidates.
    pub r_key: u32,
}

impl Ieth {
    /// Octets of an IETH on the wire.
    pub const LEN: usize = 4;

    /// Parses the 4 IETH octets at the front of `b`, returning the header and the octets after it.
    pub fn parse(b: &[u8]) -> Result<(Ieth, &[u8]), Truncated> {
        let (h, rest) = take("IETH", b, Self::LEN)?;
        Ok((
            Ieth {
                r_key: be::u32_at(h, 0),
            },
            rest,
        ))
    }

    /// Writes the 4 IETH octets at the front of `buf`, returning the octets written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), Self::LEN)?;
        be::put_u32(buf, 0, self.r_key);
        Ok(Self::LEN)
    }
}

/// ACK Extended Transport Header (IBA vol. 1 §9.3.5 (unconfirmed)), 4 octets: on ACKNOWLEDGE, ATOMIC
/// ACKNOWLEDGE and RDMA READ RESPONSE FIRST/LAST/ONLY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aeth {
    /// Syndrome: ACK, RNR NAK or NAK with its credit count, timer or code.
    pub syndrome: Syndrome,
    /// MSN: message sequence number, the count of completed requests (24 bits, §9.7.5.1, unconfirmed).
    pub msn: u32,
}

impl Aeth {
    /// Octets of an AETH on the wire.
    pub const LEN: usize = 4;

    /// Parses the 4 AETH octets at the front of `b`, returning the header and the octets after it.
    pub fn parse(b: &[u8]) -> Result<(Aeth, &[u8]), Truncated> {
        let (h, rest) = take("AETH", b, Self::LEN)?;
        Ok((
            Aeth {
                syndrome: Syndrome::from(h[0]),
                msn: be::u24_at(h, 1),
            },
            rest,
        ))
    }

    /// Writes the 4 AETH octets at the front of `buf` (MSN masked to 24 bits), returning the octets written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        need(buf.len(), Self::LEN)?;
        buf[0] = u8::from(self.syndrome);
        be::put_u24(buf, 1, self.msn & QPN_MASK);
        Ok(Self::LEN)
    }
}

/// The AETH Syndrome (IBA vol. 1 §9.3.5 (unconfirmed), "AETH Syndrome field" table): bit 7
/// reserved, bits 6..5 the type (00 ACK, 01 RNR NAK, 11 NAK), bits 4..0 the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK with the end-to-end credit count code.
    Ack {
        /// The end-to-end credit count code (bits 4..0).
        credits: CreditCode,
    },
    /// Receiver Not Ready NAK with the minimum time to wait before retrying.
    RnrNak {
        /// The RNR NAK timer code (bits 4..0).
        timer: RnrTimer,
    },
    /// NAK with its code.
    Nak(NakCode),
    /// Type 10b or bit 7 set: reserved encodings, kept raw.
    Reserved(u8),
}

impl Syndrome {
    /// ACK with "invalid" credits (code 31): what rxe sends (lab capture frame 10: 0x1f).
    pub const ACK: Syndrome = Syndrome::Ack {
        credits: CreditCode::INVALID,
    };

    /// The syndrome is an ACK (type 00b), not an RNR NAK, a NAK or a reserved encoding.
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

impl From<u8> for Syndrome {
    #[inline]
    fn from(v: u8) -> Syndrome {
        let value = v & 0x1f;
        match v >> 5 {
            0b000 => Syndrome::Ack {
                credits: CreditCode(value),
            },
            0b001 => Syndrome::RnrNak { timer: RnrTimer(value) },
            0b011 => Syndrome::Nak(NakCode::from(value)),
            _ => Syndrome::Reserved(v),
        }
    }
}

impl From<Syndrome> for u8 {
    #[inline]
    fn from(s: Syndrome) -> u8 {
        match s {
            Syndrome::Ack { credits } => credits.0 & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer.0 & 0x1f),
            Syndrome::Nak(code) => 0x60 | (u8::from(code) & 0x1f),
            Syndrome::Reserved(v) => v,
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syndrome::Ack { credits } => match credits.credits() {
                Some(n) => write!(f, "ACK ({n} credits)"),
                None => write!(f, "ACK (credits invalid)"),
            },
            Syndrome::RnrNak { timer } => write!(f, "RNR NAK ({} us)", timer.micros()),
            Syndrome::Nak(c) => write!(f, "NAK ({c:?})"),
            Syndrome::Reserved(v) => write!(f, "reserved syndrome {v:#04x}"),
        }
    }
}

/// The NAK codes of the AETH syndrome (IBA vol. 1 §9.7.5.2; AETH §9.3.5 (unconfirmed)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error; the AETH's PSN (in the BTH) is the one the responder expects.
    PsnSequenceError,
    /// 1: invalid request (unsupported opcode, bad length, opcode sequence error).
    InvalidRequest,
    /// 2: remote access error (R_Key, bounds, rights).
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request (reliable datagram only).
    InvalidRdRequest,
    /// 5..=31: reserved.
    Reserved(u8),
}

impl From<u8> for NakCode {
    fn from(v: u8) -> NakCode {
        match v & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            n => NakCode::Reserved(n),
        }
    }
}

impl From<NakCode> for u8 {
    fn from(c: NakCode) -> u8 {
        match c {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(n) => n & 0x1f,
        }
    }
}

/// The 5-bit end-to-end credit count code of an ACK (IBA vol. 1 §9.7.7 (unconfirmed); the same table
/// Linux rdmavt/qib carry as `credit_table`). Code 31 means "credits invalid": the
/// responder does not do end-to-end flow control (rxe always sends it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CreditCode(pub u8);

/// Credits per code 0..=30.
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
    8192, 12288, 16384, 24576, 32768,
];

impl CreditCode {
    /// Code 31: the responder announces no credit count (no end-to-end flow control).
    pub const INVALID: CreditCode = CreditCode(31);

    /// Receive WQEs the code announces, `None` for 31 (invalid).
    pub fn credits(self) -> Option<u32> {
        CREDITS.get(usize::from(self.0 & 0x1f)).copied()
    }

    /// The largest code whose count does not exceed `n` (what a responder with `n` posted
    /// receives announces).
    pub fn for_credits(n: u32) -> CreditCode {
        // The table rises strictly from 0: the codes whose count is <= n are a prefix of
        // it, never empty. A binary search (5 steps), not a scan from the top: every
        // request packet's ACK is built with this (31 steps for a Write's, which has no
        // receive posted; issue 13).
        let i = CREDITS.partition_point(|&c| c <= n).saturating_sub(1);
        CreditCode(i as u8)
    }
}

/// The RNR NAK timer code (IBA vol. 1 §9.7.5.2.8 and release 1.3 table 45 "Encoding for RNR NAK Timer
/// Field"): 5 bits, the minimum delay before the requester retries. Also the QP attribute
/// `min_rnr_timer` (rdma-core's `IBV_RNR_TIMER_*` names the same codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RnrTimer(pub u8);

/// Table 45 in microseconds, indexed by code. Code 0 is the longest, 655.36 ms. (Linux rxe's
/// `rnrnak_usec` has 61410 for code 25; the table says 61.44 ms.)
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120, 7_680,
    10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// The delay this code stands for, in microseconds.
    pub fn micros(self) -> u32 {
        RNR_TIMER_US[usize::from(self.0 & 0x1f)]
    }

    /// The smallest code whose delay is at least `us`; above 491.52 ms (code 31) only code 0,
    /// 655.36 ms, is longer.
    pub fn at_least(us: u32) -> RnrTimer {
        (1u8..=31)
            .find(|&c| RNR_TIMER_US[usize::from(c)] >= us)
            .map_or(RnrTimer(0), RnrTimer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Lab capture frame 11 (rxe's RDMA READ REQUEST, `testdata/host-br0-roce-cm.pcap`):
    /// BTH + RETH.
    const READ_REQ: [u8; 28] = [
        0x0c, 0x00, 0xff, 0xff, 0x00, 0x9e, 0x15, 0x11, 0x80, 0x7c, 0x85, 0x41, // BTH
        0x00, 0x00, 0x7f, 0x00, 0x2d, 0x2d, 0x10, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x25, // RETH
    ];

    #[test]
    fn bth_fields_of_a_read_request_c3() {
        // C3: BTH layout (opcode, SE, M, pad, TVer, P_Key, FECN/BECN, dest QPN, A, PSN).
        let (bth, rest) = Bth::parse(&READ_REQ).unwrap();
        assert_eq!(bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
        assert_eq!((bth.se, bth.m, bth.pad_count, bth.tver), (false, false, 0, 0));
        assert_eq!(bth.p_key, 0xffff);
        assert_eq!(bth.dest_qp, 0x9e1511);
        assert!(bth.ack_req);
        assert_eq!(bth.psn.value(), 0x7c8541);
        let (reth, rest) = Reth::parse(rest).unwrap();
        assert!(rest.is_empty());
        assert_eq!(
            reth,
            Reth {
                va: 0x7f00_2d2d_1000,
                r_key: 0x1234,
                dma_len: 37
            }
        );
        let mut out = [0xa5u8; 28];
        bth.emit(&mut out).unwrap();
        reth.emit(&mut out[12..]).unwrap();
        assert_eq!(out, READ_REQ);
    }

    #[test]
    fn truncated_and_small_buffers_are_errors() {
        for len in 0..Bth::LEN {
            assert_eq!(
                Bth::parse(&READ_REQ[..len]).unwrap_err(),
                Truncated {
                    what: "BTH",
                    need: 12,
                    have: len
                }
            );
        }
        assert!(AtomicEth::parse(&[0; 27]).is_err());
        assert_eq!(
            Reth::default().emit(&mut [0; 15]),
            Err(BufferTooSmall { need: 16, have: 15 })
        );
    }

    #[test]
    fn syndrome_encodings_c3() {
        // C3 (AETH on ACKs): rxe's ACK in the lab capture is 0x1f, its PSN NAK 0x60.
        assert_eq!(Syndrome::from(0x1f), Syndrome::ACK);
        assert_eq!(Syndrome::from(0x60), Syndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(Syndrome::from(0x61), Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(Syndrome::from(0x62), Syndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(Syndrome::from(0x63), Syndrome::Nak(NakCode::RemoteOperationalError));
        assert_eq!(Syndrome::from(0x64), Syndrome::Nak(NakCode::InvalidRdRequest));
        assert_eq!(Syndrome::from(0x65), Syndrome::Nak(NakCode::Reserved(5)));
        assert_eq!(Syndrome::from(0x2e), Syndrome::RnrNak { timer: RnrTimer(14) });
        assert_eq!(Syndrome::from(0x40), Syndrome::Reserved(0x40));
        assert_eq!(Syndrome::from(0x9f), Syndrome::Reserved(0x9f));
        for v in 0..=255u8 {
            assert_eq!(u8::from(Syndrome::from(v)), v, "{v:#x}");
        }
    }

    #[test]
    fn rnr_timer_table_45() {
        assert_eq!(RnrTimer(0).micros(), 655_360);
        assert_eq!(RnrTimer(1).micros(), 10);
        assert_eq!(RnrTimer(14).micros(), 1_280);
        assert_eq!(RnrTimer(25).micros(), 61_440);
        assert_eq!(RnrTimer(31).micros(), 491_520);
        // increasing from code 1 to 31
        assert!(RNR_TIMER_US[1..].windows(2).all(|w| w[0] < w[1]));
        assert_eq!(RnrTimer::at_least(1), RnrTimer(1));
        assert_eq!(RnrTimer::at_least(1_000), RnrTimer(14));
        assert_eq!(RnrTimer::at_least(491_520), RnrTimer(31));
        assert_eq!(RnrTimer::at_least(500_000), RnrTimer(0));
    }

    #[test]
    fn credit_codes() {
        assert_eq!(CreditCode(0).credits(), Some(0));
        assert_eq!(CreditCode(5).credits(), Some(6));
        assert_eq!(CreditCode(30).credits(), Some(32768));
        assert_eq!(CreditCode::INVALID.credits(), None);
        assert_eq!(CreditCode::for_credits(7), CreditCode(5));
        assert_eq!(CreditCode::for_credits(100_000), CreditCode(30));
        // The definition, by a scan, at every count up to past the last code and at the top.
        for n in (0..40_000).chain([u32::MAX - 1, u32::MAX]) {
            let want = CREDITS.iter().rposition(|&c| c <= n).unwrap();
            assert_eq!(CreditCode::for_credits(n), CreditCode(want as u8), "{n}");
            assert!(CreditCode::for_credits(n).credits().unwrap() <= n);
        }
    }

    fn arb_bth() -> impl Strategy<Value = Bth> {
        (
            any::<u8>(),
            (any::<bool>(), any::<bool>(), 0u8..4, 0u8..16),
            any::<u16>(),
            (any::<bool>(), any::<bool>(), 0u8..64),
            0u32..1 << 24,
            (any::<bool>(), 0u8..128),
            0u32..1 << 24,
        )
            .prop_map(
                |(op, (se, m, pad, tver), p_key, (fecn, becn, r6), qp, (a, r7), psn)| Bth {
                    opcode: Opcode(op),
                    se,
                    m,
                    pad_count: pad,
                    tver,
                    p_key,
                    fecn,
                    becn,
                    resv6a: r6,
                    dest_qp: qp,
                    ack_req: a,
                    resv7: r7,
                    psn: Psn::new(psn),
                },
            )
    }

    /// parse(emit(h)) == h, and emit(parse(bytes)) == bytes, for one header type.
    macro_rules! round_trip {
        ($name:ident, $ty:ty, $strat:expr) => {
            proptest! {
                #[test]
                fn $name(h in $strat, tail in proptest::collection::vec(any::<u8>(), 0..8)) {
                    let mut buf = vec![0u8; <$ty>::LEN];
                    prop_assert_eq!(h.emit(&mut buf), Ok(<$ty>::LEN));
                    buf.extend_from_slice(&tail);
                    let (back, rest) = <$ty>::parse(&buf).unwrap();
                    prop_assert_eq!(back, h);
                    prop_assert_eq!(rest, &tail[..]);
                    let mut again = vec![0u8; <$ty>::LEN];
                    back.emit(&mut again).unwrap();
                    prop_assert_eq!(&again[..], &buf[..<$ty>::LEN]);
                }
            }
        };
    }

    round_trip!(bth_round_trip, Bth, arb_bth());
    round_trip!(
        deth_round_trip,
        Deth,
        (any::<u32>(), any::<u8>(), 0u32..1 << 24).prop_map(|(q_key, resv8, src_qp)| Deth { q_key, resv8, src_qp })
    );
    round_trip!(
        reth_round_trip,
        Reth,
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, r_key, dma_len)| Reth { va, r_key, dma_len })
    );
    round_trip!(
        atomic_eth_round_trip,
        AtomicEth,
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(va, r_key, s, c)| {
            AtomicEth {
                va,
                r_key,
                swap_add_data: s,
                compare_data: c,
            }
        })
    );
    round_trip!(
        atomic_ack_eth_round_trip,
        AtomicAckEth,
        any::<u64>().prop_map(|orig_rem_dt| AtomicAckEth { orig_rem_dt })
    );
    round_trip!(imm_dt_round_trip, ImmDt, any::<u32>().prop_map(|imm| ImmDt { imm }));
    round_trip!(ieth_round_trip, Ieth, any::<u32>().prop_map(|r_key| Ieth { r_key }));
    round_trip!(
        aeth_round_trip,
        Aeth,
        (any::<u8>(), 0u32..1 << 24).prop_map(|(s, msn)| Aeth {
            syndrome: Syndrome::from(s),
            msn
        })
    );

    proptest! {
        /// Every 12 octets are a BTH, and emit gives them back (reserved bits included).
        #[test]
        fn any_bth_octets_round_trip(b in proptest::array::uniform12(any::<u8>())) {
            let (bth, _) = Bth::parse(&b).unwrap();
            let mut out = [0u8; 12];
            bth.emit(&mut out).unwrap();
            prop_assert_eq!(out, b);
        }
    }
}
