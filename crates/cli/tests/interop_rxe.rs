//! Interop with the Linux kernel's soft-RoCE (rxe) in the QEMU lab (`../shared/lab`,
//! issue 13): `softrdma rping --provider roce` on the host (inside the lab's network
//! namespace, 192.168.77.1) against the guest's `rping` over rxe0 (192.168.77.2), in both
//! roles, sizes from rping's minimum (26) to 65535, 100+ pings with verification. The IB
//! CM runs on QP1 (REQ/REP/RTU, DREQ/DREP) and the data on RC QPs, both over UDP 4791.
//! After every case the guest kernel log is checked for BUG/WARNING/Oops.
//!
//! Guest routing: rdma_cm in the guest binds 192.168.77.2 to siw0 while siw0 exists (lab
//! README "RoCEv2 from the host"), so the guest server listens on the wildcard address
//! (its cm_ids on rxe0 get our REQ), and the guest client connects to 192.168.78.1 over the
//! guest's eth0.78, an address only rxe0 has a GID for (`scripts/lab-rxe-path.sh`, docs/roce.md
//! "Reaching the guest's rxe0 without deleting siw0"); siw0 stays.
//!
//! Gate and skips as in `interop_siw.rs`: `SOFTRDMA_INTEROP=0` skips, `require` turns a
//! skip into a failure; the lab must be built and rxe0 active.
//! Requirement IDs: `../shared/requirements/smcr-ipoibcm.md` C1 (IB CM), C3 (RC over RoCEv2).

#[path = "common/child.rs"]
mod child;
#[path = "common/lab.rs"]
mod lab_common;
#[path = "common/rping_server.rs"]
mod rping_server;
#[path = "common/rxe_path.rs"]
mod rxe_path;

use lab_common::{Lab, NS, acquire, bring_up_siw, exit_of, next_port, vm_exec};
use rping_server::{OurServer, OurServerRun};
use rxe_path::{HOST_RXE_IP, rxe_path_up};
use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
const GUEST_IP: &str = "192.168.77.2";

/// The lab with rxe0 active (and siw0, which the other interop files need).
fn bring_up_rxe() -> Result<PathBuf, String> {
    let dir = bring_up_siw()?;
    let (rc, out) = vm_exec(&dir, "rdma link show | grep -q 'rxe0/1 state ACTIVE' && echo ok", 20);
    if rc != 0 || !out.contains("ok") {
        return Err(format!("rxe0 is not active in the guest: {out}"));
    }
    Ok(dir)
}

fn lab(test: &str) -> Option<Lab> {
    let lab = acquire(test, "kernel rxe interop lab", bring_up_rxe)?;
    if let Err(why) = rxe_path_up(&lab.dir) {
        panic!("{test}: the lab is up but its path to rxe0 is not: {why}");
    }
    lab.kernel_check_init();
    Some(lab)
}

/// A fresh port per case (8200..8999; interop_siw uses 7200..7999).
fn port() -> u16 {
    next_port(8200, 800)
}

struct GuestRun {
    log: String,
    exit: Option<i32>,
}

impl GuestRun {
    fn count(&self, prefix: &str) -> usize {
        self.log.lines().filter(|l| l.starts_with(prefix)).count()
    }
}

/// Starts the guest's `rping -s` on the wildcard address and waits for its cm_id to listen.
fn guest_server(lab: &Lab, args: &str) -> u16 {
    let port = port();
    let script = format!(
        "rm -f /tmp/xr-{port}.*; (rping -s -p {port} {args} >/tmp/xr-{port}.log 2>/tmp/xr-{port}.err & \
         echo $! >/tmp/xr-{port}.pid; wait $!; echo exit=$? >/tmp/xr-{port}.exit) >/dev/null 2>&1 &\n\
         i=0; while [ $i -lt 100 ]; do rdma res show cm_id | grep -q ':{port} ' && exit 0; i=$((i+1)); sleep 0.05; done; \
         echo 'rping -s did not listen'; cat /tmp/xr-{port}.log /tmp/xr-{port}.err; exit 1"
    );
    let (rc, out) = lab.exec(&script, 30);
    assert_eq!(rc, 0, "guest rping -s: {out}");
    port
}

fn guest_server_finish(lab: &Lab, p: u16, secs: u32) -> GuestRun {
    let script = format!(
        "i=0; while [ $i -lt {n} ]; do [ -e /tmp/xr-{p}.exit ] && break; i=$((i+1)); sleep 0.1; done; \
         [ -e /tmp/xr-{p}.exit ] || {{ kill $(cat /tmp/xr-{p}.pid); sleep 0.3; echo killed; }}; \
         cat /tmp/xr-{p}.log; echo '@@stderr'; cat /tmp/xr-{p}.err /tmp/xr-{p}.exit",
        n = secs * 10
    );
    let (_, log) = lab.exec(&script, secs as u64 + 30);
    let exit = if log.lines().any(|l| l == "killed") {
        None
    } else {
        exit_of(&log)
    };
    GuestRun { log, exit }
}

/// Our `softrdma rping -c --provider roce` in the namespace.
fn our_client(port: u16, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", NS, BIN, "rping", "-c", "-a", GUEST_IP, "-p"])
        .arg(port.to_string())
        .args(["--provider", "roce"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("softrdma rping -c")
}

/// Our `softrdma rping -s --provider roce` in the namespace, on `bind`.
fn our_server(bind: &str, args: &[&str]) -> OurServer {
    OurServer::start(BIN, NS, bind, port(), &[&["--provider", "roce"], args].concat())
}

/// rping's ping lines: `rdma-ping-N: ` and the rotating ASCII, `size - 1` octets.
fn check_ping_lines(lines: &[&str], prefix: &str, count: usize, size: usize) {
    assert_eq!(lines.len(), count, "{prefix} lines");
    for (i, l) in lines.iter().enumerate() {
        let body = l.strip_prefix(prefix).expect("prefix");
        let head = format!("rdma-ping-{i}: ");
        assert!(body.starts_with(&head), "ping {i}: {l}");
        assert_eq!(body.len(), size - 1, "ping {i} length");
        let mut c = b'A' + (i % 58) as u8;
        for &b in &body.as_bytes()[head.len()..] {
            assert_eq!(b, c, "ping {i}: {l}");
            c = if c == b'z' { b'A' } else { c + 1 };
        }
    }
}

/// Our client against the kernel's `rping -s` over rxe0: `count` pings of `size`, -V.
fn host_client_case(lab: &Lab, count: usize, size: usize) {
    let port = guest_server(lab, &format!("-v -C {count} -S {size}"));
    let (c, s) = (count.to_string(), size.to_string());
    let out = our_client(port, &["-v", "-V", "-C", &c, "-S", &s, "--timeout", "30"]);
    let guest = guest_server_finish(lab, port, 15);
    lab.kernel_check();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "our client failed: {stderr}\nguest:\n{}",
        guest.log
    );
    let pings: Vec<&str> = stdout.lines().filter(|l| l.starts_with("ping data: ")).collect();
    check_ping_lines(&pings, "ping data: ", count, size);
    assert_eq!(guest.exit, Some(0), "guest rping -s:\n{}", guest.log);
    assert_eq!(guest.count("server ping data: "), count, "guest:\n{}", guest.log);
}

/// The kernel's `rping -c` over rxe0 (to 192.168.78.1, so that rdma_cm binds it to rxe0)
/// against our server there.
fn guest_client_case(lab: &Lab, count: usize, size: usize) {
    let s = size.to_string();
    let srv = our_server(HOST_RXE_IP, &["-S", &s]);
    let port = srv.port;
    let secs = 30 + count as u64 / 20;
    let script = format!(
        "timeout {secs} rping -c -a {HOST_RXE_IP} -p {port} -v -V -C {count} -S {size} >/tmp/xc-{port}.log 2>/tmp/xc-{port}.err; \
         echo exit=$? >>/tmp/xc-{port}.err; cat /tmp/xc-{port}.log; echo '@@stderr'; cat /tmp/xc-{port}.err"
    );
    let (_, log) = lab.exec(&script, secs + 30);
    let OurServerRun { ok, stdout, stderr } = srv.finish(20);
    lab.kernel_check();
    assert_eq!(exit_of(&log), Some(0), "guest rping -c:\n{log}\nours: {stderr}");
    let pings: Vec<&str> = log.lines().filter(|l| l.starts_with("ping data: ")).collect();
    check_ping_lines(&pings, "ping data: ", count, size);
    let tail = stdout[stdout.len().saturating_sub(12)..].join("\n");
    assert!(ok, "our server failed: {stderr}\nits last debug lines:\n{tail}");
    let sp: Vec<&str> = stdout
        .iter()
        .filter(|l| l.starts_with("server ping data: "))
        .map(String::as_str)
        .collect();
    check_ping_lines(&sp, "server ping data: ", count, size);
}

/// C1, C3: our rping client against the kernel's rping server over rxe, 120 pings of 64
/// octets, then rping's minimum size, 4 KiB and 65535.
#[test]
fn host_client_vs_kernel_server_over_rxe() {
    let Some(lab) = lab("host_client_vs_kernel_server_over_rxe") else {
        return;
    };
    host_client_case(&lab, 120, 64);
    host_client_case(&lab, 20, 26);
    host_client_case(&lab, 20, 4096);
    host_client_case(&lab, 10, 65535);
}

/// C1, C3: the kernel's rping client over rxe against our rping server, 120 pings of 64
/// octets, then 26, 4096 and 65535. The guest keeps siw0: its client reaches rxe0 through
/// eth0.78 (it was `#[ignore]`d while it had to delete siw0, which can hang the 6.1 guest).
#[test]
fn kernel_client_vs_host_server_over_rxe() {
    let Some(lab) = lab("kernel_client_vs_host_server_over_rxe") else {
        return;
    };
    let (rc, before) = lab.exec("rdma link show", 20);
    assert_eq!(rc, 0, "{before}");
    guest_client_case(&lab, 120, 64);
    guest_client_case(&lab, 20, 26);
    guest_client_case(&lab, 20, 4096);
    guest_client_case(&lab, 10, 65535);
    let (_, after) = lab.exec("rdma link show", 20);
    assert_eq!(before, after, "the guest's RDMA links changed");
    assert!(after.contains("siw0/1 state ACTIVE"), "{after}");
}

/// C1.6: a REQ for a port nobody listens on in the guest: rxe's CM answers REJ 8, and our
/// client reports the typed rejection.
#[test]
fn unlistened_port_on_rxe_is_rej_8() {
    let Some(lab) = lab("unlistened_port_on_rxe_is_rej_8") else {
        return;
    };
    let out = our_client(port(), &["-C", "1", "--timeout", "20"]);
    lab.kernel_check();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("invalid service ID"), "{stderr}");
}
