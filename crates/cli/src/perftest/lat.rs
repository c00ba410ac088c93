//! The latency tests (`ib_{send,write,read}_lat`): ping-pong over the data QP and perftest's
//! `print_report_lat` figures (typical = median, outliers dropped as perftest does).

use anyhow::{Context, Result, anyhow, bail};
use std::time::Instant;
use verbs::*;

use super::completion::{check_events, ok, wait_wc};
use super::data::{check_pattern, recv_done, remote_of};
use super::wire::PingpongDest;
use super::{Data, Params};

/// `print_report_lat`'s figures, in microseconds.
#[derive(Debug, Clone)]
pub struct LatReport {
    pub size: u64,
    pub iters: u64,
    pub t_min: f64,
    pub t_max: f64,
    pub t_typical: f64,
    pub t_avg: f64,
    pub t_stdev: f64,
    pub p99: f64,
    pub p99_9: f64,
}

/// perftest's method: the differences of consecutive post times (n - 1 of them), divided by
/// 2 for ping-pongs (write, send) and 1 for Read; sorted; the 2 largest dropped
/// (`LAT_MEASURE_TAIL`); median, average, standard deviation of the rest; `t_max`, 99% and
/// 99.9% taken at the indices perftest uses.
pub fn lat_report(size: u64, posted: &[Instant], rtt_factor: f64) -> LatReport {
    let mut delta: Vec<f64> = posted
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    delta.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mc = delta.len().saturating_sub(2).max(1);
    let median = if (mc - 1) % 2 == 1 && mc >= 2 {
        (delta[mc / 2] + delta[mc / 2 - 1]) / 2.0
    } else {
        delta[mc / 2]
    };
    let avg = delta[..mc].iter().sum::<f64>() / mc as f64;
    let var = delta[..mc].iter().map(|d| (d - avg) * (d - avg)).sum::<f64>() / mc as f64;
    let at = |q: f64| delta[((mc as f64 * q).ceil() as usize).min(delta.len() - 1)];
    LatReport {
        size,
        iters: posted.len() as u64,
        t_min: delta[0],
        t_max: delta[mc.min(delta.len() - 1)],
        t_typical: median,
        t_avg: avg,
        t_stdev: var.sqrt(),
        p99: at(0.99),
        p99_9: at(0.999),
    }
}

pub(super) fn read_byte(mr: &MemoryRegion, off: usize) -> u8 {
    let mut b = [0u8; 1];
    let _ = mr.read(off, &mut b);
    b[0]
}

/// `run_iter_lat_write`: each side RDMA Writes `size` bytes whose last byte is its send
/// count, and waits for the peer's last byte to reach its receive count; the server waits
/// before its first Write.
pub(super) fn write_lat(
    d: &Data,
    p: &Params,
    rem: &PingpongDest,
    client: bool,
    deadline: Instant,
) -> Result<(LatReport, String)> {
    let n = p.iters;
    let size = p.size as usize;
    let poll_off = p.half + size - 1;
    let remote = remote_of(rem);
    let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
    let mut posted = Vec::with_capacity(n as usize);
    let mut spins = 0u64;
    while scnt < n || ccnt < n || rcnt < n {
        // The server waits for the client's first Write before its own.
        if rcnt < n && (client || scnt >= 1) {
            rcnt += 1;
            let want = rcnt as u8;
            while read_byte(&d.mr, poll_off) != want {
                // Polling the CQ reads the socket (run-to-completion); nothing is outstanding.
                if let Some(wc) = d.send_cq.poll_one() {
                    bail!(
                        "unexpected completion {:?} while waiting for the peer's Write",
                        wc.opcode
                    );
                }
                spins += 1;
                if spins.is_multiple_of(4096) {
                    check_events(&d.qp, "the peer's RDMA Write")?;
                    if Instant::now() >= deadline {
                        bail!("timed out waiting for the peer's Write {rcnt} of {n}");
                    }
                }
            }
        }
        if scnt < n {
            posted.push(Instant::now());
            scnt += 1;
            d.mr.write(size - 1, &[scnt as u8])
                .map_err(|_| anyhow!("data region"))?;
            d.qp.post_send_one(SendWr::new(
                scnt,
                WrOpcode::RdmaWrite { remote },
                vec![d.mr.sge(0, size as u32)],
            ))
            .with_context(|| format!("posting RDMA Write {scnt}"))?;
        }
        if ccnt < n {
            let wc = wait_wc(&d.send_cq, &d.qp, deadline, "an RDMA Write completion")?;
            ok(&wc, WcOpcode::RdmaWrite, "RDMA Write")?;
            ccnt += 1;
        }
    }
    Ok((
        lat_report(p.size, &posted, 2.0),
        format!("{n} Writes each way, the peer's sequence byte checked on each"),
    ))
}

/// `run_iter_lat`: one RDMA Read at a time (client only).
pub(super) fn read_lat(
    d: &Data,
    p: &Params,
    rem: &PingpongDest,
    verify: bool,
    deadline: Instant,
) -> Result<(LatReport, String)> {
    let remote = remote_of(rem);
    let mut posted = Vec::with_capacity(p.iters as usize);
    for i in 0..p.iters {
        posted.push(Instant::now());
        d.qp.post_send_one(SendWr::new(
            i,
            WrOpcode::RdmaRead { remote },
            vec![d.mr.sge(p.half, p.size as u32)],
        ))
        .with_context(|| format!("posting RDMA Read {}", i + 1))?;
        let wc = wait_wc(&d.send_cq, &d.qp, deadline, "an RDMA Read completion")?;
        ok(&wc, WcOpcode::RdmaRead, "RDMA Read")?;
    }
    let mut verified = format!("{} Read completions", p.iters);
    if verify {
        check_pattern(d, p, "the Read data", &mut verified)?;
    }
    Ok((lat_report(p.size, &posted, 1.0), verified))
}

/// `run_iter_lat_send`: ping-pong of Sends, the client first; receives reposted while
/// fewer than iters are posted.
pub(super) fn send_lat(
    d: &Data,
    p: &Params,
    client: bool,
    mut rposted: u64,
    verify: bool,
    deadline: Instant,
) -> Result<(LatReport, String)> {
    let n = p.iters;
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut posted = Vec::with_capacity(n as usize);
    while scnt < n || rcnt < n {
        if rcnt < n && !(scnt < 1 && client) {
            let wc = wait_wc(&d.recv_cq, &d.qp, deadline, &format!("Send {} of {n}", rcnt + 1))?;
            recv_done(d, p, &wc, &mut rcnt, &mut rposted)?;
        }
        if scnt < n {
            posted.push(Instant::now());
            scnt += 1;
            d.qp.post_send_one(d.wr(SendWr::new(scnt, WrOpcode::Send, vec![d.mr.sge(0, p.size as u32)])))
                .with_context(|| format!("posting Send {scnt}"))?;
            let wc = wait_wc(&d.send_cq, &d.qp, deadline, "a Send completion")?;
            ok(&wc, WcOpcode::Send, "Send")?;
        }
    }
    let mut verified = format!("{n} Sends each way of {} bytes", p.size);
    if verify {
        check_pattern(d, p, "the last Send", &mut verified)?;
    }
    Ok((lat_report(p.size, &posted, 2.0), verified))
}

#[cfg(test)]
mod tests {
    use super::super::at;
    use super::*;

    #[test]
    fn lat_report_follows_perftest() {
        // Post times 0,10,20,...: deltas 10 us each except two outliers that are dropped.
        let b = Instant::now();
        let mut t = vec![0u64];
        for d in [10, 10, 10, 10, 10, 10, 500, 900] {
            let last = *t.last().unwrap();
            t.push(last + d);
        }
        let r = lat_report(2, &at(b, &t), 2.0);
        assert_eq!(r.iters, 9);
        assert!((r.t_min - 5.0).abs() < 1e-6, "{r:?}");
        assert!((r.t_typical - 5.0).abs() < 1e-6, "{r:?}");
        assert!((r.t_avg - 5.0).abs() < 1e-6, "{r:?}");
        // t_max is delta[measure_cnt], the smaller of the two dropped ones (perftest's index).
        assert!((r.t_max - 250.0).abs() < 1e-6, "{r:?}");
        let read = lat_report(2, &at(b, &t), 1.0);
        assert!((read.t_min - 10.0).abs() < 1e-6);
    }
}
