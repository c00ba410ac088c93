//! iWARP detail that reaches applications through the verbs' provider hooks,
//! not as verbs types: the cause of a Terminate (in a CM event's
//! [`verbs::ErrorDetail`] and packed in `WorkCompletion::vendor_err`) and
//! the IRD/ORD block of an MPA Reply that rejected a connection (in
//! `Error::Rejected`'s detail).
//!
//! ```
//! # fn show(ev: &verbs::CmEvent) {
//! if let Some(t) = ev.detail().and_then(|d| d.downcast_ref::<iwarp::TerminateInfo>()) {
//!     println!("Terminate: layer {} type {} code {:#04x}", t.layer, t.etype, t.code);
//! }
//! # }
//! ```

use std::fmt;

/// A Terminate's cause (RFC 5040 §7.1): the layer that found the error, its
/// error type and code, and the RFC's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminateInfo {
    /// 0 RDMAP, 1 DDP, 2 LLP (MPA).
    pub layer: u8,
    /// Error Type (4 bits; RFC 5040 §4.8).
    pub etype: u8,
    /// Error Code (8 bits).
    pub code: u8,
    /// The RFC's name of the cause.
    pub description: String,
}

impl TerminateInfo {
    /// The cause packed as the iWARP provider fills `WorkCompletion::vendor_err`:
    /// `layer << 16 | etype << 8 | code`.
    pub fn vendor_err(&self) -> u32 {
        (self.layer as u32) << 16 | (self.etype as u32) << 8 | self.code as u32
    }

    /// Layer, type and code from a `vendor_err` the iWARP provider filled.
    pub fn unpack_vendor_err(v: u32) -> (u8, u8, u8) {
        ((v >> 16) as u8, (v >> 8) as u8, v as u8)
    }
}

impl fmt::Display for TerminateInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Terminate layer {} type {} code {:#04x}: {}",
            self.layer, self.etype, self.code, self.description
        )
    }
}

/// What an MPA Reply with R=1 (a rejected connection) said beside the
/// ULP's private data: the responder's RFC 6581 IRD/ORD block, when it
/// carried one (a responder short of ORD states there what it needs,
/// RFC 6581 §9.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpaReject {
    /// The responder's IRD and ORD, when its Reject carried them (MPA revision 2).
    pub ird_ord: Option<(u16, u16)>,
}

impl fmt::Display for MpaReject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ird_ord {
            Some((i, o)) => write!(f, "MPA Reply IRD {i} ORD {o}"),
            None => write!(f, "MPA Reply without IRD/ORD"),
        }
    }
}
