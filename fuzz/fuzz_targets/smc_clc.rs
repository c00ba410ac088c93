//! Fuzzes the SMC-R CLC decoder (`smc::wire::clc`): arbitrary octets never panic in
//! `frame_len` or `ClcMessage::parse`; whatever parses re-emits, and the re-emitted octets
//! parse to the same message (parse -> emit -> parse stable; reserved octets and unknown
//! areas may differ from the input, the value may not). Requirements A2.2 SMC-CLC-1/2.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc::wire::clc::{self, ClcMessage};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(n)) = clc::frame_len(data) {
        assert!(n <= clc::MAX_LEN);
    }
    if let Ok(m) = ClcMessage::parse(data) {
        // Declines longer than 44 octets (v2) parse; what we emit is canonical.
        let w = m.to_vec().expect("a parsed CLC message emits");
        assert_eq!(ClcMessage::parse(&w).expect("and parses again"), m);
    }
});
