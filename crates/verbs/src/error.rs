//! Typed errors of the verbs API. Work-request failures that happen after a
//! post are reported as [`crate::WcStatus`] in completions, not here.

use crate::types::QpState;

/// Errors returned by verbs calls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// `post_send`/`post_recv`: work request number `index` of the list was refused
    /// (rdma-core's `bad_wr`); the ones before it were posted.
    #[error("work request {index} refused: {reason}")]
    BadWr { index: usize, reason: String },
    #[error("queue full")]
    QueueFull,
    #[error("operation not allowed in QP state {0:?}")]
    InvalidState(QpState),
    #[error("out of resources: {0}")]
    OutOfResources(String),
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The responder refused the connection (`RDMA_CM_EVENT_REJECTED`).
    /// `private_data` is the ULP's, byte for byte, without provider bytes;
    /// `detail` is what the provider adds (iWARP: the responder's IRD/ORD
    /// block, as the iwarp crate's type).
    #[error("connection rejected by peer ({} bytes of private data{})", private_data.len(),
        detail.as_ref().map(|d| format!(", {d}")).unwrap_or_default())]
    Rejected {
        private_data: Vec<u8>,
        detail: Option<crate::cm::event::ErrorDetail>,
    },
    /// `modify_qp` broke the IBTA transition rules (see [`crate::qp_attr`]).
    #[error(transparent)]
    ModifyQp(#[from] crate::qp_attr::ModifyQpError),
    /// No registered device has this name ([`crate::Registry`]).
    #[error("no RDMA device {name:?} (this build offers: {})", available.join(", "))]
    NoDevice { name: String, available: Vec<String> },
    #[error("timed out")]
    Timeout,
    #[error("connection refused")]
    ConnectionRefused,
    /// The peer violated the protocol during connection setup (e.g. a bad MPA frame).
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("closed")]
    Closed,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<crate::buffer::OutOfBounds> for Error {
    fn from(_: crate::buffer::OutOfBounds) -> Self {
        Error::InvalidArgument("range outside the memory region".into())
    }
}
