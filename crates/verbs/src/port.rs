//! Ports, GIDs and P_Keys (`ibv_query_port`, `ibv_query_gid`, `ibv_query_pkey`).
//!
//! Every device has ports numbered from 1. A port has a state, an MTU, a GID
//! table (for RoCEv2 the IPv4-mapped or IPv6 addresses the device is bound to)
//! and a P_Key table (the default partition 0xffff at index 0). Providers
//! answer through [`Provider::query_port`](crate::cm::Provider::query_port) and
//! its siblings; the defaults describe one Ethernet port that is up, with one
//! zero GID and the default P_Key, which is what an iWARP device (addressed by
//! IP and TCP port, not by GID) reports.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::qp_attr::{Gid, Mtu};

/// The default (full-membership) partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Port state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    Down = 1,
    Init = 2,
    Armed = 3,
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
    InfiniBand,
    Ethernet,
}

/// Port attributes (`ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Entries in the P_Key table.
    pub pkey_tbl_len: u16,
    pub link_layer: LinkLayer,
    /// Local identifier (0 on Ethernet link layers).
    pub lid: u16,
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

impl Device {
    /// Number of physical ports (`ibv_device_attr.phys_port_cnt`).
    pub fn phys_port_cnt(&self) -> u8 {
        self.provider().phys_port_cnt()
    }

    fn check_port(&self, port_num: u8) -> Result<()> {
        if port_num == 0 || port_num > self.phys_port_cnt() {
            return Err(Error::InvalidArgument(format!(
                "port {port_num}: the device has ports 1..={}",
                self.phys_port_cnt()
            )));
        }
        Ok(())
    }

    /// Attributes of port `port_num` (`ibv_query_port`; ports count from 1).
    pub fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        self.check_port(port_num)?;
        Ok(self.provider().query_port(port_num))
    }

    /// Entry `index` of the port's GID table (`ibv_query_gid`).
    pub fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        self.check_port(port_num)?;
        self.provider()
            .gid_table(port_num)
            .get(index as usize)
            .copied()
            .ok_or_else(|| Error::InvalidArgument(format!("GID index {index} beyond the table")))
    }

    /// Entry `index` of the port's P_Key table (`ibv_query_pkey`).
    pub fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16> {
        self.check_port(port_num)?;
        self.provider()
            .pkey_table(port_num)
            .get(index as usize)
            .copied()
            .ok_or_else(|| Error::InvalidArgument(format!("P_Key index {index} beyond the table")))
    }
}
