//! The second link of a v1 link group on a second RoCE device, and failover (RFC 7609
//! §3.5.2, §4.2; requirements A4.7, A4.8, A5, SMC-FO-1..5). The decisions are the link-group
//! machine's ([`crate::lgr::LgrMachine`]); this carries them out: the server makes a QP on
//! its free device and offers it (ADD LINK), the client answers with a QP on its own, both
//! register every RMB and send buffer in the new link's PD (the same memory, a key per
//! link) and exchange the RTokens; when a link fails, its connections move to the survivor
//! with the peer's RTokens there and replay what the peer may lack (`Conn::failover`).

use super::*;
use crate::wire::llc::{AddLink, RtokenPair, add_link_reject};

/// RMBs are remotely writable only (A1.11).
pub(super) const RMB_ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

impl Links {
    /// The active link whose peer QP is `qpn`.
    pub(super) fn active_to(&self, qpn: u32) -> Option<u8> {
        self.v
            .iter()
            .find(|l| l.state == LinkState::Active && l.link.peer_qpn() == qpn & 0x00FF_FFFF)
            .map(LinkSt::num)
    }
}

impl Group {
    /// A device of the group that no live link uses (the one a new link goes on).
    fn free_device(&self, st: &GState) -> Option<Device> {
        if st.lgr.config().max_links < 2 {
            return None;
        }
        self.devs
            .iter()
            .find(|d| !st.links.v.iter().any(|l| l.link.dev.same(d)))
            .cloned()
    }

    /// Registers every RMB and send buffer of the group in `link`'s PD; returns the RToken
    /// pairs (RKey on `carrier`, RKey and VA on the new link) and the registrations, which
    /// the caller attaches once the link has its number ([`Self::attach`]).
    fn register_all(st: &GState, link: &Link, carrier: u8) -> io::Result<(Vec<RtokenPair>, Registrations)> {
        let mut pairs = Vec::new();
        let mut regs = Registrations::default();
        for r in &st.rmbs {
            let reference = r
                .on(carrier)
                .ok_or_else(|| io_err(io::ErrorKind::NotFound, "an RMB has no key on the carrying link"))?;
            let m = link.pd.reg_mr_shared(&r.mr, RMB_ACCESS).map_err(verbs_err)?;
            pairs.push(RtokenPair {
                ref_rkey: reference.rkey(),
                new_rkey: m.rkey(),
                new_vaddr: m.addr(),
            });
            regs.rmbs.push(m);
        }
        for (cid, s) in &st.conns {
            let m = link
                .pd
                .reg_mr_shared(&s.sndbuf, Access::LOCAL_WRITE)
                .map_err(verbs_err)?;
            regs.sndbufs.push((*cid, m));
        }
        Ok((pairs, regs))
    }

    /// Gives the registrations of a new link (number `num`) to their RMBs and connections.
    fn attach(st: &mut GState, num: u8, regs: Registrations) {
        let c = stats::counters();
        for (r, m) in st.rmbs.iter_mut().zip(regs.rmbs) {
            stats::inc(&c.mrs);
            r.alt.push((num, m));
        }
        for (cid, m) in regs.sndbufs {
            if let Some(s) = st.conns.get_mut(&cid) {
                stats::inc(&c.mrs);
                s.sndbuf_alt.push((num, m));
            }
        }
    }

    /// Server, [`LgrAction::AddLinkDue`]: a QP on the free device, offered with ADD LINK.
    pub(super) fn srv_add_link(&self, st: &mut GState) {
        let Some(dev) = self.free_device(st) else { return };
        let Some(carrier) = st.lgr.primary() else { return };
        if st.lgr.adding_link().is_some() || st.lgr.terminated().is_some() {
            return;
        }
        let made = Link::addr_of(&dev).and_then(|me| {
            let link = Link::new(&dev, 0, me)?;
            let (pairs, regs) = Self::register_all(st, &link, carrier)?;
            Ok((link, pairs, regs))
        });
        let (link, pairs, regs) = match made {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(group = self.id, dev = dev.name(), error = %e, "no second link now");
                return;
            }
        };
        match st.lgr.srv_add_link(link.addr(), pairs, Instant::now()) {
            Ok(n) => {
                link.num.store(n, Ordering::Relaxed);
                tracing::info!(group = self.id, link = n, dev = dev.name(), "ADD LINK");
                Self::attach(st, n, regs);
                st.links.v.push(LinkSt::new(link));
            }
            Err(_) => tracing::debug!("ADD LINK not possible now"),
        }
    }

    /// Client, [`LgrAction::AddLinkRequest`]: accept with a QP on our free device (in RTS
    /// towards the server's, which sends first: CONFIRM LINK), or reject "no alternate
    /// path" (SMC-FC-9).
    pub(super) fn cli_add_link(&self, st: &mut GState, num: u8, peer: &AddLink) {
        let Some(dev) = self.free_device(st) else {
            st.lgr.cli_add_link_reject(add_link_reject::NO_ALTERNATE_PATH);
            return;
        };
        let Some(carrier) = st.lgr.primary() else { return };
        let made = Link::addr_of(&dev).and_then(|me| {
            let link = Link::new(&dev, num, me)?;
            link.connect(peer.gid, peer.qpn, peer.psn, peer.qp_mtu)?;
            let (pairs, regs) = Self::register_all(st, &link, carrier)?;
            Ok((link, pairs, regs))
        });
        match made {
            Ok((link, pairs, regs)) => {
                if st.lgr.cli_add_link_accept(link.addr(), pairs, Instant::now()).is_ok() {
                    tracing::info!(group = self.id, link = num, dev = dev.name(), "ADD LINK accepted");
                    Self::attach(st, num, regs);
                    st.links.v.push(LinkSt::new(link));
                }
            }
            Err(e) => {
                tracing::warn!(group = self.id, error = %e, "no QP for the new link, rejecting");
                st.lgr.cli_add_link_reject(add_link_reject::NO_ALTERNATE_PATH);
            }
        }
    }

    /// [`LgrAction::LinkFailed`]: the failed link's QP to the error state (its work flushes;
    /// its completions are no longer reported), then every connection on it moves to `to`
    /// with the peer's RToken there, drops what it had not posted yet and replays what the
    /// peer may lack (SMC-FO-1..5, `Conn::failover`).
    pub(super) fn fail_over(&self, st: &mut GState, failed: u8, to: u8) {
        if let Some(l) = st.links.get_mut(failed) {
            l.state = LinkState::Failed;
            let _ = l.link.qp.modify_qp(&QpAttr::state(verbs::QpState::Err));
        }
        let GState { conns, links, lgr, .. } = &mut *st;
        let mut moved = 0;
        for (&cid, s) in conns.iter_mut() {
            if s.link != failed {
                continue;
            }
            s.link = to;
            if s.conn.is_none() {
                // Being set up on the failed link: the CLC named it, so the peer's values
                // are for that link; the connection fails rather than write with them on
                // the survivor.
                Self::slot_failed(s, "link failed during connection setup".into());
                continue;
            }
            let Some((rkey, vaddr)) = lgr.peer_rtoken(failed, s.peer_rmb.0, to) else {
                Self::slot_failed(s, "the peer's RMB has no RToken on the surviving link".into());
                continue;
            };
            s.peer_rmb = (rkey, vaddr);
            s.peer_elem = RemoteAddr {
                addr: vaddr.wrapping_add(s.peer_elem_off),
                rkey,
            };
            s.pending
                .retain(|a| matches!(a, Action::TcpReset | Action::ReleaseElement));
            if let Some(c) = s.conn.as_mut() {
                c.failover();
            }
            self.drive(links, cid, s);
            moved += 1;
        }
        tracing::warn!(group = self.id, failed, to, moved, "link failed, connections moved");
    }

    /// [`LgrAction::LinkFree`]: the link's QP and registrations go.
    pub(super) fn free_link(st: &mut GState, num: u8) {
        let c = stats::counters();
        st.links.v.retain(|l| l.num() != num);
        for r in &mut st.rmbs {
            let before = r.alt.len();
            r.alt.retain(|(l, _)| *l != num);
            for _ in r.alt.len()..before {
                stats::dec(&c.mrs);
            }
        }
        for s in st.conns.values_mut() {
            let before = s.sndbuf_alt.len();
            s.sndbuf_alt.retain(|(l, _)| *l != num);
            for _ in s.sndbuf_alt.len()..before {
                stats::dec(&c.mrs);
            }
        }
    }
}

/// A new link's registrations before it has its number.
#[derive(Default)]
struct Registrations {
    /// One per RMB, in the group's order.
    rmbs: Vec<MemoryRegion>,
    /// Per connection id, its send buffer.
    sndbufs: Vec<(u32, MemoryRegion)>,
}
