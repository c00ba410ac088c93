//! AUTH_SYS credentials (RFC 5531 Appendix A) and `auth_stat` (RFC 5531 §9).

use crate::xdr::{Decoder, Encoder, XdrError};

use super::{MAX_AUTH_BYTES, OpaqueAuth, flavor};

/// `string machinename<255>` (RFC 5531 Appendix A).
pub const MAX_MACHINENAME: usize = 255;
/// `unsigned int gids<16>` (RFC 5531 Appendix A).
pub const MAX_GIDS: usize = 16;

/// `authsys_parms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSys<'a> {
    /// Arbitrary ID the caller generates.
    pub stamp: u32,
    /// Caller's machine name (ASCII by convention; kept as bytes).
    pub machinename: &'a [u8],
    /// Effective user ID.
    pub uid: u32,
    /// Effective group ID.
    pub gid: u32,
    /// Supplementary group IDs, at most [`MAX_GIDS`].
    pub gids: Vec<u32>,
}

impl<'a> AuthSys<'a> {
    /// Decode an AUTH_SYS body; the body must hold exactly one `authsys_parms`.
    pub fn decode_body(body: &'a [u8]) -> Result<Self, XdrError> {
        let mut d = Decoder::new(body);
        let a = AuthSys {
            stamp: d.get_u32()?,
            machinename: d.get_string(MAX_MACHINENAME)?,
            uid: d.get_u32()?,
            gid: d.get_u32()?,
            gids: d.get_array(MAX_GIDS, 4, |d| d.get_u32())?,
        };
        d.finish_exact()?;
        Ok(a)
    }

    /// Encode the body (at most 340 bytes, so always within `opaque_auth`'s 400).
    pub fn encode_body(&self) -> Result<Vec<u8>, XdrError> {
        let mut e = Encoder::new(Vec::with_capacity(64));
        e.put_u32(self.stamp)?;
        e.put_string(self.machinename, MAX_MACHINENAME)?;
        e.put_u32(self.uid)?;
        e.put_u32(self.gid)?;
        e.put_array(&self.gids, MAX_GIDS, |e, g| e.put_u32(*g))?;
        let body = e.finish().0;
        debug_assert!(body.len() <= MAX_AUTH_BYTES);
        Ok(body)
    }

    /// Wrap an encoded body as a credential.
    pub fn credential(body: &[u8]) -> OpaqueAuth<'_> {
        OpaqueAuth {
            flavor: flavor::AUTH_SYS,
            body,
        }
    }

    /// The machine name as text, when it is valid UTF-8.
    pub fn machinename_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.machinename).ok()
    }
}

/// `auth_stat` (RFC 5531 §9). Unknown values are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStat {
    /// AUTH_OK (0).
    Ok,
    /// AUTH_BADCRED (1).
    BadCred,
    /// AUTH_REJECTEDCRED (2).
    RejectedCred,
    /// AUTH_BADVERF (3).
    BadVerf,
    /// AUTH_REJECTEDVERF (4).
    RejectedVerf,
    /// AUTH_TOOWEAK (5).
    TooWeak,
    /// AUTH_INVALIDRESP (6).
    InvalidResp,
    /// AUTH_FAILED (7).
    Failed,
    /// AUTH_KERB_GENERIC (8) .. AUTH_NET_ADDR (12), deprecated.
    Kerberos(u32),
    /// RPCSEC_GSS_CREDPROBLEM (13).
    GssCredProblem,
    /// RPCSEC_GSS_CTXPROBLEM (14).
    GssCtxProblem,
    /// Any other value.
    Unknown(u32),
}

impl From<u32> for AuthStat {
    fn from(v: u32) -> Self {
        match v {
            0 => AuthStat::Ok,
            1 => AuthStat::BadCred,
            2 => AuthStat::RejectedCred,
            3 => AuthStat::BadVerf,
            4 => AuthStat::RejectedVerf,
            5 => AuthStat::TooWeak,
            6 => AuthStat::InvalidResp,
            7 => AuthStat::Failed,
            8..=12 => AuthStat::Kerberos(v),
            13 => AuthStat::GssCredProblem,
            14 => AuthStat::GssCtxProblem,
            v => AuthStat::Unknown(v),
        }
    }
}

impl AuthStat {
    /// Wire value.
    pub fn code(&self) -> u32 {
        match *self {
            AuthStat::Ok => 0,
            AuthStat::BadCred => 1,
            AuthStat::RejectedCred => 2,
            AuthStat::BadVerf => 3,
            AuthStat::RejectedVerf => 4,
            AuthStat::TooWeak => 5,
            AuthStat::InvalidResp => 6,
            AuthStat::Failed => 7,
            AuthStat::Kerberos(v) | AuthStat::Unknown(v) => v,
            AuthStat::GssCredProblem => 13,
            AuthStat::GssCtxProblem => 14,
        }
    }
}
