//! The perftest interop files (`interop_perftest.rs` over siw, `interop_perftest_rxe.rs` over
//! rxe) share this: the guest-server and guest-client runners, parameterised by a [`Path`]
//! (guest device, addresses, how to see that a listener is up), the `perftest_cases!` macro
//! that makes one `#[test]` per case, and what each case checks: both exit statuses, both
//! result lines (bytes and iterations, and where perftest prints the other side's figures,
//! that they are ours), the guest kernel log.

#![allow(dead_code)]

use super::child::lines_once_ready;
use super::lab_common::{Lab, NS, exit_of, next_port};
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

/// Message size of every RC case.
pub const SIZE: u64 = 4096;
/// Message size of the UD cases: the path MTU (rxe on the lab's 1500-octet link: 1024), the
/// largest a UD message may be.
pub const UD_SIZE: u64 = 1024;
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
pub fn assert_size_iters(f: &[String], who: &str, size: u64, strict: bool) {
    assert!(f.len() >= 5, "{who}: short result line {f:?}");
    assert_eq!(f[0], size.to_string(), "{who}: #bytes in {f:?}");
    assert_eq!(f[1], ITERS.to_string(), "{who}: #iterations in {f:?}");
    for v in &f[2..5] {
        let x: f64 = v.parse().unwrap_or_else(|_| panic!("{who}: {v:?} in {f:?}"));
        assert!(!strict || (x.is_finite() && x >= 0.0), "{who}: {f:?}");
    }
}

/// write/read bw: the server prints the client's figures (xchg_bw_reports), so both lines match;
/// `ours_measured`: we are the client, so the figures are ours.
pub fn bw_pair(r: &Run, what: &str, size: u64, ours_measured: bool) {
    r.assert_ok(what);
    let (o, g) = (r.ours_line(), r.guest_line());
    assert_size_iters(&o, "softrdma", size, ours_measured);
    assert_size_iters(&g, "perftest", size, ours_measured);
    assert_eq!(&o[..5], &g[..5], "{what}: the server prints the client's report");
    if ours_measured {
        assert!(o[3].parse::<f64>().unwrap() > 0.0, "{what}: zero bandwidth {o:?}");
    }
}

/// Each side measures itself (send bw, the ping-pong latencies).
pub fn own_lines(r: &Run, what: &str, size: u64, lat: bool) {
    r.assert_ok(what);
    let (o, g) = (r.ours_line(), r.guest_line());
    assert_size_iters(&o, "softrdma", size, true);
    assert_size_iters(&g, "perftest", size, false);
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

/// perftest's `-c`: the data QP's connection type.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Conn {
    Rc,
    /// Unreliable datagrams (send_bw, send_lat over RoCE): `-c UD` on both ends.
    Ud,
}

/// One case: which test, which end perftest is, the connection type, and a text our output
/// must contain.
pub struct Case<'a> {
    pub test: &'a str,
    pub perftest: Perftest,
    pub conn: Conn,
    pub ours_has: Option<&'a str>,
}

impl Case<'_> {
    pub fn size(&self) -> u64 {
        match self.conn {
            Conn::Rc => SIZE,
            Conn::Ud => UD_SIZE,
        }
    }
    /// The options both ends get: perftest's and ours have the same letters.
    fn opts(&self) -> String {
        let c = if self.conn == Conn::Ud { "-c UD " } else { "" };
        format!("{c}-s {} -n {ITERS}", self.size())
    }
}

/// The checks for `c` (its test, and perftest's end).
pub fn check(r: &Run, c: &Case) {
    let (test, size) = (c.test, c.size());
    let our_client = c.perftest == Perftest::Server;
    match test {
        "write_bw" | "read_bw" => bw_pair(r, test, size, our_client),
        "read_lat" => {
            r.assert_ok(test);
            if our_client {
                assert_size_iters(&r.ours_line(), "softrdma", size, true);
                // perftest's read_lat server measures nothing and prints no result line.
                assert!(result_fields(&r.guest).is_none(), "{}", r.guest);
            } else {
                assert_size_iters(&r.guest_line(), "perftest", size, false);
            }
        }
        _ => own_lines(r, test, size, test.ends_with("_lat")),
    }
    if let Some(want) = c.ours_has {
        assert!(r.ours.contains(want), "{}", r.ours);
    }
    if c.conn == Conn::Ud {
        assert!(r.ours.contains("Connection type : UD"), "{}", r.ours);
    }
}

/// Where a file's cases run: the guest's device and addresses, our device.
pub struct Path {
    /// The guest's device (`-d`).
    pub dev: &'static str,
    /// Where our client connects (perftest's server listens on the wildcard address).
    pub guest_ip: &'static str,
    /// Where perftest's client connects: our server's address.
    pub host_ip: &'static str,
    /// Our options on either end (the provider).
    pub ours: &'static [&'static str],
    /// A guest shell test that succeeds once perftest listens on port `{p}`.
    pub guest_listening: &'static str,
    /// `Transport type : ..` in our header.
    pub transport: &'static str,
    /// Ports `base..base + span`, away from the other file's.
    pub ports: (u16, u16),
    /// Prefix of the guest's log files.
    pub log: &'static str,
}

impl Path {
    fn our_cmd(&self, c: &Case) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", NS, BIN, "perftest", c.test])
            .args(self.ours)
            .args(c.opts().split_whitespace())
            .args(["--timeout", "30"])
            .env("RUST_BACKTRACE", "0");
        cmd
    }

    /// perftest `ib_TEST -R -d DEV` as the server in the guest (wildcard address), our client.
    pub fn guest_server_case(&self, lab: &Lab, c: &Case) -> Run {
        let p = next_port(self.ports.0, self.ports.1);
        let (test, dev, log) = (c.test, self.dev, self.log);
        let cmd = format!("ib_{test} -R -F -d {dev} -p {p} {}", c.opts());
        let listening = self.guest_listening.replace("{p}", &p.to_string());
        let start = format!(
            "rm -f /tmp/{log}s-{p}.log; (timeout 120 {cmd} >/tmp/{log}s-{p}.log 2>&1; echo exit=$? >>/tmp/{log}s-{p}.log) >/dev/null 2>&1 &\n\
             i=0; while [ $i -lt 200 ]; do {listening} && exit 0; i=$((i+1)); sleep 0.05; done; \
             echo 'perftest did not listen'; cat /tmp/{log}s-{p}.log; exit 1"
        );
        let (rc, out) = lab.exec(&start, 30);
        assert_eq!(rc, 0, "guest ib_{test} -R server: {out}");
        let out = self
            .our_cmd(c)
            .args([self.guest_ip, "-p", &p.to_string()])
            .output()
            .expect("softrdma perftest client");
        let (_, guest) = lab.exec(
            &format!(
                "i=0; while [ $i -lt 300 ]; do grep -q '^exit=' /tmp/{log}s-{p}.log && break; i=$((i+1)); sleep 0.1; done; \
                 grep -q '^exit=' /tmp/{log}s-{p}.log || {{ pkill -f '{cmd}'; sleep 0.3; echo killed; }}; \
                 cat /tmp/{log}s-{p}.log"
            ),
            60,
        );
        lab.kernel_check();
        run_of(out, guest)
    }

    /// Our server in the namespace on `host_ip`, perftest `ib_TEST -R -d DEV` as the client in
    /// the guest.
    pub fn guest_client_case(&self, lab: &Lab, c: &Case) -> Run {
        let p = next_port(self.ports.0, self.ports.1);
        let (test, dev, log, host) = (c.test, self.dev, self.log, self.host_ip);
        let mut child = self
            .our_cmd(c)
            .args(["--bind", host, "-p", &p.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("softrdma perftest server");
        // Printed once the listener exists (as perftest prints it).
        let lines = lines_once_ready(&mut child, "* Waiting for client to connect", Duration::from_secs(10));
        let (_, guest) = lab.exec(
            &format!(
                "timeout 120 ib_{test} -R -F -d {dev} -p {p} {} {host} >/tmp/{log}c-{p}.log 2>&1; \
                 echo exit=$? >>/tmp/{log}c-{p}.log; cat /tmp/{log}c-{p}.log",
                c.opts()
            ),
            150,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if child.try_wait().unwrap().is_none() {
            let _ = child.kill();
        }
        let status = child.wait().unwrap();
        let mut ours = String::new();
        while let Ok(l) = lines.recv_timeout(Duration::from_millis(500)) {
            ours.push_str(&l);
            ours.push('\n');
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut ours);
        }
        lab.kernel_check();
        Run {
            ours_ok: status.success(),
            ours,
            guest_exit: exit_of(&guest),
            guest,
        }
    }

    /// Runs `c` with perftest at its end and checks it.
    pub fn case(&self, lab: &Lab, c: &Case) {
        let r = match c.perftest {
            Perftest::Server => self.guest_server_case(lab, c),
            Perftest::Client => self.guest_client_case(lab, c),
        };
        check(&r, c);
        let t = format!("Transport type : {}", self.transport);
        assert!(r.ours.contains(&t), "{}", r.ours);
    }
}

/// `name: "test", Server|Client, Rc|Ud, ours_has;`: one `#[test]` each, calling the file's
/// `case(name, Case)` (which takes the lab and runs `Path::case`).
#[macro_export]
macro_rules! perftest_cases {
    ($($(#[$attr:meta])* $name:ident: $test:literal, $perftest:ident, $conn:ident, $ours_has:expr;)*) => {$(
        $(#[$attr])*
        #[test]
        fn $name() {
            case(
                stringify!($name),
                &perftest_common::Case {
                    test: $test,
                    perftest: perftest_common::Perftest::$perftest,
                    conn: perftest_common::Conn::$conn,
                    ours_has: $ours_has,
                },
            );
        }
    )*};
}
