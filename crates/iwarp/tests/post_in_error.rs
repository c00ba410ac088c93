//! Posting to a QP in the Error state (issue 12 point 9): the work requests
//! are accepted and complete with `WrFlushErr` behind the completion that
//! failed, as IBTA, rdma-core and Linux siw do, so an application learns why
//! its QP failed (the failed completion with its Terminate cause, then the
//! `TerminateReceived` event) whatever it calls first. Requirement IDs:
//! RDMAP-ERR-07 (the refused Read), RDMAP-SEC-01 (invalid STag), VERBS flush
//! semantics of the catalogue's matrix A.4.6 ("then closes that connection").
//!
//! The tests wait for the QP to be in Err (its `TerminateReceived` event)
//! before they post, so no thread schedule can change what they see.

mod pair;

use iwarp::TerminateInfo;
use pair::T;
use verbs::*;

/// Two connected QPs in separate PDs (the shared `pair` module) and a region of `a`'s.
struct Pair {
    p: pair::Pair,
    local: MemoryRegion,
}

impl std::ops::Deref for Pair {
    type Target = pair::Pair;
    fn deref(&self) -> &pair::Pair {
        &self.p
    }
}

fn pair() -> Pair {
    let p = pair::pair_with(iwarp::IwarpConfig::default(), true);
    let local = p.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    Pair { p, local }
}

/// `a` Reads through an STag the peer never registered; returns once `a`
/// has the peer's Terminate (so `a` is in Err).
fn fail_with_bad_stag_read(p: &Pair) -> TerminateInfo {
    p.a.post_send_one(SendWr::new(
        7,
        WrOpcode::RdmaRead {
            remote: RemoteAddr {
                addr: 0x1000,
                rkey: 0x00ab_cd42,
            },
        },
        vec![p.local.sge(0, 64)],
    ))
    .unwrap();
    loop {
        match p.a.get_event(Some(T)) {
            Some(CmEvent::ErrorReceived(d)) => {
                assert_eq!(p.a.state(), QpState::Err);
                // the iWARP cause reaches the application as the provider's own type
                return d.downcast_ref::<TerminateInfo>().expect("an iWARP Terminate").clone();
            }
            Some(CmEvent::Disconnected | CmEvent::ConnectionError(_)) => continue,
            other => panic!("expected TerminateReceived, got {other:?}"),
        }
    }
}

/// A receive posted in Err (rping's first call after its Read failed) is
/// accepted; the CQ then gives the failed Read with its cause first and the
/// receive flushed after it.
#[test]
fn post_recv_in_error_flushes_behind_the_cause() {
    let p = pair();
    let term = fail_with_bad_stag_read(&p);
    p.a.post_recv(&[RecvWr {
        wr_id: 21,
        sg_list: vec![p.local.sge(0, 64)],
    }])
    .expect("post_recv in Err is accepted (flushed)");
    let first = p.cq_a.wait(Some(T)).unwrap();
    assert_eq!((first.wr_id, first.status), (7, WcStatus::RemAccessErr), "{first:?}");
    assert_eq!(first.vendor_err, term.vendor_err(), "{first:?} vs {term}");
    assert_eq!(
        TerminateInfo::unpack_vendor_err(first.vendor_err),
        (term.layer, term.etype, term.code)
    );
    let flushed = p.cq_a.wait(Some(T)).unwrap();
    assert_eq!(
        (flushed.wr_id, flushed.status, flushed.opcode),
        (21, WcStatus::WrFlushErr, WcOpcode::Recv),
        "{flushed:?}"
    );
}

/// Sends posted in Err, signaled or not, complete in order with
/// `WrFlushErr` and their opcode; nothing is sent.
#[test]
fn post_send_in_error_flushes_every_wr_in_order() {
    let p = pair();
    fail_with_bad_stag_read(&p);
    let first = p.cq_a.wait(Some(T)).unwrap();
    assert_eq!((first.wr_id, first.status), (7, WcStatus::RemAccessErr), "{first:?}");
    p.a.post_send(&[
        SendWr::new(31, WrOpcode::Send, vec![p.local.sge(0, 8)]),
        SendWr::new(
            32,
            WrOpcode::RdmaWrite {
                remote: RemoteAddr { addr: 0, rkey: 1 },
            },
            vec![p.local.sge(0, 8)],
        )
        .flags(SendFlags::empty()),
    ])
    .expect("post_send in Err is accepted (flushed)");
    let w1 = p.cq_a.wait(Some(T)).unwrap();
    let w2 = p.cq_a.wait(Some(T)).unwrap();
    assert_eq!(
        (w1.wr_id, w1.status, w1.opcode),
        (31, WcStatus::WrFlushErr, WcOpcode::Send)
    );
    assert_eq!(
        (w2.wr_id, w2.status, w2.opcode),
        (32, WcStatus::WrFlushErr, WcOpcode::RdmaWrite)
    );
    assert!(p.cq_a.poll_one().is_none());
}
