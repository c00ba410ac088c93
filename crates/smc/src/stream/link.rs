//! One link of a link group (RFC 7609 §2.2.2): an RC QP on one RoCE device with its own
//! PD, CQ and control slots, and the waiting of the group's progress thread on the CQs of
//! all its links (requirements A4.7, A4.8, D1).

use super::*;
use std::future::Future;
use std::sync::atomic::AtomicU8;
use std::task::{Context, Poll, Wake, Waker};

/// A link: what is per RNIC. The group's RMBs and send buffers are registered in every
/// link's PD (one memory, a key per link: [`ProtectionDomain::reg_mr_shared`]).
pub(super) struct Link {
    /// Link number (the server assigns it; 1 for the first link).
    pub(super) num: AtomicU8,
    pub(super) dev: Device,
    pub(super) pd: ProtectionDomain,
    pub(super) cq: CompletionQueue,
    pub(super) qp: QueuePair,
    /// Control send slots, then receive slots.
    pub(super) ctrl: MemoryRegion,
    pub(super) psn: u32,
    pub(super) mtu: Mtu,
    pub(super) local_gid: [u8; 16],
    pub(super) local_mac: [u8; 6],
    pub(super) link_uid: u32,
    /// The peer's QP number and GID (set when the QP goes to RTR).
    pub(super) peer: Mutex<(u32, [u8; 16])>,
}

impl Link {
    /// A link on `dev`: PD, CQ, RC QP in INIT with its receives posted.
    pub(super) fn new(dev: &Device, num: u8, me: ([u8; 16], [u8; 6])) -> io::Result<Self> {
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
        for a in [&c.links, &c.qps, &c.mrs] {
            stats::inc(a);
        }
        Ok(Self {
            num: AtomicU8::new(num),
            dev: dev.clone(),
            pd,
            cq,
            qp,
            ctrl,
            psn: random_psn(),
            mtu: device_mtu(dev),
            local_gid: me.0,
            local_mac: me.1,
            link_uid: NEXT_LINK_UID.fetch_add(1, Ordering::Relaxed),
            peer: Mutex::new((0, [0; 16])),
        })
    }

    /// Our end of a link as a device gives it: its GID and (made-up, as for the CLC) MAC.
    pub(super) fn addr_of(dev: &Device) -> io::Result<([u8; 16], [u8; 6])> {
        let gid = dev.query_gid(1, 0).map_err(verbs_err)?;
        Ok((gid.0, [0x02, 0, gid.0[12], gid.0[13], gid.0[14], gid.0[15]]))
    }

    pub(super) fn num(&self) -> u8 {
        self.num.load(Ordering::Relaxed)
    }

    pub(super) fn peer_qpn(&self) -> u32 {
        self.peer.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    pub(super) fn peer_gid(&self) -> [u8; 16] {
        self.peer.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    /// RTR then RTS towards the peer's QP (A1.11 values: its QPN, GID, initial PSN, MTU).
    pub(super) fn connect(&self, gid: [u8; 16], qpn: u32, psn: u32, mtu_enum: u8) -> io::Result<()> {
        let mtu = mtu_from_enum(mtu_enum).min(self.mtu);
        self.qp
            .modify_qp(&QpAttr::rtr(RtrAttr {
                ah_attr: AhAttr::to_gid(Gid(gid)),
                path_mtu: mtu,
                dest_qp_num: qpn & 0x00FF_FFFF,
                rq_psn: psn & 0x00FF_FFFF,
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
        *self.peer.lock().unwrap_or_else(|p| p.into_inner()) = (qpn & 0x00FF_FFFF, gid);
        Ok(())
    }

    /// Our end of the link for ADD LINK.
    pub(super) fn addr(&self) -> crate::lgr::LinkAddr {
        crate::lgr::LinkAddr {
            mac: self.local_mac,
            gid: self.local_gid,
            qpn: self.qp.qp_num(),
            qp_mtu: self.mtu as u8,
            psn: self.psn,
            link_uid: self.link_uid.to_be_bytes(),
        }
    }

    /// Posts a 44-octet control message (CDC or LLC) from send slot `slot`.
    pub(super) fn post_ctrl(&self, slot: u32, bytes: &[u8; CDC_LEN], wr_id: u64) -> Result<(), verbs::Error> {
        self.qp.post_send_one(self.ctrl_wr(slot, bytes, wr_id))
    }

    /// The Send of a control message from send slot `slot` (written there now), to post.
    pub(super) fn ctrl_wr(&self, slot: u32, bytes: &[u8; CDC_LEN], wr_id: u64) -> SendWr {
        let off = (slot % SQ_DEPTH) as usize * SLOT;
        let _ = self.ctrl.write(off, bytes);
        SendWr::new(wr_id, WrOpcode::Send, vec![self.ctrl.sge(off, CDC_LEN as u32)])
    }

    /// Receive slot `wr_id` back on the receive queue.
    pub(super) fn repost_recv(&self, wr_id: u64) -> Result<(), verbs::Error> {
        let off = (SQ_DEPTH as usize + wr_id as usize) * SLOT;
        self.qp.post_recv(&[RecvWr {
            wr_id,
            sg_list: vec![self.ctrl.sge(off, SLOT as u32)],
        }])
    }

    /// The message in receive slot `wr_id`.
    pub(super) fn read_recv(&self, wr_id: u64, out: &mut [u8; SLOT]) -> bool {
        let off = (SQ_DEPTH as usize + wr_id as usize) * SLOT;
        self.ctrl.read(off, out).is_ok()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        LIVE_LINKS.fetch_sub(1, Ordering::AcqRel);
        let c = stats::counters();
        for a in [&c.links, &c.qps, &c.mrs] {
            stats::dec(a);
        }
    }
}

/// A link as its group keeps it: the posted-work accounting of its send queue and state.
pub(super) struct LinkSt {
    pub(super) link: Arc<Link>,
    pub(super) outstanding: u32,
    pub(super) next_slot: u32,
    pub(super) state: LinkState,
    /// The work requests one [`Group::drive`](super::Group) posts, kept between calls (no
    /// allocation of the list per message).
    pub(super) batch: Vec<SendWr>,
}

impl LinkSt {
    pub(super) fn new(link: Link) -> Self {
        Self {
            link: Arc::new(link),
            outstanding: 0,
            next_slot: 0,
            state: LinkState::Activating,
            batch: Vec::new(),
        }
    }

    pub(super) fn num(&self) -> u8 {
        self.link.num()
    }
}

/// The group's links (active, being added, failed and not yet freed).
#[derive(Default)]
pub(super) struct Links {
    pub(super) v: Vec<LinkSt>,
}

impl Links {
    pub(super) fn get(&self, num: u8) -> Option<&LinkSt> {
        self.v.iter().find(|l| l.num() == num)
    }

    pub(super) fn get_mut(&mut self, num: u8) -> Option<&mut LinkSt> {
        self.v.iter_mut().find(|l| l.num() == num)
    }

    /// The active link with the fewest connections in `conns` (Linux's choice for a new
    /// connection, `smcr_lgr_conn_assign_link`), lowest number on a tie.
    pub(super) fn least_used<'a>(&self, conns: impl Iterator<Item = &'a Slot> + Clone) -> Option<u8> {
        self.v
            .iter()
            .filter(|l| l.state == LinkState::Active)
            .map(|l| {
                let n = l.num();
                (conns.clone().filter(|s| s.link == n).count(), n)
            })
            .min()
            .map(|(_, n)| n)
    }
}

/// Unparks the progress thread when a CQ it waits on gets a completion.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits up to `timeout` for a completion on any of `links`' CQs; returns the link number
/// and the completion. One link: the CQ's own blocking wait without its 50 µs busy poll
/// (polling marks the device busy-polled, which mutes the provider's receive thread for a
/// while, so a CDC arriving just after this thread parked waited for the provider's
/// periodic check: 64 B request/response p50 215 µs with the spin, 113-138 µs without,
/// interleaved runs, docs/performance.md). Several: a short busy poll of all, then each
/// CQ's async wait registered with a waker that unparks this thread. `epoch`: the first
/// link's [`CompletionQueue::interrupt_epoch`] when this thread took the CQ (one link: an
/// application thread that took it over since has interrupted the wait).
pub(super) fn wait_any(links: &[Arc<Link>], timeout: Duration, epoch: u64) -> Option<(u8, WorkCompletion)> {
    if let [one] = links {
        return one
            .cq
            .wait_spin_since(Duration::ZERO, Some(timeout), epoch)
            .map(|wc| (one.num(), wc));
    }
    let start = Instant::now();
    let spin = Duration::from_micros(50);
    loop {
        for l in links {
            if let Some(wc) = l.cq.poll_one() {
                return Some((l.num(), wc));
            }
        }
        if start.elapsed() >= spin {
            break;
        }
        std::hint::spin_loop();
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = start + timeout;
    loop {
        for l in links {
            let mut f = std::pin::pin!(l.cq.next_async());
            if let Poll::Ready(wc) = f.as_mut().poll(&mut cx) {
                return Some((l.num(), wc));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}
