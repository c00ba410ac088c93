//! tshark decodes a live capture of an SMC-R connection between two `SmcStream`s on our
//! RoCEv2 devices (issue 15 "what must hold": "tshark decodes our CLC and CDC frames without
//! malformed frames"): the CLC Proposal/Accept/Confirm on the TCP connection and every CDC
//! (a 44-octet RC SEND ONLY) as SMC-R, with the field values our machine sent.
//!
//! tcpdump captures `lo` filtered to this test's 127.115.7.0/24. Skips with a message without
//! tcpdump/tshark or the right to capture. Requirements: A1.9 (CDC), A1.4/A1.5 (CLC), D2.

use smc::{Mode, SmcConfig, SmcListener, SmcStream};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::thread;
use std::time::Duration;
use testsupport::{BAD, Capture, capture_dir, have_tshark_and_tcpdump, tshark_count, tshark_lines};
use verbs::{DeviceFactory, DeviceOptions};

fn traffic() {
    // One datagram per packet (`gso=off`): a capture on loopback shows a GSO train as one
    // frame, and tshark decodes only its first packet, so an LLC or CDC that went out in a
    // train behind another packet was missing from the decode (CI, session 11).
    let dev = |a: &str| {
        let opts = DeviceOptions::new()
            .with("addr", a)
            .with("gso", "off")
            .with("name", format!("smc_{a}"));
        roce::RoceFactory.open(&opts).unwrap()
    };
    let (da, db) = (dev("127.115.7.1"), dev("127.115.7.2"));
    let cfg = SmcConfig {
        prefix_len: 8,
        rmbe_len: 16 * 1024,
        ..SmcConfig::default()
    };
    let listener = SmcListener::bind_with("127.115.7.1:0", &da, cfg.clone()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        assert_eq!(s.mode(), Mode::SmcR);
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        s.write_all(&got[..1000]).unwrap();
        got.len()
    });
    let mut c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
    assert_eq!(c.mode(), Mode::SmcR);
    c.write_all(&vec![7u8; 100_000]).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 1000);
    assert_eq!(server.join().unwrap(), 100_000);
    drop(c);
    // Let both progress threads finish the close (C both ways).
    thread::sleep(Duration::from_millis(500));
}

#[test]
fn tshark_decodes_our_clc_and_cdc_frames() {
    if !have_tshark_and_tcpdump() {
        return;
    }
    let dir = capture_dir("tshark-smc");
    let file = dir.join("smc.pcap");
    // This capture keeps its own ring: whole frames (`-s 0`) in a 64 MiB buffer.
    let ring = ["-s", "0", "-B", "65536"];
    let filter = "net 127.115.7.0/24 and (tcp or udp port 4791)";
    let Some(dump) = Capture::start(&file, &ring, filter, Duration::from_secs(20)) else {
        return;
    };
    traffic();
    thread::sleep(Duration::from_millis(500));
    drop(dump);
    let tshark = |filter: &str, fields: &[&str]| tshark_lines(&file, &[], filter, fields);
    // CLC: Proposal, Accept, Confirm decoded as SMC on the TCP connection.
    let clc = tshark("smc.clc_msg", &[]);
    assert!(clc.len() >= 3, "CLC frames: {clc:?}");
    for what in ["Proposal", "Accept", "Confirm"] {
        assert!(clc.iter().any(|l| l.contains(what)), "no CLC {what} in {clc:?}");
    }
    // CONFIRM LINK request (server) and reply (client), v1 LLC, on the new QP.
    let cl = tshark(
        "smc.confirm.link.sender.qp.number",
        &["smc.confirm.link.response", "smc.confirm.link.flags"],
    );
    assert_eq!(cl.len(), 2, "CONFIRM LINK frames: {cl:?}");
    // Every other 44-octet RC SEND ONLY (UDP length 8 + BTH 12 + 44 + ICRC 4) is an SMC-R CDC.
    let sends = tshark("infiniband.bth.opcode == 4 && udp.length == 68", &[]).len();
    let cdcs = tshark(
        "smc.rmbe.ctrl.seqno",
        &["smc.rmbe.ctrl.seqno", "smc.rmbe.ctrl.peer.closed.conn"],
    );
    assert!(cdcs.len() >= 4, "CDCs: {cdcs:?}");
    assert_eq!(
        cdcs.len() + cl.len(),
        sends,
        "every 44-octet SEND decodes as SMC-R CDC or LLC"
    );
    // Both sides closed: a CDC with C from each.
    let closed = cdcs
        .iter()
        .filter(|l| l.ends_with("\t1") || l.ends_with("\tTrue"))
        .count();
    assert!(closed >= 2, "close CDCs: {cdcs:?}");
    // Nothing malformed, no expert error (tshark's RPC-over-RDMA heuristic off: it claims
    // payload-less SENDs, see roce's tshark_live).
    let bad = tshark_count(&file, &["--disable-protocol", "rpcordma"], BAD);
    assert_eq!(bad, 0, "malformed frames");
    let _ = std::fs::remove_dir_all(&dir);
}
