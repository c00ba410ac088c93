//! The iWARP provider's engine: connections over real TCP sockets.
//!
//! # Progress model
//!
//! Each QP is one [`qp::IwarpQp`]: a protocol core (`qp::Proto`, which does
//! no I/O; `qp/tx.rs` and `qp/rx.rs` hold its transmit and receive sides,
//! `qp/rx_buf.rs` the receive buffer with deframing and direct placement,
//! and `qp/harness.rs` runs cores back to back in memory for
//! `qp/core_tests.rs` and the fuzz targets) and the socket side (`qp/io.rs`:
//! the two small `pump_*` functions around `read`/`readv`/`writev`), behind
//! one mutex. Four kinds of thread make it progress, whichever gets there
//! first:
//!
//! * the application thread in `post_send`: the work request is segmented,
//!   framed and written to the socket at once (no thread hop, which matters on
//!   a 2-vCPU machine where a cross-thread wake-up costs 2-40 µs);
//! * the application thread in `poll_cq`: when the CQ is empty it asks its QPs
//!   to read what the socket has (run-to-completion, like a busy-polling RNIC);
//! * the application thread asleep in a CQ wait (`CompletionQueue::wait`): it
//!   sleeps in `poll(2)` on the QP's socket and receives what arrives itself
//!   (`verbs::cq::Progress::wait_fd`), one wake-up per message as a blocking
//!   TCP reader has, the progress thread muted for the socket meanwhile and
//!   handed it back by a timer when the waiter has gone (issue 18);
//! * the device's progress thread (`driver.rs`), which sleeps in `epoll_wait` on
//!   every socket and wakes only when one becomes readable or writable. An idle
//!   device therefore uses no CPU, and hundreds of QPs share one thread. It is
//!   also the passive side of RDMA Reads and Atomics (nobody polls that CQ):
//!   after it answered a request it stays awake for
//!   [`IwarpConfig::responder_spin`], reading the answering connection's
//!   socket itself (one `read` a pass, as a busy TCP server spins on `recv`)
//!   and polling `epoll_wait` for the rest one pass in 16, so a requester's
//!   next Read finds it running rather than paying a wake-up of an idle vCPU
//!   (issue 18).
//!
//! Contention is settled with try-locks that never lose a wake-up
//! (`driver::Poke`).
//!
//! Busy polling: when an application thread keeps polling a QP's CQ (no gap
//! over 10 µs for 20 µs), the QP stops the progress thread's readable
//! wake-ups for its socket, since the poller reads the socket itself and a
//! third thread waking on a 2-core machine would only steal its core. The
//! wake-ups come back when the poller sleeps in a CQ wait, or after 100 µs
//! without a poll (the progress thread checks muted QPs on that period).
//!
//! # Data path
//!
//! Transmit (`txq`): every message is cut into DDP segments of at most
//! MULPDU octets and framed as MPA FPDUs onto a gather list. Headers, pads and
//! CRCs go to a small arena; a payload of 2 KiB or more stays where it is, in
//! the registered region, and reaches the kernel through `writev` (when CRCs
//! are on they are computed over the region through a 4 KiB bounce buffer).
//! Smaller payloads are copied next to their header, which beats an extra
//! iovec.
//!
//! Receive: one `read` fills a 256 KiB buffer; whole FPDUs in it are checked
//! (CRC, DDP, RDMAP) and placed. When only the start of a large tagged segment
//! (Write or Read Response, 4 KiB or more) is buffered, the deframer hands
//! the FPDU out (`Deframer::placeable`), its DDP header is parsed once and
//! checked by the same functions as the ordinary path (STag, bounds, rights,
//! PD, or the outstanding Read it answers) and the rest of the payload is
//! `readv`ed straight into the target region, together with the FPDU's
//! trailer and the next FPDU's header, so a stream of large Writes costs one
//! `readv` per FPDU and no userspace copy. The deframer checks the CRC of
//! such an FPDU once it is in place (`Deframer::end_placed`; see the
//! README's deviations).

pub mod cm;
pub(crate) mod driver;
pub use driver::{hot_answers, responder_wakeups, unmute_timer_sets};
pub mod qp;
pub(crate) mod sockio;
mod txq;

use std::sync::Arc;
use std::time::Duration;
use verbs::{Device, DeviceAttr};

pub use crate::wire::mpa::Rtr;

/// How the provider negotiates and frames connections. The defaults match
/// what Linux soft-iWARP sends, so a siw peer accepts us unchanged.
#[derive(Debug, Clone)]
pub struct IwarpConfig {
    /// Device name shown by `softrdma devices`.
    pub name: String,
    /// Ask for MPA CRC (C flag). CRC is used if either side asks (RFC 5044 §7.1.2).
    pub crc: bool,
    /// MPA revision to request: 1 (RFC 5044) or 2 (RFC 6581, siw's default).
    pub mpa_revision: u8,
    /// Peer-to-peer mode with these acceptable RTR types (RFC 6581 §4); `None`: off (siw's default).
    pub p2p: Option<Vec<Rtr>>,
    /// Refuse peers that require markers (siw does); default false: we insert them.
    pub reject_markers: bool,
    /// Largest MPA private data we accept from a peer (RFC 5044: 512; siw: 256).
    pub max_private_data: usize,
    /// Largest MPA private data we send, IRD/ORD words included. Default
    /// 256, not RFC 5044's 512: Linux 6.1 siw as initiator dereferences NULL
    /// on a Reply with more than 256 octets (docs/interop-siw.md, D9). Set
    /// 512 for the RFC's limit with peers that take it.
    pub max_private_data_tx: usize,
    /// Initiator's wait for the MPA Reply (siw: 5 s).
    pub reply_timeout: Duration,
    /// Responder's wait for the MPA Request (siw: 10 s).
    pub request_timeout: Duration,
    /// Emit Terminates in Linux siw's bit order instead of the RFC's.
    pub terminate_siw_form: bool,
    /// Largest ULPDU we send (bounded by MPA's 65535 and by MULPDU).
    pub max_ulpdu: usize,
    /// Listeners: `listen(2)` backlog and the most connections in MPA
    /// negotiation at once (see [`cm`]'s listener resource model).
    pub listener: cm::ListenerLimits,
    /// How long the progress thread keeps polling its sockets without
    /// sleeping after it answered a peer's RDMA Read or Atomic request
    /// (issue 18). A passive Read responder has no application thread that
    /// polls (as `ib_read_lat`'s server), so every Request would otherwise
    /// wake the progress thread from `epoll_wait`: on an idle 2-vCPU VM
    /// that wake-up (the vCPU leaving its idle state) was most of a quiet
    /// machine's Read round trip. A requester that issues its next Read
    /// within this finds the thread awake. Zero: sleep at once. An idle
    /// device still uses no CPU once the window has passed.
    pub responder_spin: Duration,
}

impl Default for IwarpConfig {
    fn default() -> Self {
        IwarpConfig {
            name: "siw_soft0".into(),
            crc: false,
            mpa_revision: 2,
            p2p: None,
            reject_markers: false,
            max_private_data: crate::wire::mpa::MAX_PRIVATE_DATA,
            max_private_data_tx: crate::wire::mpa::SIW_MAX_PRIVATE_DATA,
            reply_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            terminate_siw_form: false,
            // One FPDU per 64 KiB, a multiple of 8 like siw on loopback.
            max_ulpdu: 65_528,
            listener: cm::ListenerLimits::default(),
            responder_spin: Duration::from_micros(50),
        }
    }
}

/// Device limits of the software RNIC.
pub fn device_attr() -> DeviceAttr {
    DeviceAttr {
        fw_ver: env!("CARGO_PKG_VERSION").into(),
        vendor_id: 0x736f_6674, // "soft"
        max_qp: 65_536,
        max_qp_wr: 32_768,
        max_sge: 16,
        max_sge_rd: 1,
        max_cq: 65_536,
        max_cqe: 1 << 20,
        max_mr: 1 << 20,
        max_mr_size: 1 << 40,
        max_pd: 65_536,
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
        max_msg_sz: u32::MAX as u64,
        max_inline_data: 4096,
        max_fast_reg_page_list_len: 1 << 16,
        atomic_cap: true,
    }
}

/// Opens a software iWARP device with its progress thread.
pub fn open_device(cfg: IwarpConfig) -> std::io::Result<Device> {
    let provider = Arc::new(cm::IwarpProvider::new(cfg.clone())?);
    Ok(verbs::provider::new_device(
        cfg.name.clone(),
        provider.clone(),
        Some(provider),
    ))
}
