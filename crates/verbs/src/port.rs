//! Ports, GIDs and P_Keys (`ibv_query_port`, `ibv_query_gid`, `ibv_query_pkey`).
//!
//! Every device has ports numbered from 1. A port has a state, an MTU, a GID
//! table (for RoCEv2 the IPv4-mapped or IPv6 addresses the device is bound to)
//! and a P_Key table (the default partition 0xffff at index 0). Providers
//! answer through [`Provider::query_port`](crate::provider::Provider::query_port) and
//! its siblings; the defaults describe one Ethernet port that is up, with one
//! zero GID and the default P_Key, which is what an iWARP device (addressed by
//! IP and TCP port, not by GID) reports.

use crate::qp_attr::Mtu;

/// The default (full-membership) partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Port state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// `IBV_PORT_DOWN`: no link.
    Down = 1,
    /// `IBV_PORT_INIT`: link up, not yet configured.
    Init = 2,
    /// `IBV_PORT_ARMED`: configured, not yet active.
    Armed = 3,
    /// `IBV_PORT_ACTIVE`: ready for traffic.
    Active = 4,
}

impl PortState {
    /// `ibv_port_state_str`'s name.
    pub fn as_str(self) -> &'static str {
        match self {
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
        }
    }
}

/// What the port's link is (`IBV_LINK_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// An InfiniBand link.
    InfiniBand,
    /// Ethernet (iWARP, RoCE).
    Ethernet,
}

/// Port attributes (`ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// The port's state.
    pub state: PortState,
    /// The largest MTU the port supports.
    pub max_mtu: Mtu,
    /// The MTU in use.
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Entries in the P_Key table.
    pub pkey_tbl_len: u16,
    /// The link layer (`IBV_LINK_LAYER_*`).
    pub link_layer: LinkLayer,
    /// Local identifier (0 on Ethernet link layers).
    pub lid: u16,
    /// The subnet manager's LID (0 on Ethernet).
    pub sm_lid: u16,
}

impl Default for PortAttr {
    /// One Ethernet port that is up, MTU 1024 of at most 4096, one GID, one P_Key.
    fn default() -> Self {
        PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu1024,
            gid_tbl_len: 1,
            pkey_tbl_len: 1,
            link_layer: LinkLayer::Ethernet,
            lid: 0,
            sm_lid: 0,
        }
    }
}
