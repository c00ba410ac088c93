//! Hostile Requesters against our Responder over real loopback iWARP (issue 12 points 1,
//! 2 and 5): a raw iWARP peer (the iwarp crate's scripted peer, bytes on a plain TCP
//! socket) sends RPC-over-RDMA Calls and answers the Responder's RDMA Read Requests as it
//! likes, so a test sees exactly what the Responder reads, allocates and answers.

#[path = "../../iwarp/tests/rawpeer/mod.rs"]
mod rawpeer;
mod rpcmsg;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::wire::ddp::{Addr, Header as DdpHeader, UNTAGGED_HEADER_LEN};
use rawpeer::{Ask, RawPeer, op, tagged, untagged};
use rpcmsg::{msg, rpc_call};
use rpcrdma::demo;
use rpcrdma::private_data::PrivateData;
use rpcrdma::transport::{RdmaConfig, RdmaServer};
use rpcrdma::wire::{ChunkLists, ReadSegment, Segment, WriteChunk};

/// A raw Requester: MPA with RFC 8797 private data, then Sends on QN 0.
struct Requester {
    peer: RawPeer,
    msn: u32,
    /// RDMA Read Requests the Responder sent us.
    reads: usize,
}

impl Requester {
    fn connect(addr: SocketAddr) -> Requester {
        let ask = Ask {
            private_data: PrivateData::default().encode().to_vec(),
            ..Ask::default()
        };
        let peer = RawPeer::start(addr, &ask).finish(&ask);
        Requester { peer, msn: 1, reads: 0 }
    }

    fn send(&mut self, m: &[u8]) {
        let u = untagged(op::SEND, 0, self.msn, 0, true, 0, m);
        self.msn += 1;
        self.peer.send(&u);
    }

    /// Answer every RDMA Read Request with a Read Response of `answer(requested)` octets
    /// (zeros) until the Responder Sends something; returns that message.
    fn reply(&mut self, answer: impl Fn(u32) -> u32) -> Vec<u8> {
        loop {
            let u = self
                .peer
                .read_until(|_| true)
                .expect("the Responder answers and keeps the connection");
            let h = DdpHeader::parse(&u).expect("DDP header");
            let opcode = h.rdmap_ctrl & 0x0f;
            match (h.addr, opcode) {
                (Addr::Untagged { qn: 1, .. }, op::READ_REQUEST) => {
                    let b = &u[UNTAGGED_HEADER_LEN..];
                    let sink_stag = u32::from_be_bytes(b[0..4].try_into().unwrap());
                    let sink_to = u64::from_be_bytes(b[4..12].try_into().unwrap());
                    let size = u32::from_be_bytes(b[12..16].try_into().unwrap());
                    self.reads += 1;
                    // Read Response segments of 8 KiB (one empty one for nothing)
                    let n = answer(size) as usize;
                    let seg = 8192;
                    let count = n.div_ceil(seg).max(1);
                    let resp: Vec<Vec<u8>> = (0..count)
                        .map(|i| {
                            let len = seg.min(n - i * seg.min(n));
                            let to = sink_to + (i * seg) as u64;
                            tagged(op::READ_RESPONSE, sink_stag, to, i + 1 == count, &vec![0u8; len])
                        })
                        .collect();
                    self.peer.send_all(&resp);
                }
                (Addr::Untagged { qn: 0, .. }, _) => return u[UNTAGGED_HEADER_LEN..].to_vec(),
                (_, op::TERMINATE) => panic!("the Responder terminated the connection"),
                other => panic!("unexpected ULPDU {other:?}"),
            }
        }
    }
}

fn words(m: &[u8]) -> Vec<u32> {
    m.chunks(4).map(|w| u32::from_be_bytes(w.try_into().unwrap())).collect()
}

/// RDMA_ERROR / ERR_CHUNK for `xid` (RFC 8166 §4.5.3: rdma_proc 4, rdma_err 2).
fn assert_err_chunk(m: &[u8], xid: u32, what: &str) {
    let w = words(m);
    assert!(w.len() >= 5, "{what}: a {}-octet answer {w:x?}", m.len());
    assert_eq!(
        [w[0], w[1], w[3], w[4]],
        [xid, 1, 4, 2],
        "{what}: RDMA_ERROR/ERR_CHUNK, got {w:x?}"
    );
}

/// A kB figure of /proc/self/status.
fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn server(dev: &verbs::Device, cfg: RdmaConfig) -> RdmaServer {
    RdmaServer::spawn(dev, "127.0.0.1:0".parse().unwrap(), Arc::new(demo::registry()), cfg).unwrap()
}

fn null_works(r: &mut Requester, xid: u32) {
    r.send(&msg(xid, ChunkLists::default(), &rpc_call(xid, demo::NULL, &[])));
    let a = r.reply(|n| n);
    assert_eq!(words(&a)[7..], [xid, 1, 0, 0, 0, 0], "NULL accepted");
}

/// Issue 12 point 1, RPCR-SEC-05, B.4.5 #16, RFC 8166 §4.5.3 / §8.1.4. IUT = Responder.
/// - A 300-octet Call whose Read list names 8 chunks of 64 MiB (each within `max_chunk`,
///   together 512 MiB, beyond the default `max_call`) gets RDMA_ERROR/ERR_CHUNK without a
///   single RDMA Read, and the server's RSS does not grow by the chunks' size (it used to
///   stage and copy all of them: +500 MB).
/// - A 1 MiB Read chunk (within the budget) whose Read Response is empty gets ERR_CHUNK: a
///   short Read Response does not count as the caller's data (only the completion's
///   byte_len is placed); the demo WRITE does not run on zeros.
/// - The connection stays usable afterwards.
#[test]
fn short_read_responses_and_huge_read_lists_get_err_chunk() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev, RdmaConfig::default());
    let mut r = Requester::connect(srv.local_addr());
    null_works(&mut r, 1);
    let rss0 = status_kb("VmRSS:");
    // 8 chunks of 64 MiB after words 12, 13, ... of a WRITE call padded with 8 words
    // (Positions in the unreduced stream count the chunks before them)
    let big = 64u32 << 20;
    let reads = (0..8u32)
        .map(|i| ReadSegment {
            position: 48 + 4 * i + big * i,
            target: Segment {
                handle: 0x1234_5600 + i,
                length: big,
                offset: 0x10_0000 * u64::from(i),
            },
        })
        .collect();
    let call = rpc_call(0x10, demo::WRITE, &[7, big, 0, 0, 0, 0, 0, 0, 0, 0]);
    r.send(&msg(
        0x10,
        ChunkLists {
            reads,
            ..Default::default()
        },
        &call,
    ));
    let a = r.reply(|_| 0);
    let grown = status_kb("VmRSS:").saturating_sub(rss0);
    assert_err_chunk(&a, 0x10, "8 x 64 MiB Read list");
    assert_eq!(r.reads, 0, "no RDMA Read for a Call beyond max_call (RPCR-SEC-05)");
    assert!(grown < 64 << 10, "RSS grew by {grown} kB for a refused Call");

    // 1 MiB, within the budget, answered by an empty Read Response
    let n = 1u32 << 20;
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 48,
            target: Segment {
                handle: 0x4242_4200,
                length: n,
                offset: 0,
            },
        }],
        ..Default::default()
    };
    r.send(&msg(0x11, lists, &rpc_call(0x11, demo::WRITE, &[7, n])));
    let a = r.reply(|_| 0);
    assert_eq!(r.reads, 1, "the Read was asked for");
    assert_err_chunk(&a, 0x11, "empty Read Response");
    // and one answered with half of what was asked
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 48,
            target: Segment {
                handle: 0x4242_4200,
                length: n,
                offset: 0,
            },
        }],
        ..Default::default()
    };
    r.send(&msg(0x12, lists, &rpc_call(0x12, demo::WRITE, &[7, n])));
    let a = r.reply(|asked| asked / 2);
    assert_err_chunk(&a, 0x12, "half a Read Response");
    assert_eq!(srv.snapshot().short_reads, 2);
    null_works(&mut r, 2);
    assert_eq!(srv.snapshot().fatal, 0, "the connection stayed up");
}

/// Issue 12 point 5, B.5 #6, RFC 8166 §4.5.3 / §6.2 (RPCR-ULB-02). IUT = Responder.
/// READ(64 MiB) with no Write chunk and no Reply chunk (76 octets) gets
/// RDMA_ERROR/ERR_CHUNK before the procedure runs: the peak RSS does not grow by the
/// 64 MiB result the demo server used to build for each such Call. A READ whose Write
/// chunk is too small is refused the same way; one that fits inline is answered.
#[test]
fn read_with_no_room_for_the_result_is_refused_before_the_work() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(&dev, RdmaConfig::default());
    let mut r = Requester::connect(srv.local_addr());
    null_works(&mut r, 1);
    let hwm0 = status_kb("VmHWM:");
    let big = 64u32 << 20;
    for xid in 0x20..0x24 {
        r.send(&msg(xid, ChunkLists::default(), &rpc_call(xid, demo::READ, &[big, 1])));
        let a = r.reply(|n| n);
        assert_err_chunk(&a, xid, "READ(64 MiB) without a Write chunk");
    }
    // a Write chunk of 1 MiB for 64 MiB of results
    let lists = ChunkLists {
        writes: vec![WriteChunk {
            segments: vec![Segment {
                handle: 0x77,
                length: 1 << 20,
                offset: 0,
            }],
        }],
        ..Default::default()
    };
    r.send(&msg(0x30, lists, &rpc_call(0x30, demo::READ, &[big, 1])));
    assert_err_chunk(&r.reply(|n| n), 0x30, "READ(64 MiB) with a 1 MiB Write chunk");
    let grown = status_kb("VmHWM:").saturating_sub(hwm0);
    assert!(grown < 48 << 10, "peak RSS grew by {grown} kB: the results were built");
    // READ(100) fits inline
    r.send(&msg(
        0x31,
        ChunkLists::default(),
        &rpc_call(0x31, demo::READ, &[100, 1]),
    ));
    let a = r.reply(|n| n);
    assert_eq!(words(&a)[..2], [0x31, 1]);
    assert_eq!(words(&a)[7..13], [0x31, 1, 0, 0, 0, 0], "READ(100) accepted");
    assert_eq!(srv.snapshot().fatal, 0);
}

/// Issue 12 "what must hold" (connection cap with a clear refusal). IUT = Responder.
/// With `max_connections` 2, a third connect request is rejected at the MPA level
/// (MPA Reply with the Reject bit), counted in `refused`; once one closes, a new
/// connection is accepted again.
#[test]
fn connections_beyond_the_cap_are_rejected() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(
        &dev,
        RdmaConfig {
            max_connections: 2,
            ..RdmaConfig::default()
        },
    );
    let mut a = Requester::connect(srv.local_addr());
    let mut b = Requester::connect(srv.local_addr());
    null_works(&mut a, 1);
    null_works(&mut b, 2);
    let ask = Ask {
        private_data: PrivateData::default().encode().to_vec(),
        ..Ask::default()
    };
    let mut third = RawPeer::start(srv.local_addr(), &ask);
    let frame = rawpeer::read_mpa_frame(&mut third.sock);
    let rep = iwarp::wire::mpa::Repr::parse_exact(&frame, iwarp::wire::mpa::MAX_PRIVATE_DATA).unwrap();
    assert!(rep.reject, "the third connection is rejected");
    assert_eq!(srv.snapshot().refused, 1);
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut p = RawPeer::start(srv.local_addr(), &ask);
        let frame = rawpeer::read_mpa_frame(&mut p.sock);
        let rep = iwarp::wire::mpa::Repr::parse_exact(&frame, iwarp::wire::mpa::MAX_PRIVATE_DATA).unwrap();
        if !rep.reject {
            break;
        }
        assert!(Instant::now() < deadline, "a slot frees once a connection closes");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 12 "what must hold" (idle timeout). IUT = Responder. A connection with no
/// message for `idle_timeout` is disconnected cleanly (the peer sees the TCP close, no
/// Terminate); a connection that keeps calling is not.
#[test]
fn idle_connections_are_closed() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(
        &dev,
        RdmaConfig {
            idle_timeout: Some(Duration::from_millis(600)),
            ..RdmaConfig::default()
        },
    );
    let mut idle = Requester::connect(srv.local_addr());
    let mut busy = Requester::connect(srv.local_addr());
    null_works(&mut idle, 1);
    let start = Instant::now();
    for xid in 2..12 {
        null_works(&mut busy, xid);
        std::thread::sleep(Duration::from_millis(150));
    }
    let got = idle.peer.read_to_end();
    assert!(got.eof, "the idle connection was closed");
    assert!(got.terminates().is_empty(), "closed cleanly, without a Terminate");
    assert!(start.elapsed() >= Duration::from_millis(400));
    null_works(&mut busy, 20);
    assert_eq!(srv.snapshot().idle_closed, 1);
}

/// Issue 12 point 1 and "what must hold" (a global staging budget). IUT = Responder. With
/// `max_staging` 512 KiB for the whole server, a WRITE whose 1 MiB Read chunk is within
/// `max_call` but finds no room gets an RPC SYSTEM_ERR without any RDMA Read, and a
/// READ(600 KiB) whose result would be staged for its Write chunk gets SYSTEM_ERR instead
/// of the RDMA Writes; small calls go on.
#[test]
fn staging_budget_exhausted_gets_system_err() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = server(
        &dev,
        RdmaConfig {
            max_staging: 512 << 10,
            ..RdmaConfig::default()
        },
    );
    let mut r = Requester::connect(srv.local_addr());
    null_works(&mut r, 1);
    let system_err = |a: &[u8], xid: u32| {
        let w = words(a);
        assert_eq!(
            w[w.len() - 6..],
            [xid, 1, 0, 0, 0, 5],
            "SYSTEM_ERR for {xid:#x}: {w:x?}"
        );
    };
    let n = 1u32 << 20;
    let lists = ChunkLists {
        reads: vec![ReadSegment {
            position: 48,
            target: Segment {
                handle: 0x4242_4200,
                length: n,
                offset: 0,
            },
        }],
        ..Default::default()
    };
    r.send(&msg(0x40, lists, &rpc_call(0x40, demo::WRITE, &[7, n])));
    system_err(&r.reply(|n| n), 0x40);
    assert_eq!(r.reads, 0, "no RDMA Read without staging room");
    let lists = ChunkLists {
        writes: vec![WriteChunk {
            segments: vec![Segment {
                handle: 0x77,
                length: 600 << 10,
                offset: 0,
            }],
        }],
        ..Default::default()
    };
    r.send(&msg(0x41, lists, &rpc_call(0x41, demo::READ, &[600 << 10, 1])));
    system_err(&r.reply(|n| n), 0x41);
    assert_eq!(srv.snapshot().no_stage, 2);
    null_works(&mut r, 2);
    assert_eq!(srv.snapshot().fatal, 0);
}
