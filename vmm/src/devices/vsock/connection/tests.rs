//! Unit tests of the connection state machine and credit arithmetic.

use std::io::Read;
use std::os::unix::net::UnixStream;

use super::*;

fn conn() -> (Connection, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    (Connection::new_host_initiated(1 << 30, 1234, 3, b), a)
}

fn from_guest(op: Op, buf_alloc: u32, fwd_cnt: u32) -> VsockHeader {
    VsockHeader {
        src_cid: 3,
        dst_cid: HOST_CID,
        src_port: 1234,
        dst_port: 1 << 30,
        type_: TYPE_STREAM,
        op: op as u16,
        buf_alloc,
        fwd_cnt,
        ..Default::default()
    }
}

#[test]
fn starts_with_request_then_waits() {
    let (mut c, _h) = conn();
    assert_eq!(c.state(), ConnState::Connecting);
    assert!(c.has_rx_work());
    let (h, d) = c.next_packet(4096).unwrap();
    assert_eq!(h.op(), Some(Op::Request));
    assert!(d.is_empty());
    assert!(c.next_packet(4096).is_none());
    assert!(!c.wants_read());
    assert!(c.wants_hangup());
}

#[test]
fn response_before_request_sent_is_rejected() {
    let (mut c, _h) = conn();
    let r = c.on_guest_packet(&from_guest(Op::Response, 1000, 0), &[]);
    assert_eq!(r, PacketOutcome::Reset);
    assert_eq!(c.state(), ConnState::Closed);
    // It never knew about us: no RST needed.
    assert!(c.is_done());
}

#[test]
fn peer_credit_arithmetic_wraps() {
    let (mut c, mut h) = conn();
    c.next_packet(4096);
    c.on_guest_packet(&from_guest(Op::Response, 100, 0), &[]);
    let mut ok = [0u8; 32];
    let _ = h.read(&mut ok).unwrap();
    assert_eq!(c.peer_credit(), 100);
    c.rx_cnt = Wrapping(u32::MAX - 10);
    c.peer_fwd_cnt = Wrapping(u32::MAX - 50);
    assert_eq!(c.peer_credit(), 60);
    c.rx_cnt = Wrapping(5); // wrapped past 2^32
    assert_eq!(c.peer_credit(), 100 - 56);
    c.peer_fwd_cnt = Wrapping(6); // guest claims more consumed than sent: no negative credit
    assert_eq!(c.peer_credit(), 100u32.saturating_sub(u32::MAX));
}

#[test]
fn ok_line_is_not_credited() {
    let (mut c, mut h) = conn();
    c.next_packet(4096);
    c.on_guest_packet(&from_guest(Op::Response, 100, 0), &[]);
    assert_eq!(c.fwd_cnt(), 0);
    assert_eq!(c.local_free(), CONN_BUF_ALLOC);
    let mut b = [0u8; 32];
    let n = h.read(&mut b).unwrap();
    assert_eq!(&b[..n], format!("OK {}\n", 1u32 << 30).as_bytes());
    c.on_guest_packet(
        &VsockHeader {
            len: 3,
            ..from_guest(Op::Rw, 100, 0)
        },
        b"abc",
    );
    assert_eq!(c.fwd_cnt(), 3);
}

#[test]
fn reset_sends_rst_once_known() {
    let (mut c, _h) = conn();
    c.next_packet(4096);
    c.reset();
    assert!(!c.is_done());
    let (h, _) = c.next_packet(4096).unwrap();
    assert_eq!(h.op(), Some(Op::Rst));
    assert!(c.is_done());
    assert!(c.next_packet(4096).is_none());
}
