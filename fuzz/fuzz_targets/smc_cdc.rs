//! Fuzzes the SMC-R CDC decoder (`smc::wire::cdc`) and the RMBE cursor checks: parse must
//! never panic; whatever parses emits 44 octets that parse back to the same value and equal
//! the input with its reserved octets and bits cleared. The cursors it carries are then run
//! through the range check and position arithmetic of an element whose length and mode come
//! from the input.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc::wire::cdc::{Cdc, CDC_LEN};
use smc::wire::cursor::{EyecatcherMode, Rmbe};

fuzz_target!(|data: &[u8]| {
    let Ok(c) = Cdc::parse(data) else {
        return;
    };
    let out = c.to_bytes();
    assert_eq!(Cdc::parse(&out), Ok(c));
    let mut want = [0u8; CDC_LEN];
    want.copy_from_slice(&data[..CDC_LEN]);
    want[8..10].fill(0);
    want[16..18].fill(0);
    want[24] &= 0xF8;
    want[25] &= 0xE0;
    want[26..].fill(0);
    assert_eq!(out, want);
    if let Some(tail) = data.get(CDC_LEN..CDC_LEN + 4) {
        let len = u32::from_be_bytes([tail[0], tail[1], tail[2], tail[3]]);
        let mode = if len & 1 == 0 { EyecatcherMode::None } else { EyecatcherMode::Rfc };
        if let Ok(e) = Rmbe::new(len % (1 << 21), mode) {
            let ok = e.check(c.prod).is_ok() && e.check(c.cons).is_ok();
            let d = e.distance(c.prod, c.cons);
            assert!(d < e.modulus());
            if ok {
                assert_eq!(e.advance(c.cons, d), c.prod);
                if let Some(free) = e.free(c.prod, c.cons) {
                    assert_eq!(u64::from(free) + d, u64::from(e.capacity()));
                }
            }
            let _ = e.spans(c.prod, u32::MAX);
        }
    }
});
