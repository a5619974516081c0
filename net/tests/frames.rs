//! The NAT driven with raw Ethernet frames: ARP, ICMP, denials (immediate RST or ICMP), caps
//! and the rate limit, UDP, malformed frames, bounded queue.

use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use crate::common::*;
use smoltcp::wire::TcpControl;
use voidbox_net::{
    reasons, NetworkPolicy, Protocol, DNS_IP, GATEWAY_IP, GATEWAY_MAC, TO_GUEST_QUEUE,
    TO_GUEST_QUEUE_BYTES,
};

const WAIT: Duration = Duration::from_secs(5);

#[test]
fn arp_answers_gateway_and_dns_only() {
    let mut nat = nat(NetworkPolicy::default(), None);
    let now = Instant::now();
    for ip in [GATEWAY_IP, DNS_IP] {
        nat.from_guest(&arp_request(ip), now);
        let out = drain(&mut nat);
        assert_eq!(
            out,
            [Out::ArpReply {
                sender_ip: ip,
                sender_mac: smoltcp::wire::EthernetAddress(GATEWAY_MAC)
            }]
        );
    }
    for ip in [
        Ipv4Addr::new(10, 0, 2, 99),
        Ipv4Addr::new(8, 8, 8, 8),
        Ipv4Addr::new(10, 0, 2, 15),
    ] {
        nat.from_guest(&arp_request(ip), now);
        nat.poll(now);
        assert!(drain(&mut nat).is_empty(), "answered ARP for {ip}");
    }
    assert_eq!(nat.stats().arp_ignored, 3);
}

#[test]
fn icmp_echo_to_gateway_and_dns_is_answered_locally() {
    let mut nat = nat(NetworkPolicy::default(), None);
    let now = Instant::now();
    nat.from_guest(&arp_request(GATEWAY_IP), now);
    drain(&mut nat);
    for ip in [GATEWAY_IP, DNS_IP] {
        nat.from_guest(&icmp_echo(ip, 7, 1, b"ping"), now);
        let out = drain(&mut nat);
        assert_eq!(
            out,
            [Out::EchoReply {
                src: ip,
                ident: 7,
                seq_no: 1,
                data: b"ping".to_vec()
            }]
        );
    }
}

#[test]
fn icmp_echo_denied_gets_admin_prohibited_at_once() {
    let mut nat = nat(NetworkPolicy::default(), None);
    let now = Instant::now();
    let private = Ipv4Addr::new(10, 1, 1, 1);
    nat.from_guest(&icmp_echo(private, 9, 1, b"x"), now);
    assert_eq!(
        drain(&mut nat),
        [Out::Unreachable {
            src: GATEWAY_IP,
            code: 13,
            quoted_dst: private
        }]
    );
    let d = nat.denials();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].protocol, d[0].reason.as_str()),
        (Protocol::Icmp, reasons::PRIVATE_RANGE)
    );
}

/// A public echo through an unprivileged ping socket when the host allows them, else an
/// immediate ICMP error; never silence.
#[test]
fn icmp_echo_outside_uses_ping_socket_or_is_refused() {
    let policy = NetworkPolicy {
        allow: vec!["127.0.0.0/8".parse().unwrap()],
        ..NetworkPolicy::default()
    };
    let mut nat = nat(policy, None);
    nat.from_guest(
        &icmp_echo(Ipv4Addr::LOCALHOST, 77, 3, b"hello"),
        Instant::now(),
    );
    let out = wait_for(&mut nat, WAIT, |o| match o {
        Out::EchoReply { .. } | Out::Unreachable { .. } => Some(o.clone()),
        _ => None,
    });
    let unavailable = nat
        .denials()
        .iter()
        .any(|d| d.reason == reasons::PING_UNAVAILABLE);
    match out {
        Out::EchoReply {
            src,
            ident,
            seq_no,
            data,
        } => {
            assert!(!unavailable);
            assert_eq!(
                (src, ident, seq_no, data.as_slice()),
                (Ipv4Addr::LOCALHOST, 77, 3, &b"hello"[..])
            );
            assert_eq!(nat.stats().icmp_echo_replies, 1);
        }
        Out::Unreachable { code, .. } => {
            assert!(unavailable, "refused without a ping_group_range denial");
            assert_eq!(code, 13);
        }
        _ => unreachable!(),
    }
}

fn expect_rst(nat: &mut voidbox_net::Nat, dst: Ipv4Addr, sport: u16) {
    let out = drain(nat);
    assert!(
        out.iter().any(|o| matches!(o, Out::Tcp { src, dport, control: TcpControl::Rst, ack: Some(1001), .. } if *src == dst && *dport == sport)),
        "no RST in {out:?}"
    );
}

#[test]
fn denied_tcp_gets_rst_immediately_and_is_counted() {
    let policy = NetworkPolicy {
        allow_host_ports: vec![1],
        deny: vec!["198.51.100.0/24".parse().unwrap()],
        ..NetworkPolicy::default()
    };
    let mut nat = nat(policy, None);
    let now = Instant::now();
    let cases = [
        (GATEWAY_IP, 22, reasons::HOST_PORT_NOT_ALLOWED),
        (Ipv4Addr::new(192, 168, 1, 10), 80, reasons::PRIVATE_RANGE),
        (Ipv4Addr::new(127, 0, 0, 1), 80, reasons::LOOPBACK),
        (Ipv4Addr::new(169, 254, 169, 254), 80, reasons::METADATA),
        (Ipv4Addr::new(198, 51, 100, 7), 443, reasons::DENY_LIST),
        (Ipv4Addr::new(10, 0, 2, 7), 80, reasons::GUEST_NETWORK),
        (DNS_IP, 80, reasons::NOT_DNS_PORT),
    ];
    for (i, (dst, port, _)) in cases.iter().enumerate() {
        let sport = 5000 + i as u16;
        nat.from_guest(&tcp_syn(*dst, sport, *port), now);
        // Answered inside from_guest, before any poll.
        expect_rst(&mut nat, *dst, sport);
    }
    // The same denial again aggregates.
    nat.from_guest(&tcp_syn(GATEWAY_IP, 6000, 22), now);
    expect_rst(&mut nat, GATEWAY_IP, 6000);
    let denials = nat.denials();
    assert_eq!(denials.len(), cases.len());
    for (dst, port, reason) in cases {
        let d = denials
            .iter()
            .find(|d| d.destination == dst.to_string() && d.port == port)
            .unwrap_or_else(|| panic!("no denial for {dst}:{port}"));
        assert_eq!((d.protocol, d.reason.as_str()), (Protocol::Tcp, reason));
        let want = if dst == GATEWAY_IP { 2 } else { 1 };
        assert_eq!(d.count, want, "{dst}:{port}");
    }
    assert_eq!(
        nat.stats().tcp_connects,
        0,
        "no host connect for a denied SYN"
    );
}

#[test]
fn connection_refused_gets_rst() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut nat = nat(
        NetworkPolicy {
            allow_host_ports: vec![port],
            ..NetworkPolicy::default()
        },
        None,
    );
    nat.from_guest(&tcp_syn(GATEWAY_IP, 4444, port), Instant::now());
    let rst = wait_for(&mut nat, WAIT, |o| match o {
        Out::Tcp {
            control: TcpControl::Rst,
            dport: 4444,
            ack,
            ..
        } => Some(*ack),
        _ => None,
    });
    assert_eq!(rst, Some(1001));
    assert_eq!(nat.stats().tcp_connect_failures, 1);
    assert!(nat.denials().is_empty(), "refused is not a policy denial");
}

/// SYNs to a listening allowed port: the first ones get SYN-ACKs once the host accepted, the
/// one over the cap an immediate RST.
fn syn_burst(policy: NetworkPolicy, n: u16) -> (Vec<u16>, Vec<u16>, voidbox_net::Nat, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut nat = nat(
        NetworkPolicy {
            allow_host_ports: vec![port],
            ..policy
        },
        None,
    );
    let now = Instant::now();
    nat.from_guest(&arp_request(GATEWAY_IP), now);
    for i in 0..n {
        nat.from_guest(&tcp_syn(GATEWAY_IP, 7000 + i, port), now);
    }
    let mut synack = Vec::new();
    let mut rst = Vec::new();
    let deadline = Instant::now() + WAIT;
    while (synack.len() + rst.len()) < n as usize {
        assert!(Instant::now() < deadline, "answers: {synack:?} {rst:?}");
        let now = Instant::now();
        nat.poll(now);
        for o in drain(&mut nat) {
            if let Out::Tcp { dport, control, .. } = o {
                match control {
                    TcpControl::Syn => synack.push(dport),
                    TcpControl::Rst => rst.push(dport),
                    _ => {}
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (synack, rst, nat, listener)
}

#[test]
fn max_connections_caps_concurrent_flows() {
    let (synack, rst, nat, _l) = syn_burst(
        NetworkPolicy {
            max_connections: 2,
            ..NetworkPolicy::default()
        },
        3,
    );
    assert_eq!(synack, [7000, 7001]);
    assert_eq!(rst, [7002]);
    let d = nat.denials();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].reason, reasons::MAX_CONNECTIONS);
    assert_eq!(nat.stats().tcp_active, 2);
}

#[test]
fn connections_per_second_rate_limit() {
    let (mut synack, mut rst, mut nat, _l) = syn_burst(
        NetworkPolicy {
            connections_per_second: 3,
            max_connections: 100,
            ..NetworkPolicy::default()
        },
        5,
    );
    synack.sort();
    rst.sort();
    assert_eq!(synack, [7000, 7001, 7002]);
    assert_eq!(rst, [7003, 7004]);
    let d = nat.denials();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].reason.as_str(), d[0].count),
        (reasons::CONNECTIONS_PER_SECOND, 2)
    );
    // A token comes back after a third of a second.
    std::thread::sleep(Duration::from_millis(400));
    let port = d[0].port;
    nat.from_guest(&tcp_syn(GATEWAY_IP, 7100, port), Instant::now());
    let got = wait_for(&mut nat, WAIT, |o| match o {
        Out::Tcp {
            dport: 7100,
            control,
            ..
        } => Some(*control),
        _ => None,
    });
    assert_eq!(got, TcpControl::Syn);
}

#[test]
fn udp_round_trip_and_denial() {
    let host = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    host.set_read_timeout(Some(WAIT)).unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let (n, from) = host.recv_from(&mut buf).unwrap();
        let mut reply = b"echo:".to_vec();
        reply.extend_from_slice(&buf[..n]);
        host.send_to(&reply, from).unwrap();
    });
    let mut nat = nat(
        NetworkPolicy {
            allow_host_ports: vec![port],
            ..NetworkPolicy::default()
        },
        None,
    );
    nat.from_guest(&udp(GATEWAY_IP, 3333, port, b"hello udp"), Instant::now());
    let reply = wait_for(&mut nat, WAIT, |o| match o {
        Out::Udp {
            src,
            sport,
            dport: 3333,
            payload,
        } if *src == GATEWAY_IP && *sport == port => Some(payload.clone()),
        _ => None,
    });
    assert_eq!(reply, b"echo:hello udp");
    echo.join().unwrap();
    let s = nat.stats();
    assert_eq!(
        (
            s.udp_flows,
            s.udp_active,
            s.udp_bytes_to_host,
            s.udp_bytes_to_guest
        ),
        (1, 1, 9, 14)
    );

    let private = Ipv4Addr::new(172, 16, 0, 1);
    nat.from_guest(&udp(private, 3334, 53, b"q"), Instant::now());
    assert_eq!(
        drain(&mut nat),
        [Out::Unreachable {
            src: GATEWAY_IP,
            code: 13,
            quoted_dst: private
        }]
    );
    // Broadcast: counted, never answered.
    nat.from_guest(&udp(Ipv4Addr::BROADCAST, 68, 67, b"dhcp"), Instant::now());
    assert!(drain(&mut nat).is_empty());
    assert_eq!(nat.denials().len(), 2);
}

#[test]
fn udp_port_unreachable_from_host_reaches_guest() {
    let port = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let mut nat = nat(
        NetworkPolicy {
            allow_host_ports: vec![port],
            ..NetworkPolicy::default()
        },
        None,
    );
    nat.from_guest(&udp(GATEWAY_IP, 3335, port, b"anyone?"), Instant::now());
    let code = wait_for(&mut nat, WAIT, |o| match o {
        Out::Unreachable { code, .. } => Some(*code),
        _ => None,
    });
    assert_eq!(code, 3);
}

#[test]
fn malformed_frames_are_counted_never_panic() {
    let mut nat = nat(NetworkPolicy::default(), None);
    let now = Instant::now();
    let good = tcp_syn(GATEWAY_IP, 1234, 22);
    let mut bad: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 5],
        good[..13].to_vec(),            // truncated Ethernet
        good[..20].to_vec(),            // truncated IPv4
        good[..40].to_vec(),            // truncated TCP
        vec![0; voidbox_net::MTU + 15], // oversized
    ];
    let mut wrong_mac = good.clone();
    wrong_mac[0..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
    bad.push(wrong_mac);
    let mut other_src_mac = good.clone();
    other_src_mac[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
    bad.push(other_src_mac);
    let mut ipv6 = good.clone();
    ipv6[12..14].copy_from_slice(&[0x86, 0xdd]);
    bad.push(ipv6);
    let mut bad_ip_sum = good.clone();
    bad_ip_sum[14 + 10] ^= 0xff;
    bad.push(bad_ip_sum);
    let mut bad_tcp_sum = good.clone();
    let last = bad_tcp_sum.len() - 1;
    bad_tcp_sum[last] ^= 0x55;
    bad.push(bad_tcp_sum);
    let mut spoofed = udp(Ipv4Addr::new(1, 1, 1, 1), 1, 2, b"x");
    spoofed[14 + 12..14 + 16].copy_from_slice(&[10, 0, 2, 99]);
    // fix the IPv4 header checksum so only the source is wrong
    let mut p = smoltcp::wire::Ipv4Packet::new_unchecked(&mut spoofed[14..]);
    p.fill_checksum();
    bad.push(spoofed);
    let mut fragment = udp(Ipv4Addr::new(1, 1, 1, 1), 1, 2, b"x");
    let mut p = smoltcp::wire::Ipv4Packet::new_unchecked(&mut fragment[14..]);
    p.set_more_frags(true);
    p.fill_checksum();
    bad.push(fragment);
    let mut len_lies = good.clone();
    len_lies[14 + 2..14 + 4].copy_from_slice(&2000u16.to_be_bytes());
    let mut p = smoltcp::wire::Ipv4Packet::new_unchecked(&mut len_lies[14..]);
    p.fill_checksum();
    bad.push(len_lies);
    for f in &bad {
        nat.from_guest(f, now);
    }
    nat.poll(now);
    assert!(drain(&mut nat).is_empty());
    let s = nat.stats();
    assert_eq!(s.frames_from_guest, bad.len() as u64);
    assert_eq!(s.dropped_from_guest(), bad.len() as u64, "{s:?}");
    assert_eq!(s.dropped_oversized, 1);
    assert_eq!(s.dropped_wrong_mac, 1);
    assert_eq!(s.dropped_not_ipv4, 1);
    assert_eq!(s.dropped_bad_checksum, 2);
    assert_eq!(s.dropped_bad_source, 2);
    assert_eq!(s.dropped_fragments, 1);
    assert_eq!(s.dropped_malformed, 6);
    assert!(nat.denials().is_empty());
}

#[test]
fn queue_to_guest_is_bounded() {
    let mut nat = nat(NetworkPolicy::default(), None);
    let now = Instant::now();
    for _ in 0..(TO_GUEST_QUEUE + 100) {
        nat.from_guest(&arp_request(GATEWAY_IP), now);
    }
    let s = nat.stats();
    assert_eq!(s.queued_to_guest, TO_GUEST_QUEUE as u64);
    assert_eq!(drain(&mut nat).len(), TO_GUEST_QUEUE);
    // Replies dropped while full are not an error; the queue works again once drained.
    nat.from_guest(&arp_request(GATEWAY_IP), now);
    assert_eq!(drain(&mut nat).len(), 1);
}

/// Frames of up to the MTU: the queue toward the guest is bounded in bytes as well.
#[test]
fn queue_to_guest_is_bounded_in_bytes() {
    let mut nat = nat(NetworkPolicy::default(), None);
    let now = Instant::now();
    nat.from_guest(&arp_request(GATEWAY_IP), now);
    drain(&mut nat);
    let data = vec![0xab; voidbox_net::MTU - 28];
    let ping = icmp_echo(GATEWAY_IP, 7, 1, &data);
    assert_eq!(
        ping.len(),
        voidbox_net::MTU + 14,
        "a ping of the largest frame"
    );
    for _ in 0..100 {
        nat.from_guest(&ping, now);
        let s = nat.stats();
        assert!(
            s.queued_bytes_to_guest as usize <= TO_GUEST_QUEUE_BYTES + voidbox_net::MTU + 13,
            "{s:?}"
        );
    }
    let s = nat.stats();
    assert!(
        s.queued_bytes_to_guest as usize >= TO_GUEST_QUEUE_BYTES,
        "{s:?}"
    );
    let out = drain(&mut nat);
    assert_eq!(out.len() as u64, s.queued_to_guest);
    assert!(out.len() < 100 && out.len() < TO_GUEST_QUEUE);
    // Every reply is a whole MTU-sized echo reply.
    for o in &out {
        match o {
            Out::EchoReply { data: d, .. } => assert_eq!(d.len(), data.len()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(nat.stats().queued_bytes_to_guest, 0);
}

#[test]
fn poll_timeout_and_fds_when_idle() {
    let mut nat = nat(NetworkPolicy::default(), None);
    let now = Instant::now();
    nat.poll(now);
    assert_eq!(nat.poll_timeout(now), None, "nothing to wait for");
    let mut fds = Vec::new();
    nat.poll_fds(&mut fds);
    assert!(fds.is_empty());
}

#[test]
fn new_reads_resolv_conf_when_no_upstream() {
    let config = voidbox_net::NatConfig {
        policy: NetworkPolicy::default(),
        dns_upstreams: vec![],
        guest_mac: voidbox_net::DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix: Vec::new(),
        services: Vec::new(),
    };
    let host = std::fs::read_to_string("/etc/resolv.conf")
        .map(|t| voidbox_net::parse_resolv_conf(&t))
        .unwrap_or_default();
    match voidbox_net::Nat::new(config) {
        Ok(_) => assert!(!host.is_empty()),
        Err(voidbox_net::NatError::NoDnsUpstream(_)) => assert!(host.is_empty()),
        Err(e) => panic!("{e}"),
    }
}

/// A listener whose accept queue is full: the host's SYN is dropped, so a connect to it stays
/// in progress.
fn stuck_listener() -> (socket2::Socket, u16, Vec<std::net::TcpStream>) {
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    l.listen(0).unwrap();
    let port = l.local_addr().unwrap().as_socket().unwrap().port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let fill: Vec<_> = (0..3)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
        })
        .collect();
    (l, port, fill)
}

/// While the host connect is in progress the SYN is held (retransmits do not start more
/// connects); the connect times out into ICMP host unreachable; a guest RST cancels one.
#[test]
fn pending_connect_holds_syn_then_times_out() {
    let (_l, port, _fill) = stuck_listener();
    let mut nat = nat(
        NetworkPolicy {
            allow_host_ports: vec![port],
            ..NetworkPolicy::default()
        },
        None,
    );
    let t0 = Instant::now();
    nat.from_guest(&tcp_syn(GATEWAY_IP, 9000, port), t0);
    nat.from_guest(&tcp_syn(GATEWAY_IP, 9000, port), t0); // retransmit
    nat.from_guest(&tcp_syn(GATEWAY_IP, 9001, port), t0);
    nat.poll(t0);
    assert!(drain(&mut nat).is_empty(), "nothing until the host answers");
    let s = nat.stats();
    assert_eq!((s.tcp_connects, s.tcp_connecting), (2, 2));
    let mut fds = Vec::new();
    nat.poll_fds(&mut fds);
    assert_eq!(fds.len(), 2);
    assert!(fds.iter().all(|(_, ev)| *ev == libc::POLLOUT));
    let wait = nat.poll_timeout(t0).unwrap();
    assert!(
        wait <= voidbox_net::CONNECT_TIMEOUT && wait > Duration::from_secs(9),
        "{wait:?}"
    );
    // The guest gives up on one.
    nat.from_guest(
        &tcp_segment(GATEWAY_IP, 9001, port, TcpControl::Rst, 1001, None, &[]),
        t0,
    );
    assert_eq!(nat.stats().tcp_connecting, 1);
    // Ten seconds later (the NAT's clock is the caller's), the other one times out.
    let later = t0 + voidbox_net::CONNECT_TIMEOUT + Duration::from_millis(1);
    nat.poll(later);
    let out = drain(&mut nat);
    assert_eq!(
        out,
        [Out::Unreachable {
            src: GATEWAY_IP,
            code: 1,
            quoted_dst: GATEWAY_IP
        }]
    );
    let s = nat.stats();
    assert_eq!((s.tcp_connecting, s.tcp_connect_failures), (0, 1));
}
