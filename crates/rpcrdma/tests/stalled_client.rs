//! Issue 17, "many clients and calls in flight at once, without one slow client ... holding
//! others up": a server with ONE worker thread, one client that stops answering, and healthy
//! clients on the same worker. The healthy clients' calls all complete while the stalled
//! connection is still open (counted: the server has timed nothing out when they are done,
//! so none of them waited for the stall's timeout), then the stalled connection is closed by
//! the timeout (counted in `timeouts` and `fatal`) and the others go on.
//!
//! - iWARP: a raw Requester (bytes on a TCP socket) sends a WRITE whose argument is in a Read
//!   chunk and never answers the Responder's RDMA Read Request.
//! - RoCEv2: a verbs Requester that posted no receive sends a NULL: the Responder's Reply
//!   Send meets RNR NAKs (retried forever, `rnr_retry` 7) and never completes.
//!
//! The worker used to wait in the completion queue for that one Read or Send (up to the
//! timeout) while its other connections' Calls waited behind it. Addresses: 127.83.17.x.

#[path = "../../iwarp/tests/rawpeer/mod.rs"]
mod rawpeer;
mod rpcmsg;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::wire::ddp::{Addr, Header as DdpHeader};
use rawpeer::{Ask, RawPeer, op, untagged};
use rpcmsg::{msg, rpc_call};
use rpcrdma::demo;
use rpcrdma::private_data::PrivateData;
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};
use rpcrdma::wire::{ChunkLists, ReadSegment, Segment, WriteChunk};
use verbs::{Access, CmEvent, Device, DeviceFactory, DeviceOptions, QpOptions, SendWr, WrOpcode};

/// The server's per-operation timeout: generous, so that on a loaded machine the healthy
/// clients finish long before it (they need milliseconds).
const TIMEOUT: Duration = Duration::from_secs(4);
const HEALTHY: usize = 4;
const CALLS: usize = 16;

fn server(dev: &Device, addr: &str) -> RdmaServer {
    let cfg = RdmaConfig {
        workers: 1,
        timeout: TIMEOUT,
        ..RdmaConfig::default()
    };
    RdmaServer::spawn(dev, addr.parse().unwrap(), Arc::new(demo::registry()), cfg).unwrap()
}

/// `HEALTHY` clients on `dev`, each making `CALLS` NULL and 64-octet ECHO calls at once.
fn healthy_clients(dev: &Device, addr: SocketAddr) {
    let pd = dev.alloc_pd().unwrap();
    std::thread::scope(|s| {
        for i in 0..HEALTHY {
            let pd = pd.clone();
            s.spawn(move || {
                let c = RdmaClient::connect(&pd, addr, RdmaConfig::default()).expect("healthy client connects");
                for k in 0..CALLS {
                    demo::null(&c).expect("NULL");
                    let data = demo::pattern(64, (i * CALLS + k) as u32);
                    assert_eq!(demo::echo(&c, &data).expect("ECHO"), data);
                }
            });
        }
    });
}

/// The healthy clients' calls, while the stall holds; then the stall's end by the timeout.
fn healthy_pass_the_stall(srv: &RdmaServer, dev: &Device) {
    let t0 = Instant::now();
    healthy_clients(dev, srv.local_addr());
    let took = t0.elapsed();
    let s = srv.snapshot();
    assert_eq!(
        (s.timeouts, s.fatal),
        (0, 0),
        "the healthy clients' {} calls completed only after the stalled connection timed out \
         (they took {took:?}): the worker waited for the stalled client",
        HEALTHY * CALLS * 2
    );
    assert!(s.replies >= (HEALTHY * CALLS * 2) as u64, "{s:?}");
    eprintln!(
        "{} healthy calls with one stalled client: {took:?}",
        HEALTHY * CALLS * 2
    );
    // the stalled connection is closed by the timeout, counted as such
    let deadline = Instant::now() + TIMEOUT * 5;
    while srv.snapshot().timeouts == 0 {
        assert!(Instant::now() < deadline, "the stalled connection never timed out");
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = srv.snapshot();
    assert_eq!((s.timeouts, s.fatal), (1, 1), "{s:?}");
    // and the server goes on serving
    healthy_clients(dev, srv.local_addr());
    assert_eq!(srv.snapshot().fatal, 1);
}

/// Issue 17 (RPCR-SEC-05 resource model). IUT = Responder, iWARP. A Requester that never
/// answers our RDMA Read Request holds neither the worker nor its other connections; after
/// the timeout its connection is closed (a FIN or a Terminate: the Read is outstanding).
#[test]
fn iwarp_client_that_never_answers_a_read_request_holds_no_one_up() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev, "127.83.17.1:0");
    let ask = Ask {
        private_data: PrivateData::default().encode().to_vec(),
        ..Ask::default()
    };
    let mut peer = RawPeer::start(srv.local_addr(), &ask).finish(&ask);
    // WRITE of 64 KiB in a Read chunk at Position 48 (after the RPC header and two words)
    let n = 64u32 << 10;
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 48,
            target: Segment {
                handle: 0x5151_5100,
                length: n,
                offset: 0,
            },
        }],
        ..Default::default()
    };
    let call = msg(7, lists, &rpc_call(7, demo::WRITE, &[7, n]));
    peer.send(&untagged(op::SEND, 0, 1, 0, true, 0, &call));
    let rr = peer
        .read_until(|u| {
            DdpHeader::parse(u).is_ok_and(|h| {
                matches!(h.addr, Addr::Untagged { qn: 1, .. }) && h.rdmap_ctrl & 0x0f == op::READ_REQUEST
            })
        })
        .expect("the Responder asks for the Read chunk");
    assert!(!rr.is_empty());
    // ... and gets no answer: the healthy clients go now
    healthy_pass_the_stall(&srv, &dev);
    let end = peer.read_to_end();
    assert!(
        end.eof || !end.terminates().is_empty(),
        "the stalled connection was closed"
    );
}

/// Issue 17. IUT = Responder, iWARP. A Requester that asks for 16 MiB in a Write chunk and
/// stops reading its socket: our RDMA Writes fill the TCP window and the Reply's Send never
/// completes; the worker goes on with the others, and the timeout ends the stalled one.
#[test]
fn iwarp_client_that_stops_reading_its_socket_holds_no_one_up() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev, "127.83.17.4:0");
    let ask = Ask {
        private_data: PrivateData::default().encode().to_vec(),
        ..Ask::default()
    };
    let mut peer = RawPeer::start(srv.local_addr(), &ask).finish(&ask);
    let n = 16u32 << 20;
    let lists = ChunkLists {
        writes: vec![WriteChunk {
            segments: vec![Segment {
                handle: 0x6161_6100,
                length: n,
                offset: 0,
            }],
        }],
        ..Default::default()
    };
    let call = msg(8, lists, &rpc_call(8, demo::READ, &[n, 1]));
    peer.send(&untagged(op::SEND, 0, 1, 0, true, 0, &call));
    // the Reply is posted (its Writes now meet a closed window)
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.snapshot().replies_write_chunks == 0 {
        assert!(Instant::now() < deadline, "the server never answered the READ");
        std::thread::sleep(Duration::from_millis(10));
    }
    healthy_pass_the_stall(&srv, &dev);
    drop(peer);
}

/// Issue 17, RPCR-MEM-05. IUT = Responder, iWARP. A Call retransmitted on a new connection
/// while the connection that pulled its chunks still lives waits for that connection's fate
/// (up to 2 s) — without its worker: the healthy clients' calls complete while it waits, and
/// it is answered afterwards.
#[test]
fn a_retransmission_waiting_for_its_first_connection_holds_no_one_up() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev, "127.83.17.5:0");
    let ask = Ask {
        private_data: PrivateData::default().encode().to_vec(),
        ..Ask::default()
    };
    let is_read_request = |u: &[u8]| {
        DdpHeader::parse(u)
            .is_ok_and(|h| matches!(h.addr, Addr::Untagged { qn: 1, .. }) && h.rdmap_ctrl & 0x0f == op::READ_REQUEST)
    };
    // the first connection: XID 0x55's Read chunk is asked for and never answered
    let mut first = RawPeer::start(srv.local_addr(), &ask).finish(&ask);
    let n = 4096u32;
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 48,
            target: Segment {
                handle: 0x7171_7100,
                length: n,
                offset: 0,
            },
        }],
        ..Default::default()
    };
    first.send(&untagged(
        op::SEND,
        0,
        1,
        0,
        true,
        0,
        &msg(0x55, lists, &rpc_call(0x55, demo::WRITE, &[7, n])),
    ));
    first
        .read_until(is_read_request)
        .expect("the Responder asks for the Read chunk");
    // the retransmission (as a NULL) on a second connection waits for the first one's fate
    let mut second = RawPeer::start(srv.local_addr(), &ask).finish(&ask);
    let t0 = Instant::now();
    second.send(&untagged(
        op::SEND,
        0,
        1,
        0,
        true,
        0,
        &msg(0x55, ChunkLists::default(), &rpc_call(0x55, demo::NULL, &[])),
    ));
    std::thread::sleep(Duration::from_millis(100));
    healthy_clients(&dev, srv.local_addr());
    let healthy = t0.elapsed();
    let replies = srv.snapshot().replies;
    assert_eq!(
        replies,
        (HEALTHY * CALLS * 2) as u64,
        "the retransmission was answered before the healthy calls"
    );
    // it is answered once it has waited its 2 s (the first connection still lives: its timeout is 4 s)
    let a = second
        .read_until(|u| DdpHeader::parse(u).is_ok_and(|h| matches!(h.addr, Addr::Untagged { qn: 0, .. })))
        .expect("the retransmission is answered");
    let waited = t0.elapsed();
    eprintln!("healthy calls done after {healthy:?}; the retransmission answered after {waited:?}");
    assert!(
        waited >= Duration::from_millis(1900),
        "it waited for the first connection: {waited:?}"
    );
    assert!(healthy < waited);
    assert!(a.len() > 28);
    drop(first);
}

fn roce_device(addr: &str) -> Device {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("name", format!("rxe_{addr}"));
    roce::RoceFactory.open(&opts).expect("open a RoCEv2 device")
}

/// Issue 17. IUT = Responder, RoCEv2. A Requester with no receive posted makes our Reply's
/// Send meet RNR NAKs forever: the worker goes on with the other connections, and the
/// stalled one is disconnected after the timeout (the Requester sees Disconnected).
#[test]
fn roce_client_that_never_takes_a_reply_holds_no_one_up() {
    let sdev = roce_device("127.83.17.2");
    let cdev = roce_device("127.83.17.3");
    let srv = server(&sdev, "127.83.17.2:20049");
    let pd = cdev.alloc_pd().unwrap();
    let cq = cdev.create_cq(16).unwrap();
    let pdata = PrivateData::default().encode();
    let qp = pd
        .connect(
            srv.local_addr(),
            QpOptions::new(&cq).rd_atomic(8, 8).private_data(&pdata),
            Duration::from_secs(20),
        )
        .expect("the stalled client connects");
    let call = msg(9, ChunkLists::default(), &rpc_call(9, demo::NULL, &[]));
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    mr.write(0, &call).unwrap();
    qp.post_send(&[SendWr::new(1, WrOpcode::Send, vec![mr.sge(0, call.len() as u32)])])
        .unwrap();
    let wc = cq
        .wait(Some(Duration::from_secs(20)))
        .expect("the Call's Send completes");
    assert_eq!(wc.status, verbs::WcStatus::Success);
    // the server has answered it (its Reply's Send now meets RNR NAKs)
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.snapshot().replies == 0 {
        assert!(
            Instant::now() < deadline,
            "the server never answered the stalled client's NULL"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    healthy_pass_the_stall(&srv, &cdev);
    let mut ev = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match qp.get_event(Some(Duration::from_millis(200))) {
            Some(CmEvent::Established) | None => continue,
            Some(e) => {
                ev = Some(e);
                break;
            }
        }
    }
    assert!(
        matches!(ev, Some(CmEvent::Disconnected)),
        "the stalled client's connection was closed by the server: {ev:?}"
    );
}
