//! Accepting a connection: the connect request checked against the limits, the private
//! data negotiated, the QP and its buffers made, the connection handed to a worker.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::reply::Replier;
use super::{AcceptCtx, Conn, Fatal, SEND_SLOTS, WorkerHandle};
use crate::private_data::{PrivateData, Side, negotiate};
use crate::transport::backchannel::{self, BC_CREDITS};
use crate::transport::wrid;
use crate::validate::ResponderPolicy;
use crate::wire::Limits;
use verbs::{Access, ConnectRequest, ProtectionDomain, QpOptions, RecvWr};

/// Accept `req` with a QP on `cq` (the worker's), receives posted first.
pub(super) fn accept_conn(
    req: ConnectRequest,
    pd: &ProtectionDomain,
    home: &Arc<WorkerHandle>,
    ctx: &AcceptCtx,
) -> Result<Conn, Fatal> {
    let cq = &home.cq;
    let cfg = &ctx.cfg;
    let e = Fatal::from;
    let credits = cfg.credits.max(1);
    let peer_addr = req.peer_addr();
    let peer = PrivateData::find(req.private_data());
    let local = PrivateData::new(cfg.inline_send, cfg.inline_recv, cfg.remote_invalidation)?;
    let mine = if cfg.private_data {
        local
    } else {
        PrivateData::default()
    };
    let neg = negotiate(Side::Server, &mine, peer.as_ref());
    // RPCR-CRD-04: the receives for the largest grant are posted before the
    // connection goes live (rdma_cm order: create_qp, post_recv, accept)
    let recv_size = mine.recv_size as usize;
    // RFC 8167 §4.3.2: BC_CREDITS more for reverse-direction Replies
    let slots = credits + BC_CREDITS;
    let recv_mr = pd.reg_mr(recv_size * slots as usize, Access::LOCAL_WRITE).map_err(e)?;
    let recvs: Vec<RecvWr> = (0..slots as usize)
        .map(|i| RecvWr {
            wr_id: wrid::RECV | i as u64,
            sg_list: vec![recv_mr.sge(i * recv_size, recv_size as u32)],
        })
        .collect();
    let mut opts = QpOptions::new(cq)
        .rd_atomic(cfg.rd_atomic, cfg.rd_atomic)
        .post_recv(recvs);
    opts.attr.max_recv_wr = opts.attr.max_recv_wr.max(slots);
    if cfg.private_data {
        opts = opts.private_data(&local.encode());
    }
    let qp = Arc::new(req.accept(pd, opts).map_err(e)?);
    let bc = backchannel::Shared::new(qp.clone(), pd.clone(), neg.thresholds);
    ctx.conns.lock().unwrap().push(Arc::downgrade(&bc));
    ctx.stats.connections.fetch_add(1, Ordering::Relaxed);
    let slot_len = neg.thresholds.reply.max(1024) as usize;
    let slots = SEND_SLOTS.min(credits as usize);
    let send_mr = pd.reg_mr(slot_len * slots, Access::LOCAL_WRITE).map_err(e)?;
    let serial = ctx.recovery.serials.fetch_add(1, Ordering::Relaxed);
    let rep = Arc::new(Replier::new(
        qp.clone(),
        pd.clone(),
        neg.thresholds,
        neg.remote_invalidation,
        credits,
        send_mr,
        slot_len,
        slots,
        cfg.timeout,
        ctx.budget.clone(),
        ctx.stats.clone(),
        ctx.recovery.clone(),
        serial,
    ));
    Ok(Conn {
        qpn: qp.qp_num(),
        qp,
        peer: peer_addr,
        bc,
        pd: pd.clone(),
        rep,
        recv_mr,
        recv_size,
        overrun: false,
        policy: ResponderPolicy {
            limits: Limits::default(),
            // RPCR-SEC-05: no chunk larger than the whole Call may be
            max_chunk: cfg.max_chunk.min(cfg.max_call),
        },
        registry: ctx.registry.clone(),
        pool: ctx.pool.clone(),
        home: Arc::downgrade(home),
        in_pool: 0,
        pool_key: crate::pool::fresh_client_key(),
        recovery: ctx.recovery.clone(),
        backlog: VecDeque::new(),
        serial,
        stage: None,
        spare: Vec::new(),
        budget: ctx.budget.clone(),
        max_call: cfg.max_call,
        max_reply: cfg.max_reply,
        pulling: None,
        settling: None,
        timeout: cfg.timeout,
        last_active: Instant::now(),
        idle_closed: false,
        stopping: false,
        failed_status: None,
        failed: None,
        stats: ctx.stats.clone(),
    })
}
