//! # rpcrdma: ONC RPC over TCP and over RDMA (RFC 8166)
#![forbid(unsafe_code)]

pub mod credits;
pub mod inline;
pub mod private_data;
pub mod record;
pub mod rpc;
pub mod validate;
pub mod wire;
pub mod xdr;
