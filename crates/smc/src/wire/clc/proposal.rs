//! The Proposal message (RFC 7609 A1.4) in RFC 7609's v1 form and Linux's v1/v2 forms.
//!
//! 40 fixed octets (header, peer ID, GID, MAC, offset N to the IP area), then the N-octet
//! area, the IP area (IPv4 subnet, prefix length, 2 reserved, IPv6 prefix count, 17-octet
//! IPv6 prefixes), the v2 extension ([`V2Extension`], in `v2ext`), trailer. RFC 7609's form
//! has N = 0 (52 octets); Linux's has N = 40 and a 40-octet SMC-D area ([`SmcdArea`]) whose
//! octets 10..12 give the v2 extension's offset. A v2 Proposal that does not offer v1
//! (`typev1` = "none") has no IP area. E-4 (subnet, not address) and E-20 (length 52 + N +
//! 17·n) are followed here.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::header::{be16, be64, emit_header, out};
use super::{
    ClcEmitError, ClcError, ClcType, Eyecatcher, FIXED_PROPOSAL_LEN, Header, MAX_EIDS, MAX_IPV6_PREFIXES, PeerId,
    SMCD_AREA_LEN, SmcType, TRAILER_LEN, V2Extension,
};

/// The 40-octet SMC-D area Linux puts after a Proposal's fixed part (`smc_clc_msg_smcd`).
/// For SMC-R it is zero except for the v2-extension offset, which [`Proposal::emit`]
/// computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmcdArea {
    /// ISM GID of the requestor (SMC-D).
    pub ism_gid: u64,
    /// ISMv2 CHID (SMC-D).
    pub chid: u16,
    /// Vendor OUI.
    pub vendor_oui: [u8; 3],
    /// Vendor experimental options.
    pub vendor_exp_options: [u8; 5],
}

/// The Proposal's IP area (A1.4): IPv4 subnet and prefix length, IPv6 prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpArea {
    /// IPv4 subnet (address & mask; E-4), all zero for an IPv6 flow.
    pub subnet: Ipv4Addr,
    /// IPv4 prefix length (0 for IPv6).
    pub prefix_len: u8,
    /// IPv6 prefixes and their lengths (at most 8).
    pub ipv6: Vec<(Ipv6Addr, u8)>,
}

impl IpArea {
    /// The IPv4 area for address `addr` with prefix length `len`: subnet = addr & mask (E-4).
    pub fn ipv4(addr: Ipv4Addr, len: u8) -> Self {
        Self {
            subnet: Ipv4Addr::from(u32::from(addr) & mask(len)),
            prefix_len: len,
            ipv6: Vec::new(),
        }
    }
    /// SMC-FC-1 (E-4): whether a local interface `addr`/`len` is on the proposed subnet:
    /// same prefix length and same network address.
    pub fn same_subnet(&self, addr: Ipv4Addr, len: u8) -> bool {
        len == self.prefix_len && len <= 32 && u32::from(addr) & mask(len) == u32::from(self.subnet) & mask(len)
    }
    fn wire_len(&self) -> usize {
        8 + 17 * self.ipv6.len()
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

/// SMC Proposal (A1.4), v1 (RFC and Linux forms) or Linux v2.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Proposal {
    /// Eyecatcher.
    pub eyecatcher: Eyecatcher,
    /// Version nibble (1 or 2).
    pub version: u8,
    /// v2 header: SMC type offered for v2 (bits 0x0C); zero in v1.
    pub typev2: SmcType,
    /// SMC type offered for v1 (bits 0x03; Linux sets them in v1 Proposals too: 0 = SMC-R,
    /// 1 = SMC-D, 3 = both).
    pub typev1: SmcType,
    /// Client peer ID.
    pub peer_id: PeerId,
    /// Client preferred GID.
    pub gid: [u8; 16],
    /// Client preferred RoCE MAC.
    pub mac: [u8; 6],
    /// Linux's 40-octet SMC-D area (always present in Linux's forms, absent in RFC 7609's).
    pub smcd: Option<SmcdArea>,
    /// The IP area (absent in Linux's v2 form that does not offer v1).
    pub ip: Option<IpArea>,
    /// The v2 extension (v2 only; needs `smcd`, which holds its offset).
    pub v2_ext: Option<V2Extension>,
}

impl Proposal {
    /// Linux's 92-octet v1 IPv4 Proposal (the form tshark and Linux expect, §5.3.7).
    pub fn v1_linux(peer_id: PeerId, gid: [u8; 16], mac: [u8; 6], ip: IpArea) -> Self {
        Self {
            eyecatcher: Eyecatcher::Smcr,
            version: 1,
            typev2: SmcType::R,
            typev1: SmcType::R,
            peer_id,
            gid,
            mac,
            smcd: Some(SmcdArea::default()),
            ip: Some(ip),
            v2_ext: None,
        }
    }

    /// Linux's SMC-Rv2 Proposal. With `v1` = `Some((peer_id, gid, mac, ip))` it offers v1
    /// SMC-R as well (typev1 = R); without, typev1 = "none" and there is no IP area, as the
    /// lab's Linux 6.12 client sends it.
    pub fn v2_linux(v1: Option<(PeerId, [u8; 16], [u8; 6], IpArea)>, ext: V2Extension) -> Self {
        let (typev1, peer_id, gid, mac, ip) = match v1 {
            Some((p, g, m, ip)) => (SmcType::R, p, g, m, Some(ip)),
            None => (SmcType::None, PeerId::default(), [0; 16], [0; 6], None),
        };
        Self {
            eyecatcher: Eyecatcher::Smcr,
            version: 2,
            typev2: SmcType::R,
            typev1,
            peer_id,
            gid,
            mac,
            smcd: Some(SmcdArea::default()),
            ip,
            v2_ext: Some(ext),
        }
    }

    /// Whether the Proposal offers v1 SMC-R: typev1 R or both (a v1 Proposal from Linux
    /// that offers only SMC-D has typev1 = 1), and an IP area.
    pub fn offers_v1_r(&self) -> bool {
        self.typev1.offers_r() && self.ip.is_some()
    }

    /// Whether the Proposal offers v2 SMC-R with a v2 extension.
    pub fn offers_v2_r(&self) -> bool {
        self.version >= 2 && self.typev2.offers_r() && self.v2_ext.is_some()
    }

    /// The emitted length.
    pub fn wire_len(&self) -> usize {
        FIXED_PROPOSAL_LEN
            + self.smcd.map_or(0, |_| SMCD_AREA_LEN)
            + self.ip.as_ref().map_or(0, IpArea::wire_len)
            + self.v2_ext.as_ref().map_or(0, V2Extension::wire_len)
            + TRAILER_LEN
    }

    pub(super) fn parse_body(h: &Header, b: &[u8]) -> Result<Self, ClcError> {
        let len = b.len();
        let end = len - TRAILER_LEN;
        if len < FIXED_PROPOSAL_LEN + TRAILER_LEN {
            return Err(h.bad_length());
        }
        let n = usize::from(be16(&b[38..40]));
        let smcd_present = h.version >= 2 || n >= SMCD_AREA_LEN;
        let (smcd, v2_ext_offset) = if smcd_present {
            let a = b.get(40..40 + SMCD_AREA_LEN).filter(|_| 40 + SMCD_AREA_LEN <= end);
            let a = a.ok_or(ClcError::BadOffset { what: "SMC-D area" })?;
            let area = SmcdArea {
                ism_gid: be64(&a[0..8]),
                chid: be16(&a[8..10]),
                vendor_oui: a[12..15].try_into().unwrap_or_default(),
                vendor_exp_options: a[15..20].try_into().unwrap_or_default(),
            };
            (Some(area), usize::from(be16(&a[10..12])))
        } else {
            (None, 0)
        };
        let typev1 = SmcType::from_bits(h.flags);
        let typev2 = SmcType::from_bits(h.flags >> 2);
        let ip_present = h.version == 1 || typev1 != SmcType::None;
        let ip = if ip_present {
            let at = FIXED_PROPOSAL_LEN + n;
            if smcd.is_some() && n < SMCD_AREA_LEN {
                return Err(ClcError::BadOffset {
                    what: "IP area (overlaps the SMC-D area)",
                });
            }
            let a = b
                .get(at..at + 8)
                .filter(|_| at + 8 <= end)
                .ok_or(ClcError::BadOffset { what: "IP area" })?;
            let cnt = a[7];
            if usize::from(cnt) > MAX_IPV6_PREFIXES {
                return Err(ClcError::TooManyPrefixes(cnt));
            }
            let pend = at + 8 + 17 * usize::from(cnt);
            if pend > end {
                return Err(ClcError::BadOffset {
                    what: "IPv6 prefix array",
                });
            }
            let ipv6 = b[at + 8..pend]
                .chunks_exact(17)
                .map(|c| {
                    (
                        Ipv6Addr::from(<[u8; 16]>::try_from(&c[..16]).unwrap_or_default()),
                        c[16],
                    )
                })
                .collect();
            Some(IpArea {
                subnet: Ipv4Addr::new(a[0], a[1], a[2], a[3]),
                prefix_len: a[4],
                ipv6,
            })
        } else {
            None
        };
        let ip_end = match &ip {
            Some(a) => FIXED_PROPOSAL_LEN + n + a.wire_len(),
            None => FIXED_PROPOSAL_LEN + SMCD_AREA_LEN,
        };
        let v2_ext = if h.version >= 2 && v2_ext_offset != 0 {
            let at = 52 + v2_ext_offset;
            if at < ip_end {
                return Err(ClcError::BadOffset {
                    what: "v2 extension (overlaps the IP area)",
                });
            }
            Some(V2Extension::parse(b, at, end)?)
        } else {
            None
        };
        Ok(Self {
            eyecatcher: h.eyecatcher,
            version: h.version,
            typev2: if h.version >= 2 { typev2 } else { SmcType::R },
            typev1,
            peer_id: PeerId(b[8..16].try_into().unwrap_or_default()),
            gid: b[16..32].try_into().unwrap_or_default(),
            mac: b[32..38].try_into().unwrap_or_default(),
            smcd,
            ip,
            v2_ext,
        })
    }

    /// Emits the Proposal into `buf`; returns the length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, ClcEmitError> {
        if self.v2_ext.is_some() && (self.version < 2 || self.smcd.is_none()) {
            return Err(ClcEmitError::Unrepresentable(
                "v2 extension needs version 2 and the SMC-D area",
            ));
        }
        if let Some(ip) = &self.ip
            && ip.ipv6.len() > MAX_IPV6_PREFIXES
        {
            return Err(ClcEmitError::Unrepresentable("more than 8 IPv6 prefixes"));
        }
        if let Some(e) = &self.v2_ext
            && e.eids.len() > MAX_EIDS
        {
            return Err(ClcEmitError::Unrepresentable("more than 8 EIDs"));
        }
        let len = self.wire_len();
        let b = out(buf, len)?;
        let flags = if self.version >= 2 {
            (self.typev2.bits() << 2) | self.typev1.bits()
        } else {
            self.typev1.bits()
        };
        emit_header(b, self.eyecatcher, ClcType::Proposal, self.version, flags)?;
        b[8..16].copy_from_slice(&self.peer_id.0);
        b[16..32].copy_from_slice(&self.gid);
        b[32..38].copy_from_slice(&self.mac);
        let n = match (&self.ip, self.smcd) {
            (Some(_), Some(_)) => SMCD_AREA_LEN as u16,
            _ => 0,
        };
        b[38..40].copy_from_slice(&n.to_be_bytes());
        let mut at = FIXED_PROPOSAL_LEN;
        if let Some(a) = self.smcd {
            let s = &mut b[at..at + SMCD_AREA_LEN];
            s.fill(0);
            s[0..8].copy_from_slice(&a.ism_gid.to_be_bytes());
            s[8..10].copy_from_slice(&a.chid.to_be_bytes());
            if self.v2_ext.is_some() {
                let off = SMCD_AREA_LEN - 12 + self.ip.as_ref().map_or(0, IpArea::wire_len);
                s[10..12].copy_from_slice(&(off as u16).to_be_bytes());
            }
            s[12..15].copy_from_slice(&a.vendor_oui);
            s[15..20].copy_from_slice(&a.vendor_exp_options);
            at += SMCD_AREA_LEN;
        }
        if let Some(ip) = &self.ip {
            b[at..at + 4].copy_from_slice(&ip.subnet.octets());
            b[at + 4] = ip.prefix_len;
            b[at + 5..at + 7].fill(0);
            b[at + 7] = ip.ipv6.len() as u8;
            at += 8;
            for (p, l) in &ip.ipv6 {
                b[at..at + 16].copy_from_slice(&p.octets());
                b[at + 16] = *l;
                at += 17;
            }
        }
        if let Some(e) = &self.v2_ext {
            e.emit(b, at);
        }
        b[len - 4..].copy_from_slice(&self.eyecatcher.bytes());
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::v1_proposal;
    use super::super::v2ext::tests::arb_v2ext;
    use super::super::{ClcMessage, EYECATCHER_SMCR, PROPOSAL_LINUX_V1_LEN, PROPOSAL_RFC_V1_LEN, frame_len};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linux_v1_proposal_is_92_octets_smc_clc_1() {
        let w = ClcMessage::Proposal(v1_proposal()).to_vec().unwrap();
        assert_eq!(w.len(), PROPOSAL_LINUX_V1_LEN);
        assert_eq!(&w[..8], &[0xE2, 0xD4, 0xC3, 0xD9, 1, 0, 92, 0x10]);
        assert_eq!(&w[38..40], &[0, 40]);
        assert!(w[40..80].iter().all(|&b| b == 0));
        assert_eq!(&w[80..88], &[192, 168, 77, 0, 24, 0, 0, 0]);
        assert_eq!(&w[88..], &EYECATCHER_SMCR);
        assert_eq!(ClcMessage::parse(&w).unwrap(), ClcMessage::Proposal(v1_proposal()));
    }

    #[test]
    fn rfc_v1_proposal_is_52_octets_smc_clc_1() {
        let p = Proposal {
            smcd: None,
            ..v1_proposal()
        };
        let w = ClcMessage::Proposal(p.clone()).to_vec().unwrap();
        assert_eq!(w.len(), PROPOSAL_RFC_V1_LEN);
        assert_eq!(&w[38..40], &[0, 0]);
        assert_eq!(ClcMessage::parse(&w).unwrap(), ClcMessage::Proposal(p));
    }

    /// SMC-CLC-4 (E-20): the IP area is found by skipping N octets, whatever they hold.
    #[test]
    fn offset_area_is_skipped_smc_clc_4() {
        let mut w = ClcMessage::Proposal(v1_proposal()).to_vec().unwrap();
        w[40..80].fill(0xA5);
        let ClcMessage::Proposal(p) = ClcMessage::parse(&w).unwrap() else {
            panic!()
        };
        assert_eq!(p.ip.unwrap().subnet, Ipv4Addr::new(192, 168, 77, 0));
        // An odd N of 20 garbage octets (length 52 + 20 = 72).
        let mut w = vec![0u8; 72];
        w[..4].copy_from_slice(&EYECATCHER_SMCR);
        w[4] = 1;
        w[5..7].copy_from_slice(&72u16.to_be_bytes());
        w[7] = 0x10;
        w[38..40].copy_from_slice(&20u16.to_be_bytes());
        w[40..60].fill(0xEE);
        w[60..68].copy_from_slice(&[10, 1, 0, 0, 16, 0, 0, 0]);
        w[68..].copy_from_slice(&EYECATCHER_SMCR);
        let ClcMessage::Proposal(p) = ClcMessage::parse(&w).unwrap() else {
            panic!()
        };
        let ip = p.ip.unwrap();
        assert_eq!((ip.subnet, ip.prefix_len), (Ipv4Addr::new(10, 1, 0, 0), 16));
        // N pointing past the trailer.
        w[38..40].copy_from_slice(&30u16.to_be_bytes());
        assert_eq!(ClcMessage::parse(&w), Err(ClcError::BadOffset { what: "IP area" }));
    }

    #[test]
    fn ipv6_prefixes_round_trip_and_are_bounded_smc_clc_1() {
        let mut p = v1_proposal();
        let ip = p.ip.as_mut().unwrap();
        ip.subnet = Ipv4Addr::UNSPECIFIED;
        ip.prefix_len = 0;
        ip.ipv6 = (0..8)
            .map(|i| (Ipv6Addr::new(0xfd00, i, 0, 0, 0, 0, 0, 0), 64))
            .collect();
        let w = ClcMessage::Proposal(p.clone()).to_vec().unwrap();
        assert_eq!(w.len(), 92 + 8 * 17);
        assert_eq!(ClcMessage::parse(&w).unwrap(), ClcMessage::Proposal(p.clone()));
        let mut bad = w.clone();
        bad[87] = 9;
        assert_eq!(ClcMessage::parse(&bad), Err(ClcError::TooManyPrefixes(9)));
        p.ip.as_mut().unwrap().ipv6.push((Ipv6Addr::LOCALHOST, 128));
        assert!(ClcMessage::Proposal(p).to_vec().is_err());
    }

    /// SMC-FC-1 / E-4: subnet = address & mask, and matching needs the same prefix length.
    #[test]
    fn subnet_matching_e_4() {
        let a = IpArea::ipv4(Ipv4Addr::new(192, 168, 77, 3), 24);
        assert_eq!(a.subnet, Ipv4Addr::new(192, 168, 77, 0));
        assert!(a.same_subnet(Ipv4Addr::new(192, 168, 77, 2), 24));
        assert!(!a.same_subnet(Ipv4Addr::new(192, 168, 78, 2), 24));
        assert!(!a.same_subnet(Ipv4Addr::new(192, 168, 77, 2), 16));
        assert!(IpArea::ipv4(Ipv4Addr::new(10, 0, 0, 1), 0).same_subnet(Ipv4Addr::new(11, 0, 0, 1), 0));
    }

    fn arb_ip() -> impl Strategy<Value = IpArea> {
        (
            any::<u32>(),
            any::<u8>(),
            proptest::collection::vec((any::<u128>(), any::<u8>()), 0..=8),
        )
            .prop_map(|(s, l, v6)| IpArea {
                subnet: Ipv4Addr::from(s),
                prefix_len: l,
                ipv6: v6.into_iter().map(|(a, l)| (Ipv6Addr::from(a), l)).collect(),
            })
    }

    fn arb_proposal() -> impl Strategy<Value = Proposal> {
        (
            any::<bool>(),
            any::<([u8; 8], [u8; 16], [u8; 6])>(),
            proptest::option::of(arb_ip()),
            proptest::option::of(arb_v2ext()),
            any::<(u64, u16, [u8; 3], [u8; 5])>(),
        )
            .prop_map(|(rfc, (pid, gid, mac), ip, ext, (g, c, o, x))| {
                let smcd = SmcdArea {
                    ism_gid: g,
                    chid: c,
                    vendor_oui: o,
                    vendor_exp_options: x,
                };
                match ext {
                    Some(ext) => Proposal {
                        eyecatcher: Eyecatcher::Smcr,
                        version: 2,
                        typev2: SmcType::R,
                        typev1: if ip.is_some() { SmcType::R } else { SmcType::None },
                        peer_id: PeerId(pid),
                        gid,
                        mac,
                        smcd: Some(smcd),
                        ip,
                        v2_ext: Some(ext),
                    },
                    None => Proposal {
                        smcd: if rfc { None } else { Some(smcd) },
                        ip: Some(ip.unwrap_or(IpArea {
                            subnet: Ipv4Addr::UNSPECIFIED,
                            prefix_len: 0,
                            ipv6: vec![],
                        })),
                        ..Proposal::v1_linux(PeerId(pid), gid, mac, IpArea::ipv4(Ipv4Addr::UNSPECIFIED, 0))
                    },
                }
            })
    }

    proptest! {
        /// Emit → parse is the identity for every representable message.
        #[test]
        fn proposal_round_trip_smc_clc_1(p in arb_proposal()) {
            let m = ClcMessage::Proposal(p);
            let w = m.to_vec().unwrap();
            prop_assert_eq!(frame_len(&w).unwrap(), Some(w.len()));
            prop_assert_eq!(ClcMessage::parse(&w).unwrap(), m);
        }
    }
}
