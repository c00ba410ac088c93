//! A Send/Recv echo server and its client.
//!
//! ```sh
//! cargo run --release -p softrdma --example echo -- server 127.0.0.1:7472
//! cargo run --release -p softrdma --example echo -- client 127.0.0.1:7472 hello world
//! ```
//!
//! The server serves clients one after another (`--once`: just one) and sends
//! every message it receives back. Receives are posted before the connection
//! goes live and reposted after each message, as two-sided RDMA requires: on
//! iWARP a Send that finds no posted receive ends the connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use verbs::*;

const T: Duration = Duration::from_secs(10);
const MSG: u32 = 4096;
const DEPTH: u64 = 16;

/// The device's name, as `softrdma devices` (or `Registry::list`) shows it.
const DEVICE: &str = "siw_soft0";

/// Registers the providers this program links and opens a device by name
/// (`ibv_get_device_list` + `ibv_open_device`); only here is a provider named.
fn open_device() -> Result<Device> {
    let registry = Registry::new().with(Arc::new(iwarp::IwarpFactory));
    registry.open(DEVICE, &DeviceOptions::new())
}

/// An RC queue pair moved from RESET to INIT, ready for receives
/// (`ibv_create_qp` + the RESET -> INIT step `rdma_create_qp` does). Two-sided
/// traffic needs only local rights.
fn rc_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> Result<QueuePair> {
    let qp = pd.create_qp(QpInit::new(QpType::Rc, cq))?;
    qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE))?;
    Ok(qp)
}

/// Receive buffer `i` of `DEPTH`, each `MSG` bytes.
fn recv(mr: &MemoryRegion, i: u64) -> RecvWr {
    RecvWr {
        wr_id: i,
        sg_list: vec![mr.sge((i * MSG as u64) as usize, MSG)],
    }
}

fn serve_one(pd: &ProtectionDomain, req: ConnectRequest) -> Result<u64, Box<dyn std::error::Error>> {
    let cq = pd.device().create_cq(2 * DEPTH as usize)?;
    let rx = pd.reg_mr((DEPTH * MSG as u64) as usize, Access::LOCAL_WRITE)?;
    let tx = pd.reg_mr(MSG as usize, Access::LOCAL_WRITE)?;
    let qp = rc_qp(pd, &cq)?;
    // Every receive buffer is posted before accepting: the client may Send at once.
    qp.post_recv(&(0..DEPTH).map(|i| recv(&rx, i)).collect::<Vec<_>>())?;
    req.accept_qp(&qp, &ConnParam::default())?;
    let peer = qp.conn_info().peer_addr;
    let mut echoed = 0;
    loop {
        let Some(wc) = cq.wait(None) else { continue };
        match (wc.opcode, wc.status) {
            (WcOpcode::Recv, WcStatus::Success) => {
                let n = wc.byte_len as usize;
                let data = rx.to_vec((wc.wr_id * MSG as u64) as usize, n)?;
                qp.post_recv(&[recv(&rx, wc.wr_id)])?;
                tx.write(0, &data)?;
                qp.post_send_one(SendWr::new(u64::MAX, WrOpcode::Send, vec![tx.sge(0, n as u32)]))?;
                echoed += 1;
            }
            (WcOpcode::Send, WcStatus::Success) => {}
            // The client went away: its receives are flushed.
            (_, WcStatus::WrFlushErr) => break,
            (op, st) => return Err(format!("{peer}: {op:?} failed: {st}").into()),
        }
        if qp.state() == QpState::Err {
            break;
        }
    }
    println!("{peer}: {echoed} messages echoed, connection closed");
    Ok(echoed)
}

fn server(addr: SocketAddr, once: bool) -> Result<(), Box<dyn std::error::Error>> {
    let dev = open_device()?;
    let pd = dev.alloc_pd()?;
    let listener = dev.listen(addr)?;
    println!("listening on {}", listener.local_addr());
    loop {
        let req = match listener.get_request(None) {
            Ok(r) => r,
            Err(Error::Timeout) => continue,
            Err(e) => return Err(e.into()),
        };
        serve_one(&pd, req)?;
        if once {
            return Ok(());
        }
    }
}

fn client(addr: SocketAddr, words: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let dev = open_device()?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let rx = pd.reg_mr(MSG as usize, Access::LOCAL_WRITE)?;
    let tx = pd.reg_mr(MSG as usize, Access::LOCAL_WRITE)?;
    let qp = rc_qp(&pd, &cq)?;
    qp.connect(addr, &ConnParam::default(), T)?;
    for w in words {
        qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: vec![rx.sge(0, MSG)],
        }])?;
        tx.write(0, w.as_bytes())?;
        qp.post_send_one(SendWr::new(2, WrOpcode::Send, vec![tx.sge(0, w.len() as u32)]))?;
        // Two completions: our Send and the echo's receive, in either order.
        let mut echo = None;
        for _ in 0..2 {
            let wc = cq.wait(Some(T)).ok_or("no completion")?;
            if wc.status != WcStatus::Success {
                return Err(format!("{:?}: {}", wc.opcode, wc.status).into());
            }
            if wc.opcode == WcOpcode::Recv {
                echo = Some(rx.to_vec(0, wc.byte_len as usize)?);
            }
        }
        let echo = String::from_utf8(echo.ok_or("no echo")?)?;
        if &echo != w {
            return Err(format!("sent {w:?}, echoed {echo:?}").into());
        }
        println!("echo: {echo}");
    }
    qp.disconnect();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [r, a, rest @ ..] if r == "server" => server(a.parse()?, rest.iter().any(|x| x == "--once")),
        [r, a, words @ ..] if r == "client" => client(a.parse()?, words),
        _ => Err("usage: echo server ADDR:PORT [--once] | echo client ADDR:PORT WORD...".into()),
    }
}
