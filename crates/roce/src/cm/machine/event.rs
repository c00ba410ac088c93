//! What the CM reports: events, errors, connection states and counters.

use super::{CmId, ConnectRequest, QpParams, SidrId, SidrRequest};
use crate::cm::mad::{MadError, RejReason, Rep, SidrRep};

/// Events for the application and the provider, drained with [`Cm::poll_event`](super::Cm::poll_event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive: a REQ for a service we listen on. Answer with [`Cm::accept`](super::Cm::accept) or
    /// [`Cm::reject`](super::Cm::reject).
    ConnectRequest(Box<ConnectRequest>),
    /// Active: the REP arrived. Move the QP to RTR and RTS with `qp`, then call [`Cm::rtu`](super::Cm::rtu)
    /// (or [`Cm::reject`](super::Cm::reject)).
    ConnectReply {
        /// The connection.
        id: CmId,
        /// The REP as received.
        rep: Box<Rep>,
        /// The QP attributes the REQ and REP agree on.
        qp: QpParams,
    },
    /// Both sides: the connection is up (active: RTU sent; passive: RTU or first data).
    Established {
        /// The connection.
        id: CmId,
        /// The QP attributes the REQ and REP agree on.
        qp: QpParams,
    },
    /// The peer rejected our REQ or REP, or gave up on a connection (a REJ after our RTU:
    /// the connection is in time-wait then; the QP should go to ERR).
    Rejected {
        /// The connection.
        id: CmId,
        /// The REJ's reason.
        reason: RejReason,
        /// The REJ's additional reject information.
        ari: Vec<u8>,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// A REQ or REP got no answer after all retries (a REJ "timeout" was sent).
    TimedOut {
        /// The connection.
        id: CmId,
    },
    /// The connection is down: the peer's DREQ (with its private data), the DREP to ours, or
    /// our DREQ timed out (`private_data` empty). The QP should go to ERR.
    Disconnected {
        /// The connection.
        id: CmId,
        /// The DREQ's or DREP's private data (empty on a timeout).
        private_data: Vec<u8>,
    },
    /// The time-wait is over; the ID is forgotten.
    TimeWaitExit {
        /// The connection.
        id: CmId,
    },
    /// Passive: a SIDR_REQ for a service we listen on. Answer with [`Cm::sidr_reply`](super::Cm::sidr_reply).
    SidrRequest(Box<SidrRequest>),
    /// Active: the SIDR_REP to our SIDR_REQ (any status; 0 is a resolved QPN and Q_Key).
    SidrReply {
        /// The request.
        id: SidrId,
        /// The SIDR_REP as received.
        rep: Box<SidrRep>,
    },
    /// Active: no SIDR_REP after all retries.
    SidrTimedOut {
        /// The request.
        id: SidrId,
    },
}

/// Application command errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No connection has this ID (never existed, or forgotten after time-wait).
    #[error("no connection {0:?}")]
    UnknownId(CmId),
    /// The connection's state does not allow the command.
    #[error("connection {id:?} is in state {state:?}, which does not allow this")]
    State {
        /// The connection.
        id: CmId,
        /// Its state.
        state: State,
    },
    /// Private data or ARI longer than the message holds.
    #[error("{what} of {len} octets, the message holds {max}")]
    TooLong {
        /// The field ("REP private data", ...).
        what: &'static str,
        /// Octets given.
        len: usize,
        /// Octets the field holds.
        max: usize,
    },
    /// No SIDR exchange has this ID (never existed, answered already, or timed out).
    #[error("no SIDR request {0:?}")]
    UnknownSidr(SidrId),
    /// Another listener has this ServiceID.
    #[error("service ID {0:#018x} already has a listener")]
    AlreadyListening(u64),
    /// A value does not fit its MAD field.
    #[error("field out of range: {0}")]
    Mad(#[from] MadError),
}

/// Connection states (IBA vol. 1 §12.9.6 (unconfirmed), Linux `enum ib_cm_state` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Active: REQ sent, waiting for the REP.
    ReqSent,
    /// Active: the peer MRAed our REQ, waiting longer for the REP.
    MraReqRcvd,
    /// Passive: REQ received, the application has not answered.
    ReqRcvd,
    /// Passive: we MRAed the REQ.
    MraReqSent,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    /// Passive: the peer MRAed our REP, waiting longer for the RTU.
    MraRepRcvd,
    /// Active: REP received, the RTU not yet sent.
    RepRcvd,
    /// Active: we MRAed the REP.
    MraRepSent,
    /// The connection is up.
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// Disconnected; the ID and QP are held until the time-wait ends.
    TimeWait,
}

/// Counters, for tests and `info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmStats {
    /// MADs that did not parse or matched nothing and were dropped.
    pub dropped: u64,
    /// Messages sent again because their timer ran out.
    pub retransmits: u64,
    /// Repeated messages from the peer answered from state (REP again, RTU again, DREP again).
    pub duplicates: u64,
}
