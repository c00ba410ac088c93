//! UD queue pairs and multicast on our RoCEv2 provider: devices on loopback addresses
//! (127.77.14x.y, unique to this file) and, as root, in two network namespaces joined by a
//! veth pair ([`netns`]). Requirements: ../shared/requirements/smcr-ipoibcm.md
//! C2 (UD receive buffers start with the 40-octet GRH; multicast groups, QPN 0xFFFFFF) and
//! D3 (UD over RoCEv2 with DETH; broadcast/multicast over UDP 4791); IBA vol. 1 §9.8 (UD), §10.2.5
//! (Q_Key; unconfirmed); multicast datagrams carry destination QPN 0xFFFFFF.

use std::time::{Duration, Instant};

use verbs::*;

const T: Duration = Duration::from_secs(20);
const QKEY: u32 = 0x1111_1111;

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(addr: &str) -> Side {
    // MTU 1024 (the receive slots are 2 KiB), not loopback's default 4096.
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("mtu", "1024")
        .with("name", format!("rxe_ud_{addr}"));
    let dev = roce::RoceFactory.open(&opts).expect("open a RoCEv2 device");
    ud_side(dev)
}

fn ud_side(dev: Device) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8192).unwrap();
    let mut init = QpInit::new(QpType::Ud, &cq);
    init.cap.max_send_wr = 2048;
    init.cap.max_recv_wr = 2048;
    let qp = pd.create_qp(init).unwrap();
    qp.modify_qp(&QpAttr::init_ud(1, 0, QKEY)).unwrap();
    qp.modify_qp(&QpAttr::state(QpState::Rtr)).unwrap();
    qp.modify_qp(&QpAttr {
        sq_psn: Some(0x1234),
        ..QpAttr::state(QpState::Rts)
    })
    .unwrap();
    let mr = pd.reg_mr(4 << 20, Access::LOCAL_WRITE).unwrap();
    Side { dev, pd, cq, qp, mr }
}

/// Receive slot `i` of 2 KiB.
const SLOT: u64 = 2048;

fn post_recv(s: &Side, i: u64) {
    s.qp.post_recv(&[RecvWr {
        wr_id: i,
        sg_list: vec![Sge {
            addr: s.mr.addr() + i * SLOT,
            length: SLOT as u32,
            lkey: s.mr.lkey(),
        }],
    }])
    .unwrap();
}

/// Sends `len` octets from send slot offset 2 MiB + `off`.
fn send_wr(s: &Side, wr_id: u64, off: u64, len: u32, to: UdDest) -> SendWr {
    SendWr::new(
        wr_id,
        WrOpcode::Send,
        vec![Sge {
            addr: s.mr.addr() + (2 << 20) + off,
            length: len,
            lkey: s.mr.lkey(),
        }],
    )
    .ud(to)
}

fn dest(s: &Side, to: &Side, qkey: u32) -> UdDest {
    UdDest {
        ah: s
            .pd
            .create_ah(&AhAttr::to_gid(to.dev.query_gid(1, 0).unwrap()))
            .unwrap(),
        remote_qpn: to.qp.qp_num(),
        remote_qkey: qkey,
    }
}

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait(Some(T)).expect("completion within timeout")
}

fn counter(d: &Device, name: &str) -> u64 {
    d.hw_counters()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("counter {name}"))
        .value
}

/// Waits until `f` holds (counters are updated by the receiving thread).
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + T;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// C2/D3: a UD ping-pong; the pong goes back through an AH made from the ping's GRH
/// (`ibv_create_ah_from_wc`) to the WC's source QPN.
#[test]
fn unicast_ping_pong_with_ah_from_wc() {
    let a = side("127.77.140.1");
    let b = side("127.77.140.2");
    for i in 0..16 {
        post_recv(&a, i);
        post_recv(&b, i);
    }
    for round in 0..10u64 {
        a.mr.write((2 << 20) as usize, &round.to_be_bytes()).unwrap();
        a.qp.post_send(&[send_wr(&a, 100 + round, 0, 8, dest(&a, &b, QKEY))])
            .unwrap();
        let s = wait(&a.cq);
        assert_eq!(
            (s.status, s.opcode, s.wr_id),
            (WcStatus::Success, WcOpcode::Send, 100 + round)
        );
        let r = wait(&b.cq);
        assert_eq!(r.status, WcStatus::Success);
        assert_eq!(r.opcode, WcOpcode::Recv);
        assert_eq!(r.byte_len, 40 + 8);
        assert_eq!(r.src_qp, a.qp.qp_num());
        assert!(r.wc_flags.contains(WcFlags::GRH));
        let mut got = [0u8; 48];
        b.mr.read((r.wr_id * SLOT) as usize, &mut got).unwrap();
        assert_eq!(&got[40..], &round.to_be_bytes());
        post_recv(&b, r.wr_id);
        // Pong.
        let ah = b.pd.create_ah_from_wc(&r, &got[..40], 1).unwrap();
        assert_eq!(ah.attr().dgid, a.dev.query_gid(1, 0).unwrap());
        b.mr.write((2 << 20) as usize, &(!round).to_be_bytes()).unwrap();
        let to = UdDest {
            ah,
            remote_qpn: r.src_qp,
            remote_qkey: 0x8000_0000, // the sending QP's own Q_Key (IBA vol. 1 §10.2.5 (unconfirmed))
        };
        b.qp.post_send(&[send_wr(&b, 200 + round, 0, 8, to)]).unwrap();
        assert_eq!(wait(&b.cq).opcode, WcOpcode::Send);
        let r = wait(&a.cq);
        assert_eq!((r.status, r.src_qp, r.byte_len), (WcStatus::Success, b.qp.qp_num(), 48));
        let mut got = [0u8; 8];
        a.mr.read((r.wr_id * SLOT + 40) as usize, &mut got).unwrap();
        assert_eq!(got, (!round).to_be_bytes());
        post_recv(&a, r.wr_id);
    }
}

/// C2: one datagram of every size 0..=MTU (1,025 datagrams), contents checked, with
/// immediate data carrying the size; the sender waits for each window of 64 to arrive.
#[test]
fn every_size_up_to_mtu_with_contents() {
    let a = side("127.77.141.1");
    let b = side("127.77.141.2");
    let mtu = b.dev.query_port(1).unwrap().active_mtu.bytes();
    let pattern: Vec<u8> = (0..2048u32).map(|i| (i * 7 + 3) as u8).collect();
    a.mr.write(2 << 20, &pattern).unwrap();
    let to = dest(&a, &b, QKEY);
    let sizes: Vec<u32> = (0..=mtu).collect();
    assert!(sizes.len() >= 1000);
    for chunk in sizes.chunks(64) {
        for (i, _) in chunk.iter().enumerate() {
            post_recv(&b, i as u64);
        }
        let wrs: Vec<SendWr> = chunk
            .iter()
            .map(|&len| {
                let mut w = send_wr(&a, u64::from(len), u64::from(len % 13), len, to.clone());
                w.opcode = WrOpcode::SendWithImm { imm_data: len };
                w
            })
            .collect();
        a.qp.post_send(&wrs).unwrap();
        for _ in chunk {
            assert_eq!(wait(&a.cq).status, WcStatus::Success);
        }
        for _ in chunk {
            let r = wait(&b.cq);
            assert_eq!(r.status, WcStatus::Success);
            let len = r.imm_data.expect("immediate data");
            assert!(r.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
            assert_eq!(r.byte_len, 40 + len);
            let mut got = vec![0u8; len as usize];
            b.mr.read((r.wr_id * SLOT + 40) as usize, &mut got).unwrap();
            let off = (len % 13) as usize;
            assert_eq!(got, &pattern[off..off + len as usize], "datagram of {len} octets");
        }
    }
    assert_eq!(counter(&b.dev, "ud_rcvd_pkts"), sizes.len() as u64);
}

/// C2: the GRH area is rxe's: 20 zero octets, then the IPv4 header of the datagram (version
/// 4, UDP, our addresses, total length = 20 + 8 + the RoCEv2 packet, good checksum).
#[test]
fn grh_is_ipv4_header_after_20_zero_octets() {
    let a = side("127.77.142.1");
    let b = side("127.77.142.2");
    post_recv(&b, 0);
    a.qp.post_send(&[send_wr(&a, 1, 0, 100, dest(&a, &b, QKEY))]).unwrap();
    wait(&a.cq);
    let r = wait(&b.cq);
    let mut g = [0u8; 40];
    b.mr.read(0, &mut g).unwrap();
    assert_eq!(&g[..20], &[0u8; 20]);
    let ip = &g[20..];
    assert_eq!(ip[0], 0x45);
    assert_eq!(ip[9], 17);
    // BTH 12 + DETH 8 + 100 payload + ICRC 4, in UDP (8) in IPv4 (20).
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + 8 + 12 + 8 + 100 + 4);
    assert_eq!(&ip[12..16], &[127, 77, 142, 1]);
    assert_eq!(&ip[16..20], &[127, 77, 142, 2]);
    let p = Grh::parse(&g).expect("a GRH rdma-core reads as IPv4");
    assert!(p.ipv4);
    assert_eq!(p.sgid, a.dev.query_gid(1, 0).unwrap());
    assert_eq!(p.dgid, b.dev.query_gid(1, 0).unwrap());
    assert_eq!(r.byte_len, 140);
}

/// Issue 14 (address handles from GID, port, traffic class and hop limit), C2: the AH's
/// hop limit and traffic class become the IPv4 TTL and TOS of its packets, as rxe's
/// `prepare_ipv4_hdr` makes them; the receiver shows the real header's values in the GRH
/// area (off loopback from its raw socket's header, on loopback from the UDP socket's
/// `IP_TTL`/`IP_TOS` control messages). Two AHs to one QP in one `post_send` keep their own values. Needs CAP_NET_RAW
/// for the receiver's raw socket (skips with a message without it).
#[test]
fn ah_hop_limit_and_traffic_class_are_the_ip_ttl_and_tos() {
    let a = side("127.77.143.1");
    let opts = DeviceOptions::new()
        .with("addr", "127.77.143.2")
        .with("name", "rxe_ud_ttl_b")
        .with("icrc_rx", "raw");
    let Ok(dev) = roce::RoceFactory.open(&opts) else {
        eprintln!("skipped: no raw socket here (CAP_NET_RAW) to read the real IP header");
        return;
    };
    let b = ud_side(dev);
    let ah = |hop_limit, traffic_class| {
        a.pd.create_ah(&AhAttr {
            hop_limit,
            traffic_class,
            ..AhAttr::to_gid(b.dev.query_gid(1, 0).unwrap())
        })
        .unwrap()
    };
    let to = |ah| UdDest {
        ah,
        remote_qpn: b.qp.qp_num(),
        remote_qkey: QKEY,
    };
    post_recv(&b, 0);
    post_recv(&b, 1);
    post_recv(&b, 2);
    a.qp.post_send(&[
        send_wr(&a, 1, 0, 10, to(ah(9, 0x28))),
        send_wr(&a, 2, 0, 10, to(ah(200, 0xb8))),
        send_wr(&a, 3, 0, 10, to(ah(64, 0))),
    ])
    .unwrap();
    for _ in 0..3 {
        assert_eq!(wait(&a.cq).status, WcStatus::Success);
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = wait(&b.cq);
        assert_eq!(r.status, WcStatus::Success);
        let mut g = [0u8; 40];
        b.mr.read((r.wr_id * SLOT) as usize, &mut g).unwrap();
        let p = Grh::parse(&g).expect("a GRH rdma-core reads as IPv4");
        seen.push((p.hop_limit, p.traffic_class, g[20 + 8], g[20 + 1]));
    }
    seen.sort();
    assert_eq!(seen, [(9, 0x28, 9, 0x28), (64, 0, 64, 0), (200, 0xb8, 200, 0xb8)]);
}

/// IBA vol. 1 §10.2.5 (unconfirmed) / issue 14: a datagram with the wrong Q_Key is dropped and counted; one to a
/// QP with no receive posted is dropped and counted; neither consumes anything or
/// errors the QP.
#[test]
fn qkey_mismatch_and_rq_empty_drops_counted() {
    let a = side("127.77.143.1");
    let b = side("127.77.143.2");
    a.qp.post_send(&[send_wr(&a, 1, 0, 10, dest(&a, &b, QKEY))]).unwrap();
    wait(&a.cq);
    assert!(eventually(|| counter(&b.dev, "ud_rq_empty_dropped") == 1));
    post_recv(&b, 0);
    a.qp.post_send(&[send_wr(&a, 2, 0, 10, dest(&a, &b, 0x4444_4444))])
        .unwrap();
    wait(&a.cq);
    assert!(eventually(|| counter(&b.dev, "ud_qkey_dropped") == 1));
    assert!(b.cq.poll_one().is_none(), "nothing delivered");
    assert_eq!(b.qp.state(), QpState::Rts);
    // The receive is still there for a good one.
    a.qp.post_send(&[send_wr(&a, 3, 0, 10, dest(&a, &b, QKEY))]).unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    assert_eq!(counter(&b.dev, "ud_rcvd_pkts"), 1);
}

/// Issue 14: a payload longer than the path MTU is refused at post time, typed.
#[test]
fn oversize_refused_at_post_time() {
    let a = side("127.77.144.1");
    let b = side("127.77.144.2");
    let mtu = a.dev.query_port(1).unwrap().active_mtu.bytes();
    let ok = send_wr(&a, 1, 0, mtu, dest(&a, &b, QKEY));
    let big = send_wr(&a, 2, 0, mtu + 1, dest(&a, &b, QKEY));
    match a.qp.post_send(&[ok, big]) {
        Err(Error::BadWr {
            index: 1,
            error: WrError::TooLong { len, max },
        }) => assert_eq!((len, max), (u64::from(mtu) + 1, u64::from(mtu))),
        r => panic!("expected TooLong for WR 1, got {r:?}"),
    }
    assert_eq!(wait(&a.cq).wr_id, 1, "the WR before the refused one was posted");
    assert_eq!(a.qp.state(), QpState::Rts);
}

/// C2/D3: three QPs attached to a group on two devices each get each
/// datagram once; a detached QP gets none; the group is left when its last QP detaches.
/// The sender is a third device, not attached.
#[test]
fn multicast_three_members_one_detached() {
    let g = Gid::from_ip("239.77.145.1".parse().unwrap());
    let d1 = side("127.77.145.1");
    let d2 = side("127.77.145.2");
    let snd = side("127.77.145.3");
    // A second QP on device 1, and one on device 2 that attaches and then detaches.
    let extra = ud_side(d1.dev.clone());
    let gone = ud_side(d2.dev.clone());
    for s in [&d1, &d2, &extra, &gone] {
        s.qp.attach_mcast(&g, 0).unwrap();
        for i in 0..32 {
            post_recv(s, i);
        }
    }
    gone.qp.detach_mcast(&g, 0).unwrap();
    assert!(gone.qp.detach_mcast(&g, 0).is_err(), "not attached any more");
    assert_eq!(counter(&d1.dev, "mcast_groups"), 1);
    let to = UdDest {
        ah: snd.pd.create_ah(&AhAttr::to_gid(g)).unwrap(),
        remote_qpn: 0xff_ffff,
        remote_qkey: QKEY,
    };
    for n in 0..20u32 {
        snd.mr.write(2 << 20, &n.to_be_bytes()).unwrap();
        snd.qp
            .post_send(&[send_wr(&snd, u64::from(n), 0, 4, to.clone())])
            .unwrap();
        wait(&snd.cq);
        for s in [&d1, &d2, &extra] {
            let r = wait(&s.cq);
            assert_eq!(r.status, WcStatus::Success);
            assert_eq!(r.src_qp, snd.qp.qp_num());
            let mut got = [0u8; 44];
            s.mr.read((r.wr_id * SLOT) as usize, &mut got).unwrap();
            assert_eq!(&got[40..], &n.to_be_bytes(), "datagram {n} once, in order");
            let grh = Grh::parse(&got[..40]).unwrap();
            assert_eq!(grh.dgid, g, "the GRH names the group");
            post_recv(s, r.wr_id);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    for s in [&d1, &d2, &extra, &gone] {
        assert!(s.cq.poll_one().is_none(), "no duplicates, nothing for the detached QP");
    }
    // Detach every QP of device 2: the device leaves the group.
    d2.qp.detach_mcast(&g, 0).unwrap();
    assert_eq!(counter(&d2.dev, "mcast_groups"), 0);
    assert_eq!(counter(&d1.dev, "mcast_groups"), 1);
}

/// A multicast sender's own attached QPs get its datagrams (IP_MULTICAST_LOOP; rxe without
/// IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK does the same), once.
#[test]
fn multicast_loops_back_to_the_senders_own_qps() {
    let g = Gid::from_ip("239.77.146.1".parse().unwrap());
    let a = side("127.77.146.1");
    a.qp.attach_mcast(&g, 0).unwrap();
    post_recv(&a, 0);
    post_recv(&a, 1);
    let to = UdDest {
        ah: a.pd.create_ah(&AhAttr::to_gid(g)).unwrap(),
        remote_qpn: 0xff_ffff,
        remote_qkey: QKEY,
    };
    a.qp.post_send(&[send_wr(&a, 9, 0, 4, to)]).unwrap();
    let mut got = [wait(&a.cq), wait(&a.cq)];
    got.sort_by_key(|w| w.opcode == WcOpcode::Recv);
    assert_eq!(got[0].opcode, WcOpcode::Send);
    assert_eq!((got[1].opcode, got[1].src_qp), (WcOpcode::Recv, a.qp.qp_num()));
    std::thread::sleep(Duration::from_millis(50));
    assert!(a.cq.poll_one().is_none());
}

/// Multicast on a non-UD QP or with a unicast GID is refused.
#[test]
fn mcast_argument_checks() {
    let a = side("127.77.147.1");
    let rc = a.pd.create_qp(QpInit::new(QpType::Rc, &a.cq)).unwrap();
    let g = Gid::from_ip("239.77.147.1".parse().unwrap());
    assert!(rc.attach_mcast(&g, 0).is_err());
    assert!(a.qp.attach_mcast(&a.dev.query_gid(1, 0).unwrap(), 0).is_err());
    // IPoIB's broadcast MGID on an IPv4 device maps to an administratively scoped group.
    let bcast = Gid("ff12:401b:ffff::ffff:ffff"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets());
    let ip = roce::engine::mcast_ip("127.0.0.1".parse().unwrap(), bcast).unwrap();
    assert!(matches!(ip, std::net::IpAddr::V4(v) if v.octets()[0] == 239));
    a.qp.attach_mcast(&bcast, 0).unwrap();
    a.qp.detach_mcast(&bcast, 0).unwrap();
}

/// Two network namespaces joined by a veth pair, each with RoCEv2 devices on its end
/// (10.77.14.0/24, names `s8udA`/`s8udB`, unique to this file). Needs root (`ip netns`);
/// skips with the reason otherwise.
mod netns {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::process::Command;

    const NS_A: &str = "s8udA";
    const NS_B: &str = "s8udB";

    fn ip(args: &[&str]) -> bool {
        Command::new("ip").args(args).status().is_ok_and(|s| s.success())
    }

    /// Two namespaces joined by a veth pair (`<a>v`/`<b>v`) with these addresses; deleted on
    /// drop.
    struct Lab([&'static str; 2]);

    impl Lab {
        fn up(ns: [&'static str; 2], addrs_a: &[&str], addrs_b: &[&str]) -> Option<Lab> {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                eprintln!("skipped: the two-namespace UD tests need root (ip netns, veth)");
                return None;
            }
            for n in ns {
                let _ = Command::new("ip")
                    .args(["netns", "del", n])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
            let (va, vb) = (format!("{}v", ns[0]), format!("{}v", ns[1]));
            let mut ok = ip(&["netns", "add", ns[0]])
                && ip(&["netns", "add", ns[1]])
                && ip(&[
                    "link", "add", &va, "netns", ns[0], "type", "veth", "peer", "name", &vb, "netns", ns[1],
                ]);
            for (n, dev, addrs) in [(ns[0], &va, addrs_a), (ns[1], &vb, addrs_b)] {
                for a in addrs {
                    // IPv6 addresses without duplicate address detection, usable at once.
                    let nodad: &[&str] = if a.contains(':') { &["nodad"] } else { &[] };
                    ok = ok && ip(&[&["-n", n, "addr", "add", a, "dev", dev][..], nodad].concat());
                }
                ok = ok && ip(&["-n", n, "link", "set", dev, "up"]) && ip(&["-n", n, "link", "set", "lo", "up"]);
            }
            let lab = Lab(ns);
            if !ok {
                eprintln!("skipped: could not create the namespaces and veth pair");
                return None;
            }
            Some(lab)
        }
    }

    impl Drop for Lab {
        fn drop(&mut self) {
            for n in self.0 {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
        }
    }

    /// Opens a device on `addr` inside namespace `ns` (its sockets live there; the verbs
    /// calls work from any thread).
    fn side_in(ns: &str, addr: &str) -> Side {
        let path = format!("/var/run/netns/{ns}");
        let addr = addr.to_string();
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).expect("namespace file");
            // SAFETY: `f` is an open namespace file; setns changes only this thread's
            // network namespace, and the thread ends after opening the device.
            let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            // veth takes a moment to come up (DAD is IPv6 only; IPv4 binds at once).
            side(&addr)
        })
        .join()
        .unwrap()
    }

    /// Issue 14 "what must hold": ping-pong, every size up to the MTU and multicast to
    /// three member QPs in two namespaces (one more detached), over a veth pair. One test
    /// so the namespaces are made once.
    #[test]
    fn two_namespaces_unicast_sizes_and_multicast() {
        let Some(_lab) = Lab::up([NS_A, NS_B], &["10.77.14.1/24"], &["10.77.14.2/24", "10.77.14.3/24"]) else {
            return;
        };
        let a = side_in(NS_A, "10.77.14.1");
        let b = side_in(NS_B, "10.77.14.2");
        let b2 = side_in(NS_B, "10.77.14.3");

        // Unicast: every size 0..=MTU from A to B, and each echoed back with an AH from
        // the WC (sizes, contents, source QPN and GRH checked).
        let mtu = b.dev.query_port(1).unwrap().active_mtu.bytes();
        let pattern: Vec<u8> = (0..2048u32).map(|i| (i * 5 + 1) as u8).collect();
        a.mr.write(2 << 20, &pattern).unwrap();
        for i in 0..64 {
            post_recv(&a, i);
            post_recv(&b, i);
        }
        let to_b = dest(&a, &b, QKEY);
        for len in 0..=mtu {
            let mut w = send_wr(&a, u64::from(len), 0, len, to_b.clone());
            w.opcode = WrOpcode::SendWithImm { imm_data: len };
            a.qp.post_send(&[w]).unwrap();
            assert_eq!(wait(&a.cq).status, WcStatus::Success);
            let r = wait(&b.cq);
            assert_eq!(
                (r.status, r.imm_data, r.src_qp),
                (WcStatus::Success, Some(len), a.qp.qp_num())
            );
            let mut got = vec![0u8; 40 + len as usize];
            b.mr.read((r.wr_id * SLOT) as usize, &mut got).unwrap();
            assert_eq!(&got[40..], &pattern[..len as usize], "size {len}");
            let grh = Grh::parse(&got[..40]).unwrap();
            assert_eq!(grh.sgid, a.dev.query_gid(1, 0).unwrap());
            post_recv(&b, r.wr_id);
            if len % 97 == 0 {
                // Echo back from B to A through an AH made from the GRH.
                let ah = b.pd.create_ah_from_wc(&r, &got[..40], 1).unwrap();
                b.mr.write(2 << 20, &len.to_be_bytes()).unwrap();
                let back = UdDest {
                    ah,
                    remote_qpn: r.src_qp,
                    remote_qkey: QKEY,
                };
                b.qp.post_send(&[send_wr(&b, 1, 0, 4, back)]).unwrap();
                assert_eq!(wait(&b.cq).opcode, WcOpcode::Send);
                let e = wait(&a.cq);
                let mut got = [0u8; 4];
                a.mr.read((e.wr_id * SLOT + 40) as usize, &mut got).unwrap();
                assert_eq!(u32::from_be_bytes(got), len);
                post_recv(&a, e.wr_id);
            }
        }

        // Multicast: members a (namespace A, also the sender's device), b and b2
        // (namespace B); a fourth QP on b attaches and detaches.
        let g = Gid::from_ip("239.77.14.1".parse().unwrap());
        let gone = ud_side(b.dev.clone());
        let sender = ud_side(a.dev.clone());
        for s in [&a, &b, &b2, &gone] {
            s.qp.attach_mcast(&g, 0).unwrap();
        }
        for i in 0..64 {
            post_recv(&b2, i);
            post_recv(&gone, i);
        }
        gone.qp.detach_mcast(&g, 0).unwrap();
        // IGMP joins over veth need no router; give the reports a moment anyway.
        std::thread::sleep(Duration::from_millis(100));
        let to = UdDest {
            ah: sender.pd.create_ah(&AhAttr::to_gid(g)).unwrap(),
            remote_qpn: 0xff_ffff,
            remote_qkey: QKEY,
        };
        for n in 0..50u32 {
            sender.mr.write(2 << 20, &n.to_be_bytes()).unwrap();
            sender
                .qp
                .post_send(&[send_wr(&sender, u64::from(n), 0, 4, to.clone())])
                .unwrap();
            assert_eq!(wait(&sender.cq).status, WcStatus::Success);
            for s in [&a, &b, &b2] {
                let r = wait(&s.cq);
                assert_eq!((r.status, r.src_qp), (WcStatus::Success, sender.qp.qp_num()));
                let mut got = [0u8; 44];
                s.mr.read((r.wr_id * SLOT) as usize, &mut got).unwrap();
                assert_eq!(&got[40..], &n.to_be_bytes(), "datagram {n} once, in order");
                assert_eq!(Grh::parse(&got[..40]).unwrap().dgid, g);
                post_recv(s, r.wr_id);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        for s in [&a, &b, &b2, &gone, &sender] {
            assert!(s.cq.poll_one().is_none(), "no duplicates; nothing for the detached QP");
        }
    }

    /// D3 on an IPv6 underlay: IPv6 devices in two namespaces; unicast ping-pong (the GRH is
    /// the IPv6 header) and multicast to IPoIB's broadcast MGID `ff12:401b:ffff::ffff:ffff`,
    /// which is an IPv6 link-local multicast address used as is.
    #[test]
    fn two_namespaces_ipv6_unicast_and_ipoib_broadcast_group() {
        let Some(_lab) = Lab::up(["s8ud6A", "s8ud6B"], &["fd77:14::1/64"], &["fd77:14::2/64"]) else {
            return;
        };
        let a = side_in("s8ud6A", "fd77:14::1");
        let b = side_in("s8ud6B", "fd77:14::2");
        assert_eq!(
            b.dev.query_gid(1, 0).unwrap(),
            Gid::from_ip("fd77:14::2".parse().unwrap())
        );
        for i in 0..8 {
            post_recv(&a, i);
            post_recv(&b, i);
        }
        a.mr.write(2 << 20, b"ping").unwrap();
        a.qp.post_send(&[send_wr(&a, 1, 0, 4, dest(&a, &b, QKEY))]).unwrap();
        wait(&a.cq);
        let r = wait(&b.cq);
        assert_eq!((r.status, r.byte_len, r.src_qp), (WcStatus::Success, 44, a.qp.qp_num()));
        let mut got = [0u8; 44];
        b.mr.read((r.wr_id * SLOT) as usize, &mut got).unwrap();
        assert_eq!(got[0] >> 4, 6, "an IPv6 header");
        assert_eq!(&got[40..], b"ping");
        let grh = Grh::parse(&got[..40]).unwrap();
        assert!(!grh.ipv4);
        assert_eq!(grh.sgid, a.dev.query_gid(1, 0).unwrap());
        assert_eq!(grh.dgid, b.dev.query_gid(1, 0).unwrap());
        let ah = b.pd.create_ah_from_wc(&r, &got[..40], 1).unwrap();
        b.mr.write(2 << 20, b"pong").unwrap();
        let back = UdDest {
            ah,
            remote_qpn: r.src_qp,
            remote_qkey: QKEY,
        };
        b.qp.post_send(&[send_wr(&b, 2, 0, 4, back)]).unwrap();
        wait(&b.cq);
        let e = wait(&a.cq);
        assert_eq!((e.status, e.src_qp), (WcStatus::Success, b.qp.qp_num()));
        post_recv(&b, r.wr_id);
        post_recv(&a, e.wr_id);

        let bcast = Gid("ff12:401b:ffff::ffff:ffff"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets());
        b.qp.attach_mcast(&bcast, 0).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let to = UdDest {
            ah: a.pd.create_ah(&AhAttr::to_gid(bcast)).unwrap(),
            remote_qpn: 0xff_ffff,
            remote_qkey: QKEY,
        };
        for n in 0..10u32 {
            a.mr.write(2 << 20, &n.to_be_bytes()).unwrap();
            a.qp.post_send(&[send_wr(&a, 10 + u64::from(n), 0, 4, to.clone())])
                .unwrap();
            wait(&a.cq);
            let r = wait(&b.cq);
            assert_eq!((r.status, r.src_qp), (WcStatus::Success, a.qp.qp_num()));
            let mut got = [0u8; 44];
            b.mr.read((r.wr_id * SLOT) as usize, &mut got).unwrap();
            assert_eq!(&got[40..], &n.to_be_bytes());
            assert_eq!(Grh::parse(&got[..40]).unwrap().dgid, bcast);
            post_recv(&b, r.wr_id);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(b.cq.poll_one().is_none() && a.cq.poll_one().is_none());
    }
}
