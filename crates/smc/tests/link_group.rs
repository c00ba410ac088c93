//! Link groups over the soft RoCEv2 transport (A2.3 first contact, A2.4 subsequent contact,
//! A2.5, A2.7, A4.3, A4.8, A4.9; issue 15 "one progress driver per link group"): many
//! concurrent connections share one group with a bounded number of threads, new RMBs are
//! announced with CONFIRM RKEY, idle connections cost no CPU, and `smc stat`'s socket shows
//! the group. Addresses 127.115.20.x–127.115.22.x, unique to this file.

use sha2::{Digest, Sha256};
use smc::stats::{self, ConnMode, LinkState, Role};
use smc::{Mode, SmcConfig, SmcListener, SmcStream};
use std::io::{Read, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

#[path = "common/loopback.rs"]
mod loopback;
use loopback::{device, threads};

/// The tests of this file run one at a time (thread and CPU counts are per process).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn cpu_ms() -> u64 {
    // utime + stime of the whole process, in clock ticks (100 Hz).
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) * 10
}

/// The test data of connection `seed`: the shared xorshift stream, its seed spread first.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    loopback::pattern(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), len)
}

/// SMC-SC-1..7, SMC-SC-2/5 (CONFIRM RKEY for new RMBs), SMC-LG-6 (one group per role),
/// and the bounded driver: 40 connections at once share one group per side; every one moves
/// 256 KiB each way hash-checked; the process has a fixed number of SMC threads (one per
/// group), not one per connection; 40 idle connections cost (next to) no CPU.
#[test]
fn concurrent_connections_share_one_group_and_one_thread() {
    const N: usize = 40;
    const LEN: usize = 256 * 1024;
    let _s = serial();
    let (da, db) = (device("smc_", "127.115.20.1"), device("smc_", "127.115.20.2"));
    let cfg = SmcConfig {
        prefix_len: 8,
        rmbe_len: 16 * 1024,
        send_buf: 16 * 1024,
        ..SmcConfig::default()
    };
    let listener = SmcListener::bind_with("127.115.20.1:0", &da, cfg.clone()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || (0..N).map(|_| listener.accept().unwrap().0).collect::<Vec<_>>());
    let clients: Vec<SmcStream> = (0..N)
        .map(|_| SmcStream::connect_with(addr, &db, &cfg).unwrap())
        .collect();
    let servers = server.join().unwrap();
    let cg: std::collections::BTreeSet<_> = clients.iter().map(|c| c.link_group().unwrap()).collect();
    let sg: std::collections::BTreeSet<_> = servers.iter().map(|c| c.link_group().unwrap()).collect();
    assert_eq!((cg.len(), sg.len()), (1, 1));
    let snap = stats::snapshot();
    let groups: Vec<_> = snap
        .link_groups
        .iter()
        .filter(|g| cg.contains(&g.id) || sg.contains(&g.id))
        .collect();
    assert_eq!(groups.len(), 2);
    for g in &groups {
        assert_eq!(g.conns as usize, N);
        assert_eq!(g.links.len(), 1);
        assert_eq!(g.links[0].state, LinkState::Active);
        assert_eq!(g.elements_used as usize, N);
        // One element per RMB (the default): every RMB after the first was announced with
        // CONFIRM RKEY (and the peer's were answered): N−1 requests + N−1 replies sent.
        assert_eq!(g.rmbs as usize, N);
        assert!(g.links[0].llc_sent >= 2 * (N as u64 - 1), "{g:?}");
    }
    let roles: Vec<Role> = groups.iter().map(|g| g.role).collect();
    assert!(roles.contains(&Role::Server) && roles.contains(&Role::Client));
    // Server and client local QPN/peer QPN cross-match.
    assert_eq!(groups[0].links[0].local_qpn, groups[1].links[0].peer_qpn);

    // Idle: nothing happens on 2×40 connections for a second → hardly any CPU.
    let (t_idle, c0) = (threads(), cpu_ms());
    thread::sleep(Duration::from_secs(1));
    let idle_cpu = cpu_ms() - c0;
    assert!(idle_cpu <= 150, "idle connections used {idle_cpu} ms of CPU in 1 s");

    // Traffic on all of them at once, both ways, hash-checked.
    let bar = Arc::new(Barrier::new(2 * N));
    let mut hs = Vec::new();
    for (i, (c, s)) in clients.into_iter().zip(servers).enumerate() {
        for (seed, mut a, mut b) in [
            (i as u64 * 2, c.try_clone().unwrap(), s.try_clone().unwrap()),
            (i as u64 * 2 + 1, s, c),
        ] {
            let bar = Arc::clone(&bar);
            hs.push(thread::spawn(move || {
                bar.wait();
                let data = pattern(seed, LEN);
                let want: [u8; 32] = Sha256::digest(&data).into();
                let w = thread::spawn(move || {
                    a.write_all(&data).unwrap();
                    a
                });
                let mut got = vec![0u8; LEN];
                b.read_exact(&mut got).unwrap();
                let got: [u8; 32] = Sha256::digest(&got).into();
                assert_eq!(got, want, "stream {seed}");
                (w.join().unwrap(), b)
            }));
        }
    }
    let t_busy = threads();
    let ends: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    // The SMC threads did not grow with the connections: the test's own 2N workers (and
    // their writers) aside, the count is what it was when idle.
    assert!(t_busy <= t_idle + 4 * N, "threads {t_idle} idle, {t_busy} busy");
    drop(ends);
    eprintln!(
        "{N} connections: 1 link group per side, 2 QPs, {t_idle} threads in the process, idle CPU {idle_cpu} ms/s"
    );
}

/// A4.9: after the last connection the group lingers (a new connection reuses it), then
/// both sides free it; the next connection is a first contact again (new QPs).
#[test]
fn idle_group_lingers_then_is_freed() {
    let _s = serial();
    let (da, db) = (device("smc_", "127.115.21.1"), device("smc_", "127.115.21.2"));
    let cfg = SmcConfig {
        prefix_len: 8,
        rmbe_len: 16 * 1024,
        send_buf: 16 * 1024,
        linger: Duration::from_millis(400),
        ..SmcConfig::default()
    };
    let listener = Arc::new(SmcListener::bind_with("127.115.21.1:0", &da, cfg.clone()).unwrap());
    let addr = listener.local_addr().unwrap();
    let one = |l: &Arc<SmcListener>| {
        let l = Arc::clone(l);
        let s = thread::spawn(move || l.accept().unwrap().0);
        let mut c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
        let mut s = s.join().unwrap();
        assert_eq!((c.mode(), s.mode()), (Mode::SmcR, Mode::SmcR));
        c.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        (c.link_group().unwrap(), s.link_group().unwrap())
    };
    let first = one(&listener);
    thread::sleep(Duration::from_millis(100));
    assert!(
        stats::snapshot()
            .link_groups
            .iter()
            .any(|g| g.id == first.0 && g.lingering)
    );
    let second = one(&listener);
    assert_eq!(first, second, "reused while lingering");
    let t0 = Instant::now();
    while stats::snapshot()
        .link_groups
        .iter()
        .any(|g| g.id == first.0 || g.id == first.1)
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "group not freed");
        thread::sleep(Duration::from_millis(20));
    }
    let third = one(&listener);
    assert_ne!(third, first, "a new first contact after the group was freed");
}

/// `smc stat`'s path: the process publishes its snapshot on a unix socket; `collect` (what
/// `softrdma smc stat` calls) reads it and sees the group, its link and both connections,
/// and a fallback connection with its reason.
#[test]
fn stats_socket_shows_groups_links_and_connections() {
    let _s = serial();
    let dir = std::env::temp_dir().join(format!("smc-lg-test-{}", std::process::id()));
    let p = stats::Publisher::start(&dir).unwrap();
    let (da, db) = (device("smc_", "127.115.22.1"), device("smc_", "127.115.22.2"));
    let cfg = SmcConfig {
        prefix_len: 8,
        linger: Duration::from_millis(200),
        ..SmcConfig::default()
    };
    let listener = SmcListener::bind_with("127.115.22.1:0", &da, cfg.clone()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let a = listener.accept().unwrap().0;
        let b = listener.accept().unwrap().0;
        (a, b)
    });
    let mut c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
    let plain = SmcStream::connect_with(
        addr,
        &db,
        &SmcConfig {
            propose: false,
            ..cfg.clone()
        },
    )
    .unwrap();
    let (mut s, fb) = server.join().unwrap();
    assert!(matches!(fb.mode(), Mode::Fallback(_)));
    c.write_all(&[1u8; 1000]).unwrap();
    let mut b = vec![0u8; 1000];
    s.read_exact(&mut b).unwrap();
    let snaps = stats::collect(&dir);
    assert_eq!(snaps.len(), 1);
    let snap = &snaps[0];
    let gid = c.link_group().unwrap();
    let g = snap
        .link_groups
        .iter()
        .find(|g| g.id == gid)
        .expect("client group listed");
    assert_eq!(g.role, Role::Client);
    assert_eq!(g.links[0].local_gid, "::ffff:127.115.22.2");
    assert_eq!(g.links[0].peer_gid, "::ffff:127.115.22.1");
    let cs = snap
        .connections
        .iter()
        .find(|x| x.link_group == Some(gid))
        .expect("client connection listed");
    assert_eq!((cs.mode, cs.bytes_sent), (ConnMode::SmcR, 1000));
    let ss = snap
        .connections
        .iter()
        .find(|x| x.link_group == s.link_group())
        .expect("server connection listed");
    assert_eq!(ss.bytes_received, 1000);
    assert!(
        snap.connections
            .iter()
            .any(|x| x.mode == ConnMode::Fallback && x.fallback_reason.as_deref() == Some("peer did not indicate SMC")),
        "{:?}",
        snap.connections
    );
    let text = stats::render_text(&snaps);
    assert!(
        text.contains("SMCR") && text.contains("peer did not indicate SMC"),
        "{text}"
    );
    drop((plain, fb));
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}
