use super::*;
use proptest::prelude::*;

fn enc() -> Encoder<Vec<u8>> {
    Encoder::new(Vec::new())
}

#[test]
fn primitives_golden() {
    let mut e = enc();
    e.put_u32(0x11223344).unwrap();
    e.put_i32(-2).unwrap();
    e.put_u64(0x0102030405060708).unwrap();
    e.put_i64(-1).unwrap();
    e.put_bool(true).unwrap();
    e.put_enum(4).unwrap();
    let (b, items) = e.finish();
    assert!(items.is_empty());
    assert_eq!(
        b,
        [
            0x11, 0x22, 0x33, 0x44, 0xff, 0xff, 0xff, 0xfe, 1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 4
        ]
    );
    let mut d = Decoder::new(&b);
    assert_eq!(d.get_u32().unwrap(), 0x11223344);
    assert_eq!(d.get_i32().unwrap(), -2);
    assert_eq!(d.get_u64().unwrap(), 0x0102030405060708);
    assert_eq!(d.get_i64().unwrap(), -1);
    assert!(d.get_bool().unwrap());
    assert_eq!(d.get_enum().unwrap(), 4);
    d.finish_exact().unwrap();
}

/// Opaque and string of every residue 0..=3: pad bytes are zero on emit and
/// the stream length is the roundup (RFC 4506 §4.10, §4.11).
#[test]
fn opaque_padding_lengths_0_to_3() {
    for len in 0..=8usize {
        let data: Vec<u8> = (1..=len as u8).collect();
        let mut e = enc();
        e.put_opaque(&data, 16).unwrap();
        let (b, _) = e.finish();
        assert_eq!(b.len(), 4 + roundup(len).unwrap(), "len {len}");
        assert_eq!(&b[..4], &(len as u32).to_be_bytes());
        assert!(b[4 + len..].iter().all(|&x| x == 0), "zero pad for {len}");
        let mut d = Decoder::new(&b).pad_policy(PadPolicy::Strict);
        assert_eq!(d.get_opaque(16).unwrap(), &data[..]);
        d.finish_exact().unwrap();

        let mut e = enc();
        e.put_opaque_fixed(&data).unwrap();
        let (b, _) = e.finish();
        assert_eq!(b.len(), roundup(len).unwrap());
        let mut d = Decoder::new(&b);
        assert_eq!(d.get_opaque_fixed(len).unwrap(), &data[..]);
        d.finish_exact().unwrap();
    }
}

#[test]
fn nonzero_pad_lenient_by_default_strict_rejects() {
    let b = [0, 0, 0, 1, 0xaa, 0xbb, 0, 0];
    assert_eq!(Decoder::new(&b).get_opaque(4).unwrap(), &[0xaa]);
    assert_eq!(
        Decoder::new(&b)
            .pad_policy(PadPolicy::Strict)
            .get_opaque(4)
            .unwrap_err(),
        XdrError::NonZeroPad
    );
}

#[test]
fn limits_enforced_on_encode_and_decode() {
    let mut e = enc();
    assert_eq!(
        e.put_opaque(&[0; 5], 4).unwrap_err(),
        XdrError::TooLong { len: 5, max: 4 }
    );
    let b = [0, 0, 0, 5, 1, 2, 3, 4, 5, 0, 0, 0];
    assert_eq!(
        Decoder::new(&b).get_opaque(4).unwrap_err(),
        XdrError::TooLong { len: 5, max: 4 }
    );
    assert_eq!(
        Decoder::new(&b).get_string(4).unwrap_err(),
        XdrError::TooLong { len: 5, max: 4 }
    );
}

#[test]
fn truncated_everywhere() {
    let b = [0, 0, 0, 8, 1, 2, 3];
    assert!(matches!(
        Decoder::new(&b).get_opaque(100),
        Err(XdrError::Truncated { .. })
    ));
    assert!(matches!(
        Decoder::new(&b[..3]).get_u32(),
        Err(XdrError::Truncated { .. })
    ));
    assert!(matches!(Decoder::new(&b).get_u64(), Err(XdrError::Truncated { .. })));
    // data present but pad missing
    let b = [0, 0, 0, 1, 9];
    assert!(matches!(
        Decoder::new(&b).get_opaque(4),
        Err(XdrError::Truncated { .. })
    ));
}

#[test]
fn bool_and_optional_discriminators() {
    assert_eq!(
        Decoder::new(&[0, 0, 0, 2]).get_bool().unwrap_err(),
        XdrError::BadBool(2)
    );
    let mut e = enc();
    e.put_optional(Some(&7u32), |e, v| e.put_u32(*v)).unwrap();
    e.put_optional::<u32, _>(None, |e, v| e.put_u32(*v)).unwrap();
    let (b, _) = e.finish();
    assert_eq!(b, [0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0]);
    let mut d = Decoder::new(&b);
    assert_eq!(d.get_optional(|d| d.get_u32()).unwrap(), Some(7));
    assert_eq!(d.get_optional(|d| d.get_u32()).unwrap(), None);
    assert_eq!(
        Decoder::new(&[0, 0, 0, 2, 0, 0, 0, 0])
            .get_optional(|d| d.get_u32())
            .unwrap_err(),
        XdrError::BadBool(2)
    );
}

#[test]
fn array_count_is_bounded_before_allocation() {
    // count 0xffffffff with max u32::MAX: rejected against remaining bytes
    let b = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1];
    let err = Decoder::new(&b).get_array(usize::MAX, 4, |d| d.get_u32()).unwrap_err();
    assert!(matches!(err, XdrError::Truncated { .. }));
    let err = Decoder::new(&b).get_array(16, 4, |d| d.get_u32()).unwrap_err();
    assert!(matches!(err, XdrError::TooLong { .. }));
    let mut e = enc();
    e.put_array(&[1u32, 2, 3], 3, |e, v| e.put_u32(*v)).unwrap();
    e.put_array_fixed(&[9u32], |e, v| e.put_u32(*v)).unwrap();
    let (b, _) = e.finish();
    let mut d = Decoder::new(&b);
    assert_eq!(d.get_array(3, 4, |d| d.get_u32()).unwrap(), vec![1, 2, 3]);
    assert_eq!(d.get_u32().unwrap(), 9);
    assert!(enc().put_array(&[1u32, 2], 1, |e, v| e.put_u32(*v)).is_err());
}

#[test]
fn slice_sink_reports_full_buffer() {
    let mut buf = [0xa5u8; 6];
    let mut e = Encoder::new(SliceSink::new(&mut buf));
    e.put_u32(1).unwrap();
    assert_eq!(e.put_u32(2).unwrap_err(), XdrError::BufferFull);
    assert_eq!(e.sink().written(), &[0, 0, 0, 1]);
}

/// RPCR-DDP-02: the count of an opaque stays inline; the recorded item starts
/// after it. Positions are counted from the encoder start.
#[test]
fn ddp_items_recorded_with_positions() {
    let mut v = vec![0xee; 3]; // bytes before the encoder start are not counted
    let mut e = Encoder::new(&mut v);
    e.put_u32(1).unwrap();
    e.put_opaque_ddp(&[1, 2, 3, 4, 5], 100).unwrap();
    e.put_u32(2).unwrap();
    e.put_u32(2).unwrap(); // array count stays inline (§3.4.4.1)
    e.ddp_item(|e| {
        e.put_u32(10)?;
        // nested eligible items are not recorded separately
        e.put_opaque_ddp(&[7], 4)
    })
    .unwrap();
    let (_, items) = e.finish();
    assert_eq!(
        items,
        vec![DdpItem { offset: 8, len: 5 }, DdpItem { offset: 24, len: 12 }]
    );
    assert_eq!(items[0].padded_len(), 8);
    assert_eq!(v.len(), 3 + 36);
}

#[test]
fn too_many_ddp_items() {
    let mut e = enc();
    for _ in 0..MAX_DDP_ITEMS {
        e.put_opaque_ddp(&[], 0).unwrap();
    }
    assert_eq!(e.put_opaque_ddp(&[], 0).unwrap_err(), XdrError::TooManyDdpItems);
}

/// A reduced stream "u32 1, len 5, <reduced>, u32 2" re-inserts a Read chunk at
/// Position 8 whether or not the chunk carries the roundup pad (RPCR-RDC-04).
#[test]
fn read_chunk_reinserted_with_and_without_pad() {
    let reduced = [0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 2];
    for chunk in [&[1u8, 2, 3, 4, 5][..], &[1, 2, 3, 4, 5, 0, 0, 0][..]] {
        let chunks = [InsertedChunk {
            position: 8,
            data: chunk,
        }];
        let mut d = Decoder::with_chunks(&reduced, ChunkSource::Read(&chunks));
        assert_eq!(d.get_u32().unwrap(), 1);
        assert_eq!(d.get_opaque_ddp(64).unwrap(), &[1, 2, 3, 4, 5]);
        assert_eq!(d.position(), 16);
        assert_eq!(d.get_u32().unwrap(), 2);
        d.finish_exact().unwrap();
    }
}

/// RPCR-DDP-07 / B.4.5 #14: a chunk at the position of a non-eligible item.
#[test]
fn read_chunk_at_non_eligible_item_is_misplaced() {
    let reduced = [0, 0, 0, 1, 0, 0, 0, 5];
    let chunks = [InsertedChunk {
        position: 4,
        data: &[0, 0, 0, 9],
    }];
    let mut d = Decoder::with_chunks(&reduced, ChunkSource::Read(&chunks));
    d.get_u32().unwrap();
    let err = d.get_u32().unwrap_err();
    assert_eq!(err, XdrError::ChunkMisplaced { position: 4 });
    assert!(err.is_chunk_placement_error());
}

/// B.4.5 #12: a chunk beyond the end of the stream is never consumed.
#[test]
fn read_chunk_beyond_end_is_unconsumed() {
    let reduced = [0, 0, 0, 1];
    let chunks = [InsertedChunk {
        position: 64,
        data: &[1],
    }];
    let mut d = Decoder::with_chunks(&reduced, ChunkSource::Read(&chunks));
    d.get_u32().unwrap();
    let err = d.finish().unwrap_err();
    assert_eq!(err, XdrError::UnconsumedChunk { count: 1 });
}

/// B.4.5 #15 / RPCR-ERR-09: chunk length disagrees with the length word.
#[test]
fn read_chunk_length_mismatch() {
    let reduced = [0, 0, 0, 200];
    let data = [0u8; 100];
    let chunks = [InsertedChunk {
        position: 4,
        data: &data,
    }];
    let mut d = Decoder::with_chunks(&reduced, ChunkSource::Read(&chunks));
    let err = d.get_opaque_ddp(1000).unwrap_err();
    assert_eq!(err, XdrError::ChunkLengthMismatch { chunk: 100, item: 200 });
    assert!(!err.is_chunk_placement_error());
}

/// RPCR-WRC-10/11: Write chunks are consumed in order; an empty chunk means inline.
#[test]
fn write_chunks_consumed_in_order() {
    // two eligible results: first inline (empty chunk), second in a chunk
    let reduced = [0, 0, 0, 2, 7, 8, 0, 0, 0, 0, 0, 3];
    let chunks = [
        ReturnedWriteChunk::Empty,
        ReturnedWriteChunk::Data(&[1, 2, 3]),
        ReturnedWriteChunk::Data(&[]), // unused
    ];
    let mut d = Decoder::with_chunks(&reduced, ChunkSource::Write(&chunks));
    assert_eq!(d.get_opaque_ddp(10).unwrap(), &[7, 8]);
    assert_eq!(d.get_opaque_ddp(10).unwrap(), &[1, 2, 3]);
    d.finish_exact().unwrap();
    // a data-bearing chunk nobody claimed: a non-eligible result was reduced
    let chunks = [ReturnedWriteChunk::Data(&[1])];
    let d = Decoder::with_chunks(&[], ChunkSource::Write(&chunks));
    assert!(d.finish().is_err());
    // RPCR-DDP-08: an available chunk left unused for an eligible result
    let reduced = [0, 0, 0, 3];
    let chunks = [ReturnedWriteChunk::Data(&[])];
    let mut d = Decoder::with_chunks(&reduced, ChunkSource::Write(&chunks));
    assert!(matches!(
        d.get_opaque_ddp(10),
        Err(XdrError::ChunkLengthMismatch { .. })
    ));
}

#[test]
fn ddp_item_general_shape_from_chunk() {
    // count 2 inline, elements in a chunk
    let reduced = [0, 0, 0, 2];
    let elems = [0, 0, 0, 5, 0, 0, 0, 6];
    let chunks = [InsertedChunk {
        position: 4,
        data: &elems,
    }];
    let mut d = Decoder::with_chunks(&reduced, ChunkSource::Read(&chunks));
    let n = d.get_u32().unwrap();
    let v = d
        .ddp_item(|d| (0..n).map(|_| d.get_u32()).collect::<Result<Vec<_>, _>>())
        .unwrap();
    assert_eq!(v, vec![5, 6]);
    assert_eq!(d.position(), 12);
    d.finish_exact().unwrap();
    // chunk holding more than the item
    let chunks = [InsertedChunk {
        position: 4,
        data: &[0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0, 7],
    }];
    let mut d = Decoder::with_chunks(&reduced, ChunkSource::Read(&chunks));
    let n = d.get_u32().unwrap();
    assert!(matches!(
        d.ddp_item(|d| (0..n).map(|_| d.get_u32()).collect::<Result<Vec<_>, _>>()),
        Err(XdrError::ChunkLengthMismatch { .. })
    ));
}

proptest! {
    #[test]
    fn prop_opaque_roundtrip(data in proptest::collection::vec(any::<u8>(), 0..64), a in any::<u32>(), h in any::<i64>()) {
        let mut e = enc();
        e.put_u32(a).unwrap();
        e.put_opaque(&data, 64).unwrap();
        e.put_i64(h).unwrap();
        e.put_string(&data, 64).unwrap();
        let (b, _) = e.finish();
        prop_assert_eq!(b.len() % 4, 0);
        let mut d = Decoder::new(&b).pad_policy(PadPolicy::Strict);
        prop_assert_eq!(d.get_u32().unwrap(), a);
        prop_assert_eq!(d.get_opaque(64).unwrap(), &data[..]);
        prop_assert_eq!(d.get_i64().unwrap(), h);
        prop_assert_eq!(d.get_string(64).unwrap(), &data[..]);
        d.finish_exact().unwrap();
    }

    #[test]
    fn prop_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut d = Decoder::new(&bytes);
        let _ = d.get_opaque(1 << 20);
        let _ = d.get_array(usize::MAX, 4, |d| d.get_u64());
        let _ = d.get_optional(|d| d.get_string(255));
    }
}
