//! RC over a real (non-loopback) link: two network namespaces joined by a veth pair, one
//! RoCEv2 device in each, as the SMC-R and IPoIB-CM netns tests use them. On loopback a GSO
//! train is one skb end to end; over veth the trains are segmented (or GRO-merged again) and
//! reach the receiver's raw socket as well as its UDP socket, so this path differs from
//! loopback's and has its own test. Needs root (ip netns, veth); skips cleanly without it.
//!
//! Requirements: ../shared/requirements/smcr-ipoibcm.md C3 (RC transport over RoCEv2:
//! path-MTU segmentation FIRST/MIDDLE/LAST, 4-byte ICRC trailer checked on receive, RC
//! reliability); D1 (the transport SMC-R and IPoIB-CM run on). IPoIB-CM's largest Send is
//! 65,520 octets (RFC 4755 §3 with a 4-octet encapsulation header).

use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use verbs::*;

const ADDR_A: &str = "10.77.31.1";
const ADDR_B: &str = "10.77.31.2";

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

/// Two namespaces joined by a veth pair (`s10rc<tag>A`, `s10rc<tag>B`: each test its own);
/// deleted on drop.
struct Lab([String; 2]);

impl Lab {
    fn up(tag: &str, mtu: u32) -> Option<Lab> {
        let ns = [format!("s10rc{tag}A"), format!("s10rc{tag}B")];
        let (ns_a, ns_b) = (ns[0].as_str(), ns[1].as_str());
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: the two-namespace RC tests need root (ip netns, veth)");
            return None;
        }
        for n in &ns {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(std::process::Stdio::null())
                .status();
        }
        let (va, vb) = (format!("{ns_a}v"), format!("{ns_b}v"));
        let mtu = mtu.to_string();
        let mut ok = ip(&["netns", "add", ns_a])
            && ip(&["netns", "add", ns_b])
            && ip(&[
                "link", "add", &va, "netns", ns_a, "type", "veth", "peer", "name", &vb, "netns", ns_b,
            ]);
        for (n, dev, a) in [(ns_a, &va, ADDR_A), (ns_b, &vb, ADDR_B)] {
            ok = ok
                && ip(&["-n", n, "link", "set", dev, "mtu", &mtu])
                && ip(&["-n", n, "addr", "add", &format!("{a}/24"), "dev", dev])
                && ip(&["-n", n, "link", "set", dev, "up"])
                && ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        let lab = Lab(ns.clone());
        if !ok {
            eprintln!("skipped: could not create the namespaces and veth pair");
            return None;
        }
        Some(lab)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

struct End {
    dev: Device,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

const MR: usize = 4 << 20;

/// Opens a device on `addr` inside namespace `ns` with `opts` (its sockets live there).
fn open_in(ns: &str, addr: &str, opts: &[(&str, &str)]) -> End {
    let path = format!("/var/run/netns/{ns}");
    let mut o = DeviceOptions::new()
        .with("addr", addr)
        .with("name", format!("rxe_rcns_{addr}"));
    for (k, v) in opts {
        o = o.with(k, v);
    }
    let dev = std::thread::spawn(move || {
        let f = std::fs::File::open(&path).expect("namespace file");
        // SAFETY: `f` is an open namespace file; setns changes only this thread's network
        // namespace, and the thread ends after opening the device.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        roce::RoceFactory.open(&o).expect("open a RoCEv2 device")
    })
    .join()
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    let qp = pd.create_qp(init).unwrap();
    let mr = pd.reg_mr(MR, Access::all_remote()).unwrap();
    End { dev, cq, qp, mr }
}

fn connect(x: &End, y: &End) {
    let mtu = x.dev.query_port(1).unwrap().active_mtu;
    for (s, p) in [(x, y), (y, x)] {
        s.qp.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
        s.qp.modify_qp(&QpAttr::rtr(RtrAttr {
            ah_attr: AhAttr::to_gid(p.dev.query_gid(1, 0).unwrap()),
            path_mtu: mtu,
            dest_qp_num: p.qp.qp_num(),
            rq_psn: 0x31,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
        }))
        .unwrap();
        // Timeout 14 (67 ms) × 7 retries: a lost packet is retransmitted, but a path that
        // loses packets systematically ends in RETRY_EXC_ERR within seconds.
        s.qp.modify_qp(&QpAttr::rts(RtsAttr {
            sq_psn: 0x31,
            // The IB CM's default (1.07 s). With 14 (67 ms) a responder's progress thread
            // descheduled that long on a loaded 2-core machine (load 19) made the requester
            // retransmit a window without any loss, on main's engine too (1 run in 4).
            timeout: 18,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
        }))
        .unwrap();
    }
}

fn c(d: &Device, name: &str) -> u64 {
    d.hw_counter(name).unwrap_or_else(|| panic!("counter {name}"))
}

fn wait(cq: &CompletionQueue, what: &str) -> WorkCompletion {
    let wc = cq
        .wait(Some(Duration::from_secs(30)))
        .unwrap_or_else(|| panic!("{what}: no completion"));
    assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
    wc
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// Writes of 1 MiB and 64 KiB, Sends of 1 MiB, 64 KiB and 65,520 octets, both directions,
/// every payload checked; no packet may need a retransmission on a lossless veth, and every
/// packet's ICRC verifies.
fn run(x: &End, y: &End) {
    connect(x, y);
    let mut n = 0u32;
    for (s, r) in [(x, y), (y, x)] {
        for len in [1 << 20, 64 << 10, 65_520, 1, 4097] {
            n += 1;
            // RDMA Write into r's MR at offset 0.
            let data = pattern(len, n);
            s.mr.write(0, &data).unwrap();
            s.qp.post_send_one(SendWr::new(
                u64::from(n),
                WrOpcode::RdmaWrite {
                    remote: RemoteAddr {
                        addr: r.mr.addr(),
                        rkey: r.mr.rkey(),
                    },
                },
                vec![s.mr.sge(0, len as u32)],
            ))
            .unwrap();
            wait(&s.cq, &format!("Write {len}"));
            let mut got = vec![0u8; len];
            r.mr.read(0, &mut got).unwrap();
            assert!(got == data, "Write of {len} octets arrived intact");

            // Send into a receive at r's MR offset 2 MiB.
            n += 1;
            let data = pattern(len, n);
            s.mr.write(0, &data).unwrap();
            r.qp.post_recv(&[RecvWr {
                wr_id: u64::from(n),
                sg_list: vec![r.mr.sge(2 << 20, 2 << 20)],
            }])
            .unwrap();
            s.qp.post_send_one(SendWr::new(u64::from(n), WrOpcode::Send, vec![s.mr.sge(0, len as u32)]))
                .unwrap();
            wait(&s.cq, &format!("Send {len}"));
            let wc = wait(&r.cq, &format!("receive of {len}"));
            assert_eq!(wc.byte_len as usize, len);
            let mut got = vec![0u8; len];
            r.mr.read(2 << 20, &mut got).unwrap();
            assert!(got == data, "Send of {len} octets arrived intact");
        }
    }
    for d in [&x.dev, &y.dev] {
        assert_eq!(c(d, "icrc_err"), 0, "every packet's ICRC verified");
        assert_eq!(c(d, "malformed_pkts"), 0);
        assert_eq!(
            c(d, "retransmitted_pkts"),
            0,
            "a lossless veth needs no retransmission (sent {}, received {})",
            c(d, "sent_pkts"),
            c(d, "rcvd_pkts")
        );
    }
}

/// The default device (`icrc_rx=auto`: raw socket as root, `mtu=auto`, `gso=on`) over a
/// 1500-octet veth (path MTU 1024, as rxe's), then over a 9000-octet one (path MTU 4096).
#[test]
fn rc_over_veth_c3() {
    for link_mtu in [1500, 9000] {
        let Some(lab) = Lab::up("d", link_mtu) else { return };
        let x = open_in(&lab.0[0], ADDR_A, &[]);
        let y = open_in(&lab.0[1], ADDR_B, &[]);
        let want = if link_mtu == 1500 { Mtu::Mtu1024 } else { Mtu::Mtu4096 };
        assert_eq!(x.dev.query_port(1).unwrap().active_mtu, want, "link MTU {link_mtu}");
        run(&x, &y);
        let (pkts, dgrams) = (c(&x.dev, "sent_pkts"), c(&x.dev, "tx_datagrams"));
        assert!(
            dgrams * 4 <= pkts,
            "link MTU {link_mtu}: {pkts} packets in {dgrams} datagrams (GSO trains off loopback too)"
        );
    }
}

/// The same with the UDP socket receiving (`icrc_rx=udp`, the path without CAP_NET_RAW).
#[test]
fn rc_over_veth_udp_rx_c3() {
    let Some(lab) = Lab::up("u", 9000) else { return };
    let x = open_in(&lab.0[0], ADDR_A, &[("icrc_rx", "udp")]);
    let y = open_in(&lab.0[1], ADDR_B, &[("icrc_rx", "udp")]);
    run(&x, &y);
}
