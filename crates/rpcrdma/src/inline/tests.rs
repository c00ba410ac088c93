use super::*;
use crate::wire::{Segment, WriteChunk};
use crate::xdr::Encoder;

fn one(_: usize) -> usize {
    1
}

fn th(call: u32, reply: u32) -> Thresholds {
    Thresholds { call, reply }
}

/// A stream of `total` bytes (a multiple of 4) with no eligible item.
fn plain(total: usize) -> Vec<u8> {
    vec![0x11; total]
}

/// u32 prefix, one eligible opaque of `len` bytes, then filler up to `total`.
fn with_item(len: usize, total: usize) -> (Vec<u8>, Vec<DdpItem>) {
    let mut e = Encoder::new(Vec::new());
    e.put_u32(1).unwrap();
    e.put_opaque_ddp(&vec![7; len], 1 << 20).unwrap();
    while e.position() < total {
        e.put_u32(0).unwrap();
    }
    e.finish()
}

fn seg(h: u32, l: u32) -> Segment {
    Segment {
        handle: h,
        length: l,
        offset: u64::from(h) << 12,
    }
}

/// RPCR-FRM-09 / RPCR-INL-02: a 1024-byte Call (28-byte header + 996 payload)
/// against thresholds 1025 (total = T-1), 1024 (T) and 1023 (T+1).
#[test]
fn call_threshold_minus_one_equal_plus_one() {
    let s = plain(996);
    let none = ChunkLists::default();
    for (t, short) in [(1025, true), (1024, true), (1023, false)] {
        let p = plan_call(&th(t, 1024), &s, &[], &none, one, CallOptions::default()).unwrap();
        assert_eq!(p.form == CallForm::Short, short, "threshold {t}");
        if short {
            assert_eq!(p.send_len, 1024);
        } else {
            assert_eq!(p.form, CallForm::Long);
            assert_eq!(p.header_len, 28 + 24);
        }
    }
}

/// Same boundary on the XDR grid with the default threshold: 1020 and 1024 go
/// Short, 1028 does not; the provisioned Reply chunk counts in the Call header.
#[test]
fn call_threshold_with_header_counted() {
    let none = ChunkLists::default();
    let d = Thresholds::default();
    for (payload, short) in [(992, true), (996, true), (1000, false)] {
        let p = plan_call(&d, &plain(payload), &[], &none, one, CallOptions::default()).unwrap();
        assert_eq!(p.form == CallForm::Short, short, "payload {payload}");
    }
    let with_reply_chunk = ChunkLists {
        reply: Some(WriteChunk {
            segments: vec![seg(1, 4096)],
        }),
        ..Default::default()
    };
    // header 16 + 4 + 4 + (4 + 4 + 16) = 48: 976 fits, 980 does not
    let p = plan_call(&d, &plain(976), &[], &with_reply_chunk, one, CallOptions::default()).unwrap();
    assert_eq!((p.form, p.send_len), (CallForm::Short, 1024));
    let p = plan_call(&d, &plain(980), &[], &with_reply_chunk, one, CallOptions::default()).unwrap();
    assert_eq!(p.form, CallForm::Long);
}

/// Chunked Call: the Read segment (24 bytes) counts in the header. A reduced
/// Call of exactly the threshold is Chunked; 4 bytes more is Long.
#[test]
fn chunked_call_boundary() {
    let none = ChunkLists::default();
    let d = Thresholds::default();
    // item of 4096 bytes; reduced payload = total - 4096; header = 28 + 24 = 52
    for (reduced, chunked) in [(968usize, true), (972, true), (976, false)] {
        let (s, items) = with_item(4096, reduced + 4096);
        let p = plan_call(&d, &s, &items, &none, one, CallOptions::default()).unwrap();
        match p.form {
            CallForm::Chunked(r) => {
                assert!(chunked, "reduced {reduced}");
                assert_eq!(r.items[0].position, 8);
                assert_eq!(p.send_len, 52 + reduced);
            }
            CallForm::Long => assert!(!chunked, "reduced {reduced}"),
            CallForm::Short => panic!("cannot be short"),
        }
    }
}

/// RPCR-LNG-03 and RPCR-DDP-10: a forced Long Call, and no reduction under
/// RPCSEC_GSS integrity/privacy (the Call goes Long instead of Chunked).
#[test]
fn forced_long_and_no_reduction() {
    let none = ChunkLists::default();
    let d = Thresholds::default();
    let p = plan_call(
        &d,
        &plain(8),
        &[],
        &none,
        one,
        CallOptions {
            force_long: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(p.form, CallForm::Long);
    let (s, items) = with_item(4096, 4200);
    let p = plan_call(
        &d,
        &s,
        &items,
        &none,
        one,
        CallOptions {
            no_reduction: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(p.form, CallForm::Long);
    // a header that cannot fit at all
    let err = plan_call(
        &th(1024, 1024),
        &plain(4096),
        &[],
        &none,
        |_| 50,
        CallOptions::default(),
    );
    assert!(matches!(err, Err(InlineError::HeaderTooLarge { .. })));
}

/// RPCR-LNG-04: a Reply chunk exactly when the largest Reply (28-byte header +
/// payload) exceeds the reply threshold: 995/996/997 against 1024.
#[test]
fn reply_resources_threshold_boundary() {
    let d = Thresholds::default();
    for (max, chunk) in [(995u32, false), (996, false), (997, true)] {
        let r = plan_reply_resources(&d, max, &[], one, CallOptions::default());
        assert_eq!(r.reply_chunk.is_some(), chunk, "max {max}");
        assert!(r.write_chunks.is_empty());
    }
    // padding lengths 0..=3: the Reply chunk capacity keeps the roundup
    for max in 1997..=2000u32 {
        let r = plan_reply_resources(&d, max, &[], one, CallOptions::default());
        assert_eq!(r.reply_chunk, Some(2000));
    }
    assert_eq!(max_rpc_reply_header(0), 24);
    assert_eq!(max_rpc_reply_header(5), 32);
}

/// RPCR-WRC-01: eligible results get Write chunks of their maximum size (no
/// pad); when the reduced Reply still does not fit, a Reply chunk as well.
#[test]
fn reply_resources_write_chunks() {
    let d = Thresholds::default();
    // READ of up to 1 MiB with ~120 bytes of other results: Write chunk only.
    // Header with one 1-segment Write chunk: 16 + 4 + (4 + 4 + 4 + 16) + 4 = 52
    let r = plan_reply_resources(&d, 120 + (1 << 20), &[1 << 20], one, CallOptions::default());
    assert_eq!(r.write_chunks, vec![1 << 20]);
    assert_eq!(r.reply_chunk, None);
    // boundary: reduced 972 + 52 = 1024 fits; 976 + 52 does not
    let r = plan_reply_resources(&d, 972 + 4096, &[4096], one, CallOptions::default());
    assert_eq!(r.reply_chunk, None);
    let r = plan_reply_resources(&d, 976 + 4096, &[4096], one, CallOptions::default());
    assert_eq!(r.reply_chunk, Some(976));
    // GSS integrity: no Write chunks, Reply chunk for everything
    let r = plan_reply_resources(
        &d,
        5000,
        &[4096],
        one,
        CallOptions {
            no_reduction: true,
            ..Default::default()
        },
    );
    assert!(r.write_chunks.is_empty());
    assert_eq!(r.reply_chunk, Some(5000));
}

fn reply_stream(len: usize) -> Vec<u8> {
    vec![0x22; len]
}

/// RPCR-LNG-05/06, Responder side at T-1, T, T+1 with the header counted. The
/// Call provided a one-segment Reply chunk, which the Short Reply echoes unused
/// (header 16 + 4 + 4 + 4 + 4 + 16 = 48).
#[test]
fn responder_reply_threshold_boundary() {
    let call = ChunkLists {
        reply: Some(WriteChunk {
            segments: vec![seg(5, 8192)],
        }),
        ..Default::default()
    };
    let s = reply_stream(976); // 48 + 976 = 1024
    for (t, short) in [(1025u32, true), (1024, true), (1023, false)] {
        let p = plan_reply(&th(1024, t), 9, 32, &s, &[], &call).unwrap();
        assert_eq!(p.form == ReplyForm::Short, short, "threshold {t}");
        let Some(lists) = p.header.body.lists() else { panic!() };
        if short {
            assert_eq!(p.send_len(), 1024);
            assert_eq!(lists.reply.as_ref().unwrap().segments, vec![seg(5, 0)]);
        } else {
            assert!(matches!(p.header.body, Body::NoMsg(_)));
            assert_eq!(lists.reply.as_ref().unwrap().segments, vec![seg(5, 976)]);
            assert_eq!(p.payload_writes.len(), 1);
            assert_eq!(p.payload_writes[0].src, 0..976);
        }
    }
}

/// B.5 #6: too big, no Reply chunk -> an error (the caller answers ERR_CHUNK);
/// a Reply chunk too small -> an error too.
#[test]
fn responder_reply_too_large() {
    let none = ChunkLists::default();
    let err = plan_reply(&Thresholds::default(), 1, 1, &reply_stream(1000), &[], &none);
    assert_eq!(
        err,
        Err(InlineError::ReplyTooLarge {
            len: 1028,
            threshold: 1024
        })
    );
    let small = ChunkLists {
        reply: Some(WriteChunk {
            segments: vec![seg(5, 100)],
        }),
        ..Default::default()
    };
    let err = plan_reply(&Thresholds::default(), 1, 1, &reply_stream(2000), &[], &small);
    assert!(matches!(
        err,
        Err(InlineError::Chunk(ChunkError::ReplyChunkTooSmall { .. }))
    ));
}

/// Padding lengths 0..=3 for Reply chunks: an odd-length opaque inside a Long
/// Reply travels with its pad (RPCR-LNG-08); the echoed length is the padded
/// Payload stream length.
#[test]
fn reply_chunk_padding_lengths_0_to_3() {
    let call = ChunkLists {
        reply: Some(WriteChunk {
            segments: vec![seg(5, 8192)],
        }),
        ..Default::default()
    };
    for len in 2001..=2004usize {
        let mut e = Encoder::new(Vec::new());
        e.put_opaque(&vec![3u8; len], 4096).unwrap();
        let (s, _) = e.finish();
        let p = plan_reply(&Thresholds::default(), 1, 1, &s, &[], &call).unwrap();
        assert_eq!(p.form, ReplyForm::Long);
        let echoed = p.header.body.lists().unwrap().reply.as_ref().unwrap().segments[0].length;
        assert_eq!(echoed as usize, 4 + 2004);
        assert_eq!(p.payload.len() % 4, 0);
    }
}

/// Write chunks on the Responder side: unused and empty chunks echoed exactly,
/// the header (with the echoed Write list) counted against the threshold.
#[test]
fn responder_write_chunks_echoed_and_counted() {
    let mut e = Encoder::new(Vec::new());
    e.put_u32(0).unwrap();
    e.put_opaque_ddp(&vec![1u8; 5000], 1 << 20).unwrap();
    let (s, items) = e.finish();
    let call = ChunkLists {
        writes: vec![
            WriteChunk {
                segments: vec![seg(1, 8192)],
            },
            WriteChunk::default(),
            WriteChunk {
                segments: vec![seg(2, 10), seg(3, 10)],
            },
        ],
        ..Default::default()
    };
    let p = plan_reply(&Thresholds::default(), 1, 1, &s, &items, &call).unwrap();
    assert_eq!(p.form, ReplyForm::Short);
    let l = p.header.body.lists().unwrap();
    assert_eq!(l.writes[0].segments, vec![seg(1, 5000)]);
    assert_eq!(l.writes[1], WriteChunk::default());
    assert_eq!(l.writes[2].segments, vec![seg(2, 0), seg(3, 0)]);
    assert_eq!(p.payload, [0, 0, 0, 0, 0, 0, 0x13, 0x88]);
    assert_eq!(p.item_writes.len(), 1);
    // header = 16 + 4 + (4+4+16) + (4+4) + (4+4+32) + 4 = 100
    assert_eq!(p.send_len(), 100 + 8);
}

/// The two header-size helpers agree with the encoder (RFC 8166 §4.7 formula).
#[test]
fn header_len_helpers_agree_with_encoding() {
    let writes = vec![
        WriteChunk {
            segments: vec![seg(1, 1), seg(2, 2), seg(3, 3)],
        },
        WriteChunk::default(),
    ];
    let reply = WriteChunk {
        segments: vec![seg(4, 4)],
    };
    let h = Header::new(
        1,
        1,
        Body::Msg(ChunkLists {
            reads: vec![Default::default(); 2],
            writes: writes.clone(),
            reply: Some(reply.clone()),
        }),
    );
    assert_eq!(header_len(2, &writes, Some(&reply)), h.encoded_len());
    assert_eq!(header_len_for_counts(2, &[3, 0], Some(1)), h.encoded_len());
    assert_eq!(header_len(0, &[], None), crate::wire::MIN_HEADER_LEN);
    assert_eq!(header_len(usize::MAX, &[], None), usize::MAX);
}
