//! One buffer registered in two protection domains of two devices
//! (`ProtectionDomain::reg_mr_shared`), as an SMC-R link group's second link needs: the
//! RMB and the send buffer are the same memory on both links, each link with its own keys
//! (RFC 7609 §3.3; requirements A4.7, A4.8, D1 in ../shared/requirements/smcr-ipoibcm.md).
//! A peer writes through either key and the bytes land in the one buffer; deregistering one
//! region revokes its keys only, the other keeps working and the memory stays alive.
//! Addresses 127.77.91.x are this file's.

use std::time::Duration;

use verbs::provider::DeviceProviderExt;
use verbs::*;

const T: Duration = Duration::from_secs(20);

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

fn side(addr: &str) -> Side {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("name", format!("rxe_{addr}"));
    let dev = roce::RoceFactory.open(&opts).expect("open a RoCEv2 device");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    Side { dev, pd, cq }
}

fn qp(s: &Side) -> QueuePair {
    s.pd.create_qp(QpInit::new(QpType::Rc, &s.cq)).unwrap()
}

/// Moves `a` (on device `da`) and `b` to RTS, connected to each other.
fn connect(a: &QueuePair, da: &Device, b: &QueuePair, db: &Device) {
    for (q, peer, dpeer) in [(a, b, db), (b, a, da)] {
        q.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
        q.modify_qp(&QpAttr::rtr(RtrAttr {
            ah_attr: AhAttr::to_gid(dpeer.query_gid(1, 0).unwrap()),
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: peer.qp_num(),
            rq_psn: peer.qp_num() & 0xff_ffff,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
        }))
        .unwrap();
        q.modify_qp(&QpAttr::rts(RtsAttr {
            sq_psn: q.qp_num() & 0xff_ffff,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }))
        .unwrap();
    }
}

/// RDMA Write of `data` from `src` through `qp` into the peer's region `rkey`/`addr`.
fn write(qp: &QueuePair, cq: &CompletionQueue, src: &MemoryRegion, data: &[u8], rkey: u32, addr: u64) -> WcStatus {
    src.write(0, data).unwrap();
    let remote = RemoteAddr { addr, rkey };
    qp.post_send_one(SendWr::new(
        7,
        WrOpcode::RdmaWrite { remote },
        vec![src.sge(0, data.len() as u32)],
    ))
    .unwrap();
    cq.wait(Some(T)).expect("write completion").status
}

#[test]
fn one_buffer_two_devices_two_keys_a4_7() {
    // The "server": one buffer on two devices (its two links); the "client" has a QP to each.
    let s1 = side("127.77.91.1");
    let s2 = side("127.77.91.2");
    let c1 = side("127.77.91.3");
    let c2 = side("127.77.91.4");
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let rmb1 = s1.pd.reg_mr(64 * 1024, rights).unwrap();
    let rmb2 = s2.pd.reg_mr_shared(&rmb1, rights).unwrap();
    assert_ne!(rmb1.rkey(), rmb2.rkey(), "each registration has its own keys");
    assert_eq!(rmb1.len(), rmb2.len());
    assert!(
        Arc::ptr_eq(rmb1.buffer().unwrap(), rmb2.buffer().unwrap()),
        "one memory"
    );
    // The key of one device means nothing on the other.
    assert!(
        s2.dev
            .mem_table()
            .verify(rmb1.rkey(), s2.pd.id(), 0, rmb1.addr(), 1, Access::REMOTE_WRITE)
            .is_err()
    );

    let (qs1, qs2, qc1, qc2) = (qp(&s1), qp(&s2), qp(&c1), qp(&c2));
    connect(&qs1, &s1.dev, &qc1, &c1.dev);
    connect(&qs2, &s2.dev, &qc2, &c2.dev);
    let src1 = c1.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let src2 = c2.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();

    // A Write through each link's key lands in the one buffer, seen through both regions.
    assert_eq!(
        write(&qc1, &c1.cq, &src1, b"link one", rmb1.rkey(), rmb1.addr()),
        WcStatus::Success
    );
    assert_eq!(
        write(&qc2, &c2.cq, &src2, b"link two", rmb2.rkey(), rmb2.addr() + 100),
        WcStatus::Success
    );
    assert_eq!(rmb2.to_vec(0, 8).unwrap(), b"link one");
    assert_eq!(rmb1.to_vec(100, 8).unwrap(), b"link two");

    // Deregistering the first region revokes its key; the second goes on working and the
    // memory is still there.
    let (old_rkey, old_addr) = (rmb1.rkey(), rmb1.addr());
    drop(rmb1);
    assert_eq!(
        write(&qc2, &c2.cq, &src2, b"after dereg", rmb2.rkey(), rmb2.addr() + 200),
        WcStatus::Success
    );
    assert_eq!(rmb2.to_vec(200, 11).unwrap(), b"after dereg");
    assert_eq!(rmb2.to_vec(0, 8).unwrap(), b"link one");
    assert!(
        s1.dev
            .mem_table()
            .verify(old_rkey, s1.pd.id(), 0, old_addr, 1, Access::REMOTE_WRITE)
            .is_err(),
        "the dropped region's key is revoked"
    );
    let st = write(&qc1, &c1.cq, &src1, b"stale key", old_rkey, old_addr);
    assert_ne!(st, WcStatus::Success, "a Write through the revoked key fails");
}

#[test]
fn fast_register_region_cannot_be_shared() {
    let s = side("127.77.91.5");
    let fr = s.pd.alloc_mr(4096).unwrap();
    let e = s.pd.reg_mr_shared(&fr, Access::LOCAL_WRITE).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(InvalidArg::NoMemory)), "{e}");
    // The rights rule of reg_mr holds here too.
    let mr = s.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    assert!(s.pd.reg_mr_shared(&mr, Access::REMOTE_WRITE).is_err());
}

use std::sync::Arc;
