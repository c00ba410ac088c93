//! End-to-end over real loopback TCP sockets: two QPs of our own provider.
//! Covers RDMAP-SND-01/03, RDMAP-WR-02, RDMAP-RD-01/04/08, RDMAP-ORD-15,
//! RDMAP-SND-06, RFC 7306 atomics and immediate data, and Terminate on a bad STag.

use verbs::*;

mod pair;

use pair::*;

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait(Some(T)).expect("completion within timeout")
}

#[test]
fn send_recv_write_read_rdmap_snd_01_wr_02_rd_01() {
    let p = pair();
    let ma = p.pd.reg_mr(1 << 16, Access::all_remote()).unwrap();
    let mb = p.pd.reg_mr(1 << 16, Access::all_remote()).unwrap();
    // Send -> Recv.
    p.b.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: vec![mb.sge(0, 1024)],
    }])
    .unwrap();
    ma.write(0, b"ping").unwrap();
    p.a.post_send_one(SendWr::new(1, WrOpcode::Send, vec![ma.sge(0, 4)]))
        .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::Send));
    let wc = wait(&p.cq_b);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 4)
    );
    assert_eq!(mb.to_vec(0, 4).unwrap(), b"ping");
    // Zero-length Send consumes a receive (RDMAP-SND-01).
    p.b.post_recv(&[RecvWr {
        wr_id: 8,
        sg_list: vec![mb.sge(0, 16)],
    }])
    .unwrap();
    p.a.post_send_one(SendWr::new(2, WrOpcode::Send, vec![])).unwrap();
    assert_eq!(wait(&p.cq_a).status, WcStatus::Success);
    let wc = wait(&p.cq_b);
    assert_eq!((wc.wr_id, wc.byte_len), (8, 0));
    // Write: placed, no receive consumed (RDMAP-WR-02).
    ma.write(100, b"written!").unwrap();
    let remote = RemoteAddr {
        addr: mb.addr() + 200,
        rkey: mb.rkey(),
    };
    p.a.post_send_one(SendWr::new(3, WrOpcode::RdmaWrite { remote }, vec![ma.sge(100, 8)]))
        .unwrap();
    assert_eq!(wait(&p.cq_a).status, WcStatus::Success);
    // Read it back from b into a (also orders after the Write, RDMAP-ORD-12).
    p.a.post_send_one(SendWr::new(4, WrOpcode::RdmaRead { remote }, vec![ma.sge(1000, 8)]))
        .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (4, WcStatus::Success, WcOpcode::RdmaRead, 8)
    );
    assert_eq!(ma.to_vec(1000, 8).unwrap(), b"written!");
    assert!(p.cq_b.poll_one().is_none());
}

#[test]
fn atomics_and_immediate_rfc7306() {
    let p = pair();
    let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    mb.write(64, &10u64.to_ne_bytes()).unwrap();
    let remote = RemoteAddr {
        addr: mb.addr() + 64,
        rkey: mb.rkey(),
    };
    p.a.post_send_one(SendWr::new(
        1,
        WrOpcode::AtomicFetchAdd { remote, add: 5 },
        vec![ma.sge(0, 8)],
    ))
    .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::FetchAdd));
    assert_eq!(ma.to_vec(0, 8).unwrap(), 10u64.to_ne_bytes());
    assert_eq!(mb.to_vec(64, 8).unwrap(), 15u64.to_ne_bytes());
    p.a.post_send_one(SendWr::new(
        2,
        WrOpcode::AtomicCmpSwap {
            remote,
            compare: 15,
            swap: 99,
        },
        vec![ma.sge(8, 8)],
    ))
    .unwrap();
    assert_eq!(wait(&p.cq_a).status, WcStatus::Success);
    assert_eq!(ma.to_vec(8, 8).unwrap(), 15u64.to_ne_bytes());
    assert_eq!(mb.to_vec(64, 8).unwrap(), 99u64.to_ne_bytes());
    // Write with immediate = Write + Immediate Data; the peer sees RecvRdmaWithImm.
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: vec![],
    }])
    .unwrap();
    ma.write(100, b"abc").unwrap();
    let r2 = RemoteAddr {
        addr: mb.addr() + 300,
        rkey: mb.rkey(),
    };
    p.a.post_send_one(SendWr::new(
        3,
        WrOpcode::RdmaWriteWithImm {
            remote: r2,
            imm_data: 0xfeed,
        },
        vec![ma.sge(100, 3)],
    ))
    .unwrap();
    assert_eq!(wait(&p.cq_a).status, WcStatus::Success);
    let wc = wait(&p.cq_b);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm_data),
        (9, WcOpcode::RecvRdmaWithImm, Some(0xfeed))
    );
    assert_eq!(mb.to_vec(300, 3).unwrap(), b"abc");
}

#[test]
fn read_bad_stag_gets_terminate_and_flush() {
    let p = pair();
    let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let bogus = RemoteAddr {
        addr: 0x1000,
        rkey: 0xdead_be00,
    };
    // Both in one post, so the Send is queued behind the Read (RDMAP-ORD-15).
    p.a.post_send(&[
        SendWr::new(1, WrOpcode::RdmaRead { remote: bogus }, vec![ma.sge(0, 8)]),
        SendWr::new(2, WrOpcode::Send, vec![ma.sge(0, 8)]),
    ])
    .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemAccessErr));
    assert_eq!(wc.vendor_err, 0x00_01_00, "RDMAP / remote protection / invalid STag");
    // The Send completes after the Read (posting order); it already left
    // before the Terminate came back, so it may have succeeded.
    let wc = wait(&p.cq_a);
    assert_eq!(wc.wr_id, 2);
    assert!(matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr));
    let ev = p.a.get_event(Some(T)).unwrap();
    assert!(
        matches!(ev, CmEvent::ErrorReceived(ref d)
            if d.downcast_ref::<iwarp::TerminateInfo>().is_some_and(|t| (t.layer, t.etype, t.code) == (0, 1, 0))),
        "{ev:?}"
    );
    assert!(matches!(p.b.get_event(Some(T)), Some(CmEvent::ErrorSent(_))));
    assert_eq!(p.a.state(), QpState::Err);
}

#[test]
fn large_write_and_read_verified_with_crc() {
    for crc in [false, true] {
        let p = pair_with(
            iwarp::IwarpConfig {
                crc,
                ..Default::default()
            },
            false,
        );
        let len = 4 << 20;
        let ma = p.pd.reg_mr(len, Access::all_remote()).unwrap();
        let mb = p.pd.reg_mr(len, Access::all_remote()).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        ma.write(0, &data).unwrap();
        let remote = RemoteAddr {
            addr: mb.addr(),
            rkey: mb.rkey(),
        };
        p.a.post_send_one(SendWr::new(
            1,
            WrOpcode::RdmaWrite { remote },
            vec![ma.sge(0, len as u32)],
        ))
        .unwrap();
        assert_eq!(wait(&p.cq_a).status, WcStatus::Success);
        ma.fill(0, len, 0).unwrap();
        p.a.post_send_one(SendWr::new(
            2,
            WrOpcode::RdmaRead { remote },
            vec![ma.sge(0, len as u32)],
        ))
        .unwrap();
        let wc = wait(&p.cq_a);
        assert_eq!((wc.status, wc.byte_len as usize), (WcStatus::Success, len));
        assert!(ma.to_vec(0, len).unwrap() == data, "crc={crc}");
        assert!(mb.to_vec(0, len).unwrap() == data);
    }
}

#[test]
fn peer_to_peer_each_rtr_type_rfc6581() {
    use iwarp::engine::Rtr;
    for rtr in [Rtr::Write, Rtr::Read, Rtr::Send] {
        let p = pair_with(
            iwarp::IwarpConfig {
                p2p: Some(vec![rtr]),
                ..Default::default()
            },
            false,
        );
        let ma = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
        let mb = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
        // The RTR was consumed silently: the first real Send lands in the first receive.
        p.b.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: vec![mb.sge(0, 64)],
        }])
        .unwrap();
        ma.write(0, b"after rtr").unwrap();
        p.a.post_send_one(SendWr::new(1, WrOpcode::Send, vec![ma.sge(0, 9)]))
            .unwrap();
        assert_eq!(wait(&p.cq_a).status, WcStatus::Success, "{rtr:?}");
        let wc = wait(&p.cq_b);
        assert_eq!((wc.wr_id, wc.byte_len), (1, 9), "{rtr:?}");
        assert_eq!(mb.to_vec(0, 9).unwrap(), b"after rtr");
        assert!(
            p.cq_a.poll_one().is_none(),
            "the RTR's own completion is not surfaced ({rtr:?})"
        );
    }
}

#[test]
fn a_busy_poller_that_goes_away_leaves_no_stall() {
    // The application busy-polls B's CQ long enough for B's QP to mute the
    // progress thread (NAPI-style), then stops polling without going through
    // a blocking wait. A Read from A must still be answered by B: the
    // progress thread takes over once the poller is gone.
    let p = pair();
    let mb = p.pd.reg_mr(4096, Access::all_remote()).unwrap();
    mb.write(0, b"answered").unwrap();
    let ma = p.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_millis(5) {
        assert!(p.cq_b.poll_one().is_none());
    }
    std::thread::sleep(std::time::Duration::from_millis(2));
    let remote = RemoteAddr {
        addr: mb.addr(),
        rkey: mb.rkey(),
    };
    p.a.post_send_one(SendWr::new(1, WrOpcode::RdmaRead { remote }, vec![ma.sge(0, 8)]))
        .unwrap();
    // Sleep-wait only: nobody polls B.
    let wc = p
        .cq_a
        .wait_spin(std::time::Duration::ZERO, Some(T))
        .expect("the Read completes");
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(ma.to_vec(0, 8).unwrap(), b"answered");
}
