//! `softrdma smc`: SMC-R (RFC 7609) tools (issue 15).
//!
//! - `stat [--json] [--dir DIR]`: like Linux's `smcss` / `smcr linkgroup`: every process that
//!   publishes SMC-R state (the `smc` crate's engine does so when it makes its first link
//!   group; `smc run`'s daemon too) is asked over its unix socket `DIR/<pid>.sock`
//!   (`DIR` = `$SOFTRDMA_SMC_RUN_DIR` or `/run/softrdma/smc`; see `smc::stats`) and its link
//!   groups, links (state, GIDs, QPNs), connections (SMC-R or fallback and why, octets each
//!   way) and resource counts (QPs, MRs, RMB elements) are printed.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args as ClapArgs, Subcommand};

/// `softrdma smc ...`.
#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: SmcCmd,
}

#[derive(Subcommand)]
enum SmcCmd {
    /// Link groups, links, connections and resource counts of every SMC-R process.
    Stat(StatArgs),
}

/// `softrdma smc stat`.
#[derive(ClapArgs)]
pub struct StatArgs {
    /// Print the snapshots as JSON (an array, one object per process; model `smc::stats`).
    #[arg(long)]
    json: bool,
    /// Directory of the stats sockets (default `$SOFTRDMA_SMC_RUN_DIR` or /run/softrdma/smc).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Runs `softrdma smc ...`.
pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        SmcCmd::Stat(a) => stat(a),
    }
}

/// `softrdma smc stat`.
pub fn stat(a: StatArgs) -> Result<()> {
    let dir = a.dir.unwrap_or_else(smc::stats::run_dir);
    let snaps = smc::stats::collect(&dir);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&snaps)?);
    } else {
        print!("{}", smc::stats::render_text(&snaps));
    }
    Ok(())
}
