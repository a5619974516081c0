//! User-mode NAT for one voidbox micro-VM (no root, no TAP, no bridge).
//!
//! The VMM's virtio-net device hands every Ethernet frame the guest sends to [`Nat::from_guest`]
//! and delivers what [`Nat::to_guest`] returns; the NAT terminates the guest's TCP with
//! `smoltcp`, relays to host sockets, forwards UDP and ICMP echo, answers DNS at [`DNS_IP`] via
//! the host's (or a configured) resolver, and enforces a [`NetworkPolicy`] written in the spec.
//! Each VM has its own `Nat`; nothing is shared between VMs.
//!
//! # Addressing
//!
//! Guest [`GUEST_IP`]/[`PREFIX_LEN`] (MAC [`NatConfig::guest_mac`]), gateway [`GATEWAY_IP`] and
//! DNS server [`DNS_IP`], both on [`GATEWAY_MAC`]. The NAT answers ARP for those two addresses
//! only, and ICMP echo to them. `GATEWAY_IP:PORT` reaches host `127.0.0.1:PORT`, for
//! [`NetworkPolicy::allow_host_ports`] only. Every other destination is reached through a host socket
//! from the VMM process (the guest's TCP is terminated in the NAT and relayed). IPv4 only;
//! IP fragments are dropped. Services of a workflow ([`NatConfig::services`]) have addresses
//! 10.0.3.N ([`service_addr`]), reached through their Unix sockets. Every checksum of a guest
//! frame is verified, so frames must arrive complete: the VMM's virtio-net device completes
//! the checksums the guest offloads to it. Frames toward the guest always carry complete checksums (the device tells the
//! guest so, and it skips verifying them).
//!
//! # Policy order
//!
//! For every new guest→outside flow (TCP connection, UDP flow, ICMP echo), the first match wins:
//!
//! 0. TCP to the address of one of [`NatConfig::services`]: to a port it lists, connected to
//!    that port's Unix socket, whatever the steps below say (only [`MAX_PENDING_CONNECTS`]
//!    applies; a failed connect is answered with RST); to another port, denied
//!    ([`reasons::NOT_SERVICE_PORT`]). UDP and ICMP to it go on with step 1;
//! 1. destination [`GATEWAY_IP`]: allowed only for a port in [`NetworkPolicy::allow_host_ports`]
//!    (ICMP echo to it is answered by the NAT itself);
//! 2. destination [`DNS_IP`]: only port 53 (UDP and TCP), answered by the DNS proxy;
//! 3. [`NetworkPolicy::public_egress`] off: denied ([`reasons::NO_EGRESS`]); only steps 1–2 remain;
//! 4. anything else in 10.0.2.0/24: denied;
//! 5. a [`NetworkPolicy::deny`] match: denied; then an address of one of the host's own
//!    interfaces, loopback aside (read in [`Nat::new`] over netlink and re-read before a new
//!    flow once the last read is 50 ms old): denied ([`reasons::HOST`]) unless an `allow`
//!    entry is exactly that address (`/32`, `/128`);
//! 6. a default-deny range not in [`NetworkPolicy::allow`]: denied. IPv4: 0/8 (this
//!    network), 192.0.0.0/24 (protocol assignments), 192.0.2.0/24, 198.51.100.0/24 and
//!    203.0.113.0/24 (documentation), 198.18/15 (benchmarking), 240/4 (reserved),
//!    255.255.255.255 (limited broadcast), 127/8 (loopback), 10/8, 172.16/12, 192.168/16
//!    (private), 169.254/16 (link-local, with the metadata address 169.254.169.254),
//!    100.64/10 (CGNAT), 224/4 (multicast), each with its reason in [`reasons`]. IPv6 (DNS
//!    answers only): `::`, `::1`, fc00::/7, fe80::/10, ff00::/8, IPv4-mapped `::ffff:0:0/96`;
//! 7. [`NetworkPolicy::allow_domains`] non-empty and the address was not returned by this NAT's
//!    resolver for an allowed name (directly or through a CNAME chain) during this VM's life:
//!    denied (`allow` does not bypass this);
//! 8. [`NetworkPolicy::max_connections`] concurrent TCP connections + UDP flows + ICMP echo flows, or
//!    [`NetworkPolicy::connections_per_second`] (token bucket, burst of the same) exceeded: denied;
//! 9. otherwise allowed.
//!
//! A denied TCP connection gets an immediate RST, a denied UDP datagram or ICMP echo an ICMP
//! destination-unreachable (communication administratively prohibited) — never silence, except
//! for broadcast and multicast destinations. Every denial is counted in [`Nat::denials`] by
//! destination, port, protocol and reason (the strings in [`reasons`]).
//!
//! # DNS
//!
//! Queries to `DNS_IP:53` (UDP and TCP) are parsed and forwarded over UDP to
//! [`NatConfig::dns_upstreams`] (empty: the `nameserver` lines of the host's
//! `/etc/resolv.conf`), with our own query ids, a per-attempt timeout and the next upstream on
//! retry; SERVFAIL when all attempts fail. With `public_egress` off every question is answered
//! REFUSED and nothing is forwarded. A/AAAA answers in a denied range (steps 5–6) are
//! removed; when none remains the guest gets NXDOMAIN. With `allow_domains`, a question for
//! any other name gets NXDOMAIN, and the addresses answered for allowed names are pinned.
//! Before all that, the name of one of [`NatConfig::services`] (exactly, case-insensitively)
//! is answered by the NAT itself, whatever the policy: A with the service's address (TTL 5),
//! any other type NOERROR without records.
//!
//! # Limits (all bounded)
//!
//! [`TO_GUEST_QUEUE`] frames and [`TO_GUEST_QUEUE_BYTES`] bytes toward the guest (host sockets
//! are not read while it is full),
//! [`TCP_BUFFER`] bytes per direction per TCP connection (the guest's window closes when the
//! host does not take data, and host sockets are read only when there is room),
//! [`MAX_PENDING_CONNECTS`] host connects in progress ([`CONNECT_TIMEOUT`]),
//! [`UDP_IDLE_TIMEOUT`], [`DNS_MAX_IN_FLIGHT`] queries, [`DNS_TCP_MAX_SESSIONS`],
//! [`MAX_PINNED`] pinned addresses and [`MAX_DENIAL_ENTRIES`] denial entries.
//!
//! # Driving it
//!
//! One thread owns the `Nat` and loops: every guest frame → [`Nat::from_guest`]; then
//! [`Nat::poll`]; then [`Nat::to_guest`] while the guest has receive buffers; then sleep in
//! `poll(2)` on [`Nat::poll_fds`] (recomputed every round) plus its own eventfds, at most
//! [`Nat::poll_timeout`]. [`Nat::stats`] has the counters a benchmark needs (bytes relayed,
//! time spent in the NAT).
//!
//! After [`Nat::new`] the NAT reads no file, never calls `getrandom`, and makes only these
//! system calls (besides memory allocation and the vDSO clock): `socket` (all
//! `SOCK_NONBLOCK | SOCK_CLOEXEC`: `AF_INET/SOCK_STREAM/IPPROTO_TCP`,
//! `AF_INET/SOCK_DGRAM/IPPROTO_UDP`, `AF_INET6/SOCK_DGRAM/IPPROTO_UDP` for IPv6 DNS upstreams,
//! `AF_INET/SOCK_DGRAM/IPPROTO_ICMP`, and `AF_UNIX/SOCK_STREAM/0` for
//! [`NatConfig::services`]), `connect`, `getsockopt(SOL_SOCKET, SO_ERROR)`, `sendto`
//! (with `MSG_NOSIGNAL`), `recvfrom`, `shutdown(SHUT_WR)`, `close` and, with published
//! ports ([`NatConfig::publish`] and [`NatConfig::publish_unix`], bound and listening in
//! [`Nat::new`]), `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`. The `AF_NETLINK` socket that
//! re-reads the host's addresses is created in [`Nat::new`]; re-reading is a `sendto`
//! without an address and `recvfrom`.

#![forbid(unsafe_code)]

#[cfg(feature = "nat")]
mod denials;
#[cfg(feature = "nat")]
mod dns;
#[cfg(feature = "nat")]
mod dns_tcp;
#[cfg(feature = "nat")]
mod frames;
#[cfg(feature = "nat")]
pub mod fuzz;
#[cfg(feature = "nat")]
mod host;
#[cfg(feature = "nat")]
mod host_addrs;
#[cfg(feature = "nat")]
mod icmp;
#[cfg(feature = "nat")]
mod inbound;
#[cfg(feature = "nat")]
mod nat;
#[cfg(feature = "nat")]
mod phy;
#[cfg(feature = "nat")]
mod policy;
#[cfg(feature = "nat")]
mod resolv;
#[cfg(feature = "nat")]
mod services;
#[cfg(feature = "nat")]
mod stats;
#[cfg(feature = "nat")]
mod tcp;
#[cfg(all(feature = "testing", feature = "nat"))]
pub mod testing;
#[cfg(feature = "nat")]
mod udp;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "nat")]
pub use nat::Nat;
#[cfg(feature = "nat")]
pub use policy::reasons;
#[cfg(feature = "nat")]
pub use resolv::parse_resolv_conf;
#[cfg(feature = "nat")]
pub use stats::NatStats;

/// The guest's address.
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// The gateway; `GATEWAY_IP:PORT` reaches host `127.0.0.1:PORT` for allowed ports.
pub const GATEWAY_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// The NAT's DNS server.
pub const DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// Prefix length of the guest network.
pub const PREFIX_LEN: u8 = 24;
/// MAC address of the gateway and DNS server (locally administered).
pub const GATEWAY_MAC: [u8; 6] = [0x52, 0x55, 0x0a, 0x00, 0x02, 0x02];
/// Default guest MAC address (locally administered).
pub const DEFAULT_GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// Link MTU (bytes of IP packet per frame). Large on purpose: the guest kernel's per-frame
/// work is what limits throughput (on hosts that interpret guest kernel code, each frame costs
/// milliseconds), so a TCP segment of up to `MTU - 40` bytes travels as one frame. The
/// virtio-net device offers it as `VIRTIO_NET_F_MTU` and Linux sets it on the interface.
/// The largest value an IPv4 `total_len` and a 4-byte-aligned Linux MTU allow.
pub const MTU: usize = 65520;
/// Default of [`NetworkPolicy::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;
/// Default of [`NetworkPolicy::connections_per_second`].
pub const DEFAULT_CONNECTIONS_PER_SECOND: u32 = 100;

/// Network policy of one VM, as written in the spec (`sandbox.network` mapping form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Host loopback ports the guest may reach at `GATEWAY_IP:PORT` (nothing else on the host).
    #[serde(default)]
    pub allow_host_ports: Vec<u16>,
    /// When non-empty, public egress only to addresses the NAT's own resolver returned for
    /// these names during this VM's life; `*.example.com` matches subdomains only.
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// Exceptions to the default denies (private, loopback, link-local … ranges).
    #[serde(default)]
    pub allow: Vec<ipnet::IpNet>,
    /// Extra denies; they win over everything else.
    #[serde(default)]
    pub deny: Vec<ipnet::IpNet>,
    /// Most concurrent TCP connections and UDP flows.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Most new TCP connections and UDP flows per second (token bucket, burst of the same).
    #[serde(default = "default_connections_per_second")]
    pub connections_per_second: u32,
    /// Public egress (default `true`). When `false`, the guest reaches only
    /// `GATEWAY_IP:PORT` for ports in `allow_host_ports` (an agent's credential gateway):
    /// every other flow is denied with [`reasons::NO_EGRESS`], whatever `allow` says, and
    /// every DNS question is answered REFUSED.
    #[serde(default = "default_public_egress")]
    pub public_egress: bool,
}

fn default_max_connections() -> u32 {
    DEFAULT_MAX_CONNECTIONS
}
fn default_connections_per_second() -> u32 {
    DEFAULT_CONNECTIONS_PER_SECOND
}
fn default_public_egress() -> bool {
    true
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        NetworkPolicy {
            allow_host_ports: Vec::new(),
            allow_domains: Vec::new(),
            allow: Vec::new(),
            deny: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            connections_per_second: DEFAULT_CONNECTIONS_PER_SECOND,
            public_egress: true,
        }
    }
}

/// Everything a [`Nat`] needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatConfig {
    /// The policy.
    #[serde(default)]
    pub policy: NetworkPolicy,
    /// DNS upstreams; empty means the `nameserver` lines of the host's `/etc/resolv.conf`.
    #[serde(default)]
    pub dns_upstreams: Vec<SocketAddr>,
    /// The guest's MAC address.
    #[serde(default = "default_guest_mac")]
    pub guest_mac: [u8; 6],
    /// Host addresses whose TCP connections are forwarded to guest ports (`voidbox run
    /// --publish`): bound when the NAT is built, whatever the egress policy says.
    #[serde(default)]
    pub publish: Vec<Publish>,
    /// Unix-domain sockets whose connections are forwarded to guest ports (a workflow
    /// service's ports, reached by its dependents' NATs): bound when the NAT is built,
    /// whatever the egress policy says.
    #[serde(default)]
    pub publish_unix: Vec<PublishUnix>,
    /// Services this guest reaches by name ([`ServiceRoute`]): their names resolve to their
    /// addresses and TCP to their ports is connected to their sockets, whatever the egress
    /// policy says.
    #[serde(default)]
    pub services: Vec<ServiceRoute>,
}

/// One published port: TCP connections to `host` are relayed to the guest's `guest_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Publish {
    /// The host address to listen on (`127.0.0.1:8080`).
    pub host: SocketAddr,
    /// The guest's TCP port.
    pub guest_port: u16,
}

/// One published Unix socket: stream connections to the socket at `path` are relayed to the
/// guest's `guest_port` (like a [`Publish`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishUnix {
    /// Where the socket is bound (mode 0600; the file must not exist yet, and its directory
    /// should be one only this user can enter). The NAT does not remove it.
    pub path: PathBuf,
    /// The guest's TCP port.
    pub guest_port: u16,
}

/// A service the guest reaches by name: `name` resolves to `addr` (DNS A, TTL 5), and a TCP
/// connection to `addr:PORT` for one of `ports` is connected to that port's Unix socket (the
/// service VM's [`PublishUnix`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceRoute {
    /// The host name (case-insensitive; exactly this name, no search suffixes).
    pub name: String,
    /// The address it resolves to ([`service_addr`]; outside the guest's network).
    pub addr: Ipv4Addr,
    /// Its reachable ports.
    pub ports: Vec<ServicePort>,
}

/// One port of a [`ServiceRoute`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePort {
    /// The TCP port the guest connects to.
    pub port: u16,
    /// Where the connection is relayed.
    pub to: PortTarget,
}

/// Where a [`ServicePort`]'s connections go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortTarget {
    /// A Unix socket: the service VM's NAT listening in this run ([`PublishUnix`]).
    Unix(PathBuf),
    /// A TCP address: the service's node runner on another machine, relaying to its VM.
    Tcp(std::net::SocketAddr),
}

/// The address of the `index`-th service: 10.0.3.1, 10.0.3.2, … 10.0.3.254 (`None` beyond).
pub fn service_addr(index: usize) -> Option<Ipv4Addr> {
    let host = u8::try_from(index.checked_add(1)?)
        .ok()
        .filter(|&h| h < 255)?;
    Some(Ipv4Addr::new(10, 0, 3, host))
}

/// Most connections from published ports (TCP and Unix together) relayed at once; more wait
/// in the listen backlog.
pub const MAX_INBOUND: usize = 64;

fn default_guest_mac() -> [u8; 6] {
    DEFAULT_GUEST_MAC
}

/// Transport of a denied flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP connection.
    Tcp,
    /// UDP flow.
    Udp,
    /// ICMP echo.
    Icmp,
    /// DNS question (destination is the name).
    Dns,
}

/// One denied destination and how often it was denied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// Address, or the queried name for [`Protocol::Dns`].
    pub destination: String,
    /// Destination port (0 for ICMP).
    pub port: u16,
    /// Transport.
    pub protocol: Protocol,
    /// Why (`"host port not allowed"`, `"private range"`, `"not a resolved allowed domain"`,
    /// `"max_connections"`, `"connections_per_second"`, …).
    pub reason: String,
    /// How many times.
    pub count: u64,
}

/// A NAT that cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum NatError {
    /// No DNS upstream configured and none found in the host's resolv.conf.
    #[error("no DNS upstream: {0}")]
    NoDnsUpstream(String),
    /// A host socket could not be created.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A published host address could not be listened on.
    #[error("publishing {addr}: {source}")]
    Publish {
        /// The host address.
        addr: SocketAddr,
        /// Why (address in use, not local, …).
        source: std::io::Error,
    },
    /// A published Unix socket could not be bound or listened on.
    #[error("publishing unix socket {}: {source}", path.display())]
    PublishUnix {
        /// The socket path.
        path: PathBuf,
        /// Why (file exists, directory missing, path too long, …).
        source: std::io::Error,
    },
    /// The config is inconsistent (a bad service name, address or port).
    #[error("invalid network config: {0}")]
    Config(String),
}

impl NatConfig {
    /// Checks what `Nat::new` checks first: every service name is a host
    /// name (dot-separated labels of 1–63 letters, digits and hyphens, no label starting or
    /// ending with a hyphen), every service address is outside the guest's network
    /// 10.0.2.0/24 (so neither the gateway, the DNS server nor the guest), names
    /// (case-insensitively) and addresses are unique, and ports are non-zero and unique per
    /// service.
    pub fn validate(&self) -> Result<(), NatError> {
        let fail = |msg: String| Err(NatError::Config(msg));
        for p in &self.publish_unix {
            if p.guest_port == 0 {
                return fail(format!("unix socket {}: guest port 0", p.path.display()));
            }
        }
        for (i, s) in self.services.iter().enumerate() {
            if !is_host_name(&s.name) {
                return fail(format!(
                    "service name {:?} is not a host name (labels of 1-63 letters, digits and \
                     '-', not starting or ending with '-', separated by dots)",
                    s.name
                ));
            }
            let [a, b, c, _] = s.addr.octets();
            if (a, b, c) == (10, 0, 2) {
                return fail(format!(
                    "service {}: address {} is in the guest's network 10.0.2.0/{PREFIX_LEN} \
                     (gateway {GATEWAY_IP}, DNS {DNS_IP}, guest {GUEST_IP})",
                    s.name, s.addr
                ));
            }
            for earlier in &self.services[..i] {
                if earlier.name.eq_ignore_ascii_case(&s.name) {
                    return fail(format!("service {} listed twice", s.name));
                }
                if earlier.addr == s.addr {
                    return fail(format!(
                        "services {} and {} share address {}",
                        earlier.name, s.name, s.addr
                    ));
                }
            }
            for (j, p) in s.ports.iter().enumerate() {
                if p.port == 0 {
                    return fail(format!("service {}: port 0", s.name));
                }
                if s.ports[..j].iter().any(|q| q.port == p.port) {
                    return fail(format!("service {}: port {} listed twice", s.name, p.port));
                }
            }
        }
        Ok(())
    }
}

/// Dot-separated labels of 1–63 ASCII letters, digits and hyphens, none starting or ending
/// with a hyphen; 253 bytes at most.
fn is_host_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Most frames queued toward the guest; host sockets are not read while the queue is full.
pub const TO_GUEST_QUEUE: usize = 512;
/// Most bytes queued toward the guest: the queue counts as full once it holds this many, so
/// it never holds more than `TO_GUEST_QUEUE_BYTES + MTU + 13` bytes.
pub const TO_GUEST_QUEUE_BYTES: usize = 2 << 20;
/// Receive and send buffer of each relayed TCP connection, bytes per direction (a few
/// [`MTU`]-sized segments in flight each way). Worst case for TCP buffers:
/// `2 * TCP_BUFFER * max_connections` — 128 MiB at the default 256 connections; buffers are
/// zero-allocated (fresh mappings at this size), so in practice mostly the pages that held
/// relayed data cost memory. (Each host connect in progress also holds the guest's SYN frame,
/// at most `MTU + 14` bytes: 16 MiB for [`MAX_PENDING_CONNECTS`] at worst.)
pub const TCP_BUFFER: usize = 256 * 1024;
/// Most host TCP connects in progress at once (beyond: the guest's SYN is dropped and retried).
pub const MAX_PENDING_CONNECTS: usize = 256;
/// A host connect not completed by then is answered with ICMP host unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A guest TCP peer that acknowledges nothing for this long (with data or a FIN outstanding) is
/// reset.
pub const TCP_PEER_TIMEOUT: Duration = Duration::from_secs(60);
/// A UDP flow with no datagram either way for this long is closed.
pub const UDP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// An ICMP echo flow with no request or reply for this long is closed.
pub const ICMP_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most DNS queries forwarded and not yet answered (beyond: SERVFAIL at once).
pub const DNS_MAX_IN_FLIGHT: usize = 64;
/// Time to wait for one upstream before asking the next one.
pub const DNS_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Attempts per query over all upstreams before answering SERVFAIL.
pub const DNS_MAX_ATTEMPTS: u8 = 3;
/// Most concurrent DNS-over-TCP connections to `DNS_IP:53` (beyond: RST).
pub const DNS_TCP_MAX_SESSIONS: usize = 8;
/// A DNS-over-TCP connection idle for this long is reset.
pub const DNS_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most addresses pinned by `allow_domains` (later answers are delivered but not pinned).
pub const MAX_PINNED: usize = 4096;
/// Most distinct denial entries; later distinct ones are counted under destination `"other"`.
pub const MAX_DENIAL_ENTRIES: usize = 1024;
/// Largest UDP payload that fits one frame toward the guest (larger datagrams are dropped).
pub const MAX_UDP_PAYLOAD: usize = MTU - 28;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_addresses_fill_10_0_3_0() {
        assert_eq!(service_addr(0), Some(Ipv4Addr::new(10, 0, 3, 1)));
        assert_eq!(service_addr(1), Some(Ipv4Addr::new(10, 0, 3, 2)));
        assert_eq!(service_addr(253), Some(Ipv4Addr::new(10, 0, 3, 254)));
        assert_eq!(service_addr(254), None);
        assert_eq!(service_addr(usize::MAX), None);
    }

    #[test]
    fn host_names() {
        for ok in ["web", "WEB", "a", "my-db", "a.b-c.d1", &"a".repeat(63)] {
            assert!(is_host_name(ok), "{ok}");
        }
        for bad in [
            "", ".", "web.", ".web", "a..b", "-a", "a-", "a_b", "a b", "wéb",
        ] {
            assert!(!is_host_name(bad), "{bad}");
        }
        assert!(!is_host_name(&"a".repeat(64)));
        let long = vec!["a".repeat(63); 4].join(".");
        assert_eq!(long.len(), 255);
        assert!(!is_host_name(&long));
    }

    #[test]
    fn new_fields_default_when_absent() {
        let c: NatConfig = serde_json::from_str(r#"{"dns_upstreams":[]}"#).unwrap();
        assert!(c.publish_unix.is_empty() && c.services.is_empty());
        let c: NatConfig = serde_json::from_str(
            r#"{"publish_unix":[{"path":"/r/0-80.sock","guest_port":80}],
                "services":[{"name":"web","addr":"10.0.3.1",
                             "ports":[{"port":80,"to":{"unix":"/r/0-80.sock"}},
                                      {"port":81,"to":{"tcp":"10.1.2.3:81"}}]}]}"#,
        )
        .unwrap();
        assert_eq!(c.publish_unix[0].guest_port, 80);
        assert_eq!(
            c.services[0].ports[1].to,
            PortTarget::Tcp("10.1.2.3:81".parse().unwrap())
        );
        assert_eq!(c.services[0].addr, Ipv4Addr::new(10, 0, 3, 1));
        assert!(c.validate().is_ok());
        assert!(
            serde_json::from_str::<PublishUnix>(r#"{"path":"/x","guest_port":1,"y":1}"#).is_err()
        );
    }
}
