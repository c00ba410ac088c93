//! Issue 13's benchmark points as ratios measured in one run on loopback (the machine may
//! be loaded: compare the ratios, not the absolute numbers):
//! - RDMA Write 1 MiB throughput against plain TCP over loopback;
//! - 64 B RDMA Writes per second on one QP;
//! - 8 B Send ping-pong p50 against a busy-polling UDP ping-pong of 8 B.
//!
//! `cargo run -p roce --release --example roce_bench [-- seconds]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use verbs::*;

mod common;
use common::Side;

/// The connected pair of every test here: deep queues for the message-rate tests, and the
/// extra device options of `ROCE_BENCH_OPTS` (e.g. `ROCE_BENCH_OPTS=icrc_rx=udp`).
fn pair(a: &str, b: &str) -> (Side, Side) {
    let opts: Vec<String> = std::env::var("ROCE_BENCH_OPTS")
        .map(|e| e.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    common::rc_pair(a, b, &opts, 1 << 16, 8192)
}

#[allow(dead_code)]
fn spin(cq: &CompletionQueue) -> WorkCompletion {
    loop {
        if let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            return wc;
        }
    }
}

/// utime + stime of this process in seconds (/proc/self/stat, 10 ms ticks).
fn cpu_secs() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) as f64 / 100.0
}

/// Runs `f`, returning its result and the CPU seconds the process used meanwhile.
fn with_cpu<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let c0 = cpu_secs();
    let r = f();
    (r, (cpu_secs() - c0).max(0.01))
}

fn block(cq: &CompletionQueue) -> WorkCompletion {
    let wc = cq.wait(Some(Duration::from_secs(30))).expect("a completion");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    wc
}

fn rdma_write_bw(secs: f64) -> f64 {
    const MSG: usize = 1 << 20;
    let (a, b) = pair("127.79.1.1", "127.79.1.2");
    let ma = a.pd.reg_mr(8 * MSG, Access::all_remote()).unwrap();
    let mb = b.pd.reg_mr(8 * MSG, Access::all_remote()).unwrap();
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while t0.elapsed().as_secs_f64() < secs {
        while posted - done < 8 {
            let off = (posted % 8) as usize * MSG;
            let remote = RemoteAddr {
                addr: mb.addr() + off as u64,
                rkey: mb.rkey(),
            };
            a.qp.post_send_one(SendWr::new(
                posted,
                WrOpcode::RdmaWrite { remote },
                vec![ma.sge(off, MSG as u32)],
            ))
            .unwrap();
            posted += 1;
        }
        block(&a.cq);
        done += 1;
    }
    while done < posted {
        block(&a.cq);
        done += 1;
    }
    let r = (done * MSG as u64) as f64 / t0.elapsed().as_secs_f64();
    counters("write", &a, &b);
    r
}

/// Prints the retransmission and batching counters of both ends (`ROCE_BENCH_COUNTERS=1`):
/// what a slow run did differently from a fast one.
fn counters(test: &str, a: &Side, b: &Side) {
    if !common::counters_wanted() {
        return;
    }
    const SHOWN: [&str; 10] = [
        "sent_pkts",
        "tx_datagrams",
        "tx_syscalls",
        "rx_datagrams",
        "rx_syscalls",
        "retransmitted_pkts",
        "ack_timeouts",
        "rcvd_seq_err",
        "duplicate_request",
        "out_of_seq_request",
    ];
    for (side, s) in [("requester", a), ("responder", b)] {
        let v: Vec<String> = SHOWN
            .iter()
            .map(|n| format!("{n}={}", common::counter(&s.dev, n)))
            .collect();
        eprintln!("  {test} {side}: {}", v.join(" "));
    }
}

fn tcp_bw(secs: f64) -> f64 {
    const MSG: usize = 1 << 20;
    let l = TcpListener::bind("127.79.2.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; MSG];
        let mut n = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k as u64,
            }
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let buf = vec![0x5au8; MSG];
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        s.write_all(&buf).unwrap();
    }
    drop(s);
    let n = rx.join().unwrap();
    n as f64 / t0.elapsed().as_secs_f64()
}

fn small_writes(secs: f64) -> f64 {
    let (a, b) = pair("127.79.3.1", "127.79.3.2");
    let ma = a.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = b.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let remote = RemoteAddr {
        addr: mb.addr(),
        rkey: mb.rkey(),
    };
    const BATCH: u64 = 64;
    let wrs: Vec<SendWr> = (0..BATCH)
        .map(|i| {
            let w = SendWr::new(i, WrOpcode::RdmaWrite { remote }, vec![ma.sge(0, 64)]);
            if i == BATCH - 1 { w } else { w.flags(SendFlags::empty()) }
        })
        .collect();
    let t0 = Instant::now();
    let (mut batches, mut done) = (0u64, 0u64);
    while t0.elapsed().as_secs_f64() < secs {
        while batches - done < 16 {
            a.qp.post_send(&wrs).unwrap();
            batches += 1;
        }
        block(&a.cq);
        done += 1;
    }
    while done < batches {
        block(&a.cq);
        done += 1;
    }
    (done * BATCH) as f64 / t0.elapsed().as_secs_f64()
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn send_latency(iters: usize) -> Duration {
    let (a, b) = pair("127.79.4.1", "127.79.4.2");
    let ma = a.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = b.pd.reg_mr(4096, Access::all_remote()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let recv = |id| RecvWr {
                wr_id: id,
                sg_list: vec![mb.sge(0, 64)],
            };
            for i in 0..64 {
                b.qp.post_recv(&[recv(i)]).unwrap();
            }
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(wc) = b.cq.poll_one() {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    if wc.opcode == WcOpcode::Recv {
                        b.qp.post_recv(&[recv(wc.wr_id)]).unwrap();
                        b.qp.post_send_one(
                            SendWr::new(0, WrOpcode::Send, vec![mb.sge(0, 8)]).flags(SendFlags::empty()),
                        )
                        .unwrap();
                    }
                }
            }
        })
    };
    for i in 0..64 {
        a.qp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: vec![ma.sge(64, 64)],
        }])
        .unwrap();
    }
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        a.qp.post_send_one(SendWr::new(1, WrOpcode::Send, vec![ma.sge(0, 8)]).flags(SendFlags::empty()))
            .unwrap();
        let wc = loop {
            if let Some(wc) = a.cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                if wc.opcode == WcOpcode::Recv {
                    break wc;
                }
            }
        };
        lat.push(t.elapsed());
        a.qp.post_recv(&[RecvWr {
            wr_id: wc.wr_id,
            sg_list: vec![ma.sge(64, 64)],
        }])
        .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    echo.join().unwrap();
    p50(lat)
}

fn udp_latency(iters: usize) -> Duration {
    let a = UdpSocket::bind("127.79.5.1:0").unwrap();
    let b = UdpSocket::bind("127.79.5.2:0").unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    a.connect(b.local_addr().unwrap()).unwrap();
    b.connect(a.local_addr().unwrap()).unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        loop {
            if let Ok(n) = b.recv(&mut buf) {
                if n == 1 {
                    return;
                }
                b.send(&buf[..n]).unwrap();
            }
        }
    });
    let mut buf = [0u8; 64];
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        a.send(&[7u8; 8]).unwrap();
        while a.recv(&mut buf).is_err() {}
        lat.push(t.elapsed());
    }
    a.send(&[0]).unwrap();
    echo.join().unwrap();
    p50(lat)
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let iters = 20_000;
    if std::env::var("ROCE_BENCH_ONLY").as_deref() == Ok("small") {
        println!("64 B Writes: {:.2} M msg/s", small_writes(secs) / 1e6);
        return;
    }
    if std::env::var("ROCE_BENCH_ONLY").as_deref() == Ok("lat") {
        let udp = udp_latency(iters);
        let send = send_latency(iters);
        println!(
            "8 B Send p50: {:.1} us; busy-polling UDP ping-pong p50: {:.1} us; ratio {:.2}",
            send.as_secs_f64() * 1e6,
            udp.as_secs_f64() * 1e6,
            send.as_secs_f64() / udp.as_secs_f64()
        );
        return;
    }
    if std::env::var("ROCE_BENCH_ONLY").as_deref() == Ok("write") {
        println!("RDMA Write 1 MiB: {:.0} MB/s", rdma_write_bw(secs) / 1e6);
        return;
    }
    let (tcp, tcp_cpu) = with_cpu(|| tcp_bw(secs));
    let (rdma, rdma_cpu) = with_cpu(|| rdma_write_bw(secs));
    let (small, small_cpu) = with_cpu(|| small_writes(secs));
    let udp = udp_latency(iters);
    let send = send_latency(iters);
    println!(
        "RDMA Write 1 MiB: {:.0} MB/s; TCP: {:.0} MB/s; ratio {:.2} (target >= 0.9)",
        rdma / 1e6,
        tcp / 1e6,
        rdma / tcp
    );
    // On a loaded machine the wall-clock rates depend on the CPU share the process gets;
    // per CPU-second they do not (both sides of each test run in this process).
    let (tcp_e, rdma_e) = (tcp * secs / tcp_cpu, rdma * secs / rdma_cpu);
    println!(
        "  per CPU-second: RDMA {:.0} MB, TCP {:.0} MB; ratio {:.2} (CPU s: RDMA {rdma_cpu:.2}, TCP {tcp_cpu:.2})",
        rdma_e / 1e6,
        tcp_e / 1e6,
        rdma_e / tcp_e
    );
    println!("64 B Writes, one QP: {:.2} M msg/s (target >= 1)", small / 1e6);
    println!(
        "  per CPU-second: {:.2} M msg (CPU s {small_cpu:.2})",
        small * secs / small_cpu / 1e6
    );
    println!(
        "8 B Send p50: {:.1} us; busy-polling UDP ping-pong p50: {:.1} us; ratio {:.2} (target <= 1.3)",
        send.as_secs_f64() * 1e6,
        udp.as_secs_f64() * 1e6,
        send.as_secs_f64() / udp.as_secs_f64()
    );
}
