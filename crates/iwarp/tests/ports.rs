//! `query_port` / `query_gid` / `query_pkey` on the iWARP device: one
//! Ethernet port that is up, one GID (unused by iWARP, which addresses by IP
//! and TCP port, as siw reports it), the default P_Key; out-of-range ports and
//! indexes are refused.

use verbs::*;

#[test]
fn iwarp_device_has_one_ethernet_port() {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    assert_eq!(dev.phys_port_cnt(), 1);
    let p = dev.query_port(1).unwrap();
    assert_eq!((p.state, p.link_layer), (PortState::Active, LinkLayer::Ethernet));
    assert!(p.active_mtu <= p.max_mtu);
    assert_eq!(dev.query_pkey(1, 0).unwrap(), DEFAULT_PKEY);
    assert_eq!(dev.query_gid(1, 0).unwrap(), Gid::default());
    for bad in [0u8, 2] {
        assert!(
            matches!(
                dev.query_port(bad),
                Err(Error::InvalidArgument(InvalidArg::Port { port, max: 1 })) if port == bad
            ),
            "port {bad}"
        );
    }
    assert!(dev.query_gid(1, p.gid_tbl_len).is_err());
    assert!(dev.query_pkey(1, p.pkey_tbl_len).is_err());
}
