//! A counting global allocator for tests that count heap allocations rather than time them
//! (crates/roce/tests/poll_costs.rs, crates/iwarp/tests/allocs_per_post.rs,
//! crates/rpcrdma/tests/same_mode.rs, crates/ipoib/tests/node_cm_path.rs).
//!
//! A `#[global_allocator]` must be declared in the test crate itself (declared here, it would
//! count in every test linking this crate): [`counting_allocator!`](crate::counting_allocator)
//! declares it, and [`thread_allocs`] and [`big_allocs`] read the counts. Such a test is its
//! own binary.
//!
//! Two counts, both what the code path decides (no timing):
//! - per thread: every `alloc` and `realloc` of the calling thread, so a test counts what one
//!   caller's calls allocate whatever other threads do meanwhile;
//! - process-wide: allocations of at least the allocator's `big` octets (a `realloc` counts
//!   when it grows a block to that size), for packet-sized buffers whichever thread makes them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

static BIG_ALLOCS: AtomicU64 = AtomicU64::new(0);

/// The counting allocator: forwards every call to [`System`] unchanged and counts beside it.
/// Declare it with [`counting_allocator!`](crate::counting_allocator).
pub struct Counting {
    big: usize,
}

impl Counting {
    /// Counts allocations of at least `big` octets process-wide (`usize::MAX`: none).
    pub const fn new(big: usize) -> Counting {
        Counting { big }
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the per-thread count is a
// thread-local `Cell` with a const initialiser (`try_with` neither allocates nor fails while
// the thread lives; during its teardown the call is not counted), the process-wide one an
// atomic. Neither allocates nor locks.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        if l.size() >= self.big {
            BIG_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` or `System.realloc` with layout `l` (above).
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        if new >= self.big && new > l.size() {
            BIG_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for `dealloc`; `new` is the caller's new size.
        unsafe { System.realloc(p, l, new) }
    }
}

/// The calling thread's allocations (`alloc` and `realloc`) so far.
pub fn thread_allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

/// Allocations of at least the allocator's `big` octets so far, all threads.
pub fn big_allocs() -> u64 {
    BIG_ALLOCS.load(Ordering::Relaxed)
}

/// Declares [`Counting`](crate::alloc::Counting) the test crate's `#[global_allocator]`:
/// `testsupport::counting_allocator!();` counts per thread only,
/// `testsupport::counting_allocator!(big = 16 * 1024);` also counts allocations of 16 KiB and
/// more process-wide. Read with [`thread_allocs`] and [`big_allocs`].
#[macro_export]
macro_rules! counting_allocator {
    () => {
        $crate::counting_allocator!(big = usize::MAX);
    };
    (big = $big:expr) => {
        #[global_allocator]
        static TESTSUPPORT_COUNTING: $crate::alloc::Counting = $crate::alloc::Counting::new($big);
    };
}
