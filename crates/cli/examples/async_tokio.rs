//! The async API under tokio: accept, connect, and completions as futures.
//!
//! ```sh
//! cargo run --release -p softrdma --example async_tokio
//! ```
//!
//! One process, one tokio runtime: a server task accepts a connection and
//! answers a ping with a pong; the client task connects, sends the ping and
//! awaits both completions. The futures are runtime-agnostic (they only
//! register wakers); tokio is just the executor here. Nothing blocks a
//! runtime thread except the handshake of `connect_async`, which runs on a
//! helper thread of its own.

use std::sync::Arc;
use std::time::Duration;
use verbs::*;

const T: Duration = Duration::from_secs(10);

async fn server(listener: Listener, pd: ProtectionDomain) -> Result<()> {
    let cq = pd.device().create_cq(16)?;
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE)?;
    let req = listener.get_request_async().await?;
    let qp = req.accept(
        &pd,
        QpOptions::new(&cq).post_recv([RecvWr {
            wr_id: 1,
            sg_list: vec![mr.sge(0, 64)],
        }]),
    )?;
    let wc = cq.next_async().await;
    println!(
        "server: received {:?}",
        String::from_utf8_lossy(&mr.to_vec(0, wc.byte_len as usize)?)
    );
    mr.write(1024, b"pong")?;
    qp.post_send_one(SendWr::new(2, WrOpcode::Send, vec![mr.sge(1024, 4)]))?;
    let wc = cq.next_async().await;
    assert_eq!(wc.status, WcStatus::Success);
    // Wait for the client to hang up.
    while let Some(ev) = qp.next_event_async().await {
        if ev == CmEvent::Disconnected {
            break;
        }
    }
    Ok(())
}

async fn client(addr: std::net::SocketAddr, pd: ProtectionDomain) -> Result<String> {
    let cq = pd.device().create_cq(16)?;
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE)?;
    let opts = QpOptions::new(&cq).post_recv([RecvWr {
        wr_id: 1,
        sg_list: vec![mr.sge(0, 64)],
    }]);
    let qp = pd.connect_async(addr, opts, T).await?;
    mr.write(1024, b"ping")?;
    qp.post_send_one(SendWr::new(2, WrOpcode::Send, vec![mr.sge(1024, 4)]))?;
    let mut reply = String::new();
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
async fn main() -> Result<()> {
    let dev = Registry::new()
        .with(Arc::new(iwarp::IwarpFactory))
        .open_default(None, &DeviceOptions::new())?;
    let pd = dev.alloc_pd()?;
    let listener = dev.listen("127.0.0.1:0".parse().unwrap())?;
    let addr = listener.local_addr();
    let srv = tokio::spawn(server(listener, pd.clone()));
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
