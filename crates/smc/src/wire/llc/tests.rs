//! Unit tests of the LLC codec: opcode classes, typed errors, the errata layouts, and
//! round trips of every message in v1 and v2 (proptest).

use super::*;
use proptest::prelude::*;

#[test]
fn classes_a1_8() {
    assert_eq!(classify(0x01), Class::Llc);
    assert_eq!(classify(0x21), Class::Llc);
    assert_eq!(classify(0xFE), Class::Cdc);
    assert_eq!(classify(0x05), Class::UnknownMandatory, "0x05 is unused in v1");
    assert_eq!(classify(0x25), Class::Llc, "v2 REQUEST ADD LINK");
    assert_eq!(classify(0x23), Class::UnknownMandatory, "no v2 ADD LINK CONT");
    assert_eq!(classify(0x45), Class::UnknownMandatory);
    assert_eq!(classify(0x85), Class::UnknownOptional);
    assert_eq!(classify(0xC1), Class::UnknownMandatory);
    let mut b = [0u8; 44];
    b[0] = 0x85;
    assert_eq!(LlcMessage::parse(&b), Err(LlcError::UnknownOptional(0x85)));
    b[0] = 0x05;
    assert_eq!(LlcMessage::parse(&b), Err(LlcError::UnknownMandatory(0x05)));
    b[0] = 0xFE;
    assert_eq!(LlcMessage::parse(&b), Err(LlcError::Cdc));
}

/// SMC-INV-11: wrong length, short buffers, bad counts are typed errors.
#[test]
fn malformed_is_typed_smc_inv_11() {
    let m = LlcMessage::request(LlcBody::TestLink(TestLink { user_data: [7; 16] }));
    let w = m.to_vec().unwrap();
    assert_eq!(w.len(), 44);
    assert_eq!(LlcMessage::parse(&w).unwrap(), m);
    let mut b = w.clone();
    b[1] = 43;
    assert_eq!(LlcMessage::parse(&b), Err(LlcError::BadLength(43)));
    assert!(matches!(LlcMessage::parse(&w[..43]), Err(LlcError::Truncated { .. })));
    assert!(LlcMessage::parse(&[]).is_err());
    // A v2 length beyond the buffer.
    let mut b = w.clone();
    b[0] = 0x27;
    b[1..3].copy_from_slice(&100u16.to_le_bytes());
    assert_eq!(LlcMessage::parse(&b), Err(LlcError::Truncated { need: 100, have: 44 }));
    // DELETE RKEY count 0 and 9.
    for n in [0u8, 9] {
        let mut b = [0u8; 44];
        b[0] = 0x09;
        b[1] = 44;
        b[4] = n;
        assert!(matches!(LlcMessage::parse(&b), Err(LlcError::BadCount { .. })));
    }
    // A receive buffer longer than the v1 message is fine.
    let mut big = w.clone();
    big.extend_from_slice(&[0xAA; 4]);
    assert_eq!(LlcMessage::parse(&big).unwrap(), m);
}

/// E-1: the RFC Figure-32 ADD LINK layout (GID right after the MAC) is not what we read:
/// parsed with the Linux layout its GID is shifted by two octets (known divergence).
#[test]
fn add_link_rfc_layout_is_a_known_divergence_e_1() {
    let gid: [u8; 16] = core::array::from_fn(|i| 0x10 + i as u8);
    let mut rfc = [0u8; 44];
    rfc[0] = 0x02;
    rfc[1] = 44;
    rfc[4..10].copy_from_slice(&[2; 6]);
    rfc[10..26].copy_from_slice(&gid);
    rfc[26..29].copy_from_slice(&[0, 0, 0x42]);
    rfc[29] = 2;
    let LlcBody::AddLink(a) = LlcMessage::parse(&rfc).unwrap().body else {
        panic!()
    };
    assert_ne!(a.gid, gid);
    assert_eq!(&a.gid[..14], &gid[2..]);
    // Our layout: GID at 12, QPN 28, link 31, MTU 32, PSN 33.
    let ours = LlcMessage::request(LlcBody::AddLink(AddLink {
        gid,
        qpn: 0x42,
        link_num: 2,
        qp_mtu: 3,
        psn: 0xabcdef,
        ..AddLink::default()
    }))
    .to_vec()
    .unwrap();
    assert_eq!(&ours[12..28], &gid);
    assert_eq!(&ours[28..36], &[0, 0, 0x42, 2, 3, 0xab, 0xcd, 0xef]);
}

/// SMC-INV-2: an ADD LINK reject reply with reason 2 (invalid MTU) in v1.
#[test]
fn add_link_reject_reason_smc_inv_2() {
    let m = LlcMessage::request(LlcBody::AddLink(AddLink {
        reject: true,
        reject_reason: add_link_reject::INVALID_MTU,
        ..AddLink::default()
    }))
    .into_reply();
    let w = m.to_vec().unwrap();
    assert_eq!((w[2], w[3]), (0x02, 0xC0));
    assert_eq!(LlcMessage::parse(&w).unwrap(), m);
}

/// E-2 / E-3: token placement of CONFIRM RKEY and its CONTINUATION.
#[test]
fn confirm_rkey_token_layout_e_2_e_3() {
    let t = |n: u8| LinkRtoken {
        link_num: n,
        rkey: 0x1000 + u32::from(n),
        vaddr: 0x2000 + u64::from(n),
    };
    let m = LlcMessage::request(LlcBody::ConfirmRkey(ConfirmRkey {
        num_tkns: 4,
        rkey: 0xAA,
        vaddr: 0xBB,
        others: vec![t(2), t(3)],
        ..ConfirmRkey::default()
    }));
    let w = m.to_vec().unwrap();
    assert_eq!(w[4], 4);
    assert_eq!(&w[17..22], &[2, 0, 0, 0x10, 0x02]);
    assert_eq!(&w[30..35], &[3, 0, 0, 0x10, 0x03]);
    assert_eq!(w[43], 0);
    let c = LlcMessage::request(LlcBody::ConfirmRkeyCont(ConfirmRkeyCont {
        negative: false,
        num_tkns_left: 2,
        tokens: vec![t(4), t(5)],
    }));
    let w = c.to_vec().unwrap();
    assert_eq!((w[5], w[18], w[31]), (4, 5, 0));
    assert_eq!(LlcMessage::parse(&w).unwrap(), c);
}

fn arb_rt() -> impl Strategy<Value = RtokenPair> {
    any::<(u32, u32, u64)>().prop_map(|(a, b, c)| RtokenPair {
        ref_rkey: a,
        new_rkey: b,
        new_vaddr: c,
    })
}
fn arb_lt() -> impl Strategy<Value = LinkRtoken> {
    any::<(u8, u32, u64)>().prop_map(|(l, k, v)| LinkRtoken {
        link_num: l,
        rkey: k,
        vaddr: v,
    })
}

fn arb_body(v2: bool) -> impl Strategy<Value = LlcBody> {
    let cl = (
        any::<([u8; 6], [u8; 16], [u8; 4])>(),
        0u32..1 << 24,
        any::<(u8, u8, u8, u8)>(),
    )
        .prop_map(|((mac, gid, link_uid), qpn, (f, link_num, max_links, max_conns))| {
            LlcBody::ConfirmLink(ConfirmLink {
                flags: f & 0x7f,
                mac,
                gid,
                qpn,
                link_num,
                link_uid,
                max_links,
                max_conns,
            })
        });
    let al = (
        any::<(bool, [u8; 6], [u8; 16], u8, u8)>(),
        0u32..1 << 24,
        0u32..1 << 24,
        0u8..16,
        0u8..16,
        proptest::option::of((any::<(bool, [u8; 16])>(), proptest::collection::vec(arb_rt(), 0..5))),
    )
        .prop_map(
            move |((reject, mac, gid, link_num, init_credits), qpn, psn, mtu, reason, x)| {
                LlcBody::AddLink(AddLink {
                    reject,
                    reject_reason: if v2 { 0 } else { reason },
                    mac,
                    gid,
                    qpn,
                    link_num,
                    qp_mtu: mtu,
                    psn,
                    init_credits,
                    v2_ext: if v2 {
                        x.map(|((d, g), rtokens)| AddLinkV2Ext {
                            v2_direct: d,
                            client_target_gid: g,
                            rtokens,
                        })
                    } else {
                        None
                    },
                })
            },
        );
    let alc = (any::<(u8, u8)>(), proptest::collection::vec(arb_rt(), 2)).prop_map(|((l, n), p)| {
        LlcBody::AddLinkCont(AddLinkCont {
            link_num: l,
            num_rtokens: n,
            pairs: p[..usize::from(n.min(2))].to_vec(),
        })
    });
    let dl = any::<(bool, bool, u8, u32)>().prop_map(|(all, orderly, link_num, reason)| {
        LlcBody::DeleteLink(DeleteLink {
            all,
            orderly,
            link_num,
            reason,
        })
    });
    let cr = (
        any::<(bool, bool, u8, u32, u64)>(),
        proptest::collection::vec(arb_lt(), 2),
    )
        .prop_map(|((negative, retry, n, rkey, vaddr), o)| {
            LlcBody::ConfirmRkey(ConfirmRkey {
                negative,
                retry,
                num_tkns: n,
                rkey,
                vaddr,
                others: o[..usize::from(n.min(2))].to_vec(),
            })
        });
    let crc = (any::<(bool, u8)>(), proptest::collection::vec(arb_lt(), 3)).prop_map(|((negative, n), t)| {
        LlcBody::ConfirmRkeyCont(ConfirmRkeyCont {
            negative,
            num_tkns_left: n,
            tokens: t[..usize::from(n.min(3))].to_vec(),
        })
    });
    let dr = (
        any::<(bool, u8)>(),
        proptest::collection::vec(any::<u32>(), 1..=if v2 { 20 } else { 8 }),
    )
        .prop_map(|((negative, err_mask), rkeys)| {
            LlcBody::DeleteRkey(DeleteRkey {
                negative,
                err_mask,
                rkeys,
            })
        });
    let tl = any::<[u8; 16]>().prop_map(|user_data| LlcBody::TestLink(TestLink { user_data }));
    let ral = proptest::collection::vec(any::<[u8; 16]>(), 0..4)
        .prop_map(|gids| LlcBody::RequestAddLink(RequestAddLink { gids }));
    if v2 {
        prop_oneof![cl, al, dl, ral, cr, dr, tl].boxed()
    } else {
        prop_oneof![cl, al, alc, dl, cr, crc, dr, tl].boxed()
    }
}

proptest! {
    #[test]
    fn v1_round_trip_a1_8(body in arb_body(false), reply in any::<bool>()) {
        let m = LlcMessage { version: LlcVersion::V1, reply, body, ext: vec![] };
        let w = m.to_vec().unwrap();
        prop_assert_eq!(w.len(), 44);
        prop_assert_eq!(LlcMessage::parse(&w).unwrap(), m);
    }

    #[test]
    fn v2_round_trip_a1_8(body in arb_body(true), reply in any::<bool>(), ext in proptest::collection::vec(any::<u8>(), 0..8)) {
        let ext = if matches!(body, LlcBody::AddLink(AddLink { v2_ext: None, .. })) { vec![] } else { ext };
        let m = LlcMessage { version: LlcVersion::V2, reply, body, ext };
        let w = m.to_vec().unwrap();
        prop_assert_eq!(LlcMessage::parse(&w).unwrap(), m);
    }

    #[test]
    fn garbage_never_panics_smc_inv_11(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(m) = LlcMessage::parse(&b) {
            let again = m.to_vec().unwrap();
            prop_assert_eq!(LlcMessage::parse(&again).unwrap(), m);
        }
    }
}
