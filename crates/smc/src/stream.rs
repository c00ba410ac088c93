//! The engine and the API: [`SmcStream`] and [`SmcListener`], mirroring
//! `std::net::TcpStream` / `TcpListener`, over a RoCE device of the verbs API.
//!
//! Each SMC-R connection here is its own first contact: the CLC exchange on the TCP
//! connection (the [`crate::clc_machine`]) carries the QPN, GID, PSN, MTU, RMB RKey/address
//! and alert token of each side; the RC QP is moved by hand RESET → INIT → RTR → RTS with
//! those values (A1.11: the server is in INIT at Accept, the client RTR before Confirm and RTS
//! after it, the server RTR/RTS on Confirm). Data goes by RDMA Write into the peer's RMB
//! element followed by a CDC Send ([`crate::conn`] decides what and when); a per-connection
//! progress thread takes the completions; first contact ends with CONFIRM LINK on the QP.
//! Link-group reuse, the rest of LLC and the
//! second link are later work (see docs/smc.md).
//!
//! Indication of SMC (the TCP option cannot be put on std sockets' SYN): a [`SmcStream`]
//! client always proposes (it assumes an SMC-capable peer, or is told otherwise with
//! [`SmcConfig::propose`]); an [`SmcListener`] looks at the first octets the client sends
//! (`peek`, nothing consumed): the CLC eyecatcher means the client indicated SMC, anything
//! else (or nothing within [`SmcConfig::indication_wait`]) is a plain TCP client → fallback
//! "peer did not indicate SMC", with every octet left for the application.

use crate::clc_machine::{ClcMachine, FallbackReason, LinkParams, LocalCaps, NeedLink, Outcome};
use crate::conn::{AbortReason, Action, CloseState, Conn, ConnError, ConnParams};
use crate::wire::cdc::{CDC_LEN, CDC_TYPE, Cdc};
use crate::wire::clc::{AcceptConfirm, Diagnosis, EYECATCHER_SMCR, HOSTNAME_LEN, PeerId};
use crate::wire::cursor::{EyecatcherMode, Rmbe};
use crate::wire::llc::{CONFIRM_LINK_NO_RMBE_EYECATCHER, ConfirmLink, LlcBody, LlcMessage, TestLink};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use verbs::{
    Access, AhAttr, CompletionQueue, Device, Gid, MemoryRegion, Mtu, ProtectionDomain, QpAttr, QpInit, QpInitAttr,
    QpType, QueuePair, RecvWr, RemoteAddr, RtrAttr, RtsAttr, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// Settings of one endpoint.
#[derive(Debug, Clone)]
pub struct SmcConfig {
    /// RMB element size: a power of two from 16 KiB to 512 KiB (A1.6 compressed sizes 0..5).
    pub rmbe_len: u32,
    /// Send buffer size (the registered ring RDMA Writes read from).
    pub send_buf: u32,
    /// Client: send a Proposal (the peer is taken to support SMC-R). False = plain TCP with
    /// reason "peer did not indicate SMC".
    pub propose: bool,
    /// Server: how long to wait for the client's first octets before deciding it is plain TCP.
    pub indication_wait: Duration,
    /// The CLC exchange must finish within this time (Linux: 6 s).
    pub clc_timeout: Duration,
    /// IPv4 prefix length of the connection's subnet (the Proposal's IP area, E-4).
    pub prefix_len: u8,
    /// Guard timer of the close wait states (SMC-CLS-9).
    pub close_timeout: Duration,
}

impl Default for SmcConfig {
    fn default() -> Self {
        Self {
            rmbe_len: 64 * 1024,
            send_buf: 64 * 1024,
            propose: true,
            indication_wait: Duration::from_millis(500),
            clc_timeout: crate::clc_machine::CLC_WAIT,
            prefix_len: 24,
            close_timeout: Duration::from_secs(10),
        }
    }
}

/// How a connection carries its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// SMC-R: RDMA Writes into the peer's RMB element.
    SmcR,
    /// Plain TCP, and why.
    Fallback(FallbackReason),
}

/// Send-queue depth of a link's QP; CDC send slots are as many.
const SQ_DEPTH: u32 = 512;
/// Receive WQEs kept posted (44-octet CDCs in 64-octet slots, E-12).
const RQ_DEPTH: u32 = 512;
const SLOT: usize = 64;
const WR_WRITE: u64 = 1 << 62;
const WR_CDC: u64 = 1 << 61;
const WR_SETUP: u64 = 1 << 60;
const WR_LLC: u64 = 1 << 59;
/// First-contact LLC wait (Linux: 5 s, SMC-TMR-S1).
const CONFIRM_LINK_WAIT: Duration = Duration::from_secs(5);

static NEXT_LINK_UID: AtomicU32 = AtomicU32::new(1);
static LIVE_LINKS: AtomicU32 = AtomicU32::new(0);

/// Links (each one QP, one PD and three MRs: RMB, send ring, control slots) alive in this
/// process: what a leak check counts (the seed of `smc stat`).
pub fn live_links() -> u32 {
    LIVE_LINKS.load(Ordering::Acquire)
}

static NEXT_TOKEN: AtomicU32 = AtomicU32::new(1);

/// An alert token that names a connection and is not a bare index (SMC-GEN-S2): a
/// process-wide counter mixed with a per-process random-ish value.
fn new_token() -> u32 {
    let n = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let salt = (std::process::id()).wrapping_mul(0x9E37_79B9);
    (n.wrapping_mul(0x85EB_CA6B) ^ salt) | 1
}

/// An initial PSN that differs between links and runs (not a security measure: RC PSNs are
/// not secret).
fn random_psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ new_token()) & 0x00FF_FFFF
}

fn rmbe_size_code(len: u32) -> Option<u8> {
    (0..=5u8).find(|&c| 16_384u32 << c == len)
}

fn io_err(kind: io::ErrorKind, msg: impl std::fmt::Display) -> io::Error {
    io::Error::new(kind, msg.to_string())
}

fn verbs_err(e: verbs::Error) -> io::Error {
    io_err(io::ErrorKind::Other, format!("verbs: {e}"))
}

/// Verbs resources of one connection's link (one QP, one PD: the link group of one).
struct Link {
    qp: QueuePair,
    cq: CompletionQueue,
    rmb: MemoryRegion,
    sndbuf: MemoryRegion,
    /// CDC send slots, then receive slots.
    ctrl: MemoryRegion,
    peer_rmb: RemoteAddr,
    psn: u32,
    _pd: ProtectionDomain,
}

impl Link {
    fn new(dev: &Device, cfg: &SmcConfig) -> io::Result<Self> {
        let pd = dev.alloc_pd().map_err(verbs_err)?;
        let cq = dev.create_cq((SQ_DEPTH + RQ_DEPTH) as usize * 2).map_err(verbs_err)?;
        let cap = QpInitAttr {
            max_send_wr: SQ_DEPTH,
            max_recv_wr: RQ_DEPTH,
            ..QpInitAttr::default()
        };
        let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq).cap(cap)).map_err(verbs_err)?;
        // A1.11: the RMB is remotely writable only; no remote read or atomics.
        let rmb = pd
            .reg_mr(cfg.rmbe_len as usize, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(verbs_err)?;
        let sndbuf = pd
            .reg_mr(cfg.send_buf as usize, Access::LOCAL_WRITE)
            .map_err(verbs_err)?;
        let ctrl = pd
            .reg_mr((SQ_DEPTH + RQ_DEPTH) as usize * SLOT, Access::LOCAL_WRITE)
            .map_err(verbs_err)?;
        qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE))
            .map_err(verbs_err)?;
        let recvs: Vec<RecvWr> = (0..RQ_DEPTH)
            .map(|i| RecvWr {
                wr_id: u64::from(i),
                sg_list: vec![ctrl.sge((SQ_DEPTH + i) as usize * SLOT, SLOT as u32)],
            })
            .collect();
        qp.post_recv(&recvs).map_err(verbs_err)?;
        LIVE_LINKS.fetch_add(1, Ordering::AcqRel);
        Ok(Self {
            qp,
            cq,
            rmb,
            sndbuf,
            ctrl,
            peer_rmb: RemoteAddr { addr: 0, rkey: 0 },
            psn: random_psn(),
            _pd: pd,
        })
    }

    fn params(&self, token: u32, cfg: &SmcConfig, mtu: Mtu) -> LinkParams {
        LinkParams {
            qpn: self.qp.qp_num(),
            rmb_rkey: self.rmb.rkey(),
            rmbe_idx: 1,
            alert_token: token,
            rmbe_size: rmbe_size_code(cfg.rmbe_len).unwrap_or(0),
            qp_mtu: mtu as u8,
            rmb_vaddr: self.rmb.addr(),
            psn: self.psn,
        }
    }

    /// Posts a 44-octet control message (CDC or LLC) from send slot `slot`.
    fn post_ctrl(&self, slot: u32, bytes: &[u8; CDC_LEN], wr_id: u64) -> Result<(), verbs::Error> {
        let off = (slot % SQ_DEPTH) as usize * SLOT;
        let _ = self.ctrl.write(off, bytes);
        self.qp.post_send_one(SendWr::new(
            wr_id,
            WrOpcode::Send,
            vec![self.ctrl.sge(off, CDC_LEN as u32)],
        ))
    }

    /// Our CONFIRM LINK (A.3.1): Linux's no-eyecatcher flags, one link (we run no ADD LINK).
    fn confirm_link(&self, gid: [u8; 16], mac: [u8; 6]) -> ConfirmLink {
        let uid = NEXT_LINK_UID.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        ConfirmLink {
            flags: CONFIRM_LINK_NO_RMBE_EYECATCHER,
            mac,
            gid,
            qpn: self.qp.qp_num(),
            link_num: 1,
            link_uid: uid,
            max_links: 1,
            max_conns: 255,
        }
    }

    /// The first-contact CONFIRM LINK exchange on the new QP (A4.2, §3.5.1.5): the server
    /// sends the request once in RTS, the client answers with R set. Returns the peer's
    /// CONFIRM LINK and any CDCs that arrived behind it (kept for the connection machine).
    fn confirm_link_exchange(
        &self,
        server: bool,
        ours: &ConfirmLink,
        timeout: Duration,
    ) -> io::Result<(ConfirmLink, Vec<[u8; CDC_LEN]>)> {
        let mut bytes = [0u8; CDC_LEN];
        let send = |b: &mut [u8; CDC_LEN], reply: bool| -> io::Result<()> {
            let mut m = LlcMessage::request(LlcBody::ConfirmLink(ours.clone()));
            m.reply = reply;
            m.emit(b).map_err(|e| io_err(io::ErrorKind::Other, e))?;
            self.post_ctrl(SQ_DEPTH - 1, b, WR_SETUP).map_err(verbs_err)
        };
        if server {
            send(&mut bytes, false)?;
        }
        let deadline = Instant::now() + timeout;
        let (mut peer, mut sent_done, mut early) = (None, !server, Vec::new());
        while peer.is_none() || !sent_done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io_err(io::ErrorKind::TimedOut, "CONFIRM LINK timed out"));
            }
            let Some(wc) = self.cq.wait(Some(left)) else { continue };
            if wc.status != WcStatus::Success {
                return Err(io_err(
                    io::ErrorKind::ConnectionAborted,
                    format!("CONFIRM LINK: {:?}", wc.status),
                ));
            }
            if wc.opcode != WcOpcode::Recv {
                sent_done = true;
                continue;
            }
            let off = (SQ_DEPTH as usize + wc.wr_id as usize) * SLOT;
            let mut b = [0u8; CDC_LEN];
            let _ = self.ctrl.read(off, &mut b);
            let rwr = RecvWr {
                wr_id: wc.wr_id,
                sg_list: vec![self.ctrl.sge(off, SLOT as u32)],
            };
            self.qp.post_recv(&[rwr]).map_err(verbs_err)?;
            if b[0] == CDC_TYPE {
                early.push(b);
                continue;
            }
            match LlcMessage::parse(&b[..(wc.byte_len as usize).min(CDC_LEN)]) {
                Ok(LlcMessage {
                    body: LlcBody::ConfirmLink(c),
                    reply,
                    ..
                }) if reply == server => {
                    // A2.15: the link's peer is the one the CLC named.
                    if c.flags & CONFIRM_LINK_NO_RMBE_EYECATCHER != CONFIRM_LINK_NO_RMBE_EYECATCHER {
                        return Err(io_err(io::ErrorKind::InvalidData, "peer uses RMBE eyecatchers"));
                    }
                    if !server {
                        send(&mut bytes, true)?;
                    }
                    peer = Some(c);
                }
                Ok(m) => tracing::warn!(?m, "unexpected LLC during CONFIRM LINK, ignored"),
                Err(e) => return Err(io_err(io::ErrorKind::InvalidData, format!("LLC: {e}"))),
            }
        }
        // peer is Some here.
        peer.map(|p| (p, early))
            .ok_or_else(|| io_err(io::ErrorKind::Other, "CONFIRM LINK"))
    }

    /// RTR then RTS towards the peer described by its Accept/Confirm (A1.11 values).
    fn connect(&mut self, peer: &AcceptConfirm, own_mtu: Mtu) -> io::Result<()> {
        let mtu = match peer.qp_mtu {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            _ => Mtu::Mtu4096,
        }
        .min(own_mtu);
        self.qp
            .modify_qp(&QpAttr::rtr(RtrAttr {
                ah_attr: AhAttr::to_gid(Gid(peer.gid)),
                path_mtu: mtu,
                dest_qp_num: peer.qpn & 0x00FF_FFFF,
                rq_psn: peer.psn & 0x00FF_FFFF,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 5,
            }))
            .map_err(verbs_err)?;
        self.qp
            .modify_qp(&QpAttr::rts(RtsAttr {
                sq_psn: self.psn,
                timeout: 15,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
            }))
            .map_err(verbs_err)?;
        self.peer_rmb = RemoteAddr {
            addr: peer.rmb_vaddr,
            rkey: peer.rmb_rkey,
        };
        Ok(())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        LIVE_LINKS.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Inner {
    conn: Conn,
    /// Actions not yet posted (the send queue was full), in order.
    pending: VecDeque<Action>,
    sq_outstanding: u32,
    cdc_slot: u32,
    /// Octets ever accepted from the application (stream offset of the next one).
    accepted: u64,
    read_shut: bool,
    nonblocking: bool,
    link_error: Option<String>,
    close_deadline: Option<Instant>,
    tcp_reset: bool,
}

struct Shared {
    inner: Mutex<Inner>,
    cv: Condvar,
    link: Link,
    dropped: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Posts the machine's actions in order while the send queue has room.
    fn drive(&self, g: &mut Inner) {
        while let Some(a) = g.conn.poll_action() {
            g.pending.push_back(a);
        }
        while let Some(a) = g.pending.front().copied() {
            match a {
                Action::RdmaWrite { src, remote_off, len } => {
                    if g.sq_outstanding >= SQ_DEPTH {
                        return;
                    }
                    let ring = u64::from(g.conn.params().send_buf);
                    let off = (src % ring) as usize;
                    let first = (len as usize).min(ring as usize - off);
                    let mut sges = vec![self.link.sndbuf.sge(off, first as u32)];
                    if first < len as usize {
                        sges.push(self.link.sndbuf.sge(0, len - first as u32));
                    }
                    let remote = RemoteAddr {
                        addr: self.link.peer_rmb.addr + u64::from(remote_off),
                        rkey: self.link.peer_rmb.rkey,
                    };
                    let wr = SendWr::new(WR_WRITE | u64::from(len), WrOpcode::RdmaWrite { remote }, sges);
                    if let Err(e) = self.link.qp.post_send_one(wr) {
                        self.link_failed(g, format!("post RDMA Write: {e}"));
                        return;
                    }
                    g.sq_outstanding += 1;
                }
                Action::SendCdc(m) => {
                    if g.sq_outstanding >= SQ_DEPTH {
                        return;
                    }
                    let slot = g.cdc_slot;
                    g.cdc_slot = g.cdc_slot.wrapping_add(1);
                    if let Err(e) = self.link.post_ctrl(slot, &m.to_bytes(), WR_CDC) {
                        self.link_failed(g, format!("post CDC: {e}"));
                        return;
                    }
                    g.sq_outstanding += 1;
                }
                Action::TcpReset => g.tcp_reset = true,
                Action::ReleaseElement => {}
            }
            g.pending.pop_front();
        }
    }

    fn link_failed(&self, g: &mut Inner, why: String) {
        tracing::warn!(error = %why, "SMC-R link failed, resetting the connection");
        if g.link_error.is_none() {
            g.link_error = Some(why);
        }
        g.pending.clear();
        // No RoCE path left: reset (SMC-ABT-6, -7); nothing more goes on the QP.
        g.conn.on_tcp_reset();
        while g.conn.poll_action().is_some() {}
        g.tcp_reset = true;
        self.cv.notify_all();
    }

    /// LLC messages after link setup: TEST LINK is answered at once with the same user
    /// data (SMC-KA-2); DELETE LINK of our only link resets the connection; others (no ADD
    /// LINK or RKEY handling yet) are logged and ignored.
    fn on_llc(&self, g: &mut Inner, b: &[u8; CDC_LEN]) {
        match LlcMessage::parse(b) {
            Ok(LlcMessage {
                body: LlcBody::TestLink(TestLink { user_data }),
                reply: false,
                ..
            }) => {
                let mut out = [0u8; CDC_LEN];
                let m = LlcMessage::request(LlcBody::TestLink(TestLink { user_data })).into_reply();
                if m.emit(&mut out).is_ok() && g.sq_outstanding < SQ_DEPTH {
                    let slot = g.cdc_slot;
                    g.cdc_slot = g.cdc_slot.wrapping_add(1);
                    if let Err(e) = self.link.post_ctrl(slot, &out, WR_LLC) {
                        self.link_failed(g, format!("post TEST LINK reply: {e}"));
                        return;
                    }
                    g.sq_outstanding += 1;
                }
            }
            Ok(LlcMessage {
                body: LlcBody::DeleteLink(d),
                ..
            }) => {
                self.link_failed(g, format!("peer deleted the link (reason {:#010x})", d.reason));
            }
            Ok(m) => tracing::debug!(?m, "LLC message not handled yet, ignored"),
            Err(e) => tracing::warn!(error = %e, "bad LLC message, ignored"),
        }
    }

    fn on_completion(&self, g: &mut Inner, wc: &WorkCompletion) {
        if wc.status != WcStatus::Success {
            if g.link_error.is_none() {
                self.link_failed(g, format!("completion {:?} for {:?}", wc.status, wc.opcode));
            }
            return;
        }
        match wc.opcode {
            WcOpcode::Recv => {
                let slot = (SQ_DEPTH as usize + wc.wr_id as usize) * SLOT;
                let mut b = [0u8; CDC_LEN];
                let ok = wc.byte_len as usize >= CDC_LEN && self.link.ctrl.read(slot, &mut b).is_ok();
                if !ok {
                    tracing::warn!(len = wc.byte_len, "short message on the link, dropped");
                } else if b[0] == CDC_TYPE {
                    match Cdc::parse(&b) {
                        Ok(m) => {
                            g.conn.on_cdc(&m);
                        }
                        Err(e) => tracing::warn!(error = %e, "bad CDC, dropped"),
                    }
                } else {
                    self.on_llc(g, &b);
                }
                let rwr = RecvWr {
                    wr_id: wc.wr_id,
                    sg_list: vec![self.link.ctrl.sge(slot, SLOT as u32)],
                };
                if let Err(e) = self.link.qp.post_recv(&[rwr]) {
                    self.link_failed(g, format!("post recv: {e}"));
                }
            }
            _ if wc.wr_id & WR_SETUP != 0 => {} // the client's CONFIRM LINK reply, not counted
            _ => {
                g.sq_outstanding = g.sq_outstanding.saturating_sub(1);
                if wc.wr_id & WR_WRITE != 0 {
                    g.conn.writes_completed(wc.wr_id & 0xFFFF_FFFF);
                }
            }
        }
    }
}

fn progress_loop(sh: Arc<Shared>, tcp: TcpStream, close_timeout: Duration) {
    let mut buf = Vec::with_capacity(64);
    loop {
        let first = sh.link.cq.wait(Some(Duration::from_millis(50)));
        let mut g = sh.lock();
        if let Some(wc) = &first {
            sh.on_completion(&mut g, wc);
            buf.clear();
            while let Some(wc) = sh.link.cq.poll_one() {
                buf.push(wc);
                if buf.len() >= 64 {
                    break;
                }
            }
            for wc in &buf {
                sh.on_completion(&mut g, wc);
            }
        }
        sh.drive(&mut g);
        if sh.dropped.load(Ordering::Acquire) {
            // The application closed: finish the close handshake, or time out (SMC-CLS-9).
            let deadline = *g.close_deadline.get_or_insert_with(|| Instant::now() + close_timeout);
            if g.conn.state() != CloseState::Closed && Instant::now() >= deadline {
                g.conn.on_timeout();
                sh.drive(&mut g);
            }
            if g.conn.state() == CloseState::Closed || g.link_error.is_some() {
                break;
            }
        }
        if g.tcp_reset {
            let _ = tcp.shutdown(Shutdown::Both);
        } else if first.is_none() && tcp_was_reset(&tcp) {
            // SMC-ABT-4: an RST on the TCP path starts the abnormal close.
            g.conn.on_tcp_reset();
            sh.drive(&mut g);
        }
        sh.cv.notify_all();
    }
    // SMC-CLS-1: the RDMA side is done; now the TCP connection closes.
    let _ = tcp.shutdown(Shutdown::Both);
    sh.cv.notify_all();
}

/// Whether an RST arrived on the TCP path (a nonblocking peek; the TCP connection carries
/// no application octets while SMC-R is on, so nothing is consumed or lost).
fn tcp_was_reset(tcp: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(tcp.peek(&mut b), Err(e) if e.kind() == io::ErrorKind::ConnectionReset)
}

/// The SMC-R part of a stream.
struct SmcSide {
    sh: Arc<Shared>,
    /// Handles (this stream and its clones) still open; the last one closes.
    handles: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

enum Kind {
    Smc(SmcSide),
    Tcp,
}

/// A TCP connection whose data flows over SMC-R when both ends support it; otherwise plain
/// TCP (see [`SmcStream::mode`]). Mirrors `std::net::TcpStream`.
pub struct SmcStream {
    tcp: TcpStream,
    kind: Kind,
    mode: Mode,
    /// Application octets that arrived on the TCP path during the CLC exchange (fallback).
    prefix: Vec<u8>,
}

impl std::fmt::Debug for SmcStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcStream")
            .field("tcp", &self.tcp)
            .field("mode", &self.mode)
            .finish()
    }
}

fn local_caps(dev: &Device, tcp: &TcpStream, cfg: &SmcConfig) -> io::Result<LocalCaps> {
    let gid = dev.query_gid(1, 0).map_err(verbs_err)?;
    let ipv4 = match tcp.local_addr()?.ip() {
        IpAddr::V4(a) => Some((a, cfg.prefix_len)),
        IpAddr::V6(_) => None,
    };
    let mac = [0x02, 0, gid.0[12], gid.0[13], gid.0[14], gid.0[15]];
    let mut hostname = [b' '; HOSTNAME_LEN];
    hostname[..8].copy_from_slice(b"softrdma");
    Ok(LocalCaps {
        enabled: true,
        v1: true,
        v2: false,
        peer_id: PeerId::new((std::process::id() & 0xFFFF) as u16, mac),
        gid: gid.0,
        mac,
        ipv4,
        eids: Vec::new(),
        hostname,
        max_conns: 255,
        max_links: 1,
    })
}

/// Runs the CLC machine on `tcp` until it decides; `on_need` answers NeedLink.
fn run_clc(
    tcp: &mut TcpStream,
    m: &mut ClcMachine,
    deadline: Instant,
    mut on_need: impl FnMut(&mut ClcMachine, &NeedLink) -> io::Result<()>,
) -> io::Result<()> {
    let mut buf = [0u8; 1024];
    loop {
        let out = m.take_output();
        if !out.is_empty() {
            tcp.write_all(&out)?;
        }
        match m.outcome().clone() {
            Outcome::Pending => {}
            Outcome::NeedLink(n) => {
                on_need(m, &n)?;
                continue;
            }
            Outcome::Proceed(_) | Outcome::Fallback(_) => return Ok(()),
            Outcome::Reset(r) => {
                let _ = tcp.shutdown(Shutdown::Both);
                return Err(io_err(io::ErrorKind::ConnectionReset, format!("SMC-R CLC: {r}")));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            m.on_timeout();
            continue;
        }
        tcp.set_read_timeout(Some(left))?;
        match tcp.read(&mut buf) {
            Ok(0) => {
                m.on_eof();
            }
            Ok(n) => {
                m.on_bytes(&buf[..n]);
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                m.on_timeout();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn device_mtu(dev: &Device) -> Mtu {
    dev.query_port(1).map(|p| p.active_mtu).unwrap_or(Mtu::Mtu1024)
}

impl SmcStream {
    /// Connects to `addr` over TCP, then proposes SMC-R on `dev` (unless
    /// [`SmcConfig::propose`] is false). A Decline gives a working TCP connection with the
    /// reason in [`SmcStream::mode`].
    pub fn connect<A: ToSocketAddrs>(addr: A, dev: &Device) -> io::Result<Self> {
        Self::connect_with(addr, dev, &SmcConfig::default())
    }

    /// [`SmcStream::connect`] with explicit settings.
    pub fn connect_with<A: ToSocketAddrs>(addr: A, dev: &Device, cfg: &SmcConfig) -> io::Result<Self> {
        Self::connect_over(TcpStream::connect(addr)?, dev, cfg)
    }

    /// The client side of SMC-R on a TCP connection connected elsewhere (e.g. by an
    /// unmodified program whose socket `softrdma smc run`'s daemon was handed): proposes on
    /// `dev` when [`SmcConfig::propose`] is set (the peer's SYN-ACK carried the option),
    /// else falls back with "peer did not indicate SMC" without sending anything.
    pub fn connect_over(tcp: TcpStream, dev: &Device, cfg: &SmcConfig) -> io::Result<Self> {
        let mut tcp = tcp;
        let caps = local_caps(dev, &tcp, cfg)?;
        let me = (caps.gid, caps.mac);
        let mut m = ClcMachine::client(caps, cfg.propose);
        let token = new_token();
        let mtu = device_mtu(dev);
        let mut link: Option<Link> = None;
        let deadline = Instant::now() + cfg.clc_timeout;
        run_clc(&mut tcp, &mut m, deadline, |m, need| {
            let NeedLink::Accept(acc) = need else {
                return Err(io_err(
                    io::ErrorKind::Other,
                    "CLC: server-side decision asked of a client",
                ));
            };
            let rmbe_ok = acc.check_enums().is_ok() && acc.rmbe_bytes() <= Rmbe::MAX_LEN;
            let made = if rmbe_ok {
                Link::new(dev, cfg)
            } else {
                Err(io_err(io::ErrorKind::InvalidData, "bad Accept"))
            };
            match made {
                Ok(mut l) => {
                    // A1.11: client INIT → RTR before Confirm; RTS right after, then it waits
                    // for the server's CONFIRM LINK.
                    if let Err(e) = l.connect(acc, mtu) {
                        tracing::warn!(error = %e, "client QP to RTR/RTS failed, declining");
                        let _ = m.decline(Diagnosis::ERR_READY_LINK, false);
                        return Ok(());
                    }
                    let p = l.params(token, cfg, mtu);
                    m.confirm(&p).map_err(|e| io_err(io::ErrorKind::Other, e))?;
                    link = Some(l);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no link for the Accept, declining");
                    let _ = m.decline(Diagnosis::MEM, false);
                }
            }
            Ok(())
        })?;
        Self::finish(tcp, m, link, token, cfg, false, me)
    }

    fn finish(
        mut tcp: TcpStream,
        mut m: ClcMachine,
        link: Option<Link>,
        token: u32,
        cfg: &SmcConfig,
        server: bool,
        me: ([u8; 16], [u8; 6]),
    ) -> io::Result<Self> {
        tcp.set_read_timeout(None)?;
        let mut early = Vec::new();
        if let (Outcome::Proceed(peer), Some(l)) = (m.outcome().clone(), link.as_ref()) {
            // First contact: CONFIRM LINK on the new QP, before the point of no return (a
            // failure here still Declines, C.2/C.3).
            let ours = l.confirm_link(me.0, me.1);
            let res = l
                .confirm_link_exchange(server, &ours, CONFIRM_LINK_WAIT)
                .and_then(|(c, e)| {
                    if c.qpn != peer.qpn & 0x00FF_FFFF || c.gid != peer.gid {
                        Err(io_err(
                            io::ErrorKind::InvalidData,
                            "CONFIRM LINK names another QP or GID than the CLC",
                        ))
                    } else {
                        Ok(e)
                    }
                });
            match res {
                Ok(e) => early = e,
                Err(e) => {
                    tracing::warn!(error = %e, "CONFIRM LINK failed, declining");
                    let d = if e.kind() == io::ErrorKind::TimedOut {
                        Diagnosis::TIMEOUT_CONFIRM_LINK
                    } else {
                        Diagnosis::RMBE_EYECATCHER
                    };
                    let _ = m.decline(d, false);
                    let out = m.take_output();
                    tcp.write_all(&out)?;
                }
            }
        }
        match m.outcome().clone() {
            Outcome::Proceed(peer) => {
                let Some(link) = link else {
                    return Err(io_err(io::ErrorKind::Other, "CLC proceeded without a link"));
                };
                m.point_of_no_return();
                // Linux mode (E-6): both CONFIRM LINKs carried the no-eyecatcher flags.
                let mode = EyecatcherMode::None;
                let params = ConnParams {
                    local_token: token,
                    peer_token: peer.rmbe_alert_token,
                    local_rmbe: Rmbe::new(cfg.rmbe_len, mode).map_err(|e| io_err(io::ErrorKind::Other, e))?,
                    peer_rmbe: Rmbe::new(peer.rmbe_bytes(), mode).map_err(|e| io_err(io::ErrorKind::InvalidData, e))?,
                    send_buf: cfg.send_buf,
                };
                let sh = Arc::new(Shared {
                    inner: Mutex::new(Inner {
                        conn: Conn::new(params),
                        pending: VecDeque::new(),
                        sq_outstanding: 0,
                        cdc_slot: 0,
                        accepted: 0,
                        read_shut: false,
                        nonblocking: false,
                        link_error: None,
                        close_deadline: None,
                        tcp_reset: false,
                    }),
                    cv: Condvar::new(),
                    link,
                    dropped: AtomicBool::new(false),
                });
                {
                    let mut g = sh.lock();
                    for b in &early {
                        if let Ok(c) = Cdc::parse(b) {
                            g.conn.on_cdc(&c);
                        }
                    }
                    sh.drive(&mut g);
                }
                let t2 = tcp.try_clone()?;
                // The progress thread peeks at it for an RST; the application never reads it.
                t2.set_nonblocking(true)?;
                let sh2 = Arc::clone(&sh);
                let close_timeout = cfg.close_timeout;
                let thread = std::thread::Builder::new()
                    .name("smc-conn".into())
                    .spawn(move || progress_loop(sh2, t2, close_timeout))?;
                Ok(Self {
                    tcp,
                    kind: Kind::Smc(SmcSide {
                        sh,
                        handles: Arc::new(AtomicU32::new(1)),
                        thread: Some(thread),
                    }),
                    mode: Mode::SmcR,
                    prefix: Vec::new(),
                })
            }
            Outcome::Fallback(r) => {
                tracing::info!(reason = %r, "SMC-R fallback to TCP");
                let prefix = m.take_app_data();
                Ok(Self {
                    tcp,
                    kind: Kind::Tcp,
                    mode: Mode::Fallback(r),
                    prefix,
                })
            }
            Outcome::Reset(r) => Err(io_err(io::ErrorKind::ConnectionReset, format!("SMC-R CLC: {r}"))),
            Outcome::Pending | Outcome::NeedLink(_) => Err(io_err(io::ErrorKind::Other, "CLC undecided")),
        }
    }

    /// A second handle to the same connection (e.g. one thread reads, one writes), as
    /// `TcpStream::try_clone`. The connection closes when the last handle is dropped.
    /// Octets of a fallback connection already buffered during CLC stay with `self`.
    pub fn try_clone(&self) -> io::Result<Self> {
        let kind = match &self.kind {
            Kind::Tcp => Kind::Tcp,
            Kind::Smc(s) => {
                s.handles.fetch_add(1, Ordering::AcqRel);
                Kind::Smc(SmcSide {
                    sh: Arc::clone(&s.sh),
                    handles: Arc::clone(&s.handles),
                    thread: None,
                })
            }
        };
        Ok(Self {
            tcp: self.tcp.try_clone()?,
            kind,
            mode: self.mode,
            prefix: Vec::new(),
        })
    }

    /// SMC-R, or fallback to TCP with the reason.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The local socket address of the TCP connection.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The peer's socket address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.peer_addr()
    }

    /// Non-blocking reads and writes (`WouldBlock` instead of waiting).
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match &self.kind {
            Kind::Smc(s) => {
                s.sh.lock().nonblocking = nonblocking;
                Ok(())
            }
            Kind::Tcp => self.tcp.set_nonblocking(nonblocking),
        }
    }

    /// Shuts down reading, writing or both, as `TcpStream::shutdown`. Over SMC-R writing
    /// ends with a CDC carrying D once the queued data is out (SMC-CLS-3); reading is
    /// local only (SMC-CLS-11).
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match &self.kind {
            Kind::Tcp => self.tcp.shutdown(how),
            Kind::Smc(s) => {
                let mut g = s.sh.lock();
                if matches!(how, Shutdown::Read | Shutdown::Both) {
                    g.read_shut = true;
                }
                if matches!(how, Shutdown::Write | Shutdown::Both) {
                    g.conn
                        .shutdown_write()
                        .map_err(|e| io_err(io::ErrorKind::NotConnected, e))?;
                    s.sh.drive(&mut g);
                }
                s.sh.cv.notify_all();
                Ok(())
            }
        }
    }

    /// The octets that can be read without blocking (FIONREAD).
    pub fn readable(&self) -> usize {
        match &self.kind {
            Kind::Smc(s) => s.sh.lock().conn.readable() as usize + self.prefix.len(),
            Kind::Tcp => self.prefix.len(),
        }
    }

    fn smc_err(g: &Inner) -> io::Error {
        if let Some(e) = &g.link_error {
            return io_err(io::ErrorKind::ConnectionReset, format!("SMC-R link failed: {e}"));
        }
        match g.conn.abort_reason() {
            Some(AbortReason::PeerAbort) | Some(AbortReason::TcpReset) => {
                io_err(io::ErrorKind::ConnectionReset, "connection reset by peer")
            }
            Some(r) => io_err(io::ErrorKind::ConnectionAborted, r),
            None => io_err(io::ErrorKind::BrokenPipe, "connection closed"),
        }
    }
}

impl Read for SmcStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.prefix.is_empty() {
            let n = buf.len().min(self.prefix.len());
            buf[..n].copy_from_slice(&self.prefix[..n]);
            self.prefix.drain(..n);
            return Ok(n);
        }
        let s = match &self.kind {
            Kind::Tcp => return self.tcp.read(buf),
            Kind::Smc(s) => s,
        };
        if buf.is_empty() {
            return Ok(0);
        }
        let mut g = s.sh.lock();
        loop {
            if g.read_shut {
                return Ok(0);
            }
            if g.conn.readable() > 0 {
                let (a, b) = g.conn.read_spans(buf.len() as u64);
                let la = a.len as usize;
                s.sh.link
                    .rmb
                    .read(a.off as usize, &mut buf[..la])
                    .map_err(|_| io_err(io::ErrorKind::Other, "RMB read"))?;
                let mut n = la;
                if let Some(b) = b {
                    let lb = b.len as usize;
                    s.sh.link
                        .rmb
                        .read(b.off as usize, &mut buf[la..la + lb])
                        .map_err(|_| io_err(io::ErrorKind::Other, "RMB read"))?;
                    n += lb;
                }
                g.conn.consume(n as u64).map_err(|e| io_err(io::ErrorKind::Other, e))?;
                s.sh.drive(&mut g);
                return Ok(n);
            }
            if g.conn.read_eof() {
                return Ok(0);
            }
            if g.conn.abort_reason().is_some() || g.link_error.is_some() {
                return Err(Self::smc_err(&g));
            }
            if g.nonblocking {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            g =
                s.sh.cv
                    .wait_timeout(g, Duration::from_millis(200))
                    .map(|r| r.0)
                    .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

impl SmcStream {
    fn smc_write(s: &SmcSide, buf: &[u8], urgent: bool) -> io::Result<usize> {
        let mut g = s.sh.lock();
        loop {
            if g.conn.abort_reason().is_some() || g.link_error.is_some() {
                return Err(Self::smc_err(&g));
            }
            let space = g.conn.write_space();
            if space > 0 {
                let n = (buf.len() as u64).min(space) as usize;
                let ring = g.conn.params().send_buf as usize;
                let off = (g.accepted % ring as u64) as usize;
                let first = n.min(ring - off);
                // Octets beyond the accepted ones are not in use: copying before the machine
                // accepts them is harmless if it does not.
                let copy = |o: usize, d: &[u8]| {
                    s.sh.link
                        .sndbuf
                        .write(o, d)
                        .map_err(|_| io_err(io::ErrorKind::Other, "send buffer"))
                };
                copy(off, &buf[..first])?;
                if first < n {
                    copy(0, &buf[first..n])?;
                }
                let r = if urgent {
                    g.conn.write_urgent(n as u64)
                } else {
                    g.conn.write(n as u64)
                };
                match r {
                    Ok(took) => {
                        g.accepted += took;
                        s.sh.drive(&mut g);
                        return Ok(took as usize);
                    }
                    Err(ConnError::UrgentOutstanding) => {}
                    Err(e) => return Err(io_err(io::ErrorKind::BrokenPipe, e)),
                }
            } else if let Err(e) = g.conn.write(0) {
                return Err(io_err(io::ErrorKind::BrokenPipe, e));
            }
            if g.nonblocking {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            g =
                s.sh.cv
                    .wait_timeout(g, Duration::from_millis(200))
                    .map(|r| r.0)
                    .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Sends `buf` as urgent data (`send(MSG_OOB)`): the last octet accepted is the urgent
    /// mark (A2.9; TCP-like, as Linux). Waits while earlier urgent data is unacknowledged.
    /// On a fallback connection this is a plain write (std sockets have no MSG_OOB).
    pub fn send_urgent(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.kind {
            Kind::Tcp => self.tcp.write(buf),
            Kind::Smc(_) if buf.is_empty() => Ok(0),
            Kind::Smc(s) => Self::smc_write(s, buf, true),
        }
    }

    /// Urgent data announced by the peer and not yet read past: `Some(n)` = the urgent octet
    /// is the `n`-th octet to read (`Some(0)` when announced but not yet written, A4.5).
    pub fn urgent_mark(&self) -> Option<usize> {
        match &self.kind {
            Kind::Tcp => None,
            Kind::Smc(s) => {
                let g = s.sh.lock();
                match g.conn.bytes_to_urgent_mark() {
                    Some(n) => Some(n as usize),
                    None => g.conn.urgent_pending().then_some(0),
                }
            }
        }
    }
}

impl Write for SmcStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.kind {
            Kind::Tcp => self.tcp.write(buf),
            Kind::Smc(_) if buf.is_empty() => Ok(0),
            Kind::Smc(s) => Self::smc_write(s, buf, false),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &self.kind {
            Kind::Tcp => self.tcp.flush(),
            Kind::Smc(_) => Ok(()),
        }
    }
}

impl Drop for SmcStream {
    fn drop(&mut self) {
        if let Kind::Smc(s) = &mut self.kind {
            if s.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
                return;
            }
            {
                let mut g = s.sh.lock();
                // close(): C once everything queued is out; abort if data is unread (SMC-CLS-2).
                g.conn.close();
                s.sh.drive(&mut g);
            }
            s.sh.dropped.store(true, Ordering::Release);
            // The progress thread finishes the close handshake on its own (the application
            // does not wait, as with close(2)) and then releases the link.
            if let Some(t) = s.thread.take() {
                drop(t);
            }
        }
    }
}

/// Accepts TCP connections and runs SMC-R on them when the client proposes it.
/// Mirrors `std::net::TcpListener`.
pub struct SmcListener {
    tcp: TcpListener,
    dev: Device,
    cfg: SmcConfig,
}

impl std::fmt::Debug for SmcListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcListener")
            .field("tcp", &self.tcp)
            .field("device", &self.dev.name())
            .finish()
    }
}

impl SmcListener {
    /// Binds `addr`; accepted connections use SMC-R on `dev`.
    pub fn bind<A: ToSocketAddrs>(addr: A, dev: &Device) -> io::Result<Self> {
        Self::bind_with(addr, dev, SmcConfig::default())
    }

    /// [`SmcListener::bind`] with explicit settings.
    pub fn bind_with<A: ToSocketAddrs>(addr: A, dev: &Device, cfg: SmcConfig) -> io::Result<Self> {
        Ok(Self {
            tcp: TcpListener::bind(addr)?,
            dev: dev.clone(),
            cfg,
        })
    }

    /// The listening address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Accepts one connection and runs the server side of the CLC exchange on it.
    pub fn accept(&self) -> io::Result<(SmcStream, SocketAddr)> {
        let (tcp, peer) = self.tcp.accept()?;
        Ok((SmcStream::accept_over(tcp, Some(&self.dev), &self.cfg, None)?, peer))
    }

    /// An iterator over accepted connections, as `TcpListener::incoming`.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<SmcStream>> + '_ {
        std::iter::repeat_with(move || self.accept().map(|(s, _)| s))
    }
}

impl SmcStream {
    /// The server side of SMC-R on a TCP connection accepted elsewhere (e.g. by an
    /// unmodified program under `softrdma smc run`). `indicated`: whether the client's SYN
    /// carried the SMC-R option (from [`crate::sockops::Guard::peer_offered_smc`]); `None`
    /// = look at the client's first octets as [`SmcListener::accept`] does. Without a
    /// device (`dev` = `None`) a client that indicated SMC gets the CLC answer of a server
    /// with SMC-R unavailable: its Proposal is read and Declined (F2), then TCP goes on.
    pub fn accept_over(
        tcp: TcpStream,
        dev: Option<&Device>,
        cfg: &SmcConfig,
        indicated: Option<bool>,
    ) -> io::Result<Self> {
        let mut tcp = tcp;
        let indicated = match indicated {
            Some(b) => b,
            None => client_indicates_smc(&tcp, cfg.indication_wait)?,
        };
        let Some(dev) = dev else {
            let mut hostname = [b' '; HOSTNAME_LEN];
            hostname[..8].copy_from_slice(b"softrdma");
            let caps = LocalCaps {
                enabled: false,
                v1: true,
                v2: false,
                peer_id: PeerId::new((std::process::id() & 0xFFFF) as u16, [0; 6]),
                gid: [0; 16],
                mac: [0; 6],
                ipv4: None,
                eids: Vec::new(),
                hostname,
                max_conns: 255,
                max_links: 1,
            };
            let mut m = ClcMachine::server(caps, indicated);
            let deadline = Instant::now() + cfg.clc_timeout;
            run_clc(&mut tcp, &mut m, deadline, |_, _| {
                Err(io_err(io::ErrorKind::Other, "CLC: no device to accept with"))
            })?;
            return SmcStream::finish(tcp, m, None, 0, cfg, true, ([0; 16], [0; 6]));
        };
        let caps = local_caps(dev, &tcp, cfg)?;
        let me = (caps.gid, caps.mac);
        let mut m = ClcMachine::server(caps, indicated);
        let token = new_token();
        let mtu = device_mtu(dev);
        let mut link: Option<Link> = None;
        let deadline = Instant::now() + cfg.clc_timeout;
        run_clc(&mut tcp, &mut m, deadline, |m, need| {
            let NeedLink::Proposal { .. } = need else {
                return Err(io_err(
                    io::ErrorKind::Other,
                    "CLC: client-side decision asked of a server",
                ));
            };
            match Link::new(dev, cfg) {
                Ok(l) => {
                    // A1.11: the server's QP is in INIT at Accept.
                    m.accept(&l.params(token, cfg, mtu), true)
                        .map_err(|e| io_err(io::ErrorKind::Other, e))?;
                    link = Some(l);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no link for the Proposal, declining");
                    let _ = m.decline(Diagnosis::MEM, false);
                }
            }
            Ok(())
        })?;
        if let (Outcome::Proceed(confirm), Some(l)) = (m.outcome().clone(), link.as_mut()) {
            // Server RTR → RTS on Confirm.
            if let Err(e) = l.connect(&confirm, mtu) {
                let _ = m.decline(Diagnosis::ERR_READY_LINK, false);
                let out = m.take_output();
                let _ = tcp.write_all(&out);
                tracing::warn!(error = %e, "server QP to RTR/RTS failed, declined");
            }
        }
        SmcStream::finish(tcp, m, link, token, cfg, true, me)
    }

    /// A fallback connection's TCP stream and the octets already read from it during the
    /// CLC exchange (they come before anything still in the socket); `Err(self)` over SMC-R.
    pub fn into_tcp(self) -> Result<(TcpStream, Vec<u8>), Self> {
        if !matches!(self.kind, Kind::Tcp) {
            return Err(self);
        }
        let mut me = self;
        match me.tcp.try_clone() {
            Ok(tcp) => Ok((tcp, std::mem::take(&mut me.prefix))),
            Err(_) => Err(me),
        }
    }
}

/// The listener's substitute for the SYN's TCP option: did the client's first octets start
/// with the CLC eyecatcher? Looks with `peek` (consumes nothing); a plain client that sends
/// nothing within `wait`, or other octets, or closes, did not indicate SMC.
fn client_indicates_smc(tcp: &TcpStream, wait: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + wait;
    let mut b = [0u8; 4];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tcp.set_read_timeout(None)?;
            return Ok(false);
        }
        tcp.set_read_timeout(Some(left))?;
        match tcp.peek(&mut b) {
            Ok(0) => return Ok(false),
            Ok(n) if b[..n] != EYECATCHER_SMCR[..n] => return Ok(false),
            Ok(4) => return Ok(true),
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
