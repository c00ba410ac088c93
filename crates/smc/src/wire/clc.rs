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

use std::net::{Ipv4Addr, Ipv6Addr};

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

/// A CLC message could not be parsed (peer input). RFC 7609 C.6: while a CLC message is
/// expected, this is a protocol error answered by a reset, not a fallback.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClcError {
    /// Fewer octets than the layout needs.
    #[error("CLC {what} needs {need} octets, {have} present")]
    Truncated {
        /// What was being parsed.
        what: &'static str,
        /// Octets needed.
        need: usize,
        /// Octets present.
        have: usize,
    },
    /// The leading eyecatcher is neither "SMCR" nor "SMCD" (EBCDIC).
    #[error("bad CLC eyecatcher {0:02x?}")]
    BadEyecatcher([u8; 4]),
    /// The trailing eyecatcher is neither "SMCR" nor "SMCD" (EBCDIC).
    #[error("bad CLC trailer eyecatcher {0:02x?}")]
    BadTrailer([u8; 4]),
    /// The type octet is not 1..=4.
    #[error("unknown CLC message type {0}")]
    UnknownType(u8),
    /// The version nibble is 0.
    #[error("CLC version 0")]
    BadVersion,
    /// The length field does not fit the type and version.
    #[error("CLC {ty:?} of version {version} cannot be {length} octets long")]
    BadLength {
        /// Message type.
        ty: ClcType,
        /// Version nibble.
        version: u8,
        /// Length field.
        length: u16,
    },
    /// The length field exceeds [`MAX_LEN`].
    #[error("CLC length {0} exceeds the limit")]
    TooLong(u16),
    /// The buffer given to `parse` is not exactly one message.
    #[error("CLC length field says {length}, buffer holds {have}")]
    LengthBufferMismatch {
        /// Length field.
        length: u16,
        /// Buffer length.
        have: usize,
    },
    /// An offset or count points outside the message.
    #[error("CLC {what} lies outside the message")]
    BadOffset {
        /// The area.
        what: &'static str,
    },
    /// More IPv6 prefixes than allowed.
    #[error("CLC Proposal lists {0} IPv6 prefixes (at most 8)")]
    TooManyPrefixes(u8),
    /// More EIDs than allowed.
    #[error("CLC v2 extension lists {0} EIDs (at most 8)")]
    TooManyEids(u8),
    /// An Accept or Confirm for SMC-D: this crate speaks SMC-R only.
    #[error("CLC Accept/Confirm for SMC-D is not supported")]
    SmcD,
}

/// A message could not be emitted (a local bug or a value outside the format).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClcEmitError {
    /// The output buffer is too small.
    #[error("CLC emit needs {need} octets, buffer has {have}")]
    BufferTooSmall {
        /// Octets needed.
        need: usize,
        /// Buffer length.
        have: usize,
    },
    /// A field does not fit the format (list too long, v2 field on a v1 message ...).
    #[error("CLC emit: {0}")]
    Unrepresentable(&'static str),
}

/// CLC message types (A1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ClcType {
    /// Proposal (client → server).
    Proposal = 1,
    /// Accept (server → client).
    Accept = 2,
    /// Confirm (client → server).
    Confirm = 3,
    /// Decline (either side).
    Decline = 4,
}

impl ClcType {
    /// The type for an octet value.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Proposal,
            2 => Self::Accept,
            3 => Self::Confirm,
            4 => Self::Decline,
            _ => return None,
        })
    }
}

/// Which eyecatcher a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Eyecatcher {
    /// "SMCR".
    #[default]
    Smcr,
    /// "SMCD" (Linux, SMC-D).
    Smcd,
}

impl Eyecatcher {
    /// The four octets.
    pub fn bytes(self) -> [u8; 4] {
        match self {
            Self::Smcr => EYECATCHER_SMCR,
            Self::Smcd => EYECATCHER_SMCD,
        }
    }
    fn from_bytes(b: &[u8]) -> Option<Self> {
        if b == EYECATCHER_SMCR {
            Some(Self::Smcr)
        } else if b == EYECATCHER_SMCD {
            Some(Self::Smcd)
        } else {
            None
        }
    }
}

/// The 2-bit SMC type of Linux's v2 header (`typev1`, `typev2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SmcType {
    /// SMC-R only (0).
    #[default]
    R,
    /// SMC-D only (1).
    D,
    /// Neither (2).
    None,
    /// Both (3).
    Both,
}

impl SmcType {
    /// From the two bits.
    pub fn from_bits(b: u8) -> Self {
        match b & 3 {
            0 => Self::R,
            1 => Self::D,
            2 => Self::None,
            _ => Self::Both,
        }
    }
    /// The two bits.
    pub fn bits(self) -> u8 {
        match self {
            Self::R => 0,
            Self::D => 1,
            Self::None => 2,
            Self::Both => 3,
        }
    }
    /// Whether SMC-R is offered.
    pub fn offers_r(self) -> bool {
        matches!(self, Self::R | Self::Both)
    }
}

/// Peer ID (A1.3, A.2.1): 2-octet instance ID and a RoCE MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PeerId(pub [u8; 8]);

impl PeerId {
    /// From an instance ID and a MAC.
    pub fn new(instance: u16, mac: [u8; 6]) -> Self {
        let mut b = [0; 8];
        b[..2].copy_from_slice(&instance.to_be_bytes());
        b[2..].copy_from_slice(&mac);
        Self(b)
    }
    /// The instance ID.
    pub fn instance(&self) -> u16 {
        u16::from_be_bytes([self.0[0], self.0[1]])
    }
}

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

/// The 40-octet SMC-D area Linux puts after a Proposal's fixed part (`smc_clc_msg_smcd`).
/// For SMC-R it is zero except for the v2-extension offset, which [`Proposal::emit`]
/// computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmcdArea {
    /// ISM GID of the requestor (SMC-D).
    pub ism_gid: u64,
    /// ISMv2 CHID (SMC-D).
    pub chid: u16,
    /// Vendor OUI.
    pub vendor_oui: [u8; 3],
    /// Vendor experimental options.
    pub vendor_exp_options: [u8; 5],
}

/// The Proposal's IP area (A1.4): IPv4 subnet and prefix length, IPv6 prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpArea {
    /// IPv4 subnet (address & mask; E-4), all zero for an IPv6 flow.
    pub subnet: Ipv4Addr,
    /// IPv4 prefix length (0 for IPv6).
    pub prefix_len: u8,
    /// IPv6 prefixes and their lengths (at most 8).
    pub ipv6: Vec<(Ipv6Addr, u8)>,
}

impl IpArea {
    /// The IPv4 area for address `addr` with prefix length `len`: subnet = addr & mask (E-4).
    pub fn ipv4(addr: Ipv4Addr, len: u8) -> Self {
        Self {
            subnet: Ipv4Addr::from(u32::from(addr) & mask(len)),
            prefix_len: len,
            ipv6: Vec::new(),
        }
    }
    /// SMC-FC-1 (E-4): whether a local interface `addr`/`len` is on the proposed subnet:
    /// same prefix length and same network address.
    pub fn same_subnet(&self, addr: Ipv4Addr, len: u8) -> bool {
        len == self.prefix_len && len <= 32 && u32::from(addr) & mask(len) == u32::from(self.subnet) & mask(len)
    }
    fn wire_len(&self) -> usize {
        8 + 17 * self.ipv6.len()
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

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
    fn wire_len(&self) -> usize {
        V2_EXT_FIXED_LEN + EID_LEN * self.eids.len() + self.smcd_v2_ext.len()
    }
}

/// SMC Proposal (A1.4), v1 (RFC and Linux forms) or Linux v2.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Proposal {
    /// Eyecatcher.
    pub eyecatcher: Eyecatcher,
    /// Version nibble (1 or 2).
    pub version: u8,
    /// v2 header: SMC type offered for v2 (bits 0x0C); zero in v1.
    pub typev2: SmcType,
    /// SMC type offered for v1 (bits 0x03; Linux sets them in v1 Proposals too: 0 = SMC-R,
    /// 1 = SMC-D, 3 = both).
    pub typev1: SmcType,
    /// Client peer ID.
    pub peer_id: PeerId,
    /// Client preferred GID.
    pub gid: [u8; 16],
    /// Client preferred RoCE MAC.
    pub mac: [u8; 6],
    /// Linux's 40-octet SMC-D area (always present in Linux's forms, absent in RFC 7609's).
    pub smcd: Option<SmcdArea>,
    /// The IP area (absent in Linux's v2 form that does not offer v1).
    pub ip: Option<IpArea>,
    /// The v2 extension (v2 only; needs `smcd`, which holds its offset).
    pub v2_ext: Option<V2Extension>,
}

impl Proposal {
    /// Linux's 92-octet v1 IPv4 Proposal (the form tshark and Linux expect, §5.3.7).
    pub fn v1_linux(peer_id: PeerId, gid: [u8; 16], mac: [u8; 6], ip: IpArea) -> Self {
        Self {
            eyecatcher: Eyecatcher::Smcr,
            version: 1,
            typev2: SmcType::R,
            typev1: SmcType::R,
            peer_id,
            gid,
            mac,
            smcd: Some(SmcdArea::default()),
            ip: Some(ip),
            v2_ext: None,
        }
    }

    /// Linux's SMC-Rv2 Proposal. With `v1` = `Some((peer_id, gid, mac, ip))` it offers v1
    /// SMC-R as well (typev1 = R); without, typev1 = "none" and there is no IP area, as the
    /// lab's Linux 6.12 client sends it.
    pub fn v2_linux(v1: Option<(PeerId, [u8; 16], [u8; 6], IpArea)>, ext: V2Extension) -> Self {
        let (typev1, peer_id, gid, mac, ip) = match v1 {
            Some((p, g, m, ip)) => (SmcType::R, p, g, m, Some(ip)),
            None => (SmcType::None, PeerId::default(), [0; 16], [0; 6], None),
        };
        Self {
            eyecatcher: Eyecatcher::Smcr,
            version: 2,
            typev2: SmcType::R,
            typev1,
            peer_id,
            gid,
            mac,
            smcd: Some(SmcdArea::default()),
            ip,
            v2_ext: Some(ext),
        }
    }

    /// Whether the Proposal offers v1 SMC-R: typev1 R or both (a v1 Proposal from Linux
    /// that offers only SMC-D has typev1 = 1), and an IP area.
    pub fn offers_v1_r(&self) -> bool {
        self.typev1.offers_r() && self.ip.is_some()
    }

    /// Whether the Proposal offers v2 SMC-R with a v2 extension.
    pub fn offers_v2_r(&self) -> bool {
        self.version >= 2 && self.typev2.offers_r() && self.v2_ext.is_some()
    }

    /// The emitted length.
    pub fn wire_len(&self) -> usize {
        FIXED_PROPOSAL_LEN
            + self.smcd.map_or(0, |_| SMCD_AREA_LEN)
            + self.ip.as_ref().map_or(0, IpArea::wire_len)
            + self.v2_ext.as_ref().map_or(0, V2Extension::wire_len)
            + TRAILER_LEN
    }

    fn parse_body(h: &Header, b: &[u8]) -> Result<Self, ClcError> {
        let len = b.len();
        let end = len - TRAILER_LEN;
        if len < FIXED_PROPOSAL_LEN + TRAILER_LEN {
            return Err(h.bad_length());
        }
        let n = usize::from(be16(&b[38..40]));
        let smcd_present = h.version >= 2 || n >= SMCD_AREA_LEN;
        let (smcd, v2_ext_offset) = if smcd_present {
            let a = b.get(40..40 + SMCD_AREA_LEN).filter(|_| 40 + SMCD_AREA_LEN <= end);
            let a = a.ok_or(ClcError::BadOffset { what: "SMC-D area" })?;
            let area = SmcdArea {
                ism_gid: be64(&a[0..8]),
                chid: be16(&a[8..10]),
                vendor_oui: a[12..15].try_into().unwrap_or_default(),
                vendor_exp_options: a[15..20].try_into().unwrap_or_default(),
            };
            (Some(area), usize::from(be16(&a[10..12])))
        } else {
            (None, 0)
        };
        let typev1 = SmcType::from_bits(h.flags);
        let typev2 = SmcType::from_bits(h.flags >> 2);
        let ip_present = h.version == 1 || typev1 != SmcType::None;
        let ip = if ip_present {
            let at = FIXED_PROPOSAL_LEN + n;
            if smcd.is_some() && n < SMCD_AREA_LEN {
                return Err(ClcError::BadOffset {
                    what: "IP area (overlaps the SMC-D area)",
                });
            }
            let a = b
                .get(at..at + 8)
                .filter(|_| at + 8 <= end)
                .ok_or(ClcError::BadOffset { what: "IP area" })?;
            let cnt = a[7];
            if usize::from(cnt) > MAX_IPV6_PREFIXES {
                return Err(ClcError::TooManyPrefixes(cnt));
            }
            let pend = at + 8 + 17 * usize::from(cnt);
            if pend > end {
                return Err(ClcError::BadOffset {
                    what: "IPv6 prefix array",
                });
            }
            let ipv6 = b[at + 8..pend]
                .chunks_exact(17)
                .map(|c| {
                    (
                        Ipv6Addr::from(<[u8; 16]>::try_from(&c[..16]).unwrap_or_default()),
                        c[16],
                    )
                })
                .collect();
            Some(IpArea {
                subnet: Ipv4Addr::new(a[0], a[1], a[2], a[3]),
                prefix_len: a[4],
                ipv6,
            })
        } else {
            None
        };
        let ip_end = match &ip {
            Some(a) => FIXED_PROPOSAL_LEN + n + a.wire_len(),
            None => FIXED_PROPOSAL_LEN + SMCD_AREA_LEN,
        };
        let v2_ext = if h.version >= 2 && v2_ext_offset != 0 {
            let at = 52 + v2_ext_offset;
            if at < ip_end {
                return Err(ClcError::BadOffset {
                    what: "v2 extension (overlaps the IP area)",
                });
            }
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
            Some(V2Extension {
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
        } else {
            None
        };
        Ok(Self {
            eyecatcher: h.eyecatcher,
            version: h.version,
            typev2: if h.version >= 2 { typev2 } else { SmcType::R },
            typev1,
            peer_id: PeerId(b[8..16].try_into().unwrap_or_default()),
            gid: b[16..32].try_into().unwrap_or_default(),
            mac: b[32..38].try_into().unwrap_or_default(),
            smcd,
            ip,
            v2_ext,
        })
    }

    /// Emits the Proposal into `buf`; returns the length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, ClcEmitError> {
        if self.v2_ext.is_some() && (self.version < 2 || self.smcd.is_none()) {
            return Err(ClcEmitError::Unrepresentable(
                "v2 extension needs version 2 and the SMC-D area",
            ));
        }
        if let Some(ip) = &self.ip
            && ip.ipv6.len() > MAX_IPV6_PREFIXES
        {
            return Err(ClcEmitError::Unrepresentable("more than 8 IPv6 prefixes"));
        }
        if let Some(e) = &self.v2_ext
            && e.eids.len() > MAX_EIDS
        {
            return Err(ClcEmitError::Unrepresentable("more than 8 EIDs"));
        }
        let len = self.wire_len();
        let b = out(buf, len)?;
        let flags = if self.version >= 2 {
            (self.typev2.bits() << 2) | self.typev1.bits()
        } else {
            self.typev1.bits()
        };
        emit_header(b, self.eyecatcher, ClcType::Proposal, self.version, flags)?;
        b[8..16].copy_from_slice(&self.peer_id.0);
        b[16..32].copy_from_slice(&self.gid);
        b[32..38].copy_from_slice(&self.mac);
        let n = match (&self.ip, self.smcd) {
            (Some(_), Some(_)) => SMCD_AREA_LEN as u16,
            _ => 0,
        };
        b[38..40].copy_from_slice(&n.to_be_bytes());
        let mut at = FIXED_PROPOSAL_LEN;
        if let Some(a) = self.smcd {
            let s = &mut b[at..at + SMCD_AREA_LEN];
            s.fill(0);
            s[0..8].copy_from_slice(&a.ism_gid.to_be_bytes());
            s[8..10].copy_from_slice(&a.chid.to_be_bytes());
            if self.v2_ext.is_some() {
                let off = SMCD_AREA_LEN - 12 + self.ip.as_ref().map_or(0, IpArea::wire_len);
                s[10..12].copy_from_slice(&(off as u16).to_be_bytes());
            }
            s[12..15].copy_from_slice(&a.vendor_oui);
            s[15..20].copy_from_slice(&a.vendor_exp_options);
            at += SMCD_AREA_LEN;
        }
        if let Some(ip) = &self.ip {
            b[at..at + 4].copy_from_slice(&ip.subnet.octets());
            b[at + 4] = ip.prefix_len;
            b[at + 5..at + 7].fill(0);
            b[at + 7] = ip.ipv6.len() as u8;
            at += 8;
            for (p, l) in &ip.ipv6 {
                b[at..at + 16].copy_from_slice(&p.octets());
                b[at + 16] = *l;
                at += 17;
            }
        }
        if let Some(e) = &self.v2_ext {
            let s = &mut b[at..at + V2_EXT_FIXED_LEN];
            s.fill(0);
            s[0] = e.eids.len() as u8;
            s[1] = e.ism_gid_cnt;
            s[3] = (e.release << 4) | u8::from(e.seid);
            if !e.smcd_v2_ext.is_empty() {
                let off = V2_EXT_FIXED_LEN - 8 + EID_LEN * e.eids.len();
                s[6..8].copy_from_slice(&(off as u16).to_be_bytes());
            }
            s[8..24].copy_from_slice(&e.roce_gid);
            s[24] = e.max_conns;
            s[25] = e.max_links;
            s[26..28].copy_from_slice(&e.feature_mask.to_be_bytes());
            at += V2_EXT_FIXED_LEN;
            for eid in &e.eids {
                b[at..at + EID_LEN].copy_from_slice(eid);
                at += EID_LEN;
            }
            b[at..at + e.smcd_v2_ext.len()].copy_from_slice(&e.smcd_v2_ext);
        }
        b[len - 4..].copy_from_slice(&self.eyecatcher.bytes());
        Ok(len)
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
            Some(v2) => {
                ACCEPT_V2_BASE_LEN
                    + v2.fce
                        .as_ref()
                        .map_or(0, |f| FCE_LEN + f.v2x.map_or(0, |_| FCE_V2X_LEN))
                    + v2.gid_list.as_ref().map_or(0, |g| 4 + 16 * g.len())
                    + TRAILER_LEN
            }
        }
    }

    fn parse_body(h: &Header, b: &[u8]) -> Result<Self, ClcError> {
        let len = b.len();
        let end = len - TRAILER_LEN;
        if h.version == 1 && len != ACCEPT_CONFIRM_V1_LEN || h.version >= 2 && len < ACCEPT_V2_BASE_LEN + TRAILER_LEN {
            return Err(h.bad_length());
        }
        if h.version >= 2 && SmcType::from_bits(h.flags) == SmcType::D {
            return Err(ClcError::SmcD);
        }
        let v2 = if h.version >= 2 {
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
            Some(AcceptConfirmV2 {
                eid: b[64..64 + EID_LEN].try_into().unwrap_or([0; EID_LEN]),
                fce,
                gid_list,
            })
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
            if v2.gid_list.as_ref().is_some_and(|g| g.len() > 255) {
                return Err(ClcEmitError::Unrepresentable("more than 255 GIDs"));
            }
            if (v2.fce.is_none() || ty == ClcType::Accept) && v2.gid_list.is_some() {
                return Err(ClcEmitError::Unrepresentable(
                    "GID list only in a first-contact Confirm",
                ));
            }
            if v2
                .fce
                .as_ref()
                .is_some_and(|f| f.os_type > 15 || f.release > 15 || (f.release >= 1) != f.v2x.is_some())
            {
                return Err(ClcEmitError::Unrepresentable(
                    "first-contact extension: v2x iff release >= 1",
                ));
            }
            if v2.fce.is_some() != self.first_contact {
                return Err(ClcEmitError::Unrepresentable(
                    "v2 first-contact extension iff first contact",
                ));
            }
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
            b[64..64 + EID_LEN].copy_from_slice(&v2.eid);
            let mut at = 64 + EID_LEN;
            b[at..at + 8].fill(0);
            at += 8;
            if let Some(f) = &v2.fce {
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
            if let Some(g) = &v2.gid_list {
                b[at..at + 4].copy_from_slice(&[g.len() as u8, 0, 0, 0]);
                at += 4;
                for gid in g {
                    b[at..at + 16].copy_from_slice(gid);
                    at += 16;
                }
            }
        }
        b[len - 4..].copy_from_slice(&self.eyecatcher.bytes());
        Ok(len)
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

    fn parse_body(h: &Header, b: &[u8]) -> Result<Self, ClcError> {
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

/// The common header, as parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Leading eyecatcher.
    pub eyecatcher: Eyecatcher,
    /// Type.
    pub ty: ClcType,
    /// Length field.
    pub length: u16,
    /// Version nibble.
    pub version: u8,
    /// Low nibble of octet 7 (flags; meaning per type and version).
    pub flags: u8,
}

impl Header {
    /// Parses and checks the 8-octet header: eyecatcher, type, version ≠ 0, length within
    /// the type's minimum and [`MAX_LEN`].
    pub fn parse(b: &[u8]) -> Result<Self, ClcError> {
        if b.len() < HEADER_LEN {
            return Err(ClcError::Truncated {
                what: "header",
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        let eyecatcher =
            Eyecatcher::from_bytes(&b[..4]).ok_or(ClcError::BadEyecatcher(b[..4].try_into().unwrap_or_default()))?;
        let ty = ClcType::from_u8(b[4]).ok_or(ClcError::UnknownType(b[4]))?;
        let length = be16(&b[5..7]);
        let version = b[7] >> 4;
        if version == 0 {
            return Err(ClcError::BadVersion);
        }
        let h = Self {
            eyecatcher,
            ty,
            length,
            version,
            flags: b[7] & 0x0f,
        };
        if usize::from(length) > MAX_LEN {
            return Err(ClcError::TooLong(length));
        }
        let min = match ty {
            ClcType::Proposal => FIXED_PROPOSAL_LEN + TRAILER_LEN,
            ClcType::Accept | ClcType::Confirm => ACCEPT_CONFIRM_V1_LEN,
            ClcType::Decline => DECLINE_V1_LEN,
        };
        if usize::from(length) < min {
            return Err(h.bad_length());
        }
        Ok(h)
    }
    fn bad_length(&self) -> ClcError {
        ClcError::BadLength {
            ty: self.ty,
            version: self.version,
            length: self.length,
        }
    }
}

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

fn out(buf: &mut [u8], len: usize) -> Result<&mut [u8], ClcEmitError> {
    let have = buf.len();
    if len > MAX_LEN {
        return Err(ClcEmitError::Unrepresentable("message longer than MAX_LEN"));
    }
    buf.get_mut(..len)
        .ok_or(ClcEmitError::BufferTooSmall { need: len, have })
}

fn emit_header(b: &mut [u8], e: Eyecatcher, ty: ClcType, version: u8, flags: u8) -> Result<(), ClcEmitError> {
    if version == 0 || version > 15 {
        return Err(ClcEmitError::Unrepresentable("version must be 1..=15"));
    }
    let len = b.len() as u16;
    b[..4].copy_from_slice(&e.bytes());
    b[4] = ty as u8;
    b[5..7].copy_from_slice(&len.to_be_bytes());
    b[7] = (version << 4) | (flags & 0x0f);
    Ok(())
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mac() -> [u8; 6] {
        [0x52, 0x54, 0, 0x77, 0, 1]
    }
    fn gid() -> [u8; 16] {
        let mut g = [0; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[192, 168, 77, 1]);
        g
    }
    fn v1_proposal() -> Proposal {
        Proposal::v1_linux(
            PeerId::new(0x1234, mac()),
            gid(),
            mac(),
            IpArea::ipv4(Ipv4Addr::new(192, 168, 77, 1), 24),
        )
    }
    fn accept() -> AcceptConfirm {
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

    #[test]
    fn linux_v1_proposal_is_92_octets_smc_clc_1() {
        let w = ClcMessage::Proposal(v1_proposal()).to_vec().unwrap();
        assert_eq!(w.len(), PROPOSAL_LINUX_V1_LEN);
        assert_eq!(&w[..8], &[0xE2, 0xD4, 0xC3, 0xD9, 1, 0, 92, 0x10]);
        assert_eq!(&w[38..40], &[0, 40]);
        assert!(w[40..80].iter().all(|&b| b == 0));
        assert_eq!(&w[80..88], &[192, 168, 77, 0, 24, 0, 0, 0]);
        assert_eq!(&w[88..], &EYECATCHER_SMCR);
        assert_eq!(ClcMessage::parse(&w).unwrap(), ClcMessage::Proposal(v1_proposal()));
    }

    #[test]
    fn rfc_v1_proposal_is_52_octets_smc_clc_1() {
        let p = Proposal {
            smcd: None,
            ..v1_proposal()
        };
        let w = ClcMessage::Proposal(p.clone()).to_vec().unwrap();
        assert_eq!(w.len(), PROPOSAL_RFC_V1_LEN);
        assert_eq!(&w[38..40], &[0, 0]);
        assert_eq!(ClcMessage::parse(&w).unwrap(), ClcMessage::Proposal(p));
    }

    /// SMC-CLC-4 (E-20): the IP area is found by skipping N octets, whatever they hold.
    #[test]
    fn offset_area_is_skipped_smc_clc_4() {
        let mut w = ClcMessage::Proposal(v1_proposal()).to_vec().unwrap();
        w[40..80].fill(0xA5);
        let ClcMessage::Proposal(p) = ClcMessage::parse(&w).unwrap() else {
            panic!()
        };
        assert_eq!(p.ip.unwrap().subnet, Ipv4Addr::new(192, 168, 77, 0));
        // An odd N of 20 garbage octets (length 52 + 20 = 72).
        let mut w = vec![0u8; 72];
        w[..4].copy_from_slice(&EYECATCHER_SMCR);
        w[4] = 1;
        w[5..7].copy_from_slice(&72u16.to_be_bytes());
        w[7] = 0x10;
        w[38..40].copy_from_slice(&20u16.to_be_bytes());
        w[40..60].fill(0xEE);
        w[60..68].copy_from_slice(&[10, 1, 0, 0, 16, 0, 0, 0]);
        w[68..].copy_from_slice(&EYECATCHER_SMCR);
        let ClcMessage::Proposal(p) = ClcMessage::parse(&w).unwrap() else {
            panic!()
        };
        let ip = p.ip.unwrap();
        assert_eq!((ip.subnet, ip.prefix_len), (Ipv4Addr::new(10, 1, 0, 0), 16));
        // N pointing past the trailer.
        w[38..40].copy_from_slice(&30u16.to_be_bytes());
        assert_eq!(ClcMessage::parse(&w), Err(ClcError::BadOffset { what: "IP area" }));
    }

    #[test]
    fn ipv6_prefixes_round_trip_and_are_bounded_smc_clc_1() {
        let mut p = v1_proposal();
        let ip = p.ip.as_mut().unwrap();
        ip.subnet = Ipv4Addr::UNSPECIFIED;
        ip.prefix_len = 0;
        ip.ipv6 = (0..8)
            .map(|i| (Ipv6Addr::new(0xfd00, i, 0, 0, 0, 0, 0, 0), 64))
            .collect();
        let w = ClcMessage::Proposal(p.clone()).to_vec().unwrap();
        assert_eq!(w.len(), 92 + 8 * 17);
        assert_eq!(ClcMessage::parse(&w).unwrap(), ClcMessage::Proposal(p.clone()));
        let mut bad = w.clone();
        bad[87] = 9;
        assert_eq!(ClcMessage::parse(&bad), Err(ClcError::TooManyPrefixes(9)));
        p.ip.as_mut().unwrap().ipv6.push((Ipv6Addr::LOCALHOST, 128));
        assert!(ClcMessage::Proposal(p).to_vec().is_err());
    }

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

    /// SMC-CLC-1: Accept/Confirm v1 must be 68; Decline 28 unless version >= 2.
    #[test]
    fn lengths_per_type_and_version_smc_clc_1() {
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
        let w = ClcMessage::Decline(Decline::new(PeerId::default(), Diagnosis::MEM, false))
            .to_vec()
            .unwrap();
        let mut b = w.clone();
        b[21..24].fill(0x55);
        assert_eq!(ClcMessage::parse(&b).unwrap(), ClcMessage::parse(&w).unwrap());
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

    /// SMC-FC-1 / E-4: subnet = address & mask, and matching needs the same prefix length.
    #[test]
    fn subnet_matching_e_4() {
        let a = IpArea::ipv4(Ipv4Addr::new(192, 168, 77, 3), 24);
        assert_eq!(a.subnet, Ipv4Addr::new(192, 168, 77, 0));
        assert!(a.same_subnet(Ipv4Addr::new(192, 168, 77, 2), 24));
        assert!(!a.same_subnet(Ipv4Addr::new(192, 168, 78, 2), 24));
        assert!(!a.same_subnet(Ipv4Addr::new(192, 168, 77, 2), 16));
        assert!(IpArea::ipv4(Ipv4Addr::new(10, 0, 0, 1), 0).same_subnet(Ipv4Addr::new(11, 0, 0, 1), 0));
    }

    fn arb_v2ext() -> impl Strategy<Value = V2Extension> {
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

    fn arb_ip() -> impl Strategy<Value = IpArea> {
        (
            any::<u32>(),
            any::<u8>(),
            proptest::collection::vec((any::<u128>(), any::<u8>()), 0..=8),
        )
            .prop_map(|(s, l, v6)| IpArea {
                subnet: Ipv4Addr::from(s),
                prefix_len: l,
                ipv6: v6.into_iter().map(|(a, l)| (Ipv6Addr::from(a), l)).collect(),
            })
    }

    fn arb_proposal() -> impl Strategy<Value = Proposal> {
        (
            any::<bool>(),
            any::<([u8; 8], [u8; 16], [u8; 6])>(),
            proptest::option::of(arb_ip()),
            proptest::option::of(arb_v2ext()),
            any::<(u64, u16, [u8; 3], [u8; 5])>(),
        )
            .prop_map(|(rfc, (pid, gid, mac), ip, ext, (g, c, o, x))| {
                let smcd = SmcdArea {
                    ism_gid: g,
                    chid: c,
                    vendor_oui: o,
                    vendor_exp_options: x,
                };
                match ext {
                    Some(ext) => Proposal {
                        eyecatcher: Eyecatcher::Smcr,
                        version: 2,
                        typev2: SmcType::R,
                        typev1: if ip.is_some() { SmcType::R } else { SmcType::None },
                        peer_id: PeerId(pid),
                        gid,
                        mac,
                        smcd: Some(smcd),
                        ip,
                        v2_ext: Some(ext),
                    },
                    None => Proposal {
                        smcd: if rfc { None } else { Some(smcd) },
                        ip: Some(ip.unwrap_or(IpArea {
                            subnet: Ipv4Addr::UNSPECIFIED,
                            prefix_len: 0,
                            ipv6: vec![],
                        })),
                        ..Proposal::v1_linux(PeerId(pid), gid, mac, IpArea::ipv4(Ipv4Addr::UNSPECIFIED, 0))
                    },
                }
            })
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
        /// Emit → parse is the identity for every representable message.
        #[test]
        fn proposal_round_trip_smc_clc_1(p in arb_proposal()) {
            let m = ClcMessage::Proposal(p);
            let w = m.to_vec().unwrap();
            prop_assert_eq!(frame_len(&w).unwrap(), Some(w.len()));
            prop_assert_eq!(ClcMessage::parse(&w).unwrap(), m);
        }

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

        #[test]
        fn decline_round_trip_smc_clc_1(v2 in any::<bool>(), s in any::<bool>(), code in any::<u32>(), pid in any::<[u8; 8]>()) {
            let d = if v2 { Decline::v2(PeerId(pid), Diagnosis(code), s) } else { Decline::new(PeerId(pid), Diagnosis(code), s) };
            let m = ClcMessage::Decline(d);
            prop_assert_eq!(ClcMessage::parse(&m.to_vec().unwrap()).unwrap(), m);
        }

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
