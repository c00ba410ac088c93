//! Path-MTU segmentation of a message into packets and the receiver's payload-length check
//! (IBA vol. 1 §9.7.2 "segmentation", unconfirmed; §9.2 PadCnt; C3 "path MTU enum 1..5 = 256..4096").
//!
//! A message of `n` octets goes out as one ONLY packet when `n <= PMTU` (also for `n = 0`),
//! otherwise as a FIRST, zero or more MIDDLE packets, and a LAST; FIRST and MIDDLE carry
//! exactly PMTU octets, LAST the remaining 1..=PMTU. Each packet pads its payload to a
//! multiple of 4 (the pad count in the BTH). The path MTU counts payload octets only.

use verbs::Mtu;

use super::opcode::{OpInfo, Opcode, Position};

/// Pad octets after `len` payload octets (0..=3), the BTH PadCnt.
#[inline]
pub const fn pad_count(len: usize) -> u8 {
    (len.wrapping_neg() & 3) as u8
}

/// One packet of a segmented message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment {
    /// FIRST, MIDDLE, LAST or ONLY: picks the packet's opcode.
    pub position: Position,
    /// Offset of this packet's payload in the message.
    pub offset: u32,
    /// Payload octets in this packet.
    pub len: u32,
    /// Pad octets after them.
    pub pad: u8,
}

/// Packets a message of `len` octets takes at this path MTU (at least 1).
pub fn packet_count(len: u32, mtu: Mtu) -> u32 {
    len.div_ceil(mtu.bytes()).max(1)
}

/// The packets of a message of `len` octets at this path MTU, in order.
pub fn segments(len: u32, mtu: Mtu) -> Segments {
    Segments {
        len,
        mtu: mtu.bytes(),
        next: 0,
        index: 0,
        count: packet_count(len, mtu),
    }
}

/// Iterator of [`segments`].
#[derive(Debug, Clone)]
pub struct Segments {
    len: u32,
    mtu: u32,
    next: u32,
    index: u32,
    count: u32,
}

impl Iterator for Segments {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        if self.index == self.count {
            return None;
        }
        let position = match (self.index == 0, self.index + 1 == self.count) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, false) => Position::Middle,
            (false, true) => Position::Last,
        };
        let len = (self.len - self.next).min(self.mtu);
        let s = Segment {
            position,
            offset: self.next,
            len,
            pad: pad_count(len as usize),
        };
        self.next += len;
        self.index += 1;
        Some(s)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.count - self.index) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Segments {}

/// A payload length the path MTU does not allow for the packet's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum PayloadLenError {
    /// FIRST and MIDDLE packets carry exactly PMTU octets.
    #[error("{opcode:?} carries {len} octets, must be the path MTU {mtu}")]
    NotFull {
        /// The BTH opcode.
        opcode: Opcode,
        /// Payload octets of the packet.
        len: usize,
        /// The path MTU, in octets.
        mtu: u32,
    },
    /// A LAST packet carries at least one octet.
    #[error("{opcode:?} carries no payload")]
    EmptyLast {
        /// The BTH opcode.
        opcode: Opcode,
    },
    /// More than PMTU octets.
    #[error("{opcode:?} carries {len} octets, more than the path MTU {mtu}")]
    TooLong {
        /// The BTH opcode.
        opcode: Opcode,
        /// Payload octets of the packet.
        len: usize,
        /// The path MTU, in octets.
        mtu: u32,
    },
}

/// The receiver's length check of one packet's payload against the path MTU (rxe's
/// `check_length`; a failure is an invalid request, NAK code 1, at an RC responder).
/// Opcodes without payload pass (their payload is checked empty by [`super::Packet::parse`]).
pub fn check_payload_len(info: &OpInfo, len: usize, mtu: Mtu) -> Result<(), PayloadLenError> {
    let opcode = info.opcode;
    let m = mtu.bytes();
    if !info.payload {
        return Ok(());
    }
    if len > m as usize {
        return Err(PayloadLenError::TooLong { opcode, len, mtu: m });
    }
    match info.position {
        Position::First | Position::Middle if len != m as usize => {
            Err(PayloadLenError::NotFull { opcode, len, mtu: m })
        }
        Position::Last if len == 0 => Err(PayloadLenError::EmptyLast { opcode }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::opcode::{MessageKind, Opcode};
    use proptest::prelude::*;

    const MTUS: [Mtu; 5] = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096];

    #[test]
    fn pad_counts() {
        assert_eq!([0, 1, 2, 3, 4, 5, 37].map(pad_count), [0, 3, 2, 1, 0, 3, 3]);
    }

    #[test]
    fn path_mtu_enum_c3() {
        // C3: path MTU enum 1..5 = 256..4096.
        for (i, m) in MTUS.into_iter().enumerate() {
            assert_eq!(m as u32, i as u32 + 1);
            assert_eq!(m.bytes(), 256 << i);
        }
    }

    #[test]
    fn segments_of_a_write() {
        let v: Vec<_> = segments(2500, Mtu::Mtu1024).collect();
        assert_eq!(
            v,
            [
                Segment {
                    position: Position::First,
                    offset: 0,
                    len: 1024,
                    pad: 0
                },
                Segment {
                    position: Position::Middle,
                    offset: 1024,
                    len: 1024,
                    pad: 0
                },
                Segment {
                    position: Position::Last,
                    offset: 2048,
                    len: 452,
                    pad: 0
                },
            ]
        );
        let ops: Vec<_> = v
            .iter()
            .map(|s| Opcode::rc_segment(MessageKind::RdmaWriteWithImm, s.position))
            .collect();
        assert_eq!(
            ops,
            [
                Opcode::RC_RDMA_WRITE_FIRST,
                Opcode::RC_RDMA_WRITE_MIDDLE,
                Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
            ]
        );
        assert_eq!(
            segments(0, Mtu::Mtu256).collect::<Vec<_>>(),
            [Segment {
                position: Position::Only,
                offset: 0,
                len: 0,
                pad: 0
            }]
        );
        assert_eq!(
            segments(4097, Mtu::Mtu4096)
                .map(|s| (s.position, s.len, s.pad))
                .collect::<Vec<_>>(),
            [(Position::First, 4096, 0), (Position::Last, 1, 3)]
        );
        assert_eq!(segments(1024, Mtu::Mtu1024).len(), 1);
        assert_eq!(packet_count(u32::MAX, Mtu::Mtu256), 16_777_216);
    }

    #[test]
    fn payload_len_checks() {
        let i = |o: Opcode| o.info().unwrap();
        let m = Mtu::Mtu1024;
        assert_eq!(check_payload_len(i(Opcode::RC_SEND_FIRST), 1024, m), Ok(()));
        assert_eq!(
            check_payload_len(i(Opcode::RC_SEND_MIDDLE), 1000, m),
            Err(PayloadLenError::NotFull {
                opcode: Opcode::RC_SEND_MIDDLE,
                len: 1000,
                mtu: 1024
            })
        );
        assert_eq!(
            check_payload_len(i(Opcode::RC_RDMA_WRITE_LAST), 0, m),
            Err(PayloadLenError::EmptyLast {
                opcode: Opcode::RC_RDMA_WRITE_LAST
            })
        );
        assert_eq!(check_payload_len(i(Opcode::RC_RDMA_WRITE_LAST), 1, m), Ok(()));
        assert_eq!(check_payload_len(i(Opcode::RC_SEND_ONLY), 0, m), Ok(()));
        assert!(check_payload_len(i(Opcode::RC_SEND_ONLY), 1025, m).is_err());
        assert!(check_payload_len(i(Opcode::UD_SEND_ONLY), 1025, m).is_err());
        assert_eq!(check_payload_len(i(Opcode::RC_ACKNOWLEDGE), 0, m), Ok(()));
    }

    proptest! {
        /// The segments tile the message, every one passes the receiver's length check, and
        /// the positions form a valid opcode sequence.
        #[test]
        fn segments_tile_the_message(len in 0u32..50_000, m in 0usize..5) {
            let mtu = MTUS[m];
            let segs: Vec<_> = segments(len, mtu).collect();
            prop_assert_eq!(segs.len() as u32, packet_count(len, mtu));
            let mut at = 0;
            let mut prev = None;
            for s in &segs {
                prop_assert_eq!(s.offset, at);
                prop_assert_eq!((s.len as usize + s.pad as usize) % 4, 0);
                let op = Opcode::rc_segment(MessageKind::Send, s.position).info().unwrap();
                prop_assert_eq!(check_payload_len(op, s.len as usize, mtu), Ok(()));
                prop_assert!(crate::wire::opcode::sequence_ok(prev, op));
                prev = Some(op);
                at += s.len;
            }
            prop_assert_eq!(at, len);
            prop_assert!(segs.last().unwrap().position.ends());
        }
    }
}
