//! The progress model's promise: idle connections cost no CPU. 64 connected
//! QP pairs sit idle for a second; the whole process (progress thread
//! included) must stay under 3% of one CPU. Its own test binary, so no other
//! test shares the process while it measures.

use std::time::Duration;
use verbs::*;

mod pair;
use pair::T;

/// utime + stime of this process in clock ticks (/proc/self/stat).
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the command: state is index 0, utime 11, stime 12.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn sixty_four_idle_connections_use_no_cpu() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let cq = dev.create_cq(1024).unwrap();
    let (pd2, cq2) = (pd.clone(), cq.clone());
    let srv = std::thread::spawn(move || {
        (0..64)
            .map(|_| {
                listener
                    .get_request(Some(T))
                    .unwrap()
                    .accept(&pd2, QpOptions::new(&cq2))
                    .unwrap()
            })
            .collect::<Vec<_>>()
    });
    let clients: Vec<QueuePair> = (0..64)
        .map(|_| pd.connect(addr, QpOptions::new(&cq), T).unwrap())
        .collect();
    let servers = srv.join().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = cpu_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks() - t0;
    // USER_HZ is 100 on Linux: a tick is 10 ms.
    assert!(used <= 3, "64 idle connections used {used} ticks (10 ms each) in 1 s");
    assert_eq!(clients.len() + servers.len(), 128);
}
