//! The NFSv3 client subset against our in-memory NFSv3 server (`nfs3::memfs`,
//! built on `server.rs`), over TCP and over RPC-over-RDMA (iWARP loopback), the
//! way Linux mounts: rpcbind GETPORT and MOUNT MNT over TCP, then NFS over the
//! chosen transport. Over RDMA the server's counters show the RFC 8267 chunk
//! usage: READ replies through the Write list, WRITE data through a Read chunk,
//! READDIRPLUS through the Reply chunk (RPCR-ULB-01, RPCR-ULB-02, RPCR-WRC-01,
//! RPCR-RDC-01, RPCR-LNG-04).

use std::sync::Arc;

use rpcrdma::client::{Auth, RpcClient};
use rpcrdma::nfs3::memfs::MemFs;
use rpcrdma::nfs3::{self, CreateHow, Ftype, Nfs3Client, NfsStat, ReaddirplusArgs, Sattr, Stable, procs};
use rpcrdma::server::Registry;
use rpcrdma::tcp::{TcpClient, TcpServer};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer, StatsSnapshot};
use rpcrdma::{mount, portmap};

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u64 / 16 + 1)
        .flat_map(|o| format!("{:015x}\n", o * 16).into_bytes())
        .take(len)
        .collect()
}

struct Lab {
    fs: Arc<MemFs>,
    tcp: TcpServer,
    rdma: RdmaServer,
    _dev: verbs::Device,
    pd: verbs::ProtectionDomain,
}

fn lab() -> Lab {
    let fs = MemFs::new("/export");
    fs.put("hello.txt", b"hello from memfs\n".to_vec());
    fs.put("data-3M.bin", pattern(3 << 20 | 123));
    for i in 0..60 {
        fs.put(&format!("dir/file-with-a-longish-name-{i:03}"), vec![i as u8; i]);
    }
    let mut reg = Registry::new();
    fs.register(&mut reg);
    // GETPORT answers with the TCP server's own port for NFS and MOUNT
    let reg0 = reg.clone();
    let tcp0 = TcpServer::spawn("127.0.0.1:0".parse().unwrap(), Arc::new(reg0)).unwrap();
    let port = tcp0.local_addr().port();
    drop(tcp0);
    portmap::register(
        &mut reg,
        vec![
            (nfs3::PROGRAM, 3, portmap::IPPROTO_TCP, port),
            (mount::PROGRAM, 3, portmap::IPPROTO_TCP, port),
        ],
    );
    let reg = Arc::new(reg);
    let tcp = TcpServer::spawn(format!("127.0.0.1:{port}").parse().unwrap(), reg.clone()).unwrap();
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let scfg = RdmaConfig {
        inline_send: 4096,
        inline_recv: 4096,
        ..RdmaConfig::default()
    };
    let rdma = RdmaServer::spawn(&dev, "127.0.0.1:0".parse().unwrap(), reg, scfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    Lab {
        fs,
        tcp,
        rdma,
        _dev: dev,
        pd,
    }
}

fn auth() -> Auth {
    Auth::sys("softrdma-test", 0, 0, &[]).unwrap()
}

fn mount_root(l: &Lab) -> nfs3::Fh {
    let c = TcpClient::connect(l.tcp.local_addr()).unwrap();
    let port = portmap::getport(&c, mount::PROGRAM, 3, portmap::IPPROTO_TCP).unwrap();
    assert_eq!(port, l.tcp.local_addr().port());
    assert_eq!(portmap::getport(&c, 4242, 1, portmap::IPPROTO_TCP).unwrap(), 0);
    mount::null(&c).unwrap();
    let m = mount::mnt(&c, &auth(), "/export").unwrap();
    assert_eq!(m.fhandle, l.fs.root());
    let e = mount::mnt(&c, &auth(), "/nope").unwrap_err();
    assert!(e.to_string().contains("MNT3ERR_NOENT"), "{e}");
    mount::umnt(&c, &auth(), "/export").unwrap();
    m.fhandle
}

/// Every procedure of the subset; returns nothing, panics on a mismatch.
fn exercise<C: RpcClient>(l: &Lab, nfs: &Nfs3Client<C>, root: &nfs3::Fh, tag: &str, rsize: u32) {
    nfs.null().unwrap();
    let a = nfs.getattr(root).unwrap();
    assert_eq!(a.ftype, Ftype::Dir);
    // LOOKUP + GETATTR
    let (fh, attr) = nfs.lookup_path(root, "/data-3M.bin").unwrap();
    let want = l.fs.get("data-3M.bin").unwrap();
    assert_eq!(attr.size, want.len() as u64);
    assert_eq!(nfs.getattr(&fh).unwrap().size, want.len() as u64);
    let e = nfs.lookup(root, b"missing").unwrap_err();
    assert_eq!(e.status(), Some(NfsStat::NOENT));
    // READ the whole file in rsize pieces
    let mut got = Vec::new();
    loop {
        let (d, r) = nfs.read(&fh, got.len() as u64, rsize).unwrap();
        got.extend_from_slice(&d);
        if r.eof {
            break;
        }
        assert_eq!(d.len() as u32, rsize);
    }
    assert_eq!(got, want);
    // a READ of an odd length at an odd offset (pad 1..3 in the write chunk)
    for (off, n) in [(1u64, 4093u32), (5, 4094), (9, 4095), (13, 5000)] {
        let (d, _) = nfs.read(&fh, off, n).unwrap();
        assert_eq!(d, want[off as usize..off as usize + n as usize]);
    }
    // CREATE + WRITE (small inline, large through a read chunk) + read-back
    let name = format!("put-{tag}.bin");
    let c = nfs
        .create(
            root,
            name.as_bytes(),
            CreateHow::Unchecked(Sattr {
                mode: Some(0o600),
                size: Some(0),
                ..Sattr::default()
            }),
        )
        .unwrap();
    let wfh = c.obj.unwrap();
    let data = pattern((2 << 20) + 7);
    let mut off = 0;
    for piece in data.chunks(if rsize > 4096 { 1 << 20 } else { 100_000 }) {
        let w = nfs.write(&wfh, off, piece, Stable::FileSync).unwrap();
        assert_eq!(w.count as usize, piece.len());
        off += piece.len() as u64;
    }
    nfs.write(&wfh, off, b"tail", Stable::FileSync).unwrap();
    let mut expect = data.clone();
    expect.extend_from_slice(b"tail");
    assert_eq!(l.fs.get(&name).unwrap(), expect);
    assert_eq!(nfs.getattr(&wfh).unwrap().size, expect.len() as u64);
    let guarded = nfs.create(root, name.as_bytes(), CreateHow::Guarded(Sattr::default()));
    assert_eq!(guarded.unwrap_err().status(), Some(NfsStat::EXIST));
    // READDIRPLUS: all 60 entries, in pages (maxcount 8 KiB) and at once
    let (dir, _) = nfs.lookup_path(root, "dir").unwrap();
    let all = nfs.readdirplus_all(&dir, 8192).unwrap();
    assert_eq!(all.len(), 60);
    assert!(all.iter().all(|e| e.attributes.is_some() && e.handle.is_some()));
    assert_eq!(all[7].name, b"file-with-a-longish-name-007");
    assert_eq!(all[7].attributes.unwrap().size, 7);
    let one = nfs
        .readdirplus(&ReaddirplusArgs {
            dir: dir.clone(),
            cookie: 0,
            cookieverf: [0; 8],
            dircount: 65536,
            maxcount: 65536,
        })
        .unwrap();
    assert!(one.eof);
    assert_eq!(one.entries.len(), 60);
    let fi = nfs.fsinfo(root).unwrap();
    assert_eq!(fi.rtmax, 1 << 20);
}

#[test]
fn nfs3_over_tcp() {
    let l = lab();
    let root = mount_root(&l);
    let nfs = Nfs3Client::new(TcpClient::connect(l.tcp.local_addr()).unwrap(), auth());
    exercise(&l, &nfs, &root, "tcp", 65536);
    assert!(l.fs.counters.get(procs::READ) > 48);
}

fn delta(a: StatsSnapshot, b: StatsSnapshot) -> [u64; 6] {
    [
        b.calls_short - a.calls_short,
        b.calls_chunked - a.calls_chunked,
        b.calls_long - a.calls_long,
        b.replies_inline - a.replies_inline,
        b.replies_write_chunks - a.replies_write_chunks,
        b.replies_long - a.replies_long,
    ]
}

/// An NFS client over RDMA with Linux's 4 KiB inline thresholds both ways.
fn rdma_linux_sizes(l: &Lab) -> Nfs3Client<RdmaClient> {
    let cfg = RdmaConfig {
        inline_send: 4096,
        inline_recv: 4096,
        ..RdmaConfig::default()
    };
    Nfs3Client::new(RdmaClient::connect(&l.pd, l.rdma.local_addr(), cfg).unwrap(), auth())
}

/// RPCR-ULB-01/02: the chunk each procedure uses over RDMA with 4 KiB inline
/// thresholds (Linux's), for rsize 4 KiB, 64 KiB and 1 MiB.
#[test]
fn nfs3_over_rdma_chunk_usage() {
    let l = lab();
    let root = mount_root(&l);
    let nfs = rdma_linux_sizes(&l);
    let neg = nfs.rpc().negotiated().unwrap();
    assert_eq!((neg.thresholds.call, neg.thresholds.reply), (4096, 4096));
    let (fh, _) = nfs.lookup_path(&root, "data-3M.bin").unwrap();
    let (wfh, _) = nfs.lookup_path(&root, "hello.txt").unwrap();
    let one = |f: &dyn Fn()| {
        let a = l.rdma.snapshot();
        f();
        delta(a, l.rdma.snapshot())
    };
    // [short, chunked, long calls, inline, write-chunk, long replies]
    assert_eq!(one(&|| nfs.null().unwrap()), [1, 0, 0, 1, 0, 0]);
    assert_eq!(
        one(&|| {
            nfs.getattr(&fh).unwrap();
        }),
        [1, 0, 0, 1, 0, 0]
    );
    assert_eq!(
        one(&|| drop(nfs.lookup(&root, b"hello.txt").unwrap())),
        [1, 0, 0, 1, 0, 0]
    );
    // READ of 4 KiB, 64 KiB, 1 MiB: the data through the write list
    for n in [4096u32, 65536, 1 << 20] {
        assert_eq!(
            one(&|| drop(nfs.read(&fh, 0, n).unwrap())),
            [1, 0, 0, 0, 1, 0],
            "READ {n}"
        );
    }
    // a READ that cannot exceed the threshold is inline
    assert_eq!(one(&|| drop(nfs.read(&fh, 0, 512).unwrap())), [1, 0, 0, 1, 0, 0]);
    // WRITE of 64 KiB: the data through a read chunk; a small one inline
    let d = pattern(65536);
    assert_eq!(
        one(&|| {
            nfs.write(&wfh, 0, &d, Stable::FileSync).unwrap();
        }),
        [0, 1, 0, 1, 0, 0]
    );
    assert_eq!(
        one(&|| {
            nfs.write(&wfh, 0, &d[..100], Stable::FileSync).unwrap();
        }),
        [1, 0, 0, 1, 0, 0]
    );
    // READDIRPLUS with maxcount 64 KiB of a big directory: the reply chunk
    let (dir, _) = nfs.lookup_path(&root, "dir").unwrap();
    let args = ReaddirplusArgs {
        dir,
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 65536,
        maxcount: 65536,
    };
    assert_eq!(one(&|| drop(nfs.readdirplus(&args).unwrap())), [1, 0, 0, 0, 0, 1]);
    for rsize in [4096, 65536, 1 << 20] {
        exercise(&l, &nfs, &root, &format!("rdma-{rsize}"), rsize);
    }
    assert_eq!(l.rdma.snapshot().rdma_errors, 0);
    assert_eq!(l.rdma.snapshot().fatal, 0);
}

/// The same server over TCP and RDMA at once: a file written over RDMA reads
/// back identically over TCP.
#[test]
fn nfs3_both_transports_share_one_server() {
    let l = lab();
    let root = mount_root(&l);
    let r = Nfs3Client::new(
        RdmaClient::connect(&l.pd, l.rdma.local_addr(), RdmaConfig::default()).unwrap(),
        auth(),
    );
    let t = Nfs3Client::new(TcpClient::connect(l.tcp.local_addr()).unwrap(), auth());
    let c = r
        .create(&root, b"shared.bin", CreateHow::Guarded(Sattr::default()))
        .unwrap();
    let fh = c.obj.unwrap();
    let d = pattern(300_001);
    r.write(&fh, 0, &d, Stable::FileSync).unwrap();
    let (back, rr) = t.read(&fh, 0, 400_000).unwrap();
    assert!(rr.eof);
    assert_eq!(back, d);
}

/// RPCR-MEM-01 with pooled memory: every RPC still fast-registers its chunk
/// memory and has it invalidated before completing, but the regions behind it
/// are allocated once and reused (`rpc bench` performance, issue 5).
#[test]
fn chunk_memory_is_pooled_across_rpcs() {
    let l = lab();
    let c = RdmaClient::connect(&l.pd, l.rdma.local_addr(), RdmaConfig::default()).unwrap();
    let nfs = Nfs3Client::new(c, auth());
    let root = l.fs.root();
    let (fh, _) = nfs.lookup_path(&root, "data-3M.bin").unwrap();
    let want = l.fs.get("data-3M.bin").unwrap();
    for i in 0..40u64 {
        let off = i * 65536;
        let (d, _) = nfs.read(&fh, off, 65536).unwrap();
        assert_eq!(d, want[off as usize..off as usize + 65536]);
    }
    let c = nfs.rpc();
    assert!(
        c.regions_allocated() <= 4,
        "{} regions for 42 RPCs",
        c.regions_allocated()
    );
    // a reply lost to a dead connection does not recycle memory the peer could still write:
    // covered by the misbehave tests (retransmission after reconnect) staying green
    assert_eq!(l.rdma.snapshot().rdma_errors, 0);
}

/// RFC 1813 §3.3.7/§3.3.21: UNSTABLE WRITEs come back UNSTABLE with the server's write
/// verifier, COMMIT returns the same verifier while the server has not restarted and another
/// one after (the client must then write again); §3.3.12 REMOVE removes a file, answers NOENT
/// for a missing name and refuses a directory. Over TCP and RDMA.
#[test]
fn unstable_write_commit_verifier_and_remove() {
    let l = lab();
    let root = mount_root(&l);
    let rdma = rdma_linux_sizes(&l);
    let tcp = Nfs3Client::new(TcpClient::connect(l.tcp.local_addr()).unwrap(), auth());
    fn check<C: RpcClient>(l: &Lab, nfs: &Nfs3Client<C>, root: &nfs3::Fh, name: &str) {
        let made = nfs
            .create(
                root,
                name.as_bytes(),
                CreateHow::Unchecked(Sattr {
                    mode: Some(0o644),
                    ..Sattr::default()
                }),
            )
            .unwrap();
        let fh = made.obj.unwrap();
        let data = vec![0x5a; 100_000];
        let w = nfs.write(&fh, 0, &data, Stable::Unstable).unwrap();
        assert_eq!((w.count, w.committed), (100_000, Stable::Unstable));
        let c = nfs.commit(&fh, 0, 0).unwrap();
        assert_eq!(c.verf, w.verf, "no restart: the same verifier");
        l.fs.restart_writes();
        let c2 = nfs.commit(&fh, 0, 0).unwrap();
        assert_ne!(c2.verf, w.verf, "a restarted server has another verifier");
        let w2 = nfs.write(&fh, 0, &data, Stable::FileSync).unwrap();
        assert_eq!((w2.committed, w2.verf), (Stable::FileSync, c2.verf));
        assert_eq!(l.fs.get(name).unwrap(), data);
        nfs.remove(root, name.as_bytes()).unwrap();
        assert!(l.fs.get(name).is_none());
        assert_eq!(
            nfs.remove(root, name.as_bytes()).unwrap_err().status(),
            Some(NfsStat::NOENT)
        );
        assert_eq!(nfs.remove(root, b"dir").unwrap_err().status(), Some(NfsStat::ISDIR));
    }
    check(&l, &rdma, &root, "unstable-rdma.bin");
    check(&l, &tcp, &root, "unstable-tcp.bin");
    assert_eq!(l.fs.counters.get(procs::COMMIT), 4);
    assert_eq!(l.fs.counters.get(procs::REMOVE), 6);
}
