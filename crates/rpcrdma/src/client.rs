//! What an RPC caller hands to a client, and what comes back; shared by the TCP
//! client ([`crate::tcp::TcpClient`]) and the RPC-over-RDMA Requester
//! ([`crate::transport::RdmaClient`]).
//!
//! A [`Call`] carries the procedure's upper-layer binding on the client side:
//! the argument encoder (which marks DDP-eligible arguments with the `*_ddp`
//! encoder methods) and the [`ReplySizing`] (largest results and largest
//! DDP-eligible result items, RFC 8166 §6.2, RPCR-ULB-02). The result decoder is
//! a closure that gets a [`Decoder`] positioned after the reply header, with the
//! Requester's Write chunks attached.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::rpc::{AcceptStat, AuthSys, CallHeader, OpaqueAuth, RPC_VERSION, RejectStat, ReplyBody, RpcMessage};
use crate::wire::ErrorBody;
use crate::xdr::{DdpItem, Decoder, Encoder, ReplySizing, XdrDecode, XdrEncode, XdrError};

/// The credential a client sends.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Auth {
    /// AUTH_NONE.
    #[default]
    None,
    /// AUTH_SYS with this encoded body (see [`Auth::sys`]).
    Sys(Vec<u8>),
}

impl Auth {
    /// AUTH_SYS for `machinename`, `uid`, `gid`, `gids`.
    pub fn sys(machinename: &str, uid: u32, gid: u32, gids: &[u32]) -> Result<Auth, XdrError> {
        Ok(Auth::Sys(
            AuthSys {
                stamp: 0,
                machinename: machinename.as_bytes(),
                uid,
                gid,
                gids: gids.to_vec(),
            }
            .encode_body()?,
        ))
    }

    fn opaque(&self) -> OpaqueAuth<'_> {
        match self {
            Auth::None => OpaqueAuth::NONE,
            Auth::Sys(b) => AuthSys::credential(b),
        }
    }
}

/// Argument encoder of a call.
pub type ArgsFn<'a> = &'a (dyn Fn(&mut Encoder<Vec<u8>>) -> Result<(), XdrError> + Sync);

/// One RPC to make.
#[derive(Clone)]
pub struct Call<'a> {
    /// Program.
    pub prog: u32,
    /// Version.
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
    /// Credential.
    pub auth: &'a Auth,
    /// Encodes the arguments (called again for a retransmission).
    pub args: ArgsFn<'a>,
    /// Largest results (for Write chunks and the Reply chunk over RDMA).
    pub reply: ReplySizing,
}

impl std::fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Call({:#x}/{}/{})", self.prog, self.vers, self.proc_)
    }
}

static NO_AUTH: Auth = Auth::None;

impl<'a> Call<'a> {
    /// A call with AUTH_NONE.
    pub fn new(prog: u32, vers: u32, proc_: u32, args: ArgsFn<'a>, reply: ReplySizing) -> Call<'a> {
        Call {
            prog,
            vers,
            proc_,
            auth: &NO_AUTH,
            args,
            reply,
        }
    }

    /// Use this credential.
    pub fn with_auth(mut self, auth: &'a Auth) -> Self {
        self.auth = auth;
        self
    }

    /// Encode the whole call message with `xid`; returns it and its DDP-eligible items.
    pub fn encode(&self, xid: u32) -> Result<(Vec<u8>, Vec<DdpItem>), XdrError> {
        let mut e = Encoder::new(Vec::with_capacity(256));
        CallHeader {
            xid,
            rpcvers: RPC_VERSION,
            prog: self.prog,
            vers: self.vers,
            proc_: self.proc_,
            cred: self.auth.opaque(),
            verf: OpaqueAuth::NONE,
        }
        .encode(&mut e)?;
        (self.args)(&mut e)?;
        Ok(e.finish())
    }
}

/// Why an RPC failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// The server accepted the call but did not succeed (PROG_UNAVAIL, ...).
    #[error("call accepted with status {0:?}")]
    Accepted(AcceptStat),
    /// The server rejected the call (RPC_MISMATCH, AUTH_ERROR).
    #[error("call denied: {0:?}")]
    Denied(RejectStat),
    /// The Responder answered RDMA_ERROR: a permanent failure (RFC 8166 §4.5, RPCR-ERR-05).
    #[error("RDMA_ERROR from the responder: {0:?}")]
    RdmaError(ErrorBody),
    /// The reply or its results did not decode, or the Reply broke the chunk
    /// rules (RPCR-DDP-08): a permanent failure.
    #[error("reply did not decode: {0}")]
    Decode(XdrError),
    /// The call could not be encoded or sent (RPCR-MEM-04).
    #[error("cannot send the call: {0}")]
    Local(String),
    /// No reply in time, after the retries.
    #[error("no reply within the timeout")]
    Timeout,
    /// The connection was lost and could not be re-established.
    #[error("connection lost: {0}")]
    Disconnected(String),
}

impl From<XdrError> for RpcError {
    fn from(e: XdrError) -> Self {
        RpcError::Decode(e)
    }
}

/// XIDs: start from a per-process value and count up.
#[derive(Debug)]
pub struct XidSource(AtomicU32);

impl XidSource {
    /// Start from a value derived from the clock and the process id.
    pub fn new() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
            .unwrap_or(1);
        XidSource(AtomicU32::new(t ^ (std::process::id() << 16)))
    }
    /// The next XID.
    pub fn next(&self) -> u32 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

impl Default for XidSource {
    fn default() -> Self {
        Self::new()
    }
}

/// Decode a reply message header and, on success, the results with `decode`;
/// `dec` holds the reply starting at its XID. All chunks must be consumed.
pub fn decode_reply<T>(
    dec: &mut Decoder<'_>,
    xid: u32,
    decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
) -> Result<T, RpcError> {
    let RpcMessage::Reply(r) = RpcMessage::decode(dec)? else {
        return Err(RpcError::Decode(XdrError::BadDiscriminant {
            what: "msg_type",
            value: 0,
        }));
    };
    if r.xid != xid {
        return Err(RpcError::Decode(XdrError::BadDiscriminant {
            what: "xid",
            value: r.xid,
        }));
    }
    match r.body {
        ReplyBody::Accepted {
            stat: AcceptStat::Success,
            ..
        } => {
            let v = decode(dec)?;
            dec.finish()?;
            Ok(v)
        }
        ReplyBody::Accepted { stat, .. } => Err(RpcError::Accepted(stat)),
        ReplyBody::Denied(d) => Err(RpcError::Denied(d)),
    }
}

/// A client of either transport. The transports implement it next to their
/// client types ([`crate::tcp::TcpClient`], [`crate::transport::RdmaClient`]), so
/// this module depends on neither.
pub trait RpcClient {
    /// Make one call and decode its results with `decode`.
    fn call<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, RpcError>;
}
