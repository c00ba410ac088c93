//! The protocol core ([`Proto`]) tested in memory, the way quinn-proto tests
//! connections: no socket, no thread, no clock. Two cores are wired back to
//! back through their transmit queues and the same deframer and ULPDU entry
//! points `io.rs` uses (`Deframer::next_fpdu`, `Proto::on_ulpdu`,
//! `Proto::on_stream_error`); loss of the TCP stream is excluded. A scripted
//! side injects malformed ULPDUs or FPDUs into one core and reads back the
//! Terminate it queues, so the rows of the Error -> Terminate matrix
//! (catalogue A.4.6) are reachable without sockets.

use super::tx::encoded;
use super::*;
use crate::wire::fpdu::{Deframer, DeframerConfig, Framer};
use std::net::SocketAddr;
use verbs::provider::{Provider, QpCreate, QpOps};
use verbs::{Access, Device, DeviceAttr, MemoryRegion, ProtectionDomain, RemoteAddr};

/// A provider with no transport and no connection manager: the cores are
/// made and driven by hand.
struct NoTransport;

impl Provider for NoTransport {
    fn query_device(&self) -> DeviceAttr {
        crate::engine::device_attr()
    }
    fn create_qp(&self, _req: QpCreate) -> Result<Arc<dyn QpOps>> {
        Err(Error::NotSupported("in-memory test device".into()))
    }
}

fn device() -> Device {
    Device::new("mem0", Arc::new(NoTransport) as Arc<dyn Provider>, None)
}

/// One core with what its application holds, and the receive side of the
/// in-memory stream that feeds it.
struct Side {
    p: Proto,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    events: Arc<EventQueue<CmEvent>>,
    deframer: Deframer,
    inbox: Vec<u8>,
}

fn side(dev: &Device, qpn: u32, crc: bool, ird: u32) -> Side {
    side_in(&dev.alloc_pd().unwrap(), qpn, crc, ird)
}

/// A core whose stream belongs to protection domain `pd`.
fn side_in(pd: &ProtectionDomain, qpn: u32, crc: bool, ird: u32) -> Side {
    let dev = pd.device();
    let pd = pd.clone();
    let cq = dev.create_cq(4096).unwrap();
    let events = Arc::new(EventQueue::new());
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let neg = Negotiated {
        crc,
        markers_tx: false,
        markers_rx: false,
        ird,
        ord: 16,
        rtr: None,
        info: ConnInfo {
            local_addr: addr,
            peer_addr: addr,
            responder_resources: ird,
            initiator_depth: 16,
            peer_private_data: Vec::new(),
            detail: String::new(),
        },
    };
    let attr = QpInitAttr {
        max_send_wr: 256,
        max_recv_wr: 256,
        ..QpInitAttr::default()
    };
    let p = Proto::new(
        qpn,
        pd.id(),
        dev.mem_table(),
        cq.clone(),
        cq.clone(),
        events.clone(),
        attr,
        &neg,
        false,
        65_528,
    );
    Side {
        p,
        pd,
        cq,
        events,
        deframer: Deframer::new(DeframerConfig {
            crc,
            ..Default::default()
        }),
        inbox: Vec::new(),
    }
}

/// Moves what `from` has framed into `to`'s inbox, as a lossless TCP
/// stream would, and lets `to` process every whole FPDU in it.
fn carry(from: &mut Side, to: &mut Side) -> bool {
    from.p.fill_tx();
    let mut bytes = Vec::new();
    let n = from.p.tx_queue().copy_pending(&mut bytes);
    if n > 0 {
        from.p.consumed_out(n);
    }
    to.inbox.extend_from_slice(&bytes);
    deliver(to) || n > 0
}

/// The receive loop of `io.rs` without the socket.
fn deliver(s: &mut Side) -> bool {
    let mut any = false;
    let mut at = 0;
    while at < s.inbox.len() {
        match s.deframer.next_fpdu(&s.inbox[at..]) {
            Ok((used, u)) => {
                if let Some(u) = u {
                    let u = u.to_vec();
                    s.p.on_ulpdu(&u);
                    any = true;
                }
                at += used;
                if used == 0 {
                    break;
                }
            }
            Err(e) => {
                s.p.on_stream_error(Some(e.cause()), "MPA framing error");
                at = s.inbox.len();
                any = true;
            }
        }
    }
    s.inbox.drain(..at);
    any
}

/// Runs both directions until neither moves.
fn settle(a: &mut Side, b: &mut Side) {
    for _ in 0..10_000 {
        let moved = carry(a, b) | carry(b, a);
        if !moved {
            return;
        }
    }
    panic!("the cores did not settle");
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
    s.inbox.extend_from_slice(fpdus);
    deliver(s);
    s.p.fill_tx();
    let mut out = Vec::new();
    let n = s.p.tx_queue().copy_pending(&mut out);
    s.p.consumed_out(n);
    let mut d = Deframer::new(DeframerConfig {
        crc: s.deframer.config().crc,
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
    let mut framer = Framer::new(s.deframer.config().crc, false);
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
        a.events
            .iter()
            .any(|e| matches!(e, CmEvent::ErrorSent(d)
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
    let other_pd = s.pd.device().alloc_pd().unwrap().reg_mr(4096, Access::all_remote()).unwrap();
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
    c.inbox.extend_from_slice(&bytes);
    deliver(&mut c);
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
