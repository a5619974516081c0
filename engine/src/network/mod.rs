//! Guest networking as the engine sees it: the policy checks `validate` and `voidbox run`
//! share ([`checks`]), the DNS upstreams from the environment ([`upstreams`]), the
//! `voidbox run` flags ([`flags`]), the guest's boot parameter and the NAT config of a node.
//!
//! The NAT itself (and the policy's meaning) is `voidbox-net`; a node without network has no
//! network device at all.

pub mod flags;
pub mod publish;
pub mod services;

pub use voidbox_spec::network_policy::{
    checks, summary, CONNECTIONS_PER_SECOND_LIMIT, MAX_CONNECTIONS_LIMIT,
};
pub mod upstreams;

use std::net::SocketAddr;

use voidbox_net::{Denial, NatConfig, NetworkPolicy, DNS_IP, GATEWAY_IP, GUEST_IP, PREFIX_LEN};

/// The kernel parameter the guest agent configures its interface from:
/// `voidbox.net=10.0.2.15/24,10.0.2.2,10.0.2.3` (address/prefix, gateway, DNS server).
pub fn boot_param() -> String {
    format!("voidbox.net={GUEST_IP}/{PREFIX_LEN},{GATEWAY_IP},{DNS_IP}")
}

/// The NAT config of a VM with `policy`, resolving names through `dns_upstreams` (empty:
/// the host's `/etc/resolv.conf`).
pub fn nat_config(policy: NetworkPolicy, dns_upstreams: &[SocketAddr]) -> NatConfig {
    NatConfig {
        policy,
        dns_upstreams: dns_upstreams.to_vec(),
        guest_mac: voidbox_net::DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix: Vec::new(),
        services: Vec::new(),
    }
}

/// The name in [`creator_policy`]'s `allow_domains`: `.invalid` never resolves (RFC 6761).
const NOTHING_RESOLVES: &str = "voidbox.invalid";

/// The policy of a golden-snapshot creator VM (it only runs `sh -c true`): every address
/// denied, no host port, and DNS answered only for a name that never resolves. The VMs
/// restored from the snapshot build their own NAT from their own policy.
pub fn creator_policy() -> NetworkPolicy {
    NetworkPolicy {
        allow_host_ports: Vec::new(),
        allow_domains: vec![NOTHING_RESOLVES.to_string()],
        allow: Vec::new(),
        deny: vec![
            ipnet::IpNet::V4(ipnet::Ipv4Net::default()),
            ipnet::IpNet::V6(ipnet::Ipv6Net::default()),
        ],
        max_connections: 1,
        connections_per_second: 1,
        public_egress: true,
    }
}

/// Denials as short lines (`10.0.0.5:22/tcp: private range ×3`), at most `max` of them
/// (most frequent first) and a last line counting the rest.
pub fn denial_lines(denials: &[Denial], max: usize) -> Vec<String> {
    let mut sorted: Vec<&Denial> = denials.iter().collect();
    sorted.sort_by_key(|d| std::cmp::Reverse(d.count));
    let proto = |d: &Denial| match d.protocol {
        voidbox_net::Protocol::Tcp => "tcp",
        voidbox_net::Protocol::Udp => "udp",
        voidbox_net::Protocol::Icmp => "icmp",
        voidbox_net::Protocol::Dns => "dns",
    };
    let mut out: Vec<String> = sorted
        .iter()
        .take(max)
        .map(|d| {
            let dest = match d.protocol {
                voidbox_net::Protocol::Dns | voidbox_net::Protocol::Icmp => d.destination.clone(),
                _ if d.destination.contains(':') => format!("[{}]:{}", d.destination, d.port),
                _ => format!("{}:{}", d.destination, d.port),
            };
            format!("{dest}/{}: {} ×{}", proto(d), d.reason, d.count)
        })
        .collect();
    if sorted.len() > max {
        out.push(format!("… and {} more", sorted.len() - max));
    }
    out
}

/// Total number of denied attempts.
pub fn denial_total(denials: &[Denial]) -> u64 {
    denials.iter().map(|d| d.count).fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_param_is_the_fixed_addressing() {
        assert_eq!(boot_param(), "voidbox.net=10.0.2.15/24,10.0.2.2,10.0.2.3");
    }

    #[test]
    fn creator_policy_denies_every_address() {
        let p = creator_policy();
        assert!(p.allow_host_ports.is_empty() && p.allow.is_empty());
        let all: Vec<String> = p.deny.iter().map(ToString::to_string).collect();
        assert_eq!(all, ["0.0.0.0/0", "::/0"]);
        assert!(checks::domain(&p.allow_domains[0]).is_ok());
    }

    #[test]
    fn denial_lines_most_frequent_first() {
        let d = |dest: &str, port, protocol, count| Denial {
            destination: dest.into(),
            port,
            protocol,
            reason: "private range".into(),
            count,
        };
        let list = [
            d("10.0.0.5", 22, voidbox_net::Protocol::Tcp, 1),
            d("fd00::1", 80, voidbox_net::Protocol::Tcp, 5),
            d("evil.example", 0, voidbox_net::Protocol::Dns, 2),
        ];
        assert_eq!(
            denial_lines(&list, 2),
            [
                "[fd00::1]:80/tcp: private range ×5",
                "evil.example/dns: private range ×2",
                "… and 1 more"
            ]
        );
        assert_eq!(denial_total(&list), 8);
    }
}
