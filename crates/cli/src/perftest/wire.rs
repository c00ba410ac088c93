//! perftest's control messages, sans I/O: what `ib_*_bw -R` / `ib_*_lat -R` (perftest 6.06,
//! Debian bookworm's 4.5+0.17) put in the RDMA Sends of its rdma_cm "comm" connection, and the
//! iWARP send-credit word of `ib_send_bw`.
//!
//! Every message is one RDMA Send; the receiver's buffer is `sizeof(struct pingpong_dest)` =
//! 56 octets (`post_one_recv_wqe` in perftest_communication.c), so no message is longer. The
//! layouts (perftest_communication.c, perftest_resources.h), all checked against a capture of
//! two perftests over siw (`docs/interop-perftest.md`):
//!
//! | message | octets | layout |
//! |---|---|---|
//! | version (`exchange_versions`) | 16 | `char version[16]`, `"6.06"` NUL-padded (strncpy) |
//! | cycle buffer, cache line (`check_sys_data`) | 4 + 4 | one big-endian `int` each, two Sends |
//! | MTU (`check_mtu`) | 2 | the `enum ibv_mtu` value as decimal text, `"3\0"` for 1024 |
//! | `struct pingpong_dest` (`rdma_write_keys`) | 56 | below |
//! | `struct bw_report_data` (`xchg_bw_reports`) | 5 × 8 | size, iters, bw_peak, bw_avg, msgRate_avg: one Send each, big-endian u64 / byte-swapped IEEE double |
//!
//! `struct pingpong_dest` is sent as the C struct with each field byte-swapped
//! (`#ifdef HAVE_ENDIAN`), so x86-64 alignment puts 4 octets of padding after `rkey`; perftest
//! never initialises them (they carry stack bytes) and never reads them:
//!
//! ```text
//!  0 lid        be32      4 out_reads  be32      8 qpn  be32     12 psn  be32
//! 16 rkey       be32     20 (padding, garbage)  24 vaddr be64
//! 32 gid        16 octets, raw
//! 48 srqn       be32     52 gid_index be32  (rdma_read_keys ignores both)
//! ```

use std::fmt;

/// `sizeof(struct pingpong_dest)` on LP64, and the size of every receive perftest posts on
/// its comm connection.
pub const DEST_LEN: usize = 56;
/// `MAX_VERSION`: the version message's length.
pub const VERSION_LEN: usize = 16;
/// perftest's `VERSION` (configure.ac `AC_INIT([perftest],[6.06])`) that we state.
pub const VERSION: &str = "6.06";
/// Marker after the NUL of our version string: perftest reads the version with `atof` and
/// ignores it; a softrdma peer sees that both ends are softrdma and checks payload patterns.
pub const SOFTRDMA_MARK: &str = "softrdma";
/// `check_version_compatibility`: older peers are refused.
pub const MIN_PEER_VERSION: f64 = 5.70;
/// One field of `struct bw_report_data` per Send.
pub const REPORT_FIELD_LEN: usize = 8;
/// `check_mtu` for peers of 5.31 and later: `sizeof(char[2])`.
pub const MTU_LEN: usize = 2;
/// `check_sys_data`: `sizeof(int)`.
pub const INT_LEN: usize = 4;

/// Bad input from the peer.
#[derive(Debug, Clone, PartialEq)]
pub enum WireError {
    /// A message of the wrong length for where it came in the exchange.
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// The version text does not start with a number.
    VersionText(String),
    /// `check_version_compatibility`: the peer is older than 5.70.
    VersionTooOld(f64),
    /// The MTU message is not decimal text.
    MtuText(Vec<u8>),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Length { what, expected, got } => {
                write!(f, "perftest {what} message of {got} bytes (expected {expected})")
            }
            WireError::VersionText(s) => write!(f, "perftest version message {s:?} is not a version number"),
            WireError::VersionTooOld(v) => write!(
                f,
                "peer perftest version {v} is older than {MIN_PEER_VERSION} (perftest refuses it as well)"
            ),
            WireError::MtuText(b) => write!(f, "perftest MTU message {b:02x?} is not a decimal number"),
        }
    }
}

impl std::error::Error for WireError {}

fn exact<'a>(what: &'static str, b: &'a [u8], expected: usize) -> Result<&'a [u8], WireError> {
    if b.len() != expected {
        return Err(WireError::Length {
            what,
            expected,
            got: b.len(),
        });
    }
    Ok(b)
}

/// `struct pingpong_dest`: one QP's address as perftest exchanges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PingpongDest {
    pub lid: u32,
    pub out_reads: u32,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: [u8; 16],
    pub srqn: u32,
    pub gid_index: i32,
}

impl PingpongDest {
    /// The 56 octets of `rdma_write_keys` (padding zero).
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    /// Parses a received `pingpong_dest`; the padding is ignored, as perftest ignores it.
    pub fn decode(b: &[u8]) -> Result<PingpongDest, WireError> {
        let b = exact("pingpong_dest", b, DEST_LEN)?;
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        Ok(PingpongDest {
            lid: u32_at(0),
            out_reads: u32_at(4),
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(b[24..32].try_into().unwrap()),
            gid: b[32..48].try_into().unwrap(),
            srqn: u32_at(48),
            gid_index: u32_at(52) as i32,
        })
    }

    /// The fields a test depends on (what `ctx_print_pingpong_data` shows); equal in every
    /// exchange of one run.
    pub fn same_qp(&self, other: &PingpongDest) -> bool {
        (self.qpn, self.psn, self.rkey, self.vaddr, self.out_reads)
            == (other.qpn, other.psn, other.rkey, other.vaddr, other.out_reads)
    }
}

/// Our version message: "6.06", NUL, "softrdma", NUL padding.
pub fn encode_version() -> [u8; VERSION_LEN] {
    let mut b = [0u8; VERSION_LEN];
    b[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let m = VERSION.len() + 1;
    b[m..m + SOFTRDMA_MARK.len()].copy_from_slice(SOFTRDMA_MARK.as_bytes());
    b
}

/// The peer's version, as perftest reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerVersion {
    /// The text up to the first NUL.
    pub text: String,
    /// `atof` of it.
    pub value: f64,
    /// The peer is softrdma (our marker follows the NUL).
    pub softrdma: bool,
}

/// Parses the peer's version message and applies `check_version_compatibility`.
pub fn decode_version(b: &[u8]) -> Result<PeerVersion, WireError> {
    let b = exact("version", b, VERSION_LEN)?;
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let text = String::from_utf8_lossy(&b[..end]).into_owned();
    // atof: the longest leading decimal number.
    let num: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let value: f64 = num.parse().map_err(|_| WireError::VersionText(text.clone()))?;
    if value < MIN_PEER_VERSION {
        return Err(WireError::VersionTooOld(value));
    }
    let rest = &b[(end + 1).min(b.len())..];
    let softrdma = rest.starts_with(SOFTRDMA_MARK.as_bytes());
    Ok(PeerVersion { text, value, softrdma })
}

/// `hton_int`: one `int` of `check_sys_data`.
pub fn encode_int(v: i32) -> [u8; INT_LEN] {
    v.to_be_bytes()
}

pub fn decode_int(what: &'static str, b: &[u8]) -> Result<i32, WireError> {
    let b = exact(what, b, INT_LEN)?;
    Ok(i32::from_be_bytes(b.try_into().unwrap()))
}

/// `enum ibv_mtu` of an MTU in octets (256 → 1 ... 4096 → 5).
pub fn mtu_enum(mtu: u32) -> u8 {
    match mtu {
        0..=256 => 1,
        257..=512 => 2,
        513..=1024 => 3,
        1025..=2048 => 4,
        _ => 5,
    }
}

/// Octets of an `enum ibv_mtu` value 1..=5 (`MTU_SIZE`: `1 << (7 + e)`).
pub fn mtu_bytes(mtu_enum: u8) -> u32 {
    128 << mtu_enum.clamp(1, 5)
}

/// `check_mtu`: `sprintf("%d")` of the enum, two octets sent ("3\0").
pub fn encode_mtu(mtu_enum: u8) -> [u8; MTU_LEN] {
    let s = mtu_enum.to_string();
    let mut b = [0u8; MTU_LEN];
    let n = s.len().min(MTU_LEN);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    b
}

/// The peer's MTU enum; perftest keeps its own when the peer's is outside 1..=5
/// (`valid_mtu_size`), so `None` is not an error, text that is no number is.
pub fn decode_mtu(b: &[u8]) -> Result<Option<u8>, WireError> {
    let b = exact("MTU", b, MTU_LEN)?;
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let s = std::str::from_utf8(&b[..end]).map_err(|_| WireError::MtuText(b.to_vec()))?;
    let v: u32 = s.trim().parse().map_err(|_| WireError::MtuText(b.to_vec()))?;
    Ok((1..=5).contains(&v).then_some(v as u8))
}

/// `struct bw_report_data` as `xchg_bw_reports` exchanges it with peers of 5.33 and later.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    pub size: u64,
    pub iters: u64,
    pub bw_peak: f64,
    pub bw_avg: f64,
    pub msg_rate: f64,
}

impl BwReport {
    /// The five Sends, in order.
    pub fn encode(&self) -> [[u8; REPORT_FIELD_LEN]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// From the five received Sends.
    pub fn decode(fields: &[Vec<u8>]) -> Result<BwReport, WireError> {
        if fields.len() != 5 {
            return Err(WireError::Length {
                what: "bw_report_data field count",
                expected: 5,
                got: fields.len(),
            });
        }
        let mut v = [0u64; 5];
        for (i, f) in fields.iter().enumerate() {
            let f = exact("bw_report_data field", f, REPORT_FIELD_LEN)?;
            v[i] = u64::from_be_bytes(f.try_into().unwrap());
        }
        Ok(BwReport {
            size: v[0],
            iters: v[1],
            bw_peak: f64::from_bits(v[2]),
            bw_avg: f64::from_bits(v[3]),
            msg_rate: f64::from_bits(v[4]),
        })
    }
}

/// `ib_send_bw` over iWARP (`ctx_alloc_credit`, `run_iter_bw_server`): the receiver RDMA
/// Writes the count of Sends received so far, a `uint32_t` in host order (little-endian on
/// every perftest we meet), into the sender's credit word.
pub fn encode_credit(received: u32) -> [u8; 4] {
    received.to_le_bytes()
}

pub fn decode_credit(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    // ULP payloads of the Sends in a capture of `ib_write_bw -R -d siw0 -n 20 -s 4096` against
    // itself in the lab guest (perftest 4.5+0.17-1, 6.06), client side (docs/interop-perftest.md).
    const CAP_VERSION: &str = "362e3036000000000000000000000000";
    const CAP_CYCLE: &str = "00001000";
    const CAP_CACHE: &str = "00000040";
    const CAP_MTU: &str = "3300";
    // The last pingpong_dest of the run (ctx_close_connection), with stack garbage in the padding.
    const CAP_DEST: &str = "000000000000000100000003009a9531281710000d560000\
                            0000560d3a2fd000525400770002000000000000000000000000000000000000";
    const CAP_REPORT: [&str; 5] = [
        "0000000000001000",
        "0000000000000014",
        "401db8bdfdd40a1b",
        "401d888228b93e7c",
        "3f5ef7c4876f6bdf",
    ];

    #[test]
    fn version_golden_and_ours() {
        let v = decode_version(&hex(CAP_VERSION)).unwrap();
        assert_eq!(v.text, "6.06");
        assert!((v.value - 6.06).abs() < 1e-9);
        assert!(!v.softrdma);
        let ours = encode_version();
        assert_eq!(&ours[..5], b"6.06\0");
        let back = decode_version(&ours).unwrap();
        assert_eq!(back.text, "6.06");
        assert!(back.softrdma);
    }

    #[test]
    fn version_errors() {
        let mut old = [0u8; 16];
        old[..4].copy_from_slice(b"5.60");
        assert_eq!(decode_version(&old), Err(WireError::VersionTooOld(5.6)));
        let mut junk = [0u8; 16];
        junk[..3].copy_from_slice(b"abc");
        assert!(matches!(decode_version(&junk), Err(WireError::VersionText(_))));
        assert!(matches!(
            decode_version(b"6.06"),
            Err(WireError::Length {
                expected: 16,
                got: 4,
                ..
            })
        ));
    }

    #[test]
    fn sys_data_and_mtu_golden() {
        assert_eq!(decode_int("cycle buffer", &hex(CAP_CYCLE)).unwrap(), 4096);
        assert_eq!(decode_int("cache line", &hex(CAP_CACHE)).unwrap(), 64);
        assert_eq!(encode_int(4096).to_vec(), hex(CAP_CYCLE));
        assert_eq!(decode_mtu(&hex(CAP_MTU)).unwrap(), Some(3));
        assert_eq!(encode_mtu(mtu_enum(1024)).to_vec(), hex(CAP_MTU));
        assert_eq!(decode_mtu(b"9\0").unwrap(), None);
        assert_eq!((mtu_bytes(1), mtu_bytes(3), mtu_bytes(5)), (256, 1024, 4096));
        assert!((1..=5).all(|e| mtu_enum(mtu_bytes(e)) == e));
        assert!(matches!(decode_mtu(b"x\0"), Err(WireError::MtuText(_))));
        assert!(decode_int("cache line", &[0, 0, 0]).is_err());
    }

    #[test]
    fn dest_golden() {
        let d = PingpongDest::decode(&hex(CAP_DEST)).unwrap();
        assert_eq!(d.lid, 0);
        assert_eq!(d.out_reads, 1);
        assert_eq!(d.qpn, 3);
        assert_eq!(d.psn, 0x9a9531);
        assert_eq!(d.rkey, 0x2817_1000);
        assert_eq!(d.vaddr, 0x560d_3a2f_d000);
        assert_eq!(&d.gid[..6], &[0x52, 0x54, 0x00, 0x77, 0x00, 0x02]);
        assert_eq!(d.gid_index, 0);
        // Our encoding is the capture with the padding (stack garbage there) zeroed.
        let mut expect = hex(CAP_DEST);
        expect[20..24].fill(0);
        assert_eq!(d.encode().to_vec(), expect);
        assert!(PingpongDest::decode(&expect[..55]).is_err());
        assert!(
            PingpongDest::decode(&[0u8; 56])
                .unwrap()
                .same_qp(&PingpongDest::default())
        );
    }

    #[test]
    fn report_golden() {
        let fields: Vec<Vec<u8>> = CAP_REPORT.iter().map(|h| hex(h)).collect();
        let r = BwReport::decode(&fields).unwrap();
        assert_eq!(r.size, 4096);
        assert_eq!(r.iters, 20);
        assert_eq!(format!("{:.2}", r.bw_peak), "7.43");
        assert_eq!(format!("{:.2}", r.bw_avg), "7.38");
        assert_eq!(format!("{:.6}", r.msg_rate), "0.001890");
        let enc: Vec<Vec<u8>> = r.encode().iter().map(|f| f.to_vec()).collect();
        assert_eq!(enc, fields);
        assert!(BwReport::decode(&fields[..4]).is_err());
        let mut short = fields.clone();
        short[2].pop();
        assert!(BwReport::decode(&short).is_err());
    }

    #[test]
    fn credit_is_little_endian() {
        assert_eq!(encode_credit(0x0102_0304), [4, 3, 2, 1]);
        assert_eq!(decode_credit([0x21, 0, 0, 0]), 33);
    }
}
