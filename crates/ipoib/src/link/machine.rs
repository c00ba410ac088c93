//! The link machine: see the module documentation of [`crate::link`].

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use tracing::{debug, trace, warn};

use super::defaults;
use super::neigh::{Neigh, NeighState, NeighTable};
use crate::wire::arp::{ArpOp, ArpPacket};
use crate::wire::cm::{self, CmPrivateData, ServiceId, ServiceIdPrefix};
use crate::wire::encap::{EncapHeader, EtherType};
use crate::wire::icmp;
use crate::wire::ip::{Ipv4Info, Ipv6Header};
use crate::wire::lla::LinkAddr;
use crate::wire::mgid::{self, Mgid};
use crate::wire::nd::{self, NdMessage};

/// IB CM REJ reason 1, "no QP available" (Linux ipoib answers it when out of QPs).
pub const REJ_NO_QP: u16 = 1;
/// IB CM REJ reason 8, "invalid service ID".
pub const REJ_INVALID_SERVICE_ID: u16 = 8;
/// IB CM REJ reason 28, "consumer reject" (RFC 4755 §3.3 for the crossing rule; also
/// bad private data or Receive MTU).
pub const REJ_CONSUMER: u16 = 28;

/// Datagram mode (RFC 4391 only) or connected mode (RFC 4755 on top).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// UD only: flags 0 in our address, no connections (IPCM-1, IPCM-4).
    Datagram,
    /// UD plus RC connections to RC-capable peers.
    Connected,
}

/// Configuration of one IPoIB interface.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Mode.
    pub mode: Mode,
    /// Our UD QPN (in our link address and the service ID peers connect to).
    pub ud_qpn: u32,
    /// Our port GID.
    pub gid: [u8; 16],
    /// The partition key (full membership is forced in MGIDs).
    pub pkey: u16,
    /// MGID scope nibble (2, link-local, by default).
    pub scope: u8,
    /// Our IPv4 addresses with prefix lengths.
    pub ipv4: Vec<(Ipv4Addr, u8)>,
    /// Our IPv6 addresses besides the RFC 4391 link-local one.
    pub ipv6: Vec<Ipv6Addr>,
    /// IP MTU over UD (broadcast-group MTU − 4).
    pub ud_mtu: u32,
    /// The Receive MTU we advertise in CM private data (IP MTU + 4).
    pub cm_recv_mtu: u32,
    /// Service-ID prefix we connect with (we accept both).
    pub service_prefix: ServiceIdPrefix,
    /// ARP/NS retransmission interval.
    pub resolve_retry: Duration,
    /// ARP/NS transmissions before giving up.
    pub resolve_attempts: u32,
    /// Revalidation interval of resolved neighbours.
    pub reachable_time: Duration,
    /// Queue bound per unresolved neighbour / pending connection.
    pub queue_len: usize,
    /// Neighbour table bound.
    pub max_neigh: usize,
    /// Idle time after which a connection is torn down.
    pub conn_idle: Duration,
    /// Time after which a connection that is not established is abandoned.
    pub conn_setup: Duration,
    /// UD-only period after a failed connection attempt.
    pub cm_backoff: Duration,
    /// Connection bound.
    pub max_conns: usize,
    /// Announce each IPv4 address with a gratuitous ARP at [`Link::start`] (true by
    /// default). `false` models the announcement's loss (UD is unreliable): a restarted
    /// node whose peers must notice by themselves (RC retries, revalidation).
    pub announce: bool,
}

impl LinkConfig {
    /// A configuration with the defaults of [`super::defaults`], P_Key 0xffff, scope 2,
    /// UD MTU 2,044 and Receive MTU 65,524, and no IP addresses yet.
    pub fn new(mode: Mode, ud_qpn: u32, gid: [u8; 16]) -> LinkConfig {
        LinkConfig {
            mode,
            ud_qpn,
            gid,
            pkey: 0xffff,
            scope: mgid::SCOPE_LINK_LOCAL,
            ipv4: Vec::new(),
            ipv6: Vec::new(),
            ud_mtu: cm::UD_MTU,
            cm_recv_mtu: cm::CM_RECV_MTU,
            service_prefix: ServiceIdPrefix::Linux,
            resolve_retry: defaults::RESOLVE_RETRY,
            resolve_attempts: defaults::RESOLVE_ATTEMPTS,
            reachable_time: defaults::REACHABLE_TIME,
            queue_len: defaults::QUEUE_LEN,
            max_neigh: defaults::MAX_NEIGH,
            conn_idle: defaults::CONN_IDLE,
            conn_setup: defaults::CONN_SETUP,
            cm_backoff: defaults::CM_BACKOFF,
            max_conns: defaults::MAX_CONNS,
            announce: true,
        }
    }
}

/// Where a UD datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdDest {
    /// A neighbour's UD QP (its QPN and GID).
    Unicast(LinkAddr),
    /// A multicast group (QPN 0xFFFFFF).
    Multicast(Mgid),
}

/// A connection handle, allocated by the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Which side sent the REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// We sent the REQ.
    Active,
    /// The peer sent the REQ.
    Passive,
}

/// Connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// REQ sent / REP sent, not yet established.
    Connecting,
    /// REP (active) or RTU / first data (passive) seen.
    Established,
}

/// What the machine asks the daemon to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write this IP packet into the kernel (the TUN).
    ToKernel(Vec<u8>),
    /// Send this IPoIB message (encapsulation header included) on the UD QP.
    UdSend {
        /// Destination.
        dest: UdDest,
        /// The message.
        payload: Vec<u8>,
    },
    /// Send this IPoIB message on the connection's RC QP.
    RcSend {
        /// Connection.
        conn: ConnId,
        /// The message.
        payload: Vec<u8>,
    },
    /// Join this multicast group on the UD QP.
    Join(Mgid),
    /// Create an RC QP and send a CM REQ.
    Connect {
        /// The new connection.
        conn: ConnId,
        /// Peer link address (GID and UD QPN).
        peer: LinkAddr,
        /// Service ID (prefix, 0, 0, the peer's UD QPN).
        service_id: u64,
        /// Our 8-octet private data.
        private_data: [u8; 8],
    },
    /// Accept an incoming REQ (create an RC QP, send REP).
    Accept {
        /// The daemon's handle of the REQ.
        req: u64,
        /// The new connection.
        conn: ConnId,
        /// Our private data.
        private_data: [u8; 8],
    },
    /// Reject an incoming REQ.
    RejectReq {
        /// The daemon's handle of the REQ.
        req: u64,
        /// IB CM REJ reason.
        reason: u16,
        /// Our private data (IPCM-8).
        private_data: [u8; 8],
    },
    /// Reject a REP we received (the connection is gone).
    RejectRep {
        /// Connection.
        conn: ConnId,
        /// IB CM REJ reason.
        reason: u16,
        /// Our private data (IPCM-8).
        private_data: [u8; 8],
    },
    /// Tear the connection down (DREQ, destroy the QP).
    Disconnect {
        /// Connection.
        conn: ConnId,
    },
}

#[derive(Debug, Clone)]
struct Conn {
    peer: LinkAddr,
    role: Role,
    state: ConnState,
    /// IP MTU (min Receive MTU − 4); for an active connection before the REP, what we
    /// offered.
    mtu: u32,
    created: Duration,
    last_used: Duration,
    /// Packets too big for UD waiting for the connection.
    queue: VecDeque<Vec<u8>>,
    /// An active connection that lost the crossing rule: the peer will REJ it.
    superseded: bool,
    /// Our REQ got Consumer Reject from a larger peer (crossing rule): its REQ is on the
    /// way; packets keep waiting here until it arrives or the setup time runs out.
    awaiting_peer: bool,
}

/// What the machine dropped or refused, by cause (`show counters`): how a misbehaving
/// peer shows up (issue 16). Every drop also logs at debug level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Messages (UD or RC) shorter than the 4-octet encapsulation header or with a type
    /// other than IPv4 / IPv6 (/ ARP on UD) (IPCM-11).
    pub bad_encap: u64,
    /// ARP that is not hardware type 32 / length 20 / IPv4, or truncated (RFC 4391 §9.2).
    pub malformed_arp: u64,
    /// ARP or ND claiming a multicast link address or one of our own addresses.
    pub spoofed_arp_nd: u64,
    /// IPv6 ND failing RFC 4861 §7.1 or with an IPoIB address option not of length 3
    /// (RFC 4391 §9.3).
    pub malformed_nd: u64,
    /// IPv4 / IPv6 whose header does not parse or whose length exceeds the message.
    pub malformed_ip: u64,
    /// Messages bigger than the UD MTU (UD) or the connection MTU (RC) plus the header
    /// (requirements B4.5).
    pub oversize: u64,
    /// ARP or ND received on a connection: ARP is dropped (Linux sends ARP only over UD);
    /// ND is handled and answered over UD (IPCM-16 binds what we send).
    pub arp_nd_on_rc: u64,
    /// REQs answered with REJ (bad service ID, private data, Receive MTU, crossing,
    /// limit).
    pub req_rejected: u64,
    /// REPs refused (bad private data or Receive MTU, or a superseded crossing REQ).
    pub rep_refused: u64,
}

/// A neighbour as `show neigh` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeighView {
    /// IP address.
    pub ip: IpAddr,
    /// Link address once resolved.
    pub lla: Option<LinkAddr>,
    /// "INCOMPLETE", "REACHABLE" or "STALE".
    pub state: &'static str,
    /// The IP MTU towards it.
    pub mtu: u32,
    /// The connection used for it, if any.
    pub conn: Option<ConnId>,
    /// Packets waiting for resolution.
    pub queued: usize,
}

/// A connection as `show conn` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnView {
    /// Handle.
    pub conn: ConnId,
    /// Peer link address.
    pub peer: LinkAddr,
    /// Role.
    pub role: Role,
    /// State.
    pub state: ConnState,
    /// IP MTU.
    pub mtu: u32,
    /// Time since last use.
    pub idle: Duration,
}

type PeerKey = [u8; 20];

/// An IPv6 packet whose next header is ICMPv6 with an ND type (133..=137, RFC 4861 §4).
fn is_nd(ip6: &[u8]) -> bool {
    ip6.get(6) == Some(&crate::wire::ip::PROTO_ICMPV6)
        && ip6.get(Ipv6Header::LEN).is_some_and(|t| (133..=137).contains(t))
}

fn key(l: &LinkAddr) -> PeerKey {
    l.without_flags().to_bytes()
}

/// One IPoIB interface's link machine (`Clone`, so tests can compare two paths from the
/// same state).
#[derive(Debug, Clone)]
pub struct Link {
    cfg: LinkConfig,
    me: LinkAddr,
    link_local: Ipv6Addr,
    neigh: NeighTable,
    conns: HashMap<ConnId, Conn>,
    /// The connection used to send to a peer (exactly one per pair).
    peer_conn: HashMap<PeerKey, ConnId>,
    next_conn: u64,
    out: Vec<Action>,
    counters: LinkCounters,
}

impl Link {
    /// A machine for `cfg`. Call [`Link::start`] for the joins.
    pub fn new(cfg: LinkConfig) -> Link {
        let me = LinkAddr::new(cfg.mode == Mode::Connected, cfg.ud_qpn, cfg.gid);
        Link {
            link_local: mgid::link_local(&cfg.gid),
            me,
            cfg,
            neigh: NeighTable::default(),
            conns: HashMap::new(),
            peer_conn: HashMap::new(),
            next_conn: 1,
            out: Vec::new(),
            counters: LinkCounters::default(),
        }
    }

    /// Our link address.
    pub fn local_addr(&self) -> LinkAddr {
        self.me
    }

    /// Our RFC 4391 §8.1 link-local address.
    pub fn link_local(&self) -> Ipv6Addr {
        self.link_local
    }

    /// The configuration.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// What was dropped or refused so far, by cause.
    pub fn counters(&self) -> LinkCounters {
        self.counters
    }

    /// The actions produced so far, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    /// Joins the broadcast group, all-nodes and our solicited-node groups, and announces
    /// our IPv4 addresses (gratuitous ARP).
    pub fn start(&mut self) {
        let (p, s) = (self.cfg.pkey, self.cfg.scope);
        self.out.push(Action::Join(Mgid::broadcast(p, s)));
        self.out.push(Action::Join(Mgid::all_nodes(p, s)));
        let mut groups: Vec<Mgid> = std::iter::once(self.link_local)
            .chain(self.cfg.ipv6.iter().copied())
            .map(|a| Mgid::ipv6(nd::solicited_node(a), p, s))
            .collect();
        groups.sort();
        groups.dedup();
        self.out.extend(groups.into_iter().map(Action::Join));
        // Gratuitous ARP for each IPv4 address: neighbours that knew an earlier instance of
        // this interface (another QPN after a restart) update at once.
        let announced = if self.cfg.announce {
            self.cfg.ipv4.clone()
        } else {
            Vec::new()
        };
        for (a, _) in announced {
            let arp = ArpPacket {
                op: ArpOp::Request,
                sender_hw: self.me,
                sender_ip: a,
                target_hw: LinkAddr {
                    flags: 0,
                    qpn: 0,
                    gid: [0; 16],
                },
                target_ip: a,
            };
            self.out.push(Action::UdSend {
                dest: UdDest::Multicast(Mgid::broadcast(p, s)),
                payload: EncapHeader::encapsulate(EtherType::Arp, &arp.to_bytes()),
            });
        }
    }

    /// Interface down: every connection is torn down (IPCM-S1).
    pub fn shutdown(&mut self) {
        let mut ids: Vec<ConnId> = self.conns.keys().copied().collect();
        ids.sort();
        for c in ids {
            self.out.push(Action::Disconnect { conn: c });
        }
        self.conns.clear();
        self.peer_conn.clear();
    }

    fn our_pd(&self) -> [u8; 8] {
        CmPrivateData::new(self.cfg.ud_qpn, self.cfg.cm_recv_mtu).to_bytes()
    }

    fn is_our_v4(&self, a: Ipv4Addr) -> bool {
        self.cfg.ipv4.iter().any(|(x, _)| *x == a)
    }

    fn is_our_v6(&self, a: Ipv6Addr) -> bool {
        a == self.link_local || self.cfg.ipv6.contains(&a)
    }

    fn is_v4_broadcast(&self, a: Ipv4Addr) -> bool {
        a.is_broadcast()
            || a.is_multicast()
            || self.cfg.ipv4.iter().any(|(x, plen)| {
                let mask = if *plen == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from((*plen).min(32)))
                };
                *plen < 31 && u32::from(a) == (u32::from(*x) & mask) | !mask
            })
    }

    fn ud_mtu(&self) -> u32 {
        self.cfg.ud_mtu
    }

    fn cm_allowed(&self, now: Duration, n: &Neigh, lla: &LinkAddr) -> bool {
        self.cfg.mode == Mode::Connected && lla.rc() && n.cm_backoff_until.is_none_or(|t| now >= t)
    }

    // ----- packets from the kernel -------------------------------------------------

    /// An IP packet the kernel sent into the TUN.
    pub fn on_kernel_packet(&mut self, now: Duration, pkt: Vec<u8>) {
        match pkt.first().map(|b| b >> 4) {
            Some(4) => {
                let Ok(info) = Ipv4Info::parse(&pkt) else {
                    trace!("malformed IPv4 from the kernel dropped");
                    return;
                };
                let mut pkt = pkt;
                pkt.truncate(info.total_len);
                if self.is_v4_broadcast(info.dst) {
                    let g = if info.dst.is_multicast() {
                        Mgid::ipv4(info.dst, self.cfg.pkey, self.cfg.scope)
                    } else {
                        Mgid::broadcast(self.cfg.pkey, self.cfg.scope)
                    };
                    self.send_multicast(g, EtherType::Ipv4, pkt);
                } else {
                    self.send_unicast(now, IpAddr::V4(info.dst), pkt);
                }
            }
            Some(6) => {
                let Ok((h, _)) = Ipv6Header::parse(&pkt) else {
                    trace!("malformed IPv6 from the kernel dropped");
                    return;
                };
                if matches!(nd::parse(&pkt), Ok(Some(_))) {
                    // The kernel sees a NOARP device; ND is the link's business.
                    return;
                }
                let mut pkt = pkt;
                pkt.truncate(Ipv6Header::LEN + usize::from(h.payload_len));
                if h.dst.is_multicast() {
                    let g = Mgid::ipv6(h.dst, self.cfg.pkey, self.cfg.scope);
                    self.send_multicast(g, EtherType::Ipv6, pkt);
                } else {
                    self.send_unicast(now, IpAddr::V6(h.dst), pkt);
                }
            }
            _ => trace!("non-IP packet from the kernel dropped"),
        }
    }

    /// The fast path of [`Link::on_kernel_packet`] for a packet the daemon holds in a send
    /// buffer: if the machine would hand this packet to an established connection as one
    /// [`Action::RcSend`] (connected mode, unicast IPv4 or non-ND IPv6 of exactly the
    /// packet's length, a resolved neighbour reached over its connection, within the
    /// connection MTU), returns the connection and the encapsulation type and records the
    /// use as `on_kernel_packet` does, without a copy; the daemon then puts the 4-octet
    /// header in front and posts the Send. `None`: nothing was changed, and the daemon
    /// hands the packet to `on_kernel_packet` (resolution, UD, queueing, ICMP errors).
    pub fn rc_route(&mut self, now: Duration, pkt: &[u8]) -> Option<(ConnId, EtherType)> {
        if self.cfg.mode != Mode::Connected {
            return None;
        }
        let (ip, et) = match pkt.first()? >> 4 {
            4 => {
                let info = Ipv4Info::parse(pkt).ok()?;
                if info.total_len != pkt.len() || self.is_v4_broadcast(info.dst) {
                    return None;
                }
                (IpAddr::V4(info.dst), EtherType::Ipv4)
            }
            6 => {
                let (h, _) = Ipv6Header::parse(pkt).ok()?;
                if Ipv6Header::LEN + usize::from(h.payload_len) != pkt.len() || h.dst.is_multicast() || is_nd(pkt) {
                    return None;
                }
                (IpAddr::V6(h.dst), EtherType::Ipv6)
            }
            _ => return None,
        };
        let n = self.neigh.map.get(&ip)?;
        if matches!(n.state, NeighState::Incomplete { .. }) {
            return None;
        }
        let lla = n.lla?;
        // As `transmit` decides.
        let cm = match self.neigh_for_lla(&lla) {
            Some(n) => self.cm_allowed(now, n, &lla),
            None => lla.rc(),
        };
        if !cm {
            return None;
        }
        let conn = *self.peer_conn.get(&key(&lla))?;
        let c = self.conns.get_mut(&conn)?;
        if c.state != ConnState::Established || pkt.len() > c.mtu as usize {
            return None;
        }
        c.last_used = now;
        Some((conn, et))
    }

    fn send_multicast(&mut self, g: Mgid, et: EtherType, pkt: Vec<u8>) {
        let mtu = self.ud_mtu();
        if pkt.len() > mtu as usize {
            self.too_big(pkt, mtu, None);
            return;
        }
        self.out.push(Action::UdSend {
            dest: UdDest::Multicast(g),
            payload: EncapHeader::encapsulate(et, &pkt),
        });
    }

    /// Hands the kernel the ICMP error for an oversize packet, or fragments IPv4 without
    /// DF and sends the fragments to `lla`.
    fn too_big(&mut self, pkt: Vec<u8>, mtu: u32, via: Option<(Duration, LinkAddr)>) {
        if pkt[0] >> 4 == 4 {
            let Ok(info) = Ipv4Info::parse(&pkt) else { return };
            if !info.df {
                if let Ok(frags) = icmp::fragment_v4(&pkt, mtu as usize) {
                    for f in frags {
                        match via {
                            Some((now, lla)) => self.transmit(now, lla, f),
                            None => {
                                let g = if info.dst.is_multicast() {
                                    Mgid::ipv4(info.dst, self.cfg.pkey, self.cfg.scope)
                                } else {
                                    Mgid::broadcast(self.cfg.pkey, self.cfg.scope)
                                };
                                self.send_multicast(g, EtherType::Ipv4, f);
                            }
                        }
                    }
                }
                return;
            }
            if let Ok(Some(e)) = icmp::frag_needed(&pkt, mtu.min(u32::from(u16::MAX)) as u16) {
                self.out.push(Action::ToKernel(e));
            }
        } else if let Ok(Some(e)) = icmp::packet_too_big(&pkt, mtu) {
            self.out.push(Action::ToKernel(e));
        }
    }

    fn send_unicast(&mut self, now: Duration, ip: IpAddr, pkt: Vec<u8>) {
        let qlen = self.cfg.queue_len;
        if let Some(n) = self.neigh.map.get_mut(&ip) {
            match (n.state, n.lla) {
                (NeighState::Incomplete { .. }, _) | (_, None) => {
                    if n.queue.len() >= qlen {
                        n.queue.pop_front();
                    }
                    n.queue.push_back(pkt);
                }
                (_, Some(lla)) => self.transmit(now, lla, pkt),
            }
            return;
        }
        if self.neigh.map.len() >= self.cfg.max_neigh {
            // Evict the oldest resolved entry; never grow beyond the bound.
            let victim = self
                .neigh
                .map
                .iter()
                .min_by_key(|(_, n)| n.confirmed)
                .map(|(ip, _)| *ip);
            match victim {
                Some(v) => {
                    self.neigh.map.remove(&v);
                }
                None => return,
            }
        }
        let mut queue = VecDeque::new();
        queue.push_back(pkt);
        self.neigh.map.insert(
            ip,
            Neigh {
                state: NeighState::Incomplete {
                    attempts: 1,
                    next_retry: now + self.cfg.resolve_retry,
                },
                lla: None,
                confirmed: now,
                queue,
                cm_backoff_until: None,
            },
        );
        self.solicit(ip);
    }

    /// The IP MTU towards a resolved neighbour.
    fn dest_mtu(&self, now: Duration, ip_lla: &LinkAddr, cm: bool) -> u32 {
        let _ = now;
        if cm {
            match self.peer_conn.get(&key(ip_lla)).and_then(|c| self.conns.get(c)) {
                Some(c) if c.state == ConnState::Established => c.mtu,
                _ => self.cfg.cm_recv_mtu.saturating_sub(EncapHeader::LEN as u32),
            }
        } else {
            self.ud_mtu()
        }
    }

    fn neigh_for_lla(&self, lla: &LinkAddr) -> Option<&Neigh> {
        let k = key(lla);
        self.neigh.map.values().find(|n| n.lla.is_some_and(|l| key(&l) == k))
    }

    /// Sends an IP packet to a resolved neighbour: over its connection in connected mode,
    /// else over UD; oversize packets get the ICMP error.
    fn transmit(&mut self, now: Duration, lla: LinkAddr, pkt: Vec<u8>) {
        let cm = match self.neigh_for_lla(&lla) {
            Some(n) => self.cm_allowed(now, n, &lla),
            None => self.cfg.mode == Mode::Connected && lla.rc(),
        };
        let mtu = self.dest_mtu(now, &lla, cm);
        if pkt.len() > mtu as usize {
            self.too_big(pkt, mtu, Some((now, lla)));
            return;
        }
        let et = if pkt[0] >> 4 == 6 {
            EtherType::Ipv6
        } else {
            EtherType::Ipv4
        };
        if !cm {
            self.out.push(Action::UdSend {
                dest: UdDest::Unicast(lla),
                payload: EncapHeader::encapsulate(et, &pkt),
            });
            return;
        }
        let conn = match self.peer_conn.get(&key(&lla)) {
            Some(c) => *c,
            None => match self.connect(now, lla) {
                Some(c) => c,
                None => {
                    // No room for another connection: UD within the UD MTU.
                    if pkt.len() <= self.ud_mtu() as usize {
                        self.out.push(Action::UdSend {
                            dest: UdDest::Unicast(lla),
                            payload: EncapHeader::encapsulate(et, &pkt),
                        });
                    } else {
                        self.too_big(pkt, self.ud_mtu(), Some((now, lla)));
                    }
                    return;
                }
            },
        };
        let ud_mtu = self.ud_mtu() as usize;
        let qlen = self.cfg.queue_len;
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if c.state == ConnState::Established {
            c.last_used = now;
            self.out.push(Action::RcSend {
                conn,
                payload: EncapHeader::encapsulate(et, &pkt),
            });
        } else if pkt.len() <= ud_mtu && c.queue.is_empty() {
            // While the connection is set up, what fits goes over UD (B4.1 step 4).
            self.out.push(Action::UdSend {
                dest: UdDest::Unicast(lla),
                payload: EncapHeader::encapsulate(et, &pkt),
            });
        } else if c.queue.len() < qlen {
            c.queue.push_back(pkt);
        } else {
            trace!("connection queue full, packet dropped");
        }
    }

    fn connect(&mut self, now: Duration, peer: LinkAddr) -> Option<ConnId> {
        if self.conns.len() >= self.cfg.max_conns {
            return None;
        }
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.conns.insert(
            conn,
            Conn {
                peer,
                role: Role::Active,
                state: ConnState::Connecting,
                mtu: self.cfg.cm_recv_mtu.saturating_sub(EncapHeader::LEN as u32),
                created: now,
                last_used: now,
                queue: VecDeque::new(),
                superseded: false,
                awaiting_peer: false,
            },
        );
        self.peer_conn.insert(key(&peer), conn);
        debug!(conn = conn.0, peer = %peer, "connecting");
        self.out.push(Action::Connect {
            conn,
            peer,
            service_id: ServiceId::new(self.cfg.service_prefix, peer.qpn).value(),
            private_data: self.our_pd(),
        });
        Some(conn)
    }

    /// Sends ARP request / NS for `ip` to the broadcast / solicited-node group.
    fn solicit(&mut self, ip: IpAddr) {
        let (p, s) = (self.cfg.pkey, self.cfg.scope);
        match ip {
            IpAddr::V4(t) => {
                let src = self
                    .cfg
                    .ipv4
                    .iter()
                    .find(|(a, plen)| {
                        let m = if *plen == 0 {
                            0
                        } else {
                            u32::MAX << (32 - u32::from((*plen).min(32)))
                        };
                        u32::from(*a) & m == u32::from(t) & m
                    })
                    .or(self.cfg.ipv4.first())
                    .map(|(a, _)| *a);
                let Some(src) = src else { return };
                let arp = ArpPacket {
                    op: ArpOp::Request,
                    sender_hw: self.me,
                    sender_ip: src,
                    target_hw: LinkAddr {
                        flags: 0,
                        qpn: 0,
                        gid: [0; 16],
                    },
                    target_ip: t,
                };
                self.out.push(Action::UdSend {
                    dest: UdDest::Multicast(Mgid::broadcast(p, s)),
                    payload: EncapHeader::encapsulate(EtherType::Arp, &arp.to_bytes()),
                });
            }
            IpAddr::V6(t) => {
                let src = if t.is_unicast_link_local() {
                    self.link_local
                } else {
                    self.cfg.ipv6.first().copied().unwrap_or(self.link_local)
                };
                let dst = nd::solicited_node(t);
                let ns = nd::build_solicit(src, dst, t, &self.me);
                self.out.push(Action::UdSend {
                    dest: UdDest::Multicast(Mgid::ipv6(dst, p, s)),
                    payload: EncapHeader::encapsulate(EtherType::Ipv6, &ns),
                });
            }
        }
    }

    // ----- UD receive --------------------------------------------------------------

    /// An IPoIB message received on the UD QP (GRH already stripped).
    pub fn on_ud_recv(&mut self, now: Duration, msg: &[u8]) {
        let Ok((h, body)) = EncapHeader::parse(msg) else {
            self.counters.bad_encap += 1;
            debug!(
                len = msg.len(),
                "UD message shorter than the encapsulation header dropped"
            );
            return;
        };
        if body.len() > self.ud_mtu() as usize {
            self.counters.oversize += 1;
            debug!(len = msg.len(), "UD message over the UD MTU dropped");
            return;
        }
        match h.ether_type {
            EtherType::Arp => match ArpPacket::parse(body) {
                Ok(arp) => self.on_arp(now, arp),
                Err(e) => {
                    self.counters.malformed_arp += 1;
                    debug!(error = %e, "malformed ARP dropped");
                }
            },
            EtherType::Ipv4 => {
                let r = self.deliver_v4(body);
                self.deliver(body, r);
            }
            EtherType::Ipv6 => match nd::parse(body) {
                Ok(Some((ip6, m))) => self.on_nd(now, ip6, m),
                Ok(None) => {
                    let r = self.deliver_v6(body);
                    self.deliver(body, r);
                }
                Err(e) => {
                    self.counters.malformed_nd += 1;
                    debug!(error = %e, "malformed IPv6/ND dropped");
                }
            },
            other => {
                self.counters.bad_encap += 1;
                debug!(?other, "unknown encapsulation type dropped");
            }
        }
    }

    /// The IPv4 packet at the front of `body` for the kernel: its range in `body`.
    fn deliver_v4(&mut self, body: &[u8]) -> Option<std::ops::Range<usize>> {
        match Ipv4Info::parse(body) {
            Ok(i) => Some(0..i.total_len),
            Err(e) => {
                self.counters.malformed_ip += 1;
                debug!(error = %e, "malformed IPv4 dropped");
                None
            }
        }
    }

    /// The IPv6 packet at the front of `body` for the kernel: its range in `body`.
    fn deliver_v6(&mut self, body: &[u8]) -> Option<std::ops::Range<usize>> {
        match Ipv6Header::parse(body) {
            Ok((h, _)) => Some(0..Ipv6Header::LEN + usize::from(h.payload_len)),
            Err(e) => {
                self.counters.malformed_ip += 1;
                debug!(error = %e, "malformed IPv6 dropped");
                None
            }
        }
    }

    /// Hands the kernel `body[r]` (a copy).
    fn deliver(&mut self, body: &[u8], r: Option<std::ops::Range<usize>>) {
        if let Some(r) = r {
            self.out.push(Action::ToKernel(body[r].to_vec()));
        }
    }

    fn on_arp(&mut self, now: Duration, arp: ArpPacket) {
        if arp.sender_hw.is_multicast() || arp.sender_ip.is_unspecified() || self.is_our_v4(arp.sender_ip) {
            self.counters.spoofed_arp_nd += 1;
            debug!(ip = %arp.sender_ip, "ARP with a multicast sender or our own address ignored");
            return;
        }
        let for_us = self.is_our_v4(arp.target_ip);
        let sender = IpAddr::V4(arp.sender_ip);
        if self.neigh.map.contains_key(&sender) || for_us {
            self.learn(now, sender, arp.sender_hw);
        }
        if arp.op == ArpOp::Request && for_us {
            let reply = ArpPacket {
                op: ArpOp::Reply,
                sender_hw: self.me,
                sender_ip: arp.target_ip,
                target_hw: arp.sender_hw,
                target_ip: arp.sender_ip,
            };
            // IPCM-5, IPCM-16: our own address with our UD QPN and flags, unicast over UD.
            self.out.push(Action::UdSend {
                dest: UdDest::Unicast(arp.sender_hw),
                payload: EncapHeader::encapsulate(EtherType::Arp, &reply.to_bytes()),
            });
        }
    }

    fn on_nd(&mut self, now: Duration, h: Ipv6Header, m: NdMessage) {
        match m {
            NdMessage::Solicit { target, source_lla } => {
                if !self.is_our_v6(target) {
                    return;
                }
                if let Some(l) = source_lla {
                    if l.is_multicast() {
                        self.counters.spoofed_arp_nd += 1;
                        debug!(src = %h.src, "NS with a multicast source link address ignored");
                        return;
                    }
                    self.learn(now, IpAddr::V6(h.src), l);
                }
                let (dst, dest) = match (h.src.is_unspecified(), source_lla) {
                    (false, Some(l)) => (h.src, UdDest::Unicast(l)),
                    _ => (
                        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
                        UdDest::Multicast(Mgid::all_nodes(self.cfg.pkey, self.cfg.scope)),
                    ),
                };
                let na = nd::build_advert(target, dst, target, !h.src.is_unspecified(), &self.me);
                self.out.push(Action::UdSend {
                    dest,
                    payload: EncapHeader::encapsulate(EtherType::Ipv6, &na),
                });
            }
            NdMessage::Advert { target, target_lla, .. } => {
                if let Some(l) = target_lla
                    && !l.is_multicast()
                    && self.neigh.map.contains_key(&IpAddr::V6(target))
                {
                    self.learn(now, IpAddr::V6(target), l);
                }
            }
        }
    }

    /// Records `ip` → `lla`. A changed identity (QPN or GID) means the peer restarted or
    /// the address moved: its connections are dropped. Packets waiting for resolution go
    /// out.
    fn learn(&mut self, now: Duration, ip: IpAddr, lla: LinkAddr) {
        let lla = LinkAddr {
            flags: lla.flags & (LinkAddr::FLAG_RC | LinkAddr::FLAG_UC),
            ..lla
        };
        let n = self.neigh.map.entry(ip).or_insert_with(|| Neigh {
            state: NeighState::Reachable,
            lla: None,
            confirmed: now,
            queue: VecDeque::new(),
            cm_backoff_until: None,
        });
        let old = n.lla.replace(lla);
        n.state = NeighState::Reachable;
        n.confirmed = now;
        let queued: Vec<Vec<u8>> = n.queue.drain(..).collect();
        if let Some(old) = old
            && key(&old) != key(&lla)
        {
            warn!(%ip, old = %old, new = %lla, "neighbour changed its link address (restart?)");
            n.cm_backoff_until = None;
            self.drop_peer_conns(now, &old);
        }
        for p in queued {
            self.transmit(now, lla, p);
        }
    }

    fn drop_peer_conns(&mut self, now: Duration, peer: &LinkAddr) {
        let k = key(peer);
        let mut ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| key(&c.peer) == k)
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        for id in ids {
            self.out.push(Action::Disconnect { conn: id });
            self.remove_conn(now, id, false);
        }
    }

    /// Removes a connection; its queued packets go over UD (or get the ICMP error) and,
    /// with `backoff`, the peer is reached over UD for the backoff time.
    fn remove_conn(&mut self, now: Duration, id: ConnId, backoff: bool) {
        let Some(c) = self.conns.remove(&id) else { return };
        let k = key(&c.peer);
        if self.peer_conn.get(&k) == Some(&id) {
            self.peer_conn.remove(&k);
            // A surviving connection to the same peer (crossing) takes over.
            if let Some((other, _)) = self.conns.iter().find(|(_, o)| key(&o.peer) == k && !o.superseded) {
                self.peer_conn.insert(k, *other);
            }
        }
        if backoff {
            let until = now + self.cfg.cm_backoff;
            for n in self.neigh.map.values_mut() {
                if n.lla.is_some_and(|l| key(&l) == k) {
                    n.cm_backoff_until = Some(until);
                }
            }
        }
        for p in c.queue {
            self.reroute(now, p);
        }
    }

    /// Sends a packet again by its destination IP (after the connection it waited for is
    /// gone): UD, a new resolution, or the neighbour queue.
    fn reroute(&mut self, now: Duration, pkt: Vec<u8>) {
        let dst = match pkt[0] >> 4 {
            4 => Ipv4Info::parse(&pkt).map(|i| IpAddr::V4(i.dst)).ok(),
            _ => Ipv6Header::parse(&pkt).map(|(h, _)| IpAddr::V6(h.dst)).ok(),
        };
        if let Some(ip) = dst {
            self.send_unicast(now, ip, pkt);
        }
    }

    // ----- CM events -----------------------------------------------------------------

    /// A CM REQ arrived for one of our service IDs: `req` is the daemon's handle,
    /// `peer_gid` the REQ's primary-path source GID, `private_data` its private data.
    pub fn on_cm_req(&mut self, now: Duration, req: u64, service_id: u64, peer_gid: [u8; 16], private_data: &[u8]) {
        let pd_ours = self.our_pd();
        let reject = |me: &mut Link, reason: u16, why: &str| {
            me.counters.req_rejected += 1;
            debug!(req, reason, why, "REQ rejected");
            me.out.push(Action::RejectReq {
                req,
                reason,
                private_data: pd_ours,
            });
        };
        if self.cfg.mode != Mode::Connected {
            return reject(self, REJ_INVALID_SERVICE_ID, "datagram mode");
        }
        match ServiceId::parse(service_id) {
            Ok(s) if s.ud_qpn == self.cfg.ud_qpn => {}
            _ => return reject(self, REJ_INVALID_SERVICE_ID, "service ID"),
        }
        let Ok(pd) = CmPrivateData::parse(private_data) else {
            return reject(self, REJ_CONSUMER, "private data");
        };
        let Ok(mtu) = cm::connection_mtu(self.cfg.cm_recv_mtu, pd.recv_mtu) else {
            return reject(self, REJ_CONSUMER, "Receive MTU below the minimum");
        };
        // IPCM-9: the peer's LLA from the private-data QPN and the REQ's GID.
        let peer = LinkAddr::new(true, pd.ud_qpn, peer_gid);
        let k = key(&peer);
        // A neighbour with this GID but another QPN: the peer restarted; re-resolve.
        for n in self.neigh.map.values_mut() {
            if let Some(l) = n.lla
                && l.gid == peer_gid
                && l.qpn != pd.ud_qpn
                && n.state == NeighState::Reachable
            {
                n.state = NeighState::Stale;
            }
        }
        if let Some(&cur) = self.peer_conn.get(&k) {
            let (role, state) = match self.conns.get(&cur) {
                Some(c) => (c.role, c.state),
                None => (Role::Passive, ConnState::Established),
            };
            if role == Role::Active && state == ConnState::Connecting {
                // Crossing REQs (RFC 4755 §3.3): the smaller LLA accepts.
                if self.me.cmp_crossing(&peer).is_gt() {
                    return reject(self, REJ_CONSUMER, "crossing REQ, our LLA is larger");
                }
                if let Some(c) = self.conns.get_mut(&cur) {
                    c.superseded = true;
                }
                let rejected_already = self.conns.get(&cur).is_some_and(|c| c.awaiting_peer);
                if rejected_already {
                    // Its REJ came first; the REQ it announced is this one.
                    let q = self.conns.get_mut(&cur).map(|c| std::mem::take(&mut c.queue));
                    self.conns.remove(&cur);
                    self.peer_conn.remove(&k);
                    self.accept(now, req, peer, mtu, q.unwrap_or_default());
                    return;
                }
            } else if role == Role::Active && self.me.cmp_crossing(&peer).is_gt() {
                // Our REQ already won (the peer sent REP): this is the peer's crossing REQ
                // overtaken by its REP; it loses as it would have while ours was pending.
                return reject(self, REJ_CONSUMER, "crossing REQ after our connection was accepted");
            } else {
                // A fresh REQ from a peer we are connected to: it lost the old connection
                // (restart); exactly one connection per pair, so the old one goes.
                warn!(peer = %peer, "new REQ from a connected peer: old connection dropped");
                self.out.push(Action::Disconnect { conn: cur });
                self.remove_conn(now, cur, false);
            }
        }
        let live = self.conns.values().filter(|c| !c.superseded).count();
        if live >= self.cfg.max_conns {
            return reject(self, REJ_NO_QP, "connection limit");
        }
        let mut queue = VecDeque::new();
        // Packets waiting on our superseded REQ move to the accepted connection.
        if let Some(&cur) = self.peer_conn.get(&k)
            && let Some(c) = self.conns.get_mut(&cur)
        {
            queue = std::mem::take(&mut c.queue);
        }
        self.accept(now, req, peer, mtu, queue);
    }

    fn accept(&mut self, now: Duration, req: u64, peer: LinkAddr, mtu: u32, queue: VecDeque<Vec<u8>>) {
        let k = key(&peer);
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.conns.insert(
            conn,
            Conn {
                peer,
                role: Role::Passive,
                state: ConnState::Connecting,
                mtu,
                created: now,
                last_used: now,
                queue,
                superseded: false,
                awaiting_peer: false,
            },
        );
        self.peer_conn.insert(k, conn);
        debug!(conn = conn.0, peer = %peer, mtu, "REQ accepted");
        self.out.push(Action::Accept {
            req,
            conn,
            private_data: self.our_pd(),
        });
    }

    /// The REP for our REQ arrived. Unless this produces [`Action::RejectRep`], the daemon
    /// completes the handshake (RTU) and the connection is established.
    pub fn on_cm_rep(&mut self, now: Duration, conn: ConnId, private_data: &[u8]) {
        let Some(c) = self.conns.get(&conn) else { return };
        if c.role != Role::Active || c.state != ConnState::Connecting {
            return;
        }
        if c.superseded {
            // We accepted the peer's crossing REQ (our LLA is smaller); the peer should
            // have rejected ours. Exactly one connection per pair: refuse this one.
            self.counters.rep_refused += 1;
            self.out.push(Action::RejectRep {
                conn,
                reason: REJ_CONSUMER,
                private_data: self.our_pd(),
            });
            self.remove_conn(now, conn, false);
            return;
        }
        let peer_qpn = c.peer.qpn;
        let mtu = CmPrivateData::parse(private_data)
            .ok()
            .filter(|pd| pd.ud_qpn == peer_qpn)
            .and_then(|pd| cm::connection_mtu(self.cfg.cm_recv_mtu, pd.recv_mtu).ok());
        let Some(mtu) = mtu else {
            self.counters.rep_refused += 1;
            debug!(conn = conn.0, "REP with bad private data / Receive MTU rejected");
            self.out.push(Action::RejectRep {
                conn,
                reason: REJ_CONSUMER,
                private_data: self.our_pd(),
            });
            self.remove_conn(now, conn, true);
            return;
        };
        self.establish(now, conn, mtu);
    }

    fn establish(&mut self, now: Duration, conn: ConnId, mtu: u32) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.state = ConnState::Established;
        c.mtu = mtu;
        c.last_used = now;
        let peer = c.peer;
        let queued: Vec<Vec<u8>> = c.queue.drain(..).collect();
        debug!(conn = conn.0, peer = %peer, mtu, "connection established");
        for p in queued {
            self.transmit(now, peer, p);
        }
    }

    /// RTU received (passive side): the connection is established.
    pub fn on_cm_rtu(&mut self, now: Duration, conn: ConnId) {
        if let Some(c) = self.conns.get(&conn)
            && c.state == ConnState::Connecting
            && c.role == Role::Passive
        {
            let mtu = c.mtu;
            self.establish(now, conn, mtu);
        }
    }

    /// Our REQ was rejected (or timed out in the CM).
    pub fn on_cm_rej(&mut self, now: Duration, conn: ConnId, reason: u16) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        let superseded = c.superseded;
        debug!(conn = conn.0, reason, superseded, "REQ rejected by the peer");
        if !superseded && !c.awaiting_peer && reason == REJ_CONSUMER && self.me.cmp_crossing(&c.peer).is_lt() {
            // RFC 4755 §3.3 seen from the smaller side, REJ first: the larger peer's REQ
            // follows; keep the queue for it (the setup timer still bounds the wait).
            c.awaiting_peer = true;
            return;
        }
        // Lost the crossing: the peer's connection is the one; else fall back to UD.
        self.remove_conn(now, conn, !superseded);
    }

    /// The connection ended: DREQ received, QP error (RC retries exhausted) or CM timeout.
    /// The peer is re-resolved at once (its QPN may have changed in a restart); packets
    /// wait for the answer in the neighbour queue.
    pub fn on_conn_closed(&mut self, now: Duration, conn: ConnId) {
        let Some(c) = self.conns.get(&conn) else { return };
        let k = key(&c.peer);
        let mut again = Vec::new();
        for (ip, n) in self.neigh.map.iter_mut() {
            if n.lla.is_some_and(|l| key(&l) == k) {
                n.lla = None;
                n.state = NeighState::Incomplete {
                    attempts: 1,
                    next_retry: now + self.cfg.resolve_retry,
                };
                again.push(*ip);
            }
        }
        self.remove_conn(now, conn, false);
        again.sort();
        for ip in again {
            self.solicit(ip);
        }
    }

    /// An IPoIB message arrived on a connection (IPCM-15: delivered whatever mode).
    pub fn on_rc_recv(&mut self, now: Duration, conn: ConnId, msg: &[u8]) {
        if let Some(r) = self.on_rc_recv_in_place(now, conn, msg) {
            self.out.push(Action::ToKernel(msg[r].to_vec()));
        }
    }

    /// [`Link::on_rc_recv`] without the copy: an IP packet for the kernel comes back as its
    /// range in `msg` (after the encapsulation header) instead of an [`Action::ToKernel`],
    /// so the daemon writes it into the TUN straight from the receive buffer. Everything
    /// else (ND, drops, counters, connection state) is as in `on_rc_recv`, which is this.
    pub fn on_rc_recv_in_place(&mut self, now: Duration, conn: ConnId, msg: &[u8]) -> Option<std::ops::Range<usize>> {
        let mut mtu = self.cfg.cm_recv_mtu.saturating_sub(EncapHeader::LEN as u32);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.last_used = now;
            mtu = c.mtu;
            if c.state == ConnState::Connecting && c.role == Role::Passive {
                self.establish(now, conn, mtu);
            }
        }
        let Ok((h, body)) = EncapHeader::parse(msg) else {
            self.counters.bad_encap += 1;
            debug!(
                conn = conn.0,
                len = msg.len(),
                "RC message shorter than the encapsulation header dropped"
            );
            return None;
        };
        // B4.5: nothing bigger than the connection MTU both sides agreed on.
        if body.len() > mtu as usize {
            self.counters.oversize += 1;
            debug!(
                conn = conn.0,
                len = msg.len(),
                mtu,
                "RC message over the connection MTU dropped"
            );
            return None;
        }
        let at = |r: std::ops::Range<usize>| r.start + EncapHeader::LEN..r.end + EncapHeader::LEN;
        match h.ether_type {
            EtherType::Ipv4 => self.deliver_v4(body).map(at),
            // A Linux peer sends unicast ND (NUD probes) on its connection, as all IPv6 to a
            // connected neighbour: handled as over UD, and the answer goes over UD
            // (IPCM-16 binds what we send).
            EtherType::Ipv6 if is_nd(body) => {
                self.counters.arp_nd_on_rc += 1;
                match nd::parse(body) {
                    Ok(Some((ip6, m))) => {
                        self.on_nd(now, ip6, m);
                        None
                    }
                    Ok(None) => self.deliver_v6(body).map(at),
                    Err(e) => {
                        self.counters.malformed_nd += 1;
                        debug!(conn = conn.0, error = %e, "malformed ND on a connection dropped");
                        None
                    }
                }
            }
            EtherType::Ipv6 => self.deliver_v6(body).map(at),
            EtherType::Arp => {
                // IPCM-16: ARP only over UD.
                self.counters.arp_nd_on_rc += 1;
                debug!(conn = conn.0, "ARP on a connection dropped");
                None
            }
            other => {
                self.counters.bad_encap += 1;
                debug!(
                    conn = conn.0,
                    ?other,
                    "unknown encapsulation type on a connection dropped"
                );
                None
            }
        }
    }

    // ----- timers --------------------------------------------------------------------

    /// Timers: resolution retries and give-up, revalidation, connection setup timeout,
    /// idle teardown. Call at least every `resolve_retry`.
    pub fn on_tick(&mut self, now: Duration) {
        let mut resend = Vec::new();
        let mut dead = Vec::new();
        for (ip, n) in self.neigh.map.iter_mut() {
            match n.state {
                NeighState::Incomplete { attempts, next_retry } if now >= next_retry => {
                    if attempts >= self.cfg.resolve_attempts {
                        dead.push(*ip);
                    } else {
                        n.state = NeighState::Incomplete {
                            attempts: attempts + 1,
                            next_retry: now + self.cfg.resolve_retry,
                        };
                        resend.push(*ip);
                    }
                }
                NeighState::Reachable if now >= n.confirmed + self.cfg.reachable_time => {
                    n.state = NeighState::Stale;
                    resend.push(*ip);
                }
                NeighState::Stale
                    if now
                        >= n.confirmed
                            + self.cfg.reachable_time
                            + self.cfg.resolve_retry * self.cfg.resolve_attempts =>
                {
                    // No answer to the revalidation: forget it; the next packet resolves
                    // afresh (bounds the black hole after a peer restart).
                    dead.push(*ip);
                }
                _ => {}
            }
        }
        dead.sort();
        for ip in dead {
            if let Some(n) = self.neigh.map.remove(&ip) {
                debug!(%ip, dropped = n.queue.len(), "neighbour unresolved, removed");
            }
        }
        resend.sort();
        for ip in resend {
            self.solicit(ip);
        }
        let mut expired: Vec<(ConnId, bool)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| match c.state {
                ConnState::Connecting if now >= c.created + self.cfg.conn_setup => Some((*id, true)),
                ConnState::Established if now >= c.last_used + self.cfg.conn_idle => Some((*id, false)),
                _ => None,
            })
            .collect();
        expired.sort();
        for (id, failed) in expired {
            debug!(conn = id.0, failed, "connection timed out");
            self.out.push(Action::Disconnect { conn: id });
            self.remove_conn(now, id, failed);
        }
    }

    // ----- introspection ---------------------------------------------------------------

    /// The neighbour table, sorted by address (`show neigh`).
    pub fn neighbours(&self, now: Duration) -> Vec<NeighView> {
        let mut v: Vec<NeighView> = self
            .neigh
            .iter()
            .map(|(ip, n)| {
                let (cm, conn) = match n.lla {
                    Some(l) => (self.cm_allowed(now, n, &l), self.peer_conn.get(&key(&l)).copied()),
                    None => (false, None),
                };
                NeighView {
                    ip: *ip,
                    lla: n.lla,
                    state: match n.state {
                        NeighState::Incomplete { .. } => "INCOMPLETE",
                        NeighState::Reachable => "REACHABLE",
                        NeighState::Stale => "STALE",
                    },
                    mtu: match n.lla {
                        Some(l) => self.dest_mtu(now, &l, cm),
                        None => self.ud_mtu(),
                    },
                    conn: if cm { conn } else { None },
                    queued: n.queue.len(),
                }
            })
            .collect();
        v.sort_by_key(|n| n.ip);
        v
    }

    /// The connections, sorted by handle (`show conn`; IPCM-7).
    pub fn connections(&self, now: Duration) -> Vec<ConnView> {
        let mut v: Vec<ConnView> = self
            .conns
            .iter()
            .map(|(id, c)| ConnView {
                conn: *id,
                peer: c.peer,
                role: c.role,
                state: c.state,
                mtu: c.mtu,
                idle: now.saturating_sub(c.last_used),
            })
            .collect();
        v.sort_by_key(|c| c.conn);
        v
    }

    /// The IP MTU towards `ip` if it is resolved.
    pub fn mtu_to(&self, now: Duration, ip: IpAddr) -> Option<u32> {
        let n = self.neigh.get(&ip)?;
        let l = n.lla?;
        Some(self.dest_mtu(now, &l, self.cm_allowed(now, n, &l)))
    }
}
