//! Command-line sizes: `64`, `4K`, `1M`, `2G`, `1.5M` (K, M, G, T are powers of 1024, also
//! written `KiB`, `KB`, `k`), shared by every subcommand that takes one; parsed by the
//! `parse-size` crate in binary mode.

/// A size in bytes, or why `s` is not one (including a size beyond `u64`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| match e {
            parse_size::Error::PosOverflow => format!("size {s:?} too large"),
            _ => format!("bad size {s:?} (examples: 64, 4K, 1M)"),
        })
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
        assert_eq!(parse_size("1.5M"), Ok(3 << 19));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        for bad in ["", "K", "x", "-1", "4Q"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert!(parse_size("18446744073709551615K").unwrap_err().contains("too large"));
    }
}
