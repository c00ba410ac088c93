//! Output: perftest's header and result lines, and the `--json` form of a session's
//! figures.

use super::wire::PingpongDest;
use super::{Args, Measured, Outcome, Params, Verb};

pub(super) const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

pub(super) fn print_header(p: &Params, role: &str, peer: &str, my: &PingpongDest, rem: &PingpongDest) {
    println!("{RESULT_LINE}");
    println!("                    {}", p.test.title());
    println!(" softrdma perftest {} ({role}), peer: {peer}", p.test.name());
    let transport = if p.iwarp { "IW" } else { "IB" };
    println!(" Number of qps   : 1\t\tTransport type : {transport}");
    let conn = if p.ud { "UD" } else { "RC" };
    println!(" Connection type : {conn}\t\tData ex. method : rdma_cm");
    println!(" Mtu             : {}[B]", p.mtu);
    if p.test.bw() {
        println!(" TX depth        : {}", p.tx_depth);
    }
    if p.test.verb() == Verb::Send {
        println!(" RX depth        : {}", p.rx_depth);
    }
    if p.test.verb() == Verb::Read {
        println!(" Outstand reads  : {}", p.out_reads);
    }
    println!("{RESULT_LINE}");
    for (side, d) in [("local", my), ("remote", rem)] {
        println!(
            " {side} address: LID {:04x} QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
            d.lid, d.qpn, d.psn, d.rkey, d.vaddr
        );
    }
    println!("{RESULT_LINE}");
}

/// `perftest --json` (docs/json.md, "perftest"): the family's names and units.
#[derive(serde::Serialize)]
pub(super) struct PerftestJson<'a> {
    tool: &'static str,
    test: &'static str,
    role: &'a str,
    peer: &'a str,
    figures_from: &'static str,
    size: Option<u64>,
    iters: Option<u64>,
    #[serde(flatten)]
    bw: Option<PerftestBw>,
    /// Latency tests (null for bandwidth): perftest's t_typical is `p50_us`.
    lat: Option<PerftestLat>,
    verified: Option<&'a str>,
}

impl<'a> PerftestJson<'a> {
    /// The object of a side that measured nothing (read_lat's server).
    pub(super) fn new(p: &Params, role: &'a str, peer: &'a str) -> Self {
        PerftestJson {
            tool: "perftest",
            test: p.test.name(),
            role,
            peer,
            figures_from: "none (the client measures)",
            size: None,
            iters: None,
            bw: None,
            lat: None,
            verified: None,
        }
    }
}

#[derive(serde::Serialize)]
pub(super) struct PerftestBw {
    mb_per_s: f64,
    mb_per_s_peak: f64,
    gbit_per_s: f64,
    gbit_per_s_peak: f64,
    msg_per_s: f64,
}

#[derive(serde::Serialize)]
pub(super) struct PerftestLat {
    #[serde(flatten)]
    lat: crate::report::Latency,
    stdev_us: f64,
}

impl Outcome {
    pub(super) fn print(&self, args: &Args) {
        let p = &self.p;
        let (peer, role) = (&self.peer, self.role);
        match &self.measured {
            Measured::Bw {
                report: r,
                from_peer,
                verified,
            } => {
                if args.json {
                    // perftest's MB/sec is 2^20 bytes per second, as the family's mb_per_s.
                    let g = |mb: f64| mb * 1048576.0 * 8.0 / 1e9;
                    crate::report::print_line(&PerftestJson {
                        figures_from: if *from_peer { "peer" } else { "local" },
                        size: Some(r.size),
                        iters: Some(r.iters),
                        bw: Some(PerftestBw {
                            mb_per_s: r.bw_avg,
                            mb_per_s_peak: r.bw_peak,
                            gbit_per_s: g(r.bw_avg),
                            gbit_per_s_peak: g(r.bw_peak),
                            msg_per_s: r.msg_rate * 1e6,
                        }),
                        verified: Some(verified),
                        ..PerftestJson::new(p, role, peer)
                    });
                    return;
                }
                println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
                println!(
                    " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
                    r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
                );
                println!("{RESULT_LINE}");
                if *from_peer {
                    println!(" (the client's figures, as perftest's server prints them)");
                }
                println!(" verified: {verified}");
            }
            Measured::Lat { lat: l, verified } => {
                if args.json {
                    crate::report::print_line(&PerftestJson {
                        figures_from: "local",
                        size: Some(l.size),
                        iters: Some(l.iters),
                        lat: Some(PerftestLat {
                            lat: crate::report::Latency {
                                min_us: l.t_min,
                                max_us: l.t_max,
                                avg_us: l.t_avg,
                                p50_us: l.t_typical,
                                p99_us: l.p99,
                                p999_us: l.p99_9,
                            },
                            stdev_us: l.t_stdev,
                        }),
                        verified: Some(verified),
                        ..PerftestJson::new(p, role, peer)
                    });
                    return;
                }
                println!(
                    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
                );
                println!(
                    " {:<7} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
                    l.size, l.iters, l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p99_9
                );
                println!("{RESULT_LINE}");
                println!(" verified: {verified}");
            }
            Measured::Nothing => {
                if args.json {
                    crate::report::print_line(&PerftestJson::new(p, role, peer));
                } else {
                    println!(" (the client measures; nothing to report here)");
                    println!("{RESULT_LINE}");
                }
            }
        }
    }
}
