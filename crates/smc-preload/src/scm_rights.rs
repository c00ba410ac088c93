//! Descriptor passing (`SCM_RIGHTS`) and abstract unix addresses, shared by the shim
//! (`handoff.rs`) and the daemon (`crates/cli/src/scm.rs` includes this file with
//! `#[path]`). Only libc and std here. The system calls come in as parameters: the shim
//! passes its `real()` table's `sendmsg` / `recvmsg` (so it never re-enters its own hooks),
//! the daemon passes `libc::sendmsg` / `libc::recvmsg`.
#![allow(unsafe_code)]
#![allow(dead_code)] // each includer uses its part

use libc::{c_int, ssize_t};
use std::io;

/// `sendmsg(2)`'s signature.
pub type SendMsgFn = unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> ssize_t;
/// `recvmsg(2)`'s signature.
pub type RecvMsgFn = unsafe extern "C" fn(c_int, *mut libc::msghdr, c_int) -> ssize_t;

/// The abstract unix address `"\0" + name` and its length.
pub fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.is_empty() || name.len() + 1 > sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket name empty or too long",
        ));
    }
    for (i, c) in name.iter().enumerate() {
        sa.sun_path[i + 1] = *c as libc::c_char; // abstract: sun_path[0] = 0
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((sa, len as libc::socklen_t))
}

/// Sends one message on socket `s` with descriptor `fd` attached when given (MSG_NOSIGNAL).
pub fn send(sendmsg: SendMsgFn, s: c_int, data: &[u8], fd: Option<c_int>) -> io::Result<()> {
    // Room for one cmsghdr with one int, 8-aligned: CMSG_SPACE(4) = 24 ≤ 32.
    let mut cbuf = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; its pointers point at live locals (`iov`, `cbuf`) of the
    // lengths given; the CMSG_* macros stay inside `cbuf`; `sendmsg` has sendmsg(2)'s
    // contract and only reads them.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<c_int>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut c_int, fd);
        }
        if sendmsg(s, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one message on socket `s` (retrying EINTR) and the first descriptor attached,
/// close-on-exec; further descriptors are closed. The caller owns the one returned.
pub fn recv(recvmsg: RecvMsgFn, s: c_int, buf: &mut [u8]) -> io::Result<(usize, Option<c_int>)> {
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: as in `send`; the kernel writes at most msg_controllen octets of control data
    // into `cbuf`, and CMSG_NXTHDR never walks past msg_controllen; each received
    // descriptor is either returned (once) or closed here.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        let n = loop {
            let n = recvmsg(s, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break n;
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut got = None;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let k = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<c_int>();
                for i in 0..k {
                    let f = std::ptr::read_unaligned((libc::CMSG_DATA(c) as *const c_int).add(i));
                    if got.is_none() {
                        got = Some(f);
                    } else {
                        libc::close(f);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        Ok((n as usize, got))
    }
}
