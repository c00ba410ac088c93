//! The async variant: [`AsyncSmcStream`] / [`AsyncSmcListener`] for tokio (feature
//! `tokio`, on by default), implementing `tokio::io::AsyncRead` / `AsyncWrite`.
//!
//! No thread is parked per stream. Over SMC-R the stream is the engine's nonblocking
//! [`SmcStream`]; a call that would block registers the task's waker with the stream's link
//! group, whose one progress thread (the same that serves blocking streams: completions,
//! CDCs, timers) wakes every registered task whenever it has processed completions, and at
//! least every 100 ms (its tick), so a missed wake-up costs latency, never a hang. A task
//! registers *before* its second attempt, so data that arrives between the attempt and the
//! registration is seen by that attempt. A fallback connection is the kernel's TCP socket
//! under tokio's reactor (`AsyncFd`), read and written through the same [`SmcStream`] (the
//! octets read during CLC come first; `smc stat` counts the octets).
//!
//! Connection setup (TCP connect/accept on the reactor, then the CLC exchange and CONFIRM
//! LINK, which wait on the TCP socket and the completion queue) runs on tokio's blocking
//! pool (`spawn_blocking`), once per connection; size it with
//! `runtime::Builder::max_blocking_threads`.
//!
//! ```no_run
//! # async fn demo(dev: verbs::Device) -> std::io::Result<()> {
//! use smc::stream::async_io::{AsyncSmcListener, AsyncSmcStream};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! let l = AsyncSmcListener::bind("127.115.1.1:0", &dev, smc::SmcConfig::default()).await?;
//! let addr = l.local_addr()?;
//! let mut c = AsyncSmcStream::connect(addr, &dev, &smc::SmcConfig::default()).await?;
//! let (mut s, _) = l.accept().await?;
//! c.write_all(b"ping").await?;
//! let mut b = [0u8; 4];
//! s.read_exact(&mut b).await?;
//! println!("{:?}", s.mode());
//! # Ok(()) }
//! ```

use super::{Kind, Mode, SmcConfig, SmcStream};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use verbs::Device;

/// An [`SmcStream`] for tokio: SMC-R or fallback TCP, `AsyncRead + AsyncWrite`.
#[derive(Debug)]
pub struct AsyncSmcStream {
    s: SmcStream,
    /// Fallback: the TCP socket registered with tokio's reactor (a clone of `s`'s; the
    /// octets go through `s`, which counts them).
    fd: Option<tokio::net::TcpStream>,
}

fn join_err(e: tokio::task::JoinError) -> io::Error {
    io::Error::other(format!("SMC-R setup task: {e}"))
}

impl AsyncSmcStream {
    /// Connects to `addr` and proposes SMC-R on `dev` (as [`SmcStream::connect_with`]).
    pub async fn connect<A: tokio::net::ToSocketAddrs>(addr: A, dev: &Device, cfg: &SmcConfig) -> io::Result<Self> {
        let tcp = tokio::net::TcpStream::connect(addr).await?.into_std()?;
        tcp.set_nonblocking(false)?;
        let (dev, cfg) = (dev.clone(), cfg.clone());
        let s = tokio::task::spawn_blocking(move || SmcStream::connect_over(tcp, &dev, &cfg))
            .await
            .map_err(join_err)??;
        Self::from_stream(s)
    }

    /// Wraps a set-up [`SmcStream`] (made nonblocking). Must be called within a tokio
    /// runtime (a fallback connection registers with its reactor).
    pub fn from_stream(s: SmcStream) -> io::Result<Self> {
        s.set_nonblocking(true)?;
        let fd = match &s.kind {
            Kind::Smc(_) => None,
            Kind::Tcp(_) => {
                let t = s.tcp.try_clone()?;
                t.set_nonblocking(true)?;
                Some(tokio::net::TcpStream::from_std(t)?)
            }
        };
        Ok(Self { s, fd })
    }

    /// The underlying stream (nonblocking): [`SmcStream::send_urgent`],
    /// [`SmcStream::recv_urgent`], [`SmcStream::at_urgent_mark`], addresses, ...
    pub fn get_ref(&self) -> &SmcStream {
        &self.s
    }

    /// SMC-R, or fallback to TCP with the reason.
    pub fn mode(&self) -> Mode {
        self.s.mode()
    }

    /// The local socket address of the TCP connection.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.s.local_addr()
    }

    /// The peer's socket address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.s.peer_addr()
    }

    /// Back to a blocking [`SmcStream`].
    pub fn into_stream(self) -> io::Result<SmcStream> {
        self.s.set_nonblocking(false)?;
        Ok(self.s)
    }

    /// Registers the task with the link group (SMC-R) so that its progress thread wakes it.
    fn register(&self, w: &Waker) {
        if let Kind::Smc(side) = &self.s.kind {
            let mut st = side.g.lock();
            if !st.wakers.iter().any(|x| x.will_wake(w)) {
                st.wakers.push(w.clone());
            }
            // the progress thread polls the CQ for async tasks (no lingering)
            side.g.pcv.notify_one();
        }
    }

    /// One nonblocking call `f`, waiting for readiness (`read` selects which) on WouldBlock.
    fn poll_io<R>(
        &mut self,
        cx: &mut Context<'_>,
        read: bool,
        mut f: impl FnMut(&mut SmcStream) -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        if let Some(fd) = &self.fd {
            // Octets buffered during CLC are readable without the socket.
            if read && !self.s.prefix.is_empty() {
                return Poll::Ready(f(&mut self.s));
            }
            let interest = if read { Interest::READABLE } else { Interest::WRITABLE };
            loop {
                let ready = if read {
                    fd.poll_read_ready(cx)
                } else {
                    fd.poll_write_ready(cx)
                };
                match ready {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
                // `try_io` clears the readiness when the call would block.
                match fd.try_io(interest, || f(&mut self.s)) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => return Poll::Ready(r),
                }
            }
        }
        match f(&mut self.s) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return Poll::Ready(r),
        }
        self.register(cx.waker());
        match f(&mut self.s) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
            r => Poll::Ready(r),
        }
    }
}

impl AsyncRead for AsyncSmcStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let dst = buf.initialize_unfilled();
        match me.poll_io(cx, true, |s| s.read(dst)) {
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for AsyncSmcStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().poll_io(cx, false, |s| s.write(buf))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Accepted octets are the engine's (SMC-R) or the kernel's (TCP) to send.
        Poll::Ready(Ok(()))
    }

    /// Half-close (`shutdown(SHUT_WR)`): over SMC-R D goes out once the queued octets have.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.s.shutdown(Shutdown::Write))
    }
}

/// An [`super::SmcListener`] for tokio: accepts on the reactor, runs the server side of
/// CLC on the blocking pool.
#[derive(Debug)]
pub struct AsyncSmcListener {
    tcp: tokio::net::TcpListener,
    dev: Device,
    cfg: SmcConfig,
}

impl AsyncSmcListener {
    /// Binds `addr`; accepted connections use SMC-R on `dev` when the client proposes it.
    pub async fn bind<A: tokio::net::ToSocketAddrs>(addr: A, dev: &Device, cfg: SmcConfig) -> io::Result<Self> {
        Ok(Self {
            tcp: tokio::net::TcpListener::bind(addr).await?,
            dev: dev.clone(),
            cfg,
        })
    }

    /// The listening address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Accepts one connection: SMC-R when the client proposes it, else fallback TCP with the
    /// reason in [`AsyncSmcStream::mode`].
    pub async fn accept(&self) -> io::Result<(AsyncSmcStream, SocketAddr)> {
        let (tcp, peer) = self.tcp.accept().await?;
        let tcp = tcp.into_std()?;
        tcp.set_nonblocking(false)?;
        let (dev, cfg) = (self.dev.clone(), self.cfg.clone());
        let s = tokio::task::spawn_blocking(move || SmcStream::accept_over(tcp, Some(&dev), &cfg, None))
            .await
            .map_err(join_err)??;
        Ok((AsyncSmcStream::from_stream(s)?, peer))
    }
}
