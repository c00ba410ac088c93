//! The UD core in memory: two cores, packets handed over by hand. Requirement IDs:
//! `../shared/requirements/smcr-ipoibcm.md` C2 (40-octet GRH before every UD payload) and
//! D3 (DETH on the wire); IBA vol. 1 §9.8 (UD), §10.2.5 (Q_Key high bit; unconfirmed).

use verbs::{
    Access, AhAttr, Gid, MemoryRegion, QpAttr, QpState, RecvWr, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WrError, WrOpcode,
};

use super::grh::{GRH_LEN, from_ipv4, synth_ipv4};
use super::*;
use crate::rc::harness;

struct Side {
    qp: UdQp,
    pd: verbs::ProtectionDomain,
    mr: MemoryRegion,
}

const QKEY: u32 = 0x1111_1111;

fn side(qpn: u32) -> Side {
    let dev = harness::device();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.reg_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
    let mem = verbs::provider::DeviceProviderExt::mem_table(&dev);
    let mut qp = UdQp::new(UdConfig::new(qpn, pd.id(), mem));
    qp.modify(&QpAttr::init_ud(1, 0, QKEY)).unwrap();
    qp.modify(&QpAttr::state(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr {
        sq_psn: Some(0xff_fffe),
        ..QpAttr::state(QpState::Rts)
    })
    .unwrap();
    Side { qp, pd, mr }
}

fn dest(s: &Side, qpn: u32, qkey: u32) -> UdDest {
    let ah =
        s.pd.create_ah(&AhAttr::to_gid(Gid::from_ip("192.168.77.2".parse().unwrap())))
            .unwrap();
    UdDest {
        ah,
        remote_qpn: qpn,
        remote_qkey: qkey,
    }
}

fn send(s: &mut Side, wr_id: u64, payload: &[u8], d: UdDest, opcode: WrOpcode) -> Result<(), UdError> {
    s.mr.write(0, payload).unwrap();
    let wr = SendWr::new(
        wr_id,
        opcode,
        vec![Sge {
            addr: s.mr.addr(),
            length: payload.len() as u32,
            lkey: s.mr.lkey(),
        }],
    )
    .ud(d);
    s.qp.post_send(&wr)
}

fn recv(s: &mut Side, wr_id: u64, at: u64, len: u32) {
    s.qp.post_recv(&RecvWr {
        wr_id,
        sg_list: vec![Sge {
            addr: s.mr.addr() + at,
            length: len,
            lkey: s.mr.lkey(),
        }],
    })
    .unwrap();
}

fn grh() -> [u8; GRH_LEN] {
    from_ipv4(&synth_ipv4([192, 168, 77, 1], [192, 168, 77, 2], 100, 64, 0))
}

/// Moves one datagram from `a` to `b`.
fn carry(a: &mut Side, b: &mut Side) -> RxOutcome {
    let mut buf = vec![0u8; a.qp.max_packet_len()];
    let tx = a.qp.poll_transmit(&mut buf).expect("a datagram");
    let p = Packet::parse(&buf[..tx.len]).unwrap();
    b.qp.handle_packet(&p, &grh())
}

/// Golden vector of a UD SEND_ONLY_WITH_IMMEDIATE (IBA vol. 1 §9.2, DETH §9.3.2 (unconfirmed); opcode 0x65): BTH,
/// DETH (Q_Key, source QPN), ImmDt, payload, pad, ICRC field 0.
#[test]
fn ud_send_packet_golden() {
    let mut a = side(0x12);
    let d = dest(&a, 0x34, 0x8000_0000); // high bit: the QP's own Q_Key (IBA vol. 1 §10.2.5 (unconfirmed))
    send(&mut a, 7, b"hello", d, WrOpcode::SendWithImm { imm_data: 0xdead_beef }).unwrap();
    let mut buf = vec![0u8; a.qp.max_packet_len()];
    let tx = a.qp.poll_transmit(&mut buf).unwrap();
    assert_eq!(tx.ah.dgid, Gid::from_ip("192.168.77.2".parse().unwrap()));
    #[rustfmt::skip]
    let want: &[u8] = &[
        // BTH: opcode 0x65, SE 0 M 0 pad 3 tver 0, P_Key ffff, resv, DestQP 000034, A 0, PSN fffffe
        0x65, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x34, 0x00, 0xff, 0xff, 0xfe,
        // DETH: Q_Key 11111111, resv, SrcQP 000012
        0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x12,
        // ImmDt
        0xde, 0xad, 0xbe, 0xef,
        // payload "hello", 3 pad octets, ICRC (sealed by the engine)
        b'h', b'e', b'l', b'l', b'o', 0, 0, 0, 0, 0, 0, 0,
    ];
    assert_eq!(&buf[..tx.len], want);
    let wc = a.qp.poll_completion().unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Send, 5)
    );
    // The PSN wraps at 2^24.
    assert_eq!(a.qp.sq_psn(), Psn::new(0xff_ffff));
}

#[test]
fn delivery_places_grh_then_payload() {
    let mut a = side(0x12);
    let mut b = side(0x34);
    recv(&mut b, 9, 1000, 2048);
    let d = dest(&a, 0x34, QKEY);
    send(&mut a, 1, &[0x5a; 300], d, WrOpcode::Send).unwrap();
    assert_eq!(carry(&mut a, &mut b), RxOutcome::Delivered);
    let wc = b.qp.poll_completion().unwrap();
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.opcode, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 340);
    assert_eq!(wc.src_qp, 0x12);
    assert_eq!(wc.wc_flags, WcFlags::GRH);
    assert_eq!(wc.imm_data, None);
    let mut got = vec![0u8; 340];
    b.mr.read(1000, &mut got).unwrap();
    assert_eq!(&got[..40], &grh());
    assert!(got[40..].iter().all(|&x| x == 0x5a));
    let ah = AhAttr::from_wc(&wc, &got[..40], 0, 1).unwrap();
    assert_eq!(ah.dgid, Gid::from_ip("192.168.77.1".parse().unwrap()));
}

#[test]
fn qkey_mismatch_dropped_and_counted() {
    let mut a = side(0x12);
    let mut b = side(0x34);
    recv(&mut b, 9, 0, 2048);
    let d = dest(&a, 0x34, 0x2222_2222);
    send(&mut a, 1, b"x", d, WrOpcode::Send).unwrap();
    assert_eq!(carry(&mut a, &mut b), RxOutcome::Dropped);
    assert_eq!(b.qp.stats().qkey_dropped, 1);
    assert!(b.qp.poll_completion().is_none());
    assert_eq!(b.qp.recv_queued(), 1, "the receive WQE is not consumed");
}

#[test]
fn rq_empty_dropped_and_counted() {
    let mut a = side(0x12);
    let mut b = side(0x34);
    let d = dest(&a, 0x34, QKEY);
    send(&mut a, 1, b"x", d, WrOpcode::Send).unwrap();
    assert_eq!(carry(&mut a, &mut b), RxOutcome::Dropped);
    assert_eq!(b.qp.stats().rq_empty_dropped, 1);
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn oversize_refused_at_post() {
    let mut a = side(0x12);
    let d = dest(&a, 0x34, QKEY);
    let e = send(&mut a, 1, &[0; 1025], d.clone(), WrOpcode::Send).unwrap_err();
    assert_eq!(e, UdError::Wr(WrError::TooLong { len: 1025, max: 1024 }));
    // Exactly the MTU is fine; RDMA Write is not a UD operation.
    send(&mut a, 2, &[0; 1024], d.clone(), WrOpcode::Send).unwrap();
    let w = WrOpcode::RdmaWrite {
        remote: verbs::RemoteAddr { addr: 0, rkey: 0 },
    };
    assert!(matches!(
        send(&mut a, 3, b"x", d, w),
        Err(UdError::Wr(WrError::Opcode(_)))
    ));
    assert!(!a.qp.sends.is_empty());
}

#[test]
fn short_receive_buffer_is_loc_len_err_and_qp_stays_up() {
    let mut a = side(0x12);
    let mut b = side(0x34);
    recv(&mut b, 9, 0, 100); // 40 + 61 does not fit
    let d = dest(&a, 0x34, QKEY);
    send(&mut a, 1, &[1; 61], d, WrOpcode::Send).unwrap();
    assert_eq!(carry(&mut a, &mut b), RxOutcome::Delivered);
    assert_eq!(b.qp.poll_completion().unwrap().status, WcStatus::LocLenErr);
    assert_eq!(b.qp.stats().len_errors, 1);
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn wrong_pkey_and_state_and_opcode_dropped() {
    let mut a = side(0x12);
    let mut b = side(0x34);
    recv(&mut b, 9, 0, 2048);
    let d = dest(&a, 0x34, QKEY);
    send(&mut a, 1, b"x", d, WrOpcode::Send).unwrap();
    let mut buf = vec![0u8; a.qp.max_packet_len()];
    let tx = a.qp.poll_transmit(&mut buf).unwrap();
    let mut p = Packet::parse(&buf[..tx.len]).unwrap();
    p.bth.p_key = 0x8001;
    assert_eq!(b.qp.handle_packet(&p, &grh()), RxOutcome::Dropped);
    assert_eq!(b.qp.stats().pkey_dropped, 1);
    p.bth.p_key = 0x7fff; // limited membership of the default partition is accepted
    p.bth.opcode = Opcode::RC_SEND_ONLY;
    assert_eq!(b.qp.handle_packet(&p, &grh()), RxOutcome::Dropped);
    assert_eq!(b.qp.stats().opcode_dropped, 1);
    p.bth.opcode = Opcode::UD_SEND_ONLY;
    b.qp.modify(&QpAttr::state(QpState::Sqd)).unwrap();
    assert_eq!(b.qp.handle_packet(&p, &grh()), RxOutcome::Delivered);
    b.qp.modify(&QpAttr::state(QpState::Err)).unwrap();
    assert_eq!(b.qp.handle_packet(&p, &grh()), RxOutcome::Dropped);
    assert_eq!(b.qp.stats().state_dropped, 1);
}

#[test]
fn error_flushes_and_reset_empties() {
    let mut a = side(0x12);
    recv(&mut a, 5, 0, 100);
    let d = dest(&a, 0x34, QKEY);
    send(&mut a, 6, b"x", d, WrOpcode::Send).unwrap();
    a.qp.set_error();
    let w: Vec<_> = std::iter::from_fn(|| a.qp.poll_completion()).collect();
    assert_eq!(w.len(), 2);
    assert!(w.iter().all(|c| c.status == WcStatus::WrFlushErr));
    a.qp.modify(&QpAttr::state(QpState::Reset)).unwrap();
    assert!(matches!(
        a.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: vec![]
        }),
        Err(UdError::State(QpState::Reset, _))
    ));
}
