//! The common LLC header (A1.8): octet 0 type (v2: version 2 in the high nibble), the
//! length (v1: octet 1; v2: octets 1–2, little-endian as Linux's x86 sends it), octet 3
//! flags; the opcode classes of a SEND's first octet; and the octet helpers every message
//! family uses.

use super::error::LlcError;

/// Length of every v1 LLC message (and the minimum of a v2 one).
pub const LLC_LEN: usize = 44;
/// Largest v2 LLC message we parse (Linux's v2 buffer is 8 KiB).
pub const LLC_V2_MAX_LEN: usize = 8192;
/// Reply flag (octet 3).
pub const FLAG_REPLY: u8 = 0x80;

/// LLC opcodes (A1.8; v2 = 0x20 | opcode).
#[allow(missing_docs)]
pub mod opcode {
    pub const CONFIRM_LINK: u8 = 0x01;
    pub const ADD_LINK: u8 = 0x02;
    pub const ADD_LINK_CONT: u8 = 0x03;
    pub const DELETE_LINK: u8 = 0x04;
    /// Linux SMC-Rv2 only (0x25): the client asks the server to add a link.
    pub const REQ_ADD_LINK: u8 = 0x05;
    pub const CONFIRM_RKEY: u8 = 0x06;
    pub const TEST_LINK: u8 = 0x07;
    pub const CONFIRM_RKEY_CONT: u8 = 0x08;
    pub const DELETE_RKEY: u8 = 0x09;
    pub const CDC: u8 = 0xFE;
}

/// What a received SEND's first octet says (A1.8 opcode classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A known LLC message.
    Llc,
    /// A CDC message (0xFE).
    Cdc,
    /// Unknown optional LLC (0x80–0xBF): silently discard.
    UnknownOptional,
    /// Unknown mandatory (0x00–0x7F) or unknown 0xC0–0xFF: protocol error.
    UnknownMandatory,
}

/// Classifies a SEND by its first octet.
pub fn classify(first: u8) -> Class {
    if first == opcode::CDC {
        return Class::Cdc;
    }
    if known(first).is_some() {
        return Class::Llc;
    }
    if first & 0xC0 == 0x80 {
        Class::UnknownOptional
    } else {
        Class::UnknownMandatory
    }
}

/// The version and v1 opcode of a known type octet.
pub(super) fn known(t: u8) -> Option<(LlcVersion, u8)> {
    use opcode::*;
    let (v, op) = if t & 0xF0 == 0x20 {
        (LlcVersion::V2, t & 0x0F)
    } else {
        (LlcVersion::V1, t)
    };
    let ok = match v {
        LlcVersion::V1 => matches!(
            op,
            CONFIRM_LINK
                | ADD_LINK
                | ADD_LINK_CONT
                | DELETE_LINK
                | CONFIRM_RKEY
                | TEST_LINK
                | CONFIRM_RKEY_CONT
                | DELETE_RKEY
        ),
        LlcVersion::V2 => matches!(
            op,
            CONFIRM_LINK | ADD_LINK | DELETE_LINK | REQ_ADD_LINK | CONFIRM_RKEY | TEST_LINK | DELETE_RKEY
        ),
    };
    ok.then_some((v, op))
}

/// LLC message format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LlcVersion {
    /// RFC 7609 (44 octets, length in one octet).
    #[default]
    V1,
    /// Linux SMC-Rv2.
    V2,
}

/// The header of a received message.
pub(super) struct Header {
    /// Format version.
    pub(super) version: LlcVersion,
    /// The v1 opcode.
    pub(super) op: u8,
    /// The message's length (44 in v1; v2: 44..=8192 and within the buffer).
    pub(super) len: usize,
    /// Octet 3, the reply flag included.
    pub(super) flags: u8,
}

impl Header {
    /// Reads and checks the header of the message at the start of `buf` (which may be
    /// longer than the message).
    pub(super) fn parse(buf: &[u8]) -> Result<Self, LlcError> {
        let Some(&t) = buf.first() else {
            return Err(LlcError::Truncated { need: LLC_LEN, have: 0 });
        };
        let (version, op) = match classify(t) {
            Class::Llc => known(t).ok_or(LlcError::UnknownMandatory(t))?,
            Class::Cdc => return Err(LlcError::Cdc),
            Class::UnknownOptional => return Err(LlcError::UnknownOptional(t)),
            Class::UnknownMandatory => return Err(LlcError::UnknownMandatory(t)),
        };
        if buf.len() < LLC_LEN {
            return Err(LlcError::Truncated {
                need: LLC_LEN,
                have: buf.len(),
            });
        }
        let len = match version {
            LlcVersion::V1 => usize::from(buf[1]),
            LlcVersion::V2 => usize::from(u16::from_le_bytes([buf[1], buf[2]])),
        };
        if version == LlcVersion::V1 && len != LLC_LEN || !(LLC_LEN..=LLC_V2_MAX_LEN).contains(&len) {
            return Err(LlcError::BadLength(len));
        }
        if buf.len() < len {
            return Err(LlcError::Truncated {
                need: len,
                have: buf.len(),
            });
        }
        Ok(Self {
            version,
            op,
            len,
            flags: buf[3],
        })
    }

    /// Whether the reply flag is set.
    pub(super) fn reply(&self) -> bool {
        self.flags & FLAG_REPLY != 0
    }

    /// Writes type and length into `b` (exactly the message's octets; its caller checked
    /// that `b.len()` fits the version's length field).
    pub(super) fn emit_type_len(b: &mut [u8], version: LlcVersion, op: u8) {
        match version {
            LlcVersion::V2 => {
                let len = b.len() as u16;
                b[0] = 0x20 | op;
                b[1..3].copy_from_slice(&len.to_le_bytes());
            }
            LlcVersion::V1 => {
                b[0] = op;
                b[1] = LLC_LEN as u8;
            }
        }
    }
}

pub(super) fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}
pub(super) fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}
pub(super) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(arr(b))
}
pub(super) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(arr(b))
}
pub(super) fn put_be24(b: &mut [u8], v: u32) {
    b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
}
