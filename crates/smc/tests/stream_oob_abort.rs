//! Urgent data and abort through `SmcStream`, each scenario run over SMC-R and over a
//! fallback connection (the kernel's TCP, which is the model: requirements D1) with the
//! same assertions. Two soft RoCEv2 devices on loopback, addresses 127.115.43–46.x
//! (unique to this file).
//!
//! Requirements: smcr-ipoibcm.md A2.9 (SMC-URG-1..5), A2.11 (SMC-ABT-1, -3), A4.5, A4.6 (e).

use smc::{Mode, SmcConfig, SmcStream};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

#[path = "common/loopback.rs"]
mod loopback;
use loopback::device;

fn cfg(propose: bool) -> SmcConfig {
    SmcConfig {
        prefix_len: 8,
        propose,
        indication_wait: Duration::from_millis(200),
        ..SmcConfig::default()
    }
}

/// A connected pair: SMC-R when `smc`, else a fallback pair (client does not propose).
/// The client writes first, so a fallback server decides at once. Also returns a clone of
/// the server's TCP socket (to look at the TCP path).
fn pair(server: &str, client: &str, smc: bool) -> (SmcStream, SmcStream, TcpStream) {
    let (ds, dc) = (device("smc_oob_", server), device("smc_oob_", client));
    let l = TcpListener::bind(format!("{server}:0")).unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (tcp, _) = l.accept().unwrap();
        let keep = tcp.try_clone().unwrap();
        (SmcStream::accept_over(tcp, Some(&ds), &cfg(true), None).unwrap(), keep)
    });
    let mut c = SmcStream::connect_with(addr, &dc, &cfg(smc)).unwrap();
    if !smc {
        c.write_all(b"hello").unwrap();
    }
    let (mut s, keep) = t.join().unwrap();
    if !smc {
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");
    }
    let want = if smc { "SmcR" } else { "Fallback" };
    assert!(format!("{:?}", c.mode()).starts_with(want), "{:?}", c.mode());
    assert!(format!("{:?}", s.mode()).starts_with(want), "{:?}", s.mode());
    (c, s, keep)
}

fn read_some(s: &mut SmcStream, max: usize) -> Vec<u8> {
    let mut b = vec![0u8; max];
    let n = s.read(&mut b).unwrap();
    b.truncate(n);
    b
}

/// Waits until the urgent octet can be read out of band (peek), returning it.
fn wait_urgent(s: &SmcStream) -> u8 {
    let t0 = Instant::now();
    loop {
        match s.recv_urgent(true) {
            Ok(b) => return b,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::InvalidInput) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "urgent octet never arrived: {e}"
                );
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("recv_urgent: {e}"),
        }
    }
}

/// SMC-URG-1/3, A4.5, Linux's TCP out of line: the last octet of send(MSG_OOB) is read
/// out of band once (EINVAL after), reads stop before it, SIOCATMARK is true there, and
/// the next read goes on after it (the urgent octet is not in the stream).
fn urgent_out_of_line(server: &str, client: &str, smc: bool) {
    let (mut c, mut s, _k) = pair(server, client, smc);
    assert!(!s.oob_inline().unwrap());
    assert_eq!(
        s.recv_urgent(false).unwrap_err().kind(),
        ErrorKind::InvalidInput,
        "no urgent data yet"
    );
    c.write_all(&[b'a'; 1000]).unwrap();
    assert_eq!(c.send_urgent(b"xyU").unwrap(), 3);
    c.write_all(&[b'b'; 100]).unwrap();
    assert_eq!(wait_urgent(&s), b'U', "MSG_PEEK");
    assert_eq!(s.recv_urgent(false).unwrap(), b'U');
    assert_eq!(
        s.recv_urgent(false).unwrap_err().kind(),
        ErrorKind::InvalidInput,
        "read once only (EINVAL)"
    );
    // Reads stop at the mark.
    let mut before = Vec::new();
    while !s.at_urgent_mark().unwrap() {
        let got = read_some(&mut s, 4096);
        assert!(!got.is_empty());
        before.extend_from_slice(&got);
        assert!(before.len() <= 1002, "read past the mark");
    }
    assert_eq!(before.len(), 1002);
    assert!(before[..1000].iter().all(|&b| b == b'a') && &before[1000..] == b"xy");
    // The urgent octet is not in the stream.
    let mut after = vec![0u8; 100];
    s.read_exact(&mut after).unwrap();
    assert!(after.iter().all(|&b| b == b'b'), "{after:?}");
    assert!(!s.at_urgent_mark().unwrap());
    // Normal data after the urgent data flows (SMC-URG-4/5: the writer waited for the
    // consumer cursor, then went on).
    c.write_all(b"tail").unwrap();
    let mut t = [0u8; 4];
    s.read_exact(&mut t).unwrap();
    assert_eq!(&t, b"tail");
}

/// SO_OOBINLINE: no out-of-band octet (EINVAL); the urgent octet stays in the stream, reads
/// still stop at the mark.
fn urgent_inline(server: &str, client: &str, smc: bool) {
    let (mut c, mut s, _k) = pair(server, client, smc);
    s.set_oob_inline(true).unwrap();
    assert!(s.oob_inline().unwrap());
    c.write_all(&[b'a'; 500]).unwrap();
    c.send_urgent(b"U").unwrap();
    c.write_all(&[b'b'; 10]).unwrap();
    let mut before = Vec::new();
    let t0 = Instant::now();
    while before.len() < 500 {
        before.extend_from_slice(&read_some(&mut s, 4096));
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert_eq!(before.len(), 500, "a read went past the mark");
    // The mark is at the urgent octet once it arrived.
    let t0 = Instant::now();
    while !s.at_urgent_mark().unwrap() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no mark");
        thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(s.recv_urgent(false).unwrap_err().kind(), ErrorKind::InvalidInput);
    let mut rest = vec![0u8; 11];
    s.read_exact(&mut rest).unwrap();
    assert_eq!(rest[0], b'U');
    assert!(rest[1..].iter().all(|&b| b == b'b'));
}

/// TCP state of a socket (`tcp_info.tcpi_state`; 7 = TCP_CLOSE).
fn tcp_state(t: &TcpStream) -> u8 {
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY (test): the descriptor is open; the buffer and its length are valid.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::getsockopt(
            t.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0);
    info[0]
}

/// Figure 23 / SMC-ABT-1, -3: SO_LINGER {1, 0} + close. The peer's TCP socket is reset (an
/// RST, not a FIN: TCP_CLOSE rather than CLOSE_WAIT), its reads fail with ECONNRESET and its
/// writes fail.
fn abort_resets(server: &str, client: &str, smc: bool) {
    let (mut c, mut s, keep) = pair(server, client, smc);
    c.write_all(b"lost?").unwrap();
    c.set_linger(Some(Duration::ZERO)).unwrap();
    drop(c);
    let t0 = Instant::now();
    let e = loop {
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => panic!("EOF instead of a reset"),
            // Octets that arrived before the abort may still be read over TCP.
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(s.write_all(b"x").is_err(), "write after the peer's abort");
    let t0 = Instant::now();
    while tcp_state(&keep) != 7 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "TCP state {} (no RST)",
            tcp_state(&keep)
        );
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn urgent_out_of_line_smc_r() {
    urgent_out_of_line("127.115.43.1", "127.115.43.2", true);
}

#[test]
fn urgent_out_of_line_tcp() {
    urgent_out_of_line("127.115.43.3", "127.115.43.4", false);
}

#[test]
fn urgent_inline_smc_r() {
    urgent_inline("127.115.44.1", "127.115.44.2", true);
}

#[test]
fn urgent_inline_tcp() {
    urgent_inline("127.115.44.3", "127.115.44.4", false);
}

#[test]
fn abort_smc_r() {
    abort_resets("127.115.45.1", "127.115.45.2", true);
}

#[test]
fn abort_tcp() {
    abort_resets("127.115.45.3", "127.115.45.4", false);
}

/// SMC-ABT-1: `abort()` with a second handle open: that handle's calls fail at once; the
/// peer sees ECONNRESET.
#[test]
fn abort_with_clone_open() {
    let (c, mut s, _k) = pair("127.115.46.1", "127.115.46.2", true);
    assert_eq!(c.mode(), Mode::SmcR);
    let mut c2 = c.try_clone().unwrap();
    c.abort().unwrap();
    assert!(c2.write_all(b"x").is_err());
    let mut b = [0u8; 8];
    assert_eq!(c2.read(&mut b).unwrap_err().kind(), ErrorKind::ConnectionAborted);
    assert_eq!(s.read(&mut b).unwrap_err().kind(), ErrorKind::ConnectionReset);
}
