//! Issue 18, busy-poll mode: the RPC caller that busy-polls for its Reply declares its spin
//! to the provider, and the device's progress thread does not wake for what the caller reads
//! itself. Counted, never timed. Its own test binary: the iWARP counters it reads are
//! process-wide, and another test's device running beside it would be counted too.
//!
//! Loopback address 127.0.122.1 is this file's.

use std::sync::Arc;
use std::time::Duration;

use rpcrdma::demo;
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};

fn small_calls<C: rpcrdma::client::RpcClient>(c: &C, n: u64) {
    let data: Vec<u8> = (0..64u8).collect();
    for i in 0..n {
        if i % 2 == 0 {
            demo::null(c).unwrap();
        } else {
            assert_eq!(demo::echo(c, &data).unwrap(), data);
        }
    }
}

/// Busy-poll mode (`reply_spin == Duration::MAX`, `rpc bench --busy-poll`): the caller declares
/// its spin on the connection's CQ for each call ([`verbs::CompletionQueue::declare_spin`]), so
/// the device's progress thread does not wake for the Reply (issue 18, session 17: the
/// busy-poll heuristic alone, 20 µs of polls without a 10 µs gap, let it wake ~0.8 times per
/// busy NULL call on 2 loaded vCPUs; its runs per call, counted here, were 1.3-1.5 without the
/// declaration, 0.06-0.08 with it). Counted: the progress thread's socket events and mute checks for the QPs of
/// this process (client and server share one device, as in the bench); the server's worker
/// sleeps in its CQ inline, so its QP is muted as well. RPCR-FRM-01, RPCR-INL-01 (Short Call,
/// Short Reply), RPCR-CRD-07 (one Call after another on one credit's turn).
#[test]
fn busy_caller_keeps_the_progress_thread_asleep() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = RdmaServer::spawn(
        &dev,
        "127.0.122.1:0".parse().unwrap(),
        Arc::new(demo::registry()),
        RdmaConfig::default(),
    )
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cfg = RdmaConfig {
        reply_spin: Duration::MAX,
        ..RdmaConfig::default()
    };
    let client = RdmaClient::connect(&pd, srv.local_addr(), cfg).unwrap();
    small_calls(&client, 20);
    const N: u64 = 400;
    let runs = || iwarp::engine::qp::progress_thread_events() + iwarp::engine::qp::progress_thread_mute_checks();
    let s0 = srv.snapshot();
    let r0 = runs();
    small_calls(&client, N);
    let r = runs() - r0;
    eprintln!("{N} busy small calls: {r} progress-thread runs for the QPs");
    assert_eq!(srv.snapshot().replies - s0.replies, N, "every call answered");
    // The slack: the unmute timer's checks (one per ~2 ms: a loaded machine stretches the
    // run), a mute's writable event, a caller preempted past its call's slice.
    assert!(
        r <= N / 4,
        "{r} progress-thread runs for {N} busy small calls (issue 18: 1.3-1.5 per call without the declaration)"
    );
}
