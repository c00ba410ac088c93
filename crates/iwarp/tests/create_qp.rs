//! The rdma_cm flow on the provider interface: `create_qp` gives an RC QP in
//! RESET, `modify_qp` moves it to INIT (receives may be posted from INIT, IBTA
//! 10.8.2), and the connection manager binds it to an MPA connection, which
//! moves it to RTS (`rdma_create_qp` + `rdma_connect` / `rdma_accept`). What
//! iWARP cannot do is refused with a typed `NotSupported`: UD, UC and GSI QPs,
//! address handles, multicast, shared receive queues, and a manual RTR/RTS.

mod pair;

use pair::T;
use std::net::Ipv4Addr;
use verbs::*;

fn device() -> Device {
    iwarp::open_device(iwarp::IwarpConfig::default()).unwrap()
}

#[test]
fn create_qp_reset_init_then_cm_to_rts() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(64).unwrap();
    let cq_b = dev.create_cq(64).unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();

    // Passive side: its own QP, made before the request arrives.
    let qp_b = pd.create_qp(QpInit::new(QpType::Rc, &cq_b)).unwrap();
    assert_eq!(qp_b.state(), QpState::Reset);
    let mr_b = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    // No receives in RESET.
    let err = qp_b
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: vec![mr_b.sge(0, 64)],
        }])
        .unwrap_err();
    assert!(matches!(err, Error::InvalidState(QpState::Reset)), "{err}");
    qp_b.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE)).unwrap();
    assert_eq!(qp_b.state(), QpState::Init);
    // From INIT they are taken, and the peer's first Send lands in one.
    qp_b.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: vec![mr_b.sge(0, 64)],
    }])
    .unwrap();
    // A send is not: INIT has no send queue processing.
    let err = qp_b.post_send_one(SendWr::new(3, WrOpcode::Send, vec![])).unwrap_err();
    assert!(matches!(err, Error::InvalidState(QpState::Init)), "{err}");
    // The CM drives RTR/RTS on iWARP; a manual move is refused, the QP stays in INIT.
    let err = qp_b.modify_qp(&QpAttr::state(QpState::Rtr)).unwrap_err();
    assert!(matches!(err, Error::ModifyQp(_) | Error::NotSupported(_)), "{err}");
    assert_eq!(qp_b.state(), QpState::Init);

    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(T)).unwrap();
        req.accept_qp(&qp_b, &ConnParam::default()).unwrap();
        qp_b
    });

    // Active side: RESET, then connect (which moves it to INIT as rdma_create_qp does).
    let qp_a = pd.create_qp(QpInit::new(QpType::Rc, &cq_a)).unwrap();
    assert_eq!(qp_a.state(), QpState::Reset);
    assert!(!qp_a.is_connected());
    qp_a.connect(addr, &ConnParam::default(), T).unwrap();
    let qp_b = server.join().unwrap();
    assert_eq!(qp_a.state(), QpState::Rts);
    assert_eq!(qp_b.state(), QpState::Rts);
    assert!(qp_a.is_connected() && qp_b.is_connected());
    assert_eq!(qp_a.query_qp().qp_state, Some(QpState::Rts));
    assert_eq!(qp_a.get_event(Some(T)), Some(CmEvent::Established));
    // A second connect of a connected QP is refused.
    assert!(qp_a.connect(addr, &ConnParam::default(), T).is_err());

    let mr_a = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    mr_a.write(0, b"posted in INIT").unwrap();
    qp_a.post_send_one(SendWr::new(9, WrOpcode::Send, vec![mr_a.sge(0, 14)]))
        .unwrap();
    assert!(cq_a.wait(Some(T)).unwrap().is_ok());
    let wc = cq_b.wait(Some(T)).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (2, WcStatus::Success, 14), "{wc:?}");
    assert_eq!(mr_b.to_vec(0, 14).unwrap(), b"posted in INIT");
}

#[test]
fn unconnected_qp_goes_to_err_and_flushes_and_back_to_reset() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
    qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE)).unwrap();
    qp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: vec![mr.sge(0, 64)],
    }])
    .unwrap();
    qp.modify_qp(&QpAttr::state(QpState::Err)).unwrap();
    assert_eq!(qp.state(), QpState::Err);
    let wc = cq.wait(Some(T)).unwrap();
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushErr));
    // Posting in ERR flushes at once.
    qp.post_send_one(SendWr::new(6, WrOpcode::Send, vec![])).unwrap();
    assert_eq!(cq.wait(Some(T)).unwrap().status, WcStatus::WrFlushErr);
    // ERR -> RESET -> INIT is legal and works before a connection.
    qp.modify_qp(&QpAttr::state(QpState::Reset)).unwrap();
    assert_eq!(qp.state(), QpState::Reset);
    qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE)).unwrap();
    assert_eq!(qp.state(), QpState::Init);
    // An illegal pair is refused by the table before the provider sees it.
    let err = qp.modify_qp(&QpAttr::state(QpState::Rts)).unwrap_err();
    assert!(matches!(err, Error::ModifyQp(_)), "{err}");
}

#[test]
fn iwarp_refuses_what_it_cannot_do_with_not_supported() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    for t in [QpType::Ud, QpType::Uc, QpType::Gsi] {
        let err = pd.create_qp(QpInit::new(t, &cq)).unwrap_err();
        assert!(matches!(err, Error::NotSupported(_)), "{t:?}: {err}");
    }
    let ah = AhAttr::to_gid(Gid::from_ipv4(Ipv4Addr::new(192, 0, 2, 1)));
    let err = pd.create_ah(&ah).unwrap_err();
    assert!(matches!(err, Error::NotSupported(_)), "{err}");
    let err = pd.create_srq(&SrqInitAttr::default()).unwrap_err();
    assert!(matches!(err, Error::NotSupported(_)), "{err}");
    // Multicast needs a UD QP: an RC QP is an invalid argument, whatever the provider.
    let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
    let group = Gid([0xff, 0x12, 0x40, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    let err = qp.attach_mcast(&group, 0).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(InvalidArg::McastQpType(QpType::Rc))),
        "{err}"
    );
}
