//! Address handles (`ibv_ah`): the destination of an unreliable-datagram
//! send (`wr.ud.ah` in rdma-core), made by a provider from an [`AhAttr`],
//! and the address types it is made of ([`Gid`], [`AhAttr`]).

use std::any::Any;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// A 128-bit global identifier (`ibv_gid`). RoCEv2 GIDs are the device's IPv6
/// addresses, or IPv4 addresses in their IPv4-mapped form (`::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID of an IPv4 address.
    pub fn from_ipv4(a: Ipv4Addr) -> Gid {
        Gid(a.to_ipv6_mapped().octets())
    }
    /// The GID of an IP address (IPv4 as IPv4-mapped).
    pub fn from_ip(a: IpAddr) -> Gid {
        match a {
            IpAddr::V4(v4) => Gid::from_ipv4(v4),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }
    /// The address this GID stands for (IPv4-mapped GIDs give IPv4).
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
    /// Whether this is a multicast GID: first octet 0xff, or the IPv4-mapped form of an
    /// IPv4 multicast address (224.0.0.0/4), which RoCEv2 uses as the MGID of an IPv4
    /// group (Linux `rdma_is_multicast_addr`).
    pub fn is_multicast(self) -> bool {
        match Ipv6Addr::from(self.0).to_ipv4_mapped() {
            Some(v4) => v4.is_multicast(),
            None => self.0[0] == 0xff,
        }
    }
}

impl std::fmt::Display for Gid {
    /// `ibv_devinfo`'s form: eight groups of four hex digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// An address vector (`ibv_ah_attr` with its GRH): where a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID (for RoCEv2: the peer's IP address as a GID).
    pub dgid: Gid,
    /// Index of our source GID in the port's GID table.
    pub sgid_index: u8,
    /// Flow label of the GRH (20 bits).
    pub flow_label: u32,
    /// Hop limit of the GRH (IPv6 hop limit on RoCEv2).
    pub hop_limit: u8,
    /// Traffic class of the GRH (IPv4 TOS / IPv6 traffic class on RoCEv2).
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// The local port the packets leave from (counted from 1).
    pub port_num: u8,
}

impl AhAttr {
    /// An address vector to `dgid` from GID index 0 of port 1, hop limit 64.
    pub fn to_gid(dgid: Gid) -> AhAttr {
        AhAttr {
            dgid,
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            port_num: 1,
        }
    }
}

/// A provider's address handle.
pub trait AhOps: Send + Sync + 'static {
    /// The attributes the handle was created with (`ibv_query_ah`).
    fn attr(&self) -> AhAttr;
    /// For the provider's own code: its concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// An address handle (`ibv_ah`), from
/// [`ProtectionDomain::create_ah`](crate::ProtectionDomain::create_ah).
/// Cheap to clone; destroyed (`ibv_destroy_ah`) with its last handle.
#[derive(Clone)]
pub struct AddressHandle {
    ops: Arc<dyn AhOps>,
    pd_id: u32,
}

impl AddressHandle {
    /// For the verbs layer: wraps a provider's handle.
    pub(crate) fn new(ops: Arc<dyn AhOps>, pd_id: u32) -> Self {
        AddressHandle { ops, pd_id }
    }
    /// The attributes it was made from.
    pub fn attr(&self) -> AhAttr {
        self.ops.attr()
    }
    /// The protection domain it belongs to.
    pub fn pd_id(&self) -> u32 {
        self.pd_id
    }
    /// For providers: their own handle.
    pub fn ops(&self) -> &Arc<dyn AhOps> {
        &self.ops
    }
}

impl PartialEq for AddressHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.ops, &other.ops)
    }
}

impl Eq for AddressHandle {}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AddressHandle({:?})", self.ops.attr())
    }
}
