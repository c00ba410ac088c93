//! `softrdma`: one binary that shows and measures the softrdma stack.
//!
//! ```text
//! softrdma demo      # every RDMA operation between two QPs over loopback, explained
//! softrdma bench     # perftest-style bandwidth / message rate / latency (write, read, send, atomic)
//! softrdma devices   # the RDMA devices (providers) this build offers
//! softrdma info      # one device's attributes and configuration
//! softrdma perftest  # perftest's own -R exchange, against ib_*_bw/lat on Linux siw
//! softrdma completions bash   # shell completions; `softrdma man DIR` writes man pages
//! ```
//!
//! (and `rping`, `rpc`, `nfs`: librdmacm's rping, ONC RPC over RDMA and TCP, an NFSv3 client.)
//!
//! ## Where it sits
//!
//! ```text
//!   softrdma (this binary)       <- the top: one subcommand per tool
//!     rpc, nfs        -> rpcrdma (RPC-over-RDMA, ONC RPC, NFSv3 client)
//!     everything      -> verbs   (Device, PD, MR, CQ, QP, the CM)
//!   providers.rs      -> iwarp, roce (the only module that names a provider crate)
//! ```
//!
//! A device is opened by name: [`providers::registry`] lists the providers this
//! build links (`softrdma devices` prints them), and [`providers::open`] opens
//! one by device or provider name (`--provider roce`, `--device siw_soft0`, or
//! the first one), with its settings as text (`--crc on`, `--dev-opt mtu=4096`)
//! that the provider parses, and gives it its local address. A program
//! of your own does the same with `verbs::Registry` (see `examples/`).
//!
//! Each subcommand lives in its own module with a `clap::Args` struct and a
//! `run` function; this file only dispatches. Diagnostics go to stderr through
//! `tracing` (`RUST_LOG`, plain text when stderr is not a terminal); results
//! go to stdout, as tables or, with `--json`, one JSON object per line
//! (docs/json.md).

use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench;
mod demo;
mod devices;
mod fdlimit;
mod ipoib_cmd;
mod mckey;
mod net;
mod nfs;
mod perftest;
mod procstat;
mod progress;
mod providers;
mod report;
mod rpc;
mod rping;
mod scale;
mod scm;
mod sigpipe;
mod smc_cmd;
mod udaddy;
mod units;

#[derive(Parser)]
#[command(
    name = "softrdma",
    version,
    about = "Userspace RDMA without RDMA hardware: iWARP (RDMAP/DDP/MPA over TCP) and RoCEv2 (the InfiniBand transport over UDP) under one verbs API",
    after_help = "Logging: diagnostics go to stderr. Without RUST_LOG they show warnings and the servers' \
connection notes (peer closed, Terminates, idle closes, refusals); RUST_LOG=info, debug, or \
per crate (RUST_LOG=softrdma=debug,iwarp=trace) turns them up. Colours only when stderr is a terminal."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Walk through each RDMA operation between two queue pairs over loopback
    /// TCP, in one process, printing what happens on the wire and in the
    /// completion queues, then a short bandwidth run.
    Demo(demo::Args),
    /// Measure bandwidth, message rate and latency of RDMA Write, Read, Send
    /// and atomics, perftest style (see `softrdma bench --help`).
    Bench(bench::Args),
    /// List the RDMA devices (providers) this build offers.
    Devices(devices::DevicesArgs),
    /// Show a device's attributes and configuration.
    Info(devices::InfoArgs),
    /// librdmacm's rping (RDMA Read/Write ping-pong), compatible with Linux's `rping`.
    Rping(rping::RpingArgs),
    /// librdmacm's udaddy (rdma_cm UDP port space: SIDR, then UD datagrams both ways),
    /// compatible with Linux's `udaddy` over rxe (RoCEv2 provider).
    Udaddy(udaddy::UdaddyArgs),
    /// librdmacm's mckey (rdma_cm multicast join, UD datagrams through the group),
    /// compatible with Linux's `mckey` over rxe (RoCEv2 provider).
    Mckey(mckey::MckeyArgs),
    /// ONC RPC over TCP and RPC-over-RDMA: serve, call and benchmark the demo program.
    Rpc(rpc::Args),
    /// NFSv3 client over RPC-over-RDMA or TCP: ls, stat, get, put, rm, and probe (how a server answers chunk errors) on SERVER:/export/path.
    Nfs(nfs::Args),
    /// perftest's ib_{send,write,read}_{bw,lat} -R exchange (rdma_cm mode): measure against
    /// perftest on Linux siw or an iWARP RNIC, in either role (see `softrdma perftest --help`).
    Perftest(perftest::Args),
    /// What N connected queue pairs cost on one device next to N TCP connections, in one
    /// run: setup rate, memory and descriptors per connection, idle CPU, and how fairly a few
    /// active connections share the bandwidth (Jain's index).
    Scale(scale::Args),
    /// IPoIB (RFC 4391 datagram mode): an IP interface (TUN) whose link is the RoCEv2
    /// fabric; `up` runs the link daemon, `show neigh|conn` prints its state.
    Ipoib(ipoib_cmd::Args),
    /// SMC-R (RFC 7609): `stat` shows link groups, links, connections and resource counts;
    /// `run -- PROGRAM ARGS` (Linux's smc_run) for unmodified programs, the per-namespace
    /// daemon it starts, and `status` (the daemon's connections).
    Smc(smc_cmd::Args),
    /// Print a shell completion script: `softrdma completions bash > /etc/bash_completion.d/softrdma`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (softrdma.1 and one per subcommand, softrdma-bench.1, ...) into DIR.
    Man {
        /// Directory to write the pages into (created if missing).
        dir: std::path::PathBuf,
    },
}

/// `softrdma completions SHELL`: the script on stdout.
fn completions(shell: clap_complete::Shell) -> Result<()> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "softrdma", &mut std::io::stdout());
    Ok(())
}

/// `softrdma man DIR`: one roff page per command.
fn man_pages(dir: &std::path::Path) -> Result<()> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)?;
    let cmd = Cli::command();
    clap_mangen::generate_to(cmd, dir)?;
    for e in std::fs::read_dir(dir)? {
        println!("{}", e?.path().display());
    }
    Ok(())
}

/// The log filter when `RUST_LOG` is not set.
const DEFAULT_LOG: &str = "warn,rpcrdma=info";

fn main() -> std::process::ExitCode {
    sigpipe::restore_default();
    use std::io::IsTerminal;
    // Colours only on a terminal: RUST_LOG output to a pipe or file stays plain text.
    // Without RUST_LOG: warnings, and the servers' connection diagnostics (peer closed,
    // Terminate, idle close, refusals), which rpcrdma logs at info.
    let cli = Cli::parse();
    // `rpc bench` runs its servers in-process: their per-connection notes are noise there.
    let default_log = match &cli.cmd {
        Cmd::Rpc(a) if a.is_bench() => "warn",
        _ => DEFAULT_LOG,
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let res = match cli.cmd {
        Cmd::Demo(args) => demo::run(args),
        Cmd::Bench(args) => bench::run(args),
        Cmd::Devices(args) => devices::run_devices(args),
        Cmd::Info(args) => devices::run_info(args),
        Cmd::Rping(args) => rping::run(args),
        Cmd::Udaddy(args) => udaddy::run(args),
        Cmd::Mckey(args) => mckey::run(args),
        Cmd::Rpc(args) => rpc::run(args),
        Cmd::Nfs(args) => nfs::run(args),
        Cmd::Perftest(args) => perftest::run(args),
        Cmd::Scale(args) => scale::run(args),
        Cmd::Ipoib(args) => ipoib_cmd::run(args),
        Cmd::Smc(args) => smc_cmd::run(args),
        Cmd::Completions { shell } => completions(shell),
        Cmd::Man { dir } => man_pages(&dir),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, never a backtrace (RUST_BACKTRACE is for
            // panics); `Error:` as Rust's own `main` prints it, which scripts already match.
            eprintln!("Error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
