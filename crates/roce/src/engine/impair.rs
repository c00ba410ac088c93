//! Fault injection in the UDP path, seeded, in the code production runs: absent unless the
//! device option `impair=` is given.
//!
//! ```text
//! impair=drop:0.01,reorder:0.01,dup:0.01,corrupt:0.001,ack_delay_us:500,seed:7
//! ```
//!
//! Every key is optional. The faults act on what the device *sends* (each direction of a
//! link is impaired by its sender's setting): `drop` loses a packet, `dup` sends it twice,
//! `reorder` holds it back by 50..=500 µs so later packets overtake it, `corrupt` flips one
//! bit of its ICRC (the receiver drops it and counts `icrc_err`), `ack_delay_us` holds ACK,
//! NAK and ATOMIC ACK packets back (only those) by that long. Probabilities are per packet,
//! 0..=1; `seed` fixes the sequence of decisions (default 1).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::wire::Opcode;

/// What the `impair=` option asks for.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ImpairConfig {
    /// Probability a packet is dropped.
    pub drop: f64,
    /// Probability a packet is held back so later ones overtake it.
    pub reorder: f64,
    /// Probability a packet is sent twice.
    pub dup: f64,
    /// Probability one ICRC bit of a packet is flipped.
    pub corrupt: f64,
    /// How long ACK/NAK/ATOMIC ACK packets are held back.
    pub ack_delay: Duration,
    /// The seed of the decisions.
    pub seed: u64,
}

impl ImpairConfig {
    /// Parses `drop:0.01,reorder:0.01,dup:0.01,corrupt:0.001,ack_delay_us:500,seed:7` (keys
    /// optional, any order). The error names the bad part.
    pub fn parse(s: &str) -> Result<ImpairConfig, String> {
        let mut c = ImpairConfig {
            seed: 1,
            ..ImpairConfig::default()
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once(':')
                .ok_or_else(|| format!("{part:?} is not key:value"))?;
            let prob = || -> Result<f64, String> {
                match v.parse::<f64>() {
                    Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
                    _ => Err(format!("{k}:{v}: a probability 0..=1")),
                }
            };
            match k {
                "drop" => c.drop = prob()?,
                "reorder" => c.reorder = prob()?,
                "dup" => c.dup = prob()?,
                "corrupt" => c.corrupt = prob()?,
                "ack_delay_us" => {
                    c.ack_delay = Duration::from_micros(v.parse().map_err(|_| format!("{k}:{v}: microseconds"))?)
                }
                "seed" => c.seed = v.parse().map_err(|_| format!("{k}:{v}: an integer"))?,
                _ => {
                    return Err(format!(
                        "unknown key {k:?} (drop, reorder, dup, corrupt, ack_delay_us, seed)"
                    ));
                }
            }
        }
        Ok(c)
    }
}

/// What to do with one packet.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Do not send it.
    pub drop: bool,
    /// Send it this many extra times.
    pub dup: bool,
    /// Flip this ICRC bit (0..32) after sealing.
    pub corrupt_bit: Option<u8>,
    /// Hold it until then.
    pub hold_until: Option<Instant>,
}

/// Counters of the faults injected.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ImpairStats {
    pub dropped: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub delayed_acks: u64,
}

struct Held {
    at: Instant,
    seq: u64,
    to: SocketAddr,
    pkt: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// The impairment state of one device.
pub(crate) struct Impair {
    cfg: ImpairConfig,
    rng: StdRng,
    held: BinaryHeap<Reverse<Held>>,
    seq: u64,
    pub stats: ImpairStats,
}

impl Impair {
    pub(crate) fn new(cfg: ImpairConfig) -> Impair {
        Impair {
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            held: BinaryHeap::new(),
            seq: 0,
            stats: ImpairStats::default(),
        }
    }

    /// Decides the fate of a packet whose first octet is the BTH opcode.
    pub(crate) fn judge(&mut self, now: Instant, pkt: &[u8]) -> Verdict {
        let mut v = Verdict::default();
        let c = self.cfg;
        if c.drop > 0.0 && self.rng.random_bool(c.drop) {
            self.stats.dropped += 1;
            v.drop = true;
            return v;
        }
        if c.corrupt > 0.0 && self.rng.random_bool(c.corrupt) {
            self.stats.corrupted += 1;
            v.corrupt_bit = Some(self.rng.random_range(0..32));
        }
        if c.dup > 0.0 && self.rng.random_bool(c.dup) {
            self.stats.duplicated += 1;
            v.dup = true;
        }
        let op = Opcode(pkt.first().copied().unwrap_or(0));
        if !c.ack_delay.is_zero() && (op == Opcode::RC_ACKNOWLEDGE || op == Opcode::RC_ATOMIC_ACKNOWLEDGE) {
            self.stats.delayed_acks += 1;
            v.hold_until = Some(now + c.ack_delay);
        } else if c.reorder > 0.0 && self.rng.random_bool(c.reorder) {
            self.stats.reordered += 1;
            v.hold_until = Some(now + Duration::from_micros(self.rng.random_range(50..=500)));
        }
        v
    }

    /// Keeps a sealed packet until `at`.
    pub(crate) fn hold(&mut self, at: Instant, to: SocketAddr, pkt: &[u8]) {
        self.seq += 1;
        self.held.push(Reverse(Held {
            at,
            seq: self.seq,
            to,
            pkt: pkt.to_vec(),
        }));
    }

    /// Held packets due at `now`, in order.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = Vec::new();
        while self.held.peek().is_some_and(|Reverse(h)| h.at <= now) {
            let Reverse(h) = self.held.pop().expect("peeked");
            out.push((h.to, h.pkt));
        }
        out
    }

    /// When the next held packet is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.held.peek().map(|Reverse(h)| h.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_syntax() {
        let c = ImpairConfig::parse("drop:0.01,reorder:0.01,dup:0.01,corrupt:0.001,ack_delay_us:500,seed:7").unwrap();
        assert_eq!(
            c,
            ImpairConfig {
                drop: 0.01,
                reorder: 0.01,
                dup: 0.01,
                corrupt: 0.001,
                ack_delay: Duration::from_micros(500),
                seed: 7
            }
        );
        assert_eq!(ImpairConfig::parse("drop:0.1").unwrap().seed, 1);
        for bad in ["drop", "drop:2", "lose:0.1", "seed:x", "ack_delay_us:-1"] {
            assert!(ImpairConfig::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn same_seed_same_decisions() {
        let c = ImpairConfig::parse("drop:0.3,dup:0.2,corrupt:0.1,reorder:0.2,seed:9").unwrap();
        let now = Instant::now();
        let run = || {
            let mut i = Impair::new(c);
            (0..200).map(|_| i.judge(now, &[0x0a])).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
        let drops = run().iter().filter(|v| v.drop).count();
        assert!((30..=90).contains(&drops), "{drops} drops of 200 at 0.3");
    }

    #[test]
    fn ack_delay_holds_only_acks() {
        let mut i = Impair::new(ImpairConfig::parse("ack_delay_us:500").unwrap());
        let now = Instant::now();
        assert!(i.judge(now, &[Opcode::RC_ACKNOWLEDGE.0]).hold_until.is_some());
        assert!(i.judge(now, &[Opcode::RC_RDMA_WRITE_ONLY.0]).hold_until.is_none());
    }
}
