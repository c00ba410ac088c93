//! Where the `softrdma` binary chooses a device: the one module that names
//! provider crates. Every command asks [`open`] for a device with the
//! [`DeviceArgs`] it flattens into its options (`--provider`, `--device`,
//! `--dev-opt`) and the provider-specific flags it offers ([`Flag`], such as
//! iWARP's `--crc`), and says where the device will talk from ([`Endpoint`]).
//! Settings travel as [`DeviceOptions`] text that the provider itself parses, so
//! no command (and no upper layer) depends on a provider's types
//! (`tests/layering.rs` checks this).
//!
//! A flag is handed to the provider only if the provider lists its key among its
//! parameters (`softrdma devices --json` shows them); otherwise the command is
//! refused with the flag's name and the providers that take it, so `--crc` on
//! `--provider roce` says that MPA CRC is an iWARP setting instead of being
//! ignored.
//!
//! ## The local address of a device
//!
//! A provider whose devices bind an IP address (it takes an `addr` parameter:
//! RoCEv2, whose device is a UDP socket on port 4791) gets one from the
//! command's role unless `--dev-opt addr=...` gives it: a listener's device
//! binds the listening address; a connecting side's device takes the source
//! address the routing table picks for the destination (rdma_cm's
//! `rdma_resolve_addr` does the same), found by `connect`ing a UDP socket and
//! reading its local address, or the client's explicit source (`rping -I`).
//! Two processes cannot bind the same address and port, so when the
//! destination is on loopback and the routing table's choice is taken (the
//! server on `127.0.0.1` holds `127.0.0.1:4791`) the device takes the next free
//! address of 127.0.0.0/8 after the destination, which is as local as the
//! first. This is why `softrdma rping --provider roce -s -a 127.0.0.1` and
//! `softrdma rping --provider roce -c -a 127.0.0.1` work side by side.

use anyhow::{Result, anyhow, bail};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use verbs::{Device, DeviceFactory, DeviceOptions, Registry};

/// The providers this build offers, in the order `softrdma devices` lists them.
/// The first is the default.
pub fn registry() -> Registry {
    Registry::new()
        .with(Arc::new(iwarp::IwarpFactory))
        .with(Arc::new(roce::RoceFactory))
}

/// How a command chooses its device: flattened into the command's options.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// The RDMA provider: iwarp (RDMAP/DDP/MPA over TCP, the default) or roce (RoCEv2: the
    /// InfiniBand transport over UDP port 4791). `softrdma devices` lists what this build has.
    #[arg(long, value_name = "PROVIDER", global = true)]
    pub provider: Option<String>,
    /// The device, by name (`softrdma devices`); default: the provider's device.
    #[arg(long = "device", value_name = "NAME", global = true)]
    pub device: Option<String>,
    /// A provider setting as KEY=VALUE, repeatable (`softrdma devices --json` lists each
    /// provider's keys, e.g. roce's mtu=1024 or addr=127.0.0.5).
    #[arg(long = "dev-opt", value_name = "KEY=VALUE", global = true)]
    pub dev_opts: Vec<String>,
}

/// A provider-specific command-line flag and the provider parameter it sets.
#[derive(Debug, Clone)]
pub struct Flag {
    /// The flag as the user typed it, for errors (`--crc`).
    pub flag: &'static str,
    /// The provider parameter (`crc`).
    pub key: &'static str,
    /// Its value.
    pub value: String,
}

impl Flag {
    /// `flag` sets parameter `key` to `value`.
    pub fn new(flag: &'static str, key: &'static str, value: impl ToString) -> Self {
        Flag {
            flag,
            key,
            value: value.to_string(),
        }
    }
    /// iWARP's `--crc on|off` when given.
    pub fn crc(value: Option<&str>) -> Option<Self> {
        value.map(|v| Flag::new("--crc", "crc", v))
    }
}

/// Where the device will talk from, which decides its local address (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// No connection (`info`), or one whose address the provider chooses.
    Any,
    /// The device listens on this address (unspecified: the provider's default).
    Listen(IpAddr),
    /// The device connects to `dest`, from `source` when given (else the route's source).
    Connect {
        /// The peer.
        dest: IpAddr,
        /// The explicit local address (`rping -I`).
        source: Option<IpAddr>,
    },
    /// Both ends of a loopback run in this process (`bench`): the listener's address; this
    /// is the device of the connecting side, which (when the provider binds an address)
    /// takes the first free loopback address after the listener's, so that a run stays
    /// inside the addresses it was given. Use `Listen(server)` for the listener's device.
    LoopbackClient(IpAddr),
}

/// The provider `args` chooses (by `--device`, then `--provider`, else the first).
fn factory<'r>(reg: &'r Registry, args: &DeviceArgs) -> Result<&'r Arc<dyn DeviceFactory>> {
    let known = || reg.list().iter().map(|i| i.provider).collect::<Vec<_>>().join(", ");
    let by_provider = match &args.provider {
        Some(p) => Some(
            reg.list()
                .into_iter()
                .position(|i| i.provider == p.as_str())
                .ok_or_else(|| anyhow!("no provider {p:?} in this build (it has: {})", known()))?,
        ),
        None => None,
    };
    let f = match (&args.device, by_provider) {
        (Some(d), p) => {
            let f = reg.find(d).map_err(|e| anyhow!("{e} (see `softrdma devices`)"))?;
            if let Some(p) = p {
                let want = reg.list()[p].provider;
                if f.info().provider != want {
                    bail!(
                        "device {d} belongs to the {} provider, not {want}: drop --provider or pick a device of the {want} provider (see `softrdma devices`)",
                        f.info().provider
                    );
                }
            }
            f
        }
        (None, Some(p)) => reg.find(reg.list()[p].provider)?,
        (None, None) => reg.find(
            reg.list()
                .first()
                .ok_or_else(|| anyhow!("this build offers no RDMA provider"))?
                .provider,
        )?,
    };
    Ok(f)
}

/// The device options `args` and `flags` give for provider `f`, refusing flags it does not take.
pub fn options(reg: &Registry, f: &dyn DeviceFactory, args: &DeviceArgs, flags: &[Flag]) -> Result<DeviceOptions> {
    let info = f.info();
    let mut opts = DeviceOptions::new();
    for pair in &args.dev_opts {
        opts.set_pair(pair)?;
    }
    for fl in flags {
        if !info.params.iter().any(|p| p.name == fl.key) {
            let takers: Vec<_> = reg
                .list()
                .into_iter()
                .filter(|i| i.params.iter().any(|p| p.name == fl.key))
                .map(|i| i.provider)
                .collect();
            let owner = if takers.is_empty() {
                String::new()
            } else {
                format!(" is a setting of the {} provider and", takers.join(", "))
            };
            let theirs: Vec<_> = info.params.iter().map(|p| p.name).collect();
            bail!(
                "{}{owner} does not apply to the {} provider ({}, device {}); its settings are {} (--dev-opt KEY=VALUE)",
                fl.flag,
                info.provider,
                info.transport.as_str(),
                info.device,
                theirs.join(", ")
            );
        }
        opts.set(fl.key, &fl.value);
    }
    Ok(opts)
}

/// The source address the routing table picks to reach `dest` (rdma_resolve_addr's choice).
pub fn route_source(dest: IpAddr) -> Result<IpAddr> {
    let any: SocketAddr = match dest {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any)?;
    // A UDP connect sends nothing: it only asks the kernel for the route.
    s.connect(SocketAddr::new(dest, 9))
        .map_err(|e| anyhow!("no route to {dest}: {e}"))?;
    Ok(s.local_addr()?.ip())
}

/// Other loopback addresses to try when the route's source is taken: the ones after `dest`.
fn loopback_alternatives(dest: IpAddr) -> Vec<IpAddr> {
    match dest {
        IpAddr::V4(v4) if v4.is_loopback() => {
            let base = u32::from(v4);
            (1..=32u32)
                .map(|i| Ipv4Addr::from(0x7f00_0000 | (base.wrapping_add(i) & 0x00ff_ffff)))
                .filter(|a| a.octets()[3] != 0 && a.octets()[3] != 255)
                .map(IpAddr::V4)
                .collect()
        }
        _ => Vec::new(),
    }
}

fn addr_in_use(e: &verbs::Error) -> bool {
    matches!(e, verbs::Error::Io(io) if io.kind() == std::io::ErrorKind::AddrInUse)
}

/// The transport of the device `args` chooses (perftest's `send_rcredit` is iWARP-only).
pub fn transport_of(args: &DeviceArgs) -> Result<verbs::Transport> {
    let reg = registry();
    Ok(factory(&reg, args)?.info().transport)
}

/// Opens the device `args` chooses, with `flags`, for a device at `at`.
pub fn open(args: &DeviceArgs, flags: &[Flag], at: Endpoint) -> Result<Device> {
    let reg = registry();
    let f = factory(&reg, args)?;
    let mut opts = options(&reg, f.as_ref(), args, flags)?;
    let binds = f.info().params.iter().any(|p| p.name == "addr");
    if !binds || opts.get("addr").is_some() {
        return Ok(f.open(&opts)?);
    }
    let (first, fallback) = match at {
        Endpoint::Any => (None, Vec::new()),
        Endpoint::Listen(ip) => (Some(ip).filter(|ip| !ip.is_unspecified()), Vec::new()),
        Endpoint::Connect { dest, source: Some(s) } => {
            let _ = dest;
            (Some(s), Vec::new())
        }
        Endpoint::Connect { dest, source: None } => (Some(route_source(dest)?), loopback_alternatives(dest)),
        Endpoint::LoopbackClient(dest) => {
            let mut alts = loopback_alternatives(dest);
            if alts.is_empty() {
                bail!("a loopback run needs a 127.0.0.0/8 address, not {dest}");
            }
            (Some(alts.remove(0)), alts)
        }
    };
    let Some(first) = first else {
        return Ok(f.open(&opts)?);
    };
    opts.set("addr", first);
    let err = match f.open(&opts) {
        Ok(d) => return Ok(d),
        Err(e) if addr_in_use(&e) && !fallback.is_empty() => e,
        Err(e) => return Err(anyhow!("opening {} at {first}: {e}", f.info().device)),
    };
    for alt in fallback {
        opts.set("addr", alt);
        match f.open(&opts) {
            Ok(d) => {
                tracing::debug!(taken = %first, using = %alt, "the route's source address is taken; the device binds another loopback address");
                return Ok(d);
            }
            Err(e) if addr_in_use(&e) => continue,
            Err(e) => return Err(anyhow!("opening {} at {alt}: {e}", f.info().device)),
        }
    }
    Err(anyhow!(
        "opening {} at {first}: {err} (and the next loopback addresses are taken too; give one with --dev-opt addr=...)",
        f.info().device
    ))
}

/// The registry's entry for `dev` (by device name), if the device kept its default name.
fn entry_of(dev: &Device) -> Option<verbs::ProviderInfo> {
    registry().list().into_iter().find(|i| i.device == dev.name())
}

/// rdma-core's transport name of `dev` ("iWARP", "InfiniBand"), for headers.
pub fn transport(dev: &Device) -> &'static str {
    // A device renamed with --dev-opt name=... is not in the list by name.
    entry_of(dev).map_or("RDMA", |i| i.transport.as_str())
}

/// One line on what `dev` runs, for headers: "iWARP: RDMAP ... over kernel TCP".
pub fn label(dev: &Device) -> String {
    match entry_of(dev) {
        Some(i) => format!("{}: {}", i.provider, i.description),
        None => transport(dev).to_string(),
    }
}

/// The device's hardware counters by name, as rxe's `hw_counters` (empty when the provider
/// keeps none).
pub fn hw_counters(dev: &Device) -> Vec<(String, u64)> {
    dev.hw_counters()
        .into_iter()
        .map(|c| (c.name.to_string(), c.value))
        .collect()
}

/// Checks the device choice and flags without opening a device (an early error for a
/// command that talks to the network before it opens its device).
pub fn check(args: &DeviceArgs, flags: &[Flag]) -> Result<()> {
    let reg = registry();
    let f = factory(&reg, args)?;
    options(&reg, f.as_ref(), args, flags).map(|_| ())
}

/// The provider `args` chooses, for `info`.
pub fn chosen(args: &DeviceArgs) -> Result<(Registry, verbs::ProviderInfo)> {
    let reg = registry();
    let info = factory(&reg, args)?.info();
    Ok((reg, info))
}

/// The effective configuration `args` and `flags` give (`softrdma info`).
pub fn describe(args: &DeviceArgs, flags: &[Flag]) -> Result<Vec<verbs::ConfigItem>> {
    let reg = registry();
    let f = factory(&reg, args)?;
    let opts = options(&reg, f.as_ref(), args, flags)?;
    Ok(f.describe(&opts)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_source_of_loopback_is_loopback() {
        let s = route_source("127.0.31.7".parse().unwrap()).unwrap();
        assert!(s.is_loopback(), "{s}");
    }

    #[test]
    fn loopback_alternatives_follow_the_destination() {
        let v = loopback_alternatives("127.0.0.1".parse().unwrap());
        assert_eq!(v[0], "127.0.0.2".parse::<IpAddr>().unwrap());
        assert!(v.iter().all(|a| a.is_loopback()));
        assert!(loopback_alternatives("10.0.0.1".parse().unwrap()).is_empty());
        // wraps inside 127.0.0.0/8 and skips .0 and .255
        let w = loopback_alternatives("127.255.255.254".parse().unwrap());
        assert!(
            w.iter().all(|a| a.is_loopback() && !a.to_string().ends_with(".255")),
            "{w:?}"
        );
    }

    #[test]
    fn a_flag_the_provider_does_not_take_is_refused_by_name() {
        let reg = registry();
        let f = reg.find("iwarp").unwrap();
        let args = DeviceArgs::default();
        let err = options(&reg, f.as_ref(), &args, &[Flag::new("--frobnicate", "frobnicate", 1)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--frobnicate") && err.contains("iwarp"), "{err}");
        let ok = options(&reg, f.as_ref(), &args, &[Flag::crc(Some("on")).unwrap()]).unwrap();
        assert_eq!(ok.get("crc"), Some("on"));
    }

    #[test]
    fn unknown_provider_and_mismatched_device_are_refused() {
        let reg = registry();
        let a = DeviceArgs {
            provider: Some("ib".into()),
            ..Default::default()
        };
        let e = factory(&reg, &a).err().unwrap().to_string();
        assert!(e.contains("\"ib\"") && e.contains("iwarp"), "{e}");
        let a = DeviceArgs {
            device: Some("mlx5_0".into()),
            ..Default::default()
        };
        assert!(factory(&reg, &a).is_err());
        let a = DeviceArgs {
            device: Some("rxe_soft0".into()),
            provider: Some("iwarp".into()),
            ..Default::default()
        };
        let e = factory(&reg, &a).err().unwrap().to_string();
        assert!(e.contains("roce provider, not iwarp"), "{e}");
    }

    fn roce() -> DeviceArgs {
        DeviceArgs {
            provider: Some("roce".into()),
            ..Default::default()
        }
    }

    fn gid0(d: &Device) -> verbs::Gid {
        d.query_gid(1, 0).unwrap()
    }

    /// Issue 13 point 6: iWARP's --crc is refused on RoCE by name, before any device opens.
    #[test]
    fn crc_is_refused_on_roce() {
        let e = open(&roce(), &[Flag::crc(Some("on")).unwrap()], Endpoint::Any)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--crc") && e.contains("iwarp provider") && e.contains("roce"),
            "{e}"
        );
    }

    /// A listener's RoCE device binds the listening address (GID 0 is that address).
    #[test]
    fn roce_listener_binds_its_address() {
        let ip: IpAddr = "127.0.63.1".parse().unwrap();
        let d = open(&roce(), &[], Endpoint::Listen(ip)).unwrap();
        assert_eq!(gid0(&d), verbs::Gid::from_ip(ip));
    }

    /// A connecting RoCE device takes the route's source (127.0.0.1 for loopback) and, when
    /// that is taken (here: held by this test, or by anyone else), the next loopback address
    /// after the destination; a loopback run's client starts after the server's address.
    #[test]
    fn roce_client_takes_the_routes_source_or_the_next_free_loopback_address() {
        // Hold 127.0.0.1:4791 if nobody does; either way the device cannot have it.
        let _hold = UdpSocket::bind("127.0.0.1:4791");
        let dest: IpAddr = "127.0.64.1".parse().unwrap();
        let d = open(&roce(), &[], Endpoint::Connect { dest, source: None }).unwrap();
        let g = gid0(&d);
        assert_ne!(g, verbs::Gid::from_ip("127.0.0.1".parse().unwrap()));
        assert!(
            loopback_alternatives(dest).iter().any(|a| verbs::Gid::from_ip(*a) == g),
            "{g}"
        );
        // The explicit source wins (rping -I).
        let src: IpAddr = "127.0.64.200".parse().unwrap();
        let d2 = open(
            &roce(),
            &[],
            Endpoint::Connect {
                dest,
                source: Some(src),
            },
        )
        .unwrap();
        assert_eq!(gid0(&d2), verbs::Gid::from_ip(src));
        // Loopback run: server on .65.1, client on .65.2 (or later, if taken).
        let srv: IpAddr = "127.0.65.1".parse().unwrap();
        let s = open(&roce(), &[], Endpoint::Listen(srv)).unwrap();
        let c = open(&roce(), &[], Endpoint::LoopbackClient(srv)).unwrap();
        assert_eq!(gid0(&s), verbs::Gid::from_ip(srv));
        assert_eq!(gid0(&c), verbs::Gid::from_ip("127.0.65.2".parse().unwrap()));
    }
}
