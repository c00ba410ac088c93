//! # iwarp: the software iWARP RNIC of softrdma
//!
//! Where this crate sits in the stack:
//!
//! ```text
//!   upper layers (rpcrdma, smc, ipoib, your program)
//!   verbs API (crate `verbs`)          <- the provider trait this crate implements
//!   iwarp: RDMAP (RFC 5040, 7306) / DDP (RFC 5041) / MPA (RFC 5044, 6581)   <- here
//!   kernel TCP
//! ```
//!
//! * [`wire`]: sans-I/O parse/emit of every MPA, DDP and RDMAP message; the
//!   engine's receive path runs `ddp::Segment::parse`, `rdmap::Message::parse`
//!   and `fpdu::Deframer` (the fuzz targets' entry points, `fuzz/README.md`).
//! * [`proto`]: sans-I/O state machines: MPA negotiation (run by the
//!   engine's connection manager); `ddp_rx` and `segment`, a second
//!   implementation of DDP receive checks and segmentation that the engine
//!   does not run yet (issue 11).
//! * [`engine`]: QPs over real TCP sockets: the protocol core
//!   (`engine::qp`, split into transmit / receive / socket sides) and the
//!   epoll progress thread.
//! * [`crc`]: CRC32c for MPA, hardware accelerated.
//! * [`factory`]: the provider as the device registry ([`verbs::Registry`]) sees it.

pub mod crc;
pub mod detail;
pub mod engine;
pub mod factory;
pub mod proto;
pub mod wire;

pub use detail::{MpaReject, TerminateInfo};
pub use engine::{IwarpConfig, open_device};
pub use factory::IwarpFactory;
