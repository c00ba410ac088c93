//! What librdmacm (the kernel's rdma_cm, `drivers/infiniband/core/cma.c`) adds to the IB CM
//! on RoCE, so that rping, perftest `-R` and NFS/RDMA accept us and we accept them
//! (`peers-and-interop-facts.md` §1.3; lab README "RoCEv2 from the host"):
//!
//! - the **service ID** of an IP port: `port space << 16 | port` in the low 32 bits, with
//!   `0x0000000001060000` for RDMA_PS_TCP (`RDMA_IB_IP_PS_TCP` in `rdma_cm.h`);
//! - the 36-octet **`cma_hdr`** at the start of the REQ's private data (so at most 56 octets
//!   remain for the application), and nothing of its own in REP, REJ, RTU, DREQ or DREP:
//!
//! ```text
//!  0 cma_version (0) | 1 ip_version << 4 | 2 port (16, the *source* port of the connector)
//!  4 source address (16: IPv6, or IPv4 in the last 4 octets after 12 zero octets)
//! 20 destination address (16, same form)
//! ```
//!
//! In the UDP port space (`RDMA_PS_UDP`, UD QPs) the same header starts the SIDR_REQ's
//! private data (`cma_resolve_ib_udp`), leaving 180 octets for the application; the
//! SIDR_REP carries only the application's (`cma_send_sidr_rep`), and its Q_Key must be
//! `RDMA_UDP_QKEY` 0x01234567 or the requester reports the peer unreachable
//! (`cma_sidr_rep_handler`). Multicast groups on RoCEv2 have no SA: the MGID is the IP
//! multicast address itself, an IPv4 one in its IPv4-mapped form (`cma_iboe_set_mgid`,
//! [`iboe_mgid`]).
//!
//! A listener on rdma_cm checks the version and the IP version; Linux answers a header whose
//! destination is not the listener's address with REJ 28 (measured, `--cma-dst`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::mad::REQ_PDATA;

/// Octets of the rdma_cm header.
pub const CMA_HDR_LEN: usize = 36;
/// `CMA_VERSION`.
pub const CMA_VERSION: u8 = 0x00;
/// Application private data that fits in a REQ after the header (92 - 36).
pub const CMA_REQ_ULP_PDATA: usize = REQ_PDATA - CMA_HDR_LEN;
/// Application private data that fits in a SIDR_REQ after the header (216 - 36).
pub const CMA_SIDR_ULP_PDATA: usize = super::mad::SIDR_REQ_PDATA - CMA_HDR_LEN;
/// The upper 48 bits of an IP-based service ID (`RDMA_IB_IP_PS_MASK`).
pub const IP_PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;

/// An rdma_cm port space (`enum rdma_ucm_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB` 0x0002.
    Ipoib,
    /// `RDMA_PS_TCP` 0x0106: reliable connected, what rping, perftest and NFS/RDMA use.
    Tcp,
    /// `RDMA_PS_UDP` 0x0111.
    Udp,
    /// `RDMA_PS_IB` 0x013F.
    Ib,
}

impl PortSpace {
    /// The numeric port space.
    pub fn code(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013F,
        }
    }
    fn from_code(c: u16) -> Option<PortSpace> {
        [PortSpace::Ipoib, PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib]
            .into_iter()
            .find(|p| p.code() == c)
    }
}

/// The service ID rdma_cm uses for `port` in port space `ps` (`cma_get_service_id`):
/// `0x0000000001061c06` for RDMA_PS_TCP port 7174.
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    (u64::from(ps.code()) << 16) | u64::from(port)
}

/// The port space and port of an rdma_cm service ID, if it is one.
pub fn parse_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    if sid >> 32 != 0 {
        return None;
    }
    let ps = PortSpace::from_code(((sid >> 16) & 0xffff) as u16)?;
    Some((ps, (sid & 0xffff) as u16))
}

/// Why an rdma_cm header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmaError {
    /// The private data is shorter than the 36-octet rdma_cm header (the octets present).
    #[error("rdma_cm header needs 36 octets, private data has {0}")]
    Short(usize),
    /// The header's cma_version is not 0 (the version given).
    #[error("rdma_cm header version {0}, expected 0")]
    Version(u8),
    /// The header's ip_version is not 4 or 6 (the version given).
    #[error("rdma_cm header IP version {0}, expected 4 or 6")]
    IpVersion(u8),
    /// Source and destination addresses are of different IP versions.
    #[error("source and destination are not the same IP version")]
    Mixed,
    /// The application private data does not fit after the rdma_cm header in a REQ.
    #[error("application private data of {len} octets, a REQ has room for {max} after the rdma_cm header")]
    TooLong {
        /// Octets of application private data given.
        len: usize,
        /// Octets a REQ has room for after the header (56).
        max: usize,
    },
}

/// The rdma_cm header (`struct cma_hdr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHdr {
    /// The connecting side's address and port.
    pub src: SocketAddr,
    /// The address it connects to (the port is the service ID's, not in the header).
    pub dst: IpAddr,
}

fn addr_bytes(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&v4.octets());
            b
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn addr_from(b: &[u8], v4: bool) -> IpAddr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    if v4 {
        IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))
    } else {
        IpAddr::V6(Ipv6Addr::from(a))
    }
}

impl CmaHdr {
    /// Parses the header at the start of a REQ's private data.
    pub fn parse(pdata: &[u8]) -> Result<CmaHdr, CmaError> {
        if pdata.len() < CMA_HDR_LEN {
            return Err(CmaError::Short(pdata.len()));
        }
        if pdata[0] != CMA_VERSION {
            return Err(CmaError::Version(pdata[0]));
        }
        let v4 = match pdata[1] >> 4 {
            4 => true,
            6 => false,
            v => return Err(CmaError::IpVersion(v)),
        };
        let port = u16::from_be_bytes([pdata[2], pdata[3]]);
        Ok(CmaHdr {
            src: SocketAddr::new(addr_from(&pdata[4..20], v4), port),
            dst: addr_from(&pdata[20..36], v4),
        })
    }

    /// The 36 header octets.
    pub fn emit(&self) -> Result<[u8; CMA_HDR_LEN], CmaError> {
        let ver = match (self.src.ip(), self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            _ => return Err(CmaError::Mixed),
        };
        let mut b = [0u8; CMA_HDR_LEN];
        b[0] = CMA_VERSION;
        b[1] = ver << 4;
        b[2..4].copy_from_slice(&self.src.port().to_be_bytes());
        b[4..20].copy_from_slice(&addr_bytes(self.src.ip()));
        b[20..36].copy_from_slice(&addr_bytes(self.dst));
        Ok(b)
    }

    /// A REQ's private data: this header followed by the application's (≤ 56 octets).
    pub fn req_private_data(&self, ulp: &[u8]) -> Result<Vec<u8>, CmaError> {
        if ulp.len() > CMA_REQ_ULP_PDATA {
            return Err(CmaError::TooLong {
                len: ulp.len(),
                max: CMA_REQ_ULP_PDATA,
            });
        }
        let mut v = self.emit()?.to_vec();
        v.extend_from_slice(ulp);
        Ok(v)
    }
}

impl CmaHdr {
    /// A SIDR_REQ's private data: this header followed by the application's (≤ 180 octets).
    pub fn sidr_private_data(&self, ulp: &[u8]) -> Result<Vec<u8>, CmaError> {
        if ulp.len() > CMA_SIDR_ULP_PDATA {
            return Err(CmaError::TooLong {
                len: ulp.len(),
                max: CMA_SIDR_ULP_PDATA,
            });
        }
        let mut v = self.emit()?.to_vec();
        v.extend_from_slice(ulp);
        Ok(v)
    }
}

/// The MGID of IP multicast group `group` on RoCEv2 (Linux `cma_iboe_set_mgid` with the
/// RoCEv2 GID type): an IPv4 group (224.0.0.0/4) as its IPv4-mapped GID
/// `::ffff:224.x.y.z`, an IPv6 group (ff00::/8) as itself. `None` if `group` is not a
/// multicast address.
pub fn iboe_mgid(group: IpAddr) -> Option<verbs::Gid> {
    group.is_multicast().then(|| verbs::Gid::from_ip(group))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rdma_cm service IDs (issue 13 item 4, peers file §1.3): RDMA_PS_TCP port 7174 is
    /// 0x0000000001061c06 (lab README, pcap frame 1).
    #[test]
    fn service_id_of_rping_port() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(parse_service_id(0x0000_0000_0106_1c06), Some((PortSpace::Tcp, 7174)));
        assert_eq!(service_id(PortSpace::Tcp, 7174) & IP_PS_MASK, 0x0106_0000);
        assert_eq!(parse_service_id(0x0000_0001_0106_1c06), None);
        assert_eq!(parse_service_id(0x0000_0000_0107_1c06), None);
    }

    /// The header of pcap frame 1: version 0, IPv4, source port 0x83ad, 192.168.77.1 -> .2.
    #[test]
    fn header_of_frame1() {
        let mut b = [0u8; 36];
        b[1] = 0x40;
        b[2..4].copy_from_slice(&[0x83, 0xad]);
        b[16..20].copy_from_slice(&[192, 168, 77, 1]);
        b[32..36].copy_from_slice(&[192, 168, 77, 2]);
        let h = CmaHdr::parse(&b).unwrap();
        assert_eq!(h.src, "192.168.77.1:33709".parse().unwrap());
        assert_eq!(h.dst, "192.168.77.2".parse::<IpAddr>().unwrap());
        assert_eq!(h.emit().unwrap(), b);
    }

    #[test]
    fn ipv6_and_errors() {
        let h = CmaHdr {
            src: "[fe80::1]:4000".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        };
        let b = h.emit().unwrap();
        assert_eq!(b[1], 0x60);
        assert_eq!(CmaHdr::parse(&b).unwrap(), h);
        let mut bad = b;
        bad[0] = 1;
        assert_eq!(CmaHdr::parse(&bad), Err(CmaError::Version(1)));
        bad = b;
        bad[1] = 0x50;
        assert_eq!(CmaHdr::parse(&bad), Err(CmaError::IpVersion(5)));
        assert_eq!(CmaHdr::parse(&b[..35]), Err(CmaError::Short(35)));
        let mixed = CmaHdr {
            src: "1.2.3.4:1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        };
        assert_eq!(mixed.emit(), Err(CmaError::Mixed));
        assert_eq!(h.req_private_data(&[7; 56]).unwrap().len(), 92);
        assert_eq!(
            h.req_private_data(&[7; 57]),
            Err(CmaError::TooLong { len: 57, max: 56 })
        );
        assert_eq!(h.sidr_private_data(&[7; 180]).unwrap().len(), 216);
        assert_eq!(
            h.sidr_private_data(&[7; 181]),
            Err(CmaError::TooLong { len: 181, max: 180 })
        );
    }

    /// Issue 14 "MGID <-> IP multicast address mapping as Linux does for RoCEv2".
    #[test]
    fn multicast_gids() {
        let g = iboe_mgid("239.1.2.3".parse().unwrap()).unwrap();
        assert_eq!(g.0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3]);
        assert!(g.is_multicast());
        let g6 = iboe_mgid("ff0e::1234".parse().unwrap()).unwrap();
        assert_eq!(g6.0[0], 0xff);
        assert_eq!(g6.to_ip(), "ff0e::1234".parse::<IpAddr>().unwrap());
        assert_eq!(iboe_mgid("192.168.1.1".parse().unwrap()), None);
        assert_eq!(iboe_mgid("fe80::1".parse().unwrap()), None);
    }
}
