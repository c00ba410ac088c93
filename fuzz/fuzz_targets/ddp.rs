//! Fuzzes the DDP layer: the segment parser (`iwarp::wire::ddp`) on
//! arbitrary octets, and the receive-side state (`iwarp::proto::ddp_rx`)
//! driven by a stream of arbitrary segments against a scripted engine.
//! Nothing here may panic; placements must stay inside the buffers and
//! regions the engine handed out.
#![no_main]
use iwarp::proto::ddp_rx::{DdpRx, Delivered, Placement, RxResources, TaggedRegion, UntaggedBuf};
use iwarp::wire::cause::{self, TermCause};
use iwarp::wire::ddp::{Header, Segment};
use iwarp::wire::rdmap::{self, Config, Queue};
use libfuzzer_sys::fuzz_target;

/// Answers driven by fuzz input: `script` octets pick buffer sizes, region
/// bounds and refusals.
struct Engine<'a> {
    script: &'a [u8],
    at: usize,
    consumed: [u32; 4],
}

impl Engine<'_> {
    fn byte(&mut self) -> u8 {
        let b = self
            .script
            .get(self.at % self.script.len().max(1))
            .copied()
            .unwrap_or(0);
        self.at = self.at.wrapping_add(1);
        b
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |acc, _| (acc << 8) | u64::from(self.byte()))
    }
}

impl RxResources for Engine<'_> {
    fn untagged_head(&mut self, queue: Queue) -> Result<UntaggedBuf, TermCause> {
        match self.byte() {
            0 => Err(cause::DDP_ERR_U_NO_BUFFER),
            1 => Err(cause::RDMAP_ERR_CATASTROPHIC_STREAM),
            b => Ok(UntaggedBuf {
                id: u64::from(queue.qn()),
                capacity: u32::from(b) * 97,
            }),
        }
    }
    fn untagged_consume(&mut self, queue: Queue) {
        self.consumed[queue.index()] += 1;
    }
    fn tagged_lookup(&mut self, stag: u32, _ulp_ctrl: u8) -> Result<TaggedRegion, TermCause> {
        match self.byte() % 4 {
            0 => Err(cause::DDP_ERR_T_INVALID_STAG),
            1 => Err(cause::DDP_ERR_T_STAG_NOT_ASSOCIATED),
            _ => Ok(TaggedRegion {
                handle: u64::from(stag),
                base: self.u64(),
                len: self.u64(),
            }),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // Parser on the whole input, plus its pretty-printer.
    if let Ok(seg) = Segment::parse(data) {
        let mut buf = vec![0u8; seg.buffer_len()];
        assert_eq!(seg.emit(&mut buf), Ok(data.len()));
        assert_eq!(Segment::parse(&buf), Ok(seg));
        let _ = seg.to_string();
    }
    let _ = Header::parse_lenient(data);

    // Receive state: byte 0 picks the configuration, then a script length,
    // then ULPDUs each prefixed by a one-octet length.
    let Some((&sel, rest)) = data.split_first() else { return };
    let cfg = if sel & 1 != 0 { Config::RFC7306 } else { Config::RFC5040 };
    let (script, mut rest) = rest.split_at(usize::from(sel >> 1).min(rest.len()));
    let mut engine = Engine {
        script,
        at: 0,
        consumed: [0; 4],
    };
    let mut rx = DdpRx::new(cfg);
    while let Some((&n, tail)) = rest.split_first() {
        let (ulpdu, tail) = tail.split_at(usize::from(n).min(tail.len()));
        rest = tail;
        let Ok(seg) = Segment::parse(ulpdu) else { continue };
        // Exercise the RDMAP checks too, but feed DDP regardless so that
        // inconsistent opcode/QN combinations reach the state machine.
        if let Err(e) = rdmap::Message::parse(&seg, &cfg) {
            let _ = e.terminate(ulpdu);
        }
        match rx.receive_segment(&seg, &mut engine) {
            Ok(a) => {
                let len = seg.payload.len() as u64;
                match a.place {
                    Some(Placement::Untagged { offset, .. }) => assert!(len > 0 && u64::from(offset) + len <= 97 * 255),
                    Some(Placement::Tagged { to, offset, .. }) => {
                        assert!(len > 0);
                        assert!(to.checked_add(len).is_some() && offset.checked_add(len).is_some());
                    }
                    None => assert_eq!(len, 0),
                }
                if let Some(Delivered::Untagged { len, .. }) = a.delivered {
                    assert!(len <= 97 * 255);
                }
            }
            Err(e) => {
                let _ = e.terminate(ulpdu, None).to_string();
            }
        }
    }
    assert!(engine.consumed.iter().all(|&c| c <= 256));
});
