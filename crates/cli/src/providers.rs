//! Where the `softrdma` binary chooses a device: the one module that names
//! provider crates. Every command asks [`open`] for a device; settings travel as
//! [`DeviceOptions`] text that the provider itself parses, so no command (and no
//! upper layer) depends on a provider's types (`tests/layering.rs` checks this).

use anyhow::Result;
use std::sync::Arc;
use verbs::{Device, DeviceOptions, Registry};

/// The providers this build offers, in the order `softrdma devices` lists them.
pub fn registry() -> Registry {
    Registry::new().with(Arc::new(iwarp::IwarpFactory))
}

/// Opens `device` (by device or provider name), or the first device.
pub fn open(device: Option<&str>, opts: &DeviceOptions) -> Result<Device> {
    Ok(registry().open_default(device, opts)?)
}

/// Device options with MPA CRC on or off, the setting most commands take.
pub fn crc(on: bool) -> DeviceOptions {
    DeviceOptions::new().with("crc", if on { "on" } else { "off" })
}
