//! The sans-I/O link machine tested in memory: nodes joined by a simulated fabric that
//! carries UD datagrams, multicast, CM REQ/REP/REJ/RTU/DREQ and RC messages between
//! [`Link`]s. One test per MUST of `../shared/requirements/smcr-ipoibcm.md` B2 that belongs
//! to the link (IPCM-…), plus the B4 flows, MTU edges, malformed peers and timers.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipoib::link::{
    Action, ConnId, ConnState, Link, LinkConfig, Mode, REJ_CONSUMER, REJ_INVALID_SERVICE_ID, Role, UdDest,
};
use ipoib::wire::arp::{ArpOp, ArpPacket};
use ipoib::wire::cm::CmPrivateData;
use ipoib::wire::encap::{EncapHeader, EtherType};
use ipoib::wire::ip::{Ipv4Info, Ipv6Header, emit_ipv4_header, icmpv6_packet};
use ipoib::wire::lla::LinkAddr;
use ipoib::wire::mgid::Mgid;

fn gid(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[192, 168, 77, n]);
    g
}

fn ip4(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 20, 0, n)
}

/// An ICMP-echo-like IPv4 packet of `len` octets.
fn v4(src: Ipv4Addr, dst: Ipv4Addr, len: usize, df: bool) -> Vec<u8> {
    let mut p = vec![0u8; len];
    emit_ipv4_header(&mut p, len as u16, 7, if df { 0x4000 } else { 0 }, 1, src, dst).unwrap();
    p[20] = 8;
    p
}

fn v6(src: Ipv6Addr, dst: Ipv6Addr, len: usize) -> Vec<u8> {
    let mut m = vec![128u8, 0, 0, 0, 0, 1, 0, 1];
    m.resize(len - 40, 0x33);
    icmpv6_packet(src, dst, 64, m)
}

#[derive(Debug, Clone)]
enum Ev {
    Act(usize, Action),
    Rtu(usize, ConnId, usize, ConnId),
}

struct Net {
    nodes: Vec<Option<Link>>,
    kernel: Vec<Vec<Vec<u8>>>,
    joined: Vec<HashSet<Mgid>>,
    now: Duration,
    /// (node, conn) ↔ (node, conn) of established/accepted connections.
    pairs: HashMap<(usize, ConnId), (usize, ConnId)>,
    reqs: HashMap<u64, (usize, ConnId)>,
    next_req: u64,
    /// Every action as delivered, for inspection.
    trace: Vec<(usize, Action)>,
    seed: u64,
}

impl Net {
    fn new() -> Net {
        Net {
            nodes: Vec::new(),
            kernel: Vec::new(),
            joined: Vec::new(),
            now: Duration::from_secs(1000),
            pairs: HashMap::new(),
            reqs: HashMap::new(),
            next_req: 1,
            trace: Vec::new(),
            seed: 0,
        }
    }

    fn cfg(mode: Mode, n: u8, qpn: u32) -> LinkConfig {
        let mut c = LinkConfig::new(mode, qpn, gid(n));
        c.ipv4.push((ip4(n), 24));
        c
    }

    fn add(&mut self, cfg: LinkConfig) -> usize {
        let mut l = Link::new(cfg);
        l.start();
        self.nodes.push(Some(l));
        self.kernel.push(Vec::new());
        self.joined.push(HashSet::new());
        self.nodes.len() - 1
    }

    fn node(&mut self, i: usize) -> &mut Link {
        self.nodes[i].as_mut().expect("node is up")
    }

    fn lla(&self, i: usize) -> LinkAddr {
        self.nodes[i].as_ref().unwrap().local_addr()
    }

    fn find(&self, l: &LinkAddr) -> Option<usize> {
        self.nodes.iter().position(|n| {
            n.as_ref()
                .is_some_and(|n| n.local_addr().qpn == l.qpn && n.local_addr().gid == l.gid)
        })
    }

    fn rand(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed
    }

    /// Delivers until quiet. Each round collects every node's actions first, so what the
    /// nodes do "at the same instant" is in flight together; with a seed, a round is
    /// delivered in a shuffled order.
    fn pump(&mut self) {
        let mut pending: VecDeque<Ev> = VecDeque::new();
        for _ in 0..10_000 {
            for i in 0..self.nodes.len() {
                if let Some(n) = self.nodes[i].as_mut() {
                    for a in n.take_actions() {
                        pending.push_back(Ev::Act(i, a));
                    }
                }
            }
            if pending.is_empty() {
                return;
            }
            let mut round: Vec<Ev> = pending.drain(..).collect();
            if self.seed != 0 {
                for k in (1..round.len()).rev() {
                    let j = (self.rand() % (k as u64 + 1)) as usize;
                    round.swap(k, j);
                }
            }
            let mut deferred = Vec::new();
            for ev in round {
                // With a seed, a third of the events (CM messages included) arrive a round
                // late: reordering between the two directions.
                if self.seed != 0 && self.rand().is_multiple_of(3) {
                    deferred.push(ev);
                } else {
                    self.deliver(ev, &mut pending);
                }
            }
            pending.extend(deferred);
        }
        panic!("fabric did not settle");
    }

    fn deliver(&mut self, ev: Ev, pending: &mut VecDeque<Ev>) {
        let now = self.now;
        let (i, a) = match ev {
            Ev::Rtu(i, ci, j, cj) => {
                // RTU only if the active side still holds the connection after the REP.
                let ok = self.nodes[i].as_ref().is_some_and(|n| {
                    n.connections(now)
                        .iter()
                        .any(|c| c.conn == ci && c.state == ConnState::Established)
                });
                if ok && let Some(n) = self.nodes[j].as_mut() {
                    n.on_cm_rtu(now, cj);
                }
                return;
            }
            Ev::Act(i, a) => (i, a),
        };
        self.trace.push((i, a.clone()));
        match a {
            Action::ToKernel(p) => self.kernel[i].push(p),
            Action::Join(g) => {
                self.joined[i].insert(g);
            }
            Action::UdSend { dest, payload } => match dest {
                UdDest::Unicast(l) => {
                    if let Some(j) = self.find(&l) {
                        self.node(j).on_ud_recv(now, &payload);
                    }
                }
                UdDest::Multicast(g) => {
                    for j in 0..self.nodes.len() {
                        if j != i && self.nodes[j].is_some() && self.joined[j].contains(&g) {
                            self.node(j).on_ud_recv(now, &payload);
                        }
                    }
                }
            },
            Action::RcSend { conn, payload } => {
                if let Some(&(j, cj)) = self.pairs.get(&(i, conn))
                    && let Some(n) = self.nodes[j].as_mut()
                {
                    n.on_rc_recv(now, cj, &payload);
                }
            }
            Action::Connect {
                conn,
                peer,
                service_id,
                private_data,
            } => match self.find(&peer) {
                Some(j) => {
                    let req = self.next_req;
                    self.next_req += 1;
                    self.reqs.insert(req, (i, conn));
                    let g = self.lla(i).gid;
                    self.node(j).on_cm_req(now, req, service_id, g, &private_data);
                }
                None => self.node(i).on_cm_rej(now, conn, 4),
            },
            Action::Accept {
                req,
                conn,
                private_data,
            } => {
                let (ia, ca) = self.reqs[&req];
                self.pairs.insert((ia, ca), (i, conn));
                self.pairs.insert((i, conn), (ia, ca));
                if let Some(n) = self.nodes[ia].as_mut() {
                    n.on_cm_rep(now, ca, &private_data);
                }
                pending.push_back(Ev::Rtu(ia, ca, i, conn));
            }
            Action::RejectReq { req, reason, .. } => {
                let (ia, ca) = self.reqs[&req];
                if let Some(n) = self.nodes[ia].as_mut() {
                    n.on_cm_rej(now, ca, reason);
                }
            }
            Action::RejectRep { conn, .. } | Action::Disconnect { conn } => {
                if let Some((j, cj)) = self.pairs.remove(&(i, conn)) {
                    self.pairs.remove(&(j, cj));
                    if let Some(n) = self.nodes[j].as_mut() {
                        n.on_conn_closed(now, cj);
                    }
                }
            }
        }
    }

    fn send(&mut self, i: usize, p: Vec<u8>) {
        let now = self.now;
        self.node(i).on_kernel_packet(now, p);
    }

    fn tick(&mut self, d: Duration) {
        self.now += d;
        let now = self.now;
        for n in self.nodes.iter_mut().flatten() {
            n.on_tick(now);
        }
        self.pump();
    }

    fn established(&self, i: usize) -> Vec<ipoib::link::ConnView> {
        self.nodes[i]
            .as_ref()
            .unwrap()
            .connections(self.now)
            .into_iter()
            .filter(|c| c.state == ConnState::Established)
            .collect()
    }

    fn count<F: Fn(&(usize, Action)) -> bool>(&self, f: F) -> usize {
        self.trace.iter().filter(|x| f(x)).count()
    }
}

fn two(mode_a: Mode, mode_b: Mode) -> Net {
    let mut net = Net::new();
    net.add(Net::cfg(mode_a, 1, 0x48));
    net.add(Net::cfg(mode_b, 2, 0x49));
    net.pump();
    // the joins and gratuitous ARPs of start() are not what the tests look at
    net.trace.clear();
    net
}

/// IPCM-1, IPCM-4: a datagram-only pair resolves by ARP over the broadcast group and
/// carries IP over UD; the UD-only node's address has flags 0; no connection is tried.
#[test]
fn ipcm_1_datagram_mode_ping() {
    let mut net = two(Mode::Datagram, Mode::Datagram);
    let p = v4(ip4(1), ip4(2), 84, true);
    net.send(0, p.clone());
    net.pump();
    assert_eq!(net.kernel[1], vec![p.clone()]);
    let q = v4(ip4(2), ip4(1), 84, true);
    net.send(1, q.clone());
    net.pump();
    assert_eq!(net.kernel[0], vec![q]);
    assert_eq!(
        net.count(|(_, a)| matches!(a, Action::Connect { .. } | Action::RcSend { .. })),
        0
    );
    // the ARP request went to the broadcast group with our address, flags 0
    let arp = net
        .trace
        .iter()
        .find_map(|(_, a)| match a {
            Action::UdSend {
                dest: UdDest::Multicast(g),
                payload,
            } if payload[..2] == [8, 6] => Some((*g, ArpPacket::parse(&payload[4..]).unwrap())),
            _ => None,
        })
        .unwrap();
    assert_eq!(arp.0, Mgid::broadcast(0xffff, 2));
    assert_eq!(arp.1.sender_hw.to_bytes()[0], 0x00);
    assert_eq!(arp.1.sender_hw.qpn, 0x48);
    let n = net.node(0).neighbours(Duration::from_secs(1000));
    assert_eq!(n[0].state, "REACHABLE");
    assert_eq!(n[0].mtu, 2044);
}

/// IPCM-5: the ARP reply carries the replier's LLA with flags 0x80 (RC build) and its UD
/// QPN, and is unicast over UD to the requester.
#[test]
fn ipcm_5_arp_reply_is_unicast_with_flags_and_ud_qpn() {
    let mut net = two(Mode::Connected, Mode::Connected);
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    let (dest, arp) = net
        .trace
        .iter()
        .find_map(|(i, a)| match a {
            Action::UdSend { dest, payload } if *i == 1 && payload[..2] == [8, 6] => {
                Some((*dest, ArpPacket::parse(&payload[4..]).unwrap()))
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(arp.op, ArpOp::Reply);
    assert_eq!(arp.sender_hw.to_bytes()[0], 0x80);
    assert_eq!(arp.sender_hw.qpn, 0x49);
    assert_eq!(arp.sender_ip, ip4(2));
    assert_eq!(dest, UdDest::Unicast(net.lla(0)));
}

/// IPCM-3, IPCM-7, IPCM-10, B4.2: connected mode opens one RC connection on demand with
/// service ID 0x10…|peer UD QPN; both sides record it (peer LLA, MTU 65,520, state); a
/// 65,520-octet packet (ping -M do -s 65492) crosses it, 65,521 gets "fragmentation
/// needed" with MTU 65,520.
#[test]
fn ipcm_3_7_10_connected_mode_on_demand() {
    let mut net = two(Mode::Connected, Mode::Connected);
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    let sid = net
        .trace
        .iter()
        .find_map(|(_, a)| match a {
            Action::Connect { service_id, .. } => Some(*service_id),
            _ => None,
        })
        .unwrap();
    assert_eq!(sid, 0x1000_0000_0000_0049);
    let a = net.established(0);
    let b = net.established(1);
    assert_eq!((a.len(), b.len()), (1, 1));
    assert_eq!(a[0].role, Role::Active);
    assert_eq!(b[0].role, Role::Passive);
    assert_eq!(a[0].peer.without_flags(), net.lla(1).without_flags());
    assert_eq!((a[0].mtu, b[0].mtu), (65520, 65520));
    // the first packet fit UD while the connection was being set up; now RC
    let big = v4(ip4(1), ip4(2), 65520, true);
    net.kernel[1].clear();
    net.trace.clear();
    net.send(0, big.clone());
    net.pump();
    assert_eq!(net.kernel[1], vec![big]);
    assert_eq!(net.count(|(i, a)| *i == 0 && matches!(a, Action::RcSend { .. })), 1);
    assert_eq!(net.count(|(_, a)| matches!(a, Action::UdSend { .. })), 0);
    net.send(0, v4(ip4(1), ip4(2), 65521, true));
    net.pump();
    let e = net.kernel[0].pop().expect("ICMP to the kernel");
    let info = Ipv4Info::parse(&e).unwrap();
    assert_eq!(info.protocol, 1);
    assert_eq!(&e[20..22], &[3, 4]);
    assert_eq!(u16::from_be_bytes([e[26], e[27]]), 65520);
    let now = net.now;
    assert_eq!(net.node(0).mtu_to(now, IpAddr::V4(ip4(2))), Some(65520));
}

/// IPCM-2: broadcast, IPv4 multicast and ff02::1 always go over UD to the groups; every
/// member's kernel gets them.
#[test]
fn ipcm_2_multicast_and_broadcast_over_ud() {
    let mut net = two(Mode::Connected, Mode::Connected);
    net.add(Net::cfg(Mode::Connected, 3, 0x50));
    net.pump();
    // a connection exists first, so UD is a choice, not the only path
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    net.kernel.iter_mut().for_each(|k| k.clear());
    net.trace.clear();
    net.send(0, v4(ip4(1), Ipv4Addr::new(10, 20, 0, 255), 84, false));
    net.send(0, v4(ip4(1), Ipv4Addr::BROADCAST, 84, false));
    let ll0 = net.node(0).link_local();
    net.send(0, v6(ll0, "ff02::1".parse().unwrap(), 104));
    net.pump();
    assert_eq!(net.kernel[1].len(), 3);
    assert_eq!(net.kernel[2].len(), 3);
    assert!(net.kernel[0].is_empty(), "no loopback to the sender");
    assert_eq!(net.count(|(_, a)| matches!(a, Action::RcSend { .. })), 0);
    assert_eq!(
        net.count(|(_, a)| matches!(
            a,
            Action::UdSend {
                dest: UdDest::Multicast(_),
                ..
            }
        )),
        3
    );
    // IPv4 multicast: 224.0.0.251 → its MGID, not joined by anyone here → delivered nowhere
    net.send(0, v4(ip4(1), Ipv4Addr::new(224, 0, 0, 251), 60, false));
    net.pump();
    assert!(
        net.trace
            .iter()
            .any(|(_, a)| matches!(a, Action::UdSend { dest: UdDest::Multicast(g), .. }
        if *g == Mgid::ipv4(Ipv4Addr::new(224, 0, 0, 251), 0xffff, 2)))
    );
}

/// IPCM-6 and the mixed-peer MTU: a connected node talks to a datagram-only peer over UD
/// with MTU 2,044 and to a connected peer over RC with 65,520; an oversize DF packet to the
/// datagram peer gets "fragmentation needed" with 2,044 (ping -M do -s 2017 fails, 2016
/// works); IPv4 without DF is fragmented.
#[test]
fn ipcm_6_mixed_peers_per_destination_mtu() {
    let mut net = Net::new();
    net.add(Net::cfg(Mode::Connected, 1, 0x48));
    net.add(Net::cfg(Mode::Datagram, 2, 0x49));
    net.add(Net::cfg(Mode::Connected, 3, 0x50));
    net.pump();
    net.send(0, v4(ip4(1), ip4(2), 2044, true));
    net.send(0, v4(ip4(1), ip4(3), 2044, true));
    net.pump();
    assert_eq!(net.kernel[1].len(), 1);
    assert_eq!(net.kernel[2].len(), 1);
    let now = net.now;
    assert_eq!(net.node(0).mtu_to(now, IpAddr::V4(ip4(2))), Some(2044));
    assert_eq!(net.node(0).mtu_to(now, IpAddr::V4(ip4(3))), Some(65520));
    assert_eq!(net.established(0).len(), 1, "only the RC-capable peer is connected");
    net.send(0, v4(ip4(1), ip4(2), 2045, true));
    net.pump();
    let e = net.kernel[0].pop().unwrap();
    assert_eq!(&e[20..22], &[3, 4]);
    assert_eq!(u16::from_be_bytes([e[26], e[27]]), 2044);
    net.send(0, v4(ip4(1), ip4(2), 5000, false));
    net.pump();
    assert_eq!(net.kernel[1].len(), 1 + 3, "three fragments over UD");
    assert!(net.kernel[1][1..].iter().all(|f| f.len() <= 2044));
    net.send(0, v4(ip4(1), ip4(3), 60000, true));
    net.pump();
    assert_eq!(net.kernel[2].last().unwrap().len(), 60000);
}

/// IPCM-8, IPCM-10, IPCM-14 (scripted misbehaving peer): a REQ with the wrong service-ID
/// QPN, a non-zero Type, short private data or a Receive MTU below the minimum is
/// rejected, and every REJ carries our private data; a non-zero reserved octet is fine.
#[test]
fn ipcm_8_10_bad_req_is_rejected_with_private_data() {
    let mut l = Link::new(Net::cfg(Mode::Connected, 2, 0x49));
    let now = Duration::from_secs(5);
    let ours = CmPrivateData::new(0x49, 65524).to_bytes();
    let good_pd = CmPrivateData::new(0x48, 65524).to_bytes();
    let cases: [(u64, Vec<u8>, u16); 5] = [
        (0x1000_0000_0000_0050, good_pd.to_vec(), REJ_INVALID_SERVICE_ID),
        (0x1001_0000_0000_0049, good_pd.to_vec(), REJ_INVALID_SERVICE_ID),
        (0x2000_0000_0000_0049, good_pd.to_vec(), REJ_INVALID_SERVICE_ID),
        (0x1000_0000_0000_0049, good_pd[..6].to_vec(), REJ_CONSUMER),
        (
            0x1000_0000_0000_0049,
            CmPrivateData::new(0x48, 1000).to_bytes().to_vec(),
            REJ_CONSUMER,
        ),
    ];
    for (k, (sid, pd, reason)) in cases.iter().enumerate() {
        l.on_cm_req(now, k as u64, *sid, gid(1), pd);
        assert_eq!(
            l.take_actions(),
            vec![Action::RejectReq {
                req: k as u64,
                reason: *reason,
                private_data: ours
            }],
            "case {k}"
        );
    }
    let mut odd = good_pd;
    odd[0] = 0xaa;
    l.on_cm_req(now, 9, 0x0100_0000_0000_0049, gid(1), &odd);
    assert!(matches!(l.take_actions()[..], [Action::Accept { req: 9, private_data, .. }] if private_data == ours));
    // a datagram-mode node refuses every REQ
    let mut d = Link::new(Net::cfg(Mode::Datagram, 3, 0x50));
    d.on_cm_req(now, 1, 0x1000_0000_0000_0050, gid(1), &good_pd);
    assert!(matches!(
        d.take_actions()[..],
        [Action::RejectReq {
            reason: REJ_INVALID_SERVICE_ID,
            ..
        }]
    ));
}

/// IPCM-9, B4.3: both sides start traffic at the same instant, 1,000 times with shuffled
/// delivery: always exactly one RC connection per pair, and it is the larger-LLA node's
/// REQ that wins (that node is the active side).
#[test]
fn ipcm_9_crossing_reqs_1000_times() {
    for run in 0..1000u64 {
        let mut net = Net::new();
        let qa = 0x100 + (run as u32 * 7919) % 0x1000;
        let qb = 0x100 + (run as u32 * 104_729) % 0x1000 + if run % 3 == 0 { 0 } else { 1 };
        let qb = if qb == qa { qb + 1 } else { qb };
        net.add(Net::cfg(Mode::Connected, 1 + (run % 2) as u8, qa));
        net.add(Net::cfg(Mode::Connected, 2 - (run % 2) as u8, qb));
        net.pump();
        let (ia, ib) = (
            net.nodes[0].as_ref().unwrap().config().ipv4[0].0,
            net.nodes[1].as_ref().unwrap().config().ipv4[0].0,
        );
        // both resolved first (each got the other's ARP request), no connection yet
        let (la, lb) = (net.lla(0), net.lla(1));
        let arp = |s: LinkAddr, sip, tip| {
            let a = ArpPacket {
                op: ArpOp::Request,
                sender_hw: s,
                sender_ip: sip,
                target_hw: LinkAddr::new(false, 0, [0; 16]),
                target_ip: tip,
            };
            EncapHeader::encapsulate(EtherType::Arp, &a.to_bytes())
        };
        let now = net.now;
        net.node(0).on_ud_recv(now, &arp(lb, ib, ia));
        net.node(1).on_ud_recv(now, &arp(la, ia, ib));
        net.pump();
        assert!(net.established(0).is_empty(), "run {run}");
        net.trace.clear();
        // now large packets both ways at the same instant: both want a connection
        net.send(0, v4(ia, ib, 3000, true));
        net.send(1, v4(ib, ia, 3000, true));
        net.seed = run * 2_654_435_761 + 1;
        net.pump();
        let a = net.established(0);
        let b = net.established(1);
        assert_eq!((a.len(), b.len()), (1, 1), "run {run}: {:?} / {:?}", a, b);
        assert_eq!(
            net.nodes[0].as_ref().unwrap().connections(net.now).len(),
            1,
            "run {run}"
        );
        assert_eq!(
            net.nodes[1].as_ref().unwrap().connections(net.now).len(),
            1,
            "run {run}"
        );
        assert_eq!(
            net.pairs.get(&(0, a[0].conn)),
            Some(&(1, b[0].conn)),
            "run {run}: paired"
        );
        let larger = if net.lla(0).cmp_crossing(&net.lla(1)).is_gt() {
            0
        } else {
            1
        };
        let act = if larger == 0 { &a[0] } else { &b[0] };
        assert_eq!(act.role, Role::Active, "run {run}: the larger LLA's REQ wins");
        assert!(net.kernel[0].iter().any(|p| p.len() == 3000), "run {run}");
        assert!(net.kernel[1].iter().any(|p| p.len() == 3000), "run {run}");
        assert_eq!(
            net.count(|(_, a)| matches!(a, Action::Connect { .. })),
            2,
            "run {run}: REQs crossed"
        );
        let rej = net.count(|(_, a)| {
            matches!(
                a,
                Action::RejectReq {
                    reason: REJ_CONSUMER,
                    ..
                }
            )
        });
        assert_eq!(rej, 1, "run {run}: the smaller side's REQ is rejected");
    }
}

/// IPCM-12 (scripted peer): a REP whose Receive MTU is below the minimum is answered with
/// REJ; the peer is then reached over UD with the UD MTU.
#[test]
fn ipcm_12_rep_with_too_small_receive_mtu() {
    let mut l = Link::new(Net::cfg(Mode::Connected, 1, 0x48));
    let now = Duration::from_secs(5);
    let peer = LinkAddr::new(true, 0x49, gid(2));
    // resolve 10.20.0.2 by an ARP request from it
    let req = ArpPacket {
        op: ArpOp::Request,
        sender_hw: peer,
        sender_ip: ip4(2),
        target_hw: LinkAddr::new(false, 0, [0; 16]),
        target_ip: ip4(1),
    };
    l.on_ud_recv(now, &EncapHeader::encapsulate(EtherType::Arp, &req.to_bytes()));
    l.take_actions();
    l.on_kernel_packet(now, v4(ip4(1), ip4(2), 3000, true));
    let conn = match &l.take_actions()[..] {
        [Action::Connect { conn, .. }] => *conn,
        other => panic!("{other:?}"),
    };
    l.on_cm_rep(now, conn, &CmPrivateData::new(0x49, 1000).to_bytes());
    let acts = l.take_actions();
    assert!(matches!(
        acts[0],
        Action::RejectRep {
            reason: REJ_CONSUMER,
            ..
        }
    ));
    // the queued 3,000-octet DF packet: too big for UD → fragmentation needed, 2,044
    assert!(matches!(&acts[1], Action::ToKernel(e) if u16::from_be_bytes([e[26], e[27]]) == 2044));
    assert_eq!(l.mtu_to(now, IpAddr::V4(ip4(2))), Some(2044));
    l.on_kernel_packet(now, v4(ip4(1), ip4(2), 1000, true));
    assert!(matches!(
        &l.take_actions()[..],
        [Action::UdSend {
            dest: UdDest::Unicast(_),
            ..
        }]
    ));
    // after the backoff, connected mode is tried again
    let later = now + Duration::from_secs(11);
    l.on_kernel_packet(later, v4(ip4(1), ip4(2), 1000, true));
    assert!(l.take_actions().iter().any(|a| matches!(a, Action::Connect { .. })));
}

/// IPCM-13: REQ 65,524 vs REP 4,096 → both sides use 4,092-octet IP packets on that
/// connection; a larger DF packet gets "fragmentation needed" 4,092.
#[test]
fn ipcm_13_connection_mtu_is_the_minimum() {
    let mut net = Net::new();
    net.add(Net::cfg(Mode::Connected, 1, 0x48));
    let mut small = Net::cfg(Mode::Connected, 2, 0x49);
    small.cm_recv_mtu = 4096;
    net.add(small);
    net.pump();
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    assert_eq!(net.established(0)[0].mtu, 4092);
    assert_eq!(net.established(1)[0].mtu, 4092);
    net.send(0, v4(ip4(1), ip4(2), 4092, true));
    net.send(1, v4(ip4(2), ip4(1), 4093, true));
    net.pump();
    assert_eq!(net.kernel[1].last().unwrap().len(), 4092);
    let e = net.kernel[1]
        .iter()
        .find(|p| p[9] == 1 && p[20] == 3)
        .expect("ICMP at node 1");
    assert_eq!(u16::from_be_bytes([e[26], e[27]]), 4092);
}

/// IPCM-15: unicast IP arriving over UD is delivered while an RC connection exists.
/// IPCM-16: ARP is never sent on a connection, and ARP arriving on one is dropped.
#[test]
fn ipcm_15_16_ud_accepted_arp_never_on_rc() {
    let mut net = two(Mode::Connected, Mode::Connected);
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    assert_eq!(net.established(1).len(), 1);
    let p = v4(ip4(1), ip4(2), 500, true);
    let now = net.now;
    net.node(1)
        .on_ud_recv(now, &EncapHeader::encapsulate(EtherType::Ipv4, &p));
    net.node(1).take_actions();
    // (delivered straight to the kernel action list)
    let c = net.established(1)[0].conn;
    let arp = ArpPacket {
        op: ArpOp::Request,
        sender_hw: net.lla(0),
        sender_ip: ip4(1),
        target_hw: LinkAddr::new(false, 0, [0; 16]),
        target_ip: ip4(2),
    };
    net.node(1)
        .on_rc_recv(now, c, &EncapHeader::encapsulate(EtherType::Arp, &arp.to_bytes()));
    assert!(net.node(1).take_actions().is_empty(), "no ARP reply to an ARP on RC");
    net.node(1)
        .on_ud_recv(now, &EncapHeader::encapsulate(EtherType::Ipv4, &p));
    assert_eq!(net.node(1).take_actions(), vec![Action::ToKernel(p)]);
    for (_, a) in &net.trace {
        if let Action::RcSend { payload, .. } = a {
            assert!(payload[..2] == [8, 0] || payload[..2] == [0x86, 0xdd]);
        }
    }
}

/// RFC 4391 §9.3 over the machine: ping6 to the peer's link-local address resolves by NS
/// to the solicited-node group and NA back; an IPv6 packet too big for a datagram peer
/// gets ICMPv6 "packet too big" 2,044.
#[test]
fn ipv6_nd_and_packet_too_big() {
    let mut net = two(Mode::Connected, Mode::Datagram);
    let (ll0, ll1) = (net.node(0).link_local(), net.node(1).link_local());
    let p = v6(ll0, ll1, 104);
    net.send(0, p.clone());
    net.pump();
    assert_eq!(net.kernel[1], vec![p]);
    let q = v6(ll1, ll0, 104);
    net.send(1, q.clone());
    net.pump();
    assert_eq!(net.kernel[0], vec![q]);
    net.send(0, v6(ll0, ll1, 2045));
    net.pump();
    let e = net.kernel[0].pop().unwrap();
    let (h, m) = Ipv6Header::parse(&e).unwrap();
    assert_eq!((h.src, h.dst, m[0]), (ll1, ll0, 2));
    assert_eq!(u32::from_be_bytes([m[4], m[5], m[6], m[7]]), 2044);
    // the kernel's own ND on the NOARP device is not forwarded
    let before = net.trace.len();
    let ns = ipoib::wire::nd::build_solicit(ll0, ipoib::wire::nd::solicited_node(ll1), ll1, &net.lla(0));
    net.send(0, ns);
    net.pump();
    assert_eq!(net.trace.len(), before);
}

/// Malformed ARP/ND from a scripted peer: dropped, nothing to the kernel, no reply, no
/// neighbour learned, no panic; an ARP claiming our own address or a multicast sender is
/// ignored.
#[test]
fn malformed_arp_and_nd_are_dropped() {
    let mut l = Link::new(Net::cfg(Mode::Connected, 1, 0x48));
    let now = Duration::from_secs(1);
    let peer = LinkAddr::new(true, 0x49, gid(2));
    let good = ArpPacket {
        op: ArpOp::Request,
        sender_hw: peer,
        sender_ip: ip4(2),
        target_hw: LinkAddr::new(false, 0, [0; 16]),
        target_ip: ip4(1),
    }
    .to_bytes();
    let mut bad = Vec::new();
    for (at, v) in [(1, 1u8), (4, 6), (5, 16), (7, 9)] {
        let mut b = good;
        b[at] = v;
        bad.push(EncapHeader::encapsulate(EtherType::Arp, &b));
    }
    bad.push(EncapHeader::encapsulate(EtherType::Arp, &good[..40]));
    bad.push(vec![8, 6]);
    let mut own = good;
    own[28..32].copy_from_slice(&ip4(1).octets());
    bad.push(EncapHeader::encapsulate(EtherType::Arp, &own));
    let mut mc = good;
    mc[8..28].copy_from_slice(&LinkAddr::multicast(Mgid::broadcast(0xffff, 2).0).to_bytes());
    bad.push(EncapHeader::encapsulate(EtherType::Arp, &mc));
    let ll = l.link_local();
    let mut ns = ipoib::wire::nd::build_solicit("fe80::9".parse().unwrap(), ll, ll, &peer);
    ns[7] = 1; // hop limit
    bad.push(EncapHeader::encapsulate(EtherType::Ipv6, &ns));
    let mut ns2 = ipoib::wire::nd::build_solicit("fe80::9".parse().unwrap(), ll, ll, &peer);
    ns2[60] ^= 0xff; // checksum breaks
    bad.push(EncapHeader::encapsulate(EtherType::Ipv6, &ns2));
    bad.push(EncapHeader::encapsulate(EtherType::Ipv4, &[0x45, 0, 0, 200]));
    bad.push(EncapHeader::encapsulate(EtherType::Other(0x88b5), &[1, 2, 3]));
    for b in &bad {
        l.on_ud_recv(now, b);
        assert!(l.take_actions().is_empty(), "{b:02x?}");
    }
    assert!(l.neighbours(now).is_empty());
    l.on_ud_recv(now, &EncapHeader::encapsulate(EtherType::Arp, &good));
    assert_eq!(l.take_actions().len(), 1, "the well-formed request is answered");
}

/// Bounded resolution: packets for an unresolved address wait in a queue of `queue_len`;
/// after the retries the entry is removed (no unbounded growth).
#[test]
fn unresolved_neighbour_queue_is_bounded_and_expires() {
    let mut net = two(Mode::Connected, Mode::Connected);
    for _ in 0..100 {
        net.send(0, v4(ip4(1), ip4(77), 100, true));
    }
    net.pump();
    let n = net.node(0).neighbours(Duration::ZERO);
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].queued, 16);
    assert_eq!(n[0].state, "INCOMPLETE");
    for _ in 0..3 {
        net.tick(Duration::from_secs(1));
    }
    assert!(net.node(0).neighbours(Duration::ZERO).is_empty());
    let arps = net.count(|(i, a)| {
        *i == 0
            && matches!(a, Action::UdSend { payload, .. }
                if payload[..2] == [8, 6] && ArpPacket::parse(&payload[4..]).unwrap().target_ip == ip4(77))
    });
    assert_eq!(arps, 3, "three requests, then give up");
}

/// IPCM-S2 idle teardown and reconnect on next traffic; IPCM-S1 interface down.
#[test]
fn idle_teardown_and_reconnect() {
    let mut net = two(Mode::Connected, Mode::Connected);
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    assert_eq!(net.established(0).len(), 1);
    net.tick(Duration::from_secs(121));
    assert!(net.established(0).is_empty() && net.established(1).is_empty());
    net.send(0, v4(ip4(1), ip4(2), 9000, true));
    net.pump();
    assert_eq!(net.kernel[1].last().unwrap().len(), 9000);
    assert_eq!(net.established(0).len(), 1);
    net.node(1).shutdown();
    net.pump();
    assert!(net.established(0).is_empty() && net.established(1).is_empty());
}

/// Peer restart: the peer comes back with a new UD QPN. (a) its RC QP error is reported →
/// we re-resolve at once and reconnect on the next traffic; (b) it talks first → its ARP
/// shows the changed address and the stale connection is dropped. No black hole beyond
/// one resolution round trip.
#[test]
fn peer_restart_is_noticed() {
    for talk_first in [false, true] {
        let mut net = two(Mode::Connected, Mode::Connected);
        net.send(0, v4(ip4(1), ip4(2), 84, true));
        net.pump();
        let old = net.established(0)[0].conn;
        // node 1 restarts with a new QPN
        net.nodes[1] = None;
        net.pairs.retain(|k, v| k.0 != 1 && v.0 != 1);
        let mut l = Link::new(Net::cfg(Mode::Connected, 2, 0x77));
        l.start();
        net.nodes[1] = Some(l);
        net.joined[1].clear();
        net.pump();
        if talk_first {
            net.send(1, v4(ip4(2), ip4(1), 84, true));
            net.pump();
            assert!(
                net.trace
                    .iter()
                    .any(|(i, a)| *i == 0 && *a == Action::Disconnect { conn: old })
            );
        } else {
            let now = net.now;
            net.node(0).on_conn_closed(now, old);
            net.pump();
        }
        net.kernel[1].clear();
        net.send(0, v4(ip4(1), ip4(2), 3000, true));
        net.pump();
        assert_eq!(net.kernel[1].len(), 1, "talk_first={talk_first}");
        let c = net.established(0);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].peer.qpn, 0x77);
    }
}

/// Revalidation (RFC 4391 §9.4): a resolved neighbour goes STALE after the reachable time
/// and is re-asked; with no answer it is removed, so a vanished peer is not used forever.
#[test]
fn stale_neighbour_is_revalidated_then_dropped() {
    let mut net = two(Mode::Datagram, Mode::Datagram);
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    net.tick(Duration::from_secs(31));
    assert_eq!(net.node(0).neighbours(Duration::ZERO)[0].state, "REACHABLE", "answered");
    net.nodes[1] = None;
    net.tick(Duration::from_secs(31));
    assert_eq!(net.node(0).neighbours(Duration::ZERO)[0].state, "STALE");
    for _ in 0..4 {
        net.tick(Duration::from_secs(1));
    }
    assert!(net.node(0).neighbours(Duration::ZERO).is_empty());
}

/// Issue 16, the daemon's zero-copy send path: `Link::rc_route` on a packet in place says
/// "this connection" exactly when `on_kernel_packet` would hand the packet to that
/// established connection as one `RcSend` (and leaves the machine as that call does), and
/// changes nothing when it says no (the daemon then calls `on_kernel_packet`). Checked on
/// twins of the same machine for each kind of packet the kernel sends.
#[test]
fn rc_route_is_on_kernel_packet_without_the_copy() {
    let mut net = two(Mode::Connected, Mode::Connected);
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    let (ll0, ll1) = (net.node(0).link_local(), net.node(1).link_local());
    net.send(0, v6(ll0, ll1, 104));
    net.pump();
    assert_eq!(net.established(0).len(), 1);
    let conn = net.established(0)[0].conn;
    let mut trailing = v4(ip4(1), ip4(2), 1000, true);
    trailing.extend_from_slice(&[0; 10]);
    let ns = ipoib::wire::nd::build_solicit(ll0, ipoib::wire::nd::solicited_node(ll1), ll1, &net.lla(0));
    let cases: Vec<(&str, Vec<u8>, Option<EtherType>)> = vec![
        ("IPv4 65,520", v4(ip4(1), ip4(2), 65520, true), Some(EtherType::Ipv4)),
        ("IPv4 84", v4(ip4(1), ip4(2), 84, false), Some(EtherType::Ipv4)),
        ("IPv6 link-local", v6(ll0, ll1, 3000), Some(EtherType::Ipv6)),
        ("IPv4 with trailing octets", trailing, None),
        ("IPv4 over the connection MTU", v4(ip4(1), ip4(2), 65521, true), None),
        (
            "IPv4 broadcast",
            v4(ip4(1), Ipv4Addr::new(10, 20, 0, 255), 84, true),
            None,
        ),
        (
            "IPv4 multicast",
            v4(ip4(1), Ipv4Addr::new(224, 0, 0, 1), 84, true),
            None,
        ),
        ("IPv4 to an unresolved neighbour", v4(ip4(1), ip4(9), 84, true), None),
        ("IPv6 all-nodes", v6(ll0, "ff02::1".parse().unwrap(), 104), None),
        ("IPv6 ND", ns, None),
        ("truncated IPv4", v4(ip4(1), ip4(2), 84, true)[..19].to_vec(), None),
        ("not IP", vec![0x12; 64], None),
    ];
    let now = net.now + Duration::from_millis(5);
    for (what, pkt, want) in cases {
        let link = net.node(0);
        let before = format!("{link:?}");
        let mut twin = link.clone();
        let fast = link.rc_route(now, &pkt);
        twin.on_kernel_packet(now, pkt.clone());
        let slow = twin.take_actions();
        assert_eq!(fast.map(|(_, et)| et), want, "{what}");
        match fast {
            Some((c, et)) => {
                assert_eq!(c, conn, "{what}");
                assert_eq!(
                    slow,
                    vec![Action::RcSend {
                        conn: c,
                        payload: EncapHeader::encapsulate(et, &pkt),
                    }],
                    "{what}"
                );
                assert_eq!(format!("{:?}", net.node(0)), format!("{twin:?}"), "{what}: same state");
            }
            None => {
                assert_eq!(format!("{:?}", net.node(0)), before, "{what}: nothing changed");
                assert!(
                    !matches!(slow.as_slice(), [Action::RcSend { .. }]) || what.contains("trailing"),
                    "{what}: the slow path sent it as the fast one would have: {slow:?}"
                );
            }
        }
    }
    // Datagram mode never takes the connection path.
    let mut dg = two(Mode::Datagram, Mode::Datagram);
    dg.send(0, v4(ip4(1), ip4(2), 84, true));
    dg.pump();
    let now = dg.now;
    assert_eq!(dg.node(0).rc_route(now, &v4(ip4(1), ip4(2), 1000, true)), None);
}

/// Issue 16, the zero-copy receive path: `on_rc_recv_in_place` returns the range of the IP
/// packet that `on_rc_recv` copies to the kernel, and nothing where it copies nothing.
#[test]
fn rc_recv_in_place_is_on_rc_recv_without_the_copy() {
    let mut net = two(Mode::Connected, Mode::Connected);
    net.send(0, v4(ip4(1), ip4(2), 84, true));
    net.pump();
    let conn = net.established(1)[0].conn;
    let enc = |et, p: &[u8]| EncapHeader::encapsulate(et, p);
    let mut trailing = enc(EtherType::Ipv4, &v4(ip4(1), ip4(2), 500, true));
    trailing.extend_from_slice(&[9; 7]);
    let (ll0, ll1) = (net.node(0).link_local(), net.node(1).link_local());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("IPv4", enc(EtherType::Ipv4, &v4(ip4(1), ip4(2), 65520, true))),
        ("IPv4 with trailing octets", trailing),
        ("IPv6", enc(EtherType::Ipv6, &v6(ll0, ll1, 2000))),
        ("ARP on RC", enc(EtherType::Arp, &[0; 28])),
        ("short", vec![8, 0]),
        (
            "IPv4 header only",
            enc(EtherType::Ipv4, &v4(ip4(1), ip4(2), 84, true)[..20]),
        ),
        ("unknown type", enc(EtherType::Other(0x88b5), &[1; 40])),
        ("over the MTU", enc(EtherType::Ipv4, &vec![0x45; 65521])),
    ];
    let now = net.now;
    for (what, msg) in cases {
        let link = net.node(1);
        let mut twin = link.clone();
        let r = link.on_rc_recv_in_place(now, conn, &msg);
        twin.on_rc_recv(now, conn, &msg);
        let want: Vec<Action> = r
            .clone()
            .map(|r| Action::ToKernel(msg[r].to_vec()))
            .into_iter()
            .collect();
        assert_eq!(twin.take_actions(), want, "{what}");
        let mut link_actions = net.node(1).take_actions();
        assert_eq!(format!("{:?}", net.node(1)), format!("{twin:?}"), "{what}: same state");
        link_actions.retain(|a| !matches!(a, Action::ToKernel(_)));
        assert!(link_actions.is_empty(), "{what}: {link_actions:?}");
    }
}
