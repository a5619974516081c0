//! Published ports: TCP connections accepted on host addresses ([`crate::Publish`]) or on
//! Unix sockets ([`crate::PublishUnix`]) and relayed to a guest port. The NAT opens the
//! guest side itself — a smoltcp connect from [`GATEWAY_IP`] to the guest — and from then on
//! the connection is an ordinary relayed flow ([`crate::tcp`]), keyed by the guest's view of
//! it. A guest that does not listen answers with RST, which closes the host connection.
//!
//! Inbound connections are the host's, not the guest's: the egress policy does not apply to
//! them, and at most [`MAX_INBOUND`] are relayed at once, TCP and Unix together (more wait in
//! the listen backlog).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;

use smoltcp::wire::{IpAddress, IpEndpoint, IpListenEndpoint};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::tcp::{FlowKey, Relay};
use crate::{Nat, NatError, Publish, PublishUnix, GATEWAY_IP, GUEST_IP, MAX_INBOUND};

/// Listen backlog of each published port.
const BACKLOG: i32 = 128;
/// The NAT's own ports for the guest side of inbound connections.
const LOCAL_PORTS: std::ops::RangeInclusive<u16> = 40000..=60999;
/// Mode of a published Unix socket's file.
const SOCKET_MODE: u32 = 0o600;

/// A host listener (TCP or Unix) of one published port.
pub(crate) struct Listener {
    sock: Socket,
    guest_port: u16,
}

/// Binds every published address and Unix socket (non-blocking, close-on-exec): a port in
/// use, an address that is not local or a socket path that cannot be bound (the file exists,
/// its directory does not) fails the NAT before the VM starts.
pub(crate) fn bind(publish: &[Publish], unix: &[PublishUnix]) -> Result<Vec<Listener>, NatError> {
    let tcp = publish.iter().map(|p| {
        let fail = |source| NatError::Publish {
            addr: p.host,
            source,
        };
        let sock = Socket::new(
            Domain::for_address(p.host),
            Type::STREAM.nonblocking().cloexec(),
            Some(socket2::Protocol::TCP),
        )
        .map_err(fail)?;
        sock.set_reuse_address(true).map_err(fail)?;
        if p.host.is_ipv6() {
            sock.set_only_v6(true).map_err(fail)?;
        }
        sock.bind(&p.host.into()).map_err(fail)?;
        sock.listen(BACKLOG).map_err(fail)?;
        Ok(Listener {
            sock,
            guest_port: p.guest_port,
        })
    });
    let unix = unix.iter().map(|p| {
        let fail = |source| NatError::PublishUnix {
            path: p.path.clone(),
            source,
        };
        let addr = SockAddr::unix(&p.path).map_err(fail)?;
        let sock =
            Socket::new(Domain::UNIX, Type::STREAM.nonblocking().cloexec(), None).map_err(fail)?;
        sock.bind(&addr).map_err(fail)?;
        // Before `listen`: nobody can connect while the file has the umask's mode.
        let mode = std::fs::Permissions::from_mode(SOCKET_MODE);
        let ready = std::fs::set_permissions(&p.path, mode).and_then(|()| sock.listen(BACKLOG));
        if let Err(e) = ready {
            // The file is ours (bound just now).
            let _ = std::fs::remove_file(&p.path);
            return Err(fail(e));
        }
        Ok(Listener {
            sock,
            guest_port: p.guest_port,
        })
    });
    tcp.chain(unix).collect()
}

impl Nat {
    /// The host addresses the published TCP ports listen on (their port once bound, for a
    /// published port 0), with their guest ports; published Unix sockets are not listed.
    pub fn published(&self) -> Vec<(SocketAddr, u16)> {
        self.inbound
            .iter()
            .filter_map(|l| {
                let addr = l.sock.local_addr().ok()?.as_socket()?;
                Some((addr, l.guest_port))
            })
            .collect()
    }

    /// Accepts what the published ports have waiting (while there is room) and opens each
    /// connection's guest side.
    pub(crate) fn inbound_poll(&mut self) {
        for i in 0..self.inbound.len() {
            while self.inbound_active() < MAX_INBOUND {
                let accepted = self.inbound[i]
                    .sock
                    .accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
                let host = match accepted {
                    Ok((s, _)) => s,
                    Err(e) if crate::host::would_block(&e) => break,
                    Err(e) => {
                        log::debug!("net: accepting on a published port: {e}");
                        break;
                    }
                };
                let guest_port = self.inbound[i].guest_port;
                self.inbound_open(host, guest_port);
            }
        }
    }

    /// Connects a smoltcp socket from the gateway to the guest's `guest_port` and relays
    /// it to `host`.
    fn inbound_open(&mut self, host: Socket, guest_port: u16) {
        let Some(local_port) = self.inbound_port(guest_port) else {
            log::debug!("net: no free local port for an inbound connection");
            return;
        };
        let mut socket = crate::tcp::relay_socket();
        let remote = IpEndpoint::new(IpAddress::Ipv4(GUEST_IP), guest_port);
        let local = IpListenEndpoint {
            addr: Some(IpAddress::Ipv4(GATEWAY_IP)),
            port: local_port,
        };
        if let Err(e) = socket.connect(self.iface.context(), remote, local) {
            log::debug!("net: inbound connect to the guest: {e}");
            return;
        }
        let handle = self.sockets.add(socket);
        self.stats.inbound_accepted += 1;
        self.tcp.insert(
            FlowKey {
                guest_port,
                dst: GATEWAY_IP,
                dst_port: local_port,
            },
            Relay::new(handle, host, true),
        );
    }

    /// A local port no flow to the guest's `guest_port` uses.
    fn inbound_port(&mut self, guest_port: u16) -> Option<u16> {
        let span = u32::from(LOCAL_PORTS.end() - LOCAL_PORTS.start()) + 1;
        for _ in 0..span {
            let port = LOCAL_PORTS.start() + (self.next_inbound_port % span) as u16;
            self.next_inbound_port = self.next_inbound_port.wrapping_add(1);
            let key = FlowKey {
                guest_port,
                dst: GATEWAY_IP,
                dst_port: port,
            };
            if !self.tcp.contains_key(&key) {
                return Some(port);
            }
        }
        None
    }

    /// Inbound connections being relayed.
    fn inbound_active(&self) -> usize {
        self.tcp.values().filter(|r| r.inbound).count()
    }

    pub(crate) fn inbound_poll_fds(&self, room: bool, out: &mut Vec<(RawFd, i16)>) {
        if room && self.inbound_active() < MAX_INBOUND {
            out.extend(
                self.inbound
                    .iter()
                    .map(|l| (l.sock.as_raw_fd(), libc::POLLIN)),
            );
        }
    }
}
