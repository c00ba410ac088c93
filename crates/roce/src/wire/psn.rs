//! Packet sequence numbers: 24-bit, modulo 2^24 (IBA vol. 1 §9.7.1, unconfirmed; C3 "PSN is
//! 24-bit and wraps").
//!
//! Comparisons split the PSN space in halves around a reference, as the IBA does for the
//! responder's check of a request PSN against its expected PSN (ePSN): the 2^23 PSNs before
//! ePSN are duplicates, ePSN is the valid one, and the rest (ahead of ePSN) are out of
//! sequence. Linux rxe's `psn_compare` (the difference shifted into the top 24 bits of an
//! i32) gives the same halves.

use core::fmt;

/// A PSN, always below 2^24.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

/// Where a request's PSN falls relative to the responder's expected PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PsnClass {
    /// PSN == ePSN: execute it.
    Expected,
    /// One of the 2^23 PSNs before ePSN: a duplicate (re-ACK, re-execute a Read, replay an
    /// Atomic).
    Duplicate,
    /// Ahead of ePSN: a PSN sequence error (NAK with code 0, once per sequence error).
    OutOfSequence,
}

impl Psn {
    /// 2^24 - 1.
    pub const MASK: u32 = 0x00ff_ffff;
    /// Half of the PSN space, 2^23.
    pub const HALF: u32 = 1 << 23;

    /// The PSN of `v`, masked to 24 bits.
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The 24-bit PSN value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The following PSN (0xffffff wraps to 0).
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// This PSN advanced by `n` packets, modulo 2^24.
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// This PSN moved back by `n` packets, modulo 2^24.
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The signed distance from `from` to `self` in packets, in `-2^23 ..= 2^23 - 1`:
    /// positive when `self` is ahead of `from`.
    pub const fn distance(self, from: Psn) -> i32 {
        // Put the 24-bit difference in the top of an i32 and shift back arithmetically.
        ((self.0.wrapping_sub(from.0) << 8) as i32) >> 8
    }

    /// `self` comes strictly before `other` (within half the space).
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance(other) < 0
    }

    /// `self` comes strictly after `other` (within half the space).
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance(other) > 0
    }

    /// The responder's classification of a request PSN against its expected PSN.
    pub const fn classify(self, epsn: Psn) -> PsnClass {
        match self.distance(epsn) {
            0 => PsnClass::Expected,
            d if d < 0 => PsnClass::Duplicate,
            _ => PsnClass::OutOfSequence,
        }
    }

    /// `self` lies in the window of `len` PSNs that starts at `first`:
    /// `first <= self < first + len` modulo 2^24 (e.g. the PSNs a requester has sent and not
    /// yet seen acknowledged). A window longer than 2^24 holds every PSN.
    pub const fn in_window(self, first: Psn, len: u32) -> bool {
        len > Self::MASK || self.0.wrapping_sub(first.0) & Self::MASK < len
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_at_2_pow_24_c3() {
        // C3: "PSN is 24-bit and wraps".
        let top = Psn::new(0xff_ffff);
        assert_eq!(top.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert_eq!(Psn::new(0x0100_0005), Psn::new(5));
        assert_eq!(top.add(3).value(), 2);
        assert_eq!(Psn::new(2).distance(top), 3);
        assert_eq!(top.distance(Psn::new(2)), -3);
        assert!(top.is_before(Psn::new(2)));
        assert!(Psn::new(2).is_after(top));
    }

    #[test]
    fn halves_of_the_space() {
        let e = Psn::new(100);
        assert_eq!(e.classify(e), PsnClass::Expected);
        assert_eq!(Psn::new(99).classify(e), PsnClass::Duplicate);
        assert_eq!(Psn::new(101).classify(e), PsnClass::OutOfSequence);
        // exactly 2^23 behind: still a duplicate; 2^23 - 1 ahead: out of sequence
        assert_eq!(e.sub(Psn::HALF).classify(e), PsnClass::Duplicate);
        assert_eq!(e.add(Psn::HALF - 1).classify(e), PsnClass::OutOfSequence);
        assert_eq!(e.sub(Psn::HALF).distance(e), -(1 << 23));
    }

    #[test]
    fn windows() {
        let first = Psn::new(0xff_fffe);
        assert!(first.in_window(first, 1));
        assert!(!first.in_window(first, 0));
        assert!(Psn::new(1).in_window(first, 4));
        assert!(!Psn::new(2).in_window(first, 4));
        assert!(!Psn::new(0xff_fffd).in_window(first, 4));
        assert!(Psn::new(12345).in_window(first, 1 << 24));
    }

    proptest! {
        #[test]
        fn distance_inverts_add(a in 0u32..1 << 24, n in 0u32..Psn::HALF) {
            let p = Psn::new(a);
            prop_assert_eq!(p.add(n).distance(p), n as i32);
            prop_assert_eq!(p.sub(n).distance(p), -(n as i32));
            prop_assert_eq!(p.add(n).sub(n), p);
            prop_assert!(p.add(n).in_window(p, n + 1));
            prop_assert!(!p.add(n).in_window(p, n));
        }

        #[test]
        fn distance_is_antisymmetric_except_at_the_half(a in 0u32..1 << 24, b in 0u32..1 << 24) {
            let (a, b) = (Psn::new(a), Psn::new(b));
            let d = a.distance(b);
            prop_assert!((-(1 << 23)..1 << 23).contains(&d));
            if d != -(1 << 23) {
                prop_assert_eq!(b.distance(a), -d);
            }
            prop_assert_eq!(b.add(d as u32), a);
        }
    }
}
