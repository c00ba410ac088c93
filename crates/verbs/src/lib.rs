//! # verbs: the provider-independent RDMA API of softrdma
//!
//! ```text
//!   upper layers: rpcrdma, smc, ipoib, the softrdma CLI, your program
//!        |                                   |
//!   cm   <- rdma_cm: Listener, ConnectRequest, QueuePair::connect / accept_qp,
//!        |  CmEvent (+ the provider's ErrorDetail); one CmBackend per transport
//!   verbs <- Device (ibv_context), ProtectionDomain, MemoryRegion, CompletionQueue,
//!        |   QueuePair (create_qp in RESET, modify_qp, query_qp), AddressHandle,
//!        |   SharedReceiveQueue, work requests/completions, async events, ports
//!   provider.rs: Provider (ib_device_ops / verbs_context_ops) + cm::backend::CmBackend
//!        |
//!   providers: iwarp (RDMAP/DDP/MPA over TCP, MPA as its CM backend); later roce
//!   registry: the providers a program links, opened by name (Registry::open)
//! ```
//!
//! Opening a device: a program registers the providers it links once and
//! opens devices by name through the [`Registry`]; nothing above that place
//! names a provider crate:
//!
//! ```ignore
//! let reg = verbs::Registry::new().with(std::sync::Arc::new(iwarp::IwarpFactory));
//! let dev = reg.open_default(None, &verbs::DeviceOptions::new())?;
//! ```
//!
//! The QP life cycle is rdma-core's: [`ProtectionDomain::create_qp`] gives a
//! QP in RESET, [`QueuePair::modify_qp`] moves it (checked against the IBTA
//! table in [`qp_attr`], then carried out by the provider, which refuses what
//! its transport cannot do with [`Error::NotSupported`]), and the connection
//! manager ([`cm`]) binds an RC QP to a connection and moves it to RTS.
//! [`ProtectionDomain::connect`] / [`ConnectRequest::accept`] do
//! create + post receives + connect in one call.
//!
//! Errors are typed ([`Error`]): a bad argument names what was invalid
//! ([`InvalidArg`], with the values), a refused work request says which one
//! and why ([`Error::BadWr`] with a [`WrError`]), and [`Error::errno`] gives
//! the Linux errno an rdma-core or librdmacm user would see (`EINVAL`,
//! `ENOMEM`, `EOPNOTSUPP`, `ETIMEDOUT`, ...). Failures after a post arrive as
//! [`WcStatus`] in completions; failures of a QP outside any work request as
//! [`AsyncEvent`]s ([`Device::get_async_event`]: communication established,
//! QP fatal on a Terminate or an LLP error), apart from the [`CmEvent`]s.
//!
//! Names follow rdma-core: [`ProtectionDomain::reg_mr`], [`QueuePair::post_send`],
//! [`QueuePair::post_recv`], [`CompletionQueue::poll`], [`WcStatus`] values,
//! `responder_resources` / `initiator_depth` in [`ConnParam`], `wr.ud` as
//! [`UdDest`], `ibv_wc` fields and [`WcFlags`] in [`WorkCompletion`].
//!
//! Memory: a [`MemoryRegion`] owns its bytes ([`buffer`] is one of the two
//! modules with `unsafe` code; the other, `waitfd`, makes the `poll(2)` and eventfd
//! calls of a CQ's inline wait); every remote access is checked by [`mem::MemTable::check`]
//! for STag validity, key, protection domain, stream scope, rights, bounds and
//! 64-bit wrap.
//!
//! Progress: providers complete work from the thread that posts, from
//! [`CompletionQueue::poll`] (run-to-completion), and from their own
//! background thread, which sleeps in epoll when nothing happens. Blocking
//! waits sleep on condition variables; async waits register wakers.
//!
//! ```no_run
//! # fn demo(dev: verbs::Device) -> verbs::Result<()> {
//! use verbs::*;
//! let pd = dev.alloc_pd()?;
//! let cq = dev.create_cq(64)?;
//! // or: let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq))?; qp.connect(addr, &param, timeout)?;
//! let mr = pd.reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
//! let qp = pd.connect("127.0.0.1:7174".parse().unwrap(), QpOptions::new(&cq), std::time::Duration::from_secs(5))?;
//! mr.write(0, b"hello")?;
//! qp.post_send_one(SendWr::new(1, WrOpcode::Send, vec![mr.sge(0, 5)]))?;
//! let wc = cq.wait(None).unwrap();
//! assert_eq!(wc.status, WcStatus::Success);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
pub mod ah;
pub mod async_event;
pub mod buffer;
pub mod cm;
pub mod cq;
pub mod device;
pub mod error;
pub mod mem;
pub mod notify;
pub mod port;
pub mod provider;
pub mod qp;
pub mod qp_attr;
pub mod registry;
pub mod types;
mod waitfd;

pub use ah::{AddressHandle, Grh};
pub use async_event::AsyncEvent;
pub use cm::{
    CmEvent, ConnInfo, ConnectRequest, ErrorDetail, Listener, PortSpace, ProviderDetail, QpOptions, RDMA_UDP_QKEY,
    UdParam,
};
pub use cq::{CompletionQueue, SpinDeclaration};
pub use device::{Device, MemoryRegion, ProtectionDomain};
pub use error::{Error, InvalidArg, Result, WrError};
pub use port::{DEFAULT_PKEY, LinkLayer, PortAttr, PortState};
pub use provider::{HwCounter, Provider, SrqInitAttr};
pub use qp::{QpInit, QueuePair, SharedReceiveQueue};
pub use qp_attr::{
    AhAttr, Gid, ModifyQpError, Mtu, QpAttr, QpAttrMask, QpType, RtrAttr, RtsAttr, TransitionRule, check_modify,
    transition_rule,
};
pub use registry::{
    ConfigItem, ConfigValue, DeviceFactory, DeviceOptions, ParamInfo, ProviderInfo, Registry, Transport,
};
pub use types::*;
