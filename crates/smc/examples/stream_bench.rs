//! Issue 15's "SmcStream 1 MiB streaming ≥ 1.0× plain TCP", with the counts that say where a
//! streaming SmcStream waits: one writer thread `write_all`s 1 MiB buffers, one reader thread
//! reads into a 1 MiB buffer, over two soft RoCEv2 devices on loopback; then plain TCP the
//! same way (page-aligned buffers, as the bench's fair baseline) in the same round.
//!
//! Per round it prints both rates and their ratio, the process's CPU seconds per GB and
//! context switches per MiB of each, and per MiB of SMC-R: RDMA Writes, CDCs, waits of the
//! application threads in the CQ, hand-offs, progress-thread passes.
//!
//! `cargo run -p smc --release --example stream_bench [-- MiB rounds rmbe_KiB send_buf_KiB write_chunk_KiB]`
//! (defaults 256 3 512 1024 0; write_chunk 0 = whole free space per RDMA Write).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use smc::stream::{Mode, SmcConfig, SmcListener, SmcStream, engine_counters};
use verbs::{DeviceFactory, DeviceOptions};

const BUF: usize = 1 << 20;

/// A page-aligned 1 MiB buffer inside `store`.
fn aligned(store: &mut Vec<u8>) -> &mut [u8] {
    store.resize(BUF + 4096, 0x5a);
    let at = store.as_ptr().align_offset(4096);
    &mut store[at..at + BUF]
}

fn usage() -> (f64, f64) {
    // SAFETY: an all-zero rusage is valid and `getrusage` fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let cpu = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (cpu(u.ru_utime) + cpu(u.ru_stime), (u.ru_nvcsw + u.ru_nivcsw) as f64)
}

/// Streams `total` octets from `a` to `b`; wall seconds, CPU seconds, context switches.
fn stream<S: Read + Write + Send + 'static>(mut a: S, mut b: S, total: usize) -> (f64, f64, f64) {
    let (c0, s0) = usage();
    let t0 = Instant::now();
    let reader = thread::spawn(move || {
        let mut store = Vec::new();
        let buf = aligned(&mut store);
        let mut got = 0;
        while got < total {
            let n = b.read(buf).expect("read");
            assert!(n > 0, "early EOF");
            got += n;
        }
        b
    });
    let mut store = Vec::new();
    let buf = aligned(&mut store);
    let mut sent = 0;
    while sent < total {
        a.write_all(buf).expect("write");
        sent += BUF;
    }
    let _b = reader.join().unwrap();
    let wall = t0.elapsed().as_secs_f64();
    let (c1, s1) = usage();
    (wall, c1 - c0, s1 - s0)
}

fn device(addr: &str) -> verbs::Device {
    roce::RoceFactory
        .open(
            &DeviceOptions::new()
                .with("addr", addr)
                .with("name", format!("sb_{addr}")),
        )
        .expect("open a RoCEv2 device")
}

fn snapshot() -> [u64; 7] {
    let k = engine_counters();
    [
        k.rdma_writes.load(Ordering::Relaxed),
        k.cdcs_sent.load(Ordering::Relaxed),
        k.caller_waits.load(Ordering::Relaxed),
        k.handoffs.load(Ordering::Relaxed),
        k.passes.load(Ordering::Relaxed),
        k.caller_completions.load(Ordering::Relaxed),
        k.progress_completions.load(Ordering::Relaxed),
    ]
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: u32| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (mib, rounds) = (arg(0, 256) as usize, arg(1, 3));
    let cfg = SmcConfig {
        prefix_len: 8,
        rmbe_len: arg(2, 512) * 1024,
        send_buf: arg(3, 1024) * 1024,
        write_chunk: arg(4, 0) * 1024,
        ..SmcConfig::default()
    };
    let total = mib << 20;
    println!(
        "{mib} MiB per run in 1 MiB writes; RMB element {} KiB, send buffer {} KiB, RDMA Writes of at most {}",
        cfg.rmbe_len / 1024,
        cfg.send_buf / 1024,
        if cfg.write_chunk == 0 {
            "the free space".to_string()
        } else {
            format!("{} KiB", cfg.write_chunk / 1024)
        }
    );
    for r in 0..rounds {
        let (sa, ca) = (format!("127.116.{r}.1"), format!("127.116.{r}.2"));
        let (da, db) = (device(&sa), device(&ca));
        let listener = SmcListener::bind_with(format!("{sa}:0"), &da, cfg.clone()).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || listener.accept().unwrap().0);
        let c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
        let s = server.join().unwrap();
        assert_eq!((c.mode(), s.mode()), (Mode::SmcR, Mode::SmcR));
        let k0 = snapshot();
        let (smc, scpu, ssw) = stream(c, s, total);
        let k1 = snapshot();
        if std::env::var_os("STREAM_BENCH_SMC_ONLY").is_some() {
            println!(
                "round {}: SMC-R {:.0} MiB/s, CPU s per GB {:.3}",
                r + 1,
                mib as f64 / smc,
                scpu / (total as f64 / 1e9)
            );
            continue;
        }
        let l = TcpListener::bind(format!("{sa}:0")).unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || l.accept().unwrap().0);
        let c = TcpStream::connect(addr).unwrap();
        c.set_nodelay(true).unwrap();
        let s = t.join().unwrap();
        let (tcp, tcpu, tsw) = stream(c, s, total);
        let per = |i: usize| (k1[i] - k0[i]) as f64 / mib as f64;
        let gb = total as f64 / 1e9;
        println!(
            "round {}: SMC-R {:.0} MiB/s, TCP {:.0} MiB/s, ratio {:.3}; CPU s per GB {:.3} / {:.3}; context switches per MiB {:.1} / {:.1}",
            r + 1,
            mib as f64 / smc,
            mib as f64 / tcp,
            tcp / smc,
            scpu / gb,
            tcpu / gb,
            ssw / mib as f64,
            tsw / mib as f64,
        );
        println!(
            "         per MiB: RDMA Writes {:.2}, CDCs {:.2}, caller CQ waits {:.2}, hand-offs {:.2}, progress passes {:.2}, completions by callers {:.2} / by progress threads {:.2}",
            per(0),
            per(1),
            per(2),
            per(3),
            per(4),
            per(5),
            per(6),
        );
    }
}
