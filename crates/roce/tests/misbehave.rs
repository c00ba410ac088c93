//! A scripted misbehaving peer against a real RoCEv2 device of ours: a plain UDP socket
//! on 127.136.n.2:4791 speaks RC with our own `wire` encoders (BTH/RETH, ICRC sealed as
//! rxe computes it, IPv4 ID 0) to one QP of a device on 127.136.n.1, and checks what comes
//! back: the NAK codes of IBA vol. 1 ch. 9 (§9.7.5.2 NAKs; §9.7.4.1 responder checks: PSN,
//! opcode sequence, R_Key, bounds and access rights in §9.7.4.1.5), silent drops for a bad
//! ICRC (annex A17 §A17.3.4, counted as `icrc_err`) and a wrong P_Key (§9.6.1 header
//! validation), and the responder QP left in Error after a NAK of class "invalid request" or
//! "remote access error" (§9.9; the responder-side subsection is unconfirmed). Requirement: C3 of ../shared/requirements/smcr-ipoibcm.md (RC
//! transport, NAK codes, ICRC); issue 13 "what must hold" 3.
//!
//! Not here: a wrong Q_Key (only UD and the GSI QP1 check Q_Keys: `misbehave_gsi.rs`) and a
//! REQ for a service nobody listens on (REJ 8: the CM's tests and `misbehave_gsi.rs`).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use roce::wire::{Aeth, Bth, ExtHeaders, NakCode, Opcode, Packet, Psn, Reth, Syndrome, icrc};
use verbs::*;

/// The PSN the device's QP expects first.
const RQ_PSN: u32 = 1000;
/// Our (the peer's) QPN, which the device answers to.
const PEER_QPN: u32 = 0x77;
const LEN: usize = 4096;

struct Peer {
    sock: UdpSocket,
    ip: Ipv4Addr,
    dev_ip: Ipv4Addr,
    dev: Device,
    qp: QueuePair,
    /// LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ, filled with 0x5a.
    mr: MemoryRegion,
    /// LOCAL_WRITE | REMOTE_WRITE: no remote read.
    wo: MemoryRegion,
    _cq: CompletionQueue,
}

/// A device on 127.136.`n`.1 with one RC QP in RTS towards the peer on 127.136.`n`.2.
fn peer(n: u8) -> Peer {
    let (dev_ip, ip) = (Ipv4Addr::new(127, 136, n, 1), Ipv4Addr::new(127, 136, n, 2));
    let sock = UdpSocket::bind(SocketAddr::new(ip.into(), 4791)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let opts = DeviceOptions::new()
        .with("addr", dev_ip)
        .with("name", format!("rxe_{dev_ip}"))
        // The peer's UDP socket sends with IPv4 ID 0, which this mode assumes.
        .with("icrc_rx", "udp");
    let dev = roce::RoceFactory.open(&opts).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
    qp.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
    qp.modify_qp(&QpAttr::rtr(RtrAttr {
        ah_attr: AhAttr::to_gid(Gid::from_ipv4(ip)),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: PEER_QPN,
        rq_psn: RQ_PSN,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
    }))
    .unwrap();
    qp.modify_qp(&QpAttr::rts(RtsAttr {
        sq_psn: 5000,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
    }))
    .unwrap();
    let mr = pd
        .reg_mr(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    mr.fill(0, LEN, 0x5a).unwrap();
    let wo = pd.reg_mr(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    Peer {
        sock,
        ip,
        dev_ip,
        dev,
        qp,
        mr,
        wo,
        _cq: cq,
    }
}

/// A request to the device's QP: `opcode` at `psn`, AckReq set.
fn req(opcode: Opcode, psn: u32, reth: Option<Reth>) -> (Bth, ExtHeaders) {
    let mut bth = Bth::new(opcode, 0, Psn::new(psn));
    bth.ack_req = true;
    (
        bth,
        ExtHeaders {
            reth,
            ..ExtHeaders::default()
        },
    )
}

fn reth(mr: &MemoryRegion, off: i64, len: u32) -> Option<Reth> {
    Some(Reth {
        va: mr.addr().wrapping_add_signed(off),
        r_key: mr.rkey(),
        dma_len: len,
    })
}

impl Peer {
    /// Emits `bth`/`ext`/`payload` to the device's QP with a correct ICRC, then flips
    /// ICRC bit `flip` if given.
    fn send(&self, (mut bth, ext): (Bth, ExtHeaders), payload: &[u8], flip: Option<u32>) {
        bth.dest_qp = self.qp.qp_num();
        let p = Packet::new(bth, ext, payload).unwrap();
        let mut b = vec![0; p.buffer_len()];
        p.emit(&mut b).unwrap();
        let ip = icrc::ipv4_header(self.ip.octets(), self.dev_ip.octets(), 0, b.len());
        let udp = icrc::udp_header(4791, 4791, b.len());
        icrc::seal(&ip, &udp, &mut b).unwrap();
        if let Some(bit) = flip {
            let n = b.len();
            b[n - 4 + (bit / 8) as usize] ^= 1 << (bit % 8);
        }
        self.sock
            .send_to(&b, SocketAddr::new(self.dev_ip.into(), 4791))
            .unwrap();
    }

    /// The next packet from the device within `wait` (its ICRC checked), as BTH, extension
    /// headers and payload.
    fn recv(&self, wait: Duration) -> Option<(Bth, ExtHeaders, Vec<u8>)> {
        let t0 = Instant::now();
        let mut buf = [0u8; 9000];
        while t0.elapsed() < wait {
            let Ok((n, from)) = self.sock.recv_from(&mut buf) else {
                continue;
            };
            assert_eq!(from.ip(), std::net::IpAddr::V4(self.dev_ip));
            let ip = icrc::ipv4_header(self.dev_ip.octets(), self.ip.octets(), 0, n);
            let udp = icrc::udp_header(from.port(), 4791, n);
            icrc::verify(&ip, &udp, &buf[..n]).expect("the device's ICRC is right");
            let p = Packet::parse(&buf[..n]).expect("the device sends well-formed packets");
            assert_eq!(p.bth.dest_qp, PEER_QPN);
            return Some((p.bth, p.ext, p.payload.to_vec()));
        }
        None
    }

    /// The device's answer must be an ACKNOWLEDGE with `syndrome` for `psn`.
    fn expect_ack(&self, syndrome: Syndrome, psn: u32) -> Aeth {
        let (bth, ext, _) = self.recv(Duration::from_secs(5)).expect("an answer");
        assert_eq!(bth.opcode, Opcode::RC_ACKNOWLEDGE, "{bth:?}");
        assert_eq!(bth.psn, Psn::new(psn), "{bth:?}");
        let aeth = ext.aeth.unwrap();
        match syndrome {
            Syndrome::Ack { .. } => assert!(aeth.syndrome.is_ack(), "{aeth:?}"),
            s => assert_eq!(aeth.syndrome, s, "{aeth:?}"),
        }
        aeth
    }

    fn expect_silence(&self) {
        assert!(self.recv(Duration::from_millis(200)).is_none(), "no answer");
    }

    /// The device's QP reaches Error (the responder's NAK classes that end the connection).
    fn expect_qp_error(&self) {
        let t0 = Instant::now();
        while self.qp.state() != QpState::Err && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(self.qp.state(), QpState::Err);
    }

    fn untouched(&self) {
        assert!(self.mr.to_vec(0, LEN).unwrap().iter().all(|&b| b == 0x5a));
    }
}

#[test]
fn a_well_formed_write_is_placed_and_acked_c3() {
    let p = peer(1);
    p.send(
        req(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN, reth(&p.mr, 8, 5)),
        b"hello",
        None,
    );
    p.expect_ack(Syndrome::ACK, RQ_PSN);
    assert_eq!(p.mr.to_vec(8, 5).unwrap(), b"hello");
    // A Read of it comes back as READ RESPONSE ONLY at the request's PSN.
    p.send(
        req(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 1, reth(&p.mr, 8, 5)),
        b"",
        None,
    );
    let (bth, ext, payload) = p.recv(Duration::from_secs(5)).unwrap();
    assert_eq!(
        (bth.opcode, bth.psn),
        (Opcode::RC_RDMA_READ_RESPONSE_ONLY, Psn::new(RQ_PSN + 1))
    );
    assert!(ext.aeth.unwrap().syndrome.is_ack());
    assert_eq!(payload, b"hello");
}

#[test]
fn write_with_an_invalid_r_key_gets_nak_remote_access_error_c3_iba_9_7_4_1_5() {
    let p = peer(2);
    let bad = Some(Reth {
        va: p.mr.addr(),
        r_key: p.mr.rkey() ^ 0x0100_0000,
        dma_len: 16,
    });
    p.send(req(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN, bad), &[0xee; 16], None);
    p.expect_ack(Syndrome::Nak(NakCode::RemoteAccessError), RQ_PSN);
    p.untouched();
    p.expect_qp_error();
}

#[test]
fn write_out_of_bounds_gets_nak_remote_access_error_c3() {
    let p = peer(3);
    p.send(
        req(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN, reth(&p.mr, LEN as i64 - 8, 16)),
        &[0xee; 16],
        None,
    );
    p.expect_ack(Syndrome::Nak(NakCode::RemoteAccessError), RQ_PSN);
    p.untouched();
    p.expect_qp_error();
}

#[test]
fn read_out_of_bounds_gets_nak_remote_access_error_c3() {
    let p = peer(4);
    p.send(
        req(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN, reth(&p.mr, -8, 64)),
        b"",
        None,
    );
    p.expect_ack(Syndrome::Nak(NakCode::RemoteAccessError), RQ_PSN);
    p.expect_qp_error();
}

#[test]
fn read_without_remote_read_gets_nak_remote_access_error_c3() {
    let p = peer(5);
    p.send(req(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN, reth(&p.wo, 0, 64)), b"", None);
    p.expect_ack(Syndrome::Nak(NakCode::RemoteAccessError), RQ_PSN);
    p.expect_qp_error();
}

#[test]
fn write_middle_without_first_gets_nak_invalid_request_c3_iba_9_7_4_1() {
    let p = peer(6);
    p.send(req(Opcode::RC_RDMA_WRITE_MIDDLE, RQ_PSN, None), &[0xee; 1024], None);
    p.expect_ack(Syndrome::Nak(NakCode::InvalidRequest), RQ_PSN);
    p.untouched();
    p.expect_qp_error();
}

#[test]
fn send_last_without_first_gets_nak_invalid_request_c3() {
    let p = peer(7);
    p.send(req(Opcode::RC_SEND_LAST, RQ_PSN, None), b"tail", None);
    p.expect_ack(Syndrome::Nak(NakCode::InvalidRequest), RQ_PSN);
    p.expect_qp_error();
}

#[test]
fn psn_far_ahead_gets_one_psn_sequence_error_nak_then_recovers_c3_iba_9_7_4_1() {
    let p = peer(8);
    let far = (RQ_PSN + 0x10_0000) & Psn::MASK;
    p.send(req(Opcode::RC_RDMA_WRITE_ONLY, far, reth(&p.mr, 0, 4)), b"late", None);
    // The NAK names the PSN the responder expects.
    p.expect_ack(Syndrome::Nak(NakCode::PsnSequenceError), RQ_PSN);
    p.untouched();
    // Only one NAK per sequence error (§9.7.5.2; subsection unconfirmed): a second stray packet is dropped.
    p.send(
        req(Opcode::RC_RDMA_WRITE_ONLY, far + 1, reth(&p.mr, 0, 4)),
        b"late",
        None,
    );
    p.expect_silence();
    // The expected PSN is still accepted: the connection lives on.
    p.send(
        req(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN, reth(&p.mr, 0, 4)),
        b"good",
        None,
    );
    p.expect_ack(Syndrome::ACK, RQ_PSN);
    assert_eq!(p.mr.to_vec(0, 4).unwrap(), b"good");
    assert_eq!(p.qp.state(), QpState::Rts);
}

#[test]
fn bad_icrc_is_dropped_silently_and_counted_a17() {
    let p = peer(9);
    let w = || req(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN, reth(&p.mr, 0, 4));
    p.send(w(), b"evil", Some(5));
    p.expect_silence();
    p.untouched();
    assert_eq!(p.dev.hw_counter("icrc_err"), Some(1));
    // The same packet with its ICRC intact is taken at the same PSN.
    p.send(w(), b"fine", None);
    p.expect_ack(Syndrome::ACK, RQ_PSN);
    assert_eq!(p.mr.to_vec(0, 4).unwrap(), b"fine");
}

/// C3, IBA vol. 1 §9.6.1 / §10.9 (unconfirmed): P_Keys of other partitions (0x1234 limited, 0x8001 full
/// member) never reach the QP (P_Key 0xffff): dropped silently, counted as
/// `misdirected_pkts`; the QP stays in RTS and takes the next good packet at the same PSN.
#[test]
fn wrong_p_key_is_dropped_silently_iba_9_6_1() {
    let p = peer(10);
    for (n, key) in [0x1234u16, 0x8001].into_iter().enumerate() {
        let (mut bth, ext) = req(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN, reth(&p.mr, 0, 4));
        bth.p_key = key;
        p.send((bth, ext), b"evil", None);
        p.expect_silence();
        p.untouched();
        assert_eq!(
            p.dev.hw_counter("misdirected_pkts"),
            Some(n as u64 + 1),
            "P_Key {key:#x}"
        );
    }
    p.send(
        req(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN, reth(&p.mr, 0, 4)),
        b"fine",
        None,
    );
    p.expect_ack(Syndrome::ACK, RQ_PSN);
    assert_eq!(p.qp.state(), QpState::Rts);
}
