//! tshark decodes the packets our wire layer emits (issue 13 "What must hold": "tshark
//! decodes our traffic (`udp.port == 4791` is RoCEv2 by default) with no malformed frames";
//! requirements smcr-ipoibcm.md C3; peers file §5.1-§5.3).
//!
//! Every opcode of the table is built with `Packet::new` from its row, emitted, sealed with
//! our ICRC, framed in Ethernet/IPv4/UDP to port 4791 (etherparse) and written to a pcap
//! (pcap-file). `tshark -r F -V` must show no `[Malformed` and no expert error, and the
//! `infiniband.*` fields must be the values we set. tshark does not check the ICRC (peers
//! file §5.3.4): the test checks it itself on the frames it wrote. Skips with a message when
//! tshark is not installed (`scripts/test.sh` installs it).

use std::process::Command;

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use pcap_file::pcap::{PcapPacket, PcapWriter};
use roce::wire::headers::{CreditCode, NakCode, RnrTimer};
use roce::wire::opcode::{MessageKind, TABLE};
use roce::wire::segment::segments;
use roce::wire::{
    Aeth, AtomicAckEth, AtomicEth, Bth, Deth, ExtHeaders, Ieth, ImmDt, Opcode, Packet, Psn, Reth, Syndrome, icrc,
};
use verbs::Mtu;

fn tshark() -> bool {
    Command::new("tshark")
        .arg("-v")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

const SRC: [u8; 4] = [10, 0, 0, 1];
const DST: [u8; 4] = [10, 0, 0, 2];

/// Frame one UDP payload in Ethernet/IPv4/UDP 4791 and seal its ICRC over the headers that
/// frame carries.
fn frame(mut payload: Vec<u8>) -> Vec<u8> {
    let build = |p: &[u8]| {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(SRC, DST, 64)
            .udp(0xc000 + 0x1234, roce::wire::ROCEV2_UDP_PORT)
            .write(&mut f, p)
            .unwrap();
        f
    };
    let f = build(&payload);
    let (ip, udp) = headers(&f);
    icrc::seal(&ip, &udp, &mut payload).unwrap();
    let f = build(&payload); // same IP header, UDP checksum now over the sealed payload
    let (ip, udp) = headers(&f);
    assert_eq!(icrc::verify(&ip, &udp, &payload), Ok(()));
    f
}

fn headers(f: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(NetSlice::Ipv4(ip)) = &s.net else {
        panic!("IPv4")
    };
    let Some(TransportSlice::Udp(udp)) = &s.transport else {
        panic!("UDP")
    };
    (ip.header().slice().to_vec(), udp.header_slice().to_vec())
}

fn emit(bth: Bth, ext: ExtHeaders, payload: &[u8]) -> Vec<u8> {
    let p = Packet::new(bth, ext, payload).unwrap();
    let mut b = vec![0; p.buffer_len()];
    p.emit(&mut b).unwrap();
    b
}

/// What we sent, per frame, as tshark prints the fields we check.
struct Expect {
    opcode: u8,
    dest_qp: u32,
    psn: u32,
    padcnt: u8,
    se: bool,
    /// `field=value` pairs, in the order of [`FIELDS`] after the BTH ones (empty: absent).
    ext: [String; 12],
}

const FIELDS: [&str; 17] = [
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.padcnt",
    "infiniband.bth.se",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
];

fn s(v: impl ToString) -> String {
    v.to_string()
}

#[test]
fn tshark_decodes_every_opcode_we_emit_c3() {
    if !tshark() {
        eprintln!("SKIPPED tshark_decodes_every_opcode_we_emit_c3: tshark is not installed");
        return;
    }
    let qp = 0x00_0123;
    let reth = Reth {
        va: 0x7f00_1234_5000,
        r_key: 0xabcd_0001,
        dma_len: 600,
    };
    let data: Vec<u8> = (0..600u32).map(|i| (i * 7 + 1) as u8).collect();
    let mut packets: Vec<(Vec<u8>, Expect)> = Vec::new();
    let mut psn = Psn::new(0xff_fffe); // wraps within the run
    let mut push = |bth: Bth, ext: ExtHeaders, payload: &[u8], ext_fields: [String; 12]| {
        let b = emit(bth, ext, payload);
        let e = Expect {
            opcode: bth.opcode.0,
            dest_qp: bth.dest_qp,
            psn: bth.psn.value(),
            padcnt: roce::wire::segment::pad_count(payload.len()),
            se: bth.se,
            ext: ext_fields,
        };
        packets.push((b, e));
    };
    let none = || std::array::from_fn::<String, 12, _>(|_| String::new());

    // A 600-octet Send with immediate and a 600-octet Write with immediate at MTU 256:
    // FIRST, MIDDLE, LAST (with immediate), from the table and the segmenter.
    for kind in [MessageKind::SendWithImm, MessageKind::RdmaWriteWithImm] {
        for seg in segments(600, Mtu::Mtu256) {
            let op = Opcode::rc_segment(kind, seg.position);
            let info = op.info().unwrap();
            let mut bth = Bth::new(op, qp, psn);
            bth.ack_req = seg.position.ends();
            let mut ext = ExtHeaders::default();
            let mut f = none();
            if info.headers.contains(roce::wire::HeaderSet::RETH) {
                ext.reth = Some(reth);
                (f[0], f[1], f[2]) = (
                    s(format!("{:#018x}", reth.va)),
                    s(format!("{:#010x}", reth.r_key)),
                    s(reth.dma_len),
                );
            }
            if info.immediate() {
                ext.imm_dt = Some(ImmDt { imm: 0x1122_3344 });
                f[7] = s("11223344");
            }
            let payload = &data[seg.offset as usize..(seg.offset + seg.len) as usize];
            push(bth, ext, payload, f);
            psn = psn.next();
        }
    }
    // Every other table row, once.
    for info in TABLE.iter() {
        let op = info.opcode;
        let mut bth = Bth::new(op, qp, psn);
        bth.se = info.request && info.position.ends();
        let mut ext = ExtHeaders::default();
        let mut f = none();
        let mut payload: &[u8] = &[];
        match op {
            Opcode::RC_SEND_ONLY_WITH_INVALIDATE | Opcode::RC_SEND_LAST_WITH_INVALIDATE => {
                ext.ieth = Some(Ieth { r_key: 0x0bad_cafe });
                f[8] = s("0badcafe");
            }
            Opcode::RC_RDMA_WRITE_ONLY | Opcode::RC_RDMA_READ_REQUEST => {
                ext.reth = Some(reth);
                (f[0], f[1], f[2]) = (s("0x00007f0012345000"), s("0xabcd0001"), s(600));
            }
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE => {
                ext.reth = Some(reth);
                ext.imm_dt = Some(ImmDt { imm: 7 });
                (f[0], f[1], f[2], f[7]) = (s("0x00007f0012345000"), s("0xabcd0001"), s(600), s("00000007"));
            }
            Opcode::RC_SEND_ONLY_WITH_IMMEDIATE => {
                ext.imm_dt = Some(ImmDt { imm: 0xdead_beef });
                f[7] = s("deadbeef");
            }
            Opcode::RC_ACKNOWLEDGE => continue, // below: ACK, NAKs, RNR NAK
            Opcode::RC_ATOMIC_ACKNOWLEDGE => {
                ext.aeth = Some(Aeth {
                    syndrome: Syndrome::ACK,
                    msn: 9,
                });
                ext.atomic_ack_eth = Some(AtomicAckEth {
                    orig_rem_dt: 0x0102_0304_0506_0708,
                });
                (f[3], f[4], f[11]) = (s(0x1f), s(9), s(0x0102_0304_0506_0708u64));
            }
            Opcode::RC_COMPARE_SWAP | Opcode::RC_FETCH_ADD => {
                ext.atomic_eth = Some(AtomicEth {
                    va: 0x7f00_0000_0008,
                    r_key: 0x55,
                    swap_add_data: 0x1111_2222_3333_4444,
                    compare_data: 0x5555_6666_7777_8888,
                });
                (f[9], f[10]) = (s(0x1111_2222_3333_4444u64), s(0x5555_6666_7777_8888u64));
                // tshark 4.0 files the AtomicETH's VA and R_Key under the RETH field names
                (f[0], f[1]) = (s("0x00007f0000000008"), s("0x00000055"));
            }
            Opcode::UD_SEND_ONLY | Opcode::UD_SEND_ONLY_WITH_IMMEDIATE => {
                bth.dest_qp = 0x44;
                ext.deth = Some(Deth {
                    q_key: 0x1111_1111,
                    resv8: 0,
                    src_qp: 0x45,
                });
                // tshark 4.0 prints the Q_Key in 16 hex digits
                (f[5], f[6]) = (s("0x0000000011111111"), s("0x00000045"));
                if info.immediate() {
                    ext.imm_dt = Some(ImmDt { imm: 0x0a0b_0c0d });
                    f[7] = s("0a0b0c0d");
                }
                payload = &data[..45];
            }
            _ => {
                if info.headers.contains(roce::wire::HeaderSet::AETH) {
                    ext.aeth = Some(Aeth {
                        syndrome: Syndrome::ACK,
                        msn: 3,
                    });
                    (f[3], f[4]) = (s(0x1f), s(3));
                }
                if info.headers.contains(roce::wire::HeaderSet::RETH) {
                    ext.reth = Some(reth);
                    (f[0], f[1], f[2]) = (s("0x00007f0012345000"), s("0xabcd0001"), s(600));
                }
                if info.immediate() {
                    ext.imm_dt = Some(ImmDt { imm: 0x0102_0304 });
                    f[7] = s("01020304");
                }
            }
        }
        if info.payload && payload.is_empty() {
            payload = &data[..if info.position.ends() { 37 } else { 256 }];
        }
        push(bth, ext, payload, f);
        psn = psn.next();
    }
    // ACK with credits, NAK PSN sequence error, NAK remote access, RNR NAK 1.28 ms
    for (syn, text) in [
        (Syndrome::Ack { credits: CreditCode(5) }, 0x05),
        (Syndrome::Nak(NakCode::PsnSequenceError), 0x60),
        (Syndrome::Nak(NakCode::RemoteAccessError), 0x62),
        (Syndrome::RnrNak { timer: RnrTimer(14) }, 0x2e),
    ] {
        let ext = ExtHeaders {
            aeth: Some(Aeth {
                syndrome: syn,
                msn: 0x12_3456,
            }),
            ..Default::default()
        };
        let mut f = none();
        (f[3], f[4]) = (s(text), s(0x12_3456));
        push(Bth::new(Opcode::RC_ACKNOWLEDGE, qp, psn), ext, &[], f);
    }

    // the pcap
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    for (i, (b, _)) in packets.iter().enumerate() {
        let f = frame(b.clone());
        let ts = std::time::Duration::from_millis(1_700_000_000_000 + i as u64);
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, &f)).unwrap();
    }
    let path = std::env::temp_dir().join(format!("roce-tshark-{}.pcap", std::process::id()));
    std::fs::write(&path, w.into_writer()).unwrap();

    // 1. -V: nothing malformed, no expert error
    let v = Command::new("tshark").arg("-r").arg(&path).arg("-V").output().unwrap();
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    assert!(!text.contains("[Malformed"), "tshark finds a malformed frame:\n{text}");
    assert!(
        !text.contains("Severity level: Error"),
        "tshark reports an error:\n{text}"
    );
    assert_eq!(text.matches("\nInfiniBand\n").count(), packets.len());
    // tshark 4.0 has no CNP (0x81): it shows the opcode as unknown and the 16 reserved
    // octets and the ICRC as vendor data, not as a malformed frame.
    assert!(text.contains("Opcode: Unknown (129)"));

    // 2. the fields we set
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-E", "separator=;", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    let rows = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = rows.lines().collect();
    assert_eq!(rows.len(), packets.len(), "{rows:#?}");
    for (row, (_, e)) in rows.iter().zip(&packets) {
        let got: Vec<&str> = row.split(';').collect();
        let want_bth = [
            e.opcode.to_string(),
            format!("{:#08x}", e.dest_qp),
            e.psn.to_string(),
            e.padcnt.to_string(),
            u8::from(e.se).to_string(),
        ];
        assert_eq!(&got[..5], &want_bth.each_ref().map(String::as_str)[..], "row {row}");
        for (i, want) in e.ext.iter().enumerate() {
            assert_eq!(got[5 + i], want, "field {} of row {row}", FIELDS[5 + i]);
        }
    }
    let _ = std::fs::remove_file(&path);
}
