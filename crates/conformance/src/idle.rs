//! The progress model's promise: idle connections cost no CPU (design.md,
//! issue 13 "Idle QPs cost no CPU"). 64 connected QP pairs sit idle for a
//! second; the whole process (progress threads included) must stay under 3 %
//! of one CPU. Run it in its own test binary, so no other test shares the
//! process while it measures.

use crate::{Caps, Fixture};
use std::time::Duration;

/// utime + stime of this process in clock ticks (/proc/self/stat).
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the command: state is index 0, utime 11, stime 12.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// 64 idle connected pairs use at most 3 ticks (30 ms) of CPU in 1 s.
pub fn sixty_four_idle_connections_use_no_cpu(fx: &dyn Fixture) {
    let (a, b) = fx.ends(&fx.variants()[0], 1024);
    let pairs = fx.connect(&a, &b, 64, &Caps::default());
    std::thread::sleep(Duration::from_millis(200));
    let t0 = cpu_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks() - t0;
    // USER_HZ is 100 on Linux: a tick is 10 ms.
    assert!(
        used <= 3,
        "{}: 64 idle connections used {used} ticks (10 ms each) in 1 s",
        fx.name()
    );
    assert_eq!(pairs.len(), 64);
}
