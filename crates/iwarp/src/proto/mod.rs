//! Sans-I/O protocol state machines of the iWARP provider that sit outside
//! the data path: [`mpa`], MPA connection setup negotiation (RFC 5044 §7 and
//! RFC 6581), driven by the engine's connection manager with the socket's
//! octets.
//!
//! The data path has one implementation: the engine's protocol core
//! (`engine::qp`'s `Proto`, no I/O) runs the DDP and RDMAP receive checks,
//! placement, and segmentation on top of the wire parsers in
//! [`crate::wire`]; the fuzz targets and `engine/qp/core_tests.rs` drive that
//! same core (see `fuzz/README.md`).

pub mod mpa;
