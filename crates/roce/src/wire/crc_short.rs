//! CRC-32/ISO-HDLC (the ICRC's CRC: reflected polynomial 0xEDB88320, initial value and
//! final XOR 0xffffffff) for short inputs, streamed over several slices without copying
//! them together.
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
//! [`ShortCrc`] is only for inputs of a few hundred octets: one fold per 16 octets is
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

/// A CRC-32/ISO-HDLC over slices given in order: `update` any number of times, then
/// `finalize`. The result equals `crc_fast::checksum(CrcAlgorithm::Crc32IsoHdlc, whole)`.
#[derive(Debug, Clone)]
pub struct ShortCrc {
    /// The 128-bit folding accumulator (low, high), valid once `folding`.
    acc: [u64; 2],
    /// Whether the first 16-octet block has been taken into `acc`.
    folding: bool,
    /// The raw CRC state while not folding (initial 0xffffffff).
    crc: u32,
    /// Octets not yet making up a whole block.
    pending: [u8; 16],
    npending: usize,
    /// Whether this CPU has PCLMULQDQ (x86-64 only).
    clmul: bool,
}

impl Default for ShortCrc {
    fn default() -> Self {
        Self::new()
    }
}

impl ShortCrc {
    /// An empty CRC.
    #[inline]
    pub fn new() -> Self {
        Self {
            acc: [0; 2],
            folding: false,
            crc: 0xffff_ffff,
            pending: [0; 16],
            npending: 0,
            clmul: clmul::available(),
        }
    }

    /// Feed `data`.
    #[inline]
    pub fn update(&mut self, mut data: &[u8]) {
        if !self.clmul {
            self.crc = table_update(self.crc, data);
            return;
        }
        if self.npending > 0 {
            let k = (16 - self.npending).min(data.len());
            self.pending[self.npending..self.npending + k].copy_from_slice(&data[..k]);
            self.npending += k;
            data = &data[k..];
            if self.npending < 16 {
                return;
            }
            let block = self.pending;
            self.blocks(&block);
            self.npending = 0;
        }
        let whole = data.len() & !15;
        if whole > 0 {
            self.blocks(&data[..whole]);
        }
        let tail = &data[whole..];
        self.pending[..tail.len()].copy_from_slice(tail);
        self.npending = tail.len();
    }

    /// Fold whole 16-octet blocks (`data.len()` a multiple of 16, at least 16).
    #[inline]
    fn blocks(&mut self, data: &[u8]) {
        debug_assert!(data.len() >= 16 && data.len() % 16 == 0);
        let (first, rest) = if self.folding {
            (None, data)
        } else {
            self.folding = true;
            let mut b = [0u8; 16];
            b.copy_from_slice(&data[..16]);
            let lo = u64::from_le_bytes(b[..8].try_into().unwrap_or_default()) ^ u64::from(self.crc);
            let hi = u64::from_le_bytes(b[8..].try_into().unwrap_or_default());
            (Some([lo, hi]), &data[16..])
        };
        if let Some(acc) = first {
            self.acc = acc;
        }
        self.acc = clmul::fold(self.acc, rest);
    }

    /// The CRC of everything fed.
    #[inline]
    pub fn finalize(self) -> u32 {
        let crc = if self.folding {
            clmul::reduce(self.acc)
        } else {
            self.crc
        };
        !table_update(crc, &self.pending[..self.npending])
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod clmul {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_clmulepi64_si128, _mm_cvtsi128_si64, _mm_extract_epi32, _mm_loadu_si128,
        _mm_set_epi64x, _mm_srli_si128, _mm_unpackhi_epi64, _mm_xor_si128,
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

    /// Fold the whole blocks of `data` into `acc`.
    #[inline]
    pub(super) fn fold(acc: [u64; 2], data: &[u8]) -> [u64; 2] {
        if data.is_empty() {
            return acc;
        }
        // SAFETY: `ShortCrc` calls this only when `available()` said PCLMULQDQ and SSE4.1
        // are present; `fold_x86` reads only within `data` (whole 16-octet blocks, unaligned
        // loads).
        unsafe { fold_x86(acc, data) }
    }

    /// Reduce the accumulator to the raw CRC state.
    #[inline]
    pub(super) fn reduce(acc: [u64; 2]) -> u32 {
        // SAFETY: as for `fold`; no memory is read.
        unsafe { reduce_x86(acc) }
    }

    #[target_feature(enable = "pclmulqdq,sse2,sse4.1")]
    unsafe fn fold_x86(acc: [u64; 2], data: &[u8]) -> [u64; 2] {
        let k = _mm_set_epi64x(K4, K3);
        let mut x = _mm_set_epi64x(acc[1] as i64, acc[0] as i64);
        for block in data.chunks_exact(16) {
            // SAFETY: `block` is 16 readable octets; `_mm_loadu_si128` has no alignment need.
            let b = unsafe { _mm_loadu_si128(block.as_ptr().cast::<__m128i>()) };
            let lo = _mm_clmulepi64_si128(x, k, 0x00);
            let hi = _mm_clmulepi64_si128(x, k, 0x11);
            x = _mm_xor_si128(_mm_xor_si128(lo, hi), b);
        }
        let lo = _mm_cvtsi128_si64(x) as u64;
        let hi = _mm_cvtsi128_si64(_mm_unpackhi_epi64(x, x)) as u64;
        [lo, hi]
    }

    #[target_feature(enable = "pclmulqdq,sse2,sse4.1")]
    unsafe fn reduce_x86(acc: [u64; 2]) -> u32 {
        let x = _mm_set_epi64x(acc[1] as i64, acc[0] as i64);
        let mask32 = _mm_set_epi64x(0, 0xffff_ffff);
        // 128 -> 64 bits.
        let k = _mm_set_epi64x(K4, K3);
        let x = _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x10), _mm_srli_si128(x, 8));
        // 64 -> 32 bits.
        let k5 = _mm_set_epi64x(0, K5);
        let x = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x, mask32), k5, 0x00), _mm_srli_si128(x, 4));
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
    pub(super) fn fold(acc: [u64; 2], _data: &[u8]) -> [u64; 2] {
        acc
    }
    pub(super) fn reduce(_acc: [u64; 2]) -> u32 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crc_fast::{CrcAlgorithm, checksum};

    fn reference(data: &[u8]) -> u32 {
        checksum(CrcAlgorithm::Crc32IsoHdlc, data) as u32
    }

    #[test]
    fn check_value() {
        let mut c = ShortCrc::new();
        c.update(b"123456789");
        assert_eq!(c.finalize(), 0xCBF4_3926);
    }

    #[test]
    fn every_length_and_split_matches_crc_fast() {
        // Pseudo-random octets (xorshift), every length 0..=300, split at several points
        // into two or three slices.
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..300)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        for len in 0..=data.len() {
            let d = &data[..len];
            let want = reference(d);
            for a in [0, 1, 7, 15, 16, 17, 33, 48, 100] {
                for b in [0, 3, 16, 40] {
                    let a = a.min(len);
                    let b = (a + b).min(len);
                    let mut c = ShortCrc::new();
                    c.update(&d[..a]);
                    c.update(&d[a..b]);
                    c.update(&d[b..]);
                    assert_eq!(c.finalize(), want, "len {len} split {a} {b}");
                }
            }
        }
    }

    #[test]
    fn table_alone_matches() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        let mut c = ShortCrc::new();
        c.clmul = false;
        c.update(&data[..77]);
        c.update(&data[77..]);
        assert_eq!(c.finalize(), reference(&data));
    }
}
