//! # rpcrdma: ONC RPC over TCP and over RDMA (RFC 8166)
//!
//! Sans-I/O codecs and state for RPC-over-RDMA version 1 (RFC 8166, updated by
//! RFC 8797), ONC RPC version 2 (RFC 5531) and XDR (RFC 4506), and the I/O on
//! top of them: [`tcp`] (ONC RPC over TCP with record marking) and
//! [`transport`] (the Requester and Responder on the verbs API). Only those two
//! modules do I/O; they drive the sans-I/O types as quinn drives quinn-proto.
//! [`server`] (program registry and dispatch) and [`client`] (calls and their
//! results) are shared by both transports; [`demo`] is a demo program
//! (0x20000099) that moves large opaque data both ways. [`nfs3`], [`mount`] and
//! [`portmap`] are an NFSv3 client subset with the RFC 8267 binding, MOUNT v3
//! and rpcbind GETPORT; [`nfs3::memfs`] is an in-memory NFSv3 server for tests.
//!
//! ## Where this crate sits
//!
//! ```text
//!   RPC programs (NFSv3, MOUNT, a toy ULP, ...) + their upper-layer bindings
//!   rpcrdma                                                  <- this crate
//!     over RDMA: Transport header, chunks, credits, inline thresholds (RFC 8166),
//!                CM private data (RFC 8797)       -> verbs API (crate `verbs`)
//!     over TCP:  record marking (RFC 5531 §11)    -> kernel TCP socket
//!   verbs API: QPs, MRs, post_send/post_recv, RDMA Read/Write, CM private data
//!   providers: iwarp (RDMAP/DDP/MPA over TCP), later roce
//! ```
//!
//! ## Getting started
//!
//! The crate takes any `verbs::Device`; the program opens one by name from the
//! providers it links, through the verbs registry (`softrdma devices` lists the
//! names). A server registers its procedures and listens; a client connects and
//! calls. The transport negotiates inline thresholds (RFC 8797) and moves
//! DDP-eligible items by RDMA Read and Write on its own:
//!
//! ```no_run
//! use rpcrdma::client::Call;
//! use rpcrdma::server::Registry as Programs;
//! use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};
//! use rpcrdma::xdr::ReplySizing;
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # fn registry() -> verbs::Registry { verbs::Registry::new() }
//! // `registry()` registers the providers the program links, e.g.
//! // `verbs::Registry::new().with(Arc::new(iwarp::IwarpFactory))`.
//! let dev = registry().open("siw_soft0", &verbs::DeviceOptions::new())?;
//!
//! let mut programs = Programs::new();
//! programs.register_null(0x2000_5a5a, 1);
//! let server = RdmaServer::spawn(&dev, "127.0.0.1:0".parse()?, Arc::new(programs), RdmaConfig::default())?;
//!
//! let client = RdmaClient::connect(&dev.alloc_pd()?, server.local_addr(), RdmaConfig::default())?;
//! let null = Call::new(0x2000_5a5a, 1, 0, &|_| Ok(()), ReplySizing::default());
//! client.call(&null, |_| Ok(()))?;
//! # Ok(()) }
//! ```
//!
//! `crates/cli/examples/rpc_rdma.rs` is a whole program with a procedure whose
//! argument and result go by Read and Write chunks; [`demo`] and [`nfs3`] are
//! larger ones.
//!
//! ONC RPC over TCP with record marking is the baseline and the fallback: the
//! same [`rpc`] and [`xdr`] code serves both transports; only the framing differs
//! (RPC-over-RDMA framing replaces record marking, RFC 8166 §3.2).
//!
//! ## Module map
//!
//! | module | what | RFC |
//! |---|---|---|
//! | [`xdr`] | bounded XDR encoder/decoder; DDP-eligible items recorded while encoding and re-inserted while decoding; [`xdr::ProcedureBinding`] for upper-layer bindings | 4506; 8166 §3.4, §6 |
//! | [`rpc`] | call/reply headers, every accept/reject status, AUTH_NONE, AUTH_SYS | 5531 §9, §10, App. A |
//! | [`record`] | TCP record marking, streaming reassembly with limits | 5531 §11 |
//! | [`wire`] | the Transport header: fixed words, Read/Write lists, Reply chunk, RDMA_ERROR, RDMA_MSGP/RDMA_DONE parsing | 8166 §4 |
//! | [`wire::chunks`] | Position arithmetic and roundup: reduce, re-insert, Write/Reply chunk filling, returned-chunk checks | 8166 §3.4, §3.5.3, §4.3 |
//! | [`private_data`] | CM private data (format 0xf6ab0e18), threshold negotiation | 8797 |
//! | [`validate`] | what to do with a received message (acceptance matrix B.4.5) | 8166 §4.5, §4.6, §6.1 |
//! | [`credits`] | credit grants and overrun detection for both roles | 8166 §3.3.1, §3.3.3 |
//! | [`inline`] | inline thresholds; Short / Chunked / Long for Calls and Replies | 8166 §3.3.2, §3.5, §4.3.3 |
//! | [`transport::backchannel`] | reverse-direction calls (Short messages) | 8167 |
//! | [`nfs3`] | NFSv3 client subset with the RFC 8267 binding; [`nfs3::memfs`] in-memory server | 1813, 8267 |
//! | [`mount`], [`portmap`] | MOUNT v3 MNT/UMNT; rpcbind v2 GETPORT | 1813 App. I, 1833 |
//!
//! ## What the transport engine calls
//!
//! **Connection set-up.** Put [`private_data::PrivateData::encode`] in the CM
//! private data; on the peer's, [`private_data::PrivateData::find`] and
//! [`private_data::negotiate`] give the [`inline::Thresholds`] (1024/1024 when
//! absent) and whether Send With Invalidate may be used.
//!
//! **Requester (client), per RPC.**
//! 1. [`credits::RequesterCredits::on_send`] (one credit until the first Reply).
//! 2. Encode the Call with an [`xdr::Encoder`]; DDP-eligible items use the `*_ddp`
//!    methods and come back as [`xdr::DdpItem`]s.
//! 3. [`inline::plan_reply_resources`] (from the binding's [`xdr::ReplySizing`])
//!    says which Write chunks and Reply chunk to register;
//!    [`inline::plan_call`] says Short, Chunked (with the reduced stream and the
//!    Positions of the Read chunks) or Long (Position-Zero Read chunk).
//! 4. Build the [`wire::Header`] with the registered segments and Send it.
//! 5. On receive: [`validate::validate_reply`] -> Process / RpcFailed / Drop;
//!    [`credits::RequesterCredits::on_reply`] with the header's credit; decode
//!    the results with [`xdr::Decoder::with_chunks`] and
//!    [`xdr::ChunkSource::Write`] (the bytes the Responder wrote).
//!
//! **Responder (server), per received message.**
//! 1. [`validate::validate_call`] -> Process / SendError (build it with
//!    `error_header(grant)`) / Drop; [`credits::ResponderCredits::on_call`]
//!    detects overruns.
//! 2. Pull the Read chunks ([`validate::ValidCall::read_chunks`], and the
//!    Position-Zero chunk of a Long Call, then [`validate::check_payload_xid`]).
//! 3. Decode the arguments with [`xdr::ChunkSource::Read`]; on error,
//!    [`validate::classify_decode_error`] picks ERR_CHUNK or GARBAGE_ARGS
//!    ([`validate::garbage_args_message`]).
//! 4. Encode the Reply; [`inline::plan_reply`] reduces results into the Write
//!    chunks and picks Short or Long, giving the header, the RDMA Writes to post
//!    first and the payload; the grant comes from
//!    [`credits::ResponderCredits::on_reply`].
//! 5. If an RDMA operation fails: close the connection and
//!    [`validate::FailedXids::record`] the XID (ERR_CHUNK after reconnection).
//!
//! **TCP.** [`record::RecordReader::decode`] on socket bytes, then
//! [`rpc::RpcMessage`] decoding; [`record::encode_record`] to send.
//!
//! ## Robustness
//!
//! No `unsafe` but one small module (the Requester's in-place view of its invalidated chunk
//! region, `transport::in_place`, with its safety argument); every read is bounds-checked; lengths and counts from the peer are
//! checked against limits and the remaining bytes before any allocation; offset
//! arithmetic is checked. Decoders return typed errors (`thiserror`) and never
//! panic; fuzz targets `rpcrdma_header`, `onc_rpc` and `record_marking` check it.
//! Requirement IDs (RPCR-...) from the project's requirements Part B are named in
//! the tests that cover them.
//!
//! What a hostile peer can make the RPC-over-RDMA Responder spend (threads, CPU while
//! idle, connections, staging memory, reply sizes, idle time) is bounded and configurable:
//! see "The Responder's resource model" in [`transport`]. Procedures registered with
//! [`server::Registry::register_bounded`] declare their largest reply from their arguments,
//! so [`server::dispatch_within`] refuses a Call whose reply cannot fit before doing the work.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod credits;
pub mod demo;
pub mod inline;
pub mod mount;
pub mod nfs3;
pub mod pool;
pub mod portmap;
pub mod private_data;
pub mod record;
pub mod rpc;
pub mod server;
pub mod tcp;
pub mod transport;
pub mod validate;
pub mod wire;
pub mod xdr;
