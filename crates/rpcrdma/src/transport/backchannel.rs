//! RFC 8167 reverse-direction RPC on an RPC-over-RDMA connection, Short messages only (no
//! chunks, as §5.3 allows when the upper layer needs none): the Responder (ONC RPC server)
//! calls, the Requester (ONC RPC client) answers from a [`Registry`].
//!
//! * Receive buffers (§4.3): a Requester opened with
//!   [`super::RdmaClient::connect_with_backchannel`] posts [`BC_CREDITS`] receives beyond its
//!   forward credits; a Responder always posts [`BC_CREDITS`] receives beyond its grant for
//!   reverse-direction Replies, and does not count them against the forward grant.
//! * Credits (§4.1) are accounted apart from the forward direction: reverse Calls ask for
//!   [`BC_CREDITS`], reverse Replies grant [`BC_CREDITS`], and a Responder keeps at most that
//!   many reverse Calls outstanding.
//! * Inline thresholds (§4.2): a reverse Call is at most the forward Reply threshold, a
//!   reverse Reply at most the forward Call threshold; a reverse Reply that would not fit is
//!   replaced by SYSTEM_ERR.
//! * A reverse Call with chunks is answered with RDMA_ERROR / ERR_CHUNK (§5.3).
//! * A ULP must not send reverse Calls before the peer said it is prepared (§6): without
//!   `connect_with_backchannel` the Requester drops them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use verbs::{Access, ProtectionDomain, QueuePair, SendFlags, SendWr, WrOpcode};

use crate::client::{Call, Disconnect, LocalError, RpcError, XidSource, decode_reply};
use crate::inline::Thresholds;
use crate::rpc::{AcceptStat, MSG_CALL, MSG_REPLY, ReplyHeader, peek_xid_and_type};
use crate::server::{Dispatch, Registry, dispatch};
use crate::wire::{Body, ChunkLists, ErrorBody, FixedHeader, Header, Limits};
use crate::xdr::{Decoder, XdrError};

/// Reverse-direction credits (receives each side adds for the reverse direction).
pub const BC_CREDITS: u32 = 8;

/// What a received message is, for the reverse direction.
pub(crate) enum Kind<'a> {
    /// RDMA_MSG with an RPC Call in the payload (a reverse Call when received by a Requester).
    Call {
        lists: ChunkLists,
        payload: &'a [u8],
        fixed: FixedHeader,
    },
    /// RDMA_MSG with an RPC Reply and no chunks (a reverse Reply when received by a Responder).
    Reply { xid: u32, payload: &'a [u8] },
    /// Anything else.
    Other,
}

/// Classify `msg` by its RPC message direction (RFC 8167 §4.1: the RPC msg_type tells).
pub(crate) fn classify(msg: &[u8]) -> Kind<'_> {
    let Ok((h, len)) = Header::decode(msg, &Limits::default()) else {
        return Kind::Other;
    };
    let Body::Msg(lists) = h.body else {
        return Kind::Other;
    };
    let payload = &msg[len..];
    match peek_xid_and_type(payload) {
        Some((xid, MSG_CALL)) if xid == h.xid => Kind::Call {
            lists,
            payload,
            fixed: FixedHeader {
                xid: h.xid,
                vers: h.vers,
                credit: h.credit,
                proc_: 0,
            },
        },
        Some((xid, MSG_REPLY)) if xid == h.xid && lists == ChunkLists::default() => Kind::Reply { xid, payload },
        _ => Kind::Other,
    }
}

/// Cheap check on the first bytes of a receive buffer (Responder, before credit accounting):
/// RDMA_MSG, three empty lists, then an RPC Reply.
pub(crate) fn looks_like_reverse_reply(head: &[u8]) -> bool {
    let w = |i: usize| {
        head.get(i * 4..i * 4 + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    w(3) == Some(0) && w(4) == Some(0) && w(5) == Some(0) && w(6) == Some(0) && w(8) == Some(MSG_REPLY)
}

/// Build the RDMA_MSG that answers a reverse Call (Requester side): the RPC reply from
/// `registry`, or RDMA_ERROR/ERR_CHUNK when the Call carries chunks, or nothing (the Call
/// does not decode). `max_send` is the forward Call threshold.
pub(crate) fn answer(registry: &Registry, kind: Kind<'_>, max_send: usize) -> Option<Vec<u8>> {
    let Kind::Call { lists, payload, fixed } = kind else {
        return None;
    };
    if lists != ChunkLists::default() {
        return Header::error_reply(&fixed, BC_CREDITS, ErrorBody::Chunk).to_vec().ok();
    }
    let stream = match dispatch(registry, &mut Decoder::new(payload), "rdma-backchannel") {
        Dispatch::Reply { stream, .. } => stream,
        Dispatch::ChunkError { .. } => {
            return Header::error_reply(&fixed, BC_CREDITS, ErrorBody::Chunk).to_vec().ok();
        }
        Dispatch::Drop => return None,
    };
    let header = Header::new(fixed.xid, BC_CREDITS, Body::Msg(ChunkLists::default()));
    let mut m = header.to_vec().ok()?;
    if m.len() + stream.len() <= max_send {
        m.extend_from_slice(&stream);
    } else {
        m.extend_from_slice(
            &crate::rpc::encode_reply_header(&ReplyHeader::accepted(fixed.xid, AcceptStat::SystemErr)).ok()?,
        );
    }
    Some(m)
}

/// The Responder's side of one connection's reverse direction.
pub(crate) struct Shared {
    pub(crate) qp: Arc<QueuePair>,
    pub(crate) pd: ProtectionDomain,
    pub(crate) th: Thresholds,
    pending: Mutex<HashMap<u32, SyncSender<Vec<u8>>>>,
    outstanding: Mutex<u32>,
    cv: Condvar,
    xids: XidSource,
    pub(crate) closed: AtomicBool,
    calls: AtomicU32,
}

impl Shared {
    pub(crate) fn new(qp: Arc<QueuePair>, pd: ProtectionDomain, th: Thresholds) -> Arc<Shared> {
        Arc::new(Shared {
            qp,
            pd,
            th,
            pending: Mutex::new(HashMap::new()),
            outstanding: Mutex::new(0),
            cv: Condvar::new(),
            xids: XidSource::new(),
            closed: AtomicBool::new(false),
            calls: AtomicU32::new(0),
        })
    }

    /// A reverse Reply arrived (Responder's receive loop); false if nobody waits for it.
    pub(crate) fn deliver(&self, xid: u32, payload: &[u8]) -> bool {
        match self.pending.lock().unwrap().remove(&xid) {
            Some(tx) => {
                let _ = tx.send(payload.to_vec());
                true
            }
            None => false,
        }
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.pending.lock().unwrap().clear();
        self.cv.notify_all();
    }
}

/// A handle for reverse-direction calls to one connected client (see
/// [`super::RdmaServer::backchannels`]).
#[derive(Clone)]
pub struct Backchannel(pub(crate) Arc<Shared>);

impl std::fmt::Debug for Backchannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backchannel(calls: {})", self.0.calls.load(Ordering::Relaxed))
    }
}

impl Backchannel {
    /// True while the connection is up.
    pub fn is_open(&self) -> bool {
        !self.0.closed.load(Ordering::Acquire)
    }

    /// Make one reverse-direction call (a Short message; RFC 8167 §5.1) and decode its
    /// results. Only for clients that said they are prepared (§6).
    pub fn call<T>(
        &self,
        call: &Call<'_>,
        timeout: Duration,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, RpcError> {
        let s = &self.0;
        let deadline = Instant::now() + timeout;
        let xid = s.xids.next();
        let (stream, items) = call.encode(xid).map_err(LocalError::Encode)?;
        // no reverse-direction chunks: DDP-eligible items stay inline
        let _ = items;
        let mut msg = Header::new(xid, BC_CREDITS, Body::Msg(ChunkLists::default()))
            .to_vec()
            .map_err(LocalError::Header)?;
        msg.extend_from_slice(&stream);
        if msg.len() > s.th.reply as usize {
            return Err(LocalError::ReverseCallTooLarge {
                len: msg.len(),
                threshold: s.th.reply,
            }
            .into());
        }
        // RFC 8167 §4.1: at most BC_CREDITS reverse calls outstanding
        {
            let mut n = s.outstanding.lock().unwrap();
            while *n >= BC_CREDITS {
                let now = Instant::now();
                if now >= deadline || s.closed.load(Ordering::Acquire) {
                    return Err(RpcError::Timeout);
                }
                n = s.cv.wait_timeout(n, deadline - now).unwrap().0;
            }
            *n += 1;
        }
        let release = || {
            *s.outstanding.lock().unwrap() -= 1;
            s.cv.notify_one();
        };
        let r = (|| {
            if s.closed.load(Ordering::Acquire) {
                return Err(Disconnect::Closed.into());
            }
            let mr = s.pd.reg_mr(msg.len(), Access::LOCAL_WRITE).map_err(LocalError::from)?;
            let _ = mr.write(0, &msg);
            let (tx, rx) = sync_channel(1);
            s.pending.lock().unwrap().insert(xid, tx);
            // unsignaled: the connection's receive loop owns the CQ
            let wr = SendWr::new(super::wrid::SEND, WrOpcode::Send, vec![mr.sge(0, msg.len() as u32)])
                .flags(SendFlags::empty());
            if let Err(e) = s.qp.post_send(&[wr]) {
                s.pending.lock().unwrap().remove(&xid);
                return Err(Disconnect::from(e).into());
            }
            s.calls.fetch_add(1, Ordering::Relaxed);
            let reply = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .map_err(|_| {
                    s.pending.lock().unwrap().remove(&xid);
                    if s.closed.load(Ordering::Acquire) {
                        RpcError::Disconnected(Disconnect::Closed)
                    } else {
                        RpcError::Timeout
                    }
                })?;
            drop(mr);
            decode_reply(&mut Decoder::new(&reply), xid, decode)
        })();
        release();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Segment, WriteChunk};

    fn call_msg(lists: ChunkLists) -> Vec<u8> {
        let args = |_: &mut crate::xdr::Encoder<Vec<u8>>| Ok(());
        let call = Call::new(7, 1, 0, &args, Default::default());
        let (stream, _) = call.encode(0x55).unwrap();
        let mut m = Header::new(0x55, 2, Body::Msg(lists)).to_vec().unwrap();
        m.extend_from_slice(&stream);
        m
    }

    /// RFC 8167 §5.3: a reverse Call with chunks gets RDMA_ERROR / ERR_CHUNK; without, a
    /// Short Reply granting BC_CREDITS (§4.1).
    #[test]
    fn reverse_call_with_chunks_gets_err_chunk() {
        let mut reg = Registry::new();
        reg.register_null(7, 1);
        let lists = ChunkLists {
            writes: vec![WriteChunk {
                segments: vec![Segment {
                    handle: 1,
                    length: 8,
                    offset: 0,
                }],
            }],
            ..ChunkLists::default()
        };
        let m = call_msg(lists);
        let out = answer(&reg, classify(&m), 1024).unwrap();
        let (h, _) = Header::decode(&out, &Limits::default()).unwrap();
        assert_eq!((h.xid, h.credit), (0x55, BC_CREDITS));
        assert!(matches!(h.body, Body::Error(ErrorBody::Chunk)), "{:?}", h.body);
        let m = call_msg(ChunkLists::default());
        let out = answer(&reg, classify(&m), 1024).unwrap();
        let (h, len) = Header::decode(&out, &Limits::default()).unwrap();
        assert_eq!(h.credit, BC_CREDITS);
        assert_eq!(peek_xid_and_type(&out[len..]), Some((0x55, MSG_REPLY)));
        // and the Responder recognises that Reply by its first bytes
        assert!(looks_like_reverse_reply(&out[..36]));
        assert!(!looks_like_reverse_reply(&m[..36]));
    }
}
