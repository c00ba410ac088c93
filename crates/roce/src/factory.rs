//! The RoCEv2 provider as the device registry sees it ([`verbs::Registry`]): its settings as
//! `key=value` text, parsed and checked here.

use std::net::IpAddr;

use crate::engine::impair::ImpairConfig;
use crate::engine::{IcrcRx, RoceConfig};
use verbs::{
    ConfigItem, ConfigValue, DeviceFactory, DeviceOptions, InvalidArg, Mtu, ParamInfo, ProviderInfo, Result, Transport,
};

/// Registers as `roce`, opening `rxe_soft0` devices.
#[derive(Debug, Clone, Default)]
pub struct RoceFactory;

impl RoceFactory {
    fn params() -> Vec<ParamInfo> {
        let d = RoceConfig::default();
        let p = |name, default: String, help| ParamInfo { name, default, help };
        vec![
            p("name", d.name.clone(), "device name"),
            p(
                "addr",
                d.addr.to_string(),
                "IP address the device binds (UDP port 4791); GID index 0 is this address",
            ),
            p(
                "mtu",
                "auto".into(),
                "the port's active MTU: 256, 512, 1024, 2048 or 4096; auto: from the interface's MTU as rxe does (4096 on loopback, 1024 on a 1500-octet link)",
            ),
            p(
                "icrc_rx",
                "auto".into(),
                "how IPv4 packets are received for the ICRC check: raw (raw socket with the IP header; CAP_NET_RAW), udp (the IPv4 ID solved for from the ICRC), auto (raw if permitted)",
            ),
            p(
                "gso",
                "on".into(),
                "on: runs of equal-size packets go as UDP GSO trains (one datagram through the kernel each); off: one datagram per packet (a capture on loopback then shows every packet as its own frame)",
            ),
            p(
                "qpn_base",
                "random".into(),
                "the first QPN the device hands out (1..0xffffff, decimal or 0x hex); random by default, so devices rarely share QPNs",
            ),
            p(
                "impair",
                "none".into(),
                "faults injected into what the device sends, seeded (testing): drop:P,reorder:P,dup:P,corrupt:P,ack_delay_us:N,seed:N (keys optional)",
            ),
        ]
    }

    /// The configuration these settings give (unknown keys and bad values refused).
    pub fn config(opts: &DeviceOptions) -> Result<RoceConfig> {
        opts.check_known("roce", &Self::params())?;
        let mut c = RoceConfig::default();
        if let Some(n) = opts.get("name") {
            c.name = n.to_string();
        }
        if let Some(a) = opts.get("addr") {
            c.addr = a.parse::<IpAddr>().map_err(|_| InvalidArg::OptionValue {
                key: "addr".into(),
                value: a.to_string(),
                expected: "an IPv4 or IPv6 address",
            })?;
        }
        if opts.get("mtu").is_none_or(|m| m == "auto") {
            c.mtu = crate::engine::default_mtu(c.addr);
        } else if let Some(m) = opts.get_num::<u32>("mtu")? {
            c.mtu = match Mtu::at_most(m) {
                Some(mtu) if mtu.bytes() == m => mtu,
                _ => {
                    return Err(InvalidArg::OptionValue {
                        key: "mtu".into(),
                        value: m.to_string(),
                        expected: "256, 512, 1024, 2048 or 4096",
                    }
                    .into());
                }
            };
        }
        c.gso = match opts.get("gso") {
            None | Some("on") => true,
            Some("off") => false,
            Some(v) => {
                return Err(InvalidArg::OptionValue {
                    key: "gso".into(),
                    value: v.to_string(),
                    expected: "on or off",
                }
                .into());
            }
        };
        c.icrc_rx = match opts.get("icrc_rx") {
            None | Some("auto") => IcrcRx::Auto,
            Some("raw") => IcrcRx::Raw,
            Some("udp") => IcrcRx::Udp,
            Some(v) => {
                return Err(InvalidArg::OptionValue {
                    key: "icrc_rx".into(),
                    value: v.to_string(),
                    expected: "auto, raw or udp",
                }
                .into());
            }
        };
        match opts.get("qpn_base") {
            None | Some("random") => {}
            Some(v) => {
                let n = match v.strip_prefix("0x") {
                    Some(h) => u32::from_str_radix(h, 16).ok(),
                    None => v.parse::<u32>().ok(),
                };
                c.qpn_base =
                    Some(
                        n.filter(|n| (1..=0x00ff_ffff).contains(n))
                            .ok_or_else(|| InvalidArg::OptionValue {
                                key: "qpn_base".into(),
                                value: v.to_string(),
                                expected: "a QPN 1..0xffffff (decimal or 0x hex) or random",
                            })?,
                    );
            }
        }
        match opts.get("impair") {
            None | Some("none") | Some("") => {}
            Some(v) => {
                c.impair = Some(ImpairConfig::parse(v).map_err(|_| InvalidArg::OptionValue {
                    key: "impair".into(),
                    value: v.to_string(),
                    expected: "drop:P,reorder:P,dup:P,corrupt:P,ack_delay_us:N,seed:N",
                })?);
            }
        }
        Ok(c)
    }
}

impl DeviceFactory for RoceFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            provider: "roce",
            device: RoceConfig::default().name,
            transport: Transport::RoceV2,
            description: "RoCEv2 (InfiniBand RC and UD transports, IBA vol. 1 ch. 9 and annex A17) over UDP 4791",
            params: Self::params(),
        }
    }

    fn open(&self, opts: &DeviceOptions) -> Result<verbs::Device> {
        // With the IB CM on QP1, so rdma_cm-style connect/listen work (rping, perftest -R, NFS).
        Ok(crate::gsi_cm::open_device(Self::config(opts)?)?)
    }

    fn describe(&self, opts: &DeviceOptions) -> Result<Vec<ConfigItem>> {
        let c = Self::config(opts)?;
        let item = |key, label, value, text: String| ConfigItem {
            key,
            label,
            value,
            text,
        };
        Ok(vec![
            item(
                "addr",
                "address",
                ConfigValue::Text(c.addr.to_string()),
                format!("{}:4791 (GID 0 {})", c.addr, verbs::Gid::from_ip(c.addr)),
            ),
            item(
                "mtu",
                "active MTU",
                ConfigValue::Num(u64::from(c.mtu.bytes())),
                format!("{} octets", c.mtu.bytes()),
            ),
            item(
                "icrc_rx",
                "IPv4 ICRC check",
                ConfigValue::Text(format!("{:?}", c.icrc_rx).to_lowercase()),
                match c.icrc_rx {
                    IcrcRx::Auto => "raw socket with the IP header if permitted, else the IP ID solved for".into(),
                    IcrcRx::Raw => "raw socket: checked against the IP header received".into(),
                    IcrcRx::Udp => "UDP socket: the IP ID solved for from the ICRC".into(),
                },
            ),
            item(
                "impair",
                "fault injection",
                c.impair
                    .map_or(ConfigValue::Null, |i| ConfigValue::Text(format!("{i:?}"))),
                c.impair.map_or("off".into(), |i| format!("{i:?}")),
            ),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_reach_the_config() {
        let o = DeviceOptions::new()
            .with("name", "rxe_t")
            .with("addr", "127.0.9.1")
            .with("mtu", "4096");
        let c = RoceFactory::config(&o).unwrap();
        assert_eq!(c.name, "rxe_t");
        assert_eq!(c.addr.to_string(), "127.0.9.1");
        assert_eq!(c.mtu, Mtu::Mtu4096);
        assert_eq!(c.qpn_base, None);
        for (v, n) in [("0x5a5a00", 0x5a5a00), ("17", 17), ("0xffffff", 0xff_ffff)] {
            let c = RoceFactory::config(&DeviceOptions::new().with("qpn_base", v)).unwrap();
            assert_eq!(c.qpn_base, Some(n), "{v}");
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let o = DeviceOptions::new().with("impair", "drop:0.1,seed:3");
        assert_eq!(RoceFactory::config(&o).unwrap().impair.unwrap().drop, 0.1);
        for (k, v) in [
            ("impair", "drop:7"),
            ("mtu", "1500"),
            ("mtu", "x"),
            ("addr", "nowhere"),
            ("colour", "red"),
            ("qpn_base", "0"),
            ("qpn_base", "0x1000000"),
            ("qpn_base", "-1"),
        ] {
            assert!(
                RoceFactory::config(&DeviceOptions::new().with(k, v)).is_err(),
                "{k}={v}"
            );
        }
    }
}
