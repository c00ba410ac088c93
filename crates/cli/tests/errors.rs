//! Issue 19, "Errors and exits": every bad input and every failed session ends with a
//! non-zero exit status and one clear line on stderr (no panic, no backtrace even with
//! RUST_BACKTRACE=1), within a bounded time: every network wait has a timeout.

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

/// Runs `softrdma ARGS` (killed after `limit`), with RUST_BACKTRACE=1 so that a backtrace
/// would show.
fn run_within(args: &[&str], limit: Duration) -> (Output, Duration) {
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "softrdma {args:?} still running after {limit:?} (a wait without a timeout?): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = t0.elapsed();
    (child.wait_with_output().unwrap(), took)
}

/// Expects exit status `code` and returns the error line: the last line on stderr, which
/// is `Error: ...` (a failure while running) or clap's `error: ...` (a refused argument).
/// No panic, no backtrace, and no other line starting with `Error`.
fn error_line(args: &[&str], code: i32, limit: Duration) -> String {
    let (out, _) = run_within(args, limit);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "softrdma {args:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("Stack backtrace") && !err.contains("Caused by"),
        "softrdma {args:?}: {err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    let line = if code == 2 {
        // clap: "error: ...", then a blank line and "For more information, try '--help'."
        lines.iter().find(|l| l.starts_with("error: ")).copied()
    } else {
        lines.last().copied().filter(|l| l.starts_with("Error: "))
    };
    let line = line.unwrap_or_else(|| panic!("softrdma {args:?}: no error line in {err:?}"));
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("Error") || l.starts_with("error"))
            .count(),
        1,
        "one error line: {err}"
    );
    line.to_string()
}

const QUICK: Duration = Duration::from_secs(20);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn counts_of_zero_and_too_many_threads_are_refused_by_the_parser() {
    for (args, want) in [
        (&["bench", "write", "--iters", "0"][..], "--iters"),
        (&["rpc", "bench", "--threads", "0"], "--threads"),
        (&["rpc", "bench", "--calls", "0"], "--calls"),
        (&["rpc", "call", "--count", "0"], "--count"),
    ] {
        let l = error_line(args, 2, QUICK);
        assert!(
            l.contains(want) && (l.contains("at least 1") || l.contains("1..")),
            "{args:?}: {l}"
        );
    }
    // The limit is stated.
    let l = error_line(
        &["rpc", "bench", "--threads", "10000", "--size", "4K", "--calls", "1"],
        2,
        QUICK,
    );
    assert!(l.contains("--threads") && l.contains("1..=256"), "{l}");
    let l = error_line(&["bench", "write", "--qps", "10000"], 2, QUICK);
    assert!(l.contains("--qps") && l.contains("1..=1024"), "{l}");
}

/// `rpc bench --threads N` checks the descriptors it needs against `ulimit -n` (it raises
/// the soft limit to the hard one first) instead of failing with EMFILE half-way.
#[test]
fn rpc_bench_threads_are_checked_against_the_descriptor_limit() {
    let out = Command::new("sh")
        .args([
            "-c",
            &format!("ulimit -n 256 && exec {BIN} rpc bench --threads 256 --size 4K --calls 1"),
        ])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("Error: --threads 256 needs about") && err.contains("ulimit -n: 256"),
        "{err}"
    );
}

#[test]
fn bench_qps_beyond_the_completion_queue_is_a_user_level_message() {
    let l = error_line(&["bench", "write", "--qps", "1024", "--depth", "16384"], 1, QUICK);
    assert!(
        l.contains("--qps 1024 with --depth 16384 needs") && l.contains("lower --qps or --depth"),
        "{l}"
    );
    assert!(!l.contains("cqe"), "{l}");
}

/// perftest's `-d` picks a device by name from the registry; an unknown name lists the devices
/// this build offers, as `softrdma devices` does.
#[test]
fn perftest_device_by_name_unknown_names_the_available_ones() {
    let l = error_line(&["perftest", "write_bw", "-d", "mlx5_0"], 1, QUICK);
    assert!(
        l.contains("no RDMA device \"mlx5_0\"") && l.contains("siw_soft0"),
        "{l}"
    );
}

/// A server that accepts the TCP connection and never answers: the wait is bounded by
/// `--timeout`, and the message says what was waited for.
#[test]
fn rpc_call_to_a_silent_tcp_server_times_out_saying_what_it_waited_for() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let _held = std::thread::spawn(move || {
        let conns: Vec<_> = l.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(30));
        drop(conns);
    });
    let t0 = Instant::now();
    let line = error_line(
        &["rpc", "call", "--transport", "tcp", "--addr", &addr, "--timeout", "2"],
        1,
        QUICK,
    );
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(
        line.contains(&format!("no reply to READ from {addr}")) && line.contains("within 2 s (--timeout)"),
        "{line}"
    );
}

/// Nobody listening: a clear refusal naming the address, and host names resolve.
#[test]
fn connects_take_host_names_and_say_who_refused() {
    let port = free_port();
    let a = format!("localhost:{port}");
    let l = error_line(&["rpc", "call", "--addr", &a, "--proc", "null"], 1, QUICK);
    assert!(l.contains(&format!("cannot connect to 127.0.0.1:{port}")), "{l}");
    let l = error_line(&["bench", "write", "--connect", &a, "--iters", "10"], 1, QUICK);
    assert!(l.contains(&format!("127.0.0.1:{port}")) && l.contains("refused"), "{l}");
    let l = error_line(&["bench", "write", "--connect", "no-such-host.invalid:1"], 2, QUICK);
    assert!(l.contains("cannot resolve"), "{l}");
}

/// perftest's client retries a refused connect (the server may not listen yet), for
/// `--connect-timeout`, and then says there is no server.
#[test]
fn perftest_without_a_server_gives_up_after_connect_timeout() {
    let port = free_port().to_string();
    let (out, took) = run_within(
        &[
            "perftest",
            "write_bw",
            "127.0.0.1",
            "-p",
            &port,
            "--connect-timeout",
            "2",
        ],
        QUICK,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(took >= Duration::from_secs(2), "{took:?}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Error: ")
            && last.contains(&format!("no perftest server at 127.0.0.1:{port}"))
            && last.contains("refused"),
        "{err}"
    );
}

#[test]
fn perftest_sizes_take_suffixes() {
    // Parsed (then refused for -q, before any network wait).
    let l = error_line(&["perftest", "write_bw", "-s", "4K", "-q", "2"], 1, QUICK);
    assert!(l.contains("-q 2"), "{l}");
    let l = error_line(&["perftest", "write_bw", "-s", "4Q"], 2, QUICK);
    assert!(l.contains("bad size"), "{l}");
}

#[test]
fn rpc_call_size_beyond_the_demo_programs_limit_is_refused_with_the_limit() {
    let l = error_line(&["rpc", "call", "--size", "2G"], 2, QUICK);
    assert!(l.contains("64 MiB"), "{l}");
}

/// Over RDMA, `rpc serve` takes at most 8 MiB of call data (--rdma-max-call): the user
/// reads that limit, not "SystemErr" or "ERR_CHUNK" alone.
#[test]
fn rpc_call_over_the_servers_limits_names_the_limit() {
    use std::io::{BufRead, BufReader};
    let mut srv = Command::new(BIN)
        .args(["rpc", "serve", "--tcp", "127.0.0.1:0", "--rdma", "127.0.0.1:0"])
        .args(["--rdma-max-reply", "1M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(srv.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let rdma = first.split_whitespace().last().unwrap_or_default().to_string();
    let write = error_line(
        &["rpc", "call", "--addr", &rdma, "--proc", "write", "--size", "9M"],
        1,
        QUICK,
    );
    let read = error_line(
        &["rpc", "call", "--addr", &rdma, "--proc", "read", "--size", "2M"],
        1,
        QUICK,
    );
    let _ = srv.kill();
    let _ = srv.wait();
    assert!(
        write.contains("ERR_CHUNK") && write.contains("--rdma-max-call"),
        "{write}"
    );
    assert!(
        read.contains("SYSTEM_ERR") && read.contains("--rdma-max-reply"),
        "{read}"
    );
}

#[test]
fn rping_size_range_message_matches_what_it_accepts() {
    let l = error_line(&["rping", "-c", "-a", "127.0.0.1", "-S", "65536"], 1, QUICK);
    assert!(l.contains("valid range is 26 to 65535"), "{l}");
}

/// The server refuses the ping (the client's buffer is larger than its own): both ends
/// exit non-zero, as Linux rping does.
#[test]
fn rping_client_exits_non_zero_when_the_server_fails_the_session() {
    let port = free_port().to_string();
    let mut server = Command::new(BIN)
        .args([
            "rping",
            "-s",
            "-d",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-S",
            "30",
            "--timeout",
            "20",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // rping's debug output says when the server listens (the client does not retry).
    let mut out = std::io::BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(line.starts_with("rdma_bind_addr successful"), "{line}");
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let l = error_line(
        &[
            "rping",
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-S",
            "100",
            "-C",
            "3",
            "--timeout",
            "20",
        ],
        1,
        QUICK,
    );
    assert!(l.contains("client session failed"), "{l}");
    let st = server.wait().unwrap();
    let mut e = String::new();
    server.stderr.take().unwrap().read_to_string(&mut e).unwrap();
    assert!(!st.success(), "{e}");
    assert!(e.contains("is larger than ours (-S 30)"), "{e}");
}

#[test]
fn nfs_put_reports_a_missing_local_file_first() {
    // No server at all on the target: the local file is what the user hears about.
    let l = error_line(
        &["nfs", "put", "/nonexistent/softrdma-test", "127.0.0.1:/export/x"],
        1,
        QUICK,
    );
    assert!(l.contains("reading the local file /nonexistent/softrdma-test"), "{l}");
}

/// No help text points at internal notes, and every positional argument is described
/// (the man pages hold every subcommand's help).
#[test]
fn help_texts_have_no_internal_references_and_describe_arguments() {
    let dir = std::env::temp_dir().join(format!("softrdma-help-{}", std::process::id()));
    let out = Command::new(BIN).arg("man").arg(&dir).output().unwrap();
    assert!(out.status.success());
    let mut pages = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let roff = std::fs::read_to_string(&p).unwrap();
        pages += 1;
        for bad in ["hazard", "D1", "issue 1", "lab's"] {
            assert!(!roff.contains(bad), "{}: {bad:?} in the help", p.display());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(pages > 10, "{pages} pages");
    for sub in ["stat", "ls", "get", "put", "rm", "probe"] {
        let out = Command::new(BIN).args(["nfs", sub, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        let args = help
            .split("Arguments:")
            .nth(1)
            .unwrap_or_else(|| panic!("{sub}: {help}"));
        let args = args.split("Options:").next().unwrap();
        for line in args.lines().filter(|l| l.trim_start().starts_with(['<', '['])) {
            let desc = line.trim().split_once(' ').map(|x| x.1.trim()).unwrap_or("");
            assert!(!desc.is_empty(), "nfs {sub}: {line:?} has no description");
        }
    }
}
