//! Interop with the Linux kernel's soft-iWARP (siw) in the QEMU lab (`../shared/lab`, issue 6).
//!
//! `softrdma rping` on the host (inside the lab's network namespace, 192.168.77.1) against
//! the guest's `rping` over siw0 (192.168.77.2), in both roles, CRC off and on, many pings
//! with verification; the p2p/RTR variants; Terminates in both directions; and one test per
//! difference between the kernel and the RFC or our first guess (`docs/interop-siw.md`,
//! D1..Dn). After every case the guest kernel log is checked for BUG/WARNING/Oops and the
//! taint flags for anything beyond the out-of-tree siw module's O+E.
//!
//! Gate: `SOFTRDMA_INTEROP=0` skips; `=1` also runs the lab's `setup.sh` when the lab is not
//! built yet; unset uses a lab that is already built (`/var/tmp/rdmalab/vmlinuz`). A VM that
//! is not running is started with `vm.sh start`. Without root, QEMU or the lab directory each
//! test prints why it skips and passes. `SOFTRDMA_INTEROP=require` turns a skip into a
//! failure (for CI that must run it). `RDMALAB_REPO` overrides the lab directory.
//!
//! The cases hold a process-wide mutex and an flock on `/var/tmp/rdmalab/softrdma-interop.lock`,
//! so parallel test threads and other test processes never share the guest's rping.

#[path = "common/child.rs"]
mod child;
#[path = "common/lab.rs"]
mod lab_common;
#[path = "common/rping_server.rs"]
mod rping_server;

use lab_common::{LAB_STATE, Lab, NS, acquire, bring_up_siw, exit_of, gate, have, next_port};
use rping_server::{OurServer, OurServerRun};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
const HOST_IP: &str = "192.168.77.1";
const GUEST_IP: &str = "192.168.77.2";

fn lab(test: &str) -> Option<Lab> {
    let lab = acquire(test, "kernel siw interop lab", bring_up_siw)?;
    lab.kernel_check_init();
    Some(lab)
}

/// `tests/guest/cm_probe.c` built on the host (dynamic against Debian's librdmacm-dev 44,
/// the guest's rdma-core) into the lab's share, once per process: its path in the guest, or
/// why it cannot be built.
fn cm_probe_build() -> Result<&'static str, String> {
    static BUILT: OnceLock<Result<&'static str, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if !have("gcc") {
                return Err("no gcc on the host (scripts/setup.sh installs it)".into());
            }
            if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
                return Err("librdmacm-dev/libibverbs-dev are not installed (scripts/setup.sh)".into());
            }
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/guest/cm_probe.c");
            let share = Path::new(LAB_STATE).join("share");
            let tmp = share.join(format!("cm_probe.{}", std::process::id()));
            let out = Command::new("gcc")
                .args(["-O2", "-Wall", "-o"])
                .arg(&tmp)
                .arg(&src)
                .args(["-lrdmacm", "-libverbs"])
                .output()
                .map_err(|e| format!("gcc: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "gcc cm_probe.c failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            // Atomic replace: another test process may be running the previous copy.
            std::fs::rename(&tmp, share.join("cm_probe")).map_err(|e| format!("install cm_probe: {e}"))?;
            Ok("/mnt/host/cm_probe")
        })
        .clone()
}

/// The lab plus the guest's rdma_cm probe; skips (or fails under `require`) without either.
fn lab_cm(test: &str) -> Option<Lab> {
    let lab = lab(test)?;
    if let Err(why) = cm_probe_build() {
        if gate() == "require" {
            panic!("{test}: cm_probe is required (SOFTRDMA_INTEROP=require) but cannot be built: {why}");
        }
        eprintln!("SKIPPED {test}: the guest's rdma_cm probe unavailable: {why}");
        return None;
    }
    Some(lab)
}

/// Whether the host has python3 for `what` (a raw iWARP peer in tests/tools); without it
/// `test` skips, or fails under `require`.
fn python3(test: &str, what: &str) -> bool {
    if have("python3") {
        return true;
    }
    if gate() == "require" {
        panic!("python3 is required for {what}");
    }
    eprintln!("SKIPPED {test}: no python3 on the host");
    false
}

/// Private data as the tests send it: ours 0x00, 0x01, ... (`--test-pd`, `--test-reject`),
/// cm_probe's 0x80, 0x81, ...; lowercase hex as both print it.
fn pd_hex(n: usize, first: u8) -> String {
    (0..n).map(|i| format!("{:02x}", first.wrapping_add(i as u8))).collect()
}

/// A fresh port per case (7200..7999), so that no case meets another's leftovers.
fn port() -> u16 {
    next_port(7200, 800)
}

/// The guest's `rping -s`, running in the background.
struct GuestServer {
    port: u16,
}

/// What a finished (or killed) guest rping printed.
struct GuestRun {
    log: String,
    exit: Option<i32>,
}

impl GuestRun {
    fn count(&self, prefix: &str) -> usize {
        self.log.lines().filter(|l| l.starts_with(prefix)).count()
    }
}

impl Lab {
    /// Starts `rping -s` in the guest and waits until siw listens.
    fn guest_server(&self, args: &str) -> GuestServer {
        let port = port();
        let script = format!(
            "rm -f /tmp/sr-{port}.*; (rping -s -a {GUEST_IP} -p {port} {args} >/tmp/sr-{port}.log 2>/tmp/sr-{port}.err & \
             echo $! >/tmp/sr-{port}.pid; wait $!; echo exit=$? >/tmp/sr-{port}.exit) >/dev/null 2>&1 &\n\
             i=0; while [ $i -lt 100 ]; do ss -tln | grep -q '{GUEST_IP}:{port} ' && exit 0; i=$((i+1)); sleep 0.05; done; \
             echo 'rping -s did not listen'; cat /tmp/sr-{port}.log /tmp/sr-{port}.err; exit 1"
        );
        let (rc, out) = self.exec(&script, 30);
        assert_eq!(rc, 0, "guest rping -s: {out}");
        GuestServer { port }
    }

    /// Waits up to `secs` for the guest server to exit, kills it otherwise.
    fn guest_server_finish(&self, s: GuestServer, secs: u32) -> GuestRun {
        let p = s.port;
        let script = format!(
            "i=0; while [ $i -lt {n} ]; do [ -e /tmp/sr-{p}.exit ] && break; i=$((i+1)); sleep 0.1; done; \
             [ -e /tmp/sr-{p}.exit ] || {{ kill $(cat /tmp/sr-{p}.pid); sleep 0.3; echo killed; }}; \
             cat /tmp/sr-{p}.log; echo '@@stderr'; cat /tmp/sr-{p}.err /tmp/sr-{p}.exit",
            n = secs * 10
        );
        let (_, log) = self.exec(&script, secs as u64 + 30);
        let exit = if log.lines().any(|l| l == "killed") {
            None
        } else {
            exit_of(&log)
        };
        GuestRun { log, exit }
    }

    /// Starts `cm_probe server` in the guest (`args`: `--accept N`, `--reject N`, ...) and
    /// waits until siw listens. Returns the port.
    fn cm_server(&self, args: &str) -> u16 {
        let port = port();
        let script = format!(
            "rm -f /tmp/cp-{port}.*; (/mnt/host/cm_probe server {GUEST_IP} {port} {args} --timeout 20 \
             >/tmp/cp-{port}.log 2>&1 & echo $! >/tmp/cp-{port}.pid; wait $!; echo exit=$? >>/tmp/cp-{port}.log) \
             >/dev/null 2>&1 &\n\
             i=0; while [ $i -lt 100 ]; do ss -tln | grep -q '{GUEST_IP}:{port} ' && exit 0; i=$((i+1)); sleep 0.05; done; \
             echo 'cm_probe server did not listen'; cat /tmp/cp-{port}.log; exit 1"
        );
        let (rc, out) = self.exec(&script, 30);
        assert_eq!(rc, 0, "guest cm_probe server: {out}");
        port
    }

    /// Waits up to `secs` for the guest's cm_probe server to exit; its output (with
    /// `exit=N` last) or, when it is still running, what it printed so far and `killed`.
    fn cm_server_finish(&self, port: u16, secs: u32) -> String {
        let script = format!(
            "i=0; while [ $i -lt {n} ]; do grep -q '^exit=' /tmp/cp-{port}.log && break; i=$((i+1)); sleep 0.1; done; \
             grep -q '^exit=' /tmp/cp-{port}.log || {{ kill $(cat /tmp/cp-{port}.pid); sleep 0.3; echo killed; }}; \
             cat /tmp/cp-{port}.log",
            n = secs * 10
        );
        self.exec(&script, secs as u64 + 30).1
    }

    /// Runs `cm_probe client` in the guest against our server: its exit code and output.
    fn cm_client(&self, port: u16, args: &str) -> (Option<i32>, String) {
        let script = format!(
            "/mnt/host/cm_probe client {HOST_IP} {port} {args} --timeout 10 >/tmp/cc-{port}.log 2>&1; \
             echo exit=$? >>/tmp/cc-{port}.log; cat /tmp/cc-{port}.log"
        );
        let (_, log) = self.exec(&script, 40);
        (exit_of(&log), log)
    }

    /// Runs `rping -c` in the guest against our server.
    fn guest_client(&self, port: u16, args: &str, secs: u64) -> GuestRun {
        let script = format!(
            "timeout {secs} rping -c -a {HOST_IP} -p {port} {args} >/tmp/cr-{port}.log 2>/tmp/cr-{port}.err; \
             echo exit=$? >>/tmp/cr-{port}.err; cat /tmp/cr-{port}.log; echo '@@stderr'; cat /tmp/cr-{port}.err"
        );
        let (_, log) = self.exec(&script, secs + 30);
        let exit = exit_of(&log);
        GuestRun { log, exit }
    }
}

/// Our `softrdma rping -c` in the namespace.
fn our_client(port: u16, args: &[&str]) -> Output {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            NS,
            BIN,
            "rping",
            "-c",
            "-a",
            GUEST_IP,
            "-p",
            &port.to_string(),
        ])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .output()
        .expect("softrdma rping -c")
}

/// Our `softrdma rping -s` in the namespace on the lab's host address, listening.
fn our_server(args: &[&str]) -> OurServer {
    OurServer::start(BIN, NS, HOST_IP, port(), args)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The ping lines are rping's, byte for byte: `rdma-ping-N: ` and the rotating ASCII.
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

/// Our client against the kernel's `rping -s`: `count` pings of `size` with -V.
fn host_client_case(lab: &Lab, count: usize, size: usize, client_args: &[&str]) -> (GuestRun, String) {
    let srv = lab.guest_server(&format!("-v -S {size}"));
    let port = srv.port;
    let (c, s) = (count.to_string(), size.to_string());
    let mut args = vec!["-v", "-V", "-d", "-C", &c, "-S", &s, "--timeout", "20"];
    args.extend_from_slice(client_args);
    let out = our_client(port, &args);
    let guest = lab.guest_server_finish(srv, 10);
    let kernel = lab.kernel_check();
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "our client failed: {stderr}\nguest:\n{}",
        guest.log
    );
    let pings: Vec<&str> = stdout.lines().filter(|l| l.starts_with("ping data: ")).collect();
    check_ping_lines(&pings, "ping data: ", count, size);
    assert_eq!(guest.exit, Some(0), "guest rping -s:\n{}", guest.log);
    assert_eq!(guest.count("server ping data: "), count, "guest:\n{}", guest.log);
    let _ = kernel;
    (guest, stdout)
}

/// The kernel's `rping -c` against our server.
fn guest_client_case(lab: &Lab, count: usize, size: usize, server_args: &[&str]) -> (GuestRun, OurServerRun) {
    let s = size.to_string();
    let mut args = vec!["-S", &s];
    args.extend_from_slice(server_args);
    let srv = our_server(&args);
    let port = srv.port;
    let secs = 30 + count as u64 / 20;
    let guest = lab.guest_client(port, &format!("-v -V -C {count} -S {size}"), secs);
    let ours = srv.finish(20);
    lab.kernel_check();
    assert_eq!(
        guest.exit,
        Some(0),
        "guest rping -c:\n{}\nours: {}",
        guest.log,
        ours.stderr
    );
    let pings: Vec<&str> = guest.log.lines().filter(|l| l.starts_with("ping data: ")).collect();
    // rping -c exits 0 when the peer disconnects (D5), so a short run shows only here
    assert_eq!(
        pings.len(),
        count,
        "guest rping -c printed {} of {count} pings:\n{}\nours (ok {}): {:?}\n{}",
        pings.len(),
        guest.log,
        ours.ok,
        ours.stdout,
        ours.stderr
    );
    check_ping_lines(&pings, "ping data: ", count, size);
    assert!(ours.ok, "our server failed: {}", ours.stderr);
    let sp: Vec<&str> = ours
        .stdout
        .iter()
        .filter(|l| l.starts_with("server ping data: "))
        .map(String::as_str)
        .collect();
    check_ping_lines(&sp, "server ping data: ", count, size);
    (guest, ours)
}

// ---------------------------------------------------------------------------------------
// rping in both roles, CRC off and on

#[test]
fn host_client_vs_kernel_server_crc_off() {
    let Some(lab) = lab("host_client_vs_kernel_server_crc_off") else {
        return;
    };
    let (_, out) = host_client_case(&lab, 1000, 64, &[]);
    assert!(out.contains(" crc false "), "{out}");
    host_client_case(&lab, 200, 4096, &[]);
    host_client_case(&lab, 50, 65535, &[]);
}

#[test]
fn host_client_vs_kernel_server_crc_on() {
    let Some(lab) = lab("host_client_vs_kernel_server_crc_on") else {
        return;
    };
    // siw as responder honours the C flag: the connection runs with CRC.
    let (_, out) = host_client_case(&lab, 1000, 64, &["--crc", "on"]);
    assert!(out.contains(" crc true "), "{out}");
    host_client_case(&lab, 200, 4096, &["--crc", "on"]);
    host_client_case(&lab, 50, 65535, &["--crc", "on"]);
}

#[test]
fn kernel_client_vs_host_server_crc_off() {
    let Some(lab) = lab("kernel_client_vs_host_server_crc_off") else {
        return;
    };
    let (_, ours) = guest_client_case(&lab, 1000, 64, &[]);
    assert!(ours.line("accepted: ").contains(" crc false "), "{:?}", ours.stdout);
    guest_client_case(&lab, 200, 4096, &[]);
    guest_client_case(&lab, 50, 65535, &[]);
}

#[test]
fn kernel_client_vs_host_server_crc_on() {
    let Some(lab) = lab("kernel_client_vs_host_server_crc_on") else {
        return;
    };
    // D4: siw as initiator never asks for CRC, but turns it on when our Reply does.
    let (_, ours) = guest_client_case(&lab, 1000, 64, &["--crc", "on"]);
    assert!(ours.line("accepted: ").contains(" crc true "), "{:?}", ours.stdout);
    guest_client_case(&lab, 200, 4096, &["--crc", "on"]);
    guest_client_case(&lab, 50, 65535, &["--crc", "on"]);
}

// ---------------------------------------------------------------------------------------
// MPA variants: peer-to-peer with each RTR siw accepts

#[test]
fn p2p_rtr_variants_against_kernel_server() {
    let Some(lab) = lab("p2p_rtr_variants_against_kernel_server") else {
        return;
    };
    // siw answers P2P; with Write offered it picks Write, else Read (never our Send).
    for (offer, picked) in [
        ("write", "write"),
        ("read", "read"),
        ("write,read", "write"),
        ("read,write", "write"),
    ] {
        for crc in ["off", "on"] {
            let (_, out) = host_client_case(&lab, 50, 64, &["--p2p", offer, "--crc", crc]);
            assert!(out.contains(&format!("peer2peer rtr {picked}")), "offer {offer}: {out}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Differences (docs/interop-siw.md)

/// D1, deterministic form: siw never looks at bytes that are already in its socket when it
/// attaches the QP (`siw_qp_socket_assoc` replaces `sk_data_ready` and nothing reads what
/// is queued); they wait until more data comes. The race of D1 (an FPDU arriving between
/// siw's MPA Reply and that attach) is widened here to the whole time between siw reading the
/// Request and accepting: the guest's cm_probe accepts 1 s after CONNECT_REQUEST, a raw peer
/// sends its first Send 0.3 s after the Request (before the Reply, which RFC 5044 forbids an
/// Initiator: this shows siw's mechanism, not a protocol claim), then a second Send 1 s after
/// the Reply. Both receives complete only when the second arrives (and none is lost). The
/// control, the first Send 50 ms after the Reply (what `softrdma rping -c` does by default),
/// completes at once. Requirements: rdmap-rpcrdma.md C.2.1 (no FPDU before the Reply; the
/// Responder's ULP receives the Initiator's first FPDU), peers-and-interop-facts.md §1.2;
/// lab README hazard 3.
#[test]
fn d1_siw_ignores_bytes_queued_before_it_attaches_the_qp() {
    let Some(lab) = lab_cm("d1_siw_ignores_bytes_queued_before_it_attaches_the_qp") else {
        return;
    };
    if !python3("d1_siw_ignores_bytes_queued_before_it_attaches_the_qp", "the raw peer") {
        return;
    }
    let peer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/siw_gap_peer.py");
    // (peer timing, whether the first Send must wait for the second)
    for (timing, stalls) in [
        (["--early", "0.3"], true),
        (["--early", "0.3"], true),
        (["--first-delay", "0.05"], false),
    ] {
        let port = lab.cm_server("--accept-delay-ms 1000 --recv 2");
        let out = Command::new("ip")
            .args(["netns", "exec", NS, "python3"])
            .arg(&peer)
            .args([GUEST_IP, &port.to_string()])
            .args(timing)
            .args(["--second-after", "1.0", "--hold", "0.3"])
            .output()
            .expect("siw_gap_peer.py");
        let guest = lab.cm_server_finish(port, 10);
        lab.kernel_check();
        let (pout, perr) = text(&out);
        assert!(out.status.success(), "peer: {pout}{perr}\nguest:\n{guest}");
        assert!(guest.contains("CONNECT_REQUEST pd_len=0 pd= ird=1 ord=1"), "{guest}");
        assert!(
            guest.contains("ESTABLISHED") && guest.contains("DISCONNECTED"),
            "{guest}"
        );
        let at: Vec<u64> = guest
            .lines()
            .filter(|l| l.starts_with("RECV n=16 status=0 at_ms="))
            .map(|l| l.rsplit('=').next().unwrap().trim().parse().unwrap())
            .collect();
        assert_eq!(at.len(), 2, "both Sends received:\n{guest}\npeer:\n{pout}");
        if stalls {
            assert!(pout.contains("first send sent (before the reply)"), "{pout}");
            // The first Send sat in the socket until the second came, 1 s after the Reply.
            assert!(
                at[0] >= 800 && at[1] - at[0] < 300,
                "siw processed the queued Send without new data (fixed? revisit D1):\n{guest}\npeer:\n{pout}"
            );
        } else {
            assert!(
                at[0] < 500 && at[1] >= 800,
                "first Send 50 ms after the Reply:\n{guest}\npeer:\n{pout}"
            );
        }
    }
}

/// D1 as first seen, probabilistic: siw as responder misses an FPDU that arrives right after
/// its MPA Reply (before it hands the socket to the QP) and stalls until more data comes.
/// `--first-send-delay-ms 0` sends the first advertisement at once. The gap is the few
/// instructions between `siw_send_mpareqrep` and `siw_qp_socket_assoc` in `siw_accept`, so
/// the stall shows only when the guest's vCPU is descheduled there (6 of 12 tries when first
/// measured, at other times none of 12): not a CI test. The deterministic form is
/// `d1_siw_ignores_bytes_queued_before_it_attaches_the_qp`. Run it with
/// `SOFTRDMA_INTEROP=1 cargo test --release -p softrdma --test interop_siw -- --ignored d1_siw_responder_stalls`.
#[test]
#[ignore = "probabilistic (needs the guest vCPU descheduled inside siw_accept); d1_siw_ignores_bytes_queued_before_it_attaches_the_qp is the deterministic form"]
fn d1_siw_responder_stalls_on_an_immediate_first_fpdu() {
    let Some(lab) = lab("d1_siw_responder_stalls_on_an_immediate_first_fpdu") else {
        return;
    };
    let mut stalled = None;
    for attempt in 1..=12 {
        let srv = lab.guest_server("-v");
        let out = our_client(
            srv.port,
            &["-v", "-V", "-C", "2", "--timeout", "3", "--first-send-delay-ms", "0"],
        );
        let guest = lab.guest_server_finish(srv, 2);
        lab.kernel_check();
        let (stdout, stderr) = text(&out);
        if !out.status.success() {
            // The stall: nothing came back although TCP delivered our Send.
            assert!(stderr.contains("--timeout"), "{stderr}");
            assert_eq!(stdout.lines().filter(|l| l.starts_with("ping data")).count(), 0);
            assert_eq!(guest.count("server ping data"), 0, "{}", guest.log);
            stalled = Some(attempt);
            break;
        }
    }
    assert!(
        stalled.is_some(),
        "no stall in 12 immediate first Sends: siw may be fixed, revisit D1 and the 50 ms default"
    );
    eprintln!("d1: stalled at attempt {stalled:?}");
}

/// D2: rping's server "go ahead" is 16 zero bytes, not an advertisement of its own.
#[test]
fn d2_kernel_rping_go_ahead_is_16_zero_bytes() {
    let Some(lab) = lab("d2_kernel_rping_go_ahead_is_16_zero_bytes") else {
        return;
    };
    let (_, out) = host_client_case(&lab, 5, 64, &[]);
    let infos: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("received rping_rdma_info "))
        .collect();
    assert_eq!(infos.len(), 10, "{out}");
    for l in infos {
        assert_eq!(l, format!("received rping_rdma_info {:02x?}", [0u8; 16]), "{l}");
    }
}

/// D3: siw as initiator (rping -c) sends MPA rev 2 with the IRD/ORD words (IRD 1, ORD 1
/// from rping's conn_param), no CRC, no P2P and no private data of its own.
#[test]
fn d3_kernel_initiator_states_ird1_ord1_and_no_private_data() {
    let Some(lab) = lab("d3_kernel_initiator_states_ird1_ord1_and_no_private_data") else {
        return;
    };
    let (_, ours) = guest_client_case(&lab, 3, 64, &[]);
    let req = ours.line("child cma: ");
    assert!(req.contains("IRD 1 ORD 1, 0 bytes of private data"), "{req}");
    let acc = ours.line("accepted: ");
    assert!(acc.contains("MPA rev 2 Responder enhanced crc false"), "{acc}");
    assert!(acc.contains("ird 1 ord 1") && !acc.contains("peer2peer"), "{acc}");
}

/// D5: rping exits 0 when the peer goes away mid-run (it treats DISCONNECTED as success);
/// only the ping lines tell whether it worked. Here our server refuses the client's larger
/// buffer and closes.
#[test]
fn d5_kernel_rping_exits_0_when_the_peer_disconnects() {
    let Some(lab) = lab("d5_kernel_rping_exits_0_when_the_peer_disconnects") else {
        return;
    };
    let srv = our_server(&["-S", "64"]);
    let guest = lab.guest_client(srv.port, "-v -V -C 3 -S 1000", 30);
    let ours = srv.finish(20);
    lab.kernel_check();
    assert!(!ours.ok, "our server must refuse a 1000-byte buffer with -S 64");
    assert!(ours.stderr.contains("larger than ours"), "{}", ours.stderr);
    assert_eq!(guest.exit, Some(0), "{}", guest.log);
    assert_eq!(guest.count("ping data"), 0, "{}", guest.log);
    assert!(guest.log.contains("DISCONNECT EVENT"), "{}", guest.log);
}

/// D6: a Terminate from our side (the guest's RDMA Read names a bad STag). siw decodes the
/// Terminate control word with x86 bitfields: the RFC form (layer 0 RDMAP, type 1 remote
/// protection, code 0 invalid STag) is logged as layer 1 type 0 code 0, the siw form as
/// layer 0 type 1 code 0. Either way siw completes the refused Read with WR_FLUSH_ERR,
/// which rping does not report, and the connection goes down.
#[test]
fn d6_our_terminate_for_a_bad_stag_read_as_siw_decodes_it() {
    let Some(lab) = lab("d6_our_terminate_for_a_bad_stag_read_as_siw_decodes_it") else {
        return;
    };
    for (form, want) in [
        (None, "layer 1, type 0, code 0"),
        (Some("--siw-terminate"), "layer 0, type 1, code 0"),
    ] {
        let srv = lab.guest_server("-v");
        let mut args = vec!["-v", "-V", "-C", "3", "--timeout", "10", "--test-bad-stag"];
        args.extend(form);
        let out = our_client(srv.port, &args);
        let guest = lab.guest_server_finish(srv, 10);
        let kernel = lab.kernel_check();
        let (_, stderr) = text(&out);
        assert!(!out.status.success());
        assert!(
            stderr.contains("fatal error sent to the peer: Terminate layer 0 type 1 code 0x00"),
            "{stderr}"
        );
        assert!(
            kernel.contains(&format!("siw: got TERMINATE. {want}")),
            "{form:?}:\n{kernel}"
        );
        assert_eq!(guest.exit, Some(0), "{}", guest.log);
        assert_eq!(guest.count("server ping data"), 0, "{}", guest.log);
        assert!(!guest.log.contains("cq completion failed"), "{}", guest.log);
    }
}

/// D7: a Terminate from the kernel's side (our RDMA Read names a bad STag) surfaces in our
/// completion as remote access error with RDMAP layer 0 / type 1 / code 0, although siw
/// writes the control word in its own bit order and echoes the Read Request with the read
/// size in the MSN field and a DDP Segment Length of 0.
#[test]
fn d7_kernel_terminate_for_our_bad_stag_read() {
    let Some(lab) = lab("d7_kernel_terminate_for_our_bad_stag_read") else {
        return;
    };
    for crc in ["off", "on"] {
        let srv = our_server(&["--test-bad-stag", "--crc", crc]);
        let guest = lab.guest_client(srv.port, "-v -V -C 3", 30);
        let ours = srv.finish(20);
        lab.kernel_check();
        assert!(!ours.ok);
        assert!(
            ours.stderr
                .contains("cq completion failed status 10 (remote access error"),
            "{}",
            ours.stderr
        );
        assert!(
            ours.stderr
                .contains("fatal error received from the peer: Terminate layer 0 type 1 code 0x00"),
            "{}",
            ours.stderr
        );
        assert_eq!(guest.count("ping data"), 0, "{}", guest.log);
    }
}

/// D8: over MPA revision 1 there are no IRD/ORD words, and siw as responder then reports
/// IRD 0 / ORD 0 in the connect request; rping accepts with those (rdma_accept(NULL)), so
/// the kernel QP has no ORD and rping's RDMA Read fails to post ("post send error"). siw
/// itself answers revision 1 with revision 1. Our client stays connected until the server
/// disconnects; with no ping done it reports the session failed and exits non-zero (Linux's
/// rping exits 0 there, D5).
#[test]
fn d8_mpa_rev1_leaves_the_kernel_responder_without_ord() {
    let Some(lab) = lab("d8_mpa_rev1_leaves_the_kernel_responder_without_ord") else {
        return;
    };
    let srv = lab.guest_server("-v");
    let out = our_client(
        srv.port,
        &["-v", "-V", "-d", "-C", "3", "--timeout", "10", "--mpa-rev", "1"],
    );
    let guest = lab.guest_server_finish(srv, 10);
    lab.kernel_check();
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("rdma_connect successful: MPA rev 1 "), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ping data")).count(), 0);
    assert!(stderr.contains("client DISCONNECT EVENT"), "{stderr}");
    assert!(!out.status.success(), "no ping was done: {stderr}");
    assert!(guest.log.contains("post send error"), "{}", guest.log);
    assert_eq!(guest.count("server ping data"), 0, "{}", guest.log);
}

// ---------------------------------------------------------------------------------------
// Private data: a reject with private data in both directions, and private data at its
// limits on accepted connections in both directions (docs/interop-siw.md D9-D11).
//
// Limits: RFC 5044 allows an MPA PD_Length of 512, 508 bytes of ULP data after RFC 6581's
// 4 IRD/ORD bytes. rdma_cm's private_data_len is a u8 (255). siw refuses a received
// PD_Length over 256 (`siw_recv_mpa_rr`), its accept allows 252 ULP bytes, and
// `siw_send_mpareqrep` adds the 4 IRD/ORD bytes in a u8, so for 252..255 ULP bytes it
// announces PD_Length (n + 4) mod 256 (D10): the kernel sends at most 251 bytes intact. We
// send at most 252 (`IwarpConfig::max_private_data_tx` 256, because 253 oopses a siw
// initiator, D9) and accept up to 508.

/// The most ULP private data the kernel (siw through rdma_cm) sends intact (D10).
const KERNEL_MAX_PD: usize = 251;
/// The most ULP private data we send by default (MPA PD 256 with the IRD/ORD words, D9).
const OUR_MAX_PD: usize = 252;

/// Our client's arguments for a connect that only checks private data.
fn connect_only(n: usize) -> Vec<String> {
    [
        "-d",
        "--timeout",
        "10",
        "--test-connect-only",
        "--test-pd",
        &n.to_string(),
    ]
    .map(String::from)
    .to_vec()
}

fn our_connect_only(port: u16, n: usize, extra: &[&str]) -> Output {
    let mut args = connect_only(n);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    our_client(port, &args)
}

fn has_line(log: &str, want: &str) -> bool {
    log.lines().any(|l| l == want)
}

/// cm_probe's server (`server_args`) in the guest, our client connecting with `n` bytes of
/// private data: our client's output and the server's; the guest kernel checked.
fn our_connect_vs_cm_server(lab: &Lab, server_args: &str, n: usize) -> (Output, String) {
    let port = lab.cm_server(server_args);
    let out = our_connect_only(port, n, &[]);
    let guest = lab.cm_server_finish(port, 10);
    lab.kernel_check();
    (out, guest)
}

/// Our server (`server_args`), cm_probe's client (`client_args`) in the guest: the client's
/// exit code and output, and what our server did; the guest kernel checked.
fn cm_client_vs_our_server(lab: &Lab, server_args: &[&str], client_args: &str) -> (Option<i32>, String, OurServerRun) {
    let srv = our_server(server_args);
    let (exit, guest) = lab.cm_client(srv.port, client_args);
    let ours = srv.finish(20);
    lab.kernel_check();
    (exit, guest, ours)
}

/// Our server reports cm_probe's `n` bytes of connect request private data, exactly.
fn assert_request_pd(ours: &OurServerRun, n: usize) {
    assert_eq!(
        ours.line("connect request private data"),
        format!("connect request private data {n} bytes: {}", pd_hex(n, 0x80))
    );
}

/// One byte beyond our maximum (253, MPA PD 257 with the IRD/ORD words) in our reject or
/// accept (`server_args`): refused by our server before anything is sent, and the kernel's
/// client (`client_args`) sees its connection closed, REJECTED -104 without data (D11).
fn our_server_refuses_253_bytes(lab: &Lab, server_args: &[&str], client_args: &str) {
    let (exit, guest, ours) = cm_client_vs_our_server(lab, server_args, client_args);
    assert!(!ours.ok);
    assert!(
        ours.stderr
            .contains("private data too long: 257 octets with the provider's header, limit 256"),
        "{}",
        ours.stderr
    );
    assert_eq!(exit, Some(2), "{guest}");
    assert!(has_line(&guest, "REJECTED status=-104 pd_len=0 pd="), "{guest}");
}

/// The kernel refuses our connect: cm_probe `rdma_reject`s with n bytes, and our connect
/// returns the typed `Error::Rejected` with those bytes, exactly, and siw's IRD/ORD block
/// (1/1, mirrored from our Request): n = 0, 1 and 251, the most siw sends intact (252 is
/// D10). Requirements: rdmap-rpcrdma.md C.2.1 (R=1 reject, MPA ends), C.2.2 (PD_Length),
/// C.3 (IRD/ORD block in a Reject), E.4 (reject R=1); peers-and-interop-facts.md §1.2, §1.3.
#[test]
fn kernel_rejects_our_connect_with_private_data() {
    let Some(lab) = lab_cm("kernel_rejects_our_connect_with_private_data") else {
        return;
    };
    for n in [0, 1, KERNEL_MAX_PD] {
        let (out, guest) = our_connect_vs_cm_server(&lab, &format!("--reject {n}"), 5);
        let (_, stderr) = text(&out);
        assert!(!out.status.success(), "{n}: {guest}");
        let req = format!("CONNECT_REQUEST pd_len=5 pd={} ird=1 ord=1", pd_hex(5, 0));
        assert!(has_line(&guest, &req), "{n}: {guest}");
        assert!(
            has_line(&guest, &format!("REJECT n={n} rc=0")) && guest.contains("exit=0"),
            "{guest}"
        );
        let want = format!(
            "Error: cma event RDMA_CM_EVENT_REJECTED, MPA Reply IRD 1 ORD 1, private data {n} bytes: {}",
            pd_hex(n, 0x80)
        );
        assert!(has_line(&stderr, &want), "{n}: {stderr}");
    }
}

/// Our server rejects the kernel's connect with 0, 1, 16 and 252 bytes (256 with the IRD/ORD
/// bytes, the most a siw initiator takes, D9): cm_probe sees RDMA_CM_EVENT_REJECTED, status
/// -104 (-ECONNRESET, siw's code for an MPA reject) and exactly our bytes; rping reports the
/// same event and exits non-zero. One byte more (253) is refused by our reject itself, before
/// anything is sent (it would oops the guest, D9); the kernel then sees its connection
/// closed, which rdma_cm also reports as REJECTED -104 without data (D11). Requirements:
/// rdmap-rpcrdma.md C.2.1, C.2.2, E.4; peers-and-interop-facts.md §1.3.
#[test]
fn host_server_rejects_kernel_client_with_private_data() {
    let Some(lab) = lab_cm("host_server_rejects_kernel_client_with_private_data") else {
        return;
    };
    for n in [0, 1, 16, OUR_MAX_PD] {
        let (exit, guest, ours) = cm_client_vs_our_server(&lab, &["--test-reject", &n.to_string()], "--pd 3");
        assert!(ours.ok, "{}", ours.stderr);
        assert_request_pd(&ours, 3);
        assert!(
            ours.line("rejected the connect request")
                .contains(&format!("with {n} bytes"))
        );
        assert_eq!(exit, Some(2), "{n}: {guest}");
        let want = format!("REJECTED status=-104 pd_len={n} pd={}", pd_hex(n, 0));
        assert!(has_line(&guest, &want), "{n}: {guest}");
    }
    // rping (its CM thread exits with the handler's -1 on REJECTED).
    let srv = our_server(&["--test-reject", &OUR_MAX_PD.to_string()]);
    let guest = lab.guest_client(srv.port, "-v -C 1", 30);
    let ours = srv.finish(20);
    lab.kernel_check();
    assert!(ours.ok, "{}", ours.stderr);
    assert!(guest.log.contains("RDMA_CM_EVENT_REJECTED"), "{}", guest.log);
    assert_ne!(guest.exit, Some(0), "{}", guest.log);
    assert_eq!(guest.count("ping data"), 0);
    // One byte beyond: refused locally, the connection closed without a Reply.
    our_server_refuses_253_bytes(&lab, &["--test-reject", "253"], "--pd 3");
}

/// Kernel client -> our server on accepted connections: the connect request carries 0, 1
/// and 251 bytes (the most siw sends intact, D10) exactly as cm_probe sent them, and our
/// accept's 0, 1 and 252 bytes (our maximum, D9) reach cm_probe's ESTABLISHED event
/// exactly. One byte beyond our maximum (accept with 253) is refused by our accept before
/// anything is sent; the kernel sees REJECTED -104 without data (D11). Requirements:
/// rdmap-rpcrdma.md C.2.1, C.2.2, C.3, SEC-DOS-05 (PD_Length bounded); peers-and-interop-facts.md §1.3.
#[test]
fn kernel_client_private_data_limits_with_our_server() {
    let Some(lab) = lab_cm("kernel_client_private_data_limits_with_our_server") else {
        return;
    };
    for (n, reply) in [(0, 0), (1, 1), (KERNEL_MAX_PD, OUR_MAX_PD)] {
        let server_args = ["--test-connect-only", "--test-pd", &reply.to_string()];
        let (exit, guest, ours) = cm_client_vs_our_server(&lab, &server_args, &format!("--pd {n}"));
        assert!(ours.ok, "{}\nguest: {guest}", ours.stderr);
        assert_request_pd(&ours, n);
        assert_eq!(exit, Some(0), "{guest}");
        let want = format!("ESTABLISHED pd_len={reply} pd={} ird=1 ord=1", pd_hex(reply, 0));
        assert!(has_line(&guest, &want), "{n}/{reply}: {guest}");
        assert!(has_line(&guest, "DISCONNECTED"), "{guest}");
    }
    our_server_refuses_253_bytes(&lab, &["--test-connect-only", "--test-pd", "253"], "--pd 1");
}

/// Our client -> the kernel's server on accepted connections: our connect's 0, 1 and 252
/// bytes (our maximum) reach cm_probe's CONNECT_REQUEST exactly, and its accept's 0, 1 and
/// 251 bytes (the most siw sends intact, D10) reach our client exactly. One byte beyond on
/// each side: our connect with 253 fails locally with InvalidArgument and opens no TCP
/// connection (the listener's next request is the 1-byte one that follows); raised to the
/// RFC's 512 (`--test-max-pd-tx`), 253 bytes (MPA PD 257) are answered by siw with a TCP
/// reset and no event, and its listener goes on working; rdma_accept with 253 fails with
/// EINVAL and siw closes the connection. Requirements: rdmap-rpcrdma.md C.2.1, C.2.2 (PD_Length
/// at most 512), E.4 (PD_Length limits), SEC-DOS-05; peers-and-interop-facts.md §1.3.
#[test]
fn our_client_private_data_limits_with_kernel_server() {
    let Some(lab) = lab_cm("our_client_private_data_limits_with_kernel_server") else {
        return;
    };
    for (n, reply) in [(0, 0), (1, 1), (OUR_MAX_PD, KERNEL_MAX_PD)] {
        let (out, guest) = our_connect_vs_cm_server(&lab, &format!("--accept {reply}"), n);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stderr}\nguest: {guest}");
        let want = format!("peer private data {reply} bytes: {}", pd_hex(reply, 0x80));
        assert!(has_line(&stdout, &want), "{n}/{reply}: {stdout}");
        let req = format!("CONNECT_REQUEST pd_len={n} pd={} ird=1 ord=1", pd_hex(n, 0));
        assert!(has_line(&guest, &req), "{n}: {guest}");
        assert!(has_line(&guest, &format!("ACCEPT n={reply} rc=0")), "{guest}");
        assert!(
            has_line(&guest, "DISCONNECTED") && has_line(&guest, "exit=0"),
            "{guest}"
        );
    }
    // 253 bytes from us: locally refused (default limit), then by siw (limit raised).
    for raised in [false, true] {
        let port = lab.cm_server("--accept 0");
        let extra: &[&str] = if raised { &["--test-max-pd-tx", "512"] } else { &[] };
        let out = our_connect_only(port, 253, extra);
        let (_, stderr) = text(&out);
        assert!(!out.status.success());
        if raised {
            assert!(stderr.contains("Connection reset by peer"), "{stderr}");
        } else {
            assert!(
                stderr.contains(
                    "invalid argument: private data too long: 257 octets with the provider's header, limit 256"
                ),
                "{stderr}"
            );
        }
        // The listener saw nothing of it (no event) and still works.
        let out = our_connect_only(port, 1, &[]);
        let guest = lab.cm_server_finish(port, 10);
        lab.kernel_check();
        assert!(out.status.success(), "{}\n{guest}", text(&out).1);
        assert_eq!(guest.matches("CONNECT_REQUEST").count(), 1, "{guest}");
        assert!(
            has_line(&guest, "CONNECT_REQUEST pd_len=1 pd=00 ird=1 ord=1"),
            "{guest}"
        );
    }
    // rdma_accept with 253 bytes: EINVAL from siw_accept, which closes the connection.
    let (out, guest) = our_connect_vs_cm_server(&lab, "--accept 253", 0);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("peer closed the connection during MPA negotiation"),
        "{stderr}"
    );
    assert!(has_line(&guest, "ACCEPT n=253 rc=-1 errno=22"), "{guest}");
}

/// D10: siw announces PD_Length (n + 4) mod 256 for 252..255 bytes of ULP private data
/// (`siw_send_mpareqrep` takes the length as a u8 and adds the 4 IRD/ORD bytes to it) and
/// sends all n + 4 bytes after it. rdma_cm's u8 length allows 255 and siw_reject checks
/// nothing, siw_accept allows 252, siw_connect 256: all three calls succeed. A Reject or an
/// accepting Reply with 252 bytes reaches us as an enhanced frame with PD_Length 0 (255: 3),
/// which we refuse as malformed (RFC 6581: the IRD/ORD words are mandatory with S); a
/// Request with 252 bytes is refused by our listener (it closes, the kernel reports REJECTED
/// -104, D11) and the listener takes the next connect. Evidence:
/// docs/interop-siw/siw-accept-pd252-pd-length-0.pcap (frame 6: 276 bytes of MPA Reply, PD_Length 0).
/// Requirements: rdmap-rpcrdma.md C.2.2 (PD_Length), C.3, E.4; peers-and-interop-facts.md §1.3.
#[test]
fn d10_siw_pd_length_wraps_above_251_bytes() {
    let Some(lab) = lab_cm("d10_siw_pd_length_wraps_above_251_bytes") else {
        return;
    };
    for (server, announced) in [("--reject 252", 0), ("--reject 255", 3), ("--accept 252", 0)] {
        let (out, guest) = our_connect_vs_cm_server(&lab, server, 5);
        let (_, stderr) = text(&out);
        assert!(!out.status.success());
        let want = format!("MPA frame has S set but only {announced} octets of private data");
        assert!(stderr.contains(&want), "{server}: {stderr}");
        let call = server.trim_start_matches("--").to_uppercase().replace(' ', " n=");
        assert!(has_line(&guest, &format!("{call} rc=0")), "{server}: {guest}");
    }
    let srv = our_server(&["--test-connect-only", "--test-pd", "0"]);
    let (exit, guest) = lab.cm_client(srv.port, "--pd 252");
    assert_eq!(exit, Some(2), "{guest}");
    assert!(has_line(&guest, "CONNECT n=252 rc=0"), "{guest}");
    assert!(has_line(&guest, "REJECTED status=-104 pd_len=0 pd="), "{guest}");
    let (exit, guest) = lab.cm_client(srv.port, "--pd 1");
    let ours = srv.finish(20);
    lab.kernel_check();
    assert_eq!(exit, Some(0), "{guest}");
    assert!(ours.ok, "{}", ours.stderr);
    assert_request_pd(&ours, 1);
}

/// D11: siw as initiator loses a Reject's private data when the responder's FIN arrives in
/// the same TCP segment as the Reply: `siw_cm_llp_data_ready` ignores data once the socket
/// is no longer ESTABLISHED (tcp_data_queue runs tcp_fin before the data-ready upcall), so
/// only the peer-close work runs, and iw_cm/rdma_cm report RDMA_CM_EVENT_REJECTED with
/// status -104 (-ECONNRESET, as for a real Reject) and no private data. A raw responder
/// (tests/tools/mpa_reject_fin.py) sends Reply and FIN in one segment (TCP_CORK): cm_probe
/// gets pd_len=0; the same Reject followed by the FIN only after the initiator closed gets
/// all 16 bytes. Our engine therefore closes after a Reject only once the initiator has
/// closed (at most 1 s, `host_server_rejects_kernel_client_with_private_data`). A Linux
/// rdma_cm application also cannot tell a Reject without private data from a closed
/// connection. Evidence: docs/interop-siw/siw-initiator-reject-with-fin-loses-pd.pcap (frame
/// 6: Reply + FIN, frame 7: siw's RST). Requirements: rdmap-rpcrdma.md C.2.1 (R=1 reject,
/// then close), E.4; peers-and-interop-facts.md §1.2.
#[test]
fn d11_siw_initiator_drops_a_reject_that_comes_with_the_fin() {
    let Some(lab) = lab_cm("d11_siw_initiator_drops_a_reject_that_comes_with_the_fin") else {
        return;
    };
    if !python3(
        "d11_siw_initiator_drops_a_reject_that_comes_with_the_fin",
        "the raw responder",
    ) {
        return;
    }
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/mpa_reject_fin.py");
    for (mode, want) in [
        (None, "REJECTED status=-104 pd_len=0 pd=".to_string()),
        (
            Some("--separate"),
            format!("REJECTED status=-104 pd_len=16 pd={}", pd_hex(16, 0)),
        ),
    ] {
        let port = port();
        let mut peer = Command::new("ip")
            .args(["netns", "exec", NS, "python3"])
            .arg(&tool)
            .args([HOST_IP, &port.to_string(), "16"])
            .args(mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mpa_reject_fin.py");
        let mut first = String::new();
        BufReader::new(peer.stdout.as_mut().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_eq!(first.trim(), "listening");
        let (exit, guest) = lab.cm_client(port, "--pd 2");
        let out = peer.wait_with_output().unwrap();
        lab.kernel_check();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(exit, Some(2), "{mode:?}: {guest}");
        assert!(has_line(&guest, &want), "{mode:?}: {guest}");
    }
}

/// D9 (guest kernel crash, siw hazard 5): an MPA Reply whose PD_Length is over 256 (legal
/// up to 512 by RFC 5044) makes siw as initiator fail the connection with -EPROTO but still
/// hand iw_cm the header's length with a NULL buffer: `BUG: kernel NULL pointer dereference`
/// in kmemdup ← cm_event_handler [iw_cm] ← siw_cm_upcall. Reproduced by rejecting with 253
/// bytes of ULP private data (MPA PD 257). Ignored because it oopses the guest; run it with
/// `--ignored` and then `vm.sh restart`.
#[test]
#[ignore = "oopses the guest kernel (siw hazard 5, docs/interop-siw.md D9)"]
fn d9_reply_private_data_over_256_oopses_the_siw_initiator() {
    let Some(lab) = lab("d9_reply_private_data_over_256_oopses_the_siw_initiator") else {
        return;
    };
    let srv = our_server(&["--test-reject", "253"]);
    let _ = lab.guest_client(srv.port, "-v -C 1", 20);
    let _ = srv.finish(10);
    let (_, out) = lab.exec(
        "sleep 1; dmesg | grep -A3 'BUG: kernel NULL pointer'; cat /proc/sys/kernel/tainted",
        20,
    );
    assert!(out.contains("BUG: kernel NULL pointer dereference"), "{out}");
    assert!(out.contains("cm_event_handler"), "{out}");
}
