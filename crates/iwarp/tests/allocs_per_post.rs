//! Issue 18, busy-poll latency: what a small Send costs the posting thread in
//! heap allocations, counted rather than timed. `post_send` frames the message
//! and writes it to the socket at once (`writev`); its gather list is built on
//! the stack for a latency-sized message and the list of slots a write
//! completed is kept between writes. Session 13: `post_send_one` hands the work
//! request to the send queue without copying it, and the resolved scatter/gather
//! list of the last message is kept for the next, so a post in a loop allocates
//! nothing (only the queues' first growth: 8 in 300 posts). Before, each post
//! allocated the work request's copy and the resolved list (two, session 12); before
//! that also two gather lists and the slot list (five).
//!
//! Counted per thread (a counting global allocator with a thread-local count)
//! and only inside `post_send_one`, so what the progress thread does meanwhile
//! is not counted. Its own test binary (it installs the global allocator).

use std::time::Duration;
use verbs::*;

mod pair;
use pair::{T, pair};

// The calling thread's allocations: testsupport's counting allocator.
testsupport::counting_allocator!();
use testsupport::alloc::thread_allocs as allocs;

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait(Some(T)).expect("a completion within the timeout")
}

/// RDMAP-SND-01: a loop of 8-octet Sends, no allocation per post.
#[test]
fn an_eight_octet_send_allocates_nothing_per_post_on_the_posting_thread_rdmap_snd_01() {
    const SENDS: u64 = 300;
    let p = pair();
    let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let recv = |id| RecvWr {
        wr_id: id,
        sg_list: vec![mb.sge(0, 64)],
    };
    std::thread::sleep(Duration::from_millis(20));
    let mut counted = 0;
    for i in 1..=SENDS {
        p.b.post_recv(&[recv(i)]).unwrap();
        let wr = SendWr::new(i, WrOpcode::Send, vec![ma.sge(0, 8)]);
        let before = allocs();
        p.a.post_send_one(wr).unwrap();
        counted += allocs() - before;
        assert_eq!(wait(&p.cq_a).opcode, WcOpcode::Send);
        let wc = wait(&p.cq_b);
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (i, WcStatus::Success, 8));
    }
    eprintln!("{counted} allocations in {SENDS} post_send calls");
    // Bound: one in ten posts (the first growth of the queues); two per post before.
    assert!(
        counted <= SENDS / 10,
        "{counted} allocations in {SENDS} posts (bound {})",
        SENDS / 10
    );
}
