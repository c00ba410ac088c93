//! Many short SMC-R connections, one after the other, through **one link group** (issue 15
//! "10,000 short connections through one link group: no leaked QPs, MRs or RMB elements,
//! counts from `smc stat` before and after"; A2.4 subsequent contact, A2.7 SMC-RMB-9
//! element reuse, A4.9 linger). Own test binary, so no other test's resources are counted.
//! Addresses 127.115.10.x. `SMC_CHURN_N` sets the count (default 1000; 10,000 by hand:
//! `SMC_CHURN_N=10000 cargo test -p smc --release --test stream_churn -- --nocapture`).

use smc::stats::{self, Resources};
use smc::{Mode, SmcConfig, SmcListener, SmcStream, live_links};
use std::io::{Read, Write};
use std::thread;
use std::time::{Duration, Instant};

#[path = "common/loopback.rs"]
mod loopback;
use loopback::device;

#[test]
fn short_connections_through_one_link_group_leave_nothing_behind() {
    let n: usize = std::env::var("SMC_CHURN_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let (da, db) = (device("smc_", "127.115.10.1"), device("smc_", "127.115.10.2"));
    let cfg = SmcConfig {
        prefix_len: 8,
        rmbe_len: 16 * 1024,
        send_buf: 16 * 1024,
        linger: Duration::from_millis(300),
        ..SmcConfig::default()
    };
    let before = stats::snapshot().resources;
    assert_eq!(before, Resources::default(), "fresh process");
    let listener = SmcListener::bind_with("127.115.10.1:0", &da, cfg.clone()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let mut groups = std::collections::BTreeSet::new();
        for _ in 0..n {
            let (mut s, _) = listener.accept().unwrap();
            assert_eq!(s.mode(), Mode::SmcR);
            groups.insert(s.link_group().unwrap());
            let mut b = [0u8; 64];
            let k = s.read(&mut b).unwrap();
            s.write_all(&b[..k]).unwrap();
            let mut rest = [0u8; 1];
            assert_eq!(s.read(&mut rest).unwrap(), 0);
        }
        groups
    });
    let t0 = Instant::now();
    let mut groups = std::collections::BTreeSet::new();
    let mut peak = Resources::default();
    for i in 0..n {
        let mut c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
        assert_eq!(c.mode(), Mode::SmcR);
        groups.insert(c.link_group().unwrap());
        let msg = format!("connection {i}");
        c.write_all(msg.as_bytes()).unwrap();
        let mut b = vec![0u8; msg.len()];
        c.read_exact(&mut b).unwrap();
        assert_eq!(b, msg.as_bytes());
        c.shutdown(std::net::Shutdown::Write).unwrap();
        drop(c);
        if i % 100 == 50 {
            let r = stats::snapshot().resources;
            peak.qps = peak.qps.max(r.qps);
            peak.mrs = peak.mrs.max(r.mrs);
            peak.rmb_elements = peak.rmb_elements.max(r.rmb_elements);
        }
    }
    let sgroups = server.join().unwrap();
    let elapsed = t0.elapsed();
    // One link group each side for all of them (subsequent contact after the first).
    assert_eq!(
        (groups.len(), sgroups.len()),
        (1, 1),
        "client {groups:?} server {sgroups:?}"
    );
    // Two QPs in the process (one per side) whatever the count.
    assert_eq!(peak.qps, 2, "{peak:?}");
    let wait = Instant::now();
    loop {
        let r = stats::snapshot().resources;
        if r == before && live_links() == 0 {
            break;
        }
        assert!(
            wait.elapsed() < Duration::from_secs(20),
            "still in use after the linger time: {r:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "{n} connections through one link group in {elapsed:?}; peak QPs {} MRs {} elements {}; \
         after the linger time QPs, MRs, RMB elements, links and groups all back to 0",
        peak.qps, peak.mrs, peak.rmb_elements
    );
}
