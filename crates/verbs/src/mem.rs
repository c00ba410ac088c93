//! The device's memory table: STag -> region, and every access check.
//!
//! An iWARP STag is a 24-bit index and an 8-bit key (RFC 5040 §4.4, RFC 5042
//! §5.1). The index is drawn at random from the whole 24-bit space and the key
//! at random, so STags are hard to predict (RDMAP-SEC-08); a freed index gets a
//! new key when reused. Every remote or local use goes through
//! [`MemTable::check`], which checks validity, key, protection domain, stream
//! scope, access rights, bounds and 64-bit wrap (RDMAP-SEC-01..06,
//! RDMAP-ERR-07), in that order, and returns the first failure.

use crate::buffer::Buffer;
use crate::types::Access;
use rand::Rng;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

/// Why an access was refused. Providers map this to their wire error
/// (iWARP: a DDP tagged-buffer or RDMAP remote-protection Terminate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// No region under this index, wrong key, or invalidated.
    InvalidStag,
    /// The range is not inside the region.
    BaseBounds,
    /// The region lacks the needed right.
    AccessRights,
    /// The region belongs to another protection domain, or is bound to another stream.
    NotAssociated,
    /// `to + len` wraps 2^64.
    ToWrap,
}

/// What kind of registration an STag names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrKind {
    /// `reg_mr`: valid from registration to deregistration; cannot be
    /// invalidated by a peer.
    Regular,
    /// `alloc_mr` + fast-register work request: valid between a fast-register
    /// and a (local or remote) invalidate.
    FastReg,
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: u8,
    pub pd: u32,
    pub kind: MrKind,
    pub valid: bool,
    /// Tagged-offset base (the "virtual address" of the first byte).
    pub iova: u64,
    pub len: u64,
    pub access: Access,
    /// Storage and the offset of `iova` inside it (None for an unbound fast-reg MR).
    pub buffer: Option<(Arc<Buffer>, usize)>,
    /// The stream (QP number) an STag is scoped to, if any (RDMAP-SEC-02).
    pub bound_qp: Option<u32>,
    /// Maximum length a fast-reg MR may cover.
    pub max_len: u64,
}

/// The fields of a registration an access is checked against.
#[derive(Debug, Clone, Copy)]
struct CheckedFields {
    key: u8,
    valid: bool,
    pd: u32,
    bound_qp: Option<u32>,
    access: Access,
    iova: u64,
    len: u64,
}

impl Default for CheckedFields {
    /// An empty snapshot: invalid, no rights (an empty [`MrCache`] is never used, its
    /// generation 0 matches no table; this is only its filler).
    fn default() -> Self {
        CheckedFields {
            key: 0,
            valid: false,
            pd: 0,
            bound_qp: None,
            access: Access::empty(),
            iova: 0,
            len: 0,
        }
    }
}

impl Entry {
    /// What [`MemTable::check_fields`] checks an access against.
    fn checked_fields(&self) -> CheckedFields {
        CheckedFields {
            key: self.key,
            valid: self.valid,
            pd: self.pd,
            bound_qp: self.bound_qp,
            access: self.access,
            iova: self.iova,
            len: self.len,
        }
    }
}

/// The result of a successful check: where the bytes are.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The region's bytes.
    pub buffer: Arc<Buffer>,
    /// Offset inside `buffer` of the first byte addressed.
    pub offset: usize,
}

/// Why an invalidation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidateError {
    /// Unknown index or key.
    InvalidStag,
    /// Belongs to another PD or stream (RDMAP-SND-06).
    NotAssociated,
    /// A regular registration: only its owner can end it (RDMAP-SEC-07).
    NotInvalidatable,
}

thread_local! {
    /// Look-ups in any table's map made by this thread (see [`MemTable::count_lookup`]).
    static LOOKUPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many STag look-ups in a table's map ([`MemTable::check`], [`MemTable::verify`], a
/// [`MemTable::check_cached`] its cache did not answer; any table) the calling thread has
/// made: for tests that count the cost of one caller's post per SGE (issue 18), whatever
/// other threads of the device do meanwhile. [`MemTable::lookups`] counts one table's
/// look-ups by every thread.
pub fn thread_mem_lookups() -> u64 {
    LOOKUPS.with(|n| n.get())
}

/// The per-device table of registrations.
#[derive(Default)]
pub struct MemTable {
    /// By STag index. FxHash, not SipHash: every work request and every tagged
    /// segment looks an STag up here, and the indices are ours (random, chosen
    /// by [`insert`](Self::insert)), so a peer cannot choose colliding keys.
    inner: RwLock<FxHashMap<u32, Entry>>,
    /// Bumped under the write lock by every change of the table (register, deregister,
    /// invalidate, fast-register): an [`MrCache`] filled at generation `g` is exact while
    /// the table is still at `g`.
    generation: AtomicU64,
    /// Look-ups in the map (every check that an [`MrCache`] did not answer): counted for
    /// the guards of issue 13 (MemTable look-ups per RDMA Write).
    lookups: AtomicU64,
}

/// One STag's registration as it was at a table generation: what [`MemTable::check_cached`]
/// checks an access against without the table's lock and hash look-up (issue 13: a QP
/// that posts or receives Writes to one region looked it up twice per Write).
///
/// A QP keeps one per direction (its requester's lkeys, its responder's rkeys). It holds
/// the memory weakly: a cache never keeps a deregistered region's bytes alive.
#[derive(Debug, Default)]
pub struct MrCache {
    /// Table generation the snapshot was taken at (0: empty; the table starts at 1).
    generation: u64,
    /// The full STag (index and key) the snapshot is of.
    stag: u32,
    fields: CheckedFields,
    buffer: Option<(Weak<Buffer>, usize)>,
}

impl MemTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the write lock for a change: the generation moves first, so a cached
    /// snapshot is not used once the change can be seen.
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, FxHashMap<u32, Entry>> {
        let map = self.inner.write().unwrap();
        self.generation.fetch_add(1, Ordering::AcqRel);
        map
    }

    /// The current generation (1 + number of changes so far).
    #[inline]
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire) + 1
    }

    /// How many checks looked the map up (those an [`MrCache`] did not answer), by any
    /// thread: for guards of work that a provider does on whichever thread receives (a
    /// responder's checks). [`thread_mem_lookups`] counts the calling thread's only.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// One look-up in the map: counted for the table (all threads) and for the thread.
    #[inline]
    fn count_lookup(&self) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        LOOKUPS.with(|n| n.set(n.get() + 1));
    }

    fn fresh_index(map: &FxHashMap<u32, Entry>) -> u32 {
        let mut rng = rand::rng();
        loop {
            // Index 0 is never used: STag 0 is special to some hardware, and
            // siw's RTR uses STag 1 (peers file §1.2).
            let idx = rng.random_range(1..(1u32 << 24));
            if !map.contains_key(&idx) {
                return idx;
            }
        }
    }

    fn fresh_key(old: Option<u8>) -> u8 {
        let mut rng = rand::rng();
        loop {
            let k: u8 = rng.random();
            if Some(k) != old {
                return k;
            }
        }
    }

    /// Registers a region and returns its STag.
    pub(crate) fn insert(&self, mut e: Entry) -> u32 {
        let mut map = self.write();
        let idx = Self::fresh_index(&map);
        e.key = Self::fresh_key(None);
        let stag = (idx << 8) | e.key as u32;
        map.insert(idx, e);
        stag
    }

    /// Removes a registration (deregister). In-flight operations keep their
    /// `Arc<Buffer>`; new ones fail with `InvalidStag`.
    pub(crate) fn remove(&self, stag: u32) {
        self.write().remove(&(stag >> 8));
    }

    /// Checks an access of `len` bytes at tagged offset `to` through `stag`,
    /// by a stream in protection domain `pd` with QP number `qp`.
    pub fn check(&self, stag: u32, pd: u32, qp: u32, to: u64, len: u64, need: Access) -> Result<Resolved, AccessError> {
        self.check_with(stag, pd, qp, to, len, need, |buffer, offset| Resolved {
            buffer: buffer.clone(),
            offset,
        })
    }

    /// [`check`](Self::check) without taking a reference to the memory: for a
    /// check at post time, when the bytes are resolved again at execution.
    pub fn verify(&self, stag: u32, pd: u32, qp: u32, to: u64, len: u64, need: Access) -> Result<(), AccessError> {
        self.check_with(stag, pd, qp, to, len, need, |_, _| ())
    }

    /// [`check`](Self::check) through `cache`: the same checks in the same order with the
    /// same result, against the cache's snapshot of `stag`'s registration when the table
    /// has not changed since it was taken (no lock, no look-up), else against the table,
    /// whose entry then replaces the snapshot.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn check_cached(
        &self,
        cache: &mut MrCache,
        stag: u32,
        pd: u32,
        qp: u32,
        to: u64,
        len: u64,
        need: Access,
    ) -> Result<Resolved, AccessError> {
        if cache.stag == stag && cache.generation == self.generation() {
            // The snapshot is the table's entry: the same checks, inline at the caller.
            let at = Self::check_fields(cache.fields, stag, pd, qp, to, len, need)?;
            let Some((b, base)) = &cache.buffer else {
                return Err(AccessError::InvalidStag);
            };
            if let Some(buffer) = b.upgrade() {
                return Ok(Resolved {
                    buffer,
                    offset: base + at,
                });
            }
        }
        self.check_and_cache(cache, stag, pd, qp, to, len, need)
    }

    /// [`check_cached`](Self::check_cached) when the cache does not answer: the table's
    /// check, and the entry's snapshot into the cache.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn check_and_cache(
        &self,
        cache: &mut MrCache,
        stag: u32,
        pd: u32,
        qp: u32,
        to: u64,
        len: u64,
        need: Access,
    ) -> Result<Resolved, AccessError> {
        let map = self.inner.read().unwrap();
        self.count_lookup();
        // Under the read lock no change is under way: the generation read here is the
        // entry's.
        let generation = self.generation();
        let e = map.get(&(stag >> 8)).ok_or(AccessError::InvalidStag)?;
        *cache = MrCache {
            generation,
            stag,
            fields: e.checked_fields(),
            buffer: e.buffer.as_ref().map(|(b, o)| (Arc::downgrade(b), *o)),
        };
        Self::entry_check(e, stag, pd, qp, to, len, need, |buffer, offset| Resolved {
            buffer: buffer.clone(),
            offset,
        })
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn check_with<R>(
        &self,
        stag: u32,
        pd: u32,
        qp: u32,
        to: u64,
        len: u64,
        need: Access,
        found: impl FnOnce(&Arc<Buffer>, usize) -> R,
    ) -> Result<R, AccessError> {
        let map = self.inner.read().unwrap();
        self.count_lookup();
        let e = map.get(&(stag >> 8)).ok_or(AccessError::InvalidStag)?;
        Self::entry_check(e, stag, pd, qp, to, len, need, found)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn entry_check<R>(
        e: &Entry,
        stag: u32,
        pd: u32,
        qp: u32,
        to: u64,
        len: u64,
        need: Access,
        found: impl FnOnce(&Arc<Buffer>, usize) -> R,
    ) -> Result<R, AccessError> {
        let at = Self::check_fields(e.checked_fields(), stag, pd, qp, to, len, need)?;
        let (buffer, base) = e.buffer.as_ref().ok_or(AccessError::InvalidStag)?;
        Ok(found(buffer, base + at))
    }

    /// Validity, key, PD, stream scope, rights, wrap and bounds, in that order
    /// (RDMAP-SEC-01..06, RDMAP-ERR-07); the offset of `to` in the region.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn check_fields(
        e: CheckedFields,
        stag: u32,
        pd: u32,
        qp: u32,
        to: u64,
        len: u64,
        need: Access,
    ) -> Result<usize, AccessError> {
        if e.key != (stag & 0xFF) as u8 || !e.valid {
            return Err(AccessError::InvalidStag);
        }
        if e.pd != pd || e.bound_qp.is_some_and(|b| b != qp) {
            return Err(AccessError::NotAssociated);
        }
        if !e.access.contains(need) {
            return Err(AccessError::AccessRights);
        }
        let end = to.checked_add(len).ok_or(AccessError::ToWrap)?;
        let region_end = e.iova.checked_add(e.len).ok_or(AccessError::BaseBounds)?;
        if to < e.iova || end > region_end {
            return Err(AccessError::BaseBounds);
        }
        Ok((to - e.iova) as usize)
    }

    /// Invalidates a fast-registered STag on behalf of a remote Send with
    /// Invalidate (RDMAP-SND-06) arriving on stream `qp` in `pd`.
    pub fn remote_invalidate(&self, stag: u32, pd: u32, qp: u32) -> Result<(), InvalidateError> {
        self.invalidate(stag, pd, Some(qp))
    }

    /// Local invalidate work request: the owner (same PD) ends a fast-reg STag.
    pub fn local_invalidate(&self, stag: u32, pd: u32) -> Result<(), InvalidateError> {
        self.invalidate(stag, pd, None)
    }

    /// The checks both invalidations make, in this order: the key, the PD, the kind.
    /// A remote one (`remote_qp`) also needs the STag valid and, if bound to a QP, bound
    /// to that one; a local one may invalidate an already invalid STag again.
    fn invalidate(&self, stag: u32, pd: u32, remote_qp: Option<u32>) -> Result<(), InvalidateError> {
        let mut map = self.write();
        let e = map.get_mut(&(stag >> 8)).ok_or(InvalidateError::InvalidStag)?;
        if e.key != (stag & 0xFF) as u8 || (remote_qp.is_some() && !e.valid) {
            return Err(InvalidateError::InvalidStag);
        }
        let other_qp = |qp| e.bound_qp.is_some_and(|b| b != qp);
        if e.pd != pd || remote_qp.is_some_and(other_qp) {
            return Err(InvalidateError::NotAssociated);
        }
        if e.kind != MrKind::FastReg {
            return Err(InvalidateError::NotInvalidatable);
        }
        e.valid = false;
        Ok(())
    }

    /// Fast-register work request: binds an allocated (fast-reg) STag to
    /// `len` bytes of `buffer` starting at `offset`, at tagged offset `iova`,
    /// with `access`, and a new key. Returns the new STag.
    #[allow(clippy::too_many_arguments)]
    pub fn fast_register(
        &self,
        stag: u32,
        pd: u32,
        key: u8,
        buffer: Arc<Buffer>,
        offset: usize,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, InvalidateError> {
        let mut map = self.write();
        let e = map.get_mut(&(stag >> 8)).ok_or(InvalidateError::InvalidStag)?;
        if e.kind != MrKind::FastReg || e.pd != pd {
            return Err(InvalidateError::NotAssociated);
        }
        if len > e.max_len || offset.checked_add(len as usize).is_none_or(|end| end > buffer.len()) {
            return Err(InvalidateError::InvalidStag);
        }
        e.key = key;
        e.valid = true;
        e.iova = iova;
        e.len = len;
        e.access = access;
        e.buffer = Some((buffer, offset));
        Ok((stag & !0xFF) | key as u32)
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.inner.read().unwrap().len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Access;

    fn table_with(access: Access, kind: MrKind, bound: Option<u32>) -> (MemTable, u32, u64) {
        let t = MemTable::new();
        let buf = Arc::new(Buffer::new(4096).unwrap());
        let iova = 0x1000_0000;
        let stag = t.insert(Entry {
            key: 0,
            pd: 1,
            kind,
            valid: true,
            iova,
            len: 4096,
            access: access | Access::LOCAL_READ,
            buffer: Some((buf, 0)),
            bound_qp: bound,
            max_len: 4096,
        });
        (t, stag, iova)
    }

    #[test]
    fn bounds_rdmap_sec_03() {
        let (t, s, base) = table_with(Access::REMOTE_WRITE, MrKind::Regular, None);
        let w = Access::REMOTE_WRITE;
        assert!(t.check(s, 1, 9, base, 4096, w).is_ok());
        assert_eq!(t.check(s, 1, 9, base + 4095, 1, w).unwrap().offset, 4095);
        assert_eq!(t.check(s, 1, 9, base - 1, 1, w).unwrap_err(), AccessError::BaseBounds);
        assert_eq!(
            t.check(s, 1, 9, base + 4096, 1, w).unwrap_err(),
            AccessError::BaseBounds
        );
        assert_eq!(
            t.check(s, 1, 9, base + 1, 4096, w).unwrap_err(),
            AccessError::BaseBounds
        );
        assert_eq!(t.check(s, 1, 9, u64::MAX, 2, w).unwrap_err(), AccessError::ToWrap);
        // Zero-length at the end is in bounds.
        assert!(t.check(s, 1, 9, base + 4096, 0, w).is_ok());
    }

    #[test]
    fn key_pd_rights_scope_rdmap_sec_01_02_05() {
        let (t, s, base) = table_with(Access::REMOTE_READ, MrKind::Regular, None);
        assert_eq!(
            t.check(s ^ 1, 1, 9, base, 1, Access::REMOTE_READ).unwrap_err(),
            AccessError::InvalidStag
        );
        assert_eq!(
            t.check(s, 2, 9, base, 1, Access::REMOTE_READ).unwrap_err(),
            AccessError::NotAssociated
        );
        assert_eq!(
            t.check(s, 1, 9, base, 1, Access::REMOTE_WRITE).unwrap_err(),
            AccessError::AccessRights
        );
        let (t2, s2, b2) = table_with(Access::REMOTE_READ, MrKind::Regular, Some(5));
        assert!(t2.check(s2, 1, 5, b2, 1, Access::REMOTE_READ).is_ok());
        assert_eq!(
            t2.check(s2, 1, 6, b2, 1, Access::REMOTE_READ).unwrap_err(),
            AccessError::NotAssociated
        );
    }

    #[test]
    fn invalidate_rules_rdmap_snd_06_sec_07() {
        let (t, s, base) = table_with(Access::REMOTE_WRITE, MrKind::Regular, None);
        assert_eq!(t.remote_invalidate(s, 1, 9), Err(InvalidateError::NotInvalidatable));
        let (t, s, _) = table_with(Access::REMOTE_WRITE, MrKind::FastReg, None);
        assert_eq!(t.remote_invalidate(s, 2, 9), Err(InvalidateError::NotAssociated));
        assert_eq!(t.remote_invalidate(s, 1, 9), Ok(()));
        assert_eq!(
            t.check(s, 1, 9, base, 1, Access::REMOTE_WRITE).unwrap_err(),
            AccessError::InvalidStag
        );
        assert_eq!(t.remote_invalidate(s, 1, 9), Err(InvalidateError::InvalidStag));
        // Re-register with a new key: old STag stays dead, new one works.
        let buf = Arc::new(Buffer::new(100).unwrap());
        let new = t
            .fast_register(
                s,
                1,
                (s as u8).wrapping_add(1),
                buf,
                0,
                0x5000,
                100,
                Access::REMOTE_WRITE,
            )
            .unwrap();
        assert_ne!(new, s);
        assert!(t.check(new, 1, 9, 0x5000, 100, Access::REMOTE_WRITE).is_ok());
        assert_eq!(
            t.check(s, 1, 9, 0x5000, 1, Access::REMOTE_WRITE).unwrap_err(),
            AccessError::InvalidStag
        );
    }

    #[test]
    fn stags_are_sparse_rdmap_sec_08() {
        let t = MemTable::new();
        let mut stags = Vec::new();
        for _ in 0..2000 {
            stags.push(t.insert(Entry {
                key: 0,
                pd: 1,
                kind: MrKind::Regular,
                valid: true,
                iova: 0,
                len: 0,
                access: Access::empty(),
                buffer: None,
                bound_qp: None,
                max_len: 0,
            }));
        }
        let mut sorted = stags.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), stags.len(), "unique");
        // No arithmetic progression between consecutive allocations.
        let diffs: std::collections::HashSet<i64> = stags.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
        assert!(diffs.len() > 1900);
        // Keys vary.
        let keys: std::collections::HashSet<u8> = stags.iter().map(|s| *s as u8).collect();
        assert!(keys.len() > 200);
        // Reuse after free gets a different value.
        let s = stags[0];
        t.remove(s);
        assert!(stags.iter().all(|x| *x != 0));
    }

    /// Every check through one cache, against the same check of the table, over a
    /// sequence of accesses and table changes: the cache answers exactly as the table
    /// (RDMAP-SEC-01..06, RDMAP-ERR-07), and looks the map up only after a change or for
    /// another STag (issue 13).
    #[test]
    fn cached_checks_match_the_table_rdmap_sec_01_06() {
        let (t, s, base) = table_with(Access::REMOTE_WRITE | Access::REMOTE_READ, MrKind::FastReg, None);
        let mut c = MrCache::default();
        let probe = |t: &MemTable, c: &mut MrCache, s: u32| {
            let cases = [
                (s, 1, 9, base, 4096, Access::REMOTE_WRITE),
                (s, 1, 9, base + 4095, 1, Access::REMOTE_READ),
                (s, 1, 9, base - 1, 1, Access::REMOTE_WRITE),
                (s, 1, 9, base + 1, 4096, Access::REMOTE_WRITE),
                (s, 1, 9, u64::MAX, 2, Access::REMOTE_WRITE),
                (s, 2, 9, base, 1, Access::REMOTE_WRITE),
                (s, 1, 9, base, 1, Access::REMOTE_ATOMIC),
                (s ^ 1, 1, 9, base, 1, Access::REMOTE_WRITE),
            ];
            for (stag, pd, qp, to, len, need) in cases {
                let want = t.check(stag, pd, qp, to, len, need).map(|r| r.offset);
                let got = t.check_cached(c, stag, pd, qp, to, len, need).map(|r| r.offset);
                assert_eq!(got, want, "stag {stag:#x} pd {pd} to {to:#x} len {len} {need:?}");
            }
        };
        probe(&t, &mut c, s);
        // Warm (the last probe was of another key): the same STag again looks nothing up.
        assert!(t.check_cached(&mut c, s, 1, 9, base, 1, Access::REMOTE_WRITE).is_ok());
        let l0 = t.lookups();
        for _ in 0..100 {
            assert_eq!(
                t.check_cached(&mut c, s, 1, 9, base + 64, 64, Access::REMOTE_WRITE)
                    .unwrap()
                    .offset,
                64
            );
        }
        assert_eq!(t.lookups(), l0, "a warm cache looks nothing up");
        // Invalidated: the cache says so at once.
        assert_eq!(t.remote_invalidate(s, 1, 9), Ok(()));
        assert_eq!(
            t.check_cached(&mut c, s, 1, 9, base, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            AccessError::InvalidStag
        );
        probe(&t, &mut c, s);
        // Fast-registered again under a new key, smaller and read-only.
        let buf = Arc::new(Buffer::new(4096).unwrap());
        let s2 = t
            .fast_register(s, 1, 0x42, buf, 0, base, 512, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(
            t.check_cached(&mut c, s, 1, 9, base, 1, Access::REMOTE_READ)
                .unwrap_err(),
            AccessError::InvalidStag
        );
        probe(&t, &mut c, s2);
        assert_eq!(
            t.check_cached(&mut c, s2, 1, 9, base + 512, 1, Access::REMOTE_READ)
                .unwrap_err(),
            AccessError::BaseBounds
        );
        // Deregistered: gone, and the cache did not keep the bytes alive.
        let b = t.check(s2, 1, 9, base, 1, Access::REMOTE_READ).unwrap().buffer;
        t.remove(s2);
        assert_eq!(
            t.check_cached(&mut c, s2, 1, 9, base, 1, Access::REMOTE_READ)
                .unwrap_err(),
            AccessError::InvalidStag
        );
        assert_eq!(Arc::strong_count(&b), 1, "only this test's reference is left");
        probe(&t, &mut c, s2);
    }

    /// A cache filled from one table generation is not used after a change made by
    /// another thread, whichever STag changed.
    #[test]
    fn a_cache_sees_another_threads_change() {
        let (t, s, base) = table_with(Access::REMOTE_WRITE, MrKind::Regular, None);
        let t = Arc::new(t);
        let mut c = MrCache::default();
        assert!(t.check_cached(&mut c, s, 1, 9, base, 1, Access::REMOTE_WRITE).is_ok());
        let t2 = t.clone();
        std::thread::spawn(move || t2.remove(s)).join().unwrap();
        assert_eq!(
            t.check_cached(&mut c, s, 1, 9, base, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            AccessError::InvalidStag
        );
    }
}
