//! The export's procedures in memory, on a scratch directory of the host file system.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// A scratch directory removed on drop.
pub(crate) struct Scratch(pub PathBuf);

impl Scratch {
    pub(crate) fn new(tag: &str) -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "srnfs-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const KEY: [u8; 32] = [7; 32];

fn cfg(root: &Path) -> ExportConfig {
    ExportConfig {
        root: root.to_path_buf(),
        name: "/".into(),
        read_only: false,
        key: KEY,
        max_io: 64 << 10,
        write_verf: *b"verf0001",
    }
}

fn sys_cred() -> Credential {
    Credential::Sys {
        stamp: 0,
        machinename: b"t".to_vec(),
        uid: 0,
        gid: 0,
        gids: vec![],
    }
}

fn ok<T: std::fmt::Debug, F: std::fmt::Debug>(r: Res<T, F>) -> T {
    match r {
        Res::Ok(t) => t,
        Res::Fail(s, f) => panic!("expected NFS3_OK, got {s} ({f:?})"),
    }
}

fn status<T: std::fmt::Debug, F>(r: Res<T, F>) -> NfsStat {
    match r {
        Res::Ok(t) => panic!("expected a failure, got {t:?}"),
        Res::Fail(s, _) => s,
    }
}

fn dirop(dir: &Fh, name: &str) -> DirOp {
    DirOp {
        dir: dir.clone(),
        name: name.as_bytes().to_vec(),
    }
}

fn create(x: &Export, dir: &Fh, name: &str) -> Fh {
    ok(x.create(
        &sys_cred(),
        &CreateArgs {
            where_: dirop(dir, name),
            how: CreateHow::Unchecked(Sattr::default()),
        },
    ))
    .obj
    .unwrap()
}

fn write(x: &Export, fh: &Fh, off: u64, data: &[u8], stable: Stable) -> WriteRes {
    x.write(&WriteArgs {
        file: fh.clone(),
        offset: off,
        count: data.len() as u32,
        stable,
        data,
    })
}

#[test]
fn mount_create_write_read_commit_on_the_host_directory() {
    let s = Scratch::new("rw");
    let x = Export::new(cfg(&s.0)).unwrap();
    let root = x.mnt(b"/").unwrap().fhandle;
    assert_eq!(x.mnt(b"//").unwrap().fhandle, root);
    assert_eq!(x.mnt(b"/elsewhere"), Err(MountStat(2)));
    let fh = create(&x, &root, "a.bin");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let mut off = 0;
    for piece in data.chunks(30_000) {
        let w = ok(write(&x, &fh, off, piece, Stable::Unstable));
        assert_eq!(
            (w.count as usize, w.committed, w.verf),
            (piece.len(), Stable::Unstable, *b"verf0001")
        );
        off += piece.len() as u64;
    }
    assert_eq!(
        ok(x.commit(&CommitArgs {
            file: fh.clone(),
            offset: 0,
            count: 0
        }))
        .verf,
        *b"verf0001"
    );
    // the bytes are in the host's file
    assert_eq!(fs::read(s.0.join("a.bin")).unwrap(), data);
    let r = ok(x.read(&ReadArgs {
        file: fh.clone(),
        offset: 90_000,
        count: 60_000,
    }));
    assert_eq!((r.count, r.eof), (10_000, true));
    assert_eq!(r.data, data[90_000..]);
    let r = ok(x.read(&ReadArgs {
        file: fh.clone(),
        offset: 0,
        count: 1000,
    }));
    assert!(!r.eof);
    let l = ok(x.lookup(&dirop(&root, "a.bin")));
    assert_eq!(l.object, fh);
    assert_eq!(l.obj_attributes.unwrap().size, 100_000);
    assert_eq!(ok(x.getattr(&fh)).ftype, Ftype::Reg);
    assert_eq!(status(x.lookup(&dirop(&root, "missing"))), NfsStat::NOENT);
}

#[test]
fn counts_are_capped_by_rtmax_and_wtmax() {
    let s = Scratch::new("caps");
    fs::write(s.0.join("big"), vec![1u8; 200_000]).unwrap();
    let x = Export::new(cfg(&s.0)).unwrap();
    let fh = ok(x.lookup(&dirop(&x.root_fh(), "big"))).object;
    // a peer asking for 4 GiB gets rtmax (64 KiB), not an allocation of its count
    let r = ok(x.read(&ReadArgs {
        file: fh.clone(),
        offset: 0,
        count: u32::MAX,
    }));
    assert_eq!((r.count, r.data.len(), r.eof), (64 << 10, 64 << 10, false));
    // a WRITE longer than wtmax is a short write (RFC 1813 §3.3.7), the client sends the rest
    let w = ok(write(&x, &fh, 0, &vec![2u8; 100_000], Stable::FileSync));
    assert_eq!((w.count, w.committed), (64 << 10, Stable::FileSync));
    // count disagreeing with the data is refused
    let bad = x.write(&WriteArgs {
        file: fh.clone(),
        offset: 0,
        count: 10,
        stable: Stable::Unstable,
        data: &[0; 4],
    });
    assert_eq!(status(bad), NfsStat::INVAL);
    let f = ok(x.fsinfo(&fh));
    assert_eq!((f.rtmax, f.wtmax), (64 << 10, 64 << 10));
}

#[test]
fn forged_and_foreign_handles_are_refused() {
    let s = Scratch::new("fh");
    let other = Scratch::new("fh-other");
    fs::write(s.0.join("f"), b"x").unwrap();
    fs::write(other.0.join("g"), b"y").unwrap();
    let x = Export::new(cfg(&s.0)).unwrap();
    let y = Export::new(cfg(&other.0)).unwrap();
    let fh = ok(x.lookup(&dirop(&x.root_fh(), "f"))).object;
    // an altered inode number (the MAC no longer matches)
    let mut forged = fh.clone();
    forged.0[15] ^= 1;
    assert_eq!(status(x.getattr(&forged)), NfsStat::BADHANDLE);
    // garbage and wrong length
    assert_eq!(status(x.getattr(&Fh(vec![0; 32]))), NfsStat::BADHANDLE);
    assert_eq!(
        status(x.getattr(&Fh(b"mf\0\0\0\0\0\0\0\0\0\x01".to_vec()))),
        NfsStat::BADHANDLE
    );
    // a genuine handle of another export of the same key: stale here
    let foreign = ok(y.lookup(&dirop(&y.root_fh(), "g"))).object;
    assert_eq!(status(x.getattr(&foreign)), NfsStat::STALE);
    assert_eq!(status(x.getattr(&y.root_fh())), NfsStat::STALE);
    // a server with another key accepts none of ours
    let mut c = cfg(&s.0);
    c.key = [8; 32];
    let z = Export::new(c).unwrap();
    assert_eq!(status(z.getattr(&fh)), NfsStat::BADHANDLE);
    // a removed file's handle is stale
    fs::remove_file(s.0.join("f")).unwrap();
    assert_eq!(status(x.getattr(&fh)), NfsStat::STALE);
}

#[test]
fn no_escape_through_dotdot_names_or_symlinks() {
    let outer = Scratch::new("esc");
    let root = outer.0.join("export");
    fs::create_dir(&root).unwrap();
    fs::write(outer.0.join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink("../secret", root.join("out")).unwrap();
    std::os::unix::fs::symlink("/", root.join("slash")).unwrap();
    let x = Export::new(cfg(&root)).unwrap();
    let r = x.root_fh();
    // ".." of the root is the root
    assert_eq!(ok(x.lookup(&dirop(&r, ".."))).object, r);
    assert_eq!(ok(x.lookup(&dirop(&r, "."))).object, r);
    // names with a slash do not walk
    assert_eq!(status(x.lookup(&dirop(&r, "../secret"))), NfsStat::NOENT);
    assert_eq!(status(x.lookup(&dirop(&r, "slash/etc"))), NfsStat::NOENT);
    // a symlink is the link itself: READ, WRITE, truncate refused, the text readable
    let l = ok(x.lookup(&dirop(&r, "out")));
    assert_eq!(l.obj_attributes.unwrap().ftype, Ftype::Lnk);
    assert_eq!(
        status(x.read(&ReadArgs {
            file: l.object.clone(),
            offset: 0,
            count: 100
        })),
        NfsStat::INVAL
    );
    assert_eq!(
        status(write(&x, &l.object, 0, b"pwned", Stable::FileSync)),
        NfsStat::INVAL
    );
    let trunc = SetattrArgs {
        object: l.object.clone(),
        new_attributes: Sattr {
            size: Some(0),
            ..Sattr::default()
        },
        guard: None,
    };
    assert_eq!(status(x.setattr(&trunc)), NfsStat::INVAL);
    let chmod = SetattrArgs {
        object: l.object.clone(),
        new_attributes: Sattr {
            mode: Some(0o777),
            ..Sattr::default()
        },
        guard: None,
    };
    assert_eq!(status(x.setattr(&chmod)), NfsStat::NOTSUPP);
    assert_eq!(ok(x.readlink(&l.object)).1, b"../secret");
    // LOOKUP through the link as a directory: it is not one
    let slash = ok(x.lookup(&dirop(&r, "slash"))).object;
    assert_eq!(status(x.lookup(&dirop(&slash, "etc"))), NfsStat::NOTDIR);
    // creating "..", "." or a name with "/" is refused
    for (name, want) in [("..", NfsStat::EXIST), (".", NfsStat::EXIST), ("a/b", NfsStat::ACCES)] {
        let c = CreateArgs {
            where_: dirop(&r, name),
            how: CreateHow::Unchecked(Sattr::default()),
        };
        assert_eq!(status(x.create(&sys_cred(), &c)), want, "{name}");
    }
    assert_eq!(status(x.lookup(&dirop(&r, &"n".repeat(256)))), NfsStat::NAMETOOLONG);
    // the outside file is untouched
    assert_eq!(fs::read(outer.0.join("secret")).unwrap(), b"outside");
}

#[test]
fn handles_and_paths_survive_a_restart_and_the_write_verifier_changes() {
    let s = Scratch::new("restart");
    fs::create_dir_all(s.0.join("d1/d2")).unwrap();
    fs::write(s.0.join("d1/d2/f"), b"deep").unwrap();
    let fh = {
        let x = Export::new(cfg(&s.0)).unwrap();
        let d1 = ok(x.lookup(&dirop(&x.root_fh(), "d1"))).object;
        let d2 = ok(x.lookup(&dirop(&d1, "d2"))).object;
        ok(x.lookup(&dirop(&d2, "f"))).object
    };
    // a new server process: same key, a fresh verifier, nothing remembered
    let mut c = cfg(&s.0);
    c.write_verf = fresh_write_verifier();
    assert_ne!(c.write_verf, *b"verf0001");
    let x = Export::new(c).unwrap();
    assert_eq!(
        ok(x.read(&ReadArgs {
            file: fh.clone(),
            offset: 0,
            count: 10
        }))
        .data,
        b"deep"
    );
    assert_ne!(ok(write(&x, &fh, 0, b"DEEP", Stable::Unstable)).verf, *b"verf0001");
    // renamed by someone else on the host: found again
    fs::rename(s.0.join("d1/d2"), s.0.join("moved")).unwrap();
    assert_eq!(
        ok(x.read(&ReadArgs {
            file: fh.clone(),
            offset: 0,
            count: 10
        }))
        .data,
        b"DEEP"
    );
}

#[test]
fn create_modes_unchecked_guarded_exclusive() {
    let s = Scratch::new("create");
    let x = Export::new(cfg(&s.0)).unwrap();
    let r = x.root_fh();
    let c = |how| {
        x.create(
            &sys_cred(),
            &CreateArgs {
                where_: dirop(&r, "f"),
                how,
            },
        )
    };
    let a = ok(c(CreateHow::Guarded(Sattr {
        mode: Some(0o600),
        ..Sattr::default()
    })));
    assert_eq!(a.obj_attributes.unwrap().mode & 0o777, 0o600);
    assert_eq!(status(c(CreateHow::Guarded(Sattr::default()))), NfsStat::EXIST);
    fs::write(s.0.join("f"), b"12345").unwrap();
    // UNCHECKED with size 0 truncates an existing file
    let u = ok(c(CreateHow::Unchecked(Sattr {
        size: Some(0),
        ..Sattr::default()
    })));
    assert_eq!(u.obj_attributes.unwrap().size, 0);
    // EXCLUSIVE: the retransmission with the same verifier finds its file, another does not
    let ce = |name: &str, v| {
        x.create(
            &sys_cred(),
            &CreateArgs {
                where_: dirop(&r, name),
                how: CreateHow::Exclusive(v),
            },
        )
    };
    let e1 = ok(ce("x", *b"\x00\x00\x10\x00\x00\x00\x20\x00"));
    let e2 = ok(ce("x", *b"\x00\x00\x10\x00\x00\x00\x20\x00"));
    assert_eq!(e1.obj, e2.obj);
    assert_eq!(status(ce("x", *b"\x00\x00\x10\x00\x00\x00\x20\x01")), NfsStat::EXIST);
    assert_eq!(status(ce("f", *b"\x00\x00\x10\x00\x00\x00\x20\x00")), NfsStat::EXIST);
}

#[test]
fn mkdir_rename_link_symlink_setattr_remove_rmdir() {
    let s = Scratch::new("ops");
    let x = Export::new(cfg(&s.0)).unwrap();
    let r = x.root_fh();
    let cred = sys_cred();
    let d = ok(x.mkdir(
        &cred,
        &MkdirArgs {
            where_: dirop(&r, "d"),
            attributes: Sattr {
                mode: Some(0o750),
                ..Sattr::default()
            },
        },
    ));
    let d = d.obj.unwrap();
    assert!(s.0.join("d").is_dir());
    assert_eq!(
        status(x.mkdir(
            &cred,
            &MkdirArgs {
                where_: dirop(&r, "d"),
                attributes: Sattr::default()
            }
        )),
        NfsStat::EXIST
    );
    let f = create(&x, &d, "f");
    ok(write(&x, &f, 0, b"hello world", Stable::FileSync));
    // chmod, truncate, set times
    let set = SetattrArgs {
        object: f.clone(),
        new_attributes: Sattr {
            mode: Some(0o640),
            size: Some(5),
            mtime: SetTime::Client(Time {
                seconds: 1_000_000,
                nseconds: 5,
            }),
            ..Sattr::default()
        },
        guard: None,
    };
    let w = ok(x.setattr(&set));
    let after = w.after.unwrap();
    assert_eq!((after.mode, after.size, after.mtime.seconds), (0o640, 5, 1_000_000));
    assert_eq!(fs::read(s.0.join("d/f")).unwrap(), b"hello");
    // a guard that does not match
    let guarded = SetattrArgs {
        guard: Some(Time {
            seconds: 1,
            nseconds: 0,
        }),
        ..set
    };
    assert_eq!(status(x.setattr(&guarded)), NfsStat::NOT_SYNC);
    // ln -s, ln, mv
    let sl = ok(x.symlink(
        &cred,
        &SymlinkArgs {
            where_: dirop(&d, "sl"),
            attributes: Sattr::default(),
            data: b"f".to_vec(),
        },
    ));
    assert_eq!(ok(x.readlink(&sl.obj.unwrap())).1, b"f");
    let l = ok(x.link(&LinkArgs {
        file: f.clone(),
        link: dirop(&r, "hard"),
    }));
    assert_eq!(l.0.unwrap().nlink, 2);
    assert_eq!(
        status(x.link(&LinkArgs {
            file: d.clone(),
            link: dirop(&r, "dirlink")
        })),
        NfsStat::ISDIR
    );
    ok(x.rename(&RenameArgs {
        from: dirop(&d, "f"),
        to: dirop(&r, "g"),
    }));
    assert_eq!(fs::read(s.0.join("g")).unwrap(), b"hello");
    // the moved file's handle still works (same inode)
    assert_eq!(ok(x.getattr(&f)).size, 5);
    assert_eq!(
        status(x.rename(&RenameArgs {
            from: dirop(&d, "nope"),
            to: dirop(&r, "z")
        })),
        NfsStat::NOENT
    );
    // rm, rmdir
    assert_eq!(status(x.rmdir(&dirop(&r, "d"))), NfsStat::NOTEMPTY);
    assert_eq!(status(x.remove(&dirop(&r, "d"))), NfsStat::ISDIR);
    assert_eq!(status(x.rmdir(&dirop(&r, "g"))), NfsStat::NOTDIR);
    ok(x.remove(&dirop(&d, "sl")));
    ok(x.rmdir(&dirop(&r, "d")));
    ok(x.remove(&dirop(&r, "g")));
    ok(x.remove(&dirop(&r, "hard")));
    assert_eq!(fs::read_dir(&s.0).unwrap().count(), 0);
    let st = ok(x.fsstat(&r));
    assert!(st.tbytes >= st.fbytes && st.tbytes > 0);
    assert_eq!(ok(x.pathconf(&r)).name_max, 255);
    assert_eq!(
        ok(x.access(
            &cred,
            &AccessArgs {
                object: r.clone(),
                access: 0x3f
            }
        ))
        .1,
        0x3f & !access::EXECUTE
    );
}

#[test]
fn readdir_pages_by_count_and_cookies_survive_removals() {
    let s = Scratch::new("dir");
    for i in 0..300 {
        fs::write(s.0.join(format!("file-{i:04}")), b"").unwrap();
    }
    let x = Export::new(cfg(&s.0)).unwrap();
    let r = x.root_fh();
    let mut names = Vec::new();
    let mut args = ReaddirArgs {
        dir: r.clone(),
        cookie: 0,
        cookieverf: [0; 8],
        count: 1024,
    };
    let mut pages = 0;
    loop {
        let p = ok(x.readdir(&args));
        pages += 1;
        let enc = {
            let mut e = crate::xdr::Encoder::new(Vec::new());
            Res::<_, Option<Fattr>>::Ok(p.clone()).encode(&mut e).unwrap();
            e.finish().0.len()
        };
        assert!(enc <= 1024, "page of {enc} bytes exceeds the count");
        // between pages, remove an entry already listed: the next page goes on where it was
        if let Some(first) = p.entries.first() {
            fs::remove_file(s.0.join(OsStr::from_bytes(&first.name))).unwrap();
        }
        names.extend(p.entries.iter().map(|e| e.name.clone()));
        if p.eof {
            break;
        }
        args.cookie = p.entries.last().unwrap().cookie;
        args.cookieverf = p.cookieverf;
    }
    assert!(pages > 5);
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 300);
    // too small a count for one entry
    let tiny = ReaddirArgs {
        count: 120,
        ..args.clone()
    };
    let tiny = ReaddirArgs { cookie: 0, ..tiny };
    assert_eq!(status(x.readdir(&tiny)), NfsStat::TOOSMALL);
    // READDIRPLUS: handles that work, bounded by maxcount
    let p = ok(x.readdirplus(&ReaddirplusArgs {
        dir: r.clone(),
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 4096,
        maxcount: 4096,
    }));
    assert!(!p.eof && !p.entries.is_empty());
    let e = &p.entries[0];
    assert_eq!(ok(x.getattr(e.handle.as_ref().unwrap())).fileid, e.fileid);
    assert_eq!(
        status(x.readdir(&ReaddirArgs {
            cookieverf: *b"someverf",
            cookie: 5,
            ..args
        })),
        NfsStat::BAD_COOKIE
    );
}

#[test]
fn a_read_only_export_refuses_changes() {
    let s = Scratch::new("ro");
    fs::write(s.0.join("f"), b"data").unwrap();
    let mut c = cfg(&s.0);
    c.read_only = true;
    let x = Export::new(c).unwrap();
    let r = x.root_fh();
    let f = ok(x.lookup(&dirop(&r, "f"))).object;
    assert_eq!(status(write(&x, &f, 0, b"x", Stable::FileSync)), NfsStat::ROFS);
    assert_eq!(status(x.remove(&dirop(&r, "f"))), NfsStat::ROFS);
    assert_eq!(
        status(x.mkdir(
            &sys_cred(),
            &MkdirArgs {
                where_: dirop(&r, "d"),
                attributes: Sattr::default()
            }
        )),
        NfsStat::ROFS
    );
    let c = CreateArgs {
        where_: dirop(&r, "n"),
        how: CreateHow::Unchecked(Sattr::default()),
    };
    assert_eq!(status(x.create(&sys_cred(), &c)), NfsStat::ROFS);
    assert_eq!(
        ok(x.access(
            &sys_cred(),
            &AccessArgs {
                object: f.clone(),
                access: 0x3f
            }
        ))
        .1 & access::MODIFY,
        0
    );
    assert_eq!(
        ok(x.read(&ReadArgs {
            file: f,
            offset: 0,
            count: 10
        }))
        .data,
        b"data"
    );
    assert_eq!(fs::read(s.0.join("f")).unwrap(), b"data");
}

/// Issue 17/18: READ encoded in place (`Export::read_encode`, the data read straight into the
/// reply) is the same reply, byte for byte and DDP item for DDP item, as the READ result
/// encoded after the fact: in the middle, at the end (eof), past the end, capped by rtmax,
/// on a directory and on a forged handle (RFC 1813 §3.3.6).
#[test]
fn read_encoded_in_place_is_the_ordinary_read_reply() {
    use crate::xdr::{Encoder, XdrEncode};
    let s = Scratch::new("read-in-place");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    fs::write(s.0.join("f"), &data).unwrap();
    fs::create_dir(s.0.join("d")).unwrap();
    let x = Export::new(cfg(&s.0)).unwrap();
    let root = x.root_fh();
    let f = ok(x.lookup(&dirop(&root, "f"))).object;
    let d = ok(x.lookup(&dirop(&root, "d"))).object;
    let mut forged = f.clone();
    if let Some(b) = forged.0.last_mut() {
        *b ^= 0x55;
    }
    // a first read, so that the access time the later ones report no longer moves
    let _ = x.read(&ReadArgs {
        file: f.clone(),
        offset: 0,
        count: 1,
    });
    for (file, offset, count) in [
        (&f, 1000, 5000),
        (&f, 190_000, 60_000),
        (&f, 0, 200_000),
        (&f, 200_000, 10),
        (&f, 300_000, 10),
        (&f, 0, u32::MAX),
        (&d, 0, 100),
        (&forged, 0, 100),
    ] {
        let a = ReadArgs {
            file: file.clone(),
            offset,
            count,
        };
        let mut direct = Encoder::new(Vec::new());
        x.read_encode(&a, &mut direct).unwrap();
        let mut after = Encoder::new(Vec::new());
        x.read(&a).encode(&mut after).unwrap();
        let (db, di) = direct.finish();
        let (ab, ai) = after.finish();
        assert_eq!(db, ab, "READ at {offset} of {count}");
        assert_eq!(di, ai, "DDP items of READ at {offset} of {count}");
    }
}
