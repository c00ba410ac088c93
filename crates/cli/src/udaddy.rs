//! `softrdma udaddy`: librdmacm's `udaddy` example (rdma-core `librdmacm/examples/udaddy.c`)
//! over softrdma's RoCEv2 provider, so that it talks to Linux's `udaddy` (over rxe) in either
//! role. It exercises rdma_cm's UDP port space: SIDR to resolve the server's UD QP, then
//! unreliable datagrams both ways.
//!
//! The exchange (udaddy.c's, one connection):
//!
//! ```text
//!  client                                      server
//!  UD QP, `count` receives of size + 40        listen in RDMA_PS_UDP (port 7174)
//!  SIDR_REQ (rdma_cm header)            ───▶   UD QP, `count` receives, accept: SIDR_REP
//!  ◀───  SIDR_REP: QPN, Q_Key 0x01234567        (status 0, its QPN, RDMA_UDP_QKEY)
//!  `count` Sends with immediate = our QPN ───▶  `count` receives; the first gives the reply
//!        (AH from the SIDR_REP)                 address: the GRH's source GID, the
//!                                               immediate as QPN, its own Q_Key
//!  `count` receives                     ◀───   `count` Sends back
//! ```
//!
//! udaddy sends whatever its buffer holds (the receive buffer, so the GRH and data of the
//! last datagram); so do we, after filling it with a pattern, and count datagrams and their
//! lengths (payload `size`, 40 octets of GRH before it) rather than checking content a Linux
//! peer does not define. Output lines are udaddy's.
//!
//! Datagrams are unreliable: a lost one leaves the receiver waiting, and `--timeout` (10 s)
//! bounds every wait (udaddy itself waits forever); a failed run exits non-zero with the
//! reason.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};
use verbs::*;

/// `sizeof(struct ibv_grh)`: the receive buffer's first 40 octets on a UD QP.
pub const GRH_LEN: usize = 40;

#[derive(Args, Debug, Clone)]
#[command(disable_version_flag = true)]
pub struct UdaddyArgs {
    /// Server address: run as the client of the udaddy server there (without: server).
    #[arg(short = 's')]
    pub server: Option<String>,
    /// Bind address (server: the address to listen on; client: the source address).
    #[arg(short = 'b')]
    pub bind: Option<String>,
    /// Messages each way.
    #[arg(short = 'C', default_value_t = 10)]
    pub count: u32,
    /// Message size in bytes (at most the path MTU).
    #[arg(short = 'S', default_value_t = 100)]
    pub size: usize,
    /// Port in RDMA_PS_UDP (udaddy's is fixed at 7174; its -p is the port space).
    #[arg(long, default_value_t = 7174)]
    pub port: u16,
    /// Seconds any one step may take (resolution, each datagram).
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// The device: --provider roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    pub dev: crate::providers::DeviceArgs,
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("{host} has no address"))
}

/// The node's resources: udaddy.c's `struct cmatest_node`.
struct Node {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    /// `count` receive slots of size + 40, then one send buffer.
    mr: MemoryRegion,
    slot: usize,
}

const WR_RECV: u64 = 1 << 32;

impl Node {
    fn new(dev: &Device, a: &UdaddyArgs) -> Result<Node> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq((a.count as usize * 2).max(2))?;
        let attr = QpInitAttr {
            max_send_wr: a.count.max(1),
            max_recv_wr: a.count.max(1),
            max_send_sge: 1,
            max_recv_sge: 1,
            ..QpInitAttr::default()
        };
        let qp = pd
            .create_qp(QpInit::new(QpType::Ud, &cq).cap(attr))
            .context("udaddy: unable to create QP")?;
        let slot = a.size + GRH_LEN;
        let mr = pd
            .reg_mr(slot * (a.count as usize + 1), Access::LOCAL_WRITE)
            .context("failed to reg MR")?;
        // rdma_create_qp: a UD QP is in RTS (RDMA_UDP_QKEY) before receives are posted.
        qp.prepare_ud_cm()?;
        let n = Node { pd, cq, qp, mr, slot };
        let pattern: Vec<u8> = (0..a.size).map(|i| (i % 251) as u8).collect();
        n.mr.write(n.send_off(a), &pattern)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        Ok(n)
    }
    fn send_off(&self, a: &UdaddyArgs) -> usize {
        self.slot * a.count as usize
    }
    fn post_recvs(&self, a: &UdaddyArgs) -> Result<()> {
        let wrs: Vec<RecvWr> = (0..a.count as usize)
            .map(|i| RecvWr {
                wr_id: WR_RECV | i as u64,
                sg_list: vec![self.mr.sge(i * self.slot, self.slot as u32)],
            })
            .collect();
        self.qp.post_recv(&wrs).context("failed to post receives")?;
        Ok(())
    }
    fn post_sends(&self, a: &UdaddyArgs, dest: &UdDest) -> Result<()> {
        let imm = self.qp.qp_num();
        for i in 0..a.count {
            let wr = SendWr::new(
                u64::from(i),
                WrOpcode::SendWithImm { imm_data: imm },
                vec![self.mr.sge(self.send_off(a), a.size as u32)],
            )
            .ud(dest.clone());
            self.qp.post_send(&[wr]).context("failed to post sends")?;
        }
        Ok(())
    }
    /// Waits for `sends` send and `recvs` receive completions, checking each; returns the
    /// receives' completions in order.
    fn poll(&self, a: &UdaddyArgs, sends: u32, recvs: u32) -> Result<Vec<WorkCompletion>> {
        let step = Duration::from_secs(a.timeout);
        let mut deadline = Instant::now() + step;
        let mut got = Vec::new();
        let mut sent = 0;
        while sent < sends || (got.len() as u32) < recvs {
            let wc = match self.cq.poll_one() {
                Some(wc) => wc,
                None => match self.cq.wait(Some(Duration::from_millis(50))) {
                    Some(wc) => wc,
                    None if Instant::now() > deadline => bail!(
                        "udaddy: {} of {recvs} messages received, {sent} of {sends} sends completed in {}s \
                         (QP {:#x}); datagrams lost?",
                        got.len(),
                        a.timeout,
                        self.qp.qp_num()
                    ),
                    None => continue,
                },
            };
            if wc.status != WcStatus::Success {
                bail!(
                    "udaddy: completion failed: {:?} (wr_id {:#x}, QP {:#x})",
                    wc.status,
                    wc.wr_id,
                    self.qp.qp_num()
                );
            }
            deadline = Instant::now() + step;
            if wc.wr_id & WR_RECV == 0 {
                sent += 1;
                continue;
            }
            if wc.byte_len as usize != a.size + GRH_LEN {
                bail!(
                    "udaddy: received {} bytes, expected {} + {GRH_LEN} of GRH",
                    wc.byte_len,
                    a.size
                );
            }
            got.push(wc);
        }
        Ok(got)
    }
    /// udaddy's `create_reply_ah`: an AH from the completion and the GRH area of the receive
    /// (`ibv_create_ah_from_wc`), the sender's QPN from the immediate data, our own Q_Key.
    fn reply_dest(&self, wc: &WorkCompletion) -> Result<UdDest> {
        let slot = (wc.wr_id & 0xffff_ffff) as usize;
        let mut grh = [0u8; GRH_LEN];
        self.mr
            .read(slot * self.slot, &mut grh)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let ah = self
            .pd
            .create_ah_from_wc(wc, &grh, 1)
            .context("udaddy: failure creating the reply address handle")?;
        let remote_qpn = wc
            .imm_data
            .context("udaddy: the first message carries no immediate (QPN)")?;
        Ok(UdDest {
            ah,
            remote_qpn,
            remote_qkey: RDMA_UDP_QKEY,
        })
    }
}

pub fn run(a: UdaddyArgs) -> Result<()> {
    let step = Duration::from_secs(a.timeout);
    match a.server.clone() {
        Some(server) => {
            println!("udaddy: starting client");
            let dest = resolve(&server, a.port)?;
            let source = a.bind.as_deref().map(|b| resolve(b, 0)).transpose()?.map(|s| s.ip());
            let dev = crate::providers::open(
                &a.dev,
                &[],
                crate::providers::Endpoint::Connect {
                    dest: dest.ip(),
                    source,
                },
            )?;
            let node = Node::new(&dev, &a)?;
            node.post_recvs(&a)?;
            println!("udaddy: connecting");
            let p = node
                .qp
                .connect_ud(dest, &[], step)
                .with_context(|| format!("udaddy: event: RDMA_CM_EVENT_UNREACHABLE ({dest})"))?;
            let ah = node
                .pd
                .create_ah(&p.ah_attr)
                .context("udaddy: failure creating address handle")?;
            let to = UdDest {
                ah,
                remote_qpn: p.qp_num,
                remote_qkey: p.qkey,
            };
            tracing::info!(qpn = p.qp_num, qkey = p.qkey, "udaddy: resolved");
            if a.count > 0 {
                println!("initiating data transfers");
                node.post_sends(&a, &to)?;
                println!("receiving data transfers");
                node.poll(&a, a.count, a.count)?;
                println!("data transfers complete");
            }
        }
        None => {
            println!("udaddy: starting server");
            let bind: IpAddr = match &a.bind {
                Some(b) => resolve(b, 0)?.ip(),
                None => IpAddr::from([0, 0, 0, 0]),
            };
            let dev = crate::providers::open(&a.dev, &[], crate::providers::Endpoint::Listen(bind))?;
            let l = dev
                .listen_in(SocketAddr::new(bind, a.port), PortSpace::Udp)
                .context("udaddy: failure trying to listen")?;
            let req = l.get_request(Some(step)).context("udaddy: no connect request")?;
            drop(l);
            let node = Node::new(&dev, &a)?;
            node.post_recvs(&a)?;
            req.accept_ud(&node.qp, &[]).context("udaddy: failure accepting")?;
            if a.count > 0 {
                println!("receiving data transfers");
                let got = node.poll(&a, 0, a.count)?;
                let to = node.reply_dest(&got[0])?;
                println!("sending replies");
                node.post_sends(&a, &to)?;
                node.poll(&a, a.count, 0)?;
                println!("data transfers complete");
            }
        }
    }
    println!("test complete");
    println!("return status 0");
    Ok(())
}
