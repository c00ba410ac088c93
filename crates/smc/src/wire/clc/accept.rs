//! The Accept and Confirm messages for SMC-R (RFC 7609 A1.5), v1 and Linux's SMC-Rv2 form.
//!
//! v1 (68 octets): header, peer ID (8), GID (16), MAC (6), QPN (3), RMB rkey (4), RMBE
//! index (1), RMBE alert token (4), RMBE size and QP MTU nibbles (1), reserved (1), RMB
//! virtual address (8), reserved (1), initial PSN (3), trailer. Flag `0x08` is F, first
//! contact. The v2 tail is [`AcceptConfirmV2`] (in `v2ext`).

use super::header::{be24, be32, be64, emit_header, out};
use super::{
    ACCEPT_CONFIRM_V1_LEN, ACCEPT_V2_BASE_LEN, AcceptConfirmV2, ClcEmitError, ClcError, ClcType, Eyecatcher, Header,
    PeerId, SmcType, TRAILER_LEN,
};

/// SMC Accept or Confirm for SMC-R (A1.5), v1 (68 octets) or Linux's v2 form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcceptConfirm {
    /// Eyecatcher.
    pub eyecatcher: Eyecatcher,
    /// Version nibble (1 or 2).
    pub version: u8,
    /// Accept: F, first contact. Linux sets it in its Confirm too.
    pub first_contact: bool,
    /// Sender peer ID.
    pub peer_id: PeerId,
    /// GID of the sender's RNIC for this link.
    pub gid: [u8; 16],
    /// MAC of that RNIC.
    pub mac: [u8; 6],
    /// 24-bit QP number.
    pub qpn: u32,
    /// RKey of the RMB.
    pub rmb_rkey: u32,
    /// RMB element index (1..255).
    pub rmbe_idx: u8,
    /// RMB element alert token.
    pub rmbe_alert_token: u32,
    /// Compressed RMBE size (4 bits, A1.6), raw.
    pub rmbe_size: u8,
    /// QP MTU enum (4 bits, A1.6), raw.
    pub qp_mtu: u8,
    /// RMB virtual address (as registered on the sender's RNIC; E-8).
    pub rmb_vaddr: u64,
    /// 24-bit initial PSN.
    pub psn: u32,
    /// The SMC-Rv2 part (version 2).
    pub v2: Option<AcceptConfirmV2>,
}

/// A bad enumerated value in an Accept or Confirm (SMC-CLC-6: answered by Decline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnumError {
    /// QP MTU enum 0 or 6..15.
    #[error("reserved QP MTU value {0}")]
    QpMtu(u8),
    /// RMBE size above 5 (512 KiB).
    #[error("RMBE size value {0} beyond 512 KiB")]
    RmbeSize(u8),
}

impl AcceptConfirm {
    /// A v1 Accept/Confirm (68 octets); set `v2` for Linux's v2 form.
    #[allow(clippy::too_many_arguments)]
    pub fn v1(
        first_contact: bool,
        peer_id: PeerId,
        gid: [u8; 16],
        mac: [u8; 6],
        qpn: u32,
        rmb_rkey: u32,
        rmbe_idx: u8,
        rmbe_alert_token: u32,
        rmbe_size: u8,
        qp_mtu: u8,
        rmb_vaddr: u64,
        psn: u32,
    ) -> Self {
        Self {
            eyecatcher: Eyecatcher::Smcr,
            version: 1,
            first_contact,
            peer_id,
            gid,
            mac,
            qpn,
            rmb_rkey,
            rmbe_idx,
            rmbe_alert_token,
            rmbe_size,
            qp_mtu,
            rmb_vaddr,
            psn,
            v2: None,
        }
    }

    /// SMC-CLC-6: whether the enumerated fields hold defined values.
    pub fn check_enums(&self) -> Result<(), EnumError> {
        if !(1..=5).contains(&self.qp_mtu) {
            return Err(EnumError::QpMtu(self.qp_mtu));
        }
        if self.rmbe_size > 5 {
            return Err(EnumError::RmbeSize(self.rmbe_size));
        }
        Ok(())
    }

    /// The QP MTU in octets (256 << (enum − 1)), `None` for a reserved value.
    pub fn qp_mtu_bytes(&self) -> Option<u32> {
        (1..=5).contains(&self.qp_mtu).then(|| 128u32 << self.qp_mtu)
    }

    /// The RMBE size in octets (16 KiB × 2^x).
    pub fn rmbe_bytes(&self) -> u32 {
        1u32 << (u32::from(self.rmbe_size.min(15)) + 14)
    }

    /// The emitted length.
    pub fn wire_len(&self) -> usize {
        match &self.v2 {
            None => ACCEPT_CONFIRM_V1_LEN,
            Some(v2) => v2.wire_len() + TRAILER_LEN,
        }
    }

    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, ClcError> {
        let len = b.len();
        let end = len - TRAILER_LEN;
        if h.version == 1 && len != ACCEPT_CONFIRM_V1_LEN || h.version >= 2 && len < ACCEPT_V2_BASE_LEN + TRAILER_LEN {
            return Err(h.bad_length());
        }
        if h.version >= 2 && SmcType::from_bits(h.flags) == SmcType::D {
            return Err(ClcError::SmcD);
        }
        let v2 = if h.version >= 2 {
            Some(AcceptConfirmV2::parse(h, b, end)?)
        } else {
            None
        };
        Ok(Self {
            eyecatcher: h.eyecatcher,
            version: h.version,
            first_contact: h.flags & 0x08 != 0,
            peer_id: PeerId(b[8..16].try_into().unwrap_or_default()),
            gid: b[16..32].try_into().unwrap_or_default(),
            mac: b[32..38].try_into().unwrap_or_default(),
            qpn: be24(&b[38..41]),
            rmb_rkey: be32(&b[41..45]),
            rmbe_idx: b[45],
            rmbe_alert_token: be32(&b[46..50]),
            rmbe_size: b[50] >> 4,
            qp_mtu: b[50] & 0x0f,
            rmb_vaddr: be64(&b[52..60]),
            psn: be24(&b[61..64]),
            v2,
        })
    }

    /// Emits as an Accept (`ClcType::Accept`) or Confirm (`ClcType::Confirm`).
    pub fn emit_as(&self, ty: ClcType, buf: &mut [u8]) -> Result<usize, ClcEmitError> {
        if !matches!(ty, ClcType::Accept | ClcType::Confirm) {
            return Err(ClcEmitError::Unrepresentable(
                "AcceptConfirm emitted as Proposal/Decline",
            ));
        }
        if self.v2.is_some() != (self.version >= 2) {
            return Err(ClcEmitError::Unrepresentable("v2 part iff version 2"));
        }
        if self.qpn > 0xff_ffff || self.psn > 0xff_ffff || self.rmbe_size > 15 || self.qp_mtu > 15 {
            return Err(ClcEmitError::Unrepresentable(
                "QPN/PSN above 24 bits or nibble above 15",
            ));
        }
        if let Some(v2) = &self.v2 {
            v2.check(ty, self.first_contact)?;
        }
        let len = self.wire_len();
        let b = out(buf, len)?;
        emit_header(
            b,
            self.eyecatcher,
            ty,
            self.version,
            if self.first_contact { 0x08 } else { 0 },
        )?;
        b[8..16].copy_from_slice(&self.peer_id.0);
        b[16..32].copy_from_slice(&self.gid);
        b[32..38].copy_from_slice(&self.mac);
        b[38..41].copy_from_slice(&self.qpn.to_be_bytes()[1..]);
        b[41..45].copy_from_slice(&self.rmb_rkey.to_be_bytes());
        b[45] = self.rmbe_idx;
        b[46..50].copy_from_slice(&self.rmbe_alert_token.to_be_bytes());
        b[50] = (self.rmbe_size << 4) | self.qp_mtu;
        b[51] = 0;
        b[52..60].copy_from_slice(&self.rmb_vaddr.to_be_bytes());
        b[60] = 0;
        b[61..64].copy_from_slice(&self.psn.to_be_bytes()[1..]);
        if let Some(v2) = &self.v2 {
            v2.emit(b);
        }
        b[len - 4..].copy_from_slice(&self.eyecatcher.bytes());
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::accept;
    use super::super::{ClcMessage, FceV2x, FirstContactExt};
    use super::*;
    use proptest::prelude::*;

    /// SMC-CLC-1: an Accept/Confirm v1 must be 68 octets.
    #[test]
    fn v1_length_is_68_smc_clc_1() {
        let mut w = ClcMessage::Accept(accept()).to_vec().unwrap();
        w.splice(64..64, [0u8; 4]);
        w[6] = 72;
        assert!(matches!(ClcMessage::parse(&w), Err(ClcError::BadLength { .. })));
    }

    /// SMC-CLC-2: reserved octets and bits are not validated on receipt; emitted ones are 0.
    #[test]
    fn reserved_fields_are_ignored_smc_clc_2() {
        let w = ClcMessage::Accept(accept()).to_vec().unwrap();
        for (i, mask) in [(7usize, 0x04u8), (51, 0xff), (60, 0xff)] {
            assert_eq!(w[i] & mask, 0, "emitted reserved octet {i}");
            let mut b = w.clone();
            b[i] |= mask;
            let ClcMessage::Accept(a) = ClcMessage::parse(&b).unwrap() else {
                panic!()
            };
            assert_eq!(a, accept(), "reserved octet {i}");
        }
    }

    /// SMC-CLC-6: bad enumerated values parse; `check_enums` names them.
    #[test]
    fn bad_enums_parse_and_are_reported_smc_clc_6() {
        for (mtu, size, err) in [
            (0, 2, Some(EnumError::QpMtu(0))),
            (7, 2, Some(EnumError::QpMtu(7))),
            (5, 6, Some(EnumError::RmbeSize(6))),
            (1, 5, None),
        ] {
            let a = AcceptConfirm {
                qp_mtu: mtu,
                rmbe_size: size,
                ..accept()
            };
            let w = ClcMessage::Accept(a.clone()).to_vec().unwrap();
            let ClcMessage::Accept(p) = ClcMessage::parse(&w).unwrap() else {
                panic!()
            };
            assert_eq!(p.check_enums().err(), err);
        }
        assert_eq!(AcceptConfirm { qp_mtu: 5, ..accept() }.qp_mtu_bytes(), Some(4096));
        assert_eq!(AcceptConfirm { qp_mtu: 1, ..accept() }.qp_mtu_bytes(), Some(256));
        assert_eq!(
            AcceptConfirm {
                rmbe_size: 0,
                ..accept()
            }
            .rmbe_bytes(),
            16384
        );
        assert_eq!(
            AcceptConfirm {
                rmbe_size: 5,
                ..accept()
            }
            .rmbe_bytes(),
            512 * 1024
        );
    }

    fn arb_accept() -> impl Strategy<Value = AcceptConfirm> {
        (
            any::<(bool, [u8; 8], [u8; 16], [u8; 6])>(),
            (
                0u32..1 << 24,
                any::<u32>(),
                any::<u8>(),
                any::<u32>(),
                0u8..16,
                0u8..16,
                any::<u64>(),
                0u32..1 << 24,
            ),
            proptest::option::of((
                any::<[u8; 32]>(),
                any::<(bool, [u8; 32])>(),
                0u8..16,
                0u8..16,
                any::<(u8, u8, u16, u32)>(),
                proptest::option::of(proptest::collection::vec(any::<[u8; 16]>(), 0..4)),
            )),
        )
            .prop_map(|((fc, pid, gid, mac), (qpn, rkey, idx, tok, size, mtu, va, psn), v2)| {
                let mut a = AcceptConfirm::v1(fc, PeerId(pid), gid, mac, qpn, rkey, idx, tok, size, mtu, va, psn);
                if let Some((eid, (direct, hostname), os, release, (mc, ml, fm, vo), gids)) = v2 {
                    a.version = 2;
                    let fce = fc.then(|| FirstContactExt {
                        v2_direct: direct,
                        os_type: os,
                        release,
                        hostname,
                        v2x: (release >= 1).then_some(FceV2x {
                            max_conns: mc,
                            max_links: ml,
                            feature_mask: fm,
                            vendor_exp_options: vo,
                        }),
                    });
                    let gid_list = if fce.is_some() { gids } else { None };
                    a.v2 = Some(AcceptConfirmV2 { eid, fce, gid_list });
                }
                a
            })
    }

    proptest! {
        /// Emit → parse is the identity for every representable Accept and Confirm.
        #[test]
        fn accept_confirm_round_trip_smc_clc_1(mut a in arb_accept(), confirm in any::<bool>()) {
            let m = if confirm {
                ClcMessage::Confirm(a)
            } else {
                if let Some(v2) = a.v2.as_mut() {
                    v2.gid_list = None;
                }
                ClcMessage::Accept(a)
            };
            let w = m.to_vec().unwrap();
            prop_assert_eq!(ClcMessage::parse(&w).unwrap(), m);
        }
    }
}
