//! The DNS upstreams the NAT forwards the guest's queries to: `VOIDBOX_DNS_UPSTREAMS`, a
//! comma-separated list of `IP[:PORT]` (IPv6 as `[ADDR]:PORT` or a bare address; port 53 by
//! default). Unset or empty: the NAT reads the host's `/etc/resolv.conf`.

use std::net::{IpAddr, SocketAddr};

/// The environment variable naming the DNS upstreams.
pub const DNS_UPSTREAMS_ENV: &str = "VOIDBOX_DNS_UPSTREAMS";

/// Most upstreams accepted.
pub const MAX_UPSTREAMS: usize = 8;

/// Parses an upstream list (`1.1.1.1, 127.0.0.1:5353, [::1]:53`). Empty or blank: none.
pub fn parse(list: &str) -> Result<Vec<SocketAddr>, String> {
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for item in list.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!(
                "`{list}` has an empty entry (write `IP[:PORT]` entries separated by commas)"
            ));
        }
        let addr = match item.parse::<SocketAddr>() {
            Ok(a) => a,
            Err(_) => match item
                .strip_prefix('[')
                .and_then(|i| i.strip_suffix(']'))
                .unwrap_or(item)
                .parse::<IpAddr>()
            {
                Ok(ip) => SocketAddr::new(ip, 53),
                Err(_) => {
                    return Err(format!(
                        "`{item}` is not `IP[:PORT]` (for example `127.0.0.1:5353`, `1.1.1.1` or `[::1]:53`; names are not accepted)"
                    ))
                }
            },
        };
        if addr.port() == 0 {
            return Err(format!("`{item}`: port 0 is not a DNS server's port"));
        }
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    if out.len() > MAX_UPSTREAMS {
        return Err(format!(
            "{} upstreams given; at most {MAX_UPSTREAMS} are used",
            out.len()
        ));
    }
    Ok(out)
}

/// The upstreams of `VOIDBOX_DNS_UPSTREAMS` (none when unset); `Err` is a message naming the
/// variable, for an exit before any VM starts.
pub fn from_env() -> Result<Vec<SocketAddr>, String> {
    match std::env::var_os(DNS_UPSTREAMS_ENV) {
        None => Ok(Vec::new()),
        Some(v) => {
            let text = v
                .into_string()
                .map_err(|_| format!("{DNS_UPSTREAMS_ENV} is not valid UTF-8"))?;
            parse(&text).map_err(|e| format!("{DNS_UPSTREAMS_ENV}: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_with_and_without_ports() {
        let got = parse(" 127.0.0.1:5353,1.1.1.1 , [::1]:5300, ::1, [::2]").unwrap();
        let want: Vec<SocketAddr> = [
            "127.0.0.1:5353",
            "1.1.1.1:53",
            "[::1]:5300",
            "[::1]:53",
            "[::2]:53",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(got, want);
        assert!(parse("").unwrap().is_empty());
        assert!(parse("  ").unwrap().is_empty());
        assert_eq!(parse("1.1.1.1,1.1.1.1").unwrap().len(), 1);
    }

    #[test]
    fn bad_entries_are_errors() {
        assert!(parse("dns.google").unwrap_err().contains("`dns.google`"));
        assert!(parse("1.1.1.1,").unwrap_err().contains("empty entry"));
        assert!(parse("1.1.1.1:0").unwrap_err().contains("port 0"));
        assert!(parse("1.1.1.1:99999").is_err());
        assert!(parse("::1:53:x").is_err());
        assert!(parse("[1.1.1.1]:53").is_err());
        let many: Vec<String> = (1..=9).map(|i| format!("10.0.0.{i}")).collect();
        assert!(parse(&many.join(",")).unwrap_err().contains("at most 8"));
    }
}
