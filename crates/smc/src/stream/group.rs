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

/// An RMB: one memory carved into equal elements (A1.10), registered in the PD of every
/// link of the group (the same memory on each link, a key per link: A4.7, A4.8).
pub(super) struct Rmb {
    /// The first registration (the one element reads and writes go through).
    pub(super) mr: MemoryRegion,
    /// The link `mr` was registered for.
    pub(super) link: u8,
    /// Its registrations on the group's other links.
    pub(super) alt: Vec<(u8, MemoryRegion)>,
    pub(super) elem_len: u32,
    pub(super) used: Vec<bool>,
}

impl Rmb {
    /// Its registration on link `link`.
    pub(super) fn on(&self, link: u8) -> Option<&MemoryRegion> {
        if self.link == link {
            return Some(&self.mr);
        }
        self.alt.iter().find(|(l, _)| *l == link).map(|(_, m)| m)
    }
}

pub(super) struct GState {
    pub(super) lgr: LgrMachine,
    /// Keyed by our connection ids and our alert tokens (both ours to choose; a peer's CDC
    /// only looks a token up): Fx hashing, not SipHash, on the per-message lookups.
    pub(super) conns: FxHashMap<u32, Slot>,
    pub(super) by_token: FxHashMap<u32, u32>,
    pub(super) next_cid: u32,
    pub(super) rmbs: Vec<Rmb>,
    pub(super) links: Links,
    pub(super) rkey_result: Option<(u32, bool)>,
    /// The group's state: Active once its first link is confirmed, Failed once it ended.
    pub(super) link_state: LinkState,
    pub(super) terminated_at: Option<Instant>,
    pub(super) unknown_tokens: u64,
    /// Async tasks waiting on a connection of the group (`async_io`): woken with the
    /// condition variable's waiters.
    pub(super) wakers: Vec<std::task::Waker>,
    /// Who takes the completions off the link's CQ (leader/follower, issue 15 session 13).
    pub(super) leader: Leader,
    /// Threads asleep on [`Group::cv`] (followers, setup): `notify_all` only when there are.
    pub(super) cv_waiters: u32,
    /// When an application thread last polled the CQ itself: the progress thread stays off
    /// the CQ for [`SmcConfig::progress_linger`] after it.
    pub(super) caller_seen: Option<Instant>,
    /// Completions taken off a CQ, kept between [`Group::apply`] calls so that applying a
    /// batch allocates nothing per message (issue 15, session 15).
    pub(super) wc_buf: Vec<WorkCompletion>,
}

/// Who polls a link group's CQ. A reader or writer that has to wait takes the CQ itself
/// (one link, group active): it sleeps in the CQ (with the RoCE provider's inline wait, in
/// `poll(2)` on the device's socket), applies what arrives and wakes only the threads the
/// completions concern, so the octets a reader waits for reach it with one wake-up, as a
/// blocking TCP reader's do. Other waiters sleep on the condition variable (followers) and
/// one of them leads when the leader leaves. The progress thread polls only when no
/// application thread has for [`SmcConfig::progress_linger`] (async tasks, idle
/// connections, LLC while nobody reads) and leaves at once when one comes
/// ([`CompletionQueue::interrupt`]); it keeps the timers either way.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Leader {
    None,
    Caller(std::thread::ThreadId),
    Progress,
}

/// A link group: up to two links (one per RoCE device) and its connections.
pub(super) struct Group {
    pub(super) id: u32,
    pub(super) key: GroupKey,
    /// The device of the first link, and the second device a second link may use
    /// ([`SmcConfig::alt_device`]; v1 groups only).
    pub(super) devs: Vec<Device>,
    /// The group's LLC form (v2 after a v2 CLC exchange).
    pub(super) llc_version: LlcVersion,
    pub(super) st: Mutex<GState>,
    pub(super) cv: Condvar,
    /// The progress thread sleeps here while application threads poll the CQ.
    pub(super) pcv: Condvar,
    /// [`SmcConfig::progress_linger`].
    pub(super) progress_linger: Duration,
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
        .filter(|g| g.key == *key)
        .cloned()
        .collect();
    cands.into_iter().find(|g| {
        let st = g.lock();
        st.lgr.usable()
            && st.link_state == LinkState::Active
            && st.conns.len() < 255
            && peer_qpn.is_none_or(|q| st.links.active_to(q).is_some())
    })
}

pub(super) fn unregister(id: u32) {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|g| g.id != id);
}

impl Group {
    /// A new group and its first link: PD, CQ, RC QP in INIT with receives posted (first
    /// contact). `clc_version`: the version the CLC exchange agreed (2 = SMC-Rv2, Linux's
    /// v2 LLC form).
    pub(super) fn new(
        dev: &Device,
        key: GroupKey,
        cfg: &SmcConfig,
        me: ([u8; 16], [u8; 6]),
        clc_version: u8,
    ) -> io::Result<Self> {
        let first = Link::new(dev, 1, me)?;
        stats::inc(&stats::counters().link_groups);
        let llc_version = if clc_version >= 2 {
            LlcVersion::V2
        } else {
            LlcVersion::V1
        };
        // A v2 group (a Linux peer over SMC-Rv2) keeps one link: `LgrConfig::new`'s
        // max_links 1, no ADD LINK of ours; its ADD LINK is rejected in the v2 form. The
        // second link (ADD LINK, failover) is for v1 groups with a second device here.
        let mut devs = vec![dev.clone()];
        if let Some(alt) = cfg.alt_device.as_ref().filter(|a| !a.same(dev)) {
            devs.push(alt.clone());
        }
        let two = devs.len() > 1 && llc_version == LlcVersion::V1;
        let lcfg = LgrConfig {
            linger: cfg.linger,
            keepalive: cfg.keepalive,
            version: llc_version,
            max_links: if two { 2 } else { 1 },
            add_link_retry: (two && key.role == Role::Server).then_some(cfg.add_link_retry),
            ..LgrConfig::new(key.role)
        };
        Ok(Self {
            id: NEXT_GROUP_ID.fetch_add(1, Ordering::Relaxed),
            key,
            devs,
            llc_version,
            st: Mutex::new(GState {
                lgr: LgrMachine::new(lcfg, Instant::now()),
                conns: FxHashMap::default(),
                by_token: FxHashMap::default(),
                next_cid: 1,
                rmbs: Vec::new(),
                links: Links {
                    v: vec![LinkSt::new(first)],
                },
                rkey_result: None,
                link_state: LinkState::Activating,
                terminated_at: None,
                unknown_tokens: 0,
                wakers: Vec::new(),
                leader: Leader::None,
                cv_waiters: 0,
                caller_seen: None,
                wc_buf: Vec::new(),
            }),
            cv: Condvar::new(),
            pcv: Condvar::new(),
            progress_linger: cfg.progress_linger,
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, GState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The group's first link (during setup, before the progress thread runs).
    pub(super) fn first_link(&self) -> Arc<Link> {
        Arc::clone(&self.lock().links.v[0].link)
    }

    /// Link `num`, if the group has it.
    pub(super) fn link(&self, num: u8) -> Option<Arc<Link>> {
        self.lock().links.get(num).map(|l| Arc::clone(&l.link))
    }

    /// RTR then RTS of the first link towards the peer described by its Accept/Confirm
    /// (A1.11 values).
    pub(super) fn connect(&mut self, peer: &AcceptConfirm) -> io::Result<()> {
        self.first_link().connect(peer.gid, peer.qpn, peer.psn, peer.qp_mtu)
    }

    /// Our CONFIRM LINK of the first contact (A.3.1): Linux's no-eyecatcher flags; max
    /// links 2 when a second device is there (v1).
    pub(super) fn confirm_link(&self, l: &Link) -> ConfirmLink {
        ConfirmLink {
            flags: CONFIRM_LINK_NO_RMBE_EYECATCHER,
            mac: l.local_mac,
            gid: l.local_gid,
            qpn: l.qp.qp_num(),
            link_num: 1,
            link_uid: l.link_uid.to_be_bytes(),
            max_links: self.lock().lgr.config().max_links,
            max_conns: 255,
        }
    }

    /// The first-contact CONFIRM LINK exchange on the new QP (A4.2, §3.5.1.5): the server
    /// sends the request once in RTS, the client answers with R set. Returns the CDCs that
    /// arrived behind it (kept for the connection machine). Runs before the progress thread.
    pub(super) fn confirm_link_exchange(&self, server: bool, timeout: Duration) -> io::Result<Vec<[u8; CDC_LEN]>> {
        let l = self.first_link();
        let ours = self.confirm_link(&l);
        let mut bytes = [0u8; CDC_LEN];
        let send = |b: &mut [u8; CDC_LEN], reply: bool| -> io::Result<()> {
            let mut m = LlcMessage::request(LlcBody::ConfirmLink(ours.clone()));
            m.reply = reply;
            m.version = self.llc_version;
            m.emit(b).map_err(|e| io_err(io::ErrorKind::Other, e))?;
            l.post_ctrl(SQ_DEPTH - 1, b, WR_SETUP).map_err(verbs_err)
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
            let Some(wc) = l.cq.wait(Some(wait.max(Duration::from_millis(1)))) else {
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
            let mut b = [0u8; SLOT];
            let _ = l.read_recv(wc.wr_id, &mut b);
            l.repost_recv(wc.wr_id).map_err(verbs_err)?;
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
                    if c.qpn != l.peer_qpn() || c.gid != l.peer_gid() {
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
        {
            let mut st = self.lock();
            st.link_state = LinkState::Active;
            st.links.v[0].state = LinkState::Active;
        }
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

    /// Subsequent contact with a new RMB (index `ri`): CONFIRM RKEY with its RToken on the
    /// primary link and on the group's other active links (E-3), and wait for the positive
    /// reply (SMC-SC-2/5, SMC-SC-9) before the CLC message that names it.
    pub(super) fn confirm_rkey_wait(&self, ri: usize) -> io::Result<()> {
        let mut st = self.lock();
        let deadline = Instant::now() + crate::lgr::LLC_WAIT + Duration::from_secs(1);
        let rkey = loop {
            let toks = st.lgr.primary().and_then(|p| {
                let r = st.rmbs.get(ri)?;
                let m = r.on(p)?;
                let others: Vec<crate::wire::llc::LinkRtoken> = st
                    .lgr
                    .links()
                    .iter()
                    .filter(|l| **l != p)
                    .filter_map(|l| {
                        r.on(*l).map(|m| crate::wire::llc::LinkRtoken {
                            link_num: *l,
                            rkey: m.rkey(),
                            vaddr: m.addr(),
                        })
                    })
                    .collect();
                Some((m.rkey(), m.addr(), others))
            });
            let res = match toks {
                Some((rkey, vaddr, others)) => st
                    .lgr
                    .confirm_rkey_links(rkey, vaddr, others, Instant::now())
                    .map(|()| rkey),
                None => Err(crate::lgr::Busy),
            };
            match res {
                Ok(rkey) => break rkey,
                Err(_) if st.lgr.terminated().is_some() => {
                    return Err(io_err(io::ErrorKind::ConnectionAborted, "link group ended"));
                }
                Err(_) => {
                    if Instant::now() >= deadline {
                        return Err(io_err(io::ErrorKind::TimedOut, "CONFIRM RKEY busy"));
                    }
                    st = self.wait_cv(st, TICK);
                }
            }
        };
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
            st = self.wait_conn(st, TICK);
        }
    }

    /// Carries out what the link-group machine asks.
    pub(super) fn lgr_actions(&self, st: &mut GState) {
        while let Some(a) = st.lgr.poll_action() {
            match a {
                LgrAction::SendLlc { link, msg: b } => match st.links.get_mut(link) {
                    Some(l) if l.outstanding < SQ_DEPTH => {
                        let slot = l.next_slot;
                        l.next_slot = l.next_slot.wrapping_add(1);
                        if l.link.post_ctrl(slot, &b, WR_LLC).is_ok() {
                            l.outstanding += 1;
                        } else {
                            tracing::warn!(link, "LLC message could not be posted");
                        }
                    }
                    _ => tracing::warn!(link, "LLC message for a link without room or gone, dropped"),
                },
                LgrAction::RkeyConfirmed { rkey, ok } => st.rkey_result = Some((rkey, ok)),
                LgrAction::Terminate(why) => {
                    st.link_state = LinkState::Failed;
                    st.terminated_at = Some(Instant::now());
                    for l in &mut st.links.v {
                        l.state = LinkState::Failed;
                    }
                    let text = why.to_string();
                    for s in st.conns.values_mut() {
                        if why != TermReason::Idle {
                            Self::slot_failed(s, text.clone());
                        }
                    }
                    unregister(self.id);
                }
                LgrAction::AddLinkDue => self.srv_add_link(st),
                LgrAction::AddLinkRequest { link, peer } => self.cli_add_link(st, link, &peer),
                LgrAction::AddLinkPeer { link, peer } => {
                    let r = match st.links.get(link) {
                        Some(l) => l.link.connect(peer.gid, peer.qpn, peer.psn, peer.qp_mtu),
                        None => Err(io_err(io::ErrorKind::NotFound, "no such link")),
                    };
                    if let Err(e) = r {
                        st.lgr
                            .link_failed(link, format!("new QP to RTR/RTS: {e}"), Instant::now());
                    }
                }
                LgrAction::LinkUp { link } => {
                    if let Some(l) = st.links.get_mut(link) {
                        l.state = LinkState::Active;
                        tracing::info!(group = self.id, link, dev = l.link.dev.name(), "second link up");
                    }
                }
                LgrAction::LinkFailed { failed, to } => self.fail_over(st, failed, to),
                LgrAction::LinkFree { link, why } => {
                    tracing::info!(group = self.id, link, %why, "link freed");
                    Self::free_link(st, link);
                }
            }
        }
        self.wake_waiters(st);
    }

    /// Wakes whoever waits on the group: the followers on the condition variable (a
    /// `futex` call only when there are), the async tasks, and an application thread
    /// asleep in the CQ as leader unless it is this thread.
    pub(super) fn wake_waiters(&self, st: &mut GState) {
        if st.cv_waiters > 0 {
            self.cv.notify_all();
        }
        st.wakers.drain(..).for_each(std::task::Waker::wake);
        if let Leader::Caller(t) = st.leader
            && t != std::thread::current().id()
        {
            st.links.v.iter().for_each(|l| l.link.cq.interrupt());
        }
    }

    /// Sleeps on the condition variable for at most `timeout` (counted in `cv_waiters`).
    pub(super) fn wait_cv<'a>(&'a self, mut st: MutexGuard<'a, GState>, timeout: Duration) -> MutexGuard<'a, GState> {
        st.cv_waiters += 1;
        let mut st = self
            .cv
            .wait_timeout(st, timeout)
            .map(|r| r.0)
            .unwrap_or_else(|p| p.into_inner().0);
        st.cv_waiters -= 1;
        st
    }

    /// The group's one link while callers may poll it themselves: one active link and the
    /// group not ended (with two, failover and ADD LINK stay with the progress thread).
    fn lone_link(st: &GState) -> Option<Arc<Link>> {
        match st.links.v.as_slice() {
            [l] if l.state == LinkState::Active
                && st.link_state == LinkState::Active
                && st.lgr.terminated().is_none() =>
            {
                Some(Arc::clone(&l.link))
            }
            _ => None,
        }
    }

    /// A blocking reader's or writer's wait (up to `timeout`) for something to change on
    /// the group: it takes the CQ itself when nobody else does and applies what arrives
    /// (see [`Leader`]), else it sleeps on the condition variable as a follower. The caller
    /// re-checks its condition afterwards.
    pub(super) fn wait_conn<'a>(&'a self, mut st: MutexGuard<'a, GState>, timeout: Duration) -> MutexGuard<'a, GState> {
        let me = std::thread::current().id();
        let link = match st.leader {
            Leader::Caller(_) => None,
            _ => Self::lone_link(&st),
        };
        let Some(link) = link else {
            return self.wait_cv(st, timeout);
        };
        let prev = std::mem::replace(&mut st.leader, Leader::Caller(me));
        // taken under the group's lock: a thread that changes what this one waits for
        // after it (and interrupts the leader) ends the wait below even before it begins
        let mut epoch = link.cq.interrupt_epoch();
        drop(st);
        if prev == Leader::Progress {
            // the progress thread leaves the CQ to us (our own interrupt does not end ours)
            link.cq.interrupt();
            epoch += 1;
        }
        let first = link.cq.wait_spin_since(Duration::ZERO, Some(timeout), epoch);
        let mut st = self.lock();
        let now = Instant::now();
        let k = engine_counters();
        k.caller_waits.fetch_add(1, Ordering::Relaxed);
        let wake = self.apply(
            &mut st,
            std::slice::from_ref(&link),
            first.map(|wc| (link.num(), wc)),
            now,
            true,
        );
        if wake && st.cv_waiters > 0 {
            k.handoffs.fetch_add(1, Ordering::Relaxed);
        }
        if st.leader == Leader::Caller(me) {
            st.leader = Leader::None;
        }
        st.caller_seen = Some(now);
        self.lgr_actions(&mut st);
        st
    }

    /// A nonblocking reader's or writer's poll of the CQ before it says `WouldBlock` (a
    /// busy reader spins here, on the CQ itself): what is queued or on the device's socket
    /// is applied now. `true` if a completion was applied. Only when nobody else polls (a
    /// progress thread in the CQ is told to leave; the next call polls).
    pub(super) fn poll_conn(&self, st: &mut GState) -> bool {
        let Some(link) = Self::lone_link(st) else {
            return false;
        };
        let now = Instant::now();
        match st.leader {
            Leader::None => {}
            Leader::Progress => {
                st.caller_seen = Some(now);
                link.cq.interrupt();
                return false;
            }
            Leader::Caller(_) => return false,
        }
        st.caller_seen = Some(now);
        let Some(wc) = link.cq.poll_one() else {
            return false;
        };
        engine_counters().caller_polls.fetch_add(1, Ordering::Relaxed);
        let wake = self.apply(st, std::slice::from_ref(&link), Some((link.num(), wc)), now, true);
        if wake && st.cv_waiters > 0 {
            engine_counters().handoffs.fetch_add(1, Ordering::Relaxed);
        }
        self.lgr_actions(st);
        true
    }

    /// Applies `first` and whatever else `links`' CQs hold; whether any of it can matter
    /// to a waiter. `caller`: an application thread applies them (counted apart).
    fn apply(
        &self,
        st: &mut GState,
        links: &[Arc<Link>],
        first: Option<(u8, WorkCompletion)>,
        now: Instant,
        caller: bool,
    ) -> bool {
        let Some((n, wc)) = first else {
            return false;
        };
        let k = engine_counters();
        let count = |n: usize| {
            let c = if caller {
                &k.caller_completions
            } else {
                &k.progress_completions
            };
            c.fetch_add(n as u64, Ordering::Relaxed);
        };
        let mut wake = self.on_completion(st, n, &wc, now);
        count(1);
        let mut wcs = std::mem::take(&mut st.wc_buf);
        for l in links {
            loop {
                wcs.clear();
                // An application thread takes only what is queued: driving the provider
                // here would first send on its own the ACK its receive deferred (to ride
                // with the reply the caller is about to post) and then find the socket
                // empty, two system calls and a datagram per message (session 14). What
                // arrives later is received by the next wait, which flushes deferred
                // transmissions before it sleeps.
                let got = if caller {
                    l.cq.poll_queued(&mut wcs, 64)
                } else {
                    l.cq.poll(&mut wcs, 64)
                };
                if got == 0 {
                    break;
                }
                count(wcs.len());
                for wc in &wcs {
                    wake |= self.on_completion(st, l.num(), wc, now);
                }
                if wcs.len() < 64 {
                    break;
                }
            }
        }
        wcs.clear();
        st.wc_buf = wcs;
        wake
    }

    /// A completion of link `link`'s CQ.
    /// Processes one completion. Returns whether it can matter to a thread waiting on the
    /// group (data or a cursor arrived, write space returned, a link failed, LLC): a
    /// successful send completion of a CDC, LLC or setup message changes nothing a reader
    /// or writer waits for, so it wakes nobody.
    pub(super) fn on_completion(&self, st: &mut GState, link: u8, wc: &WorkCompletion, now: Instant) -> bool {
        engine_counters().completions.fetch_add(1, Ordering::Relaxed);
        let quiet = wc.status == WcStatus::Success
            && wc.opcode != WcOpcode::Recv
            && wc.wr_id & WR_WRITE == 0
            && wc.wr_id & (WR_CDC | WR_LLC | WR_SETUP) != 0;
        if !quiet {
            engine_counters().waking_completions.fetch_add(1, Ordering::Relaxed);
        }
        self.complete(st, link, wc, now);
        !quiet
    }

    fn complete(&self, st: &mut GState, link: u8, wc: &WorkCompletion, now: Instant) {
        let Some(ls) = st.links.get_mut(link) else {
            return; // a freed link's last completions
        };
        let l = Arc::clone(&ls.link);
        let counted = wc.opcode != WcOpcode::Recv && wc.wr_id & WR_SETUP == 0;
        if wc.status != WcStatus::Success || ls.state == LinkState::Failed {
            if counted {
                ls.outstanding = ls.outstanding.saturating_sub(1);
            }
            // A failed link's completions (flushed or late) are not reported: its
            // connections were moved and replay what the peer may lack (SMC-FO-3).
            if wc.status != WcStatus::Success && ls.state != LinkState::Failed {
                ls.state = LinkState::Failed;
                if st.lgr.terminated().is_none() {
                    tracing::warn!(group = self.id, link, status = ?wc.status, "link failed");
                    st.lgr
                        .link_failed(link, format!("completion {:?} for {:?}", wc.status, wc.opcode), now);
                }
            }
            return;
        }
        match wc.opcode {
            WcOpcode::Recv => {
                let mut b = [0u8; SLOT];
                let ok = wc.byte_len as usize >= CDC_LEN && l.read_recv(wc.wr_id, &mut b);
                st.lgr.on_rx(now);
                if !ok {
                    tracing::warn!(len = wc.byte_len, "short message on the link, dropped");
                } else if b[0] == CDC_TYPE {
                    match Cdc::parse(&b[..CDC_LEN]) {
                        Ok(m) => {
                            let GState {
                                conns,
                                by_token,
                                links,
                                unknown_tokens,
                                ..
                            } = &mut *st;
                            match by_token.get(&m.token).copied() {
                                Some(cid) => {
                                    if let Some(s) = conns.get_mut(&cid) {
                                        match s.conn.as_mut() {
                                            Some(c) => {
                                                c.on_cdc(&m);
                                                self.drive(links, cid, s);
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
                    st.lgr.on_llc_on(link, &b[..(wc.byte_len as usize).min(SLOT)], now);
                }
                if let Err(e) = l.repost_recv(wc.wr_id) {
                    st.lgr.link_failed(link, format!("post recv: {e}"), now);
                }
            }
            _ if wc.wr_id & WR_SETUP != 0 => {} // the client's CONFIRM LINK reply, not counted
            _ => {
                ls.outstanding = ls.outstanding.saturating_sub(1);
                let cid = ((wc.wr_id >> 32) & WR_CID_MASK) as u32;
                let Some(c) = st
                    .conns
                    .get_mut(&cid)
                    .filter(|s| s.link == link)
                    .and_then(|s| s.conn.as_mut())
                else {
                    return;
                };
                if wc.wr_id & WR_WRITE != 0 {
                    c.writes_completed(wc.wr_id & 0xFFFF_FFFF);
                } else if wc.wr_id & WR_CDC != 0 {
                    c.cdc_completed((wc.wr_id & 0xFFFF) as u16);
                }
            }
        }
    }

    /// The group's progress thread: one per link group, whatever the number of connections
    /// and links; it waits on the CQs of all the group's links while no application thread
    /// does ([`Leader`]), and keeps the group's timers.
    pub(super) fn progress(self: Arc<Self>) {
        loop {
            let (timer, timeout, links, lead, epoch) = {
                let mut st = self.lock();
                let now = Instant::now();
                let t = st
                    .lgr
                    .next_deadline()
                    .map_or(TICK, |d| d.saturating_duration_since(now))
                    .clamp(Duration::from_millis(1), TICK);
                // Application threads poll the CQ themselves: stay off it until they have
                // not for `progress_linger` (async tasks need this thread, and two links
                // are this thread's alone: no lingering).
                let linger = st
                    .caller_seen
                    .map(|c| c + self.progress_linger)
                    .filter(|u| *u > now && st.wakers.is_empty() && Self::lone_link(&st).is_some());
                let callers = matches!(st.leader, Leader::Caller(_)) || linger.is_some();
                let links: Vec<Arc<Link>> = st.links.v.iter().map(|l| Arc::clone(&l.link)).collect();
                // taken under the lock the CQ is handed over with: an interrupt from a caller
                // that takes it after this ends the wait below, even before it begins
                let epoch = links.first().map_or(0, |l| l.cq.interrupt_epoch());
                if !callers {
                    st.leader = Leader::Progress;
                }
                let sleep = linger.map_or(t, |u| t.min(u.saturating_duration_since(now)));
                (now + t, sleep.max(Duration::from_micros(100)), links, !callers, epoch)
            };
            let first = if lead {
                wait_any(&links, timeout, epoch)
            } else {
                let st = self.lock();
                drop(self.pcv.wait_timeout(st, timeout));
                if Instant::now() < timer {
                    continue; // the linger ended or an async task came: look again
                }
                None
            };
            let mut st = self.lock();
            if st.leader == Leader::Progress {
                st.leader = Leader::None;
            }
            let now = Instant::now();
            // A pass without completions (a timer) always wakes the waiters (close timers,
            // group ends); one whose completions were all CDC/LLC sends wakes nobody.
            let idle = first.is_none();
            let mut wake = idle;
            if !idle {
                let woke = self.apply(&mut st, &links, first, now, false);
                if woke && (st.cv_waiters > 0 || matches!(st.leader, Leader::Caller(_))) {
                    // a waiting reader or writer gets what this thread applied
                    engine_counters().handoffs.fetch_add(1, Ordering::Relaxed);
                }
                wake |= woke;
            }
            st.lgr.on_tick(now);
            self.lgr_actions(&mut st);
            self.housekeeping(&mut st, now);
            self.lgr_actions(&mut st);
            let k = engine_counters();
            k.passes.fetch_add(1, Ordering::Relaxed);
            if idle {
                k.idle_passes.fetch_add(1, Ordering::Relaxed);
            }
            if wake || st.lgr.terminated().is_some() {
                k.wakeups.fetch_add(1, Ordering::Relaxed);
                self.wake_waiters(&mut st);
            }
            // The QP stays a little after the end so that the peer's own DELETE LINK (Linux
            // answers ours with one) is acknowledged rather than retried into a link error.
            let idle = st.links.v.iter().all(|l| l.outstanding == 0);
            if let Some(t) = st.terminated_at
                && st.conns.is_empty()
                && (idle && now.duration_since(t) >= PEER_DRAIN || now.duration_since(t) > Duration::from_secs(1))
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
        let primary = st.lgr.primary();
        snap.link_groups.push(LinkGroupStat {
            id: self.id,
            role: self.key.role,
            peer_id: self.key.peer_id.iter().map(|b| format!("{b:02x}")).collect(),
            links: st
                .links
                .v
                .iter()
                .map(|l| {
                    let on_primary = Some(l.num()) == primary;
                    LinkStat {
                        link_num: l.num(),
                        // The group's first link carries the group's state during setup.
                        state: if st.link_state != LinkState::Active {
                            st.link_state
                        } else {
                            l.state
                        },
                        device: l.link.dev.name().to_string(),
                        local_gid: stats::gid_text(&l.link.local_gid),
                        peer_gid: stats::gid_text(&l.link.peer_gid()),
                        local_qpn: l.link.qp.qp_num(),
                        peer_qpn: l.link.peer_qpn(),
                        link_uid: l.link.link_uid,
                        // The LLC counters are the group's; shown on the link that carries
                        // its requests.
                        llc_sent: if on_primary { k.llc_sent } else { 0 },
                        llc_received: if on_primary { k.llc_received } else { 0 },
                        test_links: if on_primary { k.test_links } else { 0 },
                    }
                })
                .collect(),
            conns: st.conns.len() as u32,
            rmbs: st.rmbs.len() as u32,
            element_size: elem_len,
            elements_used: used as u32,
            elements_total: total as u32,
            lingering: st.lgr.lingering(),
            failovers: k.failovers,
            links_added: k.links_added,
        });
        for s in st.conns.values() {
            snap.connections.push(ConnStat {
                local: s.local.clone(),
                peer: s.peer.clone(),
                mode: ConnMode::SmcR,
                link_group: Some(self.id),
                link: Some(s.link),
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
        let c = stats::counters();
        let st = self.st.get_mut().unwrap_or_else(|p| p.into_inner());
        for r in &st.rmbs {
            for _ in 0..=r.alt.len() {
                stats::dec(&c.mrs);
            }
        }
        // Slots still here (a group dropped during setup): their element and send buffers.
        for s in st.conns.values() {
            for _ in 0..=s.sndbuf_alt.len() {
                stats::dec(&c.mrs);
            }
            stats::dec(&c.rmb_elements);
            if s.conn.is_some() {
                stats::dec(&c.smc_conns);
            }
        }
        stats::dec(&c.link_groups);
    }
}
