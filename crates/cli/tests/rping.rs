//! `softrdma rping -c` against `softrdma rping -s` over loopback: many pings with
//! verification, CRC on and off (and asked for by one side only), several sizes,
//! and the rping argument checks.

#[path = "common/child.rs"]
mod child;

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `softrdma rping -s -d` and returns once it listens, with a channel of its stdout lines.
fn start_server(port: u16, extra: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args([
            "rping",
            "-s",
            "-d",
            "-v",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--timeout",
            "30",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn softrdma rping -s");
    let rx = child::lines_once_ready(&mut child, "rdma_bind_addr successful", Duration::from_secs(10));
    (child, rx)
}

struct Run {
    client_ok: bool,
    client_pings: Vec<String>,
    client_stderr: String,
    server_ok: bool,
    server_pings: usize,
    server_detail: String,
}

fn run(count: u32, size: usize, server_extra: &[&str], client_extra: &[&str]) -> Run {
    let port = free_port();
    let (server, lines) = start_server(port, server_extra);
    let out = Command::new(BIN)
        .args([
            "rping",
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-v",
            "-V",
            "--timeout",
            "30",
        ])
        .args(["-C", &count.to_string(), "-S", &size.to_string()])
        .args(client_extra)
        .output()
        .expect("run softrdma rping -c");
    let status = server.wait_with_output().expect("server exits after the disconnect");
    // The server has exited, but its reader thread may still hold lines it has not forwarded:
    // read until the thread sees EOF and drops its sender (not just what has arrived so far).
    let mut server_lines = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        server_lines.push(line);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Run {
        client_ok: out.status.success(),
        client_pings: stdout
            .lines()
            .filter(|l| l.starts_with("ping data: "))
            .map(str::to_owned)
            .collect(),
        client_stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        server_ok: status.status.success(),
        server_pings: server_lines
            .iter()
            .filter(|l| l.starts_with("server ping data: "))
            .count(),
        server_detail: server_lines
            .iter()
            .find(|l| l.starts_with("accepted: "))
            .cloned()
            .unwrap_or_default(),
    }
}

fn check(r: &Run, count: usize, size: usize, crc: bool) {
    assert!(r.client_ok, "client failed: {}", r.client_stderr);
    assert!(r.server_ok, "server failed");
    assert_eq!(r.client_pings.len(), count, "client pings");
    assert_eq!(r.server_pings, count, "server pings");
    for (i, line) in r.client_pings.iter().enumerate() {
        let head = format!("ping data: rdma-ping-{i}: ");
        assert!(line.starts_with(&head), "{line}");
        // The text is size - 1 characters long (NUL at the end).
        assert_eq!(line.len() - "ping data: ".len(), size - 1, "ping {i}");
        // The rotating ASCII starts one later on each ping.
        let first = line.as_bytes()[head.len()];
        assert_eq!(first, b'A' + (i % 58) as u8, "ping {i}");
    }
    let want = if crc { "crc true" } else { "crc false" };
    assert!(r.server_detail.contains(want), "{:?} lacks {want}", r.server_detail);
}

#[test]
fn rping_200_pings_crc_off() {
    let r = run(200, 64, &[], &[]);
    check(&r, 200, 64, false);
}

#[test]
fn rping_200_pings_crc_on() {
    let r = run(200, 64, &["--crc", "on"], &["--crc", "on"]);
    check(&r, 200, 64, true);
}

#[test]
fn rping_crc_asked_by_one_side_is_used() {
    // RFC 5044 §7.1.2: CRC is used if either side asks.
    let r = run(20, 64, &["--crc", "on"], &[]);
    check(&r, 20, 64, true);
    let r = run(20, 64, &[], &["--crc", "on"]);
    check(&r, 20, 64, true);
}

#[test]
fn rping_sizes_min_to_max() {
    for size in [26, 1000, 4096, 65535] {
        let r = run(30, size, &["-S", &size.to_string()], &[]);
        check(&r, 30, size, false);
    }
}

#[test]
fn rping_mpa_rev1_and_p2p() {
    let r = run(10, 64, &["--mpa-rev", "1"], &["--mpa-rev", "1"]);
    check(&r, 10, 64, false);
    for rtr in ["write", "read", "send"] {
        let r = run(10, 64, &["--p2p", rtr], &["--p2p", rtr]);
        check(&r, 10, 64, false);
    }
}

#[test]
fn rping_rejects_sizes_outside_rpings_range() {
    for size in ["25", "65536"] {
        let out = Command::new(BIN)
            .args(["rping", "-c", "-a", "127.0.0.1", "-S", size])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Invalid size"), "{err}");
    }
    let out = Command::new(BIN).args(["rping", "-a", "127.0.0.1"]).output().unwrap();
    assert!(!out.status.success(), "neither -s nor -c");
}

#[test]
fn rping_client_without_server_fails() {
    let port = free_port();
    let out = Command::new(BIN)
        .args(["rping", "-c", "-a", "127.0.0.1", "-p", &port.to_string(), "-C", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
}
