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
    /// Whether this is a multicast GID: first octet 0xff, or (RoCEv2) an IPv4-mapped IPv4
    /// multicast address (`::ffff:224.0.0.0/100`).
    pub fn is_multicast(self) -> bool {
        self.0[0] == 0xff
            || Ipv6Addr::from(self.0)
                .to_ipv4_mapped()
                .is_some_and(|a| a.is_multicast())
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

/// The 40-octet GRH area at the front of a UD receive buffer (`struct ibv_grh`), as a
/// RoCEv2 provider fills it from the IP header the datagram came in: an IPv6 header as
/// is, or 20 zero octets followed by the IPv4 header (Linux rxe's `rdma_network_hdr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grh {
    /// The sender's address as a GID (IPv4 as IPv4-mapped).
    pub sgid: Gid,
    /// The destination address as a GID (a multicast group for multicast).
    pub dgid: Gid,
    /// IPv6 traffic class / IPv4 TOS.
    pub traffic_class: u8,
    /// IPv6 flow label (0 for IPv4).
    pub flow_label: u32,
    /// IPv6 hop limit / IPv4 TTL.
    pub hop_limit: u8,
    /// Whether the area held an IPv4 header.
    pub ipv4: bool,
}

/// The IPv4 header checksum (RFC 791) over `h`, whose checksum field is included.
fn ipv4_csum(h: &[u8]) -> u16 {
    let mut s: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

impl Grh {
    /// Octets of the GRH area.
    pub const LEN: usize = 40;

    /// Reads the GRH area the way rdma-core's `ibv_init_ah_from_wc` does for RoCE: an IPv4
    /// header (version 4, IHL 5, good checksum) in the last 20 octets makes it IPv4;
    /// otherwise an IPv6 header (version 6) at the front. `None` if neither.
    pub fn parse(b: &[u8]) -> Option<Grh> {
        let b: &[u8; 40] = b.get(..Self::LEN)?.try_into().ok()?;
        let v4 = &b[20..40];
        if v4[0] == 0x45 && ipv4_csum(v4) == 0 {
            let s = Ipv4Addr::new(v4[12], v4[13], v4[14], v4[15]);
            let d = Ipv4Addr::new(v4[16], v4[17], v4[18], v4[19]);
            return Some(Grh {
                sgid: Gid::from_ipv4(s),
                dgid: Gid::from_ipv4(d),
                traffic_class: v4[1],
                flow_label: 0,
                hop_limit: v4[8],
                ipv4: true,
            });
        }
        if b[0] >> 4 == 6 {
            let w = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            let mut sgid = [0u8; 16];
            let mut dgid = [0u8; 16];
            sgid.copy_from_slice(&b[8..24]);
            dgid.copy_from_slice(&b[24..40]);
            return Some(Grh {
                sgid: Gid(sgid),
                dgid: Gid(dgid),
                traffic_class: (w >> 20) as u8,
                flow_label: w & 0xf_ffff,
                hop_limit: b[7],
                ipv4: false,
            });
        }
        None
    }
}

impl AhAttr {
    /// The address vector back to the sender of a UD receive (`ibv_init_ah_from_wc`):
    /// `grh` is the first 40 octets of the receive buffer of a completion with
    /// [`WcFlags::GRH`](crate::WcFlags::GRH); `sgid_index` is our GID matching its
    /// destination (the caller looks it up; 0 on a one-GID port). Hop limit 0xff and the
    /// traffic class and flow label of the received header, as rdma-core sets them.
    pub fn from_wc(wc: &crate::WorkCompletion, grh: &[u8], sgid_index: u8, port_num: u8) -> Option<AhAttr> {
        if !wc.wc_flags.contains(crate::WcFlags::GRH) {
            return None;
        }
        let g = Grh::parse(grh)?;
        Some(AhAttr {
            dgid: g.sgid,
            sgid_index,
            flow_label: g.flow_label,
            hop_limit: 0xff,
            traffic_class: g.traffic_class,
            sl: wc.sl,
            port_num,
        })
    }
}
