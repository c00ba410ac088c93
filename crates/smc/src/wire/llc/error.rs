//! LLC errors: [`LlcError`] for peer input, [`LlcEmitError`] for local values.

/// A malformed or unknown LLC message (peer input; A2.6: protocol error, the link is
/// treated as down — except [`LlcError::UnknownOptional`], which is discarded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlcError {
    /// Fewer octets than the length says or than 44.
    #[error("LLC message needs {need} octets, {have} present")]
    Truncated {
        /// Octets needed.
        need: usize,
        /// Octets present.
        have: usize,
    },
    /// The length field is wrong for the version (v1: not 44; v2: below 44 or too long).
    #[error("LLC length {0} invalid")]
    BadLength(usize),
    /// A CDC message (0xFE), not LLC.
    #[error("a CDC message, not LLC")]
    Cdc,
    /// Unknown optional opcode: discard silently.
    #[error("unknown optional LLC opcode {0:#04x}")]
    UnknownOptional(u8),
    /// Unknown mandatory opcode: protocol error.
    #[error("unknown LLC opcode {0:#04x}")]
    UnknownMandatory(u8),
    /// A count field out of range.
    #[error("LLC {what} count {count} out of range")]
    BadCount {
        /// The field.
        what: &'static str,
        /// Its value.
        count: usize,
    },
}

/// An LLC message could not be emitted (local bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlcEmitError {
    /// Buffer too small.
    #[error("LLC emit needs {need} octets, buffer has {have}")]
    BufferTooSmall {
        /// Octets needed.
        need: usize,
        /// Buffer length.
        have: usize,
    },
    /// A value does not fit the format.
    #[error("LLC emit: {0}")]
    Unrepresentable(&'static str),
}

/// A 24-bit field (QPN, PSN) must fit.
pub(super) fn check24(v: u32) -> Result<(), LlcEmitError> {
    if v > 0xff_ffff {
        Err(LlcEmitError::Unrepresentable("24-bit field above 2^24"))
    } else {
        Ok(())
    }
}
