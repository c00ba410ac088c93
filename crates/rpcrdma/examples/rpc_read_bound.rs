//! Issue 18's bound for `rpc bench --size 1M` with one caller: what any transport that
//! carries the READ reply over one loopback TCP connection can reach, measured next to
//! ONC RPC over TCP and RPC-over-RDMA (iWARP, itself over TCP) in the same run.
//!
//! The bound is a TCP ping-pong doing only the unavoidable work of one READ call: the
//! caller writes an 8-byte request and reads the reply's `size` bytes into one reused buffer
//! (one kernel copy) and checks them as `demo::read_checked` does; the server thread reads
//! the request, fills a reused buffer with `demo::pattern` (the procedure's work) and writes
//! it (one kernel copy). No RPC header, no record marking, no user-space copy, no hand-off
//! to another thread. Every design over kernel TCP sockets (iWARP included) does at least
//! this, so `rdma / tcp <= bound / tcp` within noise.
//!
//! ```sh
//! cargo run --release -p rpcrdma --example rpc_read_bound -- [SIZE_BYTES=1048576] [CALLS=1000] [ROUNDS=3]
//! ```
//!
//! The three are run one after another in each round (so each ratio compares the same
//! minutes) on 127.0.131.x.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use rpcrdma::client::RpcClient;
use rpcrdma::demo;
use rpcrdma::tcp::{TcpClient, TcpServer};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};

fn arg(i: usize, default: usize) -> usize {
    std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

/// The caller's check of `demo::read_checked`: every 61st byte and the last.
fn check(data: &[u8], seed: u32) -> bool {
    let byte = |i: usize| (i as u32).wrapping_mul(31).wrapping_add(seed ^ (i as u32 >> 8)) as u8;
    (0..data.len())
        .step_by(61)
        .chain(data.len().checked_sub(1))
        .all(|i| data[i] == byte(i))
}

/// The bound: `calls` request/reply exchanges of `size` bytes; bytes per second.
fn bound(size: usize, calls: usize) -> f64 {
    let l = TcpListener::bind("127.0.131.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut out = vec![0u8; size];
        let mut req = [0u8; 8];
        while s.read_exact(&mut req).is_ok() {
            let seed = u32::from_be_bytes(req[4..].try_into().unwrap());
            demo::fill_pattern(&mut out, seed);
            s.write_all(&out).unwrap();
        }
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let mut buf = vec![0u8; size];
    let mut one = |seed: u32| {
        let mut req = [0u8; 8];
        req[..4].copy_from_slice(&(size as u32).to_be_bytes());
        req[4..].copy_from_slice(&seed.to_be_bytes());
        c.write_all(&req).unwrap();
        c.read_exact(&mut buf).unwrap();
        assert!(check(&buf, seed), "bad data");
    };
    one(0);
    let t = Instant::now();
    for i in 0..calls {
        one(i as u32);
    }
    let secs = t.elapsed().as_secs_f64();
    drop(c);
    server.join().unwrap();
    (calls * size) as f64 / secs
}

fn rpc<C: RpcClient>(c: &C, size: usize, calls: usize) -> f64 {
    demo::read_checked(c, size, 0).unwrap();
    let t = Instant::now();
    for i in 0..calls {
        assert_eq!(demo::read_checked(c, size, i as u32).unwrap(), size);
    }
    (calls * size) as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let size = arg(1, 1 << 20);
    let calls = arg(2, 1000);
    let rounds = arg(3, 3);
    let reg = Arc::new(demo::registry());
    let tcp_srv = TcpServer::spawn("127.0.131.2:0".parse().unwrap(), reg.clone()).unwrap();
    let tcp = TcpClient::connect(tcp_srv.local_addr()).unwrap();
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let rdma_srv = RdmaServer::spawn(&dev, "127.0.131.3:0".parse().unwrap(), reg, RdmaConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let rdma = RdmaClient::connect(&pd, rdma_srv.local_addr(), RdmaConfig::default()).unwrap();
    println!("READ of {size} bytes, {calls} calls one at a time, {rounds} rounds (MB/s = 10^6 B/s)");
    println!("round  bound  onc-rpc/tcp  rpc-over-rdma  bound/tcp  rdma/tcp  rdma/bound");
    for r in 1..=rounds {
        let b = bound(size, calls) / 1e6;
        let t = rpc(&tcp, size, calls) / 1e6;
        let d = rpc(&rdma, size, calls) / 1e6;
        println!(
            "{r:5} {b:6.0} {t:12.0} {d:14.0} {:10.2} {:9.2} {:11.2}",
            b / t,
            d / t,
            d / b
        );
    }
}
