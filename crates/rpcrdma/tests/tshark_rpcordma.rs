//! tshark decodes a capture of our RPC-over-RDMA traffic as `rpcordma` with the field values we
//! sent and no malformed frames (issue 5 "What must hold"; requirements B.1, RPCR-HDR-*,
//! RPCR-WRC-01, RPCR-RDC-01, RPCR-LNG-01/04). The Requester and Responder talk over real
//! loopback iWARP through a recording TCP relay; the recorded byte stream (MPA handshake with
//! RFC 8797 private data, FPDUs) is written as a pcap with synthetic Ethernet/IPv4/TCP headers
//! (the iwarp tests' `common/pcap.rs`, shared by path) and decoded by tshark. Skips with a message
//! when tshark is not installed (`scripts/test.sh` installs it).

#[allow(dead_code)]
#[path = "../../iwarp/tests/common/pcap.rs"]
mod pcap;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};

use pcap::{Conversation, Dir, Endpoint, Pcap};
use rpcrdma::demo;
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};

type Log = Arc<Mutex<Vec<(Dir, Vec<u8>)>>>;

/// Accept one connection on a fresh port and relay it to `to`, logging both directions.
fn relay(to: SocketAddr, log: Log) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (c, _) = l.accept().unwrap();
        let s = TcpStream::connect(to).unwrap();
        c.set_nodelay(true).unwrap();
        s.set_nodelay(true).unwrap();
        let pump = |mut from: TcpStream, mut to: TcpStream, dir: Dir, log: Log| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 32 << 10];
                loop {
                    let n = match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    // record before forwarding, so the log is in causal order
                    log.lock().unwrap().push((dir, buf[..n].to_vec()));
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            })
        };
        let a = pump(c.try_clone().unwrap(), s.try_clone().unwrap(), Dir::C2S, log.clone());
        let b = pump(s, c, Dir::S2C, log);
        let _ = a.join();
        let _ = b.join();
    });
    addr
}

fn tshark() -> bool {
    Command::new("tshark")
        .arg("-v")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn tshark_decodes_our_rpc_over_rdma() {
    if !tshark() {
        eprintln!("SKIPPED tshark_decodes_our_rpc_over_rdma: tshark is not installed");
        return;
    }
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = RdmaServer::spawn(
        &dev,
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(demo::registry()),
        RdmaConfig::default(),
    )
    .unwrap();
    let log: Log = Arc::default();
    let via = relay(srv.local_addr(), log.clone());
    {
        let c = RdmaClient::connect(&dev.alloc_pd().unwrap(), via, RdmaConfig::default()).unwrap();
        demo::null(&c).unwrap(); // short call, short reply
        assert_eq!(demo::read(&c, 100_001, 3).unwrap(), demo::pattern(100_001, 3)); // write list
        let d = demo::pattern(70_003, 9);
        assert_eq!(demo::write(&c, &d).unwrap(), (70_003, demo::checksum(&d))); // read chunk
        let w: Vec<u32> = (0..3000).collect();
        let back = demo::words(&c, &w).unwrap(); // long call, long reply
        assert_eq!(back.len(), 3000);
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    // the pcap: one TCP conversation, segments of at most 16 KiB as they were read
    let mut pcap = Pcap::new();
    let ep = |last: u8, port: u16| Endpoint {
        mac: [2, 0, 0, 0, 0, last],
        ip: Ipv4Addr::new(10, 0, 0, last),
        port,
    };
    let mut conv = Conversation::open(&mut pcap, ep(1, 40000), ep(2, 20049), 1000, 5000);
    for (dir, bytes) in log.lock().unwrap().iter() {
        for seg in bytes.chunks(16 << 10) {
            conv.send(&mut pcap, *dir, seg);
        }
    }
    conv.close(&mut pcap);
    let path = std::env::temp_dir().join(format!("rpcrdma-tshark-{}.pcap", std::process::id()));
    std::fs::write(&path, pcap.into_bytes()).unwrap();
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args([
            "-o",
            "tcp.check_checksum:TRUE",
            "-Y",
            "rpcordma",
            "-T",
            "fields",
            "-E",
            "separator=;",
        ])
        .args([
            "-e",
            "rpcordma.xid",
            "-e",
            "rpcordma.version",
            "-e",
            "rpcordma.flow_control",
        ])
        .args([
            "-e",
            "rpcordma.msg_type",
            "-e",
            "rpcordma.reads_count",
            "-e",
            "rpcordma.writes_count",
        ])
        .args([
            "-e",
            "rpcordma.reply_count",
            "-e",
            "rpcordma.position",
            "-e",
            "rpcordma.rdma_length",
        ])
        .args(["-e", "iwarp_rdma.opcode"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(';').collect()).collect();
    // 4 calls and 4 replies, all version 1; calls ask for 32 credits
    assert_eq!(rows.len(), 8, "{text}");
    assert!(rows.iter().all(|r| r[1] == "1"));
    // (replies grant 32 too: the Responder's default largest grant)
    assert!(rows.iter().all(|r| r[2] == "32"), "{text}");
    // READ: a write list of one chunk of 100001 bytes (the reply's returned length too)
    assert!(
        rows.iter().any(|r| r[3] == "0" && r[5] == "1" && r[8] == "100001"),
        "{text}"
    );
    // WRITE: one read chunk at Position 48 (40-byte call header with AUTH_NONE + tag + length)
    assert!(
        rows.iter()
            .any(|r| r[3] == "0" && r[4] == "1" && r[7] == "48" && r[8] == "70003"),
        "{text}"
    );
    // WORDS: a Long Call (RDMA_NOMSG, Position-Zero read chunk) and a Long Reply (RDMA_NOMSG, reply chunk)
    assert!(rows.iter().any(|r| r[3] == "1" && r[4] == "1" && r[7] == "0"), "{text}");
    assert!(rows.iter().any(|r| r[3] == "1" && r[6] == "1"), "{text}");
    // no malformed frame, no error-level expert item
    let exp = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args(["-q", "-z", "expert,error"])
        .output()
        .unwrap();
    let exp = String::from_utf8_lossy(&exp.stdout);
    assert!(!exp.contains("Malformed") && !exp.contains("Errors ("), "{exp}");
    // the RFC 8797 private data is in both MPA frames
    let pd = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args([
            "-Y",
            "iwarp_mpa.req || iwarp_mpa.rep",
            "-T",
            "fields",
            "-e",
            "iwarp_mpa.privatedata",
        ])
        .output()
        .unwrap();
    let pd = String::from_utf8_lossy(&pd.stdout);
    assert_eq!(pd.lines().filter(|l| l.contains("f6ab0e18")).count(), 2, "{pd}");
    let _ = std::fs::remove_file(&path);
}
