//! The link-group driver: a group's link (QP, CQ, control slots), its registry, the
//! first-contact CONFIRM LINK exchange, the progress thread (completions, LLC, timers) and
//! `smc stat`'s view of it. The protocol decisions are [`crate::lgr::LgrMachine`]'s.

use super::*;

/// What identifies a group (§2.2.3: one server, one client; the server keys by the client's
/// peer ID, GID and MAC from the Proposal, the client by the server's from the Accept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GroupKey {
    pub(super) role: Role,
    pub(super) dev: String,
    pub(super) peer_id: [u8; 8],
    pub(super) peer_gid: [u8; 16],
    pub(super) peer_mac: [u8; 6],
}

/// An RMB: one MR carved into equal elements (A1.10).
pub(super) struct Rmb {
    pub(super) mr: MemoryRegion,
    pub(super) elem_len: u32,
    pub(super) used: Vec<bool>,
}

/// Posted-work accounting of the group's one send queue.
#[derive(Default)]
pub(super) struct Sq {
    pub(super) outstanding: u32,
    pub(super) next_slot: u32,
}

pub(super) struct GState {
    pub(super) lgr: LgrMachine,
    pub(super) conns: HashMap<u32, Slot>,
    pub(super) by_token: HashMap<u32, u32>,
    pub(super) next_cid: u32,
    pub(super) rmbs: Vec<Rmb>,
    pub(super) sq: Sq,
    pub(super) rkey_result: Option<(u32, bool)>,
    pub(super) link_state: LinkState,
    pub(super) terminated_at: Option<Instant>,
    pub(super) unknown_tokens: u64,
    /// Async tasks waiting on a connection of the group (`async_io`): woken with the
    /// condition variable's waiters.
    pub(super) wakers: Vec<std::task::Waker>,
}

/// A link group with its one link.
pub(super) struct Group {
    pub(super) id: u32,
    pub(super) key: GroupKey,
    pub(super) dev: Device,
    pub(super) qp: QueuePair,
    pub(super) cq: CompletionQueue,
    /// Control send slots, then receive slots.
    pub(super) ctrl: MemoryRegion,
    pub(super) pd: ProtectionDomain,
    pub(super) psn: u32,
    pub(super) mtu: Mtu,
    pub(super) local_gid: [u8; 16],
    pub(super) local_mac: [u8; 6],
    /// The group's LLC form (v2 after a v2 CLC exchange).
    pub(super) llc_version: LlcVersion,
    pub(super) link_uid: u32,
    pub(super) peer_qpn: u32,
    pub(super) peer_gid: [u8; 16],
    pub(super) st: Mutex<GState>,
    pub(super) cv: Condvar,
}

pub(super) fn registry() -> &'static Mutex<Vec<Arc<Group>>> {
    static R: OnceLock<Mutex<Vec<Arc<Group>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

/// Group keys with a first contact under way.
pub(super) fn pending_keys() -> &'static (Mutex<Vec<GroupKey>>, Condvar) {
    static P: OnceLock<(Mutex<Vec<GroupKey>>, Condvar)> = OnceLock::new();
    P.get_or_init(|| (Mutex::new(Vec::new()), Condvar::new()))
}

/// Holds the right to make the group of one key.
pub(super) struct FirstContact(GroupKey);

impl Drop for FirstContact {
    fn drop(&mut self) {
        let (m, cv) = pending_keys();
        m.lock().unwrap_or_else(|p| p.into_inner()).retain(|k| *k != self.0);
        cv.notify_all();
    }
}

/// First contacts are serialized per group key (as Linux's `smc_server_lgr_pending` /
/// `smc_client_lgr_pending`, but per peer, so that both ends living in one process cannot
/// wait on each other), so two connections to one peer do not both make a group.
pub(super) fn first_contact_lock(key: &GroupKey) -> FirstContact {
    let (m, cv) = pending_keys();
    let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
    while g.contains(key) {
        g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
    }
    g.push(key.clone());
    FirstContact(key.clone())
}

pub(super) fn find_group(key: &GroupKey, peer_qpn: Option<u32>) -> Option<Arc<Group>> {
    let cands: Vec<Arc<Group>> = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|g| g.key == *key && peer_qpn.is_none_or(|q| q == g.peer_qpn))
        .cloned()
        .collect();
    cands.into_iter().find(|g| {
        let st = g.lock();
        st.lgr.usable() && st.link_state == LinkState::Active && st.conns.len() < 255
    })
}

pub(super) fn unregister(id: u32) {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|g| g.id != id);
}

impl Group {
    /// A new group's link: PD, CQ, RC QP in INIT with receives posted (first contact).
    /// `clc_version`: the version the CLC exchange agreed (2 = SMC-Rv2, Linux's v2 LLC form).
    pub(super) fn new(
        dev: &Device,
        key: GroupKey,
        cfg: &SmcConfig,
        me: ([u8; 16], [u8; 6]),
        clc_version: u8,
    ) -> io::Result<Self> {
        let pd = dev.alloc_pd().map_err(verbs_err)?;
        let cq = dev.create_cq((SQ_DEPTH + RQ_DEPTH) as usize * 2).map_err(verbs_err)?;
        let cap = QpInitAttr {
            max_send_wr: SQ_DEPTH,
            max_recv_wr: RQ_DEPTH,
            ..QpInitAttr::default()
        };
        let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq).cap(cap)).map_err(verbs_err)?;
        let ctrl = pd
            .reg_mr((SQ_DEPTH + RQ_DEPTH) as usize * SLOT, Access::LOCAL_WRITE)
            .map_err(verbs_err)?;
        qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE))
            .map_err(verbs_err)?;
        let recvs: Vec<RecvWr> = (0..RQ_DEPTH)
            .map(|i| RecvWr {
                wr_id: u64::from(i),
                sg_list: vec![ctrl.sge((SQ_DEPTH + i) as usize * SLOT, SLOT as u32)],
            })
            .collect();
        qp.post_recv(&recvs).map_err(verbs_err)?;
        LIVE_LINKS.fetch_add(1, Ordering::AcqRel);
        let c = stats::counters();
        for a in [&c.link_groups, &c.links, &c.qps, &c.mrs] {
            stats::inc(a);
        }
        let llc_version = if clc_version >= 2 {
            LlcVersion::V2
        } else {
            LlcVersion::V1
        };
        // A v2 group (a Linux peer over SMC-Rv2) keeps one link: `LgrConfig::new`'s
        // max_links 1, no ADD LINK of ours; its ADD LINK is rejected in the v2 form. The
        // second link (ADD LINK, failover) is for v1 groups.
        let lcfg = LgrConfig {
            linger: cfg.linger,
            keepalive: cfg.keepalive,
            version: llc_version,
            ..LgrConfig::new(key.role)
        };
        Ok(Self {
            id: NEXT_GROUP_ID.fetch_add(1, Ordering::Relaxed),
            key,
            dev: dev.clone(),
            qp,
            cq,
            ctrl,
            pd,
            psn: random_psn(),
            mtu: device_mtu(dev),
            local_gid: me.0,
            local_mac: me.1,
            llc_version,
            link_uid: NEXT_LINK_UID.fetch_add(1, Ordering::Relaxed),
            peer_qpn: 0,
            peer_gid: [0; 16],
            st: Mutex::new(GState {
                lgr: LgrMachine::new(lcfg, Instant::now()),
                conns: HashMap::new(),
                by_token: HashMap::new(),
                next_cid: 1,
                rmbs: Vec::new(),
                sq: Sq::default(),
                rkey_result: None,
                link_state: LinkState::Activating,
                terminated_at: None,
                unknown_tokens: 0,
                wakers: Vec::new(),
            }),
            cv: Condvar::new(),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, GState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// RTR then RTS towards the peer described by its Accept/Confirm (A1.11 values).
    pub(super) fn connect(&mut self, peer: &AcceptConfirm) -> io::Result<()> {
        let mtu = mtu_from_enum(peer.qp_mtu).min(self.mtu);
        self.qp
            .modify_qp(&QpAttr::rtr(RtrAttr {
                ah_attr: AhAttr::to_gid(Gid(peer.gid)),
                path_mtu: mtu,
                dest_qp_num: peer.qpn & 0x00FF_FFFF,
                rq_psn: peer.psn & 0x00FF_FFFF,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 5,
            }))
            .map_err(verbs_err)?;
        self.qp
            .modify_qp(&QpAttr::rts(RtsAttr {
                sq_psn: self.psn,
                timeout: 15,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
            }))
            .map_err(verbs_err)?;
        self.peer_qpn = peer.qpn & 0x00FF_FFFF;
        self.peer_gid = peer.gid;
        Ok(())
    }

    /// Posts a 44-octet control message (CDC or LLC) from send slot `slot`.
    pub(super) fn post_ctrl(&self, slot: u32, bytes: &[u8; CDC_LEN], wr_id: u64) -> Result<(), verbs::Error> {
        let off = (slot % SQ_DEPTH) as usize * SLOT;
        let _ = self.ctrl.write(off, bytes);
        self.qp.post_send_one(SendWr::new(
            wr_id,
            WrOpcode::Send,
            vec![self.ctrl.sge(off, CDC_LEN as u32)],
        ))
    }

    /// Our CONFIRM LINK (A.3.1): Linux's no-eyecatcher flags, one link (max links 1: we run
    /// no ADD LINK of our own).
    pub(super) fn confirm_link(&self) -> ConfirmLink {
        ConfirmLink {
            flags: CONFIRM_LINK_NO_RMBE_EYECATCHER,
            mac: self.local_mac,
            gid: self.local_gid,
            qpn: self.qp.qp_num(),
            link_num: 1,
            link_uid: self.link_uid.to_be_bytes(),
            max_links: 1,
            max_conns: 255,
        }
    }

    /// The first-contact CONFIRM LINK exchange on the new QP (A4.2, §3.5.1.5): the server
    /// sends the request once in RTS, the client answers with R set. Returns the CDCs that
    /// arrived behind it (kept for the connection machine). Runs before the progress thread.
    pub(super) fn confirm_link_exchange(&self, server: bool, timeout: Duration) -> io::Result<Vec<[u8; CDC_LEN]>> {
        let ours = self.confirm_link();
        let mut bytes = [0u8; CDC_LEN];
        let send = |b: &mut [u8; CDC_LEN], reply: bool| -> io::Result<()> {
            let mut m = LlcMessage::request(LlcBody::ConfirmLink(ours.clone()));
            m.reply = reply;
            m.version = self.llc_version;
            m.emit(b).map_err(|e| io_err(io::ErrorKind::Other, e))?;
            self.post_ctrl(SQ_DEPTH - 1, b, WR_SETUP).map_err(verbs_err)
        };
        // Linux's client opens its LLC flow only after its Confirm has gone out and drops a
        // CONFIRM LINK that comes before (smc_llc_event_handler: no flow → dropped); Linux's
        // own server answers a Confirm after ≈ 3.5 ms (lab capture), ours in 0.1 ms and lost
        // that race once in four runs. So in a v2 group the server waits a little first and
        // repeats its request while unanswered (a v2 peer drops out-of-flow CONFIRM LINKs,
        // Linux and `LgrMachine` alike).
        let v2 = self.llc_version == LlcVersion::V2;
        if server {
            if v2 {
                std::thread::sleep(CONFIRM_LINK_V2_DELAY);
            }
            send(&mut bytes, false)?;
        }
        let start = Instant::now();
        let deadline = start + timeout;
        let mut resend_at = start + CONFIRM_LINK_V2_REPEAT;
        let (mut peer, mut sent_done, mut early) = (None, !server, Vec::new());
        while peer.is_none() || !sent_done {
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return Err(io_err(io::ErrorKind::TimedOut, "CONFIRM LINK timed out"));
            }
            if server && v2 && peer.is_none() && now >= resend_at {
                tracing::debug!("CONFIRM LINK unanswered, sent again");
                send(&mut bytes, false)?;
                resend_at = now + CONFIRM_LINK_V2_REPEAT;
            }
            let wait = if server && v2 && peer.is_none() {
                left.min(resend_at.saturating_duration_since(now))
            } else {
                left
            };
            let Some(wc) = self.cq.wait(Some(wait.max(Duration::from_millis(1)))) else {
                continue;
            };
            if wc.status != WcStatus::Success {
                return Err(io_err(
                    io::ErrorKind::ConnectionAborted,
                    format!("CONFIRM LINK: {:?}", wc.status),
                ));
            }
            if wc.opcode != WcOpcode::Recv {
                sent_done = true;
                continue;
            }
            let off = (SQ_DEPTH as usize + wc.wr_id as usize) * SLOT;
            let mut b = [0u8; SLOT];
            let _ = self.ctrl.read(off, &mut b);
            let rwr = RecvWr {
                wr_id: wc.wr_id,
                sg_list: vec![self.ctrl.sge(off, SLOT as u32)],
            };
            self.qp.post_recv(&[rwr]).map_err(verbs_err)?;
            if b[0] == CDC_TYPE {
                let mut c = [0u8; CDC_LEN];
                c.copy_from_slice(&b[..CDC_LEN]);
                early.push(c);
                continue;
            }
            match LlcMessage::parse(&b[..(wc.byte_len as usize).min(SLOT)]) {
                Ok(m) if m.version != self.llc_version => {
                    return Err(io_err(
                        io::ErrorKind::InvalidData,
                        format!("{:?} LLC in a {:?} link group", m.version, self.llc_version),
                    ));
                }
                Ok(LlcMessage {
                    body: LlcBody::ConfirmLink(c),
                    reply,
                    ..
                }) if reply == server => {
                    // A2.15: the link's peer is the one the CLC named.
                    if c.flags & CONFIRM_LINK_NO_RMBE_EYECATCHER != CONFIRM_LINK_NO_RMBE_EYECATCHER {
                        return Err(io_err(io::ErrorKind::InvalidData, "peer uses RMBE eyecatchers"));
                    }
                    if c.qpn != self.peer_qpn || c.gid != self.peer_gid {
                        return Err(io_err(
                            io::ErrorKind::InvalidData,
                            "CONFIRM LINK names another QP or GID than the CLC",
                        ));
                    }
                    if !server {
                        send(&mut bytes, true)?;
                    }
                    peer = Some(c);
                }
                Ok(m) => tracing::warn!(?m, "unexpected LLC during CONFIRM LINK, ignored"),
                Err(e) => return Err(io_err(io::ErrorKind::InvalidData, format!("LLC: {e}"))),
            }
        }
        Ok(early)
    }

    /// The link is confirmed: register the group and start its progress thread.
    pub(super) fn start(self) -> io::Result<Arc<Self>> {
        self.lock().link_state = LinkState::Active;
        let g = Arc::new(self);
        stats_init();
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&g));
        let g2 = Arc::clone(&g);
        let spawned = std::thread::Builder::new()
            .name(format!("smc-lgr-{}", g.id))
            .spawn(move || g2.progress());
        if let Err(e) = spawned {
            unregister(g.id);
            return Err(e);
        }
        Ok(g)
    }

    /// Subsequent contact with a new RMB: CONFIRM RKEY and wait for the positive reply
    /// (SMC-SC-2/5, SMC-SC-9) before the CLC message that names it.
    pub(super) fn confirm_rkey_wait(&self, rkey: u32, vaddr: u64) -> io::Result<()> {
        let mut st = self.lock();
        let deadline = Instant::now() + crate::lgr::LLC_WAIT + Duration::from_secs(1);
        loop {
            match st.lgr.confirm_rkey(rkey, vaddr, Instant::now()) {
                Ok(()) => break,
                Err(_) if st.lgr.terminated().is_some() => {
                    return Err(io_err(io::ErrorKind::ConnectionAborted, "link group ended"));
                }
                Err(_) => {
                    if Instant::now() >= deadline {
                        return Err(io_err(io::ErrorKind::TimedOut, "CONFIRM RKEY busy"));
                    }
                    st = self
                        .cv
                        .wait_timeout(st, TICK)
                        .map(|r| r.0)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
            }
        }
        self.lgr_actions(&mut st);
        loop {
            if let Some((k, ok)) = st.rkey_result
                && k == rkey
            {
                st.rkey_result = None;
                return if ok {
                    Ok(())
                } else {
                    Err(io_err(io::ErrorKind::ConnectionRefused, "CONFIRM RKEY refused"))
                };
            }
            if st.lgr.terminated().is_some() || Instant::now() >= deadline {
                return Err(io_err(io::ErrorKind::TimedOut, "CONFIRM RKEY not answered"));
            }
            st = self
                .cv
                .wait_timeout(st, TICK)
                .map(|r| r.0)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Carries out what the link-group machine asks.
    pub(super) fn lgr_actions(&self, st: &mut GState) {
        while let Some(a) = st.lgr.poll_action() {
            match a {
                LgrAction::SendLlc { msg: b, .. } => {
                    let slot = st.sq.next_slot;
                    st.sq.next_slot = st.sq.next_slot.wrapping_add(1);
                    if st.sq.outstanding < SQ_DEPTH && self.post_ctrl(slot, &b, WR_LLC).is_ok() {
                        st.sq.outstanding += 1;
                    } else {
                        tracing::warn!("LLC message could not be posted");
                    }
                }
                LgrAction::RkeyConfirmed { rkey, ok } => st.rkey_result = Some((rkey, ok)),
                LgrAction::Terminate(why) => {
                    st.link_state = LinkState::Failed;
                    st.terminated_at = Some(Instant::now());
                    let text = why.to_string();
                    for s in st.conns.values_mut() {
                        if why != TermReason::Idle {
                            Self::slot_failed(s, text.clone());
                        }
                    }
                    unregister(self.id);
                }
                // The engine runs one link per group (max_links 1, no ADD LINK retry): the
                // machine asks for none of the multi-link steps.
                other @ (LgrAction::AddLinkDue
                | LgrAction::AddLinkRequest { .. }
                | LgrAction::AddLinkPeer { .. }
                | LgrAction::LinkUp { .. }
                | LgrAction::LinkFailed { .. }
                | LgrAction::LinkFree { .. }) => {
                    tracing::warn!(?other, "multi-link LLC step in a single-link group, ignored");
                }
            }
        }
        self.cv.notify_all();
        st.wakers.drain(..).for_each(std::task::Waker::wake);
    }

    pub(super) fn on_completion(&self, st: &mut GState, wc: &WorkCompletion, now: Instant) {
        if wc.status != WcStatus::Success {
            if st.lgr.terminated().is_none() {
                st.lgr
                    .link_error(format!("completion {:?} for {:?}", wc.status, wc.opcode));
            }
            if wc.opcode != WcOpcode::Recv && wc.wr_id & WR_SETUP == 0 {
                st.sq.outstanding = st.sq.outstanding.saturating_sub(1);
            }
            return;
        }
        match wc.opcode {
            WcOpcode::Recv => {
                let slot = (SQ_DEPTH as usize + wc.wr_id as usize) * SLOT;
                let mut b = [0u8; SLOT];
                let ok = wc.byte_len as usize >= CDC_LEN && self.ctrl.read(slot, &mut b).is_ok();
                st.lgr.on_rx(now);
                if !ok {
                    tracing::warn!(len = wc.byte_len, "short message on the link, dropped");
                } else if b[0] == CDC_TYPE {
                    match Cdc::parse(&b[..CDC_LEN]) {
                        Ok(m) => {
                            let GState {
                                conns,
                                by_token,
                                sq,
                                unknown_tokens,
                                ..
                            } = &mut *st;
                            match by_token.get(&m.token).copied() {
                                Some(cid) => {
                                    if let Some(s) = conns.get_mut(&cid) {
                                        match s.conn.as_mut() {
                                            Some(c) => {
                                                c.on_cdc(&m);
                                                self.drive(sq, cid, s);
                                            }
                                            None => s.early.push(m),
                                        }
                                    }
                                }
                                // SMC-CDC-11: unknown token, dropped and counted.
                                None => *unknown_tokens += 1,
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "bad CDC, dropped"),
                    }
                } else {
                    st.lgr.on_llc(&b[..(wc.byte_len as usize).min(SLOT)], now);
                }
                let rwr = RecvWr {
                    wr_id: wc.wr_id,
                    sg_list: vec![self.ctrl.sge(slot, SLOT as u32)],
                };
                if let Err(e) = self.qp.post_recv(&[rwr]) {
                    st.lgr.link_error(format!("post recv: {e}"));
                }
            }
            _ if wc.wr_id & WR_SETUP != 0 => {} // the client's CONFIRM LINK reply, not counted
            _ => {
                st.sq.outstanding = st.sq.outstanding.saturating_sub(1);
                let cid = ((wc.wr_id >> 32) & WR_CID_MASK) as u32;
                if wc.wr_id & WR_WRITE != 0 {
                    if let Some(c) = st.conns.get_mut(&cid).and_then(|s| s.conn.as_mut()) {
                        c.writes_completed(wc.wr_id & 0xFFFF_FFFF);
                    }
                } else if wc.wr_id & WR_CDC != 0
                    && let Some(c) = st.conns.get_mut(&cid).and_then(|s| s.conn.as_mut())
                {
                    c.cdc_completed((wc.wr_id & 0xFFFF) as u16);
                }
            }
        }
    }

    /// The group's progress thread: one per link group, whatever the number of connections.
    pub(super) fn progress(self: Arc<Self>) {
        let mut wcs = Vec::with_capacity(64);
        loop {
            let timeout = {
                let st = self.lock();
                let now = Instant::now();
                st.lgr
                    .next_deadline()
                    .map_or(TICK, |d| d.saturating_duration_since(now))
                    .clamp(Duration::from_millis(1), TICK)
            };
            let first = self.cq.wait(Some(timeout));
            let mut st = self.lock();
            let now = Instant::now();
            if let Some(wc) = &first {
                self.on_completion(&mut st, wc, now);
                wcs.clear();
                self.cq.poll(&mut wcs, 64);
                for wc in &wcs {
                    self.on_completion(&mut st, wc, now);
                }
            }
            st.lgr.on_tick(now);
            self.lgr_actions(&mut st);
            self.housekeeping(&mut st, now);
            self.lgr_actions(&mut st);
            self.cv.notify_all();
            st.wakers.drain(..).for_each(std::task::Waker::wake);
            // The QP stays a little after the end so that the peer's own DELETE LINK (Linux
            // answers ours with one) is acknowledged rather than retried into a link error.
            if let Some(t) = st.terminated_at
                && st.conns.is_empty()
                && (st.sq.outstanding == 0 && now.duration_since(t) >= PEER_DRAIN
                    || now.duration_since(t) > Duration::from_secs(1))
            {
                break;
            }
        }
        unregister(self.id);
        tracing::debug!(id = self.id, "link group freed");
    }

    pub(super) fn fill(&self, snap: &mut Snapshot) {
        let st = self.lock();
        let k = st.lgr.counters();
        let elem_len = st.rmbs.first().map_or(0, |r| r.elem_len);
        let used: usize = st.rmbs.iter().map(|r| r.used.iter().filter(|u| **u).count()).sum();
        let total: usize = st.rmbs.iter().map(|r| r.used.len()).sum();
        snap.link_groups.push(LinkGroupStat {
            id: self.id,
            role: self.key.role,
            peer_id: self.key.peer_id.iter().map(|b| format!("{b:02x}")).collect(),
            links: vec![LinkStat {
                link_num: 1,
                state: st.link_state,
                device: self.dev.name().to_string(),
                local_gid: stats::gid_text(&self.local_gid),
                peer_gid: stats::gid_text(&self.peer_gid),
                local_qpn: self.qp.qp_num(),
                peer_qpn: self.peer_qpn,
                link_uid: self.link_uid,
                llc_sent: k.llc_sent,
                llc_received: k.llc_received,
                test_links: k.test_links,
            }],
            conns: st.conns.len() as u32,
            rmbs: st.rmbs.len() as u32,
            element_size: elem_len,
            elements_used: used as u32,
            elements_total: total as u32,
            lingering: st.lgr.lingering(),
        });
        for s in st.conns.values() {
            snap.connections.push(ConnStat {
                local: s.local.clone(),
                peer: s.peer.clone(),
                mode: ConnMode::SmcR,
                link_group: Some(self.id),
                link: Some(1),
                token: Some(s.token),
                rmbe_idx: Some((s.elem + 1) as u8),
                state: match (&s.conn, &s.link_error) {
                    (_, Some(_)) => "link failed".into(),
                    (None, _) => "setup".into(),
                    (Some(c), _) => format!("{:?}", c.state()),
                },
                bytes_sent: s.accepted,
                bytes_received: s.received,
                ..ConnStat::default()
            });
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        LIVE_LINKS.fetch_sub(1, Ordering::AcqRel);
        let c = stats::counters();
        let st = self.st.get_mut().unwrap_or_else(|p| p.into_inner());
        for _ in 0..st.rmbs.len() {
            stats::dec(&c.mrs);
        }
        // Slots still here (a group dropped during setup): their element and send buffer.
        for s in st.conns.values() {
            stats::dec(&c.mrs);
            stats::dec(&c.rmb_elements);
            if s.conn.is_some() {
                stats::dec(&c.smc_conns);
            }
        }
        for a in [&c.link_groups, &c.links, &c.qps, &c.mrs] {
            stats::dec(a);
        }
    }
}
