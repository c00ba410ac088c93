//! Streaming over `SmcStream` counted, never timed (issue 15's streaming benchmark, its
//! costs guarded): 16 MiB in 1 MiB writes between two soft RoCEv2 devices on 127.118.5.x,
//! and what the engine did per MiB, from [`smc::stream::engine_counters`]. Every bound is
//! one the code decides whatever the schedule:
//!
//! - every octet goes over the wire exactly once (RDMA Write octets = octets streamed);
//! - one RDMA Write per contiguous span of the peer's element: at most two per data CDC
//!   (the element wraps at most once per write, E-22);
//! - a standalone CDC (window update or "writer blocked") has a cause: a read, a received
//!   CDC with the writer-blocked flag, or a write that found no room; so standalone CDCs
//!   ≤ reads + data CDCs + writes;
//! - wake-ups: the progress thread wakes the waiting reader and writer only for a
//!   completion that can matter to them (a receive, an RDMA Write completion, an error) or
//!   a timer pass, never for its own CDC send completions.
//!
//! One test in this file: the counters are process-wide.
//!
//! Requirements: smcr-ipoibcm.md A2.8 (CDC flow control), SMC-CDC-6..9, E-22, D2.

use smc::stream::engine_counters;
use smc::{Mode, SmcConfig, SmcListener, SmcStream};
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::thread;

#[path = "common/loopback.rs"]
mod loopback;
use loopback::device;

#[derive(Debug, Clone, Copy)]
struct Snap {
    completions: u64,
    waking: u64,
    passes: u64,
    idle: u64,
    wakeups: u64,
    writes: u64,
    write_octets: u64,
    cdcs: u64,
    data_cdcs: u64,
}

fn snap() -> Snap {
    let k = engine_counters();
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::SeqCst);
    Snap {
        completions: l(&k.completions),
        waking: l(&k.waking_completions),
        passes: l(&k.passes),
        idle: l(&k.idle_passes),
        wakeups: l(&k.wakeups),
        writes: l(&k.rdma_writes),
        write_octets: l(&k.rdma_write_octets),
        cdcs: l(&k.cdcs_sent),
        data_cdcs: l(&k.data_cdcs_sent),
    }
}

#[test]
fn streaming_counts_per_mib() {
    const TOTAL: usize = 16 << 20;
    let cfg = SmcConfig {
        prefix_len: 8,
        rmbe_len: 512 * 1024,
        send_buf: 1 << 20,
        ..SmcConfig::default()
    };
    let (da, db) = (device("smc_", "127.118.5.1"), device("smc_", "127.118.5.2"));
    let l = SmcListener::bind_with("127.118.5.1:0", &da, cfg.clone()).unwrap();
    let addr = l.local_addr().unwrap();
    let srv = thread::spawn(move || l.accept().unwrap().0);
    let mut c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
    let mut s = srv.join().unwrap();
    assert_eq!((c.mode(), s.mode()), (Mode::SmcR, Mode::SmcR));
    let before = snap();
    let reader = thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let (mut got, mut reads) = (0usize, 0u64);
        let mut sum = 0u64;
        while got < TOTAL {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            sum = buf[..n]
                .iter()
                .fold(sum, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
            got += n;
            reads += 1;
        }
        (s, reads, sum)
    });
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let mut want = 0u64;
    for _ in 0..TOTAL / chunk.len() {
        c.write_all(&chunk).unwrap();
        want = chunk
            .iter()
            .fold(want, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
    }
    let (s, reads, sum) = reader.join().unwrap();
    assert_eq!(sum, want, "octets differ");
    let after = snap();
    let d = |f: fn(&Snap) -> u64| f(&after) - f(&before);
    let mib = (TOTAL >> 20) as u64;
    let (writes, data_cdcs, cdcs) = (d(|x| x.writes), d(|x| x.data_cdcs), d(|x| x.cdcs));
    let app_writes = (TOTAL / chunk.len()) as u64;
    eprintln!(
        "per MiB: {:.1} RDMA Writes, {:.1} data CDCs, {:.1} CDCs in all, {:.1} completions, \
         {:.1} progress passes, {:.1} wake-ups ({} reads, {} idle passes)",
        writes as f64 / mib as f64,
        data_cdcs as f64 / mib as f64,
        cdcs as f64 / mib as f64,
        d(|x| x.completions) as f64 / mib as f64,
        d(|x| x.passes) as f64 / mib as f64,
        d(|x| x.wakeups) as f64 / mib as f64,
        reads,
        d(|x| x.idle),
    );
    // Every octet once over the wire, in at least one Write per data CDC and at most two.
    assert_eq!(d(|x| x.write_octets), TOTAL as u64);
    assert!(
        data_cdcs >= 1 && writes >= data_cdcs && writes <= 2 * data_cdcs,
        "{writes} writes, {data_cdcs} data CDCs"
    );
    // Standalone CDCs have a cause each.
    let standalone = cdcs - data_cdcs;
    assert!(
        standalone <= reads + data_cdcs + app_writes,
        "{standalone} standalone CDCs for {reads} reads, {data_cdcs} data CDCs, {app_writes} writes"
    );
    // Wake-ups only for completions a waiter cares about, or timer passes. The CDC send
    // completions (one per CDC sent, at least `cdcs` of them) are not among the waking ones.
    assert!(
        d(|x| x.wakeups) <= d(|x| x.waking) + d(|x| x.idle),
        "{} wake-ups, {} waking completions, {} idle passes",
        d(|x| x.wakeups),
        d(|x| x.waking),
        d(|x| x.idle)
    );
    assert!(
        d(|x| x.completions) - d(|x| x.waking) >= cdcs.saturating_sub(32),
        "CDC send completions counted as waking"
    );
    drop((c, s));
}
