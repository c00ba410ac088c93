//! `softrdma perftest` against itself over loopback TCP (no lab needed): every test, server
//! and client as two processes, checking exit statuses, the result lines, that write/read bw
//! servers print the client's figures (perftest's `xchg_bw_reports`), and that the payload
//! pattern check between two softrdma ends ran. Also: a server given a peer that is not
//! perftest fails with a clear error instead of hanging or panicking.

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `softrdma perftest TEST ARGS.. -p PORT --timeout 20 EXTRA..`
fn perftest(test: &str, args: &[&str], port: u16, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["perftest", test])
        .args(args)
        .args(["-p", &port.to_string(), "--timeout", "20"])
        .args(extra)
        .env("RUST_BACKTRACE", "0");
    c
}

/// A perftest server started with `-p 0`: it listens on a port the system chose and names it on
/// stderr, so no test picks a "free" port that another one (or another process) can take
/// between the check and the server's bind (the bandwidth test failed once that way under load).
struct Server {
    child: Child,
    port: u16,
    /// Stderr read so far (up to the port line) and the reader of the rest.
    head: String,
    rest: std::thread::JoinHandle<String>,
}

impl Server {
    /// Spawns `cmd` (which must carry `-p 0` and pipe stdout and stderr) and waits for the
    /// port line.
    fn spawn(mut cmd: Command) -> Server {
        use std::io::{BufRead, BufReader, Read};
        let mut child = cmd.spawn().expect("server");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut head = String::new();
        let port = loop {
            let mut line = String::new();
            if err.read_line(&mut line).unwrap() == 0 {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "the server exited without naming its port: {head}{}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
            head.push_str(&line);
            if let Some(a) = line.trim().strip_prefix("perftest server: listening on ") {
                break a.rsplit(':').next().unwrap().parse().unwrap();
            }
        };
        let rest = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Server {
            child,
            port,
            head,
            rest,
        }
    }

    /// Waits for the server (killed after 30 s) and returns its output, stderr whole.
    fn finish(self) -> Output {
        let mut o = finish(self.child);
        let mut e = self.head.into_bytes();
        e.extend(self.rest.join().unwrap().into_bytes());
        e.extend(o.stderr);
        o.stderr = e;
        o
    }
}

/// `softrdma perftest TEST --bind 127.0.0.1 -p 0 --timeout 20 EXTRA..`
fn server(test: &str, extra: &[&str]) -> Server {
    let mut c = perftest(test, &["--bind", "127.0.0.1"], 0, extra);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    // No readiness probe (a bare TCP connect is not an MPA peer): the server listens before
    // it names its port, and the client retries a refused connect as perftest's does anyway.
    Server::spawn(c)
}

fn client(test: &str, port: u16, extra: &[&str]) -> Output {
    perftest(test, &["127.0.0.1"], port, extra).output().expect("client")
}

fn finish(mut c: Child) -> Output {
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> serde_json::Value {
    let s = String::from_utf8_lossy(&o.stdout);
    let line = s.lines().last().unwrap_or_else(|| panic!("no output: {}", text(o)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

/// Runs one test both ends with --json and returns (server, client) JSON.
fn pair(test: &str, size: &str, iters: &str) -> (serde_json::Value, serde_json::Value) {
    let args = ["-s", size, "-n", iters, "--json"];
    let s = server(test, &args);
    let c = client(test, s.port, &args);
    let s = s.finish();
    assert!(c.status.success(), "client: {}\nserver: {}", text(&c), text(&s));
    assert!(s.status.success(), "server: {}\nclient: {}", text(&s), text(&c));
    (json(&s), json(&c))
}

fn check_common(v: &serde_json::Value, test: &str, size: u64, iters: u64) {
    assert_eq!(v["test"], test, "{v}");
    assert_eq!(v["tool"], "perftest", "{v}");
    assert_eq!(v["size"], size, "{v}");
    assert_eq!(v["iters"], iters, "{v}");
    assert!(v["peer"].as_str().unwrap().starts_with("softrdma"), "{v}");
}

#[test]
fn bandwidth_tests_between_two_softrdma_ends() {
    for test in ["write_bw", "read_bw"] {
        let (s, c) = pair(test, "8192", "300");
        check_common(&c, test, 8192, 300);
        check_common(&s, test, 8192, 300);
        assert_eq!(s["figures_from"], "peer");
        // The family's names and units (docs/json.md): MB/s of 2^20 bytes, Gbit/s, msg/s.
        let (mb, g) = (c["mb_per_s"].as_f64().unwrap(), c["gbit_per_s"].as_f64().unwrap());
        assert!((g - mb * 1048576.0 * 8.0 / 1e9).abs() <= g * 1e-9, "{c}");
        assert!(c["lat"].is_null(), "{c}");
        for k in ["mb_per_s_peak", "mb_per_s", "gbit_per_s", "msg_per_s"] {
            assert_eq!(s[k], c[k], "{test}: the server reports the client's {k}");
            assert!(c[k].as_f64().unwrap() > 0.0, "{c}");
        }
        assert!(
            c["verified"].as_str().unwrap().contains("payload pattern checked"),
            "{c}"
        );
    }
    // Send: more iterations than the default rx depth makes the credit flow control work.
    let (s, c) = pair("send_bw", "1000", "1500");
    check_common(&c, "send_bw", 1000, 1500);
    check_common(&s, "send_bw", 1000, 1500);
    assert!(
        s["verified"].as_str().unwrap().contains("payload pattern checked"),
        "{s}"
    );
}

/// read_bw and read_lat between two softrdma ends check what the client read against the
/// pattern the server put in its region. The server must put it there before the exchange that
/// lets the client start reading: a server that is slow after the exchange (here paused, under
/// load descheduled) made the check fail with "the RDMA Read target does not hold the pattern"
/// when it wrote the pattern after it (issue 18's flake of the bandwidth test above).
#[test]
fn read_tests_find_the_pattern_when_the_server_is_slow_after_the_exchange() {
    for (test, size) in [("read_bw", "4096"), ("read_lat", "64")] {
        let args = ["-s", size, "-n", "50", "--json"];
        let mut sargs = args.to_vec();
        sargs.extend(["--pause-after-exchange-ms", "300"]);
        let s = server(test, &sargs);
        let c = client(test, s.port, &args);
        let s = s.finish();
        assert!(c.status.success(), "{test} client: {}\nserver: {}", text(&c), text(&s));
        assert!(s.status.success(), "{test} server: {}\nclient: {}", text(&s), text(&c));
        let c = json(&c);
        assert!(
            c["verified"].as_str().unwrap().contains("payload pattern checked"),
            "{c}"
        );
    }
}

#[test]
fn latency_tests_between_two_softrdma_ends() {
    for test in ["write_lat", "send_lat", "read_lat"] {
        let (s, c) = pair(test, "64", "200");
        check_common(&c, test, 64, 200);
        let l = &c["lat"];
        for k in ["min_us", "p50_us", "avg_us", "p99_us", "p999_us", "max_us"] {
            assert!(l[k].as_f64().unwrap() > 0.0, "{test}: {k} in {c}");
        }
        assert!(l["stdev_us"].as_f64().is_some(), "{c}");
        assert!(l["min_us"].as_f64() <= l["p50_us"].as_f64(), "{c}");
        if test == "read_lat" {
            assert_eq!(s["figures_from"], "none (the client measures)", "{s}");
        } else {
            check_common(&s, test, 64, 200);
        }
    }
}

#[test]
fn table_output_has_perftest_result_line() {
    let s = server("write_bw", &["-s", "4096", "-n", "50"]);
    let c = client("write_bw", s.port, &["-s", "4096", "-n", "50"]);
    let s = s.finish();
    assert!(c.status.success() && s.status.success(), "{}\n{}", text(&c), text(&s));
    for o in [&c, &s] {
        let out = String::from_utf8_lossy(&o.stdout);
        let mut it = out
            .lines()
            .skip_while(|l| !l.contains("#bytes     #iterations    BW peak[MB/sec]"));
        it.next().expect("header");
        let f: Vec<&str> = it.next().expect("result").split_whitespace().collect();
        assert_eq!(&f[..2], &["4096", "50"], "{out}");
    }
}

/// A peer that is an old perftest (version 5.60): the server refuses it with perftest's own
/// check (`check_version_compatibility`), a typed error and exit status 1, no panic. The peer is
/// a raw verbs client that speaks only the first message.
#[test]
fn server_refuses_a_peer_older_than_5_70() {
    use verbs::*;
    let s = server("write_bw", &[]);
    let port = s.port;
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let qp = loop {
        match pd.connect(
            ([127, 0, 0, 1], port).into(),
            QpOptions::new(&cq).post_recv([RecvWr {
                wr_id: 9,
                sg_list: vec![mr.sge(0, 64)],
            }]),
            Duration::from_secs(5),
        ) {
            Ok(qp) => break qp,
            Err(e) => {
                assert!(Instant::now() < deadline, "connect: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"5.60");
    mr.write(0, &v).unwrap();
    qp.post_send_one(SendWr::new(1, WrOpcode::Send, vec![mr.sge(0, 16)]))
        .unwrap();
    let wc = cq.wait(Some(Duration::from_secs(5))).expect("send completion");
    assert_eq!(wc.status, WcStatus::Success);
    let s = s.finish();
    drop(qp);
    let st = text(&s);
    assert!(!s.status.success(), "server accepted version 5.60: {st}");
    assert!(st.contains("older than 5.7"), "{st}");
    assert!(!st.contains("panicked"), "{st}");
}

// ---------------------------------------------------------------------------------------
// The perftest server's resource model and diagnostics (issue 12: one client at a time with
// a clear refusal, an idle timeout, "peer closed" with QP and address, non-zero exit).

/// Whether a TCP socket on local `port` is in `state` (from /proc/net/tcp: "01" ESTABLISHED,
/// "0A" LISTEN).
fn tcp_state_on(port: u16, state: &str) -> bool {
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap();
    t.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[3] == state && f[1].ends_with(&format!(":{port:04X}"))
    })
}

/// Whether a TCP connection to local `port` is ESTABLISHED: the client's comm connection is
/// up, whatever the scheduler did.
fn established_to(port: u16) -> bool {
    tcp_state_on(port, "01")
}

/// `softrdma perftest TEST ARGS.. -p PORT` without the helper's `--timeout`.
fn bare(test: &str, port: u16, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["perftest", test, "-p", &port.to_string()])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn wait_established(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !established_to(port) {
        assert!(Instant::now() < deadline, "no connection to port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While one client is served, a second one is refused (as perftest: the listener goes
/// once the comm connection is accepted), and the first session still completes.
#[test]
fn perftest_server_refuses_a_second_client() {
    let s = server("write_bw", &["-s", "4096", "-n", "50", "--json"]);
    let port = s.port;
    let first = perftest("write_bw", &["127.0.0.1"], port, &["-s", "4096", "-n", "50", "--json"])
        .args(["--first-send-delay-ms", "5000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_established(port);
    // ESTABLISHED is the kernel's handshake; the server drops its listener only after it has
    // accepted the comm connection (MPA included). A second client that came before that
    // would sit in the backlog and be closed during MPA instead of refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    while tcp_state_on(port, "0A") {
        assert!(Instant::now() < deadline, "the server still listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t0 = Instant::now();
    let second = bare(
        "write_bw",
        port,
        &["127.0.0.1", "-s", "4096", "-n", "50", "--timeout", "1"],
    )
    .output()
    .unwrap();
    assert!(!second.status.success());
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert!(text(&second).contains("connection refused"), "{}", text(&second));
    let c = finish(first);
    let s = s.finish();
    assert!(c.status.success(), "{}", text(&c));
    assert!(s.status.success(), "{}", text(&s));
}

/// A client that dies after connecting: the server says the peer closed the connection,
/// with QP number and address, and exits non-zero. A client that connects and goes silent
/// is dropped after `--timeout` with a message naming it.
#[test]
fn perftest_server_reports_a_dead_or_silent_client() {
    for (kill, server_timeout) in [(true, "30"), (false, "2")] {
        let s = Server::spawn(bare(
            "send_bw",
            0,
            &["--bind", "127.0.0.1", "--timeout", server_timeout],
        ));
        let port = s.port;
        let mut c = bare("send_bw", port, &["127.0.0.1", "--first-send-delay-ms", "60000"])
            .spawn()
            .unwrap();
        wait_established(port);
        if kill {
            c.kill().unwrap();
        }
        let out = s.finish();
        let _ = c.kill();
        let _ = c.wait();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{e}");
        if kill {
            // The kernel closes a killed process's sockets with a FIN, or with a RST when
            // data it had not read yet (the server's version message) was still queued:
            // which one depends on how far the client got.
            assert!(
                e.contains("peer closed the connection (QP ") || e.contains("peer reset the connection (QP "),
                "{e}"
            );
        } else {
            assert!(
                e.contains("timed out waiting for") && e.contains("the peer went silent"),
                "{e}"
            );
        }
        assert!(e.contains(", peer 127.0.0.1:"), "{e}");
    }
}

/// `-c UD` (issue 14; requirements smcr-ipoibcm.md C1 SIDR, C2 UD, D3): send_bw and send_lat
/// between two RoCE devices on their own loopback addresses. The data QP is resolved by SIDR
/// in rdma_cm's UDP port space; send_lat's server answers the address of the client's QPN
/// datagram (`ibv_create_ah_from_wc`). ib_send_bw's default size (65536) is cut to the MTU
/// both ends state (4096: the port MTU on loopback follows the interface's, as rxe's
/// does), as perftest's check_mtu does; a requested size above it is refused.
#[test]
fn ud_send_tests_between_two_softrdma_ends() {
    let roce = |srv: &str| -> Vec<String> {
        ["-c", "UD", "--provider", "roce", "--json", "-n", "200"]
            .iter()
            .map(|s| s.to_string())
            .chain([srv.to_string()])
            .collect()
    };
    for (i, test) in ["send_bw", "send_lat"].into_iter().enumerate() {
        let srv = format!("127.94.{}.1", i + 1);
        let port = free_port();
        let mut sargs = roce("--bind");
        sargs.push(srv.clone());
        let sargs: Vec<&str> = sargs.iter().map(|s| s.as_str()).collect();
        let s = perftest(test, &sargs, port, &[])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A RoCE REQ to a device not yet open is lost, not refused, and is retried only after
        // the CM timeout (4.3 s): let the server open its device first.
        std::thread::sleep(Duration::from_millis(300));
        let cargs = roce(&srv);
        let cargs: Vec<&str> = cargs.iter().map(|s| s.as_str()).collect();
        let c = perftest(test, &cargs, port, &[]).output().unwrap();
        let s = finish(s);
        assert!(c.status.success(), "client: {}\nserver: {}", text(&c), text(&s));
        assert!(s.status.success(), "server: {}\nclient: {}", text(&s), text(&c));
        let size = if test == "send_bw" { 4096 } else { 2 };
        let (s, c) = (json(&s), json(&c));
        check_common(&c, test, size, 200);
        check_common(&s, test, size, 200);
        let v = s["verified"].as_str().unwrap();
        assert!(v.contains("payload pattern checked"), "{s}");
    }
    // -s above the MTU: perftest's "Max message size in UD cannot be greater than MTU".
    let port = free_port();
    let s = perftest(
        "send_bw",
        &["-c", "UD", "--provider", "roce", "--bind", "127.94.3.1", "-s", "8192"],
        port,
        &[],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let c = perftest(
        "send_bw",
        &["-c", "UD", "--provider", "roce", "127.94.3.1", "-s", "8192"],
        port,
        &[],
    )
    .output()
    .unwrap();
    let s = finish(s);
    assert!(!c.status.success() && !s.status.success(), "{}\n{}", text(&c), text(&s));
    assert!(text(&c).contains("cannot be greater than MTU"), "{}", text(&c));
}

/// `-c UD` is refused where perftest has no UD (RDMA tests) and on iWARP, before any I/O.
#[test]
fn ud_is_refused_for_rdma_tests_and_iwarp() {
    let o = perftest(
        "write_bw",
        &["-c", "UD", "--provider", "roce", "127.94.4.1"],
        free_port(),
        &[],
    )
    .output()
    .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("only send_bw and send_lat"),
        "{}",
        text(&o)
    );
    let o = perftest(
        "send_bw",
        &["-c", "UD", "--provider", "iwarp", "127.94.4.1"],
        free_port(),
        &[],
    )
    .output()
    .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("iWARP has no unreliable datagrams"),
        "{}",
        text(&o)
    );
}
