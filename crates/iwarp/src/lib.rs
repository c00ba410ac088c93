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
//!
//! What the provider refuses, and why:
//!
//! * **A manual RTR/RTS** (`modify_qp` to RTR, RTS or SQD gives
//!   `NotSupported`), as Linux's iw_cm and siw do: an iWARP QP goes live
//!   when MPA negotiation on its TCP stream succeeds, which only the
//!   connection manager sees; RTR/RTS attributes (PSNs, a destination QPN,
//!   an address vector) have no meaning on a TCP stream. `create_qp` gives
//!   RESET, `modify_qp` moves RESET <-> INIT and to ERR; `QueuePair::connect`
//!   / `ConnectRequest::accept_qp` move INIT to RTS.
//! * **UD, UC and GSI QPs, address handles, multicast**: iWARP is RC only
//!   (RFC 5040 runs over one reliable stream per QP).
//! * **Shared receive queues** (`create_srq`): Linux siw has them, but here a
//!   QP's receive queue lives inside its protocol core (`engine::qp`, under
//!   the QP's lock, consumed by whichever thread runs that QP's receive
//!   side). An SRQ needs a queue shared across QPs under its own lock,
//!   checked on every untagged arrival of each QP, the SRQ limit event, and
//!   `QpLastWqeReached` when a QP on it fails; that is a change to the
//!   receive path, not an addition, and waits for a user (IPoIB needs it on
//!   the RoCE provider first).
//!
//! Asynchronous events: `CommEstablished` when the CM connects a QP,
//! `QpFatal` on a Terminate (sent or received) and on an LLP error (a TCP
//! reset or socket error under a live connection; an orderly close is only
//! `Disconnected`). Never raised: `QpLastWqeReached` (no SRQ), `SqDrained`
//! (no SQD), `PortActive`/`PortError` (the port is the host's IP stack; link
//! changes are not watched).
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
