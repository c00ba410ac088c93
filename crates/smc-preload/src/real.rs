//! The libc functions the shim wraps, found with `dlsym(RTLD_NEXT, name)` once.

use libc::{c_char, c_int, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::sync::OnceLock;

type ConnectFn = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
type AcceptFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type Accept4Fn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
type NameFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type GetOptFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
type SetOptFn = unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
type SendFn = unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
type SendToFn = unsafe extern "C" fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
use crate::scm_rights::SendMsgFn;
type RecvFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
type RecvFromFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
use crate::scm_rights::RecvMsgFn;

/// The next definitions of the wrapped functions (glibc's).
pub struct Real {
    /// `connect`.
    pub connect: ConnectFn,
    /// `accept`.
    pub accept: AcceptFn,
    /// `accept4`.
    pub accept4: Accept4Fn,
    /// `getsockname`.
    pub getsockname: NameFn,
    /// `getpeername`.
    pub getpeername: NameFn,
    /// `getsockopt`.
    pub getsockopt: GetOptFn,
    /// `setsockopt`.
    pub setsockopt: SetOptFn,
    /// `send`.
    pub send: SendFn,
    /// `sendto`.
    pub sendto: SendToFn,
    /// `sendmsg`.
    pub sendmsg: SendMsgFn,
    /// `recv`.
    pub recv: RecvFn,
    /// `recvfrom`.
    pub recvfrom: RecvFromFn,
    /// `recvmsg`.
    pub recvmsg: RecvMsgFn,
}

fn sym(name: &'static [u8]) -> *mut c_void {
    // SAFETY: `name` is a NUL-terminated literal; dlsym with RTLD_NEXT only reads it.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) };
    if p.is_null() {
        // Without libc's own definition nothing can go on.
        std::process::abort();
    }
    p
}

/// The wrapped functions (looked up on first use).
pub fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(|| {
        // SAFETY: each symbol is libc's function of that name, whose C signature is the
        // function pointer type it is transmuted to (glibc's declarations in sys/socket.h).
        unsafe {
            Real {
                connect: std::mem::transmute::<*mut c_void, ConnectFn>(sym(b"connect\0")),
                accept: std::mem::transmute::<*mut c_void, AcceptFn>(sym(b"accept\0")),
                accept4: std::mem::transmute::<*mut c_void, Accept4Fn>(sym(b"accept4\0")),
                getsockname: std::mem::transmute::<*mut c_void, NameFn>(sym(b"getsockname\0")),
                getpeername: std::mem::transmute::<*mut c_void, NameFn>(sym(b"getpeername\0")),
                getsockopt: std::mem::transmute::<*mut c_void, GetOptFn>(sym(b"getsockopt\0")),
                setsockopt: std::mem::transmute::<*mut c_void, SetOptFn>(sym(b"setsockopt\0")),
                send: std::mem::transmute::<*mut c_void, SendFn>(sym(b"send\0")),
                sendto: std::mem::transmute::<*mut c_void, SendToFn>(sym(b"sendto\0")),
                sendmsg: std::mem::transmute::<*mut c_void, SendMsgFn>(sym(b"sendmsg\0")),
                recv: std::mem::transmute::<*mut c_void, RecvFn>(sym(b"recv\0")),
                recvfrom: std::mem::transmute::<*mut c_void, RecvFromFn>(sym(b"recvfrom\0")),
                recvmsg: std::mem::transmute::<*mut c_void, RecvMsgFn>(sym(b"recvmsg\0")),
            }
        }
    })
}

/// The inode number of the file behind `fd` (a socket's stays the same through dup and
/// fork, so it names "this socket" in [`crate::table`]).
pub fn inode(fd: c_int) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `struct stat` into the buffer it is given, which is that size.
    let r = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: fstat returned 0, so it filled the structure.
    let st = unsafe { st.assume_init() };
    ((st.st_mode & libc::S_IFMT) == libc::S_IFSOCK).then_some(st.st_ino)
}

/// An `int` socket option, read with the real `getsockopt`.
pub fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are live locals of the sizes passed.
    let r = unsafe { (real().getsockopt)(fd, level, name, &mut v as *mut c_int as *mut c_void, &mut len) };
    (r == 0).then_some(v)
}

/// The socket's local or peer address (`peer`), as raw `sockaddr` octets.
pub fn sockname(fd: c_int, peer: bool) -> Option<Vec<u8>> {
    let mut ss = std::mem::MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    let f = if peer { real().getpeername } else { real().getsockname };
    // SAFETY: `ss` is a zeroed sockaddr_storage of `len` octets.
    let r = unsafe { f(fd, ss.as_mut_ptr() as *mut sockaddr, &mut len) };
    if r != 0 {
        return None;
    }
    let n = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: the storage is initialised (zeroed, then written by the call) for its whole size.
    let bytes = unsafe { std::slice::from_raw_parts(ss.as_ptr() as *const u8, n) };
    Some(bytes.to_vec())
}

/// Sets `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's `errno`.
pub fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
