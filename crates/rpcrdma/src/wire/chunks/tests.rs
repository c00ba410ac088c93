use super::*;
use crate::rpc::{AcceptStat, AuthSys, CallHeader, OpaqueAuth, ReplyHeader};
use crate::wire::{Body, Header, Limits};
use crate::xdr::{ChunkSource, Decoder, Encoder, ReturnedWriteChunk, XdrEncode};
use proptest::prelude::*;

fn seg(handle: u32, length: u32, offset: u64) -> Segment {
    Segment { handle, length, offset }
}

fn rs(position: u32, handle: u32, length: u32) -> ReadSegment {
    ReadSegment {
        position,
        target: seg(handle, length, 0),
    }
}

/// B.5 #7: same-Position segments form one chunk in list order; chunks sorted.
#[test]
fn group_read_list_by_position() {
    let c = group_read_list(&[rs(16, 1, 1), rs(0, 2, 2), rs(16, 3, 4093)]).unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(c[0].position, 0);
    assert_eq!(c[1].position, 16);
    assert_eq!(c[1].segments.iter().map(|s| s.handle).collect::<Vec<_>>(), [1, 3]);
    assert_eq!(c[1].total_len(), 4094);
}

/// RPCR-RDC-02 / B.4.5 #11: a Position that is not a multiple of four.
#[test]
fn position_not_multiple_of_four() {
    assert_eq!(group_read_list(&[rs(6, 1, 4)]), Err(ChunkError::PositionNotAligned(6)));
}

/// RPCR-RDC-01 / RPCR-DDP-06, item lengths 5..=8: the reduced stream loses
/// len + pad bytes, and the second item's Position counts the first item's data
/// *and* pad (B.5 #8).
#[test]
fn reduce_two_items_every_pad_length() {
    for len in 5..=8usize {
        let a: Vec<u8> = vec![0xaa; len];
        let b = [0xbb; 3];
        let mut e = Encoder::new(Vec::new());
        e.put_u32(0x11).unwrap();
        e.put_opaque_ddp(&a, 64).unwrap();
        e.put_opaque_ddp(&b, 64).unwrap();
        e.put_u32(0x22).unwrap();
        let (stream, items) = e.finish();
        let r = reduce(&stream, &items).unwrap();
        let padded = len + crate::xdr::pad_len(len);
        assert_eq!(r.payload.len(), stream.len() - padded - 4);
        assert_eq!(r.items[0].position, 8);
        assert_eq!(r.items[1].position as usize, 8 + padded + 4);
        assert_eq!(&stream[r.items[0].range.clone()], &a[..]);
        // re-insert (unpadded chunks) gives the original stream back
        let chunks = [
            InsertedChunk {
                position: r.items[0].position,
                data: &a,
            },
            InsertedChunk {
                position: r.items[1].position,
                data: &b,
            },
        ];
        assert_eq!(reinsert(&r.payload, &chunks).unwrap(), stream);
        // and so does the decoder, without copying
        let mut d = Decoder::with_chunks(&r.payload, ChunkSource::Read(&chunks));
        assert_eq!(d.get_u32().unwrap(), 0x11);
        assert_eq!(d.get_opaque_ddp(64).unwrap(), &a[..]);
        assert_eq!(d.get_opaque_ddp(64).unwrap(), &b[..]);
        assert_eq!(d.get_u32().unwrap(), 0x22);
        d.finish_exact().unwrap();
    }
}

/// Padding lengths 0..=3 for Read chunks: with pad and without, the chunk
/// re-inserts to the same stream (RPCR-RDC-04).
#[test]
fn read_chunk_padding_lengths_0_to_3() {
    for len in 8..=11usize {
        let data: Vec<u8> = (0..len as u8).collect();
        let mut e = Encoder::new(Vec::new());
        e.put_opaque_ddp(&data, 64).unwrap();
        e.put_u32(7).unwrap();
        let (stream, items) = e.finish();
        let r = reduce(&stream, &items).unwrap();
        assert_eq!(r.payload, [&(len as u32).to_be_bytes()[..], &[0, 0, 0, 7]].concat());
        let mut padded = data.clone();
        padded.resize(crate::xdr::roundup(len).unwrap(), 0);
        for chunk in [&data[..], &padded[..]] {
            let c = [InsertedChunk {
                position: 4,
                data: chunk,
            }];
            assert_eq!(reinsert(&r.payload, &c).unwrap(), stream, "len {len}");
        }
    }
}

#[test]
fn zero_length_items_stay_inline() {
    let mut e = Encoder::new(Vec::new());
    e.put_opaque_ddp(&[], 4).unwrap();
    let (stream, items) = e.finish();
    let r = reduce(&stream, &items).unwrap();
    assert!(r.items.is_empty());
    assert_eq!(r.payload, stream);
}

#[test]
fn bad_items_are_rejected() {
    let stream = [0u8; 16];
    let it = |offset, len| DdpItem { offset, len };
    assert!(reduce(&stream, &[it(2, 4)]).is_err()); // misaligned
    assert!(reduce(&stream, &[it(12, 5)]).is_err()); // past the end
    assert!(reduce(&stream, &[it(4, 8), it(8, 4)]).is_err()); // overlapping
    assert!(reduce(&stream, &[it(4, usize::MAX)]).is_err()); // overflow
}

/// B.4.5 #12: Positions beyond the rebuilt stream, checked before RDMA Read;
/// RPCR-SEC-05: a chunk above the ULB limit.
#[test]
fn read_positions_checked_before_rdma_read() {
    let chunks = group_read_list(&[rs(4, 1, 5), rs(16, 2, 3)]).unwrap();
    // reduced stream: 4 bytes, chunk (5 -> 8 unreduced), then 4 more reduced bytes
    check_read_positions(8, &chunks, 1 << 20).unwrap();
    assert!(matches!(
        check_read_positions(7, &chunks, 1 << 20),
        Err(ChunkError::PositionOutOfRange { position: 16 })
    ));
    assert!(matches!(
        check_read_positions(8, &chunks, 4),
        Err(ChunkError::ChunkTooLarge { len: 5, max: 4 })
    ));
    // second chunk inside the first one's unreduced bytes
    let inside = group_read_list(&[rs(4, 1, 8), rs(8, 2, 4)]).unwrap();
    assert!(check_read_positions(100, &inside, 1 << 20).is_err());
    let chunks = [InsertedChunk {
        position: 64,
        data: &[1],
    }];
    assert!(matches!(
        reinsert(&[0; 8], &chunks),
        Err(ChunkError::PositionOutOfRange { position: 64 })
    ));
}

fn auth_sys_body() -> Vec<u8> {
    AuthSys {
        stamp: 0,
        machinename: b"rdmalab-vm",
        uid: 0,
        gid: 0,
        gids: vec![],
    }
    .encode_body()
    .unwrap()
}

/// Golden: the Linux client's NFSv3 WRITE of 64 KiB (lab frame 355). Encoding
/// the same call with the WRITE data marked DDP-eligible (RFC 8267 §4.1) and
/// reducing it gives Linux's Position 116 and its exact reduced Payload stream.
#[test]
fn golden_linux_nfs3_write_reduction() {
    let frame: &[u8] = include_bytes!("../../../testdata/linux/lo-frame355.bin");
    let (hdr, len) = Header::decode(frame, &Limits::default()).unwrap();
    let cred = auth_sys_body();
    let fh: [u8; 20] = frame[0x80..0x94].try_into().unwrap();
    let data = vec![0x5a; 65536];
    let mut e = Encoder::new(Vec::new());
    CallHeader {
        xid: hdr.xid,
        rpcvers: 2,
        prog: 100003,
        vers: 3,
        proc_: 7,
        cred: AuthSys::credential(&cred),
        verf: OpaqueAuth::NONE,
    }
    .encode(&mut e)
    .unwrap();
    e.put_opaque(&fh, 64).unwrap(); // nfs_fh3
    e.put_u64(0).unwrap(); // offset
    e.put_u32(65536).unwrap(); // count
    e.put_enum(2).unwrap(); // FILE_SYNC
    e.put_opaque_ddp(&data, 1 << 20).unwrap(); // data<>: DDP-eligible
    let (stream, items) = e.finish();
    let r = reduce(&stream, &items).unwrap();
    assert_eq!(r.items.len(), 1);
    assert_eq!(r.items[0].position, 116);
    assert_eq!(r.payload, &frame[len..]);
    let Body::Msg(l) = hdr.body else { panic!() };
    assert_eq!(l.reads[0].position, r.items[0].position);
    assert_eq!(l.reads[0].target.length as usize, r.items[0].range.len());
}

/// The READ3res of lab frame 41 (Linux server): status, post_op_attr with a
/// fattr3, count, eof, and the 36-byte data reduced into the client's Write chunk.
fn read3_reply_stream(xid: u32, fattr: &[u8], data: &[u8]) -> (Vec<u8>, Vec<DdpItem>) {
    let mut e = Encoder::new(Vec::new());
    ReplyHeader::accepted(xid, AcceptStat::Success).encode(&mut e).unwrap();
    e.put_u32(0).unwrap(); // NFS3_OK
    e.put_bool(true).unwrap(); // attributes follow
    e.put_opaque_fixed(fattr).unwrap(); // fattr3
    e.put_u32(data.len() as u32).unwrap(); // count
    e.put_bool(true).unwrap(); // eof
    e.put_opaque_ddp(data, 1 << 20).unwrap(); // data<>: DDP-eligible
    e.finish()
}

/// Golden (Responder side): reducing that reply into the Write chunk the client
/// provided in frame 39 reproduces frame 41's Write list and Payload stream.
#[test]
fn golden_linux_nfs3_read_reply_reduction() {
    let call: &[u8] = include_bytes!("../../../testdata/linux/lo-frame39.bin");
    let reply: &[u8] = include_bytes!("../../../testdata/linux/lo-frame41.bin");
    let (ch, _) = Header::decode(call, &Limits::default()).unwrap();
    let (rh, rlen) = Header::decode(reply, &Limits::default()).unwrap();
    let payload = &reply[rlen..];
    let fattr = &payload[32..32 + 84];
    let data = b"hello from rdmalab-vm over NFS/RDMA\n";
    let (stream, items) = read3_reply_stream(rh.xid, fattr, data);
    let Body::Msg(cl) = &ch.body else { panic!() };
    let red = reduce_reply(&stream, &items, &cl.writes).unwrap();
    assert_eq!(red.payload, payload);
    let Body::Msg(rl) = &rh.body else { panic!() };
    assert_eq!(red.write_list, rl.writes);
    assert_eq!(
        red.writes,
        vec![RdmaWrite {
            handle: 0x34801901,
            remote_offset: 0xb61c4fb709819000,
            src: items[0].offset..items[0].offset + 36
        }]
    );
    check_returned_chunks(cl, rl).unwrap();

    // Requester side: decode frame 41 with the Write chunk's data re-inserted
    // (RPCR-WRC-11).
    let chunks = [ReturnedWriteChunk::Data(&data[..])];
    let mut d = Decoder::with_chunks(payload, ChunkSource::Write(&chunks));
    let _ = <crate::rpc::RpcMessage as crate::xdr::XdrDecode>::decode(&mut d).unwrap();
    assert_eq!(d.get_u32().unwrap(), 0);
    assert!(d.get_bool().unwrap());
    d.get_opaque_fixed(84).unwrap();
    assert_eq!(d.get_u32().unwrap(), 36);
    assert!(d.get_bool().unwrap());
    assert_eq!(d.get_opaque_ddp(4096).unwrap(), data);
    d.finish_exact().unwrap();
}

/// RPCR-WRC-02: 10000 bytes into segments of 4096 each: 4096/4096/1808.
#[test]
fn write_chunk_filled_in_segment_order() {
    let data = vec![1u8; 10000];
    let mut e = Encoder::new(Vec::new());
    e.put_opaque_ddp(&data, 1 << 20).unwrap();
    let (stream, items) = e.finish();
    let chunk = WriteChunk {
        segments: vec![seg(1, 4096, 0x1000), seg(2, 4096, 0x2000), seg(3, 4096, 0x3000)],
    };
    let r = reduce_reply(&stream, &items, std::slice::from_ref(&chunk)).unwrap();
    assert_eq!(
        r.write_list[0].segments.iter().map(|s| s.length).collect::<Vec<_>>(),
        [4096, 4096, 1808]
    );
    assert_eq!(r.writes.len(), 3);
    assert_eq!(r.writes[2].src, 4 + 8192..4 + 10000);
    assert_eq!(r.payload, 10000u32.to_be_bytes());
    // too small
    let small = WriteChunk {
        segments: vec![seg(1, 9999, 0)],
    };
    assert!(matches!(
        reduce_reply(&stream, &items, &[small]),
        Err(ChunkError::WriteChunkTooSmall { need: 10000, .. })
    ));
}

/// RPCR-WRC-04, padding lengths 0..=3 for Write chunks: the returned length is
/// the item length exactly; no pad is written; the reduced stream keeps only
/// the length word.
#[test]
fn write_chunk_padding_lengths_0_to_3() {
    for len in 4..=7usize {
        let data = vec![9u8; len];
        let mut e = Encoder::new(Vec::new());
        e.put_opaque_ddp(&data, 64).unwrap();
        e.put_u32(0xee).unwrap();
        let (stream, items) = e.finish();
        let chunk = WriteChunk {
            segments: vec![seg(1, 64, 0)],
        };
        let r = reduce_reply(&stream, &items, &[chunk]).unwrap();
        assert_eq!(r.write_list[0].segments[0].length as usize, len);
        assert_eq!(r.writes[0].src.len(), len);
        assert_eq!(r.payload, [&(len as u32).to_be_bytes()[..], &[0, 0, 0, 0xee]].concat());
    }
}

/// RPCR-WRC-06/08/10: two results, chunks [empty, 1 segment, 2 segments]: the
/// first result stays inline and its empty chunk is echoed empty; the second uses
/// chunk 1; chunk 2 comes back unused with the same segment count.
#[test]
fn empty_and_unused_write_chunks_echoed_exactly() {
    let mut e = Encoder::new(Vec::new());
    e.put_opaque_ddp(&[1, 2, 3], 64).unwrap();
    e.put_opaque_ddp(&[4, 5], 64).unwrap();
    let (stream, items) = e.finish();
    let provided = [
        WriteChunk::default(),
        WriteChunk {
            segments: vec![seg(7, 100, 0x700)],
        },
        WriteChunk {
            segments: vec![seg(8, 100, 0x800), seg(9, 100, 0x900)],
        },
    ];
    let r = reduce_reply(&stream, &items, &provided).unwrap();
    assert_eq!(r.write_list[0], WriteChunk::default());
    assert_eq!(r.write_list[1].segments, vec![seg(7, 2, 0x700)]);
    assert_eq!(r.write_list[2].segments, vec![seg(8, 0, 0x800), seg(9, 0, 0x900)]);
    assert!(r.write_list[2].is_unused());
    assert_eq!(r.payload, [0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 0, 2]);
    // the Requester decodes it back
    let chunks = [
        ReturnedWriteChunk::Empty,
        ReturnedWriteChunk::Data(&[4, 5]),
        ReturnedWriteChunk::Data(&[]),
    ];
    let mut d = Decoder::with_chunks(&r.payload, ChunkSource::Write(&chunks));
    assert_eq!(d.get_opaque_ddp(64).unwrap(), &[1, 2, 3]);
    assert_eq!(d.get_opaque_ddp(64).unwrap(), &[4, 5]);
    d.finish_exact().unwrap();
    let call = ChunkLists {
        writes: provided.to_vec(),
        ..Default::default()
    };
    let ret = ChunkLists {
        writes: r.write_list.clone(),
        ..Default::default()
    };
    check_returned_chunks(&call, &ret).unwrap();
}

/// Reply chunk: frame 33's numbers (segments 124/65536/4, reply of 904 bytes ->
/// 124/780/0); padding lengths 0..=3 of the payload are carried (RPCR-LNG-08).
#[test]
fn reply_chunk_fill_and_sizing() {
    let chunk = WriteChunk {
        segments: vec![seg(1, 124, 0x10), seg(2, 65536, 0x20), seg(3, 4, 0x30)],
    };
    let (echo, writes) = fill_reply_chunk(904, &chunk).unwrap();
    assert_eq!(
        echo.segments.iter().map(|s| s.length).collect::<Vec<_>>(),
        [124, 780, 0]
    );
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[1].src, 124..904);
    assert!(matches!(
        fill_reply_chunk(65665, &chunk),
        Err(ChunkError::ReplyChunkTooSmall { .. })
    ));
    for max in 101..=104u32 {
        assert_eq!(reply_chunk_capacity(max), Some(104));
        assert_eq!(write_chunk_capacity(max), max);
    }
    assert_eq!(reply_chunk_capacity(u32::MAX), None);
    assert_eq!(
        position_zero_read_list(&[seg(1, 8, 0), seg(2, 8, 8)])
            .iter()
            .map(|r| r.position)
            .collect::<Vec<_>>(),
        [0, 0]
    );
}

/// B.4.5 #17 and #18: replies whose chunk lists disagree with the call.
#[test]
fn returned_chunks_must_match_the_call() {
    let call = ChunkLists {
        writes: vec![WriteChunk {
            segments: vec![seg(1, 100, 0x10)],
        }],
        reply: Some(WriteChunk {
            segments: vec![seg(2, 100, 0x20)],
        }),
        ..Default::default()
    };
    let ok = |r: &ChunkLists| check_returned_chunks(&call, r);
    let mut r = call.clone();
    ok(&r).unwrap();
    r.reply = None; // absent reply chunk accepted (B.5 #5)
    ok(&r).unwrap();
    let mut r = call.clone();
    r.reads = vec![rs(0, 1, 1)];
    assert!(ok(&r).is_err());
    let mut r = call.clone();
    r.writes.push(WriteChunk::default());
    assert!(ok(&r).is_err());
    let mut r = call.clone();
    r.writes[0].segments[0].length = 101;
    assert!(ok(&r).is_err());
    let mut r = call.clone();
    r.writes[0].segments.push(seg(1, 0, 0));
    assert!(ok(&r).is_err());
    let mut r = call.clone();
    r.writes[0].segments[0].handle = 9;
    assert!(ok(&r).is_err());
    let mut r = call.clone();
    r.reply.as_mut().unwrap().segments[0].offset = 0;
    assert!(ok(&r).is_err());
    let no_reply_chunk = ChunkLists {
        reply: None,
        ..call.clone()
    };
    assert!(check_returned_chunks(&no_reply_chunk, &call).is_err());
}

proptest! {
    /// Reduce then re-insert (copying and zero-copy) is the identity, for random
    /// item lengths, with chunks given with or without pad.
    #[test]
    fn prop_reduce_reinsert(lens in proptest::collection::vec(0usize..13, 0..5), with_pad in any::<bool>()) {
        let mut e = Encoder::new(Vec::new());
        let datas: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, l)| vec![i as u8 + 1; *l]).collect();
        for d in &datas {
            e.put_u32(0xf0).unwrap();
            e.put_opaque_ddp(d, 64).unwrap();
        }
        let (stream, items) = e.finish();
        let r = reduce(&stream, &items).unwrap();
        let padded: Vec<Vec<u8>> = r.items.iter().map(|it| {
            let mut v = stream[it.range.clone()].to_vec();
            if with_pad { v.resize(crate::xdr::roundup(v.len()).unwrap(), 0); }
            v
        }).collect();
        let chunks: Vec<InsertedChunk<'_>> = r.items.iter().zip(&padded)
            .map(|(it, d)| InsertedChunk { position: it.position, data: d }).collect();
        prop_assert_eq!(reinsert(&r.payload, &chunks).unwrap(), stream.clone());
        let reads: Vec<ReadSegment> = r.items.iter().map(|it| rs(it.position, 1, it.range.len() as u32)).collect();
        let grouped = group_read_list(&reads).unwrap();
        prop_assert!(check_read_positions(r.payload.len(), &grouped, u64::MAX).is_ok());
        let mut d = Decoder::with_chunks(&r.payload, ChunkSource::Read(&chunks));
        for want in &datas {
            prop_assert_eq!(d.get_u32().unwrap(), 0xf0);
            prop_assert_eq!(d.get_opaque_ddp(64).unwrap(), &want[..]);
        }
        d.finish_exact().unwrap();
    }
}
