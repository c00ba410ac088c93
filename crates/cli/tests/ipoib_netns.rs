//! `softrdma ipoib up` (datagram mode, RFC 4391) between two network namespaces joined by a
//! veth pair: the daemons run the IPoIB link over RoCEv2 UD on the veth addresses, the
//! kernel sees a NOARP TUN `ib0`. Pings over IPv4 (first packet waits for ARP over the
//! broadcast group), IPv6 to the RFC 4391 link-local address (NS/NA), the 2,044 MTU edge,
//! and `show neigh`; with tcpdump and tshark, every captured frame decodes as RoCEv2 +
//! IPoIB + ARP/IP, none malformed. Skips with a reason when not root or without
//! ip(8)/busybox ping.
//! Addresses: underlay 10.118.0.0/24, IPoIB 10.119.0.0/24 (unique to this file).
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` IPCM-1, IPCM-5, C2, D3.

use std::time::{Duration, Instant};

#[path = "common/netns.rs"]
mod netns;
use netns::{Lab, daemon, have, is_root, must, rfc4391_link_local, sh};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

#[test]
fn ipoib_datagram_mode_between_two_namespaces() {
    if !is_root() || !have("ip") || !have("busybox") {
        eprintln!("skipped: needs root, ip(8) and busybox (ping)");
        return;
    }
    let id = std::process::id() % 100_000;
    let ns = [format!("ipoA{id}"), format!("ipoB{id}")];
    let veth = [format!("ipa{id}"), format!("ipb{id}")];
    let mut lab = Lab::veth_pair(ns.clone(), veth.clone(), "10.118.0");
    // Capture the RoCEv2 traffic on A's veth when tcpdump and tshark are there.
    let pcap = std::env::temp_dir().join(format!("ipoib-netns-{id}.pcap"));
    let mut tcpdump = None;
    if have("tcpdump") && have("tshark") {
        tcpdump = Some(netns::capture(&ns[0], &veth[0], &[], &pcap, "udp port 4791"));
    }
    for i in 0..2 {
        let d = daemon(
            BIN,
            &ns[i],
            "datagram",
            &veth[i],
            &[format!("10.119.0.{}/24", i + 1)],
            &["--pkey", "0x8003"],
            &format!("ipoib-netns-{id}-{i}.log"),
        );
        lab.procs.push(d);
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
    let ll = rfc4391_link_local(&ns[1]);
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
    for c in &mut lab.procs {
        assert!(c.try_wait().unwrap().is_none(), "a daemon exited");
    }
    // tshark decodes every frame as RoCEv2 (infiniband) + IPoIB + ARP / IPv4 / IPv6, none
    // malformed.
    if let Some(t) = tcpdump.take() {
        // Stopped once the file has stopped growing: tcpdump lags behind on a loaded machine.
        t.stop_when_quiet(Duration::from_secs(5));
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
