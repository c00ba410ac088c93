//! The link messages that carry no RTokens: CONFIRM LINK (A.3.1), DELETE LINK (A.3.4) and
//! TEST LINK (A.3.8).

use super::error::{LlcEmitError, LlcError, check24};
use super::header::{FLAG_REPLY, Header, LlcVersion, arr, be24, be32, put_be24};

/// CONFIRM LINK flag bits Linux sets to say "no RMBE eyecatchers" (C5, E-6).
pub const CONFIRM_LINK_NO_RMBE_EYECATCHER: u8 = 0x03;

/// DELETE LINK reason codes (A.3.4).
#[allow(missing_docs)]
pub mod delete_reason {
    pub const LOST_PATH: u32 = 0x0001_0000;
    pub const OPERATOR: u32 = 0x0002_0000;
    pub const PROGRAM: u32 = 0x0003_0000;
    pub const PROTOCOL_VIOLATION: u32 = 0x0004_0000;
    pub const ASYMMETRIC_NOT_NEEDED: u32 = 0x0005_0000;
    /// E-10.
    pub const NO_LINK: u32 = 0x0010_0000;
    pub const NO_LINK_GROUP: u32 = 0x0020_0000;
}

/// CONFIRM LINK (A.3.1).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ConfirmLink {
    /// Flags other than R (Linux: `0x03` = no RMBE eyecatchers).
    pub flags: u8,
    /// Sender RoCE MAC.
    pub mac: [u8; 6],
    /// Sender GID.
    pub gid: [u8; 16],
    /// Sender QPN (24 bits).
    pub qpn: u32,
    /// Link number.
    pub link_num: u8,
    /// Sender link user ID.
    pub link_uid: [u8; 4],
    /// Max links (E-15: 0 = not supplied).
    pub max_links: u8,
    /// Max connections (Linux, octet 35; reserved in the RFC).
    pub max_conns: u8,
}

impl ConfirmLink {
    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, LlcError> {
        Ok(Self {
            flags: h.flags & !FLAG_REPLY,
            mac: arr(&b[4..10]),
            gid: arr(&b[10..26]),
            qpn: be24(&b[26..29]),
            link_num: b[29],
            link_uid: arr(&b[30..34]),
            max_links: b[34],
            max_conns: b[35],
        })
    }

    pub(super) fn emit_body(&self, _: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        check24(self.qpn)?;
        b[4..10].copy_from_slice(&self.mac);
        b[10..26].copy_from_slice(&self.gid);
        put_be24(&mut b[26..29], self.qpn);
        b[29] = self.link_num;
        b[30..34].copy_from_slice(&self.link_uid);
        b[34] = self.max_links;
        b[35] = self.max_conns;
        Ok(self.flags & !FLAG_REPLY)
    }
}

/// DELETE LINK (A.3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeleteLink {
    /// A: all links (the whole link group).
    pub all: bool,
    /// O: orderly.
    pub orderly: bool,
    /// Link to delete (0 when `all`).
    pub link_num: u8,
    /// Reason code ([`delete_reason`]).
    pub reason: u32,
}

impl DeleteLink {
    const ALL: u8 = 0x40;
    const ORDERLY: u8 = 0x20;

    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, LlcError> {
        Ok(Self {
            all: h.flags & Self::ALL != 0,
            orderly: h.flags & Self::ORDERLY != 0,
            link_num: b[4],
            reason: be32(&b[5..9]),
        })
    }

    pub(super) fn emit_body(&self, _: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        b[4] = self.link_num;
        b[5..9].copy_from_slice(&self.reason.to_be_bytes());
        let mut flags = 0;
        if self.all {
            flags |= Self::ALL;
        }
        if self.orderly {
            flags |= Self::ORDERLY;
        }
        Ok(flags)
    }
}

/// TEST LINK (A.3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TestLink {
    /// User data (a reply echoes it).
    pub user_data: [u8; 16],
}

impl TestLink {
    pub(super) fn parse_body(_: &Header, b: &[u8]) -> Result<Self, LlcError> {
        Ok(Self {
            user_data: arr(&b[4..20]),
        })
    }

    pub(super) fn emit_body(&self, _: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        b[4..20].copy_from_slice(&self.user_data);
        Ok(0)
    }
}
