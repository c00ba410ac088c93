//! Issue 13, busy-poll latency and the 64 B Write rate: what polling and posting cost the
//! calling thread in heap allocations and system calls, counted rather than timed (session
//! 13). Everything here runs on the test's one thread, both devices driven by its polls, so
//! the counts are what the code path decides, not how threads met:
//!
//! - an empty `poll_cq` (nothing queued on the socket) allocates nothing and makes one
//!   `recvmmsg` (an `EAGAIN`), with no datagram counted;
//! - a round trip of an 8-octet Send ping-pong allocates on the polling thread only the
//!   receive requests' own scatter lists (one per `post_recv`; a one-SGE Send's gather
//!   list is held in its WQE since session 13 round 2), nothing in its polls: not a
//!   vector per received batch, per sent batch or per ACK (before session 13: the list of
//!   QPs a receive touched, the batch's packet, train, iovec, header and control lists on
//!   every `sendmmsg`, the list of WQEs an ACK completed: 19.2 + 2.5 per round trip);
//! - 64-octet RDMA Writes posted 64 at a time allocate nothing per Write (1.41 before
//!   session 13, 1.00 after its first round: the WQE's resolved gather list), and look
//!   the memory table up no more once warm (2 per Write before session 15: the lkey at
//!   post, the rkey at the responder; now each QP's `MrCache` answers).
//!
//! Counted per thread (a counting global allocator with a thread-local count), only inside
//! the calls measured. C3 of ../shared/requirements/smcr-ipoibcm.md (RC Send and RDMA
//! Write with their ACKs; every packet's ICRC checked: `icrc_err` stays 0). Its own test
//! binary (it installs the global allocator).

use std::time::{Duration, Instant};
use verbs::*;

#[path = "common/pair.rs"]
mod pair;
use pair::{End, PairOpts, counter as c, rc_pair};

// The calling thread's allocations: testsupport's counting allocator.
testsupport::counting_allocator!();
use testsupport::alloc::thread_allocs as allocs;

fn pair(a: &str, b: &str) -> (End, End) {
    rc_pair(
        a,
        b,
        &PairOpts {
            cq_depth: 4096,
            mr_len: 1 << 16,
            psn: 5,
            timeout: 18,
            dev_opts: &[],
        },
    )
}

/// Allocations made inside `f` on this thread.
fn counted<R>(f: impl FnOnce() -> R, n: &mut u64) -> R {
    let a0 = allocs();
    let r = f();
    *n += allocs() - a0;
    r
}

/// Polls `e`'s CQ until a receive completion, counting the polls' allocations into `n`.
/// Polls until a receive completes; whether a Send completion was taken on the way.
fn poll_recv(e: &End, n: &mut u64) -> bool {
    let t0 = Instant::now();
    let mut sent = false;
    loop {
        if let Some(wc) = counted(|| e.cq.poll_one(), n) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            match wc.opcode {
                WcOpcode::Recv => return sent,
                WcOpcode::Send => sent = true,
                _ => {}
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no receive completion");
    }
}

fn post_recv(e: &End, i: u64, n: &mut u64) {
    let wr = [RecvWr {
        wr_id: i,
        sg_list: vec![e.mr.sge(64, 8)],
    }];
    counted(|| e.qp.post_recv(&wr), n).unwrap();
}

fn send8(e: &End, i: u64, n: &mut u64) {
    let wr = SendWr::new(i, WrOpcode::Send, vec![e.mr.sge(0, 8)]);
    counted(|| e.qp.post_send_one(wr), n).unwrap();
}

/// Empty polls: no allocation and no datagram, however many.
#[test]
fn an_empty_poll_allocates_nothing_c3() {
    let (x, y) = pair("127.77.21.1", "127.77.21.2");
    // One message each way first, so the QPs have sent and received (buffers sized).
    let mut n = 0;
    post_recv(&y, 0, &mut n);
    post_recv(&x, 0, &mut n);
    send8(&x, 1, &mut n);
    poll_recv(&y, &mut n);
    send8(&y, 1, &mut n);
    let mut x_sent = poll_recv(&x, &mut n);
    // Until both Sends completed: y's completes on x's ACK, which has then been sent and
    // received; x's on the ACK in y's train (or before it), which x may take after y's
    // Send (a one-datagram receive leaves it queued, and a progress thread that took it
    // may push the completion late under load); ACKs are not acknowledged, so nothing is
    // left in flight. (A fixed sleep for the deferred ACK was too short under load.)
    let (t0, mut y_sent) = (Instant::now(), false);
    while !(x_sent && y_sent) {
        x_sent |= x.cq.poll_one().is_some_and(|wc| wc.opcode == WcOpcode::Send);
        y_sent |= y.cq.poll_one().is_some_and(|wc| wc.opcode == WcOpcode::Send);
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "Sends not completed: x {x_sent}, y {y_sent}"
        );
    }
    let rx0 = c(&x.dev, "rx_datagrams") + c(&y.dev, "rx_datagrams");
    let mut a = 0;
    const POLLS: u64 = 20_000;
    for _ in 0..POLLS {
        assert!(counted(|| x.cq.poll_one(), &mut a).is_none());
    }
    let rx = c(&x.dev, "rx_datagrams") + c(&y.dev, "rx_datagrams") - rx0;
    eprintln!("{POLLS} empty polls: {a} allocations, {rx} datagrams received");
    assert_eq!(a, 0, "an empty poll allocates nothing");
    assert_eq!(rx, 0, "nothing was sent, nothing received");
}

/// An 8-octet Send ping-pong driven by one thread: allocations per round trip on it,
/// posts and polls apart.
#[test]
fn a_busy_round_trip_allocates_a_bounded_number_of_times_c3() {
    let (x, y) = pair("127.77.21.3", "127.77.21.4");
    let (mut posts, mut polls) = (0, 0);
    let round = |i: u64, posts: &mut u64, polls: &mut u64| {
        send8(&x, i, posts);
        poll_recv(&y, polls);
        post_recv(&y, i + 1, posts);
        send8(&y, i, posts);
        poll_recv(&x, polls);
        post_recv(&x, i + 1, posts);
    };
    let (mut n, mut m) = (0, 0);
    post_recv(&x, 0, &mut n);
    post_recv(&y, 0, &mut n);
    for i in 0..50 {
        round(i, &mut n, &mut m); // warm-up: per-thread buffers, queues at their size
    }
    const N: u64 = 500;
    for i in 50..50 + N {
        round(i, &mut posts, &mut polls);
    }
    eprintln!(
        "{N} round trips: {:.2} allocations per round trip in posts, {:.2} in polls",
        posts as f64 / N as f64,
        polls as f64 / N as f64
    );
    assert_eq!(c(&x.dev, "icrc_err") + c(&y.dev, "icrc_err"), 0);
    // Two Sends and two receives posted per round trip: each receive keeps its scatter
    // list (one allocation each); a one-SGE Send's resolved gather list is held inline
    // (2.00 measured; 4.0 in session 13's first round, 19.2 before session 13: the sent
    // batch's packet, train, iovec, header and control lists). The slack (0.1 per round
    // trip) is for a per-thread buffer's growth: a post that finds a deferred ACK still
    // queued sends a longer batch than before, and whether it does depends on the schedule
    // (CI once counted 2,001 against an exact 2,000).
    assert!(posts * 10 <= 21 * N, "{posts} allocations in {N} round trips' posts");
    // Polls: no vector per receiving poll, per sent batch or per ACK (0 measured; 2.5 per
    // round trip before session 13). The bound leaves room for a buffer's first growth.
    assert!(polls * 10 <= N, "{polls} allocations in {N} round trips' polls");
}

/// `rounds` times: 64 64-octet RDMA Writes from `x` to `y` posted in one call, their
/// completions polled by the same thread (which also polls `y`'s CQ, driving `y`'s device);
/// allocations in the posts and polls counted into `n`.
fn write_rounds(x: &End, y: &End, rounds: u64, n: &mut u64) {
    let base = y.mr.addr();
    let rkey = y.mr.rkey();
    let batch = |first: u64| -> Vec<SendWr> {
        (0..64u64)
            .map(|k| {
                let remote = RemoteAddr {
                    addr: base + 64 * k,
                    rkey,
                };
                SendWr::new(
                    first + k,
                    WrOpcode::RdmaWrite { remote },
                    vec![x.mr.sge(64 * (k as usize % 16), 64)],
                )
            })
            .collect()
    };
    for r in 0..rounds {
        let wrs = batch(r * 64);
        counted(|| x.qp.post_send(&wrs), n).unwrap();
        drop(wrs);
        let mut got = 0;
        let t0 = Instant::now();
        while got < 64 {
            if let Some(wc) = counted(|| x.cq.poll_one(), n) {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                got += 1;
            }
            // The responder's device is driven by its progress thread or by these
            // polls of y's CQ (nothing completes there for a Write).
            let _ = y.cq.poll_one();
            assert!(t0.elapsed() < Duration::from_secs(10), "Writes not completed");
        }
    }
}

/// 64-octet RDMA Writes, 64 posted per call, completions polled by the same thread:
/// allocations per Write on it.
#[test]
fn a_small_write_allocates_a_bounded_number_of_times_c3() {
    let (x, y) = pair("127.77.21.5", "127.77.21.6");
    let run = |rounds: u64, n: &mut u64| write_rounds(&x, &y, rounds, n);
    let mut n = 0;
    run(4, &mut n); // warm-up
    const ROUNDS: u64 = 40;
    let mut a = 0;
    let lookups0 = x.dev.mr_lookups() + y.dev.mr_lookups();
    run(ROUNDS, &mut a);
    let lookups = x.dev.mr_lookups() + y.dev.mr_lookups() - lookups0;
    let writes = ROUNDS * 64;
    eprintln!(
        "{writes} Writes: {:.2} allocations, {:.3} memory-table look-ups per Write",
        a as f64 / writes as f64,
        lookups as f64 / writes as f64
    );
    // The requester's lkey and the responder's rkey are checked on every Write (IBA
    // vol. 1 §9.7.4.1.5) through each QP's cache of the region last looked up:
    // two table look-ups (read lock, hash) per Write before session 15, none once warm.
    assert!(lookups <= 2, "{lookups} memory-table look-ups for {writes} Writes");
    assert_eq!(c(&x.dev, "icrc_err") + c(&y.dev, "icrc_err"), 0);
    // None per Write (0 measured): a one-SGE gather list is held in the WQE. 1.00 per
    // Write in session 13's first round (that list on the heap), 1.41 before session 13
    // (each `sendmmsg` allocated its lists and each ACK a list of what it completed). The
    // bound leaves room for a per-thread buffer's first growth, not one per Write.
    assert!(a * 100 <= writes, "{a} allocations for {writes} Writes");
}

/// Polls `e`'s CQ until one poll finds no completion and receives no datagram on its
/// device: its socket was found empty (`EAGAIN`), as a busy poller's is before each
/// message of a ping-pong.
fn poll_until_empty(e: &End) {
    let t0 = Instant::now();
    loop {
        let rx0 = c(&e.dev, "rx_datagrams");
        // A completion already queued is returned without a receive: not an empty poll.
        if e.cq.poll_one().is_none() && c(&e.dev, "rx_datagrams") == rx0 {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the socket never found empty");
    }
}

/// A busy poller's message after an empty poll comes by one `recvmsg` of one datagram, not
/// by `recvmmsg` (which, having found it, looks for a second one in the kernel before it
/// returns: on the latency path of every message; session 14). The ping-pong's message
/// and the ACK riding behind it are one datagram (a GSO train), so one receiving call
/// per message and end.
#[test]
fn a_message_after_an_empty_poll_is_received_by_one_recvmsg_c3() {
    let (x, y) = pair("127.77.21.7", "127.77.21.8");
    let mut n = 0;
    let round = |i: u64, n: &mut u64| {
        poll_until_empty(&y);
        send8(&x, i, n);
        poll_recv(&y, n);
        post_recv(&y, i + 1, n);
        poll_until_empty(&x);
        send8(&y, i, n);
        poll_recv(&x, n);
        post_recv(&x, i + 1, n);
    };
    post_recv(&x, 0, &mut n);
    post_recv(&y, 0, &mut n);
    for i in 0..20 {
        round(i, &mut n);
    }
    let k = |name: &str| c(&x.dev, name) + c(&y.dev, name);
    let names = ["rx_polled", "rx_single", "rx_datagrams", "progress_flushes"];
    let before = names.map(k);
    const N: u64 = 500;
    for i in 20..20 + N {
        round(i, &mut n);
    }
    let [polled, single, dgrams, flushes] = [0, 1, 2, 3].map(|j| k(names[j]) - before[j]);
    let by_progress = dgrams - polled;
    eprintln!(
        "{N} round trips: {dgrams} datagrams, {polled} received by the polling thread, \
         {single} by one-datagram recvmsg; progress threads received {by_progress} and sent \
         {flushes} deferred ACKs"
    );
    assert_eq!(k("icrc_err"), 0);
    // Two messages per round trip, each with the ACK of the one before in its datagram
    // (a GSO train), each received by the polling thread after an empty poll, so by
    // `recvmsg`. The slack is what counted races add, not the code path's choice:
    // - a progress thread's 1 ms check may find an ACK still deferred (this thread not yet
    //   at its next post: descheduled, or polling the other end) and send it alone: one
    //   more datagram, after which the message may come by `recvmmsg`;
    // - a progress thread that saw no poll for 500 µs takes the socket back and receives
    //   a message itself (not the polling thread's datagram; its ACK leaves at once, alone).
    assert!(
        polled <= 2 * N + flushes,
        "{polled} datagrams polled in {N} round trips, {flushes} flushes"
    );
    let batched = polled - single;
    assert!(
        batched <= flushes + by_progress + 2,
        "{batched} of the polling thread's datagrams came by recvmmsg ({flushes} flushes, {by_progress} \
         received by progress threads)"
    );
    // Session 13's code: 0 of them recvmsg.
    assert!(single > 0);
}

/// The receive path hands a GSO/GRO train's run of packets for one QP to it under one lock
/// and finds the QP without a look-up in the device's map once it has received for it
/// (issue 13, session 17): a stream of 64-octet Writes (trains of tens of packets) takes
/// the responder's QP lock about once per datagram, not once per packet as before, and
/// looks a QP up a bounded number of times, not once per drain. Every packet is still
/// checked (ICRC, PSN, rkey: C3, IBA vol. 1 §9.7.4.1.5): `icrc_err` 0, no NAK, every Write
/// completes in order with success.
#[test]
fn a_write_train_is_placed_under_one_qp_lock_c3() {
    let (x, y) = pair("127.77.21.9", "127.77.21.10");
    let mut n = 0;
    write_rounds(&x, &y, 4, &mut n); // warm-up
    let names = ["rcvd_pkts", "rx_datagrams", "rx_qp_locks", "rx_qp_lookups"];
    let at = |d: &Device| names.map(|k| c(d, k));
    let (x0, y0) = (at(&x.dev), at(&y.dev));
    const ROUNDS: u64 = 40;
    write_rounds(&x, &y, ROUNDS, &mut n);
    let (x1, y1) = (at(&x.dev), at(&y.dev));
    let d = |a: [u64; 4], b: [u64; 4]| -> [u64; 4] { std::array::from_fn(|i| b[i] - a[i]) };
    let ([xp, xd, xl, xk], [yp, yd, yl, yk]) = (d(x0, x1), d(y0, y1));
    eprintln!(
        "{} Writes: responder {yp} packets in {yd} datagrams, {yl} QP locks, {yk} look-ups; \
         requester {xp} packets in {xd} datagrams, {xl} QP locks, {xk} look-ups",
        ROUNDS * 64
    );
    assert!(yp >= ROUNDS * 64, "every Write arrived: {yp} packets");
    // One lock per datagram at most (a train's packets are all for the one QP).
    assert!(yl <= yd, "{yl} QP locks for {yd} datagrams ({yp} packets)");
    assert!(xl <= xd, "{xl} QP locks for {xd} datagrams ({xp} packets)");
    // Trains: 64 Writes per post leave in a few GSO trains (not a lock per packet).
    assert!(yl * 4 <= yp, "{yl} QP locks for {yp} packets");
    // The test thread, the two progress threads: each looks a QP up once, then finds it in
    // its cache (bounded, not per drain or per datagram).
    assert!(xk + yk <= 8, "{xk} + {yk} QP look-ups for {} datagrams", xd + yd);
    assert_eq!(c(&x.dev, "icrc_err") + c(&y.dev, "icrc_err"), 0);
    assert_eq!(c(&x.dev, "rcvd_seq_err") + c(&y.dev, "rcvd_seq_err"), 0);
}
