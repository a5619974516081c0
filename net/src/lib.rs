//! User-mode NAT for one voidbox micro-VM (no root, no TAP, no bridge).
//!
//! The VMM's virtio-net device hands every Ethernet frame the guest sends to [`Nat::from_guest`]
//! and delivers what [`Nat::to_guest`] returns; the NAT terminates the guest's TCP with
//! `smoltcp`, relays to host sockets, forwards UDP and ICMP echo, answers DNS at [`DNS_IP`] via
//! the host's (or a configured) resolver, and enforces a [`Policy`] written in the spec.
//! Each VM has its own `Nat`; nothing is shared between VMs.
//!
//! # Addressing
//!
//! Guest [`GUEST_IP`]/[`PREFIX_LEN`] (MAC [`NatConfig::guest_mac`]), gateway [`GATEWAY_IP`] and
//! DNS server [`DNS_IP`], both on [`GATEWAY_MAC`]. The NAT answers ARP for those two addresses
//! only, and ICMP echo to them. `GATEWAY_IP:PORT` reaches host `127.0.0.1:PORT`, for
//! [`Policy::allow_host_ports`] only. Every other destination is reached through a host socket
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
//! 1. destination [`GATEWAY_IP`]: allowed only for a port in [`Policy::allow_host_ports`]
//!    (ICMP echo to it is answered by the NAT itself);
//! 2. destination [`DNS_IP`]: only port 53 (UDP and TCP), answered by the DNS proxy;
//! 3. [`Policy::public_egress`] off: denied ([`reasons::NO_EGRESS`]); only steps 1–2 remain;
//! 4. anything else in 10.0.2.0/24: denied;
//! 5. a [`Policy::deny`] match: denied;
//! 6. a default-deny range not in [`Policy::allow`]: denied. IPv4: 0/8 and 240/4 and
//!    255.255.255.255 (reserved), 127/8 (loopback), 10/8, 172.16/12, 192.168/16 (private),
//!    169.254/16 (link-local, with the metadata address 169.254.169.254), 100.64/10 (CGNAT),
//!    224/4 (multicast). IPv6 (DNS answers only): `::`, `::1`, fc00::/7, fe80::/10, ff00::/8,
//!    IPv4-mapped `::ffff:0:0/96`;
//! 7. [`Policy::allow_domains`] non-empty and the address was not returned by this NAT's
//!    resolver for an allowed name (directly or through a CNAME chain) during this VM's life:
//!    denied (`allow` does not bypass this);
//! 8. [`Policy::max_connections`] concurrent TCP connections + UDP flows + ICMP echo flows, or
//!    [`Policy::connections_per_second`] (token bucket, burst of the same) exceeded: denied;
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
//! (with `MSG_NOSIGNAL`), `recvfrom`, `shutdown(SHUT_WR)` and `close`.

#![forbid(unsafe_code)]

mod denials;
mod dns;
mod dns_tcp;
mod frames;
pub mod fuzz;
mod host;
mod icmp;
mod phy;
mod policy;
mod resolv;
mod stats;
mod tcp;
#[cfg(feature = "testing")]
pub mod testing;
mod udp;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

pub use policy::reasons;
pub use resolv::parse_resolv_conf;
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
/// Default of [`Policy::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;
/// Default of [`Policy::connections_per_second`].
pub const DEFAULT_CONNECTIONS_PER_SECOND: u32 = 100;

/// Network policy of one VM, as written in the spec (`sandbox.network` mapping form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
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

impl Default for Policy {
    fn default() -> Self {
        Policy {
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
    pub policy: Policy,
    /// DNS upstreams; empty means the `nameserver` lines of the host's `/etc/resolv.conf`.
    #[serde(default)]
    pub dns_upstreams: Vec<SocketAddr>,
    /// The guest's MAC address.
    #[serde(default = "default_guest_mac")]
    pub guest_mac: [u8; 6],
}

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

/// The user-mode NAT of one VM.
pub struct Nat {
    /// Origin of smoltcp's clock.
    epoch: Instant,
    guest_mac: EthernetAddress,
    iface: Interface,
    sockets: SocketSet<'static>,
    phy: phy::Phy,
    policy: policy::PolicyState,
    denials: denials::DenialLog,
    tcp_pending: BTreeMap<tcp::FlowKey, tcp::Connecting>,
    tcp: BTreeMap<tcp::FlowKey, tcp::Relay>,
    dns_tcp: BTreeMap<u16, dns_tcp::DnsSession>,
    udp: BTreeMap<tcp::FlowKey, udp::UdpFlow>,
    icmp: BTreeMap<(Ipv4Addr, u16), icmp::PingFlow>,
    ping_unavailable: bool,
    dns: dns::DnsForwarder,
    stats: NatStats,
    rng: Rng,
    next_session: u64,
    /// Receive buffer for datagrams (UDP, ICMP, DNS replies).
    scratch: Vec<u8>,
}

// The VMM moves the NAT to its network thread.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Nat>();
};

impl Nat {
    /// Builds the NAT (reads the host's resolv.conf when no upstream is configured).
    pub fn new(config: NatConfig) -> Result<Nat, NatError> {
        let upstreams = if config.dns_upstreams.is_empty() {
            resolv::host_upstreams()?
        } else {
            config.dns_upstreams.clone()
        };
        let epoch = Instant::now();
        let mut rng = Rng::seeded();
        let mut phy = phy::Phy::new(TO_GUEST_QUEUE, TO_GUEST_QUEUE_BYTES);
        let mut iface_config = Config::new(HardwareAddress::Ethernet(EthernetAddress(GATEWAY_MAC)));
        iface_config.random_seed = rng.next_u64();
        let mut iface = Interface::new(iface_config, &mut phy, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|addrs| {
            for ip in [GATEWAY_IP, DNS_IP] {
                // Two slots (smoltcp's IFACE_MAX_ADDR_COUNT default) for two addresses.
                let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(ip), PREFIX_LEN));
            }
        });
        iface.set_any_ip(true);
        let guest_mac = EthernetAddress(config.guest_mac);
        Ok(Nat {
            epoch,
            guest_mac,
            iface,
            sockets: SocketSet::new(Vec::new()),
            phy,
            policy: policy::PolicyState::new(&config.policy),
            denials: denials::DenialLog::new(MAX_DENIAL_ENTRIES),
            tcp_pending: BTreeMap::new(),
            tcp: BTreeMap::new(),
            dns_tcp: BTreeMap::new(),
            udp: BTreeMap::new(),
            icmp: BTreeMap::new(),
            ping_unavailable: false,
            dns: dns::DnsForwarder::new(upstreams),
            stats: NatStats::default(),
            rng,
            next_session: 0,
            scratch: vec![0; 65536],
        })
    }

    /// Takes one Ethernet frame (no virtio header) the guest sent. Malformed, truncated or
    /// oversized frames, and frames not from [`NatConfig::guest_mac`] and [`GUEST_IP`], are
    /// counted and dropped; never panics.
    pub fn from_guest(&mut self, frame: &[u8], now: Instant) {
        let started = Instant::now();
        self.stats.frames_from_guest += 1;
        self.stats.bytes_from_guest += frame.len() as u64;
        match frames::parse(frame, self.guest_mac) {
            Err(drop) => self.stats.count_drop(drop),
            Ok(frames::Parsed::Arp) => self.feed(frame, now),
            Ok(frames::Parsed::Tcp(t)) => self.tcp_from_guest(frame, &t, now),
            Ok(frames::Parsed::Udp(u)) => self.udp_from_guest(&u, now),
            Ok(frames::Parsed::Echo(e)) => self.icmp_from_guest(frame, &e, now),
        }
        self.stats.busy += started.elapsed();
    }

    /// The next Ethernet frame for the guest, if any (at most `MTU + 14` bytes). The caller
    /// pops only when it has a guest buffer for it: what is not popped stays queued, and the
    /// NAT stops reading host sockets once its bounded queue is full (backpressure).
    pub fn to_guest(&mut self, now: Instant) -> Option<Vec<u8>> {
        let _ = now;
        let frame = self.phy.pop()?;
        self.stats.frames_to_guest += 1;
        self.stats.bytes_to_guest += frame.len() as u64;
        Some(frame)
    }

    /// Services host sockets (connect completions, reads, writes, closes) and timers; call
    /// after the descriptors of [`Nat::poll_fds`] became ready or the timeout elapsed.
    pub fn poll(&mut self, now: Instant) {
        let started = Instant::now();
        self.phy.tx_blocked = false;
        self.tcp_poll_connects(now);
        self.tcp_relay(now);
        self.dns_poll(now);
        self.dns_tcp_poll(now);
        let ts = self.smol_now(now);
        self.iface.poll(ts, &mut self.phy, &mut self.sockets);
        self.tcp_reclaim(now);
        self.udp_poll(now);
        self.icmp_poll(now);
        self.stats.busy += started.elapsed();
    }

    /// Host descriptors to wait on, with `POLLIN`/`POLLOUT` interest (appended to `out`).
    /// The interest follows flow control (no `POLLIN` while there is no room toward the
    /// guest), so call it again before every `poll(2)`.
    pub fn poll_fds(&self, out: &mut Vec<(RawFd, i16)>) {
        let room = !self.phy.is_full();
        self.tcp_poll_fds(room, out);
        self.udp_poll_fds(room, out);
        self.icmp_poll_fds(room, out);
        self.dns_poll_fds(room, out);
    }

    /// How long the caller may sleep before the next [`Nat::poll`], at most.
    pub fn poll_timeout(&mut self, now: Instant) -> Option<Duration> {
        let room = !self.phy.is_full();
        if room && self.phy.tx_blocked {
            // smoltcp had more to send than the queue took, and the guest has popped since.
            return Some(Duration::ZERO);
        }
        let mut next: Option<Instant> = None;
        let mut at = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        if room {
            let ts = self.smol_now(now);
            if let Some(d) = self.iface.poll_delay(ts, &self.sockets) {
                at(now + Duration::from_micros(d.total_micros()));
            }
        }
        self.tcp_deadlines(&mut at);
        self.udp_deadlines(&mut at);
        self.icmp_deadlines(&mut at);
        self.dns_deadlines(&mut at);
        next.map(|t| t.saturating_duration_since(now))
    }

    /// Denials so far, cumulative, sorted by destination, port and protocol.
    pub fn denials(&self) -> Vec<Denial> {
        self.denials.list()
    }

    /// How many flows were denied so far (the sum of the counts in [`Nat::denials`]); cheap,
    /// for noticing that the list changed without building it.
    pub fn denial_total(&self) -> u64 {
        self.stats.denials
    }

    /// Counters (frames, bytes relayed, drops, flows, time spent in the NAT).
    pub fn stats(&self) -> NatStats {
        let mut s = self.stats.clone();
        s.tcp_active = self.tcp.len() as u64;
        s.tcp_connecting = self.tcp_pending.len() as u64;
        s.udp_active = self.udp.len() as u64;
        s.icmp_active = self.icmp.len() as u64;
        s.dns_in_flight = self.dns.inflight.len() as u64;
        s.dns_tcp_sessions = self.dns_tcp.len() as u64;
        s.queued_to_guest = self.phy.len() as u64;
        s.queued_bytes_to_guest = self.phy.bytes() as u64;
        s.pinned_addresses = self.policy.pinned_len() as u64;
        s
    }

    /// smoltcp's clock for `now`.
    fn smol_now(&self, now: Instant) -> smoltcp::time::Instant {
        let micros = now.saturating_duration_since(self.epoch).as_micros();
        smoltcp::time::Instant::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    /// Concurrent flows that count toward `max_connections`.
    fn active_flows(&self) -> usize {
        self.tcp_pending.len() + self.tcp.len() + self.udp.len() + self.icmp.len()
    }

    /// Queues a frame the NAT built for the guest (dropped and counted when the queue is full).
    fn send_to_guest(&mut self, frame: Vec<u8>) {
        if !self.phy.push(frame) {
            self.stats.dropped_to_guest += 1;
        }
    }

    /// Counts a denial of `destination`.
    fn deny(&mut self, destination: String, port: u16, protocol: Protocol, reason: &'static str) {
        self.stats.denials += 1;
        log::debug!("net: denied {destination}:{port}/{protocol:?}: {reason}");
        self.denials.record(destination, port, protocol, reason);
    }

    /// Hands one guest frame to smoltcp and processes it at once.
    fn feed(&mut self, frame: &[u8], now: Instant) {
        self.phy.set_rx(frame);
        let ts = self.smol_now(now);
        // One frame is queued; the loop ends when smoltcp has taken it.
        for _ in 0..2 {
            match self
                .iface
                .poll_ingress_single(ts, &mut self.phy, &mut self.sockets)
            {
                smoltcp::iface::PollIngressSingleResult::None => break,
                _ => continue,
            }
        }
        self.phy.clear_rx();
    }
}

/// A small non-cryptographic generator (xorshift64*) for DNS ids and smoltcp's seed, seeded in
/// [`Nat::new`] (no `getrandom` afterwards).
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        Rng(h.finish() | 1)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
