//! What the SMC-R lab tests share (interop_smc_option.rs against the 6.1 guest,
//! interop_smc612.rs against the 6.12 guest): this process in a cgroup with the SMC-R
//! option's sock_ops program for one port, the host-side child (this test binary again, in
//! the lab's namespace), the `key=value` lines it prints, and static guest tools built with
//! gcc.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use smc::sockops::{Guard, SmcOption};

/// Where the cgroup2 hierarchy is mounted.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        post.starts_with("cgroup2 ")
            .then(|| PathBuf::from(pre.split(' ').nth(4).unwrap_or("")))
    })
}

/// This process in a fresh cgroup (`<mount>/<prefix>-<pid>`) with the SMC-R option program
/// attached for one port; on drop the process goes back to its own cgroup, the program is
/// detached and the cgroup removed.
pub struct SockopsCgroup {
    option: Option<Guard>,
    dir: PathBuf,
    home: PathBuf,
    pid: String,
}

impl SockopsCgroup {
    /// Creates the cgroup, attaches the program for `port` and moves this process into it.
    pub fn enter(prefix: &str, port: u16) -> SockopsCgroup {
        let mount = cgroup2_mount().expect("cgroup2 mount");
        let dir = mount.join(format!("{prefix}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir cgroup");
        let option = SmcOption::attach(&dir, &[port]).expect("attach sock_ops");
        let home = mount.join(
            std::fs::read_to_string("/proc/self/cgroup")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(|s| s.trim_start_matches('/').to_string()))
                .unwrap_or_default(),
        );
        let pid = std::process::id().to_string();
        std::fs::write(dir.join("cgroup.procs"), &pid).expect("enter cgroup");
        SockopsCgroup {
            option: Some(option),
            dir,
            home,
            pid,
        }
    }

    /// The attached program (`peer_offered_smc`).
    pub fn option(&self) -> &Guard {
        self.option.as_ref().expect("attached until drop")
    }
}

impl Drop for SockopsCgroup {
    fn drop(&mut self) {
        std::fs::write(self.home.join("cgroup.procs"), &self.pid).expect("leave cgroup");
        drop(self.option.take());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// This test binary again as test `test` in the lab's namespace `ns` (`nsenter --net`),
/// with `env` set (the child-mode variable among them), stdout piped, stderr to `stderr`.
pub fn host_child(ns: &str, test: &str, env: &[(&str, &str)], stderr: Stdio) -> Child {
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{ns}"))
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("nsenter")
}

/// The rest of the first line that starts with `key` (panics, listing the lines, without).
pub fn value<'a>(lines: &'a [String], key: &str) -> &'a str {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {lines:#?}"))
}

/// Lower-case hex of `d`.
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Builds a static guest tool from `src` into `out` (the lab's share directory) when it is
/// missing or older than its source.
pub fn build_static(src: &Path, out: &Path) -> Result<(), String> {
    let fresh = |o: &Path| {
        let (Ok(a), Ok(b)) = (std::fs::metadata(o), std::fs::metadata(src)) else {
            return false;
        };
        a.modified().ok() >= b.modified().ok()
    };
    if fresh(out) {
        return Ok(());
    }
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let st = Command::new("gcc")
        .args(["-O2", "-static", "-o"])
        .arg(&tmp)
        .arg(src)
        .status()
        .map_err(|e| format!("gcc: {e}"))?;
    if !st.success() {
        return Err(format!("gcc -static {} failed", src.display()));
    }
    std::fs::rename(&tmp, out).map_err(|e| e.to_string())
}
