//! # rpcrdma: ONC RPC over TCP and over RDMA (RFC 8166)
#![forbid(unsafe_code)]

pub mod record;
pub mod rpc;
pub mod wire;
pub mod xdr;
