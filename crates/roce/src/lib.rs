//! softrdma's RoCEv2 provider: the InfiniBand transport (IBA vol. 1 ch. 9, RoCEv2 annex
//! A17) carried in UDP datagrams to port 4791, and the IB communication manager (vol. 1
//! ch. 12) on QP1.
//!
//! Layout, bottom up (sans-I/O first, as in the iWARP crate):
//! - [`wire`]: base and extended transport headers (BTH, RETH, AETH, AtomicETH,
//!   AtomicAckETH, ImmDt, IETH, DETH) with `parse`/`emit` on byte slices, the opcode table,
//!   PSN arithmetic, path-MTU segmentation and the invariant CRC.
//! - [`cm`]: IB CM MADs (REQ, REP, RTU, REJ, DREQ, DREP, MRA) and the rdma_cm private-data
//!   header and service IDs, parsed and emitted; the CM state machine driven by events.
//! - [`engine`]: the device: one UDP socket on port 4791, the progress thread, the verbs
//!   provider and its RC QPs; [`RoceFactory`] opens it from the registry's text options.
//! - [`ud`]: the UD transport of one QP as a sans-I/O core (UD SEND_ONLY with DETH, Q_Key
//!   and P_Key checks, the GRH area built from the IP header), with address handles.
//! - [`gsi`]: the seam between the device's data path and the CM on QP1.
//! - [`gsi_cm`]: the device's rdma_cm-style connection manager (`verbs::cm::backend::CmBackend`)
//!   carried by the [`cm`] machine over QP1; the factory opens every device with it.
//!
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` parts C1 (IB CM) and C3 (RoCE and
//! the RC transport), C2 and D3 (UD, for IPoIB).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
pub mod engine;
mod factory;
pub mod gsi;
pub mod gsi_cm;
pub mod rc;
pub mod ud;
pub mod wire;

pub use engine::{IcrcRx, RoceConfig, RoceProvider, RoceQp, open_device, open_device_with};
pub use factory::RoceFactory;
