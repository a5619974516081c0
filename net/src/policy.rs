//! The spec's network policy, compiled: where a guest flow may go, which DNS answers are
//! delivered, the addresses pinned by `allow_domains`, and the connection caps.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::time::Instant;

use ipnet::IpNet;

use crate::{NetworkPolicy, Protocol, DNS_IP, GATEWAY_IP, MAX_PINNED};

/// The reasons in [`crate::Denial::reason`] (short fixed strings).
pub mod reasons {
    /// `GATEWAY_IP:PORT` with a port not in `allow_host_ports`.
    pub const HOST_PORT_NOT_ALLOWED: &str = "host port not allowed";
    /// `DNS_IP` on a port other than 53.
    pub const NOT_DNS_PORT: &str = "dns address, port not 53";
    /// Another address of the guest network 10.0.2.0/24.
    pub const GUEST_NETWORK: &str = "guest network";
    /// Port 0.
    pub const PORT_ZERO: &str = "port 0";
    /// A `deny` entry matched.
    pub const DENY_LIST: &str = "deny list";
    /// 127.0.0.0/8, `::1`.
    pub const LOOPBACK: &str = "loopback";
    /// 10/8, 172.16/12, 192.168/16, fc00::/7.
    pub const PRIVATE_RANGE: &str = "private range";
    /// 169.254.169.254, the cloud metadata address.
    pub const METADATA: &str = "metadata address";
    /// 169.254/16, fe80::/10.
    pub const LINK_LOCAL: &str = "link-local";
    /// 100.64/10, the CGNAT shared address space.
    pub const CGNAT: &str = "cgnat range";
    /// 224/4, ff00::/8.
    pub const MULTICAST: &str = "multicast";
    /// 0/8, 240/4, 255.255.255.255, `::`.
    pub const RESERVED: &str = "reserved range";
    /// `::ffff:0:0/96`.
    pub const IPV4_MAPPED: &str = "ipv4-mapped";
    /// `allow_domains` is set and the address was not resolved for an allowed name.
    pub const NOT_RESOLVED_ALLOWED_DOMAIN: &str = "not a resolved allowed domain";
    /// `max_connections` concurrent flows reached.
    pub const MAX_CONNECTIONS: &str = "max_connections";
    /// `connections_per_second` exceeded.
    pub const CONNECTIONS_PER_SECOND: &str = "connections_per_second";
    /// DNS question for a name outside `allow_domains` (answered NXDOMAIN).
    pub const DOMAIN_NOT_ALLOWED: &str = "domain not allowed";
    /// DNS answer whose addresses all lie in denied ranges (answered NXDOMAIN).
    pub const ANSWER_DENIED: &str = "answer in denied range";
    /// ICMP echo while the host forbids unprivileged ping sockets (`net.ipv4.ping_group_range`).
    pub const PING_UNAVAILABLE: &str = "ping sockets unavailable";
    /// `public_egress` is off: only allowed gateway ports are reachable, DNS answers REFUSED.
    pub const NO_EGRESS: &str = "no_egress";
    /// TCP to a service's address ([`crate::ServiceRoute`]) on a port it does not list; the
    /// reason is this text, a space and the service's name (`not a port of service web`).
    pub const NOT_SERVICE_PORT: &str = "not a port of service";
}

/// Where an allowed guest flow goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The host's loopback (`GATEWAY_IP:PORT` → `127.0.0.1:PORT`).
    Host(SocketAddrV4),
    /// The NAT's DNS proxy.
    Dns,
    /// Out through a host socket to this address.
    Outside(SocketAddrV4),
}

/// One `allow_domains` entry.
#[derive(Debug, Clone)]
enum DomainPattern {
    /// Exactly this name.
    Exact(String),
    /// Strict subdomains: the suffix starts with a dot (`*.example.com` → `.example.com`).
    Subdomains(String),
}

/// The compiled policy and its runtime state.
pub(crate) struct PolicyState {
    host_ports: BTreeSet<u16>,
    allow: Vec<IpNet>,
    deny: Vec<IpNet>,
    domains: Vec<DomainPattern>,
    pinned: PinSet,
    max_connections: usize,
    bucket: TokenBucket,
    public_egress: bool,
}

impl PolicyState {
    pub(crate) fn new(policy: &NetworkPolicy) -> PolicyState {
        let domains = policy
            .allow_domains
            .iter()
            .filter_map(|d| {
                let d = normalize_name(d);
                if let Some(suffix) = d.strip_prefix("*.") {
                    Some(DomainPattern::Subdomains(format!(".{suffix}")))
                } else if d.is_empty() {
                    None
                } else {
                    Some(DomainPattern::Exact(d))
                }
            })
            .collect();
        PolicyState {
            host_ports: policy.allow_host_ports.iter().copied().collect(),
            allow: policy.allow.clone(),
            deny: policy.deny.clone(),
            domains,
            pinned: PinSet::default(),
            max_connections: usize::try_from(policy.max_connections).unwrap_or(usize::MAX),
            bucket: TokenBucket::new(policy.connections_per_second),
            public_egress: policy.public_egress,
        }
    }

    /// Where a new guest flow to `dst:port` goes, or why it is denied (steps 1–7 of the
    /// policy order; the caps are [`PolicyState::admit`]). ICMP passes `port` 0.
    pub(crate) fn route(
        &self,
        dst: Ipv4Addr,
        port: u16,
        protocol: Protocol,
    ) -> Result<Route, &'static str> {
        let icmp = protocol == Protocol::Icmp;
        if dst == GATEWAY_IP {
            return if !icmp && self.host_ports.contains(&port) {
                Ok(Route::Host(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)))
            } else {
                Err(reasons::HOST_PORT_NOT_ALLOWED)
            };
        }
        if dst == DNS_IP {
            return if !icmp && port == 53 {
                Ok(Route::Dns)
            } else {
                Err(reasons::NOT_DNS_PORT)
            };
        }
        if !self.public_egress {
            return Err(reasons::NO_EGRESS);
        }
        if in_guest_network(dst) {
            return Err(reasons::GUEST_NETWORK);
        }
        if !icmp && port == 0 {
            return Err(reasons::PORT_ZERO);
        }
        let ip = IpAddr::V4(dst);
        if self.deny.iter().any(|n| n.contains(&ip)) {
            return Err(reasons::DENY_LIST);
        }
        if let Some(reason) = default_deny(ip) {
            if !self.allow.iter().any(|n| n.contains(&ip)) {
                return Err(reason);
            }
        }
        if !self.domains.is_empty() && !self.pinned.contains(&ip) {
            return Err(reasons::NOT_RESOLVED_ALLOWED_DOMAIN);
        }
        Ok(Route::Outside(SocketAddrV4::new(dst, port)))
    }

    /// Whether a DNS answer pointing at `ip` is removed: a `deny` match, or a default-deny
    /// range not exempted by `allow`.
    pub(crate) fn address_denied(&self, ip: IpAddr) -> bool {
        if self.deny.iter().any(|n| n.contains(&ip)) {
            return true;
        }
        default_deny(ip).is_some() && !self.allow.iter().any(|n| n.contains(&ip))
    }

    /// False when `public_egress` is off (DNS questions are answered REFUSED).
    pub(crate) fn public_egress(&self) -> bool {
        self.public_egress
    }

    /// True when `allow_domains` is set.
    pub(crate) fn has_domains(&self) -> bool {
        !self.domains.is_empty()
    }

    /// Whether the normalized name matches an `allow_domains` entry.
    pub(crate) fn domain_allowed(&self, name: &str) -> bool {
        self.domains.iter().any(|p| match p {
            DomainPattern::Exact(d) => name == d,
            DomainPattern::Subdomains(suffix) => {
                name.len() > suffix.len() && name.ends_with(suffix)
            }
        })
    }

    /// Pins an address answered for an allowed name (false when the pin table is full).
    pub(crate) fn pin(&mut self, ip: IpAddr) -> bool {
        self.pinned.insert(ip)
    }

    pub(crate) fn pinned_len(&self) -> usize {
        self.pinned.len()
    }

    /// Admits one more flow when `active` flows exist (step 7), taking a rate token.
    pub(crate) fn admit(&mut self, active: usize, now: Instant) -> Result<(), &'static str> {
        if active >= self.max_connections {
            return Err(reasons::MAX_CONNECTIONS);
        }
        if !self.bucket.take(now) {
            return Err(reasons::CONNECTIONS_PER_SECOND);
        }
        Ok(())
    }
}

/// Lower case, no trailing dot.
pub(crate) fn normalize_name(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

fn in_guest_network(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    (a, b, c) == (10, 0, 2)
}

/// The default-deny class of `ip`, if any.
pub(crate) fn default_deny(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => default_deny_v4(v4),
        IpAddr::V6(v6) => default_deny_v6(v6),
    }
}

fn default_deny_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, d] = ip.octets();
    match (a, b) {
        (0, _) => Some(reasons::RESERVED),
        (127, _) => Some(reasons::LOOPBACK),
        (10, _) => Some(reasons::PRIVATE_RANGE),
        (172, 16..=31) => Some(reasons::PRIVATE_RANGE),
        (192, 168) => Some(reasons::PRIVATE_RANGE),
        (169, 254) if (c, d) == (169, 254) => Some(reasons::METADATA),
        (169, 254) => Some(reasons::LINK_LOCAL),
        (100, 64..=127) => Some(reasons::CGNAT),
        (224..=239, _) => Some(reasons::MULTICAST),
        (240..=255, _) => Some(reasons::RESERVED),
        _ => None,
    }
}

fn default_deny_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let seg = ip.segments();
    if ip.is_unspecified() {
        Some(reasons::RESERVED)
    } else if ip.is_loopback() {
        Some(reasons::LOOPBACK)
    } else if seg[0] & 0xfe00 == 0xfc00 {
        Some(reasons::PRIVATE_RANGE)
    } else if seg[0] & 0xffc0 == 0xfe80 {
        Some(reasons::LINK_LOCAL)
    } else if seg[0] & 0xff00 == 0xff00 {
        Some(reasons::MULTICAST)
    } else if ip.to_ipv4_mapped().is_some() {
        Some(reasons::IPV4_MAPPED)
    } else {
        None
    }
}

/// A set of at most [`MAX_PINNED`] addresses. Sorted, not hashed: std's hash maps seed
/// themselves with `getrandom` on first use per thread, a syscall the network thread lacks.
#[derive(Default)]
struct PinSet(BTreeSet<IpAddr>);

impl PinSet {
    fn insert(&mut self, ip: IpAddr) -> bool {
        if self.0.contains(&ip) {
            return true;
        }
        if self.0.len() >= MAX_PINNED {
            return false;
        }
        self.0.insert(ip)
    }

    fn contains(&self, ip: &IpAddr) -> bool {
        self.0.contains(ip)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A token bucket of `rate` tokens per second holding at most `rate` (starts full).
struct TokenBucket {
    rate: u64,
    /// Tokens in millionths.
    micros: u64,
    last: Option<Instant>,
}

impl TokenBucket {
    fn new(rate: u32) -> TokenBucket {
        let rate = u64::from(rate);
        TokenBucket {
            rate,
            micros: rate.saturating_mul(1_000_000),
            last: None,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let cap = self.rate.saturating_mul(1_000_000);
        if let Some(last) = self.last {
            let elapsed =
                u64::try_from(now.saturating_duration_since(last).as_micros()).unwrap_or(u64::MAX);
            self.micros = self
                .micros
                .saturating_add(elapsed.saturating_mul(self.rate))
                .min(cap);
        }
        if self.last.is_none_or(|l| now > l) {
            self.last = Some(now);
        }
        if self.micros >= 1_000_000 {
            self.micros -= 1_000_000;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn state(policy: NetworkPolicy) -> PolicyState {
        PolicyState::new(&policy)
    }

    #[test]
    fn order_gateway_dns_guest_net() {
        let p = state(NetworkPolicy {
            allow_host_ports: vec![8080],
            ..NetworkPolicy::default()
        });
        assert_eq!(
            p.route(GATEWAY_IP, 8080, Protocol::Tcp),
            Ok(Route::Host(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080)))
        );
        assert_eq!(
            p.route(GATEWAY_IP, 22, Protocol::Tcp),
            Err(reasons::HOST_PORT_NOT_ALLOWED)
        );
        assert_eq!(p.route(DNS_IP, 53, Protocol::Udp), Ok(Route::Dns));
        assert_eq!(
            p.route(DNS_IP, 54, Protocol::Udp),
            Err(reasons::NOT_DNS_PORT)
        );
        assert_eq!(
            p.route(Ipv4Addr::new(10, 0, 2, 9), 80, Protocol::Tcp),
            Err(reasons::GUEST_NETWORK)
        );
        assert_eq!(
            p.route(Ipv4Addr::new(93, 184, 216, 34), 443, Protocol::Tcp),
            Ok(Route::Outside(SocketAddrV4::new(
                Ipv4Addr::new(93, 184, 216, 34),
                443
            )))
        );
    }

    #[test]
    fn default_denies_and_allow_exceptions() {
        let p = state(NetworkPolicy::default());
        for (ip, reason) in [
            ("127.0.0.1", reasons::LOOPBACK),
            ("10.1.2.3", reasons::PRIVATE_RANGE),
            ("172.20.0.1", reasons::PRIVATE_RANGE),
            ("192.168.1.1", reasons::PRIVATE_RANGE),
            ("169.254.169.254", reasons::METADATA),
            ("169.254.1.1", reasons::LINK_LOCAL),
            ("100.64.0.1", reasons::CGNAT),
            ("224.0.0.251", reasons::MULTICAST),
            ("255.255.255.255", reasons::RESERVED),
            ("0.1.2.3", reasons::RESERVED),
        ] {
            let ip: Ipv4Addr = ip.parse().unwrap();
            assert_eq!(p.route(ip, 80, Protocol::Tcp), Err(reason), "{ip}");
            assert!(p.address_denied(IpAddr::V4(ip)), "{ip}");
        }
        for ip in [
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:1.2.3.4",
            "::",
            "ff02::1",
        ] {
            assert!(p.address_denied(ip.parse().unwrap()), "{ip}");
        }
        assert!(!p.address_denied("2606:4700::1111".parse().unwrap()));
        assert!(!p.address_denied("1.1.1.1".parse().unwrap()));
        assert!(!p.address_denied("172.32.0.1".parse().unwrap()));

        let p = state(NetworkPolicy {
            allow: vec!["10.9.0.0/16".parse().unwrap()],
            deny: vec![
                "10.9.9.0/24".parse().unwrap(),
                "8.8.8.8/32".parse().unwrap(),
            ],
            ..NetworkPolicy::default()
        });
        assert!(p
            .route(Ipv4Addr::new(10, 9, 1, 1), 80, Protocol::Tcp)
            .is_ok());
        assert_eq!(
            p.route(Ipv4Addr::new(10, 9, 9, 1), 80, Protocol::Tcp),
            Err(reasons::DENY_LIST)
        );
        assert_eq!(
            p.route(Ipv4Addr::new(8, 8, 8, 8), 53, Protocol::Udp),
            Err(reasons::DENY_LIST)
        );
        assert!(!p.address_denied("10.9.1.1".parse().unwrap()));
        assert!(p.address_denied("10.9.9.1".parse().unwrap()));
    }

    #[test]
    fn domains_and_pinning() {
        let mut p = state(NetworkPolicy {
            allow_domains: vec!["API.GitHub.com.".into(), "*.example.com".into()],
            allow: vec!["127.0.0.0/8".parse().unwrap()],
            ..NetworkPolicy::default()
        });
        assert!(p.domain_allowed("api.github.com"));
        assert!(!p.domain_allowed("github.com"));
        assert!(p.domain_allowed("a.example.com"));
        assert!(p.domain_allowed("a.b.example.com"));
        assert!(!p.domain_allowed("example.com"));
        assert!(!p.domain_allowed("badexample.com"));
        let ip = Ipv4Addr::new(1, 2, 3, 4);
        assert_eq!(
            p.route(ip, 443, Protocol::Tcp),
            Err(reasons::NOT_RESOLVED_ALLOWED_DOMAIN)
        );
        // `allow` does not bypass the pinning.
        assert_eq!(
            p.route(Ipv4Addr::LOCALHOST, 443, Protocol::Tcp),
            Err(reasons::NOT_RESOLVED_ALLOWED_DOMAIN)
        );
        assert!(p.pin(IpAddr::V4(ip)));
        assert!(p.route(ip, 443, Protocol::Tcp).is_ok());
        assert!(p.route(ip, 0, Protocol::Icmp).is_ok());
    }

    #[test]
    fn no_public_egress_leaves_only_gateway_ports_and_dns() {
        let p = state(NetworkPolicy {
            allow_host_ports: vec![41000],
            allow: vec!["0.0.0.0/0".parse().unwrap()],
            public_egress: false,
            ..NetworkPolicy::default()
        });
        assert!(!p.public_egress());
        assert_eq!(
            p.route(GATEWAY_IP, 41000, Protocol::Tcp),
            Ok(Route::Host(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 41000)))
        );
        assert_eq!(
            p.route(GATEWAY_IP, 22, Protocol::Tcp),
            Err(reasons::HOST_PORT_NOT_ALLOWED)
        );
        assert_eq!(p.route(DNS_IP, 53, Protocol::Udp), Ok(Route::Dns));
        for (ip, port, proto) in [
            (Ipv4Addr::new(93, 184, 216, 34), 443, Protocol::Tcp),
            (Ipv4Addr::new(8, 8, 8, 8), 53, Protocol::Udp),
            (Ipv4Addr::new(1, 1, 1, 1), 0, Protocol::Icmp),
            (Ipv4Addr::LOCALHOST, 41000, Protocol::Tcp),
            (Ipv4Addr::new(10, 0, 2, 9), 80, Protocol::Tcp),
        ] {
            assert_eq!(
                p.route(ip, port, proto),
                Err(reasons::NO_EGRESS),
                "{ip}:{port} ({proto:?}), even with `allow: 0.0.0.0/0`"
            );
        }
        assert!(state(NetworkPolicy::default()).public_egress());
    }

    #[test]
    fn caps_and_token_bucket() {
        let mut p = state(NetworkPolicy {
            max_connections: 3,
            connections_per_second: 2,
            ..NetworkPolicy::default()
        });
        let t0 = Instant::now();
        assert_eq!(p.admit(3, t0), Err(reasons::MAX_CONNECTIONS));
        assert_eq!(p.admit(0, t0), Ok(()));
        assert_eq!(p.admit(0, t0), Ok(()));
        assert_eq!(p.admit(0, t0), Err(reasons::CONNECTIONS_PER_SECOND));
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(p.admit(0, t1), Ok(()), "one token refilled in 500 ms");
        assert_eq!(p.admit(0, t1), Err(reasons::CONNECTIONS_PER_SECOND));
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(p.admit(0, t2), Ok(()));
        assert_eq!(p.admit(0, t2), Ok(()));
        assert_eq!(
            p.admit(0, t2),
            Err(reasons::CONNECTIONS_PER_SECOND),
            "burst capped at the rate"
        );
    }
}
