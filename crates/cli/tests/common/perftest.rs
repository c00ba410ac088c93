//! What the perftest interop files (`interop_perftest.rs` over siw, `interop_perftest_rxe.rs`
//! over rxe) check of one case: both exit statuses, both result lines (bytes and iterations,
//! and where perftest prints the other side's figures, that they are ours).

#![allow(dead_code)]

use super::lab_common::exit_of;
use std::process::Output;

/// Message size of every case.
pub const SIZE: u64 = 4096;
/// Iterations of every case.
pub const ITERS: u64 = 100;

/// The line after perftest's (and our) `#bytes` header, split into fields.
pub fn result_fields(log: &str) -> Option<Vec<String>> {
    let mut lines = log.lines();
    lines.find(|l| l.trim_start().starts_with("#bytes"))?;
    let l = lines.next()?;
    Some(l.split_whitespace().map(str::to_owned).collect())
}

/// One case's outcome: our process and perftest in the guest.
pub struct Run {
    pub ours_ok: bool,
    pub ours: String,
    pub guest_exit: Option<i32>,
    pub guest: String,
}

/// Our process's output and perftest's log (with `exit=N` last).
pub fn run_of(out: Output, guest: String) -> Run {
    let mut ours = String::from_utf8_lossy(&out.stdout).into_owned();
    ours.push_str(&String::from_utf8_lossy(&out.stderr));
    Run {
        ours_ok: out.status.success(),
        ours,
        guest_exit: exit_of(&guest),
        guest,
    }
}

impl Run {
    pub fn assert_ok(&self, what: &str) {
        assert!(
            self.ours_ok,
            "{what}: softrdma failed:\n{}\nguest:\n{}",
            self.ours, self.guest
        );
        assert_eq!(
            self.guest_exit,
            Some(0),
            "{what}: perftest failed:\n{}\nours:\n{}",
            self.guest,
            self.ours
        );
        for bad in ["Bad wc status", "Completion with error", "Unable to", "Failed"] {
            assert!(
                !self.guest.contains(bad),
                "{what}: perftest printed {bad:?}:\n{}",
                self.guest
            );
        }
    }
    pub fn ours_line(&self) -> Vec<String> {
        result_fields(&self.ours).unwrap_or_else(|| panic!("no result line from softrdma:\n{}", self.ours))
    }
    pub fn guest_line(&self) -> Vec<String> {
        result_fields(&self.guest).unwrap_or_else(|| panic!("no result line from perftest:\n{}", self.guest))
    }
}

/// `#bytes` and `#iterations` as run; the figures numbers, finite and positive when `strict`.
/// perftest's own figures are checked loosely: under TCG its clock calibration
/// (`sample_get_cpu_mhz`) sometimes fails (r^2 < 0.9) and then, with -F, it prints inf/nan
/// (docs/interop-perftest.md, P5).
pub fn assert_size_iters(f: &[String], who: &str, strict: bool) {
    assert!(f.len() >= 5, "{who}: short result line {f:?}");
    assert_eq!(f[0], SIZE.to_string(), "{who}: #bytes in {f:?}");
    assert_eq!(f[1], ITERS.to_string(), "{who}: #iterations in {f:?}");
    for v in &f[2..5] {
        let x: f64 = v.parse().unwrap_or_else(|_| panic!("{who}: {v:?} in {f:?}"));
        assert!(!strict || (x.is_finite() && x >= 0.0), "{who}: {f:?}");
    }
}

/// write/read bw: the server prints the client's figures (xchg_bw_reports), so both lines match;
/// `ours_measured`: we are the client, so the figures are ours.
pub fn bw_pair(r: &Run, what: &str, ours_measured: bool) {
    r.assert_ok(what);
    let (o, g) = (r.ours_line(), r.guest_line());
    assert_size_iters(&o, "softrdma", ours_measured);
    assert_size_iters(&g, "perftest", ours_measured);
    assert_eq!(&o[..5], &g[..5], "{what}: the server prints the client's report");
    if ours_measured {
        assert!(o[3].parse::<f64>().unwrap() > 0.0, "{what}: zero bandwidth {o:?}");
    }
}

/// Each side measures itself (send bw, the ping-pong latencies).
pub fn own_lines(r: &Run, what: &str, lat: bool) {
    r.assert_ok(what);
    let (o, g) = (r.ours_line(), r.guest_line());
    assert_size_iters(&o, "softrdma", true);
    assert_size_iters(&g, "perftest", false);
    if lat {
        // t_min <= t_typical <= t_max, all positive.
        let v: Vec<f64> = o[2..5].iter().map(|x| x.parse().unwrap()).collect();
        assert!(v[0] > 0.0 && v[0] <= v[2] && v[2] <= v[1], "{what}: {o:?}");
    }
}

/// Which end perftest is; softrdma is the other.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Perftest {
    /// perftest's server in the guest, our client in the namespace.
    Server,
    /// Our server in the namespace, perftest's client in the guest.
    Client,
}

/// The checks for `test` with perftest as `perftest`, and that our output contains `ours_has`.
pub fn check(r: &Run, test: &str, perftest: Perftest, ours_has: Option<&str>) {
    let our_client = perftest == Perftest::Server;
    match test {
        "write_bw" | "read_bw" => bw_pair(r, test, our_client),
        "read_lat" => {
            r.assert_ok(test);
            if our_client {
                assert_size_iters(&r.ours_line(), "softrdma", true);
                // perftest's read_lat server measures nothing and prints no result line.
                assert!(result_fields(&r.guest).is_none(), "{}", r.guest);
            } else {
                assert_size_iters(&r.guest_line(), "perftest", false);
            }
        }
        _ => own_lines(r, test, test.ends_with("_lat")),
    }
    if let Some(want) = ours_has {
        assert!(r.ours.contains(want), "{}", r.ours);
    }
}
