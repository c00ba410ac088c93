//! A scripted misbehaving SMC-R server (A2.15), built from the sans-I/O CLC machine and raw
//! verbs on our RoCEv2 provider, against a real `SmcStream` client:
//! - a forged CDC (producer cursor beyond the client's element) aborts the client's
//!   connection: its reads fail, and a CDC with A comes back (SMC-CDC-12, Figure 23);
//! - an RDMA Write past the end of the RMB element the client gave fails with a remote
//!   access error at the rogue (the provider enforces the MR bounds, D2), and the
//!   connection's data is untouched;
//! - a CDC with a foreign alert token changes nothing (SMC-CDC-11);
//! - LLC on the established link (A2.6, A2.12, SMC-LG-19): TEST LINK echoed, an unknown
//!   optional opcode ignored, DELETE LINK of an unknown link answered "no link", ADD LINK
//!   rejected (one RNIC), an unknown mandatory opcode or an unanswered TEST LINK end the
//!   link group with DELETE LINK (A) and reset its connection while a connection of
//!   another group goes on.
//!
//! - ADD LINK CONTINUATION with RTokens after our reject of the ADD LINK ends the group
//!   (SMC-INV-5).
//!
//! - with a second device on the client (A4.7): an ADD LINK it accepts but never confirms
//!   (no CONFIRM LINK on the new link) makes it delete the new link and go on over link 1
//!   (SMC-TMO-9); a continuation naming an RKey the rogue never gave ends the group.
//!
//! Addresses 127.115.11.x–127.115.19.x and 127.115.60.x–127.115.65.x.

use smc::clc_machine::{ClcMachine, LinkParams, LocalCaps, NeedLink, Outcome};
use smc::wire::cdc::{Cdc, ConnStateFlags};
use smc::wire::clc::{AcceptConfirm, HOSTNAME_LEN, PeerId};
use smc::wire::cursor::Cursor;
use smc::wire::llc::{CONFIRM_LINK_NO_RMBE_EYECATCHER, ConfirmLink, LlcBody, LlcMessage};
use smc::{Mode, SmcConfig, SmcStream};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;
use verbs::*;

#[path = "common/loopback.rs"]
mod loopback;
use loopback::device;

const T: Duration = Duration::from_secs(20);

struct Rogue {
    _dev: Device,
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
    _rmb: MemoryRegion,
    confirm: AcceptConfirm,
    tcp: TcpStream,
}

fn caps(gid: [u8; 16]) -> LocalCaps {
    LocalCaps {
        enabled: true,
        v1: true,
        v2: false,
        peer_id: PeerId::new(0x5151, [2, 0, 0, 0, 0, 1]),
        gid,
        mac: [2, 0, 0, 0, 0, 1],
        ipv4: Some(("127.0.0.1".parse().unwrap(), 8)),
        ipv6: None,
        eids: Vec::new(),
        hostname: [b' '; HOSTNAME_LEN],
        max_conns: 255,
        max_links: 1,
    }
}

/// Plays the server side of CLC and CONFIRM LINK honestly, then hands over.
fn rogue_server(l: TcpListener, addr: &str) -> Rogue {
    let dev = device("rogue_", addr);
    let gid = dev.query_gid(1, 0).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
    let rmb = pd
        .reg_mr(16 * 1024, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mr = pd.reg_mr(64 * 1024, Access::LOCAL_WRITE).unwrap();
    qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE))
        .unwrap();
    let recvs: Vec<RecvWr> = (0..16u64)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: vec![mr.sge(32_768 + i as usize * 64, 64)],
        })
        .collect();
    qp.post_recv(&recvs).unwrap();
    let (mut tcp, _) = l.accept().unwrap();
    let mut m = ClcMachine::server(caps(gid.0), true);
    let mut buf = [0u8; 1024];
    let confirm = loop {
        let out = m.take_output();
        if !out.is_empty() {
            tcp.write_all(&out).unwrap();
        }
        match m.outcome().clone() {
            Outcome::NeedLink(n) => {
                assert!(matches!(*n, NeedLink::Proposal { .. }));
                let p = LinkParams {
                    qpn: qp.qp_num(),
                    rmb_rkey: rmb.rkey(),
                    rmbe_idx: 1,
                    alert_token: 0x0BAD_0001,
                    rmbe_size: 0,
                    qp_mtu: 3,
                    rmb_vaddr: rmb.addr(),
                    psn: 0x1234,
                };
                m.accept(&p, true).unwrap();
                continue;
            }
            Outcome::Proceed(c) => break *c,
            Outcome::Pending => {}
            o => panic!("rogue CLC: {o:?}"),
        }
        let n = tcp.read(&mut buf).unwrap();
        m.on_bytes(&buf[..n]);
    };
    qp.modify_qp(&QpAttr::rtr(RtrAttr {
        ah_attr: AhAttr::to_gid(Gid(confirm.gid)),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: confirm.qpn,
        rq_psn: confirm.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 5,
    }))
    .unwrap();
    qp.modify_qp(&QpAttr::rts(RtsAttr {
        sq_psn: 0x1234,
        timeout: 15,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
    }))
    .unwrap();
    let cl = ConfirmLink {
        flags: CONFIRM_LINK_NO_RMBE_EYECATCHER,
        mac: [2, 0, 0, 0, 0, 1],
        gid: gid.0,
        qpn: qp.qp_num(),
        link_num: 1,
        link_uid: [0, 0, 0, 9],
        max_links: 1,
        max_conns: 255,
    };
    let b = LlcMessage::request(LlcBody::ConfirmLink(cl)).to_vec().unwrap();
    mr.write(0, &b).unwrap();
    qp.post_send_one(SendWr::new(100, WrOpcode::Send, vec![mr.sge(0, 44)]))
        .unwrap();
    let (mut sent, mut replied) = (false, false);
    while !(sent && replied) {
        let wc = cq.wait(Some(T)).expect("completion");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        match wc.opcode {
            WcOpcode::Recv => {
                let b = mr.to_vec(32_768 + wc.wr_id as usize * 64, 44).unwrap();
                let m = LlcMessage::parse(&b).unwrap();
                assert!(m.reply && matches!(m.body, LlcBody::ConfirmLink(_)), "{m:?}");
                replied = true;
            }
            _ => sent = true,
        }
    }
    Rogue {
        _dev: dev,
        qp,
        cq,
        mr,
        _rmb: rmb,
        confirm,
        tcp,
    }
}

fn pair(n: u8) -> (SmcStream, Rogue, Device) {
    pair_with(
        n,
        SmcConfig {
            prefix_len: 8,
            ..SmcConfig::default()
        },
    )
}

fn pair_with(n: u8, cfg: SmcConfig) -> (SmcStream, Rogue, Device) {
    let addr = format!("127.115.{n}.1");
    let l = TcpListener::bind(format!("{addr}:0")).unwrap();
    let port = l.local_addr().unwrap().port();
    let a2 = addr.clone();
    let rogue = thread::spawn(move || rogue_server(l, &a2));
    let cdev = device("smc_c", &format!("127.115.{n}.2"));
    let c = SmcStream::connect_with((addr.as_str(), port), &cdev, &cfg).unwrap();
    assert_eq!(c.mode(), Mode::SmcR);
    (c, rogue.join().unwrap(), cdev)
}

// SMC-CDC-12 / A2.15 "forged cursors": a producer cursor beyond the 64 KiB element.
#[test]
fn forged_cursor_aborts_the_connection() {
    let (mut c, r, _d) = pair(11);
    let forged = Cdc {
        seq: 1,
        token: r.confirm.rmbe_alert_token,
        prod: Cursor::new(0, 70_000),
        ..Cdc::default()
    };
    rogue_cdc(&r, 1, 0, &forged);
    let mut b = [0u8; 16];
    let e = c.read(&mut b).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted, "{e}");
    assert!(e.to_string().contains("producer"), "{e}");
    // The client answers with A (Figure 23).
    let mut saw_abort = false;
    while !saw_abort {
        let wc = r.cq.wait(Some(T)).expect("the client's abort CDC");
        if wc.opcode == WcOpcode::Recv {
            let m = Cdc::parse(&r.mr.to_vec(32_768 + wc.wr_id as usize * 64, 44).unwrap()).unwrap();
            saw_abort = m.conn_flags.contains(ConnStateFlags::ABORT);
        }
    }
    drop(r.tcp);
}

// A2.15 / D2: an RDMA Write past the element the client gave fails at the writer with a
// remote access error; the client's data stays what the honest writes put there.
#[test]
fn write_outside_the_element_is_refused() {
    let (mut c, r, _d) = pair(12);
    let len = r.confirm.rmbe_bytes() as u64;
    // An honest write of 5 octets plus its CDC.
    rogue_write(&r, 1, 0, b"hello");
    let mut b = [0u8; 5];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    // Now 16 octets straddling the element's end.
    rogue_rdma_write(&r, 4, len - 8, &[0xEE; 16]);
    let status = loop {
        let wc = r.cq.wait(Some(T)).expect("completion");
        if wc.wr_id == 4 {
            break wc.status;
        }
    };
    assert_eq!(status, WcStatus::RemAccessErr);
    drop(r.tcp);
}

// SMC-CDC-11 / A2.15 "another connection's alert token": a CDC with a token that is not the
// connection's changes nothing; the connection goes on with the next honest CDC.
#[test]
fn foreign_token_is_ignored_and_the_connection_goes_on() {
    let (mut c, r, _d) = pair(13);
    rogue_rdma_write(&r, 2, 0, b"abcdefgh");
    let token = r.confirm.rmbe_alert_token;
    let foreign = Cdc {
        seq: 1,
        token: token ^ 0x8000_0000,
        prod: Cursor::new(0, 8),
        ..Cdc::default()
    };
    rogue_cdc(&r, 3, 0, &foreign);
    // Wait until the client has certainly processed it (its ACK came back), then check.
    let mut acked = 0;
    while acked < 2 {
        let wc = r.cq.wait(Some(T)).expect("completion");
        assert_eq!(wc.status, WcStatus::Success);
        acked += 1;
    }
    thread::sleep(Duration::from_millis(100));
    assert_eq!(c.readable(), 0, "a foreign token moved nothing");
    let honest = Cdc {
        seq: 2,
        token,
        prod: Cursor::new(0, 8),
        ..Cdc::default()
    };
    rogue_cdc(&r, 4, 44, &honest);
    let mut b = [0u8; 8];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"abcdefgh");
    drop(r.tcp);
}

/// The rogue posts one LLC message.
fn rogue_llc(r: &Rogue, body: LlcBody, reply: bool, wr_id: u64) {
    let mut m = LlcMessage::request(body);
    m.reply = reply;
    r.mr.write(1024, &m.to_vec().unwrap()).unwrap();
    r.qp.post_send_one(SendWr::new(wr_id, WrOpcode::Send, vec![r.mr.sge(1024, 44)]))
        .unwrap();
}

/// The next LLC message the client sends to the rogue (CDCs and send completions skipped).
fn rogue_recv_llc(r: &Rogue) -> LlcMessage {
    loop {
        let wc = r.cq.wait(Some(T)).expect("an LLC message from the client");
        if wc.opcode != WcOpcode::Recv {
            continue;
        }
        let off = 32_768 + wc.wr_id as usize * 64;
        let b = r.mr.to_vec(off, 44).unwrap();
        r.qp.post_recv(&[RecvWr {
            wr_id: wc.wr_id,
            sg_list: vec![r.mr.sge(off, 64)],
        }])
        .unwrap();
        if b[0] != 0xFE {
            return LlcMessage::parse(&b).unwrap();
        }
    }
}

/// An honest write of `data` at element offset `at` plus its CDC (sequence `seq`).
fn rogue_write(r: &Rogue, seq: u16, at: u32, data: &[u8]) {
    rogue_rdma_write(r, 2, u64::from(at), data);
    let cdc = Cdc {
        seq,
        token: r.confirm.rmbe_alert_token,
        prod: Cursor::new(0, at + data.len() as u32),
        ..Cdc::default()
    };
    rogue_cdc(r, 3, 0, &cdc);
}

/// The rogue RDMA-Writes `data` (staged at 2048 of its MR) at offset `at` of the RMB
/// element the client gave, as WR `wr_id`.
fn rogue_rdma_write(r: &Rogue, wr_id: u64, at: u64, data: &[u8]) {
    r.mr.write(2048, data).unwrap();
    r.qp.post_send_one(SendWr::new(
        wr_id,
        WrOpcode::RdmaWrite {
            remote: RemoteAddr {
                addr: r.confirm.rmb_vaddr + at,
                rkey: r.confirm.rmb_rkey,
            },
        },
        vec![r.mr.sge(2048, data.len() as u32)],
    ))
    .unwrap();
}

/// The rogue Sends `cdc` (staged at `slot` of its MR) as WR `wr_id`.
fn rogue_cdc(r: &Rogue, wr_id: u64, slot: usize, cdc: &Cdc) {
    r.mr.write(slot, &cdc.to_bytes()).unwrap();
    r.qp.post_send_one(SendWr::new(wr_id, WrOpcode::Send, vec![r.mr.sge(slot, 44)]))
        .unwrap();
}

// SMC-KA-2, SMC-LG-19 (0x80: optional class, discarded), SMC-INV-7 / E-10 (DELETE LINK for
// an unknown link → "no link" 0x00100000), SMC-FC-9 (ADD LINK with one RNIC → Z, reason 1):
// each answered as the RFC says, and the connection goes on.
#[test]
fn llc_requests_answered_and_the_connection_goes_on() {
    use smc::wire::llc::{AddLink, DeleteLink, TestLink, add_link_reject, delete_reason};
    let (mut c, r, _d) = pair(14);
    let ud = *b"rogue test link!";
    rogue_llc(&r, LlcBody::TestLink(TestLink { user_data: ud }), false, 10);
    let m = rogue_recv_llc(&r);
    assert!(m.reply);
    assert_eq!(m.body, LlcBody::TestLink(TestLink { user_data: ud }));

    // An unknown optional opcode: nothing comes back, nothing breaks.
    r.mr.write(1024, &{
        let mut b = [0u8; 44];
        b[0] = 0x80;
        b[1] = 44;
        b
    })
    .unwrap();
    r.qp.post_send_one(SendWr::new(11, WrOpcode::Send, vec![r.mr.sge(1024, 44)]))
        .unwrap();

    let d = DeleteLink {
        all: false,
        orderly: true,
        link_num: 7,
        reason: delete_reason::OPERATOR,
    };
    rogue_llc(&r, LlcBody::DeleteLink(d), false, 12);
    let m = rogue_recv_llc(&r);
    assert!(m.reply);
    assert_eq!(
        m.body,
        LlcBody::DeleteLink(DeleteLink {
            reason: delete_reason::NO_LINK,
            ..d
        })
    );

    let a = AddLink {
        mac: [2, 0, 0, 0, 0, 1],
        qpn: 0x42,
        link_num: 2,
        qp_mtu: 3,
        psn: 7,
        ..AddLink::default()
    };
    rogue_llc(&r, LlcBody::AddLink(a), false, 13);
    let m = rogue_recv_llc(&r);
    let LlcBody::AddLink(rep) = &m.body else {
        panic!("{m:?}")
    };
    assert!(m.reply && rep.reject);
    assert_eq!(
        (rep.reject_reason, rep.link_num),
        (add_link_reject::NO_ALTERNATE_PATH, 2)
    );

    // The connection still works.
    rogue_write(&r, 1, 0, b"still here");
    let mut b = [0u8; 10];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still here");
    drop(r.tcp);
}

/// A connection in another link group (a real listener), to show the others go on.
fn honest_pair(n: u8) -> (SmcStream, SmcStream) {
    let (da, db) = (
        device("smc_h", &format!("127.115.{n}.1")),
        device("smc_h", &format!("127.115.{n}.2")),
    );
    let cfg = SmcConfig {
        prefix_len: 8,
        ..SmcConfig::default()
    };
    let l = smc::SmcListener::bind_with(format!("127.115.{n}.1:0"), &da, cfg.clone()).unwrap();
    let addr = l.local_addr().unwrap();
    let s = thread::spawn(move || l.accept().unwrap().0);
    let c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
    let s = s.join().unwrap();
    assert_eq!((c.mode(), s.mode()), (Mode::SmcR, Mode::SmcR));
    (c, s)
}

/// The group is over: the next LLC message from our side is a DELETE LINK request (all,
/// disorderly, `reason`), and the rogue's connection `c` reads as reset because of `cause`.
fn group_ended(r: &Rogue, c: &mut SmcStream, reason: u32, cause: &str) {
    use smc::wire::llc::DeleteLink;
    let m = rogue_recv_llc(r);
    assert!(!m.reply, "{m:?}");
    assert_eq!(
        m.body,
        LlcBody::DeleteLink(DeleteLink {
            all: true,
            orderly: false,
            link_num: 0,
            reason
        })
    );
    let mut b = [0u8; 4];
    let e = c.read(&mut b).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert!(e.to_string().contains(cause), "{e}");
}

fn still_moves(c: &mut SmcStream, s: &mut SmcStream) {
    c.write_all(b"others go on").unwrap();
    let mut b = [0u8; 12];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"others go on");
}

// SMC-INV-11 / SMC-LG-19: an unknown mandatory LLC opcode (0x3F) is a protocol error: the
// link (the group's only one) is down → DELETE LINK with A, reason 0x00040000, the
// connection is reset (SMC-ABT-6); a connection of another group goes on.
#[test]
fn unknown_mandatory_llc_ends_the_group_others_go_on() {
    use smc::wire::llc::delete_reason;
    let (mut hc, mut hs) = honest_pair(16);
    let (mut c, r, _d) = pair(15);
    r.mr.write(1024, &{
        let mut b = [0u8; 44];
        b[0] = 0x3F;
        b[1] = 44;
        b
    })
    .unwrap();
    r.qp.post_send_one(SendWr::new(10, WrOpcode::Send, vec![r.mr.sge(1024, 44)]))
        .unwrap();
    group_ended(&r, &mut c, delete_reason::PROTOCOL_VIOLATION, "LLC protocol error");
    still_moves(&mut hc, &mut hs);
    drop(r.tcp);
}

// SMC-KA-1 / SMC-TMO-16: nothing arrives for the keepalive time → TEST LINK; the rogue
// never answers → after the LLC wait (2 s) the link is failed: DELETE LINK (A, lost path),
// the connection reset; another group's connection goes on.
#[test]
fn unanswered_test_link_fails_the_link_others_go_on() {
    use smc::wire::llc::delete_reason;
    let (mut hc, mut hs) = honest_pair(18);
    let cfg = SmcConfig {
        prefix_len: 8,
        keepalive: Duration::from_millis(300),
        ..SmcConfig::default()
    };
    let (mut c, r, _d) = pair_with(17, cfg);
    let t0 = std::time::Instant::now();
    let m = rogue_recv_llc(&r);
    assert!(!m.reply && matches!(m.body, LlcBody::TestLink(_)), "{m:?}");
    group_ended(&r, &mut c, delete_reason::LOST_PATH, "TEST LINK");
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_secs(2), "DELETE LINK after {waited:?}");
    still_moves(&mut hc, &mut hs);
    drop(r.tcp);
}

// SMC-INV-5 / A2.15 over the engine: the rogue server sends ADD LINK (our client, one RNIC,
// rejects it with reason 1) and then ADD LINK CONTINUATION with RTokens anyway — RToken
// pairs outside any ADD LINK exchange are a protocol error: DELETE LINK (A, protocol
// violation), the connection reset; a connection of another group goes on.
#[test]
fn add_link_continuation_with_rtokens_after_a_reject_ends_the_group() {
    use smc::wire::llc::{AddLink, AddLinkCont, RtokenPair, delete_reason};
    let (mut hc, mut hs) = honest_pair(61);
    let (mut c, r, _d) = pair(60);
    let a = AddLink {
        mac: [2, 0, 0, 0, 0, 1],
        qpn: 0x42,
        link_num: 2,
        qp_mtu: 3,
        psn: 7,
        ..AddLink::default()
    };
    rogue_llc(&r, LlcBody::AddLink(a), false, 20);
    let m = rogue_recv_llc(&r);
    assert!(matches!(&m.body, LlcBody::AddLink(x) if x.reject), "{m:?}");
    let cont = AddLinkCont {
        link_num: 2,
        num_rtokens: 1,
        pairs: vec![RtokenPair {
            ref_rkey: 0x1234,
            new_rkey: 0x5678,
            new_vaddr: 0x9000,
        }],
    };
    rogue_llc(&r, LlcBody::AddLinkCont(cont), false, 21);
    group_ended(&r, &mut c, delete_reason::PROTOCOL_VIOLATION, "ADD LINK CONTINUATION");
    still_moves(&mut hc, &mut hs);
    drop(r.tcp);
}

// A4.8 / SMC-INV-9: DELETE RKEY of the RMB the server named in its Accept (first contact,
// never announced by CONFIRM RKEY) is answered positively; with an unknown RKey beside it,
// negatively with that RKey's bit in the error mask. The connection goes on.
#[test]
fn delete_rkey_of_the_first_contact_rmb_is_answered_positively() {
    use smc::wire::llc::DeleteRkey;
    let (_c, r, _d) = pair(62);
    let own = r._rmb.rkey();
    rogue_llc(
        &r,
        LlcBody::DeleteRkey(DeleteRkey {
            rkeys: vec![0x0DEA_D001, own],
            ..DeleteRkey::default()
        }),
        false,
        30,
    );
    let m = rogue_recv_llc(&r);
    let LlcBody::DeleteRkey(d) = &m.body else {
        panic!("{m:?}")
    };
    assert!(m.reply && d.negative);
    assert_eq!(d.err_mask, 0x80, "only the unknown RKey is flagged");
    drop(r.tcp);
}

/// A client with a second device (127.115.`n`.3): it answers ADD LINK with a QP there.
fn pair_two_devices(n: u8) -> (SmcStream, Rogue, Device) {
    let alt = roce::RoceFactory
        .open(
            &DeviceOptions::new()
                .with("addr", format!("127.115.{n}.3"))
                .with("name", format!("smc_c{n}b")),
        )
        .unwrap();
    pair_with(
        n,
        SmcConfig {
            prefix_len: 8,
            alt_device: Some(alt),
            ..SmcConfig::default()
        },
    )
}

/// The rogue's ADD LINK for link 2 (its QP values are made up: no CONFIRM LINK comes).
fn rogue_add_link(r: &Rogue) -> smc::wire::llc::AddLink {
    let a = smc::wire::llc::AddLink {
        mac: [2, 0, 0, 0, 0, 1],
        gid: r._dev.query_gid(1, 0).unwrap().0,
        qpn: 0x42,
        link_num: 2,
        qp_mtu: 3,
        psn: 7,
        ..smc::wire::llc::AddLink::default()
    };
    rogue_llc(r, LlcBody::AddLink(a.clone()), false, 30);
    a
}

// A4.7 / SMC-TMO-9 over the engine with a second device: the rogue server's ADD LINK is
// accepted (our reply names a QP on the second device, then our ADD LINK CONTINUATION with
// our RMB's RToken on the new link), but the rogue never sends CONFIRM LINK on the new
// link: after the LLC wait the client sends DELETE LINK for link 2 (lost path) over link 1,
// frees the new link, and the group and its connection go on over link 1.
#[test]
fn add_link_without_confirm_link_deletes_the_new_link_and_goes_on() {
    use smc::wire::llc::{AddLinkCont, DeleteLink, RtokenPair, delete_reason};
    let (mut c, r, _d) = pair_two_devices(63);
    let a = rogue_add_link(&r);
    let m = rogue_recv_llc(&r);
    let LlcBody::AddLink(rep) = &m.body else {
        panic!("{m:?}")
    };
    assert!(m.reply && !rep.reject, "accepted: {m:?}");
    assert_eq!(rep.link_num, 2);
    assert_ne!(rep.qpn, 0);
    assert_ne!(rep.gid, a.gid, "the reply names the client's second device");
    assert_eq!(rep.gid, Gid::from_ip("127.115.63.3".parse().unwrap()).0);
    // Our continuation: the rogue's one RMB (the one its Accept named) on the new link.
    let cont = AddLinkCont {
        link_num: 2,
        num_rtokens: 1,
        pairs: vec![RtokenPair {
            ref_rkey: r._rmb.rkey(),
            new_rkey: 0x5678,
            new_vaddr: 0x9000,
        }],
    };
    rogue_llc(&r, LlcBody::AddLinkCont(cont), false, 31);
    let m = rogue_recv_llc(&r);
    let LlcBody::AddLinkCont(theirs) = &m.body else {
        panic!("{m:?}")
    };
    assert!(m.reply);
    assert_eq!((theirs.link_num, theirs.num_rtokens, theirs.pairs.len()), (2, 1, 1));
    assert_eq!(
        theirs.pairs[0].ref_rkey, r.confirm.rmb_rkey,
        "the client's RMB on link 1"
    );
    assert_ne!(theirs.pairs[0].new_rkey, r.confirm.rmb_rkey, "its own key on link 2");
    let t0 = std::time::Instant::now();
    let m = rogue_recv_llc(&r);
    assert_eq!(
        m.body,
        LlcBody::DeleteLink(DeleteLink {
            all: false,
            orderly: false,
            link_num: 2,
            reason: delete_reason::LOST_PATH
        }),
        "{m:?}"
    );
    assert!(!m.reply);
    eprintln!(
        "DELETE LINK for the unconfirmed link {:?} after our continuation",
        t0.elapsed()
    );
    // The group and its connection go on over link 1.
    rogue_write(&r, 1, 0, b"still here");
    let mut b = [0u8; 10];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still here");
    drop(r.tcp);
}

// SMC-INV-5 / A2.15 over the engine with a second device: the client accepts the ADD LINK,
// then the rogue's ADD LINK CONTINUATION names an RKey it never gave (RToken misuse): a
// protocol error, DELETE LINK (A, protocol violation), the connection reset; a connection
// of another group goes on.
#[test]
fn add_link_continuation_with_an_unknown_rkey_ends_the_group_others_go_on() {
    use smc::wire::llc::{AddLinkCont, DeleteLink, RtokenPair, delete_reason};
    let (mut hc, mut hs) = honest_pair(65);
    let (mut c, r, _d) = pair_two_devices(64);
    rogue_add_link(&r);
    let m = rogue_recv_llc(&r);
    assert!(matches!(&m.body, LlcBody::AddLink(x) if !x.reject), "{m:?}");
    let cont = AddLinkCont {
        link_num: 2,
        num_rtokens: 1,
        pairs: vec![RtokenPair {
            ref_rkey: r._rmb.rkey() ^ 0x00FF_FF00,
            new_rkey: 0x5678,
            new_vaddr: 0x9000,
        }],
    };
    rogue_llc(&r, LlcBody::AddLinkCont(cont), false, 32);
    let m = rogue_recv_llc(&r);
    assert_eq!(
        m.body,
        LlcBody::DeleteLink(DeleteLink {
            all: true,
            orderly: false,
            link_num: 0,
            reason: delete_reason::PROTOCOL_VIOLATION
        })
    );
    let mut b = [0u8; 4];
    let e = c.read(&mut b).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert!(e.to_string().contains("unknown RKey"), "{e}");
    still_moves(&mut hc, &mut hs);
    drop(r.tcp);
}
