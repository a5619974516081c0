//! The checks of a network policy's values, shared by `validate` (located diagnostics) and
//! the `voidbox run` flags: CIDRs, domain names and duplicate ports. Ranges of ports and
//! caps are the schema's (and clap's) job.

use std::net::IpAddr;

use ipnet::IpNet;

/// Why a value is refused, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What is wrong with the value.
    pub message: String,
    /// A suggestion (`did you mean …?`), when there is one.
    pub help: Option<String>,
}

impl Problem {
    fn new(message: impl Into<String>, help: impl Into<Option<String>>) -> Problem {
        Problem {
            message: message.into(),
            help: help.into(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(h) = &self.help {
            write!(f, "; {h}")?;
        }
        Ok(())
    }
}

/// Parses a CIDR (`10.0.0.0/8`, `fd00::/8`). A bare address, a prefix length too long for
/// the family and host bits set under the prefix are refused, each with a suggestion.
pub fn cidr(s: &str) -> Result<IpNet, Problem> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        return Err(Problem::new(
            format!("`{s}` is an address, not a CIDR"),
            format!("write `{ip}/{max}` for this one address"),
        ));
    }
    let Some((addr, len)) = s.split_once('/') else {
        return Err(Problem::new(
            format!("`{s}` is not a CIDR"),
            "write an address and a prefix length, for example `10.0.0.0/8` or `fd00::/8`"
                .to_string(),
        ));
    };
    let Ok(ip) = addr.parse::<IpAddr>() else {
        return Err(Problem::new(
            format!("`{s}` is not a CIDR: `{addr}` is not an IPv4 or IPv6 address"),
            "write an address and a prefix length, for example `10.0.0.0/8` or `fd00::/8`"
                .to_string(),
        ));
    };
    let max: u8 = if ip.is_ipv4() { 32 } else { 128 };
    let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    let Some(prefix) = len
        .parse::<u8>()
        .ok()
        .filter(|p| *p <= max && !len.starts_with('+'))
    else {
        return Err(Problem::new(
            format!("`{s}` is not a CIDR: the prefix length `{len}` is not 0..={max} ({family})"),
            None,
        ));
    };
    let net = IpNet::new(ip, prefix).map_err(|_| {
        Problem::new(
            format!("`{s}` is not a CIDR: the prefix length `{len}` is not 0..={max} ({family})"),
            None,
        )
    })?;
    if net.trunc() != net {
        return Err(Problem::new(
            format!("`{s}` has host bits set below its /{prefix} prefix"),
            format!(
                "did you mean `{}` (the whole network), or `{ip}/{max}` (this address only)?",
                net.trunc()
            ),
        ));
    }
    Ok(net)
}

/// Checks an `allow_domains` entry: a DNS name (`api.github.com`), or `*.` followed by one
/// (`*.example.com`: its subdomains). No scheme, port, path, trailing dot or IP address.
/// Returns the name in lowercase.
pub fn domain(s: &str) -> Result<String, Problem> {
    let mistyped = |what: &str| {
        let help = host_part(s)
            .filter(|h| h != s && domain(h).is_ok())
            .map(|h| format!("did you mean `{h}`?"))
            .unwrap_or_else(|| "write a name such as `api.github.com` or `*.example.com`".into());
        Problem::new(format!("`{s}` is not a domain name: {what}"), help)
    };
    if s.is_empty() {
        return Err(Problem::new(
            "a domain name must not be empty",
            "write a name such as `api.github.com` or `*.example.com`".to_string(),
        ));
    }
    if s.contains("://") {
        return Err(mistyped("it has a URL scheme"));
    }
    if s.parse::<IpAddr>().is_ok()
        || s.strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .is_some_and(|r| r.parse::<IpAddr>().is_ok())
    {
        return Err(Problem::new(
            format!("`{s}` is an IP address, not a domain name"),
            "`allow_domains` lists names; with it set, only addresses its names resolve to are reachable (`allow` takes CIDRs)".to_string(),
        ));
    }
    if s.contains('/') {
        return Err(mistyped("it has a path"));
    }
    if s.contains(':') {
        return Err(mistyped(
            "it has a port (any port of an allowed name is reachable)",
        ));
    }
    if s.contains('@') {
        return Err(mistyped("it has a user name"));
    }
    if let Some(stripped) = s.strip_suffix('.') {
        if !stripped.is_empty() && domain(stripped).is_ok() {
            return Err(Problem::new(
                format!("`{s}` ends with a dot"),
                format!("did you mean `{stripped}`?"),
            ));
        }
    }
    let name = s.strip_prefix("*.").unwrap_or(s);
    if name.contains('*') {
        return Err(Problem::new(
            format!("`{s}` is not a domain name: `*` is allowed only as a whole leading label"),
            "write `*.example.com` for every subdomain of example.com".to_string(),
        ));
    }
    if name.len() > 253 {
        return Err(Problem::new(
            format!(
                "`{}…` is not a domain name: it is {} characters long (at most 253)",
                s.chars().take(40).collect::<String>(),
                s.len()
            ),
            None,
        ));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() {
            return Err(Problem::new(
                format!("`{s}` is not a domain name: it has an empty label"),
                None,
            ));
        }
        if label.len() > 63 {
            return Err(Problem::new(
                format!(
                    "`{s}` is not a domain name: the label `{label}` is longer than 63 characters"
                ),
                None,
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(Problem::new(
                format!("`{s}` is not a domain name: `{c}` is not allowed in a name"),
                "names use letters, digits and `-` (internationalised names in their `xn--` form)"
                    .to_string(),
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(Problem::new(
                format!("`{s}` is not a domain name: the label `{label}` starts or ends with `-`"),
                None,
            ));
        }
    }
    if labels
        .last()
        .is_some_and(|tld| tld.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(Problem::new(
            format!("`{s}` is not a domain name: its last label is a number"),
            None,
        ));
    }
    Ok(s.to_ascii_lowercase())
}

/// The host of a URL-ish string (`https://user@h:443/x` → `h`), if any.
fn host_part(s: &str) -> Option<String> {
    let rest = s.split_once("://").map_or(s, |(_, r)| r);
    let rest = rest.split('/').next()?;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = match rest.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => rest,
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// The indices of ports listed twice, each with the index of its first occurrence.
pub fn duplicate_ports(ports: &[u16]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        if let Some(first) = ports[..i].iter().position(|q| q == p) {
            out.push((i, first));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn help(r: Result<impl std::fmt::Debug, Problem>) -> String {
        r.expect_err("refused").help.unwrap_or_default()
    }

    #[test]
    fn cidrs_parse_both_families() {
        assert_eq!(cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(cidr("0.0.0.0/0").unwrap().to_string(), "0.0.0.0/0");
        assert_eq!(cidr("fd00::/8").unwrap().to_string(), "fd00::/8");
        assert_eq!(cidr("2001:db8::1/128").unwrap().prefix_len(), 128);
        assert_eq!(cidr("192.0.2.7/32").unwrap().prefix_len(), 32);
    }

    #[test]
    fn host_bits_suggest_the_network_and_the_address() {
        assert_eq!(
            help(cidr("10.0.0.1/8")),
            "did you mean `10.0.0.0/8` (the whole network), or `10.0.0.1/32` (this address only)?"
        );
        assert!(help(cidr("fd00::1/8")).contains("`fd00::/8`"));
        let p = cidr("10.0.0.1/8").unwrap_err();
        assert!(p.message.contains("host bits"), "{p:?}");
    }

    #[test]
    fn malformed_cidrs_say_why() {
        assert_eq!(
            help(cidr("10.1.2.3")),
            "write `10.1.2.3/32` for this one address"
        );
        assert_eq!(help(cidr("::1")), "write `::1/128` for this one address");
        assert!(cidr("10.0.0.0/33").unwrap_err().message.contains("0..=32"));
        assert!(cidr("fd00::/129").unwrap_err().message.contains("0..=128"));
        assert!(cidr("10.0.0.0/+8").is_err());
        assert!(cidr("10.0.0.0/").is_err());
        assert!(cidr("10.0.0/8")
            .unwrap_err()
            .message
            .contains("not an IPv4 or IPv6"));
        assert!(cidr("example.com/8").is_err());
        assert!(cidr("").is_err());
        assert!(cidr(" 10.0.0.0/8").is_err());
    }

    #[test]
    fn domains() {
        assert_eq!(domain("api.github.com").unwrap(), "api.github.com");
        assert_eq!(domain("*.Example.COM").unwrap(), "*.example.com");
        assert_eq!(domain("localhost").unwrap(), "localhost");
        assert_eq!(
            domain("xn--bcher-kva.example").unwrap(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            help(domain("https://api.github.com/repos")),
            "did you mean `api.github.com`?"
        );
        assert_eq!(
            help(domain("api.github.com:443")),
            "did you mean `api.github.com`?"
        );
        assert_eq!(help(domain("example.com/x")), "did you mean `example.com`?");
        assert_eq!(help(domain("example.com.")), "did you mean `example.com`?");
        assert!(domain("1.2.3.4")
            .unwrap_err()
            .message
            .contains("IP address"));
        assert!(domain("[::1]").unwrap_err().message.contains("IP address"));
        assert!(domain("a.*.com")
            .unwrap_err()
            .message
            .contains("leading label"));
        assert!(domain("*example.com").is_err());
        assert!(domain("*").is_err());
        assert!(domain("*.").is_err());
        assert!(domain("a..b").unwrap_err().message.contains("empty label"));
        assert!(domain("-a.com").is_err());
        assert!(domain("a_b.com").unwrap_err().message.contains("`_`"));
        assert!(domain(&format!("{}.com", "a".repeat(64))).is_err());
        assert!(domain(&"a.".repeat(130)).is_err());
        assert!(domain("example.123").is_err());
        assert!(domain("").is_err());
    }

    #[test]
    fn duplicates_point_at_the_repeat() {
        assert_eq!(duplicate_ports(&[80, 443, 80, 80]), [(2, 0), (3, 0)]);
        assert!(duplicate_ports(&[1, 2, 3]).is_empty());
    }
}
