//! IB CM: MADs on QP1 and the connection state machine (IBA vol. 1 ch. 12), sans-I/O.
//!
//! - [`mad`]: the 256-octet CM MAD (common header + REQ, MRA, REJ, REP, RTU, DREQ, DREP,
//!   SIDR_REQ, SIDR_REP) parsed and emitted at the IBA bit positions;
//! - [`cma`]: what rdma_cm adds on RoCE (service IDs of IP ports, the `cma_hdr` in the REQ's
//!   private data), so librdmacm peers accept us;
//! - [`machine`]: the CM state machine, fed MADs, commands and the clock, drained of MADs to
//!   send, events and its next timeout.
//!
//! What carries the MAD (BTH + DETH on QP1, Q_Key [`mad::GSI_QKEY`], UDP 4791) is
//! [`crate::wire`]'s.
//!
//! Requirement IDs: `../shared/requirements/smcr-ipoibcm.md` part C1 lists the IB CM in
//! bullets; tests cite them by position: **C1.1** MADs on QP1 and the common MAD header,
//! **C1.2** attribute IDs, **C1.3** private-data capacities, **C1.4** REQ layout, **C1.5**
//! REP layout, **C1.6** REJ and its reasons, **C1.7** the state machine (MRA, DREQ/DREP,
//! time-wait, retransmission on the CM response timeout up to max CM retries, duplicate and
//! stale detection by comm IDs), **C1.8** QP states driven by the CM.

pub mod cma;
pub mod machine;
pub mod mad;

pub use cma::{CmaHdr, PortSpace, service_id};
pub use machine::{
    AcceptParams, Cm, CmConfig, CmError, CmEvent, CmId, CmStats, ConnectParams, ConnectRequest, QpParams, SidrId,
    SidrRequest, State,
};
pub use mad::{AttrId, CmMsg, Mad, MadError, MadHeader, MsgType, RejReason, SidrStatus};
