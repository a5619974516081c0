//! Host-side tests of the network device over real guest memory (GuestMemoryMmap) and real
//! virtqueues: frames in both directions, size limits, backpressure, hostile chains, the
//! MMIO transport, kicks, snapshot round trips, the denial reporter; and frames pushed
//! through the device into a real NAT (`voidbox_net::Nat`): ARP, ICMP echo and a refused TCP
//! connection to the gateway, on the net thread's own poll loop too.

use std::io::Read;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use voidbox_net::{
    Nat, NatConfig, NetworkPolicy, DEFAULT_GUEST_MAC, GATEWAY_IP, GATEWAY_MAC, GUEST_IP,
};

use super::frame::{rx_header, NET_HDR_LEN};
use super::persist::NetState;
use super::report::{DenialReporter, MIN_INTERVAL};
use super::thread::{prepare_thread, NetThread};
use super::*;
use crate::bus::BusDevice;
use crate::devices::virtio::mmio::{reg, MmioTransport};
use crate::devices::virtio::status as dev_status;
use crate::devices::virtio::test_driver::{bring_up, irq, queues, DriverQueue, F_NEXT, F_WRITE};
use crate::devices::virtio::INT_CONFIG;
use crate::memory::create_guest_memory;
use crate::persist::PersistError;
use crate::status::StatusWriter;

const MEM_SIZE: u64 = 16 << 20;
const DATA: u64 = 0x10_0000;

/// A device over real guest memory with both queues active.
struct H {
    mem: GuestMem,
    dev: Arc<Mutex<NetBackend>>,
    irq: Arc<Interrupt>,
    rx: DriverQueue,
    tx: DriverQueue,
    next: u64,
    /// Receive buffers posted: head → (addr, len).
    rx_bufs: std::collections::BTreeMap<u16, (u64, u32)>,
}

impl H {
    fn new() -> Self {
        Self::with_features(offered_features())
    }

    /// A device whose driver acknowledged `acked`.
    fn with_features(acked: u64) -> Self {
        let mem = create_guest_memory(MEM_SIZE).unwrap();
        let irq = irq();
        let mut dev = NetBackend::new(DEFAULT_GUEST_MAC, irq.clone(), None);
        let (rx, tx) = (
            DriverQueue::new(0x1_0000, 16),
            DriverQueue::new(0x2_0000, 16),
        );
        dev.activate(mem.clone(), queues(&[&rx, &tx], QUEUE_SIZE), acked)
            .unwrap();
        Self {
            mem,
            dev: Arc::new(Mutex::new(dev)),
            irq,
            rx,
            tx,
            next: DATA,
            rx_bufs: Default::default(),
        }
    }

    fn dev(&self) -> MutexGuard<'_, NetBackend> {
        lock(&self.dev)
    }

    fn alloc(&mut self, len: u64) -> u64 {
        let a = self.next;
        self.next += (len + 0xfff) & !0xfff;
        a
    }

    /// Queues `frame` for transmission behind the header `hdr`, as descriptors of the
    /// lengths in `pieces` (the last one takes the rest; header and frame may share one),
    /// each at its own address.
    fn transmit_split(&mut self, hdr: &[u8], frame: &[u8], pieces: &[usize]) -> u16 {
        let mut bytes = hdr.to_vec();
        bytes.extend_from_slice(frame);
        let mut bufs = Vec::new();
        let mut rest = &bytes[..];
        for (i, &len) in pieces.iter().enumerate() {
            let n = if i + 1 == pieces.len() {
                rest.len()
            } else {
                len
            };
            let (piece, tail) = rest.split_at(n);
            let a = self.alloc(piece.len() as u64 + 1);
            self.mem.write_slice(piece, GuestAddress(a)).unwrap();
            bufs.push((a, piece.len() as u32, false));
            rest = tail;
        }
        self.tx.add_chain(&self.mem, &bufs)
    }

    fn transmit(&mut self, frame: &[u8]) -> u16 {
        self.transmit_split(&[0u8; NET_HDR_LEN], frame, &[usize::MAX])
    }

    /// Posts a receive buffer of `len` bytes (filled with 0xee) as one descriptor.
    fn post_rx(&mut self, len: u32) -> u16 {
        let a = self.alloc(u64::from(len) + 64);
        self.mem
            .write_slice(&vec![0xee; len as usize + 64], GuestAddress(a))
            .unwrap();
        let head = self.rx.add_chain(&self.mem, &[(a, len, true)]);
        self.rx_bufs.insert(head, (a, len));
        head
    }

    /// Frames the device wrote since the last call (headers checked and stripped).
    fn received(&mut self) -> Vec<Vec<u8>> {
        let used = self.rx.used(&self.mem);
        used.into_iter()
            .filter(|(_, len)| *len > 0)
            .map(|(head, len)| {
                let (addr, cap) = self.rx_bufs[&head];
                assert!(len <= cap, "used length {len} beyond the {cap}-byte buffer");
                let mut b = vec![0u8; len as usize];
                self.mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
                let data_valid = self.dev().acked(features::GUEST_CSUM);
                assert_eq!(b[..NET_HDR_LEN], rx_header(data_valid), "virtio-net header");
                b.split_off(NET_HDR_LEN)
            })
            .collect()
    }

    fn broken(&self) -> bool {
        self.dev().broken_reason().is_some()
    }
}

fn frame(len: usize, fill: u8) -> Vec<u8> {
    let mut f = vec![fill; len];
    f[..6].copy_from_slice(&GATEWAY_MAC);
    f[6..12].copy_from_slice(&DEFAULT_GUEST_MAC);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f
}

#[test]
fn config_space_and_features_through_the_transport() {
    let mem = create_guest_memory(1 << 20).unwrap();
    let irq = irq();
    let mac = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
    let backend = Arc::new(Mutex::new(NetBackend::new(mac, irq.clone(), None)));
    let dev = NetDevice::new(backend, NetKicks::new().unwrap());
    let mut t = MmioTransport::new(Box::new(dev), mem, irq);
    let read32 = |t: &mut MmioTransport, off: u64| {
        let mut b = [0u8; 4];
        t.read(off, &mut b);
        u32::from_le_bytes(b)
    };
    assert_eq!(read32(&mut t, reg::DEVICE_ID), NET_DEVICE_ID);
    t.write(reg::DEVICE_FEATURES_SEL, &0u32.to_le_bytes());
    let lo = read32(&mut t, reg::DEVICE_FEATURES);
    t.write(reg::DEVICE_FEATURES_SEL, &1u32.to_le_bytes());
    let hi = read32(&mut t, reg::DEVICE_FEATURES);
    let f = u64::from(lo) | (u64::from(hi) << 32);
    assert_eq!(
        f,
        (1 << 32) | (1 << 29) | 1 | (1 << 1) | (1 << 3) | (1 << 5) | (1 << 16),
        "VERSION_1, EVENT_IDX, CSUM, GUEST_CSUM, MTU, MAC, STATUS and nothing else (no \
         segmentation offloads, no mergeable buffers)"
    );
    t.write(reg::QUEUE_SEL, &0u32.to_le_bytes());
    assert_eq!(read32(&mut t, reg::QUEUE_NUM_MAX), u32::from(QUEUE_SIZE));
    t.write(reg::QUEUE_SEL, &2u32.to_le_bytes());
    assert_eq!(read32(&mut t, reg::QUEUE_NUM_MAX), 0, "two queues only");
    let mut cfg = [0u8; 12];
    t.read(reg::CONFIG, &mut cfg);
    assert_eq!(cfg[..6], mac);
    assert_eq!(u16::from_le_bytes([cfg[6], cfg[7]]), LINK_UP);
    assert_eq!(u16::from_le_bytes([cfg[10], cfg[11]]), 65520);
    assert_eq!(usize::from(MTU), voidbox_net::MTU);
    assert!(
        SNAPSHOT_KEY.contains(&format!("mtu={MTU} ")),
        "snapshot key follows the MTU"
    );
    // Byte-wise reads (how Linux reads the MAC) and reads past the end.
    let mut b = [0u8; 1];
    t.read(reg::CONFIG + 5, &mut b);
    assert_eq!(b[0], 0xef);
    let mut b = [0xffu8; 2];
    t.read(reg::CONFIG + 11, &mut b);
    assert_eq!(b, [65520u16.to_le_bytes()[1], 0]);
}

#[test]
fn transmitted_frames_lose_their_header_in_any_layout() {
    let mut h = H::new();
    let f1 = frame(60, 0x11);
    let f2 = frame(1514, 0x22);
    let f3 = frame(300, 0x33);
    let hd1 = h.transmit(&f1);
    // Header alone, then the frame in 500-byte pieces.
    let hd2 = h.transmit_split(&[0u8; NET_HDR_LEN], &f2, &[NET_HDR_LEN, 500, 500, 0]);
    // Split mid-header, whatever the header holds (but NEEDS_CSUM).
    let hd3 = h.transmit_split(&[0x7e; NET_HDR_LEN], &f3, &[5, 107, 0]);
    let batch = h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    assert_eq!(batch.frames, vec![f1, f2, f3]);
    assert!(batch.used && !batch.more);
    assert_eq!(h.tx.used(&h.mem), vec![(hd1, 0), (hd2, 0), (hd3, 0)]);
    assert_eq!(h.irq.status() & INT_VRING, INT_VRING);
    assert_eq!(
        h.irq.eventfd().read().unwrap(),
        1,
        "one interrupt per batch"
    );
    assert_eq!(h.dev().stats().tx_frames, 3);
    // Nothing left: nothing used, no interrupt.
    let batch = h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    assert!(batch.frames.is_empty() && !batch.used);
    assert!(h.irq.eventfd().read().is_err());
}

const TX_BATCH_FOR_TESTS: usize = 64;

#[test]
fn transmitted_frames_out_of_bounds_are_dropped_and_counted() {
    let mut h = H::new();
    let short = h.transmit(&frame(14, 1)[..13]);
    let min = h.transmit(&frame(14, 2));
    let max = h.transmit(&frame(MAX_FRAME_LEN, 3));
    let long = h.transmit(&vec![4u8; MAX_FRAME_LEN + 1]);
    let header_only = h.transmit(&[]);
    // An 8 MiB buffer inside guest memory: bounded before anything is read or allocated.
    let a = h.alloc(8 << 20);
    let huge = h.tx.add_chain(&h.mem, &[(a, 8 << 20, false)]);
    let batch = h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    assert_eq!(batch.frames.len(), 2);
    assert_eq!(batch.frames[0].len(), 14);
    assert_eq!(batch.frames[1].len(), MAX_FRAME_LEN);
    assert_eq!(
        h.tx.used(&h.mem),
        [short, min, max, long, header_only, huge].map(|hd| (hd, 0))
    );
    let s = h.dev().stats();
    assert_eq!((s.tx_frames, s.tx_dropped), (2, 4));
    assert!(!h.broken());
}

/// A virtio-net header asking for the checksum at `start + offset` to be completed.
fn csum_header(start: u16, offset: u16) -> [u8; NET_HDR_LEN] {
    let mut h = [0u8; NET_HDR_LEN];
    h[0] = frame::HDR_F_NEEDS_CSUM;
    h[6..8].copy_from_slice(&start.to_le_bytes());
    h[8..10].copy_from_slice(&offset.to_le_bytes());
    h
}

/// `f` (a TCP or UDP frame with a complete checksum at `field`) as Linux hands it over with
/// checksum offload: the field holds the pseudo-header sum, not inverted.
fn partial(f: &[u8], field: usize) -> Vec<u8> {
    let ip = &f[14..34];
    let mut pseudo = ip[12..20].to_vec();
    pseudo.extend_from_slice(&[0, ip[9]]);
    pseudo.extend_from_slice(&((f.len() - 34) as u16).to_be_bytes());
    let mut p = f.to_vec();
    p[field..field + 2].copy_from_slice(&(!checksum(&[&pseudo])).to_be_bytes());
    p
}

#[test]
fn needs_csum_frames_get_their_checksum_completed() {
    let mut h = H::new();
    let tcp = tcp_syn(GATEWAY_IP, 40000, 80, 7);
    let mut udp = udp(std::net::Ipv4Addr::new(1, 1, 1, 1), 5000, 53, &[0x5a; 1001]);
    let zero = partial(&udp, 34 + 6); // pseudo-header sum in the field, then the whole span
    let c = checksum(&[&zero[34..]]);
    udp[40..42].copy_from_slice(&c.to_be_bytes());
    assert_ne!(c, 0);
    assert_ne!(partial(&tcp, 34 + 16), tcp);
    h.transmit_split(
        &csum_header(34, 16),
        &partial(&tcp, 34 + 16),
        &[3, usize::MAX],
    );
    h.transmit_split(&csum_header(34, 6), &partial(&udp, 34 + 6), &[usize::MAX]);
    // The largest frame the MTU allows, with its checksum in its very last bytes.
    let mut big = frame(MAX_FRAME_LEN, 0x33);
    big[MAX_FRAME_LEN - 2..].fill(0);
    let mut big_done = big.clone();
    let c = checksum(&[&big[34..]]);
    big_done[MAX_FRAME_LEN - 2..].copy_from_slice(&c.to_be_bytes());
    h.transmit_split(
        &csum_header(34, (MAX_FRAME_LEN - 36) as u16),
        &big,
        &[NET_HDR_LEN, 4000, usize::MAX],
    );
    let batch = h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    assert_eq!(batch.frames, vec![tcp, udp, big_done.clone()]);
    assert_eq!(checksum(&[&big_done[34..]]), 0, "a valid checksum");
    assert_eq!(h.dev().stats().tx_dropped, 0);
}

#[test]
fn needs_csum_offsets_outside_the_frame_are_dropped_and_counted() {
    let mut h = H::new();
    let f = tcp_syn(GATEWAY_IP, 40000, 80, 7); // 54 bytes
    for (start, offset) in [
        (54, 0),  // start at the end
        (34, 19), // field straddles the end
        (52, 1),  // idem
        (u16::MAX, u16::MAX),
        (0, u16::MAX),
    ] {
        h.transmit_split(&csum_header(start, offset), &f, &[usize::MAX]);
    }
    // The field in the last two bytes is fine.
    h.transmit_split(&csum_header(34, 18), &f, &[usize::MAX]);
    let batch = h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    assert_eq!(batch.frames.len(), 1);
    assert_eq!(batch.frames[0][..52], f[..52]);
    assert_eq!(h.dev().stats().tx_dropped, 5);
    assert_eq!(h.tx.used(&h.mem).len(), 6, "every chain is returned");
    assert!(!h.broken());
}

#[test]
fn without_checksum_features_headers_are_plain() {
    let acked = offered_features() & !(1 << features::CSUM) & !(1 << features::GUEST_CSUM);
    let mut h = H::with_features(acked);
    let f = tcp_syn(GATEWAY_IP, 40000, 80, 7);
    // NEEDS_CSUM was not negotiated: the flag and its offsets mean nothing.
    h.transmit_split(&csum_header(u16::MAX, u16::MAX), &f, &[usize::MAX]);
    let batch = h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    assert_eq!(batch.frames, vec![f.clone()]);
    // Received frames carry no DATA_VALID (`received` checks the header).
    h.post_rx(1526);
    assert!(h.dev().fill_rx(|| Some(f.clone())));
    let head = *h.rx_bufs.keys().next().unwrap();
    let flags: u8 = h.mem.read_obj(GuestAddress(h.rx_bufs[&head].0)).unwrap();
    assert_eq!(flags, 0);
    assert_eq!(h.received(), vec![f]);
}

#[test]
fn event_idx_suppresses_interrupts_and_notifications() {
    let mut h = H::new(); // EVENT_IDX acked
    h.tx.set_used_event(&h.mem, 5); // the driver wants an interrupt after the 6th used
    for i in 0..2 {
        h.transmit(&frame(60, i));
    }
    assert_eq!(h.dev().drain_tx(TX_BATCH_FOR_TESTS).frames.len(), 2);
    assert!(
        h.irq.eventfd().read().is_err(),
        "interrupt suppressed by used_event"
    );
    assert_eq!(h.tx.avail_event(&h.mem), 2, "notify at the next chain");
    for i in 0..4 {
        h.transmit(&frame(60, i));
    }
    assert_eq!(h.dev().drain_tx(TX_BATCH_FOR_TESTS).frames.len(), 4);
    assert_eq!(
        h.irq.eventfd().read().unwrap(),
        1,
        "used index passed used_event"
    );
    assert_eq!(h.tx.avail_event(&h.mem), 6);

    // Receive: no notification is asked for while buffers are left, one once they run out.
    h.rx.set_used_event(&h.mem, 0);
    for _ in 0..2 {
        h.post_rx(1526);
    }
    let mut one = Some(frame(60, 9));
    assert!(h.dev().fill_rx(|| one.take()));
    assert_eq!(
        h.rx.avail_event(&h.mem),
        0,
        "a buffer is left: no notification wanted"
    );
    assert_eq!(h.irq.eventfd().read().unwrap(), 1);
    let mut one = Some(frame(60, 9));
    assert!(h.dev().fill_rx(|| one.take()));
    assert_eq!(
        h.rx.avail_event(&h.mem),
        2,
        "out of buffers: notify at the next one"
    );
    assert!(
        h.irq.eventfd().read().is_err(),
        "used_event 0 was passed already: no second interrupt"
    );
    assert_eq!(h.received().len(), 2);
    assert!(!h.broken());
}

#[test]
fn transmit_batches_are_bounded() {
    let mut h = H::new();
    for i in 0..10 {
        h.transmit(&frame(60, i));
    }
    let b = h.dev().drain_tx(4);
    assert_eq!((b.frames.len(), b.more), (4, true));
    let b = h.dev().drain_tx(4);
    assert_eq!((b.frames.len(), b.more), (4, true));
    let b = h.dev().drain_tx(4);
    assert_eq!((b.frames.len(), b.more), (2, false));
}

#[test]
fn received_frames_get_a_header_and_respect_buffers() {
    let mut h = H::new();
    let b1 = h.post_rx(1526);
    // A buffer split over two descriptors (header in the first).
    let a = h.alloc(4096);
    let b2 =
        h.rx.add_chain(&h.mem, &[(a, 10, true), (a + 2048, 1516, true)]);
    let frames = [frame(1514, 0x41), frame(100, 0x42), frame(60, 0x43)];
    let mut it = frames.clone().into_iter();
    assert!(h.dev().fill_rx(|| it.next()));
    assert_eq!(it.len(), 1, "only as many frames as buffers are taken");
    let used = h.rx.used(&h.mem);
    assert_eq!(used, vec![(b1, 12 + 1514), (b2, 12 + 100)]);
    let mut got = vec![0u8; 12 + 1514];
    h.mem
        .read_slice(&mut got, GuestAddress(h.rx_bufs[&b1].0))
        .unwrap();
    assert_eq!(got[..12], rx_header(true));
    assert_eq!(
        got[0],
        frame::HDR_F_DATA_VALID,
        "GUEST_CSUM acked: DATA_VALID"
    );
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
    assert_eq!(got[12..], frames[0]);
    let mut hdr = [0u8; 10];
    h.mem.read_slice(&mut hdr, GuestAddress(a)).unwrap();
    assert_eq!(hdr, rx_header(true)[..10]);
    let mut rest = vec![0u8; 102];
    h.mem.read_slice(&mut rest, GuestAddress(a + 2048)).unwrap();
    assert_eq!(rest[..2], rx_header(true)[10..]);
    assert_eq!(rest[2..], frames[1]);
    // The byte after the first frame is untouched.
    let after: u8 = h
        .mem
        .read_obj(GuestAddress(h.rx_bufs[&b1].0 + 12 + 1514))
        .unwrap();
    assert_eq!(after, 0xee);
    assert_eq!(h.dev().stats().rx_frames, 2);
    assert_eq!(h.irq.eventfd().read().unwrap(), 1);
}

#[test]
fn without_receive_buffers_frames_stay_in_the_nat() {
    let mut h = H::new();
    let mut asked = 0;
    assert!(!h.dev().fill_rx(|| {
        asked += 1;
        Some(frame(60, 1))
    }));
    assert_eq!(asked, 0, "no frame is taken without a buffer");
    // A buffer but no frame: the buffer goes back to the ring, untouched.
    let b = h.post_rx(1526);
    assert!(!h.dev().fill_rx(|| None));
    assert!(h.rx.used(&h.mem).is_empty());
    // The same buffer takes the next frame.
    let f = frame(70, 9);
    let mut once = Some(f.clone());
    assert!(h.dev().fill_rx(|| once.take()));
    assert_eq!(h.received(), vec![f]);
    assert_eq!(h.rx_bufs.keys().copied().collect::<Vec<_>>(), vec![b]);
}

#[test]
fn a_frame_larger_than_its_buffer_is_dropped_not_written() {
    let mut h = H::new();
    let small = h.post_rx(100);
    let big = h.post_rx(1526);
    let frames = [
        frame(200, 0x55),
        frame(60, 0x66),
        vec![0x77; MAX_FRAME_LEN + 1],
    ];
    let mut it = frames.clone().into_iter();
    assert!(h.dev().fill_rx(|| it.next()));
    assert_eq!(
        h.rx.used(&h.mem),
        vec![(small, 0), (big, 12 + 60)],
        "the too-big frame is dropped and its buffer returned empty"
    );
    let mut b = vec![0u8; 164];
    h.mem
        .read_slice(&mut b, GuestAddress(h.rx_bufs[&small].0))
        .unwrap();
    assert!(b.iter().all(|x| *x == 0xee), "small buffer written");
    // An over-long frame (a NAT bug) is dropped even with room: no buffer left now, so it
    // stays; post one and it is dropped.
    assert_eq!(it.len(), 1);
    let last = h.post_rx(4096);
    assert!(h.dev().fill_rx(|| it.next()));
    assert_eq!(h.rx.used(&h.mem), vec![(last, 0)]);
    let s = h.dev().stats();
    assert_eq!((s.rx_frames, s.rx_dropped), (1, 2));
    assert!(!h.broken());
}

/// Runs `f` on a fresh device and returns whether it broke; every case must also return.
fn breaks(f: impl FnOnce(&mut H)) -> (bool, H) {
    let mut h = H::new();
    f(&mut h);
    let b = h.broken();
    (b, h)
}

#[test]
fn hostile_transmit_chains_break_the_device_without_hanging() {
    // A descriptor pointing at itself.
    let (b, h) = breaks(|h| {
        h.tx.write_desc(&h.mem, 0, DATA, 64, F_NEXT, 0);
        h.tx.publish(&h.mem, 0);
        h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    });
    assert!(b, "self-referencing chain followed");
    assert!(h.dev().broken_reason().unwrap().contains("loops"));
    assert_eq!(h.irq.status() & INT_CONFIG, INT_CONFIG);
    // A 4 GiB length.
    let (b, _) = breaks(|h| {
        h.tx.write_desc(&h.mem, 0, DATA, u32::MAX, 0, 0);
        h.tx.publish(&h.mem, 0);
        h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    });
    assert!(b, "4 GiB descriptor accepted");
    // A device-writable buffer in the transmit queue.
    let (b, h) = breaks(|h| {
        let a = h.alloc(100);
        h.tx.add_chain(&h.mem, &[(a, 12, false), (a + 12, 60, true)]);
        h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    });
    assert!(b, "write-only TX descriptor accepted");
    assert!(h.dev().broken_reason().unwrap().contains("device-writable"));
    // A chain running off the end of the table, an available index far ahead, a buffer
    // outside guest memory.
    let (b, _) = breaks(|h| {
        h.tx.write_desc(&h.mem, 0, DATA, 64, F_NEXT, 200);
        h.tx.publish(&h.mem, 0);
        h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    });
    assert!(b);
    let (b, _) = breaks(|h| {
        h.transmit(&frame(60, 1));
        h.mem
            .write_obj(0x8000u16, GuestAddress(h.tx.avail_addr() + 2))
            .unwrap();
        h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    });
    assert!(b);
    let (b, _) = breaks(|h| {
        h.tx.add_chain(&h.mem, &[(MEM_SIZE - 8, 74, false)]);
        h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    });
    assert!(b);
}

#[test]
fn hostile_receive_chains_break_the_device_without_hanging() {
    let offer = |h: &mut H| {
        let mut n = 0;
        h.dev().fill_rx(|| {
            n += 1;
            (n < 100).then(|| frame(60, 1))
        });
    };
    // A device-readable buffer in the receive queue.
    let (b, h) = breaks(|h| {
        let a = h.alloc(2048);
        h.rx.add_chain(&h.mem, &[(a, 1526, false)]);
        offer(h);
    });
    assert!(b, "read-only RX descriptor accepted");
    assert!(h.dev().broken_reason().unwrap().contains("device-readable"));
    let mut untouched = vec![0u8; 16];
    h.mem
        .read_slice(&mut untouched, GuestAddress(DATA))
        .unwrap();
    assert_eq!(untouched, vec![0u8; 16]);
    // Loops: to itself and around two descriptors.
    let (b, _) = breaks(|h| {
        h.rx.write_desc(&h.mem, 0, DATA, 1526, F_NEXT | F_WRITE, 0);
        h.rx.publish(&h.mem, 0);
        offer(h);
    });
    assert!(b);
    let (b, _) = breaks(|h| {
        h.rx.write_desc(&h.mem, 0, DATA, 800, F_NEXT | F_WRITE, 1);
        h.rx.write_desc(&h.mem, 1, DATA + 800, 800, F_NEXT | F_WRITE, 0);
        h.rx.publish(&h.mem, 0);
        offer(h);
    });
    assert!(b);
    // A 4 GiB writable length.
    let (b, _) = breaks(|h| {
        h.rx.write_desc(&h.mem, 0, DATA, u32::MAX, F_WRITE, 0);
        h.rx.publish(&h.mem, 0);
        offer(h);
    });
    assert!(b);
}

#[test]
fn a_broken_device_stops_and_a_reset_through_the_transport_recovers_it() {
    let mem = create_guest_memory(MEM_SIZE).unwrap();
    let irq = irq();
    let backend = Arc::new(Mutex::new(NetBackend::new(
        DEFAULT_GUEST_MAC,
        irq.clone(),
        None,
    )));
    let kicks = NetKicks::new().unwrap();
    let dev = NetDevice::new(backend.clone(), kicks.clone());
    let mut t = MmioTransport::new(Box::new(dev), mem.clone(), irq.clone());
    let w = |t: &mut MmioTransport, off: u64, v: u32| t.write(off, &v.to_le_bytes());
    let status = |t: &mut MmioTransport| {
        let mut b = [0u8; 4];
        t.read(reg::STATUS, &mut b);
        u32::from_le_bytes(b)
    };
    let acked = (1 << VIRTIO_F_VERSION_1) | (1 << features::MAC);
    let (rx, mut tx) = (
        DriverQueue::new(0x1_0000, 16),
        DriverQueue::new(0x2_0000, 16),
    );
    bring_up(&mut t, acked, &[&rx, &tx]);
    assert!(t.is_activated());
    assert!(lock(&backend).is_active());
    // Activation woke the net thread for both queues.
    assert_eq!(kicks.rx.read().unwrap(), 1);
    assert_eq!(kicks.tx.read().unwrap(), 1);
    // QueueNotify kicks the queue's own eventfd.
    w(&mut t, reg::QUEUE_NOTIFY, 1);
    assert_eq!(kicks.tx.read().unwrap(), 1);
    assert!(kicks.rx.read().is_err());
    w(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(kicks.rx.read().unwrap(), 1);
    assert!(kicks.tx.read().is_err());

    tx.write_desc(&mem, 0, DATA, 64, F_NEXT, 0);
    tx.publish(&mem, 0);
    lock(&backend).drain_tx(TX_BATCH_FOR_TESTS);
    assert_ne!(status(&mut t) & dev_status::DEVICE_NEEDS_RESET, 0);
    // Broken: nothing more is processed.
    assert!(lock(&backend)
        .drain_tx(TX_BATCH_FOR_TESTS)
        .frames
        .is_empty());
    // Reset and bring up again with fresh rings.
    w(&mut t, reg::STATUS, 0);
    assert_eq!(status(&mut t), 0);
    assert!(!lock(&backend).is_active() && lock(&backend).broken_reason().is_none());
    let (rx, mut tx) = (
        DriverQueue::new(0x3_0000, 16),
        DriverQueue::new(0x4_0000, 16),
    );
    bring_up(&mut t, acked, &[&rx, &tx]);
    let a = DATA + 0x1000;
    let f = frame(60, 5);
    let mut bytes = vec![0u8; NET_HDR_LEN];
    bytes.extend_from_slice(&f);
    mem.write_slice(&bytes, GuestAddress(a)).unwrap();
    tx.add_chain(&mem, &[(a, bytes.len() as u32, false)]);
    assert_eq!(lock(&backend).drain_tx(TX_BATCH_FOR_TESTS).frames, vec![f]);
}

#[test]
fn snapshot_round_trip_keeps_rings_and_counters() {
    let mut h = H::new();
    h.transmit(&frame(60, 1));
    h.dev().drain_tx(TX_BATCH_FOR_TESTS);
    let posted = h.post_rx(1526);
    let mut once = Some(frame(80, 2));
    h.dev().fill_rx(|| once.take());
    h.received();
    // A buffer posted before the snapshot and a frame queued for transmission.
    let waiting = h.post_rx(1526);
    let f = frame(90, 3);
    h.transmit(&f);

    let state = h.dev().save();
    let json = serde_json::to_string(&state).unwrap();
    let back: NetState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, state);
    assert_eq!(back.mac, DEFAULT_GUEST_MAC);
    assert_eq!((back.tx_frames, back.rx_frames), (1, 1));
    let mut r = NetBackend::restore(&back, DEFAULT_GUEST_MAC, h.mem.clone(), irq(), None).unwrap();
    assert_eq!(r.save(), state);
    // The restored device goes on where the old one stopped: the queued frame, then the
    // buffer posted before the snapshot.
    assert_eq!(r.drain_tx(TX_BATCH_FOR_TESTS).frames, vec![f]);
    let g = frame(70, 4);
    let mut once = Some(g.clone());
    assert!(r.fill_rx(|| once.take()));
    assert_eq!(h.rx.used(&h.mem), vec![(waiting, 12 + 70)]);
    assert_ne!(waiting, posted);

    // Refused: another MAC, features never offered, features without queues, an inactive
    // queue, a reason too long, a queue outside memory.
    let restore = |s: &NetState, mac: [u8; 6]| {
        NetBackend::restore(s, mac, h.mem.clone(), irq(), None).map(|_| ())
    };
    let e = restore(&state, [2, 0, 0, 0, 0, 1]).unwrap_err();
    assert!(matches!(e, PersistError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains("52:54:00:12:34:56"), "{e}");
    let mut bad = state.clone();
    bad.acked_features |= 1 << 7; // GUEST_TSO4
    assert!(matches!(
        restore(&bad, DEFAULT_GUEST_MAC),
        Err(PersistError::Invalid { .. })
    ));
    let mut bad = state.clone();
    bad.queues = None;
    assert!(restore(&bad, DEFAULT_GUEST_MAC).is_err());
    bad.acked_features = 0;
    restore(&bad, DEFAULT_GUEST_MAC).unwrap();
    let mut bad = state.clone();
    if let Some(q) = bad.queues.as_mut() {
        q.tx.ready = false;
    }
    assert!(restore(&bad, DEFAULT_GUEST_MAC).is_err());
    let mut bad = state.clone();
    bad.broken = Some("x".repeat(MAX_REASON_LEN + 1));
    assert!(restore(&bad, DEFAULT_GUEST_MAC).is_err());
    let mut bad = state.clone();
    if let Some(q) = bad.queues.as_mut() {
        q.rx.desc_table = 1 << 40;
    }
    assert!(restore(&bad, DEFAULT_GUEST_MAC).is_err());
    // Unknown fields are refused.
    let mut v = serde_json::to_value(&state).unwrap();
    v["nat"] = serde_json::json!({});
    assert!(serde_json::from_value::<NetState>(v).is_err());
}

// ---- the denial reporter ------------------------------------------------------------------

fn status_file() -> (tempfile::NamedTempFile, StatusWriter) {
    let f = tempfile::NamedTempFile::new().unwrap();
    let w = StatusWriter::new(f.reopen().unwrap());
    (f, w)
}

fn lines(f: &tempfile::NamedTempFile) -> Vec<serde_json::Value> {
    let mut s = String::new();
    f.reopen().unwrap().read_to_string(&mut s).unwrap();
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn denial(port: u16, count: u64) -> voidbox_net::Denial {
    voidbox_net::Denial {
        destination: "10.0.2.2".into(),
        port,
        protocol: voidbox_net::Protocol::Tcp,
        reason: "host port not allowed".into(),
        count,
    }
}

#[test]
fn denial_lines_are_cumulative_throttled_and_flushed_at_close() {
    let (f, w) = status_file();
    let r = DenialReporter::new(w);
    let t0 = Instant::now();
    assert_eq!(r.offer(vec![], 0, t0), None, "nothing denied: no line");
    assert_eq!(r.offer(vec![denial(22, 1)], 0, t0), None);
    // Changed again at once: held back until MIN_INTERVAL after the first line.
    let due = r.offer(vec![denial(22, 2)], 0, t0 + Duration::from_millis(10));
    assert_eq!(due, Some(t0 + MIN_INTERVAL));
    assert_eq!(
        r.offer(vec![denial(22, 3)], 0, t0 + Duration::from_millis(20)),
        Some(t0 + MIN_INTERVAL)
    );
    // Unchanged counts never make a line.
    let later = t0 + MIN_INTERVAL;
    assert_eq!(r.offer(vec![denial(22, 3)], 0, later), None);
    assert_eq!(r.offer(vec![denial(22, 3)], 0, later + MIN_INTERVAL), None);
    let got = lines(&f);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["event"], "net_denials");
    assert_eq!(
        got[0]["denials"],
        serde_json::json!([{"destination": "10.0.2.2", "port": 22, "protocol": "tcp",
                            "reason": "host port not allowed", "count": 1}])
    );
    assert_eq!(got[0]["inbound"], 0);
    assert_eq!(got[1]["denials"][0]["count"], 3);
    // A change held back by the throttle is flushed by close, once; nothing after.
    let t1 = later + MIN_INTERVAL * 2;
    r.offer(vec![denial(22, 3), denial(80, 1)], 0, t1);
    r.offer(vec![denial(22, 4), denial(80, 1)], 0, t1);
    r.close();
    r.close();
    r.offer(vec![denial(22, 9)], 0, t1 + MIN_INTERVAL * 4);
    let got = lines(&f);
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[3]["denials"][0]["count"], 4);
    assert_eq!(got[3]["denials"][1]["port"], 80);
    // The inbound count alone makes a line too.
    let (f, w) = status_file();
    let r = DenialReporter::new(w);
    assert_eq!(r.offer(vec![], 1, t0), None);
    assert_eq!(r.offer(vec![], 1, t0 + MIN_INTERVAL), None);
    r.offer(vec![], 2, t0 + MIN_INTERVAL * 2);
    let got = lines(&f);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["inbound"], 1);
    assert_eq!(got[0]["denials"], serde_json::json!([]));
    assert_eq!(got[1]["inbound"], 2);
    // Closing without a change emits nothing.
    let (f, w) = status_file();
    let r = DenialReporter::new(w);
    r.close();
    assert!(lines(&f).is_empty());
}

// ---- through a real NAT --------------------------------------------------------------------

/// A NAT with the default policy (no host port allowed) and a DNS upstream that is never
/// asked in these tests (so the host's resolv.conf does not matter).
fn nat() -> Nat {
    Nat::new(NatConfig {
        policy: NetworkPolicy::default(),
        dns_upstreams: vec!["127.0.0.1:53".parse().unwrap()],
        guest_mac: DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix: Vec::new(),
        services: Vec::new(),
    })
    .expect("building the NAT")
}

fn checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    for c in chunks {
        for pair in c.chunks(2) {
            let w = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            sum += u32::from(w);
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn eth(dst: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&DEFAULT_GUEST_MAC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn ipv4(proto: u8, dst: std::net::Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
    h.extend_from_slice(&GUEST_IP.octets());
    h.extend_from_slice(&dst.octets());
    let c = checksum(&[&h]);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(payload);
    eth(GATEWAY_MAC, 0x0800, &h)
}

fn arp(op: u16, dst_mac: [u8; 6], target_mac: [u8; 6], target: [u8; 4]) -> Vec<u8> {
    let mut a = vec![0, 1, 8, 0, 6, 4];
    a.extend_from_slice(&op.to_be_bytes());
    a.extend_from_slice(&DEFAULT_GUEST_MAC);
    a.extend_from_slice(&GUEST_IP.octets());
    a.extend_from_slice(&target_mac);
    a.extend_from_slice(&target);
    eth(dst_mac, 0x0806, &a)
}

fn arp_request(target: std::net::Ipv4Addr) -> Vec<u8> {
    arp(1, [0xff; 6], [0; 6], target.octets())
}

/// The guest's answer to an ARP request for its address in `f`, if `f` is one.
fn arp_answer(f: &[u8]) -> Option<Vec<u8>> {
    let a = f.get(14..42)?;
    let is_request = ethertype(f) == 0x0806 && a[6..8] == [0, 1];
    (is_request && a[24..28] == GUEST_IP.octets()).then(|| {
        let (mac, ip) = (
            <[u8; 6]>::try_from(&a[8..14]).ok()?,
            <[u8; 4]>::try_from(&a[14..18]).ok()?,
        );
        Some(arp(2, mac, mac, ip))
    })?
}

fn icmp_echo(dst: std::net::Ipv4Addr, id: u16, seq: u16, data: &[u8]) -> Vec<u8> {
    let mut m = vec![8, 0, 0, 0];
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(data);
    let c = checksum(&[&m]);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    ipv4(1, dst, &m)
}

const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

fn tcp_syn(dst: std::net::Ipv4Addr, sport: u16, dport: u16, seq: u32) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&0u32.to_be_bytes());
    t.extend_from_slice(&[0x50, TCP_SYN, 0xfa, 0xf0, 0, 0, 0, 0]);
    let mut pseudo = GUEST_IP.octets().to_vec();
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(t.len() as u16).to_be_bytes());
    let c = checksum(&[&pseudo, &t]);
    t[16..18].copy_from_slice(&c.to_be_bytes());
    ipv4(6, dst, &t)
}

/// The device and the net thread's body around a real NAT.
struct NatH {
    h: H,
    t: NetThread,
}

impl NatH {
    fn new() -> Self {
        let h = H::new();
        let kicks = NetKicks::new().unwrap();
        let t = NetThread::new(
            h.dev.clone(),
            nat(),
            kicks,
            Arc::new(AtomicBool::new(false)),
        );
        Self { h, t }
    }

    /// Sends `frame`, runs rounds until a frame matching `want` arrives (with receive
    /// buffers posted) or 5 s passed, answering the NAT's ARP requests for the guest as a
    /// guest would.
    fn exchange(&mut self, frame: &[u8], want: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        self.exchange_with(&[0; NET_HDR_LEN], frame, want)
    }

    /// [`NatH::exchange`] with `frame` sent behind the virtio-net header `hdr`.
    fn exchange_with(&mut self, hdr: &[u8], frame: &[u8], want: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        for _ in 0..4 {
            self.h.post_rx(1526);
        }
        self.h.transmit_split(hdr, frame, &[usize::MAX]);
        let end = Instant::now() + Duration::from_secs(5);
        let mut seen = Vec::new();
        while Instant::now() < end {
            self.t.round(Instant::now());
            for f in self.h.received() {
                if want(&f) {
                    return f;
                }
                if let Some(reply) = arp_answer(&f) {
                    self.h.post_rx(1526);
                    self.h.transmit(&reply);
                }
                seen.push(f);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("no answer; frames seen: {seen:02x?}");
    }
}

fn ethertype(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[12], f[13]])
}

#[test]
fn arp_for_the_gateway_is_answered_through_the_device() {
    let mut n = NatH::new();
    let reply = n.exchange(&arp_request(GATEWAY_IP), |f| {
        f.len() >= 42 && ethertype(f) == 0x0806
    });
    assert_eq!(reply[..6], DEFAULT_GUEST_MAC, "addressed to the guest");
    let arp = &reply[14..];
    assert_eq!(u16::from_be_bytes([arp[6], arp[7]]), 2, "an ARP reply");
    assert_eq!(arp[8..14], GATEWAY_MAC);
    assert_eq!(arp[14..18], GATEWAY_IP.octets());
    assert_eq!(arp[18..24], DEFAULT_GUEST_MAC);
    assert_eq!(arp[24..28], GUEST_IP.octets());
    assert_eq!(n.h.dev().stats().tx_frames, 1);
}

#[test]
fn icmp_echo_to_the_gateway_is_answered_through_the_device() {
    let mut n = NatH::new();
    // As a guest does: resolve the gateway first (the NAT learns the guest's MAC from it).
    n.exchange(&arp_request(GATEWAY_IP), |f| ethertype(f) == 0x0806);
    let data = b"voidbox-ping-payload";
    let reply = n.exchange(&icmp_echo(GATEWAY_IP, 0x4242, 7, data), |f| {
        f.len() >= 42 && ethertype(f) == 0x0800 && f[23] == 1 && f[34] == 0
    });
    let ip = &reply[14..];
    assert_eq!(ip[12..16], GATEWAY_IP.octets());
    assert_eq!(ip[16..20], GUEST_IP.octets());
    let ihl = usize::from(ip[0] & 0xf) * 4;
    let icmp = &ip[ihl..];
    assert_eq!(icmp[0], 0, "echo reply");
    assert_eq!(icmp[4..8], [0x42, 0x42, 0, 7], "id and sequence kept");
    assert_eq!(&icmp[8..8 + data.len()], data);
    assert_eq!(checksum(&[icmp]), 0, "ICMP checksum");
}

#[test]
fn tcp_to_a_gateway_port_not_allowed_is_reset_and_counted() {
    let mut n = NatH::new();
    let port = 9; // discard: not in allow_host_ports (which is empty)
    let seq = 0x1000_0000;
    let reply = n.exchange(&tcp_syn(GATEWAY_IP, 40000, port, seq), |f| {
        f.len() >= 54 && ethertype(f) == 0x0800 && f[23] == 6
    });
    let ip = &reply[14..];
    let ihl = usize::from(ip[0] & 0xf) * 4;
    let tcp = &ip[ihl..];
    assert_eq!(u16::from_be_bytes([tcp[0], tcp[1]]), port);
    assert_eq!(u16::from_be_bytes([tcp[2], tcp[3]]), 40000);
    assert_eq!(tcp[13] & TCP_RST, TCP_RST, "flags {:#x}", tcp[13]);
    if tcp[13] & TCP_ACK != 0 {
        let ack = u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]);
        assert_eq!(ack, seq + 1, "RST acknowledges the SYN");
    }
    let d = n.t.nat().denials();
    assert!(
        d.iter().any(|d| d.port == port && d.count >= 1),
        "denial not counted: {d:?}"
    );
}

#[test]
fn a_partial_checksum_reaches_the_nat_completed() {
    let mut n = NatH::new();
    n.exchange(&arp_request(GATEWAY_IP), |f| ethertype(f) == 0x0806);
    // As Linux sends with checksum offload: the NAT verifies the completed checksum and
    // answers (a partial one would be dropped as a bad checksum, unanswered).
    let syn = partial(&tcp_syn(GATEWAY_IP, 40001, 9, 5), 34 + 16);
    let reply = n.exchange_with(&csum_header(34, 16), &syn, |f| {
        f.len() >= 54 && ethertype(f) == 0x0800 && f[23] == 6
    });
    assert_eq!(reply[14 + 20 + 13] & TCP_RST, TCP_RST);
    assert_eq!(n.t.nat().stats().dropped_bad_checksum, 0);
}

#[test]
fn the_net_thread_wakes_on_kicks_and_answers_the_guest() {
    let mut h = H::new();
    let kicks = NetKicks::new().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = NetThread::new(h.dev.clone(), nat(), kicks.clone(), stop.clone());
    let (f, w) = status_file();
    let reporter = Arc::new(DenialReporter::new(w));
    let r2 = reporter.clone();
    let thread = std::thread::spawn(move || t.run(Some(r2)));
    // The guest posts buffers and a SYN to a port that is not allowed, kicking each queue
    // as its driver would.
    for _ in 0..2 {
        h.post_rx(1526);
    }
    kicks.rx.write(1).unwrap();
    h.transmit(&tcp_syn(GATEWAY_IP, 40001, 7, 1));
    kicks.tx.write(1).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
        got = h.received();
    }
    assert!(!got.is_empty(), "the net thread did not answer");
    assert_eq!(got[0][47] & TCP_RST, TCP_RST);
    // The denial reaches the status line within the throttle interval.
    let end = Instant::now() + Duration::from_secs(2);
    while lines(&f).is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let l = lines(&f);
    assert_eq!(
        l.first().map(|v| v["event"].clone()),
        Some("net_denials".into())
    );
    assert_eq!(l[0]["denials"][0]["port"], 7);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let t0 = Instant::now();
    thread.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "stop not noticed");
}

#[test]
fn the_nat_moves_to_the_net_thread() {
    fn send<T: Send>() {}
    send::<NetThread>();
}

// ---- the net thread under its own seccomp filter -------------------------------------------

/// A guest driving a running net thread: posts buffers and frames and kicks, as a driver does.
struct Driver {
    h: H,
    kicks: NetKicks,
    posted: usize,
}

impl Driver {
    fn send(&mut self, frame: &[u8]) {
        self.h.transmit(frame);
        self.kicks.tx.write(1).unwrap();
    }

    /// Waits up to `timeout` for a frame matching `want`, keeping 4 receive buffers posted
    /// and answering the NAT's ARP requests for the guest.
    fn wait(&mut self, timeout: Duration, want: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            while self.posted < 4 {
                self.h.post_rx(1526);
                self.posted += 1;
            }
            self.kicks.rx.write(1).unwrap();
            for f in self.h.received() {
                self.posted -= 1;
                if want(&f) {
                    return Some(f);
                }
                if let Some(reply) = arp_answer(&f) {
                    self.send(&reply);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

fn udp(dst: std::net::Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = sport.to_be_bytes().to_vec();
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]); // no checksum (allowed over IPv4)
    u.extend_from_slice(payload);
    ipv4(17, dst, &u)
}

fn tcp_flags(f: &[u8]) -> Option<u8> {
    (ethertype(f) == 0x0800 && f.get(23) == Some(&6)).then(|| f.get(14 + 20 + 13).copied())?
}

#[test]
fn the_net_thread_runs_under_its_own_seccomp_filter() {
    use crate::seccomp::{build, FilterKind, FilterParams};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    upstream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // A workflow service's socket (the target of a service route), and a socket the NAT
    // publishes (bound when it is built, before the filter).
    let dir = tempfile::tempdir().unwrap();
    let service = std::os::unix::net::UnixListener::bind(dir.path().join("svc.sock")).unwrap();
    service.set_nonblocking(true).unwrap();
    let published = dir.path().join("pub.sock");
    let nat = Nat::new(NatConfig {
        policy: NetworkPolicy {
            allow_host_ports: vec![port],
            allow: vec!["127.0.0.0/8".parse().unwrap()],
            ..NetworkPolicy::default()
        },
        dns_upstreams: vec![upstream.local_addr().unwrap()],
        guest_mac: DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix: vec![voidbox_net::PublishUnix {
            path: published.clone(),
            guest_port: 8080,
        }],
        services: vec![voidbox_net::ServiceRoute {
            name: "web".into(),
            addr: voidbox_net::service_addr(0).unwrap(),
            ports: vec![voidbox_net::ServicePort {
                port: 80,
                to: voidbox_net::PortTarget::Unix(dir.path().join("svc.sock")),
            }],
        }],
    })
    .unwrap();
    let h = H::new();
    let kicks = NetKicks::new().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = NetThread::new(h.dev.clone(), nat, kicks.clone(), stop.clone());
    let params = FilterParams::for_this_process(false, None).with_network(true);
    let filter = build(&params, FilterKind::Net).unwrap();
    let (f, w) = status_file();
    let reporter = Arc::new(DenialReporter::new(w));
    let r2 = reporter.clone();
    // As in the VMM: start-up, then the thread's own filter, then the loop. A syscall
    // outside the filter kills this whole test process (SIGSYS).
    let thread = std::thread::spawn(move || {
        prepare_thread();
        seccompiler::apply_filter(&filter).unwrap();
        t.run(Some(r2));
    });
    let mut g = Driver {
        h,
        kicks,
        posted: 0,
    };
    let wait = Duration::from_secs(5);

    g.send(&arp_request(GATEWAY_IP));
    assert!(
        g.wait(wait, |f| ethertype(f) == 0x0806).is_some(),
        "no ARP reply"
    );
    // Denied: a reset, a denial, a status line.
    g.send(&tcp_syn(GATEWAY_IP, 40010, 9, 1));
    let rst = g.wait(wait, |f| tcp_flags(f).is_some_and(|fl| fl & TCP_RST != 0));
    assert!(rst.is_some(), "no RST");
    // Allowed: a host connection (socket, connect, getsockopt) and a SYN-ACK.
    g.send(&tcp_syn(GATEWAY_IP, 40011, port, 1000));
    let synack = g.wait(wait, |f| {
        tcp_flags(f).is_some_and(|fl| fl & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK)
    });
    assert!(synack.is_some(), "no SYN-ACK");
    let end = Instant::now() + wait;
    while listener.accept().is_err() {
        assert!(
            Instant::now() < end,
            "the NAT never connected to the host port"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // DNS: forwarded over a UDP socket to the upstream.
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01");
    g.send(&udp(voidbox_net::DNS_IP, 40012, 53, &q));
    let mut buf = [0u8; 512];
    let (n, _) = upstream
        .recv_from(&mut buf)
        .expect("no query at the upstream");
    assert!(
        buf[12..n].starts_with(b"\x07example\x03com"),
        "{:02x?}",
        &buf[..n]
    );
    // ICMP echo to an allowed host address: a ping socket (whether the host permits
    // unprivileged ping or not, the thread must survive trying).
    g.send(&icmp_echo("127.0.0.1".parse().unwrap(), 7, 1, b"x"));
    g.wait(Duration::from_millis(500), |f| {
        ethertype(f) == 0x0800 && f[23] == 1
    });

    // A service: a Unix socket (AF_UNIX socket, connect) and a SYN-ACK.
    g.send(&tcp_syn(
        voidbox_net::service_addr(0).unwrap(),
        40013,
        80,
        1,
    ));
    let synack = g.wait(wait, |f| {
        tcp_flags(f).is_some_and(|fl| fl & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK)
    });
    assert!(synack.is_some(), "no SYN-ACK from the service address");
    let end = Instant::now() + wait;
    while service.accept().is_err() {
        assert!(
            Instant::now() < end,
            "the NAT never connected to the service"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A published Unix socket: accepted on the thread, opened toward the guest (a SYN).
    let _client = std::os::unix::net::UnixStream::connect(&published).unwrap();
    let syn = g.wait(wait, |f| {
        tcp_flags(f).is_some_and(|fl| fl & (TCP_SYN | TCP_ACK) == TCP_SYN)
    });
    assert!(syn.is_some(), "no SYN toward the guest");

    let seen = |l: &[serde_json::Value]| {
        l.iter().any(|v| {
            v["event"] == "net_denials"
                && v["inbound"] == 1
                && v["denials"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|d| d["port"] == 9))
        })
    };
    let end = Instant::now() + Duration::from_secs(2);
    while !seen(&lines(&f)) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    thread.join().unwrap();
    let l = lines(&f);
    assert!(seen(&l), "{l:?}");
}
