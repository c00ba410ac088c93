//! SMC-Rv2 between two of our own endpoints (`SmcConfig::ueid`) over two RoCEv2 devices on
//! loopback (addresses 127.119.x.y, unique to this file). A TCP relay between client and
//! server records the CLC octets each way, so the negotiated version is checked on the wire;
//! the RDMA traffic goes device to device (GIDs from the CLC), not through the relay.
//!
//! Requirements: smcr-ipoibcm.md A1.4/A1.5 (v2 Proposal/Accept/Confirm in Linux's form, C5),
//! SMC-CLC-3 (version choice: v2 on a common EID, else v1), A4.2 (first contact: v2 CONFIRM
//! LINK), SMC-SC-1 (subsequent contact in the v2 group).

use sha2::{Digest, Sha256};
use smc::wire::clc::{ClcMessage, frame_len};
use smc::{Mode, SmcConfig, SmcListener, SmcStream};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;
use verbs::Device;

#[path = "common/loopback.rs"]
mod loopback;
use loopback::device;

fn cfg(ueid: Option<&str>) -> SmcConfig {
    SmcConfig {
        ueid: ueid.map(str::to_string),
        linger: Duration::from_millis(300),
        // The client's TCP source towards the relay is 127.0.0.1 (lo's first address): the
        // v1 subnet check (E-4) needs the /8.
        prefix_len: 8,
        ..SmcConfig::default()
    }
}

/// A relay on `at` to `to` for one connection; returns the octets it saw (client→server,
/// server→client).
#[allow(clippy::type_complexity)]
fn relay(at: &str, to: std::net::SocketAddr) -> (std::net::SocketAddr, Arc<Mutex<(Vec<u8>, Vec<u8>)>>) {
    let l = TcpListener::bind(at).unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let s2 = Arc::clone(&seen);
    thread::spawn(move || {
        let (a, _) = l.accept().unwrap();
        let b = TcpStream::connect(to).unwrap();
        let pump = |mut from: TcpStream, mut into: TcpStream, seen: Arc<Mutex<(Vec<u8>, Vec<u8>)>>, up: bool| {
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            {
                                let mut g = seen.lock().unwrap();
                                let v = if up { &mut g.0 } else { &mut g.1 };
                                v.extend_from_slice(&buf[..n]);
                            }
                            if into.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = into.shutdown(Shutdown::Write);
            })
        };
        let t1 = pump(a.try_clone().unwrap(), b.try_clone().unwrap(), Arc::clone(&s2), true);
        let t2 = pump(b, a, s2, false);
        let _ = t1.join();
        let _ = t2.join();
    });
    (addr, seen)
}

fn clc_messages(mut b: &[u8]) -> Vec<ClcMessage> {
    let mut v = Vec::new();
    while let Ok(Some(n)) = frame_len(b) {
        if n > b.len() {
            break;
        }
        v.push(ClcMessage::parse(&b[..n]).expect("CLC"));
        b = &b[n..];
    }
    v
}

/// 2 MiB each way at once, both hash-checked.
fn exchange(c: SmcStream, s: SmcStream) {
    let data = |seed: u8| {
        (0..2u32 << 20)
            .map(|i| (i as u8).wrapping_mul(seed) ^ (i >> 11) as u8)
            .collect::<Vec<u8>>()
    };
    let run = |st: SmcStream, out: Vec<u8>| {
        thread::spawn(move || {
            let mut w = st.try_clone().unwrap();
            let wt = thread::spawn(move || {
                w.write_all(&out).unwrap();
                w.shutdown(Shutdown::Write).unwrap();
            });
            let mut r = st;
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            wt.join().unwrap();
            Sha256::digest(&got)
        })
    };
    let (dc, ds) = (data(7), data(13));
    let (hc, hs) = (Sha256::digest(&dc), Sha256::digest(&ds));
    let tc = run(c, dc);
    let ts = run(s, ds);
    assert_eq!(tc.join().unwrap(), hs, "client received the server's data");
    assert_eq!(ts.join().unwrap(), hc, "server received the client's data");
}

/// One connection through a relay; returns the CLC messages each way and the two streams.
fn connect(
    sdev: &Device,
    cdev: &Device,
    server_ueid: Option<&str>,
    client_ueid: Option<&str>,
    relay_at: &str,
    listen_at: &str,
) -> (Vec<ClcMessage>, Vec<ClcMessage>, SmcStream, SmcStream) {
    let l = SmcListener::bind_with(listen_at, sdev, cfg(server_ueid)).unwrap();
    let (raddr, seen) = relay(relay_at, l.local_addr().unwrap());
    let srv = thread::spawn(move || l.accept().unwrap().0);
    let c = SmcStream::connect_with(raddr, cdev, &cfg(client_ueid)).unwrap();
    let s = srv.join().unwrap();
    let g = seen.lock().unwrap();
    (clc_messages(&g.0), clc_messages(&g.1), c, s)
}

/// SMC-CLC-3 with a common UEID: Proposal v2 with the EID (and v1 offered too), Accept and
/// Confirm in the v2 form naming the EID; the link comes up (v2 CONFIRM LINK) and carries
/// data; a second connection is a subsequent contact (Accept F = 0) in the same group.
#[test]
fn v2_with_a_common_ueid_and_subsequent_contact() {
    let (sdev, cdev) = (device("smcv2_", "127.119.1.1"), device("smcv2_", "127.119.1.2"));
    let eid = *b"SOFTRDMA-V2-TEST                ";
    let (up, down, c, s) = connect(
        &sdev,
        &cdev,
        Some("softrdma-v2-test"),
        Some("SOFTRDMA-V2-TEST"),
        "127.119.1.2:0",
        "127.119.1.1:0",
    );
    assert_eq!(c.mode(), Mode::SmcR);
    assert_eq!(s.mode(), Mode::SmcR);
    let ClcMessage::Proposal(p) = &up[0] else {
        panic!("{up:?}")
    };
    assert_eq!(p.version, 2);
    assert!(p.offers_v2_r() && p.offers_v1_r());
    assert_eq!(p.v2_ext.as_ref().unwrap().eids, vec![eid]);
    let ClcMessage::Accept(a) = &down[0] else {
        panic!("{down:?}")
    };
    assert_eq!(a.version, 2);
    assert!(a.first_contact);
    assert_eq!(a.v2.as_ref().unwrap().eid, eid);
    assert_eq!(a.v2.as_ref().unwrap().fce.as_ref().unwrap().v2x.unwrap().max_links, 1);
    let ClcMessage::Confirm(k) = &up[1] else {
        panic!("{up:?}")
    };
    assert_eq!(k.version, 2);
    assert_eq!(k.v2.as_ref().unwrap().gid_list.as_ref().unwrap().len(), 1);
    let group = c.link_group();
    exchange(c, s);

    let (_, down2, c2, s2) = connect(
        &sdev,
        &cdev,
        Some("softrdma-v2-test"),
        Some("SOFTRDMA-V2-TEST"),
        "127.119.1.2:0",
        "127.119.1.1:0",
    );
    let ClcMessage::Accept(a2) = &down2[0] else {
        panic!("{down2:?}")
    };
    assert_eq!(a2.version, 2);
    assert!(!a2.first_contact, "second connection must reuse the v2 group");
    assert_eq!(c2.link_group(), group);
    exchange(c2, s2);
}

/// SMC-CLC-3 without a common EID: the server has no UEID, so it takes the v1 offer of the
/// client's Proposal; the connection is SMC-R v1.
#[test]
fn v1_when_the_server_has_no_ueid() {
    let (sdev, cdev) = (device("smcv2_", "127.119.2.1"), device("smcv2_", "127.119.2.2"));
    let (up, down, c, s) = connect(
        &sdev,
        &cdev,
        None,
        Some("SOFTRDMA-V2-TEST"),
        "127.119.2.2:0",
        "127.119.2.1:0",
    );
    let ClcMessage::Proposal(p) = &up[0] else {
        panic!("{up:?}")
    };
    assert_eq!(p.version, 2);
    let ClcMessage::Accept(a) = &down[0] else {
        panic!("{down:?}")
    };
    assert_eq!(a.version, 1);
    assert_eq!(c.mode(), Mode::SmcR);
    assert_eq!(s.mode(), Mode::SmcR);
    exchange(c, s);
}
