//! `softrdma nfs --provider roce` against Linux 6.1's kernel NFS server (nfsd + svcrdma) over
//! the guest's soft-RoCE rxe0 in the QEMU lab (`../shared/lab`, README "NFS over RDMA"; issue
//! 13). nfsd's RDMA listener on port 20049 listens on the wildcard address, so its cm_id on
//! rxe0 takes our IB CM REQ to 192.168.77.2 (siw0 stays as it is).
//!
//! Checks: MNT + GETATTR + LOOKUP (`stat`), READDIRPLUS (`ls`, a reply chunk), READ of the
//! lab's 16 MiB file with rsize 1 MiB (write chunks: nfsd RDMA Writes into us over rxe) and
//! its sha256, WRITE of 8 MiB (read chunks: nfsd RDMA Reads from us) read back by the guest's
//! `sha256sum`, and no BUG/WARNING/Oops in the guest's kernel log. docs/roce.md has what Linux
//! 6.1 does (also for `nfs probe`). Requirement IDs: RPCR-ULB-01/02, RPCR-WRC-01, RPCR-RDC-01
//! (`../shared/requirements/rdmap-rpcrdma.md`), C1/C3 of `smcr-ipoibcm.md` (IB CM, RC).
//!
//! Gate as `interop_siw.rs`: `SOFTRDMA_INTEROP=0` skips, `require` turns a skip into a failure.

#[path = "common/lab.rs"]
mod lab_common;

use lab_common::{Lab, NS, acquire, bring_up_siw, vm_exec};
use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
const SERVER: &str = "192.168.77.2";
const DATA_SHA: &str = "e714128f587492c193d3b34c78fce3d78f3abd153b833deb84c5a986d2be9c91";

/// The lab with rxe0 active and nfsd listening on 20049 on rxe0.
fn bring_up() -> Result<PathBuf, String> {
    let dir = bring_up_siw()?;
    let out = Command::new("./vm.sh")
        .args(["nfs", "start"])
        .current_dir(&dir)
        .output()
        .map_err(|e| format!("vm.sh nfs start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "vm.sh nfs start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let (_, cm) = vm_exec(&dir, "rdma res show cm_id", 20);
    if !cm
        .lines()
        .any(|l| l.contains("rxe0/") && l.contains("LISTEN") && l.contains(":20049"))
    {
        return Err(format!("nfsd does not listen on rxe0:20049: {cm}"));
    }
    Ok(dir)
}

fn nfs(args: &[&str]) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", NS, "timeout", "300", BIN, "nfs", "--provider", "roce"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("softrdma nfs");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), s)
}

fn sha256(path: &str) -> String {
    let out = Command::new("sha256sum").arg(path).output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// C1, C3, RPCR-ULB-01/02, RPCR-WRC-01, RPCR-RDC-01: stat, ls, a 16 MiB READ and an 8 MiB
/// WRITE against nfsd over rxe, hashes checked on both ends.
#[test]
fn nfs_over_rxe_stat_ls_read_write() {
    let Some(lab): Option<Lab> = acquire(
        "nfs_over_rxe_stat_ls_read_write",
        "kernel NFS/RDMA over rxe lab",
        bring_up,
    ) else {
        return;
    };
    lab.kernel_check_init();
    let target = |p: &str| format!("{SERVER}:/export{p}");

    let (ok, s) = nfs(&["stat", &target("/hello.txt")]);
    assert!(ok, "{s}");
    assert!(s.contains("size 36") && s.contains("via rdma"), "{s}");

    let (ok, s) = nfs(&["ls", &target("/")]);
    assert!(ok, "{s}");
    for name in ["data-16M.bin", "hello.txt", "scratch", "SHA256SUMS"] {
        assert!(s.contains(name), "ls lacks {name}: {s}");
    }

    let dir = tempfile_dir();
    let got = format!("{dir}/data-16M.bin");
    let (ok, s) = nfs(&["get", &target("/data-16M.bin"), &got, "--rsize", "1M"]);
    assert!(ok, "{s}");
    assert_eq!(sha256(&got), DATA_SHA);

    let put = format!("{dir}/put.bin");
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&put, &data).unwrap();
    let name = format!("/scratch/rxe-{}.bin", std::process::id());
    let (ok, s) = nfs(&["put", &put, &target(&name), "--wsize", "1M"]);
    assert!(ok, "{s}");
    let (rc, guest) = lab.exec(&format!("sha256sum /export{name}; rm -f /export{name}"), 60);
    assert_eq!(rc, 0, "{guest}");
    assert!(guest.contains(&sha256(&put)), "guest hash: {guest}");
    let _ = std::fs::remove_dir_all(&dir);
    lab.kernel_check();
}

/// A fresh directory for the files of one run.
fn tempfile_dir() -> String {
    let d = std::env::temp_dir().join(format!("softrdma-nfs-rxe-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.to_string_lossy().into_owned()
}
