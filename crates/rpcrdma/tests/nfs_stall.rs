//! Issue 17, "many clients and calls in flight at once, without one slow client or disk
//! holding others up", with a disk that really stalls: one export on an ext4 file system
//! in a loop-mounted image, frozen with `fsfreeze -f` so that WRITE blocks in the kernel,
//! next to an export on an unfrozen directory. Both exports share one I/O pool
//! (`rpcrdma::pool`) and are served over TCP and RPC-over-RDMA (loopback iWARP).
//! While the frozen export's WRITEs hang, the other export answers GETATTR, READ and
//! WRITE within a bound over both transports, and a TCP client that sends READs and never
//! reads its replies does not hold it up either; after the thaw the hung WRITEs complete
//! and the file has their bytes.
//!
//! Needs root, loop devices, `mkfs.ext4` and `fsfreeze`; skips with the reason otherwise.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rpcrdma::client::Auth;
use rpcrdma::mount;
use rpcrdma::nfs3::server::{self as nfsd, Export, ExportConfig};
use rpcrdma::nfs3::*;
use rpcrdma::pool::{IoPool, PoolConfig};
use rpcrdma::tcp::{TcpClient, TcpServer, TcpServerConfig};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A loop-mounted ext4 image and a plain directory, removed (thawed first) on drop.
struct Disks {
    base: PathBuf,
    mnt: PathBuf,
    plain: PathBuf,
    mounted: bool,
    frozen: bool,
}

impl Disks {
    fn new() -> Result<Disks, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root (mount -o loop and fsfreeze need it)".into());
        }
        let base = std::env::temp_dir().join(format!("srnfs-stall-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (mnt, plain) = (base.join("mnt"), base.join("plain"));
        std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&plain).map_err(|e| e.to_string())?;
        let mut d = Disks {
            base: base.clone(),
            mnt: mnt.clone(),
            plain,
            mounted: false,
            frozen: false,
        };
        let img = base.join("disk.img");
        let img = img.to_str().ok_or("path")?;
        run("truncate", &["-s", "64M", img])?;
        run("mkfs.ext4", &["-q", "-F", img])?;
        run("mount", &["-o", "loop", img, mnt.to_str().ok_or("path")?])?;
        d.mounted = true;
        Ok(d)
    }

    fn freeze(&mut self) -> Result<(), String> {
        run("fsfreeze", &["-f", self.mnt.to_str().unwrap()])?;
        self.frozen = true;
        Ok(())
    }

    fn thaw(&mut self) {
        if self.frozen {
            let _ = run("fsfreeze", &["-u", self.mnt.to_str().unwrap()]);
            self.frozen = false;
        }
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        self.thaw();
        if self.mounted {
            let _ = run("umount", &[self.mnt.to_str().unwrap()]);
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

struct Served {
    tcp: TcpServer,
    rdma: RdmaServer,
}

fn serve(root: &Path, pool: &Arc<IoPool>, dev: &verbs::Device) -> Served {
    let export = Export::new(ExportConfig {
        root: root.to_path_buf(),
        name: "/".into(),
        read_only: false,
        key: [7; 32],
        max_io: 1 << 20,
        write_verf: *b"stall001",
    })
    .unwrap();
    let reg = Arc::new(nfsd::registry(&export, None));
    let tcp = TcpServer::spawn_with(
        "127.0.0.1:0".parse().unwrap(),
        reg.clone(),
        TcpServerConfig {
            pool: Some(pool.clone()),
            ..TcpServerConfig::default()
        },
    )
    .unwrap();
    let cfg = RdmaConfig {
        inline_send: 4096,
        inline_recv: 4096,
        pool: Some(pool.clone()),
        ..RdmaConfig::default()
    };
    let rdma = RdmaServer::spawn(dev, "127.0.0.1:0".parse().unwrap(), reg, cfg).unwrap();
    Served { tcp, rdma }
}

fn auth() -> Auth {
    Auth::sys("softrdma-test", 0, 0, &[]).unwrap()
}

impl Served {
    fn root(&self) -> Fh {
        let c = TcpClient::connect(self.tcp.local_addr()).unwrap();
        mount::mnt(&c, &auth(), "/").unwrap().fhandle
    }
    fn tcp(&self) -> Nfs3Client<TcpClient> {
        let mut c = TcpClient::connect(self.tcp.local_addr()).unwrap();
        c.set_timeout(Duration::from_secs(60));
        Nfs3Client::new(c, auth())
    }
    fn rdma(&self, dev: &verbs::Device) -> Nfs3Client<RdmaClient> {
        let cfg = RdmaConfig {
            inline_send: 4096,
            inline_recv: 4096,
            timeout: Duration::from_secs(60),
            ..RdmaConfig::default()
        };
        Nfs3Client::new(
            RdmaClient::connect(&dev.alloc_pd().unwrap(), self.rdma.local_addr(), cfg).unwrap(),
            auth(),
        )
    }
}

fn fh_of(r: Result<CreateOk, NfsError>) -> Fh {
    r.unwrap().obj.expect("CREATE returned a handle")
}

/// One NFSv3 READ call of `count` octets as an RPC record, for a client that never
/// reads the reply.
fn raw_read_record(xid: u32, fh: &Fh, count: u32) -> Vec<u8> {
    let mut e = rpcrdma::xdr::Encoder::new(Vec::new());
    let w = |e: &mut rpcrdma::xdr::Encoder<Vec<u8>>, v: u32| e.put_u32(v).unwrap();
    for v in [xid, 0, 2, PROGRAM, VERSION, procs::READ, 0, 0, 0, 0] {
        w(&mut e, v);
    }
    e.put_opaque(&fh.0, 64).unwrap();
    e.put_u64(0).unwrap();
    w(&mut e, count);
    let body = e.finish().0;
    let mut rec = ((body.len() as u32) | 0x8000_0000).to_be_bytes().to_vec();
    rec.extend_from_slice(&body);
    rec
}

#[test]
fn a_frozen_export_and_a_client_that_never_reads_do_not_hold_up_another_export() {
    let mut disks = match Disks::new() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIP a_frozen_export...: {why}");
            return;
        }
    };
    // 4 threads: one export runs at most 3 at once (PoolConfig::per_group), a connection 2
    let pool = IoPool::new("nfs-io-test", PoolConfig::with_threads(4)).unwrap();
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let frozen = serve(&disks.mnt, &pool, &dev);
    let live = serve(&disks.plain, &pool, &dev);
    let (froot, lroot) = (frozen.root(), live.root());
    let (f_rdma, f_tcp) = (frozen.rdma(&dev), frozen.tcp());
    let (l_rdma, l_tcp) = (live.rdma(&dev), live.tcp());
    let stall_fh = fh_of(f_rdma.create(&froot, b"stall.bin", CreateHow::Unchecked(Sattr::default())));
    let live_fh = fh_of(l_rdma.create(&lroot, b"live.bin", CreateHow::Unchecked(Sattr::default())));
    let piece: Vec<u8> = (0..256u32 << 10).map(|i| (i * 7 + i / 4096) as u8).collect();
    l_tcp.write(&live_fh, 0, &piece, Stable::FileSync).unwrap();

    if let Err(why) = disks.freeze() {
        eprintln!("SKIP a_frozen_export...: {why}");
        return;
    }
    let done = AtomicUsize::new(0);
    let (piece, done_r) = (&piece, &done);
    std::thread::scope(|s| {
        // 8 FILE_SYNC WRITEs to the frozen file system: 6 over RDMA (Read chunks), 2 over TCP
        let (fr, ft, sfh) = (&f_rdma, &f_tcp, &stall_fh);
        let mut hung = Vec::new();
        for i in 0..8u64 {
            hung.push(s.spawn(move || {
                let off = i * piece.len() as u64;
                let w = if i < 6 {
                    fr.write(sfh, off, piece, Stable::FileSync)
                } else {
                    ft.write(sfh, off, piece, Stable::FileSync)
                };
                done_r.fetch_add(1, Ordering::SeqCst);
                w
            }));
        }
        // they reach the pool and hang there, at most per_group of them running
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.load().running < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // a failure below must thaw before the scope joins the hung WRITEs
        let phase = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let load = pool.load();
            assert_eq!(
                load.running, 3,
                "the frozen export holds its share of the pool: {load:?}"
            );
            live_phase(&live, &l_rdma, &l_tcp, &live_fh, piece, done_r)
        }));
        disks.thaw();
        if let Err(p) = phase {
            std::panic::resume_unwind(p);
        }
        let t = Instant::now();
        for h in hung {
            let w = h.join().unwrap().expect("the hung WRITE completes after the thaw");
            assert_eq!(w.count as usize, piece.len());
            assert_eq!(w.committed, Stable::FileSync);
        }
        eprintln!("8 hung WRITEs completed {:?} after the thaw", t.elapsed());
    });
    let host = std::fs::read(disks.mnt.join("stall.bin")).unwrap();
    assert_eq!(host.len(), 8 * piece.len());
    for (i, c) in host.chunks(piece.len()).enumerate() {
        assert!(c == &piece[..], "piece {i} of the stalled file");
    }
    drop((f_rdma, f_tcp, l_rdma, l_tcp));
}

/// While the other export is frozen: a client that never reads, and the live export's
/// clients answered within the bound.
fn live_phase(
    live: &Served,
    l_rdma: &Nfs3Client<RdmaClient>,
    l_tcp: &Nfs3Client<TcpClient>,
    live_fh: &Fh,
    piece: &[u8],
    done_r: &AtomicUsize,
) {
    // a TCP client of the live export that sends 32 READs of 1 MiB and never reads
    let mut greedy = std::net::TcpStream::connect(live.tcp.local_addr()).unwrap();
    for x in 0..32 {
        greedy
            .write_all(&raw_read_record(0x5100 + x, live_fh, 1 << 20))
            .unwrap();
    }

    // the live export answers over both transports, each call within the bound
    let bound = Duration::from_secs(3);
    let t0 = Instant::now();
    for round in 0..10u64 {
        for (name, c) in [("rdma", l_rdma as &dyn Ops), ("tcp", l_tcp as &dyn Ops)] {
            let t = Instant::now();
            c.round(live_fh, piece, round);
            let took = t.elapsed();
            assert!(
                took < bound,
                "{name} round {round} took {took:?} while the other export is frozen"
            );
        }
    }
    eprintln!(
        "live export: 20 rounds of GETATTR + READ 256 KiB + WRITE 256 KiB in {:?} while frozen",
        t0.elapsed()
    );
    assert_eq!(done_r.load(Ordering::SeqCst), 0, "no WRITE to the frozen disk returned");
    drop(greedy);
}

/// One round against the live export: GETATTR, READ (RDMA: through a Write chunk) and a
/// FILE_SYNC WRITE.
trait Ops {
    fn round(&self, fh: &Fh, piece: &[u8], round: u64);
}

impl<C: rpcrdma::client::RpcClient> Ops for Nfs3Client<C> {
    fn round(&self, fh: &Fh, piece: &[u8], round: u64) {
        self.getattr(fh).unwrap();
        let (data, _) = self.read(fh, 0, piece.len() as u32).unwrap();
        assert_eq!(&data[..], piece);
        let w = self
            .write(fh, (1 + round) * piece.len() as u64, piece, Stable::FileSync)
            .unwrap();
        assert_eq!(w.count as usize, piece.len());
    }
}
