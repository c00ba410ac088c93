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
                // AUTH_SYS bodies decode with the lenient pad policy (any pad value, RFC 8166
                // §8.2.2.3 and Linux), so the round trip is by value; the bytes agree only
                // when the sender padded with zeros.
                let bytes = a.encode_body().expect("re-encodes");
                assert_eq!(AuthSys::decode_body(&bytes).expect("decodes again"), a);
                if strict_auth_sys(c.cred.body) {
                    assert_eq!(bytes, c.cred.body);
                }
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

/// Whether an AUTH_SYS body decodes with zero padding throughout.
fn strict_auth_sys(body: &[u8]) -> bool {
    let mut d = Decoder::new(body).pad_policy(PadPolicy::Strict);
    (|| -> Result<(), rpcrdma::xdr::XdrError> {
        d.get_u32()?;
        d.get_opaque(1 << 16)?;
        d.get_u32()?;
        d.get_u32()?;
        let n = d.get_u32()?;
        for _ in 0..n.min(64) {
            d.get_u32()?;
        }
        Ok(())
    })()
    .is_ok()
}
