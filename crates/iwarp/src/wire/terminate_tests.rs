//! Tests of `wire::terminate`: golden vectors of every size class (22, 38,
//! 42, 70; RDMAP-HDR-10) in the RFC form and in the Linux siw form, the
//! builder rules of RFC 5040 Fig. 10 / catalogue A.1.7 / A.5, form
//! detection, malformed cases (RDMAP-HDR-12) and proptest round trips.

use super::*;
use crate::wire::cause;
use crate::wire::ddp::golden::{self, ulpdu};
use proptest::prelude::*;

/// Untagged DDP header of a Terminate: 0x4147, QN 2, MSN 1, MO 0.
const TERM_DDP: [u8; 18] = [0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0];

/// 22: LLP / MPA / CRC error (matrix row 26), no headers. RFC: Layer 2 in
/// the high nibble.
const T22_RFC: [u8; 4] = [0x20, 0x02, 0x00, 0x00];
/// The same from siw: Layer 2 in the low nibble.
const T22_SIW: [u8; 4] = [0x02, 0x02, 0x00, 0x00];

/// The tagged header of siw's Write (frame 13), echoed by a 38-octet Terminate.
const WRITE_HDR: [u8; 14] = [
    0xc1, 0x40, 0x5b, 0x01, 0x98, 0x00, 0x00, 0x00, 0x56, 0x1c, 0xae, 0x9f, 0xe5, 0x30,
];

/// 38: DDP / tagged / invalid STag (row 8) on that Write, M D. DDP Segment
/// Length = ULPDU length 78 (A.5 #1).
const T38_RFC: [u8; 20] = [
    0x11, 0x00, 0xc0, 0x00, 0x00, 0x4e, //
    0xc1, 0x40, 0x5b, 0x01, 0x98, 0x00, 0x00, 0x00, 0x56, 0x1c, 0xae, 0x9f, 0xe5, 0x30,
];
/// siw form: M D at 0x03 of octet 2; siw reports the payload length (64).
const T38_SIW: [u8; 20] = [
    0x11, 0x00, 0x03, 0x00, 0x00, 0x40, //
    0xc1, 0x40, 0x5b, 0x01, 0x98, 0x00, 0x00, 0x00, 0x56, 0x1c, 0xae, 0x9f, 0xe5, 0x30,
];

/// A Send with QN 3 (invalid for RFC 5040), MSN 1, 16 payload octets.
const BAD_QN_SEND_HDR: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0];

/// 42: DDP / untagged / invalid QN (row 5), M D: 0x1201C000 (RFC).
const T42_RFC: [u8; 24] = [
    0x12, 0x01, 0xc0, 0x00, 0x00, 0x22, //
    0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0,
];
/// 0x21010300 from siw (catalogue A.1.4), seg len = payload length 16.
const T42_SIW: [u8; 24] = [
    0x21, 0x01, 0x03, 0x00, 0x00, 0x10, //
    0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0,
];

/// The RDMA part of a 70-octet Terminate: control word + seg len, then the
/// siw Read Request (frame 9) DDP and RDMA headers.
fn t70(ctrl: [u8; 4], seg_len: u16) -> Vec<u8> {
    let mut v = ctrl.to_vec();
    v.extend_from_slice(&seg_len.to_be_bytes());
    v.extend_from_slice(ulpdu(&golden::SIW_READ_REQUEST));
    v
}
/// 70: RDMAP / Remote Protection / invalid STag (row 13), M D R.
const T70_RFC_CTRL: [u8; 4] = [0x01, 0x00, 0xe0, 0x00];
const T70_SIW_CTRL: [u8; 4] = [0x10, 0x00, 0x07, 0x00];

fn with_ddp(rdmap_part: &[u8]) -> Vec<u8> {
    let mut v = TERM_DDP.to_vec();
    v.extend_from_slice(rdmap_part);
    v
}

fn rreq() -> ReadRequest {
    ReadRequest::parse(&ulpdu(&golden::SIW_READ_REQUEST)[18..]).unwrap()
}

/// Emit `r` in `form` onto 0xa5 as a whole ULPDU and compare.
fn assert_emits(r: Repr, form: TermWireForm, rdmap_part: &[u8]) {
    let r = Repr { form, ..r };
    let want = with_ddp(rdmap_part);
    let mut buf = vec![0xa5u8; want.len()];
    assert_eq!(r.emit_ulpdu(&mut buf, 1), Ok(want.len()));
    assert_eq!(buf, want);
    assert_eq!(r.ulpdu_len(), want.len());
}

/// Parse in the given form and with detection (both preferences).
fn assert_parses(rdmap_part: &[u8], form: TermWireForm) -> Repr {
    let r = Repr::parse(rdmap_part, form).unwrap();
    assert_eq!(r.form, form);
    for prefer in [TermWireForm::Rfc, TermWireForm::LinuxSiw] {
        let d = Repr::parse_auto(rdmap_part, prefer).unwrap();
        assert_eq!(d.repr, r, "prefer {prefer:?}");
        assert_eq!(d.certainty, FormCertainty::Unique);
    }
    r
}

#[test]
fn size_classes() {
    assert_eq!(
        [
            ULPDU_LEN_PLAIN,
            ULPDU_LEN_TAGGED,
            ULPDU_LEN_UNTAGGED,
            ULPDU_LEN_READ_REQUEST,
            MAX_LEN
        ],
        [22, 38, 42, 70, 52]
    );
}

/// Catalogue A.1.4: the same Terminate Control word in both forms.
#[test]
fn control_word_forms_brief_example() {
    let c = Control {
        layer: 1,
        etype: 2,
        code: 1,
        m: true,
        d: true,
        r: false,
        reserved: 0,
    };
    assert_eq!(u32::from_be_bytes(c.encode(TermWireForm::Rfc)), 0x1201_c000);
    assert_eq!(u32::from_be_bytes(c.encode(TermWireForm::LinuxSiw)), 0x2101_0300);
    assert_eq!(Control::decode(0x2101_0300u32.to_be_bytes(), TermWireForm::LinuxSiw), c);
    assert_eq!(Control::decode(0x1201_c000u32.to_be_bytes(), TermWireForm::Rfc), c);
    assert_eq!(c.cause(), cause::DDP_ERR_U_INVALID_QN);
}

/// RDMAP-HDR-10, size 22, both forms (matrix row 26, A.5 #2).
#[test]
fn golden_22() {
    let r = Repr::for_error(cause::MPA_ERR_CRC, None, None);
    assert_emits(r, TermWireForm::Rfc, &T22_RFC);
    assert_emits(r, TermWireForm::LinuxSiw, &T22_SIW);
    assert_eq!(assert_parses(&T22_RFC, TermWireForm::Rfc), r);
    assert_eq!(
        assert_parses(&T22_SIW, TermWireForm::LinuxSiw),
        Repr {
            form: TermWireForm::LinuxSiw,
            ..r
        }
    );
}

/// RDMAP-HDR-10, size 38 (tagged DDP header), both forms (matrix row 8).
#[test]
fn golden_38() {
    let r = Repr::for_error(
        cause::DDP_ERR_T_INVALID_STAG,
        Offending::from_fpdu(&golden::SIW_WRITE),
        None,
    );
    assert_emits(r, TermWireForm::Rfc, &T38_RFC);
    assert_eq!(assert_parses(&T38_RFC, TermWireForm::Rfc), r);
    let siw = assert_parses(&T38_SIW, TermWireForm::LinuxSiw);
    assert_eq!(siw.cause, cause::DDP_ERR_T_INVALID_STAG);
    assert_eq!(siw.ddp.unwrap().seg_len, 64);
    assert_eq!(siw.ddp.unwrap().header.as_bytes(), &WRITE_HDR);
    assert!(siw.seg_len_valid && siw.rdma.is_none());
    assert_emits(siw, TermWireForm::LinuxSiw, &T38_SIW);
}

/// RDMAP-HDR-10, size 42 (untagged DDP header), both forms (matrix row 5).
#[test]
fn golden_42() {
    let mut off = BAD_QN_SEND_HDR.to_vec();
    off.extend_from_slice(&[0x5a; 16]);
    let r = Repr::for_error(cause::DDP_ERR_U_INVALID_QN, Offending::from_ulpdu(&off), None);
    assert_emits(r, TermWireForm::Rfc, &T42_RFC);
    assert_eq!(assert_parses(&T42_RFC, TermWireForm::Rfc), r);
    let siw = assert_parses(&T42_SIW, TermWireForm::LinuxSiw);
    assert_eq!(siw.cause, cause::DDP_ERR_U_INVALID_QN);
    let h = siw.ddp.unwrap().header.header().unwrap();
    assert_eq!(
        h.addr,
        ddp::Addr::Untagged {
            qn: 3,
            msn: 1,
            mo: 0,
            inv_stag: 0
        }
    );
    assert_emits(siw, TermWireForm::LinuxSiw, &T42_SIW);
}

/// RDMAP-HDR-10, size 70 (untagged DDP header + RDMA header), both forms
/// (matrix row 13, RDMAP-ERR-04).
#[test]
fn golden_70() {
    let r = Repr::for_error(
        cause::RDMAP_ERR_INVALID_STAG,
        Offending::from_fpdu(&golden::SIW_READ_REQUEST),
        Some(&rreq()),
    );
    let rfc = t70(T70_RFC_CTRL, 46);
    assert_emits(r, TermWireForm::Rfc, &rfc);
    assert_eq!(assert_parses(&rfc, TermWireForm::Rfc), r);
    // siw computes its length field as ULPDU length minus header length: 0.
    let siw_bytes = t70(T70_SIW_CTRL, 0);
    let siw = assert_parses(&siw_bytes, TermWireForm::LinuxSiw);
    assert_eq!(siw.cause, cause::RDMAP_ERR_INVALID_STAG);
    assert_eq!(siw.rdma, Some(rreq()));
    assert_emits(siw, TermWireForm::LinuxSiw, &siw_bytes);
}

/// siw sets R on Send-with-Invalidate protection errors but attaches no RDMA
/// header (matrix row 20 note): accepted in the siw reading, flagged.
#[test]
fn siw_r_without_rdma_header() {
    let mut t = vec![0x10, 0x09, 0x07, 0x00, 0x00, 0x04];
    t.extend_from_slice(&[0x41, 0x44, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
    let d = Repr::parse_auto(&t, TermWireForm::Rfc).unwrap();
    assert_eq!(d.certainty, FormCertainty::Unique);
    assert_eq!(d.repr.form, TermWireForm::LinuxSiw);
    assert_eq!(d.repr.cause, cause::RDMAP_ERR_CANNOT_INVALIDATE_PROT);
    assert!(d.repr.r_without_header && d.repr.rdma.is_none());
    assert_eq!(
        Repr::parse(&t, TermWireForm::Rfc).unwrap_err(),
        Error::TrailingBytes { extra: 20 }
    );
    // Emitted without the quirk: R only with a header (RDMAP-HDR-12).
    assert_eq!(d.repr.buffer_len(), 24);
    let mut out = [0u8; 24];
    d.repr.emit(&mut out).unwrap();
    assert_eq!(out[2], 0x03);
}

/// The nibble-swap residue (module doc): both readings defined -> the
/// preference wins and the result says so.
#[test]
fn detection_ambiguous_cases() {
    for o0 in [0x02u8, 0x20] {
        for code in [0x05u8, 0x06, 0x07] {
            for prefer in [TermWireForm::Rfc, TermWireForm::LinuxSiw] {
                let d = Repr::parse_auto(&[o0, code, 0, 0], prefer).unwrap();
                assert_eq!(d.certainty, FormCertainty::Ambiguous);
                assert_eq!(d.repr.form, prefer);
            }
        }
    }
    let d = Repr::parse_auto(&[0x01, 0x00, 0, 0], TermWireForm::LinuxSiw).unwrap();
    assert_eq!(
        (d.certainty, d.repr.cause),
        (FormCertainty::Ambiguous, cause::DDP_LOCAL_CATASTROPHIC_ERR)
    );
    // 0x02 with an MPA-only code (CRC) is not ambiguous: RDMAP Remote
    // Operation has no code 0x02.
    let d = Repr::parse_auto(&T22_SIW, TermWireForm::Rfc).unwrap();
    assert_eq!(
        (d.certainty, d.repr.form),
        (FormCertainty::Unique, TermWireForm::LinuxSiw)
    );
}

#[test]
fn detection_same_meaning() {
    for o0 in [0x00u8, 0x11, 0x22] {
        let d = Repr::parse_auto(&[o0, 0x00, 0, 0], TermWireForm::LinuxSiw).unwrap();
        assert_eq!(d.certainty, FormCertainty::SameMeaning);
        assert_eq!(d.repr.form, TermWireForm::LinuxSiw);
    }
}

/// RDMAP-HDR-11: reserved bits are ignored on receive and surfaced; zero on
/// transmit.
#[test]
fn reserved_bits_ignored() {
    let mut t = T42_RFC;
    t[2] |= 0x1f;
    t[3] = 0xff;
    let r = Repr::parse(&t, TermWireForm::Rfc).unwrap();
    assert_eq!(r.reserved, 0x1fff);
    assert_eq!(r.cause, cause::DDP_ERR_U_INVALID_QN);
    let d = Repr::parse_auto(&t, TermWireForm::LinuxSiw).unwrap();
    assert_eq!(d.repr, r);
    let mut out = [0u8; 24];
    r.emit(&mut out).unwrap();
    assert_eq!(out, T42_RFC);
    let mut s = T42_SIW;
    s[2] |= 0xf8;
    s[3] = 0xff;
    assert_eq!(Repr::parse(&s, TermWireForm::LinuxSiw).unwrap().reserved, 0x1fff);
    // RFC form, no headers, all reserved bits set: the siw reading would need
    // M D R parts, so detection still picks RFC.
    let d = Repr::parse_auto(&[0x20, 0x02, 0x1f, 0xff], TermWireForm::LinuxSiw).unwrap();
    assert_eq!((d.repr.form, d.repr.reserved), (TermWireForm::Rfc, 0x1fff));
}

/// Catalogue A.5 #2: zero-filled longer forms are accepted.
#[test]
fn zero_filled_longer_form_accepted() {
    let mut t = T22_RFC.to_vec();
    t.resize(MAX_LEN, 0);
    let r = Repr::parse(&t, TermWireForm::Rfc).unwrap();
    assert_eq!((r.cause, r.ddp, r.rdma), (cause::MPA_ERR_CRC, None, None));
}

// ---- malformed (RDMAP-HDR-12): typed errors, no panic ----

#[test]
fn malformed_truncated_control() {
    for n in 0..4 {
        assert_eq!(
            Repr::parse(&T22_RFC[..n], TermWireForm::Rfc),
            Err(Error::Truncated { need: 4, have: n })
        );
        assert!(Repr::parse_auto(&T22_RFC[..n], TermWireForm::Rfc).is_err());
    }
}

#[test]
fn malformed_d_without_ddp_header() {
    for n in 4..24 {
        let e = Repr::parse(&T42_RFC[..n], TermWireForm::Rfc).unwrap_err();
        assert!(matches!(e, Error::Truncated { .. }), "{n}: {e:?}");
    }
    assert_eq!(
        Repr::parse(&T38_RFC[..19], TermWireForm::Rfc),
        Err(Error::Truncated { need: 20, have: 19 })
    );
}

#[test]
fn malformed_r_without_rdma_header_rfc() {
    let t = t70(T70_RFC_CTRL, 46);
    assert_eq!(
        Repr::parse(&t[..51], TermWireForm::Rfc),
        Err(Error::Truncated { need: 52, have: 51 })
    );
    assert_eq!(
        Repr::parse(&t[..24], TermWireForm::Rfc),
        Err(Error::Truncated { need: 52, have: 24 })
    );
}

#[test]
fn malformed_m_without_d() {
    assert_eq!(
        Repr::parse(&[0x12, 0x01, 0x80, 0x00], TermWireForm::Rfc),
        Err(Error::MWithoutD)
    );
}

#[test]
fn malformed_trailing_bytes() {
    let mut t = T38_RFC.to_vec();
    t.push(1);
    assert_eq!(
        Repr::parse(&t, TermWireForm::Rfc),
        Err(Error::TrailingBytes { extra: 1 })
    );
    assert_eq!(
        Repr::parse(&[0x20, 0x02, 0, 0, 0, 7], TermWireForm::Rfc),
        Err(Error::TrailingBytes { extra: 2 })
    );
}

/// R and D with a tagged DDP header (66) and R alone (50) are consistent.
#[test]
fn other_consistent_combinations() {
    let mut t = vec![0x00, 0x06, 0xe0, 0x00, 0x00, 0x4e];
    t.extend_from_slice(&WRITE_HDR);
    t.extend_from_slice(&[0x11; 28]);
    let r = Repr::parse(&t, TermWireForm::Rfc).unwrap();
    assert_eq!(r.ulpdu_len(), 66);
    let mut u = vec![0x00, 0x06, 0x20, 0x00];
    u.extend_from_slice(&[0x11; 28]);
    let r = Repr::parse(&u, TermWireForm::Rfc).unwrap();
    assert!(r.ddp.is_none() && r.rdma.is_some());
    assert_eq!(r.ulpdu_len(), 50);
}

// ---- builder rules: RFC 5040 Fig. 10, catalogue A.1.7, A.4.6 M/D/R ----

fn mdr(r: &Repr) -> (bool, bool, bool) {
    let c = r.control();
    (c.m, c.d, c.r)
}

#[test]
fn builder_ddp_untagged_rows_1_to_5() {
    let u = ulpdu(&golden::SIW_SEND);
    for c in [
        cause::DDP_ERR_U_NO_BUFFER,
        cause::DDP_ERR_U_TOO_LONG,
        cause::DDP_ERR_U_MSN_RANGE,
        cause::DDP_ERR_U_INVALID_MO,
        cause::DDP_ERR_U_INVALID_QN,
    ] {
        let r = Repr::for_error(c, Offending::from_ulpdu(u), Some(&rreq()));
        assert_eq!(mdr(&r), (true, true, false), "{c}");
        assert_eq!(r.ulpdu_len(), 42);
        // DDP Segment Length = the offending ULPDU length (A.5 #1).
        assert_eq!(r.ddp.unwrap().seg_len, 34);
    }
}

#[test]
fn builder_ddp_tagged_rows_8_to_12() {
    for c in [
        cause::DDP_ERR_T_INVALID_STAG,
        cause::DDP_ERR_T_BASE_BOUNDS,
        cause::DDP_ERR_T_STAG_NOT_ASSOCIATED,
        cause::DDP_ERR_T_TO_WRAP,
    ] {
        let r = Repr::for_error(c, Offending::from_fpdu(&golden::SIW_WRITE), None);
        assert_eq!((mdr(&r), r.ulpdu_len()), ((true, true, false), 38), "{c}");
    }
}

/// Rows 6, 7, 21, 22, 24: layout unknown, the caller passes no header.
#[test]
fn builder_layout_unknown() {
    for c in [
        cause::DDP_ERR_U_INVALID_VERSION,
        cause::DDP_ERR_T_INVALID_VERSION,
        cause::RDMAP_ERR_INVALID_VERSION,
        cause::RDMAP_ERR_UNEXPECTED_OPCODE,
    ] {
        let r = Repr::for_error(c, None, None);
        assert_eq!((mdr(&r), r.ulpdu_len()), ((false, false, false), 22));
    }
}

/// Rows 13-17 and 19: Read Request errors carry the RDMA header.
#[test]
fn builder_read_request_rows_13_to_19() {
    let fpdu = &golden::SIW_READ_REQUEST;
    for c in [
        cause::RDMAP_ERR_INVALID_STAG,
        cause::RDMAP_ERR_BASE_BOUNDS,
        cause::RDMAP_ERR_ACCESS_RIGHTS,
        cause::RDMAP_ERR_STAG_NOT_ASSOCIATED,
        cause::RDMAP_ERR_TO_WRAP,
        cause::RDMAP_ERR_CATASTROPHIC_STREAM,
    ] {
        let r = Repr::for_error(c, Offending::from_fpdu(fpdu), Some(&rreq()));
        assert_eq!((mdr(&r), r.ulpdu_len()), ((true, true, true), 70), "{c}");
    }
    // RDMAP-HDR-13: an advanced image after 2048 of 8192 octets.
    let big = ReadRequest { size: 8192, ..rreq() };
    let r = Repr::for_error(
        cause::RDMAP_ERR_INVALID_STAG,
        Offending::from_fpdu(fpdu),
        big.advanced(2048).as_ref(),
    );
    assert_eq!(r.rdma.unwrap().size, 6144);
}

/// Row 20 and A.5 #3: Send with Invalidate errors set no R; DDP-layer
/// errors never carry the RDMA header (Fig. 10) even for a Read Request.
#[test]
fn builder_r_only_for_rdmap_read_request_errors() {
    let u = ulpdu(&golden::SIW_SEND);
    let r = Repr::for_error(cause::RDMAP_ERR_CANNOT_INVALIDATE_PROT, Offending::from_ulpdu(u), None);
    assert_eq!((mdr(&r), r.ulpdu_len()), ((true, true, false), 42));
    let r = Repr::for_error(
        cause::DDP_ERR_U_MSN_RANGE,
        Offending::from_fpdu(&golden::SIW_READ_REQUEST),
        Some(&rreq()),
    );
    assert_eq!(mdr(&r), (true, true, false));
    // Row 23 (Read Response without a Read outstanding, 0/2/0x06): tagged echo.
    let r = Repr::for_error(
        cause::RDMAP_ERR_UNEXPECTED_OPCODE,
        Offending::from_fpdu(&golden::SIW_READ_RESPONSE),
        None,
    );
    assert_eq!((mdr(&r), r.ulpdu_len()), ((true, true, false), 38));
}

/// Rows 26-28 and RDMAP-ERR-02: LLP and Local Catastrophic -> 22 octets,
/// even when an offending header is at hand.
#[test]
fn builder_no_headers_for_llp_and_local_catastrophic() {
    let off = Offending::from_fpdu(&golden::SIW_SEND);
    for c in [
        cause::MPA_ERR_CRC,
        cause::MPA_ERR_MARKER,
        cause::RDMAP_LOCAL_CATASTROPHIC_ERR,
        cause::DDP_LOCAL_CATASTROPHIC_ERR,
    ] {
        let r = Repr::for_error(c, off, Some(&rreq()));
        assert_eq!((mdr(&r), r.ulpdu_len()), ((false, false, false), 22), "{c}");
    }
}

#[test]
fn offending_constructors() {
    for fpdu in [&golden::SIW_SEND[..], &golden::SIW_WRITE, &golden::SIW_READ_REQUEST] {
        assert_eq!(Offending::from_fpdu(fpdu), Offending::from_ulpdu(ulpdu(fpdu)));
    }
    assert_eq!(Offending::from_ulpdu(&ulpdu(&golden::SIW_SEND)[..17]), None);
    assert_eq!(Offending::from_fpdu(&[0x00]), None);
    assert_eq!(Offending::from_ulpdu(&[]), None);
}

#[test]
fn display() {
    let r = Repr::parse(&T42_SIW, TermWireForm::LinuxSiw).unwrap();
    assert_eq!(
        r.to_string(),
        "Terminate layer 1/etype 2/code 0x01 (DDP untagged buffer: invalid QN) [MD- siw-form] seglen=16 \
         ddp=[DDP untagged L ulp=0x43 qn=3 msn=1 mo=0 rsvdulp=0x00000000]"
    );
}

// ---- proptest ----

const DEFINED: [TermCause; 23] = [
    cause::RDMAP_LOCAL_CATASTROPHIC_ERR,
    cause::RDMAP_ERR_INVALID_STAG,
    cause::RDMAP_ERR_BASE_BOUNDS,
    cause::RDMAP_ERR_ACCESS_RIGHTS,
    cause::RDMAP_ERR_STAG_NOT_ASSOCIATED,
    cause::RDMAP_ERR_TO_WRAP,
    cause::RDMAP_ERR_CANNOT_INVALIDATE_PROT,
    cause::RDMAP_ERR_CANNOT_INVALIDATE_OP,
    cause::RDMAP_ERR_INVALID_VERSION,
    cause::RDMAP_ERR_UNEXPECTED_OPCODE,
    cause::RDMAP_ERR_CATASTROPHIC_STREAM,
    cause::RDMAP_ERR_UNSPECIFIED_OP,
    cause::DDP_LOCAL_CATASTROPHIC_ERR,
    cause::DDP_ERR_T_INVALID_STAG,
    cause::DDP_ERR_T_TO_WRAP,
    cause::DDP_ERR_T_INVALID_VERSION,
    cause::DDP_ERR_U_INVALID_QN,
    cause::DDP_ERR_U_NO_BUFFER,
    cause::DDP_ERR_U_INVALID_VERSION,
    cause::MPA_ERR_CONNECTION_LOST,
    cause::MPA_ERR_CRC,
    cause::MPA_ERR_INVALID_REQ_REP,
    cause::MPA_ERR_NO_MATCHING_RTR,
];

fn arb_repr(defined_only: bool) -> impl Strategy<Value = Repr> {
    let cause = if defined_only {
        proptest::sample::select(&DEFINED[..]).boxed()
    } else {
        (0u8..16, 0u8..16, any::<u8>())
            .prop_map(|(l, e, c)| TermCause::new(Layer::from_nibble(l), e, c))
            .boxed()
    };
    let hdr = prop_oneof![
        proptest::collection::vec(any::<u8>(), 14).prop_map(|mut v| {
            v[0] |= 0x80;
            v
        }),
        proptest::collection::vec(any::<u8>(), 18).prop_map(|mut v| {
            v[0] &= 0x7f;
            v
        }),
    ];
    let rr = (any::<u32>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(a, b, c, d, e)| {
        ReadRequest {
            sink_stag: a,
            sink_to: b,
            size: c,
            src_stag: d,
            src_to: e,
        }
    });
    (
        cause,
        any::<bool>(),
        proptest::option::of((any::<u16>(), hdr)),
        proptest::option::of(rr),
    )
        .prop_map(|(cause, m, ddp, rdma)| {
            let ddp = ddp.map(|(seg_len, h)| TermDdp {
                seg_len,
                header: EchoedDdpHeader::from_bytes(&h).unwrap(),
            });
            Repr {
                cause,
                seg_len_valid: m && ddp.is_some(),
                ddp,
                rdma,
                form: TermWireForm::Rfc,
                reserved: 0,
                r_without_header: false,
            }
        })
}

proptest! {
    /// RDMAP-HDR-12: what we emit parses back identically in its own form,
    /// and its length always matches its bits.
    #[test]
    fn round_trip_explicit_form(r in arb_repr(false), siw in any::<bool>()) {
        let form = if siw { TermWireForm::LinuxSiw } else { TermWireForm::Rfc };
        let r = Repr { form, ..r };
        let mut buf = vec![0xa5u8; r.buffer_len()];
        prop_assert_eq!(r.emit(&mut buf), Ok(buf.len()));
        prop_assert_eq!(Repr::parse(&buf, form), Ok(r));
    }

    /// With a defined cause, detection preferring the emitted form recovers
    /// it exactly; a Unique verdict is right whatever the preference.
    #[test]
    fn round_trip_detected(r in arb_repr(true), siw in any::<bool>()) {
        let form = if siw { TermWireForm::LinuxSiw } else { TermWireForm::Rfc };
        let r = Repr { form, ..r };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf).unwrap();
        prop_assert_eq!(Repr::parse_auto(&buf, form).unwrap().repr, r);
        let other = if siw { TermWireForm::Rfc } else { TermWireForm::LinuxSiw };
        let d = Repr::parse_auto(&buf, other).unwrap();
        if d.certainty != FormCertainty::Ambiguous {
            prop_assert_eq!(Repr { form, ..d.repr }, r);
        }
    }

    #[test]
    fn control_word_bijective(w in any::<[u8; 4]>(), siw in any::<bool>()) {
        let form = if siw { TermWireForm::LinuxSiw } else { TermWireForm::Rfc };
        prop_assert_eq!(Control::decode(w, form).encode(form), w);
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
        for form in [TermWireForm::Rfc, TermWireForm::LinuxSiw] {
            if let Ok(r) = Repr::parse(&bytes, form) {
                let _ = r.to_string();
            }
            let _ = Repr::parse_auto(&bytes, form);
        }
    }
}
