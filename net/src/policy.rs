//! The spec's network policy, compiled: where a guest flow may go, which DNS answers are
//! delivered, the addresses pinned by `allow_domains`, and the connection caps.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::time::Instant;

use ipnet::IpNet;

use crate::host_addrs::HostAddrs;
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
    /// 240/4 (reserved for future use), `::`.
    pub const RESERVED: &str = "reserved range";
    /// 0/8, "this network" (Linux connects 0.0.0.0 to the host itself).
    pub const THIS_NETWORK: &str = "this network";
    /// 255.255.255.255.
    pub const LIMITED_BROADCAST: &str = "limited broadcast";
    /// 192.0.0.0/24, IETF protocol assignments.
    pub const PROTOCOL_ASSIGNMENTS: &str = "protocol assignments";
    /// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 (TEST-NET-1, -2, -3).
    pub const DOCUMENTATION: &str = "documentation range";
    /// 198.18.0.0/15, benchmarking.
    pub const BENCHMARKING: &str = "benchmarking range";
    /// An address of one of the host's own interfaces (read when the NAT starts, re-read
    /// before new flows). Opened only by an `allow` entry naming exactly that address.
    pub const HOST: &str = "host";
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
    host: HostAddrs,
}

impl PolicyState {
    /// The policy, with `host` as the host's own addresses.
    pub(crate) fn new(policy: &NetworkPolicy, host: HostAddrs) -> PolicyState {
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
            host,
        }
    }

    /// Where a new guest flow to `dst:port` goes, or why it is denied (steps 1–7 of the
    /// policy order; the caps are [`PolicyState::admit`]). ICMP passes `port` 0. The host's
    /// addresses are re-read first when the last read is older than
    /// [`crate::host_addrs::REFRESH`].
    pub(crate) fn route(
        &mut self,
        dst: Ipv4Addr,
        port: u16,
        protocol: Protocol,
        now: Instant,
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
        self.host.refresh(now);
        if self.host_denied(ip) {
            return Err(reasons::HOST);
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
        if self.deny.iter().any(|n| n.contains(&ip)) || self.host_denied(ip) {
            return true;
        }
        default_deny(ip).is_some() && !self.allow.iter().any(|n| n.contains(&ip))
    }

    /// A host address not named alone by an `allow` entry (`HOST/32`): a range that
    /// happens to contain the host, such as `0.0.0.0/0` or `10.0.0.0/8`, does not open it.
    /// Loopback addresses keep their own reason ([`reasons::LOOPBACK`]) and rule.
    fn host_denied(&self, ip: IpAddr) -> bool {
        !ip.is_loopback()
            && self.host.contains(ip)
            && !self
                .allow
                .iter()
                .any(|n| n.prefix_len() == n.max_prefix_len() && n.addr() == ip)
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
        (0, _) => Some(reasons::THIS_NETWORK),
        (127, _) => Some(reasons::LOOPBACK),
        (10, _) => Some(reasons::PRIVATE_RANGE),
        (172, 16..=31) => Some(reasons::PRIVATE_RANGE),
        (192, 168) => Some(reasons::PRIVATE_RANGE),
        (169, 254) if (c, d) == (169, 254) => Some(reasons::METADATA),
        (169, 254) => Some(reasons::LINK_LOCAL),
        (100, 64..=127) => Some(reasons::CGNAT),
        (192, 0) if c == 0 => Some(reasons::PROTOCOL_ASSIGNMENTS),
        (192, 0) if c == 2 => Some(reasons::DOCUMENTATION),
        (198, 51) if c == 100 => Some(reasons::DOCUMENTATION),
        (203, 0) if c == 113 => Some(reasons::DOCUMENTATION),
        (198, 18..=19) => Some(reasons::BENCHMARKING),
        (224..=239, _) => Some(reasons::MULTICAST),
        (255, 255) if (c, d) == (255, 255) => Some(reasons::LIMITED_BROADCAST),
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
        PolicyState::new(&policy, HostAddrs::fixed(&[]))
    }

    #[test]
    fn order_gateway_dns_guest_net() {
        let mut p = state(NetworkPolicy {
            allow_host_ports: vec![8080],
            ..NetworkPolicy::default()
        });
        assert_eq!(
            p.route(GATEWAY_IP, 8080, Protocol::Tcp, Instant::now()),
            Ok(Route::Host(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080)))
        );
        assert_eq!(
            p.route(GATEWAY_IP, 22, Protocol::Tcp, Instant::now()),
            Err(reasons::HOST_PORT_NOT_ALLOWED)
        );
        assert_eq!(
            p.route(DNS_IP, 53, Protocol::Udp, Instant::now()),
            Ok(Route::Dns)
        );
        assert_eq!(
            p.route(DNS_IP, 54, Protocol::Udp, Instant::now()),
            Err(reasons::NOT_DNS_PORT)
        );
        assert_eq!(
            p.route(
                Ipv4Addr::new(10, 0, 2, 9),
                80,
                Protocol::Tcp,
                Instant::now()
            ),
            Err(reasons::GUEST_NETWORK)
        );
        assert_eq!(
            p.route(
                Ipv4Addr::new(93, 184, 216, 34),
                443,
                Protocol::Tcp,
                Instant::now()
            ),
            Ok(Route::Outside(SocketAddrV4::new(
                Ipv4Addr::new(93, 184, 216, 34),
                443
            )))
        );
    }

    #[test]
    fn default_denies_and_allow_exceptions() {
        let mut p = state(NetworkPolicy::default());
        for (ip, reason) in [
            ("127.0.0.1", reasons::LOOPBACK),
            ("10.1.2.3", reasons::PRIVATE_RANGE),
            ("172.20.0.1", reasons::PRIVATE_RANGE),
            ("192.168.1.1", reasons::PRIVATE_RANGE),
            ("169.254.169.254", reasons::METADATA),
            ("169.254.1.1", reasons::LINK_LOCAL),
            ("100.64.0.1", reasons::CGNAT),
            ("224.0.0.251", reasons::MULTICAST),
            ("255.255.255.255", reasons::LIMITED_BROADCAST),
            ("255.255.255.254", reasons::RESERVED),
            ("240.0.0.1", reasons::RESERVED),
            ("0.1.2.3", reasons::THIS_NETWORK),
            ("0.0.0.0", reasons::THIS_NETWORK),
            ("192.0.0.8", reasons::PROTOCOL_ASSIGNMENTS),
            ("192.0.2.2", reasons::DOCUMENTATION),
            ("198.51.100.9", reasons::DOCUMENTATION),
            ("203.0.113.7", reasons::DOCUMENTATION),
            ("198.18.0.1", reasons::BENCHMARKING),
            ("198.19.255.255", reasons::BENCHMARKING),
            ("239.255.255.250", reasons::MULTICAST),
        ] {
            let ip: Ipv4Addr = ip.parse().unwrap();
            assert_eq!(
                p.route(ip, 80, Protocol::Tcp, Instant::now()),
                Err(reason),
                "{ip}"
            );
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
        // The neighbours of the special-purpose ranges are public.
        for ip in [
            "192.0.1.255",
            "192.0.3.0",
            "192.0.1.1",
            "198.51.99.1",
            "198.51.101.1",
            "203.0.112.1",
            "203.0.114.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
        ] {
            let ip: Ipv4Addr = ip.parse().unwrap();
            assert!(!p.address_denied(IpAddr::V4(ip)), "{ip}");
            assert!(
                p.route(ip, 80, Protocol::Tcp, Instant::now()).is_ok(),
                "{ip}"
            );
        }

        let mut p = state(NetworkPolicy {
            allow: vec!["10.9.0.0/16".parse().unwrap()],
            deny: vec![
                "10.9.9.0/24".parse().unwrap(),
                "8.8.8.8/32".parse().unwrap(),
            ],
            ..NetworkPolicy::default()
        });
        assert!(p
            .route(
                Ipv4Addr::new(10, 9, 1, 1),
                80,
                Protocol::Tcp,
                Instant::now()
            )
            .is_ok());
        assert_eq!(
            p.route(
                Ipv4Addr::new(10, 9, 9, 1),
                80,
                Protocol::Tcp,
                Instant::now()
            ),
            Err(reasons::DENY_LIST)
        );
        assert_eq!(
            p.route(Ipv4Addr::new(8, 8, 8, 8), 53, Protocol::Udp, Instant::now()),
            Err(reasons::DENY_LIST)
        );
        assert!(!p.address_denied("10.9.1.1".parse().unwrap()));
        assert!(p.address_denied("10.9.9.1".parse().unwrap()));
    }

    #[test]
    fn allow_opens_each_special_purpose_range() {
        for (net, ip) in [
            ("0.0.0.0/8", "0.0.0.1"),
            ("192.0.0.0/24", "192.0.0.9"),
            ("192.0.2.0/24", "192.0.2.2"),
            ("198.51.100.0/24", "198.51.100.9"),
            ("203.0.113.0/24", "203.0.113.7"),
            ("198.18.0.0/15", "198.19.1.1"),
            ("240.0.0.0/4", "240.0.0.1"),
            ("255.255.255.255/32", "255.255.255.255"),
            ("224.0.0.0/4", "224.0.0.251"),
        ] {
            let mut p = state(NetworkPolicy {
                allow: vec![net.parse().unwrap()],
                ..NetworkPolicy::default()
            });
            let ip: Ipv4Addr = ip.parse().unwrap();
            assert!(
                p.route(ip, 80, Protocol::Udp, Instant::now()).is_ok(),
                "{net}"
            );
            assert!(!p.address_denied(IpAddr::V4(ip)), "{net}");
        }
    }

    #[test]
    fn host_addresses_are_denied_unless_named_alone() {
        let host: Ipv4Addr = "93.184.216.34".parse().unwrap();
        let doc: Ipv4Addr = "192.0.2.2".parse().unwrap();
        let addrs = [
            IpAddr::V4(host),
            IpAddr::V4(doc),
            "2001:db8::2".parse().unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        ];
        let with = |allow: &[&str]| {
            PolicyState::new(
                &NetworkPolicy {
                    allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
                    allow_host_ports: vec![8080],
                    ..NetworkPolicy::default()
                },
                HostAddrs::fixed(&addrs),
            )
        };
        let now = Instant::now();
        // Public or special-purpose, any protocol: `host`, whatever range `allow` opens.
        for allow in [
            &[][..],
            &["0.0.0.0/0"],
            &["93.184.216.0/24", "192.0.2.0/24"],
        ] {
            let mut p = with(allow);
            for ip in [host, doc] {
                for (port, proto) in [
                    (80, Protocol::Tcp),
                    (53, Protocol::Udp),
                    (0, Protocol::Icmp),
                ] {
                    assert_eq!(
                        p.route(ip, port, proto, now),
                        Err(reasons::HOST),
                        "{ip} {allow:?}"
                    );
                }
                assert!(p.address_denied(IpAddr::V4(ip)), "{ip} {allow:?}");
            }
            assert!(p.address_denied("2001:db8::2".parse().unwrap()));
            assert!(p.address_denied("::ffff:93.184.216.34".parse().unwrap()));
            // Only the gateway reaches the host, on an allowed port.
            assert_eq!(
                p.route(GATEWAY_IP, 8080, Protocol::Tcp, now),
                Ok(Route::Host(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080)))
            );
            // Other addresses of the same public network are not the host.
            assert!(p
                .route("93.184.216.35".parse().unwrap(), 80, Protocol::Tcp, now)
                .is_ok());
        }
        // Loopback keeps its reason, and `allow: 127.0.0.0/8` still opens it.
        let mut p = with(&[]);
        assert_eq!(
            p.route(Ipv4Addr::LOCALHOST, 80, Protocol::Tcp, now),
            Err(reasons::LOOPBACK)
        );
        let mut p = with(&["127.0.0.0/8"]);
        assert!(p.route(Ipv4Addr::LOCALHOST, 80, Protocol::Tcp, now).is_ok());
        // The deny list still has its own reason.
        let mut p = PolicyState::new(
            &NetworkPolicy {
                deny: vec!["93.184.216.0/24".parse().unwrap()],
                ..NetworkPolicy::default()
            },
            HostAddrs::fixed(&addrs),
        );
        assert_eq!(
            p.route(host, 80, Protocol::Tcp, now),
            Err(reasons::DENY_LIST)
        );
        // An `allow` entry naming exactly one host address opens that one.
        let mut p = with(&["93.184.216.34/32"]);
        assert!(p.route(host, 80, Protocol::Tcp, now).is_ok());
        assert!(!p.address_denied(IpAddr::V4(host)));
        assert_eq!(p.route(doc, 80, Protocol::Tcp, now), Err(reasons::HOST));
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
            p.route(ip, 443, Protocol::Tcp, Instant::now()),
            Err(reasons::NOT_RESOLVED_ALLOWED_DOMAIN)
        );
        // `allow` does not bypass the pinning.
        assert_eq!(
            p.route(Ipv4Addr::LOCALHOST, 443, Protocol::Tcp, Instant::now()),
            Err(reasons::NOT_RESOLVED_ALLOWED_DOMAIN)
        );
        assert!(p.pin(IpAddr::V4(ip)));
        assert!(p.route(ip, 443, Protocol::Tcp, Instant::now()).is_ok());
        assert!(p.route(ip, 0, Protocol::Icmp, Instant::now()).is_ok());
    }

    #[test]
    fn no_public_egress_leaves_only_gateway_ports_and_dns() {
        let mut p = state(NetworkPolicy {
            allow_host_ports: vec![41000],
            allow: vec!["0.0.0.0/0".parse().unwrap()],
            public_egress: false,
            ..NetworkPolicy::default()
        });
        assert!(!p.public_egress());
        assert_eq!(
            p.route(GATEWAY_IP, 41000, Protocol::Tcp, Instant::now()),
            Ok(Route::Host(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 41000)))
        );
        assert_eq!(
            p.route(GATEWAY_IP, 22, Protocol::Tcp, Instant::now()),
            Err(reasons::HOST_PORT_NOT_ALLOWED)
        );
        assert_eq!(
            p.route(DNS_IP, 53, Protocol::Udp, Instant::now()),
            Ok(Route::Dns)
        );
        for (ip, port, proto) in [
            (Ipv4Addr::new(93, 184, 216, 34), 443, Protocol::Tcp),
            (Ipv4Addr::new(8, 8, 8, 8), 53, Protocol::Udp),
            (Ipv4Addr::new(1, 1, 1, 1), 0, Protocol::Icmp),
            (Ipv4Addr::LOCALHOST, 41000, Protocol::Tcp),
            (Ipv4Addr::new(10, 0, 2, 9), 80, Protocol::Tcp),
        ] {
            assert_eq!(
                p.route(ip, port, proto, Instant::now()),
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
