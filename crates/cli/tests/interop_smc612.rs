//! SMC-Rv2 between our `SmcStream` / `SmcListener` (host side of the lab, 192.168.77.1 in
//! the `rdmalab` namespace, a soft RoCEv2 device) and the Linux 6.12 kernel's net/smc in a
//! second lab VM (192.168.77.3, rxe0 on eth0, tap1): issue 15 "Interop with Linux";
//! requirements A1.3–A1.11 (CLC v2, QP setup from the CLC), A4.2 (first contact, CONFIRM
//! LINK), C5 (Linux forms), SMC-OPT-1/2 (the TCP option through `smc::sockops`).
//!
//! 1. Our client → the guest's AF_SMC server (`tests/guest/smc_cat.c listen`): SMC-Rv2
//!    with UEID `RDMALAB-SMC-TEST`, 16 MiB each way at once, sha256-checked on both sides.
//! 2. The guest's AF_SMC client (`smc_cat connect`) → our server: the same.
//!
//! Each side checks its mode: ours `Mode::SmcR`, the guest's `smc_test diag` (run by
//! smc_cat before it closes) `mode=0(SMCR)`. The guest kernel log must stay free of
//! BUG/WARN/Oops and taint.
//!
//! The second VM: `/var/tmp/rdmalab-612` must hold Debian's 6.12 kernel build of the lab
//! (`RDMALAB_SIW=0 RDMALAB_DIR=/var/tmp/rdmalab-612 KVER=6.12.117+deb12-amd64 ./setup.sh
//! --without-nfs`); without it the test skips with that reason. If the VM does not answer,
//! the test starts it (tap1, 52:54:00:77:00:03, 192.168.77.3/24, TCG) and stops it again at
//! the end (`RDMALAB612_KEEP=1` keeps it). The default VM (6.1, tap0) is not touched.
//! Host-side processes run in the namespace (`nsenter --net`, this binary again with
//! `SMC612_CHILD`), each in its own cgroup with the sock_ops program for its port.
//! `SOFTRDMA_INTEROP=0` skips; `=require` turns every skip into a failure.

#[path = "common/child.rs"]
mod child;
#[path = "common/lab.rs"]
mod lab_common;
#[path = "common/smc_lab.rs"]
mod smc_lab;

use lab_common::have;
use sha2::{Digest, Sha256};
use smc_lab::{SockopsCgroup, build_static, cgroup2_mount, hex, value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NS: &str = "rdmalab";
const LAB: &str = "/var/tmp/rdmalab-612";
const HOST_IP: &str = "192.168.77.1";
const GUEST_IP: &str = "192.168.77.3";
const UEID: &str = "RDMALAB-SMC-TEST";
const LEN: usize = 16 << 20;
const TEST: &str = "smc_r_v2_with_linux_612_both_directions";

fn skip(why: &str) {
    if std::env::var("SOFTRDMA_INTEROP").as_deref() == Ok("require") {
        panic!("{TEST}: the 6.12 lab is required (SOFTRDMA_INTEROP=require) but: {why}");
    }
    eprintln!("SKIPPED {TEST}: {why}");
}

/// `vm.sh` of the 6.12 VM (its own state directory, tap, MAC and address).
fn vm(dir: &Path) -> Command {
    let mut c = Command::new("./vm.sh");
    c.current_dir(dir)
        .env("RDMALAB_DIR", LAB)
        .env("RDMALAB_ACCEL", "tcg")
        .env("RDMALAB_TAP", "tap1")
        .env("RDMALAB_VM_MAC", "52:54:00:77:00:03")
        .env("RDMALAB_VM_IP", "192.168.77.3/24");
    c
}

/// Runs `script` in the 6.12 guest: exit code and output.
fn exec(dir: &Path, script: &str, timeout: u64) -> (i32, String) {
    let mut child = match vm(dir)
        .args(["exec", "-t", &timeout.to_string(), "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return (-1, e.to_string()),
    };
    let _ = child.stdin.take().unwrap().write_all(script.as_bytes());
    let out = child.wait_with_output().expect("vm.sh exec");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), s)
}

/// The test data of one direction: 16 MiB of a seeded xorshift stream.
fn data(seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(LEN);
    while v.len() < LEN {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

// ---------------------------------------------------------------------------------------
// Child mode: in the lab namespace, in a cgroup with the sock_ops program for one port.

fn child_mode(spec: &str) {
    // connect:IP:PORT:DATAFILE or listen:IP:PORT:DATAFILE
    let mut it = spec.splitn(4, ':');
    let (mode, ip, port, file) = (
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
    );
    let addr: SocketAddr = format!("{ip}:{port}").parse().expect("addr");
    let cg = SockopsCgroup::enter("softrdma-smc612", addr.port());
    let guard = cg.option();

    let dev = <roce::RoceFactory as verbs::DeviceFactory>::open(
        &roce::RoceFactory,
        &verbs::DeviceOptions::new().with("addr", HOST_IP).with("name", "smc612"),
    )
    .expect("RoCE device on 192.168.77.1");
    // A short linger: the group ends (DELETE LINK, v2 form) before this process exits.
    let cfg = smc::SmcConfig {
        ueid: Some(UEID.into()),
        linger: Duration::from_millis(300),
        ..smc::SmcConfig::default()
    };
    let out = std::fs::read(file).expect("data file");
    let mut t0 = Instant::now();
    if mode == "connect" {
        println!("ready");
    }
    let (stream, offered) = if mode == "connect" {
        let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
        let offered = guard.peer_offered_smc(&tcp);
        let cfg = smc::SmcConfig {
            propose: offered == Some(true),
            ..cfg
        };
        (
            smc::SmcStream::connect_over(tcp, &dev, &cfg).expect("SMC connect"),
            offered,
        )
    } else {
        let l = TcpListener::bind(addr).expect("bind");
        println!("ready");
        let (tcp, _) = l.accept().expect("accept");
        t0 = Instant::now();
        let offered = guard.peer_offered_smc(&tcp);
        (
            smc::SmcStream::accept_over(tcp, Some(&dev), &cfg, offered).expect("SMC accept"),
            offered,
        )
    };
    println!("setup_ms={}", t0.elapsed().as_millis());
    println!("offered={offered:?}");
    println!("mode={:?}", stream.mode());
    let mut w = stream.try_clone().expect("clone");
    let writer = std::thread::spawn(move || {
        for c in out.chunks(256 << 10) {
            w.write_all(c)?;
        }
        w.shutdown(std::net::Shutdown::Write)
    });
    let mut r = stream;
    let mut h = Sha256::new();
    let mut n = 0usize;
    let mut buf = vec![0u8; 256 << 10];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                h.update(&buf[..k]);
                n += k;
            }
            Err(e) => {
                println!("read_error={e}");
                break;
            }
        }
    }
    let wres = writer.join().expect("writer");
    println!("write={wres:?}");
    println!("received={n}");
    println!("sha={}", hex(&h.finalize()));
    println!("ms={}", t0.elapsed().as_millis());
    let snap = smc::stats::snapshot();
    for l in snap.link_groups.iter().flat_map(|g| &g.links) {
        println!(
            "link local_gid={} peer_gid={} local_qpn={} peer_qpn={} llc_sent={} llc_received={}",
            l.local_gid, l.peer_gid, l.local_qpn, l.peer_qpn, l.llc_sent, l.llc_received
        );
    }
    // Closed both ways: the connection leaves the engine once its close handshake is done.
    drop(r);
    let tc = Instant::now();
    while tc.elapsed() < Duration::from_secs(10) && !smc::stats::snapshot().connections.is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("close_ms={}", tc.elapsed().as_millis());
    // Then the idle group: DELETE LINK after the linger time (the client waits 2 s more).
    let tl = Instant::now();
    while tl.elapsed() < Duration::from_secs(8) && smc::live_links() != 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "group_end_ms={} live_links={}",
        tl.elapsed().as_millis(),
        smc::live_links()
    );
    drop(cg);
    println!("done");
}

fn host_child(spec: &str) -> std::process::Child {
    smc_lab::host_child(
        NS,
        TEST,
        &[("SMC612_CHILD", spec), ("SOFTRDMA_SMC_STATS", "off")],
        Stdio::piped(),
    )
}

/// Collects a child's stdout lines until it exits (or `timeout`, then it is killed).
fn collect(
    mut c: std::process::Child,
    rx: Option<std::sync::mpsc::Receiver<String>>,
    timeout: Duration,
) -> Vec<String> {
    let rx = rx.unwrap_or_else(|| child::lines_once_ready(&mut c, "ready", timeout));
    let deadline = Instant::now() + timeout;
    let mut lines = Vec::new();
    while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        lines.push(l);
    }
    let _ = c.kill();
    let out = c.wait_with_output().expect("child");
    if !lines.iter().any(|l| l == "done") {
        eprintln!("child stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    lines
}

struct VmStop(Option<PathBuf>);

impl Drop for VmStop {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = vm(&dir).arg("stop").output();
            let _ = Command::new("ip").args(["-n", NS, "link", "del", "tap1"]).output();
        }
    }
}

#[test]
fn smc_r_v2_with_linux_612_both_directions() {
    if let Some(spec) = std::env::var_os("SMC612_CHILD") {
        child_mode(&spec.to_string_lossy());
        return;
    }
    if std::env::var("SOFTRDMA_INTEROP").as_deref() == Ok("0") {
        return skip("SOFTRDMA_INTEROP=0");
    }
    if !Path::new(LAB).join("vmlinuz").exists() || !Path::new(LAB).join("initramfs.img").exists() {
        return skip(&format!(
            "the 6.12 lab is not built ({LAB}/vmlinuz missing): RDMALAB_SIW=0 RDMALAB_DIR={LAB} \
             KVER=6.12.117+deb12-amd64 ../shared/lab/setup.sh --without-nfs"
        ));
    }
    let Ok(dir) = lab_common::lab_dir() else {
        return skip("no lab scripts (set RDMALAB_REPO)");
    };
    for tool in ["nsenter", "gcc", "qemu-system-x86_64"] {
        if !have(tool) {
            return skip(&format!("{tool} missing"));
        }
    }
    if cgroup2_mount().is_none() {
        return skip("no cgroup v2 mount (the sock_ops program needs one)");
    }
    let share = Path::new(LAB).join("share");
    let _ = std::fs::create_dir_all(&share);
    let tools = [
        (dir.join("tools/smc_test.c"), share.join("smc_test")),
        (
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/guest/smc_cat.c"),
            share.join("smc_cat"),
        ),
    ];
    for (src, out) in &tools {
        if let Err(why) = build_static(src, out) {
            return skip(&why);
        }
    }
    // One user of the 6.12 VM and of 192.168.77.1's RoCE port at a time: the 6.12 lab's
    // lock and the default lab's interop lock (other interop tests open devices there).
    let lock = |p: &Path| {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(p)
            .ok()?;
        f.lock().ok()?;
        Some(f)
    };
    let _l1 = lock(&Path::new(LAB).join("softrdma-interop.lock"));
    let _l2 = Path::new("/var/tmp/rdmalab")
        .exists()
        .then(|| lock(Path::new("/var/tmp/rdmalab/softrdma-interop.lock")));

    let t_start = Instant::now();
    let mut stop = VmStop(None);
    if exec(&dir, "true", 20).0 != 0 {
        if !Path::new(LAB).join("kvm-unusable").exists() {
            let _ = std::fs::write(Path::new(LAB).join("kvm-unusable"), "tcg\n");
        }
        let out = vm(&dir).arg("start").output().expect("vm.sh start");
        if !out.status.success() || exec(&dir, "true", 30).0 != 0 {
            let _ = vm(&dir).arg("stop").output();
            return skip(&format!(
                "the 6.12 VM did not start: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if std::env::var("RDMALAB612_KEEP").as_deref() != Ok("1") {
            stop.0 = Some(dir.clone());
        }
    }
    let boot_s = t_start.elapsed().as_secs_f64();
    // UEID and PNET-IDs (eth0 and rxe0 port 1), as the lab README's recipe; idempotent.
    let (rc, out) = exec(
        &dir,
        &format!(
            "T=/mnt/host/smc_test; modprobe -a smc smc_diag || exit 3; \
             rdma link show | grep -q 'rxe0/1 state ACTIVE' || exit 4; \
             $T ueid show | grep -q {UEID} || $T ueid add {UEID} || exit 5; \
             $T pnet show | grep -q eth0 || $T pnet add LAB eth0 - 0 || exit 6; \
             $T pnet show | grep -q rxe0 || $T pnet add LAB - rxe0 1 || exit 7; \
             head -c {LEN} /dev/urandom > /tmp/g.bin; sha256sum /tmp/g.bin; \
             dmesg | wc -l > /tmp/softrdma-dmesg-mark; echo configured"
        ),
        60,
    );
    assert!(
        rc == 0 && out.contains("configured"),
        "guest setup failed ({rc}): {out}"
    );
    let guest_sha = out
        .lines()
        .find(|l| l.trim_end().ends_with("/tmp/g.bin"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no sha256 of the guest's data: {out}"))
        .to_string();

    let port_base = 9400 + (std::process::id() % 50) as u16 * 2;
    let mut report = format!("boot/lookup {boot_s:.1} s\n");
    for (case, port) in [
        ("our client -> kernel server", port_base),
        ("kernel client -> our server", port_base + 1),
    ] {
        let seed = u64::from(port) * 7919;
        let host_data = data(seed);
        let host_sha = hex(&Sha256::digest(&host_data));
        let file = std::env::temp_dir().join(format!("smc612-{}-{port}.bin", std::process::id()));
        std::fs::write(&file, &host_data).unwrap();
        drop(host_data);
        let diag = "SMC_CAT_DIAG='/mnt/host/smc_test diag > /tmp/diag.txt'";
        let t = Instant::now();
        let (lines, guest) = if case.starts_with("our client") {
            let (rc, out) = exec(
                &dir,
                &format!(
                    "rm -f /tmp/diag.txt /tmp/h.out /tmp/cat.err; ({diag} timeout 60 /mnt/host/smc_cat listen {port} \
                     </tmp/g.bin >/tmp/h.out 2>/tmp/cat.err; echo exit=$? >>/tmp/cat.err) & \
                     for i in $(seq 1 100); do grep -q LISTENING /tmp/cat.err 2>/dev/null && break; sleep 0.1; done; \
                     grep -q LISTENING /tmp/cat.err && echo started"
                ),
                20,
            );
            assert!(rc == 0 && out.contains("started"), "guest server: {out}");
            let c = host_child(&format!("connect:{GUEST_IP}:{port}:{}", file.display()));
            let lines = collect(c, None, Duration::from_secs(90));
            let (_, g) = exec(
                &dir,
                "for i in $(seq 1 100); do grep -q exit= /tmp/cat.err && break; sleep 0.2; done; \
                 cat /tmp/cat.err; sha256sum /tmp/h.out; cat /tmp/diag.txt",
                60,
            );
            (lines, g)
        } else {
            let mut c = host_child(&format!("listen:{HOST_IP}:{port}:{}", file.display()));
            let rx = child::lines_once_ready(&mut c, "ready", Duration::from_secs(20));
            let (_, g) = exec(
                &dir,
                &format!(
                    "rm -f /tmp/diag.txt; {diag} timeout 60 /mnt/host/smc_cat connect {HOST_IP} {port} \
                     </tmp/g.bin >/tmp/h.out 2>/tmp/cat.err; echo exit=$? >>/tmp/cat.err; \
                     cat /tmp/cat.err; sha256sum /tmp/h.out; cat /tmp/diag.txt"
                ),
                90,
            );
            (collect(c, Some(rx), Duration::from_secs(30)), g)
        };
        let _ = std::fs::remove_file(&file);
        let secs = t.elapsed().as_secs_f64();
        eprintln!("{case}:\nhost: {lines:#?}\nguest: {guest}");
        assert_eq!(
            value(&lines, "offered="),
            "Some(true)",
            "{case}: no SMC option from the kernel"
        );
        assert_eq!(value(&lines, "mode="), "SmcR", "{case}: our side fell back");
        assert_eq!(
            value(&lines, "received="),
            LEN.to_string(),
            "{case}: octets received by us"
        );
        assert_eq!(value(&lines, "sha="), guest_sha, "{case}: data received by us");
        assert_eq!(value(&lines, "write="), "Ok(())", "{case}: our writes");
        assert!(
            value(&lines, "group_end_ms=").ends_with("live_links=0"),
            "{case}: link group not freed"
        );
        assert!(guest.contains("exit=0"), "{case}: smc_cat failed: {guest}");
        assert!(
            guest.contains(&host_sha),
            "{case}: the kernel received other data: {guest}"
        );
        assert!(
            guest.contains("mode=0(SMCR)") && !guest.contains("FALLBACK"),
            "{case}: smc_diag in the guest does not show SMCR: {guest}"
        );
        report.push_str(&format!(
            "{case}: {secs:.1} s, setup {} ms, transfer {} ms\n",
            value(&lines, "setup_ms="),
            value(&lines, "ms=")
        ));
    }
    // The guest kernel: no BUG/WARN/Oops, no taint.
    let (rc, log) = exec(
        &dir,
        "m=$(cat /tmp/softrdma-dmesg-mark 2>/dev/null || echo 0); dmesg | tail -n +$((m+1)); \
         echo tainted=$(cat /proc/sys/kernel/tainted)",
        20,
    );
    assert_eq!(rc, 0, "guest unreachable: {log}");
    for bad in ["BUG:", "WARNING:", "Oops", "Call Trace", "general protection"] {
        assert!(!log.contains(bad), "guest kernel reported {bad}:\n{log}");
    }
    assert!(log.contains("tainted=0"), "guest kernel tainted:\n{log}");
    eprintln!("{report}guest kernel log:\n{log}");
    drop(stop);
}
