#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // TODO: filled in by the decoder's owner.
    let _ = data;
});
