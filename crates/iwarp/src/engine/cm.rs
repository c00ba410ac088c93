//! Connection setup: TCP connect/accept and the MPA exchange (RFC 5044 §7,
//! RFC 6581), driving the sans-I/O negotiation in [`crate::proto::mpa`] over a
//! blocking socket with the negotiation's own timeouts. Once MPA is done the
//! socket is handed to [`super::qp::IwarpQp`] (non-blocking, on the progress
//! thread's epoll set).
//!
//! # Listener resource model
//!
//! Each listener has one thread that sleeps in `epoll_wait` (mio) on the
//! listening socket and on every accepted socket whose MPA Request has not
//! yet arrived; it drives the sans-I/O negotiation of all of them, so a slow
//! or silent peer (MPA Request timeout, [`IwarpConfig::request_timeout`],
//! 10 s as in siw) never holds up other connections, and a burst of connects
//! costs no thread each. Bounds, in [`ListenerLimits`]:
//!
//! * the `listen(2)` backlog (default 1024, so a burst of hundreds of
//!   connects is not dropped at SYN time and retried a second later);
//! * at most [`ListenerLimits::max_handshakes`] connections in negotiation at
//!   once; more are accepted and closed at once, with one warning log line
//!   per episode;
//! * at most 4 KiB buffered per connection in negotiation (an MPA frame is at
//!   most 532 octets; what follows it stays in the kernel until the
//!   application accepts);
//! * when `accept` fails for lack of descriptors or memory (EMFILE, ENFILE,
//!   ENOBUFS, ENOMEM) the listener first closes the negotiation that has waited
//!   longest (a second or more) for its MPA Request, so silent peers cannot keep
//!   a client out; failing that it backs off (10 ms doubling to 500 ms) instead
//!   of spinning, logs once per episode, and resumes when a descriptor is free.
//!
//! A Request that completed waits in the listener's request queue until the
//! application accepts or rejects it; the Reply is sent from the application's
//! thread.

use super::IwarpConfig;
use super::driver::Driver;
use super::qp::handle::QpHandle;
use super::qp::{IwarpQp, Negotiated, RtrRole};
use crate::proto::mpa::{Event, IrdOrd, Mpa, MpaConfig, MpaError};
use crate::wire::mpa::RtrSet;
use crate::wire::terminate;
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use verbs::cm::RouteOptions;
use verbs::cm::backend::{CmBackend, ConnRequestOps, ListenerOps};
use verbs::notify::EventQueue;
use verbs::provider::{Provider, QpCreate, QpOps};
use verbs::{ConnInfo, ConnParam, DeviceAttr, Error, ErrorDetail, InvalidArg, QpType, Result};

/// The iWARP provider behind a `verbs::Device`.
pub struct IwarpProvider {
    cfg: IwarpConfig,
    driver: Arc<Driver>,
    next_qpn: AtomicU32,
}

impl IwarpProvider {
    /// A provider with `cfg`, and its progress thread (the device's epoll loop).
    pub fn new(cfg: IwarpConfig) -> std::io::Result<Self> {
        let driver = Driver::start(&cfg.name, cfg.responder_spin)?;
        Ok(IwarpProvider {
            cfg,
            driver,
            next_qpn: AtomicU32::new(1),
        })
    }

    fn mpa_config(&self) -> MpaConfig {
        let mut m = MpaConfig {
            revision: self.cfg.mpa_revision,
            enhanced: self.cfg.mpa_revision >= 2,
            crc: self.cfg.crc,
            reject_markers: self.cfg.reject_markers,
            max_private_data_rx: self.cfg.max_private_data,
            max_private_data_tx: self.cfg.max_private_data_tx,
            reply_timeout: self.cfg.reply_timeout,
            request_timeout: self.cfg.request_timeout,
            ..MpaConfig::default()
        };
        if let Some(rtrs) = &self.cfg.p2p {
            m.p2p = true;
            m.rtr_offer = rtrs.iter().fold(RtrSet::EMPTY, |s, r| s.union(RtrSet::of(*r)));
        }
        m
    }

    fn qpn(&self) -> u32 {
        self.next_qpn.fetch_add(1, Ordering::Relaxed)
    }
}

fn ird_ord(p: &ConnParam) -> IrdOrd {
    let a = super::device_attr();
    IrdOrd {
        ird: (p.responder_resources as u32).min(a.max_qp_rd_atom) as u16,
        ord: (p.initiator_depth as u32).min(a.max_qp_init_rd_atom) as u16,
    }
}

fn mpa_err(e: MpaError) -> Error {
    match e {
        MpaError::TimedOut(_) => Error::Timeout,
        // Our own parameters (e.g. private data over max_private_data_tx): nothing was sent.
        MpaError::InvalidParam(rule) => InvalidArg::ConnParam(rule).into(),
        MpaError::PrivateDataTooLong { len, max } => InvalidArg::PrivateDataTooLong { len, max }.into(),
        other => Error::Protocol(format!("MPA: {other} ({})", other.cause())),
    }
}

/// Runs the negotiation over a blocking socket until it reports an event.
/// Returns the event and the bytes read beyond the MPA frame.
fn drive(mpa: &mut Mpa, sock: &mut TcpStream, pending: &mut Vec<u8>) -> Result<Event> {
    let mut out = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        out.clear();
        while mpa.poll_transmit(&mut out).is_some() {}
        if !out.is_empty() {
            sock.write_all(&out)?;
        }
        if let Some(ev) = mpa.poll_event() {
            return Ok(ev);
        }
        if let Some(e) = mpa.error() {
            let e = e.clone();
            send_terminate(mpa, sock);
            return Err(mpa_err(e));
        }
        // Feed what we already have before reading more.
        if !pending.is_empty() {
            let used = mpa.handle_bytes(Instant::now(), pending).map_err(|e| {
                send_terminate(mpa, sock);
                mpa_err(e)
            })?;
            pending.drain(..used);
            if used > 0 {
                continue;
            }
        }
        let now = Instant::now();
        let wait = mpa.poll_timeout().map(|t| t.saturating_duration_since(now));
        if wait == Some(Duration::ZERO) {
            mpa.handle_timeout(now).map_err(mpa_err)?;
            continue;
        }
        sock.set_read_timeout(wait.map(|w| w.max(Duration::from_millis(1))))?;
        match sock.read(&mut buf) {
            Ok(0) => {
                return Err(Error::Protocol(
                    "peer closed the connection during MPA negotiation".into(),
                ));
            }
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                mpa.handle_timeout(Instant::now()).map_err(mpa_err)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// After a negotiation failure: first any frame the negotiation queued (a
/// Responder's Reply with R=1 to a peer requiring markers or lacking IRD,
/// RFC 5044 §7.1.2, RFC 6581 §9.1), then, in Full Operation (e.g.
/// insufficient IRD, RFC 6581 §8), a Terminate with the LLP code.
fn send_terminate(mpa: &mut Mpa, sock: &mut TcpStream) {
    let mut queued = Vec::new();
    while mpa.poll_transmit(&mut queued).is_some() {}
    if !queued.is_empty() {
        let _ = sock.write_all(&queued);
    }
    if let Some((cause, framing)) = mpa.terminate_to_send() {
        let repr = terminate::Repr::for_error(cause, None, None);
        let len = repr.ulpdu_len();
        let mut framer = framing.framer();
        if let Ok(w) = framer.wire_len(len) {
            let mut out = vec![0u8; w];
            if framer
                .emit(len, &mut out, |u| {
                    let _ = repr.emit_ulpdu(u, 1);
                })
                .is_ok()
            {
                let _ = sock.write_all(&out);
            }
        }
        let _ = sock.shutdown(std::net::Shutdown::Write);
    }
}

/// The connection's outcome; `local`/`peer` are the addresses known from connect or accept
/// (`getpeername` fails once the peer has reset the connection, which may already have
/// happened here, and the QP's diagnostics name the peer: issue 12).
fn to_negotiated(n: &crate::proto::mpa::Negotiated, local: SocketAddr, peer: SocketAddr) -> Negotiated {
    let rtr = n
        .rtr_to_send()
        .map(RtrRole::Send)
        .or(n.rtr_to_receive().map(RtrRole::Expect));
    Negotiated {
        crc: n.framing.crc,
        markers_tx: n.framing.markers_tx,
        markers_rx: n.framing.markers_rx,
        ird: n.ird as u32,
        ord: n.ord as u32,
        rtr,
        info: ConnInfo {
            local_addr: local,
            peer_addr: peer,
            responder_resources: n.ird as u32,
            initiator_depth: n.ord as u32,
            peer_private_data: n.private_data.clone(),
            detail: n.to_string(),
        },
    }
}

impl Provider for IwarpProvider {
    fn query_device(&self) -> DeviceAttr {
        super::device_attr()
    }

    /// An RC QP in RESET; iWARP has no other service (RFC 5040 runs over
    /// one reliable stream per QP), and no shared receive queues here.
    fn create_qp(&self, req: QpCreate) -> Result<Arc<dyn QpOps>> {
        if req.qp_type != QpType::Rc {
            return Err(Error::NotSupported(format!(
                "iWARP offers RC queue pairs only, not {:?}",
                req.qp_type
            )));
        }
        if req.srq.is_some() {
            return Err(Error::NotSupported("iWARP: shared receive queues".into()));
        }
        Ok(Arc::new(QpHandle::new(self.qpn(), req)))
    }
}

/// Starts the data path of `qp` on a negotiated stream (the QP goes to RTS).
fn bind(
    qp: &QpHandle,
    sock: TcpStream,
    pending: Vec<u8>,
    neg: Negotiated,
    driver: &Arc<Driver>,
    cfg: &IwarpConfig,
) -> Result<ConnInfo> {
    let info = neg.info.clone();
    qp.bind(|setup, qpn, recvs| {
        IwarpQp::start(
            sock,
            pending,
            driver.clone(),
            setup,
            recvs,
            qpn,
            neg,
            cfg.terminate_siw_form,
            cfg.max_ulpdu,
        )
    })?;
    Ok(info)
}

impl CmBackend for IwarpProvider {
    fn listen(
        &self,
        addr: SocketAddr,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>> {
        let listener = bind_listener(addr, self.cfg.listener.listen_backlog)?;
        let local = listener.local_addr()?;
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Arc::new(ListenCtx {
            mpa: self.mpa_config(),
            driver: self.driver.clone(),
            cfg: self.cfg.clone(),
        });
        let mut l = ListenLoop {
            poll,
            listener,
            local,
            max: self.cfg.listener.max_handshakes.max(1),
            ctx,
            requests: requests.clone(),
            stop: stop.clone(),
            hs: HashMap::new(),
            next: FIRST_HANDSHAKE,
            backoff: AcceptBackoff::default(),
            refused: 0,
        };
        l.poll
            .registry()
            .register(&mut l.listener, LISTENER, Interest::READABLE)?;
        let thread = std::thread::Builder::new()
            .name(format!("iwarp-listen-{}", local.port()))
            .spawn(move || {
                l.run();
                l.requests.close();
            })?;
        Ok(Box::new(IwarpListener {
            local,
            stop,
            waker,
            thread: Some(thread),
        }))
    }

    fn connect(&self, qp: &Arc<dyn QpOps>, addr: SocketAddr, param: &ConnParam, timeout: Duration) -> Result<ConnInfo> {
        self.connect_routed(qp, addr, &RouteOptions::default(), param, timeout)
    }

    fn connect_routed(
        &self,
        qp: &Arc<dyn QpOps>,
        addr: SocketAddr,
        route: &RouteOptions,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<ConnInfo> {
        let handle = QpHandle::of(qp)?;
        handle.check_bindable()?;
        let local = ird_ord(param);
        // Refuse what MPA would refuse (private data too long, bad parameters) before the
        // TCP connect: a connection closed right after it opens is what breaks a Linux 6.1
        // siw listener (lab hazard 1).
        Mpa::initiator(Instant::now(), self.mpa_config(), local, &param.private_data).map_err(mpa_err)?;
        let mut sock = dial(addr, route, timeout)?;
        let mut mpa = Mpa::initiator(Instant::now(), self.mpa_config(), local, &param.private_data).map_err(mpa_err)?;
        let mut pending = Vec::new();
        match drive(&mut mpa, &mut sock, &mut pending)? {
            Event::Negotiated(n) => {
                let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
                let neg = to_negotiated(
                    &n,
                    sock.local_addr().unwrap_or(unspecified),
                    sock.peer_addr().unwrap_or(addr),
                );
                tracing::debug!("connected to {addr}: {}", neg.info.detail);
                bind(handle, sock, pending, neg, &self.driver, &self.cfg)
            }
            Event::Rejected(r) => Err(Error::Rejected {
                private_data: r.private_data,
                detail: Some(ErrorDetail::new(crate::detail::MpaReject {
                    ird_ord: r.enhanced.map(|e| (e.ird, e.ord)),
                })),
            }),
            Event::ConnectRequest(_) => Err(Error::Protocol("unexpected MPA event".into())),
        }
    }

    fn disconnect(&self, qp: &Arc<dyn QpOps>) {
        if let Ok(h) = QpHandle::of(qp)
            && let Some(c) = h.connected()
        {
            c.disconnect();
        }
    }
}

struct ListenCtx {
    mpa: MpaConfig,
    driver: Arc<Driver>,
    cfg: IwarpConfig,
}

/// The limits of a listener (see the module's resource model).
#[derive(Debug, Clone)]
pub struct ListenerLimits {
    /// `listen(2)` backlog (the kernel caps it at `net.core.somaxconn`).
    pub listen_backlog: i32,
    /// Connections in MPA negotiation at once; more are closed at once.
    pub max_handshakes: usize,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            listen_backlog: 1024,
            max_handshakes: 1024,
        }
    }
}

/// The TCP connection of an active open: from `route.src_addr` if given (any
/// port), with `route.tos` as IPv4 TOS / IPv6 traffic class, Nagle off.
fn dial(addr: SocketAddr, route: &RouteOptions, timeout: Duration) -> Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if let Some(src) = route.src_addr {
        if src.is_ipv4() != addr.is_ipv4() {
            return Err(Error::InvalidArgument(InvalidArg::SourceFamily { src, dst: addr }));
        }
        s.bind(&SocketAddr::new(src, 0).into()).map_err(|e| {
            Error::InvalidArgument(InvalidArg::SourceAddress {
                src,
                reason: e.to_string(),
            })
        })?;
    }
    if let Some(tos) = route.tos {
        match addr {
            SocketAddr::V4(_) => s.set_tos_v4(tos.into())?,
            SocketAddr::V6(_) => s.set_tclass_v6(tos.into())?,
        }
    }
    s.connect_timeout(&addr.into(), timeout).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
        std::io::ErrorKind::TimedOut => Error::Timeout,
        _ => Error::Io(e),
    })?;
    s.set_tcp_nodelay(true)?;
    Ok(s.into())
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
/// at once would spin.
fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The accept loop's back-off after resource exhaustion: 10 ms doubling to
/// 500 ms (as Go's and tokio's accept loops), reset by a successful accept;
/// one log line per episode.
#[derive(Debug, Default)]
struct AcceptBackoff {
    delay: Option<Duration>,
    until: Option<Instant>,
    failures: u64,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_millis(500);

    fn failed(&mut self, now: Instant, e: &std::io::Error, local: SocketAddr) {
        let d = match self.delay {
            None => {
                tracing::warn!("iWARP listener {local}: accept failed: {e}; backing off until descriptors are free");
                Self::FIRST
            }
            Some(d) => (d * 2).min(Self::MAX),
        };
        self.failures += 1;
        self.delay = Some(d);
        self.until = Some(now + d);
    }

    fn succeeded(&mut self, local: SocketAddr) {
        if self.delay.take().is_some() {
            tracing::info!(
                "iWARP listener {local}: accepting again after {} failed attempts",
                self.failures
            );
        }
        self.failures = 0;
        self.until = None;
    }
}

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_HANDSHAKE: usize = 2;
/// Most octets read ahead from a connection in negotiation.
const HANDSHAKE_READ: usize = 4096;

/// One accepted connection whose MPA Request is not complete yet.
struct Handshake {
    sock: mio::net::TcpStream,
    mpa: Mpa,
    pending: Vec<u8>,
    peer: SocketAddr,
    /// When it was accepted (the oldest gives way when descriptors run out).
    since: Instant,
}

/// A negotiation must have been waiting this long for its MPA Request before it
/// is closed to free a descriptor for a new connection.
const EVICT_MIN_AGE: Duration = Duration::from_secs(1);
/// Evictions per round of accepts.
const MAX_EVICTIONS_PER_ROUND: usize = 16;

/// The listener's thread: accepts, and runs every negotiation up to the
/// complete Request (or its failure or timeout).
struct ListenLoop {
    poll: Poll,
    listener: mio::net::TcpListener,
    local: SocketAddr,
    max: usize,
    ctx: Arc<ListenCtx>,
    requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    stop: Arc<AtomicBool>,
    hs: HashMap<usize, Handshake>,
    next: usize,
    backoff: AcceptBackoff,
    /// Connections refused at the handshake cap in this episode.
    refused: u64,
}

/// How a negotiation step ended.
enum Step {
    /// Waiting for more bytes.
    More,
    /// The Request is complete: hand it to the application.
    Request(crate::proto::mpa::ConnectRequest),
    /// The negotiation failed (already logged and answered); close.
    Failed,
}

impl ListenLoop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let now = Instant::now();
            let mut timeout = self
                .hs
                .values()
                .filter_map(|h| h.mpa.poll_timeout())
                .min()
                .map(|t| t.saturating_duration_since(now));
            if let Some(u) = self.backoff.until {
                let w = u.saturating_duration_since(now);
                timeout = Some(timeout.map_or(w, |t| t.min(w)));
            }
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!("iWARP listener {}: epoll failed: {e}; listener stops", self.local);
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let mut accept = false;
            let mut ready = Vec::new();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => accept = true,
                    WAKER => {}
                    Token(t) => ready.push(t),
                }
            }
            for t in ready {
                self.step(t);
            }
            let now = Instant::now();
            match self.backoff.until {
                Some(u) if u <= now => self.accept_all(now),
                None if accept => self.accept_all(now),
                _ => {}
            }
            self.expire(Instant::now());
        }
    }

    fn accept_all(&mut self, now: Instant) {
        let mut evicted = 0;
        loop {
            match self.listener.accept() {
                Ok((sock, peer)) => {
                    self.backoff.succeeded(self.local);
                    if self.hs.len() >= self.max {
                        if self.refused == 0 {
                            tracing::warn!(
                                "iWARP listener {}: refusing {peer}: {} connections in MPA negotiation (the cap); closing new connections at once",
                                self.local,
                                self.hs.len()
                            );
                        }
                        self.refused += 1;
                        let _ = sock.shutdown(std::net::Shutdown::Both);
                        continue;
                    }
                    self.add(sock, peer);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.backoff.until = None;
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if is_resource_exhaustion(&e) => {
                    // Out of descriptors: a negotiation that has waited a second or more
                    // for its MPA Request (a peer that connects and stays silent) gives
                    // its descriptor to the connection waiting; failing that, back off.
                    if evicted < MAX_EVICTIONS_PER_ROUND && self.evict_oldest_handshake(now) {
                        evicted += 1;
                        continue;
                    }
                    self.backoff.failed(now, &e, self.local);
                    return;
                }
                Err(e) => tracing::debug!("iWARP listener {}: accept: {e}", self.local),
            }
        }
    }

    /// Closes the negotiation that has waited longest (at least [`EVICT_MIN_AGE`])
    /// for its MPA Request; false when there is none.
    fn evict_oldest_handshake(&mut self, now: Instant) -> bool {
        let Some((t, peer, age)) = self
            .hs
            .iter()
            .filter(|(_, h)| now.saturating_duration_since(h.since) >= EVICT_MIN_AGE)
            .min_by_key(|(_, h)| h.since)
            .map(|(t, h)| (*t, h.peer, now.saturating_duration_since(h.since)))
        else {
            return false;
        };
        if let Some(mut h) = self.hs.remove(&t) {
            let _ = self.poll.registry().deregister(&mut h.sock);
        }
        tracing::debug!(
            "iWARP listener {}: out of file descriptors: closed {peer}, silent for {age:.1?} in MPA negotiation, to accept a new connection",
            self.local
        );
        true
    }

    fn add(&mut self, mut sock: mio::net::TcpStream, peer: SocketAddr) {
        let _ = sock.set_nodelay(true);
        let Ok(mpa) = Mpa::responder(Instant::now(), self.ctx.mpa.clone()) else {
            return;
        };
        let t = self.next;
        self.next += 1;
        if let Err(e) = self.poll.registry().register(&mut sock, Token(t), Interest::READABLE) {
            tracing::warn!("iWARP listener {}: cannot watch {peer}: {e}; closing it", self.local);
            return;
        }
        self.hs.insert(
            t,
            Handshake {
                sock,
                mpa,
                pending: Vec::new(),
                peer,
                since: Instant::now(),
            },
        );
        // The Request may already be there (edge-triggered).
        self.step(t);
    }

    /// Reads what the peer sent and feeds the negotiation.
    fn step(&mut self, t: usize) {
        let Some(h) = self.hs.get_mut(&t) else { return };
        let mut buf = [0u8; HANDSHAKE_READ];
        let outcome = loop {
            match feed(h) {
                Ok(Step::More) => {}
                Ok(s) => break s,
                Err(e) => {
                    tracing::info!("MPA negotiation with {} failed: {e}", h.peer);
                    break Step::Failed;
                }
            }
            if h.pending.len() >= HANDSHAKE_READ {
                // feed() consumes whole frames; a full buffer it cannot use is not MPA.
                break Step::Failed;
            }
            let room = HANDSHAKE_READ - h.pending.len();
            match h.sock.read(&mut buf[..room]) {
                Ok(0) => {
                    tracing::info!("MPA negotiation with {}: peer closed the connection", h.peer);
                    break Step::Failed;
                }
                Ok(n) => h.pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::info!("MPA negotiation with {}: {e}", h.peer);
                    break Step::Failed;
                }
            }
        };
        self.finish(t, outcome);
    }

    /// Ends a negotiation: hands a complete Request to the application, or
    /// closes the connection after what the negotiation queued (a Reply with
    /// R=1, a Terminate).
    fn finish(&mut self, t: usize, outcome: Step) {
        let Some(mut h) = self.hs.remove(&t) else { return };
        let _ = self.poll.registry().deregister(&mut h.sock);
        if self.refused > 0 && self.hs.len() < self.max {
            tracing::info!(
                "iWARP listener {}: below the handshake cap again after refusing {}",
                self.local,
                self.refused
            );
            self.refused = 0;
        }
        // SAFETY: the descriptor comes from a TcpStream that gives it up here.
        let mut sock = unsafe { TcpStream::from_raw_fd(h.sock.into_raw_fd()) };
        match outcome {
            Step::More => {}
            Step::Failed => {
                send_terminate(&mut h.mpa, &mut sock);
                let _ = sock.shutdown(std::net::Shutdown::Both);
            }
            Step::Request(cr) => {
                if sock.set_nonblocking(false).is_err() {
                    return;
                }
                let param = match cr.enhanced {
                    Some(e) => ConnParam {
                        private_data: cr.private_data.clone(),
                        responder_resources: e.ird.min(255) as u8,
                        initiator_depth: e.ord.min(255) as u8,
                    },
                    None => ConnParam {
                        private_data: cr.private_data.clone(),
                        ..Default::default()
                    },
                };
                let local = sock
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                self.requests.push(Box::new(IncomingRequest {
                    ctx: self.ctx.clone(),
                    sock,
                    mpa: Mutex::new(h.mpa),
                    pending: h.pending,
                    param,
                    local,
                    peer: h.peer,
                }));
            }
        }
    }

    /// Fails the negotiations whose Request did not come in time.
    fn expire(&mut self, now: Instant) {
        let due: Vec<usize> = self
            .hs
            .iter()
            .filter(|(_, h)| h.mpa.poll_timeout().is_some_and(|d| d <= now))
            .map(|(t, _)| *t)
            .collect();
        for t in due {
            let Some(h) = self.hs.get_mut(&t) else { continue };
            if let Err(e) = h.mpa.handle_timeout(now) {
                tracing::info!("MPA negotiation with {} failed: {}", h.peer, mpa_err(e));
                self.finish(t, Step::Failed);
            }
        }
    }
}

/// Feeds buffered bytes to a negotiation; writes what it queues.
fn feed(h: &mut Handshake) -> Result<Step> {
    let mut out = Vec::new();
    loop {
        out.clear();
        while h.mpa.poll_transmit(&mut out).is_some() {}
        if !out.is_empty() {
            // A few hundred octets on a fresh connection: the send buffer takes them.
            h.sock.write_all(&out)?;
        }
        if let Some(ev) = h.mpa.poll_event() {
            return match ev {
                Event::ConnectRequest(cr) => Ok(Step::Request(cr)),
                _ => Ok(Step::Failed),
            };
        }
        if let Some(e) = h.mpa.error() {
            return Err(mpa_err(e.clone()));
        }
        if h.pending.is_empty() {
            return Ok(Step::More);
        }
        let used = h.mpa.handle_bytes(Instant::now(), &h.pending).map_err(mpa_err)?;
        h.pending.drain(..used);
        if used == 0 {
            return Ok(Step::More);
        }
    }
}

struct IncomingRequest {
    ctx: Arc<ListenCtx>,
    sock: TcpStream,
    mpa: Mutex<Mpa>,
    pending: Vec<u8>,
    param: ConnParam,
    local: SocketAddr,
    peer: SocketAddr,
}

impl ConnRequestOps for IncomingRequest {
    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    fn local_addr(&self) -> SocketAddr {
        self.local
    }
    fn private_data(&self) -> &[u8] {
        &self.param.private_data
    }
    fn param(&self) -> ConnParam {
        self.param.clone()
    }
    fn accept(self: Box<Self>, qp: &Arc<dyn QpOps>, param: &ConnParam) -> Result<ConnInfo> {
        let handle = QpHandle::of(qp)?;
        // Refused before the Reply goes out: the peer is not told "accepted" for a QP that cannot run.
        handle.check_bindable()?;
        let IncomingRequest {
            ctx,
            mut sock,
            mpa,
            mut pending,
            local,
            peer,
            ..
        } = *self;
        let mut mpa = mpa.into_inner().unwrap();
        mpa.accept(ird_ord(param), &param.private_data).map_err(mpa_err)?;
        match drive(&mut mpa, &mut sock, &mut pending)? {
            Event::Negotiated(n) => {
                let neg = to_negotiated(&n, local, peer);
                bind(handle, sock, pending, neg, &ctx.driver, &ctx.cfg)
            }
            _ => Err(Error::Protocol("unexpected MPA event after accept".into())),
        }
    }
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<()> {
        let IncomingRequest { mut sock, mpa, .. } = *self;
        let mut mpa = mpa.into_inner().unwrap();
        mpa.reject(private_data).map_err(mpa_err)?;
        let mut out = Vec::new();
        while mpa.poll_transmit(&mut out).is_some() {}
        sock.write_all(&out)?;
        // RFC 5044 §7.1.2: close after the Reject, but not at once. A FIN in the same TCP
        // segment as the Reply makes Linux 6.1 siw as initiator drop the Reply (its
        // data_ready upcall finds the socket no longer ESTABLISHED) and report the close
        // instead: REJECTED without the private data (docs/interop-siw.md D11). The
        // initiator closes as soon as it has read the Reject; close after it, at the
        // latest after REJECT_LINGER.
        linger_until_peer_closes(&mut sock, REJECT_LINGER);
        let _ = sock.shutdown(std::net::Shutdown::Both);
        Ok(())
    }
}

/// The longest a reject waits for the initiator to close first.
const REJECT_LINGER: Duration = Duration::from_secs(1);

/// Reads (and drops) what the peer sends until it closes, or `limit` passes.
fn linger_until_peer_closes(sock: &mut TcpStream, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || sock.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match sock.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

struct IwarpListener {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ListenerOps for IwarpListener {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for IwarpListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // The listener's thread sees the stop flag, closes the listening
        // socket and the negotiations in progress, and ends the request queue.
        let _ = self.waker.wake();
        // Wait for that, so the port is free when the drop returns (rdma_destroy_id then a
        // new listen on the same port, as perftest's server does between its connections).
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, TcpListener};

    const T: Duration = Duration::from_secs(10);

    /// rping's -I and -t reach the socket: the connection leaves from the
    /// source address given, and its packets carry the TOS.
    #[test]
    fn dial_binds_the_source_address_and_sets_the_tos() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let src = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        let route = RouteOptions::default().src_addr(src).tos(0x28);
        let s = dial(l.local_addr().unwrap(), &route, T).unwrap();
        let (_, peer) = l.accept().unwrap();
        assert_eq!(peer.ip(), src);
        assert_eq!(s.local_addr().unwrap().ip(), src);
        assert_eq!(socket2::SockRef::from(&s).tos_v4().unwrap(), 0x28);
        assert!(s.nodelay().unwrap());

        // Without options: the system's choice, TOS 0.
        let s = dial(l.local_addr().unwrap(), &RouteOptions::default(), T).unwrap();
        assert_eq!(socket2::SockRef::from(&s).tos_v4().unwrap(), 0);
    }

    #[test]
    fn dial_refuses_a_source_it_cannot_use() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let v6 = RouteOptions::default().src_addr("::1".parse().unwrap());
        let e = dial(l.local_addr().unwrap(), &v6, T).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("IP versions"),
            "{e}"
        );
        // 192.0.2.1 (TEST-NET-1) is no address of this host: bind fails with EADDRNOTAVAIL.
        let foreign = RouteOptions::default().src_addr("192.0.2.1".parse().unwrap());
        let e = dial(l.local_addr().unwrap(), &foreign, T).unwrap_err();
        assert!(e.to_string().contains("cannot connect from 192.0.2.1"), "{e}");
    }
}
