//! Golden vectors: every frame of the lab capture `testdata/host-br0-roce-cm.pcap` (a copy of
//! `shared/lab/results/host-br0-roce-cm.pcap`: Linux 6.1 rxe in the lab VM talking to the
//! host's `roce_probe.py`, captured on br0; see the lab README "RoCEv2 from the host").
//!
//! For each frame: `Packet::parse` accepts it, `emit` gives the same octets back, the ICRC
//! verifies (rxe's frames and the probe's), and the ICRC we compute for our own emission is
//! the one on the wire; except frame 17, the probe's deliberately bad ICRC, which we reject
//! as rxe did. Requirements: smcr-ipoibcm.md C3 (RoCEv2 over UDP 4791, BTH, RETH,
//! AETH, DETH, RC opcodes, ICRC), C1 (CM MADs on QP1 with Q_Key 0x80010000).

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use pcap_file::pcap::PcapReader;
use roce::wire::icrc::{self, IcrcError};
use roce::wire::{Aeth, Bth, ExtHeaders, GSI_QKEY, Opcode, Packet, Psn, ROCEV2_UDP_PORT, Reth, Syndrome};

const CAPTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/host-br0-roce-cm.pcap");

/// One captured RoCEv2 frame: (frame number, IPv4 header, UDP header, UDP payload).
struct Frame {
    no: usize,
    ip: Vec<u8>,
    udp: Vec<u8>,
    payload: Vec<u8>,
    src_port: u16,
    dst_port: u16,
}

fn frames() -> Vec<Frame> {
    let file = std::fs::File::open(CAPTURE).expect("the capture is in testdata/");
    let mut r = PcapReader::new(file).unwrap();
    let mut out = Vec::new();
    let mut no = 0;
    while let Some(p) = r.next_packet() {
        no += 1;
        let p = p.unwrap();
        let s = SlicedPacket::from_ethernet(&p.data).unwrap();
        let Some(NetSlice::Ipv4(ip)) = &s.net else {
            panic!("frame {no}: not IPv4")
        };
        let Some(TransportSlice::Udp(udp)) = &s.transport else {
            panic!("frame {no}: not UDP")
        };
        out.push(Frame {
            no,
            ip: ip.header().slice().to_vec(),
            udp: udp.header_slice().to_vec(),
            payload: udp.payload().to_vec(),
            src_port: udp.source_port(),
            dst_port: udp.destination_port(),
        });
    }
    out
}

fn parse(f: &Frame) -> Packet<'_> {
    Packet::parse(&f.payload).unwrap_or_else(|e| panic!("frame {}: {e}", f.no))
}

#[test]
fn every_frame_parses_and_re_emits_byte_for_byte_c3() {
    let frames = frames();
    assert_eq!(frames.len(), 19);
    for f in &frames {
        assert_eq!(f.dst_port, ROCEV2_UDP_PORT, "frame {}", f.no);
        let p = parse(f);
        assert_eq!(p.buffer_len(), f.payload.len(), "frame {}", f.no);
        let mut out = vec![0xa5; f.payload.len()];
        assert_eq!(p.emit(&mut out), Ok(f.payload.len()));
        assert_eq!(out, f.payload, "frame {} re-emits to other octets", f.no);
    }
    let ops: Vec<u8> = frames.iter().map(|f| parse(f).bth.opcode.0).collect();
    // 1-8 CM (REQ REP RTU DREQ DREP REQ REP RTU), 9 SEND ONLY, 10 ACK, 11 READ REQUEST,
    // 12 READ RESPONSE ONLY, 13 SEND ONLY, 14 ACK, 15-19 CM (DREQ DREP REQ REQ REJ).
    assert_eq!(
        ops,
        [
            0x64, 0x64, 0x64, 0x64, 0x64, 0x64, 0x64, 0x64, 0x04, 0x11, 0x0c, 0x10, 0x04, 0x11, 0x64, 0x64, 0x64, 0x64,
            0x64
        ]
    );
}

/// Frame 17 is prove.sh's `roce_probe.py --bad-icrc` REQ: its ICRC has every bit flipped,
/// and rxe did not answer it (frame 18 is the next REQ).
const BAD_ICRC_FRAME: usize = 17;

#[test]
fn icrc_verifies_on_rxe_and_probe_frames_and_ours_is_equal_c3() {
    for f in &frames() {
        if f.no == BAD_ICRC_FRAME {
            let stored = icrc::stored(&f.payload).unwrap();
            assert_eq!(
                icrc::verify(&f.ip, &f.udp, &f.payload),
                Err(IcrcError::Mismatch {
                    stored,
                    computed: !stored
                })
            );
            continue;
        }
        // rxe's packets (from 192.168.77.2) carry a hashed IP ID and UDP checksum 0; the
        // probe's carry ID 0 and a UDP checksum: both verify.
        assert_eq!(icrc::verify(&f.ip, &f.udp, &f.payload), Ok(()), "frame {}", f.no);
        // our emission: the parsed packet with the ICRC cleared, then sealed
        let mut p = parse(f);
        p.icrc = 0;
        let mut out = vec![0; p.buffer_len()];
        p.emit(&mut out).unwrap();
        let icrc = icrc::seal(&f.ip, &f.udp, &mut out).unwrap();
        assert_eq!(out, f.payload, "frame {}: our ICRC {icrc:#010x} differs", f.no);
    }
}

#[test]
fn icrc_covers_the_ipv4_id_and_rejects_corruption_c3() {
    // Lab README: "The IPv4 Identification, flags and fragment offset are not masked";
    // "a wrong ICRC (all bits flipped)" is dropped silently by rxe.
    for f in frames().iter().filter(|f| f.no != BAD_ICRC_FRAME) {
        let mut ip = f.ip.clone();
        ip[4] ^= 0x01; // ID
        assert!(matches!(
            icrc::verify(&ip, &f.udp, &f.payload),
            Err(IcrcError::Mismatch { .. })
        ));
        let mut ip = f.ip.clone();
        ip[8] = 1; // TTL: masked
        ip[1] = 0x02; // TOS/ECN: masked
        assert_eq!(icrc::verify(&ip, &f.udp, &f.payload), Ok(()));
        let mut bad = f.payload.clone();
        let n = bad.len();
        for b in &mut bad[n - 4..] {
            *b ^= 0xff;
        }
        assert!(matches!(
            icrc::verify(&f.ip, &f.udp, &bad),
            Err(IcrcError::Mismatch { .. })
        ));
    }
}

#[test]
fn cm_datagrams_are_ud_send_only_on_qp1_c1() {
    // C1: CM MADs on QP1 (GSI), Q_Key 0x80010000, 256-octet MADs; rxe sets the AckReq bit
    // on its UD MADs and sends from UDP port 0xC000 + hash(QPN 1) = 55410 (lab README).
    for f in frames().iter().filter(|f| f.payload[0] == 0x64) {
        let p = parse(f);
        assert_eq!(p.bth.dest_qp, 1, "frame {}", f.no);
        assert_eq!(p.bth.p_key, 0xffff);
        let deth = p.ext.deth.unwrap();
        assert_eq!((deth.q_key, deth.src_qp), (GSI_QKEY, 1), "frame {}", f.no);
        assert_eq!(p.payload.len(), 256);
        assert_eq!(p.payload[1], 0x07, "MgmtClass CM");
        let from_rxe = f.ip[12..16] == [192, 168, 77, 2];
        assert_eq!(p.bth.ack_req, from_rxe, "frame {}", f.no);
        if from_rxe {
            assert_eq!(f.src_port, 55410);
        }
    }
}

/// The CM message (after BTH 12, DETH 8 and the 24-octet MAD header) of a CM frame.
fn cm_msg(f: &Frame) -> &[u8] {
    &f.payload[12 + 8 + 24..]
}

fn u24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

#[test]
fn rc_exchange_of_the_ping_c3() {
    let fr = frames();
    let by = |no: usize| &fr[no - 1];
    let (req, rep) = (by(6), by(7));
    // the REQ's Starting PSN (CM offset 44) is what rxe sends from; the REP's (offset 20)
    // what rxe expects from us (lab README "PSN direction")
    let req_psn = Psn::new(u24(&cm_msg(req)[44..]));
    let rep_psn = Psn::new(u24(&cm_msg(rep)[20..]));
    let rxe_qpn = u24(&cm_msg(rep)[12..]);
    let our_qpn = u24(&cm_msg(req)[32..]);

    let send = parse(by(9));
    assert_eq!(send.bth.opcode, Opcode::RC_SEND_ONLY);
    assert_eq!((send.bth.dest_qp, send.bth.psn), (rxe_qpn, rep_psn));
    assert!(send.bth.ack_req);
    assert_eq!(send.payload.len(), 16); // struct rping_rdma_info

    let ack = parse(by(10));
    assert_eq!(ack.bth.opcode, Opcode::RC_ACKNOWLEDGE);
    assert_eq!((ack.bth.dest_qp, ack.bth.psn), (our_qpn, rep_psn));
    assert_eq!(
        ack.ext.aeth,
        Some(Aeth {
            syndrome: Syndrome::ACK,
            msn: 1
        })
    );

    let rr = parse(by(11));
    assert_eq!(rr.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!((rr.bth.dest_qp, rr.bth.psn), (our_qpn, req_psn));
    let reth = rr.ext.reth.unwrap();
    // rping's info: big-endian addr, rkey, length of the probe's invented buffer
    let info = send.payload;
    assert_eq!(
        reth,
        Reth {
            va: u64::from_be_bytes(info[0..8].try_into().unwrap()),
            r_key: u32::from_be_bytes(info[8..12].try_into().unwrap()),
            dma_len: u32::from_be_bytes(info[12..16].try_into().unwrap()),
        }
    );

    let resp = parse(by(12));
    assert_eq!(resp.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!((resp.bth.dest_qp, resp.bth.psn), (rxe_qpn, req_psn));
    assert_eq!(resp.payload.len() as u32, reth.dma_len);
    assert_eq!(resp.bth.pad_count, 3);

    let go = parse(by(13));
    assert_eq!((go.bth.opcode, go.bth.psn), (Opcode::RC_SEND_ONLY, req_psn.next()));
    let ack2 = parse(by(14));
    assert_eq!(ack2.bth.psn, req_psn.next());
    assert_eq!(ack2.ext.aeth.unwrap().msn, 2);
}

#[test]
fn built_from_scratch_like_a_udp_socket_sends_c3() {
    // The probe sends as our data path will: an unconnected UDP socket with
    // IP_PMTUDISC_DO, so IPv4 ID 0 and DF (lab README). Building its RDMA READ RESPONSE ONLY
    // (frame 12) from the opcode table, with IP/UDP headers from `icrc::ipv4_header` /
    // `icrc::udp_header` instead of the captured ones, gives the captured octets, ICRC too.
    let f = &frames()[11];
    let want = parse(f);
    let bth = Bth {
        ack_req: false,
        ..Bth::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, want.bth.dest_qp, want.bth.psn)
    };
    let ext = ExtHeaders {
        aeth: Some(Aeth {
            syndrome: Syndrome::ACK,
            msn: 1,
        }),
        ..Default::default()
    };
    let p = Packet::new(bth, ext, want.payload).unwrap();
    let mut out = vec![0; p.buffer_len()];
    p.emit(&mut out).unwrap();
    let ip = icrc::ipv4_header([192, 168, 77, 1], [192, 168, 77, 2], 0, out.len());
    let udp = icrc::udp_header(ROCEV2_UDP_PORT, ROCEV2_UDP_PORT, out.len());
    icrc::seal(&ip, &udp, &mut out).unwrap();
    assert_eq!(out, f.payload);
}
