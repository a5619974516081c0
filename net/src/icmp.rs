//! Guest ICMP echo: to the gateway and DNS addresses answered by smoltcp; elsewhere through an
//! unprivileged ping socket per (destination, identifier) when the host allows them
//! (`net.ipv4.ping_group_range`), else ICMP "communication administratively prohibited".

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{Icmpv4DstUnreachable, Icmpv4Packet, Icmpv4Repr};
use socket2::Socket;

use crate::frames::{self, EchoInfo};
use crate::host;
use crate::policy::reasons;
use crate::{Nat, Protocol, DNS_IP, GATEWAY_IP, ICMP_IDLE_TIMEOUT};

/// Replies read per flow per poll.
const READS_PER_POLL: usize = 16;

/// One echo flow (the kernel picks the ping socket's identifier; replies get the guest's).
pub(crate) struct PingFlow {
    sock: Socket,
    last_active: Instant,
}

impl Nat {
    /// One echo request from the guest (`frame` is the whole Ethernet frame).
    pub(crate) fn icmp_from_guest(&mut self, frame: &[u8], e: &EchoInfo<'_>, now: Instant) {
        if e.dst == GATEWAY_IP || e.dst == DNS_IP {
            self.feed(frame, now);
            return;
        }
        if let Err(reason) = self.policy.route(e.dst, 0, Protocol::Icmp, now) {
            self.deny(e.dst.to_string(), 0, Protocol::Icmp, reason);
            self.icmp_prohibited(e);
            return;
        }
        let key = (e.dst, e.ident);
        if let Some(flow) = self.icmp.get_mut(&key) {
            flow.last_active = now;
            if host::send(&flow.sock, e.icmp).is_ok() {
                self.stats.icmp_echo_requests += 1;
            }
            return;
        }
        if self.ping_unavailable {
            self.deny(
                e.dst.to_string(),
                0,
                Protocol::Icmp,
                reasons::PING_UNAVAILABLE,
            );
            self.icmp_prohibited(e);
            return;
        }
        if let Err(reason) = self.policy.admit(self.active_flows(), now) {
            self.deny(e.dst.to_string(), 0, Protocol::Icmp, reason);
            self.icmp_prohibited(e);
            return;
        }
        let sock = match host::ping_connect(e.dst) {
            Ok(s) => s,
            Err(err) => {
                if matches!(
                    err.raw_os_error(),
                    Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EPROTONOSUPPORT)
                ) {
                    log::info!("net: unprivileged ping sockets not allowed on this host: {err}");
                    self.ping_unavailable = true;
                }
                self.deny(
                    e.dst.to_string(),
                    0,
                    Protocol::Icmp,
                    reasons::PING_UNAVAILABLE,
                );
                self.icmp_prohibited(e);
                return;
            }
        };
        if host::send(&sock, e.icmp).is_ok() {
            self.stats.icmp_echo_requests += 1;
        }
        self.icmp.insert(
            key,
            PingFlow {
                sock,
                last_active: now,
            },
        );
    }

    fn icmp_prohibited(&mut self, e: &EchoInfo<'_>) {
        if !frames::answerable(e.dst) {
            return;
        }
        if let Some(frame) = frames::unreachable(
            self.guest_mac,
            GATEWAY_IP,
            Icmpv4DstUnreachable::CommProhibited,
            e.ip,
        ) {
            self.send_to_guest(frame);
        }
    }

    /// Echo replies from the host, and idle flows closed.
    pub(crate) fn icmp_poll(&mut self, now: Instant) {
        self.icmp
            .retain(|_, f| now < f.last_active + ICMP_IDLE_TIMEOUT);
        let keys: Vec<(Ipv4Addr, u16)> = self.icmp.keys().copied().collect();
        for (dst, ident) in keys {
            for _ in 0..READS_PER_POLL {
                if self.phy.is_full() {
                    return;
                }
                let Some(flow) = self.icmp.get_mut(&(dst, ident)) else {
                    break;
                };
                let n = match host::recv(&flow.sock, &mut self.scratch) {
                    Ok(n) => n,
                    Err(e) if host::would_block(&e) => break,
                    Err(e) => {
                        log::debug!("net: ping recv: {e}");
                        break;
                    }
                };
                flow.last_active = now;
                let bytes = self.scratch.get(..n).unwrap_or(&[]);
                let Ok(packet) = Icmpv4Packet::new_checked(bytes) else {
                    continue;
                };
                // The kernel checked the checksum; ours is recomputed on emit.
                let Ok(Icmpv4Repr::EchoReply { seq_no, data, .. }) =
                    Icmpv4Repr::parse(&packet, &ChecksumCapabilities::ignored())
                else {
                    continue;
                };
                let reply = Icmpv4Repr::EchoReply {
                    ident,
                    seq_no,
                    data,
                };
                let frame = frames::icmp_to_guest(self.guest_mac, dst, &reply);
                self.stats.icmp_echo_replies += 1;
                self.send_to_guest(frame);
            }
        }
    }

    pub(crate) fn icmp_poll_fds(&self, room: bool, out: &mut Vec<(RawFd, i16)>) {
        if !room {
            return;
        }
        for f in self.icmp.values() {
            out.push((f.sock.as_raw_fd(), libc::POLLIN));
        }
    }

    pub(crate) fn icmp_deadlines(&self, at: &mut impl FnMut(Instant)) {
        if let Some(t) = self.icmp.values().map(|f| f.last_active).min() {
            at(t + ICMP_IDLE_TIMEOUT);
        }
    }
}
