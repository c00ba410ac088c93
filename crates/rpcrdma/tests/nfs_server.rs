//! The NFSv3 server on a host directory (`rpcrdma::nfs3::server`, issue 17) against our
//! NFSv3 client (`Nfs3Client`) over TCP and over RPC-over-RDMA on loopback iWARP, as Linux
//! uses it: MOUNT over TCP, READ data through the Write list, WRITE data through a Read
//! chunk, READDIR/READDIRPLUS/READLINK through a Reply chunk (RPCR-ULB-01, RPCR-ULB-02,
//! RPCR-WRC-05, RPCR-RDC-03), the namespace procedures, escape attempts, a restart that
//! changes the write verifier, and a hostile Requester's malformed header answered with
//! RDMA_ERROR while another client goes on (RPCR-ERR-02, RPCR-ERR-07, RPCR-ERR-08).

#[path = "../../iwarp/tests/rawpeer/mod.rs"]
mod rawpeer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rawpeer::{Ask, RawPeer, op, untagged};
use rpcrdma::client::{Auth, Call, RpcClient};
use rpcrdma::mount;
use rpcrdma::nfs3::server::wire::*;
use rpcrdma::nfs3::server::{self as nfsd, Export, ExportConfig};
use rpcrdma::nfs3::*;
use rpcrdma::private_data::PrivateData;
use rpcrdma::tcp::{TcpClient, TcpServer};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};
use rpcrdma::xdr::{Decoder, ReplySizing, XdrDecode, XdrEncode};
use sha2::{Digest, Sha256};

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("srnfs-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const KEY: [u8; 32] = [42; 32];

struct Srv {
    export: Arc<Export>,
    tcp: TcpServer,
    rdma: RdmaServer,
    dev: verbs::Device,
}

fn serve(root: &Path, verf: [u8; 8]) -> Srv {
    let export = Export::new(ExportConfig {
        root: root.to_path_buf(),
        name: "/".into(),
        read_only: false,
        key: KEY,
        max_io: 1 << 20,
        write_verf: verf,
    })
    .unwrap();
    let reg = Arc::new(nfsd::registry(&export, None));
    let tcp = TcpServer::spawn("127.0.0.1:0".parse().unwrap(), reg.clone()).unwrap();
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let cfg = RdmaConfig {
        inline_send: 4096,
        inline_recv: 4096,
        ..RdmaConfig::default()
    };
    let rdma = RdmaServer::spawn(&dev, "127.0.0.1:0".parse().unwrap(), reg, cfg).unwrap();
    Srv { export, tcp, rdma, dev }
}

fn auth() -> Auth {
    Auth::sys("softrdma-test", 0, 0, &[]).unwrap()
}

impl Srv {
    fn mount(&self) -> Fh {
        let c = TcpClient::connect(self.tcp.local_addr()).unwrap();
        mount::mnt(&c, &auth(), "/").unwrap().fhandle
    }
    fn tcp_client(&self) -> Nfs3Client<TcpClient> {
        Nfs3Client::new(TcpClient::connect(self.tcp.local_addr()).unwrap(), auth())
    }
    /// As Linux's client: 4 KiB inline threshold, so READ replies use the Write list, WRITE
    /// calls a Read chunk, directory listings the Reply chunk.
    fn rdma_client(&self) -> Nfs3Client<RdmaClient> {
        let cfg = RdmaConfig {
            inline_send: 4096,
            inline_recv: 4096,
            ..RdmaConfig::default()
        };
        Nfs3Client::new(
            RdmaClient::connect(&self.dev.alloc_pd().unwrap(), self.rdma.local_addr(), cfg).unwrap(),
            auth(),
        )
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed as u8)
        .collect()
}

fn sha(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// A call of a procedure `Nfs3Client` has no method for.
fn raw<C: RpcClient, A: XdrEncode + Sync, T: for<'a> XdrDecode<'a>>(
    c: &Nfs3Client<C>,
    proc_: u32,
    args: &A,
    max_results: u32,
) -> T {
    let enc = |e: &mut rpcrdma::xdr::Encoder<Vec<u8>>| args.encode(e);
    let call = Call::new(
        PROGRAM,
        VERSION,
        proc_,
        &enc,
        ReplySizing {
            max_results,
            ddp_results: vec![],
        },
    )
    .with_auth(c.auth());
    c.rpc().call(&call, |d: &mut Decoder<'_>| T::decode(d)).unwrap()
}

fn ok<T: std::fmt::Debug, F: std::fmt::Debug>(r: Res<T, F>) -> T {
    match r {
        Res::Ok(t) => t,
        Res::Fail(s, f) => panic!("expected NFS3_OK, got {s} {f:?}"),
    }
}

fn put_get<C: RpcClient>(srv: &Srv, nfs: &Nfs3Client<C>, root: &Fh, name: &str, len: usize) {
    let data = pattern(len, len as u32);
    let fh = nfs
        .create(root, name.as_bytes(), CreateHow::Guarded(Sattr::default()))
        .unwrap()
        .obj
        .unwrap();
    let mut verf = None;
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        let w = nfs.write(&fh, (i << 20) as u64, piece, Stable::Unstable).unwrap();
        assert_eq!(w.count as usize, piece.len());
        assert!(verf.is_none_or(|v| v == w.verf), "the verifier is stable within a run");
        verf = Some(w.verf);
    }
    assert_eq!(Some(nfs.commit(&fh, 0, 0).unwrap().verf), verf);
    // the host's file has the bytes
    assert_eq!(
        sha(&std::fs::read(srv.export.config().root.join(name)).unwrap()),
        sha(&data)
    );
    let mut back = Vec::new();
    loop {
        let (chunk, r) = nfs.read(&fh, back.len() as u64, 1 << 20).unwrap();
        back.extend_from_slice(&chunk);
        if r.eof {
            break;
        }
    }
    assert_eq!(sha(&back), sha(&data), "{name}: READ gives back what WRITE stored");
}

#[test]
fn multi_mib_put_and_get_over_tcp_and_rdma_match_by_sha256() {
    let s = Scratch::new("putget");
    let srv = serve(&s.0, *b"run00001");
    let root = srv.mount();
    put_get(&srv, &srv.tcp_client(), &root, "via-tcp.bin", (5 << 20) + 123);
    let before = srv.rdma.snapshot();
    put_get(&srv, &srv.rdma_client(), &root, "via-rdma.bin", (5 << 20) + 123);
    let after = srv.rdma.snapshot();
    // READ replies went through the Write list, WRITE data through Read chunks
    assert!(
        after.replies_write_chunks - before.replies_write_chunks >= 6,
        "{before:?} -> {after:?}"
    );
    // five 1 MiB WRITEs through Read chunks (the 123-octet tail goes inline)
    assert!(
        after.calls_chunked - before.calls_chunked >= 5,
        "{before:?} -> {after:?}"
    );
    assert!(srv.export.counters.get(procs::WRITE) >= 12);
}

fn namespace<C: RpcClient>(srv: &Srv, nfs: &Nfs3Client<C>, root: &Fh, tag: &str) {
    let host = &srv.export.config().root;
    let d = format!("dir-{tag}");
    let mk = MkdirArgs {
        where_: DirOp {
            dir: root.clone(),
            name: d.clone().into_bytes(),
        },
        attributes: Sattr {
            mode: Some(0o755),
            ..Sattr::default()
        },
    };
    let dfh = ok(raw::<_, _, CreateRes>(nfs, procs::MKDIR, &mk, 1024)).obj.unwrap();
    assert!(host.join(&d).is_dir());
    for i in 0..200 {
        nfs.create(
            &dfh,
            format!("small-file-number-{i:04}").as_bytes(),
            CreateHow::Unchecked(Sattr::default()),
        )
        .unwrap();
    }
    // ls: READDIRPLUS and READDIR through the Reply chunk over RDMA, paged by count
    let all = nfs.readdirplus_all(&dfh, 8192).unwrap();
    assert_eq!(all.len(), 200);
    let mut n = 0;
    let mut args = ReaddirArgs {
        dir: dfh.clone(),
        cookie: 0,
        cookieverf: [0; 8],
        count: 32 << 10,
    };
    loop {
        let p = ok(raw::<_, _, ReaddirRes>(nfs, procs::READDIR, &args, 4 + (32 << 10)));
        n += p.entries.len();
        if p.eof {
            break;
        }
        args.cookie = p.entries.last().unwrap().cookie;
        args.cookieverf = p.cookieverf;
    }
    assert_eq!(n, 200);
    // ln -s, readlink
    let sl = SymlinkArgs {
        where_: DirOp {
            dir: dfh.clone(),
            name: b"link".to_vec(),
        },
        attributes: Sattr::default(),
        data: b"small-file-number-0001".to_vec(),
    };
    let lfh = ok(raw::<_, _, CreateRes>(nfs, procs::SYMLINK, &sl, 1024)).obj.unwrap();
    let (_, text) = ok(raw::<_, _, ReadlinkRes>(nfs, procs::READLINK, &lfh, 4 + 88 + 4 + 4096));
    assert_eq!(text, b"small-file-number-0001");
    // chmod + truncate
    let f = nfs.lookup(&dfh, b"small-file-number-0002").unwrap().object;
    nfs.write(&f, 0, b"0123456789", Stable::FileSync).unwrap();
    let set = SetattrArgs {
        object: f.clone(),
        new_attributes: Sattr {
            mode: Some(0o600),
            size: Some(4),
            ..Sattr::default()
        },
        guard: None,
    };
    let w = ok(raw::<_, _, WccRes>(nfs, procs::SETATTR, &set, 1024));
    assert_eq!((w.after.unwrap().mode, w.after.unwrap().size), (0o600, 4));
    assert_eq!(
        std::fs::read(host.join(&d).join("small-file-number-0002")).unwrap(),
        b"0123"
    );
    // mv and ln
    let mv = RenameArgs {
        from: DirOp {
            dir: dfh.clone(),
            name: b"small-file-number-0002".to_vec(),
        },
        to: DirOp {
            dir: root.clone(),
            name: format!("moved-{tag}").into_bytes(),
        },
    };
    ok(raw::<_, _, RenameRes>(nfs, procs::RENAME, &mv, 1024));
    assert_eq!(std::fs::read(host.join(format!("moved-{tag}"))).unwrap(), b"0123");
    let ln = LinkArgs {
        file: f.clone(),
        link: DirOp {
            dir: root.clone(),
            name: format!("hard-{tag}").into_bytes(),
        },
    };
    assert_eq!(
        ok(raw::<_, _, LinkRes>(nfs, procs::LINK, &ln, 1024)).0.unwrap().nlink,
        2
    );
    // df, pathconf, access
    let st = ok(raw::<_, _, FsstatRes>(nfs, procs::FSSTAT, root, 1024));
    assert!(st.tbytes > 0);
    assert_eq!(
        ok(raw::<_, _, PathconfRes>(nfs, procs::PATHCONF, root, 1024)).name_max,
        255
    );
    let acc = AccessArgs {
        object: root.clone(),
        access: 0x1f,
    };
    assert_eq!(ok(raw::<_, _, AccessRes>(nfs, procs::ACCESS, &acc, 1024)).1, 0x1f);
    // rm -r: a directory with entries is not empty, then it is
    let rmdir = DirOp {
        dir: root.clone(),
        name: d.clone().into_bytes(),
    };
    let r = raw::<_, _, WccRes>(nfs, procs::RMDIR, &rmdir, 1024);
    assert!(matches!(r, Res::Fail(NfsStat::NOTEMPTY, _)), "{r:?}");
    for e in nfs.readdirplus_all(&dfh, 8192).unwrap() {
        nfs.remove(&dfh, &e.name).unwrap();
    }
    ok(raw::<_, _, WccRes>(nfs, procs::RMDIR, &rmdir, 1024));
    assert!(!host.join(&d).exists());
}

#[test]
fn namespace_procedures_over_tcp_and_rdma() {
    let s = Scratch::new("ns");
    let srv = serve(&s.0, *b"run00001");
    let root = srv.mount();
    namespace(&srv, &srv.tcp_client(), &root, "tcp");
    let before = srv.rdma.snapshot();
    namespace(&srv, &srv.rdma_client(), &root, "rdma");
    let after = srv.rdma.snapshot();
    assert!(
        after.replies_long > before.replies_long,
        "listings used the Reply chunk: {after:?}"
    );
}

#[test]
fn escape_attempts_are_refused_over_the_wire() {
    let s = Scratch::new("escape");
    let root_dir = s.0.join("export");
    std::fs::create_dir(&root_dir).unwrap();
    std::fs::write(s.0.join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink("../secret", root_dir.join("out")).unwrap();
    let srv = serve(&root_dir, *b"run00001");
    let root = srv.mount();
    fn check<C: RpcClient>(nfs: &Nfs3Client<C>, root: &Fh) {
        assert_eq!(
            &nfs.lookup(root, b"..").unwrap().object,
            root,
            "'..' of the root is the root"
        );
        assert_eq!(
            nfs.lookup(root, b"../secret").unwrap_err().status(),
            Some(NfsStat::NOENT)
        );
        let l = nfs.lookup(root, b"out").unwrap();
        assert_eq!(l.obj_attributes.unwrap().ftype, Ftype::Lnk);
        assert_eq!(
            nfs.read(&l.object, 0, 100).unwrap_err().status(),
            Some(NfsStat::INVAL),
            "READ does not follow"
        );
        let mut forged = l.object.clone();
        forged.0[12] ^= 0x80;
        assert_eq!(nfs.getattr(&forged).unwrap_err().status(), Some(NfsStat::BADHANDLE));
        assert_eq!(
            nfs.getattr(&Fh(vec![1; 64])).unwrap_err().status(),
            Some(NfsStat::BADHANDLE)
        );
    }
    check(&srv.tcp_client(), &root);
    check(&srv.rdma_client(), &root);
    assert_eq!(std::fs::read(s.0.join("secret")).unwrap(), b"outside");
}

#[test]
fn a_restart_keeps_handles_and_changes_the_write_verifier() {
    let s = Scratch::new("restart");
    let data = pattern(3 << 20, 9);
    let (fh, verf) = {
        let srv = serve(&s.0, nfsd::fresh_write_verifier());
        let nfs = srv.rdma_client();
        let root = srv.mount();
        let fh = nfs
            .create(&root, b"f", CreateHow::Unchecked(Sattr::default()))
            .unwrap()
            .obj
            .unwrap();
        let w = nfs.write(&fh, 0, &data[..1 << 20], Stable::Unstable).unwrap();
        (fh, w.verf)
    };
    // a new server process on the same directory and key
    let mut verf2 = nfsd::fresh_write_verifier();
    if verf2 == verf {
        verf2[7] ^= 1;
    }
    let srv = serve(&s.0, verf2);
    for (name, commit) in [
        (
            "tcp",
            Box::new(|| srv.tcp_client().commit(&fh, 0, 0)) as Box<dyn Fn() -> _>,
        ),
        ("rdma", Box::new(|| srv.rdma_client().commit(&fh, 0, 0))),
    ] {
        let c = commit().unwrap();
        assert_ne!(c.verf, verf, "{name}: COMMIT after a restart shows a new verifier");
    }
    // the client writes again (as on a verifier change) and the file is whole
    let nfs = srv.tcp_client();
    for (i, p) in data.chunks(1 << 20).enumerate() {
        nfs.write(&fh, (i << 20) as u64, p, Stable::FileSync).unwrap();
    }
    assert_eq!(sha(&std::fs::read(s.0.join("f")).unwrap()), sha(&data));
}

/// A raw iWARP Requester sends malformed RPC-over-RDMA headers; the Responder answers each
/// with RDMA_ERROR (ERR_VERS for version 2, ERR_CHUNK for an RDMA_NOMSG without chunks) and
/// keeps the connection, while a well-behaved client on another connection goes on.
#[test]
fn malformed_headers_get_rdma_error_while_another_client_goes_on() {
    let s = Scratch::new("hostile");
    std::fs::write(s.0.join("f"), pattern(1 << 20, 3)).unwrap();
    let srv = serve(&s.0, *b"run00001");
    let root = srv.mount();
    let good = srv.rdma_client();
    let fh = good.lookup(&root, b"f").unwrap().object;
    let ask = Ask {
        private_data: PrivateData::default().encode().to_vec(),
        ..Ask::default()
    };
    let mut peer = RawPeer::start(srv.rdma.local_addr(), &ask).finish(&ask);
    let mut msn = 1;
    let mut send_and_answer = |m: &[u8]| -> Vec<u32> {
        peer.send(&untagged(op::SEND, 0, msn, 0, true, 0, m));
        msn += 1;
        let u = peer.read_until(|_| true).expect("an answer, and the connection stays");
        u[iwarp::wire::ddp::UNTAGGED_HEADER_LEN..]
            .chunks(4)
            .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
            .collect()
    };
    let words = |ws: &[u32]| ws.iter().flat_map(|w| w.to_be_bytes()).collect::<Vec<u8>>();
    // version 2: RDMA_ERROR / ERR_VERS 1..1 (RPCR-ERR-07)
    let a = send_and_answer(&words(&[
        0x1001, 2, 8, 0, 0, 0, 0, 0x1001, 0, 2, PROGRAM, VERSION, 0, 0, 0, 0, 0,
    ]));
    assert_eq!(a[..7], [0x1001, 2, a[2], 4, 1, 1, 1], "ERR_VERS: {a:x?}");
    // a good read in between
    assert_eq!(good.read(&fh, 0, 100_000).unwrap().0, pattern(1 << 20, 3)[..100_000]);
    // RDMA_NOMSG with no chunks: RDMA_ERROR / ERR_CHUNK (RPCR-ERR-08)
    let a = send_and_answer(&words(&[0x1002, 1, 8, 2, 0, 0, 0]));
    assert_eq!([a[0], a[1], a[3], a[4]], [0x1002, 1, 4, 2], "ERR_CHUNK: {a:x?}");
    // an unknown rdma_proc: ERR_CHUNK too
    let a = send_and_answer(&words(&[0x1003, 1, 8, 9, 0, 0, 0]));
    assert_eq!([a[0], a[1], a[3], a[4]], [0x1003, 1, 4, 2], "ERR_CHUNK: {a:x?}");
    // the hostile connection still gets NFS NULL answered
    let a = send_and_answer(&words(&[
        0x1004, 1, 8, 0, 0, 0, 0, 0x1004, 0, 2, PROGRAM, VERSION, 0, 0, 0, 0, 0,
    ]));
    assert_eq!([a[0], a[3]], [0x1004, 0], "RDMA_MSG reply to NULL: {a:x?}");
    // and the good client goes on
    assert_eq!(
        good.read(&fh, 900_000, 200_000).unwrap().0,
        pattern(1 << 20, 3)[900_000..]
    );
    assert!(srv.rdma.snapshot().rdma_errors >= 3);
}
