//! Typed errors of the verbs API. Work-request failures that happen after a
//! post are reported as [`crate::WcStatus`] in completions, not here.
//!
//! Every [`Error`] has the Linux errno a verbs user would see from the same
//! refusal in rdma-core or librdmacm ([`Error::errno`]): `EINVAL` for a bad
//! argument or work request, `ENOMEM` for a full queue or exhausted
//! resources, `EOPNOTSUPP` for what the transport cannot do, and so on.

use crate::ah::Gid;
use crate::mem::AccessError;
use crate::qp_attr::QpType;
use crate::types::QpState;

/// Errors returned by verbs calls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument of the call was invalid (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(#[from] InvalidArg),
    /// `post_send`/`post_recv`: work request number `index` of the list was refused
    /// (rdma-core's `bad_wr`); the ones before it were posted.
    #[error("work request {index} refused: {error}")]
    BadWr {
        /// Position of the refused work request in the posted list (0-based).
        index: usize,
        /// Why it was refused.
        error: WrError,
    },
    #[error("queue full")]
    /// A queue has no room (`ENOMEM`).
    QueueFull,
    #[error("operation not allowed in QP state {0:?}")]
    /// The QP's state does not allow the call (`EINVAL`).
    InvalidState(QpState),
    #[error("out of resources: {0}")]
    /// A device or process resource is exhausted (`ENOMEM`); the text names it.
    OutOfResources(String),
    /// The transport or device cannot do this (`EOPNOTSUPP`); the text names what.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The responder refused the connection (`RDMA_CM_EVENT_REJECTED`).
    /// `private_data` is the ULP's, byte for byte, without provider bytes;
    /// `detail` is what the provider adds (iWARP: the responder's IRD/ORD
    /// block, as the iwarp crate's type).
    #[error("connection rejected by peer ({} bytes of private data{})", private_data.len(),
        detail.as_ref().map(|d| format!(", {d}")).unwrap_or_default())]
    Rejected {
        /// The responder's private data, byte for byte, without provider bytes.
        private_data: Vec<u8>,
        /// What the provider adds (iWARP: the IRD/ORD block of RFC 6581).
        detail: Option<crate::cm::event::ErrorDetail>,
    },
    /// `modify_qp` broke the IBTA transition rules (see [`crate::qp_attr`]).
    #[error(transparent)]
    ModifyQp(#[from] crate::qp_attr::ModifyQpError),
    /// No registered device has this name ([`crate::Registry`]).
    #[error("no RDMA device {name:?} (this build offers: {})", available.join(", "))]
    NoDevice {
        /// The device name asked for.
        name: String,
        /// The devices this build offers.
        available: Vec<String>,
    },
    #[error("timed out")]
    /// A wait ran out of time (`ETIMEDOUT`).
    Timeout,
    #[error("connection refused")]
    /// The peer refused the connection (`ECONNREFUSED`).
    ConnectionRefused,
    /// The peer violated the protocol during connection setup (e.g. a bad MPA frame).
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("closed")]
    /// The connection or object is closed (`ENOTCONN`).
    Closed,
    #[error(transparent)]
    /// An operating-system error (its errno).
    Io(#[from] std::io::Error),
}

impl Error {
    /// The Linux errno an rdma-core / librdmacm user would get for this
    /// refusal (`EINVAL`, `ENOMEM`, `EOPNOTSUPP`, `ETIMEDOUT`, ...).
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) | Error::ModifyQp(_) | Error::InvalidState(_) => libc::EINVAL,
            Error::BadWr { error, .. } => error.errno(),
            // rdma-core providers answer a full work queue with ENOMEM.
            Error::QueueFull | Error::OutOfResources(_) => libc::ENOMEM,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::Rejected { .. } | Error::ConnectionRefused => libc::ECONNREFUSED,
            Error::NoDevice { .. } => libc::ENODEV,
            Error::Timeout => libc::ETIMEDOUT,
            Error::Protocol(_) => libc::EPROTO,
            Error::Closed => libc::ENOTCONN,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// Shorthand for `Error::BadWr`.
    pub fn bad_wr(index: usize, error: WrError) -> Error {
        Error::BadWr { index, error }
    }
}

/// What was invalid in a call's arguments ([`Error::InvalidArgument`], `EINVAL`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidArg {
    /// A port number outside the device's `1..=phys_port_cnt`.
    #[error("port {port}: the device has ports 1..={max}")]
    Port {
        /// The port number given.
        port: u8,
        /// The limit.
        max: u8,
    },
    /// A GID table index beyond the port's table.
    #[error("GID index {0} beyond the table")]
    GidIndex(u32),
    /// A P_Key table index beyond the port's table.
    #[error("P_Key index {0} beyond the table")]
    PkeyIndex(u16),
    /// `create_cq` with `cqe` of 0 or above `max_cqe`.
    #[error("cqe {cqe} not in 1..={max}")]
    CqSize {
        /// The number of entries asked for.
        cqe: usize,
        /// The limit.
        max: u32,
    },
    /// `create_qp` capabilities above the device's `max_qp_wr`.
    #[error("max_send_wr {send} / max_recv_wr {recv} above max_qp_wr {max}")]
    QpWr {
        /// The send queue value asked for.
        send: u32,
        /// The receive queue value asked for.
        recv: u32,
        /// The limit.
        max: u32,
    },
    /// `create_qp` capabilities above the device's `max_sge`.
    #[error("max_send_sge {send} / max_recv_sge {recv} above max_sge {max}")]
    QpSge {
        /// The send queue value asked for.
        send: u32,
        /// The receive queue value asked for.
        recv: u32,
        /// The limit.
        max: u32,
    },
    /// `create_srq` with `max_wr` of 0 or limits above the device's.
    #[error("SRQ max_wr {max_wr} / max_sge {max_sge} not within 1..={dev_max_wr} / {dev_max_sge}")]
    SrqCap {
        /// The work requests asked for.
        max_wr: u32,
        /// The scatter/gather entries asked for.
        max_sge: u32,
        /// The device's limit of work requests.
        dev_max_wr: u32,
        /// The device's limit of scatter/gather entries.
        dev_max_sge: u32,
    },
    /// An object of another protection domain (an SRQ given to `create_qp`).
    #[error("the {0} belongs to another protection domain")]
    OtherPd(&'static str),
    /// A QP of another provider's device.
    #[error("the QP belongs to another provider's device")]
    OtherDevice,
    /// Multicast attach/detach on a QP that is not UD.
    #[error("multicast needs a UD QP, not {0:?}")]
    McastQpType(QpType),
    /// Multicast attach/detach with a GID that is not a multicast GID.
    #[error("{0} is not a multicast GID")]
    NotMulticast(Gid),
    /// `create_ah_from_wc` of a completion without a readable GRH (no `WcFlags::GRH`, or
    /// the 40 octets hold neither an IPv4 nor an IPv6 header).
    #[error("the completion has no GRH to build an address handle from")]
    NoGrh,
    /// The connection manager connects RC QPs only.
    #[error("the connection manager connects RC QPs, not {0:?}")]
    CmQpType(QpType),
    /// The QP given to connect/accept is connected already.
    #[error("QP {0} is already connected")]
    AlreadyConnected(u32),
    /// `reg_mr_shared` of a fast-register region (`alloc_mr`): it has no memory of its own
    /// to register again.
    #[error("a fast-register region has no memory of its own to register again")]
    NoMemory,
    /// `reg_mr` with an I/O virtual address range that wraps 2^64.
    #[error("iova {iova:#x} + length {len} wraps 2^64")]
    IovaWrap {
        /// The I/O virtual address asked for.
        iova: u64,
        /// The length given.
        len: usize,
    },
    /// `reg_mr` longer than the device's `max_mr_size`.
    #[error("length {len} exceeds max_mr_size {max}")]
    MrSize {
        /// The length given.
        len: usize,
        /// The limit.
        max: u64,
    },
    /// `reg_mr` with REMOTE_WRITE (or atomics) but without LOCAL_WRITE, as `ibv_reg_mr` refuses.
    #[error("REMOTE_WRITE requires LOCAL_WRITE")]
    RemoteWriteNeedsLocalWrite,
    /// A read or write of a memory region outside its range.
    #[error("range outside the memory region")]
    OutOfBounds,
    /// Private data longer than the connection manager can carry, counted as
    /// the provider counts it (iWARP: with its 4-byte IRD/ORD block).
    #[error("private data too long: {len} octets with the provider's header, limit {max}")]
    PrivateDataTooLong {
        /// The length given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Connection parameters the connection manager cannot use; the text names the rule.
    #[error("connection parameters: {0}")]
    ConnParam(&'static str),
    /// A source address (`rdma_resolve_addr`'s `src_addr`, rping's `-I`) of another IP
    /// version than the destination.
    #[error("source address {src} and destination {dst} are of different IP versions")]
    SourceFamily {
        /// The source address given.
        src: std::net::IpAddr,
        /// The destination.
        dst: std::net::SocketAddr,
    },
    /// A source address this host cannot bind (not one of its addresses); `reason` is the
    /// operating system's answer.
    #[error("cannot connect from {src}: {reason}")]
    SourceAddress {
        /// The source address given.
        src: std::net::IpAddr,
        /// The operating system's answer.
        reason: String,
    },
    /// A device option (`provider:key=value,...`) that is not `key=value`.
    #[error("device option {0:?} is not key=value")]
    OptionSyntax(String),
    /// A device option the provider does not take.
    #[error("{provider} has no option {key:?} (it takes: {})", known.join(", "))]
    UnknownOption {
        /// The provider the option was given to.
        provider: String,
        /// The option name.
        key: String,
        /// The options the provider takes.
        known: Vec<&'static str>,
    },
    /// A device option whose value is not one the provider accepts.
    #[error("{key}={value}: expected {expected}")]
    OptionValue {
        /// The option name.
        key: String,
        /// The value given.
        value: String,
        /// What the provider accepts.
        expected: &'static str,
    },
}

/// Why `post_send` / `post_recv` refused a work request ([`Error::BadWr`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WrError {
    /// The QP's state does not take this post (e.g. a send before RTS).
    #[error("QP is in state {0:?}")]
    QpState(QpState),
    /// The send queue holds `max_send_wr` work requests already.
    #[error("send queue full ({max} work requests)")]
    SendQueueFull {
        /// The limit.
        max: u32,
    },
    /// The receive queue holds `max_recv_wr` work requests already.
    #[error("receive queue full ({max} work requests)")]
    RecvQueueFull {
        /// The limit.
        max: u32,
    },
    /// More scatter/gather entries than the QP's `max_send_sge` / `max_recv_sge`.
    #[error("{sges} SGEs exceed the QP's limit of {max}")]
    TooManySges {
        /// The scatter/gather entries given.
        sges: usize,
        /// The limit.
        max: u32,
    },
    /// An RDMA Read takes at most `max` sink SGEs (`max_sge_rd`).
    #[error("RDMA Read takes at most {max} sink SGE(s), not {sges}")]
    TooManyReadSges {
        /// The scatter/gather entries given.
        sges: usize,
        /// The limit.
        max: u32,
    },
    /// Atomics need exactly one 8-byte sink SGE.
    #[error("atomics need exactly one 8-byte sink SGE")]
    AtomicSge,
    /// The message is longer than the transport carries (2^31 on IB, 2^32-1 on iWARP).
    #[error("message of {len} bytes longer than {max}")]
    TooLong {
        /// The length given.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// An inline send longer than the QP's `max_inline_data`.
    #[error("{len} bytes exceed max_inline_data {max}")]
    InlineTooLarge {
        /// The length given.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// The transport cannot carry this opcode's form on this QP: the text says
    /// why (iWARP, RFC 7306: Immediate Data carries no payload).
    #[error("opcode not supported here: {0}")]
    Opcode(&'static str),
    /// An SGE's lkey does not allow the access (wrong PD, out of the region,
    /// missing LOCAL_WRITE for a sink, invalid key).
    #[error("local protection error on lkey {lkey:#010x}: {error:?}")]
    LocalProtection {
        /// The local key of the refused SGE.
        lkey: u32,
        /// What the memory table found.
        error: AccessError,
    },
}

impl WrError {
    /// The errno rdma-core's providers return for this `bad_wr`.
    pub fn errno(&self) -> i32 {
        match self {
            WrError::SendQueueFull { .. } | WrError::RecvQueueFull { .. } => libc::ENOMEM,
            WrError::Opcode(_) => libc::EOPNOTSUPP,
            WrError::LocalProtection { .. } => libc::EACCES,
            _ => libc::EINVAL,
        }
    }
}

/// The result of a verbs call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<crate::buffer::OutOfBounds> for Error {
    fn from(_: crate::buffer::OutOfBounds) -> Self {
        InvalidArg::OutOfBounds.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_is_the_one_rdma_core_users_know() {
        let cases: Vec<(Error, i32)> = vec![
            (InvalidArg::Port { port: 2, max: 1 }.into(), libc::EINVAL),
            (Error::bad_wr(0, WrError::SendQueueFull { max: 4 }), libc::ENOMEM),
            (Error::bad_wr(1, WrError::TooManySges { sges: 3, max: 2 }), libc::EINVAL),
            (Error::bad_wr(0, WrError::Opcode("x")), libc::EOPNOTSUPP),
            (
                Error::bad_wr(
                    0,
                    WrError::LocalProtection {
                        lkey: 1,
                        error: AccessError::NotAssociated,
                    },
                ),
                libc::EACCES,
            ),
            (Error::QueueFull, libc::ENOMEM),
            (Error::NotSupported("SRQ".into()), libc::EOPNOTSUPP),
            (Error::Timeout, libc::ETIMEDOUT),
            (Error::ConnectionRefused, libc::ECONNREFUSED),
            (
                Error::NoDevice {
                    name: "x".into(),
                    available: vec![],
                },
                libc::ENODEV,
            ),
            (Error::Io(std::io::Error::from_raw_os_error(libc::EPIPE)), libc::EPIPE),
        ];
        for (e, errno) in cases {
            assert_eq!(e.errno(), errno, "{e}");
        }
    }

    #[test]
    fn messages_name_the_values() {
        let e = Error::bad_wr(3, WrError::TooManySges { sges: 5, max: 4 });
        assert_eq!(
            e.to_string(),
            "work request 3 refused: 5 SGEs exceed the QP's limit of 4"
        );
        let e: Error = InvalidArg::CqSize { cqe: 0, max: 65536 }.into();
        assert_eq!(e.to_string(), "invalid argument: cqe 0 not in 1..=65536");
    }
}
