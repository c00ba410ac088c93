//! TCP record marking (RFC 5531 §11): a streaming reader fed in arbitrary splits
//! never panics, never buffers more than its maximum record size, and gives back
//! exactly what the writer framed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rpcrdma::record::{RecordReader, encode_record};

const MAX: usize = 1 << 16;

fn feed(r: &mut RecordReader, input: &[u8], step: usize) -> Result<Vec<Vec<u8>>, rpcrdma::record::RecordError> {
    let mut out = Vec::new();
    for piece in input.chunks(step.max(1)) {
        let mut rest = piece;
        while !rest.is_empty() {
            let (n, rec) = r.decode(rest)?;
            rest = &rest[n..];
            if let Some(rec) = rec {
                assert!(rec.len() <= MAX);
                out.push(rec);
            }
        }
    }
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, body)) = data.split_first() else {
        return;
    };
    // arbitrary bytes as a stream
    let mut r = RecordReader::new(MAX).max_fragments(64);
    let _ = feed(&mut r, body, usize::from(split));
    let _ = r.finish();
    // framing round trip
    if body.len() > MAX {
        return;
    }
    let mut framed = Vec::new();
    encode_record(body, usize::from(split % 16) + 1, &mut framed).expect("valid fragment size");
    let mut r = RecordReader::new(MAX).max_fragments(usize::MAX);
    let recs = feed(&mut r, &framed, usize::from(split) % 7 + 1).expect("own framing decodes");
    assert_eq!(recs, vec![body.to_vec()]);
    assert!(r.finish().is_ok());
});
