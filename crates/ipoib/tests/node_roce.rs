//! IPoIB datagram mode on our RoCEv2 provider: two (and three) [`Node`]s on loopback
//! devices (127.116.x.y, unique to this file), each a UD QP driven by the link machine. IP
//! packets go in as if from the kernel and must come out of the other node's kernel side:
//! ARP over the broadcast group (a real multicast group of the provider), unicast UD with
//! address handles, IPv6 ND over the solicited-node groups, broadcast, the UD MTU edge.
//! Each test uses its own P_Key so the broadcast groups of parallel tests differ.
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` IPCM-1, IPCM-2, IPCM-5, C2, D3.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use ipoib::node::Node;
use ipoib::wire::ip::{Ipv4Info, Ipv6Header, emit_ipv4_header, icmpv6_packet};
use verbs::{DeviceFactory, DeviceOptions};

fn dev(addr: &str) -> verbs::Device {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("mtu", "4096")
        .with("name", format!("rxe_ipoib_{addr}"));
    roce::RoceFactory.open(&opts).expect("open a RoCEv2 device")
}

fn ip4(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 30, 0, n)
}

fn v4(src: Ipv4Addr, dst: Ipv4Addr, len: usize, df: bool) -> Vec<u8> {
    let mut p = vec![0u8; len];
    emit_ipv4_header(&mut p, len as u16, 9, if df { 0x4000 } else { 0 }, 17, src, dst).unwrap();
    for (i, b) in p[20..].iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    p
}

/// Polls every node until `want` holds for what node `k`'s kernel got, or 10 s pass.
fn run_until(nodes: &mut [Node], k: usize, want: impl Fn(&[Vec<u8>]) -> bool) -> Vec<Vec<u8>> {
    let end = Instant::now() + Duration::from_secs(10);
    let mut got: Vec<Vec<u8>> = Vec::new();
    while Instant::now() < end {
        for (i, n) in nodes.iter_mut().enumerate() {
            let out = n.poll(Duration::from_millis(2)).expect("poll");
            if i == k {
                got.extend(out);
            }
        }
        if want(&got) {
            return got;
        }
    }
    panic!("node {k} did not get what was expected: {} packets", got.len());
}

/// IPCM-1, IPCM-5, C2: ARP over the broadcast group resolves the peer (its UD QPN and its
/// device GID), then IP goes both ways by unicast UD; 2,044 octets fit, 2,045 with DF get
/// "fragmentation needed" 2,044.
#[test]
fn datagram_ping_over_roce_ud() {
    let (da, db) = (dev("127.116.1.1"), dev("127.116.1.2"));
    let a = Node::open(&da, 0x8001, &[(ip4(1), 24)], &[]).unwrap();
    let b = Node::open(&db, 0x8001, &[(ip4(2), 24)], &[]).unwrap();
    let b_lla = b.link().local_addr();
    let mut nodes = [a, b];
    let p = v4(ip4(1), ip4(2), 84, true);
    nodes[0].from_kernel(p.clone()).unwrap();
    let got = run_until(&mut nodes, 1, |g| !g.is_empty());
    assert_eq!(got, vec![p]);
    let now = nodes[0].now();
    let n = nodes[0].link().neighbours(now);
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].ip, IpAddr::V4(ip4(2)));
    assert_eq!(n[0].lla, Some(b_lla));
    assert_eq!(b_lla.gid, db.query_gid(1, 0).unwrap().0);
    assert_eq!(b_lla.to_bytes()[0], 0, "datagram mode: flags 0");
    let q = v4(ip4(2), ip4(1), 2044, true);
    nodes[1].from_kernel(q.clone()).unwrap();
    let got = run_until(&mut nodes, 0, |g| !g.is_empty());
    assert_eq!(got, vec![q]);
    nodes[0].from_kernel(v4(ip4(1), ip4(2), 2045, true)).unwrap();
    let e = run_until(&mut nodes, 0, |g| !g.is_empty());
    assert_eq!(&e[0][20..22], &[3, 4]);
    assert_eq!(u16::from_be_bytes([e[0][26], e[0][27]]), 2044);
}

/// IPCM-2: broadcast (subnet and limited) reaches every other member over the provider's
/// multicast; IPv6 to a link-local address resolves by NS/NA over the solicited-node group.
#[test]
fn broadcast_and_ipv6_over_roce_ud() {
    let devs = [dev("127.116.2.1"), dev("127.116.2.2"), dev("127.116.2.3")];
    let mut nodes: Vec<Node> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| Node::open(d, 0x8002, &[(ip4(10 + i as u8), 24)], &[]).unwrap())
        .collect();
    let bc = v4(ip4(10), Ipv4Addr::new(10, 30, 0, 255), 200, false);
    nodes[0].from_kernel(bc.clone()).unwrap();
    assert_eq!(run_until(&mut nodes, 1, |g| !g.is_empty()), vec![bc.clone()]);
    // node 2 got it too (polled in the same loop; ask again for anything left)
    let lim = v4(ip4(10), Ipv4Addr::BROADCAST, 100, false);
    nodes[0].from_kernel(lim.clone()).unwrap();
    let got2 = run_until(&mut nodes, 2, |g| g.contains(&lim));
    assert!(got2.contains(&lim));
    let (ll0, ll1): (Ipv6Addr, Ipv6Addr) = (nodes[0].link().link_local(), nodes[1].link().link_local());
    let mut m = vec![128u8, 0, 0, 0, 0, 1, 0, 1];
    m.resize(500, 0x44);
    let p6 = icmpv6_packet(ll0, ll1, 64, m);
    nodes[0].from_kernel(p6.clone()).unwrap();
    let got = run_until(&mut nodes, 1, |g| g.contains(&p6));
    assert!(
        got.iter()
            .all(|p| Ipv6Header::parse(p).is_ok() || Ipv4Info::parse(p).is_ok())
    );
}
