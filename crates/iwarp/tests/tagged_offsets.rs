//! Tagged-offset bases that reveal nothing of the process layout (issue 12
//! point 7; RFC 5042 §5 threat analysis, SEC-STAG-01 spirit): `reg_mr` draws
//! a random page-aligned base per region, `reg_mr_iova` lets the caller choose
//! one (zero-based regions, as hardware offers), and every remote access check
//! (bounds RDMAP-SEC-03, 64-bit wrap RDMAP-ERR-07) holds at any base.

use std::collections::HashSet;
mod pair;

use pair::T;
use verbs::*;

/// Consecutive regions are not at a constant distance, no base is the buffer's
/// address, and every base is page-aligned and leaves room for the region
/// below 2^64 (issue 12 point 7).
#[test]
fn reg_mr_bases_are_random_not_pointers() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mrs: Vec<MemoryRegion> = (0..64)
        .map(|_| pd.reg_mr(8192, Access::all_remote()).unwrap())
        .collect();
    for mr in &mrs {
        let ptr = mr.buffer().unwrap().addr();
        assert_ne!(mr.addr(), ptr, "tagged offset base is the buffer pointer");
        assert_eq!(mr.addr() % 4096, 0, "page-aligned");
        assert_ne!(mr.addr(), 0);
        assert!(mr.addr().checked_add(mr.len() as u64).is_some());
        assert_eq!(mr.sge(100, 1).addr, mr.addr() + 100);
    }
    let diffs: HashSet<i128> = mrs
        .windows(2)
        .map(|w| w[1].addr() as i128 - w[0].addr() as i128)
        .collect();
    assert!(
        diffs.len() > 60,
        "distances between consecutive bases repeat: {diffs:?}"
    );
    let bases: HashSet<u64> = mrs.iter().map(|m| m.addr()).collect();
    assert_eq!(bases.len(), mrs.len());
}

/// `reg_mr_iova` refuses a range that wraps 2^64 and gives the chosen base.
#[test]
fn reg_mr_iova_rejects_wrap() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    assert!(matches!(
        pd.reg_mr_iova(4096, Access::LOCAL_WRITE, u64::MAX - 4095),
        Err(Error::InvalidArgument(InvalidArg::IovaWrap { .. }))
    ));
    let top = pd.reg_mr_iova(4096, Access::LOCAL_WRITE, u64::MAX - 4096).unwrap();
    assert_eq!(top.addr(), u64::MAX - 4096);
    let zero = pd.reg_mr_iova(4096, Access::LOCAL_WRITE, 0).unwrap();
    assert_eq!(zero.addr(), 0);
    assert_eq!(zero.sge(8, 4).addr, 8);
}

/// A zero-based region serves remote Writes and Reads at tagged offsets
/// 0..len, and a Read crossing its end gets `RemAccessErr` and the RDMAP
/// base-or-bounds Terminate 0/1/0x01 (RDMAP-SEC-03), as at a random base
/// (crates/iwarp/tests/access.rs).
#[test]
fn zero_based_region_remote_write_read_and_bounds() {
    let p = pair::pair_with(iwarp::IwarpConfig::default(), true);
    let pd_b = p.b.pd().clone();
    let (a, b, cq_a) = (p.a, p.b, p.cq_a);
    let target = pd_b
        .reg_mr_iova(
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            0,
        )
        .unwrap();
    let local = a.pd().reg_mr(8192, Access::LOCAL_WRITE).unwrap();
    local.write(0, b"zero-based write").unwrap();
    a.post_send_one(SendWr::new(
        1,
        WrOpcode::RdmaWrite {
            remote: RemoteAddr {
                addr: 100,
                rkey: target.rkey(),
            },
        },
        vec![local.sge(0, 16)],
    ))
    .unwrap();
    let wc = cq_a.wait(Some(T)).unwrap();
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    a.post_send_one(SendWr::new(
        2,
        WrOpcode::RdmaRead {
            remote: RemoteAddr {
                addr: 100,
                rkey: target.rkey(),
            },
        },
        vec![local.sge(4096, 16)],
    ))
    .unwrap();
    let wc = cq_a.wait(Some(T)).unwrap();
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    assert_eq!(local.to_vec(4096, 16).unwrap(), b"zero-based write");
    assert_eq!(target.to_vec(100, 16).unwrap(), b"zero-based write");
    // One byte past the end: the responder refuses it.
    a.post_send_one(SendWr::new(
        3,
        WrOpcode::RdmaRead {
            remote: RemoteAddr {
                addr: 4090,
                rkey: target.rkey(),
            },
        },
        vec![local.sge(4096, 7)],
    ))
    .unwrap();
    let wc = cq_a.wait(Some(T)).unwrap();
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::RemAccessErr), "{wc:?}");
    assert_eq!(wc.vendor_err, 0x00_01_01, "{wc:?}");
    loop {
        match b.get_event(Some(T)) {
            Some(CmEvent::ErrorSent(d)) => {
                let t = d.downcast_ref::<iwarp::TerminateInfo>().expect("an iWARP Terminate");
                assert_eq!((t.layer, t.etype, t.code), (0, 1, 0x01), "{t}");
                break;
            }
            Some(CmEvent::Disconnected | CmEvent::ConnectionError(_)) => continue,
            other => panic!("expected TerminateSent, got {other:?}"),
        }
    }
}
