//! A scripted misbehaving SMC-R server (A2.15), built from the sans-I/O CLC machine and raw
//! verbs on our RoCEv2 provider, against a real `SmcStream` client:
//! - a forged CDC (producer cursor beyond the client's element) aborts the client's
//!   connection: its reads fail, and a CDC with A comes back (SMC-CDC-12, Figure 23);
//! - an RDMA Write past the end of the RMB element the client gave fails with a remote
//!   access error at the rogue (the provider enforces the MR bounds, D2), and the
//!   connection's data is untouched;
//! - a CDC with a foreign alert token changes nothing (SMC-CDC-11).
//!
//! Addresses 127.115.11.x, 127.115.12.x, 127.115.13.x.

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
        eids: Vec::new(),
        hostname: [b' '; HOSTNAME_LEN],
        max_conns: 255,
        max_links: 1,
    }
}

/// Plays the server side of CLC and CONFIRM LINK honestly, then hands over.
fn rogue_server(l: TcpListener, addr: &str) -> Rogue {
    let dev = roce::RoceFactory
        .open(
            &DeviceOptions::new()
                .with("addr", addr)
                .with("name", format!("rogue_{addr}")),
        )
        .unwrap();
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
    let addr = format!("127.115.{n}.1");
    let l = TcpListener::bind(format!("{addr}:0")).unwrap();
    let port = l.local_addr().unwrap().port();
    let a2 = addr.clone();
    let rogue = thread::spawn(move || rogue_server(l, &a2));
    let cdev = roce::RoceFactory
        .open(
            &DeviceOptions::new()
                .with("addr", format!("127.115.{n}.2"))
                .with("name", format!("smc_c{n}")),
        )
        .unwrap();
    let cfg = SmcConfig {
        prefix_len: 8,
        ..SmcConfig::default()
    };
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
    r.mr.write(0, &forged.to_bytes()).unwrap();
    r.qp.post_send_one(SendWr::new(1, WrOpcode::Send, vec![r.mr.sge(0, 44)]))
        .unwrap();
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
    let rkey = r.confirm.rmb_rkey;
    let base = r.confirm.rmb_vaddr;
    let len = r.confirm.rmbe_bytes() as u64;
    // An honest write of 5 octets plus its CDC.
    r.mr.write(100, b"hello").unwrap();
    r.qp.post_send_one(SendWr::new(
        2,
        WrOpcode::RdmaWrite {
            remote: RemoteAddr { addr: base, rkey },
        },
        vec![r.mr.sge(100, 5)],
    ))
    .unwrap();
    let cdc = Cdc {
        seq: 1,
        token: r.confirm.rmbe_alert_token,
        prod: Cursor::new(0, 5),
        ..Cdc::default()
    };
    r.mr.write(0, &cdc.to_bytes()).unwrap();
    r.qp.post_send_one(SendWr::new(3, WrOpcode::Send, vec![r.mr.sge(0, 44)]))
        .unwrap();
    let mut b = [0u8; 5];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    // Now 16 octets straddling the element's end.
    r.mr.write(200, &[0xEE; 16]).unwrap();
    r.qp.post_send_one(SendWr::new(
        4,
        WrOpcode::RdmaWrite {
            remote: RemoteAddr {
                addr: base + len - 8,
                rkey,
            },
        },
        vec![r.mr.sge(200, 16)],
    ))
    .unwrap();
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
    let rkey = r.confirm.rmb_rkey;
    let base = r.confirm.rmb_vaddr;
    r.mr.write(100, b"abcdefgh").unwrap();
    r.qp.post_send_one(SendWr::new(
        2,
        WrOpcode::RdmaWrite {
            remote: RemoteAddr { addr: base, rkey },
        },
        vec![r.mr.sge(100, 8)],
    ))
    .unwrap();
    let token = r.confirm.rmbe_alert_token;
    let foreign = Cdc {
        seq: 1,
        token: token ^ 0x8000_0000,
        prod: Cursor::new(0, 8),
        ..Cdc::default()
    };
    r.mr.write(0, &foreign.to_bytes()).unwrap();
    r.qp.post_send_one(SendWr::new(3, WrOpcode::Send, vec![r.mr.sge(0, 44)]))
        .unwrap();
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
    r.mr.write(44, &honest.to_bytes()).unwrap();
    r.qp.post_send_one(SendWr::new(4, WrOpcode::Send, vec![r.mr.sge(44, 44)]))
        .unwrap();
    let mut b = [0u8; 8];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"abcdefgh");
    drop(r.tcp);
}
