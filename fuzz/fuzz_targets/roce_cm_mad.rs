//! Fuzzes the IB CM MAD decoder the RoCE CM runs on every datagram QP1 receives:
//! `roce::cm::mad::Mad::parse` on arbitrary octets (with the first four octets forced to a
//! CM header when byte 0 is odd, so the message decoders are reached), the rdma_cm header
//! decoder on the REQ's private data, and emit → parse of whatever parsed (it must emit and
//! parse back to the same message).
#![no_main]
use libfuzzer_sys::fuzz_target;
use roce::cm::cma::CmaHdr;
use roce::cm::mad::{CmMsg, MAD_LEN, Mad};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let mut buf = rest.to_vec();
    if sel & 1 == 1 && buf.len() >= 18 {
        buf[..4].copy_from_slice(&[1, 7, 2, 3]);
        buf[16] = 0;
        buf[17] = 0x10 + (sel >> 1) % 10;
        if sel & 2 != 0 {
            buf.resize(MAD_LEN, 0);
        }
    }
    let Ok(mad) = Mad::parse(&buf) else { return };
    if let CmMsg::Req(req) = &mad.msg
        && let Ok(h) = CmaHdr::parse(&req.private_data)
    {
        let again = CmaHdr::parse(&h.emit().expect("a parsed header emits")).expect("re-parse");
        assert_eq!(again, h);
    }
    let bytes = mad.emit().expect("a parsed MAD emits");
    assert_eq!(Mad::parse(&bytes).expect("an emitted MAD parses"), mad);
});
