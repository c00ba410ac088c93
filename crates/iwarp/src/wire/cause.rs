//! Terminate causes: the (Layer, Error Type, Error Code) triples of
//! RFC 5040 §4.8 Fig. 9 (RDMAP), RFC 5041 §7.2 (DDP), RFC 5044 §8 and
//! RFC 6581 §4 (MPA, the LLP), and RFC 7306 §8.
//!
//! Every receive-side check in the wire layer and the engine names the
//! Terminate the receiver must send by returning one of these constants
//! (catalogue `../shared/requirements/rdmap-rpcrdma.md` A.1.6, C.1.4, C.2.7).

use core::fmt;

/// Terminate "Layer" nibble (RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// 0: RDMAP.
    Rdmap,
    /// 1: DDP.
    Ddp,
    /// 2: the lower-layer protocol, here MPA.
    Llp,
    /// Any other nibble value, kept for display and echo.
    Unknown(u8),
}

impl Layer {
    /// The layer a Terminate's Layer nibble names.
    pub const fn from_nibble(v: u8) -> Layer {
        match v & 0xF {
            0 => Layer::Rdmap,
            1 => Layer::Ddp,
            2 => Layer::Llp,
            n => Layer::Unknown(n),
        }
    }
    /// The Layer nibble of the layer.
    pub const fn to_nibble(self) -> u8 {
        match self {
            Layer::Rdmap => 0,
            Layer::Ddp => 1,
            Layer::Llp => 2,
            Layer::Unknown(n) => n & 0xF,
        }
    }
}

/// A Terminate cause: layer, error type (4 bits) and error code (8 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCause {
    /// The layer that detected the error.
    pub layer: Layer,
    /// Error Type (4 bits, per layer: [`etype`]).
    pub etype: u8,
    /// Error Code (8 bits, per layer and type: [`code`]).
    pub code: u8,
}

impl TermCause {
    /// A cause from its three parts.
    pub const fn new(layer: Layer, etype: u8, code: u8) -> Self {
        TermCause {
            layer,
            etype: etype & 0xF,
            code,
        }
    }

    /// Whether RFC 5040 Fig. 10 says a Terminate for this cause carries the
    /// DDP Segment Length and the Terminated DDP header (M and D bits):
    /// RDMAP Remote Protection / Remote Operation and every DDP error do,
    /// Local Catastrophic and LLP errors do not.
    pub const fn carries_ddp_header(&self) -> bool {
        match self.layer {
            Layer::Rdmap => self.etype == etype::RDMAP_REMOTE_PROTECTION || self.etype == etype::RDMAP_REMOTE_OPERATION,
            Layer::Ddp => self.etype != etype::DDP_LOCAL_CATASTROPHIC,
            _ => false,
        }
    }

    /// Human description from the RFC tables.
    pub fn describe(&self) -> &'static str {
        use self::code::*;
        use self::etype::*;
        match (self.layer, self.etype, self.code) {
            (Layer::Rdmap, RDMAP_LOCAL_CATASTROPHIC, _) => "RDMAP local catastrophic error",
            (Layer::Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_INVALID_STAG) => "RDMAP remote protection: invalid STag",
            (Layer::Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_BASE_BOUNDS) => {
                "RDMAP remote protection: base or bounds violation"
            }
            (Layer::Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_ACCESS_RIGHTS) => {
                "RDMAP remote protection: access rights violation"
            }
            (Layer::Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_STAG_NOT_ASSOCIATED) => {
                "RDMAP remote protection: STag not associated with RDMAP stream"
            }
            (Layer::Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_TO_WRAP) => "RDMAP remote protection: TO wrap",
            (Layer::Rdmap, _, RDMAP_STAG_CANNOT_INVALIDATE) => "RDMAP: STag cannot be invalidated",
            (Layer::Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_INVALID_VERSION) => {
                "RDMAP remote operation: invalid RDMAP version"
            }
            (Layer::Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_UNEXPECTED_OPCODE) => {
                "RDMAP remote operation: unexpected opcode"
            }
            (Layer::Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_CATASTROPHIC_STREAM) => {
                "RDMAP remote operation: catastrophic error, localized to RDMAP stream"
            }
            (Layer::Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_CATASTROPHIC_GLOBAL) => {
                "RDMAP remote operation: catastrophic error, global"
            }
            (Layer::Rdmap, _, RDMAP_UNSPECIFIED) => "RDMAP: unspecified error",
            (Layer::Ddp, DDP_LOCAL_CATASTROPHIC, _) => "DDP local catastrophic error",
            (Layer::Ddp, DDP_TAGGED, DDP_T_INVALID_STAG) => "DDP tagged buffer: invalid STag",
            (Layer::Ddp, DDP_TAGGED, DDP_T_BASE_BOUNDS) => "DDP tagged buffer: base or bounds violation",
            (Layer::Ddp, DDP_TAGGED, DDP_T_STAG_NOT_ASSOCIATED) => {
                "DDP tagged buffer: STag not associated with DDP stream"
            }
            (Layer::Ddp, DDP_TAGGED, DDP_T_TO_WRAP) => "DDP tagged buffer: TO wrap",
            (Layer::Ddp, DDP_TAGGED, DDP_T_INVALID_VERSION) => "DDP tagged buffer: invalid DDP version",
            (Layer::Ddp, DDP_UNTAGGED, DDP_U_INVALID_QN) => "DDP untagged buffer: invalid QN",
            (Layer::Ddp, DDP_UNTAGGED, DDP_U_NO_BUFFER) => "DDP untagged buffer: invalid MSN, no buffer available",
            (Layer::Ddp, DDP_UNTAGGED, DDP_U_MSN_RANGE) => "DDP untagged buffer: invalid MSN, MSN range is not valid",
            (Layer::Ddp, DDP_UNTAGGED, DDP_U_INVALID_MO) => "DDP untagged buffer: invalid MO",
            (Layer::Ddp, DDP_UNTAGGED, DDP_U_TOO_LONG) => "DDP untagged buffer: message too long for available buffer",
            (Layer::Ddp, DDP_UNTAGGED, DDP_U_INVALID_VERSION) => "DDP untagged buffer: invalid DDP version",
            (Layer::Llp, _, MPA_CONNECTION_LOST) => "MPA: TCP connection closed, terminated or lost",
            (Layer::Llp, _, MPA_CRC) => "MPA: received MPA CRC does not match the calculated value",
            (Layer::Llp, _, MPA_MARKER) => "MPA: FPDU marker and ULPDU length fields do not match",
            (Layer::Llp, _, MPA_INVALID_REQ_REP) => "MPA: invalid MPA Request or Reply frame",
            (Layer::Llp, _, MPA_LOCAL_CATASTROPHIC) => "MPA: local catastrophic error",
            (Layer::Llp, _, MPA_INSUFFICIENT_IRD) => "MPA: insufficient IRD resources",
            (Layer::Llp, _, MPA_NO_MATCHING_RTR) => "MPA: no matching RTR",
            _ => "unknown or reserved terminate cause",
        }
    }
}

impl fmt::Display for TermCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "layer {}/etype {}/code {:#04x} ({})",
            self.layer.to_nibble(),
            self.etype,
            self.code,
            self.describe()
        )
    }
}

/// Error Type values (4 bits), per layer.
pub mod etype {
    // RDMAP, RFC 5040 §4.8 Fig. 9
    /// Local catastrophic error.
    pub const RDMAP_LOCAL_CATASTROPHIC: u8 = 0x0;
    /// Remote protection error.
    pub const RDMAP_REMOTE_PROTECTION: u8 = 0x1;
    /// Remote operation error.
    pub const RDMAP_REMOTE_OPERATION: u8 = 0x2;
    // DDP, RFC 5041 §7.2
    /// Local catastrophic error.
    pub const DDP_LOCAL_CATASTROPHIC: u8 = 0x0;
    /// Tagged buffer error.
    pub const DDP_TAGGED: u8 = 0x1;
    /// Untagged buffer error.
    pub const DDP_UNTAGGED: u8 = 0x2;
    /// Reserved for use by the LLP.
    pub const DDP_RSVD_LLP: u8 = 0x3;
    // MPA, RFC 5044 §8: the only error type is 0 ("MPA error")
    /// MPA error (the only type).
    pub const MPA: u8 = 0x0;
}

/// Error Code values (8 bits), per layer and type.
pub mod code {
    // RDMAP Remote Protection (etype 1)
    /// Invalid STag.
    pub const RDMAP_INVALID_STAG: u8 = 0x00;
    /// Base or bounds violation.
    pub const RDMAP_BASE_BOUNDS: u8 = 0x01;
    /// Access rights violation.
    pub const RDMAP_ACCESS_RIGHTS: u8 = 0x02;
    /// STag not associated with RDMAP stream.
    pub const RDMAP_STAG_NOT_ASSOCIATED: u8 = 0x03;
    /// TO wrap.
    pub const RDMAP_TO_WRAP: u8 = 0x04;
    // RDMAP Remote Operation (etype 2)
    /// Invalid RDMAP version.
    pub const RDMAP_INVALID_VERSION: u8 = 0x05;
    /// Unexpected OpCode.
    pub const RDMAP_UNEXPECTED_OPCODE: u8 = 0x06;
    /// Catastrophic error, localized to RDMAP stream.
    pub const RDMAP_CATASTROPHIC_STREAM: u8 = 0x07;
    /// Catastrophic error, global.
    pub const RDMAP_CATASTROPHIC_GLOBAL: u8 = 0x08;
    // both etypes
    /// STag cannot be invalidated.
    pub const RDMAP_STAG_CANNOT_INVALIDATE: u8 = 0x09;
    /// Unspecified error.
    pub const RDMAP_UNSPECIFIED: u8 = 0xFF;
    // DDP tagged buffer (etype 1)
    /// Invalid STag.
    pub const DDP_T_INVALID_STAG: u8 = 0x00;
    /// Base or bounds violation.
    pub const DDP_T_BASE_BOUNDS: u8 = 0x01;
    /// STag not associated with DDP stream.
    pub const DDP_T_STAG_NOT_ASSOCIATED: u8 = 0x02;
    /// TO wrap.
    pub const DDP_T_TO_WRAP: u8 = 0x03;
    /// Invalid DDP version.
    pub const DDP_T_INVALID_VERSION: u8 = 0x04;
    // DDP untagged buffer (etype 2)
    /// Invalid QN.
    pub const DDP_U_INVALID_QN: u8 = 0x01;
    /// Invalid MSN: no buffer available.
    pub const DDP_U_NO_BUFFER: u8 = 0x02;
    /// Invalid MSN: MSN range is not valid.
    pub const DDP_U_MSN_RANGE: u8 = 0x03;
    /// Invalid MO.
    pub const DDP_U_INVALID_MO: u8 = 0x04;
    /// DDP message too long for the available buffer.
    pub const DDP_U_TOO_LONG: u8 = 0x05;
    /// Invalid DDP version.
    pub const DDP_U_INVALID_VERSION: u8 = 0x06;
    // MPA (LLP, etype 0), RFC 5044 §8 and RFC 6581 §4
    /// TCP connection closed, terminated or lost.
    pub const MPA_CONNECTION_LOST: u8 = 0x01;
    /// MPA CRC error.
    pub const MPA_CRC: u8 = 0x02;
    /// MPA marker and ULPDU length field mismatch.
    pub const MPA_MARKER: u8 = 0x03;
    /// Invalid MPA Request or Reply.
    pub const MPA_INVALID_REQ_REP: u8 = 0x04;
    /// Local catastrophic error.
    pub const MPA_LOCAL_CATASTROPHIC: u8 = 0x05;
    /// Insufficient IRD resources (RFC 6581).
    pub const MPA_INSUFFICIENT_IRD: u8 = 0x06;
    /// No matching RTR model (RFC 6581).
    pub const MPA_NO_MATCHING_RTR: u8 = 0x07;
}

macro_rules! causes {
    ($($(#[$m:meta])* $name:ident = ($layer:ident, $et:expr, $c:expr);)*) => {
        $( $(#[$m])* pub const $name: TermCause = TermCause::new(Layer::$layer, $et, $c); )*
    };
}

use code::*;
use etype::*;
causes! {
    /// RDMAP local catastrophic error (RFC 5040 §7.1 case 1).
    RDMAP_LOCAL_CATASTROPHIC_ERR = (Rdmap, RDMAP_LOCAL_CATASTROPHIC, 0);
    /// RDMAP remote protection: invalid STag.
    RDMAP_ERR_INVALID_STAG = (Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_INVALID_STAG);
    /// RDMAP remote protection: base or bounds violation.
    RDMAP_ERR_BASE_BOUNDS = (Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_BASE_BOUNDS);
    /// RDMAP remote protection: access rights violation.
    RDMAP_ERR_ACCESS_RIGHTS = (Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_ACCESS_RIGHTS);
    /// RDMAP remote protection: STag not associated with RDMAP stream.
    RDMAP_ERR_STAG_NOT_ASSOCIATED = (Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_STAG_NOT_ASSOCIATED);
    /// RDMAP remote protection: TO wrap.
    RDMAP_ERR_TO_WRAP = (Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_TO_WRAP);
    /// "STag cannot be invalidated", protection flavour (STag exists, not ours).
    RDMAP_ERR_CANNOT_INVALIDATE_PROT = (Rdmap, RDMAP_REMOTE_PROTECTION, RDMAP_STAG_CANNOT_INVALIDATE);
    /// "STag cannot be invalidated", operation flavour.
    RDMAP_ERR_CANNOT_INVALIDATE_OP = (Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_STAG_CANNOT_INVALIDATE);
    /// RDMAP remote operation: invalid RDMAP version.
    RDMAP_ERR_INVALID_VERSION = (Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_INVALID_VERSION);
    /// RDMAP remote operation: unexpected OpCode.
    RDMAP_ERR_UNEXPECTED_OPCODE = (Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_UNEXPECTED_OPCODE);
    /// RDMAP remote operation: catastrophic error, localized to RDMAP stream.
    RDMAP_ERR_CATASTROPHIC_STREAM = (Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_CATASTROPHIC_STREAM);
    /// RDMAP remote operation: catastrophic error, global.
    RDMAP_ERR_CATASTROPHIC_GLOBAL = (Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_CATASTROPHIC_GLOBAL);
    /// RDMAP remote operation: unspecified error.
    RDMAP_ERR_UNSPECIFIED_OP = (Rdmap, RDMAP_REMOTE_OPERATION, RDMAP_UNSPECIFIED);
    /// DDP local catastrophic error.
    DDP_LOCAL_CATASTROPHIC_ERR = (Ddp, DDP_LOCAL_CATASTROPHIC, 0);
    /// DDP tagged buffer: invalid STag.
    DDP_ERR_T_INVALID_STAG = (Ddp, DDP_TAGGED, DDP_T_INVALID_STAG);
    /// DDP tagged buffer: base or bounds violation.
    DDP_ERR_T_BASE_BOUNDS = (Ddp, DDP_TAGGED, DDP_T_BASE_BOUNDS);
    /// DDP tagged buffer: STag not associated with DDP stream.
    DDP_ERR_T_STAG_NOT_ASSOCIATED = (Ddp, DDP_TAGGED, DDP_T_STAG_NOT_ASSOCIATED);
    /// DDP tagged buffer: TO wrap.
    DDP_ERR_T_TO_WRAP = (Ddp, DDP_TAGGED, DDP_T_TO_WRAP);
    /// DDP tagged buffer: invalid DDP version.
    DDP_ERR_T_INVALID_VERSION = (Ddp, DDP_TAGGED, DDP_T_INVALID_VERSION);
    /// DDP untagged buffer: invalid QN.
    DDP_ERR_U_INVALID_QN = (Ddp, DDP_UNTAGGED, DDP_U_INVALID_QN);
    /// DDP untagged buffer: invalid MSN, no buffer available.
    DDP_ERR_U_NO_BUFFER = (Ddp, DDP_UNTAGGED, DDP_U_NO_BUFFER);
    /// DDP untagged buffer: invalid MSN, MSN range is not valid.
    DDP_ERR_U_MSN_RANGE = (Ddp, DDP_UNTAGGED, DDP_U_MSN_RANGE);
    /// DDP untagged buffer: invalid MO.
    DDP_ERR_U_INVALID_MO = (Ddp, DDP_UNTAGGED, DDP_U_INVALID_MO);
    /// DDP untagged buffer: DDP message too long for the available buffer.
    DDP_ERR_U_TOO_LONG = (Ddp, DDP_UNTAGGED, DDP_U_TOO_LONG);
    /// DDP untagged buffer: invalid DDP version.
    DDP_ERR_U_INVALID_VERSION = (Ddp, DDP_UNTAGGED, DDP_U_INVALID_VERSION);
    /// MPA: TCP connection closed, terminated or lost.
    MPA_ERR_CONNECTION_LOST = (Llp, MPA, MPA_CONNECTION_LOST);
    /// MPA: CRC error.
    MPA_ERR_CRC = (Llp, MPA, MPA_CRC);
    /// MPA: marker and ULPDU length field mismatch.
    MPA_ERR_MARKER = (Llp, MPA, MPA_MARKER);
    /// MPA: invalid MPA Request or Reply.
    MPA_ERR_INVALID_REQ_REP = (Llp, MPA, MPA_INVALID_REQ_REP);
    /// MPA: local catastrophic error.
    MPA_ERR_LOCAL_CATASTROPHIC = (Llp, MPA, MPA_LOCAL_CATASTROPHIC);
    /// MPA: insufficient IRD resources (RFC 6581).
    MPA_ERR_INSUFFICIENT_IRD = (Llp, MPA, MPA_INSUFFICIENT_IRD);
    /// MPA: no matching RTR model (RFC 6581).
    MPA_ERR_NO_MATCHING_RTR = (Llp, MPA, MPA_NO_MATCHING_RTR);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fig10_header_presence() {
        // RFC 5040 Fig. 10: which causes echo the DDP header.
        assert!(!RDMAP_LOCAL_CATASTROPHIC_ERR.carries_ddp_header());
        assert!(RDMAP_ERR_INVALID_STAG.carries_ddp_header());
        assert!(RDMAP_ERR_UNEXPECTED_OPCODE.carries_ddp_header());
        assert!(DDP_ERR_T_INVALID_STAG.carries_ddp_header());
        assert!(DDP_ERR_U_NO_BUFFER.carries_ddp_header());
        assert!(!MPA_ERR_CRC.carries_ddp_header());
    }

    #[test]
    fn display_names_the_row() {
        assert_eq!(
            DDP_ERR_U_NO_BUFFER.to_string(),
            "layer 1/etype 2/code 0x02 (DDP untagged buffer: invalid MSN, no buffer available)"
        );
        assert_eq!(Layer::from_nibble(0x7), Layer::Unknown(7));
    }
}
