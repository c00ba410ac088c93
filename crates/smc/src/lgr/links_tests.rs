//! The second link in memory: ADD LINK (+ CONTINUATION), CONFIRM LINK on the new link,
//! DELETE LINK of one link, failover and re-adding (requirements A2.5, A2.6, A2.13, A4.2
//! steps 12–16, A4.7, A4.8; SMC-RMB-6, SMC-FC-9, SMC-INV-2/5, SMC-TMO-6/9, SMC-LG-8/13/16,
//! SMC-FO-1).

use super::*;
use crate::wire::llc::{AddLinkCont, ConfirmRkey, DeleteLink, LlcBody, LlcMessage, add_link_reject, delete_reason};

fn cfg(role: Role) -> LgrConfig {
    LgrConfig {
        max_links: 2,
        add_link_retry: Some(Duration::from_secs(5)),
        ..LgrConfig::new(role)
    }
}

fn addr(qpn: u32, g: u8) -> LinkAddr {
    LinkAddr {
        mac: [2, 0, 0, 0, 0, g],
        gid: [g; 16],
        qpn,
        qp_mtu: 3,
        psn: 0x100 + qpn,
        link_uid: qpn.to_be_bytes(),
    }
}

/// Server and client machines wired in memory, one per side, with the engine's answers
/// scripted: the client accepts ADD LINK with `cli_pairs` (or rejects when None).
struct Pair {
    s: LgrMachine,
    c: LgrMachine,
    now: Instant,
    /// Every LLC delivered: (from server?, link, message).
    trace: Vec<(bool, u8, LlcMessage)>,
    /// Non-LLC actions seen: (server?, action).
    events: Vec<(bool, LgrAction)>,
    cli_pairs: Option<Vec<RtokenPair>>,
    /// Links whose messages are lost (a dead path).
    dead: Vec<u8>,
}

impl Pair {
    fn new(srv_rmbs: &[(u32, u64)], cli_rmbs: &[(u32, u64)]) -> Self {
        let now = Instant::now();
        let mut s = LgrMachine::new(cfg(Role::Server), now);
        let mut c = LgrMachine::new(cfg(Role::Client), now);
        s.conn_added();
        c.conn_added();
        // The RMBs each side learned on link 1 (CLC / CONFIRM RKEY).
        for &(k, v) in cli_rmbs {
            s.peer_rmb_known(1, k, v);
        }
        for &(k, v) in srv_rmbs {
            c.peer_rmb_known(1, k, v);
        }
        Self {
            s,
            c,
            now,
            trace: Vec::new(),
            events: Vec::new(),
            cli_pairs: Some(Vec::new()),
            dead: Vec::new(),
        }
    }

    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(a) = self.s.poll_action() {
                moved = true;
                match a {
                    LgrAction::SendLlc { link, msg } => {
                        if !self.dead.contains(&link) {
                            self.trace.push((true, link, LlcMessage::parse(&msg).unwrap()));
                            self.c.on_llc_on(link, &msg, self.now);
                        }
                    }
                    o => self.events.push((true, o)),
                }
            }
            while let Some(a) = self.c.poll_action() {
                moved = true;
                match a {
                    LgrAction::SendLlc { link, msg } => {
                        if !self.dead.contains(&link) {
                            self.trace.push((false, link, LlcMessage::parse(&msg).unwrap()));
                            self.s.on_llc_on(link, &msg, self.now);
                        }
                    }
                    LgrAction::AddLinkRequest { link, peer } => {
                        self.events.push((false, LgrAction::AddLinkRequest { link, peer }));
                        match self.cli_pairs.clone() {
                            Some(p) => self
                                .c
                                .cli_add_link_accept(addr(0x200 + u32::from(link), 4), p, self.now)
                                .unwrap(),
                            None => self.c.cli_add_link_reject(add_link_reject::NO_ALTERNATE_PATH),
                        }
                    }
                    o => self.events.push((false, o)),
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn tick(&mut self, d: Duration) {
        self.now += d;
        // Keep the keepalive quiet: the links carry traffic.
        self.s.on_rx(self.now);
        self.c.on_rx(self.now);
        self.s.on_tick(self.now);
        self.c.on_tick(self.now);
        self.pump();
    }

    fn take_events(&mut self) -> Vec<(bool, LgrAction)> {
        std::mem::take(&mut self.events)
    }

    /// The server adds a link with `pairs` and everything is delivered.
    fn add(&mut self, pairs: Vec<RtokenPair>) -> u8 {
        let n = self.s.srv_add_link(addr(0x100, 3), pairs, self.now).unwrap();
        self.pump();
        n
    }
}

/// One delivered LLC: (from the server?, link, opcode, reply?, continuation's (NumRTokens,
/// pairs)).
type Shape = (bool, u8, u8, bool, Option<(u8, usize)>);

fn pair(r: u32, nr: u32, va: u64) -> RtokenPair {
    RtokenPair {
        ref_rkey: r,
        new_rkey: nr,
        new_vaddr: va,
    }
}

/// SMC-RMB-6 / A4.8: a new link with 3 server RMBs (X, Y, Z) and 4 client RMBs (Q, R, S,
/// T): ADD LINK req/rsp → S CONT(3: X, Y) → C CONT R(4: Q, R) → S CONT(1: Z) → C CONT R(2:
/// S, T) → CONFIRM LINK on the new link, both ways → both sides have link 2 up and every
/// RMB's RToken on it; CONT and ADD LINK went on link 1, CONFIRM LINK on link 2 (SMC-LG-14).
#[test]
fn add_link_with_three_and_four_rmbs() {
    let srv = [(0x11, 0x1000), (0x12, 0x2000), (0x13, 0x3000)];
    let cli = [(0x21, 0xA000), (0x22, 0xB000), (0x23, 0xC000), (0x24, 0xD000)];
    let mut p = Pair::new(&srv, &cli);
    p.cli_pairs = Some(cli.iter().map(|&(k, v)| pair(k, k + 0x100, v + 1)).collect());
    // SMC-FC-8 / SMC-LG-13: the server is asked at once to add a link.
    p.tick(Duration::ZERO);
    assert!(p.take_events().contains(&(true, LgrAction::AddLinkDue)));
    let n = p.add(srv.iter().map(|&(k, v)| pair(k, k + 0x100, v + 1)).collect());
    assert_eq!(n, 2);
    let shape: Vec<Shape> = p
        .trace
        .iter()
        .map(|(from_s, link, m)| {
            let cont = match &m.body {
                LlcBody::AddLinkCont(c) => Some((c.num_rtokens, c.pairs.len())),
                _ => None,
            };
            (*from_s, *link, m.body.opcode(), m.reply, cont)
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (true, 1, 0x02, false, None),
            (false, 1, 0x02, true, None),
            (true, 1, 0x03, false, Some((3, 2))),
            (false, 1, 0x03, true, Some((4, 2))),
            (true, 1, 0x03, false, Some((1, 1))),
            (false, 1, 0x03, true, Some((2, 2))),
            (true, 2, 0x01, false, None),
            (false, 2, 0x01, true, None),
        ]
    );
    // The client's ADD LINK reply named its new QP; the server was told to connect to it.
    let ev = p.take_events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, (true, LgrAction::AddLinkPeer { link: 2, peer }) if peer.qpn == 0x202))
    );
    assert!(ev.contains(&(true, LgrAction::LinkUp { link: 2 })));
    assert!(ev.contains(&(false, LgrAction::LinkUp { link: 2 })));
    assert_eq!(p.s.links(), &[1, 2]);
    assert_eq!(p.c.links(), &[1, 2]);
    for &(k, v) in &cli {
        assert_eq!(p.s.peer_rtoken(1, k, 2), Some((k + 0x100, v + 1)));
    }
    for &(k, v) in &srv {
        assert_eq!(p.c.peer_rtoken(1, k, 2), Some((k + 0x100, v + 1)));
        assert_eq!(p.c.peer_rtoken(2, k + 0x100, 1), Some((k, v)));
    }
    assert_eq!(p.s.counters().links_added, 1);
    // At the maximum: no more AddLinkDue.
    p.tick(Duration::from_secs(30));
    assert!(!p.take_events().iter().any(|e| e.1 == LgrAction::AddLinkDue));
}

/// SMC-RMB-6 asymmetric counts: 0 server RMBs and 5 client RMBs, and 5 and 0: the side
/// with fewer tokens sends empty continuations until both are done.
#[test]
fn add_link_with_uneven_rtoken_counts() {
    for (ns, nc) in [(0u32, 5u32), (5, 0)] {
        let srv: Vec<(u32, u64)> = (0..ns).map(|i| (0x10 + i, u64::from(i) << 16)).collect();
        let cli: Vec<(u32, u64)> = (0..nc).map(|i| (0x40 + i, u64::from(i) << 20)).collect();
        let mut p = Pair::new(&srv, &cli);
        p.cli_pairs = Some(cli.iter().map(|&(k, v)| pair(k, k | 0x8000, v)).collect());
        p.add(srv.iter().map(|&(k, v)| pair(k, k | 0x8000, v)).collect());
        let conts: Vec<(bool, u8, usize)> = p
            .trace
            .iter()
            .filter_map(|(s, _, m)| match &m.body {
                LlcBody::AddLinkCont(c) => Some((*s, c.num_rtokens, c.pairs.len())),
                _ => None,
            })
            .collect();
        let expected = if ns == 0 {
            vec![
                (true, 0, 0),
                (false, 5, 2),
                (true, 0, 0),
                (false, 3, 2),
                (true, 0, 0),
                (false, 1, 1),
            ]
        } else {
            vec![
                (true, 5, 2),
                (false, 0, 0),
                (true, 3, 2),
                (false, 0, 0),
                (true, 1, 1),
                (false, 0, 0),
            ]
        };
        assert_eq!(conts, expected, "{ns}/{nc}");
        assert_eq!((p.s.links(), p.c.links()), (&[1u8, 2][..], &[1u8, 2][..]));
        for &(k, v) in &cli {
            assert_eq!(p.s.peer_rtoken(1, k, 2), Some((k | 0x8000, v)));
        }
        for &(k, v) in &srv {
            assert_eq!(p.c.peer_rtoken(1, k, 2), Some((k | 0x8000, v)));
        }
    }
}

/// SMC-FC-9 / SMC-LG-13: a client without an alternate path rejects with Z, reason 1; the
/// server frees the new link, keeps the group on link 1, and asks again after the retry
/// time. A one-link client (max links 1) answers the same by itself.
#[test]
fn rejected_add_link_is_retried_later() {
    let mut p = Pair::new(&[], &[]);
    p.cli_pairs = None;
    p.add(Vec::new());
    let ev = p.take_events();
    assert!(ev.contains(&(
        true,
        LgrAction::LinkFree {
            link: 2,
            why: TermReason::AddRejected(add_link_reject::NO_ALTERNATE_PATH)
        }
    )));
    assert_eq!(p.s.links(), &[1]);
    assert!(p.s.terminated().is_none() && p.c.terminated().is_none());
    p.tick(Duration::from_secs(4));
    assert!(!p.take_events().iter().any(|e| e.1 == LgrAction::AddLinkDue));
    p.tick(Duration::from_secs(1));
    assert!(p.take_events().contains(&(true, LgrAction::AddLinkDue)));
    // Now the client has its second device: the retry works, with a new link number.
    p.cli_pairs = Some(Vec::new());
    assert_eq!(p.add(Vec::new()), 3);
    assert_eq!(p.c.links(), &[1, 3]);

    let now = Instant::now();
    let mut one = LgrMachine::new(LgrConfig::new(Role::Client), now);
    let a = AddLink {
        link_num: 2,
        qp_mtu: 3,
        ..AddLink::default()
    };
    one.on_llc(&msg(LlcBody::AddLink(a), false), now);
    let LgrAction::SendLlc { link: 1, msg: b } = one.poll_action().unwrap() else {
        panic!()
    };
    let LlcBody::AddLink(r) = LlcMessage::parse(&b).unwrap().body else {
        panic!()
    };
    assert!(r.reject && r.reject_reason == add_link_reject::NO_ALTERNATE_PATH);
}

fn msg(body: LlcBody, reply: bool) -> [u8; LLC_LEN] {
    let mut m = LlcMessage::request(body);
    m.reply = reply;
    let mut b = [0u8; LLC_LEN];
    m.emit(&mut b).unwrap();
    b
}

fn client_in_exchange(now: Instant) -> LgrMachine {
    let mut c = LgrMachine::new(cfg(Role::Client), now);
    c.conn_added();
    c.peer_rmb_known(1, 0x11, 0x1000);
    let a = AddLink {
        link_num: 2,
        qp_mtu: 3,
        qpn: 0x99,
        ..AddLink::default()
    };
    c.on_llc(&msg(LlcBody::AddLink(a), false), now);
    while c.poll_action().is_some() {}
    c.cli_add_link_accept(addr(0x300, 4), vec![pair(0x21, 0x31, 0x5000)], now)
        .unwrap();
    while c.poll_action().is_some() {}
    c
}

fn ends_with_protocol_error(m: &mut LgrMachine) -> bool {
    let acts: Vec<LgrAction> = std::iter::from_fn(|| m.poll_action()).collect();
    let deleted = acts.iter().any(|a| match a {
        LgrAction::SendLlc { msg, .. } => matches!(
            LlcMessage::parse(msg).unwrap().body,
            LlcBody::DeleteLink(DeleteLink {
                all: true,
                reason: delete_reason::PROTOCOL_VIOLATION,
                ..
            })
        ),
        _ => false,
    });
    deleted && matches!(acts.last(), Some(LgrAction::Terminate(TermReason::ProtocolError(_))))
}

/// SMC-INV-5 / A2.15 (scripted misbehaving server): ADD LINK CONTINUATION with a reference
/// RKey that names no RMB of ours, with a pair count that does not match NumRTokens, with
/// a NumRTokens that does not count down, for another link, or with no exchange running →
/// protocol error: DELETE LINK (A, protocol violation), the group ends.
#[test]
fn bad_rtokens_in_add_link_continuation() {
    let now = Instant::now();
    let bad = [
        // Unknown reference RKey.
        vec![AddLinkCont {
            link_num: 2,
            num_rtokens: 1,
            pairs: vec![pair(0x77, 1, 2)],
        }],
        // NumRTokens 3 but one pair.
        vec![AddLinkCont {
            link_num: 2,
            num_rtokens: 3,
            pairs: vec![pair(0x11, 1, 2)],
        }],
        // Wrong link.
        vec![AddLinkCont {
            link_num: 5,
            num_rtokens: 1,
            pairs: vec![pair(0x11, 1, 2)],
        }],
        // Does not count down: 3 (2 pairs) then 3 again.
        vec![
            AddLinkCont {
                link_num: 2,
                num_rtokens: 3,
                pairs: vec![pair(0x11, 1, 2), pair(0x11, 1, 2)],
            },
            AddLinkCont {
                link_num: 2,
                num_rtokens: 3,
                pairs: vec![pair(0x11, 1, 2), pair(0x11, 1, 2)],
            },
        ],
    ];
    for (i, seq) in bad.iter().enumerate() {
        let mut c = client_in_exchange(now);
        let last = seq.len() - 1;
        for (j, m) in seq.iter().enumerate() {
            c.on_llc_on(1, &cont_bytes(m), now);
            if j < last {
                assert!(c.terminated().is_none(), "case {i}");
                while c.poll_action().is_some() {}
            }
        }
        assert!(ends_with_protocol_error(&mut c), "case {i}");
    }
    // Outside any exchange.
    let mut c = LgrMachine::new(cfg(Role::Client), now);
    c.on_llc(
        &msg(
            LlcBody::AddLinkCont(AddLinkCont {
                link_num: 2,
                num_rtokens: 0,
                pairs: vec![],
            }),
            false,
        ),
        now,
    );
    assert!(ends_with_protocol_error(&mut c));
}

/// An ADD LINK CONTINUATION as a misbehaving peer sends it: NumRTokens as given even when
/// it does not match the pairs (our emitter refuses that).
fn cont_bytes(c: &AddLinkCont) -> [u8; LLC_LEN] {
    let fixed = AddLinkCont {
        num_rtokens: c.pairs.len() as u8,
        ..c.clone()
    };
    let mut b = msg(LlcBody::AddLinkCont(fixed), false);
    b[5] = c.num_rtokens;
    b
}

/// SMC-INV-2: ADD LINK with an undefined MTU → negative reply, reason 2; the group goes on.
/// An ADD LINK for a link number in use → protocol error (SMC-INV-11).
#[test]
fn add_link_with_bad_mtu_or_used_number() {
    let now = Instant::now();
    let mut c = LgrMachine::new(cfg(Role::Client), now);
    let a = AddLink {
        link_num: 2,
        qp_mtu: 7,
        ..AddLink::default()
    };
    c.on_llc(&msg(LlcBody::AddLink(a), false), now);
    let LgrAction::SendLlc { msg: b, .. } = c.poll_action().unwrap() else {
        panic!()
    };
    let LlcBody::AddLink(r) = LlcMessage::parse(&b).unwrap().body else {
        panic!()
    };
    assert!(r.reject && r.reject_reason == add_link_reject::INVALID_MTU);
    assert!(c.terminated().is_none() && c.adding_link().is_none());
    let used = AddLink {
        link_num: 1,
        qp_mtu: 3,
        ..AddLink::default()
    };
    c.on_llc(&msg(LlcBody::AddLink(used), false), now);
    assert!(ends_with_protocol_error(&mut c));
}

/// SMC-TMO-9 (scripted: the client's CONFIRM LINK never comes over the new path): the
/// server sends DELETE LINK for the new link over link 1 after the LLC wait, both free it,
/// the group goes on over link 1; the retry later adds the link once the path works.
#[test]
fn confirm_link_timeout_deletes_the_new_link_and_retries() {
    let mut p = Pair::new(&[(0x11, 0x1000)], &[(0x21, 0x2000)]);
    p.cli_pairs = Some(vec![pair(0x21, 0x31, 0x2000)]);
    p.dead = vec![2];
    p.add(vec![pair(0x11, 0x41, 0x1000)]);
    assert_eq!(p.s.adding_link(), Some(2));
    p.take_events();
    p.tick(LLC_WAIT - Duration::from_millis(1));
    assert!(p.take_events().is_empty());
    p.tick(Duration::from_millis(1));
    let ev = p.take_events();
    assert!(ev.contains(&(
        true,
        LgrAction::LinkFree {
            link: 2,
            why: TermReason::LlcTimeout("CONFIRM LINK")
        }
    )));
    assert!(
        ev.iter()
            .any(|e| matches!(e, (false, LgrAction::LinkFree { link: 2, .. })))
    );
    let del = p.trace.iter().rev().find(|(s, _, _)| *s).unwrap();
    assert_eq!(del.1, 1);
    assert!(matches!(
        del.2.body,
        LlcBody::DeleteLink(DeleteLink {
            all: false,
            link_num: 2,
            ..
        })
    ));
    assert_eq!((p.s.links(), p.c.links()), (&[1u8][..], &[1u8][..]));
    assert!(p.s.terminated().is_none() && p.c.terminated().is_none());
    // The path comes back; the retry adds link 3.
    p.dead.clear();
    p.tick(Duration::from_secs(5));
    assert!(p.take_events().contains(&(true, LgrAction::AddLinkDue)));
    assert_eq!(p.add(vec![pair(0x11, 0x51, 0x1000)]), 3);
    assert_eq!((p.s.links(), p.c.links()), (&[1u8, 3][..], &[1u8, 3][..]));
    assert_eq!(p.c.peer_rtoken(1, 0x11, 3), Some((0x51, 0x1000)));
}

/// SMC-TMO-6: an unanswered ADD LINK frees the new link and counts as a failure of the
/// carrying link: with one link, the group ends.
#[test]
fn unanswered_add_link_fails_the_carrier() {
    let mut p = Pair::new(&[], &[]);
    p.dead = vec![1];
    p.add(Vec::new());
    p.tick(LLC_WAIT);
    let ev = p.take_events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, (true, LgrAction::LinkFree { link: 2, .. })))
    );
    assert!(ev.contains(&(true, LgrAction::Terminate(TermReason::LlcTimeout("ADD LINK")))));
}

fn two_links() -> Pair {
    let mut p = Pair::new(&[(0x11, 0x1000)], &[(0x21, 0x2000)]);
    p.cli_pairs = Some(vec![pair(0x21, 0x31, 0x2000)]);
    p.add(vec![pair(0x11, 0x41, 0x1000)]);
    p.take_events();
    p.trace.clear();
    assert_eq!((p.s.links(), p.c.links()), (&[1u8, 2][..], &[1u8, 2][..]));
    p
}

/// SMC-FO-1 / A4.7, server detects: link 1 fails → failover to link 2 at once, DELETE
/// LINK (link 1, lost path) over link 2, the client answers and moves too, the server frees
/// link 1 on the reply; later a link is re-added with a new number (A4.7 step 8, SMC-LG-8).
#[test]
fn server_detected_failure_fails_over_then_readds() {
    let mut p = two_links();
    p.dead = vec![1];
    p.s.link_failed(1, "completion RetryExc".into(), p.now);
    p.pump();
    let ev = p.take_events();
    assert_eq!(
        ev,
        vec![
            (true, LgrAction::LinkFailed { failed: 1, to: 2 }),
            (false, LgrAction::LinkFailed { failed: 1, to: 2 }),
            (
                false,
                LgrAction::LinkFree {
                    link: 1,
                    why: TermReason::PeerDeleted(delete_reason::LOST_PATH)
                }
            ),
            (
                true,
                LgrAction::LinkFree {
                    link: 1,
                    why: TermReason::LinkError("completion RetryExc".into())
                }
            ),
        ]
    );
    let msgs: Vec<(bool, u8, bool)> = p.trace.iter().map(|(s, l, m)| (*s, *l, m.reply)).collect();
    assert_eq!(msgs, vec![(true, 2, false), (false, 2, true)]);
    assert_eq!((p.s.links(), p.c.links()), (&[2u8][..], &[2u8][..]));
    assert_eq!(p.s.counters().failovers, 1);
    // Re-added after the retry time, as link 3, RTokens referenced on link 2 (the
    // carrier now) by both sides.
    p.cli_pairs = Some(vec![pair(0x31, 0x71, 0x2000)]);
    p.dead.clear();
    p.tick(Duration::from_secs(5));
    assert!(p.take_events().contains(&(true, LgrAction::AddLinkDue)));
    let n =
        p.s.srv_add_link(addr(0x500, 3), vec![pair(0x41, 0x61, 0x1000)], p.now)
            .unwrap();
    p.pump();
    assert_eq!(n, 3);
    assert_eq!((p.s.links(), p.c.links()), (&[2u8, 3][..], &[2u8, 3][..]));
    assert_eq!(p.c.peer_rtoken(2, 0x41, 3), Some((0x61, 0x1000)));
    assert_eq!(p.s.peer_rtoken(2, 0x31, 3), Some((0x71, 0x2000)));
}

/// SMC-LG-11 / A4.7 (client detects): the client moves its connections, notifies with
/// DELETE LINK over the survivor and frees the link; the server runs its own DELETE LINK,
/// which the client answers positively.
#[test]
fn client_detected_failure_notifies_the_server() {
    let mut p = two_links();
    p.dead = vec![2];
    p.c.link_failed(2, "device down".into(), p.now);
    p.pump();
    let ev = p.take_events();
    assert!(ev.contains(&(false, LgrAction::LinkFailed { failed: 2, to: 1 })));
    assert!(ev.contains(&(true, LgrAction::LinkFailed { failed: 2, to: 1 })));
    assert!(
        ev.iter()
            .any(|e| matches!(e, (true, LgrAction::LinkFree { link: 2, .. })))
    );
    let msgs: Vec<(bool, u8, bool, u8)> = p
        .trace
        .iter()
        .map(|(s, l, m)| {
            let LlcBody::DeleteLink(d) = &m.body else {
                panic!("{m:?}")
            };
            (*s, *l, m.reply, d.link_num)
        })
        .collect();
    assert_eq!(
        msgs,
        vec![(false, 1, false, 2), (true, 1, false, 2), (false, 1, true, 2)]
    );
    assert!(p.s.terminated().is_none() && p.c.terminated().is_none());
    // Last link failing ends the group (SMC-ABT-6, A4.7 step 9).
    p.s.link_failed(1, "device down".into(), p.now);
    assert!(matches!(
        std::iter::from_fn(|| p.s.poll_action()).last(),
        Some(LgrAction::Terminate(TermReason::LinkError(_)))
    ));
}

/// SMC-KA-1 with two links: an unanswered TEST LINK fails that link over to the other
/// instead of ending the group.
#[test]
fn test_link_timeout_with_two_links_fails_over() {
    let mut p = two_links();
    p.dead = vec![1];
    p.now += KEEPALIVE;
    p.s.on_tick(p.now);
    p.pump();
    p.now += LLC_WAIT;
    p.s.on_tick(p.now);
    p.pump();
    let ev = p.take_events();
    assert!(
        ev.contains(&(true, LgrAction::LinkFailed { failed: 1, to: 2 })),
        "{ev:?}"
    );
    assert!(p.s.terminated().is_none());
}

/// SMC-LG-16: a client's CONFIRM RKEY during ADD LINK gets a negative reply with C; our
/// own CONFIRM RKEY waits (Busy) until the exchange ends.
#[test]
fn confirm_rkey_collides_with_add_link() {
    let now = Instant::now();
    let mut s = LgrMachine::new(cfg(Role::Server), now);
    s.srv_add_link(addr(0x100, 3), Vec::new(), now).unwrap();
    while s.poll_action().is_some() {}
    assert_eq!(s.confirm_rkey(0x5, 0, now), Err(Busy));
    s.on_llc(
        &msg(
            LlcBody::ConfirmRkey(ConfirmRkey {
                rkey: 0x77,
                vaddr: 0x1000,
                ..ConfirmRkey::default()
            }),
            false,
        ),
        now,
    );
    let LgrAction::SendLlc { msg: b, .. } = s.poll_action().unwrap() else {
        panic!()
    };
    let m = LlcMessage::parse(&b).unwrap();
    let LlcBody::ConfirmRkey(r) = m.body else { panic!() };
    assert!(m.reply && r.negative && r.retry && r.rkey == 0x77);
    assert!(s.peer_rkeys().is_empty());
}

/// SMC-LG-8: 300 add/delete cycles: link numbers are never 0, never one in use, and only
/// come back after the 1-octet space wraps.
#[test]
fn link_numbers_are_unique_and_wrap() {
    let mut p = two_links();
    let mut seen = vec![2u8];
    for _ in 0..300 {
        let old = *p.s.links().iter().max().unwrap();
        let keep = *p.s.links().iter().min().unwrap();
        p.s.link_failed(old, "cycle".into(), p.now);
        p.pump();
        p.take_events();
        let n = p.add(Vec::new());
        p.take_events();
        assert!(n != 0 && n != keep, "{n} {keep}");
        seen.push(n);
        assert_eq!(p.c.links().len(), 2);
    }
    // 2, 3, …, 255, then 1 is in use → skipped, 2 again.
    assert_eq!(&seen[..3], &[2, 3, 4]);
    let first_repeat = seen.iter().skip(1).position(|&n| n == 2).unwrap() + 1;
    assert_eq!(first_repeat, 254);
}
