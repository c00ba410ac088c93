//! Progress of long runs (`bench --duration`, `rpc bench`, `nfs get/put` of large
//! files) with `indicatif`: drawn on stderr when it is a terminal and the output is
//! not `--json`; `--progress` asks for it anyway (into a pipe too, one redraw per
//! line). Results never go through here: they stay on stdout.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Redraws per second.
const HZ: u8 = 4;

/// Whether to show progress: asked for (`--progress`), or by default on a terminal
/// unless the output is JSON.
pub fn wanted(forced: bool, json: bool) -> bool {
    forced || (!json && std::io::stderr().is_terminal())
}

/// Where the bar draws: stderr (hidden when it is no terminal), or stderr even when
/// it is a pipe if `forced`.
fn target(forced: bool) -> ProgressDrawTarget {
    if forced && !std::io::stderr().is_terminal() {
        ProgressDrawTarget::term_like_with_hz(Box::new(console::Term::stderr()), HZ)
    } else {
        ProgressDrawTarget::stderr_with_hz(HZ)
    }
}

/// A spinner with a prefix and a message the caller updates (rates, counts).
pub fn spinner(on: bool, forced: bool, prefix: String) -> Option<ProgressBar> {
    on.then(|| {
        let pb = ProgressBar::with_draw_target(None, target(forced));
        pb.set_style(ProgressStyle::with_template("{spinner} {prefix}: {msg}").expect("a valid template"));
        pb.set_prefix(prefix);
        pb
    })
}

/// A bar over `total` bytes with the rate and the time left.
pub fn bytes(on: bool, forced: bool, total: u64) -> Option<ProgressBar> {
    on.then(|| {
        let pb = ProgressBar::with_draw_target(Some(total), target(forced));
        pb.set_style(
            ProgressStyle::with_template(
                "{percent:>3}% [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        pb
    })
}

/// A bar over `total` items (calls) with their rate.
pub fn count(on: bool, prefix: String, total: u64) -> Option<ProgressBar> {
    on.then(|| {
        let pb = ProgressBar::with_draw_target(Some(total), target(false));
        pb.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {human_pos}/{human_len} {per_sec} ETA {eta}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        pb.set_prefix(prefix);
        pb
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_turns_the_default_off_and_progress_forces_it() {
        assert!(!wanted(false, true));
        assert!(wanted(true, true) && wanted(true, false));
        // Under `cargo test` stderr is captured (not a terminal): no default progress.
        if !std::io::stderr().is_terminal() {
            assert!(!wanted(false, false));
        }
        assert!(spinner(false, false, "x".into()).is_none());
        let b = bytes(true, false, 10).unwrap();
        b.set_position(10);
        assert_eq!(b.position(), 10);
        b.finish_and_clear();
    }
}
