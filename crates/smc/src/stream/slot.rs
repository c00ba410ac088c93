//! Connections inside a group: reserving an element and send ring, activating the
//! connection machine ([`crate::conn::Conn`]) with the peer's CLC values, posting its
//! actions on the link, close timers and RST checks, freeing.

use super::*;

/// One connection of a group, as the engine keeps it.
pub(super) struct Slot {
    pub(super) token: u32,
    /// None until the peer's Confirm (server, subsequent contact) is processed: CDCs that
    /// arrive before are held in `early` (SMC-SC-7).
    pub(super) conn: Option<Conn>,
    pub(super) early: Vec<Cdc>,
    /// Actions not yet posted (the send queue was full), in order.
    pub(super) pending: VecDeque<Action>,
    pub(super) rmb: usize,
    pub(super) elem: u32,
    pub(super) elem_len: u32,
    /// The link the connection's RDMA Writes and CDCs go on.
    pub(super) link: u8,
    /// The send buffer, registered for link `sndbuf_link`; `sndbuf_alt`: the same memory
    /// registered on the group's other links.
    pub(super) sndbuf: MemoryRegion,
    pub(super) sndbuf_link: u8,
    pub(super) sndbuf_alt: Vec<(u8, MemoryRegion)>,
    pub(super) send_len: u32,
    /// The peer's element on `link`: its RMB's RToken there plus the element's offset.
    pub(super) peer_elem: RemoteAddr,
    pub(super) peer_rmb: (u32, u64),
    pub(super) peer_elem_off: u64,
    /// Octets ever accepted from the application (stream offset of the next one).
    pub(super) accepted: u64,
    pub(super) received: u64,
    pub(super) read_shut: bool,
    pub(super) nonblocking: bool,
    pub(super) link_error: Option<String>,
    pub(super) close_timeout: Duration,
    pub(super) close_deadline: Option<Instant>,
    pub(super) tcp_reset: bool,
    pub(super) dropped: bool,
    /// The TCP connection (nonblocking clone): RST checks, shutdown when done.
    pub(super) tcp: Option<TcpStream>,
    pub(super) last_rst_check: Instant,
    /// When an EOF was first seen on the TCP path while the SMC-R connection was open.
    pub(super) tcp_eof_since: Option<Instant>,
    pub(super) local: String,
    pub(super) peer: String,
    /// SO_LINGER {1, 0}: the last handle's drop aborts (Figure 23) instead of closing.
    pub(super) linger_zero: bool,
    /// An RDMA Write was posted and the CDC that announces it is not yet.
    pub(super) pending_data_cdc: bool,
    /// [`SmcConfig::write_chunk`].
    pub(super) write_chunk: u32,
}

/// A reserved element (and connection slot) in a group.
pub(super) struct Reserved {
    pub(super) cid: u32,
    /// A new RMB (its index) that must be announced with CONFIRM RKEY (subsequent contact).
    pub(super) new_rmb: Option<usize>,
}

impl Slot {
    /// The send buffer's registration on link `link`.
    pub(super) fn sndbuf_on(&self, link: u8) -> Option<&MemoryRegion> {
        if self.sndbuf_link == link {
            return Some(&self.sndbuf);
        }
        self.sndbuf_alt.iter().find(|(l, _)| *l == link).map(|(_, m)| m)
    }
}

impl Group {
    /// An element for a new connection (a new RMB if none has room) and its send buffer
    /// (SMC-FC-3: ready before the Accept/Confirm that names it), both registered on every
    /// link of the group. `link`: the link the connection goes on (the client: the one the
    /// Accept names); None: the active link with the fewest connections (the server).
    pub(super) fn reserve(&self, cfg: &SmcConfig, tcp: &TcpStream, link: Option<u8>) -> io::Result<Reserved> {
        let mut st = self.lock();
        if st.lgr.terminated().is_some() {
            return Err(io_err(io::ErrorKind::ConnectionAborted, "link group ended"));
        }
        // Before the first link is confirmed it is the only one (first contact).
        let link = match link {
            Some(l) => l,
            None if st.link_state != LinkState::Active => st.links.v[0].num(),
            None => st
                .links
                .least_used(st.conns.values())
                .ok_or_else(|| io_err(io::ErrorKind::ConnectionAborted, "no active link"))?,
        };
        let on = |st: &GState, l: u8| st.links.get(l).map(|x| Arc::clone(&x.link));
        let home = on(&st, link).ok_or_else(|| io_err(io::ErrorKind::ConnectionAborted, "no such link"))?;
        // The other live links (an active one, or one being added): the RMB and send
        // buffer are registered there too.
        let others: Vec<Arc<Link>> = st
            .links
            .v
            .iter()
            .filter(|l| l.num() != link && l.state != LinkState::Failed)
            .map(|l| Arc::clone(&l.link))
            .collect();
        let elem_len = cfg.rmbe_len;
        let found = st.rmbs.iter().enumerate().find_map(|(i, r)| {
            if r.elem_len == elem_len {
                r.used.iter().position(|u| !u).map(|e| (i, e))
            } else {
                None
            }
        });
        let mut new_rmb = None;
        let (ri, ei) = match found {
            Some(x) => x,
            None => {
                let n = cfg.elements_per_rmb.clamp(1, MAX_ELEMS);
                // A1.11: remotely writable only; no remote read or atomics.
                let mr = home.pd.reg_mr((n * elem_len) as usize, RMB_ACCESS).map_err(verbs_err)?;
                let mut alt = Vec::new();
                for o in &others {
                    alt.push((o.num(), o.pd.reg_mr_shared(&mr, RMB_ACCESS).map_err(verbs_err)?));
                }
                for _ in 0..=alt.len() {
                    stats::inc(&stats::counters().mrs);
                }
                st.rmbs.push(Rmb {
                    mr,
                    link,
                    alt,
                    elem_len,
                    used: vec![false; n as usize],
                });
                new_rmb = Some(st.rmbs.len() - 1);
                (st.rmbs.len() - 1, 0)
            }
        };
        let sndbuf = home
            .pd
            .reg_mr(cfg.send_buf as usize, Access::LOCAL_WRITE)
            .map_err(verbs_err)?;
        let mut sndbuf_alt = Vec::new();
        for o in &others {
            sndbuf_alt.push((
                o.num(),
                o.pd.reg_mr_shared(&sndbuf, Access::LOCAL_WRITE).map_err(verbs_err)?,
            ));
        }
        for _ in 0..=sndbuf_alt.len() {
            stats::inc(&stats::counters().mrs);
        }
        // SMC-RMB-7: a fresh element is all zero (a reused one still holds the last data).
        let zero = vec![0u8; elem_len as usize];
        let _ = st.rmbs[ri].mr.write(ei * elem_len as usize, &zero);
        st.rmbs[ri].used[ei] = true;
        stats::inc(&stats::counters().rmb_elements);
        let cid = st.next_cid;
        st.next_cid = (st.next_cid + 1) & WR_CID_MASK as u32;
        if st.next_cid == 0 {
            st.next_cid = 1;
        }
        let token = new_token();
        st.by_token.insert(token, cid);
        // Made nonblocking once the CLC exchange is over (activate): the flag is shared
        // with the stream the CLC machine reads.
        let t2 = tcp.try_clone()?;
        st.conns.insert(
            cid,
            Slot {
                token,
                conn: None,
                early: Vec::new(),
                pending: VecDeque::new(),
                rmb: ri,
                elem: ei as u32,
                elem_len,
                link,
                sndbuf,
                sndbuf_link: link,
                sndbuf_alt,
                send_len: cfg.send_buf,
                peer_elem: RemoteAddr { addr: 0, rkey: 0 },
                peer_rmb: (0, 0),
                peer_elem_off: 0,
                accepted: 0,
                received: 0,
                read_shut: false,
                nonblocking: false,
                link_error: None,
                close_timeout: cfg.close_timeout,
                close_deadline: None,
                tcp_reset: false,
                dropped: false,
                tcp: Some(t2),
                last_rst_check: Instant::now(),
                tcp_eof_since: None,
                linger_zero: false,
                pending_data_cdc: false,
                write_chunk: cfg.write_chunk,
                local: tcp.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                peer: tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
            },
        );
        st.lgr.conn_added();
        Ok(Reserved { cid, new_rmb })
    }

    /// The CLC values naming this group's link and the connection's element.
    pub(super) fn params(&self, cid: u32) -> LinkParams {
        let st = self.lock();
        let s = &st.conns[&cid];
        let r = &st.rmbs[s.rmb];
        let l = &st.links.get(s.link).unwrap_or(&st.links.v[0]).link;
        let m = r.on(s.link).unwrap_or(&r.mr);
        LinkParams {
            qpn: l.qp.qp_num(),
            rmb_rkey: m.rkey(),
            rmbe_idx: (s.elem + 1) as u8,
            alert_token: s.token,
            rmbe_size: rmbe_size_code(s.elem_len).unwrap_or(0),
            qp_mtu: l.mtu as u8,
            rmb_vaddr: m.addr(),
            psn: l.psn,
        }
    }

    /// Frees a connection's slot: element back to its RMB, send buffer deregistered, TCP
    /// shut down (SMC-CLS-1: after the RDMA side).
    pub(super) fn release(st: &mut GState, cid: u32) {
        let Some(s) = st.conns.remove(&cid) else { return };
        st.by_token.remove(&s.token);
        if let Some(r) = st.rmbs.get_mut(s.rmb)
            && let Some(u) = r.used.get_mut(s.elem as usize)
        {
            *u = false;
        }
        if let Some(t) = &s.tcp {
            let _ = t.shutdown(Shutdown::Both);
        }
        let c = stats::counters();
        for _ in 0..=s.sndbuf_alt.len() {
            stats::dec(&c.mrs);
        }
        drop(s);
        stats::dec(&c.rmb_elements);
        st.lgr.conn_removed(Instant::now());
    }

    pub(super) fn release_cid(&self, cid: u32) {
        let mut st = self.lock();
        Self::release(&mut st, cid);
    }

    /// The connection's peer values are known (Accept for the client, Confirm for the
    /// server): make the connection machine and feed it what arrived early.
    pub(super) fn activate(&self, cid: u32, peer: &AcceptConfirm, early: &[[u8; CDC_LEN]]) -> io::Result<()> {
        let mut st = self.lock();
        let peer_elem = RemoteAddr {
            addr: peer
                .rmb_vaddr
                .wrapping_add(u64::from(peer.rmbe_idx.max(1) - 1) * u64::from(peer.rmbe_bytes())),
            rkey: peer.rmb_rkey,
        };
        // SMC-SC-4 / SMC-RMB-10: the peer names an element another connection of ours still
        // writes to → abort that older connection.
        let stale: Vec<u32> = st
            .conns
            .iter()
            .filter(|(c, s)| **c != cid && s.conn.is_some() && s.peer_elem == peer_elem)
            .map(|(c, _)| *c)
            .collect();
        for c in stale {
            if let Some(s) = st.conns.get_mut(&c) {
                tracing::warn!("peer reuses an RMB element still in use: aborting the older connection");
                Self::slot_failed(s, "peer reused its RMB element".into());
            }
        }
        // The link-group machine knows every RMB of the peer (a first contact's came in the
        // CLC, not in CONFIRM RKEY): DELETE RKEY of it is answered positively, and ADD LINK
        // CONTINUATION pairs can name it.
        let Some(link) = st.conns.get(&cid).map(|s| s.link) else {
            return Err(io_err(io::ErrorKind::ConnectionAborted, "link group ended"));
        };
        st.lgr.peer_rmb_known(link, peer.rmb_rkey, peer.rmb_vaddr);
        let Some(s) = st.conns.get_mut(&cid) else {
            return Err(io_err(io::ErrorKind::ConnectionAborted, "link group ended"));
        };
        let mode = EyecatcherMode::None; // E-6: both CONFIRM LINKs carried the flags.
        let params = ConnParams {
            local_token: s.token,
            peer_token: peer.rmbe_alert_token,
            local_rmbe: Rmbe::new(s.elem_len, mode).map_err(|e| io_err(io::ErrorKind::Other, e))?,
            peer_rmbe: Rmbe::new(peer.rmbe_bytes(), mode).map_err(|e| io_err(io::ErrorKind::InvalidData, e))?,
            send_buf: s.send_len,
        };
        s.peer_elem = peer_elem;
        s.peer_rmb = (peer.rmb_rkey, peer.rmb_vaddr);
        s.peer_elem_off = peer_elem.addr.wrapping_sub(peer.rmb_vaddr);
        if let Some(t) = &s.tcp {
            // The progress thread peeks at it for an RST; the application never reads it.
            t.set_nonblocking(true)?;
        }
        let mut conn = Conn::new(params);
        if s.write_chunk > 0 {
            conn.set_max_write(s.write_chunk);
        }
        for c in s.early.drain(..) {
            conn.on_cdc(&c);
        }
        for b in early {
            if let Ok(c) = Cdc::parse(b) {
                conn.on_cdc(&c);
            }
        }
        s.conn = Some(conn);
        stats::inc(&stats::counters().smc_conns);
        let GState { links, conns, .. } = &mut *st;
        if let Some(s) = conns.get_mut(&cid) {
            self.drive(links, cid, s);
        }
        self.wake_waiters(&mut st);
        Ok(())
    }

    pub(super) fn slot_failed(s: &mut Slot, why: String) {
        if s.link_error.is_none() {
            s.link_error = Some(why);
        }
        s.pending.clear();
        if let Some(c) = s.conn.as_mut() {
            // No RoCE path left: reset (SMC-ABT-6, -7); nothing more goes on the QP.
            c.on_tcp_reset();
            while c.poll_action().is_some() {}
        }
        s.tcp_reset = true;
        if let Some(t) = &s.tcp {
            let _ = t.shutdown(Shutdown::Both);
        }
    }

    /// Posts the connection machine's actions in order while the send queue has room.
    pub(super) fn drive(&self, links: &mut Links, cid: u32, s: &mut Slot) {
        let Some(conn) = s.conn.as_mut() else { return };
        if s.link_error.is_some() {
            while conn.poll_action().is_some() {}
            return;
        }
        while let Some(a) = conn.poll_action() {
            s.pending.push_back(a);
        }
        // A failed link's connections wait for the failover that moves them.
        let Some(sq) = links.get_mut(s.link).filter(|l| l.state != LinkState::Failed) else {
            return;
        };
        // The send buffer's key on the link (an SGE at its offset 0).
        let Some(sb) = s.sndbuf_on(s.link).map(|m| m.sge(0, 0)) else {
            Self::slot_failed(s, "send buffer not registered on the link".into());
            return;
        };
        let sge = |off: usize, len: u32| verbs::Sge {
            addr: sb.addr + off as u64,
            length: len,
            lkey: sb.lkey,
        };
        let room = SQ_DEPTH - SQ_LLC_RESERVE;
        // An RDMA Write and the CDC behind it go to the QP in one post (one transmit pass
        // of the provider: one `sendmmsg` for both instead of one each).
        let mut batch: Vec<SendWr> = std::mem::take(&mut sq.batch);
        let post = |batch: &mut Vec<SendWr>, s: &mut Slot| {
            if batch.is_empty() {
                return true;
            }
            let r = sq.link.qp.post_send(batch);
            batch.clear();
            match r {
                Ok(()) => true,
                Err(e) => {
                    Self::slot_failed(s, format!("post RDMA Write or CDC: {e}"));
                    false
                }
            }
        };
        while let Some(a) = s.pending.front().copied() {
            match a {
                Action::RdmaWrite { src, remote_off, len } => {
                    if sq.outstanding >= room {
                        break;
                    }
                    let ring = u64::from(s.send_len);
                    let off = (src % ring) as usize;
                    let first = (len as usize).min(ring as usize - off);
                    let mut sges = vec![sge(off, first as u32)];
                    if first < len as usize {
                        sges.push(sge(0, len - first as u32));
                    }
                    let remote = RemoteAddr {
                        addr: s.peer_elem.addr + u64::from(remote_off),
                        rkey: s.peer_elem.rkey,
                    };
                    let wr_id = WR_WRITE | (u64::from(cid) << 32) | u64::from(len);
                    batch.push(SendWr::new(wr_id, WrOpcode::RdmaWrite { remote }, sges));
                    sq.outstanding += 1;
                    let k = engine_counters();
                    k.rdma_writes.fetch_add(1, Ordering::Relaxed);
                    k.rdma_write_octets.fetch_add(u64::from(len), Ordering::Relaxed);
                    s.pending_data_cdc = true;
                }
                Action::SendCdc(m) => {
                    if sq.outstanding >= room {
                        break;
                    }
                    let slot = sq.next_slot;
                    sq.next_slot = sq.next_slot.wrapping_add(1);
                    // The connection id and the sequence number ride in the WR id: the
                    // completion tells the machine which CDC arrived (SS, SMC-FO-2).
                    let wr_id = WR_CDC | (u64::from(cid) << 32) | u64::from(m.seq);
                    batch.push(sq.link.ctrl_wr(slot, &m.to_bytes(), wr_id));
                    sq.outstanding += 1;
                    let k = engine_counters();
                    k.cdcs_sent.fetch_add(1, Ordering::Relaxed);
                    if std::mem::take(&mut s.pending_data_cdc) {
                        k.data_cdcs_sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Action::TcpReset => {
                    // what went before it goes out first
                    if !post(&mut batch, s) {
                        sq.batch = batch;
                        return;
                    }
                    s.tcp_reset = true;
                    // Figure 23 / SMC-ABT-1: a real RST on the TCP path with the CDC's A.
                    if let Some(t) = &s.tcp
                        && let Err(e) = sys::reset(t)
                    {
                        tracing::debug!(error = %e, "TCP reset");
                    }
                }
                Action::ReleaseElement => {}
            }
            s.pending.pop_front();
        }
        post(&mut batch, s);
        sq.batch = batch;
    }

    /// Per-connection work that is not driven by completions: queued actions, close timers
    /// of dropped streams, RSTs on the TCP path, freeing finished connections.
    pub(super) fn housekeeping(&self, st: &mut GState, now: Instant) {
        let mut done = Vec::new();
        let GState { conns, links, .. } = &mut *st;
        for (&cid, s) in conns.iter_mut() {
            self.drive(links, cid, s);
            if s.dropped {
                let deadline = *s.close_deadline.get_or_insert(now + s.close_timeout);
                if let Some(c) = s.conn.as_mut()
                    && c.state() != CloseState::Closed
                    && now >= deadline
                {
                    c.on_timeout();
                    self.drive(links, cid, s);
                }
                let closed = s.conn.as_ref().is_none_or(|c| c.state() == CloseState::Closed);
                if closed || s.link_error.is_some() {
                    done.push(cid);
                    continue;
                }
            }
            if s.tcp_reset {
                if let Some(t) = &s.tcp {
                    let _ = t.shutdown(Shutdown::Both);
                }
            } else if now.duration_since(s.last_rst_check) >= RST_CHECK {
                s.last_rst_check = now;
                if let (Some(t), Some(c)) = (&s.tcp, s.conn.as_mut()) {
                    match tcp_check(t) {
                        TcpPath::Reset => {
                            // SMC-ABT-4: an RST on the TCP path starts the abnormal close.
                            c.on_tcp_reset();
                            self.drive(links, cid, s);
                        }
                        TcpPath::Eof
                            if !c.peer_closed()
                                && !matches!(c.state(), CloseState::Closed | CloseState::PeerAbortWait) =>
                        {
                            // The peer closes its TCP path only after the SMC-R close (SMC-CLS-1)
                            // or when its side is gone (its link failed, the process died). An
                            // EOF that the C flag has not explained within a second is the
                            // latter: abort, rather than wait for the keepalive.
                            let since = *s.tcp_eof_since.get_or_insert(now);
                            if now.duration_since(since) >= TCP_EOF_GRACE {
                                tracing::warn!("TCP path closed under an open SMC-R connection, aborting");
                                c.on_tcp_reset();
                                self.drive(links, cid, s);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        for cid in done {
            if st.conns.get(&cid).is_some_and(|s| s.conn.is_some()) {
                stats::dec(&stats::counters().smc_conns);
            }
            Self::release(st, cid);
        }
    }
}

/// What the TCP path of an SMC-R connection shows.
pub(super) enum TcpPath {
    Open,
    Eof,
    Reset,
}

/// How long an EOF on the TCP path may precede the peer's C before it counts as an abort.
pub(super) const TCP_EOF_GRACE: Duration = Duration::from_secs(1);

/// A nonblocking peek at the TCP path (it carries no application octets while SMC-R is on,
/// so nothing is consumed or lost): an RST, an EOF, or nothing.
pub(super) fn tcp_check(tcp: &TcpStream) -> TcpPath {
    let mut b = [0u8; 1];
    match tcp.peek(&mut b) {
        Ok(0) => TcpPath::Eof,
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => TcpPath::Reset,
        _ => TcpPath::Open,
    }
}
