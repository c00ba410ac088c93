//! `softrdma devices` and `softrdma info`.

use anyhow::{Result, bail};

/// List the RDMA devices.
#[derive(clap::Args)]
pub struct DevicesArgs {}

/// Show a device's attributes and configuration.
#[derive(clap::Args)]
pub struct InfoArgs {}

pub fn run_devices(_args: DevicesArgs) -> Result<()> {
    bail!("softrdma devices: not implemented yet")
}

pub fn run_info(_args: InfoArgs) -> Result<()> {
    bail!("softrdma info: not implemented yet")
}
