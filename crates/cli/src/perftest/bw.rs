//! The bandwidth tests (`ib_{send,write,read}_bw`): posting with a window of `tx_depth`,
//! the credit word of `ib_send_bw` over iWARP, and perftest's `print_report_bw` figures.

use anyhow::{Context, Result, anyhow, bail};
use std::time::Instant;
use verbs::*;

use super::completion::{check_events, ok, wait_wc};
use super::data::{check_pattern, recv_done, remote_of};
use super::wire::{self, BwReport, PingpongDest};
use super::{Data, Params, Verb};

/// perftest's `print_report_bw` for our own timestamps: average over the whole run, peak
/// the best window from any post to any later completion (every WR is signaled here);
/// no peak above 20000 iterations, as perftest.
pub(super) fn bw_report(p: &Params, posted: &[Instant], completed: &[Instant]) -> BwReport {
    let n = posted.len().min(completed.len());
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let total = secs(posted[0], completed[n - 1]).max(1e-9);
    let mb = p.size as f64 / (1u64 << 20) as f64;
    let bw_avg = mb * n as f64 / total;
    let mut bw_peak = 0.0;
    if n <= 20_000 {
        let mut best = f64::MAX;
        for (i, p) in posted.iter().enumerate().take(n) {
            for (j, c) in completed.iter().enumerate().take(n).skip(i) {
                let t = secs(*p, *c) / (j - i + 1) as f64;
                if t > 0.0 && t < best {
                    best = t;
                }
            }
        }
        if best < f64::MAX {
            bw_peak = mb / best;
        }
    }
    BwReport {
        size: p.size,
        iters: n as u64,
        bw_peak,
        bw_avg,
        msg_rate: n as f64 / total / 1e6,
    }
}

pub(super) fn bw_rdma_client(
    d: &Data,
    p: &Params,
    rem: &PingpongDest,
    verify: bool,
    deadline: Instant,
) -> Result<(BwReport, String)> {
    let n = p.iters as usize;
    let remote = remote_of(rem);
    let (op, wc_op, what) = match p.test.verb() {
        Verb::Write => (WrOpcode::RdmaWrite { remote }, WcOpcode::RdmaWrite, "RDMA Write"),
        _ => (WrOpcode::RdmaRead { remote }, WcOpcode::RdmaRead, "RDMA Read"),
    };
    // Writes go from the source half, Reads land in the target half.
    let sge = match p.test.verb() {
        Verb::Write => d.mr.sge(0, p.size as u32),
        _ => d.mr.sge(p.half, p.size as u32),
    };
    let mut posted = Vec::with_capacity(n);
    let mut completed = Vec::with_capacity(n);
    let mut wcs = Vec::with_capacity(64);
    while completed.len() < n {
        while posted.len() < n && posted.len() - completed.len() < p.tx_depth as usize {
            posted.push(Instant::now());
            d.qp.post_send_one(SendWr::new(posted.len() as u64, op.clone(), vec![sge]))
                .with_context(|| format!("posting {what} {}", posted.len()))?;
        }
        wcs.clear();
        if d.send_cq.poll(&mut wcs, 64) == 0 {
            let wc = wait_wc(&d.send_cq, &d.qp, deadline, &format!("{what} completions"))?;
            wcs.push(wc);
        }
        let now = Instant::now();
        for wc in &wcs {
            ok(wc, wc_op, what)?;
            completed.push(now);
        }
    }
    let report = bw_report(p, &posted, &completed);
    let mut verified = format!("{n} {what} completions");
    if verify {
        if p.test.verb() == Verb::Write {
            // Read the target back over the same QP: its response follows every Write's placement.
            d.qp.post_send_one(SendWr::new(
                0,
                WrOpcode::RdmaRead { remote },
                vec![d.mr.sge(p.half, p.size as u32)],
            ))?;
            let wc = wait_wc(&d.send_cq, &d.qp, deadline, "the read-back")?;
            ok(&wc, WcOpcode::RdmaRead, "read-back of the written target")?;
        }
        check_pattern(d, p, &format!("the {what} target"), &mut verified)?;
    }
    Ok((report, verified))
}

pub(super) fn credit_of(d: &Data) -> u32 {
    let mut b = [0u8; 4];
    if let Some(c) = &d.credit {
        let _ = c.read(4, &mut b);
    }
    wire::decode_credit(b)
}

/// `run_iter_bw`: with `send_rcredit` (iWARP) never more than rx_depth - 1 Sends beyond the
/// credit the receiver last wrote; without it (IB transport) only tx_depth bounds the Sends
/// in flight and the responder's RNR NAKs pace them.
pub(super) fn send_bw_client(d: &Data, p: &Params, _rem: &PingpongDest, deadline: Instant) -> Result<BwReport> {
    let n = p.iters as usize;
    let sge = d.mr.sge(0, p.size as u32);
    let mut posted = Vec::with_capacity(n);
    let mut completed = Vec::with_capacity(n);
    let mut wcs = Vec::with_capacity(64);
    while completed.len() < n {
        let mut blocked = false;
        while posted.len() < n && posted.len() - completed.len() < p.tx_depth as usize {
            let window = (posted.len() as u64 + 1).saturating_sub(credit_of(d) as u64);
            if d.credit.is_some() && window >= p.rx_depth as u64 {
                blocked = true;
                break;
            }
            posted.push(Instant::now());
            d.qp.post_send_one(d.wr(SendWr::new(posted.len() as u64, WrOpcode::Send, vec![sge])))
                .with_context(|| format!("posting Send {}", posted.len()))?;
        }
        wcs.clear();
        if d.send_cq.poll(&mut wcs, 64) == 0 {
            if blocked && posted.len() == completed.len() {
                // Waiting for credit only: poll (which reads the socket) until it moves.
                check_events(&d.qp, "the receiver's credit")?;
                if Instant::now() >= deadline {
                    bail!(
                        "timed out waiting for the receiver's credit ({} of {n} sent)",
                        posted.len()
                    );
                }
                std::hint::spin_loop();
                continue;
            }
            wcs.push(wait_wc(&d.send_cq, &d.qp, deadline, "Send completions")?);
        }
        let now = Instant::now();
        for wc in &wcs {
            ok(wc, WcOpcode::Send, "Send")?;
            completed.push(now);
        }
    }
    Ok(bw_report(p, &posted, &completed))
}

/// Waits for one credit RDMA Write's completion.
pub(super) fn credit_write_done(d: &Data, deadline: Instant) -> Result<()> {
    let wc = wait_wc(&d.send_cq, &d.qp, deadline, "a credit Write's completion")?;
    ok(&wc, WcOpcode::RdmaWrite, "credit RDMA Write")
}

/// `run_iter_bw_server` with `send_rcredit`: repost while fewer than iters are posted,
/// RDMA Write the received count every rx_depth/3 receives.
pub(super) fn send_bw_server(
    d: &Data,
    p: &Params,
    rem: &PingpongDest,
    mut posted: u64,
    verify: bool,
    deadline: Instant,
) -> Result<(BwReport, String)> {
    let n = p.iters;
    let credit_mr = d.credit.as_ref();
    let credit_every = (p.rx_depth / 3).max(1) as u64;
    let mut rcnt = 0u64;
    let mut credits_out = 0u64;
    let (mut first, mut last) = (None, Instant::now());
    let mut wcs = Vec::with_capacity(64);
    while rcnt < n {
        wcs.clear();
        if d.recv_cq.poll(&mut wcs, 64) == 0 {
            wcs.push(wait_wc(
                &d.recv_cq,
                &d.qp,
                deadline,
                &format!("Send {} of {n}", rcnt + 1),
            )?);
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        for wc in &wcs {
            recv_done(d, p, wc, &mut rcnt, &mut posted)?;
            if let Some(credit_mr) = credit_mr
                && (rcnt % p.rx_depth as u64).is_multiple_of(credit_every)
            {
                while credits_out >= p.tx_depth as u64 {
                    credit_write_done(d, deadline)?;
                    credits_out -= 1;
                }
                credit_mr
                    .write(0, &wire::encode_credit(rcnt as u32))
                    .map_err(|_| anyhow!("credit region"))?;
                let remote = remote_of(rem);
                d.qp.post_send_one(SendWr::new(
                    rcnt,
                    WrOpcode::RdmaWrite { remote },
                    vec![credit_mr.sge(0, 4)],
                ))
                .context("posting a credit RDMA Write")?;
                credits_out += 1;
            }
        }
    }
    while credits_out > 0 {
        credit_write_done(d, deadline)?;
        credits_out -= 1;
    }
    let t = last
        .saturating_duration_since(first.unwrap_or(last))
        .as_secs_f64()
        .max(1e-9);
    let mb = p.size as f64 / (1u64 << 20) as f64;
    let bw = mb * n as f64 / t;
    let report = BwReport {
        size: p.size,
        iters: n,
        bw_peak: bw,
        bw_avg: bw,
        msg_rate: n as f64 / t / 1e6,
    };
    let mut verified = format!("{n} receives of {} bytes", p.size);
    if verify {
        check_pattern(d, p, "the last Send", &mut verified)?;
    }
    Ok((report, verified))
}

#[cfg(test)]
mod tests {
    use super::super::{MTU, Test, at};
    use super::*;

    #[test]
    fn bw_report_average_and_peak() {
        let p = Params {
            test: Test::WriteBw,
            size: 1 << 20,
            iters: 4,
            tx_depth: 4,
            rx_depth: 1,
            out_reads: 1,
            half: 1 << 20,
            ud: false,
            size_given: true,
            mtu: MTU,
            iwarp: true,
        };
        let b = Instant::now();
        let posted = at(b, &[0, 0, 0, 0]);
        let completed = at(b, &[1_000_000, 1_500_000, 1_750_000, 2_000_000]);
        let r = bw_report(&p, &posted, &completed);
        assert!((r.bw_avg - 2.0).abs() < 1e-9, "{r:?}"); // 4 MiB in 2 s
        assert!((r.bw_peak - 2.0).abs() < 1e-9, "{r:?}"); // best window is the whole run
        assert!((r.msg_rate - 2e-6).abs() < 1e-12);
    }
}
