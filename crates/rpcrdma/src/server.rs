//! Program registry and call dispatch, shared by the TCP server ([`crate::tcp`])
//! and the RPC-over-RDMA Responder ([`crate::transport`]). Sans-I/O.
//!
//! A program is registered per (program, version) with its procedures. A
//! procedure handler receives a [`Decoder`] positioned at the arguments and an
//! [`Encoder`] for the results. The handler *is* the upper-layer binding: it
//! decodes DDP-eligible arguments with `get_opaque_ddp` / `ddp_item` (so Read
//! chunks are re-inserted at their Position) and encodes DDP-eligible results
//! with `put_opaque_ddp` / `ddp_item` (so the Responder can move them into the
//! Requester's Write chunks). Over TCP the same handler runs with no chunks.
//!
//! Handlers must decode all of their arguments before acting: a decode error
//! (including a chunk found where a non-eligible argument sits, RFC 8166 §6.1)
//! then means the procedure did not run.
//!
//! [`dispatch`] answers every RFC 5531 §9 case: RPC_MISMATCH, AUTH_ERROR
//! (AUTH_BADCRED for an undecodable or unsupported credential, AUTH_BADVERF for
//! a verifier that is not AUTH_NONE, AUTH_TOOWEAK and others from the handler),
//! PROG_UNAVAIL, PROG_MISMATCH (with the lowest and highest registered
//! versions), PROC_UNAVAIL, GARBAGE_ARGS and SYSTEM_ERR.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::rpc::{
    AcceptStat, AuthStat, AuthSys, CallHeader, RPC_VERSION, RejectStat, ReplyBody, ReplyHeader, RpcMessage, flavor,
};
use crate::xdr::{DdpItem, Decoder, Encoder, ReplySizing, XdrDecode, XdrEncode, XdrError};

/// The caller's credential, as the server understood it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// AUTH_NONE.
    None,
    /// AUTH_SYS (RFC 5531 Appendix A).
    Sys {
        /// stamp.
        stamp: u32,
        /// machinename.
        machinename: Vec<u8>,
        /// uid.
        uid: u32,
        /// gid.
        gid: u32,
        /// Supplementary gids.
        gids: Vec<u32>,
    },
}

/// What a handler knows about the call.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// XID.
    pub xid: u32,
    /// Program.
    pub prog: u32,
    /// Version.
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
    /// Credential.
    pub cred: Credential,
    /// "tcp" or "rdma".
    pub transport: &'static str,
}

/// Why a handler did not produce results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcError {
    /// The arguments did not decode (GARBAGE_ARGS, or ERR_CHUNK over RDMA when a
    /// chunk was misplaced).
    Decode(XdrError),
    /// SYSTEM_ERR.
    SystemErr,
    /// Reject with AUTH_ERROR and this status (e.g. AUTH_TOOWEAK).
    Auth(AuthStat),
}

impl From<XdrError> for ProcError {
    fn from(e: XdrError) -> Self {
        ProcError::Decode(e)
    }
}

/// A procedure handler.
pub type Handler =
    Arc<dyn Fn(&CallContext, &mut Decoder<'_>, &mut Encoder<Vec<u8>>) -> Result<(), ProcError> + Send + Sync>;

/// A procedure's reply bound: from its arguments (a copy of the decoder positioned
/// at them), the largest its results can get, as the Requester provisions for them
/// (RFC 8166 §6.2, RPCR-ULB-02). A decode error here is answered as the handler's
/// would be (GARBAGE_ARGS, or ERR_CHUNK over RDMA).
pub type ReplyBound = Arc<dyn Fn(&mut Decoder<'_>) -> Result<ReplySizing, ProcError> + Send + Sync>;

#[derive(Clone)]
struct Procedure {
    handler: Handler,
    bound: Option<ReplyBound>,
}

/// Registered programs, versions and procedures.
#[derive(Clone, Default)]
pub struct Registry {
    /// FxHash: looked up on every call (program and procedure numbers come from the
    /// caller, but only the ones registered here are ever inserted).
    progs: FxHashMap<u32, BTreeMap<u32, FxHashMap<u32, Procedure>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        for (p, vs) in &self.progs {
            m.entry(p, &vs.keys().collect::<Vec<_>>());
        }
        m.finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register one procedure of `prog`/`vers`. Registering a version with no
    /// procedures is possible with [`Registry::register_version`].
    pub fn register<F>(&mut self, prog: u32, vers: u32, proc_: u32, handler: F) -> &mut Self
    where
        F: Fn(&CallContext, &mut Decoder<'_>, &mut Encoder<Vec<u8>>) -> Result<(), ProcError> + Send + Sync + 'static,
    {
        self.progs.entry(prog).or_default().entry(vers).or_default().insert(
            proc_,
            Procedure {
                handler: Arc::new(handler),
                bound: None,
            },
        );
        self
    }

    /// Register one procedure with its reply bound: [`dispatch_within`] then checks,
    /// before the handler runs, that a reply of `bound(args)` fits what the transport
    /// can carry and the server's largest reply, so a small Call cannot make the server
    /// build a large result it cannot send (issue 12 point 5). Procedures registered
    /// with [`Registry::register`] declare no bound: their reply is checked after the
    /// handler ran.
    pub fn register_bounded<B, F>(&mut self, prog: u32, vers: u32, proc_: u32, bound: B, handler: F) -> &mut Self
    where
        B: Fn(&mut Decoder<'_>) -> Result<ReplySizing, ProcError> + Send + Sync + 'static,
        F: Fn(&CallContext, &mut Decoder<'_>, &mut Encoder<Vec<u8>>) -> Result<(), ProcError> + Send + Sync + 'static,
    {
        self.register(prog, vers, proc_, handler);
        if let Some(p) = self
            .progs
            .get_mut(&prog)
            .and_then(|v| v.get_mut(&vers))
            .and_then(|p| p.get_mut(&proc_))
        {
            p.bound = Some(Arc::new(bound));
        }
        self
    }

    /// Make `prog`/`vers` known (calls to unregistered procedures get PROC_UNAVAIL).
    pub fn register_version(&mut self, prog: u32, vers: u32) -> &mut Self {
        self.progs.entry(prog).or_default().entry(vers).or_default();
        self
    }

    /// Add the NULL procedure (0, no arguments, no results) to `prog`/`vers`.
    pub fn register_null(&mut self, prog: u32, vers: u32) -> &mut Self {
        self.register_bounded(prog, vers, 0, |_| Ok(ReplySizing::default()), |_, _, _| Ok(()))
    }

    fn lookup(&self, prog: u32, vers: u32, proc_: u32) -> Result<&Procedure, AcceptStat> {
        let versions = self.progs.get(&prog).ok_or(AcceptStat::ProgUnavail)?;
        let Some(procs) = versions.get(&vers) else {
            let low = versions.keys().next().copied().unwrap_or(0);
            let high = versions.keys().next_back().copied().unwrap_or(0);
            return Err(AcceptStat::ProgMismatch { low, high });
        };
        procs.get(&proc_).ok_or(AcceptStat::ProcUnavail)
    }
}

/// The result of dispatching one call message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatch {
    /// An RPC reply to send: the encoded reply message (starting with the XID)
    /// and the DDP-eligible result items it contains (offsets in `stream`).
    Reply {
        /// XID.
        xid: u32,
        /// Reply message.
        stream: Vec<u8>,
        /// DDP-eligible results.
        items: Vec<DdpItem>,
        /// The accept or reject status sent (for logs and tests).
        status: ReplyStatus,
    },
    /// The argument decoder found a chunk where a non-eligible item sits, or a
    /// chunk nobody consumed (RFC 8166 §6.1, requirements B.5 #11): over RDMA the
    /// transport answers RDMA_ERROR/ERR_CHUNK. Over TCP this cannot happen.
    ChunkError {
        /// XID.
        xid: u32,
        /// The decoder error.
        error: XdrError,
    },
    /// Not a call, or a call header that does not decode: no answer (RFC 5531
    /// gives none; the XID cannot be trusted).
    Drop,
}

/// Summary of a reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStatus {
    /// MSG_ACCEPTED with this accept_stat.
    Accepted(AcceptStat),
    /// MSG_DENIED.
    Denied(RejectStat),
}

fn reply_only(xid: u32, body: ReplyBody<'static>) -> Dispatch {
    let h = ReplyHeader { xid, body };
    let stream = crate::rpc::encode_reply_header(&h).unwrap_or_default();
    let status = match body {
        ReplyBody::Accepted { stat, .. } => ReplyStatus::Accepted(stat),
        ReplyBody::Denied(r) => ReplyStatus::Denied(r),
    };
    Dispatch::Reply {
        xid,
        stream,
        items: Vec::new(),
        status,
    }
}

fn accepted(xid: u32, stat: AcceptStat) -> Dispatch {
    reply_only(
        xid,
        ReplyBody::Accepted {
            verf: crate::rpc::OpaqueAuth::NONE,
            stat,
        },
    )
}

fn credential(h: &CallHeader<'_>) -> Result<Credential, AuthStat> {
    if h.verf.flavor != flavor::AUTH_NONE || !h.verf.body.is_empty() {
        // Neither AUTH_NONE nor AUTH_SYS carries a verifier (RFC 5531 §10.1, §10.2).
        return Err(AuthStat::BadVerf);
    }
    match h.cred.flavor {
        flavor::AUTH_NONE if h.cred.body.is_empty() => Ok(Credential::None),
        flavor::AUTH_SYS => {
            let s = AuthSys::decode_body(h.cred.body).map_err(|_| AuthStat::BadCred)?;
            Ok(Credential::Sys {
                stamp: s.stamp,
                machinename: s.machinename.to_vec(),
                uid: s.uid,
                gid: s.gid,
                gids: s.gids,
            })
        }
        _ => Err(AuthStat::BadCred),
    }
}

/// What a reply may occupy, checked before a procedure runs ([`dispatch_within`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyRoom {
    /// The most reply octets (RPC reply header and results) the transport can carry
    /// for this Call: over RDMA the inline threshold plus the Call's Write chunks and
    /// Reply chunk. A procedure whose declared bound exceeds it is not run.
    pub carry: u64,
    /// The server's largest reply: a procedure whose declared bound exceeds it is not
    /// run (SYSTEM_ERR), and a reply that comes out larger is replaced by SYSTEM_ERR.
    pub max_reply: u64,
}

impl ReplyRoom {
    /// No limit (what [`dispatch`] uses).
    pub const UNLIMITED: ReplyRoom = ReplyRoom {
        carry: u64::MAX,
        max_reply: u64::MAX,
    };
}

/// [`dispatch_within`] refused to run a procedure whose declared reply bound exceeds
/// [`ReplyRoom::carry`]: over RDMA the Responder answers RDMA_ERROR/ERR_CHUNK (RFC 8166
/// §4.5.3: the Requester did not provide the reply resources the binding calls for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyTooLarge {
    /// XID.
    pub xid: u32,
    /// The procedure's declared bound (reply header and results).
    pub bound: u64,
    /// What the transport could carry.
    pub carry: u64,
}

/// Octets of an accepted reply header with an AUTH_NONE verifier (RFC 5531 §9).
const ACCEPTED_REPLY_HEADER: u64 = 24;

/// Dispatch one call. `dec` holds the whole RPC call message (starting at the
/// XID), with Read chunks attached when it came over RDMA. `transport` names the
/// transport for [`CallContext::transport`].
pub fn dispatch(registry: &Registry, dec: &mut Decoder<'_>, transport: &'static str) -> Dispatch {
    match dispatch_within(registry, dec, transport, ReplyRoom::UNLIMITED) {
        Ok(d) => d,
        // the room is unlimited
        Err(t) => accepted(t.xid, AcceptStat::SystemErr),
    }
}

/// [`dispatch`] with the reply bounded by `room`: a procedure registered with a reply
/// bound ([`Registry::register_bounded`]) whose bound for these arguments exceeds
/// `room.max_reply` gets SYSTEM_ERR and one that exceeds `room.carry` gets
/// [`ReplyTooLarge`], both without running; any reply larger than `room.max_reply`
/// is replaced by SYSTEM_ERR.
pub fn dispatch_within(
    registry: &Registry,
    dec: &mut Decoder<'_>,
    transport: &'static str,
    room: ReplyRoom,
) -> Result<Dispatch, ReplyTooLarge> {
    let msg = match RpcMessage::decode(dec) {
        Ok(m) => m,
        Err(e) if e.is_chunk_placement_error() => {
            return Ok(Dispatch::ChunkError { xid: 0, error: e });
        }
        Err(_) => return Ok(Dispatch::Drop),
    };
    let RpcMessage::Call(h) = msg else {
        return Ok(Dispatch::Drop);
    };
    let xid = h.xid;
    if h.rpcvers != RPC_VERSION {
        return Ok(reply_only(
            xid,
            ReplyBody::Denied(RejectStat::RpcMismatch {
                low: RPC_VERSION,
                high: RPC_VERSION,
            }),
        ));
    }
    let cred = match credential(&h) {
        Ok(c) => c,
        Err(s) => return Ok(reply_only(xid, ReplyBody::Denied(RejectStat::AuthError(s)))),
    };
    let procedure = match registry.lookup(h.prog, h.vers, h.proc_) {
        Ok(f) => f,
        Err(stat) => return Ok(accepted(xid, stat)),
    };
    if let Some(bound) = &procedure.bound {
        // issue 12 point 5: know the reply's size before doing the work
        match bound(&mut dec.clone()) {
            Ok(sizing) => {
                let bound = ACCEPTED_REPLY_HEADER + u64::from(sizing.max_results);
                if bound > room.max_reply {
                    return Ok(accepted(xid, AcceptStat::SystemErr));
                }
                if bound > room.carry {
                    return Err(ReplyTooLarge {
                        xid,
                        bound,
                        carry: room.carry,
                    });
                }
            }
            Err(e) => return Ok(proc_error(xid, e)),
        }
    }
    let handler = &procedure.handler;
    let ctx = CallContext {
        xid,
        prog: h.prog,
        vers: h.vers,
        proc_: h.proc_,
        cred,
        transport,
    };
    let mut out = Encoder::new(Vec::with_capacity(256));
    // the reply header goes first; results follow
    if ReplyHeader::accepted(xid, AcceptStat::Success)
        .encode(&mut out)
        .is_err()
    {
        return Ok(accepted(xid, AcceptStat::SystemErr));
    }
    let res = handler(&ctx, dec, &mut out).and_then(|()| dec.finish().map_err(ProcError::Decode));
    Ok(match res {
        Ok(()) => {
            let (stream, items) = out.finish();
            if stream.len() as u64 > room.max_reply {
                return Ok(accepted(xid, AcceptStat::SystemErr));
            }
            Dispatch::Reply {
                xid,
                stream,
                items,
                status: ReplyStatus::Accepted(AcceptStat::Success),
            }
        }
        Err(e) => proc_error(xid, e),
    })
}

fn proc_error(xid: u32, e: ProcError) -> Dispatch {
    match e {
        ProcError::Decode(e) if e.is_chunk_placement_error() => Dispatch::ChunkError { xid, error: e },
        ProcError::Decode(_) => accepted(xid, AcceptStat::GarbageArgs),
        ProcError::SystemErr => accepted(xid, AcceptStat::SystemErr),
        ProcError::Auth(s) => reply_only(xid, ReplyBody::Denied(RejectStat::AuthError(s))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::OpaqueAuth;

    fn call(rpcvers: u32, prog: u32, vers: u32, proc_: u32, cred: OpaqueAuth<'_>, args: &[u8]) -> Vec<u8> {
        let mut e = Encoder::new(Vec::new());
        CallHeader {
            xid: 77,
            rpcvers,
            prog,
            vers,
            proc_,
            cred,
            verf: OpaqueAuth::NONE,
        }
        .encode(&mut e)
        .unwrap();
        let mut v = e.finish().0;
        v.extend_from_slice(args);
        v
    }

    fn status(reg: &Registry, msg: &[u8]) -> ReplyStatus {
        match dispatch(reg, &mut Decoder::new(msg), "test") {
            Dispatch::Reply {
                status, xid, stream, ..
            } => {
                assert_eq!(xid, 77);
                // the stream decodes as a reply with the same status
                let RpcMessage::Reply(r) = RpcMessage::decode(&mut Decoder::new(&stream)).unwrap() else {
                    panic!()
                };
                match (r.body, status) {
                    (ReplyBody::Accepted { stat, .. }, ReplyStatus::Accepted(s)) => assert_eq!(stat, s),
                    (ReplyBody::Denied(d), ReplyStatus::Denied(s)) => assert_eq!(d, s),
                    other => panic!("{other:?}"),
                }
                status
            }
            other => panic!("{other:?}"),
        }
    }

    fn reg() -> Registry {
        let mut r = Registry::new();
        r.register_null(100, 2)
            .register_null(100, 4)
            .register(100, 3, 1, |ctx, d, e| {
                let x = d.get_u32()?;
                if x == 0xdead {
                    return Err(ProcError::SystemErr);
                }
                if x == 0xbeef && ctx.cred == Credential::None {
                    return Err(ProcError::Auth(AuthStat::TooWeak));
                }
                e.put_u32(x + 1)?;
                Ok(())
            });
        r
    }

    /// Every accept and reject status of RFC 5531 §9 (issue 5 item 2).
    #[test]
    fn every_status() {
        let r = reg();
        use AcceptStat::*;
        let a = |s| ReplyStatus::Accepted(s);
        assert_eq!(
            status(&r, &call(2, 100, 3, 1, OpaqueAuth::NONE, &[0, 0, 0, 1])),
            a(Success)
        );
        assert_eq!(status(&r, &call(2, 101, 3, 1, OpaqueAuth::NONE, &[])), a(ProgUnavail));
        assert_eq!(
            status(&r, &call(2, 100, 9, 1, OpaqueAuth::NONE, &[])),
            a(ProgMismatch { low: 2, high: 4 })
        );
        assert_eq!(status(&r, &call(2, 100, 3, 7, OpaqueAuth::NONE, &[])), a(ProcUnavail));
        assert_eq!(
            status(&r, &call(2, 100, 3, 1, OpaqueAuth::NONE, &[0, 0])),
            a(GarbageArgs)
        );
        assert_eq!(
            status(&r, &call(2, 100, 3, 1, OpaqueAuth::NONE, &[0, 0, 0xde, 0xad])),
            a(SystemErr)
        );
        assert_eq!(
            status(&r, &call(3, 100, 3, 1, OpaqueAuth::NONE, &[])),
            ReplyStatus::Denied(RejectStat::RpcMismatch { low: 2, high: 2 })
        );
        let denied = |s| ReplyStatus::Denied(RejectStat::AuthError(s));
        assert_eq!(
            status(&r, &call(2, 100, 3, 1, OpaqueAuth::NONE, &[0, 0, 0xbe, 0xef])),
            denied(AuthStat::TooWeak)
        );
        let bad = OpaqueAuth {
            flavor: flavor::AUTH_SYS,
            body: &[0, 0, 0, 1],
        };
        assert_eq!(status(&r, &call(2, 100, 3, 1, bad, &[])), denied(AuthStat::BadCred));
        let unknown = OpaqueAuth {
            flavor: flavor::AUTH_DH,
            body: &[],
        };
        assert_eq!(status(&r, &call(2, 100, 3, 1, unknown, &[])), denied(AuthStat::BadCred));
        let sys = AuthSys {
            stamp: 1,
            machinename: b"host",
            uid: 1000,
            gid: 100,
            gids: vec![4, 5],
        }
        .encode_body()
        .unwrap();
        assert_eq!(
            status(&r, &call(2, 100, 3, 1, AuthSys::credential(&sys), &[0, 0, 0xbe, 0xef])),
            a(Success)
        );
        // a bad verifier
        let mut m = call(2, 100, 3, 1, OpaqueAuth::NONE, &[0, 0, 0, 1]);
        m[32..36].copy_from_slice(&1u32.to_be_bytes()); // verifier flavor AUTH_SYS
        assert_eq!(status(&r, &m), denied(AuthStat::BadVerf));
        // not a call, or garbage: no answer
        assert_eq!(
            dispatch(&r, &mut Decoder::new(&[0, 0, 0, 1, 0, 0, 0, 1]), "t"),
            Dispatch::Drop
        );
        assert_eq!(dispatch(&r, &mut Decoder::new(&[0, 0]), "t"), Dispatch::Drop);
    }

    /// Issue 12 point 5 (RPCR-ULB-02, RFC 8166 §6.2): a procedure's declared reply bound is
    /// checked against the room before the handler runs; an undeclared one's reply after.
    #[test]
    fn reply_bounds_are_checked_before_the_work() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let ran = Arc::new(AtomicU32::new(0));
        let mut r = Registry::new();
        let ran2 = ran.clone();
        r.register_bounded(
            100,
            3,
            1,
            |d| {
                Ok(ReplySizing {
                    max_results: 4 + d.get_u32()?,
                    ddp_results: vec![],
                })
            },
            move |_, d, e| {
                ran2.fetch_add(1, Ordering::Relaxed);
                let n = d.get_u32()?;
                e.put_opaque(&vec![1u8; n as usize], 1 << 20)?;
                Ok(())
            },
        );
        r.register(100, 3, 2, |_, d, e| {
            let n = d.get_u32()?;
            e.put_opaque(&vec![1u8; n as usize], 1 << 20)?;
            Ok(())
        });
        let room = ReplyRoom {
            carry: 1024,
            max_reply: 4096,
        };
        let run = |proc_, n: u32| {
            let m = call(2, 100, 3, proc_, OpaqueAuth::NONE, &n.to_be_bytes());
            dispatch_within(&r, &mut Decoder::new(&m), "t", room)
        };
        // fits: runs
        assert!(matches!(run(1, 900), Ok(Dispatch::Reply { .. })));
        assert_eq!(ran.load(Ordering::Relaxed), 1);
        // more than the transport can carry: refused, not run
        assert_eq!(
            run(1, 2000),
            Err(ReplyTooLarge {
                xid: 77,
                bound: 24 + 4 + 2000,
                carry: 1024
            })
        );
        // more than the server's largest reply: SYSTEM_ERR, not run
        let Ok(Dispatch::Reply { status, .. }) = run(1, 5000) else {
            panic!()
        };
        assert_eq!(status, ReplyStatus::Accepted(AcceptStat::SystemErr));
        assert_eq!(
            ran.load(Ordering::Relaxed),
            1,
            "the handler ran only for the call that fits"
        );
        // undeclared: the reply is checked after
        let Ok(Dispatch::Reply { status, .. }) = run(2, 5000) else {
            panic!()
        };
        assert_eq!(status, ReplyStatus::Accepted(AcceptStat::SystemErr));
        assert!(matches!(run(2, 2000), Ok(Dispatch::Reply { .. })));
        // a bound whose arguments do not decode: GARBAGE_ARGS, as the handler would
        let m = call(2, 100, 3, 1, OpaqueAuth::NONE, &[0, 0]);
        let Ok(Dispatch::Reply { status, .. }) = dispatch_within(&r, &mut Decoder::new(&m), "t", room) else {
            panic!()
        };
        assert_eq!(status, ReplyStatus::Accepted(AcceptStat::GarbageArgs));
    }
}
