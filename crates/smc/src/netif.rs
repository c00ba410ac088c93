//! The Ethernet address of the interface that holds an IPv4 address (`getifaddrs(3)`, in
//! the calling thread's network namespace).
//!
//! SMC-Rv2 needs it: Linux takes the MAC of a v2-direct peer from the CLC Accept/Confirm
//! (`smc_link_save_peer_info`: the CLC's MAC unless the route uses a gateway) and addresses
//! its RoCEv2 frames to it, so the MAC we put there must be the one our packets arrive on.
//! One of the engine's two unsafe modules (the other is `stream::sys`, the socket calls);
//! each block says why it holds.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::net::Ipv4Addr;

/// The MAC of the interface that has `addr`, if that interface has a 6-octet link-layer
/// address (none for `lo`'s all-zero one).
pub(crate) fn mac_of_ipv4(addr: Ipv4Addr) -> Option<[u8; 6]> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head that is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut name: Option<Vec<u8>> = None;
    let mut macs: Vec<(Vec<u8>, [u8; 6])> = Vec::new();
    let mut p = list;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
            // SAFETY: ifa_name is the NUL-terminated interface name of this node.
            let n = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_bytes().to_vec();
            // SAFETY: ifa_addr points at a sockaddr; its family field is always there.
            let fam = libc::c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
            if fam == libc::AF_INET {
                // SAFETY: an AF_INET sockaddr of getifaddrs is a sockaddr_in.
                let a = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                if Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)) == addr {
                    name = Some(n);
                }
            } else if fam == libc::AF_PACKET {
                // SAFETY: an AF_PACKET sockaddr of getifaddrs is a sockaddr_ll.
                let ll = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_ll>() };
                if ll.sll_halen == 6 {
                    let mut m = [0u8; 6];
                    m.copy_from_slice(&ll.sll_addr[..6]);
                    macs.push((n, m));
                }
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once; nothing points into it now.
    unsafe { libc::freeifaddrs(list) };
    let name = name?;
    macs.into_iter()
        .find(|(n, m)| *n == name && *m != [0; 6])
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lo` has no MAC (all zero): none; an address nobody has: none.
    #[test]
    fn loopback_and_unknown_have_no_mac() {
        assert_eq!(mac_of_ipv4(Ipv4Addr::LOCALHOST), None);
        assert_eq!(mac_of_ipv4(Ipv4Addr::new(203, 0, 113, 254)), None);
    }
}
