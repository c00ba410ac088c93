//! A whole RoCEv2 packet, i.e. one UDP payload to port 4791 (IBA vol. 1 ch. 9, annex A17):
//!
//! ```text
//! BTH (12) | extension headers (per opcode, see `opcode::TABLE`) | payload | pad (0..3) | ICRC (4)
//! ```
//!
//! [`Packet::parse`] checks everything that can be checked on the packet alone, from the
//! opcode table; each failure has its own [`ParseError`]. Checks that need QP state (P_Key,
//! Q_Key, PSN, opcode sequence, payload length against the path MTU, the ICRC against the IP
//! header) are the receiver's: [`super::icrc`], [`super::psn`], [`super::opcode::sequence_ok`],
//! [`super::segment::check_payload_len`].
//!
//! [`Packet::new`] builds a packet for an opcode from its table row and [`Packet::emit`]
//! writes it; [`super::icrc::seal`] then fills the ICRC once the IP and UDP headers are known.

use super::headers::{Aeth, AtomicAckEth, AtomicEth, Bth, Deth, Ieth, ImmDt, Reth};
use super::opcode::{CNP_RESERVED_LEN, HeaderSet, OpInfo, Opcode};
use super::segment::pad_count;
use super::{BufferTooSmall, ICRC_LEN, Truncated, need};

/// The extension headers of one packet; which are present is fixed by the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// The DETH (UD opcodes).
    pub deth: Option<Deth>,
    /// The RETH (RDMA WRITE FIRST/ONLY, RDMA READ REQUEST).
    pub reth: Option<Reth>,
    /// The AtomicETH (COMPARE_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEth>,
    /// The AETH (ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, RDMA READ RESPONSE FIRST/LAST/ONLY).
    pub aeth: Option<Aeth>,
    /// The AtomicAckETH (ATOMIC ACKNOWLEDGE).
    pub atomic_ack_eth: Option<AtomicAckEth>,
    /// The ImmDt ("with immediate" LAST/ONLY opcodes).
    pub imm_dt: Option<ImmDt>,
    /// The IETH (SEND LAST/ONLY with invalidate).
    pub ieth: Option<Ieth>,
}

impl ExtHeaders {
    /// The set of headers present (CNP's reserved field is implied by its opcode).
    pub fn set(&self) -> HeaderSet {
        let mut s = HeaderSet::empty();
        s.set(HeaderSet::DETH, self.deth.is_some());
        s.set(HeaderSet::RETH, self.reth.is_some());
        s.set(HeaderSet::ATOMIC_ETH, self.atomic_eth.is_some());
        s.set(HeaderSet::AETH, self.aeth.is_some());
        s.set(HeaderSet::ATOMIC_ACK_ETH, self.atomic_ack_eth.is_some());
        s.set(HeaderSet::IMM_DT, self.imm_dt.is_some());
        s.set(HeaderSet::IETH, self.ieth.is_some());
        s
    }
}

/// One parsed (or to-be-emitted) RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Packet<'a> {
    /// The Base Transport Header.
    pub bth: Bth,
    /// The extension headers the BTH opcode calls for.
    pub ext: ExtHeaders,
    /// The payload without the pad octets.
    pub payload: &'a [u8],
    /// The ICRC as the packet carries it: its four octets read little-endian, as rxe stores
    /// it (lab README, "ICRC rule").
    pub icrc: u32,
}

/// Why a UDP payload is not a well-formed RoCEv2 packet. A receiver drops such packets
/// silently (IBA vol. 1 §9.6 "packet header validation", annex A17 §A17.3.4; rxe's `hdr_check`), counting them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ParseError {
    /// Shorter than BTH + ICRC.
    #[error("{len} octets is shorter than a BTH and an ICRC (16)")]
    TooShort {
        /// Octets of the UDP payload.
        len: usize,
    },
    /// The length is not a multiple of 4: headers, payload and pad always are (§9.2, PadCnt).
    #[error("packet length {len} is not a multiple of 4")]
    Unaligned {
        /// Octets of the UDP payload.
        len: usize,
    },
    /// TVer is not 0.
    #[error("transport version {0} (only 0 is defined)")]
    TransportVersion(u8),
    /// An opcode outside the table (UC, RD, XRC, reserved or manufacturer-specific).
    #[error("opcode {0:#04x} is not supported")]
    UnknownOpcode(u8),
    /// The extension headers the opcode calls for run into the ICRC.
    #[error("{opcode:?}: {source}")]
    Truncated {
        /// The BTH opcode.
        opcode: Opcode,
        /// The header that did not fit.
        source: Truncated,
    },
    /// Octets between the headers and the ICRC of an opcode that carries no payload.
    #[error("{opcode:?} carries no payload but has {len} octets after its headers")]
    UnexpectedPayload {
        /// The BTH opcode.
        opcode: Opcode,
        /// Octets between the headers and the ICRC.
        len: usize,
    },
    /// The pad count exceeds the octets after the headers.
    #[error("pad count {pad} exceeds the {available} octets after the headers")]
    PadCount {
        /// The BTH PadCnt.
        pad: u8,
        /// Octets between the headers and the ICRC.
        available: usize,
    },
}

/// Why a packet cannot be built or emitted (a local bug, never peer input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum EmitError {
    /// The BTH opcode is not in the opcode table.
    #[error("opcode {0:#04x} is not in the opcode table")]
    UnknownOpcode(u8),
    /// The extension headers given are not the opcode's.
    #[error("{opcode:?} needs headers {expected:?}, got {given:?}")]
    Headers {
        /// The BTH opcode.
        opcode: Opcode,
        /// The extension headers the opcode calls for.
        expected: HeaderSet,
        /// The extension headers given.
        given: HeaderSet,
    },
    /// A payload given for an opcode that carries none.
    #[error("{opcode:?} carries no payload, got {len} octets")]
    UnexpectedPayload {
        /// The BTH opcode.
        opcode: Opcode,
        /// Octets of payload given.
        len: usize,
    },
    /// The emit buffer is too small for the packet.
    #[error(transparent)]
    BufferTooSmall(#[from] BufferTooSmall),
}

impl<'a> Packet<'a> {
    /// Parse one UDP payload. The ICRC is read, not checked: that needs the IP and UDP
    /// headers ([`super::icrc::verify`]). The data path's opcodes (BTH alone or with one
    /// ImmDt, RETH or AETH) go through [`super::lean::parse`], the rest (and every malformed
    /// packet, for its typed error) through [`Packet::parse_generic`]: the same result.
    #[inline]
    pub fn parse(udp_payload: &'a [u8]) -> Result<Packet<'a>, ParseError> {
        match super::lean::parse(udp_payload) {
            Some(p) => Ok(p),
            None => Self::parse_generic(udp_payload),
        }
    }

    /// [`Packet::parse`] by the opcode table alone, for every opcode.
    pub fn parse_generic(udp_payload: &'a [u8]) -> Result<Packet<'a>, ParseError> {
        let len = udp_payload.len();
        if len < Bth::LEN + ICRC_LEN {
            return Err(ParseError::TooShort { len });
        }
        if !len.is_multiple_of(4) {
            return Err(ParseError::Unaligned { len });
        }
        let (body, icrc) = udp_payload.split_at(len - ICRC_LEN);
        let icrc = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]);
        let (bth, mut rest) = Bth::parse(body).map_err(|_| ParseError::TooShort { len })?;
        if bth.tver != 0 {
            return Err(ParseError::TransportVersion(bth.tver));
        }
        let opcode = bth.opcode;
        let info = opcode.info().ok_or(ParseError::UnknownOpcode(opcode.0))?;
        let h = info.headers;
        let mut ext = ExtHeaders::default();
        let tr = |source| ParseError::Truncated { opcode, source };
        // IBA header order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
        if h.contains(HeaderSet::DETH) {
            let (v, r) = Deth::parse(rest).map_err(tr)?;
            (ext.deth, rest) = (Some(v), r);
        }
        if h.contains(HeaderSet::RETH) {
            let (v, r) = Reth::parse(rest).map_err(tr)?;
            (ext.reth, rest) = (Some(v), r);
        }
        if h.contains(HeaderSet::ATOMIC_ETH) {
            let (v, r) = AtomicEth::parse(rest).map_err(tr)?;
            (ext.atomic_eth, rest) = (Some(v), r);
        }
        if h.contains(HeaderSet::AETH) {
            let (v, r) = Aeth::parse(rest).map_err(tr)?;
            (ext.aeth, rest) = (Some(v), r);
        }
        if h.contains(HeaderSet::ATOMIC_ACK_ETH) {
            let (v, r) = AtomicAckEth::parse(rest).map_err(tr)?;
            (ext.atomic_ack_eth, rest) = (Some(v), r);
        }
        if h.contains(HeaderSet::IMM_DT) {
            let (v, r) = ImmDt::parse(rest).map_err(tr)?;
            (ext.imm_dt, rest) = (Some(v), r);
        }
        if h.contains(HeaderSet::IETH) {
            let (v, r) = Ieth::parse(rest).map_err(tr)?;
            (ext.ieth, rest) = (Some(v), r);
        }
        if h.contains(HeaderSet::CNP_RESERVED) {
            if rest.len() < CNP_RESERVED_LEN {
                return Err(tr(Truncated {
                    what: "CNP reserved field",
                    need: CNP_RESERVED_LEN,
                    have: rest.len(),
                }));
            }
            // Reserved: ignored on receive, written as 0.
            rest = &rest[CNP_RESERVED_LEN..];
        }
        if !info.payload && !rest.is_empty() {
            return Err(ParseError::UnexpectedPayload {
                opcode,
                len: rest.len(),
            });
        }
        let pad = usize::from(bth.pad_count);
        if pad > rest.len() {
            return Err(ParseError::PadCount {
                pad: bth.pad_count,
                available: rest.len(),
            });
        }
        Ok(Packet {
            bth,
            ext,
            payload: &rest[..rest.len() - pad],
            icrc,
        })
    }

    /// A packet for `bth.opcode` with these headers and payload, checked against the opcode
    /// table; the BTH pad count is set from the payload length and the ICRC left 0 (fill it
    /// with [`super::icrc::seal`] after emitting).
    pub fn new(mut bth: Bth, ext: ExtHeaders, payload: &'a [u8]) -> Result<Packet<'a>, EmitError> {
        bth.pad_count = pad_count(payload.len());
        let p = Packet {
            bth,
            ext,
            payload,
            icrc: 0,
        };
        p.check()?;
        Ok(p)
    }

    /// The opcode's table row (`None` only for a hand-made packet with an unknown opcode).
    pub fn info(&self) -> Option<&'static OpInfo> {
        self.bth.opcode.info()
    }

    fn check(&self) -> Result<&'static OpInfo, EmitError> {
        let opcode = self.bth.opcode;
        let info = opcode.info().ok_or(EmitError::UnknownOpcode(opcode.0))?;
        let expected = info.headers - HeaderSet::CNP_RESERVED;
        let given = self.ext.set();
        if expected != given {
            return Err(EmitError::Headers {
                opcode,
                expected,
                given,
            });
        }
        if !info.payload && !self.payload.is_empty() {
            return Err(EmitError::UnexpectedPayload {
                opcode,
                len: self.payload.len(),
            });
        }
        Ok(info)
    }

    /// Octets of the whole UDP payload: headers, payload, pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        let headers = self.bth.opcode.info().map_or(Bth::LEN, OpInfo::header_len);
        headers + self.payload.len() + usize::from(pad_count(self.payload.len())) + ICRC_LEN
    }

    /// Write the packet into `buf` and return its length. The BTH pad count is written as
    /// the payload needs it (so a parsed packet re-emits to the same octets; pad octets and
    /// reserved CNP octets are written as 0), the ICRC field as [`Packet::icrc`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let total = self.buffer_len();
        need(buf.len(), total)?;
        let pad = pad_count(self.payload.len());
        let mut at = self.emit_header(buf, self.payload.len())?;
        buf[at..at + self.payload.len()].copy_from_slice(self.payload);
        at += self.payload.len();
        buf[at..at + usize::from(pad)].fill(0);
        at += usize::from(pad);
        buf[at..at + ICRC_LEN].copy_from_slice(&self.icrc.to_le_bytes());
        Ok(at + ICRC_LEN)
    }

    /// Writes only the headers (BTH through the last extension header) of a packet whose
    /// payload of `payload_len` octets goes elsewhere (the engine sends it from the
    /// registered memory, an iovec of its own); the BTH pad count is that payload's. The
    /// packet's own [`Packet::payload`] must be empty or `payload_len` long. Returns the
    /// header length ([`OpInfo::header_len`]). The data path's opcodes are written by
    /// [`super::lean::emit_header`], the rest (and every error) by
    /// [`Packet::emit_header_generic`]: the same octets.
    #[inline]
    pub fn emit_header(&self, buf: &mut [u8], payload_len: usize) -> Result<usize, EmitError> {
        match super::lean::emit_header(self, buf, payload_len) {
            Some(n) => Ok(n),
            None => self.emit_header_generic(buf, payload_len),
        }
    }

    /// [`Packet::emit_header`] by the opcode table alone, for every opcode.
    pub fn emit_header_generic(&self, buf: &mut [u8], payload_len: usize) -> Result<usize, EmitError> {
        let info = self.check()?;
        if !info.payload && payload_len != 0 {
            return Err(EmitError::UnexpectedPayload {
                opcode: self.bth.opcode,
                len: payload_len,
            });
        }
        need(buf.len(), info.header_len())?;
        let pad = pad_count(payload_len);
        let bth = Bth {
            pad_count: pad,
            ..self.bth
        };
        let mut at = bth.emit(buf)?;
        let e = &self.ext;
        if let Some(h) = e.deth {
            at += h.emit(&mut buf[at..])?;
        }
        if let Some(h) = e.reth {
            at += h.emit(&mut buf[at..])?;
        }
        if let Some(h) = e.atomic_eth {
            at += h.emit(&mut buf[at..])?;
        }
        if let Some(h) = e.aeth {
            at += h.emit(&mut buf[at..])?;
        }
        if let Some(h) = e.atomic_ack_eth {
            at += h.emit(&mut buf[at..])?;
        }
        if let Some(h) = e.imm_dt {
            at += h.emit(&mut buf[at..])?;
        }
        if let Some(h) = e.ieth {
            at += h.emit(&mut buf[at..])?;
        }
        if info.headers.contains(HeaderSet::CNP_RESERVED) {
            buf[at..at + CNP_RESERVED_LEN].fill(0);
            at += CNP_RESERVED_LEN;
        }
        debug_assert_eq!(at, info.header_len());
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::headers::{NakCode, Syndrome};
    use crate::wire::opcode::TABLE;
    use crate::wire::psn::Psn;
    use proptest::prelude::*;

    /// Lab capture frame 12 (`testdata/host-br0-roce-cm.pcap`): the probe's RDMA READ
    /// RESPONSE ONLY, AETH ACK MSN 1, 37 octets of data and 3 pad octets.
    const READ_RESP: &str = "1030ffff000000140\
        07c85411f00000172646d612d70696e672d303a20686f737420707974686f6e206f76657220526f4345763200000000\
        4b9896eb";

    #[test]
    fn read_response_with_pad_c3() {
        let b = hex::decode(READ_RESP.replace(' ', "")).unwrap();
        let p = Packet::parse(&b).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
        assert_eq!(p.bth.pad_count, 3);
        assert_eq!(p.bth.dest_qp, 0x14);
        assert_eq!(p.bth.psn, Psn::new(0x7c8541));
        assert_eq!(
            p.ext.aeth,
            Some(Aeth {
                syndrome: Syndrome::ACK,
                msn: 1
            })
        );
        assert_eq!(p.payload, b"rdma-ping-0: host python over RoCEv2\0");
        assert_eq!(p.icrc, 0xeb96984b);
        assert_eq!(p.buffer_len(), b.len());
        let mut out = vec![0xa5; b.len()];
        assert_eq!(p.emit(&mut out), Ok(b.len()));
        assert_eq!(out, b);
    }

    fn ack(psn: u32) -> Vec<u8> {
        let mut bth = Bth::new(Opcode::RC_ACKNOWLEDGE, 0x11, Psn::new(psn));
        bth.ack_req = false;
        let ext = ExtHeaders {
            aeth: Some(Aeth {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: 7,
            }),
            ..Default::default()
        };
        let p = Packet::new(bth, ext, &[]).unwrap();
        let mut b = vec![0; p.buffer_len()];
        p.emit(&mut b).unwrap();
        b
    }

    #[test]
    fn malformed_packets_have_typed_errors() {
        let good = ack(5);
        assert_eq!(good.len(), 20);
        assert!(Packet::parse(&good).is_ok());
        assert_eq!(Packet::parse(&good[..12]), Err(ParseError::TooShort { len: 12 }));
        assert_eq!(Packet::parse(&good[..19]), Err(ParseError::Unaligned { len: 19 }));
        // AETH cut off: only BTH + ICRC
        assert!(matches!(
            Packet::parse(&good[..16]),
            Err(ParseError::Truncated {
                opcode: Opcode::RC_ACKNOWLEDGE,
                ..
            })
        ));
        let mut b = good.clone();
        b[1] = 0x01; // TVer 1
        assert_eq!(Packet::parse(&b), Err(ParseError::TransportVersion(1)));
        b = good.clone();
        b[0] = 0x15;
        assert_eq!(Packet::parse(&b), Err(ParseError::UnknownOpcode(0x15)));
        b = good.clone();
        b.splice(16..16, [1, 2, 3, 4]); // 4 octets of "payload" on an ACK
        assert_eq!(
            Packet::parse(&b),
            Err(ParseError::UnexpectedPayload {
                opcode: Opcode::RC_ACKNOWLEDGE,
                len: 4
            })
        );
        // a SEND ONLY with an empty payload and pad count 2
        let p = Packet::new(
            Bth::new(Opcode::RC_SEND_ONLY, 1, Psn::new(0)),
            ExtHeaders::default(),
            &[],
        )
        .unwrap();
        let mut b = vec![0; p.buffer_len()];
        p.emit(&mut b).unwrap();
        assert_eq!(Packet::parse(&b).unwrap().payload, &[] as &[u8]);
        b[1] |= 0x20;
        assert_eq!(Packet::parse(&b), Err(ParseError::PadCount { pad: 2, available: 0 }));
    }

    #[test]
    fn builder_checks_the_table() {
        let bth = Bth::new(Opcode::RC_RDMA_WRITE_FIRST, 0x11, Psn::new(1));
        let err = Packet::new(bth, ExtHeaders::default(), b"x").unwrap_err();
        assert_eq!(
            err,
            EmitError::Headers {
                opcode: Opcode::RC_RDMA_WRITE_FIRST,
                expected: HeaderSet::RETH,
                given: HeaderSet::empty()
            }
        );
        let bth = Bth::new(Opcode::RC_RDMA_READ_REQUEST, 0x11, Psn::new(1));
        let ext = ExtHeaders {
            reth: Some(Reth::default()),
            ..Default::default()
        };
        assert_eq!(
            Packet::new(bth, ext, b"x").unwrap_err(),
            EmitError::UnexpectedPayload {
                opcode: Opcode::RC_RDMA_READ_REQUEST,
                len: 1
            }
        );
        let p = Packet::new(bth, ext, &[]).unwrap();
        assert_eq!(
            p.emit(&mut [0; 31]),
            Err(EmitError::BufferTooSmall(BufferTooSmall { need: 32, have: 31 }))
        );
        assert_eq!(
            Packet::new(Bth::new(Opcode(0x15), 1, Psn::new(0)), ExtHeaders::default(), &[]),
            Err(EmitError::UnknownOpcode(0x15))
        );
    }

    #[test]
    fn cnp_layout() {
        let bth = Bth::new(Opcode::CNP, 0x42, Psn::new(0));
        let p = Packet::new(bth, ExtHeaders::default(), &[]).unwrap();
        assert_eq!(p.buffer_len(), 12 + 16 + 4);
        let mut b = vec![0xa5; 32];
        p.emit(&mut b).unwrap();
        assert_eq!(&b[12..28], &[0; 16]);
        assert_eq!(Packet::parse(&b).unwrap(), p);
    }

    /// Arbitrary headers for a table row.
    fn ext_for(info: &'static OpInfo) -> impl Strategy<Value = ExtHeaders> {
        let h = info.headers;
        (
            any::<(u32, u8, u32)>(),
            any::<(u64, u32, u32)>(),
            any::<(u64, u32, u64, u64)>(),
            any::<(u8, u32)>(),
            any::<(u64, u32, u32)>(),
        )
            .prop_map(move |(d, r, a, ae, (orig, imm, rkey))| ExtHeaders {
                deth: h.contains(HeaderSet::DETH).then_some(Deth {
                    q_key: d.0,
                    resv8: d.1,
                    src_qp: d.2 & 0xff_ffff,
                }),
                reth: h.contains(HeaderSet::RETH).then_some(Reth {
                    va: r.0,
                    r_key: r.1,
                    dma_len: r.2,
                }),
                atomic_eth: h.contains(HeaderSet::ATOMIC_ETH).then_some(AtomicEth {
                    va: a.0,
                    r_key: a.1,
                    swap_add_data: a.2,
                    compare_data: a.3,
                }),
                aeth: h.contains(HeaderSet::AETH).then_some(Aeth {
                    syndrome: Syndrome::from(ae.0),
                    msn: ae.1 & 0xff_ffff,
                }),
                atomic_ack_eth: h
                    .contains(HeaderSet::ATOMIC_ACK_ETH)
                    .then_some(AtomicAckEth { orig_rem_dt: orig }),
                imm_dt: h.contains(HeaderSet::IMM_DT).then_some(ImmDt { imm }),
                ieth: h.contains(HeaderSet::IETH).then_some(Ieth { r_key: rkey }),
            })
    }

    fn arb_packet() -> impl Strategy<Value = (Bth, ExtHeaders, Vec<u8>)> {
        (0..TABLE.len(), any::<(bool, u16, u32, bool, u32)>()).prop_flat_map(|(i, (se, p_key, qp, a, psn))| {
            let info = &TABLE[i];
            let mut bth = Bth::new(info.opcode, qp, Psn::new(psn));
            (bth.se, bth.p_key, bth.ack_req) = (se, p_key, a);
            let max = if info.payload { 300 } else { 0 };
            (
                Just(bth),
                ext_for(info),
                proptest::collection::vec(any::<u8>(), 0..=max),
            )
        })
    }

    proptest! {
        /// C3: every opcode of the table builds, emits and parses back to the same packet,
        /// and re-emits to the same octets.
        #[test]
        fn every_opcode_round_trips((bth, ext, payload) in arb_packet(), icrc in any::<u32>()) {
            let mut p = Packet::new(bth, ext, &payload).unwrap();
            p.icrc = icrc;
            let mut b = vec![0; p.buffer_len()];
            prop_assert_eq!(p.emit(&mut b), Ok(b.len()));
            prop_assert_eq!(b.len() % 4, 0);
            let q = Packet::parse(&b).unwrap();
            prop_assert_eq!(q, p);
            let mut again = vec![0; q.buffer_len()];
            q.emit(&mut again).unwrap();
            prop_assert_eq!(again, b);
        }

        /// Any octets: parse never panics, and whatever parses re-emits to a packet that
        /// parses the same.
        #[test]
        fn arbitrary_octets_never_panic(b in proptest::collection::vec(any::<u8>(), 0..96)) {
            if let Ok(p) = Packet::parse(&b) {
                let mut out = vec![0; p.buffer_len()];
                prop_assert_eq!(p.emit(&mut out), Ok(out.len()));
                prop_assert_eq!(Packet::parse(&out).unwrap(), p);
            }
        }
    }
}
