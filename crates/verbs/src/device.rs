//! Device, protection domain and memory region: the resources a provider
//! shares with the application. Each reaches the provider
//! ([`crate::provider::Provider`]) when it is made and when it goes.

use crate::buffer::{Buffer, OutOfBounds};
use crate::cm::backend::CmBackend;
use crate::cq::CompletionQueue;
use crate::error::{Error, InvalidArg, Result};
use crate::mem::{Entry, MemTable, MrKind};
use crate::provider::Provider;
use crate::types::{Access, DeviceAttr, Sge};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) struct DeviceInner {
    pub name: String,
    pub attr: DeviceAttr,
    pub mem: Arc<MemTable>,
    pub next_pd: AtomicU32,
    pub provider: Arc<dyn Provider>,
    pub cm: Option<Arc<dyn CmBackend>>,
    pub async_events: Arc<crate::notify::EventQueue<crate::async_event::AsyncEvent>>,
}

/// An RDMA device (`ibv_context`): a provider instance with its memory table.
/// Cheap to clone.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl Device {
    /// Wraps a provider (and its connection manager backend, if the
    /// transport has one) as a device; providers reach it as
    /// [`provider::new_device`](crate::provider::new_device). The device
    /// limits are read once here ([`Provider::query_device`]).
    pub(crate) fn from_provider(
        name: impl Into<String>,
        provider: Arc<dyn Provider>,
        cm: Option<Arc<dyn CmBackend>>,
    ) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                name: name.into(),
                attr: provider.query_device(),
                mem: Arc::new(MemTable::new()),
                next_pd: AtomicU32::new(1),
                provider,
                cm,
                async_events: Arc::new(crate::notify::EventQueue::new()),
            }),
        }
    }

    /// The device's name (`ibv_get_device_name`), e.g. `siw_soft0`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Device limits (`ibv_query_device`).
    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// Device limits (`ibv_query_device`), rdma-core's name for [`attr`](Self::attr).
    pub fn query_device(&self) -> DeviceAttr {
        self.inner.attr.clone()
    }

    pub(crate) fn mem_arc(&self) -> &Arc<MemTable> {
        &self.inner.mem
    }

    /// How many access checks looked the device's memory table up so far (those a
    /// provider's per-QP [`MrCache`](crate::mem::MrCache) did not answer): for counting
    /// guards and diagnostics.
    pub fn mr_lookups(&self) -> u64 {
        self.inner.mem.lookups()
    }

    /// The provider behind the device (for providers and diagnostics).
    pub(crate) fn provider(&self) -> &Arc<dyn Provider> {
        &self.inner.provider
    }

    /// The transport's connection manager backend, if it has one.
    pub(crate) fn cm_backend(&self) -> Option<&Arc<dyn CmBackend>> {
        self.inner.cm.as_ref()
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let id = self.inner.next_pd.fetch_add(1, Ordering::Relaxed);
        self.inner.provider.alloc_pd(id)?;
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner { dev: self.clone(), id }),
        })
    }

    /// Creates a completion queue with room for `cqe` completions (`ibv_create_cq`).
    pub fn create_cq(&self, cqe: usize) -> Result<CompletionQueue> {
        if cqe == 0 || cqe > self.inner.attr.max_cqe as usize {
            return Err(InvalidArg::CqSize {
                cqe,
                max: self.inner.attr.max_cqe,
            }
            .into());
        }
        self.inner.provider.create_cq(cqe)
    }

    /// Whether two handles name the same device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.inner.name)
    }
}

struct PdInner {
    dev: Device,
    id: u32,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        self.dev.inner.provider.dealloc_pd(self.id);
    }
}

/// A protection domain (`ibv_pd`): QPs and memory regions in different PDs
/// cannot reach each other (RDMAP-SEC-01).
/// Cheap to clone; deallocated (`ibv_dealloc_pd`) with its last handle.
#[derive(Clone)]
pub struct ProtectionDomain {
    inner: Arc<PdInner>,
}

impl ProtectionDomain {
    /// The protection domain's number (what a memory check compares).
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// Whether two handles name the same protection domain.
    pub fn same(&self, other: &ProtectionDomain) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Registers `len` bytes of fresh, zeroed, page-aligned memory that the
    /// region owns (`ibv_reg_mr`). Its tagged-offset base is a random,
    /// page-aligned 64-bit value drawn per region, not the memory's address:
    /// advertised addresses (Read/Write chunks, rping's and perftest's
    /// exchanges) then reveal nothing of the process's layout (RFC 5042 §5,
    /// issue 12 point 7). [`reg_mr_iova`](Self::reg_mr_iova) chooses the base
    /// (zero-based regions, as hardware offers them).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        self.register(len, access, random_iova(len as u64))
    }

    /// Registers `len` bytes like [`reg_mr`](Self::reg_mr), reachable at the
    /// tagged offsets `iova..iova + len` (rdma-core's `ibv_reg_mr_iova`;
    /// `iova` 0 gives a zero-based region). Refused if the range wraps 2^64.
    pub fn reg_mr_iova(&self, len: usize, access: Access, iova: u64) -> Result<MemoryRegion> {
        if iova.checked_add(len as u64).is_none() {
            return Err(InvalidArg::IovaWrap { iova, len }.into());
        }
        self.register(len, access, iova)
    }

    /// Registers the bytes of `bytes` without copying them (`ibv_reg_mr` of memory the
    /// application already filled): the region owns the vector from now on and frees it
    /// when the last of the region and its operations in flight goes. Its tagged-offset
    /// base is random as in [`reg_mr`](Self::reg_mr). For sending what was built in an
    /// ordinary `Vec` (an encoded RPC reply) by RDMA Write or Send without a copy into a
    /// region registered beforehand.
    pub fn reg_mr_vec(&self, bytes: Vec<u8>, access: Access) -> Result<MemoryRegion> {
        let len = bytes.len();
        self.register_with(len, access, random_iova(len as u64), |dev| {
            dev.inner
                .provider
                .reg_user_mr(self.id(), Buffer::from_vec(bytes), access)
        })
    }

    /// Registers the memory of `mr` (a region of this or another protection domain, of this
    /// or another device) again in this protection domain, with its own keys, access rights
    /// and a random tagged-offset base (rdma-core: a second `ibv_reg_mr` of the same address
    /// in another PD). Both regions name the same bytes: a Write through either key is seen
    /// through the other. The bytes are owned once (shared storage) and stay alive while any
    /// region of them, or an operation in flight on one, lives; deregistering one region
    /// revokes only its own keys. What SMC-R needs for a link group's second link, where the
    /// RMBs and send buffers must be the same memory on both links (RFC 7609 §3.3). Refused
    /// for a fast-register region (`alloc_mr`), which has no memory of its own.
    pub fn reg_mr_shared(&self, mr: &MemoryRegion, access: Access) -> Result<MemoryRegion> {
        let buffer = mr.buffer.as_ref().ok_or(InvalidArg::NoMemory)?;
        let len = mr.len();
        self.register_with(len, access, random_iova(len as u64), |dev| {
            dev.inner.provider.reg_shared_mr(self.id(), buffer, access)
        })
    }

    fn register(&self, len: usize, access: Access, iova: u64) -> Result<MemoryRegion> {
        self.register_with(len, access, iova, |dev| {
            dev.inner.provider.reg_mr(self.id(), len, access)
        })
    }

    fn register_with(
        &self,
        len: usize,
        access: Access,
        iova: u64,
        memory: impl FnOnce(&Device) -> Result<Arc<Buffer>>,
    ) -> Result<MemoryRegion> {
        let dev = self.device();
        if len as u64 > dev.inner.attr.max_mr_size {
            return Err(InvalidArg::MrSize {
                len,
                max: dev.inner.attr.max_mr_size,
            }
            .into());
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            // Same rule as ibv_reg_mr: remote write needs local write.
            return Err(InvalidArg::RemoteWriteNeedsLocalWrite.into());
        }
        let buffer = memory(dev)?;
        if buffer.len() < len {
            return Err(Error::OutOfResources(format!(
                "the provider gave {} bytes for a region of {len}",
                buffer.len()
            )));
        }
        let stag = dev.inner.mem.insert(Entry {
            key: 0,
            pd: self.id(),
            kind: MrKind::Regular,
            valid: true,
            iova,
            len: len as u64,
            access: access | Access::LOCAL_READ,
            buffer: Some((buffer.clone(), 0)),
            bound_qp: None,
            max_len: len as u64,
        });
        Ok(MemoryRegion {
            pd: self.clone(),
            stag,
            buffer: Some(buffer),
            iova,
            len: len as u64,
            access,
            kind: MrKind::Regular,
        })
    }

    /// Allocates a fast-register memory region of up to `max_len` bytes
    /// (`ibv_alloc_mr`); it is invalid until a `RegMr` work request binds it.
    pub fn alloc_mr(&self, max_len: u64) -> Result<MemoryRegion> {
        let stag = self.device().inner.mem.insert(Entry {
            key: 0,
            pd: self.id(),
            kind: MrKind::FastReg,
            valid: false,
            iova: 0,
            len: 0,
            access: Access::empty(),
            buffer: None,
            bound_qp: None,
            max_len,
        });
        Ok(MemoryRegion {
            pd: self.clone(),
            stag,
            buffer: None,
            iova: 0,
            len: max_len,
            access: Access::empty(),
            kind: MrKind::FastReg,
        })
    }
}

/// A random page-aligned tagged-offset base for a region of `len` bytes:
/// uniform over the pages of the lower 2^63 (never page 0), so `base + len`
/// cannot wrap 2^64 for any region a device allows, and `base - 1` stays
/// representable (a peer's access just below the region is a bounds error,
/// not a wrap).
fn random_iova(len: u64) -> u64 {
    use rand::Rng;
    const PAGE_SHIFT: u32 = 12;
    let pages = (1u64 << (63 - PAGE_SHIFT)).saturating_sub(len.div_ceil(1 << PAGE_SHIFT));
    rand::rng().random_range(1..pages.max(2)) << PAGE_SHIFT
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProtectionDomain({})", self.id())
    }
}

/// A memory region (`ibv_mr`). It owns its bytes; deregistration (drop)
/// revokes its STag at once, and the bytes live on only as long as an
/// operation in flight still holds them. In iWARP `lkey == rkey` (one STag).
pub struct MemoryRegion {
    pd: ProtectionDomain,
    stag: u32,
    buffer: Option<Arc<Buffer>>,
    iova: u64,
    len: u64,
    access: Access,
    kind: MrKind,
}

impl MemoryRegion {
    /// Local key (the STag).
    pub fn lkey(&self) -> u32 {
        self.stag
    }
    /// Remote key (the STag to advertise).
    pub fn rkey(&self) -> u32 {
        self.stag
    }
    /// The STag with a different 8-bit key, as a fast-register assigns it.
    pub fn stag_with_key(&self, key: u8) -> u32 {
        (self.stag & !0xFF) | key as u32
    }
    /// Tagged offset of the first byte (the "addr" to advertise).
    pub fn addr(&self) -> u64 {
        self.iova
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The rights it was registered with.
    pub fn access(&self) -> Access {
        self.access
    }
    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
    /// Whether it is a fast-register region (`alloc_mr`), bound by a `RegMr` work request.
    pub fn is_fast_reg(&self) -> bool {
        self.kind == MrKind::FastReg
    }

    /// The backing storage (for providers and zero-copy users).
    pub fn buffer(&self) -> Option<&Arc<Buffer>> {
        self.buffer.as_ref()
    }

    fn buf(&self) -> std::result::Result<&Arc<Buffer>, OutOfBounds> {
        self.buffer.as_ref().ok_or(OutOfBounds)
    }

    /// A scatter/gather element covering `len` bytes at byte offset `off`.
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.iova + off as u64,
            length: len,
            lkey: self.stag,
        }
    }

    /// Copies `data` into the region at byte offset `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> std::result::Result<(), OutOfBounds> {
        self.buf()?.write(off, data)
    }
    /// Copies bytes at `off` into `out`.
    pub fn read(&self, off: usize, out: &mut [u8]) -> std::result::Result<(), OutOfBounds> {
        self.buf()?.read(off, out)
    }
    /// Returns a copy of `len` bytes at `off`.
    pub fn to_vec(&self, off: usize, len: usize) -> std::result::Result<Vec<u8>, OutOfBounds> {
        self.buf()?.read_to_vec(off, len)
    }
    /// Fills `len` bytes at `off` with `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> std::result::Result<(), OutOfBounds> {
        self.buf()?.fill(off, len, byte)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let dev = self.pd.device();
        dev.inner.mem.remove(self.stag);
        dev.inner.provider.dereg_mr(self.stag);
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MemoryRegion(stag {:#010x}, addr {:#x}, {} bytes, {:?})",
            self.stag, self.iova, self.len, self.access
        )
    }
}

// ---- ports, GIDs and P_Keys (types in `port`) ----

impl Device {
    /// Number of physical ports (`ibv_device_attr.phys_port_cnt`).
    pub fn phys_port_cnt(&self) -> u8 {
        self.provider().phys_port_cnt()
    }

    fn check_port(&self, port_num: u8) -> Result<()> {
        if port_num == 0 || port_num > self.phys_port_cnt() {
            return Err(InvalidArg::Port {
                port: port_num,
                max: self.phys_port_cnt(),
            }
            .into());
        }
        Ok(())
    }

    /// Attributes of port `port_num` (`ibv_query_port`; ports count from 1).
    pub fn query_port(&self, port_num: u8) -> Result<crate::port::PortAttr> {
        self.check_port(port_num)?;
        Ok(self.provider().query_port(port_num))
    }

    /// Entry `index` of the port's GID table (`ibv_query_gid`).
    pub fn query_gid(&self, port_num: u8, index: u32) -> Result<crate::qp_attr::Gid> {
        self.check_port(port_num)?;
        self.provider().query_gid(port_num, index)
    }

    /// Entry `index` of the port's P_Key table (`ibv_query_pkey`).
    pub fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16> {
        self.check_port(port_num)?;
        self.provider().query_pkey(port_num, index)
    }

    /// The device's statistics counters, like the `hw_counters` directory of a Linux RDMA
    /// device (`rdma statistic show`): packets sent and received, retransmissions, NAKs,
    /// drops. Which counters exist is the provider's choice; a provider without any
    /// returns none ([`Provider::query_counters`]).
    pub fn hw_counters(&self) -> Vec<crate::provider::HwCounter> {
        self.provider().query_counters()
    }

    /// The counter `name` of [`Device::hw_counters`], if the provider has it.
    pub fn hw_counter(&self, name: &str) -> Option<u64> {
        self.hw_counters().into_iter().find(|c| c.name == name).map(|c| c.value)
    }
}

// ---- asynchronous events (types in `async_event`) ----

impl Device {
    /// The next asynchronous event, waiting up to `timeout` (`ibv_get_async_event`).
    pub fn get_async_event(&self, timeout: Option<std::time::Duration>) -> Option<crate::async_event::AsyncEvent> {
        self.inner.async_events.pop_timeout(timeout)
    }

    /// Async [`get_async_event`](Self::get_async_event).
    pub async fn next_async_event(&self) -> Option<crate::async_event::AsyncEvent> {
        self.inner.async_events.pop_async().await
    }

    /// Raise an event that is not a QP's CM event (CQ overflow, port change);
    /// providers reach it through [`DeviceProviderExt`](crate::provider::DeviceProviderExt).
    pub(crate) fn push_async_event(&self, ev: crate::async_event::AsyncEvent) {
        crate::async_event::push_bounded(&self.inner.async_events, ev)
    }
}
