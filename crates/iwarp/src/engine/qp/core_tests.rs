//! The protocol core ([`Proto`]) tested in memory, the way quinn-proto tests
//! connections: no socket, no thread, no clock. Two cores are wired back to
//! back through their transmit queues and the receive buffer `io.rs` runs
//! (`rx_buf.rs`: deframer, `Proto::on_ulpdu`, direct placement,
//! `Proto::on_stream_error`), by the harness in `harness.rs`; loss of the
//! TCP stream is excluded. A scripted side injects malformed ULPDUs or FPDUs
//! into one core and reads back the Terminate it queues, so every Terminate
//! the engine can emit is reachable without sockets
//! (`every_terminate_cause_the_engine_emits_is_reached`).

use super::harness::{self, Side, SideConfig, device};
use super::tx::encoded;
use super::*;
use crate::wire::fpdu::{Deframer, DeframerConfig, Framer};
use verbs::{Access, Device, MemoryRegion, ProtectionDomain, RemoteAddr};

fn side(dev: &Device, qpn: u32, crc: bool, ird: u32) -> Side {
    side_in(&dev.alloc_pd().unwrap(), qpn, crc, ird)
}

/// A core whose stream belongs to protection domain `pd`.
fn side_in(pd: &ProtectionDomain, qpn: u32, crc: bool, ird: u32) -> Side {
    Side::new(
        pd,
        SideConfig {
            qpn,
            crc,
            ird,
            ..SideConfig::default()
        },
    )
}

fn settle(a: &mut Side, b: &mut Side) {
    assert!(harness::settle(a, b), "the cores did not settle");
}

fn pair() -> (Device, Side, Side) {
    let dev = device();
    let a = side(&dev, 1, true, 16);
    let b = side(&dev, 2, true, 16);
    (dev, a, b)
}

fn mr(s: &Side, len: usize, access: Access) -> MemoryRegion {
    s.pd.reg_mr(len, access).unwrap()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|k| (k.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

/// RDMAP-SND-01/03, RDMAP-WR-*, RDMAP-RD-*, RFC 7306 atomics, RDMAP-ORD-15:
/// every operation between two cores in memory, multi-segment messages
/// included, with data and completions in posting order.
#[test]
fn two_cores_back_to_back_run_every_operation() {
    let (_dev, mut a, mut b) = pair();
    let a_mem = mr(&a, 1 << 20, Access::LOCAL_WRITE);
    let b_mem = mr(&b, 1 << 20, Access::all_remote());
    let b_recv = mr(&b, 4096, Access::LOCAL_WRITE);
    b.p.post_recv(&[RecvWr {
        wr_id: 77,
        sg_list: vec![b_recv.sge(0, 4096)],
    }])
    .unwrap();
    let send_data = pattern(3000, 1);
    let write_data = pattern(300_000, 2);
    let read_data = pattern(200_000, 3);
    a_mem.write(0, &send_data).unwrap();
    a_mem.write(4096, &write_data).unwrap();
    b_mem.write(600_000, &read_data).unwrap();
    b_mem.write(900_000, &40u64.to_ne_bytes()).unwrap();
    let remote = |off: u64| RemoteAddr {
        addr: b_mem.addr() + off,
        rkey: b_mem.rkey(),
    };
    a.p.post_send(&[
        SendWr::new(1, WrOpcode::Send, vec![a_mem.sge(0, 3000)]),
        SendWr::new(
            2,
            WrOpcode::RdmaWrite { remote: remote(10) },
            vec![a_mem.sge(4096, 300_000)],
        ),
        SendWr::new(
            3,
            WrOpcode::RdmaRead {
                remote: remote(600_000),
            },
            vec![a_mem.sge(400_000, 200_000)],
        ),
        SendWr::new(
            4,
            WrOpcode::AtomicFetchAdd {
                remote: remote(900_000),
                add: 2,
            },
            vec![a_mem.sge(700_000, 8)],
        ),
    ])
    .unwrap();
    settle(&mut a, &mut b);
    let wcs: Vec<_> = std::iter::from_fn(|| a.cq.poll_one()).collect();
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [1, 2, 3, 4].map(|id| (id, WcStatus::Success)),
        "completions in posting order"
    );
    assert_eq!(wcs[2].byte_len, 200_000);
    let r = b.cq.poll_one().expect("the Send's receive completion");
    assert_eq!((r.wr_id, r.status, r.byte_len), (77, WcStatus::Success, 3000));
    assert_eq!(b_recv.to_vec(0, 3000).unwrap(), send_data);
    assert_eq!(b_mem.to_vec(10, 300_000).unwrap(), write_data);
    assert_eq!(a_mem.to_vec(400_000, 200_000).unwrap(), read_data);
    assert_eq!(a_mem.to_vec(700_000, 8).unwrap(), 40u64.to_ne_bytes());
    assert_eq!(b_mem.to_vec(900_000, 8).unwrap(), 42u64.to_ne_bytes());
    assert_eq!((a.p.state, b.p.state), (QpState::Rts, QpState::Rts));
}

/// What the core under test answered to an injected ULPDU or FPDU.
struct Answer {
    terminates: Vec<terminate::Repr>,
    events: Vec<CmEvent>,
    state: QpState,
}

/// Feeds raw octets (whole FPDUs) to `s` and decodes what it queued.
fn inject_raw(s: &mut Side, fpdus: &[u8]) -> Answer {
    s.feed(fpdus);
    let out = s.take_output();
    let mut d = Deframer::new(DeframerConfig {
        crc: s.rx.deframer.config().crc,
        ..Default::default()
    });
    let mut terminates = Vec::new();
    let mut at = 0;
    while at < out.len() {
        let (used, u) = d.next_fpdu(&out[at..]).expect("the core's FPDUs deframe");
        if let Some(u) = u
            && let Ok((_, Message::Terminate(t))) = rdmap::parse_ulpdu(u, &rdmap::Config::RFC7306)
        {
            terminates.push(t);
        }
        at += used;
        if used == 0 {
            break;
        }
    }
    let mut events = Vec::new();
    while let Some(e) = s.events.try_pop() {
        events.push(e);
    }
    Answer {
        terminates,
        events,
        state: s.p.state,
    }
}

fn inject(s: &mut Side, ulpdus: &[Vec<u8>]) -> Answer {
    let mut framer = Framer::new(s.rx.deframer.config().crc, false);
    let mut bytes = Vec::new();
    for u in ulpdus {
        framer.emit_vec(u, &mut bytes).unwrap();
    }
    inject_raw(s, &bytes)
}

fn untagged(opcode: u8, qn: u32, msn: u32, mo: u32, last: bool, body: &[u8]) -> Vec<u8> {
    let h = Header {
        last,
        rdmap_ctrl: rdmap_ctrl(opcode),
        addr: Addr::Untagged {
            qn,
            msn,
            mo,
            inv_stag: 0,
        },
    };
    let mut u = vec![0u8; ddp::UNTAGGED_HEADER_LEN + body.len()];
    h.emit(&mut u).unwrap();
    u[ddp::UNTAGGED_HEADER_LEN..].copy_from_slice(body);
    u
}

fn tagged(opcode: u8, stag: u32, to: u64, last: bool, body: &[u8]) -> Vec<u8> {
    let h = Header {
        last,
        rdmap_ctrl: rdmap_ctrl(opcode),
        addr: Addr::Tagged { stag, to },
    };
    let mut u = vec![0u8; ddp::TAGGED_HEADER_LEN + body.len()];
    h.emit(&mut u).unwrap();
    u[ddp::TAGGED_HEADER_LEN..].copy_from_slice(body);
    u
}

fn read_request(rr: ReadRequest) -> Vec<u8> {
    untagged(
        op::READ_REQUEST,
        qn::READ_REQUEST,
        1,
        0,
        true,
        &encoded(28, |b| rr.emit(b)),
    )
}

/// Asserts exactly one Terminate with `want` = (layer, etype, code), the
/// `TerminateSent` event with the same cause, and the error state
/// (RDMAP-TRM-02, RDMAP-TRM-06).
fn expect(a: Answer, want: (u8, u8, u8), row: &str) {
    assert_eq!(a.terminates.len(), 1, "{row}: exactly one Terminate");
    let c = a.terminates[0].cause;
    assert_eq!((c.layer.to_nibble(), c.etype, c.code), want, "{row}: {c}");
    assert!(
        a.events.iter().any(|e| matches!(e, CmEvent::ErrorSent(d)
                if d.downcast_ref::<TerminateInfo>().is_some_and(|i| (i.layer, i.etype, i.code) == want))),
        "{row}: TerminateSent event, got {:?}",
        a.events
    );
    assert_eq!(a.state, QpState::Err, "{row}");
}

fn fresh(recvs: usize) -> (Device, Side, Vec<MemoryRegion>) {
    let dev = device();
    let mut s = side(&dev, 9, false, 2);
    let m = mr(&s, 64 * recvs.max(1), Access::LOCAL_WRITE);
    let wrs: Vec<_> = (0..recvs)
        .map(|i| RecvWr {
            wr_id: 100 + i as u64,
            sg_list: vec![m.sge(64 * i, 64)],
        })
        .collect();
    if !wrs.is_empty() {
        s.p.post_recv(&wrs).unwrap();
    }
    (dev, s, vec![m])
}

/// (layer, error type, error code) of a Terminate.
type Cause = (u8, u8, u8);
/// A matrix row: its name, a setup parameter, the injected ULPDUs, the cause.
type Row<P> = (&'static str, P, Vec<Vec<u8>>, Cause);

/// Catalogue A.4.6, rows 1-25 and 26, plus issue 12 points 6 and 8, driven
/// against the core in memory: each row's injected segment and the exact
/// Terminate cause (the socket-level tests in tests/misbehave.rs check the
/// same rows over TCP, with echoed headers and the close).
#[test]
fn every_terminate_row_is_reachable_in_memory() {
    // Rows on the untagged and RDMAP checks: (row, receives, ULPDUs, cause).
    let send = |msn, mo, last, body: &[u8]| untagged(op::SEND, qn::SEND, msn, mo, last, body);
    let mut bad_dv_u = send(1, 0, true, b"x");
    bad_dv_u[0] = (bad_dv_u[0] & !0x03) | 0x02;
    let mut bad_dv_t = tagged(op::WRITE, 0x1234, 0, true, b"x");
    bad_dv_t[0] &= !0x03; // DV = 00b
    let mut bad_rv = send(1, 0, true, b"x");
    bad_rv[1] = (bad_rv[1] & 0x3F) | 0x80;
    let rows: Vec<Row<usize>> = vec![
        ("row 1", 0, vec![send(1, 0, true, b"hello")], (1, 2, 0x02)),
        ("row 2", 1, vec![send(1, 0, true, &[7; 65])], (1, 2, 0x05)),
        ("row 3", 1, vec![send(5, 0, true, b"x")], (1, 2, 0x03)),
        ("row 4", 1, vec![send(1, 4, true, b"x")], (1, 2, 0x04)),
        (
            "row 5 (QN 3)",
            1,
            vec![untagged(op::SEND, 3, 1, 0, true, b"x")],
            (1, 2, 0x01),
        ),
        ("row 6", 1, vec![bad_dv_u], (1, 2, 0x06)),
        ("row 7", 1, vec![bad_dv_t], (1, 1, 0x04)),
        ("row 21", 1, vec![bad_rv], (0, 2, 0x05)),
        (
            "row 22",
            1,
            vec![untagged(0xC, qn::SEND, 1, 0, true, b"x")],
            (0, 2, 0x06),
        ),
        (
            "row 23",
            0,
            vec![tagged(op::READ_RESPONSE, 0x1234, 0, true, b"unasked")],
            (0, 2, 0x06),
        ),
        (
            "row 24",
            1,
            vec![untagged(op::WRITE, qn::SEND, 1, 0, true, b"x")],
            (0, 2, 0x06),
        ),
        (
            "issue 12 point 8 (short ULPDU)",
            1,
            vec![vec![0x41, 0x43, 0, 0]],
            (1, 0, 0x00),
        ),
    ];
    for (row, recvs, ulpdus, want) in rows {
        let (_dev, mut s, _m) = fresh(recvs);
        expect(inject(&mut s, &ulpdus), want, row);
    }

    // Rows on tagged buffers (8-12) and Read Requests (13-19).
    let (_dev, s, _m) = fresh(0);
    let region = mr(
        &s,
        4096,
        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::LOCAL_WRITE,
    );
    let no_rights = mr(&s, 4096, Access::LOCAL_WRITE);
    let other_pd =
        s.pd.device()
            .alloc_pd()
            .unwrap()
            .reg_mr(4096, Access::all_remote())
            .unwrap();
    let (stag, base) = (region.rkey(), region.addr());
    let write = |stag, to| tagged(op::WRITE, stag, to, true, b"data");
    let rr = |stag, to, size| ReadRequest {
        sink_stag: 0x99,
        sink_to: 0,
        size,
        src_stag: stag,
        src_to: to,
    };
    let tagged_rows: Vec<(&str, Vec<u8>, Cause)> = vec![
        ("row 8", write(0xdead_be00, 0), (1, 1, 0x00)),
        ("row 9", write(stag, base + 4094), (1, 1, 0x01)),
        ("row 10", write(other_pd.rkey(), other_pd.addr()), (1, 1, 0x02)),
        ("row 11", write(stag, u64::MAX - 1), (1, 1, 0x03)),
        ("row 12", write(no_rights.lkey(), no_rights.addr()), (1, 1, 0x00)),
        ("row 13", read_request(rr(0xdead_be00, 0, 8)), (0, 1, 0x00)),
        ("row 14", read_request(rr(stag, base + 4090, 8)), (0, 1, 0x01)),
        (
            "row 15",
            read_request(rr(no_rights.lkey(), no_rights.addr(), 8)),
            (0, 1, 0x02),
        ),
        (
            "row 16",
            read_request(rr(other_pd.rkey(), other_pd.addr(), 8)),
            (0, 1, 0x03),
        ),
        ("row 17", read_request(rr(stag, u64::MAX - 3, 8)), (0, 1, 0x04)),
    ];
    drop(s);
    for (row, u, want) in tagged_rows {
        // A fresh core per row, in the regions' PD.
        let mut c = side_in(region.pd(), 9, false, 2);
        expect(inject(&mut c, &[u]), want, row);
    }

    // Row 18: a zero-length Read with a garbage source is answered, no error.
    let mut c = side_in(region.pd(), 9, false, 2);
    let a = inject(&mut c, &[read_request(rr(0xdead_be00, 0, 0))]);
    assert!(a.terminates.is_empty() && a.state == QpState::Rts, "row 18");

    // Row 19: more Read Requests than IRD (2).
    let mut c = side_in(region.pd(), 9, false, 2);
    let reqs: Vec<_> = (1..=3)
        .map(|msn| {
            let r = rr(stag, base, 8);
            untagged(
                op::READ_REQUEST,
                qn::READ_REQUEST,
                msn,
                0,
                true,
                &encoded(28, |b| r.emit(b)),
            )
        })
        .collect();
    // Framed back to back, before the core can answer any of them.
    let mut framer = Framer::new(false, false);
    let mut bytes = Vec::new();
    for u in &reqs {
        framer.emit_vec(u, &mut bytes).unwrap();
    }
    c.feed(&bytes);
    let a = inject_raw(&mut c, &[]);
    expect(a, (0, 2, 0x07), "row 19");

    // Row 20: Send with Invalidate of an STag of another PD.
    let (_d, mut c, _m) = fresh(1);
    let mut u = untagged(op::SEND_INV, qn::SEND, 1, 0, true, b"x");
    u[2..6].copy_from_slice(&other_pd.rkey().to_be_bytes());
    let a = inject(&mut c, &[u]);
    assert_eq!(a.terminates.len(), 1, "row 20");
    let t = a.terminates[0].cause;
    assert_eq!((t.layer.to_nibble(), t.code), (0, 0x09), "row 20: {t}");

    // Row 25 and issue 12 point 6: Read Responses against the outstanding Read.
    for (row, wrong, want) in [
        ("row 25 (too long)", 0u8, (1, 1, 0x01)),
        ("row 25 (other STag of this PD)", 1, (1, 1, 0x00)),
        ("row 25 (another PD's STag)", 2, (1, 1, 0x02)),
        ("row 25 (wrong TO)", 3, (1, 1, 0x01)),
    ] {
        let mut c = side_in(region.pd(), 9, false, 2);
        let sink = mr(&c, 64, Access::LOCAL_WRITE);
        let decoy = mr(&c, 64, Access::all_remote());
        c.p.post_send(&[SendWr::new(
            5,
            WrOpcode::RdmaRead {
                remote: RemoteAddr { addr: 0, rkey: 0x77 },
            },
            vec![sink.sge(0, 16)],
        )])
        .unwrap();
        let _ = inject_raw(&mut c, &[]); // the Read Request leaves
        let (stag, to, len) = match wrong {
            0 => (sink.lkey(), sink.addr(), 32),
            1 => (decoy.lkey(), decoy.addr(), 16),
            2 => (other_pd.lkey(), other_pd.addr(), 16),
            _ => (sink.lkey(), sink.addr() + 8, 8),
        };
        let u = tagged(op::READ_RESPONSE, stag, to, true, &vec![0xAB; len]);
        expect(inject(&mut c, &[u]), want, row);
        assert_eq!(sink.to_vec(0, 16).unwrap(), vec![0u8; 16], "{row}: nothing placed");
        assert_eq!(decoy.to_vec(0, 16).unwrap(), vec![0u8; 16], "{row}: nothing placed");
    }

    // Row 26: bad MPA CRC (LLP layer, through the deframer).
    let dev = device();
    let mut c = side(&dev, 9, true, 2);
    let mut framer = Framer::new(true, false);
    let mut f = Vec::new();
    framer
        .emit_vec(&untagged(op::SEND, qn::SEND, 1, 0, true, b"x"), &mut f)
        .unwrap();
    let n = f.len();
    f[n - 1] ^= 0x5A;
    expect(inject_raw(&mut c, &f), (2, 0, 0x02), "row 26");

    // Row 29: a Terminate from the peer gets no Terminate back.
    let (_d, mut c, _m) = fresh(1);
    let term = terminate::Repr::for_error(cause::DDP_ERR_T_INVALID_STAG, None, None);
    let mut u = vec![0u8; term.ulpdu_len()];
    term.emit_ulpdu(&mut u, 1).unwrap();
    let a = inject(&mut c, &[u]);
    assert!(a.terminates.is_empty(), "row 29: no Terminate back");
    assert!(a.events.iter().any(|e| matches!(e, CmEvent::ErrorReceived(_))));
    assert_eq!(a.state, QpState::Err);
}

/// The Terminate cause the core queued for `ulpdus`, or `None`.
fn terminate_for(s: &mut Side, ulpdus: &[Vec<u8>]) -> Option<TermCause> {
    let a = inject(s, ulpdus);
    assert!(a.terminates.len() <= 1, "at most one Terminate (RDMAP-TRM-02)");
    let t = a.terminates.first().map(|t| t.cause);
    if t.is_some() {
        assert_eq!(a.state, QpState::Err, "ERR after our Terminate");
    }
    t
}

/// Every Terminate cause the engine can emit (RFC 5040 §4.8 Fig. 9,
/// RFC 5041 §7.2, RFC 5044 §8, RFC 6581 §4), enumerated from what the code
/// names, reached through the core (RDMAP-ERR-02..-07, catalogue A.4.6).
///
/// "Can emit" is computed, not listed: every `cause::NAME` the engine's QP
/// files name, plus the cause of every error variant of the wire parsers the
/// receive path runs (`ddp::Error`, `rdmap::Error`, `fpdu::FpduError`). Each
/// must be reached by a scenario below, and every cause of `wire::cause`
/// must be either emitted or listed as not emitted with the reason. A new
/// check naming a new cause, or a new constant, fails this test until it
/// has a scenario or a reason.
#[test]
fn every_terminate_cause_the_engine_emits_is_reached() {
    use crate::wire::cause::*;
    use crate::wire::fpdu::FpduError;
    use std::collections::BTreeSet;
    let all: Vec<(&str, TermCause)> = vec![
        ("RDMAP_LOCAL_CATASTROPHIC_ERR", RDMAP_LOCAL_CATASTROPHIC_ERR),
        ("RDMAP_ERR_INVALID_STAG", RDMAP_ERR_INVALID_STAG),
        ("RDMAP_ERR_BASE_BOUNDS", RDMAP_ERR_BASE_BOUNDS),
        ("RDMAP_ERR_ACCESS_RIGHTS", RDMAP_ERR_ACCESS_RIGHTS),
        ("RDMAP_ERR_STAG_NOT_ASSOCIATED", RDMAP_ERR_STAG_NOT_ASSOCIATED),
        ("RDMAP_ERR_TO_WRAP", RDMAP_ERR_TO_WRAP),
        ("RDMAP_ERR_CANNOT_INVALIDATE_PROT", RDMAP_ERR_CANNOT_INVALIDATE_PROT),
        ("RDMAP_ERR_CANNOT_INVALIDATE_OP", RDMAP_ERR_CANNOT_INVALIDATE_OP),
        ("RDMAP_ERR_INVALID_VERSION", RDMAP_ERR_INVALID_VERSION),
        ("RDMAP_ERR_UNEXPECTED_OPCODE", RDMAP_ERR_UNEXPECTED_OPCODE),
        ("RDMAP_ERR_CATASTROPHIC_STREAM", RDMAP_ERR_CATASTROPHIC_STREAM),
        ("RDMAP_ERR_CATASTROPHIC_GLOBAL", RDMAP_ERR_CATASTROPHIC_GLOBAL),
        ("RDMAP_ERR_UNSPECIFIED_OP", RDMAP_ERR_UNSPECIFIED_OP),
        ("DDP_LOCAL_CATASTROPHIC_ERR", DDP_LOCAL_CATASTROPHIC_ERR),
        ("DDP_ERR_T_INVALID_STAG", DDP_ERR_T_INVALID_STAG),
        ("DDP_ERR_T_BASE_BOUNDS", DDP_ERR_T_BASE_BOUNDS),
        ("DDP_ERR_T_STAG_NOT_ASSOCIATED", DDP_ERR_T_STAG_NOT_ASSOCIATED),
        ("DDP_ERR_T_TO_WRAP", DDP_ERR_T_TO_WRAP),
        ("DDP_ERR_T_INVALID_VERSION", DDP_ERR_T_INVALID_VERSION),
        ("DDP_ERR_U_INVALID_QN", DDP_ERR_U_INVALID_QN),
        ("DDP_ERR_U_NO_BUFFER", DDP_ERR_U_NO_BUFFER),
        ("DDP_ERR_U_MSN_RANGE", DDP_ERR_U_MSN_RANGE),
        ("DDP_ERR_U_INVALID_MO", DDP_ERR_U_INVALID_MO),
        ("DDP_ERR_U_TOO_LONG", DDP_ERR_U_TOO_LONG),
        ("DDP_ERR_U_INVALID_VERSION", DDP_ERR_U_INVALID_VERSION),
        ("MPA_ERR_CONNECTION_LOST", MPA_ERR_CONNECTION_LOST),
        ("MPA_ERR_CRC", MPA_ERR_CRC),
        ("MPA_ERR_MARKER", MPA_ERR_MARKER),
        ("MPA_ERR_INVALID_REQ_REP", MPA_ERR_INVALID_REQ_REP),
        ("MPA_ERR_LOCAL_CATASTROPHIC", MPA_ERR_LOCAL_CATASTROPHIC),
        ("MPA_ERR_INSUFFICIENT_IRD", MPA_ERR_INSUFFICIENT_IRD),
        ("MPA_ERR_NO_MATCHING_RTR", MPA_ERR_NO_MATCHING_RTR),
    ];
    let not_emitted: &[(&str, &str)] = &[
        (
            "RDMAP_ERR_CATASTROPHIC_GLOBAL",
            "no failure of one QP's core is global to the device",
        ),
        (
            "MPA_ERR_CONNECTION_LOST",
            "a broken stream cannot carry a Terminate: the core reports Disconnected and flushes",
        ),
        (
            "MPA_ERR_INVALID_REQ_REP",
            "MPA negotiation (engine/cm.rs with proto::mpa), refused before the core exists",
        ),
        ("MPA_ERR_INSUFFICIENT_IRD", "MPA negotiation, as above"),
        (
            "MPA_ERR_LOCAL_CATASTROPHIC",
            "MPA negotiation; the deframer's UlpduTooLong needs a limit below 65535, the engine's is 65535",
        ),
    ];
    let name_of = |c: TermCause| all.iter().find(|(_, k)| *k == c).map(|(n, _)| *n);

    // What the engine can emit: causes its QP files name ...
    let mut emitted = BTreeSet::new();
    for src in [
        include_str!("mod.rs"),
        include_str!("rx.rs"),
        include_str!("tx.rs"),
        include_str!("rx_buf.rs"),
        include_str!("io.rs"),
    ] {
        for (i, _) in src.match_indices("cause::") {
            let name: String = src[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.len() > 3 {
                assert!(
                    all.iter().any(|(n, _)| *n == name),
                    "{name}: a cause this test does not know"
                );
                emitted.insert(all.iter().find(|(n, _)| *n == name).unwrap().0);
            }
        }
    }
    // ... and the causes of the wire errors its receive path turns into a
    // Terminate (rdmap::Error::Terminate is a peer's bad Terminate: row 29,
    // none back).
    let rr = |opcode| rdmap::Error::HeaderLength {
        opcode,
        len: 0,
        rreq: None,
    };
    let wire = [
        ddp::Error::Empty.term_cause(),
        ddp::Error::Truncated { tagged: true, len: 1 }.term_cause(),
        ddp::Error::Version { tagged: true, dv: 0 }.term_cause(),
        ddp::Error::Version { tagged: false, dv: 0 }.term_cause(),
        rdmap::Error::Version { rv: 0 }.term_cause(),
        rdmap::Error::UnknownOpcode { raw: 0xC }.term_cause(),
        rdmap::Error::TaggedMismatch {
            opcode: rdmap::Opcode::Write,
            tagged: false,
        }
        .term_cause(),
        rdmap::Error::QueueMismatch {
            opcode: rdmap::Opcode::Send,
            qn: 1,
        }
        .term_cause(),
        rdmap::Error::NotLast {
            opcode: rdmap::Opcode::ReadRequest,
        }
        .term_cause(),
        rr(rdmap::Opcode::ReadRequest).term_cause(),
        FpduError::Crc {
            computed: 0,
            received: 1,
        }
        .cause(),
        FpduError::Marker {
            offset: 0,
            expected: 0,
            found: 1,
        }
        .cause(),
    ];
    for c in wire {
        emitted.insert(name_of(c).expect("a catalogue cause"));
    }

    // Each cause emitted or not, with a reason; never both.
    for (name, _) in &all {
        let listed = not_emitted.iter().any(|(n, _)| n == name);
        assert!(
            emitted.contains(name) != listed,
            "{name}: emitted by the engine and listed as not emitted, or neither"
        );
    }

    // Scenarios: every emitted cause reached through the core.
    let mut reached: BTreeSet<&str> = BTreeSet::new();
    let mut hit = |what: &str, got: Option<TermCause>, want: TermCause| {
        assert_eq!(got, Some(want), "{what}");
        reached.insert(name_of(want).unwrap());
    };
    let send = |msn, mo, last, body: &[u8]| untagged(op::SEND, qn::SEND, msn, mo, last, body);
    let one = |recvs: usize, u: Vec<u8>| {
        let (_d, mut s, _m) = fresh(recvs);
        terminate_for(&mut s, &[u])
    };
    hit("row 1", one(0, send(1, 0, true, b"x")), DDP_ERR_U_NO_BUFFER);
    hit("row 2", one(1, send(1, 0, true, &[0; 65])), DDP_ERR_U_TOO_LONG);
    hit("row 3", one(1, send(2, 0, true, b"x")), DDP_ERR_U_MSN_RANGE);
    hit("row 4", one(1, send(1, 3, true, b"x")), DDP_ERR_U_INVALID_MO);
    hit(
        "row 5",
        one(1, untagged(op::SEND, qn::READ_REQUEST, 1, 0, true, b"x")),
        DDP_ERR_U_INVALID_QN,
    );
    let mut u = send(1, 0, true, b"x");
    u[0] &= !0x03;
    hit("row 6", one(1, u), DDP_ERR_U_INVALID_VERSION);
    let mut u = tagged(op::WRITE, 1, 0, true, b"x");
    u[0] &= !0x03;
    hit("row 7", one(1, u), DDP_ERR_T_INVALID_VERSION);
    hit("short ULPDU", one(1, vec![0x41, 0x40, 0]), DDP_LOCAL_CATASTROPHIC_ERR);
    let mut u = send(1, 0, true, b"x");
    u[1] = (u[1] & 0x3F) | 0x80;
    hit("row 21", one(1, u), RDMAP_ERR_INVALID_VERSION);
    hit(
        "row 22",
        one(1, untagged(0xC, qn::SEND, 1, 0, true, b"x")),
        RDMAP_ERR_UNEXPECTED_OPCODE,
    );
    let mut rq = read_request(ReadRequest {
        sink_stag: 1,
        sink_to: 0,
        size: 0,
        src_stag: 1,
        src_to: 0,
    });
    rq.push(0);
    hit("Read Request with payload", one(1, rq), RDMAP_ERR_UNSPECIFIED_OP);

    // Tagged buffers and Read Requests, against regions of one PD.
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let probe = side_in(&pd, 9, false, 2);
    let region = probe.reg_mr(4096, Access::all_remote() | Access::LOCAL_WRITE);
    let no_rights = probe.reg_mr(4096, Access::LOCAL_WRITE);
    let other = dev.alloc_pd().unwrap().reg_mr(4096, Access::all_remote()).unwrap();
    let (stag, base) = (region.rkey(), region.addr());
    let on = |us: Vec<Vec<u8>>| {
        let mut c = side_in(&pd, 9, false, 2);
        terminate_for(&mut c, &us)
    };
    let write = |stag, to, last| tagged(op::WRITE, stag, to, last, b"data");
    let rr = |stag, to, size| {
        read_request(ReadRequest {
            sink_stag: 0x99,
            sink_to: 0,
            size,
            src_stag: stag,
            src_to: to,
        })
    };
    hit("row 8", on(vec![write(0xdead_be00, 0, true)]), DDP_ERR_T_INVALID_STAG);
    hit("row 9", on(vec![write(stag, base + 4094, true)]), DDP_ERR_T_BASE_BOUNDS);
    hit(
        "row 10",
        on(vec![write(other.rkey(), other.addr(), true)]),
        DDP_ERR_T_STAG_NOT_ASSOCIATED,
    );
    hit("row 11", on(vec![write(stag, u64::MAX - 1, true)]), DDP_ERR_T_TO_WRAP);
    hit(
        "Write segment naming another STag (siw)",
        on(vec![write(stag, base, false), write(no_rights.lkey(), base + 4, true)]),
        DDP_ERR_T_INVALID_STAG,
    );
    hit(
        "Write segment not continuing the TO (siw)",
        on(vec![write(stag, base, false), write(stag, base + 8, true)]),
        DDP_ERR_T_BASE_BOUNDS,
    );
    hit("row 13", on(vec![rr(0xdead_be00, 0, 8)]), RDMAP_ERR_INVALID_STAG);
    hit("row 14", on(vec![rr(stag, base + 4090, 8)]), RDMAP_ERR_BASE_BOUNDS);
    hit(
        "row 15",
        on(vec![rr(no_rights.lkey(), no_rights.addr(), 8)]),
        RDMAP_ERR_ACCESS_RIGHTS,
    );
    hit(
        "row 16",
        on(vec![rr(other.rkey(), other.addr(), 8)]),
        RDMAP_ERR_STAG_NOT_ASSOCIATED,
    );
    hit("row 17", on(vec![rr(stag, u64::MAX - 3, 8)]), RDMAP_ERR_TO_WRAP);
    let reqs = (1..=3)
        .map(|msn| {
            let r = ReadRequest {
                sink_stag: 0x99,
                sink_to: 0,
                size: 8,
                src_stag: stag,
                src_to: base,
            };
            untagged(
                op::READ_REQUEST,
                qn::READ_REQUEST,
                msn,
                0,
                true,
                &encoded(28, |b| r.emit(b)),
            )
        })
        .collect();
    hit("row 19 (IRD 2)", on(reqs), RDMAP_ERR_CATASTROPHIC_STREAM);
    hit(
        "row 23",
        on(vec![tagged(op::READ_RESPONSE, stag, base, true, b"x")]),
        RDMAP_ERR_UNEXPECTED_OPCODE,
    );
    let inv = |stag: u32| {
        let mut c = side_in(&pd, 9, false, 2);
        let m = c.reg_mr(64, Access::LOCAL_WRITE);
        c.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: vec![m.sge(0, 64)],
        }])
        .unwrap();
        let mut u = untagged(op::SEND_INV, qn::SEND, 1, 0, true, b"x");
        u[2..6].copy_from_slice(&stag.to_be_bytes());
        terminate_for(&mut c, &[u])
    };
    hit(
        "row 20 (another PD's STag)",
        inv(other.rkey()),
        RDMAP_ERR_CANNOT_INVALIDATE_PROT,
    );
    hit(
        "row 20 (unknown STag)",
        inv(0xdead_be00),
        RDMAP_ERR_CANNOT_INVALIDATE_OP,
    );

    // Row 28: the receive's memory went away after it was posted.
    let (_d, mut c, mrs) = fresh(1);
    drop(mrs);
    hit(
        "row 28",
        terminate_for(&mut c, &[send(1, 0, true, b"x")]),
        RDMAP_LOCAL_CATASTROPHIC_ERR,
    );

    // LLP: CRC (row 26), markers (row 27).
    let dev = device();
    let mut c = side(&dev, 9, true, 2);
    let mut f = Vec::new();
    Framer::new(true, false)
        .emit_vec(&send(1, 0, true, b"x"), &mut f)
        .unwrap();
    let n = f.len();
    f[n - 1] ^= 0x5A;
    hit(
        "row 26",
        inject_raw(&mut c, &f).terminates.first().map(|t| t.cause),
        MPA_ERR_CRC,
    );
    let mut c = Side::new(
        &dev.alloc_pd().unwrap(),
        SideConfig {
            markers_rx: true,
            ..SideConfig::default()
        },
    );
    // One FPDU across the marker at stream offset 512, its pointer bent.
    let mut f = Vec::new();
    Framer::new(false, true)
        .emit_vec(&send(1, 0, true, &[0; 1000]), &mut f)
        .unwrap();
    f[512 + 3] ^= 0x04;
    hit(
        "row 27",
        inject_raw(&mut c, &f).terminates.first().map(|t| t.cause),
        MPA_ERR_MARKER,
    );

    // RFC 6581 §4: the responder expects a Send RTR; a Write is not one.
    let dev = device();
    let mut c = side(&dev, 9, false, 2);
    c.p.rtr = Some(RtrRole::Expect(crate::wire::mpa::Rtr::Send));
    hit(
        "no matching RTR",
        terminate_for(&mut c, &[tagged(op::WRITE, 1, 0, true, b"")]),
        MPA_ERR_NO_MATCHING_RTR,
    );

    let missing: Vec<_> = emitted.difference(&reached).collect();
    assert!(
        missing.is_empty(),
        "emitted but not reached through the core: {missing:?}"
    );
    let extra: Vec<_> = reached.difference(&emitted).collect();
    assert!(extra.is_empty(), "reached but not found in the code: {extra:?}");
}

/// RFC 5041 §4.3: MSN wraps from 2^32-1 to 0; RDMAP-SND-01: a zero-length
/// Send consumes exactly one receive; RDMAP-ORD-16 / RDMAP-LLP-04: a
/// multi-segment Send completes on L with length MO + payload, while Read
/// Response segments and a Read Request arrive between its segments
/// (catalogue A.4.2).
#[test]
fn untagged_sequencing_and_reassembly() {
    // MSN wrap and zero-length Sends.
    let (_d, mut s, m) = fresh(3);
    s.p.rx_msn[0] = u32::MAX;
    let send = |msn, mo, last, body: &[u8]| untagged(op::SEND, qn::SEND, msn, mo, last, body);
    let a = inject(
        &mut s,
        &[
            send(u32::MAX, 0, true, b""),
            send(0, 0, true, b"ab"),
            send(1, 0, true, b""),
        ],
    );
    assert!(a.terminates.is_empty(), "{:?}", a.terminates);
    let wcs: Vec<_> = std::iter::from_fn(|| s.cq.poll_one())
        .map(|w| (w.wr_id, w.status, w.byte_len))
        .collect();
    assert_eq!(
        wcs,
        [
            (100, WcStatus::Success, 0),
            (101, WcStatus::Success, 2),
            (102, WcStatus::Success, 0)
        ]
    );
    assert_eq!(m[0].to_vec(64, 2).unwrap(), b"ab");
    assert_eq!(s.p.rx_msn[0], 2);

    // A Send in three segments with a Read Response and a Read Request
    // between them.
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let mut s = side_in(&pd, 9, false, 4);
    let recv = s.reg_mr(4096, Access::LOCAL_WRITE);
    let sink = s.reg_mr(4096, Access::LOCAL_WRITE);
    let src = s.reg_mr(4096, Access::all_remote());
    s.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: vec![recv.sge(0, 4096)],
    }])
    .unwrap();
    s.post_send(&[SendWr::new(
        8,
        WrOpcode::RdmaRead {
            remote: RemoteAddr { addr: 0, rkey: 0x77 },
        },
        vec![sink.sge(0, 128)],
    )])
    .unwrap();
    let _ = s.take_output();
    let body = pattern(250, 5);
    let resp = pattern(128, 6);
    let rr = ReadRequest {
        sink_stag: 0x99,
        sink_to: 0,
        size: 8,
        src_stag: src.rkey(),
        src_to: src.addr(),
    };
    let a = inject(
        &mut s,
        &[
            send(1, 0, false, &body[..100]),
            tagged(op::READ_RESPONSE, sink.lkey(), sink.addr(), false, &resp[..64]),
            send(1, 100, false, &body[100..200]),
            read_request(rr),
            tagged(op::READ_RESPONSE, sink.lkey(), sink.addr() + 64, true, &resp[64..]),
            send(1, 200, true, &body[200..]),
        ],
    );
    assert!(a.terminates.is_empty(), "{:?}", a.terminates);
    let wcs: Vec<_> = std::iter::from_fn(|| s.cq.poll_one())
        .map(|w| (w.wr_id, w.status, w.byte_len))
        .collect();
    assert_eq!(wcs, [(8, WcStatus::Success, 128), (7, WcStatus::Success, 250)]);
    assert_eq!(recv.to_vec(0, 250).unwrap(), body);
    assert_eq!(sink.to_vec(0, 128).unwrap(), resp);
    // The Read Request was answered: one Read Response went out.
    assert_eq!(s.p.rx_msn[1], 2, "Read Request accepted");
}

/// Checks the core carries over from the deleted `proto::ddp_rx`, as Linux
/// siw makes them: one message's segments keep their opcode, and a second
/// tagged message may not cut into the first ("packet intersection").
#[test]
fn segments_of_one_message_stay_together() {
    let (_d, mut s, _m) = fresh(1);
    let t = terminate_for(
        &mut s,
        &[
            untagged(op::SEND, qn::SEND, 1, 0, false, b"abc"),
            untagged(op::SEND_SE, qn::SEND, 1, 3, true, b"d"),
        ],
    );
    assert_eq!(
        t,
        Some(cause::RDMAP_ERR_UNEXPECTED_OPCODE),
        "opcode change within a Send"
    );

    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let mut s = side_in(&pd, 9, false, 2);
    let region = s.reg_mr(4096, Access::all_remote());
    let sink = s.reg_mr(4096, Access::LOCAL_WRITE);
    s.post_send(&[SendWr::new(
        8,
        WrOpcode::RdmaRead {
            remote: RemoteAddr { addr: 0, rkey: 0x77 },
        },
        vec![sink.sge(0, 64)],
    )])
    .unwrap();
    let _ = s.take_output();
    let t = terminate_for(
        &mut s,
        &[
            tagged(op::WRITE, region.rkey(), region.addr(), false, b"abcd"),
            tagged(op::READ_RESPONSE, sink.lkey(), sink.addr(), true, &[1; 64]),
        ],
    );
    assert_eq!(
        t,
        Some(cause::RDMAP_ERR_UNEXPECTED_OPCODE),
        "a Read Response cutting into a Write"
    );
    assert_eq!(sink.to_vec(0, 64).unwrap(), vec![0; 64], "nothing placed");

    // A Write in several segments, each continuing the last, is fine.
    let mut s = side_in(&pd, 9, false, 2);
    let t = terminate_for(
        &mut s,
        &[
            tagged(op::WRITE, region.rkey(), region.addr(), false, b"abcd"),
            tagged(op::WRITE, region.rkey(), region.addr() + 4, false, b""),
            tagged(op::WRITE, region.rkey(), region.addr() + 4, true, b"ef"),
        ],
    );
    assert_eq!(t, None);
    assert_eq!(region.to_vec(0, 6).unwrap(), b"abcdef");
}

/// RDMAP-LLP-02 / RDMAP-LLP-04 on the wire the core sends: every message
/// length class cut at a MULPDU of 1500, each segment within it, TO =
/// message TO + offset, MO = offset, L only on the last, and the receiving
/// core reassembles it (catalogue C.1.2, E.2).
#[test]
fn segmentation_on_the_wire_llp04() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cfg = SideConfig {
        max_ulpdu: 1500,
        ..SideConfig::default()
    };
    let mut a = Side::new(&pd, SideConfig { qpn: 1, ..cfg });
    let mut b = Side::new(&pd, SideConfig { qpn: 2, ..cfg });
    let a_mem = a.reg_mr(1 << 20, Access::LOCAL_WRITE);
    let b_mem = b.reg_mr(1 << 20, Access::all_remote() | Access::LOCAL_WRITE);
    let data = pattern(1 << 20, 9);
    a_mem.write(0, &data).unwrap();
    for (i, len) in [0usize, 1, 3, 4, 1481, 1482, 1483, 1485, 1486, 1487, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let send = len <= 4096;
        if send {
            b.post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: vec![b_mem.sge(0, 4096)],
            }])
            .unwrap();
        }
        let op = if send {
            WrOpcode::Send
        } else {
            WrOpcode::RdmaWrite {
                remote: RemoteAddr {
                    addr: b_mem.addr(),
                    rkey: b_mem.rkey(),
                },
            }
        };
        a.post_send(&[SendWr::new(i as u64, op, vec![a_mem.sge(0, len as u32)])])
            .unwrap();
        let mut wire = Vec::new();
        loop {
            let out = a.take_output();
            if out.is_empty() {
                break;
            }
            wire.extend_from_slice(&out);
        }
        let mut d = Deframer::new(DeframerConfig::default());
        let (mut at, mut off, mut segs) = (0, 0usize, 0);
        while at < wire.len() {
            let (used, u) = d.next_fpdu(&wire[at..]).unwrap();
            at += used;
            let seg = ddp::Segment::parse(u.unwrap()).unwrap();
            assert!(seg.buffer_len() <= 1500, "len {len}: segment within MULPDU");
            match seg.header.addr {
                Addr::Tagged { to, .. } => assert_eq!(to, b_mem.addr() + off as u64, "len {len}: TO"),
                Addr::Untagged { mo, .. } => assert_eq!(mo as usize, off, "len {len}: MO"),
            }
            off += seg.payload.len();
            segs += 1;
            assert_eq!(seg.header.last, off == len, "len {len}: L only on the last");
        }
        let room = 1500 - if send { 18 } else { 14 };
        assert_eq!(segs, len.div_ceil(room).max(1), "len {len}: segment count");
        b.feed(&wire);
        assert_eq!(b_mem.to_vec(0, len).unwrap(), data[..len], "len {len}: reassembled");
        assert!(a.poll_cq().is_some_and(|w| w.status == WcStatus::Success));
        if send {
            assert!(b.poll_cq().is_some_and(|w| w.byte_len as usize == len));
        }
        b_mem.write(0, &vec![0; len.min(4096)]).unwrap();
    }
}

/// Direct placement (`rx_buf.rs`) in memory: large Writes and Read Responses
/// read a few KiB at a time, as a socket returns them, land straight in the
/// region with the CRC checked afterwards; a bad CRC on a directly placed
/// FPDU is row 26 (2/0/0x02).
#[test]
fn direct_placement_in_memory() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let mut a = side_in(&pd, 1, true, 16);
    let mut b = side_in(&pd, 2, true, 16);
    a.set_chunk(5000);
    b.set_chunk(5000);
    let a_mem = a.reg_mr(1 << 20, Access::LOCAL_WRITE);
    let b_mem = b.reg_mr(1 << 20, Access::all_remote());
    let data = pattern(600_000, 4);
    a_mem.write(0, &data).unwrap();
    b_mem.write(0, &data).unwrap();
    let remote = RemoteAddr {
        addr: b_mem.addr(),
        rkey: b_mem.rkey(),
    };
    a.post_send(&[
        SendWr::new(1, WrOpcode::RdmaWrite { remote }, vec![a_mem.sge(0, 300_000)]),
        SendWr::new(2, WrOpcode::RdmaRead { remote }, vec![a_mem.sge(400_000, 200_000)]),
    ])
    .unwrap();
    // The first read of the Write's first FPDU starts direct placement.
    let wire = a.take_output();
    b.feed(&wire[..5000]);
    assert!(b.rx.direct.is_some(), "direct placement started");
    b.feed(&wire[5000..]);
    settle(&mut a, &mut b);
    let wcs: Vec<_> = std::iter::from_fn(|| a.poll_cq())
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(wcs, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(b_mem.to_vec(0, 300_000).unwrap(), data[..300_000]);
    assert_eq!(a_mem.to_vec(400_000, 200_000).unwrap(), data[..200_000]);

    // A corrupted CRC on a directly placed FPDU.
    a.post_send(&[SendWr::new(
        3,
        WrOpcode::RdmaWrite { remote },
        vec![a_mem.sge(0, 60_000)],
    )])
    .unwrap();
    let mut wire = a.take_output();
    let n = wire.len();
    wire[n - 1] ^= 0x5A;
    b.feed(&wire[..5000]);
    assert!(b.rx.direct.is_some());
    let answer = inject_raw(&mut b, &wire[5000..]);
    expect(answer, (2, 0, 0x02), "row 26, direct placement");
}

/// Issue 18, session 15 (RDMAP-SND-01, SEC-STAG-02): a Send posted to an idle send
/// queue is framed by the transmit pass that follows its post (`IwarpQp::with_core`),
/// so its SGE is looked up once, for the post-time check and the framing together.
#[test]
fn a_send_posted_to_an_idle_queue_looks_its_sge_up_once_rdmap_snd_01() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let mut s = side_in(&pd, 9, false, 4);
    let mr = s.reg_mr(4096, Access::LOCAL_READ);
    mr.write(0, b"ping-pong").unwrap();
    let before = verbs::mem::thread_mem_lookups();
    // As `IwarpQp::with_core`: the post, its transmit pass, then the resolution ends.
    s.p.post_send(&[SendWr::new(5, WrOpcode::Send, vec![mr.sge(0, 9)])])
        .unwrap();
    assert!(s.p.fill_tx());
    s.p.expire_posted();
    assert_eq!(
        verbs::mem::thread_mem_lookups() - before,
        1,
        "one lookup for post and framing"
    );
    let out = s.take_output();
    assert!(out.windows(9).any(|w| w == b"ping-pong"), "the payload left");
    let wc = s.poll_cq().expect("the Send's completion");
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
}

/// SEC-STAG-02: a Send not framed in its post's transmit pass is resolved again when
/// it is framed; its region deregistered in between fails it with a local protection
/// error (nothing from the freed region is sent), as before session 15.
#[test]
fn a_send_whose_region_goes_away_before_it_is_framed_fails_sec_stag_02() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let mut s = side_in(&pd, 9, false, 4);
    let mr = s.reg_mr(4096, Access::LOCAL_READ);
    mr.write(0, b"secret!!").unwrap();
    let before = verbs::mem::thread_mem_lookups();
    // The harness's post is not followed by a transmit pass: the post-time resolution ends.
    s.post_send(&[SendWr::new(6, WrOpcode::Send, vec![mr.sge(0, 8)])])
        .unwrap();
    assert!(s.p.posted.is_none(), "nothing resolved at post outlives the post");
    drop(mr);
    let out = s.take_output();
    assert_eq!(
        verbs::mem::thread_mem_lookups() - before,
        2,
        "checked at post, again when framed"
    );
    assert!(
        !out.windows(8).any(|w| w == b"secret!!"),
        "nothing of the freed region left"
    );
    let wc = s.poll_cq().expect("the Send's completion");
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::LocProtErr));
}

/// The small one-segment work requests of the latency benches, with the flags that
/// change their headers, over one region of `len` octets at `mr`'s address.
fn lean_cases(mr: &MemoryRegion, remote: RemoteAddr) -> Vec<SendWr> {
    let mut v = Vec::new();
    let mut id = 100;
    let mut add = |opcode: WrOpcode, len: u32, flags: SendFlags| {
        id += 1;
        let mut w = SendWr::new(id, opcode, if len == 0 { vec![] } else { vec![mr.sge(3, len)] });
        w.flags = flags;
        v.push(w);
    };
    for len in [0, 1, 8, 64, 255, 256, 257] {
        add(WrOpcode::Send, len, SendFlags::SIGNALED);
    }
    add(WrOpcode::Send, 8, SendFlags::SIGNALED | SendFlags::SOLICITED);
    add(WrOpcode::Send, 8, SendFlags::empty());
    add(
        WrOpcode::SendWithInv {
            invalidate_rkey: 0x1234_5678,
        },
        8,
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    );
    for len in [8, 64, 256, 300] {
        add(WrOpcode::RdmaWrite { remote }, len, SendFlags::SIGNALED);
    }
    // A Read, then a Send behind it (it may not complete first: the general path).
    add(WrOpcode::RdmaRead { remote }, 64, SendFlags::SIGNALED);
    add(WrOpcode::Send, 8, SendFlags::SIGNALED);
    add(WrOpcode::RdmaRead { remote }, 8, SendFlags::SIGNALED | SendFlags::FENCE);
    v
}

/// RDMAP-SND-01, RDMAP-WR-01, RDMAP-RD-01, MPA-FPDU (issue 18, session 17): a work
/// request posted on the lean path (`post_send_owned`, `lean.rs`) puts on the wire the
/// octets the general path frames for it (MSN per queue, QN, MO 0, L, STag/TO, the Read
/// Request's header, pad, CRC on and off), and completes alike, in order; the lean path
/// ran for the small one-segment requests it is for, not for the others.
#[test]
fn the_lean_path_sends_the_octets_the_general_path_does_rdmap_snd_01() {
    for crc in [false, true] {
        let dev = device();
        let pd = dev.alloc_pd().unwrap();
        let mut general = side_in(&pd, 3, crc, 4);
        let mut lean = side_in(&pd, 3, crc, 4);
        let mem = general.reg_mr(4096, Access::LOCAL_WRITE);
        mem.write(0, &pattern(4096, 9)).unwrap();
        let remote = RemoteAddr {
            addr: 0x10_0000,
            rkey: 0xabcd_ef01,
        };
        let (mut lean_ran, mut lean_expected) = (0, 0);
        for wr in lean_cases(&mem, remote) {
            let small = wr
                .sg_list
                .first()
                .is_none_or(|s| s.length as usize <= lean::LEAN_PAYLOAD);
            let behind_read = !lean.p.slots.is_empty();
            let read_fenced = matches!(wr.opcode, WrOpcode::RdmaRead { .. }) && !lean.p.orq.is_empty();
            let is_read = matches!(wr.opcode, WrOpcode::RdmaRead { .. });
            if small && !read_fenced && (is_read || !behind_read) {
                lean_expected += 1;
            }
            general.post_send(std::slice::from_ref(&wr)).unwrap();
            let before = lean::lean_posts();
            lean.post_send_one(wr.clone()).unwrap();
            lean_ran += lean::lean_posts() - before;
            let (g, l) = (general.take_output(), lean.take_output());
            assert_eq!(l, g, "crc {crc}, wr {} ({:?})", wr.wr_id, wr.opcode);
            let g: Vec<_> = std::iter::from_fn(|| general.poll_cq())
                .map(|w| format!("{w:?}"))
                .collect();
            let l: Vec<_> = std::iter::from_fn(|| lean.poll_cq())
                .map(|w| format!("{w:?}"))
                .collect();
            assert_eq!(l, g, "completions of wr {}", wr.wr_id);
        }
        assert_eq!(lean_ran, lean_expected, "the lean path ran for the small requests only");
        assert_eq!(lean_ran, 13, "the cases' small one-segment requests");
        assert_eq!((general.p.state, lean.p.state), (QpState::Rts, QpState::Rts));
    }
}

/// RDMAP-ORD-14 (issue 18, session 17): a lean message the socket took only part of
/// (or none of: `EAGAIN`) moves onto the general transmit queue; the rest leaves after
/// it, before anything posted later, and it completes only when its last octet left.
#[test]
fn a_lean_message_written_in_part_completes_when_the_rest_left_rdmap_ord_14() {
    for taken in [0usize, 1, 5, 31] {
        let dev = device();
        let pd = dev.alloc_pd().unwrap();
        let mut s = side_in(&pd, 9, true, 4);
        let mem = s.reg_mr(4096, Access::LOCAL_READ);
        mem.write(0, b"0123456789abcdef").unwrap();
        s.post_send_one(SendWr::new(1, WrOpcode::Send, vec![mem.sge(0, 16)]))
            .unwrap();
        let whole = s.p.lean_bytes().to_vec();
        assert_eq!(whole.len(), 2 + 18 + 16 + 4, "framed on the lean path (no pad)");
        s.p.lean_written(taken);
        assert!(s.poll_cq().is_none(), "not complete before its last octet left");
        s.post_send_one(SendWr::new(2, WrOpcode::Send, vec![mem.sge(0, 4)]))
            .unwrap();
        assert!(s.p.lean_bytes().is_empty(), "queued behind it: the general path");
        let rest = s.take_output();
        assert_eq!(&rest[..whole.len() - taken], &whole[taken..], "the rest first");
        let ids: Vec<_> = std::iter::from_fn(|| s.poll_cq())
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(ids, [(1, WcStatus::Success), (2, WcStatus::Success)]);
        // The stream parses: the second Send carries the next MSN.
        let mut d = Deframer::new(DeframerConfig {
            crc: true,
            ..Default::default()
        });
        let mut stream = whole[..taken].to_vec();
        stream.extend_from_slice(&rest);
        let (mut msns, mut at) = (Vec::new(), 0);
        while at < stream.len() {
            let (used, u) = d.next_fpdu(&stream[at..]).expect("the FPDUs deframe, CRC checked");
            at += used;
            if let Some(u) = u
                && let Ok(h) = Header::parse(u)
                && let Addr::Untagged { msn, .. } = h.addr
            {
                msns.push(msn);
            }
        }
        assert_eq!(msns, [1, 2]);
    }
}

/// SEC-STAG-02 (issue 18, session 17): the lean path checks an lkey through the QP's
/// snapshot of its registration, which a deregistration invalidates: a post naming a
/// region that went away is refused (`bad_wr`, local protection) and sends nothing.
#[test]
fn a_lean_post_naming_a_deregistered_region_is_refused_sec_stag_02() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let mut s = side_in(&pd, 9, false, 4);
    let mem = s.reg_mr(4096, Access::LOCAL_READ);
    let sge = mem.sge(0, 8);
    s.post_send_one(SendWr::new(1, WrOpcode::Send, vec![sge])).unwrap();
    assert!(!s.take_output().is_empty());
    assert_eq!(s.poll_cq().map(|w| w.status), Some(WcStatus::Success));
    drop(mem);
    let before = lean::lean_posts();
    let r = s.post_send_one(SendWr::new(2, WrOpcode::Send, vec![sge]));
    assert!(
        matches!(
            r,
            Err(Error::BadWr {
                error: WrError::LocalProtection { .. },
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(lean::lean_posts(), before);
    assert!(s.take_output().is_empty(), "nothing sent");
    assert!(s.poll_cq().is_none());
}
