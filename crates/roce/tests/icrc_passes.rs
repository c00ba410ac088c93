//! Issue 13, "64 B Writes ≥ 1 M msg/s on one QP", guarded by counting: every RoCEv2 packet's
//! ICRC (C3 "4-byte ICRC trailer" in ../shared/requirements/smcr-ipoibcm.md; IBA annex A17
//! §A17.3.3) is computed in exactly one pass, and a small packet (a 64 B Write covers 128
//! octets, an ACK 52) takes the short path: one call of the PCLMULQDQ fold from a stack copy
//! (`wire::crc_short`), not `crc_fast`, whose per-call cost was larger than the CRC itself at
//! this size (callgrind, docs/performance.md "Session 14: RoCE 64 B Writes"). A 4 KiB packet
//! stays on `crc_fast` (its AVX-512 folding is the fast one there). The counts are per
//! thread and decided by the code path alone: no timing, no other thread involved.

use roce::wire::icrc::{self, IcrcPasses};

const SRC: [u8; 4] = [127, 0, 95, 21];
const DST: [u8; 4] = [127, 0, 95, 22];

fn packet(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[1])
        .collect()
}

fn delta(before: IcrcPasses) -> (u64, u64) {
    let now = icrc::passes_on_this_thread();
    (now.short - before.short, now.long - before.long)
}

fn headers(len: usize) -> ([u8; 20], [u8; 8]) {
    (icrc::ipv4_header(SRC, DST, 0, len), icrc::udp_header(49152, 4791, len))
}

#[test]
fn a_64_byte_write_is_one_short_pass_each_way_c3() {
    // BTH + RETH + 64 B + ICRC, as the requester emits a WRITE_ONLY.
    let mut p = packet(12 + 16 + 64 + 4);
    let (ip, udp) = headers(p.len());
    let b = icrc::passes_on_this_thread();
    icrc::seal(&ip, &udp, &mut p).unwrap();
    assert_eq!(delta(b), (1, 0), "sender: one short pass");

    let b = icrc::passes_on_this_thread();
    icrc::verify(&ip, &udp, &p).unwrap();
    assert_eq!(delta(b), (1, 0), "receiver: one short pass");

    // The engine's way: headers in one slice, the payload from registered memory in two
    // chunks (two SGEs), no pad; the same ICRC in one pass.
    let b = icrc::passes_on_this_thread();
    let (hdr, rest) = p.split_at(28);
    let payload = &rest[..64];
    let parts = icrc::compute_parts(
        &ip,
        &udp,
        hdr,
        64,
        |f| {
            f(&payload[..40]);
            f(&payload[40..]);
        },
        0,
    )
    .unwrap();
    assert_eq!(delta(b), (1, 0));
    assert_eq!(Some(parts), icrc::stored(&p));

    // A flipped payload bit is caught (and still one pass).
    p[40] ^= 0x10;
    let b = icrc::passes_on_this_thread();
    assert!(matches!(
        icrc::verify(&ip, &udp, &p),
        Err(icrc::IcrcError::Mismatch { .. })
    ));
    assert_eq!(delta(b), (1, 0));
}

#[test]
fn an_ack_is_one_short_pass_and_4_kib_one_long_pass_c3() {
    // BTH + AETH + ICRC.
    let mut ack = packet(12 + 4 + 4);
    let (ip, udp) = headers(ack.len());
    let b = icrc::passes_on_this_thread();
    icrc::seal(&ip, &udp, &mut ack).unwrap();
    icrc::verify(&ip, &udp, &ack).unwrap();
    assert_eq!(delta(b), (2, 0));

    // A 4 KiB MIDDLE packet: crc_fast, one pass each way.
    let mut big = packet(12 + 4096 + 4);
    let (ip, udp) = headers(big.len());
    let b = icrc::passes_on_this_thread();
    icrc::seal(&ip, &udp, &mut big).unwrap();
    icrc::verify(&ip, &udp, &big).unwrap();
    assert_eq!(delta(b), (0, 2));
}
