//! Guest TCP: the policy on each SYN, a non-blocking host connect while the SYN is held, then
//! a smoltcp socket that takes exactly that SYN, and the relay between the two with flow
//! control (no buffering beyond the two fixed smoltcp buffers) and half-close both ways.
//! The host side is a TCP socket, or for a service ([`crate::services`]) a Unix socket.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{self, State};
use smoltcp::wire::{IpAddress, IpListenEndpoint};
use socket2::{SockAddr, Socket};

use crate::frames::{self, TcpInfo};
use crate::host::{self, Connect, Refusal};
use crate::policy::Route;
use crate::services::ServiceTarget;
use crate::stats::NatStats;
use crate::{Nat, Protocol, CONNECT_TIMEOUT, DNS_IP, GATEWAY_IP, MAX_PENDING_CONNECTS};
use crate::{TCP_BUFFER, TCP_PEER_TIMEOUT};

/// How long an aborted connection waits for its RST to reach the queue before it is dropped.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// A guest flow: the guest's port and the destination it addressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FlowKey {
    pub guest_port: u16,
    pub dst: Ipv4Addr,
    pub dst_port: u16,
}

/// A host connect in progress; the guest's SYN waits here (retransmits replace it).
pub(crate) struct Connecting {
    sock: Socket,
    /// An IPv4 address, or a service's Unix socket.
    target: SockAddr,
    /// To a service: bypasses the policy, and a failure is always answered with RST.
    service: bool,
    syn: Vec<u8>,
    deadline: Instant,
}

/// A relayed connection.
pub(crate) struct Relay {
    handle: SocketHandle,
    /// `None` once closed (error, abort, or both directions done).
    host: Option<Socket>,
    /// The host sent EOF (smoltcp socket closed after its buffer drains).
    host_eof: bool,
    /// The guest's FIN was passed on (`shutdown(SHUT_WR)`).
    host_wr_shut: bool,
    /// The last write to the host would have blocked.
    write_blocked: bool,
    /// When the smoltcp socket was first seen closed.
    closed_at: Option<Instant>,
    /// Opened from a published port ([`crate::inbound`]), not by the guest.
    pub(crate) inbound: bool,
}

impl Relay {
    /// A relay between smoltcp socket `handle` and `host`.
    pub(crate) fn new(handle: SocketHandle, host: Socket, inbound: bool) -> Relay {
        Relay {
            handle,
            host: Some(host),
            host_eof: false,
            host_wr_shut: false,
            write_blocked: false,
            closed_at: None,
            inbound,
        }
    }
}

/// A smoltcp socket for one relayed connection: [`TCP_BUFFER`] each way, no Nagle, the
/// peer timeout.
pub(crate) fn relay_socket() -> tcp::Socket<'static> {
    let mut socket = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; TCP_BUFFER]),
        tcp::SocketBuffer::new(vec![0; TCP_BUFFER]),
    );
    socket.set_nagle_enabled(false);
    socket.set_timeout(Some(smoltcp::time::Duration::from_micros(
        TCP_PEER_TIMEOUT.as_micros() as u64,
    )));
    socket
}

/// A smoltcp socket listening on exactly `dst:port`, about to take one SYN.
fn listener(dst: Ipv4Addr, port: u16) -> Option<tcp::Socket<'static>> {
    let mut socket = relay_socket();
    socket
        .listen(IpListenEndpoint {
            addr: Some(IpAddress::Ipv4(dst)),
            port,
        })
        .ok()?;
    Some(socket)
}

/// The guest sent a FIN (all data before it is in the receive buffer).
fn fin_received(state: State) -> bool {
    matches!(
        state,
        State::CloseWait | State::LastAck | State::Closing | State::TimeWait
    )
}

impl Nat {
    /// One TCP segment from the guest.
    pub(crate) fn tcp_from_guest(&mut self, frame: &[u8], t: &TcpInfo, now: Instant) {
        if t.dst == DNS_IP && t.dst_port == 53 {
            self.dns_tcp_from_guest(frame, t, now);
            return;
        }
        let key = FlowKey {
            guest_port: t.src_port,
            dst: t.dst,
            dst_port: t.dst_port,
        };
        if let Some(c) = self.tcp_pending.get_mut(&key) {
            if t.rst {
                // The guest gave up; so do we.
                self.tcp_pending.remove(&key);
            } else if t.is_open() {
                // A retransmit (or a new ISN): the newest SYN is the one to answer.
                c.syn.clear();
                c.syn.extend_from_slice(frame);
            }
            return;
        }
        if let Some(r) = self.tcp.get(&key) {
            let state = self.sockets.get::<tcp::Socket>(r.handle).state();
            let stale = matches!(state, State::TimeWait | State::Closed | State::Listen);
            if !(t.is_open() && stale) {
                self.feed(frame, now);
                self.tcp_drop_if_listening(&key);
                return;
            }
            // The guest reuses the port of a finished connection.
            self.tcp_remove(&key);
        }
        if !t.is_open() {
            // No connection: smoltcp answers with RST (and ignores RSTs).
            self.feed(frame, now);
            return;
        }
        self.tcp_open(frame, t, key, now);
    }

    /// A SYN for a new connection: service route or policy, caps, host connect.
    fn tcp_open(&mut self, frame: &[u8], t: &TcpInfo, key: FlowKey, now: Instant) {
        let (target, service) = match self.service_target(t.dst, t.dst_port) {
            ServiceTarget::Socket(addr) => (addr.clone(), true),
            ServiceTarget::Denied(reason) => {
                self.deny(t.dst.to_string(), t.dst_port, Protocol::Tcp, reason);
                self.send_to_guest(frames::tcp_rst(self.guest_mac, t));
                return;
            }
            ServiceTarget::None => match self.policy.route(t.dst, t.dst_port, Protocol::Tcp, now) {
                Ok(Route::Host(a)) | Ok(Route::Outside(a)) => (SockAddr::from(a), false),
                Ok(Route::Dns) => return, // DNS_IP:53 was handled by the caller
                Err(reason) => {
                    self.deny(t.dst.to_string(), t.dst_port, Protocol::Tcp, reason);
                    self.send_to_guest(frames::tcp_rst(self.guest_mac, t));
                    return;
                }
            },
        };
        if self.tcp_pending.len() >= MAX_PENDING_CONNECTS {
            // Transient overload: the guest retransmits its SYN.
            self.stats.dropped_busy += 1;
            return;
        }
        if !service {
            if let Err(reason) = self.policy.admit(self.active_flows(), now) {
                self.deny(t.dst.to_string(), t.dst_port, Protocol::Tcp, reason);
                self.send_to_guest(frames::tcp_rst(self.guest_mac, t));
                return;
            }
        }
        self.stats.tcp_connects += 1;
        match host::stream_connect(&target) {
            Ok(sock) => {
                self.tcp_pending.insert(
                    key,
                    Connecting {
                        sock,
                        target,
                        service,
                        syn: frame.to_vec(),
                        deadline: now + CONNECT_TIMEOUT,
                    },
                );
            }
            Err(e) => self.tcp_refuse(frame, &e, service),
        }
    }

    /// Tells the guest its connect failed (RST, or ICMP unreachable; always RST for a
    /// service), from its held SYN.
    fn tcp_refuse(&mut self, syn: &[u8], e: &std::io::Error, service: bool) {
        self.stats.tcp_connect_failures += 1;
        log::debug!("net: host connect failed: {e}");
        let Ok(frames::Parsed::Tcp(t)) = frames::parse(syn, self.guest_mac) else {
            return;
        };
        let refusal = if service {
            Refusal::Reset
        } else {
            host::refusal(e)
        };
        let frame = match refusal {
            Refusal::Reset => Some(frames::tcp_rst(self.guest_mac, &t)),
            Refusal::Unreachable(code) => {
                let ip = syn.get(14..).unwrap_or(&[]);
                frames::unreachable(self.guest_mac, GATEWAY_IP, code, ip)
            }
        };
        if let Some(frame) = frame {
            self.send_to_guest(frame);
        }
    }

    /// Completes, fails or times out the host connects in progress.
    pub(crate) fn tcp_poll_connects(&mut self, now: Instant) {
        if self.tcp_pending.is_empty() {
            return;
        }
        let keys: Vec<FlowKey> = self.tcp_pending.keys().copied().collect();
        for key in keys {
            let Some(c) = self.tcp_pending.get(&key) else {
                continue;
            };
            match host::connect_state(&c.sock, &c.target) {
                Connect::Pending if now < c.deadline => {}
                Connect::Pending => {
                    if let Some(c) = self.tcp_pending.remove(&key) {
                        let e = std::io::Error::from_raw_os_error(libc::ETIMEDOUT);
                        self.tcp_refuse(&c.syn, &e, c.service);
                    }
                }
                Connect::Failed(e) => {
                    if let Some(c) = self.tcp_pending.remove(&key) {
                        self.tcp_refuse(&c.syn, &e, c.service);
                    }
                }
                Connect::Connected => {
                    if let Some(c) = self.tcp_pending.remove(&key) {
                        self.tcp_accept(key, c, now);
                    }
                }
            }
        }
    }

    /// The host accepted: let smoltcp take the held SYN (its SYN-ACK leaves on egress).
    fn tcp_accept(&mut self, key: FlowKey, c: Connecting, now: Instant) {
        match self.admit_syn(key.dst, key.dst_port, &c.syn, now) {
            Some(handle) => {
                self.stats.tcp_established += 1;
                if c.service {
                    self.stats.service_connects += 1;
                }
                self.tcp.insert(key, Relay::new(handle, c.sock, false));
            }
            None => {
                if let Ok(frames::Parsed::Tcp(t)) = frames::parse(&c.syn, self.guest_mac) {
                    self.send_to_guest(frames::tcp_rst(self.guest_mac, &t));
                }
            }
        }
    }

    /// Creates a listener on exactly `dst:port` and feeds it `syn` alone, so no other segment
    /// can reach it; the listener exists only during this call. `None` (socket removed) when
    /// smoltcp did not take the SYN.
    pub(crate) fn admit_syn(
        &mut self,
        dst: Ipv4Addr,
        port: u16,
        syn: &[u8],
        now: Instant,
    ) -> Option<SocketHandle> {
        let socket = listener(dst, port)?;
        let handle = self.sockets.add(socket);
        self.feed(syn, now);
        if self.sockets.get::<tcp::Socket>(handle).state() == State::SynReceived {
            Some(handle)
        } else {
            self.sockets.remove(handle);
            None
        }
    }

    /// A socket reset during the handshake goes back to LISTEN in smoltcp; a leftover listener
    /// could take another connection's SYN, so the flow ends here.
    fn tcp_drop_if_listening(&mut self, key: &FlowKey) {
        if let Some(r) = self.tcp.get(key) {
            if self.sockets.get::<tcp::Socket>(r.handle).state() == State::Listen {
                self.tcp_remove(key);
            }
        }
    }

    /// Removes a relayed connection (smoltcp socket and host socket).
    fn tcp_remove(&mut self, key: &FlowKey) {
        if let Some(r) = self.tcp.remove(key) {
            self.sockets.remove(r.handle);
        }
    }

    /// Moves data both ways for every relayed connection.
    pub(crate) fn tcp_relay(&mut self, now: Instant) {
        let room = !self.phy.is_full();
        let Nat {
            tcp,
            sockets,
            stats,
            ..
        } = self;
        for r in tcp.values_mut() {
            let socket = sockets.get_mut::<tcp::Socket>(r.handle);
            relay(r, socket, room, stats, now);
        }
    }

    /// Drops the connections both sides are done with (after egress, so final ACKs and RSTs
    /// have been queued). A connection in TIME-WAIT stays while egress was blocked this round:
    /// the ACK of the guest's FIN may not have left yet, and without the socket the guest's
    /// retransmitted FIN would be answered with RST.
    pub(crate) fn tcp_reclaim(&mut self, now: Instant) {
        let mut done = Vec::new();
        let egress_blocked = self.phy.tx_blocked;
        for (key, r) in self.tcp.iter_mut() {
            let socket = self.sockets.get::<tcp::Socket>(r.handle);
            let finished = match socket.state() {
                State::Listen => true,
                State::Closed => {
                    r.host = None;
                    let since = *r.closed_at.get_or_insert(now);
                    socket.local_endpoint().is_none() || now >= since + ABORT_GRACE
                }
                State::TimeWait => !egress_blocked && (r.host.is_none() || r.host_wr_shut),
                _ => false,
            };
            if finished {
                done.push(*key);
            }
        }
        for key in done {
            self.tcp_remove(&key);
        }
    }

    pub(crate) fn tcp_poll_fds(&self, room: bool, out: &mut Vec<(RawFd, i16)>) {
        for c in self.tcp_pending.values() {
            out.push((c.sock.as_raw_fd(), libc::POLLOUT));
        }
        for r in self.tcp.values() {
            let Some(host) = &r.host else {
                continue;
            };
            let socket = self.sockets.get::<tcp::Socket>(r.handle);
            let mut events = 0;
            if room && !r.host_eof && socket.can_send() {
                events |= libc::POLLIN;
            }
            if r.write_blocked && socket.can_recv() {
                events |= libc::POLLOUT;
            }
            if events != 0 {
                out.push((host.as_raw_fd(), events));
            }
        }
    }

    pub(crate) fn tcp_deadlines(&self, at: &mut impl FnMut(Instant)) {
        for c in self.tcp_pending.values() {
            at(c.deadline);
        }
        for r in self.tcp.values() {
            if let Some(t) = r.closed_at {
                at(t + ABORT_GRACE);
            }
        }
    }
}

/// What one host read or write into or out of a smoltcp buffer did.
enum Io {
    Moved(usize),
    Eof,
    Blocked,
    Failed(std::io::Error),
}

/// One relay round for one connection.
fn relay(r: &mut Relay, socket: &mut tcp::Socket, room: bool, stats: &mut NatStats, now: Instant) {
    let Some(host) = r.host.as_ref() else {
        return;
    };
    let mut failed = false;

    // Guest → host: take from smoltcp only what the host socket accepts.
    r.write_blocked = false;
    while socket.can_recv() {
        let res = socket.recv(|buf| match host::send(host, buf) {
            Ok(n) => (n, Io::Moved(n)),
            Err(e) if host::would_block(&e) => (0, Io::Blocked),
            Err(e) => (0, Io::Failed(e)),
        });
        match res {
            Ok(Io::Moved(0)) | Err(_) => break,
            Ok(Io::Moved(n)) => stats.tcp_bytes_to_host += n as u64,
            Ok(Io::Blocked) => {
                r.write_blocked = true;
                break;
            }
            Ok(Io::Eof) => break,
            Ok(Io::Failed(e)) => {
                log::debug!("net: host write: {e}");
                failed = true;
                break;
            }
        }
    }

    // The guest's FIN, once everything before it went out.
    if !failed && !r.host_wr_shut && fin_received(socket.state()) && !socket.can_recv() {
        r.host_wr_shut = true;
        if let Err(e) = host.shutdown(std::net::Shutdown::Write) {
            log::debug!("net: host shutdown: {e}");
            failed = true;
        }
    }

    // Host → guest: read only into free smoltcp buffer space, and only while the queue
    // toward the guest has room.
    if !failed && room && !r.host_eof {
        while socket.can_send() {
            let res = socket.send(|buf| {
                if buf.is_empty() {
                    return (0, Io::Blocked);
                }
                match host::recv(host, buf) {
                    Ok(0) => (0, Io::Eof),
                    Ok(n) => (n, Io::Moved(n)),
                    Err(e) if host::would_block(&e) => (0, Io::Blocked),
                    Err(e) => (0, Io::Failed(e)),
                }
            });
            match res {
                Ok(Io::Moved(n)) => stats.tcp_bytes_to_guest += n as u64,
                Ok(Io::Eof) => {
                    r.host_eof = true;
                    // FIN after the buffered data. From now on every segment of the guest
                    // is acknowledged at once: its FIN takes the socket to TIME-WAIT, where
                    // it is reclaimed right after egress, and a delayed ACK would never
                    // leave (the guest would resend its FIN and get RST).
                    socket.set_ack_delay(None);
                    socket.close();
                    break;
                }
                Ok(Io::Blocked) | Err(_) => break,
                Ok(Io::Failed(e)) => {
                    log::debug!("net: host read: {e}");
                    failed = true;
                    break;
                }
            }
        }
    }

    if failed {
        socket.abort();
        r.host = None;
        r.closed_at = Some(now);
        return;
    }
    if r.host_eof && r.host_wr_shut {
        // Both directions done on the host side.
        r.host = None;
    }
}
