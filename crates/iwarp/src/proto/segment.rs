//! DDP segmentation of one outbound message (RFC 5041 §5.2), sans-I/O.
//!
//! Read before editing: RFC 5041 §5.2-§5.3 and catalogue C.1.2 (RDMAP-LLP-02,
//! RDMAP-LLP-04).
//!
//! A message of `len` octets becomes segments of at most MULPDU octets each
//! (DDP header included, RFC 5041 §5.2: 1482 = 1500 - 18). Tagged segments
//! carry TO = message TO + offset, untagged ones MO = offset with the same
//! MSN; L is set only on the last segment, and a zero-length message is one
//! segment with L = 1 and no payload. The MULPDU comes from MPA (it can
//! change with the path MTU); this module takes it as a parameter.
//!
//! [`Segmenter`] yields `(ddp::Header, payload range)` pairs without
//! allocating; the range is relative to the message (for header-bearing
//! RDMAP messages, the RDMAP header is the start of the message). The engine
//! writes each header with [`write_header`] and copies the range after it.

use core::fmt;
use core::ops::Range;

use crate::wire::ddp::{self, Addr, BufferTooSmall, Header};

/// Why a message cannot be segmented (local errors, never peer input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The MULPDU leaves no room for payload after the DDP header.
    MulpduTooSmall { mulpdu: usize, header_len: usize },
    /// TO + length would wrap 2^64 (the receiver rejects it: RFC 5041 §7.1
    /// tagged check 5).
    ToWrap { to: u64, len: u32 },
    /// MO + length would not fit the 32-bit MO (RFC 5041 §5.2: a message is
    /// shorter than 2^32 octets).
    MoOverflow { mo: u32, len: u32 },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::MulpduTooSmall { mulpdu, header_len } => {
                write!(
                    f,
                    "MULPDU {mulpdu} leaves no payload after a {header_len}-octet DDP header"
                )
            }
            Error::ToWrap { to, len } => write!(f, "TO {to:#x} + {len} wraps 2^64"),
            Error::MoOverflow { mo, len } => write!(f, "MO {mo} + {len} overflows 32 bits"),
        }
    }
}

/// Iterator over the segments of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segmenter {
    /// Header of the message's first octet (L ignored).
    first: Header,
    len: u32,
    /// Payload octets per full segment: MULPDU - DDP header, at least 1.
    per_segment: u32,
    /// Message offset of the next segment.
    offset: u32,
    done: bool,
}

impl Segmenter {
    /// Segment a message of `len` octets. `first` is the DDP header of the
    /// message's first octet: tagged {STag, TO of the first octet} or
    /// untagged {QN, MSN, MO (normally 0), RsvdULP}, plus the RDMAP control
    /// octet; its L flag is ignored. `mulpdu` counts DDP header + payload.
    pub fn new(first: Header, len: u32, mulpdu: usize) -> Result<Segmenter, Error> {
        let header_len = first.header_len();
        let per_segment = mulpdu
            .checked_sub(header_len)
            .filter(|&n| n > 0)
            .ok_or(Error::MulpduTooSmall { mulpdu, header_len })?;
        // A payload per segment beyond u32 cannot occur for a u32 message.
        let per_segment = u32::try_from(per_segment).unwrap_or(u32::MAX);
        match first.addr {
            Addr::Tagged { to, .. } => {
                // Zero-length messages are not checked (RFC 5041 §5.2).
                if len > 0 && to.checked_add(u64::from(len)).is_none() {
                    return Err(Error::ToWrap { to, len });
                }
            }
            Addr::Untagged { mo, .. } => {
                if mo.checked_add(len).is_none() {
                    return Err(Error::MoOverflow { mo, len });
                }
            }
        }
        Ok(Segmenter {
            first,
            len,
            per_segment,
            offset: 0,
            done: false,
        })
    }

    /// Number of segments: 1 for an empty message, else ceil(len / payload).
    pub fn segment_count(&self) -> u32 {
        if self.len == 0 {
            1
        } else {
            self.len.div_ceil(self.per_segment)
        }
    }

    /// Payload octets per full segment.
    pub fn payload_per_segment(&self) -> u32 {
        self.per_segment
    }

    fn remaining_segments(&self) -> usize {
        if self.done {
            return 0;
        }
        let left = self.len - self.offset;
        let n = if left == 0 { 1 } else { left.div_ceil(self.per_segment) };
        usize::try_from(n).unwrap_or(usize::MAX)
    }
}

impl Iterator for Segmenter {
    type Item = (Header, Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let start = self.offset;
        let n = (self.len - start).min(self.per_segment);
        // `new` checked start + n <= len fits (MO) or does not wrap (TO).
        let end = start + n;
        let last = end == self.len;
        let addr = match self.first.addr {
            Addr::Tagged { stag, to } => Addr::Tagged {
                stag,
                to: to.wrapping_add(u64::from(start)),
            },
            Addr::Untagged { qn, msn, mo, inv_stag } => Addr::Untagged {
                qn,
                msn,
                mo: mo.wrapping_add(start),
                inv_stag,
            },
        };
        self.offset = end;
        self.done = last;
        let range = usize::try_from(start).ok()?..usize::try_from(end).ok()?;
        Some((
            Header {
                last,
                rdmap_ctrl: self.first.rdmap_ctrl,
                addr,
            },
            range,
        ))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining_segments();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Segmenter {}
impl core::iter::FusedIterator for Segmenter {}

/// Write the DDP header of one segment at the start of `buf`; returns its
/// length (14 or 18). The caller writes the payload range after it.
pub fn write_header(header: &Header, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
    header.emit(buf)
}

/// The largest DDP payload per segment for `mulpdu` and a header of this
/// kind (0 if the MULPDU is too small).
pub const fn payload_capacity(mulpdu: usize, tagged: bool) -> usize {
    let h = if tagged {
        ddp::TAGGED_HEADER_LEN
    } else {
        ddp::UNTAGGED_HEADER_LEN
    };
    mulpdu.saturating_sub(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ddp::Segment;
    use proptest::prelude::*;

    const MULPDU: usize = 1500;

    fn tagged(to: u64) -> Header {
        Header {
            last: false,
            rdmap_ctrl: 0x40,
            addr: Addr::Tagged { stag: 0x5b01_9800, to },
        }
    }
    fn untagged(msn: u32) -> Header {
        Header {
            last: false,
            rdmap_ctrl: 0x43,
            addr: Addr::Untagged {
                qn: 0,
                msn,
                mo: 0,
                inv_stag: 0,
            },
        }
    }

    /// Segment, then check every RFC 5041 §5.2 rule and reassemble.
    fn check(first: Header, len: u32, mulpdu: usize) -> Vec<(Header, Range<usize>)> {
        let s = Segmenter::new(first, len, mulpdu).unwrap();
        let count = s.segment_count();
        assert_eq!(s.len(), count as usize);
        let segs: Vec<_> = s.collect();
        assert_eq!(segs.len(), count as usize);
        let mut next = 0usize;
        for (i, (h, r)) in segs.iter().enumerate() {
            assert_eq!(r.start, next, "contiguous");
            assert!(h.header_len() + r.len() <= mulpdu, "segment within MULPDU");
            assert_eq!(h.last, i + 1 == segs.len(), "L only on the last");
            assert_eq!(h.rdmap_ctrl, first.rdmap_ctrl);
            match (first.addr, h.addr) {
                (Addr::Tagged { stag, to }, Addr::Tagged { stag: s2, to: t2 }) => {
                    assert_eq!((s2, t2), (stag, to + r.start as u64), "TO = message TO + offset");
                }
                (
                    Addr::Untagged { qn, msn, mo: mo0, .. },
                    Addr::Untagged {
                        qn: q2, msn: m2, mo, ..
                    },
                ) => {
                    assert_eq!(
                        (q2, m2, mo as usize),
                        (qn, msn, mo0 as usize + r.start),
                        "same MSN, MO = offset"
                    );
                }
                _ => panic!("buffer model changed"),
            }
            next = r.end;
        }
        assert_eq!(next, len as usize, "all data sent");
        segs
    }

    /// RDMAP-LLP-02 / RDMAP-LLP-04 lengths, tagged and untagged.
    #[test]
    fn lengths_llp02_llp04() {
        for (first, cap) in [(tagged(16384), MULPDU - 14), (untagged(1), MULPDU - 18)] {
            for len in [
                0,
                1,
                3,
                4,
                cap - 1,
                cap,
                cap + 1,
                MULPDU - 1,
                MULPDU,
                MULPDU + 1,
                1 << 20,
            ] {
                let segs = check(first, len as u32, MULPDU);
                let want = if len == 0 { 1 } else { len.div_ceil(cap) };
                assert_eq!(segs.len(), want, "len {len}");
            }
        }
    }

    /// A zero-length message is one segment with L = 1 and no payload.
    #[test]
    fn zero_length_message() {
        let segs: Vec<_> = Segmenter::new(tagged(u64::MAX), 0, MULPDU).unwrap().collect();
        assert_eq!(
            segs,
            vec![(
                Header {
                    last: true,
                    ..tagged(u64::MAX)
                },
                0..0
            )]
        );
    }

    /// RFC 5041 §5.2's examples: untagged 2048 octets with MULPDU 1500 ->
    /// MO 0 (1482 octets) and MO 1482 (566); tagged from TO 16384 -> 1486 and
    /// 562 octets at TO 16384 and 17870.
    #[test]
    fn rfc5041_examples() {
        let u = check(untagged(1), 2048, 1500);
        assert_eq!(u.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), [1482, 566]);
        assert!(matches!(u[1].0.addr, Addr::Untagged { mo: 1482, .. }));
        let t = check(tagged(16384), 2048, 1500);
        assert_eq!(t.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), [1486, 562]);
        assert!(matches!(t[1].0.addr, Addr::Tagged { to: 17870, .. }));
    }

    #[test]
    fn write_header_then_payload_parses() {
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let mut rebuilt = Vec::new();
        for (h, r) in Segmenter::new(untagged(7), 3000, 1024).unwrap() {
            let mut buf = [0xa5u8; 1024];
            let n = write_header(&h, &mut buf).unwrap();
            buf[n..n + r.len()].copy_from_slice(&data[r.clone()]);
            let seg = Segment::parse(&buf[..n + r.len()]).unwrap();
            assert_eq!(seg.header, h);
            rebuilt.extend_from_slice(seg.payload);
        }
        assert_eq!(rebuilt, data);
    }

    #[test]
    fn bad_mulpdu() {
        assert_eq!(
            Segmenter::new(untagged(1), 10, 18),
            Err(Error::MulpduTooSmall {
                mulpdu: 18,
                header_len: 18
            })
        );
        assert_eq!(
            Segmenter::new(tagged(0), 10, 3),
            Err(Error::MulpduTooSmall {
                mulpdu: 3,
                header_len: 14
            })
        );
        // The smallest usable MULPDU: one payload octet per segment.
        assert_eq!(check(tagged(0), 5, 15).len(), 5);
        assert_eq!(payload_capacity(1500, true), 1486);
        assert_eq!(payload_capacity(10, false), 0);
    }

    /// Checked arithmetic on TO + len and MO + len.
    #[test]
    fn to_wrap_and_mo_overflow() {
        assert_eq!(
            Segmenter::new(tagged(u64::MAX - 9), 10, MULPDU),
            Err(Error::ToWrap {
                to: u64::MAX - 9,
                len: 10
            })
        );
        assert!(Segmenter::new(tagged(u64::MAX - 10), 10, MULPDU).is_ok());
        let resume = Header {
            addr: Addr::Untagged {
                qn: 0,
                msn: 1,
                mo: u32::MAX - 4,
                inv_stag: 0,
            },
            ..untagged(1)
        };
        assert_eq!(
            Segmenter::new(resume, 5, MULPDU),
            Err(Error::MoOverflow {
                mo: u32::MAX - 4,
                len: 5
            })
        );
        assert_eq!(check(resume, 4, MULPDU).len(), 1);
    }

    #[test]
    fn iterator_is_fused_and_exact() {
        let mut s = Segmenter::new(untagged(1), 100, 18 + 30).unwrap();
        assert_eq!(s.size_hint(), (4, Some(4)));
        s.next();
        assert_eq!(s.len(), 3);
        assert_eq!(s.by_ref().count(), 3);
        assert_eq!(s.next(), None);
        assert_eq!(s.len(), 0);
    }

    proptest! {
        /// Catalogue E.2: random MULPDUs from 32 B to 64 KiB reassemble.
        #[test]
        fn any_mulpdu_reassembles(len in 0u32..200_000, mulpdu in 32usize..65_536, to in any::<u32>(), tag in any::<bool>()) {
            let first = if tag { tagged(u64::from(to)) } else { untagged(to) };
            check(first, len, mulpdu);
        }
    }
}
