//! The comm connection: perftest's first rdma_cm connection, on which every control
//! message (version, cycle buffer and cache line, MTU, `pingpong_dest`s, reports) is a Send,
//! client first in every exchange (`ctx_xchg_data_rdma`, `ctx_hand_shake`).

use anyhow::{Context, Result, anyhow};
use std::time::{Duration, Instant};
use verbs::*;

use super::completion::{ok, wait_wc};
use super::wire::PingpongDest;

pub(super) const COMM_SLOT: usize = 64;
pub(super) const COMM_RECVS: usize = 2;

pub(super) struct Comm {
    pub(super) qp: QueuePair,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    send_mr: MemoryRegion,
    recv_mr: MemoryRegion,
    client: bool,
    step: Duration,
    /// Messages exchanged so far (for error messages).
    count: usize,
    /// The receive slot to post again before the next receive.
    repost: Option<usize>,
}

pub(super) struct CommParts {
    pub(super) send_cq: CompletionQueue,
    pub(super) recv_cq: CompletionQueue,
    pub(super) send_mr: MemoryRegion,
    pub(super) recv_mr: MemoryRegion,
    pub(super) opts: QpOptions,
}

pub(super) fn comm_parts(dev: &Device, pd: &ProtectionDomain) -> Result<CommParts> {
    let send_cq = dev.create_cq(16)?;
    let recv_cq = dev.create_cq(16)?;
    let send_mr = pd.reg_mr(COMM_SLOT, Access::LOCAL_WRITE)?;
    let recv_mr = pd.reg_mr(COMM_SLOT * COMM_RECVS, Access::LOCAL_WRITE)?;
    let recvs: Vec<RecvWr> = (0..COMM_RECVS)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sg_list: vec![recv_mr.sge(i * COMM_SLOT, COMM_SLOT as u32)],
        })
        .collect();
    let mut opts = QpOptions::new(&send_cq).post_recv(recvs).attr(QpInitAttr {
        max_send_wr: 4,
        max_recv_wr: COMM_RECVS as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpInitAttr::default()
    });
    opts.recv_cq = recv_cq.clone();
    Ok(CommParts {
        send_cq,
        recv_cq,
        send_mr,
        recv_mr,
        opts,
    })
}

impl Comm {
    pub(super) fn new(qp: QueuePair, parts: CommParts, client: bool, step: Duration) -> Comm {
        Comm {
            qp,
            send_cq: parts.send_cq,
            recv_cq: parts.recv_cq,
            send_mr: parts.send_mr,
            recv_mr: parts.recv_mr,
            client,
            step,
            count: 0,
            repost: None,
        }
    }

    pub(super) fn send(&mut self, data: &[u8], what: &str) -> Result<()> {
        self.send_mr
            .write(0, data)
            .map_err(|_| anyhow!("comm message too long"))?;
        self.qp
            .post_send_one(SendWr::new(
                0,
                WrOpcode::Send,
                vec![self.send_mr.sge(0, data.len() as u32)],
            ))
            .with_context(|| format!("posting the {what} Send"))?;
        let wc = wait_wc(
            &self.send_cq,
            &self.qp,
            Instant::now() + self.step,
            &format!("the {what} Send's completion"),
        )?;
        ok(&wc, WcOpcode::Send, &format!("comm Send ({what})"))
    }

    pub(super) fn recv(&mut self, what: &str) -> Result<Vec<u8>> {
        // The slot of the previous message goes back now, not right after it came in: the peer
        // may disconnect right after its last message, and the other slot is still posted for
        // the one message the peer can send before it hears from us.
        // After the peer's last message its disconnect may already have moved the QP to the
        // error state; the message we wait for is then in the CQ, or the wait reports the
        // disconnect.
        if let Some(slot) = self.repost.take()
            && let Err(e) = self.qp.post_recv(&[RecvWr {
                wr_id: slot as u64,
                sg_list: vec![self.recv_mr.sge(slot * COMM_SLOT, COMM_SLOT as u32)],
            }])
        {
            tracing::debug!("comm receive not reposted: {e}");
        }
        let wc = wait_wc(
            &self.recv_cq,
            &self.qp,
            Instant::now() + self.step,
            &format!("the peer's {what} message (comm message {})", self.count + 1),
        )?;
        ok(&wc, WcOpcode::Recv, &format!("comm receive ({what})"))?;
        let slot = wc.wr_id as usize;
        let data = self
            .recv_mr
            .to_vec(slot * COMM_SLOT, wc.byte_len as usize)
            .map_err(|_| anyhow!("comm receive of {} bytes", wc.byte_len))?;
        self.repost = Some(slot);
        Ok(data)
    }

    /// `ctx_xchg_data_rdma`: the client sends first, the server answers.
    pub(super) fn xchg(&mut self, mine: &[u8], what: &str) -> Result<Vec<u8>> {
        let theirs = if self.client {
            self.send(mine, what)?;
            self.recv(what)?
        } else {
            let t = self.recv(what)?;
            self.send(mine, what)?;
            t
        };
        self.count += 1;
        tracing::debug!("comm {}: {what}: sent {:02x?} got {:02x?}", self.count, mine, theirs);
        Ok(theirs)
    }

    /// `ctx_hand_shake`: one `pingpong_dest` each way.
    pub(super) fn hand_shake(&mut self, mine: &PingpongDest, what: &str) -> Result<PingpongDest> {
        let b = self.xchg(&mine.encode(), what)?;
        Ok(PingpongDest::decode(&b)?)
    }
}
