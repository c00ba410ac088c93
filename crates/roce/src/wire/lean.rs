//! A parser and a header emitter specialised for the packets that carry the data path (issue
//! 13): the RC opcodes whose extension headers are none, one ImmDt, one RETH or one AETH
//! (Send FIRST/MIDDLE/LAST/ONLY and with immediate, RDMA Write FIRST/MIDDLE/LAST/ONLY and
//! LAST with immediate, RDMA Read request and responses, ACK).
//!
//! They produce exactly what the generic, table-driven [`Packet::parse_generic`] and
//! [`Packet::emit_header_generic`] produce for those opcodes, or decline (`None`): on any
//! other opcode, and on every input the generic code rejects (short, unaligned, TVer not
//! 0, truncated header, payload on an ACK, pad count past the payload, headers that are not
//! the opcode's, a buffer too small), so that the generic code gives the typed error. The
//! generic code handles everything they decline. [`Packet::parse`] and
//! [`Packet::emit_header`] try them first. Equality is tested byte for byte against the
//! generic pair (the tests below, `tests/wire_golden.rs`, and the `roce_packet` fuzz target).
//!
//! What they save per packet (callgrind, issue 13 session 17): the opcode table look-up, the
//! seven optional-header tests, and a bounds check per header; the table's row for each
//! opcode they cover is asserted equal to their own class in `lean_classes_match_the_table`.

use super::headers::{Aeth, Bth, Reth, Syndrome};
use super::packet::{ExtHeaders, Packet};
use super::segment::pad_count;
use super::{ICRC_LEN, ImmDt, Opcode, be};

/// The headers after the BTH of an opcode the lean pair covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Not covered: the generic code handles it.
    None,
    /// BTH only, with payload.
    Bth,
    /// BTH + ImmDt, with payload.
    Imm,
    /// BTH + RETH, with payload (Write FIRST/ONLY).
    Reth,
    /// BTH + RETH, no payload (Read request).
    RethNoPayload,
    /// BTH + AETH, with payload (Read response FIRST/LAST/ONLY).
    Aeth,
    /// BTH + AETH, no payload (ACK).
    AethNoPayload,
}

impl Class {
    /// Octets of extension headers after the BTH.
    const fn ext_len(self) -> usize {
        match self {
            Class::None | Class::Bth => 0,
            Class::Imm | Class::Aeth | Class::AethNoPayload => 4,
            Class::Reth | Class::RethNoPayload => Reth::LEN,
        }
    }

    const fn payload(self) -> bool {
        !matches!(self, Class::RethNoPayload | Class::AethNoPayload | Class::None)
    }
}

/// The class of each opcode (indexed by its octet).
const CLASSES: [Class; 256] = {
    let mut t = [Class::None; 256];
    t[Opcode::RC_SEND_FIRST.0 as usize] = Class::Bth;
    t[Opcode::RC_SEND_MIDDLE.0 as usize] = Class::Bth;
    t[Opcode::RC_SEND_LAST.0 as usize] = Class::Bth;
    t[Opcode::RC_SEND_LAST_WITH_IMMEDIATE.0 as usize] = Class::Imm;
    t[Opcode::RC_SEND_ONLY.0 as usize] = Class::Bth;
    t[Opcode::RC_SEND_ONLY_WITH_IMMEDIATE.0 as usize] = Class::Imm;
    t[Opcode::RC_RDMA_WRITE_FIRST.0 as usize] = Class::Reth;
    t[Opcode::RC_RDMA_WRITE_MIDDLE.0 as usize] = Class::Bth;
    t[Opcode::RC_RDMA_WRITE_LAST.0 as usize] = Class::Bth;
    t[Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE.0 as usize] = Class::Imm;
    t[Opcode::RC_RDMA_WRITE_ONLY.0 as usize] = Class::Reth;
    t[Opcode::RC_RDMA_READ_REQUEST.0 as usize] = Class::RethNoPayload;
    t[Opcode::RC_RDMA_READ_RESPONSE_FIRST.0 as usize] = Class::Aeth;
    t[Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.0 as usize] = Class::Bth;
    t[Opcode::RC_RDMA_READ_RESPONSE_LAST.0 as usize] = Class::Aeth;
    t[Opcode::RC_RDMA_READ_RESPONSE_ONLY.0 as usize] = Class::Aeth;
    t[Opcode::RC_ACKNOWLEDGE.0 as usize] = Class::AethNoPayload;
    t
};

/// The lean class of `opcode`.
#[inline]
pub(crate) fn class(opcode: Opcode) -> Class {
    CLASSES[usize::from(opcode.0)]
}

/// [`Packet::parse_generic`] for the covered opcodes; `None` for anything else and for
/// every input the generic parser rejects.
#[inline]
pub fn parse(b: &[u8]) -> Option<Packet<'_>> {
    let len = b.len();
    if len < Bth::LEN + ICRC_LEN || !len.is_multiple_of(4) {
        return None;
    }
    let c = class(Opcode(b[0]));
    // TVer must be 0.
    if c == Class::None || b[1] & 0x0f != 0 {
        return None;
    }
    let hdr = Bth::LEN + c.ext_len();
    let body = len - ICRC_LEN;
    if hdr > body {
        return None;
    }
    let after = body - hdr;
    let pad = usize::from((b[1] >> 4) & 0x3);
    if (!c.payload() && after != 0) || pad > after {
        return None;
    }
    // TVer was checked 0 above.
    let bth = Bth::from_octets(b);
    let mut ext = ExtHeaders::default();
    match c {
        Class::Imm => ext.imm_dt = Some(ImmDt { imm: be::u32_at(b, 12) }),
        Class::Reth | Class::RethNoPayload => {
            ext.reth = Some(Reth {
                va: be::u64_at(b, 12),
                r_key: be::u32_at(b, 20),
                dma_len: be::u32_at(b, 24),
            })
        }
        Class::Aeth | Class::AethNoPayload => {
            ext.aeth = Some(Aeth {
                syndrome: Syndrome::from(b[12]),
                msn: be::u24_at(b, 13),
            })
        }
        Class::None | Class::Bth => {}
    }
    Some(Packet {
        bth,
        ext,
        payload: &b[hdr..body - pad],
        icrc: u32::from_le_bytes([b[body], b[body + 1], b[body + 2], b[body + 3]]),
    })
}

/// [`Packet::emit_header_generic`] for the covered opcodes: writes the headers of `p` for a
/// payload of `payload_len` octets and returns their length; `None` (nothing written) for
/// anything else and wherever the generic emitter returns an error.
#[inline]
pub fn emit_header(p: &Packet<'_>, buf: &mut [u8], payload_len: usize) -> Option<usize> {
    let c = class(p.bth.opcode);
    let e = &p.ext;
    if c == Class::None || e.deth.is_some() || e.atomic_eth.is_some() || e.atomic_ack_eth.is_some() || e.ieth.is_some()
    {
        return None;
    }
    let headers_ok = match c {
        Class::Bth => e.reth.is_none() && e.aeth.is_none() && e.imm_dt.is_none(),
        Class::Imm => e.reth.is_none() && e.aeth.is_none() && e.imm_dt.is_some(),
        Class::Reth | Class::RethNoPayload => e.reth.is_some() && e.aeth.is_none() && e.imm_dt.is_none(),
        Class::Aeth | Class::AethNoPayload => e.reth.is_none() && e.aeth.is_some() && e.imm_dt.is_none(),
        Class::None => false,
    };
    if !headers_ok || (!c.payload() && (payload_len != 0 || !p.payload.is_empty())) {
        return None;
    }
    let hdr = Bth::LEN + c.ext_len();
    let buf = buf.get_mut(..hdr)?;
    let h = &p.bth;
    let qpn = h.dest_qp.to_be_bytes();
    let psn = h.psn.value().to_be_bytes();
    let p_key = h.p_key.to_be_bytes();
    let bth: [u8; Bth::LEN] = [
        h.opcode.0,
        (u8::from(h.se) << 7) | (u8::from(h.m) << 6) | (pad_count(payload_len) << 4) | (h.tver & 0x0f),
        p_key[0],
        p_key[1],
        (u8::from(h.fecn) << 7) | (u8::from(h.becn) << 6) | (h.resv6a & 0x3f),
        qpn[1],
        qpn[2],
        qpn[3],
        (u8::from(h.ack_req) << 7) | (h.resv7 & 0x7f),
        psn[1],
        psn[2],
        psn[3],
    ];
    buf[..Bth::LEN].copy_from_slice(&bth);
    let x = &mut buf[Bth::LEN..];
    match (e.reth, e.aeth, e.imm_dt) {
        (Some(r), _, _) => {
            be::put_u64(x, 0, r.va);
            be::put_u32(x, 8, r.r_key);
            be::put_u32(x, 12, r.dma_len);
        }
        (_, Some(a), _) => {
            x[0] = u8::from(a.syndrome);
            be::put_u24(x, 1, a.msn & 0x00ff_ffff);
        }
        (_, _, Some(i)) => be::put_u32(x, 0, i.imm),
        _ => {}
    }
    Some(hdr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::headers::{AtomicAckEth, AtomicEth, Deth, Ieth};
    use crate::wire::opcode::HeaderSet;
    use crate::wire::psn::Psn;
    use proptest::prelude::*;

    /// C3: the class of every opcode the lean pair covers is the opcode table's row
    /// (headers and payload), and every opcode outside the table is not covered.
    #[test]
    fn lean_classes_match_the_table_c3() {
        for op in 0..=255u8 {
            let c = class(Opcode(op));
            let Some(info) = Opcode(op).info() else {
                assert_eq!(c, Class::None, "{op:#04x}");
                continue;
            };
            let want = match (info.headers, info.payload) {
                (h, true) if h == HeaderSet::empty() => Some(Class::Bth),
                (h, true) if h == HeaderSet::IMM_DT => Some(Class::Imm),
                (h, true) if h == HeaderSet::RETH => Some(Class::Reth),
                (h, false) if h == HeaderSet::RETH => Some(Class::RethNoPayload),
                (h, true) if h == HeaderSet::AETH => Some(Class::Aeth),
                (h, false) if h == HeaderSet::AETH => Some(Class::AethNoPayload),
                _ => None,
            };
            if c != Class::None {
                assert_eq!(Some(c), want, "{:?}", info.opcode);
                assert_eq!(Bth::LEN + c.ext_len(), info.header_len(), "{:?}", info.opcode);
            }
        }
        // Every RC data-path opcode the engine sends on a Send, Write or ACK is covered.
        for op in [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x11] {
            assert_ne!(class(Opcode(op)), Class::None, "{op:#04x}");
        }
    }

    fn arb_ext() -> impl Strategy<Value = ExtHeaders> {
        (
            any::<[bool; 7]>(),
            any::<(u64, u32, u32)>(),
            any::<(u8, u32)>(),
            any::<u32>(),
            any::<(u32, u32, u64)>(),
        )
            .prop_map(|(on, r, a, imm, (q, rk, v))| ExtHeaders {
                deth: on[0].then_some(Deth {
                    q_key: q,
                    resv8: 0,
                    src_qp: q & 0xff_ffff,
                }),
                reth: on[1].then_some(Reth {
                    va: r.0,
                    r_key: r.1,
                    dma_len: r.2,
                }),
                atomic_eth: on[2].then_some(AtomicEth {
                    va: v,
                    r_key: rk,
                    swap_add_data: v ^ 1,
                    compare_data: v,
                }),
                aeth: on[3].then_some(Aeth {
                    syndrome: Syndrome::from(a.0),
                    msn: a.1,
                }),
                atomic_ack_eth: on[4].then_some(AtomicAckEth { orig_rem_dt: v }),
                imm_dt: on[5].then_some(ImmDt { imm }),
                ieth: on[6].then_some(Ieth { r_key: rk }),
            })
    }

    /// The headers the opcode calls for, from arbitrary values (the common case of the
    /// engine's emitters).
    fn ext_of(op: Opcode, x: ExtHeaders) -> ExtHeaders {
        let h = op.info().map_or(HeaderSet::empty(), |i| i.headers);
        let r = x.reth.unwrap_or(Reth {
            va: 7,
            r_key: 8,
            dma_len: 9,
        });
        ExtHeaders {
            reth: h.contains(HeaderSet::RETH).then_some(r),
            aeth: h.contains(HeaderSet::AETH).then_some(x.aeth.unwrap_or(Aeth {
                syndrome: Syndrome::ACK,
                msn: 3,
            })),
            imm_dt: h
                .contains(HeaderSet::IMM_DT)
                .then_some(x.imm_dt.unwrap_or(ImmDt { imm: 5 })),
            ..ExtHeaders::default()
        }
    }

    fn arb_bth() -> impl Strategy<Value = Bth> {
        (
            prop_oneof![0u8..=0x18, any::<u8>()],
            any::<(bool, bool, u8, u8, u16)>(),
            any::<(bool, bool, u8, u32, bool, u8, u32)>(),
        )
            .prop_map(
                |(op, (se, m, pad, tver, p_key), (fecn, becn, r6, qp, a, r7, psn))| Bth {
                    opcode: Opcode(op),
                    se,
                    m,
                    pad_count: pad,
                    // Mostly 0: the engine's, and the only version that parses.
                    tver: if tver < 200 { 0 } else { tver },
                    p_key,
                    fecn,
                    becn,
                    resv6a: r6,
                    dest_qp: qp,
                    ack_req: a,
                    resv7: r7,
                    psn: Psn::new(psn),
                },
            )
    }

    proptest! {
        /// C3: for random headers (the opcode's own, or any set), payload lengths, packet
        /// payloads and buffer sizes, `emit_header` (lean first) returns what
        /// `emit_header_generic` returns and writes the same octets; the lean emitter
        /// answers for every well-formed header of a covered opcode.
        #[test]
        fn lean_emit_equals_the_generic_one_c3(
            bth in arb_bth(),
            x in arb_ext(),
            own in any::<bool>(),
            payload_len in prop_oneof![0usize..8, 0usize..5000],
            own_payload in any::<bool>(),
            room in prop_oneof![Just(48usize), 0usize..48],
        ) {
            let ext = if own { ext_of(bth.opcode, x) } else { x };
            let pl = vec![0xabu8; payload_len];
            let p = Packet { bth, ext, payload: if own_payload { &pl } else { &[] }, icrc: 0 };
            let mut a = vec![0x5au8; room];
            let mut g = vec![0x5au8; room];
            let lean = emit_header(&p, &mut a, payload_len);
            let generic = p.emit_header_generic(&mut g, payload_len);
            if let Some(n) = lean {
                prop_assert_eq!(Ok(n), generic);
                prop_assert_eq!(&a, &g);
            } else {
                prop_assert!(a.iter().all(|&b| b == 0x5a), "the lean emitter wrote and declined");
                let covered = class(bth.opcode) != Class::None;
                if own && covered && room >= 48 && (class(bth.opcode).payload() || (payload_len == 0 && !own_payload)) {
                    prop_assert!(false, "declined a well-formed {:?}", bth.opcode);
                }
            }
            let mut b = vec![0x5au8; room];
            prop_assert_eq!(p.emit_header(&mut b, payload_len), generic);
            prop_assert_eq!(&b, &g);
        }

        /// C3: for any octets (mostly well-formed packets of the covered opcodes, sometimes
        /// damaged), `Packet::parse` (lean first) equals `Packet::parse_generic`, errors
        /// included, and the lean parser answers for every well-formed packet it covers.
        #[test]
        fn lean_parse_equals_the_generic_one_c3(
            bth in arb_bth(),
            x in arb_ext(),
            payload in proptest::collection::vec(any::<u8>(), 0..80),
            icrc in any::<u32>(),
            damage in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let ext = ext_of(bth.opcode, x);
            let mut b = vec![0u8; 200];
            let payload = if bth.opcode.info().is_some_and(|i| i.payload) { &payload[..] } else { &[] };
            let p = Packet { bth, ext, payload, icrc };
            let Ok(n) = p.emit(&mut b) else { return Ok(()); };
            b.truncate(n);
            let well_formed = damage.is_none() && cut.is_none() && bth.tver & 0x0f == 0;
            if let Some((i, v)) = damage { let i = i.index(b.len()); b[i] = v; }
            if let Some(i) = cut { b.truncate(i.index(b.len() + 1)); }
            let generic = Packet::parse_generic(&b);
            prop_assert_eq!(Packet::parse(&b), generic);
            match parse(&b) {
                Some(l) => prop_assert_eq!(Ok(l), generic),
                None => prop_assert!(!(well_formed && class(bth.opcode) != Class::None),
                    "declined a well-formed {:?}", bth.opcode),
            }
        }

        /// Any octets at all: the lean parser never answers differently from the generic one.
        #[test]
        fn lean_parse_of_arbitrary_octets_c3(b in proptest::collection::vec(any::<u8>(), 0..64), op in 0u8..0x12) {
            let mut b = b;
            if let Some(x) = b.first_mut() { *x = op; }
            if let Some(l) = parse(&b) {
                prop_assert_eq!(Ok(l), Packet::parse_generic(&b));
            }
            prop_assert_eq!(Packet::parse(&b), Packet::parse_generic(&b));
        }
    }
}
