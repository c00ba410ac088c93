//! `QueuePair::modify_qp` / `query_qp` on QPs of the iWARP connection manager:
//! the IBTA transition table is applied first, then the provider refuses what
//! its transport cannot do (MPA drives INIT/RTR/RTS, as the kernel's iw_cm does),
//! and a move to ERR flushes outstanding work.

mod pair;

use pair::{T, pair};
use verbs::*;

#[test]
fn cm_qp_is_rts_and_reports_its_depths() {
    let p = pair();
    let q = p.a.query_qp();
    assert_eq!(q.qp_state, Some(QpState::Rts));
    assert_eq!(q.max_rd_atomic, Some(16));
    assert_eq!(q.max_dest_rd_atomic, Some(16));
    assert_eq!(p.a.qp_type(), QpType::Rc);
}

#[test]
fn illegal_transition_is_refused_by_the_table() {
    let p = pair();
    // RTS -> RTR does not exist for any QP type.
    let err = p.a.modify_qp(&QpAttr::state(QpState::Rtr)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ModifyQp(ModifyQpError::IllegalTransition {
                from: QpState::Rts,
                to: QpState::Rtr,
                ..
            })
        ),
        "{err}"
    );
    // A legal RTS -> SQD is the connection manager's to make on iWARP.
    let err = p.a.modify_qp(&QpAttr::state(QpState::Sqd)).unwrap_err();
    assert!(matches!(err, Error::NotSupported(_)), "{err}");
    assert_eq!(p.a.state(), QpState::Rts);
}

#[test]
fn modify_to_err_flushes_posted_receives() {
    let p = pair();
    let mr = p.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    p.a.post_recv(&[RecvWr {
        wr_id: 77,
        sg_list: vec![mr.sge(0, 4096)],
    }])
    .unwrap();
    p.a.modify_qp(&QpAttr::state(QpState::Err)).unwrap();
    assert_eq!(p.a.state(), QpState::Err);
    let wc = p.cq_a.wait(Some(T)).expect("flush completion");
    assert_eq!((wc.wr_id, wc.status), (77, WcStatus::WrFlushErr));
}
