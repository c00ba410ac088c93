//! `softrdma udaddy` and `softrdma mckey` against themselves on loopback (issue 14): SIDR over QP1 resolves the
//! server's UD QP (rdma_cm's UDP port space), then datagrams with immediate data both ways;
//! the server replies to the GRH's source and the immediate's QPN (`ibv_create_ah_from_wc`).
//! Two processes, two RoCE devices on unique 127.93.x addresses. Requirement IDs:
//! `../shared/requirements/smcr-ipoibcm.md` C1 (SIDR), C2 (UD), D3.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

/// How long a server or receiver gets to listen before its peer starts: the client's
/// SIDR_REQ is retried only every ~4.3 s (rdma_cm's timers), so this keeps the runs short.
const LISTEN: Duration = Duration::from_millis(300);

fn cmd(tool: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args([tool, "--provider", "roce"]).args(args);
    c
}

/// `softrdma <tool> --provider roce <args>` in the background, its output kept (or dropped
/// with `quiet`).
fn spawn(tool: &str, args: &[&str], quiet: bool) -> Child {
    let out = || if quiet { Stdio::null() } else { Stdio::piped() };
    cmd(tool, args).stdout(out()).stderr(out()).spawn().unwrap()
}

/// `softrdma <tool> --provider roce <args>` run to its end.
fn run(tool: &str, args: &[&str]) -> Output {
    cmd(tool, args).output().unwrap()
}

/// What a finished process wrote: stdout, then stderr.
fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run_pair(net: u8, count: &str, size: &str) -> (String, String) {
    let srv_ip = format!("127.93.{net}.1");
    let cli_ip = format!("127.93.{net}.2");
    let common = ["--port", "7174", "-C", count, "-S", size, "--timeout", "10"];
    let server = spawn("udaddy", &[&["-b", srv_ip.as_str()][..], &common].concat(), false);
    std::thread::sleep(LISTEN);
    let client = run(
        "udaddy",
        &[&["-s", srv_ip.as_str(), "-b", cli_ip.as_str()][..], &common].concat(),
    );
    let server = server.wait_with_output().unwrap();
    let (c, s) = (text(&client), text(&server));
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
    let mut dev = spawn("udaddy", &["-b", srv_ip, "--port", "7175", "--timeout", "3"], true);
    std::thread::sleep(LISTEN);
    let out = run("udaddy", &["-s", srv_ip, "-b", "127.93.3.2", "--timeout", "3"]);
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
    let group = ["-m", "239.93.4.1"];
    let rx = spawn(
        "mckey",
        &[&group[..], &["-b", "127.93.4.1", "--timeout", "10"]].concat(),
        false,
    );
    std::thread::sleep(LISTEN);
    let tx = run(
        "mckey",
        &[&group[..], &["-b", "127.93.4.2", "-s", "--delay-ms", "200"]].concat(),
    );
    let rx = rx.wait_with_output().unwrap();
    let (r, t) = (text(&rx), text(&tx));
    assert!(tx.status.success(), "sender:\n{t}");
    assert!(rx.status.success(), "receiver:\n{r}\nsender:\n{t}");
    assert!(r.contains("mckey: joined dgid: ::ffff:239.93.4.1"), "{r}");
    assert!(r.lines().any(|l| l == "data transfers complete"), "{r}");
}
