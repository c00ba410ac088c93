//! `softrdma bench`: perftest-style benchmarks over the verbs API.

use anyhow::{Result, bail};

/// Measure bandwidth, message rate and latency.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    bail!("softrdma bench: not implemented yet")
}
