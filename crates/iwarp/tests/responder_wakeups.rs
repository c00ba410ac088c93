//! Issue 18's guard for Read latency, counted rather than timed: the passive
//! side of an RDMA Read (nobody polls its CQ, as `ib_read_lat`'s server) is
//! answered by the device's progress thread. Before, that thread went back to
//! `epoll_wait` after every Read Response, so each Read Request of a requester
//! in a loop began with a wake-up of the passive side: on an idle 2-vCPU VM
//! the wake-up of an idle vCPU made the busy Read round trip 3x a busy TCP
//! ping-pong's. Now it stays awake for `IwarpConfig::responder_spin` after it
//! answered a request, and the next Read finds it running.
//!
//! What is counted is the code path, not the scheduler:
//! `iwarp::engine::responder_wakeups()` counts progress-thread turns that began
//! with a wait (a poll with a timeout) and answered a request. The test sets
//! the window far longer than any gap a loaded machine puts between two Reads
//! (100 ms), so only the choice "wait or stay awake" decides the count; the
//! control with the window at zero shows the counter sees every Read. Its own
//! test binary (the counter is process-wide), tests serialised.

use std::sync::Mutex;
use std::time::{Duration, Instant};
use verbs::*;

mod pair;
use pair::{T, pair_with};

static SERIAL: Mutex<()> = Mutex::new(());

const READS: u64 = 200;

/// `READS` 8-octet Reads in a loop, the requester busy-polling its CQ, the
/// responder's CQ never polled. Returns the responder's wake-ups and how many
/// Requests it read from the socket itself while awake (`hot_answers`).
fn read_loop(spin: Duration) -> (u64, u64) {
    let p = pair_with(
        iwarp::IwarpConfig {
            responder_spin: spin,
            ..Default::default()
        },
        false,
    );
    let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let remote = RemoteAddr {
        addr: mb.addr(),
        rkey: mb.rkey(),
    };
    std::thread::sleep(Duration::from_millis(20)); // set-up's own events settle
    let before = iwarp::engine::responder_wakeups();
    let hot0 = iwarp::engine::hot_answers();
    let mut v = Vec::new();
    for i in 1..=READS {
        mb.write(0, &i.to_le_bytes()).unwrap();
        p.a.post_send_one(SendWr::new(i, WrOpcode::RdmaRead { remote }, vec![ma.sge(0, 8)]))
            .unwrap();
        let deadline = Instant::now() + T;
        while p.cq_a.poll(&mut v, 1) == 0 {
            assert!(Instant::now() < deadline, "Read {i}: no completion within {T:?}");
        }
        let wc = v.pop().unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (i, WcStatus::Success, WcOpcode::RdmaRead, 8)
        );
        assert_eq!(ma.to_vec(0, 8).unwrap(), i.to_le_bytes(), "Read {i} brought its value");
    }
    let wakeups = iwarp::engine::responder_wakeups() - before;
    let hot = iwarp::engine::hot_answers() - hot0;
    assert!(p.cq_b.is_empty(), "a Read's responder has no completion (RDMAP-RD-01)");
    eprintln!("responder_spin {spin:?}: {wakeups} responder wake-ups, {hot} Requests read directly, for {READS} Reads");
    (wakeups, hot)
}

/// RDMAP-RD-01: the passive side answers a loop of Reads without a wake-up each.
#[test]
fn a_passive_read_responder_stays_awake_between_reads_rdmap_rd_01() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w, hot) = read_loop(Duration::from_millis(100));
    assert!(
        w <= READS / 10,
        "{w} wake-ups of the responder for {READS} Reads (bound {})",
        READS / 10
    );
    // Session 13: while awake the thread reads the answering connection's socket itself
    // (one `read` per empty pass, as a busy TCP server's `recv`) instead of polling
    // `epoll_wait` and yielding (two system calls per pass, and the Request read one
    // pass after its event). With the window this long, only a Request that arrives in
    // the one pass in 16 that polls `epoll_wait` is read there; before, none was read
    // directly (0).
    assert!(
        hot >= READS / 2,
        "{hot} of {READS} Reads answered by the awake responder's own read (bound {})",
        READS / 2
    );
}

/// The control: with the window at zero the thread waits after every Response, and the
/// counter sees a wake-up per Read (so the bound above is not met by a counter that
/// never counts).
#[test]
fn without_the_window_every_read_wakes_the_responder() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w, hot) = read_loop(Duration::ZERO);
    assert!(w >= READS * 9 / 10, "{w} wake-ups for {READS} Reads");
    assert_eq!(hot, 0, "no window: nothing is read outside `epoll_wait`");
}
