//! CRC-32/ISO-HDLC (the ICRC's CRC: reflected polynomial 0xEDB88320, initial value and
//! final XOR 0xffffffff) for short inputs, in one call over a short buffer.
//!
//! Why: a 64 B RDMA Write covers 128 octets of ICRC input (masked LRH, IPv4, UDP, BTH,
//! RETH, payload). `crc_fast` is built for long buffers: about 215 instructions per call at
//! that size before its AVX-512 folding pays off, and the caller first copied the masked
//! headers and the payload into a cleared 512-octet stack buffer (callgrind, session 14,
//! `bench write --provider roce -s 64`). Here the 16-octet blocks are folded with one
//! carry-less multiply pair each (the folding of Intel's "Fast CRC Computation for Generic
//! Polynomials Using PCLMULQDQ", constants for the reflected IEEE polynomial), the final
//! 128 bits are reduced with Barrett's method, and fewer than 16 trailing octets go through
//! a byte table. Without PCLMULQDQ (or off x86-64) the table does all of it.
//!
//! [`checksum`] is only for inputs of a few hundred octets: one fold per 16 octets is
//! latency-bound; `icrc` hands longer packets to `crc_fast` as before.

/// Byte-at-a-time table of the reflected polynomial.
const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = (c >> 1) ^ (0xEDB8_8320 & (c & 1).wrapping_neg());
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Table update of a raw (not inverted) CRC state.
fn table_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// CRC-32/ISO-HDLC of `data`, equal to `crc_fast::checksum(CrcAlgorithm::Crc32IsoHdlc,
/// data)`, in one call: the whole 16-octet blocks folded, the rest through the table.
#[inline]
pub fn checksum(data: &[u8]) -> u32 {
    if data.len() >= 16 && clmul::available() {
        let whole = data.len() & !15;
        !table_update(clmul::fold_reduce(0xffff_ffff, &data[..whole]), &data[whole..])
    } else {
        !table_update(0xffff_ffff, data)
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod clmul {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_clmulepi64_si128, _mm_cvtsi32_si128, _mm_extract_epi32, _mm_loadu_si128,
        _mm_set_epi64x, _mm_srli_si128, _mm_xor_si128,
    };

    /// x^(128+32) and x^(128-32) mod P, reflected and shifted (Intel's k3, k4).
    const K3: i64 = 0x1_7519_97d0;
    const K4: i64 = 0x0_ccaa_009e;
    /// x^64 mod P (k5).
    const K5: i64 = 0x1_63cd_6124;
    /// P (reflected, 33 bits) and Barrett's μ.
    const POLY: i64 = 0x1_DB71_0641;
    const MU: i64 = 0x1_F701_1641;

    /// Whether the folding can run on this CPU (std caches the CPUID answer).
    #[inline]
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("pclmulqdq") && std::arch::is_x86_feature_detected!("sse4.1")
    }

    /// The raw CRC state after `crc` took in `data` (whole 16-octet blocks, at least one).
    #[inline]
    pub(super) fn fold_reduce(crc: u32, data: &[u8]) -> u32 {
        debug_assert!(data.len() >= 16 && data.len().is_multiple_of(16));
        // SAFETY: `checksum` calls this only when `available()` said PCLMULQDQ and SSE4.1
        // are present; `fold_reduce_x86` reads only within `data` (whole 16-octet blocks,
        // unaligned loads) and returns early on less than one block.
        unsafe { fold_reduce_x86(crc, data) }
    }

    #[target_feature(enable = "pclmulqdq,sse2,sse4.1")]
    unsafe fn fold_reduce_x86(crc: u32, data: &[u8]) -> u32 {
        let mut blocks = data.chunks_exact(16);
        let Some(first) = blocks.next() else {
            return crc;
        };
        // SAFETY: each block is 16 readable octets; `_mm_loadu_si128` has no alignment need.
        let load = |b: &[u8]| unsafe { _mm_loadu_si128(b.as_ptr().cast::<__m128i>()) };
        // The CRC state enters as the first 32 bits of the message (reflected: low bits).
        let mut x = _mm_xor_si128(load(first), _mm_cvtsi32_si128(crc as i32));
        let k = _mm_set_epi64x(K4, K3);
        for block in blocks {
            let lo = _mm_clmulepi64_si128(x, k, 0x00);
            let hi = _mm_clmulepi64_si128(x, k, 0x11);
            x = _mm_xor_si128(_mm_xor_si128(lo, hi), load(block));
        }
        let mask32 = _mm_set_epi64x(0, 0xffff_ffff);
        // 128 -> 64 bits.
        let x = _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x10), _mm_srli_si128(x, 8));
        // 64 -> 32 bits.
        let k5 = _mm_set_epi64x(0, K5);
        let x = _mm_xor_si128(
            _mm_clmulepi64_si128(_mm_and_si128(x, mask32), k5, 0x00),
            _mm_srli_si128(x, 4),
        );
        // Barrett reduction.
        let pu = _mm_set_epi64x(MU, POLY);
        let t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), pu, 0x10);
        let t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), pu, 0x00);
        _mm_extract_epi32(_mm_xor_si128(t, x), 1) as u32
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod clmul {
    pub(super) fn available() -> bool {
        false
    }
    pub(super) fn fold_reduce(crc: u32, _data: &[u8]) -> u32 {
        crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crc_fast::CrcAlgorithm;

    fn reference(data: &[u8]) -> u32 {
        crc_fast::checksum(CrcAlgorithm::Crc32IsoHdlc, data) as u32
    }

    #[test]
    fn check_value() {
        assert_eq!(checksum(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn every_length_and_offset_matches_crc_fast() {
        // Pseudo-random octets (xorshift), every length 0..=600 at offsets 0..16 (alignment).
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..620)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        for off in 0..16 {
            for len in 0..=600 {
                let d = &data[off..off + len];
                assert_eq!(checksum(d), reference(d), "offset {off} length {len}");
            }
        }
    }

    #[test]
    fn table_alone_matches() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        assert_eq!(!table_update(0xffff_ffff, &data), reference(&data));
    }
}
