//! tshark decodes a capture of our UD traffic (issue 14 "what must hold": "tshark decodes UD,
//! SIDR and multicast traffic without malformed frames"; C2/D3 of
//! ../shared/requirements/smcr-ipoibcm.md, IBA vol. 1 §9.8 and annex A17).
//!
//! tcpdump captures `lo` (filtered to this test's 127.138.0.0/16) while UD QPs of two
//! devices send unicast Sends with and without immediate data, of several sizes, and a
//! multicast Send to 239.138.0.1 (QPN 0xFFFFFF); every captured frame's ICRC is verified
//! over the headers it was captured with, and tshark must decode each one as InfiniBand
//! with a DETH, no malformed frame and no expert error. Skips with a message without
//! tcpdump/tshark or the right to capture.

use std::time::Duration;

use roce::wire::icrc;
use testsupport::{BAD, Capture, ROCE_RING, capture_dir, have_tshark_and_tcpdump, ipv4_udp, tshark_count};
use verbs::*;

const T: Duration = Duration::from_secs(20);
const QKEY: u32 = 0x0101_0101;

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(addr: &str) -> Side {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("name", format!("rxe_{addr}"));
    let dev = roce::RoceFactory.open(&opts).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let qp = pd.create_qp(QpInit::new(QpType::Ud, &cq)).unwrap();
    qp.modify_qp(&QpAttr::init_ud(1, 0, QKEY)).unwrap();
    qp.modify_qp(&QpAttr::state(QpState::Rtr)).unwrap();
    qp.modify_qp(&QpAttr {
        sq_psn: Some(0xff_fffc),
        ..QpAttr::state(QpState::Rts)
    })
    .unwrap();
    let mr = pd.reg_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
    mr.fill(0, 1 << 16, 0xc3).unwrap();
    Side { dev, pd, cq, qp, mr }
}

fn ok(cq: &CompletionQueue) -> WorkCompletion {
    let wc = cq.wait(Some(T)).expect("completion");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    wc
}

/// UD traffic between two devices; returns how many packets they sent.
fn traffic() -> u64 {
    let a = side("127.138.0.1");
    let b = side("127.138.0.2");
    let g = Gid::from_ip("239.138.0.1".parse().unwrap());
    b.qp.attach_mcast(&g, 0).unwrap();
    let recvs: Vec<RecvWr> = (0..16)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: vec![b.mr.sge(i as usize * 2048, 2048)],
        })
        .collect();
    b.qp.post_recv(&recvs).unwrap();
    let to = |gid: Gid, qpn: u32| UdDest {
        ah: a.pd.create_ah(&AhAttr::to_gid(gid)).unwrap(),
        remote_qpn: qpn,
        remote_qkey: QKEY,
    };
    let uni = to(b.dev.query_gid(1, 0).unwrap(), b.qp.qp_num());
    let mut n = 0;
    for (i, len) in [0u32, 1, 3, 64, 1000, 1024].into_iter().enumerate() {
        let op = if i % 2 == 0 {
            WrOpcode::Send
        } else {
            WrOpcode::SendWithImm { imm_data: i as u32 }
        };
        a.qp.post_send_one(SendWr::new(i as u64, op, vec![a.mr.sge(0, len)]).ud(uni.clone()))
            .unwrap();
        n += 1;
    }
    a.qp.post_send_one(SendWr::new(9, WrOpcode::Send, vec![a.mr.sge(0, 100)]).ud(to(g, 0xff_ffff)))
        .unwrap();
    n += 1;
    for _ in 0..n {
        ok(&a.cq);
        ok(&b.cq);
    }
    std::thread::sleep(Duration::from_millis(50));
    let sent = |d: &Device| d.hw_counter("sent_pkts").unwrap();
    sent(&a.dev) + sent(&b.dev)
}

#[test]
fn tshark_decodes_ud_and_multicast_traffic_c2_d3() {
    if !have_tshark_and_tcpdump() {
        return;
    }
    let dir = capture_dir("tshark-ud");
    let file = dir.join("ud.pcap");
    let Some(dump) = Capture::start(&file, &ROCE_RING, "udp port 4791 and net 127.138.0.0/16", T) else {
        return;
    };
    let sent = traffic() as usize;
    dump.wait_for(sent, Duration::from_secs(5));
    dump.stop();
    let captured = testsupport::frames_of(&file);
    // The multicast datagram may be seen twice on lo (sent, and looped back).
    assert!(captured.len() >= sent, "captured {} of {sent} packets", captured.len());
    for (i, f) in captured.iter().enumerate() {
        let (ip, udp, payload) = ipv4_udp(f, i + 1);
        icrc::verify(&ip, &udp, &payload).unwrap_or_else(|e| panic!("frame {}: ICRC {e:?}", i + 1));
    }
    let frames = captured.len();
    let tshark = |extra: &[&str], filter: &str| tshark_count(&file, extra, filter);
    assert_eq!(
        tshark(&[], "infiniband.deth"),
        frames,
        "every frame decodes as RoCEv2 UD with a DETH"
    );
    // tshark's Mellanox EoIB heuristic for UD payloads throws on payloads of 0 or 1 octets
    // (valid UD Sends) and marks them malformed: those are the only ones allowed, and with
    // that heuristic off nothing is malformed.
    let bad = BAD;
    assert_eq!(tshark(&[], &format!("({bad}) && udp.length >= 42")), 0);
    assert_eq!(tshark(&["--disable-heuristic", "mellanox_eoib"], bad), 0);
    assert_eq!(
        tshark(&[], "infiniband.bth.opcode == 100"),
        tshark(&[], "infiniband.bth.opcode == 100 && infiniband.deth")
    );
    assert!(
        tshark(&[], "infiniband.bth.opcode == 101") >= 3,
        "SEND ONLY with immediate (0x65)"
    );
    assert!(
        tshark(&[], "infiniband.bth.destqp == 0xffffff && ip.dst == 239.138.0.1") >= 1,
        "the multicast Send"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
