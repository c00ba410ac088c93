//! The SMC-R TCP option on the kernel's own TCP connections (RFC 7609 §3.1, A.1;
//! requirements A1.2, A2.1, C5), written by a cgroup `sock_ops` BPF program.
//!
//! No socket API puts an option on a SYN. Linux ≥ 5.10 lets a `BPF_PROG_TYPE_SOCK_OPS`
//! program attached to a cgroup v2 directory reserve and write TCP header options
//! (`bpf_reserve_hdr_opt`, `bpf_store_hdr_opt`) and read the peer's (`bpf_load_hdr_opt`).
//! [`SmcOption::attach`] loads such a program, hand-assembled here ([`asm`], [`program`]; no
//! compiler needed), and attaches it: every TCP connection opened by a process of that
//! cgroup (optionally only to/on chosen ports) then carries `FE 06 E2 D4 C3 D9` on its SYN,
//! and a listener's SYN-ACK carries it when the client's SYN did. Whether the peer's
//! SYN / SYN-ACK carried it is recorded per socket; [`Guard::peer_offered_smc`] reads it.
//!
//! Privileges: loading needs `CAP_BPF` + `CAP_NET_ADMIN` (or `CAP_SYS_ADMIN`, i.e. root);
//! attaching needs write access to the cgroup directory. Every failure is a typed
//! [`Error`] so the caller can fall back to TCP without the option (the peer then falls
//! back too, which is always a working TCP connection). See docs/smc.md, "The TCP option on
//! kernel TCP".

pub mod asm;
pub mod program;
mod sys;

pub use program::SynAck;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// `CGROUP2_SUPER_MAGIC` (linux/magic.h).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// Entries of the per-socket result map (LRU: the oldest connections' answers go first).
pub const RESULT_ENTRIES: u32 = 65_536;

/// Why the option program could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `bpf()` refused for lack of privilege.
    #[error("{what}: permission denied: needs CAP_BPF and CAP_NET_ADMIN (or root)")]
    Permission {
        /// The step that failed.
        what: &'static str,
    },
    /// The path is not a cgroup v2 directory.
    #[error("{0}: not a cgroup v2 directory (mount cgroup2, e.g. /sys/fs/cgroup or /sys/fs/cgroup/unified)")]
    NotCgroup2(PathBuf),
    /// The kernel lacks `bpf()` or the header-option callbacks (Linux < 5.10).
    #[error("kernel too old or without BPF: {0} (needs Linux >= 5.10 with CONFIG_BPF_SYSCALL and CONFIG_CGROUP_BPF)")]
    KernelTooOld(String),
    /// The verifier rejected the program; its log is attached.
    #[error("verifier rejected the sock_ops program: {err}\n{log}")]
    Verifier {
        /// The load error.
        err: io::Error,
        /// The verifier's log.
        log: String,
    },
    /// More ports than the program compares against.
    #[error("{0} ports given, at most {max}", max = program::MAX_PORTS)]
    TooManyPorts(usize),
    /// Any other system call failure.
    #[error("{what}: {err}")]
    Io {
        /// The step that failed.
        what: &'static str,
        /// The error.
        err: io::Error,
    },
}

impl Error {
    fn from_io(what: &'static str, err: io::Error) -> Self {
        match err.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => Error::Permission { what },
            Some(libc::ENOSYS) => Error::KernelTooOld(format!("{what}: {err}")),
            _ => Error::Io { what, err },
        }
    }
}

/// Loads a sock_ops program, mapping the failure to what the caller can act on.
fn load(insns: &[asm::Insn]) -> Result<OwnedFd, Error> {
    sys::prog_load_sock_ops(insns).map_err(|(e, log)| match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) if log.is_empty() => Error::Permission {
            what: "bpf(BPF_PROG_LOAD)",
        },
        // An unknown helper: the kernel predates the header-option API (5.10).
        Some(libc::EINVAL) if log.contains("invalid func") || log.contains("unknown func") => Error::KernelTooOld(log),
        _ => Error::Verifier { err: e, log },
    })
}

/// Entry point: `SmcOption::attach(cgroup, ports)`.
#[derive(Debug)]
pub struct SmcOption;

impl SmcOption {
    /// Loads the program and attaches it to the cgroup v2 directory `cgroup`, for
    /// connections to or listening on `ports` (empty: every port). Detached when the
    /// returned [`Guard`] drops.
    pub fn attach(cgroup: impl AsRef<Path>, ports: &[u16]) -> Result<Guard, Error> {
        Self::attach_with(cgroup, ports, SynAck::Conditional)
    }

    /// [`SmcOption::attach`] choosing when a listener's SYN-ACK carries the option:
    /// [`SynAck::Conditional`] (only when the SYN did; Linux's behaviour) or
    /// [`SynAck::Always`] (requirements SMC-OPT-2).
    pub fn attach_with(cgroup: impl AsRef<Path>, ports: &[u16], synack: SynAck) -> Result<Guard, Error> {
        let cgroup = cgroup.as_ref();
        if ports.len() > program::MAX_PORTS {
            return Err(Error::TooManyPorts(ports.len()));
        }
        match sys::fs_magic(cgroup) {
            Ok(CGROUP2_SUPER_MAGIC) => {}
            Ok(_) => return Err(Error::NotCgroup2(cgroup.to_path_buf())),
            Err(e) => return Err(Error::from_io("statfs of the cgroup directory", e)),
        }
        let cg_fd: OwnedFd = std::fs::File::open(cgroup)
            .map_err(|e| Error::from_io("open of the cgroup directory", e))?
            .into();
        let map = sys::map_create_lru(8, 4, RESULT_ENTRIES).map_err(|e| Error::from_io("bpf(BPF_MAP_CREATE)", e))?;
        let insns = program::build(map.as_raw_fd(), ports, synack)
            .map_err(|_| Error::KernelTooOld("internal: unplaced label".into()))?;
        let prog = load(&insns)?;
        sys::prog_attach(&cg_fd, &prog).map_err(|e| Error::from_io("bpf(BPF_PROG_ATTACH)", e))?;
        tracing::debug!(cgroup = %cgroup.display(), ?ports, ?synack, "SMC-R TCP option program attached");
        Ok(Guard {
            cgroup: cg_fd,
            prog,
            map,
            path: cgroup.to_path_buf(),
        })
    }
}

/// The attached program; detaches it on drop.
#[derive(Debug)]
pub struct Guard {
    cgroup: OwnedFd,
    prog: OwnedFd,
    map: OwnedFd,
    path: PathBuf,
}

impl Guard {
    /// Whether the peer's SYN (on an accepted connection) or SYN-ACK (on a connected one)
    /// carried the SMC-R option: `Some(true)` / `Some(false)`, or `None` when the program did
    /// not see the connection's handshake (created outside the cgroup, another port,
    /// opened before attach, the answer evicted from the LRU map, or not a TCP socket).
    pub fn peer_offered_smc(&self, sock: &impl AsRawFd) -> Option<bool> {
        let cookie = sys::socket_cookie(sock.as_raw_fd()).ok()?;
        match sys::map_lookup_u64_u32(&self.map, cookie) {
            Ok(v) => v.map(|v| v != 0),
            Err(e) => {
                tracing::warn!(error = %e, "lookup in the SMC-R option map failed");
                None
            }
        }
    }

    /// The cgroup directory the program is attached to.
    pub fn cgroup(&self) -> &Path {
        &self.path
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = sys::prog_detach(&self.cgroup, &self.prog) {
            tracing::warn!(error = %e, cgroup = %self.path.display(), "detaching the SMC-R option program failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .map(|s| {
                s.lines()
                    .any(|l| l.starts_with("CapEff:") && !l.ends_with("0000000000000000"))
            })
            .unwrap_or(false)
    }

    #[test]
    fn a_rejected_program_surfaces_the_verifier_log() {
        if !is_root() {
            eprintln!("skipped: bpf() needs CAP_BPF + CAP_NET_ADMIN");
            return;
        }
        // `exit` without setting r0: the verifier refuses ("R0 !read_ok").
        let mut a = asm::Asm::new();
        a.exit();
        match load(&a.finish().unwrap()) {
            Err(Error::Verifier { log, .. }) => assert!(log.contains("R0"), "log: {log}"),
            other => panic!("expected a verifier error, got {other:?}"),
        }
        // And an unknown helper id reads as "kernel too old".
        let mut a = asm::Asm::new();
        a.call(100_000);
        a.mov_imm(0, 1);
        a.exit();
        assert!(matches!(load(&a.finish().unwrap()), Err(Error::KernelTooOld(_))));
    }

    #[test]
    fn the_generated_program_passes_the_verifier_in_both_modes() {
        if !is_root() {
            eprintln!("skipped: bpf() needs CAP_BPF + CAP_NET_ADMIN");
            return;
        }
        let map = sys::map_create_lru(8, 4, 16).expect("map");
        for mode in [SynAck::Conditional, SynAck::Always] {
            for ports in [&[][..], &[1, 2, 65535][..]] {
                let p = program::build(map.as_raw_fd(), ports, mode).unwrap();
                if let Err(e) = load(&p) {
                    panic!("{mode:?} {ports:?}: {e}");
                }
            }
        }
    }
}
