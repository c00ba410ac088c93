//! An NFSv3 client subset (RFC 1813) with the RPC-over-RDMA upper-layer
//! binding of RFC 8267, over either transport ([`crate::client::RpcClient`]).
//!
//! | proc | name | DDP-eligible (RFC 8267 §4.1) | how it travels over RDMA |
//! |---|---|---|---|
//! | 0 | NULL | - | inline |
//! | 1 | GETATTR | - | inline |
//! | 3 | LOOKUP | - | inline |
//! | 6 | READ | result data | Write list (one chunk sized to `count`) when the reply can exceed the inline threshold |
//! | 7 | WRITE | argument data | Read chunk at the data's Position when the call exceeds the inline threshold |
//! | 8 | CREATE | - | inline |
//! | 12 | REMOVE | - | inline |
//! | 17 | READDIRPLUS | - | Reply chunk (Long Reply) when `maxcount` can exceed the inline threshold |
//! | 19 | FSINFO | - | inline |
//! | 21 | COMMIT | - | inline |
//!
//! Each procedure's [`ReplySizing`] is its largest reply (RFC 8166 §6.2,
//! RPCR-ULB-02): from that the Requester decides whether to provide a Write
//! chunk (READ) or a Reply chunk (READDIRPLUS), as Linux's client does.
//! MOUNT v3 is in [`crate::mount`], rpcbind GETPORT in [`crate::portmap`].
//! [`memfs`] is a small in-memory NFSv3 + MOUNT server for tests and demos.

pub mod memfs;
pub mod server;
mod types;

pub use types::*;

/// Calls served, per NFS procedure number (shared by [`memfs`] and [`server`]).
#[derive(Debug, Default)]
pub struct Counters {
    calls: [std::sync::atomic::AtomicU64; 22],
}

impl Counters {
    /// Calls of NFS procedure `proc_` served so far.
    pub fn get(&self, proc_: u32) -> u64 {
        self.calls
            .get(proc_ as usize)
            .map_or(0, |c| c.load(std::sync::atomic::Ordering::Relaxed))
    }
    pub(crate) fn bump(&self, proc_: u32) {
        if let Some(c) = self.calls.get(proc_ as usize) {
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

use crate::client::{Auth, Call, RpcClient, RpcError};
use crate::xdr::{Decoder, ReplySizing, XdrDecode, XdrEncode, XdrError, roundup_u32};

/// NFS program number.
pub const PROGRAM: u32 = 100_003;
/// NFS version 3.
pub const VERSION: u32 = 3;
/// Procedure numbers (RFC 1813 §3.3).
pub mod procs {
    /// NULL.
    pub const NULL: u32 = 0;
    /// GETATTR.
    pub const GETATTR: u32 = 1;
    /// SETATTR.
    pub const SETATTR: u32 = 2;
    /// LOOKUP.
    pub const LOOKUP: u32 = 3;
    /// ACCESS.
    pub const ACCESS: u32 = 4;
    /// READLINK.
    pub const READLINK: u32 = 5;
    /// READ.
    pub const READ: u32 = 6;
    /// WRITE.
    pub const WRITE: u32 = 7;
    /// CREATE.
    pub const CREATE: u32 = 8;
    /// MKDIR.
    pub const MKDIR: u32 = 9;
    /// SYMLINK.
    pub const SYMLINK: u32 = 10;
    /// MKNOD.
    pub const MKNOD: u32 = 11;
    /// REMOVE.
    pub const REMOVE: u32 = 12;
    /// RMDIR.
    pub const RMDIR: u32 = 13;
    /// RENAME.
    pub const RENAME: u32 = 14;
    /// LINK.
    pub const LINK: u32 = 15;
    /// READDIR.
    pub const READDIR: u32 = 16;
    /// READDIRPLUS.
    pub const READDIRPLUS: u32 = 17;
    /// FSSTAT.
    pub const FSSTAT: u32 = 18;
    /// FSINFO.
    pub const FSINFO: u32 = 19;
    /// PATHCONF.
    pub const PATHCONF: u32 = 20;
    /// COMMIT.
    pub const COMMIT: u32 = 21;
}
/// The NFS/RDMA port (RFC 8267 §6.3; IANA "nfsrdma").
pub const NFS_RDMA_PORT: u16 = 20049;
/// The NFS port over TCP.
pub const NFS_PORT: u16 = 2049;

/// Why an NFS call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NfsError {
    /// The RPC failed (transport, RPC accept/reject status, undecodable reply).
    #[error("{proc_}: {source}")]
    Rpc {
        /// Procedure name.
        proc_: &'static str,
        /// The RPC error.
        #[source]
        source: RpcError,
    },
    /// The server answered with an NFS error status.
    #[error("{proc_}: {status}")]
    Status {
        /// Procedure name.
        proc_: &'static str,
        /// The status.
        status: NfsStat,
    },
    /// Anything else (bad path, a reply that breaks the protocol's promises).
    #[error("{0}")]
    Other(String),
}

impl NfsError {
    /// The NFS status, if the server sent one.
    pub fn status(&self) -> Option<NfsStat> {
        match self {
            NfsError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Largest results of each procedure (RFC 8166 §6.2). `max_reply` and the DDP
/// lists are what the Requester provisions chunks for.
pub mod sizing {
    use super::*;

    /// GETATTR.
    pub fn getattr() -> ReplySizing {
        ReplySizing {
            max_results: 4 + FATTR3_LEN,
            ddp_results: vec![],
        }
    }
    /// LOOKUP.
    pub fn lookup() -> ReplySizing {
        ReplySizing {
            max_results: 4 + FH_MAX + 2 * POST_OP_ATTR_MAX,
            ddp_results: vec![],
        }
    }
    /// READ of `count` bytes: the data is the one DDP-eligible result.
    pub fn read(count: u32) -> ReplySizing {
        ReplySizing {
            max_results: 4 + POST_OP_ATTR_MAX + 4 + 4 + 4 + roundup_u32(count).unwrap_or(u32::MAX - 4096),
            ddp_results: vec![count],
        }
    }
    /// WRITE.
    pub fn write() -> ReplySizing {
        ReplySizing {
            max_results: 4 + WCC_DATA_MAX + 4 + 4 + VERFSIZE as u32,
            ddp_results: vec![],
        }
    }
    /// CREATE.
    pub fn create() -> ReplySizing {
        ReplySizing {
            max_results: 4 + 4 + FH_MAX + POST_OP_ATTR_MAX + WCC_DATA_MAX,
            ddp_results: vec![],
        }
    }
    /// READDIRPLUS with `maxcount` (the largest READDIRPLUS3resok, RFC 1813 §3.3.17).
    pub fn readdirplus(maxcount: u32) -> ReplySizing {
        ReplySizing {
            max_results: 4u32.saturating_add(maxcount),
            ddp_results: vec![],
        }
    }
    /// COMMIT.
    pub fn commit() -> ReplySizing {
        ReplySizing {
            max_results: 4 + WCC_DATA_MAX + VERFSIZE as u32,
            ddp_results: vec![],
        }
    }
    /// REMOVE.
    pub fn remove() -> ReplySizing {
        ReplySizing {
            max_results: 4 + WCC_DATA_MAX,
            ddp_results: vec![],
        }
    }
    /// FSINFO.
    pub fn fsinfo() -> ReplySizing {
        ReplySizing {
            max_results: 4 + POST_OP_ATTR_MAX + 7 * 4 + 8 + 8 + 4,
            ddp_results: vec![],
        }
    }
}

/// What READ returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadReply {
    /// Bytes read (also `data.len()` for [`Nfs3Client::read`]).
    pub count: u32,
    /// End of file reached.
    pub eof: bool,
    /// The file's attributes after the read, if sent.
    pub attributes: Option<Fattr>,
}

/// How an [`Nfs3Client`] answers NFS3ERR_JUKEBOX (RFC 1813 §2.6: "the server initiated the
/// request, but was not able to complete it in a timely fashion. The client should wait and
/// then try the request with a new RPC transaction ID").
///
/// Linux's client waits `NFS_JUKEBOX_RETRY_TIME` (5 s) and retries forever on a hard mount;
/// a tool wants a bound, so the default retries 5 times with a delay that starts at 250 ms
/// and doubles (7.75 s in all) before the status reaches the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JukeboxRetry {
    /// Retries after the first answer (0: JUKEBOX goes straight to the caller).
    pub retries: u32,
    /// The first delay; each further one doubles, capped at [`JukeboxRetry::max_delay`].
    pub delay: std::time::Duration,
    /// The longest single delay.
    pub max_delay: std::time::Duration,
}

impl Default for JukeboxRetry {
    fn default() -> Self {
        JukeboxRetry {
            retries: 5,
            delay: std::time::Duration::from_millis(250),
            max_delay: std::time::Duration::from_secs(5),
        }
    }
}

/// An NFSv3 client on an RPC client of either transport.
#[derive(Debug)]
pub struct Nfs3Client<C> {
    rpc: C,
    auth: Auth,
    jukebox: JukeboxRetry,
}

impl<C: RpcClient> Nfs3Client<C> {
    /// NFSv3 over `rpc` with credential `auth` (servers usually want AUTH_SYS).
    pub fn new(rpc: C, auth: Auth) -> Self {
        Nfs3Client {
            rpc,
            auth,
            jukebox: JukeboxRetry::default(),
        }
    }

    /// How NFS3ERR_JUKEBOX is retried (see [`JukeboxRetry`]).
    pub fn with_jukebox_retry(mut self, policy: JukeboxRetry) -> Self {
        self.jukebox = policy;
        self
    }

    /// Run `op` again while it answers NFS3ERR_JUKEBOX, as [`JukeboxRetry`] says. Each try is a
    /// new RPC with a new XID (the RPC layer assigns one per call).
    fn retry_jukebox<T>(&self, mut op: impl FnMut() -> Result<T, NfsError>) -> Result<T, NfsError> {
        let mut delay = self.jukebox.delay;
        let mut tries = 0;
        loop {
            match op() {
                Err(e) if e.status() == Some(NfsStat::JUKEBOX) && tries < self.jukebox.retries => {
                    tries += 1;
                    tracing::debug!(error = %e, try_ = tries, ?delay, "NFS3ERR_JUKEBOX, retrying");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(self.jukebox.max_delay);
                }
                r => return r,
            }
        }
    }

    /// The RPC client.
    pub fn rpc(&self) -> &C {
        &self.rpc
    }

    /// The credential the calls carry.
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    fn call<T>(
        &self,
        proc_: u32,
        name: &'static str,
        args: crate::client::ArgsFn<'_>,
        reply: ReplySizing,
        decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
    ) -> Result<T, NfsError> {
        let call = Call::new(PROGRAM, VERSION, proc_, args, reply).with_auth(&self.auth);
        self.rpc
            .call(&call, decode)
            .map_err(|source| NfsError::Rpc { proc_: name, source })
    }

    /// NULL.
    pub fn null(&self) -> Result<(), NfsError> {
        self.call(procs::NULL, "NULL", &|_| Ok(()), ReplySizing::default(), |_| Ok(()))
    }

    /// GETATTR.
    pub fn getattr(&self, fh: &Fh) -> Result<Fattr, NfsError> {
        self.retry_jukebox(|| self.getattr_once(fh))
    }

    fn getattr_once(&self, fh: &Fh) -> Result<Fattr, NfsError> {
        match self.call(procs::GETATTR, "GETATTR", &|e| fh.encode(e), sizing::getattr(), |d| {
            GetattrRes::decode(d)
        })? {
            Res::Ok(a) => Ok(a),
            Res::Fail(status, ()) => Err(NfsError::Status {
                proc_: "GETATTR",
                status,
            }),
        }
    }

    /// LOOKUP `name` in `dir`.
    pub fn lookup(&self, dir: &Fh, name: &[u8]) -> Result<LookupOk, NfsError> {
        self.retry_jukebox(|| self.lookup_once(dir, name))
    }

    fn lookup_once(&self, dir: &Fh, name: &[u8]) -> Result<LookupOk, NfsError> {
        let args = DirOp {
            dir: dir.clone(),
            name: name.to_vec(),
        };
        match self.call(procs::LOOKUP, "LOOKUP", &|e| args.encode(e), sizing::lookup(), |d| {
            LookupRes::decode(d)
        })? {
            Res::Ok(o) => Ok(o),
            Res::Fail(status, _) => Err(NfsError::Status {
                proc_: "LOOKUP",
                status,
            }),
        }
    }

    /// LOOKUP each component of `path` (separated by `/`) from `root`; returns
    /// the handle and attributes (from GETATTR when LOOKUP sent none).
    pub fn lookup_path(&self, root: &Fh, path: &str) -> Result<(Fh, Fattr), NfsError> {
        let mut fh = root.clone();
        let mut attr = None;
        for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            let o = self.lookup(&fh, comp.as_bytes())?;
            fh = o.object;
            attr = o.obj_attributes;
        }
        let attr = match attr {
            Some(a) => a,
            None => self.getattr(&fh)?,
        };
        Ok((fh, attr))
    }

    /// READ up to `buf.len()` bytes at `offset` into `buf`.
    pub fn read_into(&self, fh: &Fh, offset: u64, buf: &mut [u8]) -> Result<ReadReply, NfsError> {
        self.retry_jukebox(|| self.read_into_once(fh, offset, &mut *buf))
    }

    fn read_into_once(&self, fh: &Fh, offset: u64, buf: &mut [u8]) -> Result<ReadReply, NfsError> {
        let count = u32::try_from(buf.len()).map_err(|_| NfsError::Other("READ count too large".into()))?;
        self.read_with(fh, offset, count, |data| buf[..data.len()].copy_from_slice(data))
            .map(|((), reply)| reply)
    }

    /// READ `count` bytes at `offset`. The data is copied once, out of the reply into a
    /// vector of its length (no zero-filled buffer of `count` first: `perf record` of `nfs get`
    /// found 5 % of the client in that memset).
    pub fn read(&self, fh: &Fh, offset: u64, count: u32) -> Result<(Vec<u8>, ReadReply), NfsError> {
        self.retry_jukebox(|| self.read_once(fh, offset, count))
    }

    /// READ `count` bytes at `offset` and hand the data to `take` where it lies in the
    /// reply (over RDMA: the registered region the server's RDMA Write placed it in), so a
    /// caller that writes it to a file makes no copy of its own (`nfs get`, issue 17/18).
    /// `take` runs once per reply: again if the server answered JUKEBOX and the READ is retried.
    pub fn read_then<T>(
        &self,
        fh: &Fh,
        offset: u64,
        count: u32,
        mut take: impl FnMut(&[u8]) -> T,
    ) -> Result<(T, ReadReply), NfsError> {
        self.retry_jukebox(|| self.read_with(fh, offset, count, &mut take))
    }

    fn read_once(&self, fh: &Fh, offset: u64, count: u32) -> Result<(Vec<u8>, ReadReply), NfsError> {
        self.read_with(fh, offset, count, <[u8]>::to_vec)
    }

    /// One READ of at most `count` bytes; `take` gets the reply's data (checked against
    /// `count` and the reply's own count) while it still lies in the receive buffer.
    fn read_with<T>(
        &self,
        fh: &Fh,
        offset: u64,
        count: u32,
        take: impl FnOnce(&[u8]) -> T,
    ) -> Result<(T, ReadReply), NfsError> {
        let args = ReadArgs {
            file: fh.clone(),
            offset,
            count,
        };
        let r =
            self.call(
                procs::READ,
                "READ",
                &|e| args.encode(e),
                sizing::read(count),
                |d| match ReadRes::<&[u8]>::decode(d)? {
                    Res::Ok(o) => {
                        if o.data.len() > count as usize || o.count as usize != o.data.len() {
                            return Err(XdrError::TooLong {
                                len: o.data.len(),
                                max: (count as usize).min(o.count as usize),
                            });
                        }
                        let reply = ReadReply {
                            count: o.count,
                            eof: o.eof,
                            attributes: o.file_attributes,
                        };
                        Ok(Ok((take(o.data), reply)))
                    }
                    Res::Fail(s, _) => Ok(Err(s)),
                },
            )?;
        r.map_err(|status| NfsError::Status { proc_: "READ", status })
    }

    /// WRITE `data` at `offset`.
    pub fn write(&self, fh: &Fh, offset: u64, data: &[u8], stable: Stable) -> Result<WriteOk, NfsError> {
        self.retry_jukebox(|| self.write_once(fh, offset, data, stable))
    }

    fn write_once(&self, fh: &Fh, offset: u64, data: &[u8], stable: Stable) -> Result<WriteOk, NfsError> {
        let count = u32::try_from(data.len()).map_err(|_| NfsError::Other("WRITE too large".into()))?;
        let args = WriteArgs {
            file: fh.clone(),
            offset,
            count,
            stable,
            data,
        };
        match self.call(procs::WRITE, "WRITE", &|e| args.encode(e), sizing::write(), |d| {
            WriteRes::decode(d)
        })? {
            Res::Ok(o) => Ok(o),
            Res::Fail(status, _) => Err(NfsError::Status { proc_: "WRITE", status }),
        }
    }

    /// CREATE `name` in `dir`.
    pub fn create(&self, dir: &Fh, name: &[u8], how: CreateHow) -> Result<CreateOk, NfsError> {
        self.retry_jukebox(|| self.create_once(dir, name, how))
    }

    fn create_once(&self, dir: &Fh, name: &[u8], how: CreateHow) -> Result<CreateOk, NfsError> {
        let args = CreateArgs {
            where_: DirOp {
                dir: dir.clone(),
                name: name.to_vec(),
            },
            how,
        };
        match self.call(procs::CREATE, "CREATE", &|e| args.encode(e), sizing::create(), |d| {
            CreateRes::decode(d)
        })? {
            Res::Ok(o) => Ok(o),
            Res::Fail(status, _) => Err(NfsError::Status {
                proc_: "CREATE",
                status,
            }),
        }
    }

    /// One READDIRPLUS call.
    pub fn readdirplus(&self, args: &ReaddirplusArgs) -> Result<ReaddirplusOk, NfsError> {
        self.retry_jukebox(|| self.readdirplus_once(args))
    }

    fn readdirplus_once(&self, args: &ReaddirplusArgs) -> Result<ReaddirplusOk, NfsError> {
        match self.call(
            procs::READDIRPLUS,
            "READDIRPLUS",
            &|e| args.encode(e),
            sizing::readdirplus(args.maxcount),
            #[allow(clippy::redundant_closure)] // a fn item is not general enough over the lifetime
            |d| ReaddirplusRes::decode(d),
        )? {
            Res::Ok(o) => Ok(o),
            Res::Fail(status, _) => Err(NfsError::Status {
                proc_: "READDIRPLUS",
                status,
            }),
        }
    }

    /// Every entry of `dir` (READDIRPLUS until eof), with `maxcount` per call.
    pub fn readdirplus_all(&self, dir: &Fh, maxcount: u32) -> Result<Vec<EntryPlus>, NfsError> {
        let mut out = Vec::new();
        let mut args = ReaddirplusArgs {
            dir: dir.clone(),
            cookie: 0,
            cookieverf: [0; VERFSIZE],
            dircount: maxcount,
            maxcount,
        };
        for _ in 0..100_000 {
            let page = self.readdirplus(&args)?;
            let last = page.entries.last().map(|e| e.cookie);
            let n = page.entries.len();
            out.extend(page.entries);
            if page.eof {
                return Ok(out);
            }
            match last {
                Some(c) if n > 0 => {
                    args.cookie = c;
                    args.cookieverf = page.cookieverf;
                }
                _ => return Err(NfsError::Other("READDIRPLUS returned no entries and no eof".into())),
            }
        }
        Err(NfsError::Other("READDIRPLUS did not reach eof".into()))
    }

    /// COMMIT `count` bytes from `offset` (0, 0: all) of earlier UNSTABLE writes.
    pub fn commit(&self, fh: &Fh, offset: u64, count: u32) -> Result<CommitOk, NfsError> {
        self.retry_jukebox(|| {
            let args = CommitArgs {
                file: fh.clone(),
                offset,
                count,
            };
            match self.call(procs::COMMIT, "COMMIT", &|e| args.encode(e), sizing::commit(), |d| {
                CommitRes::decode(d)
            })? {
                Res::Ok(o) => Ok(o),
                Res::Fail(status, _) => Err(NfsError::Status {
                    proc_: "COMMIT",
                    status,
                }),
            }
        })
    }

    /// REMOVE `name` from `dir`.
    pub fn remove(&self, dir: &Fh, name: &[u8]) -> Result<Wcc, NfsError> {
        self.retry_jukebox(|| {
            let args = DirOp {
                dir: dir.clone(),
                name: name.to_vec(),
            };
            match self.call(procs::REMOVE, "REMOVE", &|e| args.encode(e), sizing::remove(), |d| {
                RemoveRes::decode(d)
            })? {
                Res::Ok(w) => Ok(w),
                Res::Fail(status, _) => Err(NfsError::Status {
                    proc_: "REMOVE",
                    status,
                }),
            }
        })
    }

    /// FSINFO.
    pub fn fsinfo(&self, fh: &Fh) -> Result<FsinfoOk, NfsError> {
        self.retry_jukebox(|| self.fsinfo_once(fh))
    }

    fn fsinfo_once(&self, fh: &Fh) -> Result<FsinfoOk, NfsError> {
        match self.call(procs::FSINFO, "FSINFO", &|e| fh.encode(e), sizing::fsinfo(), |d| {
            FsinfoRes::decode(d)
        })? {
            Res::Ok(o) => Ok(o),
            Res::Fail(status, _) => Err(NfsError::Status {
                proc_: "FSINFO",
                status,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
