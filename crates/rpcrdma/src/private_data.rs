//! RDMA-CM private data for RPC-over-RDMA version 1 (RFC 8797).
//!
//! Eight octets exchanged in the connect/accept private data (on iWARP: inside the
//! MPA private data, after the RFC 6581 IRD/ORD words):
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! |                 Format Identifier 0xf6ab0e18                  |
//! |    Version    |  Reserved   |R|   Send Size   | Receive Size  |
//! ```
//!
//! Sizes are encoded as `bytes / 1024 - 1` (1 KiB ..= 256 KiB). Linux sends
//! `f6ab0e18 01 01 03 03` as a client (Remote Invalidation, 4 KiB each way) and
//! `f6ab0e18 01 00 03 03` as a server (peers file §4.3, lab capture).
//!
//! Decisions where RFC 8797 leaves room:
//! * Emit: a size is rounded *down* to a multiple of 1024 and clamped to 256 KiB,
//!   so we never advertise more than we can take; sizes below 1024 are refused
//!   (RFC 8166 §3.3.3 requires receivers to support 1024).
//! * Receive: the buffer is searched for the Format Identifier at any offset
//!   (RFC 8797 §5.2); the first match with eight octets in the buffer and version 1
//!   is used. A different version is treated as "no private data" (RFC 8797 §5.2
//!   "should check ... a valid and recognized version number"; Linux does the
//!   same), i.e. the RFC 8166 defaults. Reserved bits are ignored (§4).

use crate::inline::{DEFAULT_INLINE_THRESHOLD, Thresholds};

/// Format Identifier, network byte order.
pub const FORMAT_IDENTIFIER: u32 = 0xf6ab_0e18;
/// Message format version defined by RFC 8797.
pub const VERSION: u8 = 1;
/// Encoded length.
pub const LEN: usize = 8;
/// The R bit: the sender supports Remote Invalidation (RFC 8797 §4.1).
pub const FLAG_REMOTE_INVALIDATION: u8 = 0x01;
/// Largest encodable inline size (255 + 1 KiB).
pub const MAX_SIZE: u32 = 256 * 1024;

/// Private data errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrivateDataError {
    /// An inline size below the RFC 8166 minimum of 1024 bytes.
    #[error("inline size {0} is below the 1024-byte minimum")]
    SizeTooSmall(u32),
}

/// The RFC 8797 private data message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    /// R: the sender supports Remote Invalidation.
    pub remote_invalidation: bool,
    /// Largest RDMA Send this peer will transmit, in bytes (multiple of 1024).
    pub send_size: u32,
    /// Largest RDMA Receive this peer will accept, in bytes (multiple of 1024).
    pub recv_size: u32,
}

impl Default for PrivateData {
    /// What a peer without private data is assumed to have sent (RFC 8797 §5.1).
    fn default() -> Self {
        PrivateData {
            remote_invalidation: false,
            send_size: DEFAULT_INLINE_THRESHOLD,
            recv_size: DEFAULT_INLINE_THRESHOLD,
        }
    }
}

/// Encode an inline size: `bytes / 1024 - 1`, rounded down, clamped to 255.
pub fn encode_size(bytes: u32) -> Result<u8, PrivateDataError> {
    if bytes < DEFAULT_INLINE_THRESHOLD {
        return Err(PrivateDataError::SizeTooSmall(bytes));
    }
    Ok(((bytes.min(MAX_SIZE) / 1024) - 1) as u8)
}

/// Decode an inline size: `(v + 1) * 1024`.
pub fn decode_size(v: u8) -> u32 {
    (u32::from(v) + 1) * 1024
}

impl PrivateData {
    /// Private data for local buffer sizes (normalised as [`encode_size`] does).
    pub fn new(send_size: u32, recv_size: u32, remote_invalidation: bool) -> Result<Self, PrivateDataError> {
        Ok(PrivateData {
            remote_invalidation,
            send_size: decode_size(encode_size(send_size)?),
            recv_size: decode_size(encode_size(recv_size)?),
        })
    }

    /// The eight octets. Sizes that were not normalised are encoded as
    /// [`encode_size`] would, with values below 1024 sent as 1024.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(&FORMAT_IDENTIFIER.to_be_bytes());
        b[4] = VERSION;
        b[5] = if self.remote_invalidation {
            FLAG_REMOTE_INVALIDATION
        } else {
            0
        };
        b[6] = encode_size(self.send_size).unwrap_or(0);
        b[7] = encode_size(self.recv_size).unwrap_or(0);
        b
    }

    /// Parse eight octets at the start of `buf` (format identifier and version
    /// checked). `None` if they are not RFC 8797 version 1 private data.
    pub fn parse(buf: &[u8]) -> Option<PrivateData> {
        let b: &[u8; LEN] = buf.get(..LEN)?.try_into().ok()?;
        if u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != FORMAT_IDENTIFIER || b[4] != VERSION {
            return None;
        }
        Some(PrivateData {
            remote_invalidation: b[5] & FLAG_REMOTE_INVALIDATION != 0,
            send_size: decode_size(b[6]),
            recv_size: decode_size(b[7]),
        })
    }

    /// Search a received private data buffer for the message at any offset
    /// (RFC 8797 §5.2).
    pub fn find(buf: &[u8]) -> Option<PrivateData> {
        let id = FORMAT_IDENTIFIER.to_be_bytes();
        buf.windows(LEN).filter(|w| w[..4] == id).find_map(PrivateData::parse)
    }
}

/// Which end of the connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The active side (RPC client, Requester).
    Client,
    /// The passive side (RPC server, Responder).
    Server,
}

/// Connection parameters after the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Inline thresholds for both directions (fixed for the connection, RPCR-INL-01).
    pub thresholds: Thresholds,
    /// Both peers set R: the server MAY reply with Send With Invalidate (§4.1).
    pub remote_invalidation: bool,
}

/// Combine our private data with the peer's (`None` when absent or unrecognised:
/// RFC 8797 §5.1 defaults). Client-to-server threshold = min(client send, server
/// receive); server-to-client = min(server send, client receive) (RFC 8797 §4.2,
/// RPCR-INL-03).
pub fn negotiate(side: Side, local: &PrivateData, peer: Option<&PrivateData>) -> Negotiated {
    let peer = peer.copied().unwrap_or_default();
    let (client, server) = match side {
        Side::Client => (local, &peer),
        Side::Server => (&peer, local),
    };
    Negotiated {
        thresholds: Thresholds {
            call: client.send_size.min(server.recv_size),
            reply: server.send_size.min(client.recv_size),
        },
        remote_invalidation: client.remote_invalidation && server.remote_invalidation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux client's MPA Request private data (lab frame 4): IRD/ORD word, then
    /// RFC 8797 with R=1, 4 KiB each way.
    const LINUX_CLIENT_MPA_PDATA: [u8; 12] = [0x00, 0x80, 0x00, 0x00, 0xf6, 0xab, 0x0e, 0x18, 0x01, 0x01, 0x03, 0x03];
    /// Linux server's MPA Reply private data (frame 6): R=0.
    const LINUX_SERVER_MPA_PDATA: [u8; 12] = [0x00, 0x00, 0x00, 0x80, 0xf6, 0xab, 0x0e, 0x18, 0x01, 0x00, 0x03, 0x03];

    #[test]
    fn golden_linux_client_and_server() {
        let c = PrivateData::find(&LINUX_CLIENT_MPA_PDATA).unwrap();
        assert_eq!(c, PrivateData::new(4096, 4096, true).unwrap());
        assert_eq!(c.encode(), LINUX_CLIENT_MPA_PDATA[4..]);
        let s = PrivateData::find(&LINUX_SERVER_MPA_PDATA).unwrap();
        assert_eq!(s, PrivateData::new(4096, 4096, false).unwrap());
        assert_eq!(s.encode(), LINUX_SERVER_MPA_PDATA[4..]);
        // With Linux as the server, RFC 8797 §4.1 turns remote invalidation off
        // (the server's R is 0). Frames 41/344/366 of the capture nevertheless use
        // Send with Invalidate: Linux svcrdma follows the *client's* R alone. A
        // Requester that sets R must therefore accept remote invalidation even when
        // `remote_invalidation` below is false.
        let n = negotiate(Side::Client, &c, Some(&s));
        assert_eq!(
            n.thresholds,
            Thresholds {
                call: 4096,
                reply: 4096
            }
        );
        assert!(!n.remote_invalidation);
    }

    /// RPCR-INL-03: no private data -> 1024 both ways, no remote invalidation.
    #[test]
    fn absent_private_data_means_defaults() {
        let local = PrivateData::new(65536, 65536, true).unwrap();
        for side in [Side::Client, Side::Server] {
            let n = negotiate(side, &local, None);
            assert_eq!(n.thresholds, Thresholds::default());
            assert!(!n.remote_invalidation);
        }
        assert_eq!(PrivateData::find(&[0; 8]), None);
        assert_eq!(PrivateData::find(&LINUX_CLIENT_MPA_PDATA[..11]), None);
    }

    #[test]
    fn thresholds_take_the_minimum_per_direction() {
        let client = PrivateData::new(8192, 2048, true).unwrap();
        let server = PrivateData::new(4096, 16384, true).unwrap();
        let a = negotiate(Side::Client, &client, Some(&server));
        let b = negotiate(Side::Server, &server, Some(&client));
        assert_eq!(a, b);
        assert_eq!(
            a.thresholds,
            Thresholds {
                call: 8192,
                reply: 2048
            }
        );
        assert!(a.remote_invalidation);
    }

    #[test]
    fn size_encoding_bounds() {
        assert_eq!(encode_size(1024), Ok(0));
        assert_eq!(encode_size(2047), Ok(0)); // rounded down
        assert_eq!(encode_size(4096), Ok(3));
        assert_eq!(encode_size(262144), Ok(255));
        assert_eq!(encode_size(1 << 30), Ok(255)); // clamped
        assert_eq!(encode_size(1023), Err(PrivateDataError::SizeTooSmall(1023)));
        assert_eq!(decode_size(0), 1024);
        assert_eq!(decode_size(255), 262144);
        for v in 0..=255u8 {
            assert_eq!(encode_size(decode_size(v)), Ok(v));
        }
    }

    #[test]
    fn unknown_version_and_reserved_bits() {
        let mut b = PrivateData::new(4096, 4096, true).unwrap().encode();
        b[5] |= 0xfe; // reserved bits ignored
        assert!(PrivateData::parse(&b).unwrap().remote_invalidation);
        b[4] = 2;
        assert_eq!(PrivateData::parse(&b), None);
        // found at an unaligned offset
        let mut buf = vec![0xff, 0xee, 0xdd];
        buf.extend_from_slice(&PrivateData::default().encode());
        assert_eq!(PrivateData::find(&buf), Some(PrivateData::default()));
    }
}
