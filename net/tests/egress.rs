//! `public_egress: false` (an agent node without network): the guest reaches its gateway's
//! allowed host ports and nothing else; DNS questions are answered REFUSED and never
//! forwarded. Real host sockets, a real resolver (dnsmasq) and a smoltcp guest stack.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use crate::common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use smoltcp::socket::tcp::State;
use smoltcp::wire::TcpControl;
use voidbox_net::testing::{query_message, Dnsmasq};
use voidbox_net::{reasons, NetworkPolicy, Protocol, DNS_IP, GATEWAY_IP};

const WAIT: Duration = Duration::from_secs(5);

fn no_egress(port: u16) -> NetworkPolicy {
    NetworkPolicy {
        allow_host_ports: vec![port],
        // `allow` does not reopen anything once public egress is off.
        allow: vec!["0.0.0.0/0".parse().unwrap()],
        public_egress: false,
        ..NetworkPolicy::default()
    }
}

/// The gateway port works end to end; every other destination is refused at once.
#[test]
fn only_the_gateway_port_is_reachable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"pong").unwrap();
        buf
    });
    let mut h = Harness::new(nat(no_egress(port), None));
    let c = h.connect(GATEWAY_IP, port, 4096);
    h.run_until(WAIT, |h| h.state(c) == State::Established);
    h.tcp(c).send_slice(b"ping").unwrap();
    let mut got = Vec::new();
    h.run_until(WAIT, |h| {
        let s = h.tcp(c);
        while s.can_recv() {
            s.recv(|b| {
                got.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        got.len() >= 4
    });
    assert_eq!(got, b"pong");
    assert_eq!(&server.join().unwrap(), b"ping");

    let mut nat = nat(no_egress(port), None);
    let now = Instant::now();
    let denied_tcp = [
        (Ipv4Addr::new(93, 184, 216, 34), 443, reasons::NO_EGRESS),
        (Ipv4Addr::LOCALHOST, port, reasons::NO_EGRESS),
        (GATEWAY_IP, 22, reasons::HOST_PORT_NOT_ALLOWED),
    ];
    for (i, (dst, dport, _)) in denied_tcp.iter().enumerate() {
        let sport = 7000 + i as u16;
        nat.from_guest(&tcp_syn(*dst, sport, *dport), now);
        let out = drain(&mut nat);
        assert!(
            out.iter().any(|o| matches!(o, Out::Tcp { src, dport: d, control: TcpControl::Rst, .. } if src == dst && *d == sport)),
            "no RST for {dst}:{dport} in {out:?}"
        );
    }
    let public = Ipv4Addr::new(8, 8, 8, 8);
    nat.from_guest(&udp(public, 3000, 53, b"q"), now);
    nat.from_guest(&icmp_echo(Ipv4Addr::new(1, 1, 1, 1), 5, 1, b"x"), now);
    let out = drain(&mut nat);
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, Out::Unreachable { code: 13, .. }))
            .count(),
        2,
        "UDP and ICMP get admin-prohibited: {out:?}"
    );
    let denials = nat.denials();
    for (dst, dport, reason) in denied_tcp {
        assert!(
            denials.iter().any(|d| d.destination == dst.to_string()
                && d.port == dport
                && d.protocol == Protocol::Tcp
                && d.reason == reason),
            "{dst}:{dport} not denied as {reason}: {denials:?}"
        );
    }
    for (dst, proto) in [("8.8.8.8", Protocol::Udp), ("1.1.1.1", Protocol::Icmp)] {
        assert!(
            denials
                .iter()
                .any(|d| d.destination == dst && d.protocol == proto && d.reason == "no_egress"),
            "{dst} {proto:?}: {denials:?}"
        );
    }
    assert_eq!(nat.stats().tcp_connects, 0, "no host connect was attempted");
}

/// DNS over UDP and TCP is answered REFUSED by the NAT itself: the upstream is never asked.
#[test]
fn dns_is_refused_and_never_forwarded() {
    let dns = Dnsmasq::start(&[("api.example.test", "93.184.216.34".parse().unwrap())]).unwrap();
    let mut nat = nat(no_egress(1), Some(dns.addr()));
    let q = query_message(0x4242, "api.example.test", RecordType::A).unwrap();
    nat.from_guest(&udp(DNS_IP, 5353, 53, &q), Instant::now());
    let payload = wait_for(&mut nat, WAIT, |o| match o {
        Out::Udp {
            src,
            sport: 53,
            dport: 5353,
            payload,
        } if *src == DNS_IP => Some(payload.clone()),
        _ => None,
    });
    let m = Message::from_vec(&payload).unwrap();
    assert_eq!(m.metadata.id, 0x4242);
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    assert!(m.answers.is_empty());

    let mut h = Harness::new(nat);
    let c = h.connect(DNS_IP, 53, 4096);
    h.run_until(WAIT, |h| h.state(c) == State::Established);
    let q = query_message(0x4343, "api.example.test", RecordType::A).unwrap();
    let mut req = (q.len() as u16).to_be_bytes().to_vec();
    req.extend_from_slice(&q);
    h.tcp(c).send_slice(&req).unwrap();
    let mut got = Vec::new();
    h.run_until(WAIT, |h| {
        let s = h.tcp(c);
        while s.can_recv() {
            s.recv(|b| {
                got.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        got.len() >= 2 && got.len() >= 2 + u16::from_be_bytes([got[0], got[1]]) as usize
    });
    let m = Message::from_vec(&got[2..]).unwrap();
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (0x4343, ResponseCode::Refused)
    );

    let s = h.nat.stats();
    assert_eq!((s.dns_queries, s.dns_answers, s.dns_in_flight), (2, 0, 0));
    let d: Vec<_> = h
        .nat
        .denials()
        .into_iter()
        .filter(|d| d.protocol == Protocol::Dns)
        .collect();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0].destination.as_str(), d[0].reason.as_str(), d[0].count),
        ("api.example.test", reasons::NO_EGRESS, 2)
    );
}
