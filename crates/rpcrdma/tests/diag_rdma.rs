//! Issue 12 "Diagnostics": the Responder says when and how a client's connection ended,
//! with the QP number and the peer's address, at info level or above. Its own test binary:
//! it installs the process-wide log subscriber.

#[path = "../../iwarp/tests/rawpeer/mod.rs"]
mod rawpeer;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rawpeer::{Ask, RawPeer, op, tagged};
use rpcrdma::demo;
use rpcrdma::private_data::PrivateData;
use rpcrdma::transport::{RdmaConfig, RdmaServer};

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// Wait until a line containing every one of `parts` was logged; returns it.
    fn wait_line(&self, parts: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
            if let Some(l) = text.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
                return l.to_string();
            }
            assert!(Instant::now() < deadline, "no log line with {parts:?} in:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A client that closes its connection is logged as "peer closed the connection" (INFO),
/// one that violates the protocol as a failed connection with the Terminate we sent
/// (WARN); both lines name the QP and the peer's address.
#[test]
fn connection_ends_are_logged_with_qp_and_peer() {
    let log = Log::default();
    let w = log.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .init();
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = RdmaServer::spawn(
        &dev,
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(demo::registry()),
        RdmaConfig::default(),
    )
    .unwrap();
    let ask = Ask {
        private_data: PrivateData::default().encode().to_vec(),
        ..Ask::default()
    };
    let quiet = RawPeer::start(srv.local_addr(), &ask).finish(&ask);
    let addr = quiet.sock.local_addr().unwrap().to_string();
    drop(quiet);
    let l = log.wait_line(&["peer closed the connection", &addr]);
    eprintln!("{l}");
    assert!(l.contains("INFO") && l.contains("qp="), "{l}");

    let mut bad = RawPeer::start(srv.local_addr(), &ask).finish(&ask);
    let addr = bad.sock.local_addr().unwrap().to_string();
    // an RDMA Write to an STag the server never advertised
    bad.send(&tagged(op::WRITE, 0xdead_be00, 0, true, b"hostile"));
    let l = log.wait_line(&["connection failed", "Terminate", &addr]);
    eprintln!("{l}");
    assert!(l.contains("WARN") && l.contains("qp="), "{l}");
}
