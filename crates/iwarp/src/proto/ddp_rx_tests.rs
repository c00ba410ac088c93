//! Tests of `proto::ddp_rx`: matrix A.4.6 rows 1-12, reassembly, MSN wrap,
//! interleaving, zero-length messages, sticky failure.

use std::collections::{HashMap, VecDeque};

use super::*;
use crate::wire::ddp::Segment;
use crate::wire::ddp::golden::{self, ulpdu};
use crate::wire::rdmap::{self, Message};

/// Receive queues and a memory table with scripted answers.
#[derive(Default)]
struct Mock {
    posted: [VecDeque<UntaggedBuf>; 4],
    /// Cause returned by `untagged_head` on an empty queue (default: row 1).
    empty_cause: Option<TermCause>,
    regions: HashMap<u32, Result<TaggedRegion, TermCause>>,
    lookups: u32,
}

impl Mock {
    fn post(&mut self, queue: Queue, id: BufferId, capacity: u32) {
        self.posted[queue.index()].push_back(UntaggedBuf { id, capacity });
    }
    fn region(&mut self, stag: u32, r: Result<TaggedRegion, TermCause>) {
        self.regions.insert(stag, r);
    }
}

impl RxResources for Mock {
    fn untagged_head(&mut self, queue: Queue) -> Result<UntaggedBuf, TermCause> {
        self.posted[queue.index()]
            .front()
            .copied()
            .ok_or(self.empty_cause.unwrap_or(cause::DDP_ERR_U_NO_BUFFER))
    }
    fn untagged_consume(&mut self, queue: Queue) {
        self.posted[queue.index()].pop_front();
    }
    fn tagged_lookup(&mut self, stag: u32, _ulp_ctrl: u8) -> Result<TaggedRegion, TermCause> {
        self.lookups += 1;
        self.regions
            .get(&stag)
            .copied()
            .unwrap_or(Err(cause::DDP_ERR_T_INVALID_STAG))
    }
}

fn send(msn: u32, mo: u32, last: bool) -> Header {
    Header {
        last,
        rdmap_ctrl: 0x43,
        addr: Addr::Untagged {
            qn: 0,
            msn,
            mo,
            inv_stag: 0,
        },
    }
}
fn on_qn(qn: u32, msn: u32) -> Header {
    Header {
        last: true,
        rdmap_ctrl: 0x43,
        addr: Addr::Untagged {
            qn,
            msn,
            mo: 0,
            inv_stag: 0,
        },
    }
}
fn write(stag: u32, to: u64, last: bool) -> Header {
    Header {
        last,
        rdmap_ctrl: 0x40,
        addr: Addr::Tagged { stag, to },
    }
}
fn rresp(stag: u32, to: u64, last: bool) -> Header {
    Header {
        last,
        rdmap_ctrl: 0x42,
        addr: Addr::Tagged { stag, to },
    }
}

const REGION: TaggedRegion = TaggedRegion {
    handle: 7,
    base: 0x1000,
    len: 0x1000,
};

fn setup() -> (DdpRx, Mock) {
    let mut m = Mock::default();
    m.region(0xaa, Ok(REGION));
    (DdpRx::new(Config::RFC5040), m)
}

fn cause_of(r: Result<Accepted, Error>) -> TermCause {
    r.unwrap_err().cause
}

// ---- matrix A.4.6 rows 1-12 ----

/// Row 1: Send with no receive posted -> 1/2/0x02 (M D via the builder).
#[test]
fn row1_send_without_receive() {
    let (mut rx, mut m) = setup();
    let e = rx.receive(&send(1, 0, true), 10, &mut m).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoBuffer { queue: Queue::Send });
    assert_eq!(e.cause, cause::DDP_ERR_U_NO_BUFFER);
    let u = ulpdu(&golden::SIW_SEND);
    assert_eq!(e.terminate(u, None).ulpdu_len(), 42);
}

/// Row 19 through the same door: the engine answers IRD overflow with
/// 0/2/0x07 and the Terminate carries the Read Request (M D R).
#[test]
fn row19_ird_overflow_cause_from_engine() {
    let (mut rx, mut m) = setup();
    m.empty_cause = Some(cause::RDMAP_ERR_CATASTROPHIC_STREAM);
    let u = ulpdu(&golden::SIW_READ_REQUEST);
    let (seg, msg) = rdmap::parse_ulpdu(u, &Config::RFC5040).unwrap();
    let e = rx.receive_segment(&seg, &mut m).unwrap_err();
    assert_eq!(e.cause, cause::RDMAP_ERR_CATASTROPHIC_STREAM);
    let Message::ReadRequest(rr) = msg else { panic!() };
    let t = e.terminate(u, Some(&rr));
    assert_eq!((t.ulpdu_len(), t.rdma), (70, Some(rr)));
}

/// Row 2: Send longer than the posted receive -> 1/2/0x05 (siw: 0x02).
#[test]
fn row2_send_longer_than_buffer() {
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 1, 100);
    let e = rx.receive(&send(1, 0, true), 101, &mut m).unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::TooLong {
            queue: Queue::Send,
            capacity: 100,
            need: 101
        }
    );
    assert_eq!(e.cause, cause::DDP_ERR_U_TOO_LONG);
    // The overflow can also come with a later segment.
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 1, 100);
    rx.receive(&send(1, 0, false), 60, &mut m).unwrap();
    assert_eq!(
        cause_of(rx.receive(&send(1, 60, true), 41, &mut m)),
        cause::DDP_ERR_U_TOO_LONG
    );
}

#[test]
fn capacity_exactly_filled() {
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 1, 100);
    let a = rx.receive(&send(1, 0, true), 100, &mut m).unwrap();
    assert!(matches!(a.delivered, Some(Delivered::Untagged { len: 100, .. })));
}

/// Row 3: MSN out of the valid range -> 1/2/0x03.
#[test]
fn row3_msn_out_of_range() {
    for bad in [0u32, 2, 3, u32::MAX] {
        let (mut rx, mut m) = setup();
        m.post(Queue::Send, 1, 100);
        m.post(Queue::Send, 2, 100);
        let e = rx.receive(&send(bad, 0, true), 1, &mut m).unwrap_err();
        assert_eq!(
            e.kind,
            ErrorKind::MsnRange {
                queue: Queue::Send,
                expected: 1,
                got: bad
            }
        );
        assert_eq!(e.cause, cause::DDP_ERR_U_MSN_RANGE);
    }
    // A segment of a new message before the current one completed.
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 1, 100);
    m.post(Queue::Send, 2, 100);
    rx.receive(&send(1, 0, false), 10, &mut m).unwrap();
    assert_eq!(
        cause_of(rx.receive(&send(2, 0, true), 10, &mut m)),
        cause::DDP_ERR_U_MSN_RANGE
    );
}

/// Buffer check (RFC 5041 §7.1 check 2) before the MSN check (5): a wrong
/// MSN on an empty queue is "no buffer", as in siw.
#[test]
fn no_buffer_checked_before_msn() {
    let (mut rx, mut m) = setup();
    assert_eq!(
        cause_of(rx.receive(&send(9, 0, true), 1, &mut m)),
        cause::DDP_ERR_U_NO_BUFFER
    );
}

/// Row 4: a segment with the wrong MO -> 1/2/0x04.
#[test]
fn row4_wrong_mo() {
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 1, 100);
    let e = rx.receive(&send(1, 5, true), 1, &mut m).unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::InvalidMo {
            queue: Queue::Send,
            expected: 0,
            got: 5
        }
    );
    assert_eq!(e.cause, cause::DDP_ERR_U_INVALID_MO);
    for bad_mo in [9u32, 11, 0] {
        let (mut rx, mut m) = setup();
        m.post(Queue::Send, 1, 100);
        rx.receive(&send(1, 0, false), 10, &mut m).unwrap();
        assert_eq!(
            cause_of(rx.receive(&send(1, bad_mo, true), 1, &mut m)),
            cause::DDP_ERR_U_INVALID_MO
        );
    }
}

/// Row 5: untagged message on QN 3 (no RFC 7306) or an unknown QN -> 1/2/0x01.
#[test]
fn row5_invalid_qn() {
    for qn in [3u32, 4, 0xffff_ffff] {
        let (mut rx, mut m) = setup();
        let e = rx.receive(&on_qn(qn, 1), 0, &mut m).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidQn { qn });
        assert_eq!(e.cause, cause::DDP_ERR_U_INVALID_QN);
    }
    let mut rx = DdpRx::new(Config::RFC7306);
    let mut m = Mock::default();
    m.post(Queue::AtomicResponse, 3, 12);
    assert!(rx.receive(&on_qn(3, 1), 12, &mut m).is_ok());
}

/// Rows 6 and 7 come from the DDP header parser, before `DdpRx`.
#[test]
fn rows6_7_dv_rejected_before_placement() {
    let mut u = ulpdu(&golden::SIW_SEND).to_vec();
    u[0] = 0x40;
    assert_eq!(
        Segment::parse(&u).unwrap_err().term_cause(),
        cause::DDP_ERR_U_INVALID_VERSION
    );
    let mut t = ulpdu(&golden::SIW_WRITE).to_vec();
    t[0] = 0xc3;
    assert_eq!(
        Segment::parse(&t).unwrap_err().term_cause(),
        cause::DDP_ERR_T_INVALID_VERSION
    );
}

/// Row 8: Write to an unknown or invalidated STag -> 1/1/0x00; the
/// Terminate echoes the tagged header (38 octets).
#[test]
fn row8_unknown_stag() {
    let (mut rx, mut m) = setup();
    let u = ulpdu(&golden::SIW_WRITE);
    let seg = Segment::parse(u).unwrap();
    let e = rx.receive_segment(&seg, &mut m).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Stag { stag: 0x5b01_9800 });
    assert_eq!(e.cause, cause::DDP_ERR_T_INVALID_STAG);
    assert_eq!(e.terminate(u, None).ulpdu_len(), 38);
}

/// Row 9: below base, past the end, or crossing it -> 1/1/0x01 (SEC-03).
#[test]
fn row9_base_and_bounds() {
    let end = REGION.base + REGION.len;
    for (to, len, ok) in [
        (REGION.base - 1, 1, false),
        (REGION.base, 1, true),
        (end - 1, 1, true),
        (end, 1, false),
        (end - 10, 11, false),
        (REGION.base, 0x1000, true),
        (REGION.base, 0x1001, false),
    ] {
        let (mut rx, mut m) = setup();
        let r = rx.receive(&write(0xaa, to, true), len, &mut m);
        if ok {
            let a = r.unwrap();
            assert_eq!(
                a.place,
                Some(Placement::Tagged {
                    stag: 0xaa,
                    handle: 7,
                    to,
                    offset: to - REGION.base
                })
            );
        } else {
            let e = r.unwrap_err();
            assert_eq!(e.cause, cause::DDP_ERR_T_BASE_BOUNDS, "to {to:#x} len {len}");
            assert!(matches!(e.kind, ErrorKind::BaseBounds { .. }));
        }
    }
}

/// Row 10: STag of another PD or stream -> 1/1/0x02 (the engine decides).
#[test]
fn row10_stag_of_other_pd() {
    let (mut rx, mut m) = setup();
    m.region(0xbb, Err(cause::DDP_ERR_T_STAG_NOT_ASSOCIATED));
    assert_eq!(
        cause_of(rx.receive(&write(0xbb, 0, true), 4, &mut m)),
        cause::DDP_ERR_T_STAG_NOT_ASSOCIATED
    );
}

/// Row 11: TO + length wraps 2^64 -> 1/1/0x03, even though the region also
/// cannot hold it (wrap is checked before bounds).
#[test]
fn row11_to_wrap() {
    let (mut rx, mut m) = setup();
    m.region(
        0xcc,
        Ok(TaggedRegion {
            handle: 1,
            base: u64::MAX - 0xfff,
            len: 0x1000,
        }),
    );
    let e = rx.receive(&write(0xcc, u64::MAX - 3, true), 8, &mut m).unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::ToWrap {
            stag: 0xcc,
            to: u64::MAX - 3,
            len: 8
        }
    );
    assert_eq!(e.cause, cause::DDP_ERR_T_TO_WRAP);
    // TO + len == 2^64 wraps too; the last byte of the region is reachable.
    let (mut rx, mut m) = setup();
    m.region(
        0xcc,
        Ok(TaggedRegion {
            handle: 1,
            base: u64::MAX - 0xfff,
            len: 0x1000,
        }),
    );
    assert_eq!(
        cause_of(rx.receive(&write(0xcc, u64::MAX, true), 1, &mut m)),
        cause::DDP_ERR_T_TO_WRAP
    );
    let (mut rx, mut m) = setup();
    m.region(
        0xcc,
        Ok(TaggedRegion {
            handle: 1,
            base: u64::MAX - 0xfff,
            len: 0xfff,
        }),
    );
    assert!(rx.receive(&write(0xcc, u64::MAX - 1, true), 1, &mut m).is_ok());
}

/// Row 12: STag without remote write -> 1/1/0x00 (A.5 #5, as siw).
#[test]
fn row12_no_remote_write() {
    let (mut rx, mut m) = setup();
    m.region(0xdd, Err(cause::DDP_ERR_T_INVALID_STAG));
    let e = rx.receive(&write(0xdd, 0x1000, true), 4, &mut m).unwrap_err();
    assert_eq!(
        (e.cause, e.kind),
        (cause::DDP_ERR_T_INVALID_STAG, ErrorKind::Stag { stag: 0xdd })
    );
}

// ---- behaviour ----

/// RFC 5041 §5.2, A.5 #6: zero-length tagged messages are not checked.
#[test]
fn zero_length_write_skips_stag_checks() {
    let (mut rx, mut m) = setup();
    let a = rx.receive(&write(0xdead, u64::MAX, true), 0, &mut m).unwrap();
    assert_eq!(a.place, None);
    assert_eq!(
        a.delivered,
        Some(Delivered::Tagged {
            stag: 0xdead,
            ulp_ctrl: 0x40,
            first_to: u64::MAX,
            len: 0
        })
    );
    assert_eq!(m.lookups, 0);
}

/// RDMAP-SND-01: a zero-length Send consumes exactly one buffer.
#[test]
fn zero_length_send_consumes_a_buffer() {
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 41, 0);
    m.post(Queue::Send, 42, 10);
    let a = rx.receive(&send(1, 0, true), 0, &mut m).unwrap();
    assert_eq!(a.place, None);
    assert!(matches!(
        a.delivered,
        Some(Delivered::Untagged {
            buf: 41,
            len: 0,
            msn: 1,
            ..
        })
    ));
    assert_eq!(m.posted[0].len(), 1);
    assert_eq!(rx.expected_msn(Queue::Send), 2);
}

/// RDMAP-ORD-16, RDMAP-LLP-04: a multi-segment Send completes only on L,
/// with length = MO of the last segment + its payload.
#[test]
fn multi_segment_send_reassembly() {
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 9, 4096);
    let a = rx.receive(&send(1, 0, false), 1482, &mut m).unwrap();
    assert_eq!(
        a.place,
        Some(Placement::Untagged {
            queue: Queue::Send,
            buf: 9,
            offset: 0
        })
    );
    assert_eq!(a.delivered, None);
    assert!(rx.untagged_in_progress(Queue::Send));
    let a = rx.receive(&send(1, 1482, false), 1482, &mut m).unwrap();
    assert_eq!(
        a.place,
        Some(Placement::Untagged {
            queue: Queue::Send,
            buf: 9,
            offset: 1482
        })
    );
    let a = rx.receive(&send(1, 2964, true), 100, &mut m).unwrap();
    assert_eq!(
        a.delivered,
        Some(Delivered::Untagged {
            queue: Queue::Send,
            msn: 1,
            buf: 9,
            len: 3064,
            ulp_ctrl: 0x43,
            inv_stag: 0
        })
    );
    assert!(!rx.untagged_in_progress(Queue::Send));
    // The buffer was consumed once, at the first segment.
    assert!(m.posted[0].is_empty());
}

/// RFC 5041 §4.3: MSN starts at 1 and wraps from 2^32-1 to 0.
#[test]
fn msn_wraps() {
    let (mut rx, mut m) = setup();
    assert_eq!(rx.expected_msn(Queue::ReadRequest), 1);
    rx.set_expected_msn(Queue::Send, u32::MAX);
    for (id, msn) in [(1, u32::MAX), (2, 0), (3, 1)] {
        m.post(Queue::Send, id, 8);
        rx.receive(&send(msn, 0, true), 8, &mut m).unwrap();
    }
    assert_eq!(rx.expected_msn(Queue::Send), 2);
}

/// A.4.2: Read Response segments interleaved with Send segments, and a Read
/// Request completing on QN 1 in the middle of a Send on QN 0.
#[test]
fn tagged_interleaved_with_untagged() {
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 1, 300);
    m.post(Queue::ReadRequest, 2, 28);
    rx.receive(&send(1, 0, false), 100, &mut m).unwrap();
    rx.receive(&rresp(0xaa, 0x1000, false), 64, &mut m).unwrap();
    rx.receive(&send(1, 100, false), 100, &mut m).unwrap();
    let a = rx.receive(&on_qn(1, 1), 28, &mut m).unwrap();
    assert!(matches!(
        a.delivered,
        Some(Delivered::Untagged {
            queue: Queue::ReadRequest,
            len: 28,
            ..
        })
    ));
    let a = rx.receive(&rresp(0xaa, 0x1040, true), 64, &mut m).unwrap();
    assert_eq!(
        a.delivered,
        Some(Delivered::Tagged {
            stag: 0xaa,
            ulp_ctrl: 0x42,
            first_to: 0x1000,
            len: 128
        })
    );
    let a = rx.receive(&send(1, 200, true), 50, &mut m).unwrap();
    assert!(matches!(
        a.delivered,
        Some(Delivered::Untagged {
            queue: Queue::Send,
            len: 250,
            ..
        })
    ));
}

/// RFC 5041 §4.2: one STag per message; TO continues where the previous
/// segment ended (siw's codes: invalid STag, base/bounds).
#[test]
fn tagged_segment_consistency() {
    let (mut rx, mut m) = setup();
    m.region(0xab, Ok(REGION));
    rx.receive(&write(0xaa, 0x1000, false), 16, &mut m).unwrap();
    let e = rx.receive(&write(0xab, 0x1010, true), 16, &mut m).unwrap_err();
    assert_eq!(
        (e.cause, e.kind),
        (
            cause::DDP_ERR_T_INVALID_STAG,
            ErrorKind::StagChanged {
                expected: 0xaa,
                got: 0xab
            }
        )
    );
    let (mut rx, mut m) = setup();
    rx.receive(&write(0xaa, 0x1000, false), 16, &mut m).unwrap();
    let e = rx.receive(&write(0xaa, 0x1011, true), 16, &mut m).unwrap_err();
    assert_eq!(e.cause, cause::DDP_ERR_T_BASE_BOUNDS);
    // A Read Response may not cut into a Write (two tagged messages).
    let (mut rx, mut m) = setup();
    rx.receive(&write(0xaa, 0x1000, false), 16, &mut m).unwrap();
    let e = rx.receive(&rresp(0xaa, 0x1010, true), 16, &mut m).unwrap_err();
    assert_eq!(e.cause, cause::RDMAP_ERR_UNEXPECTED_OPCODE);
}

#[test]
fn untagged_opcode_change_within_message() {
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 1, 100);
    rx.receive(&send(1, 0, false), 10, &mut m).unwrap();
    let h = Header {
        rdmap_ctrl: 0x45,
        ..send(1, 10, true)
    };
    assert_eq!(cause_of(rx.receive(&h, 10, &mut m)), cause::RDMAP_ERR_UNEXPECTED_OPCODE);
}

/// RFC 5041 §7.1: after an error nothing more is placed; the same cause is
/// repeated as `Stopped` so that no second Terminate goes out.
#[test]
fn sticky_after_error() {
    let (mut rx, mut m) = setup();
    let first = rx.receive(&send(1, 0, true), 1, &mut m).unwrap_err();
    m.post(Queue::Send, 1, 100);
    let again = rx.receive(&send(1, 0, true), 1, &mut m).unwrap_err();
    assert!(again.is_repeat() && !first.is_repeat());
    assert_eq!(again.cause, first.cause);
    assert_eq!(rx.failed(), Some(cause::DDP_ERR_U_NO_BUFFER));
    assert_eq!(m.posted[0].len(), 1, "nothing consumed after the error");
}

/// The whole receive path on the siw capture: Send, Read Request, Read
/// Response, Write.
#[test]
fn siw_capture_pipeline() {
    let (mut rx, mut m) = setup();
    m.post(Queue::Send, 1, 64);
    m.post(Queue::ReadRequest, 2, 28);
    m.region(
        0x30fd_6700,
        Ok(TaggedRegion {
            handle: 3,
            base: 0x0000_5636_971d_3530,
            len: 64,
        }),
    );
    m.region(
        0x5b01_9800,
        Ok(TaggedRegion {
            handle: 4,
            base: 0x0000_561c_ae9f_e530,
            len: 64,
        }),
    );
    let mut delivered = Vec::new();
    for fpdu in [
        &golden::SIW_SEND[..],
        &golden::SIW_READ_REQUEST,
        &golden::SIW_READ_RESPONSE,
        &golden::SIW_WRITE,
    ] {
        let (seg, _msg) = rdmap::parse_ulpdu(ulpdu(fpdu), &Config::RFC5040).unwrap();
        delivered.push(rx.receive_segment(&seg, &mut m).unwrap().delivered.unwrap());
    }
    assert!(matches!(
        delivered[0],
        Delivered::Untagged {
            queue: Queue::Send,
            len: 16,
            ..
        }
    ));
    assert!(matches!(
        delivered[1],
        Delivered::Untagged {
            queue: Queue::ReadRequest,
            len: 28,
            ..
        }
    ));
    assert!(matches!(
        delivered[2],
        Delivered::Tagged {
            stag: 0x30fd_6700,
            len: 64,
            ..
        }
    ));
    assert!(matches!(
        delivered[3],
        Delivered::Tagged {
            stag: 0x5b01_9800,
            len: 64,
            ..
        }
    ));
}

/// Segmentation and reassembly agree (catalogue E.2): every length class of
/// RDMAP-LLP-04 through `proto::segment` and back.
#[test]
fn segmenter_round_trip_llp04() {
    use crate::proto::segment::Segmenter;
    for len in [0u32, 1, 3, 4, 1481, 1482, 1483, 1 << 20] {
        let (mut rx, mut m) = setup();
        m.post(Queue::Send, 5, 1 << 20);
        let mut got = None;
        for (h, r) in Segmenter::new(send(1, 0, false), len, 1500).unwrap() {
            let a = rx.receive(&h, r.len(), &mut m).unwrap();
            if let Some(d) = a.delivered {
                got = Some(d);
            }
        }
        assert!(
            matches!(got, Some(Delivered::Untagged { len: l, .. }) if l == len),
            "len {len}"
        );
    }
}
