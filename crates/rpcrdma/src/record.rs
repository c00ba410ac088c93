//! TCP record marking (RFC 5531 §11), the framing of ONC RPC over TCP.
//!
//! A record is one RPC message, sent as one or more fragments. Each fragment is
//! a four-byte big-endian header (bit 31 = last fragment, bits 0..30 = data
//! length, 0 ..= 2^31-1) followed by that many data bytes. Over RPC-over-RDMA this
//! framing is *not* used (RFC 8166 §3.2, RPCR-FRM-01); it is the baseline and the
//! fallback transport.
//!
//! [`RecordReader`] is a sans-I/O streaming reassembler: feed it whatever the
//! socket returned, in any split, and it hands back whole records. It enforces a
//! maximum record size (checked at each fragment header, before data arrives)
//! and a maximum fragment count, so memory and work per record are bounded.
//! Framing errors are sticky: after one, the byte stream cannot be re-synchronised
//! and the connection must be closed.
//!
//! Decisions where RFC 5531 is silent: a record may be empty (one zero-length
//! last fragment) and is returned as an empty `Vec` (the RPC decoder rejects
//! it); zero-length non-last fragments are allowed but count toward
//! [`RecordReader::max_fragments`].

/// Bit 31 of a fragment header: this is the last fragment of the record.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;
/// Largest fragment data length (31 bits).
pub const MAX_FRAGMENT_LEN: u32 = 0x7fff_ffff;
/// Default maximum fragments per record.
pub const DEFAULT_MAX_FRAGMENTS: usize = 1024;

/// Record-marking errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The record would exceed the configured maximum size.
    #[error("RPC record of at least {size} bytes exceeds the maximum {max}")]
    RecordTooLarge {
        /// Record size so far, including the announced fragment.
        size: u64,
        /// Configured maximum.
        max: usize,
    },
    /// The record has more fragments than allowed.
    #[error("RPC record has more than {max} fragments")]
    TooManyFragments {
        /// Configured maximum.
        max: usize,
    },
    /// The stream ended in the middle of a record.
    #[error("stream ended inside an RPC record")]
    TruncatedAtEof,
    /// Fragment size 0 or above 2^31-1 requested on encode.
    #[error("invalid fragment size {0}")]
    BadFragmentSize(usize),
    /// A previous error stopped the reader; the connection must be closed.
    #[error("record stream already failed: {0}")]
    Failed(Box<RecordError>),
}

/// The header of one fragment.
pub fn fragment_header(len: u32, last: bool) -> [u8; 4] {
    let v = (len & MAX_FRAGMENT_LEN) | if last { LAST_FRAGMENT } else { 0 };
    v.to_be_bytes()
}

/// Append `msg` as one record, split into fragments of at most `max_fragment`
/// data bytes (1 ..= 2^31-1). An empty message becomes one empty last fragment.
pub fn encode_record(msg: &[u8], max_fragment: usize, out: &mut Vec<u8>) -> Result<(), RecordError> {
    if max_fragment == 0 || max_fragment > MAX_FRAGMENT_LEN as usize {
        return Err(RecordError::BadFragmentSize(max_fragment));
    }
    out.reserve(msg.len() + 4 * (msg.len() / max_fragment + 1));
    if msg.is_empty() {
        out.extend_from_slice(&fragment_header(0, true));
        return Ok(());
    }
    let mut chunks = msg.chunks(max_fragment).peekable();
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        // c.len() <= max_fragment <= MAX_FRAGMENT_LEN, so the cast is exact
        out.extend_from_slice(&fragment_header(c.len() as u32, last));
        out.extend_from_slice(c);
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a fragment header; `have` bytes of it so far.
    Header { have: usize },
    /// Reading fragment data; `left` bytes to go.
    Data { left: u32, last: bool },
}

/// Streaming record reassembler.
#[derive(Debug)]
pub struct RecordReader {
    max_record: usize,
    max_fragments: usize,
    state: State,
    hdr: [u8; 4],
    record: Vec<u8>,
    fragments: usize,
    failed: Option<RecordError>,
}

impl RecordReader {
    /// A reader accepting records of at most `max_record` bytes.
    pub fn new(max_record: usize) -> Self {
        RecordReader {
            max_record,
            max_fragments: DEFAULT_MAX_FRAGMENTS,
            state: State::Header { have: 0 },
            hdr: [0; 4],
            record: Vec::new(),
            fragments: 0,
            failed: None,
        }
    }

    /// Change the maximum number of fragments per record.
    pub fn max_fragments(mut self, n: usize) -> Self {
        self.max_fragments = n.max(1);
        self
    }

    /// True between records (nothing partial buffered).
    pub fn is_idle(&self) -> bool {
        self.state == State::Header { have: 0 } && self.fragments == 0
    }

    /// Bytes of memory the partial record holds (its buffer's capacity), for
    /// a server's memory accounting; 0 between records.
    pub fn buffered(&self) -> usize {
        self.record.capacity()
    }

    /// The peer closed the stream: an error if a record was cut short.
    pub fn finish(&self) -> Result<(), RecordError> {
        if let Some(e) = &self.failed {
            return Err(RecordError::Failed(Box::new(e.clone())));
        }
        if self.is_idle() {
            Ok(())
        } else {
            Err(RecordError::TruncatedAtEof)
        }
    }

    fn fail(&mut self, e: RecordError) -> RecordError {
        self.failed = Some(e.clone());
        self.record = Vec::new();
        e
    }

    /// Consume bytes from `input` until one record completes or the input runs
    /// out. Returns the number of bytes consumed and the record, if one
    /// completed. Call again with the unconsumed rest.
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Vec<u8>>), RecordError> {
        if let Some(e) = &self.failed {
            return Err(RecordError::Failed(Box::new(e.clone())));
        }
        let mut used = 0;
        while used < input.len() {
            match self.state {
                State::Header { have } => {
                    let n = (4 - have).min(input.len() - used);
                    self.hdr[have..have + n].copy_from_slice(&input[used..used + n]);
                    used += n;
                    if have + n < 4 {
                        self.state = State::Header { have: have + n };
                        continue;
                    }
                    let v = u32::from_be_bytes(self.hdr);
                    let len = v & MAX_FRAGMENT_LEN;
                    let last = v & LAST_FRAGMENT != 0;
                    self.fragments += 1;
                    if self.fragments > self.max_fragments {
                        let max = self.max_fragments;
                        return Err(self.fail(RecordError::TooManyFragments { max }));
                    }
                    let size = self.record.len() as u64 + u64::from(len);
                    if size > self.max_record as u64 {
                        let max = self.max_record;
                        return Err(self.fail(RecordError::RecordTooLarge { size, max }));
                    }
                    self.state = State::Data { left: len, last };
                    if len == 0 && last {
                        return Ok((used, Some(self.complete())));
                    }
                    if len == 0 {
                        self.state = State::Header { have: 0 };
                    }
                }
                State::Data { left, last } => {
                    let n = (left as usize).min(input.len() - used);
                    self.record.extend_from_slice(&input[used..used + n]);
                    used += n;
                    // n <= left, which is a u32
                    let left = left - n as u32;
                    if left > 0 {
                        self.state = State::Data { left, last };
                    } else if last {
                        return Ok((used, Some(self.complete())));
                    } else {
                        self.state = State::Header { have: 0 };
                    }
                }
            }
        }
        Ok((used, None))
    }

    fn complete(&mut self) -> Vec<u8> {
        self.state = State::Header { have: 0 };
        self.fragments = 0;
        std::mem::take(&mut self.record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read_all(r: &mut RecordReader, mut input: &[u8]) -> Result<Vec<Vec<u8>>, RecordError> {
        let mut out = Vec::new();
        while !input.is_empty() {
            let (n, rec) = r.decode(input)?;
            input = &input[n..];
            out.extend(rec);
        }
        Ok(out)
    }

    #[test]
    fn golden_single_fragment() {
        let mut out = Vec::new();
        encode_record(&[1, 2, 3, 4, 5], 1 << 20, &mut out).unwrap();
        assert_eq!(out, [0x80, 0, 0, 5, 1, 2, 3, 4, 5]);
        let mut r = RecordReader::new(100);
        assert_eq!(read_all(&mut r, &out).unwrap(), vec![vec![1, 2, 3, 4, 5]]);
        assert!(r.is_idle());
        r.finish().unwrap();
    }

    #[test]
    fn golden_multi_fragment() {
        let mut out = Vec::new();
        encode_record(&[1, 2, 3, 4, 5], 2, &mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 2, 1, 2, 0, 0, 0, 2, 3, 4, 0x80, 0, 0, 1, 5]);
        let mut r = RecordReader::new(100);
        assert_eq!(read_all(&mut r, &out).unwrap(), vec![vec![1, 2, 3, 4, 5]]);
    }

    #[test]
    fn empty_record_and_zero_length_fragments() {
        let mut out = Vec::new();
        encode_record(&[], 8, &mut out).unwrap();
        assert_eq!(out, [0x80, 0, 0, 0]);
        let mut input = vec![0, 0, 0, 0, 0, 0, 0, 1, 9];
        input.extend_from_slice(&[0x80, 0, 0, 0]);
        let mut r = RecordReader::new(100);
        assert_eq!(read_all(&mut r, &input).unwrap(), vec![vec![9]]);
        let mut r = RecordReader::new(100);
        assert_eq!(read_all(&mut r, &out).unwrap(), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn max_record_checked_at_the_header() {
        let mut r = RecordReader::new(10);
        // a fragment header announcing 2^31-1 bytes fails before any data arrives
        let err = r.decode(&[0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(
            err,
            RecordError::RecordTooLarge {
                size: 0x7fff_ffff,
                max: 10
            }
        );
        // sticky
        assert!(matches!(r.decode(&[0]), Err(RecordError::Failed(_))));
        assert!(r.finish().is_err());
        // across fragments: 6 + 6 > 10
        let mut r = RecordReader::new(10);
        let mut input = vec![0, 0, 0, 6, 0, 0, 0, 0, 0, 0];
        input.extend_from_slice(&[0x80, 0, 0, 6]);
        assert!(matches!(
            read_all(&mut r, &input),
            Err(RecordError::RecordTooLarge { size: 12, .. })
        ));
        // exactly the maximum is fine
        let mut r = RecordReader::new(10);
        let mut out = Vec::new();
        encode_record(&[7; 10], 3, &mut out).unwrap();
        assert_eq!(read_all(&mut r, &out).unwrap(), vec![vec![7; 10]]);
    }

    #[test]
    fn too_many_fragments() {
        let mut r = RecordReader::new(100).max_fragments(2);
        let input = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            read_all(&mut r, &input).unwrap_err(),
            RecordError::TooManyFragments { max: 2 }
        );
    }

    #[test]
    fn truncated_at_eof() {
        let mut r = RecordReader::new(100);
        r.decode(&[0x80, 0, 0, 4, 1]).unwrap();
        assert!(!r.is_idle());
        assert_eq!(r.finish().unwrap_err(), RecordError::TruncatedAtEof);
        let mut r = RecordReader::new(100);
        r.decode(&[0x80, 0]).unwrap();
        assert_eq!(r.finish().unwrap_err(), RecordError::TruncatedAtEof);
    }

    #[test]
    fn bad_fragment_sizes_on_encode() {
        let mut out = Vec::new();
        assert!(encode_record(&[1], 0, &mut out).is_err());
        assert!(encode_record(&[1], 1 << 31, &mut out).is_err());
    }

    proptest! {
        /// Streaming over arbitrary splits yields the same records.
        #[test]
        fn prop_any_split(msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..5),
                          frag in 1usize..9, cuts in proptest::collection::vec(any::<usize>(), 0..10)) {
            let mut stream = Vec::new();
            for m in &msgs { encode_record(m, frag, &mut stream).unwrap(); }
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
            points.push(0); points.push(stream.len()); points.sort();
            let mut r = RecordReader::new(64).max_fragments(64);
            let mut got = Vec::new();
            for w in points.windows(2) {
                got.extend(read_all(&mut r, &stream[w[0]..w[1]]).unwrap());
            }
            prop_assert_eq!(got, msgs);
            prop_assert!(r.finish().is_ok());
        }

        #[test]
        fn prop_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = RecordReader::new(32);
            let _ = read_all(&mut r, &b);
            let _ = r.finish();
        }
    }
}
