//! DNS upstreams from the host's `/etc/resolv.conf` (read only in `Nat::new`).

use std::net::{IpAddr, SocketAddr};

use crate::NatError;

const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The `nameserver` addresses of a resolv.conf text, port 53 (scoped IPv6 addresses such as
/// `fe80::1%eth0` are skipped).
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            if words.next() != Some("nameserver") {
                return None;
            }
            let ip: IpAddr = words.next()?.parse().ok()?;
            Some(SocketAddr::new(ip, 53))
        })
        .collect()
}

/// The host's upstreams, or [`NatError::NoDnsUpstream`].
pub(crate) fn host_upstreams() -> Result<Vec<SocketAddr>, NatError> {
    let text = std::fs::read_to_string(RESOLV_CONF)
        .map_err(|e| NatError::NoDnsUpstream(format!("{RESOLV_CONF}: {e}")))?;
    let upstreams = parse_resolv_conf(&text);
    if upstreams.is_empty() {
        return Err(NatError::NoDnsUpstream(format!(
            "no usable nameserver line in {RESOLV_CONF}"
        )));
    }
    Ok(upstreams)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameserver_lines() {
        let text = "# generated\nsearch example.com\nnameserver 127.0.0.53\n nameserver  8.8.8.8 # google\nnameserver fe80::1%eth0\nnameserver 2001:4860:4860::8888\nnameserver\nnameservers 1.1.1.1\noptions edns0\n";
        let got = parse_resolv_conf(text);
        let want: Vec<SocketAddr> = ["127.0.0.53:53", "8.8.8.8:53", "[2001:4860:4860::8888]:53"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(got, want);
        assert!(parse_resolv_conf("").is_empty());
    }
}
