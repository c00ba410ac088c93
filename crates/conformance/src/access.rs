//! Remote access checks whose outcome is the same on every transport: a
//! request without the right, or outside the region, fails at the requester
//! with `RemAccessErr` (iWARP: the Terminate of RDMAP-SEC-03/05; InfiniBand:
//! the NAK "remote access error" of IBA vol. 1 ch. 9.7, C3 of
//! smcr-ipoibcm.md), the
//! responder's memory is not touched, the failed QP ends in Err, and another
//! pair on the same devices keeps working. The provider-specific evidence (the
//! Terminate's layer/type/code, the NAK syndrome on the wire) is checked in
//! the providers' own tests (crates/iwarp/tests/access.rs, the RoCE
//! misbehaving-peer tests).

use crate::{Caps, Fixture, Pair, T, remote};
use verbs::*;

const LEN: usize = 4096;

/// A victim pair and a bystander pair on the same two devices.
struct World {
    victim: Pair,
    bystander: (QueuePair, QueuePair),
    /// Requester-side scratch.
    la: MemoryRegion,
}

fn world(fx: &dyn Fixture) -> World {
    let (ea, eb) = fx.ends(&fx.variants()[0], 256);
    let mut qps = fx.connect(&ea, &eb, 2, &Caps::default());
    let bystander = qps.pop().unwrap();
    let (a, b) = qps.pop().unwrap();
    let la = ea.pd.reg_mr(LEN, Access::all_remote()).unwrap();
    World {
        victim: Pair { ea, eb, a, b },
        bystander,
        la,
    }
}

/// The bystander pair still carries a Write and a Read back.
fn assert_bystander_works(w: &World) {
    let (a, _b) = &w.bystander;
    let (ea, eb) = (&w.victim.ea, &w.victim.eb);
    // The bystander shares the victim's CQs; drain what the victim left.
    while ea.cq.poll_one().is_some() {}
    let src = ea.pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = eb.pd.reg_mr(64, Access::all_remote()).unwrap();
    src.write(0, b"still here").unwrap();
    let r = remote(&dst, 0);
    let wrs = [
        SendWr::new(500, WrOpcode::RdmaWrite { remote: r }, vec![src.sge(0, 10)]),
        SendWr::new(501, WrOpcode::RdmaRead { remote: r }, vec![src.sge(32, 10)]),
    ];
    a.post_send(&wrs).unwrap();
    for id in [500, 501] {
        let wc = ea.cq.wait(Some(T)).expect("bystander completion");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
    assert_eq!(src.to_vec(32, 10).unwrap(), b"still here");
    assert_eq!(a.state(), QpState::Rts);
}

/// The victim's requester sees `RemAccessErr` for the request (or for the
/// Read posted right behind a Write: a Write may complete before the
/// responder's refusal comes back on iWARP), and ends in Err.
fn assert_refused(w: &World, ids: &[u64]) {
    let mut refused = false;
    for &id in ids {
        let wc = w.victim.wait_a();
        assert_eq!(wc.wr_id, id, "completions in posting order: {wc:?}");
        match wc.status {
            WcStatus::RemAccessErr => refused = true,
            WcStatus::Success | WcStatus::WrFlushErr => {}
            s => panic!("unexpected status {s:?} for wr {id}"),
        }
    }
    assert!(refused, "one completion says RemAccessErr");
    let t0 = std::time::Instant::now();
    while w.victim.a.state() != QpState::Err && t0.elapsed() < T {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(w.victim.a.state(), QpState::Err);
}

/// Region at the responder with `access`, filled with 0x5a.
fn target(w: &World, access: Access) -> MemoryRegion {
    let mr = w.victim.eb.pd.reg_mr(LEN, access).unwrap();
    mr.fill(0, LEN, 0x5a).unwrap();
    mr
}

fn read_refused(fx: &dyn Fixture, access: Access, off: isize, len: u32) {
    let w = world(fx);
    let mr = target(&w, access);
    let r = RemoteAddr {
        addr: mr.addr().wrapping_add_signed(off as i64),
        rkey: mr.rkey(),
    };
    w.victim
        .a
        .post_send_one(SendWr::new(1, WrOpcode::RdmaRead { remote: r }, vec![w.la.sge(0, len)]))
        .unwrap();
    assert_refused(&w, &[1]);
    assert_bystander_works(&w);
}

fn write_refused(fx: &dyn Fixture, access: Access, off: isize, len: u32) {
    let w = world(fx);
    let mr = target(&w, access);
    let good = w.victim.eb.pd.reg_mr(64, Access::all_remote()).unwrap();
    let r = RemoteAddr {
        addr: mr.addr().wrapping_add_signed(off as i64),
        rkey: mr.rkey(),
    };
    w.la.fill(0, LEN, 0xee).unwrap();
    w.victim
        .a
        .post_send(&[
            SendWr::new(1, WrOpcode::RdmaWrite { remote: r }, vec![w.la.sge(0, len)]),
            SendWr::new(
                2,
                WrOpcode::RdmaRead {
                    remote: remote(&good, 0),
                },
                vec![w.la.sge(0, 8)],
            ),
        ])
        .unwrap();
    assert_refused(&w, &[1, 2]);
    assert!(
        mr.to_vec(0, LEN).unwrap().iter().all(|&b| b == 0x5a),
        "the refused Write placed nothing"
    );
    assert_bystander_works(&w);
}

/// Read of a region without REMOTE_READ (RDMAP-SEC-05; IBA ch. 9.7 remote access error).
pub fn read_without_remote_read(fx: &dyn Fixture) {
    read_refused(fx, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0, 64);
}

/// Write to a region without REMOTE_WRITE (RDMAP-SEC-05).
pub fn write_without_remote_write(fx: &dyn Fixture) {
    write_refused(fx, Access::LOCAL_WRITE | Access::REMOTE_READ, 0, 64);
}

/// Read past the end of the region (RDMAP-SEC-03).
pub fn read_past_end(fx: &dyn Fixture) {
    read_refused(fx, Access::all_remote(), LEN as isize - 8, 64);
}

/// Write below the base of the region (RDMAP-SEC-03).
pub fn write_below_base(fx: &dyn Fixture) {
    write_refused(fx, Access::all_remote(), -8, 64);
}

/// Fetch-and-add on a region without REMOTE_ATOMIC (RDMAP-SEC-05, RFC 7306 §8).
pub fn atomic_without_remote_atomic(fx: &dyn Fixture) {
    let w = world(fx);
    let mr = target(&w, Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE);
    w.victim
        .a
        .post_send_one(SendWr::new(
            1,
            WrOpcode::AtomicFetchAdd {
                remote: remote(&mr, 0),
                add: 1,
            },
            vec![w.la.sge(0, 8)],
        ))
        .unwrap();
    assert_refused(&w, &[1]);
    assert!(mr.to_vec(0, 8).unwrap().iter().all(|&b| b == 0x5a));
    assert_bystander_works(&w);
}
