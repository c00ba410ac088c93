//! The receive buffer of a QP, without the socket: octets the socket
//! delivered go through the MPA deframer into the protocol core
//! ([`Proto::on_ulpdu`]), and a large tagged segment whose start is buffered
//! is placed directly (RFC 5041 §1): its header is parsed once here and
//! checked by the core ([`Proto::direct_target`]), and its payload goes
//! straight into the target region. `io.rs` fills the buffer with `read`
//! and the direct payload with `readv`; the in-memory harness
//! (`harness.rs`, used by `core_tests.rs` and the fuzz targets) fills both
//! from a byte slice with [`RxIo::absorb`], so every path here runs in tests
//! and under the fuzzer exactly as it runs over TCP.

use super::*;
use crate::wire::fpdu::PlacedFpdu;

/// Receive-side byte handling: the MPA deframer and its input buffer.
pub(crate) struct RxIo {
    pub(super) deframer: Deframer,
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) eof: bool,
    /// A tagged segment whose payload is being read straight into place.
    pub(super) direct: Option<Direct>,
}

/// Tagged payloads at least this long are placed directly.
const DIRECT_MIN: usize = 4096;
/// MPA ULPDU_Length plus the 14-octet tagged DDP/RDMAP header.
pub(super) const TAGGED_FPDU_HEAD: usize = fpdu::HEADER_LEN + ddp::TAGGED_HEADER_LEN;

/// Direct data placement of one FPDU (RFC 5041 §1, "placement" without an
/// intermediate buffer): header checked, payload `read` into the region,
/// then pad and CRC from the ordinary buffer. The deframer gave the FPDU
/// away ([`Deframer::placeable`]) and takes it back with its trailer
/// ([`Deframer::end_placed`]).
pub(super) struct Direct {
    fpdu: PlacedFpdu,
    kind: super::rx::DirectKind,
    pub(super) buf: Arc<Buffer>,
    pub(super) off: usize,
    pub(super) len: usize,
    pub(super) done: usize,
    /// Pad and CRC octets after the payload.
    pub(super) trailer: usize,
}

impl RxIo {
    /// An empty receive buffer holding `leftover` (octets read past the MPA
    /// handshake).
    #[cfg(any(test, feature = "fuzz"))]
    pub(super) fn new(cfg: DeframerConfig, leftover: &[u8]) -> RxIo {
        // As `io.rs` sizes it: RX_BUF plus room for one maximum FPDU.
        let mut buf = vec![0u8; RX_BUF + 70_000];
        let n = leftover.len().min(buf.len());
        buf[..n].copy_from_slice(&leftover[..n]);
        RxIo {
            deframer: Deframer::new(cfg),
            buf,
            start: 0,
            end: n,
            eof: false,
            direct: None,
        }
    }

    /// Hands `p` everything the buffer holds: whole FPDUs through the
    /// deframer, direct placements started and finished. Stops when more
    /// octets are needed (into the buffer, or into the direct placement's
    /// region while `direct` waits for payload) or the stream ended in a
    /// Terminate. Returns whether anything happened.
    pub(super) fn process(&mut self, p: &mut Proto) -> bool {
        let mut any = false;
        loop {
            if p.term_sent || p.term_received {
                self.direct = None;
                return any;
            }
            match &self.direct {
                Some(d) if d.done == d.len && self.end - self.start >= d.trailer => {
                    self.finish_direct(p);
                    any = true;
                    continue;
                }
                Some(_) => return any,
                None => {}
            }
            if self.start >= self.end {
                return any;
            }
            if self.start_direct(p) {
                any = true;
                continue;
            }
            match self.deframer.next_fpdu(&self.buf[self.start..self.end]) {
                Ok((used, ulpdu)) => {
                    if let Some(u) = ulpdu {
                        p.on_ulpdu(u);
                        any = true;
                    }
                    self.start += used;
                    if used == 0 {
                        return any;
                    }
                }
                Err(e) => {
                    p.on_stream_error(Some(e.cause()), "MPA framing error");
                    self.start = self.end;
                    any = true;
                }
            }
        }
    }

    /// Makes room at the end of the buffer for the next `read`.
    pub(super) fn make_room(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            if self.direct.is_some() {
                // Part of a trailer: keep it.
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
            } else {
                // The deframer copied the partial FPDU.
                self.end = 0;
            }
            self.start = 0;
        }
    }

    /// The socket's part without a socket: takes octets from `input` where
    /// `io.rs` would `read` or `readv` them (a direct placement's payload
    /// into its region, then its trailer and the next FPDU's header into
    /// the buffer; otherwise into the buffer). Returns the octets taken
    /// (0: the buffer is full, call [`process`](Self::process)).
    #[cfg(any(test, feature = "fuzz"))]
    pub(super) fn absorb(&mut self, input: &[u8]) -> usize {
        if let Some(d) = self.direct.as_mut()
            && d.done < d.len
        {
            self.start = 0;
            self.end = 0;
            let placed = input.len().min(d.len - d.done);
            if d.buf.write(d.off + d.done, &input[..placed]).is_err() {
                return 0;
            }
            d.done += placed;
            let tail = (input.len() - placed).min(d.trailer + TAGGED_FPDU_HEAD);
            self.buf[..tail].copy_from_slice(&input[placed..placed + tail]);
            self.end = tail;
            return placed + tail;
        }
        self.make_room();
        let n = input.len().min(self.buf.len() - self.end);
        self.buf[self.end..self.end + n].copy_from_slice(&input[..n]);
        self.end += n;
        n
    }

    /// At an FPDU boundary with only the start of a large tagged segment
    /// buffered: set up direct placement (copying the part already here).
    /// The MPA length is read once, by the deframer, and the DDP header
    /// parsed once, here, and handed to the core.
    fn start_direct(&mut self, p: &mut Proto) -> bool {
        let b = &self.buf[self.start..self.end];
        let Some(mut fpdu) = self
            .deframer
            .placeable(b, ddp::TAGGED_HEADER_LEN, ddp::TAGGED_HEADER_LEN + DIRECT_MIN)
        else {
            return false;
        };
        let Ok(h) = Header::parse(&b[fpdu::HEADER_LEN..TAGGED_FPDU_HEAD]) else {
            // Untagged (a longer header) or malformed: the ordinary path.
            return false;
        };
        let len = fpdu.ulpdu_len() - ddp::TAGGED_HEADER_LEN;
        let Some((buf, off, kind)) = p.direct_target(&h, len) else {
            return false;
        };
        let have = (b.len() - TAGGED_FPDU_HEAD).min(len);
        fpdu.update(&b[..TAGGED_FPDU_HEAD]);
        if buf.write(off, &b[TAGGED_FPDU_HEAD..TAGGED_FPDU_HEAD + have]).is_err() {
            // The core accounted the segment: it cannot take the ordinary
            // path any more. Unreachable (the core checked the bounds).
            p.on_stream_error(Some(cause::DDP_ERR_T_BASE_BOUNDS), "direct placement failed");
            self.start = self.end;
            return true;
        }
        self.start += TAGGED_FPDU_HEAD + have;
        let trailer = fpdu.trailer_len();
        self.direct = Some(Direct {
            fpdu,
            kind,
            buf,
            off,
            len,
            done: have,
            trailer,
        });
        true
    }

    /// The payload is in place and the trailer buffered: the deframer checks
    /// the CRC and the segment goes to the protocol.
    fn finish_direct(&mut self, p: &mut Proto) {
        let Some(mut d) = self.direct.take() else { return };
        let t = &self.buf[self.start..self.start + d.trailer];
        self.start += d.trailer;
        let pad = d.trailer - fpdu::CRC_LEN;
        if d.fpdu.needs_bytes() {
            let _ = d.buf.scan(d.off, d.len, |b| d.fpdu.update(b));
        }
        match self
            .deframer
            .end_placed(d.fpdu, &t[..pad], [t[pad], t[pad + 1], t[pad + 2], t[pad + 3]])
        {
            Ok(()) => p.direct_placed(d.kind, d.len),
            Err(e) => {
                // The payload was placed before the check: the region's
                // contents are undefined after the error, as for any failed
                // operation (RFC 5040 §5.5); the stream ends here.
                p.on_stream_error(Some(e.cause()), "MPA CRC error");
                self.start = self.end;
            }
        }
    }
}
