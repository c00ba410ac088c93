//! Fuzzes the DDP layer the engine runs. First the segment parser
//! (`iwarp::wire::ddp::Segment::parse`, which `engine/qp/rx.rs`
//! `Proto::dispatch` calls on every ULPDU) on the whole input; then the input
//! as a stream of ULPDUs, framed as FPDUs, through the QP protocol core
//! itself (`engine::qp::harness`: the receive buffer of `rx_buf.rs`, direct
//! placement included, then `Proto::on_ulpdu` and the untagged sequencing,
//! buffer, tagged and Read Response checks of `rx.rs`: `on_send`,
//! `check_single`, `write_target`, `read_response_target`). Small STags and
//! TOs are mapped onto the core's regions so that placement is reached.
//! Nothing may panic; the core sends at most one Terminate, nothing after
//! it, and is in ERR once it did (RDMAP-TRM-02, RDMAP-TRM-06).
#![no_main]
use iwarp::engine::qp::harness::{Scripted, SideConfig, check_output};
use iwarp::wire::ddp::{Header, Segment};
use iwarp::wire::fpdu::Framer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Parser on the whole input, plus its pretty-printer.
    if let Ok(seg) = Segment::parse(data) {
        let mut buf = vec![0u8; seg.buffer_len()];
        assert_eq!(seg.emit(&mut buf), Ok(data.len()));
        assert_eq!(Segment::parse(&buf), Ok(seg));
        let _ = seg.to_string();
    }
    let _ = Header::parse_lenient(data);

    // The core: byte 0 picks IRD, the receives posted and how the stream is
    // cut into reads; then ULPDUs, each prefixed by a 16-bit length.
    let Some((&sel, mut rest)) = data.split_first() else {
        return;
    };
    let cfg = SideConfig {
        ird: u32::from(sel & 3),
        ..SideConfig::default()
    };
    let mut s = Scripted::new(cfg, usize::from(sel >> 2 & 7));
    s.side.set_chunk([usize::MAX, 1, 1000, 5000][usize::from(sel >> 5 & 3)]);
    let mut framer = Framer::new(false, false);
    let mut stream = Vec::new();
    while let [a, b, tail @ ..] = rest {
        let n = usize::from(u16::from_be_bytes([*a, *b])).min(tail.len());
        let mut u = tail[..n].to_vec();
        rest = &tail[n..];
        s.patch(&mut u);
        let _ = framer.emit_vec(&u, &mut stream);
    }
    s.side.feed(&stream);
    let out = s.side.take_output();
    if let Err(e) = check_output(&s.side, &out) {
        panic!("{e}");
    }
    while s.side.poll_cq().is_some() {}
    while s.side.next_event().is_some() {}
});
