//! ONC RPC over TCP with record marking (RFC 5531 §11): a threaded server for a
//! [`Registry`] and a client with many outstanding calls matched by XID.
//!
//! The server reads records on one thread per connection and answers calls in
//! arrival order; a record that is not a decodable call is dropped without an
//! answer, a broken record stream (oversized record, too many fragments) ends
//! that connection only. The client writes each call as one record and a reader
//! thread hands every reply to the caller waiting for its XID; replies may come
//! in any order.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::client::{Call, RpcError, XidSource, decode_reply};
use crate::record::{RecordReader, encode_record};
use crate::server::{Dispatch, Registry, dispatch};
use crate::xdr::{Decoder, XdrError};

/// Largest record either side accepts.
pub const MAX_RECORD: usize = 64 << 20;
/// Largest fragment we send.
const MAX_FRAGMENT: usize = 1 << 20;

/// A running TCP RPC server.
pub struct TcpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl TcpServer {
    /// Listen on `addr` (port 0 picks one) and serve `registry` until dropped.
    pub fn spawn(addr: SocketAddr, registry: Arc<Registry>) -> std::io::Result<TcpServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let accept = std::thread::Builder::new()
            .name("rpc-tcp-accept".into())
            .spawn(move || {
                for s in listener.incoming() {
                    if stop2.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(s) = s else { continue };
                    let reg = registry.clone();
                    let _ = std::thread::Builder::new()
                        .name("rpc-tcp-conn".into())
                        .spawn(move || serve_connection(s, &reg));
                }
            })?;
        Ok(TcpServer {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // wake the accept loop
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn serve_connection(mut s: TcpStream, reg: &Registry) {
    let _ = s.set_nodelay(true);
    let mut reader = RecordReader::new(MAX_RECORD);
    let mut buf = vec![0u8; 256 << 10];
    let mut out = Vec::new();
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut input = &buf[..n];
        while !input.is_empty() {
            let (used, rec) = match reader.decode(input) {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!("rpc tcp: record stream broken: {e}; closing");
                    let _ = s.shutdown(Shutdown::Both);
                    return;
                }
            };
            input = &input[used..];
            let Some(rec) = rec else { continue };
            let reply = match dispatch(reg, &mut Decoder::new(&rec), "tcp") {
                Dispatch::Reply { stream, .. } => stream,
                Dispatch::ChunkError { .. } | Dispatch::Drop => continue,
            };
            out.clear();
            if encode_record(&reply, MAX_FRAGMENT, &mut out).is_err() || s.write_all(&out).is_err() {
                return;
            }
        }
    }
}

type Waiter = SyncSender<Result<Vec<u8>, RpcError>>;

struct Shared {
    pending: Mutex<HashMap<u32, Waiter>>,
    dead: AtomicBool,
}

/// An RPC client over one TCP connection; `call` may be used from many threads
/// at once (many outstanding calls).
pub struct TcpClient {
    writer: Mutex<TcpStream>,
    shared: Arc<Shared>,
    xids: XidSource,
    timeout: Duration,
    reader: Option<JoinHandle<()>>,
}

impl TcpClient {
    /// Connect to `addr`.
    pub fn connect(addr: SocketAddr) -> std::io::Result<TcpClient> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let r = s.try_clone()?;
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
        });
        let sh = shared.clone();
        let reader = std::thread::Builder::new()
            .name("rpc-tcp-client".into())
            .spawn(move || client_reader(r, &sh))?;
        Ok(TcpClient {
            writer: Mutex::new(s),
            shared,
            xids: XidSource::new(),
            timeout: Duration::from_secs(30),
            reader: Some(reader),
        })
    }

    /// Per-call timeout (default 30 s).
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// Make one call and decode its results with `decode`.
    pub fn call<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, RpcError> {
        let xid = self.xids.next();
        let (msg, _) = call.encode(xid).map_err(|e| RpcError::Local(e.to_string()))?;
        let mut rec = Vec::with_capacity(msg.len() + 8);
        encode_record(&msg, MAX_FRAGMENT, &mut rec).map_err(|e| RpcError::Local(e.to_string()))?;
        let (tx, rx) = sync_channel(1);
        if self.shared.dead.load(Ordering::Acquire) {
            return Err(RpcError::Disconnected("connection closed".into()));
        }
        self.shared.pending.lock().unwrap().insert(xid, tx);
        // the reader may have failed everything just before the insert
        if self.shared.dead.load(Ordering::Acquire) {
            self.shared.pending.lock().unwrap().remove(&xid);
            return Err(RpcError::Disconnected("connection closed".into()));
        }
        let sent = self.writer.lock().unwrap().write_all(&rec);
        if let Err(e) = sent {
            self.shared.pending.lock().unwrap().remove(&xid);
            return Err(RpcError::Disconnected(e.to_string()));
        }
        let reply = match rx.recv_timeout(self.timeout) {
            Ok(r) => r?,
            Err(_) => {
                self.shared.pending.lock().unwrap().remove(&xid);
                return Err(RpcError::Timeout);
            }
        };
        decode_reply(&mut Decoder::new(&reply), xid, decode)
    }
}

impl Drop for TcpClient {
    fn drop(&mut self) {
        let _ = self.writer.lock().unwrap().shutdown(Shutdown::Both);
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

fn client_reader(mut s: TcpStream, sh: &Shared) {
    let mut reader = RecordReader::new(MAX_RECORD);
    let mut buf = vec![0u8; 256 << 10];
    let why = 'outer: loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break "closed by the server".to_string(),
            Err(e) => break e.to_string(),
            Ok(n) => n,
        };
        let mut input = &buf[..n];
        while !input.is_empty() {
            let (used, rec) = match reader.decode(input) {
                Ok(r) => r,
                Err(e) => break 'outer e.to_string(),
            };
            input = &input[used..];
            let Some(rec) = rec else { continue };
            // replies whose XID nobody waits for are dropped (late or bogus)
            let Some((xid, crate::rpc::MSG_REPLY)) = crate::rpc::peek_xid_and_type(&rec) else {
                continue;
            };
            if let Some(w) = sh.pending.lock().unwrap().remove(&xid) {
                let _ = w.send(Ok(rec));
            }
        }
    };
    sh.dead.store(true, Ordering::Release);
    let _ = s.shutdown(Shutdown::Both);
    for (_, w) in sh.pending.lock().unwrap().drain() {
        let _ = w.send(Err(RpcError::Disconnected(why.clone())));
    }
}
