//! Sizes and ages as people write and read them: `16MiB` in flags and specs, `1.5M` and
//! `3h` in listings.

use std::time::SystemTime;

/// Parses a size like `16MiB`, `512k`, `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size `{s}`"))?;
    let mul: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("invalid size unit in `{s}` (use K, M or G)")),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

/// A duration as `12.3s`.
pub fn secs(d: std::time::Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Seconds since `created` (seconds since the epoch).
pub fn age(created: u64) -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs().saturating_sub(created))
        .unwrap_or_default()
}

/// `1.5M`-style sizes.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "K", "M", "G"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// `5m`, `3h`, `2d`-style ages.
pub fn human_age(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("x").is_err());
        assert!(parse_size("5T").is_err());
    }

    #[test]
    fn sizes_and_ages() {
        assert_eq!(human_size(512), "512B");
        assert_eq!(human_size(1536), "1.5K");
        assert_eq!(human_size(17 * 1024 * 1024), "17.0M");
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(7200), "2h");
    }
}
