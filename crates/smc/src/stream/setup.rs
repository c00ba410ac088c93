//! Connection setup: the CLC exchange on the TCP connection (client and server), first
//! and subsequent contact, the point of no return, fallback.

use super::*;

pub(super) fn local_caps(dev: &Device, tcp: &TcpStream, cfg: &SmcConfig) -> io::Result<LocalCaps> {
    let gid = dev.query_gid(1, 0).map_err(verbs_err)?;
    let (ipv4, ipv6) = match tcp.local_addr()?.ip() {
        IpAddr::V4(a) => (Some((a, cfg.prefix_len)), None),
        // SMC-R v1 over IPv6 TCP: the Proposal carries the IPv6 prefix.
        IpAddr::V6(a) => (None, Some((a, cfg.prefix_len_v6))),
    };
    let fake_mac = [0x02, 0, gid.0[12], gid.0[13], gid.0[14], gid.0[15]];
    let mut hostname = [b' '; HOSTNAME_LEN];
    hostname[..8].copy_from_slice(b"softrdma");
    // SMC-Rv2 (Linux's form): a UEID and an IPv4 GID. Linux sends its RoCEv2 frames of a
    // v2-direct link to the MAC of our CLC message, so it must be the real one of the
    // interface that has the GID's address (netif; the made-up one stays for v1, where
    // nothing reads it).
    let gid_v4 = Ipv6Addr::from(gid.0).to_ipv4_mapped();
    let eids: Vec<[u8; EID_LEN]> = cfg.ueid.as_deref().map(eid_bytes).transpose()?.into_iter().collect();
    let v2 = !eids.is_empty() && gid_v4.is_some();
    let mac = match gid_v4.filter(|_| v2).and_then(crate::netif::mac_of_ipv4) {
        Some(m) => m,
        None => fake_mac,
    };
    Ok(LocalCaps {
        enabled: true,
        v1: true,
        v2,
        peer_id: PeerId::new((std::process::id() & 0xFFFF) as u16, mac),
        gid: gid.0,
        mac,
        ipv4,
        ipv6,
        eids,
        hostname,
        max_conns: 255,
        max_links: 1,
    })
}

/// A UEID as it goes on the wire: upper case, `A-Z 0-9 . -` only, blank padded to 32
/// (Linux's `smc_clc_ueid_add` rules).
fn eid_bytes(ueid: &str) -> io::Result<[u8; EID_LEN]> {
    let u = ueid.to_ascii_uppercase();
    if u.is_empty()
        || u.len() > EID_LEN
        || !u
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err(io_err(
            io::ErrorKind::InvalidInput,
            format!("invalid SMC-Rv2 UEID {ueid:?}"),
        ));
    }
    let mut e = [b' '; EID_LEN];
    e[..u.len()].copy_from_slice(u.as_bytes());
    Ok(e)
}

/// Runs the CLC machine on `tcp` until it decides; `on_need` answers NeedLink.
pub(super) fn run_clc(
    tcp: &mut TcpStream,
    m: &mut ClcMachine,
    deadline: Instant,
    mut on_need: impl FnMut(&mut ClcMachine, &NeedLink) -> io::Result<()>,
) -> io::Result<()> {
    let mut buf = [0u8; 1024];
    loop {
        let out = m.take_output();
        if !out.is_empty() {
            tcp.write_all(&out)?;
        }
        match m.outcome().clone() {
            Outcome::Pending => {}
            Outcome::NeedLink(n) => {
                on_need(m, &n)?;
                continue;
            }
            Outcome::Proceed(_) | Outcome::Fallback(_) => return Ok(()),
            Outcome::Reset(r) => {
                let _ = tcp.shutdown(Shutdown::Both);
                return Err(io_err(io::ErrorKind::ConnectionReset, format!("SMC-R CLC: {r}")));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            m.on_timeout();
            continue;
        }
        tcp.set_read_timeout(Some(left))?;
        match tcp.read(&mut buf) {
            Ok(0) => {
                m.on_eof();
            }
            Ok(n) => {
                m.on_bytes(&buf[..n]);
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                m.on_timeout();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

pub(super) fn device_mtu(dev: &Device) -> Mtu {
    dev.query_port(1).map(|p| p.active_mtu).unwrap_or(Mtu::Mtu1024)
}

/// How far the CLC got towards a link.
pub(super) enum Setup {
    /// First contact: a new group, not started yet.
    New(Box<Group>, u32),
    /// Subsequent contact: an element in a running group.
    Existing(Arc<Group>, u32),
}

impl Setup {
    pub(super) fn abandon(self) {
        match self {
            Setup::New(g, _) => drop(g),
            Setup::Existing(g, cid) => g.release_cid(cid),
        }
    }
}

impl SmcStream {
    /// Connects to `addr` over TCP, then proposes SMC-R on `dev` (unless
    /// [`SmcConfig::propose`] is false). A Decline gives a working TCP connection with the
    /// reason in [`SmcStream::mode`].
    pub fn connect<A: ToSocketAddrs>(addr: A, dev: &Device) -> io::Result<Self> {
        Self::connect_with(addr, dev, &SmcConfig::default())
    }

    /// [`SmcStream::connect`] with explicit settings.
    pub fn connect_with<A: ToSocketAddrs>(addr: A, dev: &Device, cfg: &SmcConfig) -> io::Result<Self> {
        Self::connect_over(TcpStream::connect(addr)?, dev, cfg)
    }

    /// The client side of SMC-R on a TCP connection connected elsewhere (e.g. by an
    /// unmodified program whose socket `softrdma smc run`'s daemon was handed): proposes on
    /// `dev` when [`SmcConfig::propose`] is set (the peer's SYN-ACK carried the option),
    /// else falls back with "peer did not indicate SMC" without sending anything.
    pub fn connect_over(tcp: TcpStream, dev: &Device, cfg: &SmcConfig) -> io::Result<Self> {
        cfg.check()?;
        let mut tcp = tcp;
        let caps = local_caps(dev, &tcp, cfg)?;
        let me = (caps.gid, caps.mac);
        let mut m = ClcMachine::client(caps, cfg.propose);
        let mut setup: Option<Setup> = None;
        let mut fc_guard = None;
        let deadline = Instant::now() + cfg.clc_timeout;
        let tcp2 = tcp.try_clone()?;
        let res = run_clc(&mut tcp, &mut m, deadline, |m, need| {
            let NeedLink::Accept(acc) = need else {
                return Err(io_err(
                    io::ErrorKind::Other,
                    "CLC: server-side decision asked of a client",
                ));
            };
            if acc.check_enums().is_err() || acc.rmbe_bytes() > Rmbe::MAX_LEN {
                let _ = m.decline(Diagnosis::MEM, false);
                return Ok(());
            }
            let key = GroupKey {
                role: Role::Client,
                dev: dev.name().to_string(),
                peer_id: acc.peer_id.0,
                peer_gid: acc.gid,
                peer_mac: acc.mac,
            };
            let guard = first_contact_lock(&key);
            if !acc.first_contact {
                // SMC-SC-3: subsequent contact iff peer ID, GID, MAC and QPN name a link we
                // know; else out of sync (SMC-FC-14): Decline with S.
                let Some(g) = find_group(&key, Some(acc.qpn & 0x00FF_FFFF)) else {
                    tracing::warn!("Accept names no link group we know, declining (out of sync)");
                    let _ = m.decline(Diagnosis::SYNC_ERROR, true);
                    return Ok(());
                };
                drop(guard);
                let link = g.lock().links.active_to(acc.qpn);
                match g.reserve(cfg, &tcp2, link) {
                    Ok(r) => {
                        if let Some(ri) = r.new_rmb
                            && let Err(e) = g.confirm_rkey_wait(ri)
                        {
                            tracing::warn!(error = %e, "CONFIRM RKEY failed, declining");
                            g.release_cid(r.cid);
                            let _ = m.decline(Diagnosis::ERR_RTOK, false);
                            return Ok(());
                        }
                        let p = g.params(r.cid);
                        m.confirm(&p).map_err(|e| io_err(io::ErrorKind::Other, e))?;
                        setup = Some(Setup::Existing(g, r.cid));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "no element for the Accept, declining");
                        let _ = m.decline(Diagnosis::MEM, false);
                    }
                }
                return Ok(());
            }
            let made = Group::new(dev, key, cfg, me, acc.version).and_then(|mut g| {
                // A1.11: client INIT → RTR before Confirm; RTS right after, then it waits
                // for the server's CONFIRM LINK.
                g.connect(acc)?;
                let r = g.reserve(cfg, &tcp2, None)?;
                Ok((g, r.cid))
            });
            match made {
                Ok((g, cid)) => {
                    let p = g.params(cid);
                    m.confirm(&p).map_err(|e| io_err(io::ErrorKind::Other, e))?;
                    setup = Some(Setup::New(Box::new(g), cid));
                    fc_guard = Some(guard);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no link for the Accept, declining");
                    let _ = m.decline(Diagnosis::MEM, false);
                }
            }
            Ok(())
        });
        if let Err(e) = res {
            if let Some(s) = setup {
                s.abandon();
            }
            return Err(e);
        }
        let r = Self::finish(tcp, m, setup, false, cfg);
        drop(fc_guard);
        r
    }

    pub(super) fn finish(
        mut tcp: TcpStream,
        mut m: ClcMachine,
        setup: Option<Setup>,
        server: bool,
        cfg: &SmcConfig,
    ) -> io::Result<Self> {
        let _ = cfg;
        tcp.set_read_timeout(None)?;
        let Outcome::Proceed(peer) = m.outcome().clone() else {
            if let Some(s) = setup {
                s.abandon();
            }
            return Self::not_smc(tcp, m);
        };
        let Some(setup) = setup else {
            return Err(io_err(io::ErrorKind::Other, "CLC proceeded without a link"));
        };
        let (g, cid, early) = match setup {
            Setup::New(mut g, cid) => {
                if server && let Err(e) = g.connect(&peer) {
                    // Server RTR → RTS on Confirm.
                    tracing::warn!(error = %e, "server QP to RTR/RTS failed, declining");
                    let _ = m.decline(Diagnosis::ERR_READY_LINK, false);
                    tcp.write_all(&m.take_output())?;
                    drop(g);
                    return Self::not_smc(tcp, m);
                }
                // First contact: CONFIRM LINK on the new QP, before the point of no return
                // (a failure here still Declines, C.2/C.3).
                match g.confirm_link_exchange(server, CONFIRM_LINK_WAIT) {
                    Ok(early) => match g.start() {
                        Ok(g) => (g, cid, early),
                        Err(e) => return Err(e),
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "CONFIRM LINK failed, declining");
                        let d = if e.kind() == io::ErrorKind::TimedOut {
                            Diagnosis::TIMEOUT_CONFIRM_LINK
                        } else {
                            Diagnosis::RMBE_EYECATCHER
                        };
                        let _ = m.decline(d, false);
                        tcp.write_all(&m.take_output())?;
                        drop(g);
                        return Self::not_smc(tcp, m);
                    }
                }
            }
            Setup::Existing(g, cid) => {
                // SMC-SC-6: the server checks the Confirm names the group's link; a wrong
                // one is a protocol error, answered with a reset (no Decline after the
                // Accept of a subsequent contact, SMC-SC-8).
                // The CLC messages carry each end's first device's GID and MAC (what the
                // group is keyed by) and the QPN of the connection's link: the QPN must be
                // the peer's QP on that link.
                let link = g.lock().conns.get(&cid).map(|s| s.link);
                let named = link.and_then(|l| g.link(l)).map(|l| l.peer_qpn());
                if server && (named != Some(peer.qpn & 0x00FF_FFFF) || peer.gid != g.key.peer_gid) {
                    g.release_cid(cid);
                    let _ = tcp.shutdown(Shutdown::Both);
                    return Err(io_err(
                        io::ErrorKind::ConnectionReset,
                        "SMC-R Confirm names no link of the group",
                    ));
                }
                (g, cid, Vec::new())
            }
        };
        m.point_of_no_return();
        if let Err(e) = g.activate(cid, &peer, &early) {
            g.release_cid(cid);
            return Err(e);
        }
        Ok(Self {
            tcp,
            kind: Kind::Smc(SmcSide {
                g,
                cid,
                handles: Arc::new(AtomicU32::new(1)),
            }),
            mode: Mode::SmcR,
            prefix: Vec::new(),
        })
    }

    pub(super) fn not_smc(tcp: TcpStream, mut m: ClcMachine) -> io::Result<Self> {
        match m.outcome().clone() {
            Outcome::Fallback(r) => {
                tracing::info!(reason = %r, "SMC-R fallback to TCP");
                let prefix = m.take_app_data();
                stats_init();
                stats::inc(&stats::counters().fallback_conns);
                let info = Arc::new(FallbackInfo {
                    local: tcp.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                    peer: tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
                    reason: r,
                    sent: AtomicU64::new(0),
                    received: AtomicU64::new(0),
                });
                fallbacks()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Arc::downgrade(&info));
                Ok(Self {
                    tcp,
                    kind: Kind::Tcp(Some(info)),
                    mode: Mode::Fallback(r),
                    prefix,
                })
            }
            Outcome::Reset(r) => Err(io_err(io::ErrorKind::ConnectionReset, format!("SMC-R CLC: {r}"))),
            _ => Err(io_err(io::ErrorKind::Other, "CLC undecided")),
        }
    }

    /// The server side of SMC-R on a TCP connection accepted elsewhere (e.g. by an
    /// unmodified program under `softrdma smc run`). `indicated`: whether the client's SYN
    /// carried the SMC-R option (from [`crate::sockops::Guard::peer_offered_smc`]); `None`
    /// = look at the client's first octets as [`SmcListener::accept`] does. Without a
    /// device (`dev` = `None`) a client that indicated SMC gets the CLC answer of a server
    /// with SMC-R unavailable: its Proposal is read and Declined (F2), then TCP goes on.
    pub fn accept_over(
        tcp: TcpStream,
        dev: Option<&Device>,
        cfg: &SmcConfig,
        indicated: Option<bool>,
    ) -> io::Result<Self> {
        cfg.check()?;
        let mut tcp = tcp;
        let indicated = match indicated {
            Some(b) => b,
            None => client_indicates_smc(&tcp, cfg.indication_wait)?,
        };
        let Some(dev) = dev else {
            let mut hostname = [b' '; HOSTNAME_LEN];
            hostname[..8].copy_from_slice(b"softrdma");
            let caps = LocalCaps {
                enabled: false,
                v1: true,
                v2: false,
                peer_id: PeerId::new((std::process::id() & 0xFFFF) as u16, [0; 6]),
                gid: [0; 16],
                mac: [0; 6],
                ipv4: None,
                ipv6: None,
                eids: Vec::new(),
                hostname,
                max_conns: 255,
                max_links: 1,
            };
            let mut m = ClcMachine::server(caps, indicated);
            let deadline = Instant::now() + cfg.clc_timeout;
            run_clc(&mut tcp, &mut m, deadline, |_, _| {
                Err(io_err(io::ErrorKind::Other, "CLC: no device to accept with"))
            })?;
            return SmcStream::finish(tcp, m, None, true, cfg);
        };
        let caps = local_caps(dev, &tcp, cfg)?;
        let me = (caps.gid, caps.mac);
        let mut m = ClcMachine::server(caps, indicated);
        let mut setup: Option<Setup> = None;
        let mut fc_guard = None;
        let deadline = Instant::now() + cfg.clc_timeout;
        let tcp2 = tcp.try_clone()?;
        let res = run_clc(&mut tcp, &mut m, deadline, |m, need| {
            let NeedLink::Proposal { proposal, version, .. } = need else {
                return Err(io_err(
                    io::ErrorKind::Other,
                    "CLC: client-side decision asked of a server",
                ));
            };
            let key = GroupKey {
                role: Role::Server,
                dev: dev.name().to_string(),
                peer_id: proposal.peer_id.0,
                // v2: the v1 fields are zero when the client offers only v2 (Linux 6.12);
                // its RoCEv2 GID names it.
                peer_gid: match (&proposal.v2_ext, *version >= 2) {
                    (Some(x), true) => x.roce_gid,
                    _ => proposal.gid,
                },
                peer_mac: proposal.mac,
            };
            let guard = first_contact_lock(&key);
            // Only the server decides reuse (SMC-SC-1): this client's group, if usable.
            if let Some(g) = find_group(&key, None) {
                drop(guard);
                match g.reserve(cfg, &tcp2, None) {
                    Ok(r) => {
                        if let Some(ri) = r.new_rmb
                            && let Err(e) = g.confirm_rkey_wait(ri)
                        {
                            tracing::warn!(error = %e, "CONFIRM RKEY failed, declining");
                            g.release_cid(r.cid);
                            let _ = m.decline(Diagnosis::ERR_RTOK, false);
                            return Ok(());
                        }
                        m.accept(&g.params(r.cid), false)
                            .map_err(|e| io_err(io::ErrorKind::Other, e))?;
                        setup = Some(Setup::Existing(g, r.cid));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "no element for the Proposal, declining");
                        let _ = m.decline(Diagnosis::MEM, false);
                    }
                }
                return Ok(());
            }
            match Group::new(dev, key, cfg, me, *version).and_then(|g| {
                let r = g.reserve(cfg, &tcp2, None)?;
                Ok((g, r.cid))
            }) {
                Ok((g, cid)) => {
                    // A1.11: the server's QP is in INIT at Accept (SMC-FC-3).
                    m.accept(&g.params(cid), true)
                        .map_err(|e| io_err(io::ErrorKind::Other, e))?;
                    setup = Some(Setup::New(Box::new(g), cid));
                    fc_guard = Some(guard);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no link for the Proposal, declining");
                    let _ = m.decline(Diagnosis::MEM, false);
                }
            }
            Ok(())
        });
        if let Err(e) = res {
            if let Some(s) = setup {
                s.abandon();
            }
            return Err(e);
        }
        let s = SmcStream::finish(tcp, m, setup, true, cfg);
        drop(fc_guard);
        s
    }
}

/// The listener's substitute for the SYN's TCP option: did the client's first octets start
/// with the CLC eyecatcher? Looks with `peek` (consumes nothing); a plain client that sends
/// nothing within `wait`, or other octets, or closes, did not indicate SMC.
pub(super) fn client_indicates_smc(tcp: &TcpStream, wait: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + wait;
    let mut b = [0u8; 4];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tcp.set_read_timeout(None)?;
            return Ok(false);
        }
        tcp.set_read_timeout(Some(left))?;
        match tcp.peek(&mut b) {
            Ok(0) => return Ok(false),
            Ok(n) if b[..n] != EYECATCHER_SMCR[..n] => return Ok(false),
            Ok(4) => return Ok(true),
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
