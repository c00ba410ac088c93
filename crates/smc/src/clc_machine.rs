//! The sans-I/O CLC handshake (RFC 7609 §3.5.1–3.5.2, C.1–C.6) for client and server.
//!
//! # API note (for the connection side)
//! - Create with [`ClcMachine::client`] / [`ClcMachine::server`], passing the local
//!   [`LocalCaps`] and whether the peer's SYN-ACK / SYN carried the TCP option. Without it
//!   the machine is at once [`Outcome::Fallback`]`(`[`FallbackReason::PeerNoSmc`]`)` and
//!   never produces a CLC octet (SMC-OPT-3, F1).
//! - Feed every octet read from the TCP connection to [`ClcMachine::on_bytes`]; write
//!   whatever [`ClcMachine::take_output`] returns to the connection after every call.
//! - [`Outcome::NeedLink`]: the server got a usable Proposal (the client got an Accept). The
//!   engine prepares QP and RMB element and answers with [`ClcMachine::accept`] (server) /
//!   [`ClcMachine::confirm`] (client) or, lacking resources etc., [`ClcMachine::decline`].
//! - [`Outcome::Proceed`]: SMC-R is on; it carries the peer's Accept/Confirm (its link
//!   parameters). During first contact [`ClcMachine::decline`] stays possible until the
//!   engine calls [`ClcMachine::point_of_no_return`] (C.2, C.3); a Decline from the peer in
//!   that window still arrives through `on_bytes`.
//! - [`Outcome::Fallback`]: continue as plain TCP; [`ClcMachine::take_app_data`] gives the
//!   octets that followed the Decline (SMC-CLC-8); every later octet is application data
//!   (SMC-CLC-9): `on_bytes` then passes it through to `take_app_data` untouched.
//! - [`Outcome::Reset`]: reset the TCP connection (malformed CLC, application data where a
//!   CLC message was expected, an unexpected message, the CLC timer) — no fallback (C.5,
//!   C.6).
//! - [`ClcMachine::on_timeout`] when the engine's CLC timer ([`CLC_WAIT`]) expires.
//!
//! Version choice (SMC-CLC-3): the server uses v2 when both sides enable it, the Proposal
//! has a v2 extension offering SMC-R and one of its EIDs is one of ours (the first of ours
//! is the UEID); else v1 when the Proposal offers v1 SMC-R and the subnet matches (E-4);
//! else it Declines. A Decline is only ever sent instead of the next expected message
//! ("no chase", SMC-CLC-7): a client that loses its RNIC after its Proposal calls
//! `decline` at once and the machine sends the Decline when the Accept arrives.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::wire::clc::{
    self, AcceptConfirm, AcceptConfirmV2, ClcError, ClcMessage, ClcType, Decline, Diagnosis, EID_LEN, FceV2x,
    FirstContactExt, HOSTNAME_LEN, IpArea, PeerId, Proposal, SmcType, V2Extension,
};

/// Linux's CLC wait time (`CLC_WAIT_TIME`, 6 s; requirements C5): the engine's timer for
/// the whole CLC exchange.
pub const CLC_WAIT: Duration = Duration::from_secs(6);

/// What this host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCaps {
    /// Policy: SMC-R allowed for this connection (false → Decline, F2).
    pub enabled: bool,
    /// Offer / accept SMC-R v1.
    pub v1: bool,
    /// Offer / accept SMC-Rv2.
    pub v2: bool,
    /// Our peer ID (A1.3).
    pub peer_id: PeerId,
    /// GID of our preferred RNIC.
    pub gid: [u8; 16],
    /// MAC of our preferred RNIC.
    pub mac: [u8; 6],
    /// The IPv4 address and prefix length of the interface of this connection (v1 subnet).
    pub ipv4: Option<(Ipv4Addr, u8)>,
    /// An IPv6 connection's local address and prefix length: SMC-R v1 over IPv6 TCP, the
    /// Proposal's IP area carrying the prefix (RFC 7609 §3.5.1.1, Linux's
    /// `smc_clc_prfx_set6`) and the server matching it against its own (SMC-FC-1).
    pub ipv6: Option<(Ipv6Addr, u8)>,
    /// Our EIDs; the first is the UEID (v2 needs at least one).
    pub eids: Vec<[u8; EID_LEN]>,
    /// Host name for the v2 first-contact extension.
    pub hostname: [u8; HOSTNAME_LEN],
    /// Max connections per link group we support (v2).
    pub max_conns: u8,
    /// Max links per link group we support (v2).
    pub max_links: u8,
}

impl LocalCaps {
    /// An address for the v1 IP area (IPv4 subnet or IPv6 prefix).
    fn has_ip(&self) -> bool {
        self.ipv4.is_some() || self.ipv6.is_some()
    }
}

/// `a` with the bits past prefix length `len` cleared.
fn v6_prefix(a: Ipv6Addr, len: u8) -> Ipv6Addr {
    let m = if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len.min(128)))
    };
    Ipv6Addr::from(u128::from(a) & m)
}

/// The link parameters the engine puts into its Accept / Confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkParams {
    /// 24-bit QP number.
    pub qpn: u32,
    /// RMB RKey.
    pub rmb_rkey: u32,
    /// RMB element index.
    pub rmbe_idx: u8,
    /// Alert token of this connection.
    pub alert_token: u32,
    /// Compressed RMBE size (0..=5).
    pub rmbe_size: u8,
    /// QP MTU enum (1..=5).
    pub qp_mtu: u8,
    /// RMB virtual address.
    pub rmb_vaddr: u64,
    /// 24-bit initial PSN.
    pub psn: u32,
}

/// Why the connection continues as plain TCP (visible to the application).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FallbackReason {
    /// The peer's SYN / SYN-ACK had no SMC-R option (F1).
    #[error("peer did not indicate SMC")]
    PeerNoSmc,
    /// SMC-R is disabled here, or nothing to offer (no v1 address, no v2 EID): no Proposal.
    #[error("SMC-R not enabled locally")]
    Disabled,
    /// The peer sent a Decline (S = out of sync: tear down the link group named in this
    /// connection's Accept, SMC-CLC-12 / F14).
    #[error("peer declined: {diagnosis}{}", if *out_of_sync { " (link group out of sync)" } else { "" })]
    PeerDeclined {
        /// The peer's diagnosis code.
        diagnosis: Diagnosis,
        /// S flag.
        out_of_sync: bool,
    },
    /// We sent a Decline with this diagnosis.
    #[error("declined locally: {0}")]
    Declined(Diagnosis),
}

/// Why the TCP connection must be reset (C.5, C.6: no fallback).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetReason {
    /// Octets that are not a valid CLC message where one was expected (F9, SMC-CLC-5).
    #[error("malformed CLC message: {0}")]
    Malformed(ClcError),
    /// A well-formed CLC message of the wrong type for this state.
    #[error("unexpected CLC {0:?}")]
    Unexpected(ClcType),
    /// The CLC timer expired (F10).
    #[error("CLC handshake timed out")]
    Timeout,
    /// The TCP connection ended during the handshake.
    #[error("connection closed during the CLC handshake")]
    Closed,
}

/// The machine's state as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Waiting for the peer.
    Pending,
    /// Server: a usable Proposal, answer with `accept` or `decline`. Client: an Accept,
    /// answer with `confirm` or `decline`.
    NeedLink(Box<NeedLink>),
    /// SMC-R: the peer's Accept (client) or Confirm (server).
    Proceed(Box<AcceptConfirm>),
    /// Plain TCP.
    Fallback(FallbackReason),
    /// Reset the TCP connection.
    Reset(ResetReason),
}

/// What the engine needs to prepare the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeedLink {
    /// Server side: the Proposal and the version chosen (1 or 2).
    Proposal {
        /// The client's Proposal.
        proposal: Proposal,
        /// Chosen version.
        version: u8,
        /// The negotiated EID (v2).
        eid: Option<[u8; EID_LEN]>,
    },
    /// Client side: the server's Accept (first contact or not: `accept.first_contact`).
    Accept(AcceptConfirm),
}

/// Misuse of the machine by the engine (a local bug or a too-late decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MachineError {
    /// The call does not fit the current state.
    #[error("{0} is not possible in this state")]
    WrongState(&'static str),
    /// A Decline is no longer allowed (after the point of no return, or after Accept /
    /// Confirm on subsequent contact, SMC-SC-8): fail over or reset instead.
    #[error("a Decline is no longer allowed")]
    DeclineTooLate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Client,
    Server,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Start,
    WaitProposal,
    WaitAccept {
        pending_decline: Option<Diagnosis>,
    },
    ServerDecide {
        version: u8,
        eid: Option<[u8; EID_LEN]>,
        proposal: Box<Proposal>,
    },
    ClientDecide {
        accept: Box<AcceptConfirm>,
    },
    WaitConfirm {
        first_contact: bool,
        pending_decline: Option<Diagnosis>,
    },
    Done {
        first_contact: bool,
        past_pnr: bool,
    },
    Fallback,
    Reset,
}

/// The CLC handshake of one TCP connection.
#[derive(Debug)]
pub struct ClcMachine {
    role: Role,
    caps: LocalCaps,
    state: State,
    outcome: Outcome,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    app: Vec<u8>,
    chosen_version: u8,
    eid: Option<[u8; EID_LEN]>,
    peer_caps: Option<(u8, u8)>,
    /// Server: the (max conns, max links) our v2 first-contact Accept announced.
    accepted_caps: Option<(u8, u8)>,
}

impl ClcMachine {
    /// A client. `peer_indicated_smc`: the SYN-ACK carried the option. When it did, the
    /// Proposal is in [`take_output`](Self::take_output) at once.
    pub fn client(caps: LocalCaps, peer_indicated_smc: bool) -> Self {
        let mut m = Self::new(Role::Client, caps);
        if !peer_indicated_smc {
            m.finish_fallback(FallbackReason::PeerNoSmc);
            return m;
        }
        if !m.caps.enabled || !(m.caps.v1 && m.caps.has_ip() || m.caps.v2 && !m.caps.eids.is_empty()) {
            m.finish_fallback(FallbackReason::Disabled);
            return m;
        }
        let p = m.proposal();
        m.send(&ClcMessage::Proposal(p));
        m.state = State::WaitAccept { pending_decline: None };
        m
    }

    /// A server. `peer_indicated_smc`: the SYN carried the option.
    /// (A server with SMC-R disabled by policy still answers a Proposal with a Decline, F2.)
    pub fn server(caps: LocalCaps, peer_indicated_smc: bool) -> Self {
        let mut m = Self::new(Role::Server, caps);
        if peer_indicated_smc {
            m.state = State::WaitProposal;
        } else {
            m.finish_fallback(FallbackReason::PeerNoSmc);
        }
        m
    }

    fn new(role: Role, caps: LocalCaps) -> Self {
        Self {
            role,
            caps,
            state: State::Start,
            outcome: Outcome::Pending,
            inbuf: Vec::new(),
            out: Vec::new(),
            app: Vec::new(),
            chosen_version: 1,
            eid: None,
            peer_caps: None,
            accepted_caps: None,
        }
    }

    /// The current outcome.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// Octets to write to the TCP connection.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Application data received after the machine fell back (SMC-CLC-8, SMC-CLC-9).
    pub fn take_app_data(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.app)
    }

    /// The version in use once decided (1 or 2).
    pub fn version(&self) -> u8 {
        self.chosen_version
    }

    fn proposal(&self) -> Proposal {
        let c = &self.caps;
        let ip = c.ipv4.map(|(a, l)| IpArea::ipv4(a, l)).or_else(|| {
            c.ipv6.map(|(a, l)| IpArea {
                subnet: Ipv4Addr::UNSPECIFIED,
                prefix_len: 0,
                ipv6: vec![(v6_prefix(a, l), l)],
            })
        });
        let v1 = (c.v1 && ip.is_some()).then(|| {
            (
                c.peer_id,
                c.gid,
                c.mac,
                ip.clone().unwrap_or(IpArea::ipv4(Ipv4Addr::UNSPECIFIED, 0)),
            )
        });
        if c.v2 && !c.eids.is_empty() {
            Proposal::v2_linux(
                v1,
                V2Extension {
                    eids: c.eids.clone(),
                    release: 1,
                    roce_gid: c.gid,
                    max_conns: c.max_conns,
                    max_links: c.max_links,
                    feature_mask: 1,
                    ..V2Extension::default()
                },
            )
        } else {
            let ip = ip.unwrap_or(IpArea::ipv4(Ipv4Addr::UNSPECIFIED, 0));
            Proposal::v1_linux(c.peer_id, c.gid, c.mac, ip)
        }
    }

    fn send(&mut self, m: &ClcMessage) {
        match m.to_vec() {
            Ok(v) => self.out.extend_from_slice(&v),
            // Our own messages are built from bounded values; an emit failure is a bug.
            Err(e) => tracing::error!(error = %e, "CLC emit failed"),
        }
    }

    fn finish_fallback(&mut self, r: FallbackReason) {
        tracing::debug!(reason = %r, "SMC-R fallback to TCP");
        self.state = State::Fallback;
        self.outcome = Outcome::Fallback(r);
        let rest = std::mem::take(&mut self.inbuf);
        self.app.extend_from_slice(&rest);
    }

    fn finish_reset(&mut self, r: ResetReason) {
        tracing::debug!(reason = %r, "CLC handshake: reset");
        self.state = State::Reset;
        self.outcome = Outcome::Reset(r);
        self.inbuf.clear();
    }

    fn decline_and_fall_back(&mut self, d: Diagnosis, out_of_sync: bool) {
        let dec = if self.chosen_version >= 2 {
            Decline::v2(self.caps.peer_id, d, out_of_sync)
        } else {
            Decline::new(self.caps.peer_id, d, out_of_sync)
        };
        self.send(&ClcMessage::Decline(dec));
        self.finish_fallback(FallbackReason::Declined(d));
    }

    /// Octets from the TCP connection. Returns the (possibly new) outcome.
    pub fn on_bytes(&mut self, data: &[u8]) -> &Outcome {
        match self.state {
            State::Fallback => {
                self.app.extend_from_slice(data);
                return &self.outcome;
            }
            State::Reset => return &self.outcome,
            _ => {}
        }
        self.inbuf.extend_from_slice(data);
        while !self.inbuf.is_empty() && !matches!(self.state, State::Fallback | State::Reset) {
            let n = match clc::frame_len(&self.inbuf) {
                Err(e) => {
                    self.finish_reset(ResetReason::Malformed(e));
                    break;
                }
                Ok(None) => break,
                Ok(Some(n)) if n > self.inbuf.len() => break,
                Ok(Some(n)) => n,
            };
            let msg = match ClcMessage::parse(&self.inbuf[..n]) {
                Ok(m) => m,
                Err(e) => {
                    self.finish_reset(ResetReason::Malformed(e));
                    break;
                }
            };
            self.inbuf.drain(..n);
            self.on_message(msg);
        }
        &self.outcome
    }

    fn on_message(&mut self, msg: ClcMessage) {
        if let ClcMessage::Decline(d) = &msg {
            // A Decline may replace any expected message, and during first contact it may
            // follow Accept/Confirm until the peer's point of no return.
            let allowed = match self.state {
                State::WaitProposal | State::WaitAccept { .. } | State::WaitConfirm { .. } => true,
                State::Done { first_contact, .. } => first_contact,
                _ => false,
            };
            if allowed {
                self.finish_fallback(FallbackReason::PeerDeclined {
                    diagnosis: d.diagnosis,
                    out_of_sync: d.out_of_sync,
                });
            } else {
                self.finish_reset(ResetReason::Unexpected(ClcType::Decline));
            }
            return;
        }
        match (self.role, &self.state, msg) {
            (Role::Server, State::WaitProposal, ClcMessage::Proposal(p)) => self.on_proposal(p),
            (Role::Client, State::WaitAccept { pending_decline }, ClcMessage::Accept(a)) => {
                if let Some(d) = *pending_decline {
                    self.chosen_version = a.version.min(2);
                    self.decline_and_fall_back(d, false);
                } else {
                    self.on_accept(a);
                }
            }
            (
                Role::Server,
                State::WaitConfirm {
                    first_contact,
                    pending_decline,
                },
                ClcMessage::Confirm(c),
            ) => {
                let first_contact = *first_contact;
                if let Some(d) = *pending_decline {
                    self.decline_and_fall_back(d, false);
                } else if let Err(e) = c.check_enums() {
                    tracing::debug!(error = %e, "Confirm with a bad enumerated value");
                    self.decline_and_fall_back(Diagnosis::CONFIG_ERROR, false);
                } else if c.version != self.chosen_version {
                    self.decline_and_fall_back(Diagnosis::VERSION_MISMATCH, false);
                } else if let Some(d) = self.confirm_caps_mismatch(&c) {
                    self.decline_and_fall_back(d, false);
                } else {
                    self.state = State::Done {
                        first_contact,
                        past_pnr: false,
                    };
                    self.outcome = Outcome::Proceed(Box::new(c));
                }
            }
            (_, _, m) => self.finish_reset(ResetReason::Unexpected(m.ty())),
        }
    }

    /// Linux's rule (`smc_clc_v2x_features_confirm_check`): a v2 first-contact Confirm
    /// echoes the max connections / max links our Accept announced.
    fn confirm_caps_mismatch(&self, c: &AcceptConfirm) -> Option<Diagnosis> {
        let (conns, links) = self.accepted_caps?;
        let x = c.v2.as_ref()?.fce.as_ref()?.v2x?;
        if x.max_conns != conns {
            Some(Diagnosis::MAX_CONN_ERR)
        } else if x.max_links != links {
            Some(Diagnosis::MAX_LINK_ERR)
        } else {
            None
        }
    }

    fn on_proposal(&mut self, p: Proposal) {
        let c = &self.caps;
        if !c.enabled {
            return self.decline_and_fall_back(Diagnosis::CONFIG_ERROR, false);
        }
        // v2: an EID in common (ours first, so the UEID wins).
        if c.v2 && p.offers_v2_r() {
            let theirs = p.v2_ext.as_ref().map(|e| e.eids.clone()).unwrap_or_default();
            if let Some(eid) = c.eids.iter().find(|e| theirs.contains(e)).copied() {
                self.chosen_version = 2;
                self.eid = Some(eid);
                self.peer_caps = p.v2_ext.as_ref().map(|e| (e.max_conns, e.max_links));
                let version = 2;
                self.state = State::ServerDecide {
                    version,
                    eid: Some(eid),
                    proposal: Box::new(p.clone()),
                };
                self.outcome = Outcome::NeedLink(Box::new(NeedLink::Proposal {
                    proposal: p,
                    version,
                    eid: Some(eid),
                }));
                return;
            }
        }
        if c.v1 && p.offers_v1_r() {
            let subnet_ok = match (&p.ip, c.ipv4, c.ipv6) {
                (Some(ip), Some((a, l)), _) => ip.same_subnet(a, l),
                (Some(ip), None, Some((a, l))) => ip
                    .ipv6
                    .iter()
                    .any(|&(pa, pl)| pl == l && l <= 128 && v6_prefix(pa, l) == v6_prefix(a, l)),
                _ => false,
            };
            if !subnet_ok {
                return self.decline_and_fall_back(Diagnosis::DIFF_PREFIX, false);
            }
            self.chosen_version = 1;
            self.state = State::ServerDecide {
                version: 1,
                eid: None,
                proposal: Box::new(p.clone()),
            };
            self.outcome = Outcome::NeedLink(Box::new(NeedLink::Proposal {
                proposal: p,
                version: 1,
                eid: None,
            }));
            return;
        }
        let d = if c.v2 && p.offers_v2_r() {
            Diagnosis::NO_UEID
        } else if p.typev1 == SmcType::D || p.typev2 == SmcType::D {
            Diagnosis::MODE_UNSUPP
        } else {
            Diagnosis::VERSION_MISMATCH
        };
        if p.version >= 2 && c.v2 {
            self.chosen_version = 2;
        }
        self.decline_and_fall_back(d, false)
    }

    fn on_accept(&mut self, a: AcceptConfirm) {
        let offered_v2 = self.caps.v2 && !self.caps.eids.is_empty();
        let offered_v1 = self.caps.v1 && self.caps.has_ip();
        self.chosen_version = if a.version >= 2 { 2 } else { 1 };
        if a.version >= 2 && !offered_v2 || a.version == 1 && !offered_v1 {
            return self.decline_and_fall_back(Diagnosis::VERSION_MISMATCH, false);
        }
        if let Err(e) = a.check_enums() {
            tracing::debug!(error = %e, "Accept with a bad enumerated value (F3)");
            return self.decline_and_fall_back(Diagnosis::CONFIG_ERROR, false);
        }
        if let Some(v2) = &a.v2 {
            if !self.caps.eids.contains(&v2.eid) {
                return self.decline_and_fall_back(Diagnosis::NO_UEID, false);
            }
            self.eid = Some(v2.eid);
            if let Some(x) = v2.fce.as_ref().and_then(|f| f.v2x) {
                if x.max_links == 0 || x.max_links > self.caps.max_links.max(1) {
                    return self.decline_and_fall_back(Diagnosis::MAX_LINK_ERR, false);
                }
                if x.max_conns == 0 || x.max_conns > self.caps.max_conns.max(1) {
                    return self.decline_and_fall_back(Diagnosis::MAX_CONN_ERR, false);
                }
                self.peer_caps = Some((x.max_conns, x.max_links));
            }
        }
        self.state = State::ClientDecide {
            accept: Box::new(a.clone()),
        };
        self.outcome = Outcome::NeedLink(Box::new(NeedLink::Accept(a)));
    }

    fn build(&self, p: &LinkParams, first_contact: bool, confirm: bool) -> AcceptConfirm {
        let c = &self.caps;
        let mut m = AcceptConfirm::v1(
            first_contact,
            c.peer_id,
            c.gid,
            c.mac,
            p.qpn,
            p.rmb_rkey,
            p.rmbe_idx,
            p.alert_token,
            p.rmbe_size,
            p.qp_mtu,
            p.rmb_vaddr,
            p.psn,
        );
        if self.chosen_version >= 2 {
            m.version = 2;
            let (max_conns, max_links) = match self.peer_caps {
                Some((pc, pl)) if !confirm => (pc.min(c.max_conns), pl.min(c.max_links)),
                Some(x) => x,
                None => (c.max_conns, c.max_links),
            };
            let fce = first_contact.then_some(FirstContactExt {
                v2_direct: true,
                os_type: 2,
                release: 1,
                hostname: c.hostname,
                v2x: Some(FceV2x {
                    max_conns,
                    max_links,
                    feature_mask: 1,
                    vendor_exp_options: 0,
                }),
            });
            m.v2 = Some(AcceptConfirmV2 {
                eid: self.eid.unwrap_or([b' '; EID_LEN]),
                gid_list: (confirm && first_contact).then(|| vec![c.gid]),
                fce,
            });
        }
        m
    }

    /// Server: answer the Proposal with an Accept (`first_contact` = F flag: a new link
    /// group). The QP must be in INIT and the RMB element ready (SMC-FC-3).
    pub fn accept(&mut self, params: &LinkParams, first_contact: bool) -> Result<(), MachineError> {
        if !matches!(self.state, State::ServerDecide { .. }) {
            return Err(MachineError::WrongState("accept"));
        }
        let a = self.build(params, first_contact, false);
        self.accepted_caps =
            a.v2.as_ref()
                .and_then(|v| v.fce.as_ref())
                .and_then(|f| f.v2x)
                .map(|x| (x.max_conns, x.max_links));
        self.send(&ClcMessage::Accept(a));
        self.state = State::WaitConfirm {
            first_contact,
            pending_decline: None,
        };
        self.outcome = Outcome::Pending;
        Ok(())
    }

    /// Client: answer the Accept with a Confirm; SMC-R proceeds (the returned outcome is
    /// `Proceed` with the server's Accept).
    pub fn confirm(&mut self, params: &LinkParams) -> Result<(), MachineError> {
        let State::ClientDecide { accept } = &self.state else {
            return Err(MachineError::WrongState("confirm"));
        };
        let accept = accept.clone();
        let c = self.build(params, accept.first_contact, true);
        self.send(&ClcMessage::Confirm(c));
        self.state = State::Done {
            first_contact: accept.first_contact,
            past_pnr: false,
        };
        self.outcome = Outcome::Proceed(accept);
        Ok(())
    }

    /// Decline with `diagnosis` (S flag: `out_of_sync`, F5) and fall back. Allowed instead
    /// of the next CLC message we owe (server deciding on a Proposal, client deciding on an
    /// Accept); while the client waits for the Accept it is remembered and sent in place of
    /// the Confirm (F4, SMC-CLC-7); after Proceed only during first contact and before
    /// [`point_of_no_return`](Self::point_of_no_return) (F6–F8).
    pub fn decline(&mut self, diagnosis: Diagnosis, out_of_sync: bool) -> Result<(), MachineError> {
        match &mut self.state {
            State::ServerDecide { .. } | State::ClientDecide { .. } => {
                self.decline_and_fall_back(diagnosis, out_of_sync);
                Ok(())
            }
            State::WaitAccept { pending_decline } => {
                *pending_decline = Some(diagnosis);
                Ok(())
            }
            State::Done {
                first_contact: true,
                past_pnr: false,
            } => {
                self.decline_and_fall_back(diagnosis, out_of_sync);
                Ok(())
            }
            State::WaitConfirm {
                first_contact: true,
                pending_decline,
            } => {
                *pending_decline = Some(diagnosis);
                Ok(())
            }
            State::Done { .. } | State::WaitConfirm { .. } => Err(MachineError::DeclineTooLate),
            _ => Err(MachineError::WrongState("decline")),
        }
    }

    /// The engine passed the point of no return (C.2, C.3): from now on failures reset or
    /// fail over, a Decline is no longer possible.
    pub fn point_of_no_return(&mut self) {
        if let State::Done { past_pnr, .. } = &mut self.state {
            *past_pnr = true;
        }
    }

    /// The CLC timer expired (F10): reset unless the handshake already decided.
    pub fn on_timeout(&mut self) -> &Outcome {
        if !matches!(self.state, State::Done { .. } | State::Fallback | State::Reset) {
            self.finish_reset(ResetReason::Timeout);
        }
        &self.outcome
    }

    /// The peer closed its side before the handshake decided.
    pub fn on_eof(&mut self) -> &Outcome {
        if !matches!(self.state, State::Done { .. } | State::Fallback | State::Reset) {
            self.finish_reset(ResetReason::Closed);
        }
        &self.outcome
    }
}

#[cfg(test)]
mod tests;
