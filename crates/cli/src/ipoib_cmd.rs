//! `softrdma ipoib`: an IP interface whose link is the RDMA fabric (issue 16).
//!
//! - `up --dev ib0 --mode datagram --underlay IF [--pkey 0xffff] [--addr A/P]...`: opens a
//!   RoCEv2 device on the underlay interface's IPv4 address, creates the TUN device, gives
//!   it the RFC 4391 link-local address (and `--addr`s), and runs the IPoIB link daemon
//!   (`ipoib::daemon`) in the foreground until killed.
//! - `show neigh|conn|counters [--dev ib0] [--json]`: the running daemon's neighbour table /
//!   connections / UD counters in
//!   this network namespace (from its status file, refreshed every second).
//!
//! `--mode connected` (RFC 4755): the interface MTU is 65,520, unicast to connected-mode
//! peers goes over RC connections the device's IB CM sets up on the IPoIB-CM service IDs,
//! datagram-only peers are reached over UD at their MTU; `--idle SECS` sets the idle
//! teardown of connections.
//!
//! `--icrc-rx udp|raw|auto` (udp by default) is the device's `icrc_rx`: with udp its UDP
//! socket takes GSO trains whole (`UDP_GRO`), so a 64 KiB RC message is received as two
//! datagrams rather than sixteen (docs/ipoib.md, "Session 13").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use clap::{Args as ClapArgs, Subcommand, ValueEnum};
use verbs::DeviceOptions;

/// `softrdma ipoib ...`.
#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: IpoibCmd,
}

#[derive(Subcommand)]
enum IpoibCmd {
    /// Bring an IPoIB interface up and run its link daemon in the foreground.
    Up(UpArgs),
    /// Print the running daemon's neighbour table or connections.
    Show {
        /// What to print.
        what: ShowWhat,
        /// The IPoIB interface.
        #[arg(long, default_value = "ib0")]
        dev: String,
        /// Print JSON (an array of objects for neigh and conn, an object for counters).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum ShowWhat {
    /// IP → IPoIB link address, state, MTU (like `ip neigh`).
    Neigh,
    /// RC connections (like the kernel's ipoib debugfs).
    Conn,
    /// The RoCE device's UD counters (sent, received, dropped and why).
    Counters,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum ModeArg {
    /// RFC 4391 only: UD queue pairs.
    Datagram,
    /// RFC 4755: RC connections to connected-mode peers, UD to the others.
    Connected,
}

#[derive(ClapArgs)]
struct UpArgs {
    /// Name of the TUN interface to create.
    #[arg(long, default_value = "ib0")]
    dev: String,
    /// datagram or connected.
    #[arg(long, value_enum, default_value = "datagram")]
    mode: ModeArg,
    /// The network interface the RoCEv2 traffic runs on (its first IPv4 address is the
    /// device's GID).
    #[arg(long)]
    underlay: String,
    /// Partition key (the full-membership bit is always set in the MGIDs).
    #[arg(long, default_value = "0xffff", value_parser = parse_pkey)]
    pkey: u16,
    /// An address for the interface, A/P (IPv4 or IPv6); repeatable.
    #[arg(long = "addr")]
    addrs: Vec<String>,
    /// Connected mode: seconds without traffic after which a connection is torn down.
    #[arg(long, default_value = "120")]
    idle: u64,
    /// Testing: send no gratuitous ARP at start, as if it were lost, so peers must notice
    /// a restart by themselves (RC retries, neighbour revalidation).
    #[arg(long)]
    no_announce: bool,
    /// How the RoCEv2 device receives for its ICRC check (the provider's `icrc_rx`): udp
    /// (default: the UDP socket with UDP_GRO, so a 64 KiB RC message arrives as a few GSO
    /// trains in one receive each; IPoIB peers are softrdma nodes, whose IPv4 ID is 0, so
    /// their ICRC is checked in full), raw (a raw socket beside it sees every packet's IP
    /// header: each train is cloned to it and segmented for the UDP socket), auto (raw if
    /// permitted).
    #[arg(long, default_value = "udp", value_parser = ["udp", "raw", "auto"])]
    icrc_rx: String,
}

fn parse_pkey(s: &str) -> std::result::Result<u16, String> {
    let t = s.trim_start_matches("0x").trim_start_matches("0X");
    u16::from_str_radix(t, 16).map_err(|e| format!("P_Key {s}: {e}"))
}

/// The first IPv4 address of `ifname` (from `ip -4 -o addr show dev IF`).
fn underlay_ipv4(ifname: &str) -> Result<Ipv4Addr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", ifname])
        .output()
        .context("running ip(8)")?;
    if !out.status.success() {
        bail!(
            "ip addr show dev {ifname}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == "inet"
            && let Some(a) = words.next()
        {
            return a
                .split('/')
                .next()
                .unwrap_or("")
                .parse()
                .with_context(|| format!("address {a} of {ifname}"));
        }
    }
    bail!("{ifname} has no IPv4 address")
}

/// Runs `softrdma ipoib`.
pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        IpoibCmd::Up(a) => up(a),
        IpoibCmd::Show { what, dev, json } => show(what, &dev, json),
    }
}

fn up(a: UpArgs) -> Result<()> {
    let mut ipv4 = Vec::new();
    let mut ipv6 = Vec::new();
    for s in &a.addrs {
        let (addr, plen) = s.split_once('/').with_context(|| format!("--addr {s}: want A/P"))?;
        let plen: u8 = plen.parse().with_context(|| format!("--addr {s}: prefix length"))?;
        match addr.parse::<IpAddr>().with_context(|| format!("--addr {s}"))? {
            IpAddr::V4(v4) if plen <= 32 => ipv4.push((v4, plen)),
            IpAddr::V6(v6) if plen == 64 => ipv6.push(v6),
            _ => bail!("--addr {s}: IPv4 with a prefix ≤ 32, or IPv6 /64"),
        }
    }
    let local = underlay_ipv4(&a.underlay)?;
    // A 2,048-octet IB MTU gives the RFC 4391 UD MTU of 2,044 (the underlay fragments the
    // RoCEv2 datagrams if its own MTU is smaller). Connected mode opens the device with the
    // largest IB MTU, 4,096, so its RC messages go in half as many packets (the UD MTU
    // stays 2,044: the node clamps it to the broadcast group's).
    let ib_mtu = match a.mode {
        ModeArg::Datagram => "2048",
        ModeArg::Connected => "4096",
    };
    let opts = DeviceOptions::new()
        .with("addr", local.to_string())
        .with("mtu", ib_mtu)
        .with("icrc_rx", a.icrc_rx.clone())
        .with("name", format!("rxe_{}", a.dev));
    // IPoIB is defined on the InfiniBand transport: the RoCEv2 provider, opened by its
    // registry name like every other command's device.
    let device = crate::providers::registry()
        .open("roce", &opts)
        .with_context(|| format!("opening a RoCEv2 device on {local}"))?;
    let cfg = ipoib::daemon::DaemonConfig {
        dev: a.dev,
        pkey: a.pkey,
        ipv4,
        ipv6: ipv6.into_iter().collect::<Vec<Ipv6Addr>>(),
        mode: match a.mode {
            ModeArg::Datagram => ipoib::link::Mode::Datagram,
            ModeArg::Connected => ipoib::link::Mode::Connected,
        },
        conn_idle: Some(std::time::Duration::from_secs(a.idle.max(1))),
        announce: !a.no_announce,
    };
    let stop = Arc::new(AtomicBool::new(false));
    ipoib::daemon::run(&device, &cfg, stop)?;
    Ok(())
}

fn show(what: ShowWhat, dev: &str, json: bool) -> Result<()> {
    let path = ipoib::daemon::status_path(dev);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no IPoIB daemon for {dev} in this network namespace ({})",
            path.display()
        )
    })?;
    let prefix = match what {
        ShowWhat::Neigh => "neigh ",
        ShowWhat::Conn => "conn ",
        ShowWhat::Counters => "counters ",
    };
    let lines: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix(prefix)).collect();
    if !json {
        for l in lines {
            println!("{l}");
        }
        return Ok(());
    }
    let v = match what {
        ShowWhat::Neigh => serde_json::Value::Array(lines.iter().map(|l| neigh_json(l)).collect::<Result<_>>()?),
        ShowWhat::Conn => serde_json::Value::Array(lines.iter().map(|l| conn_json(l)).collect::<Result<_>>()?),
        ShowWhat::Counters => {
            let mut m = serde_json::Map::new();
            for l in lines {
                let (k, v) = l.split_once(' ').with_context(|| format!("counter line {l:?}"))?;
                m.insert(k.to_string(), serde_json::json!(v.trim().parse::<u64>()?));
            }
            serde_json::Value::Object(m)
        }
    };
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// `IP lladdr LLA STATE mtu N via ud|rc ID queued N` (the daemon's status line) as JSON.
fn neigh_json(l: &str) -> Result<serde_json::Value> {
    let w: Vec<&str> = l.split_whitespace().collect();
    let bad = || anyhow::anyhow!("neighbour line {l:?}");
    let at = |k: &str| {
        w.iter()
            .position(|x| *x == k)
            .and_then(|i| w.get(i + 1))
            .copied()
            .ok_or_else(bad)
    };
    let lla = at("lladdr")?;
    let via = at("via")?;
    let conn = match via {
        "rc" => Some(at("rc")?.parse::<u64>()?),
        _ => None,
    };
    Ok(serde_json::json!({
        "ip": w.first().ok_or_else(bad)?,
        "lladdr": if lla == "-" { None } else { Some(lla) },
        "state": w.get(3).ok_or_else(bad)?,
        "mtu": at("mtu")?.parse::<u32>()?,
        "via": via,
        "conn": conn,
        "queued": at("queued")?.parse::<u64>()?,
    }))
}

/// `ID peer LLA ROLE STATE mtu N idle Ns` (the daemon's status line) as JSON.
fn conn_json(l: &str) -> Result<serde_json::Value> {
    let w: Vec<&str> = l.split_whitespace().collect();
    let bad = || anyhow::anyhow!("connection line {l:?}");
    if w.len() != 9 || w[1] != "peer" || w[5] != "mtu" || w[7] != "idle" {
        return Err(bad());
    }
    Ok(serde_json::json!({
        "conn": w[0].parse::<u64>()?,
        "peer": w[2],
        "role": w[3].to_lowercase(),
        "state": w[4].to_lowercase(),
        "mtu": w[6].parse::<u32>()?,
        "idle_s": w[8].trim_end_matches('s').parse::<u64>()?,
    }))
}
