//! The CDC message (type 0xFE, RFC 7609 §3.4, §4.3, A.4; requirements A1.9).
//!
//! 44 octets, sent as an RC SEND on the link's QP after the RDMA Writes it describes:
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 1 | type 0xFE |
//! | 1 | 1 | length 44 |
//! | 2 | 2 | sequence number |
//! | 4 | 4 | alert token (the receiver's) |
//! | 8 | 8 | producer cursor: 2 reserved, 2 wrap, 4 count |
//! | 16 | 8 | consumer cursor: 2 reserved, 2 wrap, 4 count |
//! | 24 | 1 | producer flags (B P U R F) |
//! | 25 | 1 | connection-state flags (D C A) |
//! | 26 | 18 | reserved |
//!
//! All integers are big-endian, as Linux's `struct smc_cdc_msg` puts them on the wire
//! (checked against frames Linux 6.12 sent over rxe, `results/smc-r-2vm-612-br0.pcap`).
//!
//! Reserved fields and reserved flag bits are ignored on receipt and sent as zero, so
//! `emit(parse(x))` equals `x` with its reserved bits cleared.

use super::cursor::Cursor;
use bitflags::bitflags;
use thiserror::Error;

/// The CDC message type octet (two high bits set: not an LLC message).
pub const CDC_TYPE: u8 = 0xFE;
/// The CDC message length, also the value of its length field.
pub const CDC_LEN: usize = 44;

bitflags! {
    /// Producer flags (octet 24).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct ProducerFlags: u8 {
        /// B: the writer is blocked (it has data but no room in the receiver's element).
        const WRITE_BLOCKED = 0x80;
        /// P: urgent data pending (announced, possibly not yet written).
        const URGENT_PENDING = 0x40;
        /// U: urgent data present; the producer cursor is one past its last octet.
        const URGENT_PRESENT = 0x20;
        /// R: the sender requests a consumer-cursor update.
        const CONS_UPDATE_REQUESTED = 0x10;
        /// F: failover validation message; only type, length, token and sequence count.
        const FAILOVER_VALIDATION = 0x08;
    }
}

bitflags! {
    /// Connection-state flags (octet 25).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct ConnStateFlags: u8 {
        /// D: the sender is done writing (shutdown write; PeerDoneWriting).
        const DONE_WRITING = 0x80;
        /// C: the sender closed the connection (PeerConnectionClosed).
        const CONN_CLOSED = 0x40;
        /// A: abnormal close (PeerConnAbort).
        const ABORT = 0x20;
    }
}

/// A parsed CDC message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cdc {
    /// Sequence number: 1 for the first CDC, +1 per CDC except F messages, wraps to 0.
    pub seq: u16,
    /// The receiver's alert token for this connection.
    pub token: u32,
    /// Producer cursor: where the sender writes next in the receiver's element.
    pub prod: Cursor,
    /// Consumer cursor: the sender's read position in its own element.
    pub cons: Cursor,
    /// Producer flags.
    pub prod_flags: ProducerFlags,
    /// Connection-state flags.
    pub conn_flags: ConnStateFlags,
}

/// Why octets are not a CDC message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum CdcError {
    /// Fewer than 44 octets.
    #[error("CDC message truncated: {0} octets, need 44")]
    Truncated(usize),
    /// The type octet is not 0xFE.
    #[error("not a CDC message: type {0:#04x}")]
    BadType(u8),
    /// The length field is not 44.
    #[error("CDC length field {0}, must be 44")]
    BadLength(u8),
    /// The output buffer is shorter than 44 octets.
    #[error("output buffer of {0} octets, need 44")]
    BufferTooSmall(usize),
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put_cursor(out: &mut [u8], at: usize, c: Cursor) {
    out[at..at + 2].fill(0);
    out[at + 2..at + 4].copy_from_slice(&c.wrap.to_be_bytes());
    out[at + 4..at + 8].copy_from_slice(&c.count.to_be_bytes());
}

impl Cdc {
    /// Parses a CDC message from the start of `b` (a receive buffer may be longer than 44
    /// octets; octets after the 44th are not looked at).
    pub fn parse(b: &[u8]) -> Result<Self, CdcError> {
        if b.len() < CDC_LEN {
            return Err(CdcError::Truncated(b.len()));
        }
        if b[0] != CDC_TYPE {
            return Err(CdcError::BadType(b[0]));
        }
        if usize::from(b[1]) != CDC_LEN {
            return Err(CdcError::BadLength(b[1]));
        }
        Ok(Self {
            seq: be16(b, 2),
            token: be32(b, 4),
            prod: Cursor::new(be16(b, 10), be32(b, 12)),
            cons: Cursor::new(be16(b, 18), be32(b, 20)),
            prod_flags: ProducerFlags::from_bits_truncate(b[24]),
            conn_flags: ConnStateFlags::from_bits_truncate(b[25]),
        })
    }

    /// Writes the 44 octets into the start of `out`; returns 44.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, CdcError> {
        let Some(out) = out.get_mut(..CDC_LEN) else {
            return Err(CdcError::BufferTooSmall(out.len()));
        };
        out[0] = CDC_TYPE;
        out[1] = CDC_LEN as u8;
        out[2..4].copy_from_slice(&self.seq.to_be_bytes());
        out[4..8].copy_from_slice(&self.token.to_be_bytes());
        put_cursor(out, 8, self.prod);
        put_cursor(out, 16, self.cons);
        out[24] = self.prod_flags.bits();
        out[25] = self.conn_flags.bits();
        out[26..].fill(0);
        Ok(CDC_LEN)
    }

    /// The 44 octets as an array.
    pub fn to_bytes(&self) -> [u8; CDC_LEN] {
        let mut out = [0u8; CDC_LEN];
        // Cannot fail: the buffer is exactly 44 octets.
        let _ = self.emit(&mut out);
        out
    }
}

/// Serial-number comparison of CDC sequence numbers (16 bits, wrapping): true when `a` is
/// older than `b`, i.e. `(a - b) as i16 < 0` as Linux compares them (SMC-CDC-2).
pub fn seq_before(a: u16, b: u16) -> bool {
    (a.wrapping_sub(b) as i16) < 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        hex::decode(s.replace([' ', '\n'], "")).unwrap()
    }

    // Golden vectors: CDC payloads of the RC SEND frames Linux 6.12 sent over rxe in the lab
    // capture smc-r-2vm-612-br0.pcap (frames 62, 63, 66, 69, 72, 78); 1 MiB into a 64 KiB
    // RMB, so the client's producer cursor is (wrap 16, count 0).
    const LINUX_FRAMES: &[(&str, Cdc)] = &[
        (
            // frame 62, client → server: 1 MiB written, writer blocked.
            "fe2c0010 00000003 0000 0010 00000000 0000 0000 00000000 80 00 000000000000000000000000000000000000",
            Cdc {
                seq: 0x10,
                token: 3,
                prod: Cursor::new(16, 0),
                cons: Cursor::new(0, 0),
                prod_flags: ProducerFlags::WRITE_BLOCKED,
                conn_flags: ConnStateFlags::empty(),
            },
        ),
        (
            // frame 63: shutdown(SHUT_WR) → D.
            "fe2c0011 00000003 0000 0010 00000000 0000 0000 00000000 80 80 000000000000000000000000000000000000",
            Cdc {
                seq: 0x11,
                token: 3,
                prod: Cursor::new(16, 0),
                cons: Cursor::new(0, 0),
                prod_flags: ProducerFlags::WRITE_BLOCKED,
                conn_flags: ConnStateFlags::DONE_WRITING,
            },
        ),
        (
            // frame 66, server → client: consumer update, the consumer wrap mirrors 16.
            "fe2c0010 00000001 0000 0000 00000000 0000 0010 00000000 00 00 000000000000000000000000000000000000",
            Cdc {
                seq: 0x10,
                token: 1,
                prod: Cursor::new(0, 0),
                cons: Cursor::new(16, 0),
                prod_flags: ProducerFlags::empty(),
                conn_flags: ConnStateFlags::empty(),
            },
        ),
        (
            // frame 69: 8 bytes written back.
            "fe2c0011 00000001 0000 0000 00000008 0000 0010 00000000 00 00 000000000000000000000000000000000000",
            Cdc {
                seq: 0x11,
                token: 1,
                prod: Cursor::new(0, 8),
                cons: Cursor::new(16, 0),
                prod_flags: ProducerFlags::empty(),
                conn_flags: ConnStateFlags::empty(),
            },
        ),
        (
            // frame 72, client: consumed the 8 bytes, close → D and C.
            "fe2c0012 00000003 0000 0010 00000000 0000 0000 00000008 80 c0 000000000000000000000000000000000000",
            Cdc {
                seq: 0x12,
                token: 3,
                prod: Cursor::new(16, 0),
                cons: Cursor::new(0, 8),
                prod_flags: ProducerFlags::WRITE_BLOCKED,
                conn_flags: ConnStateFlags::DONE_WRITING.union(ConnStateFlags::CONN_CLOSED),
            },
        ),
        (
            // frame 78, server: close.
            "fe2c0013 00000001 0000 0000 00000008 0000 0010 00000000 00 c0 000000000000000000000000000000000000",
            Cdc {
                seq: 0x13,
                token: 1,
                prod: Cursor::new(0, 8),
                cons: Cursor::new(16, 0),
                prod_flags: ProducerFlags::empty(),
                conn_flags: ConnStateFlags::DONE_WRITING.union(ConnStateFlags::CONN_CLOSED),
            },
        ),
    ];

    // SMC-CDC-3 / A1.9: byte layout as Linux sends it.
    #[test]
    fn linux_frames_parse_and_emit_byte_exact() {
        for (h, want) in LINUX_FRAMES {
            let b = hex(h);
            assert_eq!(b.len(), CDC_LEN);
            let got = Cdc::parse(&b).unwrap();
            assert_eq!(&got, want, "{h}");
            assert_eq!(got.to_bytes().to_vec(), b, "{h}");
        }
    }

    // A4.4 CDC#1 and CDC#3 (Linux mode) as octets.
    #[test]
    fn a4_4_cdcs_golden() {
        let cdc1 = Cdc {
            seq: 1,
            token: 0xB0B0_0001,
            prod: Cursor::new(0, 10_000),
            ..Cdc::default()
        };
        assert_eq!(
            cdc1.to_bytes().to_vec(),
            hex("fe2c0001 b0b00001 0000 0000 00002710 0000 0000 00000000 00 00 000000000000000000000000000000000000")
        );
        let cdc3 = Cdc {
            seq: 3,
            token: 0xB0B0_0001,
            prod: Cursor::new(2, 5_616),
            cons: Cursor::new(0, 0),
            prod_flags: ProducerFlags::WRITE_BLOCKED,
            conn_flags: ConnStateFlags::empty(),
        };
        assert_eq!(
            cdc3.to_bytes().to_vec(),
            hex("fe2c0003 b0b00001 0000 0002 000015f0 0000 0000 00000000 80 00 000000000000000000000000000000000000")
        );
        // A4.5: urgent data present → flags 0x60 (SMC-URG-1).
        let urg = Cdc {
            prod_flags: ProducerFlags::URGENT_PENDING | ProducerFlags::URGENT_PRESENT,
            ..cdc1
        };
        assert_eq!(urg.to_bytes()[24], 0x60);
    }

    // A2.15 checklist "CDC length 44": malformed input gets a typed error, never a panic.
    #[test]
    fn malformed_is_rejected() {
        let good = LINUX_FRAMES[0].1.to_bytes();
        for n in 0..CDC_LEN {
            assert_eq!(Cdc::parse(&good[..n]), Err(CdcError::Truncated(n)));
        }
        let mut b = good;
        b[0] = 0x01;
        assert_eq!(Cdc::parse(&b), Err(CdcError::BadType(1)));
        let mut b = good;
        b[1] = 48;
        assert_eq!(Cdc::parse(&b), Err(CdcError::BadLength(48)));
        // A 48-octet receive slot: the tail is ignored.
        let mut slot = [0xAAu8; 48];
        slot[..CDC_LEN].copy_from_slice(&good);
        assert_eq!(Cdc::parse(&slot), Ok(LINUX_FRAMES[0].1));
        assert_eq!(
            LINUX_FRAMES[0].1.emit(&mut [0u8; 43]),
            Err(CdcError::BufferTooSmall(43))
        );
        // Reserved octets and bits are ignored on receipt and zero on emit.
        let mut b = good;
        b[8] = 0xFF;
        b[16] = 0xFF;
        b[24] |= 0x07;
        b[25] |= 0x1F;
        b[43] = 0xFF;
        let c = Cdc::parse(&b).unwrap();
        assert_eq!(c, LINUX_FRAMES[0].1);
        assert_eq!(c.to_bytes(), good);
    }

    // SMC-CDC-2: 16-bit serial comparison, across 65535 → 0.
    #[test]
    fn sequence_serial_compare() {
        assert!(seq_before(1, 2));
        assert!(!seq_before(2, 1));
        assert!(!seq_before(5, 5));
        assert!(seq_before(65_535, 0));
        assert!(!seq_before(0, 65_535));
        assert!(seq_before(65_000, 100));
    }

    proptest! {
        #[test]
        fn round_trip(seq: u16, token: u32, pw: u16, pc: u32, cw: u16, cc: u32, pf: u8, cf: u8) {
            let c = Cdc {
                seq, token,
                prod: Cursor::new(pw, pc),
                cons: Cursor::new(cw, cc),
                prod_flags: ProducerFlags::from_bits_truncate(pf),
                conn_flags: ConnStateFlags::from_bits_truncate(cf),
            };
            let b = c.to_bytes();
            prop_assert_eq!(Cdc::parse(&b), Ok(c));
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(c) = Cdc::parse(&b) {
                let out = c.to_bytes();
                prop_assert_eq!(Cdc::parse(&out), Ok(c));
            }
        }
    }
}
