//! What this process uses, read from `/proc/self`: CPU seconds, resident memory, open file
//! descriptors, threads. The benchmarks compare these before and after a step.

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat`
/// (in USER_HZ = 100 ticks per second, the fixed Linux ABI value); `None` where unavailable.
pub fn cpu_secs() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// CPU seconds (user + system) the calling thread has used so far
/// (`CLOCK_THREAD_CPUTIME_ID`, nanosecond resolution); `None` where unavailable. Unlike a
/// wall-clock rate, CPU time per message hardly moves when other processes load the machine.
pub fn thread_cpu_secs() -> Option<f64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// Resident set size in bytes (`/proc/self/statm`'s second field, in pages).
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Open file descriptors (entries of `/proc/self/fd`).
pub fn fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// Threads of this process (`Threads:` in `/proc/self/status`).
pub fn threads() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Kernel memory of all TCP sockets on this machine, in bytes (`mem` in pages on the `TCP:`
/// line of `/proc/net/sockstat`; system-wide, so other processes' traffic moves it too).
pub fn tcp_kernel_mem_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = s.lines().find(|l| l.starts_with("TCP:"))?;
    let mut it = line.split_whitespace();
    while let Some(k) = it.next() {
        if k == "mem" {
            let pages: u64 = it.next()?.parse().ok()?;
            // SAFETY: sysconf only reads a configuration value.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            return Some(pages * u64::try_from(page).ok()?);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_is_visible() {
        assert!(super::cpu_secs().is_some());
        assert!(super::rss_bytes().unwrap() > 0);
        assert!(super::fds().unwrap() >= 3);
        assert!(super::threads().unwrap() >= 1);
    }
}
