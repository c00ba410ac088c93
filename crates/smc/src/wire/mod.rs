//! SMC-R wire formats (RFC 7609 appendix A), sans-I/O: `parse`/`emit` on byte slices.
//!
//! - [`tcp_option`]: the TCP experimental option (kind 254, magic 0xE2D4C3D9), A.1.
//! - [`clc`]: CLC Proposal / Accept / Confirm / Decline, A.2.
//! - [`llc`]: LLC messages on the link's RC QPs, A.3.
//! - [`cdc`]: the CDC message (0xFE), A.4.
//! - [`cursor`]: RMB element cursors with wrap, §4.2–4.3.

pub mod cdc;
pub mod clc;
pub mod cursor;
pub mod llc;
pub mod tcp_option;
