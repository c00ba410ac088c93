//! Property tests of the CM MAD codec (C1.1-C1.6): every message with arbitrary in-range
//! fields survives emit → parse unchanged; arbitrary 256 octets either fail to parse with a
//! typed error or parse into a message whose emission parses to the same message; nothing
//! panics. Plus the refusals a peer's MAD can earn.

use proptest::prelude::*;
use roce::cm::mad::*;
use verbs::Gid;

fn pdata(cap: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), cap..=cap)
}

fn gid() -> impl Strategy<Value = Gid> {
    any::<[u8; 16]>().prop_map(Gid)
}

fn path() -> impl Strategy<Value = Path> {
    (
        (any::<u16>(), any::<u16>(), gid(), gid()),
        (
            0u32..1 << 20,
            0u8..64,
            any::<u8>(),
            any::<u8>(),
            0u8..16,
            any::<bool>(),
            0u8..32,
        ),
    )
        .prop_map(|((ll, rl, lg, rg), (fl, pr, tc, hl, sl, sn, at))| Path {
            local_lid: ll,
            remote_lid: rl,
            local_gid: lg,
            remote_gid: rg,
            flow_label: fl,
            packet_rate: pr,
            traffic_class: tc,
            hop_limit: hl,
            sl,
            subnet_local: sn,
            local_ack_timeout: at,
        })
}

fn msg_type() -> impl Strategy<Value = MsgType> {
    prop_oneof![
        Just(MsgType::Req),
        Just(MsgType::Rep),
        Just(MsgType::Other),
        Just(MsgType::Reserved)
    ]
}

fn req() -> impl Strategy<Value = Req> {
    (
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            0u32..1 << 24,
            any::<u8>(),
            0u32..1 << 24,
            any::<u8>(),
            0u32..1 << 24,
        ),
        (
            0u8..32,
            0u8..4,
            any::<bool>(),
            0u32..1 << 24,
            0u8..32,
            0u8..8,
            any::<u16>(),
            0u8..16,
            any::<bool>(),
            0u8..8,
        ),
        (0u8..16, any::<bool>(), 0u8..8, path(), path(), any::<bool>()),
        pdata(REQ_PDATA),
    )
        .prop_map(
            |(
                (lc, sid, guid, qk, qpn, rr, le, id, re),
                (rt, ts, fc, psn, lt, rc, pk, mtu, rdc, rnr),
                (mcr, srq, ext, pp, ap, sap),
                pd,
            )| Req {
                local_comm_id: lc,
                service_id: sid,
                local_ca_guid: guid,
                local_qkey: qk,
                local_qpn: qpn,
                responder_resources: rr,
                local_eecn: le,
                initiator_depth: id,
                remote_eecn: re,
                remote_cm_response_timeout: rt,
                transport_service_type: ts,
                end_to_end_flow_control: fc,
                starting_psn: psn,
                local_cm_response_timeout: lt,
                retry_count: rc,
                pkey: pk,
                path_mtu: mtu,
                rdc_exists: rdc,
                rnr_retry_count: rnr,
                max_cm_retries: mcr,
                srq,
                extended_transport_type: ext,
                primary_path: pp,
                alternate_path: ap,
                sap_supported: sap,
                private_data: pd,
            },
        )
}

fn rep() -> impl Strategy<Value = Rep> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            0u32..1 << 24,
            0u32..1 << 24,
            0u32..1 << 24,
        ),
        (
            any::<u8>(),
            any::<u8>(),
            0u8..32,
            0u8..4,
            any::<bool>(),
            0u8..8,
            any::<bool>(),
            any::<u64>(),
        ),
        pdata(REP_PDATA),
    )
        .prop_map(
            |((lc, rc, qk, qpn, ee, psn), (rr, id, tad, fo, fc, rnr, srq, guid), pd)| Rep {
                local_comm_id: lc,
                remote_comm_id: rc,
                local_qkey: qk,
                local_qpn: qpn,
                local_eecn: ee,
                starting_psn: psn,
                responder_resources: rr,
                initiator_depth: id,
                target_ack_delay: tad,
                failover_accepted: fo,
                end_to_end_flow_control: fc,
                rnr_retry_count: rnr,
                srq,
                local_ca_guid: guid,
                private_data: pd,
            },
        )
}

fn reason() -> impl Strategy<Value = RejReason> {
    any::<u16>().prop_map(RejReason::from)
}

fn msg() -> impl Strategy<Value = CmMsg> {
    prop_oneof![
        req().prop_map(CmMsg::Req),
        rep().prop_map(CmMsg::Rep),
        (any::<u32>(), any::<u32>(), msg_type(), 0u8..32, pdata(MRA_PDATA)).prop_map(|(l, r, m, t, pd)| CmMsg::Mra(
            Mra {
                local_comm_id: l,
                remote_comm_id: r,
                message_mraed: m,
                service_timeout: t,
                private_data: pd,
            }
        )),
        (
            any::<u32>(),
            any::<u32>(),
            msg_type(),
            reason(),
            prop::collection::vec(any::<u8>(), 0..=REJ_ARI),
            pdata(REJ_PDATA)
        )
            .prop_map(|(l, r, m, why, ari, pd)| CmMsg::Rej(Rej {
                local_comm_id: l,
                remote_comm_id: r,
                message_rejected: m,
                reason: why,
                ari,
                private_data: pd,
            })),
        (any::<u32>(), any::<u32>(), pdata(RTU_PDATA)).prop_map(|(l, r, pd)| CmMsg::Rtu(Rtu {
            local_comm_id: l,
            remote_comm_id: r,
            private_data: pd,
        })),
        (any::<u32>(), any::<u32>(), 0u32..1 << 24, pdata(DREQ_PDATA)).prop_map(|(l, r, q, pd)| CmMsg::Dreq(Dreq {
            local_comm_id: l,
            remote_comm_id: r,
            remote_qpn: q,
            private_data: pd,
        })),
        (any::<u32>(), any::<u32>(), pdata(DREP_PDATA)).prop_map(|(l, r, pd)| CmMsg::Drep(Drep {
            local_comm_id: l,
            remote_comm_id: r,
            private_data: pd,
        })),
        (any::<u32>(), any::<u16>(), any::<u64>(), pdata(SIDR_REQ_PDATA)).prop_map(|(id, pk, sid, pd)| CmMsg::SidrReq(
            SidrReq {
                request_id: id,
                pkey: pk,
                service_id: sid,
                private_data: pd,
            }
        )),
        (
            (any::<u32>(), any::<u8>(), 0u32..1 << 24, any::<u64>(), any::<u32>()),
            prop::collection::vec(any::<u8>(), 0..=SIDR_REP_INFO),
            pdata(SIDR_REP_PDATA)
        )
            .prop_map(|((id, st, qpn, sid, qk), info, pd)| CmMsg::SidrRep(SidrRep {
                request_id: id,
                status: st,
                qpn,
                service_id: sid,
                qkey: qk,
                additional_info: info,
                private_data: pd,
            })),
    ]
}

fn header() -> impl Strategy<Value = MadHeader> {
    (any::<u16>(), any::<u16>(), any::<u64>(), any::<u32>()).prop_map(|(s, c, t, a)| MadHeader {
        status: s,
        class_specific: c,
        tid: t,
        attr_mod: a,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// C1.1-C1.6: emit → parse is the identity on every message with in-range fields.
    #[test]
    fn emit_parse_round_trip(hdr in header(), msg in msg()) {
        let mad = Mad { hdr, msg };
        let bytes = mad.emit().unwrap();
        prop_assert_eq!(bytes.len(), MAD_LEN);
        prop_assert_eq!(&bytes[..4], &[1, 7, 2, 3]);
        prop_assert_eq!(Mad::parse(&bytes).unwrap(), mad);
    }

    /// Peer input: any 256 octets with a CM header parse or fail with a typed error; what
    /// parses re-emits to something that parses to the same message (reserved bits aside).
    #[test]
    fn arbitrary_octets(attr in 0x0010u16..0x001b, mut body in prop::collection::vec(any::<u8>(), MAD_LEN..=MAD_LEN)) {
        body[..4].copy_from_slice(&[1, 7, 2, 3]);
        body[16..18].copy_from_slice(&attr.to_be_bytes());
        match Mad::parse(&body) {
            Ok(m) => {
                let again = Mad::parse(&m.emit().unwrap()).unwrap();
                prop_assert_eq!(again, m);
            }
            Err(e) => prop_assert!(matches!(e, MadError::Attribute(0x19 | 0x1a) | MadError::TooLong { .. }), "{e}"),
        }
    }

    /// Unknown REJ reasons survive (C1.6).
    #[test]
    fn rej_reason_codes_survive(code in any::<u16>()) {
        prop_assert_eq!(u16::from(RejReason::from(code)), code);
    }
}

/// The reasons the brief and the lab name, with their codes (C1.6; IBA vol. 1 table 109, inferred:
/// Linux's `ibta_vol1_c12.h` numbers REJ table 108 and REP table 110; Linux `enum ib_cm_rej_reason`).
#[test]
fn rej_reason_codes() {
    assert_eq!(u16::from(RejReason::NoQp), 1);
    assert_eq!(u16::from(RejReason::Timeout), 4);
    assert_eq!(u16::from(RejReason::InvalidServiceId), 8);
    assert_eq!(u16::from(RejReason::StaleConn), 10);
    assert_eq!(u16::from(RejReason::InvalidGid), 12);
    assert_eq!(u16::from(RejReason::InvalidMtu), 26);
    assert_eq!(u16::from(RejReason::ConsumerDefined), 28);
    assert_eq!(RejReason::from(34), RejReason::Unknown(34));
    assert_eq!(RejReason::from(28), RejReason::ConsumerDefined);
}

/// Refusals of a peer's MAD (C1.1): length, versions, class, method, attribute, ARI length.
#[test]
fn refusals() {
    let good = Mad {
        hdr: MadHeader::with_tid(1),
        msg: CmMsg::Rtu(Rtu {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: vec![],
        }),
    }
    .emit()
    .unwrap();
    assert_eq!(Mad::parse(&good[..255]), Err(MadError::Length(255)));
    let mut long = good.to_vec();
    long.push(0);
    assert_eq!(Mad::parse(&long), Err(MadError::Length(257)));
    let bad = |i: usize, v: u8| {
        let mut b = good;
        b[i] = v;
        Mad::parse(&b)
    };
    assert_eq!(bad(0, 2), Err(MadError::BaseVersion(2)));
    assert_eq!(bad(1, 0x81), Err(MadError::NotCm(0x81)));
    assert_eq!(bad(2, 1), Err(MadError::ClassVersion(1)));
    assert_eq!(bad(3, 0x01), Err(MadError::Method(1)));
    assert_eq!(bad(17, 0x19), Err(MadError::Attribute(0x19)));
    // REJ with a reject info length of 73 (> 72).
    let mut rej = Mad {
        hdr: MadHeader::with_tid(1),
        msg: CmMsg::Rej(Rej {
            local_comm_id: 0,
            remote_comm_id: 2,
            message_rejected: MsgType::Req,
            reason: RejReason::ConsumerDefined,
            ari: vec![],
            private_data: vec![],
        }),
    }
    .emit()
    .unwrap();
    rej[24 + 9] = 73 << 1;
    assert!(matches!(Mad::parse(&rej), Err(MadError::TooLong { .. })));
}

/// Emit refuses what does not fit, naming the field (C1.3).
#[test]
fn emit_refusals() {
    let rtu = |n| Mad {
        hdr: MadHeader::with_tid(1),
        msg: CmMsg::Rtu(Rtu {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: vec![0; n],
        }),
    };
    assert!(rtu(224).emit().is_ok());
    assert_eq!(
        rtu(225).emit(),
        Err(MadError::TooLong {
            what: "RTU private data",
            len: 225,
            max: 224
        })
    );
    let dreq = Mad {
        hdr: MadHeader::with_tid(1),
        msg: CmMsg::Dreq(Dreq {
            local_comm_id: 1,
            remote_comm_id: 2,
            remote_qpn: 1 << 24,
            private_data: vec![],
        }),
    };
    assert!(matches!(dreq.emit(), Err(MadError::Range { .. })));
}
