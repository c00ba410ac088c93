//! The file-descriptor limit (`ulimit -n`), for commands that open many connections.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit now in
/// force (`None` if it cannot be read).
pub fn raise() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the `rlimit` struct we pass, which
    // lives on our stack for the duration of each call.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return None;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    Some(r.rlim_cur)
}
