//! RDMA Write and Read between two processes, with the rkey exchange.
//!
//! ```sh
//! cargo run --release -p softrdma --example write_read -- server 127.0.0.1:7471
//! cargo run --release -p softrdma --example write_read -- client 127.0.0.1:7471
//! ```
//!
//! The server registers a region with remote read and write rights and tells
//! the client where it is in the private data of its accept (the usual place
//! on rdma_cm: address, rkey and length, 16 octets, big-endian). The client
//! writes into that region with an RDMA Write, reads it back with an RDMA Read,
//! checks the bytes, and tells the server with a Send that it is done; the
//! server then prints what landed in its memory. No receive is consumed on the
//! server by the Write or the Read: one-sided operations touch only memory.
//!
//! Both sides follow rdma_cm's order: create the QP (RESET), move it to INIT,
//! post receives, then bind it to a connection with `QueuePair::connect`
//! (`rdma_connect`) or `ConnectRequest::accept_qp` (`rdma_accept`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use verbs::*;

const T: Duration = Duration::from_secs(10);
const LEN: usize = 64 * 1024;

/// Where a peer may write: what the server puts in its accept's private data.
struct RemoteRegion {
    addr: u64,
    rkey: u32,
    len: u32,
}

impl RemoteRegion {
    fn encode(&self) -> Vec<u8> {
        let mut v = self.addr.to_be_bytes().to_vec();
        v.extend(self.rkey.to_be_bytes());
        v.extend(self.len.to_be_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<RemoteRegion> {
        Some(RemoteRegion {
            addr: u64::from_be_bytes(b.get(0..8)?.try_into().ok()?),
            rkey: u32::from_be_bytes(b.get(8..12)?.try_into().ok()?),
            len: u32::from_be_bytes(b.get(12..16)?.try_into().ok()?),
        })
    }
}

/// The device's name, as `softrdma devices` (or `Registry::list`) shows it.
const DEVICE: &str = "siw_soft0";

/// How a program gets a device: it registers the providers it links in a
/// [`Registry`] (here only iWARP; a build with RoCEv2 adds its factory) and
/// opens one by name, as `ibv_get_device_list` + `ibv_open_device` do. Only
/// this function names a provider crate; everything below is provider-neutral.
fn open_device() -> Result<Device> {
    let registry = Registry::new().with(Arc::new(iwarp::IwarpFactory));
    registry.open(DEVICE, &DeviceOptions::new())
}

/// The rights a QP grants once in INIT (`qp_access_flags`). Each remote access
/// is still checked against the rights of the region it names.
const QP_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// Creates an RC queue pair (it starts in RESET, `ibv_create_qp`) and moves it
/// to INIT, from where receives may be posted (`rdma_create_qp` does the same).
fn rc_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> Result<QueuePair> {
    let qp = pd.create_qp(QpInit::new(QpType::Rc, cq))?;
    qp.modify_qp(&QpAttr::init(1, 0, QP_ACCESS))?;
    Ok(qp)
}

fn completion(cq: &CompletionQueue, what: &str) -> Result<WorkCompletion, String> {
    let wc = cq.wait(Some(T)).ok_or(format!("no completion for {what}"))?;
    if wc.status != WcStatus::Success {
        return Err(format!("{what}: {}", wc.status));
    }
    Ok(wc)
}

fn server(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let dev = open_device()?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    // The region the client may write and read: remote rights must be asked for
    // when registering (and REMOTE_WRITE needs LOCAL_WRITE, as in ibv_reg_mr).
    let mr = pd.reg_mr(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let ctl = pd.reg_mr(64, Access::LOCAL_WRITE)?;
    let listener = dev.listen(addr)?; // rdma_bind_addr + rdma_listen
    println!("listening on {}", listener.local_addr());
    let req = listener.get_request(Some(T))?; // RDMA_CM_EVENT_CONNECT_REQUEST
    // What the client needs to reach `mr`: its address (the tagged offset of
    // its first byte, not a pointer) and its rkey. They travel in the private
    // data of the accept; a ULP could as well Send them after connecting.
    let region = RemoteRegion {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: LEN as u32,
    };
    let qp = rc_qp(&pd, &cq)?;
    // The receive for the client's "done" goes on before the connection is
    // live: on iWARP a Send that finds no receive ends the connection.
    qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: vec![ctl.sge(0, 64)],
    }])?;
    let param = ConnParam {
        private_data: region.encode(),
        // IRD: how many RDMA Reads the client may have outstanding against us.
        responder_resources: 8,
        initiator_depth: 8,
    };
    req.accept_qp(&qp, &param)?; // rdma_accept: the QP is in RTS on return
    println!("accepted {}", qp.conn_info().peer_addr);
    let wc = completion(&cq, "the client's Send")?;
    println!(
        "client says {:?}; my region now starts with {:?}",
        String::from_utf8_lossy(&ctl.to_vec(0, wc.byte_len as usize)?),
        String::from_utf8_lossy(&mr.to_vec(0, 32)?)
    );
    Ok(())
}

fn client(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let dev = open_device()?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let qp = rc_qp(&pd, &cq)?;
    let param = ConnParam {
        private_data: Vec::new(),
        responder_resources: 8,
        // ORD: how many RDMA Reads we issue at once.
        initiator_depth: 8,
    };
    qp.connect(addr, &param, T)?; // rdma_connect: established (RTS) or an error
    // The server's accept carried the region's address and rkey.
    let remote = RemoteRegion::decode(&qp.conn_info().peer_private_data).ok_or("short private data")?;
    println!(
        "server region: addr {:#x} rkey {:#010x} {} bytes",
        remote.addr, remote.rkey, remote.len
    );

    let local = pd.reg_mr(2 * 4096, Access::LOCAL_WRITE)?;
    let msg = b"written by RDMA Write, 32 bytes!";
    local.write(0, msg)?;
    let at = RemoteAddr {
        addr: remote.addr,
        rkey: remote.rkey,
    };
    qp.post_send_one(SendWr::new(
        1,
        WrOpcode::RdmaWrite { remote: at },
        vec![local.sge(0, 32)],
    ))?;
    completion(&cq, "RDMA Write")?;
    // Read the same bytes back into the second page. A Read is answered only
    // after the Write before it was placed (RFC 5040 §5.5), so this also
    // confirms the Write landed.
    qp.post_send_one(SendWr::new(
        2,
        WrOpcode::RdmaRead { remote: at },
        vec![local.sge(4096, 32)],
    ))?;
    let wc = completion(&cq, "RDMA Read")?;
    let back = local.to_vec(4096, wc.byte_len as usize)?;
    if back != local.to_vec(0, 32)? {
        return Err(format!("read back {back:?}").into());
    }
    println!("read back {:?}: matches", String::from_utf8_lossy(&back));
    local.write(0, b"done")?;
    qp.post_send_one(SendWr::new(3, WrOpcode::Send, vec![local.sge(0, 4)]))?;
    completion(&cq, "Send")?;
    qp.disconnect(); // rdma_disconnect
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, addr) = match args.as_slice() {
        [r, a] => (r.as_str(), a.parse()?),
        _ => return Err("usage: write_read server|client ADDR:PORT".into()),
    };
    match role {
        "server" => server(addr),
        "client" => client(addr),
        other => Err(format!("unknown role {other:?}").into()),
    }
}
