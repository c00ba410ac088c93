//! `softrdma nfs` against Linux's kernel NFS server (nfsd + svcrdma over soft-iWARP) in the
//! QEMU lab (`../shared/lab`, README "NFS over RDMA"; issue 7). Our client runs in the lab's
//! network namespace (192.168.77.1) against the guest (192.168.77.2): MNT over TCP via
//! rpcbind, then NFSv3 over TCP (the baseline) and over RPC-over-RDMA on port 20049.
//!
//! Checks: MNT + NULL + GETATTR + LOOKUP (`stat`), READDIRPLUS (`ls`, a reply chunk over RDMA),
//! READ of the lab's 16 MiB file with rsize 4 KiB, 64 KiB and 1 MiB (write chunks) and its
//! sha256 against the lab's, WRITE of a multi-MiB file (read chunks) read back by the guest's
//! `sha256sum`, and no BUG/WARN in the guest's kernel log afterwards. Requirement IDs:
//! RPCR-ULB-01/02 (the NFSv3 binding), RPCR-INL-01..03 (RFC 8797 sizes: 4096 both ways),
//! RPCR-CRD-02 (Linux grants 64), RPCR-WRC-01, RPCR-RDC-01, RPCR-LNG-04.
//!
//! Gate (as `interop_siw.rs`): `SOFTRDMA_INTEROP=0` skips; unset uses a lab that is already
//! built and starts the VM and the NFS server if needed; `SOFTRDMA_INTEROP=require` turns a
//! skip into a failure. Holds the same flock as the siw tests
//! (`/var/tmp/rdmalab/softrdma-interop.lock`).

#[path = "common/lab.rs"]
mod lab_common;
#[path = "common/probe.rs"]
mod probe;

use lab_common::{LAB_STATE, Lab, NS, acquire, gate, lab_dir, vm_exec};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
const SERVER: &str = "192.168.77.2";
const DATA_SHA: &str = "e714128f587492c193d3b34c78fce3d78f3abd153b833deb84c5a986d2be9c91";
const HELLO_SHA: &str = "d57f0ce5369cdaef06951c8d5b374343b0b724c0cca153223de4446ab81986b2";

fn sh_ok(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", cmd])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn bring_up() -> Result<PathBuf, String> {
    if gate() == "0" {
        return Err("SOFTRDMA_INTEROP=0".into());
    }
    if !sh_ok("test \"$(id -u)\" = 0") {
        return Err("not root (the lab needs a network namespace and a tap device)".into());
    }
    let dir = lab_dir()?;
    if !Path::new(LAB_STATE).join("vmlinuz").exists() {
        return Err(format!(
            "the lab is not built ({LAB_STATE}/vmlinuz missing); run {}/setup.sh",
            dir.display()
        ));
    }
    if !sh_ok("command -v qemu-system-x86_64 && command -v sha256sum") {
        return Err("qemu-system-x86_64 or sha256sum is not installed".into());
    }
    if vm_exec(&dir, "true", 20).0 != 0 {
        eprintln!("nfs interop: starting the lab VM (vm.sh start)");
        let st = Command::new("./vm.sh").arg("start").current_dir(&dir).status();
        if !st.map(|s| s.success()).unwrap_or(false) || vm_exec(&dir, "true", 30).0 != 0 {
            return Err("vm.sh start failed".into());
        }
    }
    // idempotent; regenerates the files when their sha256 does not match
    let out = Command::new("./vm.sh")
        .args(["nfs", "start"])
        .current_dir(&dir)
        .output()
        .map_err(|e| format!("vm.sh nfs start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "vm.sh nfs start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(dir)
}

fn lab(test: &str) -> Option<Lab> {
    acquire(test, "kernel NFS/RDMA interop lab", bring_up)
}

impl Lab {
    fn nfs(&self, args: &[&str]) -> Output {
        let out = Command::new("ip")
            .args(["netns", "exec", NS, "timeout", "300", BIN, "nfs"])
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("softrdma nfs");
        eprintln!(
            "softrdma nfs {}: {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout)
                .chars()
                .take(2000)
                .collect::<String>(),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.nfs(args);
        assert!(out.status.success(), "softrdma nfs {args:?} failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// No BUG/WARNING/Oops in the guest's kernel log.
    fn kernel_clean(&self) {
        let (_, log) = vm_exec(&self.dir, "dmesg | grep -E 'BUG|WARNING|Oops|Call Trace' || true", 30);
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("BUG") || l.contains("WARNING") || l.contains("Oops") || l.contains("Call Trace"))
            .filter(|l| !l.contains("report a bug") && !l.contains("This is not a bug"))
            .collect();
        assert!(bad.is_empty(), "guest kernel log: {bad:#?}");
    }
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A test's scratch directory under $TMPDIR, removed when the test passes and kept (its path
/// printed) when it fails, so a failed run's files and captures can be read afterwards.
struct Scratch(Option<tempfile::TempDir>);

fn scratch() -> Scratch {
    let dir = tempfile::Builder::new()
        .prefix("softrdma-nfs-interop-")
        .tempdir()
        .expect("scratch directory");
    Scratch(Some(dir))
}

impl Scratch {
    fn join(&self, name: &str) -> PathBuf {
        self.0.as_ref().expect("scratch directory").path().join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("nfs interop: kept the failed test's files in {}", dir.keep().display());
        }
    }
}

fn target(path: &str) -> String {
    format!("{SERVER}:/export{path}")
}

#[test]
fn nfs_stat_and_ls_over_tcp_and_rdma() {
    let Some(lab) = lab("nfs_stat_and_ls_over_tcp_and_rdma") else {
        return;
    };
    for t in ["tcp", "rdma"] {
        let s = lab.ok(&["stat", &target("/data-16M.bin"), "--transport", t, "--json"]);
        let v: serde_json::Value = serde_json::from_str(s.trim()).unwrap();
        assert_eq!(v["size"], 16 << 20);
        assert_eq!(v["type"], "reg");
        assert_eq!(v["export"], "/export");
        if t == "rdma" {
            // RFC 8797 with Linux's svcrdma: 4096-byte inline thresholds both ways
            assert!(
                v["transport"].as_str().unwrap().contains("inline call 4096 reply 4096"),
                "{v}"
            );
        }
        let s = lab.ok(&["ls", &target("/"), "--transport", t, "--json"]);
        let v: serde_json::Value = serde_json::from_str(s.trim()).unwrap();
        let names: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        for n in ["hello.txt", "data-16M.bin", "SHA256SUMS", "scratch"] {
            assert!(names.contains(&n), "{names:?}");
        }
        let missing = lab.nfs(&["stat", &target("/no-such-file"), "--transport", t]);
        assert!(!missing.status.success());
        assert!(String::from_utf8_lossy(&missing.stderr).contains("NFS3ERR_NOENT"));
    }
    lab.kernel_clean();
}

#[test]
fn nfs_read_16m_sha256_tcp_and_rdma_rsizes() {
    let Some(lab) = lab("nfs_read_16m_sha256_tcp_and_rdma_rsizes") else {
        return;
    };
    let scratch = scratch();
    let hello = scratch.join("hello.txt");
    lab.ok(&["get", &target("/hello.txt"), hello.to_str().unwrap()]);
    assert_eq!(sha256(&hello), HELLO_SHA);
    let runs: &[&[&str]] = &[
        &["--transport", "tcp"],
        &["--rsize", "1M"],
        &["--rsize", "64K"],
        &["--rsize", "4K", "--parallel", "8"],
    ];
    for (i, extra) in runs.iter().enumerate() {
        let local = scratch.join(&format!("data-{i}.bin"));
        let mut args = vec!["get", "--json"];
        let t = target("/data-16M.bin");
        args.push(&t);
        args.push(local.to_str().unwrap());
        args.extend_from_slice(extra);
        let s = lab.ok(&args);
        let v: serde_json::Value = serde_json::from_str(s.trim()).unwrap();
        eprintln!("READ 16 MiB {extra:?}: {:.1} MB/s", v["mb_per_s"].as_f64().unwrap());
        assert_eq!(sha256(&local), DATA_SHA, "{extra:?}");
        let _ = std::fs::remove_file(&local);
    }
    lab.kernel_clean();
}

#[test]
fn nfs_write_multi_mib_read_back_by_the_guest() {
    let Some(lab) = lab("nfs_write_multi_mib_read_back_by_the_guest") else {
        return;
    };
    let scratch = scratch();
    // 6 MiB + 3 bytes of deterministic, incompressible-ish data
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..(6 << 20) + 3)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let local = scratch.join("up.bin");
    std::fs::write(&local, &data).unwrap();
    let want = sha256(&local);
    // UNSTABLE + COMMIT (the default, as Linux's client) and FILE_SYNC
    for (name, extra) in [
        ("w-rdma-1m.bin", &["--wsize", "1M"][..]),
        ("w-rdma-64k.bin", &["--wsize", "64K"][..]),
        ("w-rdma-1m-sync.bin", &["--wsize", "1M", "--stable", "file-sync"][..]),
        ("w-tcp.bin", &["--transport", "tcp"][..]),
    ] {
        let t = target(&format!("/scratch/{name}"));
        let mut args = vec!["put", "--json", local.to_str().unwrap(), &t];
        args.extend_from_slice(extra);
        let s = lab.ok(&args);
        let v: serde_json::Value = serde_json::from_str(s.trim()).unwrap();
        eprintln!("WRITE 6 MiB {extra:?}: {:.1} MB/s", v["mb_per_s"].as_f64().unwrap());
        let (rc, out) = vm_exec(&lab.dir, &format!("sha256sum /export/scratch/{name}"), 60);
        assert_eq!(rc, 0, "{out}");
        assert!(out.contains(&want), "guest sha256 of {name}: {out} (want {want})");
        // REMOVE through our client; the guest no longer sees the file
        lab.ok(&["rm", &t]);
        let (rc, out) = vm_exec(&lab.dir, &format!("test ! -e /export/scratch/{name}"), 30);
        assert_eq!(rc, 0, "{name} still there after nfs rm: {out}");
    }
    lab.kernel_clean();
}

/// Issue 7 faults: the server stopping mid-READ (`vm.sh nfs stop`) gives the caller a clear
/// error within the call timeout and the retries, and no hang (RPCR-MEM-05: the requester
/// retransmits after reconnecting, the reconnect is refused, the RPC fails).
#[test]
fn nfs_server_stops_mid_read() {
    let Some(lab) = lab("nfs_server_stops_mid_read") else {
        return;
    };
    let scratch = scratch();
    let local = scratch.join("fault.bin");
    // lets guest_task_dump() ask for the guest's task stacks should the stop hang
    let _ = lab.exec("echo 1 > /proc/sys/kernel/sysrq", 20);
    // and the TCP headers of the RDMA connections, evidence should the stop hang
    let pcap = scratch.join("stop.pcap");
    let mut capture = Command::new("ip")
        .args(["netns", "exec", NS, "tcpdump", "-i", "br0", "-U", "-s", "96", "-w"])
        .arg(&pcap)
        .args(["tcp", "port", "20049"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok();
    let child = Command::new("ip")
        .args(["netns", "exec", NS, "timeout", "120", BIN, "nfs", "get"])
        .arg(target("/data-16M.bin"))
        .arg(&local)
        .args(["--rsize", "4K", "--timeout", "10"])
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("softrdma nfs get");
    // wait until data flows, then stop the server
    let t0 = std::time::Instant::now();
    while std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0) < 256 << 10 {
        assert!(t0.elapsed().as_secs() < 60, "no data arrived");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let ts = std::time::Instant::now();
    let stop = Command::new("./vm.sh")
        .args(["nfs", "stop"])
        .env("RDMALAB_EXEC_TIMEOUT", "60")
        .current_dir(&lab.dir)
        .output()
        .unwrap();
    // Guest kernel hazard (Linux 6.1 svcrdma on siw, seen in 2 of about 10 CI runs and not
    // reproduced in 40 tries by hand): `rpc.nfsd 0` can hang in kthread_stop() while an
    // RDMA client is mid-READ, and then every later guest command waits behind it. A
    // server that cannot shut down is the guest's fault, not the client's; what this test
    // owns is the client's answer, which is checked below either way. The guest's task
    // dump goes to the output as evidence, and the VM is restarted for the tests after us.
    let hung = !stop.status.success();
    if hung {
        let dump = guest_task_dump(&["nfsd", "rpc.nfsd"]);
        eprintln!(
            "GUEST KERNEL HAZARD: vm.sh nfs stop: {} after {:?}\n{}{}\n--- guest tasks (sysrq-t) ---\n{dump}",
            stop.status,
            ts.elapsed(),
            String::from_utf8_lossy(&stop.stdout),
            String::from_utf8_lossy(&stop.stderr)
        );
    } else {
        eprintln!("vm.sh nfs stop took {:?}", ts.elapsed());
    }
    let t1 = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("after nfs stop: {} in {:?}: {err}", out.status, t1.elapsed());
    if let Some(c) = capture.as_mut() {
        let _ = Command::new("kill").arg(c.id().to_string()).status();
        let _ = c.wait();
    }
    if hung {
        // the last segments of each RDMA connection: who closed, and how
        let t = Command::new("tshark")
            .arg("-r")
            .arg(&pcap)
            .args(["-T", "fields", "-e", "frame.time_relative", "-e", "tcp.stream"])
            .args([
                "-e",
                "tcp.srcport",
                "-e",
                "tcp.dstport",
                "-e",
                "tcp.flags.str",
                "-e",
                "tcp.len",
            ])
            .output();
        let text = t
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!(
            "--- last TCP segments on port 20049 ({} in {}) ---\n{}",
            lines.len(),
            pcap.display(),
            lines[lines.len().saturating_sub(60)..].join("\n")
        );
        let up = Command::new("./vm.sh")
            .arg("restart")
            .current_dir(&lab.dir)
            .output()
            .unwrap();
        assert!(up.status.success(), "vm.sh restart after the hazard");
    }
    let start = Command::new("./vm.sh")
        .args(["nfs", "start"])
        .current_dir(&lab.dir)
        .output()
        .unwrap();
    assert!(start.status.success(), "vm.sh nfs start");
    assert_ne!(out.status.code(), Some(124), "softrdma nfs get hung");
    if hung && out.status.success() {
        // the server never stopped serving (seen: 16 MiB in 29 s while `rpc.nfsd 0` hung),
        // so the client finishing is right, provided the file is whole
        assert_eq!(sha256(&local), DATA_SHA, "a download that succeeded is whole");
    } else {
        // a clear error, not the timeout(1) kill (exit 124), not a partial file passed off as whole
        assert!(!out.status.success(), "the server stopped mid-READ, yet: {err}");
        assert!(
            err.contains("READ") && (err.contains("connection") || err.contains("reply")),
            "{err}"
        );
        assert!(std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0) < 16 << 20);
    }
    if !hung {
        lab.kernel_clean();
    }
}

/// The guest's tasks whose name is in `names`, with their kernel stacks, taken from the
/// serial console after SysRq-T through QEMU's monitor: unlike `vm.sh exec`, this works
/// while the guest's command agent is stuck behind a hung task. Needs `kernel.sysrq` to
/// allow task dumps (set before the risky step).
fn guest_task_dump(names: &[&str]) -> String {
    use std::io::Write;
    let console = Path::new(LAB_STATE).join("console.log");
    let before = std::fs::metadata(&console).map(|m| m.len()).unwrap_or(0) as usize;
    let sent = std::os::unix::net::UnixStream::connect(Path::new(LAB_STATE).join("monitor.sock")).and_then(|mut s| {
        std::thread::sleep(std::time::Duration::from_millis(300));
        s.write_all(b"sendkey alt-sysrq-t\n")?;
        // QEMU drops a command whose connection closes before it ran: wait for its echo
        s.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
        let mut buf = [0u8; 4096];
        let t0 = std::time::Instant::now();
        let mut seen = Vec::new();
        while t0.elapsed().as_secs() < 2 {
            match std::io::Read::read(&mut s, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
            if seen.windows(6).filter(|w| w == b"(qemu)").count() >= 2 {
                break;
            }
        }
        Ok(())
    });
    if let Err(e) = sent {
        return format!("(no QEMU monitor: {e})");
    }
    // the dump goes out through the emulated serial port: wait until the log stops growing
    let size = || std::fs::metadata(&console).map(|m| m.len()).unwrap_or(0);
    let t0 = std::time::Instant::now();
    let mut last = size();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let now = size();
        if (now == last && now as usize > before) || t0.elapsed().as_secs() > 20 {
            break;
        }
        last = now;
    }
    let log = std::fs::read(&console).unwrap_or_default();
    let log = String::from_utf8_lossy(log.get(before..).unwrap_or_default());
    // one block per task: "task:NAME state:S ..." up to the next "task:"
    let mut keep = String::new();
    let mut on = false;
    for line in log.lines() {
        if let Some(rest) = line.split("task:").nth(1) {
            let name = rest.split_whitespace().next().unwrap_or_default();
            on = names.iter().any(|n| name == *n || name.starts_with(&format!("{n}/")));
        }
        if on {
            keep.push_str(line);
            keep.push('\n');
        }
    }
    if keep.is_empty() {
        format!("(no matching task in {} bytes of console output)", log.len())
    } else {
        keep
    }
}

/// Issue 7 faults: a retransmitted call after reconnect completes. The host's TCP connection
/// under the iWARP stream is reset mid-READ (`ss -K`); the Requester reconnects (new MPA and
/// RFC 8797 exchange), retransmits the lost READs with the same XIDs and the file is whole.
#[test]
fn nfs_read_survives_a_connection_reset() {
    let Some(lab) = lab("nfs_read_survives_a_connection_reset") else {
        return;
    };
    let scratch = scratch();
    let local = scratch.join("reset.bin");
    let child = Command::new("ip")
        .args(["netns", "exec", NS, "timeout", "120", BIN, "nfs", "get", "--json"])
        .arg(target("/data-16M.bin"))
        .arg(&local)
        .args(["--rsize", "64K", "--timeout", "10"])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("softrdma nfs get");
    let t0 = std::time::Instant::now();
    while std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0) < 1 << 20 {
        assert!(t0.elapsed().as_secs() < 60, "no data arrived");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let kill = Command::new("ip")
        .args([
            "netns", "exec", NS, "ss", "-K", "-tn", "dst", SERVER, "dport", "=", "20049",
        ])
        .output()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    assert_eq!(sha256(&local), DATA_SHA);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    if v["connects"].as_u64() == Some(1) {
        // the kernel may lack SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY): nothing was reset
        eprintln!("SKIPPED the reset part: ss -K did not reset the connection: {kill:?}");
    } else {
        assert!(v["connects"].as_u64().unwrap() >= 2, "{v}");
    }
    lab.kernel_clean();
}

/// Issue 7 faults: "an RPC whose chunk memory the server cannot reach gets ERR_CHUNK handling as
/// RFC 8166 §4.5 describes", against Linux 6.1's svcrdma, through `softrdma nfs probe`:
/// - a Write chunk (4 KiB for a 64 KiB READ) and a Reply chunk (8 KiB, no Write list) too small:
///   Linux answers RDMA_ERROR/ERR_CHUNK before writing (svc_rdma_sendto's -E2BIG path), on the
///   same connection (§4.5.3 third bullet; RPCR-ERR-05, B.4.5 #19 from the Requester's side);
/// - a stale Write-chunk handle: svcrdma's RDMA Write meets our Terminate (siw logs `got
///   TERMINATE. layer 1, type 1, code 0`: DDP tagged buffer, invalid STag), the connection ends,
///   our client reconnects and retransmits the same XID, and Linux executes it again: the data
///   arrives whole. RFC 8166 §4.5.3 says the Responder *should* answer ERR_CHUNK after the
///   reconnect; Linux does not remember failed XIDs (docs/interop-nfs.md; RPCR-MEM-05);
/// - a stale Read-chunk handle on a WRITE: the same through svcrdma's RDMA Read (siw logs the
///   RDMAP remote-protection Terminate in its bit order, D6), and the retransmitted WRITE lands.
///
/// The guest kernel stays clean (no BUG/WARN), and the file the WRITE made has the bytes.
#[test]
fn nfs_chunk_errors_err_chunk_and_terminate_recovery() {
    let Some(lab) = lab("nfs_chunk_errors_err_chunk_and_terminate_recovery") else {
        return;
    };
    let (_, before) = vm_exec(&lab.dir, "dmesg | grep -c 'siw: got TERMINATE' || true", 30);
    let out = lab.nfs(&[
        "probe",
        "--json",
        &target("/data-16M.bin"),
        "--scratch",
        "/export/scratch",
        "--timeout",
        "20",
    ]);
    let s = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("{e}: {s}"));
    assert!(out.status.success(), "{v:#}");
    let file = probe::check(
        &v,
        &[
            ("short-write-chunk", "RDMA_ERROR ERR_CHUNK", 0),
            ("short-reply-chunk", "RDMA_ERROR ERR_CHUNK", 0),
            ("stale-write-handle", "completed (after 1 reconnect", 1),
            ("stale-read-handle", "completed (after 1 reconnect", 1),
        ],
    )
    .expect("the stale-read-handle case ran");
    // the two Terminates reached siw; the retransmitted WRITE's file holds the first 64 KiB
    let (_, after) = vm_exec(&lab.dir, "dmesg | grep -c 'siw: got TERMINATE' || true", 30);
    let n = |s: &str| s.trim().parse::<u32>().unwrap_or(0);
    assert_eq!(n(&after) - n(&before), 2, "siw Terminates: {before} -> {after}");
    let (rc, sums) = vm_exec(
        &lab.dir,
        &format!("head -c 65536 /export/data-16M.bin | sha256sum; sha256sum < /export{file}; rm -f /export{file}"),
        60,
    );
    assert_eq!(rc, 0, "{sums}");
    let l: Vec<&str> = sums
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert!(l.len() == 2 && l[0] == l[1], "the WRITE's file differs: {sums}");
    lab.kernel_clean();
}

/// One RPC-over-RDMA message in a capture, as tshark decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Shape {
    /// rdma_proc: 0 RDMA_MSG, 1 RDMA_NOMSG, 4 RDMA_ERROR.
    proc_: u32,
    read_list: bool,
    write_list: bool,
    reply_chunk: bool,
}

/// (NFSv3 procedure, call or reply) -> the chunk usages seen, from tshark's `rpcordma`
/// dissector. A Call whose arguments went into a Read chunk is not dissected as RPC (its
/// Payload stream lacks the data), so the procedure comes from the Reply with the same XID; the
/// first message of an XID is the Call.
fn chunk_usage(pcap: &Path) -> std::collections::BTreeMap<(u32, bool), std::collections::BTreeSet<Shape>> {
    let out = Command::new("tshark")
        .args(["-r", pcap.to_str().unwrap(), "-Y", "rpcordma", "-T", "fields"])
        .args([
            "-e",
            "rpcordma.xid",
            "-e",
            "rpcordma.msg_type",
            "-e",
            "rpcordma.reads_count",
        ])
        .args([
            "-e",
            "rpcordma.writes_count",
            "-e",
            "rpcordma.reply_count",
            "-e",
            "nfs.procedure_v3",
        ])
        .output()
        .expect("tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let first = |s: &str| s.split(',').next().unwrap_or("").trim().to_string();
    let num = |s: &str| {
        let s = first(s);
        if let Some(h) = s.strip_prefix("0x") {
            u32::from_str_radix(h, 16).unwrap_or(0)
        } else {
            s.parse().unwrap_or(0)
        }
    };
    let mut msgs = Vec::new();
    let mut procs = std::collections::HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        if f.len() < 6 || f[0].is_empty() {
            continue;
        }
        let xid = f[0].to_string();
        if !f[5].is_empty() {
            procs.insert(xid.clone(), num(f[5]));
        }
        let is_call = seen.insert(xid.clone());
        let shape = Shape {
            proc_: num(f[1]),
            read_list: num(f[2]) > 0,
            write_list: num(f[3]) > 0,
            reply_chunk: num(f[4]) > 0,
        };
        msgs.push((xid, is_call, shape));
    }
    let mut m: std::collections::BTreeMap<(u32, bool), std::collections::BTreeSet<Shape>> = Default::default();
    for (xid, is_call, shape) in msgs {
        if let Some(&p) = procs.get(&xid) {
            m.entry((p, is_call)).or_default().insert(shape);
        }
    }
    m
}

/// Issue 7 "the wire": our own capture on br0 of `ls`, `get` of hello.txt (36 bytes, still
/// through a Write chunk as Linux's client does) and `put` of 64 KiB against Linux's nfsd,
/// decoded by tshark next to Linux's reference capture (`results/vm-lo-nfs-rdma.pcap`: Linux's
/// client and server), shows the same chunk usage for the same operations: a Write list in
/// READ calls (and in the Reply that fills it), a Read list in WRITE calls, a Reply chunk in
/// READDIRPLUS calls answered with RDMA_NOMSG, and plain RDMA_MSG for the rest
/// (RPCR-ULB-01/02, RPCR-WRC-01, RPCR-RDC-01, RPCR-LNG-04). Differences in segment counts and
/// Positions are written down in docs/interop-nfs.md (D1, D4).
#[test]
fn nfs_wire_chunk_usage_matches_linux_reference() {
    let Some(lab) = lab("nfs_wire_chunk_usage_matches_linux_reference") else {
        return;
    };
    let scratch = scratch();
    let reference = lab.dir.join("results/vm-lo-nfs-rdma.pcap");
    if !reference.exists() || !sh_ok("command -v tcpdump && command -v tshark") {
        eprintln!(
            "SKIPPED nfs_wire_chunk_usage_matches_linux_reference: needs tcpdump, tshark and {}",
            reference.display()
        );
        assert_ne!(gate(), "require", "tcpdump/tshark/reference capture missing");
        return;
    }
    let pcap = scratch.join("ours-br0.pcap");
    let mut dump = Command::new("ip")
        .args(["netns", "exec", NS, "tcpdump", "-i", "br0", "-U", "-s", "0", "-w"])
        .arg(&pcap)
        .arg("tcp port 20049")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump");
    // tcpdump prints "listening on br0 ..." once its capture is open
    let err = dump.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    let mut said = String::new();
    let listening = loop {
        match lines.next() {
            Some(Ok(l)) => {
                said.push_str(&l);
                said.push('\n');
                if l.contains("listening on") {
                    break true;
                }
            }
            _ => break false,
        }
    };
    if !listening {
        let _ = dump.kill();
        let _ = dump.wait();
        panic!("tcpdump did not start: {said}");
    }
    let local = scratch.join("wire-up.bin");
    std::fs::write(&local, (0..65536u32).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>()).unwrap();
    lab.ok(&["ls", &target("/")]);
    lab.ok(&[
        "get",
        &target("/hello.txt"),
        scratch.join("wire-hello.txt").to_str().unwrap(),
    ]);
    lab.ok(&[
        "put",
        local.to_str().unwrap(),
        &target("/scratch/wire-up.bin"),
        "--wsize",
        "64K",
    ]);
    let _ = vm_exec(&lab.dir, "rm -f /export/scratch/wire-up.bin", 30);
    // let tcpdump drain what the kernel holds for it: stop once the file has not grown for 1 s
    let size = || std::fs::metadata(&pcap).map(|m| m.len()).unwrap_or(0);
    let (mut last, mut still) = (size(), 0);
    while still < 10 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = size();
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    let _ = Command::new("kill").args(["-INT", &dump.id().to_string()]).status();
    let _ = dump.wait();

    let ours = chunk_usage(&pcap);
    let linux = chunk_usage(&reference);
    eprintln!("ours:  {ours:?}\nlinux: {linux:?}");
    let msg = |proc_: u32| Shape {
        proc_,
        read_list: false,
        write_list: false,
        reply_chunk: false,
    };
    // the chunk usage the binding prescribes, in both captures
    for (key, want) in [
        ((6, true), msg(0).write()),   // READ call: a Write list
        ((6, false), msg(0).write()),  // READ reply: RDMA_MSG returning the Write chunk
        ((7, true), msg(0).read()),    // WRITE call: a Read list
        ((7, false), msg(0)),          // WRITE reply: inline
        ((17, true), msg(0).reply()),  // READDIRPLUS call: a Reply chunk
        ((17, false), msg(1).reply()), // READDIRPLUS reply: RDMA_NOMSG in the Reply chunk
    ] {
        for (who, m) in [("ours", &ours), ("Linux's", &linux)] {
            let got = m
                .get(&key)
                .unwrap_or_else(|| panic!("{who} capture has no {key:?}: {m:?}"));
            assert_eq!(
                got.iter().copied().collect::<Vec<_>>(),
                vec![want],
                "{who} NFS proc {} {}",
                key.0,
                if key.1 { "call" } else { "reply" }
            );
        }
    }
    // every other procedure both captures hold travels the same way
    for (key, shapes) in &ours {
        if let Some(l) = linux.get(key) {
            assert_eq!(shapes, l, "NFS proc {key:?}");
        }
    }
    assert!(
        ours.contains_key(&(1, true)) || ours.contains_key(&(3, true)),
        "{ours:?}"
    );
    lab.kernel_clean();
}

impl Shape {
    fn read(mut self) -> Shape {
        self.read_list = true;
        self
    }
    fn write(mut self) -> Shape {
        self.write_list = true;
        self
    }
    fn reply(mut self) -> Shape {
        self.reply_chunk = true;
        self
    }
}
