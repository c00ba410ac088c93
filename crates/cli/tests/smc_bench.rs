//! `softrdma smc bench` (issue 15's request/response latency benchmark): a short in-process
//! run over two soft RoCEv2 devices on 127.118.40.x prints the shape its users and
//! docs/performance.md rely on (both transports, p50/p99/mean, the wait mode and the
//! ratios), as text and as JSON. Correctness of the output, not a timing: the figures are
//! only checked to be positive and finite, and every round trip is checked by the bench
//! itself (the response must equal the request).
//!
//! Requirements: smcr-ipoibcm.md D2 (SMC-R over soft RoCEv2, the benchmark row of issue 15).

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

fn bench(extra: &[&str], server: &str, client: &str) -> std::process::Output {
    let mut args = vec![
        "smc",
        "bench",
        "-n",
        "40",
        "--warmup",
        "5",
        "--server-addr",
        server,
        "--client-addr",
        client,
    ];
    args.extend_from_slice(extra);
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    out
}

#[test]
fn smc_bench_json_has_both_transports_and_ratios() {
    let out = bench(&["--json", "--size", "64"], "127.118.40.1", "127.118.40.2");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["bench"], "smc_rr");
    assert_eq!(v["size"], 64);
    assert_eq!(v["iters"], 40);
    assert_eq!(v["wait"], "blocking");
    assert_eq!(v["setup"], "in-process");
    assert_eq!(v["smc"]["mode"], "SMC-R", "{v}");
    assert_eq!(v["tcp"]["mode"], "TCP");
    for t in ["smc", "tcp"] {
        assert_eq!(v[t]["round_trips"], 40, "{v}");
        for k in ["p50_us", "p99_us", "avg_us", "min_us", "max_us"] {
            let x = v[t]["latency"][k].as_f64().unwrap();
            assert!(x > 0.0 && x.is_finite(), "{t}.{k} = {x}");
        }
        assert!(v[t]["round_trips_per_s"].as_f64().unwrap() > 0.0);
    }
    for k in ["ratio_p50", "ratio_p99", "ratio_mean"] {
        let x = v[k].as_f64().unwrap();
        assert!(x > 0.0 && x.is_finite(), "{k} = {x}");
    }
}

#[test]
fn smc_bench_text_busy_names_the_wait_mode() {
    let out = bench(&["--busy", "--size", "100"], "127.118.41.1", "127.118.41.2");
    let t = String::from_utf8(out.stdout).unwrap();
    assert!(t.contains("100 B request/response, 40 round trips"), "{t}");
    assert!(t.contains("busy reads on both sides"), "{t}");
    assert!(t.lines().any(|l| l.starts_with("SMC-R ")), "{t}");
    assert!(t.lines().any(|l| l.starts_with("TCP ")), "{t}");
    assert!(t.contains("SMC-R / TCP latency: p50 "), "{t}");
}

#[test]
fn smc_bench_refuses_size_zero() {
    let out = Command::new(BIN)
        .args(["smc", "bench", "--size", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--size"));
}
