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
//! * [`wire`]: sans-I/O parse/emit of every MPA, DDP and RDMAP message,
//!   DDP segmentation (`ddp::segment_len`) and the MPA deframer; the engine
//!   runs these (`ddp::Segment::parse`, `rdmap::Message::parse`,
//!   `fpdu::Deframer`), and so do the fuzz targets (`fuzz/README.md`).
//! * [`proto`]: MPA negotiation (`proto::mpa`), the one sans-I/O state
//!   machine outside the data path, run by the engine's connection manager.
//! * [`engine`]: QPs over real TCP sockets. The data path has one
//!   implementation, the QP protocol core (`engine::qp`: `Proto`, which does
//!   no I/O, split into transmit / receive / receive-buffer sides) with the
//!   socket work beside it (`qp/io.rs`); `engine::qp::harness` runs the same
//!   core in memory for its tests and the fuzz targets. Plus the epoll
//!   progress thread.
//! * [`crc`]: CRC32c for MPA, hardware accelerated.
//! * [`factory`]: the provider as the device registry ([`verbs::Registry`]) sees it.

#![warn(missing_docs)]

pub mod crc;
pub mod detail;
pub mod engine;
pub mod factory;
pub mod proto;
pub mod wire;

pub use detail::{MpaReject, TerminateInfo};
pub use engine::{IwarpConfig, open_device};
pub use factory::IwarpFactory;
