//! RPC-over-RDMA v1 header decoding and validation (RFC 8166 §4): never panic,
//! bounded allocation, and decode(encode(x)) == x for everything that decodes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rpcrdma::private_data::PrivateData;
use rpcrdma::validate::{FailedXids, ResponderPolicy, validate_call, validate_reply};
use rpcrdma::wire::chunks::{check_read_positions, check_returned_chunks, group_read_list};
use rpcrdma::wire::{Header, Limits};
use rpcrdma::xdr::Encoder;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    if let Ok((h, len)) = Header::decode(data, &limits) {
        assert!(len <= data.len());
        assert_eq!(h.encoded_len(), len);
        let mut e = Encoder::new(Vec::new());
        h.encode_any(&mut e).expect("a decoded header re-encodes");
        let (bytes, _) = e.finish();
        assert_eq!(&bytes[..], &data[..len]);
        if let Some(lists) = h.body.lists() {
            if let Ok(chunks) = group_read_list(&lists.reads) {
                let _ = check_read_positions(data.len() - len, &chunks, u64::MAX);
            }
            let _ = check_returned_chunks(lists, lists);
        }
    }
    let _ = validate_call(data, &ResponderPolicy::default(), &FailedXids::new(4));
    let _ = validate_reply(data, &limits, |_| None);
    let pending = rpcrdma::wire::ChunkLists::default();
    let _ = validate_reply(data, &limits, |_| Some(&pending));
    let _ = PrivateData::find(data);
});
