//! CRC32c by carry-less multiplication with 256-bit VPCLMULQDQ on AVX2 (no
//! AVX-512 needed), for x86-64 CPUs such as AMD Zen 3 where the `crc32`
//! instruction (8 octets per cycle with three streams) is the limit otherwise.
//!
//! This module holds all of the crate's `unsafe` code for the CRC. Method: the
//! folding of Intel's "Fast CRC Computation for Generic Polynomials Using
//! PCLMULQDQ Instruction" (Gopal et al., 2009), in the bit-reflected domain:
//!
//! * A 16-octet lane loaded little-endian holds, in its low quadword `a`, the
//!   coefficients of `x^127 .. x^64` (bit 0 is `x^127`) and in its high
//!   quadword `b` those of `x^63 .. x^0`, relative to the lane's end.
//! * Moving a lane `n` bits further into the message multiplies it by `x^n`;
//!   modulo `P` that is `a * (x^(n+64) mod P) + b * (x^n mod P)`, a polynomial
//!   of degree < 96 that fits a lane again. A reflected carry-less product of
//!   two quadwords carries an extra factor `x`, so the multipliers stored are
//!   `x^(n+63) mod P` and `x^(n-1) mod P`, reflected into the upper half of a
//!   quadword ([`fold_consts`], computed at compile time).
//! * Eight ymm accumulators (256 octets) are folded per iteration. On Zen 3 a
//!   ymm VPCLMULQDQ issues every other cycle, so folding alone is as fast as
//!   the `crc32` instruction (8 octets per cycle); the two use different
//!   units, so long buffers are cut into chunks ([`update`]) whose first part
//!   is folded while three `crc32` streams cover the rest in the same loop.
//!   A stream's result `s` is worth `s` XORed into the four octets after its
//!   region, i.e. a 128-bit lane there, which is folded forward like any other.
//! * At the end the accumulators are folded into one, the remaining 32- and
//!   16-octet pieces are folded in, and the final 128-bit remainder `R` is
//!   turned into a CRC register value with two `crc32` instructions started
//!   from 0 (which compute `R * x^32 mod P`). The last < 16 octets go through
//!   the `crc32` instruction as well.
//!
//! The initial register value is XORed into the first four octets, so the
//! kernel extends any CRC state: [`Clmul256::append`] works for arbitrary
//! split points of an incremental computation.

use std::arch::x86_64::{
    __m128i, __m256i, _mm_clmulepi64_si128, _mm_crc32_u8, _mm_crc32_u64, _mm_cvtsi32_si128, _mm_cvtsi128_si64,
    _mm_extract_epi64, _mm_loadu_si128, _mm_set_epi64x, _mm_xor_si128, _mm256_castsi256_si128,
    _mm256_clmulepi64_epi128, _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_set_epi64x, _mm256_setzero_si256,
    _mm256_xor_si256, _mm256_zextsi128_si256,
};

/// The CRC32c generator polynomial, `x^32` included, in normal bit order.
const P: u64 = 0x1_1EDC_6F41;

/// Number of ymm accumulators in the main loop.
const LANES: usize = 8;
/// Octets consumed per main-loop iteration.
const BLOCK: usize = 32 * LANES;

/// Main-loop iterations per chunk (see [`update`]).
const ITERS: usize = 4;
/// Octets each of the three `crc32` streams takes per main-loop iteration.
const PIECE: usize = 8 * 8;
/// Octets of one `crc32` stream per chunk.
const STREAM: usize = PIECE * ITERS;
/// Octets per chunk: folded blocks, then three `crc32` stream regions.
const CHUNK: usize = BLOCK * ITERS + 3 * STREAM;

/// `x^n mod P`, normal bit order (bit `j` is the coefficient of `x^j`).
const fn xpow_mod(n: u32) -> u32 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= P;
        }
        i += 1;
    }
    r as u32
}

/// `x^n mod P` as a reflected quadword multiplier: coefficient of `x^j` at bit `63 - j`.
const fn reflected(n: u32) -> u64 {
    (xpow_mod(n).reverse_bits() as u64) << 32
}

/// Multipliers (for the low, for the high quadword of a lane) that move a lane
/// `bits` bits forward in the message, modulo `P`.
const fn fold_consts(bits: u32) -> (u64, u64) {
    (reflected(bits + 63), reflected(bits - 1))
}

const FOLD_BLOCK: (u64, u64) = fold_consts(BLOCK as u32 * 8);
const FOLD_JUMP: (u64, u64) = fold_consts((BLOCK + 3 * STREAM) as u32 * 8);
const FOLD_STREAM: (u64, u64) = fold_consts(STREAM as u32 * 8);
const FOLD_2STREAM: (u64, u64) = fold_consts(2 * STREAM as u32 * 8);
const FOLD_256: (u64, u64) = fold_consts(256);
const FOLD_128: (u64, u64) = fold_consts(128);

/// Proof that the CPU has AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.2: only
/// [`Clmul256::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub(super) struct Clmul256(());

impl Clmul256 {
    /// The kernel, if this CPU can run it.
    #[inline]
    pub(super) fn detect() -> Option<Self> {
        let ok = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse4.2");
        ok.then_some(Clmul256(()))
    }

    /// Extends `crc`, a finished CRC32c (0 for none yet), by `data`; same
    /// contract as `crc32c::crc32c_append`.
    #[inline]
    pub(super) fn append(self, crc: u32, data: &[u8]) -> u32 {
        // SAFETY: `self` exists only if `detect` found every target feature
        // `update` is compiled for on this CPU.
        !unsafe { update(!crc, data) }
    }
}

/// Loads 32 octets from the start of `s`.
#[inline]
#[target_feature(enable = "avx2")]
fn load256(s: &[u8]) -> __m256i {
    assert!(s.len() >= 32);
    // SAFETY: the assert keeps the 32-octet unaligned load inside `s`; the
    // feature is enabled on this function and checked by its callers' callers.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// Loads 16 octets from the start of `s`.
#[inline]
#[target_feature(enable = "sse2")]
fn load128(s: &[u8]) -> __m128i {
    assert!(s.len() >= 16);
    // SAFETY: the assert keeps the 16-octet unaligned load inside `s`.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// Both lanes of `x` moved forward by the distance `k` was made for.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold256(x: __m256i, k: __m256i) -> __m256i {
    _mm256_xor_si256(
        _mm256_clmulepi64_epi128::<0x00>(x, k),
        _mm256_clmulepi64_epi128::<0x11>(x, k),
    )
}

/// `x` moved forward by the distance `k` was made for.
#[inline]
#[target_feature(enable = "pclmulqdq")]
fn fold128(x: __m128i, k: __m128i) -> __m128i {
    _mm_xor_si128(_mm_clmulepi64_si128::<0x00>(x, k), _mm_clmulepi64_si128::<0x11>(x, k))
}

#[inline]
#[target_feature(enable = "avx2")]
fn consts256((lo, hi): (u64, u64)) -> __m256i {
    _mm256_set_epi64x(hi as i64, lo as i64, hi as i64, lo as i64)
}

/// XORs 32 octets of each accumulator's next block into it, after moving the
/// accumulator forward by the distance `k` was made for.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold_in(acc: &mut [__m256i; LANES], block: &[u8; BLOCK], k: __m256i) {
    for (i, a) in acc.iter_mut().enumerate() {
        *a = _mm256_xor_si256(fold256(*a, k), load256(&block[32 * i..]));
    }
}

/// Starts the accumulators at `block` (`fresh`), or moves them there over the
/// `3 * STREAM` octets the `crc32` streams took (`k_jump`); either way XORs the
/// 128-bit lane `carry` (the CRC of everything before, placed at `block`) in.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn enter(acc: &mut [__m256i; LANES], block: &[u8; BLOCK], fresh: bool, k_jump: __m256i, carry: __m128i) {
    if fresh {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = load256(&block[32 * i..]);
        }
    } else {
        fold_in(acc, block, k_jump);
    }
    acc[0] = _mm256_xor_si256(acc[0], _mm256_zextsi128_si256(carry));
}

/// The `i`-th little-endian quadword of `piece`.
#[inline(always)]
fn word(piece: &[u8; PIECE], i: usize) -> u64 {
    u64::from_le_bytes(piece[8 * i..8 * i + 8].try_into().expect("8 octets"))
}

/// Runs the CRC register `state` (not inverted) over `data`.
///
/// Long buffers are cut into chunks of [`CHUNK`] octets: the first `ITERS`
/// blocks of [`BLOCK`] octets are folded by the ymm accumulators while, in the same loop,
/// three independent `crc32` instruction streams (from 0) cover the next three
/// [`STREAM`]-octet regions (the two units run in parallel). At the end of a
/// chunk the three stream results become one 128-bit lane at the start of the
/// next block, and the accumulators jump over the streams' regions.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
fn update(mut state: u32, data: &[u8]) -> u32 {
    let mut rest = data;
    if data.len() >= BLOCK {
        let k_block = consts256(FOLD_BLOCK);
        let k_jump = consts256(FOLD_JUMP);
        let k_stream = _mm_set_epi64x(FOLD_STREAM.1 as i64, FOLD_STREAM.0 as i64);
        let k_2stream = _mm_set_epi64x(FOLD_2STREAM.1 as i64, FOLD_2STREAM.0 as i64);
        let mut acc = [_mm256_setzero_si256(); LANES];
        let mut carry = _mm_cvtsi32_si128(state as i32);
        let mut fresh = true;
        while rest.len() >= CHUNK + BLOCK {
            let (chunk, next) = rest.split_at(CHUNK);
            let (folded, streams) = chunk.split_at(BLOCK * ITERS);
            let (r1, r23) = streams.split_at(STREAM);
            let (r2, r3) = r23.split_at(STREAM);
            let (mut c1, mut c2, mut c3) = (0u64, 0u64, 0u64);
            for t in 0..ITERS {
                let block: &[u8; BLOCK] = folded[t * BLOCK..][..BLOCK].try_into().expect("block");
                if t == 0 {
                    enter(&mut acc, block, fresh, k_jump, carry);
                    fresh = false;
                } else {
                    fold_in(&mut acc, block, k_block);
                }
                let p1: &[u8; PIECE] = r1[t * PIECE..][..PIECE].try_into().expect("piece");
                let p2: &[u8; PIECE] = r2[t * PIECE..][..PIECE].try_into().expect("piece");
                let p3: &[u8; PIECE] = r3[t * PIECE..][..PIECE].try_into().expect("piece");
                for i in 0..PIECE / 8 {
                    c1 = _mm_crc32_u64(c1, word(p1, i));
                    c2 = _mm_crc32_u64(c2, word(p2, i));
                    c3 = _mm_crc32_u64(c3, word(p3, i));
                }
            }
            // A register value after some octets is equivalent to XORing it
            // into the next four octets: stream 1's lands 2 * STREAM octets
            // before the next block, stream 2's STREAM before, stream 3's on it.
            carry = _mm_xor_si128(
                _mm_cvtsi32_si128(c3 as i32),
                _mm_xor_si128(
                    fold128(_mm_cvtsi32_si128(c1 as i32), k_2stream),
                    fold128(_mm_cvtsi32_si128(c2 as i32), k_stream),
                ),
            );
            rest = next;
        }
        let mut blocks = rest.chunks_exact(BLOCK);
        let first = blocks.next().expect("at least one block");
        enter(&mut acc, first.try_into().expect("block"), fresh, k_jump, carry);
        for block in &mut blocks {
            fold_in(&mut acc, block.try_into().expect("block"), k_block);
        }
        let k256 = consts256(FOLD_256);
        let mut x = acc[0];
        for a in &acc[1..] {
            x = _mm256_xor_si256(fold256(x, k256), *a);
        }
        rest = blocks.remainder();
        while rest.len() >= 32 {
            x = _mm256_xor_si256(fold256(x, k256), load256(rest));
            rest = &rest[32..];
        }
        let k128 = _mm_set_epi64x(FOLD_128.1 as i64, FOLD_128.0 as i64);
        let mut y = _mm_xor_si128(
            fold128(_mm256_castsi256_si128(x), k128),
            _mm256_extracti128_si256::<1>(x),
        );
        if rest.len() >= 16 {
            y = _mm_xor_si128(fold128(y, k128), load128(rest));
            rest = &rest[16..];
        }
        let lo = _mm_cvtsi128_si64(y) as u64;
        let hi = _mm_extract_epi64::<1>(y) as u64;
        state = _mm_crc32_u64(_mm_crc32_u64(0, lo), hi) as u32;
    }
    let mut words = rest.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 octets"));
        state = _mm_crc32_u64(state as u64, w) as u32;
    }
    for &b in words.remainder() {
        state = _mm_crc32_u8(state, b);
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn constants_match_the_polynomial() {
        // x^32 mod P is P without its x^32 term.
        assert_eq!(xpow_mod(32) as u64, P & 0xFFFF_FFFF);
        assert_eq!(xpow_mod(31), 1 << 31);
        // Reflected P without x^32 is the well-known 0x82F63B78.
        assert_eq!(((P as u32).reverse_bits()), 0x82F6_3B78);
    }

    #[test]
    fn check_value_and_exhaustive_short_lengths() {
        let Some(k) = Clmul256::detect() else { return };
        assert_eq!(k.append(0, b"123456789"), 0xE306_9283);
        let data: Vec<u8> = (0..1100u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..=1024 {
            for off in [0, 1, 7] {
                let d = &data[off..off + len];
                assert_eq!(k.append(0, d), crc32c::crc32c(d), "len {len} offset {off}");
            }
        }
    }

    #[test]
    fn lengths_around_the_chunk_boundaries() {
        let Some(k) = Clmul256::detect() else { return };
        let data = random_bytes(5 * CHUNK + 2 * BLOCK + 64);
        for chunks in 0..=5 {
            for base in [chunks * CHUNK, chunks * CHUNK + BLOCK] {
                for len in base.saturating_sub(40)..=base + 40 {
                    for off in [0, 3] {
                        let Some(d) = data.get(off..off + len) else { continue };
                        assert_eq!(k.append(0, d), crc32c::crc32c(d), "len {len} offset {off}");
                        assert_eq!(k.append(0x1234_5678, d), crc32c::crc32c_append(0x1234_5678, d));
                    }
                }
            }
        }
    }

    fn random_bytes(n: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Random lengths up to 300 000 at random alignments, one-shot and
        /// split at random points through the incremental API.
        #[test]
        fn matches_crc32c_crate(
            len in 0usize..=300_000,
            off in 0usize..64,
            mut splits in proptest::collection::vec(0usize..=300_000, 0..4),
        ) {
            static DATA: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            let data = DATA.get_or_init(|| random_bytes(300_064));
            let d = &data[off..off + len];
            let want = crc32c::crc32c(d);
            if let Some(k) = Clmul256::detect() {
                prop_assert_eq!(k.append(0, d), want);
            }
            prop_assert_eq!(crate::crc::crc32c(d), want);
            for s in &mut splits {
                *s = (*s).min(len);
            }
            splits.sort_unstable();
            let mut inc = crate::crc::Crc32c::new();
            let mut appended = 0u32;
            let mut at = 0;
            for &s in splits.iter().chain([&len]) {
                inc.update(&d[at..s]);
                if let Some(k) = Clmul256::detect() {
                    appended = k.append(appended, &d[at..s]);
                } else {
                    appended = crc32c::crc32c_append(appended, &d[at..s]);
                }
                at = s;
            }
            prop_assert_eq!(inc.finish(), want);
            prop_assert_eq!(appended, want);
        }
    }
}
