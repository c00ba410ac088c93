//! MPA negotiation failures (RFC 5044 §7.1, RFC 6581) against our provider,
//! driven by a raw peer over real sockets, in both roles: bad key, bad
//! revision, reject with private data, private data too long, markers
//! required, insufficient IRD, and the Request/Reply timeouts. Each checks
//! the bytes the provider sent (or that it sent none), that the connection
//! closed, that the application got a typed error, and that the listener and
//! the device's other connections are unharmed.

mod rawpeer;

use iwarp::IwarpConfig;
use iwarp::wire::mpa::{self, EnhancedData, FrameKind, Revision, RtrSet};
use rawpeer::*;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use verbs::*;

const T: Duration = Duration::from_secs(10);

fn quick_cfg() -> IwarpConfig {
    IwarpConfig {
        reply_timeout: Duration::from_millis(400),
        request_timeout: Duration::from_millis(400),
        ..IwarpConfig::default()
    }
}

/// A listening IUT whose listener answers well-formed peers with accept.
struct Server {
    dev: Device,
    addr: SocketAddr,
    listener: Listener,
}

fn server(cfg: IwarpConfig) -> Server {
    let dev = iwarp::open_device(cfg).unwrap();
    let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    Server {
        addr: listener.local_addr(),
        dev,
        listener,
    }
}

impl Server {
    /// A proper client still connects and moves data after the bad peer.
    fn still_serves(&self) {
        let pd = self.dev.alloc_pd().unwrap();
        let (cq_c, cq_s) = (self.dev.create_cq(16).unwrap(), self.dev.create_cq(16).unwrap());
        let addr = self.addr;
        let (pd2, cq2) = (pd.clone(), cq_c.clone());
        let c = std::thread::spawn(move || pd2.connect(addr, QpOptions::new(&cq2), T).unwrap());
        let req = self.listener.get_request(Some(T)).expect("the listener still accepts");
        let s = req.accept(&pd, QpOptions::new(&cq_s)).unwrap();
        let c = c.join().unwrap();
        let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
        s.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: vec![mr.sge(32, 32)],
        }])
        .unwrap();
        mr.write(0, b"ok").unwrap();
        c.post_send_one(SendWr::new(2, WrOpcode::Send, vec![mr.sge(0, 2)]))
            .unwrap();
        assert_eq!(cq_s.wait(Some(T)).unwrap().status, WcStatus::Success);
        assert_eq!(cq_c.wait(Some(T)).unwrap().status, WcStatus::Success);
    }

    /// No connect request reached the application.
    fn no_request(&self) {
        assert!(self.listener.get_request(Some(Duration::from_millis(50))).is_err());
    }
}

fn request_bytes(rev: u8, pd_len_override: Option<u16>, key: &[u8; 16], private_data: &[u8]) -> Vec<u8> {
    let r = mpa::Repr::enhanced(
        FrameKind::Request,
        EnhancedData {
            ird: 4,
            ord: 4,
            p2p: false,
            rtr: RtrSet::EMPTY,
        },
        private_data,
    );
    let mut out = Vec::new();
    r.emit_vec(&mut out).unwrap();
    out[..16].copy_from_slice(key);
    out[17] = rev;
    if let Some(l) = pd_len_override {
        out[18..20].copy_from_slice(&l.to_be_bytes());
    }
    out
}

fn raw_connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

// ----------------------------------------------------------- IUT = Responder

#[test]
fn responder_closes_on_bad_key_without_reply() {
    // RFC 5044 §7.1.2: an improperly formatted Request closes the connection.
    let s = server(quick_cfg());
    let mut sock = raw_connect(s.addr);
    sock.write_all(&request_bytes(2, None, b"MPA ID Req Frxme", &[]))
        .unwrap();
    let (got, closed) = drain(&mut sock);
    assert!(got.is_empty(), "no Reply to a bad key, got {got:02x?}");
    assert!(closed, "connection closed");
    s.no_request();
    s.still_serves();
}

#[test]
fn responder_closes_on_unsupported_revision() {
    // RFC 5044 §7.1.1 "Rev": revisions above 2 cannot interoperate (siw:
    // EPROTO). Rev 0 is accepted, as siw does (peers file §1.2).
    for rev in [3u8, 0xFF] {
        let s = server(quick_cfg());
        let mut sock = raw_connect(s.addr);
        sock.write_all(&request_bytes(rev, None, &mpa::KEY_REQUEST, &[]))
            .unwrap();
        let (got, closed) = drain(&mut sock);
        assert!(got.is_empty(), "rev {rev}: no Reply, got {got:02x?}");
        assert!(closed);
        s.no_request();
        s.still_serves();
    }
}

#[test]
fn responder_accepts_revision_1() {
    // A Rev 1 Request gets a Rev 1 Reply without the IRD/ORD block.
    let s = server(quick_cfg());
    let mut sock = raw_connect(s.addr);
    let r = mpa::Repr::basic(FrameKind::Request, Revision::V1, b"v1");
    let mut out = Vec::new();
    r.emit_vec(&mut out).unwrap();
    sock.write_all(&out).unwrap();
    let req = s.listener.get_request(Some(T)).unwrap();
    assert_eq!(req.private_data(), b"v1");
    let pd = s.dev.alloc_pd().unwrap();
    let cq = s.dev.create_cq(4).unwrap();
    let _qp = req.accept(&pd, QpOptions::new(&cq).private_data(b"ok1")).unwrap();
    let f = read_mpa_frame(&mut sock);
    let rep = mpa::Repr::parse_exact(&f, mpa::MAX_PRIVATE_DATA).unwrap();
    assert_eq!(
        (rep.kind, rep.revision, rep.enhanced, rep.private_data),
        (FrameKind::Reply, Revision::V1, None, &b"ok1"[..])
    );
}

#[test]
fn responder_closes_on_private_data_too_long() {
    // RFC 5044 §7.1.2 rule 9 / PD_Length > 512.
    let s = server(quick_cfg());
    let mut sock = raw_connect(s.addr);
    let mut req = request_bytes(2, Some(600), &mpa::KEY_REQUEST, &[]);
    req.resize(20 + 600, 0);
    sock.write_all(&req).unwrap();
    let (got, closed) = drain(&mut sock);
    assert!(got.is_empty(), "no Reply, got {got:02x?}");
    assert!(closed);
    s.no_request();
    s.still_serves();
}

#[test]
fn responder_accepts_private_data_at_its_limit() {
    // Receive: 512 octets of PD_Length (RFC 5044), i.e. the 4-octet IRD/ORD
    // block and 508 of ULP data. Send: 256 by default (siw's limit; more
    // crashes Linux 6.1 siw, docs/interop-siw.md D9), 512 when configured.
    for (tx_limit, reply_len, ok) in [(256, 252, true), (256, 253, false), (512, 508, true)] {
        let s = server(IwarpConfig {
            max_private_data_tx: tx_limit,
            ..quick_cfg()
        });
        let ask = Ask {
            private_data: vec![0x5A; mpa::MAX_PRIVATE_DATA - mpa::ENHANCED_DATA_LEN],
            ..Ask::default()
        };
        let peer = RawPeer::start(s.addr, &ask);
        let req = s.listener.get_request(Some(T)).unwrap();
        assert_eq!(req.private_data(), &ask.private_data[..]);
        let pd = s.dev.alloc_pd().unwrap();
        let cq = s.dev.create_cq(4).unwrap();
        let reply = vec![0xA5; reply_len];
        let r = req.accept(&pd, QpOptions::new(&cq).private_data(&reply));
        if ok {
            assert!(r.is_ok(), "{reply_len} octets within a {tx_limit} limit");
            let peer = peer.finish(&ask);
            assert_eq!(peer.reply_pd, reply);
        } else {
            assert!(
                r.is_err(),
                "{reply_len} octets refused locally under a {tx_limit} limit"
            );
        }
    }
}

#[test]
fn responder_rejects_with_private_data() {
    let s = server(quick_cfg());
    let mut sock = raw_connect(s.addr);
    sock.write_all(&request_bytes(2, None, &mpa::KEY_REQUEST, b"may I?"))
        .unwrap();
    let req = s.listener.get_request(Some(T)).unwrap();
    req.reject(b"no, thanks").unwrap();
    let f = read_mpa_frame(&mut sock);
    let rep = mpa::Repr::parse_exact(&f, mpa::MAX_PRIVATE_DATA).unwrap();
    assert_eq!(rep.kind, FrameKind::Reply);
    assert!(rep.reject, "R=1");
    assert_eq!(rep.private_data, b"no, thanks");
    let (rest, closed) = drain(&mut sock);
    assert!(rest.is_empty() && closed, "closed after the reject");
    s.still_serves();
}

#[test]
fn responder_rejects_markers_when_configured() {
    // Linux siw refuses M=1; with `reject_markers` we answer R=1 like it.
    let s = server(IwarpConfig {
        reject_markers: true,
        ..quick_cfg()
    });
    let mut sock = raw_connect(s.addr);
    let mut req = request_bytes(2, None, &mpa::KEY_REQUEST, &[]);
    req[16] |= 0x80;
    sock.write_all(&req).unwrap();
    let f = read_mpa_frame(&mut sock);
    let rep = mpa::Repr::parse_exact(&f, mpa::MAX_PRIVATE_DATA).unwrap();
    assert!(rep.reject, "R=1 to a peer requiring markers");
    let (_, closed) = drain(&mut sock);
    assert!(closed);
    s.no_request();
    s.still_serves();
}

#[test]
fn responder_times_out_a_silent_peer() {
    // RFC 5044 §7.1.2 rule 10: a Request that never comes.
    let s = server(quick_cfg());
    let mut sock = raw_connect(s.addr);
    let t0 = Instant::now();
    let (got, closed) = drain(&mut sock);
    let waited = t0.elapsed();
    assert!(got.is_empty() && closed, "closed without a word");
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(4),
        "closed after the request timeout, not {waited:?}"
    );
    // Meanwhile the listener served others (one thread per handshake).
    s.still_serves();
}

#[test]
fn responder_timeout_does_not_block_other_handshakes() {
    let s = server(IwarpConfig {
        request_timeout: Duration::from_secs(8),
        ..quick_cfg()
    });
    let _silent: Vec<TcpStream> = (0..4).map(|_| raw_connect(s.addr)).collect();
    let t0 = Instant::now();
    s.still_serves();
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "served while 4 peers stay silent"
    );
}

// ----------------------------------------------------------- IUT = Initiator

fn client(cfg: IwarpConfig, addr: SocketAddr, private_data: &[u8]) -> std::thread::JoinHandle<Result<QueuePair>> {
    let pd_bytes = private_data.to_vec();
    std::thread::spawn(move || {
        let dev = iwarp::open_device(cfg).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4).unwrap();
        let r = pd.connect(addr, QpOptions::new(&cq).private_data(&pd_bytes), T);
        std::mem::forget(dev);
        r
    })
}

fn reply(kind_key: &[u8; 16], rev: u8, reject: bool, private_data: &[u8]) -> Vec<u8> {
    let mut r = mpa::Repr::enhanced(
        FrameKind::Reply,
        EnhancedData {
            ird: 4,
            ord: 4,
            p2p: false,
            rtr: RtrSet::EMPTY,
        },
        private_data,
    );
    r.reject = reject;
    let mut out = Vec::new();
    r.emit_vec(&mut out).unwrap();
    out[..16].copy_from_slice(kind_key);
    out[17] = rev;
    out
}

#[test]
fn initiator_sends_siw_style_request() {
    // What we send by default: Rev 2, S set (0x10), no M/C, the IRD/ORD
    // block first, then our private data (peers file §1.2).
    let l = RawListener::new();
    let h = client(IwarpConfig::default(), l.addr(), b"hello");
    let (mut s, f) = l.accept_request();
    assert_eq!(&f[..16], b"MPA ID Req Frame");
    assert_eq!((f[16], f[17]), (0x10, 2), "flags S only, Rev 2");
    assert_eq!(u16::from_be_bytes([f[18], f[19]]), 4 + 5);
    assert_eq!(&f[24..], b"hello");
    s.write_all(&reply(&mpa::KEY_REPLY, 2, true, b"")).unwrap();
    assert!(matches!(h.join().unwrap(), Err(Error::Rejected { .. })));
}

#[test]
fn initiator_surfaces_reject_with_private_data() {
    let l = RawListener::new();
    let h = client(quick_cfg(), l.addr(), b"knock");
    let (mut s, _) = l.accept_request();
    s.write_all(&reply(&mpa::KEY_REPLY, 2, true, b"go away")).unwrap();
    match h.join().unwrap() {
        Err(Error::Rejected { private_data, detail }) => {
            assert_eq!(private_data, b"go away");
            // reply() sends an enhanced Reply with IRD/ORD 4/4, which reaches the
            // application as the iWARP provider's detail, not as a verbs type.
            let mpa = detail.as_ref().and_then(|d| d.downcast_ref::<iwarp::MpaReject>());
            assert_eq!(mpa.map(|m| m.ird_ord), Some(Some((4, 4))), "{detail:?}");
        }
        other => panic!("expected Rejected, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn initiator_fails_on_bad_reply_key() {
    let l = RawListener::new();
    let h = client(quick_cfg(), l.addr(), b"");
    let (mut s, _) = l.accept_request();
    s.write_all(&reply(b"MPA ID Rep Frxme", 2, false, b"")).unwrap();
    match h.join().unwrap() {
        Err(Error::Protocol(m)) => assert!(m.contains("MPA"), "{m}"),
        other => panic!("expected a protocol error, got {:?}", other.map(|_| ())),
    }
    let (got, closed) = drain(&mut s);
    assert!(got.is_empty() && closed, "closed, nothing sent: {got:02x?}");
}

#[test]
fn initiator_fails_on_request_key_in_reply() {
    // RFC 5044 §7.1.2 rule 8: a Request where a Reply belongs.
    let l = RawListener::new();
    let h = client(quick_cfg(), l.addr(), b"");
    let (mut s, _) = l.accept_request();
    s.write_all(&reply(&mpa::KEY_REQUEST, 2, false, b"")).unwrap();
    assert!(matches!(h.join().unwrap(), Err(Error::Protocol(_))));
}

#[test]
fn initiator_fails_on_bad_reply_revision() {
    let l = RawListener::new();
    let h = client(quick_cfg(), l.addr(), b"");
    let (mut s, _) = l.accept_request();
    s.write_all(&reply(&mpa::KEY_REPLY, 7, false, b"")).unwrap();
    assert!(matches!(h.join().unwrap(), Err(Error::Protocol(_))));
}

#[test]
fn initiator_fails_on_reply_private_data_too_long() {
    let l = RawListener::new();
    let h = client(quick_cfg(), l.addr(), b"");
    let (mut s, _) = l.accept_request();
    let mut r = reply(&mpa::KEY_REPLY, 2, false, b"");
    r[18..20].copy_from_slice(&1000u16.to_be_bytes());
    r.resize(20 + 1000, 0);
    s.write_all(&r).unwrap();
    assert!(matches!(h.join().unwrap(), Err(Error::Protocol(_))));
}

#[test]
fn initiator_refuses_to_send_private_data_too_long() {
    // Local misuse: a typed error before anything goes on the wire, not even a TCP connect
    // (a connect closed at once breaks a Linux siw listener, lab hazard 1). The default
    // limit is siw's 256 octets of MPA private data: 252 of ours after the IRD/ORD words.
    let l = RawListener::new();
    l.l.set_nonblocking(true).unwrap();
    for (cfg, n) in [
        (quick_cfg(), 253),
        (
            IwarpConfig {
                max_private_data_tx: 512,
                ..quick_cfg()
            },
            509,
        ),
        (quick_cfg(), 600),
    ] {
        match client(cfg, l.addr(), &vec![1u8; n]).join().unwrap() {
            Err(Error::InvalidArgument(InvalidArg::PrivateDataTooLong { len, max })) => {
                assert!(len > max, "{n}: {len} <= {max}")
            }
            other => panic!("{n} octets: expected InvalidArgument, got {:?}", other.map(|_| ())),
        }
        assert!(l.l.accept().is_err(), "{n} octets: no TCP connection may be opened");
    }
    // 252 octets (MPA PD 256) are sent.
    l.l.set_nonblocking(false).unwrap();
    let h = client(quick_cfg(), l.addr(), &[7u8; 252]);
    let (mut s, f) = l.accept_request();
    assert_eq!(u16::from_be_bytes([f[18], f[19]]), 256);
    assert_eq!(&f[24..], &[7u8; 252][..]);
    s.write_all(&reply(&mpa::KEY_REPLY, 2, true, b"")).unwrap();
    assert!(matches!(h.join().unwrap(), Err(Error::Rejected { .. })));
}

#[test]
fn initiator_times_out_waiting_for_reply() {
    let l = RawListener::new();
    let t0 = Instant::now();
    let h = client(quick_cfg(), l.addr(), b"");
    let (mut s, _) = l.accept_request();
    assert!(matches!(h.join().unwrap(), Err(Error::Timeout)));
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    let (_, closed) = drain(&mut s);
    assert!(closed, "the initiator closed the connection");
}

#[test]
fn initiator_insufficient_ird_sends_terminate() {
    // RFC 6581 §9.1: the Responder's ORD exceeds our IRD -> Terminate
    // 2/0/0x06 in Full Operation, then close.
    let l = RawListener::new();
    let h = std::thread::spawn({
        let addr = l.addr();
        move || {
            let dev = iwarp::open_device(quick_cfg()).unwrap();
            let pd = dev.alloc_pd().unwrap();
            let cq = dev.create_cq(4).unwrap();
            pd.connect(addr, QpOptions::new(&cq).rd_atomic(1, 1), T).map(|_| ())
        }
    });
    let (mut s, f) = l.accept_request();
    let req = mpa::Repr::parse_exact(&f, 512).unwrap();
    assert_eq!(req.enhanced.map(|e| (e.ird, e.ord)), Some((1, 1)));
    let mut r = mpa::Repr::enhanced(
        FrameKind::Reply,
        EnhancedData {
            ird: 1,
            ord: 9,
            p2p: false,
            rtr: RtrSet::EMPTY,
        },
        b"",
    );
    r.crc = false;
    let mut out = Vec::new();
    r.emit_vec(&mut out).unwrap();
    s.write_all(&out).unwrap();
    assert!(h.join().unwrap().is_err());
    let (got, closed) = drain(&mut s);
    assert!(closed);
    let mut d = iwarp::wire::fpdu::Deframer::new(Default::default());
    let (_, u) = d.next_fpdu(&got).expect("a Terminate FPDU");
    let t = decode_terminate(u.expect("whole FPDU"));
    assert_eq!((t.cause.layer.to_nibble(), t.cause.etype, t.cause.code), (2, 0, 0x06));
}

// ------------------------------------------------ peer-to-peer (RFC 6581 §9.2)

/// RFC 6581 §9.2 (issue 12 point 8; RDMAP/MPA requirements C.3): an
/// Initiator asking for the peer-to-peer model (A = 1, Write and Read RTRs
/// offered) from a Responder not configured for p2p gets an accepting Reply
/// with A = 1 ("If Control Flag A is 1 in the MPA Request message, then the
/// responder MUST set Control Flag A to 1 in the MPA reply message") and one
/// RTR type it offered; its zero-length Write RTR is consumed silently, and
/// its first Send after it lands in the Responder's first receive, with no
/// Terminate. Checked on the wire.
#[test]
fn responder_answers_a_p2p_request_with_p2p_and_takes_the_rtr() {
    for offer in [
        RtrSet::WRITE.union(RtrSet::READ),
        RtrSet::WRITE,
        RtrSet::READ,
        RtrSet::SEND,
    ] {
        p2p_against_a_non_p2p_responder(offer);
    }
}

fn p2p_against_a_non_p2p_responder(offer: RtrSet) {
    let s = server(quick_cfg());
    let mut sock = raw_connect(s.addr);
    let r = mpa::Repr::enhanced(
        FrameKind::Request,
        EnhancedData {
            ird: 4,
            ord: 4,
            p2p: true,
            rtr: offer,
        },
        b"p2p",
    );
    let mut out = Vec::new();
    r.emit_vec(&mut out).unwrap();
    sock.write_all(&out).unwrap();
    let req = s
        .listener
        .get_request(Some(T))
        .expect("the Request reaches the application");
    let pd = s.dev.alloc_pd().unwrap();
    let cq = s.dev.create_cq(16).unwrap();
    let accepted = std::thread::spawn(move || req.accept(&pd, QpOptions::new(&cq)).map(|qp| (qp, pd, cq)));
    let frame = read_mpa_frame(&mut sock);
    let rep = mpa::Repr::parse_exact(&frame, mpa::MAX_PRIVATE_DATA).expect("the Reply parses");
    eprintln!("reply: {rep:?}");
    assert_eq!(rep.kind, FrameKind::Reply);
    assert!(!rep.reject, "accepted");
    let e = rep.enhanced.expect("an enhanced Reply");
    assert!(e.p2p, "A = 1 in the Reply to a Request with A = 1");
    assert!(
        !e.rtr.is_empty() && offer.intersection(e.rtr) == e.rtr,
        "RTR types the Initiator offered ({offer:?}), not {:?}",
        e.rtr
    );
    let (qp, pd, cq) = accepted.join().unwrap().expect("accept");
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    qp.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: vec![mr.sge(0, 64)],
    }])
    .unwrap();
    let mut peer = RawPeer {
        sock,
        framer: iwarp::wire::fpdu::Framer::new(false, false),
        deframer: iwarp::wire::fpdu::Deframer::new(Default::default()),
        buf: Vec::new(),
        reply_pd: rep.private_data.to_vec(),
    };
    let mut msn = 1;
    if e.rtr.contains(iwarp::engine::Rtr::Write) {
        peer.send(&tagged(op::WRITE, 0, 0, true, &[]));
    } else if e.rtr.contains(iwarp::engine::Rtr::Send) {
        peer.send(&untagged(op::SEND, 0, 1, 0, true, 0, &[]));
        msn = 2;
    } else {
        // zero-length Read Request: sink STag/TO, size 0, source STag/TO
        let mut body = vec![0u8; 28];
        body[0..4].copy_from_slice(&0x1234u32.to_be_bytes());
        peer.send(&untagged(op::READ_REQUEST, 1, 1, 0, true, 0, &body));
        let rr = peer.read_until(|_| true).expect("the zero-length Read Response");
        assert!(
            rr.len() >= 2 && rr[1] & 0x0f == op::READ_RESPONSE,
            "Read Response to the RTR"
        );
    }
    peer.send(&untagged(op::SEND, 0, msn, 0, true, 0, b"after rtr"));
    let wc = cq.wait(Some(T)).expect("the Send arrives");
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (7, WcStatus::Success, 9));
    assert_eq!(mr.to_vec(0, 9).unwrap(), b"after rtr");
    peer.sock.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut b = [0u8; 64];
    assert!(
        std::io::Read::read(&mut peer.sock, &mut b).is_err(),
        "nothing (no Terminate) after the Send"
    );
}
