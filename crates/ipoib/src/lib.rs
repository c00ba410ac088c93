//! softrdma's IPoIB: an IP interface whose link is the RDMA fabric, in datagram mode
//! (RFC 4391, UD queue pairs) and connected mode (RFC 4755, RC connections set up by the
//! IB CM).
//!
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` parts B, C1, C2, D3.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod daemon;
pub mod link;
pub mod node;
mod sys;
pub mod tun;
pub mod wire;
