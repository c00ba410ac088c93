//! # verbs: the provider-independent RDMA API of softrdma
//!
//! Upper layers (rpcrdma, smc, ipoib, the CLI) are written against this crate only.
