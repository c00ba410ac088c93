//! Receive-side DDP (RFC 5041 §5-§7): untagged sequencing and reassembly,
//! tagged placement checks, as plain state with no I/O.
//!
//! Read before editing: RFC 5041 §4.3 (MSN, MO), §5.2-§5.4 and §7.1, and the
//! catalogue `shared/requirements/rdmap-rpcrdma.md` C.1.3, A.4.2 steps 5-6,
//! A.4.6 rows 1-12 and A.5 #5-#6.
//!
//! The engine parses each ULPDU (`wire::ddp::Segment::parse`, then
//! `wire::rdmap::Message::parse`, which check DV, RV, opcode, T and QN
//! against the opcode) and then hands the segment to [`DdpRx::receive`],
//! which answers where the payload goes ([`Placement`]) and whether a
//! message is now complete ([`Delivered`]), or which Terminate to send
//! ([`Error::cause`]).
//!
//! Untagged queues (QN 0 Send, 1 Read Request, 2 Terminate, 3 Atomic
//! Response when RFC 7306 atomics are on) each keep the expected MSN
//! (starting at 1, wrapping modulo 2^32, RFC 5041 §4.3) and the message in
//! progress. Segments of one message arrive in order over TCP, so each MO
//! must equal the octets received so far, and the message length is the MO
//! of the last segment plus its payload (§5.4). Buffers belong to the
//! engine and are reached through [`RxResources`], so this state never
//! allocates.
//!
//! MSN window: RFC 5041 §7.1 check 5 allows MSNs from the first to the last
//! available buffer of the queue. Over one in-order TCP stream every
//! message before the expected one has been delivered, and a later one can
//! only arrive after it, so the expected MSN (the head of that window) is
//! the only acceptable value. No buffer at all is "no buffer available"
//! (row 1); any other MSN is "MSN range is not valid" (row 3), as Linux siw
//! reports it.
//!
//! Tagged segments are checked in the order of RFC 5041 §7.1: the STag via
//! [`RxResources::tagged_lookup`] (valid, associated with this stream's PD
//! and stream, access rights; the engine owns the memory table), then TO
//! wrap, then base and bounds. Zero-length tagged segments are not checked
//! (§5.2, A.5 #6). One tagged and any number of untagged messages (one per
//! queue) may be in progress at once, so Read Response segments may
//! interleave with Send segments (A.4.2); two tagged messages may not, as in
//! siw.
//!
//! After the first error the stream places nothing more (§7.1): every later
//! call returns the same cause with [`ErrorKind::Stopped`].

use core::fmt;

use crate::wire::cause::{self, TermCause};
use crate::wire::ddp::{Addr, Header, Segment};
use crate::wire::rdmap::{Config, Queue, ReadRequest};
use crate::wire::terminate::{self, Offending};

/// The engine's handle for a posted untagged buffer (e.g. a receive WQE).
pub type BufferId = u64;

/// A posted untagged buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UntaggedBuf {
    pub id: BufferId,
    /// Octets the message may fill.
    pub capacity: u32,
}

/// The legal TO range of a tagged buffer: `[base, base + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaggedRegion {
    /// The engine's handle for the region (memory table entry).
    pub handle: u64,
    /// First legal TO.
    pub base: u64,
    pub len: u64,
}

/// What [`DdpRx`] needs from the engine: its receive queues and its memory
/// table. Errors are Terminate causes, so the engine picks the code.
pub trait RxResources {
    /// The buffer the next message on `queue` will fill, without consuming
    /// it. `Err` when none is posted: normally
    /// [`cause::DDP_ERR_U_NO_BUFFER`] (row 1); for QN 1 past the IRD the
    /// catalogue suggests [`cause::RDMAP_ERR_CATASTROPHIC_STREAM`] (row 19,
    /// Linux siw's choice).
    fn untagged_head(&mut self, queue: Queue) -> Result<UntaggedBuf, TermCause>;

    /// The head buffer of `queue` is now taken by a message: pop it.
    fn untagged_consume(&mut self, queue: Queue);

    /// Look up a tagged buffer for `len > 0` octets of a message whose RDMAP
    /// control octet is `ulp_ctrl` (Write needs remote write; a Read Response
    /// lands in a local sink). Return the region, or:
    /// unknown / invalidated STag -> [`cause::DDP_ERR_T_INVALID_STAG`] (row 8);
    /// other PD or stream -> [`cause::DDP_ERR_T_STAG_NOT_ASSOCIATED`] (row 10);
    /// missing access right -> [`cause::DDP_ERR_T_INVALID_STAG`] (row 12: DDP
    /// has no access-rights code, catalogue A.5 #5, as Linux siw).
    /// TO wrap and bounds are checked here, against the returned region.
    fn tagged_lookup(&mut self, stag: u32, ulp_ctrl: u8) -> Result<TaggedRegion, TermCause>;
}

/// Where this segment's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// At `offset` (= MO) into untagged buffer `buf`.
    Untagged { queue: Queue, buf: BufferId, offset: u32 },
    /// At `to`, which is `offset` octets into region `handle`.
    Tagged {
        stag: u32,
        handle: u64,
        to: u64,
        offset: u64,
    },
}

/// A DDP message is complete: its last segment (L = 1) has been placed and,
/// since segments arrive in order, all earlier ones too (RFC 5041 §5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivered {
    /// Untagged message `msn` on `queue`, `len` octets in buffer `buf`.
    /// `ulp_ctrl` and `inv_stag` are RsvdULP as received (first segment).
    Untagged {
        queue: Queue,
        msn: u32,
        buf: BufferId,
        len: u32,
        ulp_ctrl: u8,
        inv_stag: u32,
    },
    /// Tagged message: `len` octets from `first_to` under `stag`.
    Tagged {
        stag: u32,
        ulp_ctrl: u8,
        first_to: u64,
        len: u64,
    },
}

/// Outcome of one accepted segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Accepted {
    /// `None` for a zero-length segment.
    pub place: Option<Placement>,
    pub delivered: Option<Delivered>,
}

/// What went wrong (the Terminate is in [`Error::cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// QN not enabled (row 5).
    InvalidQn { qn: u32 },
    /// [`RxResources::untagged_head`] had no buffer (row 1, or row 19).
    NoBuffer { queue: Queue },
    /// MSN is not the expected one (row 3).
    MsnRange { queue: Queue, expected: u32, got: u32 },
    /// MO is not the number of octets received so far (row 4).
    InvalidMo { queue: Queue, expected: u32, got: u32 },
    /// MO + payload exceeds the buffer (row 2).
    TooLong { queue: Queue, capacity: u32, need: u64 },
    /// [`RxResources::tagged_lookup`] refused the STag (rows 8, 10, 12).
    Stag { stag: u32 },
    /// TO below the region base or TO + length past its end (row 9).
    BaseBounds { stag: u32, to: u64, len: u64 },
    /// TO + length wraps 2^64 (row 11).
    ToWrap { stag: u32, to: u64, len: u64 },
    /// A later segment of a tagged message names another STag.
    StagChanged { expected: u32, got: u32 },
    /// A later segment of a tagged message does not continue at the TO
    /// where the previous one ended.
    ToDiscontinuous { expected: u64, got: u64 },
    /// The RDMAP control octet changed within one message.
    UlpCtrlChanged { expected: u8, got: u8 },
    /// An earlier segment failed; nothing is placed any more (RFC 5041 §7.1).
    /// Do not send a second Terminate (RDMAP-TRM-02).
    Stopped,
}

/// A receive error and the Terminate it calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Error {
    pub cause: TermCause,
    pub kind: ErrorKind,
}

impl Error {
    /// The cause each kind maps to when the engine did not choose it:
    ///
    /// | kind | cause | matrix A.4.6 |
    /// |---|---|---|
    /// | InvalidQn | 1/2/0x01 | row 5 |
    /// | MsnRange | 1/2/0x03 | row 3 |
    /// | InvalidMo | 1/2/0x04 | row 4 |
    /// | TooLong | 1/2/0x05 (siw sends 0x02) | row 2 |
    /// | BaseBounds | 1/1/0x01 | row 9 |
    /// | ToWrap | 1/1/0x03 | row 11 |
    /// | StagChanged | 1/1/0x00 (unspecified; siw's choice) | - |
    /// | ToDiscontinuous | 1/1/0x01 (unspecified; siw's choice) | - |
    /// | UlpCtrlChanged | 0/2/0x06 (unspecified; an opcode change) | - |
    const fn new(cause: TermCause, kind: ErrorKind) -> Error {
        Error { cause, kind }
    }

    const fn of(kind: ErrorKind) -> Error {
        let cause = match kind {
            ErrorKind::InvalidQn { .. } => cause::DDP_ERR_U_INVALID_QN,
            ErrorKind::MsnRange { .. } => cause::DDP_ERR_U_MSN_RANGE,
            ErrorKind::InvalidMo { .. } => cause::DDP_ERR_U_INVALID_MO,
            ErrorKind::TooLong { .. } => cause::DDP_ERR_U_TOO_LONG,
            ErrorKind::BaseBounds { .. } | ErrorKind::ToDiscontinuous { .. } => cause::DDP_ERR_T_BASE_BOUNDS,
            ErrorKind::ToWrap { .. } => cause::DDP_ERR_T_TO_WRAP,
            ErrorKind::StagChanged { .. } | ErrorKind::Stag { .. } => cause::DDP_ERR_T_INVALID_STAG,
            ErrorKind::UlpCtrlChanged { .. } => cause::RDMAP_ERR_UNEXPECTED_OPCODE,
            ErrorKind::NoBuffer { .. } => cause::DDP_ERR_U_NO_BUFFER,
            ErrorKind::Stopped => cause::DDP_LOCAL_CATASTROPHIC_ERR,
        };
        Error { cause, kind }
    }

    /// Whether this repeats an earlier error (send no Terminate for it).
    pub const fn is_repeat(&self) -> bool {
        matches!(self.kind, ErrorKind::Stopped)
    }

    /// The Terminate for this error: M and D with the offending ULPDU's DDP
    /// header; R with `rreq` only for RDMAP-layer causes the engine chose
    /// (e.g. row 19), never for DDP-layer ones (RFC 5040 Fig. 10).
    pub fn terminate(&self, offending_ulpdu: &[u8], rreq: Option<&ReadRequest>) -> terminate::Repr {
        terminate::Repr::for_error(self.cause, Offending::from_ulpdu(offending_ulpdu), rreq)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.cause)
    }
}

/// The untagged message in progress on one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Partial {
    msn: u32,
    buf: UntaggedBuf,
    /// Octets received so far = the next expected MO.
    received: u32,
    ulp_ctrl: u8,
    inv_stag: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QueueState {
    expected_msn: u32,
    partial: Option<Partial>,
}

/// The tagged message in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TaggedPartial {
    stag: u32,
    ulp_ctrl: u8,
    first_to: u64,
    next_to: u64,
    total: u64,
}

/// Receive-side DDP state of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdpRx {
    cfg: Config,
    queues: [QueueState; 4],
    tagged: Option<TaggedPartial>,
    failed: Option<TermCause>,
}

impl DdpRx {
    /// Every queue expects MSN 1 (RFC 5041 §4.3).
    pub const fn new(cfg: Config) -> DdpRx {
        let q = QueueState {
            expected_msn: 1,
            partial: None,
        };
        DdpRx {
            cfg,
            queues: [q; 4],
            tagged: None,
            failed: None,
        }
    }

    pub const fn config(&self) -> &Config {
        &self.cfg
    }

    /// MSN of the next message expected on `queue`.
    pub const fn expected_msn(&self, queue: Queue) -> u32 {
        self.queues[queue.index()].expected_msn
    }

    /// Whether a message on `queue` has started but not completed.
    pub const fn untagged_in_progress(&self, queue: Queue) -> bool {
        self.queues[queue.index()].partial.is_some()
    }

    pub const fn tagged_in_progress(&self) -> bool {
        self.tagged.is_some()
    }

    /// The first error, once one happened.
    pub const fn failed(&self) -> Option<TermCause> {
        self.failed
    }

    /// Check and account one segment whose payload is `payload_len` octets.
    pub fn receive<R: RxResources + ?Sized>(
        &mut self,
        header: &Header,
        payload_len: usize,
        res: &mut R,
    ) -> Result<Accepted, Error> {
        if let Some(cause) = self.failed {
            return Err(Error::new(cause, ErrorKind::Stopped));
        }
        // A ULPDU is at most 65535 octets; saturate rather than trust it.
        let len = u64::try_from(payload_len).unwrap_or(u64::MAX);
        let r = match header.addr {
            Addr::Untagged { qn, msn, mo, inv_stag } => {
                self.untagged(qn, msn, mo, inv_stag, header.last, header.rdmap_ctrl, len, res)
            }
            Addr::Tagged { stag, to } => self.tagged(stag, to, header.last, header.rdmap_ctrl, len, res),
        };
        if let Err(e) = r {
            self.failed = Some(e.cause);
        }
        r
    }

    /// [`DdpRx::receive`] for a parsed segment.
    pub fn receive_segment<R: RxResources + ?Sized>(
        &mut self,
        seg: &Segment<'_>,
        res: &mut R,
    ) -> Result<Accepted, Error> {
        self.receive(&seg.header, seg.payload.len(), res)
    }

    /// RFC 5041 §7.1 untagged checks: QN (1), buffer (2), MSN (5), MO (3),
    /// MO + length (4). Zero-length segments are checked too: a zero-length
    /// Send still consumes a buffer (RDMAP-SND-01).
    #[allow(clippy::too_many_arguments)]
    fn untagged<R: RxResources + ?Sized>(
        &mut self,
        qn: u32,
        msn: u32,
        mo: u32,
        inv_stag: u32,
        last: bool,
        ulp_ctrl: u8,
        len: u64,
        res: &mut R,
    ) -> Result<Accepted, Error> {
        let queue = Queue::from_qn(qn, &self.cfg).ok_or(Error::of(ErrorKind::InvalidQn { qn }))?;
        let st = &mut self.queues[queue.index()];
        let (partial, new) = match st.partial {
            Some(p) => {
                if msn != p.msn {
                    return Err(Error::of(ErrorKind::MsnRange {
                        queue,
                        expected: p.msn,
                        got: msn,
                    }));
                }
                if ulp_ctrl != p.ulp_ctrl {
                    return Err(Error::of(ErrorKind::UlpCtrlChanged {
                        expected: p.ulp_ctrl,
                        got: ulp_ctrl,
                    }));
                }
                (p, false)
            }
            None => {
                let buf = res
                    .untagged_head(queue)
                    .map_err(|c| Error::new(c, ErrorKind::NoBuffer { queue }))?;
                if msn != st.expected_msn {
                    return Err(Error::of(ErrorKind::MsnRange {
                        queue,
                        expected: st.expected_msn,
                        got: msn,
                    }));
                }
                (
                    Partial {
                        msn,
                        buf,
                        received: 0,
                        ulp_ctrl,
                        inv_stag,
                    },
                    true,
                )
            }
        };
        if mo != partial.received {
            return Err(Error::of(ErrorKind::InvalidMo {
                queue,
                expected: partial.received,
                got: mo,
            }));
        }
        let end = u64::from(mo).saturating_add(len);
        let capacity = partial.buf.capacity;
        let received = match u32::try_from(end) {
            Ok(e) if e <= capacity => e,
            _ => {
                return Err(Error::of(ErrorKind::TooLong {
                    queue,
                    capacity,
                    need: end,
                }));
            }
        };
        if new {
            res.untagged_consume(queue);
        }
        let place = (len > 0).then_some(Placement::Untagged {
            queue,
            buf: partial.buf.id,
            offset: mo,
        });
        let delivered = if last {
            st.partial = None;
            st.expected_msn = st.expected_msn.wrapping_add(1);
            Some(Delivered::Untagged {
                queue,
                msn,
                buf: partial.buf.id,
                len: received,
                ulp_ctrl: partial.ulp_ctrl,
                inv_stag: partial.inv_stag,
            })
        } else {
            st.partial = Some(Partial { received, ..partial });
            None
        };
        Ok(Accepted { place, delivered })
    }

    /// RFC 5041 §7.1 tagged checks for `len > 0`: STag (1, 2, via the
    /// engine), TO wrap (5), TO and TO + length inside the region (3, 4). The
    /// wrap check comes before bounds so that row 11 reports TO wrap.
    fn tagged<R: RxResources + ?Sized>(
        &mut self,
        stag: u32,
        to: u64,
        last: bool,
        ulp_ctrl: u8,
        len: u64,
        res: &mut R,
    ) -> Result<Accepted, Error> {
        if let Some(t) = self.tagged {
            // RFC 5041 §4.2: every segment of a message carries the same
            // STag; TO advances by the payload (§5.2, segments in order).
            if stag != t.stag {
                return Err(Error::of(ErrorKind::StagChanged {
                    expected: t.stag,
                    got: stag,
                }));
            }
            if ulp_ctrl != t.ulp_ctrl {
                return Err(Error::of(ErrorKind::UlpCtrlChanged {
                    expected: t.ulp_ctrl,
                    got: ulp_ctrl,
                }));
            }
            if to != t.next_to {
                return Err(Error::of(ErrorKind::ToDiscontinuous {
                    expected: t.next_to,
                    got: to,
                }));
            }
        }
        let mut next_to = to;
        let place = if len > 0 {
            let region = res
                .tagged_lookup(stag, ulp_ctrl)
                .map_err(|c| Error::new(c, ErrorKind::Stag { stag }))?;
            let end = to
                .checked_add(len)
                .ok_or(Error::of(ErrorKind::ToWrap { stag, to, len }))?;
            let bounds = Error::of(ErrorKind::BaseBounds { stag, to, len });
            let offset = to.checked_sub(region.base).ok_or(bounds)?;
            if offset.checked_add(len).is_none_or(|e| e > region.len) {
                return Err(bounds);
            }
            next_to = end;
            Some(Placement::Tagged {
                stag,
                handle: region.handle,
                to,
                offset,
            })
        } else {
            None
        };
        let (first_to, total) = match self.tagged {
            Some(t) => (
                t.first_to,
                t.total
                    .checked_add(len)
                    .ok_or(Error::of(ErrorKind::ToWrap { stag, to, len }))?,
            ),
            None => (to, len),
        };
        let delivered = if last {
            self.tagged = None;
            Some(Delivered::Tagged {
                stag,
                ulp_ctrl,
                first_to,
                len: total,
            })
        } else {
            self.tagged = Some(TaggedPartial {
                stag,
                ulp_ctrl,
                first_to,
                next_to,
                total,
            });
            None
        };
        Ok(Accepted { place, delivered })
    }

    #[cfg(test)]
    fn set_expected_msn(&mut self, queue: Queue, msn: u32) {
        self.queues[queue.index()].expected_msn = msn;
    }
}

#[cfg(test)]
#[path = "ddp_rx_tests.rs"]
mod tests;
