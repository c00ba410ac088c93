//! Network-namespace helpers shared by the IPoIB tests (`ipoib_netns.rs`,
//! `ipoib_cm_netns.rs`): shell commands, a [`Lab`] of namespaces and processes removed on
//! drop, namespaces joined by a veth pair, a tcpdump [`capture`] on an interface inside a
//! namespace (a `testsupport::Capture`), the `softrdma ipoib up` daemon and its `show` output. Include with `#[path = "common/netns.rs"] mod netns;` and pass
//! `env!("CARGO_BIN_EXE_softrdma")` where a function takes `bin`.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use testsupport::Capture;

/// Whether `prog` is on PATH.
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Whether the test runs as root (namespaces, veth, TUN).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// iputils ping (the `-M do` and "message too long" of issue 16; busybox has neither).
pub fn have_iputils_ping() -> bool {
    Command::new("ping")
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("iputils"))
        .unwrap_or(false)
}

/// Runs `cmd` with sh: success and stdout + stderr.
pub fn sh(cmd: &str) -> (bool, String) {
    let o = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s += &String::from_utf8_lossy(&o.stderr);
    (o.status.success(), s)
}

/// Runs `cmd`, failing the test if it fails; its output.
pub fn must(cmd: &str) -> String {
    let (ok, out) = sh(cmd);
    assert!(ok, "{cmd}: {out}");
    out
}

/// Namespaces and processes, removed on drop (also when a check fails).
pub struct Lab {
    /// Namespaces to delete.
    pub ns: Vec<String>,
    /// Processes to kill.
    pub procs: Vec<Child>,
}

impl Lab {
    /// Creates the namespaces `ns` (loopback up) and joins `ns[0]` and `ns[1]` with the
    /// veth pair `veth`, addressed `{prefix}.1/24` and `{prefix}.2/24`, MTU 9,000.
    pub fn veth_pair(ns: [String; 2], veth: [String; 2], prefix: &str) -> Lab {
        let lab = Lab {
            ns: ns.to_vec(),
            procs: Vec::new(),
        };
        for n in &ns {
            must(&format!("ip netns add {n} && ip -n {n} link set lo up"));
        }
        must(&format!("ip link add {} type veth peer name {}", veth[0], veth[1]));
        for i in 0..2 {
            must(&format!(
                "ip link set {v} netns {n} && ip -n {n} addr add {prefix}.{k}/24 dev {v} && ip -n {n} link set {v} mtu 9000 up",
                v = veth[i],
                n = ns[i],
                k = i + 1
            ));
        }
        lab
    }

    /// Starts a process in namespace `ns` (stdout and stderr discarded), killed on drop.
    pub fn spawn_in(&mut self, ns: &str, args: &[&str]) {
        let c = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {args:?} in {ns}: {e}"));
        self.procs.push(c);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.ns {
            let _ = sh(&format!("ip netns del {n}"));
        }
    }
}

/// A tcpdump on interface `iface` inside namespace `ns`: `ip netns exec NS tcpdump -i IFACE -U
/// --immediate-mode -n EXTRA -w FILE FILTER` (`ip netns exec` execs tcpdump, so the child is
/// tcpdump itself), started once it says "listening on" (10 s at most; panics when it does
/// not: the caller checked that tcpdump is installed, and these tests run as root). Stop it
/// with `stop_when_quiet` (the file has stopped growing, then SIGINT); dropped, it is stopped
/// at once.
pub fn capture(ns: &str, iface: &str, extra: &[&str], file: &Path, filter: &str) -> Capture {
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        ns,
        "tcpdump",
        "-i",
        iface,
        "-U",
        "--immediate-mode",
        "-n",
    ])
    .args(extra)
    .arg("-w")
    .arg(file)
    .args(filter.split_whitespace());
    Capture::spawn(cmd, file, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("tcpdump in {ns} on {iface} did not start"))
}

/// `softrdma ipoib up --dev ib0 --mode MODE --underlay IF --addr ...` in `ns`, its log
/// (RUST_LOG=info) in the temporary directory under `log`.
pub fn daemon(bin: &str, ns: &str, mode: &str, underlay: &str, addrs: &[String], extra: &[&str], log: &str) -> Child {
    let log = std::fs::File::create(std::env::temp_dir().join(log)).unwrap();
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        bin,
        "ipoib",
        "up",
        "--dev",
        "ib0",
        "--mode",
        mode,
        "--underlay",
        underlay,
    ]);
    for a in addrs {
        c.args(["--addr", a]);
    }
    c.args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn softrdma ipoib up")
}

/// Waits (20 s at most) until `ib0` in `ns` carries `addr`.
pub fn wait_up(ns: &str, addr: &str) {
    let end = Instant::now() + Duration::from_secs(20);
    while !sh(&format!("ip -n {ns} addr show dev ib0")).1.contains(addr) {
        assert!(Instant::now() < end, "ib0 in {ns} did not come up with {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `softrdma ipoib show WHAT --dev ib0` in `ns` (WHAT may carry flags, `conn --json`).
pub fn show(bin: &str, ns: &str, what: &str) -> String {
    sh(&format!("ip netns exec {ns} {bin} ipoib show {what} --dev ib0")).1
}

/// Waits until `show WHAT` in `ns` satisfies `want` (the status file is rewritten each
/// second; 5 s at most).
pub fn wait_show(bin: &str, ns: &str, what: &str, want: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let s = show(bin, ns, what);
        if want(&s) {
            return s;
        }
        assert!(Instant::now() < end, "show {what} in {ns}: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits (10 s at most) until a TCP socket in `ns` listens on `addr`:`port` (a server just
/// spawned: on a loaded machine a fixed delay was not enough, and its client was refused).
pub fn wait_listening(ns: &str, addr: &str, port: u16) {
    let end = Instant::now() + Duration::from_secs(10);
    let want = format!("{addr}:{port}");
    while !sh(&format!("ip netns exec {ns} ss -Hltn"))
        .1
        .split_whitespace()
        .any(|w| w == want)
    {
        assert!(Instant::now() < end, "nothing listens on {want} in {ns}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ping ARGS` in `ns`.
pub fn ping(ns: &str, args: &str) -> (bool, String) {
    sh(&format!("ip netns exec {ns} ping {args}"))
}

/// The RFC 4391 link-local address (`fe80::200:ffff:…`) of `ib0` in `ns`.
pub fn rfc4391_link_local(ns: &str) -> String {
    let v6 = must(&format!("ip -n {ns} -6 addr show dev ib0"));
    let ll = v6
        .split_whitespace()
        .find(|w| w.starts_with("fe80::"))
        .unwrap_or_else(|| panic!("a link-local in {ns}: {v6}"))
        .trim_end_matches("/64")
        .to_string();
    assert!(ll.starts_with("fe80::200:ffff:"), "only the RFC 4391 link-local: {v6}");
    ll
}
