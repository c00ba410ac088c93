//! Unreliable datagrams with the Linux kernel's soft-RoCE (rxe) in the QEMU lab (issue 14):
//! librdmacm's `udaddy` in the guest against `softrdma udaddy --provider roce` on the host,
//! both ways, and librdmacm's `mckey` (rdma_cm multicast join) against `softrdma mckey`,
//! both ways. rdma_cm's UDP port space runs SIDR on QP1 (SIDR_REQ / SIDR_REP with the
//! listener's QPN and Q_Key 0x01234567), then each side sends 10 (and 50) UD Sends with
//! immediate data; the server answers to the GRH's source GID and the immediate's QPN.
//! After every case the guest kernel log is checked for BUG/WARNING/Oops.
//!
//! Guest routing: rdma_cm in the guest binds its addresses on eth0 to siw0 (iWARP, no UD).
//! `scripts/lab-rxe-path.sh up` (docs/roce.md, "a path to the guest's rxe0") gives the guest
//! 192.168.78.2 on a VLAN of eth0 with its own MAC, which binds to rxe0, and the host
//! 192.168.78.1 in the lab namespace; siw0 stays. The guest's udaddy client uses `-s
//! 192.168.78.1`; the guest server listens on the wildcard address (its cm_id on rxe0 gets
//! our SIDR_REQ to 192.168.78.2). udaddy has no port option: both use 7174, one case at a
//! time under the lab lock.
//!
//! Multicast over that path needs one more guest rule: the wire is untagged and the path's
//! tc rule pushes VLAN 78 only for frames to eth0.78's MAC, so a RoCEv2 datagram to an IPv4
//! group (MAC 01:00:5e:...) would arrive on eth0, which has not joined the group (rxe 6.1's
//! join, `cma_igmp_send`, sends the IGMP report on eth0.78), and the IP layer drops it.
//! `lab-rxe-path.sh up` also sets a tc flower rule that pushes VLAN 78 for IPv4 multicast
//! frames from 192.168.78.0/24 to UDP 4791 (and `check` checks it). What rxe 6.1 does (capture of this test by hand): the
//! join sends an IGMPv3 report from 192.168.78.2; mckey's datagrams go to the group address
//! (UDP 4791, IP TTL 64), UD SEND_ONLY with immediate, destination QP 0xFFFFFF, Q_Key
//! 0x01234567, and it receives ours (TTL 1, the socket default).
//!
//! Gate and skips as in `interop_rxe.rs`: `SOFTRDMA_INTEROP=0` skips, `require` turns a
//! skip into a failure; the lab must be built, rxe0 active, and the rxe path buildable.
//! Requirement IDs: `../shared/requirements/smcr-ipoibcm.md` C1 (IB CM, here SIDR), C2 (UD),
//! D3.

#[path = "common/lab.rs"]
mod lab_common;

use lab_common::{Lab, NS, acquire, bring_up_siw, exit_of, vm_exec};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
const HOST_IP: &str = "192.168.78.1";
const GUEST_IP: &str = "192.168.78.2";

/// The lab with rxe0 active and the VLAN path to it (scripts/lab-rxe-path.sh).
fn bring_up_rxe_path() -> Result<PathBuf, String> {
    let dir = bring_up_siw()?;
    let (rc, out) = vm_exec(&dir, "rdma link show | grep -q 'rxe0/1 state ACTIVE' && echo ok", 20);
    if rc != 0 || !out.contains("ok") {
        return Err(format!("rxe0 is not active in the guest: {out}"));
    }
    let (rc, out) = vm_exec(&dir, "command -v udaddy && echo ok", 20);
    if rc != 0 || !out.contains("ok") {
        return Err(format!("the guest has no udaddy: {out}"));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lab-rxe-path.sh");
    if !script.exists() {
        return Err(format!("no {}", script.display()));
    }
    let up = Command::new(&script)
        .arg("up")
        .env("RDMALAB_REPO", &dir)
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !up.status.success() {
        return Err(format!(
            "lab-rxe-path.sh up failed: {}{}",
            String::from_utf8_lossy(&up.stdout),
            String::from_utf8_lossy(&up.stderr)
        ));
    }
    Ok(dir)
}

fn lab(test: &str) -> Option<Lab> {
    let lab = acquire(test, "kernel rxe UD interop lab", bring_up_rxe_path)?;
    lab.kernel_check_init();
    Some(lab)
}

/// The udaddy lines both programs print on success.
fn check_udaddy(log: &str, client: bool, who: &str) {
    let want: &[&str] = if client {
        &[
            "udaddy: starting client",
            "udaddy: connecting",
            "initiating data transfers",
        ]
    } else {
        &["udaddy: starting server", "receiving data transfers", "sending replies"]
    };
    for w in want
        .iter()
        .chain(&["data transfers complete", "test complete", "return status 0"])
    {
        assert!(log.lines().any(|l| l.trim() == *w), "{who}: no '{w}' line:\n{log}");
    }
}

/// Our `softrdma udaddy` in the lab namespace, with `args`; returns (success, output).
fn ours(args: &[&str], secs: u64) -> (bool, String) {
    let mut all = vec!["udaddy"];
    all.extend_from_slice(args);
    ours_cmd(&all, secs)
}

/// `softrdma CMD --provider roce ARGS...` in the lab namespace; (success, output).
fn ours_cmd(args: &[&str], secs: u64) -> (bool, String) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", NS, BIN])
        .arg(args[0])
        .args(["--provider", "roce"])
        .args(&args[1..])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("softrdma udaddy");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let ok = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.success();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&out.stderr));
    (ok, log)
}

/// The kernel's `udaddy -s 192.168.78.1` (rxe0) against our server: SIDR from Linux to us,
/// `count` datagrams of `size` each way.
fn guest_client_case(lab: &Lab, count: u32, size: u32) {
    let (c, s) = (count.to_string(), size.to_string());
    let srv = std::thread::spawn(move || ours(&["-b", HOST_IP, "-C", &c, "-S", &s, "--timeout", "20"], 40));
    // Our server is listening once its device is open; udaddy's client has no retry, so
    // give it a moment (the SIDR_REQ itself is retried by the kernel's CM).
    std::thread::sleep(Duration::from_millis(500));
    let script = format!(
        "timeout 30 udaddy -s {HOST_IP} -C {count} -S {size} >/tmp/ud-c.log 2>&1; echo exit=$? >>/tmp/ud-c.log; \
         cat /tmp/ud-c.log"
    );
    let (_, log) = lab.exec(&script, 60);
    let (ok, our_log) = srv.join().unwrap();
    lab.kernel_check();
    assert_eq!(exit_of(&log), Some(0), "guest udaddy client:\n{log}\nours:\n{our_log}");
    check_udaddy(&log, true, "guest udaddy client");
    assert!(ok, "our udaddy server failed:\n{our_log}\nguest:\n{log}");
    check_udaddy(&our_log, false, "our udaddy server");
}

/// Our `udaddy -s 192.168.78.2` against the kernel's udaddy server on the wildcard address.
fn host_client_case(lab: &Lab, count: u32, size: u32) {
    let script = format!(
        "rm -f /tmp/ud-s.*; (timeout 40 udaddy -C {count} -S {size} >/tmp/ud-s.log 2>&1; echo exit=$? >/tmp/ud-s.exit) \
         >/dev/null 2>&1 &\n\
         i=0; while [ $i -lt 100 ]; do rdma res show cm_id | grep -q ':7174 ' && exit 0; i=$((i+1)); sleep 0.05; done; \
         echo 'udaddy server did not listen'; cat /tmp/ud-s.log; exit 1"
    );
    let (rc, out) = lab.exec(&script, 30);
    assert_eq!(rc, 0, "guest udaddy server: {out}");
    let (c, s) = (count.to_string(), size.to_string());
    let (ok, our_log) = ours(&["-s", GUEST_IP, "-C", &c, "-S", &s, "--timeout", "20"], 40);
    let (_, log) = lab.exec(
        "i=0; while [ $i -lt 100 ]; do [ -e /tmp/ud-s.exit ] && break; i=$((i+1)); sleep 0.1; done; \
         [ -e /tmp/ud-s.exit ] || { pkill -x udaddy; sleep 0.3; }; cat /tmp/ud-s.log /tmp/ud-s.exit",
        40,
    );
    lab.kernel_check();
    assert!(ok, "our udaddy client failed:\n{our_log}\nguest:\n{log}");
    check_udaddy(&our_log, true, "our udaddy client");
    assert_eq!(exit_of(&log), Some(0), "guest udaddy server:\n{log}\nours:\n{our_log}");
    check_udaddy(&log, false, "guest udaddy server");
}

/// C1, C2, D3: the kernel's udaddy client (SIDR over rxe) against our server, 10 datagrams
/// of 100 octets each way (udaddy's defaults), then 50 of 1024 (rxe's path MTU on the lab's
/// 1500-octet link).
#[test]
fn kernel_udaddy_client_vs_our_server() {
    let Some(lab) = lab("kernel_udaddy_client_vs_our_server") else {
        return;
    };
    guest_client_case(&lab, 10, 100);
    guest_client_case(&lab, 50, 1024);
}

/// C1, C2, D3: our udaddy client against the kernel's udaddy server over rxe.
#[test]
fn our_udaddy_client_vs_kernel_server() {
    let Some(lab) = lab("our_udaddy_client_vs_kernel_server") else {
        return;
    };
    host_client_case(&lab, 10, 100);
    host_client_case(&lab, 50, 1024);
}

/// The mckey lines of a run that went through.
fn check_mckey(log: &str, sender: bool, group: &str, who: &str) {
    let joined = format!("mckey: joined dgid: ::ffff:{group} mlid 0x0 sl 0");
    let first = if sender {
        "initiating data transfers"
    } else {
        "receiving data transfers"
    };
    for w in [joined.as_str(), first, "data transfers complete", "return status 0"] {
        assert!(log.lines().any(|l| l.trim() == w), "{who}: no '{w}' line:\n{log}");
    }
}

/// Issue 14: multicast between the VM and us, both ways: the guest's mckey receiver joined
/// to 239.1.2.3 gets our 10 datagrams; our receiver joined to 239.1.2.4 gets the guest's.
#[test]
fn mckey_both_ways_with_kernel_rxe() {
    let Some(lab) = lab("mckey_both_ways_with_kernel_rxe") else {
        return;
    };
    // Guest receives, we send.
    let (rc, out) = lab.exec(
        "rm -f /tmp/mk.*; (timeout 30 mckey -m 239.1.2.3 -b 192.168.78.2 >/tmp/mk.log 2>&1; echo exit=$? >/tmp/mk.exit) \
         >/dev/null 2>&1 & sleep 1",
        30,
    );
    assert_eq!(rc, 0, "guest mckey: {out}");
    let (ok, ours_log) = ours_mckey(&["-m", "239.1.2.3", "-b", HOST_IP, "-s", "--delay-ms", "500"], 30);
    let (_, log) = lab.exec(
        "i=0; while [ $i -lt 150 ]; do [ -e /tmp/mk.exit ] && break; i=$((i+1)); sleep 0.1; done; \
         cat /tmp/mk.log /tmp/mk.exit",
        40,
    );
    lab.kernel_check();
    assert!(ok, "our mckey sender:\n{ours_log}");
    check_mckey(&ours_log, true, "239.1.2.3", "our mckey sender");
    assert_eq!(exit_of(&log), Some(0), "guest mckey receiver:\n{log}");
    check_mckey(&log, false, "239.1.2.3", "guest mckey receiver");

    // We receive, the guest sends.
    let rx = std::thread::spawn(|| ours_mckey(&["-m", "239.1.2.4", "-b", HOST_IP, "--timeout", "25"], 40));
    std::thread::sleep(Duration::from_millis(800));
    let (_, log) = lab.exec("timeout 30 mckey -m 239.1.2.4 -b 192.168.78.2 -s; echo exit=$?", 60);
    let (ok, ours_log) = rx.join().unwrap();
    lab.kernel_check();
    assert_eq!(exit_of(&log), Some(0), "guest mckey sender:\n{log}");
    assert!(ok, "our mckey receiver:\n{ours_log}\nguest:\n{log}");
    check_mckey(&ours_log, false, "239.1.2.4", "our mckey receiver");
}

fn ours_mckey(args: &[&str], secs: u64) -> (bool, String) {
    let mut all = vec!["mckey"];
    all.extend_from_slice(args);
    ours_cmd(&all, secs)
}
