//! The Decline message (RFC 7609 A1.7) and its peer diagnosis codes.
//!
//! v1: header, peer ID (8), diagnosis (4), OS type nibble and 3 reserved octets, trailer: 28
//! octets. Linux's v2 form adds four 32-bit diagnosis words (44 octets). Flag `0x08` of the
//! header is S, "link group out of sync" (SMC-CLC-12).

use super::header::{be32, emit_header, out};
use super::{ClcEmitError, ClcError, ClcType, DECLINE_V1_LEN, DECLINE_V2_LEN, Eyecatcher, Header, PeerId};

/// A Decline's peer diagnosis code (A1.6). RFC 7609 defines none; these are Linux's
/// `SMC_CLC_DECL_*` values (net/smc/smc_clc.h), diagnostics only (E-13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Diagnosis(pub u32);

#[allow(missing_docs)]
impl Diagnosis {
    pub const MEM: Self = Self(0x0101_0000);
    pub const TIMEOUT_CONFIRM_LINK: Self = Self(0x0201_0000);
    pub const TIMEOUT_ADD_LINK: Self = Self(0x0202_0000);
    pub const CONFIG_ERROR: Self = Self(0x0300_0000);
    pub const PEER_NO_SMC: Self = Self(0x0301_0000);
    pub const IPSEC: Self = Self(0x0302_0000);
    pub const NO_SMC_DEV: Self = Self(0x0303_0000);
    pub const NO_SMCD_DEV: Self = Self(0x0303_0001);
    pub const NO_SMCR_DEV: Self = Self(0x0303_0002);
    pub const NO_ISM2_SUPP: Self = Self(0x0303_0003);
    pub const NO_V2_EXT: Self = Self(0x0303_0004);
    pub const NO_V2D_EXT: Self = Self(0x0303_0005);
    pub const NO_SEID: Self = Self(0x0303_0006);
    pub const NO_SMCD2_DEV: Self = Self(0x0303_0007);
    pub const NO_UEID: Self = Self(0x0303_0008);
    pub const RELEASE_ERR: Self = Self(0x0303_0009);
    pub const MAX_CONN_ERR: Self = Self(0x0303_000a);
    pub const MAX_LINK_ERR: Self = Self(0x0303_000b);
    pub const MODE_UNSUPP: Self = Self(0x0304_0000);
    pub const RMBE_EYECATCHER: Self = Self(0x0305_0000);
    pub const OPT_UNSUPP: Self = Self(0x0306_0000);
    pub const DIFF_PREFIX: Self = Self(0x0307_0000);
    pub const GET_VLAN_ERR: Self = Self(0x0308_0000);
    pub const ISM_VLAN_ERR: Self = Self(0x0309_0000);
    pub const NO_ACTIVE_LINK: Self = Self(0x030a_0000);
    pub const NO_SERVER_LINK: Self = Self(0x030b_0000);
    pub const VERSION_MISMATCH: Self = Self(0x030c_0000);
    pub const MAX_DMB: Self = Self(0x030d_0000);
    pub const NO_ROUTE: Self = Self(0x030e_0000);
    pub const NO_INDIRECT: Self = Self(0x030f_0000);
    pub const SYNC_ERROR: Self = Self(0x0400_0000);
    pub const PEER_DECLINED: Self = Self(0x0500_0000);
    pub const INTERNAL: Self = Self(0x0999_0000);
    pub const ERR_RTOK: Self = Self(0x0999_0001);
    pub const ERR_READY_LINK: Self = Self(0x0999_0002);
    pub const ERR_REG_BUF: Self = Self(0x0999_0003);

    /// What the code means (Linux's comment for it), or "unknown diagnosis code".
    pub fn describe(self) -> &'static str {
        match self.0 {
            0x0101_0000 => "insufficient memory resources",
            0x0201_0000 => "timeout waiting for CONFIRM LINK",
            0x0202_0000 => "timeout waiting for ADD LINK",
            0x0300_0000 => "configuration error",
            0x0301_0000 => "peer did not indicate SMC",
            0x0302_0000 => "IPsec in use",
            0x0303_0000 => "no SMC device found",
            0x0303_0001 => "no SMC-D device found",
            0x0303_0002 => "no SMC-R device found",
            0x0303_0003 => "hardware has no ISMv2 support",
            0x0303_0004 => "peer sent no CLC v2 extension",
            0x0303_0005 => "peer sent no SMC-Dv2 extension",
            0x0303_0006 => "peer sent no SEID",
            0x0303_0007 => "no SMC-Dv2 device found",
            0x0303_0008 => "peer sent no UEID",
            0x0303_0009 => "release version negotiation failed",
            0x0303_000a => "max connections negotiation failed",
            0x0303_000b => "max links negotiation failed",
            0x0304_0000 => "SMC modes do not match (R or D)",
            0x0305_0000 => "peer uses an RMBE eyecatcher",
            0x0306_0000 => "socket option (fastopen) not supported",
            0x0307_0000 => "IP prefix / subnet mismatch",
            0x0308_0000 => "cannot get VLAN id of IP device",
            0x0309_0000 => "cannot register VLAN id on ISM device",
            0x030a_0000 => "no active SMC-R link in link group",
            0x030b_0000 => "server's SMC-R link not found",
            0x030c_0000 => "SMC version mismatch",
            0x030d_0000 => "SMC-D DMB limit exceeded",
            0x030e_0000 => "SMC-Rv2: no route to peer",
            0x030f_0000 => "SMC-Rv2: indirect link mismatch",
            0x0400_0000 => "synchronization error",
            0x0500_0000 => "peer declined during handshake",
            0x0999_0000 => "internal error",
            0x0999_0001 => "internal error: rtoken handling failed",
            0x0999_0002 => "internal error: ready link failed",
            0x0999_0003 => "internal error: registering RDMA buffers failed",
            _ => "unknown diagnosis code",
        }
    }
}

impl std::fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#010x} ({})", self.0, self.describe())
    }
}

/// SMC Decline (A1.7), v1 (28 octets) or Linux v2 (44 octets).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Decline {
    /// Eyecatcher.
    pub eyecatcher: Eyecatcher,
    /// Version nibble.
    pub version: u8,
    /// S: link group out of sync (SMC-CLC-12).
    pub out_of_sync: bool,
    /// Sender peer ID.
    pub peer_id: PeerId,
    /// Peer diagnosis.
    pub diagnosis: Diagnosis,
    /// OS type (high nibble of octet 20; Linux v2: 2).
    pub os_type: u8,
    /// Linux v2: four more diagnosis words.
    pub diag_v2: Option<[u32; 4]>,
}

impl Decline {
    /// A v1 Decline (28 octets).
    pub fn new(peer_id: PeerId, diagnosis: Diagnosis, out_of_sync: bool) -> Self {
        Self {
            eyecatcher: Eyecatcher::Smcr,
            version: 1,
            out_of_sync,
            peer_id,
            diagnosis,
            os_type: 0,
            diag_v2: None,
        }
    }

    /// Linux's v2 Decline (44 octets, OS type Linux).
    pub fn v2(peer_id: PeerId, diagnosis: Diagnosis, out_of_sync: bool) -> Self {
        Self {
            version: 2,
            os_type: 2,
            diag_v2: Some([0; 4]),
            ..Self::new(peer_id, diagnosis, out_of_sync)
        }
    }

    /// The emitted length.
    pub fn wire_len(&self) -> usize {
        if self.diag_v2.is_some() {
            DECLINE_V2_LEN
        } else {
            DECLINE_V1_LEN
        }
    }

    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, ClcError> {
        let len = b.len();
        if len != DECLINE_V1_LEN && !(h.version >= 2 && len > DECLINE_V1_LEN) {
            return Err(h.bad_length());
        }
        let diag_v2 = if h.version >= 2 && len >= DECLINE_V2_LEN {
            let mut d = [0u32; 4];
            for (i, w) in d.iter_mut().enumerate() {
                *w = be32(&b[24 + 4 * i..28 + 4 * i]);
            }
            Some(d)
        } else {
            None
        };
        Ok(Self {
            eyecatcher: h.eyecatcher,
            version: h.version,
            out_of_sync: h.flags & 0x08 != 0,
            peer_id: PeerId(b[8..16].try_into().unwrap_or_default()),
            diagnosis: Diagnosis(be32(&b[16..20])),
            os_type: b[20] >> 4,
            diag_v2,
        })
    }

    /// Emits the Decline.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, ClcEmitError> {
        if self.diag_v2.is_some() && self.version < 2 || self.os_type > 15 {
            return Err(ClcEmitError::Unrepresentable(
                "v2 diagnosis words need version 2; OS type is 4 bits",
            ));
        }
        let len = self.wire_len();
        let b = out(buf, len)?;
        emit_header(
            b,
            self.eyecatcher,
            ClcType::Decline,
            self.version,
            if self.out_of_sync { 0x08 } else { 0 },
        )?;
        b[8..16].copy_from_slice(&self.peer_id.0);
        b[16..20].copy_from_slice(&self.diagnosis.0.to_be_bytes());
        b[20..24].copy_from_slice(&[self.os_type << 4, 0, 0, 0]);
        if let Some(d) = self.diag_v2 {
            for (i, w) in d.iter().enumerate() {
                b[24 + 4 * i..28 + 4 * i].copy_from_slice(&w.to_be_bytes());
            }
        }
        b[len - 4..].copy_from_slice(&self.eyecatcher.bytes());
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::super::ClcMessage;
    use super::*;
    use proptest::prelude::*;

    /// SMC-CLC-1: a Decline is 28 octets unless its version is 2 or more.
    #[test]
    fn lengths_per_version_smc_clc_1() {
        let mut w = ClcMessage::Decline(Decline::new(PeerId::default(), Diagnosis::MEM, false))
            .to_vec()
            .unwrap();
        w.splice(24..24, [0u8; 16]);
        w[6] = 44;
        assert!(matches!(ClcMessage::parse(&w), Err(ClcError::BadLength { .. })));
        w[7] = 0x20;
        let ClcMessage::Decline(d) = ClcMessage::parse(&w).unwrap() else {
            panic!()
        };
        assert_eq!(d.diag_v2, Some([0; 4]));
        let v2 = Decline::v2(PeerId::default(), Diagnosis::NO_UEID, true);
        let w = ClcMessage::Decline(v2.clone()).to_vec().unwrap();
        assert_eq!((w.len(), w[7], w[20]), (44, 0x28, 0x20));
        assert_eq!(ClcMessage::parse(&w).unwrap(), ClcMessage::Decline(v2));
    }

    /// SMC-CLC-2: the reserved octets after the OS type are not validated on receipt.
    #[test]
    fn reserved_fields_are_ignored_smc_clc_2() {
        let w = ClcMessage::Decline(Decline::new(PeerId::default(), Diagnosis::MEM, false))
            .to_vec()
            .unwrap();
        let mut b = w.clone();
        b[21..24].fill(0x55);
        assert_eq!(ClcMessage::parse(&b).unwrap(), ClcMessage::parse(&w).unwrap());
    }

    proptest! {
        /// Emit → parse is the identity for every Decline.
        #[test]
        fn decline_round_trip_smc_clc_1(v2 in any::<bool>(), s in any::<bool>(), code in any::<u32>(), pid in any::<[u8; 8]>()) {
            let d = if v2 { Decline::v2(PeerId(pid), Diagnosis(code), s) } else { Decline::new(PeerId(pid), Diagnosis(code), s) };
            let m = ClcMessage::Decline(d);
            prop_assert_eq!(ClcMessage::parse(&m.to_vec().unwrap()).unwrap(), m);
        }
    }
}
