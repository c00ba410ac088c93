//! The RoCEv2 provider as the device registry sees it ([`verbs::Registry`]): its settings as
//! `key=value` text, parsed and checked here.

use std::net::IpAddr;

use crate::engine::{RoceConfig, open_device};
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
                d.mtu.bytes().to_string(),
                "the port's active MTU: 256, 512, 1024, 2048 or 4096",
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
        if let Some(m) = opts.get_num::<u32>("mtu")? {
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
        Ok(c)
    }
}

impl DeviceFactory for RoceFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            provider: "roce",
            device: RoceConfig::default().name,
            transport: Transport::RoceV2,
            description: "RoCEv2 (InfiniBand RC transport, IBTA vol. 1 ch. 9 and annex A17) over UDP 4791",
            params: Self::params(),
        }
    }

    fn open(&self, opts: &DeviceOptions) -> Result<verbs::Device> {
        Ok(open_device(Self::config(opts)?)?)
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
    }

    #[test]
    fn bad_settings_are_refused() {
        for (k, v) in [("mtu", "1500"), ("mtu", "x"), ("addr", "nowhere"), ("colour", "red")] {
            assert!(
                RoceFactory::config(&DeviceOptions::new().with(k, v)).is_err(),
                "{k}={v}"
            );
        }
    }
}
