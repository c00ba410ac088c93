//! A small in-memory NFSv3 server (the procedures of [`crate::nfs3`]) and
//! MOUNT v3 server on [`crate::server::Registry`], for tests and demos: serve
//! it with [`crate::tcp::TcpServer`] and [`crate::transport::RdmaServer`] at
//! once. The handlers are the server half of the RFC 8267 binding: WRITE's data
//! is decoded with `get_opaque_ddp` (Read chunk re-inserted) and READ's data is
//! encoded with `put_opaque_ddp` (moved into the Write chunk).
//!
//! File handles are 12 bytes: `b"mf\0\0"` and the 64-bit file id.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::mount::{self, MntOk, MountStat};
use crate::server::{ProcError, Registry};

enum Data {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, u64>),
}

struct Node {
    data: Data,
    parent: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Time,
    ctime: Time,
}

struct Inner {
    nodes: HashMap<u64, Node>,
    next: u64,
}

pub use super::Counters;

/// The in-memory file system and its export.
pub struct MemFs {
    inner: Mutex<Inner>,
    export: String,
    /// Calls served.
    pub counters: Counters,
    /// rtmax/wtmax advertised by FSINFO.
    pub max_io: u32,
    /// The write verifier (RFC 1813 §3.3.7): the same for every WRITE and COMMIT until
    /// [`MemFs::restart_writes`] changes it, as a server restart would.
    write_verf: AtomicU64,
    restart_at_commit: std::sync::atomic::AtomicBool,
}

const ROOT: u64 = 1;
const VERF: [u8; VERFSIZE] = *b"memfs\0\0\x01";

fn fh_of(id: u64) -> Fh {
    let mut v = b"mf\0\0".to_vec();
    v.extend_from_slice(&id.to_be_bytes());
    Fh(v)
}

fn id_of(fh: &Fh) -> Option<u64> {
    if fh.0.len() != 12 || &fh.0[..4] != b"mf\0\0" {
        return None;
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&fh.0[4..]);
    Some(u64::from_be_bytes(b))
}

impl MemFs {
    /// An empty file system exported as `export` (e.g. `/export`).
    pub fn new(export: &str) -> Arc<MemFs> {
        let now = Time::now();
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                data: Data::Dir(BTreeMap::new()),
                parent: ROOT,
                mode: 0o1777,
                uid: 0,
                gid: 0,
                mtime: now,
                ctime: now,
            },
        );
        Arc::new(MemFs {
            inner: Mutex::new(Inner { nodes, next: 2 }),
            export: export.to_string(),
            counters: Counters::default(),
            max_io: 1 << 20,
            write_verf: AtomicU64::new(u64::from_be_bytes(VERF)),
            restart_at_commit: Default::default(),
        })
    }

    /// Change the write verifier, as a restarted server would: a client that wrote UNSTABLE
    /// and sees another verifier in COMMIT must write again (RFC 1813 §3.3.21). (The data
    /// itself stays: this server keeps everything in memory.)
    pub fn restart_writes(&self) {
        self.write_verf.fetch_add(1, Ordering::Relaxed);
    }

    /// [`MemFs::restart_writes`] just before the next COMMIT is answered: a client's UNSTABLE
    /// writes then meet a changed verifier, deterministically.
    pub fn restart_at_next_commit(&self) {
        self.restart_at_commit.store(true, Ordering::Relaxed);
    }

    fn verf(&self) -> [u8; VERFSIZE] {
        self.write_verf.load(Ordering::Relaxed).to_be_bytes()
    }

    /// The root file handle (what MNT returns).
    pub fn root(&self) -> Fh {
        fh_of(ROOT)
    }

    /// Create (or replace) the file at `path` (relative to the export), making
    /// directories as needed.
    pub fn put(&self, path: &str, data: Vec<u8>) {
        let mut g = self.inner.lock().unwrap();
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let mut dir = ROOT;
        let now = Time::now();
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let existing = match &g.nodes[&dir].data {
                Data::Dir(m) => m.get(c.as_bytes()).copied(),
                Data::File(_) => return,
            };
            let id = match existing {
                Some(id) => id,
                None => {
                    let id = g.next;
                    g.next += 1;
                    let node = Node {
                        data: if last {
                            Data::File(Vec::new())
                        } else {
                            Data::Dir(BTreeMap::new())
                        },
                        parent: dir,
                        mode: if last { 0o644 } else { 0o755 },
                        uid: 0,
                        gid: 0,
                        mtime: now,
                        ctime: now,
                    };
                    g.nodes.insert(id, node);
                    if let Some(Node { data: Data::Dir(m), .. }) = g.nodes.get_mut(&dir) {
                        m.insert(c.as_bytes().to_vec(), id);
                    }
                    id
                }
            };
            if last && let Some(n) = g.nodes.get_mut(&id) {
                n.data = Data::File(data);
                return;
            }
            dir = id;
        }
    }

    /// The contents of the file at `path`.
    pub fn get(&self, path: &str) -> Option<Vec<u8>> {
        let g = self.inner.lock().unwrap();
        let mut id = ROOT;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            match &g.nodes.get(&id)?.data {
                Data::Dir(m) => id = *m.get(c.as_bytes())?,
                Data::File(_) => return None,
            }
        }
        match &g.nodes.get(&id)?.data {
            Data::File(d) => Some(d.clone()),
            Data::Dir(_) => None,
        }
    }

    fn attr(id: u64, n: &Node) -> Fattr {
        let (ftype, size, nlink) = match &n.data {
            Data::File(d) => (Ftype::Reg, d.len() as u64, 1),
            Data::Dir(m) => (Ftype::Dir, 4096, 2 + m.len() as u32),
        };
        Fattr {
            ftype,
            mode: n.mode,
            nlink,
            uid: n.uid,
            gid: n.gid,
            size,
            used: size.next_multiple_of(4096),
            rdev: (0, 0),
            fsid: 0x6d66,
            fileid: id,
            atime: n.mtime,
            mtime: n.mtime,
            ctime: n.ctime,
        }
    }

    fn wcc_attr(n: &Node) -> WccAttr {
        WccAttr {
            size: match &n.data {
                Data::File(d) => d.len() as u64,
                Data::Dir(_) => 4096,
            },
            mtime: n.mtime,
            ctime: n.ctime,
        }
    }

    fn getattr(&self, fh: &Fh) -> GetattrRes {
        let g = self.inner.lock().unwrap();
        match id_of(fh).and_then(|id| g.nodes.get(&id).map(|n| (id, n))) {
            Some((id, n)) => Res::Ok(Self::attr(id, n)),
            None => Res::Fail(NfsStat::STALE, ()),
        }
    }

    fn lookup(&self, a: &DirOp) -> LookupRes {
        let g = self.inner.lock().unwrap();
        let Some((dir, dn)) = id_of(&a.dir).and_then(|id| g.nodes.get(&id).map(|n| (id, n))) else {
            return Res::Fail(NfsStat::STALE, None);
        };
        let dattr = Some(Self::attr(dir, dn));
        let Data::Dir(m) = &dn.data else {
            return Res::Fail(NfsStat::NOTDIR, dattr);
        };
        let id = match a.name.as_slice() {
            b"." => Some(dir),
            b".." => Some(dn.parent),
            n => m.get(n).copied(),
        };
        match id.and_then(|id| g.nodes.get(&id).map(|n| (id, n))) {
            Some((id, n)) => Res::Ok(LookupOk {
                object: fh_of(id),
                obj_attributes: Some(Self::attr(id, n)),
                dir_attributes: dattr,
            }),
            None => Res::Fail(NfsStat::NOENT, dattr),
        }
    }

    fn write(&self, a: &WriteArgs<'_>) -> WriteRes {
        let mut g = self.inner.lock().unwrap();
        let Some(id) = id_of(&a.file).filter(|id| g.nodes.contains_key(id)) else {
            return Res::Fail(NfsStat::STALE, Wcc::default());
        };
        let n = g.nodes.get_mut(&id).expect("checked");
        let before = Some(Self::wcc_attr(n));
        if a.count as usize != a.data.len() {
            return Res::Fail(NfsStat::INVAL, Wcc { before, after: None });
        }
        let Data::File(d) = &mut n.data else {
            return Res::Fail(NfsStat::ISDIR, Wcc { before, after: None });
        };
        let Some(end) = usize::try_from(a.offset)
            .ok()
            .and_then(|o| o.checked_add(a.data.len()))
            .filter(|&e| e <= 1 << 32)
        else {
            return Res::Fail(NfsStat::FBIG, Wcc { before, after: None });
        };
        if d.len() < end {
            d.resize(end, 0);
        }
        d[a.offset as usize..end].copy_from_slice(a.data);
        n.mtime = Time::now();
        n.ctime = n.mtime;
        Res::Ok(WriteOk {
            file_wcc: Wcc {
                before,
                after: Some(Self::attr(id, n)),
            },
            count: a.count,
            // what was asked for: memory is as stable as it gets here, but a client of
            // UNSTABLE writes must see them so, and COMMIT them
            committed: a.stable,
            verf: self.verf(),
        })
    }

    fn commit(&self, a: &CommitArgs) -> CommitRes {
        if self.restart_at_commit.swap(false, Ordering::Relaxed) {
            self.restart_writes();
        }
        let g = self.inner.lock().unwrap();
        match id_of(&a.file).and_then(|id| g.nodes.get(&id).map(|n| (id, n))) {
            None => Res::Fail(NfsStat::STALE, Wcc::default()),
            Some((_, n)) if matches!(n.data, Data::Dir(_)) => Res::Fail(NfsStat::ISDIR, Wcc::default()),
            Some((id, n)) => Res::Ok(CommitOk {
                file_wcc: Wcc {
                    before: Some(Self::wcc_attr(n)),
                    after: Some(Self::attr(id, n)),
                },
                verf: self.verf(),
            }),
        }
    }

    fn remove(&self, a: &DirOp) -> RemoveRes {
        let mut g = self.inner.lock().unwrap();
        let Some(dir) = id_of(&a.dir).filter(|id| g.nodes.contains_key(id)) else {
            return Res::Fail(NfsStat::STALE, Wcc::default());
        };
        let before = Some(Self::wcc_attr(&g.nodes[&dir]));
        let Data::Dir(m) = &g.nodes[&dir].data else {
            return Res::Fail(NfsStat::NOTDIR, Wcc { before, after: None });
        };
        let Some(&id) = m.get(&a.name) else {
            let after = Some(Self::attr(dir, &g.nodes[&dir]));
            return Res::Fail(NfsStat::NOENT, Wcc { before, after });
        };
        if matches!(g.nodes.get(&id).map(|n| &n.data), Some(Data::Dir(_))) {
            // REMOVE is for non-directories (RMDIR removes directories)
            let after = Some(Self::attr(dir, &g.nodes[&dir]));
            return Res::Fail(NfsStat::ISDIR, Wcc { before, after });
        }
        g.nodes.remove(&id);
        let d = g.nodes.get_mut(&dir).expect("checked");
        if let Data::Dir(m) = &mut d.data {
            m.remove(&a.name);
        }
        d.mtime = Time::now();
        d.ctime = d.mtime;
        let after = Some(Self::attr(dir, d));
        Res::Ok(Wcc { before, after })
    }

    fn create(&self, a: &CreateArgs) -> CreateRes {
        let mut g = self.inner.lock().unwrap();
        let Some(dir) = id_of(&a.where_.dir).filter(|id| g.nodes.contains_key(id)) else {
            return Res::Fail(NfsStat::STALE, Wcc::default());
        };
        let before = Some(Self::wcc_attr(&g.nodes[&dir]));
        let fail = |s, g: &Inner| {
            Res::Fail(
                s,
                Wcc {
                    before,
                    after: Some(Self::attr(dir, &g.nodes[&dir])),
                },
            )
        };
        let Data::Dir(m) = &g.nodes[&dir].data else {
            return fail(NfsStat::NOTDIR, &g);
        };
        if a.where_.name.is_empty() || a.where_.name.contains(&b'/') || a.where_.name == b"." || a.where_.name == b".."
        {
            return fail(NfsStat::INVAL, &g);
        }
        let existing = m.get(&a.where_.name).copied();
        let sattr = match a.how {
            CreateHow::Unchecked(s) => s,
            CreateHow::Guarded(s) => {
                if existing.is_some() {
                    return fail(NfsStat::EXIST, &g);
                }
                s
            }
            CreateHow::Exclusive(_) => Sattr::default(),
        };
        let now = Time::now();
        let id = match existing {
            Some(id) => {
                if let Some(n) = g.nodes.get_mut(&id) {
                    if let (Some(0), Data::File(d)) = (sattr.size, &mut n.data) {
                        d.clear();
                    }
                    n.mtime = now;
                }
                id
            }
            None => {
                let id = g.next;
                g.next += 1;
                g.nodes.insert(
                    id,
                    Node {
                        data: Data::File(Vec::new()),
                        parent: dir,
                        mode: sattr.mode.unwrap_or(0o644) & 0o7777,
                        uid: sattr.uid.unwrap_or(0),
                        gid: sattr.gid.unwrap_or(0),
                        mtime: now,
                        ctime: now,
                    },
                );
                if let Some(Node {
                    data: Data::Dir(m),
                    mtime,
                    ..
                }) = g.nodes.get_mut(&dir)
                {
                    m.insert(a.where_.name.clone(), id);
                    *mtime = now;
                }
                id
            }
        };
        Res::Ok(CreateOk {
            obj: Some(fh_of(id)),
            obj_attributes: Some(Self::attr(id, &g.nodes[&id])),
            dir_wcc: Wcc {
                before,
                after: Some(Self::attr(dir, &g.nodes[&dir])),
            },
        })
    }

    fn readdirplus(&self, a: &ReaddirplusArgs) -> ReaddirplusRes {
        let g = self.inner.lock().unwrap();
        let Some((dir, dn)) = id_of(&a.dir).and_then(|id| g.nodes.get(&id).map(|n| (id, n))) else {
            return Res::Fail(NfsStat::STALE, None);
        };
        let dattr = Some(Self::attr(dir, dn));
        let Data::Dir(m) = &dn.data else {
            return Res::Fail(NfsStat::NOTDIR, dattr);
        };
        if a.cookie != 0 && a.cookieverf != VERF {
            return Res::Fail(NfsStat::BAD_COOKIE, dattr);
        }
        // status, dir_attributes, cookieverf, the final "no more entries" and eof words
        let mut used = 4 + POST_OP_ATTR_MAX as usize + VERFSIZE + 8;
        let mut entries = Vec::new();
        let mut eof = true;
        for (i, (name, &id)) in m.iter().enumerate().skip(a.cookie as usize) {
            let n = &g.nodes[&id];
            let e = EntryPlus {
                fileid: id,
                name: name.clone(),
                cookie: i as u64 + 1,
                attributes: Some(Self::attr(id, n)),
                handle: Some(fh_of(id)),
            };
            if used + e.encoded_len() > a.maxcount as usize {
                eof = false;
                break;
            }
            used += e.encoded_len();
            entries.push(e);
        }
        if entries.is_empty() && !eof {
            return Res::Fail(NfsStat(10005), dattr); // NFS3ERR_TOOSMALL
        }
        Res::Ok(ReaddirplusOk {
            dir_attributes: dattr,
            cookieverf: VERF,
            entries,
            eof,
        })
    }

    fn fsinfo(&self, fh: &Fh) -> FsinfoRes {
        match self.getattr(fh) {
            Res::Ok(a) => Res::Ok(FsinfoOk {
                obj_attributes: Some(a),
                rtmax: self.max_io,
                rtpref: self.max_io,
                rtmult: 4096,
                wtmax: self.max_io,
                wtpref: self.max_io,
                wtmult: 4096,
                dtpref: 65536,
                maxfilesize: 1 << 32,
                time_delta: Time {
                    seconds: 0,
                    nseconds: 1,
                },
                properties: 0x1b,
            }),
            Res::Fail(s, ()) => Res::Fail(s, None),
        }
    }

    /// Register NFSv3 (NULL, GETATTR, LOOKUP, READ, WRITE, CREATE, REMOVE,
    /// READDIRPLUS, FSINFO, COMMIT) and MOUNT v3 (NULL, MNT, UMNT) in `reg`.
    pub fn register(self: &Arc<Self>, reg: &mut Registry) {
        reg.register_null(PROGRAM, VERSION);
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::GETATTR, move |_, d, e| {
            let fh = Fh::decode(d)?;
            fs.counters.bump(procs::GETATTR);
            Ok(fs.getattr(&fh).encode(e)?)
        });
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::LOOKUP, move |_, d, e| {
            let a = DirOp::decode(d)?;
            fs.counters.bump(procs::LOOKUP);
            Ok(fs.lookup(&a).encode(e)?)
        });
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::READ, move |_, d, e| {
            let a = ReadArgs::decode(d)?;
            fs.counters.bump(procs::READ);
            let g = fs.inner.lock().unwrap();
            let r: ReadRes<&[u8]> = match id_of(&a.file).and_then(|id| g.nodes.get(&id).map(|n| (id, n))) {
                None => Res::Fail(NfsStat::STALE, None),
                Some((id, n)) => match &n.data {
                    Data::Dir(_) => Res::Fail(NfsStat::ISDIR, Some(Self::attr(id, n))),
                    Data::File(data) => {
                        let start = (a.offset.min(data.len() as u64)) as usize;
                        let end = start.saturating_add(a.count as usize).min(data.len());
                        Res::Ok(ReadOk {
                            file_attributes: Some(Self::attr(id, n)),
                            count: (end - start) as u32,
                            eof: end == data.len(),
                            data: &data[start..end],
                        })
                    }
                },
            };
            Ok(r.encode(e)?)
        });
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::WRITE, move |_, d, e| {
            let a = WriteArgs::decode(d)?;
            fs.counters.bump(procs::WRITE);
            Ok(fs.write(&a).encode(e)?)
        });
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::CREATE, move |_, d, e| {
            let a = CreateArgs::decode(d)?;
            fs.counters.bump(procs::CREATE);
            Ok(fs.create(&a).encode(e)?)
        });
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::READDIRPLUS, move |_, d, e| {
            let a = ReaddirplusArgs::decode(d)?;
            fs.counters.bump(procs::READDIRPLUS);
            Ok(fs.readdirplus(&a).encode(e)?)
        });
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::COMMIT, move |_, d, e| {
            let a = CommitArgs::decode(d)?;
            fs.counters.bump(procs::COMMIT);
            Ok(fs.commit(&a).encode(e)?)
        });
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::REMOVE, move |_, d, e| {
            let a = DirOp::decode(d)?;
            fs.counters.bump(procs::REMOVE);
            Ok(fs.remove(&a).encode(e)?)
        });
        let fs = self.clone();
        reg.register(PROGRAM, VERSION, procs::FSINFO, move |_, d, e| {
            let fh = Fh::decode(d)?;
            fs.counters.bump(procs::FSINFO);
            Ok(fs.fsinfo(&fh).encode(e)?)
        });
        reg.register_null(mount::PROGRAM, mount::VERSION);
        let fs = self.clone();
        reg.register(mount::PROGRAM, mount::VERSION, mount::MNT, move |_, d, e| {
            let path = d.get_string(mount::MNTPATHLEN)?;
            let r = if path == fs.export.as_bytes() {
                Ok(MntOk {
                    fhandle: fs.root(),
                    auth_flavors: vec![crate::rpc::flavor::AUTH_SYS, crate::rpc::flavor::AUTH_NONE],
                })
            } else {
                Err(MountStat(2))
            };
            Ok(mount::encode_mnt_res(e, &r)?)
        });
        reg.register(mount::PROGRAM, mount::VERSION, mount::UMNT, |_, d, _| {
            d.get_string(mount::MNTPATHLEN).map_err(ProcError::from)?;
            Ok(())
        });
    }
}
