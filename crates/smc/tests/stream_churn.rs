//! Many short SMC-R connections, one after the other: every link (QP, PD, RMB and the other
//! MRs) is released once both sides closed — the count returns to zero (issue 15 "no leaked
//! QPs, MRs or RMB elements"; here with one link per connection). Own test binary, so no
//! other test's links are counted. Addresses 127.115.10.x.

use smc::{Mode, SmcConfig, SmcListener, SmcStream, live_links};
use std::io::{Read, Write};
use std::thread;
use std::time::{Duration, Instant};
use verbs::{DeviceFactory, DeviceOptions};

#[test]
fn short_connections_release_every_link() {
    const N: usize = 500;
    let dev = |a: &str| {
        roce::RoceFactory
            .open(&DeviceOptions::new().with("addr", a).with("name", format!("smc_{a}")))
            .unwrap()
    };
    let (da, db) = (dev("127.115.10.1"), dev("127.115.10.2"));
    let cfg = SmcConfig {
        prefix_len: 8,
        rmbe_len: 16 * 1024,
        send_buf: 16 * 1024,
        ..SmcConfig::default()
    };
    let listener = SmcListener::bind_with("127.115.10.1:0", &da, cfg.clone()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        for _ in 0..N {
            let (mut s, _) = listener.accept().unwrap();
            assert_eq!(s.mode(), Mode::SmcR);
            let mut b = [0u8; 64];
            let n = s.read(&mut b).unwrap();
            s.write_all(&b[..n]).unwrap();
            let mut rest = [0u8; 1];
            assert_eq!(s.read(&mut rest).unwrap(), 0);
        }
    });
    let t0 = Instant::now();
    for i in 0..N {
        let mut c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
        assert_eq!(c.mode(), Mode::SmcR);
        let msg = format!("connection {i}");
        c.write_all(msg.as_bytes()).unwrap();
        let mut b = vec![0u8; msg.len()];
        c.read_exact(&mut b).unwrap();
        assert_eq!(b, msg.as_bytes());
        c.shutdown(std::net::Shutdown::Write).unwrap();
        drop(c);
    }
    server.join().unwrap();
    let wait = Instant::now();
    while live_links() != 0 {
        assert!(
            wait.elapsed() < Duration::from_secs(20),
            "{} links still alive",
            live_links()
        );
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!("{N} connections in {:?}, every link released", t0.elapsed());
}
