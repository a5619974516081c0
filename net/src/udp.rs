//! Guest UDP: one connected non-blocking host socket per flow (guest port, destination),
//! closed after [`UDP_IDLE_TIMEOUT`]; datagrams to `DNS_IP:53` go to the DNS proxy.

use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use smoltcp::wire::{Icmpv4DstUnreachable, IpProtocol, Ipv4Repr};
use socket2::Socket;

use crate::frames::{self, UdpInfo};
use crate::host::{self, Refusal};
use crate::policy::Route;
use crate::tcp::FlowKey;
use crate::{Nat, Protocol, GATEWAY_IP, GUEST_IP, MAX_UDP_PAYLOAD, UDP_IDLE_TIMEOUT};

/// Datagrams read per flow per poll (fairness between flows).
const READS_PER_POLL: usize = 64;

/// One UDP flow.
pub(crate) struct UdpFlow {
    sock: Socket,
    /// The destination as the guest sees it (source of the replies).
    seen_as: SocketAddrV4,
    last_active: Instant,
}

impl Nat {
    /// One UDP datagram from the guest.
    pub(crate) fn udp_from_guest(&mut self, u: &UdpInfo<'_>, now: Instant) {
        let key = FlowKey {
            guest_port: u.src_port,
            dst: u.dst,
            dst_port: u.dst_port,
        };
        if let Some(flow) = self.udp.get_mut(&key) {
            flow.last_active = now;
            match host::send(&flow.sock, u.payload) {
                Ok(_) => self.stats.udp_bytes_to_host += u.payload.len() as u64,
                Err(_) => self.stats.udp_dropped += 1,
            }
            return;
        }
        let target = match self.policy.route(u.dst, u.dst_port, Protocol::Udp, now) {
            Ok(Route::Dns) => {
                self.dns_udp_from_guest(u.src_port, u.payload, now);
                return;
            }
            Ok(Route::Host(a)) | Ok(Route::Outside(a)) => a,
            Err(reason) => {
                self.deny(u.dst.to_string(), u.dst_port, Protocol::Udp, reason);
                self.udp_prohibited(u);
                return;
            }
        };
        if let Err(reason) = self.policy.admit(self.active_flows(), now) {
            self.deny(u.dst.to_string(), u.dst_port, Protocol::Udp, reason);
            self.udp_prohibited(u);
            return;
        }
        let sock = match host::udp_connect(SocketAddr::V4(target)) {
            Ok(s) => s,
            Err(e) => {
                log::debug!("net: udp socket to {target}: {e}");
                let code = match host::refusal(&e) {
                    Refusal::Unreachable(code) => code,
                    Refusal::Reset => Icmpv4DstUnreachable::HostUnreachable,
                };
                self.udp_unreachable(u, code);
                return;
            }
        };
        self.stats.udp_flows += 1;
        match host::send(&sock, u.payload) {
            Ok(_) => self.stats.udp_bytes_to_host += u.payload.len() as u64,
            Err(_) => self.stats.udp_dropped += 1,
        }
        self.udp.insert(
            key,
            UdpFlow {
                sock,
                seen_as: SocketAddrV4::new(u.dst, u.dst_port),
                last_active: now,
            },
        );
    }

    /// ICMP "communication administratively prohibited" for a denied datagram (nothing for
    /// broadcast and multicast destinations).
    fn udp_prohibited(&mut self, u: &UdpInfo<'_>) {
        self.udp_unreachable(u, Icmpv4DstUnreachable::CommProhibited);
    }

    fn udp_unreachable(&mut self, u: &UdpInfo<'_>, code: Icmpv4DstUnreachable) {
        if !frames::answerable(u.dst) {
            return;
        }
        if let Some(frame) = frames::unreachable(self.guest_mac, GATEWAY_IP, code, u.ip) {
            self.send_to_guest(frame);
        }
    }

    /// Replies from the host, and idle flows closed.
    pub(crate) fn udp_poll(&mut self, now: Instant) {
        self.udp
            .retain(|_, f| now < f.last_active + UDP_IDLE_TIMEOUT);
        let keys: Vec<FlowKey> = self.udp.keys().copied().collect();
        for key in keys {
            for _ in 0..READS_PER_POLL {
                if self.phy.is_full() {
                    return;
                }
                let Some(flow) = self.udp.get_mut(&key) else {
                    break;
                };
                match host::recv(&flow.sock, &mut self.scratch) {
                    Ok(n) => {
                        flow.last_active = now;
                        let seen_as = flow.seen_as;
                        if n > MAX_UDP_PAYLOAD {
                            self.stats.udp_dropped += 1;
                            continue;
                        }
                        let payload = self.scratch.get(..n).unwrap_or(&[]);
                        let frame =
                            frames::udp_to_guest(self.guest_mac, seen_as, key.guest_port, payload);
                        self.stats.udp_bytes_to_guest += n as u64;
                        self.send_to_guest(frame);
                    }
                    Err(e) if host::would_block(&e) => break,
                    Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                        // The host got ICMP port unreachable: tell the guest the same.
                        self.udp_port_unreachable(&key);
                    }
                    Err(e) => {
                        log::debug!("net: udp recv: {e}");
                        break;
                    }
                }
            }
        }
    }

    /// ICMP port unreachable from the destination, quoting a header like the guest's.
    fn udp_port_unreachable(&mut self, key: &FlowKey) {
        let mut quoted = [0u8; 28];
        let ip = Ipv4Repr {
            src_addr: GUEST_IP,
            dst_addr: key.dst,
            next_header: IpProtocol::Udp,
            payload_len: 8,
            hop_limit: 64,
        };
        let mut packet = smoltcp::wire::Ipv4Packet::new_unchecked(&mut quoted[..]);
        ip.emit(&mut packet, &smoltcp::phy::ChecksumCapabilities::default());
        let body = packet.payload_mut();
        body[0..2].copy_from_slice(&key.guest_port.to_be_bytes());
        body[2..4].copy_from_slice(&key.dst_port.to_be_bytes());
        body[4..6].copy_from_slice(&8u16.to_be_bytes());
        if let Some(frame) = frames::unreachable(
            self.guest_mac,
            key.dst,
            Icmpv4DstUnreachable::PortUnreachable,
            &quoted,
        ) {
            self.send_to_guest(frame);
        }
    }

    pub(crate) fn udp_poll_fds(&self, room: bool, out: &mut Vec<(RawFd, i16)>) {
        if !room {
            return;
        }
        for f in self.udp.values() {
            out.push((f.sock.as_raw_fd(), libc::POLLIN));
        }
    }

    pub(crate) fn udp_deadlines(&self, at: &mut impl FnMut(Instant)) {
        if let Some(t) = self.udp.values().map(|f| f.last_active).min() {
            at(t + UDP_IDLE_TIMEOUT);
        }
    }
}
