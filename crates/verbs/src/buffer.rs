//! One of the two modules of `verbs` with `unsafe` code (the other is
//! `waitfd`, the system calls of a CQ's inline wait): the byte storage behind
//! memory regions.
//!
//! A [`Buffer`] is an anonymous, page-aligned, zero-initialised mapping, or the heap
//! storage of a `Vec<u8>` the application handed over ([`Buffer::from_vec`]), that
//! lives as long as any `Arc<Buffer>` does. The engine keeps an `Arc` for every
//! operation in flight, so deregistering a region while a peer's Write is
//! being placed can never free memory under it.
//!
//! Registered memory is shared with "the NIC" — here the engine and the
//! kernel's socket calls — exactly as DMA memory is shared with hardware.
//! Therefore no `&[u8]`/`&mut [u8]` to it is ever formed inside this crate or
//! the providers: all access goes through raw-pointer copies in this module,
//! bounds-checked against the mapping, or through the kernel (a provider's
//! socket I/O on [`Buffer::raw_range`]). What the application observes while a remote
//! peer writes the same bytes is unspecified, as RFC 5040 §5.5 rules 3-5 say
//! for any RNIC; it is never out-of-bounds and never frees memory.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Page-aligned, zeroed, owned storage of a memory region.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    storage: Storage,
}

/// Who gives the bytes back when the buffer goes.
enum Storage {
    /// An anonymous mapping of this many bytes (`munmap`).
    Mapped(usize),
    /// A `Vec<u8>`'s allocation of this capacity (the global allocator).
    Heap(usize),
}

// SAFETY: the mapping is plain memory owned by this struct; all access goes
// through the methods below, which copy through raw pointers (no references
// are handed out except by the explicitly `unsafe` accessors).
unsafe impl Send for Buffer {}
// SAFETY: as above; concurrent copies are the RNIC-style sharing documented at
// the module level.
unsafe impl Sync for Buffer {}

/// An access outside the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBounds;

impl Buffer {
    /// Maps `len` zeroed bytes (at least one page is mapped even for `len == 0`).
    pub fn new(len: usize) -> std::io::Result<Buffer> {
        let page = page_size();
        let map_len = len
            .max(1)
            .div_ceil(page)
            .checked_mul(page)
            .ok_or_else(|| std::io::Error::other("size overflow"))?;
        // SAFETY: an anonymous private mapping with no address hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p as *mut u8).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Buffer {
            ptr,
            len,
            storage: Storage::Mapped(map_len),
        })
    }

    /// Takes over the bytes of `v` (no copy): `v.len()` octets, in whatever alignment the
    /// allocator gave (not page-aligned), freed when the buffer goes.
    pub fn from_vec(v: Vec<u8>) -> Buffer {
        let mut v = std::mem::ManuallyDrop::new(v);
        let (len, cap) = (v.len(), v.capacity());
        // a Vec's pointer is never null (dangling but non-null when it has no allocation)
        let ptr = NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Buffer {
            ptr,
            len,
            storage: Storage::Heap(cap),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte, the natural iWARP tagged offset base.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn range(&self, off: usize, len: usize) -> Result<*mut u8, OutOfBounds> {
        let end = off.checked_add(len).ok_or(OutOfBounds)?;
        if end > self.len {
            return Err(OutOfBounds);
        }
        // SAFETY: off <= len, and len is within the mapping (or the Vec's initialised length).
        Ok(unsafe { self.ptr.as_ptr().add(off) })
    }

    /// Copies `src` into the buffer at `off`.
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        let dst = self.range(off, src.len())?;
        // SAFETY: dst..dst+len is inside the mapping (checked above); src is a
        // valid slice that cannot overlap the mapping because no reference to
        // the mapping is ever handed out safely.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies bytes at `off` into `dst`.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let src = self.range(off, dst.len())?;
        // SAFETY: as in `write`, with the roles swapped.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Returns a copy of `len` bytes at `off`, in a vector that is not zero-filled first
    /// (`vec![0; len]` and [`read`](Self::read) zeroed every received message before the
    /// copy: a `calloc` and a memset per message, issue 18, session 16).
    pub fn read_to_vec(&self, off: usize, len: usize) -> Result<Vec<u8>, OutOfBounds> {
        let src = self.range(off, len)?;
        let mut v = Vec::with_capacity(len);
        // SAFETY: src..src+len is inside the mapping (checked above) and cannot overlap the
        // fresh vector's allocation, which has room for `len` bytes; after the copy those
        // `len` bytes are initialised, so the length may cover them.
        unsafe {
            std::ptr::copy_nonoverlapping(src, v.as_mut_ptr(), len);
            v.set_len(len);
        }
        Ok(v)
    }

    /// Copies `len` bytes from `self[src_off..]` to `dst[dst_off..]` (regions may be the same buffer).
    pub fn copy_to(&self, src_off: usize, dst: &Buffer, dst_off: usize, len: usize) -> Result<(), OutOfBounds> {
        let s = self.range(src_off, len)?;
        let d = dst.range(dst_off, len)?;
        // SAFETY: both ranges are inside their mappings; `copy` tolerates overlap.
        unsafe { std::ptr::copy(s, d, len) };
        Ok(())
    }

    /// Fills `len` bytes at `off` with `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> Result<(), OutOfBounds> {
        let d = self.range(off, len)?;
        // SAFETY: inside the mapping (checked).
        unsafe { std::ptr::write_bytes(d, byte, len) };
        Ok(())
    }

    /// Raw pointer and length of a checked range, for a provider to hand to
    /// the kernel (its socket I/O into and out of place) or to CRC code.
    pub fn raw_range(&self, off: usize, len: usize) -> Result<(*mut u8, usize), OutOfBounds> {
        Ok((self.range(off, len)?, len))
    }

    /// Runs `f` over an immutable view of a range. The view is only valid for
    /// the closure; bytes a remote peer writes concurrently may change under it
    /// (as with DMA memory), which is why this is not exposed to applications.
    ///
    /// # Safety
    /// The caller must ensure nothing writes the range while `f` runs
    /// (e.g. the range is the source of a Send the application must not modify
    /// until completion, RFC 5040 §5.5 rule 5).
    pub unsafe fn with_slice<R>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R, OutOfBounds> {
        let p = self.range(off, len)?;
        // SAFETY: in bounds (checked); absence of concurrent writers is the
        // caller's obligation stated above.
        Ok(f(unsafe { std::slice::from_raw_parts(p, len) }))
    }

    /// Atomic 64-bit read-modify-write at an 8-byte aligned offset (RFC 7306
    /// §5: atomics must be atomic against other atomics on this RNIC).
    /// `f` maps the old value (native endian, the "endian format of the
    /// target memory") to the new one; returns the old value.
    pub fn atomic_rmw(&self, off: usize, f: impl Fn(u64) -> u64) -> Result<u64, OutOfBounds> {
        let p = self.range(off, 8)?;
        if !(p as usize).is_multiple_of(8) {
            return Err(OutOfBounds);
        }
        // SAFETY: p is in bounds, 8-byte aligned and points into memory that
        // lives as long as `self`; all atomic accesses to it go through here.
        let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
        let mut old = a.load(Ordering::SeqCst);
        loop {
            match a.compare_exchange_weak(old, f(old), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) => return Ok(v),
                Err(v) => old = v,
            }
        }
    }
}

impl Buffer {
    /// Hands the bytes at `off..off + len` to `f` in order, in chunks copied
    /// through a small private bounce buffer (L1-resident), e.g. to compute a
    /// CRC over data the kernel then sends straight from the region. No
    /// reference to the shared mapping is formed (see the module doc).
    pub fn scan(&self, off: usize, len: usize, mut f: impl FnMut(&[u8])) -> Result<(), OutOfBounds> {
        self.range(off, len)?;
        // One bounce buffer per thread, kept between calls: zeroing a fresh 4 KiB on every
        // call cost as much as the copy (RoCE scans each 4 KiB packet it sends), and
        // 64-octet alignment keeps a CRC over it on its fast path. A nested call (from
        // `f`) gets a fresh one.
        let mut bounce = SCAN_BOUNCE
            .with(|b| b.take())
            .unwrap_or_else(|| Box::new(Bounce([0; 4096])));
        let mut at = 0;
        let mut r = Ok(());
        while at < len {
            let n = (len - at).min(bounce.0.len());
            r = self.read(off + at, &mut bounce.0[..n]);
            if r.is_err() {
                break;
            }
            f(&bounce.0[..n]);
            at += n;
        }
        SCAN_BOUNCE.with(|b| b.set(Some(bounce)));
        r
    }
}

/// [`Buffer::scan`]'s bounce buffer.
#[repr(C, align(64))]
struct Bounce([u8; 4096]);

thread_local! {
    static SCAN_BOUNCE: std::cell::Cell<Option<Box<Bounce>>> = const { std::cell::Cell::new(None) };
}

impl Drop for Buffer {
    fn drop(&mut self) {
        match self.storage {
            // SAFETY: ptr/map_len are exactly what mmap returned; this is the only unmap.
            Storage::Mapped(map_len) => unsafe {
                libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, map_len);
            },
            // SAFETY: ptr, len and cap are exactly those of the Vec `from_vec` took over
            // (ManuallyDrop: it was never freed), and this is the only place that rebuilds it.
            Storage::Heap(cap) => drop(unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), self.len, cap) }),
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:#x}, {} bytes)", self.addr(), self.len)
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

impl std::fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("range outside the memory region")
    }
}

impl std::error::Error for OutOfBounds {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        let b = Buffer::new(100).unwrap();
        assert!(b.write(96, &[1, 2, 3, 4]).is_ok());
        assert_eq!(b.write(97, &[1, 2, 3, 4]), Err(OutOfBounds));
        assert_eq!(b.write(usize::MAX, &[1]), Err(OutOfBounds));
        let mut out = [0u8; 4];
        b.read(96, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(b.addr() % 4096, 0);
    }

    #[test]
    fn read_to_vec_copies_exactly_the_range_and_checks_bounds() {
        let b = Buffer::new(100).unwrap();
        let data: Vec<u8> = (0..100u8).collect();
        b.write(0, &data).unwrap();
        assert_eq!(b.read_to_vec(10, 20).unwrap(), &data[10..30]);
        assert_eq!(b.read_to_vec(100, 0).unwrap(), Vec::<u8>::new());
        assert_eq!(b.read_to_vec(0, 100).unwrap(), data);
        assert_eq!(b.read_to_vec(1, 100), Err(OutOfBounds));
        assert_eq!(b.read_to_vec(usize::MAX, 2), Err(OutOfBounds));
    }

    #[test]
    fn scan() {
        let b = Buffer::new(10_000).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        b.write(0, &data).unwrap();
        let mut seen = Vec::new();
        b.scan(100, 9_000, |c| seen.extend_from_slice(c)).unwrap();
        assert_eq!(seen, &data[100..9_100]);
        assert_eq!(b.scan(9_000, 1_001, |_| ()), Err(OutOfBounds));
        assert!(b.raw_range(9_999, 2).is_err());
    }

    #[test]
    fn from_vec_keeps_the_bytes_without_copying() {
        let v: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let at = v.as_ptr() as u64;
        let b = Buffer::from_vec(v);
        assert_eq!(b.addr(), at, "the Vec's own allocation");
        assert_eq!(b.len(), 5000);
        let mut out = [0u8; 3];
        b.read(4997, &mut out).unwrap();
        assert_eq!(out, [(4997u32 as u8), (4998u32 as u8), (4999u32 as u8)]);
        assert_eq!(b.write(4999, &[1, 2]), Err(OutOfBounds));
        let e = Buffer::from_vec(Vec::new());
        assert!(e.is_empty());
        assert_eq!(e.read(0, &mut [0u8; 1]), Err(OutOfBounds));
    }

    #[test]
    fn atomics() {
        let b = Buffer::new(16).unwrap();
        b.write(8, &5u64.to_ne_bytes()).unwrap();
        assert_eq!(b.atomic_rmw(8, |v| v + 3), Ok(5));
        assert_eq!(b.atomic_rmw(8, |v| v), Ok(8));
        assert_eq!(b.atomic_rmw(4, |v| v), Err(OutOfBounds), "unaligned");
        assert_eq!(b.atomic_rmw(16, |v| v), Err(OutOfBounds));
    }
}
