//! `softrdma perftest --provider roce` against linux-rdma perftest 6.06 in rdma_cm mode (`-R`)
//! over the kernel's soft-RoCE (rxe0) in the QEMU lab (`../shared/lab`, issue 13): each of
//! `ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_send_lat`, `ib_write_lat`, `ib_read_lat`
//! with perftest as the server in the guest and our client in the lab's namespace, and the
//! other way round; the same checks as the siw file (`common/perftest.rs`), and the guest
//! kernel logs no BUG/WARNING/Oops. The IB CM runs on QP1 (REQ/REP/RTU, DREQ/DREP), the
//! data on RC QPs over UDP 4791.
//!
//! Routing in the guest without deleting siw0 (docs/roce.md, "Reaching the guest's rxe0"):
//! perftest's server listens on the wildcard address, so our REQ to 192.168.77.2 reaches its
//! cm_id on rxe0; perftest's client connects to 192.168.78.1 over the guest's eth0.78, an
//! address only rxe0 has a GID for (`scripts/lab-rxe-path.sh`, run by `lab()`).
//! Over the IB transport ib_send_bw runs without the iWARP credit Writes (`send_rcredit` is
//! for `IBV_TRANSPORT_IWARP` only): the receiver's RNR NAKs pace the sender.
//!
//! Requirement IDs: `../shared/requirements/smcr-ipoibcm.md` C1 (IB CM with a foreign
//! rdma_cm), C3 (RC over RoCEv2: Send, RDMA Write, RDMA Read against rxe).
//! Gate as `interop_siw.rs`: `SOFTRDMA_INTEROP=0` skips, `require` turns a skip into a failure.

#[path = "common/child.rs"]
mod child;
#[path = "common/lab.rs"]
mod lab_common;
#[path = "common/perftest.rs"]
mod perftest_common;
#[path = "common/rxe_path.rs"]
mod rxe_path;

use lab_common::{Lab, NS, acquire, bring_up_siw, next_port, vm_exec};
use perftest_common::{ITERS, Perftest, Run, SIZE, check};
use rxe_path::{HOST_RXE_IP, rxe_path_up};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
const GUEST_IP: &str = "192.168.77.2";

/// The lab with rxe0 active and perftest in the guest.
fn bring_up() -> Result<PathBuf, String> {
    let dir = bring_up_siw()?;
    let (rc, out) = vm_exec(&dir, "rdma link show | grep -q 'rxe0/1 state ACTIVE' && echo ok", 20);
    if rc != 0 || !out.contains("ok") {
        return Err(format!("rxe0 is not active in the guest: {out}"));
    }
    // `ib_write_bw --version` exits with status 1 (VERSION_EXIT is returned as FAILURE).
    let (_, out) = vm_exec(&dir, "ib_write_bw --version", 20);
    if !out.contains("Version: ") {
        return Err(format!("perftest is not in the guest: {out}"));
    }
    Ok(dir)
}

fn lab(test: &str) -> Option<Lab> {
    let lab = acquire(test, "kernel rxe + perftest interop lab", bring_up)?;
    if let Err(why) = rxe_path_up(&lab.dir) {
        panic!("{test}: the lab is up but its path to rxe0 is not: {why}");
    }
    lab.kernel_check_init();
    Some(lab)
}

/// A fresh port per case (19600..19999; the siw file uses 18600..18999).
fn port() -> u16 {
    next_port(19600, 400)
}

fn our_args(test: &str) -> Vec<String> {
    [
        "perftest",
        test,
        "--provider",
        "roce",
        "-s",
        &SIZE.to_string(),
        "-n",
        &ITERS.to_string(),
        "--timeout",
        "30",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// perftest `ib_TEST -R -d rxe0` as the server in the guest (wildcard address), our client.
fn guest_server_case(lab: &Lab, test: &str) -> Run {
    let p = port();
    let cmd = format!("ib_{test} -R -F -d rxe0 -p {p} -s {SIZE} -n {ITERS}");
    let start = format!(
        "rm -f /tmp/pxs-{p}.log; (timeout 120 {cmd} >/tmp/pxs-{p}.log 2>&1; echo exit=$? >>/tmp/pxs-{p}.log) >/dev/null 2>&1 &\n\
         i=0; while [ $i -lt 200 ]; do rdma res show cm_id | grep -q 'rxe0/.*LISTEN.*:{p} ' && exit 0; i=$((i+1)); sleep 0.05; done; \
         echo 'perftest did not listen on rxe0'; rdma res show cm_id; cat /tmp/pxs-{p}.log; exit 1"
    );
    let (rc, out) = lab.exec(&start, 30);
    assert_eq!(rc, 0, "guest ib_{test} -R server: {out}");
    let mut args = our_args(test);
    args.extend([GUEST_IP.into(), "-p".into(), p.to_string()]);
    let out = Command::new("ip")
        .args(["netns", "exec", NS, BIN])
        .args(&args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("softrdma perftest client");
    let (_, guest) = lab.exec(
        &format!(
            "i=0; while [ $i -lt 300 ]; do grep -q '^exit=' /tmp/pxs-{p}.log && break; i=$((i+1)); sleep 0.1; done; \
             grep -q '^exit=' /tmp/pxs-{p}.log || {{ pkill -f '{cmd}'; sleep 0.3; echo killed; }}; \
             cat /tmp/pxs-{p}.log"
        ),
        60,
    );
    lab.kernel_check();
    perftest_common::run_of(out, guest)
}

/// Our server in the namespace on 192.168.78.1, perftest `ib_TEST -R -d rxe0` as the client
/// in the guest, connecting over eth0.78 so that rdma_cm binds it to rxe0.
fn guest_client_case(lab: &Lab, test: &str) -> Run {
    let p = port();
    let mut args = our_args(test);
    args.extend(["--bind".into(), HOST_RXE_IP.into(), "-p".into(), p.to_string()]);
    let mut child = Command::new("ip")
        .args(["netns", "exec", NS, BIN])
        .args(&args)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("softrdma perftest server");
    // Printed once the listener exists (as perftest prints it).
    let lines = child::lines_once_ready(&mut child, "* Waiting for client to connect", Duration::from_secs(10));
    let (_, guest) = lab.exec(
        &format!(
            "timeout 120 ib_{test} -R -F -d rxe0 -p {p} -s {SIZE} -n {ITERS} {HOST_RXE_IP} >/tmp/pxc-{p}.log 2>&1; \
             echo exit=$? >>/tmp/pxc-{p}.log; cat /tmp/pxc-{p}.log"
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
        guest_exit: lab_common::exit_of(&guest),
        guest,
    }
}

/// One case (`name`): `ib_{test} -R` over rxe0 as `perftest`, softrdma the other end.
fn case(name: &str, test: &str, perftest: Perftest, ours_has: Option<&str>) {
    let Some(lab) = lab(name) else {
        return;
    };
    let r = match perftest {
        Perftest::Server => guest_server_case(&lab, test),
        Perftest::Client => guest_client_case(&lab, test),
    };
    check(&r, test, perftest, ours_has);
    assert!(r.ours.contains("Transport type : IB"), "{}", r.ours);
}

/// `name: "test", Server|Client, ours_has;`: one `#[test]` each.
macro_rules! cases {
    ($($(#[$attr:meta])* $name:ident: $test:literal, $perftest:ident, $ours_has:expr;)*) => {$(
        $(#[$attr])*
        #[test]
        fn $name() {
            case(stringify!($name), $test, Perftest::$perftest, $ours_has);
        }
    )*};
}

cases! {
    // perftest server in the guest (rxe0), softrdma client
    /// C3: RDMA Writes placed in rxe's memory, each completion verified.
    write_bw_rxe_server_our_client: "write_bw", Server, Some(&format!("verified: {ITERS} RDMA Write completions"));
    /// C3: RDMA Read Requests answered by rxe, 128 outstanding.
    read_bw_rxe_server_our_client: "read_bw", Server, Some(&format!("verified: {ITERS} RDMA Read completions"));
    /// C3: Sends without credit Writes (IB transport): rxe's RNR NAKs pace us.
    send_bw_rxe_server_our_client: "send_bw", Server, Some(&format!("verified: {ITERS} Send completions\n"));
    send_lat_rxe_server_our_client: "send_lat", Server, None;
    write_lat_rxe_server_our_client: "write_lat", Server, Some("sequence byte checked");
    read_lat_rxe_server_our_client: "read_lat", Server, None;

    // softrdma server, perftest client in the guest (rxe0 over eth0.78)
    write_bw_our_server_rxe_client: "write_bw", Client, None;
    read_bw_our_server_rxe_client: "read_bw", Client, None;
    send_bw_our_server_rxe_client: "send_bw", Client, Some(&format!("verified: {ITERS} receives of {SIZE} bytes"));
    send_lat_our_server_rxe_client: "send_lat", Client, None;
    write_lat_our_server_rxe_client: "write_lat", Client, None;
    read_lat_our_server_rxe_client: "read_lat", Client, Some("the client measures");
}
