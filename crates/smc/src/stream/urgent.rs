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

use super::{Kind, SmcStream, sys};
use crate::conn::UrgentError;
use std::io;

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
}
