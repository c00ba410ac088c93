//! The common CLC header and trailer (RFC 7609 A1.3, A1.6; Linux's v2 header), and the
//! octet helpers every message uses.
//!
//! Octets 0..4 eyecatcher ("SMCR"/"SMCD" in EBCDIC), 4 type, 5..7 length (the whole
//! message, trailer included), 7 version (high nibble) and flags (low nibble); the last four
//! octets repeat an eyecatcher.

use super::{
    ACCEPT_CONFIRM_V1_LEN, ClcEmitError, ClcError, DECLINE_V1_LEN, EYECATCHER_SMCD, EYECATCHER_SMCR,
    FIXED_PROPOSAL_LEN, HEADER_LEN, MAX_LEN, TRAILER_LEN,
};

/// CLC message types (A1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ClcType {
    /// Proposal (client → server).
    Proposal = 1,
    /// Accept (server → client).
    Accept = 2,
    /// Confirm (client → server).
    Confirm = 3,
    /// Decline (either side).
    Decline = 4,
}

impl ClcType {
    /// The type for an octet value.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Proposal,
            2 => Self::Accept,
            3 => Self::Confirm,
            4 => Self::Decline,
            _ => return None,
        })
    }
}

/// Which eyecatcher a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Eyecatcher {
    /// "SMCR".
    #[default]
    Smcr,
    /// "SMCD" (Linux, SMC-D).
    Smcd,
}

impl Eyecatcher {
    /// The four octets.
    pub fn bytes(self) -> [u8; 4] {
        match self {
            Self::Smcr => EYECATCHER_SMCR,
            Self::Smcd => EYECATCHER_SMCD,
        }
    }
    pub(super) fn from_bytes(b: &[u8]) -> Option<Self> {
        if b == EYECATCHER_SMCR {
            Some(Self::Smcr)
        } else if b == EYECATCHER_SMCD {
            Some(Self::Smcd)
        } else {
            None
        }
    }
}

/// The 2-bit SMC type of Linux's v2 header (`typev1`, `typev2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SmcType {
    /// SMC-R only (0).
    #[default]
    R,
    /// SMC-D only (1).
    D,
    /// Neither (2).
    None,
    /// Both (3).
    Both,
}

impl SmcType {
    /// From the two bits.
    pub fn from_bits(b: u8) -> Self {
        match b & 3 {
            0 => Self::R,
            1 => Self::D,
            2 => Self::None,
            _ => Self::Both,
        }
    }
    /// The two bits.
    pub fn bits(self) -> u8 {
        match self {
            Self::R => 0,
            Self::D => 1,
            Self::None => 2,
            Self::Both => 3,
        }
    }
    /// Whether SMC-R is offered.
    pub fn offers_r(self) -> bool {
        matches!(self, Self::R | Self::Both)
    }
}

/// Peer ID (A1.3, A.2.1): 2-octet instance ID and a RoCE MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PeerId(pub [u8; 8]);

impl PeerId {
    /// From an instance ID and a MAC.
    pub fn new(instance: u16, mac: [u8; 6]) -> Self {
        let mut b = [0; 8];
        b[..2].copy_from_slice(&instance.to_be_bytes());
        b[2..].copy_from_slice(&mac);
        Self(b)
    }
    /// The instance ID.
    pub fn instance(&self) -> u16 {
        u16::from_be_bytes([self.0[0], self.0[1]])
    }
}

/// The common header, as parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Leading eyecatcher.
    pub eyecatcher: Eyecatcher,
    /// Type.
    pub ty: ClcType,
    /// Length field.
    pub length: u16,
    /// Version nibble.
    pub version: u8,
    /// Low nibble of octet 7 (flags; meaning per type and version).
    pub flags: u8,
}

impl Header {
    /// Parses and checks the 8-octet header: eyecatcher, type, version ≠ 0, length within
    /// the type's minimum and [`MAX_LEN`].
    pub fn parse(b: &[u8]) -> Result<Self, ClcError> {
        if b.len() < HEADER_LEN {
            return Err(ClcError::Truncated {
                what: "header",
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        let eyecatcher =
            Eyecatcher::from_bytes(&b[..4]).ok_or(ClcError::BadEyecatcher(b[..4].try_into().unwrap_or_default()))?;
        let ty = ClcType::from_u8(b[4]).ok_or(ClcError::UnknownType(b[4]))?;
        let length = be16(&b[5..7]);
        let version = b[7] >> 4;
        if version == 0 {
            return Err(ClcError::BadVersion);
        }
        let h = Self {
            eyecatcher,
            ty,
            length,
            version,
            flags: b[7] & 0x0f,
        };
        if usize::from(length) > MAX_LEN {
            return Err(ClcError::TooLong(length));
        }
        let min = match ty {
            ClcType::Proposal => FIXED_PROPOSAL_LEN + TRAILER_LEN,
            ClcType::Accept | ClcType::Confirm => ACCEPT_CONFIRM_V1_LEN,
            ClcType::Decline => DECLINE_V1_LEN,
        };
        if usize::from(length) < min {
            return Err(h.bad_length());
        }
        Ok(h)
    }
    pub(super) fn bad_length(&self) -> ClcError {
        ClcError::BadLength {
            ty: self.ty,
            version: self.version,
            length: self.length,
        }
    }
}

pub(super) fn out(buf: &mut [u8], len: usize) -> Result<&mut [u8], ClcEmitError> {
    let have = buf.len();
    if len > MAX_LEN {
        return Err(ClcEmitError::Unrepresentable("message longer than MAX_LEN"));
    }
    buf.get_mut(..len)
        .ok_or(ClcEmitError::BufferTooSmall { need: len, have })
}

pub(super) fn emit_header(
    b: &mut [u8],
    e: Eyecatcher,
    ty: ClcType,
    version: u8,
    flags: u8,
) -> Result<(), ClcEmitError> {
    if version == 0 || version > 15 {
        return Err(ClcEmitError::Unrepresentable("version must be 1..=15"));
    }
    let len = b.len() as u16;
    b[..4].copy_from_slice(&e.bytes());
    b[4] = ty as u8;
    b[5..7].copy_from_slice(&len.to_be_bytes());
    b[7] = (version << 4) | (flags & 0x0f);
    Ok(())
}

pub(super) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
pub(super) fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}
pub(super) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
pub(super) fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}
