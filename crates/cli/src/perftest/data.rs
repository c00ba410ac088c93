//! The data connection and what the tests share on it: its resources and the connect /
//! listen steps (`ctx_init`, `rdma_cm_{client,server}_connection`), the receives posted and
//! reposted, and the softrdma-only payload pattern.

use anyhow::{Context, Result, anyhow, bail};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use verbs::*;

use super::completion::ok;
use super::wire::PingpongDest;
use super::{Data, Params, Role, Test, Verb};

/// A 24-bit PSN, as `lrand48() & 0xffffff` (iWARP does not use it).
pub(super) fn psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(1);
    (t.wrapping_mul(2_654_435_761) ^ std::process::id()) & 0xff_ffff
}

/// The payload pattern checked between two softrdma ends.
pub(super) fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(7) % 251) as u8)
        .collect()
}

/// Between two softrdma ends: the target half holds the pattern (`what` names it in the
/// error); notes the check in `verified`.
pub(super) fn check_pattern(d: &Data, p: &Params, what: &str, verified: &mut String) -> Result<()> {
    let got =
        d.mr.to_vec(p.half + p.grh(), p.size as usize)
            .map_err(|_| anyhow!("data region"))?;
    if got != pattern(p.size as usize) {
        bail!("payload check failed: {what} does not hold the pattern");
    }
    verified.push_str(", payload pattern checked");
    Ok(())
}

/// Where the peer's `pingpong_dest` says its buffer is.
pub(super) fn remote_of(rem: &PingpongDest) -> RemoteAddr {
    RemoteAddr {
        addr: rem.vaddr,
        rkey: rem.rkey,
    }
}

/// Retries a refused connect, as perftest's client does while the server is not listening
/// yet (`rdma_cm_client_connection`: 10 tries 100 ms apart; here until `step` runs out).
pub(super) fn connect_retry(
    pd: &ProtectionDomain,
    addr: SocketAddr,
    opts: &QpOptions,
    step: Duration,
) -> Result<QueuePair> {
    retry_refused(
        step,
        |t| pd.connect(addr, opts.clone(), t),
        || {
            format!(
                "no perftest server at {addr}: still refused after {} s of retries",
                step.as_secs()
            )
        },
        || format!("connecting to {addr}"),
    )
}

/// Runs `attempt` (given the time one try may take) until it is neither refused nor rejected
/// (the server not listening yet), 100 ms apart, for at most `step`: the retry loop of
/// perftest's `rdma_cm_client_connection`, for an RC connect and a UD resolution alike.
/// `gave_up` and `failed` name the two ways it ends in an error.
pub(super) fn retry_refused<T>(
    step: Duration,
    mut attempt: impl FnMut(Duration) -> verbs::Result<T>,
    gave_up: impl Fn() -> String,
    failed: impl Fn() -> String,
) -> Result<T> {
    let deadline = Instant::now() + step;
    loop {
        match attempt(step.min(Duration::from_secs(10))) {
            Ok(v) => return Ok(v),
            Err(e @ (Error::ConnectionRefused | Error::Rejected { .. })) => {
                if Instant::now() >= deadline {
                    return Err(anyhow!(e).context(gave_up()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(anyhow!(e).context(failed())),
        }
    }
}

/// The data QP's completion queues and capacities (`ctx_init` / `create_qp_main`), the same
/// for an RC and a UD data QP.
pub(super) fn data_resources(dev: &Device, p: &Params) -> Result<(CompletionQueue, CompletionQueue, QpInitAttr)> {
    let send_cq = dev.create_cq((p.tx_depth as usize + 16).max(64))?;
    let recv_cq = dev.create_cq((p.rx_depth as usize + 16).max(64))?;
    let cap = QpInitAttr {
        max_send_wr: p.tx_depth + 4,
        max_recv_wr: p.rx_depth + 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpInitAttr::default()
    };
    Ok((send_cq, recv_cq, cap))
}

/// The server's side of the data connection (`rdma_cm_server_connection`): listens anew on the
/// comm connection's address in port space `ps`, takes one request within `step` and checks
/// that it comes from the comm connection's peer. `what` names the request in errors. The
/// caller accepts it and then drops the listener.
pub(super) fn data_request(
    dev: &Device,
    addr: SocketAddr,
    ps: PortSpace,
    peer: SocketAddr,
    step: Duration,
    what: &str,
) -> Result<(Listener, ConnectRequest)> {
    let l = dev
        .listen_in(addr, ps)
        .with_context(|| format!("listening on {addr} ({ps:?} port space) for {what}"))?;
    let req = l
        .get_request(Some(step))
        .with_context(|| format!("waiting for {what} (rdma_cm_server_connection)"))?;
    if req.peer_addr().ip() != peer.ip() {
        bail!(
            "{what} from {}, but the comm connection came from {peer}",
            req.peer_addr()
        );
    }
    Ok((l, req))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn data_connection(
    dev: &Device,
    pd: &ProtectionDomain,
    p: &Params,
    role: Role,
    listen_on: Option<SocketAddr>,
    peer: SocketAddr,
    step: Duration,
    softrdma_peer: bool,
) -> Result<Data> {
    let (send_cq, recv_cq, cap) = data_resources(dev, p)?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.reg_mr(2 * p.half, access)?;
    let credit = if p.test == Test::SendBw && p.iwarp {
        Some(pd.reg_mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?)
    } else {
        None
    };
    // perftest: IRD = ORD = out_reads for Read tests, 0 otherwise. Between two softrdma ends
    // write_bw reads its target back once, which needs one Read.
    let rd = if p.test.verb() == Verb::Read {
        p.out_reads.min(255) as u8
    } else if softrdma_peer && p.test == Test::WriteBw {
        1
    } else {
        0
    };
    let mut opts = QpOptions::new(&send_cq).rd_atomic(rd, rd).attr(cap);
    opts.recv_cq = recv_cq.clone();
    let qp = match role {
        Role::Client(addr) => {
            connect_retry(pd, addr, &opts, step).context("data connection (rdma_cm_client_connection)")?
        }
        Role::Server(_) => {
            let addr = listen_on.expect("server has listened");
            let (_l, req) = data_request(dev, addr, PortSpace::Tcp, peer, step, "the data connection")?;
            req.accept(pd, opts).context("accepting the data connection")?
        }
    };
    Ok(Data {
        qp,
        send_cq,
        recv_cq,
        mr,
        credit,
        ud: None,
    })
}

/// Receives of `size` bytes (UD: 40 more for the GRH) into the target half
/// (`ctx_set_recv_wqes`); returns how many.
pub(super) fn post_recvs(d: &Data, p: &Params, n: u64) -> Result<u64> {
    let wrs: Vec<RecvWr> = (0..n)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: vec![d.mr.sge(p.half, (p.size as usize + p.grh()) as u32)],
        })
        .collect();
    d.qp.post_recv(&wrs).context("posting receives")?;
    Ok(n)
}

/// A receive of a send test completed: successfully, with `size` bytes (the `rcnt`-th);
/// reposted while fewer than iters are posted (`rposted`).
pub(super) fn recv_done(d: &Data, p: &Params, wc: &WorkCompletion, rcnt: &mut u64, rposted: &mut u64) -> Result<()> {
    ok(wc, WcOpcode::Recv, "receive")?;
    // UD: the byte count includes the 40-octet GRH area (ibv_wc.byte_len).
    if wc.byte_len as u64 != p.size + p.grh() as u64 {
        bail!(
            "receive {} has {} bytes, expected {}{}",
            *rcnt + 1,
            wc.byte_len,
            p.size,
            if p.ud { " + 40 of GRH" } else { "" }
        );
    }
    *rcnt += 1;
    if *rposted < p.iters {
        post_recvs(d, p, 1)?;
        *rposted += 1;
    }
    Ok(())
}
