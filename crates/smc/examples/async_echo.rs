//! `AsyncSmcStream` on one tokio thread: an echo server and N clients in one
//! `current_thread` runtime, over two soft RoCEv2 devices on loopback addresses. Every
//! client sends a pattern and checks the echo octet for octet; the example prints each
//! side's mode and the time taken, and fails if a stream is not SMC-R.
//!
//! `cargo run -p smc --release --example async_echo -- [CONNS] [BYTES] [SERVER_IP] [CLIENT_IP]`
//! (defaults 16 connections, 256 KiB each, 127.115.40.1 / 127.115.40.2). CI runs it through
//! its `#[test]` (`cargo test --all-targets` builds the example as a test).

use smc::stream::async_io::{AsyncSmcListener, AsyncSmcStream};
use smc::{Mode, SmcConfig};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../tests/common/loopback.rs"]
mod loopback;
use loopback::{device, pattern};

/// Runs the echo; returns the number of SMC-R streams on the client side.
fn run(conns: usize, bytes: usize, server_ip: &str, client_ip: &str) -> usize {
    let (ds, dc) = (device("smc_async_", server_ip), device("smc_async_", client_ip));
    let cfg = SmcConfig {
        prefix_len: 8,
        ..SmcConfig::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // CLC setup runs on the blocking pool (both ends are in this process, so it needs
        // room for a client's and a server's setup at once); idle setup threads leave after
        // 50 ms: the data path parks no thread.
        .thread_keep_alive(std::time::Duration::from_millis(50))
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let l = AsyncSmcListener::bind(format!("{server_ip}:0"), &ds, cfg.clone())
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let mut tasks = Vec::new();
            for _ in 0..conns {
                let (mut s, _) = l.accept().await.expect("accept");
                assert_eq!(s.mode(), Mode::SmcR, "server side");
                tasks.push(tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = s.read(&mut buf).await.expect("server read");
                        if n == 0 {
                            break;
                        }
                        s.write_all(&buf[..n]).await.expect("server write");
                    }
                    s.shutdown().await.expect("server shutdown");
                }));
            }
            for t in tasks {
                t.await.expect("echo task");
            }
        });
        let t0 = Instant::now();
        let mut clients = Vec::new();
        for i in 0..conns {
            let dc = dc.clone();
            let cfg = cfg.clone();
            clients.push(tokio::spawn(async move {
                let c = AsyncSmcStream::connect(addr, &dc, &cfg).await.expect("connect");
                let smc = c.mode() == Mode::SmcR;
                let data = pattern(i as u64 + 1, bytes);
                let (mut r, mut w) = tokio::io::split(c);
                let d2 = data.clone();
                let writer = tokio::spawn(async move {
                    w.write_all(&d2).await.expect("client write");
                    w.shutdown().await.expect("client shutdown");
                });
                let mut got = Vec::with_capacity(bytes);
                r.read_to_end(&mut got).await.expect("client read");
                writer.await.expect("writer");
                assert!(
                    got == data,
                    "stream {i}: echo differs ({} of {} octets)",
                    got.len(),
                    bytes
                );
                smc
            }));
        }
        let mut smc = 0;
        for c in clients {
            smc += usize::from(c.await.expect("client task"));
        }
        server.await.expect("server");
        println!(
            "{conns} streams x {bytes} octets echoed on one runtime thread in {:.2} s; {smc} SMC-R",
            t0.elapsed().as_secs_f64()
        );
        smc
    })
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let conns = a.get(1).and_then(|v| v.parse().ok()).unwrap_or(16);
    let bytes = a.get(2).and_then(|v| v.parse().ok()).unwrap_or(256 * 1024);
    let sip = a.get(3).map_or("127.115.40.1", String::as_str);
    let cip = a.get(4).map_or("127.115.40.2", String::as_str);
    let smc = run(conns, bytes, sip, cip);
    if smc != conns {
        eprintln!("only {smc} of {conns} streams were SMC-R");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    // Issue 15 (API: the async variant): the example itself, small, in CI.
    #[test]
    fn example_runs() {
        assert_eq!(super::run(8, 64 * 1024, "127.115.41.1", "127.115.41.2"), 8);
    }
}
