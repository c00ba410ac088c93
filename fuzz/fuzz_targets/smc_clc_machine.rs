//! Fuzzes the CLC handshake machine (`smc::clc_machine::ClcMachine`): a client and a server
//! back to back, driven by a script: deliver the pending output of either side in arbitrary
//! chunks, inject arbitrary octets, corrupt one octet of a pending message, make each side's
//! decision (accept / confirm / decline with arbitrary values, point of no return), time out.
//! Checks: nothing panics; every message a machine writes is a valid CLC message; a machine
//! that fell back or reset stays so; a side never writes two CLC messages while its peer's
//! answer is outstanding beyond what the protocol allows (output is at most one message per
//! decision). Requirements A2.2.
#![no_main]
use std::net::{Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use smc::clc_machine::{ClcMachine, LinkParams, LocalCaps, Outcome};
use smc::wire::clc::{self, ClcMessage, Diagnosis, PeerId};

fn caps(last: u8, sel: u8) -> LocalCaps {
    let mut eid = [b' '; 32];
    eid[..4].copy_from_slice(if sel & 4 != 0 { b"EIDA" } else { b"EIDB" });
    LocalCaps {
        enabled: sel & 8 == 0,
        v1: sel & 1 != 0,
        v2: sel & 2 != 0,
        peer_id: PeerId::new(u16::from(last), [2, 0, 0, 0, 0, last]),
        gid: [last; 16],
        mac: [2, 0, 0, 0, 0, last],
        // Bit 4: an IPv6 TCP connection (SMC-R v1 over IPv6: the Proposal's /64 prefix),
        // in one of two prefixes so that both the match and the mismatch are reached.
        ipv4: (sel & 16 == 0).then(|| (Ipv4Addr::new(10, 0, sel >> 6, last), 24)),
        ipv6: (sel & 16 != 0).then(|| {
            (
                Ipv6Addr::new(0xfd15, 0x151, 8, u16::from(sel >> 7), 0, 0, 0, u16::from(last)),
                64,
            )
        }),
        eids: vec![eid],
        hostname: [b'h'; 32],
        max_conns: 255,
        max_links: 2,
    }
}

fn check_output(out: &[u8]) {
    let mut rest = out;
    while !rest.is_empty() {
        let n = clc::frame_len(rest).expect("own output frames").expect("whole message");
        ClcMessage::parse(&rest[..n]).expect("own output parses");
        rest = &rest[n..];
    }
}

fuzz_target!(|data: &[u8]| {
    let [a, b, c, ops @ ..] = data else { return };
    let mut m = [
        ClcMachine::client(caps(1, *a), *c & 1 != 0),
        ClcMachine::server(caps(2, *b), *c & 2 != 0),
    ];
    let mut pending: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut it = ops.chunks(3);
    while let Some(op) = it.next() {
        let &[k, x, y] = op else { break };
        let side = usize::from(k & 1);
        let o = m[side].take_output();
        check_output(&o);
        pending[side].extend_from_slice(&o);
        let before_final = matches!(m[side].outcome(), Outcome::Fallback(_) | Outcome::Reset(_));
        match k >> 1 & 7 {
            0 | 1 => {
                let n = usize::from(x).min(pending[side].len());
                let chunk: Vec<u8> = pending[side].drain(..n).collect();
                m[1 - side].on_bytes(&chunk);
            }
            2 => {
                let n = usize::from(x % 64);
                let junk: Vec<u8> = it.by_ref().take(n).flatten().copied().collect();
                m[side].on_bytes(&junk);
            }
            3 => {
                if !pending[side].is_empty() {
                    let i = usize::from(x) % pending[side].len();
                    pending[side][i] ^= y | 1;
                }
            }
            4 => {
                let p = LinkParams {
                    qpn: u32::from(x) << 8 | u32::from(y),
                    rmb_rkey: u32::from(y),
                    rmbe_idx: x,
                    alert_token: u32::from(x),
                    rmbe_size: y % 8,
                    qp_mtu: x % 8,
                    rmb_vaddr: u64::from(y) << 12,
                    psn: u32::from(y),
                };
                let _ = if side == 0 {
                    m[0].confirm(&p)
                } else {
                    m[1].accept(&p, x & 1 != 0)
                };
            }
            5 => {
                let _ = m[side].decline(Diagnosis(u32::from(x) << 16), y & 1 != 0);
            }
            6 => m[side].point_of_no_return(),
            _ => {
                m[side].on_timeout();
            }
        }
        if before_final {
            assert!(matches!(m[side].outcome(), Outcome::Fallback(_) | Outcome::Reset(_)));
        }
        let _ = m[side].take_app_data();
    }
    for s in &mut m {
        check_output(&s.take_output());
    }
});
