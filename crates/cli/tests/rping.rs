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

/// rping's -I (source address) and -t (type of service): the server sees the connection
/// come from the -I address, and the pings go through with the TOS set (the socket's TOS
/// itself is checked in the iwarp crate's `dial` test).
#[test]
fn rping_client_source_address_and_tos() {
    let port = free_port();
    let (server, lines) = start_server(port, &[]);
    let out = Command::new(BIN)
        .args([
            "rping",
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-V",
            "-C",
            "5",
        ])
        .args(["-I", "127.0.0.2", "-t", "0x10", "--timeout", "30"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status = server.wait_with_output().expect("server exits after the disconnect");
    assert!(status.status.success());
    let server_lines: Vec<String> = std::iter::from_fn(|| lines.recv_timeout(Duration::from_secs(10)).ok()).collect();
    assert!(
        server_lines
            .iter()
            .any(|l| l.starts_with("child cma: connect request from 127.0.0.2:")),
        "{server_lines:?}"
    );
}

/// Bad -I and -t values: exit status 2 or 1, one clear line, no connection attempt hanging.
#[test]
fn rping_rejects_bad_source_and_tos() {
    let port = free_port().to_string();
    let cases: [(&[&str], &str); 6] = [
        (
            &["-c", "-a", "127.0.0.1", "-t", "256"],
            "not a type of service: 0 to 255",
        ),
        (&["-c", "-a", "127.0.0.1", "-t", "0xfff"], "not a type of service"),
        // rping's -I and -t belong to the connection the client makes.
        (&["-s", "-t", "16"], "'-s' cannot be used with '-t <TOS>'"),
        // -P (persistent) is the server's.
        (&["-c", "-a", "127.0.0.1", "-P"], "'-c' cannot be used with '-P'"),
        (
            &["-c", "-a", "127.0.0.1", "-I", "::1"],
            "must be of the server's IP version",
        ),
        // 192.0.2.1 (TEST-NET-1) is no address of this host.
        (
            &["-c", "-a", "127.0.0.1", "-I", "192.0.2.1"],
            "cannot connect from 192.0.2.1",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(BIN)
            .arg("rping")
            .args(args)
            .args(["-p", &port, "-C", "1", "--timeout", "10"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
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

// ---------------------------------------------------------------------------------------
// Failed sessions and the server's resource model (issue 12 point 9 and its Diagnostics and
// CLI-servers paragraphs).

/// A server child: `softrdma rping -s -d -p 0` (the kernel picks the port), its port, and a
/// channel of the stdout lines after the ready line.
struct Server {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<String>,
}

fn spawn_server(extra: &[&str], env: &[(&str, &str)]) -> Server {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(BIN)
        .args(["rping", "-s", "-d", "-v", "-a", "127.0.0.1", "-p", "0"])
        .args(extra)
        .envs(env.iter().copied())
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn softrdma rping -s");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let ready = rx.recv_timeout(Duration::from_secs(20)).expect("server's first line");
    let port = ready
        .strip_prefix("rdma_bind_addr successful on ")
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("not a bind line: {ready}"))
        .port();
    Server { child, port, lines: rx }
}

impl Server {
    /// Waits for the stdout line starting with `prefix` (panics after 20 s).
    fn wait_line(&self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => {}
                Err(e) => panic!("no {prefix:?} line from the server: {e}"),
            }
        }
    }

    /// Waits for the exit (panics after 60 s): (success, stderr).
    fn finish(mut self) -> (bool, String) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("server did not exit");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = self.child.wait_with_output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn client_cmd(port: u16, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args([
        "rping",
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--timeout",
        "30",
    ])
    .args(extra)
    .env_remove("RUST_BACKTRACE")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

/// CPU time (user + system) of a process so far, from /proc/PID/stat, in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // fields 14 and 15 (utime, stime) are 12 and 13 after the state field
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// Issue 12 point 9: a bad-STag RDMA Read — issued by our server (`-s --test-bad-stag`), or
/// advertised by our client (`-c --test-bad-stag`) — fails the session on both sides, and each
/// says why at default log level: the server the failed Read's status with its Terminate cause
/// and the Terminate it received, the client the Terminate it sent, both with QP number and
/// peer address; both exit non-zero. The report does not depend on which the application saw
/// first (completion or event), so it is checked over several runs. Also the Diagnostics
/// paragraph's small point: RUST_LOG output to a pipe carries no ANSI colours. RDMAP-SEC-01
/// (invalid STag), RDMAP-ERR-07, RDMAP-TRM-02.
#[test]
fn rping_bad_stag_read_fails_both_sides_with_status_and_terminate() {
    for (side, runs) in [("server", 3), ("client", 3)] {
        for _ in 0..runs {
            let (sx, cx): (&[&str], &[&str]) = if side == "server" {
                (&["--test-bad-stag", "--timeout", "30"], &[])
            } else {
                (&["--timeout", "30"], &["--test-bad-stag"])
            };
            let srv = spawn_server(sx, &[("RUST_LOG", "info")]);
            let out = client_cmd(srv.port, &[&["-C", "3", "-v"], cx].concat())
                .output()
                .unwrap();
            let cerr = String::from_utf8_lossy(&out.stderr).into_owned();
            let (sok, serr) = srv.finish();
            assert!(!sok, "server must fail: {serr}");
            assert!(!out.status.success(), "client must fail: {cerr}");
            assert!(serr.contains("Error: server session failed (QP "), "{serr}");
            assert!(serr.contains(", peer 127.0.0.1:"), "{serr}");
            assert!(
                serr.contains("cq completion failed status 10 (remote access error, vendor_err 0x000100) on RdmaRead"),
                "{side}: {serr}"
            );
            assert!(
                serr.contains("fatal error received from the peer: Terminate layer 0 type 1 code 0x00"),
                "{side}: {serr}"
            );
            assert!(!serr.contains("QP is in state"), "{serr}");
            assert!(cerr.contains("Error: client session failed (QP "), "{cerr}");
            assert!(
                cerr.contains("fatal error sent to the peer: Terminate layer 0 type 1 code 0x00"),
                "{side}: {cerr}"
            );
            // RUST_LOG=info to a pipe: the engine's own line, without escape sequences.
            assert!(
                serr.contains("INFO iwarp::engine::qp") && serr.contains(": Terminate received: layer 0"),
                "{serr}"
            );
            assert!(!serr.contains('\u{1b}'), "ANSI escapes in piped log output: {serr:?}");
        }
    }
}

/// CLI servers' resource model (issue 12): a client that connects and then goes silent is
/// dropped after `--timeout` with a message naming it, the server exits non-zero, and the
/// idle wait costs (almost) no CPU.
#[test]
fn rping_server_drops_a_silent_client_after_its_timeout() {
    let srv = spawn_server(&["--timeout", "3"], &[]);
    // Connects, then sends nothing for ten minutes.
    let mut client = client_cmd(srv.port, &["-C", "1", "--first-send-delay-ms", "600000"])
        .spawn()
        .unwrap();
    srv.wait_line("accepted: ");
    let cpu0 = cpu_secs(srv.child.id());
    let t0 = std::time::Instant::now();
    let pid = srv.child.id();
    let mut cpu1 = cpu0;
    // Sample the CPU time until the process exits (the last sample before exit counts).
    while let Ok(c) = std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|_| cpu_secs(pid)) {
        cpu1 = c;
        if t0.elapsed() > Duration::from_secs(2) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, serr) = srv.finish();
    let _ = client.kill();
    let _ = client.wait();
    assert!(!ok, "a dropped session is a failure: {serr}");
    assert!(
        serr.contains("server idle: no completion or event for 3 s (--timeout); dropping peer 127.0.0.1:"),
        "{serr}"
    );
    assert!(serr.contains("(QP "), "{serr}");
    // 2 s of idle session: well under 5 % of one core.
    assert!(cpu1 - cpu0 < 0.1, "idle server used {:.3} s CPU in 2 s", cpu1 - cpu0);
}

/// CLI servers' resource model (issue 12): `rping -s` serves one client; a second one that
/// tries while the first is connected is refused at once (its connect fails, it exits
/// non-zero), and the first session completes. The server then says its peer closed the
/// connection, with QP and address, and exits 0 (the session ended where a ping ends).
#[test]
fn rping_server_refuses_a_second_client_and_reports_the_close() {
    let srv = spawn_server(&["--timeout", "30"], &[]);
    let first = client_cmd(srv.port, &["-C", "2", "-v", "--first-send-delay-ms", "1500"])
        .spawn()
        .unwrap();
    srv.wait_line("accepted: ");
    let t0 = std::time::Instant::now();
    let second = client_cmd(srv.port, &["-C", "1"]).output().unwrap();
    assert!(!second.status.success());
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "refusal took {:?}",
        t0.elapsed()
    );
    let e2 = String::from_utf8_lossy(&second.stderr);
    assert!(e2.contains("connect error to 127.0.0.1:"), "{e2}");
    let out = first.wait_with_output().unwrap();
    let (ok, serr) = srv.finish();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("ping data"))
            .count(),
        2
    );
    assert!(ok, "{serr}");
    assert!(serr.contains("server: peer closed the connection (QP "), "{serr}");
    assert!(serr.contains(", peer 127.0.0.1:"), "{serr}");
}

/// rping -P: a persistent server serves clients one after another and at the same time,
/// reports a failed session and goes on serving; it does not exit by itself.
#[test]
fn rping_persistent_server_serves_client_after_client() {
    let mut s = spawn_server(&["-P", "-S", "64"], &[]);
    let ok = |extra: &[&str]| {
        let out = client_cmd(s.port, extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    ok(&["-C", "5", "-V"]);
    // A client the server refuses (its buffer is larger): that session fails, the server stays.
    let bad = client_cmd(s.port, &["-C", "1", "-S", "100"]).output().unwrap();
    assert!(!bad.status.success());
    // Two at once.
    let a = client_cmd(s.port, &["-C", "20", "-V"]).spawn().unwrap();
    let b = client_cmd(s.port, &["-C", "20", "-V", "-S", "40"]).spawn().unwrap();
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    ok(&["-C", "1"]);
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "a persistent server keeps running"
    );
    s.child.kill().unwrap();
    let out = s.child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server: session with 127.0.0.1:") && err.contains("is larger than ours (-S 64)"),
        "{err}"
    );
    // Every line the server wrote (the reader thread ends at EOF, now that it is dead).
    let pings = std::iter::from_fn(|| s.lines.recv_timeout(Duration::from_secs(10)).ok())
        .filter(|l| l.starts_with("server ping data: "))
        .count();
    let want = 5 + 20 + 20 + 1;
    assert!(pings >= want, "{pings} pings seen by the server, {want} sent");
}

/// `softrdma rping --provider roce`, server and client in two processes on loopback over
/// the RoCEv2 provider (IB CM on QP1, RC Send/Read/Write): `count` verified pings of
/// `size` octets; the client connects from `source` (rping's -I) or from the route's source.
fn run_roce(server_addr: &str, source: Option<&str>, count: u32, size: usize) -> (bool, usize, String) {
    let port = free_port().to_string();
    let mut server = Command::new(BIN)
        .args([
            "rping",
            "--provider",
            "roce",
            "-s",
            "-d",
            "-v",
            "-a",
            server_addr,
            "-p",
            &port,
        ])
        .args(["--timeout", "30", "-S", &size.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn softrdma rping -s");
    let _lines = child::lines_once_ready(&mut server, "rdma_bind_addr successful", Duration::from_secs(10));
    let mut c = Command::new(BIN);
    c.args([
        "rping",
        "--provider",
        "roce",
        "-c",
        "-a",
        server_addr,
        "-p",
        &port,
        "-v",
        "-V",
    ])
    .args(["--timeout", "30", "-C", &count.to_string(), "-S", &size.to_string()]);
    if let Some(s) = source {
        c.args(["-I", s]);
    }
    let out = c.output().expect("run softrdma rping -c");
    let s = server.wait_with_output().expect("server exits after the disconnect");
    let pings = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .count();
    (
        out.status.success() && s.status.success(),
        pings,
        format!(
            "client: {}\nserver: {}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&s.stderr)
        ),
    )
}

/// Issue 13 point 6 (C3): rping runs unchanged on the RoCEv2 provider, sizes from rping's
/// minimum to its maximum, 120 pings of 64 octets.
#[test]
fn rping_over_roce_sizes() {
    for (count, size) in [(120, 64), (5, rping_min()), (5, 4096), (3, 65535)] {
        let (ok, pings, log) = run_roce("127.0.74.1", Some("127.0.74.2"), count, size);
        assert!(ok, "size {size}: {log}");
        assert_eq!(pings, count as usize, "size {size}: {log}");
    }
}

/// The brief's example: `rping --provider roce -s -a 127.0.0.1` and `-c -a 127.0.0.1` in
/// two processes. The server's device holds 127.0.0.1:4791, the route's source for the
/// client, so the client's device takes the next free loopback address.
#[test]
fn rping_over_roce_both_on_127_0_0_1() {
    let (ok, pings, log) = run_roce("127.0.0.1", None, 10, 64);
    assert!(ok && pings == 10, "{log}");
}

fn rping_min() -> usize {
    26
}
