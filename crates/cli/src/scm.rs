//! Unix `SOCK_SEQPACKET` sockets on abstract addresses (one per network namespace) and
//! descriptor passing (`SCM_RIGHTS`), for `softrdma smc daemon` and `smc run`. The only
//! unsafe code of the SMC-R commands; each block says why it is sound.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: socket() returns a new descriptor that we own from here on.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is new and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn abstract_addr(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zeros is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = name.as_bytes();
    if b.is_empty() || b.len() + 1 > sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket name empty or too long",
        ));
    }
    for (i, c) in b.iter().enumerate() {
        sa.sun_path[i + 1] = *c as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + b.len();
    Ok((sa, len as libc::socklen_t))
}

/// Listens on the abstract address `name` (EADDRINUSE if a daemon already does).
pub fn listen(name: &str) -> io::Result<OwnedFd> {
    let s = seqpacket()?;
    let (sa, len) = abstract_addr(name)?;
    // SAFETY: `sa` is a sockaddr_un of `len` valid octets; `s` is our socket.
    cvt(unsafe { libc::bind(s.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, len) })?;
    // SAFETY: plain call on our socket.
    cvt(unsafe { libc::listen(s.as_raw_fd(), 128) })?;
    Ok(s)
}

/// Connects to the abstract address `name`.
pub fn connect(name: &str) -> io::Result<OwnedFd> {
    let s = seqpacket()?;
    let (sa, len) = abstract_addr(name)?;
    // SAFETY: as in `listen`.
    cvt(unsafe { libc::connect(s.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, len) })?;
    Ok(s)
}

/// Accepts one connection (the listener's receive timeout applies: WouldBlock).
pub fn accept(l: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: accept4 without an address buffer; the new descriptor is ours.
    let fd = cvt(unsafe {
        libc::accept4(
            l.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: new descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends one message, with `fd` attached when given.
pub fn send(s: &OwnedFd, data: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut cbuf = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; its pointers point at live locals (`iov`, `cbuf`) of the
    // lengths given; CMSG_SPACE(4) = 24 ≤ 32 octets of `cbuf`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
        }
        if libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one message and the first descriptor attached (others are closed).
pub fn recv(s: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: as in `send`; the kernel writes at most msg_controllen octets into `cbuf` and
    // CMSG_NXTHDR stays within msg_controllen; received descriptors become OwnedFds once.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        let n = libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut got = None;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let k = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..k {
                    let f = std::ptr::read_unaligned((libc::CMSG_DATA(c) as *const RawFd).add(i));
                    let owned = OwnedFd::from_raw_fd(f);
                    if got.is_none() {
                        got = Some(owned);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        Ok((n as usize, got))
    }
}

/// Clears close-on-exec on `s`, so a program exec'd next holds it.
pub fn inherit(s: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl(F_SETFD) on a descriptor we own; no memory is passed.
    cvt(unsafe { libc::fcntl(s.as_raw_fd(), libc::F_SETFD, 0) })?;
    Ok(())
}
