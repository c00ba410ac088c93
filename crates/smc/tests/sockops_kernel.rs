//! The SMC-R TCP option on real kernel TCP connections, written by the cgroup sock_ops
//! program of `smc::sockops` (requirements A1.2: kind 254, length 6, ExID E2 D4 C3 D9 on
//! SYN and SYN-ACK; A2.1: a peer without the option means fallback; issue 15 point 4).
//!
//! On loopback (127.0.83.0/24, ports 41831-41835): a cgroup v2 directory is made, the
//! program attached to it for three of the ports, and sockets are created with the test
//! process moved into the cgroup (a socket belongs to the cgroup of the task that created
//! it; the process moves back right after). tcpdump captures the SYNs; tshark must show
//! `fe 06 e2 d4 c3 d9` exactly where expected, no malformed frame; `peer_offered_smc`
//! must read what each side saw. Then the program is dropped (detached: a later connection
//! in the cgroup is bare) and a second one attached in `SynAck::Always` mode (SMC-OPT-2's
//! MAY: the SYN-ACK carries the option though the SYN did not), then a third with no port
//! list (every port).
//!
//! Skips (passes, printing why) when not root, without a cgroup v2 mount, without
//! tcpdump/tshark, or when the kernel refuses the program for lack of support.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use smc::sockops::{Error, Guard, SmcOption, SynAck};

const IP: &str = "127.0.83.1";
const P_BOTH: u16 = 41831; // in the port list: both ends in the cgroup
const P_OTHER: u16 = 41832; // not in the list: both ends in the cgroup
const P_OUT_SERVER: u16 = 41833; // in the list: client in, server outside
const P_OUT_CLIENT: u16 = 41834; // in the list: server in, client outside
const P_NONE: u16 = 41835; // in the list: both outside (and both inside after detach)
const P_ALWAYS: u16 = 41836; // second program, SynAck::Always: server in, client outside
const P_ANY: u16 = 41837; // third program, no port list (every port): both ends in

fn cgroup2_mount() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        post.starts_with("cgroup2 ")
            .then(|| PathBuf::from(pre.split(' ').nth(4).unwrap_or("")))
    })
}

fn own_cgroup2() -> Option<String> {
    let c = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    c.lines().find_map(|l| l.strip_prefix("0::").map(str::to_string))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// A cgroup v2 directory made for the test; the process moves back and the directory is
/// removed on drop.
struct Cg {
    dir: PathBuf,
    home: PathBuf,
}

impl Cg {
    fn new(mount: &Path) -> std::io::Result<Self> {
        let dir = mount.join(format!("softrdma-smcbpf-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let rel = own_cgroup2().unwrap_or_else(|| "/".into());
        let home = mount.join(rel.trim_start_matches('/'));
        Ok(Cg { dir, home })
    }
    /// Runs `f` with the whole process in the cgroup (sockets created by `f` belong to it).
    fn inside<T>(&self, f: impl FnOnce() -> T) -> T {
        let pid = std::process::id().to_string();
        std::fs::write(self.dir.join("cgroup.procs"), &pid).expect("enter cgroup");
        let r = f();
        std::fs::write(self.home.join("cgroup.procs"), &pid).expect("leave cgroup");
        r
    }
}

impl Drop for Cg {
    fn drop(&mut self) {
        let _ = std::fs::write(self.home.join("cgroup.procs"), std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn start_tcpdump(file: &Path) -> Child {
    let mut c = Command::new("tcpdump")
        .args(["-i", "lo", "-n", "-U", "--immediate-mode", "-w"])
        .arg(file)
        .arg(format!(
            "host {IP} and tcp[tcpflags] & tcp-syn != 0 and portrange {P_BOTH}-{P_ANY}"
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump");
    let mut err = BufReader::new(c.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).expect("tcpdump stderr");
    assert!(line.contains("listening"), "tcpdump: {line}");
    // Keep reading so tcpdump's exit statistics do not meet a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    std::thread::sleep(Duration::from_millis(200));
    c
}

fn addr(port: u16) -> SocketAddr {
    format!("{IP}:{port}").parse().unwrap()
}

/// One connection: listener made inside the cgroup or not, client likewise; returns
/// (client's, server's) `peer_offered_smc`.
fn connect(cg: &Cg, g: &Guard, port: u16, server_in: bool, client_in: bool) -> (Option<bool>, Option<bool>) {
    let mk_l = || TcpListener::bind(addr(port)).expect("bind");
    let l = if server_in { cg.inside(mk_l) } else { mk_l() };
    let mk_c = || TcpStream::connect(addr(port)).expect("connect");
    let c = if client_in { cg.inside(mk_c) } else { mk_c() };
    let (s, _) = l.accept().expect("accept");
    (g.peer_offered_smc(&c), g.peer_offered_smc(&s))
}

/// tshark's view of the SYNs: (srcport, dstport, ack flag, options hex without colons).
fn tshark_syns(file: &Path) -> Vec<(u16, u16, bool, String)> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args([
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "tcp.srcport",
            "-e",
            "tcp.dstport",
            "-e",
            "tcp.flags.ack",
            "-e",
            "tcp.options",
        ])
        .output()
        .expect("tshark");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2] == "1" || f[2] == "True",
                f[3].replace(':', ""),
            )
        })
        .collect()
}

fn count_malformed(file: &Path) -> usize {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-Y", "_ws.malformed || _ws.expert.severity >= warning"])
        .output()
        .expect("tshark");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

const SMC_OPT: &str = "fe06e2d4c3d9";

/// The kernel test moves the whole process into its cgroup for a moment; tests that spawn
/// children hold this too, so no child is born inside the cgroup (and keeps it from being
/// removed).
static PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn smc_option_on_kernel_syn_and_synack_a1_2_smc_opt_1_2() {
    let _one = PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root (CAP_BPF + CAP_NET_ADMIN, cgroup writes)");
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup v2 mount");
        return;
    };
    if !have("tcpdump") || !have("tshark") {
        eprintln!("skipped: tcpdump or tshark missing");
        return;
    }
    let cg = Cg::new(&mount).expect("mkdir cgroup");
    let g = match SmcOption::attach(&cg.dir, &[P_BOTH, P_OUT_SERVER, P_OUT_CLIENT, P_NONE]) {
        Ok(g) => g,
        Err(e @ (Error::KernelTooOld(_) | Error::Permission { .. })) => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("attach: {e}"),
    };
    let dir = std::env::temp_dir().join(format!("smcbpf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("syn.pcap");
    let mut td = start_tcpdump(&pcap);

    let both = connect(&cg, &g, P_BOTH, true, true);
    let other = connect(&cg, &g, P_OTHER, true, true);
    let out_server = connect(&cg, &g, P_OUT_SERVER, false, true);
    let out_client = connect(&cg, &g, P_OUT_CLIENT, true, false);
    let none = connect(&cg, &g, P_NONE, false, false);
    // Detach on drop, then the SMC-OPT-2 "MAY" mode: SYN-ACK without a SYN option.
    drop(g);
    let g = SmcOption::attach_with(&cg.dir, &[P_ALWAYS], SynAck::Always).expect("attach_with");
    let detached = connect(&cg, &g, P_NONE, true, true);
    let always = connect(&cg, &g, P_ALWAYS, true, false);
    drop(g);
    let g = SmcOption::attach(&cg.dir, &[]).expect("attach for every port");
    let any = connect(&cg, &g, P_ANY, true, true);

    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill").arg("-INT").arg(td.id().to_string()).status();
    let _ = td.wait();

    // peer_offered_smc: (client, server).
    assert_eq!(both, (Some(true), Some(true)), "both ends in the cgroup");
    assert_eq!(other, (None, None), "port not chosen: program leaves it alone");
    assert_eq!(out_server, (Some(false), None), "server outside: one-sided");
    assert_eq!(out_client, (None, Some(false)), "client outside: one-sided");
    assert_eq!(none, (None, None), "both outside the cgroup");
    assert_eq!(detached, (None, None), "first program detached on drop");
    assert_eq!(always, (None, Some(false)), "Always mode, client outside");
    assert_eq!(any, (Some(true), Some(true)), "empty port list: every port");

    let syns = tshark_syns(&pcap);
    eprintln!("SYNs seen by tshark (sport, dport, ack, options): {syns:?}");
    let opt = |sport: u16, dport: u16, ack: bool| -> bool {
        let s = syns.iter().find(|s| s.0 == sport && s.1 == dport && s.2 == ack);
        let s = s.unwrap_or_else(|| panic!("no SYN (ack {ack}) {sport}->{dport}: {syns:?}"));
        s.3.contains(SMC_OPT)
    };
    for (p, syn, synack, pairs) in [
        (P_BOTH, true, true, 1),
        (P_OTHER, false, false, 1),
        (P_OUT_SERVER, true, false, 1),
        (P_OUT_CLIENT, false, false, 1),
        (P_NONE, false, false, 2), // outside, then inside after detach
        (P_ALWAYS, false, true, 1),
        (P_ANY, true, true, 1),
    ] {
        let clients: Vec<u16> = syns.iter().filter(|s| s.1 == p && !s.2).map(|s| s.0).collect();
        assert_eq!(clients.len(), pairs, "SYNs to {p}: {syns:?}");
        for cp in clients {
            assert_eq!(opt(cp, p, false), syn, "SYN to {p}: {syns:?}");
            assert_eq!(opt(p, cp, true), synack, "SYN-ACK from {p}: {syns:?}");
        }
    }
    assert_eq!(count_malformed(&pcap), 0, "tshark: malformed or warning frames");
    drop(g);
    if std::env::var_os("SMCBPF_KEEP_PCAP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn attach_to_a_non_cgroup2_directory_is_a_typed_error() {
    match SmcOption::attach(std::env::temp_dir(), &[]) {
        Err(Error::NotCgroup2(p)) => assert_eq!(p, std::env::temp_dir()),
        Err(Error::Permission { .. }) => {} // unprivileged: statfs works, so not reached
        other => panic!("expected NotCgroup2, got {other:?}"),
    }
    assert!(matches!(
        SmcOption::attach(std::env::temp_dir(), &[1; 65]),
        Err(Error::TooManyPorts(65))
    ));
}

/// Without capabilities (root with an empty bounding set, via `setpriv`), attach fails with
/// `Error::Permission` naming the privileges, so a caller can fall back to plain TCP.
#[test]
fn without_capabilities_attach_is_a_permission_error() {
    let Some(mount) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup v2 mount");
        return;
    };
    if std::env::var_os("SMCBPF_NOCAPS_CHILD").is_some() {
        match SmcOption::attach(&mount, &[]) {
            Err(e @ Error::Permission { .. }) => {
                assert!(e.to_string().contains("CAP_BPF and CAP_NET_ADMIN"), "{e}");
                println!("NOCAPS-PERMISSION-OK");
            }
            other => panic!("expected Error::Permission, got {other:?}"),
        }
        return;
    }
    if !is_root() || !have("setpriv") {
        eprintln!("skipped: needs root and setpriv to run a capability-less child");
        return;
    }
    let _one = PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new("setpriv")
        .args(["--bounding-set=-all", "--inh-caps=-all", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_capabilities_attach_is_a_permission_error",
            "--nocapture",
        ])
        .env("SMCBPF_NOCAPS_CHILD", "1")
        .output()
        .expect("setpriv");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("NOCAPS-PERMISSION-OK"),
        "child: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
