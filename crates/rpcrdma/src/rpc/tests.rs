use super::*;
use proptest::prelude::*;

const LO_FRAME8: &[u8] = include_bytes!("../../testdata/linux/lo-frame8.bin");
const LO_FRAME9: &[u8] = include_bytes!("../../testdata/linux/lo-frame9.bin");
const LO_FRAME28: &[u8] = include_bytes!("../../testdata/linux/lo-frame28.bin");

fn encode(m: &RpcMessage<'_>) -> Vec<u8> {
    let mut e = Encoder::new(Vec::new());
    m.encode(&mut e).unwrap();
    e.finish().0
}

fn decode(b: &[u8]) -> Result<RpcMessage<'_>, XdrError> {
    let mut d = Decoder::new(b);
    RpcMessage::decode(&mut d)
}

/// The NFSv3 NULL call Linux sent (lab capture, frame 8; RPC payload after the
/// 28-byte RPC-over-RDMA header).
#[test]
fn golden_linux_null_call() {
    let payload = &LO_FRAME8[28..];
    let m = decode(payload).unwrap();
    let want = RpcMessage::Call(CallHeader {
        xid: 0xaa1c4fb7,
        rpcvers: 2,
        prog: 100003,
        vers: 3,
        proc_: 0,
        cred: OpaqueAuth::NONE,
        verf: OpaqueAuth::NONE,
    });
    assert_eq!(m, want);
    assert_eq!(encode(&want), payload);
    assert_eq!(peek_xid_and_type(payload), Some((0xaa1c4fb7, MSG_CALL)));
}

/// Frame 9: the NULL reply (MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS).
#[test]
fn golden_linux_null_reply() {
    let payload = &LO_FRAME9[28..];
    let m = decode(payload).unwrap();
    let want = RpcMessage::Reply(ReplyHeader::accepted(0xaa1c4fb7, AcceptStat::Success));
    assert_eq!(m, want);
    assert_eq!(encode(&want), payload);
    if let RpcMessage::Reply(r) = &want {
        assert_eq!(r.encoded_len(), 24);
    }
}

/// Frame 28: AUTH_SYS credential of the Linux client ("rdmalab-vm", uid 0).
#[test]
fn golden_linux_auth_sys() {
    // transport header: 16 fixed + empty read list + empty write list + a
    // 3-segment reply chunk (1, 3, 3 x HLOO) = 80 bytes
    let rpc = &LO_FRAME28[80..];
    let mut d = Decoder::new(rpc);
    let RpcMessage::Call(c) = RpcMessage::decode(&mut d).unwrap() else {
        panic!("not a call")
    };
    assert_eq!((c.prog, c.vers, c.proc_), (100003, 3, 17));
    let sys = c.cred.as_auth_sys().unwrap();
    assert_eq!(
        sys,
        AuthSys {
            stamp: 0,
            machinename: b"rdmalab-vm",
            uid: 0,
            gid: 0,
            gids: vec![]
        }
    );
    assert_eq!(sys.machinename_str(), Some("rdmalab-vm"));
    assert_eq!(sys.encode_body().unwrap(), c.cred.body);
    assert_eq!(c.cred.body.len(), 32);
}

#[test]
fn every_accept_and_reject_status_roundtrips() {
    let verf = OpaqueAuth {
        flavor: flavor::AUTH_SHORT,
        body: b"abcde",
    };
    let bodies = [
        ReplyBody::Accepted {
            verf,
            stat: AcceptStat::Success,
        },
        ReplyBody::Accepted {
            verf,
            stat: AcceptStat::ProgUnavail,
        },
        ReplyBody::Accepted {
            verf,
            stat: AcceptStat::ProgMismatch { low: 2, high: 4 },
        },
        ReplyBody::Accepted {
            verf,
            stat: AcceptStat::ProcUnavail,
        },
        ReplyBody::Accepted {
            verf,
            stat: AcceptStat::GarbageArgs,
        },
        ReplyBody::Accepted {
            verf,
            stat: AcceptStat::SystemErr,
        },
        ReplyBody::Denied(RejectStat::RpcMismatch { low: 2, high: 2 }),
    ]
    .into_iter()
    .chain((0..=15).map(|s| ReplyBody::Denied(RejectStat::AuthError(AuthStat::from(s)))));
    for body in bodies {
        let h = ReplyHeader { xid: 7, body };
        let b = encode(&RpcMessage::Reply(h));
        assert_eq!(b.len(), h.encoded_len(), "{body:?}");
        assert_eq!(decode(&b).unwrap(), RpcMessage::Reply(h));
    }
    assert_eq!(AuthStat::from(99), AuthStat::Unknown(99));
    assert_eq!(AuthStat::from(99).code(), 99);
}

#[test]
fn golden_prog_mismatch_and_rpc_mismatch() {
    let b = encode(&RpcMessage::Reply(ReplyHeader::accepted(
        1,
        AcceptStat::ProgMismatch { low: 2, high: 3 },
    )));
    assert_eq!(
        b,
        [
            0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3
        ]
    );
    let b = encode(&RpcMessage::Reply(ReplyHeader {
        xid: 1,
        body: ReplyBody::Denied(RejectStat::AuthError(AuthStat::TooWeak)),
    }));
    assert_eq!(b, [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 5]);
}

#[test]
fn garbage_args_reply_is_the_24_byte_form() {
    let b = garbage_args_reply(0xdeadbeef);
    let want = encode(&RpcMessage::Reply(ReplyHeader::accepted(
        0xdeadbeef,
        AcceptStat::GarbageArgs,
    )));
    assert_eq!(&b[..], &want[..]);
    let h = ReplyHeader::accepted(0xdeadbeef, AcceptStat::GarbageArgs);
    assert_eq!(encode_reply_header(&h).unwrap(), want);
}

#[test]
fn call_with_other_rpcvers_still_decodes() {
    let c = CallHeader {
        xid: 5,
        rpcvers: 3,
        prog: 1,
        vers: 1,
        proc_: 1,
        cred: OpaqueAuth::NONE,
        verf: OpaqueAuth::NONE,
    };
    let b = encode(&RpcMessage::Call(c.clone()));
    assert_eq!(b.len(), c.encoded_len());
    assert_eq!(decode(&b).unwrap(), RpcMessage::Call(c));
}

#[test]
fn malformed_headers_are_typed_errors() {
    let bad_type = [0, 0, 0, 1, 0, 0, 0, 2];
    assert!(matches!(
        decode(&bad_type),
        Err(XdrError::BadDiscriminant { what: "msg_type", .. })
    ));
    let bad_accept = [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6];
    assert!(matches!(
        decode(&bad_accept),
        Err(XdrError::BadDiscriminant {
            what: "accept_stat",
            ..
        })
    ));
    let bad_reject = [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2];
    assert!(matches!(
        decode(&bad_reject),
        Err(XdrError::BadDiscriminant {
            what: "reject_stat",
            ..
        })
    ));
    let bad_stat = [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2];
    assert!(decode(&bad_stat).is_err());
    // opaque_auth body of 401 bytes
    let mut call = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1];
    call.extend_from_slice(&[0, 0, 0, 1, 0, 0, 1, 0x91]);
    call.extend_from_slice(&[0; 404]);
    assert_eq!(decode(&call).unwrap_err(), XdrError::TooLong { len: 401, max: 400 });
    let mut e = Encoder::new(Vec::new());
    let big = [0u8; 401];
    assert!(OpaqueAuth { flavor: 0, body: &big }.encode(&mut e).is_err());
}

#[test]
fn auth_sys_limits() {
    let name = [b'a'; 256];
    let a = AuthSys {
        stamp: 1,
        machinename: &name,
        uid: 1,
        gid: 1,
        gids: vec![],
    };
    assert!(a.encode_body().is_err());
    let a = AuthSys {
        stamp: 1,
        machinename: &name[..255],
        uid: 1,
        gid: 1,
        gids: (0..16).collect(),
    };
    let body = a.encode_body().unwrap();
    assert_eq!(body.len(), 4 + 4 + 256 + 4 + 4 + 4 + 64);
    assert_eq!(AuthSys::decode_body(&body).unwrap(), a);
    let a17 = AuthSys {
        gids: (0..17).collect(),
        ..a.clone()
    };
    assert!(a17.encode_body().is_err());
    // 17 gids on the wire
    let mut b = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17];
    b.extend_from_slice(&[0; 68]);
    assert!(matches!(AuthSys::decode_body(&b), Err(XdrError::TooLong { .. })));
    // trailing bytes inside the credential body
    let mut b = a.encode_body().unwrap();
    b.extend_from_slice(&[0; 4]);
    assert_eq!(AuthSys::decode_body(&b), Err(XdrError::TrailingBytes(4)));
    let none = OpaqueAuth::NONE;
    assert!(none.as_auth_sys().is_err());
}

proptest! {
    #[test]
    fn prop_call_roundtrip(xid in any::<u32>(), prog in any::<u32>(), vers in any::<u32>(), p in any::<u32>(),
                           cred in proptest::collection::vec(any::<u8>(), 0..=400),
                           verf in proptest::collection::vec(any::<u8>(), 0..=400),
                           fl in any::<u32>()) {
        let c = RpcMessage::Call(CallHeader { xid, rpcvers: 2, prog, vers, proc_: p,
            cred: OpaqueAuth { flavor: fl, body: &cred }, verf: OpaqueAuth { flavor: 0, body: &verf } });
        let b = encode(&c);
        prop_assert_eq!(decode(&b).unwrap(), c);
    }

    #[test]
    fn prop_decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = decode(&b);
        let _ = AuthSys::decode_body(&b);
    }
}
