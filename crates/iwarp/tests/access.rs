//! Remote access checks over real loopback connections (issue 3): rights,
//! bounds, protection domains, connections, deregistration and invalidation.
//!
//! Every test runs two connections on one device: the *victim* pair
//! (requester `a` -> responder `b`) gets the bad access, the *bystander* pair
//! must keep working afterwards (RDMAP-SEC-10 spirit, matrix A.4.6 "then
//! closes that connection; other QPs carry on"). Each test checks
//! * the Terminate the responder sent and the requester received
//!   (`CmEvent::TerminateSent` / `CmEvent::TerminateReceived`, layer / type /
//!   code of catalogue A.1.6 and C.1.4),
//! * the requester's work completions (rdma-core status names),
//! * the responder memory it must not have touched, and
//! * the bystander pair: Send, Write and Read still succeed.
//!
//! Requirement IDs (catalogue `shared/requirements/rdmap-rpcrdma.md`):
//! RDMAP-SEC-01 (other PD), RDMAP-SEC-02 (other connection), RDMAP-SEC-03
//! (bounds, wrap), RDMAP-SEC-04 (revoked association), RDMAP-SEC-05 (rights),
//! RDMAP-SEC-07 (shared STag not remotely invalidatable), RDMAP-SND-06
//! (Send with Invalidate), RDMAP-ERR-07 (Read Request source checks), matrix
//! A.4.6 rows 8-17 and 20, SEC-STAG-01/03/04, SEC-PD-01.
//!
//! Completion status of a failed RDMA Write: the Write itself completes
//! locally once DDP has sent it (RDMAP-ORD-14), before the peer's Terminate
//! can come back, so the Write's own completion is `Success`; the error
//! reaches the application as the `TerminateReceived` event and through the
//! work request behind it. These tests post a Read right behind the Write and
//! accept either status the engine may give that Read: `RemAccessErr` naming
//! the Terminate (our engine blames the oldest outstanding request) or
//! `WrFlushErr` (what Linux siw reports for requests flushed by a Terminate).

use iwarp::TerminateInfo;
use std::time::Duration;
use verbs::provider::DeviceProviderExt;
use verbs::*;

const T: Duration = Duration::from_secs(10);

/// One connected pair: `a` is the requester, `b` the responder.
struct Pair {
    a: QueuePair,
    b: QueuePair,
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
}

fn connect(dev: &Device, pd_a: &ProtectionDomain, pd_b: &ProtectionDomain) -> Pair {
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let cq_a = dev.create_cq(256).unwrap();
    let cq_b = dev.create_cq(256).unwrap();
    let (cqb, pdb) = (cq_b.clone(), pd_b.clone());
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(T)).unwrap();
        req.accept(&pdb, QpOptions::new(&cqb).rd_atomic(8, 8)).unwrap()
    });
    let a = pd_a.connect(addr, QpOptions::new(&cq_a).rd_atomic(8, 8), T).unwrap();
    let b = server.join().unwrap();
    assert_eq!(a.get_event(Some(T)), Some(CmEvent::Established));
    assert_eq!(b.get_event(Some(T)), Some(CmEvent::Established));
    Pair { a, b, cq_a, cq_b }
}

/// A device with a victim pair and a bystander pair, each pair's two ends in
/// their own PDs (a: `pd_a`, b: `pd_b`; the bystander uses fresh PDs).
struct World {
    dev: Device,
    pd_b: ProtectionDomain,
    victim: Pair,
    bystander: Pair,
    /// Requester-side scratch region of the victim pair.
    local: MemoryRegion,
}

fn world() -> World {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let pd_a = dev.alloc_pd().unwrap();
    let pd_b = dev.alloc_pd().unwrap();
    let victim = connect(&dev, &pd_a, &pd_b);
    let bystander = connect(&dev, &dev.alloc_pd().unwrap(), &dev.alloc_pd().unwrap());
    let local = pd_a.reg_mr(8192, Access::LOCAL_WRITE).unwrap();
    World {
        dev,
        pd_b,
        victim,
        bystander,
        local,
    }
}

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait(Some(T)).expect("completion within timeout")
}

fn remote(mr: &MemoryRegion, off: u64) -> RemoteAddr {
    RemoteAddr {
        addr: mr.addr().wrapping_add(off),
        rkey: mr.rkey(),
    }
}

/// Layer / type / code packed as in `WorkCompletion::vendor_err`.
fn packed(l: u8, t: u8, c: u8) -> u32 {
    (u32::from(l) << 16) | (u32::from(t) << 8) | u32::from(c)
}

/// The iWARP Terminate cause a CM event's provider detail carries.
fn iwarp_cause(d: &verbs::ErrorDetail) -> TerminateInfo {
    d.downcast_ref::<TerminateInfo>().expect("an iWARP Terminate").clone()
}

/// The next event of `qp` that is not `Disconnected` / `ConnectionError`.
fn terminate_event(qp: &QueuePair, want_sent: bool) -> TerminateInfo {
    loop {
        match qp.get_event(Some(T)) {
            Some(CmEvent::ErrorReceived(d)) if !want_sent => return iwarp_cause(&d),
            Some(CmEvent::ErrorSent(d)) if want_sent => return iwarp_cause(&d),
            Some(CmEvent::Disconnected | CmEvent::ConnectionError(_)) => continue,
            other => panic!(
                "expected a Terminate{} event, got {other:?}",
                if want_sent { "Sent" } else { "Received" }
            ),
        }
    }
}

/// Both ends agree on the Terminate (layer, etype, code); the requester's QP is in Err.
fn assert_terminate(p: &Pair, l: u8, t: u8, c: u8) {
    let sent = terminate_event(&p.b, true);
    assert_eq!((sent.layer, sent.etype, sent.code), (l, t, c), "responder sent {sent}");
    let got = terminate_event(&p.a, false);
    assert_eq!((got.layer, got.etype, got.code), (l, t, c), "requester received {got}");
    assert!(!got.description.is_empty());
    assert_eq!(p.a.state(), QpState::Err);
}

/// The bystander pair still carries a Send, a Write and a Read.
fn assert_bystander_works(w: &World) {
    let p = &w.bystander;
    let pd_a = p.a.pd();
    let pd_b = p.b.pd();
    let ma = pd_a.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mb = pd_b
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 900,
        sg_list: vec![mb.sge(0, 64)],
    }])
    .unwrap();
    ma.write(0, b"still here").unwrap();
    p.a.post_send(&[
        SendWr::new(901, WrOpcode::Send, vec![ma.sge(0, 10)]),
        SendWr::new(
            902,
            WrOpcode::RdmaWrite {
                remote: remote(&mb, 100),
            },
            vec![ma.sge(0, 10)],
        ),
        SendWr::new(
            903,
            WrOpcode::RdmaRead {
                remote: remote(&mb, 100),
            },
            vec![ma.sge(200, 10)],
        ),
    ])
    .unwrap();
    for id in [901, 902, 903] {
        let wc = wait(&p.cq_a);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "bystander {wc:?}");
    }
    let wc = wait(&p.cq_b);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (900, WcStatus::Success, 10));
    assert_eq!(mb.to_vec(0, 10).unwrap(), b"still here");
    assert_eq!(ma.to_vec(200, 10).unwrap(), b"still here");
    assert_eq!(p.a.state(), QpState::Rts);
    assert_eq!(p.b.state(), QpState::Rts);
}

/// Posts a Read of `len` bytes from `from` on the victim pair and checks it
/// fails with `RemAccessErr` naming the Terminate (RDMAP layer, matrix rows 13-17).
fn read_fails(w: &World, from: RemoteAddr, len: u32, code: u8) {
    let p = &w.victim;
    p.a.post_send_one(SendWr::new(
        1,
        WrOpcode::RdmaRead { remote: from },
        vec![w.local.sge(0, len)],
    ))
    .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::RemAccessErr, WcOpcode::RdmaRead),
        "{wc:?}"
    );
    assert_eq!(wc.vendor_err, packed(0, 1, code), "{wc:?}");
    assert_terminate(p, 0, 1, code);
    assert_bystander_works(w);
}

/// Posts a Write of `len` bytes to `to` followed by a Read of a valid region,
/// and checks the responder's DDP Tagged Buffer Terminate (rows 8-12).
fn write_fails(w: &World, to: RemoteAddr, len: u32, code: u8, good: &MemoryRegion) {
    let p = &w.victim;
    w.local.fill(0, len as usize, 0xAB).unwrap();
    p.a.post_send(&[
        SendWr::new(1, WrOpcode::RdmaWrite { remote: to }, vec![w.local.sge(0, len)]),
        SendWr::new(
            2,
            WrOpcode::RdmaRead {
                remote: remote(good, 0),
            },
            vec![w.local.sge(4096, 8)],
        ),
    ])
    .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::RdmaWrite), "{wc:?}");
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "a Write completes once sent (RDMAP-ORD-14): {wc:?}"
    );
    let wc = wait(&p.cq_a);
    assert_eq!(wc.wr_id, 2, "{wc:?}");
    match wc.status {
        WcStatus::RemAccessErr => assert_eq!(wc.vendor_err, packed(1, 1, code), "{wc:?}"),
        WcStatus::WrFlushErr => {}
        s => panic!("Read behind the failed Write: {s:?}"),
    }
    assert_terminate(p, 1, 1, code);
    assert_bystander_works(w);
}

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

// ---- rights (RDMAP-SEC-05) -------------------------------------------------

#[test]
fn write_without_remote_write_rdmap_sec_05_row_12() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    // Matrix row 12: no DDP code for access rights; Invalid STag (A.5 #5, as siw).
    write_fails(&w, remote(&mr, 0), 64, 0x00, &good);
    assert!(mr.to_vec(0, 64).unwrap().iter().all(|&b| b == 0), "nothing placed");
}

#[test]
fn read_without_remote_read_rdmap_sec_05_row_15() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    read_fails(&w, remote(&mr, 0), 64, 0x02);
}

#[test]
fn atomic_without_remote_atomic_rdmap_sec_05() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    mr.write(0, &7u64.to_ne_bytes()).unwrap();
    let p = &w.victim;
    p.a.post_send_one(SendWr::new(
        1,
        WrOpcode::AtomicFetchAdd {
            remote: remote(&mr, 0),
            add: 1,
        },
        vec![w.local.sge(0, 8)],
    ))
    .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::RemAccessErr, WcOpcode::FetchAdd),
        "{wc:?}"
    );
    // RFC 7306 §8: the Read Request rules apply; access rights -> 0/1/0x02.
    assert_eq!(wc.vendor_err, packed(0, 1, 0x02));
    assert_terminate(p, 0, 1, 0x02);
    assert_eq!(mr.to_vec(0, 8).unwrap(), 7u64.to_ne_bytes(), "target unchanged");
    assert_bystander_works(&w);
}

// ---- bounds (RDMAP-SEC-03, RDMAP-ERR-07 c/d/e) -----------------------------

#[test]
fn read_below_base_rdmap_sec_03_row_14() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    read_fails(&w, remote(&mr, u64::MAX), 8, 0x01); // base - 1
}

#[test]
fn read_past_end_rdmap_sec_03_row_14() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    read_fails(&w, remote(&mr, 4090), 8, 0x01); // crosses the end by 2
}

#[test]
fn read_to_wrap_rdmap_err_07e_row_17() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    let from = RemoteAddr {
        addr: u64::MAX - 3,
        rkey: mr.rkey(),
    };
    read_fails(&w, from, 8, 0x04);
}

#[test]
fn write_past_end_rdmap_sec_03_row_9() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    write_fails(&w, remote(&mr, 4096 - 4), 8, 0x01, &good);
    assert!(
        mr.to_vec(4092, 4).unwrap().iter().all(|&b| b == 0),
        "no partial placement"
    );
}

#[test]
fn write_below_base_rdmap_sec_03_row_9() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    write_fails(&w, remote(&mr, u64::MAX), 8, 0x01, &good);
}

#[test]
fn write_to_wrap_rdmap_sec_03_row_11() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    let to = RemoteAddr {
        addr: u64::MAX - 3,
        rkey: mr.rkey(),
    };
    // RFC 5041 §7.2 tagged code 0x03, TO wrap.
    write_fails(&w, to, 8, 0x03, &good);
}

#[test]
fn boundary_accesses_that_must_succeed_rdmap_sec_03() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    let p = &w.victim;
    w.local.write(0, b"edge").unwrap();
    // Last 4 bytes, first 4 bytes, whole region: all inside.
    p.a.post_send(&[
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote: remote(&mr, 4092),
            },
            vec![w.local.sge(0, 4)],
        ),
        SendWr::new(
            2,
            WrOpcode::RdmaWrite { remote: remote(&mr, 0) },
            vec![w.local.sge(0, 4)],
        ),
        SendWr::new(
            3,
            WrOpcode::RdmaRead { remote: remote(&mr, 0) },
            vec![w.local.sge(4096, 4096)],
        ),
    ])
    .unwrap();
    for id in 1..=3 {
        let wc = wait(&p.cq_a);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
    assert_eq!(w.local.to_vec(4096, 4).unwrap(), b"edge");
    assert_eq!(w.local.to_vec(4096 + 4092, 4).unwrap(), b"edge");
    assert_eq!(p.a.state(), QpState::Rts);
}

// ---- protection domains and connections (RDMAP-SEC-01, -02) ---------------

#[test]
fn read_stag_of_another_pd_rdmap_sec_01_row_16() {
    let w = world();
    let other = w.dev.alloc_pd().unwrap();
    let mr = other.reg_mr(4096, RW).unwrap();
    read_fails(&w, remote(&mr, 0), 8, 0x03);
}

#[test]
fn write_stag_of_another_pd_rdmap_sec_01_row_10() {
    let w = world();
    let other = w.dev.alloc_pd().unwrap();
    let mr = other.reg_mr(4096, RW).unwrap();
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    write_fails(&w, remote(&mr, 0), 8, 0x02, &good);
    assert!(mr.to_vec(0, 8).unwrap().iter().all(|&b| b == 0));
}

/// An STag advertised over connection 2 (registered in the PD of connection
/// 2's responder) works there and is refused on connection 1 (SEC-PD-01).
#[test]
fn stag_of_another_connection_refused_rdmap_sec_02_sec_pd_01() {
    let w = world();
    let pd2 = w.bystander.b.pd().clone();
    let mr2 = pd2.reg_mr(4096, RW).unwrap();
    mr2.write(0, b"conn2 only").unwrap();
    // Works on its own connection.
    let p2 = &w.bystander;
    let l2 = p2.a.pd().reg_mr(64, Access::LOCAL_WRITE).unwrap();
    p2.a.post_send_one(SendWr::new(
        1,
        WrOpcode::RdmaRead {
            remote: remote(&mr2, 0),
        },
        vec![l2.sge(0, 10)],
    ))
    .unwrap();
    assert_eq!(wait(&p2.cq_a).status, WcStatus::Success);
    assert_eq!(l2.to_vec(0, 10).unwrap(), b"conn2 only");
    // Refused on connection 1: not associated with that stream.
    read_fails(&w, remote(&mr2, 0), 10, 0x03);
    assert_ne!(w.local.to_vec(0, 10).unwrap(), b"conn2 only");
}

// ---- deregistration and invalidation (RDMAP-SEC-04, RDMAP-SND-06) --------

#[test]
fn deregistered_mr_rdmap_sec_04_row_13() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    let addr = remote(&mr, 0);
    drop(mr);
    read_fails(&w, addr, 8, 0x00);
}

#[test]
fn deregistered_mr_write_row_8() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    let addr = remote(&mr, 0);
    drop(mr);
    write_fails(&w, addr, 8, 0x00, &good);
}

#[test]
fn fast_register_then_use() {
    let w = world();
    let p = &w.victim;
    let (fr, backing, stag) = fast_register_mr(&w, RW, 0x5a);
    assert_eq!(stag, fr.stag_with_key(0x5a));
    w.local.write(0, b"via fast-reg").unwrap();
    p.a.post_send(&[
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote: RemoteAddr {
                    addr: 0x5000_0010,
                    rkey: stag,
                },
            },
            vec![w.local.sge(0, 12)],
        ),
        SendWr::new(
            2,
            WrOpcode::RdmaRead {
                remote: RemoteAddr {
                    addr: 0x5000_0010,
                    rkey: stag,
                },
            },
            vec![w.local.sge(100, 12)],
        ),
    ])
    .unwrap();
    for id in [1, 2] {
        let wc = wait(&p.cq_a);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
    assert_eq!(backing.to_vec(0x10, 12).unwrap(), b"via fast-reg");
    assert_eq!(w.local.to_vec(100, 12).unwrap(), b"via fast-reg");
    assert_eq!(p.a.state(), QpState::Rts);
}

#[test]
fn fast_register_old_key_refused_sec_stag_03() {
    let w = world();
    let (fr, _backing, stag) = fast_register_mr(&w, RW, 0x5a);
    let old = fr.stag_with_key(0x5b);
    assert_ne!(old, stag);
    read_fails(
        &w,
        RemoteAddr {
            addr: 0x5000_0000,
            rkey: old,
        },
        8,
        0x00,
    );
}

#[test]
fn fast_register_rights_apply_rdmap_sec_05() {
    let w = world();
    // Remote write only: a Read must be refused for rights.
    let (_fr, _backing, stag) = fast_register_mr(&w, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0x11);
    read_fails(
        &w,
        RemoteAddr {
            addr: 0x5000_0000,
            rkey: stag,
        },
        8,
        0x02,
    );
}

/// Responder `b` fast-registers 4096 bytes of a fresh region at tagged
/// offset 0x5000_0000 with `access` under the new `key`; returns (allocated
/// MR, backing region, new STag).
fn fast_register_mr(w: &World, access: Access, key: u8) -> (MemoryRegion, MemoryRegion, u32) {
    let p = &w.victim;
    let backing = w.pd_b.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let fr = w.pd_b.alloc_mr(4096).unwrap();
    p.b.post_send_one(SendWr::new(
        70,
        WrOpcode::RegMr {
            mr_stag: fr.rkey(),
            key,
            source_lkey: backing.lkey(),
            source_addr: backing.addr(),
            length: 4096,
            iova: 0x5000_0000,
            access,
        },
        vec![],
    ))
    .unwrap();
    let wc = wait(&p.cq_b);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (70, WcStatus::Success, WcOpcode::RegMr),
        "{wc:?}"
    );
    let stag = fr.stag_with_key(key);
    (fr, backing, stag)
}

#[test]
fn remotely_invalidated_stag_then_used_rdmap_snd_06a() {
    let w = world();
    let p = &w.victim;
    let (_fr, _backing, stag) = fast_register_mr(&w, RW, 0x21);
    let rbuf = w.pd_b.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: vec![rbuf.sge(0, 64)],
    }])
    .unwrap();
    w.local.write(0, b"bye").unwrap();
    p.a.post_send_one(SendWr::new(
        1,
        WrOpcode::SendWithInv { invalidate_rkey: stag },
        vec![w.local.sge(0, 3)],
    ))
    .unwrap();
    assert_eq!(wait(&p.cq_a).status, WcStatus::Success);
    let wc = wait(&p.cq_b);
    assert_eq!(
        (wc.wr_id, wc.status, wc.invalidated_rkey),
        (5, WcStatus::Success, Some(stag)),
        "{wc:?}"
    );
    // Now the STag is dead: a Read through it is an invalid STag (row 13).
    read_fails(
        &w,
        RemoteAddr {
            addr: 0x5000_0000,
            rkey: stag,
        },
        8,
        0x00,
    );
}

#[test]
fn locally_invalidated_stag_then_used() {
    let w = world();
    let p = &w.victim;
    let (_fr, _backing, stag) = fast_register_mr(&w, RW, 0x31);
    p.b.post_send_one(SendWr::new(71, WrOpcode::LocalInv { rkey: stag }, vec![]))
        .unwrap();
    let wc = wait(&p.cq_b);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (71, WcStatus::Success, WcOpcode::LocalInv),
        "{wc:?}"
    );
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    write_fails(
        &w,
        RemoteAddr {
            addr: 0x5000_0000,
            rkey: stag,
        },
        8,
        0x00,
        &good,
    );
}

/// Posts a Send with Invalidate of `stag` (a receive is posted at `b`)
/// followed by a Read of `good`; checks the Terminate 0/`etype`/0x09 and the
/// completions (the Send completes once sent, the Read is blamed or flushed).
fn send_with_invalidate_fails(w: &World, stag: u32, etype: u8, good: &MemoryRegion) {
    let p = &w.victim;
    let rbuf = w.pd_b.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: vec![rbuf.sge(0, 64)],
    }])
    .unwrap();
    p.a.post_send(&[
        SendWr::new(1, WrOpcode::SendWithInv { invalidate_rkey: stag }, vec![]),
        SendWr::new(
            2,
            WrOpcode::RdmaRead {
                remote: remote(good, 0),
            },
            vec![w.local.sge(0, 8)],
        ),
    ])
    .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::Send),
        "{wc:?}"
    );
    let wc = wait(&p.cq_a);
    assert_eq!(wc.wr_id, 2, "{wc:?}");
    match wc.status {
        WcStatus::RemAccessErr if etype == 1 => assert_eq!(wc.vendor_err, packed(0, 1, 0x09), "{wc:?}"),
        WcStatus::RemOpErr if etype == 2 => assert_eq!(wc.vendor_err, packed(0, 2, 0x09), "{wc:?}"),
        WcStatus::WrFlushErr => {}
        s => panic!("Read behind the failed Send with Invalidate: {s:?}"),
    }
    assert_terminate(p, 0, etype, 0x09);
    // The receive was not consumed by the refused message: it is flushed.
    let wc = wait(&p.cq_b);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushErr), "{wc:?}");
    assert_bystander_works(w);
}

/// Send with Invalidate of a regular registration: such an STag may not be
/// invalidated by a peer (RDMAP-SEC-07, row 20): 0/1/0x09, and the region
/// stays valid for its owner.
#[test]
fn send_with_invalidate_of_regular_mr_rdmap_sec_07_row_20() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW).unwrap();
    send_with_invalidate_fails(&w, mr.rkey(), 1, &mr);
    let p = &w.victim;
    assert!(
        w.dev
            .mem_table()
            .check(mr.rkey(), w.pd_b.id(), p.b.qp_num(), mr.addr(), 8, Access::REMOTE_READ)
            .is_ok()
    );
}

/// Send with Invalidate of a fast-registered STag of another PD / stream
/// (RDMAP-SND-06 b, SEC-STAG-04): 0/1/0x09, and the STag keeps working on
/// its own connection.
#[test]
fn send_with_invalidate_of_foreign_stag_rdmap_snd_06b() {
    let w = world();
    let p2 = &w.bystander;
    let pd2 = p2.b.pd().clone();
    let backing = pd2.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let fr = pd2.alloc_mr(4096).unwrap();
    p2.b.post_send_one(SendWr::new(
        70,
        WrOpcode::RegMr {
            mr_stag: fr.rkey(),
            key: 0x42,
            source_lkey: backing.lkey(),
            source_addr: backing.addr(),
            length: 4096,
            iova: 0x6000_0000,
            access: RW,
        },
        vec![],
    ))
    .unwrap();
    assert_eq!(wait(&p2.cq_b).status, WcStatus::Success);
    let stag = fr.stag_with_key(0x42);
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    send_with_invalidate_fails(&w, stag, 1, &good);
    // Still valid where it belongs.
    backing.write(0, b"mine").unwrap();
    let l2 = p2.a.pd().reg_mr(64, Access::LOCAL_WRITE).unwrap();
    p2.a.post_send_one(SendWr::new(
        9,
        WrOpcode::RdmaRead {
            remote: RemoteAddr {
                addr: 0x6000_0000,
                rkey: stag,
            },
        },
        vec![l2.sge(0, 4)],
    ))
    .unwrap();
    assert_eq!(wait(&p2.cq_a).status, WcStatus::Success);
    assert_eq!(l2.to_vec(0, 4).unwrap(), b"mine");
}

/// Send with Invalidate of an STag that names nothing: 0/2/0x09 (catalogue
/// A.5 #4: the operation flavour when the STag does not exist).
#[test]
fn send_with_invalidate_of_unknown_stag_row_20() {
    let w = world();
    let good = w.pd_b.reg_mr(4096, RW).unwrap();
    let unknown = good.rkey() ^ 0x0000_0100; // another index, same key
    send_with_invalidate_fails(&w, unknown, 2, &good);
}

// ---- local protection ------------------------------------------------------

/// Local keys are checked when a work request is posted: an lkey of another
/// PD, an SGE beyond its region, or a Read sink without LOCAL_WRITE is
/// refused by `post_send` / `post_recv` with `Error::BadWr` (rdma-core's
/// `bad_wr`), nothing goes on the wire and the QP stays usable.
#[test]
fn local_keys_checked_at_post_time() {
    let w = world();
    let p = &w.victim;
    let mb = w.pd_b.reg_mr(4096, RW).unwrap();
    let foreign = w.dev.alloc_pd().unwrap().reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let read_only = w.victim.a.pd().reg_mr(64, Access::REMOTE_READ).unwrap();
    use verbs::mem::AccessError;
    let bad: [(&str, SendWr, AccessError); 3] = [
        (
            "lkey of another PD",
            SendWr::new(
                1,
                WrOpcode::RdmaWrite { remote: remote(&mb, 0) },
                vec![foreign.sge(0, 8)],
            ),
            AccessError::NotAssociated,
        ),
        (
            "SGE past the end of its region",
            SendWr::new(2, WrOpcode::Send, vec![w.local.sge(8190, 8)]),
            AccessError::BaseBounds,
        ),
        (
            "Read sink without LOCAL_WRITE",
            SendWr::new(
                3,
                WrOpcode::RdmaRead { remote: remote(&mb, 0) },
                vec![read_only.sge(0, 8)],
            ),
            AccessError::AccessRights,
        ),
    ];
    for (what, wr, why) in bad {
        let lkey = wr.sg_list[0].lkey;
        let r = p.a.post_send_one(wr);
        assert!(
            matches!(r, Err(Error::BadWr { index: 0, error: WrError::LocalProtection { lkey: l, error } })
                if l == lkey && error == why),
            "{what}: {r:?}"
        );
        assert_eq!(r.unwrap_err().errno(), libc::EACCES, "{what}");
    }
    let r = p.b.post_recv(&[RecvWr {
        wr_id: 4,
        sg_list: vec![foreign.sge(0, 8)],
    }]);
    assert!(
        matches!(
            r,
            Err(Error::BadWr {
                index: 0,
                error: WrError::LocalProtection {
                    error: AccessError::NotAssociated,
                    ..
                }
            })
        ),
        "receive with a foreign lkey: {r:?}"
    );
    assert!(p.cq_a.poll_one().is_none() && p.cq_b.poll_one().is_none());
    // Nothing happened on the wire: the pair still works. (A Write completes
    // when sent; the Read behind it orders after its placement, RDMAP-ORD-12.)
    w.local.write(0, b"fine").unwrap();
    p.a.post_send(&[
        SendWr::new(
            5,
            WrOpcode::RdmaWrite { remote: remote(&mb, 0) },
            vec![w.local.sge(0, 4)],
        ),
        SendWr::new(
            6,
            WrOpcode::RdmaRead { remote: remote(&mb, 0) },
            vec![w.local.sge(100, 4)],
        ),
    ])
    .unwrap();
    for id in [5, 6] {
        let wc = wait(&p.cq_a);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
    assert_eq!(mb.to_vec(0, 4).unwrap(), b"fine");
    assert_eq!(w.local.to_vec(100, 4).unwrap(), b"fine");
    assert_eq!((p.a.state(), p.b.state()), (QpState::Rts, QpState::Rts));
}

/// A receive posted into a region that is deregistered before the Send
/// arrives must not complete with `Success` (the bytes would land in memory
/// the application gave up; SEC-STAG-02: after deregistration no placement
/// through that STag). rdma-core / Linux siw resolve the lkey when the data
/// arrives: the receive completes `LocProtErr` and the connection is ended
/// with a Terminate.
#[test]
fn receive_into_deregistered_region_is_not_success_sec_stag_02() {
    let w = world();
    let p = &w.victim;
    let rb = w.pd_b.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 3,
        sg_list: vec![rb.sge(0, 64)],
    }])
    .unwrap();
    drop(rb);
    w.local.write(0, b"too late").unwrap();
    p.a.post_send_one(SendWr::new(4, WrOpcode::Send, vec![w.local.sge(0, 8)]))
        .unwrap();
    let wc = wait(&p.cq_b);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::LocProtErr), "{wc:?}");
    // The receiver's own failure: RDMAP local catastrophic (A.4.6 row 28).
    let t = terminate_event(&p.a, false);
    assert_eq!((t.layer, t.etype, t.code), (0, 0, 0));
    assert_bystander_works(&w);
}

/// Zero-length operations skip the STag check (catalogue A.5 #6 for
/// Writes, RDMAP-RD-08 for Reads): a garbage STag is not an error.
#[test]
fn zero_length_ops_do_not_check_stags_rdmap_rd_08() {
    let w = world();
    let p = &w.victim;
    let garbage = RemoteAddr {
        addr: 0x1234,
        rkey: 0xdead_be00,
    };
    p.a.post_send(&[
        SendWr::new(1, WrOpcode::RdmaWrite { remote: garbage }, vec![]),
        SendWr::new(2, WrOpcode::RdmaRead { remote: garbage }, vec![]),
    ])
    .unwrap();
    for id in [1, 2] {
        let wc = wait(&p.cq_a);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
    assert_eq!((p.a.state(), p.b.state()), (QpState::Rts, QpState::Rts));
}

/// An allocated fast-register MR is invalid until a RegMr binds it.
#[test]
fn unbound_fast_reg_stag_refused_row_13() {
    let w = world();
    let fr = w.pd_b.alloc_mr(4096).unwrap();
    read_fails(
        &w,
        RemoteAddr {
            addr: 0,
            rkey: fr.rkey(),
        },
        8,
        0x00,
    );
}

/// Posts a FetchAdd at `at` on the victim pair and checks the RDMAP Remote
/// Protection Terminate 0/1/`code` (RFC 7306 §8 applies the Read Request
/// checks of RDMAP-ERR-07 to atomics).
fn atomic_fails(w: &World, at: RemoteAddr, code: u8) {
    let p = &w.victim;
    p.a.post_send_one(SendWr::new(
        1,
        WrOpcode::AtomicFetchAdd { remote: at, add: 1 },
        vec![w.local.sge(0, 8)],
    ))
    .unwrap();
    let wc = wait(&p.cq_a);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::RemAccessErr, WcOpcode::FetchAdd),
        "{wc:?}"
    );
    assert_eq!(wc.vendor_err, packed(0, 1, code), "{wc:?}");
    assert_terminate(p, 0, 1, code);
    assert_bystander_works(w);
}

#[test]
fn atomic_past_end_rdmap_sec_03() {
    let w = world();
    let mr = w.pd_b.reg_mr(4096, RW | Access::REMOTE_ATOMIC).unwrap();
    atomic_fails(&w, remote(&mr, 4096), 0x01);
}

#[test]
fn atomic_stag_of_another_pd_rdmap_sec_01() {
    let w = world();
    let mr = w
        .dev
        .alloc_pd()
        .unwrap()
        .reg_mr(4096, RW | Access::REMOTE_ATOMIC)
        .unwrap();
    mr.write(0, &5u64.to_ne_bytes()).unwrap();
    atomic_fails(&w, remote(&mr, 0), 0x03);
    assert_eq!(mr.to_vec(0, 8).unwrap(), 5u64.to_ne_bytes(), "target unchanged");
}

/// Invalidate, then fast-register the same MR again under a new key: the
/// new STag works, the old one stays dead (SEC-STAG-03, RDMAP-SEC-04).
#[test]
fn reregistered_after_invalidate_old_stag_dead_sec_stag_03() {
    let w = world();
    let p = &w.victim;
    let (fr, backing, old) = fast_register_mr(&w, RW, 0x61);
    p.b.post_send_one(SendWr::new(71, WrOpcode::LocalInv { rkey: old }, vec![]))
        .unwrap();
    assert_eq!(wait(&p.cq_b).status, WcStatus::Success);
    p.b.post_send_one(SendWr::new(
        72,
        WrOpcode::RegMr {
            mr_stag: fr.rkey(),
            key: 0x62,
            source_lkey: backing.lkey(),
            source_addr: backing.addr(),
            length: 4096,
            iova: 0x5000_0000,
            access: RW,
        },
        vec![],
    ))
    .unwrap();
    assert_eq!(wait(&p.cq_b).status, WcStatus::Success);
    let new = fr.stag_with_key(0x62);
    assert_ne!(new, old);
    backing.write(8, b"new key").unwrap();
    p.a.post_send_one(SendWr::new(
        1,
        WrOpcode::RdmaRead {
            remote: RemoteAddr {
                addr: 0x5000_0008,
                rkey: new,
            },
        },
        vec![w.local.sge(0, 7)],
    ))
    .unwrap();
    assert_eq!(wait(&p.cq_a).status, WcStatus::Success);
    assert_eq!(w.local.to_vec(0, 7).unwrap(), b"new key");
    read_fails(
        &w,
        RemoteAddr {
            addr: 0x5000_0000,
            rkey: old,
        },
        8,
        0x00,
    );
}
