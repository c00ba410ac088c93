//! The lab guest's path to rxe0 that rdma_cm prefers over siw0 (`scripts/lab-rxe-path.sh`,
//! docs/roce.md "Reaching the guest's rxe0 without deleting siw0"): guest 192.168.78.2 on
//! eth0.78, host 192.168.78.1 on br0 in the lab's namespace. A guest tool that binds or
//! resolves an address in 192.168.78.0/24 uses rxe0; siw0 stays.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// Our end of the path (host side, namespace `rdmalab`).
pub const HOST_RXE_IP: &str = "192.168.78.1";
/// The guest's end, an address only rxe0 has a GID for.
pub const GUEST_RXE_IP: &str = "192.168.78.2";

/// Builds the path if it is not up (idempotent; the caller holds the lab), once per test
/// process: each check costs a command in the guest, seconds under TCG on a loaded host.
/// Err: why not.
pub fn rxe_path_up(lab_dir: &Path) -> Result<(), String> {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DONE.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lab-rxe-path.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("up")
        .env("RDMALAB_REPO", lab_dir)
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if out.status.success() {
        DONE.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    } else {
        Err(format!(
            "lab-rxe-path.sh up failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
