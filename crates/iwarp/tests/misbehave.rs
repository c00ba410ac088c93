//! A scripted misbehaving peer against our iWARP provider: one test per row of
//! the Error -> Terminate matrix (catalogue A.4.6). The raw peer (see
//! `rawpeer`) speaks MPA/DDP/RDMAP from bytes; the implementation under test
//! (IUT) is a QP of our provider accepting its connection.
//!
//! Every row checks, as A.4.6 requires: exactly one Terminate, with the
//! layer/type/code and M/D/R of the row, the echoed DDP header and RDMA header
//! byte for byte; nothing after it and a graceful close (FIN); the IUT's ULP
//! gets a `TerminateSent` event with the same cause; posted receives are
//! flushed (WR_FLUSH_ERR); and another connection of the same device keeps
//! working (RDMAP-TRM-02, RDMAP-TRM-06, RDMAP-STR-*).

mod rawpeer;

use iwarp::wire::ddp;
use iwarp::wire::rdmap::{AtomicOp, AtomicRequest, ReadRequest};
use rawpeer::*;
use std::time::Duration;
use verbs::*;

const T: Duration = Duration::from_secs(10);

struct Iut {
    _dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    peer: RawPeer,
    /// A healthy connection on the same device (client, server, their CQs).
    other: (QueuePair, QueuePair, CompletionQueue, CompletionQueue),
}

/// A device listening; the raw peer connects with `ask` and the IUT accepts
/// with IRD/ORD `ird`/4, posting `recvs` receives of 64 bytes each.
fn iut_with(ask: Ask, ird: u8, recvs: usize) -> Iut {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let cq = dev.create_cq(1024).unwrap();
    let peer = RawPeer::start(addr, &ask);
    let req = listener.get_request(Some(T)).unwrap();
    let qp = req.accept(&pd, QpOptions::new(&cq).rd_atomic(ird, 4)).unwrap();
    let peer = peer.finish(&ask);
    assert_eq!(qp.get_event(Some(T)), Some(CmEvent::Established));
    if recvs > 0 {
        let mr = pd.reg_mr(64 * recvs, Access::LOCAL_WRITE).unwrap();
        let wrs: Vec<RecvWr> = (0..recvs)
            .map(|i| RecvWr {
                wr_id: 100 + i as u64,
                sg_list: vec![mr.sge(64 * i, 64)],
            })
            .collect();
        qp.post_recv(&wrs).unwrap();
        std::mem::forget(mr); // keep it registered for the test's life
    }
    // The healthy neighbour.
    let (cq_c, cq_s) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let (pd2, cqs2) = (pd.clone(), cq_s.clone());
    let l2 = std::thread::spawn(move || {
        let r = listener.get_request(Some(T)).unwrap();
        r.accept(&pd2, QpOptions::new(&cqs2)).unwrap()
    });
    let c = pd.connect(addr, QpOptions::new(&cq_c), T).unwrap();
    let s = l2.join().unwrap();
    Iut {
        _dev: dev,
        pd,
        cq,
        qp,
        peer,
        other: (c, s, cq_c, cq_s),
    }
}

fn iut(recvs: usize) -> Iut {
    iut_with(Ask::default(), 4, recvs)
}

/// What a row expects.
struct Expect {
    layer: u8,
    etype: u8,
    code: u8,
    m: bool,
    d: bool,
    /// The Read Request echoed in the Terminated RDMA header (R bit).
    rdma: Option<ReadRequest>,
}

const fn e(layer: u8, etype: u8, code: u8, mdr: (bool, bool)) -> Expect {
    Expect {
        layer,
        etype,
        code,
        m: mdr.0,
        d: mdr.1,
        rdma: None,
    }
}

const MD: (bool, bool) = (true, true);
const NONE: (bool, bool) = (false, false);

impl Iut {
    /// Reads the IUT's answer to `offending` and checks everything A.4.6 asks.
    fn expect_terminate(mut self, offending: &[u8], x: Expect) {
        let got = self.peer.read_to_end();
        let terms = got.terminates();
        assert_eq!(
            terms.len(),
            1,
            "RDMAP-TRM-02: exactly one Terminate, got {}",
            terms.len()
        );
        assert!(
            std::ptr::eq(*terms.last().unwrap(), got.ulpdus.last().unwrap()),
            "RDMAP-TRM-06: nothing after the Terminate"
        );
        assert!(got.eof, "graceful close (FIN) after the Terminate");
        assert_eq!(got.trailing, 0, "no partial FPDU after the Terminate");
        let t = decode_terminate(terms[0]);
        let c = t.cause;
        assert_eq!(
            (c.layer.to_nibble(), c.etype, c.code),
            (x.layer, x.etype, x.code),
            "layer/type/code ({c})"
        );
        assert_eq!(
            (t.seg_len_valid, t.ddp.is_some(), t.rdma.is_some()),
            (x.m, x.d, x.rdma.is_some()),
            "M/D/R"
        );
        if let Some(d) = &t.ddp {
            let hlen = ddp::header_len_for(offending[0]);
            assert_eq!(
                d.header.as_bytes(),
                &offending[..hlen],
                "echoed DDP header, byte for byte"
            );
            assert_eq!(
                d.seg_len as usize,
                offending.len(),
                "DDP Segment Length = ULPDU length (A.5 #1)"
            );
        }
        assert_eq!(t.rdma, x.rdma, "echoed RDMA header (RDMAP-HDR-13)");
        // The IUT's ULP learns it, with the same cause.
        match self.qp.get_event(Some(T)) {
            Some(CmEvent::ErrorSent(d)) => {
                let i = d.downcast_ref::<iwarp::TerminateInfo>().expect("an iWARP Terminate");
                assert_eq!((i.layer, i.etype, i.code), (x.layer, x.etype, x.code))
            }
            other => panic!("expected TerminateSent, got {other:?}"),
        }
        assert_eq!(self.qp.state(), QpState::Err);
        // Posted receives not consumed are flushed.
        while let Some(wc) = self.cq.poll_one() {
            if wc.opcode == WcOpcode::Recv && wc.wr_id >= 100 {
                assert_eq!(wc.status, WcStatus::WrFlushErr, "{wc:?}");
            }
        }
        self.neighbour_still_works();
    }

    fn neighbour_still_works(&self) {
        let (c, s, cq_c, cq_s) = &self.other;
        let mr = self.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
        s.post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: vec![mr.sge(2048, 64)],
        }])
        .unwrap();
        mr.write(0, b"still here").unwrap();
        c.post_send_one(SendWr::new(8, WrOpcode::Send, vec![mr.sge(0, 10)]))
            .unwrap();
        assert_eq!(cq_c.wait(Some(T)).unwrap().status, WcStatus::Success);
        let wc = cq_s.wait(Some(T)).unwrap();
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 10));
        assert_eq!(mr.to_vec(2048, 10).unwrap(), b"still here");
    }
}

fn send(msn: u32, body: &[u8]) -> Vec<u8> {
    untagged(op::SEND, 0, msn, 0, true, 0, body)
}

#[test]
fn row01_send_without_receive_ddp_no_buffer() {
    let mut i = iut(0);
    let u = send(1, b"hello");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 2, 0x02, MD));
}

/// After its Terminate the IUT processes nothing more (RDMAP-TRM-06) but keeps reading and
/// dropping the stream until the peer closes, so that its own close is a FIN: a socket closed
/// with unread bytes sends an RST, which can overtake the Terminate (Linux siw then never
/// logs it: interop_siw D6 failed that way). The peer sends 64 KB after the offending Send
/// and half-closes; the IUT reaches end of stream (Disconnected after TerminateSent), and
/// once the QP is gone the peer reads the Terminate and a FIN, no reset.
#[test]
fn after_its_terminate_the_iut_drains_the_stream_and_closes_with_fin() {
    let mut i = iut(0);
    let u = send(1, b"hello");
    i.peer.send(&u);
    let junk = send(2, &[0x5a; 1000]);
    // 64 KB: within the socket buffers, so the peer never blocks on a reader that stopped
    for _ in 0..64 {
        i.peer.send(&junk);
    }
    i.peer.shutdown_write();
    match i.qp.get_event(Some(T)) {
        Some(CmEvent::ErrorSent(d)) => {
            let t = d.downcast_ref::<iwarp::TerminateInfo>().expect("an iWARP Terminate");
            assert_eq!((t.layer, t.etype, t.code), (1, 2, 0x02))
        }
        other => panic!("expected TerminateSent, got {other:?}"),
    }
    assert_eq!(
        i.qp.get_event(Some(T)),
        Some(CmEvent::Disconnected),
        "the IUT read the stream to its end after the Terminate"
    );
    let Iut { qp, peer, .. } = i;
    drop(qp);
    let mut peer = peer;
    let got = peer.read_to_end();
    assert_eq!(got.terminates().len(), 1, "the Terminate arrived");
    assert!(got.eof, "a FIN, not a reset, after the Terminate");
}

#[test]
fn row02_send_longer_than_receive_ddp_too_long() {
    // RDMAP-SND-02; A.5: we send 0x05 (siw sends 0x02).
    let mut i = iut(2);
    let u = send(1, &[7u8; 65]);
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 2, 0x05, MD));
}

#[test]
fn row03_send_msn_out_of_range() {
    let mut i = iut(2);
    let u = send(5, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 2, 0x03, MD));
}

#[test]
fn row04_send_wrong_mo() {
    let mut i = iut(2);
    let u = untagged(op::SEND, 0, 1, 12, true, 0, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 2, 0x04, MD));
}

#[test]
fn row04b_send_second_segment_wrong_mo() {
    let mut i = iut(2);
    let first = untagged(op::SEND, 0, 1, 0, false, 0, &[1u8; 16]);
    let second = untagged(op::SEND, 0, 1, 20, true, 0, &[2u8; 16]);
    i.peer.send_all(&[first, second.clone()]);
    i.expect_terminate(&second, e(1, 2, 0x04, MD));
}

#[test]
fn row05_untagged_qn3_invalid_qn() {
    let mut i = iut(2);
    let u = untagged(op::SEND, 3, 1, 0, true, 0, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 2, 0x01, MD));
}

#[test]
fn row05b_send_opcode_on_qn1_invalid_qn() {
    let mut i = iut(2);
    let u = untagged(op::SEND, 1, 1, 0, true, 0, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 2, 0x01, MD));
}

#[test]
fn row06_untagged_bad_ddp_version() {
    let mut i = iut(2);
    let mut u = send(1, b"x");
    u[0] = (u[0] & !0x03) | 0x02; // DV = 2
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 2, 0x06, NONE));
}

#[test]
fn row07_tagged_bad_ddp_version() {
    let mut i = iut(0);
    let mut u = tagged(op::WRITE, 0x1234, 0, true, b"x");
    u[0] &= !0x03; // DV = 0
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 1, 0x04, NONE));
}

/// An MR at the IUT the raw peer aims at.
fn target(i: &Iut, access: Access) -> MemoryRegion {
    i.pd.reg_mr(4096, access).unwrap()
}

#[test]
fn row08_write_unknown_stag() {
    let mut i = iut(0);
    let mr = target(&i, Access::all_remote());
    let u = tagged(op::WRITE, mr.rkey() ^ 0x0000_0100, mr.addr(), true, b"data");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 1, 0x00, MD));
}

#[test]
fn row08b_write_to_invalidated_stag() {
    // RDMAP-SND-06 (a): invalidate by Send with Invalidate, then Write to it.
    let mut i = iut(1);
    let mr = i.pd.alloc_mr(4096).unwrap();
    let buf = i.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let stag = mr.stag_with_key(0x5C);
    let reg = WrOpcode::RegMr {
        mr_stag: mr.rkey(),
        key: 0x5C,
        source_lkey: buf.lkey(),
        source_addr: buf.addr(),
        length: 4096,
        iova: buf.addr(),
        access: Access::all_remote(),
    };
    i.qp.post_send_one(SendWr::new(1, reg, vec![])).unwrap();
    assert_eq!(i.cq.wait(Some(T)).unwrap().status, WcStatus::Success);
    i.peer.send(&untagged(op::SEND_INV, 0, 1, 0, true, stag, b"inv"));
    let wc = i.cq.wait(Some(T)).unwrap();
    assert_eq!((wc.status, wc.invalidated_rkey), (WcStatus::Success, Some(stag)));
    let u = tagged(op::WRITE, stag, buf.addr(), true, b"late");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 1, 0x00, MD));
}

#[test]
fn row09_write_past_end_and_below_base() {
    for (off, len) in [(4090u64, 8usize), (u64::MAX, 1)] {
        let mut i = iut(0);
        let mr = target(&i, Access::all_remote());
        let to = if off == u64::MAX {
            mr.addr() - 1
        } else {
            mr.addr() + off
        };
        let u = tagged(op::WRITE, mr.rkey(), to, true, &vec![1u8; len]);
        i.peer.send(&u);
        i.expect_terminate(&u, e(1, 1, 0x01, MD));
    }
}

#[test]
fn row10_write_stag_of_other_pd() {
    let mut i = iut(0);
    let other_pd = i.qp.pd().device().alloc_pd().unwrap();
    let mr = other_pd.reg_mr(4096, Access::all_remote()).unwrap();
    let u = tagged(op::WRITE, mr.rkey(), mr.addr(), true, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 1, 0x02, MD));
}

#[test]
fn row11_write_to_wraps() {
    let mut i = iut(0);
    let mr = target(&i, Access::all_remote());
    let u = tagged(op::WRITE, mr.rkey(), u64::MAX - 1, true, b"wrap");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 1, 0x03, MD));
}

#[test]
fn row12_write_without_remote_write_right() {
    let mut i = iut(0);
    let mr = target(&i, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let u = tagged(op::WRITE, mr.rkey(), mr.addr(), true, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 1, 0x00, MD));
}

fn read_request(sink_stag: u32, sink_to: u64, size: u32, src_stag: u32, src_to: u64) -> (Vec<u8>, ReadRequest) {
    let rr = ReadRequest {
        sink_stag,
        sink_to,
        size,
        src_stag,
        src_to,
    };
    let mut b = vec![0u8; rr.buffer_len()];
    rr.emit(&mut b).unwrap();
    (untagged(op::READ_REQUEST, 1, 1, 0, true, 0, &b), rr)
}

fn read_row(access: Access, other_pd: bool, f: impl Fn(&MemoryRegion) -> (u32, u64, u32), want: (u8, u8, u8)) {
    let mut i = iut(0);
    let pd = if other_pd {
        i.qp.pd().device().alloc_pd().unwrap()
    } else {
        i.pd.clone()
    };
    let mr = pd.reg_mr(4096, access).unwrap();
    let (stag, to, size) = f(&mr);
    let (u, rr) = read_request(0xAB00_0001, 0x1000, size, stag, to);
    i.peer.send(&u);
    let mut x = e(want.0, want.1, want.2, MD);
    x.rdma = Some(rr);
    i.expect_terminate(&u, x);
}

#[test]
fn row13_read_request_invalid_src_stag() {
    read_row(
        Access::all_remote(),
        false,
        |m| (m.rkey() ^ 0x100, m.addr(), 16),
        (0, 1, 0x00),
    );
}

#[test]
fn row14_read_request_out_of_bounds() {
    read_row(
        Access::all_remote(),
        false,
        |m| (m.rkey(), m.addr() + 4000, 200),
        (0, 1, 0x01),
    );
    read_row(
        Access::all_remote(),
        false,
        |m| (m.rkey(), m.addr() - 8, 16),
        (0, 1, 0x01),
    );
}

#[test]
fn row15_read_request_without_remote_read() {
    read_row(
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        false,
        |m| (m.rkey(), m.addr(), 16),
        (0, 1, 0x02),
    );
}

#[test]
fn row16_read_request_stag_of_other_pd() {
    read_row(Access::all_remote(), true, |m| (m.rkey(), m.addr(), 16), (0, 1, 0x03));
}

#[test]
fn row17_read_request_to_wraps() {
    read_row(
        Access::all_remote(),
        false,
        |m| (m.rkey(), u64::MAX - 7, 64),
        (0, 1, 0x04),
    );
}

#[test]
fn row18_zero_length_read_with_garbage_stag_is_answered() {
    // RDMAP-RD-08: no validation, one zero-length Read Response.
    let mut i = iut(0);
    let (u, _) = read_request(0xDEAD_BEEF, 1 << 63, 0, 0x0000_0000, 0x1234);
    i.peer.send(&u);
    let resp = i.peer.read_until(|_| true).expect("a Read Response");
    let h = ddp::Header::parse(&resp).unwrap();
    assert_eq!(h.rdmap_ctrl, ctrl(op::READ_RESPONSE));
    assert!(h.last);
    // RDMAP-HDR-09: SinkSTag/SinkTO copied uninterpreted.
    assert_eq!(
        h.addr,
        ddp::Addr::Tagged {
            stag: 0xDEAD_BEEF,
            to: 1 << 63
        }
    );
    assert_eq!(resp.len(), ddp::TAGGED_HEADER_LEN);
    assert_eq!(i.qp.state(), QpState::Rts);
    i.neighbour_still_works();
}

#[test]
fn row19_more_read_requests_than_ird() {
    row19(false);
}

#[test]
fn row19b_more_read_requests_than_ird_while_responding() {
    row19(true);
}

fn row19(separate: bool) {
    // IRD 1 at the IUT. The first Read is 8 MiB and the raw peer reads
    // nothing, so it is still outstanding when the second arrives. siw's
    // choice: 0/2/0x07 with the Read Request echoed.
    let mut i = iut_with(Ask::default(), 1, 0);
    let mr = i.pd.reg_mr(8 << 20, Access::all_remote()).unwrap();
    let (u1, _) = read_request(0x11, 0, 8 << 20, mr.rkey(), mr.addr());
    let rr2 = ReadRequest {
        sink_stag: 0x22,
        sink_to: 0,
        size: 16,
        src_stag: mr.rkey(),
        src_to: mr.addr(),
    };
    let mut b = vec![0u8; rr2.buffer_len()];
    rr2.emit(&mut b).unwrap();
    let u2 = untagged(op::READ_REQUEST, 1, 2, 0, true, 0, &b);
    if separate {
        // The first response is already on its way when the second arrives:
        // it still holds its IRD slot (it is not fully sent).
        i.peer.send(&u1);
        std::thread::sleep(Duration::from_millis(100));
        i.peer.send(&u2);
    } else {
        i.peer.send_all(&[u1, u2.clone()]);
    }
    let mut x = e(0, 2, 0x07, MD);
    x.rdma = Some(rr2);
    i.expect_terminate(&u2, x);
}

#[test]
fn row20_send_with_invalidate_of_unknown_or_foreign_stag() {
    // A.5 #4: unknown STag -> 0/2/0x09; STag of another PD -> 0/1/0x09.
    let mut i = iut(1);
    let u = untagged(op::SEND_INV, 0, 1, 0, true, 0x00C0_FFEE, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(0, 2, 0x09, MD));

    let mut i = iut(1);
    let other = i.qp.pd().device().alloc_pd().unwrap();
    let mr = other.reg_mr(4096, Access::all_remote()).unwrap();
    let u = untagged(op::SEND_INV, 0, 1, 0, true, mr.rkey(), b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(0, 1, 0x09, MD));
    // The foreign STag survived.
    assert!(mr.rkey() != 0);
}

#[test]
fn row21_bad_rdmap_version() {
    // RDMAP-HDR-04. We echo the DDP header (the layout is known): 1 1 0.
    let mut i = iut(2);
    let mut u = send(1, b"x");
    u[1] = (u[1] & 0x3F) | 0x80; // RV = 10b
    i.peer.send(&u);
    i.expect_terminate(&u, e(0, 2, 0x05, MD));
}

#[test]
fn row22_unknown_opcode() {
    // 0x8-0xB are RFC 7306's; 0xC-0xF stay unknown.
    for opc in [0xCu8, 0xF] {
        let mut i = iut(2);
        let u = untagged(opc, 0, 1, 0, true, 0, b"x");
        i.peer.send(&u);
        i.expect_terminate(&u, e(0, 2, 0x06, MD));
    }
}

#[test]
fn row23_read_response_without_read_outstanding() {
    let mut i = iut(0);
    let u = tagged(op::READ_RESPONSE, 0x1234, 0, true, b"unasked");
    i.peer.send(&u);
    i.expect_terminate(&u, e(0, 2, 0x06, MD));
}

#[test]
fn row24_opcode_t_flag_mismatch() {
    // A Write with T=0 and a Send with T=1.
    let mut i = iut(2);
    let u = untagged(op::WRITE, 0, 1, 0, true, 0, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(0, 2, 0x06, MD));
    let mut i = iut(2);
    let u = tagged(op::SEND, 0x1234, 0, true, b"x");
    i.peer.send(&u);
    i.expect_terminate(&u, e(0, 2, 0x06, MD));
}

#[test]
fn row25_read_response_longer_than_requested() {
    let mut i = iut(0);
    let sink = i.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let wr = SendWr::new(
        5,
        WrOpcode::RdmaRead {
            remote: RemoteAddr {
                addr: 0x9000,
                rkey: 0x77,
            },
        },
        vec![sink.sge(0, 16)],
    );
    i.qp.post_send_one(wr).unwrap();
    let req = i
        .peer
        .read_until(|u| u[0] & 0x80 == 0 && u[1] & 0x0F == op::READ_REQUEST)
        .unwrap();
    let rr = ReadRequest::parse(&req[ddp::UNTAGGED_HEADER_LEN..]).unwrap();
    assert_eq!((rr.size, rr.src_stag, rr.src_to), (16, 0x77, 0x9000));
    let u = tagged(op::READ_RESPONSE, rr.sink_stag, rr.sink_to, true, &[3u8; 32]);
    i.peer.send(&u);
    let cq = i.cq.clone();
    i.expect_terminate(&u, e(1, 1, 0x01, MD));
    // The Read itself completed in error (flushed or failed), never Success.
    let _ = cq;
}

#[test]
fn row26_bad_mpa_crc() {
    // A.4.6 row 26: 2/0/0x02, no headers.
    let ask = Ask {
        crc: true,
        ..Ask::default()
    };
    let mut i = iut_with(ask, 4, 2);
    let u = send(1, b"hello");
    let mut f = i.peer.fpdu(&u);
    let n = f.len();
    f[n - 1] ^= 0x5A;
    i.peer.send_raw(&f);
    i.expect_terminate(&u, e(2, 0, 0x02, NONE));
}

#[test]
fn row29_peer_terminate_gets_no_terminate_back() {
    // RDMAP-TRM-03/05: surfaced with layer/type/code, work flushed, no reply.
    let mut i = iut(2);
    let term = iwarp::wire::terminate::Repr::for_error(iwarp::wire::cause::DDP_ERR_T_INVALID_STAG, None, None);
    let mut u = vec![0u8; term.ulpdu_len()];
    term.emit_ulpdu(&mut u, 1).unwrap();
    i.peer.send(&u);
    let got = i.peer.read_to_end();
    assert!(got.terminates().is_empty(), "no Terminate answers a Terminate");
    assert!(got.eof);
    match i.qp.get_event(Some(T)) {
        Some(CmEvent::ErrorReceived(d)) => {
            let t = d.downcast_ref::<iwarp::TerminateInfo>().expect("an iWARP Terminate");
            assert_eq!((t.layer, t.etype, t.code), (1, 1, 0))
        }
        other => panic!("expected TerminateReceived, got {other:?}"),
    }
    let mut flushed = 0;
    while let Some(wc) = i.cq.poll_one() {
        assert_eq!(wc.status, WcStatus::WrFlushErr);
        flushed += 1;
    }
    assert_eq!(flushed, 2, "both posted receives flushed");
    i.neighbour_still_works();
}

#[test]
fn rdmap_trm_02_two_errors_back_to_back_one_terminate() {
    // The first error is described; the second never answered.
    let mut i = iut(0);
    let first = send(1, b"no buffer");
    let second = untagged(op::SEND, 3, 1, 0, true, 0, b"bad qn");
    i.peer.send_all(&[first.clone(), second]);
    i.expect_terminate(&first, e(1, 2, 0x02, MD));
}

#[test]
fn rdmap_hdr_05_06_reserved_bits_and_inv_stag_ignored_on_send() {
    // Rsv bits in the DDP control and an STag in a plain Send's
    // Invalidate STag field: delivered normally, the STag still valid.
    let mut i = iut(1);
    let mr = target(&i, Access::all_remote());
    let mut u = untagged(op::SEND, 0, 1, 0, true, mr.rkey(), b"ok");
    u[0] |= 0x3C; // DDP Rsvd bits
    u[1] |= 0x30; // RDMAP Rsvd bits
    i.peer.send(&u);
    let wc = i.cq.wait(Some(T)).unwrap();
    assert_eq!(
        (wc.status, wc.byte_len, wc.invalidated_rkey),
        (WcStatus::Success, 2, None)
    );
    let w = tagged(op::WRITE, mr.rkey(), mr.addr(), true, b"still valid");
    i.peer.send(&w);
    // Read it back through a zero-risk check: no Terminate comes.
    let (rq, _) = read_request(0x5, 0, 11, mr.rkey(), mr.addr());
    i.peer.send(&rq);
    let resp = i.peer.read_until(|_| true).unwrap();
    assert_eq!(&resp[ddp::TAGGED_HEADER_LEN..], b"still valid");
}

#[test]
fn atomic_misaligned_is_remote_operation_error() {
    // RFC 7306 §8.2: a misaligned atomic is a Remote Operation error.
    let mut i = iut(0);
    let mr = target(&i, Access::all_remote());
    let ar = AtomicRequest {
        op: AtomicOp::FetchAdd,
        request_id: 1,
        remote_stag: mr.rkey(),
        remote_to: mr.addr() + 4,
        add_swap_data: 1,
        add_swap_mask: 0,
        compare_data: 0,
        compare_mask: 0,
    };
    let mut b = vec![0u8; ar.buffer_len()];
    ar.emit(&mut b).unwrap();
    let u = untagged(op::ATOMIC_REQUEST, 1, 1, 0, true, 0, &b);
    i.peer.send(&u);
    i.expect_terminate(&u, e(0, 2, 0x07, MD));
}

#[test]
fn send_at_once_after_the_reply_lands_in_a_pre_posted_receive() {
    // The peer Sends the moment it has our MPA Reply. Receives given in
    // QpOptions::post_recv are posted before any received byte is
    // processed (rdma_cm order), so this is not row 1's Terminate.
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let cq = dev.create_cq(16).unwrap();
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let ask = Ask::default();
    let peer = RawPeer::start(listener.local_addr(), &ask);
    let req = listener.get_request(Some(T)).unwrap();
    // Send from a thread that writes as soon as the Reply is read.
    let h = std::thread::spawn(move || {
        let mut peer = peer.finish(&Ask::default());
        peer.send(&send(1, b"early bird"));
        peer
    });
    let opts = QpOptions::new(&cq).post_recv([RecvWr {
        wr_id: 42,
        sg_list: vec![mr.sge(0, 64)],
    }]);
    let qp = req.accept(&pd, opts).unwrap();
    let _peer = h.join().unwrap();
    let wc = cq.wait(Some(T)).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (42, WcStatus::Success, 10));
    assert_eq!(mr.to_vec(0, 10).unwrap(), b"early bird");
    assert_eq!(qp.state(), QpState::Rts);
}

#[test]
fn row26b_bad_crc_on_a_directly_placed_write() {
    // A large Write arrives in two parts, so the receiver places its payload
    // straight into the region (direct data placement) before the CRC is
    // there to check: the CRC failure still gives 2/0/0x02 and ends the
    // stream; nothing after it is accepted.
    let ask = Ask {
        crc: true,
        ..Ask::default()
    };
    let mut i = iut_with(ask, 4, 0);
    let mr = target(&i, Access::all_remote());
    let big = i.pd.reg_mr(64 << 10, Access::all_remote()).unwrap();
    let u = tagged(op::WRITE, big.rkey(), big.addr(), true, &[0x6Bu8; 30_000]);
    let mut f = i.peer.fpdu(&u);
    let n = f.len();
    f[n - 2] ^= 0x01;
    i.peer.send_raw(&f[..1000]);
    std::thread::sleep(Duration::from_millis(50));
    i.peer.send_raw(&f[1000..]);
    // Followed by a valid Write that must not be placed.
    let after = tagged(op::WRITE, mr.rkey(), mr.addr(), true, b"after");
    i.peer.send(&after);
    let mr_after = mr.to_vec(0, 5).unwrap();
    i.expect_terminate(&u, e(2, 0, 0x02, NONE));
    assert_eq!(mr.to_vec(0, 5).unwrap(), mr_after);
    assert_ne!(mr.to_vec(0, 5).unwrap(), b"after");
}

#[test]
fn directly_placed_writes_split_anywhere_land_intact() {
    // Large Writes (direct placement) with CRC on, the stream cut into
    // uneven pieces with pauses so every phase (header, payload, trailer)
    // is hit; then a Read Request reads it all back through us.
    let ask = Ask {
        crc: true,
        ..Ask::default()
    };
    let mut i = iut_with(ask, 4, 0);
    let big = i.pd.reg_mr(256 << 10, Access::all_remote()).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|k| (k * 13 % 251) as u8).collect();
    let mut stream = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let n = (data.len() - at).min(60_000);
        let u = tagged(op::WRITE, big.rkey(), big.addr() + at as u64, true, &data[at..at + n]);
        stream.extend(i.peer.fpdu(&u));
        at += n;
    }
    for (k, piece) in stream.chunks(7_777).enumerate() {
        i.peer.send_raw(piece);
        if k % 5 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let (rq, _) = read_request(0x99, 0, 8, big.rkey(), big.addr() + 199_992);
    i.peer.send(&rq);
    let resp = i.peer.read_until(|_| true).expect("a Read Response");
    assert_eq!(&resp[ddp::TAGGED_HEADER_LEN..], &data[199_992..]);
    assert_eq!(big.to_vec(0, data.len()).unwrap(), data);
    assert_eq!(i.qp.state(), QpState::Rts);
}

#[test]
fn read_response_into_deregistered_sink_sec_stag_02() {
    // The IUT's Read sink is deregistered while the Read is outstanding:
    // the response is not placed, the Read completes LOC_PROT_ERR, and the
    // IUT ends the stream with a local catastrophic Terminate (row 28).
    let mut i = iut(0);
    let sink = i.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let remote = RemoteAddr {
        addr: 0x9000,
        rkey: 0x77,
    };
    i.qp.post_send_one(SendWr::new(5, WrOpcode::RdmaRead { remote }, vec![sink.sge(0, 64)]))
        .unwrap();
    let req = i
        .peer
        .read_until(|u| u[0] & 0x80 == 0 && u[1] & 0x0F == op::READ_REQUEST)
        .unwrap();
    let rr = ReadRequest::parse(&req[ddp::UNTAGGED_HEADER_LEN..]).unwrap();
    let buffer = sink.buffer().cloned();
    drop(sink);
    let u = tagged(op::READ_RESPONSE, rr.sink_stag, rr.sink_to, true, &[0xEE; 64]);
    i.peer.send(&u);
    let wc = i.cq.wait(Some(T)).unwrap();
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocProtErr), "{wc:?}");
    if let Some(b) = buffer {
        let mut got = [0u8; 64];
        b.read(0, &mut got).unwrap();
        assert_eq!(got, [0u8; 64], "nothing placed in the deregistered region");
    }
    i.expect_terminate(&u, e(0, 0, 0x00, NONE));
}

/// The IUT posts an RDMA Read of `len` octets into a fresh local sink and
/// returns the sink with the Read Request the raw peer received.
fn outstanding_read(i: &mut Iut, len: usize) -> (MemoryRegion, ReadRequest) {
    let sink = i.pd.reg_mr(len, Access::LOCAL_WRITE).unwrap();
    let remote = RemoteAddr {
        addr: 0x9000,
        rkey: 0x77,
    };
    i.qp.post_send_one(SendWr::new(
        5,
        WrOpcode::RdmaRead { remote },
        vec![sink.sge(0, len as u32)],
    ))
    .unwrap();
    let req = i
        .peer
        .read_until(|u| u[0] & 0x80 == 0 && u[1] & 0x0F == op::READ_REQUEST)
        .unwrap();
    let rr = ReadRequest::parse(&req[ddp::UNTAGGED_HEADER_LEN..]).unwrap();
    assert_eq!((rr.size as usize, rr.sink_stag), (len, sink.lkey()));
    (sink, rr)
}

/// Sends `u` in two writes with a pause between, so a large tagged segment
/// reaches the direct-placement path (header first, payload later).
/// Asserts that `len` octets of `mr` at `off` are still zero: nothing was placed there.
fn untouched(mr: &MemoryRegion, off: usize, len: usize, what: &str) {
    assert_eq!(mr.to_vec(off, len).unwrap(), vec![0u8; len], "{what}");
}

fn send_split(i: &mut Iut, u: &[u8]) {
    let f = i.peer.fpdu(u);
    let cut = 100.min(f.len() / 2);
    i.peer.send_raw(&f[..cut]);
    std::thread::sleep(Duration::from_millis(50));
    i.peer.send_raw(&f[cut..]);
}

/// Issue 12 point 6; A.4.6 row 25, RFC 5040 §5.2.2 / RFC 5041 §7.1-§7.2,
/// RDMAP-RD-13: a Read Response naming a valid STag of this stream that is
/// not the sink of the Read it answers gets 1/1/0x00 (invalid STag for this
/// response) and places nothing, neither in the named region nor in the sink.
/// Small (buffered path) and large (direct-placement path) responses.
#[test]
fn row25b_read_response_with_another_stag_is_refused_and_not_placed() {
    for len in [64usize, 16 << 10] {
        let mut i = iut(0);
        let (sink, _rr) = outstanding_read(&mut i, len);
        // Another region of the same PD: valid for this stream, but not the sink.
        let decoy = i.pd.reg_mr(len, Access::all_remote()).unwrap();
        let u = tagged(op::READ_RESPONSE, decoy.lkey(), decoy.addr(), true, &vec![0xA5; len]);
        send_split(&mut i, &u);
        i.expect_terminate(&u, e(1, 1, 0x00, MD));
        untouched(&decoy, 0, len, "nothing placed in the named region");
        untouched(&sink, 0, len, "nothing placed in the sink");
    }
}

/// Issue 12 point 6 ("a Read Response naming another connection's sink
/// STag"); A.4.6 row 25 with rows 10/16, RFC 5041 §7.2 code 0x02, SEC-STAG:
/// the STag is the sink of a Read outstanding on another connection of the
/// same device (another PD). The response is refused with 1/1/0x02 (STag not
/// associated with this DDP stream); neither that connection's sink nor ours
/// is written, and the other connection's Read is untouched.
#[test]
fn row25c_read_response_naming_another_connections_sink_stag() {
    for len in [64usize, 16 << 10] {
        let mut i = iut(0);
        let (sink, _rr) = outstanding_read(&mut i, len);
        // Another connection with its own PD: its sink STag.
        let other_pd = i._dev.alloc_pd().unwrap();
        let theirs = other_pd.reg_mr(len, Access::LOCAL_WRITE).unwrap();
        let u = tagged(op::READ_RESPONSE, theirs.lkey(), theirs.addr(), true, &vec![0x5A; len]);
        send_split(&mut i, &u);
        i.expect_terminate(&u, e(1, 1, 0x02, MD));
        untouched(&theirs, 0, len, "other connection's sink untouched");
        untouched(&sink, 0, len, "nothing placed in our sink");
    }
}

/// Issue 12 point 6; A.4.6 row 25 (siw: 1/1/0x01), RFC 5041 §5.2 (segment
/// TO = message TO + offset): the right STag but a TO that is not the sink
/// TO (first segment), or not advanced by what already arrived (second
/// segment), is a base-or-bounds violation and places nothing.
#[test]
fn row25d_read_response_with_wrong_to_is_refused_and_not_placed() {
    // First segment 8 octets past the sink TO.
    let mut i = iut(0);
    let (sink, rr) = outstanding_read(&mut i, 64);
    let u = tagged(op::READ_RESPONSE, rr.sink_stag, rr.sink_to + 8, true, &[0xC3; 56]);
    i.peer.send(&u);
    i.expect_terminate(&u, e(1, 1, 0x01, MD));
    untouched(&sink, 0, 64, "nothing placed");
    // Second segment repeating the first one's TO.
    let mut i = iut(0);
    let (sink, rr) = outstanding_read(&mut i, 64);
    let first = tagged(op::READ_RESPONSE, rr.sink_stag, rr.sink_to, false, &[0x11; 32]);
    let second = tagged(op::READ_RESPONSE, rr.sink_stag, rr.sink_to, true, &[0x22; 32]);
    i.peer.send_all(&[first, second.clone()]);
    i.expect_terminate(&second, e(1, 1, 0x01, MD));
    assert_eq!(
        sink.to_vec(0, 32).unwrap(),
        vec![0x11; 32],
        "the valid first segment was placed"
    );
    untouched(&sink, 32, 32, "the bad second segment was not");
}

/// A Read Response that answers the Read exactly (STag, TO advancing per
/// segment) still completes it: the checks above do not refuse the valid case.
#[test]
fn read_response_in_segments_matching_the_request_completes_the_read() {
    let mut i = iut(0);
    let (sink, rr) = outstanding_read(&mut i, 64);
    let first = tagged(op::READ_RESPONSE, rr.sink_stag, rr.sink_to, false, &[0x11; 40]);
    let second = tagged(op::READ_RESPONSE, rr.sink_stag, rr.sink_to + 40, true, &[0x22; 24]);
    i.peer.send_all(&[first, second]);
    let wc = i.cq.wait(Some(T)).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (5, WcStatus::Success, 64), "{wc:?}");
    assert_eq!(sink.to_vec(0, 40).unwrap(), vec![0x11; 40]);
    assert_eq!(sink.to_vec(40, 24).unwrap(), vec![0x22; 24]);
    assert_eq!(i.qp.state(), QpState::Rts);
}

/// Issue 12 point 8; RFC 5041 §4/§7.2, A.4.6 (rows 6/7 for the echo rule):
/// a ULPDU shorter than the DDP header its T flag announces (empty; 5 octets
/// tagged; 10 octets untagged) gets a DDP-layer Terminate, 1/0/0x00 (DDP
/// Local Catastrophic), with no echoed header since the layout is unknown,
/// instead of RDMAP 0/2/0xFF.
#[test]
fn ulpdu_shorter_than_a_ddp_header_gets_a_ddp_layer_terminate() {
    let tagged_short = tagged(op::WRITE, 0x1234, 0, true, b"")[..5].to_vec();
    let untagged_short = send(1, b"")[..10].to_vec();
    for u in [Vec::new(), tagged_short, untagged_short] {
        let mut i = iut(2);
        i.peer.send(&u);
        i.expect_terminate(&u, e(1, 0, 0x00, NONE));
    }
}
