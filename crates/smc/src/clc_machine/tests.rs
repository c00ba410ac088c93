//! One test per row of requirements A2.2 that the CLC machine decides (SMC-CLC-*, F1–F10,
//! F14, SMC-SC-8); the rows decided by the link layer (F11–F13, F15, F17) use `decline` /
//! `point_of_no_return` exactly as F6–F8 do here.

use super::*;
use crate::wire::clc::{ClcMessage, EYECATCHER_SMCR};

fn eid(s: &str) -> [u8; EID_LEN] {
    let mut e = [b' '; EID_LEN];
    e[..s.len()].copy_from_slice(s.as_bytes());
    e
}

fn caps(last: u8, v1: bool, v2: bool) -> LocalCaps {
    let mac = [0x52, 0x54, 0, 0x77, 0, last];
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[192, 168, 77, last]);
    let mut hostname = [b' '; HOSTNAME_LEN];
    hostname[..4].copy_from_slice(b"host");
    LocalCaps {
        enabled: true,
        v1,
        v2,
        peer_id: PeerId::new(u16::from(last) * 0x101, mac),
        gid,
        mac,
        ipv4: Some((Ipv4Addr::new(192, 168, 77, last), 24)),
        ipv6: None,
        eids: vec![eid("SOFTRDMA-TEST")],
        hostname,
        max_conns: 255,
        max_links: 2,
    }
}

fn params(qpn: u32) -> LinkParams {
    LinkParams {
        qpn,
        rmb_rkey: 0x100 + qpn,
        rmbe_idx: 1,
        alert_token: qpn * 7,
        rmbe_size: 2,
        qp_mtu: 3,
        rmb_vaddr: 0x7f00_0000_0000 + u64::from(qpn),
        psn: 0x1000 + qpn,
    }
}

/// Moves the pending output of `from` into `to`; returns the octets.
fn pipe(from: &mut ClcMachine, to: &mut ClcMachine) -> Vec<u8> {
    let b = from.take_output();
    to.on_bytes(&b);
    b
}

/// The code `m` declined with (its outcome must be a fallback after its own Decline).
fn declined(m: &ClcMachine) -> Diagnosis {
    match m.outcome() {
        Outcome::Fallback(FallbackReason::Declined(d)) => *d,
        o => panic!("expected our Decline, got {o:?}"),
    }
}

fn declined_by_peer(m: &ClcMachine) -> (Diagnosis, bool) {
    match m.outcome() {
        Outcome::Fallback(FallbackReason::PeerDeclined { diagnosis, out_of_sync }) => (*diagnosis, *out_of_sync),
        o => panic!("expected a peer Decline, got {o:?}"),
    }
}

fn msg(b: &[u8]) -> ClcMessage {
    ClcMessage::parse(b).unwrap()
}

#[test]
fn v2_first_contact_handshake_proceeds() {
    let mut c = ClcMachine::client(caps(3, false, true), true);
    let mut s = ClcMachine::server(caps(2, false, true), true);
    let p = pipe(&mut c, &mut s);
    assert_eq!(p.len(), 156, "Linux's v2-only Proposal shape");
    let Outcome::NeedLink(n) = s.outcome().clone() else {
        panic!("{:?}", s.outcome())
    };
    assert!(matches!(*n, NeedLink::Proposal { version: 2, eid: Some(e), .. } if e == eid("SOFTRDMA-TEST")));
    s.accept(&params(0x13), true).unwrap();
    let a = pipe(&mut s, &mut c);
    assert_eq!(a.len(), 160, "Linux's v2 first-contact Accept shape");
    let Outcome::NeedLink(n) = c.outcome().clone() else {
        panic!("{:?}", c.outcome())
    };
    let NeedLink::Accept(acc) = *n else { panic!() };
    assert_eq!((acc.qpn, acc.psn, acc.first_contact), (0x13, 0x1013, true));
    c.confirm(&params(0x11)).unwrap();
    let Outcome::Proceed(got) = c.outcome().clone() else {
        panic!()
    };
    assert_eq!(got.qpn, 0x13);
    let cf = pipe(&mut c, &mut s);
    assert_eq!(
        cf.len(),
        180,
        "Linux's v2 first-contact Confirm shape with the GID list"
    );
    let Outcome::Proceed(conf) = s.outcome().clone() else {
        panic!("{:?}", s.outcome())
    };
    assert_eq!(
        (conf.qpn, conf.rmbe_alert_token, conf.rmb_rkey),
        (0x11, 0x11 * 7, 0x111)
    );
    assert_eq!((c.version(), s.version()), (2, 2));
    assert!(c.take_output().is_empty() && s.take_output().is_empty());
}

#[test]
fn v1_handshake_uses_the_92_octet_proposal_and_68_octet_messages() {
    let mut c = ClcMachine::client(caps(3, true, false), true);
    let mut s = ClcMachine::server(caps(2, true, false), true);
    assert_eq!(pipe(&mut c, &mut s).len(), 92);
    s.accept(&params(5), false).unwrap();
    assert_eq!(pipe(&mut s, &mut c).len(), 68);
    c.confirm(&params(6)).unwrap();
    assert_eq!(pipe(&mut c, &mut s).len(), 68);
    assert!(matches!(s.outcome(), Outcome::Proceed(x) if x.qpn == 6));
    assert_eq!(s.version(), 1);
}

/// Splitting the stream anywhere changes nothing.
#[test]
fn byte_by_byte_delivery() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut s = ClcMachine::server(caps(2, true, true), true);
    for b in c.take_output() {
        assert_eq!(s.outcome(), &Outcome::Pending);
        s.on_bytes(&[b]);
    }
    assert!(matches!(s.outcome(), Outcome::NeedLink(_)));
}

/// F1 / SMC-OPT-3: no option on SYN or SYN-ACK → plain TCP, no CLC octet at all.
#[test]
fn f1_option_missing_gives_plain_tcp() {
    let mut c = ClcMachine::client(caps(3, true, true), false);
    let mut s = ClcMachine::server(caps(2, true, true), false);
    for m in [&mut c, &mut s] {
        assert_eq!(m.outcome(), &Outcome::Fallback(FallbackReason::PeerNoSmc));
        assert!(m.take_output().is_empty());
        m.on_bytes(b"hello");
        assert_eq!(m.take_app_data(), b"hello");
    }
    assert_eq!(FallbackReason::PeerNoSmc.to_string(), "peer did not indicate SMC");
}

/// F2: SMC-R disabled by server policy → Decline instead of Accept, both fall back.
#[test]
fn f2_server_policy_declines() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut sc = caps(2, true, true);
    sc.enabled = false;
    let mut s = ClcMachine::server(sc, true);
    pipe(&mut c, &mut s);
    assert_eq!(declined(&s), Diagnosis::CONFIG_ERROR);
    let d = pipe(&mut s, &mut c);
    assert!(matches!(msg(&d), ClcMessage::Decline(_)));
    assert_eq!(declined_by_peer(&c), (Diagnosis::CONFIG_ERROR, false));
}

/// SMC-R v1 over IPv6 TCP (RFC 7609 §3.5.1.1 IPv6 prefix list, SMC-FC-1): the Proposal
/// carries the /64 prefix of the client's address (17 more octets than the 92 of IPv4: one
/// prefix), IPv4 area zero; the server proceeds when one proposed prefix equals its own
/// address's under the same length, else Declines 0x03070000.
#[test]
fn v1_over_ipv6_prefix_match_and_mismatch() {
    let v6 = |last: u8, net: u16| {
        let mut c = caps(last, true, false);
        c.ipv4 = None;
        c.ipv6 = Some((Ipv6Addr::new(0xfd15, 0x151, net, 0, 0, 0, 0, u16::from(last)), 64));
        c
    };
    let mut c = ClcMachine::client(v6(3, 8), true);
    let mut s = ClcMachine::server(v6(2, 8), true);
    let p = pipe(&mut c, &mut s);
    assert_eq!(p.len(), 92 + 17);
    let ClcMessage::Proposal(prop) = msg(&p) else { panic!() };
    let ip = prop.ip.unwrap();
    assert_eq!((ip.subnet, ip.prefix_len), (Ipv4Addr::UNSPECIFIED, 0));
    assert_eq!(ip.ipv6, vec![(Ipv6Addr::new(0xfd15, 0x151, 8, 0, 0, 0, 0, 0), 64)]);
    assert!(matches!(s.outcome(), Outcome::NeedLink(n) if matches!(**n, NeedLink::Proposal { version: 1, .. })));
    // Another /64: Decline.
    let mut c = ClcMachine::client(v6(3, 9), true);
    let mut s = ClcMachine::server(v6(2, 8), true);
    pipe(&mut c, &mut s);
    pipe(&mut s, &mut c);
    assert_eq!(declined_by_peer(&c), (Diagnosis::DIFF_PREFIX, false));
    // An IPv4 server and an IPv6 Proposal: Decline.
    let mut c = ClcMachine::client(v6(3, 8), true);
    let mut s = ClcMachine::server(caps(2, true, false), true);
    pipe(&mut c, &mut s);
    assert_eq!(declined(&s), Diagnosis::DIFF_PREFIX);
}

/// F2 / SMC-FC-1: subnet mismatch on v1 → Decline 0x03070000.
#[test]
fn f2_subnet_mismatch_declines() {
    let mut cc = caps(3, true, false);
    cc.ipv4 = Some((Ipv4Addr::new(10, 9, 0, 3), 24));
    let mut c = ClcMachine::client(cc, true);
    let mut s = ClcMachine::server(caps(2, true, false), true);
    pipe(&mut c, &mut s);
    pipe(&mut s, &mut c);
    assert_eq!(declined_by_peer(&c), (Diagnosis::DIFF_PREFIX, false));
    // Same network, different prefix length: also a mismatch (E-4).
    let mut cc = caps(3, true, false);
    cc.ipv4 = Some((Ipv4Addr::new(192, 168, 77, 3), 16));
    let mut c = ClcMachine::client(cc, true);
    let mut s = ClcMachine::server(caps(2, true, false), true);
    pipe(&mut c, &mut s);
    assert_eq!(declined(&s), Diagnosis::DIFF_PREFIX);
}

/// F2 / SMC-CLC-3: no common version → Decline "version mismatch".
#[test]
fn f2_no_common_version_declines() {
    let mut c = ClcMachine::client(caps(3, false, true), true);
    let mut s = ClcMachine::server(caps(2, true, false), true);
    pipe(&mut c, &mut s);
    pipe(&mut s, &mut c);
    assert_eq!(declined_by_peer(&c), (Diagnosis::VERSION_MISMATCH, false));
}

/// SMC-CLC-3: a v2 Proposal that also offers v1 SMC-R, to a v1-only server → v1 Accept.
#[test]
fn smc_clc_3_v2_proposal_offering_v1_gets_a_v1_accept() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut s = ClcMachine::server(caps(2, true, false), true);
    let p = pipe(&mut c, &mut s);
    assert!(matches!(msg(&p), ClcMessage::Proposal(p) if p.version == 2 && p.offers_v1_r()));
    s.accept(&params(9), true).unwrap();
    let a = pipe(&mut s, &mut c);
    assert!(matches!(msg(&a), ClcMessage::Accept(a) if a.version == 1 && a.v2.is_none()));
    c.confirm(&params(10)).unwrap();
    let cf = pipe(&mut c, &mut s);
    assert_eq!(cf.len(), 68);
    assert!(matches!(s.outcome(), Outcome::Proceed(_)));
}

/// F2 (v2): no EID in common and no v1 offer → Decline "peer sent no UEID".
#[test]
fn f2_no_common_eid_declines() {
    let mut cc = caps(3, false, true);
    cc.eids = vec![eid("OTHER")];
    let mut c = ClcMachine::client(cc, true);
    let mut s = ClcMachine::server(caps(2, true, true), true);
    pipe(&mut c, &mut s);
    pipe(&mut s, &mut c);
    assert_eq!(declined_by_peer(&c), (Diagnosis::NO_UEID, false));
}

/// F2 / SMC-FC-3: server out of resources → Decline 0x01010000, never an Accept.
#[test]
fn f2_server_resources_decline() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut s = ClcMachine::server(caps(2, true, true), true);
    pipe(&mut c, &mut s);
    s.decline(Diagnosis::MEM, false).unwrap();
    let d = pipe(&mut s, &mut c);
    assert_eq!(d.len(), 44, "v2 was chosen: Linux's 44-octet v2 Decline");
    assert_eq!(declined_by_peer(&c), (Diagnosis::MEM, false));
    assert!(s.accept(&params(1), true).is_err());
}

/// F3 / SMC-CLC-6: an Accept with a reserved MTU or RMBE size → client Declines, fallback.
#[test]
fn f3_bad_enum_in_accept_declines() {
    for (mtu, size) in [(7u8, 2u8), (0, 2), (3, 6)] {
        let mut c = ClcMachine::client(caps(3, true, false), true);
        let mut s = ClcMachine::server(caps(2, true, false), true);
        pipe(&mut c, &mut s);
        s.accept(
            &LinkParams {
                qp_mtu: mtu,
                rmbe_size: size,
                ..params(1)
            },
            true,
        )
        .unwrap();
        pipe(&mut s, &mut c);
        assert_eq!(declined(&c), Diagnosis::CONFIG_ERROR);
        pipe(&mut c, &mut s);
        assert_eq!(declined_by_peer(&s), (Diagnosis::CONFIG_ERROR, false));
        // Application data flows over TCP afterwards.
        s.on_bytes(b"data");
        assert_eq!(s.take_app_data(), b"data");
    }
}

/// F4 / SMC-CLC-7: the client's RNIC fails after its Proposal: it waits for the Accept and
/// sends its Decline instead of the Confirm — never two CLC messages in a row.
#[test]
fn f4_client_declines_only_after_the_accept() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut s = ClcMachine::server(caps(2, true, true), true);
    pipe(&mut c, &mut s);
    c.decline(Diagnosis::NO_SMCR_DEV, false).unwrap();
    assert!(c.take_output().is_empty(), "no chase: nothing sent before the Accept");
    assert_eq!(c.outcome(), &Outcome::Pending);
    s.accept(&params(1), true).unwrap();
    pipe(&mut s, &mut c);
    assert_eq!(declined(&c), Diagnosis::NO_SMCR_DEV);
    let d = pipe(&mut c, &mut s);
    assert!(matches!(msg(&d), ClcMessage::Decline(_)));
    assert_eq!(declined_by_peer(&s), (Diagnosis::NO_SMCR_DEV, false));
}

/// F5 / F14 / SMC-CLC-12: an Accept with F = 0 naming no known link → Decline with S; the
/// server learns "out of sync" and tears down that group.
#[test]
fn f5_f14_out_of_sync_decline_carries_s() {
    let mut c = ClcMachine::client(caps(3, true, false), true);
    let mut s = ClcMachine::server(caps(2, true, false), true);
    pipe(&mut c, &mut s);
    s.accept(&params(1), false).unwrap();
    pipe(&mut s, &mut c);
    let Outcome::NeedLink(n) = c.outcome().clone() else {
        panic!()
    };
    assert!(matches!(*n, NeedLink::Accept(ref a) if !a.first_contact));
    c.decline(Diagnosis::SYNC_ERROR, true).unwrap();
    let d = pipe(&mut c, &mut s);
    assert_eq!(d[7] & 0x08, 0x08, "S flag on the wire");
    assert_eq!(declined_by_peer(&s), (Diagnosis::SYNC_ERROR, true));
}

/// F6 / F7 / SMC-FC-12: first contact may still Decline after Accept/Confirm until the point
/// of no return; then no more.
#[test]
fn f6_f7_first_contact_decline_until_point_of_no_return() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut s = ClcMachine::server(caps(2, true, true), true);
    pipe(&mut c, &mut s);
    s.accept(&params(1), true).unwrap();
    pipe(&mut s, &mut c);
    c.confirm(&params(2)).unwrap();
    pipe(&mut c, &mut s);
    assert!(matches!(s.outcome(), Outcome::Proceed(_)));
    // F6: the server cannot send CONFIRM LINK → Decline.
    s.decline(Diagnosis::TIMEOUT_CONFIRM_LINK, false).unwrap();
    pipe(&mut s, &mut c);
    assert_eq!(declined_by_peer(&c), (Diagnosis::TIMEOUT_CONFIRM_LINK, false));
    // F7 from the client, and after the point of no return it is refused.
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut s = ClcMachine::server(caps(2, true, true), true);
    pipe(&mut c, &mut s);
    s.accept(&params(1), true).unwrap();
    pipe(&mut s, &mut c);
    c.confirm(&params(2)).unwrap();
    pipe(&mut c, &mut s);
    c.point_of_no_return();
    assert_eq!(c.decline(Diagnosis::INTERNAL, false), Err(MachineError::DeclineTooLate));
    assert!(c.take_output().is_empty());
}

/// SMC-SC-8: subsequent contact: no Decline after the server's Accept / the client's Confirm.
#[test]
fn smc_sc_8_no_decline_on_subsequent_contact_after_accept() {
    let mut c = ClcMachine::client(caps(3, true, false), true);
    let mut s = ClcMachine::server(caps(2, true, false), true);
    pipe(&mut c, &mut s);
    s.accept(&params(1), false).unwrap();
    assert_eq!(s.decline(Diagnosis::INTERNAL, false), Err(MachineError::DeclineTooLate));
    pipe(&mut s, &mut c);
    c.confirm(&params(2)).unwrap();
    assert_eq!(c.decline(Diagnosis::INTERNAL, false), Err(MachineError::DeclineTooLate));
    pipe(&mut c, &mut s);
    assert!(matches!(s.outcome(), Outcome::Proceed(_)));
    // A Decline arriving now is a protocol error, not a fallback.
    let d = ClcMessage::Decline(Decline::new(PeerId::default(), Diagnosis::INTERNAL, false))
        .to_vec()
        .unwrap();
    s.on_bytes(&d);
    assert_eq!(s.outcome(), &Outcome::Reset(ResetReason::Unexpected(ClcType::Decline)));
}

/// F9 / SMC-CLC-5: application data where the Proposal is expected → reset, nothing
/// reaches the application.
#[test]
fn f9_app_data_instead_of_proposal_resets() {
    let mut s = ClcMachine::server(caps(2, true, true), true);
    s.on_bytes(b"GET / HTTP/1.1\r\n");
    assert!(matches!(
        s.outcome(),
        Outcome::Reset(ResetReason::Malformed(ClcError::BadEyecatcher(_)))
    ));
    assert!(s.take_app_data().is_empty());
    assert!(s.take_output().is_empty());
}

/// F9 / SMC-CLC-1 / SMC-CLC-5: a Proposal with a broken trailer → reset (no fallback).
#[test]
fn f9_broken_trailer_resets() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut p = c.take_output();
    let n = p.len();
    p[n - 1] ^= 0xff;
    let mut s = ClcMachine::server(caps(2, true, true), true);
    s.on_bytes(&p);
    assert!(matches!(
        s.outcome(),
        Outcome::Reset(ResetReason::Malformed(ClcError::BadTrailer(_)))
    ));
    // Wrong message type for the state (an Accept sent to a server) is a reset too.
    let mut s = ClcMachine::server(caps(2, true, true), true);
    let a = ClcMessage::Accept(AcceptConfirm::v1(
        true,
        PeerId::default(),
        [0; 16],
        [0; 6],
        1,
        2,
        1,
        3,
        0,
        3,
        0,
        0,
    ));
    s.on_bytes(&a.to_vec().unwrap());
    assert_eq!(s.outcome(), &Outcome::Reset(ResetReason::Unexpected(ClcType::Accept)));
}

/// SMC-CLC-8: application data that follows a Decline in the same segment is delivered.
#[test]
fn smc_clc_8_data_after_decline_is_delivered() {
    let mut c = ClcMachine::client(caps(3, true, false), true);
    c.take_output();
    let mut seg = ClcMessage::Decline(Decline::new(PeerId::default(), Diagnosis::DIFF_PREFIX, false))
        .to_vec()
        .unwrap();
    seg.extend_from_slice(b"server greeting");
    c.on_bytes(&seg);
    assert_eq!(declined_by_peer(&c), (Diagnosis::DIFF_PREFIX, false));
    assert_eq!(c.take_app_data(), b"server greeting");
}

/// SMC-CLC-9: after fallback, a byte string that is a valid Decline is data.
#[test]
fn smc_clc_9_no_clc_parsing_after_fallback() {
    let mut s = ClcMachine::server(caps(2, true, false), false);
    let d = ClcMessage::Decline(Decline::new(PeerId::default(), Diagnosis::MEM, false))
        .to_vec()
        .unwrap();
    s.on_bytes(&d);
    assert_eq!(s.take_app_data(), d);
    assert_eq!(s.outcome(), &Outcome::Fallback(FallbackReason::PeerNoSmc));
    assert_eq!(&d[..4], &EYECATCHER_SMCR);
}

/// F10 / SMC-CLC-10: the CLC timer expires → reset, in every waiting state; not after.
#[test]
fn f10_timeout_resets() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    assert_eq!(c.on_timeout(), &Outcome::Reset(ResetReason::Timeout));
    let mut s = ClcMachine::server(caps(2, true, true), true);
    assert_eq!(s.on_timeout(), &Outcome::Reset(ResetReason::Timeout));
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut s = ClcMachine::server(caps(2, true, true), true);
    pipe(&mut c, &mut s);
    s.accept(&params(1), true).unwrap();
    assert_eq!(
        s.on_timeout(),
        &Outcome::Reset(ResetReason::Timeout),
        "waiting for Confirm"
    );
    pipe(&mut s, &mut c);
    c.confirm(&params(2)).unwrap();
    assert!(matches!(c.on_timeout(), Outcome::Proceed(_)));
    assert_eq!(
        ClcMachine::server(caps(2, true, true), true).on_eof(),
        &Outcome::Reset(ResetReason::Closed)
    );
}

/// The server's own RNIC fails while it waits for the Confirm (first contact): it Declines
/// in place of CONFIRM LINK once the Confirm arrived (no chase).
#[test]
fn server_decline_while_waiting_for_confirm_is_deferred() {
    let mut c = ClcMachine::client(caps(3, true, true), true);
    let mut s = ClcMachine::server(caps(2, true, true), true);
    pipe(&mut c, &mut s);
    s.accept(&params(1), true).unwrap();
    pipe(&mut s, &mut c);
    s.decline(Diagnosis::NO_ACTIVE_LINK, false).unwrap();
    assert!(s.take_output().is_empty());
    c.confirm(&params(2)).unwrap();
    pipe(&mut c, &mut s);
    assert_eq!(declined(&s), Diagnosis::NO_ACTIVE_LINK);
    pipe(&mut s, &mut c);
    assert_eq!(declined_by_peer(&c), (Diagnosis::NO_ACTIVE_LINK, false));
}

/// No common SMC with a local client that has nothing to offer: no Proposal.
#[test]
fn client_without_anything_to_offer_does_not_propose() {
    let mut cc = caps(3, false, true);
    cc.eids.clear();
    let mut c = ClcMachine::client(cc, true);
    assert_eq!(c.outcome(), &Outcome::Fallback(FallbackReason::Disabled));
    assert!(c.take_output().is_empty());
}

/// Linux's v2x rule: the client's Confirm echoes the negotiated max connections / links of
/// the Accept (min of both sides); a Confirm with other values is declined.
#[test]
fn v2_confirm_must_echo_negotiated_limits() {
    let mut cc = caps(3, false, true);
    cc.max_conns = 16;
    let mut c = ClcMachine::client(cc, true);
    let mut s = ClcMachine::server(caps(2, false, true), true);
    pipe(&mut c, &mut s);
    s.accept(&params(1), true).unwrap();
    let a = pipe(&mut s, &mut c);
    let ClcMessage::Accept(acc) = msg(&a) else { panic!() };
    let x = acc.v2.unwrap().fce.unwrap().v2x.unwrap();
    assert_eq!((x.max_conns, x.max_links), (16, 2), "min of both sides");
    c.confirm(&params(2)).unwrap();
    let mut cf = c.take_output();
    let ClcMessage::Confirm(conf) = msg(&cf) else { panic!() };
    assert_eq!(conf.v2.unwrap().fce.unwrap().v2x.unwrap().max_conns, 16);
    // A forged Confirm announcing 255 connections.
    let off = 64 + EID_LEN + 8 + 4 + HOSTNAME_LEN;
    assert_eq!(cf[off], 16);
    cf[off] = 255;
    s.on_bytes(&cf);
    assert_eq!(declined(&s), Diagnosis::MAX_CONN_ERR);
}
