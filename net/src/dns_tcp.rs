//! DNS over TCP at `DNS_IP:53`: a smoltcp socket per guest connection (at most
//! [`DNS_TCP_MAX_SESSIONS`]), two-byte length-prefixed messages, each query handled like a
//! UDP one (forwarded upstream over UDP with a large EDNS size) and its answer written back.

use std::time::Instant;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{self, State};

use crate::dns::{Outcome, ReplyTo};
use crate::frames::{self, TcpInfo};
use crate::{Nat, DNS_IP, DNS_TCP_IDLE_TIMEOUT, DNS_TCP_MAX_SESSIONS};

/// A length prefix and the largest message.
const RX_MAX: usize = 2 + 65535;
/// Queries of one connection in flight at once (more wait in the guest's window).
const MAX_QUERIES: usize = 4;
/// Answers buffered for one connection before it stops reading queries.
const TX_MAX: usize = 64 * 1024;

/// One DNS-over-TCP connection.
pub(crate) struct DnsSession {
    handle: SocketHandle,
    id: u64,
    /// Bytes of queries not complete yet.
    rx: Vec<u8>,
    /// Answers not yet taken by the smoltcp socket.
    tx: Vec<u8>,
    inflight: usize,
    last_active: Instant,
}

impl Nat {
    /// A segment to `DNS_IP:53`.
    pub(crate) fn dns_tcp_from_guest(&mut self, frame: &[u8], t: &TcpInfo, now: Instant) {
        if let Some(handle) = self.dns_tcp.get(&t.src_port).map(|s| s.handle) {
            let state = self.sockets.get::<tcp::Socket>(handle).state();
            let stale = matches!(state, State::TimeWait | State::Closed | State::Listen);
            if !(t.is_open() && stale) {
                self.feed(frame, now);
                if self.sockets.get::<tcp::Socket>(handle).state() == State::Listen {
                    self.dns_tcp_remove(t.src_port);
                }
                return;
            }
            self.dns_tcp_remove(t.src_port);
        }
        if !t.is_open() {
            self.feed(frame, now);
            return;
        }
        if self.dns_tcp.len() >= DNS_TCP_MAX_SESSIONS {
            self.send_to_guest(frames::tcp_rst(self.guest_mac, t));
            return;
        }
        match self.admit_syn(DNS_IP, 53, frame, now) {
            Some(handle) => {
                self.next_session += 1;
                self.dns_tcp.insert(
                    t.src_port,
                    DnsSession {
                        handle,
                        id: self.next_session,
                        rx: Vec::new(),
                        tx: Vec::new(),
                        inflight: 0,
                        last_active: now,
                    },
                );
            }
            None => self.send_to_guest(frames::tcp_rst(self.guest_mac, t)),
        }
    }

    fn dns_tcp_remove(&mut self, port: u16) {
        if let Some(s) = self.dns_tcp.remove(&port) {
            self.sockets.remove(s.handle);
        }
    }

    /// An upstream answer for the session `session` on guest port `port`.
    pub(crate) fn dns_tcp_answer(&mut self, port: u16, session: u64, reply: &[u8]) {
        let Some(s) = self.dns_tcp.get_mut(&port) else {
            return;
        };
        if s.id != session {
            return;
        }
        s.inflight = s.inflight.saturating_sub(1);
        let Ok(len) = u16::try_from(reply.len()) else {
            return;
        };
        if len == 0 {
            return;
        }
        s.tx.extend_from_slice(&len.to_be_bytes());
        s.tx.extend_from_slice(reply);
    }

    /// Reads queries, writes answers, closes finished connections.
    pub(crate) fn dns_tcp_poll(&mut self, now: Instant) {
        if self.dns_tcp.is_empty() {
            return;
        }
        let ports: Vec<u16> = self.dns_tcp.keys().copied().collect();
        for port in ports {
            let Some(mut s) = self.dns_tcp.remove(&port) else {
                continue;
            };
            if self.dns_session_step(&mut s, port, now) {
                self.dns_tcp.insert(port, s);
            } else {
                self.sockets.remove(s.handle);
            }
        }
    }

    /// One round for one session; false when it is over.
    fn dns_session_step(&mut self, s: &mut DnsSession, port: u16, now: Instant) -> bool {
        let mut queries = Vec::new();
        {
            let socket = self.sockets.get_mut::<tcp::Socket>(s.handle);
            flush(s, socket);
            while socket.can_recv()
                && s.rx.len() < RX_MAX
                && s.inflight + queries.len() < MAX_QUERIES
                && s.tx.len() < TX_MAX
            {
                let room = RX_MAX - s.rx.len();
                let rx = &mut s.rx;
                let got = socket.recv(|buf| {
                    let n = buf.len().min(room);
                    rx.extend_from_slice(&buf[..n]);
                    (n, n)
                });
                match got {
                    Ok(n) if n > 0 => s.last_active = now,
                    _ => break,
                }
                while let [hi, lo, ..] = s.rx[..] {
                    let len = usize::from(u16::from_be_bytes([hi, lo]));
                    if s.rx.len() < 2 + len {
                        break;
                    }
                    queries.push(s.rx[2..2 + len].to_vec());
                    s.rx.drain(..2 + len);
                }
            }
        }
        for q in queries {
            let to = ReplyTo::Tcp {
                port,
                session: s.id,
            };
            match self.dns_query(&q, to, now) {
                Outcome::Reply(reply) => {
                    if let Ok(len) = u16::try_from(reply.len()) {
                        s.tx.extend_from_slice(&len.to_be_bytes());
                        s.tx.extend_from_slice(&reply);
                    }
                }
                Outcome::Forwarded => s.inflight += 1,
                Outcome::Dropped => {}
            }
        }
        let socket = self.sockets.get_mut::<tcp::Socket>(s.handle);
        flush(s, socket);
        match socket.state() {
            State::Listen | State::TimeWait => return false,
            State::Closed => return socket.local_endpoint().is_some(),
            _ => {}
        }
        let fin = matches!(
            socket.state(),
            State::CloseWait | State::Closing | State::LastAck
        );
        if fin && !socket.can_recv() && s.inflight == 0 && s.tx.is_empty() {
            socket.close();
        }
        if now >= s.last_active + DNS_TCP_IDLE_TIMEOUT {
            socket.abort();
        }
        true
    }

    pub(crate) fn dns_tcp_deadlines(&self, at: &mut impl FnMut(Instant)) {
        for s in self.dns_tcp.values() {
            // An aborted session waits for room toward the guest, not for a timer.
            if self.sockets.get::<tcp::Socket>(s.handle).state() != State::Closed {
                at(s.last_active + DNS_TCP_IDLE_TIMEOUT);
            }
        }
    }
}

/// Moves buffered answers into the smoltcp socket.
fn flush(s: &mut DnsSession, socket: &mut tcp::Socket) {
    while !s.tx.is_empty() {
        match socket.send_slice(&s.tx) {
            Ok(n) if n > 0 => {
                s.tx.drain(..n);
            }
            _ => break,
        }
    }
}
