//! Work requests, work completions, access flags and attributes, named as in
//! rdma-core's `<infiniband/verbs.h>` so RDMA programmers find their way.

use crate::ah::AddressHandle;
use bitflags::bitflags;

bitflags! {
    /// Memory access rights (`IBV_ACCESS_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Access: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the device may write the memory (receives, Read responses).
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA Write it (needs LOCAL_WRITE).
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA Read it.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on it.
        const REMOTE_ATOMIC = 1 << 3;
        /// Not an rdma-core flag: a local read is always allowed. Used
        /// internally as the right a local gather needs.
        const LOCAL_READ = 1 << 31;
    }
}

impl Access {
    /// Every right: what `reg_mr` callers usually want in tests.
    pub fn all_remote() -> Access {
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
    }
}

bitflags! {
    /// Send work request flags (`IBV_SEND_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Generate a completion for this work request (needed unless the QP
        /// was created with `sq_sig_all`).
        const SIGNALED = 1;
        /// Ask the peer to raise a solicited event (Send with SE, Immediate with SE).
        const SOLICITED = 1 << 1;
        /// Copy the payload at post time; the SGEs need no valid lkey.
        const INLINE = 1 << 2;
        /// Wait for earlier RDMA Reads/atomics to complete before this one starts (read fence).
        const FENCE = 1 << 3;
    }
}

/// One scatter/gather element: `length` bytes at `addr` in the region named by `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Address (tagged offset) of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// A remote buffer: its address (tagged offset) and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    /// Address (tagged offset) in the peer's region.
    pub addr: u64,
    /// The peer's key for the region.
    pub rkey: u32,
}

/// What a send-queue work request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WrOpcode {
    /// Send.
    Send,
    /// Send with Invalidate of the peer's key `invalidate_rkey`.
    SendWithInv {
        /// The peer's key to invalidate.
        invalidate_rkey: u32,
    },
    /// Send with immediate data (`IBV_WR_SEND_WITH_IMM`): the peer consumes
    /// a receive and sees `imm_data`. Whether a payload may come with it is
    /// the transport's rule (InfiniBand carries one; a provider refuses what
    /// its transport cannot send).
    SendWithImm {
        /// The immediate data the peer's completion carries.
        imm_data: u32,
    },
    /// RDMA Write.
    RdmaWrite {
        /// The peer's buffer.
        remote: RemoteAddr,
    },
    /// RDMA Write with immediate data: the peer consumes a receive and sees
    /// `RecvRdmaWithImm`.
    RdmaWriteWithImm {
        /// The peer's buffer.
        remote: RemoteAddr,
        /// The immediate data the peer's completion carries.
        imm_data: u32,
    },
    /// RDMA Read into the local sg list.
    RdmaRead {
        /// The peer's buffer.
        remote: RemoteAddr,
    },
    /// Fetch and add on the 8 aligned bytes at `remote`; the original
    /// value lands in the (8-byte) local sg list.
    AtomicFetchAdd {
        /// The peer's buffer.
        remote: RemoteAddr,
        /// The value to add.
        add: u64,
    },
    /// Compare and swap on the 8 aligned bytes at `remote`.
    AtomicCmpSwap {
        /// Where.
        remote: RemoteAddr,
        /// The value expected there.
        compare: u64,
        /// The value stored if it matched.
        swap: u64,
    },
    /// Invalidate a local fast-registered key.
    LocalInv {
        /// The key to invalidate.
        rkey: u32,
    },
    /// Fast-register: bind the allocated MR `mr_stag` (from `alloc_mr`) with a
    /// new `key` to `length` bytes of the region `source_lkey` starting at
    /// `source_addr`, reachable at tagged offset `iova` with `access`.
    RegMr {
        /// The STag of the region from `alloc_mr`.
        mr_stag: u32,
        /// The new 8-bit key.
        key: u8,
        /// Local key of the region whose memory is mapped.
        source_lkey: u32,
        /// Address in that region of the first byte.
        source_addr: u64,
        /// Length in bytes.
        length: u64,
        /// Tagged offset of the first byte in the new mapping.
        iova: u64,
        /// Rights of the new mapping.
        access: Access,
    },
}

/// Where an unreliable-datagram send goes (`ibv_send_wr.wr.ud`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdDest {
    /// The address handle of the destination port.
    pub ah: AddressHandle,
    /// The destination QP number (`remote_qpn`; 0xFFFFFF for multicast).
    pub remote_qpn: u32,
    /// The destination QP's Q_Key (`remote_qkey`).
    pub remote_qkey: u32,
}

/// A send-queue work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: WrOpcode,
    /// The local buffers.
    pub sg_list: Vec<Sge>,
    /// `IBV_SEND_*` flags.
    pub flags: SendFlags,
    /// UD QPs: the destination (`wr.ud`); ignored by connected QPs, as in rdma-core.
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A signaled work request (`SendFlags::SIGNALED`) without UD destination.
    pub fn new(wr_id: u64, opcode: WrOpcode, sg_list: Vec<Sge>) -> Self {
        SendWr {
            wr_id,
            opcode,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }
    /// Sends to `dest` (UD QPs).
    pub fn ud(mut self, dest: UdDest) -> Self {
        self.ud = Some(dest);
        self
    }
    /// Replaces the flags.
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }
    /// Total payload length of the sg list.
    pub fn len(&self) -> u64 {
        self.sg_list.iter().map(|s| s.length as u64).sum()
    }
    /// Whether the sg list carries no payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A receive-queue work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where the message may land, in order.
    pub sg_list: Vec<Sge>,
}

/// Work completion status (`ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// Local length error: a received message did not fit, or an sg list is too long.
    LocLenErr,
    /// Local QP operation error: an internal consistency error.
    LocQpOpErr,
    /// Local protection error: an lkey did not cover the sg element or lacked the right.
    LocProtErr,
    /// Work request flushed: the QP went to the error state before it ran.
    WrFlushErr,
    /// Memory window bind error.
    MwBindErr,
    /// Bad response: the peer answered with something unexpected.
    BadRespErr,
    /// Local access error: a remote peer's access to our memory failed (e.g. a bad key in a Send with Invalidate).
    LocAccessErr,
    /// Remote invalid request: the peer could not make sense of our request.
    RemInvReqErr,
    /// Remote access error: the peer refused our Read/Write/atomic (protection).
    RemAccessErr,
    /// Remote operation error: the peer failed to complete the operation.
    RemOpErr,
    /// Transport retry exceeded (the connection was lost).
    RetryExcErr,
    /// Receiver not ready retries exceeded.
    RnrRetryExcErr,
    /// Fatal error.
    FatalErr,
    /// Response timeout.
    RespTimeoutErr,
    /// Other error.
    GeneralErr,
}

impl WcStatus {
    /// The string `ibv_wc_status_str` prints.
    pub fn as_str(&self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What completed (`ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`.
    Send,
    /// `IBV_WC_RDMA_WRITE`.
    RdmaWrite,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv,
    /// `IBV_WC_REG_MR`.
    RegMr,
    /// `IBV_WC_RECV`: a Send arrived.
    Recv,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: an RDMA Write with immediate data arrived.
    RecvRdmaWithImm,
}

bitflags! {
    /// What a completion carries beyond its fields (`ibv_wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// A GRH is in the first 40 bytes of the receive buffer (UD).
        const GRH = 1;
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// The IP checksum was checked and is good.
        const IP_CSUM_OK = 1 << 2;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// A work completion (`ibv_wc`). Providers fill what their transport knows;
/// the UD fields (`src_qp`, `pkey_index`, `slid`, `sl`, `dlid_path_bits`)
/// are 0 on connected QPs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred (Read).
    pub byte_len: u32,
    /// The local QP.
    pub qp_num: u32,
    /// Immediate data, for `Recv`/`RecvRdmaWithImm` of an Immediate Data message.
    pub imm_data: Option<u32>,
    /// The local key a peer's Send with Invalidate invalidated.
    pub invalidated_rkey: Option<u32>,
    /// Whether the message that completed a receive asked for a solicited event.
    pub solicited: bool,
    /// Provider-specific detail of an error (`ibv_wc.vendor_err`; each
    /// provider documents and decodes its own), 0 on success.
    pub vendor_err: u32,
    /// `IBV_WC_GRH`, `IBV_WC_WITH_IMM`, `IBV_WC_WITH_INV`.
    pub wc_flags: WcFlags,
    /// UD receives: the sender's QP number.
    pub src_qp: u32,
    /// UD/GSI receives: the P_Key index the packet matched.
    pub pkey_index: u16,
    /// UD receives: the sender's LID (0 on Ethernet link layers).
    pub slid: u16,
    /// UD receives: the service level.
    pub sl: u8,
    /// UD receives: the destination LID path bits.
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// A completion with every optional field empty (for providers).
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            qp_num,
            imm_data: None,
            invalidated_rkey: None,
            solicited: false,
            vendor_err: 0,
            wc_flags: WcFlags::empty(),
            src_qp: 0,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }
    /// Whether the status is `Success`.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}

/// Queue pair states (`ibv_qp_state`). With the connection manager a QP goes
/// Init -> Rtr -> Rts on establishment and to Err on a fatal error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created, or reset: no work.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained (graceful disconnect in progress).
    Sqd,
    /// Send queue error (UC/UD): the send queue stopped, receives go on.
    Sqe,
    /// Error: outstanding work completes with `WrFlushErr`.
    Err,
}

/// Device limits (`ibv_device_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version text.
    pub fw_ver: String,
    /// IEEE OUI of the vendor.
    pub vendor_id: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Most work requests per queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather elements per work request.
    pub max_sge: u32,
    /// Most scatter/gather elements per RDMA Read.
    pub max_sge_rd: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most entries per CQ.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
    /// Most protection domains.
    pub max_pd: u32,
    /// Max inbound outstanding Reads/atomics per QP (IRD).
    pub max_qp_rd_atom: u32,
    /// Max outbound outstanding Reads/atomics per QP (ORD).
    pub max_qp_init_rd_atom: u32,
    /// Largest message in bytes.
    pub max_msg_sz: u64,
    /// Most inline bytes per send.
    pub max_inline_data: u32,
    /// Most pages of a fast-register work request.
    pub max_fast_reg_page_list_len: u32,
    /// Whether atomics are supported.
    pub atomic_cap: bool,
}

/// Queue pair creation attributes (`ibv_qp_init_attr` for RC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Most send work requests outstanding.
    pub max_send_wr: u32,
    /// Most receive work requests outstanding.
    pub max_recv_wr: u32,
    /// Most scatter/gather elements per send.
    pub max_send_sge: u32,
    /// Most scatter/gather elements per receive.
    pub max_recv_sge: u32,
    /// Most inline bytes per send.
    pub max_inline_data: u32,
    /// Every send WR generates a completion, as if SIGNALED were set.
    pub sq_sig_all: bool,
}

impl Default for QpInitAttr {
    fn default() -> Self {
        QpInitAttr {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 6,
            max_recv_sge: 6,
            max_inline_data: 256,
            sq_sig_all: false,
        }
    }
}

/// Connection parameters (`rdma_conn_param`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnParam {
    /// The ULP's bytes for the peer. How many fit is the transport's limit
    /// (its connection manager refuses more with `InvalidArgument`).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads/atomics we accept at once (IRD).
    pub responder_resources: u8,
    /// Outbound RDMA Reads/atomics we issue at once (ORD).
    pub initiator_depth: u8,
}
