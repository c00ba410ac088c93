//! The link-group machine in memory: TEST LINK, CONFIRM/DELETE RKEY, DELETE LINK, the
//! single-link ADD LINK reject, linger, and the v2 form.

use super::*;
use crate::wire::llc::{AddLink, ConfirmLink};
use crate::wire::llc::{
    ConfirmRkey, DeleteLink, DeleteRkey, LlcBody, LlcMessage, TestLink, add_link_reject, delete_reason,
};

fn t0() -> Instant {
    Instant::now()
}

fn llc(body: LlcBody, reply: bool) -> [u8; LLC_LEN] {
    let mut m = LlcMessage::request(body);
    m.reply = reply;
    let mut b = [0u8; LLC_LEN];
    m.emit(&mut b).unwrap();
    b
}

fn sent(m: &mut LgrMachine) -> Vec<LlcMessage> {
    let mut v = Vec::new();
    while let Some(a) = m.poll_action() {
        if let LgrAction::SendLlc { msg: b, .. } = a {
            v.push(LlcMessage::parse(&b).unwrap());
        }
    }
    v
}

fn terminated(m: &mut LgrMachine) -> Option<TermReason> {
    let mut t = None;
    while let Some(a) = m.poll_action() {
        if let LgrAction::Terminate(r) = a {
            t = Some(r);
        }
    }
    t
}

fn machine(role: Role, now: Instant) -> LgrMachine {
    let mut m = LgrMachine::new(LgrConfig::new(role), now);
    m.conn_added();
    m
}

/// SMC-KA-2: a TEST LINK request is answered with R and the same user data.
#[test]
fn test_link_request_is_echoed() {
    let now = t0();
    let mut m = machine(Role::Client, now);
    let ud = [7u8; 16];
    m.on_llc(&llc(LlcBody::TestLink(TestLink { user_data: ud }), false), now);
    let out = sent(&mut m);
    assert_eq!(out.len(), 1);
    assert!(out[0].reply);
    assert_eq!(out[0].body, LlcBody::TestLink(TestLink { user_data: ud }));
    assert!(m.terminated().is_none());
}

/// SMC-KA-1: TEST LINK after the keepalive time of silence, not before; traffic
/// postpones it; a matching reply keeps the link; no reply within the LLC wait = link
/// failed (SMC-TMO-16), DELETE LINK A sent.
#[test]
fn keepalive_probe_and_timeout() {
    let now = t0();
    let mut m = machine(Role::Server, now);
    m.on_tick(now + KEEPALIVE - Duration::from_millis(1));
    assert!(sent(&mut m).is_empty());
    m.on_rx(now + Duration::from_secs(10)); // busy link: no probe at 30 s
    m.on_tick(now + KEEPALIVE);
    assert!(sent(&mut m).is_empty());
    let t1 = now + Duration::from_secs(40);
    m.on_tick(t1);
    let out = sent(&mut m);
    let LlcBody::TestLink(TestLink { user_data }) = out[0].body else {
        panic!("{out:?}")
    };
    assert!(!out[0].reply);
    assert_eq!(m.counters().test_links, 1);
    m.on_llc(
        &llc(LlcBody::TestLink(TestLink { user_data }), true),
        t1 + Duration::from_millis(5),
    );
    assert!(m.terminated().is_none());
    // Next probe, unanswered.
    let t2 = t1 + KEEPALIVE + Duration::from_secs(1);
    m.on_tick(t2);
    assert_eq!(sent(&mut m).len(), 1);
    m.on_tick(t2 + LLC_WAIT - Duration::from_millis(1));
    assert!(m.terminated().is_none());
    m.on_tick(t2 + LLC_WAIT);
    assert_eq!(m.terminated(), Some(&TermReason::LlcTimeout("TEST LINK")));
    let out: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
    assert!(matches!(out.last(), Some(LgrAction::Terminate(_))));
    let LgrAction::SendLlc { msg: b, .. } = &out[0] else {
        panic!()
    };
    let d = LlcMessage::parse(b).unwrap();
    assert!(matches!(d.body, LlcBody::DeleteLink(DeleteLink { all: true, .. })));
}

/// SMC-INV-10: a TEST LINK reply with other user data → link down.
#[test]
fn test_link_reply_mismatch_is_protocol_error() {
    let now = t0();
    let mut m = machine(Role::Client, now);
    m.on_tick(now + KEEPALIVE);
    sent(&mut m);
    m.on_llc(
        &llc(LlcBody::TestLink(TestLink { user_data: [9; 16] }), true),
        now + KEEPALIVE,
    );
    assert!(matches!(terminated(&mut m), Some(TermReason::ProtocolError(_))));
}

/// SMC-LG-19: opcodes 0x00 / 0x3F / 0x40 / 0x05 (v1) → protocol error; 0x80 / 0xBF →
/// discarded, link stays.
#[test]
fn unknown_opcodes_by_class() {
    for op in [0x80u8, 0xBF] {
        let now = t0();
        let mut m = machine(Role::Server, now);
        let mut b = [0u8; LLC_LEN];
        b[0] = op;
        b[1] = 44;
        m.on_llc(&b, now);
        assert!(m.terminated().is_none(), "{op:#x}");
        assert_eq!(m.counters().discarded, 1);
    }
    for op in [0x00u8, 0x05, 0x3F, 0x40, 0x7F, 0xC0] {
        let now = t0();
        let mut m = machine(Role::Server, now);
        let mut b = [0u8; LLC_LEN];
        b[0] = op;
        b[1] = 44;
        m.on_llc(&b, now);
        assert!(matches!(m.terminated(), Some(TermReason::ProtocolError(_))), "{op:#x}");
    }
    // Wrong length field on a known opcode.
    let now = t0();
    let mut m = machine(Role::Client, now);
    let mut b = llc(LlcBody::TestLink(TestLink::default()), false);
    b[1] = 40;
    m.on_llc(&b, now);
    assert!(matches!(m.terminated(), Some(TermReason::ProtocolError(_))));
}

/// SMC-TMO-14 / SMC-LG-12: DELETE LINK with A tears the group down at once, no reply.
/// DELETE LINK of our link: the client replies, then the group ends (last link).
/// SMC-INV-6/7: DELETE LINK of an unknown link → reply "no link", group goes on.
#[test]
fn delete_link_variants() {
    let now = t0();
    let mut m = machine(Role::Client, now);
    let all = DeleteLink {
        all: true,
        orderly: false,
        link_num: 0,
        reason: delete_reason::PROGRAM,
    };
    m.on_llc(&llc(LlcBody::DeleteLink(all), false), now);
    let acts: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
    assert_eq!(
        acts,
        vec![LgrAction::Terminate(TermReason::PeerDeleted(delete_reason::PROGRAM))]
    );

    let mut m = machine(Role::Client, now);
    let one = DeleteLink {
        all: false,
        orderly: false,
        link_num: 1,
        reason: delete_reason::LOST_PATH,
    };
    m.on_llc(&llc(LlcBody::DeleteLink(one), false), now);
    let out = sent(&mut m);
    assert_eq!(out.len(), 1);
    assert!(out[0].reply);
    assert_eq!(out[0].body, LlcBody::DeleteLink(one));
    assert!(m.terminated().is_some());

    let mut m = machine(Role::Server, now);
    let other = DeleteLink { link_num: 9, ..one };
    m.on_llc(&llc(LlcBody::DeleteLink(other), false), now);
    let out = sent(&mut m);
    assert!(out[0].reply);
    assert_eq!(
        out[0].body,
        LlcBody::DeleteLink(DeleteLink {
            reason: delete_reason::NO_LINK,
            ..other
        })
    );
    assert!(m.terminated().is_none());
}

/// SMC-FC-9: one RNIC on the client → ADD LINK rejected with Z, reason 1.
#[test]
fn add_link_rejected_no_alternate_path() {
    let now = t0();
    let mut m = machine(Role::Client, now);
    let a = AddLink {
        qpn: 0x123,
        link_num: 2,
        qp_mtu: 3,
        ..AddLink::default()
    };
    m.on_llc(&llc(LlcBody::AddLink(a.clone()), false), now);
    let out = sent(&mut m);
    assert!(out[0].reply);
    let LlcBody::AddLink(r) = &out[0].body else { panic!() };
    assert!(r.reject);
    assert_eq!(r.reject_reason, add_link_reject::NO_ALTERNATE_PATH);
    assert_eq!(r.link_num, 2);
    assert!(m.terminated().is_none());
}

/// CONFIRM RKEY both ways (A4.8), its timeout (SMC-TMO-16) and DELETE RKEY of an
/// unknown RKey (SMC-INV-9).
#[test]
fn rkey_exchanges() {
    let now = t0();
    let mut m = machine(Role::Server, now);
    m.confirm_rkey(0x55, 0x1000, now).unwrap();
    assert_eq!(m.confirm_rkey(0x56, 0, now), Err(Busy));
    assert!(!m.usable());
    let out = sent(&mut m);
    let LlcBody::ConfirmRkey(c) = &out[0].body else {
        panic!()
    };
    assert_eq!((c.rkey, c.vaddr, c.num_tkns), (0x55, 0x1000, 0));
    m.on_llc(&llc(LlcBody::ConfirmRkey(c.clone()), true), now);
    assert_eq!(m.poll_action(), Some(LgrAction::RkeyConfirmed { rkey: 0x55, ok: true }));
    assert!(m.usable());

    // Peer's CONFIRM RKEY → positive echo; DELETE RKEY of it plus an unknown one.
    m.on_llc(
        &llc(
            LlcBody::ConfirmRkey(ConfirmRkey {
                rkey: 0x77,
                vaddr: 0x2000,
                ..ConfirmRkey::default()
            }),
            false,
        ),
        now,
    );
    let out = sent(&mut m);
    assert!(out[0].reply);
    assert_eq!(m.peer_rkeys().get(&0x77), Some(&0x2000));
    m.on_llc(
        &llc(
            LlcBody::DeleteRkey(DeleteRkey {
                rkeys: vec![0x77, 0x99],
                ..DeleteRkey::default()
            }),
            false,
        ),
        now,
    );
    let out = sent(&mut m);
    let LlcBody::DeleteRkey(d) = &out[0].body else { panic!() };
    assert!(out[0].reply && d.negative);
    assert_eq!(d.err_mask, 0x40);
    assert!(m.peer_rkeys().is_empty());

    // Unanswered CONFIRM RKEY.
    let mut m = machine(Role::Client, now);
    m.confirm_rkey(0x55, 0, now).unwrap();
    sent(&mut m);
    m.on_tick(now + LLC_WAIT);
    let acts: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
    assert!(acts.contains(&LgrAction::RkeyConfirmed { rkey: 0x55, ok: false }));
    assert!(matches!(
        acts.last(),
        Some(LgrAction::Terminate(TermReason::LlcTimeout(_)))
    ));
}

/// SMC-INV-11: out-of-sync messages on an established link → link down.
#[test]
fn out_of_sync_messages() {
    let bodies = [
        (LlcBody::ConfirmLink(ConfirmLink::default()), false),
        (LlcBody::ConfirmRkey(ConfirmRkey::default()), true),
        (LlcBody::AddLink(AddLink::default()), true),
    ];
    for (b, reply) in bodies {
        let now = t0();
        let mut m = machine(Role::Client, now);
        m.on_llc(&llc(b.clone(), reply), now);
        assert!(
            matches!(terminated(&mut m), Some(TermReason::ProtocolError(_))),
            "{b:?}"
        );
    }
}

/// A4.9: the last connection leaves → linger → DELETE LINK (A, 0x00030000) and the
/// group ends; a new connection in time cancels it. The client waits 2 s longer.
#[test]
fn linger_then_idle_teardown() {
    let now = t0();
    let mut m = machine(Role::Server, now);
    m.conn_removed(now);
    assert!(m.lingering());
    m.on_rx(now + Duration::from_secs(9)); // keep keepalive quiet
    m.on_tick(now + Duration::from_secs(9));
    m.conn_added();
    m.on_tick(now + Duration::from_secs(11));
    assert!(m.terminated().is_none());
    m.conn_removed(now + Duration::from_secs(11));
    m.on_rx(now + Duration::from_secs(20));
    m.on_tick(now + Duration::from_secs(21));
    let out: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
    let LgrAction::SendLlc { msg: b, .. } = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(
        LlcMessage::parse(b).unwrap().body,
        LlcBody::DeleteLink(DeleteLink {
            all: true,
            orderly: false,
            link_num: 0,
            reason: delete_reason::PROGRAM
        })
    );
    assert_eq!(out.last(), Some(&LgrAction::Terminate(TermReason::Idle)));

    let mut c = LgrMachine::new(LgrConfig::new(Role::Client), now);
    c.on_rx(now + Duration::from_secs(10));
    c.on_tick(now + Duration::from_secs(10));
    assert!(c.terminated().is_none());
    c.on_tick(now + Duration::from_secs(12));
    assert_eq!(c.terminated(), Some(&TermReason::Idle));
}

/// Two machines wired in memory (server and client of one group): every LLC one sends is
/// delivered to the other. Returns the actions other than SendLlc each side saw.
fn pump(a: &mut LgrMachine, b: &mut LgrMachine, now: Instant) -> (Vec<LgrAction>, Vec<LgrAction>) {
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    loop {
        let mut moved = false;
        while let Some(x) = a.poll_action() {
            match x {
                LgrAction::SendLlc { msg: m, .. } => {
                    b.on_llc(&m, now);
                    moved = true;
                }
                o => ea.push(o),
            }
        }
        while let Some(x) = b.poll_action() {
            match x {
                LgrAction::SendLlc { msg: m, .. } => {
                    a.on_llc(&m, now);
                    moved = true;
                }
                o => eb.push(o),
            }
        }
        if !moved {
            return (ea, eb);
        }
    }
}

/// In memory, both ends: CONFIRM RKEY each way (A4.8), TEST LINK each way with the
/// replies matching (SMC-KA-1/2), then the server's linger ends the group and its
/// DELETE LINK (A) ends the client's at once (A4.9, SMC-TMO-14).
#[test]
fn server_and_client_machines_in_memory() {
    let now = t0();
    let mut s = machine(Role::Server, now);
    let mut c = machine(Role::Client, now);
    s.confirm_rkey(0x10, 0x1000, now).unwrap();
    c.confirm_rkey(0x20, 0x2000, now).unwrap();
    let (es, ec) = pump(&mut s, &mut c, now);
    assert_eq!(es, vec![LgrAction::RkeyConfirmed { rkey: 0x10, ok: true }]);
    assert_eq!(ec, vec![LgrAction::RkeyConfirmed { rkey: 0x20, ok: true }]);
    assert_eq!(c.peer_rkeys().get(&0x10), Some(&0x1000));
    assert_eq!(s.peer_rkeys().get(&0x20), Some(&0x2000));
    let t = now + KEEPALIVE;
    s.on_tick(t);
    c.on_tick(t);
    let (es, ec) = pump(&mut s, &mut c, t);
    assert!(es.is_empty() && ec.is_empty(), "{es:?} {ec:?}");
    assert_eq!((s.counters().test_links, c.counters().test_links), (1, 1));
    // Replies arrived: no timeout later.
    s.on_tick(t + LLC_WAIT);
    c.on_tick(t + LLC_WAIT);
    assert!(s.terminated().is_none() && c.terminated().is_none());
    // Last connections leave; the server lingers 10 s, the client 12 s.
    s.conn_removed(t);
    c.conn_removed(t);
    let t2 = t + Duration::from_secs(10);
    s.on_rx(t2);
    c.on_rx(t2);
    s.on_tick(t2);
    c.on_tick(t2);
    let (es, ec) = pump(&mut s, &mut c, t2);
    assert_eq!(es, vec![LgrAction::Terminate(TermReason::Idle)]);
    assert_eq!(
        ec,
        vec![LgrAction::Terminate(TermReason::PeerDeleted(delete_reason::PROGRAM))]
    );
}

/// Arbitrary input never panics and a terminated machine stays quiet.
#[test]
fn garbage_never_panics() {
    let now = t0();
    let mut seed = 0x1234_5678u32;
    for _ in 0..2000 {
        let mut m = machine(Role::Server, now);
        let mut b = [0u8; LLC_LEN];
        for x in &mut b {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            *x = (seed >> 16) as u8;
        }
        b[1] = 44;
        m.on_llc(&b, now);
        let _ = std::iter::from_fn(|| m.poll_action()).count();
        if m.terminated().is_some() {
            m.on_llc(&b, now);
            m.on_tick(now + Duration::from_secs(100));
            assert_eq!(m.poll_action(), None);
        }
    }
}

fn v2_machine(role: Role, now: Instant) -> LgrMachine {
    let cfg = LgrConfig {
        version: LlcVersion::V2,
        ..LgrConfig::new(role)
    };
    let mut m = LgrMachine::new(cfg, now);
    m.conn_added();
    m
}

fn sent_raw(m: &mut LgrMachine) -> Vec<[u8; LLC_LEN]> {
    let mut v = Vec::new();
    while let Some(a) = m.poll_action() {
        if let LgrAction::SendLlc { msg, .. } = a {
            v.push(msg);
        }
    }
    v
}

/// C5, SMC-FC-9 in a v2 group, golden vector from Linux 6.12 (lab capture
/// smc-r-2vm-612-br0.pcap): the server's 88-octet v2 ADD LINK (frame 15) is answered
/// exactly as Linux's client did (frame 17): the first 44 octets echoed, length 44,
/// flags reply|reject (0xC0), no reason nibble.
#[test]
fn v2_add_link_is_rejected_as_linux_does() {
    let now = t0();
    let mut m = v2_machine(Role::Client, now);
    let req = hex::decode(
        "22580000525400770002000000000000000000000000ffffc0a84d02000014020353f30e00000000000000008000\
         00000000000000000000ffffc0a84d0200000000000000000100000007ff000009d5ff25e247ff5b0000",
    )
    .unwrap();
    m.on_llc(&req, now);
    let out = sent_raw(&mut m);
    assert_eq!(out.len(), 1);
    assert_eq!(
        hex::encode(out[0]),
        "222c00c0525400770002000000000000000000000000ffffc0a84d02000014020353f30e0000000000000000"
    );
    assert!(m.terminated().is_none());
}

/// A v2 group stays at one link even when configured for two (SMCFAIL's second link is
/// for v1 groups): no ADD LINK of ours is ever due, and the peer's ADD LINK gets the v2
/// reject of `v2_add_link_is_rejected_as_linux_does`; the same config in a v1 group
/// asks for the second link (SMC-FC-8).
#[test]
fn v2_group_keeps_one_link_when_configured_for_two() {
    let now = t0();
    for role in [Role::Server, Role::Client] {
        let cfg = LgrConfig {
            version: LlcVersion::V2,
            max_links: 2,
            add_link_retry: Some(Duration::from_secs(1)),
            ..LgrConfig::new(role)
        };
        let mut m = LgrMachine::new(cfg, now);
        m.conn_added();
        assert_eq!(m.config().max_links, 1);
        m.on_tick(now + Duration::from_secs(5));
        let mut acts = Vec::new();
        while let Some(a) = m.poll_action() {
            acts.push(a);
        }
        assert!(
            !acts.iter().any(|a| matches!(a, LgrAction::AddLinkDue)),
            "{role:?}: {acts:?}"
        );
    }
    let mut m = LgrMachine::new(
        LgrConfig {
            version: LlcVersion::V2,
            max_links: 2,
            ..LgrConfig::new(Role::Client)
        },
        now,
    );
    m.conn_added();
    let req = hex::decode(
        "22580000525400770002000000000000000000000000ffffc0a84d02000014020353f30e00000000000000008000\
         00000000000000000000ffffc0a84d0200000000000000000100000007ff000009d5ff25e247ff5b0000",
    )
    .unwrap();
    m.on_llc(&req, now);
    let out = sent_raw(&mut m);
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0][..4], &[0x22, 0x2c, 0x00, 0xc0]);
    assert!(m.adding_link().is_none());
    let mut v1 = LgrMachine::new(
        LgrConfig {
            max_links: 2,
            add_link_retry: Some(Duration::from_secs(1)),
            ..LgrConfig::new(Role::Server)
        },
        now,
    );
    v1.conn_added();
    v1.on_tick(now);
    let mut due = false;
    while let Some(a) = v1.poll_action() {
        due |= matches!(a, LgrAction::AddLinkDue);
    }
    assert!(due, "a v1 server configured for two links asks for the second");
}

/// SMC-INV-9 in a v2 group, golden vectors from Linux 6.12 (lab capture frames 80 → 84):
/// DELETE RKEY of an RMB whose RToken came by CLC is answered positively with Linux's
/// octets (count kept, RKeys zeroed); an unknown RKey gives the negative reply with the
/// number of invalid RKeys (v2), not a bit mask.
#[test]
fn v2_delete_rkey_replies_as_linux_does() {
    let now = t0();
    let mut m = v2_machine(Role::Server, now);
    m.peer_rmb_known(1, 0x0395, 0x1000);
    let req = hex::decode("292c000001000000000003950000000000000000000000000000000000000000000000000000000000000000")
        .unwrap();
    m.on_llc(&req, now);
    let out = sent_raw(&mut m);
    assert_eq!(
        hex::encode(out[0]),
        "292c008001000000000000000000000000000000000000000000000000000000000000000000000000000000"
    );
    m.on_llc(&req, now); // now unknown
    let out = sent_raw(&mut m);
    assert_eq!(&out[0][..6], &[0x29, 0x2c, 0x00, 0xa0, 0x01, 0x01]);
    assert!(m.terminated().is_none());
}

/// A v2 group answers TEST LINK in the v2 form; a v1 message in it is a protocol error
/// (SMC-INV-11), as is a v2 one in a v1 group.
#[test]
fn llc_version_must_match_the_group() {
    let now = t0();
    let mut m = v2_machine(Role::Client, now);
    let mut t = LlcMessage::request(LlcBody::TestLink(TestLink { user_data: [5; 16] }));
    t.version = LlcVersion::V2;
    let mut b = [0u8; LLC_LEN];
    t.emit(&mut b).unwrap();
    m.on_llc(&b, now);
    let out = sent_raw(&mut m);
    assert_eq!(&out[0][..4], &[0x27, 0x2c, 0x00, 0x80]);
    m.on_llc(&llc(LlcBody::TestLink(TestLink { user_data: [5; 16] }), false), now);
    assert!(matches!(terminated(&mut m), Some(TermReason::ProtocolError(_))));
    let mut v1 = machine(Role::Client, now);
    v1.on_llc(&b, now);
    assert!(matches!(terminated(&mut v1), Some(TermReason::ProtocolError(_))));
}

/// A v2 group drops an out-of-flow CONFIRM LINK (request or reply) as Linux does; a v1
/// group keeps treating it as a protocol error (SMC-INV-11).
#[test]
fn v2_out_of_flow_confirm_link_is_dropped() {
    let now = t0();
    let cl = || {
        LlcBody::ConfirmLink(ConfirmLink {
            flags: 3,
            mac: [2; 6],
            gid: [1; 16],
            qpn: 17,
            link_num: 1,
            link_uid: [0, 0, 0, 1],
            max_links: 1,
            max_conns: 255,
        })
    };
    for reply in [false, true] {
        let mut m = v2_machine(Role::Client, now);
        let mut c = LlcMessage::request(cl());
        c.version = LlcVersion::V2;
        c.reply = reply;
        let mut b = [0u8; LLC_LEN];
        c.emit(&mut b).unwrap();
        m.on_llc(&b, now);
        assert!(sent_raw(&mut m).is_empty());
        assert!(m.terminated().is_none());
        assert_eq!(m.counters().discarded, 1);
    }
    let mut v1 = machine(Role::Client, now);
    v1.on_llc(&llc(cl(), false), now);
    assert!(matches!(terminated(&mut v1), Some(TermReason::ProtocolError(_))));
}
