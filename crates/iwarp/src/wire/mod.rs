//! The iWARP wire formats, sans-I/O: parse and emit on byte slices only.
//!
//! Bottom to top: [`mpa`] (RFC 5044 / RFC 6581 Request/Reply frames and the
//! RFC 6581 IRD/ORD words), [`fpdu`] (RFC 5044 FPDU framing, CRC, markers and
//! the streaming deframer), [`ddp`] (RFC 5041 tagged and untagged headers),
//! [`rdmap`] (RFC 5040 / RFC 7306 opcodes and their headers) and [`terminate`]
//! (RFC 5040 §4.8). [`cause`] holds the Terminate (layer, type, code) table
//! every receive-side check maps to.
//!
//! No module here allocates on the data path, performs I/O, reads a clock or
//! logs. Every length or offset that comes from a peer is checked before use.

pub mod cause;
pub mod ddp;
pub mod fpdu;
pub mod mpa;
pub mod rdmap;
mod rdmap_hdr;
pub mod terminate;
