//! iWARP-only end-to-end behaviour over real loopback TCP sockets: the
//! Terminate a Read of a bad STag gets (RDMAP-ORD-15, RDMAP-RD-04/08) and
//! RFC 6581 peer-to-peer RTRs. The verbs operations every provider shares
//! (Send, Write, Read, atomics, immediate data, large transfers) are in the
//! conformance suite (crates/conformance, tests/iwarp.rs).

use verbs::*;

mod pair;

use pair::*;

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait(Some(T)).expect("completion within timeout")
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
