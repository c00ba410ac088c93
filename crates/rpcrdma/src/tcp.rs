//! ONC RPC over TCP with record marking (RFC 5531 §11): a server for a
//! [`Registry`] driven by one reactor thread, and a client with many
//! outstanding calls matched by XID.
//!
//! # Server resource model
//!
//! The server is built to be exposed to unauthenticated peers; every resource
//! a peer can make it hold is bounded by [`TcpServerConfig`] (safe defaults,
//! all configurable):
//!
//! * **Threads.** One reactor thread (mio/epoll, edge-triggered) serves the
//!   listener and every connection; calls are handled by a fixed pool of
//!   [`TcpServerConfig::workers`] threads (an [`IoPool`], or the shared
//!   [`TcpServerConfig::pool`]: connections are served in turn, one connection runs at
//!   most half the threads, see [`crate::pool`]), so a slow handler never holds up
//!   the reactor, and one connection's slow calls not the others'. No thread per connection: 1,000 connections cost the same
//!   threads as one. An idle connection costs no CPU: the reactor sleeps in
//!   `epoll_wait` and wakes once per timer tick (at most once a second with
//!   the default timeouts) to expire timeouts.
//! * **Connections.** At most [`TcpServerConfig::max_connections`]; a
//!   connection beyond that is accepted and closed at once, with a warning
//!   log line once per episode. The listen backlog is
//!   [`TcpServerConfig::listen_backlog`].
//! * **Memory per connection.** A partial record is at most
//!   [`TcpServerConfig::max_record`] octets (checked at each fragment header
//!   by [`RecordReader`], before the data arrives; a larger one ends the
//!   connection). Calls being handled are at most
//!   [`TcpServerConfig::max_calls_in_flight`]. While a connection's replies
//!   not yet written exceed [`TcpServerConfig::reply_backlog`] octets (or its
//!   calls in flight are at the limit), none of its calls is handed to a
//!   worker and the connection is not read: a client that never reads its
//!   replies pins at most that budget plus the replies of the calls already
//!   in flight when it was reached.
//! * **Memory in total.** Partial records, calls in flight and unwritten
//!   replies of all connections are charged to one budget,
//!   [`TcpServerConfig::memory_budget`]. A connection whose partial record
//!   would take the total over it is closed (log line). While the total is
//!   over it (replies wait to be written), no connection is read, workers
//!   start no new call (a reply's size is known only once it is built) and
//!   complete calls wait, so the total exceeds the budget by at most the
//!   replies being built, one per worker, and one read buffer.
//! * **Time.** A record that stops arriving is dropped with its connection
//!   after [`TcpServerConfig::read_timeout`]; a connection with nothing in
//!   progress is closed after [`TcpServerConfig::idle_timeout`]; a reply
//!   backlog that makes no progress (the peer does not read) ends the
//!   connection after [`TcpServerConfig::write_timeout`].
//! * **File descriptors.** When `accept` fails for lack of descriptors or
//!   memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) the listener backs off (10 ms,
//!   doubling to 500 ms, as Go's and tokio's accept loops do) instead of
//!   spinning, logs once per episode, and resumes as soon as a descriptor is
//!   free; the connections already open are served meanwhile. Before backing
//!   off it closes the connection idle the longest (idle for at least a
//!   second), so peers that only hold connections open cannot keep a new
//!   client out until their idle timeout.
//!
//! Calls on one connection may be answered out of order (RFC 5531 §11 lets the
//! client match replies by XID); a record that is not a decodable call is
//! dropped without an answer; a broken record stream (oversized record, too
//! many fragments) ends that connection only.
//!
//! The client writes each call as one record and a reader thread hands every
//! reply to the caller waiting for its XID; replies may come in any order.

mod caller;
mod page_buf;
pub use caller::{TcpCaller, TcpWait};
pub use page_buf::PageBuf;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};

use crate::client::{Call, Disconnect, LocalError, RpcError, XidSource, decode_reply};
use crate::pool::{IoPool, PoolConfig};
use crate::record::{DEFAULT_MAX_FRAGMENTS, RecordReader, encode_record};
use crate::server::{Dispatch, Registry, dispatch};
use crate::xdr::{Decoder, XdrError};

/// Largest record either side accepts by default.
pub const MAX_RECORD: usize = 64 << 20;
/// Largest fragment we send.
const MAX_FRAGMENT: usize = 1 << 20;

/// The limits of a [`TcpServer`] (see the module's resource model).
#[derive(Debug, Clone)]
pub struct TcpServerConfig {
    /// Connections served at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// `listen(2)` backlog.
    pub listen_backlog: i32,
    /// Largest record (call) accepted; a larger one ends the connection.
    pub max_record: usize,
    /// Largest number of fragments in one record.
    pub max_fragments: usize,
    /// Calls of one connection being handled at once; at the limit the
    /// connection is not read.
    pub max_calls_in_flight: usize,
    /// Octets of unwritten replies per connection above which the server
    /// stops reading that connection's calls.
    pub reply_backlog: usize,
    /// Octets of partial records, calls in flight and unwritten replies of
    /// all connections together.
    pub memory_budget: usize,
    /// A started record that receives nothing for this long is dropped with
    /// its connection.
    pub read_timeout: Duration,
    /// A connection with no call, reply or partial record in progress is
    /// closed after this long.
    pub idle_timeout: Duration,
    /// A reply backlog that the peer does not read from for this long ends
    /// the connection.
    pub write_timeout: Duration,
    /// Threads that run the handlers (the server's own [`IoPool`] when `pool` is `None`).
    pub workers: usize,
    /// Run the handlers on this shared pool (e.g. one for every transport of an NFS
    /// server) instead of a pool of `workers` threads of the server's own.
    pub pool: Option<Arc<IoPool>>,
}

impl Default for TcpServerConfig {
    fn default() -> Self {
        TcpServerConfig {
            max_connections: 1024,
            listen_backlog: 1024,
            max_record: MAX_RECORD,
            max_fragments: DEFAULT_MAX_FRAGMENTS,
            max_calls_in_flight: 8,
            reply_backlog: 8 << 20,
            memory_budget: 512 << 20,
            read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            write_timeout: Duration::from_secs(30),
            workers: std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8)),
            pool: None,
        }
    }
}

/// A running TCP RPC server.
pub struct TcpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    reactor: Option<JoinHandle<()>>,
}

impl TcpServer {
    /// Listen on `addr` (port 0 picks one) and serve `registry` until dropped,
    /// with the default limits.
    pub fn spawn(addr: SocketAddr, registry: Arc<Registry>) -> std::io::Result<TcpServer> {
        Self::spawn_with(addr, registry, TcpServerConfig::default())
    }

    /// Listen on `addr` and serve `registry` with the limits in `cfg`.
    pub fn spawn_with(addr: SocketAddr, registry: Arc<Registry>, cfg: TcpServerConfig) -> std::io::Result<TcpServer> {
        let listener = bind_listener(addr, cfg.listen_backlog)?;
        let addr = listener.local_addr()?;
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let stop = Arc::new(AtomicBool::new(false));
        let budget = Arc::new(Budget {
            used: AtomicUsize::new(0),
            limit: cfg.memory_budget,
            lock: Mutex::new(()),
            freed: Condvar::new(),
        });
        let (done_tx, done_rx) = channel::<Done>();
        let pool = match &cfg.pool {
            Some(p) => p.clone(),
            None => IoPool::new("rpc-tcp-worker", PoolConfig::with_threads(cfg.workers))?,
        };
        let jobs = Jobs {
            pool,
            done: done_tx,
            waker: waker.clone(),
            budget: budget.clone(),
            stop: stop.clone(),
            server: NEXT_SERVER.fetch_add(1, Ordering::Relaxed) << 32,
            group: crate::pool::group_of(&registry),
            registry,
        };
        let mut r = Reactor {
            poll,
            listener,
            cfg,
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            used: budget.clone(),
            starved: BTreeSet::new(),
            attention: BTreeSet::new(),
            jobs: Some(jobs),
            done: done_rx,
            accept: AcceptBackoff::default(),
            refused: 0,
            last_eviction_log: None,
            buf: PageBuf::new(64 << 10, 0),
            stop: stop.clone(),
        };
        r.poll
            .registry()
            .register(&mut r.listener, LISTENER, Interest::READABLE)?;
        let reactor = std::thread::Builder::new()
            .name("rpc-tcp-reactor".into())
            .spawn(move || {
                r.run();
                // Dropping the reactor closes every connection (and drops its
                // reference to the pool: a pool of its own then stops).
                drop(r);
            })?;
        Ok(TcpServer {
            addr,
            stop,
            waker,
            reactor: Some(reactor),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(t) = self.reactor.take() {
            let _ = t.join();
        }
    }
}

fn bind_listener(addr: SocketAddr, backlog: i32) -> std::io::Result<mio::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(backlog.max(1))?;
    s.set_nonblocking(true)?;
    Ok(mio::net::TcpListener::from_std(s.into()))
}

/// Whether an `accept` error means "out of descriptors or memory": retrying
/// at once would spin, so the caller backs off.
pub(crate) fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The accept loop's back-off after resource exhaustion: 10 ms doubling to
/// 500 ms, reset by a successful accept; one log line per episode.
#[derive(Debug, Default)]
struct AcceptBackoff {
    delay: Option<Duration>,
    until: Option<Instant>,
    failures: u64,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_millis(500);

    fn failed(&mut self, now: Instant, e: &std::io::Error, what: &str) {
        let d = match self.delay {
            None => {
                tracing::warn!("{what}: accept failed: {e}; backing off until descriptors are free");
                Self::FIRST
            }
            Some(d) => (d * 2).min(Self::MAX),
        };
        self.failures += 1;
        self.delay = Some(d);
        self.until = Some(now + d);
    }

    fn succeeded(&mut self, what: &str) {
        if self.delay.take().is_some() {
            tracing::info!("{what}: accepting again after {} failed attempts", self.failures);
        }
        self.failures = 0;
        self.until = None;
    }

    /// Time left before the next attempt, if backing off.
    fn wait(&self, now: Instant) -> Option<Duration> {
        self.until.map(|u| u.saturating_duration_since(now))
    }
}

/// A connection must have been idle this long before it is closed to free a
/// descriptor for a new one.
const EVICT_MIN_IDLE: Duration = Duration::from_secs(1);
/// Evictions per round of accepts (the rest wait for the next readiness event).
const MAX_EVICTIONS_PER_ROUND: usize = 16;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// A call for a worker: the connection's token (tokens are never reused, so
/// a result for a closed connection is recognised and dropped) and the record.
struct Job {
    token: usize,
    seq: u64,
    record: Vec<u8>,
}

/// A worker's result: the call's size (to release its charge) and the
/// encoded reply record, if the call is answered.
struct Done {
    token: usize,
    seq: u64,
    call_len: usize,
    reply: Option<Vec<u8>>,
}

/// The global memory budget, shared by the reactor (which charges and
/// releases) and the workers (which start no call while it is exceeded: a
/// call's reply size is unknown until it is built).
struct Budget {
    used: AtomicUsize,
    limit: usize,
    lock: Mutex<()>,
    freed: Condvar,
}

impl Budget {
    fn charge(&self, n: usize) {
        self.used.fetch_add(n, Ordering::AcqRel);
    }

    fn release(&self, n: usize) {
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        if before > self.limit && before - n <= self.limit {
            let _g = self.lock.lock().unwrap();
            self.freed.notify_all();
        }
    }

    fn over(&self) -> bool {
        self.used.load(Ordering::Acquire) > self.limit
    }

    /// Blocks while the budget is exceeded (or until `stop`).
    fn wait_until_under(&self, stop: &AtomicBool) {
        let mut g = self.lock.lock().unwrap();
        while self.over() && !stop.load(Ordering::Acquire) {
            g = self.freed.wait_timeout(g, Duration::from_millis(200)).unwrap().0;
        }
    }
}

/// Distinguishes the connections of the servers that share one pool.
static NEXT_SERVER: AtomicU64 = AtomicU64::new(1);

/// What the reactor needs to hand a call to the I/O pool and hear back.
struct Jobs {
    pool: Arc<IoPool>,
    done: Sender<Done>,
    registry: Arc<Registry>,
    waker: Arc<Waker>,
    budget: Arc<Budget>,
    stop: Arc<AtomicBool>,
    /// This server's client keys (the connection's token in the low half).
    server: u64,
    /// This server's group in the pool: its registry (an NFS export: one file system).
    group: u64,
}

impl Jobs {
    /// Run `job` on the pool, fairly among connections; the reply comes back through
    /// `done` and a wake-up of the reactor.
    fn submit(&self, job: Job) {
        let (done, reg, waker) = (self.done.clone(), self.registry.clone(), self.waker.clone());
        let (budget, stop) = (self.budget.clone(), self.stop.clone());
        let client = self.server | job.token as u64;
        self.pool.submit(
            client,
            self.group,
            Box::new(move || {
                // Replies not yet written count: build no new one while they exceed the budget.
                budget.wait_until_under(&stop);
                let (token, seq, call_len) = (job.token, job.seq, job.record.len());
                let reply = match dispatch(&reg, &mut Decoder::new(&job.record), "tcp") {
                    Dispatch::Reply { stream, .. } => {
                        let mut out = Vec::new();
                        encode_record(&stream, MAX_FRAGMENT, &mut out).ok().map(|()| out)
                    }
                    Dispatch::ChunkError { .. } | Dispatch::Drop => None,
                };
                drop(job);
                if done
                    .send(Done {
                        token,
                        seq,
                        call_len,
                        reply,
                    })
                    .is_ok()
                {
                    let _ = waker.wake();
                }
            }),
        );
    }
}

/// One connection's state in the reactor.
struct Conn {
    sock: mio::net::TcpStream,
    peer: SocketAddr,
    reader: RecordReader,
    /// Octets charged to the budget for the partial record.
    partial: usize,
    /// Calls handed to workers.
    in_flight: usize,
    /// Complete calls waiting for an in-flight slot or for the memory budget.
    parked: VecDeque<Vec<u8>>,
    /// One slot per call handed to a worker, in arrival order: replies are
    /// written in the order the calls came (`None`: not answered yet or not
    /// answered at all). The first one is written from `out_pos`.
    out: VecDeque<(u64, Option<Vec<u8>>)>,
    /// Sequence number of the next call handed to a worker.
    next_seq: u64,
    out_pos: usize,
    out_bytes: usize,
    /// Last read or write progress (idle timeout).
    last_activity: Instant,
    /// Last byte of the partial record (read timeout).
    record_progress: Instant,
    /// Last write progress while replies wait (write timeout).
    write_progress: Instant,
    /// The peer shut its side: close once the replies are out.
    read_closed: bool,
}

impl Conn {
    /// Reading more would exceed this connection's budgets.
    fn read_blocked(&self, cfg: &TcpServerConfig) -> bool {
        self.read_closed
            || !self.parked.is_empty()
            || self.in_flight >= cfg.max_calls_in_flight
            || self.out_bytes >= cfg.reply_backlog
    }

    fn is_idle(&self) -> bool {
        self.reader.is_idle() && self.in_flight == 0 && self.parked.is_empty() && self.out_bytes == 0
    }
}

struct Reactor {
    poll: Poll,
    listener: mio::net::TcpListener,
    cfg: TcpServerConfig,
    conns: HashMap<usize, Conn>,
    next_token: usize,
    /// Octets charged to the global budget.
    used: Arc<Budget>,
    /// Connections with calls parked for lack of global budget.
    starved: BTreeSet<usize>,
    /// Connections to give another chance to make progress this round.
    attention: BTreeSet<usize>,
    jobs: Option<Jobs>,
    done: Receiver<Done>,
    accept: AcceptBackoff,
    /// Connections refused at the cap in the current episode.
    refused: u64,
    /// When an eviction was last logged at warn level (once per 10 s).
    last_eviction_log: Option<Instant>,
    buf: PageBuf,
    stop: Arc<AtomicBool>,
}

/// Why a connection is closed (the log line's words).
enum Close {
    Quiet,
    /// Routine (idle timeout): logged at debug level.
    Routine(String),
    Why(String),
}

impl Reactor {
    fn tick(&self) -> Duration {
        let shortest = self
            .cfg
            .read_timeout
            .min(self.cfg.idle_timeout)
            .min(self.cfg.write_timeout);
        (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    fn run(&mut self) {
        let mut events = Events::with_capacity(1024);
        let tick = self.tick();
        let mut next_sweep = Instant::now() + tick;
        loop {
            let now = Instant::now();
            let mut timeout = next_sweep.saturating_duration_since(now);
            if let Some(w) = self.accept.wait(now) {
                timeout = timeout.min(w);
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!("rpc tcp: epoll failed: {e}; server stops");
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let mut accept = false;
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => accept = true,
                    WAKER => {}
                    Token(t) => {
                        self.attention.insert(t);
                    }
                }
            }
            let now = Instant::now();
            if self.accept.wait(now) == Some(Duration::ZERO) {
                accept = true;
            }
            if accept && self.accept.wait(now).is_none_or(|w| w.is_zero()) {
                self.accept_all(now);
            }
            self.collect_done();
            self.serve_attention();
            let now = Instant::now();
            if now >= next_sweep {
                self.sweep(now);
                next_sweep = now + tick;
            }
        }
    }

    fn accept_all(&mut self, now: Instant) {
        let mut evicted = 0;
        loop {
            match self.listener.accept() {
                Ok((sock, peer)) => {
                    self.accept.succeeded("rpc tcp");
                    if self.conns.len() >= self.cfg.max_connections {
                        if self.refused == 0 {
                            tracing::warn!(
                                "rpc tcp: refusing {peer}: {} connections open (the cap); closing new connections at once",
                                self.conns.len()
                            );
                        } else {
                            tracing::debug!("rpc tcp: refusing {peer}: at the connection cap");
                        }
                        self.refused += 1;
                        let _ = sock.shutdown(Shutdown::Both);
                        continue;
                    }
                    self.add_conn(sock, peer, now);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.accept.until = None;
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if is_resource_exhaustion(&e) => {
                    // Out of descriptors: a connection that has been idle for a while gives
                    // its descriptor to the one waiting (as web servers close keep-alive
                    // connections), so peers that only hold connections open cannot keep
                    // a client out until the idle timeout. Failing that, back off.
                    if evicted < MAX_EVICTIONS_PER_ROUND && self.evict_longest_idle(now) {
                        evicted += 1;
                        continue;
                    }
                    self.accept.failed(now, &e, "rpc tcp");
                    return;
                }
                // ECONNABORTED and the like: that connection is gone, the next may not be.
                Err(e) => tracing::debug!("rpc tcp: accept: {e}"),
            }
        }
    }

    fn add_conn(&mut self, mut sock: mio::net::TcpStream, peer: SocketAddr, now: Instant) {
        let _ = sock.set_nodelay(true);
        let token = self.next_token;
        self.next_token += 1;
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut sock, Token(token), Interest::READABLE | Interest::WRITABLE)
        {
            tracing::warn!("rpc tcp: cannot watch {peer}: {e}; closing it");
            return;
        }
        let reader = RecordReader::new(self.cfg.max_record).max_fragments(self.cfg.max_fragments);
        self.conns.insert(
            token,
            Conn {
                sock,
                peer,
                reader,
                partial: 0,
                in_flight: 0,
                parked: VecDeque::new(),
                out: VecDeque::new(),
                next_seq: 0,
                out_pos: 0,
                out_bytes: 0,
                last_activity: now,
                record_progress: now,
                write_progress: now,
                read_closed: false,
            },
        );
        // Data may already be there (edge-triggered: no event for it otherwise).
        self.attention.insert(token);
    }

    fn collect_done(&mut self) {
        while let Ok(d) = self.done.try_recv() {
            self.used.release(d.call_len);
            self.wake_starved();
            let Some(c) = self.conns.get_mut(&d.token) else {
                continue;
            };
            c.in_flight -= 1;
            let first = c.out.front().map_or(d.seq, |s| s.0);
            let slot = &mut c.out[(d.seq - first) as usize];
            match d.reply {
                Some(r) => {
                    if c.out_bytes == 0 {
                        c.write_progress = Instant::now();
                    }
                    self.used.charge(r.len());
                    c.out_bytes += r.len();
                    slot.1 = Some(r);
                }
                // Not answered: an empty reply keeps the order.
                None => slot.1 = Some(Vec::new()),
            }
            self.attention.insert(d.token);
        }
    }

    fn wake_starved(&mut self) {
        if !self.used.over() {
            self.attention.append(&mut self.starved);
        }
    }

    fn serve_attention(&mut self) {
        while let Some(t) = self.attention.pop_first() {
            if let Err(why) = self.progress(t) {
                self.close(t, why);
            }
        }
    }

    /// Write what can be written, hand parked calls to workers, read what
    /// the budgets allow; repeat until nothing moves.
    fn progress(&mut self, t: usize) -> Result<(), Close> {
        loop {
            let mut moved = self.write(t)?;
            moved |= self.dispatch_parked(t);
            moved |= self.read(t)?;
            let Some(c) = self.conns.get(&t) else { return Ok(()) };
            if c.read_closed && c.is_idle() {
                return Err(Close::Quiet);
            }
            if !moved {
                return Ok(());
            }
        }
    }

    fn write(&mut self, t: usize) -> Result<bool, Close> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(false);
        };
        let mut moved = false;
        while let Some((_, Some(front))) = c.out.front() {
            if front.is_empty() {
                c.out.pop_front();
                continue;
            }
            match c.sock.write(&front[c.out_pos..]) {
                Ok(0) => return Err(Close::Why("peer stopped taking replies".into())),
                Ok(n) => {
                    moved = true;
                    let now = Instant::now();
                    c.write_progress = now;
                    c.last_activity = now;
                    c.out_pos += n;
                    if c.out_pos == front.len() {
                        let len = front.len();
                        c.out.pop_front();
                        c.out_pos = 0;
                        c.out_bytes -= len;
                        self.used.release(len);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Close::Why(format!("writing a reply failed: {e}"))),
            }
        }
        if moved {
            self.wake_starved();
        }
        Ok(moved)
    }

    fn dispatch_parked(&mut self, t: usize) -> bool {
        let Some(c) = self.conns.get_mut(&t) else { return false };
        let mut moved = false;
        while c.in_flight < self.cfg.max_calls_in_flight && c.out_bytes < self.cfg.reply_backlog && !c.parked.is_empty()
        {
            if self.used.over() {
                self.starved.insert(t);
                break;
            }
            let record = c.parked.pop_front().unwrap();
            c.in_flight += 1;
            let seq = c.next_seq;
            c.next_seq += 1;
            c.out.push_back((seq, None));
            moved = true;
            // Its octets stay charged until the worker is done with it.
            if let Some(j) = &self.jobs {
                j.submit(Job { token: t, seq, record });
            }
        }
        moved
    }

    fn read(&mut self, t: usize) -> Result<bool, Close> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(false);
        };
        let mut moved = false;
        while !c.read_blocked(&self.cfg) {
            if self.used.over() {
                // Replies hold the budget: read on once they are written.
                self.starved.insert(t);
                break;
            }
            let n = match c.sock.read(self.buf.bytes_mut()) {
                Ok(0) => {
                    if !c.reader.is_idle() {
                        return Err(Close::Why("peer closed in the middle of a record".into()));
                    }
                    c.read_closed = true;
                    return Ok(true);
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(Close::Why("peer reset the connection".into()));
                }
                Err(e) => return Err(Close::Why(format!("read failed: {e}"))),
            };
            moved = true;
            let now = Instant::now();
            c.last_activity = now;
            c.record_progress = now;
            let mut input = &self.buf.bytes()[..n];
            while !input.is_empty() {
                let (used, rec) = c
                    .reader
                    .decode(input)
                    .map_err(|e| Close::Why(format!("record stream broken: {e}")))?;
                input = &input[used..];
                // Re-charge the partial record: its buffer grew or was handed over.
                let now_partial = c.reader.buffered();
                self.used.release(c.partial);
                self.used.charge(now_partial);
                c.partial = now_partial;
                if let Some(rec) = rec {
                    self.used.charge(rec.len());
                    c.parked.push_back(rec);
                }
                // The total was under the budget before this read: this record took it over.
                if self.used.over() && c.partial > 0 {
                    return Err(Close::Why(format!(
                        "its partial record ({} octets) would take the server over its memory budget of {} octets",
                        c.partial, self.cfg.memory_budget
                    )));
                }
            }
            if !c.parked.is_empty() {
                // Hand the calls over before reading more.
                return Ok(true);
            }
        }
        Ok(moved)
    }

    /// Closes the connection idle the longest (nothing in progress for at least
    /// [`EVICT_MIN_IDLE`]) to free its descriptor; false when there is none.
    fn evict_longest_idle(&mut self, now: Instant) -> bool {
        let victim = self
            .conns
            .iter()
            .filter(|(_, c)| c.is_idle() && now - c.last_activity >= EVICT_MIN_IDLE)
            .min_by_key(|(_, c)| c.last_activity)
            .map(|(t, c)| (*t, c.peer, now - c.last_activity));
        let Some((t, peer, idle)) = victim else { return false };
        let why = format!("out of file descriptors: closing it, idle for {idle:.1?}, to accept a new connection");
        if self
            .last_eviction_log
            .is_none_or(|l| now - l >= Duration::from_secs(10))
        {
            self.last_eviction_log = Some(now);
            tracing::warn!("rpc tcp: {peer}: {why} (further evictions within 10 s are logged at debug)");
            self.close(t, Close::Quiet);
        } else {
            self.close(t, Close::Routine(why));
        }
        true
    }

    fn close(&mut self, t: usize, why: Close) {
        let Some(mut c) = self.conns.remove(&t) else { return };
        match why {
            Close::Quiet => {}
            Close::Routine(w) => tracing::debug!("rpc tcp: closing the connection from {}: {w}", c.peer),
            Close::Why(w) => tracing::info!("rpc tcp: closing the connection from {}: {w}", c.peer),
        }
        let _ = self.poll.registry().deregister(&mut c.sock);
        let _ = c.sock.shutdown(Shutdown::Both);
        // Calls in flight release their charge when their worker is done.
        let held = c.partial + c.parked.iter().map(Vec::len).sum::<usize>() + c.out_bytes;
        self.used.release(held);
        self.starved.remove(&t);
        self.attention.remove(&t);
        if self.refused > 0 && self.conns.len() < self.cfg.max_connections {
            tracing::info!(
                "rpc tcp: below the connection cap again after refusing {}",
                self.refused
            );
            self.refused = 0;
        }
        self.wake_starved();
    }

    /// Expires the timeouts.
    fn sweep(&mut self, now: Instant) {
        let cfg = &self.cfg;
        let expired: Vec<(usize, Close)> = self
            .conns
            .iter()
            .filter_map(|(t, c)| {
                let why = if c.out_bytes > 0 && now - c.write_progress >= cfg.write_timeout {
                    Close::Why(format!(
                        "the peer has not read its replies ({} octets waiting) for {:?} (write timeout)",
                        c.out_bytes, cfg.write_timeout
                    ))
                } else if !c.reader.is_idle() && now - c.record_progress >= cfg.read_timeout {
                    Close::Why(format!(
                        "a record stopped arriving for {:?} (read timeout)",
                        cfg.read_timeout
                    ))
                } else if c.is_idle() && now - c.last_activity >= cfg.idle_timeout {
                    Close::Routine(format!("idle for {:?}", cfg.idle_timeout))
                } else {
                    return None;
                };
                Some((*t, why))
            })
            .collect();
        for (t, why) in expired {
            self.close(t, why);
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
    /// Connect to `addr` (the system's connect timeout applies).
    pub fn connect(addr: SocketAddr) -> std::io::Result<TcpClient> {
        TcpClient::from_stream(TcpStream::connect(addr)?)
    }

    /// Connect to `addr`, giving up after `timeout` (`ErrorKind::TimedOut`); later calls
    /// wait [`TcpClient::set_timeout`] (30 s) each.
    pub fn connect_timeout(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpClient> {
        TcpClient::from_stream(TcpStream::connect_timeout(&addr, timeout)?)
    }

    fn from_stream(s: TcpStream) -> std::io::Result<TcpClient> {
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
        let (xid, rec) = encode_call_record(&self.xids, call)?;
        let (tx, rx) = sync_channel(1);
        if self.shared.dead.load(Ordering::Acquire) {
            return Err(Disconnect::Closed.into());
        }
        self.shared.pending.lock().unwrap().insert(xid, tx);
        // the reader may have failed everything just before the insert
        if self.shared.dead.load(Ordering::Acquire) {
            self.shared.pending.lock().unwrap().remove(&xid);
            return Err(Disconnect::Closed.into());
        }
        let sent = self.writer.lock().unwrap().write_all(&rec);
        if let Err(e) = sent {
            self.shared.pending.lock().unwrap().remove(&xid);
            return Err(Disconnect::from(e).into());
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

/// The record-marked bytes of `call` under the next XID of `xids`, and that XID: the
/// prelude of every ONC RPC over TCP call ([`TcpClient::call`], `TcpCaller::call`).
fn encode_call_record(xids: &XidSource, call: &Call<'_>) -> Result<(u32, Vec<u8>), RpcError> {
    let xid = xids.next();
    let (msg, _) = call.encode(xid).map_err(LocalError::Encode)?;
    let mut rec = Vec::with_capacity(msg.len() + 8);
    encode_record(&msg, MAX_FRAGMENT, &mut rec).map_err(LocalError::Record)?;
    Ok((xid, rec))
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
    let mut buf = PageBuf::new(256 << 10, 0);
    let why = 'outer: loop {
        let n = match s.read(buf.bytes_mut()) {
            Ok(0) => break Disconnect::ClosedByPeer,
            Err(e) => break Disconnect::from(e),
            Ok(n) => n,
        };
        let mut input = &buf.bytes()[..n];
        while !input.is_empty() {
            let (used, rec) = match reader.decode(input) {
                Ok(r) => r,
                Err(e) => break 'outer Disconnect::Record(e),
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

impl crate::client::RpcClient for TcpClient {
    fn call<T>(
        &self,
        call: &Call<'_>,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, RpcError> {
        TcpClient::call(self, call, decode)
    }
}
