//! RPC-over-RDMA end to end over real loopback iWARP (our provider): the demo
//! program with Short, Chunked and Long Calls, inline, Write-chunk and Long
//! Replies, inline-threshold boundaries, padding 0-3, RFC 8797 negotiation,
//! remote invalidation, credits under load, and the same program served over
//! TCP and RDMA at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rpcrdma::client::{Call, RpcClient};
use rpcrdma::demo;
use rpcrdma::inline::CallOptions;
use rpcrdma::private_data::Negotiated;
use rpcrdma::server::Registry;
use rpcrdma::tcp::{TcpClient, TcpServer};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer, StatsSnapshot};
use rpcrdma::xdr::ReplySizing;
use verbs::Device;

struct Setup {
    _dev: Device,
    srv: RdmaServer,
    client: RdmaClient,
}

fn setup_with(reg: Registry, scfg: RdmaConfig, ccfg: RdmaConfig) -> Setup {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = RdmaServer::spawn(&dev, "127.0.0.1:0".parse().unwrap(), Arc::new(reg), scfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let client = RdmaClient::connect(&pd, srv.local_addr(), ccfg).unwrap();
    Setup { _dev: dev, srv, client }
}

fn setup() -> Setup {
    setup_with(demo::registry(), RdmaConfig::default(), RdmaConfig::default())
}

/// The counters changed by `f`.
fn delta(s: &Setup, f: impl FnOnce()) -> StatsSnapshot {
    let a = s.srv.snapshot();
    f();
    let b = s.srv.snapshot();
    StatsSnapshot {
        replies: b.replies - a.replies,
        rdma_errors: b.rdma_errors - a.rdma_errors,
        dropped: b.dropped - a.dropped,
        fatal: b.fatal - a.fatal,
        remote_invalidations: b.remote_invalidations - a.remote_invalidations,
        // counted by the accept thread, asynchronously
        connections: 0,
        calls_short: b.calls_short - a.calls_short,
        calls_chunked: b.calls_chunked - a.calls_chunked,
        calls_long: b.calls_long - a.calls_long,
        replies_inline: b.replies_inline - a.replies_inline,
        replies_write_chunks: b.replies_write_chunks - a.replies_write_chunks,
        replies_long: b.replies_long - a.replies_long,
        refused: b.refused - a.refused,
        idle_closed: b.idle_closed - a.idle_closed,
        timeouts: b.timeouts - a.timeouts,
        short_reads: b.short_reads - a.short_reads,
        no_stage: b.no_stage - a.no_stage,
        // compared by `write_chunk_results_are_not_copied_in_user_space` alone ([`copied`])
        copied_octets: 0,
        pool_wakeups: b.pool_wakeups - a.pool_wakeups,
        // which thread posts a Reply depends on the scheduler (not compared)
        replies_left_to_poster: 0,
    }
}

fn one_call(calls: [u64; 3], replies: [u64; 3]) -> StatsSnapshot {
    StatsSnapshot {
        replies: 1,
        calls_short: calls[0],
        calls_chunked: calls[1],
        calls_long: calls[2],
        replies_inline: replies[0],
        replies_write_chunks: replies[1],
        replies_long: replies[2],
        ..Default::default()
    }
}

const SHORT: [u64; 3] = [1, 0, 0];
const CHUNKED: [u64; 3] = [0, 1, 0];
const LONG: [u64; 3] = [0, 0, 1];
const INLINE: [u64; 3] = [1, 0, 0];
const WRITE_CHUNK: [u64; 3] = [0, 1, 0];
const LONG_REPLY: [u64; 3] = [0, 0, 1];

/// RPCR-FRM-09, RPCR-INL-03, RPCR-RDC-01/04, RPCR-DDP-02/06: WRITE moves its
/// data inline while header + payload <= 1024 and in a Read chunk beyond.
/// Call = 28 (header) + 40 (RPC header) + 8 + roundup(n): XDR keeps every size a
/// multiple of 4, so threshold - 1 and threshold + 1 are 1020 and 1028.
#[test]
fn call_threshold_boundary_and_read_chunks() {
    let s = setup();
    for (n, form, inv) in [
        (944usize, SHORT, 0),
        (948, SHORT, 0),
        (949, CHUNKED, 1),
        (952, CHUNKED, 1),
    ] {
        let d = demo::pattern(n, 1);
        let got = delta(&s, || {
            assert_eq!(
                demo::write(&s.client, &d).unwrap(),
                (n as u32, demo::checksum(&d)),
                "{n}"
            )
        });
        let mut want = one_call(form, INLINE);
        want.remote_invalidations = inv; // the Read chunk's STag is the only one
        assert_eq!(got, want, "write {n}");
    }
    assert_eq!(s.client.connects(), 1);
}

/// RPCR-LNG-04, RPCR-WRC-01/02/04/05/11: READ's reply is inline up to 1024
/// bytes with the header counted (28 + 24 + 4 + roundup(n) + 4), and goes
/// through a Write chunk beyond; the Responder invalidates the Write chunk's
/// STag with Send With Invalidate (RFC 8797 R set by both).
#[test]
fn reply_threshold_boundary_and_write_chunks() {
    let s = setup();
    for (n, form) in [
        (960usize, INLINE),
        (964, INLINE),
        (965, WRITE_CHUNK),
        (968, WRITE_CHUNK),
        (1 << 20, WRITE_CHUNK),
    ] {
        let got = delta(&s, || {
            assert_eq!(demo::read(&s.client, n, 7).unwrap(), demo::pattern(n, 7))
        });
        let mut want = one_call(SHORT, form);
        want.remote_invalidations = u64::from(form == WRITE_CHUNK);
        assert_eq!(got, want, "read {n}");
    }
}

/// Padding 0..3 of Read chunks and Write chunks (RPCR-RDC-04, RPCR-WRC-04,
/// RPCR-DDP-06): ECHO moves odd sizes both ways; the reply's trailer-less
/// opaque and the next call line up.
#[test]
fn padding_read_and_write_chunks() {
    let s = setup();
    for n in 2000..2008usize {
        let d = demo::pattern(n, n as u32);
        let got = delta(&s, || assert_eq!(demo::echo(&s.client, &d).unwrap(), d, "echo {n}"));
        assert_eq!(
            (got.calls_chunked, got.replies_write_chunks),
            (1, 1),
            "echo {n}: {got:?}"
        );
        let got = delta(&s, || {
            assert_eq!(demo::read(&s.client, n, 3).unwrap(), demo::pattern(n, 3))
        });
        assert_eq!(got.replies_write_chunks, 1);
    }
}

/// RPCR-LNG-01/02/05/07/08, RPCR-DDP-10: with reduction off (as for RPCSEC_GSS
/// integrity) odd-length data travels padded in a Position-Zero Read chunk and
/// comes back padded in the Reply chunk; a forced Long Call works too (RPCR-LNG-03).
#[test]
fn long_calls_long_replies_with_padding() {
    let cfg = RdmaConfig {
        call_options: CallOptions {
            no_reduction: true,
            force_long: false,
        },
        ..Default::default()
    };
    let s = setup_with(demo::registry(), RdmaConfig::default(), cfg);
    for n in 3000..3004usize {
        let d = demo::pattern(n, 11);
        let got = delta(&s, || assert_eq!(demo::echo(&s.client, &d).unwrap(), d, "echo {n}"));
        assert_eq!(got, one_call(LONG, LONG_REPLY), "echo {n}");
    }
    let forced = RdmaConfig {
        call_options: CallOptions {
            force_long: true,
            no_reduction: false,
        },
        ..Default::default()
    };
    let s = setup_with(demo::registry(), RdmaConfig::default(), forced);
    let got = delta(&s, || assert_eq!(demo::echo(&s.client, b"tiny").unwrap(), b"tiny"));
    let mut want = one_call(LONG, INLINE);
    want.remote_invalidations = 1; // the Position-Zero chunk's STag
    assert_eq!(got, want);
}

/// RPCR-LNG-01/04/05: WORDS has no DDP-eligible item, so a big one is a Long
/// Call and a Long Reply; a small one is Short both ways.
#[test]
fn words_long_call_and_long_reply() {
    let s = setup();
    for (n, call, reply) in [
        (10usize, SHORT, INLINE),
        (300, LONG, LONG_REPLY),
        (200_000, LONG, LONG_REPLY),
    ] {
        let w: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
        let got = delta(&s, || {
            assert_eq!(
                demo::words(&s.client, &w).unwrap(),
                w.iter().rev().copied().collect::<Vec<_>>()
            )
        });
        assert_eq!(got.calls_short + got.calls_chunked + got.calls_long, 1);
        assert_eq!(got, one_call(call, reply), "words {n}: {got:?}");
    }
}

/// RPCR-INL-01/03, RFC 8797: private data 4 KiB both ways raises both
/// thresholds; without private data both sides use 1024; without the R bit on
/// one side no Send With Invalidate is used and the Requester invalidates locally.
#[test]
fn private_data_negotiation_and_remote_invalidation() {
    let big = RdmaConfig {
        inline_send: 4096,
        inline_recv: 4096,
        ..Default::default()
    };
    let s = setup_with(demo::registry(), big.clone(), big.clone());
    let n = s.client.negotiated().unwrap();
    assert_eq!(
        (n.thresholds.call, n.thresholds.reply, n.remote_invalidation),
        (4096, 4096, true)
    );
    // 3000 bytes now fit inline both ways
    let d = demo::pattern(3000, 1);
    let got = delta(&s, || assert_eq!(demo::echo(&s.client, &d).unwrap(), d));
    assert_eq!(got, one_call(SHORT, INLINE));

    let off = RdmaConfig {
        private_data: false,
        ..big.clone()
    };
    let s = setup_with(demo::registry(), big.clone(), off);
    let Negotiated {
        thresholds,
        remote_invalidation,
    } = s.client.negotiated().unwrap();
    assert_eq!(
        (thresholds.call, thresholds.reply, remote_invalidation),
        (1024, 1024, false)
    );
    let got = delta(&s, || assert_eq!(demo::echo(&s.client, &d).unwrap(), d));
    assert_eq!(got, one_call(CHUNKED, WRITE_CHUNK), "server fell back to 1024 too");

    let no_r = RdmaConfig {
        remote_invalidation: false,
        ..Default::default()
    };
    let s = setup_with(demo::registry(), RdmaConfig::default(), no_r);
    let got = delta(&s, || {
        assert_eq!(demo::read(&s.client, 100_000, 1).unwrap(), demo::pattern(100_000, 1))
    });
    assert_eq!(got, one_call(SHORT, WRITE_CHUNK), "no Send With Invalidate");
}

/// RPCR-CRD-01/03/04/05/07: a server granting 4 credits and 8 threads making
/// 40 calls each: no overrun is ever detected (the Responder would close the
/// connection), no reconnect happens, every result is right.
#[test]
fn credits_under_load() {
    let scfg = RdmaConfig {
        credits: 4,
        ..Default::default()
    };
    let s = Arc::new(setup_with(demo::registry(), scfg, RdmaConfig::default()));
    let ts: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..40usize {
                    let n = (t * 997 + i * 4099) % 9000;
                    if i % 2 == 0 {
                        assert_eq!(demo::read(&s.client, n, t as u32).unwrap(), demo::pattern(n, t as u32));
                    } else {
                        let d = demo::pattern(n, i as u32);
                        assert_eq!(demo::echo(&s.client, &d).unwrap(), d);
                    }
                }
            })
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }
    let st = s.srv.snapshot();
    assert_eq!((st.fatal, st.connections, st.replies), (0, 1, 320), "{st:?}");
    assert_eq!(s.client.connects(), 1);
}

/// Issue 5 item 4: the same registry served over TCP and RDMA at once; each
/// handler call sees its transport.
#[test]
fn same_program_over_tcp_and_rdma_at_once() {
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let mut reg = demo::registry();
    let c2 = counts.clone();
    reg.register(demo::PROGRAM, demo::VERSION, 20, move |ctx, _, e| {
        c2[usize::from(ctx.transport == "rdma")].fetch_add(1, Ordering::Relaxed);
        e.put_string(ctx.transport.as_bytes(), 16)?;
        Ok(())
    });
    let reg = Arc::new(reg);
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let rdma = RdmaServer::spawn(&dev, "127.0.0.1:0".parse().unwrap(), reg.clone(), RdmaConfig::default()).unwrap();
    let tcp = TcpServer::spawn("127.0.0.1:0".parse().unwrap(), reg).unwrap();
    let rc = RdmaClient::connect(&dev.alloc_pd().unwrap(), rdma.local_addr(), RdmaConfig::default()).unwrap();
    let tc = TcpClient::connect(tcp.local_addr()).unwrap();
    fn both<C: RpcClient>(c: &C, want: &[u8]) {
        for n in [0usize, 5, 1500, 200_000] {
            let d = demo::pattern(n, 2);
            assert_eq!(demo::echo(c, &d).unwrap(), d);
            assert_eq!(demo::read(c, n, 4).unwrap(), demo::pattern(n, 4));
        }
        let call = Call::new(
            demo::PROGRAM,
            demo::VERSION,
            20,
            &|_| Ok(()),
            ReplySizing {
                max_results: 20,
                ddp_results: vec![],
            },
        );
        assert_eq!(c.call(&call, |d| Ok(d.get_string(16)?.to_vec())).unwrap(), want);
    }
    std::thread::scope(|sc| {
        sc.spawn(|| both(&rc, b"rdma"));
        sc.spawn(|| both(&tc, b"tcp"));
    });
    assert_eq!(
        (counts[0].load(Ordering::Relaxed), counts[1].load(Ordering::Relaxed)),
        (1, 1)
    );
    assert_eq!(rdma.snapshot().replies, 9);
}

/// Octets the server copied between its heap and its stage while `f` ran.
fn copied(s: &Setup, f: impl FnOnce()) -> u64 {
    let a = s.srv.snapshot().copied_octets;
    f();
    s.srv.snapshot().copied_octets - a
}

/// Issue 18 (RPCR-WRC-02, RPCR-DDP-02): a READ's result goes from the reply the procedure
/// encoded straight into the Requester's Write chunk, and the Requester decodes it where it
/// was placed: no user-space copy of the data on either side (each used to copy the whole
/// 1 MiB once; ONC RPC over TCP makes two). A WRITE's Read chunk is used where the RDMA
/// Reads placed it (RPCR-RDC-04). Counted, not timed.
#[test]
fn write_chunk_results_are_not_copied_in_user_space() {
    let s = setup();
    let client_before = s.client.copied_octets();
    let mut n = 0;
    let d = delta(&s, || {
        n = copied(&s, || {
            for seed in 0..8 {
                assert_eq!(demo::read_checked(&s.client, 1 << 20, seed).unwrap(), 1 << 20);
            }
            // a size with pad, checked byte for byte
            assert_eq!(demo::read(&s.client, 100_001, 9).unwrap(), demo::pattern(100_001, 9));
        })
    });
    assert_eq!(d.replies_write_chunks, 9, "{d:?}");
    assert_eq!(n, 0, "the server copied reply data into its stage");
    assert_eq!(
        s.client.copied_octets() - client_before,
        0,
        "the client copied Write chunks out"
    );
    // a WRITE's Read chunk: the procedure reads it in the stage the RDMA Reads filled (and
    // the stage is used again by the next Calls, not registered anew)
    let d = delta(&s, || {
        n = copied(&s, || {
            for seed in 0..6 {
                let data = demo::pattern((1 << 20) - seed as usize, seed);
                let (n, sum) = demo::write(&s.client, &data).unwrap();
                assert_eq!((n as usize, sum), (data.len(), demo::checksum(&data)));
            }
        })
    });
    assert_eq!(d.calls_chunked, 6, "{d:?}");
    assert_eq!(n, 0, "the server copied Read chunks out of its stage");
    // a Long Reply still goes through the stage (counted, so the counter can fail)
    let words: Vec<u32> = (0..2000).collect();
    let d = delta(&s, || {
        n = copied(&s, || {
            let back = demo::words(&s.client, &words).unwrap();
            assert_eq!(back.len(), words.len());
        })
    });
    assert_eq!(d.replies_long, 1, "{d:?}");
    assert!(n >= 8000, "a Long Reply of 8000 octets is staged: {n}");
}
