//! RPC and RPC-over-RDMA messages built by hand, for the tests that play a raw or hostile
//! peer (hostile_rdma.rs, misbehave.rs, stalled_client.rs). Not every file uses each one.
#![allow(dead_code)]

use rpcrdma::demo;
use rpcrdma::wire::{Body, ChunkLists, Header};
use rpcrdma::xdr::Encoder;

/// An ONC RPC call of the demo program: header words, AUTH_NONE twice, then `args`.
pub fn rpc_call(xid: u32, proc_: u32, args: &[u32]) -> Vec<u8> {
    [xid, 0, 2, demo::PROGRAM, demo::VERSION, proc_, 0, 0, 0, 0]
        .iter()
        .chain(args)
        .flat_map(|w| w.to_be_bytes())
        .collect()
}

/// An RPC-over-RDMA header of any version and body (credits 8), then `payload`.
pub fn msg_with(xid: u32, vers: u32, body: Body, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        xid,
        vers,
        credit: 8,
        body,
    };
    let mut e = Encoder::new(Vec::new());
    h.encode_any(&mut e).unwrap();
    let mut m = e.finish().0;
    m.extend_from_slice(payload);
    m
}

/// A version 1 RDMA_MSG with `lists`, then `payload`.
pub fn msg(xid: u32, lists: ChunkLists, payload: &[u8]) -> Vec<u8> {
    msg_with(xid, 1, Body::Msg(lists), payload)
}
