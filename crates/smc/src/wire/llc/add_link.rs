//! Adding a link: ADD LINK (A.3.2 in Linux's layout, E-1) with Linux's v2 extension, ADD
//! LINK CONTINUATION (A.3.3) and Linux's v2 REQUEST ADD LINK; the [`RtokenPair`] that ADD
//! LINK CONTINUATION and the v2 extension carry (E-21).

use super::error::{LlcEmitError, LlcError, check24};
use super::header::{Header, LLC_LEN, LlcVersion, arr, be24, be32, be64, put_be24};

/// ADD LINK reject reasons (v1, octet 2 low nibble).
#[allow(missing_docs)]
pub mod add_link_reject {
    pub const NO_ALTERNATE_PATH: u8 = 1;
    pub const INVALID_MTU: u8 = 2;
}

/// ADD LINK (A.3.2, Linux layout, E-1).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AddLink {
    /// Z: rejection (reply only).
    pub reject: bool,
    /// v1 reject reason (octet 2 low nibble; no room in v2).
    pub reject_reason: u8,
    /// Sender RoCE MAC.
    pub mac: [u8; 6],
    /// Sender GID.
    pub gid: [u8; 16],
    /// QPN of the new link's QP.
    pub qpn: u32,
    /// Link number of the new link.
    pub link_num: u8,
    /// QP MTU enum (low nibble), raw.
    pub qp_mtu: u8,
    /// Initial PSN (24 bits).
    pub psn: u32,
    /// Linux: initial receive credits (octet 36).
    pub init_credits: u8,
    /// Linux v2 extension (only in a v2 message longer than 44).
    pub v2_ext: Option<AddLinkV2Ext>,
}

/// Linux's v2 ADD LINK extension.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AddLinkV2Ext {
    /// v2-direct link.
    pub v2_direct: bool,
    /// The client's target GID.
    pub client_target_gid: [u8; 16],
    /// RToken pairs (reference RKey, new RKey, new VA) of every RMB.
    pub rtokens: Vec<RtokenPair>,
}

/// Fixed part of the v2 extension: flags, a reserved octet, the target GID, 8 reserved
/// octets, the RToken count (host-order `u16`).
const V2_EXT_FIXED_LEN: usize = 28;
/// One RToken pair on the wire.
const RTOKEN_PAIR_LEN: usize = 16;

impl AddLink {
    const REJECT: u8 = 0x40;

    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, LlcError> {
        let v2_ext = if h.version == LlcVersion::V2 && h.len > LLC_LEN {
            Some(AddLinkV2Ext::parse(&b[LLC_LEN..], h.len)?)
        } else {
            None
        };
        Ok(Self {
            reject: h.flags & Self::REJECT != 0,
            reject_reason: if h.version == LlcVersion::V1 { b[2] & 0x0F } else { 0 },
            mac: arr(&b[4..10]),
            gid: arr(&b[12..28]),
            qpn: be24(&b[28..31]),
            link_num: b[31],
            qp_mtu: b[32] & 0x0F,
            psn: be24(&b[33..36]),
            init_credits: b[36],
            v2_ext,
        })
    }

    /// Octets past 44 that are the v2 extension.
    pub(super) fn ext_len(&self) -> usize {
        self.v2_ext
            .as_ref()
            .map_or(0, |x| V2_EXT_FIXED_LEN + RTOKEN_PAIR_LEN * x.rtokens.len())
    }

    pub(super) fn emit_body(&self, version: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        let v2 = version == LlcVersion::V2;
        check24(self.qpn)?;
        check24(self.psn)?;
        if self.qp_mtu > 15 || self.reject_reason > 15 || (v2 && self.reject_reason != 0) {
            return Err(LlcEmitError::Unrepresentable(
                "ADD LINK nibble (v2 has no reject reason)",
            ));
        }
        if self.v2_ext.is_some() && !v2 {
            return Err(LlcEmitError::Unrepresentable("ADD LINK v2 extension in v1"));
        }
        if !v2 {
            b[2] = self.reject_reason;
        }
        b[4..10].copy_from_slice(&self.mac);
        b[12..28].copy_from_slice(&self.gid);
        put_be24(&mut b[28..31], self.qpn);
        b[31] = self.link_num;
        b[32] = self.qp_mtu;
        put_be24(&mut b[33..36], self.psn);
        b[36] = self.init_credits;
        if let Some(x) = &self.v2_ext {
            x.emit(&mut b[LLC_LEN..])?;
        }
        Ok(if self.reject { Self::REJECT } else { 0 })
    }
}

impl AddLinkV2Ext {
    /// `e`: the message's octets past 44 (`len` in all).
    fn parse(e: &[u8], len: usize) -> Result<Self, LlcError> {
        if e.len() < V2_EXT_FIXED_LEN {
            return Err(LlcError::Truncated {
                need: LLC_LEN + V2_EXT_FIXED_LEN,
                have: len,
            });
        }
        let n = usize::from(u16::from_le_bytes([e[26], e[27]]));
        let need = V2_EXT_FIXED_LEN + RTOKEN_PAIR_LEN * n;
        if e.len() < need {
            return Err(LlcError::BadCount {
                what: "ADD LINK v2 RToken",
                count: n,
            });
        }
        Ok(Self {
            v2_direct: e[0] & 0x80 != 0,
            client_target_gid: arr(&e[2..18]),
            rtokens: e[V2_EXT_FIXED_LEN..need]
                .chunks_exact(RTOKEN_PAIR_LEN)
                .map(RtokenPair::parse)
                .collect(),
        })
    }

    fn emit(&self, e: &mut [u8]) -> Result<(), LlcEmitError> {
        let n = u16::try_from(self.rtokens.len()).map_err(|_| LlcEmitError::Unrepresentable("RTokens"))?;
        e[0] = if self.v2_direct { 0x80 } else { 0 };
        e[2..18].copy_from_slice(&self.client_target_gid);
        e[26..28].copy_from_slice(&n.to_le_bytes());
        let pairs = &mut e[V2_EXT_FIXED_LEN..V2_EXT_FIXED_LEN + RTOKEN_PAIR_LEN * self.rtokens.len()];
        for (c, r) in pairs.chunks_exact_mut(RTOKEN_PAIR_LEN).zip(&self.rtokens) {
            r.emit(c);
        }
        Ok(())
    }
}

/// An RToken pair of ADD LINK CONTINUATION (A.3.3) and the v2 ADD LINK extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtokenPair {
    /// The RMB's RKey on the link carrying the message.
    pub ref_rkey: u32,
    /// Its RKey on the new link.
    pub new_rkey: u32,
    /// Its virtual address on the new link.
    pub new_vaddr: u64,
}

impl RtokenPair {
    fn parse(c: &[u8]) -> Self {
        Self {
            ref_rkey: be32(&c[0..4]),
            new_rkey: be32(&c[4..8]),
            new_vaddr: be64(&c[8..16]),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.ref_rkey.to_be_bytes());
        b[4..8].copy_from_slice(&self.new_rkey.to_be_bytes());
        b[8..16].copy_from_slice(&self.new_vaddr.to_be_bytes());
    }
}

/// ADD LINK CONTINUATION (A.3.3).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AddLinkCont {
    /// Link number of the new link.
    pub link_num: u8,
    /// RTokens still to send including this message.
    pub num_rtokens: u8,
    /// The pairs in this message: min(num_rtokens, 2).
    pub pairs: Vec<RtokenPair>,
}

impl AddLinkCont {
    pub(super) fn parse_body(_: &Header, b: &[u8]) -> Result<Self, LlcError> {
        let n = b[5];
        let k = usize::from(n.min(2));
        Ok(Self {
            link_num: b[4],
            num_rtokens: n,
            pairs: b[8..8 + RTOKEN_PAIR_LEN * k]
                .chunks_exact(RTOKEN_PAIR_LEN)
                .map(RtokenPair::parse)
                .collect(),
        })
    }

    pub(super) fn emit_body(&self, _: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        if self.pairs.len() != usize::from(self.num_rtokens.min(2)) {
            return Err(LlcEmitError::Unrepresentable(
                "ADD LINK CONT carries min(NumRTokens, 2) pairs",
            ));
        }
        b[4] = self.link_num;
        b[5] = self.num_rtokens;
        for (c, r) in b[8..].chunks_exact_mut(RTOKEN_PAIR_LEN).zip(&self.pairs) {
            r.emit(c);
        }
        Ok(0)
    }
}

/// REQUEST ADD LINK (Linux SMC-Rv2 only, type 0x25: 20 reserved octets, GID count, 3
/// reserved, the client's GIDs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RequestAddLink {
    /// The requester's RoCEv2 GIDs.
    pub gids: Vec<[u8; 16]>,
}

impl RequestAddLink {
    /// Where the GIDs start.
    const GIDS_AT: usize = 28;

    /// The end of the GID list (at least 44: the rest of a 44-octet message is reserved).
    pub(super) fn known_len(&self) -> usize {
        (Self::GIDS_AT + 16 * self.gids.len()).max(LLC_LEN)
    }

    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, LlcError> {
        let n = usize::from(b[24]);
        let gend = Self::GIDS_AT + 16 * n;
        if gend > h.len {
            return Err(LlcError::BadCount {
                what: "REQUEST ADD LINK GID",
                count: n,
            });
        }
        Ok(Self {
            gids: b[Self::GIDS_AT..gend].chunks_exact(16).map(arr).collect(),
        })
    }

    pub(super) fn emit_body(&self, version: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        if version != LlcVersion::V2 || self.gids.len() > 255 {
            return Err(LlcEmitError::Unrepresentable(
                "REQUEST ADD LINK is v2 only, at most 255 GIDs",
            ));
        }
        b[24] = self.gids.len() as u8;
        for (c, g) in b[Self::GIDS_AT..].chunks_exact_mut(16).zip(&self.gids) {
            c.copy_from_slice(g);
        }
        Ok(0)
    }
}
