//! Golden XDR vectors for every NFSv3 procedure of the subset, from Linux 6.1's
//! own NFS/RDMA client and server (the lab's reference capture
//! `results/vm-lo-nfs-rdma.pcap`, decoded with tshark: the `rpc_raw`,
//! `nfs_raw` and `rpcordma_raw` bytes of the frames named below) and from the
//! RFC 1813 / RFC 1833 XDR for MOUNT and GETPORT. Each vector decodes to the
//! values tshark shows and re-encodes to the same bytes (RPCR-ULB-01: the
//! binding's DDP-eligible items are exactly READ's and WRITE's data).

use super::*;
use crate::client::{Auth, Call};
use crate::wire::{Header, Limits};
use crate::xdr::{ChunkSource, Decoder, Encoder, InsertedChunk, ReturnedWriteChunk};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    hex::decode(s).unwrap()
}

fn enc<T: XdrEncode>(v: &T) -> (Vec<u8>, Vec<crate::xdr::DdpItem>) {
    let mut e = Encoder::new(Vec::new());
    v.encode(&mut e).unwrap();
    e.finish()
}

const ROOT_FH: &str = "0100010001000000";
/// frame 14/10 (GETATTR/FSINFO call): the root handle.
const GETATTR_ARGS: &str = "00000008 0100010001000000";
/// frame 15: GETATTR reply for /export.
const GETATTR_RES: &str = "00000000 00000002 000001ed 00000003 00000000 00000000 0000000000000078 0000000000000000 \
     00000000 00000000 0000000000000001 0000000000000001 6b0130d6 36990d00 6b0130d9 0c65d400 6b0130d9 0c65d400";
/// frame 347: LOOKUP w64k.bin in scratch.
const LOOKUP_ARGS: &str = "00000014 0100010101000000 3e931df8 05000000 00000000 00000008 7736346b2e62696e";
/// frame 348: NFS3ERR_NOENT with the directory's attributes.
const LOOKUP_RES: &str = "00000002 00000001 00000002 000003ff 00000002 00000000 00000000 0000000000000028 \
     0000000000000000 00000000 00000000 0000000000000001 0000000000000005 6b0130d9 0c65d400 6b0130d9 0c65d400 \
     6b0130d9 0c65d400";
/// frame 39: READ 4096 at 0 of hello.txt.
const READ_ARGS: &str = "00000014 0100010101000000 a3f6a471 02000000 00000000 0000000000000000 00001000";
/// frame 41: the READ reply's inline part: 36 bytes, eof; the data went through the write chunk.
const READ_RES_REDUCED: &str = "00000000 00000001 00000001 000001a4 00000001 00000000 00000000 0000000000000024 \
     0000000000001000 00000000 00000000 0000000000000001 0000000000000002 6b0130d8 38be5e00 6b0130d6 36990d00 \
     6b0130d6 36990d00 00000024 00000001 00000024";
/// frame 364: WRITE 65536 at 0, FILE_SYNC; the data (65536 bytes) went through a read chunk at Position 116.
const WRITE_ARGS_HEAD: &str =
    "00000014 0100010101000000 d5bc4f7c 06000000 00000000 0000000000000000 00010000 00000002 00010000";
/// frame 366: WRITE reply.
const WRITE_RES: &str = "00000000 00000000 00000001 00000001 000001a4 00000001 00000000 00000000 0000000000010000 \
     0000000000010000 00000000 00000000 0000000000000001 0000000000000006 6b0130df 0b71b000 6b0130df 0bebc200 \
     6b0130df 0bebc200 00010000 00000002 05574ebc88565e28";
/// frame 28: READDIRPLUS of the root, cookie 0, dircount = maxcount = 65536.
const READDIRPLUS_ARGS: &str = "00000008 0100010001000000 0000000000000000 0000000000000000 00010000 00010000";
/// frame 33: the READDIRPLUS reply (written by the server into the call's reply chunk).
const READDIRPLUS_RES: &str = include_str!("golden_readdirplus_res.hex");
/// frame 11: FSINFO reply (no attributes).
const FSINFO_RES: &str = "00000000 00000000 00100000 00100000 00001000 00100000 00100000 00001000 00001000 \
     7fffffffffffffff 00000001 00000000 0000001b";
/// frame 14: RPC call header of Linux's client: AUTH_SYS, machinename "rdmalab-vm", uid 0, gid 0, no gids.
const GETATTR_CALL_HEADER: &str = "ad1c4fb7 00000000 00000002 000186a3 00000003 00000001 00000001 00000020 \
     00000000 0000000a 72646d616c61622d766d0000 00000000 00000000 00000000 00000000 00000000";

fn roundtrip<T>(bytes: &[u8]) -> T
where
    T: XdrEncode + for<'a> XdrDecode<'a> + std::fmt::Debug + PartialEq,
{
    let mut d = Decoder::new(bytes);
    let v = T::decode(&mut d).unwrap();
    d.finish_exact().unwrap();
    assert_eq!(enc(&v).0, bytes, "{v:?} re-encodes to the same bytes");
    v
}

#[test]
fn golden_rpc_call_header_auth_sys() {
    let auth = Auth::sys("rdmalab-vm", 0, 0, &[]).unwrap();
    let fh = Fh(hex(ROOT_FH));
    let args = |e: &mut Encoder<Vec<u8>>| fh.encode(e);
    let call = Call::new(PROGRAM, VERSION, procs::GETATTR, &args, sizing::getattr()).with_auth(&auth);
    let (msg, items) = call.encode(0xad1c4fb7).unwrap();
    let mut want = hex(GETATTR_CALL_HEADER);
    want.extend(hex(GETATTR_ARGS));
    assert_eq!(msg, want);
    assert!(items.is_empty());
}

#[test]
fn golden_getattr() {
    let fh: Fh = roundtrip(&hex(GETATTR_ARGS));
    assert_eq!(fh.hex(), ROOT_FH);
    let r: GetattrRes = roundtrip(&hex(GETATTR_RES));
    let Res::Ok(a) = r else { panic!("{r:?}") };
    assert_eq!(
        (a.ftype, a.mode, a.nlink, a.size, a.fsid, a.fileid),
        (Ftype::Dir, 0o755, 3, 120, 1, 1)
    );
    assert_eq!(
        a.mtime,
        Time {
            seconds: 0x6b0130d9,
            nseconds: 0x0c65d400
        }
    );
}

#[test]
fn golden_lookup() {
    let a: DirOp = roundtrip(&hex(LOOKUP_ARGS));
    assert_eq!(a.name, b"w64k.bin");
    assert_eq!(a.dir.0.len(), 20);
    let r: LookupRes = roundtrip(&hex(LOOKUP_RES));
    let Res::Fail(s, Some(dir)) = r else { panic!("{r:?}") };
    assert_eq!(s, NfsStat::NOENT);
    assert_eq!((dir.ftype, dir.mode, dir.fileid), (Ftype::Dir, 0o1777, 5));
    // a success carries the handle and both attributes
    let ok: LookupRes = Res::Ok(LookupOk {
        object: Fh(vec![1, 2, 3]),
        obj_attributes: None,
        dir_attributes: Some(dir),
    });
    let b = enc(&ok).0;
    assert_eq!(&b[..12], &hex("00000000 00000003 01020300"));
    assert_eq!(roundtrip::<LookupRes>(&b), ok);
}

#[test]
fn golden_read_through_write_chunk() {
    let a: ReadArgs = roundtrip(&hex(READ_ARGS));
    assert_eq!((a.offset, a.count), (0, 4096));
    // the reply as Linux sent it: data in the (only) write chunk
    let hello = b"hello from rdmalab-vm over NFS/RDMA\n";
    let reduced = hex(READ_RES_REDUCED);
    let chunks = [ReturnedWriteChunk::Data(hello)];
    let mut d = Decoder::with_chunks(&reduced, ChunkSource::Write(&chunks));
    let r = ReadRes::<&[u8]>::decode(&mut d).unwrap();
    d.finish_exact().unwrap();
    let Res::Ok(o) = &r else { panic!("{r:?}") };
    assert_eq!((o.count, o.eof, o.data), (36, true, &hello[..]));
    assert_eq!(o.file_attributes.unwrap().size, 36);
    // our encoder marks exactly the data as DDP-eligible (RFC 8267 §4.1);
    // removing it gives Linux's reduced stream
    let (full, items) = enc(&r);
    assert_eq!(items.len(), 1);
    assert_eq!((items[0].offset, items[0].len), (reduced.len(), 36));
    assert_eq!(&full[..items[0].offset], &reduced[..]);
    assert_eq!(&full[items[0].offset..], hello);
}

#[test]
fn golden_write_through_read_chunk() {
    // Linux wrote the first 64 KiB of data-16M.bin's pattern
    let data: Vec<u8> = (0..4096u64)
        .flat_map(|o| format!("{:015x}\n", o * 16).into_bytes())
        .collect();
    assert_eq!(data.len(), 65536);
    let head = hex(WRITE_ARGS_HEAD);
    let a = WriteArgs {
        file: Fh(head[4..24].to_vec()),
        offset: 0,
        count: 65536,
        stable: Stable::FileSync,
        data: &data,
    };
    let (full, items) = enc(&a);
    assert_eq!(&full[..head.len()], &head[..]);
    assert_eq!(items.len(), 1);
    // Position 116 in Linux's call = 72 bytes of RPC header + 44 bytes of arguments
    assert_eq!(items[0].offset, 44);
    assert_eq!(72 + items[0].offset, 116);
    // decoding the reduced stream with the chunk re-inserted at 44 gives the arguments back
    let ins = [InsertedChunk {
        position: 44,
        data: &data,
    }];
    let mut d = Decoder::with_chunks(&head, ChunkSource::Read(&ins));
    let back = WriteArgs::decode(&mut d).unwrap();
    d.finish_exact().unwrap();
    assert_eq!(back, a);
    let r: WriteRes = roundtrip(&hex(WRITE_RES));
    let Res::Ok(o) = r else { panic!() };
    assert_eq!(
        (o.count, o.committed, o.file_wcc.before),
        (65536, Stable::FileSync, None)
    );
    assert_eq!(o.verf, hex("05574ebc88565e28")[..]);
    assert_eq!(o.file_wcc.after.unwrap().size, 65536);
}

#[test]
fn golden_readdirplus_reply_chunk() {
    let a: ReaddirplusArgs = roundtrip(&hex(READDIRPLUS_ARGS));
    assert_eq!((a.cookie, a.dircount, a.maxcount), (0, 65536, 65536));
    let r: ReaddirplusRes = roundtrip(&hex(READDIRPLUS_RES));
    let Res::Ok(o) = r else { panic!() };
    let names: Vec<String> = o
        .entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    assert_eq!(names, [".", "..", "scratch", "SHA256SUMS", "data-16M.bin", "hello.txt"]);
    assert!(o.eof);
    let data = o.entries.iter().find(|e| e.name == b"data-16M.bin").unwrap();
    assert_eq!(data.attributes.unwrap().size, 16 << 20);
    assert_eq!(data.handle.as_ref().unwrap().0.len(), 20);
    // 880 bytes of results: Linux's client asked for a reply chunk (maxcount 65536)
    assert_eq!(hex(READDIRPLUS_RES).len(), 880);
    assert!(sizing::readdirplus(65536).max_results > 4096);
}

#[test]
fn golden_fsinfo() {
    let r: FsinfoRes = roundtrip(&hex(FSINFO_RES));
    let Res::Ok(o) = r else { panic!() };
    assert_eq!(
        (o.rtmax, o.wtmax, o.rtmult, o.dtpref, o.properties),
        (1 << 20, 1 << 20, 4096, 4096, 0x1b)
    );
    assert_eq!(o.maxfilesize, i64::MAX as u64);
}

/// The transport headers Linux put around those calls decode with our codec and
/// re-encode to the same bytes: a write list of one chunk for READ (frames 39,
/// 41) and a reply chunk of three segments for READDIRPLUS (frames 28, 33).
#[test]
fn golden_linux_transport_headers() {
    let read_call = hex(
        "b61c4fb7 00000001 00000080 00000000 00000000 00000001 00000001 34801901 00001000 b61c4fb709819000 \
         00000000 00000000",
    );
    let read_reply = hex(
        "b61c4fb7 00000001 00000040 00000000 00000000 00000001 00000001 34801901 00000024 b61c4fb709819000 \
         00000000 00000000",
    );
    let rdp_call = hex(
        "b31c4fb7 00000001 00000080 00000000 00000000 00000000 00000001 00000003 0ea16501 0000007c b31c4fb709540000 \
         86e5fe01 00010000 b31c4fb7057ff000 ed218a01 00000004 b31c4fb70954007c",
    );
    let rdp_reply = hex(
        "b31c4fb7 00000001 00000040 00000001 00000000 00000000 00000001 00000003 0ea16501 0000007c b31c4fb709540000 \
         86e5fe01 0000030c b31c4fb7057ff000 ed218a01 00000000 b31c4fb70954007c",
    );
    for (bytes, writes, reply) in [
        (&read_call, 1, false),
        (&read_reply, 1, false),
        (&rdp_call, 0, true),
        (&rdp_reply, 0, true),
    ] {
        let (h, len) = Header::decode(bytes, &Limits::default()).unwrap();
        assert_eq!(len, bytes.len());
        let l = h.body.lists().unwrap();
        assert_eq!((l.reads.len(), l.writes.len(), l.reply.is_some()), (0, writes, reply));
        assert_eq!(&h.to_vec().unwrap(), bytes);
    }
    let (h, _) = Header::decode(&rdp_reply, &Limits::default()).unwrap();
    let used: u32 = h
        .body
        .lists()
        .unwrap()
        .reply
        .as_ref()
        .unwrap()
        .segments
        .iter()
        .map(|s| s.length)
        .sum();
    // 24 bytes of RPC reply header + 880 bytes of results
    assert_eq!(used, 24 + 880);
}

/// RPCR-ULB-02: the largest reply decides the chunks a Requester provides.
#[test]
fn sizing_decides_chunks() {
    use crate::inline::{CallOptions, Thresholds, max_rpc_reply_header, plan_reply_resources};
    let th = Thresholds {
        call: 4096,
        reply: 4096,
    };
    let plan = |s: ReplySizing| {
        plan_reply_resources(
            &th,
            max_rpc_reply_header(0) + s.max_results,
            &s.ddp_results,
            |_| 1,
            CallOptions::default(),
        )
    };
    // GETATTR, LOOKUP, WRITE, CREATE, FSINFO: never a chunk
    for s in [
        sizing::getattr(),
        sizing::lookup(),
        sizing::write(),
        sizing::create(),
        sizing::fsinfo(),
    ] {
        assert_eq!(plan(s), Default::default());
    }
    // READ of 4 KiB and of 1 MiB: one write chunk of the count, no reply chunk
    for n in [4096u32, 1 << 20] {
        let r = plan(sizing::read(n));
        assert_eq!(r.write_chunks, vec![n]);
        assert_eq!(r.reply_chunk, None);
    }
    // a small READ fits inline
    assert_eq!(plan(sizing::read(1024)), Default::default());
    // READDIRPLUS with a large maxcount: a reply chunk
    let r = plan(sizing::readdirplus(65536));
    assert!(r.write_chunks.is_empty());
    assert!(r.reply_chunk.unwrap() >= 65536);
}

/// MOUNT v3 MNT/UMNT (RFC 1813 Appendix I) with the lab's root handle, and
/// rpcbind GETPORT (RFC 1833 §3.2) for mountd over TCP.
#[test]
fn golden_mount_and_getport() {
    let mut e = Encoder::new(Vec::new());
    crate::mount::encode_dirpath(&mut e, "/export").unwrap();
    assert_eq!(e.finish().0, hex("00000007 2f6578706f727400"));
    let res = hex("00000000 00000008 0100010001000000 00000001 00000001");
    let r = crate::mount::decode_mnt_res(&mut Decoder::new(&res)).unwrap().unwrap();
    assert_eq!(
        (r.fhandle.hex().as_str(), r.auth_flavors.as_slice()),
        (ROOT_FH, &[1u32][..])
    );
    let mut e = Encoder::new(Vec::new());
    crate::mount::encode_mnt_res(&mut e, &Ok(r)).unwrap();
    assert_eq!(e.finish().0, res);
    let err = crate::mount::decode_mnt_res(&mut Decoder::new(&hex("0000000d"))).unwrap();
    assert_eq!(err.unwrap_err().name(), "MNT3ERR_ACCES");
    let m = crate::portmap::Mapping {
        prog: crate::mount::PROGRAM,
        vers: 3,
        prot: crate::portmap::IPPROTO_TCP,
        port: 0,
    };
    let mut e = Encoder::new(Vec::new());
    m.encode(&mut e).unwrap();
    assert_eq!(e.finish().0, hex("000186a5 00000003 00000006 00000000"));
}

/// Decoders never panic on truncated input and reject bad discriminants.
#[test]
fn truncated_and_bad_input() {
    for v in [GETATTR_RES, LOOKUP_RES, WRITE_RES, FSINFO_RES] {
        let b = hex(v);
        for n in 0..b.len() {
            let mut d = Decoder::new(&b[..n]);
            let _ = GetattrRes::decode(&mut d.clone());
            let _ = LookupRes::decode(&mut d.clone());
            let _ = WriteRes::decode(&mut d.clone());
            let _ = FsinfoRes::decode(&mut d.clone());
            let _ = ReaddirplusRes::decode(&mut d);
        }
    }
    let mut bad = hex(GETATTR_RES);
    bad[7] = 9; // ftype 9
    assert!(matches!(
        GetattrRes::decode(&mut Decoder::new(&bad)),
        Err(XdrError::BadDiscriminant {
            what: "ftype3",
            value: 9
        })
    ));
}

/// RFC 1813 §2.6 NFS3ERR_JUKEBOX: the client waits and retries with a new call, a bounded
/// number of times, then gives the status to the caller. (Linux's nfsd answers JUKEBOX while
/// an export is being withdrawn, e.g. between `exportfs -au` and `rpc.nfsd 0`.)
#[test]
fn jukebox_is_retried_then_reported() {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    struct Canned(RefCell<VecDeque<Vec<u8>>>, RefCell<u32>);
    impl RpcClient for Canned {
        fn call<T>(
            &self,
            call: &Call<'_>,
            decode: impl FnOnce(&mut Decoder<'_>) -> Result<T, XdrError>,
        ) -> Result<T, RpcError> {
            assert_eq!(call.proc_, procs::GETATTR);
            *self.1.borrow_mut() += 1;
            let body = self.0.borrow_mut().pop_front().expect("an unexpected extra call");
            Ok(decode(&mut Decoder::new(&body)).unwrap())
        }
    }
    let jukebox = 10008u32.to_be_bytes().to_vec();
    let ok = hex(GETATTR_RES);
    let fast = JukeboxRetry {
        retries: 3,
        delay: std::time::Duration::from_millis(1),
        max_delay: std::time::Duration::from_millis(2),
    };
    let fh: Fh = roundtrip(&hex(GETATTR_ARGS));

    // two JUKEBOX answers, then the attributes
    let c = Canned(
        RefCell::new([jukebox.clone(), jukebox.clone(), ok].into()),
        RefCell::new(0),
    );
    let nfs = Nfs3Client::new(c, Auth::None).with_jukebox_retry(fast);
    assert_eq!(nfs.getattr(&fh).unwrap().fileid, 1);
    assert_eq!(*nfs.rpc().1.borrow(), 3);

    // JUKEBOX every time: 1 + 3 retries, then the status reaches the caller
    let c = Canned(RefCell::new(vec![jukebox.clone(); 4].into()), RefCell::new(0));
    let nfs = Nfs3Client::new(c, Auth::None).with_jukebox_retry(fast);
    assert_eq!(nfs.getattr(&fh).unwrap_err().status(), Some(NfsStat::JUKEBOX));
    assert_eq!(*nfs.rpc().1.borrow(), 4);

    // other statuses are not retried
    let c = Canned(RefCell::new([70u32.to_be_bytes().to_vec()].into()), RefCell::new(0));
    let nfs = Nfs3Client::new(c, Auth::None).with_jukebox_retry(fast);
    assert_eq!(nfs.getattr(&fh).unwrap_err().status(), Some(NfsStat::STALE));
    assert_eq!(*nfs.rpc().1.borrow(), 1);
}

/// COMMIT3args/COMMIT3res and REMOVE3res byte for byte (RFC 1813 §3.3.21, §3.3.12): the
/// handle as opaque<64>, offset as u64, count; resok = wcc_data then the 8-byte verifier;
/// REMOVE's resok and resfail are both the directory's wcc_data.
#[test]
fn golden_commit_and_remove() {
    let fh: Fh = roundtrip(&hex(GETATTR_ARGS));
    let args = CommitArgs {
        file: fh.clone(),
        offset: 0x1_0000_0000,
        count: 0x2000,
    };
    let (b, _) = enc(&args);
    let mut want = hex(GETATTR_ARGS);
    want.extend_from_slice(&hex("00000001 00000000 00002000"));
    assert_eq!(b, want);
    assert_eq!(roundtrip::<CommitArgs>(&want), args);
    // NFS3_OK, wcc_data with neither side, verifier
    let ok = hex("00000000 00000000 00000000 6d656d6673000001");
    let r: CommitRes = roundtrip(&ok);
    let Res::Ok(o) = r else { panic!("{r:?}") };
    assert_eq!((o.file_wcc, &o.verf), (Wcc::default(), b"memfs\0\0\x01"));
    // NFS3ERR_STALE, wcc_data
    let r: CommitRes = roundtrip(&hex("00000046 00000000 00000000"));
    assert!(matches!(r, Res::Fail(NfsStat::STALE, _)));
    let r: RemoveRes = roundtrip(&hex("00000002 00000000 00000000"));
    assert!(matches!(r, Res::Fail(NfsStat::NOENT, _)));
    let r: RemoveRes = roundtrip(&hex("00000000 00000000 00000000"));
    assert_eq!(r, Res::Ok(Wcc::default()));
    // a truncated verifier is an error, not a panic
    assert!(CommitRes::decode(&mut Decoder::new(&ok[..ok.len() - 1])).is_err());
}
