//! The SMC-R TCP experimental option (RFC 7609 §3.1, A.1; kind 254, magic 0xE2D4C3D9).
//!
//! On the wire (requirements A1.2): kind 254 (RFC 6994 shared experimental), length 6, then
//! the 4-octet ExID `E2 D4 C3 D9` ("SMCR" in EBCDIC). Linux reserves 8 option octets and
//! sends it as `01 01 FE 06 E2 D4 C3 D9` (two NOPs first); the lab capture
//! `smc-r-2vm-612-br0.pcap` shows exactly that at the end of the SYN and SYN-ACK option
//! lists of two Linux 6.12 peers (golden test in `tests/wire_golden.rs`).
//!
//! Receiving (SMC-OPT-5): [`find`] walks a TCP option list and reports whether the option is
//! present anywhere in it, with or without NOP padding, next to MSS/WS/SACK/TS. An option of
//! kind 254 with a wrong length or a different ExID, or kind 253 with the SMC ExID (not
//! defined by RFC 7609), counts as "no option". A malformed option list (a length octet of
//! 0 or 1, or one running past the end) ends the walk: whatever was found before counts,
//! nothing after it. Never panics.

/// TCP option kind of the shared experimental option (RFC 6994).
pub const KIND: u8 = 254;
/// The option's length octet (kind + length + 4-octet ExID).
pub const LEN: usize = 6;
/// The option aligned to 4 octets with two leading NOPs, as Linux sends it.
pub const ALIGNED_LEN: usize = 8;
/// The ExID: "SMCR" in EBCDIC (code page IBM-1047), registered with IANA.
pub const EXID: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xD9];

/// TCP option kind "end of option list".
const EOL: u8 = 0;
/// TCP option kind "no operation".
const NOP: u8 = 1;

/// The 6 option octets.
pub const OPTION: [u8; LEN] = [KIND, LEN as u8, EXID[0], EXID[1], EXID[2], EXID[3]];

/// Writes the 6-octet option at the start of `buf`; returns the octets written, or `None`
/// when `buf` is shorter than [`LEN`].
pub fn emit(buf: &mut [u8]) -> Option<usize> {
    buf.get_mut(..LEN)?.copy_from_slice(&OPTION);
    Some(LEN)
}

/// Writes the option in Linux's aligned form `01 01 FE 06 E2 D4 C3 D9`; returns the octets
/// written (8), or `None` when `buf` is shorter than [`ALIGNED_LEN`].
pub fn emit_aligned(buf: &mut [u8]) -> Option<usize> {
    let out = buf.get_mut(..ALIGNED_LEN)?;
    out[0] = NOP;
    out[1] = NOP;
    out[2..].copy_from_slice(&OPTION);
    Some(ALIGNED_LEN)
}

/// Whether the SMC-R option is in the TCP option list `options` (the octets after the
/// 20-octet fixed TCP header, up to the data offset). See the module doc for the rules.
pub fn find(options: &[u8]) -> bool {
    let mut i = 0;
    while i < options.len() {
        match options[i] {
            EOL => return false,
            NOP => i += 1,
            kind => {
                let Some(&len) = options.get(i + 1) else { return false };
                let len = usize::from(len);
                if len < 2 || i + len > options.len() {
                    return false;
                }
                if kind == KIND && len == LEN && options[i + 2..i + 6] == EXID {
                    return true;
                }
                i += len;
            }
        }
    }
    false
}

/// Whether the SMC-R option is in the options of the TCP header at the start of `tcp`
/// (fixed header plus options, as the data offset says). A header too short for its own
/// data offset counts as "no option".
pub fn find_in_tcp_header(tcp: &[u8]) -> bool {
    let Some(&off) = tcp.get(12) else { return false };
    let hlen = usize::from(off >> 4) * 4;
    if hlen < 20 {
        return false;
    }
    tcp.get(20..hlen).is_some_and(find)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_forms_smc_opt_1() {
        let mut b = [0u8; 8];
        assert_eq!(emit(&mut b), Some(6));
        assert_eq!(&b[..6], &[0xFE, 0x06, 0xE2, 0xD4, 0xC3, 0xD9]);
        assert_eq!(emit_aligned(&mut b), Some(8));
        assert_eq!(b, [0x01, 0x01, 0xFE, 0x06, 0xE2, 0xD4, 0xC3, 0xD9]);
        assert_eq!(emit(&mut b[..5]), None);
        assert_eq!(emit_aligned(&mut b[..7]), None);
    }

    #[test]
    fn found_anywhere_smc_opt_5() {
        // MSS, SACK_PERM, TS, NOP, WS, NOP NOP + option (Linux SYN from the lab capture).
        let syn = hex::decode("020405b40402080ad4c05bb500000000010303070101fe06e2d4c3d9").unwrap();
        assert!(find(&syn));
        // Option first, unpadded, followed by MSS.
        assert!(find(&[0xFE, 6, 0xE2, 0xD4, 0xC3, 0xD9, 2, 4, 5, 0xb4]));
        // Wrong length, wrong ExID, kind 253: no option.
        assert!(!find(&[0xFE, 8, 0xE2, 0xD4, 0xC3, 0xD9, 0, 0]));
        assert!(!find(&[0xFE, 6, 0xE2, 0xD4, 0xC3, 0xC4]));
        assert!(!find(&[0xFD, 6, 0xE2, 0xD4, 0xC3, 0xD9]));
        // After EOL: ignored. Malformed length: walk ends.
        assert!(!find(&[0, 0xFE, 6, 0xE2, 0xD4, 0xC3, 0xD9]));
        assert!(!find(&[2, 0, 0xFE, 6, 0xE2, 0xD4, 0xC3, 0xD9]));
        assert!(!find(&[2, 40, 0xFE, 6, 0xE2, 0xD4, 0xC3, 0xD9]));
        assert!(!find(&[0xFE, 6, 0xE2, 0xD4, 0xC3]));
        assert!(!find(&[]));
    }

    #[test]
    fn tcp_header_walk_smc_opt_5() {
        let mut h = vec![0u8; 28];
        h[12] = 7 << 4;
        h[20..28].copy_from_slice(&[1, 1, 0xFE, 6, 0xE2, 0xD4, 0xC3, 0xD9]);
        assert!(find_in_tcp_header(&h));
        h[12] = 5 << 4;
        assert!(!find_in_tcp_header(&h));
        h[12] = 8 << 4; // claims 32 octets, 28 present
        assert!(!find_in_tcp_header(&h));
        assert!(!find_in_tcp_header(&h[..10]));
    }

    proptest::proptest! {
        /// Any option list never panics; inserting the aligned option after a well-formed
        /// list of other options is always found.
        #[test]
        fn random_lists_smc_opt_5(junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
                                  mss in proptest::prelude::any::<u16>()) {
            let _ = find(&junk);
            let mut l = vec![2, 4];
            l.extend_from_slice(&mss.to_be_bytes());
            l.extend_from_slice(&[1, 3, 3, 7]);
            let mut opt = [0u8; 8];
            emit_aligned(&mut opt).unwrap();
            l.extend_from_slice(&opt);
            proptest::prop_assert!(find(&l));
        }
    }
}
