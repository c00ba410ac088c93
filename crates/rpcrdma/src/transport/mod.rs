//! The RPC-over-RDMA version 1 transport on the verbs API: a Requester
//! ([`RdmaClient`]) and a Responder ([`RdmaServer`]).
//!
//! The decisions are the crate's sans-I/O pieces ([`crate::validate`],
//! [`crate::credits`], [`crate::inline`], [`crate::wire::chunks`],
//! [`crate::private_data`], [`crate::server::dispatch`]); this module posts the
//! work requests they call for and waits for the completions.
//!
//! * **Connection set-up**: RFC 8797 private data in the connect request and the
//!   accept reply (switchable off: both sides then assume 1024/1024); inline
//!   thresholds from [`crate::private_data::negotiate`], fixed for the
//!   connection (RPCR-INL-01..03).
//! * **Receives**: each side posts one receive buffer per credit before it can
//!   be needed (Requester: the number of credits it requests; Responder: its
//!   largest grant) and re-posts a buffer as soon as its message is copied out.
//! * **Credits**: the Requester starts with one credit and waits for the first
//!   Reply (RPCR-CRD-07), then follows the latest absolute grant (0 counts as
//!   1); the Responder grants at most the receives it has posted, never 0, and
//!   closes a connection whose peer overruns the grant.
//! * **Memory**: the Requester registers memory per RPC with fast-register work
//!   requests (one STag for the Read chunks, one for the Write list and Reply
//!   chunk) and invalidates both before the RPC completes, locally or — when both
//!   sides advertised remote invalidation in their RFC 8797 private data — the
//!   Responder's Send With Invalidate does it for the STag that covers every
//!   segment of the Write list and Reply chunk.
//! * **Errors**: a Call the Responder cannot accept gets RDMA_ERROR (ERR_VERS,
//!   ERR_CHUNK) or an RPC GARBAGE_ARGS reply as [`crate::validate`] decides; an
//!   RDMA operation that fails ends the connection and the XID is remembered so
//!   its retransmission gets ERR_CHUNK (RFC 8166 §4.5.3). The Requester treats
//!   RDMA_ERROR as a permanent failure of that RPC and retransmits (same XID)
//!   after a reconnect when the connection is lost or a Reply does not come.
//! * **Reverse direction** (RFC 8167, Short messages only): [`RdmaServer::backchannels`]
//!   calls a client opened with [`RdmaClient::connect_with_backchannel`] (see [`backchannel`]).

pub mod backchannel;
mod requester;
mod responder;

pub use backchannel::{BC_CREDITS, Backchannel};
pub use requester::{ChunkFault, RdmaClient};
pub use responder::{RdmaServer, ServerStats, StatsSnapshot};

use std::time::Duration;

use crate::inline::{CallOptions, DEFAULT_INLINE_THRESHOLD};

/// Settings of either role.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Largest Send we transmit (RFC 8797 send size; at least 1024).
    pub inline_send: u32,
    /// Size of each receive buffer (RFC 8797 receive size; at least 1024).
    pub inline_recv: u32,
    /// Advertise support for Remote Invalidation (RFC 8797 R bit).
    pub remote_invalidation: bool,
    /// Put RFC 8797 private data in the connect request / accept reply.
    pub private_data: bool,
    /// Requester: credits requested. Responder: largest grant (and receives posted).
    pub credits: u32,
    /// Per-RPC (Requester) or per-operation (Responder) timeout.
    pub timeout: Duration,
    /// Requester: retransmissions after a reconnect.
    pub max_retries: u32,
    /// Responder: largest Read chunk it pulls (RFC 8166 §8.1.4).
    pub max_chunk: u64,
    /// Responder: largest total of one Call's Read chunks (Position-Zero included); a
    /// Call naming more gets ERR_CHUNK without any RDMA Read (RPCR-SEC-05). This is the
    /// per-connection staging for arguments: a connection answers one Call at a time.
    pub max_call: u64,
    /// Responder: largest reply (RPC reply header and results). A procedure whose
    /// declared bound is larger gets SYSTEM_ERR without running.
    pub max_reply: u64,
    /// Responder: staging memory (Read chunks pulled, results to RDMA Write) of all
    /// connections together; a Call that finds no room gets SYSTEM_ERR.
    pub max_staging: u64,
    /// Responder: most connections at once; more connect requests are rejected.
    pub max_connections: usize,
    /// Responder: a connection with no message for this long is disconnected (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Responder: worker threads that serve all connections.
    pub workers: usize,
    /// Requester: force Long Calls, or never reduce.
    pub call_options: CallOptions,
    /// IRD and ORD for RDMA Reads.
    pub rd_atomic: u8,
    /// Requester: pause between connection establishment and the first Call
    /// (default 0). Only for Responders that post their receives after
    /// accepting: iWARP has no receiver-not-ready retry, so a Send that finds no
    /// receive ends the connection (the Call is then retransmitted after a
    /// reconnect). Our Responder posts its receives before accepting.
    pub connect_settle: Duration,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            inline_send: DEFAULT_INLINE_THRESHOLD,
            inline_recv: DEFAULT_INLINE_THRESHOLD,
            remote_invalidation: true,
            private_data: true,
            credits: 32,
            timeout: Duration::from_secs(30),
            max_retries: 2,
            max_chunk: 64 << 20,
            max_call: 8 << 20,
            max_reply: (64 << 20) + (64 << 10),
            max_staging: 512 << 20,
            max_connections: 1024,
            idle_timeout: Some(Duration::from_secs(300)),
            workers: 4,
            call_options: CallOptions::default(),
            rd_atomic: 16,
            connect_settle: Duration::ZERO,
        }
    }
}

/// Work request id kinds (top byte of the 64-bit id).
pub(crate) mod wrid {
    pub const RECV: u64 = 1 << 56;
    pub const SEND: u64 = 2 << 56;
    pub const INV: u64 = 3 << 56;
    pub const REG: u64 = 4 << 56;
    pub const READ: u64 = 5 << 56;
    pub const WRITE: u64 = 6 << 56;
    pub const BC_SEND: u64 = 7 << 56;
    /// Not a work request: the Responder's accept thread waking a worker.
    pub const WAKE: u64 = 8 << 56;
    pub const KIND: u64 = 0xff << 56;
}
