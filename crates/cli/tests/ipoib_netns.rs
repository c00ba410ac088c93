//! `softrdma ipoib up` (datagram mode, RFC 4391) between two network namespaces joined by a
//! veth pair: the daemons run the IPoIB link over RoCEv2 UD on the veth addresses, the
//! kernel sees a NOARP TUN `ib0`. Pings over IPv4 (first packet waits for ARP over the
//! broadcast group), IPv6 to the RFC 4391 link-local address (NS/NA), the 2,044 MTU edge,
//! and `show neigh`; with tcpdump and tshark, every captured frame decodes as RoCEv2 +
//! IPoIB + ARP/IP, none malformed. Skips with a reason when not root or without
//! ip(8)/busybox ping.
//! Addresses: underlay 10.118.0.0/24, IPoIB 10.119.0.0/24 (unique to this file).
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` IPCM-1, IPCM-5, C2, D3.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn sh(cmd: &str) -> (bool, String) {
    let o = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s += &String::from_utf8_lossy(&o.stderr);
    (o.status.success(), s)
}

fn must(cmd: &str) -> String {
    let (ok, out) = sh(cmd);
    assert!(ok, "{cmd}: {out}");
    out
}

/// Namespaces and daemons, removed on drop (also when a check fails).
struct Lab {
    ns: [String; 2],
    daemons: Vec<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.daemons {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.ns {
            let _ = sh(&format!("ip netns del {n}"));
        }
    }
}

#[test]
fn ipoib_datagram_mode_between_two_namespaces() {
    if !is_root() || !have("ip") || !have("busybox") {
        eprintln!("skipped: needs root, ip(8) and busybox (ping)");
        return;
    }
    let id = std::process::id() % 100_000;
    let ns = [format!("ipoA{id}"), format!("ipoB{id}")];
    let veth = [format!("ipa{id}"), format!("ipb{id}")];
    let mut lab = Lab {
        ns: ns.clone(),
        daemons: Vec::new(),
    };
    for n in &ns {
        must(&format!("ip netns add {n} && ip -n {n} link set lo up"));
    }
    must(&format!("ip link add {} type veth peer name {}", veth[0], veth[1]));
    for i in 0..2 {
        must(&format!(
            "ip link set {v} netns {n} && ip -n {n} addr add 10.118.0.{k}/24 dev {v} && ip -n {n} link set {v} mtu 9000 up",
            v = veth[i],
            n = ns[i],
            k = i + 1
        ));
    }
    // Capture the RoCEv2 traffic on A's veth when tcpdump and tshark are there.
    let pcap = std::env::temp_dir().join(format!("ipoib-netns-{id}.pcap"));
    if have("tcpdump") && have("tshark") {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns[0], "tcpdump", "-i", &veth[0], "-U", "-w"])
            .arg(&pcap)
            .args(["udp", "port", "4791"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tcpdump");
        lab.daemons.push(child);
        std::thread::sleep(Duration::from_millis(500));
    }
    for i in 0..2 {
        let log = std::fs::File::create(std::env::temp_dir().join(format!("ipoib-netns-{id}-{i}.log"))).unwrap();
        let child = Command::new("ip")
            .args([
                "netns", "exec", &ns[i], BIN, "ipoib", "up", "--dev", "ib0", "--mode", "datagram",
            ])
            .args([
                "--underlay",
                &veth[i],
                "--pkey",
                "0x8003",
                "--addr",
                &format!("10.119.0.{}/24", i + 1),
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn softrdma ipoib up");
        lab.daemons.push(child);
    }
    // both interfaces up (the daemon configures ib0 once its node is open)
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let up = ns
            .iter()
            .all(|n| sh(&format!("ip -n {n} -4 addr show dev ib0")).1.contains("10.119.0."));
        if up {
            break;
        }
        assert!(Instant::now() < end, "ib0 did not come up in both namespaces");
        std::thread::sleep(Duration::from_millis(100));
    }
    let link = must(&format!("ip -n {} link show dev ib0", ns[0]));
    assert!(link.contains("NOARP") && link.contains("mtu 2044"), "{link}");
    // IPv4: the first echo waits in the neighbour queue for the ARP answer
    let out = must(&format!("ip netns exec {} busybox ping -c 3 -W 3 10.119.0.2", ns[0]));
    assert!(out.contains("3 packets received"), "{out}");
    let out = must(&format!(
        "ip netns exec {} busybox ping -c 2 -W 3 -s 2016 10.119.0.1",
        ns[1]
    ));
    assert!(out.contains("2 packets received"), "{out}");
    // IPv6 to B's RFC 4391 link-local address (fe80::/64 + GUID with the u/l bit)
    let v6 = must(&format!("ip -n {} -6 addr show dev ib0", ns[1]));
    let ll = v6
        .split_whitespace()
        .find(|w| w.starts_with("fe80::200:ffff:"))
        .expect("RFC 4391 link-local on B")
        .trim_end_matches("/64")
        .to_string();
    let out = must(&format!("ip netns exec {} busybox ping -6 -c 2 -W 3 {ll}%ib0", ns[0]));
    assert!(out.contains("2 packets received"), "{out}");
    // show neigh: B resolved, by UD, with the UD MTU (the status file is written each second)
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, show) = sh(&format!("ip netns exec {} {BIN} ipoib show neigh --dev ib0", ns[0]));
        if show.contains("10.119.0.2 lladdr 00:") && show.contains("REACHABLE") {
            assert!(show.contains("mtu 2044 via ud"), "{show}");
            break;
        }
        assert!(Instant::now() < end, "show neigh: {show}");
        std::thread::sleep(Duration::from_millis(200));
    }
    for c in &mut lab.daemons {
        assert!(c.try_wait().unwrap().is_none(), "a daemon exited");
    }
    // tshark decodes every frame as RoCEv2 (infiniband) + IPoIB + ARP / IPv4 / IPv6, none
    // malformed.
    if pcap.exists() {
        std::thread::sleep(Duration::from_millis(300));
        let p = pcap.display();
        let protos = must(&format!(
            "tshark -r {p} -d udp.port==4791,infiniband -T fields -e frame.protocols 2>/dev/null"
        ));
        let frames: Vec<&str> = protos.lines().collect();
        assert!(
            frames
                .iter()
                .all(|f| f.starts_with("eth:ethertype:ip:udp:infiniband:ethertype:")),
            "{protos}"
        );
        assert!(frames.iter().filter(|f| f.ends_with(":arp")).count() >= 2, "{protos}");
        assert!(
            frames.iter().filter(|f| f.contains(":ip:icmp")).count() >= 6,
            "{protos}"
        );
        assert!(
            frames.iter().filter(|f| f.contains(":ipv6:icmpv6")).count() >= 4,
            "{protos}"
        );
        let bad = must(&format!(
            "tshark -r {p} -d udp.port==4791,infiniband -Y '_ws.malformed || _ws.expert.severity >= warning' 2>/dev/null"
        ));
        assert!(bad.trim().is_empty(), "malformed or warned frames: {bad}");
        let _ = std::fs::remove_file(&pcap);
    }
}
