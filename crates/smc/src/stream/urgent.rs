//! Urgent data on an [`SmcStream`] (RFC 7609 §4.7.5–6, requirements A2.9), with Linux's
//! TCP behaviour as the model (requirements D1: one urgent pointer; the last octet of a
//! `send(MSG_OOB)` is the urgent octet, delivered out of band unless SO_OOBINLINE):
//!
//! | call | TCP | here |
//! |---|---|---|
//! | `send(MSG_OOB)` | [`SmcStream::send_urgent`] | CDC with P, then the write and CDC(P, U) |
//! | `recv(MSG_OOB [\|MSG_PEEK])` | [`SmcStream::recv_urgent`] | the octet; EINVAL when none, read already or in line; EAGAIN while announced but not arrived |
//! | `ioctl(SIOCATMARK)` | [`SmcStream::at_urgent_mark`] | the next octet read is the urgent one |
//! | `SO_OOBINLINE` | [`SmcStream::set_oob_inline`] | default off: reads skip the urgent octet |
//! | `recv` | [`std::io::Read`] | stops before the urgent octet (so the mark can be found) |
//!
//! A fallback connection uses the kernel's TCP calls for all of them.

use super::{GState, Kind, SmcStream, sys};
use crate::conn::UrgentError;
use std::io::{self, Read};
use std::time::Duration;

/// What [`SmcStream::read_relay`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relayed {
    /// This many octets of normal data (0 = end of stream).
    Data(usize),
    /// The urgent octet, at its place in the stream.
    Urgent(u8),
}

fn urgent_err(e: UrgentError) -> io::Error {
    match e {
        UrgentError::NotYet => io::Error::from_raw_os_error(libc::EAGAIN),
        UrgentError::NoUrgent | UrgentError::Inline => io::Error::from_raw_os_error(libc::EINVAL),
    }
}

impl SmcStream {
    /// `recv(MSG_OOB)`: the urgent octet, without waiting. `peek` leaves it readable again
    /// (MSG_PEEK). Errors as Linux's TCP: `EINVAL` (kind `InvalidInput`) when there is no
    /// urgent data, it was read already, or SO_OOBINLINE is set; `EAGAIN` (`WouldBlock`)
    /// when the peer announced urgent data (P) that has not arrived yet.
    pub fn recv_urgent(&self, peek: bool) -> io::Result<u8> {
        let s = match &self.kind {
            Kind::Tcp(_) => return sys::recv_oob(&self.tcp, peek),
            Kind::Smc(s) => s,
        };
        let mut st = s.g.lock();
        let super::GState { conns, rmbs, .. } = &mut *st;
        let sl = conns.get_mut(&s.cid).ok_or_else(|| Self::smc_err(None))?;
        let c = sl.conn.as_mut().ok_or_else(|| urgent_err(UrgentError::NoUrgent))?;
        let off = c.urgent_octet().map_err(urgent_err)?;
        let mut b = [0u8; 1];
        let base = sl.elem as usize * sl.elem_len as usize;
        rmbs[sl.rmb]
            .mr
            .read(base + off as usize, &mut b)
            .map_err(|_| io::Error::other("RMB read"))?;
        if !peek {
            c.take_urgent();
        }
        Ok(b[0])
    }

    /// `ioctl(SIOCATMARK)`: true when the next octet to read is the urgent octet (in line it
    /// is read next; out of line the next read skips it).
    pub fn at_urgent_mark(&self) -> io::Result<bool> {
        match &self.kind {
            Kind::Tcp(_) => sys::at_mark(&self.tcp),
            Kind::Smc(s) => {
                let st = s.g.lock();
                Ok(st
                    .conns
                    .get(&s.cid)
                    .and_then(|sl| sl.conn.as_ref())
                    .is_some_and(|c| c.at_urgent_mark()))
            }
        }
    }

    /// SO_OOBINLINE: `true` keeps the urgent octet in the data stream (reads still stop at
    /// the mark); `false`, the default as Linux's, offers it only to
    /// [`SmcStream::recv_urgent`].
    pub fn set_oob_inline(&self, inline: bool) -> io::Result<()> {
        match &self.kind {
            Kind::Tcp(_) => sys::set_oob_inline(&self.tcp, inline),
            Kind::Smc(s) => {
                let mut st = s.g.lock();
                let sl = st.conns.get_mut(&s.cid).ok_or_else(|| Self::smc_err(None))?;
                let c = sl
                    .conn
                    .as_mut()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "connection not set up"))?;
                c.set_oob_inline(inline);
                Ok(())
            }
        }
    }

    /// Whether SO_OOBINLINE is set.
    pub fn oob_inline(&self) -> io::Result<bool> {
        match &self.kind {
            Kind::Tcp(_) => sys::oob_inline(&self.tcp),
            Kind::Smc(s) => {
                let st = s.g.lock();
                Ok(st
                    .conns
                    .get(&s.cid)
                    .and_then(|sl| sl.conn.as_ref())
                    .is_some_and(|c| c.oob_inline()))
            }
        }
    }

    /// A read for a relay (the `smc run` daemon) that keeps the urgent mark's place: data
    /// before the mark as [`Relayed::Data`] (a read never crosses the mark), then the urgent
    /// octet itself as [`Relayed::Urgent`] (consumed; SO_OOBINLINE does not matter here), then
    /// the data after it. Blocks as `read` does (or `WouldBlock` when nonblocking). A
    /// fallback connection gives its data only.
    pub fn read_relay(&mut self, buf: &mut [u8]) -> io::Result<Relayed> {
        let s = match &self.kind {
            Kind::Tcp(_) => return self.read(buf).map(Relayed::Data),
            Kind::Smc(s) => s,
        };
        if buf.is_empty() {
            return Ok(Relayed::Data(0));
        }
        let mut st = s.g.lock();
        loop {
            let GState { conns, links, rmbs, .. } = &mut *st;
            let sl = conns.get_mut(&s.cid).ok_or_else(|| Self::smc_err(None))?;
            if sl.read_shut {
                return Ok(Relayed::Data(0));
            }
            if let Some(c) = sl.conn.as_mut() {
                let base = sl.elem as usize * sl.elem_len as usize;
                let rmb = &rmbs[sl.rmb].mr;
                let rd = |off: u32, dst: &mut [u8]| {
                    rmb.read(base + off as usize, dst)
                        .map_err(|_| io::Error::other("RMB read"))
                };
                if c.at_urgent_mark() {
                    let (a, _) = c.read_spans(1);
                    let mut b = [0u8; 1];
                    rd(a.off, &mut b)?;
                    c.consume(1).map_err(io::Error::other)?;
                    sl.received += 1;
                    s.g.drive(links, s.cid, sl);
                    return Ok(Relayed::Urgent(b[0]));
                }
                let avail = match c.bytes_to_urgent_mark() {
                    Some(d) if d > 1 => c.readable().min(d - 1),
                    _ => c.readable(),
                };
                if avail > 0 {
                    let (a, b) = c.read_spans((buf.len() as u64).min(avail));
                    let la = a.len as usize;
                    rd(a.off, &mut buf[..la])?;
                    let mut n = la;
                    if let Some(b) = b {
                        rd(b.off, &mut buf[la..la + b.len as usize])?;
                        n += b.len as usize;
                    }
                    c.consume(n as u64).map_err(io::Error::other)?;
                    sl.received += n as u64;
                    s.g.drive(links, s.cid, sl);
                    return Ok(Relayed::Data(n));
                }
                if c.read_eof() {
                    return Ok(Relayed::Data(0));
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
