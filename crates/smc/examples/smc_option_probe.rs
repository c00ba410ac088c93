//! One TCP connection with the SMC-R TCP option written by `smc::sockops`, for checks
//! against another kernel (the lab guest's net/smc): makes a cgroup v2 directory, attaches
//! the program for the one port, moves this process into it, connects (or accepts one
//! connection), prints what the peer's SYN-ACK (or SYN) carried, and cleans up.
//!
//! Usage (root): `smc_option_probe connect IP:PORT` or `smc_option_probe listen IP:PORT`.
//! Prints `peer_offered_smc=Some(true)` / `Some(false)` / `None`; exit 2 on a setup error
//! (the error says which privilege or kernel feature is missing).

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

fn cgroup2_mount() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        post.starts_with("cgroup2 ")
            .then(|| PathBuf::from(pre.split(' ').nth(4).unwrap_or("")))
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, addr) = match (args.get(1), args.get(2).and_then(|a| a.parse::<SocketAddr>().ok())) {
        (Some(m), Some(a)) if m == "connect" || m == "listen" => (m.clone(), a),
        _ => {
            eprintln!("usage: smc_option_probe connect|listen IP:PORT");
            std::process::exit(1);
        }
    };
    let Some(mount) = cgroup2_mount() else {
        eprintln!("no cgroup v2 mount");
        std::process::exit(2);
    };
    let home = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| c.lines().find_map(|l| l.strip_prefix("0::").map(str::to_string)))
        .unwrap_or_else(|| "/".into());
    let home = mount.join(home.trim_start_matches('/'));
    let dir = mount.join(format!("softrdma-smc-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir cgroup");
    let pid = std::process::id().to_string();
    let result = (|| {
        let g = smc::sockops::SmcOption::attach(&dir, &[addr.port()])?;
        std::fs::write(dir.join("cgroup.procs"), &pid).expect("enter cgroup");
        let offered = if mode == "connect" {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
            g.peer_offered_smc(&s)
        } else {
            let l = TcpListener::bind(addr).expect("bind");
            println!("listening on {addr}");
            let (mut s, peer) = l.accept().expect("accept");
            let offered = g.peer_offered_smc(&s);
            s.set_read_timeout(Some(Duration::from_secs(2))).ok();
            let mut buf = [0u8; 256];
            let n = s.read(&mut buf).unwrap_or(0);
            println!("from {peer}: first {n} octets {:02x?}", &buf[..n.min(16)]);
            offered
        };
        std::fs::write(home.join("cgroup.procs"), &pid).expect("leave cgroup");
        Ok::<_, smc::sockops::Error>(offered)
    })();
    let _ = std::fs::write(home.join("cgroup.procs"), &pid);
    let _ = std::fs::remove_dir(&dir);
    match result {
        Ok(o) => println!("peer_offered_smc={o:?}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
