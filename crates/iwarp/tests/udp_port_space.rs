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

/// Issue 16: raw IB service IDs (IPoIB connected mode's listen and connect) do not exist on
/// iWARP: both refused with `NotSupported` (EOPNOTSUPP).
#[test]
fn ib_service_ids_are_not_supported_on_iwarp() {
    let dev = iwarp::open_device(IwarpConfig::default()).unwrap();
    let e = dev.listen_ib_service(0x1000_0000_0000_0001).err().expect("refused");
    assert_eq!(e.errno(), 95, "EOPNOTSUPP: {e:?}");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4).unwrap();
    let qp = pd.create_qp(verbs::QpInit::new(verbs::QpType::Rc, &cq)).unwrap();
    let e = qp
        .connect_ib_service(
            verbs::Gid::default(),
            0x1000_0000_0000_0001,
            &verbs::ConnParam::default(),
            std::time::Duration::from_secs(1),
        )
        .unwrap_err();
    assert_eq!(e.errno(), 95, "EOPNOTSUPP: {e:?}");
}
