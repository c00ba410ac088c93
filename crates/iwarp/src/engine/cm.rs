//! Connection setup: TCP connect/accept and the MPA exchange (RFC 5044 §7,
//! RFC 6581), driving the sans-I/O negotiation in [`crate::proto::mpa`] over a
//! blocking socket with the negotiation's own timeouts. Once MPA is done the
//! socket is handed to [`super::qp::IwarpQp`] (non-blocking, on the progress
//! thread's epoll set).
//!
//! The listener accepts on its own thread and runs each handshake on a
//! short-lived thread, so a slow or silent peer (MPA Request timeout, 10 s as
//! in siw) never holds up other connections.

use super::IwarpConfig;
use super::driver::Driver;
use super::qp::{IwarpQp, Negotiated, RtrRole};
use crate::proto::mpa::{Event, IrdOrd, Mpa, MpaConfig, MpaError};
use crate::wire::mpa::RtrSet;
use crate::wire::terminate;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use verbs::cm::{ConnInfo, ConnRequestOps, ListenerOps, Provider, QpOps, QpRequest};
use verbs::notify::EventQueue;
use verbs::{ConnParam, Device, Error, Result};

/// The iWARP provider behind a `verbs::Device`.
pub struct IwarpProvider {
    cfg: IwarpConfig,
    driver: Arc<Driver>,
    next_qpn: AtomicU32,
}

impl IwarpProvider {
    pub fn new(cfg: IwarpConfig) -> std::io::Result<Self> {
        let driver = Driver::start(&cfg.name)?;
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

fn ird_ord(p: &ConnParam, dev: &Device) -> IrdOrd {
    let a = dev.attr();
    IrdOrd {
        ird: (p.responder_resources as u32).min(a.max_qp_rd_atom) as u16,
        ord: (p.initiator_depth as u32).min(a.max_qp_init_rd_atom) as u16,
    }
}

fn mpa_err(e: MpaError) -> Error {
    match e {
        MpaError::TimedOut(_) => Error::Timeout,
        // Our own parameters (e.g. private data over max_private_data_tx): nothing was sent.
        MpaError::InvalidParam(_) | MpaError::PrivateDataTooLong { .. } => Error::InvalidArgument(e.to_string()),
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

fn to_negotiated(n: &crate::proto::mpa::Negotiated, sock: &TcpStream) -> Negotiated {
    let rtr = n
        .rtr_to_send()
        .map(RtrRole::Send)
        .or(n.rtr_to_receive().map(RtrRole::Expect));
    let local = sock
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let peer = sock.peer_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
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
    fn listen(
        &self,
        _dev: &Device,
        addr: SocketAddr,
        requests: Arc<EventQueue<Box<dyn ConnRequestOps>>>,
    ) -> Result<Box<dyn ListenerOps>> {
        let l = TcpListener::bind(addr)?;
        let local = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Arc::new(ListenCtx {
            mpa: self.mpa_config(),
            driver: self.driver.clone(),
            cfg: self.cfg.clone(),
            qpn: Arc::new(AtomicU32::new(
                self.next_qpn.fetch_add(1 << 20, Ordering::Relaxed) + (1 << 20),
            )),
        });
        let (stop2, requests2) = (stop.clone(), requests.clone());
        std::thread::Builder::new()
            .name(format!("iwarp-listen-{}", local.port()))
            .spawn(move || {
                for s in l.incoming() {
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(s) = s else { continue };
                    let (ctx, q) = (ctx.clone(), requests2.clone());
                    let _ = std::thread::Builder::new()
                        .name("iwarp-mpa".into())
                        .spawn(move || handshake(ctx, s, q));
                }
                requests2.close();
            })?;
        Ok(Box::new(IwarpListener { local, stop }))
    }

    fn connect(&self, addr: SocketAddr, req: QpRequest, timeout: Duration) -> Result<Arc<dyn QpOps>> {
        let local = ird_ord(&req.param, req.pd.device());
        // Refuse what MPA would refuse (private data too long, bad parameters) before the
        // TCP connect: a connection closed right after it opens is what breaks a Linux 6.1
        // siw listener (lab hazard 1).
        Mpa::initiator(Instant::now(), self.mpa_config(), local, &req.param.private_data).map_err(mpa_err)?;
        let mut sock = TcpStream::connect_timeout(&addr, timeout).map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
            std::io::ErrorKind::TimedOut => Error::Timeout,
            _ => Error::Io(e),
        })?;
        sock.set_nodelay(true)?;
        let mut mpa =
            Mpa::initiator(Instant::now(), self.mpa_config(), local, &req.param.private_data).map_err(mpa_err)?;
        let mut pending = Vec::new();
        match drive(&mut mpa, &mut sock, &mut pending)? {
            Event::Negotiated(n) => {
                let neg = to_negotiated(&n, &sock);
                tracing::debug!("connected to {addr}: {}", neg.info.detail);
                let qp = IwarpQp::start(
                    sock,
                    pending,
                    self.driver.clone(),
                    req,
                    self.qpn(),
                    neg,
                    self.cfg.terminate_siw_form,
                    self.cfg.max_ulpdu,
                )?;
                Ok(qp)
            }
            Event::Rejected(r) => Err(Error::Rejected {
                private_data: r.private_data,
                ird_ord: r.enhanced.map(|e| (e.ird, e.ord)),
            }),
            Event::ConnectRequest(_) => Err(Error::Protocol("unexpected MPA event".into())),
        }
    }
}

struct ListenCtx {
    mpa: MpaConfig,
    driver: Arc<Driver>,
    cfg: IwarpConfig,
    qpn: Arc<AtomicU32>,
}

fn handshake(ctx: Arc<ListenCtx>, mut sock: TcpStream, q: Arc<EventQueue<Box<dyn ConnRequestOps>>>) {
    let _ = sock.set_nodelay(true);
    let Ok(mut mpa) = Mpa::responder(Instant::now(), ctx.mpa.clone()) else {
        return;
    };
    let mut pending = Vec::new();
    match drive(&mut mpa, &mut sock, &mut pending) {
        Ok(Event::ConnectRequest(cr)) => {
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
            let peer = sock.peer_addr().unwrap_or(local);
            q.push(Box::new(IncomingRequest {
                ctx,
                sock,
                mpa: Mutex::new(mpa),
                pending,
                param,
                local,
                peer,
            }));
        }
        Ok(_) => {}
        Err(e) => tracing::info!("MPA negotiation with a peer failed: {e}"),
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
    fn accept(self: Box<Self>, req: QpRequest) -> Result<Arc<dyn QpOps>> {
        let IncomingRequest {
            ctx,
            mut sock,
            mpa,
            mut pending,
            ..
        } = *self;
        let mut mpa = mpa.into_inner().unwrap();
        let local = ird_ord(&req.param, req.pd.device());
        mpa.accept(local, &req.param.private_data).map_err(mpa_err)?;
        match drive(&mut mpa, &mut sock, &mut pending)? {
            Event::Negotiated(n) => {
                let neg = to_negotiated(&n, &sock);
                let qpn = ctx.qpn.fetch_add(1, Ordering::Relaxed);
                let qp = IwarpQp::start(
                    sock,
                    pending,
                    ctx.driver.clone(),
                    req,
                    qpn,
                    neg,
                    ctx.cfg.terminate_siw_form,
                    ctx.cfg.max_ulpdu,
                )?;
                Ok(qp)
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
}

impl ListenerOps for IwarpListener {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for IwarpListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own; the
        // accept thread sees the stop flag and closes the listener.
        let mut a = self.local;
        if a.ip().is_unspecified() {
            a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let _ = TcpStream::connect_timeout(&a, Duration::from_millis(200));
    }
}
