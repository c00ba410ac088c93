//! LLC messages (RFC 7609 §3.3, A.3) in v1 and Linux's v2 form.
//!
//! # API note
//! [`classify`] the first octet of a received SEND (LLC, CDC, unknown optional → discard,
//! unknown mandatory → protocol error, A1.8); [`LlcMessage::parse`] a received SEND payload;
//! [`LlcMessage::emit`] / [`LlcMessage::to_vec`] build one. Every message carries its
//! [`LlcVersion`] and its reply flag.
//!
//! # Forms
//! v1: always 44 octets: type, length 44, a reserved octet (ADD LINK: reject reason in the
//! low nibble), flags (`0x80` = reply), body. Linux's SMC-Rv2 form (lab capture
//! `smc-r-2vm-612-br0.pcap`, frames 11–17 and 80–85): the type octet carries version 2 in
//! its high nibble (`0x21` CONFIRM LINK, `0x22` ADD LINK, `0x24` DELETE LINK, `0x26`
//! CONFIRM RKEY, `0x27` TEST LINK, `0x29` DELETE RKEY), octets 1–2 are a 16-bit length
//! **in the sender's host byte order** (Linux's `length_v2` is a plain `u16`; x86 sends
//! `2c 00` for 44, `58 00` for 88 — we read and write little-endian, as captured), so the
//! ADD LINK reject reason has no room in v2. A v2 ADD LINK may be longer than 44: Linux
//! appends its v2 extension (v2-direct flag, the client's target GID, and the RToken pairs
//! of every RMB, with a count that is again a host-order `u16`). Other v2 messages we know
//! are 44 octets; octets past 44 in them are kept as `ext` and emitted back.
//!
//! # Errata decisions (requirements part E)
//! - E-1: ADD LINK uses Linux's layout (2 reserved octets after the MAC: GID at 12, QPN 28,
//!   link number 31, MTU 32, PSN 33); the RFC Figure-32 layout is a known-divergence test.
//! - E-2: CONFIRM RKEY CONTINUATION holds three 13-octet link specs at 5, 18, 31.
//! - E-3: CONFIRM RKEY's NumTkns counts the other links' tokens in total; this message
//!   carries min(NumTkns, 2) of them and a CONTINUATION follows iff NumTkns > 2.
//! - E-10: "no such link" in DELETE LINK is reason 0x00100000.
//! - E-21: only ADD LINK CONTINUATION carries RToken pairs, the reference being an RKey.
//!
//! Requirements: smcr-ipoibcm.md A1.8, A2.6 (invalid LLC), C5, E; peers file §5.3.13.

/// Length of every v1 LLC message (and the minimum of a v2 one).
pub const LLC_LEN: usize = 44;
/// Largest v2 LLC message we parse (Linux's v2 buffer is 8 KiB).
pub const LLC_V2_MAX_LEN: usize = 8192;
/// Reply flag (octet 3).
pub const FLAG_REPLY: u8 = 0x80;

/// CONFIRM LINK flag bits Linux sets to say "no RMBE eyecatchers" (C5, E-6).
pub const CONFIRM_LINK_NO_RMBE_EYECATCHER: u8 = 0x03;

/// LLC opcodes (A1.8; v2 = 0x20 | opcode).
#[allow(missing_docs)]
pub mod opcode {
    pub const CONFIRM_LINK: u8 = 0x01;
    pub const ADD_LINK: u8 = 0x02;
    pub const ADD_LINK_CONT: u8 = 0x03;
    pub const DELETE_LINK: u8 = 0x04;
    /// Linux SMC-Rv2 only (0x25): the client asks the server to add a link.
    pub const REQ_ADD_LINK: u8 = 0x05;
    pub const CONFIRM_RKEY: u8 = 0x06;
    pub const TEST_LINK: u8 = 0x07;
    pub const CONFIRM_RKEY_CONT: u8 = 0x08;
    pub const DELETE_RKEY: u8 = 0x09;
    pub const CDC: u8 = 0xFE;
}

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

/// ADD LINK reject reasons (v1, octet 2 low nibble).
#[allow(missing_docs)]
pub mod add_link_reject {
    pub const NO_ALTERNATE_PATH: u8 = 1;
    pub const INVALID_MTU: u8 = 2;
}

/// What a received SEND's first octet says (A1.8 opcode classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A known LLC message.
    Llc,
    /// A CDC message (0xFE).
    Cdc,
    /// Unknown optional LLC (0x80–0xBF): silently discard.
    UnknownOptional,
    /// Unknown mandatory (0x00–0x7F) or unknown 0xC0–0xFF: protocol error.
    UnknownMandatory,
}

/// Classifies a SEND by its first octet.
pub fn classify(first: u8) -> Class {
    if first == opcode::CDC {
        return Class::Cdc;
    }
    if known(first).is_some() {
        return Class::Llc;
    }
    if first & 0xC0 == 0x80 {
        Class::UnknownOptional
    } else {
        Class::UnknownMandatory
    }
}

fn known(t: u8) -> Option<(LlcVersion, u8)> {
    use opcode::*;
    let (v, op) = if t & 0xF0 == 0x20 {
        (LlcVersion::V2, t & 0x0F)
    } else {
        (LlcVersion::V1, t)
    };
    let ok = match v {
        LlcVersion::V1 => matches!(
            op,
            CONFIRM_LINK
                | ADD_LINK
                | ADD_LINK_CONT
                | DELETE_LINK
                | CONFIRM_RKEY
                | TEST_LINK
                | CONFIRM_RKEY_CONT
                | DELETE_RKEY
        ),
        LlcVersion::V2 => matches!(
            op,
            CONFIRM_LINK | ADD_LINK | DELETE_LINK | REQ_ADD_LINK | CONFIRM_RKEY | TEST_LINK | DELETE_RKEY
        ),
    };
    ok.then_some((v, op))
}

/// LLC message format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LlcVersion {
    /// RFC 7609 (44 octets, length in one octet).
    #[default]
    V1,
    /// Linux SMC-Rv2.
    V2,
}

/// A malformed or unknown LLC message (peer input; A2.6: protocol error, the link is
/// treated as down — except [`LlcError::UnknownOptional`], which is discarded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlcError {
    /// Fewer octets than the length says or than 44.
    #[error("LLC message needs {need} octets, {have} present")]
    Truncated {
        /// Octets needed.
        need: usize,
        /// Octets present.
        have: usize,
    },
    /// The length field is wrong for the version (v1: not 44; v2: below 44 or too long).
    #[error("LLC length {0} invalid")]
    BadLength(usize),
    /// A CDC message (0xFE), not LLC.
    #[error("a CDC message, not LLC")]
    Cdc,
    /// Unknown optional opcode: discard silently.
    #[error("unknown optional LLC opcode {0:#04x}")]
    UnknownOptional(u8),
    /// Unknown mandatory opcode: protocol error.
    #[error("unknown LLC opcode {0:#04x}")]
    UnknownMandatory(u8),
    /// A count field out of range.
    #[error("LLC {what} count {count} out of range")]
    BadCount {
        /// The field.
        what: &'static str,
        /// Its value.
        count: usize,
    },
}

/// An LLC message could not be emitted (local bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlcEmitError {
    /// Buffer too small.
    #[error("LLC emit needs {need} octets, buffer has {have}")]
    BufferTooSmall {
        /// Octets needed.
        need: usize,
        /// Buffer length.
        have: usize,
    },
    /// A value does not fit the format.
    #[error("LLC emit: {0}")]
    Unrepresentable(&'static str),
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

/// REQUEST ADD LINK (Linux SMC-Rv2 only, type 0x25: 20 reserved octets, GID count, 3
/// reserved, the client's GIDs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RequestAddLink {
    /// The requester's RoCEv2 GIDs.
    pub gids: Vec<[u8; 16]>,
}

/// TEST LINK (A.3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TestLink {
    /// User data (a reply echoes it).
    pub user_data: [u8; 16],
}

/// The body of an LLC message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LlcBody {
    /// CONFIRM LINK.
    ConfirmLink(ConfirmLink),
    /// ADD LINK.
    AddLink(AddLink),
    /// ADD LINK CONTINUATION.
    AddLinkCont(AddLinkCont),
    /// DELETE LINK.
    DeleteLink(DeleteLink),
    /// REQUEST ADD LINK (v2 only).
    RequestAddLink(RequestAddLink),
    /// CONFIRM RKEY.
    ConfirmRkey(ConfirmRkey),
    /// CONFIRM RKEY CONTINUATION.
    ConfirmRkeyCont(ConfirmRkeyCont),
    /// DELETE RKEY.
    DeleteRkey(DeleteRkey),
    /// TEST LINK.
    TestLink(TestLink),
}

impl LlcBody {
    /// The v1 opcode.
    pub fn opcode(&self) -> u8 {
        match self {
            Self::ConfirmLink(_) => opcode::CONFIRM_LINK,
            Self::AddLink(_) => opcode::ADD_LINK,
            Self::AddLinkCont(_) => opcode::ADD_LINK_CONT,
            Self::DeleteLink(_) => opcode::DELETE_LINK,
            Self::RequestAddLink(_) => opcode::REQ_ADD_LINK,
            Self::ConfirmRkey(_) => opcode::CONFIRM_RKEY,
            Self::ConfirmRkeyCont(_) => opcode::CONFIRM_RKEY_CONT,
            Self::DeleteRkey(_) => opcode::DELETE_RKEY,
            Self::TestLink(_) => opcode::TEST_LINK,
        }
    }
}

/// One LLC message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LlcMessage {
    /// Format version.
    pub version: LlcVersion,
    /// R: reply.
    pub reply: bool,
    /// The body.
    pub body: LlcBody,
    /// v2: octets past the known layout (kept for byte-exact re-emission).
    pub ext: Vec<u8>,
}

impl LlcMessage {
    /// A v1 request.
    pub fn request(body: LlcBody) -> Self {
        Self {
            version: LlcVersion::V1,
            reply: false,
            body,
            ext: Vec::new(),
        }
    }

    /// The same message as a reply.
    pub fn into_reply(mut self) -> Self {
        self.reply = true;
        self
    }

    /// Parses a SEND payload. `buf` may be longer than the message (a receive buffer): v1
    /// reads 44 octets, v2 as many as its length field says.
    pub fn parse(buf: &[u8]) -> Result<Self, LlcError> {
        let Some(&t) = buf.first() else {
            return Err(LlcError::Truncated { need: LLC_LEN, have: 0 });
        };
        let (version, op) = match classify(t) {
            Class::Llc => known(t).ok_or(LlcError::UnknownMandatory(t))?,
            Class::Cdc => return Err(LlcError::Cdc),
            Class::UnknownOptional => return Err(LlcError::UnknownOptional(t)),
            Class::UnknownMandatory => return Err(LlcError::UnknownMandatory(t)),
        };
        if buf.len() < LLC_LEN {
            return Err(LlcError::Truncated {
                need: LLC_LEN,
                have: buf.len(),
            });
        }
        let len = match version {
            LlcVersion::V1 => usize::from(buf[1]),
            LlcVersion::V2 => usize::from(u16::from_le_bytes([buf[1], buf[2]])),
        };
        if version == LlcVersion::V1 && len != LLC_LEN || !(LLC_LEN..=LLC_V2_MAX_LEN).contains(&len) {
            return Err(LlcError::BadLength(len));
        }
        if buf.len() < len {
            return Err(LlcError::Truncated {
                need: len,
                have: buf.len(),
            });
        }
        let b = &buf[..len];
        let flags = b[3];
        let mut ext = b[LLC_LEN..].to_vec();
        let body = match op {
            opcode::CONFIRM_LINK => LlcBody::ConfirmLink(ConfirmLink {
                flags: flags & !FLAG_REPLY,
                mac: arr(&b[4..10]),
                gid: arr(&b[10..26]),
                qpn: be24(&b[26..29]),
                link_num: b[29],
                link_uid: arr(&b[30..34]),
                max_links: b[34],
                max_conns: b[35],
            }),
            opcode::ADD_LINK => {
                let v2_ext = if version == LlcVersion::V2 && len > LLC_LEN {
                    let e = &b[LLC_LEN..];
                    if e.len() < 28 {
                        return Err(LlcError::Truncated {
                            need: LLC_LEN + 28,
                            have: len,
                        });
                    }
                    let n = usize::from(u16::from_le_bytes([e[26], e[27]]));
                    let need = 28 + 16 * n;
                    if e.len() < need {
                        return Err(LlcError::BadCount {
                            what: "ADD LINK v2 RToken",
                            count: n,
                        });
                    }
                    let rtokens = e[28..need].chunks_exact(16).map(rtoken_pair).collect();
                    let x = AddLinkV2Ext {
                        v2_direct: e[0] & 0x80 != 0,
                        client_target_gid: arr(&e[2..18]),
                        rtokens,
                    };
                    ext = e[need..].to_vec();
                    Some(x)
                } else {
                    None
                };
                LlcBody::AddLink(AddLink {
                    reject: flags & 0x40 != 0,
                    reject_reason: if version == LlcVersion::V1 { b[2] & 0x0F } else { 0 },
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
            opcode::ADD_LINK_CONT => {
                let n = b[5];
                let k = usize::from(n.min(2));
                LlcBody::AddLinkCont(AddLinkCont {
                    link_num: b[4],
                    num_rtokens: n,
                    pairs: b[8..8 + 16 * k].chunks_exact(16).map(rtoken_pair).collect(),
                })
            }
            opcode::DELETE_LINK => LlcBody::DeleteLink(DeleteLink {
                all: flags & 0x40 != 0,
                orderly: flags & 0x20 != 0,
                link_num: b[4],
                reason: be32(&b[5..9]),
            }),
            opcode::CONFIRM_RKEY => {
                let n = b[4];
                let k = usize::from(n.min(2));
                LlcBody::ConfirmRkey(ConfirmRkey {
                    negative: flags & 0x20 != 0,
                    retry: flags & 0x10 != 0,
                    num_tkns: n,
                    rkey: be32(&b[5..9]),
                    vaddr: be64(&b[9..17]),
                    others: b[17..17 + 13 * k].chunks_exact(13).map(link_rtoken).collect(),
                })
            }
            opcode::CONFIRM_RKEY_CONT => {
                let n = b[4];
                let k = usize::from(n.min(3));
                LlcBody::ConfirmRkeyCont(ConfirmRkeyCont {
                    negative: flags & 0x20 != 0,
                    num_tkns_left: n,
                    tokens: b[5..5 + 13 * k].chunks_exact(13).map(link_rtoken).collect(),
                })
            }
            opcode::DELETE_RKEY => {
                let n = usize::from(b[4]);
                let max = match version {
                    LlcVersion::V1 => 8,
                    LlcVersion::V2 => (len - 8) / 4,
                };
                if n == 0 || n > max {
                    return Err(LlcError::BadCount {
                        what: "DELETE RKEY",
                        count: n,
                    });
                }
                let rk_end = 8 + 4 * n;
                if version == LlcVersion::V2 {
                    ext = b[rk_end.max(LLC_LEN)..].to_vec();
                }
                LlcBody::DeleteRkey(DeleteRkey {
                    negative: flags & 0x20 != 0,
                    err_mask: b[5],
                    rkeys: b[8..rk_end].chunks_exact(4).map(be32).collect(),
                })
            }
            opcode::TEST_LINK => LlcBody::TestLink(TestLink {
                user_data: arr(&b[4..20]),
            }),
            opcode::REQ_ADD_LINK => {
                let n = usize::from(b[24]);
                let gend = 28 + 16 * n;
                if gend > len {
                    return Err(LlcError::BadCount {
                        what: "REQUEST ADD LINK GID",
                        count: n,
                    });
                }
                ext = b[gend.max(LLC_LEN)..].to_vec();
                LlcBody::RequestAddLink(RequestAddLink {
                    gids: b[28..gend].chunks_exact(16).map(arr).collect(),
                })
            }
            _ => return Err(LlcError::UnknownMandatory(t)),
        };
        Ok(Self {
            version,
            reply: flags & FLAG_REPLY != 0,
            body,
            ext,
        })
    }

    /// The emitted length.
    pub fn wire_len(&self) -> usize {
        let extra = match &self.body {
            LlcBody::AddLink(AddLink { v2_ext: Some(x), .. }) => 28 + 16 * x.rtokens.len(),
            LlcBody::DeleteRkey(d) if self.version == LlcVersion::V2 => (8 + 4 * d.rkeys.len()).saturating_sub(LLC_LEN),
            LlcBody::RequestAddLink(r) => (28 + 16 * r.gids.len()).saturating_sub(LLC_LEN),
            _ => 0,
        };
        LLC_LEN + extra + self.ext.len()
    }

    /// Emits the message; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, LlcEmitError> {
        let v2 = self.version == LlcVersion::V2;
        let op = self.body.opcode();
        if v2 && known(0x20 | op).is_none() {
            return Err(LlcEmitError::Unrepresentable("no v2 form of this message"));
        }
        if !v2 && !self.ext.is_empty() {
            return Err(LlcEmitError::Unrepresentable("v1 messages are exactly 44 octets"));
        }
        let len = self.wire_len();
        if len > LLC_V2_MAX_LEN {
            return Err(LlcEmitError::Unrepresentable("longer than the v2 maximum"));
        }
        let have = buf.len();
        let b = buf
            .get_mut(..len)
            .ok_or(LlcEmitError::BufferTooSmall { need: len, have })?;
        b.fill(0);
        b[0] = if v2 { 0x20 | op } else { op };
        if v2 {
            b[1..3].copy_from_slice(&(len as u16).to_le_bytes());
        } else {
            b[1] = LLC_LEN as u8;
        }
        let mut flags = if self.reply { FLAG_REPLY } else { 0 };
        let mut ext_at = LLC_LEN;
        match &self.body {
            LlcBody::ConfirmLink(c) => {
                check24(c.qpn)?;
                flags |= c.flags & !FLAG_REPLY;
                b[4..10].copy_from_slice(&c.mac);
                b[10..26].copy_from_slice(&c.gid);
                b[26..29].copy_from_slice(&c.qpn.to_be_bytes()[1..]);
                b[29] = c.link_num;
                b[30..34].copy_from_slice(&c.link_uid);
                b[34] = c.max_links;
                b[35] = c.max_conns;
            }
            LlcBody::AddLink(a) => {
                check24(a.qpn)?;
                check24(a.psn)?;
                if a.qp_mtu > 15 || a.reject_reason > 15 || (v2 && a.reject_reason != 0) {
                    return Err(LlcEmitError::Unrepresentable(
                        "ADD LINK nibble (v2 has no reject reason)",
                    ));
                }
                if a.v2_ext.is_some() && !v2 {
                    return Err(LlcEmitError::Unrepresentable("ADD LINK v2 extension in v1"));
                }
                if a.v2_ext.is_none() && !self.ext.is_empty() {
                    return Err(LlcEmitError::Unrepresentable(
                        "octets past 44 in ADD LINK are its v2 extension",
                    ));
                }
                if !v2 {
                    b[2] = a.reject_reason;
                }
                if a.reject {
                    flags |= 0x40;
                }
                b[4..10].copy_from_slice(&a.mac);
                b[12..28].copy_from_slice(&a.gid);
                b[28..31].copy_from_slice(&a.qpn.to_be_bytes()[1..]);
                b[31] = a.link_num;
                b[32] = a.qp_mtu;
                b[33..36].copy_from_slice(&a.psn.to_be_bytes()[1..]);
                b[36] = a.init_credits;
                if let Some(x) = &a.v2_ext {
                    let n = u16::try_from(x.rtokens.len()).map_err(|_| LlcEmitError::Unrepresentable("RTokens"))?;
                    let e = &mut b[LLC_LEN..];
                    e[0] = if x.v2_direct { 0x80 } else { 0 };
                    e[2..18].copy_from_slice(&x.client_target_gid);
                    e[26..28].copy_from_slice(&n.to_le_bytes());
                    for (i, r) in x.rtokens.iter().enumerate() {
                        put_rtoken_pair(&mut e[28 + 16 * i..44 + 16 * i], r);
                    }
                    ext_at = LLC_LEN + 28 + 16 * x.rtokens.len();
                }
            }
            LlcBody::AddLinkCont(c) => {
                if c.pairs.len() != usize::from(c.num_rtokens.min(2)) {
                    return Err(LlcEmitError::Unrepresentable(
                        "ADD LINK CONT carries min(NumRTokens, 2) pairs",
                    ));
                }
                b[4] = c.link_num;
                b[5] = c.num_rtokens;
                for (i, r) in c.pairs.iter().enumerate() {
                    put_rtoken_pair(&mut b[8 + 16 * i..24 + 16 * i], r);
                }
            }
            LlcBody::DeleteLink(d) => {
                if d.all {
                    flags |= 0x40;
                }
                if d.orderly {
                    flags |= 0x20;
                }
                b[4] = d.link_num;
                b[5..9].copy_from_slice(&d.reason.to_be_bytes());
            }
            LlcBody::ConfirmRkey(c) => {
                if c.others.len() != usize::from(c.num_tkns.min(2)) {
                    return Err(LlcEmitError::Unrepresentable(
                        "CONFIRM RKEY carries min(NumTkns, 2) tokens (E-3)",
                    ));
                }
                if c.negative {
                    flags |= 0x20;
                }
                if c.retry {
                    flags |= 0x10;
                }
                b[4] = c.num_tkns;
                b[5..9].copy_from_slice(&c.rkey.to_be_bytes());
                b[9..17].copy_from_slice(&c.vaddr.to_be_bytes());
                for (i, t) in c.others.iter().enumerate() {
                    put_link_rtoken(&mut b[17 + 13 * i..30 + 13 * i], t);
                }
            }
            LlcBody::ConfirmRkeyCont(c) => {
                if c.tokens.len() != usize::from(c.num_tkns_left.min(3)) {
                    return Err(LlcEmitError::Unrepresentable(
                        "CONFIRM RKEY CONT carries min(left, 3) tokens (E-2)",
                    ));
                }
                if c.negative {
                    flags |= 0x20;
                }
                b[4] = c.num_tkns_left;
                for (i, t) in c.tokens.iter().enumerate() {
                    put_link_rtoken(&mut b[5 + 13 * i..18 + 13 * i], t);
                }
            }
            LlcBody::DeleteRkey(d) => {
                let max = if v2 { 255 } else { 8 };
                if d.rkeys.is_empty() || d.rkeys.len() > max {
                    return Err(LlcEmitError::Unrepresentable(
                        "DELETE RKEY lists 1..=8 RKeys (v2: 1..=255)",
                    ));
                }
                if d.negative {
                    flags |= 0x20;
                }
                b[4] = d.rkeys.len() as u8;
                b[5] = d.err_mask;
                for (i, k) in d.rkeys.iter().enumerate() {
                    b[8 + 4 * i..12 + 4 * i].copy_from_slice(&k.to_be_bytes());
                }
                ext_at = (8 + 4 * d.rkeys.len()).max(LLC_LEN);
            }
            LlcBody::TestLink(t) => b[4..20].copy_from_slice(&t.user_data),
            LlcBody::RequestAddLink(r) => {
                if !v2 || r.gids.len() > 255 {
                    return Err(LlcEmitError::Unrepresentable(
                        "REQUEST ADD LINK is v2 only, at most 255 GIDs",
                    ));
                }
                b[24] = r.gids.len() as u8;
                for (i, g) in r.gids.iter().enumerate() {
                    b[28 + 16 * i..44 + 16 * i].copy_from_slice(g);
                }
                ext_at = (28 + 16 * r.gids.len()).max(LLC_LEN);
            }
        }
        b[3] = flags;
        b[ext_at..ext_at + self.ext.len()].copy_from_slice(&self.ext);
        Ok(len)
    }

    /// The message's octets.
    pub fn to_vec(&self) -> Result<Vec<u8>, LlcEmitError> {
        let mut v = vec![0; self.wire_len()];
        let n = self.emit(&mut v)?;
        v.truncate(n);
        Ok(v)
    }
}

fn check24(v: u32) -> Result<(), LlcEmitError> {
    if v > 0xff_ffff {
        Err(LlcEmitError::Unrepresentable("24-bit field above 2^24"))
    } else {
        Ok(())
    }
}

fn rtoken_pair(c: &[u8]) -> RtokenPair {
    RtokenPair {
        ref_rkey: be32(&c[0..4]),
        new_rkey: be32(&c[4..8]),
        new_vaddr: be64(&c[8..16]),
    }
}

fn put_rtoken_pair(b: &mut [u8], r: &RtokenPair) {
    b[0..4].copy_from_slice(&r.ref_rkey.to_be_bytes());
    b[4..8].copy_from_slice(&r.new_rkey.to_be_bytes());
    b[8..16].copy_from_slice(&r.new_vaddr.to_be_bytes());
}

fn link_rtoken(c: &[u8]) -> LinkRtoken {
    LinkRtoken {
        link_num: c[0],
        rkey: be32(&c[1..5]),
        vaddr: be64(&c[5..13]),
    }
}

fn put_link_rtoken(b: &mut [u8], t: &LinkRtoken) {
    b[0] = t.link_num;
    b[1..5].copy_from_slice(&t.rkey.to_be_bytes());
    b[5..13].copy_from_slice(&t.vaddr.to_be_bytes());
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}
fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(arr(b))
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(arr(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classes_a1_8() {
        assert_eq!(classify(0x01), Class::Llc);
        assert_eq!(classify(0x21), Class::Llc);
        assert_eq!(classify(0xFE), Class::Cdc);
        assert_eq!(classify(0x05), Class::UnknownMandatory, "0x05 is unused in v1");
        assert_eq!(classify(0x25), Class::Llc, "v2 REQUEST ADD LINK");
        assert_eq!(classify(0x23), Class::UnknownMandatory, "no v2 ADD LINK CONT");
        assert_eq!(classify(0x45), Class::UnknownMandatory);
        assert_eq!(classify(0x85), Class::UnknownOptional);
        assert_eq!(classify(0xC1), Class::UnknownMandatory);
        let mut b = [0u8; 44];
        b[0] = 0x85;
        assert_eq!(LlcMessage::parse(&b), Err(LlcError::UnknownOptional(0x85)));
        b[0] = 0x05;
        assert_eq!(LlcMessage::parse(&b), Err(LlcError::UnknownMandatory(0x05)));
        b[0] = 0xFE;
        assert_eq!(LlcMessage::parse(&b), Err(LlcError::Cdc));
    }

    /// SMC-INV-11: wrong length, short buffers, bad counts are typed errors.
    #[test]
    fn malformed_is_typed_smc_inv_11() {
        let m = LlcMessage::request(LlcBody::TestLink(TestLink { user_data: [7; 16] }));
        let w = m.to_vec().unwrap();
        assert_eq!(w.len(), 44);
        assert_eq!(LlcMessage::parse(&w).unwrap(), m);
        let mut b = w.clone();
        b[1] = 43;
        assert_eq!(LlcMessage::parse(&b), Err(LlcError::BadLength(43)));
        assert!(matches!(LlcMessage::parse(&w[..43]), Err(LlcError::Truncated { .. })));
        assert!(LlcMessage::parse(&[]).is_err());
        // A v2 length beyond the buffer.
        let mut b = w.clone();
        b[0] = 0x27;
        b[1..3].copy_from_slice(&100u16.to_le_bytes());
        assert_eq!(LlcMessage::parse(&b), Err(LlcError::Truncated { need: 100, have: 44 }));
        // DELETE RKEY count 0 and 9.
        for n in [0u8, 9] {
            let mut b = [0u8; 44];
            b[0] = 0x09;
            b[1] = 44;
            b[4] = n;
            assert!(matches!(LlcMessage::parse(&b), Err(LlcError::BadCount { .. })));
        }
        // A receive buffer longer than the v1 message is fine.
        let mut big = w.clone();
        big.extend_from_slice(&[0xAA; 4]);
        assert_eq!(LlcMessage::parse(&big).unwrap(), m);
    }

    /// E-1: the RFC Figure-32 ADD LINK layout (GID right after the MAC) is not what we read:
    /// parsed with the Linux layout its GID is shifted by two octets (known divergence).
    #[test]
    fn add_link_rfc_layout_is_a_known_divergence_e_1() {
        let gid: [u8; 16] = core::array::from_fn(|i| 0x10 + i as u8);
        let mut rfc = [0u8; 44];
        rfc[0] = 0x02;
        rfc[1] = 44;
        rfc[4..10].copy_from_slice(&[2; 6]);
        rfc[10..26].copy_from_slice(&gid);
        rfc[26..29].copy_from_slice(&[0, 0, 0x42]);
        rfc[29] = 2;
        let LlcBody::AddLink(a) = LlcMessage::parse(&rfc).unwrap().body else {
            panic!()
        };
        assert_ne!(a.gid, gid);
        assert_eq!(&a.gid[..14], &gid[2..]);
        // Our layout: GID at 12, QPN 28, link 31, MTU 32, PSN 33.
        let ours = LlcMessage::request(LlcBody::AddLink(AddLink {
            gid,
            qpn: 0x42,
            link_num: 2,
            qp_mtu: 3,
            psn: 0xabcdef,
            ..AddLink::default()
        }))
        .to_vec()
        .unwrap();
        assert_eq!(&ours[12..28], &gid);
        assert_eq!(&ours[28..36], &[0, 0, 0x42, 2, 3, 0xab, 0xcd, 0xef]);
    }

    /// SMC-INV-2: an ADD LINK reject reply with reason 2 (invalid MTU) in v1.
    #[test]
    fn add_link_reject_reason_smc_inv_2() {
        let m = LlcMessage::request(LlcBody::AddLink(AddLink {
            reject: true,
            reject_reason: add_link_reject::INVALID_MTU,
            ..AddLink::default()
        }))
        .into_reply();
        let w = m.to_vec().unwrap();
        assert_eq!((w[2], w[3]), (0x02, 0xC0));
        assert_eq!(LlcMessage::parse(&w).unwrap(), m);
    }

    /// E-2 / E-3: token placement of CONFIRM RKEY and its CONTINUATION.
    #[test]
    fn confirm_rkey_token_layout_e_2_e_3() {
        let t = |n: u8| LinkRtoken {
            link_num: n,
            rkey: 0x1000 + u32::from(n),
            vaddr: 0x2000 + u64::from(n),
        };
        let m = LlcMessage::request(LlcBody::ConfirmRkey(ConfirmRkey {
            num_tkns: 4,
            rkey: 0xAA,
            vaddr: 0xBB,
            others: vec![t(2), t(3)],
            ..ConfirmRkey::default()
        }));
        let w = m.to_vec().unwrap();
        assert_eq!(w[4], 4);
        assert_eq!(&w[17..22], &[2, 0, 0, 0x10, 0x02]);
        assert_eq!(&w[30..35], &[3, 0, 0, 0x10, 0x03]);
        assert_eq!(w[43], 0);
        let c = LlcMessage::request(LlcBody::ConfirmRkeyCont(ConfirmRkeyCont {
            negative: false,
            num_tkns_left: 2,
            tokens: vec![t(4), t(5)],
        }));
        let w = c.to_vec().unwrap();
        assert_eq!((w[5], w[18], w[31]), (4, 5, 0));
        assert_eq!(LlcMessage::parse(&w).unwrap(), c);
    }

    fn arb_rt() -> impl Strategy<Value = RtokenPair> {
        any::<(u32, u32, u64)>().prop_map(|(a, b, c)| RtokenPair {
            ref_rkey: a,
            new_rkey: b,
            new_vaddr: c,
        })
    }
    fn arb_lt() -> impl Strategy<Value = LinkRtoken> {
        any::<(u8, u32, u64)>().prop_map(|(l, k, v)| LinkRtoken {
            link_num: l,
            rkey: k,
            vaddr: v,
        })
    }

    fn arb_body(v2: bool) -> impl Strategy<Value = LlcBody> {
        let cl = (
            any::<([u8; 6], [u8; 16], [u8; 4])>(),
            0u32..1 << 24,
            any::<(u8, u8, u8, u8)>(),
        )
            .prop_map(|((mac, gid, link_uid), qpn, (f, link_num, max_links, max_conns))| {
                LlcBody::ConfirmLink(ConfirmLink {
                    flags: f & 0x7f,
                    mac,
                    gid,
                    qpn,
                    link_num,
                    link_uid,
                    max_links,
                    max_conns,
                })
            });
        let al = (
            any::<(bool, [u8; 6], [u8; 16], u8, u8)>(),
            0u32..1 << 24,
            0u32..1 << 24,
            0u8..16,
            0u8..16,
            proptest::option::of((any::<(bool, [u8; 16])>(), proptest::collection::vec(arb_rt(), 0..5))),
        )
            .prop_map(
                move |((reject, mac, gid, link_num, init_credits), qpn, psn, mtu, reason, x)| {
                    LlcBody::AddLink(AddLink {
                        reject,
                        reject_reason: if v2 { 0 } else { reason },
                        mac,
                        gid,
                        qpn,
                        link_num,
                        qp_mtu: mtu,
                        psn,
                        init_credits,
                        v2_ext: if v2 {
                            x.map(|((d, g), rtokens)| AddLinkV2Ext {
                                v2_direct: d,
                                client_target_gid: g,
                                rtokens,
                            })
                        } else {
                            None
                        },
                    })
                },
            );
        let alc = (any::<(u8, u8)>(), proptest::collection::vec(arb_rt(), 2)).prop_map(|((l, n), p)| {
            LlcBody::AddLinkCont(AddLinkCont {
                link_num: l,
                num_rtokens: n,
                pairs: p[..usize::from(n.min(2))].to_vec(),
            })
        });
        let dl = any::<(bool, bool, u8, u32)>().prop_map(|(all, orderly, link_num, reason)| {
            LlcBody::DeleteLink(DeleteLink {
                all,
                orderly,
                link_num,
                reason,
            })
        });
        let cr = (
            any::<(bool, bool, u8, u32, u64)>(),
            proptest::collection::vec(arb_lt(), 2),
        )
            .prop_map(|((negative, retry, n, rkey, vaddr), o)| {
                LlcBody::ConfirmRkey(ConfirmRkey {
                    negative,
                    retry,
                    num_tkns: n,
                    rkey,
                    vaddr,
                    others: o[..usize::from(n.min(2))].to_vec(),
                })
            });
        let crc = (any::<(bool, u8)>(), proptest::collection::vec(arb_lt(), 3)).prop_map(|((negative, n), t)| {
            LlcBody::ConfirmRkeyCont(ConfirmRkeyCont {
                negative,
                num_tkns_left: n,
                tokens: t[..usize::from(n.min(3))].to_vec(),
            })
        });
        let dr = (
            any::<(bool, u8)>(),
            proptest::collection::vec(any::<u32>(), 1..=if v2 { 20 } else { 8 }),
        )
            .prop_map(|((negative, err_mask), rkeys)| {
                LlcBody::DeleteRkey(DeleteRkey {
                    negative,
                    err_mask,
                    rkeys,
                })
            });
        let tl = any::<[u8; 16]>().prop_map(|user_data| LlcBody::TestLink(TestLink { user_data }));
        let ral = proptest::collection::vec(any::<[u8; 16]>(), 0..4)
            .prop_map(|gids| LlcBody::RequestAddLink(RequestAddLink { gids }));
        if v2 {
            prop_oneof![cl, al, dl, ral, cr, dr, tl].boxed()
        } else {
            prop_oneof![cl, al, alc, dl, cr, crc, dr, tl].boxed()
        }
    }

    proptest! {
        #[test]
        fn v1_round_trip_a1_8(body in arb_body(false), reply in any::<bool>()) {
            let m = LlcMessage { version: LlcVersion::V1, reply, body, ext: vec![] };
            let w = m.to_vec().unwrap();
            prop_assert_eq!(w.len(), 44);
            prop_assert_eq!(LlcMessage::parse(&w).unwrap(), m);
        }

        #[test]
        fn v2_round_trip_a1_8(body in arb_body(true), reply in any::<bool>(), ext in proptest::collection::vec(any::<u8>(), 0..8)) {
            let ext = if matches!(body, LlcBody::AddLink(AddLink { v2_ext: None, .. })) { vec![] } else { ext };
            let m = LlcMessage { version: LlcVersion::V2, reply, body, ext };
            let w = m.to_vec().unwrap();
            prop_assert_eq!(LlcMessage::parse(&w).unwrap(), m);
        }

        #[test]
        fn garbage_never_panics_smc_inv_11(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(m) = LlcMessage::parse(&b) {
                let again = m.to_vec().unwrap();
                prop_assert_eq!(LlcMessage::parse(&again).unwrap(), m);
            }
        }
    }
}
