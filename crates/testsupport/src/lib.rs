//! Dev-only helpers the live-capture tests share (crates/roce/tests/tshark_live.rs,
//! tshark_ud.rs, crates/smc/tests/tshark_smc.rs): a tcpdump on `lo` that the test starts and
//! stops, the frames of the pcap file it writes, the IPv4/UDP parts of a frame (for our own
//! ICRC check), and tshark run over the file; and a counting global allocator ([`alloc`]) for
//! the tests that count heap allocations.
//!
//! A test skips (prints why and returns) when tcpdump or tshark is missing or tcpdump may not
//! capture here: [`have`] and [`Capture::start`] returning `None`.

#![warn(missing_docs)]

pub mod alloc;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use pcap_file::pcap::PcapReader;

/// tcpdump's snapshot length and buffer for RoCEv2 bursts: `-s 8192 -B 32768`. With `-s 0`
/// (256 KiB slots) and the default buffer the ring held few frames, and on a loaded machine
/// tcpdump lost a burst of Read Responses ("dropped by kernel"); 8 KiB covers every RoCEv2
/// packet of a 4096-octet path MTU.
pub const ROCE_RING: [&str; 4] = ["-s", "8192", "-B", "32768"];

/// Whether `cmd --version` runs and succeeds.
pub fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Both tshark and tcpdump are installed; prints the skip message when not.
pub fn have_tshark_and_tcpdump() -> bool {
    let ok = have("tshark") && have("tcpdump");
    if !ok {
        eprintln!("skipped: tshark or tcpdump missing");
    }
    ok
}

/// A fresh directory under the temp dir, named `softrdma-<tag>-<pid>`, writable by all: tcpdump
/// started by root writes its file as user tcpdump.
pub fn capture_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softrdma-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// The frames of a pcap file (a partial last record is not counted; an absent or unreadable
/// file has none).
pub fn frames_of(file: &Path) -> Vec<Vec<u8>> {
    let Ok(bytes) = std::fs::read(file) else {
        return Vec::new();
    };
    let Ok(mut r) = PcapReader::new(std::io::Cursor::new(bytes)) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    while let Some(Ok(p)) = r.next_packet() {
        v.push(p.data.into_owned());
    }
    v
}

/// The IPv4 header, the UDP header and the UDP payload of an Ethernet frame captured on `lo`;
/// panics (naming frame `n`) on anything else.
pub fn ipv4_udp(frame: &[u8], n: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let s = SlicedPacket::from_ethernet(frame).unwrap_or_else(|e| panic!("frame {n}: not Ethernet: {e:?}"));
    let Some(NetSlice::Ipv4(ip)) = s.net else {
        panic!("frame {n}: not IPv4")
    };
    let Some(TransportSlice::Udp(udp)) = s.transport else {
        panic!("frame {n}: not UDP")
    };
    (
        ip.header().slice().to_vec(),
        udp.header_slice().to_vec(),
        udp.payload().to_vec(),
    )
}

/// A tcpdump (on `lo`, or wherever [`Capture::spawn`]'s command runs it) writing one pcap
/// file. Dropping it stops tcpdump with SIGINT (so it
/// flushes and closes the file) and reaps it, also when the test fails half-way.
pub struct Capture {
    child: Child,
    err: ChildStderr,
    file: PathBuf,
    stopped: bool,
}

impl Capture {
    /// Starts `tcpdump -i lo -U --immediate-mode -n <ring> -w <file> <filter>` and waits (up to
    /// `timeout`) until it says "listening on". `None`, after printing the skip reason, when
    /// tcpdump cannot capture here. `ring` is the snapshot length and buffer, normally
    /// [`ROCE_RING`].
    pub fn start(file: &Path, ring: &[&str], filter: &str, timeout: Duration) -> Option<Capture> {
        let mut cmd = Command::new("tcpdump");
        cmd.args(["-i", "lo", "-U", "--immediate-mode", "-n"])
            .args(ring)
            .arg("-w")
            .arg(file)
            .arg(filter);
        Capture::spawn(cmd, file, timeout)
    }

    /// Starts `cmd`, a tcpdump writing `file` (or a command that execs one, such as `ip netns
    /// exec NS tcpdump ...`), and waits (up to `timeout`) until it says "listening on". `None`,
    /// after printing the skip reason, when it does not.
    pub fn spawn(mut cmd: Command, file: &Path, timeout: Duration) -> Option<Capture> {
        let _ = std::fs::remove_file(file);
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let err = child.stderr.take().unwrap();
        let mut cap = Capture {
            child,
            err,
            file: file.to_owned(),
            stopped: false,
        };
        let mut seen = Vec::new();
        let t0 = Instant::now();
        while !String::from_utf8_lossy(&seen).contains("listening on") {
            let mut b = [0u8; 256];
            let n = cap.err.read(&mut b).unwrap_or(0);
            if n == 0 || t0.elapsed() > timeout {
                eprintln!("skipped: tcpdump cannot capture: {}", String::from_utf8_lossy(&seen));
                return None;
            }
            seen.extend_from_slice(&b[..n]);
        }
        Some(cap)
    }

    /// The pcap file tcpdump writes.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The frames written so far.
    pub fn frames(&self) -> Vec<Vec<u8>> {
        frames_of(&self.file)
    }

    /// Waits until tcpdump has written at least `n` frames or `timeout` has passed (tcpdump
    /// lags behind on a loaded machine, and SIGINT drops what it has not written yet).
    pub fn wait_for(&self, n: usize, timeout: Duration) {
        let t0 = Instant::now();
        while self.frames().len() < n && t0.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the file has stopped growing (checked every 400 ms, `max` at most), then
    /// stops tcpdump: for a capture whose end the test cannot count in frames. On a loaded
    /// machine tcpdump lags behind, and what it has not written when it stops is lost.
    pub fn stop_when_quiet(self, max: Duration) -> String {
        let size = || std::fs::metadata(&self.file).map(|m| m.len()).unwrap_or(0);
        let end = Instant::now() + max;
        let mut last = size();
        loop {
            std::thread::sleep(Duration::from_millis(400));
            let now = size();
            if now == last || Instant::now() > end {
                break;
            }
            last = now;
        }
        self.stop()
    }

    /// Stops tcpdump and returns what else it said on stderr (its drop statistics).
    pub fn stop(mut self) -> String {
        self.interrupt();
        let mut rest = String::new();
        let _ = self.err.read_to_string(&mut rest);
        rest
    }

    fn interrupt(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.interrupt();
    }
}

/// tshark over a pcap file: `tshark <extra> -r <file> [-Y <filter>] [-T fields -e <field>...]`
/// (no `-Y` for an empty filter); the output lines. Panics when tshark fails.
pub fn tshark_lines(file: &Path, extra: &[&str], filter: &str, fields: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("tshark");
    cmd.args(extra).arg("-r").arg(file);
    if !filter.is_empty() {
        cmd.args(["-Y", filter]);
    }
    if !fields.is_empty() {
        cmd.args(["-T", "fields"]);
        for f in fields {
            cmd.args(["-e", f]);
        }
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect()
}

/// How many frames of `file` match `filter` (tshark with `extra` options).
pub fn tshark_count(file: &Path, extra: &[&str], filter: &str) -> usize {
    tshark_lines(file, extra, filter, &[]).len()
}

/// The display filter that finds malformed frames and expert errors.
pub const BAD: &str = "_ws.malformed || _ws.expert.severity >= error";
