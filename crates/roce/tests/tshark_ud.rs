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

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use pcap_file::pcap::PcapReader;
use roce::wire::icrc;
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

/// The frames of a pcap file (a partial last record is not counted).
fn frames_of(file: &std::path::Path) -> Vec<Vec<u8>> {
    let Ok(bytes) = std::fs::read(file) else {
        return Vec::new();
    };
    let Ok(mut r) = PcapReader::new(std::io::Cursor::new(bytes)) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    while let Some(Ok(p)) = r.next_packet() {
        v.push(p.data.into_owned());
    }
    v
}

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn tshark_decodes_ud_and_multicast_traffic_c2_d3() {
    if !have("tshark") || !have("tcpdump") {
        eprintln!("skipped: tshark or tcpdump missing");
        return;
    }
    let dir = std::env::temp_dir().join(format!("softrdma-tshark-ud-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let file = dir.join("ud.pcap");
    let mut dump = Dump(
        Command::new("tcpdump")
            .args([
                "-i",
                "lo",
                "-U",
                "--immediate-mode",
                "-n",
                "-s",
                "8192",
                "-B",
                "32768",
                "-w",
            ])
            .arg(&file)
            .args(["udp port 4791 and net 127.138.0.0/16"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = dump.0.stderr.take().unwrap();
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while !String::from_utf8_lossy(&seen).contains("listening on") {
        let mut b = [0u8; 256];
        let n = std::io::Read::read(&mut err, &mut b).unwrap_or(0);
        if n == 0 || t0.elapsed() > T {
            eprintln!("skipped: tcpdump cannot capture: {}", String::from_utf8_lossy(&seen));
            return;
        }
        seen.extend_from_slice(&b[..n]);
    }
    let sent = traffic() as usize;
    let t0 = Instant::now();
    while frames_of(&file).len() < sent && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(dump);
    let captured = frames_of(&file);
    // The multicast datagram may be seen twice on lo (sent, and looped back).
    assert!(captured.len() >= sent, "captured {} of {sent} packets", captured.len());
    for (i, f) in captured.iter().enumerate() {
        let s = SlicedPacket::from_ethernet(f).expect("Ethernet frame on lo");
        let Some(NetSlice::Ipv4(ip)) = &s.net else {
            panic!("IPv4")
        };
        let Some(TransportSlice::Udp(udp)) = &s.transport else {
            panic!("UDP")
        };
        icrc::verify(ip.header().slice(), udp.header_slice(), udp.payload())
            .unwrap_or_else(|e| panic!("frame {}: ICRC {e:?}", i + 1));
    }
    let frames = captured.len();
    let tshark = |extra: &[&str], filter: &str| -> usize {
        let o = Command::new("tshark")
            .args(extra)
            .arg("-r")
            .arg(&file)
            .args(["-Y", filter])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).lines().count()
    };
    assert_eq!(
        tshark(&[], "infiniband.deth"),
        frames,
        "every frame decodes as RoCEv2 UD with a DETH"
    );
    // tshark's Mellanox EoIB heuristic for UD payloads throws on payloads of 0 or 1 octets
    // (valid UD Sends) and marks them malformed: those are the only ones allowed, and with
    // that heuristic off nothing is malformed.
    let bad = "_ws.malformed || _ws.expert.severity >= error";
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

/// The tcpdump this test started: stopped with SIGINT (so it flushes and closes the file)
/// and reaped when dropped, also when the test fails half-way.
struct Dump(std::process::Child);

impl Drop for Dump {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-INT", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}
