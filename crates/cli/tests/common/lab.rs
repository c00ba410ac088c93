//! The QEMU lab (`../shared/lab`) as the interop test binaries use it: where its scripts
//! are, the `SOFTRDMA_INTEROP` gate, commands in the guest, and one lab user at a time
//! (a process-wide mutex plus an flock on `/var/tmp/rdmalab/softrdma-interop.lock`, shared
//! by every interop test process).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The lab's network namespace (host side 192.168.77.1, guest 192.168.77.2).
pub const NS: &str = "rdmalab";
/// Where the lab keeps its built artefacts and runtime state.
pub const LAB_STATE: &str = "/var/tmp/rdmalab";

/// `SOFTRDMA_INTEROP`: `0` skips, `1` may build the lab, `require` turns a skip into a failure.
pub fn gate() -> String {
    std::env::var("SOFTRDMA_INTEROP").unwrap_or_default()
}

/// The lab's scripts, or why the lab cannot be used.
pub fn lab_dir() -> Result<PathBuf, String> {
    let dir = std::env::var_os("RDMALAB_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/lab"));
    if dir.join("vm.sh").exists() {
        Ok(dir)
    } else {
        Err(format!("no lab scripts at {} (set RDMALAB_REPO)", dir.display()))
    }
}

/// Runs `script` in the guest (`vm.sh exec -t TIMEOUT -`): exit code and output.
pub fn vm_exec(dir: &Path, script: &str, timeout: u64) -> (i32, String) {
    let mut child = match Command::new("./vm.sh")
        .args(["exec", "-t", &timeout.to_string(), "-"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return (-1, e.to_string()),
    };
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().expect("vm.sh exec");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), s)
}

/// The lab, held by one test at a time.
pub struct Lab {
    pub dir: PathBuf,
    _guard: MutexGuard<'static, ()>,
    _flock: std::fs::File,
}

/// Brings the lab up once per process with `bring_up` and takes it for `test`; `None` (after
/// printing `SKIPPED test: what unavailable: why`) when it cannot be used, a panic instead
/// under `SOFTRDMA_INTEROP=require`.
pub fn acquire(test: &str, what: &str, bring_up: fn() -> Result<PathBuf, String>) -> Option<Lab> {
    static UP: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    static M: Mutex<()> = Mutex::new(());
    let guard = M.lock().unwrap_or_else(|e| e.into_inner());
    match UP.get_or_init(bring_up) {
        Ok(dir) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(Path::new(LAB_STATE).join("softrdma-interop.lock"))
                .expect("lock file");
            f.lock().expect("flock");
            Some(Lab {
                dir: dir.clone(),
                _guard: guard,
                _flock: f,
            })
        }
        Err(why) => {
            if gate() == "require" {
                panic!("{test}: the lab is required (SOFTRDMA_INTEROP=require) but cannot be used: {why}");
            }
            eprintln!("SKIPPED {test}: {what} unavailable: {why}");
            None
        }
    }
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Brings the lab up for the siw tests: built (or built now under `=1`/`require`), the VM
/// running and siw0 active in the guest. Ok(dir) or the reason to skip.
pub fn bring_up_siw() -> Result<PathBuf, String> {
    if gate() == "0" {
        return Err("SOFTRDMA_INTEROP=0".into());
    }
    if !is_root() {
        return Err("not root (the lab needs a network namespace and a tap device)".into());
    }
    let dir = lab_dir()?;
    let built = Path::new(LAB_STATE).join("vmlinuz").exists() && Path::new(LAB_STATE).join("initramfs.img").exists();
    if !built {
        if gate() != "1" && gate() != "require" {
            return Err(format!(
                "the lab is not built ({LAB_STATE}/vmlinuz missing); run {}/setup.sh or set SOFTRDMA_INTEROP=1",
                dir.display()
            ));
        }
        eprintln!("interop: building the lab with setup.sh (a few minutes the first time)");
        let st = Command::new("./setup.sh")
            .current_dir(&dir)
            .status()
            .map_err(|e| format!("setup.sh: {e}"))?;
        if !st.success() {
            return Err(format!("setup.sh failed ({st})"));
        }
    }
    if !have("qemu-system-x86_64") {
        return Err("qemu-system-x86_64 is not installed (the lab's setup.sh installs it)".into());
    }
    if vm_exec(&dir, "true", 20).0 != 0 {
        eprintln!("interop: starting the lab VM (vm.sh start)");
        let out = Command::new("./vm.sh")
            .arg("start")
            .current_dir(&dir)
            .output()
            .map_err(|e| format!("vm.sh start: {e}"))?;
        if !out.status.success() || vm_exec(&dir, "true", 30).0 != 0 {
            return Err(format!(
                "vm.sh start failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let (rc, out) = vm_exec(&dir, "rdma link show | grep -q 'siw0/1 state ACTIVE' && echo ok", 20);
    if rc != 0 || !out.contains("ok") {
        return Err(format!("siw0 is not active in the guest: {out}"));
    }
    Ok(dir)
}

/// The status a guest script appended as `exit=N` (the last such line).
pub fn exit_of(log: &str) -> Option<i32> {
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix("exit=").and_then(|v| v.trim().parse().ok()))
}

/// A fresh port per case in `base..base + span`, a sixteenth of the range per process (by
/// pid), so that no case meets another's leftovers.
pub fn next_port(base: u16, span: u16) -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) as u32;
    base + ((std::process::id() % 16) * (span as u32 / 16) + n) as u16 % span
}

impl Lab {
    pub fn exec(&self, script: &str, timeout: u64) -> (i32, String) {
        vm_exec(&self.dir, script, timeout)
    }

    /// Marks the guest kernel log's current end for `kernel_check`.
    pub fn kernel_check_init(&self) {
        let (_, out) = self.exec("dmesg | wc -l > /tmp/softrdma-dmesg-mark", 20);
        assert!(!out.contains("BUG"), "{out}");
    }

    /// The guest kernel logged no BUG/WARNING/Oops since the last check and has no taint
    /// beyond O (4096) and E (8192) from the out-of-tree siw module. Returns the new lines.
    pub fn kernel_check(&self) -> String {
        let (rc, out) = self.exec(
            "m=$(cat /tmp/softrdma-dmesg-mark 2>/dev/null || echo 0); dmesg | tail -n +$((m+1)); \
             dmesg | wc -l > /tmp/softrdma-dmesg-mark; echo tainted=$(cat /proc/sys/kernel/tainted)",
            20,
        );
        assert_eq!(rc, 0, "guest unreachable after the case: {out}");
        for bad in [
            "BUG:",
            "WARNING:",
            "Oops",
            "Call Trace",
            "general protection",
            "kernel BUG",
        ] {
            assert!(!out.contains(bad), "guest kernel reported {bad}:\n{out}");
        }
        let t: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("tainted="))
            .and_then(|v| v.trim().parse().ok())
            .expect("tainted");
        assert_eq!(t & !(4096 | 8192), 0, "guest kernel taint {t:#x}:\n{out}");
        out
    }
}
