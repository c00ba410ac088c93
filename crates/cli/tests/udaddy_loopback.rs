//! `softrdma udaddy` and `softrdma mckey` against themselves on loopback (issue 14): SIDR over QP1 resolves the
//! server's UD QP (rdma_cm's UDP port space), then datagrams with immediate data both ways;
//! the server replies to the GRH's source and the immediate's QPN (`ibv_create_ah_from_wc`).
//! Two processes, two RoCE devices on unique 127.93.x addresses. Requirement IDs:
//! `../shared/requirements/smcr-ipoibcm.md` C1 (SIDR), C2 (UD), D3.

use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

fn run_pair(net: u8, count: &str, size: &str) -> (String, String) {
    let srv_ip = format!("127.93.{net}.1");
    let cli_ip = format!("127.93.{net}.2");
    let server = Command::new(BIN)
        .args([
            "udaddy",
            "--provider",
            "roce",
            "-b",
            &srv_ip,
            "--port",
            "7174",
            "-C",
            count,
            "-S",
            size,
        ])
        .args(["--timeout", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The client's SIDR_REQ is retried (every ~4.3 s with rdma_cm's timers): give the server
    // a moment to listen so the run stays short.
    std::thread::sleep(Duration::from_millis(300));
    let client = Command::new(BIN)
        .args([
            "udaddy",
            "--provider",
            "roce",
            "-s",
            &srv_ip,
            "-b",
            &cli_ip,
            "--port",
            "7174",
        ])
        .args(["-C", count, "-S", size, "--timeout", "10"])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let c = format!(
        "{}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    let s = format!(
        "{}{}",
        String::from_utf8_lossy(&server.stdout),
        String::from_utf8_lossy(&server.stderr)
    );
    assert!(client.status.success(), "client:\n{c}\nserver:\n{s}");
    assert!(server.status.success(), "server:\n{s}\nclient:\n{c}");
    (c, s)
}

#[test]
fn udaddy_against_itself_default_and_mtu_sized() {
    let (c, s) = run_pair(1, "10", "100");
    for l in [
        "udaddy: connecting",
        "initiating data transfers",
        "data transfers complete",
        "return status 0",
    ] {
        assert!(c.lines().any(|x| x == l), "client: no {l:?}\n{c}");
    }
    for l in [
        "receiving data transfers",
        "sending replies",
        "data transfers complete",
        "return status 0",
    ] {
        assert!(s.lines().any(|x| x == l), "server: no {l:?}\n{s}");
    }
    // 1024 octets: the RoCE device's default path MTU.
    run_pair(2, "50", "1024");
}

#[test]
fn udaddy_client_without_server_is_refused() {
    // Nobody listens in RDMA_PS_UDP on port 7174 there: the device's CM answers the
    // SIDR_REQ with status 1 (service ID not supported), librdmacm's UNREACHABLE.
    let srv_ip = "127.93.3.1";
    let mut dev = Command::new(BIN)
        .args([
            "udaddy",
            "--provider",
            "roce",
            "-b",
            srv_ip,
            "--port",
            "7175",
            "--timeout",
            "3",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = Command::new(BIN)
        .args([
            "udaddy",
            "--provider",
            "roce",
            "-s",
            srv_ip,
            "-b",
            "127.93.3.2",
            "--timeout",
            "3",
        ])
        .output()
        .unwrap();
    let _ = dev.kill();
    let _ = dev.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("UNREACHABLE") && err.contains("service ID not supported"),
        "{err}"
    );
}

/// `softrdma mckey`: a receiver joined to 239.93.4.1 gets the 10 datagrams a sender joined
/// to the same group sends (rdma_cm-style join: MGID ::ffff:239.93.4.1, QPN 0xFFFFFF).
#[test]
fn mckey_sender_to_receiver() {
    let rx = Command::new(BIN)
        .args([
            "mckey",
            "--provider",
            "roce",
            "-m",
            "239.93.4.1",
            "-b",
            "127.93.4.1",
            "--timeout",
            "10",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let tx = Command::new(BIN)
        .args([
            "mckey",
            "--provider",
            "roce",
            "-m",
            "239.93.4.1",
            "-b",
            "127.93.4.2",
            "-s",
        ])
        .args(["--delay-ms", "200"])
        .output()
        .unwrap();
    let rx = rx.wait_with_output().unwrap();
    let r = format!(
        "{}{}",
        String::from_utf8_lossy(&rx.stdout),
        String::from_utf8_lossy(&rx.stderr)
    );
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&tx.stdout),
        String::from_utf8_lossy(&tx.stderr)
    );
    assert!(tx.status.success(), "sender:\n{t}");
    assert!(rx.status.success(), "receiver:\n{r}\nsender:\n{t}");
    assert!(r.contains("mckey: joined dgid: ::ffff:239.93.4.1"), "{r}");
    assert!(r.lines().any(|l| l == "data transfers complete"), "{r}");
}
