//! Counters of one NAT (for reports and benchmarks).

use std::time::Duration;

use serde::Serialize;

use crate::frames::Drop;

/// Counters since [`crate::Nat::new`]; the `*_active`, `queued_*`, `dns_in_flight`,
/// `dns_tcp_sessions` and `pinned_addresses` fields are current values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NatStats {
    /// Frames the guest sent.
    pub frames_from_guest: u64,
    /// Bytes of those frames.
    pub bytes_from_guest: u64,
    /// Frames delivered to the guest.
    pub frames_to_guest: u64,
    /// Bytes of those frames.
    pub bytes_to_guest: u64,
    /// Guest frames dropped: truncated or inconsistent headers.
    pub dropped_malformed: u64,
    /// Guest frames dropped: longer than `MTU + 14`.
    pub dropped_oversized: u64,
    /// Guest frames dropped: destination MAC neither the gateway's nor broadcast.
    pub dropped_wrong_mac: u64,
    /// Guest frames dropped: neither IPv4 nor ARP (IPv6 included).
    pub dropped_not_ipv4: u64,
    /// Guest frames dropped: source address not the guest's.
    pub dropped_bad_source: u64,
    /// Guest frames dropped: IP fragments.
    pub dropped_fragments: u64,
    /// Guest frames dropped: bad IPv4/TCP/UDP/ICMP checksum.
    pub dropped_bad_checksum: u64,
    /// Guest frames dropped: other IP protocols or ICMP messages.
    pub dropped_unsupported: u64,
    /// Guest ARP not about the gateway or DNS address (ignored).
    pub arp_ignored: u64,
    /// Guest SYNs dropped because [`crate::MAX_PENDING_CONNECTS`] connects were in progress.
    pub dropped_busy: u64,
    /// Frames for the guest dropped because its queue was full.
    pub dropped_to_guest: u64,
    /// Denied flows and DNS questions (sum of [`crate::Nat::denials`] counts).
    pub denials: u64,
    /// Host TCP connects started.
    pub tcp_connects: u64,
    /// Host TCP connects that failed (refused, unreachable, timed out).
    pub tcp_connect_failures: u64,
    /// TCP connections relayed (host connected and guest handshake started).
    pub tcp_established: u64,
    /// Connections accepted on published ports (TCP and Unix) and opened toward the guest.
    pub inbound_accepted: u64,
    /// Guest connections to services ([`crate::ServiceRoute`]) whose Unix socket connect
    /// succeeded (also counted in `tcp_connects` and `tcp_established`).
    pub service_connects: u64,
    /// TCP payload bytes relayed guest → host.
    pub tcp_bytes_to_host: u64,
    /// TCP payload bytes relayed host → guest.
    pub tcp_bytes_to_guest: u64,
    /// Relayed TCP connections now.
    pub tcp_active: u64,
    /// Host TCP connects in progress now.
    pub tcp_connecting: u64,
    /// UDP flows opened.
    pub udp_flows: u64,
    /// UDP flows now.
    pub udp_active: u64,
    /// UDP payload bytes guest → host.
    pub udp_bytes_to_host: u64,
    /// UDP payload bytes host → guest.
    pub udp_bytes_to_guest: u64,
    /// UDP datagrams dropped (host socket full, or too large for one frame).
    pub udp_dropped: u64,
    /// ICMP echo requests sent through ping sockets.
    pub icmp_echo_requests: u64,
    /// ICMP echo replies delivered from ping sockets.
    pub icmp_echo_replies: u64,
    /// ICMP echo flows now.
    pub icmp_active: u64,
    /// DNS queries from the guest (UDP and TCP).
    pub dns_queries: u64,
    /// DNS answers from upstreams delivered.
    pub dns_answers: u64,
    /// DNS queries answered SERVFAIL (upstreams failed or the in-flight table was full).
    pub dns_failures: u64,
    /// DNS answers turned into NXDOMAIN because every address was in a denied range.
    pub dns_filtered: u64,
    /// DNS queries in flight now.
    pub dns_in_flight: u64,
    /// DNS-over-TCP connections now.
    pub dns_tcp_sessions: u64,
    /// Frames queued toward the guest now.
    pub queued_to_guest: u64,
    /// Bytes of those frames now.
    pub queued_bytes_to_guest: u64,
    /// Addresses pinned by `allow_domains` now.
    pub pinned_addresses: u64,
    /// Time spent inside `from_guest` and `poll` (NAT processing, syscalls included).
    pub busy: Duration,
}

impl NatStats {
    pub(crate) fn count_drop(&mut self, drop: Drop) {
        let c = match drop {
            Drop::Malformed => &mut self.dropped_malformed,
            Drop::Oversized => &mut self.dropped_oversized,
            Drop::WrongMac => &mut self.dropped_wrong_mac,
            Drop::NotIpv4 => &mut self.dropped_not_ipv4,
            Drop::BadSource => &mut self.dropped_bad_source,
            Drop::Fragment => &mut self.dropped_fragments,
            Drop::BadChecksum => &mut self.dropped_bad_checksum,
            Drop::Unsupported => &mut self.dropped_unsupported,
            Drop::ArpIgnored => &mut self.arp_ignored,
        };
        *c += 1;
    }

    /// Guest frames dropped for any reason (ignored ARP excluded).
    pub fn dropped_from_guest(&self) -> u64 {
        self.dropped_malformed
            + self.dropped_oversized
            + self.dropped_wrong_mac
            + self.dropped_not_ipv4
            + self.dropped_bad_source
            + self.dropped_fragments
            + self.dropped_bad_checksum
            + self.dropped_unsupported
    }
}
