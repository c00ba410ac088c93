//! CRC32c (Castagnoli) for the MPA FPDU trailer, RFC 5044 §4.4 / §6.
//!
//! Every CRC in softrdma goes through this module so that the backing crate can be
//! swapped in one place. The implementation is picked per CPU, by measurement
//! (`cargo bench -p iwarp --bench crc`, figures in `docs/performance.md`):
//!
//! * x86-64 with AVX-512VL and VPCLMULQDQ (e.g. Sapphire Rapids), and every
//!   non-x86 CPU: `crc-fast` (~115 GB/s at 64 KiB with AVX-512 VPCLMULQDQ).
//! * other x86-64 with AVX2 and VPCLMULQDQ (e.g. AMD Zen 3): `crc-fast` up to
//!   [`SHORT`] octets (its plain `crc32` instruction loop), above that this
//!   crate's own kernel in `crc/simd.rs`: 256-bit VPCLMULQDQ folding of eight
//!   ymm accumulators run in parallel with three `crc32` instruction streams
//!   (~27-30 GB/s at 64 KiB on Zen 3, per CPU second, where the `crc32c`
//!   crate's three-way `crc32` loop is bound to 8 octets per cycle, 18-20
//!   GB/s, and crc-fast's SSE "fusion" kernel gives 15.5).
//! * other x86-64: `crc-fast` up to [`SHORT`] octets, the `crc32c` crate's
//!   three-way interleaved `crc32` instruction above.
//!
//! All three compute the same function and are cross-checked in the tests.
//!
//! The value is the conventional CRC-32C (init `0xFFFF_FFFF`, reflected, final XOR
//! `0xFFFF_FFFF`; check value of `"123456789"` is `0xE306_9283`). On the wire MPA
//! carries it **least-significant byte first** ([`to_wire`]), which is the iSCSI
//! digest convention RFC 5044 points to and what Linux siw writes
//! (`put_unaligned_le32(~crc)`); tshark agrees (see `tests/tshark_pcap.rs`).

use crc_fast::{CrcAlgorithm, Digest};

#[cfg(target_arch = "x86_64")]
mod simd;

/// From this many octets on, CPUs with AVX2 + VPCLMULQDQ but no AVX-512 use
/// the 256-bit carry-less-multiply folding kernel of `crc/simd.rs` (Zen 3:
/// ~19 GB/s at 512 octets against 8 for the `crc32c` crate; below 256 octets
/// it has no full block to fold).
pub const CLMUL_MIN: usize = SHORT + 1;

/// Up to this many octets `crc-fast` is used on every CPU: its single-stream
/// `crc32` loop for short buffers beats the `crc32c` crate's setup cost
/// (Zen 3: 8-10 GB/s vs 4-6 at 64 octets, 12 vs 9 at 256); from 512 octets
/// on the `crc32c` crate is as fast or faster there.
pub const SHORT: usize = 256;

/// Whether `crc-fast` has a wide (AVX-512 VPCLMULQDQ) kernel on this CPU, or
/// is the better choice anyway (non-x86).
#[inline]
fn wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vl") && std::arch::is_x86_feature_detected!("vpclmulqdq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// Extends the finished CRC `crc` by `data` on CPUs without a wide crc-fast
/// kernel: the AVX2 VPCLMULQDQ folding kernel for long buffers if the CPU has
/// it, the `crc32c` crate otherwise.
#[inline]
fn append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= CLMUL_MIN
        && let Some(k) = simd::Clmul256::detect()
    {
        return k.append(crc, data);
    }
    crc32c::crc32c_append(crc, data)
}

/// One-shot CRC32c of a contiguous buffer.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    if data.len() <= SHORT || wide() {
        crc_fast::crc32_iscsi(data)
    } else {
        append(0, data)
    }
}

/// CRC32c over several slices, as if they were concatenated (header, payload, pad).
#[inline]
pub fn crc32c_iov(parts: &[&[u8]]) -> u32 {
    let mut d = Crc32c::new();
    for p in parts {
        d.update(p);
    }
    d.finish()
}

/// Incremental CRC32c, for FPDUs whose bytes are gathered from several places.
#[derive(Clone)]
pub struct Crc32c(Inner);

// Not boxed: FPDU framing creates one per FPDU and must not allocate; the
// size is what `Crc32c` always had (it wrapped a `Digest`).
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Inner {
    /// crc-fast's digest (wide kernels).
    Fast(Digest),
    /// The CRC so far, extended with `crc32c::crc32c_append`.
    Append(u32),
}

impl Crc32c {
    #[inline]
    /// A CRC32c (Castagnoli, as MPA uses it) over no bytes yet.
    pub fn new() -> Self {
        if wide() {
            Crc32c(Inner::Fast(Digest::new(CrcAlgorithm::Crc32Iscsi)))
        } else {
            Crc32c(Inner::Append(0))
        }
    }
    #[inline]
    /// Adds `data` to the CRC.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.0 {
            Inner::Fast(d) => d.update(data),
            Inner::Append(c) => *c = append(*c, data),
        }
    }
    #[inline]
    /// The CRC of everything added so far (the value MPA puts on the wire).
    pub fn finish(&self) -> u32 {
        match &self.0 {
            Inner::Fast(d) => d.finalize() as u32,
            Inner::Append(c) => *c,
        }
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

/// The four CRC bytes as MPA puts them on the wire (little-endian, like Linux siw).
#[inline]
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// Reads the CRC field of an FPDU as written by [`to_wire`].
#[inline]
pub fn from_wire(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn check_value() {
        // RFC 3720 / RFC 5044 CRC32c check value.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(to_wire(0xE306_9283), [0x83, 0x92, 0x06, 0xE3]);
    }

    #[test]
    fn rfc3720_vectors() {
        // RFC 3720 B.4: 32 bytes of zeros -> 0x8a9136aa, 32 bytes of 0xff -> 0x62a8ab43.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
    }

    #[test]
    fn both_backends_agree_around_the_switch() {
        let data: Vec<u8> = (0..4 * SHORT).map(|i| (i * 7 + i / 251) as u8).collect();
        for len in [0, 1, 7, 8, 9, SHORT - 1, SHORT, SHORT + 1, 2 * SHORT + 3, 4 * SHORT] {
            let d = &data[..len];
            let want = crc_fast::crc32_iscsi(d);
            assert_eq!(crc32c(d), want, "len {len}");
            assert_eq!(crc32c::crc32c(d), want, "len {len}");
            let mut fast = Crc32c(Inner::Fast(Digest::new(CrcAlgorithm::Crc32Iscsi)));
            let mut append = Crc32c(Inner::Append(0));
            for piece in d.chunks(SHORT / 3 + 1) {
                fast.update(piece);
                append.update(piece);
            }
            assert_eq!((fast.finish(), append.finish()), (want, want), "len {len}");
        }
    }

    proptest! {
        #[test]
        fn matches_oracle(data in proptest::collection::vec(any::<u8>(), 0..5000), split in 0usize..5000) {
            let split = split.min(data.len());
            prop_assert_eq!(crc32c(&data), crc32c::crc32c(&data));
            prop_assert_eq!(crc32c_iov(&[&data[..split], &data[split..]]), crc32c::crc32c(&data));
        }
    }
}
