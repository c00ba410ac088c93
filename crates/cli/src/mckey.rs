//! `softrdma mckey`: librdmacm's `mckey` example (rdma-core `librdmacm/examples/mckey.c`)
//! over softrdma's RoCEv2 provider: join an IP multicast group in rdma_cm's style
//! (`QueuePair::join_multicast`: on RoCEv2 the MGID is the group's address, IPv4-mapped for
//! IPv4; QPN 0xFFFFFF; Q_Key RDMA_UDP_QKEY) and send or receive UD datagrams through it, so
//! that it talks to Linux's `mckey` over rxe in either role.
//!
//! As mckey: the receiver posts `count` receives of size + 40 (GRH) before it joins and
//! waits for `count` datagrams; the sender joins, waits (mckey sleeps 3 s "to give the SM a
//! chance"; `--delay`), then sends `count` Sends with immediate (its QPN) to the group.
//! Output lines are mckey's. Datagrams are unreliable: `--timeout` bounds the receiver's
//! wait (mckey waits forever) and a shortfall exits non-zero with the count.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::net::{IpAddr, ToSocketAddrs};
use std::time::{Duration, Instant};
use verbs::*;

use crate::udaddy::GRH_LEN;

#[derive(Args, Debug, Clone)]
#[command(disable_version_flag = true)]
pub struct MckeyArgs {
    /// The IP multicast group (224.0.0.0/4, or ff00::/8).
    #[arg(short = 'm')]
    pub group: String,
    /// Send to the group (without: receive).
    #[arg(short = 's')]
    pub sender: bool,
    /// The local address (the device's).
    #[arg(short = 'b')]
    pub bind: Option<String>,
    /// Messages.
    #[arg(short = 'C', default_value_t = 10)]
    pub count: u32,
    /// Message size in bytes (at most the path MTU).
    #[arg(short = 'S', default_value_t = 100)]
    pub size: usize,
    /// Sender: milliseconds between the join and the first Send (mckey: 3000).
    #[arg(long, default_value_t = 3000)]
    pub delay_ms: u64,
    /// Receiver: seconds to wait for the datagrams.
    #[arg(long, default_value_t = 20)]
    pub timeout: u64,
    /// The device: --provider roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    pub dev: crate::providers::DeviceArgs,
}

fn ip(host: &str) -> Result<IpAddr> {
    Ok((host, 0)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("{host} has no address"))?
        .ip())
}

pub fn run(a: MckeyArgs) -> Result<()> {
    println!("mckey: starting {}", if a.sender { "client" } else { "server" });
    let group = ip(&a.group)?;
    let bind = a.bind.as_deref().map(ip).transpose()?;
    let at = match bind {
        Some(b) => crate::providers::Endpoint::Listen(b),
        None => crate::providers::Endpoint::Any,
    };
    let dev = crate::providers::open(&a.dev, &[], at)?;
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
        .context("mckey: unable to create QP")?;
    qp.prepare_ud_cm()?;
    let slot = a.size + GRH_LEN;
    let mr = pd.reg_mr(slot * (a.count as usize + 1), Access::LOCAL_WRITE)?;
    if !a.sender {
        let wrs: Vec<RecvWr> = (0..a.count as usize)
            .map(|i| RecvWr {
                wr_id: i as u64,
                sg_list: vec![mr.sge(i * slot, slot as u32)],
            })
            .collect();
        qp.post_recv(&wrs).context("failed to post receives")?;
    }
    println!("mckey: joining");
    let p = qp.join_multicast(group).context("mckey: failure joining")?;
    println!(
        "mckey: joined dgid: {} mlid 0x0 sl {}",
        std::net::Ipv6Addr::from(p.ah_attr.dgid.0),
        p.ah_attr.sl
    );
    let ah = pd
        .create_ah(&p.ah_attr)
        .context("mckey: failure creating address handle")?;
    if a.count > 0 {
        if a.sender {
            std::thread::sleep(Duration::from_millis(a.delay_ms));
            println!("initiating data transfers");
            let off = slot * a.count as usize;
            let pattern: Vec<u8> = (0..a.size).map(|i| (i % 251) as u8).collect();
            mr.write(off, &pattern).map_err(|e| anyhow::anyhow!("{e:?}"))?;
            for i in 0..a.count {
                let wr = SendWr::new(
                    u64::from(i),
                    WrOpcode::SendWithImm { imm_data: qp.qp_num() },
                    vec![mr.sge(off, a.size as u32)],
                )
                .ud(UdDest {
                    ah: ah.clone(),
                    remote_qpn: p.qp_num,
                    remote_qkey: p.qkey,
                });
                qp.post_send(&[wr]).context("failed to post sends")?;
            }
            let deadline = Instant::now() + Duration::from_secs(a.timeout);
            let mut sent = 0;
            while sent < a.count {
                match cq.wait(Some(Duration::from_millis(50))) {
                    Some(wc) if wc.status == WcStatus::Success => sent += 1,
                    Some(wc) => bail!("mckey: send failed: {:?}", wc.status),
                    None if Instant::now() > deadline => bail!("mckey: {sent} of {} sends completed", a.count),
                    None => {}
                }
            }
        } else {
            println!("receiving data transfers");
            let deadline = Instant::now() + Duration::from_secs(a.timeout);
            let mut got = 0;
            while got < a.count {
                match cq.wait(Some(Duration::from_millis(50))) {
                    Some(wc) if wc.status == WcStatus::Success => {
                        if wc.byte_len as usize != slot {
                            bail!("mckey: received {} bytes, expected {} + {GRH_LEN}", wc.byte_len, a.size);
                        }
                        got += 1;
                    }
                    Some(wc) => bail!("mckey: receive failed: {:?}", wc.status),
                    None if Instant::now() > deadline => {
                        bail!("mckey: {got} of {} datagrams received in {}s", a.count, a.timeout)
                    }
                    None => {}
                }
            }
        }
        println!("data transfers complete");
    }
    qp.leave_multicast(group).context("mckey: failure leaving")?;
    println!("test complete");
    println!("return status 0");
    Ok(())
}
