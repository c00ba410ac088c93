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
//!
//! # Modules (all items are re-exported here, so `smc::wire::llc::X` is the path to use)
//! - `header`: the common header ([`LLC_LEN`], [`FLAG_REPLY`], the [`opcode`]s),
//!   [`classify`] and [`Class`], [`LlcVersion`].
//! - `link`: [`ConfirmLink`], [`DeleteLink`], [`TestLink`] (A.3.1, A.3.4, A.3.8).
//! - `add_link`: [`AddLink`] with Linux's [`AddLinkV2Ext`], [`AddLinkCont`], Linux's
//!   [`RequestAddLink`], and the [`RtokenPair`] (A.3.2, A.3.3, E-1, E-21).
//! - `rkey`: [`ConfirmRkey`], [`ConfirmRkeyCont`], [`DeleteRkey`] and the [`LinkRtoken`]
//!   (A.3.5–A.3.7, E-2, E-3).
//! - `error`: [`LlcError`] (peer input) and [`LlcEmitError`] (local values).
//!
//! Each message family parses its body from the whole message (`parse_body`) and writes it
//! into a zeroed one (`emit_body`, returning its flag bits); [`LlcMessage`] does the header,
//! the reply flag and the v2 octets past the known layout.

mod add_link;
mod error;
mod header;
mod link;
mod rkey;

pub use add_link::{AddLink, AddLinkCont, AddLinkV2Ext, RequestAddLink, RtokenPair, add_link_reject};
pub use error::{LlcEmitError, LlcError};
pub use header::{Class, FLAG_REPLY, LLC_LEN, LLC_V2_MAX_LEN, LlcVersion, classify, opcode};
pub use link::{CONFIRM_LINK_NO_RMBE_EYECATCHER, ConfirmLink, DeleteLink, TestLink, delete_reason};
pub use rkey::{ConfirmRkey, ConfirmRkeyCont, DeleteRkey, LinkRtoken};

use header::{Header, known};

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

    /// Where the body's own layout ends (at least 44): the octets past it are a v2
    /// message's `ext`.
    fn known_len(&self, version: LlcVersion) -> usize {
        match self {
            Self::AddLink(a) => LLC_LEN + a.ext_len(),
            Self::DeleteRkey(d) => d.known_len(version),
            Self::RequestAddLink(r) => r.known_len(),
            _ => LLC_LEN,
        }
    }

    /// The body of a message whose header is `h`; `b` is the whole message.
    fn parse(h: &Header, b: &[u8]) -> Result<Self, LlcError> {
        Ok(match h.op {
            opcode::CONFIRM_LINK => Self::ConfirmLink(ConfirmLink::parse_body(h, b)?),
            opcode::ADD_LINK => Self::AddLink(AddLink::parse_body(h, b)?),
            opcode::ADD_LINK_CONT => Self::AddLinkCont(AddLinkCont::parse_body(h, b)?),
            opcode::DELETE_LINK => Self::DeleteLink(DeleteLink::parse_body(h, b)?),
            opcode::CONFIRM_RKEY => Self::ConfirmRkey(ConfirmRkey::parse_body(h, b)?),
            opcode::CONFIRM_RKEY_CONT => Self::ConfirmRkeyCont(ConfirmRkeyCont::parse_body(h, b)?),
            opcode::DELETE_RKEY => Self::DeleteRkey(DeleteRkey::parse_body(h, b)?),
            opcode::TEST_LINK => Self::TestLink(TestLink::parse_body(h, b)?),
            opcode::REQ_ADD_LINK => Self::RequestAddLink(RequestAddLink::parse_body(h, b)?),
            _ => return Err(LlcError::UnknownMandatory(b[0])),
        })
    }

    /// Writes the body into the zeroed message `b`; returns its flag bits (octet 3).
    fn emit(&self, version: LlcVersion, b: &mut [u8]) -> Result<u8, LlcEmitError> {
        match self {
            Self::ConfirmLink(c) => c.emit_body(version, b),
            Self::AddLink(a) => a.emit_body(version, b),
            Self::AddLinkCont(c) => c.emit_body(version, b),
            Self::DeleteLink(d) => d.emit_body(version, b),
            Self::RequestAddLink(r) => r.emit_body(version, b),
            Self::ConfirmRkey(c) => c.emit_body(version, b),
            Self::ConfirmRkeyCont(c) => c.emit_body(version, b),
            Self::DeleteRkey(d) => d.emit_body(version, b),
            Self::TestLink(t) => t.emit_body(version, b),
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
        let h = Header::parse(buf)?;
        let b = &buf[..h.len];
        let body = LlcBody::parse(&h, b)?;
        let ext = b[body.known_len(h.version)..].to_vec();
        Ok(Self {
            version: h.version,
            reply: h.reply(),
            body,
            ext,
        })
    }

    /// The emitted length.
    pub fn wire_len(&self) -> usize {
        self.body.known_len(self.version) + self.ext.len()
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
        Header::emit_type_len(b, self.version, op);
        let flags = self.body.emit(self.version, b)?;
        if matches!(self.body, LlcBody::AddLink(AddLink { v2_ext: None, .. })) && !self.ext.is_empty() {
            return Err(LlcEmitError::Unrepresentable(
                "octets past 44 in ADD LINK are its v2 extension",
            ));
        }
        b[3] = flags | if self.reply { FLAG_REPLY } else { 0 };
        b[len - self.ext.len()..].copy_from_slice(&self.ext);
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

#[cfg(test)]
mod tests;
