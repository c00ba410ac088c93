//! Linux's CLC v2 extensions (SMC-Rv2; Linux net/smc/smc_clc.h, lab capture frames 6, 8, 10).
//!
//! - [`V2Extension`] (`smc_clc_v2_extension`), in a v2 Proposal at the offset the SMC-D
//!   area names: EID count, ISM GID count, release/SEID flags, offset of the SMC-Dv2
//!   extension, the RoCEv2 GID, max connections, max links, feature mask, 12 reserved (40
//!   octets), then 32-octet EIDs (the first one is the UEID), then the SMC-Dv2 extension.
//! - [`AcceptConfirmV2`], after a v2 Accept/Confirm's 64 v1 octets: the negotiated EID (32)
//!   and 8 reserved octets; with first contact the [`FirstContactExt`] (v2-direct flag, OS
//!   type, release, 2 reserved, 32-octet host name) and, from release 1, [`FceV2x`] (16
//!   octets); a first-contact Confirm adds the GID list (count, 3 reserved, 16-octet GIDs).

use super::header::{be16, be32};
use super::{
    ACCEPT_V2_BASE_LEN, ClcEmitError, ClcError, ClcType, EID_LEN, FCE_LEN, FCE_V2X_LEN, HOSTNAME_LEN, Header, MAX_EIDS,
    V2_EXT_FIXED_LEN,
};

/// Linux's CLC v2 extension of a Proposal (`smc_clc_v2_extension`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct V2Extension {
    /// User EIDs (the first is the UEID), 32 octets each, blank padded.
    pub eids: Vec<[u8; EID_LEN]>,
    /// Number of ISMv2 GIDs (SMC-D).
    pub ism_gid_cnt: u8,
    /// SMC version release number (high nibble of the flag octet).
    pub release: u8,
    /// SEID indicator (low bit of the flag octet).
    pub seid: bool,
    /// RoCEv2 GID of the client.
    pub roce_gid: [u8; 16],
    /// Max connections per link group the client supports.
    pub max_conns: u8,
    /// Max links per link group the client supports.
    pub max_links: u8,
    /// Feature mask.
    pub feature_mask: u16,
    /// The SMC-Dv2 extension, raw (empty when absent).
    pub smcd_v2_ext: Vec<u8>,
}

impl V2Extension {
    pub(super) fn wire_len(&self) -> usize {
        V2_EXT_FIXED_LEN + EID_LEN * self.eids.len() + self.smcd_v2_ext.len()
    }

    /// Parses the extension that starts at `b[at]`; `end` is where the trailer starts. The
    /// EID count is bounded and every offset checked against `end`.
    pub(super) fn parse(b: &[u8], at: usize, end: usize) -> Result<Self, ClcError> {
        let e = b
            .get(at..at + V2_EXT_FIXED_LEN)
            .filter(|_| at + V2_EXT_FIXED_LEN <= end)
            .ok_or(ClcError::BadOffset { what: "v2 extension" })?;
        let eid_cnt = e[0];
        if usize::from(eid_cnt) > MAX_EIDS {
            return Err(ClcError::TooManyEids(eid_cnt));
        }
        let eids_end = at + V2_EXT_FIXED_LEN + EID_LEN * usize::from(eid_cnt);
        if eids_end > end {
            return Err(ClcError::BadOffset { what: "EID list" });
        }
        let eids = b[at + V2_EXT_FIXED_LEN..eids_end]
            .chunks_exact(EID_LEN)
            .map(|c| c.try_into().unwrap_or([0; EID_LEN]))
            .collect();
        let dext_off = usize::from(be16(&e[6..8]));
        let smcd_v2_ext = if dext_off != 0 {
            let d = at + 8 + dext_off;
            if d > end || d < eids_end {
                return Err(ClcError::BadOffset {
                    what: "SMC-Dv2 extension",
                });
            }
            b[d..end].to_vec()
        } else {
            Vec::new()
        };
        Ok(Self {
            eids,
            ism_gid_cnt: e[1],
            release: e[3] >> 4,
            seid: e[3] & 1 != 0,
            roce_gid: e[8..24].try_into().unwrap_or_default(),
            max_conns: e[24],
            max_links: e[25],
            feature_mask: be16(&e[26..28]),
            smcd_v2_ext,
        })
    }

    /// Emits the extension at `b[at..]` (the caller sized `b` by [`Self::wire_len`] and
    /// checked the EID count).
    pub(super) fn emit(&self, b: &mut [u8], mut at: usize) {
        let s = &mut b[at..at + V2_EXT_FIXED_LEN];
        s.fill(0);
        s[0] = self.eids.len() as u8;
        s[1] = self.ism_gid_cnt;
        s[3] = (self.release << 4) | u8::from(self.seid);
        if !self.smcd_v2_ext.is_empty() {
            let off = V2_EXT_FIXED_LEN - 8 + EID_LEN * self.eids.len();
            s[6..8].copy_from_slice(&(off as u16).to_be_bytes());
        }
        s[8..24].copy_from_slice(&self.roce_gid);
        s[24] = self.max_conns;
        s[25] = self.max_links;
        s[26..28].copy_from_slice(&self.feature_mask.to_be_bytes());
        at += V2_EXT_FIXED_LEN;
        for eid in &self.eids {
            b[at..at + EID_LEN].copy_from_slice(eid);
            at += EID_LEN;
        }
        b[at..at + self.smcd_v2_ext.len()].copy_from_slice(&self.smcd_v2_ext);
    }
}

/// Linux's first-contact extension of a v2 Accept/Confirm (`smc_clc_first_contact_ext`,
/// plus the release-1 `_v2x` part).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FirstContactExt {
    /// v2-direct link group (the peers are on the same subnet).
    pub v2_direct: bool,
    /// OS type (1 z/OS, 2 Linux, 3 AIX).
    pub os_type: u8,
    /// SMC version release number.
    pub release: u8,
    /// Host name, blank padded.
    pub hostname: [u8; HOSTNAME_LEN],
    /// Release ≥ 1 fields.
    pub v2x: Option<FceV2x>,
}

/// The release-1 part of the first-contact extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FceV2x {
    /// Negotiated max connections per link group.
    pub max_conns: u8,
    /// Negotiated max links per link group.
    pub max_links: u8,
    /// Feature mask.
    pub feature_mask: u16,
    /// Vendor experimental options.
    pub vendor_exp_options: u32,
}

/// The SMC-Rv2 part of an Accept/Confirm.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcceptConfirmV2 {
    /// Negotiated EID, blank padded.
    pub eid: [u8; EID_LEN],
    /// First-contact extension (present iff first contact).
    pub fce: Option<FirstContactExt>,
    /// GID list (a v2 Confirm with first contact): the client's RoCEv2 GIDs.
    pub gid_list: Option<Vec<[u8; 16]>>,
}

impl AcceptConfirmV2 {
    /// The emitted length, trailer excluded.
    pub(super) fn wire_len(&self) -> usize {
        ACCEPT_V2_BASE_LEN
            + self
                .fce
                .as_ref()
                .map_or(0, |f| FCE_LEN + f.v2x.map_or(0, |_| FCE_V2X_LEN))
            + self.gid_list.as_ref().map_or(0, |g| 4 + 16 * g.len())
    }

    /// Parses the v2 part of an Accept/Confirm whose header is `h`; `end` is where the
    /// trailer starts (the caller checked `end >= ACCEPT_V2_BASE_LEN`).
    pub(super) fn parse(h: &Header, b: &[u8], end: usize) -> Result<Self, ClcError> {
        let mut at = 64 + EID_LEN + 8;
        let first_contact = h.flags & 0x08 != 0;
        if first_contact && at + FCE_LEN > end {
            return Err(h.bad_length());
        }
        let fce = if first_contact {
            let f = &b[at..at + FCE_LEN];
            let release = f[1] & 0x0f;
            at += FCE_LEN;
            if release >= 1 && at + FCE_V2X_LEN > end {
                return Err(h.bad_length());
            }
            let v2x = if release >= 1 {
                let x = &b[at..at + FCE_V2X_LEN];
                at += FCE_V2X_LEN;
                Some(FceV2x {
                    max_conns: x[0],
                    max_links: x[1],
                    feature_mask: be16(&x[2..4]),
                    vendor_exp_options: be32(&x[4..8]),
                })
            } else {
                None
            };
            Some(FirstContactExt {
                v2_direct: f[0] & 0x80 != 0,
                os_type: f[1] >> 4,
                release,
                hostname: f[4..4 + HOSTNAME_LEN].try_into().unwrap_or([0; HOSTNAME_LEN]),
                v2x,
            })
        } else {
            None
        };
        let gid_list = if h.ty == ClcType::Confirm && fce.is_some() && at + 4 <= end {
            let cnt = usize::from(b[at]);
            let gend = at + 4 + 16 * cnt;
            if gend > end {
                return Err(ClcError::BadOffset { what: "GID list" });
            }
            Some(
                b[at + 4..gend]
                    .chunks_exact(16)
                    .map(|c| c.try_into().unwrap_or([0; 16]))
                    .collect(),
            )
        } else {
            None
        };
        Ok(Self {
            eid: b[64..64 + EID_LEN].try_into().unwrap_or([0; EID_LEN]),
            fce,
            gid_list,
        })
    }

    /// Whether this v2 part can be emitted in a message of type `ty` whose first-contact
    /// flag is `first_contact`.
    pub(super) fn check(&self, ty: ClcType, first_contact: bool) -> Result<(), ClcEmitError> {
        if self.gid_list.as_ref().is_some_and(|g| g.len() > 255) {
            return Err(ClcEmitError::Unrepresentable("more than 255 GIDs"));
        }
        if (self.fce.is_none() || ty == ClcType::Accept) && self.gid_list.is_some() {
            return Err(ClcEmitError::Unrepresentable(
                "GID list only in a first-contact Confirm",
            ));
        }
        if self
            .fce
            .as_ref()
            .is_some_and(|f| f.os_type > 15 || f.release > 15 || (f.release >= 1) != f.v2x.is_some())
        {
            return Err(ClcEmitError::Unrepresentable(
                "first-contact extension: v2x iff release >= 1",
            ));
        }
        if self.fce.is_some() != first_contact {
            return Err(ClcEmitError::Unrepresentable(
                "v2 first-contact extension iff first contact",
            ));
        }
        Ok(())
    }

    /// Emits the v2 part at `b[64..]` (the caller sized `b` and ran [`Self::check`]).
    pub(super) fn emit(&self, b: &mut [u8]) {
        b[64..64 + EID_LEN].copy_from_slice(&self.eid);
        let mut at = 64 + EID_LEN;
        b[at..at + 8].fill(0);
        at += 8;
        if let Some(f) = &self.fce {
            b[at] = if f.v2_direct { 0x80 } else { 0 };
            b[at + 1] = (f.os_type << 4) | f.release;
            b[at + 2..at + 4].fill(0);
            b[at + 4..at + FCE_LEN].copy_from_slice(&f.hostname);
            at += FCE_LEN;
            if let Some(x) = f.v2x {
                let s = &mut b[at..at + FCE_V2X_LEN];
                s.fill(0);
                s[0] = x.max_conns;
                s[1] = x.max_links;
                s[2..4].copy_from_slice(&x.feature_mask.to_be_bytes());
                s[4..8].copy_from_slice(&x.vendor_exp_options.to_be_bytes());
                at += FCE_V2X_LEN;
            }
        }
        if let Some(g) = &self.gid_list {
            b[at..at + 4].copy_from_slice(&[g.len() as u8, 0, 0, 0]);
            at += 4;
            for gid in g {
                b[at..at + 16].copy_from_slice(gid);
                at += 16;
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(in crate::wire::clc) fn arb_v2ext() -> impl Strategy<Value = V2Extension> {
        (
            proptest::collection::vec(any::<[u8; 32]>(), 0..=8),
            any::<u8>(),
            0u8..16,
            any::<bool>(),
            any::<[u8; 16]>(),
            any::<(u8, u8, u16)>(),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(
                |(eids, ism, release, seid, roce_gid, (max_conns, max_links, feature_mask), smcd_v2_ext)| V2Extension {
                    eids,
                    ism_gid_cnt: ism,
                    release,
                    seid,
                    roce_gid,
                    max_conns,
                    max_links,
                    feature_mask,
                    smcd_v2_ext,
                },
            )
    }

    /// SMC-CLC-1: more than 8 EIDs, an EID list past the trailer or an SMC-Dv2 offset into
    /// the EIDs are typed errors.
    #[test]
    fn bounds_are_checked_smc_clc_1() {
        let e = V2Extension {
            eids: vec![[0x40; EID_LEN]; 2],
            smcd_v2_ext: vec![7; 4],
            ..V2Extension::default()
        };
        let mut b = vec![0u8; e.wire_len()];
        e.emit(&mut b, 0);
        assert_eq!(V2Extension::parse(&b, 0, b.len()), Ok(e.clone()));
        let mut bad = b.clone();
        bad[0] = 9;
        assert_eq!(V2Extension::parse(&bad, 0, bad.len()), Err(ClcError::TooManyEids(9)));
        bad[0] = 3;
        assert_eq!(
            V2Extension::parse(&bad, 0, bad.len()),
            Err(ClcError::BadOffset { what: "EID list" })
        );
        let mut bad = b.clone();
        bad[6..8].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(
            V2Extension::parse(&bad, 0, bad.len()),
            Err(ClcError::BadOffset {
                what: "SMC-Dv2 extension"
            })
        );
        assert_eq!(
            V2Extension::parse(&b, 0, V2_EXT_FIXED_LEN - 1),
            Err(ClcError::BadOffset { what: "v2 extension" })
        );
    }

    proptest! {
        /// Emit → parse of the extension alone is the identity.
        #[test]
        fn v2_extension_round_trip_smc_clc_1(e in arb_v2ext()) {
            let mut b = vec![0u8; e.wire_len()];
            e.emit(&mut b, 0);
            prop_assert_eq!(V2Extension::parse(&b, 0, b.len()).unwrap(), e);
        }
    }
}
