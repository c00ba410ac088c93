//! The QEMU lab (`../shared/lab`) as the interop test binaries use it: where its scripts
//! are, the `SOFTRDMA_INTEROP` gate, commands in the guest, and one lab user at a time
//! (a process-wide mutex plus an flock on `/var/tmp/rdmalab/softrdma-interop.lock`, shared
//! by every interop test process).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
