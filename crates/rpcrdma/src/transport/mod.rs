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
//!
//! ## The Responder's resource model
//!
//! What a remote, unauthenticated peer can make an [`RdmaServer`] spend is bounded by
//! [`RdmaConfig`]:
//!
//! * **Threads**: [`RdmaConfig::workers`] (default 4) worker threads serve every connection, plus
//!   one accept thread; no thread per connection. Each worker owns one completion queue that
//!   the QPs of its connections share; the QP number in each completion says which
//!   connection it belongs to. A worker never waits for one connection: it posts the RDMA
//!   Reads of a Call's Read chunks, or a Reply's Writes and Send, and goes on with whatever
//!   completed on any of its connections; the Reads' completions send the Call to the I/O
//!   pool, the Send's completion frees its buffer (each connection takes up its Calls in
//!   arrival order: the Calls after one whose chunks are being pulled wait for it). A Call
//!   retransmitted while the connection that touched its chunks lives waits (up to 2 s, RFC
//!   8166 §4.5.3) on its connection too, never on the worker.
//! * **CPU while idle**: a worker sleeps in its completion queue with no timeout, or with
//!   the nearest idle deadline; nothing wakes periodically (the verbs CQ's blocking wait
//!   has no slices). The accept thread looks at the stop flag four times a second (a verbs
//!   listener cannot be woken otherwise), which costs nothing measurable.
//! * **Connections**: at most [`RdmaConfig::max_connections`] (default 1024); a connect request
//!   beyond that is rejected at the CM level (an MPA Reject, no private data, which an RFC
//!   8797 peer treats as a refusal) and logged at warn level with the peer's address.
//! * **Idle timeout**: a connection with no message for [`RdmaConfig::idle_timeout`]
//!   (default 5 min) is disconnected cleanly (no Terminate), logged at info level.
//! * **Arguments**: a Call's Read chunks together may name at most
//!   [`RdmaConfig::max_call`] (default 8 MiB) (and each at most [`RdmaConfig::max_chunk`]):
//!   beyond that RDMA_ERROR/ERR_CHUNK, without any RDMA Read (RFC 8166 §8.1.4,
//!   RPCR-SEC-05). Every Read is signalled and only what its completion says was placed
//!   counts: a Read Response shorter than its Read gets ERR_CHUNK, the procedure does not
//!   run on the unfilled rest.
//! * **Replies**: a procedure registered with [`crate::server::Registry::register_bounded`]
//!   declares the largest its reply can get from its arguments; before it runs, a bound
//!   above what the Call can carry (inline threshold + Write chunks + Reply chunk) gets
//!   ERR_CHUNK and a bound above [`RdmaConfig::max_reply`] (default 64 MiB + 64 KiB) gets
//!   SYSTEM_ERR. A reply of a procedure without a bound is checked after it ran (SYSTEM_ERR
//!   above `max_reply`, ERR_CHUNK when it does not fit the chunks). Procedures run on the I/O
//!   pool ([`crate::pool`]: [`RdmaConfig::io_workers`] threads or a shared
//!   [`RdmaConfig::pool`]), one reply per pool thread being built, so replies being built take
//!   at most `pool threads × max_reply`; the pool thread posts the finished reply itself
//!   (the connection's send side, `responder/reply.rs`, is shared under a lock: credits,
//!   send buffers, the queue of Replies waiting for one), and the worker only takes the
//!   Send's completion (issue 18: handing the reply back to the worker was one more wake-up
//!   per call; [`ServerStats::pool_wakeups`] counts the replies a pool thread could not post).
//! * **Calls in the pool**: at most `credits` per connection (the Requester cannot have more
//!   outstanding); the octets of their pulled Read chunks and inline Payload stay charged to
//!   the staging budget until the Reply is sent (no room: SYSTEM_ERR). The pool serves
//!   connections in turn, a connection runs at most half its threads and one registry (an
//!   NFS export) three quarters, so a stalled disk holds neither the workers nor another
//!   export's Calls.
//! * **Staging** (registered memory for pulled Read chunks and results to RDMA Write): all
//!   connections together at most [`RdmaConfig::max_staging`] (default 512 MiB); a connection keeps
//!   a stage of up to 4 MiB between Calls (it counts against the budget) and gives back a
//!   larger one after each message. A Call's Read chunks are pulled into a stage that goes
//!   with the Call to the pool (the procedure reads them where the RDMA Reads put them) and
//!   comes back with its answer; a connection keeps up to 4 such spares, each charged.
//!   Write-chunk results are sent from the reply vector itself, registered for the Writes and
//!   charged while they are in flight. A Call that finds no room gets an RPC SYSTEM_ERR.
//! * **Per connection** besides: `(credits + 8) × inline_recv` of receive buffers (40 KiB by default)
//!   and up to 8 send buffers of the inline reply threshold (one per Reply in flight; further
//!   Replies wait in a queue that the credits bound: one Reply per Call).
//! * **Diagnostics**: the end of every connection is logged with its QP number and peer
//!   address: "peer closed the connection" (info) when the peer disconnected, "connection
//!   failed: ..." (warn) with the Terminate (received or sent) or RDMA error otherwise.
//!
//! A connection whose peer does not answer an RDMA Read of ours, or acknowledge a Reply's
//! Send (an iWARP peer whose TCP window stays closed, a RoCE peer that RNR-NAKs forever),
//! within [`RdmaConfig::timeout`] is closed ([`ServerStats::timeouts`], logged at warn level);
//! the worker's other connections are served meanwhile (tests/stalled_client.rs). The
//! procedures themselves never run on a worker.
//!
//! # Threads of a call (issue 18)
//!
//! On the [`RdmaClient`] side the caller waits for its Reply by polling its connection's
//! completion queue itself (leader/follower: one caller polls and hands the others their
//! Replies; when it has its own, one of them takes over); the connection's progress thread
//! polls only while no caller does (reverse-direction Calls, CM events) and leaves the CQ
//! as soon as a caller comes ([`verbs::CompletionQueue::interrupt`]). A call crosses the
//! client's caller, the server's engine thread, worker and pool thread, and the client's
//! engine thread unless the caller reads its Reply off the transport while it spins (it
//! used to cross seven threads; tests/handoffs.rs counts them).

pub mod backchannel;
#[allow(unsafe_code)]
mod in_place;
mod mailbox;
mod requester;
mod responder;

pub use backchannel::{BC_CREDITS, Backchannel};
pub use requester::{BULK_NO_SPIN, ChunkFault, RdmaClient};
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
    /// Responder: worker threads that serve all connections (they move messages; the
    /// procedures run on the I/O pool).
    pub workers: usize,
    /// Responder: threads of the server's own I/O pool when `pool` is `None`.
    pub io_workers: usize,
    /// Responder: run the procedures on this shared pool (e.g. one for every transport
    /// of an NFS server) instead of a pool of `io_workers` threads of its own.
    pub pool: Option<std::sync::Arc<crate::pool::IoPool>>,
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
    /// Requester: how long a caller waiting for its Reply busy-polls the connection's
    /// completion queue (driving the provider inline) before it sleeps (default 50 µs).
    /// `Duration::ZERO`: sleep at once (on iWARP in `poll(2)` on the socket, receiving the
    /// Reply itself, as a blocking TCP reader does); `Duration::MAX`: busy-poll until the
    /// Reply arrives (`rpc bench --busy-poll`, issue 18's same-mode comparison). A call
    /// moving [`BULK_NO_SPIN`] octets or more in chunks sleeps at once unless this is
    /// `Duration::MAX`.
    pub reply_spin: Duration,
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
            io_workers: 8,
            pool: None,
            call_options: CallOptions::default(),
            rd_atomic: 16,
            connect_settle: Duration::ZERO,
            reply_spin: Duration::from_micros(50),
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
