//! Request/response over `SmcStream` counted, never timed (issue 15's latency benchmark
//! point, its hand-offs guarded): 64 B requests echoed between two soft RoCEv2 devices on
//! 127.118.6.x, blocking and then busy (nonblocking reads that spin), and who applied the
//! completions, from [`smc::stream::engine_counters`].
//!
//! A reader or writer that waits takes its link's CQ itself (leader/follower) and applies
//! the CDC it waits for: the progress thread stays off the CQ while application threads
//! poll it ([`SmcConfig::progress_linger`], here long, so that what the code decides does
//! not depend on how the threads are scheduled). So once both ends have read once, every
//! completion is applied by the thread that waited for it: no completion is applied by a
//! progress thread and no waiting thread is woken by another one (zero hand-offs), in
//! both wait modes; at least the two CDC receives of each round trip are applied by the
//! waiting threads. A TCP reader is woken once, by the kernel; before this a CDC went
//! provider thread → group progress thread → reader.
//!
//! System calls too (session 14): in the blocking phase each message costs its sender one
//! `sendmmsg` (the RDMA Write and the CDC as one GSO train, the ACK of the message it
//! answers riding behind them), as the bound (`examples/smc_latency_bound.rs`) does. A waiting thread that was handed its
//! completion takes only what else is queued ([`verbs::CompletionQueue::poll_queued`]): it
//! used to drive the provider once more, which sent the deferred ACK on its own and then
//! found the socket empty (2.70 `sendmmsg` per round trip, now 2.0).
//!
//! Allocations too (session 15): testsupport's counting allocator counts what each of the
//! two application threads allocates over the counted round trips (the blocking reader's
//! inline CQ wait, the posting of the Write and its CDC, applying completions, reposting
//! the receive). 18.6 per round trip before session 15 (the wait's two lists, the post's
//! WR list and its growth, the completion list); what is left is the work requests' own
//! scatter lists (`SendWr`/`RecvWr` own a `Vec<Sge>`), 8 per round trip.
//!
//! One test in this file: the counters are process-wide.
//!
//! Requirements: smcr-ipoibcm.md A2.8 (CDC flow control), D2 (SmcStream like TcpStream).

use smc::stream::engine_counters;
use smc::{Mode, SmcConfig, SmcListener, SmcStream};
use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;
use testsupport::alloc::thread_allocs;

#[path = "common/loopback.rs"]
mod loopback;
use loopback::device;
use verbs::Device;

// Per-thread allocation counts (testsupport::alloc): each application thread reads its own.
testsupport::counting_allocator!();

const SIZE: usize = 64;
const WARMUP: usize = 50;
const ROUNDS: u64 = 400;

#[derive(Debug, Clone, Copy)]
struct Snap {
    caller_waits: u64,
    caller_polls: u64,
    caller_completions: u64,
    progress_completions: u64,
    handoffs: u64,
}

fn snap() -> Snap {
    let k = engine_counters();
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::SeqCst);
    Snap {
        caller_waits: l(&k.caller_waits),
        caller_polls: l(&k.caller_polls),
        caller_completions: l(&k.caller_completions),
        progress_completions: l(&k.progress_completions),
        handoffs: l(&k.handoffs),
    }
}

/// Reads exactly `buf.len()` octets, spinning on `WouldBlock` when `busy`.
fn read_full(s: &mut SmcStream, buf: &mut [u8], busy: bool) {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => panic!("EOF after {got} octets"),
            Ok(n) => got += n,
            Err(e) if busy && e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => panic!("{} read: {e}", if busy { "busy" } else { "blocking" }),
        }
    }
}

/// A device counter (the RoCE provider's `tx_syscalls`, `rx_syscalls`, ...).
fn counter(d: &Device, name: &str) -> u64 {
    d.hw_counters()
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no counter {name}"))
        .value
}

/// `name` summed over both ends' devices.
fn both(devs: &[&Device; 2], name: &str) -> u64 {
    devs.iter().map(|d| counter(d, name)).sum()
}

/// `WARMUP` untimed round trips, then `ROUNDS` counted: the counters' difference, the
/// devices' `sendmmsg` and data-returning `recvmmsg` calls, and this thread's allocations
/// over the counted ones.
fn round_trips(c: &mut SmcStream, busy: bool, devs: &[&Device; 2]) -> (Snap, Snap, u64, u64, u64) {
    let mut req = [0u8; SIZE];
    let mut resp = [0u8; SIZE];
    let mut before = None;
    let (mut tx0, mut rx0, mut allocs0) = (0, 0, 0);
    for i in 0..WARMUP as u64 + ROUNDS {
        if i == WARMUP as u64 {
            before = Some(snap());
            (tx0, rx0) = (both(devs, "tx_syscalls"), both(devs, "rx_syscalls"));
            allocs0 = thread_allocs();
        }
        req.iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = (i as usize * 7 + j) as u8);
        c.write_all(&req).unwrap();
        read_full(c, &mut resp, busy);
        assert_eq!(resp, req, "round trip {i}: response differs from its request");
    }
    let allocs = thread_allocs() - allocs0;
    let (tx, rx) = (both(devs, "tx_syscalls") - tx0, both(devs, "rx_syscalls") - rx0);
    (before.unwrap(), snap(), tx, rx, allocs)
}

#[test]
fn request_response_has_no_handoffs() {
    let cfg = SmcConfig {
        prefix_len: 8,
        // Application threads keep the CQ for the whole test: the progress thread's own
        // polling never meets theirs, whatever the schedule.
        progress_linger: Duration::from_secs(3600),
        ..SmcConfig::default()
    };
    let (da, db) = (device("smc_", "127.118.6.1"), device("smc_", "127.118.6.2"));
    let l = SmcListener::bind_with("127.118.6.1:0", &da, cfg.clone()).unwrap();
    let addr = l.local_addr().unwrap();
    // The echo server: blocking for the first phase, then busy (nonblocking reads).
    // The echo's allocations over its counted rounds, one figure per phase.
    let (allocs_tx, allocs_rx) = std::sync::mpsc::channel();
    let srv = thread::spawn(move || {
        let mut s = l.accept().unwrap().0;
        assert_eq!(s.mode(), Mode::SmcR);
        let mut buf = [0u8; SIZE];
        for phase_busy in [false, true] {
            if phase_busy {
                s.set_nonblocking(true).unwrap();
            }
            let mut allocs0 = 0;
            for i in 0..WARMUP as u64 + ROUNDS {
                if i == WARMUP as u64 {
                    allocs0 = thread_allocs();
                }
                read_full(&mut s, &mut buf, phase_busy);
                s.write_all(&buf).unwrap();
            }
            allocs_tx.send(thread_allocs() - allocs0).unwrap();
        }
        s
    });
    let mut c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
    assert_eq!(c.mode(), Mode::SmcR);
    for busy in [false, true] {
        if busy {
            c.set_nonblocking(true).unwrap();
        }
        // Both application threads, each over its `ROUNDS` counted round trips.
        let (b, a, tx, rx, client_allocs) = round_trips(&mut c, busy, &[&da, &db]);
        let allocs = client_allocs + allocs_rx.recv().unwrap();
        let d = |f: fn(&Snap) -> u64| f(&a) - f(&b);
        eprintln!(
            "{}: per round trip {:.2} caller waits, {:.2} caller polls that found one, \
             {:.2} completions applied by callers, {} by progress threads, {} hand-offs, \
             {:.2} sendmmsg, {:.2} recvmmsg that returned datagrams, \
             {:.2} allocations by the two application threads",
            if busy { "busy" } else { "blocking" },
            d(|x| x.caller_waits) as f64 / ROUNDS as f64,
            d(|x| x.caller_polls) as f64 / ROUNDS as f64,
            d(|x| x.caller_completions) as f64 / ROUNDS as f64,
            d(|x| x.progress_completions),
            d(|x| x.handoffs),
            tx as f64 / ROUNDS as f64,
            rx as f64 / ROUNDS as f64,
            allocs as f64 / ROUNDS as f64,
        );
        assert_eq!(d(|x| x.handoffs), 0, "a waiting thread was woken by another");
        assert_eq!(
            d(|x| x.progress_completions),
            0,
            "a progress thread applied completions while the application threads poll"
        );
        // Each round trip: the request's CDC at the server, the response's at the client.
        assert!(
            d(|x| x.caller_completions) >= 2 * ROUNDS,
            "{} completions applied by the waiting threads for {ROUNDS} round trips",
            d(|x| x.caller_completions)
        );
        if busy {
            assert!(d(|x| x.caller_polls) >= 2 * ROUNDS, "busy readers did not poll the CQ");
        } else {
            assert!(
                d(|x| x.caller_waits) >= 2 * ROUNDS,
                "blocking readers did not wait in the CQ"
            );
            // Two messages per round trip, one `sendmmsg` each (2.66-2.70 before session 14:
            // the deferred ACK went out alone). Slack of a quarter: a thread preempted for
            // over 1 ms between its receive and its reply has its ACK sent by the progress
            // thread's muted check, and a waiter woken by a datagram that completes nothing
            // sends what it deferred before it sleeps again; the schedule decides those.
            assert!(
                tx * 4 <= 9 * ROUNDS,
                "{tx} sendmmsg for {ROUNDS} blocking round trips (2 per round trip, + 1/4 slack)"
            );
            // Eight per round trip are the work requests' scatter lists (a Write, a CDC
            // Send and a receive repost per message, the provider's copy of the receive);
            // about 16 on these two threads before session 15 (callgrind). Slack of a
            // quarter for what a thread's timer pass may add.
            assert!(
                allocs <= 10 * ROUNDS,
                "{allocs} allocations for {ROUNDS} blocking round trips (8 per round trip, \
                 + 1/4 slack)"
            );
            // Receives are printed, not bounded: a reader woken by the train and then again
            // by the ACK behind it (a datagram of its own) depends on the schedule (2.0-2.6
            // per round trip beside two busy loops).
        }
    }
    let s = srv.join().unwrap();
    drop((c, s));
}
