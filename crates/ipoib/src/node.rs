//! An IPoIB node in datagram mode on a real verbs device: the [`Link`] machine driving one
//! UD QP (ARP/ND and unicast over UD with address handles, the broadcast and multicast
//! groups attached with `attach_mcast`). The kernel side is left to the caller (a TUN
//! device in the daemon, a channel in tests): [`Node::from_kernel`] takes IP packets,
//! [`Node::poll`] returns the IP packets for the kernel.
//!
//! Connected mode is not wired here yet: the node runs the machine in [`Mode::Datagram`]
//! (flags 0 in its address, every REQ refused), which RFC 4391 alone allows (IPCM-1) and
//! which connected-mode peers talk to over UD (IPCM-6).

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use tracing::{debug, warn};
use verbs::{
    Access, AddressHandle, AhAttr, CompletionQueue, Device, Gid, MemoryRegion, ProtectionDomain, QpAttr, QpInit,
    QpState, QpType, QueuePair, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WrOpcode,
};

use crate::link::{Action, Link, LinkConfig, Mode, UdDest};
use crate::wire::MULTICAST_QPN;
use crate::wire::encap::EncapHeader;

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

/// A node could not be set up or a verbs call failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
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

/// One IPoIB interface on a verbs device, datagram mode.
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
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("link", &self.link.local_addr())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens a UD QP on port 1 of `dev`, derives the UD MTU from the port's active MTU
    /// (at most 2,044), configures the link with `ipv4` addresses (and prefix lengths) and
    /// `ipv6` global addresses, joins the groups and posts the receive buffers.
    pub fn open(dev: &Device, pkey: u16, ipv4: &[(Ipv4Addr, u8)], ipv6: &[Ipv6Addr]) -> Result<Node, NodeError> {
        let port = v("query_port", dev.query_port(1))?;
        let gid = v("query_gid", dev.query_gid(1, 0))?;
        let ib_mtu = port.active_mtu.bytes() as usize;
        let slot = GRH_LEN + ib_mtu;
        let pd = v("alloc_pd", dev.alloc_pd())?;
        let cq = v("create_cq", dev.create_cq(2 * (RECV_SLOTS + SEND_SLOTS)))?;
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
        let mut cfg = LinkConfig::new(Mode::Datagram, qp.qp_num(), gid.0);
        cfg.pkey = pkey;
        cfg.ipv4 = ipv4.to_vec();
        cfg.ipv6 = ipv6.to_vec();
        cfg.ud_mtu = (ib_mtu - EncapHeader::LEN).min(crate::wire::cm::UD_MTU as usize) as u32;
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
        };
        for i in 0..RECV_SLOTS {
            node.post_recv(i)?;
        }
        node.link.start();
        node.run_actions()?;
        debug!(lla = %node.link.local_addr(), ud_mtu = node.link.config().ud_mtu, "IPoIB node up");
        Ok(node)
    }

    /// The link machine (for `show neigh` / `show conn` and the addresses).
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The machine's clock: time since the node was opened.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
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

    /// An IP packet from the kernel.
    pub fn from_kernel(&mut self, pkt: Vec<u8>) -> Result<(), NodeError> {
        let now = self.now();
        self.link.on_kernel_packet(now, pkt);
        self.run_actions()
    }

    /// Receives what arrived on the UD QP, runs the timers and returns the IP packets for
    /// the kernel. Waits up to `wait` for the first completion.
    pub fn poll(&mut self, wait: Duration) -> Result<Vec<Vec<u8>>, NodeError> {
        let mut first = self.cq.wait(Some(wait));
        while let Some(wc) = first.take().or_else(|| self.cq.poll_one()) {
            if wc.opcode != WcOpcode::Recv {
                if wc.status != WcStatus::Success {
                    warn!(status = ?wc.status, "UD send failed");
                }
                continue;
            }
            let i = wc.wr_id as usize;
            if wc.status == WcStatus::Success && (wc.byte_len as usize) >= GRH_LEN && i < RECV_SLOTS {
                let len = (wc.byte_len as usize).min(self.slot) - GRH_LEN;
                let msg = self
                    .mr
                    .to_vec(i * self.slot + GRH_LEN, len)
                    .map_err(|_| NodeError::OutOfBounds)?;
                // Our own multicast comes back (loopback): Linux ipoib drops it by source QPN.
                if wc.src_qp != self.qp.qp_num() {
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
        }
        let now = self.now();
        self.link.on_tick(now);
        self.run_actions()?;
        Ok(std::mem::take(&mut self.to_kernel))
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

    fn run_actions(&mut self) -> Result<(), NodeError> {
        for a in self.link.take_actions() {
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
                        continue;
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
                    if let Err(e) = self.qp.post_send(&[wr]) {
                        warn!(error = %e, "UD post_send failed, packet dropped");
                    }
                }
                // Datagram mode: the machine never asks for these.
                Action::Connect { .. }
                | Action::Accept { .. }
                | Action::RejectReq { .. }
                | Action::RejectRep { .. }
                | Action::RcSend { .. }
                | Action::Disconnect { .. } => debug!(?a, "connected-mode action in datagram mode ignored"),
            }
        }
        Ok(())
    }
}
