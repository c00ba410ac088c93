//! Fuzzes the RDMAP layer (`iwarp::wire::rdmap`): arbitrary ULPDUs through
//! DDP + RDMAP parsing, the pretty-printer, the Terminate an error calls
//! for, and emit/parse round trips of whatever parses. Nothing may panic.
#![no_main]
use iwarp::wire::rdmap::{self, Config, Message, Pretty};
use iwarp::wire::terminate::{Repr, TermWireForm};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, ulpdu)) = data.split_first() else {
        return;
    };
    let cfg = Config {
        immediate_data: sel & 1 != 0,
        atomics: sel & 2 != 0,
        terminate_form: if sel & 4 != 0 {
            TermWireForm::LinuxSiw
        } else {
            TermWireForm::Rfc
        },
    };
    let _ = Pretty { ulpdu, cfg }.to_string();
    match rdmap::parse_ulpdu(ulpdu, &cfg) {
        Ok((seg, msg)) => {
            let _ = msg.to_string();
            assert_eq!(msg.opcode().control() & 0xcf, seg.header.rdmap_ctrl & 0xcf);
            // Single-segment messages re-emit to a message that parses the same.
            if seg.header.last {
                let msn = match seg.header.addr {
                    iwarp::wire::ddp::Addr::Untagged { msn, .. } => msn,
                    iwarp::wire::ddp::Addr::Tagged { .. } => 0,
                };
                let mut buf = vec![0u8; msg.buffer_len()];
                assert_eq!(msg.emit(&mut buf, msn), Ok(buf.len()));
                match msg {
                    // Detection may read a re-emitted Terminate (reserved bits
                    // now zero) differently; check it in its own form.
                    Message::Terminate(a) => {
                        let b = Repr::parse(&buf[18..], a.form).expect("emitted Terminate parses");
                        assert_eq!(
                            b,
                            Repr {
                                reserved: 0,
                                r_without_header: false,
                                ..a
                            }
                        );
                    }
                    _ => {
                        let (_, again) = rdmap::parse_ulpdu(&buf, &cfg).expect("emitted message parses");
                        assert_eq!(again, msg);
                    }
                }
            }
        }
        Err(e) => {
            let t = e.terminate(ulpdu);
            let mut buf = vec![0u8; t.ulpdu_len()];
            assert_eq!(t.emit_ulpdu(&mut buf, 1), Ok(buf.len()));
            let _ = e.to_string();
        }
    }
});
