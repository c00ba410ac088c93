//! The RKey messages: CONFIRM RKEY (A.3.5, E-3), CONFIRM RKEY CONTINUATION (A.3.6, E-2)
//! and DELETE RKEY (A.3.7), and the 13-octet [`LinkRtoken`] the first two carry.

use super::error::{LlcEmitError, LlcError};
use super::header::{Header, LLC_LEN, LlcVersion, be32, be64};

/// Z: negative reply, in all three RKey messages.
const NEGATIVE: u8 = 0x20;
/// One link's RToken on the wire.
const LINK_RTOKEN_LEN: usize = 13;

/// A link's RToken in CONFIRM RKEY (A.3.5): link number, RKey, VA (13 octets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LinkRtoken {
    /// Link number.
    pub link_num: u8,
    /// RKey on that link.
    pub rkey: u32,
    /// Virtual address on that link.
    pub vaddr: u64,
}

impl LinkRtoken {
    fn parse(c: &[u8]) -> Self {
        Self {
            link_num: c[0],
            rkey: be32(&c[1..5]),
            vaddr: be64(&c[5..13]),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[0] = self.link_num;
        b[1..5].copy_from_slice(&self.rkey.to_be_bytes());
        b[5..13].copy_from_slice(&self.vaddr.to_be_bytes());
    }

    /// `k` tokens from `b`.
    fn parse_list(b: &[u8], k: u8) -> Vec<Self> {
        b[..LINK_RTOKEN_LEN * usize::from(k)]
            .chunks_exact(LINK_RTOKEN_LEN)
            .map(Self::parse)
            .collect()
    }

    fn emit_list(b: &mut [u8], tokens: &[Self]) {
        for (c, t) in b.chunks_exact_mut(LINK_RTOKEN_LEN).zip(tokens) {
            t.emit(c);
        }
    }
}

/// CONFIRM RKEY (A.3.5, E-3).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ConfirmRkey {
    /// Z: negative reply.
    pub negative: bool,
    /// C: configuration retry.
    pub retry: bool,
    /// NumTkns: other links' tokens in total (E-3).
    pub num_tkns: u8,
    /// The RMB's RKey on this link.
    pub rkey: u32,
    /// Its VA on this link.
    pub vaddr: u64,
    /// Other links' tokens in this message: min(num_tkns, 2).
    pub others: Vec<LinkRtoken>,
}

impl ConfirmRkey {
    const RETRY: u8 = 0x10;

    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, LlcError> {
        let n = b[4];
        Ok(Self {
            negative: h.flags & NEGATIVE != 0,
            retry: h.flags & Self::RETRY != 0,
            num_tkns: n,
            rkey: be32(&b[5..9]),
            vaddr: be64(&b[9..17]),
            others: LinkRtoken::parse_list(&b[17..], n.min(2)),
        })
    }

    pub(super) fn emit_body(&self, _: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        if self.others.len() != usize::from(self.num_tkns.min(2)) {
            return Err(LlcEmitError::Unrepresentable(
                "CONFIRM RKEY carries min(NumTkns, 2) tokens (E-3)",
            ));
        }
        b[4] = self.num_tkns;
        b[5..9].copy_from_slice(&self.rkey.to_be_bytes());
        b[9..17].copy_from_slice(&self.vaddr.to_be_bytes());
        LinkRtoken::emit_list(&mut b[17..], &self.others);
        let mut flags = 0;
        if self.negative {
            flags |= NEGATIVE;
        }
        if self.retry {
            flags |= Self::RETRY;
        }
        Ok(flags)
    }
}

/// CONFIRM RKEY CONTINUATION (A.3.6, E-2).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ConfirmRkeyCont {
    /// Z: negative reply.
    pub negative: bool,
    /// Tokens left including this message.
    pub num_tkns_left: u8,
    /// Tokens in this message: min(num_tkns_left, 3).
    pub tokens: Vec<LinkRtoken>,
}

impl ConfirmRkeyCont {
    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, LlcError> {
        let n = b[4];
        Ok(Self {
            negative: h.flags & NEGATIVE != 0,
            num_tkns_left: n,
            tokens: LinkRtoken::parse_list(&b[5..], n.min(3)),
        })
    }

    pub(super) fn emit_body(&self, _: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        if self.tokens.len() != usize::from(self.num_tkns_left.min(3)) {
            return Err(LlcEmitError::Unrepresentable(
                "CONFIRM RKEY CONT carries min(left, 3) tokens (E-2)",
            ));
        }
        b[4] = self.num_tkns_left;
        LinkRtoken::emit_list(&mut b[5..], &self.tokens);
        Ok(if self.negative { NEGATIVE } else { 0 })
    }
}

/// DELETE RKEY (A.3.7).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeleteRkey {
    /// Z: negative reply.
    pub negative: bool,
    /// Error mask (v1; Linux v2: number of invalid RKeys).
    pub err_mask: u8,
    /// RKeys (on the carrying link), 1..=8 in v1.
    pub rkeys: Vec<u32>,
}

impl DeleteRkey {
    /// Where the RKeys start.
    const RKEYS_AT: usize = 8;

    /// The end of the RKey list in v2 (at least 44); v1 messages are 44 octets.
    pub(super) fn known_len(&self, version: LlcVersion) -> usize {
        match version {
            LlcVersion::V1 => LLC_LEN,
            LlcVersion::V2 => (Self::RKEYS_AT + 4 * self.rkeys.len()).max(LLC_LEN),
        }
    }

    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, LlcError> {
        let n = usize::from(b[4]);
        let max = match h.version {
            LlcVersion::V1 => 8,
            LlcVersion::V2 => (h.len - Self::RKEYS_AT) / 4,
        };
        if n == 0 || n > max {
            return Err(LlcError::BadCount {
                what: "DELETE RKEY",
                count: n,
            });
        }
        Ok(Self {
            negative: h.flags & NEGATIVE != 0,
            err_mask: b[5],
            rkeys: b[Self::RKEYS_AT..Self::RKEYS_AT + 4 * n]
                .chunks_exact(4)
                .map(be32)
                .collect(),
        })
    }

    pub(super) fn emit_body(&self, version: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        let max = if version == LlcVersion::V2 { 255 } else { 8 };
        if self.rkeys.is_empty() || self.rkeys.len() > max {
            return Err(LlcEmitError::Unrepresentable(
                "DELETE RKEY lists 1..=8 RKeys (v2: 1..=255)",
            ));
        }
        b[4] = self.rkeys.len() as u8;
        b[5] = self.err_mask;
        for (c, k) in b[Self::RKEYS_AT..].chunks_exact_mut(4).zip(&self.rkeys) {
            c.copy_from_slice(&k.to_be_bytes());
        }
        Ok(if self.negative { NEGATIVE } else { 0 })
    }
}
