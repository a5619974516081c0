//! DNS through the NAT against a real resolver (Debian's dnsmasq on loopback): forwarding
//! with id mapping, answers in denied ranges, `allow_domains` and pinning, DNS over TCP,
//! upstream failures.

use std::net::{IpAddr, Ipv4Addr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use crate::common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use smoltcp::socket::tcp::State;
use smoltcp::wire::TcpControl;
use voidbox_net::testing::{query_message, Dnsmasq};
use voidbox_net::{reasons, Nat, NetworkPolicy, Protocol, DNS_IP, GATEWAY_IP};

const WAIT: Duration = Duration::from_secs(5);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn addrs(m: &Message) -> Vec<IpAddr> {
    m.answers.iter().filter_map(|r| r.data.ip_addr()).collect()
}

#[test]
fn forwards_and_filters_answers_in_denied_ranges() {
    let dns = Dnsmasq::start(&[
        ("public.test", ip("93.184.216.34")),
        ("private.test", ip("10.1.2.3")),
        ("meta.test", ip("169.254.169.254")),
        ("exempt.test", ip("192.168.7.7")),
        ("blocked.test", ip("203.0.113.9")),
    ])
    .unwrap();
    let policy = NetworkPolicy {
        allow: vec!["192.168.7.0/24".parse().unwrap()],
        deny: vec!["203.0.113.0/24".parse().unwrap()],
        ..NetworkPolicy::default()
    };
    let mut nat = nat(policy, Some(dns.addr()));
    let m = ask_dns(&mut nat, 5300, 0x1234, "public.test", RecordType::A);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addrs(&m), [ip("93.184.216.34")]);
    let m = ask_dns(&mut nat, 5300, 0x1235, "exempt.test", RecordType::A);
    assert_eq!(
        addrs(&m),
        [ip("192.168.7.7")],
        "allow exempts from the default denies"
    );
    for (i, name) in ["private.test", "meta.test", "blocked.test"]
        .iter()
        .enumerate()
    {
        let m = ask_dns(&mut nat, 5301 + i as u16, 7, name, RecordType::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
        assert!(m.answers.is_empty());
    }
    let denials = nat.denials();
    let dns_denials: Vec<(&str, &str)> = denials
        .iter()
        .filter(|d| d.protocol == Protocol::Dns)
        .map(|d| (d.destination.as_str(), d.reason.as_str()))
        .collect();
    assert_eq!(
        dns_denials,
        [
            ("blocked.test", reasons::ANSWER_DENIED),
            ("meta.test", reasons::ANSWER_DENIED),
            ("private.test", reasons::ANSWER_DENIED)
        ]
    );
    let s = nat.stats();
    assert_eq!(
        (
            s.dns_queries,
            s.dns_answers,
            s.dns_filtered,
            s.dns_in_flight
        ),
        (5, 5, 3, 0)
    );
}

#[test]
fn allow_domains_answers_nxdomain_and_pins_addresses() {
    let (listener, port) = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        (l, p)
    };
    let dns = Dnsmasq::start_with(
        &[
            ("allowed.test", ip("127.0.0.1")),
            ("other.test", ip("127.0.0.1")),
        ],
        &[
            "--host-record=target.test,127.0.0.3",
            "--cname=alias.test,target.test",
        ],
    )
    .unwrap();
    let policy = NetworkPolicy {
        allow_domains: vec!["allowed.test".into(), "alias.test".into()],
        allow: vec!["127.0.0.0/8".parse().unwrap()],
        ..NetworkPolicy::default()
    };
    let mut nat = nat(policy, Some(dns.addr()));
    let now = Instant::now();
    nat.from_guest(&arp_request(GATEWAY_IP), now);

    let syn_answer = |nat: &mut Nat, dst: Ipv4Addr, sport: u16| {
        nat.from_guest(&tcp_syn(dst, sport, port), Instant::now());
        wait_for(nat, WAIT, |o| match o {
            Out::Tcp { dport, control, .. } if *dport == sport => Some(*control),
            _ => None,
        })
    };
    // Before any answer, the address is not pinned (allow does not bypass this).
    assert_eq!(
        syn_answer(&mut nat, Ipv4Addr::LOCALHOST, 6001),
        TcpControl::Rst
    );
    // A name outside allow_domains: NXDOMAIN without asking upstream.
    let m = ask_dns(&mut nat, 5400, 1, "other.test", RecordType::A);
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(nat.stats().dns_answers, 0);
    // The allowed name resolves, and its address becomes reachable.
    let m = ask_dns(&mut nat, 5401, 2, "Allowed.Test", RecordType::A);
    assert_eq!(addrs(&m), [ip("127.0.0.1")]);
    assert_eq!(
        syn_answer(&mut nat, Ipv4Addr::LOCALHOST, 6002),
        TcpControl::Syn
    );
    let _accepted = listener.accept().unwrap();
    // A literal IP nobody resolved stays out.
    assert_eq!(
        syn_answer(&mut nat, Ipv4Addr::new(127, 0, 0, 2), 6003),
        TcpControl::Rst
    );
    // Through a CNAME chain (a listener on that address too).
    let _l3 = TcpListener::bind(("127.0.0.3", port)).unwrap();
    let m = ask_dns(&mut nat, 5402, 3, "alias.test", RecordType::A);
    assert!(m.answers.iter().any(|r| matches!(r.data, RData::CNAME(_))));
    assert_eq!(addrs(&m), [ip("127.0.0.3")]);
    assert_eq!(
        syn_answer(&mut nat, Ipv4Addr::new(127, 0, 0, 3), 6004),
        TcpControl::Syn
    );

    let d = nat.denials();
    let find = |dest: &str, proto| {
        d.iter()
            .find(|x| x.destination == dest && x.protocol == proto)
    };
    assert_eq!(
        find("other.test", Protocol::Dns).unwrap().reason,
        reasons::DOMAIN_NOT_ALLOWED
    );
    assert_eq!(find("other.test", Protocol::Dns).unwrap().port, 53);
    assert_eq!(
        find("127.0.0.1", Protocol::Tcp).unwrap().reason,
        reasons::NOT_RESOLVED_ALLOWED_DOMAIN
    );
    assert_eq!(
        find("127.0.0.2", Protocol::Tcp).unwrap().reason,
        reasons::NOT_RESOLVED_ALLOWED_DOMAIN
    );
    assert_eq!(nat.stats().pinned_addresses, 2);
}

#[test]
fn dns_over_tcp() {
    let dns = Dnsmasq::start(&[("tcp.test", ip("93.184.216.35"))]).unwrap();
    let mut h = Harness::new(nat(NetworkPolicy::default(), Some(dns.addr())));
    let c = h.connect(DNS_IP, 53, 8192);
    h.run_until(WAIT, |h| h.state(c) == State::Established);
    let mut req = Vec::new();
    for (id, name) in [(11u16, "tcp.test"), (12, "tcp.test")] {
        let q = query_message(id, name, RecordType::A).unwrap();
        req.extend_from_slice(&(q.len() as u16).to_be_bytes());
        req.extend_from_slice(&q);
    }
    h.tcp(c).send_slice(&req).unwrap();
    let mut got = Vec::new();
    let mut answers = Vec::new();
    h.run_until(WAIT, |h| {
        let s = h.tcp(c);
        while s.can_recv() {
            s.recv(|b| {
                got.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        while got.len() >= 2 {
            let len = u16::from_be_bytes([got[0], got[1]]) as usize;
            if got.len() < 2 + len {
                break;
            }
            answers.push(Message::from_vec(&got[2..2 + len]).unwrap());
            got.drain(..2 + len);
        }
        answers.len() == 2
    });
    let mut ids: Vec<u16> = answers.iter().map(|m| m.metadata.id).collect();
    ids.sort();
    assert_eq!(ids, [11, 12]);
    for m in &answers {
        assert_eq!(addrs(m), [ip("93.184.216.35")]);
        assert!(m.edns.is_none(), "EDNS added for upstream is stripped");
    }
    h.tcp(c).close();
    h.run_until(WAIT, |h| {
        matches!(h.state(c), State::Closed | State::TimeWait)
    });
    h.run_until(WAIT, |h| h.nat.stats().dns_tcp_sessions == 0);
}

#[test]
fn upstream_failure_gives_servfail_after_next_upstream() {
    // The first upstream never answers (a bound socket that reads nothing), the second is
    // closed (ICMP port unreachable): SERVFAIL after the attempts, not silence.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let closed = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut nat = Nat::new(voidbox_net::NatConfig {
        policy: NetworkPolicy::default(),
        dns_upstreams: vec![silent.local_addr().unwrap(), closed],
        guest_mac: voidbox_net::DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix: Vec::new(),
        services: Vec::new(),
    })
    .unwrap();
    let q = query_message(99, "x.test", RecordType::A).unwrap();
    nat.from_guest(&udp(DNS_IP, 5500, 53, &q), Instant::now());
    let started = Instant::now();
    let payload = wait_for(&mut nat, WAIT, |o| match o {
        Out::Udp {
            dport: 5500,
            payload,
            ..
        } => Some(payload.clone()),
        _ => None,
    });
    let m = Message::from_vec(&payload).unwrap();
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (99, ResponseCode::ServFail)
    );
    assert!(
        started.elapsed() >= voidbox_net::DNS_ATTEMPT_TIMEOUT,
        "first upstream got its time"
    );
    assert_eq!(nat.stats().dns_failures, 1);
    let mut buf = [0u8; 512];
    silent.set_nonblocking(true).unwrap();
    assert!(
        silent.recv(&mut buf).is_ok(),
        "the first upstream was asked"
    );
}

#[test]
fn malformed_queries_get_formerr_or_nothing() {
    let dns = Dnsmasq::start(&[]).unwrap();
    let mut nat = nat(NetworkPolicy::default(), Some(dns.addr()));
    // A header with garbage after it: FORMERR with the same id.
    let mut junk = vec![0xab, 0xcd, 0x01, 0x00, 0x00, 0x05];
    junk.extend_from_slice(&[0xff; 20]);
    nat.from_guest(&udp(DNS_IP, 5600, 53, &junk), Instant::now());
    let out = drain(&mut nat);
    let [Out::Udp { payload, .. }] = out.as_slice() else {
        panic!("{out:?}")
    };
    let m = Message::from_vec(payload).unwrap();
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (0xabcd, ResponseCode::FormErr)
    );
    // Too short for a header: dropped.
    nat.from_guest(&udp(DNS_IP, 5600, 53, &[1]), Instant::now());
    assert!(drain(&mut nat).is_empty());
}
