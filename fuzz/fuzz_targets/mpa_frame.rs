//! Fuzzes the MPA startup: the Request/Reply parser and pretty-printer
//! (`iwarp::wire::mpa`) and the negotiation state machine
//! (`iwarp::proto::mpa`) fed arbitrary peer octets in arbitrary pieces, in
//! both roles. Nothing here may panic; consumed counts must stay in range.
#![no_main]
use std::time::{Duration, Instant};

use iwarp::proto::mpa::{Event, IrdOrd, Mpa, MpaConfig};
use iwarp::wire::mpa::{self, Frame, Repr, RtrSet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Parser: any bytes, any receive limit.
    let limit = data.first().map_or(512, |b| usize::from(*b) * 4);
    if let Ok(r) = Repr::parse(&Frame::new_unchecked(data), limit) {
        let mut v = Vec::new();
        if r.emit_vec(&mut v).is_ok() {
            // What parses re-emits to the same octets, reserved bits included.
            assert_eq!(&v[..], &data[..r.buffer_len()]);
        }
        let _ = r.to_string();
    }
    let _ = mpa::pretty(data);

    // State machine: byte 0 selects role and policy, byte 1 the IRD/ORD,
    // byte 2 the chunk size; the rest is what the peer sends.
    if data.len() < 3 {
        return;
    }
    let sel = data[0];
    let cfg = MpaConfig {
        crc: sel & 0x02 != 0,
        reject_markers: sel & 0x04 != 0,
        relaxed_ird: sel & 0x08 != 0,
        p2p: sel & 0x10 != 0,
        rtr_offer: RtrSet::ALL,
        required_ord: u16::from(sel >> 6),
        max_private_data_rx: if sel & 0x20 != 0 {
            mpa::SIW_MAX_PRIVATE_DATA
        } else {
            mpa::MAX_PRIVATE_DATA
        },
        ..MpaConfig::default()
    };
    let local = IrdOrd {
        ird: u16::from(data[1] & 0x0F),
        ord: u16::from(data[1] >> 4),
    };
    let chunk = usize::from(data[2]).max(1);
    let peer = &data[3..];
    let now = Instant::now();
    let mut m = if sel & 0x01 != 0 {
        Mpa::responder(now, cfg).unwrap()
    } else {
        Mpa::initiator(now, cfg, local, b"fuzz").unwrap()
    };
    let mut out = Vec::new();
    let _ = m.poll_transmit(&mut out);
    let mut rest = peer;
    while !rest.is_empty() {
        let piece = &rest[..chunk.min(rest.len())];
        match m.handle_bytes(now, piece) {
            Ok(n) => {
                assert!(n <= piece.len());
                if n < piece.len() {
                    // The frame ended inside this piece; the rest is FPDU data.
                    assert_eq!(m.handle_bytes(now, &piece[n..]), Ok(0));
                    break;
                }
            }
            Err(_) => break,
        }
        rest = &rest[piece.len()..];
    }
    while let Some(ev) = m.poll_event() {
        if let Event::ConnectRequest(_) = ev {
            if sel & 0x80 != 0 {
                let _ = m.reject(b"no");
            } else {
                let _ = m.accept(local, b"ok");
            }
        }
    }
    let _ = m.terminate_to_send();
    let _ = m.handle_timeout(now + Duration::from_secs(30));
    out.clear();
    if let Some(n) = m.poll_transmit(&mut out) {
        assert!(n <= mpa::MAX_FRAME_LEN);
    }
});
