//! End-to-end runs of the built `softrdma` binary: demo, bench (every
//! operation, JSON output, the TCP and UDP baselines, two processes), devices and info of
//! both providers, provider options refused where they do not apply.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

/// Waits for `child` at most `limit`, killing it if it takes longer. Its stdout and stderr
/// are read while it runs: a child whose output exceeds a pipe's capacity (the bash
/// completions are ~62 KB in 13 writes) would otherwise block forever in write(2).
fn wait_output(mut child: Child, limit: Duration) -> Output {
    fn drain(p: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = p {
                let _ = p.read_to_end(&mut v);
            }
            v
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Output {
                status,
                stdout: out.join().unwrap(),
                stderr: err.join().unwrap(),
            };
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            let _ = child.wait();
            panic!(
                "timed out after {limit:?}; stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.join().unwrap()),
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run(args: &[&str]) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(child, Duration::from_secs(30))
}

/// Runs and expects success; returns stdout.
fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "softrdma {args:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

/// The fields every bandwidth result has, with sane values.
fn check_bw(v: &Value, op: &str, size: u64, iters: u64) {
    assert_eq!(v["op"], op, "{v}");
    assert_eq!(v["mode"], "bw", "{v}");
    assert_eq!(v["size"], size, "{v}");
    assert_eq!(v["iters"], iters, "{v}");
    assert_eq!(v["qps"], 1, "{v}");
    assert!(v["crc"].is_boolean(), "{v}");
    assert!(v["depth"].as_u64().unwrap() >= 1, "{v}");
    let g = num(v, "gbit_per_s");
    let m = num(v, "msg_per_s");
    assert!(g > 0.0 && g < 10_000.0, "{v}");
    assert!(m > 0.0, "{v}");
    // Consistent: Gbit/s = messages/s * size * 8.
    let expect = m * size as f64 * 8.0 / 1e9;
    assert!((g - expect).abs() <= expect * 1e-6, "{v}");
    assert!(v["lat"].is_null(), "{v}");
    // The same units as `rpc bench` (docs/json.md): MB/s = 2^20 bytes.
    let mb = num(v, "mb_per_s");
    assert!((mb - g * 1e9 / 8.0 / 1048576.0).abs() <= mb * 1e-9, "{v}");
    assert!(num(v, "mb_per_s_peak") >= mb * 0.999, "{v}");
    assert_eq!(v["tool"], "bench");
}

#[test]
fn demo_walks_through_every_operation() {
    let out = ok(&["demo"]);
    for want in [
        "listening on 127.0.0.1:",
        "server: connect request from",
        "Send: server received 21 bytes: \"Hello over RDMAP Send\"",
        "Send with Invalidate: server's receive completion says STag",
        "RDMA Write: server memory now holds \"placed directly by RDMA Write\"",
        "RDMA Read: client received 20 bytes \"fetched by RDMA Read\"",
        "with immediate data 0xc0ffee",
        "returned the original 40, server memory is now 42",
        "bandwidth: 512 RDMA Writes of 1 MiB",
        "RDMA Read of a bad STag: client completion status \"remote access error\"",
        "client: fatal error received from the server: Terminate layer 0",
        "Done.",
    ] {
        assert!(out.contains(want), "demo output lacks {want:?}:\n{out}");
    }
}

#[test]
fn bench_each_op_json() {
    for (op, size) in [("write", 4096), ("read", 4096), ("send", 4096), ("atomic", 8)] {
        let out = ok(&["bench", op, "--size", "4K", "--iters", "300", "--depth", "16", "--json"]);
        let v = json_lines(&out);
        assert_eq!(v.len(), 1, "{out}");
        check_bw(&v[0], op, size, 300);
        assert_eq!(v[0]["depth"], 16);
        assert_eq!(v[0]["crc"], false);
        assert!(v[0].get("baseline").is_none(), "no baseline asked: {out}");
    }
}

/// Issue 14: UD Send message rate on one QP, 64 B and MTU by default, next to a plain UDP
/// socket sending the same sizes (`--baseline udp`) in the same run.
#[test]
fn bench_ud_send_rate_with_udp_baseline() {
    let out = ok(&[
        "bench",
        "send",
        "--ud",
        "--provider",
        "roce",
        "--loopback",
        "127.77.151.1",
        "--iters",
        "2000",
        "--baseline",
        "udp",
        "--json",
    ]);
    let v = json_lines(&out);
    assert_eq!(v.len(), 2, "{out}");
    // 64 octets and the port MTU (4096 on loopback, from the interface's, as rxe's).
    for (r, size) in v.iter().zip([64u64, 4096]) {
        assert_eq!(r["test"], "ud_send_rate");
        assert_eq!(r["size"], size);
        assert!(r["sent"].as_u64().unwrap() >= 2000, "{r}");
        assert!(r["received"].as_u64().unwrap() > 0, "{r}");
        assert!(r["sent_mpps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["udp_sent_mpps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["ratio"].as_f64().unwrap() > 0.0, "{r}");
        // The sending threads' CPU time per message, and their ratio.
        let (ud, udp) = (
            r["cpu_us_per_msg"].as_f64().unwrap(),
            r["udp_cpu_us_per_msg"].as_f64().unwrap(),
        );
        assert!(ud > 0.0 && udp > 0.0, "{r}");
        assert!(
            (r["cpu_ratio"].as_f64().unwrap() - udp / ud).abs() <= 1e-9 * udp / ud,
            "{r}"
        );
    }
    // A UD message is at most the MTU.
    let out = run(&[
        "bench",
        "send",
        "--ud",
        "--provider",
        "roce",
        "--loopback",
        "127.77.151.1",
        "--size",
        "8K",
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("at most the MTU"), "{e}");
}

#[test]
fn bench_sweep_crc_and_qps() {
    let out = ok(&[
        "bench", "write", "--sizes", "64,4K", "--iters", "200", "--crc", "on", "--json", "--qps", "2",
    ]);
    let v = json_lines(&out);
    assert_eq!(v.len(), 2, "{out}");
    for (r, size) in v.iter().zip([64u64, 4096]) {
        assert_eq!(r["size"], size);
        assert_eq!(r["crc"], true, "CRC was asked for: {r}");
        assert_eq!(r["qps"], 2);
        assert_eq!(r["messages"], 400);
    }
}

#[test]
fn bench_duration_runs_for_about_that_long() {
    let start = Instant::now();
    let out = ok(&[
        "bench",
        "write",
        "--size",
        "64",
        "--depth",
        "64",
        "--duration",
        "0.5",
        "--json",
    ]);
    let el = start.elapsed();
    let v = &json_lines(&out)[0];
    let secs = num(v, "seconds");
    assert!((0.45..3.0).contains(&secs), "{v}");
    assert!(el < Duration::from_secs(10));
    assert!(num(v, "msg_per_s") > 1000.0, "{v}");
}

/// Progress (indicatif) goes to stderr only when asked for or on a terminal: a piped
/// run is silent there, `--progress` shows the spinner line with its rates, and the
/// results on stdout are the same JSON either way.
#[test]
fn bench_progress_only_when_asked_or_on_a_terminal() {
    let args = ["bench", "write", "--size", "64", "--duration", "1.2", "--json"];
    let quiet = run(&args);
    assert!(quiet.status.success());
    assert!(quiet.stderr.is_empty(), "{}", String::from_utf8_lossy(&quiet.stderr));
    let shown = run(&[&args[..], &["--progress"]].concat());
    assert!(shown.status.success());
    let err = String::from_utf8_lossy(&shown.stderr);
    assert!(err.contains("bench write 64 B: ") && err.contains("Gbit/s"), "{err}");
    assert_eq!(json_lines(&String::from_utf8_lossy(&shown.stdout)).len(), 1);
}

#[test]
fn bench_latency_with_tcp_baseline() {
    for op in ["send", "write", "read", "atomic"] {
        let out = ok(&[
            "bench",
            op,
            "--lat",
            "--size",
            "8",
            "--iters",
            "100",
            "--baseline",
            "tcp",
            "--json",
        ]);
        let v = &json_lines(&out)[0];
        assert_eq!(v["op"], op);
        assert_eq!(v["mode"], "lat");
        assert_eq!(v["iters"], 100);
        // Everything the latency table shows.
        let l = &v["lat"];
        let (min, p50, p99, p999, max) = (
            num(l, "min_us"),
            num(l, "p50_us"),
            num(l, "p99_us"),
            num(l, "p999_us"),
            num(l, "max_us"),
        );
        assert!(
            min > 0.0 && min <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
            "{v}"
        );
        let avg = num(l, "avg_us");
        assert!(min <= avg && avg <= max, "{v}");
        assert!(p50 < 100_000.0, "{v}");
        let b = num(&v["baseline"]["lat"], "p50_us");
        assert!(b > 0.0, "{v}");
        assert_eq!(v["baseline"]["kind"], "tcp");
        // Our ends busy-poll their CQs here, so the TCP ends busy-poll too (issue 18).
        assert_eq!(v["baseline"]["polling"], "busy-poll");
        assert_eq!(v["baseline"]["ratio_of"], "lat.p50_us");
        assert!((num(&v["baseline"], "ratio") - p50 / b).abs() < 1e-9, "{v}");
    }
}

#[test]
fn bench_latency_with_events() {
    let out = ok(&[
        "bench",
        "send",
        "--lat",
        "--events",
        "--iters",
        "200",
        "--baseline",
        "tcp",
        "--json",
    ]);
    let v = &json_lines(&out)[0];
    assert_eq!(v["iters"], 200);
    assert!(num(&v["lat"], "p50_us") > 0.0, "{v}");
    // Both our ends sleep on their CQs, so the TCP ends block in read (issue 18).
    assert_eq!(v["baseline"]["polling"], "blocking", "{v}");
    assert!(num(&v["baseline"]["lat"], "p50_us") > 0.0, "{v}");
    let out = ok(&[
        "bench",
        "send",
        "--lat",
        "--events",
        "--iters",
        "200",
        "--baseline",
        "tcp",
    ]);
    assert!(out.contains("blocking reads on both ends"), "{out}");
    let out = ok(&["bench", "send", "--lat", "--iters", "200", "--baseline", "tcp"]);
    assert!(out.contains("busy-polling non-blocking sockets on both ends"), "{out}");
}

#[test]
fn bench_bandwidth_with_tcp_baseline_human_and_json() {
    let out = ok(&[
        "bench",
        "read",
        "--size",
        "64K",
        "--iters",
        "300",
        "--baseline",
        "tcp",
        "--json",
    ]);
    let v = &json_lines(&out)[0];
    check_bw(v, "read", 65536, 300);
    let base = &v["baseline"];
    assert_eq!(base["kind"], "tcp");
    assert_eq!(base["polling"], "blocking");
    // The fair stream (issue 13): the same bytes, server -> client for Read, and what ran.
    assert_eq!(base["bytes"].as_u64(), Some(300 * 65536), "{v}");
    let method = base["method"].as_str().unwrap_or_default();
    assert!(
        method.contains("page-aligned") && method.contains("server write()s"),
        "{v}"
    );
    let b = num(base, "gbit_per_s");
    assert!(b > 0.0 && num(base, "mb_per_s") > 0.0, "{v}");
    assert_eq!(base["ratio_of"], "gbit_per_s");
    assert!((num(base, "ratio") - num(v, "gbit_per_s") / b).abs() < 1e-9, "{v}");
    // Both runs' CPU seconds (10 ms resolution) and their ratio.
    assert!(num(v, "cpu_s") >= 0.0 && num(base, "cpu_s") >= 0.0, "{v}");
    assert!(base["cpu_ratio"].is_number() || num(base, "cpu_s") == 0.0, "{v}");

    let out = ok(&["bench", "write", "--size", "64K", "--iters", "300", "--baseline", "tcp"]);
    for want in [
        "RDMA_Write BW Test",
        "#bytes     #iterations   BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]",
        " 65536      300 ",
        "ratio RDMA/TCP",
        "Baseline method : one TCP connection per QP",
    ] {
        assert!(out.contains(want), "table lacks {want:?}:\n{out}");
    }
}

#[test]
fn bench_two_processes() {
    let (server, addr, mut err) = bench_server(&[]);
    let out = run(&[
        "bench",
        "send",
        "--connect",
        &addr,
        "--sizes",
        "1K,16K",
        "--iters",
        "200",
        "--baseline",
        "tcp",
        "--json",
    ]);
    let client_ok = out.status.success();
    let sout = wait_output(server, Duration::from_secs(20));
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(
        client_ok,
        "client failed: {}\n{}\nserver stderr: {rest}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(sout.status.success(), "server failed: {rest}");
    let v = json_lines(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(v.len(), 2);
    check_bw(&v[0], "send", 1024, 200);
    check_bw(&v[1], "send", 16384, 200);
    assert!(num(&v[1]["baseline"], "gbit_per_s") > 0.0);
    // Across processes too the TCP stream moves the same bytes (the server's count, checked).
    assert_eq!(v[0]["baseline"]["bytes"].as_u64(), Some(200 * 1024), "{}", v[0]);
    assert_eq!(v[1]["baseline"]["bytes"].as_u64(), Some(200 * 16384), "{}", v[1]);
    // The server prints the client's figures, as perftest's server does: one row per size,
    // the same iterations and average as the client's JSON (MB/sec = 2^20 bytes).
    let table = String::from_utf8(sout.stdout).unwrap();
    assert!(
        table.contains("Send BW Test (server side: the client's figures)"),
        "{table}"
    );
    assert!(table.contains("BW average[MB/sec]"), "{table}");
    for r in &v {
        let row = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&r["size"].to_string()))
            .unwrap_or_else(|| panic!("no row for {} in {table}", r["size"]));
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(f[1], "200", "{row}");
        let mb: f64 = f[3].parse().unwrap();
        let want = num(r, "gbit_per_s") * 1e9 / 8.0 / 1048576.0;
        assert!((mb - want).abs() <= want * 0.01 + 0.01, "{row} vs {r}");
    }
}

/// perftest's letters mean what the long options mean; MB/sec is the default unit of the
/// table, Gb/sec with --report_gbits; -a sweeps from 2 bytes to 8 MiB.
#[test]
fn bench_takes_perftest_letters_and_units() {
    let v = json_lines(&ok(&[
        "bench", "write", "-s", "4K", "-n", "120", "-q", "2", "-t", "16", "--json",
    ]));
    assert_eq!(v.len(), 1);
    assert_eq!((v[0]["size"].as_u64(), v[0]["iters"].as_u64()), (Some(4096), Some(120)));
    assert_eq!((v[0]["qps"].as_u64(), v[0]["depth"].as_u64()), (Some(2), Some(16)));
    let mb = ok(&["bench", "write", "-s", "4K", "-n", "100"]);
    assert!(mb.contains("BW peak[MB/sec]    BW average[MB/sec]"), "{mb}");
    let gb = ok(&["bench", "write", "-s", "4K", "-n", "100", "--report_gbits"]);
    assert!(gb.contains("BW peak[Gb/sec]    BW average[Gb/sec]"), "{gb}");
    let all = json_lines(&ok(&["bench", "write", "-a", "-n", "20", "--json"]));
    let sizes: Vec<u64> = all.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, (1..=23).map(|b| 1u64 << b).collect::<Vec<_>>());
    let d = json_lines(&ok(&["bench", "write", "-s", "64", "-D", "0.3", "--json"]));
    assert!(num(&d[0], "seconds") >= 0.3, "{:?}", d[0]);
}

#[test]
fn bench_rejects_bad_arguments() {
    for args in [
        &["bench", "write", "--size", "0"][..],
        &["bench", "write", "--size", "12X"],
        &["bench", "write", "--iters", "5", "--duration", "1"],
        &["bench", "send", "--lat", "--qps", "2"],
        &["bench", "write", "--events"],
        &["bench", "--baseline", "udp", "write"],
        &["bench", "--baseline", "quic", "write", "--lat"],
        &["bench", "write", "--loopback", "10.0.0.1"],
        &["bench"],
    ] {
        let out = run(args);
        assert!(!out.status.success(), "{args:?} should fail");
    }
}

#[test]
fn devices_and_info_json() {
    // Issue 13 point 6: `devices` lists both providers' devices.
    let v = json_lines(&ok(&["devices", "--json"]));
    assert_eq!(v.len(), 2, "{v:?}");
    assert_eq!(v[0]["name"], "siw_soft0");
    assert_eq!(v[0]["provider"], "iwarp");
    assert_eq!(v[0]["transport"], "iWARP");
    assert!(v[0]["description"].as_str().unwrap().contains("TCP"));
    assert_eq!(v[1]["name"], "rxe_soft0");
    assert_eq!(v[1]["provider"], "roce");
    assert_eq!(v[1]["transport"], "InfiniBand");
    assert!(v[1]["description"].as_str().unwrap().contains("UDP 4791"));
    // The registry lists each provider's settings with their defaults.
    let opts = v[0]["options"].as_array().unwrap();
    assert!(
        opts.iter().any(|o| o["name"] == "crc" && o["default"] == "off"),
        "{opts:?}"
    );
    let opts = v[1]["options"].as_array().unwrap();
    assert!(opts.iter().any(|o| o["name"] == "addr"), "{opts:?}");
    assert!(opts.iter().all(|o| o["name"] != "crc"), "{opts:?}");
    let table = ok(&["devices"]);
    assert!(table.contains("siw_soft0") && table.contains("rxe_soft0"), "{table}");

    let v = &json_lines(&ok(&["info", "--json", "--crc", "on"]))[0];
    assert_eq!(v["name"], "siw_soft0");
    assert_eq!(v["transport_type"], 1, "IBV_TRANSPORT_IWARP");
    assert_eq!(v["attr"]["max_qp_rd_atom"], 128);
    assert_eq!(v["attr"]["atomic_cap"], true);
    assert_eq!(v["config"]["crc"], true);
    assert_eq!(v["config"]["mpa_revision"], 2);
    assert!(num(&v["config"], "max_ulpdu") > 0.0);
    assert!(v["hw_counters"].is_object(), "{v}");
    // ibv_devinfo -v's port section: one Ethernet port, up, the default P_Key.
    assert_eq!(v["phys_port_cnt"], 1);
    let port = &v["ports"][0];
    assert_eq!(
        (port["port"].as_u64(), port["state"].as_str()),
        (Some(1), Some("PORT_ACTIVE"))
    );
    assert_eq!(port["link_layer"], "Ethernet");
    assert_eq!(port["pkeys"][0], "0xffff");
    assert_eq!(port["gids"].as_array().map(Vec::len), Some(1));
    // ibv_devinfo's layout: short without -v, limits and tables with it.
    let text = ok(&["info"]);
    assert!(
        text.starts_with("hca_id:\tsiw_soft0\n\ttransport:\t\t\tiWARP (1)\n"),
        "{text}"
    );
    assert!(text.contains("\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"), "{text}");
    assert!(!text.contains("max_qp_rd_atom"), "limits only with -v: {text}");
    let text = ok(&["info", "-v"]);
    assert!(text.contains("\tmax_qp_rd_atom:\t\t\t128\n"), "{text}");
    assert!(text.contains("\t\t\tP_Key[  0]:\t\t0xffff\n"), "{text}");
    assert!(text.contains("MPA revision:                   2"), "{text}");
    let bad = run(&["info", "-d", "nosuch"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("siw_soft0") && err.contains("rxe_soft0"),
        "names the devices on offer: {err}"
    );
    // A device can be named by its provider too.
    assert!(ok(&["info", "-d", "iwarp"]).contains("hca_id:\tsiw_soft0"));
}

/// Issue 13 point 6: `info` on the RoCEv2 device shows ports, GIDs and MTUs like
/// `ibv_devinfo -v` on rxe: transport InfiniBand (0), GID 0 the bound address IPv4-mapped
/// ("RoCE v2"), P_Key 0xffff, the active MTU the device was given. (C3; unique address.)
#[test]
fn roce_info_like_ibv_devinfo() {
    let common = [
        "--provider",
        "roce",
        "--dev-opt",
        "addr=127.0.67.1",
        "--dev-opt",
        "mtu=4096",
    ];
    let v = &json_lines(&ok(&[&["info", "--json"][..], &common].concat()))[0];
    assert_eq!(v["name"], "rxe_soft0");
    assert_eq!(v["provider"], "roce");
    assert_eq!(v["transport"], "InfiniBand");
    assert_eq!(v["transport_type"], 0, "IBV_TRANSPORT_IB");
    let port = &v["ports"][0];
    assert_eq!(port["state"], "PORT_ACTIVE");
    assert_eq!(port["active_mtu"], 4096);
    assert_eq!(port["link_layer"], "Ethernet");
    assert_eq!(port["gids"][0], "0000:0000:0000:0000:0000:ffff:7f00:4301");
    assert_eq!(port["pkeys"][0], "0xffff");
    assert_eq!(v["config"]["addr"], "127.0.67.1");
    // rxe's hw_counters, fresh: nothing sent or received yet by a device just opened.
    assert_eq!(v["hw_counters"]["sent_pkts"], 0, "{v}");
    assert_eq!(v["hw_counters"]["rcvd_pkts"], 0, "{v}");
    assert!(v["hw_counters"]["retry_exceeded_err"].is_u64(), "{v}");
    let text = ok(&[&["info", "-v"][..], &common].concat());
    assert!(
        text.starts_with("hca_id:\trxe_soft0\n\ttransport:\t\t\tInfiniBand (0)\n"),
        "{text}"
    );
    assert!(text.contains("\t\t\tactive_mtu:\t\t4096 (5)\n"), "{text}");
    assert!(
        text.contains("\t\t\tGID[  0]:\t\t0000:0000:0000:0000:0000:ffff:7f00:4301, RoCE v2\n"),
        "{text}"
    );
    // -d takes the device name, as ibv_devinfo's does.
    let d = ok(&["info", "-d", "rxe_soft0", "--dev-opt", "addr=127.0.67.2"]);
    assert!(d.starts_with("hca_id:\trxe_soft0\n"), "{d}");
    // A bad provider setting is the provider's error, named.
    let out = run(&["info", "--provider", "roce", "--dev-opt", "mtu=1000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mtu") && err.contains("4096"), "{err}");
}

/// Issue 13 point 6: iWARP-only options are refused on `--provider roce` with a clear
/// error on every command that takes them, before anything connects; a device of another
/// provider, or a provider this build lacks, too.
#[test]
fn iwarp_options_are_refused_on_roce() {
    let cases: [&[&str]; 8] = [
        &["bench", "write", "--provider", "roce", "--crc", "on"],
        &["rping", "-c", "-a", "127.0.68.1", "--provider", "roce", "--crc", "on"],
        &[
            "rping",
            "-s",
            "-a",
            "127.0.68.1",
            "--provider",
            "roce",
            "--mpa-rev",
            "1",
        ],
        &["rping", "-c", "-a", "127.0.68.1", "--provider", "roce", "--p2p", "read"],
        &[
            "perftest",
            "write_bw",
            "127.0.68.1",
            "--provider",
            "roce",
            "--crc",
            "on",
        ],
        &["demo", "--provider", "roce", "--crc", "off"],
        &["info", "--provider", "roce", "--crc", "on"],
        &["nfs", "--provider", "roce", "--crc", "stat", "127.0.68.1:/x"],
    ];
    for args in cases {
        let out = run(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let flag = args
            .iter()
            .find(|a| a.starts_with("--") && !a.contains("provider"))
            .unwrap();
        assert!(
            err.contains(&format!("Error: {flag}")) && err.contains("iwarp provider") && err.contains("roce"),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    let out = run(&["bench", "write", "--provider", "ib"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("iwarp, roce"), "{err}");
    let out = run(&[
        "rping",
        "-c",
        "-a",
        "127.0.68.1",
        "--provider",
        "iwarp",
        "--device",
        "rxe_soft0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("rxe_soft0 belongs to the roce provider"),
        "{err}"
    );
}

/// Issue 13's yardstick for RoCE latency: `--lat --baseline udp` runs a busy-polling UDP
/// ping-pong of the same size and count in the same run and reports the p50 ratio, in
/// JSON and in the table; with --events both ends of the baseline block instead.
#[test]
fn bench_latency_with_udp_baseline() {
    for op in ["send", "write"] {
        let out = ok(&[
            "bench",
            op,
            "--lat",
            "--size",
            "8",
            "--iters",
            "100",
            "--baseline",
            "udp",
            "--json",
            "--loopback",
            "127.0.69.1",
        ]);
        let v = &json_lines(&out)[0];
        let p50 = num(&v["lat"], "p50_us");
        let b = &v["baseline"];
        assert_eq!(b["kind"], "udp", "{v}");
        assert_eq!(b["polling"], "busy-poll", "{v}");
        assert_eq!(b["ratio_of"], "lat.p50_us", "{v}");
        let bp50 = num(&b["lat"], "p50_us");
        assert!(bp50 > 0.0 && num(&b["lat"], "min_us") <= bp50, "{v}");
        assert!((num(b, "ratio") - p50 / bp50).abs() < 1e-9, "{v}");
    }
    let out = ok(&[
        "bench",
        "send",
        "--lat",
        "--events",
        "--iters",
        "100",
        "--baseline",
        "udp",
        "--json",
        "--loopback",
        "127.0.69.2",
    ]);
    assert_eq!(json_lines(&out)[0]["baseline"]["polling"], "blocking", "{out}");
    let text = ok(&[
        "bench",
        "send",
        "--lat",
        "--iters",
        "100",
        "--baseline",
        "udp",
        "--loopback",
        "127.0.69.3",
    ]);
    assert!(text.contains("Baseline        : plain UDP datagrams"), "{text}");
    assert!(text.contains("p50 ratio RDMA/UDP"), "{text}");
    // A bandwidth test has no UDP baseline (UDP has no flow control to compare with).
    let out = run(&["bench", "write", "--baseline", "udp"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--baseline udp is a latency baseline"),
        "{err}"
    );
}

/// Two processes: the `--listen` server's UDP echo answers the client's `--baseline udp`,
/// and the server, which exits after its one session, waits for the client's baseline to
/// end first (it would otherwise take the echo with it), then exits 0.
#[test]
fn bench_two_processes_udp_baseline() {
    let (server, addr, _err) = bench_server(&[]);
    let out = ok(&[
        "bench",
        "send",
        "--lat",
        "--size",
        "8",
        "--iters",
        "100",
        "--baseline",
        "udp",
        "--json",
        "--connect",
        &addr,
    ]);
    let v = &json_lines(&out)[0];
    assert_eq!(v["baseline"]["kind"], "udp", "{v}");
    assert!(num(&v["baseline"]["lat"], "p50_us") > 0.0, "{v}");
    let o = wait_output(server, Duration::from_secs(20));
    assert!(o.status.success(), "server: {}", String::from_utf8_lossy(&o.stderr));
}

/// Issue 13 point 6 (C3): `bench` runs unchanged on the RoCEv2 provider, both ends in one
/// process on their own loopback addresses: every operation's bandwidth and latency, and
/// the UDP latency baseline RoCE is measured against.
#[test]
fn bench_over_roce() {
    for (i, op) in ["write", "read", "send", "atomic"].into_iter().enumerate() {
        let lo = format!("127.0.76.{}", 10 * i + 1);
        let out = ok(&[
            "bench",
            op,
            "--provider",
            "roce",
            "--loopback",
            &lo,
            "--size",
            "4K",
            "--iters",
            "200",
            "--json",
        ]);
        let v = &json_lines(&out)[0];
        assert_eq!((v["op"].as_str(), v["messages"].as_u64()), (Some(op), Some(200)), "{v}");
        assert_eq!(v["crc"], false, "no MPA on roce: {v}");
        assert!(num(v, "gbit_per_s") > 0.0, "{v}");
        let out = ok(&[
            "bench",
            op,
            "--lat",
            "--provider",
            "roce",
            "--loopback",
            &lo,
            "--iters",
            "100",
            "--json",
        ]);
        assert!(num(&json_lines(&out)[0]["lat"], "p50_us") > 0.0, "{out}");
    }
    let text = ok(&[
        "bench",
        "send",
        "--lat",
        "--size",
        "8",
        "--iters",
        "200",
        "--provider",
        "roce",
        "--loopback",
        "127.0.76.51",
        "--baseline",
        "udp",
    ]);
    assert!(text.contains("Transport type : InfiniBand"), "{text}");
    assert!(text.contains("rxe_soft0 (roce: RoCEv2"), "{text}");
    assert!(text.contains("p50 ratio RDMA/UDP"), "{text}");
}

#[test]
fn completions_and_man_pages() {
    let bash = ok(&["completions", "bash"]);
    assert!(bash.contains("_softrdma()") && bash.contains("perftest"), "{bash}");
    assert!(ok(&["completions", "zsh"]).contains("#compdef softrdma"));
    assert!(!run(&["completions", "tcsh"]).status.success());
    let dir = std::env::temp_dir().join(format!("softrdma-man-{}", std::process::id()));
    let listed = ok(&["man", dir.to_str().unwrap()]);
    for page in [
        "softrdma.1",
        "softrdma-bench.1",
        "softrdma-rping.1",
        "softrdma-nfs-get.1",
    ] {
        let p = dir.join(page);
        assert!(p.exists() && listed.contains(page), "{page}: {listed}");
        let roff = std::fs::read_to_string(&p).unwrap();
        assert!(roff.starts_with(".ie") || roff.contains(".TH"), "{page} is not roff");
    }
    // The logging switch is documented where users look: `--help` and the man page.
    let help = ok(&["--help"]);
    assert!(
        help.contains("RUST_LOG=info") && help.contains("stderr is a terminal"),
        "{help}"
    );
    let main_page = std::fs::read_to_string(dir.join("softrdma.1")).unwrap();
    assert!(main_page.contains("RUST_LOG"), "softrdma.1 says nothing of RUST_LOG");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_closed_pipe_ends_quietly() {
    // `softrdma completions bash | head -0`: the reader is gone before the first write.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

// ---------------------------------------------------------------------------------------
// The bench server's resource model (issue 12: "the same resource model applies to every
// server softrdma has": idle timeout, one client at a time with a clear refusal, a memory
// cap per session, no spinning while idle; Diagnostics: failed sessions exit non-zero).

/// `softrdma bench --listen 127.0.0.1:0 EXTRA`: the child, its address, its stderr reader.
fn bench_server(extra: &[&str]) -> (Child, String, BufReader<std::process::ChildStderr>) {
    let mut server = Command::new(BIN)
        .args(["bench", "--listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (server, addr, err)
}

/// A bench client running `args` against `addr` with `--progress`, returned once it has
/// written its first progress output (its test is running).
fn running_client(addr: &str, args: &[&str]) -> Child {
    let mut c = Command::new(BIN)
        .args(["bench", "--connect", addr, "--progress"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut e = c.stderr.take().unwrap();
    let mut b = [0u8; 1];
    assert_eq!(e.read(&mut b).unwrap(), 1, "the client's progress output");
    // Keep draining so the client never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut e, &mut std::io::sink()));
    c
}

fn proc_cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

/// A client that stops mid-test (SIGSTOP: its connection stays open, nothing comes) is
/// dropped after `--idle-timeout` with a message naming its QP and address; the server
/// exits non-zero and sleeps meanwhile (CPU measured from /proc, not wall clock).
#[test]
fn bench_server_drops_a_silent_client_and_exits_non_zero() {
    let (server, addr, mut err) = bench_server(&["--idle-timeout", "3"]);
    let client = running_client(&addr, &["send", "--size", "4K", "--duration", "100"]);
    let pid = client.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(500));
    let c0 = proc_cpu_secs(server.id());
    std::thread::sleep(Duration::from_millis(1500));
    let c1 = proc_cpu_secs(server.id());
    let sout = wait_output(server, Duration::from_secs(30));
    let _ = Command::new("kill").args(["-KILL", &pid]).status();
    let _ = wait_output(client, Duration::from_secs(10));
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(!sout.status.success(), "{rest}");
    assert!(
        rest.contains("client idle: no message for 3 s (--idle-timeout)"),
        "{rest}"
    );
    assert!(rest.contains("with peer 127.0.0.1:") && rest.contains("QP "), "{rest}");
    assert!(rest.contains("bench server: session failed"), "{rest}");
    assert!(c1 - c0 < 0.1, "idle server used {:.3} s CPU in 1.5 s", c1 - c0);
}

/// Issue 19: a client that dies in the middle of its test (SIGKILL: the kernel closes its
/// connection as a normal disconnect would) fails the session: the server says so, naming
/// the QP and the peer, and exits non-zero, for one-sided and two-sided tests alike.
#[test]
fn bench_server_reports_a_client_that_died_and_exits_non_zero() {
    for op in ["write", "send"] {
        let (server, addr, mut err) = bench_server(&[]);
        let mut client = running_client(&addr, &[op, "--size", "4K", "--duration", "100"]);
        client.kill().unwrap();
        let _ = client.wait();
        let sout = wait_output(server, Duration::from_secs(30));
        let mut rest = String::new();
        err.read_to_string(&mut rest).unwrap();
        assert!(!sout.status.success(), "{op}: {rest}");
        let last = rest.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("Error: bench server: session failed: test 0 failed: QP ")
                && last.contains("with peer 127.0.0.1:")
                && last.contains("the client disconnected before the end of its test"),
            "{op}: {rest}"
        );
    }
}

/// While one client's session runs, a second client is refused at once with the reason,
/// and the first session completes; a session over `--max-session-mem` is refused too.
#[test]
fn bench_server_refuses_a_second_client_and_oversized_sessions() {
    let (server, addr, mut err) = bench_server(&["--max-session-mem", "1M"]);
    let big = run(&[
        "bench",
        "write",
        "--connect",
        &addr,
        "--size",
        "1M",
        "--qps",
        "2",
        "--iters",
        "10",
    ]);
    assert!(!big.status.success());
    let e = String::from_utf8_lossy(&big.stderr);
    assert!(
        e.contains("the server refused: softrdma bench: 2 QPs of 1048576 bytes exceed"),
        "{e}"
    );
    let first = running_client(&addr, &["send", "--size", "4K", "--duration", "4", "--json"]);
    let t0 = Instant::now();
    let second = run(&["bench", "write", "--connect", &addr, "--size", "4K", "--iters", "10"]);
    assert!(t0.elapsed() < Duration::from_secs(3), "refusal took {:?}", t0.elapsed());
    assert!(!second.status.success());
    let e2 = String::from_utf8_lossy(&second.stderr);
    assert!(
        e2.contains("the server refused: softrdma bench: busy: serving the session of 127.0.0.1:"),
        "{e2}"
    );
    let out = wait_output(first, Duration::from_secs(30));
    assert!(out.status.success());
    assert_eq!(json_lines(&String::from_utf8(out.stdout).unwrap()).len(), 1);
    let sout = wait_output(server, Duration::from_secs(20));
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(sout.status.success(), "{rest}");
    assert!(rest.contains("refusing 127.0.0.1:") && rest.contains("busy"), "{rest}");
}

/// The bench server's TCP baseline listener is bounded too: a header asking for a 4 GiB
/// message is refused (connection closed, no allocation) and a connection that sends
/// nothing is closed after `--idle-timeout`.
#[test]
fn bench_server_baseline_port_is_bounded() {
    use std::io::Write;
    let (mut server, addr, mut err) = bench_server(&["--idle-timeout", "2", "--max-session-mem", "16M"]);
    // The server listens on two TCP ports: iWARP (`addr`) and the baseline.
    let iwarp: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let ports: Vec<u16> = listening_ports(server.id())
        .into_iter()
        .filter(|p| *p != iwarp)
        .collect();
    assert_eq!(ports.len(), 1, "{ports:?}");
    let mut refused = 0;
    let mut dropped_silent = false;
    for port in ports {
        // (a) an oversized RPC header
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut h = [0u8; 24];
        h[0] = 3;
        h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        h[8..12].copy_from_slice(&8u32.to_le_bytes());
        h[16..24].copy_from_slice(&1u64.to_le_bytes());
        let _ = s.write_all(&h);
        let mut b = [0u8; 1];
        if matches!(s.read(&mut b), Ok(0)) {
            refused += 1;
        }
        // (b) a silent connection, closed by the server within its idle timeout (+ margin)
        let mut q = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        q.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t0 = Instant::now();
        if matches!(q.read(&mut b), Ok(0)) && t0.elapsed() < Duration::from_secs(9) {
            dropped_silent = true;
        }
    }
    server.kill().unwrap();
    let _ = server.wait();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert_eq!(refused, 1, "{rest}");
    assert!(dropped_silent, "{rest}");
    assert!(rest.contains("exceeds --max-session-mem"), "{rest}");
}

/// The TCP ports process `pid` listens on (from /proc/PID/fd and /proc/net/tcp).
fn listening_ports(pid: u32) -> Vec<u16> {
    let mut inodes = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy().into_owned();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.push(i.to_string());
            }
        }
    }
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let mut ports: Vec<u16> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]))
                .then(|| u16::from_str_radix(f[1].rsplit(':').next().unwrap(), 16).unwrap())
        })
        .collect();
    ports.sort();
    ports.dedup();
    ports
}

/// Issue 12, Diagnostics: `rpc serve` says at the default log level (no
/// RUST_LOG) that a client went away, naming its QP and address.
#[test]
fn rpc_server_reports_a_closed_client_at_default_log_level() {
    use std::io::{BufRead, BufReader};
    let mut srv = std::process::Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["rpc", "serve", "--tcp", "127.0.0.1:0", "--rdma", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(srv.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let rdma = first.split_whitespace().last().unwrap_or_default().to_string();
    assert!(first.contains("RPC-over-RDMA"), "{first}");
    let (tx, rx) = std::sync::mpsc::channel();
    let err = srv.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    ok(&["rpc", "call", "--transport", "rdma", "--addr", &rdma, "--proc", "null"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen = Vec::new();
    let found = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(l) if l.contains("peer closed the connection") => break Some(l),
            Ok(l) => seen.push(l),
            Err(_) => break None,
        }
    };
    let _ = srv.kill();
    let _ = srv.wait();
    let line = found.unwrap_or_else(|| panic!("no 'peer closed' line; stderr: {seen:?}"));
    assert!(line.contains("qp=") && line.contains("peer=127.0.0.1:"), "{line}");
}

/// `rpc bench --json` uses the schema and units of `bench --json` (docs/json.md).
#[test]
fn rpc_bench_json_has_the_family_units() {
    let v = &json_lines(&ok(&["rpc", "bench", "--size", "64K", "--calls", "50", "--json"]))[0];
    assert_eq!(
        (v["tool"].as_str(), v["proc"].as_str()),
        (Some("rpc bench"), Some("READ"))
    );
    assert_eq!((v["size"].as_u64(), v["calls"].as_u64()), (Some(65536), Some(50)));
    for t in ["tcp", "rdma"] {
        let r = &v[t];
        let (mb, g, c) = (num(r, "mb_per_s"), num(r, "gbit_per_s"), num(r, "calls_per_s"));
        assert!(mb > 0.0, "{v}");
        assert!((g - mb * 1048576.0 * 8.0 / 1e9).abs() <= g * 1e-9, "{v}");
        assert!((c - mb * 1048576.0 / 65536.0).abs() <= c * 1e-9, "{v}");
    }
    assert!((num(v, "rdma_tcp_ratio") - num(&v["rdma"], "mb_per_s") / num(&v["tcp"], "mb_per_s")).abs() < 1e-9);
    // issue 18: the transports alternate in rounds of 25 calls per caller (50 calls: 2)
    let r = &v["rounds"];
    assert_eq!(r["rounds"].as_u64(), Some(2), "{v}");
    assert!(
        num(r, "min") > 0.0 && num(r, "min") <= num(r, "median") && num(r, "median") <= num(r, "max"),
        "{v}"
    );
    let v = &json_lines(&ok(&[
        "rpc",
        "bench",
        "--size",
        "4K",
        "--calls",
        "20",
        "--transport",
        "tcp",
        "--json",
    ]))[0];
    assert!(
        v["rdma"].is_null() && v["rdma_tcp_ratio"].is_null() && v["rounds"].is_null(),
        "{v}"
    );
}

/// `rpc bench --proc null|echo` (issue 18): small calls' round trips over both transports in
/// one run, the ratio of their medians, and the one wait mode both callers used (events by
/// default, `--busy-poll`), named in the JSON and the text.
#[test]
fn rpc_bench_small_calls_report_round_trips() {
    for (proc_, size, busy) in [
        ("null", 0, false),
        ("echo", 64, false),
        ("null", 0, true),
        ("echo", 64, true),
    ] {
        let mut a = vec!["rpc", "bench", "--proc", proc_, "--calls", "200", "--json"];
        if busy {
            a.push("--busy-poll");
        }
        let v = &json_lines(&ok(&a))[0];
        let (mode, words) = if busy {
            ("busy-poll", "both callers busy-poll")
        } else {
            ("events", "both callers sleep at once")
        };
        assert_eq!(v["mode"].as_str(), Some(mode), "{v}");
        assert!(v["wait"].as_str().is_some_and(|w| w.contains(words)), "{v}");
        assert_eq!(v["proc"].as_str(), Some(proc_.to_uppercase().as_str()), "{v}");
        assert_eq!(
            (v["size"].as_u64(), v["calls"].as_u64()),
            (Some(size), Some(200)),
            "{v}"
        );
        for t in ["tcp", "rdma"] {
            let l = &v[t];
            assert!(num(l, "min_us") > 0.0 && num(l, "min_us") <= num(l, "p50_us"), "{v}");
            assert!(
                num(l, "p50_us") <= num(l, "p99_us") && num(l, "p99_us") <= num(l, "max_us"),
                "{v}"
            );
        }
        let ratio = num(&v["rdma"], "p50_us") / num(&v["tcp"], "p50_us");
        assert!((num(v, "rdma_tcp_ratio") - ratio).abs() < 1e-9, "{v}");
    }
    let out = run(&["rpc", "bench", "--proc", "null", "--threads", "2"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("--threads"), "{e}");
    let text = ok(&["rpc", "bench", "--proc", "null", "--calls", "100", "--busy-poll"]);
    assert!(text.contains("mode busy-poll"), "{text}");
    let out = run(&["rpc", "bench", "--size", "64K", "--calls", "20", "--busy-poll"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("--busy-poll"), "{e}");
}

/// `softrdma scale` (issue 18, "Scale"): both kinds of connection measured in one run, with
/// the figures in range; idle connections cost no CPU (no thread per connection, nobody
/// spinning: under 0.3 CPU s over a 1 s idle window even on a loaded machine).
#[test]
fn scale_measures_rdma_and_tcp_connections_in_one_run() {
    let out = ok(&[
        "scale",
        "--qps",
        "40",
        "--active",
        "4",
        "--idle-secs",
        "1",
        "--duration",
        "0.5",
        "--size",
        "16K",
        "--json",
    ]);
    let v = &json_lines(&out)[0];
    assert_eq!(v["tool"], "scale", "{v}");
    assert_eq!(v["conns"], 40, "{v}");
    for kind in ["rdma", "tcp"] {
        let k = &v[kind];
        assert!(num(k, "setup_per_s") > 0.0, "{kind}: {v}");
        // Two endpoints per connection, each holding one socket descriptor.
        let fds = num(k, "fds_per_conn");
        assert!((1.5..=3.0).contains(&fds), "{kind} fds per connection {fds}: {v}");
        let idle = num(k, "idle_cpu_s");
        assert!(idle < 0.3, "{kind}: idle connections used {idle} CPU s in 1 s: {v}");
        let f = &k["fair"];
        let per = f["gbit_per_s"].as_array().unwrap();
        assert_eq!(per.len(), 4, "{kind}: {v}");
        assert!(num(f, "gbit_per_s_total") > 0.0, "{kind}: {v}");
        let jain = num(f, "jain");
        assert!(jain > 0.0 && jain <= 1.0 + 1e-9, "{kind}: {v}");
    }
    let out = run(&["scale", "--qps", "4", "--active", "8"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--active 8 is more than --qps 4"), "{err}");
}
