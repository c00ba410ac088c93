//! The receive pipeline below the engine, end to end and sans-I/O: a TCP
//! byte stream of FPDUs (CRC on, with and without markers) carrying every
//! RDMAP message, multi-segment ones interleaved, is cut at every octet
//! offset and fed through `fpdu::Deframer` -> `rdmap::parse_ulpdu` -> a
//! reassembler; every cut must give back exactly the messages we sent.
//!
//! Requirement IDs (catalogue `shared/requirements/rdmap-rpcrdma.md`):
//! E.2 ("TCP byte stream split at every possible offset yields identical
//! messages"), C.2.4 (receivers accept any TCP segmentation), C.2.5 (CRC
//! covers length, ULPDU, pad and markers), C.2.6 (markers stripped),
//! C.1.2/C.1.3 (segmentation, MSN/MO reassembly), RDMAP-LLP-02 (one message
//! = one DDP message, TO advancing, L on the last), RDMAP-LLP-03 (RsvdULP
//! carried unchanged), RDMAP-LLP-04 (untagged message length reported),
//! RDMAP-ORD-16 (a Send is whole only at L), A.4.2 (Read Response segments
//! interleaved between Send segments), RDMAP-STR-01 (after MPA, only FPDUs).
//! The per-layer versions of these tests live next to the code
//! (`wire/fpdu_deframer.rs` every_split_offset_all_modes,
//! `wire/ddp_tests.rs` any_mulpdu_reassembles, `engine/qp/core_tests.rs`
//! untagged_sequencing_and_reassembly / segmentation_on_the_wire_llp04);
//! this one checks that they compose.

use std::collections::BTreeMap;

use iwarp::wire::cause;
use iwarp::wire::ddp::{Addr, Header};
use iwarp::wire::fpdu::{Deframer, DeframerConfig, FpduError, Framer};
use iwarp::wire::rdmap::{AtomicOp, AtomicRequest, Config, Message, Opcode, Queue, ReadRequest, parse_ulpdu};
use iwarp::wire::terminate::{self, Offending};

/// One logical message as the receiver should see it after reassembly.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Whole {
    /// Tagged: (opcode, STag, TO of the first octet, bytes).
    Tagged(Opcode, u32, u64, Vec<u8>),
    /// Untagged: (opcode, QN, MSN, Invalidate STag field, message bytes).
    Untagged(Opcode, u32, u32, u32, Vec<u8>),
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// The engine's segmentation (`wire::ddp::segment_len`, `Header::at_offset`):
/// (header, payload range) per segment of a message of `len` octets.
fn ddp_segments(first: Header, len: usize, mulpdu: usize) -> Vec<(Header, std::ops::Range<usize>)> {
    let room = mulpdu - first.header_len();
    let (mut off, mut out) = (0, Vec::new());
    loop {
        let (n, last) = iwarp::wire::ddp::segment_len(len, off, room);
        out.push((first.at_offset(off, last), off..off + n));
        off += n;
        if last {
            return out;
        }
    }
}

fn segments(first: Header, payload: &[u8], mulpdu: usize) -> Vec<Vec<u8>> {
    ddp_segments(first, payload.len(), mulpdu)
        .into_iter()
        .map(|(h, r)| {
            let mut v = vec![0; h.header_len() + r.len()];
            let n = h.emit(&mut v).unwrap();
            v[n..].copy_from_slice(&payload[r]);
            v
        })
        .collect()
}

fn one(m: &Message, msn: u32) -> Vec<u8> {
    let mut v = vec![0; m.buffer_len()];
    m.emit(&mut v, msn).unwrap();
    v
}

/// The ULPDUs in wire order and the messages they make up.
fn script() -> (Vec<Vec<u8>>, Vec<Whole>) {
    let mulpdu = 300;
    let mut ulpdus = Vec::new();
    let mut wholes = Vec::new();

    // Multi-segment Write (RDMAP-LLP-02).
    let w = bytes(1000, 1);
    ulpdus.extend(segments(
        Header {
            last: false,
            rdmap_ctrl: Opcode::Write.control(),
            addr: Addr::Tagged {
                stag: 0x0100_0001,
                to: 0xffff_0000,
            },
        },
        &w,
        mulpdu,
    ));
    wholes.push(Whole::Tagged(Opcode::Write, 0x0100_0001, 0xffff_0000, w));

    // A Read Request, then its two-segment Read Response interleaved with
    // the segments of a three-segment Send (A.4.2).
    let rr = ReadRequest {
        sink_stag: 0x0200_0002,
        sink_to: 0x40,
        size: 500,
        src_stag: 0x0300_0003,
        src_to: 0x8000,
    };
    ulpdus.push(one(&Message::ReadRequest(rr), 1));
    let mut rr_bytes = vec![0; 28];
    rr.emit(&mut rr_bytes).unwrap();
    wholes.push(Whole::Untagged(Opcode::ReadRequest, 1, 1, 0, rr_bytes));
    let resp = bytes(500, 2);
    let resp_segs = segments(
        Header {
            last: false,
            rdmap_ctrl: Opcode::ReadResponse.control(),
            addr: Addr::Tagged {
                stag: rr.sink_stag,
                to: rr.sink_to,
            },
        },
        &resp,
        mulpdu,
    );
    let send = bytes(700, 3);
    let send_segs = segments(
        Header {
            last: false,
            rdmap_ctrl: Opcode::SendSe.control(),
            addr: Addr::Untagged {
                qn: Queue::Send.qn(),
                msn: 1,
                mo: 0,
                inv_stag: 0,
            },
        },
        &send,
        mulpdu,
    );
    assert_eq!((resp_segs.len(), send_segs.len()), (2, 3));
    ulpdus.push(send_segs[0].clone());
    ulpdus.push(resp_segs[0].clone());
    ulpdus.push(send_segs[1].clone());
    ulpdus.push(resp_segs[1].clone());
    ulpdus.push(send_segs[2].clone());
    wholes.push(Whole::Tagged(Opcode::ReadResponse, rr.sink_stag, rr.sink_to, resp));
    wholes.push(Whole::Untagged(Opcode::SendSe, 0, 1, 0, send));

    // Short untagged messages: pad lengths 0..3 on the wire.
    for (i, len) in [1usize, 2, 3, 4].into_iter().enumerate() {
        let p = bytes(len, 10 + i as u8);
        let m = Message::Send {
            se: false,
            invalidate: Some(0x0400_0000 + i as u32),
            payload: &p,
        };
        let msn = 2 + i as u32;
        ulpdus.push(one(&m, msn));
        wholes.push(Whole::Untagged(
            Opcode::SendInvalidate,
            0,
            msn,
            0x0400_0000 + i as u32,
            p,
        ));
    }

    // RFC 7306: Atomic Request (QN 1, MSN 2) and Immediate Data (QN 0, MSN 6).
    let a = AtomicRequest {
        op: AtomicOp::CmpSwap,
        request_id: 9,
        remote_stag: 0x0500_0005,
        remote_to: 0x1000,
        add_swap_data: 1,
        add_swap_mask: u64::MAX,
        compare_data: 2,
        compare_mask: u64::MAX,
    };
    ulpdus.push(one(&Message::AtomicRequest(a), 2));
    let mut ab = vec![0; 52];
    a.emit(&mut ab).unwrap();
    wholes.push(Whole::Untagged(Opcode::AtomicRequest, 1, 2, 0, ab));
    ulpdus.push(one(&Message::ImmediateData { se: true, data: 0x1122 }, 6));
    wholes.push(Whole::Untagged(
        Opcode::ImmediateDataSe,
        0,
        6,
        0,
        0x1122u64.to_be_bytes().to_vec(),
    ));

    // A zero-length Write (one segment, L set, no payload).
    ulpdus.push(one(
        &Message::Write {
            stag: 1,
            to: 0,
            payload: &[],
        },
        0,
    ));
    wholes.push(Whole::Tagged(Opcode::Write, 1, 0, Vec::new()));

    // Terminate of size class 70 last (RDMAP-TRM-01: QN 2, MSN 1).
    let rr_ulpdu = one(&Message::ReadRequest(rr), 1);
    let t = terminate::Repr::for_error(
        cause::RDMAP_ERR_INVALID_STAG,
        Offending::from_ulpdu(&rr_ulpdu),
        Some(&rr),
    );
    ulpdus.push(one(&Message::Terminate(t), 1));
    let mut tb = vec![0; t.buffer_len()];
    t.emit(&mut tb).unwrap();
    wholes.push(Whole::Untagged(Opcode::Terminate, 2, 1, 0, tb));
    (ulpdus, wholes)
}

/// Reassembles parsed segments into whole messages, checking TO / MO
/// continuity and that L closes each message exactly once.
#[derive(Default)]
struct Reassembler {
    tagged: BTreeMap<u32, (Opcode, u64, Vec<u8>)>,
    untagged: BTreeMap<(u32, u32), (Opcode, u32, Vec<u8>)>,
    done: Vec<Whole>,
}

impl Reassembler {
    fn segment(&mut self, ulpdu: &[u8]) {
        let (seg, msg) = parse_ulpdu(ulpdu, &Config::RFC7306).unwrap();
        let op = msg.opcode();
        let h = seg.header;
        // RDMAP-LLP-03: the RDMAP control octet survives DDP unchanged.
        assert_eq!(h.rdmap_ctrl, op.control());
        match h.addr {
            Addr::Tagged { stag, to } => {
                let e = self.tagged.entry(stag).or_insert((op, to, Vec::new()));
                assert_eq!(e.0, op);
                assert_eq!(e.1 + e.2.len() as u64, to, "TO advances by the payload (RDMAP-LLP-02)");
                e.2.extend_from_slice(seg.payload);
                if h.last {
                    let (op, to, b) = self.tagged.remove(&stag).unwrap();
                    self.done.push(Whole::Tagged(op, stag, to, b));
                }
            }
            Addr::Untagged { qn, msn, mo, inv_stag } => {
                let e = self.untagged.entry((qn, msn)).or_insert((op, inv_stag, Vec::new()));
                assert_eq!((e.0, e.1), (op, inv_stag));
                assert_eq!(e.2.len() as u32, mo, "MO is the offset in the message (C.1.3)");
                e.2.extend_from_slice(seg.payload);
                if h.last {
                    let (op, inv, b) = self.untagged.remove(&(qn, msn)).unwrap();
                    self.done.push(Whole::Untagged(op, qn, msn, inv, b));
                }
            }
        }
    }
}

fn frame(ulpdus: &[Vec<u8>], markers: bool) -> Vec<u8> {
    let mut framer = Framer::new(true, markers);
    let mut out = Vec::new();
    for u in ulpdus {
        framer.emit_vec(u, &mut out).unwrap();
    }
    out
}

fn cfg(markers: bool) -> DeframerConfig {
    DeframerConfig {
        crc: true,
        markers,
        ..DeframerConfig::default()
    }
}

/// Feeds `pieces` in order; returns the ULPDUs (copied) or the first error.
fn deframe(d: &mut Deframer, pieces: &[&[u8]]) -> Result<Vec<Vec<u8>>, FpduError> {
    let mut out = Vec::new();
    for p in pieces {
        let mut at = 0;
        while at < p.len() {
            let (n, u) = d.next_fpdu(&p[at..])?;
            at += n;
            if let Some(u) = u {
                out.push(u.to_vec());
            }
            if n == 0 && u.is_none() {
                break;
            }
        }
    }
    Ok(out)
}

#[test]
fn every_split_offset_gives_back_every_message() {
    let (ulpdus, wholes) = script();
    for markers in [false, true] {
        let stream = frame(&ulpdus, markers);
        for cut in 0..=stream.len() {
            let mut d = Deframer::new(cfg(markers));
            let got = deframe(&mut d, &[&stream[..cut], &stream[cut..]]).unwrap();
            assert_eq!(got, ulpdus, "markers={markers} cut={cut}");
            assert!(d.at_boundary());
            let mut r = Reassembler::default();
            for u in &got {
                r.segment(u);
            }
            assert_eq!(r.done, wholes, "markers={markers} cut={cut}");
            assert!(r.tagged.is_empty() && r.untagged.is_empty());
        }
        // One octet at a time.
        let pieces: Vec<&[u8]> = stream.chunks(1).collect();
        let mut d = Deframer::new(cfg(markers));
        assert_eq!(deframe(&mut d, &pieces).unwrap(), ulpdus, "markers={markers} bytewise");
    }
}

/// A flipped octet anywhere in the CRC-covered part of an FPDU is reported
/// as the MPA CRC error, Terminate 2/0/0x02 (matrix row 26), or (when it
/// hits a length field) as some typed error; the ULPDUs before it still
/// come out, and nothing after it does.
#[test]
fn corruption_anywhere_is_a_typed_error_row_26() {
    let (ulpdus, _) = script();
    let stream = frame(&ulpdus, false);
    let mut starts = vec![0usize];
    for u in &ulpdus {
        let last = *starts.last().unwrap();
        starts.push(last + iwarp::wire::fpdu::fpdu_len(u.len()));
    }
    assert_eq!(*starts.last().unwrap(), stream.len());
    for at in 0..stream.len() {
        let mut bad = stream.clone();
        bad[at] ^= 0x10;
        let fpdu = starts.iter().rposition(|&s| s <= at).unwrap();
        let mut d = Deframer::new(cfg(false));
        let mut out = Vec::new();
        let mut rest: &[u8] = &bad;
        let err = loop {
            match d.next_fpdu(rest) {
                Ok((n, Some(u))) => {
                    out.push(u.to_vec());
                    rest = &rest[n..];
                }
                Ok((_, None)) => break None,
                Err(e) => break Some(e),
            }
        };
        assert_eq!(&out[..], &ulpdus[..fpdu.min(out.len())], "at={at}");
        assert!(out.len() <= fpdu, "nothing from or after the damaged FPDU (at={at})");
        let in_length_field = at - starts[fpdu] < 2;
        match err {
            Some(e @ FpduError::Crc { .. }) => assert_eq!(e.cause(), cause::MPA_ERR_CRC),
            // A damaged ULPDU_Length may make the deframer wait for octets
            // that never come, or read a later CRC at the wrong place.
            None | Some(_) if in_length_field => {}
            other => panic!("at={at}: {other:?}"),
        }
    }
}
