//! The `net_frame` fuzz target's entry point ([`fuzz_frames`]), also replayed over the seed
//! corpus by `tests/fuzz_corpus.rs`. Not part of the VMM's interface.
//!
//! The NAT is left out on purpose (it would open host sockets to whatever the input names);
//! transmitted frames are looped back to the receive queue instead, so both directions of
//! the device's descriptor and frame handling run on the same hostile rings.

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::{offered_features, NetBackend, NetStats, MAX_FRAME_LEN, QUEUE_SIZE};
use crate::devices::virtio::Interrupt;

/// Guest memory of [`fuzz_frames`].
#[doc(hidden)]
pub const FUZZ_MEM_BYTES: usize = 0x4_0000;
/// Receive queue layout of [`fuzz_frames`]: size, descriptor table, available ring, used ring.
#[doc(hidden)]
pub const FUZZ_RX_QUEUE: (u16, u64, u64, u64) = (16, 0x0, 0x100, 0x200);
/// Transmit queue layout of [`fuzz_frames`].
#[doc(hidden)]
pub const FUZZ_TX_QUEUE: (u16, u64, u64, u64) = (16, 0x400, 0x500, 0x600);
/// Flag bit: also deliver a frame of [`MAX_FRAME_LEN`] bytes.
#[doc(hidden)]
pub const FUZZ_FLAG_MAX_FRAME: u8 = 1;
/// Flag bit: also deliver an over-long frame (a misbehaving NAT), which must be dropped.
#[doc(hidden)]
pub const FUZZ_FLAG_OVERSIZED: u8 = 2;

/// What [`fuzz_frames`] observed, for corpus tests.
#[doc(hidden)]
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FuzzReport {
    /// Frames taken from the transmit queue, in order.
    pub tx_frames: Vec<Vec<u8>>,
    /// Used receive buffers: (head, used length), in used-ring order (the last queue-size
    /// of them when the ring wrapped).
    pub rx_used: Vec<(u16, u32)>,
    /// The device was marked broken.
    pub broken: bool,
    /// Counters.
    pub stats: NetStats,
}

fn queue(layout: (u16, u64, u64, u64)) -> Option<Queue> {
    let (size, desc, avail, used) = layout;
    let mut q = Queue::new(QUEUE_SIZE).ok()?;
    q.set_size(size);
    q.set_desc_table_address(Some(desc as u32), Some(0));
    q.set_avail_ring_address(Some(avail as u32), Some(0));
    q.set_used_ring_address(Some(used as u32), Some(0));
    q.set_ready(true);
    Some(q)
}

/// Fuzzing entry point: `data[0]` holds flags ([`FUZZ_FLAG_MAX_FRAME`],
/// [`FUZZ_FLAG_OVERSIZED`]); `data[1..]` is guest memory from address 0 ([`FUZZ_MEM_BYTES`])
/// holding the two queues laid out as [`FUZZ_RX_QUEUE`] and [`FUZZ_TX_QUEUE`]. Two rounds:
/// drain the transmit queue, then fill the receive queue with the transmitted frames (and the
/// flagged extra frames). Must never panic.
#[doc(hidden)]
pub fn fuzz_frames(data: &[u8]) -> Option<FuzzReport> {
    let (&flags, image) = data.split_first()?;
    let mem = crate::memory::create_guest_memory(FUZZ_MEM_BYTES as u64).ok()?;
    let n = image.len().min(FUZZ_MEM_BYTES);
    mem.write_slice(&image[..n], GuestAddress(0)).ok()?;
    // The used ring is the device's to write; start its index at 0 so the report reads back
    // only what the device wrote.
    let (size, _, _, used) = FUZZ_RX_QUEUE;
    mem.write_obj(0u16, GuestAddress(used + 2)).ok()?;
    let irq = Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).ok()?));
    let mut dev = NetBackend::new(voidbox_net::DEFAULT_GUEST_MAC, irq, None);
    let queues = vec![queue(FUZZ_RX_QUEUE)?, queue(FUZZ_TX_QUEUE)?];
    dev.activate(mem.clone(), queues, offered_features()).ok()?;

    let mut report = FuzzReport::default();
    let mut extra: Vec<Vec<u8>> = Vec::new();
    if flags & FUZZ_FLAG_MAX_FRAME != 0 {
        extra.push(vec![0x5a; MAX_FRAME_LEN]);
    }
    if flags & FUZZ_FLAG_OVERSIZED != 0 {
        extra.push(vec![0xa5; MAX_FRAME_LEN + 1]);
    }
    for _ in 0..2 {
        let batch = dev.drain_tx(usize::from(FUZZ_TX_QUEUE.0));
        let mut pending: std::collections::VecDeque<Vec<u8>> =
            batch.frames.iter().cloned().collect();
        pending.extend(extra.drain(..));
        report.tx_frames.extend(batch.frames);
        dev.fill_rx(|| pending.pop_front());
    }
    report.broken = dev.broken_reason().is_some();
    report.stats = dev.stats();

    let used_idx: u16 = mem.read_obj(GuestAddress(used + 2)).ok()?;
    for i in used_idx.saturating_sub(size)..used_idx {
        let elem = GuestAddress(used + 4 + 8 * u64::from(i % size));
        let id: u32 = mem.read_obj(elem).ok()?;
        let len: u32 = mem.read_obj(GuestAddress(elem.0 + 4)).ok()?;
        report.rx_used.push((id as u16, len));
    }
    Some(report)
}
