//! The spec's network policy (`sandbox.network`) as the spec language sees it: the
//! ranges it accepts, the checks of its values ([`checks`]) and its one-line summary in
//! `voidbox graph`. The policy type and its meaning are `voidbox-net`'s ([`NetworkPolicy`]); this
//! crate links only its types, not the NAT.

pub mod checks;

use std::fmt::Write as _;

pub use voidbox_net::NetworkPolicy;

/// Largest `max_connections` (concurrent connections and UDP flows per VM).
pub const MAX_CONNECTIONS_LIMIT: u32 = 65_535;
/// Largest `connections_per_second` (new connections and UDP flows per second per VM).
pub const CONNECTIONS_PER_SECOND_LIMIT: u32 = 10_000;

// The NAT's defaults lie within the ranges the spec accepts.
const _: () = assert!(
    voidbox_net::DEFAULT_MAX_CONNECTIONS >= 1
        && voidbox_net::DEFAULT_MAX_CONNECTIONS <= MAX_CONNECTIONS_LIMIT
        && voidbox_net::DEFAULT_CONNECTIONS_PER_SECOND >= 1
        && voidbox_net::DEFAULT_CONNECTIONS_PER_SECOND <= CONNECTIONS_PER_SECOND_LIMIT
);

/// A one-line summary of a policy for `voidbox graph`: `network` for the default policy,
/// else `network(…)` with what differs from it.
pub fn summary(policy: &NetworkPolicy) -> String {
    let d = NetworkPolicy::default();
    let mut parts: Vec<String> = Vec::new();
    let list = |items: Vec<String>| {
        let n = items.len();
        let mut s = items.into_iter().take(3).collect::<Vec<_>>().join(", ");
        if n > 3 {
            let _ = write!(s, " +{} more", n - 3);
        }
        s
    };
    if !policy.allow_host_ports.is_empty() {
        let ports = policy.allow_host_ports.iter().map(u16::to_string).collect();
        parts.push(format!("host ports {}", list(ports)));
    }
    if !policy.allow_domains.is_empty() {
        parts.push(format!("domains {}", list(policy.allow_domains.clone())));
    }
    if !policy.allow.is_empty() {
        let nets = policy.allow.iter().map(ToString::to_string).collect();
        parts.push(format!("allow {}", list(nets)));
    }
    if !policy.deny.is_empty() {
        let nets = policy.deny.iter().map(ToString::to_string).collect();
        parts.push(format!("deny {}", list(nets)));
    }
    if policy.max_connections != d.max_connections {
        parts.push(format!("max {} conns", policy.max_connections));
    }
    if policy.connections_per_second != d.connections_per_second {
        parts.push(format!("{} conns/s", policy.connections_per_second));
    }
    if parts.is_empty() {
        "network".to_string()
    } else {
        format!("network({})", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_what_differs_from_the_default() {
        assert_eq!(summary(&NetworkPolicy::default()), "network");
        let p = NetworkPolicy {
            allow_host_ports: vec![11434, 8080, 3000, 5000],
            allow_domains: vec!["api.github.com".into()],
            deny: vec!["198.51.100.0/24".parse().unwrap()],
            max_connections: 64,
            ..NetworkPolicy::default()
        };
        assert_eq!(
            summary(&p),
            "network(host ports 11434, 8080, 3000 +1 more; domains api.github.com; deny 198.51.100.0/24; max 64 conns)"
        );
    }
}
