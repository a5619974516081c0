//! Published ports against a smoltcp "guest" (the harness): a real host TCP client reaches a
//! guest listener through the NAT both ways, with half-close; a guest port nobody listens on
//! closes the host connection; a host address in use fails the NAT when it is built; the
//! egress policy (here: none at all) does not apply to inbound connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::common::{pattern, Harness};
use smoltcp::socket::tcp;
use voidbox_net::{Nat, NatConfig, NatError, NetworkPolicy, Publish, DEFAULT_GUEST_MAC};

const GUEST_PORT: u16 = 8080;

fn config(host: SocketAddr) -> NatConfig {
    NatConfig {
        policy: NetworkPolicy {
            public_egress: false,
            ..NetworkPolicy::default()
        },
        dns_upstreams: vec!["127.0.0.1:9".parse().unwrap()],
        guest_mac: DEFAULT_GUEST_MAC,
        publish: vec![Publish {
            host,
            guest_port: GUEST_PORT,
        }],
        publish_unix: Vec::new(),
        services: Vec::new(),
    }
}

fn published(nat: &Nat) -> SocketAddr {
    let p = nat.published();
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].1, GUEST_PORT);
    p[0].0
}

#[test]
fn a_host_client_reaches_a_guest_listener_both_ways() {
    let nat = Nat::new(config("127.0.0.1:0".parse().unwrap())).expect("nat");
    let addr = published(&nat);
    let mut h = Harness::new(nat);
    let mut listener = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; 1 << 20]),
        tcp::SocketBuffer::new(vec![0; 1 << 20]),
    );
    listener.listen(GUEST_PORT).unwrap();
    let server = h.sockets.add(listener);

    let request = pattern(300_000, 3);
    let reply = pattern(200_000, 9);
    let client = {
        let (request, reply) = (request.clone(), reply.clone());
        std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).expect("connect");
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            c.write_all(&request).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            assert_eq!(got.len(), reply.len());
            assert!(got == reply, "the reply arrived changed");
        })
    };
    // The guest reads the whole request (until the client's FIN), then answers and closes.
    let mut received = Vec::new();
    h.run_until(Duration::from_secs(20), |h| {
        let s = h.tcp(server);
        while s.can_recv() {
            s.recv(|b| {
                received.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        !s.may_recv() && received.len() == request.len()
    });
    assert!(received == request, "the request arrived changed");
    let mut sent = 0;
    h.run_until(Duration::from_secs(20), |h| {
        let s = h.tcp(server);
        if sent < reply.len() && s.can_send() {
            sent += s.send_slice(&reply[sent..]).unwrap();
            if sent == reply.len() {
                s.close();
            }
        }
        sent == reply.len() && client.is_finished()
    });
    client.join().expect("client");
    let stats = h.nat.stats();
    assert_eq!(stats.inbound_accepted, 1);
    // Inbound traffic is not egress: nothing was denied.
    assert!(h.nat.denials().is_empty(), "{:?}", h.nat.denials());
}

#[test]
fn a_guest_port_without_listener_closes_the_host_connection() {
    let nat = Nat::new(config("127.0.0.1:0".parse().unwrap())).expect("nat");
    let addr = published(&nat);
    let mut h = Harness::new(nat);
    let client = std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 16];
        // EOF or a reset, never a hang.
        matches!(c.read(&mut buf), Ok(0) | Err(_))
    });
    h.run_until(Duration::from_secs(20), |_| client.is_finished());
    assert!(client.join().expect("client"));
}

#[test]
fn a_host_address_in_use_fails_the_nat() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    match Nat::new(config(addr)) {
        Err(e @ NatError::Publish { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&addr.to_string()), "{msg}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("bound an address in use"),
    }
}
