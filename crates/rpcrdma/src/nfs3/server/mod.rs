//! An NFSv3 (RFC 1813) and MOUNT v3 server on a directory of the host file system.
//!
//! Sans-I/O in the protocol sense: every procedure is a plain method of [`Export`] from its
//! decoded arguments to its typed result ([`Export::lookup`], [`Export::write`], ...), tested
//! in memory; [`Export::register`] puts them into a [`Registry`] that the TCP server
//! ([`crate::tcp::TcpServer`]) and the RPC-over-RDMA Responder ([`crate::transport::RdmaServer`])
//! serve. The handlers are the server half of RFC 8267: WRITE's data is decoded with
//! `get_opaque_ddp` (a Read chunk re-inserted at its Position), READ's data is encoded with
//! `put_opaque_ddp` (moved into the client's Write chunk), and READDIR, READDIRPLUS and
//! READLINK results go in the client's Reply chunk when it sent one.
//!
//! Confinement (what a client can reach):
//! - File handles ([`handle`]) carry the inode and a keyed MAC; a forged or altered handle is
//!   NFS3ERR_BADHANDLE, a genuine one of another export NFS3ERR_STALE, a handle of an inode
//!   that no longer exists below the root NFS3ERR_STALE.
//! - The server keeps each inode's path relative to the root; names are single components
//!   (no `/`, NUL, `.` or `..`: NFS3ERR_ACCES / NFS3ERR_EXIST / NFS3ERR_INVAL), LOOKUP of
//!   `..` at the root is the root, and the server never follows a symbolic link: it stats
//!   with lstat, opens with O_NOFOLLOW, sets times with AT_SYMLINK_NOFOLLOW and refuses to
//!   chmod a link. A link pointing out is a link the *client* resolves in its own namespace.
//! - Other file systems mounted below the root are not crossed (their mount points answer
//!   NFS3ERR_ACCES), so inode numbers are unique.
//!
//! A handle's path survives a restart because the handle names the inode: after a restart
//! (or a rename by someone else) the server finds the inode again by a bounded walk of the
//! tree ([`MAX_WALK`] entries) and remembers what it saw.
//!
//! Bounds: READ counts are capped at `rtmax`, WRITE at `wtmax` (a longer WRITE is a short
//! write, RFC 1813 §3.3.7), READDIR/READDIRPLUS replies at the client's count and at
//! [`MAX_DIR_REPLY`]; nothing is allocated by a peer-supplied number beyond those caps.

pub mod handle;
mod sys;
pub mod wire;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use handle::HandleKey;
pub use wire::*;

use super::*;
use crate::mount::{self, MntOk, MountStat};
use crate::server::{CallContext, Credential, ProcError, Registry};

/// Largest READDIR/READDIRPLUS reply we build, whatever the client's count.
pub const MAX_DIR_REPLY: u32 = 1 << 20;
/// Most directory entries the inode walk visits before it calls a handle stale.
pub const MAX_WALK: usize = 1 << 20;
/// Most inode -> path entries remembered (the map is cleared when it reaches this).
pub const MAX_PATHS: usize = 1 << 20;
/// Default rtmax/wtmax.
pub const DEFAULT_MAX_IO: u32 = 1 << 20;

/// How an export is served.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The host directory.
    pub root: PathBuf,
    /// The path clients MNT (e.g. `/`).
    pub name: String,
    /// Refuse every change (NFS3ERR_ROFS).
    pub read_only: bool,
    /// The server secret the file handles are keyed with.
    pub key: [u8; 32],
    /// rtmax and wtmax (FSINFO); READ and WRITE counts are capped at this.
    pub max_io: u32,
    /// The write verifier (RFC 1813 §3.3.7): must differ after every restart, as
    /// [`fresh_write_verifier`] does.
    pub write_verf: [u8; VERFSIZE],
}

/// A write verifier that differs from any earlier run's: the clock in nanoseconds mixed with
/// the process id.
pub fn fresh_write_verifier() -> [u8; VERFSIZE] {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ (u64::from(std::process::id()) << 48)).to_be_bytes()
}

/// Why the export could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The root is missing or not a directory.
    #[error("{path}: {source}")]
    Root {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

pub use super::Counters;

/// One exported directory.
pub struct Export {
    cfg: ExportConfig,
    root: PathBuf,
    root_dev: u64,
    root_ino: u64,
    key: HandleKey,
    /// inode -> path relative to the root (empty for the root).
    paths: Mutex<HashMap<u64, PathBuf>>,
    verf: Mutex<[u8; VERFSIZE]>,
    /// Calls served.
    pub counters: Counters,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("root", &self.root)
            .field("name", &self.cfg.name)
            .field("read_only", &self.cfg.read_only)
            .finish_non_exhaustive()
    }
}

/// An io::Error as an nfsstat3.
pub fn status_of(e: &io::Error) -> NfsStat {
    match e.raw_os_error() {
        Some(libc::EPERM) => NfsStat::PERM,
        Some(libc::ENOENT) => NfsStat::NOENT,
        Some(libc::EACCES) => NfsStat::ACCES,
        Some(libc::EEXIST) => NfsStat::EXIST,
        Some(libc::EXDEV) => NfsStat::XDEV,
        Some(libc::ENOTDIR) => NfsStat::NOTDIR,
        Some(libc::EISDIR) => NfsStat::ISDIR,
        Some(libc::EINVAL) | Some(libc::ELOOP) => NfsStat::INVAL,
        Some(libc::EFBIG) => NfsStat::FBIG,
        Some(libc::ENOSPC) => NfsStat::NOSPC,
        Some(libc::EROFS) => NfsStat::ROFS,
        Some(libc::EMLINK) => NfsStat::MLINK,
        Some(libc::ENAMETOOLONG) => NfsStat::NAMETOOLONG,
        Some(libc::ENOTEMPTY) => NfsStat::NOTEMPTY,
        Some(libc::EDQUOT) => NfsStat::DQUOT,
        Some(libc::EOPNOTSUPP) => NfsStat::NOTSUPP,
        _ => NfsStat::IO,
    }
}

fn time_of(s: i64, ns: i64) -> Time {
    Time {
        seconds: s.clamp(0, i64::from(u32::MAX)) as u32,
        nseconds: ns.clamp(0, 999_999_999) as u32,
    }
}

fn wcc_attr(m: &Metadata) -> WccAttr {
    WccAttr {
        size: m.size(),
        mtime: time_of(m.mtime(), m.mtime_nsec()),
        ctime: time_of(m.ctime(), m.ctime_nsec()),
    }
}

/// A directory entry name a client may create or look up: one component.
fn check_name(name: &[u8]) -> Result<&OsStr, NfsStat> {
    if name.len() > MAX_NAME {
        return Err(NfsStat::NAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(NfsStat::ACCES);
    }
    if name == b"." || name == b".." {
        return Err(NfsStat::EXIST);
    }
    Ok(OsStr::from_bytes(name))
}

/// A READDIR cookie that stays valid when other entries come and go: a hash of the name
/// (FNV-1a), above the cookies 0..=2 that mean "start" (and `.`/`..` elsewhere).
fn cookie_of(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 2) + 3
}

/// Resolved object: its inode, absolute path, path below the root, metadata.
struct Obj {
    ino: u64,
    abs: PathBuf,
    rel: PathBuf,
    meta: Metadata,
}

type R<T> = Result<T, NfsStat>;

impl Export {
    /// Open the export `cfg` (the root must be a directory).
    pub fn new(cfg: ExportConfig) -> Result<Arc<Export>, ExportError> {
        let root = fs::canonicalize(&cfg.root).map_err(|source| ExportError::Root {
            path: cfg.root.clone(),
            source,
        })?;
        let meta = fs::metadata(&root).map_err(|source| ExportError::Root {
            path: root.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(ExportError::Root {
                path: root,
                source: io::Error::from_raw_os_error(libc::ENOTDIR),
            });
        }
        let key = HandleKey::new(cfg.key, &root);
        let mut paths = HashMap::new();
        paths.insert(meta.ino(), PathBuf::new());
        let verf = cfg.write_verf;
        Ok(Arc::new(Export {
            root_dev: meta.dev(),
            root_ino: meta.ino(),
            root,
            key,
            paths: Mutex::new(paths),
            verf: Mutex::new(verf),
            counters: Counters::default(),
            cfg,
        }))
    }

    /// The export's configuration.
    pub fn config(&self) -> &ExportConfig {
        &self.cfg
    }

    /// The root's handle (what MNT answers).
    pub fn root_fh(&self) -> Fh {
        self.key.mint(self.root_ino)
    }

    /// The current write verifier.
    pub fn write_verifier(&self) -> [u8; VERFSIZE] {
        *self.verf.lock().unwrap()
    }

    /// Change the write verifier, as a restart does (for tests).
    pub fn set_write_verifier(&self, v: [u8; VERFSIZE]) {
        *self.verf.lock().unwrap() = v;
    }

    fn fattr(&self, m: &Metadata) -> Fattr {
        let ft = m.file_type();
        let ftype = if ft.is_dir() {
            Ftype::Dir
        } else if ft.is_symlink() {
            Ftype::Lnk
        } else if ft.is_block_device() {
            Ftype::Blk
        } else if ft.is_char_device() {
            Ftype::Chr
        } else if ft.is_socket() {
            Ftype::Sock
        } else if ft.is_fifo() {
            Ftype::Fifo
        } else {
            Ftype::Reg
        };
        let rdev = m.rdev();
        let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
        let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
        Fattr {
            ftype,
            mode: m.mode() & 0o7777,
            nlink: u32::try_from(m.nlink()).unwrap_or(u32::MAX),
            uid: m.uid(),
            gid: m.gid(),
            size: m.size(),
            used: m.blocks().saturating_mul(512),
            rdev: (major as u32, minor as u32),
            fsid: m.dev(),
            fileid: m.ino(),
            atime: time_of(m.atime(), m.atime_nsec()),
            mtime: time_of(m.mtime(), m.mtime_nsec()),
            ctime: time_of(m.ctime(), m.ctime_nsec()),
        }
    }

    fn attr_of(&self, abs: &Path) -> Option<Fattr> {
        fs::symlink_metadata(abs).ok().map(|m| self.fattr(&m))
    }

    fn remember(&self, ino: u64, rel: PathBuf) {
        let mut p = self.paths.lock().unwrap();
        if p.len() >= MAX_PATHS {
            p.clear();
            p.insert(self.root_ino, PathBuf::new());
        }
        p.insert(ino, rel);
    }

    /// The path below the root of inode `ino`, if it is (still) there.
    fn verify(&self, ino: u64, rel: &Path) -> Option<Obj> {
        let abs = self.root.join(rel);
        let meta = fs::symlink_metadata(&abs).ok()?;
        (meta.ino() == ino && meta.dev() == self.root_dev).then(|| Obj {
            ino,
            abs,
            rel: rel.to_path_buf(),
            meta,
        })
    }

    /// Find inode `ino` below the root: a breadth-first walk that follows no link, stays on
    /// the root's file system and gives up after [`MAX_WALK`] entries.
    fn walk_for(&self, ino: u64) -> Option<PathBuf> {
        let mut queue = std::collections::VecDeque::from([PathBuf::new()]);
        let mut seen = 0usize;
        while let Some(rel) = queue.pop_front() {
            let Ok(rd) = fs::read_dir(self.root.join(&rel)) else {
                continue;
            };
            for ent in rd.flatten() {
                seen += 1;
                if seen > MAX_WALK {
                    return None;
                }
                let child = rel.join(ent.file_name());
                if ent.ino() == ino {
                    return Some(child);
                }
                if ent.file_type().is_ok_and(|t| t.is_dir()) {
                    queue.push_back(child);
                }
            }
        }
        None
    }

    /// The object a handle names.
    fn resolve(&self, fh: &Fh) -> R<Obj> {
        let ino = self.key.check(fh)?;
        let known = self.paths.lock().unwrap().get(&ino).cloned();
        if let Some(rel) = known
            && let Some(o) = self.verify(ino, &rel)
        {
            return Ok(o);
        }
        let rel = self.walk_for(ino).ok_or(NfsStat::STALE)?;
        let o = self.verify(ino, &rel).ok_or(NfsStat::STALE)?;
        self.remember(ino, rel);
        Ok(o)
    }

    fn resolve_dir(&self, fh: &Fh) -> R<Obj> {
        let d = self.resolve(fh)?;
        if !d.meta.is_dir() {
            return Err(NfsStat::NOTDIR);
        }
        Ok(d)
    }

    /// The child `name` of directory `dir` (lstat), confined to the root's file system.
    fn child(&self, dir: &Obj, name: &OsStr) -> R<Obj> {
        let rel = dir.rel.join(name);
        let abs = self.root.join(&rel);
        let meta = fs::symlink_metadata(&abs).map_err(|e| status_of(&e))?;
        if meta.dev() != self.root_dev {
            return Err(NfsStat::ACCES);
        }
        self.remember(meta.ino(), rel.clone());
        Ok(Obj {
            ino: meta.ino(),
            abs,
            rel,
            meta,
        })
    }

    fn writable(&self) -> R<()> {
        if self.cfg.read_only { Err(NfsStat::ROFS) } else { Ok(()) }
    }

    /// Give a new object the caller's AUTH_SYS owner when we run as root (as nfsd does
    /// with its fsuid), unless the client set uid/gid itself.
    fn own(&self, cred: &Credential, abs: &Path, s: &Sattr) {
        if let Credential::Sys { uid, gid, .. } = cred
            && sys::euid() == 0
        {
            let _ = std::os::unix::fs::lchown(abs, Some(s.uid.unwrap_or(*uid)), Some(s.gid.unwrap_or(*gid)));
        }
    }

    /// Apply `s` to `o` (mode, owner, size, times), never through a symbolic link.
    fn apply(&self, o: &Obj, s: &Sattr) -> R<()> {
        let is_link = o.meta.file_type().is_symlink();
        if let Some(mode) = s.mode {
            if is_link {
                return Err(NfsStat::NOTSUPP);
            }
            fs::set_permissions(&o.abs, std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))
                .map_err(|e| status_of(&e))?;
        }
        if s.uid.is_some() || s.gid.is_some() {
            std::os::unix::fs::lchown(&o.abs, s.uid, s.gid).map_err(|e| status_of(&e))?;
        }
        if let Some(size) = s.size {
            if o.meta.is_dir() {
                return Err(NfsStat::ISDIR);
            }
            if !o.meta.is_file() {
                return Err(NfsStat::INVAL);
            }
            let f = open_nofollow(&o.abs, true).map_err(|e| status_of(&e))?;
            f.set_len(size).map_err(|e| status_of(&e))?;
        }
        let conv = |t: SetTime| match t {
            SetTime::DontChange => sys::TimeSet::Omit,
            SetTime::Server => sys::TimeSet::Now,
            SetTime::Client(t) => sys::TimeSet::At(i64::from(t.seconds), t.nseconds),
        };
        if !matches!((s.atime, s.mtime), (SetTime::DontChange, SetTime::DontChange)) {
            sys::set_times(&o.abs, conv(s.atime), conv(s.mtime)).map_err(|e| status_of(&e))?;
        }
        Ok(())
    }

    fn wcc(&self, before: Option<WccAttr>, abs: &Path) -> Wcc {
        Wcc {
            before,
            after: self.attr_of(abs),
        }
    }

    // ---- the procedures ----

    /// GETATTR.
    pub fn getattr(&self, fh: &Fh) -> GetattrRes {
        match self.resolve(fh) {
            Ok(o) => Res::Ok(self.fattr(&o.meta)),
            Err(s) => Res::Fail(s, ()),
        }
    }

    /// SETATTR.
    pub fn setattr(&self, a: &SetattrArgs) -> WccRes {
        let o = match self.resolve(&a.object) {
            Ok(o) => o,
            Err(s) => return Res::Fail(s, Wcc::default()),
        };
        let before = Some(wcc_attr(&o.meta));
        if let Err(s) = self.writable() {
            return Res::Fail(s, self.wcc(before, &o.abs));
        }
        if let Some(g) = a.guard
            && g != time_of(o.meta.ctime(), o.meta.ctime_nsec())
        {
            return Res::Fail(NfsStat::NOT_SYNC, self.wcc(before, &o.abs));
        }
        match self.apply(&o, &a.new_attributes) {
            Ok(()) => Res::Ok(self.wcc(before, &o.abs)),
            Err(s) => Res::Fail(s, self.wcc(before, &o.abs)),
        }
    }

    /// LOOKUP.
    pub fn lookup(&self, a: &DirOp) -> LookupRes {
        let dir = match self.resolve(&a.dir) {
            Ok(d) => d,
            Err(s) => return Res::Fail(s, None),
        };
        let dattr = Some(self.fattr(&dir.meta));
        if !dir.meta.is_dir() {
            return Res::Fail(NfsStat::NOTDIR, dattr);
        }
        let found = match a.name.as_slice() {
            b"." => Ok(dir.ino),
            b".." => {
                // the root's parent is the root: nothing above it is reachable
                let parent = dir.rel.parent().map(Path::to_path_buf).unwrap_or_default();
                fs::symlink_metadata(self.root.join(&parent))
                    .map_err(|e| status_of(&e))
                    .map(|m| {
                        self.remember(m.ino(), parent);
                        m.ino()
                    })
            }
            n => check_name(n)
                .map_err(|s| if s == NfsStat::NAMETOOLONG { s } else { NfsStat::NOENT })
                .and_then(|n| self.child(&dir, n))
                .map(|o| o.ino),
        };
        match found.and_then(|ino| self.resolve(&self.key.mint(ino)).map(|o| (ino, o))) {
            Ok((ino, o)) => Res::Ok(LookupOk {
                object: self.key.mint(ino),
                obj_attributes: Some(self.fattr(&o.meta)),
                dir_attributes: dattr,
            }),
            Err(s) => Res::Fail(s, dattr),
        }
    }

    /// ACCESS: what the caller's AUTH_SYS identity may do by the mode bits (uid 0 may do
    /// everything but execute a file no one may execute); a read-only export grants no
    /// MODIFY, EXTEND or DELETE. Advisory: the server acts with its own credentials.
    pub fn access(&self, cred: &Credential, a: &AccessArgs) -> AccessRes {
        let o = match self.resolve(&a.object) {
            Ok(o) => o,
            Err(s) => return Res::Fail(s, None),
        };
        let attr = self.fattr(&o.meta);
        let is_dir = o.meta.is_dir();
        let (uid, gids): (u32, Vec<u32>) = match cred {
            Credential::Sys { uid, gid, gids, .. } => {
                (*uid, std::iter::once(*gid).chain(gids.iter().copied()).collect())
            }
            Credential::None => (65534, vec![65534]),
        };
        let bits = if uid == 0 {
            0o7 & if attr.mode & 0o111 != 0 || is_dir { 0o7 } else { 0o6 }
        } else if uid == attr.uid {
            (attr.mode >> 6) & 7
        } else if gids.contains(&attr.gid) {
            (attr.mode >> 3) & 7
        } else {
            attr.mode & 7
        };
        let mut granted = 0;
        if bits & 4 != 0 {
            granted |= access::READ;
        }
        if bits & 2 != 0 && !self.cfg.read_only {
            granted |= access::MODIFY | access::EXTEND;
            if is_dir {
                granted |= access::DELETE;
            }
        }
        if bits & 1 != 0 {
            granted |= if is_dir { access::LOOKUP } else { access::EXECUTE };
        }
        Res::Ok((Some(attr), granted & a.access))
    }

    /// READLINK.
    pub fn readlink(&self, fh: &Fh) -> ReadlinkRes {
        let o = match self.resolve(fh) {
            Ok(o) => o,
            Err(s) => return Res::Fail(s, None),
        };
        let attr = Some(self.fattr(&o.meta));
        if !o.meta.file_type().is_symlink() {
            return Res::Fail(NfsStat::INVAL, attr);
        }
        match fs::read_link(&o.abs) {
            Ok(t) if t.as_os_str().len() <= MAX_PATH => Res::Ok((attr, t.into_os_string().into_vec())),
            Ok(_) => Res::Fail(NfsStat::NAMETOOLONG, attr),
            Err(e) => Res::Fail(status_of(&e), attr),
        }
    }

    /// READ of at most `rtmax` bytes.
    pub fn read(&self, a: &ReadArgs) -> ReadRes<Vec<u8>> {
        let o = match self.resolve(&a.file) {
            Ok(o) => o,
            Err(s) => return Res::Fail(s, None),
        };
        let attr = Some(self.fattr(&o.meta));
        if o.meta.is_dir() {
            return Res::Fail(NfsStat::ISDIR, attr);
        }
        if !o.meta.is_file() {
            return Res::Fail(NfsStat::INVAL, attr);
        }
        let f = match open_nofollow(&o.abs, false) {
            Ok(f) => f,
            Err(e) => return Res::Fail(status_of(&e), attr),
        };
        let size = f.metadata().map_or(o.meta.size(), |m| m.size());
        let count = a.count.min(self.cfg.max_io);
        let want = size.saturating_sub(a.offset).min(u64::from(count)) as usize;
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match f.read_at(&mut buf[got..], a.offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Res::Fail(status_of(&e), attr),
            }
        }
        buf.truncate(got);
        let after = f.metadata().ok().map(|m| self.fattr(&m)).or(attr);
        Res::Ok(ReadOk {
            file_attributes: after,
            count: got as u32,
            eof: a.offset.saturating_add(got as u64) >= size,
            data: buf,
        })
    }

    /// READ encoded straight into the reply: the file's bytes are read into the reply
    /// vector where the encoder puts the data item (issue 17/18: [`Export::read`] zero-filled
    /// a fresh buffer, read into it and the encoder copied it into the reply, a second 1 MiB
    /// vector faulted in per call; `perf record` of `softrdma nfs serve` under `nfs get` put a
    /// quarter of the server's cycles in that memset, copy and their page faults). The
    /// attributes are the file's as the READ starts (they precede the data on the wire). A
    /// read that comes up short of the size the file had (it shrank meanwhile) or fails is
    /// done again the ordinary way.
    pub fn read_encode(&self, a: &ReadArgs, e: &mut crate::xdr::Encoder<Vec<u8>>) -> Result<(), XdrError> {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(o) = self.resolve(&a.file) else {
            return self.read(a).encode(e);
        };
        if !o.meta.is_file() {
            return self.read(a).encode(e);
        }
        let Ok(mut f) = open_nofollow(&o.abs, false) else {
            return self.read(a).encode(e);
        };
        let Ok(meta) = f.metadata() else {
            return self.read(a).encode(e);
        };
        let size = meta.size();
        let want = size
            .saturating_sub(a.offset)
            .min(u64::from(a.count.min(self.cfg.max_io))) as usize;
        let mark = e.mark();
        let placed = (|| -> Result<bool, XdrError> {
            e.put_enum(0)?;
            put_post_op_attr(e, &Some(self.fattr(&meta)))?;
            e.put_u32(want as u32)?;
            e.put_bool(a.offset.saturating_add(want as u64) >= size)?;
            if f.seek(SeekFrom::Start(a.offset)).is_err() {
                return Ok(false);
            }
            // `read_to_end` reads into the vector's spare room without zero-filling it first
            let mut whole = true;
            let r = e.put_opaque_ddp_with(want, MAX_DATA, |v| {
                whole = matches!((&mut f).take(want as u64).read_to_end(v), Ok(n) if n == want);
            });
            match r {
                Ok(()) => Ok(whole),
                Err(XdrError::ChunkLengthMismatch { .. }) => Ok(false),
                Err(x) => Err(x),
            }
        })()?;
        if placed {
            return Ok(());
        }
        e.rollback(mark);
        self.read(a).encode(e)
    }

    /// WRITE of at most `wtmax` bytes (a longer one is a short write). UNSTABLE is written
    /// and not synced; DATA_SYNC and FILE_SYNC are synced before the reply.
    pub fn write(&self, a: &WriteArgs<'_>) -> WriteRes {
        let o = match self.resolve(&a.file) {
            Ok(o) => o,
            Err(s) => return Res::Fail(s, Wcc::default()),
        };
        let before = Some(wcc_attr(&o.meta));
        let fail = |s| Res::Fail(s, self.wcc(before, &o.abs));
        if let Err(s) = self.writable() {
            return fail(s);
        }
        if a.count as usize != a.data.len() {
            return fail(NfsStat::INVAL);
        }
        if o.meta.is_dir() {
            return fail(NfsStat::ISDIR);
        }
        if !o.meta.is_file() {
            return fail(NfsStat::INVAL);
        }
        let data = &a.data[..a.data.len().min(self.cfg.max_io as usize)];
        if a.offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > i64::MAX as u64)
        {
            return fail(NfsStat::FBIG);
        }
        let f = match open_nofollow(&o.abs, true) {
            Ok(f) => f,
            Err(e) => return fail(status_of(&e)),
        };
        if let Err(e) = f.write_all_at(data, a.offset) {
            return fail(status_of(&e));
        }
        let synced = match a.stable {
            Stable::Unstable => Ok(()),
            Stable::DataSync => f.sync_data(),
            Stable::FileSync => f.sync_all(),
        };
        if let Err(e) = synced {
            return fail(status_of(&e));
        }
        Res::Ok(WriteOk {
            file_wcc: Wcc {
                before,
                after: f.metadata().ok().map(|m| self.fattr(&m)),
            },
            count: data.len() as u32,
            committed: a.stable,
            verf: self.write_verifier(),
        })
    }

    /// CREATE (UNCHECKED, GUARDED, EXCLUSIVE). EXCLUSIVE keeps the client's verifier in the
    /// new file's atime and mtime seconds (as Linux's nfsd does) until the client's SETATTR
    /// replaces them, so a retransmitted CREATE finds its own file.
    pub fn create(&self, cred: &Credential, a: &CreateArgs) -> CreateRes {
        let dir = match self.resolve_dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Fail(s, Wcc::default()),
        };
        let before = Some(wcc_attr(&dir.meta));
        let fail = |s| Res::Fail(s, self.wcc(before, &dir.abs));
        if let Err(s) = self.writable() {
            return fail(s);
        }
        let name = match check_name(&a.where_.name) {
            Ok(n) => n,
            Err(s) => return fail(s),
        };
        let abs = dir.abs.join(name);
        let (sattr, exclusive, verf) = match a.how {
            CreateHow::Unchecked(s) => (s, false, None),
            CreateHow::Guarded(s) => (s, true, None),
            CreateHow::Exclusive(v) => (Sattr::default(), true, Some(v)),
        };
        let mut oo = OpenOptions::new();
        oo.write(true)
            .mode(sattr.mode.unwrap_or(0o644) & 0o7777)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        if exclusive {
            oo.create_new(true);
        } else {
            oo.create(true);
        }
        let fresh = match oo.open(&abs) {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && verf.is_some() => false,
            Err(e) => return fail(status_of(&e)),
        };
        let o = match self.child(&dir, name) {
            Ok(o) => o,
            Err(s) => return fail(s),
        };
        let vt = verf.map(|v| {
            (
                i64::from(u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
                i64::from(u32::from_be_bytes([v[4], v[5], v[6], v[7]])),
            )
        });
        if let Some((at, mt)) = vt {
            if fresh {
                if let Err(e) = sys::set_times(&abs, sys::TimeSet::At(at, 0), sys::TimeSet::At(mt, 0)) {
                    return fail(status_of(&e));
                }
            } else if !(o.meta.is_file() && o.meta.atime() == at && o.meta.mtime() == mt) {
                return fail(NfsStat::EXIST);
            }
        } else {
            // mode went to open(2) (minus the umask); size, owner and times apply now
            let rest = Sattr { mode: None, ..sattr };
            if let Err(s) = self.apply(&o, &rest) {
                return fail(s);
            }
        }
        if fresh {
            self.own(cred, &abs, &sattr);
        }
        self.created(o.ino, &abs, before, &dir.abs)
    }

    fn created(&self, ino: u64, abs: &Path, before: Option<WccAttr>, dir: &Path) -> CreateRes {
        Res::Ok(CreateOk {
            obj: Some(self.key.mint(ino)),
            obj_attributes: self.attr_of(abs),
            dir_wcc: self.wcc(before, dir),
        })
    }

    /// MKDIR.
    pub fn mkdir(&self, cred: &Credential, a: &MkdirArgs) -> CreateRes {
        let dir = match self.resolve_dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Fail(s, Wcc::default()),
        };
        let before = Some(wcc_attr(&dir.meta));
        let fail = |s| Res::Fail(s, self.wcc(before, &dir.abs));
        if let Err(s) = self.writable() {
            return fail(s);
        }
        let name = match check_name(&a.where_.name) {
            Ok(n) => n,
            Err(s) => return fail(s),
        };
        let abs = dir.abs.join(name);
        if let Err(e) = fs::DirBuilder::new()
            .mode(a.attributes.mode.unwrap_or(0o755) & 0o7777)
            .create(&abs)
        {
            return fail(status_of(&e));
        }
        self.own(cred, &abs, &a.attributes);
        let o = match self.child(&dir, name) {
            Ok(o) => o,
            Err(s) => return fail(s),
        };
        let rest = Sattr {
            mode: None,
            size: None,
            ..a.attributes
        };
        if let Err(s) = self.apply(&o, &rest) {
            return fail(s);
        }
        self.created(o.ino, &abs, before, &dir.abs)
    }

    /// SYMLINK. The text is stored as given: the server never follows it.
    pub fn symlink(&self, cred: &Credential, a: &SymlinkArgs) -> CreateRes {
        let dir = match self.resolve_dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Fail(s, Wcc::default()),
        };
        let before = Some(wcc_attr(&dir.meta));
        let fail = |s| Res::Fail(s, self.wcc(before, &dir.abs));
        if let Err(s) = self.writable() {
            return fail(s);
        }
        let name = match check_name(&a.where_.name) {
            Ok(n) => n,
            Err(s) => return fail(s),
        };
        if a.data.is_empty() || a.data.contains(&0) {
            return fail(NfsStat::INVAL);
        }
        let abs = dir.abs.join(name);
        if let Err(e) = std::os::unix::fs::symlink(OsStr::from_bytes(&a.data), &abs) {
            return fail(status_of(&e));
        }
        self.own(cred, &abs, &a.attributes);
        match self.child(&dir, name) {
            Ok(o) => self.created(o.ino, &abs, before, &dir.abs),
            Err(s) => fail(s),
        }
    }

    fn unlink(&self, a: &DirOp, rmdir: bool) -> WccRes {
        let dir = match self.resolve_dir(&a.dir) {
            Ok(d) => d,
            Err(s) => return Res::Fail(s, Wcc::default()),
        };
        let before = Some(wcc_attr(&dir.meta));
        let fail = |s| Res::Fail(s, self.wcc(before, &dir.abs));
        if let Err(s) = self.writable() {
            return fail(s);
        }
        let name = match a.name.as_slice() {
            b"." if rmdir => return fail(NfsStat::INVAL),
            b".." if rmdir => return fail(NfsStat::NOTEMPTY),
            n => match check_name(n) {
                Ok(n) => n,
                Err(NfsStat::EXIST) => return fail(NfsStat::INVAL),
                Err(s) => return fail(s),
            },
        };
        let o = match self.child(&dir, name) {
            Ok(o) => o,
            Err(s) => return fail(s),
        };
        let r = if rmdir {
            if !o.meta.is_dir() {
                return fail(NfsStat::NOTDIR);
            }
            fs::remove_dir(&o.abs)
        } else {
            if o.meta.is_dir() {
                return fail(NfsStat::ISDIR);
            }
            fs::remove_file(&o.abs)
        };
        match r {
            Ok(()) => Res::Ok(self.wcc(before, &dir.abs)),
            Err(e) => fail(status_of(&e)),
        }
    }

    /// REMOVE (not a directory: NFS3ERR_ISDIR).
    pub fn remove(&self, a: &DirOp) -> WccRes {
        self.unlink(a, false)
    }

    /// RMDIR.
    pub fn rmdir(&self, a: &DirOp) -> WccRes {
        self.unlink(a, true)
    }

    /// RENAME.
    pub fn rename(&self, a: &RenameArgs) -> RenameRes {
        let from = self.resolve_dir(&a.from.dir);
        let to = self.resolve_dir(&a.to.dir);
        let (from, to) = match (from, to) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(s), _) | (_, Err(s)) => return Res::Fail(s, (Wcc::default(), Wcc::default())),
        };
        let (fb, tb) = (Some(wcc_attr(&from.meta)), Some(wcc_attr(&to.meta)));
        let fail = |s| Res::Fail(s, (self.wcc(fb, &from.abs), self.wcc(tb, &to.abs)));
        if let Err(s) = self.writable() {
            return fail(s);
        }
        let (fname, tname) = match (check_name(&a.from.name), check_name(&a.to.name)) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(NfsStat::EXIST), _) | (_, Err(NfsStat::EXIST)) => return fail(NfsStat::INVAL),
            (Err(s), _) | (_, Err(s)) => return fail(s),
        };
        let src = match self.child(&from, fname) {
            Ok(o) => o,
            Err(s) => return fail(s),
        };
        let dst_rel = to.rel.join(tname);
        if let Err(e) = fs::rename(&src.abs, self.root.join(&dst_rel)) {
            return fail(status_of(&e));
        }
        self.remember(src.ino, dst_rel);
        Res::Ok((self.wcc(fb, &from.abs), self.wcc(tb, &to.abs)))
    }

    /// LINK.
    pub fn link(&self, a: &LinkArgs) -> LinkRes {
        let file = self.resolve(&a.file);
        let dir = self.resolve_dir(&a.link.dir);
        let (file, dir) = match (file, dir) {
            (Ok(f), Ok(d)) => (f, d),
            (Err(s), _) | (_, Err(s)) => return Res::Fail(s, (None, Wcc::default())),
        };
        let before = Some(wcc_attr(&dir.meta));
        let fail = |s| Res::Fail(s, (self.attr_of(&file.abs), self.wcc(before, &dir.abs)));
        if let Err(s) = self.writable() {
            return fail(s);
        }
        if file.meta.is_dir() {
            return fail(NfsStat::ISDIR);
        }
        let name = match check_name(&a.link.name) {
            Ok(n) => n,
            Err(s) => return fail(s),
        };
        // linkat(2) without AT_SYMLINK_FOLLOW: a link to a symbolic link is a link to the link
        if let Err(e) = fs::hard_link(&file.abs, dir.abs.join(name)) {
            return fail(status_of(&e));
        }
        Res::Ok((self.attr_of(&file.abs), self.wcc(before, &dir.abs)))
    }

    /// The entries of a directory after `cookie`, in cookie order, with their inodes.
    fn list(&self, dir: &Obj, cookie: u64) -> R<Vec<(u64, OsString, u64)>> {
        let rd = fs::read_dir(&dir.abs).map_err(|e| status_of(&e))?;
        let mut v: Vec<(u64, OsString, u64)> = rd
            .flatten()
            .map(|e| {
                let n = e.file_name();
                (cookie_of(n.as_bytes()), n, e.ino())
            })
            .filter(|(c, _, _)| *c > cookie)
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// The cookie verifier: constant, as the cookies are names' hashes that do not go stale.
    const COOKIEVERF: [u8; VERFSIZE] = *b"srnfs\0\0\x01";

    fn check_cookie(cookie: u64, verf: &[u8; VERFSIZE]) -> R<()> {
        if cookie != 0 && *verf != Self::COOKIEVERF && *verf != [0; VERFSIZE] {
            return Err(NfsStat::BAD_COOKIE);
        }
        Ok(())
    }

    /// READDIR's and READDIRPLUS's common start: the directory `fh`, its attributes and its
    /// entries after `cookie`; on failure the status with the attributes known by then.
    #[allow(clippy::type_complexity)]
    fn dir_listing(
        &self,
        fh: &Fh,
        cookie: u64,
        verf: &[u8; VERFSIZE],
    ) -> Result<(Obj, Option<Fattr>, Vec<(u64, OsString, u64)>), (NfsStat, Option<Fattr>)> {
        let dir = self.resolve(fh).map_err(|s| (s, None))?;
        let dattr = Some(self.fattr(&dir.meta));
        if !dir.meta.is_dir() {
            return Err((NfsStat::NOTDIR, dattr));
        }
        Self::check_cookie(cookie, verf).map_err(|s| (s, dattr))?;
        let list = self.list(&dir, cookie).map_err(|s| (s, dattr))?;
        Ok((dir, dattr, list))
    }

    /// The entries of `list`, made by `make`, while their encoding fits the client's `count`
    /// (and [`MAX_DIR_REPLY`], [`MAX_DIR_ENTRIES`]), and whether that was all of them; `None`
    /// when not even the first fits (NFS3ERR_TOOSMALL).
    fn fill<E>(
        list: Vec<(u64, OsString, u64)>,
        count: u32,
        len: impl Fn(&E) -> usize,
        mut make: impl FnMut(u64, OsString, u64) -> E,
    ) -> Option<(Vec<E>, bool)> {
        let budget = count.min(MAX_DIR_REPLY) as usize;
        let mut used = 4 + POST_OP_ATTR_MAX as usize + VERFSIZE + 8;
        let mut entries = Vec::new();
        let mut eof = true;
        for (cookie, name, ino) in list {
            let e = make(cookie, name, ino);
            if used + len(&e) > budget || entries.len() >= MAX_DIR_ENTRIES {
                eof = false;
                break;
            }
            used += len(&e);
            entries.push(e);
        }
        (!entries.is_empty() || eof).then_some((entries, eof))
    }

    /// READDIR: entries whose encoding fits `count` (and [`MAX_DIR_REPLY`]).
    pub fn readdir(&self, a: &ReaddirArgs) -> ReaddirRes {
        let (_, dattr, list) = match self.dir_listing(&a.dir, a.cookie, &a.cookieverf) {
            Ok(l) => l,
            Err((s, dattr)) => return Res::Fail(s, dattr),
        };
        let fill = Self::fill(list, a.count, Entry::encoded_len, |cookie, name, ino| Entry {
            fileid: ino,
            name: name.into_vec(),
            cookie,
        });
        let Some((entries, eof)) = fill else {
            return Res::Fail(NfsStat::TOOSMALL, dattr);
        };
        Res::Ok(ReaddirOk {
            dir_attributes: dattr,
            cookieverf: Self::COOKIEVERF,
            entries,
            eof,
        })
    }

    /// READDIRPLUS: entries with attributes and handles whose encoding fits `maxcount`
    /// (and [`MAX_DIR_REPLY`]).
    pub fn readdirplus(&self, a: &ReaddirplusArgs) -> ReaddirplusRes {
        let (dir, dattr, list) = match self.dir_listing(&a.dir, a.cookie, &a.cookieverf) {
            Ok(l) => l,
            Err((s, dattr)) => return Res::Fail(s, dattr),
        };
        let fill = Self::fill(list, a.maxcount, EntryPlus::encoded_len, |cookie, name, ino| {
            // an entry that went away since read_dir, or a mount point, goes without
            // attributes and handle (the client LOOKUPs it if it wants it)
            let child = self.child(&dir, &name).ok().filter(|o| o.ino == ino);
            EntryPlus {
                fileid: ino,
                name: name.into_vec(),
                cookie,
                attributes: child.as_ref().map(|o| self.fattr(&o.meta)),
                handle: child.as_ref().map(|o| self.key.mint(o.ino)),
            }
        });
        let Some((entries, eof)) = fill else {
            return Res::Fail(NfsStat::TOOSMALL, dattr);
        };
        Res::Ok(ReaddirplusOk {
            dir_attributes: dattr,
            cookieverf: Self::COOKIEVERF,
            entries,
            eof,
        })
    }

    /// FSSTAT.
    pub fn fsstat(&self, fh: &Fh) -> FsstatRes {
        let o = match self.resolve(fh) {
            Ok(o) => o,
            Err(s) => return Res::Fail(s, None),
        };
        let attr = Some(self.fattr(&o.meta));
        match sys::statvfs(&o.abs) {
            Ok(s) => Res::Ok(FsstatOk {
                obj_attributes: attr,
                tbytes: s.total,
                fbytes: s.free,
                abytes: s.avail,
                tfiles: s.files,
                ffiles: s.ffree,
                afiles: s.favail,
                invarsec: 0,
            }),
            Err(e) => Res::Fail(status_of(&e), attr),
        }
    }

    /// FSINFO.
    pub fn fsinfo(&self, fh: &Fh) -> FsinfoRes {
        let o = match self.resolve(fh) {
            Ok(o) => o,
            Err(s) => return Res::Fail(s, None),
        };
        let m = self.cfg.max_io;
        Res::Ok(FsinfoOk {
            obj_attributes: Some(self.fattr(&o.meta)),
            rtmax: m,
            rtpref: m,
            rtmult: 4096,
            wtmax: m,
            wtpref: m,
            wtmult: 4096,
            dtpref: 64 << 10,
            maxfilesize: i64::MAX as u64,
            time_delta: Time {
                seconds: 0,
                nseconds: 1,
            },
            // FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME
            properties: 0x1b,
        })
    }

    /// PATHCONF.
    pub fn pathconf(&self, fh: &Fh) -> PathconfRes {
        match self.resolve(fh) {
            Ok(o) => Res::Ok(PathconfOk {
                obj_attributes: Some(self.fattr(&o.meta)),
                linkmax: 65000,
                name_max: MAX_NAME as u32,
                no_trunc: true,
                chown_restricted: true,
                case_insensitive: false,
                case_preserving: true,
            }),
            Err(s) => Res::Fail(s, None),
        }
    }

    /// COMMIT: fsync the file (the range is not narrower than the file).
    pub fn commit(&self, a: &CommitArgs) -> CommitRes {
        let o = match self.resolve(&a.file) {
            Ok(o) => o,
            Err(s) => return Res::Fail(s, Wcc::default()),
        };
        let before = Some(wcc_attr(&o.meta));
        if o.meta.is_dir() {
            return Res::Fail(NfsStat::ISDIR, self.wcc(before, &o.abs));
        }
        if !o.meta.is_file() {
            return Res::Fail(NfsStat::INVAL, self.wcc(before, &o.abs));
        }
        let synced = open_nofollow(&o.abs, false).and_then(|f| f.sync_all());
        match synced {
            Ok(()) => Res::Ok(CommitOk {
                file_wcc: self.wcc(before, &o.abs),
                verf: self.write_verifier(),
            }),
            Err(e) => Res::Fail(status_of(&e), self.wcc(before, &o.abs)),
        }
    }

    /// MNT: the root handle for the export's name.
    pub fn mnt(&self, path: &[u8]) -> mount::MntRes {
        let trimmed = |p: &[u8]| -> Vec<u8> {
            let mut v = p.to_vec();
            while v.len() > 1 && v.last() == Some(&b'/') {
                v.pop();
            }
            v
        };
        if trimmed(path) == trimmed(self.cfg.name.as_bytes()) {
            Ok(MntOk {
                fhandle: self.root_fh(),
                auth_flavors: vec![crate::rpc::flavor::AUTH_SYS, crate::rpc::flavor::AUTH_NONE],
            })
        } else {
            Err(MountStat(2))
        }
    }

    /// Register NFSv3 (every procedure but MKNOD, which answers NFS3ERR_NOTSUPP) and
    /// MOUNT v3 (NULL, MNT, DUMP, UMNT, UMNTALL, EXPORT) in `reg`.
    pub fn register(self: &Arc<Self>, reg: &mut Registry) {
        reg.register_null(PROGRAM, VERSION);
        macro_rules! proc_ {
            ($num:expr, $args:ty, |$fs:ident, $ctx:ident, $a:ident| $body:expr) => {{
                let fs = self.clone();
                reg.register(PROGRAM, VERSION, $num, move |ctx: &CallContext, d, e| {
                    let $a = <$args>::decode(d)?;
                    fs.counters.bump($num);
                    let $fs = &fs;
                    let $ctx = ctx;
                    let _ = $ctx;
                    Ok($body.encode(e)?)
                });
            }};
        }
        proc_!(procs::GETATTR, Fh, |fs, ctx, a| fs.getattr(&a));
        proc_!(procs::SETATTR, SetattrArgs, |fs, ctx, a| fs.setattr(&a));
        proc_!(procs::LOOKUP, DirOp, |fs, ctx, a| fs.lookup(&a));
        proc_!(procs::ACCESS, AccessArgs, |fs, ctx, a| fs.access(&ctx.cred, &a));
        proc_!(procs::WRITE, WriteArgs<'_>, |fs, ctx, a| fs.write(&a));
        proc_!(procs::CREATE, CreateArgs, |fs, ctx, a| fs.create(&ctx.cred, &a));
        proc_!(procs::MKDIR, MkdirArgs, |fs, ctx, a| fs.mkdir(&ctx.cred, &a));
        proc_!(procs::SYMLINK, SymlinkArgs, |fs, ctx, a| fs.symlink(&ctx.cred, &a));
        proc_!(procs::REMOVE, DirOp, |fs, ctx, a| fs.remove(&a));
        proc_!(procs::RMDIR, DirOp, |fs, ctx, a| fs.rmdir(&a));
        proc_!(procs::RENAME, RenameArgs, |fs, ctx, a| fs.rename(&a));
        proc_!(procs::LINK, LinkArgs, |fs, ctx, a| fs.link(&a));
        proc_!(procs::FSSTAT, Fh, |fs, ctx, a| fs.fsstat(&a));
        proc_!(procs::FSINFO, Fh, |fs, ctx, a| fs.fsinfo(&a));
        proc_!(procs::PATHCONF, Fh, |fs, ctx, a| fs.pathconf(&a));
        proc_!(procs::COMMIT, CommitArgs, |fs, ctx, a| fs.commit(&a));
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::MKNOD, move |_, d, e| {
            // mknod3args: where, then a union we need not read: answer before acting
            DirOp::decode(d)?;
            let _ = d.rest();
            fs.counters.bump(procs::MKNOD);
            let r: WccRes = Res::Fail(NfsStat::NOTSUPP, Wcc::default());
            // MKNOD3res's failure arm is wcc_data, as WccRes's
            Ok(r.encode(e)?)
        });
        // the procedures whose reply can be large declare their bound (RPCR-ULB-02): READ's
        // data, READDIR(PLUS)'s and READLINK's results
        let (fs, max_io) = (self.clone(), self.cfg.max_io);
        reg.register_bounded(
            PROGRAM,
            VERSION,
            procs::READ,
            move |d| Ok(sizing::read(ReadArgs::decode(d)?.count.min(max_io))),
            move |_, d, e| {
                let a = ReadArgs::decode(d)?;
                fs.counters.bump(procs::READ);
                Ok(fs.read_encode(&a, e)?)
            },
        );
        let fs = self.clone();
        reg.register_bounded(
            PROGRAM,
            VERSION,
            procs::READDIR,
            |d| Ok(sizing::readdirplus(ReaddirArgs::decode(d)?.count.min(MAX_DIR_REPLY))),
            move |_, d, e| {
                let a = ReaddirArgs::decode(d)?;
                fs.counters.bump(procs::READDIR);
                Ok(fs.readdir(&a).encode(e)?)
            },
        );
        let fs = self.clone();
        reg.register_bounded(
            PROGRAM,
            VERSION,
            procs::READDIRPLUS,
            |d| {
                Ok(sizing::readdirplus(
                    ReaddirplusArgs::decode(d)?.maxcount.min(MAX_DIR_REPLY),
                ))
            },
            move |_, d, e| {
                let a = ReaddirplusArgs::decode(d)?;
                fs.counters.bump(procs::READDIRPLUS);
                Ok(fs.readdirplus(&a).encode(e)?)
            },
        );
        let fs = self.clone();
        reg.register_bounded(
            PROGRAM,
            VERSION,
            procs::READLINK,
            |d| {
                Fh::decode(d)?;
                Ok(crate::xdr::ReplySizing {
                    max_results: 4 + POST_OP_ATTR_MAX + 4 + MAX_PATH as u32,
                    ddp_results: vec![],
                })
            },
            move |_, d, e| {
                let a = Fh::decode(d)?;
                fs.counters.bump(procs::READLINK);
                Ok(fs.readlink(&a).encode(e)?)
            },
        );
        self.register_mount(reg);
    }

    fn register_mount(self: &Arc<Self>, reg: &mut Registry) {
        const DUMP: u32 = 2;
        const UMNTALL: u32 = 4;
        const EXPORT: u32 = 5;
        reg.register_null(mount::PROGRAM, mount::VERSION);
        let fs = self.clone();
        reg.register(mount::PROGRAM, mount::VERSION, mount::MNT, move |_, d, e| {
            let path = d.get_string(mount::MNTPATHLEN)?;
            Ok(mount::encode_mnt_res(e, &fs.mnt(path))?)
        });
        // DUMP: we keep no list of mounts (RFC 1813 allows an empty one)
        reg.register(mount::PROGRAM, mount::VERSION, DUMP, |_, _, e| Ok(e.put_bool(false)?));
        reg.register(mount::PROGRAM, mount::VERSION, mount::UMNT, |_, d, _| {
            d.get_string(mount::MNTPATHLEN).map_err(ProcError::from)?;
            Ok(())
        });
        reg.register(mount::PROGRAM, mount::VERSION, UMNTALL, |_, _, _| Ok(()));
        let fs = self.clone();
        reg.register(mount::PROGRAM, mount::VERSION, EXPORT, move |_, _, e| {
            // one export, no group restriction
            e.put_bool(true)?;
            e.put_string(fs.cfg.name.as_bytes(), mount::MNTPATHLEN)?;
            e.put_bool(false)?;
            Ok(e.put_bool(false)?)
        });
    }
}

/// A registry that serves `export` (NFSv3 and MOUNT v3) and, when `portmap` is given, a
/// portmapper GETPORT that answers from that table of (prog, vers, prot, port).
pub fn registry(export: &Arc<Export>, portmap: Option<Vec<(u32, u32, u32, u16)>>) -> Registry {
    let mut reg = Registry::new();
    export.register(&mut reg);
    if let Some(table) = portmap {
        crate::portmap::register(&mut reg, table);
    }
    reg
}

/// Open a regular file without following a final symbolic link, and without blocking on a
/// FIFO that replaced it.
fn open_nofollow(p: &Path, write: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)
}

#[cfg(test)]
mod tests;
