//! SMC-R's second link on real (soft) devices and failover, between two network namespaces
//! joined by **two veth pairs**, one soft RoCEv2 device per veth (issue 15 "what must hold",
//! first point; requirements A4.7, A4.8, A5, SMC-FO-1..5, SMC-LG-10/11/13, D1, D2).
//! Namespaces `s11foA` / `s11foB`, veths `s11foA1`–`s11foB1` (10.116.1.0/24) and
//! `s11foA2`–`s11foB2` (10.116.2.0/24). Needs root; skips otherwise.
//!
//! One link group with both devices on each side ([`SmcConfig::alt_device`]): the server
//! adds the second link (ADD LINK on veth 2), connections go on the link with the fewest;
//! a transfer each way runs (64 MiB; `SMC_NETNS_MIB=1024` for the 1 GiB run by hand)
//! while veth 1 is taken down in the middle: its connections move to link 2 and the data
//! arrives hash-checked (no loss, no duplicate); `smc stat` shows one link and one
//! failover; veth 1 brought back up, the server adds a link again (two links) and new
//! traffic flows over both.

use smc::stats::{self, LinkState, Role};
use smc::{Mode, SmcConfig, SmcListener, SmcStream};
use std::thread;
use std::time::{Duration, Instant};

#[path = "common/netns.rs"]
mod netns;
use netns::{Lab, device, in_ns, transfer};

const NS: [&str; 2] = ["s11foA", "s11foB"];

/// Both directions at once on one connection pair, hash-checked.
fn both_ways(c: SmcStream, s: SmcStream, seed: u64, len: usize, progress: Option<std::sync::mpsc::Sender<()>>) {
    let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
    let up = thread::spawn(move || transfer(c2, s2, seed, len, None));
    let (h1, w1) = transfer(s, c, seed + 1, len, progress).expect("server to client");
    let (h2, w2) = up.join().unwrap().expect("client to server");
    assert_eq!(h1, w1, "server to client hash");
    assert_eq!(h2, w2, "client to server hash");
}

/// A link group as the test looks at it: role, (link, state) pairs, failovers, links added.
type GroupView = (Role, Vec<(u8, LinkState)>, u64, u64);

/// The (server, client) link groups of this process: their links and failovers.
fn groups() -> Vec<GroupView> {
    stats::snapshot()
        .link_groups
        .iter()
        .map(|g| {
            (
                g.role,
                g.links.iter().map(|l| (l.link_num, l.state)).collect(),
                g.failovers,
                g.links_added,
            )
        })
        .collect()
}

fn active_links(role: Role) -> Vec<u8> {
    groups()
        .into_iter()
        .filter(|g| g.0 == role)
        .flat_map(|g| g.1.into_iter().filter(|l| l.1 == LinkState::Active).map(|l| l.0))
        .collect()
}

/// Waits (generously: under load) until both ends show `n` active links.
fn wait_links(n: usize, what: &str) -> Duration {
    let t = Instant::now();
    while active_links(Role::Server).len() != n || active_links(Role::Client).len() != n {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{what}: not {n} links after 60 s: {:?}",
            groups()
        );
        thread::sleep(Duration::from_millis(50));
    }
    t.elapsed()
}

/// The link numbers the SMC-R connections of role `role` use.
fn conn_links() -> Vec<u8> {
    let mut v: Vec<u8> = stats::snapshot().connections.iter().filter_map(|c| c.link).collect();
    v.sort_unstable();
    v
}

#[test]
fn second_link_failover_and_readd_a4_7() {
    let Some(lab) = Lab::up(NS, "10.116") else { return };
    let mib: usize = std::env::var("SMC_NETNS_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let len = mib << 20;
    let base = SmcConfig {
        rmbe_len: 512 * 1024,
        send_buf: 1 << 20,
        keepalive: Duration::from_secs(2),
        add_link_retry: Duration::from_secs(1),
        linger: Duration::from_secs(1),
        ..SmcConfig::default()
    };

    // Server in A on veth 1's device with veth 2's as the second; client in B likewise.
    let scfg = base.clone();
    let listener = in_ns(NS[0], move || {
        let d1 = device("10.116.1.1");
        let d2 = device("10.116.2.1");
        let cfg = SmcConfig {
            alt_device: Some(d2),
            ..scfg
        };
        std::sync::Arc::new(SmcListener::bind_with("10.116.1.1:5300", &d1, cfg).unwrap())
    })
    .join()
    .unwrap();
    let ccfg = in_ns(NS[1], {
        let base = base.clone();
        move || SmcConfig {
            alt_device: Some(device("10.116.2.2")),
            ..base
        }
    })
    .join()
    .unwrap();
    let cdev = in_ns(NS[1], || device("10.116.1.2")).join().unwrap();
    let pair = || {
        let l = std::sync::Arc::clone(&listener);
        let server = thread::spawn(move || l.accept().map_err(|e| format!("accept: {e}")).unwrap().0);
        let (d, c2) = (cdev.clone(), ccfg.clone());
        let c = in_ns(NS[1], move || {
            SmcStream::connect_with("10.116.1.1:5300", &d, &c2).unwrap()
        })
        .join()
        .unwrap();
        let s = server.join().unwrap();
        assert_eq!((c.mode(), s.mode()), (Mode::SmcR, Mode::SmcR));
        (c, s)
    };

    // First contact on link 1; the server adds link 2 on veth 2.
    let (c1, s1) = pair();
    let t = wait_links(2, "ADD LINK");
    eprintln!("second link up {t:?} after the first contact: {:?}", groups());
    // The next connection goes on the link with fewer connections: the new one.
    let (c2, s2) = pair();
    assert_eq!(conn_links(), vec![1, 1, 2, 2], "one connection per link (both ends)");
    let t0 = Instant::now();
    let h = thread::spawn(move || both_ways(c2, s2, 100, 16 << 20, None));
    both_ways(c1.try_clone().unwrap(), s1.try_clone().unwrap(), 200, 16 << 20, None);
    h.join().unwrap();
    eprintln!("16 MiB each way on each link in {:?}, hashes equal", t0.elapsed());

    // A transfer each way over link 1; veth 1 goes down after 8 MiB arrived.
    let (tx, rx) = std::sync::mpsc::channel();
    let (cc, sc) = (c1.try_clone().unwrap(), s1.try_clone().unwrap());
    let t0 = Instant::now();
    let run = thread::spawn(move || both_ways(cc, sc, 300, len, Some(tx)));
    rx.recv_timeout(Duration::from_secs(120)).expect("8 MiB over link 1");
    assert!(lab.set_veth(1, false));
    let down_at = Instant::now();
    run.join()
        .expect("the transfer completes over the surviving link, hashes equal");
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{mib} MiB each way with veth 1 down {:?} after the start: {secs:.2} s, hashes equal",
        down_at - t0
    );
    // One link left on each end, one failover counted (the server frees the failed link on
    // the client's DELETE LINK reply, SMC-LG-10).
    let t = wait_links(1, "failover");
    let g = groups();
    eprintln!("after failover ({t:?}): {g:?}");
    for role in [Role::Server, Role::Client] {
        let (_, links, failovers, _) = g.iter().find(|x| x.0 == role).unwrap().clone();
        // The failed link is freed; while veth 1 stays down the server keeps trying to add
        // a link on it (every `add_link_retry`, SMC-LG-13): such a link is Activating only.
        let active: Vec<_> = links.iter().filter(|l| l.1 != LinkState::Activating).collect();
        assert_eq!(active, [&(2, LinkState::Active)], "{role:?}: {links:?}");
        assert_eq!(failovers, 1, "{role:?}: one failover");
    }
    // (The second pair is closed by now: the first one remains, at both ends.)
    assert_eq!(conn_links(), vec![2, 2], "the connection moved to link 2");

    // Veth 1 back: the server adds a link again; a new connection goes on it and traffic
    // flows over both links.
    assert!(lab.set_veth(1, true));
    let t = wait_links(2, "re-ADD LINK");
    eprintln!("link re-added {t:?} after veth 1 came back: {:?}", groups());
    let (c3, s3) = pair();
    let links = conn_links();
    assert_eq!(links.iter().filter(|l| **l == 2).count(), 2, "{links:?}");
    assert_eq!(links.len(), 4, "{links:?}");
    let new_link = *links
        .iter()
        .find(|l| **l != 2)
        .expect("a connection on the re-added link");
    let h = thread::spawn(move || both_ways(c3, s3, 400, 16 << 20, None));
    both_ways(c1, s1, 500, 16 << 20, None);
    h.join().unwrap();
    eprintln!("16 MiB each way on links 2 and {new_link} after the re-add, hashes equal");

    // Every stream is closed: the groups linger 1 s (the client's 2 s more) and are freed.
    // Nothing of the failed link or of the failed re-add attempts is left (QPs, MRs).
    let t = Instant::now();
    loop {
        let r = stats::snapshot().resources;
        if (r.link_groups, r.links, r.qps, r.mrs, r.rmb_elements) == (0, 0, 0, 0, 0) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "resources left: {r:?}");
        thread::sleep(Duration::from_millis(100));
    }
}
