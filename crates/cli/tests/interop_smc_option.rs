//! The SMC-R TCP option (`smc::sockops`, issue 15 point 4) against the Linux kernel's net/smc
//! in the QEMU lab guest (Linux 6.1): requirements A1.2, A2.1 SMC-OPT-1/2/3, C5.
//!
//! 1. Our client (host side of the lab, 192.168.77.1, in a cgroup with the sock_ops program)
//!    connects to the guest's AF_SMC server (`smc_test server`): the guest's SYN-ACK must
//!    carry the option, so `peer_offered_smc` is `Some(true)`.
//! 2. The guest's AF_SMC client (`smc_test client`) connects to our listener (in the
//!    cgroup): `peer_offered_smc` is `Some(true)`, and because our SYN-ACK carried the
//!    option the guest goes on to CLC: the first octets it sends are a CLC message (eyecatcher
//!    `E2 D4 C3 D9`; a Decline 0x03030000 "no SMC device" in the unconfigured guest), not
//!    the plain-TCP fallback it takes when the SYN-ACK lacks the option.
//!
//! tcpdump on br0 (in the lab namespace) + tshark: all four SYN / SYN-ACK carry
//! `fe 06 e2 d4 c3 d9`, no malformed frame. No RDMA link is ever set up (we never send a
//! Proposal), so the 6.1 rxe hang of the lab README "SMC-R in the lab" cannot happen. The
//! guest's smc modules are unloaded afterwards and its kernel log checked.
//!
//! The host side runs in the lab's network namespace through `nsenter --net` re-running
//! this test binary in a child mode (`SMCBPF_LAB_CHILD`). Gate and skips as in
//! `interop_rxe.rs`; also skips without tcpdump/tshark/nsenter or when `smc_test` cannot be
//! built (`gcc -static`).

#[path = "common/child.rs"]
mod child;
#[path = "common/lab.rs"]
mod lab_common;
#[path = "common/smc_lab.rs"]
mod smc_lab;

use lab_common::{NS, acquire, bring_up_siw, have, next_port};
use smc_lab::{SockopsCgroup, build_static, cgroup2_mount, hex, value};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const HOST_IP: &str = "192.168.77.1";
const GUEST_IP: &str = "192.168.77.2";
const SMC_OPT: &str = "fe06e2d4c3d9";

/// `smc_test` (the lab's tools/smc_test.c) built statically into the lab's share directory.
fn smc_test_tool() -> Result<(), String> {
    let src = lab_common::lab_dir()?.join("tools/smc_test.c");
    build_static(&src, &Path::new(lab_common::LAB_STATE).join("share/smc_test"))
}

/// The host side: this binary again in the lab namespace with the child spec `spec`.
fn host_child(spec: &str) -> std::process::Child {
    smc_lab::host_child(
        NS,
        "smc_option_with_linux_net_smc_both_directions",
        &[("SMCBPF_LAB_CHILD", spec)],
        Stdio::inherit(),
    )
}

/// Child mode: `connect:IP:PORT` or `listen:IP:PORT`, inside a fresh cgroup with the
/// program attached for that port. Prints `ready` (listen), `first=HEX`, `offered=...`.
fn child_mode(spec: &str) {
    let (mode, addr) = spec.split_once(':').expect("mode:addr");
    let addr: SocketAddr = addr.parse().expect("addr");
    let cg = SockopsCgroup::enter("softrdma-smcopt-lab", addr.port());
    let g = cg.option();
    let (offered, first) = if mode == "connect" {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        (g.peer_offered_smc(&s), Vec::new())
    } else {
        let l = TcpListener::bind(addr).expect("bind");
        println!("ready");
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        (g.peer_offered_smc(&s), buf[..n].to_vec())
    };
    drop(cg);
    println!("first={}", hex(&first));
    println!("offered={offered:?}");
}

#[test]
fn smc_option_with_linux_net_smc_both_directions() {
    if let Some(spec) = std::env::var_os("SMCBPF_LAB_CHILD") {
        child_mode(&spec.to_string_lossy());
        return;
    }
    for tool in ["tcpdump", "tshark", "nsenter"] {
        if !have(tool) {
            eprintln!("SKIPPED smc_option_with_linux_net_smc_both_directions: {tool} missing");
            return;
        }
    }
    if cgroup2_mount().is_none() {
        eprintln!("SKIPPED smc_option_with_linux_net_smc_both_directions: no cgroup v2 mount");
        return;
    }
    let Some(lab) = acquire(
        "smc_option_with_linux_net_smc_both_directions",
        "kernel net/smc lab",
        bring_up_siw,
    ) else {
        return;
    };
    if let Err(why) = smc_test_tool() {
        eprintln!("SKIPPED smc_option_with_linux_net_smc_both_directions: {why}");
        return;
    }
    lab.kernel_check_init();
    // 9300..9399 (interop_rxe uses 8200..8999).
    let (p_srv, p_cli) = (next_port(9300, 100), next_port(9300, 100));
    let tmp = std::env::temp_dir().join(format!("smcopt-lab-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let pcap = tmp.join("lab.pcap");
    let mut td = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{NS}"))
        .args(["tcpdump", "-i", "br0", "-n", "-U", "--immediate-mode", "-w"])
        .arg(&pcap)
        .arg(format!("tcp port {p_srv} or tcp port {p_cli}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tcpdump");
    std::thread::sleep(Duration::from_millis(1000));

    let (rc, out) = lab.exec(
        &format!(
            "modprobe smc && (/mnt/host/smc_test server {p_srv} >/tmp/smcopt-srv.log 2>&1 &) ; sleep 0.5; echo started"
        ),
        20,
    );
    assert!(rc == 0 && out.contains("started"), "guest server: {out}");

    // 1. our client -> guest AF_SMC server.
    let c = host_child(&format!("connect:{GUEST_IP}:{p_srv}"));
    let o = c.wait_with_output().unwrap();
    let lines: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect();
    let client_offered = value(&lines, "offered=");

    // 2. guest AF_SMC client -> our listener.
    let mut l = host_child(&format!("listen:{HOST_IP}:{p_cli}"));
    let rx = child::lines_once_ready(&mut l, "ready", Duration::from_secs(10));
    let (_, gout) = lab.exec(
        &format!("timeout 10 /mnt/host/smc_test client {HOST_IP} {p_cli} 100; echo exit=$?"),
        30,
    );
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(10)) {
        lines.push(line);
    }
    let _ = l.wait();
    let server_offered = value(&lines, "offered=");
    let first = value(&lines, "first=");

    // Leave the guest as found: server gone, smc modules unloaded.
    let _ = lab.exec(
        "for p in /proc/[0-9]*; do grep -q 'smc_test.server' $p/cmdline 2>/dev/null && kill ${p#/proc/}; done; \
         sleep 1; rmmod smc_diag 2>/dev/null; rmmod smc; true",
        20,
    );
    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill").arg("-INT").arg(td.id().to_string()).status();
    let _ = td.wait();
    let kernel = lab.kernel_check();

    assert_eq!(client_offered, "Some(true)", "guest SYN-ACK carried no SMC option");
    assert_eq!(server_offered, "Some(true)", "guest SYN carried no SMC option");
    assert!(
        first.starts_with("e2d4c3d9"),
        "guest did not go on to CLC (our SYN-ACK option ignored?): first={first} guest: {gout}"
    );
    let syns = Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args([
            "-Y",
            "tcp.flags.syn==1",
            "-T",
            "fields",
            "-e",
            "tcp.srcport",
            "-e",
            "tcp.options",
        ])
        .output()
        .expect("tshark");
    let syns = String::from_utf8_lossy(&syns.stdout).replace(':', "");
    assert_eq!(syns.lines().count(), 4, "{syns}");
    assert!(
        syns.lines().all(|l| l.contains(SMC_OPT)),
        "SYN/SYN-ACK without the option:\n{syns}"
    );
    let bad = Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args(["-Y", "_ws.malformed"])
        .output()
        .unwrap();
    assert!(
        bad.stdout.is_empty(),
        "malformed: {}",
        String::from_utf8_lossy(&bad.stdout)
    );
    eprintln!("guest client: {gout}\nguest kernel: {kernel}");
    let _ = std::fs::remove_dir_all(&tmp);
}
