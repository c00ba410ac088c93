//! `AsyncSmcStream` / `AsyncSmcListener` (issue 15, API: the async variant): many streams,
//! SMC-R and fallback mixed, served by one tokio `current_thread` runtime; no thread is
//! parked per stream (counted in /proc/self/task while every stream is mid-transfer).
//! Addresses 127.115.47.x (unique to this file).
//!
//! Requirements: smcr-ipoibcm.md D2 (API: SmcStream mirroring TcpStream, async variant),
//! A2.2 (fallback with the reason visible).

use sha2::{Digest, Sha256};
use smc::clc_machine::FallbackReason;
use smc::stream::async_io::{AsyncSmcListener, AsyncSmcStream};
use smc::{Mode, SmcConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "common/loopback.rs"]
mod loopback;
use loopback::{device, pattern, threads};

const STREAMS: usize = 24;
const BYTES: usize = 128 * 1024;

#[test]
fn many_streams_one_runtime_thread_smc_r_and_fallback() {
    let (ds, dc) = (
        device("smc_async_", "127.115.47.1"),
        device("smc_async_", "127.115.47.2"),
    );
    let base = SmcConfig {
        prefix_len: 8,
        indication_wait: Duration::from_millis(300),
        ..SmcConfig::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_millis(20))
        .build()
        .unwrap();
    let before = threads();
    let (smc, fallback, during) = rt.block_on(async move {
        let l = AsyncSmcListener::bind("127.115.47.1:0", &ds, base.clone())
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        // Every stream waits here (mid-transfer) until all are set up and the threads counted.
        let gate = Arc::new(tokio::sync::Barrier::new(STREAMS + 1));
        let server = tokio::spawn(async move {
            let mut tasks = Vec::new();
            for _ in 0..STREAMS {
                let (mut s, _) = l.accept().await.unwrap();
                tasks.push(tokio::spawn(async move {
                    // Echo a SHA-256 of what arrived, after EOF.
                    let mut h = Sha256::new();
                    let mut buf = vec![0u8; 8192];
                    loop {
                        let n = s.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        h.update(&buf[..n]);
                    }
                    s.write_all(&h.finalize()).await.unwrap();
                    s.shutdown().await.unwrap();
                    s.mode()
                }));
            }
            let mut modes = Vec::new();
            for t in tasks {
                modes.push(t.await.unwrap());
            }
            modes
        });
        let arrived = Arc::new(AtomicUsize::new(0));
        let mut clients = Vec::new();
        for i in 0..STREAMS {
            let (dc, gate, arrived) = (dc.clone(), gate.clone(), arrived.clone());
            // Every third client does not propose: fallback "peer did not indicate SMC".
            let cfg = SmcConfig {
                propose: i % 3 != 0,
                ..base.clone()
            };
            clients.push(tokio::spawn(async move {
                let mut c = AsyncSmcStream::connect(addr, &dc, &cfg).await.unwrap();
                let data = pattern(i as u64 + 7, BYTES);
                c.write_all(&data[..BYTES / 2]).await.unwrap();
                arrived.fetch_add(1, Ordering::Relaxed);
                gate.wait().await;
                c.write_all(&data[BYTES / 2..]).await.unwrap();
                c.shutdown().await.unwrap();
                let mut digest = Vec::new();
                c.read_to_end(&mut digest).await.unwrap();
                assert_eq!(digest, Sha256::digest(&data).to_vec(), "stream {i}");
                c.mode()
            }));
        }
        // All streams connected and half-way, their readers waiting: let the setup threads
        // of the blocking pool go, then count, then release the second halves.
        let mut waited = 0;
        while arrived.load(Ordering::Relaxed) < STREAMS {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waited += 1;
            assert!(waited < 3000, "streams did not all connect");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let during = threads();
        gate.wait().await;
        let mut modes = Vec::new();
        for c in clients {
            modes.push(c.await.unwrap());
        }
        let smodes = server.await.unwrap();
        let smc = modes.iter().filter(|m| **m == Mode::SmcR).count();
        let fb = modes
            .iter()
            .filter(|m| **m == Mode::Fallback(FallbackReason::PeerNoSmc))
            .count();
        assert_eq!(smodes.iter().filter(|m| **m == Mode::SmcR).count(), smc);
        (smc, fb, during)
    });
    println!("{smc} SMC-R + {fallback} fallback streams; threads before {before}, during {during}");
    assert_eq!(smc, STREAMS - STREAMS.div_ceil(3));
    assert_eq!(fallback, STREAMS.div_ceil(3));
    assert!(
        during < before + STREAMS / 2,
        "{during} threads with {STREAMS} streams (before: {before}): a thread per stream?"
    );
}
