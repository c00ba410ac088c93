//! Abortive close (RFC 7609 §4.8.2, Figure 23; requirements SMC-ABT-1..3, A4.6 e): the
//! socket API's `SO_LINGER {1, 0}` + `close`. Over SMC-R the connection machine sends a CDC
//! with A and enters PeerAbortWait; the engine resets the TCP connection with a real RST
//! (`sys::reset`); the peer's reads and writes fail with `ConnectionReset` (ECONNRESET)
//! and its unread and unsent data are dropped. A fallback connection is the kernel's
//! `SO_LINGER {1, 0}` close.

use super::{Kind, SmcStream, sys};
use std::io;
use std::time::Duration;

impl SmcStream {
    /// SO_LINGER. `Some(Duration::ZERO)` makes dropping the last handle an abort (CDC with A
    /// and a TCP RST) instead of an orderly close. Other values are handed to the TCP socket
    /// (an SMC-R close never waits in `drop`: the link group's progress thread finishes it).
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        let secs = linger.map(|d| d.as_secs().min(u64::from(u32::MAX)) as u32);
        match &self.kind {
            Kind::Tcp(_) => sys::set_linger(&self.tcp, secs),
            Kind::Smc(s) => {
                let mut st = s.g.lock();
                let sl = st.conns.get_mut(&s.cid).ok_or_else(|| Self::smc_err(None))?;
                sl.linger_zero = linger == Some(Duration::ZERO);
                Ok(())
            }
        }
    }

    /// Aborts the connection now (as `set_linger(Some(ZERO))` and dropping every handle):
    /// over SMC-R a CDC with A and a TCP RST; other handles' calls then fail.
    pub fn abort(self) -> io::Result<()> {
        match &self.kind {
            Kind::Tcp(_) => {
                sys::set_linger(&self.tcp, Some(0))?;
                sys::reset(&self.tcp)
            }
            Kind::Smc(s) => {
                let mut st = s.g.lock();
                let super::GState { conns, links, .. } = &mut *st;
                let sl = conns.get_mut(&s.cid).ok_or_else(|| Self::smc_err(None))?;
                sl.linger_zero = true;
                if let Some(c) = sl.conn.as_mut() {
                    c.abort();
                }
                s.g.drive(links, s.cid, sl);
                s.g.wake_waiters(&mut st);
                Ok(())
            }
        }
    }
}
