//! The IB CM on two RoCEv2 devices of our own provider on loopback: the `roce` factory's
//! devices connect with rdma_cm-style calls (REQ/REP/RTU as MADs on QP1 over UDP 4791),
//! then move data; disconnect flushes. Requirement IDs: `../shared/requirements/
//! smcr-ipoibcm.md` C1 (C1.3 private data, C1.6 REJ reasons, C1.7 DREQ/DREP, C1.8 QP
//! states driven by the CM), C3 for the data moved. Addresses 127.79.x.y are this file's.

use std::net::SocketAddr;
use std::time::Duration;

use roce::cm::RejReason;
use roce::gsi_cm::Rejection;
use verbs::*;

const T: Duration = Duration::from_secs(20);

fn device(addr: &str) -> Device {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("name", format!("rxe_{addr}"));
    roce::RoceFactory.open(&opts).expect("open a RoCEv2 device")
}

fn opts(dev: &Device, cq: &CompletionQueue, recv: Option<&MemoryRegion>) -> QpOptions {
    let mut o = QpOptions::new(cq).rd_atomic(8, 8);
    if let Some(mr) = recv {
        o = o.post_recv([RecvWr {
            wr_id: 100,
            sg_list: vec![mr.sge(0, 4096)],
        }]);
    }
    let _ = dev;
    o
}

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait(Some(T)).expect("completion within timeout")
}

/// C1.3, C1.8, C3: connect/accept with private data both ways, then a Send, an RDMA Write
/// and an RDMA Read on the connection the CM brought up; disconnect from the active side:
/// the passive QP gets Disconnected and its posted receive flushes.
#[test]
fn connect_send_write_read_disconnect() {
    let (da, db) = (device("127.79.1.1"), device("127.79.1.2"));
    let l = db.listen("127.79.1.2:7491".parse().unwrap()).unwrap();
    let pa = da.alloc_pd().unwrap();
    let ca = da.create_cq(64).unwrap();
    let ma = pa.reg_mr(1 << 16, Access::all_remote()).unwrap();
    let t = {
        let (pa, ca, da) = (pa.clone(), ca.clone(), da.clone());
        std::thread::spawn(move || {
            pa.connect(
                "127.79.1.2:7491".parse().unwrap(),
                opts(&da, &ca, None).private_data(b"from a"),
                T,
            )
        })
    };
    let req = l.get_request(Some(T)).unwrap();
    assert_eq!(&req.private_data()[..6], b"from a");
    assert_eq!(req.peer_addr().ip().to_string(), "127.79.1.1");
    let pb = db.alloc_pd().unwrap();
    let cb = db.create_cq(64).unwrap();
    let mb = pb.reg_mr(1 << 16, Access::all_remote()).unwrap();
    let qb = req
        .accept(&pb, opts(&db, &cb, Some(&mb)).private_data(b"from b"))
        .unwrap();
    let qa = t.join().unwrap().unwrap();
    assert_eq!(&qa.conn_info().peer_private_data[..6], b"from b");
    assert_eq!((qa.state(), qb.state()), (QpState::Rts, QpState::Rts));
    assert_eq!(qa.get_event(Some(T)), Some(CmEvent::Established));
    assert_eq!(qb.get_event(Some(T)), Some(CmEvent::Established));

    // Send into the receive posted before accept.
    ma.write(0, b"hello over IB CM").unwrap();
    qa.post_send_one(SendWr::new(1, WrOpcode::Send, vec![ma.sge(0, 16)]))
        .unwrap();
    assert_eq!(wait(&ca).status, WcStatus::Success);
    let wc = wait(&cb);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (100, WcStatus::Success, 16));
    assert_eq!(mb.to_vec(0, 16).unwrap(), b"hello over IB CM");
    // RDMA Write and Read.
    ma.write(1000, &[0x5a; 3000]).unwrap();
    qa.post_send_one(SendWr::new(
        2,
        WrOpcode::RdmaWrite {
            remote: RemoteAddr {
                addr: mb.addr() + 8192,
                rkey: mb.rkey(),
            },
        },
        vec![ma.sge(1000, 3000)],
    ))
    .unwrap();
    assert_eq!(wait(&ca).status, WcStatus::Success);
    assert_eq!(mb.to_vec(8192, 3000).unwrap(), vec![0x5a; 3000]);
    qa.post_send_one(SendWr::new(
        3,
        WrOpcode::RdmaRead {
            remote: RemoteAddr {
                addr: mb.addr(),
                rkey: mb.rkey(),
            },
        },
        vec![ma.sge(20000, 16)],
    ))
    .unwrap();
    assert_eq!(wait(&ca).status, WcStatus::Success);
    assert_eq!(ma.to_vec(20000, 16).unwrap(), b"hello over IB CM");

    // Disconnect from a: b's QP goes to ERR, its receive flushes, both see Disconnected.
    qb.post_recv(&[RecvWr {
        wr_id: 101,
        sg_list: vec![mb.sge(0, 64)],
    }])
    .unwrap();
    qa.disconnect();
    assert_eq!(qa.state(), QpState::Err);
    assert_eq!(qb.get_event(Some(T)), Some(CmEvent::Disconnected));
    assert_eq!(qb.state(), QpState::Err);
    let wc = wait(&cb);
    assert_eq!((wc.wr_id, wc.status), (101, WcStatus::WrFlushErr));
    assert_eq!(qa.get_event(Some(T)), Some(CmEvent::Disconnected));
}

/// C1.6: consumer reject with private data, and REJ 8 for a port nobody listens on, over
/// real MADs.
#[test]
fn reject_and_invalid_service_id() {
    let (da, db) = (device("127.79.2.1"), device("127.79.2.2"));
    let l = db.listen("127.79.2.2:7492".parse().unwrap()).unwrap();
    let pa = da.alloc_pd().unwrap();
    let ca = da.create_cq(16).unwrap();
    let t = {
        let (pa, ca, da) = (pa.clone(), ca.clone(), da.clone());
        std::thread::spawn(move || pa.connect("127.79.2.2:7492".parse().unwrap(), opts(&da, &ca, None), T))
    };
    l.get_request(Some(T)).unwrap().reject(b"busy").unwrap();
    match t.join().unwrap() {
        Err(Error::Rejected { private_data, detail }) => {
            assert_eq!(&private_data[..4], b"busy");
            assert_eq!(
                detail.unwrap().downcast_ref::<Rejection>().unwrap().reason,
                RejReason::ConsumerDefined
            );
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    let e = pa
        .connect(
            "127.79.2.2:7493".parse::<SocketAddr>().unwrap(),
            opts(&da, &ca, None),
            T,
        )
        .unwrap_err();
    assert!(e.to_string().contains("invalid service ID"), "{e}");
}

/// C1.7, C1.8: disconnect from the passive side.
#[test]
fn disconnect_from_passive_side() {
    let (da, db) = (device("127.79.3.1"), device("127.79.3.2"));
    let l = db.listen("127.79.3.2:7494".parse().unwrap()).unwrap();
    let pa = da.alloc_pd().unwrap();
    let ca = da.create_cq(16).unwrap();
    let ma = pa.reg_mr(4096, Access::all_remote()).unwrap();
    let t = {
        let (pa, ca, da) = (pa.clone(), ca.clone(), da.clone());
        std::thread::spawn(move || pa.connect("127.79.3.2:7494".parse().unwrap(), opts(&da, &ca, Some(&ma)), T))
    };
    let pb = db.alloc_pd().unwrap();
    let cb = db.create_cq(16).unwrap();
    let qb = l
        .get_request(Some(T))
        .unwrap()
        .accept(&pb, opts(&db, &cb, None))
        .unwrap();
    let qa = t.join().unwrap().unwrap();
    assert_eq!(qb.get_event(Some(T)), Some(CmEvent::Established));
    assert_eq!(qa.get_event(Some(T)), Some(CmEvent::Established));
    qb.disconnect();
    assert_eq!(qa.get_event(Some(T)), Some(CmEvent::Disconnected));
    assert_eq!(qa.state(), QpState::Err);
    let wc = wait(&ca);
    assert_eq!((wc.wr_id, wc.status), (100, WcStatus::WrFlushErr));
    assert_eq!(qb.get_event(Some(T)), Some(CmEvent::Disconnected));
}
