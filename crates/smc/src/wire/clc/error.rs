//! CLC parse and emit errors.

use super::ClcType;

/// A CLC message could not be parsed (peer input). RFC 7609 C.6: while a CLC message is
/// expected, this is a protocol error answered by a reset, not a fallback.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClcError {
    /// Fewer octets than the layout needs.
    #[error("CLC {what} needs {need} octets, {have} present")]
    Truncated {
        /// What was being parsed.
        what: &'static str,
        /// Octets needed.
        need: usize,
        /// Octets present.
        have: usize,
    },
    /// The leading eyecatcher is neither "SMCR" nor "SMCD" (EBCDIC).
    #[error("bad CLC eyecatcher {0:02x?}")]
    BadEyecatcher([u8; 4]),
    /// The trailing eyecatcher is neither "SMCR" nor "SMCD" (EBCDIC).
    #[error("bad CLC trailer eyecatcher {0:02x?}")]
    BadTrailer([u8; 4]),
    /// The type octet is not 1..=4.
    #[error("unknown CLC message type {0}")]
    UnknownType(u8),
    /// The version nibble is 0.
    #[error("CLC version 0")]
    BadVersion,
    /// The length field does not fit the type and version.
    #[error("CLC {ty:?} of version {version} cannot be {length} octets long")]
    BadLength {
        /// Message type.
        ty: ClcType,
        /// Version nibble.
        version: u8,
        /// Length field.
        length: u16,
    },
    /// The length field exceeds [`MAX_LEN`](super::MAX_LEN).
    #[error("CLC length {0} exceeds the limit")]
    TooLong(u16),
    /// The buffer given to `parse` is not exactly one message.
    #[error("CLC length field says {length}, buffer holds {have}")]
    LengthBufferMismatch {
        /// Length field.
        length: u16,
        /// Buffer length.
        have: usize,
    },
    /// An offset or count points outside the message.
    #[error("CLC {what} lies outside the message")]
    BadOffset {
        /// The area.
        what: &'static str,
    },
    /// More IPv6 prefixes than allowed.
    #[error("CLC Proposal lists {0} IPv6 prefixes (at most 8)")]
    TooManyPrefixes(u8),
    /// More EIDs than allowed.
    #[error("CLC v2 extension lists {0} EIDs (at most 8)")]
    TooManyEids(u8),
    /// An Accept or Confirm for SMC-D: this crate speaks SMC-R only.
    #[error("CLC Accept/Confirm for SMC-D is not supported")]
    SmcD,
}

/// A message could not be emitted (a local bug or a value outside the format).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClcEmitError {
    /// The output buffer is too small.
    #[error("CLC emit needs {need} octets, buffer has {have}")]
    BufferTooSmall {
        /// Octets needed.
        need: usize,
        /// Buffer length.
        have: usize,
    },
    /// A field does not fit the format (list too long, v2 field on a v1 message ...).
    #[error("CLC emit: {0}")]
    Unrepresentable(&'static str),
}
