//! The provider interface: what a transport implements so that the verbs
//! reach it, shaped like the kernel's `struct ib_device_ops` and rdma-core's
//! `struct verbs_context_ops` and named as they are.
//!
//! Every verbs call that creates, changes or destroys a resource passes
//! through here: [`Provider::query_device`], [`Provider::query_port`],
//! [`Provider::query_gid`], [`Provider::query_pkey`], [`Provider::alloc_pd`] /
//! [`Provider::dealloc_pd`], [`Provider::reg_mr`] (the provider chooses the
//! backing memory) / [`Provider::dereg_mr`], [`Provider::create_cq`],
//! [`Provider::create_qp`] (the QP starts in RESET) with [`QpOps::modify_qp`],
//! [`QpOps::query_qp`] and destroy by drop, [`Provider::create_ah`],
//! [`Provider::create_srq`], [`Provider::attach_mcast`] /
//! [`Provider::detach_mcast`].
//!
//! A provider refuses what its transport cannot do with
//! [`Error::NotSupported`] (iWARP: UD and GSI QPs, address handles,
//! multicast, manual RTR/RTS). The defaults below are those refusals, and
//! for ports, memory and CQs the behaviour of a plain software device.
//!
//! The verbs layer checks arguments and the IBTA transition table
//! ([`crate::qp_attr::check_modify`]) before a call reaches the provider, so
//! a provider sees only calls that are legal for its QP's type and state.
//!
//! What only a provider calls lives here too, not on the application's
//! types: [`new_device`] (wraps a provider as a [`Device`]), [`new_cq`],
//! and the extension traits [`DeviceProviderExt`] (the memory table, raising
//! asynchronous events) and [`CqProviderExt`] (attaching a QP's progress,
//! delivering completions). A provider crate imports them; an application
//! never needs to.
//!
//! Connection management is not here: a provider that needs a connection
//! manager (iWARP's MPA, the IB CM) offers a [`crate::cm::backend::CmBackend`]
//! beside this trait, which binds a QP made here to a connection.

use crate::ah::AhOps;
use crate::async_event::AsyncEvent;
use crate::buffer::Buffer;
use crate::cm::backend::CmBackend;
use crate::cm::event::CmEvent;
use crate::cq::{CompletionQueue, CqOverflow, Progress};
use crate::device::Device;
use crate::error::{Error, InvalidArg, Result};
use crate::mem::MemTable;
use crate::notify::EventQueue;
use crate::port::{DEFAULT_PKEY, PortAttr};
use crate::qp_attr::{AhAttr, Gid, QpAttr, QpType};
use crate::types::{Access, DeviceAttr, QpInitAttr, QpState, RecvWr, SendWr, WorkCompletion};
use std::any::Any;
use std::sync::{Arc, Weak};

/// Everything a provider needs to create a QP (`ibv_qp_init_attr` plus the
/// resources the verbs layer resolved).
pub struct QpCreate {
    /// The QP's transport service type.
    pub qp_type: QpType,
    /// The protection domain's number (memory checks compare it).
    pub pd_id: u32,
    /// The device's memory table, which every access is checked against.
    pub mem: Arc<MemTable>,
    /// The CQ of send completions.
    pub send_cq: CompletionQueue,
    /// The CQ of receive completions.
    pub recv_cq: CompletionQueue,
    /// Receives come from this shared receive queue instead of the QP's own.
    pub srq: Option<Arc<dyn SrqOps>>,
    /// Queue capacities asked for.
    pub attr: QpInitAttr,
    /// The QP's connection events, for a provider whose data path sees them
    /// (an iWARP Terminate, a closed stream). Events pushed here also raise
    /// the device's asynchronous events (`QpFatal`, `CommEstablished`).
    pub events: Arc<EventQueue<CmEvent>>,
    /// The device's asynchronous events, for the ones a QP raises by itself
    /// (`IBV_EVENT_SQ_DRAINED` when a move to SQD has drained its send queue).
    pub async_events: AsyncEventSink,
}

/// Where a provider raises a device's asynchronous events ([`Device::get_async_event`]
/// reads them); bounded like every async event queue
/// ([`crate::async_event::MAX_PENDING_ASYNC_EVENTS`]).
#[derive(Clone)]
pub struct AsyncEventSink(pub(crate) Arc<EventQueue<AsyncEvent>>);

impl AsyncEventSink {
    /// Raises `ev`.
    pub fn raise(&self, ev: AsyncEvent) {
        crate::async_event::push_bounded(&self.0, ev)
    }
}

impl std::fmt::Debug for AsyncEventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AsyncEventSink")
    }
}

/// A provider's queue pair. Created in RESET by [`Provider::create_qp`];
/// destroyed when the last handle is dropped.
pub trait QpOps: Send + Sync + 'static {
    /// The QP number.
    fn qp_num(&self) -> u32;
    /// The current state.
    fn state(&self) -> QpState;
    /// `ibv_post_send`; the verbs layer adds nothing on this path.
    fn post_send(&self, wrs: &[SendWr]) -> Result<()>;
    /// `post_send` of one work request the caller gives away
    /// ([`QueuePair::post_send_one`](crate::QueuePair::post_send_one)): a provider that
    /// keeps work requests may queue it without copying its SGE list. Defaults to
    /// [`post_send`](Self::post_send).
    fn post_send_owned(&self, wr: SendWr) -> Result<()> {
        self.post_send(std::slice::from_ref(&wr))
    }
    /// `ibv_post_recv`; allowed from INIT on (IBTA 10.8.2).
    fn post_recv(&self, wrs: &[RecvWr]) -> Result<()>;
    /// Carries out a `modify_qp` the verbs layer found legal for the QP's
    /// type and current state; refuses with `NotSupported` what the
    /// transport cannot do.
    fn modify_qp(&self, attr: &QpAttr) -> Result<()>;
    /// `ibv_query_qp`: the attributes the provider knows.
    fn query_qp(&self) -> QpAttr;
    /// For the provider's own connection manager: its concrete QP type.
    fn as_any(&self) -> &dyn Any;
}

/// Shared receive queue creation attributes (`ibv_srq_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInitAttr {
    /// Most receives outstanding.
    pub max_wr: u32,
    /// Most scatter/gather elements per receive.
    pub max_sge: u32,
    /// Raise `SrqLimitReached` when fewer receives than this remain (0: never).
    pub srq_limit: u32,
}

impl Default for SrqInitAttr {
    fn default() -> Self {
        SrqInitAttr {
            max_wr: 256,
            max_sge: 6,
            srq_limit: 0,
        }
    }
}

/// A provider's shared receive queue (`ibv_srq`).
pub trait SrqOps: Send + Sync + 'static {
    /// `ibv_post_srq_recv`.
    fn post_recv(&self, wrs: &[RecvWr]) -> Result<()>;
    /// `ibv_query_srq`.
    fn query(&self) -> SrqInitAttr;
    /// For the provider's own code: its concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// One statistics counter of a device (a file of Linux's `hw_counters`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HwCounter {
    /// Its name (rxe's where the meaning is the same: `sent_pkts`, `rcvd_seq_err`, ...).
    pub name: &'static str,
    /// Its value since the device opened.
    pub value: u64,
}

/// A transport provider (`ib_device_ops` / `verbs_context_ops`).
pub trait Provider: Send + Sync {
    /// Device limits (`ibv_query_device`); read once when the device opens.
    fn query_device(&self) -> DeviceAttr;

    /// Number of ports (numbered from 1).
    fn phys_port_cnt(&self) -> u8 {
        1
    }
    /// The device's statistics counters (`ib_device_ops.get_hw_stats`); the default is
    /// none.
    fn query_counters(&self) -> Vec<HwCounter> {
        Vec::new()
    }

    /// Attributes of a port that exists (the verbs layer checked the number).
    fn query_port(&self, _port_num: u8) -> PortAttr {
        PortAttr::default()
    }
    /// Entry `index` of the port's GID table. The default is one zero GID,
    /// as an iWARP device (addressed by IP and TCP port) reports it.
    fn query_gid(&self, _port_num: u8, index: u32) -> Result<Gid> {
        match index {
            0 => Ok(Gid::default()),
            _ => Err(InvalidArg::GidIndex(index).into()),
        }
    }
    /// Entry `index` of the port's P_Key table; the default is the default
    /// partition alone.
    fn query_pkey(&self, _port_num: u8, index: u16) -> Result<u16> {
        match index {
            0 => Ok(DEFAULT_PKEY),
            _ => Err(InvalidArg::PkeyIndex(index).into()),
        }
    }

    /// A protection domain numbered `pd_id` was allocated (`ibv_alloc_pd`).
    fn alloc_pd(&self, _pd_id: u32) -> Result<()> {
        Ok(())
    }
    /// The last handle of protection domain `pd_id` is gone (`ibv_dealloc_pd`).
    fn dealloc_pd(&self, _pd_id: u32) {}

    /// The memory behind a region of `len` bytes (`ibv_reg_mr`): the
    /// provider chooses it (a shared-memory provider can hand out a mapping
    /// its peer sees). The default is fresh, zeroed, page-aligned memory the
    /// region owns.
    fn reg_mr(&self, _pd_id: u32, len: usize, _access: Access) -> Result<Arc<Buffer>> {
        Ok(Arc::new(Buffer::new(len)?))
    }
    /// The memory behind a region the application filled ([`ProtectionDomain::reg_mr_vec`],
    /// `ibv_reg_mr` of its own buffer). The default registers it as it is.
    ///
    /// [`ProtectionDomain::reg_mr_vec`]: crate::ProtectionDomain::reg_mr_vec
    fn reg_user_mr(&self, _pd_id: u32, buffer: Buffer, _access: Access) -> Result<Arc<Buffer>> {
        Ok(Arc::new(buffer))
    }
    /// The memory of another region registered again in protection domain `pd_id`, possibly
    /// of another device ([`ProtectionDomain::reg_mr_shared`]; `ibv_reg_mr` of an address an
    /// earlier registration covers). The default shares it as it is: the new region keeps the
    /// bytes alive (one `Arc`) as long as it or any earlier region of them lives. A provider
    /// whose memory its peer sees (a shared mapping) may refuse memory it did not hand out.
    ///
    /// [`ProtectionDomain::reg_mr_shared`]: crate::ProtectionDomain::reg_mr_shared
    fn reg_shared_mr(&self, _pd_id: u32, buffer: &Arc<Buffer>, _access: Access) -> Result<Arc<Buffer>> {
        Ok(Arc::clone(buffer))
    }
    /// The region named by `lkey` was deregistered (`ibv_dereg_mr`); its
    /// memory table entry is already gone.
    fn dereg_mr(&self, _lkey: u32) {}

    /// A completion queue of `cqe` entries (`ibv_create_cq`; the verbs layer
    /// checked `cqe` against `max_cqe`).
    fn create_cq(&self, cqe: usize) -> Result<CompletionQueue> {
        Ok(CompletionQueue::create(cqe))
    }

    /// A queue pair in RESET (`ibv_create_qp`).
    fn create_qp(&self, req: QpCreate) -> Result<Arc<dyn QpOps>>;

    /// An address handle (`ibv_create_ah`), for UD sends.
    fn create_ah(&self, _pd_id: u32, _attr: &AhAttr) -> Result<Arc<dyn AhOps>> {
        Err(Error::NotSupported(
            "address handles (this transport has no UD service)".into(),
        ))
    }

    /// A shared receive queue (`ibv_create_srq`).
    fn create_srq(&self, _pd_id: u32, _attr: &SrqInitAttr) -> Result<Arc<dyn SrqOps>> {
        Err(Error::NotSupported("shared receive queues".into()))
    }

    /// Joins `qp` (a UD QP) to the multicast group `gid` (`ibv_attach_mcast`).
    fn attach_mcast(&self, _qp: &dyn QpOps, _gid: &Gid, _lid: u16) -> Result<()> {
        Err(Error::NotSupported(
            "multicast (this transport has no UD service)".into(),
        ))
    }
    /// Leaves the group (`ibv_detach_mcast`).
    fn detach_mcast(&self, _qp: &dyn QpOps, _gid: &Gid, _lid: u16) -> Result<()> {
        Err(Error::NotSupported(
            "multicast (this transport has no UD service)".into(),
        ))
    }
}

// ---- the provider-implementor side of the verbs objects ----

/// Wraps `provider` (and its connection manager backend, if the transport
/// has one) as the device `name`: what a provider's
/// [`DeviceFactory::open`](crate::DeviceFactory::open) returns. The device
/// limits are read once here ([`Provider::query_device`]).
pub fn new_device(name: impl Into<String>, provider: Arc<dyn Provider>, cm: Option<Arc<dyn CmBackend>>) -> Device {
    Device::from_provider(name, provider, cm)
}

/// A completion queue of `cqe` entries, for a provider's
/// [`Provider::create_cq`] (applications use [`Device::create_cq`], which
/// checks `cqe` against the device's limit first).
pub fn new_cq(cqe: usize) -> CompletionQueue {
    CompletionQueue::create(cqe)
}

/// What a provider does with a [`Device`] beyond the application API.
pub trait DeviceProviderExt {
    /// A shared handle on the memory table every access is checked against.
    fn mem_table(&self) -> Arc<MemTable>;
    /// Raises an asynchronous event that is not a QP's CM event (CQ
    /// overflow, port change); applications read it with
    /// [`Device::get_async_event`].
    fn raise_async_event(&self, ev: AsyncEvent);
}

impl DeviceProviderExt for Device {
    fn mem_table(&self) -> Arc<MemTable> {
        self.mem_arc().clone()
    }
    fn raise_async_event(&self, ev: AsyncEvent) {
        self.push_async_event(ev)
    }
}

/// What a provider does with a [`CompletionQueue`] beyond the application API.
pub trait CqProviderExt {
    /// Attaches a QP so that `poll` on this CQ can drive its progress
    /// (run-to-completion).
    fn attach(&self, p: Weak<dyn Progress>);
    /// Delivers a completion and wakes blocking and async waiters; on
    /// [`CqOverflow`] the provider moves the QP that produced it to the error
    /// state.
    fn push(&self, wc: WorkCompletion) -> std::result::Result<(), CqOverflow>;
}

/// Runs `f` with the wake-ups of the completions this thread delivers meanwhile (through
/// [`CqProviderExt::push`]) held back until `f` returns: wrap the work done under a QP's lock
/// in it, so a waiter woken by a completion does not find the lock still held and sleep on
/// it. Nested calls join the outer one; completions themselves are queued at once (a poller
/// sees them), only the waking of sleepers and async waiters is deferred.
pub fn defer_cq_wakeups<R>(f: impl FnOnce() -> R) -> R {
    crate::cq::defer_wakeups(f)
}

/// Inside [`defer_cq_wakeups`]: wakes now the waiters held back so far (call it before
/// anything that may take long, e.g. the next read of a stream that keeps coming).
pub fn flush_cq_wakeups() {
    crate::cq::flush_wakeups()
}

impl CqProviderExt for CompletionQueue {
    fn attach(&self, p: Weak<dyn Progress>) {
        self.attach_progress(p)
    }
    fn push(&self, wc: WorkCompletion) -> std::result::Result<(), CqOverflow> {
        self.deliver(wc)
    }
}
