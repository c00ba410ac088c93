//! The examples in crates/cli/examples run as their docs say: the two-process
//! ones (write_read, echo, rpc_rdma) as two processes over loopback, the async
//! one alone. Their output is checked, so an example that stops working fails CI.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// The example binary, built next to this test (`cargo test --all-targets`
/// builds examples; a lone `--test examples` run builds them here).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-p", "softrdma", "--examples"]);
        if profile_dir.ends_with("release") {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "building the examples");
    }
    assert!(path.exists(), "{} missing", path.display());
    path
}

/// Runs a command to completion within `T`.
fn run(cmd: &mut Command) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    rx.recv_timeout(T).expect("finished in time").unwrap()
}

/// Starts a server example and returns it with the address from its "listening on" line.
fn start_server(name: &str, extra: &[&str]) -> (Child, String, mpsc::Receiver<String>) {
    let mut child = Command::new(example(name))
        .args(["server", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(T).expect("a line from the server");
    let addr = first
        .strip_prefix("listening on ")
        .expect("listening on ADDR")
        .to_string();
    (child, addr, rx)
}

fn finish(mut child: Child, rx: mpsc::Receiver<String>) -> String {
    let (tx, done) = mpsc::channel();
    let status = {
        std::thread::scope(|s| {
            s.spawn(|| tx.send(child.wait()));
            done.recv_timeout(T).map(|r| r.unwrap())
        })
    };
    let status = status.unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("server did not exit")
    });
    assert!(status.success(), "server exit {status}");
    rx.try_iter().collect::<Vec<_>>().join("\n")
}

#[test]
fn write_read_two_processes() {
    let (server, addr, rx) = start_server("write_read", &[]);
    let out = run(Command::new(example("write_read")).args(["client", &addr]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("read back \"written by RDMA Write, 32 bytes!\": matches"),
        "{stdout}"
    );
    let s = finish(server, rx);
    assert!(
        s.contains("client says \"done\"; my region now starts with \"written by RDMA Write, 32 bytes!\""),
        "{s}"
    );
}

#[test]
fn echo_server_and_client() {
    let (server, addr, rx) = start_server("echo", &["--once"]);
    let out = run(Command::new(example("echo")).args(["client", &addr, "hello", "rdma", "world"]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["echo: hello", "echo: rdma", "echo: world"]
    );
    let s = finish(server, rx);
    assert!(s.contains("3 messages echoed, connection closed"), "{s}");
}

#[test]
fn async_under_tokio() {
    let out = run(&mut Command::new(example("async_tokio")));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("server: received \"ping\"") && stdout.contains("client: received \"pong\""),
        "{stdout}"
    );
}

#[test]
fn rpc_over_rdma_client_and_server() {
    // NULL and two UPPER calls: three replies, after which the server prints its counters.
    let (server, addr, rx) = start_server("rpc_rdma", &["--replies", "3"]);
    let out = run(Command::new(example("rpc_rdma")).args(["client", &addr]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("NULL answered"), "{stdout}");
    assert!(stdout.contains("UPPER: HELLO, RPC OVER RDMA"), "{stdout}");
    assert!(stdout.contains("UPPER of 262144 bytes: matches"), "{stdout}");
    let s = finish(server, rx);
    // The long text went by RDMA Read (a Read chunk) and came back by RDMA
    // Write (a Write chunk); the transport chose, not the program.
    assert!(
        s.contains("3 replies; calls: 2 short, 1 with Read chunks, 0 long; replies through Write chunks: 1"),
        "{s}"
    );
}
