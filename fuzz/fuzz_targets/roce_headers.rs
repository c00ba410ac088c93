//! Fuzzes every RoCEv2 transport header decoder (`roce::wire::headers`): BTH, DETH, RETH,
//! AtomicETH, AETH, AtomicAckETH, ImmDt, IETH. The selector octet picks the header; parse
//! must never panic, and whatever parses emits the very octets it was parsed from and parses
//! back to the same value. The last arm runs the PSN arithmetic on two arbitrary PSNs.
#![no_main]
use libfuzzer_sys::fuzz_target;
use roce::wire::headers::{Aeth, AtomicAckEth, AtomicEth, Bth, Deth, Ieth, ImmDt, Reth};
use roce::wire::Psn;

macro_rules! round_trip {
    ($ty:ty, $b:expr) => {
        if let Ok((h, rest)) = <$ty>::parse($b) {
            assert_eq!(rest.len(), $b.len() - <$ty>::LEN);
            let mut out = [0u8; <$ty>::LEN];
            assert_eq!(h.emit(&mut out), Ok(<$ty>::LEN));
            assert_eq!(&out[..], &$b[..<$ty>::LEN]);
            let (again, _) = <$ty>::parse(&out).expect("emitted header parses");
            assert_eq!(again, h);
            let _ = format!("{h:?}");
        }
    };
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, b)) = data.split_first() else {
        return;
    };
    match sel % 9 {
        0 => round_trip!(Bth, b),
        1 => round_trip!(Deth, b),
        2 => round_trip!(Reth, b),
        3 => round_trip!(AtomicEth, b),
        4 => {
            round_trip!(Aeth, b);
            if let Ok((a, _)) = Aeth::parse(b) {
                let _ = a.syndrome.to_string();
            }
        }
        5 => round_trip!(AtomicAckEth, b),
        6 => round_trip!(ImmDt, b),
        7 => round_trip!(Ieth, b),
        _ => {
            if b.len() >= 8 {
                let x = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                let y = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
                let (p, q) = (Psn::new(x), Psn::new(y));
                let d = p.distance(q);
                assert!((-(1 << 23)..(1 << 23)).contains(&d));
                assert_eq!(q.add(d as u32), p);
                let _ = p.classify(q);
                let _ = p.in_window(q, y >> 8);
            }
        }
    }
});
