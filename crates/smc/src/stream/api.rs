//! The public API: [`SmcStream`] (Read/Write, shutdown, nonblocking, urgent data) and
//! [`SmcListener`].

use super::*;

/// The SMC-R part of a stream.
pub(super) struct SmcSide {
    pub(super) g: Arc<Group>,
    pub(super) cid: u32,
    /// Handles (this stream and its clones) still open; the last one closes.
    pub(super) handles: Arc<AtomicU32>,
}

pub(super) enum Kind {
    Smc(SmcSide),
    Tcp(Option<Arc<FallbackInfo>>),
}

/// A TCP connection whose data flows over SMC-R when both ends support it; otherwise plain
/// TCP (see [`SmcStream::mode`]). Mirrors `std::net::TcpStream`.
pub struct SmcStream {
    pub(super) tcp: TcpStream,
    pub(super) kind: Kind,
    pub(super) mode: Mode,
    /// Application octets that arrived on the TCP path during the CLC exchange (fallback).
    pub(super) prefix: Vec<u8>,
}

impl std::fmt::Debug for SmcStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcStream")
            .field("tcp", &self.tcp)
            .field("mode", &self.mode)
            .finish()
    }
}

impl SmcStream {
    /// A fallback connection's TCP stream and the octets already read from it during the
    /// CLC exchange (they come before anything still in the socket); `Err(self)` over SMC-R.
    pub fn into_tcp(self) -> Result<(TcpStream, Vec<u8>), Self> {
        if !matches!(self.kind, Kind::Tcp(_)) {
            return Err(self);
        }
        let mut me = self;
        match me.tcp.try_clone() {
            Ok(tcp) => Ok((tcp, std::mem::take(&mut me.prefix))),
            Err(_) => Err(me),
        }
    }

    /// A second handle to the same connection (e.g. one thread reads, one writes), as
    /// `TcpStream::try_clone`. The connection closes when the last handle is dropped.
    /// Octets of a fallback connection already buffered during CLC stay with `self`.
    pub fn try_clone(&self) -> io::Result<Self> {
        let kind = match &self.kind {
            Kind::Tcp(i) => Kind::Tcp(i.clone()),
            Kind::Smc(s) => {
                s.handles.fetch_add(1, Ordering::AcqRel);
                Kind::Smc(SmcSide {
                    g: Arc::clone(&s.g),
                    cid: s.cid,
                    handles: Arc::clone(&s.handles),
                })
            }
        };
        Ok(Self {
            tcp: self.tcp.try_clone()?,
            kind,
            mode: self.mode,
            prefix: Vec::new(),
        })
    }

    /// SMC-R, or fallback to TCP with the reason.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The id of the link group carrying this connection (as `smc stat` shows it); None
    /// for a fallback connection.
    pub fn link_group(&self) -> Option<u32> {
        match &self.kind {
            Kind::Smc(s) => Some(s.g.id),
            Kind::Tcp(_) => None,
        }
    }

    /// The local socket address of the TCP connection.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The peer's socket address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.peer_addr()
    }

    /// Non-blocking reads and writes (`WouldBlock` instead of waiting).
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match &self.kind {
            Kind::Smc(s) => {
                if let Some(sl) = s.g.lock().conns.get_mut(&s.cid) {
                    sl.nonblocking = nonblocking;
                }
                Ok(())
            }
            Kind::Tcp(_) => self.tcp.set_nonblocking(nonblocking),
        }
    }

    /// Shuts down reading, writing or both, as `TcpStream::shutdown`. Over SMC-R writing
    /// ends with a CDC carrying D once the queued data is out (SMC-CLS-3); reading is
    /// local only (SMC-CLS-11).
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match &self.kind {
            Kind::Tcp(_) => self.tcp.shutdown(how),
            Kind::Smc(s) => {
                let mut st = s.g.lock();
                let GState { conns, links, .. } = &mut *st;
                let sl = conns
                    .get_mut(&s.cid)
                    .ok_or_else(|| io_err(io::ErrorKind::NotConnected, "connection gone"))?;
                if matches!(how, Shutdown::Read | Shutdown::Both) {
                    sl.read_shut = true;
                }
                if matches!(how, Shutdown::Write | Shutdown::Both) {
                    let c = sl
                        .conn
                        .as_mut()
                        .ok_or_else(|| io_err(io::ErrorKind::NotConnected, "connection not set up"))?;
                    c.shutdown_write().map_err(|e| io_err(io::ErrorKind::NotConnected, e))?;
                    s.g.drive(links, s.cid, sl);
                }
                s.g.wake_waiters(&mut st);
                Ok(())
            }
        }
    }

    /// The octets that can be read without blocking (FIONREAD).
    pub fn readable(&self) -> usize {
        match &self.kind {
            Kind::Smc(s) => {
                let st = s.g.lock();
                let n = st
                    .conns
                    .get(&s.cid)
                    .and_then(|sl| sl.conn.as_ref())
                    .map_or(0, |c| c.readable() as usize);
                n + self.prefix.len()
            }
            Kind::Tcp(_) => self.prefix.len(),
        }
    }

    pub(super) fn smc_err(sl: Option<&Slot>) -> io::Error {
        let Some(sl) = sl else {
            return io_err(io::ErrorKind::ConnectionReset, "SMC-R connection gone");
        };
        if let Some(e) = &sl.link_error {
            return io_err(io::ErrorKind::ConnectionReset, format!("SMC-R link failed: {e}"));
        }
        match sl.conn.as_ref().and_then(|c| c.abort_reason()) {
            Some(AbortReason::PeerAbort) | Some(AbortReason::TcpReset) => {
                io_err(io::ErrorKind::ConnectionReset, "connection reset by peer")
            }
            Some(r) => io_err(io::ErrorKind::ConnectionAborted, r),
            None => io_err(io::ErrorKind::BrokenPipe, "connection closed"),
        }
    }
}

impl Read for SmcStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.prefix.is_empty() {
            let n = buf.len().min(self.prefix.len());
            buf[..n].copy_from_slice(&self.prefix[..n]);
            self.prefix.drain(..n);
            if let Kind::Tcp(Some(i)) = &self.kind {
                i.received.fetch_add(n as u64, Ordering::Relaxed);
            }
            return Ok(n);
        }
        let s = match &self.kind {
            Kind::Tcp(i) => {
                let n = self.tcp.read(buf)?;
                if let Some(i) = i {
                    i.received.fetch_add(n as u64, Ordering::Relaxed);
                }
                return Ok(n);
            }
            Kind::Smc(s) => s,
        };
        if buf.is_empty() {
            return Ok(0);
        }
        let mut st = s.g.lock();
        loop {
            let GState { conns, links, rmbs, .. } = &mut *st;
            let Some(sl) = conns.get_mut(&s.cid) else {
                return Err(Self::smc_err(None));
            };
            if sl.read_shut {
                return Ok(0);
            }
            if let Some(c) = sl.conn.as_mut() {
                // Urgent data (A2.9, Linux's TCP behaviour): out of line the urgent octet is
                // dropped from the stream at the mark; reads stop before it.
                if c.skip_urgent() {
                    s.g.drive(links, s.cid, sl);
                    continue;
                }
                let in_band = c.readable_in_band();
                if in_band > 0 {
                    let base = sl.elem as usize * sl.elem_len as usize;
                    let rmb = &rmbs[sl.rmb].mr;
                    let (a, b) = c.read_spans((buf.len() as u64).min(in_band));
                    let la = a.len as usize;
                    rmb.read(base + a.off as usize, &mut buf[..la])
                        .map_err(|_| io_err(io::ErrorKind::Other, "RMB read"))?;
                    let mut n = la;
                    if let Some(b) = b {
                        let lb = b.len as usize;
                        rmb.read(base + b.off as usize, &mut buf[la..la + lb])
                            .map_err(|_| io_err(io::ErrorKind::Other, "RMB read"))?;
                        n += lb;
                    }
                    c.consume(n as u64).map_err(|e| io_err(io::ErrorKind::Other, e))?;
                    sl.received += n as u64;
                    s.g.drive(links, s.cid, sl);
                    return Ok(n);
                }
                if c.read_eof() {
                    return Ok(0);
                }
                if c.abort_reason().is_some() {
                    return Err(Self::smc_err(Some(&*sl)));
                }
            }
            if sl.link_error.is_some() {
                return Err(Self::smc_err(Some(&*sl)));
            }
            if sl.nonblocking {
                // a busy reader or writer polls the CQ itself
                if s.g.poll_conn(&mut st) {
                    continue;
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
            st = s.g.wait_conn(st, Duration::from_millis(200));
        }
    }
}

impl SmcStream {
    pub(super) fn smc_write(s: &SmcSide, buf: &[u8], urgent: bool) -> io::Result<usize> {
        let mut st = s.g.lock();
        loop {
            let GState { conns, links, .. } = &mut *st;
            let Some(sl) = conns.get_mut(&s.cid) else {
                return Err(Self::smc_err(None));
            };
            let failed = sl.link_error.is_some() || sl.conn.as_ref().is_none_or(|c| c.abort_reason().is_some());
            if failed {
                return Err(Self::smc_err(Some(&*sl)));
            }
            let Some(c) = sl.conn.as_mut() else {
                return Err(Self::smc_err(Some(&*sl)));
            };
            let space = c.write_space();
            if space > 0 {
                let n = (buf.len() as u64).min(space) as usize;
                let ring = sl.send_len as usize;
                let off = (sl.accepted % ring as u64) as usize;
                let first = n.min(ring - off);
                // Octets beyond the accepted ones are not in use: copying before the machine
                // accepts them is harmless if it does not.
                sl.sndbuf
                    .write(off, &buf[..first])
                    .map_err(|_| io_err(io::ErrorKind::Other, "send buffer"))?;
                if first < n {
                    sl.sndbuf
                        .write(0, &buf[first..n])
                        .map_err(|_| io_err(io::ErrorKind::Other, "send buffer"))?;
                }
                let r = if urgent {
                    c.write_urgent(n as u64)
                } else {
                    c.write(n as u64)
                };
                match r {
                    Ok(took) => {
                        sl.accepted += took;
                        s.g.drive(links, s.cid, sl);
                        return Ok(took as usize);
                    }
                    Err(ConnError::UrgentOutstanding) => {}
                    Err(e) => return Err(io_err(io::ErrorKind::BrokenPipe, e)),
                }
            } else if let Err(e) = c.write(0) {
                return Err(io_err(io::ErrorKind::BrokenPipe, e));
            }
            if sl.nonblocking {
                // a busy reader or writer polls the CQ itself
                if s.g.poll_conn(&mut st) {
                    continue;
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
            st = s.g.wait_conn(st, Duration::from_millis(200));
        }
    }

    /// Sends `buf` as urgent data (`send(MSG_OOB)`): the last octet accepted is the urgent
    /// mark (A2.9; TCP-like, as Linux). Waits while earlier urgent data is unacknowledged.
    /// On a fallback connection it is TCP's `send(MSG_OOB)`.
    pub fn send_urgent(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.kind {
            Kind::Tcp(_) => {
                let n = sys::send_oob(&self.tcp, buf)?;
                if let Kind::Tcp(Some(i)) = &self.kind {
                    i.sent.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(n)
            }
            Kind::Smc(_) if buf.is_empty() => Ok(0),
            Kind::Smc(s) => Self::smc_write(s, buf, true),
        }
    }

    /// Urgent data announced by the peer and not yet read past: `Some(n)` = the urgent octet
    /// is the `n`-th octet to read (`Some(0)` when announced but not yet written, A4.5).
    pub fn urgent_mark(&self) -> Option<usize> {
        match &self.kind {
            Kind::Tcp(_) => None,
            Kind::Smc(s) => {
                let st = s.g.lock();
                let c = st.conns.get(&s.cid)?.conn.as_ref()?;
                match c.bytes_to_urgent_mark() {
                    Some(n) => Some(n as usize),
                    None => c.urgent_pending().then_some(0),
                }
            }
        }
    }
}

impl Write for SmcStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.kind {
            Kind::Tcp(i) => {
                let n = self.tcp.write(buf)?;
                if let Some(i) = i {
                    i.sent.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(n)
            }
            Kind::Smc(_) if buf.is_empty() => Ok(0),
            Kind::Smc(s) => Self::smc_write(s, buf, false),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &self.kind {
            Kind::Tcp(_) => self.tcp.flush(),
            Kind::Smc(_) => Ok(()),
        }
    }
}

impl Drop for SmcStream {
    fn drop(&mut self) {
        if let Kind::Smc(s) = &mut self.kind {
            if s.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
                return;
            }
            let mut st = s.g.lock();
            let GState { conns, links, .. } = &mut *st;
            if let Some(sl) = conns.get_mut(&s.cid) {
                // close(): C once everything queued is out; abort if data is unread
                // (SMC-CLS-2). The group's progress thread finishes the close handshake
                // (the application does not wait, as with close(2)) and frees the element.
                if let Some(c) = sl.conn.as_mut() {
                    if sl.linger_zero {
                        c.abort();
                    } else {
                        c.close();
                    }
                }
                sl.dropped = true;
                s.g.drive(links, s.cid, sl);
            }
        }
    }
}

/// Accepts TCP connections and runs SMC-R on them when the client proposes it.
/// Mirrors `std::net::TcpListener`.
pub struct SmcListener {
    pub(super) tcp: TcpListener,
    pub(super) dev: Device,
    pub(super) cfg: SmcConfig,
}

impl std::fmt::Debug for SmcListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcListener")
            .field("tcp", &self.tcp)
            .field("device", &self.dev.name())
            .finish()
    }
}

impl SmcListener {
    /// Binds `addr`; accepted connections use SMC-R on `dev`.
    pub fn bind<A: ToSocketAddrs>(addr: A, dev: &Device) -> io::Result<Self> {
        Self::bind_with(addr, dev, SmcConfig::default())
    }

    /// [`SmcListener::bind`] with explicit settings.
    pub fn bind_with<A: ToSocketAddrs>(addr: A, dev: &Device, cfg: SmcConfig) -> io::Result<Self> {
        cfg.check()?;
        Ok(Self {
            tcp: TcpListener::bind(addr)?,
            dev: dev.clone(),
            cfg,
        })
    }

    /// The listening address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Accepts one connection and runs the server side of the CLC exchange on it: a new
    /// link group (first contact) or an element in the group this client already has
    /// (subsequent contact).
    pub fn accept(&self) -> io::Result<(SmcStream, SocketAddr)> {
        let (tcp, peer) = self.tcp.accept()?;
        Ok((SmcStream::accept_over(tcp, Some(&self.dev), &self.cfg, None)?, peer))
    }

    /// An iterator over accepted connections, as `TcpListener::incoming`.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<SmcStream>> + '_ {
        std::iter::repeat_with(move || self.accept().map(|(s, _)| s))
    }
}
