//! Host sockets (socket2, no `unsafe`): every socket is created with `SOCK_NONBLOCK |
//! SOCK_CLOEXEC`, so the NAT needs only `socket`, `connect`, `getsockopt(SO_ERROR)`,
//! `sendto`, `recvfrom`, `shutdown` and `close` (and `accept4` for published ports).

use std::io::{self, Read};
use std::net::{SocketAddr, SocketAddrV4};

use smoltcp::wire::Icmpv4DstUnreachable;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// A stream socket for `addr` and a non-blocking `connect` (in progress or done):
/// `socket(AF_INET, SOCK_STREAM|SOCK_NONBLOCK|SOCK_CLOEXEC, IPPROTO_TCP)` for an IPv4
/// address, `socket(AF_UNIX, SOCK_STREAM|SOCK_NONBLOCK|SOCK_CLOEXEC, 0)` for a Unix socket
/// path (whose connect completes at once or fails: `ECONNREFUSED`, `ENOENT`, `EAGAIN` when
/// the listener's backlog is full).
pub(crate) fn stream_connect(addr: &SockAddr) -> io::Result<Socket> {
    let protocol = if addr.is_unix() {
        None
    } else {
        Some(Protocol::TCP)
    };
    let socket = Socket::new(addr.domain(), Type::STREAM.nonblocking(), protocol)?;
    match socket.connect(addr) {
        Ok(()) => Ok(socket),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(socket),
        Err(e) => Err(e),
    }
}

/// Where a non-blocking connect stands.
pub(crate) enum Connect {
    Pending,
    Connected,
    Failed(io::Error),
}

/// `getsockopt(SO_ERROR)`, then `connect` again (`EISCONN`/0: connected, `EALREADY`: pending).
pub(crate) fn connect_state(socket: &Socket, addr: &SockAddr) -> Connect {
    match socket.take_error() {
        Ok(Some(e)) | Err(e) => return Connect::Failed(e),
        Ok(None) => {}
    }
    match socket.connect(addr) {
        Ok(()) => Connect::Connected,
        Err(e) => match e.raw_os_error() {
            Some(libc::EISCONN) => Connect::Connected,
            Some(libc::EALREADY) | Some(libc::EINPROGRESS) => Connect::Pending,
            _ => Connect::Failed(e),
        },
    }
}

/// `socket(AF_INET[6], SOCK_DGRAM|SOCK_NONBLOCK|SOCK_CLOEXEC, IPPROTO_UDP)`, connected.
pub(crate) fn udp_connect(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::DGRAM.nonblocking(),
        Some(Protocol::UDP),
    )?;
    socket.connect(&SockAddr::from(addr))?;
    Ok(socket)
}

/// `socket(AF_INET, SOCK_DGRAM|SOCK_NONBLOCK|SOCK_CLOEXEC, IPPROTO_ICMP)` (an unprivileged
/// ping socket, allowed by `net.ipv4.ping_group_range`), connected to `dst`.
pub(crate) fn ping_connect(dst: std::net::Ipv4Addr) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::IPV4,
        Type::DGRAM.nonblocking(),
        Some(Protocol::ICMPV4),
    )?;
    socket.connect(&SockAddr::from(SocketAddrV4::new(dst, 0)))?;
    Ok(socket)
}

/// `sendto` without SIGPIPE.
pub(crate) fn send(socket: &Socket, buf: &[u8]) -> io::Result<usize> {
    socket.send_with_flags(buf, libc::MSG_NOSIGNAL)
}

/// `recvfrom` into an initialized buffer.
pub(crate) fn recv(socket: &Socket, buf: &mut [u8]) -> io::Result<usize> {
    let mut s = socket;
    s.read(buf)
}

pub(crate) fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted
}

/// How a failed host connect is reported to the guest.
pub(crate) enum Refusal {
    /// TCP RST (connection refused, and anything unexpected).
    Reset,
    /// ICMP destination unreachable with this code.
    Unreachable(Icmpv4DstUnreachable),
}

pub(crate) fn refusal(e: &io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(libc::ENETUNREACH) | Some(libc::ENETDOWN) => {
            Refusal::Unreachable(Icmpv4DstUnreachable::NetUnreachable)
        }
        Some(libc::EHOSTUNREACH) | Some(libc::EHOSTDOWN) | Some(libc::ETIMEDOUT) => {
            Refusal::Unreachable(Icmpv4DstUnreachable::HostUnreachable)
        }
        Some(libc::EACCES) | Some(libc::EPERM) => {
            Refusal::Unreachable(Icmpv4DstUnreachable::CommProhibited)
        }
        _ => Refusal::Reset,
    }
}
