//! Header golden vectors: RFC 8166 §4.7, requirements B.1.6, and Linux NFS/RDMA
//! frames captured in the lab (shared/lab/results/vm-lo-nfs-rdma.pcap).

use super::*;
use proptest::prelude::*;

pub(crate) fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_be_bytes()).collect()
}

fn seg(handle: u32, length: u32, offset: u64) -> Segment {
    Segment { handle, length, offset }
}

fn decode(b: &[u8]) -> Result<(Header, usize), HeaderError> {
    Header::decode(b, &Limits::default())
}

fn roundtrip(h: &Header, expect: &[u8]) {
    let b = h.to_vec().unwrap();
    assert_eq!(b, expect);
    assert_eq!(h.encoded_len(), expect.len());
    let (d, len) = decode(expect).unwrap();
    assert_eq!(&d, h);
    assert_eq!(len, expect.len());
}

/// B.1.6 short call, 32 credits requested; RFC 8166 §4.7 "three 32-bit fields
/// that contain zero" (RPCR-FRM-02, RPCR-FRM-05).
#[test]
fn golden_b16_short_call() {
    let h = Header::new(0x11223344, 32, Body::Msg(ChunkLists::default()));
    roundtrip(&h, &words(&[0x11223344, 1, 0x20, 0, 0, 0, 0]));
    assert_eq!(h.encoded_len(), MIN_HEADER_LEN);
}

/// B.1.6 long call: RDMA_NOMSG with a Position-Zero read segment and a
/// one-segment Reply chunk.
#[test]
fn golden_b16_long_call() {
    let h = Header::new(
        7,
        1,
        Body::NoMsg(ChunkLists {
            reads: vec![ReadSegment {
                position: 0,
                target: seg(0xAABBCCDD, 0x2000, 0x0000000100000000),
            }],
            writes: vec![],
            reply: Some(WriteChunk {
                segments: vec![seg(0x01020304, 0x1000, 0x10)],
            }),
        }),
    );
    roundtrip(
        &h,
        &words(&[
            7, 1, 1, 1, // xid vers credits NOMSG
            1, 0, 0xAABBCCDD, 0x2000, 1, 0, 0, // read list
            0, // write list
            1, 1, 0x01020304, 0x1000, 0, 0x10, // reply chunk
        ]),
    );
}

/// B.1.6 ERR_VERS answer to a version-2 call (rdma_vers echoed, range 1..1) and
/// ERR_CHUNK (20 bytes) (RPCR-ERR-04, RPCR-ERR-07).
#[test]
fn golden_b16_errors() {
    let failed = FixedHeader {
        xid: 9,
        vers: 2,
        credit: 5,
        proc_: 0,
    };
    let h = Header::error_reply(&failed, 3, ErrorBody::Vers { low: 1, high: 1 });
    let b = h.to_vec().unwrap();
    assert_eq!(b, words(&[9, 2, 3, 4, 1, 1, 1]));
    assert_eq!(b.len(), ERR_VERS_LEN);
    // a version-2 header does not decode as version 1, but its fixed words do
    assert_eq!(decode(&b), Err(HeaderError::UnsupportedVersion(2)));
    assert_eq!(FixedHeader::parse(&b).unwrap().proc_, proc_::RDMA_ERROR);

    let h = Header::new(9, 3, Body::Error(ErrorBody::Chunk));
    roundtrip(&h, &words(&[9, 1, 3, 4, 2]));
    assert_eq!(h.encoded_len(), ERR_CHUNK_LEN);
    let h = Header::new(9, 3, Body::Error(ErrorBody::Vers { low: 1, high: 1 }));
    roundtrip(&h, &words(&[9, 1, 3, 4, 1, 1, 1]));
}

/// RFC 8166 §4.7: "1 3 HLOO HLOO HLOO 1 2 HLOO HLOO 0", a read chunk of three
/// read segments "1 PHLOO 1 PHLOO 1 PHLOO 0", and a two-segment Reply chunk
/// "1 2 HLOO HLOO".
#[test]
fn golden_rfc8166_section_4_7() {
    let s = |i: u32| seg(0x100 + i, 0x10 * i, u64::from(i) << 32 | 0xff);
    let hloo = |i: u32| vec![0x100 + i, 0x10 * i, i, 0xff];
    let lists = ChunkLists {
        reads: (1..=3)
            .map(|i| ReadSegment {
                position: 8,
                target: s(i),
            })
            .collect(),
        writes: vec![
            WriteChunk {
                segments: vec![s(4), s(5), s(6)],
            },
            WriteChunk {
                segments: vec![s(7), s(8)],
            },
        ],
        reply: Some(WriteChunk {
            segments: vec![s(9), s(10)],
        }),
    };
    let mut w = vec![1, 1, 2, 0];
    for i in 1..=3 {
        w.push(1);
        w.push(8);
        w.extend(hloo(i));
    }
    w.push(0);
    w.extend([1, 3]);
    (4..=6).for_each(|i| w.extend(hloo(i)));
    w.extend([1, 2]);
    (7..=8).for_each(|i| w.extend(hloo(i)));
    w.push(0);
    w.extend([1, 2]);
    (9..=10).for_each(|i| w.extend(hloo(i)));
    let h = Header::new(1, 2, Body::Msg(lists));
    roundtrip(&h, &words(&w));
    // sizes: 16 + (4 + 24*3) + (4 + (8+48) + (8+32)) + (8 + 32)
    assert_eq!(h.encoded_len(), 16 + 76 + 100 + 40);
}

fn linux(name: &str) -> &'static [u8] {
    match name {
        "8" => include_bytes!("../../testdata/linux/lo-frame8.bin"),
        "9" => include_bytes!("../../testdata/linux/lo-frame9.bin"),
        "28" => include_bytes!("../../testdata/linux/lo-frame28.bin"),
        "33" => include_bytes!("../../testdata/linux/lo-frame33.bin"),
        "39" => include_bytes!("../../testdata/linux/lo-frame39.bin"),
        "41" => include_bytes!("../../testdata/linux/lo-frame41.bin"),
        "47" => include_bytes!("../../testdata/linux/lo-frame47.bin"),
        "344" => include_bytes!("../../testdata/linux/lo-frame344.bin"),
        "349" => include_bytes!("../../testdata/linux/lo-frame349.bin"),
        "351" => include_bytes!("../../testdata/linux/lo-frame351.bin"),
        "355" => include_bytes!("../../testdata/linux/lo-frame355.bin"),
        "366" => include_bytes!("../../testdata/linux/lo-frame366.bin"),
        "br18" => include_bytes!("../../testdata/linux/br0-frame18.bin"),
        "br19" => include_bytes!("../../testdata/linux/br0-frame19.bin"),
        _ => unreachable!(),
    }
}

/// Decode a Linux frame, check its header re-encodes byte for byte, and return it.
fn linux_header(name: &str) -> (Header, &'static [u8]) {
    let b = linux(name);
    let (h, len) = decode(b).unwrap();
    assert_eq!(h.to_vec().unwrap(), &b[..len], "frame {name}");
    assert_eq!(h.encoded_len(), len);
    (h, &b[len..])
}

/// Every RPC-over-RDMA message the Linux client and server exchanged in the lab
/// decodes and re-encodes identically; Payload streams start with the XID.
#[test]
fn golden_linux_all_frames_roundtrip() {
    for f in [
        "8", "9", "28", "33", "39", "41", "47", "344", "349", "351", "355", "366", "br18", "br19",
    ] {
        let (h, payload) = linux_header(f);
        assert_eq!(h.vers, 1);
        match &h.body {
            Body::Msg(_) => assert_eq!(&payload[..4], &h.xid.to_be_bytes(), "frame {f}"),
            Body::NoMsg(_) => assert!(payload.is_empty()),
            _ => panic!("frame {f}: unexpected procedure"),
        }
    }
}

#[test]
fn golden_linux_credits() {
    // client requests 128 (xprtrdma default slot table), server grants 64
    // (svcrdma max_requests); the host's Python probe asked for 32
    assert_eq!(linux_header("8").0.credit, 128);
    assert_eq!(linux_header("9").0.credit, 64);
    assert_eq!(linux_header("br18").0.credit, 32);
    assert_eq!(linux_header("br19").0.credit, 64);
}

/// Frame 28 (READDIRPLUS call) provides a 3-segment Reply chunk; frame 33 answers
/// with RDMA_NOMSG and the chunk echoed with the lengths written (124, 780, 0).
#[test]
fn golden_linux_reply_chunk() {
    let (call, _) = linux_header("28");
    let (reply, _) = linux_header("33");
    let Body::Msg(c) = &call.body else { panic!() };
    let Body::NoMsg(r) = &reply.body else { panic!() };
    let lens = |w: &WriteChunk| w.segments.iter().map(|s| s.length).collect::<Vec<_>>();
    assert_eq!(lens(c.reply.as_ref().unwrap()), [124, 65536, 4]);
    assert_eq!(lens(r.reply.as_ref().unwrap()), [124, 780, 0]);
    assert_eq!(
        c.reply.as_ref().unwrap().segments[0],
        seg(0x0ea16501, 124, 0xb31c4fb709540000)
    );
    chunks::check_returned_chunks(c, r).unwrap();
}

/// Frame 47 (1 MiB READ) provides one Write chunk; frame 344 returns it full.
/// Frame 355 (64 KiB WRITE) carries a Read chunk at Position 116.
#[test]
fn golden_linux_write_and_read_chunks() {
    let (call, _) = linux_header("47");
    let (reply, _) = linux_header("344");
    let Body::Msg(c) = &call.body else { panic!() };
    let Body::Msg(r) = &reply.body else { panic!() };
    assert_eq!(
        c.writes,
        vec![WriteChunk {
            segments: vec![seg(0x1e9f1701, 1 << 20, 0xb91c4fb70980d000)]
        }]
    );
    assert_eq!(r.writes, c.writes);
    chunks::check_returned_chunks(c, r).unwrap();

    let (call, payload) = linux_header("355");
    let Body::Msg(c) = &call.body else { panic!() };
    assert_eq!(
        c.reads,
        vec![ReadSegment {
            position: 116,
            target: seg(0x1e9f1702, 65536, 0xbe1c4fb7098d0000)
        }]
    );
    assert_eq!(payload.len(), 116);
}

#[test]
fn msgp_and_done_parse_but_are_never_sent() {
    let b = words(&[5, 1, 1, 2, 64, 1024, 0, 0, 0]);
    let (h, len) = decode(&b).unwrap();
    assert_eq!(
        h.body,
        Body::Msgp {
            align: 64,
            thresh: 1024,
            lists: ChunkLists::default()
        }
    );
    assert_eq!(len, 36);
    assert_eq!(h.encoded_len(), 36);
    assert_eq!(h.to_vec(), Err(HeaderError::ObsoleteProc));
    let mut e = Encoder::new(Vec::new());
    h.encode_any(&mut e).unwrap();
    assert_eq!(e.finish().0, b);

    let b = words(&[5, 1, 1, 3]);
    let (h, len) = decode(&b).unwrap();
    assert_eq!((h.body.clone(), len), (Body::Done, 16));
    assert_eq!(h.to_vec(), Err(HeaderError::ObsoleteProc));
}

#[test]
fn malformed_headers() {
    assert_eq!(decode(&[0; 15]), Err(HeaderError::TooShort(15)));
    assert_eq!(decode(&words(&[1, 1, 1, 5, 0, 0, 0])), Err(HeaderError::UnknownProc(5)));
    assert_eq!(decode(&words(&[1, 1, 1, 4, 7])), Err(HeaderError::UnknownErrCode(7)));
    assert_eq!(
        decode(&words(&[1, 1, 1, 0, 2, 0, 0])),
        Err(HeaderError::Xdr(XdrError::BadBool(2)))
    );
    // write chunk count 0xffffffff: refused, nothing allocated
    assert_eq!(
        decode(&words(&[1, 1, 1, 0, 0, 1, 0xffff_ffff, 0, 0])),
        Err(HeaderError::TooMany {
            what: "write chunk",
            max: 512
        })
    );
    // a count within limits but beyond the message: truncated
    assert!(matches!(
        decode(&words(&[1, 1, 1, 0, 0, 1, 500, 0, 0])),
        Err(HeaderError::Xdr(XdrError::Truncated { .. }))
    ));
    let small = Limits {
        max_read_segments: 1,
        max_write_chunks: 1,
        max_segments_per_chunk: 1,
    };
    let two_reads = words(&[1, 1, 1, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0]);
    assert!(Header::decode(&two_reads, &Limits::default()).is_ok());
    assert_eq!(
        Header::decode(&two_reads, &small),
        Err(HeaderError::TooMany {
            what: "read list",
            max: 1
        })
    );
    let two_writes = words(&[1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0]);
    assert_eq!(
        Header::decode(&two_writes, &small),
        Err(HeaderError::TooMany {
            what: "write list",
            max: 1
        })
    );
}

/// Every proper prefix of a valid header fails to decode (cleanly).
#[test]
fn every_truncation_fails() {
    let b = linux("28");
    let (_, len) = decode(b).unwrap();
    for cut in 0..len {
        assert!(decode(&b[..cut]).is_err(), "cut {cut}");
    }
}

fn arb_segment() -> impl Strategy<Value = Segment> {
    (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(h, l, o)| seg(h, l, o))
}

fn arb_chunk() -> impl Strategy<Value = WriteChunk> {
    proptest::collection::vec(arb_segment(), 0..4).prop_map(|segments| WriteChunk { segments })
}

pub(crate) fn arb_lists() -> impl Strategy<Value = ChunkLists> {
    (
        proptest::collection::vec(
            (any::<u32>(), arb_segment()).prop_map(|(p, t)| ReadSegment {
                position: p & !3,
                target: t,
            }),
            0..5,
        ),
        proptest::collection::vec(arb_chunk(), 0..4),
        proptest::option::of(arb_chunk()),
    )
        .prop_map(|(reads, writes, reply)| ChunkLists { reads, writes, reply })
}

fn arb_header() -> impl Strategy<Value = Header> {
    let body = prop_oneof![
        arb_lists().prop_map(Body::Msg),
        arb_lists().prop_map(Body::NoMsg),
        Just(Body::Error(ErrorBody::Chunk)),
        (any::<u32>(), any::<u32>()).prop_map(|(low, high)| Body::Error(ErrorBody::Vers { low, high })),
    ];
    (any::<u32>(), any::<u32>(), body).prop_map(|(x, c, b)| Header::new(x, c, b))
}

proptest! {
    /// Random chunk lists round-trip, and the §4.7 size formula matches.
    #[test]
    fn prop_header_roundtrip(h in arb_header(), payload in proptest::collection::vec(any::<u8>(), 0..16)) {
        let mut b = h.to_vec().unwrap();
        prop_assert_eq!(b.len(), h.encoded_len());
        b.extend_from_slice(&payload);
        let (d, len) = decode(&b).unwrap();
        prop_assert_eq!(d, h);
        prop_assert_eq!(&b[len..], &payload[..]);
    }

    #[test]
    fn prop_decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&b);
        let mut w = words(&[1, 1, 1, 0]);
        w.extend_from_slice(&b);
        let _ = decode(&w);
    }
}
