//! TCP through the NAT with a real TCP implementation on both sides: a smoltcp interface as
//! the guest, real host sockets on loopback.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use smoltcp::socket::tcp::State;
use voidbox_net::{NetworkPolicy, GATEWAY_IP, TCP_BUFFER, TO_GUEST_QUEUE};

const WAIT: Duration = Duration::from_secs(10);
const MIB: usize = 1024 * 1024;

fn host_listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

fn harness(port: u16) -> Harness {
    Harness::new(nat(
        NetworkPolicy {
            allow_host_ports: vec![port],
            ..NetworkPolicy::default()
        },
        None,
    ))
}

fn accept(l: &TcpListener) -> TcpStream {
    let (s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.set_write_timeout(Some(WAIT)).unwrap();
    s
}

/// Guest sends 2 MiB while the host sends 2 MiB back, at the same time; both arrive intact,
/// and the NAT never holds more than its fixed buffers.
#[test]
fn bulk_data_both_ways() {
    let (l, port) = host_listener();
    let to_host = pattern(2 * MIB, 1);
    let to_guest = pattern(2 * MIB, 9);
    let (expect_up, send_down) = (to_host.clone(), to_guest.clone());
    let host = thread::spawn(move || {
        let s = accept(&l);
        let mut w = s.try_clone().unwrap();
        let writer = thread::spawn(move || {
            w.write_all(&send_down).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        assert!(
            got == expect_up,
            "host got {} bytes, corrupted or short",
            got.len()
        );
    });

    let mut h = harness(port);
    let c = h.connect(GATEWAY_IP, port, 256 * 1024);
    let mut sent = 0;
    let mut received = Vec::new();
    let mut max_queue = 0;
    h.run_until(WAIT, |h| {
        let s = h.tcp(c);
        if s.can_send() && sent < to_host.len() {
            sent += s.send_slice(&to_host[sent..]).unwrap();
            if sent == to_host.len() {
                s.close();
            }
        }
        while s.can_recv() {
            s.recv(|b| {
                received.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        let st = h.nat.stats();
        max_queue = max_queue.max(st.queued_to_guest);
        // What the NAT read from the host and the guest has not yet received stays within
        // the smoltcp send buffer (plus what is in flight in frames).
        let held = st.tcp_bytes_to_guest as usize - received.len();
        assert!(held <= TCP_BUFFER + 256 * 1024, "NAT holds {held} bytes");
        !h.tcp(c).may_recv() && sent == to_host.len() && !h.tcp(c).can_recv()
    });
    assert!(received == to_guest, "guest got {} bytes", received.len());
    host.join().unwrap();
    assert!(max_queue as usize <= TO_GUEST_QUEUE);
    let st = h.nat.stats();
    assert_eq!(st.tcp_bytes_to_host, to_host.len() as u64);
    assert_eq!(st.tcp_bytes_to_guest, to_guest.len() as u64);
    assert_eq!(st.tcp_established, 1);
    // Both sides closed: the connection is reclaimed.
    h.run_until(WAIT, |h| h.nat.stats().tcp_active == 0);
}

/// Guest: request then FIN; host reads to EOF, then answers and closes.
#[test]
fn guest_half_close_then_host_answers() {
    let (l, port) = host_listener();
    let host = thread::spawn(move || {
        let mut s = accept(&l);
        let mut req = Vec::new();
        s.read_to_end(&mut req).unwrap(); // EOF only once the guest's FIN was relayed
        assert_eq!(req, b"GET / HTTP/1.0\r\n\r\n");
        s.write_all(b"HTTP/1.0 200 OK\r\n\r\nhello after your FIN")
            .unwrap();
    });
    let mut h = harness(port);
    let c = h.connect(GATEWAY_IP, port, 64 * 1024);
    h.run_until(WAIT, |h| h.state(c) == State::Established);
    // Idle: nothing to do, so no zero timeout (no busy loop in the caller).
    for _ in 0..20 {
        h.pump();
    }
    assert_ne!(h.nat.poll_timeout(Instant::now()), Some(Duration::ZERO));
    h.tcp(c).send_slice(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    h.tcp(c).close();
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
        !s.may_recv()
    });
    assert_eq!(got, b"HTTP/1.0 200 OK\r\n\r\nhello after your FIN");
    host.join().unwrap();
    h.run_until(WAIT, |h| {
        h.nat.stats().tcp_active == 0 && matches!(h.state(c), State::TimeWait | State::Closed)
    });
}

/// Host: data then FIN (shutdown write); the guest sees EOF and keeps sending; the host
/// reads it, then the guest closes.
#[test]
fn host_half_close_then_guest_sends() {
    let (l, port) = host_listener();
    let host = thread::spawn(move || {
        let mut s = accept(&l);
        s.write_all(b"banner").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    let mut h = harness(port);
    let c = h.connect(GATEWAY_IP, port, 64 * 1024);
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
        s.state() == State::CloseWait
    });
    assert_eq!(got, b"banner");
    let big = pattern(300 * 1024, 3);
    let mut sent = 0;
    h.run_until(WAIT, |h| {
        let s = h.tcp(c);
        if sent < big.len() && s.can_send() {
            sent += s.send_slice(&big[sent..]).unwrap();
            if sent == big.len() {
                s.close();
            }
        }
        sent == big.len() && matches!(s.state(), State::Closed | State::TimeWait)
    });
    assert!(host.join().unwrap() == big);
    h.run_until(WAIT, |h| h.nat.stats().tcp_active == 0);
    assert_eq!(h.resets, 0, "a clean close was reset");
}

/// The guest does not read: the NAT stops reading the host once its buffer is full (no
/// POLLIN interest any more), then everything arrives once the guest reads.
#[test]
fn backpressure_when_guest_does_not_read() {
    let (l, port) = host_listener();
    let total = 8 * MIB;
    let done = Arc::new(AtomicBool::new(false));
    let done2 = done.clone();
    let host = thread::spawn(move || {
        let mut s = accept(&l);
        let data = pattern(total, 5);
        s.write_all(&data).unwrap();
        done2.store(true, Ordering::SeqCst);
    });
    let mut h = harness(port);
    let guest_buf = 64 * 1024;
    let c = h.connect(GATEWAY_IP, port, guest_buf);
    h.run_until(WAIT, |h| h.state(c) == State::Established);
    // Let the NAT fill every buffer it has.
    let settle = Instant::now() + Duration::from_millis(500);
    while Instant::now() < settle {
        h.pump();
        thread::sleep(Duration::from_millis(2));
    }
    let st = h.nat.stats();
    let read_from_host = st.tcp_bytes_to_guest as usize;
    assert!(
        read_from_host <= TCP_BUFFER + guest_buf,
        "NAT read {read_from_host} bytes ahead"
    );
    assert!(
        read_from_host >= guest_buf / 2,
        "nothing flowed: {read_from_host}"
    );
    assert!(
        !done.load(Ordering::SeqCst),
        "host could write 8 MiB: no backpressure"
    );
    let mut fds = Vec::new();
    h.nat.poll_fds(&mut fds);
    assert!(
        fds.iter().all(|(_, ev)| ev & libc::POLLIN == 0),
        "still reading: {fds:?}"
    );
    // Idle while blocked: no busy loop.
    let t = h.nat.poll_timeout(Instant::now());
    assert_ne!(t, Some(Duration::ZERO));

    let mut got = 0usize;
    let want = pattern(total, 5);
    let mut ok = true;
    h.run_until(Duration::from_secs(20), |h| {
        let s = h.tcp(c);
        while s.can_recv() {
            s.recv(|b| {
                ok &= b == &want[got..got + b.len()];
                got += b.len();
                (b.len(), ())
            })
            .unwrap();
        }
        got == total
    });
    assert!(ok, "corrupted");
    host.join().unwrap();
}

/// A guest RST tears down the host side; an aborted host connection resets the guest.
#[test]
fn resets_propagate() {
    let (l, port) = host_listener();
    let host = thread::spawn(move || {
        let mut a = accept(&l);
        let mut buf = [0u8; 16];
        let n = a.read(&mut buf).unwrap_or(0); // guest's RST: EOF or ECONNRESET
        assert_eq!(n, 0);
        let b = accept(&l);
        // Host aborts: unread data at close makes Linux send RST.
        let mut buf = [0u8; 1];
        (&b).read_exact(&mut buf).unwrap();
        drop(b);
    });
    let mut h = harness(port);
    let c = h.connect(GATEWAY_IP, port, 16 * 1024);
    h.run_until(WAIT, |h| h.state(c) == State::Established);
    h.tcp(c).abort();
    h.run_until(WAIT, |h| h.nat.stats().tcp_active == 0);

    let c2 = h.connect(GATEWAY_IP, port, 16 * 1024);
    h.run_until(WAIT, |h| h.state(c2) == State::Established);
    h.tcp(c2).send_slice(b"xyz-more-than-read").unwrap();
    h.run_until(WAIT, |h| h.state(c2) == State::Closed);
    host.join().unwrap();
    h.run_until(WAIT, |h| h.nat.stats().tcp_active == 0);
}

/// Many short connections in a row: connect, request, answer, close — nothing leaks.
#[test]
fn sequential_connections_are_reclaimed() {
    let (l, port) = host_listener();
    let n = 20;
    let host = thread::spawn(move || {
        for _ in 0..n {
            let mut s = accept(&l);
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        }
    });
    let mut h = harness(port);
    for i in 0..n {
        let c = h.connect(GATEWAY_IP, port, 4096);
        h.run_until(WAIT, |h| h.state(c) == State::Established);
        h.tcp(c).send_slice(&[i as u8; 4]).unwrap();
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
            !s.may_recv()
        });
        assert_eq!(got, [i as u8; 4]);
        // The host closed first; the guest closes last (LAST-ACK) and its FIN is
        // acknowledged, not reset (and not retransmitted, so this takes milliseconds).
        let t = Instant::now();
        h.tcp(c).close();
        h.run_until(WAIT, |h| h.state(c) == State::Closed);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "the guest's FIN waited {:?} for an answer",
            t.elapsed()
        );
        h.sockets.remove(c);
    }
    host.join().unwrap();
    h.run_until(WAIT, |h| h.nat.stats().tcp_active == 0);
    assert_eq!(h.nat.stats().tcp_established, n as u64);
    assert_eq!(h.resets, 0, "the guest received resets for clean closes");
}

/// Several guest connections to the same destination at once (one smoltcp listener per
/// endpoint at a time): each gets its own host connection.
#[test]
fn concurrent_connections_same_destination() {
    let (l, port) = host_listener();
    let n = 6;
    let host = thread::spawn(move || {
        let mut hs = Vec::new();
        for _ in 0..n {
            let mut s = accept(&l);
            hs.push(thread::spawn(move || {
                let mut b = [0u8; 1];
                s.read_exact(&mut b).unwrap();
                s.write_all(&[b[0], b[0] ^ 0xff]).unwrap();
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
    });
    let mut h = harness(port);
    let conns: Vec<_> = (0..n).map(|_| h.connect(GATEWAY_IP, port, 4096)).collect();
    h.run_until(WAIT, |h| {
        conns.iter().all(|c| h.state(*c) == State::Established)
    });
    for (i, c) in conns.iter().enumerate() {
        h.tcp(*c).send_slice(&[i as u8]).unwrap();
    }
    let mut got = vec![Vec::new(); n];
    h.run_until(WAIT, |h| {
        for (i, c) in conns.iter().enumerate() {
            let s = h.tcp(*c);
            while s.can_recv() {
                s.recv(|b| {
                    got[i].extend_from_slice(b);
                    (b.len(), ())
                })
                .unwrap();
            }
        }
        got.iter().all(|g| g.len() == 2)
    });
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &[i as u8, i as u8 ^ 0xff]);
    }
    host.join().unwrap();
    assert_eq!(h.nat.stats().tcp_established, n as u64);
}
