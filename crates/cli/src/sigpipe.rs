//! `softrdma ... | head` must end quietly, as C tools do, instead of panicking
//! in `println!` when the reader goes away. Rust ignores SIGPIPE at start-up;
//! this restores the default action, so a write to a closed pipe ends the
//! process with SIGPIPE (no message), the behaviour shells expect.

/// Restores SIGPIPE's default action. Call once, first thing in `main`.
pub fn restore_default() {
    // SAFETY: signal(2) with SIG_DFL installs no handler code; it only resets
    // the disposition of SIGPIPE for this process, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
