//! Workflow services between two NATs, each with a smoltcp "guest" (the harness): NAT A
//! publishes a guest port on a Unix socket, NAT B routes a service name to it. Guest B
//! resolves the name through NAT B's DNS (with public egress off), connects, and talks to
//! guest A's listener both ways with half-close. Also: a port the service does not list, a
//! socket nobody listens on, names that are not services, and config errors.

use std::net::Ipv4Addr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use smoltcp::socket::tcp::{self, State};
use smoltcp::wire::TcpControl;
use voidbox_net::testing::query_message;
use voidbox_net::{
    reasons, service_addr, Nat, NatConfig, NatError, NetworkPolicy, PortTarget, Protocol,
    PublishUnix, ServicePort, ServiceRoute, DEFAULT_GUEST_MAC, DNS_IP, GATEWAY_IP, GUEST_IP,
};

const WAIT: Duration = Duration::from_secs(10);
const PORT: u16 = 8080;

fn config(publish_unix: Vec<PublishUnix>, services: Vec<ServiceRoute>) -> NatConfig {
    NatConfig {
        policy: NetworkPolicy {
            public_egress: false,
            // Service connections bypass the caps: none would be admitted otherwise.
            max_connections: 0,
            connections_per_second: 0,
            ..NetworkPolicy::default()
        },
        dns_upstreams: vec!["127.0.0.1:9".parse().unwrap()],
        guest_mac: DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix,
        services,
    }
}

fn web(path: &Path) -> ServiceRoute {
    ServiceRoute {
        name: "web".into(),
        addr: service_addr(0).unwrap(),
        ports: vec![ServicePort {
            port: PORT,
            to: PortTarget::Unix(path.to_path_buf()),
        }],
    }
}

fn a_records(m: &Message) -> Vec<(Ipv4Addr, u32)> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some((a.0, r.ttl)),
            _ => None,
        })
        .collect()
}

/// Pumps both harnesses until `done`, or panics after [`WAIT`].
fn run2(
    a: &mut Harness,
    b: &mut Harness,
    mut done: impl FnMut(&mut Harness, &mut Harness) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    while !done(a, b) {
        assert!(Instant::now() < deadline, "timed out");
        let moved = a.pump() | b.pump();
        if !moved {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Everything readable from a guest socket.
fn read_all(s: &mut tcp::Socket<'static>, into: &mut Vec<u8>) {
    while s.can_recv() {
        s.recv(|b| {
            into.extend_from_slice(b);
            (b.len(), ())
        })
        .unwrap();
    }
}

#[test]
fn a_dependent_reaches_a_service_by_name_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0-8080.sock");
    let nat_a = Nat::new(config(
        vec![PublishUnix {
            path: path.clone(),
            guest_port: PORT,
        }],
        Vec::new(),
    ))
    .expect("service nat");
    let meta = std::fs::metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(nat_a.published().is_empty(), "only TCP ports are listed");
    let mut nat_b = Nat::new(config(Vec::new(), vec![web(&path)])).expect("dependent nat");
    let addr = service_addr(0).unwrap();

    // DNS over UDP, with public egress off: A for the name only, exactly, any case.
    for name in ["web", "WEB.", "Web"] {
        let m = ask_dns(&mut nat_b, 5300, 5300, name, RecordType::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name}");
        assert_eq!(a_records(&m), [(addr, 5)], "{name}");
    }
    let m = ask_dns(&mut nat_b, 5301, 5301, "web", RecordType::AAAA);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty(), "{m:?}");
    for name in ["web.example.com", "www", "eb"] {
        let m = ask_dns(&mut nat_b, 5302, 5302, name, RecordType::A);
        assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name}");
    }
    assert!(
        nat_b
            .denials()
            .iter()
            .all(|d| d.protocol == Protocol::Dns && d.reason == reasons::NO_EGRESS),
        "{:?}",
        nat_b.denials()
    );

    let mut a = Harness::new(nat_a);
    let mut b = Harness::new(nat_b);

    // DNS over TCP answers the same.
    let c = b.connect(DNS_IP, 53, 8192);
    run2(&mut a, &mut b, |_, b| b.state(c) == State::Established);
    let q = query_message(77, "WEB", RecordType::A).unwrap();
    let mut req = (q.len() as u16).to_be_bytes().to_vec();
    req.extend_from_slice(&q);
    b.tcp(c).send_slice(&req).unwrap();
    let mut got = Vec::new();
    run2(&mut a, &mut b, |_, b| {
        read_all(b.tcp(c), &mut got);
        got.len() >= 2 && got.len() >= 2 + usize::from(u16::from_be_bytes([got[0], got[1]]))
    });
    let m = Message::from_vec(&got[2..]).unwrap();
    assert_eq!(m.metadata.id, 77);
    assert_eq!(a_records(&m), [(addr, 5)]);
    b.tcp(c).close();

    // Guest A listens; guest B connects to the service address.
    let mut listener = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; 1 << 20]),
        tcp::SocketBuffer::new(vec![0; 1 << 20]),
    );
    listener.listen(PORT).unwrap();
    let server = a.sockets.add(listener);
    // (The first SYN through the gateway waits for the harness's ARP: about a second.)
    let client = b.connect(addr, PORT, 1 << 20);
    run2(&mut a, &mut b, |a, b| {
        b.state(client) == State::Established && a.state(server) == State::Established
    });

    // B sends a request and closes its side; A echoes everything, then closes.
    let request = pattern(300_000, 5);
    let mut sent = 0;
    let mut echoed = Vec::new();
    let mut echo_sent = 0;
    let mut reply = Vec::new();
    run2(&mut a, &mut b, |a, b| {
        let s = b.tcp(client);
        if sent < request.len() && s.can_send() {
            sent += s.send_slice(&request[sent..]).unwrap();
            if sent == request.len() {
                s.close();
            }
        }
        read_all(s, &mut reply);
        let srv = a.tcp(server);
        read_all(srv, &mut echoed);
        while echo_sent < echoed.len() && srv.can_send() {
            let n = srv.send_slice(&echoed[echo_sent..]).unwrap();
            if n == 0 {
                break;
            }
            echo_sent += n;
        }
        if !srv.may_recv() && echo_sent == echoed.len() && srv.state() == State::CloseWait {
            srv.close();
        }
        reply.len() == request.len() && !b.tcp(client).may_recv()
    });
    assert!(echoed == request, "the request arrived changed");
    assert!(reply == request, "the echo arrived changed");
    // Both relays end, both closes clean: guest A's FIN (it closes last) is acknowledged.
    run2(&mut a, &mut b, |a, b| {
        matches!(b.state(client), State::Closed | State::TimeWait)
            && a.state(server) == State::Closed
            && a.nat.stats().tcp_active == 0
            && b.nat.stats().tcp_active == 0
    });

    assert_eq!((a.resets, b.resets), (0, 0), "a clean close was reset");

    let (sa, sb) = (a.nat.stats(), b.nat.stats());
    assert_eq!(sa.inbound_accepted, 1);
    assert_eq!(sb.service_connects, 1);
    assert_eq!((sb.tcp_connects, sb.tcp_established), (1, 1));
    assert!(a.nat.denials().is_empty(), "{:?}", a.nat.denials());
    assert!(
        b.nat.denials().iter().all(|d| d.protocol == Protocol::Dns),
        "no TCP denial despite no egress and no connection budget: {:?}",
        b.nat.denials()
    );
}

/// The guest's SYN to `dst:port` and the NAT's answer to it.
fn syn_answer(nat: &mut Nat, dst: Ipv4Addr, sport: u16, port: u16) -> TcpControl {
    nat.from_guest(&arp_request(GATEWAY_IP), Instant::now());
    nat.from_guest(&tcp_syn(dst, sport, port), Instant::now());
    wait_for(nat, WAIT, |o| match o {
        Out::Tcp { dport, control, .. } if *dport == sport => Some(*control),
        _ => None,
    })
}

#[test]
fn a_port_the_service_does_not_list_is_reset_and_denied() {
    let dir = tempfile::tempdir().unwrap();
    let mut nat = Nat::new(config(Vec::new(), vec![web(&dir.path().join("s"))])).unwrap();
    let addr = service_addr(0).unwrap();
    assert_eq!(syn_answer(&mut nat, addr, 7000, 22), TcpControl::Rst);
    let d = nat.denials();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0].destination.as_str(), d[0].port, d[0].protocol),
        (addr.to_string().as_str(), 22, Protocol::Tcp)
    );
    assert_eq!(d[0].reason, "not a port of service web");
    assert!(d[0].reason.starts_with(reasons::NOT_SERVICE_PORT));
    assert_eq!(nat.stats().tcp_connects, 0);
    // Other protocols to a service address are the policy's (here: no egress).
    nat.from_guest(&udp(addr, 7001, PORT, b"x"), Instant::now());
    let d = nat.denials();
    assert!(
        d.iter()
            .any(|d| d.protocol == Protocol::Udp && d.reason == reasons::NO_EGRESS),
        "{d:?}"
    );
}

/// A node runner's service on another machine (`apply --service NAME=IP`): the port is
/// connected to its TCP address, whatever the egress policy (none here); once nobody listens
/// there, the guest's SYN is reset.
#[test]
fn a_service_on_another_machine_is_reached_over_tcp() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let route = ServiceRoute {
        name: "web".into(),
        addr: service_addr(0).unwrap(),
        ports: vec![ServicePort {
            port: PORT,
            to: PortTarget::Tcp(listener.local_addr().unwrap()),
        }],
    };
    let mut nat = Nat::new(config(Vec::new(), vec![route.clone()])).unwrap();
    let addr = service_addr(0).unwrap();
    assert_eq!(syn_answer(&mut nat, addr, 7200, PORT), TcpControl::Syn);
    let (_conn, from) = listener.accept().unwrap();
    assert!(from.ip().is_loopback());
    assert_eq!(nat.stats().service_connects, 1);
    assert!(nat.denials().is_empty(), "{:?}", nat.denials());
    drop(listener);
    let mut nat = Nat::new(config(Vec::new(), vec![route])).unwrap();
    assert_eq!(syn_answer(&mut nat, addr, 7201, PORT), TcpControl::Rst);
}

#[test]
fn a_service_socket_nobody_listens_on_is_reset() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    let mut nat = Nat::new(config(Vec::new(), vec![web(&missing)])).unwrap();
    let addr = service_addr(0).unwrap();
    assert_eq!(syn_answer(&mut nat, addr, 7100, PORT), TcpControl::Rst);
    // A socket file whose listener is gone: refused, also RST.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let mut nat = Nat::new(config(Vec::new(), vec![web(&stale)])).unwrap();
    assert_eq!(syn_answer(&mut nat, addr, 7101, PORT), TcpControl::Rst);
    let s = nat.stats();
    assert_eq!(
        (s.tcp_connects, s.tcp_connect_failures, s.service_connects),
        (1, 1, 0)
    );
    assert!(nat.denials().is_empty(), "{:?}", nat.denials());
}

#[test]
fn a_published_unix_socket_that_cannot_be_bound_fails_the_nat() {
    let dir = tempfile::tempdir().unwrap();
    let taken = dir.path().join("taken.sock");
    std::fs::write(&taken, b"").unwrap();
    for path in [taken, dir.path().join("no-such-dir/s.sock")] {
        let publish = vec![PublishUnix {
            path: path.clone(),
            guest_port: PORT,
        }];
        match Nat::new(config(publish, Vec::new())) {
            Err(e @ NatError::PublishUnix { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&path.display().to_string()), "{msg}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("bound {}", path.display()),
        }
    }
}

#[test]
fn invalid_service_configs_are_refused() {
    let path = PathBuf::from("/nonexistent/s.sock");
    let route = |name: &str, addr: Ipv4Addr, port: u16| ServiceRoute {
        name: name.into(),
        addr,
        ports: vec![ServicePort {
            port,
            to: PortTarget::Unix(path.clone()),
        }],
    };
    let a1 = service_addr(0).unwrap();
    let a2 = service_addr(1).unwrap();
    let long = "a".repeat(64);
    let cases: Vec<(Vec<ServiceRoute>, &str)> = vec![
        (vec![route("", a1, 80)], "not a host name"),
        (vec![route("-web", a1, 80)], "not a host name"),
        (vec![route("web-", a1, 80)], "not a host name"),
        (vec![route("we_b", a1, 80)], "not a host name"),
        (vec![route("web.", a1, 80)], "not a host name"),
        (vec![route("a..b", a1, 80)], "not a host name"),
        (vec![route(&long, a1, 80)], "not a host name"),
        (vec![route("web", GATEWAY_IP, 80)], "guest's network"),
        (vec![route("web", DNS_IP, 80)], "guest's network"),
        (vec![route("web", GUEST_IP, 80)], "guest's network"),
        (
            vec![route("web", Ipv4Addr::new(10, 0, 2, 200), 80)],
            "guest's network",
        ),
        (
            vec![route("web", a1, 80), route("WEB", a2, 81)],
            "listed twice",
        ),
        (
            vec![route("web", a1, 80), route("db", a1, 81)],
            "share address",
        ),
        (vec![route("web", a1, 0)], "port 0"),
        (
            vec![ServiceRoute {
                ports: vec![
                    ServicePort {
                        port: 80,
                        to: PortTarget::Unix(path.clone()),
                    },
                    ServicePort {
                        port: 80,
                        to: PortTarget::Unix(path.clone()),
                    },
                ],
                ..route("web", a1, 80)
            }],
            "port 80 listed twice",
        ),
        (
            vec![route("web", a1, 80)]
                .into_iter()
                .map(|mut r| {
                    r.ports[0].to =
                        PortTarget::Unix(PathBuf::from(format!("/{}", "d".repeat(200))));
                    r
                })
                .collect(),
            "socket path",
        ),
    ];
    for (services, want) in cases {
        let what = format!("{services:?}");
        match Nat::new(config(Vec::new(), services)) {
            Err(e @ NatError::Config(_)) => {
                let msg = e.to_string();
                assert!(msg.contains(want), "{what}: {msg}");
            }
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
    let publish = vec![PublishUnix {
        path: path.clone(),
        guest_port: 0,
    }];
    assert!(matches!(
        Nat::new(config(publish, Vec::new())),
        Err(NatError::Config(_))
    ));
    // Valid: dotted names, digits, hyphens inside labels; the socket need not exist yet.
    for name in ["web", "my-db.internal", "a1", "x"] {
        let c = config(Vec::new(), vec![route(name, a1, 80)]);
        assert!(c.validate().is_ok(), "{name}");
        Nat::new(c).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
