//! Issue 13 (`--events` latency on RoCEv2), counted rather than timed: an application
//! thread asleep in a CQ wait ([`CompletionQueue::wait_spin`] with no spin) sleeps in
//! `poll(2)` on its device's UDP socket and receives what arrives itself (the CQ's inline
//! wait, `Progress::wait_fd`, as the iWARP provider's of issue 18), so a message costs the
//! waiting thread one wake-up and needs no hand-off from the device's progress thread.
//! Before, the progress thread woke for the datagram, received it, and woke the waiter
//! through the CQ's condition variable: every completion came through the CQ (`notifies`).
//!
//! What is counted is decided by the code path: which thread received each message
//! (inline wake-ups against wake-ups through the CQ) and how often each waiting thread
//! blocked (its own voluntary context switches, `RUSAGE_THREAD`: one `poll(2)` per message,
//! plus a lock it found held now and then).
//!
//! C3 of ../shared/requirements/smcr-ipoibcm.md (RC Send; "a successful send-queue
//! completion means the responder ACKed").

use std::time::Duration;
use verbs::*;

#[path = "common/pair.rs"]
mod pair;
use pair::{End, PairOpts, rc_pair};

const T: Duration = Duration::from_secs(20);

fn pair(a: &str, b: &str) -> (End, End) {
    rc_pair(
        a,
        b,
        &PairOpts {
            cq_depth: 256,
            mr_len: 4096,
            psn: 3,
            timeout: 18,
            dev_opts: &[],
        },
    )
}

/// Voluntary context switches of the calling thread so far: one each time it blocked.
fn my_switches() -> u64 {
    // SAFETY: getrusage writes only the rusage struct it is given, which lives on the stack.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut ru), 0);
        ru
    };
    ru.ru_nvcsw as u64
}

fn recv_again(e: &End, id: u64) {
    e.qp.post_recv(&[RecvWr {
        wr_id: id,
        sg_list: vec![e.mr.sge(0, 64)],
    }])
    .unwrap()
}

/// Sleeps on `cq` as `softrdma bench --lat --events` does (no busy polling).
fn wait(cq: &CompletionQueue) -> WorkCompletion {
    let wc = cq.wait_spin(Duration::ZERO, Some(T)).expect("a completion within T");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    wc
}

#[test]
fn events_ping_pong_receives_in_the_waiting_thread() {
    const ROUND_TRIPS: u64 = 300;
    let (a, b) = pair("127.0.94.1", "127.0.94.2");
    recv_again(&a, 0);
    recv_again(&b, 0);
    let in0 = roce::engine::inline_wakeups();
    let notifies0 = a.cq.notifies() + b.cq.notifies();
    let (sw_a, sw_b) = std::thread::scope(|scope| {
        let h = scope.spawn(|| {
            let sw0 = my_switches();
            // The ACK of b's reply rides behind a's next Send: b may see that Send's
            // receive completion before its own send completion.
            let (mut recvs, mut sends) = (0, 0);
            while recvs < ROUND_TRIPS || sends < ROUND_TRIPS {
                let wc = wait(&b.cq);
                match wc.opcode {
                    WcOpcode::Recv => {
                        assert_eq!(wc.byte_len, 8);
                        recvs += 1;
                        recv_again(&b, recvs);
                        b.qp.post_send(&[SendWr::new(recvs, WrOpcode::Send, vec![b.mr.sge(0, 8)])])
                            .unwrap();
                    }
                    WcOpcode::Send => sends += 1,
                    other => panic!("unexpected completion {other:?}"),
                }
            }
            my_switches() - sw0
        });
        let sw0 = my_switches();
        for i in 1..=ROUND_TRIPS {
            a.mr.write(0, &i.to_le_bytes()).unwrap();
            a.qp.post_send(&[SendWr::new(i, WrOpcode::Send, vec![a.mr.sge(0, 8)])])
                .unwrap();
            let (mut got_recv, mut got_send) = (false, false);
            while !(got_recv && got_send) {
                let wc = wait(&a.cq);
                match wc.opcode {
                    WcOpcode::Send => got_send = true,
                    WcOpcode::Recv => {
                        assert_eq!(a.mr.to_vec(0, 8).unwrap(), i.to_le_bytes(), "echo of round trip {i}");
                        recv_again(&a, i);
                        got_recv = true;
                    }
                    other => panic!("unexpected completion {other:?}"),
                }
            }
        }
        (my_switches() - sw0, h.join().unwrap())
    });
    let messages = 2 * ROUND_TRIPS;
    let inline = roce::engine::inline_wakeups() - in0;
    let notifies = a.cq.notifies() + b.cq.notifies() - notifies0;
    eprintln!(
        "{messages} messages: {inline} inline wake-ups, {notifies} wake-ups through the CQ, \
         voluntary context switches of the waiting threads {sw_a} + {sw_b}"
    );
    // The receivers received themselves: the datagram woke the thread asleep on the
    // socket, not the progress thread (which would deliver through the CQ). Slack for a
    // waiter descheduled between two waits for longer than the progress thread's 500 µs
    // busy window on a loaded machine, after which it takes the socket back.
    assert!(
        inline >= messages - messages / 4,
        "{inline} inline wake-ups for {messages} messages"
    );
    assert!(
        notifies <= messages / 4,
        "{notifies} of {messages} completions woke their waiter through the CQ"
    );
    // Each waiting thread blocks about once per message it waits for (a's ACK usually
    // rides with b's reply: one datagram, one wake-up); slack for a QP lock found held.
    assert!(
        sw_a + sw_b <= 2 * messages,
        "{} voluntary context switches of the waiters for {messages} messages",
        sw_a + sw_b
    );
}

/// After an inline wait the progress thread takes the socket back: a passive Read
/// responder answers, and a receiver that sleeps on completion events (which read no
/// socket) gets its message.
#[test]
fn the_progress_thread_takes_the_socket_back_when_the_waiter_leaves() {
    let (a, b) = pair("127.0.94.3", "127.0.94.4");
    b.mr.write(100, b"remote bytes").unwrap();
    for round in 0..10u64 {
        recv_again(&b, round);
        let waiter = std::thread::scope(|s| {
            let h = s.spawn(|| wait(&b.cq));
            std::thread::sleep(Duration::from_millis(2));
            a.qp.post_send(&[SendWr::new(round, WrOpcode::Send, vec![a.mr.sge(0, 8)])])
                .unwrap();
            assert_eq!(wait(&a.cq).opcode, WcOpcode::Send);
            h.join().unwrap()
        });
        assert_eq!(waiter.opcode, WcOpcode::Recv);
        a.qp.post_send(&[SendWr::new(
            1000 + round,
            WrOpcode::RdmaRead {
                remote: RemoteAddr {
                    addr: b.mr.addr() + 100,
                    rkey: b.mr.rkey(),
                },
            },
            vec![a.mr.sge(200, 12)],
        )])
        .unwrap();
        let wc = wait(&a.cq);
        assert_eq!(
            (wc.opcode, wc.wr_id),
            (WcOpcode::RdmaRead, 1000 + round),
            "round {round}"
        );
        assert_eq!(a.mr.to_vec(200, 12).unwrap(), b"remote bytes");
        recv_again(&b, 500 + round);
        a.qp.post_send(&[SendWr::new(round, WrOpcode::Send, vec![a.mr.sge(0, 8)])])
            .unwrap();
        assert_eq!(wait(&a.cq).opcode, WcOpcode::Send);
        let t0 = std::time::Instant::now();
        let wc = loop {
            b.cq.req_notify(false);
            if !b.cq.is_empty() {
                let mut v = Vec::new();
                assert_eq!(b.cq.poll(&mut v, 1), 1);
                break v.pop().unwrap();
            }
            assert!(t0.elapsed() < T, "round {round}: the message never arrived");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!((wc.opcode, wc.wr_id), (WcOpcode::Recv, 500 + round), "round {round}");
    }
}
