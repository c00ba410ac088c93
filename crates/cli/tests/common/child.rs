//! A child process whose stdout lines a test reads as they come.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Forwards `child`'s stdout (piped) line by line to a channel, and returns it once a line
/// starting with `ready` has come; the lines before it are dropped. Kills and reaps the child
/// and panics when no such line comes within `timeout` (or stdout ends first).
pub fn lines_once_ready(child: &mut Child, ready: &str, timeout: Duration) -> mpsc::Receiver<String> {
    let out = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + timeout;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.starts_with(ready) => return rx,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no {ready:?} line from the child: {e}");
            }
        }
    }
}
