//! Issue 18's regression guard, counted rather than timed: a Send ping-pong
//! over loopback costs one socket `read` per message received. `post_send`
//! and `post_recv` do not read the socket, a read that returned less than it
//! asked for is not followed by one that only says `EAGAIN`, and a writable
//! epoll edge does not read. Before issue 18 each message cost five or more
//! reads (two per post, three per arrival), each one taking the socket lock
//! that softirq delivery also needs.
//!
//! Both ends sleep on completion events, so every read is one the engine
//! chose to make, not a busy poll; the count does not depend on timing or
//! load. Its own test binary, as the read counter is process-wide.

use std::time::Duration;
use verbs::*;

mod pair;
use pair::{T, next_event, pair, recv_again};

#[test]
fn send_ping_pong_reads_the_socket_once_per_message_rdmap_snd_01() {
    const ROUND_TRIPS: u64 = 300;
    let p = pair();
    let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    recv_again(&p.a, &ma, 0);
    recv_again(&p.b, &mb, 0);
    std::thread::sleep(Duration::from_millis(50)); // connection set-up's own reads settle
    let before = iwarp::engine::qp::socket_reads();
    let waits_before = iwarp::engine::qp::core_lock_waits();
    std::thread::scope(|scope| {
        // The echo side: every message received is sent back (after reposting).
        scope.spawn(|| {
            for i in 1..=ROUND_TRIPS {
                let wc = next_event(&p.cq_b);
                assert_eq!(
                    (wc.status, wc.opcode, wc.byte_len),
                    (WcStatus::Success, WcOpcode::Recv, 8)
                );
                recv_again(&p.b, &mb, i);
                p.b.post_send_one(SendWr::new(i, WrOpcode::Send, vec![mb.sge(0, 8)]))
                    .unwrap();
                assert_eq!(next_event(&p.cq_b).opcode, WcOpcode::Send);
            }
        });
        for i in 1..=ROUND_TRIPS {
            ma.write(0, &i.to_le_bytes()).unwrap();
            p.a.post_send_one(SendWr::new(i, WrOpcode::Send, vec![ma.sge(0, 8)]))
                .unwrap();
            let mut got_recv = false;
            let mut got_send = false;
            while !(got_recv && got_send) {
                let wc = next_event(&p.cq_a);
                assert_eq!(wc.status, WcStatus::Success);
                match wc.opcode {
                    WcOpcode::Send => got_send = true,
                    WcOpcode::Recv => {
                        assert_eq!(ma.to_vec(0, 8).unwrap(), i.to_le_bytes(), "echo of round trip {i}");
                        recv_again(&p.a, &ma, i);
                        got_recv = true;
                    }
                    other => panic!("unexpected completion {other:?}"),
                }
            }
        }
    });
    let reads = iwarp::engine::qp::socket_reads() - before;
    let waits = iwarp::engine::qp::core_lock_waits() - waits_before;
    let messages = 2 * ROUND_TRIPS;
    eprintln!("{reads} socket reads, {waits} waits for a QP's lock for {messages} messages");
    // A thread woken by a completion re-posts its receive (and sends) at once; the progress
    // thread that delivered the completion wakes it only after releasing the QP's lock, so the
    // post does not sleep on that lock (a futex wait, a futex wake and a second context switch
    // per message before; the slack is for an epoll edge the progress thread handles just then).
    assert!(
        waits <= messages / 20,
        "{waits} posts waited for a QP's lock in {messages} messages (issue 18: none should)"
    );
    // One read per message; a little slack for a message split across two
    // reads or an edge raised for data an earlier read already took.
    assert!(
        reads <= messages + messages / 4,
        "{reads} socket reads for {messages} messages (issue 18: one per message)"
    );
    assert!(
        reads >= messages,
        "{reads} reads cannot have received {messages} messages"
    );
}

/// The other half of reading only until a short read: a peer that sends and
/// closes at once puts the data and the end of stream behind one epoll edge;
/// the short read of the data must not leave the close unread (it raises no
/// further edge). Twenty rounds, each a new connection, so the two arrive
/// together in most of them.
#[test]
fn data_followed_at_once_by_a_close_is_seen_to_the_end_rdmap_snd_01() {
    for round in 0..20u32 {
        let p = pair();
        let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
        let mb = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
        recv_again(&p.b, &mb, 1);
        p.a.post_send_one(SendWr::new(1, WrOpcode::Send, vec![ma.sge(0, 8)]))
            .unwrap();
        p.a.disconnect();
        let wc = next_event(&p.cq_b);
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "round {round}"
        );
        assert_eq!(
            p.b.get_event(Some(T)),
            Some(CmEvent::Disconnected),
            "round {round}: the close behind the data was not seen"
        );
    }
}
