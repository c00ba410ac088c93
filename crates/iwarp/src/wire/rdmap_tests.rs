//! Tests of `wire::rdmap`: golden control words (catalogue A.1.2), Linux siw
//! captures, RFC figure layouts for every message type, one test per
//! malformed case of catalogue A.4.2 / matrix A.4.6, proptest round trips.

use super::*;
use crate::wire::cause;
use crate::wire::ddp::golden::{self, ulpdu};
use crate::wire::terminate::{self, TermWireForm};
use proptest::prelude::*;

const ALL_OPCODES: [Opcode; 12] = [
    Opcode::Write,
    Opcode::ReadRequest,
    Opcode::ReadResponse,
    Opcode::Send,
    Opcode::SendInvalidate,
    Opcode::SendSe,
    Opcode::SendSeInvalidate,
    Opcode::Terminate,
    Opcode::ImmediateData,
    Opcode::ImmediateDataSe,
    Opcode::AtomicRequest,
    Opcode::AtomicResponse,
];

/// RDMAP-HDR-01, catalogue A.1.2 and the RFC 7306 opcodes.
#[test]
fn golden_control_words() {
    let expect: [u16; 12] = [
        0xc140, 0x4141, 0xc142, 0x4143, 0x4144, 0x4145, 0x4146, 0x4147, 0x4148, 0x4149, 0x414a, 0x414b,
    ];
    for (op, w) in ALL_OPCODES.into_iter().zip(expect) {
        assert_eq!(op.control_word(true), w, "{op:?}");
        assert_eq!(op.control_word(false), w & !0x4000, "{op:?} not last");
    }
}

#[test]
fn opcode_nibbles_round_trip() {
    for n in 0u8..16 {
        let op = Opcode::from(n);
        assert_eq!(u8::from(op), n);
        assert_eq!(op.info().is_some(), n < 0xc, "{n:#x}");
    }
    assert_eq!(Opcode::from(0xc), Opcode::Unknown(0xc));
}

/// RFC 5040 Figs. 4-5 and RFC 7306 Figs. 2-3, row by row.
#[test]
fn opcode_table() {
    let i = |op: Opcode| op.info().unwrap();
    assert!(i(Opcode::Write).tagged && i(Opcode::Write).payload && i(Opcode::Write).queue.is_none());
    assert!(i(Opcode::ReadResponse).tagged);
    assert_eq!(i(Opcode::ReadRequest).queue, Some(Queue::ReadRequest));
    assert_eq!(i(Opcode::ReadRequest).header, RdmapHeader::Fixed(28));
    assert!(!i(Opcode::ReadRequest).payload);
    for op in [
        Opcode::Send,
        Opcode::SendSe,
        Opcode::SendInvalidate,
        Opcode::SendSeInvalidate,
    ] {
        assert_eq!(i(op).queue, Some(Queue::Send));
        assert!(i(op).payload && !i(op).tagged);
        assert_eq!(
            i(op).invalidate,
            matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
        );
    }
    assert_eq!(i(Opcode::Terminate).queue, Some(Queue::Terminate));
    assert_eq!(i(Opcode::Terminate).header, RdmapHeader::Terminate);
    assert_eq!(i(Opcode::ImmediateData).header, RdmapHeader::Fixed(8));
    assert_eq!(i(Opcode::ImmediateDataSe).queue, Some(Queue::Send));
    assert_eq!(i(Opcode::AtomicRequest).queue, Some(Queue::ReadRequest));
    assert_eq!(i(Opcode::AtomicRequest).header, RdmapHeader::Fixed(52));
    assert_eq!(i(Opcode::AtomicResponse).queue, Some(Queue::AtomicResponse));
    assert_eq!(i(Opcode::AtomicResponse).header, RdmapHeader::Fixed(12));
    assert!(ALL_OPCODES[8..].iter().all(|&op| i(op).rfc7306));
    assert!(!Opcode::AtomicRequest.enabled(&Config::RFC5040));
    assert!(Opcode::AtomicRequest.enabled(&Config::RFC7306));
    assert_eq!(Queue::from_qn(3, &Config::RFC5040), None);
    assert_eq!(Queue::from_qn(3, &Config::RFC7306), Some(Queue::AtomicResponse));
}

fn parse(u: &[u8]) -> Result<Message<'_>, Error> {
    parse_ulpdu(u, &Config::RFC7306).map(|(_, m)| m)
}

/// Re-emit onto a 0xa5 buffer and compare with the original bytes.
fn assert_reemits(u: &[u8], msn: u32) {
    let m = parse(u).unwrap();
    let mut buf = vec![0xa5u8; u.len()];
    assert_eq!(m.emit(&mut buf, msn), Ok(u.len()));
    assert_eq!(buf, u);
}

/// Linux siw capture, frame 8 (RDMAP-SND-01 shape).
#[test]
fn siw_send() {
    let u = ulpdu(&golden::SIW_SEND);
    let m = parse(u).unwrap();
    assert_eq!(
        m,
        Message::Send {
            se: false,
            invalidate: None,
            payload: &u[18..]
        }
    );
    assert_eq!(m.opcode(), Opcode::Send);
    assert_reemits(u, 1);
}

/// Linux siw capture, frame 9 (RDMAP-HDR-08, RDMAP-RD-02).
#[test]
fn siw_read_request() {
    let u = ulpdu(&golden::SIW_READ_REQUEST);
    let m = parse(u).unwrap();
    assert_eq!(
        m,
        Message::ReadRequest(ReadRequest {
            sink_stag: 0x30fd_6700,
            sink_to: 0x0000_5636_971d_3530,
            size: 64,
            src_stag: 0x7e9f_1d00,
            src_to: 0x0000_561c_aea0_1b90,
        })
    );
    assert_eq!(m.buffer_len(), 46);
    assert_reemits(u, 1);
}

/// Linux siw captures, frames 10 and 13 (RDMAP-HDR-09: the Read Response
/// carries the request's SinkSTag/SinkTO).
#[test]
fn siw_read_response_and_write() {
    let rr = parse(ulpdu(&golden::SIW_READ_RESPONSE)).unwrap();
    assert_eq!(
        rr,
        Message::ReadResponse {
            stag: 0x30fd_6700,
            to: 0x0000_5636_971d_3530,
            payload: &golden::RPING_DATA
        }
    );
    assert_reemits(ulpdu(&golden::SIW_READ_RESPONSE), 0);
    let wr = parse(ulpdu(&golden::SIW_WRITE)).unwrap();
    assert_eq!(
        wr,
        Message::Write {
            stag: 0x5b01_9800,
            to: 0x0000_561c_ae9f_e530,
            payload: &golden::RPING_DATA
        }
    );
    assert_reemits(ulpdu(&golden::SIW_WRITE), 0);
}

/// Untagged ULPDU: control word, RsvdULP[8:39], QN, MSN, MO, then `rest`.
fn untagged(ctrl: u16, inv: u32, qn: u32, msn: u32, mo: u32, rest: &[u8]) -> Vec<u8> {
    let mut v = ctrl.to_be_bytes().to_vec();
    for w in [inv, qn, msn, mo] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v.extend_from_slice(rest);
    v
}

/// RDMAP-HDR-02: the STag to invalidate sits at DDP-header offset 2.
#[test]
fn rfc_send_with_invalidate_variants() {
    let u = untagged(0x4144, 0x1234_5678, 0, 9, 0, b"hi");
    assert_eq!(&u[2..6], &[0x12, 0x34, 0x56, 0x78]);
    assert_eq!(
        parse(&u).unwrap(),
        Message::Send {
            se: false,
            invalidate: Some(0x1234_5678),
            payload: b"hi"
        }
    );
    assert_reemits(&u, 9);
    let u = untagged(0x4146, 0xcafe_f00d, 0, 2, 0, b"");
    assert_eq!(
        parse(&u).unwrap(),
        Message::Send {
            se: true,
            invalidate: Some(0xcafe_f00d),
            payload: b""
        }
    );
    assert_reemits(&u, 2);
    let u = untagged(0x4145, 0, 0, 3, 0, b"x");
    assert_eq!(
        parse(&u).unwrap(),
        Message::Send {
            se: true,
            invalidate: None,
            payload: b"x"
        }
    );
    assert_reemits(&u, 3);
}

/// RDMAP-HDR-06: for Send the Invalidate STag field is ignored on receive and
/// zero on transmit. RDMAP-HDR-05: Rsv bits likewise.
#[test]
fn send_ignores_invalidate_field_and_rsv() {
    let u = untagged(0x4173, 0x0bad_5a9e, 0, 1, 0, b"ok");
    let m = parse(&u).unwrap();
    assert_eq!(
        m,
        Message::Send {
            se: false,
            invalidate: None,
            payload: b"ok"
        }
    );
    let mut out = vec![0xa5u8; u.len()];
    m.emit(&mut out, 1).unwrap();
    assert_eq!(out, untagged(0x4143, 0, 0, 1, 0, b"ok"));
}

/// RFC 7306 Appendix A.3 / Fig. 7: Immediate Data and Immediate Data with SE.
#[test]
fn rfc7306_immediate_data() {
    let data = [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];
    let u = untagged(0x4148, 0, 0, 5, 0, &data);
    assert_eq!(u.len(), 26);
    assert_eq!(
        parse(&u).unwrap(),
        Message::ImmediateData {
            se: false,
            data: 0x0123_4567_89ab_cdef
        }
    );
    assert_reemits(&u, 5);
    let u = untagged(0x4149, 0, 0, 6, 0, &data);
    assert_eq!(
        parse(&u).unwrap(),
        Message::ImmediateData {
            se: true,
            data: 0x0123_4567_89ab_cdef
        }
    );
    assert_reemits(&u, 6);
}

fn atomic_request_bytes() -> Vec<u8> {
    let mut h = vec![0x00, 0x00, 0x00, 0x02]; // Reserved | AOpCode = CmpSwap
    h.extend_from_slice(&0x0000_0007u32.to_be_bytes()); // Request Identifier
    h.extend_from_slice(&0xaabb_ccddu32.to_be_bytes()); // Remote STag
    for w in [0x1000u64, 0x1111, 0x2222, 0x3333, 0x4444] {
        h.extend_from_slice(&w.to_be_bytes());
    }
    h
}

/// RFC 7306 Fig. 4 / Appendix A.1: Atomic Request on QN 1.
#[test]
fn rfc7306_atomic_request() {
    let u = untagged(0x414a, 0, 1, 4, 0, &atomic_request_bytes());
    assert_eq!(u.len(), 70);
    let m = parse(&u).unwrap();
    assert_eq!(
        m,
        Message::AtomicRequest(AtomicRequest {
            op: AtomicOp::CmpSwap,
            request_id: 7,
            remote_stag: 0xaabb_ccdd,
            remote_to: 0x1000,
            add_swap_data: 0x1111,
            add_swap_mask: 0x2222,
            compare_data: 0x3333,
            compare_mask: 0x4444,
        })
    );
    assert_reemits(&u, 4);
    // The 28 reserved bits are ignored on receive, zero on transmit.
    let mut h = atomic_request_bytes();
    h[0] = 0xff;
    h[3] = 0xf0;
    let u = untagged(0x414a, 0, 1, 4, 0, &h);
    let Message::AtomicRequest(a) = parse(&u).unwrap() else {
        panic!()
    };
    assert_eq!(a.op, AtomicOp::FetchAdd);
    let mut out = [0xa5u8; 52];
    a.emit(&mut out).unwrap();
    assert_eq!(out[..4], [0, 0, 0, 0]);
}

/// RFC 7306 Fig. 6 / Appendix A.2: Atomic Response on QN 3, 12 octets.
#[test]
fn rfc7306_atomic_response() {
    let mut h = 7u32.to_be_bytes().to_vec();
    h.extend_from_slice(&0xdead_beef_0000_0001u64.to_be_bytes());
    let u = untagged(0x414b, 0, 3, 1, 0, &h);
    assert_eq!(u.len(), 30);
    assert_eq!(
        parse(&u).unwrap(),
        Message::AtomicResponse(AtomicResponse {
            orig_request_id: 7,
            orig_value: 0xdead_beef_0000_0001
        })
    );
    assert_reemits(&u, 1);
}

/// A Terminate travels as an RDMAP message on QN 2 (RDMAP-TRM-01).
#[test]
fn terminate_message() {
    let t = terminate::Repr::for_error(cause::RDMAP_LOCAL_CATASTROPHIC_ERR, None, None);
    let m = Message::Terminate(t);
    let mut buf = [0xa5u8; 22];
    assert_eq!(m.emit(&mut buf, 1), Ok(22));
    assert_eq!(buf[..2], [0x41, 0x47]);
    assert_eq!(buf, untagged(0x4147, 0, 2, 1, 0, &[0, 0, 0, 0])[..]);
    assert_eq!(parse(&buf).unwrap(), m);
    let mut buf2 = [0u8; 22];
    assert_eq!(t.emit_ulpdu(&mut buf2, 1), Ok(22));
    assert_eq!(buf, buf2);
}

/// Construct onto 0xa5: `emit_header` writes headers only.
#[test]
fn emit_header_leaves_payload_to_caller() {
    let m = Message::Write {
        stag: 0x5b01_9800,
        to: 0x0000_561c_ae9f_e530,
        payload: &[],
    };
    let mut buf = [0xa5u8; 20];
    assert_eq!(m.emit_header(&mut buf, 0), Ok(14));
    assert_eq!(buf[..14], ulpdu(&golden::SIW_WRITE)[..14]);
    assert_eq!(buf[14..], [0xa5; 6]);
    assert_eq!(
        m.emit_header(&mut buf[..13], 0),
        Err(BufferTooSmall { need: 14, have: 13 })
    );
}

#[test]
fn views_deconstruct_and_construct() {
    let rr = &ulpdu(&golden::SIW_READ_REQUEST)[18..];
    let p = ReadRequestPacket::new_checked(rr).unwrap();
    assert_eq!(
        (p.sink_stag(), p.rdma_rd_sz(), p.src_stag()),
        (0x30fd_6700, 64, 0x7e9f_1d00)
    );
    let mut buf = [0xa5u8; 28];
    let mut q = ReadRequestPacket::new_unchecked(&mut buf[..]);
    q.set_sink_stag(0x30fd_6700);
    q.set_sink_to(0x0000_5636_971d_3530);
    q.set_rdma_rd_sz(64);
    q.set_src_stag(0x7e9f_1d00);
    q.set_src_to(0x0000_561c_aea0_1b90);
    assert_eq!(&buf[..], rr);
    assert_eq!(
        ReadRequestPacket::new_checked(&rr[..27]).unwrap_err(),
        Truncated { need: 28, have: 27 }
    );
    let a = atomic_request_bytes();
    let p = AtomicRequestPacket::new_checked(&a[..]).unwrap();
    assert_eq!((p.aopcode(), p.request_id(), p.compare_mask()), (2, 7, 0x4444));
    assert_eq!(
        ImmediatePacket::new_checked(&[0u8; 7][..]).unwrap_err(),
        Truncated { need: 8, have: 7 }
    );
    assert_eq!(
        AtomicResponsePacket::new_checked(&[0u8; 12][..]).unwrap().orig_value(),
        0
    );
}

/// RDMAP-HDR-13: the Terminated RDMA header after `done` octets went out.
#[test]
fn read_request_advanced() {
    let r = ReadRequest {
        sink_stag: 1,
        sink_to: 100,
        size: 8192,
        src_stag: 2,
        src_to: 1000,
    };
    assert_eq!(
        r.advanced(2048),
        Some(ReadRequest {
            sink_to: 2148,
            size: 6144,
            src_to: 3048,
            ..r
        })
    );
    assert_eq!(r.advanced(8193), None);
    assert_eq!(ReadRequest { sink_to: u64::MAX, ..r }.advanced(1), None);
}

// ---- malformed cases: one per row / requirement ----

fn err(u: &[u8]) -> Error {
    parse_ulpdu(u, &Config::RFC5040).unwrap_err()
}

#[test]
fn malformed_truncated_ddp_header() {
    let e = err(&ulpdu(&golden::SIW_SEND)[..17]);
    assert_eq!(e, Error::Ddp(ddp::Error::Truncated { tagged: false, len: 17 }));
    // Issue 12 point 8: a DDP-layer code, not RDMAP 0/2/0xFF.
    assert_eq!(e.term_cause(), cause::DDP_LOCAL_CATASTROPHIC_ERR);
    assert_eq!(e.echo(), Echo::Nothing);
}

/// Matrix A.4.6 row 6 through the RDMAP entry point.
#[test]
fn malformed_bad_dv_row6() {
    let mut u = ulpdu(&golden::SIW_SEND).to_vec();
    u[0] = 0x42;
    let e = err(&u);
    assert_eq!(e.term_cause(), cause::DDP_ERR_U_INVALID_VERSION);
    assert_eq!(e.terminate(&u).ulpdu_len(), terminate::ULPDU_LEN_PLAIN);
}

/// Matrix A.4.6 row 21 (RDMAP-HDR-04): RV != 01b -> 0/2/0x05; the DDP
/// header parsed, so it is echoed (M D R = 1 1 0, the matrix's second form;
/// the engine's choice, misbehave.rs row 21).
#[test]
fn malformed_bad_rv_row21() {
    for rv in [0u8, 2, 3] {
        let mut u = ulpdu(&golden::SIW_SEND).to_vec();
        u[1] = (rv << 6) | 0x03;
        let e = err(&u);
        assert_eq!(e, Error::Version { rv });
        assert_eq!(e.term_cause(), cause::RDMAP_ERR_INVALID_VERSION);
        assert_eq!(e.echo(), Echo::DdpHeader);
        assert_eq!(e.terminate(&u).ulpdu_len(), terminate::ULPDU_LEN_UNTAGGED);
    }
}

/// Matrix A.4.6 row 22: opcodes 0x8-0xF -> 0/2/0x06 (0x8-0xB when RFC 7306
/// is not enabled, as with Linux siw).
#[test]
fn malformed_unknown_opcode_row22() {
    for raw in 0x8u8..=0xf {
        let mut u = ulpdu(&golden::SIW_SEND).to_vec();
        u[1] = 0x40 | raw;
        let e = err(&u);
        assert_eq!(e, Error::UnknownOpcode { raw });
        assert_eq!(e.term_cause(), cause::RDMAP_ERR_UNEXPECTED_OPCODE);
        assert_eq!(e.echo(), Echo::DdpHeader, "row 22: 1 1 0");
    }
}

/// Matrix A.4.6 row 24 (RDMAP-HDR-03): Write with T=0, Send with T=1.
#[test]
fn malformed_opcode_t_mismatch_row24() {
    let u = untagged(0x4140, 0, 0, 1, 0, b"data");
    assert_eq!(
        err(&u),
        Error::TaggedMismatch {
            opcode: Opcode::Write,
            tagged: false
        }
    );
    let mut t = ulpdu(&golden::SIW_WRITE).to_vec();
    t[1] = 0x43;
    let e = err(&t);
    assert_eq!(
        e,
        Error::TaggedMismatch {
            opcode: Opcode::Send,
            tagged: true
        }
    );
    assert_eq!(e.term_cause(), cause::RDMAP_ERR_UNEXPECTED_OPCODE);
    // The DDP header parsed (tagged), so it is echoed (misbehave.rs row 24).
    assert_eq!(e.terminate(&t).ulpdu_len(), terminate::ULPDU_LEN_TAGGED);
}

/// Matrix A.4.6 row 5: Send opcode on QN 1, Read Request on QN 0, Terminate
/// on QN 0, Atomic Response opcode on QN 3 without RFC 7306 -> 1/2/0x01, M D.
#[test]
fn malformed_opcode_qn_mismatch_row5() {
    let u = untagged(0x4143, 0, 1, 1, 0, b"x");
    let e = err(&u);
    assert_eq!(
        e,
        Error::QueueMismatch {
            opcode: Opcode::Send,
            qn: 1
        }
    );
    assert_eq!(e.term_cause(), cause::DDP_ERR_U_INVALID_QN);
    let t = e.terminate(&u);
    assert_eq!(t.ulpdu_len(), terminate::ULPDU_LEN_UNTAGGED);
    assert_eq!(t.ddp.unwrap().seg_len, 19);
    assert_eq!(t.ddp.unwrap().header.as_bytes(), &u[..18]);
    let rr = untagged(0x4141, 0, 0, 1, 0, &[0; 28]);
    assert_eq!(
        err(&rr),
        Error::QueueMismatch {
            opcode: Opcode::ReadRequest,
            qn: 0
        }
    );
    let tm = untagged(0x4147, 0, 0, 1, 0, &[0; 4]);
    let e = err(&tm);
    assert_eq!(e.opcode(), Some(Opcode::Terminate));
    let ar = untagged(0x4143, 0, 3, 1, 0, b"");
    assert_eq!(
        err(&ar),
        Error::QueueMismatch {
            opcode: Opcode::Send,
            qn: 3
        }
    );
}

/// RDMAP-HDR-07: Read Request with trailing payload -> 0/2/0xFF; the
/// Terminate echoes DDP and RDMA headers (RFC 5040 §7.1 case 3): 70 octets.
#[test]
fn malformed_read_request_trailing_payload() {
    let mut u = ulpdu(&golden::SIW_READ_REQUEST).to_vec();
    u.extend_from_slice(b"junk");
    let e = err(&u);
    assert!(matches!(
        e,
        Error::HeaderLength {
            opcode: Opcode::ReadRequest,
            len: 32,
            rreq: Some(_)
        }
    ));
    assert_eq!(e.term_cause(), cause::RDMAP_ERR_UNSPECIFIED_OP);
    assert_eq!(e.echo(), Echo::DdpAndRdmaHeader);
    let t = e.terminate(&u);
    assert_eq!(t.ulpdu_len(), terminate::ULPDU_LEN_READ_REQUEST);
    assert_eq!(t.rdma.unwrap().size, 64);
}

#[test]
fn malformed_read_request_truncated() {
    let u = &ulpdu(&golden::SIW_READ_REQUEST)[..45];
    let e = err(u);
    assert_eq!(
        e,
        Error::HeaderLength {
            opcode: Opcode::ReadRequest,
            len: 27,
            rreq: None
        }
    );
    assert_eq!(e.terminate(u).ulpdu_len(), terminate::ULPDU_LEN_UNTAGGED);
}

#[test]
fn malformed_header_only_message_not_last() {
    let mut u = ulpdu(&golden::SIW_READ_REQUEST).to_vec();
    u[0] &= !0x40;
    assert_eq!(
        err(&u),
        Error::NotLast {
            opcode: Opcode::ReadRequest
        }
    );
}

/// RFC 7306 §6.3: Immediate Data must be exactly 8 octets.
#[test]
fn malformed_immediate_length() {
    for n in [7usize, 9] {
        let u = untagged(0x4148, 0, 0, 1, 0, &vec![0; n]);
        let e = parse_ulpdu(&u, &Config::RFC7306).unwrap_err();
        assert_eq!(
            e,
            Error::HeaderLength {
                opcode: Opcode::ImmediateData,
                len: n,
                rreq: None
            }
        );
    }
}

/// RDMAP-TRM-04: a truncated or inconsistent Terminate surfaces an error.
#[test]
fn malformed_terminate() {
    let u = untagged(0x4147, 0, 2, 1, 0, &[0x12, 0x01]);
    assert_eq!(
        err(&u),
        Error::Terminate(terminate::Error::Truncated { need: 4, have: 2 })
    );
    // D set in both readings of the control word, but no DDP header follows.
    let u = untagged(0x4147, 0, 2, 1, 0, &[0x12, 0x01, 0xc3, 0x00]);
    let e = err(&u);
    assert!(matches!(e, Error::Terminate(terminate::Error::Truncated { .. })));
    assert_eq!(e.opcode(), Some(Opcode::Terminate));
}

#[test]
fn pretty_printer() {
    let p = Pretty {
        ulpdu: ulpdu(&golden::SIW_READ_REQUEST),
        cfg: Config::RFC5040,
    };
    assert_eq!(
        p.to_string(),
        "DDP untagged L ulp=0x41 qn=1 msn=1 mo=0 rsvdulp=0x00000000 | Read Request sink 0x30fd6700@0x5636971d3530 \
         size 64 src 0x7e9f1d00@0x561caea01b90"
    );
    let p = Pretty {
        ulpdu: &[0x42],
        cfg: Config::RFC5040,
    };
    assert!(p.to_string().starts_with("malformed DDP: DDP version 2"));
}

// ---- proptest round trips ----

fn arb_rreq() -> impl Strategy<Value = ReadRequest> {
    (any::<u32>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(
        |(sink_stag, sink_to, size, src_stag, src_to)| ReadRequest {
            sink_stag,
            sink_to,
            size,
            src_stag,
            src_to,
        },
    )
}

fn arb_atomic() -> impl Strategy<Value = AtomicRequest> {
    (0u8..16, any::<u32>(), any::<u32>(), any::<[u64; 5]>()).prop_map(|(op, request_id, remote_stag, w)| {
        AtomicRequest {
            op: AtomicOp::from(op),
            request_id,
            remote_stag,
            remote_to: w[0],
            add_swap_data: w[1],
            add_swap_mask: w[2],
            compare_data: w[3],
            compare_mask: w[4],
        }
    })
}

/// Every message type except Terminate (terminate_tests.rs has its own),
/// as an owned shape that borrows its payload when turned into a `Message`.
#[derive(Debug, Clone)]
enum Shape {
    Write(u32, u64),
    ReadResponse(u32, u64),
    ReadRequest(ReadRequest),
    Send(bool, Option<u32>),
    Immediate(bool, u64),
    AtomicRequest(AtomicRequest),
    AtomicResponse(AtomicResponse),
}

impl Shape {
    fn message(self, payload: &[u8]) -> Message<'_> {
        match self {
            Shape::Write(stag, to) => Message::Write { stag, to, payload },
            Shape::ReadResponse(stag, to) => Message::ReadResponse { stag, to, payload },
            Shape::ReadRequest(r) => Message::ReadRequest(r),
            Shape::Send(se, invalidate) => Message::Send {
                se,
                invalidate,
                payload,
            },
            Shape::Immediate(se, data) => Message::ImmediateData { se, data },
            Shape::AtomicRequest(a) => Message::AtomicRequest(a),
            Shape::AtomicResponse(a) => Message::AtomicResponse(a),
        }
    }
}

fn arb_shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        (any::<u32>(), any::<u64>()).prop_map(|(s, t)| Shape::Write(s, t)),
        (any::<u32>(), any::<u64>()).prop_map(|(s, t)| Shape::ReadResponse(s, t)),
        arb_rreq().prop_map(Shape::ReadRequest),
        (any::<bool>(), any::<Option<u32>>()).prop_map(|(se, inv)| Shape::Send(se, inv)),
        (any::<bool>(), any::<u64>()).prop_map(|(se, d)| Shape::Immediate(se, d)),
        arb_atomic().prop_map(Shape::AtomicRequest),
        (any::<u32>(), any::<u64>()).prop_map(|(orig_request_id, orig_value)| Shape::AtomicResponse(AtomicResponse {
            orig_request_id,
            orig_value
        })),
    ]
}

proptest! {
    /// RDMAP-LLP-03 / RDMAP-HDR-01: emit then parse gives the same message.
    #[test]
    fn message_round_trip(
        shape in arb_shape(),
        payload in proptest::collection::vec(any::<u8>(), 0..48),
        msn in any::<u32>(),
    ) {
        let m = shape.message(&payload);
        let mut buf = vec![0xa5u8; m.buffer_len()];
        prop_assert_eq!(m.emit(&mut buf, msn), Ok(buf.len()));
        let (seg, back) = parse_ulpdu(&buf, &Config::RFC7306).unwrap();
        prop_assert_eq!(back, m);
        if let ddp::Addr::Untagged { msn: got, .. } = seg.header.addr {
            prop_assert_eq!(got, msn);
        }
    }

    #[test]
    fn read_request_header_round_trip(r in arb_rreq()) {
        let mut buf = [0xa5u8; 28];
        r.emit(&mut buf).unwrap();
        prop_assert_eq!(ReadRequest::parse(&buf), Ok(r));
    }

    #[test]
    fn atomic_headers_round_trip(a in arb_atomic(), id in any::<u32>(), v in any::<u64>()) {
        let mut buf = [0xa5u8; 52];
        a.emit(&mut buf).unwrap();
        prop_assert_eq!(AtomicRequest::parse(&buf), Ok(a));
        let r = AtomicResponse { orig_request_id: id, orig_value: v };
        let mut buf = [0xa5u8; 12];
        r.emit(&mut buf).unwrap();
        prop_assert_eq!(AtomicResponse::parse(&buf), Ok(r));
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..96), siw in any::<bool>()) {
        let cfg = Config {
            terminate_form: if siw { TermWireForm::LinuxSiw } else { TermWireForm::Rfc },
            ..Config::RFC7306
        };
        if let Err(e) = parse_ulpdu(&bytes, &cfg) {
            let t = e.terminate(&bytes);
            let mut out = vec![0u8; t.ulpdu_len()];
            prop_assert_eq!(t.emit_ulpdu(&mut out, 1), Ok(out.len()));
        }
        let _ = Pretty { ulpdu: &bytes, cfg }.to_string();
    }
}
