//! `softrdma perftest` against linux-rdma perftest 6.06 (Debian 4.5+0.17) in rdma_cm mode (`-R`)
//! over the kernel's soft-iWARP in the QEMU lab (`../shared/lab`, issue 6): each of
//! `ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_send_lat`, `ib_write_lat`, `ib_read_lat` with
//! perftest as the server in the guest and our client in the lab's namespace, and the other way
//! round. Every case checks both exit statuses, both result lines (bytes and iterations, and
//! where perftest prints the other side's figures, that they are ours), and that the guest
//! kernel logged no BUG/WARNING/Oops and has no new taint. docs/interop-perftest.md has the
//! exchange and the figures.
//!
//! Requirements exercised against a foreign implementation: RDMAP-WR-01/02 (Writes placed, no
//! receive consumed: the write tests), RDMAP-RD-01 (Read Request/Response: the read tests),
//! RDMAP-SND-01/02/03 (Sends consume one receive each, lengths reported, in order: the send
//! tests and the whole comm exchange), RDMAP-LLP-02 (4 KiB messages as DDP segments).
//!
//! Gate as `interop_siw.rs`: `SOFTRDMA_INTEROP=0` skips, unset uses a lab that is built
//! (`/var/tmp/rdmalab/vmlinuz`), `=1` also builds it, `=require` turns a skip into a failure.
//! Each case holds the lab (`common/lab.rs`: process mutex + flock), so `--test-threads=1` or
//! not, one case at a time uses the guest.

#[path = "common/lab.rs"]
mod lab_common;
#[path = "common/perftest.rs"]
mod perftest_common;

use lab_common::{Lab, NS, acquire, bring_up_siw, next_port, vm_exec};
use perftest_common::{ITERS, Perftest, Run, SIZE, check, run_of};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
const HOST_IP: &str = "192.168.77.1";
const GUEST_IP: &str = "192.168.77.2";

/// The siw lab, with perftest in the guest.
fn bring_up() -> Result<PathBuf, String> {
    let dir = bring_up_siw()?;
    // `ib_write_bw --version` exits with status 1 (VERSION_EXIT is returned as FAILURE).
    let (_, out) = vm_exec(&dir, "ib_write_bw --version", 20);
    if !out.contains("Version: ") {
        return Err(format!("perftest is not in the guest: {out}"));
    }
    Ok(dir)
}

fn lab(test: &str) -> Option<Lab> {
    let lab = acquire(test, "kernel siw + perftest interop lab", bring_up)?;
    lab.kernel_check_init();
    Some(lab)
}

/// A fresh port per case (18600..18999), away from perftest's default.
fn port() -> u16 {
    next_port(18600, 400)
}

fn common_args(test: &str) -> Vec<String> {
    vec![
        "perftest".into(),
        test.into(),
        "-s".into(),
        SIZE.to_string(),
        "-n".into(),
        ITERS.to_string(),
        "--timeout".into(),
        "30".into(),
    ]
}

/// perftest `ib_TEST -R` as the server in the guest, our client in the namespace.
fn guest_server_case(lab: &Lab, test: &str) -> Run {
    let p = port();
    let start = format!(
        "rm -f /tmp/pts-{p}.log; (timeout 120 ib_{test} -R -F -d siw0 -p {p} -s {SIZE} -n {ITERS} >/tmp/pts-{p}.log 2>&1; \
         echo exit=$? >>/tmp/pts-{p}.log) >/dev/null 2>&1 &\n\
         i=0; while [ $i -lt 200 ]; do ss -tln | grep -q ':{p} ' && exit 0; i=$((i+1)); sleep 0.05; done; \
         echo 'perftest did not listen'; cat /tmp/pts-{p}.log; exit 1"
    );
    let (rc, out) = vm_exec(&lab.dir, &start, 30);
    assert_eq!(rc, 0, "guest ib_{test} -R server: {out}");
    let mut args = common_args(test);
    args.extend([GUEST_IP.into(), "-p".into(), p.to_string()]);
    let out = Command::new("ip")
        .args(["netns", "exec", NS, BIN])
        .args(&args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("softrdma perftest client");
    let (_, guest) = vm_exec(
        &lab.dir,
        &format!(
            "i=0; while [ $i -lt 300 ]; do grep -q '^exit=' /tmp/pts-{p}.log && break; i=$((i+1)); sleep 0.1; done; \
             grep -q '^exit=' /tmp/pts-{p}.log || {{ pkill -f 'ib_{test} -R -F -d siw0 -p {p} '; sleep 0.3; echo killed; }}; \
             cat /tmp/pts-{p}.log"
        ),
        60,
    );
    lab.kernel_check();
    run_of(out, guest)
}

/// Our server in the namespace, perftest `ib_TEST -R` as the client in the guest.
fn guest_client_case(lab: &Lab, test: &str) -> Run {
    let p = port();
    let mut args = common_args(test);
    args.extend(["-p".into(), p.to_string()]);
    let mut child = Command::new("ip")
        .args(["netns", "exec", NS, BIN])
        .args(&args)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("softrdma perftest server");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ss = Command::new("ip")
            .args(["netns", "exec", NS, "ss", "-tln"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&ss.stdout).contains(&format!(":{p} ")) {
            break;
        }
        assert!(Instant::now() < deadline, "our server does not listen on {p}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, guest) = vm_exec(
        &lab.dir,
        &format!(
            "timeout 120 ib_{test} -R -F -d siw0 -p {p} -s {SIZE} -n {ITERS} {HOST_IP} >/tmp/ptc-{p}.log 2>&1; \
             echo exit=$? >>/tmp/ptc-{p}.log; cat /tmp/ptc-{p}.log"
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
    let out = child.wait_with_output().unwrap();
    lab.kernel_check();
    run_of(out, guest)
}

/// One case (`name`): `ib_{test} -R` as `perftest`, softrdma the other end; the checks for
/// that test and role, and that our output contains `ours_has`.
fn case(name: &str, test: &str, perftest: Perftest, ours_has: Option<&str>) {
    let Some(lab) = lab(name) else {
        return;
    };
    let r = match perftest {
        Perftest::Server => guest_server_case(&lab, test),
        Perftest::Client => guest_client_case(&lab, test),
    };
    check(&r, test, perftest, ours_has);
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
    // perftest server in the guest, softrdma client
    write_bw_kernel_server_our_client: "write_bw", Server, Some(&format!("verified: {ITERS} RDMA Write completions"));
    read_bw_kernel_server_our_client: "read_bw", Server, Some(&format!("verified: {ITERS} RDMA Read completions"));
    /// P2 (docs/interop-perftest.md): over iWARP ib_send_bw's receiver grants credits by RDMA
    /// Write into the sender's credit word; without them we would stall after rx_depth Sends.
    send_bw_kernel_server_our_client: "send_bw", Server, Some("credits from the receiver");
    send_lat_kernel_server_our_client: "send_lat", Server, None;
    /// ib_write_lat has no closing exchange: P3's teardown order matters most here.
    write_lat_kernel_server_our_client: "write_lat", Server, Some("sequence byte checked");
    read_lat_kernel_server_our_client: "read_lat", Server, None;

    // softrdma server, perftest client in the guest
    write_bw_our_server_kernel_client: "write_bw", Client, None;
    read_bw_our_server_kernel_client: "read_bw", Client, None;
    send_bw_our_server_kernel_client: "send_bw", Client, Some(&format!("verified: {ITERS} receives of {SIZE} bytes"));
    send_lat_our_server_kernel_client: "send_lat", Client, None;
    write_lat_our_server_kernel_client: "write_lat", Client, None;
    read_lat_our_server_kernel_client: "read_lat", Client, Some("the client measures");
}
