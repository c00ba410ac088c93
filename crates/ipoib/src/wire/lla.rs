//! The 20-octet IPoIB link-layer address (RFC 4391 §9.1.1, Figure 5) with the
//! connected-mode capability flags of RFC 4755 §3.1.
//!
//! ```text
//! off size
//!   0    1  Flags: 0x80 RC supported, 0x40 UC supported, 0x3F reserved (RFC 4391: reserved)
//!   1    3  QPN: the interface's UD QPN (0xFFFFFF for a multicast address)
//!   4   16  GID: the port GID (an MGID for a multicast address)
//! ```
//!
//! Flags "bit 0"/"bit 1" are read MSB first (requirements E-18, Linux `IPOIB_FLAGS_RC`).

use core::cmp::Ordering;
use core::fmt;

use super::{MULTICAST_QPN, QPN_MASK, WireError, be24, need, room};

/// An IPoIB link-layer ("hardware") address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkAddr {
    /// The flags octet, as received (reserved bits kept; use [`LinkAddr::rc`] to read).
    pub flags: u8,
    /// The UD QPN (24 bits).
    pub qpn: u32,
    /// The port GID (or MGID).
    pub gid: [u8; 16],
}

impl LinkAddr {
    /// Octets on the wire.
    pub const LEN: usize = 20;
    /// RC supported (RFC 4755 §3.1 "bit 0").
    pub const FLAG_RC: u8 = 0x80;
    /// UC supported (RFC 4755 §3.1 "bit 1").
    pub const FLAG_UC: u8 = 0x40;
    /// Reserved flag bits: 0 on send, ignored on receive (IPCM-4).
    pub const FLAG_RESERVED: u8 = 0x3f;

    /// An address with the given capability, UD QPN (masked to 24 bits) and GID.
    pub fn new(rc: bool, qpn: u32, gid: [u8; 16]) -> LinkAddr {
        LinkAddr {
            flags: if rc { Self::FLAG_RC } else { 0 },
            qpn: qpn & QPN_MASK,
            gid,
        }
    }

    /// The multicast link-layer address for an MGID: flags 0, QPN 0xFFFFFF.
    pub fn multicast(mgid: [u8; 16]) -> LinkAddr {
        LinkAddr {
            flags: 0,
            qpn: MULTICAST_QPN,
            gid: mgid,
        }
    }

    /// Parses the first 20 octets of `b`.
    pub fn parse(b: &[u8]) -> Result<LinkAddr, WireError> {
        need("IPoIB link-layer address", b, Self::LEN)?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[4..20]);
        Ok(LinkAddr {
            flags: b[0],
            qpn: be24(b, 1),
            gid,
        })
    }

    /// Writes the 20 octets into the front of `out`. Reserved flag bits are sent as 0
    /// (IPCM-4, IPCM-17).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        room("IPoIB link-layer address", out, Self::LEN)?;
        out[0] = self.flags & !Self::FLAG_RESERVED;
        out[1..4].copy_from_slice(&(self.qpn & QPN_MASK).to_be_bytes()[1..]);
        out[4..20].copy_from_slice(&self.gid);
        Ok(Self::LEN)
    }

    /// The 20 octets as emitted.
    pub fn to_bytes(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        // 20 octets always fit.
        let _ = self.emit(&mut b);
        b
    }

    /// The peer advertises RC (RFC 4755 §3.1). Reserved bits are ignored.
    pub fn rc(&self) -> bool {
        self.flags & Self::FLAG_RC != 0
    }

    /// The peer advertises UC.
    pub fn uc(&self) -> bool {
        self.flags & Self::FLAG_UC != 0
    }

    /// The same address with the flags octet zeroed: the identity of the interface, as the
    /// crossing rule (RFC 4755 §3.3) and the neighbour table compare it.
    pub fn without_flags(&self) -> LinkAddr {
        LinkAddr { flags: 0, ..*self }
    }

    /// RFC 4755 §3.3 order: the 20 octets with the flags zeroed, byte 0 first.
    pub fn cmp_crossing(&self, other: &LinkAddr) -> Ordering {
        self.without_flags().to_bytes().cmp(&other.without_flags().to_bytes())
    }

    /// The GID is a multicast GID (first octet 0xFF, IBTA vol. 1 §4.1.1).
    pub fn is_multicast(&self) -> bool {
        self.gid[0] == 0xff
    }
}

/// Linux's `ip link` form: 20 colon-separated hex octets.
impl fmt::Display for LinkAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.to_bytes().iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}
