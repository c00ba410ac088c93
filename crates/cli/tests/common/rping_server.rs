//! Our `softrdma rping -s` in the lab's namespace, as the rping interop tests run it against
//! the guest's rping (interop_siw.rs over siw, interop_rxe.rs over rxe). The including test
//! declares `mod child` (common/child.rs) beside this module.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Our server, bound and waiting for the guest's client.
pub struct OurServer {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub port: u16,
}

/// How our server ended: exit status success, its stdout lines and its stderr.
pub struct OurServerRun {
    pub ok: bool,
    pub stdout: Vec<String>,
    pub stderr: String,
}

impl OurServerRun {
    /// The first stdout line that starts with `prefix` (empty when none does).
    pub fn line(&self, prefix: &str) -> String {
        self.stdout
            .iter()
            .find(|l| l.starts_with(prefix))
            .cloned()
            .unwrap_or_default()
    }
}

impl OurServer {
    /// `BIN rping -s -d -v -a BIND -p PORT --timeout 60 ARGS` in namespace `ns`, returned once
    /// it printed `rdma_bind_addr successful`.
    pub fn start(bin: &str, ns: &str, bind: &str, port: u16, args: &[&str]) -> OurServer {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, bin, "rping", "-s", "-d", "-v", "-a", bind, "-p"])
            .arg(port.to_string())
            .args(["--timeout", "60"])
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("softrdma rping -s");
        let lines = super::child::lines_once_ready(&mut child, "rdma_bind_addr successful", Duration::from_secs(10));
        OurServer { child, lines, port }
    }

    /// Waits up to `secs` for the server to exit (then kills it), and collects its output.
    pub fn finish(mut self, secs: u64) -> OurServerRun {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let ok = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st.success();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut stderr);
        }
        // The reader thread ends at EOF.
        let mut stdout = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(500)) {
            stdout.push(l);
        }
        OurServerRun { ok, stdout, stderr }
    }
}
