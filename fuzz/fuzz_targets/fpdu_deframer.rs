//! Fuzzes the MPA FPDU deframer (`iwarp::wire::fpdu`): arbitrary octets
//! with arbitrary CRC/marker settings and split points through both the
//! streaming and the buffered API, and a framer -> deframer round trip of
//! arbitrary ULPDUs that must reproduce them exactly. (CRC checks are off
//! under cfg(fuzzing), as in smoltcp.) Last, the lean one-segment framer
//! (`Framer::emit_segment`, issue 18) against the general `Framer::emit` of
//! the same DDP header, RDMAP header and payload: the same octets, the same
//! stream position, or the same refusal.
#![no_main]
use iwarp::wire::ddp::{Addr, Header};
use iwarp::wire::fpdu::{Deframer, DeframerConfig, Framer, mulpdu};
use libfuzzer_sys::fuzz_target;

fn cuts(seed: &[u8], len: usize) -> Vec<usize> {
    let mut c: Vec<usize> = seed
        .chunks(2)
        .map(|p| usize::from(p[0]) << 8 | usize::from(*p.get(1).unwrap_or(&0)))
        .collect();
    c.retain(|x| *x <= len);
    c.sort_unstable();
    c.push(len);
    c
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let sel = data[0];
    let max = u16::from_be_bytes([data[1], data[2]]);
    let cfg = DeframerConfig {
        crc: sel & 1 != 0,
        markers: sel & 2 != 0,
        max_ulpdu_len: max,
    };
    let cut_seed = &data[3..8];
    let body = &data[8..];
    let bounds = cuts(cut_seed, body.len());

    // 1. Garbage through the streaming API.
    let mut d = Deframer::new(cfg);
    let mut last = 0;
    'outer: for &b in &bounds {
        let mut piece = &body[last..b];
        last = b;
        loop {
            match d.step(piece) {
                Ok((n, ev)) => {
                    assert!(n <= piece.len());
                    piece = &piece[n..];
                    if ev.is_none() {
                        assert!(piece.is_empty());
                        break;
                    }
                }
                Err(e) => {
                    assert_eq!(d.step(piece), Err(e));
                    break 'outer;
                }
            }
        }
    }

    // 2. Garbage through the buffered API; its buffer stays bounded.
    let mut d = Deframer::new(cfg);
    let mut last = 0;
    'outer2: for &b in &bounds {
        let mut piece = &body[last..b];
        last = b;
        loop {
            match d.next_fpdu(piece) {
                Ok((n, u)) => {
                    if let Some(u) = u {
                        assert!(u.len() <= usize::from(max));
                    }
                    piece = &piece[n..];
                    if u.is_none() {
                        break;
                    }
                }
                Err(_) => break 'outer2,
            }
        }
    }
    assert!(d.buffer_capacity() <= usize::from(max));

    // 3. Round trip: body split into ULPDUs (lengths from the selector
    //    byte), framed, then deframed at the fuzzed split points.
    let crc = sel & 4 != 0;
    let markers = sel & 8 != 0;
    let step = usize::from(sel >> 4) * 97 + 1;
    let limit = if markers { mulpdu(65535, true) } else { 65535 };
    let ulpdus: Vec<&[u8]> = body.chunks(step.min(limit)).collect();
    let mut framer = Framer::new(crc, markers);
    let mut stream = Vec::new();
    for u in &ulpdus {
        framer.emit_vec(u, &mut stream).unwrap();
    }
    let bounds = cuts(cut_seed, stream.len());
    let mut d = Deframer::new(DeframerConfig {
        crc,
        markers,
        max_ulpdu_len: u16::MAX,
    });
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut last = 0;
    for &b in &bounds {
        let mut piece = &stream[last..b];
        last = b;
        loop {
            let (n, u) = d.next_fpdu(piece).unwrap();
            piece = &piece[n..];
            match u {
                Some(u) => got.push(u.to_vec()),
                None => break,
            }
        }
    }
    assert_eq!(got.len(), ulpdus.len());
    for (g, u) in got.iter().zip(&ulpdus) {
        assert_eq!(&g[..], *u);
    }
    assert!(d.at_boundary());

    // 4. The lean framer against the general one: header fields from the cut
    //    seed, the RDMAP header and payload split from the body.
    let w = |i: usize| u32::from_be_bytes([data[i % 8], data[(i + 1) % 8], data[(i + 2) % 8], data[(i + 3) % 8]]);
    let h = Header {
        last: sel & 0x10 != 0,
        rdmap_ctrl: data[3],
        addr: if sel & 0x20 != 0 {
            Addr::Tagged {
                stag: w(1),
                to: u64::from(w(3)) << 32 | u64::from(w(5)),
            }
        } else {
            Addr::Untagged {
                qn: w(2),
                msn: w(4),
                mo: w(6),
                inv_stag: w(7),
            }
        },
    };
    let split = (usize::from(data[4]) % 29).min(body.len());
    let (rh, payload) = body.split_at(split);
    let dl = h.header_len();
    let ulpdu_len = dl + rh.len() + payload.len();
    let mut general = Framer::new(crc, markers);
    let mut lean = general.clone();
    let mut g = vec![0u8; general.wire_len(ulpdu_len).map_or(0, |n| n)];
    let gr = general.emit(ulpdu_len, &mut g, |u| {
        h.emit(u).unwrap();
        u[dl..dl + rh.len()].copy_from_slice(rh);
        u[dl + rh.len()..].copy_from_slice(payload);
    });
    let mut l = vec![0u8; g.len() + usize::from(data[5] & 3)];
    let lr = lean.emit_segment(&h, rh, payload.len(), &mut l, |p| p.copy_from_slice(payload));
    match lr {
        Ok(n) => {
            assert_eq!(Ok(n), gr);
            assert_eq!(&l[..n], &g[..]);
        }
        // Markers are the general framer's alone; too long fails both ways.
        Err(_) => assert!(markers || gr.is_err()),
    }
    if lr.is_ok() || !markers {
        assert_eq!(lean.stream_pos(), if lr.is_ok() { general.stream_pos() } else { 0 });
    }
});
