//! The IPoIB link daemon: a TUN device on one side, a [`Node`] (the link machine on a UD QP
//! of a verbs device and, in connected mode, its RC connections) on the other. The TUN's
//! MTU is the interface MTU: 65,520 in connected mode (RFC 4755 §5; datagram-only peers
//! get the UD MTU per destination through the ICMP "fragmentation needed" / "packet too
//! big" the link machine hands the kernel), the UD MTU in datagram mode. One thread (see
//! [`run`]) reads the TUN into the node's send buffers, serves the completions (writing
//! received IP packets into the TUN from their receive buffers), runs the timers and,
//! every second, writes the neighbour table into a status file that `softrdma ipoib show`
//! reads (one file per network namespace and device).

use std::fs::File;
use std::future::Future;
use std::io::{IoSlice, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::link::Mode;
use crate::node::{KernelIo, Node, NodeError, NodeOptions, RxCsum};
use crate::tun::Tun;
use crate::wire::offload::VnetHdr;

/// The daemon could not start or stopped on an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The TUN device or its configuration failed.
    #[error("TUN device: {0}")]
    Tun(#[from] std::io::Error),
    /// The IPoIB node failed.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// What to bring up.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// TUN interface name (`ib0`).
    pub dev: String,
    /// P_Key.
    pub pkey: u16,
    /// IPv4 addresses with prefix lengths.
    pub ipv4: Vec<(Ipv4Addr, u8)>,
    /// Global IPv6 addresses (/64).
    pub ipv6: Vec<Ipv6Addr>,
    /// Datagram or connected mode.
    pub mode: Mode,
    /// Idle time after which a connection is torn down (the link default, 120 s, if
    /// `None`).
    pub conn_idle: Option<Duration>,
    /// Gratuitous ARP when the node opens (`NodeOptions::announce`).
    pub announce: bool,
}

impl DaemonConfig {
    fn node_options(&self) -> NodeOptions {
        NodeOptions {
            mode: self.mode,
            pkey: self.pkey,
            ipv4: self.ipv4.clone(),
            ipv6: self.ipv6.clone(),
            conn_idle: self.conn_idle,
            announce: self.announce,
        }
    }
}

/// The status file of `dev` in this process's network namespace.
pub fn status_path(dev: &str) -> PathBuf {
    let ns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| {
            p.to_string_lossy()
                .chars()
                .filter(char::is_ascii_digit)
                .collect::<String>()
        })
        .unwrap_or_default();
    PathBuf::from(format!("/run/softrdma-ipoib-{ns}-{dev}"))
}

/// Replaces the status file `path` in one step: the text goes to `path.tmp` beside it, which
/// is then renamed over it. A reader (`softrdma ipoib show`) sees the old file or the new one,
/// never the empty or half-written file `fs::write` leaves between its truncation and its
/// write (the netns tests read `[]` from `show neigh --json` that way on a loaded machine).
fn write_status(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The TUN as the node's kernel side: non-blocking reads into the node's send buffers,
/// writes of whole packets (with the `virtio_net_hdr` in front, from its own slice, if the
/// TUN offloads checksums).
struct TunIo<'a> {
    file: &'a File,
    vnet_hdr: bool,
    /// System calls on the TUN (reads that returned a packet, writes).
    reads: u64,
    writes: u64,
}

impl KernelIo for TunIo<'_> {
    fn read_packet(&mut self, mr: &verbs::MemoryRegion, off: usize, max: usize) -> std::io::Result<Option<usize>> {
        let r = crate::sys::read_into(self.file, mr, off, max)?;
        self.reads += u64::from(r.is_some());
        Ok(r)
    }

    fn write_packet(&mut self, pkt: &[u8]) {
        self.write_packet_csum(pkt, RxCsum::Unchecked);
    }

    fn offload(&self) -> bool {
        self.vnet_hdr
    }

    fn write_packet_csum(&mut self, pkt: &[u8], csum: RxCsum) {
        self.writes += 1;
        let mut f = self.file;
        let r = if self.vnet_hdr {
            let h = match csum {
                RxCsum::Unchecked => VnetHdr::plain(),
                RxCsum::Partial { start, offset } => VnetHdr::partial(start, offset),
            };
            // One writev: the header and the packet from where it lies.
            f.write_vectored(&[IoSlice::new(&h.to_bytes()), IoSlice::new(pkt)])
        } else {
            f.write(pkt)
        };
        if let Err(e) = r {
            // A full TUN queue or the interface going down: the packet is lost, as on a
            // real link.
            debug!(error = %e, "TUN write failed");
        }
    }
}

/// What the daemon's loop counted (the `ipoib_tun_*` and `ipoib_sleeps` counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DaemonStats {
    /// TUN reads that returned a packet.
    pub tun_reads: u64,
    /// TUN writes.
    pub tun_writes: u64,
    /// Times the loop slept in `poll(2)` (nothing to read, no completion).
    pub sleeps: u64,
}

/// Wakes the daemon's `poll(2)` through an eventfd when a completion arrives while it
/// sleeps (the CQ's async waker).
struct EventWaker(File);

impl Wake for EventWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }
}

/// Packets read from the TUN per turn at most, so receives are served in between.
const TUN_BATCH: usize = 64;
/// The longest sleep: CM requests, connect outcomes and the link timers are looked at
/// least this often.
const IDLE_POLL_MS: i32 = 1;

/// Brings the interface up on `dev` and runs until `stop` is set.
///
/// One thread: it reads packets from the non-blocking TUN into the node's send buffers
/// while one is free, serves completions (RC receives go into the TUN from their buffers),
/// and when neither has work sleeps in `poll(2)` on the TUN and an eventfd the CQ's waker
/// signals, at most [`IDLE_POLL_MS`].
pub fn run(device: &verbs::Device, cfg: &DaemonConfig, stop: Arc<AtomicBool>) -> Result<(), DaemonError> {
    let mut node = Node::open_with(device, &cfg.node_options())?;
    let tun = match Tun::open_offload(&cfg.dev) {
        Ok(t) => t,
        Err(e) => {
            warn!(error = %e, "TUN without checksum offload");
            Tun::open(&cfg.dev)?
        }
    };
    node.enable_csum_offload(tun.vnet_hdr());
    let mut addrs: Vec<String> = cfg.ipv4.iter().map(|(a, p)| format!("{a}/{p}")).collect();
    addrs.push(format!("{}/64", node.link().link_local()));
    addrs.extend(cfg.ipv6.iter().map(|a| format!("{a}/64")));
    tun.configure(node.if_mtu(), &addrs)?;
    info!(dev = tun.name(), lla = %node.link().local_addr(), mode = ?cfg.mode, mtu = node.if_mtu(), "IPoIB interface up");
    tun.set_nonblocking()?;
    let file = tun.file();
    let mut io = TunIo {
        file,
        vnet_hdr: tun.vnet_hdr(),
        reads: 0,
        writes: 0,
    };
    let efd = Arc::new(EventWaker(crate::sys::eventfd()?));
    let waker = Waker::from(efd.clone());
    let mut cx = Context::from_waker(&waker);
    let path = status_path(&cfg.dev);
    let mut last_status = Instant::now() - Duration::from_secs(2);
    let mut sleeps = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut busy = false;
        for _ in 0..TUN_BATCH {
            match node.read_kernel(&mut io) {
                Ok(true) => busy = true,
                Ok(false) => break,
                Err(NodeError::Kernel(e)) => {
                    warn!(error = %e, "TUN read failed");
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
        }
        match node.service(&mut io) {
            Ok(any) => busy |= any,
            Err(NodeError::QpError) => {
                // The QP is gone (CQ overflow, say): a new one, a new QPN; the gratuitous
                // ARP of the new node tells the neighbours.
                warn!("UD QP in error state: reopening the IPoIB node");
                node = Node::open_with(device, &cfg.node_options())?;
                node.enable_csum_offload(tun.vnet_hdr());
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        if last_status.elapsed() >= Duration::from_secs(1) {
            last_status = Instant::now();
            let stats = DaemonStats {
                tun_reads: io.reads,
                tun_writes: io.writes,
                sleeps,
            };
            let _ = write_status(&path, &status_text(&node, device, &stats));
        }
        if busy {
            continue;
        }
        // Nothing to do: ask the CQ to signal the eventfd on its next completion (or take
        // one that came meanwhile), then sleep on the TUN (if a send buffer is free) and
        // the eventfd.
        let cq = node.cq().clone();
        let mut next = std::pin::pin!(cq.next_async());
        if let Poll::Ready(wc) = next.as_mut().poll(&mut cx) {
            if let Err(e) = node.on_completion(wc, &mut io) {
                if matches!(e, NodeError::QpError) {
                    continue; // reopened by `service` on the next turn
                }
                return Err(e.into());
            }
            continue;
        }
        let tun_fd = node.can_read_kernel().then_some(file);
        sleeps += 1;
        let ready = crate::sys::poll_readable([tun_fd, Some(&efd.0)], IDLE_POLL_MS)?;
        if ready[1] {
            let mut b = [0u8; 8];
            let _ = (&efd.0).read(&mut b);
        }
    }
    let _ = node.shutdown();
    let _ = std::fs::remove_file(&path);
    debug!(tun_reads = io.reads, tun_writes = io.writes, "IPoIB interface down");
    Ok(())
}

/// `show neigh` and `show conn` as text (the status file's content), and the device's UD
/// counters, the link's and the daemon's (`show counters`).
pub fn status_text(node: &Node, device: &verbs::Device, stats: &DaemonStats) -> String {
    let now = node.now();
    let l = node.link();
    let mode = match l.config().mode {
        Mode::Connected => "connected",
        Mode::Datagram => "datagram",
    };
    let mut s = format!(
        "lla {} mode {mode} mtu {} ud_mtu {}\n",
        l.local_addr(),
        node.if_mtu(),
        l.config().ud_mtu
    );
    for n in l.neighbours(now) {
        let lla = n.lla.map(|a| a.to_string()).unwrap_or_else(|| "-".into());
        let via = n.conn.map(|c| format!("rc {}", c.0)).unwrap_or_else(|| "ud".into());
        s += &format!(
            "neigh {} lladdr {} {} mtu {} via {} queued {}\n",
            n.ip, lla, n.state, n.mtu, via, n.queued
        );
    }
    for c in device.hw_counters() {
        // The UD counters under their own names, the device's others (RC retransmissions,
        // RNR NAKs, system calls) with `dev_` in front.
        let pre = if c.name.starts_with("ud_") { "" } else { "dev_" };
        s += &format!("counters {pre}{} {}\n", c.name, c.value);
    }
    let rc = node.rc_counters();
    s += &format!(
        "counters ipoib_rc_sent {}\ncounters ipoib_rc_received {}\ncounters ipoib_rc_dropped {}\n\
         counters ipoib_rc_connected {}\ncounters ipoib_rc_closed {}\n",
        rc.sent, rc.received, rc.dropped, rc.connected, rc.closed
    );
    let p = node.path_counters();
    for (name, v) in [
        ("tx_in_place", p.tx_in_place),
        ("tx_copied", p.tx_copied),
        ("rx_in_place", p.rx_in_place),
        ("rx_copied", p.rx_copied),
        ("tx_csum_partial", p.tx_csum_partial),
        ("tx_csum_filled", p.tx_csum_filled),
        ("tx_csum_pseudo", p.tx_csum_pseudo),
        ("rx_csum_partial", p.rx_csum_partial),
        ("tx_bad_offload", p.tx_bad_offload),
        ("tun_reads", stats.tun_reads),
        ("tun_writes", stats.tun_writes),
        ("sleeps", stats.sleeps),
    ] {
        s += &format!("counters ipoib_{name} {v}\n");
    }
    let k = l.counters();
    for (name, v) in [
        ("bad_encap", k.bad_encap),
        ("malformed_arp", k.malformed_arp),
        ("spoofed_arp_nd", k.spoofed_arp_nd),
        ("malformed_nd", k.malformed_nd),
        ("malformed_ip", k.malformed_ip),
        ("oversize", k.oversize),
        ("arp_nd_on_rc", k.arp_nd_on_rc),
        ("req_rejected", k.req_rejected),
        ("rep_refused", k.rep_refused),
    ] {
        s += &format!("counters ipoib_{name} {v}\n");
    }
    for c in l.connections(now) {
        s += &format!(
            "conn {} peer {} {:?} {:?} mtu {} idle {}s\n",
            c.conn.0,
            c.peer,
            c.role,
            c.state,
            c.mtu,
            c.idle.as_secs()
        );
    }
    s
}
