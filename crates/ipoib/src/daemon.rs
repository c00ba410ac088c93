//! The IPoIB link daemon: a TUN device on one side, a [`Node`] (the link machine on a UD QP
//! of a verbs device and, in connected mode, its RC connections) on the other. The TUN's
//! MTU is the interface MTU: 65,520 in connected mode (RFC 4755 §5; datagram-only peers
//! get the UD MTU per destination through the ICMP "fragmentation needed" / "packet too
//! big" the link machine hands the kernel), the UD MTU in datagram mode. One thread reads the TUN and hands packets over a
//! channel; the main loop feeds them to the node, polls the UD QP, runs the timers, writes
//! what the node returns into the TUN and, every second, the neighbour table into a status
//! file that `softrdma ipoib show` reads (one file per network namespace and device).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::link::Mode;
use crate::node::{Node, NodeError, NodeOptions};
use crate::tun::Tun;

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

fn reader(mut f: File, tx: std::sync::mpsc::SyncSender<Vec<u8>>, stop: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        match f.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!(error = %e, "TUN read failed");
                return;
            }
        }
    }
}

/// Brings the interface up on `dev` and runs until `stop` is set.
pub fn run(device: &verbs::Device, cfg: &DaemonConfig, stop: Arc<AtomicBool>) -> Result<(), DaemonError> {
    let mut node = Node::open_with(device, &cfg.node_options())?;
    let tun = Tun::open(&cfg.dev)?;
    let mut addrs: Vec<String> = cfg.ipv4.iter().map(|(a, p)| format!("{a}/{p}")).collect();
    addrs.push(format!("{}/64", node.link().link_local()));
    addrs.extend(cfg.ipv6.iter().map(|a| format!("{a}/64")));
    tun.configure(node.if_mtu(), &addrs)?;
    info!(dev = tun.name(), lla = %node.link().local_addr(), mode = ?cfg.mode, mtu = node.if_mtu(), "IPoIB interface up");
    let (tx, rx): (_, Receiver<Vec<u8>>) = sync_channel(1024);
    let rfile = tun.try_clone()?;
    let rstop = stop.clone();
    std::thread::Builder::new()
        .name("softrdma-ipoib-tun".into())
        .spawn(move || reader(rfile, tx, rstop))?;
    let mut out = tun.file().try_clone()?;
    let path = status_path(&cfg.dev);
    let mut last_status = Instant::now() - Duration::from_secs(2);
    while !stop.load(Ordering::Relaxed) {
        // At most 32 packets from the kernel per turn, so receives are polled in between.
        for _ in 0..32 {
            match rx.try_recv() {
                Ok(p) => node.from_kernel(p)?,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Ok(()),
            }
        }
        let got = match node.poll(Duration::from_millis(1)) {
            Ok(g) => g,
            Err(NodeError::QpError) => {
                // The QP is gone (CQ overflow, say): a new one, a new QPN; the gratuitous
                // ARP of the new node tells the neighbours.
                warn!("UD QP in error state: reopening the IPoIB node");
                node = Node::open_with(device, &cfg.node_options())?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for p in got {
            if let Err(e) = out.write_all(&p) {
                warn!(error = %e, "TUN write failed");
            }
        }
        if last_status.elapsed() >= Duration::from_secs(1) {
            last_status = Instant::now();
            let _ = std::fs::write(&path, status_text(&node, device));
        }
    }
    let _ = node.shutdown();
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// `show neigh` and `show conn` as text (the status file's content), and the device's UD
/// counters (`show counters`).
pub fn status_text(node: &Node, device: &verbs::Device) -> String {
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
    for c in device.hw_counters().into_iter().filter(|c| c.name.starts_with("ud_")) {
        s += &format!("counters {} {}\n", c.name, c.value);
    }
    let rc = node.rc_counters();
    s += &format!(
        "counters ipoib_rc_sent {}\ncounters ipoib_rc_received {}\ncounters ipoib_rc_dropped {}\n\
         counters ipoib_rc_connected {}\ncounters ipoib_rc_closed {}\n",
        rc.sent, rc.received, rc.dropped, rc.connected, rc.closed
    );
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
