//! Command-line sizes: `64`, `4K`, `1M`, `2G` (powers of 1024), optionally ending in `B` or
//! `iB` (`4KiB`, `1MB`), shared by every subcommand that takes one.

/// A size in bytes, or why `s` is not one (including a size beyond `u64`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?} (examples: 64, 4K, 1M)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} too large"))
}

/// A count of at least 1 (iterations, calls), as a clap value parser.
pub fn count(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

#[cfg(test)]
mod tests {
    use super::{count, parse_size};

    #[test]
    fn counts() {
        assert_eq!(count("3"), Ok(3));
        assert!(count("0").unwrap_err().contains("at least 1"));
        assert!(count("-1").is_err());
    }

    #[test]
    fn sizes() {
        for (s, v) in [
            ("64", 64),
            (" 4K ", 4096),
            ("4k", 4096),
            ("4KiB", 4096),
            ("1M", 1 << 20),
            ("1MB", 1 << 20),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        for bad in ["", "K", "x", "1T", "-1", "1.5M"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert!(parse_size("18446744073709551615K").unwrap_err().contains("too large"));
    }
}
