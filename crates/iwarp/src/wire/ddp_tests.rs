//! Tests of `wire::ddp` on golden bytes (RFC 5041 Figs. 4-5, Linux siw
//! captures), plus malformed cases and proptest round trips.

use super::golden::{self, ulpdu};
use super::*;
use crate::wire::cause;
use proptest::prelude::*;

/// A tagged header from RFC 5041 Fig. 4 with distinct octets in every field.
static TAGGED_BYTES: [u8; 17] = [
    0xc1, 0x40, // T=1 L=1 Rsvd=0 DV=01 | RV=01 op=0 (Write)
    0x11, 0x22, 0x33, 0x44, // STag
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // TO
    0xaa, 0xbb, 0xcc, // payload
];

/// An untagged header from RFC 5041 Fig. 5 (Send with Invalidate, not last).
static UNTAGGED_BYTES: [u8; 20] = [
    0x01, 0x44, // T=0 L=0 DV=01 | RV=01 op=4
    0xde, 0xad, 0xbe, 0xef, // RsvdULP[8:39] = Invalidate STag
    0x00, 0x00, 0x00, 0x00, // QN 0
    0x00, 0x00, 0x00, 0x07, // MSN 7
    0x00, 0x00, 0x05, 0xc8, // MO 1480
    0x5a, 0x5b, // payload
];

#[test]
fn deconstruct_tagged() {
    let p = TaggedPacket::new_checked(&TAGGED_BYTES[..]).unwrap();
    assert!(p.tagged_flag());
    assert!(p.last_flag());
    assert_eq!(p.reserved(), 0);
    assert_eq!(p.version(), 1);
    assert_eq!(p.rdmap_ctrl(), 0x40);
    assert_eq!(p.stag(), 0x1122_3344);
    assert_eq!(p.to(), 0x0102_0304_0506_0708);
    assert_eq!(p.payload(), &[0xaa, 0xbb, 0xcc]);
    assert_eq!(p.header_len(), 14);
}

#[test]
fn deconstruct_untagged() {
    let p = UntaggedPacket::new_checked(&UNTAGGED_BYTES[..]).unwrap();
    assert!(!p.tagged_flag());
    assert!(!p.last_flag());
    assert_eq!(p.version(), 1);
    assert_eq!(p.rdmap_ctrl(), 0x44);
    assert_eq!(p.inv_stag(), 0xdead_beef);
    assert_eq!(p.qn(), 0);
    assert_eq!(p.msn(), 7);
    assert_eq!(p.mo(), 1480);
    assert_eq!(p.payload(), &[0x5a, 0x5b]);
}

#[test]
fn construct_tagged_on_a5() {
    let mut buf = [0xa5u8; 17];
    let mut p = TaggedPacket::new_unchecked(&mut buf[..]);
    p.set_tagged_flag(true);
    p.set_last_flag(true);
    p.set_reserved(0);
    p.set_version(1);
    p.set_rdmap_ctrl(0x40);
    p.set_stag(0x1122_3344);
    p.set_to(0x0102_0304_0506_0708);
    p.payload_mut().copy_from_slice(&[0xaa, 0xbb, 0xcc]);
    assert_eq!(buf, TAGGED_BYTES);
}

#[test]
fn construct_untagged_on_a5() {
    let mut buf = [0xa5u8; 20];
    let mut p = UntaggedPacket::new_unchecked(&mut buf[..]);
    p.set_tagged_flag(false);
    p.set_last_flag(false);
    p.set_reserved(0);
    p.set_version(1);
    p.set_rdmap_ctrl(0x44);
    p.set_inv_stag(0xdead_beef);
    p.set_qn(0);
    p.set_msn(7);
    p.set_mo(1480);
    p.payload_mut().copy_from_slice(&[0x5a, 0x5b]);
    assert_eq!(buf, UNTAGGED_BYTES);
}

#[test]
fn emit_header_onto_a5_leaves_payload() {
    let h = Header {
        last: true,
        rdmap_ctrl: 0x40,
        addr: Addr::Tagged {
            stag: 0x1122_3344,
            to: 0x0102_0304_0506_0708,
        },
    };
    let mut buf = [0xa5u8; 17];
    assert_eq!(h.emit(&mut buf), Ok(14));
    assert_eq!(buf[..14], TAGGED_BYTES[..14]);
    assert_eq!(buf[14..], [0xa5; 3]);
}

#[test]
fn parse_and_emit_segment() {
    let seg = Segment::parse(&UNTAGGED_BYTES).unwrap();
    assert_eq!(
        seg.header,
        Header {
            last: false,
            rdmap_ctrl: 0x44,
            addr: Addr::Untagged {
                qn: 0,
                msn: 7,
                mo: 1480,
                inv_stag: 0xdead_beef
            }
        }
    );
    assert_eq!(seg.payload, &[0x5a, 0x5b]);
    assert_eq!(seg.buffer_len(), 20);
    let mut buf = [0xa5u8; 20];
    assert_eq!(seg.emit(&mut buf), Ok(20));
    assert_eq!(buf, UNTAGGED_BYTES);
}

#[test]
fn emit_with_fills_payload_in_place() {
    let seg = Segment::parse(&TAGGED_BYTES).unwrap();
    let mut buf = [0xa5u8; 17];
    let n = seg
        .emit_with(&mut buf, 3, |p| p.copy_from_slice(&[0xaa, 0xbb, 0xcc]))
        .unwrap();
    assert_eq!(n, 17);
    assert_eq!(buf, TAGGED_BYTES);
    assert_eq!(seg.emit(&mut [0u8; 16]), Err(BufferTooSmall { need: 17, have: 16 }));
}

/// Linux siw captures (RDMAP-HDR-01/-08): every DDP field as siw sent it.
#[test]
fn siw_capture_send() {
    let seg = Segment::parse(ulpdu(&golden::SIW_SEND)).unwrap();
    assert_eq!(seg.header.control_word(), 0x4143);
    assert_eq!(
        seg.header.addr,
        Addr::Untagged {
            qn: 0,
            msn: 1,
            mo: 0,
            inv_stag: 0
        }
    );
    assert_eq!(seg.payload.len(), 16);
}

#[test]
fn siw_capture_read_request() {
    let seg = Segment::parse(ulpdu(&golden::SIW_READ_REQUEST)).unwrap();
    assert_eq!(seg.header.control_word(), 0x4141);
    assert_eq!(
        seg.header.addr,
        Addr::Untagged {
            qn: 1,
            msn: 1,
            mo: 0,
            inv_stag: 0
        }
    );
    assert_eq!(seg.payload.len(), 28);
}

#[test]
fn siw_capture_read_response_and_write() {
    let rr = Segment::parse(ulpdu(&golden::SIW_READ_RESPONSE)).unwrap();
    assert_eq!(rr.header.control_word(), 0xc142);
    assert_eq!(
        rr.header.addr,
        Addr::Tagged {
            stag: 0x30fd_6700,
            to: 0x0000_5636_971d_3530
        }
    );
    assert_eq!(rr.payload, &golden::RPING_DATA);
    let wr = Segment::parse(ulpdu(&golden::SIW_WRITE)).unwrap();
    assert_eq!(wr.header.control_word(), 0xc140);
    assert_eq!(
        wr.header.addr,
        Addr::Tagged {
            stag: 0x5b01_9800,
            to: 0x0000_561c_ae9f_e530
        }
    );
    assert_eq!(wr.payload, &golden::RPING_DATA);
}

/// Re-emitting each capture gives back siw's exact bytes.
#[test]
fn siw_captures_round_trip() {
    for fpdu in [
        &golden::SIW_SEND[..],
        &golden::SIW_READ_REQUEST,
        &golden::SIW_READ_RESPONSE,
        &golden::SIW_WRITE,
    ] {
        let u = ulpdu(fpdu);
        let seg = Segment::parse(u).unwrap();
        let mut buf = vec![0xa5u8; u.len()];
        assert_eq!(seg.emit(&mut buf), Ok(u.len()));
        assert_eq!(buf, u);
    }
}

#[test]
fn truncated_empty() {
    assert_eq!(Segment::parse(&[]), Err(Error::Empty));
    assert_eq!(Error::Empty.term_cause(), cause::DDP_LOCAL_CATASTROPHIC_ERR);
}

#[test]
fn truncated_tagged_header() {
    for len in 1..14 {
        let e = Segment::parse(&TAGGED_BYTES[..len]).unwrap_err();
        assert_eq!(e, Error::Truncated { tagged: true, len });
        assert!(!e.layout_known());
        // Issue 12 point 8: DDP's own code, no echoed header.
        assert_eq!(e.term_cause(), cause::DDP_LOCAL_CATASTROPHIC_ERR);
        assert!(!e.term_cause().carries_ddp_header());
    }
    assert!(Segment::parse(&TAGGED_BYTES[..14]).unwrap().payload.is_empty());
}

#[test]
fn truncated_untagged_header() {
    for len in 1..18 {
        assert_eq!(
            Segment::parse(&UNTAGGED_BYTES[..len]),
            Err(Error::Truncated { tagged: false, len })
        );
    }
}

/// Matrix A.4.6 row 6: untagged segment with DV != 01 -> 1/2/0x06, no echo.
#[test]
fn bad_dv_untagged_row6() {
    for dv in [0u8, 2, 3] {
        let mut b = UNTAGGED_BYTES;
        b[0] = (b[0] & !0x03) | dv;
        let e = Segment::parse(&b).unwrap_err();
        assert_eq!(e, Error::Version { tagged: false, dv });
        assert_eq!(e.term_cause(), cause::DDP_ERR_U_INVALID_VERSION);
        assert!(!e.layout_known());
    }
}

/// Matrix A.4.6 row 7: tagged segment with DV != 01 -> 1/1/0x04.
#[test]
fn bad_dv_tagged_row7() {
    let mut b = TAGGED_BYTES;
    b[0] = 0xc2;
    let e = Segment::parse(&b).unwrap_err();
    assert_eq!(e, Error::Version { tagged: true, dv: 2 });
    assert_eq!(e.term_cause(), cause::DDP_ERR_T_INVALID_VERSION);
}

/// DV is checked before the length (catalogue A.4.2 step 2): a one-octet
/// ULPDU with a bad DV reports the version.
#[test]
fn dv_checked_before_length() {
    assert_eq!(Segment::parse(&[0x80]), Err(Error::Version { tagged: true, dv: 0 }));
    assert_eq!(Segment::parse(&[0x81]), Err(Error::Truncated { tagged: true, len: 1 }));
}

/// RFC 5041 §4.1: Rsvd is not checked on receive, and is sent as zero.
#[test]
fn reserved_bits_ignored_on_receive() {
    let mut b = TAGGED_BYTES;
    b[0] |= 0x3c;
    let seg = Segment::parse(&b).unwrap();
    assert_eq!(TaggedPacket::new_checked(&b[..]).unwrap().reserved(), 0xf);
    let mut out = [0u8; 17];
    seg.emit(&mut out).unwrap();
    assert_eq!(out, TAGGED_BYTES);
}

#[test]
fn lenient_parse_keeps_bad_dv() {
    let mut b = UNTAGGED_BYTES;
    b[0] = 0x02;
    let h = Header::parse_lenient(&b).unwrap();
    assert_eq!(
        h.addr,
        Addr::Untagged {
            qn: 0,
            msn: 7,
            mo: 1480,
            inv_stag: 0xdead_beef
        }
    );
    assert_eq!(Header::parse_lenient(&b[..17]), None);
}

#[test]
fn display_names_fields() {
    let seg = Segment::parse(ulpdu(&golden::SIW_READ_REQUEST)).unwrap();
    assert_eq!(
        seg.to_string(),
        "DDP untagged L ulp=0x41 qn=1 msn=1 mo=0 rsvdulp=0x00000000 len=28"
    );
}

fn arb_header() -> impl Strategy<Value = Header> {
    let tagged = (any::<u32>(), any::<u64>()).prop_map(|(stag, to)| Addr::Tagged { stag, to });
    let untagged = (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())
        .prop_map(|(qn, msn, mo, inv_stag)| Addr::Untagged { qn, msn, mo, inv_stag });
    (any::<bool>(), any::<u8>(), prop_oneof![tagged, untagged]).prop_map(|(last, rdmap_ctrl, addr)| Header {
        last,
        rdmap_ctrl,
        addr,
    })
}

proptest! {
    /// RDMAP-LLP-03: every header, RsvdULP included, survives emit/parse.
    #[test]
    fn header_round_trip(h in arb_header(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
        let seg = Segment { header: h, payload: &payload };
        let mut buf = vec![0xa5u8; seg.buffer_len()];
        prop_assert_eq!(seg.emit(&mut buf), Ok(buf.len()));
        let back = Segment::parse(&buf).unwrap();
        prop_assert_eq!(back, seg);
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
        let _ = Segment::parse(&bytes);
        let _ = Header::parse_lenient(&bytes);
    }
}

// ---- segmentation (RFC 5041 §5.2), the functions the engine's transmit side runs ----

mod segmentation {
    use super::super::*;
    use core::ops::Range;
    use proptest::prelude::*;

    const MULPDU: usize = 1500;

    fn tagged(to: u64) -> Header {
        Header {
            last: false,
            rdmap_ctrl: 0x40,
            addr: Addr::Tagged { stag: 0x5b01_9800, to },
        }
    }
    fn untagged(msn: u32) -> Header {
        Header {
            last: false,
            rdmap_ctrl: 0x43,
            addr: Addr::Untagged {
                qn: 0,
                msn,
                mo: 0,
                inv_stag: 0,
            },
        }
    }

    /// The segments of a message, the way `engine/qp/tx.rs` `fill_tx` walks it.
    fn cut(first: Header, len: usize, mulpdu: usize) -> Vec<(Header, Range<usize>)> {
        let room = mulpdu - first.header_len();
        let mut out = Vec::new();
        let mut off = 0;
        loop {
            let (n, last) = segment_len(len, off, room);
            out.push((first.at_offset(off, last), off..off + n));
            off += n;
            if last {
                return out;
            }
        }
    }

    /// Segment, then check every RFC 5041 §5.2 rule and reassemble.
    fn check(first: Header, len: usize, mulpdu: usize) -> Vec<(Header, Range<usize>)> {
        let segs = cut(first, len, mulpdu);
        let mut next = 0usize;
        for (i, (h, r)) in segs.iter().enumerate() {
            assert_eq!(r.start, next, "contiguous");
            assert!(h.header_len() + r.len() <= mulpdu, "segment within MULPDU");
            assert!(!r.is_empty() || len == 0, "no empty segment in a non-empty message");
            assert_eq!(h.last, i + 1 == segs.len(), "L only on the last");
            assert_eq!(h.rdmap_ctrl, first.rdmap_ctrl);
            match (first.addr, h.addr) {
                (Addr::Tagged { stag, to }, Addr::Tagged { stag: s2, to: t2 }) => {
                    assert_eq!((s2, t2), (stag, to + r.start as u64), "TO = message TO + offset");
                }
                (
                    Addr::Untagged { qn, msn, mo: mo0, .. },
                    Addr::Untagged {
                        qn: q2, msn: m2, mo, ..
                    },
                ) => {
                    assert_eq!(
                        (q2, m2, mo as usize),
                        (qn, msn, mo0 as usize + r.start),
                        "same MSN, MO = offset"
                    );
                }
                _ => panic!("buffer model changed"),
            }
            next = r.end;
        }
        assert_eq!(next, len, "all data sent");
        segs
    }

    /// RDMAP-LLP-02 / RDMAP-LLP-04 lengths, tagged and untagged.
    #[test]
    fn lengths_llp02_llp04() {
        for (first, cap) in [(tagged(16384), MULPDU - 14), (untagged(1), MULPDU - 18)] {
            for len in [
                0,
                1,
                3,
                4,
                cap - 1,
                cap,
                cap + 1,
                MULPDU - 1,
                MULPDU,
                MULPDU + 1,
                1 << 20,
            ] {
                let segs = check(first, len, MULPDU);
                let want = if len == 0 { 1 } else { len.div_ceil(cap) };
                assert_eq!(segs.len(), want, "len {len}");
            }
        }
    }

    /// A zero-length message is one segment with L = 1 and no payload.
    #[test]
    fn zero_length_message() {
        assert_eq!(
            cut(tagged(u64::MAX), 0, MULPDU),
            vec![(
                Header {
                    last: true,
                    ..tagged(u64::MAX)
                },
                0..0
            )]
        );
    }

    /// RFC 5041 §5.2's examples: untagged 2048 octets with MULPDU 1500 ->
    /// MO 0 (1482 octets) and MO 1482 (566); tagged from TO 16384 -> 1486 and
    /// 562 octets at TO 16384 and 17870.
    #[test]
    fn rfc5041_examples() {
        let u = check(untagged(1), 2048, 1500);
        assert_eq!(u.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), [1482, 566]);
        assert!(matches!(u[1].0.addr, Addr::Untagged { mo: 1482, .. }));
        let t = check(tagged(16384), 2048, 1500);
        assert_eq!(t.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), [1486, 562]);
        assert!(matches!(t[1].0.addr, Addr::Tagged { to: 17870, .. }));
    }

    #[test]
    fn header_then_payload_parses() {
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let mut rebuilt = Vec::new();
        for (h, r) in cut(untagged(7), 3000, 1024) {
            let mut buf = [0xa5u8; 1024];
            let n = h.emit(&mut buf).unwrap();
            buf[n..n + r.len()].copy_from_slice(&data[r.clone()]);
            let seg = Segment::parse(&buf[..n + r.len()]).unwrap();
            assert_eq!(seg.header, h);
            rebuilt.extend_from_slice(seg.payload);
        }
        assert_eq!(rebuilt, data);
    }

    /// The smallest usable MULPDU: one payload octet per segment.
    #[test]
    fn one_octet_per_segment() {
        assert_eq!(check(tagged(0), 5, 15).len(), 5);
    }

    proptest! {
        /// Catalogue E.2: random MULPDUs from 32 B to 64 KiB reassemble.
        #[test]
        fn any_mulpdu_reassembles(len in 0usize..200_000, mulpdu in 32usize..65_536, to in any::<u32>(), tag in any::<bool>()) {
            let first = if tag { tagged(u64::from(to)) } else { untagged(to) };
            check(first, len, mulpdu);
        }
    }
}
