//! iWARP has no datagrams: rdma_cm's UDP port space (`RDMA_PS_UDP`, issue 14) and
//! multicast join are refused with a typed `NotSupported` (EOPNOTSUPP), as librdmacm on an
//! iWARP device refuses them; the TCP port space through the same call still listens.

use std::net::SocketAddr;

use iwarp::IwarpConfig;
use verbs::{Error, PortSpace};

#[test]
fn udp_port_space_is_not_supported_on_iwarp() {
    let dev = iwarp::open_device(IwarpConfig::default()).unwrap();
    let addr: SocketAddr = "127.91.0.1:0".parse().unwrap();
    let e = dev.listen_in(addr, PortSpace::Udp).err().expect("UDP listen refused");
    assert!(matches!(e, Error::NotSupported(_)), "{e:?}");
    assert_eq!(e.errno(), 95, "EOPNOTSUPP");
    let l = dev.listen_in(addr, PortSpace::Tcp).unwrap();
    assert_eq!(l.local_addr().ip(), addr.ip());
}
