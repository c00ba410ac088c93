//! Issue 18 (session 13), busy-poll latency, counted rather than timed: what an
//! empty poll of a busy-polled CQ costs on the polling thread.
//!
//! A QP whose CQ an application thread keeps polling is muted (the progress thread
//! stops waking for its socket). Before, every poll still read the clock to keep the
//! "last poll" time the progress thread compared against 100 µs: ~10 % of a busy
//! poller's instructions (callgrind, `bench send --lat`). Now a muted QP's poll only
//! moves a count, and the progress thread asks whether it moved since its last check.
//! The clock is read while the QP is not yet muted (20 µs of polls decide that it is
//! busy-polled) and again after an unmute.
//!
//! What is counted is this thread's code path (`iwarp::engine::qp::clock_reads` is
//! thread-local): how many of its polls read the clock. Its own test binary.

use std::time::{Duration, Instant};
use verbs::*;

mod pair;
use pair::{T, pair};

const POLLS: u64 = 20_000;

/// RDMAP-SND-01: a busy-polled empty CQ reads no clock per poll once its QP is muted,
/// and the poller still receives what comes afterwards.
#[test]
fn a_muted_busy_poller_reads_no_clock_per_poll_rdmap_snd_01() {
    let p = pair();
    let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    p.a.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: vec![ma.sge(0, 64)],
    }])
    .unwrap();
    std::thread::sleep(Duration::from_millis(20)); // set-up's own events settle
    let clock0 = iwarp::engine::qp::clock_reads();
    let reads0 = iwarp::engine::qp::socket_reads();
    for _ in 0..POLLS {
        assert!(p.cq_a.poll_one().is_none(), "nothing was sent");
    }
    let clock = iwarp::engine::qp::clock_reads() - clock0;
    let reads = iwarp::engine::qp::socket_reads() - reads0;
    eprintln!("{POLLS} empty polls: {clock} clock reads, {reads} socket reads");
    // Before: one clock read per poll (20,000). Now only until the QP is muted (about
    // 20 µs of polls) and after an unmute (a poller descheduled for a whole check
    // period on a loaded machine): a small fraction.
    assert!(
        clock <= POLLS / 10,
        "{clock} clock reads in {POLLS} empty polls (bound {})",
        POLLS / 10
    );
    // Each empty poll still reads the socket once (the poller receives itself).
    assert!(reads >= POLLS, "{reads} socket reads for {POLLS} polls");

    // The muted QP still receives, by its poller.
    mb.write(0, b"after the polls").unwrap();
    p.b.post_send_one(SendWr::new(1, WrOpcode::Send, vec![mb.sge(0, 15)]))
        .unwrap();
    let deadline = Instant::now() + T;
    let wc = loop {
        if let Some(wc) = p.cq_a.poll_one() {
            break wc;
        }
        assert!(Instant::now() < deadline, "no receive completion within {T:?}");
    };
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 15)
    );
    assert_eq!(ma.to_vec(0, 15).unwrap(), b"after the polls");
}
