//! The iWARP listener under hostile load (issue 12 points 4 and 8; the
//! listener resource model in `iwarp::engine::cm`): a burst of 520 MPA
//! connects, the cap on connections in MPA negotiation, and 100 peers holding
//! the listener at its descriptor limit (EMFILE). MPA start-up per RFC 5044
//! §7.1 and RFC 6581 (requirements C.2.1, C.3; C.4 for the denial-of-service
//! class of RFC 5042).
//!
//! The EMFILE test runs the listener in a child process (this test binary
//! re-run with `LISTENER_CHILD` set, see [`child_listener`]) so that its
//! descriptor limit can be lowered and its CPU time measured alone from
//! `/proc/<pid>/stat` (process CPU time, not wall clock).

use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use iwarp::IwarpConfig;
use iwarp::wire::mpa::{self, EnhancedData, FrameKind, RtrSet};
use verbs::*;

const T: Duration = Duration::from_secs(10);
const CHILD_ENV: &str = "LISTENER_CHILD";

fn request() -> Vec<u8> {
    let r = mpa::Repr::enhanced(
        FrameKind::Request,
        EnhancedData {
            ird: 4,
            ord: 4,
            p2p: false,
            rtr: RtrSet::EMPTY,
        },
        b"",
    );
    let mut out = Vec::new();
    r.emit_vec(&mut out).unwrap();
    out
}

fn raise_nofile(limit: Option<u64>) {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = limit.unwrap_or(r.rlim_max).min(r.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
}

/// Issue 12 point 8: a burst of 520 connects, each sending its MPA Request
/// as soon as TCP is up. None is delayed by a dropped SYN (a backlog of 128
/// and a thread per accepted connection delayed 2 of 520 by 1 s), and every
/// Request reaches the application.
#[test]
fn a_burst_of_520_connects_is_not_delayed() {
    raise_nofile(None);
    let dev = iwarp::open_device(IwarpConfig::default()).unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let got = Arc::new(AtomicUsize::new(0));
    let got2 = got.clone();
    let app = std::thread::spawn(move || {
        let mut held = Vec::new();
        while got2.load(Ordering::Relaxed) < 520 {
            match listener.get_request(Some(Duration::from_secs(30))) {
                Ok(r) => {
                    held.push(r);
                    got2.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => break,
            }
        }
        held
    });
    let mut poll = Poll::new().unwrap();
    let mut socks = Vec::new();
    let t0 = Instant::now();
    for i in 0..520 {
        let mut s = MioStream::connect(addr).unwrap();
        poll.registry().register(&mut s, Token(i), Interest::WRITABLE).unwrap();
        socks.push((s, Instant::now(), None::<Duration>));
    }
    let mut events = Events::with_capacity(1024);
    let mut up = 0;
    while up < 520 && t0.elapsed() < Duration::from_secs(30) {
        poll.poll(&mut events, Some(Duration::from_millis(100))).unwrap();
        for ev in events.iter() {
            let (s, start, done) = &mut socks[ev.token().0];
            if done.is_none() && s.peer_addr().is_ok() {
                *done = Some(start.elapsed());
                up += 1;
                let _ = s.write_all(&request());
            }
        }
    }
    let mut worst = socks
        .iter()
        .map(|(_, _, d)| d.unwrap_or(Duration::MAX))
        .collect::<Vec<_>>();
    worst.sort();
    let slow = worst.iter().filter(|d| **d >= Duration::from_millis(900)).count();
    eprintln!(
        "520 connects: median {:?}, worst {:?}, {slow} at 900 ms or more",
        worst[260], worst[519]
    );
    assert_eq!(slow, 0, "{slow} of 520 connects took 900 ms or more (a dropped SYN)");
    let held = app.join().unwrap();
    assert_eq!(held.len(), 520, "every Request reached the application");
}

/// Issue 12 point 8: at most `max_handshakes` connections in MPA
/// negotiation; one more is closed at once (no Reply, no thread), and once
/// the silent ones leave, a proper client is served.
#[test]
fn the_handshake_cap_refuses_at_once() {
    let mut cfg = IwarpConfig {
        request_timeout: Duration::from_secs(8),
        ..IwarpConfig::default()
    };
    cfg.listener.max_handshakes = 4;
    let dev = iwarp::open_device(cfg).unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let silent: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = TcpStream::connect(addr).unwrap();
    extra.write_all(&request()).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 64];
    let r = extra.read(&mut b);
    assert!(
        matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the connection over the cap is closed without a Reply: {r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "at once, not after a timeout");
    assert!(listener.get_request(Some(Duration::from_millis(100))).is_err());
    drop(silent);
    std::thread::sleep(Duration::from_millis(300));
    let pd = dev.alloc_pd().unwrap();
    let (cq_c, cq_s) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
    let (pd2, cq2) = (pd.clone(), cq_c.clone());
    let c = std::thread::spawn(move || pd2.connect(addr, QpOptions::new(&cq2), T));
    let req = listener
        .get_request(Some(T))
        .expect("served once the silent peers left");
    req.accept(&pd, QpOptions::new(&cq_s)).unwrap();
    c.join().unwrap().expect("connected");
}

/// Not a test of its own: the listening process of
/// [`emfile_backs_off_and_recovers`]. Runs only with `LISTENER_CHILD` set:
/// lowers RLIMIT_NOFILE to 64, listens, prints `PORT <n>`, accepts every
/// Request with a QP, and runs until its stdin closes.
#[test]
fn child_listener() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    raise_nofile(Some(64));
    let dev = iwarp::open_device(IwarpConfig::default()).unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    println!("PORT {}", listener.local_addr().port());
    std::io::stdout().flush().unwrap();
    std::thread::spawn(move || {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let mut qps = Vec::new();
        while let Ok(r) = listener.get_request(None) {
            if let Ok(qp) = r.accept(&pd, QpOptions::new(&cq)) {
                qps.push(qp);
            }
        }
    });
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

struct ChildListener {
    child: Child,
    _stdin: ChildStdin,
    addr: SocketAddr,
}

impl ChildListener {
    fn start() -> ChildListener {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_listener", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let port = loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "the child listener started");
            // libtest may print "test child_listener ... " first, on the same line
            if let Some(i) = line.find("PORT ") {
                break line[i + 5..].trim().parse::<u16>().unwrap();
            }
        };
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        ChildListener {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
            _stdin: stdin,
        }
    }

    /// Process CPU time (user + system).
    fn cpu(&self) -> Duration {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let rest = &s[s.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }
}

impl Drop for ChildListener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 12 point 4: under RLIMIT_NOFILE 64, 100 silent peers hold the
/// listener at its descriptor limit. The accept loop backs off instead of
/// spinning (`let Ok(s) = s else { continue }` used a whole core), and once
/// the peers leave a proper client connects within seconds.
#[test]
fn emfile_backs_off_and_recovers() {
    let s = ChildListener::start();
    let peers: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(s.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let c0 = s.cpu();
    std::thread::sleep(Duration::from_secs(4));
    let used = s.cpu() - c0;
    eprintln!("iWARP listener at the fd limit: {used:?} CPU in 4 s");
    assert!(
        used < Duration::from_millis(400),
        "{used:?} of CPU in 4 s at the fd limit"
    );
    drop(peers);
    let t0 = Instant::now();
    let dev = iwarp::open_device(IwarpConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4).unwrap();
    let qp = loop {
        match pd.connect(s.addr, QpOptions::new(&cq), Duration::from_secs(5)) {
            Ok(qp) => break qp,
            Err(e) if t0.elapsed() < Duration::from_secs(5) => {
                eprintln!("not yet: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("not served within 5 s of the peers leaving: {e}"),
        }
    };
    eprintln!("connected {:?} after the peers left", t0.elapsed());
    drop(qp);
}

/// Issue 12 "What must hold": 100 silent peers hold the listener at its
/// descriptor limit and stay; a proper client still connects within seconds,
/// because a negotiation silent for a second or more gives way when
/// descriptors run out (before, the client waited for the 10 s MPA Request
/// timeout of the peers ahead of it).
#[test]
fn at_the_fd_limit_silent_peers_make_room_for_a_client() {
    let s = ChildListener::start();
    let peers: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(s.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    let dev = iwarp::open_device(IwarpConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4).unwrap();
    let qp = pd
        .connect(s.addr, QpOptions::new(&cq), Duration::from_secs(5))
        .expect("served while the silent peers stay");
    eprintln!("connected in {:?} with 100 silent peers still connected", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(4));
    drop(qp);
    drop(peers);
}
