//! An IPoIB node on a real verbs device: the [`Link`] machine driving one UD QP (ARP/ND,
//! broadcast and multicast, unicast to datagram-only peers, with address handles and the
//! groups attached with `attach_mcast`) and, in connected mode (RFC 4755), one RC QP per
//! connection set up by the device's IB CM on the raw service IDs `0x10…|UD QPN` and
//! `0x01…|UD QPN` ([`verbs::Device::listen_ib_service`],
//! [`verbs::QueuePair::connect_ib_service`]) with the 8-octet private data. The kernel side
//! is left to the caller (a TUN device in the daemon, a channel in tests):
//! [`Node::from_kernel`] takes IP packets, [`Node::poll`] returns the IP packets for the
//! kernel.
//!
//! # Connected mode on the device
//!
//! - `Connect`: an RC QP with [`RC_RECV_SLOTS`] receive buffers of [`RC_SLOT`] octets (≥ the
//!   Receive MTU, 65,524) posted, then the CM connect on a helper thread (it waits for the
//!   REP); its outcome comes back over a channel as `on_cm_rep` (REP private data) or
//!   `on_cm_rej` (the REJ reason, provider-independent through `ErrorDetail::code`; 4,
//!   "timeout", when nobody answered).
//! - REQs from the listeners: `on_cm_req` with the service ID, the REQ's GID and private
//!   data; `Accept` binds a new RC QP (RTR, RTS, REP), `RejectReq` answers REJ with the
//!   machine's reason and private data. The RTU (the QP's `Established` event) is
//!   `on_cm_rtu`.
//! - `RcSend`: one of the node's [`RC_SEND_SLOTS`] send buffers (shared by all connections,
//!   signaled; when all are in flight the node reaps completions first); the provider
//!   segments to the path MTU.
//!
//! # The per-packet path (issue 16)
//!
//! [`Node::read_kernel`] reads a packet from the kernel ([`KernelIo`], the TUN) straight
//! into a free send buffer, 4 octets in, and asks the link machine ([`Link::rc_route`])
//! whether it goes to an established connection; if so the encapsulation header goes in
//! front and the buffer is posted as it is (no copy in the daemon; the RoCE provider takes
//! it from there). Anything else (resolution, UD, ICMP errors) is copied out and handed to
//! [`Link::on_kernel_packet`]. On receive, an RC message is checked in its receive buffer
//! ([`Link::on_rc_recv_in_place`]) and the IP packet written into the kernel from there
//! before the buffer is posted again.
//!
//! With checksum offload ([`Node::enable_csum_offload`], a kernel side whose
//! [`KernelIo::offload`] is true) a `virtio_net_hdr` comes in front of each packet read;
//! partial TCP/UDP checksums go on a connection whose peer offered the CM extension
//! ([`CsumExt`]) in the pseudo-header form, and are filled in before anything else leaves
//! (`crate::wire::offload` says what goes on the wire).
//!
//! - `Disconnect`: the QP is disconnected (DREQ) and destroyed. A peer's DREQ, an error
//!   event or an error completion on the connection (RC retries exhausted: a restarted
//!   peer) is `on_conn_closed`.
//! - `RejectRep`: the verbs connect sends the RTU itself, so a REP the machine refuses ends
//!   in a DREQ instead of a REJ (the peer sees the connection close either way).
//!
//! UD and RC completions share one CQ; RC work request IDs carry [`RC_WR`], the connection
//! and the slot.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use tracing::{debug, trace, warn};
use verbs::{
    Access, AddressHandle, AhAttr, CmEvent, CompletionQueue, ConnParam, ConnectRequest, Device, Gid, Listener,
    MemoryRegion, ProtectionDomain, QpAttr, QpInit, QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendFlags, SendWr,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

use crate::link::{Action, ConnId, Link, LinkConfig, Mode, UdDest};
use crate::wire::MULTICAST_QPN;
use crate::wire::cm::{CM_MTU, ServiceId, ServiceIdPrefix};
use crate::wire::encap::EncapHeader;
use crate::wire::offload::{CsumExt, GSO_NONE, VnetHdr, l4_checksum_at, pseudo_sum};

/// The Q_Key of the IPoIB link (Linux's IPoIB broadcast groups use 0x0B1B; high bit clear,
/// so unprivileged senders may use it; RFC 4391 §4.1 recommends a controlled one).
pub const IPOIB_QKEY: u32 = 0x0000_0b1b;
/// Octets of the GRH area in front of every UD receive.
pub const GRH_LEN: usize = 40;

const RECV_SLOTS: usize = 1024;
const SEND_SLOTS: usize = 64;
/// One send in this many asks for a completion (the others are unsignaled), so a burst of
/// sends cannot overflow the CQ between two polls.
const SIGNAL_EVERY: usize = 16;
/// UD sends posted together at most (one `post_send`, which the provider turns into one
/// `sendmmsg`): the daemon reads a burst of packets from the TUN before it serves the CQ,
/// and datagram mode sends 32 messages per 64 KiB. Below [`SEND_SLOTS`], so the ring of UD
/// send buffers never overwrites one not yet posted.
const UD_BATCH: usize = 16;

/// Receive buffers per RC connection (the RoCE provider has no SRQ; Linux's ipoib_cm
/// shares one SRQ among its connections, 256 buffers by default, or as many per QP
/// without one). With 32, a sender ahead of the receiving daemon ran them dry: RNR NAKs
/// and go-back-N retransmissions of 11 % of the packets of an iperf3 run (issue 16).
/// 8 MiB per connection once a bulk flow has touched them all.
pub const RC_RECV_SLOTS: usize = 128;
/// Send buffers of the node, shared by its connections (each RC QP takes this many send
/// work requests, so a free buffer always has room on any QP). Packets from the kernel are
/// read into them.
pub const RC_SEND_SLOTS: usize = 64;
/// Octets of one RC buffer: the Receive MTU we advertise (65,524) rounded up.
pub const RC_SLOT: usize = 65536;
/// Bit 63 of an RC work request ID; bits 16..63 are the connection, 0..16 the slot.
pub const RC_WR: u64 = 1 << 63;
/// Connections at most (the shared CQ holds every one's work requests).
const MAX_RC_CONNS: usize = 128;
/// How long a send waits for a free RC send buffer before the packet is dropped.
const SEND_STALL: Duration = Duration::from_millis(200);

/// A node could not be set up or a verbs call failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Reading from or writing to the kernel side failed.
    #[error("kernel side: {0}")]
    Kernel(#[from] std::io::Error),
    /// The UD QP went to the error state (a CQ overflow, say): the node must be reopened.
    #[error("the UD QP is in the error state")]
    QpError,
    /// A verbs call failed.
    #[error("{what}: {source}")]
    Verbs {
        /// The call.
        what: &'static str,
        /// The provider's error.
        source: verbs::Error,
    },
    /// A memory region access was out of bounds (a local bug).
    #[error("memory region access out of bounds")]
    OutOfBounds,
}

fn v<T>(what: &'static str, r: verbs::Result<T>) -> Result<T, NodeError> {
    r.map_err(|source| NodeError::Verbs { what, source })
}

/// How to open a [`Node`].
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Datagram (RFC 4391) or connected (RFC 4755).
    pub mode: Mode,
    /// P_Key.
    pub pkey: u16,
    /// IPv4 addresses with prefix lengths.
    pub ipv4: Vec<(Ipv4Addr, u8)>,
    /// Global IPv6 addresses.
    pub ipv6: Vec<Ipv6Addr>,
    /// Idle time after which a connection is torn down (the link default if `None`).
    pub conn_idle: Option<Duration>,
    /// Gratuitous ARP at start ([`LinkConfig::announce`]; `false` only to test a silent
    /// restart).
    pub announce: bool,
}

impl NodeOptions {
    /// Datagram mode with these addresses.
    pub fn datagram(pkey: u16, ipv4: &[(Ipv4Addr, u8)], ipv6: &[Ipv6Addr]) -> NodeOptions {
        NodeOptions {
            mode: Mode::Datagram,
            pkey,
            ipv4: ipv4.to_vec(),
            ipv6: ipv6.to_vec(),
            conn_idle: None,
            announce: true,
        }
    }
}

/// The outcome of a connect thread.
struct Connected {
    conn: ConnId,
    qp: QueuePair,
    result: verbs::Result<Vec<u8>>,
}

/// One RC connection's verbs objects.
struct RcConn {
    /// `None` while the connect thread holds it.
    qp: Option<QueuePair>,
    /// Its receive buffers.
    mr: MemoryRegion,
    /// Receive slots completed while the connect thread held the QP: posted on its return.
    repost: Vec<usize>,
    /// Both offered [`CsumExt`]: TCP/UDP checksums travel in the pseudo-header form
    /// (`crate::wire::offload`).
    peer_partial: bool,
}

/// The state of an IP packet's checksum as the node writes it into the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxCsum {
    /// Complete: the kernel checks it. (A TUN ignores `DATA_VALID` on writes, so a
    /// complete checksum cannot be marked as checked.)
    Unchecked,
    /// Partial (the sender's kernel left it to the device): `NEEDS_CSUM` with these offsets
    /// from the IP header.
    Partial {
        /// Where the summed range starts.
        start: u16,
        /// Where the checksum field is, from `start`.
        offset: u16,
    },
}

/// The kernel side of a node: the TUN device in the daemon, a list in tests.
pub trait KernelIo {
    /// Reads one packet, if one is waiting, into `mr[off..off + max]` (a send buffer the
    /// node owns); `Ok(None)` if none is.
    fn read_packet(&mut self, mr: &MemoryRegion, off: usize, max: usize) -> std::io::Result<Option<usize>>;
    /// Writes one IP packet into the kernel.
    fn write_packet(&mut self, pkt: &[u8]);
    /// Whether this kernel side offloads checksums (a TUN opened with
    /// [`crate::tun::Tun::open_offload`]): each read puts a 10-octet [`VnetHdr`] in front
    /// of the packet, and [`KernelIo::write_packet_csum`] passes [`RxCsum`] on.
    fn offload(&self) -> bool {
        false
    }
    /// Writes one IP packet with its checksum state. Without offload the kernel checks
    /// every checksum: the node fills a partial one in before it calls [`KernelIo::write_packet`].
    fn write_packet_csum(&mut self, pkt: &[u8], csum: RxCsum) {
        let _ = csum;
        self.write_packet(pkt);
    }
}

/// The packets for the kernel collected in a list; nothing to read.
impl KernelIo for Vec<Vec<u8>> {
    fn read_packet(&mut self, _: &MemoryRegion, _: usize, _: usize) -> std::io::Result<Option<usize>> {
        Ok(None)
    }
    fn write_packet(&mut self, pkt: &[u8]) {
        self.push(pkt.to_vec());
    }
}

/// How many packets took which path (for `show counters` and the tests that count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounters {
    /// Packets from the kernel posted from the buffer they were read into (no copy).
    pub tx_in_place: u64,
    /// Packets from the kernel copied out for the link machine (resolution, UD, errors).
    pub tx_copied: u64,
    /// RC messages whose IP packet was written into the kernel from the receive buffer.
    pub rx_in_place: u64,
    /// IP packets for the kernel that went through a copy (UD, ICMP errors, tests).
    pub rx_copied: u64,
    /// Packets from the kernel with a partial checksum sent as they were, marked, to a
    /// peer that accepts them (no checksum pass anywhere).
    pub tx_csum_partial: u64,
    /// Partial checksums the node filled in (UD, resolution, a peer without the extension).
    pub tx_csum_filled: u64,
    /// Complete TCP/UDP checksums rewritten to the pseudo-header form for a connection
    /// that carries that form (a 12- or 40-octet sum, no pass over the data).
    pub tx_csum_pseudo: u64,
    /// Received packets with a partial checksum handed to the kernel as partial.
    pub rx_csum_partial: u64,
    /// Packets from the kernel dropped: a GSO packet or checksum offsets outside it.
    pub tx_bad_offload: u64,
}

/// What the RC counters say (for `show counters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RcCounters {
    /// Messages sent on connections.
    pub sent: u64,
    /// Messages received on connections.
    pub received: u64,
    /// Messages dropped: no send buffer within the stall time, or the connection not up.
    pub dropped: u64,
    /// Connections set up (either side).
    pub connected: u64,
    /// Connections closed by the peer or by errors.
    pub closed: u64,
}

/// One IPoIB interface on a verbs device.
pub struct Node {
    link: Link,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    slot: usize,
    next_send: usize,
    ahs: HashMap<[u8; 16], AddressHandle>,
    epoch: Instant,
    to_kernel: Vec<Vec<u8>>,
    listeners: Vec<Listener>,
    reqs: HashMap<u64, ConnectRequest>,
    next_req: u64,
    rc: HashMap<ConnId, RcConn>,
    done_tx: Sender<Connected>,
    done_rx: Receiver<Connected>,
    counters: RcCounters,
    paths: PathCounters,
    /// The send buffers ([`RC_SEND_SLOTS`] × [`RC_SLOT`]), free ones in `free_send`, each
    /// busy one's connection in `send_owner`.
    send_mr: MemoryRegion,
    free_send: Vec<usize>,
    send_owner: Vec<Option<ConnId>>,
    /// UD sends not posted yet ([`UD_BATCH`]).
    ud_batch: Vec<SendWr>,
    /// `post_send` calls on the UD QP (for the tests that count).
    ud_posts: u64,
    /// Partial checksums offered to peers and taken from the kernel
    /// ([`Node::enable_csum_offload`]).
    csum_offload: bool,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("link", &self.link.local_addr())
            .finish_non_exhaustive()
    }
}

fn rc_wr(conn: ConnId, slot: usize) -> u64 {
    RC_WR | (conn.0 << 16) | slot as u64
}

impl Node {
    /// Opens a datagram-mode node (see [`Node::open_with`]).
    pub fn open(dev: &Device, pkey: u16, ipv4: &[(Ipv4Addr, u8)], ipv6: &[Ipv6Addr]) -> Result<Node, NodeError> {
        Node::open_with(dev, &NodeOptions::datagram(pkey, ipv4, ipv6))
    }

    /// Opens a UD QP on port 1 of `dev`, derives the UD MTU from the port's active MTU
    /// (at most 2,044), configures the link, joins the groups and posts the receive
    /// buffers; in connected mode also listens on both service ID forms of the UD QPN.
    pub fn open_with(dev: &Device, o: &NodeOptions) -> Result<Node, NodeError> {
        let port = v("query_port", dev.query_port(1))?;
        let gid = v("query_gid", dev.query_gid(1, 0))?;
        let ib_mtu = port.active_mtu.bytes() as usize;
        let slot = GRH_LEN + ib_mtu;
        let pd = v("alloc_pd", dev.alloc_pd())?;
        let rc_wrs = MAX_RC_CONNS * RC_RECV_SLOTS + RC_SEND_SLOTS;
        let cq = v("create_cq", dev.create_cq(2 * (RECV_SLOTS + SEND_SLOTS) + rc_wrs))?;
        let mut init = QpInit::new(QpType::Ud, &cq);
        init.cap.max_send_wr = SEND_SLOTS as u32;
        init.cap.max_recv_wr = RECV_SLOTS as u32;
        let qp = v("create_qp", pd.create_qp(init))?;
        v("modify_qp INIT", qp.modify_qp(&QpAttr::init_ud(1, 0, IPOIB_QKEY)))?;
        v("modify_qp RTR", qp.modify_qp(&QpAttr::state(QpState::Rtr)))?;
        v(
            "modify_qp RTS",
            qp.modify_qp(&QpAttr {
                sq_psn: Some(0),
                ..QpAttr::state(QpState::Rts)
            }),
        )?;
        let mr = v(
            "reg_mr",
            pd.reg_mr((RECV_SLOTS + SEND_SLOTS) * slot, Access::LOCAL_WRITE),
        )?;
        let mut cfg = LinkConfig::new(o.mode, qp.qp_num(), gid.0);
        cfg.pkey = o.pkey;
        cfg.ipv4 = o.ipv4.clone();
        cfg.ipv6 = o.ipv6.clone();
        cfg.ud_mtu = (ib_mtu - EncapHeader::LEN).min(crate::wire::cm::UD_MTU as usize) as u32;
        cfg.max_conns = cfg.max_conns.min(MAX_RC_CONNS);
        cfg.announce = o.announce;
        if let Some(idle) = o.conn_idle {
            cfg.conn_idle = idle;
        }
        let mut listeners = Vec::new();
        if o.mode == Mode::Connected {
            for prefix in [ServiceIdPrefix::Linux, ServiceIdPrefix::Rfc] {
                let sid = ServiceId::new(prefix, qp.qp_num()).value();
                listeners.push(v("listen_ib_service", dev.listen_ib_service(sid))?);
            }
        }
        let (done_tx, done_rx) = channel();
        let send_mr = v("reg_mr send", pd.reg_mr(RC_SEND_SLOTS * RC_SLOT, Access::LOCAL_WRITE))?;
        let mut node = Node {
            link: Link::new(cfg),
            pd,
            cq,
            qp,
            mr,
            slot,
            next_send: 0,
            ahs: HashMap::new(),
            epoch: Instant::now(),
            to_kernel: Vec::new(),
            listeners,
            reqs: HashMap::new(),
            next_req: 1,
            rc: HashMap::new(),
            done_tx,
            done_rx,
            counters: RcCounters::default(),
            paths: PathCounters::default(),
            send_mr,
            free_send: (0..RC_SEND_SLOTS).rev().collect(),
            send_owner: vec![None; RC_SEND_SLOTS],
            ud_batch: Vec::with_capacity(UD_BATCH),
            ud_posts: 0,
            csum_offload: false,
        };
        for i in 0..RECV_SLOTS {
            node.post_recv(i)?;
        }
        node.link.start();
        node.run_actions()?;
        node.flush_ud();
        debug!(lla = %node.link.local_addr(), ud_mtu = node.link.config().ud_mtu, mode = ?o.mode, "IPoIB node up");
        Ok(node)
    }

    /// The link machine (for `show neigh` / `show conn` and the addresses).
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The IP MTU of the interface: 65,520 in connected mode, the UD MTU in datagram mode.
    pub fn if_mtu(&self) -> u32 {
        match self.link.config().mode {
            Mode::Connected => CM_MTU,
            Mode::Datagram => self.link.config().ud_mtu,
        }
    }

    /// Offers peers partial checksums on connections set up from now on ([`CsumExt`] in
    /// the REQ's and REP's private data) and marks the ones received for the kernel as
    /// partial. Only for a kernel side whose [`KernelIo::offload`] is true (a packet with
    /// a partial checksum is otherwise filled in by a copy on receipt).
    pub fn enable_csum_offload(&mut self, on: bool) {
        self.csum_offload = on;
    }

    /// Our private data for a REQ or REP: the RFC 4755 8 octets, then the extension if
    /// offload is on.
    fn cm_private_data(&self, pd: &[u8; 8]) -> Vec<u8> {
        let mut v = pd.to_vec();
        if self.csum_offload {
            v.extend_from_slice(
                &CsumExt {
                    flags: CsumExt::PARTIAL_CSUM,
                }
                .to_bytes(),
            );
        }
        v
    }

    /// The RC counters.
    pub fn rc_counters(&self) -> RcCounters {
        self.counters
    }

    /// Which path the packets took.
    pub fn path_counters(&self) -> PathCounters {
        self.paths
    }

    /// Whether a send buffer is free (else [`Node::read_kernel`] reads nothing).
    pub fn can_read_kernel(&self) -> bool {
        !self.free_send.is_empty()
    }

    /// The completion queue (to register a waker with [`CompletionQueue::next_async`]).
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// RC connections with verbs objects (connecting or up).
    pub fn rc_connections(&self) -> usize {
        self.rc.len()
    }

    /// The machine's clock: time since the node was opened.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Every connection is disconnected (DREQ) and forgotten (IPCM-S1 when the interface
    /// goes down); the node keeps listening.
    pub fn disconnect_all(&mut self) -> Result<(), NodeError> {
        self.link.shutdown();
        self.run_actions()
    }

    /// Interface down: every connection is disconnected (DREQ), the listeners dropped.
    pub fn shutdown(&mut self) -> Result<(), NodeError> {
        self.disconnect_all()?;
        self.listeners.clear();
        Ok(())
    }

    fn post_recv(&self, i: usize) -> Result<(), NodeError> {
        v(
            "post_recv",
            self.qp.post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: vec![self.mr.sge(i * self.slot, self.slot as u32)],
            }]),
        )
    }

    /// An IP packet from the kernel (copied into a send buffer if it goes to a connection).
    pub fn from_kernel(&mut self, pkt: Vec<u8>) -> Result<(), NodeError> {
        let now = self.now();
        match self.link.rc_route(now, &pkt) {
            Some((conn, et)) => {
                let mut m = Vec::with_capacity(EncapHeader::LEN + pkt.len());
                m.extend_from_slice(&et.value().to_be_bytes());
                m.extend_from_slice(&[0, 0]);
                m.extend_from_slice(&pkt);
                self.rc_send(conn, &m)?;
            }
            None => self.link.on_kernel_packet(now, pkt),
        }
        self.run_actions()?;
        self.flush_ud();
        Ok(())
    }

    /// Reads one packet from the kernel into a free send buffer and sends it: posted from
    /// that buffer if it goes to an established connection ([`Link::rc_route`]), else
    /// copied out for [`Link::on_kernel_packet`]. `false` if no packet was waiting or no
    /// send buffer is free (reap completions with [`Node::service`] first).
    pub fn read_kernel(&mut self, k: &mut dyn KernelIo) -> Result<bool, NodeError> {
        let Some(slot) = self.free_send.pop() else {
            return Ok(false);
        };
        let base = slot * RC_SLOT;
        // With offload the virtio_net_hdr comes first; the IP packet starts at `pkt_off`
        // and the encapsulation header goes in the 4 octets before it (over the end of
        // the virtio_net_hdr, parsed by then).
        let vh = if k.offload() { VnetHdr::LEN } else { 0 };
        let pkt_off = base + vh.max(EncapHeader::LEN);
        let read_off = pkt_off - vh;
        let n = match k.read_packet(&self.send_mr, read_off, RC_SLOT - (read_off - base)) {
            Ok(Some(n)) => n,
            Ok(None) => {
                self.free_send.push(slot);
                return Ok(false);
            }
            Err(e) => {
                self.free_send.push(slot);
                return Err(e.into());
            }
        };
        let mut partial = None;
        if vh > 0 {
            let h = crate::sys::with_owned(&self.send_mr, read_off, vh.min(n), VnetHdr::parse).and_then(Result::ok);
            match h {
                Some(h) if h.gso_type == GSO_NONE => {
                    partial = h.needs_csum().then_some((h.csum_start, h.csum_offset));
                }
                _ => {
                    // Short, or a GSO packet (TSO is not enabled): nothing to send.
                    self.free_send.push(slot);
                    self.paths.tx_bad_offload += 1;
                    return Ok(true);
                }
            }
        }
        let n = n - vh;
        let now = self.now();
        let link = &mut self.link;
        let route = crate::sys::with_owned(&self.send_mr, pkt_off, n, |p| link.rc_route(now, p)).flatten();
        match route {
            Some((conn, et)) => {
                let h = EncapHeader::new(et);
                let peer_partial = self.rc.get(&conn).is_some_and(|c| c.peer_partial);
                let at = if peer_partial {
                    crate::sys::with_owned(&self.send_mr, pkt_off, n, l4_checksum_at).flatten()
                } else {
                    None
                };
                let ok = match (partial, at) {
                    // As the kernel handed it over: no checksum pass anywhere.
                    (Some(p), Some(a)) if p == a => {
                        self.paths.tx_csum_partial += 1;
                        true
                    }
                    (Some(_), Some(_)) => false, // offsets we do not expect for TCP/UDP
                    (Some((start, offset)), None) => self.fill_in_place(pkt_off, n, start, offset)?,
                    (None, Some(_)) => {
                        self.rewrite_pseudo_form(pkt_off, n)?;
                        true
                    }
                    (None, None) => true,
                };
                if !ok {
                    self.free_send.push(slot);
                    self.paths.tx_bad_offload += 1;
                    return Ok(true);
                }
                let mut hb = [0u8; EncapHeader::LEN];
                let _ = h.emit(&mut hb);
                let head = pkt_off - EncapHeader::LEN;
                self.send_mr.write(head, &hb).map_err(|_| NodeError::OutOfBounds)?;
                self.paths.tx_in_place += 1;
                self.post_rc(conn, slot, head - base, EncapHeader::LEN + n);
            }
            None => {
                let mut pkt = self.send_mr.to_vec(pkt_off, n).map_err(|_| NodeError::OutOfBounds)?;
                self.free_send.push(slot);
                if let Some((start, offset)) = partial {
                    if crate::wire::offload::fill_checksum(&mut pkt, start, offset).is_err() {
                        self.paths.tx_bad_offload += 1;
                        return Ok(true);
                    }
                    self.paths.tx_csum_filled += 1;
                }
                self.paths.tx_copied += 1;
                self.link.on_kernel_packet(now, pkt);
                self.run_actions()?;
            }
        }
        Ok(true)
    }

    /// Rewrites the complete TCP/UDP checksum of the `n`-octet packet at `send_mr[off..]`
    /// (a send buffer the node owns) to the pseudo-header form, for a connection that
    /// carries that form (nothing if the packet has no TCP/UDP checksum it locates).
    fn rewrite_pseudo_form(&mut self, off: usize, n: usize) -> Result<(), NodeError> {
        let form = crate::sys::with_owned(&self.send_mr, off, n, |p| {
            l4_checksum_at(p).zip(pseudo_sum(p)).map(|((s, o), ps)| (s, o, ps))
        })
        .flatten();
        if let Some((start, offset, ps)) = form {
            let f = off + usize::from(start) + usize::from(offset);
            self.send_mr
                .write(f, &ps.to_be_bytes())
                .map_err(|_| NodeError::OutOfBounds)?;
            self.paths.tx_csum_pseudo += 1;
        }
        Ok(())
    }

    /// Fills in the partial checksum of the `n`-octet packet at `send_mr[off..]` (a send
    /// buffer the node owns); `false` if the offsets do not fit the packet.
    fn fill_in_place(&mut self, off: usize, n: usize, start: u16, offset: u16) -> Result<bool, NodeError> {
        let (s, f) = (usize::from(start), usize::from(start) + usize::from(offset));
        if f + 2 > n {
            return Ok(false);
        }
        let sum = crate::sys::with_owned(&self.send_mr, off + s, n - s, crate::wire::offload::ones_sum)
            .ok_or(NodeError::OutOfBounds)?;
        let c = match !sum {
            0 => 0xffff,
            c => c,
        };
        self.send_mr
            .write(off + f, &u16::to_be_bytes(c))
            .map_err(|_| NodeError::OutOfBounds)?;
        self.paths.tx_csum_filled += 1;
        Ok(true)
    }

    /// Receives what arrived on the QPs, takes CM requests and connect outcomes, runs the
    /// timers and returns the IP packets for the kernel. Waits up to `wait` for the first
    /// completion.
    pub fn poll(&mut self, wait: Duration) -> Result<Vec<Vec<u8>>, NodeError> {
        let mut out = Vec::new();
        self.flush_ud();
        if let Some(wc) = self.cq.wait(Some(wait)) {
            self.on_wc(wc, &mut out)?;
        }
        self.service(&mut out)?;
        Ok(out)
    }

    /// Without waiting: the IP packets queued for the kernel, every completion (RC
    /// receives written into `k` from their buffers), CM requests and connect outcomes,
    /// the timers. Returns whether any completion or packet was handled.
    pub fn service(&mut self, k: &mut dyn KernelIo) -> Result<bool, NodeError> {
        self.flush_ud();
        let mut any = self.flush_kernel(k);
        while let Some(wc) = self.cq.poll_one() {
            any = true;
            self.on_wc(wc, k)?;
        }
        self.cm_poll()?;
        let now = self.now();
        self.link.on_tick(now);
        self.run_actions()?;
        self.flush_ud();
        any |= self.flush_kernel(k);
        Ok(any)
    }

    /// `post_send` calls on the UD QP so far (datagram mode batches up to 16 sends in one).
    pub fn ud_posts(&self) -> u64 {
        self.ud_posts
    }

    /// Posts the UD sends gathered so far in one call.
    fn flush_ud(&mut self) {
        if self.ud_batch.is_empty() {
            return;
        }
        self.ud_posts += 1;
        if let Err(e) = self.qp.post_send(&self.ud_batch) {
            warn!(error = %e, "UD post_send failed, packets dropped");
        }
        self.ud_batch.clear();
    }

    /// Handles a completion the caller took from [`Node::cq`] (an async wait's).
    pub fn on_completion(&mut self, wc: WorkCompletion, k: &mut dyn KernelIo) -> Result<(), NodeError> {
        self.on_wc(wc, k)
    }

    fn flush_kernel(&mut self, k: &mut dyn KernelIo) -> bool {
        let any = !self.to_kernel.is_empty();
        for p in std::mem::take(&mut self.to_kernel) {
            self.paths.rx_copied += 1;
            k.write_packet(&p);
        }
        any
    }

    fn on_wc(&mut self, wc: WorkCompletion, k: &mut dyn KernelIo) -> Result<(), NodeError> {
        if wc.wr_id & RC_WR != 0 {
            self.on_rc_wc(wc, k);
            return Ok(());
        }
        if wc.opcode != WcOpcode::Recv {
            if wc.status != WcStatus::Success {
                warn!(status = ?wc.status, "UD send failed");
            }
            return Ok(());
        }
        let i = wc.wr_id as usize;
        if wc.status == WcStatus::Success && (wc.byte_len as usize) >= GRH_LEN && i < RECV_SLOTS {
            let len = (wc.byte_len as usize).min(self.slot) - GRH_LEN;
            let msg = self
                .mr
                .to_vec(i * self.slot + GRH_LEN, len)
                .map_err(|_| NodeError::OutOfBounds)?;
            // Our own multicast comes back (loopback): Linux ipoib drops it by source QPN
            // and source LID (`ipoib_ib_handle_rx_wc`). RoCE has no LID; the GRH's source GID
            // stands for it, since another device's UD QP may well have our QPN.
            if !self.is_own_loopback(&wc, i) {
                let now = self.now();
                self.link.on_ud_recv(now, &msg);
            }
        }
        if wc.status == WcStatus::WrFlushErr {
            return Err(NodeError::QpError);
        }
        if i < RECV_SLOTS {
            self.post_recv(i)?;
        }
        Ok(())
    }

    /// Whether the datagram in UD receive slot `i` is one of our own multicasts come back:
    /// our QPN and, in its GRH, our GID.
    fn is_own_loopback(&self, wc: &WorkCompletion, i: usize) -> bool {
        if wc.src_qp != self.qp.qp_num() {
            return false;
        }
        let ours = self.link.local_addr().gid;
        self.mr
            .to_vec(i * self.slot, GRH_LEN)
            .ok()
            .and_then(|g| verbs::Grh::parse(&g))
            .is_none_or(|g| g.sgid.0 == ours)
    }

    fn on_rc_wc(&mut self, wc: WorkCompletion, k: &mut dyn KernelIo) {
        let conn = ConnId((wc.wr_id & !RC_WR) >> 16);
        let slot = (wc.wr_id & 0xffff) as usize;
        if wc.status == WcStatus::Success && slot >= RC_RECV_SLOTS {
            // A Send done: its buffer is free again, unless the connection was dropped
            // meanwhile and the buffer already given back (and maybe reused).
            let s = slot - RC_RECV_SLOTS;
            if self.send_owner.get(s).copied().flatten() == Some(conn) {
                self.send_owner[s] = None;
                self.free_send.push(s);
            }
            return;
        }
        let Some(c) = self.rc.get(&conn) else {
            return; // a connection already gone (its flushes)
        };
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                warn!(conn = conn.0, status = ?wc.status, "RC completion error: connection closed");
            } else {
                debug!(conn = conn.0, "RC flush: connection closed");
            }
            self.close(conn);
            return;
        }
        if slot >= RC_RECV_SLOTS {
            return;
        }
        self.counters.received += 1;
        let now = self.now();
        let link = &mut self.link;
        let paths = &mut self.paths;
        // The IP packet goes into the kernel from the receive buffer, which is posted again
        // only afterwards.
        let len = (wc.byte_len as usize).min(RC_SLOT);
        let pseudo_form = c.peer_partial;
        let _ = crate::sys::with_owned(&c.mr, slot * RC_SLOT, len, |msg| {
            if let Some(r) = link.on_rc_recv_in_place(now, conn, msg) {
                paths.rx_in_place += 1;
                let pkt = &msg[r];
                // On a connection that carries the pseudo-header form, every TCP/UDP
                // checksum it locates is partial.
                match pseudo_form.then(|| l4_checksum_at(pkt)).flatten() {
                    None => k.write_packet(pkt),
                    Some((start, offset)) if k.offload() => {
                        paths.rx_csum_partial += 1;
                        k.write_packet_csum(pkt, RxCsum::Partial { start, offset });
                    }
                    Some((start, offset)) => {
                        // A kernel side that checks checksums itself: complete it in a copy.
                        let mut p = pkt.to_vec();
                        if crate::wire::offload::fill_checksum(&mut p, start, offset).is_ok() {
                            k.write_packet(&p);
                        }
                    }
                }
            }
        });
        let Some(c) = self.rc.get_mut(&conn) else { return };
        match &c.qp {
            Some(qp) => {
                let wr = RecvWr {
                    wr_id: rc_wr(conn, slot),
                    sg_list: vec![c.mr.sge(slot * RC_SLOT, RC_SLOT as u32)],
                };
                if let Err(e) = qp.post_recv(&[wr]) {
                    debug!(conn = conn.0, error = %e, "RC post_recv failed");
                }
            }
            None => c.repost.push(slot),
        }
    }

    /// Forgets a connection's verbs objects and gives its busy send buffers back.
    fn drop_rc(&mut self, conn: ConnId) -> Option<RcConn> {
        let c = self.rc.remove(&conn)?;
        for (s, o) in self.send_owner.iter_mut().enumerate() {
            if *o == Some(conn) {
                *o = None;
                self.free_send.push(s);
            }
        }
        Some(c)
    }

    /// The connection is gone (peer DREQ, error): the machine re-resolves the peer.
    fn close(&mut self, conn: ConnId) {
        if self.drop_rc(conn).is_some() {
            self.counters.closed += 1;
            let now = self.now();
            self.link.on_conn_closed(now, conn);
        }
    }

    /// New REQs, connect outcomes, and the connections' CM events.
    fn cm_poll(&mut self) -> Result<(), NodeError> {
        let mut incoming = Vec::new();
        for l in &self.listeners {
            while let Ok(r) = l.get_request(Some(Duration::ZERO)) {
                incoming.push(r);
            }
        }
        for r in incoming {
            let (Some(sid), Some(gid)) = (r.service_id(), r.peer_gid()) else {
                continue;
            };
            let h = self.next_req;
            self.next_req += 1;
            let pd = r.private_data().to_vec();
            self.reqs.insert(h, r);
            let now = self.now();
            self.link.on_cm_req(now, h, sid, gid.0, &pd);
            self.run_actions()?;
        }
        let offload = self.csum_offload;
        while let Ok(d) = self.done_rx.try_recv() {
            let now = self.now();
            let Some(c) = self.rc.get_mut(&d.conn) else {
                debug!(conn = d.conn.0, "connect finished for a connection already dropped");
                continue; // dropping d.qp disconnects it if it did connect
            };
            match d.result {
                Ok(peer_pd) => {
                    for slot in std::mem::take(&mut c.repost) {
                        let wr = RecvWr {
                            wr_id: rc_wr(d.conn, slot),
                            sg_list: vec![c.mr.sge(slot * RC_SLOT, RC_SLOT as u32)],
                        };
                        let _ = d.qp.post_recv(&[wr]);
                    }
                    c.qp = Some(d.qp);
                    c.peer_partial = offload && CsumExt::parse(&peer_pd).partial_csum();
                    self.counters.connected += 1;
                    self.link.on_cm_rep(now, d.conn, &peer_pd);
                }
                Err(e) => {
                    let reason = match &e {
                        verbs::Error::Rejected { detail, .. } => detail
                            .as_ref()
                            .and_then(|d| d.code())
                            .map_or(crate::link::REJ_CONSUMER, |c| c as u16),
                        // Timeout (IBTA table 112, 4): nobody answered.
                        _ => 4,
                    };
                    debug!(conn = d.conn.0, error = %e, reason, "connect failed");
                    self.drop_rc(d.conn);
                    self.link.on_cm_rej(now, d.conn, reason);
                }
            }
            self.run_actions()?;
        }
        let mut events = Vec::new();
        for (id, c) in &self.rc {
            if let Some(qp) = &c.qp {
                while let Some(ev) = qp.get_event(Some(Duration::ZERO)) {
                    events.push((*id, ev));
                }
            }
        }
        events.sort_by_key(|(id, _)| *id);
        for (id, ev) in events {
            match ev {
                CmEvent::Established => {
                    let now = self.now();
                    self.link.on_cm_rtu(now, id);
                }
                other => {
                    debug!(conn = id.0, event = ?other, "connection closed");
                    self.close(id);
                }
            }
        }
        Ok(())
    }

    fn ah(&mut self, gid: [u8; 16]) -> Result<AddressHandle, NodeError> {
        if let Some(a) = self.ahs.get(&gid) {
            return Ok(a.clone());
        }
        let a = v("create_ah", self.pd.create_ah(&AhAttr::to_gid(Gid(gid))))?;
        if self.ahs.len() >= 4096 {
            self.ahs.clear();
        }
        self.ahs.insert(gid, a.clone());
        Ok(a)
    }

    /// A new RC QP with its buffers and receives posted.
    fn new_rc(&mut self, conn: ConnId) -> Result<(QueuePair, MemoryRegion), NodeError> {
        let attr = QpInitAttr {
            max_send_wr: RC_SEND_SLOTS as u32,
            max_recv_wr: RC_RECV_SLOTS as u32,
            ..QpInitAttr::default()
        };
        let qp = v(
            "create_qp RC",
            self.pd.create_qp(QpInit::new(QpType::Rc, &self.cq).cap(attr)),
        )?;
        let mr = v(
            "reg_mr RC",
            self.pd.reg_mr(RC_RECV_SLOTS * RC_SLOT, Access::LOCAL_WRITE),
        )?;
        // INIT (as rdma_create_qp leaves it) so the receives can be posted before the CM
        // binds the QP; the CM takes it from INIT to RTR and RTS.
        v(
            "modify_qp INIT RC",
            qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE)),
        )?;
        let wrs: Vec<RecvWr> = (0..RC_RECV_SLOTS)
            .map(|i| RecvWr {
                wr_id: rc_wr(conn, i),
                sg_list: vec![mr.sge(i * RC_SLOT, RC_SLOT as u32)],
            })
            .collect();
        v("post_recv RC", qp.post_recv(&wrs))?;
        Ok((qp, mr))
    }

    /// Sends an IPoIB message (header included) on a connection from a copy in a send
    /// buffer; waits up to [`SEND_STALL`] for a free one.
    fn rc_send(&mut self, conn: ConnId, payload: &[u8]) -> Result<(), NodeError> {
        if payload.len() > RC_SLOT {
            self.counters.dropped += 1;
            return Ok(());
        }
        let deadline = Instant::now() + SEND_STALL;
        let slot = loop {
            if self.rc.get(&conn).is_none_or(|c| c.qp.is_none()) {
                self.counters.dropped += 1;
                return Ok(());
            }
            if let Some(s) = self.free_send.pop() {
                break s;
            }
            // All send buffers in flight: reap completions (IP packets received meanwhile
            // wait in `to_kernel`).
            if Instant::now() >= deadline {
                trace!(conn = conn.0, "no RC send buffer: packet dropped");
                self.counters.dropped += 1;
                return Ok(());
            }
            let mut q = std::mem::take(&mut self.to_kernel);
            if let Some(wc) = self.cq.wait(Some(Duration::from_millis(5))) {
                self.on_wc(wc, &mut q)?;
            }
            while let Some(wc) = self.cq.poll_one() {
                self.on_wc(wc, &mut q)?;
            }
            q.append(&mut self.to_kernel);
            self.to_kernel = q;
        };
        self.send_mr
            .write(slot * RC_SLOT, payload)
            .map_err(|_| NodeError::OutOfBounds)?;
        if self.rc.get(&conn).is_some_and(|c| c.peer_partial) && payload.len() > EncapHeader::LEN {
            self.rewrite_pseudo_form(slot * RC_SLOT + EncapHeader::LEN, payload.len() - EncapHeader::LEN)?;
        }
        self.post_rc(conn, slot, 0, payload.len());
        Ok(())
    }

    /// Posts send buffer `slot` (`len` octets from `head` in it, header included) on
    /// `conn`, or gives it back and counts a drop if the connection has no QP; a failed
    /// post closes it.
    fn post_rc(&mut self, conn: ConnId, slot: usize, head: usize, len: usize) {
        let wr = SendWr::new(
            rc_wr(conn, RC_RECV_SLOTS + slot),
            WrOpcode::Send,
            vec![self.send_mr.sge(slot * RC_SLOT + head, len as u32)],
        )
        .flags(SendFlags::SIGNALED);
        let posted = self
            .rc
            .get(&conn)
            .and_then(|c| c.qp.as_ref())
            .map(|qp| qp.post_send(&[wr]));
        match posted {
            Some(Ok(())) => {
                self.send_owner[slot] = Some(conn);
                self.counters.sent += 1;
            }
            Some(Err(e)) => {
                debug!(conn = conn.0, error = %e, "RC post_send failed: connection closed");
                self.free_send.push(slot);
                self.counters.dropped += 1;
                self.close(conn);
            }
            None => {
                self.free_send.push(slot);
                self.counters.dropped += 1;
            }
        }
    }

    fn run_actions(&mut self) -> Result<(), NodeError> {
        loop {
            let acts = self.link.take_actions();
            if acts.is_empty() {
                return Ok(());
            }
            for a in acts {
                self.run_action(a)?;
            }
        }
    }

    fn run_action(&mut self, a: Action) -> Result<(), NodeError> {
        match a {
            Action::ToKernel(p) => self.to_kernel.push(p),
            Action::Join(g) => v("attach_mcast", self.qp.attach_mcast(&Gid(g.0), 0))?,
            Action::UdSend { dest, payload } => {
                let (gid, qpn) = match dest {
                    UdDest::Unicast(l) => (l.gid, l.qpn),
                    UdDest::Multicast(g) => (g.0, MULTICAST_QPN),
                };
                if payload.len() + GRH_LEN > self.slot {
                    warn!(len = payload.len(), "UD message beyond the port MTU dropped");
                    return Ok(());
                }
                let ah = self.ah(gid)?;
                let i = RECV_SLOTS + self.next_send;
                self.next_send = (self.next_send + 1) % SEND_SLOTS;
                self.mr
                    .write(i * self.slot, &payload)
                    .map_err(|_| NodeError::OutOfBounds)?;
                let flags = if self.next_send.is_multiple_of(SIGNAL_EVERY) {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                };
                let wr = SendWr::new(
                    i as u64,
                    WrOpcode::Send,
                    vec![self.mr.sge(i * self.slot, payload.len() as u32)],
                )
                .flags(flags)
                .ud(verbs::UdDest {
                    ah,
                    remote_qpn: qpn,
                    remote_qkey: IPOIB_QKEY,
                });
                self.ud_batch.push(wr);
                if self.ud_batch.len() >= UD_BATCH {
                    self.flush_ud();
                }
            }
            Action::RcSend { conn, payload } => self.rc_send(conn, &payload)?,
            Action::Connect {
                conn,
                peer,
                service_id,
                private_data,
            } => {
                let (qp, mr) = match self.new_rc(conn) {
                    Ok(x) => x,
                    Err(e) => {
                        warn!(error = %e, "no RC QP for a connection");
                        let now = self.now();
                        self.link.on_cm_rej(now, conn, crate::link::REJ_NO_QP);
                        return Ok(());
                    }
                };
                self.rc.insert(
                    conn,
                    RcConn {
                        qp: None,
                        mr,
                        repost: Vec::new(),
                        peer_partial: false,
                    },
                );
                let tx = self.done_tx.clone();
                let timeout = self.link.config().conn_setup;
                let private_data = self.cm_private_data(&private_data);
                let spawned = std::thread::Builder::new()
                    .name("softrdma-ipoib-cm".into())
                    .spawn(move || {
                        let param = ConnParam {
                            private_data,
                            ..ConnParam::default()
                        };
                        let result = qp
                            .connect_ib_service(Gid(peer.gid), service_id, &param, timeout)
                            .map(|()| qp.conn_info().peer_private_data);
                        let _ = tx.send(Connected { conn, qp, result });
                    });
                if let Err(e) = spawned {
                    warn!(error = %e, "no thread for a connect");
                    self.drop_rc(conn);
                    let now = self.now();
                    self.link.on_cm_rej(now, conn, crate::link::REJ_NO_QP);
                }
            }
            Action::Accept {
                req,
                conn,
                private_data,
            } => {
                let Some(r) = self.reqs.remove(&req) else { return Ok(()) };
                let (qp, mr) = match self.new_rc(conn) {
                    Ok(x) => x,
                    Err(e) => {
                        warn!(error = %e, "no RC QP to accept a connection");
                        let _ = r.reject_with_reason(crate::link::REJ_NO_QP, &private_data);
                        let now = self.now();
                        self.link.on_conn_closed(now, conn);
                        return Ok(());
                    }
                };
                let peer_partial = self.csum_offload && CsumExt::parse(r.private_data()).partial_csum();
                let param = ConnParam {
                    private_data: self.cm_private_data(&private_data),
                    ..ConnParam::default()
                };
                match r.accept_qp(&qp, &param) {
                    Ok(()) => {
                        self.counters.connected += 1;
                        self.rc.insert(
                            conn,
                            RcConn {
                                qp: Some(qp),
                                mr,
                                repost: Vec::new(),
                                peer_partial,
                            },
                        );
                    }
                    Err(e) => {
                        debug!(conn = conn.0, error = %e, "accept failed");
                        let now = self.now();
                        self.link.on_conn_closed(now, conn);
                    }
                }
            }
            Action::RejectReq {
                req,
                reason,
                private_data,
            } => {
                if let Some(r) = self.reqs.remove(&req)
                    && let Err(e) = r.reject_with_reason(reason, &private_data)
                {
                    debug!(error = %e, "REJ failed");
                }
            }
            Action::RejectRep { conn, .. } | Action::Disconnect { conn } => {
                // Dropping the QP disconnects it (DREQ) and destroys it; a connect still in
                // flight ends on its thread and is dropped there.
                if let Some(c) = self.drop_rc(conn)
                    && let Some(qp) = &c.qp
                {
                    qp.disconnect();
                }
            }
        }
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // DREQs for the connections, so peers notice at once.
        for (_, c) in self.rc.drain() {
            if let Some(qp) = &c.qp {
                qp.disconnect();
            }
        }
    }
}
