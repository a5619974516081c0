//! The DNS proxy at `DNS_IP:53`: guest queries are parsed, answered locally for service
//! names ([`crate::services`]), answered REFUSED when `public_egress` is off, checked against `allow_domains`,
//! forwarded over UDP to the upstreams with our own ids (timeout, next upstream, SERVFAIL at
//! the end), and the answers filtered (addresses in denied ranges removed, NXDOMAIN when none
//! remains) and pinned (for `allow_domains`) before they reach the guest.

use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData};
use socket2::Socket;

use crate::policy::{normalize_name, reasons};
use crate::MAX_UDP_PAYLOAD;
use crate::{frames, host};
use crate::{Nat, Protocol, DNS_ATTEMPT_TIMEOUT, DNS_IP, DNS_MAX_ATTEMPTS, DNS_MAX_IN_FLIGHT};

/// EDNS payload size asked of upstreams for queries the guest sent over TCP.
const TCP_EDNS_PAYLOAD: u16 = 4096;
/// Longest CNAME chain followed when pinning.
const MAX_CHAIN: usize = 16;
/// Datagrams read per query socket per poll.
const READS_PER_POLL: usize = 8;

/// Where the answer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyTo {
    /// A UDP datagram to this guest port.
    Udp { port: u16 },
    /// The DNS-over-TCP connection from this guest port (`session` tells reused ports apart).
    Tcp { port: u16, session: u64 },
}

/// What became of a guest query.
pub(crate) enum Outcome {
    /// Answered at once (the encoded message).
    Reply(Vec<u8>),
    /// Sent upstream; the answer comes from [`Nat::dns_poll`].
    Forwarded,
    /// Ignored (not a query, or a retransmit of one in flight).
    Dropped,
}

/// A query sent upstream.
pub(crate) struct InFlight {
    sock: Socket,
    upstream: usize,
    attempts: u8,
    deadline: Instant,
    reply_to: ReplyTo,
    guest_id: u16,
    upstream_id: u16,
    /// The query as sent upstream.
    wire: Vec<u8>,
    question: Query,
    /// Normalized question name.
    qname: String,
    /// The name is in `allow_domains`: pin the answers.
    pin: bool,
    /// We added the EDNS record the guest did not send.
    strip_edns: bool,
    /// The guest's query had the RD bit.
    recursion_desired: bool,
}

/// The upstreams and the queries in flight.
pub(crate) struct DnsForwarder {
    upstreams: Vec<SocketAddr>,
    pub(crate) inflight: Vec<InFlight>,
}

impl DnsForwarder {
    pub(crate) fn new(upstreams: Vec<SocketAddr>) -> DnsForwarder {
        DnsForwarder {
            upstreams,
            inflight: Vec::new(),
        }
    }
}

/// A response to `query` with `code` and the question, nothing else.
fn error_reply(id: u16, question: Option<&Query>, rd: bool, code: ResponseCode) -> Vec<u8> {
    let mut m = Message::response(id, OpCode::Query);
    m.metadata.recursion_desired = rd;
    m.metadata.recursion_available = true;
    m.metadata.response_code = code;
    if let Some(q) = question {
        m.add_query(q.clone());
    }
    m.to_vec().unwrap_or_default()
}

/// FORMERR for bytes that are not a DNS message (when at least the id is there).
fn formerr_raw(payload: &[u8]) -> Outcome {
    match payload {
        [a, b, flags, ..] if flags & 0x80 == 0 => Outcome::Reply(error_reply(
            u16::from_be_bytes([*a, *b]),
            None,
            false,
            ResponseCode::FormErr,
        )),
        _ => Outcome::Dropped,
    }
}

fn name_of(name: &Name) -> String {
    normalize_name(&name.to_ascii())
}

/// Same question (name case-insensitively, type and class).
fn same_question(a: &Query, b: &Query) -> bool {
    a.query_type() == b.query_type()
        && a.query_class() == b.query_class()
        && a.name().eq_ignore_root(b.name())
}

impl Nat {
    /// A UDP datagram to `DNS_IP:53`.
    pub(crate) fn dns_udp_from_guest(&mut self, src_port: u16, payload: &[u8], now: Instant) {
        if let Outcome::Reply(reply) = self.dns_query(payload, ReplyTo::Udp { port: src_port }, now)
        {
            self.dns_deliver_udp(src_port, &reply);
        }
    }

    fn dns_deliver_udp(&mut self, port: u16, reply: &[u8]) {
        if reply.is_empty() || reply.len() > MAX_UDP_PAYLOAD {
            return;
        }
        let frame =
            frames::udp_to_guest(self.guest_mac, SocketAddrV4::new(DNS_IP, 53), port, reply);
        self.send_to_guest(frame);
    }

    /// One guest query (UDP or TCP).
    pub(crate) fn dns_query(&mut self, payload: &[u8], reply_to: ReplyTo, now: Instant) -> Outcome {
        self.stats.dns_queries += 1;
        let Ok(msg) = Message::from_vec(payload) else {
            return formerr_raw(payload);
        };
        let meta = msg.metadata;
        if meta.message_type != MessageType::Query {
            return Outcome::Dropped;
        }
        let rd = meta.recursion_desired;
        if meta.op_code != OpCode::Query {
            return Outcome::Reply(error_reply(meta.id, None, rd, ResponseCode::NotImp));
        }
        let [question] = msg.queries.as_slice() else {
            return Outcome::Reply(error_reply(meta.id, None, rd, ResponseCode::FormErr));
        };
        let qname = name_of(question.name());
        if let Some(reply) = self.service_dns(&qname, meta.id, question, rd) {
            return Outcome::Reply(reply);
        }
        if !self.policy.public_egress() {
            self.deny(qname, 53, Protocol::Dns, reasons::NO_EGRESS);
            return Outcome::Reply(error_reply(
                meta.id,
                Some(question),
                rd,
                ResponseCode::Refused,
            ));
        }
        let pin = self.policy.has_domains();
        if pin && !self.policy.domain_allowed(&qname) {
            self.deny(qname, 53, Protocol::Dns, reasons::DOMAIN_NOT_ALLOWED);
            return Outcome::Reply(error_reply(
                meta.id,
                Some(question),
                rd,
                ResponseCode::NXDomain,
            ));
        }
        if self
            .dns
            .inflight
            .iter()
            .any(|q| q.reply_to == reply_to && q.guest_id == meta.id)
        {
            return Outcome::Dropped;
        }
        if self.dns.inflight.len() >= DNS_MAX_IN_FLIGHT {
            self.stats.dns_failures += 1;
            return Outcome::Reply(error_reply(
                meta.id,
                Some(question),
                rd,
                ResponseCode::ServFail,
            ));
        }
        let upstream_id = self.dns_fresh_id();
        let question = question.clone();
        let mut up = msg;
        up.metadata.id = upstream_id;
        let mut strip_edns = false;
        match reply_to {
            ReplyTo::Udp { .. } => {
                // Answers must fit one frame toward the guest: let upstreams truncate.
                if let Some(edns) = up.edns.as_mut() {
                    if usize::from(edns.max_payload()) > MAX_UDP_PAYLOAD {
                        edns.set_max_payload(MAX_UDP_PAYLOAD as u16);
                    }
                }
            }
            ReplyTo::Tcp { .. } => {
                // The guest came over TCP for a large answer; ask for one over UDP.
                match up.edns.as_mut() {
                    Some(edns) => {
                        edns.set_max_payload(edns.max_payload().max(TCP_EDNS_PAYLOAD));
                    }
                    None => {
                        let mut edns = Edns::new();
                        edns.set_max_payload(TCP_EDNS_PAYLOAD);
                        up.edns = Some(edns);
                        strip_edns = true;
                    }
                }
            }
        }
        let Ok(wire) = up.to_vec() else {
            self.stats.dns_failures += 1;
            return Outcome::Reply(error_reply(
                meta.id,
                Some(&question),
                rd,
                ResponseCode::ServFail,
            ));
        };
        let Some((sock, upstream)) = self.dns_send(&wire, 0) else {
            self.stats.dns_failures += 1;
            return Outcome::Reply(error_reply(
                meta.id,
                Some(&question),
                rd,
                ResponseCode::ServFail,
            ));
        };
        self.dns.inflight.push(InFlight {
            sock,
            upstream,
            attempts: 1,
            deadline: now + DNS_ATTEMPT_TIMEOUT,
            reply_to,
            guest_id: meta.id,
            upstream_id,
            wire,
            question,
            qname,
            pin,
            strip_edns,
            recursion_desired: rd,
        });
        Outcome::Forwarded
    }

    /// An id no query in flight uses.
    fn dns_fresh_id(&mut self) -> u16 {
        loop {
            let id = self.rng.next_u64() as u16;
            if !self.dns.inflight.iter().any(|q| q.upstream_id == id) {
                return id;
            }
        }
    }

    /// Sends `wire` to the first upstream, from index `first` on, that takes it (a fresh
    /// connected socket: a new source port per attempt).
    fn dns_send(&mut self, wire: &[u8], first: usize) -> Option<(Socket, usize)> {
        let n = self.dns.upstreams.len();
        for i in 0..n {
            let idx = (first + i) % n;
            let addr = self.dns.upstreams[idx];
            let sock = match host::udp_connect(addr) {
                Ok(s) => s,
                Err(e) => {
                    log::debug!("net: dns upstream {addr}: {e}");
                    continue;
                }
            };
            match host::send(&sock, wire) {
                Ok(_) => return Some((sock, idx)),
                Err(e) => log::debug!("net: dns upstream {addr}: {e}"),
            }
        }
        None
    }

    /// Reads upstream answers, retries timed-out queries, answers SERVFAIL when attempts run
    /// out.
    pub(crate) fn dns_poll(&mut self, now: Instant) {
        if self.dns.inflight.is_empty() {
            return;
        }
        let list = std::mem::take(&mut self.dns.inflight);
        let mut keep = Vec::with_capacity(list.len());
        for mut q in list {
            let deliverable = match q.reply_to {
                ReplyTo::Udp { .. } => !self.phy.is_full(),
                ReplyTo::Tcp { .. } => true,
            };
            let mut answer = None;
            let mut retry_now = false;
            if deliverable {
                for _ in 0..READS_PER_POLL {
                    match host::recv(&q.sock, &mut self.scratch) {
                        Ok(n) => {
                            let bytes = self.scratch.get(..n).unwrap_or(&[]);
                            if let Some(m) = self.dns_accept_answer(&q, bytes) {
                                answer = Some(m);
                                break;
                            }
                        }
                        Err(e) if host::would_block(&e) => break,
                        Err(e) => {
                            // ICMP port unreachable and the like: next upstream at once.
                            log::debug!("net: dns upstream: {e}");
                            retry_now = true;
                            break;
                        }
                    }
                }
            }
            if let Some(m) = answer {
                self.stats.dns_answers += 1;
                let reply = self.dns_finish(&q, m);
                self.dns_deliver(q.reply_to, reply);
                continue;
            }
            if retry_now || now >= q.deadline {
                if q.attempts >= DNS_MAX_ATTEMPTS {
                    self.stats.dns_failures += 1;
                    let reply = error_reply(
                        q.guest_id,
                        Some(&q.question),
                        q.recursion_desired,
                        ResponseCode::ServFail,
                    );
                    self.dns_deliver(q.reply_to, reply);
                    continue;
                }
                q.attempts += 1;
                let next = q.upstream + 1;
                match self.dns_send(&q.wire, next) {
                    Some((sock, idx)) => {
                        q.sock = sock;
                        q.upstream = idx;
                        q.deadline = now + DNS_ATTEMPT_TIMEOUT;
                    }
                    None => {
                        self.stats.dns_failures += 1;
                        let reply = error_reply(
                            q.guest_id,
                            Some(&q.question),
                            q.recursion_desired,
                            ResponseCode::ServFail,
                        );
                        self.dns_deliver(q.reply_to, reply);
                        continue;
                    }
                }
            }
            keep.push(q);
        }
        self.dns.inflight = keep;
    }

    /// The upstream's answer to `q`, if `bytes` is one (id, QR bit and question must match;
    /// anything else is ignored as stray or spoofed).
    fn dns_accept_answer(&self, q: &InFlight, bytes: &[u8]) -> Option<Message> {
        let m = Message::from_vec(bytes).ok()?;
        if m.metadata.id != q.upstream_id || m.metadata.message_type != MessageType::Response {
            return None;
        }
        match m.queries.as_slice() {
            [question] if same_question(question, &q.question) => Some(m),
            _ => None,
        }
    }

    /// Filters and pins an upstream answer and encodes it for the guest.
    fn dns_finish(&mut self, q: &InFlight, mut m: Message) -> Vec<u8> {
        self.dns_filter(&mut m, &q.qname, q.pin);
        m.metadata.id = q.guest_id;
        if q.strip_edns {
            m.edns = None;
        }
        let Ok(bytes) = m.to_vec() else {
            self.stats.dns_failures += 1;
            return error_reply(
                q.guest_id,
                Some(&q.question),
                q.recursion_desired,
                ResponseCode::ServFail,
            );
        };
        match q.reply_to {
            ReplyTo::Udp { .. } if bytes.len() > MAX_UDP_PAYLOAD => {
                // Too large for one frame: the guest retries over TCP.
                m.truncate().to_vec().unwrap_or_default()
            }
            _ => bytes,
        }
    }

    /// Removes A/AAAA records in denied ranges (NXDOMAIN when an answer had addresses and
    /// none remains) and pins the addresses of the question's CNAME chain.
    fn dns_filter(&mut self, m: &mut Message, qname: &str, pin: bool) {
        let policy = &self.policy;
        let had = m.answers.iter().any(|r| r.data.ip_addr().is_some());
        m.answers
            .retain(|r| r.data.ip_addr().is_none_or(|ip| !policy.address_denied(ip)));
        m.additionals
            .retain(|r| r.data.ip_addr().is_none_or(|ip| !policy.address_denied(ip)));
        let has = m.answers.iter().any(|r| r.data.ip_addr().is_some());
        if had && !has {
            m.answers.clear();
            m.authorities.clear();
            m.additionals.clear();
            m.metadata.response_code = ResponseCode::NXDomain;
            self.stats.dns_filtered += 1;
            self.deny(qname.to_string(), 53, Protocol::Dns, reasons::ANSWER_DENIED);
            return;
        }
        if !pin {
            return;
        }
        let mut chain = vec![qname.to_string()];
        for _ in 0..MAX_CHAIN {
            let mut grew = false;
            for r in &m.answers {
                if let RData::CNAME(target) = &r.data {
                    let target = name_of(&target.0);
                    if chain.contains(&name_of(&r.name)) && !chain.contains(&target) {
                        chain.push(target);
                        grew = true;
                    }
                }
            }
            if !grew {
                break;
            }
        }
        let addrs: Vec<_> = m
            .answers
            .iter()
            .filter(|r| chain.contains(&name_of(&r.name)))
            .filter_map(|r| r.data.ip_addr())
            .collect();
        for ip in addrs {
            if !self.policy.pin(ip) {
                log::debug!("net: pin table full, {ip} for {qname} not pinned");
            }
        }
    }

    /// Hands an answer to the guest over UDP or its TCP session.
    fn dns_deliver(&mut self, to: ReplyTo, reply: Vec<u8>) {
        match to {
            ReplyTo::Udp { port } => self.dns_deliver_udp(port, &reply),
            ReplyTo::Tcp { port, session } => self.dns_tcp_answer(port, session, &reply),
        }
    }

    pub(crate) fn dns_poll_fds(&self, room: bool, out: &mut Vec<(RawFd, i16)>) {
        for q in &self.dns.inflight {
            if room || matches!(q.reply_to, ReplyTo::Tcp { .. }) {
                out.push((q.sock.as_raw_fd(), libc::POLLIN));
            }
        }
    }

    pub(crate) fn dns_deadlines(&self, at: &mut impl FnMut(Instant)) {
        for q in &self.dns.inflight {
            at(q.deadline);
        }
        self.dns_tcp_deadlines(at);
    }
}
