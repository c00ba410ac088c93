//! ONC RPC v2 message headers (RFC 5531 §9) and AUTH_SYS bodies: never panic,
//! and decode(encode(x)) == x for everything that decodes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rpcrdma::rpc::{AuthSys, RpcMessage};
use rpcrdma::xdr::{ChunkSource, Decoder, Encoder, InsertedChunk, PadPolicy, XdrDecode, XdrEncode};

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(data).pad_policy(PadPolicy::Strict);
    if let Ok(m) = RpcMessage::decode(&mut d) {
        let used = d.offset();
        let mut e = Encoder::new(Vec::new());
        m.encode(&mut e).expect("a decoded message re-encodes");
        let (bytes, _) = e.finish();
        assert_eq!(&bytes[..], &data[..used]);
        if let RpcMessage::Call(c) = &m {
            if let Ok(a) = c.cred.as_auth_sys() {
                assert_eq!(a.encode_body().expect("re-encodes"), c.cred.body);
            }
        }
    }
    let _ = AuthSys::decode_body(data);
    // the chunk-aware decoder with a chunk cut from the input itself
    if data.len() >= 8 {
        let (head, rest) = data.split_at(data.len() / 2);
        let chunks = [InsertedChunk {
            position: (u32::from(head[0]) & !3),
            data: rest,
        }];
        let mut d = Decoder::with_chunks(head, ChunkSource::Read(&chunks));
        while d.get_opaque_ddp(1 << 16).is_ok() {}
        let _ = d.finish();
    }
});
