//! `softrdma perftest send_bw|send_lat -c UD`: perftest's unreliable-datagram mode with
//! rdma_cm (`ib_send_bw -c UD -R`, `ib_send_lat -c UD -R`). Everything before and after the
//! data QP is the RC exchange of [`super`] (the comm connection is RC in rdma_cm's TCP port
//! space either way); what UD changes, from perftest 4.5-0.17's sources (Debian bookworm's
//! 6.06, the lab guest's):
//!
//! * **size ≤ MTU** (`check_mtu`): after the MTU exchange (each side states its port's active
//!   MTU, both use the smaller), a size above the MTU becomes the MTU when `-s` was not given
//!   (or with `-a`), printing "Max msg size in UD is MTU 1024 / Changing to this MTU"; with
//!   `-s` it is an error ("Max message size in UD cannot be greater than MTU"). ib_send_bw's
//!   default 65536 therefore runs as 1024 over rxe on a 1500-octet link. `-a` runs sizes 2 up
//!   to the MTU (`size_max_pow` from `MTU_SIZE(curr_mtu)`); not implemented here.
//! * **data QP in RDMA_PS_UDP** (`rdma_cm_allocate_nodes`): the client's `rdma_connect` is a
//!   SIDR_REQ without private data (here [`QueuePair::connect_ud`]), retried while refused
//!   (SIDR_REP status 1 before the server listens: `RDMA_CM_EVENT_UNREACHABLE`, 10 tries 100 ms
//!   apart); the server's `rdma_accept` is the SIDR_REP with its QPN
//!   ([`ConnectRequest::accept_ud`]). `rdma_create_qp` put the QP in RTS with Q_Key
//!   `RDMA_UDP_QKEY` (0x01234567), and the sends use the Q_Key of the SIDR_REP (client) or the
//!   QP's own (server, `ibv_query_qp`): perftest's `DEF_QKEY` 0x11111111 is only for its
//!   non-rdma_cm mode (`ctx_set_send_wqes`).
//! * **the client's QPN** (`rdma_cm_request_ud_connection_parameters`,
//!   `rdma_cm_establish_ud_connection`; only for send_lat and duplex send_bw, where the server
//!   sends): the server posts one receive of 40 + 4 octets at the start of its buffer before
//!   accepting and busy-polls for it; the client, on `RDMA_CM_EVENT_ESTABLISHED`, sends 4
//!   octets as a Send with immediate whose immediate is its QPN (big-endian on the wire); the
//!   server makes its AH with `ibv_create_ah_from_wc` from that completion and the GRH area.
//!   send_bw's server never sends and skips this.
//! * **receives** (`ctx_set_recv_wqes`): `size + 40` (`UD_ADDITION`), placed at
//!   `cache_line_size - 40` into each slot so the payload is cache-line aligned; the GRH goes
//!   first, and `byte_len` counts it. Where the receive lies is the receiver's business; here
//!   it is the target half with the GRH first.
//! * **no flow control**: over the IB transport ib_send_bw's sender only keeps tx_depth Sends
//!   outstanding; a datagram that finds no receive posted is dropped (the RC RNR NAK has no
//!   UD counterpart), and perftest's server then waits until its 60 s check_alive alarm gives
//!   up ("Did not get Message for 120 Seconds") and fails. Runs with `-n` ≤ rx_depth (512)
//!   have every receive posted before the traffic; longer ones depend on the receiver keeping
//!   up. Our server's `--timeout` bounds the wait and says how many datagrams came.
//! * **the end**: no disconnect of the UD data QP (`rdma_cm_disconnect_nodes` skips UD), the
//!   comm connection closes as for RC. The report lines are RC's, with "Connection type : UD".
//! * **duplex** (`-b`): both sides send and receive, the server learns the client's QPN as in
//!   send_lat, and each prints both directions after `xchg_bw_reports`; not implemented here
//!   (nor for RC).

use super::completion::{ok, wait_wc};
use super::data::{data_request, data_resources, retry_refused};
use super::{Data, Params, Role};
use anyhow::{Context, Result, anyhow, bail};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use verbs::*;

/// `UD_ADDITION`, `sizeof(struct ibv_grh)`: the receive buffer's first 40 octets on UD.
pub(super) const GRH_LEN: usize = 40;

/// The wr_id of the server's receive for the client's QPN (perftest uses 0 before any data
/// receive is posted; ours are numbered from 0 too, so it gets its own).
const QPN_WR: u64 = u64::MAX;

/// `check_mtu` for UD: cut a default size to the MTU, refuse a requested one above it.
pub(super) fn fit_size(p: &mut Params) -> Result<()> {
    if p.size <= u64::from(p.mtu) {
        return Ok(());
    }
    if p.size_given {
        bail!(
            "-s {}: Max message size in UD cannot be greater than MTU ({} octets, the smaller \
             of both ports' MTUs)",
            p.size,
            p.mtu
        );
    }
    eprintln!(" Max msg size in UD is MTU {}", p.mtu);
    eprintln!(" Changing to this MTU");
    p.size = u64::from(p.mtu);
    p.half = (p.size as usize).max(super::CYCLE_BUFFER as usize);
    Ok(())
}

/// The UD data QP (`create_rdma_cm_connection` in RDMA_PS_UDP): resources, SIDR, and for
/// send_lat the client's QPN datagram.
pub(super) fn data_connection(
    dev: &Device,
    pd: &ProtectionDomain,
    p: &Params,
    role: Role,
    listen_on: Option<SocketAddr>,
    peer: SocketAddr,
    step: Duration,
) -> Result<Data> {
    let (send_cq, recv_cq, cap) = data_resources(dev, p)?;
    // The source half, then the target half with room for the GRH before the payload.
    let mr = pd.reg_mr(2 * p.half + GRH_LEN, Access::LOCAL_WRITE)?;
    let qp = pd
        .create_qp(QpInit::new(QpType::Ud, &send_cq).recv_cq(&recv_cq).cap(cap))
        .context("creating the UD data QP")?;
    // rdma_create_qp on a UDP ID: RTS with RDMA_UDP_QKEY, so receives can go in first.
    qp.prepare_ud_cm().context("moving the UD data QP to RTS")?;
    // The server's QPN receive is needed wherever the server sends (send_lat; duplex bw).
    let server_sends = !p.test.bw();
    let ud = match role {
        Role::Client(addr) => {
            let param = resolve_retry(&qp, addr, step)?;
            let ah = pd
                .create_ah(&param.ah_attr)
                .context("creating the AH from the SIDR_REP (RDMA_CM_EVENT_ESTABLISHED)")?;
            let dest = UdDest {
                ah,
                remote_qpn: param.qp_num,
                remote_qkey: param.qkey,
            };
            tracing::debug!(qpn = param.qp_num, qkey = param.qkey, "UD data QP resolved");
            if server_sends {
                send_qpn(&qp, &send_cq, &mr, &dest, step)?;
            }
            Some(dest)
        }
        Role::Server(_) => {
            let addr = listen_on.expect("server has listened");
            let (l, req) = data_request(dev, addr, PortSpace::Udp, peer, step, "the UD data QP's SIDR_REQ")?;
            if server_sends {
                qp.post_recv(&[RecvWr {
                    wr_id: QPN_WR,
                    sg_list: vec![mr.sge(0, (GRH_LEN + 4) as u32)],
                }])
                .context("posting the receive for the client's QPN")?;
            }
            req.accept_ud(&qp, &[]).context("accepting the UD data QP (SIDR_REP)")?;
            drop(l);
            if server_sends {
                Some(reply_dest(pd, &qp, &recv_cq, &mr, step)?)
            } else {
                None
            }
        }
    };
    Ok(Data {
        qp,
        send_cq,
        recv_cq,
        mr,
        credit: None,
        ud,
    })
}

/// `rdma_cm_client_connection` in RDMA_PS_UDP: SIDR until the server listens (a SIDR_REP with
/// status 1 while it does not), for at most `step`.
fn resolve_retry(qp: &QueuePair, addr: SocketAddr, step: Duration) -> Result<UdParam> {
    retry_refused(
        step,
        |t| qp.connect_ud(addr, &[], t),
        || {
            format!(
                "no perftest UD server at {addr}: SIDR still refused after {} s",
                step.as_secs()
            )
        },
        || format!("resolving the UD data QP at {addr} (SIDR)"),
    )
}

/// `rdma_cm_send_ud_connection_parameters`: 4 octets, Send with immediate = our QPN.
fn send_qpn(qp: &QueuePair, send_cq: &CompletionQueue, mr: &MemoryRegion, dest: &UdDest, step: Duration) -> Result<()> {
    let qpn = qp.qp_num();
    mr.write(0, &qpn.to_le_bytes()).map_err(|_| anyhow!("data region"))?;
    let wr = SendWr::new(0, WrOpcode::SendWithImm { imm_data: qpn }, vec![mr.sge(0, 4)]).ud(dest.clone());
    qp.post_send_one(wr)
        .context("posting the Send with our QPN (rdma_cm_send_ud_connection_parameters)")?;
    let wc = wait_wc(send_cq, qp, Instant::now() + step, "the QPN Send's completion")?;
    ok(&wc, WcOpcode::Send, "Send with immediate (our QPN)")
}

/// `rdma_cm_initialize_ud_connection_parameters`: the client's QPN datagram gives the
/// address to answer (`ibv_create_ah_from_wc` with the GRH area), the immediate its QPN, and
/// the Q_Key is our QP's own.
fn reply_dest(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    recv_cq: &CompletionQueue,
    mr: &MemoryRegion,
    step: Duration,
) -> Result<UdDest> {
    let wc = wait_wc(
        recv_cq,
        qp,
        Instant::now() + step,
        "the client's QPN (a Send with immediate on the UD data QP)",
    )?;
    ok(&wc, WcOpcode::Recv, "receive of the client's QPN")?;
    if wc.wr_id != QPN_WR || (wc.byte_len as usize) < GRH_LEN {
        bail!(
            "the client's first datagram: wr_id {:#x}, {} bytes (expected the QPN receive, 40 + 4)",
            wc.wr_id,
            wc.byte_len
        );
    }
    let remote_qpn = wc
        .imm_data
        .context("the client's first datagram carries no immediate (its QPN)")?;
    let mut grh = [0u8; GRH_LEN];
    mr.read(0, &mut grh).map_err(|_| anyhow!("data region"))?;
    let ah = pd
        .create_ah_from_wc(&wc, &grh, 1)
        .context("creating the reply AH from the client's datagram (ibv_create_ah_from_wc)")?;
    tracing::debug!(remote_qpn, "UD client's QPN received");
    Ok(UdDest {
        ah,
        remote_qpn,
        remote_qkey: RDMA_UDP_QKEY,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(size: u64, size_given: bool) -> Params {
        Params {
            test: super::super::Test::SendBw,
            size,
            iters: 100,
            tx_depth: 100,
            rx_depth: 100,
            out_reads: 1,
            half: (size as usize).max(4096),
            ud: true,
            size_given,
            mtu: 1024,
            iwarp: false,
        }
    }

    /// check_mtu: a default size is cut to the MTU, a requested one above it refused.
    #[test]
    fn size_fits_the_mtu_as_check_mtu() {
        let mut p = params(65536, false);
        fit_size(&mut p).unwrap();
        assert_eq!((p.size, p.half), (1024, 4096));
        let mut p = params(2048, true);
        let e = fit_size(&mut p).unwrap_err().to_string();
        assert!(e.contains("cannot be greater than MTU"), "{e}");
        let mut p = params(1024, true);
        fit_size(&mut p).unwrap();
        assert_eq!(p.size, 1024);
    }
}
