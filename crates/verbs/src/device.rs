//! Device, protection domain and memory region: the resources a provider
//! shares with the application.

use crate::buffer::{Buffer, OutOfBounds};
use crate::cm::Provider;
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::mem::{Entry, MemTable, MrKind};
use crate::types::{Access, DeviceAttr, Sge};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) struct DeviceInner {
    pub name: String,
    pub attr: DeviceAttr,
    pub mem: MemTable,
    pub next_pd: AtomicU32,
    pub provider: Arc<dyn Provider>,
    pub async_events: Arc<crate::notify::EventQueue<crate::async_event::AsyncEvent>>,
}

/// An RDMA device (`ibv_context`): a provider instance with its memory table.
/// Cheap to clone.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl Device {
    /// For providers: wraps a provider as a device.
    pub fn new(name: impl Into<String>, attr: DeviceAttr, provider: Arc<dyn Provider>) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                name: name.into(),
                attr,
                mem: MemTable::new(),
                next_pd: AtomicU32::new(1),
                provider,
                async_events: Arc::new(crate::notify::EventQueue::new()),
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Device limits (`ibv_query_device`).
    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// The memory table every access is checked against (for providers).
    pub fn mem(&self) -> &MemTable {
        &self.inner.mem
    }

    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.inner.provider
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            dev: self.clone(),
            id: self.inner.next_pd.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Creates a completion queue with room for `cqe` completions (`ibv_create_cq`).
    pub fn create_cq(&self, cqe: usize) -> Result<CompletionQueue> {
        if cqe == 0 || cqe > self.inner.attr.max_cqe as usize {
            return Err(Error::InvalidArgument(format!(
                "cqe {cqe} not in 1..={}",
                self.inner.attr.max_cqe
            )));
        }
        Ok(CompletionQueue::new(cqe))
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

/// A protection domain (`ibv_pd`): QPs and memory regions in different PDs
/// cannot reach each other (RDMAP-SEC-01).
#[derive(Clone)]
pub struct ProtectionDomain {
    dev: Device,
    id: u32,
}

impl ProtectionDomain {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Registers `len` bytes of fresh, zeroed, page-aligned memory that the
    /// region owns (`ibv_reg_mr`). Its tagged offset base is the memory's
    /// address, as with Linux verbs.
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        if len as u64 > self.dev.inner.attr.max_mr_size {
            return Err(Error::InvalidArgument(format!("length {len} exceeds max_mr_size")));
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            // Same rule as ibv_reg_mr: remote write needs local write.
            return Err(Error::InvalidArgument("REMOTE_WRITE requires LOCAL_WRITE".into()));
        }
        let buffer = Arc::new(Buffer::new(len)?);
        let iova = buffer.addr();
        let stag = self.dev.inner.mem.insert(Entry {
            key: 0,
            pd: self.id,
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
        let stag = self.dev.inner.mem.insert(Entry {
            key: 0,
            pd: self.id,
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

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProtectionDomain({})", self.id)
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
    pub fn len(&self) -> usize {
        self.len as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn access(&self) -> Access {
        self.access
    }
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
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
        let mut v = vec![0u8; len];
        self.read(off, &mut v)?;
        Ok(v)
    }
    /// Fills `len` bytes at `off` with `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> std::result::Result<(), OutOfBounds> {
        self.buf()?.fill(off, len, byte)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.pd.dev.inner.mem.remove(self.stag);
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
