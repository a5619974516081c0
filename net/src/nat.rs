//! The NAT itself: the smoltcp interface, the flow tables and the poll loop the VMM drives.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::time::Instant;

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

use crate::*;

/// The user-mode NAT of one VM.
pub struct Nat {
    /// Origin of smoltcp's clock.
    pub(crate) epoch: Instant,
    pub(crate) guest_mac: EthernetAddress,
    pub(crate) iface: Interface,
    pub(crate) sockets: SocketSet<'static>,
    pub(crate) phy: phy::Phy,
    pub(crate) policy: policy::PolicyState,
    pub(crate) denials: denials::DenialLog,
    pub(crate) tcp_pending: BTreeMap<tcp::FlowKey, tcp::Connecting>,
    pub(crate) tcp: BTreeMap<tcp::FlowKey, tcp::Relay>,
    pub(crate) dns_tcp: BTreeMap<u16, dns_tcp::DnsSession>,
    pub(crate) udp: BTreeMap<tcp::FlowKey, udp::UdpFlow>,
    pub(crate) icmp: BTreeMap<(Ipv4Addr, u16), icmp::PingFlow>,
    pub(crate) ping_unavailable: bool,
    pub(crate) dns: dns::DnsForwarder,
    pub(crate) stats: NatStats,
    pub(crate) rng: Rng,
    pub(crate) next_session: u64,
    /// Receive buffer for datagrams (UDP, ICMP, DNS replies).
    pub(crate) scratch: Vec<u8>,
    /// Published ports ([`crate::inbound`]).
    pub(crate) inbound: Vec<inbound::Listener>,
    /// Where the next inbound connection's local port search starts.
    pub(crate) next_inbound_port: u32,
    /// Services the guest reaches by name ([`crate::services`]).
    pub(crate) services: Vec<services::Service>,
}

// The VMM moves the NAT to its network thread.
const _: fn() = || {
    pub(crate) fn send<T: Send>() {}
    send::<Nat>();
};

impl Nat {
    /// Builds the NAT: checks the config ([`NatConfig::validate`]), binds the published
    /// ports and Unix sockets, and reads the host's resolv.conf when no upstream is
    /// configured.
    pub fn new(config: NatConfig) -> Result<Nat, NatError> {
        config.validate()?;
        let services = services::compile(&config.services)?;
        let upstreams = if config.dns_upstreams.is_empty() {
            resolv::host_upstreams()?
        } else {
            config.dns_upstreams.clone()
        };
        let inbound = inbound::bind(&config.publish, &config.publish_unix)?;
        let host_addrs = crate::host_addrs::HostAddrs::open().map_err(|e| {
            std::io::Error::new(e.kind(), format!("reading the host's own addresses: {e}"))
        })?;
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
            policy: policy::PolicyState::new(&config.policy, host_addrs),
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
            inbound,
            next_inbound_port: 0,
            services,
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
        self.inbound_poll();
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
        self.inbound_poll_fds(room, out);
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
    pub(crate) fn smol_now(&self, now: Instant) -> smoltcp::time::Instant {
        let micros = now.saturating_duration_since(self.epoch).as_micros();
        smoltcp::time::Instant::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    /// Concurrent flows that count toward `max_connections`.
    pub(crate) fn active_flows(&self) -> usize {
        self.tcp_pending.len() + self.tcp.len() + self.udp.len() + self.icmp.len()
    }

    /// Queues a frame the NAT built for the guest (dropped and counted when the queue is full).
    pub(crate) fn send_to_guest(&mut self, frame: Vec<u8>) {
        if !self.phy.push(frame) {
            self.stats.dropped_to_guest += 1;
        }
    }

    /// Counts a denial of `destination`.
    pub(crate) fn deny(
        &mut self,
        destination: String,
        port: u16,
        protocol: Protocol,
        reason: impl Into<Cow<'static, str>>,
    ) {
        let reason = reason.into();
        self.stats.denials += 1;
        log::debug!("net: denied {destination}:{port}/{protocol:?}: {reason}");
        self.denials.record(destination, port, protocol, reason);
    }

    /// Hands one guest frame to smoltcp and processes it at once.
    pub(crate) fn feed(&mut self, frame: &[u8], now: Instant) {
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
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn seeded() -> Rng {
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

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
