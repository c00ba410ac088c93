//! The QP protocol core in memory, the way quinn-proto tests connections:
//! no socket, no thread, no clock. A [`Side`] is one core ([`Proto`]) with
//! the receive buffer the engine runs ([`RxIo`]: the deframer, the ULPDU
//! entry point and direct placement) and what its application holds (PD,
//! CQ, events). Two sides are wired back to back with [`carry`] and
//! [`settle`] (a lossless TCP stream); a scripted or fuzzed peer feeds one
//! side raw octets with [`Side::feed`] and reads what it queued with
//! [`Side::take_output`].
//!
//! Used by `core_tests.rs` and, with the crate feature `fuzz`, by the fuzz
//! target `qp_core` (`fuzz/README.md`): both drive the functions the engine
//! runs over TCP, only the `read`/`readv`/`writev` calls are replaced.

use super::rx_buf::RxIo;
use super::*;
use std::net::SocketAddr;
use verbs::provider::{DeviceProviderExt, Provider, QpCreate, QpOps};
use verbs::{Device, DeviceAttr, MemoryRegion, ProtectionDomain};

/// A provider with no transport and no connection manager: the cores are
/// made and driven by hand.
struct NoTransport;

impl Provider for NoTransport {
    fn query_device(&self) -> DeviceAttr {
        crate::engine::device_attr()
    }
    fn create_qp(&self, _req: QpCreate) -> Result<Arc<dyn QpOps>> {
        Err(Error::NotSupported("in-memory test device".into()))
    }
}

/// A device whose memory table the cores share, with no transport.
pub fn device() -> Device {
    verbs::provider::new_device("mem0", Arc::new(NoTransport) as Arc<dyn Provider>, None)
}

/// How a [`Side`] is set up: what MPA would have negotiated.
#[derive(Debug, Clone, Copy)]
pub struct SideConfig {
    /// The QP number.
    pub qpn: u32,
    /// MPA CRC on both directions.
    pub crc: bool,
    /// Markers on the octets this side receives (RFC 5044 §5).
    pub markers_rx: bool,
    /// Inbound RDMA Reads/atomics accepted at once (IRD).
    pub ird: u32,
    /// Outbound RDMA Reads/atomics issued at once (ORD).
    pub ord: u32,
    /// Largest ULPDU this side sends.
    pub max_ulpdu: usize,
}

impl Default for SideConfig {
    fn default() -> Self {
        SideConfig {
            qpn: 1,
            crc: false,
            markers_rx: false,
            ird: 16,
            ord: 16,
            max_ulpdu: 65_528,
        }
    }
}

/// One core with what its application holds, and the receive side of the
/// in-memory stream that feeds it.
pub struct Side {
    pub(crate) p: Proto,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) events: Arc<EventQueue<CmEvent>>,
    pub(crate) rx: RxIo,
    /// Octets handed to the receive buffer per step (as one `read` would).
    pub(crate) chunk: usize,
}

impl Side {
    /// A core in RTS whose stream belongs to protection domain `pd`.
    pub fn new(pd: &ProtectionDomain, cfg: SideConfig) -> Side {
        let dev = pd.device();
        let pd = pd.clone();
        let cq = dev.create_cq(4096).expect("a CQ on the in-memory device");
        let events = Arc::new(EventQueue::new());
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("literal address");
        let neg = Negotiated {
            crc: cfg.crc,
            markers_tx: false,
            markers_rx: cfg.markers_rx,
            ird: cfg.ird,
            ord: cfg.ord,
            rtr: None,
            info: ConnInfo {
                local_addr: addr,
                peer_addr: addr,
                responder_resources: cfg.ird,
                initiator_depth: cfg.ord,
                peer_private_data: Vec::new(),
                detail: String::new(),
            },
        };
        let attr = QpInitAttr {
            max_send_wr: 256,
            max_recv_wr: 256,
            ..QpInitAttr::default()
        };
        let p = Proto::new(
            cfg.qpn,
            pd.id(),
            dev.mem_table(),
            cq.clone(),
            cq.clone(),
            events.clone(),
            attr,
            &neg,
            false,
            cfg.max_ulpdu,
        );
        let rx = RxIo::new(
            DeframerConfig {
                crc: cfg.crc,
                markers: cfg.markers_rx,
                ..Default::default()
            },
            &[],
        );
        Side {
            p,
            pd,
            cq,
            events,
            rx,
            chunk: usize::MAX,
        }
    }

    /// Hands at most `n` octets to the receive buffer per step, as a socket
    /// `read` returning short would (direct placement starts when a large
    /// tagged FPDU is cut).
    pub fn set_chunk(&mut self, n: usize) {
        self.chunk = n.max(1);
    }

    /// The side's protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Registers `len` bytes in the side's protection domain.
    pub fn reg_mr(&self, len: usize, access: Access) -> MemoryRegion {
        self.pd.reg_mr(len, access).expect("a region on the in-memory device")
    }

    /// `post_send` on the core.
    pub fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        let r = self.p.post_send(wrs);
        // No transmit pass follows the post here (`take_output` frames later):
        // the post-time resolution ends, as it does after `IwarpQp::with_core`'s pass.
        self.p.expire_posted();
        r
    }

    /// `post_send_owned` on the core (`QueuePair::post_send_one`): a small one-segment
    /// message to an idle queue takes the lean path (`lean.rs`), framed at once.
    pub fn post_send_one(&mut self, wr: SendWr) -> Result<()> {
        let r = self.p.post_send_owned(wr);
        self.p.expire_posted();
        r
    }

    /// `post_recv` on the core.
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        self.p.post_recv(wrs)
    }

    /// The core's QP state.
    pub fn state(&self) -> QpState {
        self.p.state
    }

    /// The next completion, if any.
    pub fn poll_cq(&self) -> Option<WorkCompletion> {
        self.cq.poll_one()
    }

    /// The next connection event, if any.
    pub fn next_event(&self) -> Option<CmEvent> {
        self.events.try_pop()
    }

    /// The octets a peer sent, as the socket would deliver them: into the
    /// receive buffer (or a direct placement's region) and through the
    /// core. Returns whether the core did anything.
    pub fn feed(&mut self, mut input: &[u8]) -> bool {
        let mut any = self.rx.process(&mut self.p);
        while !input.is_empty() && !self.rx.eof {
            let n = self.rx.absorb(&input[..input.len().min(self.chunk)]);
            any |= self.rx.process(&mut self.p);
            if n == 0 {
                // Nothing fits and nothing moved: the stream is stuck
                // (only after a Terminate, when nothing is read any more).
                break;
            }
            input = &input[n..];
        }
        any
    }

    /// The peer closed its side of the stream.
    pub fn feed_eof(&mut self) {
        self.rx.eof = true;
        self.p.on_stream_error(None, "peer closed the connection");
    }

    /// Frames what the core has to send and takes it off its transmit
    /// queue, as a `writev` that took everything.
    pub fn take_output(&mut self) -> Vec<u8> {
        // A lean message first, as `IwarpQp::pump_tx` writes it, taken whole.
        let mut bytes = self.p.lean_bytes().to_vec();
        self.p.lean_written(bytes.len());
        self.p.fill_tx();
        let n = self.p.tx_queue().copy_pending(&mut bytes);
        if n > 0 {
            self.p.consumed_out(n);
        }
        bytes
    }
}

/// Moves what `from` has framed to `to`, as a lossless TCP stream would, and
/// lets `to` process it. Returns whether anything moved.
pub fn carry(from: &mut Side, to: &mut Side) -> bool {
    let bytes = from.take_output();
    to.feed(&bytes) || !bytes.is_empty()
}

/// Runs both directions until neither moves; false if they never settle.
pub fn settle(a: &mut Side, b: &mut Side) -> bool {
    for _ in 0..10_000 {
        let moved = carry(a, b) | carry(b, a);
        if !moved {
            return true;
        }
    }
    false
}

/// A core set up for a scripted or fuzzed peer: receives posted, a region
/// of each kind a tagged segment or Read Request can name, and an RDMA Read
/// and an atomic outstanding (so Read and Atomic Responses have a target).
pub struct Scripted {
    /// The core under test.
    pub side: Side,
    /// STags a peer may name, by index: remote-accessible region, region
    /// without remote rights, region of another PD, the outstanding Read's
    /// sink.
    pub stags: [u32; 4],
    /// The first valid TO of each of `stags`.
    pub bases: [u64; 4],
    _mrs: Vec<MemoryRegion>,
}

impl Scripted {
    /// A core with `cfg` and `recvs` receives posted, set up as above.
    pub fn new(cfg: SideConfig, recvs: usize) -> Scripted {
        let dev = device();
        let pd = dev.alloc_pd().expect("a PD on the in-memory device");
        let mut side = Side::new(&pd, cfg);
        let remote = side.reg_mr(128 * 1024, Access::all_remote() | Access::LOCAL_WRITE);
        let local = side.reg_mr(4096, Access::LOCAL_WRITE);
        let other = dev
            .alloc_pd()
            .expect("a PD on the in-memory device")
            .reg_mr(4096, Access::all_remote())
            .expect("a region on the in-memory device");
        let sink = side.reg_mr(128 * 1024, Access::LOCAL_WRITE);
        let recv = side.reg_mr(256 * recvs.max(1), Access::LOCAL_WRITE);
        let wrs: Vec<_> = (0..recvs)
            .map(|i| RecvWr {
                wr_id: 100 + i as u64,
                sg_list: vec![recv.sge(256 * i, 256)],
            })
            .collect();
        let _ = side.post_recv(&wrs);
        let _ = side.post_send(&[
            SendWr::new(
                1,
                WrOpcode::RdmaRead {
                    remote: verbs::RemoteAddr { addr: 0, rkey: 0x77 },
                },
                vec![sink.sge(0, 128 * 1024)],
            ),
            SendWr::new(
                2,
                WrOpcode::AtomicFetchAdd {
                    remote: verbs::RemoteAddr { addr: 0, rkey: 0x78 },
                    add: 1,
                },
                vec![local.sge(0, 8)],
            ),
        ]);
        // The Read Request and the Atomic Request leave.
        let _ = side.take_output();
        Scripted {
            side,
            stags: [remote.rkey(), local.lkey(), other.rkey(), sink.lkey()],
            bases: [remote.addr(), local.addr(), other.addr(), sink.addr()],
            _mrs: vec![remote, local, other, sink, recv],
        }
    }

    /// Maps small STags (0-3) onto [`Scripted::stags`] and TOs below 2^63
    /// into the named region, in a tagged ULPDU's DDP header and in a Read
    /// Request's source, so that a fuzzer reaches placement.
    pub fn patch(&self, u: &mut [u8]) {
        let at = match u.first() {
            Some(c) if c & 0x80 != 0 => 2,
            // Untagged Read Request (opcode 1): SrcSTag, SrcTO after the
            // 18-octet DDP header and SinkSTag, SinkTO, Size.
            Some(_) if u.get(1).is_some_and(|c| c & 0x0F == op::READ_REQUEST) => 18 + 16,
            _ => return,
        };
        {
            let Some(f) = u.get_mut(at..at + 12) else { return };
            let stag = u32::from_be_bytes([f[0], f[1], f[2], f[3]]);
            let Some(&real) = self.stags.get(stag as usize) else {
                return;
            };
            let mut to = [0u8; 8];
            to.copy_from_slice(&f[4..12]);
            let to = u64::from_be_bytes(to);
            f[..4].copy_from_slice(&real.to_be_bytes());
            if to >> 63 == 0 {
                let to = self.bases[stag as usize].wrapping_add(to & 0x3_FFFF);
                f[4..12].copy_from_slice(&to.to_be_bytes());
            }
        }
    }
}

/// What the core sent, checked against RDMAP-TRM-02 / RDMAP-TRM-06: every
/// FPDU deframes, there is at most one Terminate and nothing after it, and
/// a core that sent one is in ERR. Returns the Terminate's cause.
pub fn check_output(side: &Side, out: &[u8]) -> std::result::Result<Option<TermCause>, String> {
    let mut d = Deframer::new(DeframerConfig {
        crc: side.rx.deframer.config().crc,
        ..Default::default()
    });
    let mut at = 0;
    let mut term = None;
    while at < out.len() {
        let (used, u) = d.next_fpdu(&out[at..]).map_err(|e| format!("our FPDU: {e}"))?;
        if let Some(u) = u {
            if term.is_some() {
                return Err("an FPDU after our Terminate".into());
            }
            if let Ok((_, Message::Terminate(t))) = rdmap::parse_ulpdu(u, &rdmap::Config::RFC7306) {
                term = Some(t.cause);
            }
        }
        if used == 0 {
            break;
        }
        at += used;
    }
    if term.is_some() && side.state() != QpState::Err {
        return Err("a Terminate sent but the QP is not in ERR".into());
    }
    Ok(term)
}
