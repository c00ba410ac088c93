//! softrdma's SMC-R (RFC 7609): TCP connections whose data flows by RDMA Writes into the
//! peer's receive buffer while the TCP connection stays for control.
//!
//! Layout, bottom up (sans-I/O first, as in the provider crates):
//! - [`wire`]: the TCP experimental option, CLC messages (Proposal, Accept, Confirm,
//!   Decline; RFC 7609 v1 and Linux's v1/v2 forms), LLC messages, CDC messages and RMB
//!   element cursors, each with `parse`/`emit` on byte slices and golden vectors.
//! - [`clc_machine`]: the sans-I/O CLC handshake (client and server): bytes in, bytes out,
//!   and a decision: SMC-R with the peer's link parameters, fallback with a reason, or reset.
//! - [`conn`]: the sans-I/O connection machine (CDC flow control, urgent data, close and
//!   abort of Figures 22 and 23, validation of the peer's cursors).
//! - [`lgr`]: the sans-I/O link-group machine (LLC on an established link, TEST LINK
//!   keepalive, CONFIRM/DELETE RKEY, DELETE LINK, linger).
//! - [`stream`]: the engine and the API, [`SmcStream`] / [`SmcListener`] mirroring
//!   `std::net::TcpStream` / `TcpListener` over a RoCE device, with [`Mode`] = SMC-R or
//!   fallback and its reason; urgent data and abort as TCP's; the async variant
//!   `stream::async_io` (feature `tokio`, default).
//! - [`stats`]: what `softrdma smc stat` shows, and how it is read from another process.
//!
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` parts A, C4, C5, D1, D2, E.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod clc_machine;
pub mod conn;
pub mod lgr;
mod netif;
pub mod sockops;
pub mod stats;
pub mod stream;
pub mod wire;

pub use stream::{Mode, SmcConfig, SmcListener, SmcStream, live_links};
