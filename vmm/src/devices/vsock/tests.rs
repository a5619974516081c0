//! Host-side tests of the vsock device: hostile descriptor chains, packet validation,
//! connection state machine, credit accounting. No VM needed.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::connection::{ConnState, CONN_BUF_ALLOC};
use super::packet::*;
use super::*;
use crate::devices::virtio::test_driver::{irq, queues, DriverQueue, F_NEXT};
use crate::devices::virtio::{Interrupt, INT_CONFIG, INT_VRING};
use crate::memory::{create_guest_memory, GuestMem};

const MEM_SIZE: usize = 4 << 20;
const GUEST_CID: u64 = 3;
const DATA: u64 = 0x10_0000;

struct H {
    mem: GuestMem,
    b: VsockBackend,
    irq: Arc<Interrupt>,
    rx: DriverQueue,
    tx: DriverQueue,
    data_next: u64,
    rx_bufs: Vec<(u16, u64)>,
}

impl H {
    fn with_tx_size(tx_size: u16) -> Self {
        let mem = create_guest_memory(MEM_SIZE as u64).unwrap();
        let irq = irq();
        let mut b = VsockBackend::new(GUEST_CID, irq.clone(), None);
        let rx = DriverQueue::new(0x1_0000, 16);
        let tx = DriverQueue::new(0x2_0000, tx_size);
        let ev = DriverQueue::new(0x3_0000, 16);
        b.activate(mem.clone(), queues(&[&rx, &tx, &ev], QUEUE_SIZE))
            .unwrap();
        Self {
            mem,
            b,
            irq,
            rx,
            tx,
            data_next: DATA,
            rx_bufs: Vec::new(),
        }
    }

    fn new() -> Self {
        Self::with_tx_size(16)
    }

    fn alloc(&mut self, len: u64) -> u64 {
        let a = self.data_next;
        self.data_next += (len + 15) & !15;
        if self.data_next > MEM_SIZE as u64 - 0x1_0000 {
            self.data_next = DATA;
        }
        a
    }

    /// Guest sends `hdr` + `payload` split into header and payload descriptors.
    fn guest_send(&mut self, hdr: &VsockHeader, payload: &[u8]) {
        let ha = self.alloc(HDR_LEN as u64);
        self.mem
            .write_slice(&hdr.to_bytes(), GuestAddress(ha))
            .unwrap();
        let mut bufs = vec![(ha, HDR_LEN as u32, false)];
        if !payload.is_empty() {
            let pa = self.alloc(payload.len() as u64);
            self.mem.write_slice(payload, GuestAddress(pa)).unwrap();
            bufs.push((pa, payload.len() as u32, false));
        }
        self.tx.add_chain(&self.mem, &bufs);
        self.b.process();
    }

    fn give_rx(&mut self, n: usize, size: u32) {
        for _ in 0..n {
            let a = self.alloc(u64::from(size));
            let head = self.rx.add_chain(&self.mem, &[(a, size, true)]);
            self.rx_bufs.retain(|(h, _)| *h != head);
            self.rx_bufs.push((head, a));
        }
        self.b.process();
    }

    /// Packets the device wrote to the RX queue since the last call.
    fn guest_recv(&mut self) -> Vec<(VsockHeader, Vec<u8>)> {
        let used = self.rx.used(&self.mem);
        used.into_iter()
            .map(|(id, len)| {
                let addr = self.rx_bufs.iter().find(|(h, _)| *h == id).unwrap().1;
                let mut buf = vec![0u8; len as usize];
                self.mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
                let (h, p) = parse_packet(&buf).unwrap();
                (h, p.to_vec())
            })
            .collect()
    }

    fn broken(&self) -> bool {
        self.b.broken_reason().is_some()
    }
}

fn ghdr(op: Op, src_port: u32, dst_port: u32) -> VsockHeader {
    VsockHeader {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len: 0,
        type_: TYPE_STREAM,
        op: op as u16,
        flags: 0,
        buf_alloc: 64 * 1024,
        fwd_cnt: 0,
    }
}

fn rw(src_port: u32, dst_port: u32, data: &[u8]) -> VsockHeader {
    let mut h = ghdr(Op::Rw, src_port, dst_port);
    h.len = data.len() as u32;
    h
}

/// Host connects to guest port 1234 and the guest accepts; returns (host stream, host port).
fn establish(h: &mut H, guest_port: u32) -> (UnixStream, u32) {
    let (host, vmm_side) = UnixStream::pair().unwrap();
    vmm_side.set_nonblocking(true).unwrap();
    let local = h.b.connect_from_host(guest_port, vmm_side).unwrap();
    h.give_rx(1, 4096 + 44);
    let pkts = h.guest_recv();
    assert_eq!(pkts.len(), 1);
    let (req, _) = &pkts[0];
    assert_eq!(req.op(), Some(Op::Request));
    assert_eq!(req.src_cid, HOST_CID);
    assert_eq!(req.dst_cid, GUEST_CID);
    assert_eq!(req.src_port, local);
    assert_eq!(req.dst_port, guest_port);
    assert_eq!(req.buf_alloc, CONN_BUF_ALLOC);
    h.guest_send(&ghdr(Op::Response, guest_port, local), &[]);
    host.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut line = [0u8; 64];
    let expect = format!("OK {local}\n");
    let n = host
        .try_clone()
        .unwrap()
        .read(&mut line[..expect.len()])
        .unwrap();
    assert_eq!(&line[..n], expect.as_bytes());
    (host, local)
}

// ---------------------------------------------------------------- hostile chains

#[test]
fn descriptor_outside_guest_memory_breaks_device() {
    let mut h = H::new();
    h.tx.add_chain(&h.mem, &[(MEM_SIZE as u64 - 10, 44, false)]);
    h.b.process();
    assert!(h.broken());
    assert_ne!(h.irq.status() & INT_CONFIG, 0);
    let mut h = H::new();
    h.tx.add_chain(&h.mem, &[(0xffff_ffff_0000, 44, false)]);
    h.b.process();
    assert!(h.broken());
}

#[test]
fn overflowing_length_breaks_device() {
    let mut h = H::new();
    h.tx.add_chain(&h.mem, &[(u64::MAX - 8, 0xffff_ffff, false)]);
    h.b.process();
    assert!(h.broken());
    // Two descriptors whose lengths sum beyond u32: virtio-queue stops, we see truncation.
    let mut h = H::new();
    h.tx.add_chain(
        &h.mem,
        &[(DATA, 0xffff_ff00, false), (DATA, 0xffff_ff00, false)],
    );
    h.b.process();
    assert!(h.broken());
}

#[test]
fn descriptor_loop_breaks_device() {
    let mut h = H::new();
    h.tx.write_desc(&h.mem, 0, DATA, 8, F_NEXT, 1);
    h.tx.write_desc(&h.mem, 1, DATA, 8, F_NEXT, 0);
    h.tx.publish(&h.mem, 0);
    h.b.process();
    assert!(h.broken());
    assert!(h
        .b
        .broken_reason()
        .unwrap()
        .contains("loops or has an invalid next"));
}

#[test]
fn next_index_out_of_range_breaks_device() {
    let mut h = H::new();
    h.tx.write_desc(&h.mem, 0, DATA, 44, F_NEXT, 200);
    h.tx.publish(&h.mem, 0);
    h.b.process();
    assert!(h.broken());
}

#[test]
fn head_index_out_of_range_breaks_device() {
    let mut h = H::new();
    h.tx.publish(&h.mem, 999);
    h.b.process();
    assert!(h.broken());
}

#[test]
fn avail_index_running_ahead_breaks_device() {
    let mut h = H::new();
    h.mem
        .write_obj(1000u16, GuestAddress(h.tx.avail_addr() + 2))
        .unwrap();
    h.b.process();
    assert!(h.broken());
}

#[test]
fn chain_too_long_breaks_device() {
    let mut h = H::with_tx_size(128);
    let bufs: Vec<(u64, u32, bool)> = (0..100).map(|i| (DATA + i, 1, false)).collect();
    h.tx.add_chain(&h.mem, &bufs);
    h.b.process();
    assert!(h.broken());
    assert!(h.b.broken_reason().unwrap().contains("longer than"));
}

#[test]
fn header_shorter_than_44_bytes_breaks_device() {
    let mut h = H::new();
    let hdr = ghdr(Op::Rw, 1, 2).to_bytes();
    h.mem.write_slice(&hdr, GuestAddress(DATA)).unwrap();
    h.tx.add_chain(&h.mem, &[(DATA, 43, false)]);
    h.b.process();
    assert!(h.broken());
    assert!(h
        .b
        .broken_reason()
        .unwrap()
        .contains("shorter than the 44-byte"));
}

#[test]
fn header_split_across_descriptors_is_fine() {
    let mut h = H::new();
    let hdr = ghdr(Op::Rst, 5, 6).to_bytes();
    h.mem.write_slice(&hdr[..10], GuestAddress(DATA)).unwrap();
    h.mem
        .write_slice(&hdr[10..], GuestAddress(DATA + 0x100))
        .unwrap();
    h.tx.add_chain(&h.mem, &[(DATA, 10, false), (DATA + 0x100, 34, false)]);
    h.b.process();
    assert!(!h.broken());
    assert_eq!(h.b.stats().tx_packets, 1);
    assert_eq!(h.tx.used(&h.mem).len(), 1);
}

#[test]
fn len_larger_than_buffer_breaks_device() {
    let mut h = H::new();
    let mut hdr = rw(1, 2, b"abc");
    hdr.len = 100;
    h.guest_send(&hdr, b"abc");
    assert!(h.broken());
    assert!(h.b.broken_reason().unwrap().contains("buffer holds 3"));
}

#[test]
fn len_above_64k_breaks_device() {
    let mut h = H::new();
    let payload = vec![0u8; 70_000];
    h.guest_send(&rw(1, 2, &payload), &payload);
    assert!(h.broken());
}

#[test]
fn writable_descriptor_on_tx_breaks_device() {
    let mut h = H::new();
    h.tx.add_chain(&h.mem, &[(DATA, 44, false), (DATA + 64, 10, true)]);
    h.b.process();
    assert!(h.broken());
}

#[test]
fn rx_buffer_too_small_or_readable_breaks_device() {
    let mut h = H::new();
    h.b.handle_guest_packet(&ghdr(Op::Rw, 1, 2), &[]); // queues an RST
    h.rx.add_chain(&h.mem, &[(DATA, 20, true)]);
    h.b.process();
    assert!(h.broken());

    let mut h = H::new();
    h.b.handle_guest_packet(&ghdr(Op::Rw, 1, 2), &[]);
    h.rx.add_chain(&h.mem, &[(DATA, 4096, false)]);
    h.b.process();
    assert!(h.broken());
}

#[test]
fn broken_device_stops_and_closes_streams_until_reset() {
    let mut h = H::new();
    let (mut host, _) = establish(&mut h, 1234);
    h.tx.add_chain(&h.mem, &[(u64::MAX - 100, 44, false)]);
    h.b.process();
    assert!(h.broken());
    assert!(!h.b.is_active());
    // Host side sees EOF.
    let mut buf = [0u8; 8];
    assert_eq!(host.read(&mut buf).unwrap(), 0);
    // Further guest activity is ignored.
    let before = h.b.stats();
    h.guest_send(&ghdr(Op::Rst, 1, 2), &[]);
    assert_eq!(h.b.stats(), before);
    assert!(h
        .b
        .connect_from_host(1, UnixStream::pair().unwrap().0)
        .is_none());
    h.b.reset();
    assert!(h.b.broken_reason().is_none());
    assert_eq!(h.b.reap(Instant::now()).len(), 1);
}

// ---------------------------------------------------------------- bad headers (not broken)

#[test]
fn wrong_cids_are_dropped_without_reply() {
    let mut h = H::new();
    h.give_rx(2, 4096);
    let mut p = ghdr(Op::Request, 1, 2);
    p.src_cid = 99;
    h.guest_send(&p, &[]);
    let mut p = ghdr(Op::Request, 1, 2);
    p.dst_cid = 7;
    h.guest_send(&p, &[]);
    assert!(!h.broken());
    assert_eq!(h.b.stats().dropped, 2);
    assert!(h.guest_recv().is_empty());
}

#[test]
fn unknown_op_and_type_get_rst() {
    let mut h = H::new();
    h.give_rx(4, 4096);
    let mut p = ghdr(Op::Rw, 10, 20);
    p.op = 42;
    h.guest_send(&p, &[]);
    let mut p = ghdr(Op::Request, 11, 21);
    p.type_ = 2; // SEQPACKET: not offered
    h.guest_send(&p, &[]);
    assert!(!h.broken());
    let got = h.guest_recv();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|(h, _)| h.op() == Some(Op::Rst)));
    assert_eq!((got[0].0.src_port, got[0].0.dst_port), (20, 10));
    assert_eq!(got[0].0.dst_cid, GUEST_CID);
}

#[test]
fn guest_initiated_connection_is_refused() {
    let mut h = H::new();
    h.give_rx(1, 4096);
    h.guest_send(&ghdr(Op::Request, 5000, 80), &[]);
    let got = h.guest_recv();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.op(), Some(Op::Rst));
    // An RST for an unknown connection is never answered.
    h.guest_send(&ghdr(Op::Rst, 5000, 80), &[]);
    assert!(h.guest_recv().is_empty());
}

#[test]
fn rst_replies_wait_for_rx_buffers() {
    let mut h = H::new();
    h.guest_send(&ghdr(Op::Request, 1, 80), &[]);
    h.guest_send(&ghdr(Op::Request, 2, 80), &[]);
    assert!(h.guest_recv().is_empty());
    h.give_rx(1, 4096);
    assert_eq!(h.guest_recv().len(), 1);
    h.give_rx(1, 4096);
    assert_eq!(h.guest_recv().len(), 1);
    assert!(!h.broken());
}

// ---------------------------------------------------------------- connection state machine

#[test]
fn request_response_and_data_both_ways() {
    let mut h = H::new();
    let (mut host, local) = establish(&mut h, 1234);
    let key = (local, 1234);
    assert_eq!(
        h.b.connections().next().unwrap().state(),
        ConnState::Established
    );

    // Guest → host.
    h.guest_send(&rw(1234, local, b"ping from guest"), b"ping from guest");
    let mut buf = [0u8; 64];
    let n = host.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"ping from guest");
    assert_eq!(h.b.connections().next().unwrap().fwd_cnt(), 15);

    // Host → guest.
    host.write_all(b"pong from host").unwrap();
    h.b.stream_event(key, true, false, false);
    h.give_rx(1, 4096);
    let got = h.guest_recv();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.op(), Some(Op::Rw));
    assert_eq!(got[0].1, b"pong from host");
    assert_eq!(got[0].0.fwd_cnt, 15, "our fwd_cnt rides on every packet");
    assert_ne!(h.irq.status() & INT_VRING, 0);
}

#[test]
fn host_data_respects_guest_credit() {
    let mut h = H::new();
    let (host_stream, local) = establish(&mut h, 7);
    let mut host = host_stream;
    let key = (local, 7);
    // The guest advertises only 5 bytes of buffer.
    let mut cu = ghdr(Op::CreditUpdate, 7, local);
    cu.buf_alloc = 5;
    h.guest_send(&cu, &[]);
    host.write_all(b"0123456789").unwrap();
    h.b.stream_event(key, true, false, false);
    h.give_rx(3, 4096);
    let got = h.guest_recv();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, b"01234");
    let c = h.b.connections().next().unwrap();
    assert_eq!(c.peer_credit(), 0);
    assert!(!c.wants_read(), "no reads while the guest has no credit");

    // Guest consumed 5 bytes.
    let mut cu = ghdr(Op::CreditUpdate, 7, local);
    cu.buf_alloc = 5;
    cu.fwd_cnt = 5;
    h.guest_send(&cu, &[]);
    h.b.stream_event(key, true, false, false);
    h.b.process();
    let got = h.guest_recv();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, b"56789");
}

#[test]
fn rx_payload_limited_by_buffer_size() {
    let mut h = H::new();
    let (mut host, local) = establish(&mut h, 9);
    host.write_all(&[7u8; 1000]).unwrap();
    h.b.stream_event((local, 9), true, false, false);
    h.give_rx(3, 44 + 400);
    let got = h.guest_recv();
    let sizes: Vec<usize> = got.iter().map(|(_, d)| d.len()).collect();
    assert_eq!(sizes, vec![400, 400, 200]);
}

#[test]
fn guest_overrunning_our_credit_is_reset() {
    let mut h = H::new();
    let (mut host, local) = establish(&mut h, 1);
    // The host never reads: fill the socket buffer and then our tx buffer.
    let chunk = vec![1u8; 60 * 1024];
    for _ in 0..40 {
        h.guest_send(&rw(1, local, &chunk), &chunk);
        if h.b
            .connections()
            .next()
            .is_none_or(|c| c.state() == ConnState::Closed)
        {
            break;
        }
    }
    assert!(
        !h.broken(),
        "a credit violation resets the connection, not the device"
    );
    h.give_rx(2, 4096);
    let got = h.guest_recv();
    assert!(got.iter().any(|(p, _)| p.op() == Some(Op::Rst)), "{got:?}");
    let reaped = h.b.reap(Instant::now());
    assert_eq!(reaped.len(), 1);
    drop(reaped);
    host.set_nonblocking(true).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    while let Ok(n) = host.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}

#[test]
fn credit_request_gets_credit_update() {
    let mut h = H::new();
    let (_host, local) = establish(&mut h, 3);
    h.give_rx(1, 4096);
    h.guest_send(&ghdr(Op::CreditRequest, 3, local), &[]);
    let got = h.guest_recv();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.op(), Some(Op::CreditUpdate));
    assert_eq!(got[0].0.buf_alloc, CONN_BUF_ALLOC);
}

#[test]
fn credit_update_sent_when_guest_view_runs_low() {
    let mut h = H::new();
    let (mut host, local) = establish(&mut h, 4);
    h.give_rx(4, 4096);
    let chunk = vec![2u8; 64 * 1024];
    let mut got_update = false;
    for _ in 0..3 {
        h.guest_send(&rw(4, local, &chunk), &chunk);
        let mut sink = vec![0u8; 64 * 1024];
        let mut left = chunk.len();
        while left > 0 {
            left -= host.read(&mut sink[..left]).unwrap();
        }
        h.b.stream_event((local, 4), false, true, false);
        h.b.process();
        got_update |= h
            .guest_recv()
            .iter()
            .any(|(p, _)| p.op() == Some(Op::CreditUpdate) && p.fwd_cnt > 0);
    }
    assert!(got_update, "guest must learn about freed buffer space");
}

#[test]
fn guest_shutdown_closes_host_stream_and_acks_with_rst() {
    let mut h = H::new();
    let (mut host, local) = establish(&mut h, 5);
    h.give_rx(1, 4096);
    let mut sd = ghdr(Op::Shutdown, 5, local);
    sd.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    h.guest_send(&sd, &[]);
    let got = h.guest_recv();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.op(), Some(Op::Rst));
    assert_eq!(h.b.reap(Instant::now()).len(), 1);
    let mut b = [0u8; 4];
    assert_eq!(host.read(&mut b).unwrap(), 0);
}

#[test]
fn guest_half_shutdown_send_gives_host_eof_but_keeps_reading() {
    let mut h = H::new();
    let (mut host, local) = establish(&mut h, 6);
    let mut sd = ghdr(Op::Shutdown, 6, local);
    sd.flags = SHUTDOWN_SEND;
    h.guest_send(&sd, &[]);
    let mut b = [0u8; 4];
    assert_eq!(host.read(&mut b).unwrap(), 0, "host sees EOF");
    host.write_all(b"late").unwrap();
    h.b.stream_event((local, 6), true, false, false);
    h.give_rx(1, 4096);
    let got = h.guest_recv();
    assert_eq!(got[0].1, b"late");
}

#[test]
fn host_close_sends_shutdown_then_guest_rst_removes() {
    let mut h = H::new();
    let (host, local) = establish(&mut h, 8);
    drop(host);
    h.b.stream_event((local, 8), true, false, true);
    h.give_rx(1, 4096);
    let got = h.guest_recv();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.op(), Some(Op::Shutdown));
    assert_eq!(got[0].0.flags, SHUTDOWN_RCV | SHUTDOWN_SEND);
    assert_eq!(
        h.b.connections().next().unwrap().state(),
        ConnState::Closing
    );
    h.guest_send(&ghdr(Op::Rst, 8, local), &[]);
    assert_eq!(h.b.reap(Instant::now()).len(), 1);
}

#[test]
fn closing_connection_times_out_with_rst() {
    let mut h = H::new();
    let (host, local) = establish(&mut h, 8);
    drop(host);
    h.b.stream_event((local, 8), true, false, true);
    h.give_rx(2, 4096);
    let _ = h.guest_recv();
    let later = Instant::now() + Duration::from_secs(10);
    assert!(h.b.reap(later).is_empty(), "RST still to be sent");
    h.b.process();
    let got = h.guest_recv();
    assert_eq!(got[0].0.op(), Some(Op::Rst));
    assert_eq!(h.b.reap(later).len(), 1);
}

#[test]
fn guest_refusal_closes_host_stream() {
    let mut h = H::new();
    let (mut host, vmm) = UnixStream::pair().unwrap();
    vmm.set_nonblocking(true).unwrap();
    let local = h.b.connect_from_host(1234, vmm).unwrap();
    h.give_rx(1, 4096);
    assert_eq!(h.guest_recv()[0].0.op(), Some(Op::Request));
    h.guest_send(&ghdr(Op::Rst, 1234, local), &[]);
    assert_eq!(h.b.reap(Instant::now()).len(), 1);
    let mut b = [0u8; 4];
    assert_eq!(host.read(&mut b).unwrap(), 0);
}

#[test]
fn data_before_response_is_a_protocol_error() {
    let mut h = H::new();
    let (_host, vmm) = UnixStream::pair().unwrap();
    vmm.set_nonblocking(true).unwrap();
    let local = h.b.connect_from_host(1234, vmm).unwrap();
    h.give_rx(2, 4096);
    let _ = h.guest_recv();
    h.guest_send(&rw(1234, local, b"x"), b"x");
    h.b.process();
    let got = h.guest_recv();
    assert_eq!(got[0].0.op(), Some(Op::Rst));
    assert!(!h.broken());
}

#[test]
fn many_concurrent_connections() {
    let mut h = H::new();
    let mut hosts = Vec::new();
    for port in 0..8u32 {
        let (host, local) = establish(&mut h, 2000 + port);
        hosts.push((host, local, 2000 + port));
    }
    for (host, _, _) in hosts.iter_mut() {
        host.write_all(b"hi").unwrap();
    }
    for (_, local, port) in &hosts {
        h.b.stream_event((*local, *port), true, false, false);
    }
    h.give_rx(8, 4096);
    let got = h.guest_recv();
    assert_eq!(got.len(), 8);
    let mut ports: Vec<u32> = got.iter().map(|(p, _)| p.dst_port).collect();
    ports.sort_unstable();
    assert_eq!(ports, (2000..2008).collect::<Vec<_>>());
    for (_, local, port) in &hosts {
        h.guest_send(&rw(*port, *local, b"yo"), b"yo");
    }
    for (host, _, _) in hosts.iter_mut() {
        let mut b = [0u8; 2];
        host.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"yo");
    }
}

#[test]
fn host_connect_refused_before_activation() {
    let irq = irq();
    let mut b = VsockBackend::new(3, irq, None);
    assert!(b
        .connect_from_host(1, UnixStream::pair().unwrap().0)
        .is_none());
}

#[test]
fn config_space_reports_cid() {
    let irq = irq();
    let b = Arc::new(std::sync::Mutex::new(VsockBackend::new(
        0x0001_2345_6789,
        irq,
        None,
    )));
    let dev = VsockDevice::new(b, Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
    let mut d = [0u8; 8];
    dev.read_config(0, &mut d);
    assert_eq!(u64::from_le_bytes(d), 0x0001_2345_6789);
    let mut d = [0xffu8; 4];
    dev.read_config(6, &mut d);
    assert_eq!(d, [0, 0, 0, 0]);
    dev.read_config(u64::MAX, &mut d);
    assert_eq!(d, [0; 4]);
}

#[test]
fn fuzz_entry_point_survives_garbage() {
    fuzz_queues(&[]);
    fuzz_queues(&[0xff; 5000]);
    let mut x: u32 = 1;
    let data: Vec<u8> = (0..70_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    fuzz_queues(&data);
}

// ---------------------------------------------------------------- muxer end to end

#[test]
fn muxer_hybrid_handshake_end_to_end() {
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::AtomicBool;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mem = create_guest_memory(MEM_SIZE as u64).unwrap();
    let irq = irq();
    let backend = Arc::new(std::sync::Mutex::new(VsockBackend::new(
        GUEST_CID, irq, None,
    )));
    let mut rx = DriverQueue::new(0x1_0000, 16);
    let mut tx = DriverQueue::new(0x2_0000, 16);
    let ev = DriverQueue::new(0x3_0000, 16);
    lock(&backend)
        .activate(mem.clone(), queues(&[&rx, &tx, &ev], QUEUE_SIZE))
        .unwrap();
    let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let m = muxer::Muxer::new(listener, kick.clone(), backend.clone(), stop.clone()).unwrap();
    let t = std::thread::spawn(move || m.run());

    let buf_addr = DATA;
    let head = rx.add_chain(&mem, &[(buf_addr, 4096, true)]);
    kick.write(1).unwrap();

    // Bad handshake: closed.
    let mut bad = UnixStream::connect(&path).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    bad.write_all(b"HELLO\n").unwrap();
    let mut b = [0u8; 8];
    assert_eq!(bad.read(&mut b).unwrap(), 0);

    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"CONNECT 1234\nearly").unwrap();
    // Wait for the REQUEST in the RX queue.
    let deadline = Instant::now() + Duration::from_secs(5);
    let req = loop {
        let used = rx.used(&mem);
        if let Some((id, len)) = used.first() {
            assert_eq!(*id, head);
            let mut pkt = vec![0u8; *len as usize];
            mem.read_slice(&mut pkt, GuestAddress(buf_addr)).unwrap();
            break VsockHeader::from_bytes(&pkt).unwrap();
        }
        assert!(Instant::now() < deadline, "no REQUEST");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(req.op(), Some(Op::Request));
    assert_eq!(req.dst_port, 1234);
    // Guest answers.
    let resp = ghdr(Op::Response, 1234, req.src_port);
    mem.write_slice(&resp.to_bytes(), GuestAddress(DATA + 0x2000))
        .unwrap();
    tx.add_chain(&mem, &[(DATA + 0x2000, 44, false)]);
    rx.add_chain(&mem, &[(buf_addr, 4096, true)]);
    kick.write(1).unwrap();
    let mut line = [0u8; 64];
    let expect = format!("OK {}\n", req.src_port);
    s.read_exact(&mut line[..expect.len()]).unwrap();
    assert_eq!(&line[..expect.len()], expect.as_bytes());
    // The bytes sent right after the CONNECT line reach the guest.
    let deadline = Instant::now() + Duration::from_secs(5);
    let data = loop {
        if let Some((_, len)) = rx.used(&mem).first() {
            let mut pkt = vec![0u8; *len as usize];
            mem.read_slice(&mut pkt, GuestAddress(buf_addr)).unwrap();
            let (h, p) = parse_packet(&pkt).unwrap();
            assert_eq!(h.op(), Some(Op::Rw));
            break p.to_vec();
        }
        assert!(Instant::now() < deadline, "no data");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(data, b"early");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    t.join().unwrap();
}

mod persist_tests;
