//! The iWARP provider as the device registry sees it ([`verbs::Registry`]):
//! its settings as `key=value` text, parsed and checked here, so code that
//! chooses a device needs no iWARP types.

use crate::engine::{IwarpConfig, Rtr, open_device};
use verbs::{
    ConfigItem, ConfigValue, DeviceFactory, DeviceOptions, InvalidArg, ParamInfo, ProviderInfo, Result, Transport,
};

/// Registers as `iwarp`, opening `siw_soft0` devices.
#[derive(Debug, Clone, Default)]
pub struct IwarpFactory;

impl IwarpFactory {
    fn params() -> Vec<ParamInfo> {
        let d = IwarpConfig::default();
        let p = |name, default: String, help| ParamInfo { name, default, help };
        vec![
            p("name", d.name.clone(), "device name"),
            p("crc", "off".into(), "request MPA CRC32c (used if either side asks)"),
            p(
                "mpa_rev",
                d.mpa_revision.to_string(),
                "MPA revision to request: 1 (RFC 5044) or 2 (RFC 6581)",
            ),
            p(
                "p2p",
                "none".into(),
                "peer-to-peer mode with these RTR types: none, or a list of write, read, send",
            ),
            p(
                "terminate_form",
                "rfc".into(),
                "bit order of the Terminate control word we send: rfc (RFC 5040) or siw (Linux siw's)",
            ),
            p(
                "max_private_data_tx",
                d.max_private_data_tx.to_string(),
                "largest MPA private data we send, IRD/ORD words included (RFC 5044 allows 512; Linux 6.1 siw crashes above 256)",
            ),
        ]
    }

    /// The configuration these settings give (unknown keys and bad values refused).
    pub fn config(opts: &DeviceOptions) -> Result<IwarpConfig> {
        opts.check_known("iwarp", &Self::params())?;
        let mut c = IwarpConfig::default();
        if let Some(n) = opts.get("name") {
            c.name = n.to_string();
        }
        if let Some(v) = opts.get_bool("crc")? {
            c.crc = v;
        }
        if let Some(r) = opts.get_num::<u8>("mpa_rev")? {
            if !(1..=2).contains(&r) {
                return Err(InvalidArg::OptionValue {
                    key: "mpa_rev".into(),
                    value: r.to_string(),
                    expected: "1 or 2",
                }
                .into());
            }
            c.mpa_revision = r;
        }
        if let Some(p) = opts.get("p2p") {
            c.p2p = parse_p2p(p)?;
        }
        match opts.get("terminate_form") {
            None | Some("rfc") => {}
            Some("siw") => c.terminate_siw_form = true,
            Some(other) => {
                return Err(InvalidArg::OptionValue {
                    key: "terminate_form".into(),
                    value: other.to_string(),
                    expected: "rfc or siw",
                }
                .into());
            }
        }
        if let Some(n) = opts.get_num::<usize>("max_private_data_tx")? {
            c.max_private_data_tx = n;
        }
        Ok(c)
    }
}

fn parse_p2p(s: &str) -> Result<Option<Vec<Rtr>>> {
    if s == "none" {
        return Ok(None);
    }
    let mut v = Vec::new();
    for t in s.split(',') {
        v.push(match t.trim() {
            "write" => Rtr::Write,
            "read" => Rtr::Read,
            "send" => Rtr::Send,
            other => {
                return Err(InvalidArg::OptionValue {
                    key: "p2p".into(),
                    value: other.to_string(),
                    expected: "none, or a list of write, read, send",
                }
                .into());
            }
        });
    }
    Ok(Some(v))
}

impl DeviceFactory for IwarpFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            provider: "iwarp",
            device: IwarpConfig::default().name,
            transport: Transport::Iwarp,
            description: "iWARP (RDMAP RFC 5040/7306, DDP RFC 5041, MPA RFC 5044/6581) over kernel TCP",
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
        let num = |n: usize| ConfigValue::Num(n as u64);
        let ms = |d: std::time::Duration| ConfigValue::Num(d.as_millis() as u64);
        Ok(vec![
            item(
                "crc",
                "MPA CRC32c",
                ConfigValue::Bool(c.crc),
                if c.crc {
                    "requested (used if either side asks)".into()
                } else {
                    "not requested (used if the peer asks)".into()
                },
            ),
            item(
                "mpa_revision",
                "MPA revision",
                num(c.mpa_revision as usize),
                format!(
                    "{} ({})",
                    c.mpa_revision,
                    if c.mpa_revision >= 2 {
                        "RFC 6581, enhanced connection setup"
                    } else {
                        "RFC 5044"
                    }
                ),
            ),
            item(
                "reject_markers",
                "markers",
                ConfigValue::Bool(c.reject_markers),
                if c.reject_markers {
                    "peers requiring markers are refused".into()
                } else {
                    "not requested; inserted if the peer requires them".into()
                },
            ),
            item(
                "p2p",
                "peer-to-peer (RTR)",
                match &c.p2p {
                    None => ConfigValue::Null,
                    Some(v) => ConfigValue::List(v.iter().map(|r| format!("{r:?}")).collect()),
                },
                match &c.p2p {
                    None => "off".to_string(),
                    Some(v) => format!("on, RTR types {v:?}"),
                },
            ),
            item(
                "max_ulpdu",
                "max ULPDU (FPDU payload)",
                num(c.max_ulpdu),
                format!("{} bytes", c.max_ulpdu),
            ),
            item(
                "max_private_data",
                "max private data accepted",
                num(c.max_private_data),
                format!("{} bytes", c.max_private_data),
            ),
            item(
                "max_private_data_tx",
                "max private data sent",
                num(c.max_private_data_tx),
                format!("{} bytes", c.max_private_data_tx),
            ),
            item(
                "reply_timeout_ms",
                "MPA Reply timeout (initiator)",
                ms(c.reply_timeout),
                format!("{:?}", c.reply_timeout),
            ),
            item(
                "request_timeout_ms",
                "MPA Request timeout (responder)",
                ms(c.request_timeout),
                format!("{:?}", c.request_timeout),
            ),
            item(
                "terminate_siw_form",
                "Terminate bit order",
                ConfigValue::Bool(c.terminate_siw_form),
                if c.terminate_siw_form {
                    "Linux siw's".into()
                } else {
                    "RFC 5040's".into()
                },
            ),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::Error;

    #[test]
    fn settings_reach_the_config() {
        let o = DeviceOptions::new()
            .with("crc", "on")
            .with("mpa_rev", 1)
            .with("p2p", "write,read")
            .with("terminate_form", "siw")
            .with("max_private_data_tx", 512);
        let c = IwarpFactory::config(&o).unwrap();
        assert!(c.crc && c.terminate_siw_form);
        assert_eq!(c.mpa_revision, 1);
        assert_eq!(c.p2p, Some(vec![Rtr::Write, Rtr::Read]));
        assert_eq!(c.max_private_data_tx, 512);
        assert_eq!(IwarpFactory::config(&DeviceOptions::new()).unwrap().p2p, None);
    }

    #[test]
    fn bad_settings_are_refused() {
        for (k, v) in [
            ("crc", "sometimes"),
            ("mpa_rev", "3"),
            ("p2p", "poke"),
            ("terminate_form", "kernel"),
            ("markers", "on"),
        ] {
            let e = IwarpFactory::config(&DeviceOptions::new().with(k, v));
            let named = match &e {
                Err(Error::InvalidArgument(InvalidArg::OptionValue { key, value, .. })) => key == k && value == v,
                Err(Error::InvalidArgument(InvalidArg::UnknownOption { key, .. })) => key == k && k == "markers",
                _ => false,
            };
            assert!(named, "{k}={v}: {e:?}");
        }
    }
}
