//! ONC RPC over TCP with record marking, over real loopback sockets: the demo
//! program, every accept/reject status on the wire, AUTH_NONE and AUTH_SYS, many
//! outstanding calls matched by XID (also when replies come out of order).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

use rpcrdma::client::{Auth, Call, RpcError};
use rpcrdma::demo;
use rpcrdma::record::encode_record;
use rpcrdma::rpc::{AcceptStat, AuthStat, RejectStat};
use rpcrdma::server::{Credential, ProcError, Registry};
use rpcrdma::tcp::{TcpClient, TcpServer};
use rpcrdma::xdr::{Decoder, ReplySizing};

fn registry() -> Registry {
    let mut r = demo::registry();
    r.register_version(demo::PROGRAM, 3);
    // proc 9 of version 1 needs AUTH_SYS with uid 0
    r.register(demo::PROGRAM, demo::VERSION, 9, |ctx, _, e| match &ctx.cred {
        Credential::Sys {
            uid: 0, machinename, ..
        } => {
            e.put_opaque(machinename, 255)?;
            Ok(())
        }
        Credential::Sys { .. } => Err(ProcError::Auth(AuthStat::BadCred)),
        Credential::None => Err(ProcError::Auth(AuthStat::TooWeak)),
    });
    r
}

fn server() -> (TcpServer, TcpClient) {
    let s = TcpServer::spawn("127.0.0.1:0".parse().unwrap(), Arc::new(registry())).unwrap();
    let c = TcpClient::connect(s.local_addr()).unwrap();
    (s, c)
}

#[test]
fn demo_program_sizes_and_padding() {
    let (_s, c) = server();
    demo::null(&c).unwrap();
    // every pad length 0..3, small and large
    for n in [
        0usize,
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        1021,
        1022,
        1023,
        1024,
        65_537,
        1 << 20,
        3 << 20,
    ] {
        let d = demo::pattern(n, n as u32);
        assert_eq!(demo::echo(&c, &d).unwrap(), d, "echo {n}");
        assert_eq!(demo::read(&c, n, 5).unwrap(), demo::pattern(n, 5), "read {n}");
        assert_eq!(
            demo::write(&c, &d).unwrap(),
            (n as u32, demo::checksum(&d)),
            "write {n}"
        );
    }
    let w: Vec<u32> = (0..50_000).collect();
    assert_eq!(
        demo::words(&c, &w).unwrap(),
        w.iter().rev().copied().collect::<Vec<_>>()
    );
}

fn status(c: &TcpClient, prog: u32, vers: u32, proc_: u32, args: &[u8], auth: &Auth) -> Result<Vec<u8>, RpcError> {
    let a = |e: &mut rpcrdma::xdr::Encoder<Vec<u8>>| e.put_opaque_fixed(args);
    let call = Call::new(prog, vers, proc_, &a, ReplySizing::default()).with_auth(auth);
    c.call(&call, |d: &mut Decoder<'_>| Ok(d.rest().to_vec()))
}

/// Every accept_stat and reject_stat answered over TCP (RFC 5531 §9).
#[test]
fn every_status_on_the_wire() {
    let (_s, c) = server();
    let none = Auth::None;
    assert_eq!(
        status(&c, 0x3000_0000, 1, 0, &[], &none),
        Err(RpcError::Accepted(AcceptStat::ProgUnavail))
    );
    assert_eq!(
        status(&c, demo::PROGRAM, 2, 0, &[], &none),
        Err(RpcError::Accepted(AcceptStat::ProgMismatch { low: 1, high: 3 }))
    );
    assert_eq!(
        status(&c, demo::PROGRAM, 1, 77, &[], &none),
        Err(RpcError::Accepted(AcceptStat::ProcUnavail))
    );
    // READ with one word of two arguments
    assert_eq!(
        status(&c, demo::PROGRAM, 1, demo::READ, &[0, 0, 0, 1], &none),
        Err(RpcError::Accepted(AcceptStat::GarbageArgs))
    );
    // READ beyond MAX_DATA: the handler answers SYSTEM_ERR
    assert_eq!(
        status(
            &c,
            demo::PROGRAM,
            1,
            demo::READ,
            &[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0],
            &none
        ),
        Err(RpcError::Accepted(AcceptStat::SystemErr))
    );
    assert_eq!(
        status(&c, demo::PROGRAM, 1, 9, &[], &none),
        Err(RpcError::Denied(RejectStat::AuthError(AuthStat::TooWeak)))
    );
    let user = Auth::sys("client", 1000, 100, &[1, 2]).unwrap();
    assert_eq!(
        status(&c, demo::PROGRAM, 1, 9, &[], &user),
        Err(RpcError::Denied(RejectStat::AuthError(AuthStat::BadCred)))
    );
    let root = Auth::sys("rooty", 0, 0, &[]).unwrap();
    let ok = status(&c, demo::PROGRAM, 1, 9, &[], &root).unwrap();
    assert_eq!(ok, [0, 0, 0, 5, b'r', b'o', b'o', b't', b'y', 0, 0, 0]);
    // a malformed AUTH_SYS body
    let broken = Auth::Sys(vec![0, 0, 0, 1]);
    assert_eq!(
        status(&c, demo::PROGRAM, 1, 0, &[], &broken),
        Err(RpcError::Denied(RejectStat::AuthError(AuthStat::BadCred)))
    );
}

fn raw_call(xid: u32, rpcvers: u32) -> Vec<u8> {
    let mut m = Vec::new();
    for w in [xid, 0, rpcvers, demo::PROGRAM, 1, 0, 0, 0, 0, 0] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m
}

fn read_record(s: &mut TcpStream) -> Vec<u8> {
    let mut rec = Vec::new();
    loop {
        let mut h = [0u8; 4];
        s.read_exact(&mut h).unwrap();
        let h = u32::from_be_bytes(h);
        let start = rec.len();
        rec.resize(start + (h & 0x7fff_ffff) as usize, 0);
        s.read_exact(&mut rec[start..]).unwrap();
        if h & 0x8000_0000 != 0 {
            return rec;
        }
    }
}

/// RPC_MISMATCH for rpcvers 3; a garbage record gets no answer and the
/// connection goes on; a record split into several fragments is reassembled.
#[test]
fn rpc_mismatch_garbage_and_fragments() {
    let (s, _c) = server();
    let mut t = TcpStream::connect(s.local_addr()).unwrap();
    let mut out = Vec::new();
    encode_record(&raw_call(0x11, 3), 1 << 20, &mut out).unwrap();
    encode_record(&[0xde, 0xad], 1 << 20, &mut out).unwrap();
    encode_record(&raw_call(0x12, 2), 8, &mut out).unwrap(); // 5 fragments
    t.write_all(&out).unwrap();
    let r = read_record(&mut t);
    // xid, REPLY, MSG_DENIED, RPC_MISMATCH, low 2, high 2
    let words: Vec<u32> = r.chunks(4).map(|w| u32::from_be_bytes(w.try_into().unwrap())).collect();
    assert_eq!(words, [0x11, 1, 1, 0, 2, 2]);
    let r = read_record(&mut t);
    let words: Vec<u32> = r.chunks(4).map(|w| u32::from_be_bytes(w.try_into().unwrap())).collect();
    assert_eq!(words, [0x12, 1, 0, 0, 0, 0], "NULL succeeded");
}

/// Many outstanding calls from many threads on one connection, each matched
/// to its reply by XID.
#[test]
fn many_outstanding_calls() {
    let (_s, c) = server();
    let c = Arc::new(c);
    let ts: Vec<_> = (0..8)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    let n = (t * 977 + i * 131) % 5000;
                    assert_eq!(demo::read(&*c, n, t as u32).unwrap(), demo::pattern(n, t as u32));
                }
            })
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }
}

/// A server that answers two calls in reverse order: each caller gets its own reply.
#[test]
fn replies_out_of_order_matched_by_xid() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let srv = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let a = read_record(&mut s);
        let b = read_record(&mut s);
        let mut out = Vec::new();
        for call in [b, a] {
            // echo the call's single argument word back as the result
            let mut rep = call[..4].to_vec();
            for w in [1u32, 0, 0, 0, 0] {
                rep.extend_from_slice(&w.to_be_bytes());
            }
            rep.extend_from_slice(&call[call.len() - 4..]);
            encode_record(&rep, 1 << 20, &mut out).unwrap();
        }
        s.write_all(&out).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
    });
    let c = Arc::new(TcpClient::connect(addr).unwrap());
    let ts: Vec<_> = [7u32, 9]
        .into_iter()
        .map(|v| {
            let c = c.clone();
            std::thread::spawn(move || {
                let a = move |e: &mut rpcrdma::xdr::Encoder<Vec<u8>>| e.put_u32(v);
                let call = Call::new(1, 1, 1, &a, ReplySizing::default());
                c.call(&call, |d| d.get_u32()).unwrap()
            })
        })
        .collect();
    let got: Vec<u32> = ts.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(got, [7, 9]);
    srv.join().unwrap();
}
