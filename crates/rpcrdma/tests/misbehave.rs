//! Scripted misbehaving peers over real loopback iWARP: raw verbs QPs play a
//! broken Requester against our Responder, and a broken Responder against our
//! Requester (issue 5 "what must hold", requirements B.4.5).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod rpcmsg;
use rpcmsg::{msg_with as msg, rpc_call};

use rpcrdma::client::RpcError;
use rpcrdma::demo;
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};
use rpcrdma::wire::{Body, ChunkLists, ErrorBody, Header, Limits, ReadSegment, Segment, WriteChunk, proc_};
use rpcrdma::xdr::Encoder;
use verbs::*;

const T: Duration = Duration::from_secs(5);

/// A raw RC endpoint with one big registered buffer.
struct Raw {
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

const SLOT: usize = 4096;
const RECVS: usize = 16;

impl Raw {
    fn buffers(pd: &ProtectionDomain) -> (MemoryRegion, Vec<RecvWr>) {
        let mr = pd.reg_mr(SLOT * (RECVS + 1) + (2 << 20), Access::all_remote()).unwrap();
        let recvs = (0..RECVS)
            .map(|i| RecvWr {
                wr_id: 100 + i as u64,
                sg_list: vec![mr.sge(i * SLOT, SLOT as u32)],
            })
            .collect();
        (mr, recvs)
    }

    fn from_parts(pd: &ProtectionDomain, cq: CompletionQueue, qp: QueuePair, mr: MemoryRegion) -> Raw {
        Raw {
            _pd: pd.clone(),
            cq,
            qp,
            mr,
        }
    }

    fn connect(dev: &Device, addr: SocketAddr) -> Raw {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(256).unwrap();
        let pdata = rpcrdma::private_data::PrivateData::default().encode();
        let (mr, recvs) = Raw::buffers(&pd);
        let qp = pd
            .connect(
                addr,
                QpOptions::new(&cq)
                    .rd_atomic(16, 16)
                    .private_data(&pdata)
                    .post_recv(recvs),
                T,
            )
            .unwrap();
        Raw::from_parts(&pd, cq, qp, mr)
    }

    /// Data area usable as chunk memory: offset 17 slots in.
    fn data(&self, off: usize) -> Segment {
        Segment {
            handle: self.mr.rkey(),
            length: 0,
            offset: self.mr.addr() + (SLOT * (RECVS + 1) + off) as u64,
        }
    }

    fn put_data(&self, off: usize, d: &[u8]) {
        self.mr.write(SLOT * (RECVS + 1) + off, d).unwrap();
    }

    fn get_data(&self, off: usize, n: usize) -> Vec<u8> {
        self.mr.to_vec(SLOT * (RECVS + 1) + off, n).unwrap()
    }

    fn send(&self, msgs: &[Vec<u8>]) {
        let base = SLOT * RECVS;
        let mut at = 0;
        let mut wrs = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            self.mr.write(base + at, m).unwrap();
            wrs.push(SendWr::new(
                1000 + i as u64,
                WrOpcode::Send,
                vec![self.mr.sge(base + at, m.len() as u32)],
            ));
            at += m.len();
        }
        assert!(at <= SLOT);
        self.qp.post_send(&wrs).unwrap();
    }

    /// The next received message, `None` on timeout; `Err` when the connection died.
    fn recv(&self, timeout: Duration) -> Result<Option<Vec<u8>>, WcStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Some(wc) = self.cq.wait(Some(left)) else {
                return Ok(None);
            };
            if wc.status != WcStatus::Success {
                return Err(wc.status);
            }
            if wc.opcode == WcOpcode::Recv {
                let slot = (wc.wr_id - 100) as usize;
                let m = self.mr.to_vec(slot * SLOT, wc.byte_len as usize).unwrap();
                // fails once the QP is in the error state; the flush tells the caller
                let _ = self.qp.post_recv(&[RecvWr {
                    wr_id: wc.wr_id,
                    sg_list: vec![self.mr.sge(slot * SLOT, SLOT as u32)],
                }]);
                return Ok(Some(m));
            }
        }
    }
}

fn words(m: &[u8]) -> Vec<u32> {
    m.chunks(4).map(|w| u32::from_be_bytes(w.try_into().unwrap())).collect()
}

fn server(dev: &Device) -> RdmaServer {
    let cfg = RdmaConfig {
        timeout: T,
        ..Default::default()
    };
    RdmaServer::spawn(dev, "127.0.0.1:0".parse().unwrap(), Arc::new(demo::registry()), cfg).unwrap()
}

fn null_works(r: &Raw, xid: u32) {
    r.send(&[msg(xid, 1, Body::Msg(ChunkLists::default()), &rpc_call(xid, 0, &[]))]);
    let m = r.recv(T).unwrap().expect("NULL reply");
    assert_eq!(words(&m)[..4], [xid, 1, words(&m)[2], proc_::RDMA_MSG]);
    assert_eq!(words(&m)[7..], [xid, 1, 0, 0, 0, 0], "NULL accepted");
}

/// IUT = Responder. RPCR-ERR-07 (B.4.5 #2): version 2 -> ERR_VERS 1..1 with xid
/// and vers echoed. RPCR-ERR-08 (#3, #4, #13): proc 5, RDMA_MSGP and a bad
/// optional-data discriminator -> ERR_CHUNK. RPCR-ERR-01 (#1): 27 bytes dropped.
/// RPCR-FRM-08, RPCR-ERR-11 (#5, #6): RDMA_ERROR and RDMA_DONE received by the
/// Responder are dropped and the connection goes on.
#[test]
fn responder_err_vers_err_chunk_and_drops() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev);
    let r = Raw::connect(&dev, srv.local_addr());
    null_works(&r, 1);
    r.send(&[msg(0x22, 2, Body::Msg(ChunkLists::default()), &rpc_call(0x22, 0, &[]))]);
    let m = r.recv(T).unwrap().unwrap();
    assert_eq!(words(&m), [0x22, 2, words(&m)[2], 4, 1, 1, 1], "ERR_VERS");
    assert!(words(&m)[2] >= 1, "credit never 0 (RPCR-CRD-02)");
    let mut bad_proc = msg(0x23, 1, Body::Msg(ChunkLists::default()), &rpc_call(0x23, 0, &[]));
    bad_proc[12..16].copy_from_slice(&5u32.to_be_bytes());
    let msgp = msg(
        0x24,
        1,
        Body::Msgp {
            align: 4,
            thresh: 0,
            lists: ChunkLists::default(),
        },
        &rpc_call(0x24, 0, &[]),
    );
    let mut bad_opt = msg(0x25, 1, Body::Msg(ChunkLists::default()), &rpc_call(0x25, 0, &[]));
    bad_opt[16..20].copy_from_slice(&2u32.to_be_bytes());
    for (m, xid) in [(bad_proc, 0x23), (msgp, 0x24), (bad_opt, 0x25)] {
        r.send(&[m]);
        let a = r.recv(T).unwrap().unwrap();
        assert_eq!(words(&a), [xid, 1, words(&a)[2], 4, 2], "ERR_CHUNK for {xid:#x}");
    }
    // silently dropped: RDMA_ERROR, RDMA_DONE, 27 bytes
    r.send(&[
        msg(0x26, 1, Body::Error(ErrorBody::Chunk), &[]),
        msg(0x27, 1, Body::Done, &[]),
        msg(0x28, 1, Body::Msg(ChunkLists::default()), &[])[..27].to_vec(),
    ]);
    assert_eq!(
        r.recv(Duration::from_millis(300)).unwrap(),
        None,
        "no answer to dropped messages"
    );
    null_works(&r, 0x29);
    let st = srv.snapshot();
    assert_eq!((st.dropped, st.rdma_errors, st.fatal), (3, 4, 0));
}

/// IUT = Responder. RPCR-RDC-02 (B.4.5 #11): Position 6 -> ERR_CHUNK; #12:
/// Position beyond the stream -> ERR_CHUNK; RPCR-DDP-07 (#14): a chunk at the
/// Position of READ's (non-eligible) size argument -> ERR_CHUNK, procedure not
/// run; RPCR-ERR-09 (#15): chunk length disagreeing with the length word ->
/// GARBAGE_ARGS in an RDMA_MSG; write chunk too small for READ's result ->
/// ERR_CHUNK; Long reply without a Reply chunk -> ERR_CHUNK (B.5 #6).
#[test]
fn responder_bad_positions_and_small_write_chunks() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev);
    let r = Raw::connect(&dev, srv.local_addr());
    null_works(&r, 1);
    r.put_data(0, &demo::pattern(100, 0));
    let seg = |len: u32| Segment {
        length: len,
        ..r.data(0)
    };
    let read_at = |position: u32, len: u32| ChunkLists {
        reads: vec![ReadSegment {
            position,
            target: seg(len),
        }],
        ..Default::default()
    };
    // WRITE(tag, opaque): reduced call = header 40 + tag 4 + len word 4; data at Position 48
    let write_args = |len: u32| rpc_call(0, demo::WRITE, &[7, len]);
    let with_xid = |mut m: Vec<u8>, xid: u32| {
        m[..4].copy_from_slice(&xid.to_be_bytes());
        m
    };
    let cases: Vec<(u32, Vec<u8>)> = vec![
        (
            0x31,
            msg(0x31, 1, Body::Msg(read_at(46, 100)), &with_xid(write_args(100), 0x31)),
        ),
        (
            0x32,
            msg(0x32, 1, Body::Msg(read_at(400, 100)), &with_xid(write_args(100), 0x32)),
        ),
        // READ(size, seed) with the size word reduced
        (
            0x33,
            msg(0x33, 1, Body::Msg(read_at(40, 4)), &rpc_call(0x33, demo::READ, &[9])),
        ),
    ];
    for (xid, m) in cases {
        r.send(&[m]);
        let a = r.recv(T).unwrap().unwrap();
        assert_eq!(words(&a), [xid, 1, words(&a)[2], 4, 2], "ERR_CHUNK for {xid:#x}");
    }
    // chunk of 100 bytes for an opaque whose length word says 200: GARBAGE_ARGS
    r.send(&[msg(
        0x34,
        1,
        Body::Msg(read_at(48, 100)),
        &with_xid(write_args(200), 0x34),
    )]);
    let a = r.recv(T).unwrap().unwrap();
    let w = words(&a);
    assert_eq!((w[0], w[3]), (0x34, proc_::RDMA_MSG));
    assert_eq!(w[7..], [0x34, 1, 0, 0, 0, 4], "GARBAGE_ARGS");
    // READ(5000) with a 100-byte Write chunk
    let small = ChunkLists {
        writes: vec![WriteChunk {
            segments: vec![Segment {
                length: 100,
                ..r.data(4096)
            }],
        }],
        ..Default::default()
    };
    r.send(&[msg(0x35, 1, Body::Msg(small), &rpc_call(0x35, demo::READ, &[5000, 1]))]);
    let a = r.recv(T).unwrap().unwrap();
    assert_eq!(words(&a), [0x35, 1, words(&a)[2], 4, 2], "write chunk too small");
    assert_eq!(r.get_data(4096, 100), vec![0u8; 100], "nothing written");
    // READ(2000) with neither Write list nor Reply chunk: does not fit inline
    r.send(&[msg(
        0x36,
        1,
        Body::Msg(ChunkLists::default()),
        &rpc_call(0x36, demo::READ, &[2000, 1]),
    )]);
    let a = r.recv(T).unwrap().unwrap();
    assert_eq!(words(&a), [0x36, 1, words(&a)[2], 4, 2], "no reply chunk");
    null_works(&r, 0x37);
    assert_eq!(srv.snapshot().fatal, 0);
}

/// IUT = Responder. RPCR-CRD-01 violated by the peer: on a fresh connection
/// (one credit) it sends five Calls at once. The Responder closes that
/// connection; other connections go on.
#[test]
fn responder_credit_overrun_closes_that_connection() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev);
    let good = Raw::connect(&dev, srv.local_addr());
    let bad = Raw::connect(&dev, srv.local_addr());
    // the first Call pulls a 1 MiB Read chunk, so the others arrive meanwhile
    let big = 1 << 20;
    bad.put_data(0, &demo::pattern(big, 3));
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 48,
            target: Segment {
                length: big as u32,
                ..bad.data(0)
            },
        }],
        ..Default::default()
    };
    let mut first = rpc_call(0x41, demo::WRITE, &[7, big as u32]);
    first[..4].copy_from_slice(&0x41u32.to_be_bytes());
    let mut burst = vec![msg(0x41, 1, Body::Msg(lists), &first)];
    for xid in 0x42..0x46 {
        burst.push(msg(xid, 1, Body::Msg(ChunkLists::default()), &rpc_call(xid, 0, &[])));
    }
    bad.send(&burst);
    let mut answers = 0;
    let end = loop {
        match bad.recv(T) {
            Ok(Some(_)) => answers += 1,
            Ok(None) => break "timeout",
            Err(_) => break "closed",
        }
    };
    assert_eq!(
        end, "closed",
        "the overrunning connection is closed ({answers} answers)"
    );
    assert!(answers <= 1);
    null_works(&good, 0x47);
    assert_eq!(srv.snapshot().fatal, 1);
}

/// IUT = Responder. RPCR-MEM-05 (B.4.5 #16): a Read chunk with a handle that
/// is not registered -> the RDMA Read fails and the connection ends; the XID's
/// retransmission on a new connection gets ERR_CHUNK instead of another attempt.
#[test]
fn responder_failed_rdma_read_then_err_chunk_on_retransmission() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev);
    let r = Raw::connect(&dev, srv.local_addr());
    null_works(&r, 1);
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 48,
            target: Segment {
                handle: r.mr.rkey() ^ 0x5500,
                length: 2000,
                offset: r.data(0).offset,
            },
        }],
        ..Default::default()
    };
    let mut call = rpc_call(0x51, demo::WRITE, &[7, 2000]);
    call[..4].copy_from_slice(&0x51u32.to_be_bytes());
    let m = msg(0x51, 1, Body::Msg(lists), &call);
    r.send(std::slice::from_ref(&m));
    assert!(r.recv(T).is_err(), "connection lost");
    let r2 = Raw::connect(&dev, srv.local_addr());
    null_works(&r2, 2);
    r2.send(&[m]);
    let a = r2.recv(T).unwrap().unwrap();
    assert_eq!(
        words(&a),
        [0x51, 1, words(&a)[2], 4, 2],
        "ERR_CHUNK for the retransmission"
    );
}

/// A scripted Responder: accepts connections, answers each Call with
/// `script(connection index, call header, call bytes)`; records the XIDs seen.
fn scripted_responder(
    dev: &Device,
    script: impl Fn(usize, &Raw, &Header) -> Option<Vec<Vec<u8>>> + Send + 'static,
) -> (SocketAddr, Arc<Mutex<Vec<u32>>>) {
    let l = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (seen2, dev) = (seen.clone(), dev.clone());
    std::thread::spawn(move || {
        let mut conns = Vec::new();
        for i in 0.. {
            let Ok(req) = l.get_request(Some(Duration::from_secs(20))) else {
                return;
            };
            let pd = dev.alloc_pd().unwrap();
            let cq = dev.create_cq(256).unwrap();
            let pdata = rpcrdma::private_data::PrivateData::default().encode();
            let (mr, recvs) = Raw::buffers(&pd);
            let qp = req
                .accept(&pd, QpOptions::new(&cq).private_data(&pdata).post_recv(recvs))
                .unwrap();
            let raw = Raw::from_parts(&pd, cq, qp, mr);
            while let Ok(Some(m)) = raw.recv(Duration::from_secs(3)) {
                let (h, _) = Header::decode(&m, &Limits::default()).unwrap();
                seen2.lock().unwrap().push(h.xid);
                match script(i, &raw, &h) {
                    Some(replies) => raw.send(&replies),
                    None => break,
                }
            }
            conns.push(raw);
        }
    });
    (addr, seen)
}

fn client(dev: &Device, addr: SocketAddr) -> RdmaClient {
    let cfg = RdmaConfig {
        timeout: Duration::from_millis(800),
        max_retries: 1,
        ..Default::default()
    };
    RdmaClient::connect(&dev.alloc_pd().unwrap(), addr, cfg).unwrap()
}

fn null_reply(h: &Header, credit: u32) -> Vec<u8> {
    let mut m = msg(h.xid, 1, Body::Msg(ChunkLists::default()), &[]);
    m[8..12].copy_from_slice(&credit.to_be_bytes());
    for w in [h.xid, 1, 0, 0, 0, 0] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m
}

/// IUT = Requester. RPCR-ERR-05/07 (B.4.5 #19): RDMA_ERROR ERR_VERS and a 20-byte
/// ERR_CHUNK fail the RPC permanently (no retransmission); RPCR-CRD-02: a grant
/// of 0 counts as 1 and the next call still goes out.
#[test]
fn requester_rdma_error_is_permanent() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let (addr, seen) = scripted_responder(&dev, |_, _, h| {
        Some(vec![match h.xid & 3 {
            0 => msg(h.xid, 1, Body::Error(ErrorBody::Vers { low: 1, high: 1 }), &[]),
            1 => msg(h.xid, 1, Body::Error(ErrorBody::Chunk), &[]),
            _ => null_reply(h, 0),
        }])
    });
    let c = client(&dev, addr);
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(demo::null(&c));
    }
    let first = seen.lock().unwrap()[0];
    let want = |x: u32| match x & 3 {
        0 => Err(RpcError::RdmaError(ErrorBody::Vers { low: 1, high: 1 })),
        1 => Err(RpcError::RdmaError(ErrorBody::Chunk)),
        _ => Ok(()),
    };
    let expect: Vec<_> = (0..4).map(|i| want(first.wrapping_add(i))).collect();
    assert_eq!(got, expect);
    assert_eq!(seen.lock().unwrap().len(), 4, "no retransmission");
    assert_eq!(c.connects(), 1);
}

/// IUT = Requester. B.4.5 #17, #18, #20, RPCR-ERR-03/06/10/11: a Reply with a
/// Read list, one whose Write chunk is longer than provided, an RDMA_ERROR with
/// an unknown code, RDMA_MSGP and RDMA_DONE are all dropped silently; the RPC
/// times out, and is retransmitted with the same XID after a reconnect, where
/// the (now well-behaved) Responder answers it.
#[test]
fn requester_drops_bad_replies_and_retransmits_after_reconnect() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let (addr, seen) = scripted_responder(&dev, |conn, raw, h| {
        let provided = h.body.lists().cloned().unwrap_or_default();
        if conn > 0 {
            // a correct READ(2000) reply: RDMA Write into the Write chunk, then the Send
            let seg = provided.writes[0].segments[0];
            raw.put_data(0, &demo::pattern(2000, 1));
            let src = raw.data(0).offset;
            let w = SendWr::new(
                9,
                WrOpcode::RdmaWrite {
                    remote: RemoteAddr {
                        addr: seg.offset,
                        rkey: seg.handle,
                    },
                },
                vec![Sge {
                    addr: src,
                    length: 2000,
                    lkey: raw.mr.lkey(),
                }],
            );
            raw.qp.post_send(&[w]).unwrap();
            let echoed = ChunkLists {
                writes: vec![WriteChunk {
                    segments: vec![Segment { length: 2000, ..seg }],
                }],
                ..Default::default()
            };
            let mut payload = Vec::new();
            for w in [h.xid, 1, 0, 0, 0, 0, 2000, demo::TRAILER] {
                payload.extend_from_slice(&w.to_be_bytes());
            }
            return Some(vec![msg(h.xid, 1, Body::Msg(echoed), &payload)]);
        }
        let read_list = ChunkLists {
            reads: vec![ReadSegment::default()],
            ..Default::default()
        };
        let mut bad_err = msg(h.xid, 1, Body::Error(ErrorBody::Chunk), &[]);
        bad_err[16..20].copy_from_slice(&7u32.to_be_bytes());
        let mut too_long = provided.clone();
        for w in &mut too_long.writes {
            for s in &mut w.segments {
                s.length += 1;
            }
        }
        let mut inline = Vec::new();
        for w in [h.xid, 1, 0, 0, 0, 0, 0, demo::TRAILER] {
            inline.extend_from_slice(&w.to_be_bytes());
        }
        Some(vec![
            msg(h.xid, 1, Body::Msg(read_list), &inline),
            msg(h.xid, 1, Body::Msg(too_long), &inline),
            bad_err,
            msg(
                h.xid,
                1,
                Body::Msgp {
                    align: 4,
                    thresh: 0,
                    lists: ChunkLists::default(),
                },
                &inline,
            ),
            msg(h.xid, 1, Body::Done, &[]),
        ])
    });
    let c = client(&dev, addr);
    assert_eq!(demo::read(&c, 2000, 1), Ok(demo::pattern(2000, 1)));
    let s = seen.lock().unwrap().clone();
    assert_eq!(s.len(), 2, "one call, one retransmission: {s:x?}");
    assert_eq!(s[0], s[1], "same XID (RFC 8166 §4.5.3)");
    assert_eq!(c.connects(), 2);
}

/// RPCR-CRD-04/05: receives posted with `QpOptions::post_recv` before
/// `accept` are in place when the peer's first Send arrives right after
/// `connect` returns, however long the application takes after accepting.
#[test]
fn receives_posted_before_accept_meet_the_first_send() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let l = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr();
    let dev2 = dev.clone();
    let srv = std::thread::spawn(move || {
        let req = l.get_request(Some(T)).unwrap();
        let pd = dev2.alloc_pd().unwrap();
        let cq = dev2.create_cq(16).unwrap();
        let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
        let recv = RecvWr {
            wr_id: 1,
            sg_list: vec![mr.sge(0, 4096)],
        };
        let _qp = req.accept(&pd, QpOptions::new(&cq).post_recv([recv])).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let wc = cq.wait(Some(T)).expect("a completion");
        (wc.status, wc.byte_len)
    });
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.connect(addr, QpOptions::new(&cq), T).unwrap();
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    qp.post_send(&[SendWr::new(1, WrOpcode::Send, vec![mr.sge(0, 64)])])
        .unwrap();
    assert_eq!(srv.join().unwrap(), (WcStatus::Success, 64));
}

/// RFC 8166 §4.5.3 from the Requester's side, against our Responder, with the deliberate chunk
/// faults `softrdma nfs probe` uses against Linux (RPCR-MEM-05, RPCR-ERR-05, B.4.5 #16, B.5 #6):
/// - a Write chunk or Reply chunk too small for the reply: RDMA_ERROR/ERR_CHUNK at once, the
///   connection stays up (the Responder detects it before writing, §4.5.3 third bullet);
/// - a stale Write-chunk handle: the Responder's RDMA Write meets our Terminate, the connection
///   ends, the Requester reconnects and retransmits with the same XID, and the Responder, which
///   remembers the XID, answers ERR_CHUNK instead of repeating the operation;
/// - a stale Read-chunk handle: the same through the Responder's failed RDMA Read.
///
/// After each, a normal call on the same client succeeds.
#[test]
fn chunk_faults_get_err_chunk_from_our_responder() {
    use rpcrdma::client::Call;
    use rpcrdma::transport::ChunkFault;
    use rpcrdma::xdr::ReplySizing;

    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev);
    let c = RdmaClient::connect(&dev.alloc_pd().unwrap(), srv.local_addr(), RdmaConfig::default()).unwrap();
    let err_chunk = |r: Result<Vec<u8>, RpcError>| matches!(r, Err(RpcError::RdmaError(ErrorBody::Chunk)));
    let read_args = |size: u32| {
        move |e: &mut Encoder<Vec<u8>>| {
            e.put_u32(size)?;
            e.put_u32(9)
        }
    };
    let decode = |d: &mut rpcrdma::xdr::Decoder<'_>| Ok(d.get_opaque_ddp(demo::MAX_DATA)?.to_vec());

    // a Write chunk of 4 KiB for 64 KiB of data
    let args = read_args(64 << 10);
    let short = ReplySizing {
        max_results: 4 + 4096 + 4,
        ddp_results: vec![4096],
    };
    let call = Call::new(demo::PROGRAM, demo::VERSION, demo::READ, &args, short);
    assert!(err_chunk(c.call(&call, decode)), "short Write chunk");
    // a Reply chunk (Long Reply) too small: 64 KiB of data with no Write chunk and 8 KiB of reply
    let no_ddp = ReplySizing {
        max_results: 8 << 10,
        ddp_results: vec![],
    };
    let call = Call::new(demo::PROGRAM, demo::VERSION, demo::READ, &args, no_ddp);
    assert!(err_chunk(c.call(&call, decode)), "short Reply chunk");
    assert_eq!(c.connects(), 1, "ERR_CHUNK leaves the connection up");
    assert_eq!(demo::read(&c, 100_000, 3).unwrap(), demo::pattern(100_000, 3));

    // a stale Write-chunk handle: Terminate, reconnect, retransmission, ERR_CHUNK
    let args = read_args(64 << 10);
    let call = Call::new(
        demo::PROGRAM,
        demo::VERSION,
        demo::READ,
        &args,
        ReplySizing {
            max_results: 4 + (64 << 10) + 4,
            ddp_results: vec![64 << 10],
        },
    );
    let r = c.call_with_fault(&call, decode, ChunkFault::StaleWriteHandles);
    assert!(
        err_chunk(r.clone()),
        "stale Write chunk: {:?} after {} connects",
        r.map(|v| v.len()),
        c.connects()
    );
    assert_eq!(c.connects(), 2, "the Terminate ended the first connection");
    assert_eq!(demo::read(&c, 100_000, 4).unwrap(), demo::pattern(100_000, 4));

    // a stale Read-chunk handle (a WRITE of 64 KiB goes out through a Read chunk)
    let data = demo::pattern(64 << 10, 5);
    let args = |e: &mut Encoder<Vec<u8>>| {
        e.put_u32(0x7a6)?;
        e.put_opaque_ddp(&data, demo::MAX_DATA)
    };
    let call = Call::new(
        demo::PROGRAM,
        demo::VERSION,
        demo::WRITE,
        &args,
        ReplySizing {
            max_results: 8,
            ddp_results: vec![],
        },
    );
    let r = c.call_with_fault(
        &call,
        |d| Ok((d.get_u32()?, d.get_u32()?)),
        ChunkFault::StaleReadHandles,
    );
    assert!(
        matches!(r, Err(RpcError::RdmaError(ErrorBody::Chunk))),
        "stale Read chunk: {r:?}"
    );
    assert_eq!(c.connects(), 3);
    assert_eq!(
        demo::write(&c, &data).unwrap(),
        (data.len() as u32, demo::checksum(&data))
    );
}
