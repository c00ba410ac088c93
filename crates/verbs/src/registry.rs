//! The device registry: which providers a build offers, and how a program
//! opens a device without naming a provider crate.
//!
//! rdma-core finds providers as shared libraries and lists their devices in
//! `ibv_get_device_list`; here a program (the `softrdma` CLI, a test, your
//! binary) registers the providers it links once, in one place, and everything
//! above asks the [`Registry`] for a device by name ([`Registry::open`]) or
//! takes the first one ([`Registry::open_default`]). Provider settings travel
//! as text parameters ([`DeviceOptions`], like the `key=value` settings of a
//! kernel module), which each provider parses and validates itself, so the
//! code that chooses a device needs no provider types.

use crate::device::Device;
use crate::error::{Error, InvalidArg, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The transport a device speaks (`ibv_transport_type` / link layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// iWARP: RDMAP/DDP/MPA over TCP (`IBV_TRANSPORT_IWARP`).
    Iwarp,
    /// RoCEv2: the InfiniBand transport over UDP/IP (`IBV_TRANSPORT_IB`, Ethernet link layer).
    RoceV2,
}

impl Transport {
    /// rdma-core's name (`ibv_devinfo`'s "transport:" line).
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Iwarp => "iWARP",
            Transport::RoceV2 => "InfiniBand",
        }
    }
}

/// One setting a provider takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// The key (`crc`, `mpa_rev`, ...).
    pub name: &'static str,
    /// The value used when the setting is not given.
    pub default: String,
    /// What it does, for `softrdma info` and `--help`.
    pub help: &'static str,
}

/// What a registered provider is, for `softrdma devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    /// The provider's short name (`iwarp`, `roce`).
    pub provider: &'static str,
    /// The device name it opens by default (`siw_soft0`).
    pub device: String,
    /// The transport (iWARP, RoCEv2).
    pub transport: Transport,
    /// One line on the protocols it runs.
    pub description: &'static str,
    /// The settings it takes.
    pub params: Vec<ParamInfo>,
}

/// Provider settings as `key=value` text, parsed by the provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    params: BTreeMap<String, String>,
}

impl DeviceOptions {
    /// No settings: the provider's defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets `key` to `value` (builder form).
    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.set(key, value);
        self
    }
    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: impl ToString) {
        self.params.insert(key.to_string(), value.to_string());
    }
    /// Parses `key=value`, as given on a command line.
    pub fn set_pair(&mut self, pair: &str) -> Result<()> {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| InvalidArg::OptionSyntax(pair.to_string()))?;
        self.set(k.trim(), v.trim());
        Ok(())
    }
    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params.get(key).map(String::as_str)
    }
    /// Every setting, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.params.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
    /// Refuses keys that are not among `known`, naming the ones that are.
    pub fn check_known(&self, provider: &str, known: &[ParamInfo]) -> Result<()> {
        for k in self.params.keys() {
            if !known.iter().any(|p| p.name == k) {
                let names: Vec<_> = known.iter().map(|p| p.name).collect();
                return Err(InvalidArg::UnknownOption {
                    provider: provider.to_string(),
                    key: k.clone(),
                    known: names,
                }
                .into());
            }
        }
        Ok(())
    }
    /// A boolean setting: on/off, true/false, 1/0, yes/no.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "on" | "true" | "1" | "yes" => Ok(true),
                "off" | "false" | "0" | "no" => Ok(false),
                _ => Err(InvalidArg::OptionValue {
                    key: key.to_string(),
                    value: v.to_string(),
                    expected: "on or off",
                }
                .into()),
            })
            .transpose()
    }
    /// A numeric setting.
    pub fn get_num<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>> {
        self.get(key)
            .map(|v| {
                v.parse::<T>().map_err(|_| {
                    InvalidArg::OptionValue {
                        key: key.to_string(),
                        value: v.to_string(),
                        expected: "a number",
                    }
                    .into()
                })
            })
            .transpose()
    }
}

/// A configuration value, for machines (`--json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigValue {
    /// On or off.
    Bool(bool),
    /// A number.
    Num(u64),
    /// Anything else.
    Text(String),
    /// Unset / off.
    Null,
    /// A list of names.
    List(Vec<String>),
}

/// One line of a device's effective configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigItem {
    /// Machine name (`crc`, `mpa_revision`).
    pub key: &'static str,
    /// Human label (`MPA CRC32c`).
    pub label: &'static str,
    /// Its value.
    pub value: ConfigValue,
    /// The value explained for people.
    pub text: String,
}

/// A provider as the registry knows it: it describes itself and opens devices.
pub trait DeviceFactory: Send + Sync {
    /// What the provider is and what it takes.
    fn info(&self) -> ProviderInfo;
    /// Opens a device with these settings (unknown keys are refused).
    fn open(&self, opts: &DeviceOptions) -> Result<Device>;
    /// The effective configuration for these settings, for `softrdma info`
    /// (no device is opened).
    fn describe(&self, opts: &DeviceOptions) -> Result<Vec<ConfigItem>>;
}

/// The providers a program offers, in registration order.
#[derive(Clone, Default)]
pub struct Registry {
    factories: Vec<Arc<dyn DeviceFactory>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a provider (builder form).
    pub fn with(mut self, f: Arc<dyn DeviceFactory>) -> Self {
        self.register(f);
        self
    }
    /// Adds a provider.
    pub fn register(&mut self, f: Arc<dyn DeviceFactory>) {
        self.factories.push(f);
    }
    /// Every registered provider (`ibv_get_device_list`).
    pub fn list(&self) -> Vec<ProviderInfo> {
        self.factories.iter().map(|f| f.info()).collect()
    }
    /// The provider whose device name or provider name is `name`.
    pub fn find(&self, name: &str) -> Result<&Arc<dyn DeviceFactory>> {
        self.factories
            .iter()
            .find(|f| {
                let i = f.info();
                i.device == name || i.provider == name
            })
            .ok_or_else(|| {
                let names: Vec<_> = self.list().into_iter().map(|i| i.device).collect();
                Error::NoDevice {
                    name: name.to_string(),
                    available: names,
                }
            })
    }
    /// Opens the device `name` (a device or provider name) with `opts`.
    pub fn open(&self, name: &str, opts: &DeviceOptions) -> Result<Device> {
        self.find(name)?.open(opts)
    }
    /// Opens `name` if given, else the first registered device.
    pub fn open_default(&self, name: Option<&str>, opts: &DeviceOptions) -> Result<Device> {
        match name {
            Some(n) => self.open(n, opts),
            None => self
                .factories
                .first()
                .ok_or_else(|| Error::NoDevice {
                    name: "(any)".into(),
                    available: Vec::new(),
                })?
                .open(opts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse() {
        let mut o = DeviceOptions::new().with("crc", "on");
        o.set_pair("mpa_rev = 1").unwrap();
        assert_eq!(o.get_bool("crc").unwrap(), Some(true));
        assert_eq!(o.get_num::<u8>("mpa_rev").unwrap(), Some(1));
        assert_eq!(o.get_bool("absent").unwrap(), None);
        assert!(o.set_pair("novalue").is_err());
        assert!(DeviceOptions::new().with("crc", "maybe").get_bool("crc").is_err());
        let known = [ParamInfo {
            name: "crc",
            default: "off".into(),
            help: "",
        }];
        let err = o.check_known("iwarp", &known).unwrap_err().to_string();
        assert!(err.contains("mpa_rev") && err.contains("takes: crc"), "{err}");
    }

    #[test]
    fn unknown_device_names_the_available_ones() {
        let r = Registry::new();
        let err = r.open("mlx5_0", &DeviceOptions::new()).unwrap_err();
        assert!(matches!(err, Error::NoDevice { .. }), "{err}");
        assert!(r.open_default(None, &DeviceOptions::new()).is_err());
    }
}
