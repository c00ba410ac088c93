//! `libsmc_preload.so`, the LD_PRELOAD shim of `softrdma smc run -- PROGRAM ARGS`.
//!
//! It interposes `connect`, `accept` and `accept4`. When one of them yields a connected
//! AF_INET/AF_INET6 `SOCK_STREAM` (TCP) socket, the socket is handed to the per-host
//! daemon (`softrdma smc daemon`) over its unix socket with `SCM_RIGHTS`
//! ([`handoff`]). The daemon runs the SMC-R CLC handshake on it and answers:
//!
//! - **SMC-R**: one end of an AF_UNIX socketpair whose other end the daemon pumps to and
//!   from the SMC-R connection. The shim `dup2`s it onto the application's descriptor
//!   number, so the program keeps a real socket: blocking and nonblocking I/O,
//!   poll/epoll/select, `shutdown(SHUT_WR)`, FIONREAD, MSG_PEEK, dup and fork work unchanged.
//! - **TCP**: the program keeps its own TCP socket (fallback, with the reason recorded by
//!   the daemon).
//!
//! What AF_UNIX answers differently is patched for the descriptors handed over ([`table`],
//! [`hooks`]): `getsockname`/`getpeername` give the TCP addresses, `getsockopt(SO_DOMAIN,
//! SO_PROTOCOL)` say AF_INET/TCP, TCP and IP-level `setsockopt`s succeed (values kept and
//! read back), `send(MSG_OOB)` sends the data in line (the urgent mark is not carried),
//! `recv(MSG_OOB)` says EINVAL (no urgent data), as TCP with `SO_OOBINLINE`.
//!
//! Nonblocking `connect` (EINPROGRESS): the shim waits up to `SOFTRDMA_SMC_CONNECT_WAIT_MS`
//! (default 3000) for the handshake and then hands the socket over and returns 0 (or the
//! connection's error), which `connect` may do for a nonblocking socket; a connection not
//! established by then stays plain TCP (EINPROGRESS returned as usual).
//!
//! Off unless `SOFTRDMA_SMC_SOCK` names the daemon's socket (`smc run` sets it). Only
//! dynamically linked programs that call these through libc are covered (not static or Go
//! binaries). The unsafe code is in [`real`] (dlsym), [`handoff`] (sendmsg/recvmsg with
//! `SCM_RIGHTS`, dup2) and [`hooks`] (the exported C functions), each block with a SAFETY
//! comment.
#![warn(missing_docs)]

pub mod handoff;
pub mod hooks;
pub mod real;
pub mod scm_rights;
pub mod table;
