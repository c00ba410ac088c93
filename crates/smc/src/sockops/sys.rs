//! The system calls the TCP-option program needs: `bpf(2)` (map create, program load,
//! cgroup attach/detach, map lookup), `getsockopt(SO_COOKIE)` and `statfs(2)`. All the
//! crate's unsafe code for [`super`] lives here; each block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::asm::Insn;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
const BPF_PROG_TYPE_SOCK_OPS: u32 = 13;
/// `BPF_CGROUP_SOCK_OPS` attach type.
const BPF_CGROUP_SOCK_OPS: u32 = 3;
/// `BPF_F_ALLOW_MULTI`: coexist with other programs attached to the same cgroup.
const BPF_F_ALLOW_MULTI: u32 = 2;
/// `SO_COOKIE` (asm-generic/socket.h).
const SO_COOKIE: libc::c_int = 57;

/// `union bpf_attr` as 144 zeroed, 8-aligned octets; fields written at their uapi offsets.
#[repr(C, align(8))]
struct Attr([u8; 144]);

impl Attr {
    fn new() -> Self {
        Attr([0; 144])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, writable, 8-aligned 144-octet buffer laid out as
    // `union bpf_attr`; every pointer stored in it (by the callers below) points to memory
    // that outlives this call and has the length stated next to it.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), std::mem::size_of::<Attr>()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful bpf() call that creates a new file
    // descriptor; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// Creates an LRU hash map with `key_size`/`value_size` octets and `max` entries.
pub fn map_create_lru(key_size: u32, value_size: u32, max: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, BPF_MAP_TYPE_LRU_HASH)
        .u32(4, key_size)
        .u32(8, value_size)
        .u32(12, max);
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

/// Loads a sock_ops program; on failure returns the error and the verifier log.
pub fn prog_load_sock_ops(insns: &[Insn]) -> Result<OwnedFd, (io::Error, String)> {
    let code: Vec<[u8; 8]> = insns.iter().map(|i| i.to_bytes()).collect();
    let license = CString::new("GPL").expect("no NUL");
    let name = b"softrdma_smcopt";
    let mut log = vec![0u8; 256 * 1024];
    let mut a = Attr::new();
    a.u32(0, BPF_PROG_TYPE_SOCK_OPS)
        .u32(4, code.len() as u32)
        .u64(8, code.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .u32(24, 1) // log_level
        .u32(28, log.len() as u32)
        .u64(32, log.as_mut_ptr() as u64);
    a.0[48..48 + name.len()].copy_from_slice(name); // prog_name (16 octets, NUL-terminated)
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => Ok(owned(fd)),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err((e, String::from_utf8_lossy(&log[..end]).into_owned()))
        }
    }
}

/// Attaches `prog` to the cgroup `cgroup` as `BPF_CGROUP_SOCK_OPS` (multi).
pub fn prog_attach(cgroup: &OwnedFd, prog: &OwnedFd) -> io::Result<()> {
    let mut a = Attr::new();
    a.u32(0, cgroup.as_raw_fd() as u32)
        .u32(4, prog.as_raw_fd() as u32)
        .u32(8, BPF_CGROUP_SOCK_OPS)
        .u32(12, BPF_F_ALLOW_MULTI);
    bpf(BPF_PROG_ATTACH, &mut a).map(|_| ())
}

/// Detaches `prog` from `cgroup`.
pub fn prog_detach(cgroup: &OwnedFd, prog: &OwnedFd) -> io::Result<()> {
    let mut a = Attr::new();
    a.u32(0, cgroup.as_raw_fd() as u32)
        .u32(4, prog.as_raw_fd() as u32)
        .u32(8, BPF_CGROUP_SOCK_OPS);
    bpf(BPF_PROG_DETACH, &mut a).map(|_| ())
}

/// Looks `key` up in a map whose values are u32; `Ok(None)` when absent.
pub fn map_lookup_u64_u32(map: &OwnedFd, key: u64) -> io::Result<Option<u32>> {
    let key = key.to_ne_bytes();
    let mut value = [0u8; 4];
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, key.as_ptr() as u64)
        .u64(16, value.as_mut_ptr() as u64);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
        Ok(_) => Ok(Some(u32::from_ne_bytes(value))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The socket cookie of `fd` (`SO_COOKIE`, the key the program records under).
pub fn socket_cookie(fd: RawFd) -> io::Result<u64> {
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live locals; the kernel writes at most `len` (8) octets.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, SO_COOKIE, (&mut v as *mut u64).cast(), &mut len) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(v) }
}

/// The file system magic of `path` (`statfs(2)` `f_type`).
pub fn fs_magic(path: &std::path::Path) -> io::Result<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: all-zero is a valid `statfs` (plain integers).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is a live, writable `statfs`.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(st.f_type as i64)
    }
}
