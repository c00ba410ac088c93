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

/// An SMC-R RMB element size: a [`parse_size`] that is a power of two from 16 KiB to
/// 512 KiB (the CLC's compressed sizes 0..5, requirements A1.6), as a clap value parser.
pub fn rmbe_size(s: &str) -> Result<u32, String> {
    let n = parse_size(s)?;
    if !(16 << 10..=512 << 10).contains(&n) || !n.is_power_of_two() {
        return Err(format!(
            "RMB element size {s:?}: must be a power of two from 16K to 512K (16K, 32K, 64K, 128K, 256K, 512K)"
        ));
    }
    Ok(n as u32)
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
    use super::{count, parse_size, rmbe_size};

    #[test]
    fn rmbe_sizes_are_the_clc_ones_a1_6() {
        assert_eq!(rmbe_size("16K"), Ok(16 << 10));
        assert_eq!(rmbe_size("65536"), Ok(64 << 10));
        assert_eq!(rmbe_size("512KiB"), Ok(512 << 10));
        for bad in ["8K", "1M", "100000", "48K", "0", "x"] {
            assert!(rmbe_size(bad).is_err(), "{bad}");
        }
    }

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
