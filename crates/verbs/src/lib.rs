//! # verbs: the provider-independent RDMA API of softrdma
//!
//! ```text
//!   upper layers: rpcrdma, smc, ipoib, the softrdma CLI, your program
//!   verbs  <- this crate: Device, ProtectionDomain, MemoryRegion, CompletionQueue,
//!             QueuePair, work requests/completions, rdma_cm-style connection manager
//!   providers: iwarp (RDMAP/DDP/MPA over TCP); later roce
//! ```
//!
//! Names follow rdma-core: [`ProtectionDomain::reg_mr`], [`QueuePair::post_send`],
//! [`QueuePair::post_recv`], [`CompletionQueue::poll`], [`WcStatus`] values,
//! `responder_resources` / `initiator_depth` in [`ConnParam`].
//!
//! Memory: a [`MemoryRegion`] owns its bytes ([`buffer`] is the single module
//! with `unsafe` code); every remote access is checked by [`mem::MemTable::check`]
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
//! let pd = dev.alloc_pd();
//! let cq = dev.create_cq(64)?;
//! let mr = pd.reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
//! let qp = pd.connect("127.0.0.1:7174".parse().unwrap(), QpOptions::new(&cq), std::time::Duration::from_secs(5))?;
//! mr.write(0, b"hello")?;
//! qp.post_send_one(SendWr::new(1, WrOpcode::Send, vec![mr.sge(0, 5)]))?;
//! let wc = cq.wait(None).unwrap();
//! assert_eq!(wc.status, WcStatus::Success);
//! # Ok(()) }
//! ```

pub mod async_event;
pub mod buffer;
pub mod cm;
pub mod cq;
pub mod device;
pub mod error;
pub mod mem;
pub mod notify;
pub mod port;
pub mod qp_attr;
pub mod registry;
pub mod types;

pub use async_event::AsyncEvent;
pub use cm::{CmEvent, ConnInfo, ConnectRequest, Listener, QpOptions, QueuePair, TerminateInfo};
pub use cq::CompletionQueue;
pub use device::{Device, MemoryRegion, ProtectionDomain};
pub use error::{Error, Result};
pub use port::{DEFAULT_PKEY, LinkLayer, PortAttr, PortState};
pub use qp_attr::{
    AhAttr, Gid, ModifyQpError, Mtu, QpAttr, QpAttrMask, QpType, RtrAttr, RtsAttr, TransitionRule, check_modify,
    transition_rule,
};
pub use registry::{
    ConfigItem, ConfigValue, DeviceFactory, DeviceOptions, ParamInfo, ProviderInfo, Registry, Transport,
};
pub use types::*;
