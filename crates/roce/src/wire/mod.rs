//! RoCEv2 wire formats: InfiniBand transport headers in UDP (IBA vol. 1 ch. 9, annex A17),
//! sans-I/O: parse and emit on byte slices only.
//!
//! Bottom to top:
//! - [`headers`]: the base transport header ([`Bth`], IBA vol. 1 §9.2) and the extended
//!   transport headers ([`Reth`], [`Aeth`], [`AtomicEth`], [`AtomicAckEth`], [`ImmDt`],
//!   [`Ieth`], [`Deth`], §9.3), each with `LEN`, `parse(&[u8]) -> (Self, rest)` and `emit`.
//! - [`opcode`]: the opcode table (RC, UD SEND_ONLY(_IMM), the RoCEv2 CNP) as data: which
//!   headers follow, the position in a message, payload, request or response, what answers
//!   it. Packet parsing, packet building and the receive checks all read this one table, as
//!   Linux rxe's `rxe_opcode.c` does.
//! - [`packet`]: a whole UDP payload (BTH, extension headers, payload, pad, ICRC) as
//!   [`Packet`], with a typed error for every malformed case, and its emitter.
//! - [`lean`]: the same parse and header emit, specialised for the data path's opcodes
//!   (BTH alone or with one ImmDt, RETH or AETH), tested equal to the generic ones.
//! - [`icrc`]: the invariant CRC exactly as rxe computes it (masked IP/UDP/BTH fields).
//! - [`psn`]: PSN arithmetic modulo 2^24.
//! - [`segment`]: path-MTU segmentation into FIRST/MIDDLE/LAST/ONLY and pad counts.
//!
//! No module here allocates on the data path, performs I/O, reads a clock or logs. Every
//! length that comes from a peer is checked before use; nothing panics on peer input.
//!
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` C3 (RoCEv2, BTH and extension
//! headers, RC opcodes, path MTU); the lab README's "RoCEv2 from the host" for the measured
//! ICRC rules.

mod crc_short;
pub mod headers;
pub mod icrc;
pub mod lean;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod segment;

pub use headers::{Aeth, AtomicAckEth, AtomicEth, Bth, Deth, Ieth, ImmDt, NakCode, Reth, RnrTimer, Syndrome};
pub use opcode::{HeaderSet, OpInfo, Opcode, Operation, Position, Transport};
pub use packet::{EmitError, ExtHeaders, Packet, ParseError};
pub use psn::Psn;

/// UDP destination port of RoCEv2 (IBA annex A17 §A17.3.2.2 CA17-20; IANA service name "roce").
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;
/// The Q_Key of the general services interface, QP1 (IBA vol. 1 ch. 13; requirements C1:
/// CM MADs use it).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The default partition key, full membership (IBA vol. 1 ch. 10, §10.9 unconfirmed; annex A17 §A17.4.7).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Whether a packet's P_Key `a` is accepted by a QP whose P_Key is `b` (IBA vol. 1 §10.9 (unconfirmed),
/// partition key matching): the same 15-bit partition, and at least one of the two a full
/// member (bit 15). Two limited members of a partition cannot talk; 0x7fff reaches a QP
/// holding 0xffff. rxe's receive check is the same (`pkey_match`).
pub fn pkey_match(a: u16, b: u16) -> bool {
    a & 0x7fff == b & 0x7fff && (a | b) & 0x8000 != 0
}

/// A header or packet is shorter than its fixed layout (peer input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{what} needs {need} octets, {have} present")]
pub struct Truncated {
    /// The header or packet being parsed ("BTH", "RETH", ...).
    pub what: &'static str,
    /// Octets its layout needs.
    pub need: usize,
    /// Octets present.
    pub have: usize,
}

/// An emit buffer was too small (a local bug, never peer input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("emit buffer of {have} octets, {need} needed")]
pub struct BufferTooSmall {
    /// Octets the emit needs.
    pub need: usize,
    /// Octets the buffer has.
    pub have: usize,
}

pub(crate) const fn need(have: usize, need: usize) -> Result<(), BufferTooSmall> {
    if have < need {
        Err(BufferTooSmall { need, have })
    } else {
        Ok(())
    }
}

/// Big-endian field access; the caller has checked the length. Inline, with one bounds
/// check per field: they are called for every field of every packet (issue 13, session 17:
/// out of line, a RETH's three fields cost ~125 instructions to read).
pub(crate) mod be {
    #[inline]
    fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&b[at..at + N]);
        a
    }
    #[inline]
    pub fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes(arr(b, at))
    }
    #[inline]
    pub fn u24_at(b: &[u8], at: usize) -> u32 {
        let [x, y, z] = arr(b, at);
        u32::from_be_bytes([0, x, y, z])
    }
    #[inline]
    pub fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(arr(b, at))
    }
    #[inline]
    pub fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_be_bytes(arr(b, at))
    }
    #[inline]
    pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn put_u24(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    #[inline]
    pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod pkey_tests {
    use super::pkey_match;

    #[test]
    fn p_key_matching_ibta_10_9() {
        assert!(pkey_match(0xffff, 0xffff));
        assert!(pkey_match(0x7fff, 0xffff), "limited to full");
        assert!(pkey_match(0xffff, 0x7fff), "full to limited");
        assert!(!pkey_match(0x7fff, 0x7fff), "two limited members");
        assert!(!pkey_match(0x8001, 0xffff), "another partition");
        assert!(!pkey_match(0x1234, 0xffff));
    }
}
