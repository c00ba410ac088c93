//! MOUNT version 3 (RFC 1813 Appendix I): MNT and UMNT, client side, and the
//! argument/result codecs the test server ([`crate::nfs3::memfs`]) shares.
//! Linux's NFS client talks MOUNT over TCP to the port rpcbind names
//! ([`crate::portmap`]) even when NFS itself runs over RDMA.

use crate::client::{Auth, Call, RpcClient, RpcError};
use crate::nfs3::{FHSIZE3, Fh};
use crate::xdr::{Decoder, Encoder, ReplySizing, Sink, XdrEncode, XdrError};

/// MOUNT program number.
pub const PROGRAM: u32 = 100_005;
/// MOUNT version 3.
pub const VERSION: u32 = 3;
/// NULL.
pub const NULL: u32 = 0;
/// MNT.
pub const MNT: u32 = 1;
/// UMNT.
pub const UMNT: u32 = 3;
/// Largest path (MNTPATHLEN).
pub const MNTPATHLEN: usize = 1024;
/// Most auth flavors we accept in a MNT reply.
pub const MAX_FLAVORS: usize = 64;

/// mountstat3 (0 is MNT3_OK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountStat(pub u32);

impl MountStat {
    /// The RFC 1813 name.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "MNT3_OK",
            1 => "MNT3ERR_PERM",
            2 => "MNT3ERR_NOENT",
            5 => "MNT3ERR_IO",
            13 => "MNT3ERR_ACCES",
            20 => "MNT3ERR_NOTDIR",
            22 => "MNT3ERR_INVAL",
            63 => "MNT3ERR_NAMETOOLONG",
            10004 => "MNT3ERR_NOTSUPP",
            10006 => "MNT3ERR_SERVERFAULT",
            _ => "MNT3ERR_unknown",
        }
    }
}

/// mountres3_ok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MntOk {
    /// The root file handle of the export.
    pub fhandle: Fh,
    /// Auth flavors the server accepts (AUTH_SYS is 1).
    pub auth_flavors: Vec<u32>,
}

/// mountres3.
pub type MntRes = Result<MntOk, MountStat>;

/// Encode MNT's argument (dirpath).
pub fn encode_dirpath<S: Sink>(e: &mut Encoder<S>, path: &str) -> Result<(), XdrError> {
    e.put_string(path.as_bytes(), MNTPATHLEN)
}

/// Encode a mountres3.
pub fn encode_mnt_res<S: Sink>(e: &mut Encoder<S>, r: &MntRes) -> Result<(), XdrError> {
    match r {
        Ok(o) => {
            e.put_enum(0)?;
            o.fhandle.encode(e)?;
            e.put_array(&o.auth_flavors, MAX_FLAVORS, |e, f| e.put_u32(*f))
        }
        Err(s) => e.put_enum(s.0),
    }
}

/// Decode a mountres3.
pub fn decode_mnt_res(d: &mut Decoder<'_>) -> Result<MntRes, XdrError> {
    match d.get_enum()? {
        0 => {
            let fh = d.get_opaque(FHSIZE3)?.to_vec();
            let auth_flavors = d.get_array(MAX_FLAVORS, 4, |d| d.get_u32())?;
            Ok(Ok(MntOk {
                fhandle: Fh(fh),
                auth_flavors,
            }))
        }
        s => Ok(Err(MountStat(s))),
    }
}

/// Why MNT failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    /// The RPC failed.
    #[error("MOUNT: {0}")]
    Rpc(#[from] RpcError),
    /// The server refused.
    #[error("MNT {path}: {} ({})", .status.name(), .status.0)]
    Status {
        /// The path.
        path: String,
        /// mountstat3.
        status: MountStat,
    },
}

/// MOUNT NULL.
pub fn null<C: RpcClient>(c: &C) -> Result<(), RpcError> {
    c.call(
        &Call::new(PROGRAM, VERSION, NULL, &|_| Ok(()), ReplySizing::default()),
        |_| Ok(()),
    )
}

/// MNT `path`: the export's root file handle.
pub fn mnt<C: RpcClient>(c: &C, auth: &Auth, path: &str) -> Result<MntOk, MountError> {
    let args = |e: &mut Encoder<Vec<u8>>| encode_dirpath(e, path);
    let call = Call::new(
        PROGRAM,
        VERSION,
        MNT,
        &args,
        ReplySizing {
            max_results: 4 + 4 + FHSIZE3 as u32 + 4 + 4 * MAX_FLAVORS as u32,
            ddp_results: vec![],
        },
    )
    .with_auth(auth);
    c.call(&call, decode_mnt_res)?.map_err(|status| MountError::Status {
        path: path.to_string(),
        status,
    })
}

/// UMNT `path`.
pub fn umnt<C: RpcClient>(c: &C, auth: &Auth, path: &str) -> Result<(), RpcError> {
    let args = |e: &mut Encoder<Vec<u8>>| encode_dirpath(e, path);
    let call = Call::new(PROGRAM, VERSION, UMNT, &args, ReplySizing::default()).with_auth(auth);
    c.call(&call, |_| Ok(()))
}
