//! The MPA receive side: a streaming FPDU deframer, RFC 5044 §4.1, §4.3,
//! §4.4 (receive), §6 (FPDU identification) and §8 (errors).
//!
//! TCP delivers the stream cut anywhere; [`Deframer::step`] consumes any
//! prefix of what it is given and reports, in order, the start of an FPDU
//! (its ULPDU_Length), ULPDU octets borrowed straight from the input (so the
//! engine can place them without an extra copy), and the end of the FPDU
//! once its CRC checked. Markers (when the peer inserts them) are stripped,
//! checked against the FPDU start (RFC 5044 §8 code 3) and fed to the CRC.
//! [`Deframer::next_fpdu`] is the simple buffered form on top: whole ULPDUs,
//! borrowed from the input when it holds the whole FPDU, else copied into
//! one buffer that never grows beyond the largest ULPDU accepted.
//!
//! After an error the deframer delivers nothing more (RFC 5044 §8 "Once MPA
//! delivers an error of any type, it MUST NOT pass or deliver any additional
//! FPDUs on that half connection") and repeats the error.

use crate::crc::{Crc32c, crc32c, from_wire};
use crate::wire::cause::{MPA_ERR_CRC, MPA_ERR_LOCAL_CATASTROPHIC, MPA_ERR_MARKER, TermCause};

use super::{CRC_LEN, HEADER_LEN, MARKER_INTERVAL, MARKER_LEN, MAX_ULPDU_LEN, Marker, fpdu_len, pad_len};

/// A receive-side failure caused by peer input. Each names the Terminate
/// to send ([`FpduError::cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FpduError {
    /// RFC 5044 §8 code 2: the CRC field does not match.
    #[error("MPA CRC mismatch: computed {computed:#010x}, received {received:#010x}")]
    Crc {
        /// The CRC of the FPDU as received.
        computed: u32,
        /// The CRC field.
        received: u32,
    },
    /// RFC 5044 §8 code 3: a marker disagrees with the FPDU start found
    /// from ULPDU_Length fields.
    #[error("MPA marker at stream offset {offset} points back {found}, FPDU starts {expected} octets back")]
    Marker {
        /// Stream offset of the marker.
        offset: u64,
        /// Octets back to the FPDU start, from the length fields.
        expected: u16,
        /// Octets back the marker points.
        found: u16,
    },
    /// ULPDU_Length above the receiver's configured limit. RFC 5044 has no
    /// code for this; it is a local resource limit, so it maps to RFC 6581
    /// §8 "local catastrophic".
    #[error("ULPDU_Length {len} exceeds the receive limit {max}")]
    UlpduTooLong {
        /// The ULPDU_Length.
        len: u16,
        /// The receive limit.
        max: u16,
    },
}

impl FpduError {
    /// The Terminate (layer LLP, type MPA) that reports this error.
    pub const fn cause(&self) -> TermCause {
        match self {
            FpduError::Crc { .. } => MPA_ERR_CRC,
            FpduError::Marker { .. } => MPA_ERR_MARKER,
            FpduError::UlpduTooLong { .. } => MPA_ERR_LOCAL_CATASTROPHIC,
        }
    }
}

/// What one half connection's receiver was told at MPA negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeframerConfig {
    /// CRCs negotiated: check them.
    pub crc: bool,
    /// The peer inserts markers (we sent M=1).
    pub markers: bool,
    /// Largest ULPDU_Length accepted (65535 accepts everything; Linux siw
    /// sends FPDUs close to 64 KiB on `lo`).
    pub max_ulpdu_len: u16,
}

impl Default for DeframerConfig {
    fn default() -> Self {
        DeframerConfig {
            crc: false,
            markers: false,
            max_ulpdu_len: MAX_ULPDU_LEN as u16,
        }
    }
}

/// One step of progress through the stream, from [`Deframer::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk<'a> {
    /// A new FPDU: its ULPDU_Length was read.
    Start {
        /// ULPDU octets that will follow as [`Chunk::Data`].
        ulpdu_len: u16,
    },
    /// The next ULPDU octets, markers removed.
    Data(&'a [u8]),
    /// The FPDU is complete and its CRC (if negotiated) is good. Until
    /// this arrives the ULPDU is unverified.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Len { got: u8, hi: u8 },
    Payload { rem: u16, pad: u8 },
    Pad { rem: u8 },
    Crc { got: u8, bytes: [u8; CRC_LEN] },
}

const LEN_START: State = State::Len { got: 0, hi: 0 };

/// The streaming FPDU deframer for one half connection.
#[derive(Clone)]
pub struct Deframer {
    cfg: DeframerConfig,
    state: State,
    /// Octets consumed since the start of Full Operation (markers included).
    pos: u64,
    /// Stream offset of the current FPDU's ULPDU_Length field.
    fpdu_start: u64,
    marker: [u8; MARKER_LEN],
    crc: Crc32c,
    buf: Vec<u8>,
    /// Some octet of the current FPDU (or its leading marker) was consumed.
    in_fpdu: bool,
    error: Option<FpduError>,
}

impl core::fmt::Debug for Deframer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Deframer")
            .field("cfg", &self.cfg)
            .field("state", &self.state)
            .field("pos", &self.pos)
            .field("error", &self.error)
            .finish()
    }
}

/// An FPDU whose payload the caller places itself, from
/// [`Deframer::placeable`] to [`Deframer::end_placed`]: its length and the
/// running CRC (when CRCs are on).
#[derive(Clone)]
pub struct PlacedFpdu {
    ulpdu_len: u16,
    crc: Option<Crc32c>,
}

impl PlacedFpdu {
    /// ULPDU_Length: DDP header, RDMAP header and payload.
    pub fn ulpdu_len(&self) -> usize {
        usize::from(self.ulpdu_len)
    }
    /// The whole FPDU: length field, ULPDU, pad and CRC.
    pub fn total_len(&self) -> usize {
        fpdu_len(self.ulpdu_len())
    }
    /// Pad and CRC octets after the ULPDU.
    pub fn trailer_len(&self) -> usize {
        pad_len(self.ulpdu_len()) + CRC_LEN
    }
    /// Whether [`PlacedFpdu::update`] needs the octets (CRCs are on).
    pub fn needs_bytes(&self) -> bool {
        self.crc.is_some()
    }
    /// The FPDU's octets in order, from its ULPDU_Length field to the end
    /// of the ULPDU, for the CRC.
    pub fn update(&mut self, part: &[u8]) {
        if let Some(c) = self.crc.as_mut() {
            c.update(part);
        }
    }
}

impl Deframer {
    /// A deframer at the first octet after the MPA Reply (Initiator) or
    /// Request (Responder).
    pub fn new(cfg: DeframerConfig) -> Deframer {
        Deframer {
            cfg,
            state: LEN_START,
            pos: 0,
            fpdu_start: 0,
            marker: [0; MARKER_LEN],
            crc: Crc32c::new(),
            buf: Vec::new(),
            in_fpdu: false,
            error: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> DeframerConfig {
        self.cfg
    }
    /// Octets consumed so far.
    pub fn stream_pos(&self) -> u64 {
        self.pos
    }
    /// The error that stopped the deframer, if any.
    pub fn error(&self) -> Option<FpduError> {
        self.error
    }
    /// Whether the deframer sits between FPDUs: no octet of a next FPDU
    /// (not even its leading marker) has been consumed. A TCP close
    /// anywhere else cut an FPDU short.
    pub fn at_boundary(&self) -> bool {
        !self.in_fpdu
    }

    /// Direct data placement (RFC 5041 §1): whether the FPDU starting at
    /// `input` (the buffered octets at an FPDU boundary) should have its
    /// payload placed by the caller instead of buffered: no markers, no
    /// earlier error, at least `head` ULPDU octets here but not the whole
    /// FPDU, and a ULPDU_Length of at least `min_ulpdu` within the limit.
    /// Consumes nothing: the caller may still decline and call
    /// [`Deframer::next_fpdu`]. If it places the FPDU, it feeds the CRC
    /// ([`PlacedFpdu::update`]) with the first `HEADER_LEN + head` octets and
    /// the ULPDU octets after them in order, and ends it with
    /// [`Deframer::end_placed`].
    pub fn placeable(&self, input: &[u8], head: usize, min_ulpdu: usize) -> Option<PlacedFpdu> {
        if self.cfg.markers || self.in_fpdu || self.error.is_some() || input.len() < HEADER_LEN + head {
            return None;
        }
        let len = u16::from_be_bytes([input[0], input[1]]);
        let ulpdu = usize::from(len);
        if input.len() >= fpdu_len(ulpdu) || ulpdu < min_ulpdu.max(head) || len > self.cfg.max_ulpdu_len {
            return None;
        }
        Some(PlacedFpdu {
            ulpdu_len: len,
            crc: self.cfg.crc.then(Crc32c::new),
        })
    }

    /// The trailer of an FPDU placed by the caller (its `pad` octets and the
    /// CRC field): checks the CRC over what [`PlacedFpdu::update`] saw and
    /// the pad, and accounts for the FPDU in the stream. A mismatch stops
    /// the deframer as in [`Deframer::next_fpdu`] (the Terminate is
    /// [`FpduError::cause`]).
    pub fn end_placed(&mut self, mut f: PlacedFpdu, pad: &[u8], crc_field: [u8; CRC_LEN]) -> Result<(), FpduError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if let Some(mut crc) = f.crc.take() {
            crc.update(pad);
            let computed = crc.finish();
            let received = from_wire(crc_field);
            if !self.crc_matches(computed, received) {
                self.pos += f.total_len() as u64;
                return Err(self.fail(FpduError::Crc { computed, received }));
            }
        }
        self.pos += f.total_len() as u64;
        Ok(())
    }

    fn fail(&mut self, e: FpduError) -> FpduError {
        self.error = Some(e);
        e
    }

    fn crc_update(&mut self, data: &[u8]) {
        if self.cfg.crc {
            self.crc.update(data);
        }
    }

    fn crc_matches(&self, computed: u32, received: u32) -> bool {
        // RFC 5044 §4.1: without CRCs the field "MUST NOT be checked";
        // under cfg(fuzzing) CRCs are not checked so the fuzzer gets past them.
        !self.cfg.crc || cfg!(fuzzing) || computed == received
    }

    /// Consumes a prefix of `input` and reports the next event. Returns the
    /// octets consumed and `None` once all of `input` is consumed without a
    /// further event; call again with the rest after any `Some`.
    pub fn step<'i>(&mut self, input: &'i [u8]) -> Result<(usize, Option<Chunk<'i>>), FpduError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut i = 0;
        while i < input.len() {
            let period = (self.pos % MARKER_INTERVAL as u64) as usize;
            if self.cfg.markers && period < MARKER_LEN {
                // RFC 5044 §4.3: a marker sits at every 512th octet.
                let n = (MARKER_LEN - period).min(input.len() - i);
                self.marker[period..period + n].copy_from_slice(&input[i..i + n]);
                // The marker is covered by the CRC of the FPDU it sits in,
                // or of the next one if it sits between FPDUs (§4.4).
                self.crc_update(&input[i..i + n]);
                self.in_fpdu = true;
                i += n;
                self.pos += n as u64;
                if period + n == MARKER_LEN {
                    self.check_marker()?;
                }
                continue;
            }
            let room = if self.cfg.markers {
                MARKER_INTERVAL - period
            } else {
                usize::MAX
            };
            let avail = (input.len() - i).min(room);
            match self.state {
                State::Len { got, hi } => {
                    if got == 0 {
                        self.fpdu_start = self.pos;
                        self.in_fpdu = true;
                        self.state = State::Len { got: 1, hi: input[i] };
                        i += 1;
                        self.pos += 1;
                        continue;
                    }
                    let lo = input[i];
                    i += 1;
                    self.pos += 1;
                    let len = u16::from_be_bytes([hi, lo]);
                    if len > self.cfg.max_ulpdu_len {
                        return Err(self.fail(FpduError::UlpduTooLong {
                            len,
                            max: self.cfg.max_ulpdu_len,
                        }));
                    }
                    self.crc_update(&[hi, lo]);
                    let pad = pad_len(usize::from(len)) as u8;
                    self.state = if len > 0 {
                        State::Payload { rem: len, pad }
                    } else {
                        State::Pad { rem: pad }
                    };
                    return Ok((i, Some(Chunk::Start { ulpdu_len: len })));
                }
                State::Payload { rem, pad } => {
                    let n = avail.min(usize::from(rem));
                    let data = &input[i..i + n];
                    self.crc_update(data);
                    i += n;
                    self.pos += n as u64;
                    let rem = rem - n as u16;
                    self.state = if rem > 0 {
                        State::Payload { rem, pad }
                    } else {
                        State::Pad { rem: pad }
                    };
                    return Ok((i, Some(Chunk::Data(data))));
                }
                State::Pad { rem } => {
                    // RFC 5044 §4.1: pad is "ignored by the receiver (except
                    // for CRC checking)".
                    let n = avail.min(usize::from(rem));
                    self.crc_update(&input[i..i + n]);
                    i += n;
                    self.pos += n as u64;
                    let rem = rem - n as u8;
                    self.state = if rem > 0 {
                        State::Pad { rem }
                    } else {
                        State::Crc {
                            got: 0,
                            bytes: [0; CRC_LEN],
                        }
                    };
                }
                State::Crc { got, mut bytes } => {
                    let got = usize::from(got);
                    let n = avail.min(CRC_LEN - got);
                    bytes[got..got + n].copy_from_slice(&input[i..i + n]);
                    i += n;
                    self.pos += n as u64;
                    if got + n < CRC_LEN {
                        self.state = State::Crc {
                            got: (got + n) as u8,
                            bytes,
                        };
                        continue;
                    }
                    let computed = self.crc.finish();
                    let received = from_wire(bytes);
                    self.crc = Crc32c::new();
                    self.state = LEN_START;
                    self.in_fpdu = false;
                    if !self.crc_matches(computed, received) {
                        return Err(self.fail(FpduError::Crc { computed, received }));
                    }
                    return Ok((i, Some(Chunk::End)));
                }
            }
        }
        Ok((i, None))
    }

    fn check_marker(&mut self) -> Result<(), FpduError> {
        let offset = self.pos - MARKER_LEN as u64;
        // Between FPDUs (before the next ULPDU_Length): FPDUPTR 0. Inside an
        // FPDU: octets from its ULPDU_Length field, markers included.
        let expected = if self.state == LEN_START {
            0
        } else {
            offset.wrapping_sub(self.fpdu_start) as u16 & 0xFFFC
        };
        let found = Marker::parse(self.marker).pointer();
        if found != expected {
            return Err(self.fail(FpduError::Marker {
                offset,
                expected,
                found,
            }));
        }
        Ok(())
    }

    /// Buffered deframing: consumes a prefix of `input` and returns the next
    /// whole, CRC-checked ULPDU, or `None` when `input` is used up. The
    /// ULPDU borrows `input` when it held the whole FPDU (no copy), else an
    /// internal buffer of at most `max_ulpdu_len` octets.
    pub fn next_fpdu<'a>(&'a mut self, input: &'a [u8]) -> Result<(usize, Option<&'a [u8]>), FpduError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if !self.cfg.markers && self.state == LEN_START && input.len() >= HEADER_LEN {
            let len = u16::from_be_bytes([input[0], input[1]]);
            let total = fpdu_len(usize::from(len));
            if len <= self.cfg.max_ulpdu_len && input.len() >= total {
                // Fast path: the whole FPDU is in `input`.
                let crc_at = total - CRC_LEN;
                if self.cfg.crc {
                    let computed = crc32c(&input[..crc_at]);
                    let received = from_wire([input[crc_at], input[crc_at + 1], input[crc_at + 2], input[crc_at + 3]]);
                    if !self.crc_matches(computed, received) {
                        self.pos += total as u64;
                        return Err(self.fail(FpduError::Crc { computed, received }));
                    }
                }
                self.pos += total as u64;
                return Ok((total, Some(&input[HEADER_LEN..HEADER_LEN + usize::from(len)])));
            }
        }
        let mut used = 0;
        loop {
            let (n, ev) = self.step(&input[used..])?;
            used += n;
            match ev {
                None => return Ok((used, None)),
                Some(Chunk::Start { ulpdu_len }) => {
                    self.buf.clear();
                    self.buf.reserve_exact(usize::from(ulpdu_len));
                }
                Some(Chunk::Data(d)) => self.buf.extend_from_slice(d),
                Some(Chunk::End) => return Ok((used, Some(&self.buf))),
            }
        }
    }

    /// Capacity of the internal reassembly buffer (for tests and stats).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Framer, mulpdu};
    use super::*;
    use crate::crc::to_wire;
    use proptest::prelude::*;

    /// Direct placement's hand-off: the deframer gives away an FPDU it only
    /// has the start of, checks the CRC of what the caller placed, and then
    /// deframes the next FPDU as if it had read the first itself.
    #[test]
    fn placed_fpdu_round_trip_and_crc() {
        for crc in [false, true] {
            let mut f = Framer::new(crc, false);
            let mut stream = Vec::new();
            let big: Vec<u8> = (0..5001u32).map(|i| i as u8).collect();
            f.emit_vec(&big, &mut stream).unwrap();
            let first = stream.len();
            f.emit_vec(b"next", &mut stream).unwrap();
            let cfg = DeframerConfig {
                crc,
                ..Default::default()
            };
            let mut d = Deframer::new(cfg);
            // Not offered: the whole FPDU is here, or too short, or too little head.
            assert!(d.placeable(&stream, 14, 4096).is_none());
            assert!(d.placeable(&stream[..100], 14, 6000).is_none());
            assert!(d.placeable(&stream[..10], 14, 4096).is_none());
            let mut p = d.placeable(&stream[..100], 14, 4096).expect("offered");
            assert_eq!((p.ulpdu_len(), p.total_len()), (5001, first));
            p.update(&stream[..first - p.trailer_len()]);
            let t = &stream[first - p.trailer_len()..first];
            let pad = t.len() - CRC_LEN;
            d.end_placed(p, &t[..pad], [t[pad], t[pad + 1], t[pad + 2], t[pad + 3]])
                .unwrap();
            assert_eq!(d.stream_pos(), first as u64);
            let (used, u) = d.next_fpdu(&stream[first..]).unwrap();
            assert_eq!((used, u), (stream.len() - first, Some(&b"next"[..])));
            if crc {
                // A corrupted CRC: row 26, and the deframer stops.
                let mut d = Deframer::new(cfg);
                let mut p = d.placeable(&stream[..100], 14, 4096).unwrap();
                p.update(&stream[..first - p.trailer_len()]);
                let e = d.end_placed(p, &t[..pad], [!t[pad], t[pad + 1], t[pad + 2], t[pad + 3]]);
                assert!(matches!(e, Err(FpduError::Crc { .. })));
                assert_eq!(e.unwrap_err().cause(), MPA_ERR_CRC);
                assert!(d.next_fpdu(&stream[first..]).is_err(), "sticky");
            }
        }
    }

    fn cfg(crc: bool, markers: bool) -> DeframerConfig {
        DeframerConfig {
            crc,
            markers,
            ..Default::default()
        }
    }

    /// Frames `ulpdus` into one stream.
    fn frame_all(crc: bool, markers: bool, ulpdus: &[Vec<u8>]) -> Vec<u8> {
        let mut f = Framer::new(crc, markers);
        let mut out = Vec::new();
        for u in ulpdus {
            f.emit_vec(u, &mut out).unwrap();
        }
        out
    }

    /// Runs the streaming API over `stream` cut at `cuts`; returns the
    /// ULPDUs and checks the event grammar.
    fn deframe_streaming(d: &mut Deframer, stream: &[u8], cuts: &[usize]) -> Result<Vec<Vec<u8>>, FpduError> {
        let mut out = Vec::new();
        let mut cur: Option<(usize, Vec<u8>)> = None;
        let mut last = 0;
        let mut bounds: Vec<usize> = cuts.iter().copied().filter(|c| *c <= stream.len()).collect();
        bounds.sort_unstable();
        bounds.push(stream.len());
        for b in bounds {
            let mut piece = &stream[last..b];
            last = b;
            loop {
                let (n, ev) = d.step(piece)?;
                piece = &piece[n..];
                match ev {
                    None => {
                        assert!(piece.is_empty());
                        break;
                    }
                    Some(Chunk::Start { ulpdu_len }) => {
                        assert!(cur.is_none());
                        cur = Some((usize::from(ulpdu_len), Vec::new()));
                    }
                    Some(Chunk::Data(x)) => {
                        assert!(!x.is_empty());
                        cur.as_mut().unwrap().1.extend_from_slice(x);
                    }
                    Some(Chunk::End) => {
                        let (len, u) = cur.take().unwrap();
                        assert_eq!(len, u.len());
                        out.push(u);
                    }
                }
            }
        }
        assert!(cur.is_none(), "stream ended inside an FPDU");
        Ok(out)
    }

    fn deframe_buffered(d: &mut Deframer, stream: &[u8], cuts: &[usize]) -> Result<Vec<Vec<u8>>, FpduError> {
        let mut out = Vec::new();
        let mut last = 0;
        let mut bounds: Vec<usize> = cuts.iter().copied().filter(|c| *c <= stream.len()).collect();
        bounds.sort_unstable();
        bounds.push(stream.len());
        for b in bounds {
            let mut piece = &stream[last..b];
            last = b;
            loop {
                let (n, u) = d.next_fpdu(piece)?;
                let u = u.map(|u| u.to_vec());
                piece = &piece[n..];
                match u {
                    Some(u) => out.push(u),
                    None => break,
                }
            }
            assert!(piece.is_empty());
        }
        Ok(out)
    }

    fn sample() -> Vec<Vec<u8>> {
        vec![
            (0..34u8).collect(),
            vec![],
            (0..1u8).collect(),
            (0..3u8).map(|x| x ^ 0x5a).collect(),
            (0..700u32).map(|x| x as u8).collect(),
            (0..46u8).collect(),
            (0..1100u32).map(|x| (x * 7) as u8).collect(),
            (0..2u8).collect(),
        ]
    }

    #[test]
    fn every_split_offset_all_modes() {
        // RFC 5044 §5.2 / C.2.4: any TCP segmentation; markers stripped at
        // every split (RFC 5044 §4.3).
        let ulpdus = sample();
        for crc in [false, true] {
            for markers in [false, true] {
                let stream = frame_all(crc, markers, &ulpdus);
                for cut in 0..=stream.len() {
                    let mut d = Deframer::new(cfg(crc, markers));
                    assert_eq!(deframe_streaming(&mut d, &stream, &[cut]).unwrap(), ulpdus, "cut {cut}");
                    assert_eq!(d.stream_pos(), stream.len() as u64);
                    let mut d = Deframer::new(cfg(crc, markers));
                    assert_eq!(deframe_buffered(&mut d, &stream, &[cut]).unwrap(), ulpdus, "cut {cut}");
                }
            }
        }
    }

    #[test]
    fn byte_at_a_time() {
        let ulpdus = sample();
        for markers in [false, true] {
            let stream = frame_all(true, markers, &ulpdus);
            let cuts: Vec<usize> = (0..stream.len()).collect();
            let mut d = Deframer::new(cfg(true, markers));
            assert_eq!(deframe_streaming(&mut d, &stream, &cuts).unwrap(), ulpdus);
            let mut d = Deframer::new(cfg(true, markers));
            assert_eq!(deframe_buffered(&mut d, &stream, &cuts).unwrap(), ulpdus);
        }
    }

    #[test]
    fn rfc5044_fig5_deframe() {
        // Hex dump of RFC 5044 Fig. 5 (first FPDU, leading marker, CRC on).
        // Fig. 6 is checked on the framer side and deframed by the split
        // tests.
        let mut stream = vec![
            0, 0, 0, 0, 0x00, 0x2a, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
        ];
        stream.resize(0x30, 0);
        stream.extend_from_slice(&[0x52, 0x23, 0x99, 0x83]);
        let mut d = Deframer::new(cfg(true, true));
        let (n, u) = d.next_fpdu(&stream).unwrap();
        assert_eq!(n, 0x34);
        assert_eq!(u.unwrap().len(), 42);
    }

    #[test]
    fn crc_error_names_mpa_err_crc() {
        // RFC 5044 §8 code 2, C.2.7 0x02.
        let ulpdus = sample();
        let mut stream = frame_all(true, false, &ulpdus);
        stream[40] ^= 1; // the first FPDU is 40 octets: this is the second one's ULPDU_Length
        let mut d = Deframer::new(cfg(true, false));
        let e = deframe_buffered(&mut d, &stream, &[]).unwrap_err();
        assert!(matches!(e, FpduError::Crc { .. }));
        assert_eq!(e.cause(), MPA_ERR_CRC);
        // Sticky: nothing more is delivered.
        assert_eq!(d.step(&stream[..4]), Err(e));
        assert_eq!(d.next_fpdu(&stream[..4]).map(|(n, _)| n), Err(e));
        // Same on the streaming path, with the flip in a payload octet.
        let mut stream = frame_all(true, false, &ulpdus);
        stream[5] ^= 0x80;
        let mut d = Deframer::new(cfg(true, false));
        assert!(matches!(
            deframe_streaming(&mut d, &stream, &[3, 17]),
            Err(FpduError::Crc { .. })
        ));
    }

    #[test]
    fn crc_off_ignores_crc_field() {
        // RFC 5044 §4.1: "MUST NOT be checked".
        let ulpdus = sample();
        let mut stream = frame_all(true, false, &ulpdus);
        let mut d = Deframer::new(cfg(false, false));
        stream[36..40].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(deframe_buffered(&mut d, &stream, &[]).unwrap(), ulpdus);
    }

    #[test]
    fn bad_ulpdu_length() {
        // A length above the receive limit is refused before any octet of
        // the ULPDU is buffered.
        let stream = frame_all(false, false, &[vec![0u8; 300]]);
        let mut d = Deframer::new(DeframerConfig {
            max_ulpdu_len: 299,
            ..cfg(false, false)
        });
        let e = d.next_fpdu(&stream).unwrap_err();
        assert_eq!(e, FpduError::UlpduTooLong { len: 300, max: 299 });
        assert_eq!(e.cause(), MPA_ERR_LOCAL_CATASTROPHIC);
        assert_eq!(d.buffer_capacity(), 0);
        // A wrong length with CRCs on shows up as a CRC error (RFC 5044 §6).
        let mut stream = frame_all(true, false, &[vec![7u8; 8], vec![9u8; 8]]);
        stream[1] = 12;
        let mut d = Deframer::new(cfg(true, false));
        assert!(matches!(
            deframe_buffered(&mut d, &stream, &[]),
            Err(FpduError::Crc { .. })
        ));
        // With markers, a wrong length puts the next FPDU start somewhere a
        // marker contradicts (RFC 5044 §8 code 3), CRC off.
        let mut stream = frame_all(false, true, &[vec![1u8; 600], vec![2u8; 600]]);
        stream[4 + 1] = 0x54; // 600 = 0x0258 -> 0x0254
        let mut d = Deframer::new(cfg(false, true));
        let e = deframe_buffered(&mut d, &stream, &[]).unwrap_err();
        assert!(matches!(e, FpduError::Marker { .. }), "{e:?}");
        assert_eq!(e.cause(), MPA_ERR_MARKER);
    }

    #[test]
    fn marker_pointer_mismatch() {
        // RFC 5044 §4.3: FPDUPTR must point at the ULPDU_Length field.
        let mut stream = frame_all(false, true, &[vec![0u8; 1000]]);
        assert_eq!(&stream[512..516], &[0, 0, 0x01, 0xFC]);
        stream[515] = 0xF8;
        let mut d = Deframer::new(cfg(false, true));
        let e = deframe_streaming(&mut d, &stream, &[]).unwrap_err();
        assert_eq!(
            e,
            FpduError::Marker {
                offset: 512,
                expected: 0x1FC,
                found: 0x1F8
            }
        );
        // The low two bits are treated as zero; reserved is ignored.
        let mut stream = frame_all(false, true, &[vec![0u8; 1000]]);
        stream[515] |= 3;
        stream[512] = 0xEE;
        let mut d = Deframer::new(cfg(false, true));
        assert!(deframe_streaming(&mut d, &stream, &[]).is_ok());
        // The leading marker must be zero.
        let mut stream = frame_all(false, true, &[vec![0u8; 10]]);
        stream[3] = 4;
        let mut d = Deframer::new(cfg(false, true));
        assert!(matches!(
            d.next_fpdu(&stream),
            Err(FpduError::Marker {
                offset: 0,
                expected: 0,
                found: 4
            })
        ));
    }

    #[test]
    fn markers_are_crc_covered() {
        // RFC 5044 §4.3/§4.4: changing the marker's reserved field changes
        // the CRC.
        let mut stream = frame_all(true, true, &[vec![0u8; 1000]]);
        stream[512] = 0x01;
        let mut d = Deframer::new(cfg(true, true));
        assert!(matches!(d.next_fpdu(&stream), Err(FpduError::Crc { .. })));
        let mut stream = frame_all(true, true, &[vec![0u8; 10]]);
        stream[0] = 0x01;
        let mut d = Deframer::new(cfg(true, true));
        assert!(matches!(d.next_fpdu(&stream), Err(FpduError::Crc { .. })));
    }

    #[test]
    fn marker_right_after_pad_belongs_to_fpdu() {
        // An FPDU whose content ends exactly at a 512 boundary: the marker
        // sits between pad and CRC, with FPDUPTR = content length.
        // Leading marker (4) + content 508 -> marker at 512.
        let u = vec![3u8; 506];
        let stream = frame_all(true, true, std::slice::from_ref(&u));
        assert_eq!(stream.len(), 4 + 508 + 4 + 4);
        assert_eq!(&stream[512..516], &[0, 0, 0x01, 0xFC]);
        let mut d = Deframer::new(cfg(true, true));
        assert_eq!(deframe_buffered(&mut d, &stream, &[]).unwrap(), vec![u]);
    }

    #[test]
    fn sec_dos_05_largest_fpdu_and_bounded_buffer() {
        // SEC-DOS-05: ULPDU <= 65535 and memory bounded by one ULPDU.
        // siw on lo sends FPDUs near 64 KiB; ULPDU_Length 65535 must work,
        // and the reassembly buffer never exceeds one ULPDU.
        let u: Vec<u8> = (0..65535u32).map(|x| (x % 251) as u8).collect();
        let stream = frame_all(true, false, std::slice::from_ref(&u));
        let mut d = Deframer::new(cfg(true, false));
        let got = deframe_buffered(&mut d, &stream, &[1, 30000]).unwrap();
        assert_eq!(got, vec![u.clone()]);
        assert!(d.buffer_capacity() <= 65535);
        // With markers, the largest MULPDU FPDU.
        let m = mulpdu(65535, true);
        let stream = frame_all(true, true, &[u[..m].to_vec(), u[..m].to_vec()]);
        let mut d = Deframer::new(cfg(true, true));
        assert_eq!(deframe_buffered(&mut d, &stream, &[7, 40000]).unwrap().len(), 2);
    }

    #[test]
    fn crc_field_byte_order_is_lsb_first() {
        // C.2.5 golden: "classic interop bug".
        let u = b"123456789".to_vec();
        let mut stream = vec![0, 9];
        stream.extend_from_slice(&u);
        stream.push(0); // pad to 12
        let crc = crc32c(&stream);
        stream.extend_from_slice(&to_wire(crc));
        let mut d = Deframer::new(cfg(true, false));
        assert_eq!(d.next_fpdu(&stream).unwrap().1.unwrap(), &u[..]);
        let n = stream.len();
        stream[n - 4..].copy_from_slice(&crc.to_be_bytes());
        let mut d = Deframer::new(cfg(true, false));
        assert!(d.next_fpdu(&stream).is_err());
    }

    #[test]
    fn zero_length_ulpdu_events() {
        let stream = frame_all(true, false, &[vec![]]);
        assert_eq!(stream.len(), 8);
        let mut d = Deframer::new(cfg(true, false));
        assert_eq!(d.step(&stream), Ok((2, Some(Chunk::Start { ulpdu_len: 0 }))));
        assert_eq!(d.step(&stream[2..]), Ok((6, Some(Chunk::End))));
        assert_eq!(d.step(&[]), Ok((0, None)));
        assert!(d.at_boundary());
    }

    proptest! {
        #[test]
        fn random_splits(
            lens in proptest::collection::vec(0usize..1600, 1..8),
            cuts in proptest::collection::vec(0usize..8000, 0..20),
            crc in any::<bool>(), markers in any::<bool>(),
        ) {
            let ulpdus: Vec<Vec<u8>> = lens.iter().enumerate()
                .map(|(k, l)| (0..*l).map(|i| (i * 31 + k) as u8).collect()).collect();
            let stream = frame_all(crc, markers, &ulpdus);
            let mut d = Deframer::new(cfg(crc, markers));
            prop_assert_eq!(deframe_streaming(&mut d, &stream, &cuts).unwrap(), ulpdus.clone());
            let mut d = Deframer::new(cfg(crc, markers));
            prop_assert_eq!(deframe_buffered(&mut d, &stream, &cuts).unwrap(), ulpdus);
        }

        /// SEC-ROB-01 / SEC-DOS-05: garbage never panics; the buffer stays
        /// within the configured limit.
        #[test]
        fn garbage_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..3000),
            cuts in proptest::collection::vec(0usize..3000, 0..10),
            crc in any::<bool>(), markers in any::<bool>(), max in any::<u16>(),
        ) {
            let c = DeframerConfig { crc, markers, max_ulpdu_len: max };
            let mut d = Deframer::new(c);
            let _ = deframe_buffered(&mut d, &bytes, &cuts);
            prop_assert!(d.buffer_capacity() <= usize::from(max));
            let mut d = Deframer::new(c);
            let mut piece = &bytes[..];
            while let Ok((n, Some(_))) = d.step(piece) {
                piece = &piece[n..];
            }
        }

        #[test]
        fn single_bit_flip_detected_with_crc(
            lens in proptest::collection::vec(0usize..700, 1..4), flip in any::<prop::sample::Index>(), bit in 0u8..8,
            markers in any::<bool>(),
        ) {
            let ulpdus: Vec<Vec<u8>> = lens.iter().map(|l| vec![0x33; *l]).collect();
            let mut stream = frame_all(true, markers, &ulpdus);
            let at = flip.index(stream.len());
            stream[at] ^= 1 << bit;
            let mut d = Deframer::new(cfg(true, markers));
            // Either an error, or (a flipped length) an incomplete stream;
            // never the original ULPDUs.
            if let Ok(got) = deframe_buffered(&mut d, &stream, &[]) {
                prop_assert_ne!(got, ulpdus);
            }
        }
    }
}
