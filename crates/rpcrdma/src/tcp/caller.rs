//! [`TcpCaller`]: an ONC RPC client over TCP whose calling thread reads its own Reply.
//!
//! [`TcpClient`](super::TcpClient) runs a reader thread that takes every Reply off the socket
//! and hands it to its caller (one thread hand-off per call, many calls in flight). A
//! synchronous client such as libtirpc's `clnt_vc` does no such thing: the caller writes its
//! Call and reads the Reply itself. That is the baseline issue 18 compares the small-call round
//! trip of RPC-over-RDMA with (`softrdma rpc bench --proc null|echo`), in the same wait mode as
//! the RDMA caller: blocking in `read` (events mode), or, with busy polling, spinning on a
//! non-blocking socket until the Reply has arrived.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client::{Call, Disconnect, RpcError, XidSource, decode_reply};
use crate::record::RecordReader;
use crate::xdr::{Decoder, XdrError};

use super::{MAX_RECORD, PageBuf};

/// How a [`TcpCaller`] waits for its Reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpWait {
    /// Sleep in `read(2)` on a blocking socket.
    Block,
    /// Spin on `read(2)` of a non-blocking socket (as `sockperf --nonblocked` does).
    BusyPoll,
}

/// An ONC RPC client over one TCP connection without a reader thread: each call writes its
/// record and its own thread reads until its Reply (by XID) is complete. Calls from several
/// threads take turns (one call on the connection at a time); Replies to XIDs nobody waits
/// for any more (a call that timed out) are read and dropped.
pub struct TcpCaller {
    conn: Mutex<Conn>,
    xids: XidSource,
    timeout: Duration,
    wait: TcpWait,
}

struct Conn {
    s: TcpStream,
    reader: RecordReader,
    buf: PageBuf,
    /// Bytes read but not yet decoded: `buf[at..end]`.
    at: usize,
    end: usize,
    dead: Option<Disconnect>,
    blocking: bool,
}

impl TcpCaller {
    /// Connects to `addr`; calls wait as `wait` says, at most 30 s each
    /// ([`TcpCaller::set_timeout`]).
    pub fn connect(addr: SocketAddr, wait: TcpWait) -> std::io::Result<TcpCaller> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_nonblocking(wait == TcpWait::BusyPoll)?;
        let timeout = Duration::from_secs(30);
        // a blocking read gives up after the call's timeout (no setsockopt per call)
        s.set_read_timeout(Some(timeout))?;
        Ok(TcpCaller {
            conn: Mutex::new(Conn {
                s,
                reader: RecordReader::new(MAX_RECORD),
                buf: PageBuf::new(256 << 10, 0),
                at: 0,
                end: 0,
                dead: None,
                blocking: wait == TcpWait::Block,
            }),
            xids: XidSource::new(),
            timeout,
            wait,
        })
    }

    /// Per-call timeout (default 30 s; a blocking caller may wait up to twice this when
    /// a read began just before its deadline).
    pub fn set_timeout(&mut self, t: Duration) -> std::io::Result<()> {
        let c = self.conn.get_mut().unwrap_or_else(|p| p.into_inner());
        c.s.set_read_timeout(Some(t.max(Duration::from_millis(1))))?;
        self.timeout = t;
        Ok(())
    }

    /// How this caller waits.
    pub fn wait(&self) -> TcpWait {
        self.wait
    }

    /// Makes one call and decodes its results with `decode`.
    pub fn call<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, RpcError> {
        let (xid, rec) = super::encode_call_record(&self.xids, call)?;
        let deadline = Instant::now() + self.timeout;
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = &c.dead {
            return Err(d.clone().into());
        }
        let r = c.send(&rec, deadline).and_then(|()| c.receive(xid, deadline));
        match r {
            Ok(reply) => {
                drop(c);
                decode_reply(&mut Decoder::new(&reply), xid, decode)
            }
            Err(RpcError::Timeout) => Err(RpcError::Timeout),
            Err(RpcError::Disconnected(d)) => {
                let _ = c.s.shutdown(Shutdown::Both);
                c.dead = Some(d.clone());
                Err(RpcError::Disconnected(d))
            }
            Err(e) => Err(e),
        }
    }
}

impl Conn {
    /// Writes all of `rec` (spinning on `WouldBlock` when the socket is non-blocking).
    fn send(&mut self, mut rec: &[u8], deadline: Instant) -> Result<(), RpcError> {
        while !rec.is_empty() {
            match self.s.write(rec) {
                Ok(0) => return Err(Disconnect::ClosedByPeer.into()),
                Ok(n) => rec = &rec[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(RpcError::Timeout);
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(Disconnect::from(e).into()),
            }
        }
        Ok(())
    }

    /// Reads records until the Reply to `xid` is complete; others are dropped.
    fn receive(&mut self, xid: u32, deadline: Instant) -> Result<Vec<u8>, RpcError> {
        let mut spins = 0u32;
        loop {
            while self.at < self.end {
                let (used, rec) = self
                    .reader
                    .decode(&self.buf.bytes()[self.at..self.end])
                    .map_err(Disconnect::Record)?;
                self.at += used;
                if let Some(rec) = rec
                    && crate::rpc::peek_xid_and_type(&rec) == Some((xid, crate::rpc::MSG_REPLY))
                {
                    return Ok(rec);
                }
            }
            match self.s.read(self.buf.bytes_mut()) {
                Ok(0) => return Err(Disconnect::ClosedByPeer.into()),
                Ok(n) => {
                    self.at = 0;
                    self.end = n;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    // a blocking read timed out (its timeout is the call's), or a busy one
                    // found nothing: look at the deadline now and then
                    spins = spins.wrapping_add(1);
                    if (self.blocking || spins.is_multiple_of(1024)) && Instant::now() >= deadline {
                        return Err(RpcError::Timeout);
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(Disconnect::from(e).into()),
            }
        }
    }
}

impl crate::client::RpcClient for TcpCaller {
    fn call<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, RpcError> {
        TcpCaller::call(self, call, decode)
    }
}
