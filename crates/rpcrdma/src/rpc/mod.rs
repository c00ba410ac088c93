//! ONC RPC version 2 messages (RFC 5531 §8-§10, Appendix A).
//!
//! Read RFC 5531 §9 ("The RPC Message Protocol") before editing. The call and
//! reply *headers* are decoded here; procedure arguments and results follow in
//! the same [`Decoder`] and belong to the upper-layer protocol.
//!
//! * A call with `rpcvers != 2` still decodes, so a server can answer
//!   `RPC_MISMATCH` (RFC 5531 §9); [`CallHeader::rpcvers`] keeps the raw value.
//! * `auth_stat` values are open-ended (IANA, RFC 5531 §9): unknown ones survive
//!   as [`AuthStat::Unknown`]. `accept_stat`, `reject_stat` and `msg_type` are
//!   closed unions: an unknown value is an XDR error, because what follows it
//!   cannot be decoded.
//! * Over RPC-over-RDMA the Payload stream starts at the XID (RFC 8166 §3.2);
//!   over TCP each message is one record (see [`crate::record`]).

mod auth;

pub use auth::{AuthStat, AuthSys, MAX_GIDS, MAX_MACHINENAME};

use crate::xdr::{Decoder, Encoder, Sink, XdrDecode, XdrEncode, XdrError};

/// The only RPC protocol version (RFC 5531 §9: "rpcvers MUST be equal to 2").
pub const RPC_VERSION: u32 = 2;

/// Maximum size of an `opaque_auth` body (RFC 5531 §8.2: `opaque body<400>`).
pub const MAX_AUTH_BYTES: usize = 400;

/// `msg_type` CALL.
pub const MSG_CALL: u32 = 0;
/// `msg_type` REPLY.
pub const MSG_REPLY: u32 = 1;

/// Authentication flavor numbers (RFC 5531 §8.2 and IANA).
pub mod flavor {
    /// AUTH_NONE (RFC 5531 §10.1).
    pub const AUTH_NONE: u32 = 0;
    /// AUTH_SYS (RFC 5531 Appendix A).
    pub const AUTH_SYS: u32 = 1;
    /// AUTH_SHORT.
    pub const AUTH_SHORT: u32 = 2;
    /// AUTH_DH.
    pub const AUTH_DH: u32 = 3;
    /// RPCSEC_GSS (RFC 2203).
    pub const RPCSEC_GSS: u32 = 6;
}

/// `opaque_auth`: a flavor and an opaque body of at most 400 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpaqueAuth<'a> {
    /// Authentication flavor ([`flavor`]).
    pub flavor: u32,
    /// Flavor-specific body (RFC 5531 §8.2).
    pub body: &'a [u8],
}

impl OpaqueAuth<'static> {
    /// AUTH_NONE with an empty body (RFC 5531 §10.1 recommends length zero).
    pub const NONE: OpaqueAuth<'static> = OpaqueAuth {
        flavor: flavor::AUTH_NONE,
        body: &[],
    };
}

impl<'a> OpaqueAuth<'a> {
    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        8 + crate::xdr::roundup(self.body.len()).unwrap_or(usize::MAX - 8)
    }

    /// Interpret an AUTH_SYS credential body.
    pub fn as_auth_sys(&self) -> Result<AuthSys<'a>, XdrError> {
        if self.flavor != flavor::AUTH_SYS {
            return Err(XdrError::BadDiscriminant {
                what: "AUTH_SYS flavor",
                value: self.flavor,
            });
        }
        AuthSys::decode_body(self.body)
    }
}

impl XdrEncode for OpaqueAuth<'_> {
    fn encode<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), XdrError> {
        enc.put_enum(self.flavor)?;
        enc.put_opaque(self.body, MAX_AUTH_BYTES)
    }
}

impl<'a> XdrDecode<'a> for OpaqueAuth<'a> {
    fn decode(dec: &mut Decoder<'a>) -> Result<Self, XdrError> {
        let flavor = dec.get_enum()?;
        let body = dec.get_opaque(MAX_AUTH_BYTES)?;
        Ok(OpaqueAuth { flavor, body })
    }
}

/// `call_body` with its XID: everything before the procedure arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallHeader<'a> {
    /// Transaction ID.
    pub xid: u32,
    /// RPC protocol version (2; other values decode so RPC_MISMATCH can be sent).
    pub rpcvers: u32,
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub proc_: u32,
    /// Credential.
    pub cred: OpaqueAuth<'a>,
    /// Verifier.
    pub verf: OpaqueAuth<'a>,
}

impl CallHeader<'_> {
    /// Encoded size of the call header.
    pub fn encoded_len(&self) -> usize {
        24 + self.cred.encoded_len() + self.verf.encoded_len()
    }
}

/// `accept_stat` with its arm (RFC 5531 §9 `accepted_reply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptStat {
    /// SUCCESS (0): procedure-specific results follow.
    Success,
    /// PROG_UNAVAIL (1).
    ProgUnavail,
    /// PROG_MISMATCH (2) with the supported version range.
    ProgMismatch {
        /// Lowest supported version.
        low: u32,
        /// Highest supported version.
        high: u32,
    },
    /// PROC_UNAVAIL (3).
    ProcUnavail,
    /// GARBAGE_ARGS (4).
    GarbageArgs,
    /// SYSTEM_ERR (5).
    SystemErr,
}

impl AcceptStat {
    /// Wire value.
    pub fn code(&self) -> u32 {
        match self {
            AcceptStat::Success => 0,
            AcceptStat::ProgUnavail => 1,
            AcceptStat::ProgMismatch { .. } => 2,
            AcceptStat::ProcUnavail => 3,
            AcceptStat::GarbageArgs => 4,
            AcceptStat::SystemErr => 5,
        }
    }
}

/// `rejected_reply` (RFC 5531 §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectStat {
    /// RPC_MISMATCH (0): the supported RPC versions.
    RpcMismatch {
        /// Lowest supported RPC version.
        low: u32,
        /// Highest supported RPC version.
        high: u32,
    },
    /// AUTH_ERROR (1) with the reason.
    AuthError(AuthStat),
}

/// `reply_body`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyBody<'a> {
    /// MSG_ACCEPTED (0).
    Accepted {
        /// Server verifier.
        verf: OpaqueAuth<'a>,
        /// Status and its arm.
        stat: AcceptStat,
    },
    /// MSG_DENIED (1).
    Denied(RejectStat),
}

/// A reply header: XID and `reply_body`; for SUCCESS the results follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHeader<'a> {
    /// Transaction ID of the call this answers.
    pub xid: u32,
    /// The reply body.
    pub body: ReplyBody<'a>,
}

impl ReplyHeader<'_> {
    /// Encoded size of the reply header.
    pub fn encoded_len(&self) -> usize {
        8 + match &self.body {
            ReplyBody::Accepted { verf, stat } => {
                4 + verf.encoded_len()
                    + 4
                    + if matches!(stat, AcceptStat::ProgMismatch { .. }) {
                        8
                    } else {
                        0
                    }
            }
            ReplyBody::Denied(RejectStat::RpcMismatch { .. }) => 16,
            ReplyBody::Denied(RejectStat::AuthError(_)) => 12,
        }
    }

    /// An accepted reply with an AUTH_NONE verifier.
    pub fn accepted(xid: u32, stat: AcceptStat) -> ReplyHeader<'static> {
        ReplyHeader {
            xid,
            body: ReplyBody::Accepted {
                verf: OpaqueAuth::NONE,
                stat,
            },
        }
    }
}

/// An ONC RPC message header (`rpc_msg` without the procedure-specific part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RpcMessage<'a> {
    /// CALL.
    Call(CallHeader<'a>),
    /// REPLY.
    Reply(ReplyHeader<'a>),
}

impl RpcMessage<'_> {
    /// Transaction ID.
    pub fn xid(&self) -> u32 {
        match self {
            RpcMessage::Call(c) => c.xid,
            RpcMessage::Reply(r) => r.xid,
        }
    }
}

/// XID and `msg_type` of a message without decoding the rest (RFC 8167 §4.1: the
/// receiver tells a Call from a Reply by the word at offset 4).
pub fn peek_xid_and_type(payload: &[u8]) -> Option<(u32, u32)> {
    let mut d = Decoder::new(payload);
    Some((d.get_u32().ok()?, d.get_u32().ok()?))
}

impl XdrEncode for CallHeader<'_> {
    fn encode<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), XdrError> {
        enc.put_u32(self.xid)?;
        enc.put_enum(MSG_CALL)?;
        enc.put_u32(self.rpcvers)?;
        enc.put_u32(self.prog)?;
        enc.put_u32(self.vers)?;
        enc.put_u32(self.proc_)?;
        self.cred.encode(enc)?;
        self.verf.encode(enc)
    }
}

impl XdrEncode for ReplyHeader<'_> {
    fn encode<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), XdrError> {
        enc.put_u32(self.xid)?;
        enc.put_enum(MSG_REPLY)?;
        match &self.body {
            ReplyBody::Accepted { verf, stat } => {
                enc.put_enum(0)?;
                verf.encode(enc)?;
                enc.put_enum(stat.code())?;
                if let AcceptStat::ProgMismatch { low, high } = stat {
                    enc.put_u32(*low)?;
                    enc.put_u32(*high)?;
                }
                Ok(())
            }
            ReplyBody::Denied(RejectStat::RpcMismatch { low, high }) => {
                enc.put_enum(1)?;
                enc.put_enum(0)?;
                enc.put_u32(*low)?;
                enc.put_u32(*high)
            }
            ReplyBody::Denied(RejectStat::AuthError(stat)) => {
                enc.put_enum(1)?;
                enc.put_enum(1)?;
                enc.put_enum(stat.code())
            }
        }
    }
}

impl XdrEncode for RpcMessage<'_> {
    fn encode<S: Sink>(&self, enc: &mut Encoder<S>) -> Result<(), XdrError> {
        match self {
            RpcMessage::Call(c) => c.encode(enc),
            RpcMessage::Reply(r) => r.encode(enc),
        }
    }
}

impl<'a> XdrDecode<'a> for RpcMessage<'a> {
    fn decode(dec: &mut Decoder<'a>) -> Result<Self, XdrError> {
        let xid = dec.get_u32()?;
        match dec.get_enum()? {
            MSG_CALL => Ok(RpcMessage::Call(CallHeader {
                xid,
                rpcvers: dec.get_u32()?,
                prog: dec.get_u32()?,
                vers: dec.get_u32()?,
                proc_: dec.get_u32()?,
                cred: OpaqueAuth::decode(dec)?,
                verf: OpaqueAuth::decode(dec)?,
            })),
            MSG_REPLY => Ok(RpcMessage::Reply(ReplyHeader {
                xid,
                body: decode_reply_body(dec)?,
            })),
            value => Err(XdrError::BadDiscriminant {
                what: "msg_type",
                value,
            }),
        }
    }
}

fn decode_reply_body<'a>(dec: &mut Decoder<'a>) -> Result<ReplyBody<'a>, XdrError> {
    match dec.get_enum()? {
        0 => {
            let verf = OpaqueAuth::decode(dec)?;
            let stat = match dec.get_enum()? {
                0 => AcceptStat::Success,
                1 => AcceptStat::ProgUnavail,
                2 => AcceptStat::ProgMismatch {
                    low: dec.get_u32()?,
                    high: dec.get_u32()?,
                },
                3 => AcceptStat::ProcUnavail,
                4 => AcceptStat::GarbageArgs,
                5 => AcceptStat::SystemErr,
                value => {
                    return Err(XdrError::BadDiscriminant {
                        what: "accept_stat",
                        value,
                    });
                }
            };
            Ok(ReplyBody::Accepted { verf, stat })
        }
        1 => match dec.get_enum()? {
            0 => Ok(ReplyBody::Denied(RejectStat::RpcMismatch {
                low: dec.get_u32()?,
                high: dec.get_u32()?,
            })),
            1 => Ok(ReplyBody::Denied(RejectStat::AuthError(AuthStat::from(
                dec.get_enum()?,
            )))),
            value => Err(XdrError::BadDiscriminant {
                what: "reject_stat",
                value,
            }),
        },
        value => Err(XdrError::BadDiscriminant {
            what: "reply_stat",
            value,
        }),
    }
}

/// Encode a whole reply header into a new buffer (used for transport-generated
/// replies such as GARBAGE_ARGS, RFC 8166 §4.5.2).
pub fn encode_reply_header(h: &ReplyHeader<'_>) -> Result<Vec<u8>, XdrError> {
    let mut e = Encoder::new(Vec::with_capacity(h.encoded_len()));
    h.encode(&mut e)?;
    Ok(e.finish().0)
}

/// The 24-byte GARBAGE_ARGS reply with an AUTH_NONE verifier (RFC 8166 §4.5.2,
/// requirements C.5).
pub fn garbage_args_reply(xid: u32) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[..4].copy_from_slice(&xid.to_be_bytes());
    out[4..8].copy_from_slice(&MSG_REPLY.to_be_bytes());
    out[20..24].copy_from_slice(&4u32.to_be_bytes());
    out
}

#[cfg(test)]
mod tests;
