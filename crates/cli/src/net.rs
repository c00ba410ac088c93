//! Addresses on the command line and long network waits.
//!
//! * [`host_port`]: `HOST:PORT` where HOST is an IP address or a name (`localhost:18515`,
//!   `[::1]:20049`, `server.example:7174`), resolved with the system resolver
//!   ([`ToSocketAddrs`]); an IPv4 address is preferred when a name has both.
//! * [`Notice`]: says on stderr what a command is waiting for once the wait has lasted a
//!   second, so that a silent server is not a silent terminal.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// `HOST:PORT` -> the first address it resolves to (IPv4 first), as a clap value parser.
pub fn host_port(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not HOST:PORT (e.g. 127.0.0.1:18515 or localhost:18515)"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{s:?}: the port must be a number from 0 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    resolve(host, port).map_err(|e| format!("{s:?}: {e}"))
}

/// `host` (an IP address or a name) with `port`; an IPv4 address is preferred.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve host {host:?}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("host {host:?} has no address"))
}

/// Prints one line on stderr if it is still alive after a delay (a wait that lasts): what
/// is being waited for and which option bounds it. Dropping it before then prints nothing.
pub struct Notice {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Notice {
    /// The usual delay: long enough that a quick answer shows nothing.
    pub const DELAY: Duration = Duration::from_secs(1);

    /// `msg` on stderr after [`Notice::DELAY`] unless dropped first.
    pub fn new(msg: impl Into<String>) -> Notice {
        Notice::after(Notice::DELAY, msg)
    }

    /// `msg` on stderr after `delay` unless dropped first.
    pub fn after(delay: Duration, msg: impl Into<String>) -> Notice {
        let msg = msg.into();
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("notice".into())
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(delay) {
                    eprintln!("{msg}");
                }
            })
            .ok();
        Notice { stop: Some(tx), thread }
    }
}

impl Drop for Notice {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_takes_addresses_and_names() {
        assert_eq!(host_port("127.0.0.1:5"), Ok("127.0.0.1:5".parse().unwrap()));
        assert_eq!(host_port("[::1]:5"), Ok("[::1]:5".parse().unwrap()));
        // A name: resolved, IPv4 preferred (localhost is in every /etc/hosts).
        assert_eq!(host_port("localhost:1"), Ok("127.0.0.1:1".parse().unwrap()));
        assert!(host_port("localhost").unwrap_err().contains("HOST:PORT"));
        assert!(host_port("localhost:99999").unwrap_err().contains("port"));
        assert!(
            host_port("no-such-host.invalid:1")
                .unwrap_err()
                .contains("cannot resolve")
        );
    }
}
