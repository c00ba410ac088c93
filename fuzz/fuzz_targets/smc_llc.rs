//! Fuzzes the SMC-R LLC decoder (`smc::wire::llc`): arbitrary SEND payloads never panic;
//! whatever parses re-emits to octets that parse to the same message, and `classify` agrees
//! with `parse` on what is LLC. Requirements A1.8, A2.6 SMC-INV-11.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc::wire::llc::{self, Class, LlcMessage};

fuzz_target!(|data: &[u8]| {
    let r = LlcMessage::parse(data);
    if let Some(&t) = data.first() {
        if r.is_ok() {
            assert_eq!(llc::classify(t), Class::Llc);
        }
    }
    if let Ok(m) = r {
        let w = m.to_vec().expect("a parsed LLC message emits");
        assert_eq!(LlcMessage::parse(&w).expect("and parses again"), m);
    }
});
