//! rpcbind / portmapper version 2 GETPORT (RFC 1833 §3): which port serves a
//! program and version over TCP or UDP. Linux's `mount` asks it for mountd's
//! port (MOUNT goes over TCP also for NFS/RDMA mounts).

use crate::client::{Call, RpcClient, RpcError};
use crate::server::Registry;
use crate::xdr::{Decoder, Encoder, ReplySizing, Sink, XdrError};

/// PMAP_PROG.
pub const PROGRAM: u32 = 100_000;
/// PMAP_VERS (rpcbind answers version 2 as the portmapper).
pub const VERSION: u32 = 2;
/// PMAPPROC_SET.
pub const SET: u32 = 1;
/// PMAPPROC_UNSET.
pub const UNSET: u32 = 2;
/// PMAPPROC_GETPORT.
pub const GETPORT: u32 = 3;
/// IPPROTO_TCP.
pub const IPPROTO_TCP: u32 = 6;
/// IPPROTO_UDP.
pub const IPPROTO_UDP: u32 = 17;
/// The rpcbind port.
pub const PORT: u16 = 111;

/// struct mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// prog.
    pub prog: u32,
    /// vers.
    pub vers: u32,
    /// prot.
    pub prot: u32,
    /// port (ignored in GETPORT).
    pub port: u32,
}

impl Mapping {
    /// Encode.
    pub fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        e.put_u32(self.prog)?;
        e.put_u32(self.vers)?;
        e.put_u32(self.prot)?;
        e.put_u32(self.port)
    }
    /// Decode.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self, XdrError> {
        Ok(Mapping {
            prog: d.get_u32()?,
            vers: d.get_u32()?,
            prot: d.get_u32()?,
            port: d.get_u32()?,
        })
    }
}

/// GETPORT: the port of `prog`/`vers` over `prot`; 0 means not registered.
pub fn getport<C: RpcClient>(c: &C, prog: u32, vers: u32, prot: u32) -> Result<u16, RpcError> {
    let m = Mapping {
        prog,
        vers,
        prot,
        port: 0,
    };
    let args = |e: &mut Encoder<Vec<u8>>| m.encode(e);
    let call = Call::new(
        PROGRAM,
        VERSION,
        GETPORT,
        &args,
        ReplySizing {
            max_results: 4,
            ddp_results: vec![],
        },
    );
    let port = c.call(&call, |d| d.get_u32())?;
    u16::try_from(port).map_err(|_| {
        RpcError::Decode(XdrError::TooLong {
            len: port as usize,
            max: 65535,
        })
    })
}

fn set_or_unset<C: RpcClient>(c: &C, proc_: u32, m: Mapping) -> Result<bool, RpcError> {
    let args = |e: &mut Encoder<Vec<u8>>| m.encode(e);
    let call = Call::new(
        PROGRAM,
        VERSION,
        proc_,
        &args,
        ReplySizing {
            max_results: 4,
            ddp_results: vec![],
        },
    );
    c.call(&call, |d| d.get_bool())
}

/// PMAPPROC_SET: register `prog`/`vers` over `prot` at `port` (rpcbind accepts it from a
/// local caller only). False when the portmapper refused (e.g. another port is registered).
pub fn set<C: RpcClient>(c: &C, prog: u32, vers: u32, prot: u32, port: u16) -> Result<bool, RpcError> {
    let m = Mapping {
        prog,
        vers,
        prot,
        port: u32::from(port),
    };
    set_or_unset(c, SET, m)
}

/// PMAPPROC_UNSET: drop every registration of `prog`/`vers`.
pub fn unset<C: RpcClient>(c: &C, prog: u32, vers: u32) -> Result<bool, RpcError> {
    let m = Mapping {
        prog,
        vers,
        prot: 0,
        port: 0,
    };
    set_or_unset(c, UNSET, m)
}

/// Register a GETPORT that answers from `table` (prog, vers, prot) -> port
/// (for test servers).
pub fn register(reg: &mut Registry, table: Vec<(u32, u32, u32, u16)>) {
    reg.register_null(PROGRAM, VERSION);
    reg.register(PROGRAM, VERSION, GETPORT, move |_, d, e| {
        let m = Mapping::decode(d)?;
        let port = table
            .iter()
            .find(|t| (t.0, t.1, t.2) == (m.prog, m.vers, m.prot))
            .map_or(0, |t| u32::from(t.3));
        e.put_u32(port)?;
        Ok(())
    });
}
