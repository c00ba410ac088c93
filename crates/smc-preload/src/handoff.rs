//! Handing a connected TCP socket to the daemon and taking its answer.
//!
//! The protocol (the daemon's side is `softrdma smc daemon`, crates/cli/src/smc_cmd.rs;
//! keep both in step): a `SOCK_SEQPACKET` connection to the abstract unix address
//! `"\0" + $SOFTRDMA_SMC_SOCK`, one request `"SMCR" 1 KIND` with the socket attached
//! (`SCM_RIGHTS`), KIND = [`CONNECTED`] or [`ACCEPTED`]; one reply `VERDICT REASON…`:
//! [`VERDICT_SMCR`] or [`VERDICT_RELAY`] with a unix socket attached (the program's
//! descriptor becomes it), [`VERDICT_TCP`] without (the program keeps its TCP socket).

use crate::real::{self, real};
use crate::scm_rights;
use crate::table;
use libc::c_int;
use std::time::Duration;

/// Request magic and version.
pub const MAGIC: &[u8; 5] = b"SMCR\x01";
/// The program connected this socket (client side).
pub const CONNECTED: u8 = 1;
/// The program accepted this socket (server side).
pub const ACCEPTED: u8 = 2;
/// SMC-R: the attached unix socket carries the connection.
pub const VERDICT_SMCR: u8 = 0;
/// Fallback: keep the TCP socket.
pub const VERDICT_TCP: u8 = 1;
/// Fallback with octets the daemon already read during CLC: the attached unix socket is
/// relayed to the TCP connection by the daemon.
pub const VERDICT_RELAY: u8 = 2;
/// How long the shim waits for the daemon's verdict (CLC 6 s + CONFIRM LINK 5 s fit).
const REPLY_WAIT: Duration = Duration::from_secs(20);

/// The daemon's socket name, if `smc run` turned the shim on.
pub fn daemon_name() -> Option<Vec<u8>> {
    std::env::var_os("SOFTRDMA_SMC_SOCK").map(|s| {
        use std::os::unix::ffi::OsStrExt;
        s.as_bytes().to_vec()
    })
}

/// How long a nonblocking connect is waited for before it stays plain TCP.
pub fn connect_wait() -> Duration {
    std::env::var("SOFTRDMA_SMC_CONNECT_WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_millis(3000))
}

fn debug(msg: &str) {
    if std::env::var_os("SOFTRDMA_SMC_DEBUG").is_some() {
        eprintln!("smc-preload[{}]: {msg}", std::process::id());
    }
}

/// Whether `fd` is a TCP socket (AF_INET/AF_INET6, SOCK_STREAM, IPPROTO_TCP).
pub fn is_tcp(fd: c_int) -> Option<c_int> {
    let dom = real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    let ty = real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)?;
    let proto = real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
    ((dom == libc::AF_INET || dom == libc::AF_INET6) && ty == libc::SOCK_STREAM && proto == libc::IPPROTO_TCP)
        .then_some(dom)
}

/// Hands TCP socket `fd` (connected: `kind` [`CONNECTED`] or [`ACCEPTED`]) to the daemon;
/// on SMC-R replaces `fd` with the daemon's unix socket. Any failure leaves `fd` as it was
/// (plain TCP). `errno` is preserved.
pub fn hand_over(fd: c_int, family: c_int, kind: u8) {
    let Some(name) = daemon_name() else { return };
    let saved = real::errno();
    let local = real::sockname(fd, false).unwrap_or_default();
    let peer = real::sockname(fd, true).unwrap_or_default();
    // Read before the daemon has the socket: it may change the (shared) file status flags.
    let flags = fd_flags(fd);
    match exchange(&name, fd, kind) {
        Ok((verdict, Some(nfd), reason)) if verdict == VERDICT_SMCR || verdict == VERDICT_RELAY => {
            if replace(fd, nfd, flags) {
                if let Some(ino) = real::inode(fd) {
                    table::insert(ino, family, local, peer);
                }
                debug(&format!(
                    "fd {fd}: {}",
                    if verdict == VERDICT_SMCR {
                        "SMC-R"
                    } else {
                        "TCP relayed"
                    }
                ));
            } else {
                debug(&format!("fd {fd}: dup2 failed, stays TCP ({reason})"));
            }
        }
        Ok((_, nfd, reason)) => {
            if let Some(n) = nfd {
                close(n);
            }
            debug(&format!("fd {fd}: TCP ({reason})"));
        }
        Err(e) => debug(&format!("fd {fd}: no daemon answer ({e}), stays TCP")),
    }
    real::set_errno(saved);
}

fn close(fd: c_int) {
    // SAFETY: `fd` is a descriptor this module received and owns.
    unsafe { libc::close(fd) };
}

/// `fd`'s file status flags and descriptor flags (F_GETFL, F_GETFD).
fn fd_flags(fd: c_int) -> (c_int, c_int) {
    // SAFETY: fcntl reads the flags of a descriptor; no memory is passed.
    unsafe { (libc::fcntl(fd, libc::F_GETFL), libc::fcntl(fd, libc::F_GETFD)) }
}

/// Puts `nfd` in place of `fd` with `fd`'s O_NONBLOCK and FD_CLOEXEC as they were before the
/// hand-over (`flags` from [`fd_flags`]); closes `nfd`.
fn replace(fd: c_int, nfd: c_int, (fl, fdfl): (c_int, c_int)) -> bool {
    // SAFETY: dup3/fcntl/close on descriptors: `fd` is the program's open socket, `nfd` ours.
    unsafe {
        let cloexec = if fdfl >= 0 && fdfl & libc::FD_CLOEXEC != 0 {
            libc::O_CLOEXEC
        } else {
            0
        };
        let r = libc::dup3(nfd, fd, cloexec);
        libc::close(nfd);
        if r < 0 {
            return false;
        }
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & libc::O_NONBLOCK);
        }
        true
    }
}

/// One request/reply with the daemon: the verdict, the descriptor attached, the reason.
fn exchange(name: &[u8], fd: c_int, kind: u8) -> std::io::Result<(u8, Option<c_int>, String)> {
    let err = std::io::Error::last_os_error;
    // SAFETY: a new socket; owned and closed below.
    let s = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(err());
    }
    let res = (|| {
        let (sa, len) = scm_rights::abstract_addr(name)?;
        // SAFETY: `sa` is a sockaddr_un of at least `len` octets.
        if unsafe { (real().connect)(s, &sa as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(err());
        }
        let tv = libc::timeval {
            tv_sec: REPLY_WAIT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: `tv` is a live timeval of the size passed.
        unsafe {
            (real().setsockopt)(
                s,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        let mut req = [0u8; 6];
        req[..5].copy_from_slice(MAGIC);
        req[5] = kind;
        scm_rights::send(real().sendmsg, s, &req, Some(fd))?;
        let mut buf = [0u8; 512];
        let (n, nfd) = scm_rights::recv(real().recvmsg, s, &mut buf)?;
        if n == 0 {
            if let Some(n) = nfd {
                close(n);
            }
            return Err(std::io::Error::from_raw_os_error(libc::ECONNRESET));
        }
        Ok((buf[0], nfd, String::from_utf8_lossy(&buf[1..n]).into_owned()))
    })();
    close(s);
    res
}
