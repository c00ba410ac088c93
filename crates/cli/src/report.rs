//! The JSON that `bench`, `rpc bench` and `perftest` print with `--json`: one schema for the
//! family, documented in docs/json.md and built with `serde` derive.
//!
//! Units are the same everywhere: bandwidth as `mb_per_s` (perftest's MB: 2^20 bytes per
//! second) and `gbit_per_s` (10^9 bits per second), message rates as `msg_per_s`, latencies
//! in microseconds in a [`Latency`] object with the figures the tables show.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Bytes per second in perftest's MB/sec (2^20 bytes).
pub fn mb_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / (1u64 << 20) as f64
}

/// Bytes per second in Gbit/s (10^9 bits).
pub fn gbit_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s * 8.0 / 1e9
}

/// A bandwidth in both units.
#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth {
    pub mb_per_s: f64,
    pub gbit_per_s: f64,
}

impl Bandwidth {
    pub fn of_bytes_per_s(b: f64) -> Bandwidth {
        Bandwidth {
            mb_per_s: mb_per_s(b),
            gbit_per_s: gbit_per_s(b),
        }
    }
}

/// A latency distribution in microseconds: what the latency tables show.
#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub min_us: f64,
    pub max_us: f64,
    pub avg_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

impl Latency {
    /// From a histogram of nanoseconds.
    pub fn of_ns(h: &Histogram<u64>) -> Latency {
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Latency {
            min_us: h.min() as f64 / 1000.0,
            max_us: h.max() as f64 / 1000.0,
            avg_us: h.mean() / 1000.0,
            p50_us: us(0.5),
            p99_us: us(0.99),
            p999_us: us(0.999),
        }
    }
}

/// One JSON object on one line of stdout.
pub fn print_line<T: Serialize>(v: &T) {
    println!("{}", serde_json::to_string(v).expect("a JSON report serializes"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        let b = Bandwidth::of_bytes_per_s(1048576.0 * 125.0);
        assert_eq!(b.mb_per_s, 125.0);
        assert!((b.gbit_per_s - 1.048576).abs() < 1e-12);
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for ns in [1000, 2000, 3000, 4000] {
            h.record(ns).unwrap();
        }
        let l = Latency::of_ns(&h);
        // The histogram keeps 3 significant digits.
        let close = |a: f64, b: f64| (a - b).abs() <= b * 1e-3;
        assert!(
            close(l.min_us, 1.0) && close(l.max_us, 4.0) && close(l.avg_us, 2.5),
            "{l:?}"
        );
        assert!(close(l.p50_us, 2.0), "{l:?}");
        let v = serde_json::to_value(l).unwrap();
        for k in ["min_us", "max_us", "avg_us", "p50_us", "p99_us", "p999_us"] {
            assert!(v[k].is_number(), "{k}");
        }
    }
}
