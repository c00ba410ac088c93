//! Helpers shared by the device-level IPoIB tests (`node_cm_roce.rs`,
//! `node_misbehaving_peer.rs`): loopback RoCEv2 devices, IPv4 test packets, connected or
//! datagram [`Node`]s on 10.31.0.0/24, and polling until a condition holds.

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipoib::link::{ConnState, Mode};
use ipoib::node::{Node, NodeOptions};
use ipoib::wire::ip::emit_ipv4_header;
use verbs::{DeviceFactory, DeviceOptions};

/// A RoCEv2 device on the loopback address `addr` with IB MTU `mtu`.
pub fn dev_mtu(addr: &str, mtu: u32) -> verbs::Device {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("mtu", mtu.to_string())
        .with("name", format!("rxe_ipcm_{addr}"));
    roce::RoceFactory.open(&opts).expect("open a RoCEv2 device")
}

/// A RoCEv2 device on the loopback address `addr` with IB MTU 2,048 whose first QPN is
/// `qpn_base` (two such devices hand out the same QPNs).
pub fn dev_qpn(addr: &str, qpn_base: u32) -> verbs::Device {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("mtu", "2048")
        .with("qpn_base", qpn_base.to_string())
        .with("name", format!("rxe_ipcm_{addr}"));
    roce::RoceFactory.open(&opts).expect("open a RoCEv2 device")
}

/// A RoCEv2 device on the loopback address `addr` with IB MTU 2,048.
pub fn dev(addr: &str) -> verbs::Device {
    dev_mtu(addr, 2048)
}

/// 10.31.0.n.
pub fn ip4(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 31, 0, n)
}

/// An IPv4/UDP-numbered packet of `len` octets with DF and a payload derived from `id`.
pub fn v4(src: Ipv4Addr, dst: Ipv4Addr, len: usize, id: u16) -> Vec<u8> {
    let mut p = vec![0u8; len];
    emit_ipv4_header(&mut p, len as u16, id, 0x4000, 17, src, dst).unwrap();
    for (i, b) in p[20..].iter_mut().enumerate() {
        *b = (i * 7 + usize::from(id)) as u8;
    }
    p
}

/// A node on `d` with address 10.31.0.n/24.
pub fn node(d: &verbs::Device, mode: Mode, pkey: u16, n: u8) -> Node {
    Node::open_with(
        d,
        &NodeOptions {
            mode,
            pkey,
            ipv4: vec![(ip4(n), 24)],
            ipv6: vec![],
            conn_idle: None,
            announce: true,
        },
    )
    .unwrap()
}

/// Polls every node until `want` holds for what the nodes' kernels got (per node), or 10 s
/// pass.
pub fn run_until(nodes: &mut [Node], mut want: impl FnMut(&[Node], &[Vec<Vec<u8>>]) -> bool) -> Vec<Vec<Vec<u8>>> {
    let end = Instant::now() + Duration::from_secs(10);
    let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); nodes.len()];
    while Instant::now() < end {
        for (i, n) in nodes.iter_mut().enumerate() {
            got[i].extend(n.poll(Duration::from_millis(1)).expect("poll"));
        }
        if want(nodes, &got) {
            return got;
        }
    }
    let state: Vec<String> = nodes
        .iter()
        .map(|n| {
            let now = n.now();
            format!(
                "{:?}\n  neighbours {:?}\n  connections {:?}\n  counters {:?}",
                n.link().local_addr(),
                n.link().neighbours(now),
                n.link().connections(now),
                n.link().counters()
            )
        })
        .collect();
    panic!(
        "not reached in 10 s: {:?}\n{}",
        got.iter().map(Vec::len).collect::<Vec<_>>(),
        state.join("\n")
    );
}

/// Established connections of `n`.
pub fn established(n: &Node) -> usize {
    let now = n.now();
    n.link()
        .connections(now)
        .iter()
        .filter(|c| c.state == ConnState::Established)
        .count()
}
