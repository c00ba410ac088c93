//! The one module of `rpcrdma` with `unsafe` code: reading chunk data where the RDMA
//! operations placed it instead of copying it out of the registered region first (issue 18:
//! those copies were the user-space copies of a 1 MiB READ or WRITE that ONC RPC over TCP
//! does not make, or makes fewer of).
//!
//! Registered memory is shared with "the NIC" (the engine, the kernel's socket calls), so
//! `verbs` forms no `&[u8]` to it except through [`verbs::buffer::Buffer::with_slice`], whose
//! caller must know that nothing writes the range meanwhile. Two places in this crate know
//! it; they are the only callers of [`with_quiet`]:
//!
//! * the **Requester**, decoding a Reply's Write list and Reply chunk from its chunk region
//!   once the Reply (or RDMA_ERROR) was delivered: every STag that made the region remotely
//!   writable was invalidated by then (its Local Invalidate completed, or the Responder's
//!   Send With Invalidate did it; RFC 8166 §4.2 / RFC 5040 §5.5: the RNIC rejects any tagged
//!   access through an invalid STag), the Responder's Writes before its Reply were placed
//!   before the Reply's Receive completed (an RC QP places in order), and the region is out
//!   of the client's pool, owned by that RPC until the decode returns;
//! * the **Responder**, running a procedure on a Call's Read chunks in the stage its RDMA
//!   Reads filled: the stage was registered by the server LOCAL_WRITE only and never
//!   advertised (no STag reaches it from the peer), every Read into it was signalled and
//!   completed before the stage was handed to the Call, and the connection posts nothing
//!   naming it until the Call comes back from the I/O pool.

use verbs::MemoryRegion;

/// Runs `f` over `len` octets at byte offset `off` of `mr`, or `None` when the range is not
/// inside it. Only for a region that nothing writes while `f` runs: the two cases in the
/// module documentation.
pub(super) fn with_quiet<R>(mr: &MemoryRegion, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    let buf = mr.buffer()?;
    // SAFETY: `with_slice` needs that nothing writes the range while `f` runs. The writers of
    // a registered buffer are work requests: remote ones through an STag, and local ones
    // naming the region's lkey. The callers (module documentation) hold a region that no
    // valid STag reaches and on which no local work request is outstanding or can be posted
    // until `f` returns (the region is owned by the one RPC or Call that runs `f`).
    unsafe { buf.with_slice(off, len, f) }.ok()
}
