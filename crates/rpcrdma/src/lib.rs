//! # rpcrdma: ONC RPC over TCP and over RDMA (RFC 8166)
