//! Fuzzes the Terminate header (`iwarp::wire::terminate`): both wire forms
//! and form detection on arbitrary octets; whatever parses must re-emit to
//! the same octets (reserved bits and zero padding aside) and parse back to
//! the same meaning. Nothing may panic.
#![no_main]
use iwarp::wire::terminate::{Repr, TermWireForm};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for form in [TermWireForm::Rfc, TermWireForm::LinuxSiw] {
        if let Ok(r) = Repr::parse(data, form) {
            let _ = r.to_string();
            if !r.r_without_header {
                let mut buf = vec![0u8; r.buffer_len()];
                assert_eq!(r.emit(&mut buf), Ok(buf.len()));
                assert!(buf.len() <= data.len());
                assert_eq!(&buf[4..], &data[4..buf.len()], "headers re-emit verbatim");
                let back = Repr::parse(&buf, form).expect("emitted Terminate parses");
                assert_eq!(back, Repr { reserved: 0, ..r });
            }
        }
        if let Ok(d) = Repr::parse_auto(data, form) {
            assert_eq!(Repr::parse(data, d.repr.form), Ok(d.repr));
        }
    }
});
