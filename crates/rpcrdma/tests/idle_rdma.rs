//! Issue 12 point 2 at scale: 1,000 idle RPC-over-RDMA connections to an in-process
//! Responder cost no CPU and no thread each. Its own test binary, so no other test's
//! work shows in the process's CPU time and thread count.
//!
//! The clients are the iwarp crate's raw scripted peer (plain TCP sockets, no threads),
//! so what the process spends while they idle is the server's: its workers, its accept
//! thread and the iWARP device's epoll thread.

#[path = "../../iwarp/tests/rawpeer/mod.rs"]
mod rawpeer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rawpeer::{Ask, RawPeer, op, untagged};
use rpcrdma::demo;
use rpcrdma::private_data::PrivateData;
use rpcrdma::transport::{RdmaConfig, RdmaServer};
use rpcrdma::wire::{Body, ChunkLists, Header};
use rpcrdma::xdr::Encoder;

const CONNS: usize = 1000;

/// User + system CPU time of this process (/proc/self/stat fields 14 and 15, in ticks).
fn cpu_time() -> Duration {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    // the fields after the parenthesised command name
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn threads() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Two fds per connection (our side and the server's) and then some.
fn raise_nofile(n: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        if r.rlim_cur < n {
            r.rlim_cur = n.max(r.rlim_cur);
            r.rlim_max = r.rlim_max.max(n);
            assert_eq!(
                libc::setrlimit(libc::RLIMIT_NOFILE, &r),
                0,
                "raising RLIMIT_NOFILE (root?)"
            );
        }
    }
}

fn null_call(xid: u32) -> Vec<u8> {
    let h = Header {
        xid,
        vers: 1,
        credit: 8,
        body: Body::Msg(ChunkLists::default()),
    };
    let mut e = Encoder::new(Vec::new());
    h.encode_any(&mut e).unwrap();
    let mut m = e.finish().0;
    for w in [xid, 0, 2, demo::PROGRAM, demo::VERSION, demo::NULL, 0, 0, 0, 0] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m
}

/// Issue 12 point 2 and "what must hold" (1,000 idle RDMA connections cost < 5 % of one
/// core; a bounded pool, not a thread per connection; no periodic wake-ups). IUT =
/// Responder. 1,000 connections each make one NULL call, then idle: over 6 s the process
/// uses less than 5 % of one core (0.3 s of CPU) and has a bounded number of threads; a
/// new connection is still served at once.
#[test]
fn thousand_idle_connections_cost_no_cpu_and_no_threads() {
    raise_nofile(4 * CONNS as u64 + 256);
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let threads_before = threads();
    let srv = RdmaServer::spawn(
        &dev,
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(demo::registry()),
        RdmaConfig::default(),
    )
    .unwrap();
    let ask = Ask {
        private_data: PrivateData::default().encode().to_vec(),
        ..Ask::default()
    };
    let mut peers = Vec::with_capacity(CONNS);
    for i in 0..CONNS {
        let mut p = RawPeer::start(srv.local_addr(), &ask).finish(&ask);
        p.send(&untagged(op::SEND, 0, 1, 0, true, 0, &null_call(i as u32)));
        peers.push(p);
    }
    // every connection got its NULL reply
    for p in &mut peers {
        let reply = p.read_until(|_| true).expect("NULL reply");
        assert_eq!(reply[1] & 0x0f, op::SEND, "a Send back");
    }
    assert_eq!(srv.snapshot().replies, CONNS as u64);
    // let the set-up settle, then measure the idle phase
    std::thread::sleep(Duration::from_millis(500));
    let (cpu0, t0) = (cpu_time(), Instant::now());
    std::thread::sleep(Duration::from_secs(6));
    let (cpu, wall) = (cpu_time() - cpu0, t0.elapsed());
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    let threads_now = threads();
    eprintln!(
        "{CONNS} idle connections: {:.3} s CPU in {:.1} s ({:.2} % of a core), {} threads ({} before the server)",
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        share * 100.0,
        threads_now,
        threads_before
    );
    assert!(share < 0.05, "idle connections cost {:.1} % of a core", share * 100.0);
    assert!(
        threads_now <= threads_before + 16,
        "{threads_now} threads for {CONNS} connections"
    );
    // still serving: one more connection gets its answer
    let mut p = RawPeer::start(srv.local_addr(), &ask).finish(&ask);
    p.send(&untagged(op::SEND, 0, 1, 0, true, 0, &null_call(0xffff)));
    assert!(p.read_until(|_| true).is_some());
    assert_eq!(srv.snapshot().fatal, 0);
}
