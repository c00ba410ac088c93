//! Two connection machines wired together in memory: RDMA Writes copy octets of one side's
//! send stream into the other side's element, CDCs are delivered (immediately or when a test
//! says), and every CDC field and element octet is checked.
//!
//! Requirements: smcr-ipoibcm.md A4.4 (worked example, exact numbers), A2.8 (SMC-CDC-*),
//! A2.9 (SMC-URG-*), A2.10 (SMC-CLS-*), A2.11 (SMC-ABT-*), A2.15 (forged cursors), E-23.

use proptest::prelude::*;
use smc::conn::{AbortReason, Action, CdcOutcome, CloseState, Conn, ConnError, ConnParams, ProtocolError, UrgentError};
use smc::wire::cdc::{Cdc, ConnStateFlags as Cs, ProducerFlags as Pf};
use smc::wire::cursor::{Cursor, EyecatcherMode, Rmbe};
use std::collections::VecDeque;

const TOKEN_A: u32 = 0xA0A0_0001;
const TOKEN_B: u32 = 0xB0B0_0001;

struct Side {
    conn: Conn,
    /// Every octet the application wrote, indexed by stream offset.
    stream: Vec<u8>,
    /// The local element (the peer writes into it).
    elem: Vec<u8>,
    /// CDCs on their way to this side.
    inbox: VecDeque<Cdc>,
    /// Octets the application read.
    got: Vec<u8>,
    /// CDCs this side sent, in order.
    sent: Vec<Cdc>,
    /// Lengths and offsets of the RDMA Writes this side issued.
    writes: Vec<(u32, u32)>,
    resets: usize,
    released: usize,
}

fn side(local_token: u32, peer_token: u32, local: Rmbe, peer: Rmbe, send_buf: u32) -> Side {
    let mut elem = vec![0u8; local.len() as usize];
    if local.mode() == EyecatcherMode::Rfc {
        elem[..4].copy_from_slice(b"SMCR");
    }
    Side {
        conn: Conn::new(ConnParams {
            local_token,
            peer_token,
            local_rmbe: local,
            peer_rmbe: peer,
            send_buf,
        }),
        stream: Vec::new(),
        elem,
        inbox: VecDeque::new(),
        got: Vec::new(),
        sent: Vec::new(),
        writes: Vec::new(),
        resets: 0,
        released: 0,
    }
}

fn pair(mode: EyecatcherMode, len: u32, send_buf: u32) -> (Side, Side) {
    let e = Rmbe::new(len, mode).unwrap();
    (
        side(TOKEN_A, TOKEN_B, e, e, send_buf),
        side(TOKEN_B, TOKEN_A, e, e, send_buf),
    )
}

/// Carries out `from`'s actions: writes land in `to.elem`, CDCs go to `to.inbox`.
/// Completions of the writes are reported back at once.
fn run_actions(from: &mut Side, to: &mut Side) {
    loop {
        let mut completed = 0;
        let mut any = false;
        while let Some(a) = from.conn.poll_action() {
            any = true;
            match a {
                Action::RdmaWrite { src, remote_off, len } => {
                    let s = src as usize;
                    let o = remote_off as usize;
                    to.elem[o..o + len as usize].copy_from_slice(&from.stream[s..s + len as usize]);
                    from.writes.push((remote_off, len));
                    completed += u64::from(len);
                }
                Action::SendCdc(m) => {
                    // Through the wire format, as on a real QP.
                    let m2 = Cdc::parse(&m.to_bytes()).unwrap();
                    from.sent.push(m2);
                    to.inbox.push_back(m2);
                }
                Action::TcpReset => from.resets += 1,
                Action::ReleaseElement => from.released += 1,
            }
        }
        if completed > 0 {
            from.conn.writes_completed(completed);
        }
        if !any {
            break;
        }
    }
}

/// Delivers everything queued both ways until nothing moves.
fn settle(a: &mut Side, b: &mut Side) {
    for _ in 0..10_000 {
        run_actions(a, b);
        run_actions(b, a);
        if a.inbox.is_empty() && b.inbox.is_empty() {
            return;
        }
        while let Some(m) = b.inbox.pop_front() {
            b.conn.on_cdc(&m);
        }
        while let Some(m) = a.inbox.pop_front() {
            a.conn.on_cdc(&m);
        }
    }
    panic!("did not settle");
}

fn app_write(s: &mut Side, data: &[u8]) -> u64 {
    let n = s.conn.write(data.len() as u64).unwrap();
    s.stream.extend_from_slice(&data[..n as usize]);
    n
}

fn app_read(s: &mut Side, max: u64) -> u64 {
    let (a, b) = s.conn.read_spans(max);
    for sp in [Some(a), b].into_iter().flatten() {
        let o = sp.off as usize;
        s.got.extend_from_slice(&s.elem[o..o + sp.len as usize]);
    }
    let n = u64::from(a.len) + b.map_or(0, |x| u64::from(x.len));
    s.conn.consume(n).unwrap();
    n
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A4.4 driven end to end with exact CDC fields and element contents (SMC-CDC-5..8, E-22/23).
fn a4_4(mode: EyecatcherMode) {
    let (mut a, mut b) = pair(mode, 16_384, 65_536);
    let base = mode.base();
    let data = pattern(7, 42_000);
    // Step 1.
    assert_eq!(app_write(&mut a, &data[..10_000]), 10_000);
    run_actions(&mut a, &mut b);
    assert_eq!(a.writes, vec![(base, 10_000)]);
    assert_eq!(a.sent.len(), 1);
    let cdc1 = a.sent[0];
    assert_eq!(cdc1.seq, 1);
    assert_eq!(cdc1.token, TOKEN_B);
    assert_eq!(cdc1.prod, Cursor::new(0, base + 10_000));
    assert_eq!(cdc1.cons, Cursor::new(0, base));
    assert_eq!(cdc1.prod_flags, Pf::empty());
    assert_eq!(&b.elem[base as usize..base as usize + 10_000], &data[..10_000]);
    // Step 2: B reads all; window as A sees it is 6 384 (< ½) and the gain ≥ 10 % → update.
    assert_eq!(b.conn.on_cdc(&b.inbox.pop_front().unwrap()), CdcOutcome::Applied);
    assert_eq!(b.conn.readable(), 10_000);
    assert_eq!(app_read(&mut b, u64::MAX), 10_000);
    run_actions(&mut b, &mut a);
    assert_eq!(b.sent.len(), 1);
    assert_eq!(b.sent[0].seq, 1);
    assert_eq!(b.sent[0].token, TOKEN_A);
    assert_eq!(b.sent[0].cons, Cursor::new(0, base + 10_000));
    assert_eq!(a.conn.on_cdc(&a.inbox.pop_front().unwrap()), CdcOutcome::Applied);
    // Step 3: 12 000 octets, the remote range wraps → two writes, then CDC#2.
    assert_eq!(app_write(&mut a, &data[10_000..22_000]), 12_000);
    run_actions(&mut a, &mut b);
    let cap = 16_384 - base;
    let first = cap - 10_000;
    assert_eq!(a.writes[1..], [(base + 10_000, first), (base, 12_000 - first)]);
    let cdc2 = a.sent[1];
    assert_eq!(cdc2.seq, 2);
    assert_eq!(cdc2.prod, Cursor::new(1, base + 12_000 - first));
    if mode == EyecatcherMode::None {
        assert_eq!(cdc2.prod, Cursor::new(1, 5_616));
    } else {
        assert_eq!(cdc2.prod, Cursor::new(1, 5_624));
        assert_eq!(&b.elem[..4], b"SMCR", "the eyecatcher is never overwritten");
    }
    // Step 4: B reads 12 000 across the wrap; consumer mirrors the wrap.
    b.conn.on_cdc(&b.inbox.pop_front().unwrap());
    assert_eq!(b.conn.readable(), 12_000);
    app_read(&mut b, u64::MAX);
    assert_eq!(b.conn.consumer(), cdc2.prod);
    run_actions(&mut b, &mut a);
    assert_eq!(b.sent.len(), 2, "window 4 384 < ½ → update");
    assert_eq!(b.sent[1].cons, cdc2.prod);
    a.conn.on_cdc(&a.inbox.pop_front().unwrap());
    // Step 5: 20 000 octets, a full window goes, the rest waits; CDC#3 has B.
    assert_eq!(app_write(&mut a, &data[22_000..42_000]), 20_000);
    run_actions(&mut a, &mut b);
    let cdc3 = a.sent[2];
    assert_eq!(cdc3.seq, 3);
    assert_eq!(cdc3.prod, Cursor::new(2, cdc2.prod.count));
    assert_eq!(cdc3.prod_flags, Pf::WRITE_BLOCKED);
    assert_eq!(
        a.conn.unsent(),
        20_000 - u64::from(cap),
        "queued, the written part completed"
    );
    // Step 6: equal offsets, different wrap → a full element; B was set → update at once.
    b.conn.on_cdc(&b.inbox.pop_front().unwrap());
    assert_eq!(b.conn.readable(), u64::from(cap));
    app_read(&mut b, u64::MAX);
    run_actions(&mut b, &mut a);
    assert_eq!(b.sent.len(), 3);
    assert_eq!(b.sent[2].cons, cdc3.prod);
    // Step 7: the rest, B cleared → CDC#4.
    a.conn.on_cdc(&a.inbox.pop_front().unwrap());
    run_actions(&mut a, &mut b);
    let cdc4 = a.sent[3];
    assert_eq!(cdc4.seq, 4);
    let rest = 20_000 - cap;
    assert_eq!(cdc4.prod, Cursor::new(2, cdc2.prod.count + rest));
    if mode == EyecatcherMode::None {
        assert_eq!(cdc4.prod, Cursor::new(2, 9_232));
    }
    assert_eq!(cdc4.prod_flags, Pf::empty());
    b.conn.on_cdc(&b.inbox.pop_front().unwrap());
    app_read(&mut b, u64::MAX);
    run_actions(&mut b, &mut a);
    assert_eq!(b.sent.len(), 3, "window ≥ ½ after the last read → no standalone update");
    assert_eq!(b.got, data, "every octet arrived in order");
}

#[test]
fn a4_4_worked_example_linux_mode() {
    a4_4(EyecatcherMode::None);
}

#[test]
fn a4_4_worked_example_rfc_mode() {
    a4_4(EyecatcherMode::Rfc);
}

// E-23 / SMC-CDC-7: standalone update iff window < ½ and gain ≥ 10 %.
#[test]
fn window_update_rule() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 10_000, 65_536);
    let d = pattern(1, 10_000);
    app_write(&mut a, &d[..4_000]);
    settle(&mut a, &mut b);
    // Window as A sees it 6 000 ≥ 5 000: reading gives no update.
    app_read(&mut b, 4_000);
    run_actions(&mut b, &mut a);
    assert!(b.sent.is_empty(), "window ≥ ½ → no update");
    app_write(&mut a, &d[4_000..6_000]);
    settle(&mut a, &mut b);
    // Seen producer 6 000, last sent consumer 0 → window 4 000 < ½; gain so far 4 000.
    // Read 500 more → gain 4 500 ≥ 1 000 → update.
    app_read(&mut b, 500);
    run_actions(&mut b, &mut a);
    assert_eq!(b.sent.len(), 1);
    assert_eq!(b.sent[0].cons, Cursor::new(0, 4_500));
    a.inbox.clear();
    // Now window = 10 000 − (6 000 − 4 500) = 8 500; reads give no update.
    app_read(&mut b, u64::MAX);
    run_actions(&mut b, &mut a);
    assert_eq!(b.sent.len(), 1);
    // Window < ½ but gain < 10 %: 9 800 written, update only after ≥ 1 000 consumed.
    let mut a2 = pair(EyecatcherMode::None, 10_000, 65_536);
    app_write(&mut a2.0, &d[..9_800]);
    settle(&mut a2.0, &mut a2.1);
    app_read(&mut a2.1, 999);
    run_actions(&mut a2.1, &mut a2.0);
    assert!(a2.1.sent.is_empty(), "gain 999 < 10 %");
    app_read(&mut a2.1, 1);
    run_actions(&mut a2.1, &mut a2.0);
    assert_eq!(a2.1.sent.len(), 1, "gain 1 000 ≥ 10 %");
}

// SMC-CDC-9: R set by the peer → immediate updates on consumption.
#[test]
fn update_requested_flag_forces_updates() {
    let (_, mut b) = pair(EyecatcherMode::None, 10_000, 65_536);
    let m = Cdc {
        seq: 1,
        token: TOKEN_B,
        prod: Cursor::new(0, 100),
        prod_flags: Pf::CONS_UPDATE_REQUESTED,
        ..Cdc::default()
    };
    assert_eq!(b.conn.on_cdc(&m), CdcOutcome::Applied);
    b.conn.consume(1).unwrap();
    assert!(matches!(b.conn.poll_action(), Some(Action::SendCdc(c)) if c.cons == Cursor::new(0, 1)));
    b.conn.consume(1).unwrap();
    assert!(matches!(b.conn.poll_action(), Some(Action::SendCdc(c)) if c.cons == Cursor::new(0, 2)));
}

// SMC-CDC-2 and SMC-CDC-11: stale sequence numbers and foreign tokens have no effect;
// 65535 → 0 is accepted.
#[test]
fn stale_and_foreign_cdcs_are_dropped() {
    let (_, mut b) = pair(EyecatcherMode::None, 10_000, 65_536);
    let mk = |seq, count| Cdc {
        seq,
        token: TOKEN_B,
        prod: Cursor::new(0, count),
        ..Cdc::default()
    };
    assert_eq!(b.conn.on_cdc(&mk(65_535, 10)), CdcOutcome::Applied);
    assert_eq!(b.conn.on_cdc(&mk(0, 20)), CdcOutcome::Applied);
    assert_eq!(b.conn.readable(), 20);
    assert_eq!(b.conn.on_cdc(&mk(65_534, 5)), CdcOutcome::Stale);
    assert_eq!(b.conn.readable(), 20);
    let foreign = Cdc {
        token: 0xDEAD_BEEF,
        ..mk(1, 9_000)
    };
    assert_eq!(b.conn.on_cdc(&foreign), CdcOutcome::WrongToken);
    assert_eq!(b.conn.wrong_tokens(), 1);
    assert_eq!(b.conn.readable(), 20);
    assert_eq!(b.conn.state(), CloseState::Active);
}

// A2.15 / SMC-CDC-12: forged cursors abort the connection (A + RST), never panic, and
// nothing of the forged CDC is applied.
#[test]
fn forged_cursors_abort() {
    let cases: [(Cdc, ProtocolError); 7] = [
        (
            Cdc {
                prod: Cursor::new(0, 10_000),
                ..Cdc::default()
            },
            ProtocolError::ProducerOutOfRange,
        ),
        (
            Cdc {
                cons: Cursor::new(0, 20_000),
                ..Cdc::default()
            },
            ProtocolError::ConsumerOutOfRange,
        ),
        (
            Cdc {
                prod: Cursor::new(1, 1),
                ..Cdc::default()
            },
            ProtocolError::ProducerOverrun,
        ),
        (
            Cdc {
                prod: Cursor::new(0, 50),
                ..Cdc::default()
            },
            ProtocolError::ProducerRegressed,
        ),
        (
            Cdc {
                prod: Cursor::new(0, 100),
                cons: Cursor::new(0, 1),
                ..Cdc::default()
            },
            ProtocolError::ConsumerAhead,
        ),
        (
            Cdc {
                prod: Cursor::new(65_535, 9_000),
                ..Cdc::default()
            },
            ProtocolError::ProducerRegressed,
        ),
        (
            Cdc {
                prod: Cursor::new(0, 200),
                conn_flags: Cs::DONE_WRITING,
                ..Cdc::default()
            },
            ProtocolError::DataAfterDone,
        ),
    ];
    for (i, (forged, want)) in cases.into_iter().enumerate() {
        let (_, mut b) = pair(EyecatcherMode::None, 10_000, 65_536);
        let ok = Cdc {
            seq: 1,
            token: TOKEN_B,
            prod: Cursor::new(0, 100),
            ..Cdc::default()
        };
        assert_eq!(b.conn.on_cdc(&ok), CdcOutcome::Applied);
        if want == ProtocolError::DataAfterDone {
            let d = Cdc {
                seq: 2,
                conn_flags: Cs::DONE_WRITING,
                ..ok
            };
            assert_eq!(b.conn.on_cdc(&d), CdcOutcome::Applied);
        }
        let f = Cdc {
            seq: 3,
            token: TOKEN_B,
            ..forged
        };
        assert_eq!(b.conn.on_cdc(&f), CdcOutcome::Aborted(want), "case {i}");
        assert_eq!(b.conn.abort_reason(), Some(AbortReason::Protocol(want)));
        assert_eq!(b.conn.state(), CloseState::PeerAbortWait);
        assert_eq!(b.conn.readable(), 0);
        let acts: Vec<_> = std::iter::from_fn(|| b.conn.poll_action()).collect();
        assert!(matches!(acts[0], Action::SendCdc(c) if c.conn_flags.contains(Cs::ABORT)));
        assert_eq!(acts[1], Action::TcpReset);
        assert_eq!(b.conn.write(1), Err(ConnError::Aborted(AbortReason::Protocol(want))));
    }
}

// SMC-URG-1, -3, -4, -5 (A4.5 open window): urgent write → CDC(P,U) with p one past it;
// the writer holds data until the consumer passes the mark; then P/U clear.
#[test]
fn urgent_data_open_window() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 16_384, 65_536);
    let d = pattern(3, 2_500);
    app_write(&mut a, &d[..1_000]);
    settle(&mut a, &mut b);
    app_read(&mut b, u64::MAX);
    let n = a.conn.write_urgent(500).unwrap();
    a.stream.extend_from_slice(&d[1_000..1_000 + n as usize]);
    app_write(&mut a, &d[1_500..]);
    run_actions(&mut a, &mut b);
    let urg = *a.sent.last().unwrap();
    assert_eq!(urg.prod, Cursor::new(0, 1_500));
    assert_eq!(
        urg.prod_flags,
        Pf::URGENT_PENDING | Pf::URGENT_PRESENT | Pf::WRITE_BLOCKED
    );
    assert_eq!(urg.to_bytes()[24] & 0x60, 0x60);
    // B sees the urgent mark.
    b.conn.on_cdc(&b.inbox.pop_front().unwrap());
    assert!(b.conn.urgent_pending());
    assert_eq!(b.conn.bytes_to_urgent_mark(), Some(500));
    let before = b.sent.len();
    // Reading up to the mark forces a consumer update whatever the window (SMC-URG-3).
    app_read(&mut b, 500);
    run_actions(&mut b, &mut a);
    assert_eq!(b.sent.len(), before + 1);
    assert_eq!(b.sent.last().unwrap().cons, Cursor::new(0, 1_500));
    assert!(!b.conn.urgent_pending());
    // A now writes the normal data; P and U are clear (SMC-URG-5).
    a.conn.on_cdc(&a.inbox.pop_front().unwrap());
    run_actions(&mut a, &mut b);
    let next = *a.sent.last().unwrap();
    assert_eq!(next.prod, Cursor::new(0, 2_500));
    assert_eq!(next.prod_flags, Pf::empty());
    settle(&mut a, &mut b);
    app_read(&mut b, u64::MAX);
    assert_eq!(b.got, d);
}

// SMC-URG-2 (A4.5 closed window): CDC(B,P) without data first, then the urgent write
// with U when space opens.
#[test]
fn urgent_data_closed_window() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    let d = pattern(9, 5_000);
    app_write(&mut a, &d[..4_096]);
    settle(&mut a, &mut b);
    let n = a.conn.write_urgent(100).unwrap();
    a.stream.extend_from_slice(&d[4_096..4_096 + n as usize]);
    run_actions(&mut a, &mut b);
    let ann = *a.sent.last().unwrap();
    assert_eq!(ann.prod, Cursor::new(1, 0), "no data moved");
    assert_eq!(ann.prod_flags, Pf::WRITE_BLOCKED | Pf::URGENT_PENDING);
    b.conn.on_cdc(&b.inbox.pop_front().unwrap());
    assert!(b.conn.urgent_pending(), "P signalled before the data");
    app_read(&mut b, u64::MAX);
    settle(&mut a, &mut b);
    let w = a
        .sent
        .iter()
        .find(|c| c.prod_flags.contains(Pf::URGENT_PRESENT))
        .unwrap();
    assert_eq!(w.prod, Cursor::new(1, 100));
    assert_eq!(w.prod_flags, Pf::URGENT_PENDING | Pf::URGENT_PRESENT);
    assert_eq!(b.conn.bytes_to_urgent_mark(), Some(100));
    app_read(&mut b, u64::MAX);
    settle(&mut a, &mut b);
    assert_eq!(b.got, d[..4_196]);
    // The next CDC after the urgent data was consumed clears P and U (SMC-URG-5).
    app_write(&mut a, &d[4_196..]);
    run_actions(&mut a, &mut b);
    assert_eq!(a.sent.last().unwrap().prod_flags, Pf::empty());
    settle(&mut a, &mut b);
    app_read(&mut b, u64::MAX);
    assert_eq!(b.got, d);
}

// SMC-URG-3 with Linux's TCP semantics on the reading side (A2.9, D1): reads stop before the
// urgent octet; out of line it is offered once (take), skipped by the stream at the mark with
// a forced consumer update; in line it stays in the stream; P without U = not yet (EAGAIN).
#[test]
fn urgent_reader_out_of_line_and_inline() {
    for inline in [false, true] {
        let (mut a, mut b) = pair(EyecatcherMode::Rfc, 16_384, 65_536);
        b.conn.set_oob_inline(inline);
        let d = pattern(5, 20);
        app_write(&mut a, &d[..10]);
        let n = a.conn.write_urgent(3).unwrap();
        a.stream.extend_from_slice(&d[10..10 + n as usize]);
        settle(&mut a, &mut b);
        assert_eq!(b.conn.readable(), 13);
        assert_eq!(b.conn.readable_in_band(), 12, "a read stops before the urgent octet");
        assert!(!b.conn.at_urgent_mark());
        if inline {
            assert_eq!(b.conn.urgent_octet(), Err(UrgentError::Inline));
        } else {
            // RFC mode: data area from 4; the urgent octet is stream octet 12.
            assert_eq!(b.conn.urgent_octet(), Ok(4 + 12));
            assert_eq!(b.elem[16], d[12]);
            b.conn.take_urgent();
            assert_eq!(b.conn.urgent_octet(), Err(UrgentError::NoUrgent), "taken once");
        }
        assert_eq!(app_read(&mut b, 12), 12);
        assert!(b.conn.at_urgent_mark());
        let sent = b.sent.len();
        if inline {
            assert_eq!(b.conn.readable_in_band(), 1);
            assert!(!b.conn.skip_urgent());
            assert_eq!(app_read(&mut b, u64::MAX), 1);
            assert_eq!(b.got, d[..13]);
        } else {
            assert_eq!(b.conn.readable_in_band(), 0);
            assert!(b.conn.skip_urgent());
            assert_eq!(b.got, d[..12], "the urgent octet is not in the stream");
        }
        run_actions(&mut b, &mut a);
        assert_eq!(b.sent.len(), sent + 1, "consumer update after the urgent octet");
        assert!(!b.conn.at_urgent_mark() && !b.conn.urgent_pending());
        // A CDC with U still set that crosses our update names a consumed mark: no news.
        let stale = Cdc {
            seq: a.sent.last().unwrap().seq.wrapping_add(1),
            ..*a.sent.last().unwrap()
        };
        assert!(stale.prod_flags.contains(Pf::URGENT_PRESENT));
        b.conn.on_cdc(&stale);
        assert_eq!(b.conn.bytes_to_urgent_mark(), None);
        assert!(!b.conn.urgent_pending());
        settle(&mut a, &mut b);
        app_write(&mut a, &d[13..]);
        settle(&mut a, &mut b);
        assert_eq!(b.conn.readable_in_band(), 7);
    }
    // Closed window: P announced, the octet not written yet → EAGAIN.
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    let d = pattern(9, 4_200);
    app_write(&mut a, &d[..4_096]);
    settle(&mut a, &mut b);
    let n = a.conn.write_urgent(100).unwrap();
    a.stream.extend_from_slice(&d[4_096..4_096 + n as usize]);
    run_actions(&mut a, &mut b);
    b.conn.on_cdc(&b.inbox.pop_front().unwrap());
    assert_eq!(b.conn.urgent_octet(), Err(UrgentError::NotYet));
}

fn drain_close_trace(a: &mut Side, b: &mut Side) {
    settle(a, b);
}

// Figure 22 (a): full close, A active; C only after all data (SMC-CLS-1, -3, -5, -8).
#[test]
fn close_active_full() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    let d = pattern(5, 20_000);
    app_write(&mut a, &d);
    a.conn.close();
    run_actions(&mut a, &mut b);
    assert!(
        !a.sent.iter().any(|c| c.conn_flags.contains(Cs::CONN_CLOSED)),
        "close pending while data is queued"
    );
    assert_eq!(a.conn.state(), CloseState::Active);
    // B drains; A's close goes out after the last data.
    for _ in 0..100 {
        settle(&mut a, &mut b);
        if app_read(&mut b, u64::MAX) == 0 {
            break;
        }
    }
    settle(&mut a, &mut b);
    assert_eq!(b.got, d);
    assert_eq!(a.conn.state(), CloseState::PeerCloseWait1);
    assert_eq!(b.conn.state(), CloseState::AppCloseWait1);
    assert!(b.conn.read_eof());
    let c_idx = a
        .sent
        .iter()
        .position(|c| c.conn_flags.contains(Cs::CONN_CLOSED))
        .unwrap();
    assert_eq!(c_idx, a.sent.len() - 1, "nothing after C");
    b.conn.close();
    settle(&mut a, &mut b);
    assert_eq!(b.conn.state(), CloseState::Closed);
    assert_eq!(a.conn.state(), CloseState::Closed);
    assert_eq!((a.released, b.released), (1, 1));
    assert_eq!((a.resets, b.resets), (0, 0));
}

// Figure 22 (b): half-close both ways with the full state trace (SMC-CLS-4, -7).
#[test]
fn close_half_close_trace() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    a.conn.shutdown_write().unwrap();
    assert_eq!(a.conn.state(), CloseState::PeerCloseWait1);
    drain_close_trace(&mut a, &mut b);
    assert_eq!(a.sent.last().unwrap().conn_flags, Cs::DONE_WRITING);
    assert_eq!(b.conn.state(), CloseState::AppCloseWait1);
    assert!(b.conn.read_eof());
    // B keeps writing, A keeps reading.
    app_write(&mut b, b"reply");
    settle(&mut a, &mut b);
    app_read(&mut a, u64::MAX);
    assert_eq!(a.got, b"reply");
    assert_eq!(a.conn.write(1), Err(ConnError::WriteShutdown));
    b.conn.shutdown_write().unwrap();
    assert_eq!(b.conn.state(), CloseState::AppCloseWait2);
    settle(&mut a, &mut b);
    assert_eq!(a.conn.state(), CloseState::PeerCloseWait2);
    assert!(a.conn.read_eof());
    b.conn.close();
    assert_eq!(b.conn.state(), CloseState::PeerFinCloseWait);
    settle(&mut a, &mut b);
    assert_eq!(a.conn.state(), CloseState::AppFinCloseWait);
    a.conn.close();
    settle(&mut a, &mut b);
    assert_eq!(a.conn.state(), CloseState::Closed);
    assert_eq!(b.conn.state(), CloseState::Closed);
    assert_eq!(a.sent.last().unwrap().conn_flags, Cs::DONE_WRITING | Cs::CONN_CLOSED);
}

// Figure 22 (c): simultaneous close (SMC-CLS-10).
#[test]
fn close_simultaneous() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    a.conn.close();
    b.conn.close();
    assert_eq!(a.conn.state(), CloseState::PeerCloseWait1);
    assert_eq!(b.conn.state(), CloseState::PeerCloseWait1);
    settle(&mut a, &mut b);
    assert_eq!(a.conn.state(), CloseState::Closed);
    assert_eq!(b.conn.state(), CloseState::Closed);
    assert_eq!((a.resets, b.resets), (0, 0));
}

// Figure 22 (d) → Figure 23: close with unread data aborts (SMC-CLS-2, SMC-ABT-1, -3).
#[test]
fn close_with_unread_data_aborts() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    app_write(&mut a, &[1u8; 10]);
    settle(&mut a, &mut b);
    b.conn.close();
    assert_eq!(b.conn.abort_reason(), Some(AbortReason::UnreadDataOnClose));
    assert_eq!(b.conn.state(), CloseState::PeerAbortWait);
    settle(&mut a, &mut b);
    assert_eq!(b.resets, 1);
    assert_eq!(a.conn.abort_reason(), Some(AbortReason::PeerAbort));
    assert_eq!(a.conn.write(1), Err(ConnError::Aborted(AbortReason::PeerAbort)));
    assert_eq!(a.conn.state(), CloseState::Closed);
    assert_eq!(b.conn.state(), CloseState::Closed, "peer's A ends PeerAbortWait");
    assert!(a.sent.last().unwrap().conn_flags.contains(Cs::ABORT));
    assert_eq!((a.released, b.released), (1, 1));
}

// SMC-ABT-5: both abort at once.
#[test]
fn abort_simultaneous() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    a.conn.abort();
    b.conn.abort();
    settle(&mut a, &mut b);
    assert_eq!(a.conn.state(), CloseState::Closed);
    assert_eq!(b.conn.state(), CloseState::Closed);
    assert_eq!(a.sent.iter().filter(|c| c.conn_flags.contains(Cs::ABORT)).count(), 1);
}

// SMC-CLS-6: the peer closes while local data waits → reset.
#[test]
fn peer_close_with_unsent_data_resets() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    app_write(&mut b, &pattern(0, 10_000));
    a.conn.close();
    run_actions(&mut a, &mut b);
    run_actions(&mut b, &mut a);
    // Deliver A's C to B before B's data CDC reaches A.
    while let Some(m) = b.inbox.pop_front() {
        b.conn.on_cdc(&m);
    }
    assert_eq!(b.conn.abort_reason(), Some(AbortReason::PeerClosedWithUnsentData));
}

// SMC-CLS-9 / SMC-ABT-2 / SMC-ABT-4: timers and a TCP reset.
#[test]
fn timeouts_and_tcp_reset() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 4_096, 65_536);
    a.conn.close();
    run_actions(&mut a, &mut b);
    assert!(a.conn.needs_timer());
    a.conn.on_timeout();
    assert_eq!(a.conn.state(), CloseState::Closed);
    assert_eq!(a.conn.abort_reason(), Some(AbortReason::Timeout));
    run_actions(&mut a, &mut b);
    assert_eq!((a.resets, a.released), (1, 1));
    // PeerAbortWait ends on the guard timer.
    b.conn.abort();
    assert_eq!(b.conn.state(), CloseState::PeerAbortWait);
    b.conn.on_timeout();
    assert_eq!(b.conn.state(), CloseState::Closed);
    // TCP RST → A on the RDMA path.
    let (mut c, mut d) = pair(EyecatcherMode::None, 4_096, 65_536);
    c.conn.on_tcp_reset();
    run_actions(&mut c, &mut d);
    assert!(c.sent[0].conn_flags.contains(Cs::ABORT));
    assert_eq!(c.resets, 0, "the TCP connection is already reset");
    settle(&mut c, &mut d);
    assert_eq!(d.conn.state(), CloseState::Closed);
    assert_eq!(c.conn.state(), CloseState::Closed);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    // SMC-CDC-4 with random write/read sizes, both directions, delayed CDC delivery and both
    // modes: unconsumed octets are never overwritten and the byte streams arrive intact.
    #[test]
    fn random_traffic_never_overwrites_unread_data(
        rfc in any::<bool>(),
        len in 64u32..5_000,
        ops in proptest::collection::vec((0u8..6, 1u32..9_000), 1..120),
    ) {
        let mode = if rfc { EyecatcherMode::Rfc } else { EyecatcherMode::None };
        let (mut a, mut b) = pair(mode, len, 7_000);
        let src_a = pattern(11, 200_000);
        let src_b = pattern(77, 200_000);
        let (mut wa, mut wb) = (0usize, 0usize);
        for (op, n) in ops {
            match op {
                0 => { wa += app_write(&mut a, &src_a[wa..wa + n as usize]) as usize; }
                1 => { wb += app_write(&mut b, &src_b[wb..wb + n as usize]) as usize; }
                2 => { app_read(&mut b, u64::from(n)); }
                3 => { app_read(&mut a, u64::from(n)); }
                4 => {
                    // Deliver only some CDCs (delays, never reorders: RC is in order).
                    run_actions(&mut a, &mut b);
                    run_actions(&mut b, &mut a);
                    for _ in 0..(n % 3) {
                        if let Some(m) = b.inbox.pop_front() { prop_assert_eq!(b.conn.on_cdc(&m), CdcOutcome::Applied); }
                        if let Some(m) = a.inbox.pop_front() { prop_assert_eq!(a.conn.on_cdc(&m), CdcOutcome::Applied); }
                    }
                }
                _ => settle(&mut a, &mut b),
            }
            // The reader's view of unread data equals what the writer wrote at those positions.
            let (x, y) = b.conn.read_spans(u64::MAX);
            let mut unread = Vec::new();
            for sp in [Some(x), y].into_iter().flatten() {
                unread.extend_from_slice(&b.elem[sp.off as usize..(sp.off + sp.len) as usize]);
            }
            let at = b.got.len();
            prop_assert_eq!(&unread[..], &src_a[at..at + unread.len()]);
            prop_assert!(a.conn.abort_reason().is_none() && b.conn.abort_reason().is_none());
        }
        loop {
            settle(&mut a, &mut b);
            let moved = app_read(&mut b, u64::MAX) + app_read(&mut a, u64::MAX);
            if moved == 0 && a.conn.unsent() == 0 && b.conn.unsent() == 0 { break; }
        }
        prop_assert_eq!(&b.got[..], &src_a[..wa]);
        prop_assert_eq!(&a.got[..], &src_b[..wb]);
        if rfc {
            prop_assert_eq!(&a.elem[..4], b"SMCR");
            prop_assert_eq!(&b.elem[..4], b"SMCR");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    // A2.15: a rogue peer's arbitrary CDCs (any token, sequence, cursors, flags) mixed with
    // local calls never panic the machine; whatever it accepted keeps the invariants
    // (unread ≤ C, cursors inside the data area, every RDMA Write inside the peer's element).
    #[test]
    fn arbitrary_cdcs_never_panic(
        rfc in any::<bool>(),
        len in 5u32..3_000,
        steps in proptest::collection::vec(
            (0u8..8, any::<u16>(), any::<u16>(), 0u32..3_100, any::<u16>(), 0u32..3_100, any::<u8>(), any::<u8>(), any::<bool>()),
            1..80,
        ),
    ) {
        let mode = if rfc { EyecatcherMode::Rfc } else { EyecatcherMode::None };
        let e = Rmbe::new(len, mode).unwrap();
        let mut c = Conn::new(ConnParams { local_token: TOKEN_B, peer_token: TOKEN_A, local_rmbe: e, peer_rmbe: e, send_buf: 5_000 });
        for (op, seq, pw, pc, cw, cc, pf, cf, good_token) in steps {
            match op {
                0 => { let _ = c.write(u64::from(pc)); }
                1 => { let n = c.readable().min(u64::from(pc)); let _ = c.consume(n); }
                2 => { let _ = c.write_urgent(u64::from(pc % 50)); }
                3 => c.writes_completed(u64::from(pc)),
                4 if pf == 0 => c.close(),
                4 if pf == 1 => { let _ = c.shutdown_write(); }
                4 if pf == 2 => c.on_timeout(),
                _ => {
                    let m = Cdc {
                        seq,
                        token: if good_token { TOKEN_B } else { u32::from(pw) },
                        prod: Cursor::new(pw, pc),
                        cons: Cursor::new(cw, cc),
                        prod_flags: Pf::from_bits_truncate(pf),
                        conn_flags: Cs::from_bits_truncate(cf),
                    };
                    let _ = c.on_cdc(&m);
                }
            }
            while let Some(a) = c.poll_action() {
                if let Action::RdmaWrite { remote_off, len: l, .. } = a {
                    prop_assert!(remote_off >= e.base() && remote_off + l <= e.len());
                }
            }
            prop_assert!(c.readable() <= u64::from(e.capacity()));
            prop_assert!(e.check(c.producer()).is_ok() && e.check(c.consumer()).is_ok());
        }
    }
}

// SmcConfig::write_chunk (Conn::set_max_write): a free window is filled in writes of at
// most the chunk, each followed by its own CDC; only the last CDC of the run may carry B
// (octets still queued, no room), so the reader answers at once only when the writer is
// really blocked (SMC-CDC-8). The default (no chunk) is one write per contiguous span.
#[test]
fn write_chunk_splits_the_window_one_cdc_per_piece() {
    let (mut a, mut b) = pair(EyecatcherMode::None, 10_000, 65_536);
    a.conn.set_max_write(3_000);
    let d = pattern(3, 12_000);
    assert_eq!(app_write(&mut a, &d), 12_000);
    run_actions(&mut a, &mut b);
    assert_eq!(
        a.writes,
        vec![(0, 3_000), (3_000, 3_000), (6_000, 3_000), (9_000, 1_000)]
    );
    assert_eq!(a.sent.len(), 4);
    let flags: Vec<_> = a.sent.iter().map(|c| c.prod_flags).collect();
    assert_eq!(flags, vec![Pf::empty(), Pf::empty(), Pf::empty(), Pf::WRITE_BLOCKED]);
    let e = Rmbe::new(10_000, EyecatcherMode::None).unwrap();
    assert_eq!(e.position(a.sent[3].prod), 10_000);
    // The rest goes once the reader frees room; every octet arrives in order.
    while b.got.len() < 12_000 {
        settle(&mut a, &mut b);
        app_read(&mut b, u64::MAX);
        run_actions(&mut b, &mut a);
        settle(&mut a, &mut b);
    }
    assert!(b.got == d, "octets differ");
    // Without a chunk: one write for the whole window, B on its CDC.
    let (mut a2, mut b2) = pair(EyecatcherMode::None, 10_000, 65_536);
    app_write(&mut a2, &d);
    run_actions(&mut a2, &mut b2);
    assert_eq!(a2.writes, vec![(0, 10_000)]);
    assert_eq!(a2.sent.len(), 1);
    assert_eq!(a2.sent[0].prod_flags, Pf::WRITE_BLOCKED);
}
