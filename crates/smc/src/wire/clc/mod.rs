//! CLC messages (RFC 7609 A.2) in RFC 7609's v1 form and in Linux's v1/v2 forms.
//!
//! # API note (for the connection side)
//! - Framing on the TCP byte stream: [`frame_len`]`(buf)` → `Ok(None)` (need more octets),
//!   `Ok(Some(n))` (one whole message is `buf[..n]`), or `Err` (not a CLC message: the RFC
//!   C.6 answer is a reset, never a fallback). Then [`ClcMessage::parse`]`(&buf[..n])`.
//! - [`ClcMessage`] = `Proposal(`[`Proposal`]`)`, `Accept(`[`AcceptConfirm`]`)`,
//!   `Confirm(`[`AcceptConfirm`]`)`, `Decline(`[`Decline`]`)`; [`ClcMessage::to_vec`] /
//!   [`ClcMessage::emit`] give the octets. Constructors for what we send:
//!   [`Proposal::v1_linux`], [`Proposal::v2_linux`], [`AcceptConfirm::v1`] (+ `.v2 = Some(..)`),
//!   [`Decline::new`].
//! - A parse accepts every reserved field as received (SMC-CLC-2) and keeps bad enumerated
//!   values (QP MTU, RMBE size) as raw nibbles: [`AcceptConfirm::check_enums`] says which
//!   one is bad, and the answer to that is a Decline (SMC-CLC-6), not a reset.
//! - Decline diagnosis codes: [`Diagnosis`] (Linux's `SMC_CLC_DECL_*` values + meaning).
//!
//! # Forms
//! All integers big-endian. Byte 7 of the header: version in the high nibble; in v2 the low
//! nibble is Linux's `typev2` (bits `0x0C`) and `typev1` (bits `0x03`); bit `0x08` is the
//! first-contact flag of Accept/Confirm and the out-of-sync flag of Decline in both versions.
//! - **Proposal**: 40 fixed octets (header, peer ID, GID, MAC, offset N to the IP area),
//!   then the N-octet area, the IP area (subnet, prefix length, IPv6 prefixes), trailer.
//!   RFC 7609's form has N = 0 (52 octets); tshark 4.0.17 marks that form malformed, so we
//!   send Linux's 92-octet v1 form: N = 40 and a zeroed 40-octet SMC-D area (peers file
//!   §5.3.7). Linux's v2 form always has the 40-octet SMC-D area at offset 40, whose octets
//!   10..12 give the offset of the v2 extension (counted from the end of that field); when
//!   v1 is not offered (`typev1` = 2 "none", as the lab's Linux 6.12 client sends it) N = 0
//!   and there is no IP area at all (lab capture frame 6, 156 octets). The v2 extension:
//!   EID count, ISM GID count, release/SEID flags, offset of the SMC-Dv2 extension, the
//!   RoCEv2 GID, max connections, max links, feature mask, 12 reserved, then 32-octet EIDs
//!   (the first one is the UEID).
//! - **Accept / Confirm**: 68 octets in v1 (A1.5). Linux's SMC-Rv2 form adds the negotiated
//!   EID (32) and 8 reserved octets; with first contact, the first-contact extension
//!   (v2-direct flag, OS type, release, 2 reserved, 32-octet host name) and, from release 1,
//!   16 more octets (max connections, max links, feature mask, vendor options, 8 reserved);
//!   a v2 Confirm with first contact adds the GID list (count, 3 reserved, 16-octet GIDs).
//!   Lab capture frames 8 (Accept, 160 octets) and 10 (Confirm, 180 octets).
//! - **Decline**: 28 octets (A1.7); Linux v2 adds four 32-bit diagnosis words (44 octets).
//!
//! # Errata decisions (requirements part E)
//! - E-4: the Proposal's IPv4 field carries the subnet (address & mask) and the prefix
//!   length; [`IpArea::same_subnet`] matches both.
//! - E-8: the Confirm's RMB virtual address is as registered on the *client's* RNIC.
//! - E-13: Decline codes are Linux's ([`Diagnosis`]), diagnostics only; the S flag applies
//!   to the link group named in this connection's Accept.
//! - E-20: a Proposal's length is 52 + N + 17·n (+ v2 extensions), not "52 for IPv4".
//! - The trailer may be "SMCR" or "SMCD" independently of the leading eyecatcher (Linux
//!   checks each against both); we emit the leading one twice.
//!
//! Every length and offset from the peer is checked before use; malformed input is a typed
//! [`ClcError`], never a panic. Requirements: smcr-ipoibcm.md A1.3–A1.7, A2.2, C5, E.
//!
//! # Modules (all items are re-exported here, so `smc::wire::clc::X` is the path to use)
//! - `header`: the common 8-octet header and trailer, [`ClcType`], [`Eyecatcher`],
//!   [`SmcType`], [`PeerId`] (A1.3, A1.6).
//! - `proposal`: [`Proposal`], its SMC-D area and [`IpArea`] (A1.4).
//! - `v2ext`: Linux's v2 extensions: the Proposal's [`V2Extension`] and the Accept/Confirm's
//!   [`AcceptConfirmV2`] with the [`FirstContactExt`].
//! - `accept`: [`AcceptConfirm`] (A1.5).
//! - `decline`: [`Decline`] and the [`Diagnosis`] codes (A1.7).
//! - `error`: [`ClcError`] (peer input) and [`ClcEmitError`] (local values).

mod accept;
mod decline;
mod error;
mod header;
mod proposal;
mod v2ext;

pub use accept::{AcceptConfirm, EnumError};
pub use decline::{Decline, Diagnosis};
pub use error::{ClcEmitError, ClcError};
pub use header::{ClcType, Eyecatcher, Header, PeerId, SmcType};
pub use proposal::{IpArea, Proposal, SmcdArea};
pub use v2ext::{AcceptConfirmV2, FceV2x, FirstContactExt, V2Extension};

/// "SMCR" in EBCDIC: leading and trailing eyecatcher of SMC-R CLC messages.
pub const EYECATCHER_SMCR: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xD9];
/// "SMCD" in EBCDIC: Linux's eyecatcher for SMC-D CLC messages.
pub const EYECATCHER_SMCD: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xC4];
/// Header length (eyecatcher, type, length, version/flags).
pub const HEADER_LEN: usize = 8;
/// Trailer length (eyecatcher).
pub const TRAILER_LEN: usize = 4;
/// Longest CLC message we accept (bounded buffering; Linux's largest, a v2 Proposal with 8
/// EIDs, 8 IPv6 prefixes and an SMC-Dv2 extension with 8 GIDs, stays well below).
pub const MAX_LEN: usize = 1024;
/// Length of a v1 Accept or Confirm.
pub const ACCEPT_CONFIRM_V1_LEN: usize = 68;
/// Length of a v1 Decline.
pub const DECLINE_V1_LEN: usize = 28;
/// Length of Linux's v2 Decline (four more diagnosis words).
pub const DECLINE_V2_LEN: usize = 44;
/// Length of RFC 7609's minimal IPv4 Proposal (offset N = 0).
pub const PROPOSAL_RFC_V1_LEN: usize = 52;
/// Length of Linux's v1 IPv4 Proposal (N = 40, zeroed SMC-D area; peers file §5.3.7).
pub const PROPOSAL_LINUX_V1_LEN: usize = 92;
/// Length of an EID (UEID / SEID), blank padded.
pub const EID_LEN: usize = 32;
/// Length of the host name in the first-contact extension, blank padded.
pub const HOSTNAME_LEN: usize = 32;
/// Most IPv6 prefixes in a Proposal (Linux `SMC_CLC_MAX_V6_PREFIX`).
pub const MAX_IPV6_PREFIXES: usize = 8;
/// Most EIDs in a v2 extension (Linux `SMC_CLC_MAX_UEID`).
pub const MAX_EIDS: usize = 8;
/// Length of the SMC-D area Linux puts after the Proposal's fixed part.
pub const SMCD_AREA_LEN: usize = 40;
const FIXED_PROPOSAL_LEN: usize = 40;
const V2_EXT_FIXED_LEN: usize = 40;
const ACCEPT_V2_BASE_LEN: usize = 64 + EID_LEN + 8;
const FCE_LEN: usize = 4 + HOSTNAME_LEN;
const FCE_V2X_LEN: usize = 16;

/// Framing on the TCP byte stream: `Ok(None)` while fewer than 8 octets are buffered (the
/// eyecatcher is checked on whatever part of it is present, so garbage fails at once),
/// `Ok(Some(n))` when the header says the message is `n` octets long (`n` may exceed
/// `buf.len()`: wait for more), `Err` when this is not a CLC header.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, ClcError> {
    if buf.len() < HEADER_LEN {
        let k = buf.len().min(4);
        if buf[..k] != EYECATCHER_SMCR[..k] && buf[..k] != EYECATCHER_SMCD[..k] {
            let mut e = [0u8; 4];
            e[..k].copy_from_slice(&buf[..k]);
            return Err(ClcError::BadEyecatcher(e));
        }
        return Ok(None);
    }
    Header::parse(buf).map(|h| Some(usize::from(h.length)))
}

/// One CLC message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClcMessage {
    /// Proposal.
    Proposal(Proposal),
    /// Accept.
    Accept(AcceptConfirm),
    /// Confirm.
    Confirm(AcceptConfirm),
    /// Decline.
    Decline(Decline),
}

impl ClcMessage {
    /// Parses exactly one message (`buf.len()` must equal the length field): header,
    /// trailer eyecatcher, the type's layout.
    pub fn parse(buf: &[u8]) -> Result<Self, ClcError> {
        let h = Header::parse(buf)?;
        if usize::from(h.length) != buf.len() {
            return Err(ClcError::LengthBufferMismatch {
                length: h.length,
                have: buf.len(),
            });
        }
        let t = &buf[buf.len() - TRAILER_LEN..];
        if Eyecatcher::from_bytes(t).is_none() {
            return Err(ClcError::BadTrailer(t.try_into().unwrap_or_default()));
        }
        Ok(match h.ty {
            ClcType::Proposal => Self::Proposal(Proposal::parse_body(&h, buf)?),
            ClcType::Accept => Self::Accept(AcceptConfirm::parse_body(&h, buf)?),
            ClcType::Confirm => Self::Confirm(AcceptConfirm::parse_body(&h, buf)?),
            ClcType::Decline => Self::Decline(Decline::parse_body(&h, buf)?),
        })
    }

    /// The message type.
    pub fn ty(&self) -> ClcType {
        match self {
            Self::Proposal(_) => ClcType::Proposal,
            Self::Accept(_) => ClcType::Accept,
            Self::Confirm(_) => ClcType::Confirm,
            Self::Decline(_) => ClcType::Decline,
        }
    }

    /// The emitted length.
    pub fn wire_len(&self) -> usize {
        match self {
            Self::Proposal(p) => p.wire_len(),
            Self::Accept(a) | Self::Confirm(a) => a.wire_len(),
            Self::Decline(d) => d.wire_len(),
        }
    }

    /// Emits the message into `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, ClcEmitError> {
        match self {
            Self::Proposal(p) => p.emit(buf),
            Self::Accept(a) => a.emit_as(ClcType::Accept, buf),
            Self::Confirm(a) => a.emit_as(ClcType::Confirm, buf),
            Self::Decline(d) => d.emit(buf),
        }
    }

    /// The message's octets.
    pub fn to_vec(&self) -> Result<Vec<u8>, ClcEmitError> {
        let mut v = vec![0; self.wire_len()];
        let n = self.emit(&mut v)?;
        v.truncate(n);
        Ok(v)
    }
}

/// Messages the tests of every module build on.
#[cfg(test)]
mod fixtures {
    use super::{AcceptConfirm, IpArea, PeerId, Proposal};
    use std::net::Ipv4Addr;

    pub(super) fn mac() -> [u8; 6] {
        [0x52, 0x54, 0, 0x77, 0, 1]
    }
    pub(super) fn gid() -> [u8; 16] {
        let mut g = [0; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[192, 168, 77, 1]);
        g
    }
    pub(super) fn v1_proposal() -> Proposal {
        Proposal::v1_linux(
            PeerId::new(0x1234, mac()),
            gid(),
            mac(),
            IpArea::ipv4(Ipv4Addr::new(192, 168, 77, 1), 24),
        )
    }
    pub(super) fn accept() -> AcceptConfirm {
        AcceptConfirm::v1(
            true,
            PeerId::new(7, mac()),
            gid(),
            mac(),
            0x11,
            0x7ff,
            1,
            3,
            2,
            3,
            0xdead_beef_0000,
            0x789f86,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{accept, mac, v1_proposal};
    use super::*;
    use proptest::prelude::*;

    /// SMC-CLC-1: one-octet corruptions of either eyecatcher, the type or the length are
    /// rejected with their own error.
    #[test]
    fn corruptions_are_typed_errors_smc_clc_1() {
        for m in [
            ClcMessage::Proposal(v1_proposal()),
            ClcMessage::Accept(accept()),
            ClcMessage::Confirm(AcceptConfirm {
                first_contact: false,
                ..accept()
            }),
            ClcMessage::Decline(Decline::new(PeerId::new(1, mac()), Diagnosis::DIFF_PREFIX, false)),
        ] {
            let w = m.to_vec().unwrap();
            assert_eq!(ClcMessage::parse(&w).unwrap(), m);
            for i in 0..4 {
                let mut b = w.clone();
                b[i] ^= 0x01;
                assert!(
                    matches!(ClcMessage::parse(&b), Err(ClcError::BadEyecatcher(_))),
                    "{m:?} octet {i}"
                );
                let mut b = w.clone();
                let t = b.len() - 4 + i;
                b[t] ^= 0x01;
                assert!(matches!(ClcMessage::parse(&b), Err(ClcError::BadTrailer(_))));
            }
            let mut b = w.clone();
            b[4] = 5;
            assert_eq!(ClcMessage::parse(&b), Err(ClcError::UnknownType(5)));
            let mut b = w.clone();
            b[6] = b[6].wrapping_add(1);
            assert!(ClcMessage::parse(&b).is_err());
            assert!(ClcMessage::parse(&w[..w.len() - 1]).is_err());
            // Every prefix: framing waits or fails, parse never panics.
            for k in 0..w.len() {
                assert_eq!(frame_len(&w[..k]).unwrap(), if k < 8 { None } else { Some(w.len()) });
                assert!(ClcMessage::parse(&w[..k]).is_err());
            }
        }
        assert!(matches!(
            frame_len(b"GET / HTTP/1.1\r\n"),
            Err(ClcError::BadEyecatcher(_))
        ));
        assert!(matches!(frame_len(b"G"), Err(ClcError::BadEyecatcher(_))));
        let mut long = Decline::new(PeerId::default(), Diagnosis::MEM, false);
        long.version = 1;
        let mut w = ClcMessage::Decline(long).to_vec().unwrap();
        w[5..7].copy_from_slice(&2000u16.to_be_bytes());
        assert_eq!(frame_len(&w), Err(ClcError::TooLong(2000)));
    }

    proptest! {
        /// Arbitrary octets behind a valid header never panic.
        #[test]
        fn garbage_never_panics_smc_clc_1(ty in 1u8..=4, ver in 1u8..=3, flags in 0u8..16, body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let len = body.len() + 12;
            let mut w = Vec::with_capacity(len);
            w.extend_from_slice(&EYECATCHER_SMCR);
            w.push(ty);
            w.extend_from_slice(&(len as u16).to_be_bytes());
            w.push((ver << 4) | flags);
            w.extend_from_slice(&body);
            w.extend_from_slice(&EYECATCHER_SMCR);
            if let Ok(m) = ClcMessage::parse(&w) {
                let again = m.to_vec().unwrap();
                prop_assert_eq!(ClcMessage::parse(&again).unwrap(), m);
            }
        }
    }
}
