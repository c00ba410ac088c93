//! MPA connection setup, sans-I/O: RFC 5044 §7.1 (startup rules, §7.1.2
//! rules 1-10) and RFC 6581 (§9.1 IRD/ORD negotiation, §9.2 peer-to-peer
//! and RTR selection, §10 interoperability between enhanced and plain
//! endpoints).
//!
//! One [`Mpa`] per TCP connection, driven quinn-proto style by the
//! connection engine:
//!
//! * inputs: [`Mpa::handle_bytes`] (TCP octets; consumes exactly the
//!   Request/Reply frame and never an octet beyond it, which is FPDU data),
//!   [`Mpa::handle_timeout`], and at the Responder the ULP decision
//!   [`Mpa::accept`] / [`Mpa::reject`];
//! * outputs, drained after every input: [`Mpa::poll_transmit`] (frame
//!   octets for TCP), [`Mpa::poll_event`] ([`Event::ConnectRequest`],
//!   [`Event::Negotiated`], [`Event::Rejected`]) and [`Mpa::poll_timeout`].
//!
//! No I/O, no clock reads (every time-dependent call takes `now`), no
//! logging. Errors from peer input or timeouts are sticky (the same error
//! comes back from every later input call); API misuse errors are not.
//! After an error, still drain [`Mpa::poll_transmit`] (a Reject Reply may be
//! queued) and look at [`Mpa::terminate_to_send`] (RFC 6581 errors detected
//! by the Initiator after a valid Reply are reported with a Terminate FPDU).
//!
//! Defaults follow what Linux siw sends as Initiator
//! (`peers-and-interop-facts.md` §1.2): Rev 2, S set, C clear, M clear,
//! private data = 4 IRD/ORD octets + ULP data; Reply timeout 5 s, Request
//! timeout 10 s. Where siw and RFC 6581 differ (siw's "relaxed" IRD/ORD
//! rules, siw refusing markers) the RFC is the default and siw's behaviour is
//! a switch in [`MpaConfig`].

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::wire::cause::{
    MPA_ERR_CONNECTION_LOST, MPA_ERR_INSUFFICIENT_IRD, MPA_ERR_INVALID_REQ_REP, MPA_ERR_LOCAL_CATASTROPHIC,
    MPA_ERR_NO_MATCHING_RTR, TermCause,
};
use crate::wire::fpdu::{Deframer, DeframerConfig, Framer};
use crate::wire::mpa::{
    self, ENHANCED_DATA_LEN, EnhancedData, FrameKind, HEADER_LEN, IRD_ORD_MAX, IRD_ORD_NO_NEGOTIATION,
    MAX_PRIVATE_DATA, Repr, Revision, Rtr, RtrSet,
};

#[cfg(test)]
#[path = "mpa_tests.rs"]
mod tests;

/// Which end of the MPA startup this is (RFC 5044 §7.1: the Initiator
/// sends the Request, whatever side opened TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sends the MPA Request, reads the Reply.
    Initiator,
    /// Reads the MPA Request, sends the Reply.
    Responder,
}

/// Local MPA policy. `Default` is what Linux siw does as Initiator, with
/// RFC-conforming choices where siw deviates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaConfig {
    /// Initiator: the revision sent (1 or 2). Responder: the highest
    /// revision accepted (a Responder answers with the Request's revision,
    /// as siw does).
    pub revision: u8,
    /// RFC 6581 enhanced setup (S flag and the IRD/ORD block). Initiator:
    /// send it (needs `revision` 2). Responder: accept it; if false, an
    /// enhanced Request is refused as RFC 6581 §10 prescribes for
    /// unenhanced responders.
    pub enhanced: bool,
    /// Ask for CRCs (C). CRCs are used if either side asks (RFC 5044
    /// §7.1.1 "C"). siw does not ask; RFC 5044 §4.4 wants CRCs by default
    /// unless an administrator says otherwise, so set this where the link
    /// is not otherwise protected.
    pub crc: bool,
    /// Set M: require the peer to insert markers in what we receive.
    /// Off for interop (siw refuses M=1); for tests of the marker path.
    pub require_markers: bool,
    /// Refuse peers that set M (as Linux siw does: a Responder replies with
    /// R=1, an Initiator fails). Off by default: RFC 5044 §4.3 "All MPA
    /// senders MUST be able to generate Markers when their use is declared
    /// by the opposing receiver".
    pub reject_markers: bool,
    /// Accept a Rev 0 (pre-IETF) Request, as siw does.
    pub accept_rev0: bool,
    /// Receive limit on PD_Length, IRD/ORD octets included; capped at
    /// RFC 5044's 512 (siw uses 256).
    pub max_private_data_rx: usize,
    /// Send limit on PD_Length, IRD/ORD octets included; capped at 512.
    /// Set 256 when the peer may be Linux siw (user PD <= 252 with Rev 2).
    pub max_private_data_tx: usize,
    /// Initiator: request the peer-to-peer model (control flag A) and an
    /// RTR. siw's default is false.
    pub p2p: bool,
    /// Initiator: RTR types offered when `p2p` (siw offers Write and Read).
    pub rtr_offer: RtrSet,
    /// Responder: RTR types we can receive.
    pub rtr_support: RtrSet,
    /// siw's `relaxed_ird_negotiation`: an Initiator raises its IRD up to
    /// `max_ird` to meet the Responder's ORD instead of failing; a
    /// Responder raises its IRD up to `max_ird` to meet the Initiator's ORD
    /// and never rejects for lack of peer IRD.
    pub relaxed_ird: bool,
    /// Device limit on IRD (siw: 128), used when raising IRD.
    pub max_ird: u16,
    /// The ORD the ULP cannot do without (default 0). Strict mode: a
    /// Responder rejects (R=1, ORD = this value, RFC 6581 §9.1) and an
    /// Initiator fails with "insufficient IRD" if the peer's IRD is lower.
    pub required_ord: u16,
    /// Initiator: how long to wait for the Reply (siw `MPAREP_TIMEOUT` 5 s).
    pub reply_timeout: Duration,
    /// Responder: how long to wait for the Request (siw `MPAREQ_TIMEOUT`
    /// 10 s), RFC 5044 §7.1.2 rules 8 and 10.
    pub request_timeout: Duration,
    /// Responder: how long the ULP may take to accept or reject (none by
    /// default, as siw).
    pub accept_timeout: Option<Duration>,
}

impl Default for MpaConfig {
    fn default() -> Self {
        MpaConfig {
            revision: 2,
            enhanced: true,
            crc: false,
            require_markers: false,
            reject_markers: false,
            accept_rev0: true,
            max_private_data_rx: MAX_PRIVATE_DATA,
            max_private_data_tx: MAX_PRIVATE_DATA,
            p2p: false,
            rtr_offer: RtrSet::WRITE.union(RtrSet::READ),
            rtr_support: RtrSet::ALL,
            relaxed_ird: false,
            max_ird: 128,
            required_ord: 0,
            reply_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            accept_timeout: None,
        }
    }
}

impl MpaConfig {
    /// The configuration that mirrors Linux siw's compile-time defaults,
    /// including its relaxed IRD/ORD rules, marker refusal and 256-octet
    /// private data limit.
    pub fn siw() -> MpaConfig {
        MpaConfig {
            reject_markers: true,
            relaxed_ird: true,
            max_private_data_rx: mpa::SIW_MAX_PRIVATE_DATA,
            max_private_data_tx: mpa::SIW_MAX_PRIVATE_DATA,
            ..MpaConfig::default()
        }
    }

    fn validate(&self, role: Role) -> Result<(), MpaError> {
        if !(1..=2).contains(&self.revision) {
            return Err(MpaError::InvalidParam("revision must be 1 or 2"));
        }
        if role == Role::Initiator && self.enhanced && self.revision < 2 {
            return Err(MpaError::InvalidParam("enhanced setup needs revision 2"));
        }
        if role == Role::Initiator && self.p2p && !self.enhanced {
            return Err(MpaError::InvalidParam("peer-to-peer needs enhanced setup"));
        }
        if role == Role::Initiator && self.p2p && self.rtr_offer.is_empty() {
            return Err(MpaError::InvalidParam("peer-to-peer needs at least one RTR type"));
        }
        if self.max_ird > IRD_ORD_MAX || self.required_ord > IRD_ORD_MAX {
            return Err(MpaError::InvalidParam("IRD/ORD limits are 14-bit values"));
        }
        Ok(())
    }

    fn pd_tx_limit(&self) -> usize {
        self.max_private_data_tx.min(MAX_PRIVATE_DATA)
    }
}

/// Local RDMA Read resources offered or used (RFC 6581 §9.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read Requests we can queue (rdma_cm
    /// `responder_resources`). 0x3FFF: do not negotiate.
    pub ird: u16,
    /// Outbound RDMA Read Requests we want outstanding (rdma_cm
    /// `initiator_depth`). 0x3FFF: do not negotiate.
    pub ord: u16,
}

impl IrdOrd {
    fn validate(&self) -> Result<(), MpaError> {
        if self.ird > IRD_ORD_MAX || self.ord > IRD_ORD_MAX {
            return Err(MpaError::InvalidParam("IRD and ORD are 14-bit values"));
        }
        Ok(())
    }
}

/// How FPDUs are framed in each direction once MPA is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Framing {
    /// CRC32c generated and checked (either side set C).
    pub crc: bool,
    /// We insert markers on transmit (the peer set M).
    pub markers_tx: bool,
    /// The peer inserts markers (we set M).
    pub markers_rx: bool,
}

impl Framing {
    /// A framer for our transmit half, positioned after our MPA frame.
    pub fn framer(&self) -> Framer {
        Framer::new(self.crc, self.markers_tx)
    }
    /// A deframer for our receive half, positioned after the peer's frame.
    pub fn deframer(&self, max_ulpdu_len: u16) -> Deframer {
        Deframer::new(DeframerConfig {
            crc: self.crc,
            markers: self.markers_rx,
            max_ulpdu_len,
        })
    }
}

/// A Request as the Responder's ULP sees it ([`Event::ConnectRequest`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The Request's revision (the Reply will carry the same).
    pub revision: Revision,
    /// The Initiator asked for CRCs.
    pub crc: bool,
    /// The Initiator requires markers (we will insert them).
    pub markers: bool,
    /// The Initiator's RFC 6581 IRD/ORD block, as sent (RFC 6581 §9.1: the
    /// peer's values MUST be passed to the ULP).
    pub enhanced: Option<EnhancedData>,
    /// ULP private data, without the IRD/ORD octets.
    pub private_data: Vec<u8>,
}

/// A Reply with R=1, as the Initiator's ULP sees it ([`Event::Rejected`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The Reply's revision.
    pub revision: Revision,
    /// The Responder's IRD/ORD block, if any (RFC 6581 §9.1: passed to the
    /// ULP for Reject too; a Responder short of ORD states what it needs).
    pub enhanced: Option<EnhancedData>,
    /// ULP private data, without the IRD/ORD octets.
    pub private_data: Vec<u8>,
}

/// The outcome of a successful negotiation: everything the connection
/// engine needs to enter Full Operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Our role.
    pub role: Role,
    /// The revision in use.
    pub revision: Revision,
    /// RFC 6581 enhanced setup took place.
    pub enhanced: bool,
    /// CRC and markers per direction.
    pub framing: Framing,
    /// Inbound RDMA Read Requests we must be able to queue (our IRD).
    pub ird: u16,
    /// Outbound RDMA Read Requests we may have outstanding (our ORD).
    pub ord: u16,
    /// The peer's IRD/ORD block as sent (RFC 6581 §9.1), if any.
    pub peer: Option<EnhancedData>,
    /// Peer-to-peer model (RFC 6581 §9.2 control flag A).
    pub p2p: bool,
    /// The RTR agreed in peer-to-peer mode: the Initiator sends it as its
    /// first FPDU and nothing before it (RFC 6581 §5); the Responder must
    /// receive it (check with [`check_rtr`]) before sending anything, and
    /// answers a Read RTR with a zero-length Read Response.
    pub rtr: Option<Rtr>,
    /// The peer's ULP private data, without the IRD/ORD octets.
    pub private_data: Vec<u8>,
}

impl Negotiated {
    /// The RTR this end must send first (Initiator in peer-to-peer mode).
    pub fn rtr_to_send(&self) -> Option<Rtr> {
        if self.role == Role::Initiator { self.rtr } else { None }
    }
    /// The RTR this end must receive before sending (Responder, p2p).
    pub fn rtr_to_receive(&self) -> Option<Rtr> {
        if self.role == Role::Responder { self.rtr } else { None }
    }
    /// Whether this end must wait for the peer's first FPDU before sending
    /// any: always for the Responder (RFC 5044 §7.1.2 rule 4; with RTRs the
    /// first FPDU is the RTR, RFC 6581 §5).
    pub fn must_wait_for_peer(&self) -> bool {
        self.role == Role::Responder
    }
}

impl fmt::Display for Negotiated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MPA rev {} {:?}{} crc {} markers tx {} rx {} ird {} ord {}",
            u8::from(self.revision),
            self.role,
            if self.enhanced { " enhanced" } else { "" },
            self.framing.crc,
            self.framing.markers_tx,
            self.framing.markers_rx,
            self.ird,
            self.ord
        )?;
        if let Some(r) = self.rtr {
            write!(f, " peer2peer rtr {r}")?;
        } else if self.p2p {
            f.write_str(" peer2peer")?;
        }
        write!(f, " peer-pd {}", self.private_data.len())
    }
}

/// What the negotiation reports to the engine ([`Mpa::poll_event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Responder: a valid Request arrived; answer with [`Mpa::accept`] or
    /// [`Mpa::reject`].
    ConnectRequest(ConnectRequest),
    /// Both roles: MPA is done, enter Full Operation (after the RTR rules).
    Negotiated(Negotiated),
    /// Initiator: the Responder rejected (RFC 5044 §7.1.2 rule 3: exit MPA;
    /// the TCP connection is left to the ULP).
    Rejected(Rejected),
}

/// What a timed-out endpoint was waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Waiting {
    /// Initiator waiting for the Reply.
    Reply,
    /// Responder waiting for the Request.
    Request,
    /// Responder waiting for the local ULP to accept or reject.
    Decision,
}

/// A negotiation failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpaError {
    /// The peer's frame is improperly formatted (bad key, truncated,
    /// PD_Length too long, IRD/ORD block missing): RFC 5044 §7.1.2 rules 2,
    /// 3, 5, 9: close the TCP connection.
    #[error("invalid MPA frame: {0}")]
    Frame(#[from] mpa::Error),
    /// A Request where a Reply was expected or vice versa: RFC 5044 §7.1.2
    /// rule 8, Initiator/Initiator or Responder/Responder startup.
    #[error("expected an MPA {expected}, got an MPA {got}")]
    UnexpectedFrame {
        /// The frame the state expected.
        expected: FrameKind,
        /// The frame that came.
        got: FrameKind,
    },
    /// RFC 5044 §7.1.1 "Rev": a revision we cannot interoperate with.
    #[error("unsupported MPA revision {}", u8::from(*.0))]
    BadRevision(Revision),
    /// RFC 6581 §10: an enhanced Request to a Responder configured without
    /// enhanced setup, or an unenhanced Reply to an enhanced Request.
    #[error("enhanced (RFC 6581) setup mismatch")]
    EnhancedMismatch,
    /// The peer requires markers and `reject_markers` is set (siw
    /// behaviour). A Responder has queued a Reply with R=1.
    #[error("peer requires MPA markers, refused by configuration")]
    MarkersRequired,
    /// RFC 6581 §9.1: not enough IRD (Initiator: the Responder's ORD
    /// exceeds what we can take; Responder: the Initiator's IRD is below
    /// `required_ord`, a Reply with R=1 is queued).
    #[error("insufficient IRD: peer ird {peer_ird} ord {peer_ord}, local ird {ird} ord {ord}")]
    InsufficientIrd {
        /// The peer's IRD.
        peer_ird: u16,
        /// The peer's ORD.
        peer_ord: u16,
        /// Our IRD.
        ird: u16,
        /// Our ORD.
        ord: u16,
    },
    /// RFC 6581 §9.2: no RTR type both ends support.
    #[error("no matching RTR type (offered {offered}, peer supports {peer})")]
    NoMatchingRtr {
        /// The RTR types we offered.
        offered: RtrSet,
        /// The RTR types the peer supports.
        peer: RtrSet,
    },
    /// RFC 5044 §7.1.2 rule 10 timeout.
    #[error("MPA negotiation timed out waiting for the {0:?}")]
    TimedOut(Waiting),
    /// Local misuse: a call that the current state does not allow.
    #[error("MPA API misuse: {0}")]
    InvalidState(&'static str),
    /// Local misuse: a bad parameter or configuration.
    #[error("invalid MPA parameter: {0}")]
    InvalidParam(&'static str),
    /// Local misuse: our private data exceeds the send limit.
    #[error("private data too long: {len} octets (IRD/ORD included), limit {max}")]
    PrivateDataTooLong {
        /// Its length, IRD/ORD octets included.
        len: usize,
        /// The send limit.
        max: usize,
    },
}

impl MpaError {
    /// The RFC 5044 §8 / RFC 6581 §8 code that describes this error.
    pub fn cause(&self) -> TermCause {
        match self {
            MpaError::Frame(_)
            | MpaError::UnexpectedFrame { .. }
            | MpaError::BadRevision(_)
            | MpaError::EnhancedMismatch
            | MpaError::MarkersRequired => MPA_ERR_INVALID_REQ_REP,
            MpaError::InsufficientIrd { .. } => MPA_ERR_INSUFFICIENT_IRD,
            MpaError::NoMatchingRtr { .. } => MPA_ERR_NO_MATCHING_RTR,
            MpaError::TimedOut(_) => MPA_ERR_CONNECTION_LOST,
            MpaError::InvalidState(_) | MpaError::InvalidParam(_) | MpaError::PrivateDataTooLong { .. } => {
                MPA_ERR_LOCAL_CATASTROPHIC
            }
        }
    }

    /// Whether this is local API misuse (the negotiation state is intact).
    pub fn is_local(&self) -> bool {
        matches!(
            self,
            MpaError::InvalidState(_) | MpaError::InvalidParam(_) | MpaError::PrivateDataTooLong { .. }
        )
    }
}

/// RDMAP opcodes an RTR can use (RFC 5040 §4.3); kept here so this module
/// needs no other wire module.
mod opcode {
    pub const WRITE: u8 = 0x0;
    pub const READ_REQUEST: u8 = 0x1;
    pub const SEND: u8 = 0x3;
    pub const SEND_SE: u8 = 0x5;
}

/// Checks the first message a peer-to-peer Responder receives against the
/// agreed RTR (RFC 6581 §9.2, §9.3): `opcode` is the RDMAP opcode,
/// `tagged` the DDP T bit and `len` the message length (for a Read Request
/// its RDMA Read Message Size). A zero-length Send RTR may carry the
/// Solicited Event bit. Any mismatch is `MPA_ERR_NO_MATCHING_RTR`.
pub fn check_rtr(expected: Rtr, opcode: u8, tagged: bool, len: u64) -> Result<(), TermCause> {
    let ok = len == 0
        && match expected {
            Rtr::Send => !tagged && (opcode == opcode::SEND || opcode == opcode::SEND_SE),
            Rtr::Write => tagged && opcode == opcode::WRITE,
            Rtr::Read => !tagged && opcode == opcode::READ_REQUEST,
        };
    if ok { Ok(()) } else { Err(MPA_ERR_NO_MATCHING_RTR) }
}

/// What the Initiator sent, kept to judge the Reply.
#[derive(Debug, Clone)]
struct Sent {
    revision: Revision,
    enhanced: Option<EnhancedData>,
    local: IrdOrd,
}

/// The Request being decided on by the Responder's ULP.
#[derive(Debug, Clone)]
struct Pending {
    revision: Revision,
    crc: bool,
    markers: bool,
    enhanced: Option<EnhancedData>,
    private_data: Vec<u8>,
}

#[derive(Debug, Clone)]
enum State {
    AwaitReply(Sent),
    AwaitRequest,
    AwaitDecision(Pending),
    Established,
    Rejected,
    Failed(MpaError),
}

/// One MPA negotiation (one TCP connection's startup phase).
#[derive(Debug)]
pub struct Mpa {
    role: Role,
    cfg: MpaConfig,
    state: State,
    /// The peer's frame as it arrives (header, then private data); at most
    /// [`mpa::MAX_FRAME_LEN`] octets.
    rx: Vec<u8>,
    tx: Vec<u8>,
    events: VecDeque<Event>,
    deadline: Option<Instant>,
    framing: Option<Framing>,
    terminate: Option<TermCause>,
}

impl Mpa {
    /// Starts the Initiator side: queues the MPA Request (RFC 5044 §7.1.2
    /// rule 1) carrying `local` IRD/ORD (when enhanced) and the ULP's
    /// `private_data`, and arms the Reply timer.
    pub fn initiator(now: Instant, cfg: MpaConfig, local: IrdOrd, private_data: &[u8]) -> Result<Mpa, MpaError> {
        cfg.validate(Role::Initiator)?;
        local.validate()?;
        let revision = Revision::from(cfg.revision);
        let enhanced = (cfg.enhanced && revision.allows_enhanced()).then(|| {
            let mut ord = local.ord;
            // siw (`siw_cm.c`): a P2P Initiator offering a Read RTR needs an
            // ORD of at least 1 to send it.
            if cfg.p2p && cfg.rtr_offer.contains(Rtr::Read) && ord == 0 {
                ord = 1;
            }
            EnhancedData {
                ird: local.ird,
                ord,
                p2p: cfg.p2p,
                rtr: if cfg.p2p { cfg.rtr_offer } else { RtrSet::EMPTY },
            }
        });
        let repr = Repr {
            kind: FrameKind::Request,
            markers: cfg.require_markers,
            crc: cfg.crc,
            reject: false,
            s_flag: enhanced.is_some(),
            reserved: 0,
            revision,
            enhanced,
            private_data,
        };
        check_pd_len(&repr, cfg.pd_tx_limit())?;
        let mut tx = Vec::with_capacity(repr.buffer_len());
        repr.emit_vec(&mut tx)?;
        let local = IrdOrd {
            ird: local.ird,
            ord: enhanced.map_or(local.ord, |e| e.ord),
        };
        Ok(Mpa {
            role: Role::Initiator,
            deadline: Some(now + cfg.reply_timeout),
            cfg,
            state: State::AwaitReply(Sent {
                revision,
                enhanced,
                local,
            }),
            rx: Vec::with_capacity(HEADER_LEN),
            tx,
            events: VecDeque::new(),
            framing: None,
            terminate: None,
        })
    }

    /// Starts the Responder side: waits for the Request (RFC 5044 §7.1.2
    /// rule 2), with the Request timer armed (rule 8).
    pub fn responder(now: Instant, cfg: MpaConfig) -> Result<Mpa, MpaError> {
        cfg.validate(Role::Responder)?;
        Ok(Mpa {
            role: Role::Responder,
            deadline: Some(now + cfg.request_timeout),
            cfg,
            state: State::AwaitRequest,
            rx: Vec::with_capacity(HEADER_LEN),
            tx: Vec::new(),
            events: VecDeque::new(),
            framing: None,
            terminate: None,
        })
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }
    /// The configuration.
    pub fn config(&self) -> &MpaConfig {
        &self.cfg
    }
    /// Negotiation finished successfully.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }
    /// Negotiation finished with a Reply with R=1 (sent or received).
    pub fn is_rejected(&self) -> bool {
        matches!(self.state, State::Rejected)
    }
    /// The sticky error, if negotiation failed.
    pub fn error(&self) -> Option<&MpaError> {
        match &self.state {
            State::Failed(e) => Some(e),
            _ => None,
        }
    }
    /// FPDU framing, known once the peer's frame (Initiator) or our Reply
    /// (Responder) settled it.
    pub fn framing(&self) -> Option<Framing> {
        self.framing
    }
    /// After a failure that RFC 6581 §9.1/§9.2 reports with a Terminate
    /// (the Initiator found insufficient IRD or no matching RTR in a valid
    /// Reply): the cause and the framing to send it with. Otherwise `None`:
    /// close the TCP connection (RFC 5044 §7.1.2).
    pub fn terminate_to_send(&self) -> Option<(TermCause, Framing)> {
        Some((self.terminate?, self.framing?))
    }

    /// Appends queued frame octets to `buf`; returns how many, or `None`.
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<usize> {
        if self.tx.is_empty() {
            return None;
        }
        let n = self.tx.len();
        buf.append(&mut self.tx);
        Some(n)
    }

    /// The next event for the engine.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Mpa::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Fires the negotiation timer if `now` reached it (RFC 5044 §7.1.2
    /// rule 10): the connection should be closed.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), MpaError> {
        if let State::Failed(e) = &self.state {
            return Err(e.clone());
        }
        match self.deadline {
            Some(d) if now >= d => {}
            _ => return Ok(()),
        }
        let waiting = match self.state {
            State::AwaitReply(_) => Waiting::Reply,
            State::AwaitRequest => Waiting::Request,
            State::AwaitDecision(_) => Waiting::Decision,
            _ => {
                self.deadline = None;
                return Ok(());
            }
        };
        Err(self.fail(MpaError::TimedOut(waiting)))
    }

    fn fail(&mut self, e: MpaError) -> MpaError {
        self.deadline = None;
        self.state = State::Failed(e.clone());
        e
    }

    /// Feeds TCP octets. Consumes at most the rest of the peer's Request or
    /// Reply and returns how many octets it took; octets after the frame
    /// are FPDUs (or a protocol violation, RFC 5044 §7.1.2 rule 4) and are
    /// left to the caller. Once the frame is complete, returns `Ok(0)`.
    pub fn handle_bytes(&mut self, now: Instant, data: &[u8]) -> Result<usize, MpaError> {
        let expected = match &self.state {
            State::Failed(e) => return Err(e.clone()),
            State::AwaitReply(_) => FrameKind::Reply,
            State::AwaitRequest => FrameKind::Request,
            _ => return Ok(0),
        };
        let mut used = 0;
        if self.rx.len() < HEADER_LEN {
            let n = (HEADER_LEN - self.rx.len()).min(data.len());
            self.rx.extend_from_slice(&data[..n]);
            used = n;
            if let Err(e) = check_key_prefix(&self.rx, expected) {
                return Err(self.fail(e));
            }
            if self.rx.len() < HEADER_LEN {
                return Ok(used);
            }
            // Header complete: fail fast on what needs no private data.
            if let Err(e) = self.check_header() {
                return Err(self.fail(e));
            }
        }
        // frame_len() is Some: the header is complete; check_header bounded it.
        let total = mpa::frame_len(&self.rx).unwrap_or(HEADER_LEN);
        let n = (total - self.rx.len()).min(data.len() - used);
        if self.rx.capacity() < total {
            self.rx.reserve_exact(total - self.rx.len());
        }
        self.rx.extend_from_slice(&data[used..used + n]);
        used += n;
        if self.rx.len() < total {
            return Ok(used);
        }
        let rx = core::mem::take(&mut self.rx);
        let r = match Repr::parse_exact(&rx, self.cfg.max_private_data_rx) {
            Ok(repr) => match self.role {
                Role::Responder => self.on_request(now, &repr),
                Role::Initiator => self.on_reply(&repr),
            },
            Err(e) => Err(MpaError::Frame(e)),
        };
        match r {
            Ok(()) => Ok(used),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn check_header(&self) -> Result<(), MpaError> {
        let f = mpa::Frame::new_unchecked(&self.rx[..]);
        let pd_len = usize::from(f.pd_length());
        let max = self.cfg.max_private_data_rx.min(MAX_PRIVATE_DATA);
        // RFC 5044 §7.1.2 rule 9.
        if pd_len > max {
            return Err(MpaError::Frame(mpa::Error::PrivateDataTooLong { len: pd_len, max }));
        }
        self.check_revision(f.revision())
    }

    fn check_revision(&self, rev: Revision) -> Result<(), MpaError> {
        // RFC 5044 §7.1.1 "Rev": close if we cannot interoperate.
        let limit = match &self.state {
            State::AwaitReply(sent) => u8::from(sent.revision),
            _ => self.cfg.revision,
        };
        let ok = match rev {
            Revision::V0 => self.cfg.accept_rev0,
            Revision::V1 | Revision::V2 => u8::from(rev) <= limit,
            Revision::Unknown(_) => false,
        };
        if ok { Ok(()) } else { Err(MpaError::BadRevision(rev)) }
    }

    fn on_request(&mut self, now: Instant, req: &Repr<'_>) -> Result<(), MpaError> {
        // RFC 6581 §10: an unenhanced Responder treats an enhanced Request
        // as improperly formatted.
        if req.enhanced.is_some() && !self.cfg.enhanced {
            return Err(MpaError::EnhancedMismatch);
        }
        if req.markers && self.cfg.reject_markers {
            // Linux siw: "MPA Markers: currently not supported" -> Reply
            // with R=1 (and IRD/ORD 0/0 when enhanced).
            let reply = Repr {
                kind: FrameKind::Reply,
                markers: false,
                crc: false,
                reject: true,
                s_flag: req.enhanced.is_some(),
                reserved: 0,
                revision: req.revision,
                enhanced: req.enhanced.map(|_| EnhancedData::default()),
                private_data: &[],
            };
            reply.emit_vec(&mut self.tx)?;
            return Err(MpaError::MarkersRequired);
        }
        let pending = Pending {
            revision: req.revision,
            crc: req.crc,
            markers: req.markers,
            enhanced: req.enhanced,
            private_data: req.private_data.to_vec(),
        };
        self.events.push_back(Event::ConnectRequest(ConnectRequest {
            revision: pending.revision,
            crc: pending.crc,
            markers: pending.markers,
            enhanced: pending.enhanced,
            private_data: pending.private_data.clone(),
        }));
        self.deadline = self.cfg.accept_timeout.map(|t| now + t);
        self.state = State::AwaitDecision(pending);
        Ok(())
    }

    fn on_reply(&mut self, rep: &Repr<'_>) -> Result<(), MpaError> {
        let State::AwaitReply(sent) = &self.state else {
            return Err(MpaError::InvalidState("not waiting for a Reply"));
        };
        let sent = sent.clone();
        // RFC 5044 §7.1.2 rule 3: a rejecting Reply ends MPA.
        if rep.reject {
            self.events.push_back(Event::Rejected(Rejected {
                revision: rep.revision,
                enhanced: rep.enhanced,
                private_data: rep.private_data.to_vec(),
            }));
            self.deadline = None;
            self.state = State::Rejected;
            return Ok(());
        }
        // RFC 6581 §10: an enhanced Responder MUST answer enhanced.
        if sent.enhanced.is_some() && rep.enhanced.is_none() {
            return Err(MpaError::EnhancedMismatch);
        }
        if rep.markers && self.cfg.reject_markers {
            return Err(MpaError::MarkersRequired);
        }
        let framing = Framing {
            crc: self.cfg.crc || rep.crc,
            markers_tx: rep.markers,
            markers_rx: self.cfg.require_markers,
        };
        // From here on both ends are in Full Operation: failures are
        // reported with a Terminate (RFC 6581 §9.1, §9.2).
        self.framing = Some(framing);
        let mut out = Negotiated {
            role: Role::Initiator,
            revision: rep.revision,
            enhanced: false,
            framing,
            ird: sent.local.ird,
            ord: sent.local.ord,
            peer: None,
            p2p: false,
            rtr: None,
            private_data: rep.private_data.to_vec(),
        };
        if let (Some(mine), Some(theirs)) = (sent.enhanced, rep.enhanced) {
            out.enhanced = true;
            out.peer = Some(theirs);
            let r = self.negotiate_initiator(mine, theirs);
            let (ird, ord, rtr) = match r {
                Ok(v) => v,
                Err(e) => {
                    self.terminate = Some(e.cause());
                    return Err(e);
                }
            };
            out.ird = ird;
            out.ord = ord;
            out.p2p = mine.p2p;
            out.rtr = rtr;
        }
        self.events.push_back(Event::Negotiated(out));
        self.deadline = None;
        self.state = State::Established;
        Ok(())
    }

    /// RFC 6581 §9.1 and §9.2 at the Initiator.
    fn negotiate_initiator(
        &self,
        mine: EnhancedData,
        theirs: EnhancedData,
    ) -> Result<(u16, u16, Option<Rtr>), MpaError> {
        let insufficient = || MpaError::InsufficientIrd {
            peer_ird: theirs.ird,
            peer_ord: theirs.ord,
            ird: mine.ird,
            ord: mine.ord,
        };
        // "the initiator MUST set ... its ORD at most to the responder IRD";
        // 0x3FFF: leave it unchanged.
        let ord = if theirs.ird == IRD_ORD_NO_NEGOTIATION {
            mine.ord
        } else {
            mine.ord.min(theirs.ird)
        };
        if theirs.ird != IRD_ORD_NO_NEGOTIATION && ord < self.cfg.required_ord && !self.cfg.relaxed_ird {
            return Err(insufficient());
        }
        // "the initiator MUST set its IRD at least to the responder ORD ...
        // If the initiator does not have sufficient resources for the
        // required IRD, it MUST send a TERM message".
        let ird =
            if theirs.ord == IRD_ORD_NO_NEGOTIATION || mine.ird == IRD_ORD_NO_NEGOTIATION || theirs.ord <= mine.ird {
                mine.ird
            } else if self.cfg.relaxed_ird && theirs.ord <= self.cfg.max_ird.max(mine.ird) {
                // siw relaxed_ird_negotiation: fail only beyond the device limit.
                theirs.ord
            } else {
                return Err(insufficient());
            };
        if !mine.p2p {
            return Ok((ird, ord, None));
        }
        // RFC 6581 §9.2: the Responder MUST echo A, and the Initiator picks
        // one of the Responder-supported RTRs it can generate.
        let mut usable = if theirs.p2p {
            theirs.rtr.intersection(mine.rtr)
        } else {
            RtrSet::EMPTY
        };
        if ord == 0 {
            usable = usable.intersection(RtrSet::SEND.union(RtrSet::WRITE));
        }
        match usable.preferred() {
            Some(rtr) => Ok((ird, ord, Some(rtr))),
            None => Err(MpaError::NoMatchingRtr {
                offered: mine.rtr,
                peer: if theirs.p2p { theirs.rtr } else { RtrSet::EMPTY },
            }),
        }
    }

    /// Responder: accepts the pending Request, queuing a Reply with R=0
    /// that carries our IRD/ORD (when enhanced) and `private_data`, and
    /// reports [`Event::Negotiated`]. In strict mode, if the Initiator's IRD
    /// is below `required_ord`, queues a Reply with R=1 instead and fails
    /// with [`MpaError::InsufficientIrd`] (RFC 6581 §9.1).
    pub fn accept(&mut self, local: IrdOrd, private_data: &[u8]) -> Result<(), MpaError> {
        let State::AwaitDecision(req) = &self.state else {
            return Err(MpaError::InvalidState("accept() without a pending Request"));
        };
        local.validate()?;
        let req = req.clone();
        let enh = if req.enhanced.is_some() { ENHANCED_DATA_LEN } else { 0 };
        check_len(enh + private_data.len(), self.cfg.pd_tx_limit())?;
        let framing = Framing {
            crc: self.cfg.crc || req.crc,
            markers_tx: req.markers,
            markers_rx: self.cfg.require_markers,
        };
        let mut out = Negotiated {
            role: Role::Responder,
            revision: req.revision,
            enhanced: req.enhanced.is_some(),
            framing,
            ird: local.ird,
            ord: local.ord,
            peer: req.enhanced,
            p2p: false,
            rtr: None,
            private_data: req.private_data.clone(),
        };
        let mut block = None;
        if let Some(theirs) = req.enhanced {
            let (reply, ird, ord, rtr) = match self.negotiate_responder(local, theirs) {
                Ok(v) => v,
                Err((reject, e)) => {
                    self.queue_reply(&req, framing, true, Some(reject), private_data)?;
                    return Err(self.fail(e));
                }
            };
            out.ird = ird;
            out.ord = ord;
            out.p2p = theirs.p2p;
            out.rtr = rtr;
            block = Some(reply);
        }
        self.queue_reply(&req, framing, false, block, private_data)?;
        self.framing = Some(framing);
        self.events.push_back(Event::Negotiated(out));
        self.deadline = None;
        self.state = State::Established;
        Ok(())
    }

    /// RFC 6581 §9.1 and §9.2 at the Responder: the Reply block and our
    /// IRD, ORD and expected RTR, or the Reject block and the error.
    #[allow(clippy::type_complexity)]
    fn negotiate_responder(
        &self,
        local: IrdOrd,
        theirs: EnhancedData,
    ) -> Result<(EnhancedData, u16, u16, Option<Rtr>), (EnhancedData, MpaError)> {
        // RTR: siw's choice, Write if offered, else Read, else Send; if
        // nothing offered is supported, propose what we support ("MUST set
        // at least one RTR indication type option it supports").
        let rtr = if theirs.p2p {
            theirs
                .rtr
                .intersection(self.cfg.rtr_support)
                .preferred()
                .or_else(|| self.cfg.rtr_support.preferred())
        } else {
            None
        };
        // ORD: "The responder MUST set its ORD at most to the initiator IRD";
        // 0x3FFF: leave ours and answer 0x3FFF.
        let (ord, reply_ord) = if theirs.ird == IRD_ORD_NO_NEGOTIATION {
            (local.ord, IRD_ORD_NO_NEGOTIATION)
        } else {
            let o = local.ord.min(theirs.ird);
            (o, o)
        };
        if !self.cfg.relaxed_ird && theirs.ird != IRD_ORD_NO_NEGOTIATION && theirs.ird < self.cfg.required_ord {
            // "The responder MAY reject the connection request if the
            // initiator IRD is not sufficient for the ULP-required ORD and
            // specify the required ORD in the MPA Reject Frame".
            let reject = EnhancedData {
                ird: local.ird,
                ord: self.cfg.required_ord,
                p2p: theirs.p2p,
                rtr: RtrSet::EMPTY,
            };
            let e = MpaError::InsufficientIrd {
                peer_ird: theirs.ird,
                peer_ord: theirs.ord,
                ird: local.ird,
                ord: local.ord,
            };
            return Err((reject, e));
        }
        // IRD: 0x3FFF leaves ours and answers 0x3FFF. siw's relaxed mode
        // raises IRD to the Initiator's ORD within the device limit.
        let (mut ird, mut reply_ird) = if theirs.ord == IRD_ORD_NO_NEGOTIATION {
            (local.ird, IRD_ORD_NO_NEGOTIATION)
        } else if self.cfg.relaxed_ird && local.ird < theirs.ord {
            let i = theirs.ord.min(self.cfg.max_ird.max(local.ird));
            (i, i)
        } else {
            (local.ird, local.ird)
        };
        // RFC 6581 §9.1: "if the initiator ORD is 0 ... and the responder
        // supports use of a zero-length RDMA Read RTR indication, then the
        // responder IRD can be set to 1".
        if rtr == Some(Rtr::Read) && ird == 0 {
            ird = 1;
            reply_ird = 1;
        }
        let reply = EnhancedData {
            ird: reply_ird,
            ord: reply_ord,
            p2p: theirs.p2p,
            rtr: rtr.map_or(RtrSet::EMPTY, RtrSet::of),
        };
        Ok((reply, ird, ord, rtr))
    }

    /// Responder: rejects the pending Request with a Reply with R=1
    /// carrying `private_data` (RFC 5044 §7.1.2 rule 2; IRD/ORD 0/0 when
    /// enhanced). MPA is then over; the TCP connection is the ULP's.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), MpaError> {
        let State::AwaitDecision(req) = &self.state else {
            return Err(MpaError::InvalidState("reject() without a pending Request"));
        };
        let req = req.clone();
        let enh = req.enhanced.map(|_| EnhancedData::default());
        check_len(
            enh.map_or(0, |_| ENHANCED_DATA_LEN) + private_data.len(),
            self.cfg.pd_tx_limit(),
        )?;
        let framing = Framing {
            crc: self.cfg.crc || req.crc,
            markers_tx: false,
            markers_rx: false,
        };
        self.queue_reply(&req, framing, true, enh, private_data)?;
        self.deadline = None;
        self.state = State::Rejected;
        Ok(())
    }

    fn queue_reply(
        &mut self,
        req: &Pending,
        framing: Framing,
        reject: bool,
        block: Option<EnhancedData>,
        private_data: &[u8],
    ) -> Result<(), MpaError> {
        let reply = Repr {
            kind: FrameKind::Reply,
            markers: framing.markers_rx,
            // siw keeps the Initiator's C in its Reply.
            crc: framing.crc,
            reject,
            s_flag: block.is_some(),
            reserved: 0,
            revision: req.revision,
            enhanced: block,
            private_data,
        };
        check_pd_len(&reply, self.cfg.pd_tx_limit())?;
        reply.emit_vec(&mut self.tx)?;
        Ok(())
    }
}

fn check_len(len: usize, max: usize) -> Result<(), MpaError> {
    if len > max {
        Err(MpaError::PrivateDataTooLong { len, max })
    } else {
        Ok(())
    }
}

fn check_pd_len(repr: &Repr<'_>, max: usize) -> Result<(), MpaError> {
    check_len(repr.pd_len(), max)
}

/// RFC 5044 §7.1.1 "Key": checks the key octets received so far, so that a
/// non-MPA peer (or the wrong frame kind) is refused as soon as it shows.
fn check_key_prefix(rx: &[u8], expected: FrameKind) -> Result<(), MpaError> {
    let n = rx.len().min(16);
    let got = &rx[..n];
    if got == &expected.key()[..n] {
        return Ok(());
    }
    let other = match expected {
        FrameKind::Request => FrameKind::Reply,
        FrameKind::Reply => FrameKind::Request,
    };
    if got == &other.key()[..n] {
        if n == 16 {
            // RFC 5044 §7.1.2 rule 8: Initiator/Initiator (or
            // Responder/Responder) startup.
            return Err(MpaError::UnexpectedFrame { expected, got: other });
        }
        return Ok(());
    }
    Err(MpaError::Frame(mpa::Error::BadKey))
}
