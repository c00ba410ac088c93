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
    Local(LocalError),
    /// No reply in time, after the retries.
    #[error("no reply within the timeout")]
    Timeout,
    /// The connection was lost and could not be re-established.
    #[error("connection lost: {0}")]
    Disconnected(Disconnect),
}

/// Why a call could not be encoded or sent ([`RpcError::Local`]): nothing
/// reached the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocalError {
    /// The call's arguments did not encode.
    #[error("encoding the call: {0}")]
    Encode(XdrError),
    /// RPC record marking (TCP) refused the message.
    #[error("record marking: {0}")]
    Record(crate::record::RecordError),
    /// The RPC-over-RDMA header did not encode.
    #[error("RPC-over-RDMA header: {0}")]
    Header(crate::wire::HeaderError),
    /// No form (Short, chunked, Long) fits the call in the negotiated limits.
    #[error("choosing the call's form: {0}")]
    Inline(crate::inline::InlineError),
    /// Our RFC 8166 private data could not be built.
    #[error("private data: {0}")]
    PrivateData(crate::private_data::PrivateDataError),
    /// RFC 8167: a reverse-direction Call has no chunks, so it must fit inline.
    #[error(
        "reverse-direction call of {len} bytes exceeds the inline threshold {threshold} (no chunks in the reverse direction)"
    )]
    ReverseCallTooLarge {
        /// The Call's length, RPC-over-RDMA header included.
        len: usize,
        /// The inline threshold it must fit (the peer's receive size).
        threshold: u32,
    },
    /// A verbs call for the call's memory failed (registration, pool).
    #[error(transparent)]
    Verbs(Shared<verbs::Error>),
    /// The operating system refused a resource (the connection's thread).
    #[error(transparent)]
    Io(Shared<std::io::Error>),
}

/// Why a connection ended ([`RpcError::Disconnected`]); every call waiting
/// on it gets the same value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Disconnect {
    /// No connection could be made (the first attempt's error comes instead when there was one).
    #[error("not connected")]
    NotConnected,
    /// The client closed the connection (drop or shutdown).
    #[error("connection closed")]
    Closed,
    /// The server closed the connection.
    #[error("closed by the server")]
    ClosedByPeer,
    /// A work request completed in error; any failed operation ends the
    /// connection (RPCR-MEM-02, RPCR-MEM-05).
    #[error("{opcode:?} completed with {status} (wr {wr_id:#x})")]
    WorkRequest {
        /// What the work request was.
        opcode: verbs::WcOpcode,
        /// How it ended.
        status: verbs::WcStatus,
        /// Its id (the transport's bookkeeping: kind and slot).
        wr_id: u64,
    },
    /// The connection manager reported the end of the connection.
    #[error("connection manager event {0:?}")]
    Event(verbs::CmEvent),
    /// A receive completion named a receive buffer we never posted.
    #[error("receive completion for slot {0}, outside the receive buffers")]
    ReceiveSlot(usize),
    /// The TCP record stream broke the record-marking rules.
    #[error("record marking: {0}")]
    Record(crate::record::RecordError),
    /// A verbs call on the connection failed (post_send, post_recv, connect).
    #[error(transparent)]
    Verbs(Shared<verbs::Error>),
    /// The socket failed (TCP).
    #[error(transparent)]
    Io(Shared<std::io::Error>),
}

/// An error that is not `Clone` (verbs', the socket's), shared by every call
/// it fails. Equal when it is the same error or reads the same.
#[derive(Debug)]
pub struct Shared<E>(pub std::sync::Arc<E>);

impl<E> Clone for Shared<E> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Shared<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Shared<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl<E: std::fmt::Display> PartialEq for Shared<E> {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl<E: std::fmt::Display> Eq for Shared<E> {}

impl<E> Shared<E> {
    /// The shared error.
    pub fn get(&self) -> &E {
        &self.0
    }
}

impl From<verbs::Error> for LocalError {
    fn from(e: verbs::Error) -> Self {
        LocalError::Verbs(Shared(std::sync::Arc::new(e)))
    }
}

impl From<std::io::Error> for LocalError {
    fn from(e: std::io::Error) -> Self {
        LocalError::Io(Shared(std::sync::Arc::new(e)))
    }
}

impl From<verbs::Error> for Disconnect {
    fn from(e: verbs::Error) -> Self {
        Disconnect::Verbs(Shared(std::sync::Arc::new(e)))
    }
}

impl From<std::io::Error> for Disconnect {
    fn from(e: std::io::Error) -> Self {
        Disconnect::Io(Shared(std::sync::Arc::new(e)))
    }
}

impl From<LocalError> for RpcError {
    fn from(e: LocalError) -> Self {
        RpcError::Local(e)
    }
}

impl From<Disconnect> for RpcError {
    fn from(e: Disconnect) -> Self {
        RpcError::Disconnected(e)
    }
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
