//! `softrdma nfs serve DIR` (issue 17) as a process, against `softrdma nfs` (the client
//! CLI) over TCP and over RPC-over-RDMA on loopback iWARP: put/get of a multi-MiB file,
//! ls, stat, rm, a read-only export, and a restart that keeps the file handles (the key
//! file) (RPCR-ULB-01, RPCR-ULB-02).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

struct Server {
    child: Child,
    tcp: u16,
    mount: u16,
    rdma: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn port_of(line: &str) -> u16 {
    line.rsplit(':').next().unwrap().trim().parse().unwrap()
}

/// Start `softrdma nfs serve DIR` on ephemeral loopback ports and read its ports from stdout.
fn serve(dir: &Path, key: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(BIN)
        .args(["nfs", "serve"])
        .arg(dir)
        .args([
            "--tcp",
            "127.0.0.1:0",
            "--rdma",
            "127.0.0.1:0",
            "--mount-port",
            "0",
            "--key-file",
        ])
        .arg(key)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (mut tcp, mut mount, mut rdma) = (0, 0, 0);
    for line in out.lines() {
        let line = line.unwrap();
        if line.contains("NFSv3 + MOUNT v3 over TCP on") {
            tcp = port_of(&line);
        } else if line.contains("MOUNT v3 over TCP on") {
            mount = port_of(&line);
        } else if line.contains("RPC-over-RDMA (iWARP) on") {
            rdma = port_of(&line);
        } else if line.contains("exporting") {
            break;
        }
    }
    assert!(tcp != 0 && mount != 0 && rdma != 0, "the server printed its ports");
    Server {
        child,
        tcp,
        mount,
        rdma,
    }
}

impl Server {
    fn run(&self, transport: &str, args: &[&str]) -> std::process::Output {
        let port = if transport == "tcp" { self.tcp } else { self.rdma };
        Command::new(BIN)
            .arg("nfs")
            .args(args)
            .args(["--transport", transport, "--port", &port.to_string()])
            .args(["--mount-port", &self.mount.to_string(), "--settle-ms", "0"])
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap()
    }
    fn ok(&self, transport: &str, args: &[&str]) -> String {
        let o = self.run(transport, args);
        assert!(
            o.status.success(),
            "nfs {args:?} over {transport}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("softrdma-nfs-serve-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.join("export")).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect()
}

#[test]
fn put_get_ls_stat_rm_over_tcp_and_rdma() {
    let s = Scratch::new("rw");
    let export = s.0.join("export");
    std::fs::create_dir(export.join("sub")).unwrap();
    for i in 0..50 {
        std::fs::write(export.join(format!("sub/entry-{i:03}")), vec![1u8; i]).unwrap();
    }
    let srv = serve(&export, &s.0.join("key"), &[]);
    let data = pattern((6 << 20) + 77);
    let local = s.0.join("local.bin");
    std::fs::write(&local, &data).unwrap();
    for t in ["tcp", "rdma"] {
        let name = format!("127.0.0.1:/up-{t}.bin");
        srv.ok(t, &["put", local.to_str().unwrap(), &name]);
        assert_eq!(
            std::fs::read(export.join(format!("up-{t}.bin"))).unwrap(),
            data,
            "{t}: put"
        );
        let back = s.0.join(format!("back-{t}.bin"));
        srv.ok(t, &["get", &name, back.to_str().unwrap()]);
        assert_eq!(std::fs::read(&back).unwrap(), data, "{t}: get");
        // pieces written at their offsets by 8 readers (out of order), over a longer file
        // that must end up truncated to the copy, the last piece short
        std::fs::write(&back, vec![9u8; data.len() + 300_000]).unwrap();
        srv.ok(
            t,
            &[
                "get",
                &name,
                back.to_str().unwrap(),
                "--rsize",
                "64K",
                "--parallel",
                "8",
            ],
        );
        assert_eq!(std::fs::read(&back).unwrap(), data, "{t}: get, 64 KiB pieces");
        let v: serde_json::Value = serde_json::from_str(srv.ok(t, &["stat", &name, "--json"]).trim()).unwrap();
        assert_eq!(v["size"], data.len());
        assert_eq!(v["type"], "reg");
        // 50 entries: more than the inline threshold, a Reply chunk over RDMA
        let v: serde_json::Value = serde_json::from_str(srv.ok(t, &["ls", "127.0.0.1:/sub", "--json"]).trim()).unwrap();
        let mut names: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        assert_eq!(names.len(), 50);
        assert_eq!(names[7], "entry-007");
        srv.ok(t, &["rm", &name]);
        assert!(!export.join(format!("up-{t}.bin")).exists(), "{t}: rm");
        // escape: the parent of the export is not reachable
        let o = srv.run(t, &["stat", "127.0.0.1:/../key"]);
        assert!(!o.status.success(), "{t}: /../key must not be reachable");
    }
}

#[test]
fn read_only_export_and_handles_across_a_restart() {
    let s = Scratch::new("ro");
    let export = s.0.join("export");
    std::fs::write(export.join("f.txt"), b"kept\n").unwrap();
    let key = s.0.join("key");
    let fh = {
        let srv = serve(&export, &key, &["--ro"]);
        let o = srv.run("tcp", &["put", key.to_str().unwrap(), "127.0.0.1:/new.bin"]);
        assert!(!o.status.success(), "a put on a read-only export fails");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("ROFS"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_str(srv.ok("rdma", &["stat", "127.0.0.1:/f.txt", "--json"]).trim()).unwrap();
        v["fh"].as_str().unwrap().to_string()
    };
    // the same key file: the same handle after a restart
    let srv = serve(&export, &key, &[]);
    let v: serde_json::Value =
        serde_json::from_str(srv.ok("tcp", &["stat", "127.0.0.1:/f.txt", "--json"]).trim()).unwrap();
    assert_eq!(v["fh"].as_str().unwrap(), fh);
}
