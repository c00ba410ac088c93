//! What a test prints: its [`Outcome`], the `--json` objects, perftest's table header and
//! bandwidth units.

use super::*;

/// `bench --json`: one object per test (docs/json.md).
#[derive(serde::Serialize)]
pub(super) struct BenchJson {
    tool: &'static str,
    op: &'static str,
    mode: &'static str,
    size: u64,
    iters: u64,
    messages: u64,
    qps: u16,
    depth: u32,
    crc: bool,
    seconds: f64,
    /// The average: `mb_per_s` and `gbit_per_s`.
    #[serde(flatten)]
    bw: Bandwidth,
    mb_per_s_peak: f64,
    gbit_per_s_peak: f64,
    msg_per_s: f64,
    /// Latency mode only (null for bandwidth).
    lat: Option<Latency>,
    /// CPU seconds this process used during the run.
    cpu_s: Option<f64>,
    /// With `--baseline tcp|udp` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    baseline: Option<BaselineJson>,
}

/// The plain-socket baseline of a [`BenchJson`] and how RDMA compares.
#[derive(serde::Serialize)]
struct BaselineJson {
    /// "tcp" or "udp".
    kind: &'static str,
    /// How the baseline's ends waited for data: "busy-poll" (latency tests without
    /// `--events`, like `sockperf ping-pong --nonblocked`) or "blocking".
    polling: &'static str,
    /// What the baseline does, in words (`--help` says the same).
    method: &'static str,
    /// Payload bytes it moved (both directions for ping-pongs; for streams the receiver's count).
    bytes: u64,
    #[serde(flatten)]
    bw: Bandwidth,
    lat: Option<Latency>,
    cpu_s: Option<f64>,
    /// RDMA over the baseline of the field `ratio_of` names: for bandwidth higher is better,
    /// for latency lower.
    ratio: Option<f64>,
    ratio_of: &'static str,
    /// CPU seconds RDMA over the baseline (lower is cheaper).
    cpu_ratio: Option<f64>,
}

/// What one test measured.
pub(super) struct Outcome {
    pub(super) op: Op,
    pub(super) size: u64,
    pub(super) qps: u16,
    pub(super) depth: u32,
    pub(super) lat: bool,
    /// `--events`: the latency test's ends sleep on their CQs instead of busy-polling.
    pub(super) events: bool,
    pub(super) crc: bool,
    /// What the connection negotiated, for people (the provider's `ConnInfo::detail`).
    pub(super) detail: String,
    /// Messages completed in total over all QPs.
    pub(super) messages: u64,
    pub(super) secs: f64,
    pub(super) peak_gbit: f64,
    pub(super) hist: Option<Histogram<u64>>,
    pub(super) baseline: Option<Baseline>,
    pub(super) tcp_port: u16,
    /// CPU seconds this process used during the measured run (both ends when they share the process).
    pub(super) cpu_s: Option<f64>,
}

pub(super) struct Baseline {
    /// "tcp" or "udp".
    pub(super) kind: &'static str,
    pub(super) gbit: f64,
    pub(super) hist: Option<Histogram<u64>>,
    /// CPU seconds this process used during the baseline.
    pub(super) cpu_s: Option<f64>,
    /// How the baseline's ends waited: like the RDMA side in latency tests.
    pub(super) polling: tcp::Polling,
    /// Payload bytes the baseline moved (both directions for ping-pongs); for TCP streams the
    /// receiving end's count, which must be the RDMA test's messages x size.
    pub(super) bytes: u64,
    /// What the baseline does, in words.
    pub(super) method: &'static str,
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

impl Outcome {
    pub(super) fn gbit(&self) -> f64 {
        self.messages as f64 * self.size as f64 * 8.0 / self.secs / 1e9
    }
    fn msg_rate(&self) -> f64 {
        self.messages as f64 / self.secs
    }
    pub(super) fn iters(&self) -> u64 {
        self.messages / self.qps as u64
    }
    fn ratio(&self) -> Option<f64> {
        let b = self.baseline.as_ref()?;
        match (&self.hist, &b.hist) {
            (Some(h), Some(bh)) => Some(us(h, 0.5) / us(bh, 0.5)),
            _ => Some(self.gbit() / b.gbit),
        }
    }
    /// CPU seconds per message, RDMA over TCP (same message count): lower is cheaper.
    fn cpu_ratio(&self) -> Option<f64> {
        let b = self.baseline.as_ref()?.cpu_s?;
        let r = self.cpu_s?;
        (b > 0.0).then(|| r / b)
    }
    /// The `--json` object (docs/json.md, "bench").
    pub(super) fn json(&self) -> BenchJson {
        let bw = |gbit: f64| Bandwidth::of_bytes_per_s(gbit * 1e9 / 8.0);
        BenchJson {
            tool: "bench",
            op: self.op.name(),
            mode: if self.lat { "lat" } else { "bw" },
            size: self.size,
            iters: self.iters(),
            messages: self.messages,
            qps: self.qps,
            depth: if self.lat { 1 } else { self.depth },
            crc: self.crc,
            seconds: self.secs,
            bw: bw(self.gbit()),
            mb_per_s_peak: bw(self.peak_gbit).mb_per_s,
            gbit_per_s_peak: self.peak_gbit,
            msg_per_s: self.msg_rate(),
            lat: self.hist.as_ref().map(Latency::of_ns),
            cpu_s: self.cpu_s,
            baseline: self.baseline.as_ref().map(|b| BaselineJson {
                kind: b.kind,
                polling: b.polling.as_str(),
                method: b.method,
                bytes: b.bytes,
                bw: bw(b.gbit),
                lat: b.hist.as_ref().map(Latency::of_ns),
                cpu_s: b.cpu_s,
                ratio: self.ratio(),
                ratio_of: if self.hist.is_some() {
                    "lat.p50_us"
                } else {
                    "gbit_per_s"
                },
                cpu_ratio: self.cpu_ratio(),
            }),
        }
    }
    pub(super) fn print_row(&self, gbits: bool) {
        let bw = |gbit: f64| Unit::of(gbits).convert_gbit(gbit);
        match &self.hist {
            None => {
                println!(
                    " {:<10} {:<13} {:<18.2} {:<20.2} {:.6}",
                    show_size(self.size),
                    self.iters(),
                    bw(self.peak_gbit),
                    bw(self.gbit()),
                    self.msg_rate() / 1e6
                );
                if let Some(b) = &self.baseline {
                    let k = b.kind.to_uppercase();
                    println!(
                        " {:<10} {:<13} {:<18} {:<20.2} ratio RDMA/{k} {:.3} (CPU seconds RDMA/{k} {:.2})",
                        format!("  {k}"),
                        self.iters(),
                        "",
                        bw(b.gbit),
                        self.ratio().unwrap_or(f64::NAN),
                        self.cpu_ratio().unwrap_or(f64::NAN)
                    );
                }
            }
            Some(h) => {
                println!(
                    " {:<8} {:<12} {:<11.2} {:<11.2} {:<11.2} {:<11.2} {:<11.2} {:.2}",
                    show_size(self.size),
                    self.iters(),
                    Latency::of_ns(h).min_us,
                    Latency::of_ns(h).max_us,
                    Latency::of_ns(h).p50_us,
                    Latency::of_ns(h).avg_us,
                    Latency::of_ns(h).p99_us,
                    Latency::of_ns(h).p999_us
                );
                if let Some(b) = &self.baseline
                    && let Some(bh) = &b.hist
                {
                    let k = b.kind.to_uppercase();
                    println!(
                        " {:<8} {:<12} {:<11.2} {:<11.2} {:<11.2} {:<11.2} {:<11.2} {:.2}   p50 ratio RDMA/{k} {:.3}",
                        format!("  {k}"),
                        self.iters(),
                        Latency::of_ns(bh).min_us,
                        Latency::of_ns(bh).max_us,
                        Latency::of_ns(bh).p50_us,
                        Latency::of_ns(bh).avg_us,
                        Latency::of_ns(bh).p99_us,
                        Latency::of_ns(bh).p999_us,
                        self.ratio().unwrap_or(f64::NAN)
                    );
                }
            }
        }
    }
}

pub(super) fn print_header(args: &Args, dev: &Device, target: SocketAddr, r: &Outcome) {
    let line = "-".repeat(87);
    println!("{line}");
    println!(
        "                    {} {} Test",
        r.op.title(),
        if r.lat { "Latency" } else { "BW" }
    );
    println!(" Device          : {} ({})", dev.name(), crate::providers::label(dev));
    println!(
        " Connection      : {}",
        if args.connect.is_some() {
            format!("to {target}")
        } else {
            format!("loopback {target}, both ends in this process")
        }
    );
    println!(
        " Number of qps   : {:<10} Transport type : {}",
        r.qps,
        crate::providers::transport(dev)
    );
    if !r.lat {
        println!(
            " TX depth        : {:<10} CQ moderation  : {}",
            r.depth,
            cq_mod(r.depth)
        );
    }
    if !r.detail.is_empty() {
        println!(" Negotiated      : {}", r.detail);
    }
    if args.baseline.as_deref() == Some("udp") {
        println!(" Baseline        : plain UDP datagrams, same message size and count, one in flight");
        if args.events {
            println!(" Baseline wait   : blocking receives on both ends, as --events sleeps on the CQs");
        } else {
            println!(" Baseline wait   : busy-polling non-blocking sockets on both ends, as we busy-poll the CQs");
        }
    } else if args.baseline.is_some() {
        println!(" Baseline        : plain TCP sockets, same message size and count");
        if let Some(b) = &r.baseline {
            println!(" Baseline method : {}", b.method);
        }
        if r.lat && !args.events {
            println!(" Baseline wait   : busy-polling non-blocking sockets on both ends, as we busy-poll the CQs");
        } else if r.lat {
            println!(" Baseline wait   : blocking reads on both ends, as --events sleeps on the CQs");
        }
    }
    println!("{line}");
    if r.lat {
        println!(" #bytes   #iterations  t_min[usec] t_max[usec] t_p50[usec] t_avg[usec] t_p99[usec] t_p99.9[usec]");
    } else {
        let u = Unit::of(args.report_gbits).label();
        println!(" #bytes     #iterations   BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]");
    }
}

/// The bandwidth unit of the tables: perftest's MB/sec (2^20 bytes per second) by default,
/// Gb/sec (10^9 bits per second) with --report_gbits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unit {
    MbPerSec,
    GbitPerSec,
}

impl Unit {
    pub(super) fn of(report_gbits: bool) -> Unit {
        if report_gbits { Unit::GbitPerSec } else { Unit::MbPerSec }
    }
    pub(super) fn label(self) -> &'static str {
        match self {
            Unit::MbPerSec => "MB/sec",
            Unit::GbitPerSec => "Gb/sec",
        }
    }
    pub(super) fn convert_gbit(self, gbit: f64) -> f64 {
        match self {
            Unit::MbPerSec => gbit_to_mb(gbit),
            Unit::GbitPerSec => gbit,
        }
    }
}

/// Gbit/s (10^9 bits) to perftest's MB/sec (2^20 bytes).
pub(super) fn gbit_to_mb(gbit: f64) -> f64 {
    gbit * 1e9 / 8.0 / (1u64 << 20) as f64
}
