//! Tests of the MPA negotiation (`proto::mpa`): one per outcome, with Linux
//! siw's real frames from `lab/results/` where they exist. MPA has no
//! requirement IDs; each test cites RFC 5044 / RFC 6581 sections and the
//! catalogue's C.2 / C.3 items.

use super::*;
use crate::wire::cause::MPA_ERR_CRC;
use crate::wire::mpa::{KEY_REPLY, KEY_REQUEST};
use proptest::prelude::*;

/// `vm-lo-siw-rping.pcap` frame 4: siw's Request (Rev 2, S, IRD/ORD 1/1).
const SIW_REQUEST: [u8; 24] = *b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01";
/// Frame 6: siw's Reply.
const SIW_REPLY: [u8; 24] = *b"MPA ID Rep Frame\x10\x02\x00\x04\x00\x01\x00\x01";
/// `host-br0-mpa.pcap`: a Request with M set (0x90), IRD/ORD 16/16 ...
const MARKER_REQUEST: [u8; 24] = *b"MPA ID Req Frame\x90\x02\x00\x04\x00\x10\x00\x10";
/// ... and siw's rejection (R|S, IRD/ORD 0/0).
const SIW_MARKER_REJECT: [u8; 24] = *b"MPA ID Rep Frame\x30\x02\x00\x04\x00\x00\x00\x00";
/// Same capture: Rev 1 Request with PD "hello" and siw's Rev 1 Reply.
const REV1_HELLO: [u8; 25] = *b"MPA ID Req Frame\x00\x01\x00\x05hello";
const SIW_REV1_REPLY: [u8; 20] = *b"MPA ID Rep Frame\x00\x01\x00\x00";
/// Same capture: Rev 2 without S, and siw's answer in kind.
const REV2_PLAIN: [u8; 20] = *b"MPA ID Req Frame\x00\x02\x00\x00";
const SIW_REV2_PLAIN_REPLY: [u8; 20] = *b"MPA ID Rep Frame\x00\x02\x00\x00";
/// Same capture: the CRC probe (C|S, 16/16) and siw's Reply keeping C.
const CRC_REQUEST: [u8; 24] = *b"MPA ID Req Frame\x50\x02\x00\x04\x00\x10\x00\x10";
const SIW_CRC_REPLY: [u8; 24] = *b"MPA ID Rep Frame\x50\x02\x00\x04\x00\x10\x00\x10";

fn t0() -> Instant {
    Instant::now()
}

fn one_one() -> IrdOrd {
    IrdOrd { ird: 1, ord: 1 }
}

fn tx(m: &mut Mpa) -> Vec<u8> {
    let mut v = Vec::new();
    m.poll_transmit(&mut v);
    v
}

fn events(m: &mut Mpa) -> Vec<Event> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

fn negotiated(m: &mut Mpa) -> Negotiated {
    match events(m).as_slice() {
        [Event::Negotiated(n)] => n.clone(),
        other => panic!("expected Negotiated, got {other:?}"),
    }
}

fn request(m: &mut Mpa) -> ConnectRequest {
    match events(m).as_slice() {
        [Event::ConnectRequest(r)] => r.clone(),
        other => panic!("expected ConnectRequest, got {other:?}"),
    }
}

/// Feeds all of `bytes`, asserting every octet is consumed.
fn feed(m: &mut Mpa, now: Instant, bytes: &[u8]) -> Result<(), MpaError> {
    let n = m.handle_bytes(now, bytes)?;
    assert_eq!(n, bytes.len());
    Ok(())
}

/// Runs a whole negotiation between two of our endpoints, the frames cut
/// at `cut`; the Responder accepts with `resp_local`.
fn pair(
    icfg: MpaConfig,
    ilocal: IrdOrd,
    ipd: &[u8],
    rcfg: MpaConfig,
    rlocal: IrdOrd,
    rpd: &[u8],
    cut: usize,
) -> (Mpa, Mpa, Result<(), MpaError>) {
    let now = t0();
    let mut i = Mpa::initiator(now, icfg, ilocal, ipd).unwrap();
    let mut r = Mpa::responder(now, rcfg).unwrap();
    let req = tx(&mut i);
    let c = cut.min(req.len());
    feed(&mut r, now, &req[..c]).unwrap();
    if c < req.len() {
        assert!(r.poll_event().is_none());
    }
    feed(&mut r, now, &req[c..]).unwrap();
    let cr = request(&mut r);
    assert_eq!(cr.private_data, ipd);
    if let Err(e) = r.accept(rlocal, rpd) {
        return (i, r, Err(e));
    }
    let rep = tx(&mut r);
    let c = cut.min(rep.len());
    let res = feed(&mut i, now, &rep[..c]).and_then(|_| feed(&mut i, now, &rep[c..]));
    (i, r, res)
}

#[test]
fn initiator_default_request_is_siws() {
    // C.3 / peers §1.2: Rev 2, flags 0x10, PD = IRD/ORD + ULP data.
    let mut i = Mpa::initiator(t0(), MpaConfig::default(), one_one(), &[]).unwrap();
    assert_eq!(tx(&mut i), SIW_REQUEST);
    assert!(i.poll_transmit(&mut Vec::new()).is_none());
    let mut i = Mpa::initiator(t0(), MpaConfig::default(), one_one(), b"ulp").unwrap();
    let v = tx(&mut i);
    assert_eq!(&v[16..], b"\x10\x02\x00\x07\x00\x01\x00\x01ulp");
}

#[test]
fn responder_answers_siw_request_like_siw() {
    // RFC 5044 §7.1.2 rule 2, RFC 6581 §9.1; the Reply siw gave itself.
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &SIW_REQUEST).unwrap();
    let cr = request(&mut r);
    assert_eq!(cr.revision, Revision::V2);
    assert_eq!(
        cr.enhanced,
        Some(EnhancedData {
            ird: 1,
            ord: 1,
            p2p: false,
            rtr: RtrSet::EMPTY
        })
    );
    assert!(cr.private_data.is_empty() && !cr.crc && !cr.markers);
    assert!(tx(&mut r).is_empty());
    r.accept(one_one(), &[]).unwrap();
    assert_eq!(tx(&mut r), SIW_REPLY);
    let n = negotiated(&mut r);
    assert_eq!((n.ird, n.ord, n.rtr, n.p2p), (1, 1, None, false));
    assert!(n.must_wait_for_peer());
    assert_eq!(
        n.framing,
        Framing {
            crc: false,
            markers_tx: false,
            markers_rx: false
        }
    );
    assert!(r.is_established());
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn initiator_takes_siw_reply() {
    let now = t0();
    let mut i = Mpa::initiator(now, MpaConfig::default(), one_one(), &[]).unwrap();
    tx(&mut i);
    feed(&mut i, now, &SIW_REPLY).unwrap();
    let n = negotiated(&mut i);
    assert_eq!(n.role, Role::Initiator);
    assert!(n.enhanced && !n.must_wait_for_peer());
    assert_eq!((n.ird, n.ord), (1, 1));
    assert_eq!(
        n.peer,
        Some(EnhancedData {
            ird: 1,
            ord: 1,
            p2p: false,
            rtr: RtrSet::EMPTY
        })
    );
    assert_eq!(
        n.to_string(),
        "MPA rev 2 Initiator enhanced crc false markers tx false rx false ird 1 ord 1 peer-pd 0"
    );
}

#[test]
fn every_split_offset() {
    // C.2.4-style: the frames may arrive in any pieces.
    for cut in 0..=30 {
        let (mut i, mut r, res) = pair(
            MpaConfig::default(),
            IrdOrd { ird: 3, ord: 5 },
            b"hello",
            MpaConfig::default(),
            IrdOrd { ird: 7, ord: 2 },
            b"world!",
            cut,
        );
        res.unwrap();
        let ni = negotiated(&mut i);
        let nr = negotiated(&mut r);
        assert_eq!(ni.private_data, b"world!");
        assert_eq!(nr.private_data, b"hello");
        // Responder: ORD <= initiator IRD; Initiator: ORD <= responder IRD.
        assert_eq!((nr.ird, nr.ord), (7, 2));
        assert_eq!((ni.ird, ni.ord), (3, 5));
    }
}

#[test]
fn rdmap_str_01_consumes_exactly_the_frame() {
    // RDMAP-STR-01, RFC 5044 §7.1.2: what follows the frame is FPDU data,
    // left for the deframer.
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    let mut bytes = SIW_REQUEST.to_vec();
    bytes.extend_from_slice(&[0x00, 0x22, 0x41, 0x43]);
    assert_eq!(r.handle_bytes(now, &bytes), Ok(24));
    assert_eq!(r.handle_bytes(now, &bytes[24..]), Ok(0));
    let mut i = Mpa::initiator(now, MpaConfig::default(), one_one(), &[]).unwrap();
    let mut bytes = SIW_REPLY.to_vec();
    bytes.push(0);
    assert_eq!(i.handle_bytes(now, &bytes[..10]), Ok(10));
    assert_eq!(i.handle_bytes(now, &bytes[10..]), Ok(14));
    assert!(i.is_established());
    assert_eq!(i.handle_bytes(now, &bytes[24..]), Ok(0));
}

#[test]
fn rev1_negotiation_against_siw_frames() {
    // RFC 5044 only: no S, no IRD/ORD; the Reply carries the Request's Rev.
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &REV1_HELLO).unwrap();
    let cr = request(&mut r);
    assert_eq!(
        (cr.revision, cr.enhanced, &cr.private_data[..]),
        (Revision::V1, None, &b"hello"[..])
    );
    r.accept(IrdOrd { ird: 4, ord: 4 }, &[]).unwrap();
    assert_eq!(tx(&mut r), SIW_REV1_REPLY);
    let n = negotiated(&mut r);
    assert!(!n.enhanced && n.peer.is_none());
    assert_eq!((n.ird, n.ord), (4, 4));
    // Our Rev 1 Initiator sends the same octets siw's probe did.
    let cfg = MpaConfig {
        revision: 1,
        enhanced: false,
        ..MpaConfig::default()
    };
    let mut i = Mpa::initiator(now, cfg, one_one(), b"hello").unwrap();
    assert_eq!(tx(&mut i), REV1_HELLO);
    feed(&mut i, now, &SIW_REV1_REPLY).unwrap();
    let n = negotiated(&mut i);
    assert_eq!((n.revision, n.enhanced), (Revision::V1, false));
}

#[test]
fn rev2_without_enhanced_flag() {
    // RFC 6581 §10: unenhanced Request -> unenhanced Reply.
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &REV2_PLAIN).unwrap();
    assert_eq!(request(&mut r).enhanced, None);
    r.accept(one_one(), &[]).unwrap();
    assert_eq!(tx(&mut r), SIW_REV2_PLAIN_REPLY);
    let cfg = MpaConfig {
        enhanced: false,
        ..MpaConfig::default()
    };
    let mut i = Mpa::initiator(now, cfg, one_one(), &[]).unwrap();
    assert_eq!(tx(&mut i), REV2_PLAIN);
    feed(&mut i, now, &SIW_REV2_PLAIN_REPLY).unwrap();
    assert!(!negotiated(&mut i).enhanced);
}

#[test]
fn rev0_accepted_like_siw_unless_configured() {
    let now = t0();
    let rev0 = *b"MPA ID Req Frame\x00\x00\x00\x00";
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &rev0).unwrap();
    r.accept(one_one(), &[]).unwrap();
    assert_eq!(tx(&mut r), *b"MPA ID Rep Frame\x00\x00\x00\x00");
    let mut r = Mpa::responder(
        now,
        MpaConfig {
            accept_rev0: false,
            ..MpaConfig::default()
        },
    )
    .unwrap();
    assert_eq!(r.handle_bytes(now, &rev0), Err(MpaError::BadRevision(Revision::V0)));
}

#[test]
fn bad_revision() {
    // RFC 5044 §7.1.1 "Rev": close if we cannot interoperate.
    let now = t0();
    let mut b = SIW_REQUEST;
    b[17] = 3;
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    // Refused as soon as the header is in, before the private data.
    assert_eq!(
        r.handle_bytes(now, &b[..20]),
        Err(MpaError::BadRevision(Revision::Unknown(3)))
    );
    assert_eq!(
        r.handle_bytes(now, &b[20..]),
        Err(MpaError::BadRevision(Revision::Unknown(3)))
    );
    assert_eq!(r.error().unwrap().cause(), MPA_ERR_INVALID_REQ_REP);
    assert!(tx(&mut r).is_empty());
    // A Rev-1-only Responder refuses Rev 2.
    let mut r = Mpa::responder(
        now,
        MpaConfig {
            revision: 1,
            ..MpaConfig::default()
        },
    )
    .unwrap();
    assert_eq!(
        r.handle_bytes(now, &SIW_REQUEST),
        Err(MpaError::BadRevision(Revision::V2))
    );
    // A Reply with a higher revision than the Request.
    let cfg = MpaConfig {
        revision: 1,
        enhanced: false,
        ..MpaConfig::default()
    };
    let mut i = Mpa::initiator(now, cfg, one_one(), &[]).unwrap();
    assert_eq!(
        i.handle_bytes(now, &SIW_REV2_PLAIN_REPLY),
        Err(MpaError::BadRevision(Revision::V2))
    );
}

#[test]
fn bad_key_refused_early() {
    // RFC 5044 §7.1.2 rule 5: a non-MPA peer is refused on its first octet
    // that cannot be part of the key.
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    let e = r.handle_bytes(now, b"GET / HTTP/1.1\r\n").unwrap_err();
    assert_eq!(e, MpaError::Frame(mpa::Error::BadKey));
    assert_eq!(e.cause(), MPA_ERR_INVALID_REQ_REP);
    assert_eq!(r.handle_bytes(now, b"x"), Err(e));
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    assert_eq!(r.handle_bytes(now, b"MPA ID Req"), Ok(10));
    assert!(r.handle_bytes(now, b" Fram_").is_err());
}

#[test]
fn initiator_initiator_and_responder_responder() {
    // RFC 5044 §7.1.2 rule 8: the key tells Request from Reply.
    let now = t0();
    let mut i = Mpa::initiator(now, MpaConfig::default(), one_one(), &[]).unwrap();
    assert_eq!(i.handle_bytes(now, &KEY_REQUEST[..15]), Ok(15));
    assert_eq!(
        i.handle_bytes(now, &SIW_REQUEST[15..]),
        Err(MpaError::UnexpectedFrame {
            expected: FrameKind::Reply,
            got: FrameKind::Request
        })
    );
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    assert_eq!(
        r.handle_bytes(now, &KEY_REPLY),
        Err(MpaError::UnexpectedFrame {
            expected: FrameKind::Request,
            got: FrameKind::Reply
        })
    );
}

#[test]
fn sec_dos_05_private_data_too_long_from_peer() {
    // SEC-DOS-05.
    // RFC 5044 §7.1.1 "PD_Length" and §7.1.2 rule 9: refused at the header,
    // before buffering any private data; the siw limit is configurable.
    let now = t0();
    let mut b = SIW_REQUEST;
    b[18..20].copy_from_slice(&513u16.to_be_bytes());
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    let e = r.handle_bytes(now, &b).unwrap_err();
    assert_eq!(
        e,
        MpaError::Frame(mpa::Error::PrivateDataTooLong { len: 513, max: 512 })
    );
    let mut b = SIW_REQUEST;
    b[18..20].copy_from_slice(&257u16.to_be_bytes());
    let mut r = Mpa::responder(now, MpaConfig::siw()).unwrap();
    assert_eq!(
        r.handle_bytes(now, &b),
        Err(MpaError::Frame(mpa::Error::PrivateDataTooLong { len: 257, max: 256 }))
    );
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    assert_eq!(r.handle_bytes(now, &b), Ok(24));
}

#[test]
fn private_data_too_long_locally() {
    // RFC 6581 §7: "Private Data length MUST NOT exceed 512 bytes in any
    // message, including enhanced RDMA connection establishment data".
    let now = t0();
    let e = Mpa::initiator(now, MpaConfig::default(), one_one(), &[0; 509]).unwrap_err();
    assert_eq!(e, MpaError::PrivateDataTooLong { len: 513, max: 512 });
    assert!(e.is_local());
    assert!(Mpa::initiator(now, MpaConfig::default(), one_one(), &[0; 508]).is_ok());
    assert!(Mpa::initiator(now, MpaConfig::siw(), one_one(), &[0; 253]).is_err());
    // accept() with too much: not sticky, a shorter PD then works.
    let mut r = Mpa::responder(now, MpaConfig::siw()).unwrap();
    feed(&mut r, now, &SIW_REQUEST).unwrap();
    assert_eq!(
        r.accept(one_one(), &[0; 253]),
        Err(MpaError::PrivateDataTooLong { len: 257, max: 256 })
    );
    assert!(r.error().is_none());
    assert!(tx(&mut r).is_empty());
    r.accept(one_one(), &[0; 252]).unwrap();
    assert_eq!(tx(&mut r).len(), 20 + 256);
}

#[test]
fn truncated_enhanced_block() {
    // RFC 6581 §6: S with Rev 2 and PD_Length < 4.
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    let b = *b"MPA ID Req Frame\x10\x02\x00\x02\x00\x01";
    assert_eq!(
        r.handle_bytes(now, &b),
        Err(MpaError::Frame(mpa::Error::EnhancedDataTruncated { pd_len: 2 }))
    );
}

#[test]
fn crc_if_either_side_asks() {
    // RFC 5044 §7.1.1 "C", C.2.3; siw's Reply keeps the Request's C.
    for (ic, rc) in [(false, false), (true, false), (false, true), (true, true)] {
        let (mut i, mut r, res) = pair(
            MpaConfig {
                crc: ic,
                ..MpaConfig::default()
            },
            one_one(),
            &[],
            MpaConfig {
                crc: rc,
                ..MpaConfig::default()
            },
            one_one(),
            &[],
            7,
        );
        res.unwrap();
        assert_eq!(negotiated(&mut i).framing.crc, ic || rc);
        assert_eq!(negotiated(&mut r).framing.crc, ic || rc);
    }
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &CRC_REQUEST).unwrap();
    assert!(request(&mut r).crc);
    r.accept(IrdOrd { ird: 16, ord: 16 }, &[]).unwrap();
    assert_eq!(tx(&mut r), SIW_CRC_REPLY);
}

#[test]
fn markers_per_direction() {
    // RFC 5044 §7.1.1 "M": M in a frame = its sender wants markers in what
    // it receives; the other side inserts them (C.2.3).
    let m = MpaConfig {
        require_markers: true,
        ..MpaConfig::default()
    };
    let (mut i, mut r, res) = pair(m.clone(), one_one(), &[], MpaConfig::default(), one_one(), &[], 3);
    res.unwrap();
    let fi = negotiated(&mut i).framing;
    let fr = negotiated(&mut r).framing;
    assert_eq!((fi.markers_tx, fi.markers_rx), (false, true));
    assert_eq!((fr.markers_tx, fr.markers_rx), (true, false));
    assert!(fr.framer().markers() && !fi.framer().markers());
    let (mut i, mut r, res) = pair(MpaConfig::default(), one_one(), &[], m, one_one(), &[], 3);
    res.unwrap();
    assert!(negotiated(&mut i).framing.markers_tx);
    assert!(negotiated(&mut r).framing.markers_rx);
}

#[test]
fn markers_refused_like_siw() {
    // peers §1.2: siw answers M=1 with R=1 (flags 0x30, IRD/ORD 0/0).
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::siw()).unwrap();
    assert_eq!(r.handle_bytes(now, &MARKER_REQUEST), Err(MpaError::MarkersRequired));
    assert_eq!(tx(&mut r), SIW_MARKER_REJECT);
    assert!(r.poll_event().is_none());
    // An Initiator configured like siw fails on a Reply with M=1.
    let mut i = Mpa::initiator(now, MpaConfig::siw(), one_one(), &[]).unwrap();
    let mut rep = SIW_REPLY;
    rep[16] |= 0x80;
    assert_eq!(i.handle_bytes(now, &rep), Err(MpaError::MarkersRequired));
    assert_eq!(i.terminate_to_send(), None);
    // By default we support markers.
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &MARKER_REQUEST).unwrap();
    assert!(request(&mut r).markers);
}

#[test]
fn reject_with_private_data() {
    // RFC 5044 §7.1.2 rules 2/3 and 6: R=1 with ULP private data.
    let now = t0();
    let mut i = Mpa::initiator(now, MpaConfig::default(), one_one(), b"hi").unwrap();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &tx(&mut i)).unwrap();
    request(&mut r);
    r.reject(b"go away").unwrap();
    assert!(r.is_rejected());
    assert!(r.poll_event().is_none());
    let rep = tx(&mut r);
    assert_eq!(&rep[16..24], b"\x30\x02\x00\x0b\x00\x00\x00\x00");
    feed(&mut i, now, &rep).unwrap();
    match events(&mut i).as_slice() {
        [Event::Rejected(rj)] => {
            assert_eq!(rj.private_data, b"go away");
            assert_eq!(rj.enhanced, Some(EnhancedData::default()));
        }
        other => panic!("{other:?}"),
    }
    assert!(i.is_rejected());
    assert_eq!(i.poll_timeout(), None);
    // Rev 1 reject: no IRD/ORD block.
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &REV1_HELLO).unwrap();
    r.reject(b"no").unwrap();
    assert_eq!(tx(&mut r), *b"MPA ID Rep Frame\x20\x01\x00\x02no");
}

#[test]
fn enhanced_mismatch() {
    // RFC 6581 §10.
    let now = t0();
    let mut r = Mpa::responder(
        now,
        MpaConfig {
            enhanced: false,
            ..MpaConfig::default()
        },
    )
    .unwrap();
    assert_eq!(r.handle_bytes(now, &SIW_REQUEST), Err(MpaError::EnhancedMismatch));
    assert!(tx(&mut r).is_empty());
    let mut i = Mpa::initiator(now, MpaConfig::default(), one_one(), &[]).unwrap();
    assert_eq!(
        i.handle_bytes(now, &SIW_REV2_PLAIN_REPLY),
        Err(MpaError::EnhancedMismatch)
    );
}

#[test]
fn ird_ord_responder_lowers_ord() {
    // RFC 6581 §9.1: "The responder MUST set its ORD at most to the
    // initiator IRD"; the Initiator keeps IRD >= responder ORD.
    let (mut i, mut r, res) = pair(
        MpaConfig::default(),
        IrdOrd { ird: 4, ord: 8 },
        &[],
        MpaConfig::default(),
        IrdOrd { ird: 16, ord: 32 },
        &[],
        99,
    );
    res.unwrap();
    let nr = negotiated(&mut r);
    assert_eq!((nr.ird, nr.ord), (16, 4));
    let ni = negotiated(&mut i);
    assert_eq!((ni.ird, ni.ord), (4, 8));
    assert_eq!(ni.peer.map(|p| (p.ird, p.ord)), Some((16, 4)));
}

#[test]
fn ird_ord_initiator_lowers_ord_to_responder_ird() {
    // "its ORD at most to the responder IRD".
    let (mut i, _, res) = pair(
        MpaConfig::default(),
        IrdOrd { ird: 4, ord: 8 },
        &[],
        MpaConfig::default(),
        IrdOrd { ird: 2, ord: 2 },
        &[],
        99,
    );
    res.unwrap();
    let ni = negotiated(&mut i);
    assert_eq!((ni.ird, ni.ord), (4, 2));
}

fn reply_with(e: EnhancedData) -> Vec<u8> {
    let mut v = Vec::new();
    Repr::enhanced(FrameKind::Reply, e, &[]).emit_vec(&mut v).unwrap();
    v
}

#[test]
fn ird_ord_insufficient_at_initiator() {
    // RFC 6581 §9.1: a Responder ORD above our IRD -> TERM 0x06
    // (C.2.7 "insufficient IRD"), sent with the negotiated framing.
    let now = t0();
    let cfg = MpaConfig {
        crc: true,
        ..MpaConfig::default()
    };
    let mut i = Mpa::initiator(now, cfg, IrdOrd { ird: 2, ord: 2 }, &[]).unwrap();
    let e = i
        .handle_bytes(
            now,
            &reply_with(EnhancedData {
                ird: 2,
                ord: 3,
                ..Default::default()
            }),
        )
        .unwrap_err();
    assert!(matches!(
        e,
        MpaError::InsufficientIrd {
            peer_ord: 3,
            ird: 2,
            ..
        }
    ));
    assert_eq!(e.cause(), MPA_ERR_INSUFFICIENT_IRD);
    let (cause, framing) = i.terminate_to_send().unwrap();
    assert_eq!(cause, MPA_ERR_INSUFFICIENT_IRD);
    assert!(framing.crc);
    assert!(i.poll_event().is_none());
    // Strict: a peer IRD below our required ORD also fails.
    let cfg = MpaConfig {
        required_ord: 4,
        ..MpaConfig::default()
    };
    let mut i = Mpa::initiator(now, cfg, IrdOrd { ird: 2, ord: 8 }, &[]).unwrap();
    let e = i
        .handle_bytes(
            now,
            &reply_with(EnhancedData {
                ird: 3,
                ord: 0,
                ..Default::default()
            }),
        )
        .unwrap_err();
    assert_eq!(e.cause(), MPA_ERR_INSUFFICIENT_IRD);
}

#[test]
fn ird_ord_relaxed_initiator_like_siw() {
    // peers §1.4: siw raises its IRD up to the device maximum.
    let now = t0();
    let cfg = MpaConfig {
        relaxed_ird: true,
        max_ird: 16,
        ..MpaConfig::default()
    };
    let mut i = Mpa::initiator(now, cfg.clone(), IrdOrd { ird: 2, ord: 2 }, &[]).unwrap();
    feed(
        &mut i,
        now,
        &reply_with(EnhancedData {
            ird: 2,
            ord: 16,
            ..Default::default()
        }),
    )
    .unwrap();
    assert_eq!(negotiated(&mut i).ird, 16);
    let mut i = Mpa::initiator(now, cfg, IrdOrd { ird: 2, ord: 2 }, &[]).unwrap();
    let e = i.handle_bytes(
        now,
        &reply_with(EnhancedData {
            ird: 2,
            ord: 17,
            ..Default::default()
        }),
    );
    assert!(matches!(e, Err(MpaError::InsufficientIrd { .. })));
}

#[test]
fn ird_ord_responder_rejects_when_peer_ird_short() {
    // RFC 6581 §9.1: "The responder MAY reject ... and specify the
    // required ORD in the MPA Reject Frame responder ORD".
    let rcfg = MpaConfig {
        required_ord: 4,
        ..MpaConfig::default()
    };
    let (mut i, r, res) = pair(
        MpaConfig::default(),
        IrdOrd { ird: 1, ord: 1 },
        &[],
        rcfg,
        IrdOrd { ird: 8, ord: 8 },
        b"need 4",
        0,
    );
    assert!(matches!(res, Err(MpaError::InsufficientIrd { peer_ird: 1, .. })));
    assert_eq!(r.error().unwrap().cause(), MPA_ERR_INSUFFICIENT_IRD);
    // The reject went out; the Initiator learns the required ORD.
    let mut r = r;
    let rep = tx(&mut r);
    assert_eq!(&rep[16..], b"\x30\x02\x00\x0a\x00\x08\x00\x04need 4");
    feed(&mut i, t0(), &rep).unwrap();
    match events(&mut i).as_slice() {
        [Event::Rejected(rj)] => assert_eq!(rj.enhanced.unwrap().ord, 4),
        other => panic!("{other:?}"),
    }
    // siw's relaxed mode lowers instead of rejecting.
    let rcfg = MpaConfig {
        required_ord: 4,
        relaxed_ird: true,
        ..MpaConfig::default()
    };
    let (_, mut r, res) = pair(
        MpaConfig::default(),
        one_one(),
        &[],
        rcfg,
        IrdOrd { ird: 8, ord: 8 },
        &[],
        0,
    );
    res.unwrap();
    assert_eq!(negotiated(&mut r).ord, 1);
}

#[test]
fn ird_ord_relaxed_responder_raises_ird() {
    // peers §1.4 (siw responder): raise IRD to the Initiator's ORD.
    let rcfg = MpaConfig {
        relaxed_ird: true,
        max_ird: 128,
        ..MpaConfig::default()
    };
    let (mut i, mut r, res) = pair(
        MpaConfig::default(),
        IrdOrd { ird: 4, ord: 20 },
        &[],
        rcfg,
        IrdOrd { ird: 2, ord: 2 },
        &[],
        5,
    );
    res.unwrap();
    assert_eq!(negotiated(&mut r).ird, 20);
    assert_eq!(negotiated(&mut i).ord, 20);
}

#[test]
fn ird_ord_no_negotiation_value() {
    // RFC 6581 §9.1: 0x3FFF leaves local values and is echoed.
    let (mut i, mut r, res) = pair(
        MpaConfig::default(),
        IrdOrd {
            ird: 0x3FFF,
            ord: 0x3FFF,
        },
        &[],
        MpaConfig::default(),
        IrdOrd { ird: 5, ord: 6 },
        &[],
        9,
    );
    res.unwrap();
    let nr = negotiated(&mut r);
    assert_eq!((nr.ird, nr.ord), (5, 6));
    let ni = negotiated(&mut i);
    assert_eq!(ni.peer.map(|p| (p.ird, p.ord)), Some((0x3FFF, 0x3FFF)));
    assert_eq!((ni.ird, ni.ord), (0x3FFF, 0x3FFF));
}

#[test]
fn ird_ord_out_of_range_params() {
    let now = t0();
    let e = Mpa::initiator(now, MpaConfig::default(), IrdOrd { ird: 0x4000, ord: 0 }, &[]).unwrap_err();
    assert!(matches!(e, MpaError::InvalidParam(_)));
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &SIW_REQUEST).unwrap();
    assert!(r.accept(IrdOrd { ird: 1, ord: 0xFFFF }, &[]).unwrap_err().is_local());
    assert!(r.accept(one_one(), &[]).is_ok());
}

fn p2p(offer: RtrSet) -> MpaConfig {
    MpaConfig {
        p2p: true,
        rtr_offer: offer,
        ..MpaConfig::default()
    }
}

fn p2p_pair(offer: RtrSet, support: RtrSet, il: IrdOrd, rl: IrdOrd) -> (Mpa, Mpa, Result<(), MpaError>) {
    let rcfg = MpaConfig {
        rtr_support: support,
        ..MpaConfig::default()
    };
    pair(p2p(offer), il, &[], rcfg, rl, &[], 11)
}

#[test]
fn rtr_write_preferred_like_siw() {
    // RFC 6581 §9.2; siw offers Write|Read and a siw-like Responder picks
    // Write and echoes A (zrlio/softiwarp#18).
    let now = t0();
    let mut i = Mpa::initiator(now, p2p(RtrSet::WRITE.union(RtrSet::READ)), one_one(), &[]).unwrap();
    let req = tx(&mut i);
    assert_eq!(&req[16..], b"\x10\x02\x00\x04\x80\x01\xc0\x01");
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, &req).unwrap();
    request(&mut r);
    r.accept(one_one(), &[]).unwrap();
    let rep = tx(&mut r);
    assert_eq!(&rep[16..], b"\x10\x02\x00\x04\x80\x01\x80\x01");
    let nr = negotiated(&mut r);
    assert_eq!(
        (nr.p2p, nr.rtr_to_receive(), nr.rtr_to_send()),
        (true, Some(Rtr::Write), None)
    );
    feed(&mut i, now, &rep).unwrap();
    let ni = negotiated(&mut i);
    assert_eq!(
        (ni.p2p, ni.rtr_to_send(), ni.rtr_to_receive()),
        (true, Some(Rtr::Write), None)
    );
    assert!(ni.to_string().ends_with("peer2peer rtr write peer-pd 0"));
}

#[test]
fn rtr_read_raises_responder_ird() {
    // RFC 6581 §9.1 example: Initiator ORD 0 + Read RTR -> Responder IRD 1;
    // siw forces a P2P Initiator's ORD to 1 when Read is offered.
    let (mut i, mut r, res) = p2p_pair(
        RtrSet::READ,
        RtrSet::ALL,
        IrdOrd { ird: 0, ord: 0 },
        IrdOrd { ird: 0, ord: 0 },
    );
    res.unwrap();
    let nr = negotiated(&mut r);
    assert_eq!((nr.rtr, nr.ird), (Some(Rtr::Read), 1));
    let ni = negotiated(&mut i);
    assert_eq!((ni.rtr, ni.ord), (Some(Rtr::Read), 1));
}

#[test]
fn rtr_send() {
    let (mut i, mut r, res) = p2p_pair(RtrSet::SEND, RtrSet::ALL, one_one(), one_one());
    res.unwrap();
    assert_eq!(negotiated(&mut r).rtr, Some(Rtr::Send));
    assert_eq!(negotiated(&mut i).rtr, Some(Rtr::Send));
}

#[test]
fn rtr_responder_read_when_write_not_offered() {
    let (mut i, mut r, res) = p2p_pair(RtrSet::READ.union(RtrSet::SEND), RtrSet::ALL, one_one(), one_one());
    res.unwrap();
    assert_eq!(negotiated(&mut r).rtr, Some(Rtr::Read));
    assert_eq!(negotiated(&mut i).rtr, Some(Rtr::Read));
}

#[test]
fn rtr_no_match() {
    // RFC 6581 §9.2: the Responder proposes what it supports; the Initiator
    // cannot generate it -> TERM 0x07 (C.2.7).
    let (i, mut r, res) = p2p_pair(RtrSet::WRITE, RtrSet::READ, one_one(), one_one());
    assert!(matches!(res, Err(MpaError::NoMatchingRtr { .. })));
    assert_eq!(negotiated(&mut r).rtr, Some(Rtr::Read));
    assert_eq!(i.terminate_to_send().map(|t| t.0), Some(MPA_ERR_NO_MATCHING_RTR));
    assert_eq!(i.error().unwrap().cause(), MPA_ERR_NO_MATCHING_RTR);
}

#[test]
fn rtr_reply_without_p2p_echo() {
    // RFC 6581 §9.2: "the responder MUST set Control Flag A to 1".
    let now = t0();
    let mut i = Mpa::initiator(now, p2p(RtrSet::ALL), one_one(), &[]).unwrap();
    let e = i.handle_bytes(now, &SIW_REPLY).unwrap_err();
    assert!(matches!(e, MpaError::NoMatchingRtr { .. }));
    // A Read RTR cannot be used if the Responder's IRD is 0.
    let mut i = Mpa::initiator(now, p2p(RtrSet::READ), one_one(), &[]).unwrap();
    let rep = reply_with(EnhancedData {
        ird: 0,
        ord: 1,
        p2p: true,
        rtr: RtrSet::READ,
    });
    assert!(matches!(i.handle_bytes(now, &rep), Err(MpaError::NoMatchingRtr { .. })));
}

#[test]
fn rtr_flags_ignored_without_p2p() {
    // RFC 6581 §9.2: "if Control Flag A is set to 0, then Control Flags B,
    // C, and D MUST be ignored".
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    feed(&mut r, now, b"MPA ID Req Frame\x10\x02\x00\x04\x40\x01\xc0\x01").unwrap();
    assert!(!request(&mut r).enhanced.unwrap().p2p);
    r.accept(one_one(), &[]).unwrap();
    assert_eq!(&tx(&mut r)[16..], b"\x10\x02\x00\x04\x00\x01\x00\x01");
    assert_eq!(negotiated(&mut r).rtr, None);
}

#[test]
fn check_rtr_each_type() {
    // RFC 6581 §9.2: zero-length Send (untagged), Write (tagged), Read
    // Request (untagged, RDMA Read Message Size 0); else 0x07.
    assert_eq!(check_rtr(Rtr::Send, 3, false, 0), Ok(()));
    assert_eq!(check_rtr(Rtr::Send, 5, false, 0), Ok(()));
    assert_eq!(check_rtr(Rtr::Write, 0, true, 0), Ok(()));
    assert_eq!(check_rtr(Rtr::Read, 1, false, 0), Ok(()));
    for (rtr, op, tagged, len) in [
        (Rtr::Send, 3, false, 1),
        (Rtr::Send, 0, true, 0),
        (Rtr::Write, 0, false, 0),
        (Rtr::Write, 0, true, 8),
        (Rtr::Read, 1, false, 64),
        (Rtr::Read, 3, false, 0),
        (Rtr::Write, 1, false, 0),
    ] {
        assert_eq!(
            check_rtr(rtr, op, tagged, len),
            Err(MPA_ERR_NO_MATCHING_RTR),
            "{rtr} {op}"
        );
    }
}

#[test]
fn timeout_initiator_reply_5s() {
    // RFC 5044 §7.1.2 rule 10; siw MPAREP_TIMEOUT.
    let now = t0();
    let mut i = Mpa::initiator(now, MpaConfig::default(), one_one(), &[]).unwrap();
    assert_eq!(i.poll_timeout(), Some(now + Duration::from_secs(5)));
    assert_eq!(i.handle_timeout(now + Duration::from_millis(4999)), Ok(()));
    feed(&mut i, now, &SIW_REPLY[..5]).unwrap();
    let e = i.handle_timeout(now + Duration::from_secs(5)).unwrap_err();
    assert_eq!(e, MpaError::TimedOut(Waiting::Reply));
    assert_eq!(e.cause(), MPA_ERR_CONNECTION_LOST);
    assert_eq!(i.poll_timeout(), None);
    assert_eq!(i.handle_bytes(now, &SIW_REPLY[5..]), Err(e.clone()));
    assert_eq!(i.handle_timeout(now + Duration::from_secs(9)), Err(e));
}

#[test]
fn timeout_responder_request_10s() {
    // RFC 5044 §7.1.2 rule 8; siw MPAREQ_TIMEOUT.
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    assert_eq!(r.poll_timeout(), Some(now + Duration::from_secs(10)));
    assert_eq!(
        r.handle_timeout(now + Duration::from_secs(10)),
        Err(MpaError::TimedOut(Waiting::Request))
    );
    // Configurable, and no timer after the Request by default.
    let cfg = MpaConfig {
        request_timeout: Duration::from_millis(100),
        ..MpaConfig::default()
    };
    let mut r = Mpa::responder(now, cfg).unwrap();
    assert_eq!(r.poll_timeout(), Some(now + Duration::from_millis(100)));
    feed(&mut r, now, &SIW_REQUEST).unwrap();
    assert_eq!(r.poll_timeout(), None);
    assert_eq!(r.handle_timeout(now + Duration::from_secs(100)), Ok(()));
}

#[test]
fn sec_dos_06_stalled_request_times_out() {
    // SEC-DOS-06: a peer sends 10 octets of a Request and stalls.
    let now = t0();
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    let later = now + Duration::from_secs(3);
    feed(&mut r, later, &SIW_REQUEST[..10]).unwrap();
    // The timer runs from the start of the wait, not from the last octet.
    assert_eq!(r.poll_timeout(), Some(now + Duration::from_secs(10)));
    assert_eq!(
        r.handle_timeout(now + Duration::from_secs(10)),
        Err(MpaError::TimedOut(Waiting::Request))
    );
    assert!(tx(&mut r).is_empty());
}

#[test]
fn timeout_responder_decision() {
    let now = t0();
    let cfg = MpaConfig {
        accept_timeout: Some(Duration::from_secs(2)),
        ..MpaConfig::default()
    };
    let mut r = Mpa::responder(now, cfg).unwrap();
    let later = now + Duration::from_secs(1);
    feed(&mut r, later, &SIW_REQUEST).unwrap();
    assert_eq!(r.poll_timeout(), Some(later + Duration::from_secs(2)));
    assert_eq!(
        r.handle_timeout(later + Duration::from_secs(2)),
        Err(MpaError::TimedOut(Waiting::Decision))
    );
    assert!(r.accept(one_one(), &[]).is_err());
}

#[test]
fn api_misuse() {
    let now = t0();
    let mut i = Mpa::initiator(now, MpaConfig::default(), one_one(), &[]).unwrap();
    assert!(matches!(i.accept(one_one(), &[]), Err(MpaError::InvalidState(_))));
    assert!(matches!(i.reject(&[]), Err(MpaError::InvalidState(_))));
    let mut r = Mpa::responder(now, MpaConfig::default()).unwrap();
    assert!(matches!(r.accept(one_one(), &[]), Err(MpaError::InvalidState(_))));
    feed(&mut r, now, &SIW_REQUEST).unwrap();
    r.accept(one_one(), &[]).unwrap();
    assert!(matches!(r.reject(&[]), Err(MpaError::InvalidState(_))));
    for bad in [
        MpaConfig {
            revision: 3,
            ..MpaConfig::default()
        },
        MpaConfig {
            revision: 1,
            ..MpaConfig::default()
        },
        MpaConfig {
            p2p: true,
            enhanced: false,
            ..MpaConfig::default()
        },
        MpaConfig {
            p2p: true,
            rtr_offer: RtrSet::EMPTY,
            ..MpaConfig::default()
        },
    ] {
        assert!(Mpa::initiator(now, bad, one_one(), &[]).is_err());
    }
}

#[test]
fn framing_builds_working_framer_and_deframer() {
    // The result plugs into wire::fpdu: markers one way, CRC both ways.
    let m = MpaConfig {
        require_markers: true,
        crc: true,
        ..MpaConfig::default()
    };
    let (mut i, mut r, res) = pair(m, one_one(), &[], MpaConfig::default(), one_one(), &[], 1);
    res.unwrap();
    let fi = negotiated(&mut i).framing;
    let fr = negotiated(&mut r).framing;
    let mut stream = Vec::new();
    let mut framer = fr.framer();
    framer.emit_vec(&[9u8; 700], &mut stream).unwrap();
    let mut d = fi.deframer(u16::MAX);
    assert_eq!(d.next_fpdu(&stream).unwrap().1.unwrap(), &[9u8; 700][..]);
    stream[100] ^= 1;
    let mut d = fi.deframer(u16::MAX);
    assert_eq!(d.next_fpdu(&stream).unwrap_err().cause(), MPA_ERR_CRC);
}

proptest! {
    /// SEC-ROB-01 / SEC-DOS-05: any peer octets, any pieces, either role.
    #[test]
    fn arbitrary_peer_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        cuts in proptest::collection::vec(0usize..600, 0..6),
        responder in any::<bool>(), prefix in any::<bool>(),
    ) {
        let now = t0();
        let mut m = if responder {
            Mpa::responder(now, MpaConfig::default()).unwrap()
        } else {
            Mpa::initiator(now, p2p(RtrSet::ALL), one_one(), &[]).unwrap()
        };
        // Half the time, start with a valid key so the fuzz gets deeper.
        let mut input = Vec::new();
        if prefix {
            input.extend_from_slice(if responder { &KEY_REQUEST } else { &KEY_REPLY });
        }
        input.extend_from_slice(&bytes);
        let mut bounds: Vec<usize> = cuts.into_iter().filter(|c| *c <= input.len()).collect();
        bounds.sort_unstable();
        bounds.push(input.len());
        let mut last = 0;
        for b in bounds {
            match m.handle_bytes(now, &input[last..b]) {
                Ok(n) => prop_assert!(n <= b - last),
                Err(_) => break,
            }
            last = b;
        }
        if let Some(Event::ConnectRequest(_)) = m.poll_event() {
            let _ = m.accept(one_one(), b"x");
        }
        let _ = m.handle_timeout(now + Duration::from_secs(60));
        prop_assert!(m.poll_transmit(&mut Vec::new()).unwrap_or(0) <= mpa::MAX_FRAME_LEN);
    }

    #[test]
    fn negotiation_invariants(
        iird in 0u16..40, iord in 0u16..40, rird in 0u16..40, rord in 0u16..40,
        offer in 1u8..8, support in 1u8..8, relaxed in any::<bool>(), cut in 0usize..40,
    ) {
        // RFC 6581 §9.1: after success, initiator ORD <= responder IRD and
        // responder ORD <= initiator IRD, on both ends' books.
        let offer = [RtrSet::EMPTY, RtrSet::SEND, RtrSet::WRITE, RtrSet::SEND.union(RtrSet::WRITE), RtrSet::READ,
            RtrSet::READ.union(RtrSet::SEND), RtrSet::READ.union(RtrSet::WRITE), RtrSet::ALL][usize::from(offer)];
        let support = [RtrSet::EMPTY, RtrSet::SEND, RtrSet::WRITE, RtrSet::SEND.union(RtrSet::WRITE), RtrSet::READ,
            RtrSet::READ.union(RtrSet::SEND), RtrSet::READ.union(RtrSet::WRITE), RtrSet::ALL][usize::from(support)];
        let icfg = MpaConfig { relaxed_ird: relaxed, ..p2p(offer) };
        let rcfg = MpaConfig { relaxed_ird: relaxed, rtr_support: support, ..MpaConfig::default() };
        let (mut i, mut r, res) =
            pair(icfg, IrdOrd { ird: iird, ord: iord }, &[], rcfg, IrdOrd { ird: rird, ord: rord }, &[], cut);
        let nr = negotiated(&mut r);
        if res.is_ok() {
            let ni = negotiated(&mut i);
            prop_assert!(ni.ord <= nr.ird);
            prop_assert!(nr.ord <= ni.ird);
            prop_assert_eq!(ni.rtr, nr.rtr);
            let rtr = ni.rtr.unwrap();
            prop_assert!(offer.contains(rtr) && support.contains(rtr));
            if rtr == Rtr::Read {
                prop_assert!(ni.ord >= 1 && nr.ird >= 1);
            }
        } else {
            // Between two of our endpoints only the RTR choice can fail.
            prop_assert!(matches!(res, Err(MpaError::NoMatchingRtr { .. })), "{:?}", res);
            prop_assert!(offer.intersection(support).is_empty());
            prop_assert!(i.terminate_to_send().is_some());
        }
    }
}
