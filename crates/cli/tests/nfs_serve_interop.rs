//! `softrdma nfs serve` against Linux's kernel NFS client (nfs + xprtrdma over soft-iWARP) in
//! the QEMU lab (`../shared/lab`; issue 17). The server runs as a process in the lab's network
//! namespace (192.168.77.1, the export a scratch directory of the host); the guest kernel
//! (192.168.77.2) mounts it with `mount -t nfs -o vers=3,proto=rdma,port=20049,…` (its siw is
//! the iWARP initiator) and with `proto=tcp`, MOUNT v3 over TCP on `mountport=20048`.
//!
//! Checks, over each transport: `dd` of 64 MiB each way with the guest's `sha256sum` equal to
//! the host file's; `cp -r` of a tree of 1,000 small files, then `mkdir`, `mv`, `ln -s`,
//! `chmod`, `rm -r`, and `stat`/`ls -ln` of every entry, `readlink` and `df` giving what the
//! same commands give on the host; `umount` clean. Faults: the server killed (SIGKILL) in the
//! middle of a guest `dd` and started again (same key file, new write verifier): the guest's
//! `dd … conv=fsync` completes and the file is whole; the server's TCP connection under the
//! iWARP stream reset (`ss -K`) mid-`dd`: the client reconnects and the file is whole; our
//! `softrdma nfs put/get` and the kernel client against the server at once. After each case
//! the guest kernel log has no BUG/WARNING/Oops and no taint beyond siw's O+E.
//! Requirement IDs: RPCR-ULB-01/02 (the NFSv3 binding), RPCR-INL-01..03 (RFC 8797 private
//! data from Linux's client), RPCR-WRC-01 (Write list for READ), RPCR-RDC-01 (Read chunks for
//! WRITE), RPCR-LNG-04 (Reply chunks for READDIRPLUS), RPCR-MEM-05 (retransmission after a
//! reconnect).
//!
//! Gate (as `interop_siw.rs`): `SOFTRDMA_INTEROP=0` skips; unset uses a lab that is already
//! built and starts the VM if needed; `SOFTRDMA_INTEROP=require` turns a skip into a failure.
//! Holds the lab's flock (`/var/tmp/rdmalab/softrdma-interop.lock`), so it never shares the
//! guest with the other interop tests.

#[path = "common/child.rs"]
mod child;
#[path = "common/lab.rs"]
mod lab_common;

use lab_common::{Lab, NS, acquire, bring_up_siw};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
const HOST_IP: &str = "192.168.77.1";
/// The ports Linux's documentation and the issue name: NFS/RDMA 20049, NFS/TCP 2049, mountd 20048.
const RDMA_PORT: u16 = 20049;
const TCP_PORT: u16 = 2049;
const MOUNT_PORT: u16 = 20048;
/// The guest's mount point.
const MNT: &str = "/mnt/softrdma-serve";

/// The lab with siw0 up and the guest's NFS client modules loaded; skips without either.
fn lab(test: &str) -> Option<Lab> {
    let lab = acquire(test, "kernel NFS client interop lab", bring_up_siw)?;
    let (rc, out) = lab.exec("modprobe -a nfs nfsv3 rpcrdma && command -v mount.nfs", 60);
    if rc != 0 {
        if lab_common::gate() == "require" {
            panic!("{test}: the guest has no NFS client (lab built --without-nfs?): {out}");
        }
        eprintln!("SKIPPED {test}: the guest has no NFS client (lab built --without-nfs?): {out}");
        return None;
    }
    // a mount left by an earlier run that died
    lab.exec(
        &format!("umount -f {MNT} 2>/dev/null; umount -f {MNT} 2>/dev/null; true"),
        60,
    );
    lab.kernel_check_init();
    Some(lab)
}

/// A scratch directory on the host: the export, the server's key file and log.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let root = std::env::temp_dir().join(format!("softrdma-serve-interop-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("export")).unwrap();
        Scratch { root }
    }
    fn export(&self) -> PathBuf {
        self.root.join("export")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// `softrdma nfs serve` in the lab's namespace on the fixed ports.
struct Server {
    child: Child,
    log: PathBuf,
    /// The server's stdout, kept open: a line it prints later must not meet a closed pipe.
    _stdout: std::sync::mpsc::Receiver<String>,
}

impl Server {
    fn start(s: &Scratch) -> Server {
        static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = s.root.join(format!("serve-{n}.log"));
        let mut child = Command::new("ip")
            .args(["netns", "exec", NS, BIN, "nfs", "serve"])
            .arg(s.export())
            .args(["--rdma", &format!("{HOST_IP}:{RDMA_PORT}")])
            .args(["--tcp", &format!("{HOST_IP}:{TCP_PORT}")])
            .args(["--mount-port", &MOUNT_PORT.to_string(), "--key-file"])
            .arg(s.root.join("handle.key"))
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("softrdma nfs serve");
        // `ip netns exec` execs the binary: the child's pid is the server's
        let _stdout = child::lines_once_ready(&mut child, "nfs serve: exporting", Duration::from_secs(20));
        Server { child, log, _stdout }
    }

    /// SIGKILL, as a crash: no unregistering, no clean close of the connections.
    fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- server log {} ---\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

fn mount_opts(transport: &str) -> String {
    let port = if transport == "rdma" { RDMA_PORT } else { TCP_PORT };
    format!("vers=3,proto={transport},port={port},mountport={MOUNT_PORT},mountproto=tcp,nolock")
}

/// Runs `script` in the guest; panics with its output unless it ends with `exit=0`.
fn guest(lab: &Lab, what: &str, script: &str, timeout: u64) -> String {
    let t = Instant::now();
    let (rc, out) = lab.exec(&format!("{script}\necho exit=$?"), timeout);
    // the key=value lines (timings, checksums); the whole output only on failure
    let summary: Vec<&str> = out.lines().filter(|l| l.contains('=') && !l.contains('|')).collect();
    eprintln!(
        "guest: {what} ({:.1} s): {}",
        t.elapsed().as_secs_f64(),
        summary.join(" ")
    );
    assert!(
        rc == 0 && lab_common::exit_of(&out) == Some(0),
        "guest step {what:?} failed (rc {rc}):\n{out}"
    );
    out
}

fn mount(lab: &Lab, transport: &str) {
    guest(
        lab,
        &format!("mount over {transport}"),
        &format!(
            "mkdir -p {MNT} && mount -t nfs -o {} {HOST_IP}:/ {MNT} && grep ' {MNT} ' /proc/mounts",
            mount_opts(transport)
        ),
        120,
    );
}

fn umount(lab: &Lab) {
    guest(
        lab,
        "umount",
        &format!("umount {MNT} && ! grep -q ' {MNT} ' /proc/mounts"),
        120,
    );
}

fn host(cmd: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .env("LC_ALL", "C")
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "host: {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256(path: &Path) -> String {
    host(&format!("sha256sum '{}'", path.display()))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The value after `key=` on a line of `out`.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .trim()
}

/// The lines of `out` between `begin` and `end` marker lines.
fn section(out: &str, name: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| *l != format!("--{name}--"))
        .skip(1)
        .take_while(|l| *l != format!("--end {name}--"))
        .map(str::to_string)
        .collect()
}

/// A file of `mib` MiB of random bytes on the host; its sha256.
fn host_random_file(path: &Path, mib: usize) -> String {
    host(&format!("head -c {} /dev/urandom > '{}'", mib << 20, path.display()));
    sha256(path)
}

/// `stat` of every entry of `tree` (sorted), in the format both GNU and busybox stat print:
/// name, size, mode, type, links, owner, group, mtime.
const STAT_FMT: &str = "%n|%s|%a|%F|%h|%u|%g|%Y";

fn listing_script(dir: &str) -> String {
    format!(
        "cd {dir} && stat -c '{STAT_FMT}' $(find tree) | LC_ALL=C sort && \
         ls -ln tree/newdir tree/d0 | grep -v '^total' | awk '{{sub(/[.+]$/, \"\", $1); print $1, $2, $3, $4, $5, $NF}}'"
    )
}

/// Issue 17: the kernel client over RDMA, then over TCP, against one server.
#[test]
fn kernel_client_dd_tree_df_over_rdma_and_tcp() {
    let Some(lab) = lab("kernel_client_dd_tree_df_over_rdma_and_tcp") else {
        return;
    };
    let s = Scratch::new("basic");
    let server = Server::start(&s);
    // the guest's 64 MiB source file and the 1,000-file tree (10 directories of 100)
    let out = guest(
        &lab,
        "make the guest's files",
        "rm -rf /tmp/srdma && mkdir -p /tmp/srdma && cd /tmp/srdma && \
         dd if=/dev/urandom of=g64.bin bs=1M count=64 2>/dev/null && echo gsha=$(sha256sum g64.bin | cut -d' ' -f1) && \
         mk() { mkdir $1; for d in $(seq 0 $(($2 - 1))); do mkdir $1/d$d; j=0; \
           while [ $j -lt $3 ]; do echo \"file $d/$j $((j * 37))\" > $1/d$d/f$j; j=$((j+1)); done; done; } && \
         mk tree1000 10 100 && echo files=$(find tree1000 -type f | wc -l)",
        300,
    );
    assert_eq!(field(&out, "files"), "1000");
    let gsha = field(&out, "gsha").to_string();
    let hsha = host_random_file(&s.export().join("h64.bin"), 64);
    // the 1,000-file tree over both transports (each file of cp -r and rm -r costs the
    // TCG-emulated guest 30-60 ms of CPU on either transport)
    for (t, files) in [("rdma", 1000), ("tcp", 1000)] {
        mount(&lab, t);
        // 64 MiB guest → server (conv=fsync: COMMIT before dd ends), server → guest (caches dropped)
        let out = guest(
            &lab,
            &format!("dd 64 MiB each way over {t}"),
            &format!(
                "cd {MNT} && u() {{ cut -d' ' -f1 /proc/uptime; }}; \
                 a=$(u); dd if=/tmp/srdma/g64.bin of=g64-{t}.bin bs=1M conv=fsync 2>/dev/null || exit 1; b=$(u); \
                 echo 3 > /proc/sys/vm/drop_caches; \
                 c=$(u); dd if=h64.bin of=/tmp/srdma/h64.bin bs=1M 2>/dev/null || exit 1; d=$(u); \
                 echo write_secs=$(echo \"$b $a\" | awk '{{print $1-$2}}'); \
                 echo read_secs=$(echo \"$d $c\" | awk '{{print $1-$2}}'); \
                 echo rsha=$(sha256sum /tmp/srdma/h64.bin | cut -d' ' -f1); rm /tmp/srdma/h64.bin"
            ),
            600,
        );
        assert_eq!(
            sha256(&s.export().join(format!("g64-{t}.bin"))),
            gsha,
            "dd guest → server over {t}"
        );
        assert_eq!(field(&out, "rsha"), hsha, "dd server → guest over {t}");
        for (k, dir) in [("write_secs", "guest → server"), ("read_secs", "server → guest")] {
            let secs: f64 = field(&out, k).parse().unwrap();
            eprintln!(
                "kernel client over {t}: dd 64 MiB {dir}: {secs:.2} s, {:.1} MB/s",
                67.108864 / secs
            );
        }

        // the tree: cp -r, then the namespace operations, then a listing on both sides
        let out = guest(
            &lab,
            &format!("cp -r of {files} files and the namespace operations over {t}"),
            &format!(
                "cd {MNT} && u() {{ cut -d' ' -f1 /proc/uptime; }}; a=$(u); cp -r /tmp/srdma/tree{files} tree || exit 1; b=$(u); \
                 echo cp_secs=$(echo \"$b $a\" | awk '{{print $1-$2}}'); \
                 mkdir tree/newdir && mv tree/d1/f1 tree/newdir/moved && mv tree/d2 tree/d2-renamed && \
                 ln -s ../d0/f0 tree/newdir/link && chmod 600 tree/d0/f5 && chmod 751 tree/d3 && \
                 chmod 4755 tree/d0/f7 && rm -r tree/d4 && \
                 echo link=$(readlink tree/newdir/link) && echo via_link=$(cat tree/newdir/link) && \
                 echo --list-- && {} && echo --end list--",
                listing_script(".")
            ),
            600,
        );
        let secs: f64 = field(&out, "cp_secs").parse().unwrap();
        eprintln!("kernel client over {t}: cp -r of {files} files: {secs:.1} s");
        assert_eq!(field(&out, "link"), "../d0/f0");
        assert_eq!(field(&out, "via_link"), "file 0/0 0");
        let guest_list = section(&out, "list");
        let host_list: Vec<String> = host(&listing_script(&s.export().display().to_string()))
            .lines()
            .map(str::to_string)
            .collect();
        // tree, its directories and files, newdir and its link; less d4 and its files
        assert!(guest_list.len() > files * 4 / 5, "{guest_list:?}");
        assert_eq!(guest_list, host_list, "stat/ls -ln over {t} differ from the host's");
        assert!(
            guest_list
                .iter()
                .any(|l| l.starts_with("tree/d0/f5|13|600|regular file|"))
        );
        assert!(
            guest_list
                .iter()
                .any(|l| l.starts_with("tree/d3|") && l.contains("|751|directory|"))
        );
        assert!(
            guest_list
                .iter()
                .any(|l| l.starts_with("tree/d0/f7|") && l.contains("|4755|"))
        );
        assert!(!guest_list.iter().any(|l| l.starts_with("tree/d4")));

        df_matches(&lab, &s.export(), t);
        guest(
            &lab,
            &format!("rm -r the tree over {t}"),
            &format!("rm -r {MNT}/tree"),
            600,
        );
        assert!(!s.export().join("tree").exists());
        umount(&lab);
        lab.kernel_check();
    }
    drop(server);
}

/// `df -k` in the guest against `df -k` on the host, taken just before and after (the host's
/// disk is shared, its free space moves): the guest's figures are the host's rounded up to the
/// mount's block size (Linux's `nfs_statfs` rounds each of tbytes, fbytes and abytes up to
/// `s_blocksize`, 1 MiB here).
fn df_matches(lab: &Lab, export: &Path, t: &str) {
    let df = |out: &str| -> [u64; 3] {
        let last = out
            .lines()
            .rfind(|l| l.contains('%'))
            .unwrap_or_else(|| panic!("df: {out}"));
        let f: Vec<u64> = last.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        [f[0], f[1], f[2]]
    };
    let before = df(&host(&format!("df -k '{}'", export.display())));
    let out = guest(lab, &format!("df over {t}"), &format!("df -k {MNT}"), 60);
    let after = df(&host(&format!("df -k '{}'", export.display())));
    let g = df(&out);
    const BLOCK_KIB: u64 = 1024;
    for (i, name) in ["1K-blocks", "Used", "Available"].iter().enumerate() {
        let (lo, hi) = (before[i].min(after[i]), before[i].max(after[i]));
        assert!(
            g[i] + BLOCK_KIB > lo && g[i] < hi + 2 * BLOCK_KIB,
            "df {name} over {t}: guest {} host {lo}..{hi}",
            g[i]
        );
    }
}

/// The guest's 64 MiB random file (`/tmp/srdma/g64.bin`, made once per boot): its sha256.
fn guest_source(lab: &Lab) -> String {
    let out = guest(
        lab,
        "the guest's 64 MiB file",
        "mkdir -p /tmp/srdma && cd /tmp/srdma && { [ -f g64.bin ] || dd if=/dev/urandom of=g64.bin bs=1M count=64 2>/dev/null; } && \
         echo gsha=$(sha256sum g64.bin | cut -d' ' -f1)",
        120,
    );
    field(&out, "gsha").to_string()
}

/// Starts `dd if=/tmp/srdma/g64.bin of=MNT/NAME bs=1M conv=fsync` in the guest's background;
/// its exit status goes to `/tmp/srdma/NAME.status`.
fn guest_dd_write_bg(lab: &Lab, name: &str) {
    guest(
        lab,
        &format!("start dd to {name}"),
        &format!(
            "rm -f /tmp/srdma/{name}.status; \
             (dd if=/tmp/srdma/g64.bin of={MNT}/{name} bs=1M conv=fsync 2>/tmp/srdma/{name}.err; \
              echo $? > /tmp/srdma/{name}.status) >/dev/null 2>&1 &"
        ),
        30,
    );
}

/// Waits (up to `limit`) for the background dd to `name` to end: its exit status.
fn guest_dd_wait(lab: &Lab, name: &str, limit: Duration) -> i32 {
    let t = Instant::now();
    loop {
        let (_, out) = lab.exec(&format!("cat /tmp/srdma/{name}.status 2>/dev/null"), 30);
        if let Ok(st) = out.trim().parse() {
            eprintln!(
                "guest dd to {name} ended ({st}) after {:.1} s",
                t.elapsed().as_secs_f64()
            );
            return st;
        }
        assert!(
            t.elapsed() < limit,
            "the guest's dd to {name} did not end within {limit:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Waits until the host's copy of `path` has at least `bytes`.
fn wait_for_size(path: &Path, bytes: u64) {
    let t = Instant::now();
    while std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) < bytes {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{} never reached {bytes} bytes",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The guest's per-operation counters of the mount (`/proc/self/mountstats`): (ops, transmissions).
fn mountstats(lab: &Lab, op: &str) -> (u64, u64) {
    let (_, out) = lab.exec(
        &format!("grep -A40 ' {MNT} ' /proc/self/mountstats | grep ' {op}:' | head -1"),
        30,
    );
    let f: Vec<u64> = out.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    assert!(f.len() >= 2, "no {op} line in mountstats: {out}");
    (f[0], f[1])
}

/// Issue 17 faults: the server killed (SIGKILL) while the guest's `dd … conv=fsync` writes over
/// RDMA, and started again on the same ports and key file. Linux's client reconnects, and its
/// COMMIT meets another write verifier, so it sends the UNSTABLE WRITEs again (RFC 1813
/// §3.3.21). To show that the resend is what makes the file whole, the data the first server
/// had written is zeroed before the restart: what a crash that lost the unstable data leaves.
#[test]
fn kernel_client_write_survives_server_kill_and_restart() {
    let Some(lab) = lab("kernel_client_write_survives_server_kill_and_restart") else {
        return;
    };
    let s = Scratch::new("restart");
    let gsha = guest_source(&lab);
    let server = Server::start(&s);
    mount(&lab, "rdma");
    let file = s.export().join("k.bin");
    guest_dd_write_bg(&lab, "k.bin");
    wait_for_size(&file, 8 << 20);
    // Kill only once the client holds replies to some UNSTABLE WRITEs (mountstats counts an
    // operation when it completes): those are what the verifier change must make it resend.
    // The file's size alone does not say so: the I/O pool writes several WRITEs at once and
    // their replies follow, so at 8 MiB the client may have none yet, and then it only
    // retransmits the unanswered calls and one COMMIT matches.
    let t = Instant::now();
    while mountstats(&lab, "WRITE").0 < 4 {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no WRITE completed in the guest"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = server.kill();
    let (commits, _) = mountstats(&lab, "COMMIT");
    let had = std::fs::metadata(&file).unwrap().len();
    // the first server's unstable data, lost
    host(&format!(
        "dd if=/dev/zero of='{}' bs=1M count={} conv=notrunc 2>/dev/null",
        file.display(),
        had >> 20
    ));
    eprintln!("killed the server with {had} bytes of k.bin written, {commits} COMMITs so far;\n{log}");
    assert_eq!(
        commits, 0,
        "the client committed before the kill: zeroing would lose committed data"
    );
    std::thread::sleep(Duration::from_secs(2));
    let server = Server::start(&s);
    assert_eq!(guest_dd_wait(&lab, "k.bin", Duration::from_secs(240)), 0);
    let (writes, sent) = mountstats(&lab, "WRITE");
    let (commits, _) = mountstats(&lab, "COMMIT");
    eprintln!("after the restart: {writes} WRITEs ({sent} transmissions), {commits} COMMITs");
    assert_eq!(sha256(&file), gsha, "the host's file after the restart");
    // the resend: more WRITEs than 64 MiB / wsize 1 MiB, and more than one COMMIT
    assert!(writes > 64 && commits >= 2, "{writes} WRITEs, {commits} COMMITs");
    let out = guest(
        &lab,
        "read back",
        &format!("echo 3 > /proc/sys/vm/drop_caches; echo rsha=$(sha256sum {MNT}/k.bin | cut -d' ' -f1)"),
        300,
    );
    assert_eq!(field(&out, "rsha"), gsha);
    umount(&lab);
    lab.kernel_check();
    drop(server);
}

/// The server's TCP connections under iWARP on port 20049: "peer-ip:port" of each.
fn rdma_conns() -> Vec<String> {
    host(&format!(
        "ip netns exec {NS} ss -Htn state established '( sport = :{RDMA_PORT} )' | awk '{{print $4}}'"
    ))
    .lines()
    .map(str::to_string)
    .collect()
}

/// Issue 17 faults: the server's TCP connection under the iWARP stream reset (`ss -K`) in the
/// middle of a guest `dd` each way: the kernel client reconnects (a new MPA and RFC 8797
/// exchange), retransmits, and both files are whole.
#[test]
fn kernel_client_survives_a_connection_reset() {
    let Some(lab) = lab("kernel_client_survives_a_connection_reset") else {
        return;
    };
    let s = Scratch::new("reset");
    let gsha = guest_source(&lab);
    let hsha = host_random_file(&s.export().join("h64.bin"), 64);
    let server = Server::start(&s);
    mount(&lab, "rdma");
    let before = rdma_conns();
    let file = s.export().join("r.bin");
    guest_dd_write_bg(&lab, "r.bin");
    wait_for_size(&file, 8 << 20);
    let kill = host(&format!(
        "ip netns exec {NS} ss -K -tn '( sport = :{RDMA_PORT} )' 2>&1 || true"
    ));
    eprintln!("ss -K: {kill}");
    assert_eq!(guest_dd_wait(&lab, "r.bin", Duration::from_secs(240)), 0);
    assert_eq!(sha256(&file), gsha, "the guest's write after the reset");
    let after = rdma_conns();
    eprintln!("connections before {before:?}, after {after:?}");
    if before == after {
        // the host kernel may lack SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY): nothing was reset
        eprintln!("SKIPPED the reset check: ss -K did not reset the connection");
    }
    // the read direction: reset about a second into the read
    guest(
        &lab,
        "start the read",
        &format!(
            "echo 3 > /proc/sys/vm/drop_caches; rm -f /tmp/srdma/rd.status; \
             (dd if={MNT}/h64.bin of=/tmp/srdma/h64.bin bs=1M 2>/dev/null; echo $? > /tmp/srdma/rd.status) >/dev/null 2>&1 &"
        ),
        30,
    );
    std::thread::sleep(Duration::from_secs(1));
    host(&format!(
        "ip netns exec {NS} ss -K -tn '( sport = :{RDMA_PORT} )' >/dev/null 2>&1 || true"
    ));
    assert_eq!(guest_dd_wait(&lab, "rd", Duration::from_secs(240)), 0);
    let out = guest(
        &lab,
        "read back",
        "echo rsha=$(sha256sum /tmp/srdma/h64.bin | cut -d' ' -f1); rm /tmp/srdma/h64.bin",
        120,
    );
    assert_eq!(field(&out, "rsha"), hsha, "the guest's read after the reset");
    umount(&lab);
    lab.kernel_check();
    drop(server);
}

/// Issue 17: our `softrdma nfs` client (put and get over RPC-over-RDMA, from the namespace)
/// and the kernel client (a 64 MiB `dd` over RDMA) against the server at once.
#[test]
fn kernel_and_softrdma_clients_at_once() {
    let Some(lab) = lab("kernel_and_softrdma_clients_at_once") else {
        return;
    };
    let s = Scratch::new("both");
    let gsha = guest_source(&lab);
    let local = s.root.join("ours.bin");
    let osha = host_random_file(&local, 32);
    let server = Server::start(&s);
    mount(&lab, "rdma");
    guest_dd_write_bg(&lab, "kernel.bin");
    wait_for_size(&s.export().join("kernel.bin"), 4 << 20);
    let back = s.root.join("back.bin");
    for (op, a, b) in [
        ("put", local.display().to_string(), format!("{HOST_IP}:/ours.bin")),
        ("get", format!("{HOST_IP}:/ours.bin"), back.display().to_string()),
    ] {
        let out = Command::new("ip")
            .args(["netns", "exec", NS, "timeout", "300", BIN, "nfs", op, "--json"])
            .args(["--mount-port", &MOUNT_PORT.to_string(), &a, &b])
            .output()
            .unwrap();
        eprintln!(
            "softrdma nfs {op}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "softrdma nfs {op} while the kernel client writes");
    }
    assert_eq!(sha256(&s.export().join("ours.bin")), osha);
    assert_eq!(sha256(&back), osha);
    assert_eq!(guest_dd_wait(&lab, "kernel.bin", Duration::from_secs(240)), 0);
    assert_eq!(sha256(&s.export().join("kernel.bin")), gsha);
    umount(&lab);
    lab.kernel_check();
    drop(server);
}
