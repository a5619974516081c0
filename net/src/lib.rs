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
//! IP fragments are dropped. Every checksum of a guest frame is verified, so frames must
//! arrive complete: the VMM's virtio-net device completes the checksums the guest offloads
//! to it. Frames toward the guest always carry complete checksums (the device tells the
//! guest so, and it skips verifying them).
//!
//! # Policy order
//!
//! For every new guest→outside flow (TCP connection, UDP flow, ICMP echo), the first match wins:
//!
//! 1. destination [`GATEWAY_IP`]: allowed only for a port in [`NetworkPolicy::allow_host_ports`]
//!    (ICMP echo to it is answered by the NAT itself);
//! 2. destination [`DNS_IP`]: only port 53 (UDP and TCP), answered by the DNS proxy;
//! 3. [`NetworkPolicy::public_egress`] off: denied ([`reasons::NO_EGRESS`]); only steps 1–2 remain;
//! 4. anything else in 10.0.2.0/24: denied;
//! 5. a [`NetworkPolicy::deny`] match: denied;
//! 6. a default-deny range not in [`NetworkPolicy::allow`]: denied. IPv4: 0/8 and 240/4 and
//!    255.255.255.255 (reserved), 127/8 (loopback), 10/8, 172.16/12, 192.168/16 (private),
//!    169.254/16 (link-local, with the metadata address 169.254.169.254), 100.64/10 (CGNAT),
//!    224/4 (multicast). IPv6 (DNS answers only): `::`, `::1`, fc00::/7, fe80::/10, ff00::/8,
//!    IPv4-mapped `::ffff:0:0/96`;
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
//! `AF_INET/SOCK_DGRAM/IPPROTO_ICMP`), `connect`, `getsockopt(SOL_SOCKET, SO_ERROR)`, `sendto`
//! (with `MSG_NOSIGNAL`), `recvfrom`, `shutdown(SHUT_WR)`, `close` and, with published
//! ports ([`NatConfig::publish`], bound and listening in [`Nat::new`]),
//! `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`.

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
mod stats;
#[cfg(feature = "nat")]
mod tcp;
#[cfg(all(feature = "testing", feature = "nat"))]
pub mod testing;
#[cfg(feature = "nat")]
mod udp;

use std::net::{Ipv4Addr, SocketAddr};
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

/// Most connections from published ports relayed at once; more wait in the listen backlog.
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
