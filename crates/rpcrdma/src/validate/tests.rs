//! One test per row of the header-validation acceptance matrix B.4.5.

use super::*;
use crate::rpc::{CallHeader, OpaqueAuth, RpcMessage};
use crate::wire::{ReadSegment, Segment, WriteChunk};
use crate::xdr::{ChunkSource, Decoder, Encoder, InsertedChunk, XdrDecode, XdrEncode};

fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_be_bytes()).collect()
}

/// An RPC Call payload (NULL-like header) followed by `args`.
fn rpc_call(xid: u32, args: &[u8]) -> Vec<u8> {
    let mut e = Encoder::new(Vec::new());
    CallHeader {
        xid,
        rpcvers: 2,
        prog: 0x20000001,
        vers: 1,
        proc_: 1,
        cred: OpaqueAuth::NONE,
        verf: OpaqueAuth::NONE,
    }
    .encode(&mut e)
    .unwrap();
    let (mut v, _) = e.finish();
    v.extend_from_slice(args);
    v
}

fn msg(xid: u32, lists: ChunkLists, payload: &[u8]) -> Vec<u8> {
    let mut v = Header::new(xid, 8, Body::Msg(lists)).to_vec().unwrap();
    v.extend_from_slice(payload);
    v
}

fn seg(h: u32, l: u32) -> Segment {
    Segment {
        handle: h,
        length: l,
        offset: 0x1000,
    }
}

fn responder(m: &[u8]) -> ResponderDecision<'_> {
    validate_call(m, &ResponderPolicy::default(), &FailedXids::new(8))
}

fn expect_err_chunk(d: &ResponderDecision<'_>, xid: u32, reason: ErrorReason) {
    match d {
        ResponderDecision::SendError {
            failed,
            err: ErrorBody::Chunk,
            reason: r,
        } => {
            assert_eq!((failed.xid, *r), (xid, reason));
            // RPCR-ERR-04: xid and vers echoed, proc RDMA_ERROR, ERR_CHUNK, 20 bytes
            let h = d.error_header(5).unwrap().to_vec().unwrap();
            assert_eq!(h, words(&[xid, 1, 5, 4, 2]));
        }
        other => panic!("expected ERR_CHUNK, got {other:?}"),
    }
}

#[test]
fn valid_short_call_is_processed() {
    let m = msg(1, ChunkLists::default(), &rpc_call(1, &[]));
    let ResponderDecision::Process(c) = responder(&m) else {
        panic!()
    };
    assert_eq!(c.payload, CallPayload::Inline(&m[28..]));
    assert!(c.read_chunks.is_empty());
    assert!(c.lists().is_empty());
}

/// Row 1 (RPCR-ERR-01): a 27-byte message is dropped silently.
#[test]
fn row01_27_byte_message_dropped() {
    let m = msg(1, ChunkLists::default(), &[]);
    assert_eq!(responder(&m[..27]), ResponderDecision::Drop(DropReason::TooShort));
}

/// Row 2 (RPCR-ERR-07): vers 0 or 2 -> ERR_VERS 1..1 with xid and vers echoed.
#[test]
fn row02_bad_version_gets_err_vers() {
    for vers in [0u32, 2] {
        let m = words(&[0xabcd, vers, 4, 0, 0, 0, 0]);
        let d = responder(&m);
        assert!(matches!(
            d,
            ResponderDecision::SendError {
                reason: ErrorReason::Version,
                ..
            }
        ));
        let h = d.error_header(3).unwrap().to_vec().unwrap();
        assert_eq!(h, words(&[0xabcd, vers, 3, 4, 1, 1, 1]));
    }
}

/// Row 3 (RPCR-ERR-08): rdma_proc 5 -> ERR_CHUNK.
#[test]
fn row03_unknown_proc_gets_err_chunk() {
    let m = words(&[7, 1, 4, 5, 0, 0, 0]);
    expect_err_chunk(&responder(&m), 7, ErrorReason::UnknownProc);
}

/// Row 4 (RPCR-ERR-10): RDMA_MSGP -> ERR_CHUNK (SHOULD).
#[test]
fn row04_msgp_gets_err_chunk() {
    let mut m = words(&[7, 1, 4, 2, 64, 1024, 0, 0, 0]);
    m.extend(rpc_call(7, &[]));
    expect_err_chunk(&responder(&m), 7, ErrorReason::Msgp);
}

/// Row 5 (RPCR-ERR-11): RDMA_DONE -> silent drop.
#[test]
fn row05_done_dropped() {
    let m = words(&[7, 1, 4, 3, 0, 0, 0]);
    assert_eq!(responder(&m), ResponderDecision::Drop(DropReason::RdmaDone));
}

/// Row 6 (RPCR-FRM-08): RDMA_ERROR at a Responder -> silent drop.
#[test]
fn row06_rdma_error_dropped_by_responder() {
    let m = words(&[7, 1, 4, 4, 1, 1, 1]);
    assert_eq!(responder(&m), ResponderDecision::Drop(DropReason::RdmaErrorAtResponder));
}

/// Row 7 (RPCR-FRM-07): RDMA_NOMSG with all three lists absent -> ERR_CHUNK; so is
/// one carrying only a Reply chunk (B.5 #3).
#[test]
fn row07_nomsg_without_payload_chunk() {
    let m = words(&[7, 1, 4, 1, 0, 0, 0]);
    expect_err_chunk(&responder(&m), 7, ErrorReason::NoPayloadChunk);
    let m = Header::new(
        7,
        4,
        Body::NoMsg(ChunkLists {
            reply: Some(WriteChunk {
                segments: vec![seg(1, 4096)],
            }),
            ..Default::default()
        }),
    )
    .to_vec()
    .unwrap();
    expect_err_chunk(&responder(&m), 7, ErrorReason::NoPayloadChunk);
}

/// Row 8 (RPCR-FRM-04): rdma_xid differs from the RPC XID -> ERR_CHUNK; and after
/// a Long Call's chunk is pulled, [`check_payload_xid`] says the same.
#[test]
fn row08_xid_mismatch() {
    let m = msg(7, ChunkLists::default(), &rpc_call(8, &[]));
    expect_err_chunk(&responder(&m), 7, ErrorReason::XidMismatch);
    assert_eq!(check_payload_xid(7, &rpc_call(8, &[])), Err(ErrorReason::XidMismatch));
    assert_eq!(check_payload_xid(7, &rpc_call(7, &[])), Ok(()));
    // RDMA_MSG with no payload at all
    let m = msg(7, ChunkLists::default(), &[]);
    expect_err_chunk(&responder(&m), 7, ErrorReason::XidMismatch);
}

/// Row 9: the Read list ends in the middle of a segment -> ERR_CHUNK.
#[test]
fn row09_truncated_read_list() {
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 24,
            target: seg(1, 100),
        }],
        ..Default::default()
    };
    let m = msg(7, lists, &[]);
    // cut inside the segment's offset field
    expect_err_chunk(&responder(&m[..36]), 7, ErrorReason::Xdr);
}

/// Row 10 (SEC-DOS-05): Write chunk count 0xFFFFFFFF -> ERR_CHUNK, nothing
/// allocated for it.
#[test]
fn row10_huge_write_chunk_count() {
    let mut m = words(&[7, 1, 4, 0, 0, 1, 0xffff_ffff, 0, 0]);
    m.extend(rpc_call(7, &[]));
    expect_err_chunk(&responder(&m), 7, ErrorReason::Xdr);
}

/// Row 11 (RPCR-RDC-02): Position not a multiple of four -> ERR_CHUNK.
#[test]
fn row11_unaligned_position() {
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 42,
            target: seg(1, 100),
        }],
        ..Default::default()
    };
    let m = msg(7, lists, &rpc_call(7, &[0, 0, 0, 100]));
    expect_err_chunk(&responder(&m), 7, ErrorReason::BadPosition);
}

/// Row 12: Position beyond the end of the rebuilt Payload stream -> ERR_CHUNK
/// (decision: detected by the transport, before any RDMA Read).
#[test]
fn row12_position_beyond_end() {
    let payload = rpc_call(7, &[0, 0, 0, 100]);
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: payload.len() as u32 + 8,
            target: seg(1, 100),
        }],
        ..Default::default()
    };
    let m = msg(7, lists, &payload);
    expect_err_chunk(&responder(&m), 7, ErrorReason::BadPosition);
    // the same chunk right at the end of the stream is fine at this stage
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: payload.len() as u32,
            target: seg(1, 100),
        }],
        ..Default::default()
    };
    let m = msg(7, lists, &payload);
    assert!(matches!(responder(&m), ResponderDecision::Process(_)));
}

/// Row 13: optional-data discriminator 2 -> ERR_CHUNK.
#[test]
fn row13_bad_optional_discriminator() {
    let mut m = words(&[7, 1, 4, 0, 2, 0, 0]);
    m.extend(rpc_call(7, &[]));
    expect_err_chunk(&responder(&m), 7, ErrorReason::Xdr);
}

/// A toy upper-layer binding: procedure 1 takes (u32 tag, opaque data<>), and
/// only `data` is DDP-eligible.
fn toy_decode_args<'a>(d: &mut Decoder<'a>) -> Result<(u32, &'a [u8]), XdrError> {
    let _ = RpcMessage::decode(d)?;
    let tag = d.get_u32()?;
    let data = d.get_opaque_ddp(1 << 20)?;
    d.finish_exact()?;
    Ok((tag, data))
}

/// Rows 14 (RPCR-DDP-07) and 15 (RPCR-ERR-09), and the valid case in between:
/// the chunk-aware decoder re-inserts the pulled Read chunk; a chunk at the
/// non-eligible `tag` is ERR_CHUNK (B.5 #11) and the procedure is not run; a
/// chunk whose length disagrees with the length word is GARBAGE_ARGS via
/// RDMA_MSG.
#[test]
fn row14_row15_ulp_decode_with_chunks() {
    let rpc = rpc_call(7, &[]);
    let tag_pos = rpc.len() as u32;
    let data = [0x5au8; 100];
    let mut reduced = rpc.clone();
    reduced.extend(words(&[0x77, 100])); // tag, data length; data reduced
    let run = |position: u32, chunk: &[u8], reduced: &[u8]| -> Result<(u32, Vec<u8>), XdrError> {
        let chunks = [InsertedChunk { position, data: chunk }];
        let mut d = Decoder::with_chunks(reduced, ChunkSource::Read(&chunks));
        toy_decode_args(&mut d).map(|(t, v)| (t, v.to_vec()))
    };
    // valid: the chunk sits at the data item
    assert_eq!(run(tag_pos + 8, &data, &reduced), Ok((0x77, data.to_vec())));

    // row 14: the Requester reduced the non-eligible tag instead
    let mut bad = rpc.clone();
    bad.extend(words(&[100]));
    bad.extend(data);
    let err = run(tag_pos, &[0, 0, 0, 0x77], &bad).unwrap_err();
    assert_eq!(classify_decode_error(&err), UlpFailure::ErrChunk);

    // row 15: chunk of 100 bytes while the length word says 200
    let mut bad = rpc.clone();
    bad.extend(words(&[0x77, 200]));
    let err = run(tag_pos + 8, &data, &bad).unwrap_err();
    assert_eq!(classify_decode_error(&err), UlpFailure::GarbageArgs);
    let call_lists = ChunkLists {
        writes: vec![WriteChunk {
            segments: vec![seg(3, 50)],
        }],
        ..Default::default()
    };
    let out = garbage_args_message(7, 4, &call_lists);
    let mut want = words(&[7, 1, 4, 0, 0, 1, 1, 3, 0, 0, 0x1000, 0, 0]);
    want.extend(words(&[7, 1, 0, 0, 0, 4]));
    assert_eq!(out, want);
}

/// Row 16 (RPCR-MEM-05): the Responder's RDMA Read fails (unregistered handle):
/// the engine closes the connection and records the XID; after reconnection the
/// retransmitted Call is answered ERR_CHUNK.
#[test]
fn row16_failed_rdma_read_then_err_chunk_after_reconnect() {
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 0,
            target: seg(0xdead, 64),
        }],
        ..Default::default()
    };
    let m = Header::new(9, 4, Body::NoMsg(lists)).to_vec().unwrap();
    let mut failed = FailedXids::new(4);
    let policy = ResponderPolicy::default();
    let ResponderDecision::Process(c) = validate_call(&m, &policy, &failed) else {
        panic!()
    };
    assert!(matches!(c.payload, CallPayload::PositionZero(_)));
    failed.record(9); // RDMA Read completed with a remote access error
    expect_err_chunk(&validate_call(&m, &policy, &failed), 9, ErrorReason::FailedXid);
    failed.forget(9);
    assert!(matches!(
        validate_call(&m, &policy, &failed),
        ResponderDecision::Process(_)
    ));
    // bounded memory
    for x in 0..10 {
        failed.record(x);
    }
    assert!(!failed.contains(0) && failed.contains(9));
}

fn provided() -> ChunkLists {
    ChunkLists {
        writes: vec![WriteChunk {
            segments: vec![seg(1, 4096)],
        }],
        ..Default::default()
    }
}

fn requester<'a>(m: &'a [u8], call: &ChunkLists) -> RequesterDecision<'a> {
    validate_reply(m, &Limits::default(), |x| (x == 7).then_some(call))
}

fn reply_payload(xid: u32) -> Vec<u8> {
    words(&[xid, 1, 0, 0, 0, 0])
}

#[test]
fn valid_reply_is_processed() {
    let mut l = provided();
    l.writes[0].segments[0].length = 36;
    let m = msg(7, l, &reply_payload(7));
    let RequesterDecision::Process(r) = requester(&m, &provided()) else {
        panic!()
    };
    assert_eq!(r.header.credit, 8);
    assert_eq!(r.payload, Some(&reply_payload(7)[..]));
    // unknown XID, wrong payload XID
    assert_eq!(
        validate_reply(&m, &Limits::default(), |_| None),
        RequesterDecision::Drop(DropReason::UnknownXid)
    );
    let m = msg(7, provided(), &reply_payload(8));
    assert_eq!(
        requester(&m, &provided()),
        RequesterDecision::Drop(DropReason::XidMismatch)
    );
}

/// Row 17 (RPCR-RDC-05): a Reply with a Read list -> silent drop.
#[test]
fn row17_reply_with_read_list_dropped() {
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 0,
            target: seg(1, 4),
        }],
        ..provided()
    };
    let m = msg(7, lists, &reply_payload(7));
    assert_eq!(
        requester(&m, &provided()),
        RequesterDecision::Drop(DropReason::ChunkMismatch)
    );
}

/// Row 18: a Write list with more chunks or segments than provided, or lengths
/// above the provided ones -> silent drop.
#[test]
fn row18_reply_write_list_mismatch_dropped() {
    let mut more_chunks = provided();
    more_chunks.writes.push(WriteChunk::default());
    let mut more_segs = provided();
    more_segs.writes[0].segments.push(seg(2, 0));
    let mut longer = provided();
    longer.writes[0].segments[0].length = 4097;
    for l in [more_chunks, more_segs, longer] {
        let m = msg(7, l, &reply_payload(7));
        assert_eq!(
            requester(&m, &provided()),
            RequesterDecision::Drop(DropReason::ChunkMismatch)
        );
    }
}

/// Row 19 (RPCR-ERR-05, B.5 #1): a 20-byte ERR_CHUNK fails the RPC permanently;
/// so does ERR_VERS; its credit is a grant.
#[test]
fn row19_err_chunk_fails_rpc() {
    let m = words(&[7, 1, 16, 4, 2]);
    assert_eq!(m.len(), 20);
    assert_eq!(
        requester(&m, &provided()),
        RequesterDecision::RpcFailed {
            xid: 7,
            credit: 16,
            error: ErrorBody::Chunk
        }
    );
    let m = words(&[7, 1, 16, 4, 1, 1, 1]);
    assert_eq!(
        requester(&m, &provided()),
        RequesterDecision::RpcFailed {
            xid: 7,
            credit: 16,
            error: ErrorBody::Vers { low: 1, high: 1 }
        }
    );
    // an ERR_VERS cut short cannot be decoded: dropped
    assert_eq!(
        requester(&m[..24], &provided()),
        RequesterDecision::Drop(DropReason::UndecodableError)
    );
}

/// Row 20 (RPCR-ERR-06): RDMA_ERROR with an unknown code -> silent drop.
#[test]
fn row20_unknown_err_code_dropped() {
    let m = words(&[7, 1, 16, 4, 7]);
    assert_eq!(
        requester(&m, &provided()),
        RequesterDecision::Drop(DropReason::UndecodableError)
    );
}

/// RPCR-ERR-03, -10, -11 at the Requester: malformed Replies, RDMA_MSGP,
/// RDMA_DONE, unknown procedures and versions are all dropped silently.
#[test]
fn requester_drops_everything_else() {
    let p = provided();
    let cases: [(Vec<u8>, DropReason); 7] = [
        (words(&[7, 1, 1, 2, 0, 0, 0, 0, 0]), DropReason::RdmaMsgp),
        (words(&[7, 1, 1, 3, 0, 0, 0]), DropReason::RdmaDone),
        (words(&[7, 1, 1, 9, 0, 0, 0]), DropReason::UnknownProc),
        (words(&[7, 2, 1, 0, 0, 0, 0]), DropReason::UnsupportedVersion),
        (words(&[7, 1, 1, 0, 0, 0]), DropReason::TooShort),
        (words(&[7, 1, 1, 0, 0, 1, 5, 0, 0]), DropReason::Malformed),
        (words(&[7, 1, 1, 1, 0, 0, 0]), DropReason::NoPayload),
    ];
    for (m, why) in cases {
        assert_eq!(requester(&m, &p), RequesterDecision::Drop(why), "{why:?}");
    }
    // a backward-direction Call (RFC 8167) is not a Reply
    let m = msg(7, ChunkLists::default(), &rpc_call(7, &[]));
    assert_eq!(
        requester(&m, &p),
        RequesterDecision::Drop(DropReason::BackwardDirection)
    );
}

/// B.5 #3 and #4: an RDMA_MSG Call with a Position-Zero chunk is refused; a Long
/// Call's other chunks are checked against the Position-Zero chunk's length, and
/// every chunk against the ULB limit (RPCR-SEC-05).
#[test]
fn long_call_positions_and_limits() {
    let r = |position, length| ReadSegment {
        position,
        target: seg(1, length),
    };
    let m = msg(
        7,
        ChunkLists {
            reads: vec![r(0, 64)],
            ..Default::default()
        },
        &rpc_call(7, &[]),
    );
    expect_err_chunk(&responder(&m), 7, ErrorReason::PositionZeroInMsg);

    let nomsg = |reads| {
        Header::new(
            7,
            1,
            Body::NoMsg(ChunkLists {
                reads,
                ..Default::default()
            }),
        )
        .to_vec()
        .unwrap()
    };
    let m = nomsg(vec![r(0, 100), r(0, 28), r(64, 4096)]);
    let ResponderDecision::Process(c) = responder(&m) else {
        panic!()
    };
    let CallPayload::PositionZero(p0) = &c.payload else {
        panic!()
    };
    assert_eq!(p0.total_len(), 128);
    assert_eq!(c.read_chunks.len(), 1);
    let m = nomsg(vec![r(0, 100), r(200, 4)]);
    expect_err_chunk(&responder(&m), 7, ErrorReason::BadPosition);
    let m = nomsg(vec![r(0, 100), r(64, 1 << 30)]);
    expect_err_chunk(&responder(&m), 7, ErrorReason::ChunkTooLarge);
    let m = nomsg(vec![r(0, u32::MAX)]);
    expect_err_chunk(&responder(&m), 7, ErrorReason::ChunkTooLarge);
    // a backward-direction Reply at the Responder
    let m = msg(7, ChunkLists::default(), &reply_payload(7));
    assert_eq!(responder(&m), ResponderDecision::Drop(DropReason::BackwardDirection));
}
