//! The async API under tokio: connect requests, completions and connection
//! events as futures.
//!
//! ```sh
//! cargo run --release -p softrdma --example async_tokio
//! ```
//!
//! One process, one tokio runtime: a server task accepts a connection and
//! answers a ping with a pong; the client task connects, sends the ping and
//! awaits both completions. The verbs futures (`Listener::get_request_async`,
//! `CompletionQueue::next_async`, `QueuePair::next_event_async`) are
//! runtime-agnostic: they only register wakers, so tokio, async-std or a
//! hand-written executor all drive them, and no runtime thread blocks while
//! they wait.
//!
//! The connection calls themselves (`QueuePair::connect`, `accept_qp`) are
//! short blocking handshakes; under tokio they belong on
//! `spawn_blocking`, as below (`ProtectionDomain::connect_async` is the
//! runtime-agnostic shortcut that creates, connects and runs the handshake on
//! a helper thread of its own).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use verbs::*;

const T: Duration = Duration::from_secs(10);

/// An RC QP in INIT (created in RESET, then moved), ready for receives.
fn rc_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> Result<QueuePair> {
    let qp = pd.create_qp(QpInit::new(QpType::Rc, cq))?;
    qp.modify_qp(&QpAttr::init(1, 0, Access::LOCAL_WRITE))?;
    Ok(qp)
}

/// Errors of this example: the verbs' own, or a failed completion.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn server(listener: Listener, pd: ProtectionDomain) -> Result<(), BoxError> {
    let cq = pd.device().create_cq(16)?;
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE)?;
    // Waiting for a client costs no thread: the future sleeps until the
    // provider's listener pushes a request.
    let req = listener.get_request_async().await?;
    let qp = rc_qp(&pd, &cq)?;
    qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: vec![mr.sge(0, 64)],
    }])?;
    let qp = tokio::task::spawn_blocking(move || req.accept_qp(&qp, &ConnParam::default()).map(|()| qp))
        .await
        .expect("accept task")?;
    let wc = cq.next_async().await;
    println!(
        "server: received {:?}",
        String::from_utf8_lossy(&mr.to_vec(0, wc.byte_len as usize)?)
    );
    mr.write(1024, b"pong")?;
    qp.post_send_one(SendWr::new(2, WrOpcode::Send, vec![mr.sge(1024, 4)]))?;
    let wc = cq.next_async().await;
    if wc.status != WcStatus::Success {
        return Err(format!("the pong's Send: {}", wc.status).into());
    }
    // Wait for the client to hang up.
    while let Some(ev) = qp.next_event_async().await {
        if ev == CmEvent::Disconnected {
            break;
        }
    }
    Ok(())
}

async fn client(addr: SocketAddr, pd: ProtectionDomain) -> Result<String> {
    let cq = pd.device().create_cq(16)?;
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE)?;
    let qp = rc_qp(&pd, &cq)?;
    // The pong's receive is posted before connecting: the server may answer at once.
    qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: vec![mr.sge(0, 64)],
    }])?;
    let qp = tokio::task::spawn_blocking(move || qp.connect(addr, &ConnParam::default(), T).map(|()| qp))
        .await
        .expect("connect task")?;
    mr.write(1024, b"ping")?;
    qp.post_send_one(SendWr::new(2, WrOpcode::Send, vec![mr.sge(1024, 4)]))?;
    let mut reply = String::new();
    // Two completions, in either order: our Send and the pong's receive.
    for _ in 0..2 {
        let wc = cq.next_async().await;
        if wc.opcode == WcOpcode::Recv {
            reply = String::from_utf8_lossy(&mr.to_vec(0, wc.byte_len as usize)?).into_owned();
        }
    }
    qp.disconnect();
    Ok(reply)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    // A device by name from the providers this program links (see write_read.rs).
    let dev = Registry::new()
        .with(Arc::new(iwarp::IwarpFactory))
        .open("siw_soft0", &DeviceOptions::new())?;
    let pd = dev.alloc_pd()?;
    let listener = dev.listen("127.0.0.1:0".parse().unwrap())?;
    let addr = listener.local_addr();
    let srv = tokio::spawn(server(listener, pd.clone()));
    // Every wait of an RDMA program needs a bound; tokio's timeout gives it.
    let reply = tokio::time::timeout(T, client(addr, pd))
        .await
        .map_err(|_| Error::Timeout)??;
    println!("client: received {reply:?}");
    tokio::time::timeout(T, srv)
        .await
        .map_err(|_| Error::Timeout)?
        .expect("server task")?;
    Ok(())
}
