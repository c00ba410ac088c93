//! Issue 16, "scripted misbehaving peers" at device level: a scripted peer — a raw UD QP
//! and raw RC QPs on its own RoCEv2 device, driven through the verbs API, no IPoIB
//! machine — sends a connected-mode [`Node`] (A, 10.31.0.1) malformed ARP and ND, REQs
//! with a wrong service ID or private data, a REP with a Receive MTU below the minimum,
//! oversized messages over UD and RC, and messages without or with a bad encapsulation
//! header. Each test checks A's answer on the wire (REJ reason and private data, ARP/NA
//! replies or none), A's drop counters ([`ipoib::link::LinkCounters`], `softrdma ipoib
//! show counters`), and that A keeps serving a healthy third node (C, 10.31.0.3): a
//! 3,000-octet packet from C (over RC) and a small one (over UD) reach A's kernel side.
//!
//! "Nothing came back" is checked without timing: after the bad input the peer sends a
//! good one, and the first answer it receives must be the good one's (the link answers in
//! order; UD loopback and RC keep order).
//!
//! Loopback devices 127.117.20-39.x and P_Keys 0x8020.. (unique to this file).
//! Requirements: `../shared/requirements/smcr-ipoibcm.md` B2 (IPCM-4, 5, 8, 10, 11, 12,
//! 13, 14, 15, 16), B4.5, C1, C2.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use ipoib::link::{LinkCounters, Mode};
use ipoib::node::{GRH_LEN, IPOIB_QKEY, Node};
use ipoib::wire::arp::{ArpOp, ArpPacket};
use ipoib::wire::cm::{CmPrivateData, ServiceId, ServiceIdPrefix};
use ipoib::wire::encap::{EncapHeader, EtherType};
use ipoib::wire::ip::icmpv6_checksum;
use ipoib::wire::lla::LinkAddr;
use ipoib::wire::{mgid, nd};
use verbs::{
    Access, AhAttr, CmEvent, CompletionQueue, ConnParam, Device, Error, Gid, MemoryRegion, ProtectionDomain, QpAttr,
    QpInit, QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WrOpcode,
};

mod common;
use common::{dev_mtu, ip4, node, run_until, v4};

/// UD buffer: GRH + the largest IB MTU.
const UD_SLOT: usize = GRH_LEN + 4096;
const UD_RECV: usize = 16;
/// RC buffer: bigger than any message of these tests.
const RC_SLOT: usize = 70_000;
const RC_RECV: usize = 8;

/// The scripted peer: one UD QP (its "UD QPN" for the LLA and the private data), at most
/// one RC QP, nothing else.
struct Peer {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    ud: QueuePair,
    mr: MemoryRegion,
    lla: LinkAddr,
    next_send: usize,
    rc: Option<Rc>,
    /// What A's kernel side got while the peer's calls polled the nodes.
    to_a: Vec<Vec<u8>>,
}

struct Rc {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

impl Peer {
    fn open(addr: &str, mtu: u32) -> Peer {
        let dev = dev_mtu(addr, mtu);
        let gid = dev.query_gid(1, 0).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(256).unwrap();
        let ud = pd.create_qp(QpInit::new(QpType::Ud, &cq)).unwrap();
        ud.modify_qp(&QpAttr::init_ud(1, 0, IPOIB_QKEY)).unwrap();
        ud.modify_qp(&QpAttr::state(QpState::Rtr)).unwrap();
        ud.modify_qp(&QpAttr {
            sq_psn: Some(0),
            ..QpAttr::state(QpState::Rts)
        })
        .unwrap();
        let mr = pd.reg_mr(2 * UD_RECV * UD_SLOT, Access::LOCAL_WRITE).unwrap();
        for i in 0..UD_RECV {
            ud.post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: vec![mr.sge(i * UD_SLOT, UD_SLOT as u32)],
            }])
            .unwrap();
        }
        let lla = LinkAddr::new(true, ud.qp_num(), gid.0);
        Peer {
            dev,
            pd,
            cq,
            ud,
            mr,
            lla,
            next_send: 0,
            rc: None,
            to_a: Vec::new(),
        }
    }

    /// Polls every node once; keeps what A's kernel side gets.
    fn pump(&mut self, nodes: &mut [Node]) {
        pump(&mut self.to_a, nodes);
    }

    /// Polls until A's kernel side got something (10 s at most); all it got.
    fn a_gets(&mut self, nodes: &mut [Node]) -> Vec<Vec<u8>> {
        let end = Instant::now() + Duration::from_secs(10);
        while self.to_a.is_empty() {
            pump(&mut self.to_a, nodes);
            assert!(Instant::now() < end, "nothing reached A's kernel side");
        }
        // Anything sent in the same burst has arrived by one more round.
        self.pump(nodes);
        std::mem::take(&mut self.to_a)
    }

    /// `msg` as one UD message to `to`'s QPN (unicast).
    fn send_ud(&mut self, to: LinkAddr, msg: &[u8]) {
        let i = UD_RECV + self.next_send;
        self.next_send = (self.next_send + 1) % UD_RECV;
        self.mr.write(i * UD_SLOT, msg).unwrap();
        let ah = self.pd.create_ah(&AhAttr::to_gid(Gid(to.gid))).unwrap();
        let wr = SendWr::new(
            1_000 + i as u64,
            WrOpcode::Send,
            vec![self.mr.sge(i * UD_SLOT, msg.len() as u32)],
        )
        .flags(SendFlags::SIGNALED)
        .ud(verbs::UdDest {
            ah,
            remote_qpn: to.qpn,
            remote_qkey: IPOIB_QKEY,
        });
        self.ud.post_send(&[wr]).unwrap();
    }

    /// The next UD message for us (GRH stripped), polling `nodes` meanwhile; 10 s at most.
    fn recv_ud(&mut self, nodes: &mut [Node]) -> Vec<u8> {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            while let Some(wc) = self.cq.poll_one() {
                if wc.opcode != WcOpcode::Recv {
                    assert_eq!(wc.status, WcStatus::Success, "peer UD send");
                    continue;
                }
                assert_eq!(wc.status, WcStatus::Success);
                let i = wc.wr_id as usize;
                let msg = self
                    .mr
                    .to_vec(i * UD_SLOT + GRH_LEN, wc.byte_len as usize - GRH_LEN)
                    .unwrap();
                self.ud
                    .post_recv(&[RecvWr {
                        wr_id: i as u64,
                        sg_list: vec![self.mr.sge(i * UD_SLOT, UD_SLOT as u32)],
                    }])
                    .unwrap();
                return msg;
            }
            pump(&mut self.to_a, nodes);
            assert!(Instant::now() < end, "nothing came back over UD");
        }
    }

    /// An encapsulated ARP packet from this peer.
    fn arp(&self, op: ArpOp, sender_hw: LinkAddr, sender_ip: Ipv4Addr, target_ip: Ipv4Addr) -> Vec<u8> {
        let p = ArpPacket {
            op,
            sender_hw,
            sender_ip,
            target_hw: LinkAddr {
                flags: 0,
                qpn: 0,
                gid: [0; 16],
            },
            target_ip,
        };
        EncapHeader::encapsulate(EtherType::Arp, &p.to_bytes())
    }

    /// Makes A learn this peer as 10.31.0.2 (an ARP request for A's address) and takes
    /// A's reply.
    fn introduce(&mut self, nodes: &mut [Node]) -> ArpPacket {
        let a = nodes[0].link().local_addr();
        let req = self.arp(ArpOp::Request, self.lla, ip4(2), ip4(1));
        self.send_ud(a, &req);
        let reply = self.recv_ud(nodes);
        let (h, body) = EncapHeader::parse(&reply).unwrap();
        assert_eq!(h.ether_type, EtherType::Arp);
        ArpPacket::parse(body).unwrap()
    }

    fn new_rc(&self) -> Rc {
        let cq = self.dev.create_cq(64).unwrap();
        let attr = QpInitAttr {
            max_send_wr: 16,
            max_recv_wr: RC_RECV as u32,
            ..QpInitAttr::default()
        };
        let qp = self.pd.create_qp(QpInit::new(QpType::Rc, &cq).cap(attr)).unwrap();
        let mr = self.pd.reg_mr((RC_RECV + 1) * RC_SLOT, Access::LOCAL_WRITE).unwrap();
        qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE)).unwrap();
        for i in 0..RC_RECV {
            qp.post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: vec![mr.sge(i * RC_SLOT, RC_SLOT as u32)],
            }])
            .unwrap();
        }
        Rc { qp, cq, mr }
    }

    /// A REQ to A on `sid` with `pd` as private data, A polled meanwhile; on success the
    /// connection is kept as this peer's RC QP.
    fn connect(&mut self, nodes: &mut [Node], sid: u64, pd: Vec<u8>) -> Result<(), Error> {
        self.connect_to(nodes, Gid(nodes[0].link().local_addr().gid), sid, pd)
    }

    fn connect_to(&mut self, nodes: &mut [Node], gid: Gid, sid: u64, pd: Vec<u8>) -> Result<(), Error> {
        let rc = self.new_rc();
        let Rc { qp, cq, mr } = rc;
        let t = std::thread::spawn(move || {
            let param = ConnParam {
                private_data: pd,
                ..Default::default()
            };
            let r = qp.connect_ib_service(gid, sid, &param, Duration::from_secs(5));
            (qp, r)
        });
        let end = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() {
            pump(&mut self.to_a, nodes);
            assert!(Instant::now() < end, "no answer to the REQ");
        }
        let (qp, r) = t.join().unwrap();
        if r.is_ok() {
            self.rc = Some(Rc { qp, cq, mr });
        }
        r
    }

    /// `msg` as one RC SEND on the peer's connection; waits for its completion.
    fn send_rc(&mut self, nodes: &mut [Node], msg: &[u8]) {
        let rc = self.rc.as_ref().expect("connected");
        let off = RC_RECV * RC_SLOT;
        rc.mr.write(off, msg).unwrap();
        let wr = SendWr::new(99, WrOpcode::Send, vec![rc.mr.sge(off, msg.len() as u32)]).flags(SendFlags::SIGNALED);
        rc.qp.post_send(&[wr]).unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(wc) = rc.cq.poll_one() {
                if wc.opcode == WcOpcode::Recv {
                    panic!("unexpected RC receive of {} octets", wc.byte_len);
                }
                assert_eq!(wc.status, WcStatus::Success, "peer RC send");
                return;
            }
            pump(&mut self.to_a, nodes);
            assert!(Instant::now() < end, "RC send did not complete");
        }
    }

    /// The next message on the peer's connection, polling `nodes` meanwhile.
    fn recv_rc(&mut self, nodes: &mut [Node]) -> Vec<u8> {
        let rc = self.rc.as_ref().expect("connected");
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(wc) = rc.cq.poll_one() {
                assert_eq!((wc.opcode, wc.status), (WcOpcode::Recv, WcStatus::Success));
                let i = wc.wr_id as usize;
                let m = rc.mr.to_vec(i * RC_SLOT, wc.byte_len as usize).unwrap();
                rc.qp
                    .post_recv(&[RecvWr {
                        wr_id: i as u64,
                        sg_list: vec![rc.mr.sge(i * RC_SLOT, RC_SLOT as u32)],
                    }])
                    .unwrap();
                return m;
            }
            pump(&mut self.to_a, nodes);
            assert!(Instant::now() < end, "nothing came over RC");
        }
    }
}

/// Polls every node once; what A's kernel side gets goes to `to_a` (C's is not looked at).
fn pump(to_a: &mut Vec<Vec<u8>>, nodes: &mut [Node]) {
    for (i, n) in nodes.iter_mut().enumerate() {
        let got = n.poll(Duration::from_millis(1)).unwrap();
        if i == 0 {
            to_a.extend(got);
        }
    }
}

/// A (connected, 10.31.0.1) and the healthy C (connected, 10.31.0.3) on devices
/// 127.117.`net`.1 / .3 with IB MTU `mtu`, and the scripted peer on 127.117.`net`.2.
fn setup(net: u8, pkey: u16, mtu: u32) -> (Vec<Node>, Peer, [Device; 2]) {
    let da = dev_mtu(&format!("127.117.{net}.1"), mtu);
    let dc = dev_mtu(&format!("127.117.{net}.3"), mtu);
    let nodes = vec![node(&da, Mode::Connected, pkey, 1), node(&dc, Mode::Connected, pkey, 3)];
    let peer = Peer::open(&format!("127.117.{net}.2"), mtu);
    (nodes, peer, [da, dc])
}

/// The healthy third node still reaches A: a 3,000-octet packet (RC) and a 100-octet one.
fn healthy(nodes: &mut [Node], id: u16) {
    let (big, small) = (v4(ip4(3), ip4(1), 3000, id), v4(ip4(3), ip4(1), 100, id + 1));
    nodes[1].from_kernel(big.clone()).unwrap();
    nodes[1].from_kernel(small.clone()).unwrap();
    run_until(nodes, |_, g| g[0].contains(&big) && g[0].contains(&small));
}

fn rej_code(r: Result<(), Error>) -> (Option<u32>, Vec<u8>) {
    match r {
        Err(Error::Rejected { private_data, detail }) => (detail.and_then(|d| d.code()), private_data),
        other => panic!("expected a REJ, got {other:?}"),
    }
}

fn sid(qpn: u32) -> u64 {
    ServiceId::new(ServiceIdPrefix::Linux, qpn).value()
}

fn pd(qpn: u32, mtu: u32) -> Vec<u8> {
    CmPrivateData::new(qpn, mtu).to_bytes().to_vec()
}

fn fix_icmpv6_checksum(p: &mut [u8]) {
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&p[24..40]).unwrap());
    p[42] = 0;
    p[43] = 0;
    let c = icmpv6_checksum(&src, &dst, &p[40..]);
    p[42..44].copy_from_slice(&c.to_be_bytes());
}

/// IPCM-4: the reserved flag bits (0x3F) of a received LLA are ignored — an ARP request
/// whose sender LLA has them all set (with RC) is answered like any other, and A records
/// the peer with flags 0x80 only; with only reserved bits (no RC) the peer is recorded as
/// datagram-only (flags 0), so A sends it nothing over RC.
#[test]
fn ipcm4_reserved_flag_bits_are_ignored_on_receive() {
    let (mut nodes, mut peer, _d) = setup(20, 0x8020, 2048);
    let a = nodes[0].link().local_addr();
    let odd = LinkAddr {
        flags: 0xbf,
        ..peer.lla
    };
    let req = peer.arp(ArpOp::Request, odd, ip4(2), ip4(1));
    peer.send_ud(a, &req);
    let reply = peer.recv_ud(&mut nodes);
    let arp = ArpPacket::parse(&reply[4..]).unwrap();
    assert_eq!((arp.op, arp.target_ip), (ArpOp::Reply, ip4(2)));
    let now = nodes[0].now();
    let n = nodes[0].link().neighbours(now);
    let lla = n
        .iter()
        .find(|v| v.ip == ip4(2))
        .and_then(|v| v.lla)
        .expect("peer learnt");
    assert_eq!(lla.flags, LinkAddr::FLAG_RC, "reserved bits dropped, RC kept");
    let ud_only = LinkAddr {
        flags: 0x3f,
        ..peer.lla
    };
    let req = peer.arp(ArpOp::Request, ud_only, ip4(2), ip4(1));
    peer.send_ud(a, &req);
    peer.recv_ud(&mut nodes);
    let now = nodes[0].now();
    let lla = nodes[0]
        .link()
        .neighbours(now)
        .into_iter()
        .find(|v| v.ip == ip4(2))
        .and_then(|v| v.lla);
    assert_eq!(lla.map(|l| l.flags), Some(0), "reserved bits alone: datagram-only");
    // Datagram-only: a small packet goes over UD (arrives at the peer's UD QP); nothing is
    // connected.
    let p = v4(ip4(1), ip4(2), 200, 5);
    nodes[0].from_kernel(p.clone()).unwrap();
    let got = peer.recv_ud(&mut nodes);
    assert_eq!(&got[4..], &p[..]);
    assert_eq!(nodes[0].rc_connections(), 0);
    healthy(&mut nodes, 10);
}

/// IPCM-5 (and IPCM-16 for ARP): A's ARP reply arrives unicast over UD at the requester's
/// QPN and carries A's own LLA: flags 0x80 (connected mode), A's UD QPN, A's GID.
#[test]
fn ipcm5_arp_reply_carries_own_lla_unicast_over_ud() {
    let (mut nodes, mut peer, _d) = setup(21, 0x8021, 2048);
    let a = nodes[0].link().local_addr();
    let arp = peer.introduce(&mut nodes);
    assert_eq!(arp.op, ArpOp::Reply);
    assert_eq!((arp.sender_ip, arp.target_ip), (ip4(1), ip4(2)));
    assert_eq!(arp.sender_hw.flags, 0x80, "RC flag, reserved bits 0 (IPCM-17)");
    assert_eq!(arp.sender_hw.qpn, a.qpn, "A's UD QPN");
    assert_eq!(arp.sender_hw.gid, a.gid);
    assert_eq!(arp.target_hw.without_flags(), peer.lla.without_flags());
    healthy(&mut nodes, 10);
}

/// RFC 4391 §9.2 / C2 (malformed ARP): hardware type 1 (Ethernet), hardware length 6,
/// protocol IPv6, operation 3, truncated, and an ARP claiming A's own address are dropped
/// and counted; none is answered (the first reply the peer gets is the one to the good
/// request after them), A learns nothing from them, and C still reaches A.
#[test]
fn malformed_arp_is_dropped_and_counted() {
    let (mut nodes, mut peer, _d) = setup(22, 0x8022, 2048);
    let a = nodes[0].link().local_addr();
    let good = peer.arp(ArpOp::Request, peer.lla, ip4(2), ip4(1));
    let mut bad = Vec::new();
    for (off, val) in [(4, vec![0, 1]), (8, vec![6]), (6, vec![0x86, 0xdd]), (10, vec![0, 3])] {
        let mut b = peer.arp(ArpOp::Request, peer.lla, ip4(9), ip4(1));
        b[off..off + val.len()].copy_from_slice(&val);
        bad.push(b);
    }
    bad.push(good[..4 + 30].to_vec());
    let spoof = peer.arp(ArpOp::Request, peer.lla, ip4(1), ip4(1));
    for b in bad.iter().chain([&spoof]) {
        peer.send_ud(a, b);
    }
    peer.send_ud(a, &good);
    let reply = peer.recv_ud(&mut nodes);
    let arp = ArpPacket::parse(&reply[4..]).unwrap();
    assert_eq!(
        (arp.op, arp.target_ip),
        (ArpOp::Reply, ip4(2)),
        "the good request's reply first"
    );
    let c = nodes[0].link().counters();
    assert_eq!((c.malformed_arp, c.spoofed_arp_nd), (5, 1), "{c:?}");
    let now = nodes[0].now();
    assert!(nodes[0].link().neighbours(now).iter().all(|n| n.ip != ip4(9)));
    healthy(&mut nodes, 10);
}

/// RFC 4391 §9.3, RFC 4861 §7.1 / C2 (malformed ND): Neighbor Solicitations for A's
/// link-local with an IPoIB source option of length 1 or 4 (only 3 is an IPoIB address),
/// hop limit 254, a bad checksum, truncated, and one whose source option is a multicast
/// LLA, are dropped and counted, none answered; the good NS after them gets the NA with
/// A's LLA in its target option.
#[test]
fn malformed_nd_is_dropped_and_counted() {
    let (mut nodes, mut peer, _d) = setup(23, 0x8023, 2048);
    let a = nodes[0].link().local_addr();
    let target = nodes[0].link().link_local();
    let src = mgid::link_local(&peer.lla.gid);
    let ns = |lla: &LinkAddr| nd::build_solicit(src, nd::solicited_node(target), target, lla);
    let good = ns(&peer.lla);
    let mut bad = Vec::new();
    let mut b = good.clone();
    b[65] = 1; // option length 1 (8 octets): not an IPoIB address
    fix_icmpv6_checksum(&mut b);
    bad.push(b);
    let mut b = good.clone();
    b[65] = 4; // option length 4 (32 octets)
    b.extend_from_slice(&[0; 8]);
    b[5] += 8;
    fix_icmpv6_checksum(&mut b);
    bad.push(b);
    let mut b = good.clone();
    b[7] = 254; // hop limit: not from the link
    bad.push(b);
    let mut b = good.clone();
    b[43] ^= 0x55; // checksum
    bad.push(b);
    bad.push(good[..70].to_vec()); // shorter than its payload length
    for b in &bad {
        peer.send_ud(a, &EncapHeader::encapsulate(EtherType::Ipv6, b));
    }
    let mcast = ns(&LinkAddr::multicast(mgid::Mgid::broadcast(0x8023, 2).0));
    peer.send_ud(a, &EncapHeader::encapsulate(EtherType::Ipv6, &mcast));
    peer.send_ud(a, &EncapHeader::encapsulate(EtherType::Ipv6, &good));
    let reply = peer.recv_ud(&mut nodes);
    let (h, body) = EncapHeader::parse(&reply).unwrap();
    assert_eq!(h.ether_type, EtherType::Ipv6);
    match nd::parse(body).unwrap() {
        Some((
            ip6,
            nd::NdMessage::Advert {
                target: t, target_lla, ..
            },
        )) => {
            assert_eq!((t, ip6.dst), (target, src));
            assert_eq!(target_lla.map(|l| (l.flags, l.qpn)), Some((0x80, a.qpn)));
        }
        other => panic!("expected the NA to the good NS first, got {other:?}"),
    }
    let c = nodes[0].link().counters();
    assert_eq!(c.malformed_nd + c.malformed_ip, 5, "{c:?}");
    assert_eq!(c.spoofed_arp_nd, 1, "{c:?}");
    healthy(&mut nodes, 10);
}

/// IPCM-8 (every REJ carries the sender's UD QPN in private data) and IPCM-12 (the link
/// MTU must carry IPv6's 1,280): a REQ whose Receive MTU is 1,283 gets REJ 28 (Consumer
/// Reject) with A's private data {0, A's UD QPN, 65,524}; 1,284 (IP MTU 1,280) is the
/// smallest accepted, and that connection carries 1,280-octet packets.
#[test]
fn ipcm8_ipcm12_receive_mtu_below_ipv6_minimum_gets_rej28_with_private_data() {
    let (mut nodes, mut peer, _d) = setup(24, 0x8024, 2048);
    peer.introduce(&mut nodes);
    let qpn = nodes[0].link().local_addr().qpn;
    let (code, pdata) = rej_code(peer.connect(&mut nodes, sid(qpn), pd(peer.lla.qpn, 1283)));
    assert_eq!(code, Some(28));
    let p = CmPrivateData::parse(&pdata).unwrap();
    assert_eq!(
        (p.ud_qpn, p.recv_mtu),
        (qpn, 65524),
        "IPCM-8: A's UD QPN and Receive MTU"
    );
    assert_eq!(pdata[0], 0, "IPCM-17: reserved octet 0");
    assert_eq!(nodes[0].rc_connections(), 0);
    peer.connect(&mut nodes, sid(qpn), pd(peer.lla.qpn, 1284))
        .expect("1,284 accepted");
    run_until(&mut nodes, |n, _| common::established(&n[0]) == 1);
    let now = nodes[0].now();
    assert_eq!(nodes[0].link().connections(now)[0].mtu, 1280);
    assert_eq!(nodes[0].link().mtu_to(now, ip4(2).into()), Some(1280));
    let p = v4(ip4(1), ip4(2), 1280, 3);
    nodes[0].from_kernel(p.clone()).unwrap();
    assert_eq!(&peer.recv_rc(&mut nodes)[4..], &p[..]);
    assert_eq!(nodes[0].link().counters().req_rejected, 1);
    healthy(&mut nodes, 10);
}

/// IPCM-10 (service ID: Type 0, Reserved 0, QPN = the UD QPN from address resolution): a
/// REQ to another QPN, with Type 1, with a non-zero Reserved octet, or to a
/// datagram-only node's service ID gets REJ 8 (invalid service ID); the RFC-figure prefix
/// 0x01 with A's QPN is accepted as Linux's 0x10 (E-16).
#[test]
fn ipcm10_wrong_service_id_gets_rej8() {
    let (mut nodes, mut peer, _d) = setup(25, 0x8025, 2048);
    let dd = dev_mtu("127.117.25.4", 2048);
    nodes.push(node(&dd, Mode::Datagram, 0x8025, 4));
    peer.introduce(&mut nodes);
    let a = nodes[0].link().local_addr();
    let d = nodes[2].link().local_addr();
    let good = pd(peer.lla.qpn, 65524);
    for (gid, s, why) in [
        (a.gid, sid(a.qpn ^ 1), "another QPN"),
        (a.gid, sid(a.qpn) | 1 << 48, "Type 1"),
        (a.gid, sid(a.qpn) | 1 << 32, "Reserved non-zero"),
        (d.gid, sid(d.qpn), "datagram-only node"),
    ] {
        let (code, _) = rej_code(peer.connect_to(&mut nodes, Gid(gid), s, good.clone()));
        assert_eq!(code, Some(8), "{why}");
    }
    assert_eq!(nodes[0].rc_connections(), 0);
    let rfc = ServiceId::new(ServiceIdPrefix::Rfc, a.qpn).value();
    peer.connect(&mut nodes, rfc, good).expect("0x01 prefix accepted");
    run_until(&mut nodes, |n, _| common::established(&n[0]) == 1);
    healthy(&mut nodes, 10);
}

/// IPCM-14 (private data = Reserved(1) / UD QPN(3) / Receive MTU(4), reserved ignored on
/// receive): a non-zero reserved octet is accepted; private data too short to hold the
/// format (4 octets: the CM pads with zeros, the Receive MTU reads 0) and none at all get
/// REJ 28 with A's private data.
#[test]
fn ipcm14_private_data_format() {
    let (mut nodes, mut peer, _d) = setup(26, 0x8026, 2048);
    peer.introduce(&mut nodes);
    let qpn = nodes[0].link().local_addr().qpn;
    for short in [pd(peer.lla.qpn, 65524)[..4].to_vec(), Vec::new()] {
        let (code, pdata) = rej_code(peer.connect(&mut nodes, sid(qpn), short));
        assert_eq!(code, Some(28));
        assert_eq!(CmPrivateData::parse(&pdata).unwrap().ud_qpn, qpn);
    }
    let mut odd = pd(peer.lla.qpn, 65524);
    odd[0] = 0xa5;
    peer.connect(&mut nodes, sid(qpn), odd).expect("reserved octet ignored");
    run_until(&mut nodes, |n, _| common::established(&n[0]) == 1);
    let now = nodes[0].now();
    let c = &nodes[0].link().connections(now)[0];
    assert_eq!((c.peer.qpn, c.mtu), (peer.lla.qpn, 65520));
    assert_eq!(nodes[0].link().counters().req_rejected, 2);
    healthy(&mut nodes, 10);
}

/// IPCM-13 (the requester's Receive MTU in the REQ; both use min − 4): the peer asks with
/// 4,096, so A sends it at most 4,092-octet IP packets on that connection — 4,092 arrives
/// as one 4,096-octet RC message, 4,093 with DF gets ICMP "fragmentation needed" 4,092
/// back into A's kernel.
#[test]
fn ipcm13_smaller_receive_mtu_in_req_is_used_by_both() {
    let (mut nodes, mut peer, _d) = setup(27, 0x8027, 4096);
    peer.introduce(&mut nodes);
    let qpn = nodes[0].link().local_addr().qpn;
    peer.connect(&mut nodes, sid(qpn), pd(peer.lla.qpn, 4096)).unwrap();
    let rep = CmPrivateData::parse(&peer.rc.as_ref().unwrap().qp.conn_info().peer_private_data).unwrap();
    assert_eq!((rep.ud_qpn, rep.recv_mtu), (qpn, 65524), "A's REP private data");
    run_until(&mut nodes, |n, _| common::established(&n[0]) == 1);
    let p = v4(ip4(1), ip4(2), 4092, 1);
    nodes[0].from_kernel(p.clone()).unwrap();
    let m = peer.recv_rc(&mut nodes);
    assert_eq!((m.len(), &m[4..]), (4096, &p[..]));
    nodes[0].from_kernel(v4(ip4(1), ip4(2), 4093, 2)).unwrap();
    let got = peer.a_gets(&mut nodes);
    assert_eq!(&got[0][20..22], &[3, 4], "ICMP fragmentation needed");
    assert_eq!(u16::from_be_bytes([got[0][26], got[0][27]]), 4092);
    healthy(&mut nodes, 10);
}

/// IPCM-12/13 on the active side (a REP with a Receive MTU below the minimum): A connects
/// to the scripted peer, which answers REP with Receive MTU 1,000. A refuses the
/// connection — the verbs connect has already sent the RTU when the REP's private data
/// reaches the machine, so the refusal is a DREQ right after it (documented in
/// docs/ipoib.md; the peer sees Established, then Disconnected) — counts it, keeps no
/// connection, and reaches the peer over UD instead (IPCM-S7 back-off).
#[test]
fn rep_with_receive_mtu_below_minimum_is_refused() {
    let (mut nodes, mut peer, _d) = setup(28, 0x8028, 2048);
    peer.introduce(&mut nodes);
    let listener = peer.dev.listen_ib_service(sid(peer.lla.qpn)).unwrap();
    let big = v4(ip4(1), ip4(2), 3000, 1);
    nodes[0].from_kernel(big).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let req = loop {
        if let Ok(r) = listener.get_request(Some(Duration::ZERO)) {
            break r;
        }
        peer.pump(&mut nodes);
        assert!(Instant::now() < end, "no REQ from A");
    };
    let reqpd = CmPrivateData::parse(req.private_data()).unwrap();
    assert_eq!(
        (reqpd.ud_qpn, reqpd.recv_mtu),
        (nodes[0].link().local_addr().qpn, 65524)
    );
    let rc = peer.new_rc();
    let param = ConnParam {
        private_data: pd(peer.lla.qpn, 1000),
        ..Default::default()
    };
    req.accept_qp(&rc.qp, &param).unwrap();
    let mut events = Vec::new();
    while !events.contains(&CmEvent::Disconnected) {
        if let Some(e) = rc.qp.get_event(Some(Duration::ZERO)) {
            events.push(e);
        }
        peer.pump(&mut nodes);
        assert!(Instant::now() < end, "A did not refuse the REP: {events:?}");
    }
    assert_eq!(events, vec![CmEvent::Established, CmEvent::Disconnected]);
    assert_eq!(nodes[0].link().counters().rep_refused, 1);
    run_until(&mut nodes, |n, _| n[0].rc_connections() == 0);
    let now = nodes[0].now();
    assert_eq!(nodes[0].link().mtu_to(now, ip4(2).into()), Some(2044), "back to UD");
    let small = v4(ip4(1), ip4(2), 500, 2);
    nodes[0].from_kernel(small.clone()).unwrap();
    let mut m = peer.recv_ud(&mut nodes);
    while m[..2] != [0x08, 0x00] || m[4..] != small[..] {
        m = peer.recv_ud(&mut nodes); // the 3,000-octet packet's fate is A's business
    }
    healthy(&mut nodes, 10);
}

/// IPCM-11 (every packet carries the 4-octet header with type 0x0800 / 0x86DD): over UD
/// and over an RC connection, a 2-octet message, an IPv4 packet without the header, a
/// header with type 0x88B5 and an IPv4 packet whose header claims more than was sent are
/// dropped and counted; the good packet sent after them is the only one A's kernel gets,
/// and the connection stays up.
#[test]
fn ipcm11_missing_or_bad_encapsulation_header_is_dropped() {
    let (mut nodes, mut peer, _d) = setup(29, 0x8029, 2048);
    peer.introduce(&mut nodes);
    let a = nodes[0].link().local_addr();
    peer.connect(&mut nodes, sid(a.qpn), pd(peer.lla.qpn, 65524)).unwrap();
    let ip = v4(ip4(2), ip4(1), 600, 1);
    let mut lying = EncapHeader::encapsulate(EtherType::Ipv4, &ip);
    lying.truncate(4 + 300);
    let bad = [
        vec![0x08, 0x00],
        ip.clone(),
        EncapHeader::encapsulate(EtherType::Other(0x88b5), &ip),
        lying,
    ];
    for (k, rc) in [false, true].into_iter().enumerate() {
        for b in &bad {
            if rc {
                peer.send_rc(&mut nodes, b);
            } else {
                peer.send_ud(a, b);
            }
        }
        let good = v4(ip4(2), ip4(1), 700, 10 + k as u16);
        let msg = EncapHeader::encapsulate(EtherType::Ipv4, &good);
        if rc {
            peer.send_rc(&mut nodes, &msg);
        } else {
            peer.send_ud(a, &msg);
        }
        assert_eq!(peer.a_gets(&mut nodes), vec![good], "rc {rc}: only the good packet");
    }
    let c = nodes[0].link().counters();
    assert_eq!((c.bad_encap, c.malformed_ip), (6, 2), "{c:?}");
    assert_eq!(common::established(&nodes[0]), 1, "the connection stays");
    healthy(&mut nodes, 20);
}

/// IPCM-16 (ARP and ND responses only over UD): an ARP request sent on an RC connection
/// is dropped and counted, not answered; a Neighbor Solicitation on the connection (what
/// a Linux peer's NUD probe does) is answered over UD, never on the connection. The
/// peer's UD messages are, in order, the NA and the reply to the good ARP request sent
/// over UD last; nothing comes on the connection. IPCM-15: an IP packet over UD from a
/// peer with an RC connection is delivered.
#[test]
fn ipcm16_arp_nd_on_rc_answered_over_ud_only_ipcm15_ud_unicast_delivered_while_connected() {
    let (mut nodes, mut peer, _d) = setup(30, 0x8030, 2048);
    peer.introduce(&mut nodes);
    let a = nodes[0].link().local_addr();
    peer.connect(&mut nodes, sid(a.qpn), pd(peer.lla.qpn, 65524)).unwrap();
    let arp = peer.arp(ArpOp::Request, peer.lla, ip4(7), ip4(1));
    peer.send_rc(&mut nodes, &arp);
    let target = nodes[0].link().link_local();
    let src = mgid::link_local(&peer.lla.gid);
    let ns = nd::build_solicit(src, nd::solicited_node(target), target, &peer.lla);
    peer.send_rc(&mut nodes, &EncapHeader::encapsulate(EtherType::Ipv6, &ns));
    let good = peer.arp(ArpOp::Request, peer.lla, ip4(2), ip4(1));
    peer.send_ud(a, &good);
    let na = peer.recv_ud(&mut nodes);
    match nd::parse(&na[4..]).unwrap() {
        Some((ip6, nd::NdMessage::Advert { target: t, .. })) => assert_eq!((t, ip6.dst), (target, src)),
        other => panic!("expected the NA over UD first, got {other:?}"),
    }
    let reply = peer.recv_ud(&mut nodes);
    let r = ArpPacket::parse(&reply[4..]).unwrap();
    assert_eq!(
        (r.op, r.target_ip),
        (ArpOp::Reply, ip4(2)),
        "no answer to the ARP over RC"
    );
    assert_eq!(nodes[0].link().counters().arp_nd_on_rc, 2);
    assert!(
        peer.rc.as_ref().unwrap().cq.poll_one().is_none(),
        "nothing on the connection"
    );
    let now = nodes[0].now();
    assert!(nodes[0].link().neighbours(now).iter().all(|n| n.ip != ip4(7)));
    // IPCM-15: unicast IP over UD while the connection exists.
    let p = v4(ip4(2), ip4(1), 800, 4);
    peer.send_ud(a, &EncapHeader::encapsulate(EtherType::Ipv4, &p));
    assert_eq!(peer.a_gets(&mut nodes), vec![p]);
    assert_eq!(common::established(&nodes[0]), 1);
    healthy(&mut nodes, 10);
}

/// Requirements B4.5 (drop what exceeds the connection MTU) with IPCM-13, and the UD MTU:
/// on devices with IB MTU 4,096 (UD MTU still 2,044) a 3,004-octet UD message is dropped;
/// on a connection whose MTU is 4,092 (the peer's REQ said 4,096) a 5,004-octet RC
/// message is dropped while 4,096 passes; the connection stays.
#[test]
fn oversized_messages_over_ud_and_rc_are_dropped() {
    let (mut nodes, mut peer, _d) = setup(31, 0x8031, 4096);
    peer.introduce(&mut nodes);
    let a = nodes[0].link().local_addr();
    let big = v4(ip4(2), ip4(1), 3000, 1);
    peer.send_ud(a, &EncapHeader::encapsulate(EtherType::Ipv4, &big));
    let ok = v4(ip4(2), ip4(1), 2044, 2);
    peer.send_ud(a, &EncapHeader::encapsulate(EtherType::Ipv4, &ok));
    assert_eq!(peer.a_gets(&mut nodes), vec![ok], "UD: 3,000 dropped, 2,044 delivered");
    peer.connect(&mut nodes, sid(a.qpn), pd(peer.lla.qpn, 4096)).unwrap();
    let big = v4(ip4(2), ip4(1), 5000, 3);
    peer.send_rc(&mut nodes, &EncapHeader::encapsulate(EtherType::Ipv4, &big));
    let ok = v4(ip4(2), ip4(1), 4092, 4);
    peer.send_rc(&mut nodes, &EncapHeader::encapsulate(EtherType::Ipv4, &ok));
    assert_eq!(peer.a_gets(&mut nodes), vec![ok], "RC: 5,000 dropped, 4,092 delivered");
    let c: LinkCounters = nodes[0].link().counters();
    assert_eq!(c.oversize, 2, "{c:?}");
    assert_eq!(common::established(&nodes[0]), 1);
    healthy(&mut nodes, 10);
}
